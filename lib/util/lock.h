/* lock.h - a communicator's call lock: a word taken by one exchange and let go by a plain store.
 *
 * pthread_mutex_unlock is a locked exchange (it must see whether a sleeper needs a wake), and a
 * locked instruction waits for every store before it to reach the cache: on a call that has just
 * written a line its peers read, that is a line's crossing between cores (about 125 ns here) on
 * every small call. A plain release store waits for nothing. The price: a thread that must have
 * the lock (hoop__lock_take) cannot sleep on it to be woken, so it spins, yields and then naps
 * until the lock is free. Every path that waits for calls to end uses hoop__lock_try and waits in
 * its own way (core/progress.c); hoop__lock_take serves the calls that hold the lock a moment
 * (hoop_register, hoop_comm_shrink, a failed request's error text, a point-to-point request's
 * stage given back). */
#ifndef HOOP__LOCK_H
#define HOOP__LOCK_H

#include <stdatomic.h>

/* One pause of a spinning wait (this lock's, the transports', a request's): it eases the spin on
 * the core's sibling and the memory bus. */
static inline void hoop__cpu_pause(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

typedef struct hoop__lock {
  _Atomic int held;
} hoop__lock;

static inline void hoop__lock_init(hoop__lock *lock) {
  atomic_init(&lock->held, 0);
}

/* 1 if this thread now holds the lock, 0 if another does. The plain load first keeps a spinning
 * thread from taking the line from the holder on each try. */
static inline int hoop__lock_try(hoop__lock *lock) {
  return !atomic_load_explicit(&lock->held, memory_order_relaxed) &&
         !atomic_exchange_explicit(&lock->held, 1, memory_order_acquire);
}

static inline void hoop__lock_release(hoop__lock *lock) {
  atomic_store_explicit(&lock->held, 0, memory_order_release);
}

/* Until this thread holds the lock. */
void hoop__lock_take(hoop__lock *lock);

#endif
