/* test_cuda_kernels.c - the GPU reduction kernels (lib/mem/cuda/kernels.cu) against the host's
 * (lib/mem/reduce.c), element by element, for every dtype and op and AVG's division, the
 * many-source kernel against reduce.c's chain on 1 to 8 sources, and the codec's kernels against
 * lib/mem/compress.c (pieces, residuals and decoded values, every format and rounding): random bit
 * patterns (NaN, infinities, subnormals and signed zeros among them for the floating types;
 * wraparound for the integers), the values where float16 and bfloat16 rounding ties, aligned
 * buffers (16-byte vector loads) and misaligned ones (the scalar path), out of place and in place
 * on either operand.
 *
 * Results must be the same bits, with one exception the GPU imposes: a NaN that sum, prod or the
 * division produces is the GPU's canonical NaN, not the host's propagated payload, so there both
 * must be NaN. On a GPU by default; exits 77 (skipped) where there is none, or in a build without
 * kernels. Given the stand-in driver (HOOP_CUDA_LIBRARY=tests/.libs/libfakecuda.so, as
 * tests/test_cuda.sh runs it in CI) it checks kernels.cu's own code compiled for the CPU
 * (tests/support/fakecuda/kernels_host.cc), launched as hoop launches it: everything but the
 * GPU's arithmetic.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"
#include "mem/compress.h"
#include "mem/cuda.h"
#include "mem/reduce.h"
#include "support/devmem.h"

static size_t checks, failures;

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t next_random(void) {
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return rng_state;
}

static int is_nan(const void *p, hoop_dtype dtype) {
  uint64_t bits = 0;
  switch (dtype) {
  case HOOP_FLOAT16: memcpy(&bits, p, 2); return (bits & 0x7c00) == 0x7c00 && (bits & 0x3ff);
  case HOOP_BFLOAT16: memcpy(&bits, p, 2); return (bits & 0x7f80) == 0x7f80 && (bits & 0x7f);
  case HOOP_FLOAT32: {
    float f;
    memcpy(&f, p, 4);
    return isnan(f);
  }
  case HOOP_FLOAT64: {
    double d;
    memcpy(&d, p, 8);
    return isnan(d);
  }
  default: return 0;
  }
}

/* Inputs: random bits, with every 8th element a value of interest for the dtype. */
static void fill(unsigned char *buf, size_t n, hoop_dtype dtype, int which) {
  size_t esize = hoop_dtype_size(dtype);
  static const uint16_t half_specials[] = {0x0000, 0x8000, 0x0001, 0x8001, 0x03ff, 0x0400,
                                           0x7bff, 0x7c00, 0xfc00, 0x7e00, 0x7c01, 0x3c00,
                                           0x3c01, 0xbc00, 0x0200, 0x5bff};
  static const uint16_t bf16_specials[] = {0x0000, 0x8000, 0x0001, 0x807f, 0x0080, 0x7f7f,
                                           0x7f80, 0xff80, 0x7fc0, 0x7f81, 0x3f80, 0x3f81,
                                           0xbf80, 0x4b00, 0x3401, 0x7f00};
  static const float float_specials[] = {
      0.0f, -0.0f, 1e-45f, -1e-45f,       1.17e-38f, INFINITY, -INFINITY, NAN,
      -NAN, 1.0f,  -1.0f,  3.4028235e38f, 0.5f,      16777217, 1e-40f,    2.0f};
  for (size_t i = 0; i < n; i++) {
    uint64_t r = next_random();
    unsigned char *cell = buf + i * esize;
    memcpy(cell, &r, esize);
    if (dtype == HOOP_BOOL) /* as many false as true, and some true bytes other than 1 */
      *cell = (unsigned char)((r >> 8) % 2 ? (r >> 16) % 4 : 0);
    if (i % 8 != 0)
      continue;
    size_t k = (i / 8 + (size_t)which * 5) % 16;
    switch (dtype) {
    case HOOP_BOOL: *cell = (unsigned char)(k % 3); break; /* false, true, and 2 (true) */
    case HOOP_FLOAT16: memcpy(cell, &half_specials[k], 2); break;
    case HOOP_BFLOAT16: memcpy(cell, &bf16_specials[k], 2); break;
    case HOOP_FLOAT32: memcpy(cell, &float_specials[k], 4); break;
    case HOOP_FLOAT64: {
      double d = (double)float_specials[k] * (k % 3 ? 1.0 : 1e-300);
      memcpy(cell, &d, 8);
      break;
    }
    default: /* the extremes, for wraparound */
      memset(cell, k % 2 ? 0xff : 0x00, esize);
      cell[esize - 1] = k % 4 < 2 ? 0x7f : 0x80;
    }
  }
}

