/* wire.h - the rendezvous wire protocol: message structs, encoders and bounds-checked decoders.
 *
 * Every message is a 12-byte header followed by a payload:
 *   u32 magic ("HOOP" = 0x484f4f50), u16 version, u16 type, u32 payload length
 * All integers are big-endian, as on every hoop wire (version 3; versions 1 and 2 were
 * little-endian). A string is u16 length + bytes (no NUL on the wire; an embedded
 * NUL is malformed). A byte blob is u16 length + bytes. Each message type has its own payload
 * bound; the decoders reject anything truncated, oversized, with trailing bytes or out of range, so
 * that both the client (lib/rdzv/client.c) and the server (lib/rdzv/server.c and its files) can
 * trust what they get.
 */
#ifndef HOOP__WIRE_H
#define HOOP__WIRE_H

#include <stddef.h>
#include <stdint.h>

#include "util/buf.h"

#define HOOP__WIRE_MAGIC 0x484f4f50u
#define HOOP__WIRE_VERSION 7
#define HOOP__WIRE_HEADER_SIZE 12

#define HOOP__WIRE_MAX_JOB 128      /* bytes of a job id */
#define HOOP__WIRE_MAX_HOST 255     /* bytes of a host name */
#define HOOP__WIRE_MAX_ADDR 255     /* bytes of a transport address string */
#define HOOP__WIRE_MAX_MESSAGE 1024 /* bytes of an error message */
#define HOOP__WIRE_MAX_PROOF 64     /* bytes of an auth proof */
#define HOOP__WIRE_NONCE 16         /* bytes of the per-job nonce */
#define HOOP__WIRE_CHALLENGE 32     /* bytes of the server's per-connection challenge */
#define HOOP__WIRE_KEY 32           /* bytes of a rank's public key (proto/auth.h) */
#define HOOP__WIRE_MAX_RANKS 16384  /* ranks in one job */
#define HOOP__WIRE_MAX_STATUS_JOBS 256
#define HOOP__WIRE_MAX_MISSING 64      /* missing ranks listed per job in a status reply */
#define HOOP__WIRE_MAX_STATUS_HOSTS 16 /* hosts listed per job in a status reply */
#define HOOP__WIRE_MAX_ACCUSED 64      /* ranks a SHRINK names as failed */
#define HOOP__WIRE_STATS_SAMPLES 64    /* calls a STATS describes, at most */
#define HOOP__WIRE_MAX_LATE 32         /* ranks a VIEW names, slowest first */
#define HOOP__WIRE_STATUS_LATE 4       /* ranks a status reply names per running job */
#define HOOP__WIRE_MAX_LINKS 4         /* links a STATS, a VIEW or a status names, slowest first */

/* Largest payload a client may send (HELLO, STATUS_REQ): the server refuses bigger ones at the
 * header, before reading them. */
#define HOOP__WIRE_MAX_CLIENT_PAYLOAD 4096
/* Largest payload of a NOTICE: what a member accepts on its kept connection. */
#define HOOP__WIRE_MAX_NOTICE_PAYLOAD (4 + 4 + 2 + HOOP__WIRE_MAX_MESSAGE)
/* Largest payload of any message (a TABLE for HOOP__WIRE_MAX_RANKS ranks fits). */
#define HOOP__WIRE_MAX_PAYLOAD                                                                     \
  (HOOP__WIRE_MAX_RANKS *                                                                          \
       (2 + HOOP__WIRE_MAX_HOST + 2 + HOOP__WIRE_MAX_ADDR + 8 + HOOP__WIRE_KEY) +                  \
   64)

