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
  long flight_slot; /* the running call's entry in the flight recorder (dispatch.c) */
  /* What hoop_comm_stats gives (stats.c, dispatch.c): by collective, calls, payload bytes, time
   * inside them and time waiting in them, written at each call's end and read from any thread. */
  struct {
    _Atomic uint64_t calls, bytes, time_ns, wait_ns;
  } tally[HOOP__COLL_COUNT];
  double began; /* when the communicator's collectives began (hoop__now) */
  /* The job's communicator only: how long this rank waited in its last calls that need every
   * rank, by seq % HOOP__WIRE_STATS_SAMPLES (seq 0: none yet), which a STATS to the rendezvous
   * server describes at each multiple of stats_period_s of the wall clock (stats_due: the next;
   * 0: none are sent). */
  struct {
    uint64_t seq;
    uint32_t wait_us;
  } samples[HOOP__WIRE_STATS_SAMPLES];
  double stats_period_s, stats_due;
  double rdzv_looked_at; /* when a call last read the rendezvous connection (dispatch.c) */
};

#endif
