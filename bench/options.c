/* options.c - hoop-bench's command line: the collective named first, the options, the help text,
 * and the list of sizes a run sweeps. Errors print a line and exit with status 2. */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "hoop-bench.h"

const char *const bench_coll_names[] = {"allreduce",      "broadcast", "allgather", "barrier",
                                        "reduce_scatter", "alltoall",  "sendrecv",  "reduce",
                                        "gather",         "scatter"};

static void usage(FILE *out) {
  fprintf(out,
          "usage: hoop-bench allreduce|broadcast|allgather|reduce_scatter|alltoall|sendrecv|\n"
          "                  reduce|gather|scatter|barrier [options]\n"
          "  -b, --minbytes N   smallest size (K, M, G suffixes; default 8)\n"
          "  -e, --maxbytes N   largest size (default 64M)\n"
          "  -f, --stepfactor F multiply the size by F each row (default 2)\n"
          "  -d, --datatype T   int8 uint8 int16 uint16 int32 uint32 int64 uint64 float16\n"
          "                     bfloat16 float32 float64 bool (default float32)\n"
          "  -o, --op OP        sum prod min max avg band bor bxor (default sum; the bitwise\n"
          "                     ops on integer and bool dtypes)\n"
          "  -r, --root R       the root of broadcast, reduce, gather and scatter (default 0)\n"
          "  -n, --iters N      timed iterations per size (default 20)\n"
          "  -w, --warmup N     untimed iterations first (default 5)\n"
          "  -t, --budget S     choose iterations as the anchors do: probe (and warm up) until\n"
          "                     a batch takes 20 ms, then time about S seconds (overrides -n, -w)\n"
          "  -s, --sizes LIST   comma-separated sizes instead of -b/-e/-f (e.g. 8,4K,1M,64M)\n"
          "  -c, --check 0|1    check every rank's result (default 1)\n"
          "  -i, --inplace      in-place allreduce, allgather, reduce_scatter and alltoall\n"
          "  -R, --register     hoop_register the buffers first (zero-copy over ibverbs;\n"
          "                     with -D, GPUDirect RDMA where the GPU and device allow)\n"
          "  -k, --calls K      K calls per timed step, each with a receive buffer of its\n"
          "                     own (default 1); times are per call\n"
          "  -a, --async        post the step's calls non-blocking (hoop_iallreduce...), then\n"
          "                     wait for them (-a alone: the cost of post + wait)\n"
          "  -D, --device       buffers in CUDA device memory (GPU 0 of the driver that libhoop\n"
          "                     loads, HOOP_CUDA_LIBRARY); inputs written and results checked\n"
          "                     through host copies, outside the timing\n"
          "      --csv FILE     also write the rows to FILE (rank 0)\n"
          "  -h, --help, -V, --version\n"
          "Sizes are total bytes per rank's result: for allgather and gather, the gathered buffer; "
          "for\n"
          "scatter, the root's buffer of every block; for\n"
          "reduce_scatter, the input every rank reduces (each keeps 1/size of it); for\n"
          "alltoall, what every rank sends (1/size of it to each rank); for sendrecv, the\n"
          "message that rank 0 sends rank 1 and rank 1 sends back (hoop_send, hoop_recv; -a:\n"
          "hoop_isend and hoop_irecv posted together), times being half the round trip.\n");
}

static size_t parse_size(const char *text) {
  char *end;
  errno = 0;
  double value = strtod(text, &end);
  if (errno || end == text || value < 0) {
    fprintf(stderr, "hoop-bench: bad size '%s'\n", text);
    exit(2);
  }
  switch (*end) {
  case 'k':
  case 'K': value *= 1024; break;
  case 'm':
  case 'M': value *= 1024 * 1024; break;
  case 'g':
  case 'G': value *= 1024.0 * 1024 * 1024; break;
  case '\0': break;
  default: fprintf(stderr, "hoop-bench: bad size suffix in '%s'\n", text); exit(2);
  }
  return (size_t)value;
}

static int parse_coll(const char *name, bench_coll *coll) {
  for (int i = 0; i < BENCH_COLLS; i++)
    if (strcmp(name, bench_coll_names[i]) == 0) {
      *coll = (bench_coll)i;
      return 0;
    }
  return -1;
}

static void list_sizes(bench_options *opt);

