/* data.c - the shared-memory transport's data path: messages placed in the pair's lane slot by
 * slot and taken out in order, big ones read by the receiver straight from the sender's memory
 * (process_vm_readv) where that works, and the progress engine that spins over the lanes and
 * sleeps on the pairs' sockets. */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include "core/env.h"
#include "shm.h"
#include "util/be.h"

/* Spinning rounds between looks at the sockets (a peer's notice or death). */
#define SOCKET_EVERY 256

/* ---- queues ---------------------------------------------------------------------------------- */

static void enqueue(shm_queue *queue, hoop__transfer *req) {
  shm_req(req)->next = NULL;
  if (queue->tail)
    shm_req(queue->tail)->next = req;
  else
    queue->head = req;
  queue->tail = req;
}

static hoop__transfer *dequeue(shm_queue *queue) {
  hoop__transfer *req = queue->head;
  queue->head = shm_req(req)->next;
  if (!queue->head)
    queue->tail = NULL;
  return req;
}

static void complete(shm_queue *queue) {
  hoop__transfer_set_pending(dequeue(queue), 0);
}

/* ---- bells ----------------------------------------------------------------------------------- */

/* The sleep protocol is Dekker's: a rank about to sleep raises its flag, then looks at the
 * lanes once more; a rank that changes a lane then looks at the flag. Each side needs a
 * full fence between its store and its load, or both could miss the other. The side that sleeps
 * is the slow one: with membarrier(MEMBARRIER_CMD_GLOBAL_EXPEDITED) it makes every thread of
 * every registered process pass a fence (an interrupt to the CPUs running them; a thread not
 * running passed one when it was switched out), and the side that rings needs none: a message
 * that finds its peer awake costs no fence (16 ns on the development VM, two per exchange). A
 * process where membarrier is refused (an old kernel, seccomp) fences as before, and so do its
 * peers toward it (the segment's asym flags). */
/* membarrier(2)'s commands, the kernel's ABI (linux/membarrier.h's enum, which headers older than
 * Linux 4.16 lack). */
#define MB_QUERY 0
#define MB_GLOBAL_EXPEDITED (1 << 1)
#define MB_REGISTER_GLOBAL_EXPEDITED (1 << 2)

static int asym_ready;
static pthread_once_t asym_once = PTHREAD_ONCE_INIT;

static void asym_register(void) {
#ifdef SYS_membarrier
  if (strcmp(hoop__env_get("HOOP_SHM_MEMBARRIER"), "0") == 0)
    return;
  long cmds = syscall(SYS_membarrier, MB_QUERY, 0, 0);
  if (cmds < 0 || !(cmds & MB_GLOBAL_EXPEDITED) || !(cmds & MB_REGISTER_GLOBAL_EXPEDITED) ||
      syscall(SYS_membarrier, MB_REGISTER_GLOBAL_EXPEDITED, 0, 0) != 0) {
    HOOP__TRACE(HOOP_SUBSYS_NET, "shm: membarrier refused (%s): every bell fences",
                cmds < 0 ? strerror(errno) : "no global expedited command");
    return;
  }
  asym_ready = 1;
#endif
}

int hoop__shm_asym(void) {
  pthread_once(&asym_once, asym_register);
  return asym_ready;
}

/* The fence a rank about to sleep makes after raising its flags (see above). Should membarrier
 * fail after all (a seccomp filter the program installed since), this rank stops saying it uses
 * it and fences itself from then on; a peer that read its flag before may miss one bell, which
 * costs a poll's timeout (100 ms), not a hang. */
static void sleep_fence(hoop__tctx *ctx) {
  shm_state *state = shm_of(ctx);
#ifdef SYS_membarrier
  if (state->asym && syscall(SYS_membarrier, MB_GLOBAL_EXPEDITED, 0, 0) == 0)
    return;
  if (state->asym) {
    HOOP__WARN(HOOP_SUBSYS_NET, "shm: membarrier failed (%s): fencing every message from now on",
               strerror(errno));
    state->asym = 0;
    for (int peer = 0; peer < ctx->size; peer++)
      if (state->peers[peer].seg)
        atomic_store(&state->peers[peer].seg->asym[state->peers[peer].side].flag, 0);
  }
#endif
  atomic_thread_fence(memory_order_seq_cst);
}

