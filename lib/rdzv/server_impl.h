/* server_impl.h - the rendezvous server's own structures and the functions its files share
 * (server.h is the interface the daemon, the launcher and a hosting rank use). The server is split
 * by responsibility: jobs.c, table.c, conn.c, hello.c, server.c; thread.c runs it on a thread.
 */
#ifndef HOOP__RDZV_SERVER_IMPL_H
#define HOOP__RDZV_SERVER_IMPL_H

#include <stdint.h>
#include <uv.h>

#include "core/log.h"
#include "hoop.h"
#include "proto/auth.h"
#include "proto/wire.h"
#include "rdzv/server.h"

#define DEFAULT_MAX_JOBS 1024
#define DEFAULT_IDLE_TIMEOUT_S 30.0
#define DEFAULT_IDLE_PER_ADDRESS 64
#define IDLE_GRACE_MS 1000 /* a connection silent this long counts against its address's limit */
/* One address's silent connections, of any age, may take at most this share of the server's
 * connections (1/IDLE_SHARE, and never fewer than max_idle_per_address): a burst from one place
 * cannot fill it within IDLE_GRACE_MS. */
#define IDLE_SHARE 4
#define DEFAULT_KEEPALIVE_S 300
#define KEEPALIVE_PROBES 4
#define KEEPALIVE_MAX_S 86400
/* Every rank of a job of 4096 may connect at once: a full accept queue drops a connection's last
 * ACK, and one made by a SYN cookie is then lost on the server's side while the rank, which waits
 * for the server to speak first, believes it connected (bench/rdzv-load: 100 of 4096 lost at 511).
 * The kernel caps it at net.core.somaxconn (4096 since Linux 5.4). */
#define LISTEN_BACKLOG 4096
#define TRIM_AFTER_RANKS                                                                           \
  256 /* a job this large leaves memory to give back (hoop__rdzv_handle_closed) */
#define MISSING_NAMED 16 /* missing ranks named in a timeout message before "and M more" */

/* An encoded TABLE differs between members only in its first bytes (header, size, rank, nonce),
 * and only in the rank, the u32 at payload offset 4 (see the layouts in wire.c). The server encodes
 * the table once and sends each member its own copy of these first bytes. */
#define TABLE_HEAD (HOOP__WIRE_HEADER_SIZE + 8 + HOOP__WIRE_NONCE)
#define TABLE_RANK_AT (HOOP__WIRE_HEADER_SIZE + 4)

/* Why the server refused a request or a connection, as its metrics count them (metrics.c). */
typedef enum rdzv_refusal {
  REFUSED_AUTH,      /* no proof of the token, or a wrong one */
  REFUSED_MALFORMED, /* bytes that are not the protocol (a member's too) */
  REFUSED_LIMIT,     /* connections or jobs at their limit, silent connections of one address */
  REFUSED_MISMATCH,  /* a HELLO that does not fit its job (size, a taken rank, another job) */
  REFUSED_IDLE,      /* no complete request within the idle timeout */
  REFUSED_TIMEOUT,   /* a job whose ranks did not all come within its timeout */
  REFUSALS
} rdzv_refusal;

typedef struct rdzv_job rdzv_job;
typedef struct rdzv_client rdzv_client;

struct rdzv_client {
  uv_tcp_t tcp;
  uv_timer_t timer; /* the idle deadline; while replying, the deadline for the reply to be taken */
  hoop__rdzv_server *server;
  rdzv_client *prev, *next;
  rdzv_job *job;     /* the job joined and waited for, or NULL */
  hoop__hello hello; /* the HELLO, once joined */
  int open_handles;  /* of tcp and timer; freed when both are closed */
  int closing;
  int replying;          /* a reply is on its way; the connection closes once it is written */
  uint32_t rank;         /* a member of a running job: its rank in the table */
  int said_goodbye;      /* a member sent BYE or ABORT: its connection closing is no loss */
  int unanswered;        /* its host stopped answering keepalive probes */
  int keepalive_s;       /* how long its host may stop answering before it is dropped */
  int has_table;         /* its TABLE is on its way: NOTICEs may follow it */
  int shrink_asked;      /* it sent SHRINK for the job's current generation (rdzv/shrink.c) */
  rdzv_job *pending_job; /* a newcomer: the running job it waits to join */
  char shrink_addr[HOOP__WIRE_MAX_ADDR + 1]; /* where peers reach it in the next generation */
  uint8_t challenge[HOOP__WIRE_CHALLENGE];   /* sent first; a request's proof is over it */
  char peer[64];
  char from[64]; /* peer without its port: what the limit of idle connections per address counts */
  uint64_t accepted_ms;       /* uv_now at its accept */
  struct rdzv_report *report; /* a member's last STATS (health.c), or NULL */
  struct rdzv_dump *dump;     /* a dump it asked for and waits for (dump.c), or NULL */
  size_t inlen;
  uint8_t in[HOOP__WIRE_HEADER_SIZE + HOOP__WIRE_MAX_CLIENT_PAYLOAD];
};

