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

static int outnumber_cpus(int ranks) {
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  return cpus > 0 && ranks > cpus;
}

int hoop__host_crowded(const hoop_comm *comm) {
  return outnumber_cpus(comm->local_size);
}

int hoop__host_oversubscribed(const hoop_comm *comm) {
  /* The table's host is the host name; ranks that name other hosts may still share this kernel
   * (containers, network namespaces), and its CPUs are what they take turns on. */
  int kernel = comm->net ? comm->net->kernel_ranks : comm->kernel_ranks;
  return outnumber_cpus(kernel > comm->local_size ? kernel : comm->local_size);
}
