/* state.h - the collectives' state of a communicator (hoop_comm.coll), which only lib/coll sees
 * (lib/floors: "own"): the tuning table's settings and last choices, the ring's blocks, the job's
 * host groups, the fused calls' buffer, the device paths' state, the point-to-point stage and the
 * request arena's spare block. The communicator's life makes and frees it through coll.h. */
#ifndef HOOP__COLL_STATE_H
#define HOOP__COLL_STATE_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "core/internal.h"
#include "util/clock.h"

#define HOOP__P2P_STAGES 4

struct hoop__coll_state {
  /* HOOP_CHUNK_BYTES and HOOP_ALGO (per collective, an index in tune.c's table of algorithms,
   * or -1 to choose by size), read at the first collective that accepts them: getenv scans the
   * whole environment, which small calls would pay for every time. */
  int tuning_read;
  int forced_algo[HOOP__COLL_COUNT];
  size_t chunk_bytes;
  /* Each collective's last choice (tune.c): the size and mode it was made for, the algorithm. */
  struct {
    size_t bytes;
    const void *algo;
    int repro; /* chosen in reproducible mode (which has rows of its own) */
  } tune_last[HOOP__COLL_COUNT];
  const char *algo_name; /* the running collective's algorithm (tune.c), for the trace */
  int repro_told;        /* reproducible mode passed over HOOP_ALGO's choice, said (tune.c) */
  /* Every rank is on this host and they outnumber its online CPUs: ranks take turns on the
   * cores, so hops cost wakeups and copies rather than link time (same on every rank). */
  int crowded;
  /* Alike on every rank (tune.c): every pair on a transport whose ranks share their host; every
   * pair on one that registers memory. */
  int all_shared;
  int all_registered;
  struct hoop__hosts *hosts; /* the job's hosts, for host-by-host algorithms (hosts.c) */
  size_t *block_offset;      /* size entries each: the ring blocks of the running collective */
  size_t *block_length;
  void *fusion; /* hoop_allreduce_many's packing buffer, fusion_bytes long (fused.c) */
  size_t fusion_bytes;
  /* The device paths (tune.c's table of paths): the memory kinds' capabilities some rank has
   * (paths.c, 0 until asked), CUDA IPC's descriptors and mappings (path_ipc.c), GPUDirect
   * RDMA's settings (path_gdr.c); the smallest call any device path may take, once known: the
   * small calls of a CUDA build skip asking every path. */
  unsigned path_kinds;
  size_t path_floor;
  int path_floor_known;
  struct hoop__ipc *ipc;
  struct hoop__gdr *gdr;
  /* Point-to-point messages' host copies of device buffers, kept for the next messages (a
   * page-locked allocation costs far more than a small message): p2p.c, under call_lock. */
  hoop__host_buf p2p_stage[HOOP__P2P_STAGES];
  int p2p_stage_busy[HOOP__P2P_STAGES];
  struct hoop__arena_block *arena_spare; /* a request block kept for the next call (ring.c) */
  /* Compressed calls' pieces and sums, and a reduce-scatter's input laid out by place
   * (compressed.c), kept for the next calls. */
  hoop__host_buf compress_buf, compress_input;
  long flight_slot; /* the running call's entry in the flight recorder (dispatch.c) */
  /* What hoop_comm_stats gives (stats.c, dispatch.c): by collective, calls, payload bytes, time
   * inside them and time waiting in them, written at each call's end and read from any thread. */
  struct {
    _Atomic uint64_t calls, bytes, time_ns, wait_ns;
  } tally[HOOP__COLL_COUNT];
  double began; /* when the communicator's collectives began (hoop__now) */
  /* The job's communicator only: when this rank came to its last calls that need every rank
   * and how long it waited in them, by seq % HOOP__WIRE_STATS_SAMPLES (seq 0: none yet), which a
   * STATS to the rendezvous server describes at each multiple of stats_period_s of the wall clock
   * (stats_due: the next; 0: none are sent), with whose clock it read (clock: hoop__clock_id). */
  struct {
    uint64_t seq;
    uint32_t wait_us, came_us;
  } samples[HOOP__WIRE_STATS_SAMPLES];
  double stats_period_s, stats_due;
  uint64_t clock;
  /* Each peer's link figures at the last STATS (bytes, then ns; 2 x size, made at the first), so
   * that a STATS names the links slowest since the one before. */
  uint64_t *link_seen;
  double rdzv_looked_at; /* when a call last read the rendezvous connection (dispatch.c) */
};

/* ---- a call's tally, at its end (dispatch.c; inline: small calls pay for every call) ---- */

/* A counter that one thread (the call's) writes and any may read. */
static inline void hoop__tally_add(_Atomic uint64_t *counter, uint64_t v) {
  atomic_store_explicit(counter, atomic_load_explicit(counter, memory_order_relaxed) + v,
                        memory_order_relaxed);
}

/* The calls whose every rank waits for every other: how long a rank waited in one of them tells
 * how much earlier than the last rank it came. */
static inline int hoop__needs_every_rank(hoop__coll coll) {
  return coll == HOOP__COLL_ALLREDUCE || coll == HOOP__COLL_ALLGATHER ||
         coll == HOOP__COLL_BARRIER || coll == HOOP__COLL_REDUCE_SCATTER ||
         coll == HOOP__COLL_ALLTOALL || coll == HOOP__COLL_ALLTOALLV;
}

/* A call of which ended after seconds (at least the time it waited, comm->call_wait_ns), its
 * payload bytes. */
static inline void hoop__coll_tally(hoop_comm *comm, hoop__coll which, size_t bytes,
                                    double seconds) {
  hoop__coll_state *coll = comm->coll;
  uint64_t wait_ns = comm->call_wait_ns;
  hoop__tally_add(&coll->tally[which].calls, 1);
  if (bytes)
    hoop__tally_add(&coll->tally[which].bytes, bytes);
  /* Most small calls neither waited nor were timed: they add nothing more. */
  if (seconds > 0 || wait_ns) {
    uint64_t time_ns = seconds > 0 ? (uint64_t)(seconds * 1e9) : 0;
    if (time_ns < wait_ns) /* the last clock reading of a spinning wait may be a little late */
      time_ns = wait_ns;
    hoop__tally_add(&coll->tally[which].time_ns, time_ns);
    hoop__tally_add(&coll->tally[which].wait_ns, wait_ns);
  }
  if (comm->net == comm && hoop__needs_every_rank(which)) {
    uint64_t us = wait_ns / 1000;
    /* When it came, where a precise clock reading says: the call's start after a tick away,
     * else where a large call began or a call first waited. A small call back to back with the
     * last that found every message there reads none (a reading would cost it 20 ns): it came
     * last, which the server tells from the others' (0: not known). */
    double came = comm->call_came > 0 ? comm->call_came : comm->call_clock_start;
    uint32_t came_us = came > 0 ? (uint32_t)(uint64_t)(came * 1e6) : 0;
    coll->samples[comm->seq % HOOP__WIRE_STATS_SAMPLES].seq = comm->seq;
    coll->samples[comm->seq % HOOP__WIRE_STATS_SAMPLES].wait_us =
        us > UINT32_MAX ? UINT32_MAX : (uint32_t)us;
    coll->samples[comm->seq % HOOP__WIRE_STATS_SAMPLES].came_us =
        came > 0 && came_us == 0 ? 1 : came_us;
  }
}

#endif
