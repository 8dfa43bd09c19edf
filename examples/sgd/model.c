/* model.c - forward and backward passes written out by hand: dense layers, ReLU, softmax with
 * cross-entropy, and the momentum step. Training runs a batch at a time, the hidden layer's
 * products four examples and four rows at once (GCC's vector extension: each lane sums its own
 * terms in the order a loop over one example would, so the bits are those of the plain loops). */
#include "model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rng.h"

/* ---- setting up ------------------------------------------------------------------------------ */

static int tensor_alloc(tensor *t, const char *name, size_t count) {
  t->name = name;
  t->count = count;
  t->value = calloc(count, sizeof *t->value);
  t->grad = calloc(count, sizeof *t->grad);
  t->velocity = calloc(count, sizeof *t->velocity);
  return t->value && t->grad && t->velocity ? 0 : -1;
}

/* Weights ~ N(0, gain / fan_in): He initialisation (gain 2) in front of a ReLU, LeCun's (gain 1)
 * in front of the softmax. Biases start at zero. */
static void init_weights(tensor *w, size_t fan_in, double gain, rng *r) {
  double std = sqrt(gain / (double)fan_in);
  for (size_t i = 0; i < w->count; i++)
    w->value[i] = (float)(std * rng_normal(r));
}

int model_init(model *m, size_t inputs, size_t hidden, size_t classes, uint64_t seed, int rank) {
  memset(m, 0, sizeof *m);
  m->inputs = inputs;
  m->hidden = hidden;
  m->classes = classes;
  int failed = 0;
  if (hidden == 0) {
    m->ntensors = 2;
    failed |= tensor_alloc(&m->tensors[0], "W", classes * inputs);
    failed |= tensor_alloc(&m->tensors[1], "b", classes);
  } else {
    m->ntensors = 4;
    failed |= tensor_alloc(&m->tensors[0], "W1", hidden * inputs);
    failed |= tensor_alloc(&m->tensors[1], "b1", hidden);
    failed |= tensor_alloc(&m->tensors[2], "W2", classes * hidden);
    failed |= tensor_alloc(&m->tensors[3], "b2", classes);
  }
  m->hidden_out = calloc(hidden ? hidden : 1, sizeof *m->hidden_out);
  m->logits = calloc(classes, sizeof *m->logits);
  /* Read as vectors of four floats, which want 16-byte alignment. */
  m->group_inputs = aligned_alloc(16, inputs * MODEL_GROUP * sizeof(float));
  m->group_hidden = calloc((hidden ? hidden : 1) * MODEL_GROUP, sizeof *m->group_hidden);
  if (failed || !m->hidden_out || !m->logits || !m->group_inputs || !m->group_hidden) {
    model_free(m);
    return -1;
  }
  rng r;
  rng_seed(&r, seed, 2000 + (uint64_t)rank);
  if (hidden == 0) {
    init_weights(&m->tensors[0], inputs, 1.0, &r);
  } else {
    init_weights(&m->tensors[0], inputs, 2.0, &r);
    init_weights(&m->tensors[2], hidden, 1.0, &r);
  }
  return 0;
}

size_t model_parameter_count(const model *m) {
  size_t count = 0;
  for (int i = 0; i < m->ntensors; i++)
    count += m->tensors[i].count;
  return count;
}

void model_zero_grad(model *m) {
  for (int i = 0; i < m->ntensors; i++)
    memset(m->tensors[i].grad, 0, m->tensors[i].count * sizeof *m->tensors[i].grad);
}

/* ---- layers ---------------------------------------------------------------------------------- */

/* out = W in + b, with W stored row by row (nout rows of nin). */
static void dense_forward(const tensor *w, const tensor *b, const float *in, size_t nin, float *out,
                          size_t nout) {
  for (size_t o = 0; o < nout; o++) {
    const float *row = w->value + o * nin;
    float sum = b->value[o];
    for (size_t i = 0; i < nin; i++)
      sum += row[i] * in[i];
    out[o] = sum;
  }
}

/* Given dout = d loss / d out: W.grad += dout in^T, b.grad += dout, and, when din is not NULL,
 * din = W^T dout for the layer below. */
static void dense_backward(tensor *w, tensor *b, const float *in, size_t nin, const float *dout,
                           size_t nout, float *din) {
  if (din)
    memset(din, 0, nin * sizeof *din);
  for (size_t o = 0; o < nout; o++) {
    float *grad_row = w->grad + o * nin;
    const float *row = w->value + o * nin;
    for (size_t i = 0; i < nin; i++)
      grad_row[i] += dout[o] * in[i];
    if (din)
      for (size_t i = 0; i < nin; i++)
        din[i] += row[i] * dout[o];
    b->grad[o] += dout[o];
  }
}

