/* hello.c - a client's first message: a HELLO (join a job) or a STATUS_REQ, each checked against
 * its proof over the connection's challenge when the server has a token. */
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

#include "rdzv/server_impl.h"
#include "util/netaddr.h"

/* ---- requests -------------------------------------------------------------------------------- */

/* The job a HELLO joins, found or created; NULL when the newcomer is refused (its ERROR is on the
 * way). Every check is on the newcomer: its size must be the job's, a requested rank must be free.
 * The decoder already made sure that a requested rank is below the HELLO's own size. */
static rdzv_job *job_for_hello(rdzv_client *client, const hoop__hello *hello) {
  hoop__rdzv_server *server = client->server;
  rdzv_job *job = hoop__rdzv_job_find(server, hello->job);
  if (!job && server->njobs >= server->max_jobs) {
    server->refusals[REFUSED_LIMIT]++;
    HOOP__INFO(HOOP_SUBSYS_RDZV, "refused %s: job '%s' would exceed the limit of %d jobs",
               client->peer, hello->job, server->max_jobs);
    hoop__rdzv_send_error(client, HOOP_ERR_SYSTEM,
                          "the rendezvous server already has %d jobs waiting (its limit); "
                          "job '%s' refused",
                          server->max_jobs, hello->job);
    return NULL;
  }
  if (!job && !(job = hoop__rdzv_job_create(server, hello))) {
    hoop__rdzv_send_error(client, HOOP_ERR_SYSTEM,
                          "rendezvous server: out of memory creating job '%s'", hello->job);
    return NULL;
  }
  if (hello->size != job->size) {
    server->refusals[REFUSED_MISMATCH]++;
    HOOP__INFO(HOOP_SUBSYS_RDZV, "refused %s: job '%s' has %u ranks, the HELLO says %u",
               client->peer, job->id, job->size, hello->size);
    hoop__rdzv_send_error(client, HOOP_ERR_INVALID_ARG,
                          "job '%s' has %u ranks, but this rank says it has %u "
                          "(is the job size the same on every rank?)",
                          job->id, job->size, hello->size);
    return NULL;
  }
  if (hello->rank >= 0 && hoop__rdzv_bit_test(job->taken, (uint32_t)hello->rank)) {
    server->refusals[REFUSED_MISMATCH]++;
    HOOP__INFO(HOOP_SUBSYS_RDZV, "refused %s: rank %d of job '%s' is already taken", client->peer,
               hello->rank, job->id);
    hoop__rdzv_send_error(client, HOOP_ERR_INVALID_ARG,
                          "rank %d of job '%s' is already taken by another rank "
                          "(are two ranks started with the same rank number?)",
                          hello->rank, job->id);
    return NULL;
  }
  return job;
}

/* With a token: 1 if proof (len bytes) is the one for purpose over this connection's challenge
 * (and, for a HELLO, over its fields); else the refusal is logged, its ERROR sent, and 0. */
static int proof_ok(rdzv_client *client, const hoop__hello *hello, const char *purpose,
                    const uint8_t *proof, size_t len) {
  hoop__rdzv_server *server = client->server;
  if (!server->token[0])
    return 1;
  uint8_t expected[HOOP__AUTH_PROOF];
  if (hello) {
    if (hoop__auth_hello_proof(server->token, client->challenge, hello, expected) != 0) {
      hoop__rdzv_send_error(client, HOOP_ERR_SYSTEM, "rendezvous server: out of memory");
      return 0;
    }
  } else {
    hoop__auth_proof(server->token, strlen(server->token), purpose, client->challenge,
                     sizeof client->challenge, NULL, 0, expected);
  }
  if (len == HOOP__AUTH_PROOF && hoop__auth_equal(proof, expected, HOOP__AUTH_PROOF))
    return 1;
  char what[HOOP__WIRE_MAX_JOB + HOOP__WIRE_MAX_HOST + 64] = "a status query";
  if (strcmp(purpose, HOOP__AUTH_DUMP) == 0)
    snprintf(what, sizeof what, "a dump request");
  if (hello)
    snprintf(what, sizeof what, "a rank of job '%s' on host '%s'", hello->job, hello->host);
  HOOP__WARN(HOOP_SUBSYS_RDZV, "refused %s from %s: %s", what, client->peer,
             len ? "wrong token" : "no token");
  server->refusals[REFUSED_AUTH]++;
  hoop__rdzv_send_error(client, HOOP_ERR_AUTH,
                        "authentication failed: %s; the server admits only holders of its token "
                        "(HOOP_TOKEN or HOOP_TOKEN_FILE)",
                        len ? "the proof does not match this server's token"
                            : "no proof of a token was sent");
  return 0;
}

