/* repro_worker.c - reproducible mode checked bit for bit (tests/test_repro.sh runs it under hooprun
 * on many paths). Every rank makes every rank's input itself: random floats of mixed signs over
 * a wide range of exponents, whose sums and products round differently in every order. It runs
 * each reducing call (allreduce out of place and in place, iallreduce, allreduce_many fused over
 * uneven pieces, reduce-scatter out of place and in place, reduce to two roots) for float16,
 * bfloat16, float32, float64 and two integer types, every op, odd counts on both sides of the
 * algorithms' cut-overs; and compares each result's bytes (memcmp) with the fixed tree of
 * hoop(3), computed here without libhoop: with p the largest power of two <= the rank count n,
 * the first 2(n - p) ranks paired, then a perfect tree of adjacent pairs over the p leaves, lower
 * ranks on the left (recursive doubling's order); float16 and bfloat16 combined in float and
 * rounded back at every step; AVG the sum divided once at the end.
 *
 * usage: repro_worker [--quick] [--fake-hosts N] [--default] [--device | --stream]
 *   --device: every buffer a call gets is a device copy (HOOP_CUDA_LIBRARY's driver: a GPU, or
 *   the stand-in); --stream: the same, through the stream-ordered calls where they exist.
 *   --default: leave the communicator in its default mode; the results are still digested (and
 *   printed by rank 0) but not required to match the tree, so that test_repro.sh can show that
 *   the default mode's bits differ between paths while reproducible mode's do not.
 * Prints "repro_worker rank R: C checks, F failed, digest D"; exit 1 on a failure. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "devmem.h"
#include "floats.h"
#include "hoop.h"

static hoop_comm *comm;
static int rank, nranks, expect_tree = 1;
static size_t checks, failures;
static uint64_t digest = 1469598103934665603ull;

static void must(hoop_result result, const char *what) {
  if (result != HOOP_OK) {
    fprintf(stderr, "repro_worker rank %d: %s: %s: %s\n", rank, what, hoop_strerror(result),
            hoop_last_error(comm));
    exit(1);
  }
}

static void *xmalloc(size_t bytes) {
  void *p = malloc(bytes ? bytes : 1);
  if (!p) {
    fprintf(stderr, "repro_worker: out of memory\n");
    exit(1);
  }
  return p;
}

/* ---- values, without libhoop --------------------------------------------------------------- */

/* Rank r's element i: for sums and extremes a sign, a mantissa and an exponent over 2^-12..2^12
 * (2^-6..2^6 for the 16-bit types); for products 1 plus or minus up to 1/8, whose products over 8
 * ranks stay in range and still round. */
static double value(int r, size_t i, hoop_dtype dtype, hoop_op op, unsigned seed) {
  uint64_t h = mix(mix(mix(seed) ^ (uint64_t)r) ^ i) ^ (uint64_t)dtype << 8;
  double mant = 1.0 + (double)(h >> 11 & 0xfffff) / 1048576.0;
  int span = dtype == HOOP_FLOAT16 || dtype == HOOP_BFLOAT16 ? 6 : 12;
  int exp = (int)(h >> 40 & 0xff) % (2 * span + 1) - span;
  double sign = h >> 63 ? -1.0 : 1.0;
  if (op == HOOP_PROD)
    return 1.0 + sign * (mant - 1.0) / 8.0;
  /* mant * 2^exp, exactly (what ldexp gives, without its cost in the references' inner loop). */
  static const double pow2[25] = {0x1p-12, 0x1p-11, 0x1p-10, 0x1p-9, 0x1p-8, 0x1p-7, 0x1p-6,
                                  0x1p-5,  0x1p-4,  0x1p-3,  0x1p-2, 0x1p-1, 0x1p0,  0x1p1,
                                  0x1p2,   0x1p3,   0x1p4,   0x1p5,  0x1p6,  0x1p7,  0x1p8,
                                  0x1p9,   0x1p10,  0x1p11,  0x1p12};
  return sign * mant * pow2[exp + 12];
}

