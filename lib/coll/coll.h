/* coll.h - pieces the collectives share: argument checks, the request arena that keeps posted
 * sends alive, and the ring circulation used by allreduce's second half and by allgather. */
#ifndef HOOP__COLL_H
#define HOOP__COLL_H

#include <stddef.h>
#include <string.h>

#include "core/call.h"
#include "core/internal.h"
#include "mem/kind.h"
#include "transport/transport.h"

/* Large transfers move in chunks of HOOP_CHUNK_BYTES (default below), so that a rank forwards (and
 * reduces) the first chunk while later ones are still on the wire; each chunk costs a wait
 * (bench/TUNING.md). */
#define HOOP__CHUNK_BYTES (1024 * 1024)
#define HOOP__CHUNK_MIN_BYTES 4096
#define HOOP__CHUNK_MAX_BYTES (1L << 30)
/* Cap on the chunks of one block; past it chunks grow instead, to bound bookkeeping. */
#define HOOP__MAX_CHUNKS_PER_BLOCK 256

/* The collectives' state of a communicator (coll/state.h), made with it (NULL: out of memory),
 * sized to its ranks (again when its size changes) and freed with it last. */
hoop__coll_state *hoop__coll_state_new(void);
hoop_result hoop__coll_state_size(hoop_comm *comm);

/* ---- what the calls measured (tally.c) ---- */
/* The tally begins with the state (HOOP_STATS_PERIOD read). */
void hoop__coll_tally_start(hoop__coll_state *coll);
/* From any thread: a collective's calls, their bytes, time inside them and waiting in them. */
void hoop__coll_tally_read(const hoop_comm *comm, hoop__coll which, uint64_t *calls,
                           uint64_t *bytes, uint64_t *time_ns, uint64_t *wait_ns);
/* When the tally began (hoop__now). */
double hoop__coll_tally_began(const hoop_comm *comm);
/* At a call's start on the job's communicator: at each multiple of HOOP_STATS_PERIOD on the
 * wall clock, the STATS that describes the last calls goes to the rendezvous server. */
void hoop__coll_tally_report(hoop_comm *comm);
void hoop__coll_state_free(hoop_comm *comm);

/* The running call's blocks in comm's block tables (coll/state.h): block i is bytes long at i *
 * bytes (hoop__plan_blocks); or the count elements of esize bytes cut into near-equal segments, one
 * per rank (hoop__plan_segments, hoop__segment's). */
void hoop__plan_blocks(hoop_comm *comm, size_t bytes);
void hoop__plan_segments(hoop_comm *comm, size_t count, size_t esize);

/* Posted requests must not move while the transport holds them, so they live in fixed blocks
 * that are never reallocated. */
typedef struct hoop__arena_block hoop__arena_block;
typedef struct hoop__arena {
  hoop__arena_block *head, *tail;
  size_t used_in_tail;
  hoop_comm *comm; /* whose spare block it took, and gets back (hoop_comm.arena_spare) */
} hoop__arena;

/* A fresh request slot, or NULL (error recorded on comm) if out of memory. */
hoop__transfer *hoop__arena_next(hoop_comm *comm, hoop__arena *arena);
/* Wait for every request taken from the arena, in order. */
hoop_result hoop__arena_wait_all(hoop_comm *comm, hoop__arena *arena);
void hoop__arena_free(hoop__arena *arena);
/* The block a communicator keeps for its next call's arena, freed with it. */
void hoop__arena_spare_free(hoop_comm *comm);

/* Post a send of len bytes to peer from the arena. */
hoop_result hoop__arena_isend(hoop_comm *comm, hoop__arena *arena, int peer, const void *buf,
                              size_t len);

/* Bytes per chunk for a block of block_bytes, a multiple of elem_size. */
size_t hoop__chunk_bytes(const hoop_comm *comm, size_t block_bytes, size_t elem_size);

/* Post the sends of len bytes to peer from the arena, in the chunks hoop__chunk_bytes cuts (a
 * receiver takes them in the same chunks, computed from the same length). */
hoop_result hoop__arena_isend_chunks(hoop_comm *comm, hoop__arena *arena, int peer, const char *buf,
                                     size_t len, size_t elem_size);

/* A ring's members: the whole communicator (ranks NULL), or some of its ranks in ring order
 * (the ranks of one host, or one rank of each host: see hier.c). index is this rank's place. */
typedef struct hoop__group {
  int size, index;
  const int *ranks;
} hoop__group;

