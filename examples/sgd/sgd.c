/* sgd.c - a minimal data-parallel SGD trainer: every rank holds the same model, computes gradients
 * on its slice of each global batch, and the ranks average those gradients with hoop_allreduce
 * before every step, so that N ranks train the model one rank would, up to the order of float
 * additions. Run it with `hooprun -np 4 examples/sgd/sgd`; README.md beside it walks through it.
 *
 * The order of main() is the order of a data-parallel program: join the job, load the data, build
 * the model, broadcast rank 0's parameters, then per step compute, average, step; per epoch, agree
 * on the loss and the test accuracy.
 */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "average.h"
#include "data.h"
#include "hoop.h"
#include "model.h"
#include "timer.h"

/* ---- options --------------------------------------------------------------------------------- */

/* --overlap-slices: W1's gradient travels in up to this many slices of rows, each slice's
 * allreduce running while the next slice is computed. */
#define OVERLAP_MAX_SLICES 64

typedef struct options {
  int epochs;
  size_t batch; /* the global batch: all ranks' examples of one step together */
  float lr;
  float momentum;
  size_t hidden; /* 0: softmax classifier */
  uint64_t seed;
  int fp16_allreduce;
  int compress; /* --compress: the wire format between hosts */
  size_t fusion_bytes;
  int overlap; /* allreduce each layer's gradients while the layers below are computed */
  int overlap_slices;
  const char *train_images, *train_labels, *test_images, *test_labels;
  size_t synthetic; /* training examples of the synthetic set */
  const char *save_params;
  int verbose;
  int elastic;      /* a lost rank does not end the run: the survivors shrink and go on */
  int fail_rank;    /* --fail-rank: this rank kills itself (SIGKILL) ... (-1: none) */
  size_t fail_step; /* ... before this global step (counted from 1 over all epochs) */
} options;

static const options defaults = {
    .epochs = 5,
    .batch = 64,
    .lr = 0.05f,
    .momentum = 0.9f,
    .hidden = 64,
    .seed = 1,
    .fusion_bytes = 64 << 20,
    .overlap = 1,
    .overlap_slices = 1,
    .synthetic = 8192,
    .fail_rank = -1,
};

static void usage(FILE *out) {
  fprintf(
      out,
      "usage: sgd [options]     (data-parallel: hooprun -np N sgd [options])\n"
      "Train a classifier with minibatch SGD; the ranks average gradients with hoop.\n"
      "  --epochs N            passes over the training set (default %d)\n"
      "  --batch N             global batch: examples per step over all ranks together; each\n"
      "                        rank takes N / ranks of them, the first N %% ranks one more\n"
      "                        (default %zu)\n"
      "  --lr X                learning rate (default %g)\n"
      "  --momentum X          momentum, 0 for plain SGD (default %g)\n"
      "  --hidden N            hidden ReLU units; 0 for a softmax classifier (default %zu)\n"
      "  --seed N              seed of the data, the weights and the shuffles (default %llu)\n"
      "  --fp16-allreduce      send gradients as float16, summed in float32 at each hop\n"
      "  --compress F          send gradients between hosts as F (int8, fp8, bf16; +feedback\n"
      "                        carries what one step dropped into the next; man hoop, Slow\n"
      "                        links); within a host they stay exact\n"
      "  --fusion-bytes N      pack gradient tensors into allreduce buffers of up to N bytes\n"
      "                        (K, M suffixes; 0: one allreduce per tensor; default 64M)\n"
      "  --overlap, --no-overlap\n"
      "                        start each layer's allreduce (non-blocking) as soon as backward\n"
      "                        produces its gradients, while the layers below are computed,\n"
      "                        and wait before the step (default: on; off with\n"
      "                        --fp16-allreduce)\n"
      "  --overlap-slices N    with --overlap, send the hidden weights' gradients in N\n"
      "                        slices of rows, each posted as soon as it is computed\n"
      "                        (default 1, at most 64)\n"
      "  --train-images FILE   MNIST IDX files (uncompressed); without them, a synthetic set\n"
      "  --train-labels FILE\n"
      "  --test-images FILE    optional, for the test accuracy\n"
      "  --test-labels FILE\n"
      "  --synthetic N         training examples of the synthetic set, without IDX files\n"
      "                        (default %zu; the test set has N / 4)\n"
      "  --save-params FILE    write the final parameters as raw float32: rank 0 to FILE,\n"
      "                        rank r > 0 to FILE.rank<r>\n"
      "  --verbose             every rank prints its lines, not only rank 0\n"
      "  --elastic             when a rank is lost, the others go on without it (run under\n"
      "                        hooprun --min-np): they shrink the job (hoop_comm_shrink),\n"
      "                        take rank 0's parameters, momentum and place in the run, and\n"
      "                        divide each global batch among the ranks left\n"
      "  --fail-rank R --fail-step N\n"
      "                        to try --elastic: rank R kills itself (SIGKILL) before global\n"
      "                        step N (counted from 1 over all epochs)\n"
      "  --help\n",
      defaults.epochs, defaults.batch, (double)defaults.lr, (double)defaults.momentum,
      defaults.hidden, (unsigned long long)defaults.seed, defaults.synthetic);
}

