/* hoop-bench.c - bandwidth and latency sweeps of every collective, in the columns of nccl-tests:
 * size, count, type, op, root, time (us, the slowest rank's average), algbw and busbw (GB/s),
 * #wrong, and the anchors' robust columns: p50 and best (us) over the timed segments, and busbw
 * from p50. Run it under hooprun: `hooprun -np 4 hoop-bench allreduce -b 8 -e 64M -f 2`.
 *
 * busbw follows nccl-tests: allreduce algbw * 2(n-1)/n, allgather algbw * (n-1)/n, broadcast algbw,
 * so that the figure compares with the link's bandwidth whatever the rank count.
 *
 * This file measures one row and runs the sweep; options.c reads the command line, check.c
 * writes the inputs and checks the results.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "devmem.h"
#include "hoop-bench.h"

typedef struct bench_row {
  size_t bytes, count;
  double time_us, algbw, busbw;
  double p50_us, best_us, busbw_p50;
  int iters;
  long wrong;
} bench_row;

static hoop_comm *comm;
static int rank = -1, nranks; /* -1 until hoop_init gives one */

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void die(const char *what, hoop_result result) {
  if (rank >= 0)
    fprintf(stderr, "hoop-bench rank %d: ", rank);
  else
    fprintf(stderr, "hoop-bench: ");
  fprintf(stderr, "%s: %s: %s\n", what, hoop_strerror(result), hoop_last_error(comm));
  hoop_finalize(comm);
  exit(1);
}

/* ---- one row --------------------------------------------------------------------------------- */

#define BENCH_SEGMENTS 5
#define BENCH_MIN_ITERS 5
#define BENCH_MAX_ITERS 10000

typedef struct bench_buffers {
  char *send, *recv;           /* what the calls get: host memory, or device memory with -D */
  char *more[BENCH_MAX_ASYNC]; /* -k K: the receive buffers of calls 1..K-1 (call 0 uses recv) */
  char *host_send, *host_recv; /* -D: where inputs are written and results checked */
  size_t send_bytes, recv_bytes;
} bench_buffers;

/* -D: the host copies into the device buffers before the checked call, and back after it. */
static void to_device(const bench_options *opt, bench_buffers *b) {
  if (!opt->device)
    return;
  devmem_upload(b->send, b->host_send, b->send_bytes);
  devmem_upload(b->recv, b->host_recv, b->recv_bytes);
}

static void from_device(const bench_options *opt, bench_buffers *b) {
  if (opt->device)
    devmem_get(b->host_recv, b->recv, b->recv_bytes);
}

