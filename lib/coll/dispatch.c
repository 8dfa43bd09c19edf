/* dispatch.c - the one entry every collective goes through: refuse a call on a failed or aborting
 * communicator, check the arguments, count the call and write its fingerprint, record it in the
 * flight recorder; settle the trivial cases (no data, one rank); choose the algorithm (tune.c) and
 * run it, on host copies of device buffers (mem/stage.c); at the end mark the communicator failed
 * if the call failed. */
#include <stdint.h>
#include <string.h>

#include "coll/coll.h"
#include "coll/paths.h"
#include "coll/state.h"
#include "core/fingerprint.h"
#include "core/flight.h"
#include "core/trace.h"
#include "mem/stage.h"
#include "rdzv/client.h"

/* Payloads from which a call's start and end are read from the clock even when it never waited:
 * copying them takes time worth recording. */
#define FLIGHT_CLOCK_BYTES (64 * 1024)

/* How often a collective, at its start, reads the rendezvous connection for notices. */
#define RDZV_LOOK_EVERY_S 0.001

/* The dtype is known and count elements of it fit in memory once per rank: checked when a call is
 * posted (hoop__coll_validate), and when it runs (coll_begin) if the post did not check it. */
static hoop_result check_dtype_count(hoop_comm *comm, const char *call, size_t count,
                                     hoop_dtype dtype) {
  size_t esize = hoop_dtype_size(dtype), total;
  if (esize == 0)
    return hoop__set_error(comm, HOOP_ERR_INVALID_ARG, "%s: unknown dtype %d", call, (int)dtype);
  /* Overflow checks, not divisions: two of those cost a small call 20 ns. */
  if (__builtin_mul_overflow(count, esize, &total) ||
      __builtin_mul_overflow(total, (size_t)comm->size, &total))
    return hoop__set_error(comm, HOOP_ERR_INVALID_ARG, "%s: count %zu is too large", call, count);
  return HOOP_OK;
}

/* op and root: -1 when the call has none (they go into the fingerprint, with the name's tag).
 * check_dtype: unless the post checked them already (hoop__coll_validate). */
static hoop_result coll_begin(hoop_comm *comm, const char *call, hoop__coll which, size_t count,
                              hoop_dtype dtype, int has_data, int check_dtype, int op, int root,
                              uint32_t name_tag, int compress) {
  hoop__check_abort(comm);
  /* Another rank's abort or loss that the server told of since the last call fails this one.
   * Looking costs a system call, which back-to-back small calls would pay every time, so calls
   * look at most once per RDZV_LOOK_EVERY_S (at the clock's tick); a call that waits polls the
   * connection anyway. The coarse clock serves the stall warning and the flight recorder too. */
  double now = hoop__now_coarse();
  if (now - comm->coll->rdzv_looked_at >= RDZV_LOOK_EVERY_S) {
    comm->coll->rdzv_looked_at = now;
    hoop__net_enter(comm); /* views' threads read it too, while they drive net's transports */
    hoop__rendezvous_check(comm);
    hoop__coll_tally_report(comm);
    hoop__net_leave(comm);
  }
  if (hoop__net_failed(comm))
    return hoop__refuse_failed(comm, call);
  hoop_result result;
  if (check_dtype && (result = check_dtype_count(comm, call, count, dtype)) != HOOP_OK)
    return result;
  comm->call = call;
  comm->seq++;
  comm->call_started = now;
  comm->call_came = now != comm->call_ended ? hoop__now() : 0;
  comm->stall_warned = 0;
  comm->call_waited = 0;
  comm->call_wait_ns = 0;
  size_t bytes = has_data ? count * hoop_dtype_size(dtype) : 0;
  comm->call_clock_start = comm->call_clock_last = bytes >= FLIGHT_CLOCK_BYTES ? hoop__now() : 0;
  hoop__fingerprint_encode(comm, which, count, dtype, op, root, name_tag, compress);
  comm->coll->flight_slot = hoop__flight_begin(comm->rank, comm->seq, call, bytes, now);
  return HOOP_OK;
}

