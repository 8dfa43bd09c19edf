/* test_sgd.c - examples/sgd run for real under hooprun: the ranks end with bit-identical
 * parameters; 1 and 4 ranks (even and uneven batch slices, with and without tensor fusion) train
 * the same model within 1e-5; the loss falls on the synthetic set; float16 allreduce trains within
 * a stated tolerance of float32; IDX files are read, and a broken one is refused. */
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "support/procs.h"

/* Every run trains the MLP on a small synthetic set: a few tenths of a second on 4 ranks over two
 * cores, a few seconds under the sanitizers. */
#define SMALL_RUN "--synthetic", "4096", "--epochs", "4", "--hidden", "32"
#define RUN_TIMEOUT_S 240
#define MAX_EPOCHS 16

/* 1 rank against N: data parallelism may change only the order of float additions. */
#define SAME_MATH_TOLERANCE 1e-5
/* float16 against float32 gradients: the final training loss within 0.01, the test accuracy within
 * 2 points, every parameter within 5% of the largest. */
#define FP16_LOSS_TOLERANCE 0.01
#define FP16_ACCURACY_TOLERANCE 2.0
#define FP16_PARAM_TOLERANCE 5e-2

static char workdir[64];

static void make_workdir(void) {
  snprintf(workdir, sizeof workdir, "/tmp/hoop-sgd-XXXXXX");
  ck_assert_msg(mkdtemp(workdir) != NULL, "mkdtemp failed");
}

static void remove_workdir(void) {
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", workdir);
  if (system(cmd) != 0)
    fprintf(stderr, "could not remove %s\n", workdir);
}

static const char *work_path(const char *name) {
  static char path[4][256];
  static int next;
  char *p = path[next++ % 4];
  snprintf(p, sizeof path[0], "%s/%s", workdir, name);
  return p;
}

/* What one run left behind, read back. */
typedef struct run_result {
  double loss[MAX_EPOCHS];     /* rank 0's training loss per epoch */
  double accuracy[MAX_EPOCHS]; /* rank 0's test accuracy per epoch, in % */
  int epochs;
  char *output; /* everything the ranks printed, tagged by hooprun */
} run_result;

/* Run `hooprun -np np sgd args... --save-params WORKDIR/name`; the args end with NULL (leading
 * "--min-np", "N" and "--max-np", "M" go to hooprun). With wrap, each rank runs `sh -c wrap sgd
 * args...` (the script ends with `exec "$0" "$@"`). Return the exit status and fill *result (free
 * it with free_result). */
static int run_sgd_wrapped(const char *name, int np, run_result *result, const char *const *args,
                           const char *wrap) {
  char hooprun[4096], sgd[4096], np_text[16], params[256], out[sizeof params + 8];
  snprintf(hooprun, sizeof hooprun, "%s", procs_build_path("tools/hooprun"));
  snprintf(sgd, sizeof sgd, "%s", procs_build_path("examples/sgd/sgd"));
  snprintf(np_text, sizeof np_text, "%d", np);
  snprintf(params, sizeof params, "%s", work_path(name));
  snprintf(out, sizeof out, "%s.out", params);
  char *argv[64] = {hooprun, "-np", np_text, "--timeout", "60"};
  int argc = 5, i = 0;
  while (args[i] && (strcmp(args[i], "--min-np") == 0 || strcmp(args[i], "--max-np") == 0) &&
         args[i + 1]) {
    argv[argc++] = (char *)args[i++];
    argv[argc++] = (char *)args[i++];
  }
  if (wrap) {
    argv[argc++] = "/bin/sh";
    argv[argc++] = "-c";
    argv[argc++] = (char *)wrap;
  }
  argv[argc++] = sgd;
  argv[argc++] = "--save-params";
  argv[argc++] = params;
  for (; args[i] && argc < 63; i++)
    argv[argc++] = (char *)args[i];
  argv[argc] = NULL;

  int code = procs_run(argv, NULL, out, RUN_TIMEOUT_S);
  memset(result, 0, sizeof *result);
  result->output = procs_slurp(out);
  ck_assert_msg(result->output != NULL, "cannot read %s", out);
  /* Rank 0's lines: "[0] rank 0, epoch 3: loss 0.2431, test accuracy 93.1%, 0.12 s". */
  for (char *line = result->output; line;) {
    char *end = strchr(line, '\n');
    if (end)
      *end = '\0';
    const char *at = strstr(line, "rank 0, epoch ");
    int epoch;
    double loss, accuracy;
    if (at && result->epochs < MAX_EPOCHS &&
        sscanf(at, "rank 0, epoch %d: loss %lf, test accuracy %lf%%", &epoch, &loss, &accuracy) ==
            3) {
      result->loss[result->epochs] = loss;
      result->accuracy[result->epochs++] = accuracy;
    }
    if (end)
      *end = '\n';
    line = end ? end + 1 : NULL;
  }
  return code;
}

