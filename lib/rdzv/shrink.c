/* shrink.c - a running job's next generation. After a failure the survivors each send SHRINK on
 * their kept connection; the server gathers them and answers with a new TABLE of the askers only.
 *
 * Who is waited for: every member still connected that has said no goodbye, for up to the timeout
 * the first SHRINK carries (the job's HOOP_TIMEOUT), so that a rank slow to notice the failure is
 * not cut off by a race; a member that some SHRINK names as failed (the rank a survivor timed out
 * on, or lost) only for a short grace, so that a stopped process costs seconds, not the timeout.
 * A member that closes its connection meanwhile is not waited for. Members that did not ask in
 * time are left out: told with an ERROR and closed, their closing no loss to the others.
 *
 * Newcomers (a HELLO with HOOP__HELLO_NEWCOMER, for a job that runs) wait here; every member is
 * told how many wait (PENDING), and the next generation takes them after the members, in order of
 * arrival: the members make one with hoop_comm_grow when they see newcomers, or a shrink takes
 * them along. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rdzv/server_impl.h"

/* How long a member named as failed may still ask to stay (at most the timeout itself). */
#define SHRINK_GRACE_MS 2000

static int accused(const rdzv_job *job, uint32_t rank) {
  return job->accused && rank < job->size && hoop__rdzv_bit_test(job->accused, rank);
}

/* 1 once no member is left to wait for. */
static int shrink_ready(const rdzv_job *job, uint64_t now) {
  if (now >= job->shrink_due_ms)
    return 1;
  for (uint32_t i = 0; i < job->joined; i++) {
    const rdzv_client *member = job->members[i];
    if (member->shrink_asked || member->said_goodbye || member->closing)
      continue;
    if (job->shrink_grace_over && accused(job, member->rank))
      continue;
    return 0;
  }
  return 1;
}

static int by_rank(const void *a, const void *b) {
  const rdzv_client *x = *(rdzv_client *const *)a, *y = *(rdzv_client *const *)b;
  return (x->rank > y->rank) - (x->rank < y->rank);
}

static void shrink_end(rdzv_job *job) {
  job->shrinking = 0;
  job->shrink_grace_over = 0;
  free(job->accused);
  job->accused = NULL;
  uv_timer_stop(&job->timer);
}

/* The table of the askers (in[0..n), sorted by their old ranks), encoded once; NULL when out of
 * memory or randomness. */
static shared_table *next_table(rdzv_client **in, uint32_t n, uint32_t generation) {
  member_slot *slots = calloc(n, sizeof *slots);
  member_slot **pointers = calloc(n, sizeof *pointers);
  hoop__table table = {.size = n, .rank = 0, .generation = generation};
  table.peers = calloc(n, sizeof *table.peers);
  shared_table *shared = calloc(1, sizeof *shared);
  int ok = slots && pointers && table.peers && shared &&
           uv_random(NULL, NULL, table.nonce, sizeof table.nonce, 0, NULL) == 0;
  for (uint32_t i = 0; ok && i < n; i++) {
    slots[i] = (member_slot){in[i]->hello.host, i, (int32_t)i, 0, 0};
    pointers[i] = &slots[i];
  }
  ok = ok && hoop__rdzv_assign_local_ranks(pointers, n) == 0;
  for (uint32_t i = 0; ok && i < n; i++) {
    snprintf(table.peers[i].host, sizeof table.peers[i].host, "%s", in[i]->hello.host);
    snprintf(table.peers[i].addr, sizeof table.peers[i].addr, "%s", in[i]->shrink_addr);
    table.peers[i].local_rank = slots[i].local_rank;
    table.peers[i].local_size = slots[i].local_size;
    memcpy(table.peers[i].key, in[i]->hello.key, sizeof table.peers[i].key);
  }
  ok = ok && hoop__wire_encode_table(&shared->wire, &table) == 0;
  free(table.peers);
  free(pointers);
  free(slots);
  if (!ok && shared) {
    hoop__wbuf_free(&shared->wire);
    free(shared);
    shared = NULL;
  }
  return shared;
}

/* Describe the ranks of out[0..n) in text: "2, 5". */
static void list_ranks(rdzv_client **out, uint32_t n, char *text, size_t len) {
  size_t used = 0;
  text[0] = '\0';
  for (uint32_t i = 0; i < n && used + 16 < len; i++)
    used += (size_t)snprintf(text + used, len - used, "%s%u", i ? ", " : "", out[i]->rank);
  if (n == 0)
    snprintf(text, len, "none");
}

