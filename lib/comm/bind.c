/* bind.c - a rank that hooprun started on another host binds itself, as hooprun binds the ranks it
 * starts on its own (HOOP_BIND_TO, HOOP_MAP_BY, HOOP_LOCAL_RANK, HOOP_LOCAL_SIZE; util/cpus.h),
 * and every rank says at HOOP_DEBUG=info which CPUs it runs on. */
#include <dirent.h>
#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "comm/launchers.h"
#include "core/env.h"
#include "core/log.h"
#include "util/cpus.h"

/* Every thread of this process onto cpus: those that started before hoop_init_from_env
 * (a framework's pools) as well as the caller; threads started later inherit it. 0, or -1. */
static int bind_every_thread(const cpu_set_t *cpus) {
  DIR *dir = opendir("/proc/self/task");
  if (!dir)
    return sched_setaffinity(0, sizeof *cpus, cpus);
  int err = 0;
  for (struct dirent *entry; (entry = readdir(dir)) != NULL;) {
    char *end;
    long tid = strtol(entry->d_name, &end, 10);
    if (entry->d_name[0] == '.' || *end != '\0' || tid <= 0)
      continue;
    /* A thread that ended since the listing is no failure. */
    if (sched_setaffinity((pid_t)tid, sizeof *cpus, cpus) != 0 && errno != ESRCH && !err)
      err = errno;
  }
  closedir(dir);
  errno = err;
  return err ? -1 : 0;
}

static hoop_result local_number(hoop_comm *comm, const char *name, long min, long max, long *out) {
  const char *text = hoop__env_get(name);
  if (hoop__parse_int(text, min, max, out) != 0)
    return hoop__set_error(comm, HOOP_ERR_INVALID_ARG,
                           "HOOP_BIND_TO needs %s, a number in %ld..%ld (it is '%s')", name, min,
                           max, text);
  return HOOP_OK;
}

hoop_result hoop__bind_from_env(hoop_comm *comm) {
  hoop__bind_level bind;
  hoop__map_level map;
  const char *bind_text = hoop__env_get("HOOP_BIND_TO"), *map_text = hoop__env_get("HOOP_MAP_BY");
  if (hoop__bind_parse(bind_text, &bind) != 0)
    return hoop__set_error(comm, HOOP_ERR_INVALID_ARG,
                           "HOOP_BIND_TO='%s' is not none, core, socket or numa", bind_text);
  if (hoop__map_parse(map_text, &map) != 0)
    return hoop__set_error(comm, HOOP_ERR_INVALID_ARG,
                           "HOOP_MAP_BY='%s' is not core, slot, socket or numa", map_text);
  /* Once per process: a second communicator (a program that finalizes and starts again, as
   * Horovod's shutdown and init do) would divide the one core the first bound it to. */
  static atomic_int bound;
  if (bind == HOOP__BIND_NONE || atomic_load(&bound))
    return HOOP_OK;
  long local_size, local_rank;
  hoop_result result = local_number(comm, "HOOP_LOCAL_SIZE", 1, CPU_SETSIZE, &local_size);
  if (result == HOOP_OK)
    result = local_number(comm, "HOOP_LOCAL_RANK", 0, local_size - 1, &local_rank);
  if (result != HOOP_OK)
    return result;
  cpu_set_t allowed, cpus;
  char why[512], list[256];
  if (sched_getaffinity(0, sizeof allowed, &allowed) != 0)
    return hoop__set_error(comm, HOOP_ERR_SYSTEM, "HOOP_BIND_TO=%s: sched_getaffinity: %s",
                           bind_text, strerror(errno));
  if (hoop__bind_cpus(bind, map, (int)local_rank, (int)local_size, &allowed, &cpus, why,
                      sizeof why) != 0)
    return hoop__set_error(comm, HOOP_ERR_INVALID_ARG, "HOOP_BIND_TO=%s: %s", bind_text, why);
  hoop__cpus_format(&cpus, list, sizeof list);
  if (bind_every_thread(&cpus) != 0)
    return hoop__set_error(comm, HOOP_ERR_SYSTEM, "HOOP_BIND_TO=%s: binding to CPUs %s: %s",
                           bind_text, list, strerror(errno));
  atomic_store(&bound, 1);
  return HOOP_OK;
}

void hoop__log_cpus(void) {
  cpu_set_t cpus;
  char list[256];
  if (!hoop__log_enabled(HOOP_LOG_INFO, HOOP_SUBSYS_INIT) ||
      sched_getaffinity(0, sizeof cpus, &cpus) != 0)
    return;
  hoop__cpus_format(&cpus, list, sizeof list);
  const char *bind = hoop__env_get("HOOP_BIND_TO");
  HOOP__INFO(HOOP_SUBSYS_INIT, "runs on CPUs %s (%d of %ld online)%s%s", list, CPU_COUNT(&cpus),
             sysconf(_SC_NPROCESSORS_ONLN), strcmp(bind, "none") ? ", HOOP_BIND_TO=" : "",
             strcmp(bind, "none") ? bind : "");
}