static inline hoop__group hoop__whole(const hoop_comm *comm) {
  return (hoop__group){comm->size, comm->rank, NULL};
}
/* The communicator rank of member i. */
static inline int hoop__member(const hoop__group *group, int i) {
  return group->ranks ? group->ranks[i] : i;
}
static inline int hoop__group_next(const hoop__group *group) {
  return hoop__member(group, (group->index + 1) % group->size);
}
static inline int hoop__group_prev(const hoop__group *group) {
  return hoop__member(group, (group->index + group->size - 1) % group->size);
}

/* The job's hosts (hosts.c), planned at the first collective with data. */
typedef struct hoop__hosts {
  int count;               /* hosts in the job */
  int per_host;            /* ranks on this rank's host */
  int even;                /* 1: at least 2 hosts, every one with the same per_host, at least 2 */
  int consecutive;         /* even, and every host's ranks consecutive (host h: h * per_host on) */
  int host_index;          /* this rank's host among them, in order of their lowest rank */
  int local_index;         /* this rank's place on its host */
  int *local;              /* per_host entries: the ranks of this host, in rank order */
  int *cross;              /* count entries: on each host, the rank at local_index (when even) */
  int *at;                 /* count * per_host entries: the rank at place l of host h at
                              h * per_host + l (when even, or one rank per host) */
  size_t *offset, *length; /* count entries each: the blocks of a pass across the hosts */
} hoop__hosts;

/* Fill comm->hosts from the rank table's host names (HOOP_OK, or the error recorded). */
hoop_result hoop__hosts_plan(hoop_comm *comm);

/* Member r of the group starts with block (r + shift) % n complete and ends with all n blocks: at
 * each of n-1 steps it receives from the previous rank the block that rank completed the step
 * before, and forwards it to the next. Block i is the bytes [offset[i], offset[i] + length[i]) of
 * base. With own_sent, the caller already posted the sends of its own block (in chunks from
 * hoop__chunk_bytes) on arena; otherwise this posts them. */
hoop_result hoop__ring_circulate(hoop_comm *comm, const hoop__group *group, hoop__arena *arena,
                                 char *base, const size_t *offset, const size_t *length, int shift,
                                 size_t elem_size, int own_sent);

/* A ring reduce-scatter over a group (ring.c): member r sends its contribution to block
 * (r + shift) % n at step 0; at each of the n-1 steps it receives from the previous member a chunk
 * of block (r + shift - step - 1) % n holding the sum of step + 1 members' contributions, adds its
 * own (from src) and forwards the sum, so that it ends holding block (r + shift + 1) % n summed
 * over the group. Partial sums are written at their place in dst, which the sends read until the
 * arena is waited for; the finished block goes to last if given (its first byte there), else to
 * its place in dst. Chunks are received into HOOP__RING_RECV_DEPTH slices of chunk_max bytes of
 * scratch. finish: AVG's division by the communicator's size on the finished block. then_circulate:
 * the finished block also goes to the next member, starting an allgather (hoop__ring_circulate with
 * own_sent). Each element is reduced on one member, so all end with the same bits. */
typedef struct hoop__ring_rs {
  const char *src;
  char *dst, *last;
  const size_t *offset, *length; /* the blocks, in bytes */
  int shift;
  char *scratch;
  size_t chunk_max;
  hoop_dtype dtype;
  hoop_op op;
  int finish, then_circulate;
} hoop__ring_rs;
hoop_result hoop__ring_reduce_scatter(hoop_comm *comm, const hoop__group *group, hoop__arena *arena,
                                      const hoop__ring_rs *rs);

/* The first half of the direct algorithm (allreduce.c): this rank sends every peer that peer's
 * block of src, receives its own block from every peer and reduces it, its own part first and the
 * others in rank order, into own (finished, AVG divided). Blocks as offset and length (bytes). The
 * sends stay on arena. */
hoop_result hoop__direct_reduce(hoop_comm *comm, hoop__arena *arena, const char *src, char *own,
                                const size_t *offset, const size_t *length, size_t esize,
                                hoop_dtype dtype, hoop_op op);

/* The second half of the direct algorithm: this rank's finished segment of dst (offset[rank],
 * length[rank]) to every peer, and every other segment from its owner into its place in dst;
 * waits for those and for every request on arena. */
hoop_result hoop__direct_share(hoop_comm *comm, hoop__arena *arena, char *dst, const size_t *offset,
                               const size_t *length, size_t esize);