struct rdzv_job {
  uv_timer_t timer; /* the job's deadline, counted from its first HELLO */
  hoop__rdzv_server *server;
  rdzv_job *prev, *next;
  char id[HOOP__WIRE_MAX_JOB + 1];
  uint32_t size;
  uint32_t timeout_ms;
  uint64_t created_ms;   /* loop time of the first HELLO */
  rdzv_client **members; /* joined, in order of arrival */
  uint32_t joined, capacity;
  uint32_t nrequested;     /* members that asked for a rank */
  uint8_t *taken;          /* bitmap of ranks held by members */
  int running;             /* the table went out; members listed are those still connected */
  uint32_t generation;     /* tables sent since the first (each shrink makes one) */
  int shrinking;           /* a member asked to shrink; the next generation is being gathered */
  int shrink_grace_over;   /* members named as failed are no longer waited for */
  uint64_t shrink_due_ms;  /* loop time at which members still silent are left out */
  uint8_t *accused;        /* size bits: ranks some SHRINK named as failed */
  rdzv_client **newcomers; /* waiting to join the next generation, in order of arrival */
  uint32_t nnewcomers, newcomers_capacity;
  int forgotten; /* job_forget ran; freed once its timer has closed */
  /* The job's health from its members' STATS (health.c): the last view, and when it was made
   * (loop time; 0: never). */
  hoop__view_msg view;
  hoop__job_health health;
  uint64_t view_ms;
  int view_stale;         /* a STATS came since */
  struct rdzv_dump *dump; /* a dump on its way (dump.c), or NULL */
};

struct hoop__rdzv_server {
  uv_loop_t *loop;
  uv_tcp_t listener;
  int listening;
  int closing;      /* hoop__rdzv_server_close was called */
  int open_handles; /* libuv handles of the server, its clients and jobs not closed yet */
  int trim_due;     /* a large job was forgotten: trim the heap once all of it is freed */
  int port;
  char where[80];
  int max_jobs, max_connections, max_idle_per_address;
  uint64_t idle_ms;
  int keepalive_s;
  int once, once_over, done_called;
  int require_sealed; /* hoop__rdzv_options' */
  int elastic;        /* with once: newcomers to the running job are still taken */
  char only_job[HOOP__WIRE_MAX_JOB + 1]; /* "": any job; else this one alone, of only_size */
  uint32_t only_size, only_timeout_ms;
  char token[HOOP__MAX_TOKEN + 1]; /* "" when requests need no proof */
  void (*on_done)(void *arg);
  void *arg;
  rdzv_client *clients;
  int nclients;
  rdzv_job *jobs, *jobs_tail; /* in order of creation, for the status reply; running ones too */
  int njobs;                  /* waiting, not running */
  int nrunning;
  int pending_writes;
  /* What the metrics count (metrics.c): ranks that joined a job, refusals by cause, members'
   * aborts and losses relayed, status queries answered. */
  uint64_t joins, refusals[REFUSALS], aborts, losses, status_queries;
};

/* A reply on its way to one client: a whole message of its own, or the shared TABLE body behind
 * the member's own TABLE_HEAD bytes. */
typedef struct shared_table {
  hoop__wbuf wire;
  uint32_t refs;
  int digested;       /* digest holds the SHA-256 of the bytes after TABLE_HEAD */
  uint8_t digest[32]; /* for the TABLE_PROOFs (a token's server), made on first need */
} shared_table;

typedef struct rdzv_reply {
  uv_write_t req;
  rdzv_client *client;
  int keep_open; /* the CHALLENGE, a member's TABLE or a NOTICE: the connection stays open */
  hoop__wbuf message;
  shared_table *table;
  uint8_t head[TABLE_HEAD];
} rdzv_reply;

/* One member while a job completes or is described: its host, arrival and (assigned) rank. */
typedef struct member_slot {
  const char *host;
  uint32_t arrival;
  int32_t rank;
  uint32_t local_rank, local_size;
} member_slot;

typedef struct host_group {
  member_slot **first; /* count consecutive entries of the sorted array */
  uint32_t count;
  uint32_t arrival; /* the earliest arrival on this host */
} host_group;

/* ---- jobs.c: grouping members by host, jobs, a job's timeout --------------------------------- */
int hoop__rdzv_bit_test(const uint8_t *bits, uint32_t i);
void hoop__rdzv_bit_set(uint8_t *bits, uint32_t i);
void hoop__rdzv_format_seconds(uint64_t ms, char *out, size_t outlen);
int hoop__rdzv_by_host_then_arrival(const void *a, const void *b);
int hoop__rdzv_by_host_then_rank(const void *a, const void *b);
host_group *hoop__rdzv_group_by_host(member_slot **slots, uint32_t n,
                                     int (*cmp)(const void *, const void *), uint32_t *ngroups);
