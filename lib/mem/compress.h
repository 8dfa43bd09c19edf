/* compress.h - the wire formats of compressed reductions (hoop.h, hoop_compress) on host memory:
 * a piece of count elements of a float dtype encoded into hoop__compress_bytes bytes, and decoded
 * into float32 sums or back into the dtype. Decoding is one float multiply per element, the same
 * on every machine, so every rank that decodes a piece gets the same bits.
 *
 * An encoded piece: bf16, count 2-byte values; fp8 and int8, one float32 scale per block of
 * HOOP_COMPRESS_BLOCK elements (the last block may be shorter), then count 1-byte codes. */
#ifndef HOOP__MEM_COMPRESS_H
#define HOOP__MEM_COMPRESS_H

#include <stddef.h>
#include <stdint.h>

#include "hoop.h"

/* The format without its flags. */
static inline int hoop__compress_format(int format) {
  return format & 0xff;
}

/* Bytes of count elements encoded in format. */
size_t hoop__compress_bytes(int format, size_t count);

/* How one encode rounds: to nearest (seed 0), or stochastically with the random bits of element
 * i drawn from (seed, first + i), so that the same call draws the same wherever it runs. */
typedef struct hoop__rounding {
  uint64_t seed;
  uint64_t first;
} hoop__rounding;

/* out = count elements of in (dtype: float32, float16 or bfloat16) encoded in format. With
 * residual (count floats), residual[i] is added to element i first and becomes what the encoding
 * dropped of the sum. */
void hoop__compress(int format, void *out, const void *in, hoop_dtype dtype, size_t count,
                    float *residual, hoop__rounding rounding);
/* acc[i] += element i of the encoded piece in, in float32. */
void hoop__expand_add(int format, float *acc, const void *in, size_t count);
/* out = the encoded piece in, decoded into dtype (16-bit dtypes rounded to nearest even). */
void hoop__expand(int format, void *out, hoop_dtype dtype, const void *in, size_t count);

/* The codec's copies (compress.c): for the build's baseline, and on x86-64 with gcc or clang
 * again for AVX2 (compress_avx2.c), alike in every bit; the calls above take the AVX2 copy where
 * the CPU has AVX2. hoop__codec_name says which ("avx2" or "generic"). */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define HOOP__CODEC_AVX2 1
#else
#define HOOP__CODEC_AVX2 0
#endif
void hoop__compress_generic(int format, void *out, const void *in, hoop_dtype dtype, size_t count,
                            float *residual, hoop__rounding rounding);
void hoop__expand_add_generic(int format, float *acc, const void *in, size_t count);
void hoop__expand_generic(int format, void *out, hoop_dtype dtype, const void *in, size_t count);
#if HOOP__CODEC_AVX2
void hoop__compress_avx2(int format, void *out, const void *in, hoop_dtype dtype, size_t count,
                         float *residual, hoop__rounding rounding);
void hoop__expand_add_avx2(int format, float *acc, const void *in, size_t count);
void hoop__expand_avx2(int format, void *out, hoop_dtype dtype, const void *in, size_t count);
#endif
const char *hoop__codec_name(void);

#endif /* HOOP__MEM_COMPRESS_H */