/* Whether a change the peer may wait for needs this side's fence before the look at its flag: not
 * when this side and the peer both use membarrier (see above). */
static void fence_for(const shm_state *state, const shm_peer *p) {
  if (!state->asym || !atomic_load_explicit(&p->seg->asym[!p->side].flag, memory_order_relaxed))
    atomic_thread_fence(memory_order_seq_cst);
  else /* the store before and the load after stay in this order as the compiler emits them */
    atomic_signal_fence(memory_order_seq_cst);
}

/* If the peer sleeps, wake it: its flag was raised before it last looked. */
static void wake_peer(shm_peer *p) {
  _Atomic uint32_t *flag = &p->seg->sleeping[!p->side].flag;
  if (atomic_load_explicit(flag, memory_order_relaxed) &&
      atomic_exchange_explicit(flag, 0, memory_order_relaxed)) {
    char bell = SHM_BELL;
    /* A full socket already holds bells enough; a closed one is seen by the reader. */
    if (send(p->fd, &bell, 1, MSG_DONTWAIT | MSG_NOSIGNAL) < 0)
      HOOP__TRACE(HOOP_SUBSYS_NET, "shm: ringing a peer: %s", strerror(errno));
  }
}

/* After changing what the peer may wait for (a slot published or freed, a message read): if it
 * sleeps, wake it. Its sleeping flag was set before it last looked, and a fence (this side's, or
 * the sleeper's membarrier) orders this side's change before the look at the flag, so one of the
 * two sees the other. */
static void ring(const shm_state *state, shm_peer *p) {
  /* A failure met on the way here (a notice, a mismatch) has shut the pair down already. */
  if (!p->seg)
    return;
  fence_for(state, p);
  wake_peer(p);
}

/* The same for several peers after one change (a board's word), with one fence at most. */
void hoop__shm_wake(hoop__tctx *ctx, const int *peers, int n) {
  shm_state *state = shm_of(ctx);
  if (!state->peers)
    return;
  int fenced = 0;
  for (int i = 0; i < n; i++) {
    shm_peer *p = &state->peers[peers[i]];
    if (!p->seg)
      continue;
    if (!fenced && (!state->asym ||
                    !atomic_load_explicit(&p->seg->asym[!p->side].flag, memory_order_relaxed))) {
      atomic_thread_fence(memory_order_seq_cst);
      fenced = 1;
    }
    atomic_signal_fence(memory_order_seq_cst);
    wake_peer(p);
  }
}

/* ---- sending --------------------------------------------------------------------------------- */

static void encode(shm_slot *slot, uint32_t type, const hoop__transfer *req) {
  if (type == SHM_MORE)
    hoop__put_be32(slot->frame + 4, type);
  else
    hoop__frame_encode(slot->frame, SHM_MAGIC, type, req->channel, req->len, req->fingerprint);
}

/* A flag the ringer lowered belongs to a peer about to run. */
int hoop__shm_asleep_peers(hoop__tctx *ctx) {
  shm_state *state = shm_of(ctx);
  int asleep = 0;
  if (!state->peers) /* no pair connected yet */
    return 0;
  for (int peer = 0; peer < ctx->size; peer++) {
    const shm_peer *p = &state->peers[peer];
    asleep +=
        p->seg && atomic_load_explicit(&p->seg->sleeping[!p->side].flag, memory_order_relaxed) != 0;
  }
  return asleep;
}

/* Whether a message of len bytes goes by CMA (the peer reads it from this rank's memory) rather
 * than through the segment. With HOOP_SHM_CMA_BYTES=auto, only while this host's ranks awake
 * outnumber its CPUs: then the receiver may not run while the sender fills the segment, but when
 * two ranks of four exchange a message and the other two sleep in a wait, each has a CPU and the
 * segment's two copies run side by side (4 ranks on 2 CPUs, 1 MiB one way: 114 us by CMA, 34 us
 * through the segment). */
