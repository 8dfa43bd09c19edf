/* tune.c - every algorithm a collective can run, by name, and every cut-over between them, in two
 * tables; and HOOP_ALGO and HOOP_CHUNK_BYTES, which override them. The measurements behind each
 * cut-over are in bench/TUNING.md. Both variables are read once per communicator, at its first
 * allreduce, broadcast or allgather that has data; a bad value fails that call and every later one,
 * each with the same message. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "coll/coll.h"
#include "coll/paths.h"
#include "coll/state.h"
#include "core/env.h"

/* ---- the algorithms ----------------------------------------------------------------------------
 */

typedef hoop__algo algorithm;

/* Traits: the order in which it reads its input and finishes its result (for a path that feeds
 * and drains buffers while it runs), whether its scratch may hold the whole call, whether it runs
 * host by host (core/call.h). */
#define RING_ORDER                                                                                 \
  { HOOP__ORDER_RING, 0, 0 }
#define DIRECT_ORDER                                                                               \
  { HOOP__ORDER_DIRECT, 0, 0 }
#define SPREAD_ORDER                                                                               \
  { HOOP__ORDER_SPREAD, 0, 0 }
#define WHOLE                                                                                      \
  { HOOP__ORDER_WHOLE, 0, 0 }
#define WHOLE_SCRATCH                                                                              \
  { HOOP__ORDER_WHOLE, 1, 0 }
#define BY_HOST                                                                                    \
  { HOOP__ORDER_WHOLE, 0, 1 }

enum {
  AR_RING,
  AR_RD,
  AR_HD,
  AR_HIER,
  AR_DIRECT,
  BC_CHAIN,
  BC_TREE,
  AG_RING,
  AG_RD,
  AG_BRUCK,
  AG_DIRECT,
  BAR_DISSEMINATION,
  RS_RING,
  RS_DIRECT,
  RS_HALVING,
  A2A_PAIRWISE,
  A2AV_PAIRWISE,
  A2A_BRUCK,
  RD_TREE,
  RD_LINEAR,
  RD_DIRECT,
  GA_TREE,
  GA_LINEAR,
  SC_TREE,
  SC_LINEAR,
  AR_BOARD,
  BC_BOARD,
  AG_BOARD,
  BAR_BOARD,
  RS_BOARD,
  A2A_BOARD,
  AR_REPRO,
  AR_REPRO_ALL,
  AR_REPRO_HIER,
  AR_REPRO_HD,
  RS_REPRO,
  RS_REPRO_RD,
  RS_REPRO_HIER,
  RS_REPRO_HALVING,
  RD_REPRO,
  RD_REPRO_ALL,
  RD_REPRO_TREE,
  AR_COMPRESSED,
  RS_COMPRESSED,
  ALGORITHMS
};

