/* shm.c - the shared-memory transport, for peers on this host: a segment per pair of ranks, two
 * single-producer single-consumer queues of slots in it, and a Unix socket per pair. This file has
 * the transport ops; conn.c sets up the pairs, data.c moves messages, and shm.h holds what they
 * share.
 *
 * Which peers: every rank publishes its host key (the kernel's boot id and its network
 * namespace) with the name of its listener, an abstract Unix socket; peers with the same key run
 * on one kernel and reach each other's listener, so they can share memory. Others use the next
 * transport (ibverbs or TCP).
 *
 * Pairs: of each pair the lower rank creates the segment as a memfd, connects to the higher
 * rank's listener and hands the descriptor over (SCM_RIGHTS) with the job's nonce, which the
 * higher rank checks before mapping it. The segment has no name in any file system, so nothing is
 * left behind after a crash, and only ranks of the job ever hold it. The socket stays open: it
 * carries bells, a failing rank's notice and a finalizing rank's bye, and its closing without a
 * bye is the peer's death, seen at once.
 *
 * Messages: a message's first slot holds its frame (length and the call's fingerprint, checked
 * against the posted receive as on every transport) and its first bytes; the rest follows slot by
 * slot, the receiver copying out while the sender copies in. A slot is published by a sequence
 * number on the same cache line as its frame and, for a message of at most SHM_INLINE bytes, its
 * payload: the receiver's one cache miss brings the whole message. From HOOP_SHM_CMA_BYTES up,
 * where the receiver showed at setup that process_vm_readv can read the sender
 * (kernel.yama.ptrace_scope and pid namespaces may forbid it), the slot carries only the message's
 * address and the receiver copies it straight from the sender's buffer: one copy instead of two.
 * The sender's request completes when the receiver says it has read it.
 *
 * Boards (board.c): a communicator of ranks that all share this host may map one segment for its
 * small calls (transport/board.c); its lowest rank makes it and hands it to the others over their
 * pairs' sockets. A wait for a word of a board is a watch, looked at with the channels.
 *
 * Waiting: a wait spins over the channels (HOOP_SHM_SPIN_US; the crowded-host rule of TCP), then
 * raises this rank's sleeping flag in each segment, looks once more, and sleeps in poll() on the
 * sockets. A rank that publishes or frees a slot, or finishes reading a message, rings the bell
 * of a sleeping peer: one byte on the socket.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "shm.h"
#include "util/be.h"
#include "util/sockio.h"

#define GOODBYE_WAIT_S 0.5

static hoop_result shm_isend(hoop__tctx *ctx, int peer, const void *buf, size_t len,
                             hoop__transfer *req) {
  /* Never written through; the cast only shares the request's buffer field. */
  return hoop__shm_post(ctx, peer, (void *)(uintptr_t)buf, len, req, 1);
}

static hoop_result shm_irecv(hoop__tctx *ctx, int peer, void *buf, size_t len,
                             hoop__transfer *req) {
  return hoop__shm_post(ctx, peer, buf, len, req, 0);
}

static int shm_pending(hoop__tctx *ctx, int peer) {
  shm_state *state = shm_of(ctx);
  if (!state->peers)
    return 0;
  shm_peer *p = &state->peers[peer];
  return (p->recvs.head || p->watches.head ? HOOP__PENDING_RECV : 0) |
         (p->sends.head || p->unread.head ? HOOP__PENDING_SEND : 0);
}

/* The state letter of process pid (/proc/PID/stat: R, S, D, T for stopped, t for traced), or 0. */
static char process_state(pid_t pid) {
  char path[64], line[512];
  snprintf(path, sizeof path, "/proc/%ld/stat", (long)pid);
  FILE *file = pid > 0 ? fopen(path, "re") : NULL;
  if (!file)
    return 0;
  size_t n = fread(line, 1, sizeof line - 1, file);
  fclose(file);
  line[n] = '\0';
  const char *close = strrchr(line, ')'); /* the command name may hold anything */
  return close && close[1] == ' ' ? close[2] : 0;
}

/* A peer on this host whose process runs is waiting for another rank: over shared memory a
 * stall reaches every rank of a chain within microseconds, so they all reach the timeout
 * together, and the grace lets the story come from the rank next to the stopped one. */
static hoop_result shm_timed_out(hoop__tctx *ctx, const hoop__transfer *req, int in_grace) {
  shm_state *state = shm_of(ctx);
  char st = state->peers ? process_state(state->peers[req->peer].pid) : 0;
  if (st == 'T' || st == 't')
    return hoop__peer_failed(
        ctx, req->peer, HOOP_ERR_TIMEOUT,
        req->is_send
            ? "no data taken within the timeout (HOOP_TIMEOUT, or the communicator's own)"
            : "no data received within the timeout (HOOP_TIMEOUT, or the communicator's own)",
        st == 'T' ? "its process is stopped (SIGSTOP)" : "its process is stopped by a debugger");
  if (!in_grace && st)
    return HOOP_OK;
  return hoop__peer_failed(
      ctx, req->peer, HOOP_ERR_TIMEOUT,
      req->is_send
          ? "no data taken within the timeout (HOOP_TIMEOUT, or the communicator's own)"
          : "no data received within the timeout (HOOP_TIMEOUT, or the communicator's own)",
      "its process is alive but does not move (stopped, or busy outside "
      "hoop)");
}

