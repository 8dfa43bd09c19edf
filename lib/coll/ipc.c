/* ipc.c - collectives on device buffers of ranks that share one host, by CUDA IPC: each rank maps
 * its peers' device buffers into its own context (once per peer and allocation: the mappings are
 * cached for the process) and reads them with the GPU, so no byte crosses to the host and back.
 * The CPU side synchronises over the shared-memory transport; no kernel ever waits for another
 * process, so ranks sharing one GPU cannot deadlock.
 *
 * Allreduce: rank r reduces block r of every rank's input, in rank order, in one pass of the
 * many-source reduction kernel (the same results as reduce.c's chain) into block r of its own
 * result; after a barrier it copies every other block from its owner's result; a second barrier
 * keeps each result buffer unchanged until every peer has read it. Broadcast: every rank copies the
 * root's buffer, then a barrier. Allgather: every rank copies each peer's block, then a barrier.
 *
 * Host by host: on a job of several hosts with as many ranks on each, an allreduce for which
 * tune.c chooses hoop__allreduce_hier runs that algorithm's shape with the steps within a host by
 * IPC: the ranks of a host reduce their blocks on the GPU (each the block hier's ring
 * reduce-scatter would leave with it), allreduce them with the ranks at the same place on the
 * other hosts through host memory (hoop__allreduce_group: hier's step between hosts, message for
 * message), and copy the other blocks from their owners. Each host settles for itself: a host
 * whose ranks cannot go by IPC stages and runs hier, and meets the others in that step.
 *
 * Whether a call goes this way is settled alike on every rank (host by host: on every rank of a
 * host), as every algorithm choice must be: on a communicator whose every pair of ranks (of a
 * host) talks over shared memory, a call of at least
 * HOOP_CUDA_IPC_MIN_BYTES starts with an exchange of a small descriptor per rank (its buffers'
 * kinds and IPC handles). Only when every rank's buffers are device memory that it could export,
 * and then every rank could map its peers', does the call run here; otherwise every rank runs it
 * the usual way (staged through host memory where its buffers are on the device), and
 * HOOP_DEBUG=info says why. A communicator none of whose ranks can load a CUDA driver agrees so
 * once and skips the exchange from then on. HOOP_CUDA_IPC and HOOP_CUDA_IPC_MIN_BYTES must be alike
 * on every rank, as HOOP_ALGO must.
 *
 * Inputs: the plain calls' rule is that inputs are ready at the call. As the staged path's copies
 * did (they run on the legacy default stream), a rank first waits for the work queued on the
 * legacy default stream of its buffers' context before it offers them: its peers read them as
 * soon as the descriptors are exchanged.
 *
 * A mapping keeps the peer's allocation alive in the driver after the peer frees it, until it is
 * closed: mappings are closed when the peer's range turns out to hold another allocation, when
 * the cache is full (least recently used first), and for a communicator's peers at its
 * hoop_finalize or failure.
 */
#include "config.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "coll/coll.h"
#include "coll/ipc.h"
#include "core/env.h"
#include "core/log.h"
#include "mem/cuda.h"

#ifdef HOOP_HAVE_CUDA

/* Mappings of peers' allocations, kept for the process (communicators of one job map the same
 * peers' memory, and the driver maps an allocation once per context); the least recently used one
 * that no call is using is closed to make room. */
#define MAX_MAPS 64

typedef struct ipc_desc {
  uint64_t process; /* a random number of this process: ranks in one process share pointers */
  uint64_t context; /* the buffers' context: within one process, pointers are shared only in it */
  int32_t ok;       /* 1: every buffer of this rank's call is device memory it exported */
  int32_t pad;
  hoop__cuda_export send, recv;
} ipc_desc;

typedef struct mapping {
  uint64_t process; /* the exporting process (ipc_desc.process) */
  void *context;    /* the context it is mapped into */
  hoop__cuda_export from;
  void *base; /* the allocation mapped here */
  uint64_t used;
  int busy;  /* calls reading it now */
  int stale; /* the exporter's range holds another allocation now: closed once idle */
  struct mapping *next;
} mapping;

static pthread_mutex_t maps_lock = PTHREAD_MUTEX_INITIALIZER;
static mapping *maps;
static int nmaps;
static uint64_t maps_clock;

