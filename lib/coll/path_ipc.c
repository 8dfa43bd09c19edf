/* path_ipc.c - the dispatcher's CUDA IPC path: collectives on the device buffers of ranks that
 * share one host, each rank reading its peers' buffers mapped into its own context (mem/ipc_map.c)
 * with the GPU (coll/mapped.c's algorithms on the CUDA memory kind), so no byte crosses to the host
 * and back. The CPU side synchronises over the transport that joins each pair, which must declare
 * HOOP__TCAP_SAME_HOST.
 *
 * Host by host: on a job of several hosts with as many ranks on each, an allreduce for which the
 * tuning table chose an algorithm that runs host by host (hier) runs that shape with the steps
 * within a host mapped; each host settles for itself: a host whose ranks cannot go this way stages
 * and runs hier, and meets the others in hier's step between hosts.
 *
 * Whether a call goes this way is settled alike on every rank (host by host: on every rank of a
 * host), as every algorithm choice must be: a call of at least HOOP_CUDA_IPC_MIN_BYTES first agrees
 * in one byte whether every rank's buffers are device memory of one context (host-buffer calls
 * stop there); then each rank offers a descriptor (its buffers' IPC exports) and every rank maps
 * its peers'. Only when every rank can does the call run here; otherwise every rank runs it the
 * usual way (staged through host memory where its buffers are on the device), and HOOP_DEBUG=info
 * says why. HOOP_CUDA_IPC and HOOP_CUDA_IPC_MIN_BYTES must be alike on every rank, as HOOP_ALGO
 * must.
 *
 * Inputs: the plain calls' rule is that inputs are ready at the call. As the staged path's copies
 * did (they run on the legacy default stream), a rank first waits for the work queued on the
 * legacy default stream of its buffers' context before it offers them: its peers read them as
 * soon as the descriptors are exchanged.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coll/coll.h"
#include "coll/paths.h"
#include "coll/state.h"
#include "core/env.h"
#include "mem/cuda.h"
#include "mem/ipc_map.h"
#include "transport/transport.h"

typedef struct ipc_desc {
  uint64_t process; /* hoop__ipc_process: ranks in one process share pointers */
  uint64_t context; /* the buffers' context: within one process, pointers are shared only in it */
  int32_t ok;       /* 1: every buffer of this rank's call is device memory it exported */
  int32_t pad;
  hoop__cuda_export send, recv;
} ipc_desc;

struct hoop__ipc {
  int enabled;
  uint64_t job; /* this rank's job, for the ranks of this process (hoop__ipc_local_*) */
  int net_rank;
  size_t min_bytes;
  ipc_desc *descs;       /* size entries: the call's descriptors */
  char **sends, **recvs; /* size entries: where each rank's buffers are readable here */
  hoop__ipc_held held;   /* the mappings the running call reads */
  hoop__mapped mapped;   /* the running call's members and their buffers */
  hoop__host_buf host;   /* host memory for the step between hosts, page-locked where it can be */
  hoop__path_state path;
};

/* The key of comm's job that every rank computes alike: its data key and generation (net's). */
static uint64_t job_key(hoop_comm *comm) {
  const hoop_comm *net = hoop__net(comm);
  uint64_t h = 1469598103934665603ull ^ net->generation;
  for (size_t i = 0; i < sizeof net->data_nonce; i++)
    h = (h ^ net->data_nonce[i]) * 1099511628211ull;
  return h;
}

static struct hoop__ipc *ipc_state(hoop_comm *comm) {
  struct hoop__ipc *ipc = comm->coll->ipc;
  if (ipc)
    return ipc;
  if (!(ipc = calloc(1, sizeof *ipc)) ||
      !(ipc->descs = calloc((size_t)comm->size, sizeof *ipc->descs)) ||
      !(ipc->sends = calloc((size_t)comm->size, sizeof *ipc->sends)) ||
      !(ipc->recvs = calloc((size_t)comm->size, sizeof *ipc->recvs))) {
    if (ipc) {
      free(ipc->descs);
      free(ipc->sends);
    }
    free(ipc);
    return NULL;
  }
  ipc->enabled = strcmp(hoop__env_get("HOOP_CUDA_IPC"), "0") != 0;
  ipc->min_bytes = hoop__env_bytes("HOOP_CUDA_IPC_MIN_BYTES", 1L << 40);
  ipc->mapped.sends = ipc->sends;
  ipc->mapped.recvs = ipc->recvs;
  /* This rank lives in this process: its peers here believe its descriptors' process number. */
  ipc->job = job_key(comm);
  ipc->net_rank = hoop__net_rank(comm, comm->rank);
  hoop__ipc_local_add(ipc->job, ipc->net_rank);
  comm->coll->ipc = ipc;
  return ipc;
}

