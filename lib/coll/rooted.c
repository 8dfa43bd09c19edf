/* rooted.c - the collectives with a root: reduce (every rank's input reduced into the root's
 * result), gather (every rank's block into the root's buffer, in rank order) and scatter (the
 * root's blocks, one to each rank).
 *
 * Tree: a binomial tree over the ranks relative to the root (vrank = rank - root mod n), log2(n)
 * rounds: a rank's subtree is the vranks from its own up to the next multiple of its lowest set
 * bit. Reduce sums up the tree; gather collects each subtree's blocks, contiguous in vrank order,
 * and the root rotates them into rank order; scatter sends each child its subtree's blocks.
 * Linear: the root sends to or receives from every rank in turn, one message each (reduce keeps
 * two receives posted and reduces one while the other arrives).
 * Direct (reduce): each rank reduces its segment straight from every other rank's part (the
 * direct allreduce's first half), then the root gathers the segments: every rank moves about one
 * input's worth, as the ring does, in two rounds. */
#include <stdlib.h>

#include "coll/coll.h"

static int vrank_of(const hoop_comm *comm, int root) {
  return (comm->rank - root + comm->size) % comm->size;
}

static int real_rank(const hoop_comm *comm, int root, int vrank) {
  return (vrank + root) % comm->size;
}

static hoop_result send_wait(hoop_comm *comm, int peer, const void *buf, size_t len) {
  hoop__transfer req;
  hoop_result result = hoop__isend(comm, peer, buf, len, &req);
  return result == HOOP_OK ? hoop__wait(comm, &req) : result;
}

static hoop_result recv_wait(hoop_comm *comm, int peer, void *buf, size_t len) {
  hoop__transfer req;
  hoop_result result = hoop__irecv(comm, peer, buf, len, &req);
  return result == HOOP_OK ? hoop__wait(comm, &req) : result;
}

/* The root's result, divided by the rank count for AVG. */
static hoop_result finish_root(hoop_comm *comm, const hoop__coll_args *args, char *recv,
                               const char *partial) {
  hoop_result result = HOOP_OK;
  if (partial != recv)
    result = hoop__kind_copy(comm, recv, partial, args->bytes);
  return result == HOOP_OK
             ? hoop__kind_finish(comm, recv, args->count, args->dtype, args->op, comm->size)
             : result;
}

/* ---- reduce ---------------------------------------------------------------------------------- */

hoop_result hoop__reduce_tree(hoop_comm *comm, const hoop__coll_args *args) {
  int n = comm->size, vrank = vrank_of(comm, args->root);
  size_t bytes = args->bytes;
  /* The partial result: the root's own result, elsewhere scratch; received parts beside it. */
  char *scratch = hoop__kind_scratch(comm, 2 * bytes);
  if (!scratch)
    return HOOP_ERR_SYSTEM;
  char *acc = vrank == 0 ? args->recvbuf : scratch + bytes, *part = scratch;
  const char *cur = args->sendbuf;
  hoop_result result = HOOP_OK;
  for (int mask = 1; mask < n && result == HOOP_OK; mask <<= 1) {
    if (vrank & mask)
      return send_wait(comm, real_rank(comm, args->root, vrank - mask), cur, bytes);
    if (vrank + mask >= n)
      continue;
    result = recv_wait(comm, real_rank(comm, args->root, vrank + mask), part, bytes);
    if (result == HOOP_OK)
      result = hoop__kind_reduce3(comm, acc, cur, part, args->count, args->dtype, args->op);
    cur = acc;
  }
  return result == HOOP_OK ? finish_root(comm, args, args->recvbuf, cur) : result;
}

hoop_result hoop__reduce_linear(hoop_comm *comm, const hoop__coll_args *args) {
  int n = comm->size, root = args->root;
  size_t bytes = args->bytes;
  if (comm->rank != root)
    return send_wait(comm, root, args->sendbuf, bytes);
  char *scratch = hoop__kind_scratch(comm, 2 * bytes);
  if (!scratch)
    return HOOP_ERR_SYSTEM;
  /* The others in rank order, two receives posted: one reduced while the next arrives. */
  hoop__transfer req[2];
  const char *cur = args->sendbuf;
  hoop_result result = HOOP_OK;
  int next = root == 0 ? 1 : 0, posted = 0;
  /* Peer k (k-th rank other than the root, in rank order) arrives in slot k % 2. */
  for (int k = 0; k < n - 1 && k < 2 && result == HOOP_OK; k++, posted++) {
    result = hoop__irecv(comm, next, scratch + (size_t)(k % 2) * bytes, bytes, &req[k % 2]);
    next = next + 1 == root ? next + 2 : next + 1;
  }
  for (int k = 0; k < n - 1 && result == HOOP_OK; k++) {
    char *slot = scratch + (size_t)(k % 2) * bytes;
    if ((result = hoop__wait(comm, &req[k % 2])) != HOOP_OK)
      break;
    result = hoop__kind_reduce3(comm, args->recvbuf, cur, slot, args->count, args->dtype, args->op);
    cur = args->recvbuf;
    if (result == HOOP_OK && posted < n - 1) {
      result = hoop__irecv(comm, next, slot, bytes, &req[k % 2]);
      next = next + 1 == root ? next + 2 : next + 1;
      posted++;
    }
  }
  return result == HOOP_OK ? finish_root(comm, args, args->recvbuf, cur) : result;
}