static const algorithm algorithms[] = {
    [AR_RING] = {HOOP__COLL_ALLREDUCE, "ring", hoop__allreduce_ring, RING_ORDER,
                 "ring reduce-scatter + ring allgather"},
    /* Recursive doubling combines over the fixed tree itself (its fold, then its rounds). */
    [AR_RD] = {HOOP__COLL_ALLREDUCE, "rd", hoop__allreduce_rd, WHOLE_SCRATCH, "recursive doubling",
               1},
    [AR_HD] = {HOOP__COLL_ALLREDUCE, "hd", hoop__allreduce_hd, WHOLE,
               "Rabenseifner's halving-doubling"},
    [AR_HIER] = {HOOP__COLL_ALLREDUCE, "hier", hoop__allreduce_hier, BY_HOST,
                 "host by host: reduce-scatter on each host, ring across hosts, allgather on each "
                 "host (the "
                 "ring where hosts differ in rank count)"},
    [AR_DIRECT] = {HOOP__COLL_ALLREDUCE, "direct", hoop__allreduce_direct, DIRECT_ORDER,
                   "each rank reduces its segment from every other rank's part, then takes every "
                   "other segment "
                   "from its owner"},
    [BC_CHAIN] = {HOOP__COLL_BROADCAST, "chain", hoop__broadcast_chain, SPREAD_ORDER,
                  "pipelined chain around the ring"},
    [BC_TREE] = {HOOP__COLL_BROADCAST, "tree", hoop__broadcast_tree, WHOLE, "binomial tree"},
    [AG_RING] = {HOOP__COLL_ALLGATHER, "ring", hoop__allgather_ring, SPREAD_ORDER,
                 "pipelined ring"},
    [AG_RD] = {HOOP__COLL_ALLGATHER, "rd", hoop__allgather_rd, WHOLE_SCRATCH,
               "recursive doubling (Bruck's rounds when the rank count is not a power of two)"},
    [AG_BRUCK] = {HOOP__COLL_ALLGATHER, "bruck", hoop__allgather_bruck, WHOLE_SCRATCH,
                  "Bruck's algorithm"},
    [AG_DIRECT] = {HOOP__COLL_ALLGATHER, "direct", hoop__allgather_direct, WHOLE,
                   "every block straight from its owner to every rank, in one round"},
    [BAR_DISSEMINATION] = {HOOP__COLL_BARRIER, "dissemination", hoop__barrier_dissemination, WHOLE,
                           "dissemination"},
    [RS_RING] = {HOOP__COLL_REDUCE_SCATTER, "ring", hoop__reduce_scatter_ring, WHOLE_SCRATCH,
                 "the ring allreduce's first half: each rank finishes its own block"},
    [RS_DIRECT] = {HOOP__COLL_REDUCE_SCATTER, "direct", hoop__reduce_scatter_direct, WHOLE,
                   "each rank reduces its block straight from every other rank's part"},
    [RS_HALVING] = {HOOP__COLL_REDUCE_SCATTER, "halving", hoop__reduce_scatter_halving,
                    WHOLE_SCRATCH,
                    "recursive halving, log2(n) rounds (the ring where the rank count is not a "
                    "power of two)"},
    [A2A_PAIRWISE] = {HOOP__COLL_ALLTOALL, "pairwise", hoop__alltoall_pairwise, WHOLE_SCRATCH,
                      "every receive posted, then the sends to r+1, r+2, ..."},
    [A2AV_PAIRWISE] = {HOOP__COLL_ALLTOALLV, "pairwise", hoop__alltoall_pairwise, WHOLE,
                       "every receive posted, then the sends to r+1, r+2, ..."},
    [A2A_BRUCK] = {HOOP__COLL_ALLTOALL, "bruck", hoop__alltoall_bruck, WHOLE_SCRATCH,
                   "Bruck's: ceil(log2 n) rounds, each block relayed up to log2(n) times"},
    [RD_TREE] = {HOOP__COLL_REDUCE, "tree", hoop__reduce_tree, WHOLE,
                 "binomial tree: each rank reduces its children's partial results, log2(n) rounds"},
    [RD_LINEAR] = {HOOP__COLL_REDUCE, "linear", hoop__reduce_linear, WHOLE,
                   "the root receives and reduces every other rank's input in turn"},
    [RD_DIRECT] = {HOOP__COLL_REDUCE, "direct", hoop__reduce_direct, WHOLE,
                   "each rank reduces its segment from every other rank's part, then the root "
                   "gathers the segments"},
    [GA_TREE] = {HOOP__COLL_GATHER, "tree", hoop__gather_tree, WHOLE,
                 "binomial tree: each subtree's blocks travel together, log2(n) rounds"},
    [GA_LINEAR] = {HOOP__COLL_GATHER, "linear", hoop__gather_linear, WHOLE,
                   "the root receives every block straight from its owner"},
    [SC_TREE] = {HOOP__COLL_SCATTER, "tree", hoop__scatter_tree, WHOLE,
                 "binomial tree: each child gets its subtree's blocks, log2(n) rounds"},
    [SC_LINEAR] = {HOOP__COLL_SCATTER, "linear", hoop__scatter_linear, WHOLE,
                   "the root sends every block straight to its owner"},
    /* The board's (board.c): every rank's part in its own slot of one shared segment. */
    [AR_BOARD] = {HOOP__COLL_ALLREDUCE, "board", hoop__allreduce_board, WHOLE,
                  "on the board: every rank reduces every rank's slot", 1},
    [BC_BOARD] = {HOOP__COLL_BROADCAST, "board", hoop__broadcast_board, WHOLE,
                  "on the board: the root publishes, every rank copies"},
    [AG_BOARD] = {HOOP__COLL_ALLGATHER, "board", hoop__allgather_board, WHOLE,
                  "on the board: every rank copies every rank's slot"},
    [BAR_BOARD] = {HOOP__COLL_BARRIER, "board", hoop__barrier_board, WHOLE,
                   "on the board: every rank waits for every rank's slot"},
    [RS_BOARD] = {HOOP__COLL_REDUCE_SCATTER, "board", hoop__reduce_scatter_board, WHOLE,
                  "on the board: every rank reduces its block from every rank's slot", 1},
    [A2A_BOARD] = {HOOP__COLL_ALLTOALL, "board", hoop__alltoall_board, WHOLE,
                   "on the board: every rank copies its block from every rank's slot"},
    /* Reproducible mode's (repro.c): every element over the fixed tree of the ranks. */
    [AR_REPRO] = {HOOP__COLL_ALLREDUCE, "repro", hoop__allreduce_repro, WHOLE,
                  "each segment's owner reduces every rank's part over the fixed tree, then "
                  "sends it to every rank",
                  1},
    [AR_REPRO_ALL] = {HOOP__COLL_ALLREDUCE, "repro-all", hoop__allreduce_repro_all, WHOLE,
                      "every rank takes every rank's input and reduces them over the fixed tree",
                      1},
    [AR_REPRO_HIER] = {HOOP__COLL_ALLREDUCE, "repro-hier", hoop__allreduce_repro_hier, WHOLE,
                       "host by host where each host holds 2^k consecutive ranks (the tree's "
                       "subtrees): each host's segments, then the hosts', over the tree; repro "
                       "elsewhere",
                       1},
    [AR_REPRO_HD] = {HOOP__COLL_ALLREDUCE, "repro-hd", hoop__allreduce_repro_hd, WHOLE,
                     "halving-doubling with neighbours paired first (the fixed tree's pairs)", 1},
    [RS_REPRO] = {HOOP__COLL_REDUCE_SCATTER, "repro", hoop__reduce_scatter_repro, WHOLE,
                  "each rank reduces its block from every rank's part over the fixed tree", 1},
    [RS_REPRO_RD] = {HOOP__COLL_REDUCE_SCATTER, "repro-rd", hoop__reduce_scatter_repro_rd, WHOLE,
                     "the whole input allreduced by recursive doubling, this rank's block kept", 1},
    [RS_REPRO_HIER] = {HOOP__COLL_REDUCE_SCATTER, "repro-hier", hoop__reduce_scatter_repro_hier,
                       WHOLE,
                       "host by host where each host holds 2^k consecutive ranks: each host's "
                       "blocks, then the hosts', over the tree; repro elsewhere",
                       1},
    [RS_REPRO_HALVING] = {HOOP__COLL_REDUCE_SCATTER, "repro-halving",
                          hoop__reduce_scatter_repro_halving, WHOLE_SCRATCH,
                          "recursive halving with neighbours paired first (a power-of-two rank "
                          "count; repro-rd elsewhere)",
                          1},
    [RD_REPRO] = {HOOP__COLL_REDUCE, "repro", hoop__reduce_repro, WHOLE,
                  "each segment's owner reduces every rank's part over the fixed tree, then sends "
                  "it to the root",
                  1},
    /* A call with a wire format (compressed.c), where the job's hosts take one. */
    [AR_COMPRESSED] = {HOOP__COLL_ALLREDUCE, "compressed", hoop__allreduce_compressed, BY_HOST,
                       "host by host, the partial sums between hosts in the call's wire format, "
                       "each block summed by one rank (hier where the call is exact)"},
    [RS_COMPRESSED] = {HOOP__COLL_REDUCE_SCATTER, "compressed", hoop__reduce_scatter_compressed,
                       BY_HOST,
                       "host by host, the partial sums between hosts in the call's wire "
                       "format (the ring where the call is exact)"},
    [RD_REPRO_TREE] = {HOOP__COLL_REDUCE, "repro-tree", hoop__reduce_repro_tree, WHOLE,
                       "recursive doubling's fold, then a binomial tree over the rest towards "
                       "the first, which sends the result to the root",
                       1},
    [RD_REPRO_ALL] = {HOOP__COLL_REDUCE, "repro-all", hoop__reduce_repro_all, WHOLE,
                      "the root takes every rank's input and reduces them over the fixed tree", 1},
};

