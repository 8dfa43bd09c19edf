/* repro.c - reproducible mode's algorithms for the reducing collectives (hoop(3), "Reproducible
 * reductions"). Whichever rank computes an element combines every rank's part of it over the one
 * fixed tree of mem/reduce.h (hoop__reduce_fixed: recursive doubling's fold and rounds, over the
 * ranks in rank order), so the bits depend on the inputs and the rank count alone: not on the
 * algorithm, the transport, the hosts, the chunk size, the fusion or the memory the buffers live
 * in. Small allreduces need nothing of this file: the board combines its slots over the tree, and
 * recursive doubling's order is the tree's.
 *
 * Owner (large calls): the input is cut into one block per rank, as the direct allreduce cuts it;
 * every rank sends each peer that peer's block of its input, and receives every peer's part of its
 * own block a chunk at a time (HOOP_CHUNK_BYTES), reducing each chunk over the tree as soon as all
 * its parts are in while the next chunk's are on the wire. Then an allreduce's finished blocks go
 * to every rank, a reduce's to the root. Each rank moves (n-1)/n of the input each way per phase,
 * as the ring does.
 *
 * All (small calls): every rank sends its whole input to every rank that needs the result (every
 * rank, or a reduce's root), which reduces all n inputs over the tree: one round of messages
 * instead of two, for calls whose latency is the messages'. */
#include <stdlib.h>

#include "coll/coll.h"
#include "coll/state.h"

/* Chunks of the own block whose parts are received at once. */
#define WINDOW 2

/* Post receives of len bytes from peer into buf on arena, cut as the sender's
 * hoop__arena_isend_chunks cuts the same length. */
static hoop_result recv_chunks(hoop_comm *comm, hoop__arena *arena, int peer, char *buf, size_t len,
                               size_t esize) {
  size_t cut = hoop__chunk_bytes(comm, len, esize);
  for (size_t done = 0; done < len; done += cut) {
    hoop__transfer *req = hoop__arena_next(comm, arena);
    if (!req)
      return HOOP_ERR_SYSTEM;
    hoop_result result =
        hoop__irecv(comm, peer, buf + done, len - done < cut ? len - done : cut, req);
    if (result != HOOP_OK)
      return result;
  }
  return HOOP_OK;
}

/* The first phase of the owner algorithm among group's members (the whole communicator, or the
 * ranks of one host, or one rank of each host): block q of src (bytes [offset[q], offset[q] +
 * length[q]), q a member's index) to each other member, and this member's block combined over the
 * tree from every member's part, in member order, into own (length[index] bytes; own may be this
 * member's block of src, exactly). AVG is divided by the member count: pass HOOP_SUM where the
 * members' results are parts of a larger sum. The sends stay on arena. */
static hoop_result owner_reduce(hoop_comm *comm, const hoop__group *group, hoop__arena *arena,
                                const char *src, char *own, const size_t *offset,
                                const size_t *length, size_t esize, hoop_dtype dtype, hoop_op op) {
  int n = group->size, r = group->index;
  size_t len = length[r];
  hoop_result result = HOOP_OK;
  for (int k = 1; k < n && result == HOOP_OK; k++) {
    int q = (r + k) % n;
    result = hoop__arena_isend_chunks(comm, arena, hoop__member(group, q), src + offset[q],
                                      length[q], esize);
  }
  if (result != HOOP_OK || len == 0)
    return result;
  size_t chunk = hoop__chunk_bytes(comm, len, esize), chunks = (len + chunk - 1) / chunk;
  if (chunk > len)
    chunk = len; /* one piece, as the senders cut it: no bigger slots than that */
  size_t slots = (size_t)WINDOW * (size_t)(n - 1);
  char *scratch = hoop__kind_scratch(comm, slots * chunk);
  hoop__transfer *reqs = calloc(slots, sizeof *reqs);
  const void **srcs = calloc((size_t)n, sizeof *srcs);
  if (!scratch || !reqs || !srcs) {
    free(reqs);
    free(srcs);
    return scratch ? hoop__set_error(comm, HOOP_ERR_SYSTEM, "%s: out of memory for requests",
                                     comm->call)
                   : HOOP_ERR_SYSTEM;
  }
  /* Slot (window w, member q) holds q's part of a chunk; this member's own is read in place. */
#define SLOT(w, q) ((size_t)(w) * (size_t)(n - 1) + (size_t)((q) < r ? (q) : (q)-1))
  size_t posted = 0;
  for (size_t c = 0; c < chunks && result == HOOP_OK; c++) {
    for (; posted < chunks && posted < c + WINDOW && result == HOOP_OK; posted++) {
      size_t w = posted % WINDOW, at = posted * chunk;
      size_t clen = len - at < chunk ? len - at : chunk;
      for (int q = 0; q < n && result == HOOP_OK; q++)
        if (q != r)
          result = hoop__irecv(comm, hoop__member(group, q), scratch + SLOT(w, q) * chunk, clen,
                               &reqs[SLOT(w, q)]);
    }
    size_t w = c % WINDOW, at = c * chunk;
    size_t clen = len - at < chunk ? len - at : chunk;
    for (int q = 0; q < n && result == HOOP_OK; q++) {
      if (q == r) {
        srcs[q] = src + offset[r] + at;
        continue;
      }
      result = hoop__wait(comm, &reqs[SLOT(w, q)]);
      srcs[q] = scratch + SLOT(w, q) * chunk;
    }
    if (result == HOOP_OK)
      result = hoop__kind_reduce_fixed(comm, own + at, srcs, n, clen / esize, dtype, op);
  }
#undef SLOT
  free(reqs);
  free(srcs);
  return result;
}