static int same(const unsigned char *host, const unsigned char *dev, size_t n, hoop_dtype dtype,
                hoop_op op, size_t *where) {
  size_t esize = hoop_dtype_size(dtype);
  int nan_relaxed = op == HOOP_SUM || op == HOOP_PROD || op == HOOP_AVG;
  for (size_t i = 0; i < n; i++) {
    const unsigned char *h = host + i * esize, *d = dev + i * esize;
    if (memcmp(h, d, esize) == 0)
      continue;
    if (nan_relaxed && is_nan(h, dtype) && is_nan(d, dtype))
      continue;
    *where = i;
    return 0;
  }
  return 1;
}

static void hex(char *out, const unsigned char *cell, size_t esize) {
  for (size_t b = esize; b-- > 0;)
    out += sprintf(out, "%02x", cell[b]);
}

/* One case: n elements from element off of each buffer (1: misaligned for the vector loads);
 * alias 0 writes a third buffer, 1 writes over a, 2 over b. */
static void run_case(hoop_comm *comm, hoop_dtype dtype, hoop_op op, size_t n, size_t off,
                     int alias) {
  size_t esize = hoop_dtype_size(dtype), bytes = (n + 2) * esize;
  unsigned char *a = calloc(1, bytes), *b = calloc(1, bytes), *host = calloc(1, bytes),
                *back = calloc(1, bytes);
  fill(a + off * esize, n, dtype, 0);
  fill(b + off * esize, n, dtype, 1);
  unsigned char *da = devmem_put(a, bytes), *db = devmem_put(b, bytes);
  unsigned char *ddst = alias ? NULL : devmem_put(NULL, bytes);
  unsigned char *ha = a + off * esize, *hb = b + off * esize;
  /* The host's answer (elementwise, so the same whatever the aliasing). */
  unsigned char *hdst = host + off * esize;
  hoop__reduce3(hdst, ha, hb, n, dtype, op);
  unsigned char *dst = alias == 1 ? da : alias == 2 ? db : ddst;
  /* The kernels run on hoop's stream, which waits for nothing of the legacy default stream, where
   * the uploads may still be going on (the collectives wait for it before they launch). */
  devmem_sync();
  hoop_result result =
      hoop__cuda_reduce3(comm, dst + off * esize, da + off * esize, db + off * esize, n, dtype, op);
  if (result == HOOP_OK && op == HOOP_AVG) {
    hoop__reduce_finish(hdst, n, dtype, op, 3);
    result = hoop__cuda_reduce_finish(comm, dst + off * esize, n, dtype, op, 3);
  }
  checks++;
  if (result != HOOP_OK) {
    failures++;
    printf("FAIL: %s %s n %zu: %s\n", hoop_dtype_name(dtype), hoop_op_name(op), n,
           hoop_last_error(comm));
  } else {
    devmem_get(back, dst, bytes);
    size_t where = 0;
    if (!same(hdst, back + off * esize, n, dtype, op, &where)) {
      failures++;
      char hs[20], ds[20], as[20], bs[20];
      hex(hs, hdst + where * esize, esize);
      hex(ds, back + (off + where) * esize, esize);
      hex(as, ha + where * esize, esize);
      hex(bs, hb + where * esize, esize);
      printf("FAIL: %s %s n %zu offset %zu alias %d: element %zu: %s op %s: host %s, GPU %s\n",
             hoop_dtype_name(dtype), hoop_op_name(op), n, off, alias, where, as, bs, hs, ds);
    }
  }
  devmem_free(da);
  devmem_free(db);
  if (ddst)
    devmem_free(ddst);
  free(a);
  free(b);
  free(host);
  free(back);
}