/* Receives a ring pass keeps posted ahead of the chunk it waits for (see hoop__recv_ahead). */
#define HOOP__RING_RECV_DEPTH 2

/* Walks the chunks a ring pass over a group receives, in order: at each of the n-1 steps, block
 * (index + shift - step - 1) mod n, cut by hoop__chunk_bytes. Start from {0, 0}. */
typedef struct hoop__ring_cursor {
  int step;
  size_t done; /* bytes of the step's block already handed out */
} hoop__ring_cursor;

/* The next chunk: its step, byte offset in the buffer and length; 0 when the pass is over. */
int hoop__ring_cursor_next(const hoop_comm *comm, const hoop__group *group,
                           hoop__ring_cursor *cursor, const size_t *offset, const size_t *length,
                           int shift, size_t elem_size, int *step, size_t *at, size_t *len);

/* End of a call that moves no bytes on this rank (count 0). With HOOP_CHECK_CALLS it still sends
 * its fingerprint to the next rank of the ring and takes the previous rank's, so that ranks whose
 * call has data, or whose call is another, meet it and both sides fail with HOOP_ERR_MISMATCH
 * instead of one waiting for data that never comes. Without the check it costs nothing. */
hoop_result hoop__coll_no_data(hoop_comm *comm);

static inline int hoop__ring_next(const hoop_comm *comm) {
  return (comm->rank + 1) % comm->size;
}
static inline int hoop__ring_prev(const hoop_comm *comm) {
  return (comm->rank + comm->size - 1) % comm->size;
}

/* ---- the dispatcher's view of a call ----------------------------------------------------------
 */

typedef hoop_result (*hoop__algo_fn)(hoop_comm *comm, const hoop__coll_args *args);

/* An algorithm, as tune.c's table lists it. */
typedef struct hoop__algo {
  hoop__coll coll;
  const char *name; /* HOOP_ALGO=coll:name */
  hoop__algo_fn run;
  hoop__algo_traits traits;
  const char *what;
  int repro; /* in reproducible mode it combines over the fixed tree (repro.c) */
} hoop__algo;

/* dispatch.c: the checks of a call's arguments, made when it is posted (HOOP_OK, or the error
 * recorded, naming call: the entry point, NULL for the blocking one's name); running a call, with
 * the communicator's call_lock held (core/progress.c runs the queue); and the public name of a
 * collective ("hoop_allreduce"). */
hoop_result hoop__coll_validate(hoop_comm *comm, const hoop__coll_args *args, const char *call);
hoop_result hoop__coll_run(hoop_comm *comm, hoop__coll_args *args);
const char *hoop__coll_call_name(hoop__coll coll);
/* A wire format asked for one call (hoop_compress_next; compress, or HOOP__COMPRESS_COMM for none
 * asked) that the call can take: HOOP_OK, or HOOP_ERR_INVALID_ARG recorded naming both. With
 * error feedback, the call's input (input_bytes at input; NULL: allreduce_many's buffers) must be
 * registered. */
hoop_result hoop__coll_check_compress(hoop_comm *comm, const char *call, hoop__coll coll,
                                      hoop_dtype dtype, hoop_op op, int compress, const void *input,
                                      size_t input_bytes);

/* api.c: HOOP_OK if a non-blocking call was given somewhere to put its request, else
 * HOOP_ERR_INVALID_ARG (recorded when there is a communicator). */
hoop_result hoop__coll_need_request(hoop_comm *comm, hoop_request **request, const char *call);
/* fused.c: free hoop_allreduce_many's packing buffer (at hoop_finalize, once the requests are
 * done). */
void hoop__fused_free(hoop_comm *comm);

/* The algorithms (tune.c names each in its table). */
hoop_result hoop__allreduce_ring(hoop_comm *comm, const hoop__coll_args *args);
hoop_result hoop__allreduce_rd(hoop_comm *comm, const hoop__coll_args *args);
hoop_result hoop__allreduce_hd(hoop_comm *comm, const hoop__coll_args *args);
hoop_result hoop__allreduce_repro_hd(hoop_comm *comm, const hoop__coll_args *args);
hoop_result hoop__allreduce_hier(hoop_comm *comm, const hoop__coll_args *args);
hoop_result hoop__allreduce_direct(hoop_comm *comm, const hoop__coll_args *args);
/* compressed.c: the calls whose bytes between hosts go in args->compress's format; where the job
 * does not fit (hoop__compressed_fits), or the call is exact, hier's allreduce and the ring's
 * reduce-scatter. */
