/* aead-speed.c - what HOOP_ENCRYPT's AEADs cost one core: records of HOOP__SEAL_RECORD bytes
 * sealed and opened, as transports/tcp/seal.c does, for about a second each; prints GB/s (10^9
 * bytes of plaintext a second) for each cipher this CPU has. Then what the per-rank keys cost
 * hoop_init: a rank's key pair, and a pair's keys (crypto_kx, once per peer a rank connects to).
 * Usage: aead-speed [SECONDS] */
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../transports/tcp/seal.h"

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
  double seconds = argc > 1 ? atof(argv[1]) : 1.0;
  if (sodium_init() < 0 || seconds <= 0) {
    fprintf(stderr, "aead-speed: libsodium cannot start, or a bad duration\n");
    return 1;
  }
  size_t len = HOOP__SEAL_RECORD;
  unsigned char *text = malloc(len), *sealed = malloc(len), tag[16], ad[4] = {0, 1, 0, 0};
  unsigned char nonce[12] = {0}, sealed_tag[16];
  unsigned char key[32];
  randombytes_buf(key, sizeof key);
  randombytes_buf(text, len);
  crypto_aead_aes256gcm_state *aes = sodium_malloc(sizeof *aes);
  crypto_aead_aes256gcm_beforenm(aes, key);
  for (int cipher = 0; cipher < 2; cipher++) {
    if (cipher == 0 && !crypto_aead_aes256gcm_is_available()) {
      printf("AES-256-GCM: not available on this CPU\n");
      continue;
    }
    /* What the opening rounds open: one record, sealed once (opened out of place, so that it
     * stays whole and its tag right; each must open, or the time is only the tag's). */
    if (cipher == 0)
      crypto_aead_aes256gcm_encrypt_detached_afternm(sealed, sealed_tag, NULL, text, len, ad, 4,
                                                     NULL, nonce, aes);
    else
      crypto_aead_chacha20poly1305_ietf_encrypt_detached(sealed, sealed_tag, NULL, text, len, ad, 4,
                                                         NULL, nonce, key);
    for (int opening = 0; opening < 2; opening++) {
      int failed = 0;
      size_t bytes = 0;
      double start = now(), end = start;
      while (end - start < seconds) {
        for (int i = 0; i < 64; i++, bytes += len) {
          unsigned char fresh[12] = {0};
          fresh[11] = (unsigned char)(i + 1);
          if (cipher == 0 && !opening)
            crypto_aead_aes256gcm_encrypt_detached_afternm(text, tag, NULL, text, len, ad, 4, NULL,
                                                           fresh, aes);
          else if (cipher == 0)
            failed |= crypto_aead_aes256gcm_decrypt_detached_afternm(text, NULL, sealed, len,
                                                                     sealed_tag, ad, 4, nonce, aes);
          else if (!opening)
            crypto_aead_chacha20poly1305_ietf_encrypt_detached(text, tag, NULL, text, len, ad, 4,
                                                               NULL, fresh, key);
          else
            failed |= crypto_aead_chacha20poly1305_ietf_decrypt_detached(
                text, NULL, sealed, len, sealed_tag, ad, 4, nonce, key);
        }
        end = now();
      }
      if (failed) {
        fprintf(stderr, "aead-speed: a record sealed here did not open\n");
        return 1;
      }
      printf("%-18s %-5s %6.2f GB/s (records of %zu bytes, one core)\n",
             cipher == 0 ? "AES-256-GCM" : "ChaCha20-Poly1305", opening ? "open" : "seal",
             (double)bytes / (end - start) * 1e-9, len);
    }
  }
  unsigned char pk[2][crypto_kx_PUBLICKEYBYTES], sk[2][crypto_kx_SECRETKEYBYTES];
  unsigned char rx[crypto_kx_SESSIONKEYBYTES], tx[crypto_kx_SESSIONKEYBYTES];
  int pairs = 0, made = 0;
  double start = now(), end = start;
  for (; end - start < seconds / 4; made++, end = now())
    crypto_kx_keypair(pk[made % 2], sk[made % 2]);
  printf("%-18s %8.1f us each\n", "a rank's key pair", (end - start) / made * 1e6);
  start = end = now();
  for (; end - start < seconds / 4; pairs++, end = now())
    if (crypto_kx_client_session_keys(rx, tx, pk[0], sk[0], pk[1]) != 0) {
      fprintf(stderr, "aead-speed: a pair's keys could not be made\n");
      return 1;
    }
  printf("%-18s %8.1f us each (a peer's, once)\n", "a pair's keys", (end - start) / pairs * 1e6);
  sodium_free(aes);
  free(text);
  free(sealed);
  return 0;
}