static void usage_error(const char *message) {
  fprintf(stderr, "sgd: %s (see --help)\n", message);
  exit(2);
}

static void bad_option(const char *name, const char *value) {
  fprintf(stderr, "sgd: bad value '%s' for --%s (see --help)\n", value, name);
  exit(2);
}

/* A whole number up to max, with K and M suffixes when suffixes is set. */
static size_t parse_count(const char *name, const char *text, int suffixes, size_t max) {
  char *end;
  errno = 0;
  unsigned long long value = strtoull(text, &end, 10);
  unsigned long long unit = 1;
  if (suffixes && (*end == 'k' || *end == 'K'))
    unit = 1 << 10, end++;
  else if (suffixes && (*end == 'm' || *end == 'M'))
    unit = 1 << 20, end++;
  if (errno || end == text || *end || text[0] == '-' || value > max / unit)
    bad_option(name, text);
  return (size_t)(value * unit);
}

static float parse_float(const char *name, const char *text) {
  char *end;
  errno = 0;
  float value = strtof(text, &end);
  if (errno || end == text || *end || !(value >= 0) || !isfinite(value))
    bad_option(name, text);
  return value;
}

static void parse_options(int argc, char **argv, options *opt) {
  /* One option per line reads better than the formatter's layout. */
  /* clang-format off */
  enum { EPOCHS = 1, BATCH, LR, MOMENTUM, HIDDEN, SEED, FP16, FUSION, TRAIN_IMAGES, TRAIN_LABELS,
         TEST_IMAGES, TEST_LABELS, SYNTHETIC, SAVE, VERBOSE, OVERLAP, NO_OVERLAP, OVERLAP_SLICES,
         ELASTIC, FAIL_RANK, FAIL_STEP, COMPRESS, HELP };
  static const struct option longs[] = {
      {"epochs", required_argument, 0, EPOCHS},
      {"batch", required_argument, 0, BATCH},
      {"lr", required_argument, 0, LR},
      {"momentum", required_argument, 0, MOMENTUM},
      {"hidden", required_argument, 0, HIDDEN},
      {"seed", required_argument, 0, SEED},
      {"fp16-allreduce", no_argument, 0, FP16},
      {"compress", required_argument, 0, COMPRESS},
      {"fusion-bytes", required_argument, 0, FUSION},
      {"overlap", no_argument, 0, OVERLAP},
      {"no-overlap", no_argument, 0, NO_OVERLAP},
      {"overlap-slices", required_argument, 0, OVERLAP_SLICES},
      {"train-images", required_argument, 0, TRAIN_IMAGES},
      {"train-labels", required_argument, 0, TRAIN_LABELS},
      {"test-images", required_argument, 0, TEST_IMAGES},
      {"test-labels", required_argument, 0, TEST_LABELS},
      {"synthetic", required_argument, 0, SYNTHETIC},
      {"save-params", required_argument, 0, SAVE},
      {"verbose", no_argument, 0, VERBOSE},
      {"elastic", no_argument, 0, ELASTIC},
      {"fail-rank", required_argument, 0, FAIL_RANK},
      {"fail-step", required_argument, 0, FAIL_STEP},
      {"help", no_argument, 0, HELP},
      {0, 0, 0, 0}};
  *opt = defaults;
  int c, index;
  while ((c = getopt_long(argc, argv, "", longs, &index)) != -1) {
    const char *name = c > 0 && c <= HELP ? longs[index].name : "";
    switch (c) {
    case EPOCHS: opt->epochs = (int)parse_count(name, optarg, 0, 1000000); break;
    case BATCH: opt->batch = parse_count(name, optarg, 0, SIZE_MAX); break;
    case LR: opt->lr = parse_float(name, optarg); break;
    case MOMENTUM: opt->momentum = parse_float(name, optarg); break;
    case HIDDEN: opt->hidden = parse_count(name, optarg, 0, 1 << 16); break;
    case SEED: opt->seed = parse_count(name, optarg, 0, SIZE_MAX); break;
    case FP16: opt->fp16_allreduce = 1; break;
    case COMPRESS:
      if (hoop_compress_from_name(optarg, &opt->compress) != 0)
        usage_error("--compress takes none, bf16, fp8 or int8, with +stochastic or +feedback");
      break;
    case FUSION: opt->fusion_bytes = parse_count(name, optarg, 1, SIZE_MAX); break;
    case OVERLAP: opt->overlap = 1; break;
    case NO_OVERLAP: opt->overlap = 0; break;
    case OVERLAP_SLICES:
      opt->overlap_slices = (int)parse_count(name, optarg, 0, OVERLAP_MAX_SLICES);
      break;
    case TRAIN_IMAGES: opt->train_images = optarg; break;
    case TRAIN_LABELS: opt->train_labels = optarg; break;
    case TEST_IMAGES: opt->test_images = optarg; break;
    case TEST_LABELS: opt->test_labels = optarg; break;
    case SYNTHETIC: opt->synthetic = parse_count(name, optarg, 0, 1 << 24); break;
    case SAVE: opt->save_params = optarg; break;
    case VERBOSE: opt->verbose = 1; break;
    case ELASTIC: opt->elastic = 1; break;
    case FAIL_RANK: opt->fail_rank = (int)parse_count(name, optarg, 0, 1 << 20); break;
    case FAIL_STEP: opt->fail_step = parse_count(name, optarg, 0, SIZE_MAX); break;
    case HELP: usage(stdout); exit(0);
    default: usage(stderr); exit(2);
    }
  }
  /* clang-format on */
  if (optind < argc) {
    fprintf(stderr, "sgd: unexpected argument '%s' (see --help)\n", argv[optind]);
    exit(2);
  }
  if (opt->epochs < 1 || opt->batch < 1 || opt->synthetic < 1)
    usage_error("--epochs, --batch and --synthetic must be at least 1");
  if (opt->overlap_slices < 1)
    usage_error("--overlap-slices must be at least 1");
  if ((opt->fail_rank >= 0) != (opt->fail_step > 0))
    usage_error("give --fail-rank and --fail-step (at least 1) together");
  if (opt->momentum >= 1)
    usage_error("--momentum must be below 1");
  if (!opt->train_images != !opt->train_labels || !opt->test_images != !opt->test_labels)
    usage_error("give image and label files together");
  if (opt->test_images && !opt->train_images)
    usage_error("--test-images needs --train-images too");
}

