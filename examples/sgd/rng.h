/* rng.h - a small, seeded random number generator (splitmix64), so that a run is the same on
 * every machine and every rank: the synthetic data, the initial weights and the shuffles all come
 * from it. rand() would not do: its sequence differs between C libraries. */
#ifndef SGD_RNG_H
#define SGD_RNG_H

#include <math.h>
#include <stdint.h>

typedef struct rng {
  uint64_t state;
} rng;

/* One generator per purpose: the stream number keeps, say, the shuffle of epoch 3 apart from the
 * initial weights of rank 1 even though both come from the same --seed. */
static inline void rng_seed(rng *r, uint64_t seed, uint64_t stream) {
  r->state = seed * 0x9e3779b97f4a7c15u ^ (stream + 1) * 0xbf58476d1ce4e5b9u;
}

static inline uint64_t rng_next(rng *r) {
  uint64_t z = (r->state += 0x9e3779b97f4a7c15u);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
  return z ^ (z >> 31);
}

/* Uniform in [0, 1), with 53 random bits. */
static inline double rng_uniform(rng *r) {
  return (double)(rng_next(r) >> 11) * 0x1p-53;
}

/* Uniform integer in [0, n), n < 2^32 (multiply-shift; the bias is below 2^-32). */
static inline uint32_t rng_below(rng *r, uint32_t n) {
  return (uint32_t)(((rng_next(r) >> 32) * n) >> 32);
}

/* Standard normal (Box-Muller). */
static inline double rng_normal(rng *r) {
  double u = 1.0 - rng_uniform(r); /* in (0, 1], so the log is finite */
  double v = rng_uniform(r);
  return sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v);
}

#endif
