/* health.c - what the server makes of its members' STATS: per running job, which ranks the
 * others waited for, and how long (the VIEW each member gets back, and the health a status shows).
 *
 * A member describes its last calls that need every rank (allreduce, allgather, barrier,
 * reduce-scatter, all-to-all), each by its number, when the member came to it and how long it
 * waited in it. A rank's lateness in such a call is how much later than the first rank it came.
 * Members that read one clock (one kernel's monotonic clock: one host, its network namespaces
 * included) are compared by it. Between clocks only durations compare: every rank waits until the
 * last one comes, so of the ranks that came first on each clock, the one that waited longest came
 * first of all, and how much less another waited is how much later it came. The server compares
 * the calls every reporting member described, and gives each rank the median, 99th percentile and
 * maximum of its lateness over them.
 *
 * Clocks where they are shared, because waits alone mislead where ranks outnumber the CPUs: a
 * waiting rank learns that the last one came only when it runs again, up to a scheduler's tick
 * later (4 ms) than it came, and the longest of such waits, taken for the first rank's, made
 * lateness look 8 ms where the clock said 5. */
#include <stdlib.h>
#include <string.h>

#include "rdzv/server_impl.h"

/* A view is made again after each STATS of a job of up to VIEW_SMALL_JOB ranks, else at most this
 * often, however many STATS come (a view costs time in proportion to the ranks). */
#define VIEW_EVERY_MS 100
#define VIEW_SMALL_JOB 64
/* Calls a view may compare: those of a member's last two STATS. */
#define VIEW_CALLS (2 * HOOP__WIRE_STATS_SAMPLES)
/* A member is answered at most this often: one that floods STATS gets no flood back. */
#define ANSWER_EVERY_MS 250
/* STATS older than this no longer count (a member that stopped reporting). */
#define REPORT_STALE_MS 30000

typedef struct rdzv_report {
  hoop__stats_msg last, before; /* the last two STATS (before.since_us 0: one only) */
  uint64_t received_ms, answered_ms;
} rdzv_report;

void hoop__rdzv_report_free(rdzv_client *client) {
  free(client->report);
  client->report = NULL;
}

static int by_u32(const void *a, const void *b) {
  uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
  return x < y ? -1 : x > y;
}

/* Latest first: by median, then maximum, then rank. */
static int by_lateness(const void *a, const void *b) {
  const hoop__late *x = a, *y = b;
  if (x->median_us != y->median_us)
    return x->median_us > y->median_us ? -1 : 1;
  if (x->max_us != y->max_us)
    return x->max_us > y->max_us ? -1 : 1;
  return x->rank < y->rank ? -1 : x->rank > y->rank;
}

/* The members whose STATS count now. */
static uint32_t reporters(const rdzv_job *job, uint64_t now, rdzv_client **out) {
  uint32_t n = 0;
  for (uint32_t i = 0; i < job->joined; i++) {
    rdzv_client *member = job->members[i];
    if (member->report && now - member->report->received_ms <= REPORT_STALE_MS)
      out[n++] = member;
  }
  return n;
}

/* A member's sample of call seq, or NULL when it did not describe that call. Samples come
 * ordered by call number. */
static const hoop__stats_sample *sample_in_one(const hoop__stats_msg *msg, uint32_t seq) {
  uint32_t low = 0, high = msg->nsamples;
  while (low < high) {
    uint32_t mid = (low + high) / 2;
    if (msg->samples[mid].seq < seq)
      low = mid + 1;
    else
      high = mid;
  }
  return low < msg->nsamples && msg->samples[low].seq == seq ? &msg->samples[low] : NULL;
}

/* The same in either of its last two STATS: the members send theirs at the same moments, but
 * the server takes them one by one, and the first of a round finds the others' of the round
 * before, which describe the calls before it; the last two overlap. */
static const hoop__stats_sample *sample_in(const rdzv_report *report, uint32_t seq) {
  const hoop__stats_sample *s = sample_in_one(&report->last, seq);
  return s ? s : sample_in_one(&report->before, seq);
}