/* Rank r's element i, stored in dtype at dst[0]. */
static void element(void *dst, size_t i, hoop_dtype dtype, hoop_op op, int r, unsigned seed) {
  double v = value(r, i, dtype, op, seed);
  switch (dtype) {
  case HOOP_FLOAT16: *(uint16_t *)dst = float_to_half((float)v); break;
  case HOOP_BFLOAT16: *(uint16_t *)dst = float_to_bf16((float)v); break;
  case HOOP_FLOAT32: *(float *)dst = (float)v; break;
  case HOOP_FLOAT64: *(double *)dst = v; break;
  case HOOP_INT32: *(int32_t *)dst = (int32_t)(v * 1e5); break;
  case HOOP_INT64: *(int64_t *)dst = (int64_t)(v * 1e9) * 1000003; break;
  default: abort();
  }
}

static void fill(void *buf, size_t count, hoop_dtype dtype, hoop_op op, int r, unsigned seed) {
  size_t esize = hoop_dtype_size(dtype);
  for (size_t i = 0; i < count; i++)
    element((unsigned char *)buf + i * esize, i, dtype, op, r, seed);
}

/* ---- the tree of hoop(3), in the types it names ----------------------------------------------
 */

/* a op b as the element type computes it: float32 in float; float16 and bfloat16 in float and
 * rounded back to their type; float64 in double (each value held exactly in a double). */
static double combine_float(hoop_dtype dtype, hoop_op op, double a, double b) {
  if (dtype == HOOP_FLOAT64)
    return op == HOOP_PROD  ? a * b
           : op == HOOP_MIN ? (a < b ? a : b)
           : op == HOOP_MAX ? (a > b ? a : b)
                            : a + b;
  float x = (float)a, y = (float)b;
  float r = op == HOOP_PROD  ? x * y
            : op == HOOP_MIN ? (x < y ? x : y)
            : op == HOOP_MAX ? (x > y ? x : y)
                             : x + y;
  if (dtype == HOOP_FLOAT16)
    r = half_to_float(float_to_half(r));
  else if (dtype == HOOP_BFLOAT16)
    r = bf16_to_float(float_to_bf16(r));
  return r;
}

/* Integers wrap: combined as unsigned 64-bit and truncated to the type. */
static int64_t combine_int(int bits, hoop_op op, int64_t a, int64_t b) {
  if (op == HOOP_MIN || op == HOOP_MAX)
    return op == HOOP_MIN ? (a < b ? a : b) : (a > b ? a : b);
  uint64_t u = op == HOOP_PROD ? (uint64_t)a * (uint64_t)b : (uint64_t)a + (uint64_t)b;
  return bits == 32 ? (int64_t)(int32_t)(uint32_t)u : (int64_t)u;
}

/* The tree bottom up, in place over x[0..n): with p the largest power of two <= n and rem = n - p,
 * leaf v is x[2v] op x[2v+1] for v < rem and x[v + rem] after; then adjacent leaves, pairs of
 * them, and so on; the lower ranks' operand always on the left. */
#define TREE(x, n, COMBINE)                                                                        \
  do {                                                                                             \
    int p_ = 1;                                                                                    \
    while (p_ * 2 <= (n))                                                                          \
      p_ *= 2;                                                                                     \
    int rem_ = (n)-p_;                                                                             \
    for (int v_ = 0; v_ < p_; v_++)                                                                \
      x[v_] = v_ < rem_ ? COMBINE(x[2 * v_], x[2 * v_ + 1]) : x[v_ + rem_];                        \
    for (int w_ = 1; w_ < p_; w_ *= 2)                                                             \
      for (int v_ = 0; v_ < p_; v_ += 2 * w_)                                                      \
        x[v_] = COMBINE(x[v_], x[v_ + w_]);                                                        \
  } while (0)

/* The expected bytes of elements [first, first + count) of the reduction of every rank's input
 * (each rank's element i made as fill makes it, for those elements only). */