static hoop_result coll_end(hoop_comm *comm, hoop_result result, const hoop__coll_args *args) {
  size_t bytes = args->bytes;
  /* A call that failed half way may have left requests of its stack frame queued in the
   * transport: failing the communicator drops them. Argument errors happen before any post. */
  if (result != HOOP_OK && result != HOOP_ERR_INVALID_ARG)
    hoop__fail_as_recorded(comm, result);
  /* A small call that found every message ready took no time worth a clock reading: the flight
   * recorder shows it ended when it began. Others end on the coarse clock the call began on
   * (5 ns; durations to the kernel's tick, a few ms, which is what a hung call's diagnosis
   * needs). */
  if (comm->call) {
    double end = comm->call_waited || bytes >= FLIGHT_CLOCK_BYTES || result != HOOP_OK
                     ? hoop__now_coarse()
                     : comm->call_started;
    hoop__flight_end(comm->coll->flight_slot, result, end);
    comm->call_ended = end;
    hoop__board_note_call(comm);
    /* A small call's time ends with its last wait: a clock reading would cost it 20 ns. */
    double last = bytes >= FLIGHT_CLOCK_BYTES ? hoop__now() : comm->call_clock_last;
    hoop__coll_tally(comm, args->coll, bytes,
                     comm->call_clock_start > 0 && last > comm->call_clock_start
                         ? last - comm->call_clock_start
                         : 0);
  }
  comm->call = NULL;
  return result;
}

/* ---- the collectives ------------------------------------------------------------------------ */

/* What sets one collective apart before its algorithm runs. */
typedef struct collective {
  const char *call;
  int has_data; /* count and dtype are checked, and count 0 has its own path */
  /* Arguments the common checks do not cover; HOOP_OK or the error recorded. */
  hoop_result (*check)(hoop_comm *comm, const hoop__coll_args *args, const char *call);
  /* Run before the algorithm, and as the whole call on one rank (NULL: nothing). */
  hoop_result (*prepare)(hoop_comm *comm, const hoop__coll_args *args);
} collective;

hoop_result hoop__check_op(hoop_comm *comm, const char *call, hoop_dtype dtype, hoop_op op) {
  const char *why = hoop__op_refused(dtype, op);
  if (!why)
    return HOOP_OK;
  if ((unsigned)op >= HOOP_OP_COUNT)
    return hoop__set_error(comm, HOOP_ERR_INVALID_ARG, "%s: unknown op %d", call, (int)op);
  return hoop__set_error(comm, HOOP_ERR_INVALID_ARG, "%s: op %s on %s: %s", call, hoop_op_name(op),
                         hoop_dtype_name(dtype) ? hoop_dtype_name(dtype) : "an unknown dtype", why);
}

static hoop_result check_allreduce(hoop_comm *comm, const hoop__coll_args *args, const char *call) {
  if (hoop__check_op(comm, call, args->dtype, args->op) != HOOP_OK)
    return HOOP_ERR_INVALID_ARG;
  if (args->count > 0 && (!args->sendbuf || !args->recvbuf))
    return hoop__set_error(comm, HOOP_ERR_INVALID_ARG, "%s: %s is NULL with count %zu", call,
                           args->sendbuf ? "recvbuf" : "sendbuf", args->count);
  return HOOP_OK;
}

static hoop_result check_broadcast(hoop_comm *comm, const hoop__coll_args *args, const char *call) {
  if (args->root < 0 || args->root >= comm->size)
    return hoop__set_error(comm, HOOP_ERR_INVALID_ARG, "%s: root %d is not in 0..%d", call,
                           args->root, comm->size - 1);
  if (args->count > 0 && !args->recvbuf)
    return hoop__set_error(comm, HOOP_ERR_INVALID_ARG, "%s: buf is NULL with count %zu", call,
                           args->count);
  return HOOP_OK;
}

static hoop_result check_allgather(hoop_comm *comm, const hoop__coll_args *args, const char *call) {
  if (args->count > 0 && (!args->sendbuf || !args->recvbuf))
    return hoop__set_error(comm, HOOP_ERR_INVALID_ARG, "%s: %s is NULL with count %zu", call,
                           args->sendbuf ? "recvbuf" : "sendbuf", args->count);
  return HOOP_OK;
}

static hoop_result check_reduce_scatter(hoop_comm *comm, const hoop__coll_args *args,
                                        const char *call) {
  if (hoop__check_op(comm, call, args->dtype, args->op) != HOOP_OK)
    return HOOP_ERR_INVALID_ARG;
  if (args->count > 0 && (!args->sendbuf || !args->recvbuf))
    return hoop__set_error(comm, HOOP_ERR_INVALID_ARG, "%s: %s is NULL with recvcount %zu", call,
                           args->sendbuf ? "recvbuf" : "sendbuf", args->count);
  return HOOP_OK;
}

/* On one rank the result is the input (out of place, copied). */
static hoop_result prepare_reduce_scatter(hoop_comm *comm, const hoop__coll_args *args) {
  return comm->size == 1 ? hoop__kind_copy(comm, args->recvbuf, args->sendbuf, args->bytes)
                         : HOOP_OK;
}