/* ---- the job --------------------------------------------------------------------------------- */

typedef struct trainer {
  options opt;
  hoop_comm *comm;
  int rank, size;
  int printing; /* this rank prints its lines: rank 0, or every rank with --verbose */
  dataset train, test;
  int classes;
  size_t *order; /* the shuffled order of the training set, the same on every rank */
  model model;
  averager averager;
  double compute_seconds; /* forward, backward and the optimizer step */
  /* The examples of this rank's slice and each one's gradient at the hidden layer; with
   * --overlap, the time spent waiting for allreduces that computation did not hide. */
  const float **xs;
  int *labels;
  float *hidden_grads;
  double wait_seconds;
  size_t steps;
  size_t examples; /* examples this rank trained on in the running epoch */
  int shrunk;      /* --elastic: the job has lost ranks and gone on */
} trainer;

/* A collective failed: say where, and abort the communicator so that the other ranks stop waiting
 * for this one (hooprun then stops the job). */
static void check(trainer *t, hoop_result result, const char *what) {
  if (result == HOOP_OK)
    return;
  fprintf(stderr, "sgd rank %d: %s: %s: %s\n", t->rank, what, hoop_strerror(result),
          hoop_last_error(t->comm));
  hoop_abort(t->comm, what);
  hoop_finalize(t->comm);
  exit(1);
}

