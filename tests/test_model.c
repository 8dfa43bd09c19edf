/* test_model.c - examples/sgd's batched forward and backward passes (model.c: four examples and
 * four rows at a time in vector lanes, row blocks, ReLU's zeros skipped) against a plain reference
 * written here one example at a time, on sizes that are not multiples of the lanes, the groups or
 * the row blocks: the gradients, the loss and the predictions must be the same bits, however the
 * hidden rows are split. */
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "model.h"
#include "rng.h"

/* The reference: the per-example loops model.c had before it was batched. */
typedef struct reference {
  size_t inputs, hidden, classes;
  const float *w1, *b1, *w2, *b2;
  float *g_w1, *g_b1, *g_w2, *g_b2;
} reference;

static void ref_dense(const float *w, const float *b, const float *in, size_t nin, float *out,
                      size_t nout) {
  for (size_t o = 0; o < nout; o++) {
    float sum = b[o];
    for (size_t i = 0; i < nin; i++)
      sum += w[o * nin + i] * in[i];
    out[o] = sum;
  }
}

/* Adds one example's gradients; returns its loss and its predicted class in *best. */
static double ref_example(reference *r, const float *x, int label, int *best) {
  float h[64], logits[16], dh[64];
  ref_dense(r->w1, r->b1, x, r->inputs, h, r->hidden);
  for (size_t j = 0; j < r->hidden; j++)
    h[j] = h[j] > 0 ? h[j] : 0;
  ref_dense(r->w2, r->b2, h, r->hidden, logits, r->classes);
  *best = 0;
  for (size_t c = 1; c < r->classes; c++)
    if (logits[c] > logits[*best])
      *best = (int)c;
  float top = logits[0];
  for (size_t c = 1; c < r->classes; c++)
    top = logits[c] > top ? logits[c] : top;
  double total = 0;
  for (size_t c = 0; c < r->classes; c++)
    total += exp((double)(logits[c] - top));
  double loss = log(total) - (double)(logits[label] - top);
  for (size_t c = 0; c < r->classes; c++)
    logits[c] =
        (float)(exp((double)(logits[c] - top)) / total) - (c == (size_t)label ? 1.0f : 0.0f);
  memset(dh, 0, sizeof dh);
  for (size_t o = 0; o < r->classes; o++) {
    for (size_t i = 0; i < r->hidden; i++)
      r->g_w2[o * r->hidden + i] += logits[o] * h[i];
    for (size_t i = 0; i < r->hidden; i++)
      dh[i] += r->w2[o * r->hidden + i] * logits[o];
    r->g_b2[o] += logits[o];
  }
  for (size_t j = 0; j < r->hidden; j++)
    dh[j] = h[j] > 0 ? dh[j] : 0;
  for (size_t o = 0; o < r->hidden; o++) {
    for (size_t i = 0; i < r->inputs; i++)
      r->g_w1[o * r->inputs + i] += dh[o] * x[i];
    r->g_b1[o] += dh[o];
  }
  return loss;
}

static void assert_same_bits(const char *what, const float *got, const float *want, size_t n) {
  size_t differ = 0, first = 0;
  for (size_t i = 0; i < n; i++)
    if (memcmp(got + i, want + i, sizeof(float)) != 0 && differ++ == 0)
      first = i;
  ck_assert_msg(differ == 0,
                "%s: %zu of %zu floats differ from the reference, first [%zu]: %a, want %a", what,
                differ, n, first, (double)got[first], (double)want[first]);
}

/* inputs, hidden, examples: none a multiple of 4 or 8 but some; 1 and 4 examples too. */
static const size_t shapes[][3] = {{37, 13, 7}, {784, 64, 16}, {5, 3, 1}, {12, 9, 4}, {31, 17, 11}};
#define NSHAPES (sizeof shapes / sizeof shapes[0])

