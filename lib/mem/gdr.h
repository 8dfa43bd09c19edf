/* gdr.h - GPUDirect RDMA: may the RDMA device read and write a GPU buffer directly? Decided for
 * each buffer hoop_register is given in device memory, in NCCL's order:
 *   1. HOOP_GDR=0: no (turned off);
 *   2. dma-buf: the GPU's CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED, then a dma-buf fd for the
 *      buffer's range widened to whole pages (cuMemGetHandleForAddressRange), then a probe
 *      registration of it (ibv_reg_dmabuf_mr) that tells "unsupported" (EOPNOTSUPP and kin: the
 *      NIC or its driver cannot, as soft-RoCE's rxe cannot) from a success, which is kept as the
 *      registration;
 *   3. nvidia-peermem (the kernel module that lets ibv_reg_mr take GPU memory): loaded, and an
 *      ibv_reg_mr of the buffer succeeds;
 *   4. else no: the buffer goes through host memory (mem/stage.c), which every transport serves.
 * HOOP_GDR=1 makes "no" an error of hoop_register instead. Each rank decides for its own buffers;
 * the verbs protocol agrees per message on how data moves, so ranks that decided differently
 * still work together.
 *
 * The decision asks the driver and verbs through hoop__gdr_ops, so that tests/test_gdr.c can play
 * every answer; transports/ibverbs/mr.c gives the real calls. */
#ifndef HOOP__MEM_GDR_H
#define HOOP__MEM_GDR_H

#include <stddef.h>
#include <stdint.h>

typedef enum hoop__gdr_kind {
  HOOP__GDR_NONE = 0, /* through host memory */
  HOOP__GDR_DMABUF,   /* registered through a dma-buf fd */
  HOOP__GDR_PEERMEM,  /* registered by ibv_reg_mr, with nvidia-peermem */
} hoop__gdr_kind;

typedef struct hoop__gdr_ops {
  void *arg;
  /* The GPU's dma-buf attribute for device memory at ptr: 1, 0, or -1 when unknown. */
  int (*dmabuf_supported)(void *arg, const void *ptr);
  /* A dma-buf fd for [base, base + len) (page-aligned): 0 with *fd, or -1 with why. */
  int (*dmabuf_fd)(void *arg, const void *base, size_t len, int *fd, char *why, size_t whylen);
  /* ibv_reg_dmabuf_mr(pd, offset, len, iova, fd): the MR, or NULL with *err (an errno). */
  void *(*reg_dmabuf)(void *arg, int fd, uint64_t offset, size_t len, uint64_t iova, int *err);
  /* Whether nvidia-peermem is loaded. */
  int (*peermem_loaded)(void *arg);
  /* ibv_reg_mr of device memory: the MR, or NULL with *err. */
  void *(*reg_mr)(void *arg, void *ptr, size_t len, int *err);
  void (*close_fd)(void *arg, int fd);
} hoop__gdr_ops;

/* setting: HOOP_GDR as -1 (auto), 0 or 1. For device memory [ptr, ptr + len): the kind, with *mr
 * the registration (NULL for NONE) and why saying what was found (logged at info). page: the
 * host page size the dma-buf range is widened to. */
hoop__gdr_kind hoop__gdr_decide(const hoop__gdr_ops *ops, int setting, void *ptr, size_t len,
                                size_t page, void **mr, char *why, size_t whylen);

/* HOOP_GDR: -1 auto, 0, 1; -2 when it is none of auto, 0, 1 (then why says so). */
int hoop__gdr_setting(char *why, size_t whylen);

#endif /* HOOP__MEM_GDR_H */
