/* path_gdr.c - the dispatcher's GPUDirect RDMA path: collectives on device buffers straight over a
 * transport that registers memory (verbs):
 * the algorithm the tuner chose runs on the user's device buffers themselves, the RDMA device
 * reading and writing GPU memory, with no copy through host memory.
 *
 * When. Every peer of every rank is on a transport that registers memory, alike on every rank
 * (tune.c's REGISTERED: HOOP_TRANSPORT names it, or one rank per host), and every rank's buffers of
 * the call are device memory inside hoop_register registrations that the transport made for
 * GPUDirect RDMA (mem/gdr.h: dma-buf or nvidia-peermem). Each rank checks its own side; a one-byte
 * agreement (hoop__group_agree_bits) makes the choice alike on every rank, and where any rank
 * cannot every rank stages (mem/stage.c), saying why at HOOP_DEBUG=info. Calls smaller than
 * HOOP_GDR_MIN_BYTES are staged without asking, a communicator where no rank loads a CUDA driver
 * asks once and never again (coll/paths.c), and while no rank has registered device memory the
 * agreement is made only every 1, 2, 4, ... up to 64 calls (a registration made meanwhile is seen
 * at the next one), so that host-buffer calls hardly pay it.
 *
 * How. The algorithm runs on the CUDA memory kind (mem/cuda/kind.c): its scratch is device memory
 * registered the same way (an internal registration, so that peers write received chunks straight
 * into it) and its reductions and copies are hoop's kernels and device copies, each done before
 * the algorithm goes on, so that what it sends next is final. The verbs
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

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coll/coll.h"
#include "coll/paths.h"
#include "coll/state.h"
#include "core/env.h"
#include "core/log.h"
#include "mem/cuda.h"
#include "mem/gdr.h"
#include "transport/transport.h"

struct hoop__gdr {
  int setting;      /* HOOP_GDR: -1 auto, 0 off, 1 on; -2 (invalid) counts as off */
  size_t min_bytes; /* HOOP_GDR_MIN_BYTES */
  int flush;        /* the running call's GPU needs received data flushed */
  hoop__path_state path;
  char name[32]; /* the algorithm's name for the trace and the log: "ring+gdr" */
};

static struct hoop__gdr *gdr_state(hoop_comm *comm) {
  if (comm->coll->gdr)
    return comm->coll->gdr;
  struct hoop__gdr *gdr = calloc(1, sizeof *gdr);
  if (!gdr)
    return NULL;
  char why[160];
  gdr->setting = hoop__gdr_setting(why, sizeof why);
  if (gdr->setting == -2)
    gdr->setting = 0; /* hoop_register of device memory says why */
  gdr->min_bytes = hoop__env_bytes("HOOP_GDR_MIN_BYTES", 1L << 40);
  comm->coll->gdr = gdr;
  return gdr;
}

/* This rank's buffers of the call: device memory, registered for GPUDirect RDMA on every peer's
 * transport, in one context. 0, or -1 with why. */
static int buffers_direct(hoop_comm *comm, const hoop__coll_args *args, char *why, size_t whylen) {
  const void *bufs[2] = {args->recvbuf, args->coll == HOOP__COLL_BROADCAST ? NULL : args->sendbuf};
  size_t lens[2] = {hoop__call_total(comm, args), args->bytes};
  for (int i = 0; i < 2; i++) {
    if (!bufs[i])
      continue;
    const char *what = i == 0 ? "receive buffer" : "send buffer";
    int device;
    if (!hoop__registered_for_peers(comm, bufs[i], lens[i], &device)) {
      snprintf(why, whylen, "its %s is not inside a hoop_register registration made for ibverbs",
               what);
      return -1;
    }
    if (!device) {
      snprintf(why, whylen, "its %s is not device memory", what);
      return -1;
    }
  }
  if (bufs[1] && hoop__device()->context_of(bufs[1]) != hoop__device()->context_of(bufs[0])) {
    snprintf(why, whylen, "its buffers are in different CUDA contexts");
    return -1;
  }
  return 0;
}

/* Device scratch enough for whatever algo takes from its memory kind, so that it never has to grow
 * (and perhaps fail to register) once every rank has agreed: the pipelined passes take
 * HOOP__RING_RECV_DEPTH chunks of a block no larger than the call, chunk_bytes growing with the
 * block; some (recursive doubling, Bruck's allgather) the whole call. */
static size_t scratch_need(const hoop_comm *comm, const hoop__coll_args *args,
                           const hoop__algo *algo) {
  size_t total = hoop__call_total(comm, args);
  size_t need = HOOP__RING_RECV_DEPTH * hoop__chunk_bytes(comm, total, args->esize);
  if (algo->traits.scratch_whole && need < total)
    need = total;
  return need;
}

/* Whether this rank can take its part (0, or -1 with why): its buffers, the flush, hoop's stream
 * and kernels, and device scratch for all the algorithm's needs. */
