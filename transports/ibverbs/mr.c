/* mr.c - the verbs transport's memory registrations: hoop_register's ibv_reg_mr and its undoing,
 * and the lookup that tells the data path whether a buffer can go zero-copy (a user's registration,
 * or the library's staging buffer, registered on first use). */
#include <errno.h>
#include <string.h>

#include "ibverbs.h"

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

/* The registration that covers [buf, buf + len): the user's (hoop_register), or the staging
 * buffer, registered on first use. Nothing else is ever registered implicitly: see register.c
 * for why a cache of arbitrary pointers is unsafe. The staging buffer is safe because the library
 * owns it and hoop__scratch calls forget_mem before it frees it. */
struct ibv_mr *hoop__ib_find_mr(hoop__tctx *ctx, const void *buf, size_t len) {
  ib_state *state = ib_state_of(ctx);
  struct ibv_mr *registered = hoop__tctx_registered(ctx, buf, len);
  if (registered)
    return registered;
  void *staging;
  size_t staging_bytes;
  hoop__tctx_staging(ctx, &staging, &staging_bytes);
  uintptr_t start = (uintptr_t)buf, scratch = (uintptr_t)staging;
  if (!staging || start < scratch || start - scratch > staging_bytes ||
      len > staging_bytes - (start - scratch))
    return NULL;
  if (!state->scratch_mr && !state->scratch_reg_failed) {
    state->scratch_mr = reg_mr(ctx, staging, staging_bytes, "staging");
    if (!state->scratch_mr) {
      /* Not fatal: the staging buffer keeps going through the slots. */
      state->scratch_reg_failed = 1;
      HOOP__INFO(HOOP_SUBSYS_NET,
                 "ibverbs: ibv_reg_mr of the %zu-byte staging buffer: %s; it is "
                 "copied through the slots instead",
                 staging_bytes, strerror(errno));
    }
  }
  return state->scratch_mr;
}

hoop_result hoop__ib_register_mem(hoop__tctx *ctx, void *ptr, size_t bytes, void **mem) {
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
  int err = ibv_dereg_mr(mem);
  if (err != 0)
    HOOP__WARN(HOOP_SUBSYS_NET, "ibverbs: ibv_dereg_mr (hoop_deregister): %s", strerror(err));
  (void)ctx;
}

void hoop__ib_forget_mem(hoop__tctx *ctx, const void *ptr, size_t bytes) {
  ib_state *state = ib_state_of(ctx);
  (void)ptr;
  (void)bytes; /* only the staging buffer is ever handed here */
  if (state && state->scratch_mr) {
    int err = ibv_dereg_mr(state->scratch_mr);
    if (err != 0)
      HOOP__WARN(HOOP_SUBSYS_NET, "ibverbs: ibv_dereg_mr (staging buffer): %s", strerror(err));
  }
  if (state) {
    state->scratch_mr = NULL;
    state->scratch_reg_failed = 0;
  }
}
