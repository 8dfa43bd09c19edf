/* hoop-bench.h - what hoop-bench's files share: the collectives it runs, its options, and the
 * functions that cross files. hoop-bench.c measures the rows and runs the sweep; options.c reads
 * the command line; check.c writes the known inputs and counts the results that differ from them.
 */
#ifndef BENCH_HOOP_BENCH_H
#define BENCH_HOOP_BENCH_H

#include <stddef.h>

#include "hoop.h"

typedef enum bench_coll {
  BENCH_ALLREDUCE,
  BENCH_BROADCAST,
  BENCH_ALLGATHER,
  BENCH_BARRIER,
  BENCH_REDUCE_SCATTER,
  BENCH_ALLTOALL,
  BENCH_SENDRECV, /* ping-pong between ranks 0 and 1; the others wait in the barriers */
  BENCH_REDUCE,
  BENCH_GATHER,
  BENCH_SCATTER,
  BENCH_COLLS
} bench_coll;
extern const char *const bench_coll_names[]; /* indexed by bench_coll */

#define BENCH_MAX_SIZES 128
#define BENCH_MAX_ASYNC 64 /* -a */

typedef struct bench_options {
  bench_coll coll;
  size_t min_bytes, max_bytes;
  double factor;
  hoop_dtype dtype;
  hoop_op op;
  int root;
  int iters, warmup;
  double budget_s;   /* > 0: iterations chosen as the anchors choose them, for this many seconds */
  const char *sizes; /* a comma-separated list instead of the -b/-e/-f sweep, or NULL */
  size_t size_list[BENCH_MAX_SIZES]; /* the sizes to run, from -s or from -b/-e/-f */
  int nsizes;
  int check;
  int in_place;
  int register_buffers;
  int calls;  /* calls per timed step, each with a receive buffer of its own (default 1) */
  int async;  /* post the step's calls non-blocking, then wait for them */
  int device; /* buffers in CUDA device memory */
  const char *csv_path;
} bench_options;

/* options.c: fills *opt from the command line; prints and exits on --help, --version and errors
 * (status 0 and 2). */
void bench_parse_options(int argc, char **argv, bench_options *opt);

/* check.c: rank r's inputs for op, and how many of count elements differ from what a collective
 * of kind (a bench_coll) over nranks ranks should have left: elements first.. of the reduced
 * inputs (allreduce, reduce_scatter), or of rank from_rank's input (the others). */
void bench_fill(void *buf, size_t count, hoop_dtype dtype, hoop_op op, int r);
/* After init: the communicator's wire format (hoop_comm_compress), which lets float sums be off
 * by its steps. */
void bench_compressed(int format, int nranks);
long bench_count_wrong(const void *buf, size_t count, hoop_dtype dtype, hoop_op op, int kind,
                       int from_rank, size_t first, int nranks);

#endif