/* The many-source kernel: nsrcs inputs of n elements from element off, reduced in order (AVG
 * divided by the rank count in the last pass) into a buffer of its own (over -1) or over input
 * `over`, against the host's chain of reduce.c calls. split > 0 reduces them as the CUDA IPC
 * allreduce does past HOOP__CUDA_MANY_MAX ranks: the first split inputs in one pass, then the
 * partial result and the rest in a second. split -1: the tree kernel (reproducible mode's, against
 * reduce.c's hoop__reduce_fixed). */
static void run_many_case(hoop_comm *comm, hoop_dtype dtype, hoop_op op, size_t n, size_t off,
                          int nsrcs, int over, int split) {
  enum { MAXSRC = 2 * HOOP__CUDA_MANY_MAX };
  size_t esize = hoop_dtype_size(dtype), bytes = (n + 2) * esize;
  unsigned char *in[MAXSRC], *din[MAXSRC];
  const void *srcs[MAXSRC];
  unsigned char *host = calloc(1, bytes), *back = calloc(1, bytes);
  for (int j = 0; j < nsrcs; j++) {
    in[j] = calloc(1, bytes);
    fill(in[j] + off * esize, n, dtype, j);
    din[j] = devmem_put(in[j], bytes);
    srcs[j] = din[j] + off * esize;
  }
  unsigned char *hdst = host + off * esize;
  if (split < 0) {
    const void *hsrcs[MAXSRC];
    for (int j = 0; j < nsrcs; j++)
      hsrcs[j] = in[j] + off * esize;
    hoop__reduce_fixed(hdst, hsrcs, nsrcs, n, dtype, op);
  } else {
    memcpy(hdst, in[0] + off * esize, n * esize);
    for (int j = 1; j < nsrcs; j++)
      hoop__reduce(hdst, in[j] + off * esize, n, dtype, op);
    hoop__reduce_finish(hdst, n, dtype, op, nsrcs);
  }
  unsigned char *ddst = over < 0 ? devmem_put(NULL, bytes) : NULL;
  devmem_sync();
  unsigned char *dst = ddst ? ddst : din[over];
  int divide = op == HOOP_AVG ? nsrcs : 0;
  hoop_result result;
  if (split < 0) {
    result =
        hoop__cuda_reduce_tree_async(comm, dst + off * esize, srcs, nsrcs, n, dtype, op, divide);
  } else if (split > 0) {
    result = hoop__cuda_reduce_many_async(comm, dst + off * esize, srcs, split, n, dtype, op, 0);
    const void *rest[HOOP__CUDA_MANY_MAX] = {dst + off * esize};
    for (int j = split; j < nsrcs; j++)
      rest[1 + j - split] = srcs[j];
    if (result == HOOP_OK)
      result = hoop__cuda_reduce_many_async(comm, dst + off * esize, rest, 1 + nsrcs - split, n,
                                            dtype, op, divide);
  } else {
    result =
        hoop__cuda_reduce_many_async(comm, dst + off * esize, srcs, nsrcs, n, dtype, op, divide);
  }
  if (result == HOOP_OK)
    result = hoop__cuda_sync(comm, dst);
  checks++;
  size_t where = 0;
  if (result != HOOP_OK) {
    failures++;
    printf("FAIL: many %s %s n %zu: %s\n", hoop_dtype_name(dtype), hoop_op_name(op), n,
           hoop_last_error(comm));
  } else {
    devmem_get(back, dst, bytes);
    if (!same(hdst, back + off * esize, n, dtype, op, &where)) {
      failures++;
      char hs[20], ds[20];
      hex(hs, hdst + where * esize, esize);
      hex(ds, back + (off + where) * esize, esize);
      printf("FAIL: %s %s %s, %d sources (split %d), n %zu offset %zu over %d: element %zu: "
             "host %s, GPU %s\n",
             split < 0 ? "tree" : "many", hoop_dtype_name(dtype), hoop_op_name(op), nsrcs, split, n,
             off, over, where, hs, ds);
    }
  }
  for (int j = 0; j < nsrcs; j++) {
    devmem_free(din[j]);
    free(in[j]);
  }
  if (ddst)
    devmem_free(ddst);
  free(host);
  free(back);
}