/* Cross-entropy of softmax(logits) against label. Replaces logits with d loss / d logits, which
 * is softmax(logits) - onehot(label). Subtracting the largest logit keeps exp() finite. */
static double softmax_cross_entropy(float *logits, size_t classes, int label) {
  float top = logits[0];
  for (size_t c = 1; c < classes; c++)
    top = logits[c] > top ? logits[c] : top;
  double total = 0;
  for (size_t c = 0; c < classes; c++)
    total += exp((double)(logits[c] - top));
  double loss = log(total) - (double)(logits[label] - top);
  for (size_t c = 0; c < classes; c++) {
    float probability = (float)(exp((double)(logits[c] - top)) / total);
    logits[c] = probability - (c == (size_t)label ? 1.0f : 0.0f);
  }
  return loss;
}

/* ---- the model ------------------------------------------------------------------------------- */

/* The hidden layer's output, ReLU(W1 x + b1), of one example, into out. */
static void hidden_forward_one(model *m, const float *x, float *out) {
  dense_forward(&m->tensors[0], &m->tensors[1], x, m->inputs, out, m->hidden);
  for (size_t o = 0; o < m->hidden; o++)
    out[o] = out[o] > 0 ? out[o] : 0;
}

/* The forward pass of one example; leaves the logits in m->logits. */
static void forward(model *m, const float *x) {
  if (m->hidden == 0) {
    dense_forward(&m->tensors[0], &m->tensors[1], x, m->inputs, m->logits, m->classes);
    return;
  }
  hidden_forward_one(m, x, m->hidden_out);
  dense_forward(&m->tensors[2], &m->tensors[3], m->hidden_out, m->hidden, m->logits, m->classes);
}

/* Four lanes of float: lane k carries example k of a group (forward) or input k of a run of four
 * (backward). Arithmetic on it is lane by lane, each lane rounded as a float would be. */
typedef float lanes __attribute__((vector_size(4 * sizeof(float))));
_Static_assert(MODEL_GROUP == 4, "a group's examples are the four lanes of one vector");

static lanes splat(float v) {
  return (lanes){v, v, v, v};
}

/* The hidden layer's outputs of the examples xs[0..MODEL_GROUP), into out[e * hidden + o], the
 * bits of hidden_forward_one's. The group's inputs are first laid out side by side (input i of
 * example k at group_inputs[i * 4 + k]), so that one pass over a row of W1 serves all four
 * examples; four rows go at once, so sixteen sums are under way. */
static void hidden_forward_group(model *m, const float *const *xs, float *out) {
  const tensor *w = &m->tensors[0], *b = &m->tensors[1];
  size_t nin = m->inputs, nh = m->hidden;
  lanes *in = (lanes *)m->group_inputs;
  for (size_t i = 0; i < nin; i++)
    in[i] = (lanes){xs[0][i], xs[1][i], xs[2][i], xs[3][i]};
  size_t o = 0;
  for (; o + 4 <= nh; o += 4) {
    const float *r0 = w->value + o * nin, *r1 = r0 + nin, *r2 = r1 + nin, *r3 = r2 + nin;
    lanes s0 = splat(b->value[o]), s1 = splat(b->value[o + 1]), s2 = splat(b->value[o + 2]),
          s3 = splat(b->value[o + 3]);
    for (size_t i = 0; i < nin; i++) {
      s0 += splat(r0[i]) * in[i];
      s1 += splat(r1[i]) * in[i];
      s2 += splat(r2[i]) * in[i];
      s3 += splat(r3[i]) * in[i];
    }
    lanes sums[4] = {s0, s1, s2, s3};
    for (size_t k = 0; k < 4; k++)
      for (size_t e = 0; e < MODEL_GROUP; e++)
        out[e * nh + o + k] = sums[k][e] > 0 ? sums[k][e] : 0;
  }
  for (; o < nh; o++) {
    const float *row = w->value + o * nin;
    lanes sum = splat(b->value[o]);
    for (size_t i = 0; i < nin; i++)
      sum += splat(row[i]) * in[i];
    for (size_t e = 0; e < MODEL_GROUP; e++)
      out[e * nh + o] = sum[e] > 0 ? sum[e] : 0;
  }
}