static int prepare(hoop_comm *comm, struct hoop__gdr *gdr, const hoop__coll_args *args,
                   const hoop__algo *algo, char *why, size_t whylen) {
  if (buffers_direct(comm, args, why, whylen) != 0)
    return -1;
  const void *near = args->recvbuf;
  if ((gdr->flush = hoop__device()->gdr_flush_mode(near, why, whylen)) < 0)
    return -1;
  int kernels = args->coll == HOOP__COLL_ALLREDUCE;
  const void *input = args->coll == HOOP__COLL_BROADCAST ? args->recvbuf : args->sendbuf;
  if (hoop__device()->ready(comm, near, kernels) != HOOP_OK ||
      hoop__device()->stream_wait(comm, comm->call, NULL, input) != HOOP_OK ||
      hoop__device()->begin(comm, near, gdr->flush, 1) != HOOP_OK ||
      !hoop__device()->scratch(comm, scratch_need(comm, args, algo)))
    return -1; /* why: the error recorded (hoop__probe_end) */
  return 0;
}

/* Every rank's answer: 1 when all can, 0 when every rank stages (logged), -1 when the exchange
 * failed (*result). */
static int settle(hoop_comm *comm, struct hoop__gdr *gdr, const hoop__coll_args *args,
                  const hoop__algo *algo, size_t bytes, hoop_result *result) {
  char why[256] = "";
  /* What prepare records on the way to "cannot" is why, not this call's error: the call goes on,
   * staged. */
  hoop__probe probe;
  hoop__probe_begin(comm, &probe);
  int mine =
      hoop__mem_device_regs(comm) > 0 && prepare(comm, gdr, args, algo, why, sizeof why) == 0;
  hoop__probe_end(comm, &probe, mine ? NULL : why, sizeof why);
  if (hoop__mem_device_regs(comm) == 0)
    snprintf(why, sizeof why, "it has no device memory registered");
  /* Bit 0: this rank can (AND); bit 1: this rank has device memory registered (OR). */
  unsigned bits = (mine ? 1u : 0u) | (hoop__mem_device_regs(comm) > 0 ? 2u : 0u);
  hoop__group whole = hoop__whole(comm);
  if ((*result = hoop__group_agree_bits(comm, &whole, &bits, 2u)) != HOOP_OK)
    return -1;
  /* Nobody can until some rank registers device memory, which only a later agreement tells. */
  if (hoop__path_back_off(&gdr->path, (bits & 2u) != 0)) {
    HOOP__TRACE(HOOP_SUBSYS_COLL,
                "gpudirect: no rank has device memory registered: the next %d "
                "calls are staged without asking",
                gdr->path.skip);
    return 0;
  }
  if (!(bits & 1u)) {
    if (mine)
      snprintf(why, sizeof why,
               "another rank cannot (its buffers are not registered device "
               "memory, or its GPU cannot take GPUDirect RDMA)");
    hoop__path_tell(comm, &gdr->path, "gpudirect", bytes, NULL, why);
    return 0;
  }
  hoop__path_tell(comm, &gdr->path, "gpudirect", bytes,
                  gdr->flush ? "goes between the GPUs and the network directly (GPUDirect RDMA, "
                               "received data flushed before kernels read it)"
                             : "goes between the GPUs and the network directly (GPUDirect RDMA)",
                  NULL);
  return 1;
}

static int gdr_enabled(hoop_comm *comm, const hoop__coll_args *args, const hoop__algo *algo,
                       int by_host, hoop_result *result) {
  (void)algo, (void)by_host;
  struct hoop__gdr *gdr = gdr_state(comm);
  if (!gdr) {
    /* Every other rank may be about to agree: fail, not stage alone. */
    *result = hoop__set_error(comm, HOOP_ERR_SYSTEM, "%s: out of memory (GPUDirect RDMA's state)",
                              comm->call);
    return -1;
  }
  return gdr->setting != 0 && hoop__call_total(comm, args) >= gdr->min_bytes;
}

static int gdr_run(hoop_comm *comm, const hoop__coll_args *args, const hoop__algo *algo,
                   hoop__algo_fn prepare_coll, hoop_result *result) {
  struct hoop__gdr *gdr = comm->coll->gdr;
  if (hoop__path_skip(&gdr->path))
    return 0;
  int go = settle(comm, gdr, args, algo, hoop__call_total(comm, args), result);
  if (go <= 0)
    return go < 0;
  snprintf(gdr->name, sizeof gdr->name, "%s+gdr", algo->name);
  comm->coll->algo_name = gdr->name;
  comm->mem = &hoop__mem_cuda;
  *result = prepare_coll ? prepare_coll(comm, args) : HOOP_OK;
  if (*result == HOOP_OK)
    *result = algo->run(comm, args);
  /* What arrived in the user's buffers is read next by the user's kernels. */
  if (*result == HOOP_OK)
    *result = hoop__device()->flushed(comm);
  comm->mem = &hoop__mem_host;
  if (*result == HOOP_ERR_INVALID_ARG)
    *result = HOOP_ERR_SYSTEM; /* the peers are in the call: the communicator must fail */
  return 1;
}

static void gdr_free(hoop_comm *comm) {
  free(comm->coll->gdr);
  comm->coll->gdr = NULL;
}

static size_t gdr_floor(hoop_comm *comm) {
  struct hoop__gdr *gdr = gdr_state(comm);
  return !gdr ? 0 : gdr->setting != 0 ? gdr->min_bytes : SIZE_MAX;
}

const hoop__path hoop__path_gdr = {gdr_enabled, gdr_run, gdr_free, gdr_floor};
