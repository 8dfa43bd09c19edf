/* trace.h - HOOP_TRACE=FILE: a timeline of every call, per rank, in the Chrome trace event format
 * (JSON), which Perfetto and chrome://tracing open: each call's post and completion as an async
 * span on the rank's "requests" track, each collective's run (its bytes, count, dtype, algorithm,
 * transport and the time it waited for peers) as a complete event on its "collectives" track, and
 * each wait for a peer of 10 us or more as a complete event on its "waits" track, naming the peer:
 * a view of the job's files shows whom each rank waited for, and when. */
#ifndef HOOP__TRACE_H
#define HOOP__TRACE_H

#include <stddef.h>
#include <stdint.h>

#include "core/internal.h"

/* Read HOOP_TRACE and open this rank's file, FILE.<rank> (after the rank is known); transports
 * names those that serve its peers, for the events ("shm+tcp"). HOOP_OK, or the error recorded
 * when the file cannot be written. */
hoop_result hoop__trace_open(hoop_comm *comm, const char *transports);
/* Close the file, ending the JSON array (hoop_finalize). */
void hoop__trace_close(hoop_comm *comm);

static inline int hoop__tracing(const hoop_comm *comm) {
  return comm->trace != NULL;
}

/* A call posted (blocking calls too) and completed, with hoop__now()'s times; id is the call's
 * request number. */
void hoop__trace_post(hoop_comm *comm, uint64_t id, const char *call, size_t bytes, double at);
void hoop__trace_done(hoop_comm *comm, uint64_t id, const char *call, hoop_result result,
                      double at);
/* Waits shorter than this are not traced: a spinning wait of a small call would add an event per
 * message. */
#define HOOP__TRACE_WAIT_MIN_S 10e-6
/* This rank waited for peer (comm's rank) from start to end, for a message of bytes. */
void hoop__trace_wait(hoop_comm *comm, int peer, size_t bytes, double start, double end);
/* A collective ran from start to end on this rank. */
void hoop__trace_run(hoop_comm *comm, const char *call, size_t count, hoop_dtype dtype,
                     size_t bytes, const char *algorithm, hoop_result result, double start,
                     double end);

#endif /* HOOP__TRACE_H */