/* -a: the step's calls posted, then waited for; call k receives into its own buffer. */
static hoop_result run_async(const bench_options *opt, bench_buffers *b, size_t count) {
  hoop_request *reqs[BENCH_MAX_ASYNC];
  hoop_result result = HOOP_OK;
  size_t block = count * hoop_dtype_size(opt->dtype);
  int posted = 0;
  for (; posted < opt->calls && result == HOOP_OK; posted++) {
    char *recv = posted ? b->more[posted] : b->recv;
    hoop_request **req = &reqs[posted];
    switch (opt->coll) {
    case BENCH_ALLREDUCE:
      result = hoop_iallreduce(comm, opt->in_place ? recv : b->send, recv, count, opt->dtype,
                               opt->op, req);
      break;
    case BENCH_BROADCAST:
      result = hoop_ibroadcast(comm, recv, count, opt->dtype, opt->root, req);
      break;
    case BENCH_ALLGATHER:
      result = hoop_iallgather(comm, opt->in_place ? recv + (size_t)rank * block : b->send, recv,
                               count, opt->dtype, req);
      break;
    case BENCH_ALLTOALL:
      result = hoop_ialltoall(comm, opt->in_place ? recv : b->send, recv, count, opt->dtype, req);
      break;
    case BENCH_REDUCE_SCATTER:
      result = hoop_ireduce_scatter(comm, opt->in_place ? recv : b->send,
                                    opt->in_place ? recv + (size_t)rank * block : recv, count,
                                    opt->dtype, opt->op, req);
      break;
    case BENCH_REDUCE:
      result = hoop_ireduce(comm, opt->in_place && rank == opt->root ? recv : b->send, recv, count,
                            opt->dtype, opt->op, opt->root, req);
      break;
    case BENCH_GATHER:
      result = hoop_igather(
          comm, opt->in_place && rank == opt->root ? recv + (size_t)rank * block : b->send, recv,
          count, opt->dtype, opt->root, req);
      break;
    case BENCH_SCATTER:
      result = hoop_iscatter(
          comm, b->send, opt->in_place && rank == opt->root ? b->send + (size_t)rank * block : recv,
          count, opt->dtype, opt->root, req);
      break;
    case BENCH_SENDRECV:
      /* Both ways at once: each of ranks 0 and 1 posts its send and its receive together. */
      if (rank < 2 &&
          (result = hoop_irecv(comm, recv, count, opt->dtype, 1 - rank, 0, req)) == HOOP_OK &&
          posted + 1 < BENCH_MAX_ASYNC)
        result = hoop_isend(comm, b->send, count, opt->dtype, 1 - rank, 0, &reqs[++posted]);
      else if (rank >= 2)
        *req = NULL;
      break;
    default: result = hoop_ibarrier(comm, req); break;
    }
  }
  if (result != HOOP_OK)
    posted--;
  for (int k = 0; k < posted; k++) {
    if (!reqs[k])
      continue;
    hoop_result waited = hoop_wait(reqs[k]);
    if (result == HOOP_OK)
      result = waited;
  }
  return result;
}

static hoop_result run_one(const bench_options *opt, bench_buffers *b, char *recv, size_t count);

static hoop_result run_once(const bench_options *opt, bench_buffers *b, size_t count) {
  if (opt->async)
    return run_async(opt, b, count);
  hoop_result result = run_one(opt, b, b->recv, count);
  for (int k = 1; k < opt->calls && result == HOOP_OK; k++)
    result = run_one(opt, b, b->more[k], count);
  return result;
}

static hoop_result run_one(const bench_options *opt, bench_buffers *b, char *recv, size_t count) {
  switch (opt->coll) {
  case BENCH_ALLREDUCE:
    return hoop_allreduce(comm, opt->in_place ? recv : b->send, recv, count, opt->dtype, opt->op);
  case BENCH_BROADCAST: return hoop_broadcast(comm, recv, count, opt->dtype, opt->root);
  case BENCH_ALLGATHER: {
    size_t block = count * hoop_dtype_size(opt->dtype);
    return hoop_allgather(comm, opt->in_place ? recv + (size_t)rank * block : b->send, recv, count,
                          opt->dtype);
  }
  case BENCH_ALLTOALL:
    return hoop_alltoall(comm, opt->in_place ? recv : b->send, recv, count, opt->dtype);
  case BENCH_REDUCE_SCATTER: {
    size_t block = count * hoop_dtype_size(opt->dtype);
    return hoop_reduce_scatter(comm, opt->in_place ? recv : b->send,
                               opt->in_place ? recv + (size_t)rank * block : recv, count,
                               opt->dtype, opt->op);
  }
  case BENCH_REDUCE:
    return hoop_reduce(comm, opt->in_place && rank == opt->root ? recv : b->send, recv, count,
                       opt->dtype, opt->op, opt->root);
  case BENCH_GATHER: {
    size_t block = count * hoop_dtype_size(opt->dtype);
    return hoop_gather(comm,
                       opt->in_place && rank == opt->root ? recv + (size_t)rank * block : b->send,
                       recv, count, opt->dtype, opt->root);
  }
  case BENCH_SCATTER: {
    size_t block = count * hoop_dtype_size(opt->dtype);
    return hoop_scatter(comm, b->send,
                        opt->in_place && rank == opt->root ? b->send + (size_t)rank * block : recv,
                        count, opt->dtype, opt->root);
  }
  case BENCH_SENDRECV: { /* one round trip, 0 -> 1 -> 0 */
    hoop_result result = HOOP_OK;
    if (rank == 0 && (result = hoop_send(comm, b->send, count, opt->dtype, 1, 0)) == HOOP_OK)
      result = hoop_recv(comm, recv, count, opt->dtype, 1, 0);
    else if (rank == 1 && (result = hoop_recv(comm, recv, count, opt->dtype, 0, 0)) == HOOP_OK)
      result = hoop_send(comm, b->send, count, opt->dtype, 0, 0);
    return result;
  }
  default: return hoop_barrier(comm);
  }
}