hoop_result hoop__allreduce_compressed(hoop_comm *comm, const hoop__coll_args *args);
hoop_result hoop__reduce_scatter_compressed(hoop_comm *comm, const hoop__coll_args *args);
/* The step between hosts of a compressed call whose host's steps ran elsewhere (CUDA IPC,
 * coll/mapped.c), on comm->mem's memory, message for message as the staged call's step between
 * hosts, so that hosts of either kind meet. An allreduce: segment holds the len elements of the
 * call's segment at this rank's place on its host (hoop__segment's over the host's ranks) summed
 * over the host, and ends summed over every host. A reduce-scatter: segment (the start of the
 * kind's scratch) holds, host after host, the host's sums of the block of the rank at this rank's
 * place there, and the call's result ends summed over every host. _scratch: the bytes of the
 * kind's scratch it takes (0 when out of memory), to be had before the call. */
hoop_result hoop__compressed_by_host(hoop_comm *comm, const hoop__coll_args *args, char *segment,
                                     size_t len);
size_t hoop__compressed_by_host_scratch(hoop_comm *comm, const hoop__coll_args *args, size_t len);
/* Whether the job's hosts take compressed calls: two or more, each with as many ranks. */
int hoop__compressed_fits(const hoop_comm *comm);
/* Free compressed calls' buffers (hoop_finalize). */
void hoop__compressed_free(hoop_comm *comm);
hoop_result hoop__broadcast_tree(hoop_comm *comm, const hoop__coll_args *args);
hoop_result hoop__broadcast_chain(hoop_comm *comm, const hoop__coll_args *args);
hoop_result hoop__allgather_ring(hoop_comm *comm, const hoop__coll_args *args);
hoop_result hoop__allgather_rd(hoop_comm *comm, const hoop__coll_args *args);
hoop_result hoop__allgather_bruck(hoop_comm *comm, const hoop__coll_args *args);
/* A ring allreduce in place among the members of group, one rank of each host
 * (comm->hosts->cross), AVG divided by the communicator's size: the step between hosts of hier
 * and of the host-by-host mapped allreduce (mapped.c), which therefore meet message for message.
 * Its plan uses comm->hosts' offset and length. */
hoop_result hoop__allreduce_group(hoop_comm *comm, const hoop__group *group, char *buf,
                                  size_t count, hoop_dtype dtype, hoop_op op);
hoop_result hoop__allgather_direct(hoop_comm *comm, const hoop__coll_args *args);
hoop_result hoop__barrier_dissemination(hoop_comm *comm, const hoop__coll_args *args);
hoop_result hoop__reduce_scatter_ring(hoop_comm *comm, const hoop__coll_args *args);
hoop_result hoop__reduce_scatter_direct(hoop_comm *comm, const hoop__coll_args *args);
hoop_result hoop__reduce_scatter_halving(hoop_comm *comm, const hoop__coll_args *args);
hoop_result hoop__alltoall_pairwise(hoop_comm *comm, const hoop__coll_args *args);
hoop_result hoop__alltoall_bruck(hoop_comm *comm, const hoop__coll_args *args);
/* board.c: the small calls on the communicator's board; each runs the small-call algorithm of
 * messages where the board is missing or the call does not fit it. hoop__coll_board_open maps the
 * board (tune.c, at the first call that tunes: every rank at once) where every rank can. */
hoop_result hoop__allreduce_board(hoop_comm *comm, const hoop__coll_args *args);
hoop_result hoop__broadcast_board(hoop_comm *comm, const hoop__coll_args *args);
hoop_result hoop__allgather_board(hoop_comm *comm, const hoop__coll_args *args);
hoop_result hoop__barrier_board(hoop_comm *comm, const hoop__coll_args *args);
hoop_result hoop__reduce_scatter_board(hoop_comm *comm, const hoop__coll_args *args);
hoop_result hoop__alltoall_board(hoop_comm *comm, const hoop__coll_args *args);
hoop_result hoop__coll_board_open(hoop_comm *comm);
void hoop__coll_board_free(hoop_comm *comm);

/* repro.c: reproducible mode's algorithms, each element combined over mem/reduce.h's fixed tree
 * (the board's allreduce and reduce-scatter do the same in that mode). */