typedef struct by_clock_entry {
  uint64_t clock;
  uint32_t member;
} by_clock_entry;

static int by_clock(const void *a, const void *b) {
  const by_clock_entry *x = a, *y = b;
  if (x->clock != y->clock)
    return x->clock < y->clock ? -1 : 1;
  return x->member < y->member ? -1 : x->member > y->member;
}

/* Each member's clock as a number 0..groups-1 into group (members of one nonzero clock share
 * one; clock 0 is a member's own); the number of clocks, or 0 out of memory. */
static uint32_t clock_groups(rdzv_client **members, uint32_t n, uint32_t *group) {
  by_clock_entry *order = malloc((size_t)n * sizeof *order);
  if (!order)
    return 0;
  for (uint32_t m = 0; m < n; m++)
    order[m] = (by_clock_entry){members[m]->report->last.clock, m};
  qsort(order, n, sizeof *order, by_clock);
  uint32_t groups = 0;
  for (uint32_t i = 0; i < n; i++) {
    if (i == 0 || order[i].clock == 0 || order[i].clock != order[i - 1].clock)
      groups++;
    group[order[i].member] = groups - 1;
  }
  free(order);
  return groups;
}

/* Each member's lateness in one call into late (column stride apart), from its samples row:
 * by its clock after the first on it, and that one's by its wait against the longest wait of
 * the first on each clock. A member that says not when it came (it neither waited nor was away,
 * so every message was there: it came last) came when the first on its clock to see the call
 * through saw it (came plus waited, least of those that say), a little after. scratch: 2 x n. */
static void call_lateness(const hoop__stats_sample **row, uint32_t n, const uint32_t *group,
                          uint32_t groups, int64_t *scratch, uint32_t *late, size_t stride) {
  /* On each clock, times in microseconds after a reading of one of its members (base). */
  int64_t *came = scratch, *seen = scratch + n;
  uint32_t *base = (uint32_t *)(scratch + n + groups), *first = base + groups;
  for (uint32_t g = 0; g < groups; g++) {
    base[g] = first[g] = UINT32_MAX;
    seen[g] = INT64_MAX;
  }
  for (uint32_t m = 0; m < n; m++) {
    uint32_t g = group[m];
    if (row[m]->came_us == 0)
      continue;
    if (base[g] == UINT32_MAX)
      base[g] = row[m]->came_us;
    came[m] = (int32_t)(row[m]->came_us - base[g]);
    if (came[m] + row[m]->waited_us < seen[g])
      seen[g] = came[m] + row[m]->waited_us;
  }
  for (uint32_t m = 0; m < n; m++) {
    uint32_t g = group[m];
    if (row[m]->came_us == 0)
      came[m] = seen[g] == INT64_MAX ? 0 : seen[g];
    if (first[g] == UINT32_MAX || came[m] < came[first[g]])
      first[g] = m;
  }
  uint32_t most = 0;
  for (uint32_t g = 0; g < groups; g++)
    if (row[first[g]]->waited_us > most)
      most = row[first[g]]->waited_us;
  for (uint32_t m = 0; m < n; m++) {
    uint32_t f = first[group[m]];
    uint64_t us = (uint64_t)(most - row[f]->waited_us) + (uint64_t)(came[m] - came[f]);
    late[(size_t)m * stride] = us > UINT32_MAX ? UINT32_MAX : (uint32_t)us;
  }
}

/* The rate of a member's calls and its share of time waiting, over its last two STATS (over its
 * whole life with one). */
static void member_rates(const rdzv_report *report, double *calls_per_s, double *wait_share) {
  const hoop__stats_msg *a = &report->before, *b = &report->last;
  int two = a->since_us > 0 && b->since_us > a->since_us && b->calls >= a->calls &&
            b->waited_us >= a->waited_us;
  double us = two ? (double)(b->since_us - a->since_us) : (double)b->since_us;
  double calls = two ? (double)(b->calls - a->calls) : (double)b->calls;
  double waited = two ? (double)(b->waited_us - a->waited_us) : (double)b->waited_us;
  *calls_per_s = us > 0 ? calls * 1e6 / us : 0;
  *wait_share = us > 0 ? waited / us : 0;
  if (*wait_share > 1)
    *wait_share = 1;
}