static hoop_result check_alltoall(hoop_comm *comm, const hoop__coll_args *args, const char *call) {
  if (args->count > 0 && (!args->sendbuf || !args->recvbuf))
    return hoop__set_error(comm, HOOP_ERR_INVALID_ARG, "%s: %s is NULL with count %zu", call,
                           args->sendbuf ? "recvbuf" : "sendbuf", args->count);
  return HOOP_OK;
}

/* Every count and displacement in range, buffers where blocks lie, and this rank's block to itself
 * as long as the one it expects from itself. */
static hoop_result check_alltoallv(hoop_comm *comm, const hoop__coll_args *args, const char *call) {
  if (!args->sendcounts || !args->sdispls || !args->recvcounts || !args->rdispls)
    return hoop__set_error(comm, HOOP_ERR_INVALID_ARG, "%s: %s is NULL", call,
                           !args->sendcounts   ? "sendcounts"
                           : !args->sdispls    ? "sdispls"
                           : !args->recvcounts ? "recvcounts"
                                               : "rdispls");
  size_t esize = hoop_dtype_size(args->dtype), limit = SIZE_MAX / esize;
  size_t sent = 0, received = 0;
  for (int p = 0; p < comm->size; p++) {
    size_t sc = args->sendcounts[p], sd = args->sdispls[p];
    size_t rc = args->recvcounts[p], rd = args->rdispls[p];
    if (sc > limit || sd > limit - sc || rc > limit || rd > limit - rc)
      return hoop__set_error(comm, HOOP_ERR_INVALID_ARG,
                             "%s: the block for or from rank %d does not fit in memory", call, p);
    sent |= sc;
    received |= rc;
  }
  if ((sent && !args->sendbuf) || (received && !args->recvbuf))
    return hoop__set_error(comm, HOOP_ERR_INVALID_ARG, "%s: %s is NULL with blocks to %s", call,
                           sent && !args->sendbuf ? "sendbuf" : "recvbuf",
                           sent && !args->sendbuf ? "send" : "receive");
  if (args->sendcounts[comm->rank] != args->recvcounts[comm->rank])
    return hoop__set_error(comm, HOOP_ERR_INVALID_ARG,
                           "%s: rank %d sends itself %zu elements but expects %zu from itself",
                           call, comm->rank, args->sendcounts[comm->rank],
                           args->recvcounts[comm->rank]);
  return HOOP_OK;
}

/* On one rank the result is the own block (out of place, copied). */
static hoop_result prepare_alltoall(hoop_comm *comm, const hoop__coll_args *args) {
  if (comm->size > 1)
    return HOOP_OK;
  if (args->coll == HOOP__COLL_ALLTOALL)
    return hoop__kind_copy(comm, args->recvbuf, args->sendbuf, args->bytes);
  return hoop__kind_copy(comm, (char *)args->recvbuf + args->rdispls[0] * args->esize,
                         (const char *)args->sendbuf + args->sdispls[0] * args->esize,
                         args->sendcounts[0] * args->esize);
}

/* Out of place, the result starts as this rank's contribution: on one rank it is the result. The
 * algorithms with more ranks read sendbuf themselves. */
static hoop_result prepare_allreduce(hoop_comm *comm, const hoop__coll_args *args) {
  return comm->size == 1 ? hoop__kind_copy(comm, args->recvbuf, args->sendbuf, args->bytes)
                         : HOOP_OK;
}

/* Every allgather algorithm starts from this rank's block in place. */
static hoop_result prepare_allgather(hoop_comm *comm, const hoop__coll_args *args) {
  char *own = (char *)args->recvbuf + (size_t)comm->rank * args->bytes;
  return hoop__kind_copy(comm, own, args->sendbuf, args->bytes);
}

/* Reduce, gather, scatter: a root in range; the buffers that matter on this rank given (the
 * root's result, or its blocks). */
static hoop_result check_rooted(hoop_comm *comm, const hoop__coll_args *args, const char *call) {
  if (args->root < 0 || args->root >= comm->size)
    return hoop__set_error(comm, HOOP_ERR_INVALID_ARG, "%s: root %d is not in 0..%d", call,
                           args->root, comm->size - 1);
  if (args->coll == HOOP__COLL_REDUCE &&
      hoop__check_op(comm, call, args->dtype, args->op) != HOOP_OK)
    return HOOP_ERR_INVALID_ARG;
  int root = comm->rank == args->root;
  int scatter = args->coll == HOOP__COLL_SCATTER;
  if (args->count > 0 && !args->sendbuf && (root || !scatter))
    return hoop__set_error(comm, HOOP_ERR_INVALID_ARG, "%s: sendbuf is NULL with count %zu", call,
                           args->count);
  if (args->count > 0 && !args->recvbuf && (root || scatter))
    return hoop__set_error(comm, HOOP_ERR_INVALID_ARG, "%s: recvbuf is NULL with count %zu", call,
                           args->count);
  return HOOP_OK;
}

