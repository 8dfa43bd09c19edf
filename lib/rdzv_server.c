/* rdzv_server.c - the rendezvous server on libuv (see rdzv_server.h). The server opens each
 * connection with a CHALLENGE; the connection then carries one request: a HELLO, answered by the
 * job's TABLE or an ERROR once the job completes or fails, or a STATUS_REQ, answered at once. With
 * a token, a request without the right proof is refused with HOOP_ERR_AUTH and changes nothing.
 *
 * A STATUS_REQ's or a failed HELLO's connection is closed after the reply. A member that got its
 * TABLE keeps its connection while its communicator lives: the job stays here, running (no longer
 * waiting, so its id is free for a new job), until every member has left. A member may send ABORT
 * (for its own rank only), relayed to the others as a NOTICE, and says BYE when it finalizes; one
 * whose connection closes without a BYE (or an ABORT) died, and the others are told it was lost.
 * Anything else from a member closes its connection. */
#include "rdzv_server.h"

#include <errno.h>
#include <limits.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include "auth.h"
#include "hoop.h"
#include "log.h"
#include "netaddr.h"
#include "wire.h"

#define DEFAULT_MAX_JOBS 1024
#define DEFAULT_IDLE_TIMEOUT_S 30.0
#define DEFAULT_KEEPALIVE_S 300
#define KEEPALIVE_PROBES 4
#define KEEPALIVE_MAX_S 86400
#define LISTEN_BACKLOG 511
#define MISSING_NAMED 16 /* missing ranks named in a timeout message before "and M more" */

/* An encoded TABLE differs between members only in its first bytes (header, size, rank, nonce),
 * and only in the rank, the u32 at payload offset 4 (see the layouts in wire.c). The server encodes
 * the table once and sends each member its own copy of these first bytes. */
#define TABLE_HEAD (HOOP_WIRE_HEADER_SIZE + 8 + HOOP_WIRE_NONCE)
#define TABLE_RANK_AT (HOOP_WIRE_HEADER_SIZE + 4)

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
  int replying;     /* a reply is on its way; the connection closes once it is written */
  uint32_t rank;    /* a member of a running job: its rank in the table */
  int said_goodbye; /* a member sent BYE or ABORT: its connection closing is no loss */
  int unanswered;   /* its host stopped answering keepalive probes */
  int keepalive_s;  /* how long its host may stop answering before it is dropped */
  int has_table;    /* its TABLE is on its way: NOTICEs may follow it */
  uint8_t challenge[HOOP_WIRE_CHALLENGE]; /* sent first; a request's proof is over it */
  char peer[64];
  size_t inlen;
  uint8_t in[HOOP_WIRE_HEADER_SIZE + HOOP_WIRE_MAX_CLIENT_PAYLOAD];
};

struct rdzv_job {
  uv_timer_t timer; /* the job's deadline, counted from its first HELLO */
  hoop__rdzv_server *server;
  rdzv_job *prev, *next;
  char id[HOOP_WIRE_MAX_JOB + 1];
  uint32_t size;
  uint32_t timeout_ms;
  uint64_t created_ms;   /* loop time of the first HELLO */
  rdzv_client **members; /* joined, in order of arrival */
  uint32_t joined, capacity;
  uint32_t nrequested; /* members that asked for a rank */
  uint8_t *taken;      /* bitmap of ranks held by members */
  int running;         /* the table went out; members listed are those still connected */
  int forgotten;       /* job_forget ran; freed once its timer has closed */
};

struct hoop__rdzv_server {
  uv_loop_t *loop;
  uv_tcp_t listener;
  int listening;
  int closing;      /* hoop__rdzv_server_close was called */
  int open_handles; /* libuv handles of the server, its clients and jobs not closed yet */
  int port;
  char where[80];
  int max_jobs, max_connections;
  uint64_t idle_ms;
  int keepalive_s;
  int once, once_over, done_called;
  char token[HOOP_MAX_TOKEN + 1]; /* "" when requests need no proof */
  void (*on_done)(void *arg);
  void *arg;
  rdzv_client *clients;
  int nclients;
  rdzv_job *jobs, *jobs_tail; /* in order of creation, for the status reply; running ones too */
  int njobs;                  /* waiting, not running */
  int nrunning;
  int pending_writes;
};

/* A reply on its way to one client: a whole message of its own, or the shared TABLE body behind
 * the member's own TABLE_HEAD bytes. */
typedef struct shared_table {
  hoop__wbuf wire;
  uint32_t refs;
} shared_table;

typedef struct rdzv_reply {
  uv_write_t req;
  rdzv_client *client;
  int keep_open; /* the CHALLENGE, a member's TABLE or a NOTICE: the connection stays open */
  hoop__wbuf message;
  shared_table *table;
  uint8_t head[TABLE_HEAD];
} rdzv_reply;

static void client_close(rdzv_client *client);

static void server_free(hoop__rdzv_server *server) {
  hoop__auth_wipe(server->token, sizeof server->token);
  free(server);
}
static void on_client_timer(uv_timer_t *timer);
static void check_once_done(hoop__rdzv_server *server);

/* ---- small helpers --------------------------------------------------------------------------- */

static int bit_test(const uint8_t *bits, uint32_t i) {
  return bits[i / 8] >> (i % 8) & 1;
}

static void bit_set(uint8_t *bits, uint32_t i) {
  bits[i / 8] = (uint8_t)(bits[i / 8] | 1u << (i % 8));
}

static void bit_clear(uint8_t *bits, uint32_t i) {
  bits[i / 8] = (uint8_t)(bits[i / 8] & ~(1u << (i % 8)));
}

/* "300", "2.5", "0.125": milliseconds as seconds without trailing zeros. */
static void format_seconds(uint64_t ms, char *out, size_t outlen) {
  snprintf(out, outlen, "%llu.%03u", (unsigned long long)(ms / 1000), (unsigned)(ms % 1000));
  size_t len = strlen(out);
  while (out[len - 1] == '0')
    out[--len] = '\0';
  if (out[len - 1] == '.')
    out[len - 1] = '\0';
}

/* A message being built in a fixed buffer: appends that do not fit are cut, never overflow. */
typedef struct text {
  char *buf;
  size_t cap, len;
} text;

static void text_add(text *t, const char *fmt, ...) HOOP__PRINTF(2, 3);

static void text_add(text *t, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(t->buf + t->len, t->cap - t->len, fmt, ap);
  va_end(ap);
  if (n > 0)
    t->len = t->len + (size_t)n < t->cap ? t->len + (size_t)n : t->cap - 1;
}

/* ---- grouping members by host ---------------------------------------------------------------- */

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

static int by_host_then_arrival(const void *a, const void *b) {
  const member_slot *x = *(member_slot *const *)a, *y = *(member_slot *const *)b;
  int c = strcmp(x->host, y->host);
  return c ? c : (x->arrival > y->arrival) - (x->arrival < y->arrival);
}

static int by_host_then_rank(const void *a, const void *b) {
  const member_slot *x = *(member_slot *const *)a, *y = *(member_slot *const *)b;
  int c = strcmp(x->host, y->host);
  return c ? c : (x->rank > y->rank) - (x->rank < y->rank);
}

static int by_first_arrival(const void *a, const void *b) {
  const host_group *x = a, *y = b;
  return (x->arrival > y->arrival) - (x->arrival < y->arrival);
}

/* Sort slots (n > 0) with cmp, which orders by host first, and return the runs of one host,
 * ordered by their first arrival; NULL when out of memory. */
