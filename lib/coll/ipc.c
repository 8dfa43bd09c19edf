/* ipc.c - collectives on device buffers of ranks that share one host, by CUDA IPC: each rank maps
 * its peers' device buffers into its own context (once per peer and allocation: the mappings are
 * cached for the process) and reads them with the GPU, so no byte crosses to the host and back.
 * The CPU side synchronises over the shared-memory transport; no kernel ever waits for another
 * process, so ranks sharing one GPU cannot deadlock.
 *
 * Allreduce: rank r reduces block r of every rank's input, in rank order, with the reduction
 * kernels (the same results as reduce.c) into block r of its own result; after a barrier it copies
 * every other block from its owner's result; a second barrier keeps each result buffer unchanged
 * until every peer has read it. Broadcast: every rank copies the root's buffer, then a barrier.
 * Allgather: every rank copies each peer's block, then a barrier.
 *
 * Whether a call goes this way is settled alike on every rank, as every algorithm choice must be:
 * on a communicator whose every pair of ranks talks over shared memory, a call of at least
 * HOOP_CUDA_IPC_MIN_BYTES starts with an exchange of a small descriptor per rank (its buffers'
 * kinds and IPC handles). Only when every rank's buffers are device memory that it could export,
 * and then every rank could map its peers', does the call run here; otherwise every rank runs it
 * the usual way (staged through host memory where its buffers are on the device), and
 * HOOP_DEBUG=info says why. A communicator none of whose ranks can load a CUDA driver agrees so
 * once and skips the exchange from then on.
 */
#include "config.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "coll/coll.h"
#include "coll/ipc.h"
#include "core/env.h"
#include "core/log.h"
#include "mem/cuda.h"

/* Mappings of peers' allocations, kept for the process (communicators of one job map the same
 * peers' memory, and the driver maps an allocation once per context); the least recently used one
 * that no call is using is closed to make room. */
#define MAX_MAPS 64

typedef struct ipc_desc {
  uint64_t process; /* a random number of this process: ranks in one process share pointers */
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
  int told_used, told_why;
};

static uint64_t this_process(void) {
  static uint64_t id;
  while (!id && getrandom(&id, sizeof id, 0) != (ssize_t)sizeof id)
    ;
  return id;
}

/* Every rank's flag combined (OR when any, else AND) by the dissemination pattern: after
 * ceil(log2 n) rounds each rank has heard, directly or through others, from every rank. */
static hoop_result agree(hoop_comm *comm, int *flag, int any) {
  int n = comm->size, r = comm->rank;
  hoop_result result = HOOP_OK;
  for (int distance = 1; distance < n && result == HOOP_OK; distance <<= 1) {
    char mine = (char)(*flag != 0), heard = 0;
    result = hoop__sendrecv(comm, (r + distance) % n, &mine, 1, (r - distance + n) % n, &heard, 1);
    *flag = any ? (*flag || heard) : (*flag && heard);
  }
  return result;
}