/* A connection: the server speaks first with CHALLENGE; the client sends one request (HELLO or
 * STATUS_REQ, carrying a proof when the challenge asks for one). A STATUS_REQ is answered and the
 * connection closed. A HELLO is answered with the TABLE (or an ERROR, and closed); the member then
 * keeps the connection for the communicator's life, the join having authenticated it: it may send
 * ABORT, and sends BYE when it finalizes; the server relays a member's ABORT, or the loss of a
 * member's connection without a BYE, to the job's other members as a NOTICE.
 *
 * After a failure, the survivors of a running job may each send SHRINK on their kept connection
 * (hoop_comm_shrink): the server waits for every member still connected that has said no goodbye
 * (a member some SHRINK names as failed only for a short grace, anyone at most for the timeout
 * the SHRINKs carry), then sends each member that asked a TABLE of the next generation: the
 * askers only, dense ranks in their old order, their new addresses. Members left out get an
 * ERROR and are closed; the others keep their connections, now members of the new generation.
 *
 * A newcomer (a HELLO with rank HOOP__HELLO_NEWCOMER) joins a job that is running: the server
 * holds it, tells the members how many newcomers wait (PENDING), and puts it in the next
 * generation, after the members (hoop_comm_grow, or a shrink). A table after the first carries
 * its generation number at its end.
 *
 * Keys (version 6): a HELLO carries the rank's public key, and the TABLE every member's, so that
 * each pair of ranks keys its data connections with a secret only the two of them hold
 * (transport/shared.c).
 *
 * Health (version 5): a member sends STATS on its kept connection every few seconds (how much it
 * waited in each of its last calls, and its totals); the server answers each with a VIEW of the
 * job: the ranks the others waited for longest, and how long (rdzv/health.c). A STATUS lists the
 * running jobs too, with their health.
 *
 * A DUMP_REQ (on a connection of its own, proving the token as a STATUS_REQ does) asks for one
 * running job's flight recorders without stopping it: the server sends each member DUMP on its
 * kept connection, each answers FLIGHT (its running call, whom it waits for, its last calls), and
 * the server replies DUMP_REPLY once every member answered or HOOP__DUMP_WAIT_MS passed, naming
 * those that did not. */
typedef enum hoop__msg_type {
  HOOP_MSG_HELLO = 1,        /* client -> server: join a job */
  HOOP_MSG_TABLE = 2,        /* server -> client: the job is complete; here is the rank table */
  HOOP_MSG_ERROR = 3,        /* server -> client: the join failed (code + message) */
  HOOP_MSG_STATUS_REQ = 4,   /* client -> server: list the jobs waiting */
  HOOP_MSG_STATUS = 5,       /* server -> client: the jobs waiting */
  HOOP_MSG_CHALLENGE = 6,    /* server -> client, first on every connection: flags and a nonce */
  HOOP_MSG_ABORT = 7,        /* member -> server, after its TABLE: it aborts, tell the others */
  HOOP_MSG_BYE = 8,          /* member -> server: it finalized; its connection closing is no loss */
  HOOP_MSG_NOTICE = 9,       /* server -> member: another member aborted or was lost */
  HOOP_MSG_SHRINK = 10,      /* member -> server: join the next generation of the job's survivors */
  HOOP_MSG_PENDING = 11,     /* server -> member: newcomers wait to join the next generation */
  HOOP_MSG_TABLE_PROOF = 12, /* server -> client, right after its first TABLE when the server
                                holds a token: the server's proof of it, over the HELLO's nonce */
  HOOP_MSG_STATS = 13,       /* member -> server: what it waited for in its last calls */
  HOOP_MSG_VIEW = 14,        /* server -> member: the job's late ranks, in answer to STATS */
  HOOP_MSG_DUMP_REQ = 15,    /* client -> server: every member's flight recorder, of one job */
  HOOP_MSG_DUMP = 16,        /* server -> member: send your flight recorder (FLIGHT) */
  HOOP_MSG_FLIGHT = 17,      /* member -> server: its flight recorder, as text */
  HOOP_MSG_DUMP_REPLY = 18   /* server -> client: the members' FLIGHTs, by rank */
} hoop__msg_type;
#define HOOP__MSG_LAST HOOP_MSG_DUMP_REPLY

/* The bytes at the start of a TABLE's payload that differ between members (size, rank, nonce):
 * a TABLE_PROOF covers them and a digest of the rest, which is the same for every member. */
#define HOOP__WIRE_TABLE_OWN (8 + HOOP__WIRE_NONCE)

/* CHALLENGE flags. */
#define HOOP__CHALLENGE_AUTH 1u /* requests need a proof: HMAC-SHA256 of the token (see auth.h) */

typedef struct hoop__wire_header {
  uint32_t magic;
  uint16_t version;
  uint16_t type;
  uint32_t length;
} hoop__wire_header;

/* hello.rank of a newcomer to a running job (its size is ignored: send 1). */
/* HELLO flags: the rank seals its TCP connections (HOOP_ENCRYPT), which a server may require. */
#define HOOP__HELLO_SEALED 1u
#define HOOP__HELLO_FLAGS HOOP__HELLO_SEALED
#define HOOP__HELLO_NEWCOMER (-2)