void bench_parse_options(int argc, char **argv, bench_options *opt) {
  static const struct option longs[] = {{"minbytes", required_argument, 0, 'b'},
                                        {"maxbytes", required_argument, 0, 'e'},
                                        {"stepfactor", required_argument, 0, 'f'},
                                        {"datatype", required_argument, 0, 'd'},
                                        {"op", required_argument, 0, 'o'},
                                        {"root", required_argument, 0, 'r'},
                                        {"iters", required_argument, 0, 'n'},
                                        {"warmup", required_argument, 0, 'w'},
                                        {"check", required_argument, 0, 'c'},
                                        {"inplace", no_argument, 0, 'i'},
                                        {"csv", required_argument, 0, 'C'},
                                        {"help", no_argument, 0, 'h'},
                                        {"budget", required_argument, 0, 't'},
                                        {"sizes", required_argument, 0, 's'},
                                        {"version", no_argument, 0, 'V'},
                                        {"register", no_argument, 0, 'R'},
                                        {"async", no_argument, 0, 'a'},
                                        {"device", no_argument, 0, 'D'},
                                        {"calls", required_argument, 0, 'k'},
                                        {0, 0, 0, 0}};
  *opt = (bench_options){.coll = BENCH_ALLREDUCE,
                         .min_bytes = 8,
                         .max_bytes = 64 << 20,
                         .factor = 2,
                         .dtype = HOOP_FLOAT32,
                         .op = HOOP_SUM,
                         .iters = 20,
                         .warmup = 5,
                         .check = 1,
                         .calls = 1};
  if (argc > 1 && argv[1][0] != '-') {
    if (parse_coll(argv[1], &opt->coll) != 0) {
      fprintf(stderr, "hoop-bench: unknown collective '%s'\n", argv[1]);
      usage(stderr);
      exit(2);
    }
    argv[1] = argv[0];
    argv++;
    argc--;
  }
  int c;
  while ((c = getopt_long(argc, argv, "b:e:f:d:o:r:n:w:c:t:s:k:aiRDhV", longs, NULL)) != -1) {
    switch (c) {
    case 'b': opt->min_bytes = parse_size(optarg); break;
    case 'e': opt->max_bytes = parse_size(optarg); break;
    case 'f': opt->factor = atof(optarg); break;
    case 'd':
      if (hoop_dtype_from_name(optarg, &opt->dtype) != 0) {
        fprintf(stderr, "hoop-bench: unknown datatype '%s'\n", optarg);
        exit(2);
      }
      break;
    case 'o':
      if (hoop_op_from_name(optarg, &opt->op) != 0) {
        fprintf(stderr, "hoop-bench: unknown op '%s'\n", optarg);
        exit(2);
      }
      break;
    case 'r': opt->root = atoi(optarg); break;
    case 'n': opt->iters = atoi(optarg); break;
    case 'w': opt->warmup = atoi(optarg); break;
    case 't': opt->budget_s = atof(optarg); break;
    case 's': opt->sizes = optarg; break;
    case 'c': opt->check = atoi(optarg); break;
    case 'i': opt->in_place = 1; break;
    case 'R': opt->register_buffers = 1; break;
    case 'a': opt->async = 1; break;
    case 'D': opt->device = 1; break;
    case 'k': opt->calls = atoi(optarg); break;
    case 'C': opt->csv_path = optarg; break;
    case 'h': usage(stdout); exit(0);
    case 'V': printf("hoop-bench (hoop) %s\n", PACKAGE_VERSION); exit(0);
    default: usage(stderr); exit(2);
    }
  }
  if (opt->calls < 1 || opt->calls > BENCH_MAX_ASYNC) {
    fprintf(stderr, "hoop-bench: --calls takes 1 to %d\n", BENCH_MAX_ASYNC);
    exit(2);
  }
  if (opt->factor <= 1 || opt->iters < 1 || opt->warmup < 0 || opt->min_bytes > opt->max_bytes) {
    fprintf(stderr, "hoop-bench: need factor > 1, iters >= 1, warmup >= 0, minbytes <= maxbytes\n");
    exit(2);
  }
  list_sizes(opt);
}

/* Fill opt->size_list from -s, or from the -b/-e/-f sweep; max_bytes becomes the largest. */
static void list_sizes(bench_options *opt) {
  opt->nsizes = 0;
  if (!opt->sizes) {
    for (double bytes = (double)opt->min_bytes;
         bytes <= (double)opt->max_bytes && opt->nsizes < BENCH_MAX_SIZES; bytes *= opt->factor)
      opt->size_list[opt->nsizes++] = (size_t)bytes;
    return;
  }
  char *copy = strdup(opt->sizes), *save = NULL;
  opt->max_bytes = 0;
  for (char *tok = strtok_r(copy, ",", &save); tok && opt->nsizes < BENCH_MAX_SIZES;
       tok = strtok_r(NULL, ",", &save)) {
    size_t bytes = parse_size(tok);
    opt->size_list[opt->nsizes++] = bytes;
    if (bytes > opt->max_bytes)
      opt->max_bytes = bytes;
  }
  free(copy);
}