/* The second phase among group's members: this member's finished block of dst to every other
 * member, and every other member's block from it into its place; waits for those and for every
 * request on arena. */
static hoop_result group_share(hoop_comm *comm, const hoop__group *group, hoop__arena *arena,
                               char *dst, const size_t *offset, const size_t *length,
                               size_t esize) {
  int n = group->size, r = group->index;
  hoop_result result = HOOP_OK;
  for (int k = 1; k < n && result == HOOP_OK; k++) {
    int q = (r + k) % n;
    result = hoop__arena_isend_chunks(comm, arena, hoop__member(group, q), dst + offset[r],
                                      length[r], esize);
  }
  for (int k = 1; k < n && result == HOOP_OK; k++) {
    int q = (r - k + n) % n;
    result = recv_chunks(comm, arena, hoop__member(group, q), dst + offset[q], length[q], esize);
  }
  return result == HOOP_OK ? hoop__arena_wait_all(comm, arena) : result;
}

hoop_result hoop__allreduce_repro(hoop_comm *comm, const hoop__coll_args *args) {
  hoop__plan_segments(comm, args->count, args->esize);
  const size_t *offset = comm->coll->block_offset, *length = comm->coll->block_length;
  char *dst = args->recvbuf;
  hoop__arena arena = {0};
  hoop__group whole = hoop__whole(comm);
  hoop_result result = owner_reduce(comm, &whole, &arena, args->sendbuf, dst + offset[comm->rank],
                                    offset, length, args->esize, args->dtype, args->op);
  if (result == HOOP_OK)
    result = hoop__direct_share(comm, &arena, dst, offset, length, args->esize);
  hoop__arena_free(&arena);
  return result;
}

/* Host by host, where each host holds 2^k consecutive ranks: the tree's subtrees are then the
 * hosts (the fold pairs neighbours, which share a host, and a host's ranks make whole subtrees),
 * and the hosts combine over the same tree as ranks would. So each host's ranks combine their
 * segments over the host's subtree (owner), the ranks at one place on every host combine their
 * segment over the hosts' tree (owner among them) and share it, and each host's ranks share the
 * segments: the links carry what the default's host-by-host algorithm sends, and the bits are the
 * flat tree's. Elsewhere the flat owner algorithm. */
/* The hosts if they are the tree's subtrees: each holds 2^k consecutive ranks (alike on every
 * rank: from the rank table); else NULL. */
static const hoop__hosts *host_subtrees(const hoop_comm *comm) {
  const hoop__hosts *hosts = comm->coll->hosts;
  return hosts && hosts->consecutive && (hosts->per_host & (hosts->per_host - 1)) == 0 ? hosts
                                                                                       : NULL;
}