static void fail(trainer *t, const char *message) {
  fprintf(stderr, "sgd rank %d: %s\n", t->rank, message);
  hoop_abort(t->comm, message);
  hoop_finalize(t->comm);
  exit(1);
}

/* The slice of `total` items that belongs to `rank`: total / size each, and one more for the
 * first total % size ranks. The slices of all ranks, in rank order, cover 0..total exactly. */
static void slice_of(size_t total, int size, int rank, size_t *first, size_t *count) {
  size_t base = total / (size_t)size, extra = total % (size_t)size, r = (size_t)rank;
  *count = base + (r < extra ? 1 : 0);
  *first = r * base + (r < extra ? r : extra);
}

/* Every rank loads (or generates) the whole data set: the global batch of each step is drawn from
 * all of it, and each rank computes its slice of that batch. */
static void load_data(trainer *t) {
  const options *opt = &t->opt;
  char error[512];
  if (!opt->train_images) {
    if (data_synthetic(&t->train, &t->test, opt->synthetic, opt->synthetic / 4, opt->seed) != 0)
      fail(t, "no memory for the synthetic data set");
  } else {
    if (data_read_idx(&t->train, opt->train_images, opt->train_labels, error, sizeof error) != 0)
      fail(t, error);
    if (opt->test_images &&
        data_read_idx(&t->test, opt->test_images, opt->test_labels, error, sizeof error) != 0)
      fail(t, error);
  }
  t->classes = data_classes(&t->train);
  if (t->classes < 2 || data_classes(&t->test) > t->classes ||
      (t->test.count && t->test.features != t->train.features))
    fail(t, "the test set does not match the training set (features or classes)");
  if (t->opt.batch > t->train.count)
    fail(t, "--batch is larger than the training set");
  t->order = malloc(t->train.count * sizeof *t->order);
  if (!t->order)
    fail(t, "no memory for the shuffle");
}

/* Room for this rank's slice of a batch, which grows when the job shrinks. */
static void size_batch_buffers(trainer *t) {
  size_t first, most;
  slice_of(t->opt.batch, t->size, 0, &first, &most); /* rank 0's slice is never smaller */
  free(t->xs);
  free(t->labels);
  free(t->hidden_grads);
  t->xs = malloc(most * sizeof *t->xs);
  t->labels = malloc(most * sizeof *t->labels);
  t->hidden_grads = malloc((most * t->model.hidden + 1) * sizeof *t->hidden_grads);
  if (!t->xs || !t->labels || !t->hidden_grads)
    fail(t, "no memory for the backward pass");
}

/* Each rank draws its own initial weights (model_init seeds them with the rank); broadcasting rank
 * 0's makes every replica start from the same point. From then on identical averaged gradients
 * keep them identical, so this is the only time parameters travel. */
static void build_model(trainer *t, int newcomer) {
  if (model_init(&t->model, t->train.features, t->opt.hidden, (size_t)t->classes, t->opt.seed,
                 t->rank) != 0)
    fail(t, "no memory for the model");
  /* A newcomer takes the running job's state instead (share_state). */
  for (int i = 0; i < t->model.ntensors && !newcomer; i++) {
    tensor *p = &t->model.tensors[i];
    check(t, hoop_broadcast(t->comm, p->value, p->count, HOOP_FLOAT32, 0),
          "broadcasting parameters");
  }
  if (averager_init(&t->averager, t->comm, t->model.tensors, t->model.ntensors, t->opt.fusion_bytes,
                    t->opt.fp16_allreduce) != 0)
    fail(t, "no memory for the fusion buffer");
  check(t, averager_compress(&t->averager, t->opt.compress), "registering the fusion buffer");
  /* float16 and compressed gradients travel through the averager's buffer, which --overlap does
   * not use. */
  if (t->opt.fp16_allreduce || t->opt.compress)
    t->opt.overlap = 0;
  size_batch_buffers(t);
}

