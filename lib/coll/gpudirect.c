/* gpudirect.c - collectives on device buffers straight over the verbs transport (GPUDirect RDMA):
 * the algorithm the tuner chose runs on the user's device buffers themselves, the RDMA device
 * reading and writing GPU memory, with no copy through host memory.
 *
 * When. Every peer of every rank is on the verbs transport (HOOP_TRANSPORT=ibverbs, or one rank
 * per host), and every rank's buffers of the call are device memory inside hoop_register
 * registrations that the verbs transport made for GPUDirect RDMA (mem/gdr.h: dma-buf or
 * nvidia-peermem). Each rank checks its own side; a one-byte agreement (hoop__group_agree_bits)
 * makes the choice alike on every rank, and where any rank cannot every rank stages (mem/stage.c),
 * saying why at HOOP_DEBUG=info. Calls smaller than HOOP_GDR_MIN_BYTES are staged without asking,
 * a communicator where no rank loads a CUDA driver asks once and never again, and while no rank
 * has registered device memory the agreement is made only every 1, 2, 4, ... up to 64 calls (a
 * registration made meanwhile is seen at the next one), so that host-buffer calls hardly pay it.
 *
 * How. While the algorithm runs, comm->gdr_active turns its scratch into device memory registered
 * the same way (an internal registration, so that peers write received chunks straight into it)
 * and its reductions and copies into hoop's kernels and device copies (coll.h's hoop__coll_*),
 * each done before the algorithm goes on, so that what it sends next is final; while one runs the
 * rank keeps its transports moving (answering peers' RTS, taking arrivals), so that the pipeline
 * of chunks does not stall behind the kernel. The verbs
 * transport sends every message from GPU memory as a rendezvous (RTS, CTS, RDMA write, ZDONE),
 * whatever its size: nothing of GPU memory ever passes through its host slots.
 *
 * The flush rule. Data the RDMA device wrote into GPU memory may not yet be visible to the GPU's
 * kernels on GPUs that do not order such writes (CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WRITES_
 * ORDERING below "owner"): there every kernel or copy that reads received data, and the end of the
 * call (the user's kernels read what arrived), first calls cuFlushGPUDirectRDMAWrites. A GPU that
 * needs the flush and whose driver has none is staged.
 *
 * Inputs. Before offering its buffers a rank waits for the legacy default stream's work on them,
 * as staging's synchronous copies always did.
 */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coll/coll.h"
#include "coll/gpudirect.h"
#include "core/env.h"
#include "core/log.h"
#include "mem/cuda.h"
#include "mem/gdr.h"
#include "transport/transport.h"

#ifdef HOOP_HAVE_CUDA

#define GDR_BACKOFF_MAX 64

struct hoop__gdr {
  int setting;      /* HOOP_GDR: -1 auto, 0 off, 1 on; -2 (invalid) counts as off */
  size_t min_bytes; /* HOOP_GDR_MIN_BYTES */
  int drivers;      /* 0: not asked yet; 1: some rank loads a CUDA driver; -1: none does */
  /* While no rank has registered device memory, calls skip the agreement: skip more calls, after
   * agreements that found none, backoff of them, doubling up to GDR_BACKOFF_MAX. */
  int skip, backoff;
  int pairs_direct;     /* all_pairs_direct, which the transports fixed at hoop_init */
  char *scratch;        /* device memory of the running call's context, registered */
  size_t scratch_bytes; /* 0 when there is none */
  const void *near;     /* the running call's device memory */
  int flush;            /* the running call's GPU needs received data flushed */
  int told_why, told_used;
  char name[32]; /* the algorithm's name for the trace and the log: "ring+gdr" */
};

/* Alike on every rank: every pair of the job is on the verbs transport. Verbs serves a pair only
 * where every rank offered it (ib_can_reach), so this rank's peers all being on it says the same of
 * every rank's, unless shared memory took pairs on some host: not when HOOP_TRANSPORT=ibverbs
 * (which must be alike on every rank), nor when every host runs one rank. The verbs transport is
 * the only one that registers memory. And so the IPC path (coll/ipc.c), which runs first,
 * declines alike on every rank whenever this holds: with no pair on shared memory anywhere, no
 * host's ranks can go by IPC. Asked once per communicator: the transports are fixed at hoop_init.
 */
