/* codec-speed - how fast one core encodes and decodes the wire formats of compressed reductions
 * (lib/mem/compress.c), in GB/s of float32 input or output (issue 54 asks for at least 4 GB/s per
 * core, so that the codec never limits a 10 Gbit/s link).
 *
 * For each format (bf16, fp8, int8), rounding to nearest and stochastically: encode (float32 in,
 * the piece out), encode with error feedback (the residual added, and what was dropped kept),
 * decode-and-add (a float32 sum += the piece's values) and decode (float32 out). The input is
 * normal random values with magnitudes spread over 2^-6..2^6, as the tests use, in pieces of
 * --elems elements (default 262144, a chunk of the exchange), each timed over --seconds (default
 * 0.5) and the best of --repeat runs (default 3) printed.
 *
 * --copy generic times the baseline copy of the codec, --copy avx2 the AVX2 one; by default the
 * one that hoop's calls take on this CPU (named in the first line).
 *
 * usage: codec-speed [--elems N] [--seconds S] [--repeat R] [--copy generic|avx2] */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "mem/compress.h"

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

enum { ENCODE, ENCODE_FEEDBACK, EXPAND_ADD, EXPAND, TASKS };
static const char *const task_names[TASKS] = {"encode", "encode+feedback", "decode-add", "decode"};

typedef struct codec {
  void (*compress)(int, void *, const void *, hoop_dtype, size_t, float *, hoop__rounding);
  void (*expand_add)(int, float *, const void *, size_t);
  void (*expand)(int, void *, hoop_dtype, const void *, size_t);
} codec;

static codec use = {hoop__compress, hoop__expand_add, hoop__expand};

typedef struct run {
  int format, task;
  size_t elems;
  const float *in;
  float *sum, *residual;
  void *piece;
} run;

static void once(const run *r, unsigned long step) {
  hoop__rounding rounding = {0, 0};
  if (r->format & HOOP_COMPRESS_STOCHASTIC)
    rounding = (hoop__rounding){step * 2 + 1, 0};
  switch (r->task) {
  case ENCODE:
    use.compress(r->format, r->piece, r->in, HOOP_FLOAT32, r->elems, NULL, rounding);
    break;
  case ENCODE_FEEDBACK:
    use.compress(r->format, r->piece, r->in, HOOP_FLOAT32, r->elems, r->residual, rounding);
    break;
  case EXPAND_ADD: use.expand_add(r->format, r->sum, r->piece, r->elems); break;
  default: use.expand(r->format, r->sum, HOOP_FLOAT32, r->piece, r->elems); break;
  }
}

/* GB/s of float32 values over seconds, the best of repeat. */
static double speed(const run *r, double seconds, int repeat) {
  double best = 0;
  for (int k = 0; k < repeat; k++) {
    unsigned long calls = 0;
    double start = now(), end;
    do {
      once(r, calls++);
    } while ((end = now()) - start < seconds);
    double rate = (double)calls * (double)r->elems * sizeof(float) / (end - start) * 1e-9;
    best = rate > best ? rate : best;
  }
  return best;
}

int main(int argc, char **argv) {
  size_t elems = 262144;
  double seconds = 0.5;
  int repeat = 3;
  static const struct option longs[] = {
      {"elems", required_argument, NULL, 'n'},  {"seconds", required_argument, NULL, 's'},
      {"repeat", required_argument, NULL, 'r'}, {"copy", required_argument, NULL, 'c'},
      {"help", no_argument, NULL, 'h'},         {NULL, 0, NULL, 0}};
  const char *copy = hoop__codec_name();
  for (int c; (c = getopt_long(argc, argv, "n:s:r:c:h", longs, NULL)) != -1;) {
    switch (c) {
    case 'n': elems = strtoull(optarg, NULL, 10); break;
    case 's': seconds = atof(optarg); break;
    case 'r': repeat = atoi(optarg); break;
    case 'c': copy = optarg; break;
    default:
      fprintf(stderr,
              "usage: codec-speed [--elems N] [--seconds S] [--repeat R] [--copy generic|avx2]\n");
      return c == 'h' ? 0 : 2;
    }
  }
  if (elems == 0 || seconds <= 0 || repeat < 1) {
    fprintf(stderr, "codec-speed: --elems, --seconds and --repeat must be positive\n");
    return 2;
  }
  if (strcmp(copy, "generic") == 0) {
    use = (codec){hoop__compress_generic, hoop__expand_add_generic, hoop__expand_generic};
#if HOOP__CODEC_AVX2
  } else if (strcmp(copy, "avx2") == 0 && __builtin_cpu_supports("avx2")) {
    use = (codec){hoop__compress_avx2, hoop__expand_add_avx2, hoop__expand_avx2};
#endif
  } else {
    fprintf(stderr, "codec-speed: --copy %s: not a copy of the codec this build and CPU run\n",
            copy);
    return 2;
  }
  float *in = malloc(elems * sizeof *in), *sum = calloc(elems, sizeof *sum);
  float *residual = calloc(elems, sizeof *residual);
  void *piece = malloc(elems * sizeof(float));
  if (!in || !sum || !residual || !piece) {
    fprintf(stderr, "codec-speed: out of memory\n");
    return 1;
  }
  srand(54);
  for (size_t i = 0; i < elems; i++) {
    double u = (rand() + 1.0) / ((double)RAND_MAX + 2.0),
           v = (rand() + 1.0) / ((double)RAND_MAX + 2.0);
    double normal = sqrt(-2 * log(u)) * cos(6.283185307179586 * v);
    in[i] = (float)(normal * ldexp(1.0, (int)(i / 997 % 13) - 6));
  }
  static const int formats[] = {HOOP_COMPRESS_BF16, HOOP_COMPRESS_FP8, HOOP_COMPRESS_INT8};
  printf(
      "# GB/s of float32 on one core (the %s copy), pieces of %zu elements, best of %d x %.2f s\n",
      copy, elems, repeat, seconds);
  printf("%-8s %-16s %9s %11s\n", "format", "step", "nearest", "stochastic");
  for (size_t f = 0; f < sizeof formats / sizeof *formats; f++)
    for (int task = 0; task < TASKS; task++) {
      double rate[2];
      for (int stochastic = 0; stochastic < 2; stochastic++) {
        run r = {formats[f] | (stochastic ? HOOP_COMPRESS_STOCHASTIC : 0),
                 task,
                 elems,
                 in,
                 sum,
                 residual,
                 piece};
        /* The decoders read a piece that an encode wrote. */
        use.compress(r.format, piece, in, HOOP_FLOAT32, elems, NULL, (hoop__rounding){1, 0});
        rate[stochastic] = task >= EXPAND_ADD && stochastic ? NAN : speed(&r, seconds, repeat);
      }
      char name[32];
      hoop_compress_name(formats[f], name, sizeof name);
      if (task >= EXPAND_ADD) /* decoding is the same whichever way the codes were rounded */
        printf("%-8s %-16s %9.2f %11s\n", name, task_names[task], rate[0], "-");
      else
        printf("%-8s %-16s %9.2f %11.2f\n", name, task_names[task], rate[0], rate[1]);
    }
  free(in);
  free(sum);
  free(residual);
  free(piece);
  return 0;
}
