/* cpus.c - cores, sockets and NUMA nodes from /sys, and the CPUs a rank is bound to (cpus.h). */
#include "util/cpus.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct level_name {
  const char *name;
  int level;
} level_name;

static const level_name bind_names[] = {{"none", HOOP__BIND_NONE},
                                        {"core", HOOP__BIND_CORE},
                                        {"socket", HOOP__BIND_SOCKET},
                                        {"package", HOOP__BIND_SOCKET},
                                        {"numa", HOOP__BIND_NUMA}},
                        map_names[] = {{"core", HOOP__MAP_CORE},
                                       {"slot", HOOP__MAP_CORE},
                                       {"socket", HOOP__MAP_SOCKET},
                                       {"package", HOOP__MAP_SOCKET},
                                       {"numa", HOOP__MAP_NUMA}};

/* name's level in the table of n names, or -1. */
static int find_level(const level_name *names, size_t n, const char *name) {
  for (size_t i = 0; i < n; i++)
    if (strcmp(name, names[i].name) == 0)
      return names[i].level;
  return -1;
}

int hoop__bind_parse(const char *name, hoop__bind_level *out) {
  int level = find_level(bind_names, sizeof bind_names / sizeof bind_names[0], name);
  if (level >= 0)
    *out = (hoop__bind_level)level;
  return level >= 0 ? 0 : -1;
}

int hoop__map_parse(const char *name, hoop__map_level *out) {
  int level = find_level(map_names, sizeof map_names / sizeof map_names[0], name);
  if (level >= 0)
    *out = (hoop__map_level)level;
  return level >= 0 ? 0 : -1;
}

const char *hoop__bind_name(hoop__bind_level level) {
  static const char *const names[] = {"none", "core", "socket", "numa"};
  return names[level];
}

const char *hoop__map_name(hoop__map_level level) {
  static const char *const names[] = {"core", "socket", "numa"};
  return names[level];
}

/* ---- topology ---------------------------------------------------------------------------------
 */

/* A core: its CPUs (hardware threads), socket and NUMA node. */
typedef struct core {
  cpu_set_t cpus;
  int socket, node, core_id;
} core;

static const char *sysfs_root(void) {
  const char *root = getenv("HOOP_SYSFS");
  return root && root[0] ? root : "/sys";
}

/* The number in a file of CPU cpu's sysfs directory, or fallback. */
static int cpu_number(int cpu, const char *file, int fallback) {
  char path[512];
  snprintf(path, sizeof path, "%s/devices/system/cpu/cpu%d/%s", sysfs_root(), cpu, file);
  FILE *in = fopen(path, "re");
  if (!in)
    return fallback;
  int value;
  if (fscanf(in, "%d", &value) != 1)
    value = fallback;
  fclose(in);
  return value;
}

/* The NUMA node of CPU cpu: its directory holds a link "nodeN". 0 where there is none. */
static int cpu_node(int cpu) {
  char path[512];
  snprintf(path, sizeof path, "%s/devices/system/cpu/cpu%d", sysfs_root(), cpu);
  DIR *dir = opendir(path);
  if (!dir)
    return 0;
  int node = 0;
  for (struct dirent *entry; (entry = readdir(dir)) != NULL;) {
    char *end;
    if (strncmp(entry->d_name, "node", 4) != 0 || entry->d_name[4] < '0' || entry->d_name[4] > '9')
      continue;
    long value = strtol(entry->d_name + 4, &end, 10);
    if (*end == '\0' && value >= 0 && value < 1 << 20) {
      node = (int)value;
      break;
    }
  }
  closedir(dir);
  return node;
}

/* The lowest CPU of cpu's core (its hardware threads, thread_siblings_list), or -1 where sysfs
 * does not say: core_id alone is not unique within a package on parts with several dies or
 * clusters. */
static int core_key(int cpu) {
  char path[512], list[1024];
  snprintf(path, sizeof path, "%s/devices/system/cpu/cpu%d/topology/thread_siblings_list",
           sysfs_root(), cpu);
  FILE *in = fopen(path, "re");
  if (!in)
    return -1;
  int first = -1;
  if (fgets(list, sizeof list, in))
    first = (int)strtol(list, NULL, 10); /* the list is in order: its first number */
  fclose(in);
  return first >= 0 && first < CPU_SETSIZE ? first : -1;
}

/* The cores that allowed's CPUs belong to, in the order of their lowest CPU; their count, or -1
 * when memory runs out. */