hoop_result hoop__allreduce_repro_hier(hoop_comm *comm, const hoop__coll_args *args) {
  const hoop__hosts *hosts = host_subtrees(comm);
  if (!hosts)
    return hoop__allreduce_repro(comm, args);
  int per_host = hosts->per_host;
  hoop__group local = {per_host, hosts->local_index, hosts->local};
  hoop__group cross = {hosts->count, hosts->host_index, hosts->cross};
  hoop_op partial = args->op == HOOP_AVG ? HOOP_SUM : args->op;
  size_t esize = args->esize, *seg_off = comm->coll->block_offset,
         *seg_len = comm->coll->block_length;
  for (int j = 0; j < per_host; j++) {
    size_t first, elems;
    hoop__segment(args->count, per_host, j, &first, &elems);
    seg_off[j] = first * esize;
    seg_len[j] = elems * esize;
  }
  size_t mine = seg_off[local.index], mine_count = seg_len[local.index] / esize;
  size_t *sub_off = hosts->offset, *sub_len = hosts->length;
  for (int h = 0; h < cross.size; h++) {
    size_t first, elems;
    hoop__segment(mine_count, cross.size, h, &first, &elems);
    sub_off[h] = mine + first * esize;
    sub_len[h] = elems * esize;
  }
  char *dst = args->recvbuf;
  hoop__arena within = {0}, across = {0}, out = {0};
  hoop_result result = owner_reduce(comm, &local, &within, args->sendbuf, dst + mine, seg_off,
                                    seg_len, esize, args->dtype, partial);
  if (result == HOOP_OK)
    result = owner_reduce(comm, &cross, &across, dst, dst + sub_off[cross.index], sub_off, sub_len,
                          esize, args->dtype, partial);
  if (result == HOOP_OK)
    result = group_share(comm, &cross, &across, dst, sub_off, sub_len, esize);
  if (result == HOOP_OK)
    result = hoop__kind_finish(comm, dst + mine, mine_count, args->dtype, args->op, comm->size);
  if (result == HOOP_OK)
    result = group_share(comm, &local, &out, dst, seg_off, seg_len, esize);
  if (result == HOOP_OK)
    result = hoop__arena_wait_all(comm, &within);
  hoop__arena_free(&within);
  hoop__arena_free(&across);
  hoop__arena_free(&out);
  return result;
}

hoop_result hoop__reduce_scatter_repro(hoop_comm *comm, const hoop__coll_args *args) {
  hoop__plan_blocks(comm, args->bytes);
  hoop__arena arena = {0};
  hoop__group whole = hoop__whole(comm);
  hoop_result result =
      owner_reduce(comm, &whole, &arena, args->sendbuf, args->recvbuf, comm->coll->block_offset,
                   comm->coll->block_length, args->esize, args->dtype, args->op);
  if (result == HOOP_OK)
    result = hoop__arena_wait_all(comm, &arena);
  hoop__arena_free(&arena);
  return result;
}

/* The reduce-scatter host by host, on the layouts repro-hier takes (else the flat owners): rank
 * h * P + j ends with block h * P + j. The blocks the ranks at place j of every host end with are
 * packed together (for j, then h), so that each host's place-j rank combines them over its host's
 * subtree (owners among the host's ranks), and then the place-j ranks combine each other's blocks
 * over the hosts' tree (owners among them): the flat tree's bits, the default's bytes on the
 * links. */
hoop_result hoop__reduce_scatter_repro_hier(hoop_comm *comm, const hoop__coll_args *args) {
  const hoop__hosts *hosts = host_subtrees(comm);
  if (!hosts)
    return hoop__reduce_scatter_repro(comm, args);
  int per_host = hosts->per_host;
  int count = hosts->count;
  hoop__group local = {per_host, hosts->local_index, hosts->local};
  hoop__group cross = {count, hosts->host_index, hosts->cross};
  hoop_op partial = args->op == HOOP_AVG ? HOOP_SUM : args->op;
  size_t bytes = args->bytes, group_bytes = bytes * (size_t)count;
  char *packed = malloc(bytes * (size_t)comm->size + group_bytes);
  if (!packed)
    return hoop__set_error(comm, HOOP_ERR_SYSTEM, "%s: cannot allocate %zu bytes", comm->call,
                           bytes * (size_t)comm->size + group_bytes);
  char *mine = packed + bytes * (size_t)comm->size; /* the place's blocks, this host's sums */
  hoop_result result = HOOP_OK;
  for (int j = 0; j < per_host && result == HOOP_OK; j++)
    for (int h = 0; h < count && result == HOOP_OK; h++)
      result =
          hoop__kind_copy(comm, packed + ((size_t)j * count + h) * bytes,
                          (const char *)args->sendbuf + ((size_t)h * per_host + j) * bytes, bytes);
  size_t *off = comm->coll->block_offset, *len = comm->coll->block_length;
  for (int j = 0; j < per_host; j++) {
    off[j] = (size_t)j * group_bytes;
    len[j] = group_bytes;
  }
  hoop__arena within = {0}, across = {0};
  if (result == HOOP_OK)
    result = owner_reduce(comm, &local, &within, packed, mine, off, len, args->esize, args->dtype,
                          partial);
  size_t *sub_off = hosts->offset, *sub_len = hosts->length;
  for (int h = 0; h < count; h++) {
    sub_off[h] = (size_t)h * bytes;
    sub_len[h] = bytes;
  }
  /* In place the result is this rank's block of sendbuf, which nothing reads any more. */
  if (result == HOOP_OK)
    result = owner_reduce(comm, &cross, &across, mine, args->recvbuf, sub_off, sub_len, args->esize,
                          args->dtype, partial);
  if (result == HOOP_OK)
    result = hoop__kind_finish(comm, args->recvbuf, args->count, args->dtype, args->op, comm->size);
  if (result == HOOP_OK)
    result = hoop__arena_wait_all(comm, &across);
  if (result == HOOP_OK)
    result = hoop__arena_wait_all(comm, &within);
  hoop__arena_free(&within);
  hoop__arena_free(&across);
  free(packed);
  return result;
}