static int run_sgd_status(const char *name, int np, run_result *result, const char *const *args) {
  return run_sgd_wrapped(name, np, result, args, NULL);
}

/* The end of a run's output, for a failure's message (check refuses messages of more than about
 * 4 KiB, and a run's output can be longer: its end says what went wrong). */
static const char *tail(const char *output) {
  size_t length = strlen(output);
  return length > 3000 ? output + length - 3000 : output;
}

#define run_sgd(name, np, result, ...)                                                             \
  run_sgd_checked(name, np, result, (const char *const[]){SMALL_RUN, __VA_ARGS__, NULL})

static void run_sgd_checked(const char *name, int np, run_result *result, const char *const *args) {
  int code = run_sgd_status(name, np, result, args);
  ck_assert_msg(code == 0, "sgd on %d ranks (%s): expected exit 0, got %d%s; output:\n%s", np, name,
                code, code == -1 ? " (killed at the timeout)" : "", tail(result->output));
  ck_assert_msg(result->epochs > 0, "sgd on %d ranks (%s) printed no epoch line:\n%s", np, name,
                tail(result->output));
}

static void free_result(run_result *result) {
  free(result->output);
  result->output = NULL;
}

static unsigned char *read_bytes(const char *path, size_t *length) {
  FILE *file = fopen(path, "rb");
  ck_assert_msg(file != NULL, "cannot open %s", path);
  fseek(file, 0, SEEK_END);
  long size = ftell(file);
  rewind(file);
  unsigned char *bytes = malloc(size > 0 ? (size_t)size : 1);
  ck_assert(bytes != NULL);
  ck_assert_msg(fread(bytes, 1, (size_t)size, file) == (size_t)size, "cannot read %s", path);
  fclose(file);
  *length = (size_t)size;
  return bytes;
}

/* max |a - b| / max |a| over two parameter files, which must hold as many floats. */
static double params_difference(const char *name_a, const char *name_b) {
  size_t length_a, length_b;
  unsigned char *raw_a = read_bytes(work_path(name_a), &length_a);
  unsigned char *raw_b = read_bytes(work_path(name_b), &length_b);
  ck_assert_msg(length_a == length_b && length_a % sizeof(float) == 0 && length_a > 0,
                "%s holds %zu bytes, %s %zu: expected the same number of floats", name_a, length_a,
                name_b, length_b);
  double largest = 0, difference = 0;
  for (size_t i = 0; i < length_a / sizeof(float); i++) {
    float a, b;
    memcpy(&a, raw_a + i * sizeof a, sizeof a);
    memcpy(&b, raw_b + i * sizeof b, sizeof b);
    ck_assert_msg(isfinite(a) && isfinite(b), "parameter %zu is not finite: %g, %g", i, a, b);
    largest = fmax(largest, fabs(a));
    difference = fmax(difference, fabs((double)a - b));
  }
  free(raw_b);
  free(raw_a);
  ck_assert_msg(largest > 0, "%s holds only zeros", name_a);
  return difference / largest;
}

static void assert_same_math(const char *name_a, const char *name_b) {
  double difference = params_difference(name_a, name_b);
  ck_assert_msg(difference <= SAME_MATH_TOLERANCE,
                "%s against %s: expected max|a - b| <= %g max|a|, got %g max|a|", name_a, name_b,
                SAME_MATH_TOLERANCE, difference);
}

