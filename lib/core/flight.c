/* flight.c - the flight recorder: the last calls of every communicator in this process, dumped to
 * stderr on SIGUSR1 (seq, collective, bytes, state, duration), so that an operator can ask a hung
 * rank what it was doing without a debugger.
 *
 * The handler runs at any moment, so it only reads the ring and writes with write(2), formatting
 * numbers by hand (snprintf is not async-signal-safe). An entry being written while it is read may
 * show half-updated; the dump is a diagnostic, not a record.
 */
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/flight.h"

#define FLIGHT_ENTRIES 64

typedef struct flight_entry {
  int rank;
  uint64_t seq;
  const char *call; /* a static string */
  uint64_t bytes;
  int64_t start_us, end_us; /* end_us 0 while running */
  hoop_result result;
} flight_entry;

/* Calls claim their entries with a load and a store (not a locked add: 10 ns of a 70 ns call)
 * and write them unlocked: the recorder must cost next to nothing on a call of a fraction of a
 * microsecond. Two calls meet in one entry when threads begin calls at the same moment (both
 * claim one entry) or 64 others begin while the first runs, and then that entry may mix the two,
 * as it may while the handler reads it: a diagnostic, not a record. */
static flight_entry ring[FLIGHT_ENTRIES];
/* Its fields are read and written as relaxed atomics (plain moves): that race is meant, and so
 * said to the compiler and to ThreadSanitizer. */
#define PUT(field, value) __atomic_store_n(&(field), (value), __ATOMIC_RELAXED)
#define GET(field) __atomic_load_n(&(field), __ATOMIC_RELAXED)
static _Atomic long written; /* entries ever begun; the next goes at written % N */
static pthread_once_t install_once = PTHREAD_ONCE_INIT;

static int64_t now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

/* ---- formatting without stdio --------------------------------------------------------------- */

typedef struct line {
  char text[256];
  size_t len;
} line;

static void add_text(line *out, const char *text) {
  while (*text && out->len < sizeof out->text - 1)
    out->text[out->len++] = *text++;
}

static void add_number(line *out, uint64_t value) {
  char digits[24];
  int n = 0;
  do {
    digits[n++] = (char)('0' + value % 10);
    value /= 10;
  } while (value);
  while (n > 0 && out->len < sizeof out->text - 1)
    out->text[out->len++] = digits[--n];
}

/* Microseconds as seconds with six decimals. */
static void add_seconds(line *out, int64_t us) {
  add_number(out, (uint64_t)(us / 1000000));
  add_text(out, ".");
  char frac[7];
  int64_t rest = us % 1000000;
  for (int i = 5; i >= 0; i--, rest /= 10)
    frac[i] = (char)('0' + rest % 10);
  frac[6] = '\0';
  add_text(out, frac);
}

/* Where the lines go: stderr from the signal handler, a buffer for hoopd --dump. */
typedef void (*sink)(const line *out, void *arg);

static void to_stderr(const line *out, void *arg) {
  (void)arg;
  size_t done = 0;
  while (done < out->len) {
    ssize_t n = write(STDERR_FILENO, out->text + done, out->len - done);
    if (n <= 0)
      return;
    done += (size_t)n;
  }
}

/* The calls from the first'th ever begun on, oldest first, each as a line to emit. */
static void calls(long first, long total, sink emit, void *arg) {
  int64_t now = now_us();
  line out = {.len = 0};
  for (long i = first; i < total; i++) {
    const flight_entry *entry = &ring[i % FLIGHT_ENTRIES];
    const char *call = GET(entry->call);
    int64_t start_us = GET(entry->start_us), end_us = GET(entry->end_us);
    hoop_result result = GET(entry->result);
    out.len = 0;
    add_text(&out, "  rank ");
    add_number(&out, (uint64_t)GET(entry->rank));
    add_text(&out, " call #");
    add_number(&out, GET(entry->seq));
    add_text(&out, " ");
    add_text(&out, call ? call : "?");
    add_text(&out, " ");
    add_number(&out, GET(entry->bytes));
    add_text(&out, " bytes: ");
    if (end_us) {
      add_text(&out, result == HOOP_OK ? "done" : "failed (");
      if (result != HOOP_OK) {
        add_text(&out, hoop_strerror(result));
        add_text(&out, ")");
      }
      add_text(&out, " in ");
      add_seconds(&out, end_us - start_us);
    } else {
      add_text(&out, "running for ");
      add_seconds(&out, now - start_us);
    }
    add_text(&out, " s\n");
    emit(&out, arg);
  }
}

