/* board.c - a communicator's board (see transport.h): its layout, how it is handed out by the
 * transport, and the calls' steps on it (claim a slot, publish it, wait for a peer's, be done).
 *
 * Layout: a line of its own for the header, then per rank a line for its done word and its
 * slots. A slot is its sequence number, the call's fingerprint and the fingerprint of this rank's
 * board call before it (56 bytes), then its payload: a payload of up to 8 bytes shares the cache
 * line that brings the sequence number, so an 8-byte call's reader takes one miss per peer; a
 * longer one starts on the next line.
 *
 * The call before: a broadcast's receivers check the root's fingerprint, but nobody checks theirs,
 * and where every rank takes itself for the root nobody reads anything. The next call that reads a
 * slot compares the writer's call before (on the board or by messages) with its own, and so finds
 * that mismatch too. */
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "core/fingerprint.h"
#include "transport/transport.h"
#include "util/be.h"

#define LINE 64
#define HEAD 56
#define SLOT_BYTES (LINE + HOOP__BOARD_PAYLOAD)
#define RANK_BYTES (LINE + HOOP__BOARD_SLOTS * SLOT_BYTES)

typedef struct slot_head {
  _Atomic uint64_t seq;
  uint8_t fingerprint[HOOP__FINGERPRINT_BYTES];
  uint8_t before[HOOP__FINGERPRINT_BYTES];
} slot_head;
_Static_assert(sizeof(slot_head) == HEAD, "a slot's head is its sequence and two fingerprints");
_Static_assert(HEAD + HOOP__BOARD_INLINE <= LINE, "an inline payload shares the head's line");

/* Pause rounds a wait spins on the word itself before it goes to the shared wait loop (about 3 us
 * here): a peer a few hundred nanoseconds behind is met without a round of every transport's
 * progress, or a clock reading. */
#define SPIN_INLINE 128

/* How many calls ahead a rank fetches its next slot's line for writing (hoop__board_publish): 1
 * to 8 measured alike with 2 ranks; 2 leaves the fetch a whole call to finish in. */
#define PREFETCH_AHEAD 2

/* Fetch the line at p for writing, without waiting for it. x86-64's prefetchw (executed as a
 * no-op by the older processors that lack it) takes the line exclusive; a plain prefetch would
 * fetch it shared, and the store would still have to take it from its last reader. */
static inline void prefetch_for_write(const void *p) {
#if defined(__x86_64__)
  __asm__ volatile("prefetchw %0" ::"m"(*(const char *)p));
#else
  __builtin_prefetch(p, 1, 3);
#endif
}

struct hoop__board {
  char *map;
  size_t bytes;
  int n, rank;
  int *peers;       /* net's ranks of the others, for the bells */
  hoop__tctx *ctx;  /* the transport that serves them all */
  int spin_inline;  /* this rank has a CPU of its own: spin on the word before the wait loop */
  uint64_t seq;     /* calls made on the board */
  uint64_t settled; /* every rank is done with the calls up to here */
  uint8_t before[HOOP__FINGERPRINT_BYTES]; /* the fingerprint of this rank's last call, on the
                                              board or by messages (hoop__board_note_call) */
};

static size_t board_bytes(int n) {
  return LINE + (size_t)n * RANK_BYTES;
}

static _Atomic uint64_t *done_word(const hoop__board *board, int rank) {
  return (_Atomic uint64_t *)(void *)(board->map + LINE + (size_t)rank * RANK_BYTES);
}

static slot_head *slot_of(const hoop__board *board, int rank, uint64_t seq) {
  return (slot_head *)(void *)(board->map + LINE + (size_t)rank * RANK_BYTES + LINE +
                               (size_t)(seq % HOOP__BOARD_SLOTS) * SLOT_BYTES);
}

/* ---- opening --------------------------------------------------------------------------------- */

static int by_value(const void *a, const void *b) {
  int x = *(const int *)a, y = *(const int *)b;
  return (x > y) - (x < y);
}

/* Every pair connected, lowest ranks first: the lower rank of a pair connects and the higher
 * accepts, so each rank waits only for ranks that have nobody left to wait for. */
static hoop_result connect_all(hoop_comm *comm, const int *sorted, int n) {
  hoop_comm *net = hoop__net(comm);
  hoop_result result = HOOP_OK;
  const hoop_comm *outer = hoop__drive_begin(comm);
  for (int i = 0; i < n && result == HOOP_OK; i++)
    if (sorted[i] != net->rank)
      result = hoop__transport_connect(net, sorted[i]);
  return hoop__drive_end(comm, outer, result);
}