/* Rank 0 saved to name, rank r > 0 to name.rankR: all must be the same bytes. */
static void assert_ranks_identical(const char *name, int np) {
  size_t length0;
  unsigned char *rank0 = read_bytes(work_path(name), &length0);
  for (int r = 1; r < np; r++) {
    char other[128];
    snprintf(other, sizeof other, "%s.rank%d", name, r);
    size_t length;
    unsigned char *params = read_bytes(work_path(other), &length);
    size_t differing = 0;
    for (size_t i = 0; i < length0 && length == length0; i += sizeof(float))
      differing += memcmp(rank0 + i, params + i, sizeof(float)) != 0;
    ck_assert_msg(length == length0 && differing == 0,
                  "rank %d's parameters (%zu bytes) differ from rank 0's (%zu bytes) in %zu "
                  "floats: expected bit-identical",
                  r, length, length0, differing);
    free(params);
  }
  free(rank0);
}

/* ---- (a) every rank holds the same parameters ------------------------------------------------ */

START_TEST(test_ranks_hold_identical_params) {
  run_result run;
  run_sgd("four", 4, &run, "--verbose");
  assert_ranks_identical("four", 4);
  free_result(&run);
}
END_TEST

/* ---- (b) 1 rank and 4 ranks train the same model --------------------------------------------- */

START_TEST(test_one_rank_equals_four) {
  run_result one, four;
  run_sgd("one", 1, &one, "--batch", "64");
  run_sgd("four", 4, &four, "--batch", "64");
  assert_same_math("one", "four");
  free_result(&four);
  free_result(&one);
}
END_TEST

/* 30 examples over 4 ranks: slices of 8, 8, 7 and 7, still one global batch of 30. */
START_TEST(test_uneven_batch_slices) {
  run_result one, four;
  run_sgd("one", 1, &one, "--batch", "30");
  run_sgd("four", 4, &four, "--batch", "30");
  ck_assert_msg(strstr(four.output, "batch 30 (7 or 1 more per rank)") != NULL,
                "expected the plan line to announce slices of 7 or 8:\n%s", tail(four.output));
  assert_same_math("one", "four");
  assert_ranks_identical("four", 4);
  free_result(&four);
  free_result(&one);
}
END_TEST

/* Fusion changes how many allreduce calls carry the gradients, not what they add up (fusion is
 * the blocking path's: --overlap has its own plan). */
START_TEST(test_fusion_keeps_the_math) {
  run_result fused, split, unfused;
  run_sgd("fused", 4, &fused, "--fusion-bytes", "64M", "--no-overlap");
  run_sgd("split", 4, &split, "--fusion-bytes", "4K", "--no-overlap"); /* W1; b1, W2, b2 */
  run_sgd("unfused", 4, &unfused, "--fusion-bytes", "0", "--no-overlap");
  ck_assert_msg(strstr(fused.output, "1 allreduce of float32 per step"), "%s", tail(fused.output));
  ck_assert_msg(strstr(split.output, "2 allreduces of float32 per step"), "%s", tail(split.output));
  ck_assert_msg(strstr(unfused.output, "4 allreduces of float32 per step"), "%s",
                tail(unfused.output));
  assert_same_math("fused", "split");
  assert_same_math("fused", "unfused");
  free_result(&unfused);
  free_result(&split);
  free_result(&fused);
}
END_TEST

/* Overlapping the allreduces with the backward pass, in one slice of the hidden weights or in
 * four, trains the same model as averaging after it; and all ranks still end with the same bits. */
START_TEST(test_overlap_keeps_the_math) {
  run_result after, one, four;
  run_sgd("after", 4, &after, "--no-overlap");
  run_sgd("overlap1", 4, &one, "--overlap");
  run_sgd("overlap4", 4, &four, "--overlap", "--overlap-slices", "4");
  ck_assert_msg(strstr(one.output, "2 allreduces of float32 per step") &&
                    strstr(one.output, "overlapped with backward"),
                "%s", tail(one.output));
  ck_assert_msg(strstr(four.output, "5 allreduces of float32 per step"), "%s", tail(four.output));
  ck_assert_msg(strstr(four.output, "waiting for allreduce"), "%s", tail(four.output));
  assert_same_math("after", "overlap1");
  assert_same_math("after", "overlap4");
  assert_ranks_identical("overlap4", 4);
  free_result(&four);
  free_result(&one);
  free_result(&after);
}
END_TEST

/* ---- (c) the loss falls ---------------------------------------------------------------------- */

