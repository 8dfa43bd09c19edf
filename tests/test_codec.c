/* test_codec.c - the wire formats of compressed reductions (lib/mem/compress.c) against what
 * hoop.h documents, value by value: every float8 code's value, the error of each format and
 * rounding within its stated bound of the block's largest magnitude, stochastic rounding without
 * bias, error feedback carrying what was dropped (a constant gradient compressed k times sums to
 * k times it within one bound), blocks with NaN, infinity or only tiny values, the 16-bit dtypes
 * in and out, and the codec's AVX2 copy alike in every bit with its baseline copy. */
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hoop.h"
#include "mem/compress.h"
#include "mem/reduce.h"

#define BLOCK HOOP_COMPRESS_BLOCK
static const int formats[] = {HOOP_COMPRESS_BF16, HOOP_COMPRESS_FP8, HOOP_COMPRESS_INT8};

static uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

/* Uniform in [-1, 1) times 2^exp. */
static float random_value(uint64_t seed, int exp) {
  return (float)ldexp((double)(mix(seed) >> 11) / 4503599627370496.0 - 1.0, exp);
}

/* One conversion's largest error, as hoop.h states it, for x in a block whose largest magnitude
 * is largest. */
static double bound_of(int format, double x, double largest) {
  int stochastic = (format & HOOP_COMPRESS_STOCHASTIC) != 0;
  switch (format & 0xff) {
  case HOOP_COMPRESS_BF16: return fabs(x) * (stochastic ? 0x1p-7 : 0x1p-8);
  case HOOP_COMPRESS_FP8: {
    double scale = largest / 448;
    return fmax(fabs(x) * (stochastic ? 0x1p-3 : 0x1p-4), scale * (stochastic ? 0x1p-9 : 0x1p-10));
  }
  default: return largest / 127 * (stochastic ? 1.0 : 0.5) * (1 + 0x1p-10);
  }
}

/* The e4m3 value of a code, from its definition. */
static double e4m3(unsigned code) {
  int e = (code >> 3) & 15, m = code & 7;
  double v = e ? ldexp(1 + m / 8.0, e - 7) : ldexp(m, -9);
  return code & 0x80 ? -v : v;
}

START_TEST(test_bytes) {
  ck_assert_uint_eq(hoop__compress_bytes(HOOP_COMPRESS_BF16, 1001), 2002);
  ck_assert_uint_eq(hoop__compress_bytes(HOOP_COMPRESS_INT8, 1001), 1001 + 4 * 8);
  ck_assert_uint_eq(hoop__compress_bytes(HOOP_COMPRESS_FP8 | HOOP_COMPRESS_STOCHASTIC, 128),
                    128 + 4);
  ck_assert_uint_eq(hoop__compress_bytes(HOOP_COMPRESS_INT8, 0), 0);
}
END_TEST

/* Every finite float8 code decodes to its e4m3 value times the scale, and encodes back to itself.
 */
START_TEST(test_fp8_every_code) {
  float x[256], back[256];
  unsigned char piece[256 + 8];
  int n = 0;
  for (unsigned c = 0; c < 256; c++)
    if ((c & 0x7f) != 0x7f)
      x[n++] = (float)e4m3(c);
  /* The block's largest magnitude is 448: its scale is 1. */
  for (int at = 0; at + BLOCK <= 256; at += BLOCK) {
    float block[BLOCK];
    memcpy(block, x + (at < n - BLOCK ? at : n - BLOCK), sizeof block);
    block[0] = 448.0f;
    hoop__compress(HOOP_COMPRESS_FP8, piece, block, HOOP_FLOAT32, BLOCK, NULL,
                   (hoop__rounding){0, 0});
    hoop__expand(HOOP_COMPRESS_FP8, back, HOOP_FLOAT32, piece, BLOCK);
    for (int i = 0; i < BLOCK; i++)
      ck_assert_msg(back[i] == block[i], "fp8: %.9g came back as %.9g", block[i], back[i]);
  }
}
END_TEST

/* Random blocks over many magnitudes, each format to nearest and stochastic: every value within
 * its bound, and the decode the same bits every time. */
