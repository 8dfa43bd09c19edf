/* barrier.c - hoop_barrier: the dissemination barrier. In round k every rank signals the rank 2^k
 * ahead and waits for the one 2^k behind; after ceil(log2 n) rounds each rank has heard, directly
 * or through others, from every rank. */
#include "coll/coll.h"

hoop_result hoop__barrier_dissemination(hoop_comm *comm, const hoop__coll_args *args) {
  (void)args;
  int n = comm->size;
  hoop_result result = HOOP_OK;
  for (int distance = 1; distance < n && result == HOOP_OK; distance <<= 1) {
    char token = 1, heard = 0;
    result = hoop__sendrecv(comm, (comm->rank + distance) % n, &token, 1,
                            (comm->rank - distance + n) % n, &heard, 1);
  }
  return result;
}

hoop_result hoop__group_agree_bits(hoop_comm *comm, const hoop__group *group, unsigned *bits,
                                   unsigned any_mask) {
  int n = group->size, r = group->index;
  hoop_result result = HOOP_OK;
  for (int distance = 1; distance < n && result == HOOP_OK; distance <<= 1) {
    unsigned char mine = (unsigned char)*bits, heard = 0;
    result = hoop__sendrecv(comm, hoop__member(group, (r + distance) % n), &mine, 1,
                            hoop__member(group, (r - distance + n) % n), &heard, 1);
    *bits = ((*bits | heard) & any_mask) | (*bits & heard & ~any_mask);
  }
  return result;
}

hoop_result hoop__group_agree(hoop_comm *comm, const hoop__group *group, int *flag, int any) {
  unsigned bits = *flag != 0;
  hoop_result result = hoop__group_agree_bits(comm, group, &bits, any ? 1u : 0u);
  *flag = (int)bits;
  return result;
}
