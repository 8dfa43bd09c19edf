/* metrics.c - the server's state in Prometheus' text exposition format (version 0.0.4): jobs and
 * ranks, joins, refusals by cause, members' aborts and losses, and per running job its ranks, call
 * rate, calls and bytes, time waiting and its late ranks (from the members' STATS, health.c). What
 * serves it over HTTP is the daemon's (tools/hoopd_metrics.c). */
#include <stdio.h>
#include <string.h>

#include "rdzv/server_impl.h"

static const char *const refusal_names[REFUSALS] = {
    [REFUSED_AUTH] = "auth",   [REFUSED_MALFORMED] = "malformed",
    [REFUSED_LIMIT] = "limit", [REFUSED_MISMATCH] = "mismatch",
    [REFUSED_IDLE] = "idle",   [REFUSED_TIMEOUT] = "timeout",
};

/* A running job whose id a later running job took again (an id is free once its job runs): its
 * series would repeat the later one's labels, which the format forbids; the later one is shown. */
static int shadowed(const rdzv_job *job) {
  for (const rdzv_job *later = job->next; later; later = later->next)
    if (later->running && !later->forgotten && later->joined > 0 && strcmp(later->id, job->id) == 0)
      return 1;
  return 0;
}

static void family(hoop__buf *out, const char *name, const char *type, const char *help) {
  hoop__buf_printf(out, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* A label value as the format has it: backslash, double quote and line feed escaped (a job id
 * holds no control byte: the wire refuses them). */
static void label(hoop__buf *out, const char *value) {
  for (const char *p = value; *p; p++) {
    if (*p == '\\' || *p == '"')
      hoop__buf_printf(out, "\\%c", *p);
    else if (*p == '\n')
      hoop__buf_printf(out, "\\n");
    else
      hoop__buf_append(out, p, 1);
  }
}

/* name{job="id"[,extra]} value */
static void job_sample(hoop__buf *out, const char *name, const rdzv_job *job, const char *extra,
                       double value) {
  hoop__buf_printf(out, "%s{job=\"", name);
  label(out, job->id);
  hoop__buf_printf(out, "\"%s%s} %.9g\n", extra ? "," : "", extra ? extra : "", value);
}

/* A running job's members' totals, from their last STATS. */
static void job_totals(const rdzv_job *job, double *calls, double *bytes) {
  *calls = *bytes = 0;
  for (uint32_t i = 0; i < job->joined; i++)
    if (job->members[i]->report) {
      hoop__stats_msg last;
      hoop__rdzv_report_last(job->members[i], &last);
      *calls += (double)last.calls;
      *bytes += (double)last.bytes;
    }
}

void hoop__rdzv_metrics_text(hoop__rdzv_server *server, hoop__buf *out) {
  uint32_t waiting = 0, running = 0, ranks_waiting = 0, ranks_running = 0;
  for (rdzv_job *job = server->jobs; job; job = job->next) {
    if (job->forgotten || job->joined == 0)
      continue;
    *(job->running ? &running : &waiting) += 1;
    *(job->running ? &ranks_running : &ranks_waiting) += job->joined;
  }
  family(out, "hoop_jobs", "gauge", "Jobs the rendezvous server holds, by state.");
  hoop__buf_printf(out, "hoop_jobs{state=\"waiting\"} %u\nhoop_jobs{state=\"running\"} %u\n",
                   waiting, running);
  family(out, "hoop_ranks", "gauge", "Ranks joined to the server's jobs, by the job's state.");
  hoop__buf_printf(out, "hoop_ranks{state=\"waiting\"} %u\nhoop_ranks{state=\"running\"} %u\n",
                   ranks_waiting, ranks_running);
  family(out, "hoop_connections", "gauge", "Client connections open.");
  hoop__buf_printf(out, "hoop_connections %d\n", server->nclients);
  family(out, "hoop_joins_total", "counter", "Ranks that joined a job.");
  hoop__buf_printf(out, "hoop_joins_total %llu\n", (unsigned long long)server->joins);
  family(out, "hoop_refusals_total", "counter",
         "Requests and connections refused or closed, by cause.");
  for (int r = 0; r < REFUSALS; r++)
    hoop__buf_printf(out, "hoop_refusals_total{cause=\"%s\"} %llu\n", refusal_names[r],
                     (unsigned long long)server->refusals[r]);
  family(out, "hoop_failures_total", "counter",
         "Members' aborts and losses relayed to the other ranks of their jobs.");
  hoop__buf_printf(out,
                   "hoop_failures_total{cause=\"aborted\"} %llu\n"
                   "hoop_failures_total{cause=\"lost\"} %llu\n",
                   (unsigned long long)server->aborts, (unsigned long long)server->losses);
  family(out, "hoop_status_queries_total", "counter", "Status queries answered.");
  hoop__buf_printf(out, "hoop_status_queries_total %llu\n",
                   (unsigned long long)server->status_queries);

  static const struct {
    const char *name, *type, *help;
  } per_job[] = {
      {"hoop_job_size", "gauge", "A running job's ranks."},
      {"hoop_job_ranks", "gauge", "A running job's ranks still connected."},
      {"hoop_job_reporting_ranks", "gauge", "Ranks of a running job whose summaries count."},
      {"hoop_job_calls_per_second", "gauge",
       "A running job's collective calls per second "
       "(the ranks' median)."},
      {"hoop_job_calls_total", "counter",
       "Collective calls the ranks of a running job made "
       "(summed over its ranks)."},
      {"hoop_job_bytes_total", "counter",
       "Payload bytes of a running job's collective calls "
       "(summed over its ranks)."},
      {"hoop_job_wait_ratio", "gauge",
       "The share of their time a running job's ranks spend "
       "waiting for each other (their mean)."},
      {"hoop_job_slowest_rank", "gauge",
       "The rank of a running job that comes latest to its "
       "calls (-1: none known)."},
      {"hoop_job_slowest_rank_lateness_seconds", "gauge",
       "How much later than the first rank the latest rank comes (median)."},
      {"hoop_job_rank_lateness_seconds", "gauge",
       "How much later than the first rank a late rank comes, by quantile (the latest 4)."},
      {"hoop_job_link_goodput_bytes_per_second", "gauge",
       "The slowest links' goodput in the ranks' last periods (large messages, first byte to "
       "last), by sending and receiving rank (the slowest 4)."},
  };
  for (size_t f = 0; f < sizeof per_job / sizeof per_job[0]; f++) {
    family(out, per_job[f].name, per_job[f].type, per_job[f].help);
    for (rdzv_job *job = server->jobs; job; job = job->next) {
      if (!job->running || job->forgotten || job->joined == 0 || shadowed(job))
        continue;
      hoop__job_health health;
      hoop__rdzv_job_health(job, &health);
      double calls, bytes;
      job_totals(job, &calls, &bytes);
      int known = health.calls > 0 && health.nlate > 0;
      switch (f) {
      case 0: job_sample(out, per_job[f].name, job, NULL, job->size); break;
      case 1: job_sample(out, per_job[f].name, job, NULL, job->joined); break;
      case 2: job_sample(out, per_job[f].name, job, NULL, health.reporting); break;
      case 3: job_sample(out, per_job[f].name, job, NULL, health.calls_per_s); break;
      case 4: job_sample(out, per_job[f].name, job, NULL, calls); break;
      case 5: job_sample(out, per_job[f].name, job, NULL, bytes); break;
      case 6: job_sample(out, per_job[f].name, job, NULL, health.wait_permille / 1000.0); break;
      case 7:
        job_sample(out, per_job[f].name, job, NULL, known ? (double)health.late[0].rank : -1.0);
        break;
      case 8:
        job_sample(out, per_job[f].name, job, NULL, known ? health.late[0].median_us * 1e-6 : 0);
        break;
      case 10:
        for (uint32_t l = 0; l < health.nlinks; l++) {
          const hoop__link *link = &health.links[l];
          char extra[64];
          snprintf(extra, sizeof extra, "from=\"%u\",to=\"%u\"", link->from, link->to);
          job_sample(out, per_job[f].name, job, extra,
                     (double)link->bytes / ((double)link->us * 1e-6));
        }
        break;
      default:
        for (uint32_t l = 0; known && l < health.nlate; l++) {
          const hoop__late *late = &health.late[l];
          const uint32_t values[3] = {late->median_us, late->p99_us, late->max_us};
          static const char *const quantiles[3] = {"0.5", "0.99", "1"};
          for (int q = 0; q < 3; q++) {
            char extra[64];
            snprintf(extra, sizeof extra, "rank=\"%u\",quantile=\"%s\"", late->rank, quantiles[q]);
            job_sample(out, per_job[f].name, job, extra, values[q] * 1e-6);
          }
        }
      }
    }
  }
}