/* On one rank the result is the input (out of place, copied). */
static hoop_result prepare_rooted(hoop_comm *comm, const hoop__coll_args *args) {
  return comm->size == 1 && args->recvbuf != args->sendbuf
             ? hoop__kind_copy(comm, args->recvbuf, args->sendbuf, args->bytes)
             : HOOP_OK;
}

static const collective collectives[HOOP__COLL_COUNT] = {
    [HOOP__COLL_ALLREDUCE] = {"hoop_allreduce", 1, check_allreduce, prepare_allreduce},
    [HOOP__COLL_BROADCAST] = {"hoop_broadcast", 1, check_broadcast, NULL},
    [HOOP__COLL_ALLGATHER] = {"hoop_allgather", 1, check_allgather, prepare_allgather},
    [HOOP__COLL_BARRIER] = {"hoop_barrier", 0, NULL, NULL},
    [HOOP__COLL_REDUCE_SCATTER] = {"hoop_reduce_scatter", 1, check_reduce_scatter,
                                   prepare_reduce_scatter},
    [HOOP__COLL_ALLTOALL] = {"hoop_alltoall", 1, check_alltoall, prepare_alltoall},
    [HOOP__COLL_ALLTOALLV] = {"hoop_alltoallv", 1, check_alltoallv, prepare_alltoall},
    [HOOP__COLL_REDUCE] = {"hoop_reduce", 1, check_rooted, prepare_rooted},
    [HOOP__COLL_GATHER] = {"hoop_gather", 1, check_rooted, prepare_rooted},
    [HOOP__COLL_SCATTER] = {"hoop_scatter", 1, check_rooted, prepare_rooted},
};

/* The checks a post makes before queueing the call (HOOP_OK, or the error recorded); a call that
 * did not come through them (args->checked 0: the fused allreduce's pieces) has them made when it
 * runs. */
hoop_result hoop__coll_validate(hoop_comm *comm, const hoop__coll_args *args, const char *call) {
  const collective *coll = &collectives[args->coll];
  hoop_result result;
  if (!call)
    call = coll->call;
  if (coll->has_data &&
      (result = check_dtype_count(comm, call, args->count, args->dtype)) != HOOP_OK)
    return result;
  return coll->check ? coll->check(comm, args, call) : HOOP_OK;
}

const char *hoop__coll_call_name(hoop__coll coll) {
  return collectives[coll].call;
}

/* ---- compressed calls ------------------------------------------------------------------------ */

/* The calls a wire format applies to: float sums and averages that every rank ends with or owns a
 * block of. */
static int compressible(hoop__coll coll, hoop_dtype dtype, hoop_op op) {
  return (coll == HOOP__COLL_ALLREDUCE || coll == HOOP__COLL_REDUCE_SCATTER) &&
         (dtype == HOOP_FLOAT32 || dtype == HOOP_FLOAT16 || dtype == HOOP_BFLOAT16) &&
         (op == HOOP_SUM || op == HOOP_AVG);
}

hoop_result hoop__coll_check_compress(hoop_comm *comm, const char *call, hoop__coll coll,
                                      hoop_dtype dtype, hoop_op op, int compress, const void *input,
                                      size_t input_bytes) {
  if (compress == HOOP__COMPRESS_COMM || compress == HOOP_COMPRESS_NONE)
    return HOOP_OK;
  char name[48];
  hoop_compress_name(compress, name, sizeof name);
  if (comm->reproducible)
    return hoop__set_error(comm, HOOP_ERR_INVALID_ARG,
                           "%s: compressed (%s) in reproducible mode: its bits would depend on the "
                           "hosts",
                           call, name);
  if (!compressible(coll, dtype, op))
    return hoop__set_error(
        comm, HOOP_ERR_INVALID_ARG,
        "%s: compressed (%s) on %s %s: compression takes float32, float16 or bfloat16 sum or avg "
        "in allreduce, reduce_scatter and allreduce_many",
        call, name, hoop_dtype_name(dtype) ? hoop_dtype_name(dtype) : "an unknown dtype",
        hoop_op_name(op) ? hoop_op_name(op) : "an unknown op");
  if ((compress & HOOP_COMPRESS_FEEDBACK) &&
      (!input || !hoop__registered(comm, input, input_bytes)))
    return hoop__set_error(comm, HOOP_ERR_INVALID_ARG,
                           "%s: compressed (%s): error feedback keeps what compression dropped "
                           "with the input's registration, and %s",
                           call, name,
                           input ? "sendbuf is not in a buffer registered with hoop_register"
                                 : "allreduce_many packs its buffers: use hoop_allreduce");
  return HOOP_OK;
}