static int send_by_cma(hoop__tctx *ctx, const shm_peer *p, size_t len) {
  const shm_state *state = shm_of(ctx);
  return state->cma_min && len >= state->cma_min &&
         atomic_load_explicit(&p->seg->can_read[!p->side].flag, memory_order_relaxed) &&
         (!state->cma_auto || hoop__host_crowded_now(ctx->comm, hoop__shm_asleep_peers(ctx)));
}

/* Place what fits of the queued sends; returns whether a slot was published. */
static int drive_sends(hoop__tctx *ctx, shm_state *state, shm_peer *p) {
  shm_lane *lane = &p->seg->lane[p->side];
  int published = 0;
  while (p->sends.head) {
    hoop__transfer *req = p->sends.head;
    shm_request *r = shm_req(req);
    int rndv = !r->started && send_by_cma(ctx, p, req->len);
    while (!r->started || r->done < req->len) {
      if (p->head - p->freed >= SHM_SLOTS) {
        p->freed = atomic_load_explicit(&lane->tail, memory_order_acquire);
        if (p->head - p->freed >= SHM_SLOTS)
          goto full;
      }
      shm_slot *slot = &lane->slots[p->head % SHM_SLOTS];
      if (rndv) {
        encode(slot, SHM_RNDV, req);
        uint64_t addr = (uint64_t)(uintptr_t)r->buf;
        memcpy(slot->inline_data, &addr, sizeof addr);
        slot->bytes = 0;
        r->done = req->len;
      } else {
        size_t n = req->len - r->done < SHM_SLOT_BYTES ? req->len - r->done : SHM_SLOT_BYTES;
        encode(slot, r->started ? SHM_MORE : SHM_DATA, req);
        memcpy(n <= SHM_INLINE ? slot->inline_data : slot->data, r->buf + r->done, n);
        slot->bytes = (uint32_t)n;
        r->done += n;
      }
      r->started = 1;
      atomic_store_explicit(&slot->seq, ++p->head, memory_order_release);
      published = 1;
    }
    dequeue(&p->sends);
    if (rndv) {
      r->ticket = ++p->tickets;
      enqueue(&p->unread, req);
    } else {
      hoop__transfer_set_pending(req, 0);
    }
  }
full:
  return published;
}

/* The peer's next slot, if it has published it. */
static shm_slot *next_slot(shm_peer *p) {
  shm_slot *slot = &p->seg->lane[!p->side].slots[p->taken % SHM_SLOTS];
  return atomic_load_explicit(&slot->seq, memory_order_acquire) == p->taken + 1 ? slot : NULL;
}

/* Give the slot just read back to the peer. */
static void take_slot(shm_peer *p) {
  atomic_store_explicit(&p->seg->lane[!p->side].tail, ++p->taken, memory_order_release);
}

/* Sends the peer has read from this rank's memory are complete. */
static int finish_read(shm_peer *p) {
  if (!p->unread.head)
    return 0;
  uint64_t read = atomic_load_explicit(&p->seg->lane[p->side].read, memory_order_acquire);
  int moved = 0;
  while (p->unread.head && shm_req(p->unread.head)->ticket <= read) {
    complete(&p->unread);
    moved = 1;
  }
  return moved;
}

/* ---- receiving ------------------------------------------------------------------------------- */

/* The receive that the message starting in slot goes to (see "binding" in transport.h): the first
 * posted of its channel, moved to the front; a stray when only other channels' are posted; NULL
 * when nothing is posted (or out of memory, the failure recorded). */