struct hoop__ipc {
  int drivers; /* 0: not yet asked whether any rank loads a driver; 1: some rank does; -1: none */
  int enabled;
  size_t min_bytes;
  ipc_desc *descs;       /* size entries: the call's descriptors */
  char **sends, **recvs; /* size entries: where each rank's buffers are readable here */
  mapping **held;        /* 2 x size entries: the mappings the running call reads */
  int nheld;
  void *scratch; /* device memory for the in-place allreduce's partial result */
  size_t scratch_bytes;
  void *scratch_context;
  hoop__group group; /* the running call's: the whole communicator, or this host's ranks */
  int by_host;       /* the running call goes host by host (hoop__allreduce_group between) */
  void *host;        /* host memory for the step between hosts, page-locked where it can be */
  size_t host_bytes;
  int host_pinned;
  int told_used, told_why;
};

/* A random number of this process, drawn again in a child after fork (which inherits it). */
static pthread_mutex_t process_lock = PTHREAD_MUTEX_INITIALIZER;
static uint64_t process_id;
static pid_t process_pid;

static uint64_t this_process(void) {
  pthread_mutex_lock(&process_lock);
  pid_t pid = getpid();
  if (process_pid != pid) {
    if (getrandom(&process_id, sizeof process_id, GRND_NONBLOCK) != (ssize_t)sizeof process_id)
      process_id = ((uint64_t)pid << 32) ^ (uint64_t)(hoop__now() * 1e9);
    process_id |= 1; /* never 0 */
    process_pid = pid;
  }
  uint64_t id = process_id;
  pthread_mutex_unlock(&process_lock);
  return id;
}

static hoop_result agree(hoop_comm *comm, int *flag, int any) {
  hoop__group whole = hoop__whole(comm);
  return hoop__group_agree(comm, &whole, flag, any);
}

static hoop_result barrier(hoop_comm *comm, const hoop__group *group) {
  int flag = 1;
  return group->ranks ? hoop__group_agree(comm, group, &flag, 0)
                      : hoop__barrier_dissemination(comm, NULL);
}

static struct hoop__ipc *ipc_state(hoop_comm *comm) {
  struct hoop__ipc *ipc = comm->ipc;
  if (ipc)
    return ipc;
  if (!(ipc = calloc(1, sizeof *ipc)) ||
      !(ipc->descs = calloc((size_t)comm->size, sizeof *ipc->descs)) ||
      !(ipc->sends = calloc((size_t)comm->size, sizeof *ipc->sends)) ||
      !(ipc->recvs = calloc((size_t)comm->size, sizeof *ipc->recvs)) ||
      !(ipc->held = calloc(2 * (size_t)comm->size, sizeof *ipc->held))) {
    if (ipc) {
      free(ipc->descs);
      free(ipc->sends);
      free(ipc->recvs);
    }
    free(ipc);
    return NULL;
  }
  ipc->enabled = strcmp(hoop__env_get("HOOP_CUDA_IPC"), "0") != 0;
  ipc->min_bytes = hoop__env_bytes("HOOP_CUDA_IPC_MIN_BYTES", 1L << 40);
  comm->ipc = ipc;
  return ipc;
}

/* Close and forget map (maps_lock held). */
static void unmap(mapping *map) {
  for (mapping **at = &maps; *at; at = &(*at)->next)
    if (*at == map) {
      *at = map->next;
      break;
    }
  nmaps--;
  hoop__cuda_ipc_close(map->context, map->base, &map->from);
  free(map);
}

/* The running call is done with its mappings. */
static void release(struct hoop__ipc *ipc) {
  pthread_mutex_lock(&maps_lock);
  for (int i = 0; i < ipc->nheld; i++) {
    mapping *map = ipc->held[i];
    if (--map->busy == 0 && map->stale)
      unmap(map);
  }
  ipc->nheld = 0;
  pthread_mutex_unlock(&maps_lock);
}

/* Release the host memory of the step between hosts; the transports forget it first (they may
 * keep registrations of what they sent from, as of the stage). */
static void free_host(hoop_comm *comm, struct hoop__ipc *ipc) {
  if (ipc->host && comm->peer_transport)
    hoop__transports_forget_mem(comm, ipc->host, ipc->host_bytes);
  hoop__host_stage_free(ipc->host, ipc->host_pinned);
  ipc->host = NULL;
  ipc->host_bytes = 0;
}