static void assert_learns(const run_result *run, double max_loss, double min_accuracy) {
  int last = run->epochs - 1;
  ck_assert_msg(run->loss[last] < max_loss && run->loss[last] < run->loss[0] / 2,
                "expected the last epoch's loss below %g and below half the first's (%g), got %g",
                max_loss, run->loss[0], run->loss[last]);
  ck_assert_msg(run->accuracy[last] >= min_accuracy,
                "expected a test accuracy of at least %g%%, got %g%%", min_accuracy,
                run->accuracy[last]);
}

START_TEST(test_mlp_loss_falls) {
  run_result run;
  run_sgd("mlp", 4, &run, "--seed", "1");
  ck_assert_int_eq(run.epochs, 4);
  assert_learns(&run, 0.40, 80.0);
  free_result(&run);
}
END_TEST

START_TEST(test_softmax_loss_falls) {
  run_result run;
  run_sgd("softmax", 4, &run, "--hidden", "0");
  assert_learns(&run, 0.60, 75.0);
  free_result(&run);
}
END_TEST

/* ---- (d) float16 gradients ------------------------------------------------------------------- */

START_TEST(test_fp16_close_to_fp32) {
  run_result fp32, fp16;
  run_sgd("fp32", 4, &fp32, "--seed", "1");
  run_sgd("fp16", 4, &fp16, "--seed", "1", "--fp16-allreduce");
  ck_assert_msg(strstr(fp16.output, "allreduce of float16 per step"), "%s", tail(fp16.output));
  int last = fp32.epochs - 1;
  ck_assert_int_eq(fp16.epochs, fp32.epochs);
  ck_assert_msg(fabs(fp16.loss[last] - fp32.loss[last]) <= FP16_LOSS_TOLERANCE,
                "expected the float16 run's final loss within %g of float32's %g, got %g",
                FP16_LOSS_TOLERANCE, fp32.loss[last], fp16.loss[last]);
  ck_assert_msg(fabs(fp16.accuracy[last] - fp32.accuracy[last]) <= FP16_ACCURACY_TOLERANCE,
                "expected the float16 run's accuracy within %g points of float32's %g%%, got %g%%",
                FP16_ACCURACY_TOLERANCE, fp32.accuracy[last], fp16.accuracy[last]);
  double difference = params_difference("fp32", "fp16");
  ck_assert_msg(difference <= FP16_PARAM_TOLERANCE,
                "expected float16's parameters within %g max|p| of float32's, got %g max|p|",
                FP16_PARAM_TOLERANCE, difference);
  assert_ranks_identical("fp16", 4);
  free_result(&fp16);
  free_result(&fp32);
}
END_TEST

/* ---- IDX files ------------------------------------------------------------------------------- */

static void write_idx(const char *name, const uint32_t *dims, int ndims, const uint8_t *data,
                      size_t count) {
  FILE *file = fopen(work_path(name), "wb");
  ck_assert_msg(file != NULL, "cannot create %s", name);
  uint8_t magic[4] = {0, 0, 0x08, (uint8_t)ndims};
  fwrite(magic, 1, 4, file);
  for (int i = 0; i < ndims; i++) {
    uint8_t be[4] = {(uint8_t)(dims[i] >> 24), (uint8_t)(dims[i] >> 16), (uint8_t)(dims[i] >> 8),
                     (uint8_t)dims[i]};
    fwrite(be, 1, 4, file);
  }
  ck_assert(fwrite(data, 1, count, file) == count);
  ck_assert(fclose(file) == 0);
}

/* 4x4 images whose label is the bright quadrant, over noise: learnable by a linear model. */
static void write_quadrants(const char *prefix, uint32_t count, uint32_t seed) {
  uint8_t *pixels = malloc((size_t)count * 16), *labels = malloc(count);
  ck_assert(pixels && labels);
  for (uint32_t i = 0; i < count; i++) {
    labels[i] = (uint8_t)(i % 4);
    for (int p = 0; p < 16; p++) {
      seed = seed * 1103515245u + 12345u;
      int quadrant = (p / 8) * 2 + (p % 4) / 2;
      pixels[i * 16 + p] = (uint8_t)((seed >> 16) % 128 + (quadrant == labels[i] ? 120 : 0));
    }
  }
  char name[64];
  uint32_t image_dims[3] = {count, 4, 4};
  snprintf(name, sizeof name, "%s-images", prefix);
  write_idx(name, image_dims, 3, pixels, (size_t)count * 16);
  snprintf(name, sizeof name, "%s-labels", prefix);
  write_idx(name, &count, 1, labels, count);
  free(labels);
  free(pixels);
}

