/* env.c - the one table of HOOP_ environment variables, and small parsers for their values. */
#include "core/env.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "core/log.h"

static const hoop__env_var env_table[] = {
    {"HOOP_RENDEZVOUS", "", "host:port of the rendezvous server (hoopd, hooprun or rank 0)"},
    {"HOOP_JOB", "default", "job id; ranks with the same id and server form one job"},
    {"HOOP_SIZE", "", "number of ranks in the job"},
    {"HOOP_RANK", "",
     "this process's rank; unset lets the server assign ranks, contiguous per host"},
    {"HOOP_GDR", "auto",
     "auto|0|1: GPUDirect RDMA for device buffers given to hoop_register over ibverbs (dma-buf, "
     "then nvidia-peermem); 0: never; 1: hoop_register fails where it cannot be had"},
    {"HOOP_JOIN", "0",
     "1: this process is a newcomer: it joins the running job HOOP_JOB at the job's next "
     "generation (hoop_comm_grow), as hooprun --max-np starts replacements; HOOP_RANK is ignored"},
    {"HOOP_RDZV_SERVE", "0",
     "1: this process hosts the rendezvous server for its job on the "
     "HOOP_RENDEZVOUS port (set it on rank 0 only)"},
    {"HOOP_LAUNCHER", "",
     "set by hooprun: its PID:START_TIME:BOOT_ID, so that the rank ends when hooprun does; "
     "empty: not watched"},
    {"HOOP_LAUNCHER_RDZV", "0",
     "set by hooprun: 1 when the rendezvous server is hooprun's own, so that the connection "
     "to it closing means hooprun is gone"},
    {"HOOP_HOSTNAME", "",
     "host name reported to the rendezvous; ranks with the same name are "
     "one host (contiguous ranks, local ranks); default: gethostname()"},
    {"HOOP_BIND_TO", "none",
     "set by hooprun --bind-to for ranks on other hosts: hoop_init_from_env binds every thread "
     "of the process to a core (core), its socket (socket) or NUMA node (numa) of the CPUs it "
     "may use, by HOOP_LOCAL_RANK of HOOP_LOCAL_SIZE; none leaves them"},
    {"HOOP_MAP_BY", "core",
     "with HOOP_BIND_TO: local ranks take cores in order (core, slot), or a socket or NUMA node "
     "after the other (socket, numa)"},
    {"HOOP_LOCAL_RANK", "", "with HOOP_BIND_TO: this rank's place among its host's ranks"},
    {"HOOP_LOCAL_SIZE", "", "with HOOP_BIND_TO: how many ranks its host runs"},
    {"HOOP_HOST_CPUS", "",
     "how many CPUs this host's ranks share, where fewer than the host has online (a taskset or "
     "cpuset around the job): whether ranks outnumber CPUs is judged against it; hooprun sets it "
     "for the ranks it starts from its own affinity mask; unset: the CPUs online"},
    {"HOOP_CUDA_PIPELINE_BYTES", "1048576",
     "a ring or direct allreduce, chain broadcast or ring allgather of at least this many bytes "
     "on device memory copies its input in and its result out piece by piece on a stream of "
     "hoop's own, overlapped with the transfers, where the driver has asynchronous copies; "
     "smaller ones are staged whole (0: every size)"},
    {"HOOP_CUDA_IPC", "1",
     "1: when every rank of a communicator is on one host (shared memory) and a call's buffers "
     "are device memory on every rank, ranks read each other's buffers directly by CUDA IPC "
     "(reductions on the GPU), falling back to staging through host memory where a rank cannot "
     "(HOOP_DEBUG=info says why); 0: always staged"},
    {"HOOP_CUDA_IPC_MIN_BYTES", "65536",
     "calls of fewer bytes (an allgather's whole result) are staged without asking whether "
     "CUDA IPC could serve them; 0: every size"},
    {"HOOP_GDR_MIN_BYTES", "65536",
     "calls of fewer bytes (an allgather's whole result) are staged without asking whether "
     "GPUDirect RDMA could serve them; 0: every size"},
    {"HOOP_FAULT", "",
     "testing aid: shrink-connect makes this rank die (SIGKILL) inside hoop_comm_shrink, right "
     "after the new generation's table comes and before it connects; empty: no fault"},
    {"HOOP_TIMEOUT", "300", "seconds any blocking step (rendezvous, connect, collective) may wait"},
    {"HOOP_TRANSPORT", "auto",
     "auto|shm|tcp|ibverbs: the data transport; auto uses shared memory "
     "between ranks of one host, and between hosts ibverbs when every "
     "rank has an active RDMA port, else tcp; a name forces it for every peer"},
    {"HOOP_SHM", "1",
     "0: under HOOP_TRANSPORT=auto, ranks of one host talk over the network "
     "transport instead of shared memory"},
    {"HOOP_SHM_CMA_BYTES", "auto",
     "shm messages of at least this many bytes are read by the receiver "
     "straight from the sender's memory (process_vm_readv, one copy) where "
     "the kernel allows it; 0: never, every message goes through the segment; "
     "auto: 0, or 262144 when this host's ranks outnumber its CPUs"},
    {"HOOP_SHM_SPIN_US", "auto",
     "microseconds a wait polls the shared-memory queues before it sleeps; "
     "auto: 1000, or 50 when this host's ranks outnumber its CPUs"},
    {"HOOP_SHM_MEMBARRIER", "1",
     "1: a rank about to sleep on shared memory fences its peers with membarrier(2), so that "
     "a message that finds its peer awake needs no fence; 0: every message fences (also when "
     "the kernel refuses membarrier)"},
    {"HOOP_SHM_BOARD", "1",
     "1: a communicator of 2 to 8 ranks, all on this host over shared memory, maps one segment "
     "for its small calls (the board); 0: they go as messages (every rank must say the same, or "
     "none has a board)"},
    {"HOOP_IB_DEV", "",
     "RDMA device for the ibverbs transport (e.g. mlx5_0, rxe0); default: the "
     "first with an active port"},
    {"HOOP_IB_PORT", "", "port of that device (1, 2...); default: its first active port"},
    {"HOOP_IB_GID_INDEX", "",
     "RoCE: GID table index whose IP address the connections use; "
     "default: the first IPv4 GID"},
    {"HOOP_IB_SLOTS", "16",
     "ibverbs receive slots per peer (2-1024): slots x slot bytes is "
     "what may be in flight on one queue pair"},
    {"HOOP_IB_SLOT_BYTES", "131072",
     "bytes per ibverbs slot (4096 to 64 MiB); larger messages "
     "are pipelined through several"},
    {"HOOP_IB_QP_TIMEOUT", "14",
     "ibverbs ACK timeout exponent: 4.096 us x 2^value, retried 7 "
     "times before the peer is lost"},
    {"HOOP_IB_ZCOPY_MIN", "262144",
     "messages of at least this many bytes between buffers "
     "registered with hoop_register go zero-copy over ibverbs "
     "(RDMA write from buffer to buffer); 0: never"},
    {"HOOP_IB_SPIN_US", "50",
     "microseconds a wait polls the completion queue before it sleeps "
     "on the completion channel; 0 always sleeps"},
    {"HOOP_IFNAME", "",
     "interfaces to use, NCCL_SOCKET_IFNAME syntax: prefixes separated by "
     "commas, ^ to exclude, = for exact names; default: the interface that "
     "routes to the rendezvous server"},
    {"HOOP_TCP_STREAMS", "2", "TCP connections per peer (1-8); large messages are striped"},
    {"HOOP_ENCRYPT", "0",
     "seal every byte of the TCP connections with an AEAD: 0 (no), 1 (AES-256-GCM where the CPU "
     "has AES instructions, else ChaCha20-Poly1305), aes256gcm or chacha20poly1305; every rank "
     "the same. Shared memory and CUDA IPC within a host stay in clear; ibverbs is not used"},
    {"HOOP_ALGO", "auto",
     "auto|ring|rd|hd, or per collective 'allreduce:hd,broadcast:chain': "
     "allreduce ring|rd|hd, broadcast chain|tree, allgather ring|rd|bruck, "
     "barrier dissemination; ring, rd and hd alone force the ring "
     "algorithms, the log2(n)-round ones or halving-doubling for every size"},
    {"HOOP_CHUNK_BYTES", "1048576",
     "bytes per pipelined chunk of the ring collectives "
     "(4096 to 2^30)"},
    {"HOOP_ASYNC_PROGRESS", "1",
     "1: non-blocking calls run on a progress thread while the program computes; 0: only "
     "inside hoop_test, hoop_wait and blocking calls"},
    {"HOOP_TRACE", "",
     "write this rank's timeline of every call to FILE.<rank> (Chrome trace JSON, for "
     "Perfetto); empty: none"},
    {"HOOP_CUDA_LIBRARY", "libcuda.so.1",
     "the CUDA driver library loaded (at the first collective) to tell device buffers from "
     "host ones; empty: none, every buffer is host memory"},
    {"HOOP_FUSION_BYTES", "8388608",
     "bytes hoop_allreduce_many packs into one allreduce (4096 to 2^30)"},
    {"HOOP_TCP_SPIN_US", "auto",
     "microseconds a wait polls sockets without sleeping before it "
     "blocks in poll(); 0 always sleeps; auto: 1000, or 50 when this "
     "host's ranks outnumber its CPUs"},
    {"HOOP_TCP_CONGESTION", "auto",
     "the TCP congestion control of hoop's connections: a name the kernel "
     "offers (reno, cubic, bbr), system for the system's, or auto: reno "
     "for connections within this host while it has a CPU per rank "
     "(pacing holds loopback messages back), the system's for the others"},
    {"HOOP_CHECK_CALLS", "1",
     "1: every message carries its call's fingerprint {seq, collective, "
     "count, dtype, op, root} and ranks that call different collectives "
     "get HOOP_ERR_MISMATCH; 0 turns the check off"},
    {"HOOP_REPRODUCIBLE", "0",
     "1: every reducing call's bits depend only on its inputs and the rank "
     "count (each element combined over one fixed tree of the ranks), whatever "
     "the algorithm, transport, hosts, chunks or buffer kind; 0: the fastest "
     "algorithm decides the order (hoop(3), Reproducible reductions)"},
    {"HOOP_COMPRESS", "none",
     "the wire format of float sums and averages between hosts: none, bf16, fp8 or int8, with "
     "+stochastic (stochastic rounding) and +feedback (error feedback on registered buffers); "
     "within a host nothing is compressed (hoop(3), Slow links)"},
    {"HOOP_STATS_PERIOD", "2",
     "seconds between the summaries each rank sends its rendezvous server (how long it waited "
     "in its last calls), from which the server names the late ranks to every rank "
     "(hoop_comm_stats) and to hoopd --status; 0: none are sent (0.1 to 3600)"},
    {"HOOP_STALL_WARN", "60",
     "seconds a collective may wait before it logs a warning naming "
     "the ranks it is still waiting for"},
    {"HOOP_TOKEN", "",
     "shared secret that ranks must prove to join (not sent on the wire); "
     "hooprun makes a fresh one per job"},
    {"HOOP_TOKEN_FILE", "", "file holding the token (mode 600), instead of HOOP_TOKEN"},
    {"HOOP_DEBUG", "warn", "log level on stderr: none|error|warn|info|trace"},
    {"HOOP_DEBUG_SUBSYS", "all", "subsystems to log: init,coll,net,rdzv,env or all; ^ excludes"},
    {NULL, NULL, NULL},
};

