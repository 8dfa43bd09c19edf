/* log.h - HOOP_DEBUG logging to stderr, filtered by level and subsystem (HOOP_DEBUG_SUBSYS).
 *
 * Library code logs only through these calls, so that nothing is printed unless asked for.
 * Tools (hoopd, hooprun) set their own level with hoop__log_set.
 */
#ifndef HOOP__LOG_H
#define HOOP__LOG_H

#include "util/attr.h"

typedef enum hoop__log_level {
  HOOP_LOG_NONE = 0,
  HOOP_LOG_ERROR,
  HOOP_LOG_WARN,
  HOOP_LOG_INFO,
  HOOP_LOG_TRACE
} hoop__log_level;

enum {
  HOOP_SUBSYS_INIT = 1u << 0,
  HOOP_SUBSYS_COLL = 1u << 1,
  HOOP_SUBSYS_NET = 1u << 2,
  HOOP_SUBSYS_RDZV = 1u << 3,
  HOOP_SUBSYS_ENV = 1u << 4,
  HOOP_SUBSYS_ALL = 0xffffffffu
};

/* Set the level and the subsystem mask explicitly (overrides the environment). */
void hoop__log_set(hoop__log_level level, unsigned subsys_mask);
/* The prefix printed before each line, e.g. "hoop rank 3"; copied. */
void hoop__log_set_prefix(const char *prefix);
int hoop__log_enabled(hoop__log_level level, unsigned subsys);

void hoop__log(hoop__log_level level, unsigned subsys, const char *fmt, ...) HOOP__PRINTF(3, 4);

#define HOOP__ERROR(subsys, ...) hoop__log(HOOP_LOG_ERROR, subsys, __VA_ARGS__)
#define HOOP__WARN(subsys, ...) hoop__log(HOOP_LOG_WARN, subsys, __VA_ARGS__)
#define HOOP__INFO(subsys, ...) hoop__log(HOOP_LOG_INFO, subsys, __VA_ARGS__)
#define HOOP__TRACE(subsys, ...) hoop__log(HOOP_LOG_TRACE, subsys, __VA_ARGS__)

#endif /* HOOP__LOG_H */