START_TEST(test_idx_files) {
  write_quadrants("train", 400, 1);
  write_quadrants("test", 100, 2);
  char train_images[256], train_labels[256], test_images[256], test_labels[256];
  snprintf(train_images, sizeof train_images, "%s", work_path("train-images"));
  snprintf(train_labels, sizeof train_labels, "%s", work_path("train-labels"));
  snprintf(test_images, sizeof test_images, "%s", work_path("test-images"));
  snprintf(test_labels, sizeof test_labels, "%s", work_path("test-labels"));
  run_result run;
  run_sgd("idx", 4, &run, "--hidden", "0", "--batch", "20", "--train-images", train_images,
          "--train-labels", train_labels, "--test-images", test_images, "--test-labels",
          test_labels);
  ck_assert_msg(strstr(run.output, "IDX data: 400 training and 100 test examples, 16 features, "
                                   "4 classes"),
                "expected the plan line to describe the IDX files:\n%s", tail(run.output));
  assert_learns(&run, 0.30, 95.0);
  free_result(&run);
}
END_TEST

/* ---- (g) --elastic: the survivors of a lost rank finish the run --------------------------------
 */

/* Rank 2 of 4 kills itself in the second epoch (global step 100 of 4 x 64); hooprun --min-np 2
 * lets the job go on; the other three shrink, take rank 0's state and finish every epoch with
 * bit-identical replicas, the loss falling on as in the run that lost nobody. */
START_TEST(test_elastic_goes_on_without_a_lost_rank) {
  run_result whole, elastic;
  run_sgd("whole", 4, &whole, "--elastic");
  int code = run_sgd_status("elastic", 4, &elastic,
                            (const char *const[]){"--min-np", "2", SMALL_RUN, "--elastic",
                                                  "--fail-rank", "2", "--fail-step", "100", NULL});
  ck_assert_msg(code == 0, "elastic sgd: expected exit 0, got %d; output:\n%s", code,
                tail(elastic.output));
  ck_assert_msg(strstr(elastic.output, "the job goes on with 3 ranks (--min-np 2)") &&
                    strstr(elastic.output, "lost a rank") &&
                    strstr(elastic.output, "going on with 3 of 4 from epoch 2, step 35"),
                "expected hooprun and rank 0 to report the loss and the place it resumed:\n%s",
                tail(elastic.output));
  ck_assert_msg(elastic.epochs == whole.epochs, "expected %d epoch lines, got %d:\n%s",
                whole.epochs, elastic.epochs, tail(elastic.output));
  for (int e = 1; e < elastic.epochs; e++)
    ck_assert_msg(elastic.loss[e] < elastic.loss[e - 1],
                  "expected the loss to keep falling: epoch %d %g, epoch %d %g", e,
                  elastic.loss[e - 1], e + 1, elastic.loss[e]);
  int last = whole.epochs - 1;
  ck_assert_msg(fabs(elastic.loss[last] - whole.loss[last]) < 0.02,
                "expected the final loss near the unbroken run's %g, got %g", whole.loss[last],
                elastic.loss[last]);
  assert_ranks_identical("elastic", 3);
  free_result(&whole);
  free_result(&elastic);
}
END_TEST

/* The same with a replacement (hooprun --max-np 4): it joins the survivors between two epochs, and
 * the run ends with four bit-identical replicas again. The survivors take it in at the first
 * epoch's end after it has registered, and finish without it if none is left: 16384 examples give
 * it the seven epochs after the failure, about 0.4 s here, to start (with 4096, about 0.1 s, one CI
 * run in many ended before the replacement had registered). */
START_TEST(test_elastic_takes_in_a_replacement) {
  run_result run;
  int code =
      run_sgd_status("grown", 4, &run,
                     (const char *const[]){"--min-np", "2", "--max-np", "4", "--synthetic", "16384",
                                           "--epochs", "8", "--hidden", "32", "--elastic",
                                           "--fail-rank", "2", "--fail-step", "100", NULL});
  ck_assert_msg(code == 0, "elastic sgd with a replacement: expected exit 0, got %d; output:\n%s",
                code, tail(run.output));
  ck_assert_msg(strstr(run.output, "started a replacement for rank 2") &&
                    (strstr(run.output, "took in 1 newcomer: going on with 4 ranks") ||
                     strstr(run.output, "going on with 4 of 4")),
                "expected the replacement to be started and taken in:\n%s", tail(run.output));
  ck_assert_int_eq(run.epochs, 8);
  assert_learns(&run, 0.40, 80.0);
  assert_ranks_identical("grown", 4);
  free_result(&run);
}
END_TEST

