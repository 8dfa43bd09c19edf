/* auth.h - shared-secret authentication: HMAC-SHA256 proofs over a server's challenge, random
 * bytes, constant-time comparison and token files. The primitives are libsodium's; the token
 * itself never crosses the wire. */
#ifndef HOOP__AUTH_H
#define HOOP__AUTH_H

#include <stddef.h>
#include <stdint.h>

#define HOOP__AUTH_PROOF 32  /* bytes of a proof (an HMAC-SHA256) */
#define HOOP__MAX_TOKEN 1024 /* bytes of a token */

/* What a proof is for; each purpose keys the MAC differently, so that a proof made for one can
 * never be replayed as another. */
#define HOOP__AUTH_JOIN "hoop-join"     /* a HELLO: over the challenge and the HELLO's fields */
#define HOOP__AUTH_STATUS "hoop-status" /* a STATUS_REQ: over the challenge */
#define HOOP__AUTH_DUMP "hoop-dump"     /* a DUMP_REQ: over the challenge */
#define HOOP__AUTH_DATA "hoop-data"     /* the data connections' key: over the job's nonce */
#define HOOP__AUTH_LINK "hoop-link"     /* a data connection's handshake: its ends, its stream */
#define HOOP__AUTH_TABLE "hoop-table"   /* a TABLE_PROOF: the server's, over the rank's challenge */
#define HOOP__AUTH_REPLY "hoop-reply"   /* an acceptor's answer to a data connection's handshake */
#define HOOP__AUTH_SEAL "hoop-seal"     /* an encrypted connection's key, one each way */

#define HOOP__AUTH_KEY 32 /* bytes of a rank's public or secret key, and of a pair's keys */

/* 0 once libsodium is ready (idempotent, thread-safe), -1 if it cannot start. */
int hoop__auth_init(void);

/* Fill buf with len bytes from the system's random source; 0, or -1 if libsodium cannot start. */
int hoop__auth_random(void *buf, size_t len);

/* out = HMAC-SHA256 keyed by token, over purpose, its NUL, then a and b (either may be empty). */
void hoop__auth_proof(const char *token, size_t token_len, const char *purpose, const uint8_t *a,
                      size_t a_len, const uint8_t *b, size_t b_len, uint8_t out[HOOP__AUTH_PROOF]);

/* 1 if the len bytes at a and b are equal, compared in constant time; 0 otherwise. */
int hoop__auth_equal(const uint8_t *a, const uint8_t *b, size_t len);

struct hoop__hello;
/* The proof a HELLO carries: over the challenge and the HELLO's encoding without its proof, so
 * that no field can be changed on the way. 0, or -1 when out of memory. */
int hoop__auth_hello_proof(const char *token, const uint8_t *challenge,
                           const struct hoop__hello *hello, uint8_t out[HOOP__AUTH_PROOF]);

/* The proof a server holding token sends after a rank's first TABLE: over the nonce of the rank's
 * HELLO, the member's own first bytes of the TABLE's payload (HOOP__WIRE_TABLE_OWN of them) and
 * the SHA-256 digest of the rest of it (body_digest), which all members share. */
void hoop__auth_table_proof(const char *token, const uint8_t *hello_nonce, const uint8_t *own,
                            const uint8_t *body_digest, uint8_t out[HOOP__AUTH_PROOF]);
/* SHA-256 of len bytes. */
void hoop__auth_digest(const uint8_t *data, size_t len, uint8_t out[HOOP__AUTH_PROOF]);

/* Read a token from path into out (cap bytes, NUL-terminated), without its trailing newline.
 * Refuses (-1, message in err) a missing, empty or oversized file, and one that other users may
 * read or write: a secret is kept like an ssh key. */
int hoop__auth_read_token(const char *path, char *out, size_t cap, char *err, size_t errlen);

/* The token a process proves, as hoopd, hooprun and the ranks all take it: token itself, or the
 * contents of the file named by file (NULL or "" for either: not given), into out (cap bytes, at
 * least HOOP__MAX_TOKEN + 1); "" when neither is given. -1, message in err, when both are given
 * (the caller cannot know which one the user meant), when token is longer than HOOP__MAX_TOKEN,
 * or when hoop__auth_read_token refuses the file. */
int hoop__auth_load_token(const char *token, const char *file, char *out, size_t cap, char *err,
                          size_t errlen);

/* A rank's own key pair (X25519, libsodium's crypto_kx), made at hoop_init: the public half goes
 * to the rendezvous in its HELLO and to every member in the rank table; the secret half never
 * leaves the process. 0, or -1 if libsodium cannot start. */
int hoop__auth_keypair(uint8_t public_key[HOOP__AUTH_KEY], uint8_t secret_key[HOOP__AUTH_KEY]);

/* The keys of the pair this rank makes with a peer, from this rank's key pair and the peer's
 * public key: tx keys what this rank sends or proves to the peer, rx what the peer sends or proves
 * to this rank (the peer computes the same two, the other way round). Only the two ranks of the
 * pair can compute them. lower: this rank's number is below the peer's (the two ends must take
 * the two roles of crypto_kx). -1 when the peer's key is unusable (a low-order point). */
int hoop__auth_pair_keys(int lower, const uint8_t *public_key, const uint8_t *secret_key,
                         const uint8_t *peer_key, uint8_t tx[HOOP__AUTH_KEY],
                         uint8_t rx[HOOP__AUTH_KEY]);

/* Wipe a secret from memory in a way the compiler keeps. */
void hoop__auth_wipe(void *buf, size_t len);

#endif /* HOOP__AUTH_H */