static hoop__transfer *bind_recv(hoop__tctx *ctx, int peer, const shm_slot *slot) {
  shm_peer *p = &shm_of(ctx)->peers[peer];
  uint16_t channel = hoop__frame_channel(slot->frame);
  hoop__transfer *prev = NULL;
  for (hoop__transfer *req = p->recvs.head; req; prev = req, req = shm_req(req)->next) {
    if (req->channel != channel)
      continue;
    if (prev) {
      shm_req(prev)->next = shm_req(req)->next;
      if (p->recvs.tail == req)
        p->recvs.tail = prev;
      shm_req(req)->next = p->recvs.head;
      p->recvs.head = req;
    }
    return req;
  }
  if (!p->recvs.head)
    return NULL;
  char *buf;
  hoop__transfer *stray = hoop__tctx_divert(ctx, peer, slot->frame, &buf);
  if (!stray)
    return NULL;
  shm_request *r = shm_req(stray);
  r->buf = buf;
  r->done = 0;
  r->started = 0;
  r->ticket = 0;
  hoop__transfer_set_pending(stray, 1);
  r->next = p->recvs.head;
  p->recvs.head = stray;
  return stray;
}

/* Read len bytes at addr in the peer into buf. */
static hoop_result cma_read(hoop__tctx *ctx, int peer, char *buf, size_t len, uint64_t addr) {
  shm_peer *p = &shm_of(ctx)->peers[peer];
  size_t done = 0;
  while (done < len) {
    struct iovec local = {buf + done, len - done};
    struct iovec remote = {(void *)(uintptr_t)(addr + done), len - done};
    ssize_t n = process_vm_readv(p->pid, &local, 1, &remote, 1, 0);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0) {
      int err = n < 0 ? errno : 0;
      /* A peer whose call failed may have freed the buffer: its notice says why. */
      hoop_result told = hoop__shm_read_socket(ctx, peer);
      if (told != HOOP_OK || *ctx->failed)
        return told != HOOP_OK ? told : *ctx->failed;
      return hoop__peer_failed(ctx, peer, HOOP_ERR_PEER_LOST, "reading its message",
                               err ? strerror(err) : "process_vm_readv read nothing");
    }
    done += (size_t)n;
  }
  /* The sender tells its peers of a failure before its call returns and its buffer may be freed
   * or reused; with no notice there now, what was read is the message. */
  return hoop__shm_read_socket(ctx, peer);
}

/* Take what has arrived for the posted receives. With none posted, a message's header is compared
 * with the running call once (hoop__mismatch_early), as TCP does. */
static hoop_result drive_recvs(hoop__tctx *ctx, int peer, int *moved) {
  shm_peer *p = &shm_of(ctx)->peers[peer];
  int freed = 0;
  hoop_result result = HOOP_OK;
  shm_slot *slot;
  while ((slot = next_slot(p)) != NULL) {
    uint32_t type = hoop__frame_type(slot->frame);
    hoop__transfer *req = p->recvs.head;
    if (req && !shm_req(req)->started && type != SHM_MORE && !(req = bind_recv(ctx, peer, slot))) {
      if ((result = *ctx->failed) != HOOP_OK)
        break;
    }
    if (!req) {
      unsigned long long call;
      hoop__net_call(ctx->comm, &call);
      if (type != SHM_MORE && (p->peeked != p->taken + 1 || p->peeked_call != call)) {
        p->peeked = p->taken + 1;
        p->peeked_call = call;
        result = hoop__mismatch_early(ctx->comm, peer, hoop__frame_channel(slot->frame),
                                      slot->frame + 16);
      }
      break;
    }
    shm_request *r = shm_req(req);
    if (!r->started) {
      if ((type != SHM_DATA && type != SHM_RNDV) || hoop__get_be32(slot->frame) != SHM_MAGIC) {
        result =
            hoop__fail(ctx->comm, HOOP_ERR_PROTOCOL, "shm: rank %d sent a malformed frame", peer);
        break;
      }
      if ((result = hoop__frame_check(ctx, peer, slot->frame, req)) != HOOP_OK)
        break;
      r->started = 1;
      if (type == SHM_RNDV) {
        uint64_t addr;
        memcpy(&addr, slot->inline_data, sizeof addr);
        if ((result = cma_read(ctx, peer, r->buf, req->len, addr)) != HOOP_OK)
          break;
        take_slot(p);
        atomic_fetch_add_explicit(&p->seg->lane[!p->side].read, 1, memory_order_release);
        freed = *moved = 1;
        complete(&p->recvs);
        continue;
      }
    } else if (type != SHM_MORE) {
      result =
          hoop__fail(ctx->comm, HOOP_ERR_PROTOCOL, "shm: rank %d sent a malformed frame", peer);
      break;
    }
    size_t n = slot->bytes;
    if (n > SHM_SLOT_BYTES || n > req->len - r->done) {
      result = hoop__fail(ctx->comm, HOOP_ERR_PROTOCOL, "shm: rank %d overran a message", peer);
      break;
    }
    memcpy(r->buf + r->done, n <= SHM_INLINE ? slot->inline_data : slot->data, n);
    r->done += n;
    take_slot(p);
    freed = *moved = 1;
    if (r->done == req->len)
      complete(&p->recvs);
  }
  if (freed)
    ring(shm_of(ctx), p);
  return result;
}