static const char *const coll_names[HOOP__COLL_COUNT] = {
    "allreduce", "broadcast", "allgather", "barrier", "reduce_scatter",
    "alltoall",  "alltoallv", "reduce",    "gather",  "scatter"};

/* HOOP_ALGO's single words, as before it named collectives: a family for every collective. */
static const struct family {
  const char *name;
  const char *per_coll[HOOP__COLL_COUNT]; /* NULL: the collective chooses as under auto */
} families[] = {
    {"ring", {"ring", "chain", "ring", NULL, "ring"}},
    {"rd", {"rd", "tree", "rd", NULL}},
    {"hd", {"hd", "tree", "rd", NULL}},
};

/* ---- the cut-overs ----------------------------------------------------------------------------
 */

/* A row applies to a call of coll whose bytes (allgather: the gathered bytes) are at most
 * max_bytes, on a job whose shape has every bit of when; the first row that applies wins. */
#define ANY 0u
#define TWO_RANKS 1u    /* exactly 2 ranks */
#define POW2 2u         /* a power-of-two rank count */
#define NOT_POW2 4u     /* any other */
#define ONE_HOST 8u     /* every rank on this host */
#define CROWDED 16u     /* every rank on this host, and more ranks than its CPUs */
#define HOSTS 32u       /* several hosts, each with the same number of ranks, at least 2 */
#define SHARED 64u      /* every pair on a transport whose ranks share their host (shared memory) */
#define REGISTERED 128u /* every pair on a transport that registers memory (verbs), alike */
#define BOARD 256u      /* the communicator has a board (every rank on one host, 2 to 8 ranks) */
#define SOLO 512u       /* several hosts, one rank on each */
#define NO_LIMIT SIZE_MAX

typedef struct cutover {
  hoop__coll coll;
  unsigned when;
  size_t max_bytes;
  const algorithm *algo; /* one of the algorithms above */
} cutover;

