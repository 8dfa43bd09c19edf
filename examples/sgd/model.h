/* model.h - the two models of the example: a softmax classifier (one dense layer) and an MLP with
 * one hidden ReLU layer, both trained with cross-entropy loss and SGD with momentum. The model
 * knows nothing about ranks: sgd.c averages the gradients between backward and step. */
#ifndef SGD_MODEL_H
#define SGD_MODEL_H

#include <stddef.h>
#include <stdint.h>

/* One parameter tensor: its values, the gradient summed over this step's examples, and the
 * momentum buffer. Each lives in its own allocation, as in a framework; that is what makes tensor
 * fusion (average.c) worth doing. */
typedef struct tensor {
  const char *name; /* "W1", "b1", ... */
  size_t count;     /* elements */
  float *value;
  float *grad;
  float *velocity;
} tensor;

#define MODEL_MAX_TENSORS 4

typedef struct model {
  size_t inputs, hidden, classes; /* hidden == 0: softmax classifier */
  int ntensors;                   /* 2 (W, b) or 4 (W1, b1, W2, b2) */
  tensor tensors[MODEL_MAX_TENSORS];
  /* Scratch space for one example. */
  float *hidden_out;   /* ReLU(W1 x + b1) */
  float *logits;       /* W x + b, then d loss / d logits */
  float *group_inputs; /* MODEL_GROUP examples' inputs, interleaved */
  float *group_hidden; /* their hidden outputs */
} model;

/* Examples whose hidden outputs are computed together. */
#define MODEL_GROUP 4

/* Allocate the tensors and draw initial weights from (seed, rank): each rank starts from different
 * weights, as independent processes do, until rank 0's are broadcast. Return 0, or -1 when out of
 * memory. */
int model_init(model *m, size_t inputs, size_t hidden, size_t classes, uint64_t seed, int rank);

size_t model_parameter_count(const model *m);

void model_zero_grad(model *m);

/* Forward and backward passes over a batch of n examples (xs[i], labels[i]), adding d loss /
 * d parameters to each tensor's grad, split so that gradients can travel while later ones are
 * computed (sgd --overlap). model_backward_top runs every example's forward pass and adds the
 * gradients of the output layer and of the hidden layer's bias (for the softmax classifier: all
 * of them), keeping each example's gradient at the hidden layer in hidden_grads (n * hidden
 * floats), and returns the batch's summed cross-entropy loss; model_backward_rows then adds the
 * hidden weights' gradients for rows [first, end) (hidden units). Each gradient element sums its
 * examples' terms in their order, however the rows are split, so the results are the same bits. */
double model_backward_top(model *m, const float *const *xs, const int *labels, size_t n,
                          float *hidden_grads);
void model_backward_rows(model *m, const float *const *xs, size_t n, const float *hidden_grads,
                         size_t first, size_t end);

/* The most likely class of each of the n examples stored one after another from x. */
void model_predict(model *m, const float *x, size_t n, int *classes);

/* SGD with momentum, as PyTorch does it: velocity = momentum * velocity + grad;
 * value -= lr * velocity. */
void model_step(model *m, float lr, float momentum);

/* Write every tensor's values, in order, as raw float32 in host byte order. Return 0 or -1. */
int model_save(const model *m, const char *path);

void model_free(model *m);

#endif