/* ---- the codec kernels against lib/mem/compress.c ------------------------------------------ */

/* Codec inputs: values spread over magnitudes 2^-20..2^6 with either sign, some blocks of one
 * magnitude, zeros, NaN, infinities and subnormals at places of interest, in dtype. */
static void fill_codec(unsigned char *buf, size_t n, hoop_dtype dtype, int which) {
  static const float specials[] = {0.0f,   -0.0f,  1e-45f, INFINITY,  -INFINITY,  NAN,
                                   448.0f, -3e38f, 1e-39f, 0.015625f, 0.0078125f, 127.5f};
  float *x = calloc(n ? n : 1, sizeof *x);
  for (size_t i = 0; i < n; i++) {
    uint64_t r = next_random();
    double mag = ldexp((double)(r & 0xffff) / 65536.0 + 0.5, (int)((r >> 16) % 27) - 20);
    /* Block 3 of every 8 holds values of one magnitude; block 5, one special in its middle. */
    size_t block = i / HOOP_COMPRESS_BLOCK;
    if (block % 8 == 3)
      mag = ldexp((double)(r & 0xffff) / 65536.0 + 0.5, -3);
    x[i] = (float)(r >> 40 & 1 ? -mag : mag);
    if (block % 8 == 5 && i % HOOP_COMPRESS_BLOCK == 64)
      x[i] = specials[(block / 8 + (size_t)which) % (sizeof specials / sizeof specials[0])];
  }
  hoop__from_float(buf, x, dtype, n);
  free(x);
}

static void codec_fail(const char *what, int format, hoop_dtype dtype, size_t n, int feedback,
                       size_t where) {
  failures++;
  printf("FAIL: codec %s, format %#x, %s, n %zu%s: differs at byte or element %zu\n", what,
         (unsigned)format, hoop_dtype_name(dtype), n, feedback ? ", feedback" : "", where);
}

/* One codec case: n elements of dtype encoded (twice with feedback: the second step adds what the
 * first dropped) by the kernels and by compress.c; the pieces, residuals, decoded values (dtype),
 * a float32 decode-add, that decode-add's sums narrowed to dtype and the input widened to float32
 * must be the same bits. */
