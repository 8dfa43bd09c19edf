/* clock.h - the monotonic clock every floor reads: deadlines, stall warnings, the flight
 * recorder. */
#ifndef HOOP__CLOCK_H
#define HOOP__CLOCK_H

/* Seconds on a monotonic clock. */
double hoop__now(void);
/* The same clock at the kernel's tick (a few ms; no later than hoop__now would say), for what
 * needs no finer grain: it costs a fifth of a fine reading. */
double hoop__now_coarse(void);

#endif /* HOOP__CLOCK_H */