static void handle_hello(rdzv_client *client, const hoop__hello *hello) {
  if (!proof_ok(client, hello, HOOP__AUTH_JOIN, hello->proof, hello->proof_len))
    return;
  if (client->server->require_sealed && !(hello->flags & HOOP__HELLO_SEALED)) {
    client->server->refusals[REFUSED_AUTH]++;
    HOOP__INFO(HOOP_SUBSYS_RDZV, "refused %s: job '%s' rank %d does not seal its connections",
               client->peer, hello->job, hello->rank);
    hoop__rdzv_send_error(client, HOOP_ERR_AUTH,
                          "this rendezvous server admits only ranks that seal their data "
                          "connections: set HOOP_ENCRYPT=1 on every rank (hooprun --encrypt; "
                          "hoopd(8), --require-encrypt)");
    return;
  }
  if (hello->rank == HOOP__HELLO_NEWCOMER) {
    hoop__rdzv_newcomer_hello(client, hello);
    return;
  }
  if (client->server->once_over) {
    client->server->refusals[REFUSED_MISMATCH]++;
    hoop__rdzv_send_error(client, HOOP_ERR_INVALID_ARG,
                          "this rendezvous server served its one job and takes only newcomers "
                          "to it now; job '%s' refused",
                          hello->job);
    return;
  }
  hoop__rdzv_server *server = client->server;
  if (server->only_job[0] &&
      (strcmp(hello->job, server->only_job) != 0 || hello->size != server->only_size)) {
    server->refusals[REFUSED_MISMATCH]++;
    /* A rank's own server: a stranger's HELLO must neither start a job nor end the real one's
     * wait, and learns nothing of it (a real rank of another size is told to compare). */
    HOOP__INFO(HOOP_SUBSYS_RDZV,
               "refused %s: this server hosts one job (%u ranks); the HELLO is for job '%s' of %u",
               client->peer, server->only_size, hello->job, hello->size);
    hoop__rdzv_send_error(client, HOOP_ERR_INVALID_ARG,
                          "this rendezvous server, hosted by a rank, serves one job only, not "
                          "'%s' of %u ranks (are the job id and size the same on every rank?)",
                          hello->job, hello->size);
    return;
  }
  rdzv_job *job = job_for_hello(client, hello);
  if (!job)
    return;
  client->hello = *hello;
  if (hoop__rdzv_job_add_member(job, client) != 0) {
    hoop__rdzv_send_error(client, HOOP_ERR_SYSTEM,
                          "rendezvous server: out of memory joining job '%s'", job->id);
    if (job->joined == 0)
      hoop__rdzv_job_forget(job);
    return;
  }
  uv_timer_stop(&client->timer); /* a member waits for its job, however long that takes */
  server->joins++;
  /* Never drop a member sooner than it would give up on its peers itself. */
  uint32_t own_s = hello->timeout_ms / 1000 + (hello->timeout_ms % 1000 != 0);
  if (own_s > (uint32_t)client->keepalive_s)
    hoop__rdzv_keep_alive(client, own_s > KEEPALIVE_MAX_S ? KEEPALIVE_MAX_S : (int)own_s);
  char who[32] = "a rank";
  if (hello->rank >= 0)
    snprintf(who, sizeof who, "rank %d", hello->rank);
  HOOP__INFO(HOOP_SUBSYS_RDZV, "job '%s': %s joined (%u/%u) from host '%s' (%s)", job->id, who,
             job->joined, job->size, hello->host, client->peer);
  if (job->joined == job->size)
    hoop__rdzv_job_complete(job);
}

/* The hosts that joined, in order of first arrival, with their ranks (as many as a status
 * lists; none when out of memory). */