/* Write msg to a member on its kept connection; -1 if the write could not start. */
static int send_kept(rdzv_client *member, const hoop__wbuf *msg) {
  rdzv_reply *reply = calloc(1, sizeof *reply);
  if (!reply)
    return -1;
  hoop__buf_append(&reply->message, msg->data, msg->len);
  if (reply->message.failed) {
    hoop__rdzv_reply_free(reply);
    return -1;
  }
  reply->client = member;
  reply->keep_open = 1;
  uv_buf_t buf = uv_buf_init((char *)reply->message.data, (unsigned)reply->message.len);
  if (uv_write(&reply->req, (uv_stream_t *)&member->tcp, &buf, 1, hoop__rdzv_on_written) != 0) {
    hoop__rdzv_reply_free(reply);
    return -1;
  }
  member->server->pending_writes++;
  return 0;
}

/* Tell every member how many newcomers wait. A member whose write fails is closed afterwards. */
static void tell_pending(rdzv_job *job) {
  hoop__wbuf msg = {0};
  uint32_t count = job->joined, nfailed = 0;
  rdzv_client **failed = malloc((count ? count : 1) * sizeof *failed);
  if (!failed || hoop__wire_encode_pending(&msg, job->nnewcomers) != 0) {
    HOOP__WARN(HOOP_SUBSYS_RDZV, "job '%s': out of memory telling of newcomers", job->id);
    free(failed);
    hoop__wbuf_free(&msg);
    return;
  }
  for (uint32_t i = 0; i < count; i++) {
    rdzv_client *member = job->members[i];
    if (member->said_goodbye || !member->has_table || member->closing)
      continue;
    if (send_kept(member, &msg) != 0)
      failed[nfailed++] = member;
  }
  hoop__wbuf_free(&msg);
  for (uint32_t i = 0; i < nfailed; i++)
    hoop__rdzv_client_close(failed[i]);
  free(failed);
}

static rdzv_job *running_job(const hoop__rdzv_server *server, const char *id) {
  for (rdzv_job *job = server->jobs; job; job = job->next)
    if (job->running && !job->forgotten && strcmp(job->id, id) == 0)
      return job;
  return NULL;
}

void hoop__rdzv_newcomer_hello(rdzv_client *client, const hoop__hello *hello) {
  rdzv_job *job = running_job(client->server, hello->job);
  if (!job && client->server->once_over) {
    /* An elastic hooprun's server after its job: the replacement started as the job ended. */
    HOOP__INFO(HOOP_SUBSYS_RDZV, "refused %s: a newcomer to job '%s', which has ended",
               client->peer, hello->job);
    hoop__rdzv_send_error(client, HOOP_ERR_PEER_LOST, "job '%s' ended before it took its newcomers",
                          hello->job);
    return;
  }
  if (!job) {
    HOOP__INFO(HOOP_SUBSYS_RDZV, "refused %s: a newcomer to job '%s', which is not running here",
               client->peer, hello->job);
    hoop__rdzv_send_error(client, HOOP_ERR_INVALID_ARG,
                          "no job '%s' is running here for a newcomer to join (newcomers join a "
                          "running job at its next generation: hoop_comm_grow, hooprun --max-np)",
                          hello->job);
    return;
  }
  if (job->nnewcomers == job->newcomers_capacity) {
    uint32_t capacity = job->newcomers_capacity ? 2 * job->newcomers_capacity : 4;
    rdzv_client **grown = realloc(job->newcomers, capacity * sizeof *grown);
    if (!grown) {
      hoop__rdzv_send_error(client, HOOP_ERR_SYSTEM, "rendezvous server: out of memory");
      return;
    }
    job->newcomers = grown;
    job->newcomers_capacity = capacity;
  }
  job->newcomers[job->nnewcomers++] = client;
  client->pending_job = job;
  client->hello = *hello;
  snprintf(client->shrink_addr, sizeof client->shrink_addr, "%s", hello->addr);
  uv_timer_stop(&client->timer); /* it waits for the members, however long that takes */
  uint32_t own_s = hello->timeout_ms / 1000 + (hello->timeout_ms % 1000 != 0);
  if (own_s > (uint32_t)client->keepalive_s)
    hoop__rdzv_keep_alive(client, own_s > KEEPALIVE_MAX_S ? KEEPALIVE_MAX_S : (int)own_s);
  HOOP__INFO(HOOP_SUBSYS_RDZV,
             "job '%s': a newcomer from host '%s' (%s) waits for generation %u (%u waiting)",
             job->id, hello->host, client->peer, job->generation + 1, job->nnewcomers);
  tell_pending(job);
}