static const cutover cutovers[] = {
    /* Small calls on one host: through the board, with no message, frame or queue (board.c). The
     * sizes compared are as below (an allgather's gathered bytes, a reduce-scatter's and an
     * all-to-all's whole input); the measurements are in bench/TUNING.md. */
    {HOOP__COLL_ALLREDUCE, BOARD, HOOP__BOARD_PAYLOAD, &algorithms[AR_BOARD]},
    /* A 2-rank broadcast of 4 KiB went faster as a message (0.81 of its time on the board);
     * from 4 ranks on the board won at every size up to its slot's (TUNING.md). */
    {HOOP__COLL_BROADCAST, BOARD | TWO_RANKS, 2048, &algorithms[BC_BOARD]},
    {HOOP__COLL_ALLGATHER, BOARD, HOOP__BOARD_PAYLOAD, &algorithms[AG_BOARD]},
    {HOOP__COLL_BARRIER, BOARD, NO_LIMIT, &algorithms[BAR_BOARD]},
    {HOOP__COLL_REDUCE_SCATTER, BOARD, HOOP__BOARD_PAYLOAD, &algorithms[RS_BOARD]},
    {HOOP__COLL_ALLTOALL, BOARD, HOOP__BOARD_PAYLOAD, &algorithms[A2A_BOARD]},
    /* 2 ranks: rd's one exchange wins until the ring (= halving-doubling there) moves half the
     * bytes per rank; over shared memory sooner (rd's copies of the whole buffer cost more than
     * a wait: 13.0 against 11.4 us at 64 KiB, 105 against 34 at 256 KiB). */
    {HOOP__COLL_ALLREDUCE, TWO_RANKS | SHARED, 32 * 1024, &algorithms[AR_RD]},
    {HOOP__COLL_ALLREDUCE, TWO_RANKS | SHARED, NO_LIMIT, &algorithms[AR_RING]},
    {HOOP__COLL_ALLREDUCE, TWO_RANKS, 256 * 1024, &algorithms[AR_RD]},
    {HOOP__COLL_ALLREDUCE, TWO_RANKS, NO_LIMIT, &algorithms[AR_RING]},
    {HOOP__COLL_ALLREDUCE, ANY, 32 * 1024, &algorithms[AR_RD]},
    /* 3 ranks and more on one host: each rank reduces its segment straight from the others' parts
     * and takes the others' segments from their owners, with no chain of hops between. 4 ranks on
     * 2 cores: 3.5x halving-doubling at 64 KiB, 1.3x at 4 MiB, level with the ring from 16 MiB. */
    {HOOP__COLL_ALLREDUCE, ONE_HOST, NO_LIMIT, &algorithms[AR_DIRECT]},
    /* Several ranks on each host: the network carries 2(H-1)/H of the buffer per host instead of
     * the flat ring's 2(n-1)/n, and the hops within hosts share memory. On 4 hosts of 2 ranks at
     * 1 Gbit/s it beat halving-doubling from 64 KiB and the ring at every size (TUNING.md). */
    {HOOP__COLL_ALLREDUCE, HOSTS, NO_LIMIT, &algorithms[AR_HIER]},
    /* Halving-doubling's 2 log2(n) rounds beat the ring's 2(n-1) waits until the ring's pipelining
     * wins (across hosts, as each round's end idles the links while the ring streams); and
     * sooner still when ranks fold, whose whole-buffer transfers cost more than the rounds save. */
    {HOOP__COLL_ALLREDUCE, POW2, 1024 * 1024, &algorithms[AR_HD]},
    {HOOP__COLL_ALLREDUCE, NOT_POW2, 256 * 1024, &algorithms[AR_HD]},
    {HOOP__COLL_ALLREDUCE, ANY, NO_LIMIT, &algorithms[AR_RING]},
    /* The tree's fewer hops win for small buffers and at 2 ranks; on a crowded host at every size
     * over shared memory: there is no link to fill, and the chain's ranks pay a wakeup per chunk
     * per hop. Over TCP on a crowded host, small calls one after another go faster down the chain:
     * a send there costs the sender the loopback delivery, and the tree's root makes log2(n) of
     * them per call where every chain rank makes one (4 ranks on 2 cores, 8 B: 2.9-6.2 us against
     * 8.2-11.6; 3 ranks: 3.4-5.5 against 7.9-11.0; level at 32 KiB; TUNING.md). */
    {HOOP__COLL_BROADCAST, TWO_RANKS, NO_LIMIT, &algorithms[BC_TREE]},
    {HOOP__COLL_BROADCAST, BOARD, HOOP__BOARD_PAYLOAD, &algorithms[BC_BOARD]},
    {HOOP__COLL_BROADCAST, CROWDED | SHARED, NO_LIMIT, &algorithms[BC_TREE]},
    {HOOP__COLL_BROADCAST, CROWDED, 32 * 1024, &algorithms[BC_CHAIN]},
    {HOOP__COLL_BROADCAST, CROWDED, NO_LIMIT, &algorithms[BC_TREE]},
    {HOOP__COLL_BROADCAST, ANY, 64 * 1024 - 1, &algorithms[BC_TREE]},
    {HOOP__COLL_BROADCAST, ANY, NO_LIMIT, &algorithms[BC_CHAIN]},
    /* log2(n) rounds beat the ring's n-1 hops up to a size; recursive doubling (power-of-two rank
     * counts) goes further than Bruck, which stages and rotates; across hosts less far. */
    {HOOP__COLL_ALLGATHER, POW2 | ONE_HOST, 4 * 1024 * 1024, &algorithms[AG_RD]},
    {HOOP__COLL_ALLGATHER, POW2, 1024 * 1024, &algorithms[AG_RD]},
    {HOOP__COLL_ALLGATHER, ANY, 256 * 1024, &algorithms[AG_BRUCK]},
    {HOOP__COLL_ALLGATHER, ANY, NO_LIMIT, &algorithms[AG_RING]},
    {HOOP__COLL_BARRIER, ANY, NO_LIMIT, &algorithms[BAR_DISSEMINATION]},
    /* Over shared memory each rank reduces its block straight from the others' parts (one copy
     * out of each peer's buffer with CMA, no chain of hops): 1.0-7.8x the faster of Open MPI and
     * MPICH on 2 and 4 ranks (TUNING.md). Elsewhere recursive halving's log2(n) waits beat the
     * ring's n-1 while the buffer is small (4 ranks over TCP: 35 against 95 us at 4 KiB, level
     * from 4 MiB), as halving-doubling does for allreduce up to 1 MiB; on one host then the
     * direct reads, across hosts the ring, whose every link carries (n-1)/n of the input once. */
    {HOOP__COLL_REDUCE_SCATTER, ONE_HOST | SHARED, NO_LIMIT, &algorithms[RS_DIRECT]},
    {HOOP__COLL_REDUCE_SCATTER, POW2, 1024 * 1024, &algorithms[RS_HALVING]},
    {HOOP__COLL_REDUCE_SCATTER, ONE_HOST, NO_LIMIT, &algorithms[RS_DIRECT]},
    {HOOP__COLL_REDUCE_SCATTER, ANY, NO_LIMIT, &algorithms[RS_RING]},
    /* All-to-all: pairwise, but Bruck's log2(n) rounds for small blocks where messages are dear
     * (TCP, this VM: 4 ranks 64 B 42 us against 70, 4 KiB 47 against 57, 32 KiB 90 against 74; 6
     * ranks 48 B 90 against 126, 4 KiB level; 3 ranks level). On shared memory pairwise won at
     * every size measured (4 and 8 ranks). */
    {HOOP__COLL_ALLTOALL, SHARED, NO_LIMIT, &algorithms[A2A_PAIRWISE]},
    {HOOP__COLL_ALLTOALL, TWO_RANKS, NO_LIMIT, &algorithms[A2A_PAIRWISE]},
    {HOOP__COLL_ALLTOALL, ANY, 4096, &algorithms[A2A_BRUCK]},
    {HOOP__COLL_ALLTOALL, ANY, NO_LIMIT, &algorithms[A2A_PAIRWISE]},
    {HOOP__COLL_ALLTOALLV, ANY, NO_LIMIT, &algorithms[A2AV_PAIRWISE]},
    /* Reduce: on shared memory the root reads every rank's input in turn (2 and 4 ranks, this VM:
     * 4 KiB 1.4 us against the tree's 2.4, 64 KiB 13.7 against 33, 1 MiB 420 against 737); across
     * hosts the tree's log2(n) rounds for small inputs. Large inputs go direct, each rank moving
     * about one input (2 ranks, 16 MiB: 2.2 ms against the tree's 3.5). Gather and scatter: the
     * root's one message per rank, but the tree's log2(n) rounds across hosts where many small
     * blocks would each pay a message's latency. bench/TUNING.md. */
    {HOOP__COLL_REDUCE, ONE_HOST | SHARED, 1024 * 1024, &algorithms[RD_LINEAR]},
    {HOOP__COLL_REDUCE, TWO_RANKS, 1024 * 1024, &algorithms[RD_TREE]},
    {HOOP__COLL_REDUCE, ANY, 64 * 1024, &algorithms[RD_TREE]},
    {HOOP__COLL_REDUCE, ANY, NO_LIMIT, &algorithms[RD_DIRECT]},
    {HOOP__COLL_GATHER, ONE_HOST, NO_LIMIT, &algorithms[GA_LINEAR]},
    {HOOP__COLL_GATHER, TWO_RANKS, NO_LIMIT, &algorithms[GA_LINEAR]},
    {HOOP__COLL_GATHER, ANY, 64 * 1024, &algorithms[GA_TREE]},
    {HOOP__COLL_GATHER, ANY, NO_LIMIT, &algorithms[GA_LINEAR]},
    {HOOP__COLL_SCATTER, ONE_HOST, NO_LIMIT, &algorithms[SC_LINEAR]},
    {HOOP__COLL_SCATTER, TWO_RANKS, NO_LIMIT, &algorithms[SC_LINEAR]},
    {HOOP__COLL_SCATTER, ANY, 64 * 1024, &algorithms[SC_TREE]},
    {HOOP__COLL_SCATTER, ANY, NO_LIMIT, &algorithms[SC_LINEAR]},
};
#define CUTOVERS (sizeof cutovers / sizeof cutovers[0])