START_TEST(test_bounds) {
  int format = formats[_i % 3] | (_i >= 3 ? HOOP_COMPRESS_STOCHASTIC : 0);
  enum { N = 100003 };
  float *x = malloc(N * sizeof *x), *back = malloc(N * sizeof *back);
  float *again = malloc(N * sizeof *again);
  unsigned char *piece = malloc(hoop__compress_bytes(format, N));
  for (size_t i = 0; i < N; i++)
    x[i] = random_value(i * 7 + (uint64_t)_i, (int)(mix(i / 300) % 41) - 20);
  hoop__compress(format, piece, x, HOOP_FLOAT32, N, NULL,
                 (hoop__rounding){format & HOOP_COMPRESS_STOCHASTIC ? 99 : 0, 5});
  hoop__expand(format, back, HOOP_FLOAT32, piece, N);
  hoop__expand(format, again, HOOP_FLOAT32, piece, N);
  ck_assert(memcmp(back, again, N * sizeof *back) == 0);
  size_t exact = 0;
  for (size_t b = 0; b < N; b += BLOCK) {
    size_t n = N - b < BLOCK ? N - b : BLOCK;
    double largest = 0;
    for (size_t i = b; i < b + n; i++)
      largest = fmax(largest, fabs(x[i]));
    for (size_t i = b; i < b + n; i++) {
      double err = fabs((double)back[i] - x[i]);
      exact += err == 0;
      ck_assert_msg(err <= bound_of(format, x[i], largest),
                    "format %#x: %.9g came back as %.9g (block largest %.9g)", format, x[i],
                    back[i], largest);
    }
  }
  /* The inputs round: a format that kept them exact would not be compressing. */
  ck_assert_msg(exact < N / 2, "format %#x kept %zu of %d values exact", format, exact, N);
  free(x);
  free(back);
  free(again);
  free(piece);
}
END_TEST

/* Stochastic rounding is unbiased: one value encoded with many seeds averages to itself; a
 * value a third of the block's largest in every format, and in bf16 and fp8 one 2^14 times
 * smaller (fp8's subnormal range, which is rounded another way; for int8 it would be a 400th of a
 * step, which the draws' spread could not tell from 0). */
START_TEST(test_stochastic_unbiased) {
  int format = formats[_i % 3] | HOOP_COMPRESS_STOCHASTIC;
  float x = _i < 3 ? 0.3337f : 0.3337f * 0x1p-14f; /* between steps of every format */
  float block[BLOCK], back[BLOCK];
  unsigned char piece[BLOCK * 2 + 8];
  for (int i = 0; i < BLOCK; i++)
    block[i] = i == 0 ? 1.0f : x;
  double total = 0;
  int draws = 4000;
  for (int k = 0; k < draws; k++) {
    hoop__compress(format, piece, block, HOOP_FLOAT32, BLOCK, NULL,
                   (hoop__rounding){(uint64_t)k * 2654435761u + 1, 0});
    hoop__expand(format, back, HOOP_FLOAT32, piece, BLOCK);
    for (int i = 1; i < BLOCK; i++)
      total += back[i];
  }
  double mean = total / ((double)draws * (BLOCK - 1));
  /* Each draw is off by less than one step; the mean of n draws by a few steps / sqrt(n). */
  double step = bound_of(format, x, 1.0);
  ck_assert_msg(fabs(mean - x) < 6 * step / sqrt((double)draws * (BLOCK - 1)) + 1e-6 * x,
                "format %#x: the mean of %d draws is %.9g, not %.9g", format, draws, mean,
                (double)x);
}
END_TEST

/* Error feedback: a constant gradient compressed for k steps, each step adding what the last one
 * dropped, decodes to k times it within one conversion's bound. */
START_TEST(test_feedback_drains) {
  int format = formats[_i];
  enum { N = 1000, STEPS = 50 };
  float g[N], back[N], total[N] = {0}, residual[N] = {0};
  unsigned char piece[N * 2 + 64];
  for (int i = 0; i < N; i++)
    g[i] = random_value((uint64_t)i, i % 7 - 3);
  for (int k = 0; k < STEPS; k++) {
    hoop__compress(format, piece, g, HOOP_FLOAT32, N, residual, (hoop__rounding){0, 0});
    hoop__expand(format, back, HOOP_FLOAT32, piece, N);
    for (int i = 0; i < N; i++)
      total[i] += back[i];
  }
  for (int b = 0; b < N; b += BLOCK) {
    double largest = 0;
    for (int i = b; i < b + BLOCK && i < N; i++)
      largest = fmax(largest, fabs(g[i]) + fabs(residual[i]));
    for (int i = b; i < b + BLOCK && i < N; i++) {
      double want = (double)g[i] * STEPS;
      /* What is left is the last step's residual, within one bound (and float sums' rounding). */
      ck_assert_msg(fabs(total[i] - want) <=
                        2 * bound_of(format, 2 * g[i], 2 * largest) + STEPS * 0x1p-22 * fabs(want),
                    "format %#x: %d steps of %.9g summed to %.9g", format, STEPS, g[i], total[i]);
      ck_assert(fabs(residual[i] - (want - total[i])) <= 1e-5 * fabs(want) + 1e-30);
    }
  }
}
END_TEST