void hoop__rdzv_newcomer_left(rdzv_client *client) {
  rdzv_job *job = client->pending_job;
  client->pending_job = NULL;
  uint32_t i = 0;
  while (i < job->nnewcomers && job->newcomers[i] != client)
    i++;
  if (i == job->nnewcomers)
    return;
  memmove(&job->newcomers[i], &job->newcomers[i + 1],
          (job->nnewcomers - i - 1) * sizeof *job->newcomers);
  job->nnewcomers--;
  if (job->server->closing || job->forgotten)
    return;
  HOOP__INFO(HOOP_SUBSYS_RDZV, "job '%s': a newcomer (%s) left before it was taken", job->id,
             client->peer);
  tell_pending(job);
}

void hoop__rdzv_newcomers_drop(rdzv_job *job) {
  uint32_t count = job->nnewcomers;
  rdzv_client **newcomers = job->newcomers;
  job->newcomers = NULL;
  job->nnewcomers = job->newcomers_capacity = 0;
  for (uint32_t i = 0; i < count; i++) {
    newcomers[i]->pending_job = NULL;
    if (!job->server->closing)
      hoop__rdzv_send_error(newcomers[i], HOOP_ERR_PEER_LOST,
                            "job '%s' ended before it took its newcomers", job->id);
  }
  free(newcomers);
}

static void shrink_complete(rdzv_job *job) {
  hoop__rdzv_server *server = job->server;
  uint32_t count = job->joined, nin = 0, nout = 0, nnew = job->nnewcomers;
  rdzv_client **in = malloc((count + nnew ? count + nnew : 1) * sizeof *in);
  rdzv_client **out = malloc((count ? count : 1) * sizeof *out);
  for (uint32_t i = 0; in && out && i < count; i++) {
    if (job->members[i]->shrink_asked)
      in[nin++] = job->members[i];
    else
      out[nout++] = job->members[i];
  }
  uint32_t old_size = job->size, generation = job->generation + 1;
  shrink_end(job);
  if (nin == 0) { /* everyone who asked has gone: nothing to build */
    free(in);
    free(out);
    return;
  }
  qsort(in, nin, sizeof *in, by_rank);
  uint32_t nmembers = nin;
  rdzv_client **members = realloc(job->members, (count + nnew) * sizeof *members);
  if (members) {
    job->members = members;
    job->capacity = count + nnew;
    for (uint32_t i = 0; i < nnew; i++) /* newcomers go after the members */
      in[nin++] = job->newcomers[i];
  } else {
    nnew = 0;
  }
  shared_table *shared = in && out ? next_table(in, nin, generation) : NULL;
  if (!shared) {
    HOOP__ERROR(HOOP_SUBSYS_RDZV, "job '%s': out of memory building generation %u", job->id,
                generation);
    nin = nmembers; /* the newcomers wait on */
    for (uint32_t i = 0; i < nin; i++)
      hoop__rdzv_send_error(in[i], HOOP_ERR_SYSTEM,
                            "rendezvous server: cannot build generation %u of job '%s' (out of "
                            "memory or randomness)",
                            generation, job->id);
    free(in);
    free(out);
    return;
  }
  char left_out[256];
  list_ranks(out, nout, left_out, sizeof left_out);
  HOOP__INFO(HOOP_SUBSYS_RDZV,
             "job '%s': generation %u has %u ranks: %u of %u members, %u newcomers; left out: %s",
             job->id, generation, nin, nmembers, old_size, nnew, left_out);
  /* Those left out leave the job first, so that their closing reads as no loss. */
  for (uint32_t i = 0; i < nout; i++) {
    rdzv_client *member = out[i];
    uint32_t k = 0;
    while (k < job->joined && job->members[k] != member)
      k++;
    job->members[k] = job->members[--job->joined];
    member->job = NULL;
    if (member->said_goodbye || member->closing)
      hoop__rdzv_client_close(member);
    else
      hoop__rdzv_send_error(member, HOOP_ERR_PEER_LOST,
                            "job '%s': rank %u was left out of generation %u: the other ranks "
                            "took it for failed and it did not ask to go on with them in time",
                            job->id, member->rank, generation);
  }
  /* The newcomers taken become members. */
  for (uint32_t i = nmembers; i < nin; i++) {
    in[i]->pending_job = NULL;
    in[i]->job = job;
    job->members[job->joined++] = in[i];
  }
  if (nnew) {
    memmove(job->newcomers, job->newcomers + nnew, (job->nnewcomers - nnew) * sizeof *in);
    job->nnewcomers -= nnew;
  }
  job->generation = generation;
  job->size = nin;
  /* The health of the generation before: its ranks' numbers and calls no longer hold. */
  hoop__rdzv_health_forget(job);
  shared->refs = 1;
  for (uint32_t i = 0; i < nin; i++) {
    hoop__rdzv_report_free(in[i]);
    in[i]->rank = i;
    in[i]->shrink_asked = 0;
    snprintf(in[i]->hello.addr, sizeof in[i]->hello.addr, "%s", in[i]->shrink_addr);
  }
  for (uint32_t i = 0; i < nin; i++)
    hoop__rdzv_send_table(in[i], shared, i);
  hoop__rdzv_shared_table_release(shared);
  free(in);
  free(out);
  hoop__rdzv_check_once_done(server);
}

