/* model.c - forward and backward passes, one example at a time, written out by hand: dense layers,
 * ReLU, softmax with cross-entropy, and the momentum step. */
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
  m->hidden_grad = calloc(hidden ? hidden : 1, sizeof *m->hidden_grad);
  m->logits = calloc(classes, sizeof *m->logits);
  if (failed || !m->hidden_out || !m->hidden_grad || !m->logits) {
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

/* The forward pass; leaves the logits in m->logits and returns the input of the output layer. */
static const float *forward(model *m, const float *x) {
  if (m->hidden == 0) {
    dense_forward(&m->tensors[0], &m->tensors[1], x, m->inputs, m->logits, m->classes);
    return x;
  }
  dense_forward(&m->tensors[0], &m->tensors[1], x, m->inputs, m->hidden_out, m->hidden);
  for (size_t j = 0; j < m->hidden; j++)
    m->hidden_out[j] = m->hidden_out[j] > 0 ? m->hidden_out[j] : 0;
  dense_forward(&m->tensors[2], &m->tensors[3], m->hidden_out, m->hidden, m->logits, m->classes);
  return m->hidden_out;
}

double model_train_example(model *m, const float *x, int label) {
  const float *top_in = forward(m, x);
  double loss = softmax_cross_entropy(m->logits, m->classes, label);
  if (m->hidden == 0) {
    dense_backward(&m->tensors[0], &m->tensors[1], x, m->inputs, m->logits, m->classes, NULL);
    return loss;
  }
  dense_backward(&m->tensors[2], &m->tensors[3], top_in, m->hidden, m->logits, m->classes,
                 m->hidden_grad);
  /* ReLU passes the gradient where its input was positive. */
  for (size_t j = 0; j < m->hidden; j++)
    m->hidden_grad[j] = m->hidden_out[j] > 0 ? m->hidden_grad[j] : 0;
  dense_backward(&m->tensors[0], &m->tensors[1], x, m->inputs, m->hidden_grad, m->hidden, NULL);
  return loss;
}

double model_backward_top(model *m, const float *const *xs, const int *labels, size_t n,
                          float *hidden_grads) {
  double loss = 0;
  for (size_t e = 0; e < n; e++) {
    const float *top_in = forward(m, xs[e]);
    loss += softmax_cross_entropy(m->logits, m->classes, labels[e]);
    if (m->hidden == 0) {
      dense_backward(&m->tensors[0], &m->tensors[1], xs[e], m->inputs, m->logits, m->classes, NULL);
      continue;
    }
    float *grad = hidden_grads + e * m->hidden;
    dense_backward(&m->tensors[2], &m->tensors[3], top_in, m->hidden, m->logits, m->classes, grad);
    for (size_t j = 0; j < m->hidden; j++) {
      grad[j] = m->hidden_out[j] > 0 ? grad[j] : 0;
      m->tensors[1].grad[j] += grad[j];
    }
  }
  return loss;
}

void model_backward_rows(model *m, const float *const *xs, size_t n, const float *hidden_grads,
                         size_t first, size_t end) {
  tensor *w = &m->tensors[0];
  for (size_t e = 0; e < n; e++) {
    const float *grad = hidden_grads + e * m->hidden, *x = xs[e];
    for (size_t o = first; o < end; o++) {
      float *grad_row = w->grad + o * m->inputs;
      for (size_t i = 0; i < m->inputs; i++)
        grad_row[i] += grad[o] * x[i];
    }
  }
}

int model_predict(model *m, const float *x) {
  forward(m, x);
  int best = 0;
  for (size_t c = 1; c < m->classes; c++)
    if (m->logits[c] > m->logits[best])
      best = (int)c;
  return best;
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
  free(m->hidden_grad);
  free(m->hidden_out);
  memset(m, 0, sizeof *m);
}