static void print_plan(const trainer *t) {
  const options *opt = &t->opt;
  size_t first, count;
  slice_of(opt->batch, t->size, t->size - 1, &first, &count);
  printf("sgd: %d rank%s, %s data: %zu training and %zu test examples, %zu features, %d classes\n",
         t->size, t->size == 1 ? "" : "s", opt->train_images ? "IDX" : "synthetic", t->train.count,
         t->test.count, t->train.features, t->classes);
  if (opt->hidden)
    printf("sgd: MLP %zu-%zu-%d", t->train.features, opt->hidden, t->classes);
  else
    printf("sgd: softmax classifier %zu-%d", t->train.features, t->classes);
  printf(", %zu parameters; batch %zu (%zu%s per rank), lr %g, momentum %g, seed %llu\n",
         model_parameter_count(&t->model), opt->batch, count,
         opt->batch % (size_t)t->size ? " or 1 more" : "", (double)opt->lr, (double)opt->momentum,
         (unsigned long long)opt->seed);
  size_t wire_size = hoop_dtype_size(t->averager.wire_dtype);
  int calls = opt->overlap ? 1 + (opt->hidden ? opt->overlap_slices : 0) : t->averager.ngroups;
  printf("sgd: gradients: %d allreduce%s of %s per step, %zu bytes in all; ", calls,
         calls == 1 ? "" : "s", hoop_dtype_name(t->averager.wire_dtype),
         model_parameter_count(&t->model) * wire_size);
  if (opt->overlap)
    printf("non-blocking, overlapped with backward: the top layers fused, then the hidden "
           "weights in %d slice%s, each posted as computed\n",
           opt->hidden ? opt->overlap_slices : 0, opt->overlap_slices == 1 ? "" : "s");
  else if (opt->fusion_bytes)
    printf("tensor fusion up to %zu bytes\n", opt->fusion_bytes);
  else
    printf("no tensor fusion\n");
}

/* ---- training -------------------------------------------------------------------------------- */

/* One epoch. The shuffled training set is cut into global batches of --batch examples (an
 * incomplete last one is dropped). In each, this rank computes the gradient summed over its slice
 * of the batch; averaging then gives every rank the mean over the whole batch, exactly what one
 * rank computing the whole batch would get, up to the order of float additions.
 * Returns this rank's sum of the examples' losses. */
static void scale(float *values, size_t count, float by) {
  for (size_t i = 0; i < count; i++)
    values[i] *= by;
}

/* The forward pass and the top of the backward pass on this rank's slice of the batch (both
 * paths compute with the same code, so that they differ only in how gradients travel). Returns
 * the slice's summed loss. */
static double backward_top(trainer *t, const size_t *mine, size_t count) {
  model *m = &t->model;
  model_zero_grad(m);
  for (size_t i = 0; i < count; i++) {
    t->xs[i] = t->train.x + mine[i] * t->train.features;
    t->labels[i] = t->train.label[mine[i]];
  }
  return model_backward_top(m, t->xs, t->labels, count, t->hidden_grads);
}

/* One step with --overlap: the output layer's gradients and the hidden layer's bias go first, as
 * one fused non-blocking allreduce, then the hidden weights' in slices of rows, each posted as
 * soon as it is computed; the step waits for all of them. Each rank scales its gradients to its
 * share of the mean first, as the averager does (average.c). Returns the slice's summed loss. */
static hoop_result overlapped_step(trainer *t, const size_t *mine, size_t count, double *loss) {
  model *m = &t->model;
  const options *opt = &t->opt;
  float share = 1.0f / (float)opt->batch;
  double start = now_seconds();
  *loss = backward_top(t, mine, count);
  hoop_request *reqs[1 + OVERLAP_MAX_SLICES];
  int slices = opt->overlap_slices;
  int posted = 0;
  /* Softmax: W and b; MLP: b1, W2 and b2 (W1 follows in slices). */
  const void *sends[MODEL_MAX_TENSORS];
  void *recvs[MODEL_MAX_TENSORS];
  size_t counts[MODEL_MAX_TENSORS];
  size_t n = 0;
  for (int i = m->hidden ? 1 : 0; i < m->ntensors; i++) {
    scale(m->tensors[i].grad, m->tensors[i].count, share);
    sends[n] = recvs[n] = m->tensors[i].grad;
    counts[n++] = m->tensors[i].count;
  }
  hoop_result result =
      hoop_iallreduce_many(t->comm, n, sends, recvs, counts, HOOP_FLOAT32, HOOP_SUM, &reqs[posted]);
  posted += result == HOOP_OK;
  for (int s = 0; m->hidden && s < slices && result == HOOP_OK; s++) {
    size_t first = m->hidden * (size_t)s / (size_t)slices,
           end = m->hidden * (size_t)(s + 1) / (size_t)slices;
    if (end == first)
      continue;
    model_backward_rows(m, t->xs, count, t->hidden_grads, first, end);
    float *rows = m->tensors[0].grad + first * m->inputs;
    scale(rows, (end - first) * m->inputs, share);
    result = hoop_iallreduce(t->comm, rows, rows, (end - first) * m->inputs, HOOP_FLOAT32, HOOP_SUM,
                             &reqs[posted]);
    posted += result == HOOP_OK;
  }
  double computed = now_seconds();
  /* Every posted request is waited for (and freed), even after a failure. */
  for (int r = 0; r < posted; r++) {
    hoop_result waited = hoop_wait(reqs[r]);
    if (result == HOOP_OK)
      result = waited;
  }
  if (result != HOOP_OK)
    return result;
  double waited = now_seconds();
  model_step(m, opt->lr, opt->momentum);
  t->compute_seconds += (computed - start) + (now_seconds() - waited);
  t->wait_seconds += waited - computed;
  return HOOP_OK;
}