/* Reproducible mode's rows for the reducing collectives (hoop__coll_repro): only algorithms that
 * combine over the fixed tree. Small allreduces run as in the default mode (the board, recursive
 * doubling, whose order is the tree's); a small reduce's root takes every input whole, one round
 * where the owner algorithm has two. */
static const cutover repro_cutovers[] = {
    {HOOP__COLL_ALLREDUCE, BOARD, HOOP__BOARD_PAYLOAD, &algorithms[AR_BOARD]},
    {HOOP__COLL_ALLREDUCE, ANY, 32 * 1024, &algorithms[AR_RD]},
    {HOOP__COLL_ALLREDUCE, HOSTS, NO_LIMIT, &algorithms[AR_REPRO_HIER]},
    {HOOP__COLL_ALLREDUCE, TWO_RANKS, NO_LIMIT, &algorithms[AR_REPRO_HD]},
    {HOOP__COLL_ALLREDUCE, ONE_HOST, NO_LIMIT, &algorithms[AR_REPRO]},
    {HOOP__COLL_ALLREDUCE, POW2, 1024 * 1024, &algorithms[AR_REPRO_HD]},
    {HOOP__COLL_ALLREDUCE, NOT_POW2, 256 * 1024, &algorithms[AR_REPRO_HD]},
    {HOOP__COLL_ALLREDUCE, ANY, NO_LIMIT, &algorithms[AR_REPRO]},
    {HOOP__COLL_REDUCE_SCATTER, BOARD, HOOP__BOARD_PAYLOAD, &algorithms[RS_BOARD]},
    {HOOP__COLL_REDUCE_SCATTER, SHARED, NO_LIMIT, &algorithms[RS_REPRO]},
    {HOOP__COLL_REDUCE_SCATTER, POW2, 256 * 1024, &algorithms[RS_REPRO_HALVING]},
    {HOOP__COLL_REDUCE_SCATTER, ANY, 16 * 1024, &algorithms[RS_REPRO_RD]},
    {HOOP__COLL_REDUCE_SCATTER, HOSTS, NO_LIMIT, &algorithms[RS_REPRO_HIER]},
    {HOOP__COLL_REDUCE_SCATTER, ANY, NO_LIMIT, &algorithms[RS_REPRO]},
    {HOOP__COLL_REDUCE, ONE_HOST | SHARED, 1024 * 1024, &algorithms[RD_REPRO_ALL]},
    {HOOP__COLL_REDUCE, ANY, 64 * 1024, &algorithms[RD_REPRO_TREE]},
    {HOOP__COLL_REDUCE, ANY, NO_LIMIT, &algorithms[RD_REPRO]},
};
#define REPRO_CUTOVERS (sizeof repro_cutovers / sizeof repro_cutovers[0])