static int all_pairs_direct(const hoop_comm *comm) {
  if (strcmp(comm->transport_mode, "ibverbs") != 0 &&
      (!comm->hosts || comm->hosts->count != comm->size))
    return 0;
  for (int p = 0; p < comm->size; p++)
    if (p != comm->rank && !hoop__transport_of(comm, p)->ops->register_mem)
      return 0;
  return 1;
}

static struct hoop__gdr *gdr_state(hoop_comm *comm) {
  if (comm->gdr)
    return comm->gdr;
  struct hoop__gdr *gdr = calloc(1, sizeof *gdr);
  if (!gdr)
    return NULL;
  char why[160];
  gdr->setting = hoop__gdr_setting(why, sizeof why);
  if (gdr->setting == -2)
    gdr->setting = 0; /* hoop_register of device memory says why */
  gdr->min_bytes = hoop__env_bytes("HOOP_GDR_MIN_BYTES", 1L << 40);
  gdr->pairs_direct = all_pairs_direct(comm);
  comm->gdr = gdr;
  return gdr;
}

/* The registration that holds all of [ptr, ptr + len) if every peer's transport made something of
 * it (for device memory: mem/gdr.c found a way to register it for GPUDirect RDMA), else NULL. */
static const hoop__registration *registered_for_peers(const hoop_comm *comm, const void *ptr,
                                                      size_t len) {
  const hoop__registration *reg = hoop__registration_find(comm, ptr, len);
  for (int p = 0; reg && p < comm->size; p++)
    if (p != comm->rank && !reg->transport_mem[comm->peer_transport[p]])
      reg = NULL;
  return reg;
}

static void drop_scratch(hoop_comm *comm, struct hoop__gdr *gdr) {
  if (!gdr->scratch)
    return;
  hoop__deregister_internal(comm, gdr->scratch);
  hoop__cuda_free(gdr->scratch);
  gdr->scratch = NULL;
  gdr->scratch_bytes = 0;
}

void *hoop__gdr_scratch(hoop_comm *comm, size_t bytes) {
  struct hoop__gdr *gdr = comm->gdr;
  if (bytes <= gdr->scratch_bytes)
    return gdr->scratch;
  /* Never between a receive's post and its arrival: algorithms take their scratch before they
   * post. The transports forget the old one with its registration. */
  drop_scratch(comm, gdr);
  if (bytes < 4096)
    bytes = 4096;
  char *ptr = hoop__cuda_alloc(bytes, gdr->near);
  if (!ptr) {
    hoop__set_error(comm, HOOP_ERR_SYSTEM, "%s: cannot allocate %zu bytes of device scratch",
                    comm->call, bytes);
    return NULL;
  }
  if (hoop__register_internal(comm, ptr, bytes) != HOOP_OK) {
    hoop__cuda_free(ptr);
    return NULL;
  }
  if (!registered_for_peers(comm, ptr, bytes)) {
    hoop__deregister_internal(comm, ptr);
    hoop__cuda_free(ptr);
    hoop__set_error(comm, HOOP_ERR_SYSTEM,
                    "%s: %zu bytes of device scratch could not be registered for GPUDirect RDMA",
                    comm->call, bytes);
    return NULL;
  }
  gdr->scratch = ptr;
  gdr->scratch_bytes = bytes;
  return ptr;
}

/* ---- the algorithms' memory operations on the GPU ---------------------------------------------
 */

static hoop_result flushed(hoop_comm *comm) {
  return comm->gdr->flush ? hoop__cuda_gdr_flush(comm, comm->gdr->near) : HOOP_OK;
}

hoop_result hoop__gdr_reduce3(hoop_comm *comm, void *dst, const void *a, const void *b,
                              size_t count, hoop_dtype dtype, hoop_op op) {
  hoop_result result = count ? flushed(comm) : HOOP_OK;
  if (count && result == HOOP_OK &&
      (result = hoop__cuda_reduce3_async(comm, dst, a, b, count, dtype, op)) == HOOP_OK)
    result = hoop__cuda_sync_busy(comm, dst, hoop__progress_once);
  return result;
}