static void expected(void *out, size_t first, size_t count, hoop_dtype dtype, hoop_op op,
                     unsigned seed) {
  size_t esize = hoop_dtype_size(dtype);
  double fl[256];
  int64_t il[256];
  int bits = dtype == HOOP_INT32 ? 32 : 64;
  for (size_t i = first; i < first + count; i++) {
    for (int r = 0; r < nranks; r++) {
      unsigned char at[8];
      element(at, i, dtype, op, r, seed);
      switch (dtype) {
      case HOOP_FLOAT16: fl[r] = half_to_float(*(const uint16_t *)at); break;
      case HOOP_BFLOAT16: fl[r] = bf16_to_float(*(const uint16_t *)at); break;
      case HOOP_FLOAT32: fl[r] = *(const float *)at; break;
      case HOOP_FLOAT64: fl[r] = *(const double *)at; break;
      case HOOP_INT32: il[r] = *(const int32_t *)at; break;
      case HOOP_INT64: il[r] = *(const int64_t *)at; break;
      default: abort();
      }
    }
    unsigned char *dst = (unsigned char *)out + (i - first) * esize;
    if (dtype == HOOP_INT32 || dtype == HOOP_INT64) {
#define INT_COMBINE(a, b) combine_int(bits, op, a, b)
      TREE(il, nranks, INT_COMBINE);
      int64_t v = il[0];
      if (op == HOOP_AVG)
        v /= nranks; /* the sum wrapped to the type, divided toward zero */
      int32_t w = (int32_t)v;
      memcpy(dst, bits == 32 ? (const void *)&w : (const void *)&v, esize);
      continue;
    }
#define FLOAT_COMBINE(a, b) combine_float(dtype, op, a, b)
    TREE(fl, nranks, FLOAT_COMBINE);
    double v = fl[0];
    /* AVG: the sum divided once, in float (the 16-bit types rounded once more) or double. */
    if (op == HOOP_AVG)
      v = dtype == HOOP_FLOAT64 ? v / (double)nranks : (double)((float)v / (float)nranks);
    if (dtype == HOOP_FLOAT64) {
      memcpy(dst, &v, 8);
    } else if (dtype == HOOP_FLOAT32) {
      float f = (float)v;
      memcpy(dst, &f, 4);
    } else {
      uint16_t h = dtype == HOOP_FLOAT16 ? float_to_half((float)v) : float_to_bf16((float)v);
      memcpy(dst, &h, 2);
    }
  }
}

/* ---- the checks ------------------------------------------------------------------------------
 */

static void compare(const char *what, const void *got, size_t first, size_t count, size_t total,
                    hoop_dtype dtype, hoop_op op, unsigned seed) {
  size_t esize = hoop_dtype_size(dtype);
  for (size_t i = 0; i < count * esize; i++)
    digest = (digest ^ ((const unsigned char *)got)[i]) * 1099511628211ull;
  checks++;
  if (!expect_tree)
    return;
  /* The calls of one dtype and op in a row (out of place, in place, non-blocking, fused, reduce)
   * expect the same bytes: those of the last compare are kept and reused. */
  static unsigned char *want;
  static size_t want_first, want_count;
  static hoop_dtype want_dtype;
  static hoop_op want_op;
  static unsigned want_seed;
  if (!want || want_first != first || want_count != count || want_dtype != dtype || want_op != op ||
      want_seed != seed) {
    free(want);
    want = xmalloc(count * esize);
    expected(want, first, count, dtype, op, seed);
    want_first = first, want_count = count, want_dtype = dtype, want_op = op, want_seed = seed;
  }
  if (memcmp(want, got, count * esize) != 0) {
    size_t i = 0;
    while (memcmp((const unsigned char *)want + i * esize, (const unsigned char *)got + i * esize,
                  esize) == 0)
      i++;
    uint64_t w = 0, g = 0;
    memcpy(&w, (const unsigned char *)want + i * esize, esize);
    memcpy(&g, (const unsigned char *)got + i * esize, esize);
    if (failures++ < 10)
      fprintf(stderr,
              "repro_worker rank %d of %d: %s count %zu %s %s: element %zu is 0x%llx, the tree "
              "gives 0x%llx\n",
              rank, nranks, what, total, hoop_dtype_name(dtype), hoop_op_name(op), first + i,
              (unsigned long long)g, (unsigned long long)w);
  }
}

/* --device: the calls' buffers are device copies (tests/support/devmem.h), with --stream the
 * stream-ordered forms where there are some. */
static int device;
static void *stream;

static void *dev(const void *host, size_t bytes) {
  return device ? devmem_put(host, bytes) : (void *)host;
}
/* The call's buffer back into host (when it was a device copy, freed). */
static void back(void *host, void *used, size_t bytes) {
  if (used != host) {
    devmem_get(host, used, bytes);
    devmem_free(used);
  }
}
static void drop(const void *host, void *used) {
  if (used != host)
    devmem_free(used);
}

