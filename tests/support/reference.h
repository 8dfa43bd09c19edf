/* reference.h - test inputs and independently computed expected results for the collectives.
 *
 * Inputs are a pure function of (seed, rank, index, dtype, op), chosen so that float sums and
 * products are exact (small integers, powers of two) whatever the order of reduction; the
 * expected values are folded over ranks in plain C in wide types, without libhoop's kernels.
 *
 * A seed with REF_WIDE set draws inputs that can show an order or precision bug: floats with full
 * mantissas over several binades and both signs (sums and products round), checked within the
 * bound that any order of reduction in the dtype keeps ((n + 2) u sum |x|, derived in
 * reference.c: a sum accumulated in a narrower type, or an element added twice, falls outside),
 * and integers over their whole width (int64 and uint64 past 2^53 and 2^63), checked exactly in
 * the dtype's wrapping arithmetic. */
#ifndef HOOP_TEST_REFERENCE_H
#define HOOP_TEST_REFERENCE_H

#include <stddef.h>

#include "hoop.h"

/* Or'd into a seed: inputs over the whole range (above). */
#define REF_WIDE 0x80000000u

/* Write rank's input of count elements. */
void ref_fill(void *buf, size_t count, hoop_dtype dtype, hoop_op op, int rank, unsigned seed);

/* Check buf against op over nranks ranks' inputs. Returns the number of wrong elements and
 * describes the first one in msg. */
size_t ref_check_allreduce(const void *buf, size_t count, hoop_dtype dtype, hoop_op op, int nranks,
                           unsigned seed, char *msg, size_t msglen);

/* The same for elements [first, first + count) of the reduced inputs, held in buf from its start
 * (a rank's block of a reduce-scatter). */
size_t ref_check_reduced(const void *buf, size_t first, size_t count, hoop_dtype dtype, hoop_op op,
                         int nranks, unsigned seed, char *msg, size_t msglen);

/* Check that buf equals rank's input exactly (broadcast and allgather blocks). */
size_t ref_check_equal(const void *buf, size_t count, hoop_dtype dtype, hoop_op op, int rank,
                       unsigned seed, char *msg, size_t msglen);

#endif
