/* halving.c - the plan that recursive halving and doubling share (allreduce's Rabenseifner
 * algorithm, allgather's recursive doubling), and the doubling rounds themselves. */
#include "coll/coll.h"

int hoop__halving_rank(const hoop__halving *plan, int vrank) {
  return vrank < plan->rem ? 2 * vrank + 1 : vrank + plan->rem;
}

void hoop__halving_plan(const hoop_comm *comm, size_t count, hoop__halving *plan) {
  hoop__halving_plan_order(comm, count, 0, plan);
}

void hoop__halving_plan_order(const hoop_comm *comm, size_t count, int near_first,
                              hoop__halving *plan) {
  int n = comm->size, r = comm->rank;
  plan->p = 1;
  while (plan->p * 2 <= n)
    plan->p *= 2;
  plan->rem = n - plan->p;
  plan->folded = r < 2 * plan->rem && r % 2 == 0;
  plan->vrank = r < 2 * plan->rem ? r / 2 : r - plan->rem;
  size_t first = 0, last = count;
  plan->rounds = 0;
  for (int k = 1; k < plan->p; k <<= 1, plan->rounds++) {
    int mask = near_first ? k : plan->p / (2 * k);
    plan->mask[plan->rounds] = mask;
    size_t mid = first + (last - first) / 2;
    plan->lo[plan->rounds] = first;
    plan->hi[plan->rounds] = last;
    if (plan->vrank & mask)
      first = mid;
    else
      last = mid;
  }
  plan->first = first;
  plan->last = last;
}

hoop_result hoop__doubling_rounds(hoop_comm *comm, hoop__arena *arena, char *buf, size_t esize,
                                  const hoop__halving *plan) {
  size_t first = plan->first, last = plan->last;
  for (int round = plan->rounds - 1; round >= 0; round--) {
    int mask = plan->mask[round];
    int peer = hoop__halving_rank(plan, plan->vrank ^ mask);
    /* The partner owns the other half of [lo, hi): receive it in place. */
    size_t other_first = plan->vrank & mask ? plan->lo[round] : last;
    size_t other_last = plan->vrank & mask ? first : plan->hi[round];
    hoop__transfer req;
    hoop_result result =
        hoop__arena_isend(comm, arena, peer, buf + first * esize, (last - first) * esize);
    if (result == HOOP_OK)
      result = hoop__irecv(comm, peer, buf + other_first * esize,
                           (other_last - other_first) * esize, &req);
    if (result == HOOP_OK)
      result = hoop__wait(comm, &req);
    if (result != HOOP_OK)
      return result;
    first = plan->lo[round];
    last = plan->hi[round];
  }
  return HOOP_OK;
}