/* The slowest links the members measured in their last periods, slowest first, into out (at most
 * HOOP__WIRE_MAX_LINKS): each member names those into it, the server puts them together. */
static uint32_t slowest_links(rdzv_client **members, uint32_t n, hoop__link *out) {
  uint32_t count = 0;
  for (uint32_t m = 0; m < n; m++) {
    const hoop__stats_msg *last = &members[m]->report->last;
    for (uint32_t l = 0; l < last->nlinks; l++) {
      hoop__link link = last->links[l];
      link.to = members[m]->rank;
      if (link.from != link.to)
        hoop__links_insert(out, &count, &link);
    }
  }
  return count;
}

static int by_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* Make the job's view and health from its members' STATS. */
static void make_view(rdzv_job *job, uint64_t now) {
  memset(&job->view, 0, sizeof job->view);
  memset(&job->health, 0, sizeof job->health);
  job->view_ms = now;
  job->health.running = 1;
  uint32_t n = 0;
  rdzv_client **members = job->joined ? malloc(job->joined * sizeof *members) : NULL;
  if (members)
    n = reporters(job, now, members);
  if (n == 0) {
    free(members);
    return;
  }
  job->view.reporting = job->health.reporting = n;
  job->view.nlinks = job->health.nlinks = slowest_links(members, n, job->view.links);
  memcpy(job->health.links, job->view.links, job->view.nlinks * sizeof job->view.links[0]);
  /* The calls every reporter described: the first one's that all others hold too. */
  uint32_t *lateness = malloc((size_t)n * VIEW_CALLS * sizeof *lateness);
  hoop__late *late = malloc((size_t)n * sizeof *late);
  double *rates = malloc((size_t)n * sizeof *rates);
  const hoop__stats_sample **row = malloc((size_t)n * sizeof *row);
  uint32_t *group = malloc((size_t)n * sizeof *group), groups = 0;
  /* call_lateness's scratch: came by member, then by clock the time seen, the base and first. */
  int64_t *scratch = malloc((size_t)n * 3 * sizeof *scratch);
  if (group)
    groups = clock_groups(members, n, group);
  uint32_t ncalls = 0;
  if (lateness && late && rates && row && scratch && groups > 0) {
    /* The first member's calls, from both its STATS, each once, in order. */
    const rdzv_report *first = members[0]->report;
    uint32_t ncandidates = 0, candidates[VIEW_CALLS];
    for (uint32_t c = 0; c < first->before.nsamples; c++)
      if (!sample_in_one(&first->last, first->before.samples[c].seq))
        candidates[ncandidates++] = first->before.samples[c].seq;
    for (uint32_t c = 0; c < first->last.nsamples; c++)
      candidates[ncandidates++] = first->last.samples[c].seq;
    for (uint32_t c = 0; c < ncandidates; c++) {
      uint32_t m = 0;
      for (; m < n && (row[m] = sample_in(members[m]->report, candidates[c])); m++)
        ;
      if (m < n)
        continue;
      call_lateness(row, n, group, groups, scratch, &lateness[ncalls], VIEW_CALLS);
      ncalls++;
    }
    double share = 0;
    for (uint32_t m = 0; m < n; m++) {
      uint32_t *mine = &lateness[(size_t)m * VIEW_CALLS];
      late[m].rank = members[m]->rank;
      if (ncalls > 0) {
        qsort(mine, ncalls, sizeof *mine, by_u32);
        late[m].median_us = mine[(ncalls - 1) / 2];
        uint32_t at99 = (uint32_t)((ncalls * 99 + 99) / 100);
        late[m].p99_us = mine[(at99 > 0 ? at99 : 1) - 1];
        late[m].max_us = mine[ncalls - 1];
      } else {
        late[m].median_us = late[m].p99_us = late[m].max_us = 0;
      }
      double wait_share;
      member_rates(members[m]->report, &rates[m], &wait_share);
      share += wait_share;
    }
    qsort(rates, n, sizeof *rates, by_double);
    double rate = rates[(n - 1) / 2];
    job->health.calls_per_s = rate > UINT32_MAX ? UINT32_MAX : (uint32_t)(rate + 0.5);
    job->health.wait_permille = (uint32_t)(share / n * 1000 + 0.5);
    if (job->health.wait_permille > 1000)
      job->health.wait_permille = 1000;
    if (ncalls > 0) {
      qsort(late, n, sizeof *late, by_lateness);
      job->view.calls = job->health.calls = ncalls;
      job->view.nlate = n < HOOP__WIRE_MAX_LATE ? n : HOOP__WIRE_MAX_LATE;
      memcpy(job->view.late, late, job->view.nlate * sizeof *late);
      job->health.nlate = n < HOOP__WIRE_STATUS_LATE ? n : HOOP__WIRE_STATUS_LATE;
      memcpy(job->health.late, late, job->health.nlate * sizeof *late);
    }
  } else {
    HOOP__WARN(HOOP_SUBSYS_RDZV, "job '%s': out of memory for its health", job->id);
  }
  free(scratch);
  free(group);
  free(row);
  free(rates);
  free(late);
  free(lateness);
  free(members);
}

