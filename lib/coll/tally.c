/* tally.c - what the collectives measure of their own calls: each call's time and wait by
 * collective (read by hoop_comm_stats), and on the job's communicator how long this rank waited
 * in each of its last calls that need every rank, which it describes to its rendezvous server
 * every HOOP_STATS_PERIOD seconds, with when it came to each. The server compares them call by
 * call: by the clock where ranks share one, else by their waits (rdzv/health.c). */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "coll/coll.h"
#include "coll/state.h"
#include "core/env.h"
#include "core/log.h"
#include "rdzv/client.h"
#include "transport/transport.h"

/* A link that moved less than this since the last STATS is not named: too little to time. */
#define LINK_NAMED_BYTES (256 * 1024)

static double wall_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* The next multiple of the period on the wall clock: every rank describes its calls at the same
 * moments, so that their last calls are the same ones. */
static double next_due(double period) {
  double now = wall_now();
  return ((double)(long long)(now / period) + 1) * period;
}

void hoop__coll_tally_start(hoop__coll_state *coll) {
  coll->began = hoop__now();
  const char *text = hoop__env_get("HOOP_STATS_PERIOD");
  double period = 2;
  if (hoop__parse_double(text, 0, 3600, &period) != 0 || (period > 0 && period < 0.1)) {
    HOOP__WARN(HOOP_SUBSYS_ENV, "HOOP_STATS_PERIOD '%s' is not 0 or 0.1 to 3600 seconds; using 2",
               text);
    period = 2;
  }
  coll->stats_period_s = period;
  coll->stats_due = period > 0 ? next_due(period) : 0;
}

void hoop__coll_tally_read(const hoop_comm *comm, hoop__coll which, uint64_t *calls,
                           uint64_t *bytes, uint64_t *time_ns, uint64_t *wait_ns) {
  const hoop__coll_state *coll = comm->coll;
  *calls = atomic_load_explicit(&coll->tally[which].calls, memory_order_relaxed);
  *bytes = atomic_load_explicit(&coll->tally[which].bytes, memory_order_relaxed);
  *time_ns = atomic_load_explicit(&coll->tally[which].time_ns, memory_order_relaxed);
  *wait_ns = atomic_load_explicit(&coll->tally[which].wait_ns, memory_order_relaxed);
}

double hoop__coll_tally_began(const hoop_comm *comm) {
  return comm->coll->began;
}

/* Order samples by call number. */
static int by_seq(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

/* The links into this rank that were slowest since the last STATS (in bytes per second), at most
 * HOOP__WIRE_MAX_LINKS, slowest first. */
static void slowest_links(hoop_comm *comm, hoop__stats_msg *msg) {
  hoop__coll_state *coll = comm->coll;
  if (!coll->link_seen && !(coll->link_seen = calloc(2 * (size_t)comm->size, sizeof(uint64_t))))
    return;
  for (int p = 0; p < comm->size; p++) {
    if (p == comm->rank)
      continue;
    hoop__peer_tally tally;
    hoop__transport_peer_tally(comm, p, &tally);
    uint64_t bytes = tally.link_bytes - coll->link_seen[2 * p];
    uint64_t us = (tally.link_ns - coll->link_seen[2 * p + 1]) / 1000;
    coll->link_seen[2 * p] = tally.link_bytes;
    coll->link_seen[2 * p + 1] = tally.link_ns;
    if (bytes < LINK_NAMED_BYTES || us == 0)
      continue;
    hoop__link link = {.from = (uint32_t)p, .bytes = bytes, .us = us};
    hoop__links_insert(msg->links, &msg->nlinks, &link);
  }
}

void hoop__coll_tally_report(hoop_comm *comm) {
  hoop__coll_state *coll = comm->coll;
  if (coll->stats_due <= 0 || comm->net != comm || comm->rdzv_fd < 0)
    return;
  double wall = wall_now();
  if (wall < coll->stats_due)
    return;
  coll->stats_due = next_due(coll->stats_period_s);
  hoop__stats_msg msg = {0};
  for (int c = 0; c < HOOP__COLL_COUNT; c++) {
    uint64_t calls, bytes, time_ns, wait_ns;
    hoop__coll_tally_read(comm, (hoop__coll)c, &calls, &bytes, &time_ns, &wait_ns);
    msg.calls += calls;
    msg.bytes += bytes;
    msg.in_calls_us += time_ns / 1000;
    msg.waited_us += wait_ns / 1000;
  }
  double since = hoop__now() - coll->began;
  msg.since_us = since > 0 ? (uint64_t)(since * 1e6) : 0;
  if (msg.in_calls_us > msg.since_us)
    msg.in_calls_us = msg.since_us;
  if (msg.waited_us > msg.in_calls_us)
    msg.waited_us = msg.in_calls_us;
  /* The last calls, oldest first, by their number (each packed with its slot for the sort). */
  uint64_t packed[HOOP__WIRE_STATS_SAMPLES];
  uint32_t n = 0;
  for (int i = 0; i < HOOP__WIRE_STATS_SAMPLES; i++)
    if (coll->samples[i].seq > 0 && coll->samples[i].seq + HOOP__WIRE_STATS_SAMPLES > comm->seq)
      packed[n++] = coll->samples[i].seq << 32 | (uint32_t)i;
  qsort(packed, n, sizeof *packed, by_seq);
  for (uint32_t i = 0; i < n; i++) {
    uint32_t slot = (uint32_t)packed[i];
    msg.samples[i].seq = (uint32_t)coll->samples[slot].seq;
    msg.samples[i].waited_us = coll->samples[slot].wait_us;
    msg.samples[i].came_us = coll->samples[slot].came_us;
  }
  msg.nsamples = n;
  if (!coll->clock)
    coll->clock = hoop__clock_id();
  msg.clock = coll->clock;
  slowest_links(comm, &msg);
  hoop__rendezvous_stats(comm, &msg);
}
