/* board.c - the shared-memory transport's boards: one segment that every rank of a communicator
 * on this host maps, for its small calls (transport/board.c lays it out and uses it). The
 * communicator's lowest rank makes it as a memfd, sealed as a pair's segment is, and hands it to
 * each other rank over their pair's socket: a board message {G, made, channel, bytes} with the
 * descriptor on its first byte. A rank keeps what came until its communicator takes it: the
 * descriptors in the order they came, the messages by channel, which say whose descriptor is
 * whose. Watches and bells are the data path's (data.c). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "shm.h"
#include "util/be.h"
#include "util/sockio.h"

void hoop__shm_fd_came(hoop__tctx *ctx, int peer, int fd) {
  shm_peer *p = &shm_of(ctx)->peers[peer];
  if (p->nfds == SHM_PEER_FDS) {
    /* More boards in flight than a communicator's calls can make: its message finds none. */
    HOOP__TRACE(HOOP_SUBSYS_NET, "shm: rank %d handed over more descriptors than expected", peer);
    close(fd);
    return;
  }
  p->fds[p->nfds++] = fd;
}

hoop_result hoop__shm_board_came(hoop__tctx *ctx, int peer, const uint8_t *msg) {
  shm_peer *p = &shm_of(ctx)->peers[peer];
  int fd = -1;
  if (msg[1]) {
    if (p->nfds > 0) {
      fd = p->fds[0];
      memmove(p->fds, p->fds + 1, (size_t)(p->nfds - 1) * sizeof *p->fds);
      p->nfds--;
    } else {
      HOOP__TRACE(HOOP_SUBSYS_NET, "shm: rank %d's board came without its descriptor", peer);
    }
  }
  if (p->nboards == SHM_PEER_FDS) {
    if (fd >= 0)
      close(fd);
    return hoop__fail(ctx->comm, HOOP_ERR_PROTOCOL,
                      "shm: rank %d handed over more boards than its communicators take", peer);
  }
  p->boards[p->nboards].channel = hoop__get_be16(msg + 2);
  p->boards[p->nboards].bytes = hoop__get_be32(msg + 4);
  p->boards[p->nboards].fd = fd;
  p->nboards++;
  return HOOP_OK;
}

void hoop__shm_boards_drop(shm_peer *p) {
  for (int i = 0; i < p->nfds; i++)
    close(p->fds[i]);
  for (int i = 0; i < p->nboards; i++)
    if (p->boards[i].fd >= 0)
      close(p->boards[i].fd);
  p->nfds = p->nboards = 0;
}

/* Tell peer whether the board of channel was made, with its descriptor if it was. A pair's socket
 * holds a few bells at most, so a short wait for room is enough. */
static hoop_result hand_over(hoop__tctx *ctx, int peer, uint16_t channel, size_t bytes, int memfd) {
  shm_peer *p = &shm_of(ctx)->peers[peer];
  uint8_t msg[SHM_BOARD_BYTES] = {SHM_BOARD, memfd >= 0};
  hoop__put_be16(msg + 2, channel);
  hoop__put_be32(msg + 4, (uint32_t)bytes);
  double deadline = hoop__now() + ctx->timeout_s;
  for (;;) {
    ssize_t sent = hoop__send_with_fd(p->fd, msg, sizeof msg, memfd);
    if (sent == (ssize_t)sizeof msg)
      return HOOP_OK;
    if (sent >= 0 || (errno != EAGAIN && errno != EWOULDBLOCK) || hoop__now() > deadline) {
      int err = sent < 0 ? errno : 0;
      /* A peer that failed told why before it closed: its notice is the story. */
      hoop_result told = hoop__shm_read_socket(ctx, peer);
      if (told != HOOP_OK || *ctx->failed)
        return told != HOOP_OK ? told : *ctx->failed;
      return hoop__peer_failed(ctx, peer, HOOP_ERR_PEER_LOST, "handing over a board",
                               err ? strerror(err) : "short write");
    }
    struct pollfd pfd = {.fd = p->fd, .events = POLLOUT};
    poll(&pfd, 1, 10);
  }
}

hoop_result hoop__shm_board_create(hoop__tctx *ctx, uint16_t channel, const int *ranks, int n,
                                   size_t bytes, void **map) {
  hoop_result result = HOOP_OK;
  int memfd = hoop__shm_segment_make("hoop-board", bytes, map);
  if (memfd < 0)
    HOOP__INFO(HOOP_SUBSYS_NET, "shm: no %zu-byte board for small calls (%s): they go as messages",
               bytes, strerror(errno));
  for (int i = 0; i < n && result == HOOP_OK; i++)
    if (ranks[i] != ctx->rank)
      result = hand_over(ctx, ranks[i], channel, bytes, memfd);
  if (memfd >= 0)
    hoop__shm_segment_close(memfd);
  return result;
}

hoop_result hoop__shm_board_attach(hoop__tctx *ctx, uint16_t channel, int creator, size_t bytes,
                                   void **map, int *settled) {
  *map = NULL;
  *settled = 0;
  hoop_result result = hoop__shm_connect(ctx, creator);
  if (result == HOOP_OK)
    result = hoop__shm_read_socket(ctx, creator);
  if (result != HOOP_OK)
    return result;
  shm_peer *p = &shm_of(ctx)->peers[creator];
  int at = 0;
  while (at < p->nboards && p->boards[at].channel != channel)
    at++;
  if (at == p->nboards)
    return HOOP_OK;
  int fd = p->boards[at].fd;
  uint32_t said = p->boards[at].bytes;
  memmove(p->boards + at, p->boards + at + 1, (size_t)(p->nboards - at - 1) * sizeof *p->boards);
  p->nboards--;
  *settled = 1;
  if (fd < 0)
    return HOOP_OK;
  /* As a pair's segment: the size this rank expects, sealed against shrinking (no SIGBUS). */
  *map = said == bytes ? hoop__shm_segment_map(fd, bytes) : NULL;
  if (!*map && said == bytes && errno)
    HOOP__INFO(HOOP_SUBSYS_NET, "shm: mapping rank %d's board: %s", creator, strerror(errno));
  else if (!*map)
    HOOP__WARN(HOOP_SUBSYS_NET,
               "shm: rank %d handed over a board of %u bytes, not %zu, or unsealed", creator, said,
               bytes);
  close(fd);
  return HOOP_OK;
}