/* ---- watches --------------------------------------------------------------------------------- */

/* A watch keeps its word in buf and the value it waits for in ticket. Watches of several
 * communicators (threads) may wait on one peer at once, each for its own board: every one is
 * looked at. */
static int drive_watches(shm_peer *p) {
  int moved = 0;
  hoop__transfer *prev = NULL, *req = p->watches.head;
  while (req) {
    shm_request *r = shm_req(req);
    hoop__transfer *next = r->next;
    const _Atomic uint64_t *word = (const _Atomic uint64_t *)(const void *)r->buf;
    if (atomic_load_explicit(word, memory_order_acquire) >= r->ticket) {
      if (prev)
        shm_req(prev)->next = next;
      else
        p->watches.head = next;
      if (p->watches.tail == req)
        p->watches.tail = prev;
      hoop__transfer_set_pending(req, 0);
      moved = 1;
    } else {
      prev = req;
    }
    req = next;
  }
  return moved;
}

static hoop_result drive_peer(hoop__tctx *ctx, int peer, int *moved);

hoop_result hoop__shm_board_watch(hoop__tctx *ctx, int peer, const _Atomic uint64_t *word,
                                  uint64_t value, hoop__transfer *req) {
  if (*ctx->failed)
    return *ctx->failed;
  shm_peer *p = &shm_of(ctx)->peers[peer];
  shm_request *r = shm_req(req);
  r->buf = (char *)(uintptr_t)word;
  r->done = 0;
  r->started = 0;
  r->ticket = value;
  hoop__transfer_set_pending(req, 1);
  enqueue(&p->watches, req);
  int moved = 0;
  return drive_peer(ctx, peer, &moved);
}

/* One round over one peer: place, finish, take. */
static hoop_result drive_peer(hoop__tctx *ctx, int peer, int *moved) {
  shm_state *state = shm_of(ctx);
  shm_peer *p = &state->peers[peer];
  if (!p->seg)
    return HOOP_OK;
  if (p->sends.head && drive_sends(ctx, state, p)) {
    *moved = 1;
    ring(state, p);
  }
  if (finish_read(p))
    *moved = 1;
  if (p->watches.head && drive_watches(p))
    *moved = 1;
  hoop_result result = drive_recvs(ctx, peer, moved);
  /* Its goodbye came after everything it sent, read and raised: nothing more will come or go. */
  if (result == HOOP_OK && (p->eof || p->said_bye) && p->seg) {
    if (p->watches.head)
      result = hoop__peer_failed(ctx, peer, HOOP_ERR_PEER_LOST, "waiting on the board",
                                 "it had left the communicator (finalized, or retired it in a "
                                 "shrink or growth) before its part of the call");
    else if (p->recvs.head && !next_slot(p))
      result = hoop__peer_failed(ctx, peer, HOOP_ERR_PEER_LOST, "receive",
                                 "it had left the communicator (finalized, or retired it in a "
                                 "shrink or growth) before sending what this rank waits for");
    else if (p->sends.head || p->unread.head)
      result = hoop__peer_failed(ctx, peer, HOOP_ERR_PEER_LOST, "send",
                                 "it had left the communicator (finalized, or retired it in a "
                                 "shrink or growth) before taking what this rank sends it");
  }
  return result;
}