START_TEST(test_batched_equals_reference) {
  size_t inputs = shapes[_i][0], hidden = shapes[_i][1], n = shapes[_i][2], classes = 10;
  model m;
  ck_assert_int_eq(model_init(&m, inputs, hidden, classes, 7, 0), 0);
  rng r;
  rng_seed(&r, 11, (uint64_t)_i);
  /* Biases away from zero too, so that some hidden units are off for every example. */
  for (size_t i = 0; i < hidden; i++)
    m.tensors[1].value[i] = (float)(rng_uniform(&r) - 0.5);
  for (size_t i = 0; i < classes; i++)
    m.tensors[3].value[i] = (float)(rng_uniform(&r) - 0.5);
  float *x = malloc(n * inputs * sizeof *x);
  const float **xs = malloc(n * sizeof *xs);
  int *labels = malloc(n * sizeof *labels), *classes_got = malloc(n * sizeof *classes_got);
  float *hidden_grads = malloc(n * hidden * sizeof *hidden_grads);
  ck_assert(x && xs && labels && classes_got && hidden_grads);
  for (size_t i = 0; i < n * inputs; i++)
    x[i] = (float)(rng_uniform(&r) * 2 - 0.5);
  for (size_t e = 0; e < n; e++) {
    xs[e] = x + e * inputs;
    labels[e] = (int)(rng_next(&r) % classes);
  }

  reference ref = {inputs,
                   hidden,
                   classes,
                   m.tensors[0].value,
                   m.tensors[1].value,
                   m.tensors[2].value,
                   m.tensors[3].value,
                   calloc(hidden * inputs, sizeof(float)),
                   calloc(hidden, sizeof(float)),
                   calloc(classes * hidden, sizeof(float)),
                   calloc(classes, sizeof(float))};
  ck_assert(ref.g_w1 && ref.g_b1 && ref.g_w2 && ref.g_b2);
  double ref_loss = 0;
  int *ref_best = malloc(n * sizeof *ref_best);
  for (size_t e = 0; e < n; e++)
    ref_loss += ref_example(&ref, xs[e], labels[e], &ref_best[e]);

  /* The rows in one go, then again in uneven slices: the same bits both times. */
  for (int split = 0; split < 2; split++) {
    model_zero_grad(&m);
    double loss = model_backward_top(&m, xs, labels, n, hidden_grads);
    if (!split) {
      model_backward_rows(&m, xs, n, hidden_grads, 0, hidden);
    } else {
      size_t cuts[] = {0, 1, hidden / 2, hidden / 2 + 1, hidden};
      for (int c = 0; c + 1 < 5; c++)
        if (cuts[c + 1] > cuts[c])
          model_backward_rows(&m, xs, n, hidden_grads, cuts[c], cuts[c + 1]);
    }
    ck_assert_msg(memcmp(&loss, &ref_loss, sizeof loss) == 0, "loss %.17g, reference %.17g", loss,
                  ref_loss);
    assert_same_bits("W1.grad", m.tensors[0].grad, ref.g_w1, hidden * inputs);
    assert_same_bits("b1.grad", m.tensors[1].grad, ref.g_b1, hidden);
    assert_same_bits("W2.grad", m.tensors[2].grad, ref.g_w2, classes * hidden);
    assert_same_bits("b2.grad", m.tensors[3].grad, ref.g_b2, classes);
  }
  model_predict(&m, x, n, classes_got);
  for (size_t e = 0; e < n; e++)
    ck_assert_msg(classes_got[e] == ref_best[e], "example %zu: predicted %d, reference %d", e,
                  classes_got[e], ref_best[e]);

  free(ref_best);
  free(ref.g_w1), free(ref.g_b1), free(ref.g_w2), free(ref.g_b2);
  free(hidden_grads), free(classes_got), free(labels), free(xs), free(x);
  model_free(&m);
}
END_TEST

int main(void) {
  Suite *s = suite_create("model");
  TCase *tc = tcase_create("batched");
  tcase_add_loop_test(tc, test_batched_equals_reference, 0, (int)NSHAPES);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? 1 : 0;
}
