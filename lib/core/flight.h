/* flight.h - the flight recorder: a ring of this process's last collective calls, dumped to stderr
 * on SIGUSR1 (installed only where SIGUSR1 still has its default action). */
#ifndef HOOP__FLIGHT_H
#define HOOP__FLIGHT_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "hoop.h"

/* Install the SIGUSR1 handler once per process (at the first hoop_init). */
void hoop__flight_install(void);
/* Record a call starting at now (hoop__now's clock, which the caller has read already); returns
 * its slot for hoop__flight_end. */
long hoop__flight_begin(int rank, uint64_t seq, const char *call, uint64_t bytes, double now);
/* Record its end at end (hoop__now's clock). */
void hoop__flight_end(long slot, hoop_result result, double end);
/* The last calls, oldest first, a line each as the SIGUSR1 dump writes them, as many of the newest
 * as fit in out (cap bytes, NUL included; whole lines only): its length. */
size_t hoop__flight_text(char *out, size_t cap);

#endif /* HOOP__FLIGHT_H */
