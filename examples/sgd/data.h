/* data.h - the training and test sets: read from MNIST's IDX files, or generated from the seed
 * (a learnable synthetic set, so that the example runs without downloading anything). */
#ifndef SGD_DATA_H
#define SGD_DATA_H

#include <stddef.h>
#include <stdint.h>

typedef struct dataset {
  size_t count;    /* examples */
  size_t features; /* floats per example */
  float *x;        /* count * features, example i at x + i * features */
  uint8_t *label;  /* count class numbers */
} dataset;

/* Read an IDX image file (unsigned bytes, any shape N x ...; pixels scaled to [0, 1]) and its IDX
 * label file (unsigned bytes, N). Return 0, or -1 with a message in error[error_len]. */
int data_read_idx(dataset *set, const char *images_path, const char *labels_path, char *error,
                  size_t error_len);

/* The synthetic set: SYNTHETIC_CLASSES classes of SYNTHETIC_FEATURES features; train_count and
 * test_count examples drawn from the same distribution, entirely determined by seed. */
#define SYNTHETIC_FEATURES 64
#define SYNTHETIC_CLASSES 10
int data_synthetic(dataset *train, dataset *test, size_t train_count, size_t test_count,
                   uint64_t seed);

/* Number of classes: the largest label plus one. */
int data_classes(const dataset *set);

/* order[0..count) = a permutation of 0..count-1, the same on every rank for a given seed and
 * epoch. */
void data_shuffle(size_t *order, size_t count, uint64_t seed, int epoch);

void data_free(dataset *set);

#endif