static void status_hosts(const rdzv_job *job, hoop__job_status *out) {
  member_slot **pointers;
  member_slot *slots = job->joined ? hoop__rdzv_job_slots(job, &pointers) : NULL;
  uint32_t ngroups = 0;
  host_group *groups = slots ? hoop__rdzv_group_by_host(pointers, job->joined,
                                                        hoop__rdzv_by_host_then_arrival, &ngroups)
                             : NULL;
  for (uint32_t g = 0; groups && g < ngroups && g < HOOP__WIRE_MAX_STATUS_HOSTS; g++) {
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

static void fill_job_status(rdzv_job *job, uint64_t now, hoop__job_status *out) {
  uint64_t waited = now - job->created_ms;
  snprintf(out->job, sizeof out->job, "%s", job->id);
  out->size = job->size;
  out->joined = job->joined;
  out->waited_ms = waited > UINT32_MAX ? UINT32_MAX : (uint32_t)waited;
  out->nmissing = hoop__rdzv_missing_ranks(job, out->missing, HOOP__WIRE_MAX_MISSING);
  status_hosts(job, out);
  hoop__rdzv_job_health(job, &out->health);
}

int hoop__rdzv_server_status(hoop__rdzv_server *server, hoop__status *status) {
  memset(status, 0, sizeof *status);
  uint32_t jobs = (uint32_t)server->njobs + (uint32_t)server->nrunning;
  uint32_t listed = jobs < HOOP__WIRE_MAX_STATUS_JOBS ? jobs : HOOP__WIRE_MAX_STATUS_JOBS;
  status->jobs = calloc(listed ? listed : 1, sizeof *status->jobs);
  if (!status->jobs)
    return -1;
  uint64_t now = uv_now(server->loop);
  for (int running = 0; running < 2; running++)
    for (rdzv_job *job = server->jobs; job && status->njobs < listed; job = job->next)
      if (job->running == running && !job->forgotten && job->joined > 0)
        fill_job_status(job, now, &status->jobs[status->njobs++]);
  return 0;
}

/* Reply with the jobs waiting, oldest first, then the jobs running with their health (as many
 * as a STATUS holds). */
static void send_status(rdzv_client *client) {
  hoop__rdzv_server *server = client->server;
  hoop__status status = {0};
  rdzv_reply *reply = calloc(1, sizeof *reply);
  int rc = reply && hoop__rdzv_server_status(server, &status) == 0
               ? hoop__wire_encode_status(&reply->message, &status)
               : -1;
  hoop__status_free(&status);
  if (rc != 0) {
    HOOP__WARN(HOOP_SUBSYS_RDZV, "out of memory answering the status query of %s", client->peer);
    if (reply)
      hoop__rdzv_reply_free(reply);
    hoop__rdzv_client_close(client);
    return;
  }
  HOOP__INFO(HOOP_SUBSYS_RDZV, "status query from %s: %d jobs waiting, %d running", client->peer,
             server->njobs, server->nrunning);
  hoop__rdzv_client_send(client, reply);
}

/* A malformed request closes its own connection and nothing else. */
void hoop__rdzv_refuse_malformed(rdzv_client *client, const char *what) {
  HOOP__WARN(HOOP_SUBSYS_RDZV, "closing %s: %s", client->peer, what);
  client->server->refusals[REFUSED_MALFORMED]++;
  hoop__rdzv_client_close(client);
}

/* Act on the bytes read so far once they hold the one request a connection may carry. */
void hoop__rdzv_handle_input(rdzv_client *client) {
  hoop__wire_header header;
  int rc =
      hoop__wire_decode_header(client->in, client->inlen, HOOP__WIRE_MAX_CLIENT_PAYLOAD, &header);
  if (rc == 1)
    return;
  if (rc < 0) {
    HOOP__WARN(HOOP_SUBSYS_RDZV,
               "closing %s: malformed header "
               "(magic 0x%08x, version %u, type %u, length %u)",
               client->peer, header.magic, header.version, header.type, header.length);
    client->server->refusals[REFUSED_MALFORMED]++;
    hoop__rdzv_client_close(client);
    return;
  }
  size_t total = HOOP__WIRE_HEADER_SIZE + header.length;
  if (client->inlen < total)
    return;
  if (client->inlen > total) {
    hoop__rdzv_refuse_malformed(client, "bytes past its request (one request per connection)");
    return;
  }
  const uint8_t *payload = client->in + HOOP__WIRE_HEADER_SIZE;
  client->inlen = 0;
  hoop__hello hello;
  hoop__status_req request;
  hoop__dump_req dump;
  if (client->dump) { /* reading stopped with its request: cannot happen */
    hoop__rdzv_refuse_malformed(client, "a request after its DUMP_REQ");
  } else if (header.type == HOOP_MSG_DUMP_REQ) {
    if (hoop__wire_decode_dump_req(payload, header.length, &dump) != 0)
      hoop__rdzv_refuse_malformed(client, "malformed DUMP_REQ");
    else if (proof_ok(client, NULL, HOOP__AUTH_DUMP, dump.proof, dump.proof_len))
      hoop__rdzv_dump_request(client, &dump);
  } else if (header.type == HOOP_MSG_HELLO) {
    if (hoop__wire_decode_hello(payload, header.length, &hello) != 0)
      hoop__rdzv_refuse_malformed(client, "malformed HELLO");
    else
      handle_hello(client, &hello);
  } else if (header.type == HOOP_MSG_STATUS_REQ) {
    if (hoop__wire_decode_status_req(payload, header.length, &request) != 0)
      hoop__rdzv_refuse_malformed(client, "malformed STATUS_REQ");
    else if (proof_ok(client, NULL, HOOP__AUTH_STATUS, request.proof, request.proof_len)) {
      client->server->status_queries++;
      send_status(client);
    }
  } else {
    hoop__rdzv_refuse_malformed(client, "a message type that clients do not send");
  }
}
