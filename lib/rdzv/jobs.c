/* jobs.c - the rendezvous server's jobs: created by their first HELLO, members added and removed,
 * found by id, forgotten; members grouped by host; a job that does not fill up in time. */
#include <errno.h>
#include <limits.h>
#include <malloc.h>
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

#include "rdzv/server_impl.h"
#include "util/netaddr.h"

/* ---- small helpers --------------------------------------------------------------------------- */

int hoop__rdzv_bit_test(const uint8_t *bits, uint32_t i) {
  return bits[i / 8] >> (i % 8) & 1;
}

void hoop__rdzv_bit_set(uint8_t *bits, uint32_t i) {
  bits[i / 8] = (uint8_t)(bits[i / 8] | 1u << (i % 8));
}

static void bit_clear(uint8_t *bits, uint32_t i) {
  bits[i / 8] = (uint8_t)(bits[i / 8] & ~(1u << (i % 8)));
}

/* "300", "2.5", "0.125": milliseconds as seconds without trailing zeros. */
void hoop__rdzv_format_seconds(uint64_t ms, char *out, size_t outlen) {
  snprintf(out, outlen, "%llu.%03u", (unsigned long long)(ms / 1000), (unsigned)(ms % 1000));
  size_t len = strlen(out);
  while (out[len - 1] == '0')
    out[--len] = '\0';
  if (out[len - 1] == '.')
    out[len - 1] = '\0';
}

/* ---- grouping members by host ---------------------------------------------------------------- */

int hoop__rdzv_by_host_then_arrival(const void *a, const void *b) {
  const member_slot *x = *(member_slot *const *)a, *y = *(member_slot *const *)b;
  int c = strcmp(x->host, y->host);
  return c ? c : (x->arrival > y->arrival) - (x->arrival < y->arrival);
}