void hoop__ipc_free(hoop_comm *comm) {
  struct hoop__ipc *ipc = comm->ipc;
  if (!ipc)
    return;
  release(ipc);
  /* The peers' memory this communicator mapped: closed (once idle), so that what they free is
   * not kept alive here. */
  pthread_mutex_lock(&maps_lock);
  for (mapping *map = maps, *next; map; map = next) {
    next = map->next;
    for (int q = 0; q < comm->size; q++)
      if (q != comm->rank && ipc->descs[q].process == map->process) {
        map->stale = 1;
        if (!map->busy)
          unmap(map);
        break;
      }
  }
  pthread_mutex_unlock(&maps_lock);
  hoop__cuda_free(ipc->scratch);
  free_host(comm, ipc);
  free(ipc->descs);
  free(ipc->sends);
  free(ipc->recvs);
  free(ipc->held);
  free(ipc);
  comm->ipc = NULL;
}

/* Where a peer's exported buffer is readable here: its own pointer within one process, else its
 * allocation mapped (from the cache, or now), held for the running call; NULL with why. near:
 * this rank's device memory. */
static char *peer_ptr(struct hoop__ipc *ipc, int peer, const ipc_desc *desc,
                      const hoop__cuda_export *from, const void *near, char *why, size_t whylen) {
  void *context = hoop__cuda_context_of(near);
  if (desc->process == this_process()) {
    if (desc->context == (uint64_t)(uintptr_t)context)
      return (char *)(uintptr_t)from->base + from->offset;
    snprintf(why, whylen, "rank %d is a thread of this process with buffers in another context",
             peer);
    return NULL;
  }
  pthread_mutex_lock(&maps_lock);
  mapping *hit = NULL;
  for (mapping *map = maps; map && !hit; map = map->next)
    if (!map->stale && map->process == desc->process && map->context == context &&
        hoop__cuda_export_same(&map->from, from))
      hit = map;
  if (!hit) {
    /* A mapping of the exporter's memory in this range that is not this allocation: the exporter
     * freed it since, and the range now holds another. */
    for (mapping *map = maps, *next; map; map = next) {
      next = map->next;
      if (map->process == desc->process && map->context == context &&
          hoop__cuda_export_conflict(&map->from, from)) {
        map->stale = 1;
        if (!map->busy)
          unmap(map);
      }
    }
    while (nmaps >= MAX_MAPS) {
      mapping *oldest = NULL;
      for (mapping *map = maps; map; map = map->next)
        if (!map->busy && (!oldest || map->used < oldest->used))
          oldest = map;
      if (!oldest)
        break; /* every one in use: grow past the bound for now */
      unmap(oldest);
    }
    void *base = NULL;
    char detail[160];
    if (!(hit = calloc(1, sizeof *hit))) {
      snprintf(why, whylen, "out of memory");
    } else if (hoop__cuda_ipc_open(near, from, &base, detail, sizeof detail) != 0) {
      snprintf(why, whylen, "rank %d's buffer: %s", peer, detail);
      free(hit);
      hit = NULL;
    } else {
      *hit = (mapping){
          .process = desc->process, .context = context, .from = *from, .base = base, .next = maps};
      maps = hit;
      nmaps++;
      HOOP__TRACE(HOOP_SUBSYS_COLL,
                  "ipc: mapped rank %d's allocation of %llu bytes (id %llu) at %p", peer,
                  (unsigned long long)from->size, (unsigned long long)from->buffer_id, base);
    }
  }
  if (hit) {
    hit->used = ++maps_clock;
    hit->busy++;
    ipc->held[ipc->nheld++] = hit;
  }
  pthread_mutex_unlock(&maps_lock);
  return hit ? (char *)hit->base + from->offset : NULL;
}

/* The block of the group's inputs this rank reduces: its own place, or host by host the one
 * hoop__allreduce_hier's ring reduce-scatter leaves with it (place + 1), so that the step between
 * hosts is that algorithm's, message for message, and a host that stages runs hier itself. */
static int own_block(const struct hoop__ipc *ipc) {
  return ipc->by_host ? (ipc->group.index + 1) % ipc->group.size : ipc->group.index;
}

/* The member that reduces block q. */
static int block_owner(const struct hoop__ipc *ipc, int q) {
  int n = ipc->group.size;
  return hoop__member(&ipc->group, ipc->by_host ? (q - 1 + n) % n : q);
}

