/* wire_health.c - the messages that carry a running job's health (see wire.h): a member's STATS,
 * the server's VIEW, and a job's health in a STATUS.
 *
 * Payload layouts (after the 12-byte header; u64 as two big-endian u32, high first):
 *   STATS       u64 calls, u64 bytes, u64 in_calls_us, u64 waited_us, u64 since_us,
 *               u32 nsamples, nsamples x {u32 seq, u32 waited_us} (seq ascending),
 *               u32 nlinks, nlinks x {u32 from, u64 bytes, u64 us}
 *   VIEW        u32 calls, u32 reporting, u32 nlate, nlate x late, u32 nlinks, nlinks x link
 *   late        u32 rank, u32 median_us, u32 p99_us, u32 max_us
 *   link        u32 from, u32 to, u64 bytes, u64 us
 *   health      (in a STATUS, after a job's hosts) u32 running, u32 reporting, u32 calls_per_s,
 *               u32 wait_permille, u32 calls, u32 nlate, nlate x late, u32 nlinks, nlinks x link
 * A link's bytes and time are not 0 (a link with nothing measured is not named).
 */
#include "proto/wire.h"
#include "proto/wire_io.h"

static void put_u64(hoop__wbuf *wb, uint64_t value) {
  put_u32(wb, (uint32_t)(value >> 32));
  put_u32(wb, (uint32_t)value);
}

static uint64_t get_u64(reader *in) {
  uint64_t high = get_u32(in);
  return high << 32 | get_u32(in);
}

/* A late rank's figures: median <= p99 <= max, the rank inside the job. */
static int late_valid(const hoop__late *late, uint32_t size) {
  return late->rank < size && late->median_us <= late->p99_us && late->p99_us <= late->max_us;
}

static void put_late(hoop__wbuf *wb, const hoop__late *late) {
  put_u32(wb, late->rank);
  put_u32(wb, late->median_us);
  put_u32(wb, late->p99_us);
  put_u32(wb, late->max_us);
}

static void get_late(reader *in, hoop__late *late, uint32_t size) {
  late->rank = get_u32(in);
  late->median_us = get_u32(in);
  late->p99_us = get_u32(in);
  late->max_us = get_u32(in);
  if (!late_valid(late, size))
    in->bad = 1;
}

/* A link: its ends inside the job and apart, something measured. */
static int link_valid(const hoop__link *link, uint32_t size, int both_ends) {
  return link->from < size && link->bytes > 0 && link->us > 0 &&
         (!both_ends || (link->to < size && link->to != link->from));
}

static void put_link(hoop__wbuf *wb, const hoop__link *link, int both_ends) {
  put_u32(wb, link->from);
  if (both_ends)
    put_u32(wb, link->to);
  put_u64(wb, link->bytes);
  put_u64(wb, link->us);
}

static void get_link(reader *in, hoop__link *link, uint32_t size, int both_ends) {
  link->from = get_u32(in);
  link->to = both_ends ? get_u32(in) : 0;
  link->bytes = get_u64(in);
  link->us = get_u64(in);
  if (!link_valid(link, size, both_ends))
    in->bad = 1;
}

/* nlinks and the links, as every message carries them last. */
static int links_valid(uint32_t nlinks, const hoop__link *links, uint32_t size, int both_ends) {
  if (nlinks > HOOP__WIRE_MAX_LINKS)
    return 0;
  for (uint32_t i = 0; i < nlinks; i++)
    if (!link_valid(&links[i], size, both_ends))
      return 0;
  return 1;
}

static void put_links(hoop__wbuf *wb, uint32_t nlinks, const hoop__link *links, int both_ends) {
  put_u32(wb, nlinks);
  for (uint32_t i = 0; i < nlinks; i++)
    put_link(wb, &links[i], both_ends);
}

static void get_links(reader *in, uint32_t *nlinks, hoop__link *links, uint32_t size,
                      int both_ends) {
  *nlinks = get_u32(in);
  if (*nlinks > HOOP__WIRE_MAX_LINKS) {
    in->bad = 1;
    return;
  }
  for (uint32_t i = 0; i < *nlinks && !in->bad; i++)
    get_link(in, &links[i], size, both_ends);
}

void hoop__links_insert(hoop__link *links, uint32_t *n, const hoop__link *link) {
  /* Goodputs compared as products: bytes/us without a division. */
  uint32_t at = *n;
  while (at > 0 && (double)link->bytes * (double)links[at - 1].us <
                       (double)links[at - 1].bytes * (double)link->us)
    at--;
  if (at >= HOOP__WIRE_MAX_LINKS)
    return;
  uint32_t keep = *n < HOOP__WIRE_MAX_LINKS ? *n : HOOP__WIRE_MAX_LINKS - 1;
  memmove(&links[at + 1], &links[at], (keep - at) * sizeof *link);
  links[at] = *link;
  *n = keep + 1;
}

