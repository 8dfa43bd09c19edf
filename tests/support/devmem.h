/* devmem.h - test buffers in CUDA device memory, allocated through the driver that hoop loads
 * (HOOP_CUDA_LIBRARY: the real libcuda.so.1 on a GPU machine, tests/.libs/libfakecuda.so where
 * there is none), so that the collectives suites run on device buffers. No CUDA header needed.
 * DEVMEM_VMM=1 (or noexport) allocates through the virtual memory management API (devmem.c). */
#ifndef HOOP_TEST_DEVMEM_H
#define HOOP_TEST_DEVMEM_H

#include <stddef.h>

/* Load the driver, cuInit, make device 0's primary context current. 0, or -1 with why in msg. */
int devmem_init(char *msg, size_t msglen);
/* Make devmem_init's context current in the calling thread (CUDA's is per thread). */
void devmem_attach(void);
/* Device memory holding a copy of host's bytes (host may be NULL: contents undefined). */
void *devmem_put(const void *host, size_t bytes);
/* The same, the copy queued on stream (NULL: the legacy default stream) and not waited for: a
 * program's GPU work still writing a collective's input when it calls (host must stay unchanged
 * until then). */
void *devmem_put_late(const void *host, size_t bytes, void *stream);
/* Copy bytes of host into device memory. */
void devmem_upload(void *dev, const void *host, size_t bytes);
/* Copy bytes of device memory back to host, through a non-blocking stream of its own that waits
 * for nothing else: the bytes a plain collective left there must be complete when it returned,
 * whatever stream the program reads them with. */
void devmem_get(void *host, const void *dev, size_t bytes);
void devmem_free(void *dev);
/* Queue a device-to-device copy (it may run after the call returns), and wait for all the
 * context's work. */
void devmem_copy(void *dst, const void *src, size_t bytes);
void devmem_sync(void);
/* A stream of the context (cuStreamCreate), for the stream-ordered calls. */
void *devmem_stream(void);

#endif
