/* rendezvous.h - the client side of the rendezvous protocol: send HELLO, wait for the rank table. */
#ifndef HOOP_RENDEZVOUS_H
#define HOOP_RENDEZVOUS_H

#include <sys/socket.h>

#include "internal.h"
#include "wire.h"

/* Connect to the server at server (retrying while it is not up yet), answer its challenge with
 * comm->token, send hello and wait up to
 * timeout_s (plus a short grace, so that the server's own timeout message arrives first) for the
 * table. On success *table is filled and owned by the caller. On failure the error is recorded on
 * comm: the server's message when it sent one. */
hoop_result hoop__rendezvous_join(hoop_comm *comm, const struct sockaddr *server,
                                  socklen_t server_len, const hoop__hello *hello, double timeout_s,
                                  hoop__table *table);

/* Ask the server for its waiting jobs, proving token (NULL or "": none) if it asks. */
hoop_result hoop__rendezvous_status(const struct sockaddr *server, socklen_t server_len,
                                    double timeout_s, const char *token, hoop__status *status,
                                    char *err, size_t errlen);

#endif /* HOOP_RENDEZVOUS_H */
