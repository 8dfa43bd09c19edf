/* broadcast.c - hoop_broadcast's algorithms: a binomial tree (log2(n) rounds of latency) and a
 * pipelined chain from the root around the ring (every link carries the buffer once, so the time
 * approaches bytes / link bandwidth whatever the rank count). tune.c chooses between them. */
#include "coll/coll.h"

hoop_result hoop__broadcast_tree(hoop_comm *comm, const hoop__coll_args *args) {
  char *buf = args->recvbuf;
  size_t bytes = args->bytes;
  int n = comm->size, root = args->root;
  int vrank = (comm->rank - root + n) % n; /* rank relative to the root */
  int mask = 1;
  hoop_result result = HOOP_OK;
  /* Receive once, from the rank that differs in this rank's lowest set bit. */
  while (mask < n) {
    if (vrank & mask) {
      hoop__transfer req;
      int from = (vrank - mask + root) % n;
      result = hoop__irecv(comm, from, buf, bytes, &req);
      if (result == HOOP_OK)
        result = hoop__wait(comm, &req);
      break;
    }
    mask <<= 1;
  }
  /* Then pass it on to the subtrees below that bit, largest first. */
  hoop__arena arena = {0};
  for (mask >>= 1; mask > 0 && result == HOOP_OK; mask >>= 1)
    if (vrank + mask < n)
      result = hoop__arena_isend(comm, &arena, (vrank + mask + root) % n, buf, bytes);
  if (result == HOOP_OK)
    result = hoop__arena_wait_all(comm, &arena);
  hoop__arena_free(&arena);
  return result;
}

/* Receives the chain keeps posted ahead of the chunk it is forwarding, so that the next chunk's
 * bytes (striped over several streams by TCP) are drained while this one is passed on. */
#define CHAIN_RECV_DEPTH 4

/* The last rank of the chain starts receiving n-2 chunk times after the first, so a chunk of
 * bytes/CHAIN_MIN_CHUNKS keeps that fill under a few percent of the whole. HOOP_CHUNK_BYTES stays
 * the upper bound; CHAIN_CHUNK_FLOOR keeps per-message costs small. */
#define CHAIN_MIN_CHUNKS 128
#define CHAIN_CHUNK_FLOOR (64 * 1024)

static size_t chain_chunk_bytes(const hoop_comm *comm, size_t bytes) {
  size_t chunk = bytes / CHAIN_MIN_CHUNKS;
  if (chunk < CHAIN_CHUNK_FLOOR)
    chunk = CHAIN_CHUNK_FLOOR;
  size_t limit = hoop__chunk_bytes(comm, bytes, 1);
  return chunk < limit ? chunk : limit;
}

/* The chain's receives: the buffer in chunks, in place, from the previous rank. */
typedef struct chain_pass {
  int prev;
  char *buf;
  size_t bytes, chunk, done;
} chain_pass;

static int chain_next(void *arg, size_t slot, hoop__chunk *chunk) {
  chain_pass *pass = arg;
  (void)slot;
  if (pass->done >= pass->bytes)
    return 0;
  chunk->peer = pass->prev;
  chunk->at = pass->done;
  chunk->len = pass->bytes - pass->done < pass->chunk ? pass->bytes - pass->done : pass->chunk;
  chunk->dst = pass->buf + pass->done;
  pass->done += chunk->len;
  return 1;
}

hoop_result hoop__broadcast_chain(hoop_comm *comm, const hoop__coll_args *args) {
  char *buf = args->recvbuf;
  size_t bytes = args->bytes;
  int n = comm->size;
  int vrank = (comm->rank - args->root + n) % n;
  int next = hoop__ring_next(comm);
  int forwards = vrank < n - 1; /* the last rank of the chain only receives */
  size_t chunk = chain_chunk_bytes(comm, bytes);
  hoop__arena arena = {0};
  hoop_result result = HOOP_OK;
  if (vrank == 0) {
    for (size_t done = 0; done < bytes && result == HOOP_OK; done += chunk) {
      size_t len = bytes - done < chunk ? bytes - done : chunk;
      /* An input still being fed in (mem/kind.h): this chunk waited for. */
      if ((result = hoop__kind_need(comm, buf + done, len)) == HOOP_OK)
        result = hoop__arena_isend(comm, &arena, next, buf + done, len);
    }
  } else {
    chain_pass pass = {hoop__ring_prev(comm), buf, bytes, chunk, 0};
    hoop__recv_ahead ahead;
    hoop__recv_ahead_init(&ahead, CHAIN_RECV_DEPTH, chain_next, &pass);
    const hoop__chunk *got;
    while ((result = hoop__recv_ahead_take(comm, &ahead, &got)) == HOOP_OK && got) {
      hoop__kind_done(comm, got->dst, got->len); /* final: it may leave while the rest comes */
      if (forwards)
        result = hoop__arena_isend(comm, &arena, next, got->dst, got->len);
    }
  }
  if (result == HOOP_OK)
    result = hoop__arena_wait_all(comm, &arena);
  hoop__arena_free(&arena);
  return result;
}