/* A block with NaN or infinity arrives as NaN, its codes 0, and leaves no residual; a tiny block
 * arrives as zeros; the blocks beside them are untouched; to nearest and stochastically. */
START_TEST(test_special_blocks) {
  int format = formats[_i % 3] | (_i >= 3 ? HOOP_COMPRESS_STOCHASTIC : 0);
  float x[3 * BLOCK], back[3 * BLOCK], residual[3 * BLOCK] = {0};
  unsigned char piece[3 * BLOCK * 2 + 16];
  for (int i = 0; i < 3 * BLOCK; i++)
    x[i] = random_value((uint64_t)i, 0);
  x[5] = NAN;
  x[BLOCK + 9] = _i >= 3 ? -INFINITY : INFINITY;
  for (int i = 2 * BLOCK; i < 3 * BLOCK; i++)
    x[i] = (i % 2 ? 1 : -1) * 0x1p-110f;
  hoop__compress(format, piece, x, HOOP_FLOAT32, 3 * BLOCK, residual,
                 (hoop__rounding){_i >= 3 ? 7 : 0, 0});
  hoop__expand(format, back, HOOP_FLOAT32, piece, 3 * BLOCK);
  if ((format & 0xff) != HOOP_COMPRESS_BF16) {
    /* A block of NaN or infinity has codes 0, on every machine (the GPU's kernels too). */
    for (int i = 0; i < 2 * BLOCK; i++)
      ck_assert_msg(piece[3 * sizeof(float) + (size_t)i] == 0, "format %#x: code %d is %#x, not 0",
                    format, i, piece[3 * sizeof(float) + (size_t)i]);
    for (int i = 0; i < 2 * BLOCK; i++) {
      ck_assert_msg(isnan(back[i]), "format %#x: element %d is %g, not NaN", format, i, back[i]);
      ck_assert_msg(residual[i] == 0, "format %#x: residual %d is %g", format, i, residual[i]);
    }
    for (int i = 2 * BLOCK; i < 3 * BLOCK; i++)
      ck_assert_msg(back[i] == 0, "format %#x: tiny element %d is %g", format, i, back[i]);
  } else {
    ck_assert(isnan(back[5]) && isinf(back[BLOCK + 9]) && residual[5] == 0);
    ck_assert(back[4] == x[4] || fabs(back[4] - x[4]) <= fabs(x[4]) * (_i >= 3 ? 0x1p-7 : 0x1p-8));
  }
}
END_TEST

/* float16 and bfloat16 inputs, and sums added in float32. */
START_TEST(test_dtypes_and_sums) {
  int format = formats[_i];
  enum { N = 300 };
  uint16_t half[N], out[N];
  float wide[N], sum[N];
  unsigned char piece[N * 2 + 16];
  for (int i = 0; i < N; i++) {
    float v = random_value((uint64_t)i, 2);
    uint32_t bits;
    memcpy(&bits, &v, sizeof bits);
    half[i] = (uint16_t)(bits >> 16); /* a bfloat16, truncated: exact in float */
    bits &= 0xffff0000u;
    memcpy(&wide[i], &bits, sizeof bits);
    sum[i] = 1.0f;
  }
  hoop__compress(format, piece, half, HOOP_BFLOAT16, N, NULL, (hoop__rounding){0, 0});
  hoop__expand(format, out, HOOP_BFLOAT16, piece, N);
  hoop__expand_add(format, sum, piece, N);
  for (int i = 0; i < N; i++) {
    uint32_t bits = (uint32_t)out[i] << 16;
    float got;
    memcpy(&got, &bits, sizeof got);
    ck_assert(fabs(got - wide[i]) <= bound_of(format, wide[i], 4) + fabs(wide[i]) * 0x1p-8);
    ck_assert(fabs(sum[i] - 1.0f - wide[i]) <= bound_of(format, wide[i], 4) + 0x1p-23);
  }
}
END_TEST

#if HOOP__CODEC_AVX2
/* The AVX2 copy of the codec and the baseline copy: the same pieces, residuals and decoded values,
 * bit for bit, for each format and rounding, float32, float16 and bfloat16, with and without
 * feedback, whole and short blocks, values over many magnitudes with NaN, infinities, zeros of
 * both signs, subnormals and tiny blocks among them; and both decode arbitrary bytes alike. */
