/* mapped.c - collectives in which every member reads its peers' buffers directly, where the path
 * that chose them (tune.c's paths) mapped the peers' buffers into this process; the memory kind's
 * queued work does the reading and the members synchronise over the transports. No queued work
 * ever waits for another process, so members sharing one device cannot deadlock.
 *
 * Allreduce: member i reduces block i of every member's input, in member order, in passes of up to
 * the kind's many_max sources (the same results as the host kind's chain of reduce3; in
 * reproducible mode in one pass over the fixed tree, hoop__reduce_fixed's bits), into block i of
 * its own result; after a barrier it copies every other block from its owner's result; the
 * caller's last barrier keeps each result unchanged until every peer has read it. Reduce-scatter:
 * member i reduces block i of every member's input into its result, and that is all. Broadcast:
 * every member copies the root's buffer. Allgather: every member copies each peer's block.
 * All-to-all: every member copies its block of each peer's input.
 *
 * Host by host (the members are one host's ranks, on a job of several hosts with as many ranks on
 * each): member i reduces the block hoop__allreduce_hier's ring reduce-scatter would leave with it
 * (block i + 1), allreduces it with the ranks at the same place on the other hosts through host
 * memory (hoop__allreduce_group: hier's step between hosts, message for message, so that a host
 * that runs hier itself meets this one there), then copies the other blocks from their owners. A
 * compressed call (mapped->compressed) goes the same way, except that member i reduces block i,
 * the segment the staged compressed call gives it, and the step between hosts is that call's
 * (hoop__compressed_by_host), with the device kind's codec. A compressed reduce-scatter host by
 * host: member l sums its host's parts of the blocks of the ranks at place l on every host, and
 * the same step between hosts sums them into its result. */
#include "coll/coll.h"
#include "coll/state.h"

/* Whether member i reduces block i + 1 (hier's shape host by host) rather than block i. */
static int shifted(const hoop__mapped *mapped) {
  return mapped->by_host && !mapped->compressed;
}

int hoop__mapped_own(const hoop__mapped *mapped, int index) {
  return shifted(mapped) ? (index + 1) % mapped->group.size : index;
}

/* The block of the members' inputs this rank reduces. */
static int own_block(const hoop__mapped *mapped) {
  return hoop__mapped_own(mapped, mapped->group.index);
}

/* The member that reduces block q. */
static int block_owner(const hoop__mapped *mapped, int q) {
  int n = mapped->group.size;
  return hoop__member(&mapped->group, shifted(mapped) ? (q - 1 + n) % n : q);
}

/* Block at of the members' inputs reduced into dst, divided by the rank count at the end unless
 * the step between hosts does it. */
static hoop_result reduce_block(hoop_comm *comm, const hoop__mapped *mapped,
                                const hoop__coll_args *args, char *dst, size_t at, size_t len) {
  const hoop__group *group = &mapped->group;
  const hoop__mem_ops *kind = comm->mem;
  int n = group->size, many = kind->many_max;
  /* In place, block r of this rank's input is the result's: a first pass that does not read it
   * would overwrite it before its turn, so the partial result goes to scratch then (the path made
   * it ready). */
  const void *srcs[HOOP__MEM_MANY_MAX];
  hoop_result result = HOOP_OK;
  if (comm->reproducible) {
    /* Every member's part over the fixed tree in one pass (tune.c takes this path in the mode
     * only where the members fit one and it is not host by host); in place too, as each element
     * is read from every source before it is written. */
    for (int q = 0; q < n; q++)
      srcs[q] = mapped->sends[hoop__member(group, q)] + at;
    result = kind->reduce_many_tree(comm, dst, srcs, n, len, args->dtype, args->op,
                                    args->op == HOOP_AVG ? comm->size : 0);
    return result == HOOP_OK ? kind->sync(comm) : result;
  }
  char *acc = dst;
  if (dst == mapped->sends[comm->rank] + at && group->index >= many &&
      !(acc = hoop__kind_scratch(comm, len * args->esize)))
    return HOOP_ERR_SYSTEM;
  for (int q = 0; q < n && result == HOOP_OK;) {
    int k = 0;
    if (q > 0)
      srcs[k++] = acc;
    while (k < many && q < n)
      srcs[k++] = mapped->sends[hoop__member(group, q++)] + at;
    int divide = q == n && args->op == HOOP_AVG && !mapped->by_host ? comm->size : 0;
    result = kind->reduce_many(comm, acc, srcs, k, len, args->dtype, args->op, divide);
  }
  if (result == HOOP_OK && acc != dst)
    result = kind->copy_queued(comm, dst, acc, len * args->esize);
  return result == HOOP_OK ? kind->sync(comm) : result;
}

/* Host by host: the reduced block allreduced with the other hosts' through host memory, on the
 * host kind. Every rank takes part in the ring between hosts, with or without a block. */
static hoop_result across_hosts(hoop_comm *comm, const hoop__mapped *mapped,
                                const hoop__coll_args *args, char *block, size_t len) {
  if (mapped->compressed)
    return hoop__compressed_by_host(comm, args, block, len);
  const hoop__hosts *hosts = comm->coll->hosts;
  hoop__group cross = {hosts->count, hosts->host_index, hosts->cross};
  static char none[16]; /* the host memory of an empty block */
  char *host = len ? mapped->host : none;
  size_t bytes = len * args->esize;
  hoop_result result = hoop__mem_copy(comm, host, block, bytes);
  const hoop__mem_ops *kind = comm->mem;
  comm->mem = &hoop__mem_host;
  if (result == HOOP_OK)
    result = hoop__allreduce_group(comm, &cross, host, len, args->dtype, args->op);
  comm->mem = kind;
  return result == HOOP_OK ? hoop__mem_copy(comm, block, host, bytes) : result;
}

