/* host.c - what every layer asks of this host: whether its ranks outnumber its CPUs (the clock
 * is util/clock.c). */
#include <unistd.h>

#include "core/internal.h"

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