hoop_result hoop__allreduce_repro(hoop_comm *comm, const hoop__coll_args *args);
hoop_result hoop__allreduce_repro_all(hoop_comm *comm, const hoop__coll_args *args);
hoop_result hoop__allreduce_repro_hier(hoop_comm *comm, const hoop__coll_args *args);
hoop_result hoop__reduce_scatter_repro(hoop_comm *comm, const hoop__coll_args *args);
hoop_result hoop__reduce_scatter_repro_rd(hoop_comm *comm, const hoop__coll_args *args);
hoop_result hoop__reduce_scatter_repro_halving(hoop_comm *comm, const hoop__coll_args *args);
hoop_result hoop__reduce_scatter_repro_hier(hoop_comm *comm, const hoop__coll_args *args);
hoop_result hoop__reduce_repro(hoop_comm *comm, const hoop__coll_args *args);
hoop_result hoop__reduce_repro_all(hoop_comm *comm, const hoop__coll_args *args);
hoop_result hoop__reduce_repro_tree(hoop_comm *comm, const hoop__coll_args *args);
/* A reducing collective in reproducible mode on comm. */
static inline int hoop__coll_repro(const hoop_comm *comm, hoop__coll coll) {
  return comm->reproducible && hoop__coll_reduces(coll);
}

/* HOOP_OK where op applies to dtype, else HOOP_ERR_INVALID_ARG recorded as "call: ..." naming
 * both (dispatch.c). */
hoop_result hoop__check_op(hoop_comm *comm, const char *call, hoop_dtype dtype, hoop_op op);

/* Free the point-to-point messages' kept stages (p2p.c; hoop_finalize). */
void hoop__p2p_free(hoop_comm *comm);

/* The rooted collectives (rooted.c). */
hoop_result hoop__reduce_tree(hoop_comm *comm, const hoop__coll_args *args);
hoop_result hoop__reduce_linear(hoop_comm *comm, const hoop__coll_args *args);
hoop_result hoop__reduce_direct(hoop_comm *comm, const hoop__coll_args *args);
hoop_result hoop__gather_tree(hoop_comm *comm, const hoop__coll_args *args);
hoop_result hoop__gather_linear(hoop_comm *comm, const hoop__coll_args *args);
hoop_result hoop__scatter_tree(hoop_comm *comm, const hoop__coll_args *args);
hoop_result hoop__scatter_linear(hoop_comm *comm, const hoop__coll_args *args);
/* Every member's flag combined (OR when any, else AND) by the dissemination pattern: after
 * ceil(log2 n) rounds of one byte each member has heard, directly or through others, from every
 * member (barrier.c). */
hoop_result hoop__group_agree(hoop_comm *comm, const hoop__group *group, int *flag, int any);
/* The same for up to 8 flags at once, in one byte: OR for the bits of any_mask, AND for the rest.
 */
hoop_result hoop__group_agree_bits(hoop_comm *comm, const hoop__group *group, unsigned *bits,
                                   unsigned any_mask);

/* tune.c: read HOOP_ALGO and HOOP_CHUNK_BYTES once per communicator (HOOP_ERR_INVALID_ARG,
 * recorded, for a bad value of either, at this and every later call), then the algorithm for this
 * call: the one HOOP_ALGO forces, else the first row of the cut-over table that fits. Every input
 * is the same on every rank, so all ranks choose alike. */
hoop_result hoop__coll_tune(hoop_comm *comm, const hoop__coll_args *args, const hoop__algo **algo);

/* mapped.c: the collectives whose members read each other's buffers where a path mapped them into
 * this process, on comm->mem's queued operations; the members are the whole communicator or one
 * host's ranks (by_host: hier's shape, the step between hosts through host memory). */
typedef struct hoop__mapped {
  hoop__group group;
  int by_host;
  int compressed;        /* by_host: a compressed call (coll/compressed.c's shape) */
  char **sends, **recvs; /* by communicator rank: where each member's buffers are readable here */
  void *host;            /* by_host: host memory for this rank's block */
} hoop__mapped;
/* The block of an allreduce's segments (hoop__segment's over the members) that the member at
 * index reduces: its own, or host by host the next one (hier's ring leaves it there), unless the
 * call is compressed. */
int hoop__mapped_own(const hoop__mapped *mapped, int index);
hoop_result hoop__mapped_run(hoop_comm *comm, const hoop__mapped *mapped,
                             const hoop__coll_args *args);
/* Every member has arrived (the dissemination barrier, on the group's members). */
hoop_result hoop__group_barrier(hoop_comm *comm, const hoop__group *group);

/* ---- receiving chunks ahead -------------------------------------------------------------------
 */