static hoop_result barrier(hoop_comm *comm) {
  int flag = 1;
  return agree(comm, &flag, 0);
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
  long min;
  if (hoop__parse_int(hoop__env_get("HOOP_CUDA_IPC_MIN_BYTES"), 0, 1L << 40, &min) != 0) {
    HOOP__WARN(HOOP_SUBSYS_COLL, "HOOP_CUDA_IPC_MIN_BYTES '%s' is not a number of bytes; 65536",
               hoop__env_get("HOOP_CUDA_IPC_MIN_BYTES"));
    min = 65536;
  }
  ipc->min_bytes = (size_t)min;
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
  hoop__cuda_ipc_close(map->base);
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

void hoop__ipc_free(hoop_comm *comm) {
  struct hoop__ipc *ipc = comm->ipc;
  if (!ipc)
    return;
  release(ipc);
  hoop__cuda_free(ipc->scratch);
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
  if (desc->process == this_process())
    return (char *)(uintptr_t)from->base + from->offset;
  void *context = hoop__cuda_context_of(near);
  pthread_mutex_lock(&maps_lock);
  mapping *hit = NULL;
  for (mapping *map = maps; map && !hit; map = map->next)
    if (!map->stale && map->process == desc->process && map->context == context &&
        map->from.base == from->base && map->from.buffer_id == from->buffer_id &&
        memcmp(map->from.handle, from->handle, sizeof from->handle) == 0)
      hit = map;
  if (!hit) {
    /* A mapping of the exporter's memory in this range that is not this allocation: the exporter
     * freed it since, and the range now holds another. */
    for (mapping *map = maps, *next; map; map = next) {
      next = map->next;
      if (map->process == desc->process && map->from.base < from->base + from->size &&
          from->base < map->from.base + map->from.size) {
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
      *hit = (mapping){desc->process, context, *from, base, 0, 0, 0, maps};
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

/* This rank's descriptor: ok only if its call's buffers are device memory it can export (and, for
 * an allreduce, the kernels load). */
static void describe(hoop_comm *comm, const hoop__coll_args *args, ipc_desc *desc, char *why,
                     size_t whylen) {
  memset(desc, 0, sizeof *desc);
  desc->process = this_process();
  const void *send = args->coll == HOOP__COLL_BROADCAST ? args->recvbuf : args->sendbuf;
  if (hoop__mem_kind_of(send) != HOOP__MEM_DEVICE ||
      hoop__mem_kind_of(args->recvbuf) != HOOP__MEM_DEVICE) {
    snprintf(why, whylen, "rank %d's buffers are not all device memory", comm->rank);
    return;
  }
  if (hoop__cuda_ipc_export(send, &desc->send, why, whylen) != 0 ||
      (args->coll == HOOP__COLL_ALLREDUCE &&
       hoop__cuda_ipc_export(args->recvbuf, &desc->recv, why, whylen) != 0))
    return;
  if (args->coll == HOOP__COLL_ALLREDUCE) {
    /* The kernels load now, or the call cannot run here (a build without nvcc, a driver that
     * cannot load them); a failure to load is not the call's error. */
    char saved[sizeof comm->last_error];
    memcpy(saved, comm->last_error, sizeof saved);
    if (hoop__cuda_kernels_load(comm, args->recvbuf) != HOOP_OK) {
      snprintf(why, whylen, "rank %d: %.200s", comm->rank, comm->last_error);
      memcpy(comm->last_error, saved, sizeof saved);
      return;
    }
  }
  desc->ok = 1;
}

/* Block q of count elements split over n ranks: [*first, *first + *len). */
static void block_of(size_t count, int n, int q, size_t *first, size_t *len) {
  size_t base = count / (size_t)n, extra = count % (size_t)n;
  *first = (size_t)q * base + ((size_t)q < extra ? (size_t)q : extra);
  *len = base + ((size_t)q < extra);
}

static hoop_result run_allreduce(hoop_comm *comm, struct hoop__ipc *ipc,
                                 const hoop__coll_args *args, char **sends, char **recvs) {
  int n = comm->size, r = comm->rank;
  size_t esize = args->esize, first, len;
  char *recv = args->recvbuf;
  block_of(args->count, n, r, &first, &len);
  hoop_result result = HOOP_OK;
  if (len) {
    char *dst = recv + first * esize;
    /* In place, block r of this rank's input is the result's: rank order would overwrite it
     * before its turn unless r is 0 or 1, so the partial result goes to scratch then. */
    char *acc = dst;
    if (args->sendbuf == args->recvbuf && r >= 2) {
      if (ipc->scratch_bytes < len * esize) {
        hoop__cuda_free(ipc->scratch);
        ipc->scratch_bytes = 0;
        if (!(ipc->scratch = hoop__cuda_alloc(len * esize, recv)))
          return hoop__set_error(comm, HOOP_ERR_SYSTEM,
                                 "%s: cuda: cannot allocate %zu bytes of device scratch",
                                 comm->call, len * esize);
        ipc->scratch_bytes = len * esize;
      }
      acc = ipc->scratch;
    }
    size_t at = first * esize;
    result = hoop__cuda_reduce3_async(comm, acc, sends[0] + at, sends[1] + at, len, args->dtype,
                                      args->op);
    for (int q = 2; q < n && result == HOOP_OK; q++)
      result = hoop__cuda_reduce3_async(comm, acc, acc, sends[q] + at, len, args->dtype, args->op);
    if (result == HOOP_OK)
      result = hoop__cuda_finish_async(comm, acc, len, args->dtype, args->op, n);
    if (result == HOOP_OK && acc != dst)
      result = hoop__cuda_copy_async(comm, dst, acc, len * esize);
    if (result == HOOP_OK)
      result = hoop__cuda_sync(comm, recv);
  }
  /* Every block is reduced (and every input read) before any rank copies them. */
  if (result == HOOP_OK)
    result = barrier(comm);
  for (int q = 0; q < n && result == HOOP_OK; q++) {
    block_of(args->count, n, q, &first, &len);
    if (q != r && len)
      result =
          hoop__cuda_copy_async(comm, recv + first * esize, recvs[q] + first * esize, len * esize);
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

int hoop__ipc_run(hoop_comm *comm, const hoop__coll_args *args, hoop_result *result) {
  *result = HOOP_OK;
#ifndef HOOP_HAVE_CUDA
  (void)peer_ptr, (void)describe, (void)run_allreduce, (void)run_copies;
  return 0;
#endif
  if (comm->size < 2 || !comm->all_shared || args->coll == HOOP__COLL_BARRIER)
    return 0;
  struct hoop__ipc *ipc = ipc_state(comm);
  if (!ipc) {
    HOOP__WARN(HOOP_SUBSYS_COLL, "ipc: out of memory; collectives on device buffers are staged");
    return 0;
  }
  size_t bytes =
      args->coll == HOOP__COLL_ALLGATHER ? args->bytes * (size_t)comm->size : args->bytes;
  if (!ipc->enabled || bytes < ipc->min_bytes || ipc->drivers < 0)
    return 0;
  if (ipc->drivers == 0) {
    int any = hoop__cuda_loaded();
    if ((*result = agree(comm, &any, 1)) != HOOP_OK)
      return 1;
    ipc->drivers = any ? 1 : -1;
    if (any)
      HOOP__INFO(HOOP_SUBSYS_COLL,
                 "ipc: a rank loads a CUDA driver: calls of %zu bytes and more exchange their "
                 "buffers' IPC handles",
                 ipc->min_bytes);
    else
      HOOP__INFO(HOOP_SUBSYS_COLL, "ipc: no rank loads a CUDA driver: no call goes by CUDA IPC");
    if (!any)
      return 0;
  }
  char why[256] = "";
  ipc_desc *descs = ipc->descs;
  describe(comm, args, &descs[comm->rank], why, sizeof why);
  hoop__coll_args gather = {0};
  gather.coll = HOOP__COLL_ALLGATHER;
  gather.recvbuf = descs;
  gather.bytes = sizeof *descs;
  if ((*result = hoop__allgather_bruck(comm, &gather)) != HOOP_OK)
    return 1;
  int ok = 1;
  for (int q = 0; q < comm->size && ok; q++)
    if (!descs[q].ok) {
      ok = 0;
      if (q != comm->rank)
        snprintf(why, sizeof why, "rank %d cannot (its buffers are host memory, or not exported)",
                 q);
    }
  char **sends = ipc->sends, **recvs = ipc->recvs;
  if (ok) {
    /* Map the peers' buffers; every rank must have managed before any reads. */
    int mapped = 1;
    const void *near = args->recvbuf;
    for (int q = 0; q < comm->size && mapped; q++) {
      if (q == comm->rank) {
        sends[q] = args->coll == HOOP__COLL_BROADCAST ? args->recvbuf : (char *)args->sendbuf;
        recvs[q] = args->recvbuf;
        continue;
      }
      int wanted = args->coll != HOOP__COLL_BROADCAST || q == args->root;
      sends[q] = recvs[q] = NULL;
      if (wanted &&
          !(sends[q] = peer_ptr(ipc, q, &descs[q], &descs[q].send, near, why, sizeof why)))
        mapped = 0;
      if (mapped && args->coll == HOOP__COLL_ALLREDUCE &&
          !(recvs[q] = peer_ptr(ipc, q, &descs[q], &descs[q].recv, near, why, sizeof why)))
        mapped = 0;
    }
    if ((*result = agree(comm, &mapped, 0)) != HOOP_OK) {
      release(ipc);
      return 1;
    }
    if (!mapped && !why[0])
      snprintf(why, sizeof why, "another rank could not map its peers' buffers");
    ok = mapped;
  }
  if (!ok) {
    release(ipc);
    if (descs[comm->rank].ok || comm->rank == 0) {
      if (!ipc->told_why++)
        HOOP__INFO(HOOP_SUBSYS_COLL, "ipc: %s of %zu bytes is staged through host memory: %s",
                   comm->call, bytes, why);
      else
        HOOP__TRACE(HOOP_SUBSYS_COLL, "ipc: %s of %zu bytes is staged: %s", comm->call, bytes, why);
    }
    return 0;
  }
  if (!ipc->told_used++)
    HOOP__INFO(HOOP_SUBSYS_COLL,
               "ipc: %s of %zu bytes reads the peers' device buffers directly (CUDA IPC)",
               comm->call, bytes);
  comm->algo_name = "ipc";
  *result = args->coll == HOOP__COLL_ALLREDUCE ? run_allreduce(comm, ipc, args, sends, recvs)
                                               : run_copies(comm, args, sends);
  /* No rank leaves (and its buffers change) while another may still read them. */
  if (*result == HOOP_OK)
    *result = barrier(comm);
  release(ipc);
  return 1;
}