hoop_result hoop__gdr_finish(hoop_comm *comm, void *buf, size_t count, hoop_dtype dtype, hoop_op op,
                             int nranks) {
  if (op != HOOP_AVG || count == 0)
    return HOOP_OK;
  hoop_result result = hoop__cuda_finish_async(comm, buf, count, dtype, op, nranks);
  return result == HOOP_OK ? hoop__cuda_sync_busy(comm, buf, hoop__progress_once) : result;
}

hoop_result hoop__gdr_copy(hoop_comm *comm, void *dst, const void *src, size_t bytes) {
  if (bytes == 0 || dst == src)
    return HOOP_OK;
  hoop_result result = flushed(comm);
  if (result == HOOP_OK && (result = hoop__cuda_copy_async(comm, dst, src, bytes)) == HOOP_OK)
    result = hoop__cuda_sync_busy(comm, dst, hoop__progress_once);
  return result;
}

/* ---- deciding -------------------------------------------------------------------------------- */

/* Once per communicator, alike on every rank: 1 if some rank loads a CUDA driver, 0 if none (never
 * ask again), -1 if the exchange failed (*result). */
static int any_driver(hoop_comm *comm, struct hoop__gdr *gdr, hoop_result *result) {
  if (gdr->drivers == 0) {
    int any = hoop__cuda_loaded();
    hoop__group whole = hoop__whole(comm);
    if ((*result = hoop__group_agree(comm, &whole, &any, 1)) != HOOP_OK)
      return -1;
    gdr->drivers = any ? 1 : -1;
    if (any)
      HOOP__INFO(HOOP_SUBSYS_COLL,
                 "gpudirect: every pair is on ibverbs and a rank loads a CUDA driver: calls of %zu "
                 "bytes and more ask whether every rank's buffers are registered device memory",
                 gdr->min_bytes);
    else
      HOOP__INFO(HOOP_SUBSYS_COLL, "gpudirect: no rank loads a CUDA driver: no call goes by "
                                   "GPUDirect RDMA");
  }
  return gdr->drivers > 0;
}

/* This rank's buffers of the call: device memory, registered for GPUDirect RDMA on every peer's
 * transport, in one context. 0, or -1 with why. */
static int buffers_direct(hoop_comm *comm, const hoop__coll_args *args, char *why, size_t whylen) {
  size_t total =
      args->coll == HOOP__COLL_ALLGATHER ? args->bytes * (size_t)comm->size : args->bytes;
  const void *bufs[2] = {args->recvbuf, args->coll == HOOP__COLL_BROADCAST ? NULL : args->sendbuf};
  size_t lens[2] = {total, args->bytes};
  for (int i = 0; i < 2; i++) {
    if (!bufs[i])
      continue;
    const char *what = i == 0 ? "receive buffer" : "send buffer";
    const hoop__registration *reg = registered_for_peers(comm, bufs[i], lens[i]);
    if (!reg) {
      snprintf(why, whylen, "its %s is not inside a hoop_register registration made for ibverbs",
               what);
      return -1;
    }
    if (!reg->device) {
      snprintf(why, whylen, "its %s is not device memory", what);
      return -1;
    }
  }
  if (bufs[1] && hoop__cuda_context_of(bufs[1]) != hoop__cuda_context_of(bufs[0])) {
    snprintf(why, whylen, "its buffers are in different CUDA contexts");
    return -1;
  }
  return 0;
}

/* Device scratch enough for whatever algo takes with hoop__scratch, so that it never has to grow
 * (and perhaps fail to register) once every rank has agreed: the pipelined passes take
 * HOOP__RING_RECV_DEPTH chunks of a block no larger than the call, chunk_bytes growing with the
 * block; recursive doubling and Bruck's allgather the whole call. */
static size_t scratch_need(const hoop_comm *comm, const hoop__coll_args *args, hoop__algo_fn algo,
                           size_t total) {
  size_t need = HOOP__RING_RECV_DEPTH * hoop__chunk_bytes(comm, total, args->esize);
  if ((algo == hoop__allreduce_rd || algo == hoop__allgather_bruck || algo == hoop__allgather_rd) &&
      need < total)
    need = total;
  return need;
}

/* Whether this rank can take its part (0, or -1 with why): its buffers, the flush, hoop's stream
 * and kernels, and device scratch for all the algorithm's needs. */
