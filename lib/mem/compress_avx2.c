/* compress_avx2.c - compress.c's codec compiled again for AVX2 (x86-64, gcc or clang), under its
 * own names; compress.c's entry points choose it where the CPU has AVX2. Only the vector width
 * changes: no FMA (the build's -std=c11 contracts nothing either), so each element goes through
 * the same float operations and every code and value has the same bits as the baseline copy's
 * (test_codec compares them). The headers come first, outside the target. */
#include <math.h>
#include <string.h>

#include "mem/compress.h"
#include "mem/reduce.h"

#if HOOP__CODEC_AVX2
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2")
#endif

#define CODEC_VARIANT
#define CODEC(name) name##_avx2
#include "mem/compress.c"

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
#endif
