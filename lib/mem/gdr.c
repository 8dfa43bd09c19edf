/* gdr.c - the GPUDirect RDMA decision (see gdr.h). */
#include "mem/gdr.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "core/env.h"

int hoop__gdr_setting(char *why, size_t whylen) {
  const char *text = hoop__env_get("HOOP_GDR");
  if (strcmp(text, "auto") == 0)
    return -1;
  if (strcmp(text, "0") == 0 || strcmp(text, "1") == 0)
    return text[0] - '0';
  snprintf(why, whylen, "HOOP_GDR '%s' is not auto, 0 or 1", text);
  return -2;
}

/* errno values by which a registration says the device or its driver cannot do it at all. */
static int unsupported(int err) {
  return err == EOPNOTSUPP || err == ENOTSUP || err == EPROTONOSUPPORT || err == ENOSYS;
}

hoop__gdr_kind hoop__gdr_decide(const hoop__gdr_ops *ops, int setting, void *ptr, size_t len,
                                size_t page, void **mr, char *why, size_t whylen) {
  *mr = NULL;
  if (setting == 0) {
    snprintf(why, whylen, "GPUDirect RDMA turned off by HOOP_GDR=0");
    return HOOP__GDR_NONE;
  }
  char dmabuf[256] = "";
  int attr = ops->dmabuf_supported(ops->arg, ptr);
  if (attr <= 0) {
    snprintf(dmabuf, sizeof dmabuf, "the GPU %s dma-buf",
             attr == 0 ? "does not support" : "cannot say whether it supports");
  } else {
    /* The range in whole pages, as the dma-buf export wants it; the MR covers the buffer. */
    uintptr_t start = (uintptr_t)ptr, base = start & ~(uintptr_t)(page - 1);
    uintptr_t end = (start + len + page - 1) & ~(uintptr_t)(page - 1);
    int fd = -1;
    char fd_why[160] = "";
    if (ops->dmabuf_fd(ops->arg, (const void *)base, end - base, &fd, fd_why, sizeof fd_why) != 0) {
      snprintf(dmabuf, sizeof dmabuf, "no dma-buf fd for the buffer (%s)", fd_why);
    } else {
      int err = 0;
      *mr = ops->reg_dmabuf(ops->arg, fd, start - base, len, start, &err);
      ops->close_fd(ops->arg, fd);
      if (*mr) {
        snprintf(why, whylen,
                 "GPUDirect RDMA through dma-buf: %zu bytes at %p registered (pages from %p)", len,
                 ptr, (void *)base);
        return HOOP__GDR_DMABUF;
      }
      snprintf(dmabuf, sizeof dmabuf, "the RDMA device %s dma-buf (ibv_reg_dmabuf_mr: %s)",
               unsupported(err) ? "does not support" : "refused", strerror(err));
    }
  }
  if (!ops->peermem_loaded(ops->arg)) {
    snprintf(why, whylen, "no GPUDirect RDMA: %s, and nvidia-peermem is not loaded", dmabuf);
    return HOOP__GDR_NONE;
  }
  int err = 0;
  *mr = ops->reg_mr(ops->arg, ptr, len, &err);
  if (*mr) {
    snprintf(why, whylen, "GPUDirect RDMA through nvidia-peermem: %zu bytes at %p registered", len,
             ptr);
    return HOOP__GDR_PEERMEM;
  }
  snprintf(why, whylen,
           "no GPUDirect RDMA: %s, and ibv_reg_mr of GPU memory failed with nvidia-peermem "
           "loaded (%s)",
           dmabuf, strerror(err));
  return HOOP__GDR_NONE;
}
