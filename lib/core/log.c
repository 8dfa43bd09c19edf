/* log.c - HOOP_DEBUG logging: one line per message on stderr, "hoop rank 3 WARN net: ...".
 *
 * The level and subsystems come from HOOP_DEBUG and HOOP_DEBUG_SUBSYS the first time anything is
 * logged, unless a tool has set them with hoop__log_set.
 */
#include "core/log.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/time.h>

#include "core/env.h"

static pthread_once_t log_once = PTHREAD_ONCE_INIT;
static int log_level = HOOP_LOG_WARN;
static unsigned log_subsys = HOOP_SUBSYS_ALL;
static int log_explicit;
static char log_prefix[64] = "hoop";
static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;

static const struct {
  const char *name;
  unsigned bit;
} subsys_names[] = {
    {"init", HOOP_SUBSYS_INIT}, {"coll", HOOP_SUBSYS_COLL}, {"net", HOOP_SUBSYS_NET},
    {"rdzv", HOOP_SUBSYS_RDZV}, {"env", HOOP_SUBSYS_ENV},   {"all", HOOP_SUBSYS_ALL},
};

static const char *subsys_name(unsigned subsys) {
  for (size_t i = 0; i < sizeof subsys_names / sizeof subsys_names[0]; i++)
    if (subsys_names[i].bit == subsys)
      return subsys_names[i].name;
  return "misc";
}

int hoop__log_parse_level(const char *text) {
  static const char *names[] = {"none", "error", "warn", "info", "trace"};
  for (int i = 0; i < 5; i++)
    if (strcasecmp(text, names[i]) == 0)
      return i;
  return -1;
}

/* "init,net" -> bits; a leading ^ inverts the list, as NCCL_DEBUG_SUBSYS does. */
static unsigned parse_subsys(const char *text) {
  int invert = text[0] == '^';
  unsigned mask = 0;
  char buf[256];
  snprintf(buf, sizeof buf, "%s", text + invert);
  char *save = NULL;
  for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save))
    for (size_t i = 0; i < sizeof subsys_names / sizeof subsys_names[0]; i++)
      if (strcasecmp(tok, subsys_names[i].name) == 0)
        mask |= subsys_names[i].bit;
  return invert ? ~mask : mask;
}

static void log_init_from_env(void) {
  if (log_explicit)
    return;
  int level = hoop__log_parse_level(hoop__env_get("HOOP_DEBUG"));
  if (level >= 0)
    log_level = level;
  log_subsys = parse_subsys(hoop__env_get("HOOP_DEBUG_SUBSYS"));
}

void hoop__log_set(hoop__log_level level, unsigned subsys_mask) {
  log_explicit = 1;
  pthread_once(&log_once, log_init_from_env);
  log_level = level;
  log_subsys = subsys_mask;
}

void hoop__log_set_prefix(const char *prefix) {
  pthread_mutex_lock(&log_lock);
  snprintf(log_prefix, sizeof log_prefix, "%s", prefix);
  pthread_mutex_unlock(&log_lock);
}

int hoop__log_enabled(hoop__log_level level, unsigned subsys) {
  pthread_once(&log_once, log_init_from_env);
  return (int)level <= log_level && (subsys & log_subsys) != 0;
}

void hoop__log(hoop__log_level level, unsigned subsys, const char *fmt, ...) {
  static const char *level_names[] = {"", "ERROR", "WARN", "INFO", "TRACE"};
  if (!hoop__log_enabled(level, subsys))
    return;
  char line[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  struct timeval now;
  gettimeofday(&now, NULL);
  /* One fprintf per line under a lock, so that lines from two threads never interleave. */
  pthread_mutex_lock(&log_lock);
  fprintf(stderr, "%s %ld.%03ld %s %s: %s\n", log_prefix, (long)now.tv_sec % 100000,
          (long)now.tv_usec / 1000, level_names[level], subsys_name(subsys), line);
  pthread_mutex_unlock(&log_lock);
}
