/* ring.c - the ring machinery shared by the collectives: a request arena that keeps posted sends
 * alive, segment arithmetic, and circulating blocks around the ring in pipelined chunks. */
#include <stdlib.h>
#include <string.h>

#include "coll/coll.h"
#include "coll/state.h"
#include "core/env.h"

#define ARENA_BLOCK_REQUESTS 64

struct hoop__arena_block {
  hoop__arena_block *next;
  hoop__transfer requests[ARENA_BLOCK_REQUESTS];
};

hoop__transfer *hoop__arena_next(hoop_comm *comm, hoop__arena *arena) {
  if (!arena->tail || arena->used_in_tail == ARENA_BLOCK_REQUESTS) {
    /* The communicator's spare block first: a malloc and a free of 24 KiB cost a small call as
     * much as its messages. Calls on one communicator run one at a time (its call lock). */
    hoop__arena_block *block = comm->coll->arena_spare;
    arena->comm = comm;
    if (block)
      comm->coll->arena_spare = NULL;
    else
      block = malloc(sizeof *block);
    if (!block) {
      hoop__fail(comm, HOOP_ERR_SYSTEM, "%s: out of memory for requests", comm->call);
      return NULL;
    }
    block->next = NULL;
    if (arena->tail)
      arena->tail->next = block;
    else
      arena->head = block;
    arena->tail = block;
    arena->used_in_tail = 0;
  }
  return &arena->tail->requests[arena->used_in_tail++];
}

hoop_result hoop__arena_isend(hoop_comm *comm, hoop__arena *arena, int peer, const void *buf,
                              size_t len) {
  hoop__transfer *req = hoop__arena_next(comm, arena);
  return req ? hoop__isend(comm, peer, buf, len, req) : HOOP_ERR_SYSTEM;
}

hoop_result hoop__arena_wait_all(hoop_comm *comm, hoop__arena *arena) {
  for (hoop__arena_block *block = arena->head; block; block = block->next) {
    size_t used = block == arena->tail ? arena->used_in_tail : ARENA_BLOCK_REQUESTS;
    for (size_t i = 0; i < used; i++) {
      hoop_result result = hoop__wait(comm, &block->requests[i]);
      if (result != HOOP_OK)
        return result;
    }
  }
  return HOOP_OK;
}

void hoop__arena_free(hoop__arena *arena) {
  hoop__arena_block *block = arena->head;
  if (block && !arena->comm->coll->arena_spare) {
    arena->comm->coll->arena_spare = block;
    block = block->next;
    arena->comm->coll->arena_spare->next = NULL;
  }
  while (block) {
    hoop__arena_block *next = block->next;
    free(block);
    block = next;
  }
  memset(arena, 0, sizeof *arena);
}

void hoop__arena_spare_free(hoop_comm *comm) {
  free(comm->coll->arena_spare);
  comm->coll->arena_spare = NULL;
}

hoop_result hoop__coll_no_data(hoop_comm *comm) {
  if (!comm->check_calls || comm->size == 1)
    return HOOP_OK;
  return hoop__sendrecv_empty(comm, hoop__ring_next(comm), hoop__ring_prev(comm));
}

size_t hoop__chunk_bytes(const hoop_comm *comm, size_t block_bytes, size_t elem_size) {
  size_t chunk = comm->coll->chunk_bytes; /* HOOP_CHUNK_BYTES, as tune.c read it */
  if (block_bytes / chunk >= HOOP__MAX_CHUNKS_PER_BLOCK)
    chunk = block_bytes / HOOP__MAX_CHUNKS_PER_BLOCK + 1;
  chunk -= chunk % elem_size;
  return chunk < elem_size ? elem_size : chunk;
}

hoop_result hoop__arena_isend_chunks(hoop_comm *comm, hoop__arena *arena, int peer, const char *buf,
                                     size_t len, size_t elem_size) {
  size_t chunk = hoop__chunk_bytes(comm, len, elem_size);
  for (size_t done = 0; done < len; done += chunk) {
    hoop_result result =
        hoop__arena_isend(comm, arena, peer, buf + done, len - done < chunk ? len - done : chunk);
    if (result != HOOP_OK)
      return result;
  }
  return HOOP_OK;
}