/* A replacement that starts after the survivors' last chance to take it in (here it sleeps 2 s
 * first; the run takes a few tenths of a second): the rendezvous server tells it at once that the
 * job has ended, it says so and exits 0, hooprun starts no replacement for it, and the job ends
 * then, not at the 60 s timeout (the wait the replacement had before: nothing listened for it). */
START_TEST(test_elastic_replacement_that_comes_late) {
  run_result run;
  double start = procs_now();
  int code = run_sgd_wrapped("late", 4, &run,
                             (const char *const[]){"--min-np", "2", "--max-np", "4", SMALL_RUN,
                                                   "--elastic", "--fail-rank", "2", "--fail-step",
                                                   "20", NULL},
                             "if [ \"$HOOP_JOIN\" = 1 ]; then sleep 2; fi; exec \"$0\" \"$@\"");
  double took = procs_now() - start;
  ck_assert_msg(code == 0, "expected exit 0, got %d; output:\n%s", code, tail(run.output));
  ck_assert_msg(strstr(run.output, "started a replacement for rank 2") &&
                    strstr(run.output, "the run ended before it took in this newcomer") &&
                    strstr(run.output, "ended before it took its newcomers") &&
                    !strstr(run.output, "started a replacement for rank 4"),
                "expected the late replacement to be told that the job had ended, and no "
                "replacement for it:\n%s",
                tail(run.output));
  ck_assert_msg(took < 30.0, "the job took %.1f s: it waited for the late replacement", took);
  ck_assert_int_eq(run.epochs, 4);
  assert_ranks_identical("late", 3);
  free_result(&run);
}
END_TEST

START_TEST(test_idx_truncated_is_refused) {
  write_quadrants("train", 40, 1);
  uint8_t labels[39] = {0};
  uint32_t count = 40; /* the header says 40, the file holds 39 */
  write_idx("short-labels", &count, 1, labels, sizeof labels);
  char train_images[256], short_labels[256];
  snprintf(train_images, sizeof train_images, "%s", work_path("train-images"));
  snprintf(short_labels, sizeof short_labels, "%s", work_path("short-labels"));
  run_result run;
  int code = run_sgd_status(
      "bad", 2, &run,
      (const char *const[]){"--train-images", train_images, "--train-labels", short_labels, NULL});
  ck_assert_msg(code == 1, "expected exit 1 for a truncated label file, got %d:\n%s", code,
                tail(run.output));
  ck_assert_msg(strstr(run.output, "the header announces 40 bytes of data, the file holds 39"),
                "expected the error to say what is wrong with the file:\n%s", tail(run.output));
  free_result(&run);
}
END_TEST

static Suite *sgd_suite(void) {
  Suite *s = suite_create("sgd");
  TCase *tc = tcase_create("training");
  tcase_add_checked_fixture(tc, make_workdir, remove_workdir);
  tcase_set_timeout(tc, 2 * RUN_TIMEOUT_S);
  tcase_add_test(tc, test_ranks_hold_identical_params);
  tcase_add_test(tc, test_one_rank_equals_four);
  tcase_add_test(tc, test_uneven_batch_slices);
  tcase_add_test(tc, test_fusion_keeps_the_math);
  tcase_add_test(tc, test_overlap_keeps_the_math);
  tcase_add_test(tc, test_mlp_loss_falls);
  tcase_add_test(tc, test_softmax_loss_falls);
  tcase_add_test(tc, test_fp16_close_to_fp32);
  tcase_add_test(tc, test_idx_files);
  tcase_add_test(tc, test_idx_truncated_is_refused);
  tcase_add_test(tc, test_elastic_goes_on_without_a_lost_rank);
  tcase_add_test(tc, test_elastic_takes_in_a_replacement);
  tcase_add_test(tc, test_elastic_replacement_that_comes_late);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  SRunner *sr = srunner_create(sgd_suite());
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
