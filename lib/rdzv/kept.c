/* kept.c - the kept rendezvous connection's state (rdzv/state.h), and reading ahead on it for an
 * abort's NOTICE (the rest of the connection's life is client.c's). */
#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "rdzv/client.h"
#include "rdzv/state.h"

hoop__rdzv_state *hoop__rendezvous_state_new(void) {
  hoop__rdzv_state *state = calloc(1, sizeof(hoop__rdzv_state));
  if (state && pthread_mutex_init(&state->view_lock, NULL) != 0) {
    free(state);
    return NULL;
  }
  return state;
}

void hoop__rendezvous_state_free(hoop_comm *comm) {
  if (comm->rdzv)
    pthread_mutex_destroy(&comm->rdzv->view_lock);
  free(comm->rdzv);
  comm->rdzv = NULL;
}

void hoop__rendezvous_hand_over(hoop_comm *to, hoop_comm *from) {
  to->rdzv_fd = from->rdzv_fd;
  if (to->rdzv_fd >= 0)
    hoop__hook_register(to, HOOP__HOOK_ABORT, hoop__rendezvous_abort);
  to->rdzv->inlen = from->rdzv->inlen;
  memcpy(to->rdzv->in, from->rdzv->in, from->rdzv->inlen);
  from->rdzv_fd = -1;
  from->rdzv->inlen = 0;
}

hoop_result hoop__rendezvous_lost(const hoop_comm *comm, const char **why) {
  *why = comm->rdzv->lost;
  return comm->rdzv->lost_code;
}

int hoop__rendezvous_newcomers(const hoop_comm *comm) {
  return atomic_load(&comm->rdzv->newcomers);
}

/* Whether the whole messages in comm->rdzv->in hold an abort's NOTICE; *count: how many there
 * are. */
static int abort_in_buffer(const hoop_comm *comm, int *count) {
  *count = 0;
  for (size_t at = 0; at < comm->rdzv->inlen;) {
    hoop__wire_header header;
    if (hoop__wire_decode_header(comm->rdzv->in + at, comm->rdzv->inlen - at,
                                 HOOP__WIRE_MAX_NOTICE_PAYLOAD, &header) != 0 ||
        comm->rdzv->inlen - at < HOOP__WIRE_HEADER_SIZE + header.length)
      return 0;
    hoop__notice notice;
    if (header.type == HOOP_MSG_NOTICE &&
        hoop__wire_decode_notice(comm->rdzv->in + at + HOOP__WIRE_HEADER_SIZE, header.length,
                                 &notice) == 0 &&
        notice.code == (uint32_t)HOOP_ERR_ABORTED)
      return 1;
    (*count)++;
    at += HOOP__WIRE_HEADER_SIZE + header.length;
  }
  return 0;
}

int hoop__rendezvous_abort_pending(hoop_comm *comm, double wait_s) {
  double deadline = hoop__now() + wait_s;
  int before = -1, count;
  while (comm->rdzv_fd >= 0) {
    if (abort_in_buffer(comm, &count))
      return 1;
    if (before >= 0 && count > before)
      return 0; /* news, and not an abort */
    if (before < 0)
      before = count;
    if (comm->rdzv->inlen == sizeof comm->rdzv->in)
      return 0;
    ssize_t n = recv(comm->rdzv_fd, comm->rdzv->in + comm->rdzv->inlen,
                     sizeof comm->rdzv->in - comm->rdzv->inlen, MSG_DONTWAIT);
    if (n > 0) {
      comm->rdzv->inlen += (size_t)n;
      continue;
    }
    if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
      return 0; /* closed or broken: hoop__rendezvous_check says so */
    double left = deadline - hoop__now();
    struct pollfd pfd = {.fd = comm->rdzv_fd, .events = POLLIN};
    if (left <= 0 || poll(&pfd, 1, (int)(left * 1000) + 1) == 0)
      return 0;
  }
  return 0;
}