/* A small reduce-scatter: the whole input allreduced by recursive doubling (whose order is the
 * fixed tree's) into a copy of the call's own, this rank's block kept: log2(n) rounds where the
 * owner algorithm sends n - 1 messages, which small calls pay for in latency. */
hoop_result hoop__reduce_scatter_repro_rd(hoop_comm *comm, const hoop__coll_args *args) {
  size_t total = args->bytes * (size_t)comm->size;
  char *all = malloc(total);
  if (!all)
    return hoop__set_error(comm, HOOP_ERR_SYSTEM, "%s: cannot allocate %zu bytes", comm->call,
                           total);
  hoop__coll_args whole = *args;
  whole.recvbuf = all;
  whole.count = args->count * (size_t)comm->size;
  whole.bytes = total;
  hoop_result result = hoop__allreduce_rd(comm, &whole);
  if (result == HOOP_OK)
    result =
        hoop__kind_copy(comm, args->recvbuf, all + (size_t)comm->rank * args->bytes, args->bytes);
  free(all);
  return result;
}

/* A reduce of small and middling inputs over the tree itself, as recursive doubling folds and
 * combines but towards one rank: the first 2(n - p) ranks fold pairwise (the even one's input to
 * the odd one, which combines it on the left), then a binomial tree over the p remaining, in which
 * at each round the member whose virtual rank has the round's bit set sends its partial result to
 * the one below and leaves: adjacent pairs, then pairs of pairs, the fixed tree's order. Virtual
 * rank 0 ends with the result and sends it to the root if it is another rank: fold, log2(p) rounds
 * and one more message, where the owner algorithm sends n - 1 messages from every rank. */
hoop_result hoop__reduce_repro_tree(hoop_comm *comm, const hoop__coll_args *args) {
  int r = comm->rank, root = args->root;
  size_t bytes = args->bytes;
  hoop__halving plan; /* its pairing: p, rem, the virtual ranks */
  hoop__halving_plan(comm, args->count, &plan);
  int holder = hoop__halving_rank(&plan, 0);
  hoop__transfer req;
  hoop_result result = HOOP_OK;
  if (plan.folded) {
    result = hoop__isend(comm, r + 1, args->sendbuf, bytes, &req);
    if (result == HOOP_OK)
      result = hoop__wait(comm, &req);
  } else {
    /* acc: the partial result (the root's recvbuf where the root holds it at the end); part: a
     * peer's partial result. */
    char *acc = r == root ? args->recvbuf : NULL, *own = NULL;
    char *part = malloc(bytes);
    if (!acc)
      acc = own = malloc(bytes);
    if (!part || !acc) {
      free(part);
      free(own);
      return hoop__set_error(comm, HOOP_ERR_SYSTEM, "%s: cannot allocate %zu bytes", comm->call,
                             bytes);
    }
    result = hoop__kind_copy(comm, acc, args->sendbuf, bytes);
    if (result == HOOP_OK && r < 2 * plan.rem) {
      result = hoop__irecv(comm, r - 1, part, bytes, &req);
      if (result == HOOP_OK)
        result = hoop__wait(comm, &req);
      if (result == HOOP_OK)
        result = hoop__kind_reduce3(comm, acc, part, acc, args->count, args->dtype, args->op);
    }
    for (int mask = 1; mask < plan.p && result == HOOP_OK; mask <<= 1) {
      int peer = hoop__halving_rank(&plan, plan.vrank ^ mask);
      if (plan.vrank & mask) {
        result = hoop__isend(comm, peer, acc, bytes, &req);
        if (result == HOOP_OK)
          result = hoop__wait(comm, &req);
        break;
      }
      result = hoop__irecv(comm, peer, part, bytes, &req);
      if (result == HOOP_OK)
        result = hoop__wait(comm, &req);
      if (result == HOOP_OK)
        result = hoop__kind_reduce3(comm, acc, acc, part, args->count, args->dtype, args->op);
    }
    if (result == HOOP_OK && r == holder) {
      result = hoop__kind_finish(comm, acc, args->count, args->dtype, args->op, comm->size);
      if (result == HOOP_OK && root != holder) {
        result = hoop__isend(comm, root, acc, bytes, &req);
        if (result == HOOP_OK)
          result = hoop__wait(comm, &req);
      }
    }
    free(part);
    free(own);
  }
  if (result == HOOP_OK && r == root && root != holder) {
    result = hoop__irecv(comm, holder, args->recvbuf, bytes, &req);
    if (result == HOOP_OK)
      result = hoop__wait(comm, &req);
  }
  return result;
}