double model_backward_top(model *m, const float *const *xs, const int *labels, size_t n,
                          float *hidden_grads) {
  double loss = 0;
  if (m->hidden == 0) {
    for (size_t e = 0; e < n; e++) {
      forward(m, xs[e]);
      loss += softmax_cross_entropy(m->logits, m->classes, labels[e]);
      dense_backward(&m->tensors[0], &m->tensors[1], xs[e], m->inputs, m->logits, m->classes, NULL);
    }
    return loss;
  }
  /* Every example's hidden output first, into hidden_grads, which each example's gradient then
   * replaces (through hidden_out, as dense_backward's din must not be its input). */
  size_t e = 0;
  for (; e + MODEL_GROUP <= n; e += MODEL_GROUP)
    hidden_forward_group(m, xs + e, hidden_grads + e * m->hidden);
  for (; e < n; e++)
    hidden_forward_one(m, xs[e], hidden_grads + e * m->hidden);
  for (e = 0; e < n; e++) {
    float *grad = hidden_grads + e * m->hidden;
    memcpy(m->hidden_out, grad, m->hidden * sizeof *grad);
    dense_forward(&m->tensors[2], &m->tensors[3], m->hidden_out, m->hidden, m->logits, m->classes);
    loss += softmax_cross_entropy(m->logits, m->classes, labels[e]);
    dense_backward(&m->tensors[2], &m->tensors[3], m->hidden_out, m->hidden, m->logits, m->classes,
                   grad);
    /* ReLU passes the gradient where its input was positive. */
    for (size_t j = 0; j < m->hidden; j++) {
      grad[j] = m->hidden_out[j] > 0 ? grad[j] : 0;
      m->tensors[1].grad[j] += grad[j];
    }
  }
  return loss;
}

/* Rows of W1's gradient in blocks this many rows long (25 KiB of 784 inputs), which stay in the
 * cache while every example adds to them. */
#define ROW_BLOCK 8

/* y[i] += a * x[i], four at a time. */
static void add_scaled(float *restrict y, float a, const float *restrict x, size_t n) {
  size_t i = 0;
  lanes va = splat(a);
  for (; i + 4 <= n; i += 4) {
    lanes vx, vy;
    memcpy(&vx, x + i, sizeof vx);
    memcpy(&vy, y + i, sizeof vy);
    vy += va * vx;
    memcpy(y + i, &vy, sizeof vy);
  }
  for (; i < n; i++)
    y[i] += a * x[i];
}

void model_backward_rows(model *m, const float *const *xs, size_t n, const float *hidden_grads,
                         size_t first, size_t end) {
  tensor *w = &m->tensors[0];
  for (size_t block = first; block < end; block += ROW_BLOCK) {
    size_t block_end = end - block < ROW_BLOCK ? end : block + ROW_BLOCK;
    for (size_t e = 0; e < n; e++) {
      const float *grad = hidden_grads + e * m->hidden;
      for (size_t o = block; o < block_end; o++)
        /* A zero (ReLU's, half the rows) adds nothing: a sum that starts at +0 never turns -0,
         * and the inputs are finite, so skipping it leaves the same bits. */
        if (grad[o] != 0)
          add_scaled(w->grad + o * m->inputs, grad[o], xs[e], m->inputs);
    }
  }
}

static int most_likely(const model *m) {
  int best = 0;
  for (size_t c = 1; c < m->classes; c++)
    if (m->logits[c] > m->logits[best])
      best = (int)c;
  return best;
}

void model_predict(model *m, const float *x, size_t n, int *classes) {
  size_t e = 0;
  if (m->hidden) {
    const float *xs[MODEL_GROUP];
    for (; e + MODEL_GROUP <= n; e += MODEL_GROUP) {
      for (size_t k = 0; k < MODEL_GROUP; k++)
        xs[k] = x + (e + k) * m->inputs;
      hidden_forward_group(m, xs, m->group_hidden);
      for (size_t k = 0; k < MODEL_GROUP; k++) {
        dense_forward(&m->tensors[2], &m->tensors[3], m->group_hidden + k * m->hidden, m->hidden,
                      m->logits, m->classes);
        classes[e + k] = most_likely(m);
      }
    }
  }
  for (; e < n; e++) {
    forward(m, x + e * m->inputs);
    classes[e] = most_likely(m);
  }
}

void model_step(model *m, float lr, float momentum) {
  for (int i = 0; i < m->ntensors; i++) {
    tensor *t = &m->tensors[i];
    for (size_t k = 0; k < t->count; k++) {
      t->velocity[k] = momentum * t->velocity[k] + t->grad[k];
      t->value[k] -= lr * t->velocity[k];
    }
  }
}

int model_save(const model *m, const char *path) {
  FILE *file = fopen(path, "wb");
  if (!file)
    return -1;
  int result = 0;
  for (int i = 0; i < m->ntensors; i++)
    if (fwrite(m->tensors[i].value, sizeof(float), m->tensors[i].count, file) !=
        m->tensors[i].count)
      result = -1;
  if (fclose(file) != 0)
    result = -1;
  return result;
}

void model_free(model *m) {
  for (int i = 0; i < MODEL_MAX_TENSORS; i++) {
    free(m->tensors[i].velocity);
    free(m->tensors[i].grad);
    free(m->tensors[i].value);
  }
  free(m->logits);
  free(m->group_inputs);
  free(m->group_hidden);
  free(m->hidden_out);
  memset(m, 0, sizeof *m);
}
