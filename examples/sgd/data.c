/* data.c - loading the data sets (MNIST's IDX format, or a synthetic set made from the seed) and
 * shuffling them once per epoch. Every rank holds the whole training set: each step's global batch
 * is drawn from all of it, and each rank computes its slice of that batch (see sgd.c). */
#include "data.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rng.h"

/* ---- IDX files ------------------------------------------------------------------------------- */
/* An IDX file is a 4-byte magic (0, 0, element type, number of dimensions), one big-endian uint32
 * per dimension, then the elements in row-major order. MNIST uses type 0x08, unsigned bytes. */

#define IDX_UBYTE 0x08
#define IDX_MAX_DIMS 4

typedef struct idx_file {
  size_t dims[IDX_MAX_DIMS];
  int ndims;
  size_t elements; /* product of the dimensions */
  uint8_t *data;   /* the whole file; the elements start at data + 4 + 4 * ndims */
} idx_file;

static int read_file(const char *path, uint8_t **data, size_t *size, char *error,
                     size_t error_len) {
  FILE *file = fopen(path, "rb");
  if (!file) {
    snprintf(error, error_len, "cannot open %s: %s", path, strerror(errno));
    return -1;
  }
  long length = -1;
  if (fseek(file, 0, SEEK_END) == 0)
    length = ftell(file);
  rewind(file);
  *data = length >= 0 ? malloc(length > 0 ? (size_t)length : 1) : NULL;
  if (!*data || fread(*data, 1, (size_t)length, file) != (size_t)length) {
    snprintf(error, error_len, "cannot read %s: %s", path, *data ? strerror(errno) : "no memory");
    free(*data);
    fclose(file);
    return -1;
  }
  fclose(file);
  *size = (size_t)length;
  return 0;
}

static int read_idx(idx_file *idx, const char *path, char *error, size_t error_len) {
  size_t size;
  if (read_file(path, &idx->data, &size, error, error_len) != 0)
    return -1;
  const uint8_t *d = idx->data;
  idx->ndims = size >= 4 ? d[3] : 0;
  if (size < 4 || d[0] != 0 || d[1] != 0 || d[2] != IDX_UBYTE || idx->ndims < 1 ||
      idx->ndims > IDX_MAX_DIMS || size < 4 + 4 * (size_t)idx->ndims) {
    snprintf(error, error_len,
             "%s: not an IDX file of unsigned bytes (gunzip MNIST's .gz files first)", path);
    goto fail;
  }
  idx->elements = 1;
  for (int i = 0; i < idx->ndims; i++) {
    const uint8_t *be = d + 4 + 4 * i;
    idx->dims[i] = (size_t)be[0] << 24 | (size_t)be[1] << 16 | (size_t)be[2] << 8 | be[3];
    if (idx->dims[i] != 0 && idx->elements > size / idx->dims[i]) {
      snprintf(error, error_len, "%s: the header announces more data than the file holds", path);
      goto fail;
    }
    idx->elements *= idx->dims[i];
  }
  size_t header = 4 + 4 * (size_t)idx->ndims;
  if (idx->elements != size - header) {
    snprintf(error, error_len, "%s: the header announces %zu bytes of data, the file holds %zu",
             path, idx->elements, size - header);
    goto fail;
  }
  return 0;
fail:
  free(idx->data);
  idx->data = NULL;
  return -1;
}

int data_read_idx(dataset *set, const char *images_path, const char *labels_path, char *error,
                  size_t error_len) {
  memset(set, 0, sizeof *set);
  idx_file images = {0}, labels = {0};
  int result = -1;
  if (read_idx(&images, images_path, error, error_len) != 0 ||
      read_idx(&labels, labels_path, error, error_len) != 0)
    goto done;
  if (labels.ndims != 1 || labels.dims[0] != images.dims[0] || images.dims[0] == 0) {
    snprintf(error, error_len, "%s holds %zu images, %s %zu labels (%d dimensions)", images_path,
             images.dims[0], labels_path, labels.ndims == 1 ? labels.dims[0] : 0, labels.ndims);
    goto done;
  }
  set->count = images.dims[0];
  set->features = images.elements / set->count; /* 28 x 28 = 784 for MNIST */
  set->x = malloc(images.elements * sizeof *set->x);
  set->label = malloc(set->count);
  if (!set->x || !set->label) {
    snprintf(error, error_len, "no memory for %zu images", set->count);
    data_free(set);
    goto done;
  }
  const uint8_t *pixels = images.data + 4 + 4 * images.ndims;
  for (size_t i = 0; i < images.elements; i++)
    set->x[i] = (float)pixels[i] / 255.0f;
  memcpy(set->label, labels.data + 4 + 4 * labels.ndims, set->count);
  result = 0;
done:
  free(labels.data);
  free(images.data);
  return result;
}

