/* internal.h - the communicator's private state and the helpers every part of libhoop shares:
 * error recording, deadlines and argument checks. Nothing here is installed. */
#ifndef HOOP_INTERNAL_H
#define HOOP_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "hoop.h"
#include "log.h"
#include "wire.h"

struct hoop__transport_ops;
struct hoop__rdzv_thread;

struct hoop_comm {
  int rank, size, local_rank, local_size;
  char job[HOOP_WIRE_MAX_JOB + 1];
  char rendezvous[HOOP_WIRE_MAX_HOST + 8];
  double timeout_s;
  int tcp_streams;
  char ifname[256];
  hoop__table table;    /* rank -> host, address, local rank */

  const struct hoop__transport_ops *transport;
  void *transport_state;
  struct hoop__rdzv_thread *server; /* the embedded rendezvous server, when this rank hosts it */

  uint64_t seq;          /* collective calls made, for error messages */
  const char *call;      /* the collective running now, for error messages */
  hoop_result failed;    /* sticky: once set, every call is refused */
  char last_error[1024];
  char fail_reason[1024]; /* the message of the failure that set `failed` */

  size_t *block_offset;  /* size entries each: the ring blocks of the running collective */
  size_t *block_length;
  void *scratch;         /* reduction staging, grown on demand */
  size_t scratch_bytes;
};

/* Record a failure on comm and return code. Does not mark the communicator failed. */
hoop_result hoop__set_error(hoop_comm *comm, hoop_result code, const char *fmt, ...)
    HOOP__PRINTF(3, 4);

/* Record a failure that leaves the communicator unusable: later calls are refused. The transport
 * drops its connections so that peers notice at once rather than at their timeout. */
hoop_result hoop__fail(hoop_comm *comm, hoop_result code, const char *fmt, ...) HOOP__PRINTF(3, 4);

/* Seconds on a monotonic clock. */
double hoop__now(void);

/* A buffer of at least bytes in comm->scratch; NULL (with the error recorded) if out of memory. */
void *hoop__scratch(hoop_comm *comm, size_t bytes);

/* Common argument checks and bookkeeping at the start of every collective: returns HOOP_OK, or an
 * error already recorded. */
hoop_result hoop__coll_begin(hoop_comm *comm, const char *call, size_t count, hoop_dtype dtype,
                             int check_dtype);

#endif /* HOOP_INTERNAL_H */