int hoop__ring_cursor_next(const hoop_comm *comm, const hoop__group *group,
                           hoop__ring_cursor *cursor, const size_t *offset, const size_t *length,
                           int shift, size_t elem_size, int *step, size_t *at, size_t *len) {
  int n = group->size, r = group->index;
  while (cursor->step < n - 1) {
    int block = ((r + shift - cursor->step - 1) % n + n) % n;
    if (cursor->done < length[block]) {
      size_t chunk = hoop__chunk_bytes(comm, length[block], elem_size);
      *step = cursor->step;
      *at = offset[block] + cursor->done;
      *len = length[block] - cursor->done < chunk ? length[block] - cursor->done : chunk;
      cursor->done += *len;
      return 1;
    }
    cursor->step++;
    cursor->done = 0;
  }
  return 0;
}

void hoop__recv_ahead_init(hoop__recv_ahead *ahead, size_t depth,
                           int (*next)(void *pass, size_t slot, hoop__chunk *chunk), void *pass) {
  ahead->depth = depth < HOOP__RECV_AHEAD_MAX ? depth : HOOP__RECV_AHEAD_MAX;
  ahead->posted = ahead->taken = 0;
  ahead->next = next;
  ahead->pass = pass;
  ahead->exhausted = 0;
}

hoop_result hoop__recv_ahead_take(hoop_comm *comm, hoop__recv_ahead *ahead,
                                  const hoop__chunk **chunk) {
  *chunk = NULL;
  while (!ahead->exhausted && ahead->posted < ahead->taken + ahead->depth) {
    size_t slot = ahead->posted % ahead->depth;
    hoop__chunk *next = &ahead->chunks[slot];
    if (!ahead->next(ahead->pass, slot, next)) {
      ahead->exhausted = 1;
      break;
    }
    next->slot = slot;
    hoop_result result = hoop__irecv(comm, next->peer, next->dst, next->len, &ahead->reqs[slot]);
    ahead->posted++;
    if (result != HOOP_OK)
      return result;
  }
  if (ahead->taken == ahead->posted)
    return HOOP_OK;
  size_t slot = ahead->taken++ % ahead->depth;
  hoop_result result = hoop__wait(comm, &ahead->reqs[slot]);
  if (result == HOOP_OK)
    *chunk = &ahead->chunks[slot];
  return result;
}

/* A ring pass's chunks, received in place: base + their offset. */
typedef struct ring_pass {
  const hoop_comm *comm;
  const hoop__group *group;
  hoop__ring_cursor cursor;
  const size_t *offset, *length;
  int shift;
  size_t elem_size;
  char *base;
} ring_pass;

static int ring_pass_next(void *arg, size_t slot, hoop__chunk *chunk) {
  ring_pass *pass = arg;
  (void)slot;
  if (!hoop__ring_cursor_next(pass->comm, pass->group, &pass->cursor, pass->offset, pass->length,
                              pass->shift, pass->elem_size, &chunk->step, &chunk->at, &chunk->len))
    return 0;
  chunk->peer = hoop__group_prev(pass->group);
  chunk->dst = pass->base + chunk->at;
  return 1;
}