static void ipc_free(hoop_comm *comm) {
  struct hoop__ipc *ipc = comm->coll->ipc;
  if (!ipc)
    return;
  hoop__ipc_local_remove(ipc->job, ipc->net_rank);
  hoop__ipc_map_release(&ipc->held);
  free(ipc->held.held);
  /* The peers' memory this communicator mapped: closed (once idle), so that what they free is
   * not kept alive here. */
  for (int q = 0; q < comm->size; q++)
    if (q != comm->rank)
      hoop__ipc_map_forget(&ipc->descs[q].process, 1);
  hoop__host_buf_free(comm, &ipc->host);
  free(ipc->descs);
  free(ipc->sends);
  free(ipc->recvs);
  free(ipc);
  comm->coll->ipc = NULL;
}

/* The buffer that peers read of this rank's call (the root's buffer of a broadcast). */
static const void *offered(const hoop__coll_args *args) {
  return args->coll == HOOP__COLL_BROADCAST ? args->recvbuf : args->sendbuf;
}

/* How much of it they read: a reduce-scatter's or an all-to-all's whole input, one block each. */
static size_t offered_bytes(const hoop_comm *comm, const hoop__coll_args *args) {
  return args->coll == HOOP__COLL_REDUCE_SCATTER || args->coll == HOOP__COLL_ALLTOALL
             ? args->bytes * (size_t)comm->size
             : args->bytes;
}

/* The call's size for the cut-over and the log: the result an allgather or all-to-all leaves, a
 * reduce-scatter's whole input, else the payload. */
static size_t call_bytes(const hoop_comm *comm, const hoop__coll_args *args) {
  return args->coll == HOOP__COLL_REDUCE_SCATTER ? offered_bytes(comm, args)
                                                 : hoop__call_total(comm, args);
}

/* Device scratch the mapped algorithm needs (0: none). An allreduce or reduce-scatter in place
 * whose rank reduces its own block (own_len elements) past the first pass of the many-source
 * kernel keeps the partial result apart (coll/mapped.c); an all-to-all in place gathers its
 * blocks apart, as the peers still read its input. */
static size_t scratch_needed(const hoop_comm *comm, const hoop__coll_args *args, int index,
                             size_t own_len) {
  const char *send = args->sendbuf, *recv = args->recvbuf;
  switch (args->coll) {
  case HOOP__COLL_ALLTOALL: return send == recv ? args->bytes * (size_t)comm->size : 0;
  case HOOP__COLL_REDUCE_SCATTER:
    return recv == send + (size_t)index * args->bytes && index >= hoop__mem_cuda.many_max
               ? args->bytes
               : 0;
  case HOOP__COLL_ALLREDUCE:
    return send == recv && index >= hoop__mem_cuda.many_max ? own_len * args->esize : 0;
  default: return 0;
  }
}

/* Whether this rank can take its part (0, or -1 with why): its buffers are exported; hoop's stream
 * is there, the legacy default stream's work on them is done, and for an allreduce the kernels and
 * the scratch it may need are ready. */
