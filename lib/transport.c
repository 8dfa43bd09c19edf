/* transport.c - the calls collectives make, dispatched to the communicator's transport. */
#include "transport.h"

hoop_result hoop__isend(hoop_comm *comm, int peer, const void *buf, size_t len,
                        hoop__request *req) {
  req->peer = peer;
  req->is_send = 1;
  req->pending = 0;
  return len == 0 ? HOOP_OK : comm->transport->isend(comm, peer, buf, len, req);
}

hoop_result hoop__irecv(hoop_comm *comm, int peer, void *buf, size_t len, hoop__request *req) {
  req->peer = peer;
  req->is_send = 0;
  req->pending = 0;
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
