/* vmm.h - private to lib/mem/cuda/: CUDA IPC of the virtual memory management API's memory
 * (cuMemCreate and cuMemMap), shared by ipc.c (exports and their cache), vmm.c (allocations
 * exported as file descriptors, a peer's mapped) and vmm_server.c (the descriptors passed over a
 * Unix socket). Only for a build with CUDA (HOOP_HAVE_CUDA).
 */
#ifndef HOOP__MEM_CUDA_VMM_H
#define HOOP__MEM_CUDA_VMM_H

#include <stddef.h>
#include <stdint.h>

#include "mem/cuda.h"
#include "mem/cuda/driver.h"

/* A peer's piece count, which nothing has checked yet. */
static inline int hoop__cuda_pieces_of(const hoop__cuda_export *export) {
  return export->npieces < 0                       ? 0
         : export->npieces > HOOP__CUDA_VMM_PIECES ? HOOP__CUDA_VMM_PIECES
                                                   : export->npieces;
}

/* ---- vmm.c */

/* Whether the driver has every call of the virtual memory management API that IPC uses. */
int hoop__cuda_vmm_calls(void);
/* The VMM allocation mapped at start (its context current), exported as a file descriptor into
 * *fd, its handle (its identity) into *id: 0, or -1 with why. */
int hoop__cuda_vmm_export_piece(CUdeviceptr start, int *fd, uint64_t *id, char *why, size_t whylen);
/* The buffer id of the memory at ptr (0 if the driver cannot say). */
uint64_t hoop__cuda_buffer_id_at(CUdeviceptr ptr);
/* The VMM allocations that hold [ptr, ptr + len), mapped one after the other (cuMemGetAddressRange
 * gives each mapped region; the pointer attributes give the whole reserved range), each exported
 * (their context current): 0, or -1 with why. */
int hoop__cuda_vmm_export(const void *ptr, size_t len, hoop__cuda_export *out, char *why,
                          size_t whylen);
/* Whether every piece of a cached VMM export is still the allocation mapped there. */
int hoop__cuda_vmm_still_mapped(const hoop__cuda_export *export);
/* Map a peer's VMM export into the current context (that of near), its pieces one after the
 * other as in the exporter: 0, or -1 with why. */
int hoop__cuda_vmm_open(const void *near, const hoop__cuda_export *export, CUdeviceptr *mapped,
                        char *why, size_t whylen);
/* Unmap the first n pieces of a VMM export mapped at base, and free the range. */
void hoop__cuda_vmm_unmap(CUdeviceptr base, const hoop__cuda_export *export, int n);

/* ---- vmm_server.c */

/* This process's descriptor server, started if need be: 0 with its nonce, or -1 with why. */
int hoop__cuda_fd_server_start(uint64_t *nonce, char *why, size_t whylen);
/* A connection to the descriptor server of export's process: >= 0, or -1 with why. */
int hoop__cuda_fd_server_connect(const hoop__cuda_export *export, char *why, size_t whylen);
/* The descriptor of one piece, from the server at sock (non-blocking): >= 0, or -1 with why. */
int hoop__cuda_fd_server_ask(int sock, const hoop__cuda_export *export,
                             const hoop__cuda_vmm_piece *piece, char *why, size_t whylen);

/* ---- ipc.c */

/* Whether a piece with this identity (its address, allocation handle and buffer id) belongs to an
 * export of this process's cache made with token (the peers of the call that sent it know it;
 * nobody else does). */
int hoop__cuda_exported_piece(const uint64_t token[2], uint64_t start, uint64_t handle,
                              uint64_t buffer_id);

#endif /* HOOP__MEM_CUDA_VMM_H */