static int prepare(hoop_comm *comm, struct hoop__ipc *ipc, const hoop__coll_args *args,
                   ipc_desc *desc, char *why, size_t whylen) {
  const void *send = offered(args);
  size_t send_bytes = offered_bytes(comm, args);
  desc->context = (uint64_t)(uintptr_t)hoop__device()->context_of(send);
  int allreduce = args->coll == HOOP__COLL_ALLREDUCE;
  int reduces = allreduce || args->coll == HOOP__COLL_REDUCE_SCATTER;
  if (hoop__device()->ipc_export(send, send_bytes, &desc->send, why, whylen) != 0 ||
      (allreduce &&
       hoop__device()->ipc_export(args->recvbuf, args->bytes, &desc->recv, why, whylen)))
    return -1;
  /* A peer maps what was exported: the buffer must lie inside it (a cudaMalloc buffer always
   * does; VMM memory is exported piece after piece up to its end). The sum can wrap only for a
   * descriptor no driver gives; tests/test_ipc_descriptors forges such one through this check,
   * to see that the peers' own bounds (inside()) refuse it. */
  if (desc->send.offset + send_bytes > desc->send.size ||
      (allreduce && desc->recv.offset + args->bytes > desc->recv.size)) {
    snprintf(why, whylen, "rank %d's buffer goes on past the allocation that holds its start",
             comm->rank);
    return -1;
  }
  hoop__probe probe;
  hoop__probe_begin(comm, &probe);
  int ok = 1;
  size_t first, len;
  const hoop__group *group = &ipc->mapped.group;
  hoop__segment(args->count, group->size, hoop__mapped_own(&ipc->mapped, group->index), &first,
                &len);
  size_t scratch = scratch_needed(comm, args, group->index, len);
  if (ipc->mapped.compressed) {
    /* The step between hosts encodes and decodes in the same scratch, once the block is reduced. */
    size_t exchange = hoop__compressed_by_host_scratch(comm, args, len);
    scratch = exchange > scratch ? exchange : scratch;
  }
  if (hoop__device()->stream_wait(comm, comm->call, NULL, send) != HOOP_OK ||
      hoop__device()->ready(comm, send, reduces) != HOOP_OK ||
      hoop__device()->begin(comm, send, 0, 0) != HOOP_OK) {
    snprintf(why, whylen, "rank %d: %.200s", comm->rank, comm->last_error);
    ok = 0;
  } else if (scratch && !hoop__device()->scratch(comm, scratch)) {
    snprintf(why, whylen, "rank %d cannot allocate %zu bytes of device scratch", comm->rank,
             scratch);
    ok = 0;
  } else if (ipc->mapped.by_host && !ipc->mapped.compressed && len &&
             !(ipc->mapped.host = hoop__host_buf_grow(comm, &ipc->host, len * args->esize, send,
                                                      "of host memory"))) {
    snprintf(why, whylen, "rank %d cannot allocate %zu bytes of host memory", comm->rank,
             len * args->esize);
    ok = 0;
  }
  hoop__probe_end(comm, &probe, NULL, 0);
  return ok ? 0 : -1;
}

/* This rank's buffers are device memory of one context, and every pair of the group is on a
 * transport whose ranks share their host: 1, or 0 with why. */
static int could(hoop_comm *comm, struct hoop__ipc *ipc, const hoop__coll_args *args, char *why,
                 size_t whylen) {
  const hoop__group *group = &ipc->mapped.group;
  for (int i = 0; i < group->size; i++) {
    int peer = hoop__member(group, i);
    const hoop__tctx *pair = peer != comm->rank ? hoop__transport_of(comm, peer) : NULL;
    if (pair && !(pair->ops->caps & HOOP__TCAP_SAME_HOST)) {
      snprintf(why, whylen, "rank %d talks to rank %d of its host over %s, which cannot map memory",
               comm->rank, peer, pair->ops->name);
      return 0;
    }
  }
  void *context = hoop__device()->context_of(offered(args));
  if (!context || hoop__device()->context_of(args->recvbuf) != context) {
    snprintf(why, whylen, "rank %d's buffers are not all device memory of one context", comm->rank);
    return 0;
  }
  return 1;
}

/* Where a peer's exported buffer is readable here: its own pointer within one process, else its
 * allocation mapped (mem/ipc_map.c); NULL with why. near: this rank's device memory. Whether the
 * peer lives in this process is this process's knowledge (the ranks that made their IPC state
 * here), never the descriptor's word alone. */
static char *peer_ptr(hoop_comm *comm, struct hoop__ipc *ipc, int peer, const ipc_desc *desc,
                      const hoop__cuda_export *from, const void *near, char *why, size_t whylen) {
  if (desc->process == hoop__ipc_process()) {
    if (!hoop__ipc_local_has(ipc->job, hoop__net_rank(comm, peer))) {
      snprintf(why, whylen,
               "rank %d's descriptor says it comes from this process, where no such rank lives: "
               "refused",
               peer);
      return NULL;
    }
    if (desc->context == (uint64_t)(uintptr_t)hoop__device()->context_of(near))
      return (char *)(uintptr_t)from->base + from->offset;
    snprintf(why, whylen, "rank %d is a thread of this process with buffers in another context",
             peer);
    return NULL;
  }
  return hoop__ipc_map(&ipc->held, peer, desc->process, from, near, why, whylen);
}

