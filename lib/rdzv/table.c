/* table.c - a job that has all its ranks: ranks assigned (contiguous per host), the rank table
 * sent to every member; then, while it runs, its members' ABORT, BYE and losses relayed as NOTICEs.
 */
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

#include "proto/auth.h"
#include "rdzv/server_impl.h"
#include "util/be.h"
#include "util/netaddr.h"

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
  host_group *groups =
      hoop__rdzv_group_by_host(unrequested, nfree, hoop__rdzv_by_host_then_arrival, &ngroups);
  for (uint32_t g = 0; groups && g < ngroups; g++) {
    for (uint32_t i = 0; i < groups[g].count; i++) {
      while (hoop__rdzv_bit_test(job->taken, next))
        next++;
      hoop__rdzv_bit_set(job->taken, next);
      groups[g].first[i]->rank = (int32_t)next;
    }
  }
  free(unrequested);
  int rc = groups ? 0 : -1;
  free(groups);
  return rc;
}

/* local_rank: position among the members on the same host, by rank; local_size: their count. */
int hoop__rdzv_assign_local_ranks(member_slot **pointers, uint32_t n) {
  uint32_t ngroups;
  host_group *groups =
      hoop__rdzv_group_by_host(pointers, n, hoop__rdzv_by_host_then_rank, &ngroups);
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
  member_slot *slots = hoop__rdzv_job_slots(job, &pointers);
  hoop__table table = {.size = job->size, .rank = 0};
  shared_table *shared = calloc(1, sizeof *shared);
  table.peers = calloc(job->size, sizeof *table.peers);
  int ok = slots && shared && table.peers && assign_ranks(job, slots) == 0 &&
           hoop__rdzv_assign_local_ranks(pointers, job->joined) == 0 &&
           uv_random(NULL, NULL, table.nonce, sizeof table.nonce, 0, NULL) == 0;
  for (uint32_t i = 0; ok && i < job->joined; i++) {
    hoop__peer_entry *peer = &table.peers[slots[i].rank];
    snprintf(peer->host, sizeof peer->host, "%s", job->members[i]->hello.host);
    snprintf(peer->addr, sizeof peer->addr, "%s", job->members[i]->hello.addr);
    peer->local_rank = slots[i].local_rank;
    peer->local_size = slots[i].local_size;
    memcpy(peer->key, job->members[i]->hello.key, sizeof peer->key);
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

void hoop__rdzv_send_table(rdzv_client *client, shared_table *shared, uint32_t rank) {
  rdzv_reply *reply = calloc(1, sizeof *reply);
  if (!reply) {
    HOOP__WARN(HOOP_SUBSYS_RDZV, "out of memory sending the table to %s", client->peer);
    hoop__rdzv_client_close(client);
    return;
  }
  memcpy(reply->head, shared->wire.data, TABLE_HEAD);
  hoop__put_be32(reply->head + TABLE_RANK_AT, rank);
  /* With a token, the server proves it too, to a rank getting its first table (a member of a
   * shrink already knows this server), over the nonce of that rank's HELLO: someone else who took
   * the server's address before it cannot hand ranks a table of its own. */
  const char *token = client->server->token;
  if (token[0] && !client->has_table) {
    if (!shared->digested) {
      hoop__auth_digest((const uint8_t *)shared->wire.data + TABLE_HEAD,
                        shared->wire.len - TABLE_HEAD, shared->digest);
      shared->digested = 1;
    }
    hoop__table_proof proof = {.proof_len = HOOP__AUTH_PROOF};
    hoop__auth_table_proof(token, client->hello.nonce, reply->head + HOOP__WIRE_HEADER_SIZE,
                           shared->digest, proof.proof);
    if (hoop__wire_encode_table_proof(&reply->message, &proof) != 0) {
      HOOP__WARN(HOOP_SUBSYS_RDZV, "out of memory sending the table to %s", client->peer);
      hoop__rdzv_reply_free(reply);
      hoop__rdzv_client_close(client);
      return;
    }
  }
  reply->table = shared;
  reply->keep_open = 1;
  shared->refs++;
  client->rank = rank;
  client->has_table = 1;
  hoop__rdzv_client_send(client, reply);
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
      int rc = uv_write(&reply->req, (uv_stream_t *)&member->tcp, &buf, 1, hoop__rdzv_on_written);
      if (rc == 0) {
        job->server->pending_writes++;
        told++;
        continue;
      }
      why = uv_strerror(rc);
    }
    HOOP__WARN(HOOP_SUBSYS_RDZV, "job '%s': cannot tell rank %u (%s): %s", job->id, member->rank,
               member->peer, why);
    if (reply)
      hoop__rdzv_reply_free(reply);
    if (failed)
      failed[nfailed++] = member;
  }
  HOOP__INFO(HOOP_SUBSYS_RDZV, "job '%s': told %u members: %s", job->id, told, message);
  for (uint32_t i = 0; i < nfailed; i++)
    hoop__rdzv_client_close(failed[i]);
  free(failed);
}