static void dump(int signo) {
  (void)signo;
  long total = atomic_load_explicit(&written, memory_order_relaxed),
       first = total > FLIGHT_ENTRIES ? total - FLIGHT_ENTRIES : 0;
  line out = {.len = 0};
  add_text(&out, "hoop flight recorder (pid ");
  add_number(&out, (uint64_t)getpid());
  add_text(&out, "): the last ");
  add_number(&out, (uint64_t)(total - first));
  add_text(&out, " calls, oldest first\n");
  to_stderr(&out, NULL);
  calls(first, total, to_stderr, NULL);
}

typedef struct text_sink {
  char *out;
  size_t cap, len;
} text_sink;

static void to_text(const line *out, void *arg) {
  text_sink *text = arg;
  if (text->len + out->len < text->cap) {
    memcpy(text->out + text->len, out->text, out->len);
    text->len += out->len;
  }
  text->out[text->len] = '\0';
}

size_t hoop__flight_text(char *out, size_t cap) {
  if (cap == 0)
    return 0;
  out[0] = '\0';
  long total = atomic_load_explicit(&written, memory_order_relaxed);
  /* The newest calls that fit: a line takes at most 256 bytes, and most far fewer. */
  long fit = (long)(cap / 96), first = total > fit ? total - fit : 0;
  if (total - first > FLIGHT_ENTRIES)
    first = total - FLIGHT_ENTRIES;
  text_sink text = {out, cap, 0};
  calls(first, total, to_text, &text);
  return text.len;
}

/* Only where nobody else chose what SIGUSR1 does: its default is to kill the process. */
static void install(void) {
  struct sigaction current;
  if (sigaction(SIGUSR1, NULL, &current) != 0 || current.sa_handler != SIG_DFL ||
      (current.sa_flags & SA_SIGINFO))
    return;
  struct sigaction action;
  memset(&action, 0, sizeof action);
  action.sa_handler = dump;
  action.sa_flags = SA_RESTART;
  sigemptyset(&action.sa_mask);
  sigaction(SIGUSR1, &action, NULL);
}

void hoop__flight_install(void) {
  pthread_once(&install_once, install);
}

long hoop__flight_begin(int rank, uint64_t seq, const char *call, uint64_t bytes, double now) {
  long slot = atomic_load_explicit(&written, memory_order_relaxed);
  atomic_store_explicit(&written, slot + 1, memory_order_relaxed);
  flight_entry *entry = &ring[slot % FLIGHT_ENTRIES];
  PUT(entry->end_us, 0);
  PUT(entry->rank, rank);
  PUT(entry->seq, seq);
  PUT(entry->call, call);
  PUT(entry->bytes, bytes);
  PUT(entry->result, HOOP_OK);
  PUT(entry->start_us, (int64_t)(now * 1e6));
  return slot;
}

void hoop__flight_end(long slot, hoop_result result, double end) {
  /* The slot may have been reused by 64 newer calls of other communicators. */
  if (slot >= 0 && atomic_load_explicit(&written, memory_order_relaxed) - slot <= FLIGHT_ENTRIES) {
    flight_entry *entry = &ring[slot % FLIGHT_ENTRIES];
    PUT(entry->result, result);
    int64_t end_us = (int64_t)(end * 1e6), start_us = GET(entry->start_us);
    /* end_us 0 says "running": a call that ended in the microsecond it began ends one later. */
    PUT(entry->end_us, end_us > start_us ? end_us : start_us + 1);
  }
}