hoop_result hoop__reduce_direct(hoop_comm *comm, const hoop__coll_args *args) {
  int n = comm->size, root = args->root;
  size_t esize = args->esize;
  size_t *offset = malloc((size_t)n * sizeof *offset), *length = malloc((size_t)n * sizeof *length);
  if (!offset || !length) {
    free(offset);
    free(length);
    return hoop__set_error(comm, HOOP_ERR_SYSTEM, "%s: out of memory", comm->call);
  }
  for (int i = 0; i < n; i++) {
    size_t first, elems;
    hoop__segment(args->count, n, i, &first, &elems);
    offset[i] = first * esize;
    length[i] = elems * esize;
  }
  /* This rank's segment, finished: at its place in the root's result, elsewhere in memory of its
   * own (the direct reduction takes the library's scratch; rooted calls run on host memory). */
  char *own, *held = NULL;
  if (comm->rank == root) {
    own = (char *)args->recvbuf + offset[comm->rank];
  } else if (!(own = held = malloc(length[comm->rank] ? length[comm->rank] : 1))) {
    free(offset);
    free(length);
    return hoop__set_error(comm, HOOP_ERR_SYSTEM, "%s: out of memory", comm->call);
  }
  hoop__arena arena = {0};
  hoop_result result = hoop__direct_reduce(comm, &arena, args->sendbuf, own, offset, length, esize,
                                           args->dtype, args->op);
  hoop_result waited = hoop__arena_wait_all(comm, &arena);
  if (result == HOOP_OK)
    result = waited;
  /* The root gathers the other segments (finished, AVG divided) into place. */
  if (result == HOOP_OK && comm->rank != root && length[comm->rank])
    result = send_wait(comm, root, own, length[comm->rank]);
  if (result == HOOP_OK && comm->rank == root) {
    hoop__transfer *reqs = calloc((size_t)n, sizeof *reqs);
    if (!reqs)
      result = hoop__set_error(comm, HOOP_ERR_SYSTEM, "%s: out of memory", comm->call);
    for (int q = 0; q < n && result == HOOP_OK; q++)
      if (q != root && length[q])
        result = hoop__irecv(comm, q, (char *)args->recvbuf + offset[q], length[q], &reqs[q]);
    for (int q = 0; q < n && result == HOOP_OK; q++)
      if (q != root && length[q])
        result = hoop__wait(comm, &reqs[q]);
    free(reqs);
  }
  hoop__arena_free(&arena);
  free(held);
  free(offset);
  free(length);
  return result;
}

/* ---- gather ---------------------------------------------------------------------------------- */

/* Blocks of a subtree in vrank order, rotated into rank order at the root: vrank j is rank
 * (j + root) % n. */
static hoop_result rotate_into(hoop_comm *comm, char *dst, const char *vorder, size_t block,
                               int root, int blocks_to_dst) {
  int n = comm->size;
  size_t head = (size_t)(n - root) * block, tail = (size_t)root * block;
  /* gather: vrank order -> rank order; scatter: rank order (vorder) -> vrank order (dst). */
  char *dst_head = blocks_to_dst ? dst + tail : dst, *dst_tail = blocks_to_dst ? dst : dst + head;
  const char *src_head = blocks_to_dst ? vorder : vorder + tail;
  const char *src_tail = blocks_to_dst ? vorder + head : vorder;
  hoop_result result = hoop__kind_copy(comm, dst_head, src_head, head);
  return result == HOOP_OK ? hoop__kind_copy(comm, dst_tail, src_tail, tail) : result;
}