static hoop_result allreduce(const void *in, void *out, size_t count, hoop_dtype dtype,
                             hoop_op op) {
  return stream ? hoop_allreduce_stream(comm, in, out, count, dtype, op, stream)
                : hoop_allreduce(comm, in, out, count, dtype, op);
}

static void check(size_t count, hoop_dtype dtype, hoop_op op, unsigned seed) {
  size_t esize = hoop_dtype_size(dtype), bytes = count * esize;
  unsigned char *in = xmalloc(bytes), *out = xmalloc(bytes);
  fill(in, count, dtype, op, rank, seed);

  void *din = dev(in, bytes), *dout = dev(out, bytes);
  must(allreduce(din, dout, count, dtype, op), "hoop_allreduce");
  back(out, dout, bytes);
  compare("allreduce", out, 0, count, count, dtype, op, seed);
  memcpy(out, in, bytes);
  dout = dev(out, bytes);
  must(allreduce(dout, dout, count, dtype, op), "hoop_allreduce in place");
  back(out, dout, bytes);
  compare("allreduce in place", out, 0, count, count, dtype, op, seed);

  hoop_request *req;
  dout = dev(out, bytes);
  must(hoop_iallreduce(comm, din, dout, count, dtype, op, &req), "hoop_iallreduce");
  must(hoop_wait(req), "hoop_wait");
  back(out, dout, bytes);
  compare("iallreduce", out, 0, count, count, dtype, op, seed);

  /* Fused: three uneven pieces, the middle one in place. */
  size_t c0 = count / 3, c1 = count / 2 - count / 3, c2 = count - c0 - c1;
  unsigned char *mid = xmalloc(c1 * esize);
  memcpy(mid, in + c0 * esize, c1 * esize);
  dout = dev(out, bytes);
  void *dmid = dev(mid, c1 * esize);
  const void *sends[3] = {din, dmid, (char *)din + (c0 + c1) * esize};
  void *recvs[3] = {dout, dmid, (char *)dout + (c0 + c1) * esize};
  size_t counts[3] = {c0, c1, c2};
  must(hoop_allreduce_many(comm, 3, sends, recvs, counts, dtype, op), "hoop_allreduce_many");
  back(out, dout, bytes);
  back(mid, dmid, c1 * esize);
  memcpy(out + c0 * esize, mid, c1 * esize);
  compare("allreduce_many", out, 0, count, count, dtype, op, seed);
  free(mid);

  /* Reduce-scatter of nranks blocks of count / nranks + 1 elements. */
  size_t block = count / (size_t)nranks + 1, total = block * (size_t)nranks;
  unsigned char *rs_in = xmalloc(total * esize), *rs_out = xmalloc(block * esize);
  fill(rs_in, total, dtype, op, rank, seed + 1);
  void *drs_in = dev(rs_in, total * esize), *drs_out = dev(rs_out, block * esize);
  must(stream ? hoop_reduce_scatter_stream(comm, drs_in, drs_out, block, dtype, op, stream)
              : hoop_reduce_scatter(comm, drs_in, drs_out, block, dtype, op),
       "hoop_reduce_scatter");
  back(rs_out, drs_out, block * esize);
  compare("reduce_scatter", rs_out, (size_t)rank * block, block, total, dtype, op, seed + 1);
  size_t mine = (size_t)rank * block * esize;
  must(hoop_reduce_scatter(comm, drs_in, (char *)drs_in + mine, block, dtype, op),
       "hoop_reduce_scatter in place");
  back(rs_in, drs_in, total * esize);
  compare("reduce_scatter in place", rs_in + mine, (size_t)rank * block, block, total, dtype, op,
          seed + 1);
  free(rs_in);
  free(rs_out);

  /* Reduce to the last rank out of place, to rank 0 in place. */
  int root = nranks - 1;
  dout = dev(out, bytes);
  must(stream ? hoop_reduce_stream(comm, din, rank == root ? dout : NULL, count, dtype, op, root,
                                   stream)
              : hoop_reduce(comm, din, rank == root ? dout : NULL, count, dtype, op, root),
       "hoop_reduce");
  back(out, dout, bytes);
  if (rank == root)
    compare("reduce", out, 0, count, count, dtype, op, seed);
  drop(in, din);
  memcpy(out, in, bytes);
  dout = dev(out, bytes);
  must(hoop_reduce(comm, dout, rank == 0 ? dout : NULL, count, dtype, op, 0),
       "hoop_reduce in place");
  back(out, dout, bytes);
  if (rank == 0)
    compare("reduce in place", out, 0, count, count, dtype, op, seed);
  free(in);
  free(out);
}