/* Inputs are refilled before the checked run only, so that timing measures the collective. */
static void prepare(const bench_options *opt, bench_buffers *b, size_t count) {
  size_t esize = hoop_dtype_size(opt->dtype);
  switch (opt->coll) {
  case BENCH_ALLREDUCE:
    bench_fill(opt->in_place ? b->host_recv : b->host_send, count, opt->dtype, opt->op, rank);
    break;
  case BENCH_BROADCAST:
    if (rank == opt->root)
      bench_fill(b->host_recv, count, opt->dtype, opt->op, rank);
    else
      memset(b->host_recv, 0, count * esize);
    break;
  case BENCH_ALLGATHER:
    memset(b->host_recv, 0, count * esize * (size_t)nranks);
    bench_fill(opt->in_place ? b->host_recv + (size_t)rank * count * esize : b->host_send, count,
               opt->dtype, opt->op, rank);
    break;
  case BENCH_ALLTOALL:
    memset(b->host_recv, 0, count * esize * (size_t)nranks);
    /* fall through */
  case BENCH_REDUCE_SCATTER: /* the whole input, every block */
    bench_fill(opt->in_place ? b->host_recv : b->host_send, count * (size_t)nranks, opt->dtype,
               opt->op, rank);
    break;
  case BENCH_SENDRECV:
    memset(b->host_recv, 0, count * esize);
    bench_fill(b->host_send, count, opt->dtype, opt->op, rank);
    break;
  case BENCH_REDUCE:
    memset(b->host_recv, 0, count * esize);
    bench_fill(opt->in_place && rank == opt->root ? b->host_recv : b->host_send, count, opt->dtype,
               opt->op, rank);
    break;
  case BENCH_GATHER:
    memset(b->host_recv, 0, count * esize * (size_t)nranks);
    bench_fill(opt->in_place && rank == opt->root ? b->host_recv + (size_t)rank * count * esize
                                                  : b->host_send,
               count, opt->dtype, opt->op, rank);
    break;
  case BENCH_SCATTER: /* block r of the root's buffer is rank r's input */
    memset(b->host_recv, 0, count * esize);
    for (int r = 0; rank == opt->root && r < nranks; r++)
      bench_fill(b->host_send + (size_t)r * count * esize, count, opt->dtype, opt->op, r);
    break;
  default: break;
  }
}

static long check_result(const bench_options *opt, bench_buffers *b, size_t count) {
  size_t block = count * hoop_dtype_size(opt->dtype);
  long wrong = 0;
  switch (opt->coll) {
  case BENCH_ALLREDUCE:
    return bench_count_wrong(b->host_recv, count, opt->dtype, opt->op, BENCH_ALLREDUCE, 0, 0,
                             nranks);
  case BENCH_BROADCAST:
    return bench_count_wrong(b->host_recv, count, opt->dtype, opt->op, BENCH_BROADCAST, opt->root,
                             0, nranks);
  case BENCH_ALLGATHER:
    for (int r = 0; r < nranks; r++)
      wrong += bench_count_wrong(b->host_recv + (size_t)r * block, count, opt->dtype, opt->op,
                                 BENCH_ALLGATHER, r, 0, nranks);
    return wrong;
  case BENCH_REDUCE_SCATTER:
    return bench_count_wrong(b->host_recv + (opt->in_place ? (size_t)rank * block : 0), count,
                             opt->dtype, opt->op, BENCH_REDUCE_SCATTER, rank, (size_t)rank * count,
                             nranks);
  case BENCH_ALLTOALL:
    for (int r = 0; r < nranks; r++)
      wrong += bench_count_wrong(b->host_recv + (size_t)r * block, count, opt->dtype, opt->op,
                                 BENCH_ALLTOALL, r, (size_t)rank * count, nranks);
    return wrong;
  case BENCH_REDUCE:
    return rank == opt->root ? bench_count_wrong(b->host_recv, count, opt->dtype, opt->op,
                                                 BENCH_ALLREDUCE, 0, 0, nranks)
                             : 0;
  case BENCH_GATHER:
    for (int r = 0; rank == opt->root && r < nranks; r++)
      wrong += bench_count_wrong(b->host_recv + (size_t)r * block, count, opt->dtype, opt->op,
                                 BENCH_ALLGATHER, r, 0, nranks);
    return wrong;
  case BENCH_SCATTER:
    return bench_count_wrong(
        opt->in_place && rank == opt->root ? b->host_send + (size_t)rank * block : b->host_recv,
        count, opt->dtype, opt->op, BENCH_BROADCAST, rank, 0, nranks);
  case BENCH_SENDRECV: /* the other's message, as a broadcast from it would leave it */
    return rank < 2 ? bench_count_wrong(b->host_recv, count, opt->dtype, opt->op, BENCH_BROADCAST,
                                        1 - rank, 0, nranks)
                    : 0;
  default: return 0;
  }
}