/* The in-place allreduce's device scratch for len bytes in the context of near: 0, or -1. */
static int ensure_scratch(struct hoop__ipc *ipc, size_t len, const void *near) {
  void *context = hoop__cuda_context_of(near);
  if (ipc->scratch && ipc->scratch_bytes >= len && ipc->scratch_context == context)
    return 0;
  hoop__cuda_free(ipc->scratch);
  ipc->scratch_bytes = 0;
  if (!(ipc->scratch = hoop__cuda_alloc(len, near)))
    return -1;
  ipc->scratch_bytes = len;
  ipc->scratch_context = context;
  return 0;
}

/* Host memory of len bytes for the step between hosts: 0, or -1. */
static int ensure_host(hoop_comm *comm, struct hoop__ipc *ipc, size_t len, const void *near) {
  if (ipc->host && ipc->host_bytes >= len)
    return 0;
  free_host(comm, ipc);
  if (!(ipc->host = hoop__host_stage_alloc(len, near, &ipc->host_pinned)))
    return -1;
  ipc->host_bytes = len;
  return 0;
}

/* Whether this rank can take its part (0, or -1 with why): its buffers are device memory of one
 * context, ready (the legacy default stream's work on them done), exported; hoop's stream is
 * there, and for an allreduce its kernels and the scratch it may need. Probing is not the call's
 * error: comm's last error is left as it was. */
static int prepare(hoop_comm *comm, struct hoop__ipc *ipc, const hoop__coll_args *args,
                   ipc_desc *desc, char *why, size_t whylen) {
  const void *send = args->coll == HOOP__COLL_BROADCAST ? args->recvbuf : args->sendbuf;
  void *context = hoop__cuda_context_of(send);
  if (!context || hoop__cuda_context_of(args->recvbuf) != context) {
    snprintf(why, whylen, "rank %d's buffers are not all device memory of one context", comm->rank);
    return -1;
  }
  desc->context = (uint64_t)(uintptr_t)context;
  if (hoop__cuda_ipc_export(send, args->bytes, &desc->send, why, whylen) != 0 ||
      (args->coll == HOOP__COLL_ALLREDUCE &&
       hoop__cuda_ipc_export(args->recvbuf, args->bytes, &desc->recv, why, whylen) != 0))
    return -1;
  /* A peer maps what was exported: the buffer must lie inside it (a cudaMalloc buffer always
   * does; VMM memory is exported piece after piece up to its end). */
  if (desc->send.offset + args->bytes > desc->send.size ||
      (args->coll == HOOP__COLL_ALLREDUCE && desc->recv.offset + args->bytes > desc->recv.size)) {
    snprintf(why, whylen, "rank %d's buffer goes on past the allocation that holds its start",
             comm->rank);
    return -1;
  }
  char saved[sizeof comm->last_error];
  memcpy(saved, comm->last_error, sizeof saved);
  int ok = 1;
  size_t first, len;
  const hoop__group *group = &ipc->group;
  hoop__segment(args->count, group->size, own_block(ipc), &first, &len);
  if (hoop__cuda_stream_wait(comm, comm->call, NULL, send) != HOOP_OK ||
      hoop__cuda_ready(comm, send, args->coll == HOOP__COLL_ALLREDUCE) != HOOP_OK) {
    snprintf(why, whylen, "rank %d: %.200s", comm->rank, comm->last_error);
    ok = 0;
  } else if (args->coll == HOOP__COLL_ALLREDUCE && args->sendbuf == args->recvbuf &&
             group->index >= HOOP__CUDA_MANY_MAX && len &&
             ensure_scratch(ipc, len * args->esize, send) != 0) {
    snprintf(why, whylen, "rank %d cannot allocate %zu bytes of device scratch", comm->rank,
             len * args->esize);
    ok = 0;
  } else if (ipc->by_host && len && ensure_host(comm, ipc, len * args->esize, send) != 0) {
    snprintf(why, whylen, "rank %d cannot allocate %zu bytes of host memory", comm->rank,
             len * args->esize);
    ok = 0;
  }
  memcpy(comm->last_error, saved, sizeof saved);
  return ok ? 0 : -1;
}

/* This rank's descriptor: ok only if its host's ranks talk over shared memory and prepare found
 * it can take part (its first question, the buffers' context, also tells host memory). */