/* The format the call goes by: the one it asked for, else the communicator's where it applies
 * (never in reproducible mode). */
static int call_compress(const hoop_comm *comm, const hoop__coll_args *args) {
  if (args->compress != HOOP__COMPRESS_COMM)
    return args->compress;
  return !comm->reproducible && compressible(args->coll, args->dtype, args->op) ? comm->compress
                                                                                : 0;
}

/* Validate, settle count 0 and one rank, choose, run. */
static hoop_result coll_run(hoop_comm *comm, hoop__coll_args *args) {
  const collective *coll = &collectives[args->coll];
  int asked = args->compress;
  args->compress = call_compress(comm, args);
  hoop_result result = coll_begin(
      comm, coll->call, args->coll, args->count, args->dtype, coll->has_data,
      coll->has_data && !args->checked, hoop__coll_reduces(args->coll) ? (int)args->op : -1,
      args->coll == HOOP__COLL_BROADCAST || args->coll == HOOP__COLL_REDUCE ||
              args->coll == HOOP__COLL_GATHER || args->coll == HOOP__COLL_SCATTER
          ? args->root
          : -1,
      args->name_tag, args->compress);
  if (result != HOOP_OK)
    return coll_end(comm, result, args);
  if (coll->check && !args->checked && (result = coll->check(comm, args, coll->call)) != HOOP_OK)
    return coll_end(comm, result, args);
  if (!args->checked &&
      (result = hoop__coll_check_compress(comm, coll->call, args->coll, args->dtype, args->op,
                                          asked, NULL, 0)) != HOOP_OK)
    return coll_end(comm, result, args);
  /* Error feedback's residuals live with the caller's input, which staging replaces. */
  args->feedback_buf = args->compress & HOOP_COMPRESS_FEEDBACK ? args->sendbuf : NULL;
  if (coll->has_data) {
    args->esize = hoop_dtype_size(args->dtype);
    args->bytes = args->count * args->esize;
    /* An alltoallv's ranks may have nothing to receive and still something to send: every rank
     * takes part. */
    if (args->bytes == 0 && args->coll != HOOP__COLL_ALLTOALLV) {
      comm->coll->algo_name = "no data";
      return coll_end(comm, hoop__coll_no_data(comm), args);
    }
  }
  const hoop__algo *algo = NULL;
  if (comm->size > 1 && (result = hoop__coll_tune(comm, args, &algo)) != HOOP_OK)
    return coll_end(comm, result, args);
  comm->coll->algo_name = algo ? algo->name : "one rank";
  /* Device buffers that every rank's path can take as they are (tune.c's table of paths). */
  if (coll->has_data && comm->size > 1 && hoop__coll_path(comm, args, algo, coll->prepare, &result))
    return coll_end(comm, result, args);
  /* Device buffers: the algorithm runs on host copies (mem/stage.c). */
  hoop__stage stage;
  if (coll->has_data &&
      (result = hoop__stage_in(comm, args, algo ? &algo->traits : NULL, &stage)) != HOOP_OK)
    return coll_end(comm, result, args);
  if (coll->prepare)
    result = coll->prepare(comm, args);
  if (result == HOOP_OK && comm->size > 1)
    result = algo->run(comm, args);
  if (coll->has_data)
    result = hoop__stage_out(comm, &stage, result);
  return coll_end(comm, result, args);
}

/* The caller holds call_lock (core/progress.c runs the queue). */
hoop_result hoop__coll_run(hoop_comm *comm, hoop__coll_args *args) {
  if (!hoop__tracing(comm))
    return coll_run(comm, args);
  double start = hoop__now();
  comm->coll->algo_name = "refused";
  hoop_result result = coll_run(comm, args);
  size_t esize = hoop_dtype_size(args->dtype);
  hoop__trace_run(comm, collectives[args->coll].call, args->count, args->dtype,
                  collectives[args->coll].has_data ? args->count * esize : 0, comm->coll->algo_name,
                  result, start, hoop__now());
  return result;
}
