/* lock.c - taking a call lock held by another thread (see lock.h). */
#include "util/lock.h"

#include <sched.h>
#include <time.h>

/* Rounds of each way of waiting: a holder ending a small call is met by the spin, one ending a
 * longer call by the yields; past those the holder may be inside a collective that waits on its
 * peers, and the nap keeps this thread off the CPU it needs. */
#define SPINS 256
#define YIELDS 64
#define NAP_NS 50000

void hoop__lock_take(hoop__lock *lock) {
  for (unsigned round = 0; !hoop__lock_try(lock); round++) {
    if (round < SPINS) {
      hoop__cpu_pause();
    } else if (round < SPINS + YIELDS) {
      sched_yield();
    } else {
      struct timespec nap = {0, NAP_NS};
      nanosleep(&nap, NULL);
    }
  }
}