/* Run the epoch's steps from *step on, adding this rank's losses to *loss_sum. On a failure
 * *step is the step that failed, which did not change the model. */
static hoop_result train_epoch(trainer *t, int epoch, size_t *step, double *loss_sum) {
  const options *opt = &t->opt;
  model *m = &t->model;
  data_shuffle(t->order, t->train.count, opt->seed, epoch);
  size_t steps = t->train.count / opt->batch, first, count;
  slice_of(opt->batch, t->size, t->rank, &first, &count);
  for (; *step < steps; (*step)++) {
    if (!t->shrunk && t->rank == opt->fail_rank &&
        (size_t)(epoch - 1) * steps + *step + 1 == opt->fail_step)
      raise(SIGKILL);
    const size_t *mine = t->order + *step * opt->batch + first;
    hoop_result result = HOOP_OK;
    double loss = 0;
    if (opt->overlap) {
      result = overlapped_step(t, mine, count, &loss);
    } else {
      double start = now_seconds();
      loss = backward_top(t, mine, count);
      if (m->hidden)
        model_backward_rows(m, t->xs, count, t->hidden_grads, 0, m->hidden);
      t->compute_seconds += now_seconds() - start;
      result = averager_run(&t->averager, m->tensors, opt->batch);
      if (result == HOOP_OK) {
        start = now_seconds();
        model_step(m, opt->lr, opt->momentum);
        t->compute_seconds += now_seconds() - start;
      }
    }
    if (result != HOOP_OK)
      return result;
    *loss_sum += loss;
    t->examples += count;
    t->steps++;
  }
  return HOOP_OK;
}

/* Correct predictions on this rank's slice of the test set, a batch at a time. */
static size_t count_correct(trainer *t) {
  size_t first, count, correct = 0;
  slice_of(t->test.count, t->size, t->rank, &first, &count);
  int classes[256];
  for (size_t done = 0; done < count;) {
    size_t n = count - done < 256 ? count - done : 256;
    model_predict(&t->model, t->test.x + (first + done) * t->train.features, n, classes);
    for (size_t i = 0; i < n; i++)
      correct += classes[i] == t->test.label[first + done + i];
    done += n;
  }
  return correct;
}

/* The epoch's figures are sums over ranks too: one allreduce gives every rank the mean training
 * loss and the test accuracy, so every rank prints the same numbers. */
/* With --elastic the same allreduce also counts the newcomers that each rank has heard of, so that
 * all agree (*newcomers > 0) on taking them in after this epoch. */
static hoop_result report_epoch(trainer *t, int epoch, double loss_sum, double seconds,
                                int *newcomers) {
  double totals[4] = {loss_sum, (double)count_correct(t), (double)t->examples,
                      t->opt.elastic ? (double)hoop_comm_newcomers(t->comm) : 0.0};
  hoop_result result = hoop_allreduce(t->comm, totals, totals, 4, HOOP_FLOAT64, HOOP_SUM);
  *newcomers = result == HOOP_OK && totals[3] > 0;
  if (result != HOOP_OK || !t->printing)
    return result;
  printf("rank %d, epoch %d: loss %.4f", t->rank, epoch,
         totals[2] > 0 ? totals[0] / totals[2] : 0.0);
  if (t->test.count)
    printf(", test accuracy %.1f%%", 100.0 * totals[1] / (double)t->test.count);
  printf(", %.2f s\n", now_seconds() - seconds);
  return HOOP_OK;
}

