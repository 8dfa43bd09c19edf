/* stubs.c - what a build without CUDA (configure --without-cuda, or no cuda.h found) provides for
 * cuda.h: every pointer is host memory, and every device operation says this libhoop was built
 * without CUDA.
 */
#include "config.h"

#ifndef HOOP_HAVE_CUDA

#include <stdio.h>
#include <string.h>

#include "core/internal.h"
#include "mem/cuda.h"

int hoop__cuda_loaded(void) {
  return 0;
}

hoop__mem_kind hoop__mem_kind_of(const void *ptr) {
  (void)ptr;
  return HOOP__MEM_HOST;
}

hoop_result hoop__cuda_copy(hoop_comm *comm, void *dst, const void *src, size_t bytes) {
  (void)dst;
  (void)src;
  (void)bytes;
  return hoop__set_error(comm, HOOP_ERR_UNSUPPORTED, "this libhoop was built without CUDA");
}

hoop_result hoop__mem_copy(hoop_comm *comm, void *dst, const void *src, size_t bytes) {
  (void)comm;
  if (bytes)
    memmove(dst, src, bytes);
  return HOOP_OK;
}

int hoop__cuda_kernels_built(void) {
  return 0;
}

void *hoop__cuda_host_alloc(size_t bytes, const void *near) {
  (void)bytes, (void)near;
  return NULL;
}

void hoop__cuda_host_free(void *ptr) {
  (void)ptr;
}

hoop_result hoop__cuda_stream_wait(hoop_comm *comm, const char *call, void *stream,
                                   const void *buf) {
  (void)buf;
  if (!stream)
    return HOOP_OK;
  return hoop__set_error(comm, HOOP_ERR_UNSUPPORTED,
                         "%s: a CUDA stream, but this libhoop was built without CUDA", call);
}

hoop_result hoop__cuda_reduce3(hoop_comm *comm, void *dst, const void *a, const void *b,
                               size_t count, hoop_dtype dtype, hoop_op op) {
  (void)dst, (void)a, (void)b, (void)count, (void)dtype, (void)op;
  return hoop__set_error(comm, HOOP_ERR_UNSUPPORTED, "this libhoop was built without CUDA");
}

hoop__cuda_pipe *hoop__cuda_pipe_get(hoop_comm *comm, const void *ptr, int nevents) {
  (void)comm, (void)ptr, (void)nevents;
  return NULL;
}

hoop_result hoop__cuda_pipe_copy(hoop_comm *comm, hoop__cuda_pipe *pipe, void *dst, const void *src,
                                 size_t bytes, int event) {
  (void)pipe, (void)dst, (void)src, (void)bytes, (void)event;
  return hoop__set_error(comm, HOOP_ERR_UNSUPPORTED, "this libhoop was built without CUDA");
}

hoop_result hoop__cuda_pipe_wait(hoop_comm *comm, hoop__cuda_pipe *pipe, int event) {
  (void)pipe, (void)event;
  return hoop__set_error(comm, HOOP_ERR_UNSUPPORTED, "this libhoop was built without CUDA");
}

hoop_result hoop__cuda_pipe_drain(hoop_comm *comm, hoop__cuda_pipe *pipe) {
  (void)pipe;
  return hoop__set_error(comm, HOOP_ERR_UNSUPPORTED, "this libhoop was built without CUDA");
}

void hoop__cuda_pipe_free(hoop_comm *comm) {
  (void)comm;
}

int hoop__cuda_dmabuf_supported(const void *ptr) {
  (void)ptr;
  return -1;
}

int hoop__cuda_dmabuf_fd(const void *base, size_t len, int *fd, char *why, size_t whylen) {
  (void)base, (void)len, (void)fd;
  snprintf(why, whylen, "this libhoop was built without CUDA");
  return -1;
}

int hoop__cuda_gdr_flush_mode(const void *ptr, char *why, size_t whylen) {
  (void)ptr;
  snprintf(why, whylen, "this libhoop was built without CUDA");
  return -1;
}