/* ---- the synthetic set ----------------------------------------------------------------------- */
/* Each class is a mixture of two Gaussian clusters around random centres. The clusters overlap a
 * little, so accuracy stays below 100%, and a class's two clusters need not lie on one side of a
 * hyperplane, so the MLP (--hidden > 0) can beat the softmax classifier. */

#define CLUSTERS_PER_CLASS 2
#define CLUSTER_SPREAD 2.0 /* noise standard deviation, relative to the centres' */
#define FEATURE_SCALE 0.25 /* features of the order of pixels in [0, 1]: one --lr suits both */

static void draw_examples(dataset *set, const double *centres, rng *r) {
  for (size_t i = 0; i < set->count; i++) {
    int label = (int)rng_below(r, SYNTHETIC_CLASSES);
    int cluster = label * CLUSTERS_PER_CLASS + (int)rng_below(r, CLUSTERS_PER_CLASS);
    const double *centre = centres + (size_t)cluster * SYNTHETIC_FEATURES;
    float *x = set->x + i * SYNTHETIC_FEATURES;
    for (int f = 0; f < SYNTHETIC_FEATURES; f++)
      x[f] = (float)(FEATURE_SCALE * (centre[f] + CLUSTER_SPREAD * rng_normal(r)));
    set->label[i] = (uint8_t)label;
  }
}

static int alloc_set(dataset *set, size_t count) {
  set->count = count;
  set->features = SYNTHETIC_FEATURES;
  set->x = malloc((count ? count : 1) * SYNTHETIC_FEATURES * sizeof *set->x);
  set->label = malloc(count ? count : 1);
  return set->x && set->label ? 0 : -1;
}

int data_synthetic(dataset *train, dataset *test, size_t train_count, size_t test_count,
                   uint64_t seed) {
  memset(train, 0, sizeof *train);
  memset(test, 0, sizeof *test);
  double *centres =
      malloc(SYNTHETIC_CLASSES * CLUSTERS_PER_CLASS * SYNTHETIC_FEATURES * sizeof *centres);
  if (!centres || alloc_set(train, train_count) != 0 || alloc_set(test, test_count) != 0) {
    free(centres);
    data_free(train);
    data_free(test);
    return -1;
  }
  rng r;
  rng_seed(&r, seed, 0);
  for (int i = 0; i < SYNTHETIC_CLASSES * CLUSTERS_PER_CLASS * SYNTHETIC_FEATURES; i++)
    centres[i] = rng_normal(&r);
  draw_examples(train, centres, &r);
  draw_examples(test, centres, &r);
  free(centres);
  return 0;
}

/* ---- helpers --------------------------------------------------------------------------------- */

int data_classes(const dataset *set) {
  int classes = 0;
  for (size_t i = 0; i < set->count; i++)
    if (set->label[i] >= classes)
      classes = set->label[i] + 1;
  return classes;
}

/* Fisher-Yates with a generator seeded by (seed, epoch): every rank computes the same order
 * without any communication. */
void data_shuffle(size_t *order, size_t count, uint64_t seed, int epoch) {
  rng r;
  rng_seed(&r, seed, 1000000 + (uint64_t)epoch);
  for (size_t i = 0; i < count; i++)
    order[i] = i;
  for (size_t i = count; i > 1; i--) {
    size_t j = rng_below(&r, (uint32_t)i);
    size_t swap = order[i - 1];
    order[i - 1] = order[j];
    order[j] = swap;
  }
}

void data_free(dataset *set) {
  free(set->x);
  free(set->label);
  memset(set, 0, sizeof *set);
}
