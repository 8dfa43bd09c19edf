/* cpus.h - this machine's CPUs as cores, sockets and NUMA nodes, and the CPUs a rank is bound to
 * by hooprun's --bind-to and --map-by (the same choice made by hooprun for the ranks it starts on
 * its own host, and by a rank itself on another host, from HOOP_BIND_TO: lib/comm/bind.c). */
#ifndef HOOP__CPUS_H
#define HOOP__CPUS_H

#include <sched.h>
#include <stddef.h>

/* What a rank is bound to: nothing (the CPUs it was given), one core (with its hardware threads),
 * the socket or the NUMA node of its core. */
typedef enum hoop__bind_level {
  HOOP__BIND_NONE,
  HOOP__BIND_CORE,
  HOOP__BIND_SOCKET,
  HOOP__BIND_NUMA
} hoop__bind_level;

/* How a host's ranks are spread over its cores: in order (core, or slot as mpirun says), or one
 * socket or NUMA node after the other, round and round. */
typedef enum hoop__map_level { HOOP__MAP_CORE, HOOP__MAP_SOCKET, HOOP__MAP_NUMA } hoop__map_level;

/* "none", "core", "socket" (or "package"), "numa": 0 with *out set, or -1. */
int hoop__bind_parse(const char *name, hoop__bind_level *out);
/* "core", "slot", "socket" (or "package"), "numa": 0 with *out set, or -1. */
int hoop__map_parse(const char *name, hoop__map_level *out);
const char *hoop__bind_name(hoop__bind_level level);
const char *hoop__map_name(hoop__map_level level);

/* The CPUs of allowed that the host's rank `index` of `count` is bound to, into *out: 0, or -1
 * with the reason in err (more ranks bound to a core each than allowed has cores). The topology is
 * read from /sys (HOOP_SYSFS: another root, for tests); where it cannot be, each CPU is a core of
 * socket 0 and NUMA node 0. */
int hoop__bind_cpus(hoop__bind_level bind, hoop__map_level map, int index, int count,
                    const cpu_set_t *allowed, cpu_set_t *out, char *err, size_t errlen);

/* set as a CPU list, "0-3,8,10-11", into out (cut short, ending in ",...", if it does not fit). */
void hoop__cpus_format(const cpu_set_t *set, char *out, size_t outlen);

#endif /* HOOP__CPUS_H */
