/* comm.h - the communicator's life, the top floor (lib/comm/): hoop_init's steps (comm.c), which
 * hoop_comm_shrink and hoop_comm_grow take again (shrink.c), and sub-communicators (split.c). It
 * calls every floor below; none of them calls it. */
#ifndef HOOP__COMM_H
#define HOOP__COMM_H

#include "core/internal.h"

/* comm.c's steps of hoop_init, which hoop_comm_shrink (comm/shrink.c) takes again. */
hoop_comm *hoop__comm_new(void);
hoop_result hoop__comm_read_checks(hoop_comm *comm);
hoop_result hoop__comm_resolve_server(hoop_comm *comm, struct sockaddr_storage *addr,
                                      socklen_t *addrlen, char *host, size_t hostlen, int *port);
void hoop__comm_derive_nonce(hoop_comm *comm);
hoop_result hoop__comm_connect_ring(hoop_comm *comm);
void hoop__comm_log_config(const hoop_comm *comm);
/* The settings a communicator made from another keeps (comm/shrink.c): the job, the rendezvous,
 * the interface, the transport mode, the timeout, the TCP streams and the call checks; not the
 * token. */
void hoop__comm_copy_settings(hoop_comm *to, const hoop_comm *from);

/* hoop_comm_shrink on a sub-communicator (comm/split.c): its members that survive in its net's
 * successor, as a view of that one under the same channel. */
hoop_result hoop__view_shrink(hoop_comm *view, hoop_comm **newcomm);

#endif /* HOOP__COMM_H */
