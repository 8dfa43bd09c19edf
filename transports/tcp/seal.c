/* seal.c - encrypted TCP streams (seal.h), on libsodium's AEADs. */
#include "seal.h"

#include <errno.h>
#include <sodium.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "util/be.h"

#define HEADER 4
#define WHOLE(len) (HEADER + (len) + HOOP__SEAL_TAG)
#define OUT_CAP WHOLE(HOOP__SEAL_RECORD)
#define AHEAD 4096                                /* read past a record, for the next small ones */
#define IN_CAP (WHOLE(HOOP__SEAL_RECORD) + AHEAD) /* a record, and what came after it */

_Static_assert(crypto_aead_aes256gcm_KEYBYTES == HOOP__SEAL_KEY &&
                   crypto_aead_chacha20poly1305_ietf_KEYBYTES == HOOP__SEAL_KEY &&
                   crypto_aead_aes256gcm_ABYTES == HOOP__SEAL_TAG &&
                   crypto_aead_chacha20poly1305_ietf_ABYTES == HOOP__SEAL_TAG &&
                   crypto_aead_aes256gcm_NPUBBYTES == 12 &&
                   crypto_aead_chacha20poly1305_ietf_NPUBBYTES == 12,
               "both AEADs take 32-byte keys and 12-byte nonces, and make 16-byte tags");

int hoop__seal_choose(const char *value, hoop__cipher *cipher, const char **why) {
  *why = NULL;
  if (sodium_init() < 0) {
    *why = "libsodium cannot start";
    return -1;
  }
  int aes = crypto_aead_aes256gcm_is_available();
  if (strcmp(value, "0") == 0 || strcmp(value, "no") == 0) {
    *cipher = HOOP__CIPHER_NONE;
  } else if (strcmp(value, "1") == 0 || strcmp(value, "yes") == 0) {
    *cipher = aes ? HOOP__CIPHER_AES256GCM : HOOP__CIPHER_CHACHA20POLY1305;
  } else if (strcmp(value, "aes256gcm") == 0) {
    *cipher = HOOP__CIPHER_AES256GCM;
    if (!aes) {
      *why = "this CPU lacks the AES and CLMUL instructions libsodium's AES-256-GCM needs";
      return -1;
    }
  } else if (strcmp(value, "chacha20poly1305") == 0) {
    *cipher = HOOP__CIPHER_CHACHA20POLY1305;
  } else {
    *why = "not 0, 1, aes256gcm or chacha20poly1305";
    return -1;
  }
  return 0;
}

const char *hoop__seal_cipher_name(hoop__cipher cipher) {
  switch (cipher) {
  case HOOP__CIPHER_NONE: return "nothing (in clear)";
  case HOOP__CIPHER_AES256GCM: return "AES-256-GCM";
  case HOOP__CIPHER_CHACHA20POLY1305: return "ChaCha20-Poly1305";
  }
  return "an unknown cipher";
}

int hoop__seal_init(hoop__seal *seal, hoop__cipher cipher, const uint8_t *tx_key,
                    const uint8_t *rx_key) {
  memset(seal, 0, sizeof *seal);
  seal->cipher = cipher;
  memcpy(seal->tx_key, tx_key, HOOP__SEAL_KEY);
  memcpy(seal->rx_key, rx_key, HOOP__SEAL_KEY);
  /* The record buffers come with the first send and the first receive: a job of many peers
   * pays for the connections it uses each way. */
  if (cipher == HOOP__CIPHER_AES256GCM) {
    /* libsodium's AES state must be 16-byte aligned. */
    crypto_aead_aes256gcm_state *aes = NULL;
    if (posix_memalign((void **)&aes, 16, 2 * sizeof *aes) == 0) {
      crypto_aead_aes256gcm_beforenm(&aes[0], tx_key);
      crypto_aead_aes256gcm_beforenm(&aes[1], rx_key);
    }
    seal->aes = aes;
  }
  if (cipher == HOOP__CIPHER_AES256GCM && !seal->aes) {
    hoop__seal_free(seal);
    return -1;
  }
  return 0;
}

void hoop__seal_free(hoop__seal *seal) {
  if (seal->aes)
    sodium_memzero(seal->aes, 2 * sizeof(crypto_aead_aes256gcm_state));
  free(seal->aes);
  free(seal->out);
  free(seal->in);
  sodium_memzero(seal, sizeof *seal);
}

static void make_nonce(uint8_t nonce[12], uint64_t seq) {
  memset(nonce, 0, 4);
  hoop__put_be64(nonce + 4, seq);
}

/* Seal len bytes of plaintext at text (out + HEADER, or the caller's buffer) into out, their
 * length before them, the tag after. */
static void seal_record(hoop__seal *seal, const uint8_t *text, size_t len) {
  uint8_t nonce[12];
  make_nonce(nonce, seal->tx_seq++);
  hoop__put_be32(seal->out, (uint32_t)len);
  uint8_t *sealed = seal->out + HEADER;
  if (seal->cipher == HOOP__CIPHER_AES256GCM)
    crypto_aead_aes256gcm_encrypt_detached_afternm(sealed, sealed + len, NULL, text, len, seal->out,
                                                   HEADER, NULL, nonce,
                                                   &((crypto_aead_aes256gcm_state *)seal->aes)[0]);
  else
    crypto_aead_chacha20poly1305_ietf_encrypt_detached(
        sealed, sealed + len, NULL, text, len, seal->out, HEADER, NULL, nonce, seal->tx_key);
}

/* Open the record of len bytes at the start of in into text (in + HEADER itself, or the caller's
 * buffer): 0, or -1 when it fails its check. */