hoop_result hoop__ring_circulate(hoop_comm *comm, const hoop__group *group, hoop__arena *arena,
                                 char *base, const size_t *offset, const size_t *length, int shift,
                                 size_t elem_size, int own_sent) {
  int n = group->size, r = group->index;
  int next = hoop__group_next(group);
  hoop_result result = HOOP_OK;
  if (!own_sent) {
    int own = (r + shift) % n;
    result =
        hoop__arena_isend_chunks(comm, arena, next, base + offset[own], length[own], elem_size);
  }
  ring_pass pass = {comm, group, {0, 0}, offset, length, shift, elem_size, base};
  hoop__recv_ahead ahead;
  hoop__recv_ahead_init(&ahead, HOOP__RING_RECV_DEPTH, ring_pass_next, &pass);
  const hoop__chunk *chunk;
  while (result == HOOP_OK && (result = hoop__recv_ahead_take(comm, &ahead, &chunk)) == HOOP_OK &&
         chunk) {
    /* The last step's block has reached everyone once it arrives here. */
    if (chunk->step < n - 2)
      result = hoop__arena_isend(comm, arena, next, chunk->dst, chunk->len);
    hoop__kind_done(comm, chunk->dst, chunk->len);
  }
  return result;
}

/* The reduce-scatter's chunks, received into HOOP__RING_RECV_DEPTH slices of scratch used in turn,
 * so that the next chunk's receive is posted before this one is reduced. */
typedef struct scratch_ring_pass {
  const hoop_comm *comm;
  const hoop__group *group;
  hoop__ring_cursor cursor;
  const hoop__ring_rs *rs;
  size_t esize;
} scratch_ring_pass;

static int scratch_ring_next(void *arg, size_t slot, hoop__chunk *chunk) {
  scratch_ring_pass *pass = arg;
  const hoop__ring_rs *rs = pass->rs;
  if (!hoop__ring_cursor_next(pass->comm, pass->group, &pass->cursor, rs->offset, rs->length,
                              rs->shift, pass->esize, &chunk->step, &chunk->at, &chunk->len))
    return 0;
  chunk->peer = hoop__group_prev(pass->group);
  chunk->dst = rs->scratch + slot * rs->chunk_max;
  return 1;
}

hoop_result hoop__ring_reduce_scatter(hoop_comm *comm, const hoop__group *group, hoop__arena *arena,
                                      const hoop__ring_rs *rs) {
  int n = group->size, r = group->index;
  int next = hoop__group_next(group);
  size_t esize = hoop_dtype_size(rs->dtype);
  const char *src = rs->src;
  int own = (r + rs->shift) % n, last = (r + rs->shift + 1) % n;
  /* Step 0 sends this rank's own contribution to its first block. An input that is still being
   * fed in (mem/kind.h) is waited for segment by segment, as the ring reads it. */
  hoop_result result = hoop__kind_need(comm, src + rs->offset[own], rs->length[own]);
  if (result == HOOP_OK)
    result =
        hoop__arena_isend_chunks(comm, arena, next, src + rs->offset[own], rs->length[own], esize);
  scratch_ring_pass pass = {comm, group, {0, 0}, rs, esize};
  hoop__recv_ahead ahead;
  hoop__recv_ahead_init(&ahead, HOOP__RING_RECV_DEPTH, scratch_ring_next, &pass);
  const hoop__chunk *chunk;
  while (result == HOOP_OK && (result = hoop__recv_ahead_take(comm, &ahead, &chunk)) == HOOP_OK &&
         chunk) {
    size_t at = chunk->at, len = chunk->len;
    int final = chunk->step == n - 2;
    /* The finished block goes to rs->last where there is one, at its place in the block. */
    char *out = final && rs->last ? rs->last + (at - rs->offset[last]) : rs->dst + at;
    if ((result = hoop__kind_need(comm, src + at, len)) != HOOP_OK ||
        (result = hoop__kind_reduce3(comm, out, src + at, chunk->dst, len / esize, rs->dtype,
                                     rs->op)) != HOOP_OK)
      break;
    if (final && rs->finish) {
      if ((result = hoop__kind_finish(comm, out, len / esize, rs->dtype, rs->op, comm->size)) !=
          HOOP_OK)
        break;
      hoop__kind_done(comm, out, len); /* final: it may leave now */
    }
    /* Forward at once: to the next reduce-scatter step, or, on the last step, as this rank's
     * finished segment that starts the allgather. */
    if (!final || rs->then_circulate)
      result = hoop__arena_isend(comm, arena, next, out, len);
  }
  return result;
}