static host_group *group_by_host(member_slot **slots, uint32_t n,
                                 int (*cmp)(const void *, const void *), uint32_t *ngroups) {
  host_group *groups = malloc(n * sizeof *groups);
  if (!groups)
    return NULL;
  qsort(slots, n, sizeof *slots, cmp);
  host_group *g = NULL;
  for (uint32_t i = 0; i < n; i++) {
    if (!g || strcmp(slots[i]->host, g->first[0]->host) != 0) {
      g = g ? g + 1 : groups;
      *g = (host_group){&slots[i], 0, slots[i]->arrival};
    }
    g->count++;
    if (slots[i]->arrival < g->arrival)
      g->arrival = slots[i]->arrival;
  }
  *ngroups = (uint32_t)(g - groups) + 1;
  qsort(groups, *ngroups, sizeof *groups, by_first_arrival);
  return groups;
}

/* A slot per member of job, in order of arrival, and an array of pointers to them. */
static member_slot *job_slots(const rdzv_job *job, member_slot ***pointers) {
  member_slot *slots = calloc(job->joined, sizeof *slots);
  *pointers = calloc(job->joined, sizeof **pointers);
  if (!slots || !*pointers) {
    free(slots);
    free(*pointers);
    *pointers = NULL;
    return NULL;
  }
  for (uint32_t i = 0; i < job->joined; i++) {
    const hoop__hello *hello = &job->members[i]->hello;
    slots[i] = (member_slot){hello->host, i, hello->rank, 0, 0};
    (*pointers)[i] = &slots[i];
  }
  return slots;
}

/* ---- jobs ------------------------------------------------------------------------------------ */

static void handle_closed(hoop__rdzv_server *server) {
  if (--server->open_handles == 0 && server->closing)
    server_free(server);
}

static void on_job_closed(uv_handle_t *handle) {
  rdzv_job *job = handle->data;
  hoop__rdzv_server *server = job->server;
  free(job->members);
  free(job->taken);
  free(job);
  handle_closed(server);
}

/* Forget the job; members still listed are detached (the caller deals with their connections). */
static void job_forget(rdzv_job *job) {
  hoop__rdzv_server *server = job->server;
  if (job->forgotten)
    return;
  job->forgotten = 1;
  for (uint32_t i = 0; i < job->joined; i++)
    job->members[i]->job = NULL;
  job->joined = 0;
  if (job->prev)
    job->prev->next = job->next;
  else
    server->jobs = job->next;
  if (job->next)
    job->next->prev = job->prev;
  else
    server->jobs_tail = job->prev;
  if (job->running)
    server->nrunning--;
  else
    server->njobs--;
  uv_close((uv_handle_t *)&job->timer, on_job_closed);
}

/* Take the members out of the job and forget it; the caller owns the returned array. */
static rdzv_client **job_take_members(rdzv_job *job, uint32_t *count) {
  rdzv_client **members = job->members;
  *count = job->joined;
  for (uint32_t i = 0; i < job->joined; i++)
    members[i]->job = NULL;
  job->members = NULL;
  job->joined = 0;
  job_forget(job);
  return members;
}

static rdzv_job *job_find(const hoop__rdzv_server *server, const char *id) {
  for (rdzv_job *job = server->jobs; job; job = job->next)
    if (!job->running && strcmp(job->id, id) == 0)
      return job;
  return NULL;
}

static void on_job_timer(uv_timer_t *timer);

static rdzv_job *job_create(hoop__rdzv_server *server, const hoop__hello *hello) {
  rdzv_job *job = calloc(1, sizeof *job);
  uint8_t *taken = calloc((hello->size + 7) / 8, 1);
  if (!job || !taken || uv_timer_init(server->loop, &job->timer) != 0) {
    free(job);
    free(taken);
    return NULL;
  }
  server->open_handles++;
  job->timer.data = job;
  job->server = server;
  job->taken = taken;
  snprintf(job->id, sizeof job->id, "%s", hello->job);
  job->size = hello->size;
  job->timeout_ms = hello->timeout_ms;
  job->created_ms = uv_now(server->loop);
  job->prev = server->jobs_tail;
  if (server->jobs_tail)
    server->jobs_tail->next = job;
  else
    server->jobs = job;
  server->jobs_tail = job;
  server->njobs++;
  uv_timer_start(&job->timer, on_job_timer, job->timeout_ms, 0);
  char seconds[32];
  format_seconds(job->timeout_ms, seconds, sizeof seconds);
  HOOP_INFO(HOOP_SUBSYS_RDZV, "job '%s' created: %u ranks, timeout %s s", job->id, job->size,
            seconds);
  return job;
}

/* Add a member; -1 when out of memory. The members array grows as ranks arrive, so that a HELLO
 * announcing a huge job costs little until the ranks really come. */
static int job_add_member(rdzv_job *job, rdzv_client *client) {
  if (job->joined == job->capacity) {
    uint32_t capacity = job->capacity ? job->capacity * 2 : 16;
    if (capacity > job->size)
      capacity = job->size;
    rdzv_client **members = realloc(job->members, capacity * sizeof *members);
    if (!members)
      return -1;
    job->members = members;
    job->capacity = capacity;
  }
  job->members[job->joined++] = client;
  client->job = job;
  if (client->hello.rank >= 0) {
    bit_set(job->taken, (uint32_t)client->hello.rank);
    job->nrequested++;
  }
  return 0;
}

/* A member's connection closed before the job completed: it may retry. A job nobody waits for any
 * more is forgotten, so that a restarted job may come back with another size. */
static void job_remove_member(rdzv_job *job, rdzv_client *client) {
  uint32_t i = 0;
  while (i < job->joined && job->members[i] != client)
    i++;
  memmove(&job->members[i], &job->members[i + 1], (job->joined - i - 1) * sizeof *job->members);
  job->joined--;
  client->job = NULL;
  if (client->hello.rank >= 0) {
    bit_clear(job->taken, (uint32_t)client->hello.rank);
    job->nrequested--;
  }
  if (job->server->closing)
    return;
  HOOP_INFO(HOOP_SUBSYS_RDZV,
            "job '%s': a rank on host '%s' (%s) left before the job completed; "
            "%u of %u joined",
            job->id, client->hello.host, client->peer, job->joined, job->size);
  if (job->joined == 0) {
    HOOP_INFO(HOOP_SUBSYS_RDZV, "job '%s' forgotten: no rank waits for it any more", job->id);
    job_forget(job);
  }
}

/* ---- replies --------------------------------------------------------------------------------- */

static void shared_table_release(shared_table *shared) {
  if (--shared->refs == 0) {
    hoop__wbuf_free(&shared->wire);
    free(shared);
  }
}

static void reply_free(rdzv_reply *reply) {
  hoop__wbuf_free(&reply->message);
  if (reply->table)
    shared_table_release(reply->table);
  free(reply);
}

static void on_written(uv_write_t *req, int status) {
  rdzv_reply *reply = (rdzv_reply *)req; /* req is its first member */
  rdzv_client *client = reply->client;
  hoop__rdzv_server *server = client->server;
  if (status == UV_ETIMEDOUT)
    client->unanswered = 1;
  if (status < 0 && status != UV_ECANCELED && status != UV_ETIMEDOUT)
    HOOP_WARN(HOOP_SUBSYS_RDZV, "reply to %s failed: %s", client->peer, uv_strerror(status));
  int keep_open = reply->keep_open && status == 0;
  reply_free(reply);
  server->pending_writes--;
  if (!keep_open)
    client_close(client);
  check_once_done(server);
}

/* Open the connection with a CHALLENGE: a fresh nonce, and whether requests must prove the token.
 * -1 if it could not be sent (the client is closed then). */