static int open_record(hoop__seal *seal, size_t len, uint8_t *text) {
  uint8_t nonce[12];
  make_nonce(nonce, seal->rx_seq);
  const uint8_t *sealed = seal->in + HEADER;
  int opened =
      seal->cipher == HOOP__CIPHER_AES256GCM
          ? crypto_aead_aes256gcm_decrypt_detached_afternm(
                text, NULL, sealed, len, sealed + len, seal->in, HEADER, nonce,
                &((crypto_aead_aes256gcm_state *)seal->aes)[1])
          : crypto_aead_chacha20poly1305_ietf_decrypt_detached(
                text, NULL, sealed, len, sealed + len, seal->in, HEADER, nonce, seal->rx_key);
  if (opened != 0)
    return -1;
  seal->rx_seq++;
  return 0;
}

/* The first used bytes of in are taken: what came after them moves up. */
static void drop(hoop__seal *seal, size_t used) {
  memmove(seal->in, seal->in + used, seal->in_got - used);
  seal->in_got -= used;
}

ssize_t hoop__seal_send(hoop__seal *seal, int fd, const struct iovec *iov, int n) {
  if (!seal->out && !(seal->out = malloc(OUT_CAP))) {
    errno = ENOMEM;
    return -1;
  }
  if (seal->out_len == 0) {
    while (n > 0 && iov->iov_len == 0) {
      iov++;
      n--;
    }
    size_t len = 0;
    if (n > 0 && iov->iov_len >= HOOP__SEAL_RECORD) { /* from the caller's buffer, no copy */
      len = HOOP__SEAL_RECORD;
      seal_record(seal, iov->iov_base, len);
    } else if (n == 1) {
      len = iov->iov_len;
      seal_record(seal, iov->iov_base, len);
    } else {
      for (int i = 0; i < n && len < HOOP__SEAL_RECORD; i++) {
        size_t take =
            iov[i].iov_len < HOOP__SEAL_RECORD - len ? iov[i].iov_len : HOOP__SEAL_RECORD - len;
        if (take)
          memcpy(seal->out + HEADER + len, iov[i].iov_base, take);
        len += take;
      }
      if (len)
        seal_record(seal, seal->out + HEADER, len);
    }
    if (len == 0)
      return 0;
    seal->out_len = WHOLE(len);
    seal->out_done = 0;
    seal->out_plain = len;
  }
  while (seal->out_done < seal->out_len) {
    ssize_t sent =
        send(fd, seal->out + seal->out_done, seal->out_len - seal->out_done, MSG_NOSIGNAL);
    if (sent > 0) {
      seal->out_done += (size_t)sent;
    } else if (sent < 0 && errno == EINTR) {
      continue;
    } else {
      if (sent == 0)
        errno = EPIPE;
      return -1;
    }
  }
  size_t plain = seal->out_plain;
  seal->out_len = seal->out_done = seal->out_plain = 0;
  return (ssize_t)plain;
}

ssize_t hoop__seal_recv(hoop__seal *seal, int fd, const struct iovec *iov, int n) {
  if (!seal->in && !(seal->in = malloc(IN_CAP))) {
    errno = ENOMEM;
    return -1;
  }
  for (;;) {
    if (seal->broken) {
      errno = EBADMSG;
      return -1;
    }
    if (seal->plain_at < seal->plain_len) {
      size_t given = 0;
      for (int i = 0; i < n && seal->plain_at < seal->plain_len; i++) {
        size_t left = seal->plain_len - seal->plain_at;
        size_t take = iov[i].iov_len < left ? iov[i].iov_len : left;
        if (take)
          memcpy(iov[i].iov_base, seal->in + HEADER + seal->plain_at, take);
        seal->plain_at += take;
        given += take;
      }
      return (ssize_t)given;
    }
    if (seal->plain_len) { /* the record at the start is all taken */
      drop(seal, WHOLE(seal->plain_len));
      seal->plain_len = seal->plain_at = 0;
    }
    size_t want = HEADER - (seal->in_got < HEADER ? seal->in_got : HEADER);
    if (seal->in_got >= HEADER) {
      uint32_t len = hoop__get_be32(seal->in);
      if (len == 0 || len > HOOP__SEAL_RECORD) {
        seal->broken = 1;
        continue;
      }
      if (seal->in_got >= WHOLE(len)) {
        /* Straight into the caller's buffer when the whole record fits its first piece (a
         * record that fails its check may leave that piece zeroed: the call fails anyway). */
        if (n > 0 && iov[0].iov_len >= len) {
          if (open_record(seal, len, iov[0].iov_base) != 0) {
            seal->broken = 1;
            continue;
          }
          drop(seal, WHOLE(len));
          return (ssize_t)len;
        }
        if (open_record(seal, len, seal->in + HEADER) != 0)
          seal->broken = 1;
        else
          seal->plain_len = len;
        continue;
      }
      want = WHOLE(len) - seal->in_got;
    }
    want += AHEAD;
    if (want > IN_CAP - seal->in_got)
      want = IN_CAP - seal->in_got;
    ssize_t got = recv(fd, seal->in + seal->in_got, want, 0);
    if (got > 0)
      seal->in_got += (size_t)got;
    else if (got == 0)
      return 0;
    else if (errno != EINTR)
      return -1;
  }
}

int hoop__seal_buffered(const hoop__seal *seal) {
  return seal->plain_at < seal->plain_len ||
         seal->in_got > (seal->plain_len ? WHOLE(seal->plain_len) : 0);
}
