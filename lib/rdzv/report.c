/* report.c - a member's part in its job's health: the STATS the collectives hand it go to the
 * server on the kept connection, and the server's VIEW that answers each is kept for
 * hoop_comm_stats. */
#include <errno.h>
#include <string.h>
#include <unistd.h>

#include "core/flight.h"
#include "core/log.h"
#include "rdzv/client.h"
#include "rdzv/state.h"
#include "util/clock.h"
#include "util/sockio.h"

/* How long a STATS may take to be handed to the kernel: a few hundred bytes every few seconds
 * find room in the socket's buffer unless the server stopped reading. */
#define STATS_WRITE_WAIT_S 0.1

void hoop__rendezvous_stats(hoop_comm *comm, const hoop__stats_msg *msg) {
  if (comm->rdzv_fd < 0 || comm->rdzv->goodbye)
    return;
  hoop__wbuf out = {0};
  if (hoop__wire_encode_stats(&out, msg) != 0) {
    HOOP__WARN(HOOP_SUBSYS_RDZV, "cannot encode this rank's STATS");
  } else if (hoop__write_full(comm->rdzv_fd, out.data, out.len, hoop__now() + STATS_WRITE_WAIT_S) !=
             0) {
    char why[160];
    snprintf(why, sizeof why, "sending STATS: %s", strerror(errno));
    hoop__rendezvous_drop(comm, why);
  }
  hoop__wbuf_free(&out);
}

/* What this rank is doing, and its last calls: the flight recorder's lines behind a first line
 * naming the rank, its host and process, its running call and whom it waits for. */
void hoop__rendezvous_take_dump(hoop_comm *comm, size_t len) {
  if (hoop__wire_decode_dump(NULL, len) != 0) {
    hoop__rendezvous_drop(comm, "the server sent a malformed DUMP");
    return;
  }
  char text[HOOP__WIRE_MAX_FLIGHT + 1];
  const hoop_comm *caller = comm->net_caller ? comm->net_caller : comm;
  int n;
  if (caller->call) {
    double running = hoop__now() - caller->call_started;
    n = snprintf(text, sizeof text, "rank %d (pid %d on %s): in %s (call #%llu) for %.3f s",
                 comm->rank, (int)getpid(),
                 comm->table.peers ? comm->table.peers[comm->rank].host : "?", caller->call,
                 (unsigned long long)caller->seq, running > 0 ? running : 0);
  } else {
    n = snprintf(text, sizeof text, "rank %d (pid %d on %s): not in a collective", comm->rank,
                 (int)getpid(), comm->table.peers ? comm->table.peers[comm->rank].host : "?");
  }
  if (n > 0 && (size_t)n < sizeof text && comm->waiting_for >= 0)
    n += snprintf(text + n, sizeof text - (size_t)n, ", waiting for rank %d", comm->waiting_for);
  if (n > 0 && (size_t)n + 1 < sizeof text) {
    text[n++] = '\n';
    text[n] = '\0';
    hoop__flight_text(text + n, sizeof text - (size_t)n);
  }
  hoop__wbuf out = {0};
  if (hoop__wire_encode_flight(&out, text) != 0 ||
      hoop__write_full(comm->rdzv_fd, out.data, out.len, hoop__now() + STATS_WRITE_WAIT_S) != 0)
    hoop__rendezvous_drop(comm, "sending FLIGHT failed");
  else
    HOOP__INFO(HOOP_SUBSYS_RDZV,
               "the rendezvous server asked for this rank's flight recorder: sent");
  hoop__wbuf_free(&out);
}

void hoop__rendezvous_take_view(hoop_comm *comm, const uint8_t *payload, size_t len) {
  hoop__view_msg view;
  if (hoop__wire_decode_view(payload, len, (uint32_t)comm->size, &view) != 0) {
    /* Advice, not the job's life: dropping the connection would read as this rank's loss. */
    HOOP__INFO(HOOP_SUBSYS_RDZV, "the rendezvous server sent a VIEW this rank cannot read; kept "
                                 "the last one");
    return;
  }
  pthread_mutex_lock(&comm->rdzv->view_lock);
  comm->rdzv->view = view;
  comm->rdzv->view_at = hoop__now();
  pthread_mutex_unlock(&comm->rdzv->view_lock);
}

double hoop__rendezvous_view(const hoop_comm *comm, hoop__view_msg *view) {
  hoop__rdzv_state *state = comm->rdzv;
  pthread_mutex_lock(&state->view_lock);
  *view = state->view;
  double at = state->view_at;
  pthread_mutex_unlock(&state->view_lock);
  if (at <= 0) {
    memset(view, 0, sizeof *view);
    return -1;
  }
  return hoop__now() - at;
}