static int prepare(hoop_comm *comm, struct hoop__gdr *gdr, const hoop__coll_args *args,
                   hoop__algo_fn algo, char *why, size_t whylen) {
  if (buffers_direct(comm, args, why, whylen) != 0)
    return -1;
  gdr->near = args->recvbuf;
  if ((gdr->flush = hoop__cuda_gdr_flush_mode(gdr->near, why, whylen)) < 0)
    return -1;
  int kernels = args->coll == HOOP__COLL_ALLREDUCE;
  const void *input = args->coll == HOOP__COLL_BROADCAST ? args->recvbuf : args->sendbuf;
  if (hoop__cuda_ready(comm, gdr->near, kernels) != HOOP_OK ||
      hoop__cuda_stream_wait(comm, comm->call, NULL, input) != HOOP_OK) {
    snprintf(why, whylen, "%.200s", comm->last_error);
    return -1;
  }
  size_t total =
      args->coll == HOOP__COLL_ALLGATHER ? args->bytes * (size_t)comm->size : args->bytes;
  size_t want = scratch_need(comm, args, algo, total);
  if (gdr->scratch && hoop__cuda_context_of(gdr->scratch) != hoop__cuda_context_of(gdr->near))
    drop_scratch(comm, gdr);
  if (!hoop__gdr_scratch(comm, want)) {
    snprintf(why, whylen, "%.200s", comm->last_error);
    return -1;
  }
  return 0;
}

/* Every rank's answer: 1 when all can, 0 when every rank stages (logged), -1 when the exchange
 * failed (*result). */
static int settle(hoop_comm *comm, struct hoop__gdr *gdr, const hoop__coll_args *args,
                  hoop__algo_fn algo, size_t bytes, hoop_result *result) {
  char why[256] = "";
  /* What prepare recorded on the way to "cannot" is why, not this call's error: the call goes on,
   * staged. */
  char saved[sizeof comm->last_error];
  memcpy(saved, comm->last_error, sizeof saved);
  int mine = comm->device_regs > 0 && prepare(comm, gdr, args, algo, why, sizeof why) == 0;
  memcpy(comm->last_error, saved, sizeof saved);
  if (comm->device_regs == 0)
    snprintf(why, sizeof why, "it has no device memory registered");
  /* Bit 0: this rank can (AND); bit 1: this rank has device memory registered (OR). */
  unsigned bits = (mine ? 1u : 0u) | (comm->device_regs > 0 ? 2u : 0u);
  hoop__group whole = hoop__whole(comm);
  if ((*result = hoop__group_agree_bits(comm, &whole, &bits, 2u)) != HOOP_OK)
    return -1;
  int all = (bits & 1u) != 0;
  if (bits & 2u) {
    gdr->backoff = 0;
  } else {
    /* Nobody can until some rank registers device memory, which only a later agreement tells. */
    gdr->backoff = gdr->backoff ? 2 * gdr->backoff : 1;
    if (gdr->backoff > GDR_BACKOFF_MAX)
      gdr->backoff = GDR_BACKOFF_MAX;
    gdr->skip = gdr->backoff;
    HOOP__TRACE(HOOP_SUBSYS_COLL,
                "gpudirect: no rank has device memory registered: the next %d "
                "calls are staged without asking",
                gdr->skip);
    return 0;
  }
  if (!all) {
    if (mine)
      snprintf(why, sizeof why,
               "another rank cannot (its buffers are not registered device "
               "memory, or its GPU cannot take GPUDirect RDMA)");
    if (!gdr->told_why)
      HOOP__INFO(HOOP_SUBSYS_COLL, "gpudirect: %s of %zu bytes is staged through host memory: %s",
                 comm->call, bytes, why);
    else
      HOOP__TRACE(HOOP_SUBSYS_COLL, "gpudirect: %s of %zu bytes is staged: %s", comm->call, bytes,
                  why);
    gdr->told_why = 1;
    return 0;
  }
  if (!gdr->told_used)
    HOOP__INFO(HOOP_SUBSYS_COLL,
               "gpudirect: %s of %zu bytes goes between the GPUs and the network directly "
               "(GPUDirect RDMA%s)",
               comm->call, bytes,
               gdr->flush ? ", received data flushed before kernels read it" : "");
  gdr->told_used = 1;
  return 1;
}

