/* clock.c - the monotonic clock (clock.h). */
#include "util/clock.h"

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
