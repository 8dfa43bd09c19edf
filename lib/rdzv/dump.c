/* dump.c - hoopd --dump: a running job's flight recorders, fetched from every member through the
 * connections they keep, without stopping the job. The server sends each member DUMP; a member
 * answers FLIGHT from its next look at the connection (inside a call's wait, or at its next call's
 * start); the requester gets DUMP_REPLY once all answered or HOOP__DUMP_WAIT_MS passed, each
 * member that did not answer named with why that may be. One dump per job at a time. */
#include <stdlib.h>
#include <string.h>

#include "rdzv/server_impl.h"

struct rdzv_dump {
  uv_timer_t timer;
  hoop__rdzv_server *server;
  rdzv_job *job;          /* NULL once the job is forgotten */
  rdzv_client *requester; /* NULL once it closed */
  hoop__dump_reply reply; /* an entry per rank of the job */
  uint8_t *answered;
  uint32_t waiting;
  int finished;
};

static void dump_closed(uv_handle_t *handle) {
  struct rdzv_dump *dump = handle->data;
  hoop__rdzv_server *server = dump->server;
  hoop__dump_reply_free(&dump->reply);
  free(dump->answered);
  free(dump);
  hoop__rdzv_handle_closed(server);
}

/* Reply to the requester (if still there) and let the dump go. */
static void finish(struct rdzv_dump *dump) {
  if (dump->finished)
    return;
  dump->finished = 1;
  uv_timer_stop(&dump->timer);
  if (dump->job)
    dump->job->dump = NULL;
  rdzv_client *requester = dump->requester;
  if (requester) {
    requester->dump = NULL;
    /* Each text cut so that the whole reply stays within a message's bound. */
    size_t each = dump->reply.n ? (HOOP__WIRE_MAX_PAYLOAD - 64) / dump->reply.n - 6 : 0;
    rdzv_reply *reply = calloc(1, sizeof *reply);
    if (!reply || hoop__wire_encode_dump_reply(&reply->message, &dump->reply, each) != 0) {
      if (reply)
        hoop__rdzv_reply_free(reply);
      hoop__rdzv_send_error(requester, HOOP_ERR_SYSTEM, "rendezvous server: out of memory");
    } else {
      HOOP__INFO(HOOP_SUBSYS_RDZV, "dump of job '%s' for %s: %u of %u ranks answered",
                 dump->job ? dump->job->id : "(gone)", requester->peer,
                 dump->reply.n - dump->waiting, dump->reply.n);
      hoop__rdzv_client_send(requester, reply);
    }
  }
  uv_close((uv_handle_t *)&dump->timer, dump_closed);
}

static void on_timer(uv_timer_t *timer) {
  finish(timer->data);
}

/* The running job of that id, the latest to start should there be several (an id is free again
 * for a new job once its job runs). */
static rdzv_job *running_job(hoop__rdzv_server *server, const char *id) {
  rdzv_job *found = NULL;
  for (rdzv_job *job = server->jobs; job; job = job->next)
    if (job->running && !job->forgotten && strcmp(job->id, id) == 0)
      found = job;
  return found;
}

void hoop__rdzv_dump_request(rdzv_client *client, const hoop__dump_req *req) {
  hoop__rdzv_server *server = client->server;
  rdzv_job *job = running_job(server, req->job);
  if (!job) {
    hoop__rdzv_send_error(client, HOOP_ERR_INVALID_ARG,
                          "no job '%s' is running on this rendezvous server", req->job);
    return;
  }
  if (job->dump) {
    hoop__rdzv_send_error(client, HOOP_ERR_INVALID_ARG,
                          "a dump of job '%s' is on its way already; ask again in %d s", req->job,
                          HOOP__DUMP_WAIT_MS / 1000);
    return;
  }
  struct rdzv_dump *dump = calloc(1, sizeof *dump);
  hoop__dump_entry *entries = calloc(job->size, sizeof *entries);
  uint8_t *answered = calloc(job->size, 1);
  if (!dump || !entries || !answered) {
    free(dump);
    free(entries);
    free(answered);
    hoop__rdzv_send_error(client, HOOP_ERR_SYSTEM, "rendezvous server: out of memory");
    return;
  }
  for (uint32_t r = 0; r < job->size; r++) {
    entries[r].rank = r;
    snprintf(entries[r].text, sizeof entries[r].text,
             "(not connected to the rendezvous server: it left the job, or never kept the "
             "connection)\n");
  }
  dump->server = server;
  dump->job = job;
  dump->requester = client;
  dump->reply = (hoop__dump_reply){.n = job->size, .entries = entries};
  dump->answered = answered;
  uv_timer_init(server->loop, &dump->timer);
  dump->timer.data = dump;
  server->open_handles++;
  job->dump = dump;
  client->dump = dump;
  uv_timer_stop(&client->timer);             /* the dump's own timer bounds the wait */
  uv_read_stop((uv_stream_t *)&client->tcp); /* one request per connection: no second dump */
  /* A send that fails at once closes its member, which leaves the job's list (and may end the
   * job, and with it this dump): ask from a copy, and look at the dump after. */
  uint32_t count = job->joined;
  rdzv_client **members = malloc((count ? count : 1) * sizeof *members);
  if (members)
    memcpy(members, job->members, count * sizeof *members);
  for (uint32_t i = 0; members && i < count && !dump->finished; i++) {
    rdzv_client *member = members[i];
    if (member->said_goodbye || !member->has_table || member->closing || member->rank >= job->size)
      continue;
    snprintf(entries[member->rank].text, sizeof entries[member->rank].text,
             "(no answer within %d s: the rank is not inside a hoop call, or its host is slow)\n",
             HOOP__DUMP_WAIT_MS / 1000);
    rdzv_reply *ask = calloc(1, sizeof *ask);
    if (!ask || hoop__wire_encode_dump(&ask->message) != 0) {
      if (ask)
        hoop__rdzv_reply_free(ask);
      continue;
    }
    ask->keep_open = 1;
    dump->waiting++;
    hoop__rdzv_client_send(member, ask);
  }
  free(members);
  if (dump->finished)
    return;
  HOOP__INFO(HOOP_SUBSYS_RDZV, "dump of job '%s' for %s: asked %u ranks", job->id, client->peer,
             dump->waiting);
  if (dump->waiting == 0)
    finish(dump);
  else
    uv_timer_start(&dump->timer, on_timer, HOOP__DUMP_WAIT_MS, 0);
}

void hoop__rdzv_member_flight(rdzv_client *member, const char *text) {
  rdzv_job *job = member->job;
  struct rdzv_dump *dump = job ? job->dump : NULL;
  if (!dump || member->rank >= dump->reply.n || dump->answered[member->rank])
    return; /* a late answer to a dump that is over */
  dump->answered[member->rank] = 1;
  snprintf(dump->reply.entries[member->rank].text, sizeof dump->reply.entries[member->rank].text,
           "%s", text);
  if (--dump->waiting == 0)
    finish(dump);
}

void hoop__rdzv_dump_forget_job(rdzv_job *job) {
  if (job->dump) {
    job->dump->job = NULL;
    finish(job->dump);
  }
}

void hoop__rdzv_dump_forget_requester(rdzv_client *client) {
  if (client->dump) {
    client->dump->requester = NULL;
    client->dump = NULL;
  }
}