static void refresh(rdzv_job *job) {
  uint64_t now = uv_now(job->server->loop);
  if (job->view_ms == 0 ||
      (job->view_stale && (job->joined <= VIEW_SMALL_JOB || now - job->view_ms >= VIEW_EVERY_MS))) {
    job->view_stale = 0;
    make_view(job, now);
  }
}

void hoop__rdzv_member_stats(rdzv_client *client, const hoop__stats_msg *msg) {
  rdzv_job *job = client->job;
  if (!client->report && !(client->report = calloc(1, sizeof *client->report))) {
    HOOP__WARN(HOOP_SUBSYS_RDZV, "job '%s': out of memory for rank %u's STATS", job->id,
               client->rank);
    return;
  }
  rdzv_report *report = client->report;
  uint64_t now = uv_now(client->server->loop);
  report->before = report->last;
  report->last = *msg;
  /* Links from ranks of this job only (a member's word: its VIEW goes to every member, whose
   * decoders refuse a rank outside the job). */
  uint32_t kept = 0;
  for (uint32_t l = 0; l < msg->nlinks; l++)
    if (msg->links[l].from < job->size && msg->links[l].from != client->rank)
      report->last.links[kept++] = msg->links[l];
  report->last.nlinks = kept;
  report->received_ms = now;
  job->view_stale = 1;
  if (report->answered_ms && now - report->answered_ms < ANSWER_EVERY_MS)
    return;
  report->answered_ms = now;
  refresh(job);
  rdzv_reply *reply = calloc(1, sizeof *reply);
  if (!reply || hoop__wire_encode_view(&reply->message, &job->view) != 0) {
    HOOP__WARN(HOOP_SUBSYS_RDZV, "job '%s': cannot answer rank %u's STATS", job->id, client->rank);
    if (reply)
      hoop__rdzv_reply_free(reply);
    return;
  }
  reply->keep_open = 1;
  hoop__rdzv_client_send(client, reply);
}

void hoop__rdzv_health_forget(rdzv_job *job) {
  memset(&job->view, 0, sizeof job->view);
  memset(&job->health, 0, sizeof job->health);
  job->view_ms = 0;
  job->view_stale = 0;
}

void hoop__rdzv_report_last(const rdzv_client *client, hoop__stats_msg *out) {
  *out = client->report->last;
}

void hoop__rdzv_job_health(rdzv_job *job, hoop__job_health *out) {
  memset(out, 0, sizeof *out);
  if (!job->running)
    return;
  refresh(job);
  *out = job->health;
}