int hoop__wire_encode_stats(hoop__wbuf *wb, const hoop__stats_msg *msg) {
  if (msg->nsamples > HOOP__WIRE_STATS_SAMPLES ||
      !links_valid(msg->nlinks, msg->links, HOOP__WIRE_MAX_RANKS, 0))
    return -1;
  for (uint32_t i = 1; i < msg->nsamples; i++)
    if (msg->samples[i].seq <= msg->samples[i - 1].seq)
      return -1;
  size_t start = begin_message(wb, HOOP_MSG_STATS);
  put_u64(wb, msg->calls);
  put_u64(wb, msg->bytes);
  put_u64(wb, msg->in_calls_us);
  put_u64(wb, msg->waited_us);
  put_u64(wb, msg->since_us);
  put_u64(wb, msg->clock);
  put_u32(wb, msg->nsamples);
  for (uint32_t i = 0; i < msg->nsamples; i++) {
    put_u32(wb, msg->samples[i].seq);
    put_u32(wb, msg->samples[i].waited_us);
    put_u32(wb, msg->samples[i].came_us);
  }
  put_links(wb, msg->nlinks, msg->links, 0);
  return finish_message(wb, start);
}

int hoop__wire_decode_stats(const uint8_t *payload, size_t len, hoop__stats_msg *out) {
  reader in = {payload, len, 0};
  memset(out, 0, sizeof *out);
  out->calls = get_u64(&in);
  out->bytes = get_u64(&in);
  out->in_calls_us = get_u64(&in);
  out->waited_us = get_u64(&in);
  out->since_us = get_u64(&in);
  out->clock = get_u64(&in);
  out->nsamples = get_u32(&in);
  if (out->nsamples > HOOP__WIRE_STATS_SAMPLES)
    return -1;
  for (uint32_t i = 0; i < out->nsamples; i++) {
    out->samples[i].seq = get_u32(&in);
    out->samples[i].waited_us = get_u32(&in);
    out->samples[i].came_us = get_u32(&in);
    if (i > 0 && out->samples[i].seq <= out->samples[i - 1].seq)
      in.bad = 1; /* by call number, each once */
  }
  get_links(&in, &out->nlinks, out->links, HOOP__WIRE_MAX_RANKS, 0);
  /* Time inside calls within the time measured, waiting within the time inside calls. */
  if (reader_done(&in) != 0 || out->waited_us > out->in_calls_us ||
      out->in_calls_us > out->since_us)
    return -1;
  return 0;
}

int hoop__wire_encode_view(hoop__wbuf *wb, const hoop__view_msg *msg) {
  if (msg->nlate > HOOP__WIRE_MAX_LATE)
    return -1;
  for (uint32_t i = 0; i < msg->nlate; i++)
    if (!late_valid(&msg->late[i], HOOP__WIRE_MAX_RANKS))
      return -1;
  if (!links_valid(msg->nlinks, msg->links, HOOP__WIRE_MAX_RANKS, 1))
    return -1;
  size_t start = begin_message(wb, HOOP_MSG_VIEW);
  put_u32(wb, msg->calls);
  put_u32(wb, msg->reporting);
  put_u32(wb, msg->nlate);
  for (uint32_t i = 0; i < msg->nlate; i++)
    put_late(wb, &msg->late[i]);
  put_links(wb, msg->nlinks, msg->links, 1);
  return finish_message(wb, start);
}

int hoop__wire_decode_view(const uint8_t *payload, size_t len, uint32_t size, hoop__view_msg *out) {
  reader in = {payload, len, 0};
  memset(out, 0, sizeof *out);
  out->calls = get_u32(&in);
  out->reporting = get_u32(&in);
  out->nlate = get_u32(&in);
  if (out->nlate > HOOP__WIRE_MAX_LATE || out->reporting > size)
    return -1;
  for (uint32_t i = 0; i < out->nlate && !in.bad; i++)
    get_late(&in, &out->late[i], size);
  get_links(&in, &out->nlinks, out->links, size, 1);
  return reader_done(&in);
}

int hoop__wire_health_valid(const hoop__job_health *health, uint32_t size) {
  if (health->running > 1 || health->reporting > size || health->wait_permille > 1000 ||
      health->nlate > HOOP__WIRE_STATUS_LATE)
    return 0;
  for (uint32_t i = 0; i < health->nlate; i++)
    if (!late_valid(&health->late[i], size))
      return 0;
  return links_valid(health->nlinks, health->links, size, 1);
}

void hoop__wire_put_health(hoop__wbuf *wb, const hoop__job_health *health) {
  put_u32(wb, health->running);
  put_u32(wb, health->reporting);
  put_u32(wb, health->calls_per_s);
  put_u32(wb, health->wait_permille);
  put_u32(wb, health->calls);
  put_u32(wb, health->nlate);
  for (uint32_t i = 0; i < health->nlate; i++)
    put_late(wb, &health->late[i]);
  put_links(wb, health->nlinks, health->links, 1);
}

void hoop__wire_get_health(reader *in, hoop__job_health *health, uint32_t size) {
  health->running = get_u32(in);
  health->reporting = get_u32(in);
  health->calls_per_s = get_u32(in);
  health->wait_permille = get_u32(in);
  health->calls = get_u32(in);
  health->nlate = get_u32(in);
  if (health->running > 1 || health->reporting > size || health->wait_permille > 1000 ||
      health->nlate > HOOP__WIRE_STATUS_LATE) {
    in->bad = 1;
    return;
  }
  for (uint32_t i = 0; i < health->nlate && !in->bad; i++)
    get_late(in, &health->late[i], size);
  get_links(in, &health->nlinks, health->links, size, 1);
}
