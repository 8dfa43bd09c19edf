/* host.c - what every layer asks of this host: a monotonic clock, and whether its ranks
 * outnumber its CPUs. */
#include <time.h>
#include <unistd.h>

#include "core/internal.h"

double hoop__now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

double hoop__now_coarse(void) {
  struct timespec ts;
  if (clock_gettime(CLOCK_MONOTONIC_COARSE, &ts) != 0)
    return hoop__now();
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int hoop__host_oversubscribed(const hoop_comm *comm) {
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  return cpus > 0 && comm->local_size > cpus;
}