static void run_codec_case(hoop_comm *comm, int format, hoop_dtype dtype, size_t n, int feedback) {
  size_t esize = hoop_dtype_size(dtype), piece_bytes = hoop__compress_bytes(format, n);
  unsigned char *in = calloc(1, n * esize + 1), *piece = calloc(1, piece_bytes + 1),
                *back = calloc(1, piece_bytes + n * esize + n * sizeof(float) + 1);
  float *kept = calloc(n + 1, sizeof *kept), *acc = calloc(n + 1, sizeof *acc),
        *dacc_back = calloc(n + 1, sizeof *dacc_back);
  unsigned char *out = calloc(1, n * esize + 1);
  fill_codec(in, n, dtype, (int)n);
  for (size_t i = 0; i < n; i++)
    acc[i] = (float)(i % 7) - 3.25f;
  unsigned char *din = devmem_put(in, n * esize + 1), *dpiece = devmem_put(NULL, piece_bytes + 1);
  unsigned char *dout = devmem_put(NULL, n * esize + 1), *dnarrow = devmem_put(NULL, n * esize + 1);
  float *dkept = feedback ? devmem_put(kept, (n + 1) * sizeof *kept) : NULL;
  float *dacc = devmem_put(acc, (n + 1) * sizeof *acc), *dwide = devmem_put(NULL, n * sizeof *acc);
  devmem_sync();
  hoop_result result = HOOP_OK;
  for (int step = 0; step < (feedback ? 2 : 1) && result == HOOP_OK; step++) {
    uint64_t seed =
        format & HOOP_COMPRESS_STOCHASTIC ? 0x9e3779b97f4a7c15ull * (uint64_t)(step + 1) : 0;
    uint64_t first = (uint64_t)step * 1000003u + 0xfffff000u; /* the index wraps past 2^32 */
    hoop__compress(format, piece, in, dtype, n, feedback ? kept : NULL,
                   (hoop__rounding){seed, first});
    result = hoop__cuda_compress_async(comm, format, dpiece, din, dtype, n, dkept, seed, first);
  }
  hoop__expand(format, out, dtype, piece, n);
  hoop__expand_add(format, acc, piece, n);
  if (result == HOOP_OK)
    result = hoop__cuda_expand_async(comm, format, dout, dtype, dpiece, n);
  if (result == HOOP_OK)
    result = hoop__cuda_expand_add_async(comm, format, dacc, dpiece, n);
  if (result == HOOP_OK)
    result = hoop__cuda_widen_async(comm, dwide, din, dtype, n);
  if (result == HOOP_OK)
    result = hoop__cuda_narrow_async(comm, dnarrow, dtype, dacc, n);
  if (result == HOOP_OK)
    result = hoop__cuda_sync(comm, dpiece);
  checks++;
  size_t where = 0;
  if (result != HOOP_OK) {
    failures++;
    printf("FAIL: codec format %#x %s n %zu: %s\n", (unsigned)format, hoop_dtype_name(dtype), n,
           hoop_last_error(comm));
  } else {
    /* bf16 codes that are both NaN (the GPU's sums make the canonical NaN) count as the same;
     * fp8 and int8 pieces (their scales and codes) must be the same bytes. */
    devmem_get(back, dpiece, piece_bytes);
    int bf16 = (format & 0xff) == HOOP_COMPRESS_BF16;
    if (!same(piece, back, bf16 ? n : piece_bytes, bf16 ? HOOP_BFLOAT16 : HOOP_UINT8, HOOP_SUM,
              &where))
      codec_fail("piece", format, dtype, n, feedback, where);
    devmem_get(back, dout, n * esize);
    if (!same(out, back, n, dtype, HOOP_SUM, &where))
      codec_fail("decode", format, dtype, n, feedback, where);
    devmem_get(dacc_back, dacc, n * sizeof *acc);
    if (!same((unsigned char *)acc, (unsigned char *)dacc_back, n, HOOP_FLOAT32, HOOP_SUM, &where))
      codec_fail("decode-add", format, dtype, n, feedback, where);
    hoop__from_float(out, acc, dtype, n);
    devmem_get(back, dnarrow, n * esize);
    if (!same(out, back, n, dtype, HOOP_SUM, &where))
      codec_fail("narrow", format, dtype, n, feedback, where);
    hoop__to_float(acc, in, dtype, n);
    devmem_get(dacc_back, dwide, n * sizeof *acc);
    if (!same((unsigned char *)acc, (unsigned char *)dacc_back, n, HOOP_FLOAT32, HOOP_SUM, &where))
      codec_fail("widen", format, dtype, n, feedback, where);
    if (feedback) {
      devmem_get(dacc_back, dkept, n * sizeof *kept);
      if (!same((unsigned char *)kept, (unsigned char *)dacc_back, n, HOOP_FLOAT32, HOOP_SUM,
                &where))
        codec_fail("residual", format, dtype, n, feedback, where);
    }
  }
  devmem_free(din);
  devmem_free(dpiece);
  devmem_free(dout);
  devmem_free(dacc);
  devmem_free(dwide);
  devmem_free(dnarrow);
  if (dkept)
    devmem_free(dkept);
  free(in);
  free(piece);
  free(back);
  free(kept);
  free(acc);
  free(dacc_back);
  free(out);
}