static int send_challenge(rdzv_client *client) {
  hoop__rdzv_server *server = client->server;
  hoop__challenge challenge = {.flags = server->token[0] ? HOOP_CHALLENGE_AUTH : 0};
  rdzv_reply *reply = calloc(1, sizeof *reply);
  if (!reply || hoop__auth_random(challenge.nonce, sizeof challenge.nonce) != 0 ||
      hoop__wire_encode_challenge(&reply->message, &challenge) != 0) {
    HOOP_WARN(HOOP_SUBSYS_RDZV, "cannot greet %s: out of memory or randomness", client->peer);
  } else {
    memcpy(client->challenge, challenge.nonce, sizeof client->challenge);
    reply->client = client;
    reply->keep_open = 1;
    uv_buf_t buf = uv_buf_init((char *)reply->message.data, (unsigned)reply->message.len);
    int rc = uv_write(&reply->req, (uv_stream_t *)&client->tcp, &buf, 1, on_written);
    if (rc == 0) {
      server->pending_writes++;
      return 0;
    }
    HOOP_WARN(HOOP_SUBSYS_RDZV, "cannot greet %s: %s", client->peer, uv_strerror(rc));
  }
  if (reply)
    reply_free(reply);
  client_close(client);
  return -1;
}

/* Send reply (owned from here on) and close the connection once it is written (unless the reply
 * keeps it open: a member's TABLE). Until then the client's timer bounds how long a client that
 * does not read may hold the reply. */
static void client_send(rdzv_client *client, rdzv_reply *reply) {
  uv_buf_t bufs[2];
  unsigned nbufs = 1;
  reply->client = client;
  if (reply->table) {
    bufs[0] = uv_buf_init((char *)reply->head, TABLE_HEAD);
    bufs[1] = uv_buf_init((char *)reply->table->wire.data + TABLE_HEAD,
                          (unsigned)(reply->table->wire.len - TABLE_HEAD));
    nbufs = 2;
  } else {
    bufs[0] = uv_buf_init((char *)reply->message.data, (unsigned)reply->message.len);
  }
  if (!reply->keep_open) {
    client->replying = 1;
    uv_read_stop((uv_stream_t *)&client->tcp);
    uv_timer_start(&client->timer, on_client_timer, client->server->idle_ms, 0);
  }
  int rc = uv_write(&reply->req, (uv_stream_t *)&client->tcp, bufs, nbufs, on_written);
  if (rc != 0) {
    HOOP_WARN(HOOP_SUBSYS_RDZV, "reply to %s: %s", client->peer, uv_strerror(rc));
    reply_free(reply);
    client_close(client);
    return;
  }
  client->server->pending_writes++;
}

static void send_error(rdzv_client *client, hoop_result code, const char *fmt, ...)
    HOOP__PRINTF(3, 4);

/* Reply ERROR {code, message} and close; out of memory, just close. */
static void send_error(rdzv_client *client, hoop_result code, const char *fmt, ...) {
  hoop__error_msg error;
  error.code = (uint32_t)code;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(error.message, sizeof error.message, fmt, ap);
  va_end(ap);
  rdzv_reply *reply = calloc(1, sizeof *reply);
  if (!reply || hoop__wire_encode_error(&reply->message, &error) != 0) {
    HOOP_WARN(HOOP_SUBSYS_RDZV, "out of memory replying to %s", client->peer);
    if (reply)
      reply_free(reply);
    client_close(client);
    return;
  }
  client_send(client, reply);
}

/* ---- a job's end: timeout -------------------------------------------------------------------- */

/* The ranks no member holds, when every member asked for one (otherwise which ranks are missing
 * is not known yet); at most max of them. */
static uint32_t missing_ranks(const rdzv_job *job, int32_t *out, uint32_t max) {
  uint32_t n = 0;
  if (job->nrequested != job->joined)
    return 0;
  for (uint32_t r = 0; r < job->size && n < max; r++)
    if (!bit_test(job->taken, r))
      out[n++] = (int32_t)r;
  return n;
}

static void describe_missing(const rdzv_job *job, text *t) {
  int32_t missing[MISSING_NAMED];
  uint32_t total = job->size - job->joined;
  uint32_t named = missing_ranks(job, missing, MISSING_NAMED);
  text_add(t, "; missing ranks: ");
  for (uint32_t i = 0; i < named; i++)
    text_add(t, "%s%d", i ? ", " : "", missing[i]);
  if (total > named)
    text_add(t, " and %u more", total - named);
}

/* "...; 3 ranks never joined; joined: node-a (2 ranks), node-b (1 rank)": the hosts that did join,
 * as many as fit in the message. */
static void describe_hosts(const rdzv_job *job, text *t) {
  text_add(t, "; %u ranks never joined", job->size - job->joined);
  member_slot **pointers;
  member_slot *slots = job_slots(job, &pointers);
  uint32_t ngroups = 0;
  host_group *groups =
      slots ? group_by_host(pointers, job->joined, by_host_then_arrival, &ngroups) : NULL;
  for (uint32_t g = 0; groups && g < ngroups; g++) {
    const char *host = groups[g].first[0]->host;
    /* Keep room for this host and for a closing "and N more hosts". */
    if (t->cap - t->len < strlen(host) + 64) {
      text_add(t, " and %u more hosts", ngroups - g);
      break;
    }
    text_add(t, "%s%s (%u rank%s)", g ? ", " : "; joined: ", host, groups[g].count,
             groups[g].count == 1 ? "" : "s");
  }
  free(groups);
  free(pointers);
  free(slots);
}

static void on_job_timer(uv_timer_t *timer) {
  rdzv_job *job = timer->data;
  hoop__rdzv_server *server = job->server;
  char message[HOOP_WIRE_MAX_MESSAGE + 1], seconds[32];
  text t = {message, sizeof message, 0};
  format_seconds(job->timeout_ms, seconds, sizeof seconds);
  text_add(&t, "rendezvous for job '%s' timed out after %s s: %u of %u ranks joined", job->id,
           seconds, job->joined, job->size);
  if (job->nrequested == job->joined)
    describe_missing(job, &t);
  else
    describe_hosts(job, &t);
  HOOP_INFO(HOOP_SUBSYS_RDZV, "%s", message);
  uint32_t count;
  rdzv_client **members = job_take_members(job, &count);
  for (uint32_t i = 0; i < count; i++)
    send_error(members[i], HOOP_ERR_TIMEOUT, "%s", message);
  free(members);
  if (server->once)
    server->once_over = 1;
  check_once_done(server);
}

/* ---- a job's end: the rank table ------------------------------------------------------------- */

/* Members that asked for a rank keep it. The others take the free numbers host by host, hosts in
 * order of first arrival, so that the ranks of one host are contiguous when nobody asked. */
static int assign_ranks(rdzv_job *job, member_slot *slots) {
  uint32_t nfree = job->joined - job->nrequested, n = 0, next = 0, ngroups;
  if (nfree == 0)
    return 0;
  member_slot **unrequested = malloc(nfree * sizeof *unrequested);
  if (!unrequested)
    return -1;
  for (uint32_t i = 0; i < job->joined; i++)
    if (slots[i].rank < 0)
      unrequested[n++] = &slots[i];
  host_group *groups = group_by_host(unrequested, nfree, by_host_then_arrival, &ngroups);
  for (uint32_t g = 0; groups && g < ngroups; g++) {
    for (uint32_t i = 0; i < groups[g].count; i++) {
      while (bit_test(job->taken, next))
        next++;
      bit_set(job->taken, next);
      groups[g].first[i]->rank = (int32_t)next;
    }
  }
  free(unrequested);
  int rc = groups ? 0 : -1;
  free(groups);
  return rc;
}

/* local_rank: position among the members on the same host, by rank; local_size: their count. */
static int assign_local_ranks(member_slot **pointers, uint32_t n) {
  uint32_t ngroups;
  host_group *groups = group_by_host(pointers, n, by_host_then_rank, &ngroups);
  if (!groups)
    return -1;
  for (uint32_t g = 0; g < ngroups; g++) {
    for (uint32_t i = 0; i < groups[g].count; i++) {
      groups[g].first[i]->local_rank = i;
      groups[g].first[i]->local_size = groups[g].count;
    }
  }
  free(groups);
  return 0;
}

/* Encode the job's table (with rank 0) into a shared buffer; NULL on failure. Fills ranks[i] with
 * the rank of member i. */