/* A member of a running job closed its connection (or was closed). Without a goodbye its
 * process is gone, or broken: the others are told. The last one to leave ends the job. */
void hoop__rdzv_job_member_left(rdzv_job *job, rdzv_client *client) {
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
      HOOP__WARN(HOOP_SUBSYS_RDZV, "job '%s': rank %u (%s) stopped answering for %d s", job->id,
                 client->rank, client->peer, client->keepalive_s);
    } else {
      snprintf(message, sizeof message, "rank %u lost (rendezvous connection closed)",
               client->rank);
      HOOP__WARN(HOOP_SUBSYS_RDZV, "job '%s': rank %u (%s) closed its connection without a BYE",
                 job->id, client->rank, client->peer);
    }
    job_relay(job, client, HOOP_ERR_PEER_LOST, client->rank, message);
    job->server->losses++;
  } else {
    HOOP__TRACE(HOOP_SUBSYS_RDZV, "job '%s': rank %u left; %u still connected", job->id,
                client->rank, job->joined);
  }
  if (job->joined == 0 && !job->forgotten) {
    HOOP__INFO(HOOP_SUBSYS_RDZV, "job '%s' is over: every rank has left", job->id);
    hoop__rdzv_job_forget(job);
    hoop__rdzv_check_once_done(server);
  } else if (job->shrinking) {
    hoop__rdzv_shrink_member_left(job);
  }
}

/* A member's connection carries nothing but an ABORT for its own rank, a SHRINK, STATS and a BYE.
 * Anything else (or anything after the BYE) closes it; with no goodbye said, that reads as a loss
 * to the others: a member that breaks the protocol is broken. */
void hoop__rdzv_member_refuse(rdzv_client *client, const char *what) {
  client->server->refusals[REFUSED_MALFORMED]++;
  HOOP__WARN(HOOP_SUBSYS_RDZV, "closing rank %u of job '%s' (%s): %s", client->rank,
             client->job->id, client->peer, what);
  hoop__rdzv_client_close(client);
}