typedef struct hoop__hello {
  char job[HOOP__WIRE_MAX_JOB + 1];
  uint32_t size;       /* the job's size, 1..HOOP__WIRE_MAX_RANKS */
  int32_t rank;        /* requested rank in [0, size), -1, or HOOP__HELLO_NEWCOMER */
  uint32_t timeout_ms; /* how long this rank waits; the server times the job out after it */
  char host[HOOP__WIRE_MAX_HOST + 1];
  char addr[HOOP__WIRE_MAX_ADDR + 1]; /* where peers reach this rank's transport */
  uint16_t proof_len;
  uint8_t proof[HOOP__WIRE_MAX_PROOF];
  uint8_t nonce[HOOP__WIRE_CHALLENGE]; /* the rank's own challenge to the server (random) */
  uint8_t key[HOOP__WIRE_KEY];         /* the rank's public key */
  uint32_t flags;                      /* HOOP__HELLO_* */
} hoop__hello;

typedef struct hoop__table_proof {
  uint16_t proof_len;
  uint8_t proof[HOOP__WIRE_MAX_PROOF];
} hoop__table_proof;

typedef struct hoop__challenge {
  uint8_t flags; /* HOOP_CHALLENGE_* */
  uint8_t nonce[HOOP__WIRE_CHALLENGE];
} hoop__challenge;

typedef struct hoop__status_req {
  uint16_t proof_len;
  uint8_t proof[HOOP__WIRE_MAX_PROOF];
} hoop__status_req;

typedef struct hoop__peer_entry {
  char host[HOOP__WIRE_MAX_HOST + 1];
  char addr[HOOP__WIRE_MAX_ADDR + 1];
  uint32_t local_rank;
  uint32_t local_size;
  uint8_t key[HOOP__WIRE_KEY]; /* the rank's public key, from its HELLO */
} hoop__peer_entry;

typedef struct hoop__table {
  uint32_t size; /* ranks in the job */
  uint32_t rank; /* the receiver's rank */
  uint8_t nonce[HOOP__WIRE_NONCE];
  hoop__peer_entry *peers; /* size entries; owned, free with hoop__table_free */
  uint32_t generation;     /* 0 for the job's first table; sent only when not 0 */
} hoop__table;

typedef struct hoop__error_msg {
  uint32_t code; /* a hoop_result */
  char message[HOOP__WIRE_MAX_MESSAGE + 1];
} hoop__error_msg;

typedef struct hoop__abort_msg {
  uint32_t rank; /* the aborting member's rank, < HOOP__WIRE_MAX_RANKS */
  char reason[HOOP__WIRE_MAX_MESSAGE + 1];
} hoop__abort_msg;

typedef struct hoop__notice {
  uint32_t code;   /* a hoop_result, not 0: HOOP_ERR_ABORTED or HOOP_ERR_PEER_LOST */
  uint32_t origin; /* the rank that aborted or was lost, < HOOP__WIRE_MAX_RANKS */
  char message[HOOP__WIRE_MAX_MESSAGE + 1];
} hoop__notice;

/* SHRINK flags: none yet (a later version may admit newcomers). */
#define HOOP__SHRINK_FLAGS 0u

typedef struct hoop__shrink_msg {
  uint32_t generation; /* the generation the member belongs to (0: the job's first table) */
  uint32_t rank;       /* its rank in that generation, < HOOP__WIRE_MAX_RANKS */
  uint32_t timeout_ms; /* how long it waits for the others to ask */
  uint32_t flags;      /* HOOP__SHRINK_FLAGS */
  char addr[HOOP__WIRE_MAX_ADDR + 1]; /* where peers reach its transport in the new generation */
  uint32_t naccused;                  /* entries in accused[] */
  uint32_t accused[HOOP__WIRE_MAX_ACCUSED]; /* ranks it takes for failed, < HOOP__WIRE_MAX_RANKS */
} hoop__shrink_msg;

/* One rank's lateness: over the calls every rank described, how much later than the first rank
 * this one came to each (rdzv/health.c), in microseconds. */
typedef struct hoop__late {
  uint32_t rank;
  uint32_t median_us, p99_us, max_us;
} hoop__late;

/* A link's goodput over a period: the bytes of the large messages (64 KiB or more) that came over
 * it, and the time they took from first byte to last. A STATS names the sender only (the link ends
 * at the member); a VIEW or a status both ends. */
typedef struct hoop__link {
  uint32_t from, to;
  uint64_t bytes, us;
} hoop__link;

/* One call of the job's communicator that needs every rank (allreduce, allgather, barrier,
 * reduce-scatter, all-to-all), as a member describes it. */
typedef struct hoop__stats_sample {
  uint32_t seq;       /* the call's number (its low 32 bits) */
  uint32_t waited_us; /* how long this rank waited in it */
  uint32_t came_us;   /* when this rank came to it: its clock's microseconds, low 32 bits (0:
                         not known; a rank that neither waited nor was away reads no clock) */
} hoop__stats_sample;