static void describe(hoop_comm *comm, struct hoop__ipc *ipc, const hoop__coll_args *args,
                     ipc_desc *desc, char *why, size_t whylen) {
  memset(desc, 0, sizeof *desc);
  desc->process = this_process();
  const hoop__group *group = &ipc->group;
  for (int i = 0; i < group->size; i++) {
    int peer = hoop__member(group, i);
    if (peer != comm->rank && strcmp(hoop__transport_of(comm, peer)->ops->name, "shm") != 0) {
      snprintf(why, whylen, "rank %d talks to rank %d of its host over %s, not shared memory",
               comm->rank, peer, hoop__transport_of(comm, peer)->ops->name);
      return;
    }
  }
  desc->ok = prepare(comm, ipc, args, desc, why, whylen) == 0;
}

/* Block r of the group's inputs, reduced on the GPU into block r of this rank's result: in member
 * order, up to HOOP__CUDA_MANY_MAX sources a pass, the next pass starting from the partial
 * result; divided by the rank count at the end unless the step between hosts does it. */
static hoop_result reduce_block(hoop_comm *comm, struct hoop__ipc *ipc, const hoop__coll_args *args,
                                char *dst, size_t at, size_t len) {
  const hoop__group *group = &ipc->group;
  int n = group->size;
  /* In place, block r of this rank's input is the result's: a first pass that does not read it
   * would overwrite it before its turn, so the partial result goes to scratch then. */
  char *acc = dst;
  if (args->sendbuf == args->recvbuf && group->index >= HOOP__CUDA_MANY_MAX)
    acc = ipc->scratch; /* made ready by prepare */
  const void *srcs[HOOP__CUDA_MANY_MAX];
  hoop_result result = HOOP_OK;
  for (int q = 0; q < n && result == HOOP_OK;) {
    int k = 0;
    if (q > 0)
      srcs[k++] = acc;
    while (k < HOOP__CUDA_MANY_MAX && q < n)
      srcs[k++] = ipc->sends[hoop__member(group, q++)] + at;
    int divide = q == n && args->op == HOOP_AVG && !ipc->by_host ? comm->size : 0;
    result = hoop__cuda_reduce_many_async(comm, acc, srcs, k, len, args->dtype, args->op, divide);
  }
  if (result == HOOP_OK && acc != dst)
    result = hoop__cuda_copy_async(comm, dst, acc, len * args->esize);
  if (result == HOOP_OK)
    result = hoop__cuda_sync(comm, dst);
  return result;
}

/* Allreduce: this rank's block of the group's inputs reduced (then, host by host, allreduced
 * with the ranks at the same place on the other hosts through host memory), a barrier, the other
 * blocks copied from their owners. */
static hoop_result run_allreduce(hoop_comm *comm, struct hoop__ipc *ipc,
                                 const hoop__coll_args *args) {
  const hoop__group *group = &ipc->group;
  int n = group->size, own = own_block(ipc);
  size_t esize = args->esize, first, len;
  char *recv = args->recvbuf;
  hoop__segment(args->count, n, own, &first, &len);
  hoop_result result = HOOP_OK;
  if (len)
    result = reduce_block(comm, ipc, args, recv + first * esize, first * esize, len);
  if (ipc->by_host && result == HOOP_OK) {
    /* Every rank takes part in the ring between hosts, with or without a block (count < n). */
    const hoop__hosts *hosts = comm->hosts;
    hoop__group cross = {hosts->count, hosts->host_index, hosts->cross};
    static char none[16]; /* the host memory of an empty block */
    char *host = len ? ipc->host : none;
    result = hoop__cuda_copy(comm, host, recv + first * esize, len * esize);
    if (result == HOOP_OK)
      result = hoop__allreduce_group(comm, &cross, host, len, args->dtype, args->op);
    if (result == HOOP_OK)
      result = hoop__cuda_copy(comm, recv + first * esize, host, len * esize);
  }
  /* Every block is final (and every input read) before any rank copies them. */
  if (result == HOOP_OK)
    result = barrier(comm, group);
  for (int q = 0; q < n && result == HOOP_OK; q++) {
    hoop__segment(args->count, n, q, &first, &len);
    if (q != own && len)
      result = hoop__cuda_copy_async(comm, recv + first * esize,
                                     ipc->recvs[block_owner(ipc, q)] + first * esize, len * esize);
  }
  if (result == HOOP_OK)
    result = hoop__cuda_sync(comm, recv);
  return result;
}

