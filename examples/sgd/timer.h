/* timer.h - wall-clock seconds from a monotonic clock, for the timings the example reports. */
#ifndef SGD_TIMER_H
#define SGD_TIMER_H

#include <time.h>

static inline double now_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

#endif