/* A reduce's owner algorithm: the blocks finished, then each to the root, which finishes its own
 * in place. Other ranks' blocks are kept in host memory of the call's own (their recvbuf need not
 * exist). */
hoop_result hoop__reduce_repro(hoop_comm *comm, const hoop__coll_args *args) {
  int n = comm->size, r = comm->rank, root = args->root;
  hoop__plan_segments(comm, args->count, args->esize);
  const size_t *offset = comm->coll->block_offset, *length = comm->coll->block_length;
  char *own = NULL;
  if (r == root)
    own = (char *)args->recvbuf + offset[r];
  else if (length[r] && !(own = malloc(length[r])))
    return hoop__set_error(comm, HOOP_ERR_SYSTEM, "%s: cannot allocate %zu bytes for a block",
                           comm->call, length[r]);
  hoop__arena arena = {0};
  hoop__group whole = hoop__whole(comm);
  hoop_result result = owner_reduce(comm, &whole, &arena, args->sendbuf, own, offset, length,
                                    args->esize, args->dtype, args->op);
  if (result == HOOP_OK && r != root)
    result = hoop__arena_isend_chunks(comm, &arena, root, own, length[r], args->esize);
  for (int p = 0; p < n && result == HOOP_OK && r == root; p++)
    if (p != r)
      result =
          recv_chunks(comm, &arena, p, (char *)args->recvbuf + offset[p], length[p], args->esize);
  if (result == HOOP_OK)
    result = hoop__arena_wait_all(comm, &arena);
  hoop__arena_free(&arena);
  if (r != root)
    free(own);
  return result;
}

/* The all algorithm: every rank's whole input to each rank that takes the result (root -1: every
 * rank), which reduces them all over the tree into recvbuf. */
static hoop_result all_reduce(hoop_comm *comm, const hoop__coll_args *args, int root) {
  int n = comm->size, r = comm->rank;
  size_t bytes = args->bytes;
  int takes = root < 0 || r == root;
  hoop__arena arena = {0};
  hoop_result result = HOOP_OK;
  char *scratch = NULL;
  const void **srcs = NULL;
  if (takes) {
    scratch = hoop__kind_scratch(comm, (size_t)(n - 1) * bytes);
    if (!scratch)
      return HOOP_ERR_SYSTEM;
    if (!(srcs = calloc((size_t)n, sizeof *srcs)))
      return hoop__set_error(comm, HOOP_ERR_SYSTEM, "%s: out of memory", comm->call);
    for (int p = 0; p < n && result == HOOP_OK; p++) {
      srcs[p] = p == r ? args->sendbuf : scratch + (size_t)(p < r ? p : p - 1) * bytes;
      if (p != r)
        result = recv_chunks(comm, &arena, p, (char *)srcs[p], bytes, args->esize);
    }
  }
  for (int k = 1; k < n && result == HOOP_OK; k++) {
    int peer = (r + k) % n;
    if (root < 0 || peer == root)
      result = hoop__arena_isend_chunks(comm, &arena, peer, args->sendbuf, bytes, args->esize);
  }
  if (result == HOOP_OK)
    result = hoop__arena_wait_all(comm, &arena);
  if (result == HOOP_OK && takes)
    result =
        hoop__kind_reduce_fixed(comm, args->recvbuf, srcs, n, args->count, args->dtype, args->op);
  hoop__arena_free(&arena);
  free(srcs);
  return result;
}

hoop_result hoop__allreduce_repro_all(hoop_comm *comm, const hoop__coll_args *args) {
  return all_reduce(comm, args, -1);
}

hoop_result hoop__reduce_repro_all(hoop_comm *comm, const hoop__coll_args *args) {
  return all_reduce(comm, args, args->root);
}