static shared_table *build_table(rdzv_job *job, uint32_t *ranks) {
  member_slot **pointers;
  member_slot *slots = job_slots(job, &pointers);
  hoop__table table = {.size = job->size, .rank = 0};
  shared_table *shared = calloc(1, sizeof *shared);
  table.peers = calloc(job->size, sizeof *table.peers);
  int ok = slots && shared && table.peers && assign_ranks(job, slots) == 0 &&
           assign_local_ranks(pointers, job->joined) == 0 &&
           uv_random(NULL, NULL, table.nonce, sizeof table.nonce, 0, NULL) == 0;
  for (uint32_t i = 0; ok && i < job->joined; i++) {
    hoop__peer_entry *peer = &table.peers[slots[i].rank];
    snprintf(peer->host, sizeof peer->host, "%s", job->members[i]->hello.host);
    snprintf(peer->addr, sizeof peer->addr, "%s", job->members[i]->hello.addr);
    peer->local_rank = slots[i].local_rank;
    peer->local_size = slots[i].local_size;
    ranks[i] = (uint32_t)slots[i].rank;
  }
  if (ok && hoop__wire_encode_table(&shared->wire, &table) != 0)
    ok = 0;
  free(table.peers);
  free(pointers);
  free(slots);
  if (!ok && shared) {
    hoop__wbuf_free(&shared->wire);
    free(shared);
  }
  return ok ? shared : NULL;
}

static void send_table(rdzv_client *client, shared_table *shared, uint32_t rank) {
  rdzv_reply *reply = calloc(1, sizeof *reply);
  if (!reply) {
    HOOP_WARN(HOOP_SUBSYS_RDZV, "out of memory sending the table to %s", client->peer);
    client_close(client);
    return;
  }
  memcpy(reply->head, shared->wire.data, TABLE_HEAD);
  for (int i = 0; i < 4; i++)
    reply->head[TABLE_RANK_AT + i] = (uint8_t)(rank >> (8 * i));
  reply->table = shared;
  reply->keep_open = 1;
  shared->refs++;
  client->rank = rank;
  client->has_table = 1;
  client_send(client, reply);
}

/* ---- a running job: its members' connections ------------------------------------------------ */

/* The table is going out: the job no longer waits (nor times out), and its id is free for a new
 * job; it stays listed while any member is connected. */
static void job_start_running(rdzv_job *job) {
  hoop__rdzv_server *server = job->server;
  uv_timer_stop(&job->timer);
  job->running = 1;
  server->njobs--;
  server->nrunning++;
}

/* Send a NOTICE to every member of job but from that has its table and has not said goodbye. A
 * member whose write fails at once is closed after the others have theirs. */
static void job_relay(rdzv_job *job, const rdzv_client *from, hoop_result code, uint32_t origin,
                      const char *message) {
  hoop__notice notice = {.code = (uint32_t)code, .origin = origin};
  snprintf(notice.message, sizeof notice.message, "%s", message);
  rdzv_client **failed = calloc(job->joined ? job->joined : 1, sizeof *failed);
  uint32_t nfailed = 0, told = 0;
  for (uint32_t i = 0; i < job->joined; i++) {
    rdzv_client *member = job->members[i];
    if (member == from || member->said_goodbye || !member->has_table || member->closing)
      continue;
    rdzv_reply *reply = calloc(1, sizeof *reply);
    const char *why = "out of memory";
    if (reply && hoop__wire_encode_notice(&reply->message, &notice) == 0) {
      reply->client = member;
      reply->keep_open = 1;
      uv_buf_t buf = uv_buf_init((char *)reply->message.data, (unsigned)reply->message.len);
      int rc = uv_write(&reply->req, (uv_stream_t *)&member->tcp, &buf, 1, on_written);
      if (rc == 0) {
        job->server->pending_writes++;
        told++;
        continue;
      }
      why = uv_strerror(rc);
    }
    HOOP_WARN(HOOP_SUBSYS_RDZV, "job '%s': cannot tell rank %u (%s): %s", job->id, member->rank,
              member->peer, why);
    if (reply)
      reply_free(reply);
    if (failed)
      failed[nfailed++] = member;
  }
  HOOP_INFO(HOOP_SUBSYS_RDZV, "job '%s': told %u members: %s", job->id, told, message);
  for (uint32_t i = 0; i < nfailed; i++)
    client_close(failed[i]);
  free(failed);
}

/* A member of a running job closed its connection (or was closed). Without a goodbye its
 * process is gone, or broken: the others are told. The last one to leave ends the job. */
static void job_member_left(rdzv_job *job, rdzv_client *client) {
  hoop__rdzv_server *server = job->server;
  uint32_t i = 0;
  while (i < job->joined && job->members[i] != client)
    i++;
  job->members[i] = job->members[--job->joined];
  client->job = NULL;
  if (server->closing)
    return;
  if (!client->said_goodbye) {
    char message[128];
    if (client->unanswered) {
      snprintf(message, sizeof message, "rank %u lost (its host stopped answering for %d s)",
               client->rank, client->keepalive_s);
      HOOP_WARN(HOOP_SUBSYS_RDZV, "job '%s': rank %u (%s) stopped answering for %d s", job->id,
                client->rank, client->peer, client->keepalive_s);
    } else {
      snprintf(message, sizeof message, "rank %u lost (rendezvous connection closed)",
               client->rank);
      HOOP_WARN(HOOP_SUBSYS_RDZV, "job '%s': rank %u (%s) closed its connection without a BYE",
                job->id, client->rank, client->peer);
    }
    job_relay(job, client, HOOP_ERR_PEER_LOST, client->rank, message);
  } else {
    HOOP_TRACE(HOOP_SUBSYS_RDZV, "job '%s': rank %u left; %u still connected", job->id,
               client->rank, job->joined);
  }
  if (job->joined == 0 && !job->forgotten) {
    HOOP_INFO(HOOP_SUBSYS_RDZV, "job '%s' is over: every rank has left", job->id);
    job_forget(job);
    check_once_done(server);
  }
}

/* A member's connection carries nothing but an ABORT for its own rank and a BYE. Anything else
 * (or anything after the BYE) closes it; with no goodbye said, that reads as a loss to the others:
 * a member that breaks the protocol is broken. */
static void member_refuse(rdzv_client *client, const char *what) {
  HOOP_WARN(HOOP_SUBSYS_RDZV, "closing rank %u of job '%s' (%s): %s", client->rank, client->job->id,
            client->peer, what);
  client_close(client);
}

static void member_message(rdzv_client *client, const hoop__wire_header *header,
                           const uint8_t *payload) {
  hoop__abort_msg abort_msg;
  if (client->said_goodbye) {
    member_refuse(client, "a message after its BYE or ABORT");
  } else if (header->type == HOOP_MSG_BYE) {
    if (hoop__wire_decode_bye(payload, header->length) != 0) {
      member_refuse(client, "a malformed BYE");
      return;
    }
    client->said_goodbye = 1;
  } else if (header->type == HOOP_MSG_ABORT) {
    if (hoop__wire_decode_abort(payload, header->length, &abort_msg) != 0) {
      member_refuse(client, "a malformed ABORT");
      return;
    }
    if (abort_msg.rank != client->rank) {
      char what[96];
      snprintf(what, sizeof what, "an ABORT in the name of rank %u, not its own", abort_msg.rank);
      member_refuse(client, what);
      return;
    }
    client->said_goodbye = 1;
    char message[HOOP_WIRE_MAX_MESSAGE + 1];
    text t = {message, sizeof message, 0};
    text_add(&t, "aborted by rank %u: %s", client->rank, abort_msg.reason);
    job_relay(client->job, client, HOOP_ERR_ABORTED, client->rank, message);
  } else {
    member_refuse(client, "a message type that members do not send");
  }
}

