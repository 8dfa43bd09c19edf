/* auth.c - the proofs, randomness and token files of auth.h, on libsodium. */
#include "proto/auth.h"

#include <errno.h>
#include <fcntl.h>
#include <sodium.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "proto/wire.h"

int hoop__auth_init(void) {
  return sodium_init() < 0 ? -1 : 0;
}

int hoop__auth_random(void *buf, size_t len) {
  if (hoop__auth_init() != 0)
    return -1;
  randombytes_buf(buf, len);
  return 0;
}

void hoop__auth_proof(const char *token, size_t token_len, const char *purpose, const uint8_t *a,
                      size_t a_len, const uint8_t *b, size_t b_len, uint8_t out[HOOP__AUTH_PROOF]) {
  crypto_auth_hmacsha256_state state;
  crypto_auth_hmacsha256_init(&state, (const unsigned char *)token, token_len);
  crypto_auth_hmacsha256_update(&state, (const unsigned char *)purpose, strlen(purpose) + 1);
  if (a_len)
    crypto_auth_hmacsha256_update(&state, a, a_len);
  if (b_len)
    crypto_auth_hmacsha256_update(&state, b, b_len);
  crypto_auth_hmacsha256_final(&state, out);
  sodium_memzero(&state, sizeof state);
}

int hoop__auth_equal(const uint8_t *a, const uint8_t *b, size_t len) {
  return sodium_memcmp(a, b, len) == 0;
}

int hoop__auth_hello_proof(const char *token, const uint8_t *challenge, const hoop__hello *hello,
                           uint8_t out[HOOP__AUTH_PROOF]) {
  hoop__hello bare = *hello;
  bare.proof_len = 0;
  hoop__wbuf wb = {0};
  if (hoop__wire_encode_hello(&wb, &bare) != 0) {
    hoop__wbuf_free(&wb);
    return -1;
  }
  hoop__auth_proof(token, strlen(token), HOOP__AUTH_JOIN, challenge, HOOP__WIRE_CHALLENGE,
                   (const uint8_t *)wb.data + HOOP__WIRE_HEADER_SIZE,
                   wb.len - HOOP__WIRE_HEADER_SIZE, out);
  hoop__wbuf_free(&wb);
  return 0;
}

void hoop__auth_table_proof(const char *token, const uint8_t *hello_nonce, const uint8_t *own,
                            const uint8_t *body_digest, uint8_t out[HOOP__AUTH_PROOF]) {
  uint8_t covered[HOOP__WIRE_CHALLENGE + HOOP__WIRE_TABLE_OWN];
  memcpy(covered, hello_nonce, HOOP__WIRE_CHALLENGE);
  memcpy(covered + HOOP__WIRE_CHALLENGE, own, HOOP__WIRE_TABLE_OWN);
  hoop__auth_proof(token, strlen(token), HOOP__AUTH_TABLE, covered, sizeof covered, body_digest,
                   HOOP__AUTH_PROOF, out);
}

void hoop__auth_digest(const uint8_t *data, size_t len, uint8_t out[HOOP__AUTH_PROOF]) {
  crypto_hash_sha256(out, data, len);
}

int hoop__auth_keypair(uint8_t public_key[HOOP__AUTH_KEY], uint8_t secret_key[HOOP__AUTH_KEY]) {
  _Static_assert(crypto_kx_PUBLICKEYBYTES == HOOP__AUTH_KEY &&
                     crypto_kx_SECRETKEYBYTES == HOOP__AUTH_KEY &&
                     crypto_kx_SESSIONKEYBYTES == HOOP__AUTH_KEY,
                 "crypto_kx's keys are HOOP__AUTH_KEY bytes");
  if (hoop__auth_init() != 0)
    return -1;
  return crypto_kx_keypair(public_key, secret_key) == 0 ? 0 : -1;
}

int hoop__auth_pair_keys(int lower, const uint8_t *public_key, const uint8_t *secret_key,
                         const uint8_t *peer_key, uint8_t tx[HOOP__AUTH_KEY],
                         uint8_t rx[HOOP__AUTH_KEY]) {
  if (hoop__auth_init() != 0)
    return -1;
  int made = lower ? crypto_kx_client_session_keys(rx, tx, public_key, secret_key, peer_key)
                   : crypto_kx_server_session_keys(rx, tx, public_key, secret_key, peer_key);
  return made == 0 ? 0 : -1;
}

void hoop__auth_wipe(void *buf, size_t len) {
  sodium_memzero(buf, len);
}

int hoop__auth_load_token(const char *token, const char *file, char *out, size_t cap, char *err,
                          size_t errlen) {
  out[0] = '\0';
  int has_token = token && token[0], has_file = file && file[0];
  if (has_token && has_file) {
    snprintf(err, errlen, "both HOOP_TOKEN and HOOP_TOKEN_FILE are set: set one");
    return -1;
  }
  if (has_file)
    return hoop__auth_read_token(file, out, cap, err, errlen);
  if (has_token) {
    size_t len = strlen(token);
    if (len > HOOP__MAX_TOKEN || len >= cap) {
      snprintf(err, errlen, "HOOP_TOKEN is longer than %d bytes", HOOP__MAX_TOKEN);
      return -1;
    }
    memcpy(out, token, len + 1);
  }
  return 0;
}

int hoop__auth_read_token(const char *path, char *out, size_t cap, char *err, size_t errlen) {
  out[0] = '\0';
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    snprintf(err, errlen, "token file %s: %s", path, strerror(errno));
    return -1;
  }
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    snprintf(err, errlen, "token file %s: not a regular file", path);
    close(fd);
    return -1;
  }
  if (st.st_mode & (S_IRWXG | S_IRWXO)) {
    snprintf(err, errlen,
             "token file %s: other users may read or change it (mode %03o); "
             "chmod 600 it",
             path, (unsigned)(st.st_mode & 0777));
    close(fd);
    return -1;
  }
  size_t len = 0;
  ssize_t n;
  while (len < cap && (n = read(fd, out + len, cap - len)) != 0) {
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0) {
      snprintf(err, errlen, "token file %s: %s", path, strerror(errno));
      close(fd);
      hoop__auth_wipe(out, cap);
      return -1;
    }
    len += (size_t)n;
  }
  close(fd);
  while (len > 0 && (out[len - 1] == '\n' || out[len - 1] == '\r'))
    len--;
  if (len >= cap || len == 0 || memchr(out, '\0', len)) {
    snprintf(err, errlen, "token file %s: %s", path,
             len == 0     ? "empty"
             : len >= cap ? "longer than a token may be"
                          : "holds a NUL byte");
    hoop__auth_wipe(out, cap);
    return -1;
  }
  out[len] = '\0';
  return 0;
}