hoop_result hoop__shm_post(hoop__tctx *ctx, int peer, void *buf, size_t len, hoop__transfer *req,
                           int is_send) {
  if (*ctx->failed)
    return *ctx->failed;
  hoop_result result = hoop__shm_connect(ctx, peer);
  if (result != HOOP_OK)
    return result;
  shm_peer *p = &shm_of(ctx)->peers[peer];
  shm_request *r = shm_req(req);
  r->buf = buf;
  r->done = 0;
  r->started = 0;
  r->ticket = 0;
  hoop__transfer_set_pending(req, 1);
  enqueue(is_send ? &p->sends : &p->recvs, req);
  int moved = 0;
  return drive_peer(ctx, peer, &moved);
}

/* ---- progress -------------------------------------------------------------------------------- */

static hoop_result drive_all(hoop__tctx *ctx, int *moved) {
  for (int peer = 0; peer < ctx->size; peer++) {
    hoop_result result = drive_peer(ctx, peer, moved);
    if (result != HOOP_OK)
      return result;
  }
  return HOOP_OK;
}

static void set_sleeping(hoop__tctx *ctx, uint32_t value) {
  shm_state *state = shm_of(ctx);
  for (int peer = 0; peer < ctx->size; peer++) {
    shm_peer *p = &state->peers[peer];
    if (p->seg)
      atomic_store_explicit(&p->seg->sleeping[p->side].flag, value, memory_order_relaxed);
  }
  /* Lowering the flags needs no more than a fence: a peer that still sees one up rings for
   * nothing. */
  if (value)
    sleep_fence(ctx);
  else
    atomic_thread_fence(memory_order_seq_cst);
}

/* The poll set: the wake eventfd, the watched descriptor when watch is set, and every pair's
 * socket. */
static hoop_result build_pollset(hoop__tctx *ctx, int watch) {
  shm_state *state = shm_of(ctx);
  hoop__pollset *set = &state->pollset;
  hoop_result result = hoop__pollset_begin(ctx, set, (size_t)ctx->size, state->wake_fd, watch);
  if (result != HOOP_OK)
    return result;
  for (int peer = 0; state->peers && peer < ctx->size; peer++) {
    shm_peer *p = &state->peers[peer];
    if (p->fd >= 0 && !p->eof)
      hoop__pollset_add(set, p->fd, POLLIN, peer, 0);
  }
  return HOOP_OK;
}

static hoop_result drive_ready(hoop__tctx *ctx, int peer, int stream, int *moved) {
  (void)stream;
  hoop_result result = drive_peer(ctx, peer, moved);
  return result == HOOP_OK ? hoop__shm_read_socket(ctx, peer) : result;
}

static hoop_result drive_every_peer(hoop__tctx *ctx, int *moved) {
  return shm_of(ctx)->peers ? drive_all(ctx, moved) : HOOP_OK;
}

/* Act on what the poll set's revents say is readable. A peer publishes a message before it
 * wakes it, sends a notice or aborts through the rendezvous server, and a failure unmaps the
 * segments: so lanes are drained before a socket or the watched descriptor is read, and a
 * message that came before the news still completes its receive (a peer that aborted right after
 * sending this rank's last message). */
static hoop_result handle_pollset(hoop__tctx *ctx, int *moved) {
  shm_state *state = shm_of(ctx);
  return hoop__pollset_handle(ctx, &state->pollset, state->wake_fd, drive_ready, drive_every_peer,
                              moved);
}

/* Look at the sockets (and the wake eventfd and the rendezvous connection), waiting up to
 * timeout_ms for one to be readable; *ran_out (where asked) says the poll ended at its timeout. */
