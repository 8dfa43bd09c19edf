/* env.h - every HOOP_ environment variable, declared once in lib/core/env.c with its default and
 * help, so that hoop-env(7), --help output and the effective-configuration log line agree. */
#ifndef HOOP__ENV_H
#define HOOP__ENV_H

#include <stddef.h>

typedef struct hoop__env_var {
  const char *name;
  const char *fallback; /* the default, as text ("" when there is none) */
  const char *help;
} hoop__env_var;

/* The table, ended by an entry whose name is NULL. */
const hoop__env_var *hoop__env_table(void);

/* getenv(name) if set and not empty, else the variable's default from the table ("" if none).
 * name must be in the table. */
const char *hoop__env_get(const char *name);

/* 1 if name is set (non-empty) in the environment. */
int hoop__env_is_set(const char *name);

/* The variable as a byte count in [0, max]; where it is not one, a warning and the table's
 * default. */
size_t hoop__env_bytes(const char *name, long max);

/* Parse helpers: 0 on success, -1 if the text is not a valid number in [min, max]. */
int hoop__parse_int(const char *text, long min, long max, long *out);
int hoop__parse_double(const char *text, double min, double max, double *out);

/* "none|error|warn|info|trace" -> 0..4, or -1. */
int hoop__log_parse_level(const char *text);

#endif /* HOOP__ENV_H */