static double bus_factor(bench_coll coll) {
  double n = nranks;
  switch (coll) {
  case BENCH_ALLREDUCE: return 2 * (n - 1) / n;
  case BENCH_ALLGATHER:
  case BENCH_GATHER:
  case BENCH_SCATTER:
  case BENCH_REDUCE_SCATTER:
  case BENCH_ALLTOALL: return (n - 1) / n;
  default: return 1;
  }
}

/* Seconds that `iters` back-to-back calls take on this rank. */
static double time_loop(const bench_options *opt, bench_buffers *b, size_t count, long iters) {
  hoop_result result;
  double start = now_s();
  for (long i = 0; i < iters; i++)
    if ((result = run_once(opt, b, count)) != HOOP_OK)
      die(bench_coll_names[opt->coll], result);
  return now_s() - start;
}

static void sync_ranks(void) {
  hoop_result result = hoop_barrier(comm);
  if (result != HOOP_OK)
    die("hoop_barrier", result);
}

static void reduce_doubles(double *values, int n, hoop_op op) {
  hoop_result result = hoop_allreduce(comm, values, values, (size_t)n, HOOP_FLOAT64, op);
  if (result != HOOP_OK)
    die("hoop_allreduce (timing)", result);
}

/* With a budget, the anchors' scheme (../shared/anchors/mpibench.c) after one untimed call: run k =
 * 1, 2, 4, ... calls until the slowest rank needs 20 ms for them (that is the warm-up), then as
 * many as fill the budget, at least 5 and at most 10000. Otherwise the warm-up and iteration count
 * given. */
static long choose_iters(const bench_options *opt, bench_buffers *b, size_t count) {
  if (opt->budget_s <= 0) {
    time_loop(opt, b, count, opt->warmup);
    return opt->iters;
  }
  /* One call first, outside the probe: a size's first call may pay what later ones do not (a
   * peer's CUDA IPC handles opened at its first device buffer, scratch grown), and a probe of
   * k = 1 that took 20 ms for that reason would set the per-call estimate (the 4-rank device runs
   * chose 10-15 iterations at 256 KiB, the first size past the IPC cut-over). */
  time_loop(opt, b, count, 1);
  double per_call = 0;
  for (long k = 1;; k *= 2) {
    sync_ranks();
    double slowest = time_loop(opt, b, count, k);
    reduce_doubles(&slowest, 1, HOOP_MAX);
    per_call = slowest / (double)k;
    if (slowest >= 0.02 || k >= BENCH_MAX_ITERS)
      break;
  }
  double iters = opt->budget_s / (per_call > 0 ? per_call : 1e-9);
  return iters < BENCH_MIN_ITERS   ? BENCH_MIN_ITERS
         : iters > BENCH_MAX_ITERS ? BENCH_MAX_ITERS
                                   : (long)iters;
}

