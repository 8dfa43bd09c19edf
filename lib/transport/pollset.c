/* pollset.c - the poll set every transport sleeps on (transport.h: hoop__pollset): built, polled
 * and acted on the same way by shm, tcp and ibverbs. */
#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>

#include "transport/transport.h"

hoop_result hoop__pollset_begin(hoop__tctx *ctx, hoop__pollset *set, size_t own, int wake_fd,
                                int watch) {
  size_t need = own + 2;
  if (need > set->cap) {
    struct pollfd *fds = realloc(set->fds, need * sizeof *fds);
    if (fds)
      set->fds = fds;
    hoop__poll_owner *owners = realloc(set->owners, need * sizeof *owners);
    if (owners)
      set->owners = owners;
    if (!fds || !owners)
      return hoop__fail(ctx->comm, HOOP_ERR_SYSTEM, "%s: out of memory for the poll set",
                        ctx->ops->name);
    set->cap = need;
  }
  set->used = 0;
  hoop__pollset_add(set, wake_fd, POLLIN, HOOP__POLL_WAKE, 0);
  /* The rendezvous connection: other ranks' aborts and losses, told by the server. */
  int watched = *ctx->watch_fd;
  if (watch && watched >= 0)
    hoop__pollset_add(set, watched, POLLIN, HOOP__POLL_WATCHED, 0);
  return HOOP_OK;
}

hoop_result hoop__pollset_wait(hoop__tctx *ctx, hoop__pollset *set, int timeout_ms, int *ready) {
  *ready = poll(set->fds, set->used, timeout_ms);
  if (*ready >= 0)
    return HOOP_OK;
  *ready = 0;
  if (errno == EINTR)
    return HOOP_OK;
  return hoop__fail(ctx->comm, HOOP_ERR_SYSTEM, "%s: poll: %s", ctx->ops->name, strerror(errno));
}

hoop_result
hoop__pollset_handle(hoop__tctx *ctx, hoop__pollset *set, int wake_fd,
                     hoop_result (*drive)(hoop__tctx *ctx, int peer, int stream, int *moved),
                     hoop_result (*before_watched)(hoop__tctx *ctx, int *moved), int *moved) {
  hoop_result result = HOOP_OK;
  int wake = 0, watched = 0;
  for (nfds_t i = 0; i < set->used && result == HOOP_OK; i++) {
    if (!set->fds[i].revents)
      continue;
    hoop__poll_owner owner = set->owners[i];
    if (owner.peer == HOOP__POLL_WAKE)
      wake = 1;
    else if (owner.peer == HOOP__POLL_WATCHED)
      watched = 1;
    else
      result = drive(ctx, owner.peer, owner.stream, moved);
  }
  if (result == HOOP_OK && wake &&
      (result = hoop__wake_drain(ctx, wake_fd, ctx->ops->name)) == HOOP_OK)
    result = hoop__check_abort(ctx->comm);
  if (result == HOOP_OK && watched && before_watched)
    result = before_watched(ctx, moved);
  if (result == HOOP_OK && watched)
    result = hoop__tctx_watched(ctx);
  return result;
}

void hoop__pollset_free(hoop__pollset *set) {
  free(set->fds);
  free(set->owners);
  *set = (hoop__pollset){0};
}