/* HOOP_SHM_SPIN_US=auto: TCP's rule (see tcp.c), decided at the first wait: a rank with a CPU of
 * its own spins a millisecond, ranks that outnumber the CPUs 50 us. */
#define SPIN_ALONE_S 1e-3
#define SPIN_CROWDED_S 50e-6

static double shm_spin_s(hoop__tctx *ctx) {
  shm_state *state = shm_of(ctx);
  if (state->spin_s < 0) {
    state->spin_s = hoop__host_oversubscribed(ctx->comm) ? SPIN_CROWDED_S : SPIN_ALONE_S;
    HOOP__TRACE(HOOP_SUBSYS_NET, "HOOP_SHM_SPIN_US=auto: %.0f us (%d ranks on this host)",
                state->spin_s * 1e6, ctx->local_size);
  }
  return state->spin_s;
}

/* Tell each peer why this rank closes (a notice after a failure, a bye at finalize), then close
 * its socket and unmap its segment; the peer keeps its own mapping, so what this rank placed
 * there stays readable. */
static void shm_shutdown(hoop__tctx *ctx) {
  shm_state *state = shm_of(ctx);
  if (!state)
    return;
  uint8_t msg[SHM_NOTICE_HEAD + SHM_NOTICE_MAX];
  size_t len = 1;
  if (*ctx->failed) {
    int origin;
    const char *text;
    hoop__tctx_failure(ctx, &origin, &text);
    size_t text_len = strlen(text) < SHM_NOTICE_MAX ? strlen(text) : SHM_NOTICE_MAX;
    msg[0] = SHM_NOTICE;
    msg[1] = 0;
    hoop__put_be16(msg + 2, (uint16_t)text_len);
    hoop__put_be32(msg + 4, (uint32_t)*ctx->failed);
    hoop__put_be32(msg + 8, (uint32_t)origin);
    memcpy(msg + SHM_NOTICE_HEAD, text, text_len);
    len = SHM_NOTICE_HEAD + text_len;
  } else {
    msg[0] = SHM_BYE;
  }
  /* A peer that is alive reads its socket within a few spinning rounds or at once when it
   * sleeps; a full socket (bells it has not read yet) waits that long. */
  double deadline = hoop__now() + GOODBYE_WAIT_S;
  for (int peer = 0; state->peers && peer < ctx->size; peer++) {
    shm_peer *p = &state->peers[peer];
    if (p->fd >= 0 && !p->eof && hoop__write_full(p->fd, msg, len, deadline) != 0)
      HOOP__TRACE(HOOP_SUBSYS_NET, "shm: could not tell rank %d why this rank closes: %s", peer,
                  strerror(errno));
    hoop__shm_unmap(p);
    memset(&p->sends, 0, sizeof p->sends);
    memset(&p->unread, 0, sizeof p->unread);
    memset(&p->recvs, 0, sizeof p->recvs);
    memset(&p->watches, 0, sizeof p->watches);
    hoop__shm_boards_drop(p);
  }
  hoop__pending_close(&state->pending);
  if (state->listen_fd >= 0)
    close(state->listen_fd);
  state->listen_fd = -1;
}

static void shm_finalize(hoop__tctx *ctx) {
  shm_state *state = shm_of(ctx);
  if (!state)
    return;
  shm_shutdown(ctx);
  if (state->wake_fd >= 0)
    close(state->wake_fd);
  hoop__pollset_free(&state->pollset);
  free(state->peers);
  free(state);
  ctx->state = NULL;
}

static void shm_wake(hoop__tctx *ctx) {
  shm_state *state = shm_of(ctx);
  if (state)
    hoop__wake_signal(state->wake_fd, "shm");
}

const hoop__transport_ops hoop__shm_transport = {
    .name = "shm",
    .caps = HOOP__TCAP_SAME_HOST,
    .auto_role = HOOP__AUTO_IF_SET_RIGHT,
    .auto_alone = "every peer is on this host",
    .kernel_ranks = hoop__shm_kernel_ranks,
    .addr_prefix = "shm:",
    .listen = hoop__shm_listen,
    .can_reach = hoop__shm_can_reach,
    .connect = hoop__shm_connect,
    .isend = shm_isend,
    .irecv = shm_irecv,
    .progress = hoop__shm_progress,
    .sleep_prepare = hoop__shm_sleep_prepare,
    .sleep_done = hoop__shm_sleep_done,
    .pending = shm_pending,
    .timed_out = shm_timed_out,
    .spin_s = shm_spin_s,
    .asleep_peers = hoop__shm_asleep_peers,
    .shutdown = shm_shutdown,
    .wake = shm_wake,
    .finalize = shm_finalize,
    .board_create = hoop__shm_board_create,
    .board_attach = hoop__shm_board_attach,
    .board_watch = hoop__shm_board_watch,
    .board_wake = hoop__shm_wake,
};