static int compare_doubles(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static bench_row measure(const bench_options *opt, bench_buffers *b, size_t count) {
  bench_row row = {0};
  size_t esize = hoop_dtype_size(opt->dtype);
  row.count = count;
  row.bytes = opt->coll == BENCH_ALLGATHER || opt->coll == BENCH_REDUCE_SCATTER ||
                      opt->coll == BENCH_ALLTOALL || opt->coll == BENCH_GATHER ||
                      opt->coll == BENCH_SCATTER
                  ? count * esize * (size_t)nranks
                  : count * esize;
  hoop_result result;
  prepare(opt, b, count);
  long iters = choose_iters(opt, b, count);
  /* The timed loop runs in up to BENCH_SEGMENTS equal segments, a barrier before each, so that a
   * median and a best segment can be reported next to the average, as the anchors do. */
  int nseg = iters < BENCH_SEGMENTS ? (int)iters : BENCH_SEGMENTS;
  long per_seg = (iters + nseg - 1) / nseg;
  iters = per_seg * nseg;
  double seg[BENCH_SEGMENTS], total = 0;
  for (int s = 0; s < nseg; s++) {
    sync_ranks();
    double elapsed = time_loop(opt, b, count, per_seg);
    total += elapsed;
    seg[s] = elapsed / (double)per_seg;
  }
  /* -k K: each step ran K calls. */
  int per_step = opt->calls;
  for (int s = 0; s < nseg; s++)
    seg[s] /= per_step;
  iters *= per_step;
  double elapsed = total / (double)iters;
  /* sendrecv: half the round trip, of ranks 0 and 1 only (the anchors' pingpong). */
  int timed = opt->coll == BENCH_SENDRECV ? 2 : nranks;
  if (opt->coll == BENCH_SENDRECV) {
    elapsed = rank < 2 ? elapsed / 2 : 0;
    for (int s = 0; s < nseg; s++)
      seg[s] = rank < 2 ? seg[s] / 2 : 0;
  }
  /* The row's time is the slowest rank's average, as nccl-tests reports it; p50 and best are the
   * median and fastest segment of the ranks' mean, as the anchors report them. */
  reduce_doubles(&elapsed, 1, HOOP_MAX);
  reduce_doubles(seg, nseg, HOOP_SUM);
  for (int s = 0; s < nseg; s++)
    seg[s] /= timed;
  qsort(seg, (size_t)nseg, sizeof seg[0], compare_doubles);
  double p50 = nseg % 2 ? seg[nseg / 2] : 0.5 * (seg[nseg / 2 - 1] + seg[nseg / 2]);
  row.iters = (int)iters;
  row.time_us = elapsed * 1e6;
  row.p50_us = p50 * 1e6;
  row.best_us = seg[0] * 1e6;
  row.algbw = opt->coll == BENCH_BARRIER ? 0 : (double)row.bytes / elapsed / 1e9;
  row.busbw = row.algbw * bus_factor(opt->coll);
  row.busbw_p50 =
      opt->coll == BENCH_BARRIER ? 0 : (double)row.bytes / p50 / 1e9 * bus_factor(opt->coll);
  if (opt->check && opt->coll != BENCH_BARRIER) {
    prepare(opt, b, count);
    to_device(opt, b);
    if ((result = run_once(opt, b, count)) != HOOP_OK)
      die(bench_coll_names[opt->coll], result);
    from_device(opt, b);
    int64_t wrong = check_result(opt, b, count);
    if ((result = hoop_allreduce(comm, &wrong, &wrong, 1, HOOP_INT64, HOOP_SUM)) != HOOP_OK)
      die("hoop_allreduce (check)", result);
    row.wrong = (long)wrong;
  } else {
    row.wrong = -1;
  }
  return row;
}

/* ---- the sweep ------------------------------------------------------------------------------- */

static void print_header(const bench_options *opt) {
  printf("# hoop-bench %s: %d ranks, dtype %s, op %s, root %d, %s, ", bench_coll_names[opt->coll],
         nranks, hoop_dtype_name(opt->dtype), hoop_op_name(opt->op), opt->root,
         opt->in_place ? "in place" : "out of place");
  if (opt->calls > 1 || opt->async)
    printf("%d %scall%s per step, ", opt->calls, opt->async ? "non-blocking " : "",
           opt->calls == 1 ? "" : "s");
  if (opt->budget_s > 0)
    printf("budget %.2f s per size\n", opt->budget_s);
  else
    printf("iters %d, warmup %d\n", opt->iters, opt->warmup);
  printf("#\n# %12s %12s %9s %6s %6s %7s %11s %9s %9s %7s %11s %11s %9s\n", "size", "count", "type",
         "redop", "root", "iters", "time", "algbw", "busbw", "#wrong", "p50", "best", "busbw");
  printf("# %12s %12s %9s %6s %6s %7s %11s %9s %9s %7s %11s %11s %9s\n", "(B)", "(elements)", "",
         "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(us)", "p50");
}

static void print_row(const bench_options *opt, const bench_row *row, FILE *csv) {
  char wrong[24];
  if (row->wrong < 0)
    snprintf(wrong, sizeof wrong, "N/A");
  else
    snprintf(wrong, sizeof wrong, "%ld", row->wrong);
  printf("  %12zu %12zu %9s %6s %6d %7d %11.2f %9.3f %9.3f %7s %11.2f %11.2f %9.3f\n", row->bytes,
         row->count, hoop_dtype_name(opt->dtype),
         opt->coll == BENCH_ALLREDUCE || opt->coll == BENCH_REDUCE_SCATTER ||
                 opt->coll == BENCH_REDUCE
             ? hoop_op_name(opt->op)
             : "none",
         opt->coll == BENCH_BROADCAST || opt->coll == BENCH_REDUCE || opt->coll == BENCH_GATHER ||
                 opt->coll == BENCH_SCATTER
             ? opt->root
             : -1,
         row->iters, row->time_us, row->algbw, row->busbw, wrong, row->p50_us, row->best_us,
         row->busbw_p50);
  if (csv)
    fprintf(csv, "%s,%d,%zu,%zu,%s,%s,%.3f,%.6f,%.6f,%ld,%d,%.3f,%.3f,%.6f\n",
            bench_coll_names[opt->coll], nranks, row->bytes, row->count,
            hoop_dtype_name(opt->dtype), hoop_op_name(opt->op), row->time_us, row->algbw,
            row->busbw, row->wrong, row->iters, row->p50_us, row->best_us, row->busbw_p50);
}

int main(int argc, char **argv) {
  bench_options opt;
  bench_parse_options(argc, argv, &opt);
  hoop_result result = hoop_init_from_env(&comm);
  if (result != HOOP_OK)
    die("hoop_init_from_env", result);
  rank = hoop_rank(comm);
  nranks = hoop_size(comm);
  bench_compressed(hoop_comm_compress(comm), nranks);
  if (opt.coll == BENCH_SENDRECV && nranks < 2) {
    if (rank == 0)
      fprintf(stderr, "hoop-bench: sendrecv needs 2 ranks or more\n");
    hoop_finalize(comm);
    return 2;
  }
  if (opt.root < 0 || opt.root >= nranks) {
    if (rank == 0)
      fprintf(stderr, "hoop-bench: root %d is not a rank of this %d-rank job\n", opt.root, nranks);
    hoop_finalize(comm);
    return 2;
  }
  size_t esize = hoop_dtype_size(opt.dtype);
  size_t per_rank_max =
      opt.coll == BENCH_ALLGATHER ? opt.max_bytes / (size_t)nranks : opt.max_bytes;
  bench_buffers b = {0};
  b.send_bytes = per_rank_max + esize;
  b.recv_bytes = opt.max_bytes + (size_t)nranks * esize;
  b.host_send = calloc(1, b.send_bytes);
  b.host_recv = calloc(1, b.recv_bytes);
  if (!b.host_send || !b.host_recv) {
    fprintf(stderr, "hoop-bench: cannot allocate %zu bytes\n", opt.max_bytes);
    return 1;
  }
  if (opt.device) {
    char why[256];
    if (devmem_init(why, sizeof why) != 0) {
      fprintf(stderr, "hoop-bench: --device: %s\n", why);
      hoop_finalize(comm);
      return 2;
    }
    b.send = devmem_put(b.host_send, b.send_bytes);
    b.recv = devmem_put(b.host_recv, b.recv_bytes);
    for (int k = 1; k < opt.calls; k++)
      b.more[k] = devmem_put(b.host_recv, b.recv_bytes);
  } else {
    b.send = b.host_send;
    b.recv = b.host_recv;
    for (int k = 1; k < opt.calls; k++)
      if ((b.more[k] = calloc(1, b.recv_bytes)) == NULL) {
        fprintf(stderr, "hoop-bench: cannot allocate %zu bytes\n", opt.max_bytes);
        return 1;
      }
  }
  hoop_mem_handle send_handle = 0, recv_handle = 0, more_handle[BENCH_MAX_ASYNC] = {0};
  if (opt.register_buffers &&
      ((result = hoop_register(comm, b.send, per_rank_max + esize, &send_handle)) != HOOP_OK ||
       (result = hoop_register(comm, b.recv, opt.max_bytes + (size_t)nranks * esize,
                               &recv_handle)) != HOOP_OK))
    die("hoop_register", result);
  for (int k = 1; opt.register_buffers && k < opt.calls; k++)
    if ((result = hoop_register(comm, b.more[k], b.recv_bytes, &more_handle[k])) != HOOP_OK)
      die("hoop_register", result);
  FILE *csv = NULL;
  if (rank == 0 && opt.csv_path) {
    csv = fopen(opt.csv_path, "w");
    if (!csv)
      fprintf(stderr, "hoop-bench: cannot write %s: %s\n", opt.csv_path, strerror(errno));
    else
      fprintf(csv, "collective,ranks,bytes,count,type,op,time_us,algbw_GBps,busbw_GBps,wrong,"
                   "iters,p50_us,best_us,busbw_p50_GBps\n");
  }
  if (rank == 0)
    print_header(&opt);
  double busbw_sum = 0;
  long rows = 0, wrong_total = 0;
  for (int i = 0; i < opt.nsizes; i++) {
    size_t bytes = opt.size_list[i];
    size_t per_rank = opt.coll == BENCH_ALLGATHER || opt.coll == BENCH_REDUCE_SCATTER ||
                              opt.coll == BENCH_ALLTOALL || opt.coll == BENCH_GATHER ||
                              opt.coll == BENCH_SCATTER
                          ? bytes / (size_t)nranks
                          : bytes;
    size_t count = opt.coll == BENCH_BARRIER ? 0 : per_rank / esize;
    if (opt.coll != BENCH_BARRIER && count == 0)
      continue;
    bench_row row = measure(&opt, &b, count);
    if (rank == 0)
      print_row(&opt, &row, csv);
    busbw_sum += row.busbw;
    wrong_total += row.wrong > 0 ? row.wrong : 0;
    rows++;
    if (opt.coll == BENCH_BARRIER)
      break;
  }
  if (rank == 0) {
    printf("# Out of bounds values : %ld %s\n", wrong_total, wrong_total ? "FAILED" : "OK");
    printf("# Avg bus bandwidth    : %.4f GB/s\n", rows ? busbw_sum / (double)rows : 0.0);
  }
  if (csv)
    fclose(csv);
  if (opt.register_buffers && ((result = hoop_deregister(comm, recv_handle)) != HOOP_OK ||
                               (result = hoop_deregister(comm, send_handle)) != HOOP_OK))
    die("hoop_deregister", result);
  for (int k = 1; opt.register_buffers && k < opt.calls; k++)
    if ((result = hoop_deregister(comm, more_handle[k])) != HOOP_OK)
      die("hoop_deregister", result);
  for (int k = 1; k < opt.calls; k++)
    opt.device ? devmem_free(b.more[k]) : free(b.more[k]);
  if (opt.device) {
    devmem_free(b.recv);
    devmem_free(b.send);
  }
  free(b.host_recv);
  free(b.host_send);
  hoop_finalize(comm);
  return wrong_total ? 1 : 0;
}