/* Whether a peer's descriptor keeps bytes of its buffer inside what it exported: checked before
 * anything is mapped or read, since a member could otherwise have this rank read or write past the
 * mapping (another allocation, or a fault). 1, or 0 with why. */
static int inside(int peer, const hoop__cuda_export *from, size_t bytes, char *why, size_t whylen) {
  if (from->offset <= from->size && bytes <= from->size - from->offset)
    return 1;
  snprintf(why, whylen,
           "rank %d's descriptor puts %zu bytes at offset %llu of an allocation of %llu bytes: "
           "refused",
           peer, bytes, (unsigned long long)from->offset, (unsigned long long)from->size);
  return 0;
}

/* Where every member's buffers are readable here (ipc->sends, ipc->recvs): 0, or -1 with why. */
static int map_peers(hoop_comm *comm, struct hoop__ipc *ipc, const hoop__coll_args *args, char *why,
                     size_t whylen) {
  const ipc_desc *descs = ipc->descs;
  const hoop__group *group = &ipc->mapped.group;
  for (int i = 0; i < group->size; i++) {
    int q = hoop__member(group, i);
    if (q == comm->rank) {
      ipc->sends[q] = (char *)offered(args);
      ipc->recvs[q] = args->recvbuf;
      continue;
    }
    ipc->sends[q] = ipc->recvs[q] = NULL;
    if ((args->coll != HOOP__COLL_BROADCAST || q == args->root) &&
        (!inside(q, &descs[q].send, offered_bytes(comm, args), why, whylen) ||
         !(ipc->sends[q] =
               peer_ptr(comm, ipc, q, &descs[q], &descs[q].send, args->recvbuf, why, whylen))))
      return -1;
    if (args->coll == HOOP__COLL_ALLREDUCE &&
        (!inside(q, &descs[q].recv, args->bytes, why, whylen) ||
         !(ipc->recvs[q] =
               peer_ptr(comm, ipc, q, &descs[q], &descs[q].recv, args->recvbuf, why, whylen))))
      return -1;
  }
  return 0;
}

/* Every member's descriptor to every member (descs is indexed by communicator rank): Bruck's
 * log2(n) rounds for the whole communicator, a ring among the few ranks of one host. */
static hoop_result exchange(hoop_comm *comm, const hoop__group *group, ipc_desc *descs) {
  if (!group->ranks) {
    hoop__coll_args gather = {
        .coll = HOOP__COLL_ALLGATHER, .recvbuf = descs, .bytes = sizeof *descs};
    return hoop__allgather_bruck(comm, &gather);
  }
  int n = group->size, i = group->index;
  hoop_result result = HOOP_OK;
  for (int step = 0; step < n - 1 && result == HOOP_OK; step++) {
    int out = hoop__member(group, (i - step + n) % n);
    int in = hoop__member(group, (i - step - 1 + n) % n);
    result = hoop__sendrecv(comm, hoop__group_next(group), &descs[out], sizeof *descs,
                            hoop__group_prev(group), &descs[in], sizeof *descs);
  }
  return result;
}

/* Exchange the descriptors and map the peers' buffers: 1 when every member can go this way, 0 with
 * why when every member stages, -1 when an exchange failed (*result). */
static int exchange_and_map(hoop_comm *comm, struct hoop__ipc *ipc, const hoop__coll_args *args,
                            char *why, size_t whylen, hoop_result *result) {
  ipc_desc *descs = ipc->descs, *mine = &descs[comm->rank];
  const hoop__group *group = &ipc->mapped.group;
  memset(mine, 0, sizeof *mine);
  mine->process = hoop__ipc_process();
  mine->ok = prepare(comm, ipc, args, mine, why, whylen) == 0;
  if ((*result = exchange(comm, group, descs)) != HOOP_OK)
    return -1;
  for (int i = 0; i < group->size; i++) {
    int q = hoop__member(group, i);
    if (!descs[q].ok) {
      if (q != comm->rank)
        snprintf(why, whylen, "rank %d cannot (its buffers are not exported)", q);
      return 0;
    }
  }
  /* Every member must have mapped its peers' buffers before any reads. */
  int mapped = map_peers(comm, ipc, args, why, whylen) == 0;
  if ((*result = hoop__group_agree(comm, group, &mapped, 0)) != HOOP_OK)
    return -1;
  if (!mapped && !why[0])
    snprintf(why, whylen, "another rank could not take part (its buffers, or mapping)");
  return mapped;
}