/* Act on every whole message read so far from a member of a running job. */
static void handle_member_input(rdzv_client *client) {
  while (!client->closing) {
    hoop__wire_header header;
    int rc =
        hoop__wire_decode_header(client->in, client->inlen, HOOP_WIRE_MAX_CLIENT_PAYLOAD, &header);
    if (rc == 1)
      return;
    if (rc < 0) {
      member_refuse(client, "a malformed header");
      return;
    }
    size_t total = HOOP_WIRE_HEADER_SIZE + header.length;
    if (client->inlen < total)
      return;
    member_message(client, &header, client->in + HOOP_WIRE_HEADER_SIZE);
    memmove(client->in, client->in + total, client->inlen - total);
    client->inlen -= total;
  }
}

static void job_complete(rdzv_job *job) {
  hoop__rdzv_server *server = job->server;
  char seconds[32], id[sizeof job->id];
  uint32_t *ranks = calloc(job->size, sizeof *ranks);
  shared_table *shared = ranks ? build_table(job, ranks) : NULL;
  format_seconds(uv_now(server->loop) - job->created_ms, seconds, sizeof seconds);
  snprintf(id, sizeof id, "%s", job->id);
  uint32_t count;
  rdzv_client **members = NULL;
  if (shared) {
    HOOP_INFO(HOOP_SUBSYS_RDZV, "job '%s' complete: %u ranks after %s s", id, job->joined, seconds);
    job_start_running(job);
    /* Each send may fail at once and close its member, which then leaves the job's list: send
     * from a copy. Hold a reference while sending, so that such a failure cannot free the table
     * before the other members have theirs. */
    count = job->joined;
    members = malloc(count * sizeof *members);
    shared->refs = 1;
    if (members) {
      memcpy(members, job->members, count * sizeof *members);
      for (uint32_t i = 0; i < count; i++)
        members[i]->rank = ranks[i];
      for (uint32_t i = 0; i < count; i++)
        send_table(members[i], shared, members[i]->rank);
    } else {
      HOOP_ERROR(HOOP_SUBSYS_RDZV, "job '%s': out of memory sending the table", id);
      while (job->joined > 0 && !server->closing)
        client_close(job->members[0]);
    }
    shared_table_release(shared);
  } else {
    members = job_take_members(job, &count);
    HOOP_ERROR(HOOP_SUBSYS_RDZV, "job '%s': cannot build the rank table", id);
    for (uint32_t i = 0; i < count; i++)
      send_error(members[i], HOOP_ERR_SYSTEM,
                 "rendezvous server: cannot build the rank table of job '%s' "
                 "(out of memory or randomness)",
                 id);
  }
  free(members);
  free(ranks);
  if (server->once)
    server->once_over = 1;
  check_once_done(server);
}

/* ---- requests -------------------------------------------------------------------------------- */

/* The job a HELLO joins, found or created; NULL when the newcomer is refused (its ERROR is on the
 * way). Every check is on the newcomer: its size must be the job's, a requested rank must be free.
 * The decoder already made sure that a requested rank is below the HELLO's own size. */
static rdzv_job *job_for_hello(rdzv_client *client, const hoop__hello *hello) {
  hoop__rdzv_server *server = client->server;
  rdzv_job *job = job_find(server, hello->job);
  if (!job && server->njobs >= server->max_jobs) {
    HOOP_INFO(HOOP_SUBSYS_RDZV, "refused %s: job '%s' would exceed the limit of %d jobs",
              client->peer, hello->job, server->max_jobs);
    send_error(client, HOOP_ERR_SYSTEM,
               "the rendezvous server already has %d jobs waiting (its limit); "
               "job '%s' refused",
               server->max_jobs, hello->job);
    return NULL;
  }
  if (!job && !(job = job_create(server, hello))) {
    send_error(client, HOOP_ERR_SYSTEM, "rendezvous server: out of memory creating job '%s'",
               hello->job);
    return NULL;
  }
  if (hello->size != job->size) {
    HOOP_INFO(HOOP_SUBSYS_RDZV, "refused %s: job '%s' has %u ranks, the HELLO says %u",
              client->peer, job->id, job->size, hello->size);
    send_error(client, HOOP_ERR_INVALID_ARG,
               "job '%s' has %u ranks, but this rank says it has %u "
               "(is the job size the same on every rank?)",
               job->id, job->size, hello->size);
    return NULL;
  }
  if (hello->rank >= 0 && bit_test(job->taken, (uint32_t)hello->rank)) {
    HOOP_INFO(HOOP_SUBSYS_RDZV, "refused %s: rank %d of job '%s' is already taken", client->peer,
              hello->rank, job->id);
    send_error(client, HOOP_ERR_INVALID_ARG,
               "rank %d of job '%s' is already taken by another rank "
               "(are two ranks started with the same rank number?)",
               hello->rank, job->id);
    return NULL;
  }
  return job;
}

/* With a token: 1 if proof (len bytes) is the one for purpose over this connection's challenge
 * (and, for a HELLO, over its fields); else the refusal is logged, its ERROR sent, and 0. */
static int proof_ok(rdzv_client *client, const hoop__hello *hello, const uint8_t *proof,
                    size_t len) {
  hoop__rdzv_server *server = client->server;
  if (!server->token[0])
    return 1;
  uint8_t expected[HOOP_AUTH_PROOF];
  if (hello) {
    if (hoop__auth_hello_proof(server->token, client->challenge, hello, expected) != 0) {
      send_error(client, HOOP_ERR_SYSTEM, "rendezvous server: out of memory");
      return 0;
    }
  } else {
    hoop__auth_proof(server->token, strlen(server->token), HOOP_AUTH_STATUS, client->challenge,
                     sizeof client->challenge, NULL, 0, expected);
  }
  if (len == HOOP_AUTH_PROOF && hoop__auth_equal(proof, expected, HOOP_AUTH_PROOF))
    return 1;
  char what[HOOP_WIRE_MAX_JOB + HOOP_WIRE_MAX_HOST + 64] = "a status query";
  if (hello)
    snprintf(what, sizeof what, "a rank of job '%s' on host '%s'", hello->job, hello->host);
  HOOP_WARN(HOOP_SUBSYS_RDZV, "refused %s from %s: %s", what, client->peer,
            len ? "wrong token" : "no token");
  send_error(client, HOOP_ERR_AUTH,
             "authentication failed: %s; the server admits only holders of its token "
             "(HOOP_TOKEN or HOOP_TOKEN_FILE)",
             len ? "the proof does not match this server's token" : "no proof of a token was sent");
  return 0;
}

static void keep_alive(rdzv_client *client, int seconds);

static void handle_hello(rdzv_client *client, const hoop__hello *hello) {
  if (!proof_ok(client, hello, hello->proof, hello->proof_len))
    return;
  rdzv_job *job = job_for_hello(client, hello);
  if (!job)
    return;
  client->hello = *hello;
  if (job_add_member(job, client) != 0) {
    send_error(client, HOOP_ERR_SYSTEM, "rendezvous server: out of memory joining job '%s'",
               job->id);
    if (job->joined == 0)
      job_forget(job);
    return;
  }
  uv_timer_stop(&client->timer); /* a member waits for its job, however long that takes */
  /* Never drop a member sooner than it would give up on its peers itself. */
  uint32_t own_s = hello->timeout_ms / 1000 + (hello->timeout_ms % 1000 != 0);
  if (own_s > (uint32_t)client->keepalive_s)
    keep_alive(client, own_s > KEEPALIVE_MAX_S ? KEEPALIVE_MAX_S : (int)own_s);
  char who[32] = "a rank";
  if (hello->rank >= 0)
    snprintf(who, sizeof who, "rank %d", hello->rank);
  HOOP_INFO(HOOP_SUBSYS_RDZV, "job '%s': %s joined (%u/%u) from host '%s' (%s)", job->id, who,
            job->joined, job->size, hello->host, client->peer);
  if (job->joined == job->size)
    job_complete(job);
}