int main(int argc, char **argv) {
  int quick = 0;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--quick") == 0)
      quick = 1;
    else if (strcmp(argv[i], "--default") == 0)
      expect_tree = 0;
    else if (strcmp(argv[i], "--device") == 0)
      device = 1;
    else if (strcmp(argv[i], "--stream") == 0)
      device = 2;
    else if (strcmp(argv[i], "--fake-hosts") == 0 && i + 1 < argc) {
      int per_host = atoi(argv[++i]);
      const char *mine = getenv("HOOP_RANK");
      char name[64];
      snprintf(name, sizeof name, "fake-host-%d",
               (mine ? atoi(mine) : 0) / (per_host ? per_host : 1));
      setenv("HOOP_HOSTNAME", name, 1);
    }
  }
  if (device) {
    char why[256];
    if (devmem_init(why, sizeof why) != 0) {
      fprintf(stderr, "repro_worker: --device: %s\n", why);
      return 1;
    }
    if (device == 2)
      stream = devmem_stream();
  }
  must(hoop_init_from_env(&comm), "hoop_init_from_env");
  rank = hoop_rank(comm);
  nranks = hoop_size(comm);
  if (nranks > 256) {
    fprintf(stderr, "repro_worker: at most 256 ranks\n");
    return 1;
  }
  must(hoop_comm_set_reproducible(comm, expect_tree), "hoop_comm_set_reproducible");
  if (hoop_comm_reproducible(comm) != expect_tree) {
    fprintf(stderr, "repro_worker rank %d: hoop_comm_reproducible says %d\n", rank,
            hoop_comm_reproducible(comm));
    return 1;
  }
  /* Both sides of the small calls' cut-overs and of the board's slot; a count that several
   * chunks of 4 KiB cut unevenly. */
  static const size_t counts[] = {1, 7, 1001, 6007, 70001};
  static const hoop_dtype dtypes[] = {HOOP_FLOAT32, HOOP_FLOAT64, HOOP_BFLOAT16,
                                      HOOP_FLOAT16, HOOP_INT32,   HOOP_INT64};
  static const hoop_op ops[] = {HOOP_SUM, HOOP_AVG, HOOP_PROD, HOOP_MIN, HOOP_MAX};
  unsigned seed = 17;
  for (size_t d = 0; d < sizeof dtypes / sizeof dtypes[0]; d++)
    for (size_t o = 0; o < sizeof ops / sizeof ops[0]; o++)
      for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++) {
        int floating = dtypes[d] != HOOP_INT32 && dtypes[d] != HOOP_INT64;
        /* The large count for the sums of every float type, once per other case. */
        if (counts[c] == 70001 &&
            (quick || (ops[o] != HOOP_SUM && ops[o] != HOOP_AVG) || !floating))
          continue;
        check(counts[c], dtypes[d], ops[o], seed++);
      }
  /* The mode turned off and on again between calls of one size: each call takes the mode it is
   * made in, not the algorithm chosen for the size before (the tuning table's last choice). */
  if (expect_tree) {
    size_t count = 30011;
    float *in = xmalloc(count * sizeof *in), *out = xmalloc(count * sizeof *out);
    fill(in, count, HOOP_FLOAT32, HOOP_SUM, rank, seed);
    must(hoop_comm_set_reproducible(comm, 0), "hoop_comm_set_reproducible 0");
    must(hoop_allreduce(comm, in, out, count, HOOP_FLOAT32, HOOP_SUM), "hoop_allreduce (off)");
    must(hoop_comm_set_reproducible(comm, 1), "hoop_comm_set_reproducible 1");
    must(hoop_allreduce(comm, in, out, count, HOOP_FLOAT32, HOOP_SUM), "hoop_allreduce (on)");
    compare("allreduce after the mode went off and on", out, 0, count, count, HOOP_FLOAT32,
            HOOP_SUM, seed);
    free(in);
    free(out);
  }
  printf("repro_worker rank %d: %zu checks, %zu failed, digest %016llx\n", rank, checks, failures,
         (unsigned long long)digest);
  hoop_finalize(comm);
  return failures ? 1 : 0;
}