/* 1 when every member can go this way, 0 when every member stages (logged), -1 when an exchange
 * failed (*result). Host-buffer calls stop at the first agreement, one byte. */
static int settle(hoop_comm *comm, struct hoop__ipc *ipc, const hoop__coll_args *args, size_t bytes,
                  hoop_result *result) {
  char why[256] = "";
  int mine = could(comm, ipc, args, why, sizeof why), all = mine;
  if ((*result = hoop__group_agree(comm, &ipc->mapped.group, &all, 0)) != HOOP_OK)
    return -1;
  int go = 0, offered = mine;
  if (!all && mine)
    snprintf(why, sizeof why, "another rank's buffers are host memory, or not of one context");
  else if (all && (go = exchange_and_map(comm, ipc, args, why, sizeof why, result)) < 0) {
    hoop__ipc_map_release(&ipc->held);
    return -1;
  }
  if (all)
    offered = ipc->descs[comm->rank].ok;
  if (!go) {
    hoop__ipc_map_release(&ipc->held);
    /* Said by the ranks that offered their buffers, or by rank 0 where none did. */
    if (offered || comm->rank == 0)
      hoop__path_tell(comm, &ipc->path, "ipc", bytes, NULL, why);
    return 0;
  }
  hoop__path_tell(comm, &ipc->path, "ipc", bytes,
                  "reads the peers' device buffers directly (CUDA IPC)", NULL);
  return 1;
}

/* The members: all on one host, the whole communicator; host by host (an algorithm that runs so),
 * this host's ranks. Alike on every rank of a host. HOOP_CUDA_IPC and the call's size: alike too.
 */
static int ipc_enabled(hoop_comm *comm, const hoop__coll_args *args, const hoop__algo *algo,
                       int by_host, hoop_result *result) {
  (void)algo;
  struct hoop__ipc *ipc = ipc_state(comm);
  if (!ipc) {
    /* Every other rank may be about to exchange descriptors: fail, not stage alone. */
    *result =
        hoop__set_error(comm, HOOP_ERR_SYSTEM, "%s: out of memory (CUDA IPC's state)", comm->call);
    return -1;
  }
  if (!ipc->enabled || call_bytes(comm, args) < ipc->min_bytes)
    return 0;
  const hoop__hosts *hosts = comm->coll->hosts;
  ipc->mapped.by_host = by_host;
  /* tune.c sends a compressed call here only where the job's hosts take one. */
  ipc->mapped.compressed = by_host && args->compress;
  ipc->mapped.group = by_host ? (hoop__group){hosts->per_host, hosts->local_index, hosts->local}
                              : hoop__whole(comm);
  return 1;
}

static int ipc_run(hoop_comm *comm, const hoop__coll_args *args, const hoop__algo *algo,
                   hoop__algo_fn prepare_coll, hoop_result *result) {
  (void)algo, (void)prepare_coll;
  struct hoop__ipc *ipc = comm->coll->ipc;
  int go = settle(comm, ipc, args, call_bytes(comm, args), result);
  if (go <= 0)
    return go < 0;
  comm->coll->algo_name = ipc->mapped.by_host ? "ipc+hier" : "ipc";
  comm->mem = &hoop__mem_cuda;
  *result = hoop__mapped_run(comm, &ipc->mapped, args);
  if (*result != HOOP_OK) {
    /* Nothing of this call may still run on the GPU once it returns, and its mappings are
     * released: wait for what was queued, keeping the first error. The peers wait in a barrier
     * for this rank; a failure the communicator does not survive tells them. */
    hoop__probe probe;
    hoop__probe_begin(comm, &probe);
    comm->mem->sync(comm);
    hoop__probe_end(comm, &probe, NULL, 0);
    if (*result == HOOP_ERR_INVALID_ARG)
      *result = HOOP_ERR_SYSTEM;
  }
  comm->mem = &hoop__mem_host;
  /* No rank leaves (and its buffers change) while another may still read them. */
  if (*result == HOOP_OK)
    *result = hoop__group_barrier(comm, &ipc->mapped.group);
  hoop__ipc_map_release(&ipc->held);
  return 1;
}

static size_t ipc_floor(hoop_comm *comm) {
  struct hoop__ipc *ipc = ipc_state(comm);
  return !ipc ? 0 : ipc->enabled ? ipc->min_bytes : SIZE_MAX;
}

const hoop__path hoop__path_ipc = {ipc_enabled, ipc_run, ipc_free, ipc_floor};