/* The hosts that joined, in order of first arrival, with their ranks (as many as a status
 * lists; none when out of memory). */
static void status_hosts(const rdzv_job *job, hoop__job_status *out) {
  member_slot **pointers;
  member_slot *slots = job->joined ? job_slots(job, &pointers) : NULL;
  uint32_t ngroups = 0;
  host_group *groups =
      slots ? group_by_host(pointers, job->joined, by_host_then_arrival, &ngroups) : NULL;
  for (uint32_t g = 0; groups && g < ngroups && g < HOOP_WIRE_MAX_STATUS_HOSTS; g++) {
    snprintf(out->hosts[g].name, sizeof out->hosts[g].name, "%s", groups[g].first[0]->host);
    out->hosts[g].ranks = groups[g].count;
    out->nhosts = g + 1;
  }
  free(groups);
  if (slots) {
    free(pointers);
    free(slots);
  }
}

static void fill_job_status(const rdzv_job *job, uint64_t now, hoop__job_status *out) {
  uint64_t waited = now - job->created_ms;
  snprintf(out->job, sizeof out->job, "%s", job->id);
  out->size = job->size;
  out->joined = job->joined;
  out->waited_ms = waited > UINT32_MAX ? UINT32_MAX : (uint32_t)waited;
  out->nmissing = missing_ranks(job, out->missing, HOOP_WIRE_MAX_MISSING);
  status_hosts(job, out);
}

/* Reply with the jobs waiting, oldest first (as many as a STATUS holds). */
static void send_status(rdzv_client *client) {
  hoop__rdzv_server *server = client->server;
  hoop__status status = {0};
  uint32_t listed = server->njobs < HOOP_WIRE_MAX_STATUS_JOBS ? (uint32_t)server->njobs
                                                              : HOOP_WIRE_MAX_STATUS_JOBS;
  rdzv_reply *reply = calloc(1, sizeof *reply);
  status.jobs = calloc(listed ? listed : 1, sizeof *status.jobs);
  uint64_t now = uv_now(server->loop);
  for (rdzv_job *job = server->jobs; job && status.jobs && status.njobs < listed; job = job->next)
    if (!job->running)
      fill_job_status(job, now, &status.jobs[status.njobs++]);
  int rc = reply && status.jobs ? hoop__wire_encode_status(&reply->message, &status) : -1;
  hoop__status_free(&status);
  if (rc != 0) {
    HOOP_WARN(HOOP_SUBSYS_RDZV, "out of memory answering the status query of %s", client->peer);
    if (reply)
      reply_free(reply);
    client_close(client);
    return;
  }
  HOOP_INFO(HOOP_SUBSYS_RDZV, "status query from %s: %d jobs waiting", client->peer, server->njobs);
  client_send(client, reply);
}

/* A malformed request closes its own connection and nothing else. */
static void refuse_malformed(rdzv_client *client, const char *what) {
  HOOP_WARN(HOOP_SUBSYS_RDZV, "closing %s: %s", client->peer, what);
  client_close(client);
}

/* Act on the bytes read so far once they hold the one request a connection may carry. */
static void handle_input(rdzv_client *client) {
  hoop__wire_header header;
  int rc =
      hoop__wire_decode_header(client->in, client->inlen, HOOP_WIRE_MAX_CLIENT_PAYLOAD, &header);
  if (rc == 1)
    return;
  if (rc < 0) {
    HOOP_WARN(HOOP_SUBSYS_RDZV,
              "closing %s: malformed header "
              "(magic 0x%08x, version %u, type %u, length %u)",
              client->peer, header.magic, header.version, header.type, header.length);
    client_close(client);
    return;
  }
  size_t total = HOOP_WIRE_HEADER_SIZE + header.length;
  if (client->inlen < total)
    return;
  if (client->inlen > total) {
    refuse_malformed(client, "bytes past its request (one request per connection)");
    return;
  }
  const uint8_t *payload = client->in + HOOP_WIRE_HEADER_SIZE;
  client->inlen = 0;
  hoop__hello hello;
  hoop__status_req request;
  if (header.type == HOOP_MSG_HELLO) {
    if (hoop__wire_decode_hello(payload, header.length, &hello) != 0)
      refuse_malformed(client, "malformed HELLO");
    else
      handle_hello(client, &hello);
  } else if (header.type == HOOP_MSG_STATUS_REQ) {
    if (hoop__wire_decode_status_req(payload, header.length, &request) != 0)
      refuse_malformed(client, "malformed STATUS_REQ");
    else if (proof_ok(client, NULL, request.proof, request.proof_len))
      send_status(client);
  } else {
    refuse_malformed(client, "a message type that clients do not send");
  }
}

/* ---- connections ----------------------------------------------------------------------------- */

static void on_client_closed(uv_handle_t *handle) {
  rdzv_client *client = handle->data;
  hoop__rdzv_server *server = client->server;
  if (--client->open_handles == 0)
    free(client);
  handle_closed(server);
}

static void client_close(rdzv_client *client) {
  if (client->closing)
    return;
  client->closing = 1;
  hoop__rdzv_server *server = client->server;
  HOOP_TRACE(HOOP_SUBSYS_RDZV, "closing the connection from %s", client->peer);
  if (client->job && client->job->running)
    job_member_left(client->job, client);
  else if (client->job)
    job_remove_member(client->job, client);
  if (client->prev)
    client->prev->next = client->next;
  else
    server->clients = client->next;
  if (client->next)
    client->next->prev = client->prev;
  server->nclients--;
  uv_close((uv_handle_t *)&client->tcp, on_client_closed);
  uv_close((uv_handle_t *)&client->timer, on_client_closed);
}

static void on_client_timer(uv_timer_t *timer) {
  rdzv_client *client = timer->data;
  char seconds[32];
  format_seconds(client->server->idle_ms, seconds, sizeof seconds);
  if (client->replying)
    HOOP_INFO(HOOP_SUBSYS_RDZV, "closing %s: its reply was not taken within %s s", client->peer,
              seconds);
  else
    HOOP_INFO(HOOP_SUBSYS_RDZV, "closing %s: no complete request within %s s", client->peer,
              seconds);
  client_close(client);
}

static void on_alloc(uv_handle_t *handle, size_t suggested, uv_buf_t *buf) {
  rdzv_client *client = handle->data;
  (void)suggested;
  *buf = uv_buf_init((char *)client->in + client->inlen,
                     (unsigned)(sizeof client->in - client->inlen));
}

static void on_read(uv_stream_t *stream, ssize_t nread, const uv_buf_t *buf) {
  rdzv_client *client = stream->data;
  (void)buf;
  if (nread == 0)
    return;
  if (nread < 0) {
    if (nread == UV_ETIMEDOUT)
      client->unanswered = 1;
    if (nread != UV_EOF && nread != UV_ETIMEDOUT)
      HOOP_WARN(HOOP_SUBSYS_RDZV, "reading from %s: %s", client->peer, uv_strerror((int)nread));
    client_close(client); /* a member leaves its job here */
    return;
  }
  if (client->job && !client->job->running) {
    refuse_malformed(client, "bytes after its HELLO");
    return;
  }
  client->inlen += (size_t)nread;
  if (client->job)
    handle_member_input(client);
  else
    handle_input(client);
}

/* A member's connection is quiet while its job runs, and a host that vanishes (power lost, link
 * down) sends no FIN or RST: probe the connection once it has been idle, so that such a client is
 * dropped after about `seconds` (idle, then KEEPALIVE_PROBES unanswered probes, or as long with
 * a reply unacknowledged) instead of held for ever. */