/* The creator's board for this communicator, once it came (or its word that it made none). */
static hoop_result attach(hoop_comm *comm, hoop__board *board, int creator, void **map) {
  double deadline = hoop__now() + comm->timeout_s;
  for (unsigned tries = 0;; tries++) {
    int settled = 0;
    const hoop_comm *outer = hoop__drive_begin(comm);
    hoop_result result = board->ctx->ops->board_attach(board->ctx, comm->channel, creator,
                                                       board->bytes, map, &settled);
    result = hoop__drive_end(comm, outer, result);
    if (result != HOOP_OK || settled)
      return result;
    if ((result = hoop__progress_once(comm)) != HOOP_OK)
      return result;
    if (hoop__now() > deadline)
      return hoop__fail(comm, HOOP_ERR_TIMEOUT,
                        "%s (call #%llu): rank %d did not hand over the communicator's board for "
                        "HOOP_TIMEOUT (%.1f s)",
                        comm->call, (unsigned long long)comm->seq, creator, comm->timeout_s);
    if (tries > 64)
      usleep(tries > 1024 ? 1000 : 10);
  }
}

hoop_result hoop__board_open(hoop_comm *comm, hoop__board **out) {
  *out = NULL;
  int n = comm->size;
  hoop_comm *net = hoop__net(comm);
  if (n < 2 || n > HOOP__BOARD_MAX_RANKS)
    return HOOP_OK;
  hoop__tctx *ctx = hoop__transport_of(comm, comm->rank == 0 ? 1 : 0);
  if (!ctx->ops->board_create)
    return HOOP_OK;
  hoop__board *board = calloc(1, sizeof *board);
  int *sorted = calloc((size_t)n, sizeof *sorted);
  if (board)
    board->peers = calloc((size_t)n, sizeof *board->peers);
  if (!board || !sorted || !board->peers) {
    free(sorted);
    hoop__board_close(board);
    return hoop__fail(comm, HOOP_ERR_SYSTEM, "%s: out of memory for the board", comm->call);
  }
  board->n = n;
  board->rank = comm->rank;
  board->bytes = board_bytes(n);
  board->ctx = ctx;
  board->spin_inline = !hoop__host_oversubscribed(comm);
  for (int r = 0, at = 0; r < n; r++) {
    sorted[r] = hoop__net_rank(comm, r);
    if (r != comm->rank)
      board->peers[at++] = sorted[r];
  }
  qsort(sorted, (size_t)n, sizeof *sorted, by_value);
  void *map = NULL;
  hoop_result result = connect_all(comm, sorted, n);
  if (result == HOOP_OK && sorted[0] == net->rank) {
    const hoop_comm *outer = hoop__drive_begin(comm);
    result = ctx->ops->board_create(ctx, comm->channel, sorted, n, board->bytes, &map);
    result = hoop__drive_end(comm, outer, result);
  } else if (result == HOOP_OK) {
    result = attach(comm, board, sorted[0], &map);
  }
  free(sorted);
  board->map = map;
  if (result != HOOP_OK || !map) {
    hoop__board_close(board);
    return result;
  }
  *out = board;
  return HOOP_OK;
}

void hoop__board_close(hoop__board *board) {
  if (!board)
    return;
  if (board->map)
    munmap(board->map, board->bytes);
  free(board->peers);
  free(board);
}

/* ---- a call's steps -------------------------------------------------------------------------- */

uint64_t hoop__board_next(hoop__board *board) {
  return ++board->seq;
}

void *hoop__board_slot(hoop__board *board, int rank, uint64_t seq, size_t bytes) {
  return (char *)slot_of(board, rank, seq) + (bytes <= HOOP__BOARD_INLINE ? HEAD : LINE);
}

/* Under the net lock: a view's call may ring while another thread's call on the net fails and
 * unmaps the pairs. */
static void ring_all(hoop_comm *comm, const hoop__board *board) {
  hoop__net_enter(comm);
  board->ctx->ops->board_wake(board->ctx, board->peers, board->n - 1);
  hoop__net_leave(comm);
}

/* Until *word (of comm's rank) is at least value. */
static hoop_result await(hoop_comm *comm, const hoop__board *board, int rank,
                         const _Atomic uint64_t *word, uint64_t value) {
  if (board->spin_inline)
    for (int i = 0; i < SPIN_INLINE; i++) {
      hoop__cpu_pause();
      if (atomic_load_explicit(word, memory_order_acquire) >= value)
        return HOOP_OK;
    }
  hoop__transfer req;
  hoop_result result = hoop__watch(comm, rank, word, value, &req);
  return result == HOOP_OK ? hoop__wait(comm, &req) : result;
}