static int read_cores(const cpu_set_t *allowed, core **out) {
  core *cores = calloc(CPU_SETSIZE, sizeof *cores);
  if (!cores)
    return -1;
  int ncores = 0;
  for (int cpu = 0; cpu < CPU_SETSIZE; cpu++) {
    if (!CPU_ISSET(cpu, allowed))
      continue;
    int socket = cpu_number(cpu, "topology/physical_package_id", 0);
    /* A core is known by its first hardware thread, else by its package and core_id, else it is
     * the CPU alone. */
    int key = core_key(cpu);
    int core_id = key >= 0 ? CPU_SETSIZE + key : cpu_number(cpu, "topology/core_id", -1 - cpu);
    int found = -1;
    for (int c = 0; c < ncores && found < 0; c++)
      if (cores[c].socket == socket && cores[c].core_id == core_id)
        found = c;
    if (found < 0) {
      found = ncores++;
      CPU_ZERO(&cores[found].cpus);
      cores[found].socket = socket;
      cores[found].core_id = core_id;
      cores[found].node = cpu_node(cpu);
    }
    CPU_SET(cpu, &cores[found].cpus);
  }
  *out = cores;
  return ncores;
}

static int group_of(const core *c, hoop__map_level map) {
  return map == HOOP__MAP_SOCKET ? c->socket : map == HOOP__MAP_NUMA ? c->node : 0;
}

/* The core that the rank at position index takes: cores in order, or the groups' (sockets', NUMA
 * nodes') first cores one group after the other, then their second ones, and so on. */
static int mapped_core(const core *cores, int ncores, hoop__map_level map, int index) {
  index %= ncores;
  if (map == HOOP__MAP_CORE)
    return index;
  int *in_group = calloc((size_t)ncores, sizeof *in_group); /* each core's place in its group */
  if (!in_group)
    return index;
  for (int c = 0; c < ncores; c++)
    for (int e = 0; e < c; e++)
      in_group[c] += group_of(&cores[e], map) == group_of(&cores[c], map);
  int chosen = -1;
  for (int round = 0; chosen < 0; round++)
    for (int c = 0; c < ncores && chosen < 0; c++)
      if (in_group[c] == round && index-- == 0)
        chosen = c;
  free(in_group);
  return chosen;
}

int hoop__bind_cpus(hoop__bind_level bind, hoop__map_level map, int index, int count,
                    const cpu_set_t *allowed, cpu_set_t *out, char *err, size_t errlen) {
  *out = *allowed;
  if (bind == HOOP__BIND_NONE)
    return 0;
  core *cores = NULL;
  int ncores = read_cores(allowed, &cores);
  if (ncores < 0) {
    snprintf(err, errlen, "out of memory reading the CPUs' topology");
    return -1;
  }
  if (ncores == 0 || (bind == HOOP__BIND_CORE && count > ncores)) {
    char list[256];
    hoop__cpus_format(allowed, list, sizeof list);
    snprintf(err, errlen,
             "%d ranks on this host bound to a core each, but the %d CPU%s allowed (%s) make%s "
             "%d core%s",
             count, CPU_COUNT(allowed), CPU_COUNT(allowed) == 1 ? "" : "s", list,
             CPU_COUNT(allowed) == 1 ? "s" : "", ncores, ncores == 1 ? "" : "s");
    free(cores);
    return -1;
  }
  int chosen = mapped_core(cores, ncores, map, index);
  CPU_ZERO(out);
  for (int c = 0; c < ncores; c++) {
    int same = c == chosen ||
               (bind == HOOP__BIND_SOCKET && cores[c].socket == cores[chosen].socket) ||
               (bind == HOOP__BIND_NUMA && cores[c].node == cores[chosen].node);
    if (same)
      CPU_OR(out, out, &cores[c].cpus);
  }
  free(cores);
  return 0;
}

void hoop__cpus_format(const cpu_set_t *set, char *out, size_t outlen) {
  size_t used = 0;
  out[0] = '\0';
  for (int cpu = 0; cpu < CPU_SETSIZE; cpu++) {
    if (!CPU_ISSET(cpu, set))
      continue;
    int last = cpu;
    while (last + 1 < CPU_SETSIZE && CPU_ISSET(last + 1, set))
      last++;
    char item[32];
    int len = last == cpu ? snprintf(item, sizeof item, "%s%d", used ? "," : "", cpu)
                          : snprintf(item, sizeof item, "%s%d-%d", used ? "," : "", cpu, last);
    if (used + (size_t)len + 5 > outlen) {
      snprintf(out + used, outlen - used, "%s...", used ? "," : "");
      return;
    }
    memcpy(out + used, item, (size_t)len + 1);
    used += (size_t)len;
    cpu = last;
  }
}
