/* health.c - what the server makes of its members' STATS: per running job, which ranks the
 * others waited for, and how long (the VIEW each member gets back, and the health a status shows).
 *
 * A member describes its last calls that need every rank (allreduce, allgather, barrier,
 * reduce-scatter, all-to-all), each by its number and how long the member waited in it. In such a
 * call every rank waits until the last one comes, so the rank that waited longest came first, and
 * how much less another rank waited is how much later it came: its lateness in that call. The
 * server compares the calls every reporting member described, and gives each rank the median,
 * 99th percentile and maximum of its lateness over them; no clocks are compared, only each rank's
 * own durations. */
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

/* The wait of a member in call seq, or -1 when it did not describe that call. Samples come
 * ordered by call number. */
static int64_t wait_in_one(const hoop__stats_msg *msg, uint32_t seq) {
  uint32_t low = 0, high = msg->nsamples;
  while (low < high) {
    uint32_t mid = (low + high) / 2;
    if (msg->samples[mid].seq < seq)
      low = mid + 1;
    else
      high = mid;
  }
  return low < msg->nsamples && msg->samples[low].seq == seq ? (int64_t)msg->samples[low].waited_us
                                                             : -1;
}

/* The same in either of its last two STATS: the members send theirs at the same moments, but
 * the server takes them one by one, and the first of a round finds the others' of the round
 * before, which describe the calls before it; the last two overlap. */
static int64_t wait_in(const rdzv_report *report, uint32_t seq) {
  int64_t w = wait_in_one(&report->last, seq);
  return w >= 0 ? w : wait_in_one(&report->before, seq);
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
  uint32_t *waits = malloc((size_t)n * VIEW_CALLS * sizeof *waits);
  hoop__late *late = malloc((size_t)n * sizeof *late);
  double *rates = malloc((size_t)n * sizeof *rates);
  uint32_t ncalls = 0;
  if (waits && late && rates) {
    /* The first member's calls, from both its STATS, each once, in order. */
    const rdzv_report *first = members[0]->report;
    uint32_t ncandidates = 0, candidates[VIEW_CALLS];
    for (uint32_t c = 0; c < first->before.nsamples; c++)
      if (wait_in_one(&first->last, first->before.samples[c].seq) < 0)
        candidates[ncandidates++] = first->before.samples[c].seq;
    for (uint32_t c = 0; c < first->last.nsamples; c++)
      candidates[ncandidates++] = first->last.samples[c].seq;
    for (uint32_t c = 0; c < ncandidates; c++) {
      uint32_t seq = candidates[c], most = 0;
      uint32_t m = 0;
      for (; m < n; m++) {
        int64_t w = wait_in(members[m]->report, seq);
        if (w < 0)
          break;
        waits[(size_t)m * VIEW_CALLS + ncalls] = (uint32_t)w;
        if ((uint32_t)w > most)
          most = (uint32_t)w;
      }
      if (m < n)
        continue;
      for (m = 0; m < n; m++) /* lateness: how much less than the longest wait it waited */
        waits[(size_t)m * VIEW_CALLS + ncalls] = most - waits[(size_t)m * VIEW_CALLS + ncalls];
      ncalls++;
    }
    double share = 0;
    for (uint32_t m = 0; m < n; m++) {
      uint32_t *mine = &waits[(size_t)m * VIEW_CALLS];
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
  free(rates);
  free(late);
  free(waits);
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