static void shrink_consider(rdzv_job *job) {
  if (job->shrinking && shrink_ready(job, uv_now(job->server->loop)))
    shrink_complete(job);
}

static void on_shrink_timer(uv_timer_t *timer) {
  rdzv_job *job = timer->data;
  uint64_t now = uv_now(job->server->loop);
  if (!job->shrink_grace_over) {
    job->shrink_grace_over = 1;
    if (job->shrinking && !shrink_ready(job, now)) {
      uv_timer_start(&job->timer, on_shrink_timer,
                     job->shrink_due_ms > now ? job->shrink_due_ms - now : 0, 0);
      return;
    }
  }
  shrink_consider(job);
}

void hoop__rdzv_shrink_request(rdzv_client *client, const hoop__shrink_msg *msg) {
  rdzv_job *job = client->job;
  char what[128];
  if (msg->rank != client->rank) {
    snprintf(what, sizeof what, "a SHRINK in the name of rank %u, not its own", msg->rank);
    hoop__rdzv_member_refuse(client, what);
    return;
  }
  if (msg->generation != job->generation || client->shrink_asked) {
    snprintf(what, sizeof what, "a SHRINK for generation %u, %s %u", msg->generation,
             client->shrink_asked ? "twice in generation" : "while the job is at generation",
             job->generation);
    hoop__rdzv_member_refuse(client, what);
    return;
  }
  if (!job->shrinking) {
    job->accused = calloc((job->size + 7) / 8, 1);
    if (!job->accused) {
      hoop__rdzv_member_refuse(client, "its SHRINK: the server is out of memory");
      return;
    }
    uint64_t now = uv_now(job->server->loop);
    job->shrinking = 1;
    job->shrink_grace_over = 0;
    /* The first to ask sets how long the others have, but never less than the job's own timeout
     * (its first HELLO's): a member that says 0 would otherwise leave out every member that had
     * not asked yet. */
    uint32_t wait_ms = msg->timeout_ms > job->timeout_ms ? msg->timeout_ms : job->timeout_ms;
    job->shrink_due_ms = now + wait_ms;
    uint64_t grace = wait_ms < SHRINK_GRACE_MS ? wait_ms : SHRINK_GRACE_MS;
    uv_timer_start(&job->timer, on_shrink_timer, grace, 0);
  }
  client->shrink_asked = 1;
  snprintf(client->shrink_addr, sizeof client->shrink_addr, "%s", msg->addr);
  for (uint32_t i = 0; i < msg->naccused; i++)
    if (msg->accused[i] < job->size && msg->accused[i] != client->rank)
      hoop__rdzv_bit_set(job->accused, msg->accused[i]);
  HOOP__INFO(HOOP_SUBSYS_RDZV, "job '%s': rank %u asks to go on in generation %u%s", job->id,
             client->rank, job->generation + 1, msg->naccused ? " (naming failed ranks)" : "");
  shrink_consider(job);
}

void hoop__rdzv_shrink_member_left(rdzv_job *job) {
  shrink_consider(job);
}