int hoop__rdzv_by_host_then_rank(const void *a, const void *b) {
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
host_group *hoop__rdzv_group_by_host(member_slot **slots, uint32_t n,
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
member_slot *hoop__rdzv_job_slots(const rdzv_job *job, member_slot ***pointers) {
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

void hoop__rdzv_handle_closed(hoop__rdzv_server *server) {
  if (--server->open_handles == 0 && server->closing) {
    hoop__rdzv_server_free(server);
    return;
  }
#ifdef __GLIBC__
  /* After a large job, once everything of it is freed (nothing open but the listener): give it
   * back, which glibc's allocator would keep (a job of 4096 ranks holds 26 MB). Only then, so
   * that strangers' connections to an idle server never cost a trim. */
  if (server->trim_due && server->open_handles <= 1 && server->nclients == 0 && !server->jobs) {
    server->trim_due = 0;
    malloc_trim(0);
  }
#endif
}

static void on_job_closed(uv_handle_t *handle) {
  rdzv_job *job = handle->data;
  hoop__rdzv_server *server = job->server;
  free(job->members);
  free(job->taken);
  free(job->accused);
  free(job->newcomers);
  free(job);
  hoop__rdzv_handle_closed(server);
}

/* Forget the job; members still listed are detached (the caller deals with their connections). */
void hoop__rdzv_job_forget(rdzv_job *job) {
  hoop__rdzv_server *server = job->server;
  if (job->forgotten)
    return;
  job->forgotten = 1;
  hoop__rdzv_dump_forget_job(job);
  hoop__rdzv_newcomers_drop(job);
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
  if (job->size >= TRIM_AFTER_RANKS)
    server->trim_due = 1;
  uv_close((uv_handle_t *)&job->timer, on_job_closed);
}

/* Take the members out of the job and forget it; the caller owns the returned array. */
rdzv_client **hoop__rdzv_job_take_members(rdzv_job *job, uint32_t *count) {
  rdzv_client **members = job->members;
  *count = job->joined;
  for (uint32_t i = 0; i < job->joined; i++)
    members[i]->job = NULL;
  job->members = NULL;
  job->joined = 0;
  hoop__rdzv_job_forget(job);
  return members;
}

rdzv_job *hoop__rdzv_job_find(const hoop__rdzv_server *server, const char *id) {
  for (rdzv_job *job = server->jobs; job; job = job->next)
    if (!job->running && strcmp(job->id, id) == 0)
      return job;
  return NULL;
}

static void on_job_timer(uv_timer_t *timer);

rdzv_job *hoop__rdzv_job_create(hoop__rdzv_server *server, const hoop__hello *hello) {
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
  job->timeout_ms = server->only_job[0] ? server->only_timeout_ms : hello->timeout_ms;
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
  hoop__rdzv_format_seconds(job->timeout_ms, seconds, sizeof seconds);
  HOOP__INFO(HOOP_SUBSYS_RDZV, "job '%s' created: %u ranks, timeout %s s", job->id, job->size,
             seconds);
  return job;
}

/* Add a member; -1 when out of memory. The members array grows as ranks arrive, so that a HELLO
 * announcing a huge job costs little until the ranks really come. */
int hoop__rdzv_job_add_member(rdzv_job *job, rdzv_client *client) {
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
    hoop__rdzv_bit_set(job->taken, (uint32_t)client->hello.rank);
    job->nrequested++;
  }
  return 0;
}

/* A member's connection closed before the job completed: it may retry. A job nobody waits for any
 * more is forgotten, so that a restarted job may come back with another size. */
void hoop__rdzv_job_remove_member(rdzv_job *job, rdzv_client *client) {
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
  HOOP__INFO(HOOP_SUBSYS_RDZV,
             "job '%s': a rank on host '%s' (%s) left before the job completed; "
             "%u of %u joined",
             job->id, client->hello.host, client->peer, job->joined, job->size);
  if (job->joined == 0) {
    HOOP__INFO(HOOP_SUBSYS_RDZV, "job '%s' forgotten: no rank waits for it any more", job->id);
    hoop__rdzv_job_forget(job);
  }
}

/* ---- a job's end: timeout -------------------------------------------------------------------- */

/* The ranks no member holds, when every member asked for one (otherwise which ranks are missing
 * is not known yet); at most max of them. */
uint32_t hoop__rdzv_missing_ranks(const rdzv_job *job, int32_t *out, uint32_t max) {
  uint32_t n = 0;
  if (job->nrequested != job->joined)
    return 0;
  for (uint32_t r = 0; r < job->size && n < max; r++)
    if (!hoop__rdzv_bit_test(job->taken, r))
      out[n++] = (int32_t)r;
  return n;
}

static void describe_missing(const rdzv_job *job, hoop__buf *t) {
  int32_t missing[MISSING_NAMED];
  uint32_t total = job->size - job->joined;
  uint32_t named = hoop__rdzv_missing_ranks(job, missing, MISSING_NAMED);
  hoop__buf_printf(t, "; missing ranks: ");
  for (uint32_t i = 0; i < named; i++)
    hoop__buf_printf(t, "%s%d", i ? ", " : "", missing[i]);
  if (total > named)
    hoop__buf_printf(t, " and %u more", total - named);
}

/* "...; 3 ranks never joined; joined: node-a (2 ranks), node-b (1 rank)": the hosts that did join,
 * as many as fit in the message. */
static void describe_hosts(const rdzv_job *job, hoop__buf *t) {
  hoop__buf_printf(t, "; %u ranks never joined", job->size - job->joined);
  member_slot **pointers;
  member_slot *slots = hoop__rdzv_job_slots(job, &pointers);
  uint32_t ngroups = 0;
  host_group *groups = slots ? hoop__rdzv_group_by_host(pointers, job->joined,
                                                        hoop__rdzv_by_host_then_arrival, &ngroups)
                             : NULL;
  for (uint32_t g = 0; groups && g < ngroups; g++) {
    const char *host = groups[g].first[0]->host;
    /* Keep room for this host and for a closing "and N more hosts". */
    if (t->cap - t->len < strlen(host) + 64) {
      hoop__buf_printf(t, " and %u more hosts", ngroups - g);
      break;
    }
    hoop__buf_printf(t, "%s%s (%u rank%s)", g ? ", " : "; joined: ", host, groups[g].count,
                     groups[g].count == 1 ? "" : "s");
  }
  free(groups);
  free(pointers);
  free(slots);
}

static void on_job_timer(uv_timer_t *timer) {
  rdzv_job *job = timer->data;
  hoop__rdzv_server *server = job->server;
  char message[HOOP__WIRE_MAX_MESSAGE + 1], seconds[32];
  hoop__buf t = {0};
  hoop__rdzv_format_seconds(job->timeout_ms, seconds, sizeof seconds);
  hoop__buf_printf(&t, "rendezvous for job '%s' timed out after %s s: %u of %u ranks joined",
                   job->id, seconds, job->joined, job->size);
  if (job->nrequested == job->joined)
    describe_missing(job, &t);
  else
    describe_hosts(job, &t);
  /* Cut to what a message carries; out of memory, the part that fitted. */
  snprintf(message, sizeof message, "%s", t.data ? t.data : "rendezvous timed out");
  hoop__buf_free(&t);
  HOOP__INFO(HOOP_SUBSYS_RDZV, "%s", message);
  server->refusals[REFUSED_TIMEOUT]++;
  uint32_t count;
  rdzv_client **members = hoop__rdzv_job_take_members(job, &count);
  for (uint32_t i = 0; i < count; i++)
    hoop__rdzv_send_error(members[i], HOOP_ERR_TIMEOUT, "%s", message);
  free(members);
  if (server->once)
    server->once_over = 1;
  hoop__rdzv_check_once_done(server);
}
