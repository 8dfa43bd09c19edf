/* dispatch.c - what every collective does around its algorithm: refuse a call on a failed or
 * aborting communicator, check the arguments, count the call and write its fingerprint, record it
 * in the flight recorder, and at its end mark the communicator failed if the call failed. */
#include <stdint.h>
#include <string.h>

#include "coll/coll.h"
#include "core/fingerprint.h"
#include "core/flight.h"
#include "rdzv/client.h"

/* How often a collective, at its start, reads the rendezvous connection for notices. */
#define RDZV_LOOK_EVERY_S 0.001

hoop_result hoop__coll_begin(hoop_comm *comm, const char *call, size_t count, hoop_dtype dtype,
                             int check_dtype) {
  if (!comm)
    return HOOP_ERR_INVALID_ARG;
  pthread_mutex_lock(&comm->call_lock);
  hoop__check_abort(comm);
  /* Another rank's abort or loss that the server told of since the last call fails this one.
   * Looking costs a system call, which back-to-back small calls would pay every time, so calls
   * look at most once per RDZV_LOOK_EVERY_S; a call that waits polls the connection anyway. */
  double now = hoop__now();
  if (now - comm->rdzv_looked_at >= RDZV_LOOK_EVERY_S) {
    comm->rdzv_looked_at = now;
    hoop__rendezvous_check(comm);
  }
  if (comm->failed)
    return hoop__set_error(comm,
                           comm->failed == HOOP_ERR_ABORTED ? HOOP_ERR_ABORTED : HOOP_ERR_FAILED,
                           "%s refused: the communicator failed earlier: %s", call,
                           comm->fail_reason[0] ? comm->fail_reason : hoop_strerror(comm->failed));
  if (check_dtype && hoop_dtype_size(dtype) == 0)
    return hoop__set_error(comm, HOOP_ERR_INVALID_ARG, "%s: unknown dtype %d", call, (int)dtype);
  if (check_dtype && count > SIZE_MAX / hoop_dtype_size(dtype) / (size_t)comm->size)
    return hoop__set_error(comm, HOOP_ERR_INVALID_ARG, "%s: count %zu is too large", call, count);
  comm->call = call;
  comm->seq++;
  comm->call_started = now;
  comm->stall_warned = 0;
  hoop__fingerprint_encode(comm, call, count, dtype, -1, -1);
  comm->flight_slot = hoop__flight_begin(comm->rank, comm->seq, call,
                                         check_dtype ? count * hoop_dtype_size(dtype) : 0);
  return HOOP_OK;
}

void hoop__coll_describe(hoop_comm *comm, int op, int root) {
  hoop__fingerprint_encode(comm, comm->call, hoop__fingerprint_count(comm->fingerprint),
                           (hoop_dtype)comm->fingerprint[9], op, root);
}

hoop_result hoop__coll_end(hoop_comm *comm, hoop_result result) {
  if (!comm)
    return result;
  /* A call that failed half way may have left requests of its stack frame queued in the
   * transport: failing the communicator drops them. Argument errors happen before any post. */
  if (result != HOOP_OK && result != HOOP_ERR_INVALID_ARG && !comm->failed) {
    char message[sizeof comm->last_error];
    memcpy(message, comm->last_error, sizeof message);
    hoop__fail(comm, result, "%s", message);
  }
  if (comm->call)
    hoop__flight_end(comm->flight_slot, result);
  comm->call = NULL;
  pthread_mutex_unlock(&comm->call_lock);
  if (atomic_load(&comm->abort_requested) == 1 && pthread_mutex_trylock(&comm->call_lock) == 0) {
    hoop__check_abort(comm);
    pthread_mutex_unlock(&comm->call_lock);
  }
  return result;
}
