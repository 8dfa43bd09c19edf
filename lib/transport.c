/* transport.c - the calls collectives make, dispatched to the communicator's transport. */
#include <string.h>

#include "transport.h"

static void stamp(hoop_comm *comm, hoop__request *req, int peer, int is_send, size_t len) {
  req->peer = peer;
  req->is_send = is_send;
  req->pending = 0;
  req->len = len;
  if (comm->check_calls)
    memcpy(req->fingerprint, comm->fingerprint, sizeof req->fingerprint);
  else
    memset(req->fingerprint, 0, sizeof req->fingerprint);
}

hoop_result hoop__isend(hoop_comm *comm, int peer, const void *buf, size_t len,
                        hoop__request *req) {
  stamp(comm, req, peer, 1, len);
  return len == 0 ? HOOP_OK : comm->transport->isend(comm, peer, buf, len, req);
}

hoop_result hoop__irecv(hoop_comm *comm, int peer, void *buf, size_t len, hoop__request *req) {
  stamp(comm, req, peer, 0, len);
  return len == 0 ? HOOP_OK : comm->transport->irecv(comm, peer, buf, len, req);
}

hoop_result hoop__wait(hoop_comm *comm, hoop__request *req) {
  return req->pending == 0 ? HOOP_OK : comm->transport->wait(comm, req);
}

hoop_result hoop__sendrecv(hoop_comm *comm, int to, const void *sendbuf, size_t sendlen, int from,
                           void *recvbuf, size_t recvlen) {
  hoop__request send_req, recv_req;
  hoop_result result = hoop__irecv(comm, from, recvbuf, recvlen, &recv_req);
  if (result == HOOP_OK)
    result = hoop__isend(comm, to, sendbuf, sendlen, &send_req);
  if (result == HOOP_OK)
    result = hoop__wait(comm, &recv_req);
  if (result == HOOP_OK)
    result = hoop__wait(comm, &send_req);
  return result;
}

/* Posted straight to the transport, past the shorthands' shortcut for zero lengths. */
hoop_result hoop__sendrecv_empty(hoop_comm *comm, int to, int from) {
  char none = 0; /* an address for the empty buffers; nothing is read or written there */
  hoop__request send_req, recv_req;
  stamp(comm, &recv_req, from, 0, 0);
  stamp(comm, &send_req, to, 1, 0);
  hoop_result result = comm->transport->irecv(comm, from, &none, 0, &recv_req);
  if (result == HOOP_OK)
    result = comm->transport->isend(comm, to, &none, 0, &send_req);
  if (result == HOOP_OK)
    result = hoop__wait(comm, &recv_req);
  if (result == HOOP_OK)
    result = hoop__wait(comm, &send_req);
  return result;
}