member_slot *hoop__rdzv_job_slots(const rdzv_job *job, member_slot ***pointers);
void hoop__rdzv_handle_closed(hoop__rdzv_server *server);
void hoop__rdzv_job_forget(rdzv_job *job);
rdzv_client **hoop__rdzv_job_take_members(rdzv_job *job, uint32_t *count);
rdzv_job *hoop__rdzv_job_find(const hoop__rdzv_server *server, const char *id);
rdzv_job *hoop__rdzv_job_create(hoop__rdzv_server *server, const hoop__hello *hello);
int hoop__rdzv_job_add_member(rdzv_job *job, rdzv_client *client);
void hoop__rdzv_job_remove_member(rdzv_job *job, rdzv_client *client);
uint32_t hoop__rdzv_missing_ranks(const rdzv_job *job, int32_t *out, uint32_t max);

/* ---- health.c: the members' STATS, the job's VIEW and its health in a status ------------------
 */
void hoop__rdzv_member_stats(rdzv_client *client, const hoop__stats_msg *msg);
/* The job's health as a status gives it (zeros for a job still waiting). */
void hoop__rdzv_job_health(rdzv_job *job, hoop__job_health *out);
void hoop__rdzv_report_free(rdzv_client *client);
/* A new generation: the job's view and health are made again from the members' next STATS. */
void hoop__rdzv_health_forget(rdzv_job *job);
/* A member's last STATS (it has sent one: client->report set). */
void hoop__rdzv_report_last(const rdzv_client *client, hoop__stats_msg *out);

/* ---- dump.c: hoopd --dump, the members' flight recorders ------------------------------------ */
void hoop__rdzv_dump_request(rdzv_client *client, const hoop__dump_req *req);
void hoop__rdzv_member_flight(rdzv_client *member, const char *text);
void hoop__rdzv_dump_forget_job(rdzv_job *job);
void hoop__rdzv_dump_forget_requester(rdzv_client *client);

/* ---- table.c: a job's rank table, and its members while it runs ------------------------------ */
void hoop__rdzv_job_member_left(rdzv_job *job, rdzv_client *client);
void hoop__rdzv_handle_member_input(rdzv_client *client);
void hoop__rdzv_job_complete(rdzv_job *job);

/* Used by shrink.c too. */
int hoop__rdzv_assign_local_ranks(member_slot **pointers, uint32_t n);
void hoop__rdzv_send_table(rdzv_client *client, shared_table *shared, uint32_t rank);
/* Close a member that broke the protocol (its connection closing reads as a loss). */
void hoop__rdzv_member_refuse(rdzv_client *client, const char *what);

/* ---- shrink.c: the next generation of a running job's survivors ------------------------------ */
/* A member's SHRINK (decoded; rank and generation not yet checked). */
void hoop__rdzv_shrink_request(rdzv_client *client, const hoop__shrink_msg *msg);
/* A member left a running job that is gathering its next generation: look again. */
void hoop__rdzv_shrink_member_left(rdzv_job *job);
/* A HELLO with HOOP__HELLO_NEWCOMER (its proof checked): wait for the running job's next
 * generation. */
void hoop__rdzv_newcomer_hello(rdzv_client *client, const hoop__hello *hello);
/* A waiting newcomer's connection closes, or its job is forgotten (the newcomer is told). */
void hoop__rdzv_newcomer_left(rdzv_client *client);
void hoop__rdzv_newcomers_drop(rdzv_job *job);

/* ---- conn.c: clients' connections and the replies sent on them ------------------------------- */
void hoop__rdzv_shared_table_release(shared_table *shared);
void hoop__rdzv_reply_free(rdzv_reply *reply);
void hoop__rdzv_on_written(uv_write_t *req, int status);
void hoop__rdzv_client_send(rdzv_client *client, rdzv_reply *reply);
void hoop__rdzv_send_error(rdzv_client *client, hoop_result code, const char *fmt, ...)
    HOOP__PRINTF(3, 4);
void hoop__rdzv_client_close(rdzv_client *client);
void hoop__rdzv_keep_alive(rdzv_client *client, int seconds);
void hoop__rdzv_on_connection(uv_stream_t *listener, int status);
void hoop__rdzv_on_client_timer(uv_timer_t *timer);

/* ---- hello.c: a client's HELLO or STATUS_REQ, and its proof ------------------------------- */
void hoop__rdzv_refuse_malformed(rdzv_client *client, const char *what);
void hoop__rdzv_handle_input(rdzv_client *client);

/* ---- server.c: the listener, the server's start and end -------------------------------------- */
void hoop__rdzv_check_once_done(hoop__rdzv_server *server);
void hoop__rdzv_server_free(hoop__rdzv_server *server);

#endif /* HOOP__RDZV_SERVER_IMPL_H */