const hoop__env_var *hoop__env_table(void) {
  return env_table;
}

static const hoop__env_var *env_find(const char *name) {
  for (const hoop__env_var *var = env_table; var->name; var++)
    if (strcmp(var->name, name) == 0)
      return var;
  return NULL;
}

int hoop__env_is_set(const char *name) {
  const char *value = getenv(name);
  return value && value[0];
}

const char *hoop__env_get(const char *name) {
  const char *value = getenv(name);
  if (value && value[0])
    return value;
  const hoop__env_var *var = env_find(name);
  return var ? var->fallback : "";
}

size_t hoop__env_bytes(const char *name, long max) {
  const char *text = hoop__env_get(name);
  long bytes = 0;
  if (hoop__parse_int(text, 0, max, &bytes) == 0)
    return (size_t)bytes;
  const hoop__env_var *var = env_find(name);
  const char *fallback = var ? var->fallback : "0";
  HOOP__WARN(HOOP_SUBSYS_ENV, "%s '%s' is not a number of bytes; using %s", name, text, fallback);
  return hoop__parse_int(fallback, 0, max, &bytes) == 0 ? (size_t)bytes : 0;
}

int hoop__parse_int(const char *text, long min, long max, long *out) {
  char *end;
  errno = 0;
  long value = strtol(text, &end, 10);
  if (errno || end == text || *end || value < min || value > max)
    return -1;
  *out = value;
  return 0;
}

int hoop__parse_double(const char *text, double min, double max, double *out) {
  char *end;
  errno = 0;
  double value = strtod(text, &end);
  if (errno || end == text || *end || !(value >= min && value <= max))
    return -1;
  *out = value;
  return 0;
}