static hoop_result mapped_allreduce(hoop_comm *comm, const hoop__mapped *mapped,
                                    const hoop__coll_args *args) {
  int n = mapped->group.size, own = own_block(mapped);
  size_t esize = args->esize, first, len;
  char *recv = args->recvbuf;
  hoop__segment(args->count, n, own, &first, &len);
  hoop_result result = HOOP_OK;
  if (len)
    result = reduce_block(comm, mapped, args, recv + first * esize, first * esize, len);
  if (mapped->by_host && result == HOOP_OK)
    result = across_hosts(comm, mapped, args, recv + first * esize, len);
  /* Every block is final (and every input read) before any member copies them. */
  if (result == HOOP_OK)
    result = hoop__group_barrier(comm, &mapped->group);
  for (int q = 0; q < n && result == HOOP_OK; q++) {
    hoop__segment(args->count, n, q, &first, &len);
    if (q != own && len)
      result = comm->mem->copy_queued(comm, recv + first * esize,
                                      mapped->recvs[block_owner(mapped, q)] + first * esize,
                                      len * esize);
  }
  return result == HOOP_OK ? comm->mem->sync(comm) : result;
}

/* Reduce-scatter: block r of every member's input reduced into this rank's result; nothing to copy
 * after (the caller's last barrier keeps every input unchanged until its peers have read it). */
static hoop_result mapped_reduce_scatter(hoop_comm *comm, const hoop__mapped *mapped,
                                         const hoop__coll_args *args) {
  return reduce_block(comm, mapped, args, args->recvbuf, (size_t)comm->rank * args->bytes,
                      args->count);
}

/* Host by host (a compressed call): the block of the rank at this rank's place on each host, summed
 * over this host's members into the kind's scratch, host after host (the path made it large
 * enough), then across hosts into the result. */
static hoop_result mapped_reduce_scatter_hosts(hoop_comm *comm, const hoop__mapped *mapped,
                                               const hoop__coll_args *args) {
  const hoop__hosts *hosts = comm->coll->hosts;
  char *sums = hoop__kind_scratch(comm, 1);
  hoop_result result = sums ? HOOP_OK : HOOP_ERR_SYSTEM;
  for (int j = 0; j < hosts->count && result == HOOP_OK; j++) {
    int owner = hosts->at[j * hosts->per_host + mapped->group.index];
    result = reduce_block(comm, mapped, args, sums + (size_t)j * args->bytes,
                          (size_t)owner * args->bytes, args->count);
  }
  return result == HOOP_OK ? hoop__compressed_by_host(comm, args, sums, 0) : result;
}

/* All-to-all: block r of every member's input copied to where this rank's result keeps it. In
 * place, the peers read the blocks this rank's result overwrites: gathered into scratch first,
 * copied over once every member has read its input (a barrier). */
static hoop_result mapped_alltoall(hoop_comm *comm, const hoop__mapped *mapped,
                                   const hoop__coll_args *args) {
  int n = comm->size;
  size_t bytes = args->bytes, at = (size_t)comm->rank * bytes;
  int in_place = args->sendbuf == args->recvbuf;
  char *to = in_place ? hoop__kind_scratch(comm, bytes * (size_t)n) : args->recvbuf;
  if (!to)
    return HOOP_ERR_SYSTEM;
  hoop_result result = HOOP_OK;
  for (int q = 0; q < n && result == HOOP_OK; q++)
    result = comm->mem->copy_queued(comm, to + (size_t)q * bytes, mapped->sends[q] + at, bytes);
  if (result == HOOP_OK)
    result = comm->mem->sync(comm);
  if (!in_place || result != HOOP_OK)
    return result;
  if ((result = hoop__group_barrier(comm, &mapped->group)) == HOOP_OK &&
      (result = comm->mem->copy_queued(comm, args->recvbuf, to, bytes * (size_t)n)) == HOOP_OK)
    result = comm->mem->sync(comm);
  return result;
}

static hoop_result mapped_copies(hoop_comm *comm, const hoop__mapped *mapped,
                                 const hoop__coll_args *args) {
  char *recv = args->recvbuf;
  hoop_result result = HOOP_OK;
  if (args->coll == HOOP__COLL_BROADCAST) {
    if (comm->rank != args->root)
      result = comm->mem->copy_queued(comm, recv, mapped->sends[args->root], args->bytes);
  } else {
    for (int q = 0; q < comm->size && result == HOOP_OK; q++) {
      char *to = recv + (size_t)q * args->bytes;
      if (q == comm->rank ? mapped->sends[q] != to : 1)
        result = comm->mem->copy_queued(comm, to, mapped->sends[q], args->bytes);
    }
  }
  return result == HOOP_OK ? comm->mem->sync(comm) : result;
}

hoop_result hoop__mapped_run(hoop_comm *comm, const hoop__mapped *mapped,
                             const hoop__coll_args *args) {
  switch (args->coll) {
  case HOOP__COLL_ALLREDUCE: return mapped_allreduce(comm, mapped, args);
  case HOOP__COLL_REDUCE_SCATTER:
    return mapped->by_host ? mapped_reduce_scatter_hosts(comm, mapped, args)
                           : mapped_reduce_scatter(comm, mapped, args);
  case HOOP__COLL_ALLTOALL: return mapped_alltoall(comm, mapped, args);
  default: return mapped_copies(comm, mapped, args);
  }
}

hoop_result hoop__group_barrier(hoop_comm *comm, const hoop__group *group) {
  int flag = 1;
  return group->ranks ? hoop__group_agree(comm, group, &flag, 0)
                      : hoop__barrier_dissemination(comm, NULL);
}