hoop_result hoop__cuda_reduce_finish(hoop_comm *comm, void *buf, size_t count, hoop_dtype dtype,
                                     hoop_op op, int nranks) {
  (void)buf, (void)count, (void)dtype, (void)op, (void)nranks;
  return hoop__set_error(comm, HOOP_ERR_UNSUPPORTED, "this libhoop was built without CUDA");
}

int hoop__cuda_ipc_export(const void *ptr, size_t len, hoop__cuda_export *out, char *why,
                          size_t whylen) {
  (void)ptr, (void)len, (void)out;
  snprintf(why, whylen, "this libhoop was built without CUDA");
  return -1;
}

int hoop__cuda_ipc_open(const void *near, const hoop__cuda_export *export, void **base, char *why,
                        size_t whylen) {
  (void)near, (void)export, (void)base;
  snprintf(why, whylen, "this libhoop was built without CUDA");
  return -1;
}

void hoop__cuda_ipc_close(void *context, void *base, const hoop__cuda_export *export) {
  (void)context, (void)base, (void)export;
}

int hoop__cuda_export_same(const hoop__cuda_export *a, const hoop__cuda_export *b) {
  return memcmp(a, b, sizeof *a) == 0;
}

int hoop__cuda_export_conflict(const hoop__cuda_export *a, const hoop__cuda_export *b) {
  (void)a, (void)b;
  return 0;
}

void *hoop__cuda_context_of(const void *ptr) {
  (void)ptr;
  return NULL;
}

hoop_result hoop__cuda_reduce3_async(hoop_comm *comm, void *dst, const void *a, const void *b,
                                     size_t count, hoop_dtype dtype, hoop_op op) {
  return hoop__cuda_reduce3(comm, dst, a, b, count, dtype, op);
}

hoop_result hoop__cuda_finish_async(hoop_comm *comm, void *buf, size_t count, hoop_dtype dtype,
                                    hoop_op op, int nranks) {
  return hoop__cuda_reduce_finish(comm, buf, count, dtype, op, nranks);
}

hoop_result hoop__cuda_reduce_many_async(hoop_comm *comm, void *dst, const void *const *srcs,
                                         int nsrcs, size_t count, hoop_dtype dtype, hoop_op op,
                                         int divide) {
  (void)dst, (void)srcs, (void)nsrcs, (void)count, (void)dtype, (void)op, (void)divide;
  return hoop__set_error(comm, HOOP_ERR_UNSUPPORTED, "this libhoop was built without CUDA");
}

hoop_result hoop__cuda_reduce_tree_async(hoop_comm *comm, void *dst, const void *const *srcs,
                                         int nsrcs, size_t count, hoop_dtype dtype, hoop_op op,
                                         int divide) {
  return hoop__cuda_reduce_many_async(comm, dst, srcs, nsrcs, count, dtype, op, divide);
}

hoop_result hoop__cuda_copy_async(hoop_comm *comm, void *dst, const void *src, size_t bytes) {
  return hoop__cuda_copy(comm, dst, src, bytes);
}

hoop_result hoop__cuda_sync(hoop_comm *comm, const void *near) {
  (void)near;
  return hoop__set_error(comm, HOOP_ERR_UNSUPPORTED, "this libhoop was built without CUDA");
}

hoop_result hoop__cuda_sync_busy(hoop_comm *comm, const void *near,
                                 hoop_result (*meanwhile)(hoop_comm *comm)) {
  (void)near, (void)meanwhile;
  return hoop__set_error(comm, HOOP_ERR_UNSUPPORTED, "this libhoop was built without CUDA");
}

void *hoop__cuda_alloc(size_t bytes, const void *near) {
  (void)bytes, (void)near;
  return NULL;
}

hoop_result hoop__cuda_ready(hoop_comm *comm, const void *near, int kernels) {
  (void)near, (void)kernels;
  return hoop__set_error(comm, HOOP_ERR_UNSUPPORTED, "this libhoop was built without CUDA");
}

void hoop__cuda_free(void *ptr) {
  (void)ptr;
}

#endif /* !HOOP_HAVE_CUDA */