/* The job's shape, the same on every rank: the rank count, and the rank table's host counts. */
static unsigned job_shape(const hoop_comm *comm) {
  int n = comm->size;
  unsigned shape = (n & (n - 1)) == 0 ? POW2 : NOT_POW2;
  if (n == 2)
    shape |= TWO_RANKS;
  if (comm->local_size == n)
    shape |= ONE_HOST;
  if (comm->coll->crowded)
    shape |= CROWDED;
  if (comm->coll->hosts && comm->coll->hosts->even)
    shape |= HOSTS;
  if (comm->coll->all_shared)
    shape |= SHARED;
  if (comm->coll->all_registered)
    shape |= REGISTERED;
  if (hoop__transport_board(comm))
    shape |= BOARD;
  if (comm->coll->hosts && comm->coll->hosts->count == n && n > 1)
    shape |= SOLO;
  return shape;
}

static const algorithm *find(hoop__coll coll, const char *name, size_t len) {
  if (len == 4 && strncmp(name, "flat", 4) == 0) /* the board's algorithms' name up to 0.1 */
    name = "board", len = 5;
  for (size_t i = 0; i < ALGORITHMS; i++)
    if (algorithms[i].coll == coll && strlen(algorithms[i].name) == len &&
        strncmp(algorithms[i].name, name, len) == 0)
      return &algorithms[i];
  return NULL;
}

/* ---- HOOP_ALGO ------------------------------------------------------------------------------- */

static hoop_result bad_algo(hoop_comm *comm, const char *text, const char *why) {
  return hoop__set_error(
      comm, HOOP_ERR_INVALID_ARG,
      "%s: HOOP_ALGO '%s' %s (auto, ring, rd, hd, or a list such as "
      "'allreduce:hd,broadcast:chain'; allreduce: ring, rd, hd, hier, direct, board, repro, "
      "repro-all, repro-hier, repro-hd, compressed; broadcast: chain, tree, board; allgather: "
      "ring, rd, bruck, "
      "direct, board; "
      "barrier: dissemination, board; reduce_scatter: ring, direct, halving, board, repro, "
      "repro-rd, repro-hier, repro-halving, compressed; "
      "alltoall: pairwise, bruck, board; alltoallv: pairwise; reduce: tree, linear, direct, "
      "repro, repro-all, repro-tree; gather, scatter: tree, linear)",
      comm->call, text, why);
}

/* One word of HOOP_ALGO: a family, or coll:algorithm. */
static hoop_result parse_word(hoop_comm *comm, const char *text, const char *word, size_t len,
                              const algorithm **forced) {
  const char *colon = memchr(word, ':', len);
  if (!colon) {
    if (len == 4 && strncmp(word, "auto", 4) == 0) {
      for (int c = 0; c < HOOP__COLL_COUNT; c++)
        forced[c] = NULL;
      return HOOP_OK;
    }
    for (size_t f = 0; f < sizeof families / sizeof families[0]; f++)
      if (strlen(families[f].name) == len && strncmp(families[f].name, word, len) == 0) {
        for (int c = 0; c < HOOP__COLL_COUNT; c++) {
          const char *name = families[f].per_coll[c];
          forced[c] = name ? find((hoop__coll)c, name, strlen(name)) : NULL;
        }
        return HOOP_OK;
      }
    return bad_algo(comm, text, "is not one of these");
  }
  for (int c = 0; c < HOOP__COLL_COUNT; c++)
    if (strlen(coll_names[c]) == (size_t)(colon - word) &&
        strncmp(coll_names[c], word, (size_t)(colon - word)) == 0) {
      size_t name_len = len - (size_t)(colon - word) - 1;
      if (name_len == 4 && strncmp(colon + 1, "auto", 4) == 0) {
        forced[c] = NULL;
        return HOOP_OK;
      }
      forced[c] = find((hoop__coll)c, colon + 1, name_len);
      return forced[c] ? HOOP_OK : bad_algo(comm, text, "names an algorithm the collective lacks");
    }
  return bad_algo(comm, text, "names no collective");
}

static hoop_result parse_algo(hoop_comm *comm, const char *text) {
  const algorithm *forced[HOOP__COLL_COUNT] = {NULL};
  const char *at = text;
  do {
    size_t len = strcspn(at, ",");
    if (len == 0)
      return bad_algo(comm, text, "has an empty entry");
    hoop_result result = parse_word(comm, text, at, len, forced);
    if (result != HOOP_OK)
      return result;
    at += len;
  } while (*at++ == ',');
  for (int c = 0; c < HOOP__COLL_COUNT; c++) {
    comm->coll->forced_algo[c] = forced[c] ? (int)(forced[c] - algorithms) : -1;
    if (forced[c])
      HOOP__INFO(HOOP_SUBSYS_COLL, "HOOP_ALGO=%s: %s runs %s (%s) at every size", text,
                 coll_names[c], forced[c]->name, forced[c]->what);
  }
  return HOOP_OK;
}

