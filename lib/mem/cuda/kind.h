/* kind.h - setting up the CUDA memory kind (mem/cuda/kind.c) for a call whose algorithm runs
 * on device memory: the path that chooses it says where the call's memory is and what it needs. */
#ifndef HOOP__MEM_CUDA_KIND_H
#define HOOP__MEM_CUDA_KIND_H

#include "core/internal.h"

/* Before comm->mem = &hoop__mem_cuda: the call's device memory is at near; flush: received data
 * must be flushed before the GPU reads it (hoop__cuda_gdr_flush_mode); registered: scratch must be
 * registered with every peer's transport (the network writes into it). HOOP_OK or the error. */
hoop_result hoop__cuda_kind_begin(hoop_comm *comm, const void *near, int flush, int registered);
/* Scratch of at least bytes, made now (a path makes it before every rank agrees to go its way, so
 * that the algorithm never fails to get it); NULL with the error recorded. */
void *hoop__cuda_kind_scratch(hoop_comm *comm, size_t bytes);
/* What an RDMA device wrote into the call's memory is visible to the GPU (a flush where needed). */
hoop_result hoop__cuda_kind_flushed(hoop_comm *comm);
/* Free the device scratch and the state (hoop_finalize, after the registrations are released). */
void hoop__cuda_kind_free(hoop_comm *comm);

#endif /* HOOP__MEM_CUDA_KIND_H */
