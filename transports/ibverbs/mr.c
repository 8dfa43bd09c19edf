/* mr.c - the verbs transport's memory registrations: hoop_register's ibv_reg_mr and its undoing,
 * and the lookup that tells the data path whether a buffer can go zero-copy (a user's registration,
 * or the library's scratch, registered on first use). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ibverbs.h"
#include "mem/cuda.h"
#include "mem/gdr.h"

/* ---- registrations --------------------------------------------------------------------------- */

/* Register [ptr, ptr + bytes) for local access and remote writes; counted for the tests. */
static struct ibv_mr *reg_mr(hoop__tctx *ctx, void *ptr, size_t bytes, const char *what) {
  ib_state *state = ib_state_of(ctx);
  struct ibv_mr *mr =
      ibv_reg_mr(state->pd, ptr, bytes, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  if (mr) {
    state->reg_calls++;
    HOOP__TRACE(HOOP_SUBSYS_NET, "ibverbs: ibv_reg_mr #%llu: %zu bytes at %p (%s)",
                state->reg_calls, bytes, ptr, what);
  }
  return mr;
}

/* The registration that covers [buf, buf + len): the user's (hoop_register), or the library's
 * scratch (what algorithms receive into), registered on first use. Nothing else is ever
 * registered implicitly: see register.c for why a cache of arbitrary pointers is unsafe. The
 * scratch is safe because the library owns it and calls forget_mem before it frees it. */
struct ibv_mr *hoop__ib_find_mr(hoop__tctx *ctx, const void *buf, size_t len) {
  ib_state *state = ib_state_of(ctx);
  struct ibv_mr *registered = hoop__tctx_registered(ctx, buf, len);
  if (registered)
    return registered;
  void *scratch;
  size_t scratch_bytes;
  hoop__tctx_scratch(ctx, &scratch, &scratch_bytes);
  uintptr_t start = (uintptr_t)buf, base = (uintptr_t)scratch;
  if (!scratch || start < base || start - base > scratch_bytes ||
      len > scratch_bytes - (start - base))
    return NULL;
  if (!state->scratch_mr && !state->scratch_reg_failed) {
    state->scratch_mr = reg_mr(ctx, scratch, scratch_bytes, "scratch");
    if (!state->scratch_mr) {
      /* Not fatal: the scratch keeps going through the slots. */
      state->scratch_reg_failed = 1;
      HOOP__INFO(HOOP_SUBSYS_NET,
                 "ibverbs: ibv_reg_mr of the library's %zu-byte scratch: %s; it is "
                 "copied through the slots instead",
                 scratch_bytes, strerror(errno));
    }
  }
  return state->scratch_mr;
}

/* ---- GPUDirect RDMA: mem/gdr.c's questions, asked of the driver and of this device ----------- */

#define GDR_ACCESS (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ)

static int gdr_dmabuf_supported(void *arg, const void *ptr) {
  (void)arg;
  return hoop__cuda_dmabuf_supported(ptr);
}

static int gdr_dmabuf_fd(void *arg, const void *base, size_t len, int *fd, char *why,
                         size_t whylen) {
  (void)arg;
  return hoop__cuda_dmabuf_fd(base, len, fd, why, whylen);
}

static void *gdr_reg_dmabuf(void *arg, int fd, uint64_t offset, size_t len, uint64_t iova,
                            int *err) {
  ib_state *state = ib_state_of(arg);
  struct ibv_mr *mr = ibv_reg_dmabuf_mr(state->pd, offset, len, iova, fd, GDR_ACCESS);
  *err = mr ? 0 : errno;
  return mr;
}

static int gdr_peermem_loaded(void *arg) {
  (void)arg;
  return access("/sys/kernel/mm/memory_peers/nv_mem/version", F_OK) == 0 ||
         access("/sys/module/nvidia_peermem", F_OK) == 0;
}

static void *gdr_reg_mr(void *arg, void *ptr, size_t len, int *err) {
  ib_state *state = ib_state_of(arg);
  struct ibv_mr *mr = ibv_reg_mr(state->pd, ptr, len, GDR_ACCESS);
  *err = mr ? 0 : errno;
  return mr;
}

static void gdr_close_fd(void *arg, int fd) {
  (void)arg;
  close(fd);
}

/* hoop_register of device memory: registered for GPUDirect RDMA where the device can (kept, for
 * the direct path), else nothing (the collectives stage such a buffer through host memory, whose
 * own registration is the scratch's); HOOP_GDR=1 makes that an error. */
static hoop_result register_device(hoop__tctx *ctx, void *ptr, size_t bytes, void **mem) {
  char why[512] = "";
  int setting = hoop__gdr_setting(why, sizeof why);
  if (setting == -2)
    return hoop__set_error(ctx->comm, HOOP_ERR_INVALID_ARG, "hoop_register: %s", why);
  hoop__gdr_ops ops = {
      ctx,        gdr_dmabuf_supported, gdr_dmabuf_fd, gdr_reg_dmabuf, gdr_peermem_loaded,
      gdr_reg_mr, gdr_close_fd};
  long page = sysconf(_SC_PAGESIZE);
  hoop__gdr_kind kind = hoop__gdr_decide(&ops, setting, ptr, bytes, page > 0 ? (size_t)page : 4096,
                                         mem, why, sizeof why);
  HOOP__INFO(HOOP_SUBSYS_NET, "ibverbs (%s): %s", ib_state_of(ctx)->device, why);
  if (kind == HOOP__GDR_NONE && setting == 1)
    return hoop__set_error(ctx->comm, HOOP_ERR_UNSUPPORTED,
                           "hoop_register: HOOP_GDR=1, but %s on %s", why,
                           ib_state_of(ctx)->device);
  if (!*mem)
    return HOOP_OK;
  ib_state *state = ib_state_of(ctx);
  if (state->ndevice_mrs == state->device_mrs_capacity) {
    int capacity = state->device_mrs_capacity ? 2 * state->device_mrs_capacity : 8;
    struct ibv_mr **grown = realloc(state->device_mrs, (size_t)capacity * sizeof *grown);
    if (!grown) {
      ibv_dereg_mr(*mem);
      *mem = NULL;
      return hoop__set_error(ctx->comm, HOOP_ERR_SYSTEM, "hoop_register: out of memory");
    }
    state->device_mrs = grown;
    state->device_mrs_capacity = capacity;
  }
  state->device_mrs[state->ndevice_mrs++] = *mem;
  state->reg_calls++;
  return HOOP_OK;
}

int hoop__ib_mr_is_device(const ib_state *state, const struct ibv_mr *mr) {
  for (int i = 0; mr && i < state->ndevice_mrs; i++)
    if (state->device_mrs[i] == mr)
      return 1;
  return 0;
}

struct ibv_mr *hoop__ib_device_mr(const ib_state *state, const void *buf, size_t len) {
  uintptr_t start = (uintptr_t)buf;
  for (int i = 0; i < state->ndevice_mrs; i++) {
    const struct ibv_mr *mr = state->device_mrs[i];
    uintptr_t base = (uintptr_t)mr->addr; /* registered with the buffer's own address as iova */
    if (start >= base && start - base <= mr->length && len <= mr->length - (start - base))
      return state->device_mrs[i];
  }
  return NULL;
}

void hoop__ib_free_device_mrs(ib_state *state) {
  free(state->device_mrs);
  state->device_mrs = NULL;
  state->ndevice_mrs = state->device_mrs_capacity = 0;
}

hoop_result hoop__ib_register_mem(hoop__tctx *ctx, void *ptr, size_t bytes, void **mem) {
  *mem = NULL;
  if (hoop__mem_kind_of(ptr) == HOOP__MEM_DEVICE)
    return register_device(ctx, ptr, bytes, mem);
  struct ibv_mr *mr = reg_mr(ctx, ptr, bytes, "hoop_register");
  if (!mr)
    return hoop__set_error(ctx->comm, HOOP_ERR_SYSTEM,
                           "hoop_register: ibv_reg_mr of %zu bytes at %p "
                           "on %s: %s (is the locked-memory limit, ulimit -l, too low, or the "
                           "memory read-only?)",
                           bytes, ptr, ib_state_of(ctx)->device, strerror(errno));
  *mem = mr;
  return HOOP_OK;
}

void hoop__ib_deregister_mem(hoop__tctx *ctx, void *mem) {
  ib_state *state = ib_state_of(ctx);
  for (int i = 0; i < state->ndevice_mrs; i++)
    if (state->device_mrs[i] == mem) {
      state->device_mrs[i] = state->device_mrs[--state->ndevice_mrs];
      break;
    }
  int err = ibv_dereg_mr(mem);
  if (err != 0)
    HOOP__WARN(HOOP_SUBSYS_NET, "ibverbs: ibv_dereg_mr (hoop_deregister): %s", strerror(err));
}

void hoop__ib_forget_mem(hoop__tctx *ctx, const void *ptr, size_t bytes) {
  ib_state *state = ib_state_of(ctx);
  /* Three of the library's buffers are handed here before they are freed: the scratch, the stage
   * of device buffers (mem/stage.c) and the host memory of the IPC path's step between hosts. Only
   * net's scratch is ever registered (hoop__ib_find_mr); its registration goes when the buffer
   * handed over overlaps it. Another buffer (a sub-communicator's, freed while net's thread may
   * have the scratch's key out in a CTS) leaves it alone. */
  if (!state || !state->scratch_mr)
    return;
  uintptr_t lo = (uintptr_t)state->scratch_mr->addr, hi = lo + state->scratch_mr->length;
  uintptr_t from = (uintptr_t)ptr, to = from + bytes;
  if (to <= lo || from >= hi)
    return;
  int err = ibv_dereg_mr(state->scratch_mr);
  if (err != 0)
    HOOP__WARN(HOOP_SUBSYS_NET, "ibverbs: ibv_dereg_mr (the library's scratch): %s", strerror(err));
  state->scratch_mr = NULL;
  state->scratch_reg_failed = 0;
}
