/* client.h - the client side of the rendezvous protocol: send HELLO, wait for the rank table,
 * then keep the connection while the communicator lives: ABORT and BYE go out on it, the server's
 * NOTICEs of other ranks' aborts and losses come in. */
#ifndef HOOP__RENDEZVOUS_H
#define HOOP__RENDEZVOUS_H

#include <sys/socket.h>

#include "core/internal.h"
#include "proto/wire.h"

/* Connect to the server at server (retrying while it is not up yet), answer its challenge with
 * comm->token, send hello and wait up to
 * timeout_s (plus a short grace, so that the server's own timeout message arrives first) for the
 * table. On success *table is filled and owned by the caller, and the connection is kept in
 * comm->rdzv_fd. On failure the error is recorded on comm: the server's message when it sent
 * one. */
hoop_result hoop__rendezvous_join(hoop_comm *comm, const struct sockaddr *server,
                                  socklen_t server_len, const hoop__hello *hello, double timeout_s,
                                  hoop__table *table);

/* Ask the server for its waiting jobs, proving token (NULL or "": none) if it asks. */
hoop_result hoop__rendezvous_status(const struct sockaddr *server, socklen_t server_len,
                                    double timeout_s, const char *token, hoop__status *status,
                                    char *err, size_t errlen);

/* Ask the server for the flight recorders of every member of the running job `job` (hoopd
 * --dump), proving token (NULL or "": none) if it asks; the reply comes once every member
 * answered or the server's HOOP__DUMP_WAIT_MS passed, so timeout_s should be longer. */
hoop_result hoop__rendezvous_dump(const struct sockaddr *server, socklen_t server_len,
                                  double timeout_s, const char *token, const char *job,
                                  hoop__dump_reply *reply, char *err, size_t errlen);

/* The kept connection, for a transport's wait to poll along with its own descriptors (-1: none).
 * When it is readable (or in error), the wait calls hoop__rendezvous_check. */
int hoop__rendezvous_fd(const hoop_comm *comm);

/* Take what the server sent without waiting: a NOTICE fails comm with HOOP_ERR_ABORTED ("aborted
 * by rank R: reason", the data path's words) or HOOP_ERR_PEER_LOST naming the rank, which is
 * returned; else HOOP_OK. A closed, broken or misbehaving connection is dropped quietly (logged):
 * a server that goes away, or rank 0 hosting it finalizing first, is no failure of the job. */
hoop_result hoop__rendezvous_check(hoop_comm *comm);

/* Whether the server's NOTICE of another rank's abort waits on the kept connection: reads what
 * has come, waiting up to wait_s for the next message, and takes none of them (the next
 * hoop__rendezvous_check does). A peer that aborts tells the server before its data connections
 * close, and a close seen first is no reason to call it lost: its own words are on their way. */
int hoop__rendezvous_abort_pending(hoop_comm *comm, double wait_s);

/* hoop_abort's message to the server, which relays it to every other rank: ABORT {this rank,
 * comm->abort_reason}, written within a bounded time (the server may be gone or stuck); best
 * effort. The abort hook (core/error.c) of a communicator that keeps the connection. */
void hoop__rendezvous_abort(hoop_comm *comm);

/* hoop_comm_shrink's exchange: send msg (SHRINK) on the kept connection and wait until deadline
 * for the next generation's TABLE, passing over the server's NOTICEs about the old one. HOOP_OK
 * with *table filled (owned by the caller); else the error is recorded on comm: the server's
 * ERROR (this rank was left out, the server ran out of memory), a connection closed or broken
 * (then dropped), or the deadline. */
hoop_result hoop__rendezvous_shrink(hoop_comm *comm, const hoop__shrink_msg *msg, double deadline,
                                    hoop__table *table);

/* The client's state of a communicator (rdzv/state.h), made with it (NULL: out of memory) and
 * freed with it last. */
hoop__rdzv_state *hoop__rendezvous_state_new(void);
void hoop__rendezvous_state_free(hoop_comm *comm);

/* hoop_comm_shrink's next generation takes the kept connection, and what was read on it and not
 * yet taken, from the one before (which is left without). */
void hoop__rendezvous_hand_over(hoop_comm *to, hoop_comm *from);

/* Why the kept connection went, once it did: the server's code when it was an ERROR (the rank
 * left out), else 0; *why, the words ("" while it is kept). */
hoop_result hoop__rendezvous_lost(const hoop_comm *comm, const char **why);

/* The newcomers waiting to join, as the server last said (PENDING). */
int hoop__rendezvous_newcomers(const hoop_comm *comm);

/* The job's communicator's STATS (coll/tally.c) on the kept connection, written within a short
 * time or the connection dropped (logged); nothing without a connection. The server answers with a
 * VIEW, which a later look at the connection takes in. */
void hoop__rendezvous_stats(hoop_comm *comm, const hoop__stats_msg *msg);

/* The server's last VIEW into *view, and how many seconds ago it came: -1 (and *view emptied)
 * when none came. Any thread. */
double hoop__rendezvous_view(const hoop_comm *comm, hoop__view_msg *view);

/* At finalize: BYE (unless an ABORT went out), so that closing is no loss; then close. */
void hoop__rendezvous_leave(hoop_comm *comm);

#endif /* HOOP__RENDEZVOUS_H */