/* STATS: a member's own account, its last calls by their sequence numbers. */
typedef struct hoop__stats_msg {
  uint64_t calls, bytes; /* collective calls since the communicator began, and their payload */
  uint64_t in_calls_us;  /* time inside them */
  uint64_t waited_us;    /* of which waiting for peers */
  uint64_t since_us;     /* time since the communicator began */
  /* Whose clock the samples' came_us read: members with the same nonzero clock share one
   * (CLOCK_MONOTONIC of one boot of one kernel, network namespaces included: a hash of its boot
   * id); 0: not comparable with any other. */
  uint64_t clock;
  uint32_t nsamples; /* at most HOOP__WIRE_STATS_SAMPLES */
  hoop__stats_sample samples[HOOP__WIRE_STATS_SAMPLES];
  uint32_t nlinks; /* its slowest links in, since its last STATS (to: unused) */
  hoop__link links[HOOP__WIRE_MAX_LINKS];
} hoop__stats_msg;

/* VIEW: the job as the server sees it from the members' STATS. */
typedef struct hoop__view_msg {
  uint32_t calls;     /* calls compared: those every member described */
  uint32_t reporting; /* members whose STATS the server holds */
  uint32_t nlate;     /* entries in late[], at most HOOP__WIRE_MAX_LATE, latest first */
  hoop__late late[HOOP__WIRE_MAX_LATE];
  uint32_t nlinks; /* the job's slowest links in the members' last periods, slowest first */
  hoop__link links[HOOP__WIRE_MAX_LINKS];
} hoop__view_msg;

/* A running job's health in a STATUS (zeros for a job still waiting). */
typedef struct hoop__job_health {
  uint32_t running;       /* 1: the table went out */
  uint32_t reporting;     /* members whose STATS the server holds */
  uint32_t calls_per_s;   /* collective calls per second, the members' median */
  uint32_t wait_permille; /* the share of time the members spent waiting, their mean, in 1/1000 */
  uint32_t calls;         /* calls the late ranks' figures cover */
  uint32_t nlate;         /* at most HOOP__WIRE_STATUS_LATE, latest first */
  hoop__late late[HOOP__WIRE_STATUS_LATE];
  uint32_t nlinks; /* the slowest links, slowest first */
  hoop__link links[HOOP__WIRE_MAX_LINKS];
} hoop__job_health;

#define HOOP__WIRE_MAX_FLIGHT 3800 /* bytes of a member's FLIGHT text */
#define HOOP__DUMP_WAIT_MS 5000    /* how long the server waits for the members' FLIGHTs */

typedef struct hoop__dump_req {
  uint16_t proof_len;
  uint8_t proof[HOOP__WIRE_MAX_PROOF];
  char job[HOOP__WIRE_MAX_JOB + 1];
} hoop__dump_req;

/* A DUMP_REPLY: per member, its rank and its FLIGHT text (or why there is none). */
typedef struct hoop__dump_entry {
  uint32_t rank;
  char text[HOOP__WIRE_MAX_FLIGHT + 1];
} hoop__dump_entry;

typedef struct hoop__dump_reply {
  uint32_t n;
  hoop__dump_entry *entries; /* owned, free with hoop__dump_reply_free */
} hoop__dump_reply;

typedef struct hoop__job_status {
  char job[HOOP__WIRE_MAX_JOB + 1];
  uint32_t size;      /* ranks expected */
  uint32_t joined;    /* ranks joined so far */
  uint32_t waited_ms; /* since the first rank joined */
  uint32_t nmissing;  /* entries in missing[], at most HOOP__WIRE_MAX_MISSING */
  int32_t missing[HOOP__WIRE_MAX_MISSING]; /* requested ranks not yet joined */
  uint32_t nhosts; /* entries in hosts[]: the hosts joined, in order of first arrival */
  struct {
    char name[HOOP__WIRE_MAX_HOST + 1];
    uint32_t ranks; /* ranks joined from it */
  } hosts[HOOP__WIRE_MAX_STATUS_HOSTS];
  hoop__job_health health;
} hoop__job_status;

typedef struct hoop__status {
  uint32_t njobs;
  hoop__job_status *jobs; /* owned, free with hoop__status_free */
} hoop__status;

/* Messages are encoded into the growable buffer of util/buf.h. */
typedef hoop__buf hoop__wbuf;

static inline void hoop__wbuf_free(hoop__wbuf *wb) {
  hoop__buf_free(wb);
}

/* Encoders append one whole message (header + payload) to wb. They return 0, or -1 if the struct
 * is out of bounds (a string too long, a rank out of range) or memory ran out. */