int main(void) {
  char why[256];
  if (!hoop__cuda_kernels_built()) {
    printf("SKIP: this libhoop has no GPU kernels (configure found no nvcc)\n");
    return 77;
  }
  if (devmem_init(why, sizeof why) != 0) {
    printf("SKIP: no GPU: %s\n", why);
    return 77;
  }
  hoop_comm *comm = calloc(1, sizeof *comm);
  static const size_t sizes[] = {1, 7, 64, 1031, 65537, 1 << 20};
  /* The pairs the calls refuse (bitwise ops on float types, bool's AVG) have no kernel. */
  for (int d = 0; d < HOOP_DTYPE_COUNT; d++)
    for (int o = 0; o < HOOP_OP_COUNT; o++)
      for (size_t s = 0;
           s < sizeof sizes / sizeof sizes[0] && !hoop__op_refused((hoop_dtype)d, (hoop_op)o); s++)
        for (int alias = 0; alias < 3; alias++)
          run_case(comm, (hoop_dtype)d, (hoop_op)o, sizes[s], s % 2, alias);
  /* The many-source kernel: 1 to 8 sources, aligned and not, into a buffer of its own or over
   * the first, a middle or the last source; and 10 sources in two passes (8, then the partial
   * result and 2), as the IPC allreduce of 10 ranks, in place over source 0 and over source 7 (past
   * 8 the allreduce reduces into scratch). */
  for (int d = 0; d < HOOP_DTYPE_COUNT; d++)
    for (int o = 0; o < HOOP_OP_COUNT; o++) {
      if (hoop__op_refused((hoop_dtype)d, (hoop_op)o))
        continue;
      for (int nsrcs = 1; nsrcs <= HOOP__CUDA_MANY_MAX; nsrcs++) {
        const int overs[] = {-1, 0, nsrcs / 2, nsrcs - 1};
        for (size_t v = 0; v < sizeof overs / sizeof overs[0]; v++)
          run_many_case(comm, (hoop_dtype)d, (hoop_op)o, (nsrcs + v) % 2 ? 65537 : 1031,
                        (size_t)(nsrcs + v / 2) % 2, nsrcs, overs[v], 0);
      }
      run_many_case(comm, (hoop_dtype)d, (hoop_op)o, 65537, 0, 10, 0, HOOP__CUDA_MANY_MAX);
      /* Reproducible mode's tree kernel on 1 to 8 sources, over the first or into its own. */
      for (int nsrcs = 1; nsrcs <= HOOP__CUDA_MANY_MAX; nsrcs++)
        run_many_case(comm, (hoop_dtype)d, (hoop_op)o, nsrcs % 2 ? 65537 : 1031, (size_t)nsrcs % 2,
                      nsrcs, nsrcs % 3 ? -1 : 0, -1);
      run_many_case(comm, (hoop_dtype)d, (hoop_op)o, 1031, 1, 10, 7, HOOP__CUDA_MANY_MAX);
    }
  /* The codec: every format, both roundings, the three float dtypes, with and without error
   * feedback, a short piece, one block, a short last block and many blocks. */
  static const int formats[] = {HOOP_COMPRESS_BF16, HOOP_COMPRESS_FP8, HOOP_COMPRESS_INT8};
  static const hoop_dtype codec_dtypes[] = {HOOP_FLOAT32, HOOP_FLOAT16, HOOP_BFLOAT16};
  static const size_t codec_sizes[] = {5, 128, 1000, 65537};
  for (int f = 0; f < 6; f++)
    for (size_t d = 0; d < 3; d++)
      for (size_t s = 0; s < sizeof codec_sizes / sizeof codec_sizes[0]; s++)
        for (int feedback = 0; feedback < 2; feedback++)
          run_codec_case(comm, formats[f % 3] | (f >= 3 ? HOOP_COMPRESS_STOCHASTIC : 0),
                         codec_dtypes[d], codec_sizes[s], feedback);
  printf("test_cuda_kernels: %zu cases, %zu failed\n", checks, failures);
  free(comm);
  return failures ? 1 : 0;
}