static hoop_result run_copies(hoop_comm *comm, const hoop__coll_args *args, char **sends) {
  char *recv = args->recvbuf;
  hoop_result result = HOOP_OK;
  if (args->coll == HOOP__COLL_BROADCAST) {
    if (comm->rank != args->root)
      result = hoop__cuda_copy_async(comm, recv, sends[args->root], args->bytes);
  } else {
    for (int q = 0; q < comm->size && result == HOOP_OK; q++) {
      char *to = recv + (size_t)q * args->bytes;
      if (q == comm->rank ? sends[q] != to : 1)
        result = hoop__cuda_copy_async(comm, to, sends[q], args->bytes);
    }
  }
  if (result == HOOP_OK)
    result = hoop__cuda_sync(comm, recv);
  return result;
}

/* Settle once per communicator, alike on every rank, whether any rank loads a CUDA driver: 1 if
 * one does, 0 if none (never ask again), -1 if the exchange failed (*result). */
static int any_driver(hoop_comm *comm, struct hoop__ipc *ipc, hoop_result *result) {
  if (ipc->drivers == 0) {
    int any = hoop__cuda_loaded();
    if ((*result = agree(comm, &any, 1)) != HOOP_OK)
      return -1;
    ipc->drivers = any ? 1 : -1;
    if (any)
      HOOP__INFO(HOOP_SUBSYS_COLL,
                 "ipc: a rank loads a CUDA driver: calls of %zu bytes and more exchange their "
                 "buffers' IPC handles",
                 ipc->min_bytes);
    else
      HOOP__INFO(HOOP_SUBSYS_COLL, "ipc: no rank loads a CUDA driver: no call goes by CUDA IPC");
  }
  return ipc->drivers > 0;
}