int hoop__wire_encode_hello(hoop__wbuf *wb, const hoop__hello *msg);
int hoop__wire_encode_table(hoop__wbuf *wb, const hoop__table *msg);
int hoop__wire_encode_error(hoop__wbuf *wb, const hoop__error_msg *msg);
int hoop__wire_encode_status_req(hoop__wbuf *wb, const hoop__status_req *msg);
int hoop__wire_encode_status(hoop__wbuf *wb, const hoop__status *msg);
int hoop__wire_encode_challenge(hoop__wbuf *wb, const hoop__challenge *msg);
int hoop__wire_encode_abort(hoop__wbuf *wb, const hoop__abort_msg *msg);
int hoop__wire_encode_bye(hoop__wbuf *wb);
int hoop__wire_encode_notice(hoop__wbuf *wb, const hoop__notice *msg);
int hoop__wire_encode_shrink(hoop__wbuf *wb, const hoop__shrink_msg *msg);
int hoop__wire_encode_pending(hoop__wbuf *wb, uint32_t newcomers);
int hoop__wire_encode_table_proof(hoop__wbuf *wb, const hoop__table_proof *msg);
/* Put link among the n slowest of links (at most HOOP__WIRE_MAX_LINKS, slowest first by bytes
 * per microsecond), where it belongs; past the last place, it is left out. */
void hoop__links_insert(hoop__link *links, uint32_t *n, const hoop__link *link);

int hoop__wire_encode_stats(hoop__wbuf *wb, const hoop__stats_msg *msg);
int hoop__wire_encode_view(hoop__wbuf *wb, const hoop__view_msg *msg);
int hoop__wire_encode_dump_req(hoop__wbuf *wb, const hoop__dump_req *msg);
int hoop__wire_encode_dump(hoop__wbuf *wb);
int hoop__wire_encode_flight(hoop__wbuf *wb, const char *text);
/* The entries' texts are cut to text_cap bytes each (a reply of many ranks stays in bounds). */
int hoop__wire_encode_dump_reply(hoop__wbuf *wb, const hoop__dump_reply *msg, size_t text_cap);

/* Decode the first HOOP__WIRE_HEADER_SIZE bytes of buf. Returns 0 if valid, 1 if len is still too
 * short, -1 if the magic, version or type is wrong or the length exceeds max_payload. */
int hoop__wire_decode_header(const uint8_t *buf, size_t len, size_t max_payload,
                             hoop__wire_header *out);

/* Payload decoders: 0 on success, -1 if the payload is malformed (then *out holds nothing that
 * needs freeing). */
int hoop__wire_decode_hello(const uint8_t *payload, size_t len, hoop__hello *out);
int hoop__wire_decode_table(const uint8_t *payload, size_t len, hoop__table *out);
int hoop__wire_decode_error(const uint8_t *payload, size_t len, hoop__error_msg *out);
int hoop__wire_decode_status(const uint8_t *payload, size_t len, hoop__status *out);
int hoop__wire_decode_status_req(const uint8_t *payload, size_t len, hoop__status_req *out);
int hoop__wire_decode_challenge(const uint8_t *payload, size_t len, hoop__challenge *out);
int hoop__wire_decode_abort(const uint8_t *payload, size_t len, hoop__abort_msg *out);
int hoop__wire_decode_bye(const uint8_t *payload, size_t len); /* a BYE's payload is empty */
int hoop__wire_decode_notice(const uint8_t *payload, size_t len, hoop__notice *out);
int hoop__wire_decode_shrink(const uint8_t *payload, size_t len, hoop__shrink_msg *out);
int hoop__wire_decode_pending(const uint8_t *payload, size_t len, uint32_t *newcomers);
int hoop__wire_decode_table_proof(const uint8_t *payload, size_t len, hoop__table_proof *out);
int hoop__wire_decode_stats(const uint8_t *payload, size_t len, hoop__stats_msg *out);
/* size: the job's, which every rank named must be below. */
int hoop__wire_decode_view(const uint8_t *payload, size_t len, uint32_t size, hoop__view_msg *out);
int hoop__wire_decode_dump_req(const uint8_t *payload, size_t len, hoop__dump_req *out);
int hoop__wire_decode_dump(const uint8_t *payload, size_t len); /* a DUMP's payload is empty */
/* text: HOOP__WIRE_MAX_FLIGHT + 1 bytes. */
int hoop__wire_decode_flight(const uint8_t *payload, size_t len, char *text);
int hoop__wire_decode_dump_reply(const uint8_t *payload, size_t len, hoop__dump_reply *out);
void hoop__dump_reply_free(hoop__dump_reply *reply);

void hoop__table_free(hoop__table *table);
void hoop__status_free(hoop__status *status);

#endif /* HOOP__WIRE_H */