static void member_message(rdzv_client *client, const hoop__wire_header *header,
                           const uint8_t *payload) {
  hoop__abort_msg abort_msg;
  hoop__shrink_msg shrink_msg;
  hoop__stats_msg stats_msg;
  char flight[HOOP__WIRE_MAX_FLIGHT + 1];
  if (client->said_goodbye) {
    hoop__rdzv_member_refuse(client, "a message after its BYE or ABORT");
  } else if (header->type == HOOP_MSG_BYE) {
    if (hoop__wire_decode_bye(payload, header->length) != 0) {
      hoop__rdzv_member_refuse(client, "a malformed BYE");
      return;
    }
    client->said_goodbye = 1;
    if (client->job->shrinking)
      hoop__rdzv_shrink_member_left(client->job);
  } else if (header->type == HOOP_MSG_ABORT) {
    if (hoop__wire_decode_abort(payload, header->length, &abort_msg) != 0) {
      hoop__rdzv_member_refuse(client, "a malformed ABORT");
      return;
    }
    if (abort_msg.rank != client->rank) {
      char what[96];
      snprintf(what, sizeof what, "an ABORT in the name of rank %u, not its own", abort_msg.rank);
      hoop__rdzv_member_refuse(client, what);
      return;
    }
    client->said_goodbye = 1;
    char message[HOOP__WIRE_MAX_MESSAGE + 1];
    hoop__buf text = {0};
    hoop__buf_printf(&text, "aborted by rank %u: %s", client->rank, abort_msg.reason);
    /* Cut to what a notice carries. */
    snprintf(message, sizeof message, "%s", text.data ? text.data : "aborted");
    hoop__buf_free(&text);
    job_relay(client->job, client, HOOP_ERR_ABORTED, client->rank, message);
    client->server->aborts++;
    if (client->job && client->job->shrinking)
      hoop__rdzv_shrink_member_left(client->job);
  } else if (header->type == HOOP_MSG_SHRINK) {
    if (hoop__wire_decode_shrink(payload, header->length, &shrink_msg) != 0)
      hoop__rdzv_member_refuse(client, "a malformed SHRINK");
    else
      hoop__rdzv_shrink_request(client, &shrink_msg);
  } else if (header->type == HOOP_MSG_FLIGHT) {
    if (hoop__wire_decode_flight(payload, header->length, flight) != 0)
      hoop__rdzv_member_refuse(client, "a malformed FLIGHT");
    else
      hoop__rdzv_member_flight(client, flight);
  } else if (header->type == HOOP_MSG_STATS) {
    if (hoop__wire_decode_stats(payload, header->length, &stats_msg) != 0)
      hoop__rdzv_member_refuse(client, "a malformed STATS");
    else if (!client->job->shrinking)
      hoop__rdzv_member_stats(client, &stats_msg);
  } else {
    hoop__rdzv_member_refuse(client, "a message type that members do not send");
  }
}

/* Act on every whole message read so far from a member of a running job. */
void hoop__rdzv_handle_member_input(rdzv_client *client) {
  while (!client->closing) {
    hoop__wire_header header;
    int rc =
        hoop__wire_decode_header(client->in, client->inlen, HOOP__WIRE_MAX_CLIENT_PAYLOAD, &header);
    if (rc == 1)
      return;
    if (rc < 0) {
      hoop__rdzv_member_refuse(client, "a malformed header");
      return;
    }
    size_t total = HOOP__WIRE_HEADER_SIZE + header.length;
    if (client->inlen < total)
      return;
    member_message(client, &header, client->in + HOOP__WIRE_HEADER_SIZE);
    memmove(client->in, client->in + total, client->inlen - total);
    client->inlen -= total;
  }
}

void hoop__rdzv_job_complete(rdzv_job *job) {
  hoop__rdzv_server *server = job->server;
  char seconds[32], id[sizeof job->id];
  uint32_t *ranks = calloc(job->size, sizeof *ranks);
  shared_table *shared = ranks ? build_table(job, ranks) : NULL;
  hoop__rdzv_format_seconds(uv_now(server->loop) - job->created_ms, seconds, sizeof seconds);
  snprintf(id, sizeof id, "%s", job->id);
  uint32_t count;
  rdzv_client **members = NULL;
  if (shared) {
    HOOP__INFO(HOOP_SUBSYS_RDZV, "job '%s' complete: %u ranks after %s s", id, job->joined,
               seconds);
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
        hoop__rdzv_send_table(members[i], shared, members[i]->rank);
    } else {
      HOOP__ERROR(HOOP_SUBSYS_RDZV, "job '%s': out of memory sending the table", id);
      while (job->joined > 0 && !server->closing)
        hoop__rdzv_client_close(job->members[0]);
    }
    hoop__rdzv_shared_table_release(shared);
  } else {
    members = hoop__rdzv_job_take_members(job, &count);
    HOOP__ERROR(HOOP_SUBSYS_RDZV, "job '%s': cannot build the rank table", id);
    for (uint32_t i = 0; i < count; i++)
      hoop__rdzv_send_error(members[i], HOOP_ERR_SYSTEM,
                            "rendezvous server: cannot build the rank table of job '%s' "
                            "(out of memory or randomness)",
                            id);
  }
  free(members);
  free(ranks);
  if (server->once)
    server->once_over = 1;
  hoop__rdzv_check_once_done(server);
}