hoop_result hoop__gather_tree(hoop_comm *comm, const hoop__coll_args *args) {
  int n = comm->size, root = args->root, vrank = vrank_of(comm, root);
  size_t block = args->bytes;
  int lowbit = vrank ? vrank & -vrank : n;
  int span = vrank + lowbit > n ? n - vrank : lowbit; /* blocks of this subtree */
  /* Subtree blocks in vrank order: the root's own buffer when it is rank 0's, else scratch. */
  int direct = vrank == 0 && root == 0;
  char *buf = direct ? args->recvbuf : hoop__kind_scratch(comm, (size_t)span * block);
  if (!buf)
    return HOOP_ERR_SYSTEM;
  hoop_result result =
      buf == args->sendbuf ? HOOP_OK : hoop__kind_copy(comm, buf, args->sendbuf, block);
  int have = 1;
  for (int mask = 1; mask < n && result == HOOP_OK; mask <<= 1) {
    if (vrank & mask)
      return send_wait(comm, real_rank(comm, root, vrank - mask), buf, (size_t)have * block);
    int child = vrank + mask;
    if (child >= n)
      continue;
    int child_span = child + mask > n ? n - child : mask;
    result = recv_wait(comm, real_rank(comm, root, child), buf + (size_t)mask * block,
                       (size_t)child_span * block);
    have += child_span;
  }
  if (result == HOOP_OK && !direct)
    result = rotate_into(comm, args->recvbuf, buf, block, root, 1);
  return result;
}

hoop_result hoop__gather_linear(hoop_comm *comm, const hoop__coll_args *args) {
  int n = comm->size, root = args->root;
  size_t block = args->bytes;
  if (comm->rank != root)
    return send_wait(comm, root, args->sendbuf, block);
  hoop__transfer *reqs = calloc((size_t)n, sizeof *reqs);
  if (!reqs)
    return hoop__set_error(comm, HOOP_ERR_SYSTEM, "%s: out of memory", comm->call);
  char *recv = args->recvbuf;
  hoop_result result = HOOP_OK;
  for (int q = 0; q < n && result == HOOP_OK; q++)
    if (q != root)
      result = hoop__irecv(comm, q, recv + (size_t)q * block, block, &reqs[q]);
  if (result == HOOP_OK && args->sendbuf != recv + (size_t)root * block)
    result = hoop__kind_copy(comm, recv + (size_t)root * block, args->sendbuf, block);
  for (int q = 0; q < n && result == HOOP_OK; q++)
    if (q != root)
      result = hoop__wait(comm, &reqs[q]);
  free(reqs);
  return result;
}

/* ---- scatter --------------------------------------------------------------------------------- */

hoop_result hoop__scatter_tree(hoop_comm *comm, const hoop__coll_args *args) {
  int n = comm->size, root = args->root, vrank = vrank_of(comm, root);
  size_t block = args->bytes;
  int lowbit = vrank ? vrank & -vrank : n;
  int span = vrank + lowbit > n ? n - vrank : lowbit;
  const char *buf;
  hoop_result result = HOOP_OK;
  int mask = 1;
  if (vrank == 0) {
    /* The root's blocks in vrank order: its own buffer when it is rank 0's. */
    if (root == 0) {
      buf = args->sendbuf;
    } else {
      char *rotated = hoop__kind_scratch(comm, (size_t)n * block);
      if (!rotated)
        return HOOP_ERR_SYSTEM;
      result = rotate_into(comm, rotated, args->sendbuf, block, root, 0);
      buf = rotated;
    }
    while (mask < n)
      mask <<= 1;
  } else {
    char *sub = hoop__kind_scratch(comm, (size_t)span * block);
    if (!sub)
      return HOOP_ERR_SYSTEM;
    mask = lowbit;
    result = recv_wait(comm, real_rank(comm, root, vrank - lowbit), sub, (size_t)span * block);
    buf = sub;
  }
  /* Each child's subtree, largest first. */
  hoop__arena arena = {0};
  for (mask >>= 1; mask > 0 && result == HOOP_OK; mask >>= 1) {
    int child = vrank + mask;
    if (child >= n)
      continue;
    int child_span = child + mask > n ? n - child : mask;
    result = hoop__arena_isend(comm, &arena, real_rank(comm, root, child),
                               buf + (size_t)mask * block, (size_t)child_span * block);
  }
  if (result == HOOP_OK && args->recvbuf != buf)
    result = hoop__kind_copy(comm, args->recvbuf, buf, block);
  hoop_result waited = hoop__arena_wait_all(comm, &arena);
  hoop__arena_free(&arena);
  return result == HOOP_OK ? waited : result;
}

hoop_result hoop__scatter_linear(hoop_comm *comm, const hoop__coll_args *args) {
  int n = comm->size, root = args->root;
  size_t block = args->bytes;
  if (comm->rank != root)
    return recv_wait(comm, root, args->recvbuf, block);
  const char *send = args->sendbuf;
  hoop__arena arena = {0};
  hoop_result result = HOOP_OK;
  for (int k = 1; k < n && result == HOOP_OK; k++) {
    int q = (root + k) % n;
    result = hoop__arena_isend(comm, &arena, q, send + (size_t)q * block, block);
  }
  if (result == HOOP_OK && args->recvbuf != send + (size_t)root * block)
    result = hoop__kind_copy(comm, args->recvbuf, send + (size_t)root * block, block);
  hoop_result waited = hoop__arena_wait_all(comm, &arena);
  hoop__arena_free(&arena);
  return result == HOOP_OK ? waited : result;
}