/* --elastic, after the shrink: every rank takes rank 0's place in the run (the next step to
 * run: ranks that failed in different calls may stand a step apart), its parameters and its
 * momentum, so that the replicas are identical again. */
static hoop_result share_state(trainer *t, int *epoch, size_t *step) {
  int64_t place[2] = {*epoch, (int64_t)*step};
  hoop_result result = hoop_broadcast(t->comm, place, 2, HOOP_INT64, 0);
  for (int i = 0; i < t->model.ntensors && result == HOOP_OK; i++) {
    tensor *p = &t->model.tensors[i];
    result = hoop_broadcast(t->comm, p->value, p->count, HOOP_FLOAT32, 0);
    if (result == HOOP_OK)
      result = hoop_broadcast(t->comm, p->velocity, p->count, HOOP_FLOAT32, 0);
  }
  if (result == HOOP_OK) {
    *epoch = (int)place[0];
    *step = (size_t)place[1];
  }
  return result;
}

/* A call of the run failed (what, result). Without --elastic that ends this rank (and hooprun
 * ends the job). With it, the survivors shrink the job to themselves, take rank 0's state and go
 * on from its place (*epoch, *step): each global batch is then divided among fewer ranks, so the
 * run trains the model that the full job would have, up to the lost step. */
/* The communicator of the job's next generation replaces the old one. */
static void adopt(trainer *t, hoop_comm *next) {
  hoop_finalize(t->comm);
  t->comm = next;
  t->averager.comm = next;
  t->rank = hoop_rank(next);
  t->size = hoop_size(next);
  t->printing = t->rank == 0 || t->opt.verbose;
  t->shrunk = 1;
  size_batch_buffers(t);
}

static void recover(trainer *t, hoop_result result, const char *what, int *epoch, size_t *step) {
  if (!t->opt.elastic)
    check(t, result, what);
  char story[1024];
  snprintf(story, sizeof story, "%s", hoop_last_error(t->comm));
  int was = t->size;
  do {
    hoop_comm *next = NULL;
    hoop_result shrunk = hoop_comm_shrink(t->comm, &next);
    if (shrunk != HOOP_OK) {
      fprintf(stderr,
              "sgd rank %d: %s failed (%s), and going on without the lost ranks failed too: "
              "%s: %s\n",
              t->rank, what, story, hoop_strerror(shrunk), hoop_last_error(t->comm));
      hoop_finalize(t->comm);
      exit(1);
    }
    adopt(t, next);
    what = "taking rank 0's state";
  } while ((result = share_state(t, epoch, step)) != HOOP_OK);
  if (t->printing)
    printf("rank %d: lost a rank (%s); going on with %d of %d from epoch %d, step %zu, each "
           "batch of %zu divided among them\n",
           t->rank, story, t->size, was, *epoch, *step, t->opt.batch);
}

/* --elastic, at the end of an epoch in which every rank heard of newcomers (replacements that
 * hooprun --max-np started): make room for them, and give them rank 0's state and place. */
static void take_newcomers(trainer *t, int *epoch, size_t *step) {
  int was = t->size;
  hoop_comm *next = NULL;
  hoop_result result = hoop_comm_grow(t->comm, &next);
  if (result != HOOP_OK) {
    recover(t, result, "taking in newcomers", epoch, step);
    return;
  }
  adopt(t, next);
  if ((result = share_state(t, epoch, step)) != HOOP_OK) {
    recover(t, result, "giving newcomers rank 0's state", epoch, step);
    return;
  }
  if (t->printing)
    printf("rank %d: took in %d newcomer%s: going on with %d ranks from epoch %d\n", t->rank,
           t->size - was, t->size - was == 1 ? "" : "s", t->size, *epoch);
}

/* Where a step's time went on this rank. The time in allreduce includes waiting for the slowest
 * rank to arrive. */
static void report_time(const trainer *t) {
  if (!t->printing)
    return;
  if (t->opt.overlap) {
    double compute = t->compute_seconds, wait = t->wait_seconds, total = compute + wait;
    printf("rank %d: %zu steps, %.2f ms per step: compute %.2f s (%.1f%%), waiting for allreduce "
           "%.2f s (%.1f%%) after computing (the rest of the communication overlapped)\n",
           t->rank, t->steps, 1e3 * total / (double)t->steps, compute, 100 * compute / total, wait,
           100 * wait / total);
    return;
  }
  double compute = t->compute_seconds, reduce = t->averager.allreduce_seconds,
         packing = t->averager.packing_seconds, total = compute + reduce + packing;
  printf("rank %d: %zu steps, %.2f ms per step: compute %.2f s (%.1f%%), allreduce %.2f s "
         "(%.1f%%), packing %.2f s (%.1f%%)\n",
         t->rank, t->steps, 1e3 * total / (double)t->steps, compute, 100 * compute / total, reduce,
         100 * reduce / total, packing, 100 * packing / total);
}

