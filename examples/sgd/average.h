/* average.h - averaging the gradients of every rank with hoop_allreduce, the one step that makes
 * training data-parallel. Small tensors are packed into one fusion buffer so that a step makes
 * few allreduce calls (Horovod's tensor fusion), and the buffer may travel as float16 (Horovod's
 * Compression.fp16). */
#ifndef SGD_AVERAGE_H
#define SGD_AVERAGE_H

#include <stddef.h>

#include "hoop.h"
#include "model.h"

/* Consecutive tensors that travel in one allreduce. */
typedef struct fusion_group {
  int first, end;  /* tensors[first..end) */
  size_t elements; /* their element count together */
} fusion_group;

typedef struct averager {
  hoop_comm *comm;
  hoop_dtype wire_dtype; /* HOOP_FLOAT32, or HOOP_FLOAT16 with --fp16-allreduce */
  fusion_group groups[MODEL_MAX_TENSORS];
  int ngroups;              /* allreduce calls per step */
  void *buffer;             /* the fusion buffer: room for the largest group in wire_dtype */
  int compress;             /* the wire format between hosts (--compress), 0 for none */
  hoop_mem_handle handle;   /* the buffer's registration, where compress keeps error feedback */
  double allreduce_seconds; /* spent in hoop_allreduce */
  double packing_seconds;   /* spent copying into and out of the buffer */
} averager;

/* Plan the groups for these tensors: each group holds as many consecutive tensors as fit in
 * fusion_bytes, and at least one (a larger tensor travels alone); fusion_bytes 0 gives one
 * allreduce per tensor. Return 0, or -1 when the buffer cannot be allocated. */
int averager_init(averager *a, hoop_comm *comm, const tensor *tensors, int ntensors,
                  size_t fusion_bytes, int fp16);
/* Send every group compressed in format between hosts (hoop_compress_next); with
 * HOOP_COMPRESS_FEEDBACK the fusion buffer is registered, so that what one step's compression
 * dropped is added to the next step's. */
hoop_result averager_compress(averager *a, int format);

/* Replace each tensor's grad (this rank's sum over its examples) by the sum over every rank's
 * examples divided by global_batch: the mean gradient of the global batch. */
hoop_result averager_run(averager *a, tensor *tensors, size_t global_batch);

void averager_free(averager *a);

#endif