static hoop_result poll_sockets(hoop__tctx *ctx, int timeout_ms, int *moved, int *ran_out) {
  shm_state *state = shm_of(ctx);
  int ready = 0;
  hoop_result result = build_pollset(ctx, 1);
  if (result == HOOP_OK)
    result = hoop__pollset_wait(ctx, &state->pollset, timeout_ms, &ready);
  if (result != HOOP_OK)
    return result;
  if (ran_out)
    *ran_out = ready == 0;
  return ready > 0 ? handle_pollset(ctx, moved) : HOOP_OK;
}

/* After a poll that ran out, with the sleeping flags still up: work waiting in a lane means a
 * peer changed what this rank waits for and its bell never came, unless the bell is on its way
 * (rung after the poll gave up: still in a socket). Such a bell costs the poll's timeout, not a
 * hang, and no result shows it: the trace says so, which tests/test_shm.sh counts. */
static hoop_result look_after_timeout(hoop__tctx *ctx, int timeout_ms, int *here) {
  shm_state *state = shm_of(ctx);
  hoop_result result = drive_all(ctx, here);
  if (result == HOOP_OK && *here && poll(state->pollset.fds, state->pollset.used, 0) == 0)
    HOOP__TRACE(HOOP_SUBSYS_NET,
                "shm: a bell was missed: the poll ran out (%d ms) with a peer's change waiting",
                timeout_ms);
  return result;
}

/* One round: move what is ready on every lane. When nothing moved and the caller allows it,
 * sleep on the sockets: this rank raises its sleeping flags, looks once more (what a peer did
 * before seeing the flags is seen here; what it does after rings the bell), then polls. While
 * spinning, the sockets are looked at every SOCKET_EVERY rounds, so that a notice or a death is
 * not missed by a rank that keeps finding work. */
hoop_result hoop__shm_progress(hoop__tctx *ctx, int timeout_ms, int *moved) {
  shm_state *state = shm_of(ctx);
  if (!state->peers)
    return poll_sockets(ctx, timeout_ms, moved, NULL);
  int here = 0;
  hoop_result result = drive_all(ctx, &here);
  if (result != HOOP_OK)
    return result;
  if (here || timeout_ms == 0) {
    if (here)
      *moved = 1;
    return ++state->rounds % SOCKET_EVERY != 0 ? HOOP_OK : poll_sockets(ctx, 0, moved, NULL);
  }
  set_sleeping(ctx, 1);
  result = drive_all(ctx, &here);
  int ran_out = 0;
  if (result == HOOP_OK && !here)
    result = poll_sockets(ctx, timeout_ms, &here, &ran_out);
  if (result == HOOP_OK && ran_out)
    result = look_after_timeout(ctx, timeout_ms, &here);
  set_sleeping(ctx, 0);
  if (result == HOOP_OK && here)
    *moved = 1;
  return result;
}

/* Sleeping in one poll with other transports: as progress does before its own poll, raise the
 * sleeping flags and look once more; the flags stay up until sleep_done. */
hoop_result hoop__shm_sleep_prepare(hoop__tctx *ctx, struct pollfd **fds, nfds_t *n, int *moved) {
  shm_state *state = shm_of(ctx);
  *fds = state->pollset.fds;
  *n = 0;
  state->pollset.used = 0;
  if (state->peers) {
    set_sleeping(ctx, 1);
    state->sleeping = 1;
    int here = 0;
    hoop_result result = drive_all(ctx, &here);
    if (result != HOOP_OK || here) {
      *moved |= here;
      return result;
    }
  }
  hoop_result result = build_pollset(ctx, 0);
  *fds = state->pollset.fds;
  *n = result == HOOP_OK ? state->pollset.used : 0;
  return result;
}

hoop_result hoop__shm_sleep_done(hoop__tctx *ctx, int *moved) {
  shm_state *state = shm_of(ctx);
  hoop_result result = handle_pollset(ctx, moved);
  if (state->sleeping) {
    set_sleeping(ctx, 0);
    state->sleeping = 0;
  }
  return result;
}
