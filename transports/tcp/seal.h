/* seal.h - encrypted TCP streams (HOOP_ENCRYPT): the bytes a stream carries cut into records, each
 * sealed with an AEAD of libsodium (AES-256-GCM, or ChaCha20-Poly1305 where the CPU lacks AES
 * instructions), keyed one way each by the pair's secret and the connection's handshake
 * (conn.c), numbered by a counter that is the nonce, so that a record changed, replayed,
 * reordered or dropped on the way fails its check.
 *
 * A record: u32 plaintext length (1..HOOP__SEAL_RECORD, the additional data), the ciphertext,
 * the 16-byte tag. The calls behave as non-blocking sendmsg and recvmsg on the stream's
 * descriptor, with two differences the data path minds: a record's plaintext counts as sent only
 * once all of the record is written (until then the call says EAGAIN, and the caller offers the
 * same bytes again), and a record read whole may hold plaintext the caller did not ask for yet,
 * which waits in the seal (hoop__seal_buffered) rather than in the kernel. A record that fails its
 * check makes the call fail with EBADMSG, and nothing of it is delivered. */
#ifndef HOOP__TCP_SEAL_H
#define HOOP__TCP_SEAL_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/uio.h>

#define HOOP__SEAL_RECORD (64 * 1024)
#define HOOP__SEAL_TAG 16
#define HOOP__SEAL_KEY 32

typedef enum hoop__cipher {
  HOOP__CIPHER_NONE = 0,
  HOOP__CIPHER_AES256GCM = 1,
  HOOP__CIPHER_CHACHA20POLY1305 = 2,
} hoop__cipher;

typedef struct hoop__seal {
  hoop__cipher cipher;
  uint8_t tx_key[HOOP__SEAL_KEY], rx_key[HOOP__SEAL_KEY];
  uint64_t tx_seq, rx_seq; /* the next record's number each way */
  /* A record sealed and not all written: out_len bytes, out_done of them written, holding
   * out_plain bytes of the caller's. */
  uint8_t *out;
  size_t out_len, out_done, out_plain;
  /* What came: in_got bytes from the start of in; the record at the start, once opened, has its
   * plaintext at in + 4, plain_at of plain_len taken; the next records' bytes follow it. */
  uint8_t *in;
  size_t in_got, plain_at, plain_len;
  int broken; /* a record failed its check: every later recv fails too */
  void *aes;  /* AES-256-GCM's expanded keys (crypto_aead_aes256gcm_state), tx then rx */
} hoop__seal;

/* HOOP_ENCRYPT's value: 0 (no), 1 (AES-256-GCM where this CPU has AES instructions, else
 * ChaCha20-Poly1305), aes256gcm or chacha20poly1305. -1 for anything else, or for aes256gcm on a
 * CPU without them (why says which). */
int hoop__seal_choose(const char *value, hoop__cipher *cipher, const char **why);
const char *hoop__seal_cipher_name(hoop__cipher cipher);

/* Ready the seal of a connection (its record buffers come with its first send and receive): 0, or
 * -1 out of memory. */
int hoop__seal_init(hoop__seal *seal, hoop__cipher cipher, const uint8_t *tx_key,
                    const uint8_t *rx_key);
void hoop__seal_free(hoop__seal *seal);

/* As sendmsg and recvmsg without flags on the non-blocking fd (see above): bytes of the caller's
 * taken or given, 0 on recv at the end of the stream, -1 with errno (EAGAIN: wait; EBADMSG: a
 * record failed its check). */
ssize_t hoop__seal_send(hoop__seal *seal, int fd, const struct iovec *iov, int n);
ssize_t hoop__seal_recv(hoop__seal *seal, int fd, const struct iovec *iov, int n);
/* Whether bytes that came wait in the seal: a recv may give some without the descriptor being
 * readable. */
int hoop__seal_buffered(const hoop__seal *seal);

#endif /* HOOP__TCP_SEAL_H */