static void keep_alive(rdzv_client *client, int seconds) {
  int one = 1, probes = KEEPALIVE_PROBES;
  int every = seconds / (KEEPALIVE_PROBES + 1) > 0 ? seconds / (KEEPALIVE_PROBES + 1) : 1;
  unsigned user_timeout_ms = (unsigned)seconds * 1000u;
  uv_os_fd_t fd;
  if (uv_fileno((uv_handle_t *)&client->tcp, &fd) != 0)
    return; /* not open: nothing to probe */
  client->keepalive_s = seconds;
  if (setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one) != 0 ||
      setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &every, sizeof every) != 0 ||
      setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &every, sizeof every) != 0 ||
      setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &probes, sizeof probes) != 0 ||
      setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_timeout_ms, sizeof user_timeout_ms) != 0)
    HOOP_WARN(HOOP_SUBSYS_RDZV, "keepalive for %s: %s", client->peer, strerror(errno));
}

/* Set up a client for the connection waiting on the listener; NULL if that failed. */
static rdzv_client *client_accept(hoop__rdzv_server *server) {
  rdzv_client *client = calloc(1, sizeof *client);
  /* Left unaccepted, the connection stays queued and libuv stops watching the listener until a
   * later accept: nothing better is possible without memory. */
  if (!client || uv_tcp_init(server->loop, &client->tcp) != 0) {
    HOOP_ERROR(HOOP_SUBSYS_RDZV, "out of memory accepting a connection on %s", server->where);
    free(client);
    return NULL;
  }
  client->server = server;
  client->tcp.data = client;
  client->timer.data = client;
  client->open_handles = 2;
  server->open_handles += 2;
  uv_timer_init(server->loop, &client->timer); /* cannot fail on Linux: no system call */
  client->next = server->clients;
  if (server->clients)
    server->clients->prev = client;
  server->clients = client;
  server->nclients++;
  int rc = uv_accept((uv_stream_t *)&server->listener, (uv_stream_t *)&client->tcp);
  struct sockaddr_storage addr;
  int addrlen = sizeof addr;
  if (rc == 0)
    rc = uv_tcp_getpeername(&client->tcp, (struct sockaddr *)&addr, &addrlen);
  if (rc != 0) {
    HOOP_WARN(HOOP_SUBSYS_RDZV, "accepting a connection on %s: %s", server->where, uv_strerror(rc));
    client_close(client);
    return NULL;
  }
  hoop__format_sockaddr((struct sockaddr *)&addr, client->peer, sizeof client->peer);
  keep_alive(client, server->keepalive_s);
  return client;
}

static void on_connection(uv_stream_t *listener, int status) {
  hoop__rdzv_server *server = listener->data;
  if (status < 0) {
    HOOP_WARN(HOOP_SUBSYS_RDZV, "incoming connection on %s: %s", server->where,
              uv_strerror(status));
    return;
  }
  int busy = server->nclients >= server->max_connections;
  rdzv_client *client = client_accept(server);
  if (!client)
    return;
  HOOP_TRACE(HOOP_SUBSYS_RDZV, "connection from %s", client->peer);
  uv_timer_start(&client->timer, on_client_timer, server->idle_ms, 0);
  if (busy) {
    HOOP_INFO(HOOP_SUBSYS_RDZV, "refused %s: %d connections open, the limit", client->peer,
              server->max_connections);
    send_error(client, HOOP_ERR_SYSTEM,
               "the rendezvous server has %d connections open (its limit); "
               "try again later",
               server->max_connections);
    return;
  }
  if (send_challenge(client) != 0)
    return;
  int rc = uv_read_start((uv_stream_t *)&client->tcp, on_alloc, on_read);
  if (rc != 0) {
    HOOP_WARN(HOOP_SUBSYS_RDZV, "reading from %s: %s", client->peer, uv_strerror(rc));
    client_close(client);
  }
}

/* ---- the server ------------------------------------------------------------------------------ */

static void on_listener_closed(uv_handle_t *handle) {
  handle_closed(handle->data);
}

static void stop_listening(hoop__rdzv_server *server) {
  if (!server->listening)
    return;
  server->listening = 0;
  uv_close((uv_handle_t *)&server->listener, on_listener_closed);
}

/* With `once`: the job is over; stop listening, drop whoever else is connected, and tell the owner
 * once the last reply has been written. */
static void check_once_done(hoop__rdzv_server *server) {
  if (!server->once_over || server->done_called || server->closing)
    return;
  if (server->listening) {
    HOOP_INFO(HOOP_SUBSYS_RDZV, "served its one job; no longer listening on %s", server->where);
    stop_listening(server);
    for (rdzv_client *client = server->clients, *next; client; client = next) {
      next = client->next;
      if (!client->replying && !client->job)
        client_close(client);
    }
  }
  if (server->pending_writes > 0 || server->nrunning > 0)
    return;
  server->done_called = 1;
  if (server->on_done)
    server->on_done(server->arg);
}

/* A bound, listening socket for addr; -1 with a message in err. libuv takes it over afterwards;
 * binding it here keeps a failed start from leaving a handle in the loop. */
static int listen_socket(const struct sockaddr_storage *addr, socklen_t addrlen, char *err,
                         size_t errlen) {
  char where[80];
  hoop__format_sockaddr((const struct sockaddr *)addr, where, sizeof where);
  int fd = socket(addr->ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    snprintf(err, errlen, "socket for %s: %s", where, strerror(errno));
    return -1;
  }
  int on = 1, off = 0;
  const char *failed = NULL;
  /* SO_REUSEADDR: a restarted daemon binds again while old connections linger in TIME_WAIT.
   * IPV6_V6ONLY off: "[::]" takes IPv4 clients too. */
  if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on) != 0)
    failed = "setsockopt(SO_REUSEADDR)";
  else if (addr->ss_family == AF_INET6 &&
           setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &off, sizeof off) != 0)
    failed = "setsockopt(IPV6_V6ONLY)";
  else if (bind(fd, (const struct sockaddr *)addr, addrlen) != 0)
    failed = "bind";
  else if (listen(fd, LISTEN_BACKLOG) != 0)
    failed = "listen";
  if (failed) {
    snprintf(err, errlen, "cannot listen on %s: %s: %s", where, failed, strerror(errno));
    close(fd);
    return -1;
  }
  return fd;
}

static void set_options(hoop__rdzv_server *server, const hoop__rdzv_options *options) {
  server->max_jobs = options->max_jobs > 0 ? options->max_jobs : DEFAULT_MAX_JOBS;
  server->max_connections =
      options->max_connections > 0 ? options->max_connections : HOOP_RDZV_MAX_CONNECTIONS;
  double idle_s = options->idle_timeout_s > 0 ? options->idle_timeout_s : DEFAULT_IDLE_TIMEOUT_S;
  server->idle_ms = idle_s > 1e9 ? (uint64_t)1e12 : (uint64_t)(idle_s * 1000);
  server->keepalive_s = options->keepalive_s > 0 ? options->keepalive_s : DEFAULT_KEEPALIVE_S;
  server->once = options->once;
  snprintf(server->token, sizeof server->token, "%s", options->token ? options->token : "");
  server->on_done = options->on_done;
  server->arg = options->arg;
}

/* Hand fd to libuv and start accepting. On failure the server is freed: at once, or (when libuv
 * already holds the handle) by the loop when it next runs. */
static int start_listening(hoop__rdzv_server *server, int fd, char *err, size_t errlen) {
  int rc = uv_tcp_init(server->loop, &server->listener);
  if (rc != 0) {
    snprintf(err, errlen, "uv_tcp_init: %s", uv_strerror(rc));
    close(fd);
    server_free(server);
    return -1;
  }
  server->listener.data = server;
  server->open_handles = 1;
  server->listening = 1;
  const char *failed = NULL;
  rc = uv_tcp_open(&server->listener, fd);
  if (rc != 0) {
    failed = "uv_tcp_open";
    close(fd); /* not the handle's yet */
  } else if ((rc = uv_listen((uv_stream_t *)&server->listener, LISTEN_BACKLOG, on_connection))) {
    failed = "uv_listen";
  }
  if (!failed)
    return 0;
  snprintf(err, errlen, "%s on %s: %s", failed, server->where, uv_strerror(rc));
  server->closing = 1;
  stop_listening(server);
  return -1;
}