/* Where every rank's buffers are readable here (ipc->sends, ipc->recvs): 0, or -1 with why. */
static int map_peers(hoop_comm *comm, struct hoop__ipc *ipc, const hoop__coll_args *args, char *why,
                     size_t whylen) {
  const ipc_desc *descs = ipc->descs;
  for (int i = 0; i < ipc->group.size; i++) {
    int q = hoop__member(&ipc->group, i);
    if (q == comm->rank) {
      ipc->sends[q] = args->coll == HOOP__COLL_BROADCAST ? args->recvbuf : (char *)args->sendbuf;
      ipc->recvs[q] = args->recvbuf;
      continue;
    }
    ipc->sends[q] = ipc->recvs[q] = NULL;
    if ((args->coll != HOOP__COLL_BROADCAST || q == args->root) &&
        !(ipc->sends[q] = peer_ptr(ipc, q, &descs[q], &descs[q].send, args->recvbuf, why, whylen)))
      return -1;
    if (args->coll == HOOP__COLL_ALLREDUCE &&
        !(ipc->recvs[q] = peer_ptr(ipc, q, &descs[q], &descs[q].recv, args->recvbuf, why, whylen)))
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

/* Exchange the descriptors and map the peers' buffers: 1 when every rank can go by IPC, 0 when
 * every rank stages (logged), -1 when an exchange failed (*result). */
static int settle(hoop_comm *comm, struct hoop__ipc *ipc, const hoop__coll_args *args, size_t bytes,
                  hoop_result *result) {
  char why[256] = "";
  ipc_desc *descs = ipc->descs;
  const hoop__group *group = &ipc->group;
  describe(comm, ipc, args, &descs[comm->rank], why, sizeof why);
  if ((*result = exchange(comm, group, descs)) != HOOP_OK)
    return -1;
  int ok = 1;
  for (int i = 0; i < group->size && ok; i++) {
    int q = hoop__member(group, i);
    if (!descs[q].ok) {
      ok = 0;
      if (q != comm->rank)
        snprintf(why, sizeof why, "rank %d cannot (its buffers are host memory, or not exported)",
                 q);
    }
  }
  if (ok) {
    /* Every member must have mapped its peers' buffers before any reads. Host by host, each
     * host decides for itself: one that stages runs hier, whose step between hosts is this
     * path's. */
    int mapped = map_peers(comm, ipc, args, why, sizeof why) == 0;
    if ((*result = hoop__group_agree(comm, group, &mapped, 0)) != HOOP_OK) {
      release(ipc);
      return -1;
    }
    if (!mapped && !why[0])
      snprintf(why, sizeof why, "another rank could not take part (its buffers, or mapping)");
    ok = mapped;
  }
  if (!ok) {
    release(ipc);
    if (descs[comm->rank].ok || comm->rank == 0) {
      if (!ipc->told_why)
        HOOP__INFO(HOOP_SUBSYS_COLL, "ipc: %s of %zu bytes is staged through host memory: %s",
                   comm->call, bytes, why);
      else
        HOOP__TRACE(HOOP_SUBSYS_COLL, "ipc: %s of %zu bytes is staged: %s", comm->call, bytes, why);
      ipc->told_why = 1;
    }
    return 0;
  }
  if (!ipc->told_used)
    HOOP__INFO(HOOP_SUBSYS_COLL,
               "ipc: %s of %zu bytes reads the peers' device buffers directly (CUDA IPC)",
               comm->call, bytes);
  ipc->told_used = 1;
  return 1;
}

int hoop__ipc_run(hoop_comm *comm, const hoop__coll_args *args, hoop__algo_fn algo,
                  hoop_result *result) {
  *result = HOOP_OK;
  const hoop__hosts *hosts = comm->hosts;
  if (comm->size < 2 || args->coll == HOOP__COLL_BARRIER || !hosts)
    return 0;
  /* All on one host: among all ranks. On several hosts with as many ranks each, an allreduce
   * that takes hier goes host by host. Both alike on every rank (the rank table's hosts,
   * all_shared, the algorithm chosen). */
  int flat = hosts->count == 1 && comm->all_shared;
  int by_host =
      !flat && hosts->even && args->coll == HOOP__COLL_ALLREDUCE && algo == hoop__allreduce_hier;
  if (!flat && !by_host)
    return 0;
  struct hoop__ipc *ipc = ipc_state(comm);
  if (!ipc) {
    /* Every other rank may be about to exchange descriptors: fail, not stage alone. */
    *result =
        hoop__set_error(comm, HOOP_ERR_SYSTEM, "%s: out of memory (CUDA IPC's state)", comm->call);
    return 1;
  }
  size_t bytes =
      args->coll == HOOP__COLL_ALLGATHER ? args->bytes * (size_t)comm->size : args->bytes;
  if (!ipc->enabled || bytes < ipc->min_bytes)
    return 0;
  ipc->by_host = by_host;
  ipc->group = by_host ? (hoop__group){hosts->per_host, hosts->local_index, hosts->local}
                       : hoop__whole(comm);
  int go = any_driver(comm, ipc, result);
  if (go > 0)
    go = settle(comm, ipc, args, bytes, result);
  if (go == 0)
    return 0;
  if (go < 0)
    return 1;
  comm->algo_name = by_host ? "ipc+hier" : "ipc";
  *result = args->coll == HOOP__COLL_ALLREDUCE ? run_allreduce(comm, ipc, args)
                                               : run_copies(comm, args, ipc->sends);
  if (*result != HOOP_OK) {
    /* Nothing of this call may still run on the GPU once it returns, and its mappings are
     * released: wait for what was queued, keeping the first error. The peers wait in a barrier
     * for this rank; a failure the communicator does not survive tells them. */
    char saved[sizeof comm->last_error];
    memcpy(saved, comm->last_error, sizeof saved);
    hoop__cuda_sync(comm, args->recvbuf);
    memcpy(comm->last_error, saved, sizeof saved);
    if (*result == HOOP_ERR_INVALID_ARG)
      *result = HOOP_ERR_SYSTEM;
  } else {
    /* No rank leaves (and its buffers change) while another may still read them. */
    *result = barrier(comm, &ipc->group);
  }
  release(ipc);
  return 1;
}

#else /* HOOP_HAVE_CUDA: device buffers are host memory, always staged (never, that is) */

int hoop__ipc_run(hoop_comm *comm, const hoop__coll_args *args, hoop__algo_fn algo,
                  hoop_result *result) {
  (void)comm, (void)args, (void)algo;
  *result = HOOP_OK;
  return 0;
}

void hoop__ipc_free(hoop_comm *comm) {
  (void)comm;
}

#endif /* HOOP_HAVE_CUDA */