int hoop__gdr_run(hoop_comm *comm, const hoop__coll_args *args, hoop__algo_fn algo,
                  hoop_result (*prepare_coll)(hoop_comm *comm, const hoop__coll_args *args),
                  hoop_result *result) {
  *result = HOOP_OK;
  if (comm->size < 2 || args->coll == HOOP__COLL_BARRIER)
    return 0;
  struct hoop__gdr *gdr = gdr_state(comm);
  if (!gdr) {
    /* Every other rank may be about to agree: fail, not stage alone. */
    *result = hoop__set_error(comm, HOOP_ERR_SYSTEM, "%s: out of memory (GPUDirect RDMA's state)",
                              comm->call);
    return 1;
  }
  if (!gdr->pairs_direct)
    return 0;
  size_t bytes =
      args->coll == HOOP__COLL_ALLGATHER ? args->bytes * (size_t)comm->size : args->bytes;
  if (gdr->setting == 0 || bytes < gdr->min_bytes)
    return 0;
  int go = any_driver(comm, gdr, result);
  if (go > 0 && gdr->skip > 0) {
    gdr->skip--; /* alike on every rank: each counts the same calls */
    return 0;
  }
  if (go > 0)
    go = settle(comm, gdr, args, algo, bytes, result);
  if (go == 0)
    return 0;
  if (go < 0)
    return 1;
  snprintf(gdr->name, sizeof gdr->name, "%s+gdr", hoop__coll_algo_name(algo));
  comm->algo_name = gdr->name;
  comm->gdr_active = 1;
  *result = prepare_coll ? prepare_coll(comm, args) : HOOP_OK;
  if (*result == HOOP_OK)
    *result = algo(comm, args);
  /* What arrived in the user's buffers is read next by the user's kernels. */
  if (*result == HOOP_OK)
    *result = flushed(comm);
  comm->gdr_active = 0;
  if (*result == HOOP_ERR_INVALID_ARG)
    *result = HOOP_ERR_SYSTEM; /* the peers are in the call: the communicator must fail */
  return 1;
}

void hoop__gdr_free(hoop_comm *comm) {
  struct hoop__gdr *gdr = comm->gdr;
  if (!gdr)
    return;
  /* The registration went with the others (hoop__registrations_release) if it was still there. */
  drop_scratch(comm, gdr);
  free(gdr);
  comm->gdr = NULL;
}

#else /* HOOP_HAVE_CUDA: device buffers are host memory, never direct */

int hoop__gdr_run(hoop_comm *comm, const hoop__coll_args *args, hoop__algo_fn algo,
                  hoop_result (*prepare_coll)(hoop_comm *comm, const hoop__coll_args *args),
                  hoop_result *result) {
  (void)comm, (void)args, (void)algo, (void)prepare_coll;
  *result = HOOP_OK;
  return 0;
}

void *hoop__gdr_scratch(hoop_comm *comm, size_t bytes) {
  (void)bytes;
  hoop__set_error(comm, HOOP_ERR_UNSUPPORTED, "this libhoop was built without CUDA");
  return NULL;
}

hoop_result hoop__gdr_reduce3(hoop_comm *comm, void *dst, const void *a, const void *b,
                              size_t count, hoop_dtype dtype, hoop_op op) {
  (void)dst, (void)a, (void)b, (void)count, (void)dtype, (void)op;
  return hoop__set_error(comm, HOOP_ERR_UNSUPPORTED, "this libhoop was built without CUDA");
}

hoop_result hoop__gdr_finish(hoop_comm *comm, void *buf, size_t count, hoop_dtype dtype, hoop_op op,
                             int nranks) {
  (void)buf, (void)count, (void)dtype, (void)op, (void)nranks;
  return hoop__set_error(comm, HOOP_ERR_UNSUPPORTED, "this libhoop was built without CUDA");
}

hoop_result hoop__gdr_copy(hoop_comm *comm, void *dst, const void *src, size_t bytes) {
  (void)dst, (void)src, (void)bytes;
  return hoop__set_error(comm, HOOP_ERR_UNSUPPORTED, "this libhoop was built without CUDA");
}

void hoop__gdr_free(hoop_comm *comm) {
  (void)comm;
}

#endif /* HOOP_HAVE_CUDA */