static hoop_result read_tuning(hoop_comm *comm) {
  long chunk;
  if (hoop__parse_int(hoop__env_get("HOOP_CHUNK_BYTES"), HOOP__CHUNK_MIN_BYTES,
                      HOOP__CHUNK_MAX_BYTES, &chunk) != 0)
    return hoop__set_error(comm, HOOP_ERR_INVALID_ARG,
                           "%s: HOOP_CHUNK_BYTES '%s' is not a number of bytes in %d..%ld",
                           comm->call, hoop__env_get("HOOP_CHUNK_BYTES"), HOOP__CHUNK_MIN_BYTES,
                           HOOP__CHUNK_MAX_BYTES);
  comm->coll->chunk_bytes = (size_t)chunk;
  hoop_result result = parse_algo(comm, hoop__env_get("HOOP_ALGO"));
  if (result != HOOP_OK)
    return result;
  /* Every rank must choose alike: the rank count and the host's CPU count are the same on all of
   * them when all share one host. */
  comm->coll->crowded = comm->local_size == comm->size && hoop__host_crowded(comm);
  /* Alike on every rank too: shared memory joins a pair only where both ends offer it. And a
   * transport that registers memory (verbs) serves a pair only where every rank offered it, so
   * this rank's peers all being on it says the same of every rank's, unless shared memory took
   * pairs on some host: not when HOOP_TRANSPORT names one transport (it must be alike on every
   * rank), nor when every host runs one rank. */
  unsigned caps = ~0u;
  for (int peer = 0; peer < comm->size; peer++)
    if (peer != comm->rank)
      caps &= hoop__transport_of(comm, peer)->ops->caps;
  comm->coll->all_shared = (caps & HOOP__TCAP_SAME_HOST) != 0;
  if (!comm->coll->hosts && (result = hoop__hosts_plan(comm)) != HOOP_OK)
    return result;
  comm->coll->all_registered =
      (caps & HOOP__TCAP_REGISTERS) &&
      (strcmp(comm->transport_mode, "auto") != 0 || comm->coll->hosts->count == comm->size);
  /* Every rank is in this call (the first that tunes), and decides alike whether to try. */
  if (comm->coll->all_shared && comm->local_size == comm->size &&
      (result = hoop__coll_board_open(comm)) != HOOP_OK)
    return result;
  comm->coll->tuning_read = 1;
  return HOOP_OK;
}

hoop_result hoop__coll_tune(hoop_comm *comm, const hoop__coll_args *args, const hoop__algo **out) {
  hoop_result result;
  if (!comm->coll->tuning_read && (result = read_tuning(comm)) != HOOP_OK)
    return result;
  /* Reproducible mode's reducing calls take only algorithms that combine over the fixed tree:
   * HOOP_ALGO's choice where it does (any other passed over, said once at info), else its own
   * rows. */
  /* A call with a wire format goes host by host where the job's hosts take one; elsewhere it is
   * exact, as every call within a host is. */
  if (args->compress && hoop__compressed_fits(comm)) {
    *out = &algorithms[args->coll == HOOP__COLL_ALLREDUCE ? AR_COMPRESSED : RS_COMPRESSED];
    return HOOP_OK;
  }
  int repro = hoop__coll_repro(comm, args->coll);
  int forced = comm->coll->forced_algo[args->coll];
  if (forced >= 0 && (!repro || algorithms[forced].repro)) {
    *out = &algorithms[forced];
    return HOOP_OK;
  }
  if (forced >= 0 && !comm->coll->repro_told) {
    HOOP__INFO(HOOP_SUBSYS_COLL,
               "reproducible mode: HOOP_ALGO's %s:%s does not combine over the fixed tree; "
               "reducing calls choose among those that do",
               coll_names[args->coll], algorithms[forced].name);
    comm->coll->repro_told = 1;
  }
  /* The rows compare the gathered result of an allgather, and a reduce-scatter's or an
   * alltoall's whole input. */
  size_t bytes = args->coll == HOOP__COLL_ALLGATHER || args->coll == HOOP__COLL_REDUCE_SCATTER ||
                         args->coll == HOOP__COLL_ALLTOALL || args->coll == HOOP__COLL_GATHER ||
                         args->coll == HOOP__COLL_SCATTER
                     ? args->bytes * (size_t)comm->size
                     : args->bytes;
  /* The job's shape never changes: a call of the size before (in the mode before) takes the
   * algorithm before, without the walk down the table (tens of rows, as long as the rest of a
   * small call's bookkeeping). */
  if (comm->coll->tune_last[args->coll].algo && comm->coll->tune_last[args->coll].bytes == bytes &&
      comm->coll->tune_last[args->coll].repro == repro) {
    *out = comm->coll->tune_last[args->coll].algo;
    return HOOP_OK;
  }
  const cutover *rows = repro ? repro_cutovers : cutovers;
  size_t nrows = repro ? REPRO_CUTOVERS : CUTOVERS;
  unsigned shape = job_shape(comm);
  for (size_t i = 0; i < nrows; i++) {
    const cutover *row = &rows[i];
    if (row->coll == args->coll && (shape & row->when) == row->when && bytes <= row->max_bytes) {
      *out = row->algo;
      comm->coll->tune_last[args->coll].bytes = bytes;
      comm->coll->tune_last[args->coll].algo = row->algo;
      comm->coll->tune_last[args->coll].repro = repro;
      return HOOP_OK;
    }
  }
  return hoop__set_error(comm, HOOP_ERR_SYSTEM, "%s: no algorithm fits (tune.c's table)",
                         comm->call);
}

/* ---- the device paths -------------------------------------------------------------------------
 */