static void save_params(trainer *t) {
  char path[4096];
  if (t->rank == 0)
    snprintf(path, sizeof path, "%s", t->opt.save_params);
  else
    snprintf(path, sizeof path, "%s.rank%d", t->opt.save_params, t->rank);
  if (model_save(&t->model, path) != 0) {
    char message[4200];
    snprintf(message, sizeof message, "cannot write %s: %s", path, strerror(errno));
    fail(t, message);
  }
}

int main(int argc, char **argv) {
  trainer t = {0};
  parse_options(argc, argv, &t.opt);
  setvbuf(stdout, NULL, _IOLBF, 0); /* lines reach hooprun as they are printed */

  /* Join the job that hooprun started (or a job of one, when started alone). */
  hoop_result result = hoop_init_from_env(&t.comm);
  const char *join = getenv("HOOP_JOIN");
  if (result == HOOP_ERR_PEER_LOST && join && strcmp(join, "1") == 0) {
    /* A replacement that came after the run's last chance to take it in. */
    printf("sgd: the run ended before it took in this newcomer: %s\n", hoop_last_error(t.comm));
    hoop_finalize(t.comm);
    return 0;
  }
  if (result != HOOP_OK) {
    fprintf(stderr, "sgd: hoop_init: %s: %s\n", hoop_strerror(result), hoop_last_error(t.comm));
    hoop_finalize(t.comm);
    return 1;
  }
  t.rank = hoop_rank(t.comm);
  t.size = hoop_size(t.comm);
  t.printing = t.rank == 0 || t.opt.verbose;

  /* A replacement started by hooprun --max-np joins a running job (its generation is not 0). */
  int newcomer = hoop_comm_generation(t.comm) > 0;
  load_data(&t);
  build_model(&t, newcomer);
  if (t.rank == 0 && !newcomer)
    print_plan(&t);

  int epoch = 1;
  size_t step = 0;
  double loss_sum = 0, start = now_seconds();
  if (newcomer) {
    t.shrunk = 1;
    hoop_result shared = share_state(&t, &epoch, &step);
    if (shared != HOOP_OK)
      recover(&t, shared, "taking rank 0's state as a newcomer", &epoch, &step);
    if (t.opt.verbose)
      printf("rank %d: joined as a newcomer at epoch %d, step %zu\n", t.rank, epoch, step);
  }
  while (epoch <= t.opt.epochs) {
    hoop_result done = train_epoch(&t, epoch, &step, &loss_sum);
    int trained = done == HOOP_OK, newcomers = 0;
    if (trained)
      done = report_epoch(&t, epoch, loss_sum, start, &newcomers);
    if (done == HOOP_OK) {
      epoch++;
      step = 0;
      if (newcomers && epoch <= t.opt.epochs)
        take_newcomers(&t, &epoch, &step);
    } else {
      /* This rank's place: the step that failed, or the next epoch if only the report did. */
      int at = trained ? epoch + 1 : epoch;
      step = trained ? 0 : step;
      recover(&t, done, trained ? "summing the loss" : "averaging gradients", &at, &step);
      if (at == epoch)
        continue; /* the epoch goes on, and its figures keep what was counted before */
      if (t.printing && at > epoch && at - 1 <= t.opt.epochs)
        printf("rank %d, epoch %d: its figures were lost with the failure\n", t.rank, at - 1);
      epoch = at;
    }
    loss_sum = 0;
    t.examples = 0;
    start = now_seconds();
  }
  report_time(&t);
  if (t.opt.save_params)
    save_params(&t);

  averager_free(&t.averager);
  free(t.xs);
  free(t.labels);
  free(t.hidden_grads);
  model_free(&t.model);
  free(t.order);
  data_free(&t.test);
  data_free(&t.train);
  return hoop_finalize(t.comm) == HOOP_OK ? 0 : 1;
}
