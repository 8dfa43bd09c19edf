/* clock.c - the monotonic clock (clock.h). */
#include "util/clock.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

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

void hoop__boot_id(char *out, size_t outlen) {
  out[0] = '\0';
  FILE *file = fopen("/proc/sys/kernel/random/boot_id", "re");
  if (!file)
    return;
  if (!fgets(out, (int)outlen, file))
    out[0] = '\0';
  fclose(file);
  out[strcspn(out, "\n")] = '\0';
}

uint64_t hoop__clock_id(void) {
  char boot[64];
  hoop__boot_id(boot, sizeof boot);
  if (!boot[0])
    return 0;
  uint64_t hash = 0xcbf29ce484222325ull; /* FNV-1a */
  for (const char *c = boot; *c; c++)
    hash = (hash ^ (uint8_t)*c) * 0x100000001b3ull;
  return hash ? hash : 1;
}