/* A call whose buffers some rank has in device memory may run otherwise than staged through host
 * memory (mem/stage.c, which serves every call): the first row here whose needs the job meets and
 * whose path takes the call runs it. The needs are the job's shape (as the cut-overs'; the pairs'
 * transports' capabilities among it), the chosen algorithm's traits, and the capabilities of a
 * memory kind some rank has loaded (agreed once per communicator, coll/paths.c). Every input is
 * alike on every rank, and each path settles with its peers whether every rank can take the call,
 * so all ranks run the same path. */
typedef struct path_row {
  const char *name;
  unsigned when;      /* every bit of the job's shape */
  int by_host;        /* the algorithm runs host by host */
  int compressed;     /* only compressed calls */
  unsigned kind_caps; /* HOOP__MEMCAP_* some rank's memory kind has */
  unsigned colls;     /* the collectives it serves, 1 << HOOP__COLL_*: the others' are staged */
  const hoop__path *path;
} path_row;

#define COLL(c) (1u << HOOP__COLL_##c)

static const path_row paths[] = {
    /* All on one host, every pair sharing it: each rank reads its peers' device buffers mapped
     * into its own context, and no byte crosses to the host and back. */
    {"ipc", ONE_HOST | SHARED, 0, 0, HOOP__MEMCAP_MAP,
     COLL(ALLREDUCE) | COLL(BROADCAST) | COLL(ALLGATHER) | COLL(REDUCE_SCATTER) | COLL(ALLTOALL),
     &hoop__path_ipc},
    /* Hosts with as many ranks each, an algorithm that goes host by host: the steps within a host
     * mapped, the step between hosts through host memory (each host settles for itself). */
    {"ipc+hier", HOSTS, 1, 0, HOOP__MEMCAP_MAP, COLL(ALLREDUCE), &hoop__path_ipc},
    /* The same for a compressed reduce-scatter (each host's sums by IPC, the codec on the device
     * between hosts); and hosts of one rank, a compressed allreduce or reduce-scatter, the rank
     * alone on its host (nothing to map), so that its step between hosts encodes on the device
     * too. */
    {"ipc+hier", HOSTS, 1, 1, HOOP__MEMCAP_MAP, COLL(REDUCE_SCATTER), &hoop__path_ipc},
    {"ipc+hier", SOLO, 1, 1, HOOP__MEMCAP_MAP, COLL(ALLREDUCE) | COLL(REDUCE_SCATTER),
     &hoop__path_ipc},
    /* Every pair on a transport that registers memory: the algorithm runs on the device buffers
     * themselves, the network reading and writing GPU memory (GPUDirect RDMA). */
    {"gdr", REGISTERED, 0, 0, HOOP__MEMCAP_NET, COLL(ALLREDUCE) | COLL(BROADCAST) | COLL(ALLGATHER),
     &hoop__path_gdr},
};
#define PATHS (sizeof paths / sizeof paths[0])

int hoop__coll_path(hoop_comm *comm, const hoop__coll_args *args, const hoop__algo *algo,
                    hoop__algo_fn prepare, hoop_result *result) {
  *result = HOOP_OK;
  /* A build with no device memory kind never agrees on one (every rank runs the same build); a
   * communicator whose ranks agreed that none has one never asks again. */
  if (comm->size < 2 || !comm->coll->hosts || !hoop__mem_kinds_built() ||
      comm->coll->path_kinds == HOOP__PATH_KINDS_ASKED)
    return 0;
  /* Reproducible mode: only the path whose kernels combine over the fixed tree, CUDA IPC on one
   * host, where every rank's part fits one pass of the device kind's tree kernel; the others'
   * reducing calls are staged and reduced on the host, alike on every rank. */
  /* Compressed calls go by CUDA IPC only: exact on one host, and host by host with the device
   * kind's codec in the step between hosts, alike with the staged call's there (error feedback's
   * residuals then kept in device memory). */
  int compressed = args->compress && hoop__compressed_fits(comm);
  if (compressed && !hoop__mem_cuda.encode)
    return 0;
  int repro = hoop__coll_repro(comm, args->coll);
  if (repro && (!hoop__mem_cuda.reduce_many_tree || comm->size > hoop__mem_cuda.many_max))
    return 0;
  /* Each path's settings (alike on every rank) bound the calls it may take from below. */
  if (!comm->coll->path_floor_known) {
    comm->coll->path_floor = SIZE_MAX;
    for (size_t i = 0; i < PATHS; i++) {
      size_t floor = paths[i].path->floor(comm);
      if (floor < comm->coll->path_floor)
        comm->coll->path_floor = floor;
    }
    comm->coll->path_floor_known = 1;
  }
  if (args->bytes * (size_t)comm->size < comm->coll->path_floor)
    return 0;
  unsigned shape = job_shape(comm);
  for (size_t i = 0; i < PATHS; i++) {
    const path_row *row = &paths[i];
    if (!(row->colls & (1u << args->coll)) || (shape & row->when) != row->when ||
        (row->by_host && !algo->traits.by_host) ||
        (repro && (row->by_host || row->path != &hoop__path_ipc)) ||
        (compressed ? row->path != &hoop__path_ipc : row->compressed))
      continue;
    int go = row->path->enabled(comm, args, algo, row->by_host, result);
    if (go > 0) {
      int kinds = hoop__paths_kinds(comm, result);
      if (kinds < 0)
        return 1;
      go = (kinds & row->kind_caps) != 0;
    }
    if (go < 0 || (go > 0 && row->path->run(comm, args, algo, prepare, result)))
      return 1;
  }
  return 0;
}

void hoop__paths_free(hoop_comm *comm) {
  for (size_t i = 0; i < PATHS; i++)
    paths[i].path->free(comm);
}
