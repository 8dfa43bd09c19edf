/* clock.h - the monotonic clock every floor reads: deadlines, stall warnings, the flight
 * recorder. */
#ifndef HOOP__CLOCK_H
#define HOOP__CLOCK_H

#include <stddef.h>
#include <stdint.h>

/* Seconds on a monotonic clock. */
double hoop__now(void);
/* The same clock at the kernel's tick (a few ms; no later than hoop__now would say), for what
 * needs no finer grain: it costs a fifth of a fine reading. */
double hoop__now_coarse(void);
/* This boot of this kernel's id (/proc/sys/kernel/random/boot_id) into out; "" where unknown.
 * Processes with the same one read the same monotonic clock. */
void hoop__boot_id(char *out, size_t outlen);
/* A nonzero hash of the boot id, 0 where it is unknown: whose monotonic clock this is. */
uint64_t hoop__clock_id(void);

#endif /* HOOP__CLOCK_H */