hoop_result hoop__board_claim(hoop_comm *comm, hoop__board *board, uint64_t seq) {
  if (seq <= board->settled + HOOP__BOARD_SLOTS)
    return HOOP_OK;
  /* What every rank has done, as far as it is known now: a root well ahead reads its receivers'
   * words once for several calls, not once a call (each read takes the line from its writer). */
  uint64_t need = seq - HOOP__BOARD_SLOTS, low = UINT64_MAX;
  for (int r = 0; r < board->n; r++) {
    if (r == board->rank)
      continue;
    _Atomic uint64_t *word = done_word(board, r);
    uint64_t done = atomic_load_explicit(word, memory_order_acquire);
    if (done < need) {
      hoop_result result = await(comm, board, r, word, need);
      if (result != HOOP_OK)
        return result;
      done = atomic_load_explicit(word, memory_order_acquire);
    }
    if (done < low)
      low = done;
  }
  board->settled = low;
  return HOOP_OK;
}

void hoop__board_publish(hoop_comm *comm, hoop__board *board, uint64_t seq) {
  slot_head *head = slot_of(board, board->rank, seq);
  memcpy(head->fingerprint, comm->fingerprint, sizeof head->fingerprint);
  memcpy(head->before, board->before, sizeof head->before);
  atomic_store_explicit(&head->seq, seq, memory_order_release);
  /* The slot after next, asked for now: its line was last read by the receivers, and a store that
   * has to fetch it back holds up the next locked instruction (the next call's take of the call
   * lock; until 5a253ab, this call's release of it), which waits for every store before it: a
   * line's crossing, about 125 ns. Only a slot every rank is done with: a root far ahead would
   * take a line still to be read. */
  if (seq + PREFETCH_AHEAD <= board->settled + HOOP__BOARD_SLOTS)
    prefetch_for_write(slot_of(board, board->rank, seq + PREFETCH_AHEAD));
  ring_all(comm, board);
}

hoop_result hoop__board_wait(hoop_comm *comm, hoop__board *board, int rank, uint64_t seq) {
  slot_head *head = slot_of(board, rank, seq);
  if (atomic_load_explicit(&head->seq, memory_order_acquire) < seq) {
    hoop_result result = await(comm, board, rank, &head->seq, seq);
    if (result != HOOP_OK)
      return result;
  }
  /* Always, HOOP_CHECK_CALLS=0 too: here it costs nothing, and no message length is compared
   * instead. Copies: the peer may write its next call's over them once it learns of the failure. */
  uint8_t theirs[HOOP__FINGERPRINT_BYTES], before[HOOP__FINGERPRINT_BYTES];
  memcpy(theirs, head->fingerprint, sizeof theirs);
  memcpy(before, head->before, sizeof before);
  if (!hoop__fingerprints_match(theirs, comm->fingerprint))
    return hoop__mismatch(comm, rank, theirs, comm->fingerprint, 0, 0);
  if (!hoop__fingerprints_match(before, board->before))
    return hoop__mismatch(comm, rank, before, board->before, 0, 0);
  return HOOP_OK;
}

hoop_result hoop__board_peek(hoop_comm *comm, hoop__board *board) {
  uint64_t next = board->seq + 1;
  if (!comm->call)
    return HOOP_OK;
  for (int r = 0; r < board->n; r++) {
    if (r == board->rank)
      continue;
    slot_head *head = slot_of(board, r, next);
    if (atomic_load_explicit(&head->seq, memory_order_acquire) < next)
      continue;
    uint8_t theirs[HOOP__FINGERPRINT_BYTES];
    memcpy(theirs, head->fingerprint, sizeof theirs);
    /* A later call's is the peer running ahead, which is fine. */
    if (hoop__get_be64(theirs) <= comm->seq && !hoop__fingerprints_match(theirs, comm->fingerprint))
      return hoop__mismatch(comm, r, theirs, comm->fingerprint, 0, 0);
  }
  return HOOP_OK;
}

void hoop__board_note_call(hoop_comm *comm) {
  hoop__board *board = hoop__transport_board(comm);
  if (board)
    memcpy(board->before, comm->fingerprint, sizeof board->before);
}

void hoop__board_done(hoop_comm *comm, hoop__board *board, uint64_t seq, int every_rank) {
  /* Every HOOP__BOARD_DONE_EVERY-th call only: the word's line then crosses to a root waiting on
   * it (and back for the next store) once for that many calls, not once a call. It lags by less
   * than that, so a root that finds the word short of what it needs finds this rank really behind,
   * with the published calls still to read: no rank waits on a word that would have been raised. */
  if (seq % HOOP__BOARD_DONE_EVERY == 0) {
    atomic_store_explicit(done_word(board, board->rank), seq, memory_order_release);
    ring_all(comm, board);
  }
  memcpy(board->before, comm->fingerprint, sizeof board->before);
  if (every_rank && seq - 1 > board->settled)
    board->settled = seq - 1;
}
