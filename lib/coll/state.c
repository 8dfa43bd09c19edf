/* state.c - the collectives' state of a communicator: made with it, sized to its ranks, freed
 * last. */
#include <stdlib.h>

#include "coll/coll.h"
#include "coll/state.h"

hoop__coll_state *hoop__coll_state_new(void) {
  hoop__coll_state *coll = calloc(1, sizeof *coll);
  if (coll) {
    coll->chunk_bytes = HOOP__CHUNK_BYTES; /* HOOP_CHUNK_BYTES's default until a call reads it */
    hoop__coll_tally_start(coll);
  }
  return coll;
}

hoop_result hoop__coll_state_size(hoop_comm *comm) {
  hoop__coll_state *coll = comm->coll;
  size_t *offsets = realloc(coll->block_offset, (size_t)comm->size * sizeof(size_t));
  if (offsets)
    coll->block_offset = offsets;
  size_t *lengths = realloc(coll->block_length, (size_t)comm->size * sizeof(size_t));
  if (lengths)
    coll->block_length = lengths;
  return offsets && lengths ? HOOP_OK : HOOP_ERR_SYSTEM;
}

void hoop__plan_blocks(hoop_comm *comm, size_t bytes) {
  for (int i = 0; i < comm->size; i++) {
    comm->coll->block_offset[i] = (size_t)i * bytes;
    comm->coll->block_length[i] = bytes;
  }
}

void hoop__plan_segments(hoop_comm *comm, size_t count, size_t esize) {
  for (int i = 0; i < comm->size; i++) {
    size_t first, elems;
    hoop__segment(count, comm->size, i, &first, &elems);
    comm->coll->block_offset[i] = first * esize;
    comm->coll->block_length[i] = elems * esize;
  }
}

void hoop__coll_state_free(hoop_comm *comm) {
  hoop__coll_state *coll = comm->coll;
  if (!coll)
    return;
  free(coll->link_seen);
  free(coll->block_length);
  free(coll->block_offset);
  free(coll->hosts);
  free(coll);
  comm->coll = NULL;
}