/* A pass that receives a known sequence of chunks keeps up to depth receives posted ahead of the
 * chunk it waits for, so that the next chunk's transfer overlaps this one's reduction or
 * forwarding (for zero-copy transports a sender may not start a chunk before its receive is
 * posted). next describes the pass's next chunk: its peer, destination and length, given the
 * slot (0..depth-1) that chunk will hold while in flight; 0 when the pass has no more. */
#define HOOP__RECV_AHEAD_MAX 4

typedef struct hoop__chunk {
  int peer;
  char *dst;
  size_t len;
  size_t at;   /* for the pass's own use: where the chunk belongs */
  int step;    /* for the pass's own use: the ring step it belongs to */
  size_t slot; /* which of the depth slots it holds */
} hoop__chunk;

typedef struct hoop__recv_ahead {
  size_t depth, posted, taken;
  int (*next)(void *pass, size_t slot, hoop__chunk *chunk);
  void *pass;
  int exhausted;
  hoop__chunk chunks[HOOP__RECV_AHEAD_MAX];
  hoop__transfer reqs[HOOP__RECV_AHEAD_MAX];
} hoop__recv_ahead;

void hoop__recv_ahead_init(hoop__recv_ahead *ahead, size_t depth,
                           int (*next)(void *pass, size_t slot, hoop__chunk *chunk), void *pass);
/* Post what the depth allows, then wait for the oldest chunk: *chunk points at it once it has
 * arrived, or is NULL when the pass is over. */
hoop_result hoop__recv_ahead_take(hoop_comm *comm, hoop__recv_ahead *ahead,
                                  const hoop__chunk **chunk);

/* Recursive halving and doubling over count elements. With p the largest power of two <= n and
 * rem = n - p, the first 2*rem ranks pair up and the even one of each pair folds into the odd
 * one, which acts for both as virtual rank r/2 (the others are r - rem). In the halving round
 * with mask m (p/2 first, then down to 1) a rank keeps one half of the range it owns, the lower
 * one if its virtual rank has bit m clear, and its partner, the virtual rank that differs in bit
 * m, keeps the other; after log2(p) rounds virtual rank v owns the v-th of p near-equal parts.
 * With near_first the masks run the other way, 1 first, then up to p/2: neighbours combine
 * first, then pairs of pairs, so every element is combined over the fixed tree of reproducible
 * mode (hoop(3)); virtual rank v then owns the part numbered by v's bits reversed. The doubling
 * rounds run the halving ones backwards, each trading what the rank owns for the other half of
 * the range it owned before the matching halving round. */
#define HOOP__HALVING_MAX_ROUNDS 30
typedef struct hoop__halving {
  int p, rem, vrank, folded; /* folded: this rank hands its part to rank + 1 and sits out */
  int rounds;                /* log2(p) */
  int mask[HOOP__HALVING_MAX_ROUNDS]; /* each round's partner differs in this bit */
  size_t lo[HOOP__HALVING_MAX_ROUNDS], hi[HOOP__HALVING_MAX_ROUNDS]; /* owned before each round */
  size_t first, last; /* owned after the last halving round */
} hoop__halving;

void hoop__halving_plan(const hoop_comm *comm, size_t count, hoop__halving *plan);
void hoop__halving_plan_order(const hoop_comm *comm, size_t count, int near_first,
                              hoop__halving *plan);
/* The fold and the halving rounds on the plan of a rank that does not fold (allreduce.c): work
 * (count elements) ends holding [plan->first, plan->last) reduced over every rank (AVG not yet
 * divided); the rounds read sendbuf first, then work. Sends stay on arena; chunks are received
 * into HOOP__RING_RECV_DEPTH slices of slice bytes of scratch. */
hoop_result hoop__halving_reduce(hoop_comm *comm, hoop__arena *arena, const char *sendbuf,
                                 char *work, size_t count, hoop_dtype dtype, hoop_op op,
                                 char *scratch, size_t slice, const hoop__halving *plan);
/* The real rank that acts as virtual rank vrank. */
int hoop__halving_rank(const hoop__halving *plan, int vrank);
/* The doubling rounds on buf (elements of esize bytes), from [plan->first, plan->last) owned to
 * all count; each round's send is posted on arena, and only the receive is waited for: the
 * partner's later sends follow its receive of this one. */
hoop_result hoop__doubling_rounds(hoop_comm *comm, hoop__arena *arena, char *buf, size_t esize,
                                  const hoop__halving *plan);

#endif /* HOOP__COLL_H */