START_TEST(test_copies_alike) {
  if (!__builtin_cpu_supports("avx2")) {
    printf("test_copies_alike: this CPU has no AVX2; only the baseline copy runs here\n");
    return;
  }
  int format = formats[_i % 3] | (_i >= 3 ? HOOP_COMPRESS_STOCHASTIC : 0);
  enum { N = 5 * BLOCK + 37 };
  static const hoop_dtype dtypes[] = {HOOP_FLOAT32, HOOP_FLOAT16, HOOP_BFLOAT16};
  float x[N], kept[2][N], sums[2][N], out[2][N];
  unsigned char piece[2][N * 4 + 64];
  for (int i = 0; i < N; i++)
    x[i] = random_value((uint64_t)i * 7 + (uint64_t)_i, i / BLOCK * 9 - 20 + i % 5);
  x[3] = NAN, x[BLOCK + 1] = -INFINITY, x[BLOCK + 2] = -0.0f, x[2 * BLOCK + 5] = 0x1p-140f;
  for (int i = 3 * BLOCK; i < 4 * BLOCK; i++)
    x[i] = (i % 3 - 1) * 0x1p-120f;
  for (size_t d = 0; d < sizeof dtypes / sizeof *dtypes; d++)
    for (int feedback = 0; feedback < 2; feedback++)
      for (int count = N; count > 0; count -= N - 77) {
        unsigned char in[N * 4];
        if (dtypes[d] == HOOP_FLOAT32)
          memcpy(in, x, sizeof x);
        else
          hoop__from_float(in, x, dtypes[d], N);
        for (int c = 0; c < 2; c++) {
          for (int i = 0; i < N; i++)
            kept[c][i] = random_value((uint64_t)i + 99, -8), sums[c][i] = x[N - 1 - i];
          memset(piece[c], 0, sizeof piece[c]);
          hoop__rounding r = {_i >= 3 ? (uint64_t)_i * 1000003 + 1 : 0, 17};
          (c ? hoop__compress_avx2 : hoop__compress_generic)(
              format, piece[c], in, dtypes[d], (size_t)count, feedback ? kept[c] : NULL, r);
          (c ? hoop__expand_add_avx2 : hoop__expand_add_generic)(format, sums[c], piece[c],
                                                                 (size_t)count);
          (c ? hoop__expand_avx2 : hoop__expand_generic)(format, out[c], dtypes[d], piece[c],
                                                         (size_t)count);
        }
        size_t bytes = hoop__compress_bytes(format, (size_t)count);
        ck_assert_msg(memcmp(piece[0], piece[1], bytes) == 0,
                      "format %#x dtype %d feedback %d count %d: the pieces differ", format,
                      (int)dtypes[d], feedback, count);
        ck_assert_msg(memcmp(kept[0], kept[1], sizeof kept[0]) == 0,
                      "format %#x dtype %d: the residuals differ", format, (int)dtypes[d]);
        ck_assert_msg(memcmp(sums[0], sums[1], sizeof sums[0]) == 0,
                      "format %#x: the decoded sums differ", format);
        ck_assert_msg(memcmp(out[0], out[1], (size_t)count * hoop_dtype_size(dtypes[d])) == 0,
                      "format %#x dtype %d: the decoded values differ", format, (int)dtypes[d]);
      }
  /* Arbitrary bytes: every code (and scales of any bits, NaN and infinity among them). */
  unsigned char junk[N * 2 + 64];
  for (size_t i = 0; i < sizeof junk; i++)
    junk[i] = (unsigned char)(mix(i + 5) >> 24);
  float a[N], b[N];
  hoop__expand_generic(format, a, HOOP_FLOAT32, junk, N);
  hoop__expand_avx2(format, b, HOOP_FLOAT32, junk, N);
  ck_assert_msg(memcmp(a, b, sizeof a) == 0, "format %#x: arbitrary bytes decode differently",
                format);
}
END_TEST
#endif

int main(void) {
  Suite *s = suite_create("codec");
  TCase *tc = tcase_create("formats");
  tcase_add_test(tc, test_bytes);
  tcase_add_test(tc, test_fp8_every_code);
  tcase_add_loop_test(tc, test_bounds, 0, 6);
  tcase_add_loop_test(tc, test_stochastic_unbiased, 0, 5);
  tcase_add_loop_test(tc, test_feedback_drains, 0, 3);
  tcase_add_loop_test(tc, test_special_blocks, 0, 6);
  tcase_add_loop_test(tc, test_dtypes_and_sums, 0, 3);
#if HOOP__CODEC_AVX2
  tcase_add_loop_test(tc, test_copies_alike, 0, 6);
#endif
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
