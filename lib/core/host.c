/* host.c - what every layer asks of this host: whether its ranks outnumber its CPUs (the clock
 * is util/clock.c). */
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

#include "core/env.h"
#include "core/internal.h"

/* The CPUs this host's ranks share: those online, or fewer where HOOP_HOST_CPUS says so (hooprun
 * gives the count of its own affinity mask, a taskset's or a cpuset's, which every rank it starts
 * inherits or is bound within). Not the rank's own mask: a rank bound to one core still shares
 * the host with the others. */
static long host_cpus(void) {
  long online = sysconf(_SC_NPROCESSORS_ONLN);
  const char *text = hoop__env_get("HOOP_HOST_CPUS");
  char *end;
  long given = text && *text ? strtol(text, &end, 10) : 0;
  if (given > 0 && *end == '\0' && (online <= 0 || given < online))
    return given;
  return online;
}

static int outnumber_cpus(int ranks) {
  /* glibc reads /sys for the count at every call, and a spinning wait asks every few rounds
   * (hoop__host_crowded_now): read once. */
  static _Atomic long cpus;
  long n = atomic_load_explicit(&cpus, memory_order_relaxed);
  if (n == 0) {
    n = host_cpus();
    atomic_store_explicit(&cpus, n, memory_order_relaxed);
  }
  return n > 0 && ranks > n;
}

int hoop__host_crowded(const hoop_comm *comm) {
  return outnumber_cpus(comm->local_size);
}

/* The table's host is the host name; ranks that name other hosts may still share this kernel
 * (containers, network namespaces), and its CPUs are what they take turns on. */
static int ranks_here(const hoop_comm *comm) {
  int kernel = comm->net ? comm->net->kernel_ranks : comm->kernel_ranks;
  return kernel > comm->local_size ? kernel : comm->local_size;
}

int hoop__host_oversubscribed(const hoop_comm *comm) {
  return outnumber_cpus(ranks_here(comm));
}

int hoop__host_crowded_now(const hoop_comm *comm, int asleep) {
  return outnumber_cpus(ranks_here(comm) - asleep);
}