int hoop__rdzv_server_start(uv_loop_t *loop, const hoop__rdzv_options *options,
                            hoop__rdzv_server **out, char *err, size_t errlen) {
  char host[HOOP_WIRE_MAX_HOST + 1];
  int port;
  struct sockaddr_storage addr;
  socklen_t addrlen;
  *out = NULL;
  if (!options->listen || hoop__split_hostport(options->listen, host, sizeof host, &port) != 0) {
    snprintf(err, errlen, "listen address '%s' is not host:port, [v6]:port or :port",
             options->listen ? options->listen : "(null)");
    return -1;
  }
  if (hoop__resolve(host[0] ? host : "0.0.0.0", port, &addr, &addrlen, err, errlen) != 0)
    return -1;
  int fd = listen_socket(&addr, addrlen, err, errlen);
  if (fd < 0)
    return -1;
  addrlen = sizeof addr;
  hoop__rdzv_server *server = calloc(1, sizeof *server);
  if (!server || getsockname(fd, (struct sockaddr *)&addr, &addrlen) != 0) {
    snprintf(err, errlen, "%s%s", server ? "getsockname: " : "out of memory",
             server ? strerror(errno) : "");
    server_free(server);
    close(fd);
    return -1;
  }
  server->loop = loop;
  server->port = ntohs(addr.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&addr)->sin6_port
                                                  : ((struct sockaddr_in *)&addr)->sin_port);
  hoop__format_sockaddr((struct sockaddr *)&addr, server->where, sizeof server->where);
  set_options(server, options);
  if (start_listening(server, fd, err, errlen) != 0)
    return -1;
  HOOP_INFO(HOOP_SUBSYS_RDZV, "listening on %s", server->where);
  *out = server;
  return 0;
}

long hoop__raise_open_files(long want, long *hard) {
  struct rlimit lim;
  *hard = want;
  if (getrlimit(RLIMIT_NOFILE, &lim) != 0)
    return want; /* cannot tell: let accept() say */
  const rlim_t wanted = (rlim_t)want;
  if (lim.rlim_cur != RLIM_INFINITY && lim.rlim_cur < wanted) {
    rlim_t raised = lim.rlim_max != RLIM_INFINITY && lim.rlim_max < wanted ? lim.rlim_max : wanted;
    struct rlimit next = {raised, lim.rlim_max};
    if (raised > lim.rlim_cur && setrlimit(RLIMIT_NOFILE, &next) == 0)
      lim.rlim_cur = raised;
  }
  if (lim.rlim_cur == RLIM_INFINITY || lim.rlim_cur >= wanted)
    return want;
  /* Short of want: the hard limit as it is, even where it was high enough but raising failed. */
  *hard = lim.rlim_max == RLIM_INFINITY || lim.rlim_max > (rlim_t)LONG_MAX ? LONG_MAX
                                                                           : (long)lim.rlim_max;
  return (long)lim.rlim_cur;
}

int hoop__rdzv_server_port(const hoop__rdzv_server *server) {
  return server->port;
}

void hoop__rdzv_server_close(hoop__rdzv_server *server) {
  if (!server || server->closing)
    return;
  server->closing = 1;
  stop_listening(server);
  while (server->clients)
    client_close(server->clients); /* members leave their jobs, and empty jobs are forgotten */
  while (server->jobs)
    job_forget(server->jobs);
  if (server->open_handles == 0)
    server_free(server);
}

/* ---- a server on its own thread -------------------------------------------------------------- */

struct hoop__rdzv_thread {
  uv_loop_t loop;
  uv_async_t stop; /* the one thread-safe way into the loop: asks it to close the server */
  pthread_t thread;
  hoop__rdzv_server *server;
  int port;
};

static void on_stop(uv_async_t *async) {
  hoop__rdzv_thread *thread = async->data;
  hoop__rdzv_server_close(thread->server);
  uv_close((uv_handle_t *)async, NULL);
}

static void *serve(void *arg) {
  hoop__rdzv_thread *thread = arg;
  uv_run(&thread->loop, UV_RUN_DEFAULT);
  return NULL;
}

/* Undo a start that failed after the loop was set up: let the loop close what is open. */
static void thread_abandon(hoop__rdzv_thread *thread, int async_open) {
  hoop__rdzv_server_close(thread->server);
  if (async_open)
    uv_close((uv_handle_t *)&thread->stop, NULL);
  uv_run(&thread->loop, UV_RUN_DEFAULT);
  int rc = uv_loop_close(&thread->loop);
  if (rc != 0)
    HOOP_WARN(HOOP_SUBSYS_RDZV, "uv_loop_close: %s", uv_strerror(rc));
  free(thread);
}

/* Start the thread with every signal blocked: the process's signals stay with its own threads, and
 * a client that hangs up mid-reply makes the write fail with EPIPE instead of raising SIGPIPE. */
static int spawn_blocked(hoop__rdzv_thread *thread) {
  sigset_t all, old;
  sigfillset(&all);
  int rc = pthread_sigmask(SIG_SETMASK, &all, &old);
  if (rc != 0)
    return rc;
  rc = pthread_create(&thread->thread, NULL, serve, thread);
  int restored = pthread_sigmask(SIG_SETMASK, &old, NULL);
  if (restored != 0)
    HOOP_WARN(HOOP_SUBSYS_RDZV, "restoring the signal mask: %s", strerror(restored));
  return rc;
}

int hoop__rdzv_thread_start(const hoop__rdzv_options *options, hoop__rdzv_thread **out, char *err,
                            size_t errlen) {
  *out = NULL;
  hoop__rdzv_thread *thread = calloc(1, sizeof *thread);
  if (!thread) {
    snprintf(err, errlen, "out of memory");
    return -1;
  }
  int rc = uv_loop_init(&thread->loop);
  if (rc != 0) {
    snprintf(err, errlen, "uv_loop_init: %s", uv_strerror(rc));
    free(thread);
    return -1;
  }
  /* The server starts on this thread, so the port is known when we return; the loop is handed to
   * the new thread after that and not touched here again. */
  if (hoop__rdzv_server_start(&thread->loop, options, &thread->server, err, errlen) != 0) {
    thread_abandon(thread, 0);
    return -1;
  }
  thread->port = hoop__rdzv_server_port(thread->server);
  if ((rc = uv_async_init(&thread->loop, &thread->stop, on_stop)) != 0) {
    snprintf(err, errlen, "uv_async_init: %s", uv_strerror(rc));
    thread_abandon(thread, 0);
    return -1;
  }
  thread->stop.data = thread;
  if ((rc = spawn_blocked(thread)) != 0) {
    snprintf(err, errlen, "pthread_create: %s", strerror(rc));
    thread_abandon(thread, 1);
    return -1;
  }
  *out = thread;
  return 0;
}

int hoop__rdzv_thread_port(const hoop__rdzv_thread *thread) {
  return thread->port;
}

void hoop__rdzv_thread_stop(hoop__rdzv_thread *thread) {
  if (!thread)
    return;
  int rc = uv_async_send(&thread->stop);
  if (rc != 0)
    HOOP_ERROR(HOOP_SUBSYS_RDZV, "uv_async_send: %s", uv_strerror(rc));
  rc = pthread_join(thread->thread, NULL);
  if (rc != 0)
    HOOP_ERROR(HOOP_SUBSYS_RDZV, "pthread_join: %s", strerror(rc));
  rc = uv_loop_close(&thread->loop);
  if (rc != 0)
    HOOP_WARN(HOOP_SUBSYS_RDZV, "uv_loop_close: %s", uv_strerror(rc));
  free(thread);
}
