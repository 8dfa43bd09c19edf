/* hoop.h - the public interface of libhoop, a collective-communication runtime.
 *
 * Ranks find each other through a rendezvous server, connect into a ring over a transport and run
 * allreduce, broadcast, allgather and barrier. Every call returns a hoop_result; on failure
 * hoop_last_error() tells which peer, which call and why.
 *
 * Thread safety: a communicator's calls may come from any thread, and the library serializes
 * them; but the order in which a rank posts its collectives (blocking or not) is the order they
 * are matched in across ranks, so a program that posts from several threads must order those
 * posts itself. Calls on different communicators (hoop_comm_split's) are independent: they may
 * run at the same time from different threads, in any order, and their messages never mix. A
 * request is tested or waited for by one thread at a time, and not after it completed (hoop_test
 * and hoop_wait free it). hoop_strerror() and hoop_abort() may be called from any thread,
 * hoop_abort() only while the communicator is alive: never concurrently with or after
 * hoop_finalize() on it. hoop_finalize() itself runs when no request is outstanding.
 */
#ifndef HOOP_H
#define HOOP_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* HOOP_VERSION_MAJOR, _MINOR, _PATCH, HOOP_VERSION_STRING and HOOP_VERSION_NUMBER
 * (major * 10000 + minor * 100 + patch), written by configure from its one version number. */
#include "hoop_version.h"

/* What libhoop exports: these declarations and nothing else. */
#if defined(__GNUC__) || defined(__clang__)
#define HOOP_API __attribute__((visibility("default")))
#else
#define HOOP_API
#endif

/* The version of the library this program runs with ("0.1.0"); HOOP_VERSION_STRING is the one it
 * was built against. */
HOOP_API const char *hoop_version(void);

/* ---- Results --------------------------------------------------------------------------------- */

typedef enum hoop_result {
  HOOP_OK = 0,
  HOOP_ERR_INVALID_ARG = 1, /* a bad argument: null pointer, unknown dtype or op, bad root... */
  HOOP_ERR_TIMEOUT = 2,     /* a wait passed HOOP_TIMEOUT (rendezvous, connect, collective) */
  HOOP_ERR_PEER_LOST = 3,   /* a peer closed, reset or failed its connection */
  HOOP_ERR_AUTH = 4,        /* the rendezvous server or a peer refused our credentials */
  HOOP_ERR_SYSTEM = 5,      /* a system call failed (out of memory, socket errors...) */
  HOOP_ERR_UNSUPPORTED = 6, /* valid, but not supported by this build or transport */
  HOOP_ERR_ABORTED = 7,     /* hoop_abort() was called here or on another rank */
  HOOP_ERR_MISMATCH = 8,    /* ranks called different collectives, counts, dtypes or roots */
  HOOP_ERR_PROTOCOL = 9,    /* a malformed or unexpected message from the server or a peer */
  HOOP_ERR_FAILED = 10      /* the communicator failed earlier and refuses further calls */
} hoop_result;

/* A short, static name for a result code ("invalid argument", "peer lost", ...). */
HOOP_API const char *hoop_strerror(hoop_result result);

/* ---- Data types and reduction operations ----------------------------------------------------- */

typedef enum hoop_dtype {
  HOOP_INT8 = 0,
  HOOP_UINT8,
  HOOP_INT32,
  HOOP_UINT32,
  HOOP_INT64,
  HOOP_UINT64,
  HOOP_FLOAT16,  /* IEEE 754 binary16, stored as uint16_t; reduced in float */
  HOOP_BFLOAT16, /* bfloat16, stored as uint16_t; reduced in float */
  HOOP_FLOAT32,
  HOOP_FLOAT64,
  HOOP_INT16,
  HOOP_UINT16,
  HOOP_BOOL, /* one byte, 0 false, any other value true; combined values are 0 or 1 */
  HOOP_DTYPE_COUNT
} hoop_dtype;

/* Integers wrap in their own type. On HOOP_BOOL, SUM and MAX are logical or, PROD and MIN logical
 * and, and AVG is refused. The bitwise ops take the integer types and bool only (HOOP_BAND,
 * HOOP_BOR and HOOP_BXOR on a float type: HOOP_ERR_INVALID_ARG). */
typedef enum hoop_op {
  HOOP_SUM = 0,
  HOOP_PROD,
  HOOP_MIN,
  HOOP_MAX,
  HOOP_AVG, /* sum divided by the rank count; integer types round toward zero */
  HOOP_BAND,
  HOOP_BOR,
  HOOP_BXOR,
  HOOP_OP_COUNT
} hoop_op;

/* Size in bytes of one element of dtype, or 0 for an unknown dtype. */
HOOP_API size_t hoop_dtype_size(hoop_dtype dtype);
/* "float32", "sum", ...; NULL for unknown values. */
HOOP_API const char *hoop_dtype_name(hoop_dtype dtype);
HOOP_API const char *hoop_op_name(hoop_op op);
/* Parse a name as printed by the functions above; return 0 on success, -1 if unknown. */
HOOP_API int hoop_dtype_from_name(const char *name, hoop_dtype *dtype);
HOOP_API int hoop_op_from_name(const char *name, hoop_op *op);

/* ---- Communicator ---------------------------------------------------------------------------- */

typedef struct hoop_comm hoop_comm;

/* Everything hoop_init needs. Start from hoop_config_init(), which fills the defaults, then set
 * what you need. String fields are copied by hoop_init.
 *
 * The struct grows at its end from one release to the next. hoop_config_init records in
 * struct_size the size this program was built with, so that a newer library reads only the fields
 * the program knows (the rest keep their defaults) and an older library refuses fields it does not
 * know rather than ignore them. A config that hoop_config_init did not set up is refused. */
typedef struct hoop_config {
  size_t struct_size;     /* sizeof(hoop_config) in the program: set by hoop_config_init */
  unsigned int version;   /* HOOP_VERSION_NUMBER the program was built against: the same */
  const char *rendezvous; /* "host:port" of the rendezvous server (required) */
  const char *job;        /* job id shared by all ranks of one job (default "default") */
  int size;               /* number of ranks in the job (required, >= 1) */
  int rank;               /* requested rank, or -1 to let the server assign one */
  int serve_rendezvous;   /* 1: this process hosts an embedded rendezvous server on the
                             rendezvous address for this job (usually rank 0) */
  double timeout_s;       /* deadline for every blocking wait (default 300 s) */
  const char *ifname;     /* interface selection, NCCL_SOCKET_IFNAME syntax (NULL: automatic) */
  const char *transport;  /* "auto", "shm", "tcp" or "ibverbs" (default "auto") */
  int tcp_streams;        /* TCP connections per peer (default 2) */
  const char *token;      /* shared secret: the rendezvous server admits only ranks that prove
                             they know it, and data connections carry a proof derived from it;
                             NULL or "": none (see hoopd(8) for what it protects) */
  const char *token_file; /* read the token from this file (mode 600) instead; NULL: none */
  const char *hostname;   /* the host name this rank reports to the rendezvous, which groups
                             ranks by it (local ranks); NULL: gethostname() */
  int join_running;       /* 1: a newcomer: join the job that runs under this id at its next
                             generation (hoop_comm_grow); size is then only a bound and rank
                             is ignored */
  int reproducible;       /* 1: reproducible mode (hoop_comm_set_reproducible); 0: as
                             HOOP_REPRODUCIBLE says (default off) */
  int compress;           /* the wire format across hosts (hoop_comm_set_compress): a
                             HOOP_COMPRESS_* format with its flags; 0: as HOOP_COMPRESS says
                             (default none) */
  const char *encrypt;    /* seal every byte of the TCP connections: "0", "1" (AES-256-GCM where
                             the CPU has AES instructions, else ChaCha20-Poly1305), "aes256gcm"
                             or "chacha20poly1305", alike on every rank; NULL: as HOOP_ENCRYPT
                             says (default "0"). See hoop-env(7) */
} hoop_config;

/* Fill config (struct_size bytes of it) with the defaults. Call it through hoop_config_init. */
HOOP_API void hoop_config_init_sized(hoop_config *config, size_t struct_size, unsigned int version);

static inline void hoop_config_init(hoop_config *config) {
  hoop_config_init_sized(config, sizeof *config, HOOP_VERSION_NUMBER);
}

/* Join a job. On success *comm is a ready communicator. On failure *comm is still set when memory
 * allowed, so that hoop_last_error(*comm) can explain the failure; release it with
 * hoop_finalize. */
HOOP_API hoop_result hoop_init(hoop_comm **comm, const hoop_config *config);

/* Like hoop_init, with the configuration read from HOOP_* environment variables (see
 * hoop-env(7)). */
HOOP_API hoop_result hoop_init_from_env(hoop_comm **comm);

/* Close connections and free the communicator. Safe on NULL and on a failed communicator. */
HOOP_API hoop_result hoop_finalize(hoop_comm *comm);

/* Mark the communicator as aborted with reason, tell every connected peer (which fails with
 * HOOP_ERR_ABORTED and "aborted by rank R: reason") and close the connections. Callable from any
 * thread: a collective blocked on comm in another thread wakes and returns HOOP_ERR_ABORTED.
 * Every later call on it returns HOOP_ERR_ABORTED. */
HOOP_API hoop_result hoop_abort(hoop_comm *comm, const char *reason);

/* Go on without the ranks that failed. After a call on comm failed because a peer was lost, hung
 * or aborted, every surviving rank calls this; they agree through the rendezvous server on who
 * survived and *newcomm becomes a communicator of the survivors alone, ranked 0..n-1 in their old
 * order, ready for collectives at once (its connections made and checked with a barrier). The
 * server waits for every rank still connected to it, up to comm's timeout, so that a rank slow to
 * notice the failure is not cut off by a race; a rank that some survivor names as failed (the one
 * it lost or timed out on) is waited for only a short grace (2 s). Ranks that did not ask in time
 * are left out: their communicator fails ("left out of generation G"), and a shrink they call
 * afterwards returns the server's code (HOOP_ERR_PEER_LOST) with those words. A failure while the
 * new communicator connects is handled the same way inside this call, which then tries again.
 *
 * comm itself stays failed (calls on it keep returning its error); finalize it as usual. It may
 * be called on a communicator that has not failed: comm then fails first, which its peers notice.
 * The rendezvous server must survive: a job whose server was hosted by a lost rank
 * (HOOP_RDZV_SERVE) cannot shrink (HOOP_ERR_UNSUPPORTED). A program that shrinks must also reset
 * what its ranks hold: re-broadcast its state from a survivor, re-divide its data by the new size
 * (see hooprun(1), --min-np). Not callable concurrently with another call on comm. */
HOOP_API hoop_result hoop_comm_shrink(hoop_comm *comm, hoop_comm **newcomm);

/* Take in newcomers: processes that joined the running job with join_running (HOOP_JOIN=1, as
 * hooprun --max-np starts replacements) wait at the rendezvous server until the members make a
 * new generation. Every member of comm calls this at a point they agreed on (a newcomer is seen
 * by each rank at its own moment: agree first, e.g. allreduce hoop_comm_newcomers with HOOP_MAX);
 * *newcomm holds the members, in their order, then the newcomers that were waiting, whose
 * hoop_init returns it at the same time. Calls on comm fail afterwards; finalize it. A member
 * lost meanwhile is handled as hoop_comm_shrink does (they are the same exchange). */
HOOP_API hoop_result hoop_comm_grow(hoop_comm *comm, hoop_comm **newcomm);

/* Split comm into sub-communicators, as MPI_Comm_split: the ranks that pass the same color (>= 0)
 * form one, ordered by key, ties by their rank in comm; *newcomm is this rank's, or NULL for
 * color HOOP_SPLIT_NONE. Every rank of comm calls it (a collective call on comm). The new
 * communicator reuses comm's connections: one allgather on comm is all it costs, no new
 * connection or rendezvous. It runs every call a communicator does, at the same time as calls on
 * comm and on other sub-communicators from other threads. Ranks in failure messages from the
 * transports are the job's (those of the communicator hoop_init made). A failure of any of them
 * fails all that share the connections: comm, its sub-communicators and theirs. Finalize a
 * sub-communicator before the communicator hoop_init made (hoop_finalize refuses the latter while
 * sub-communicators are alive). After a failure, every survivor shrinks the communicator
 * hoop_init made first (hoop_comm_shrink), then each sub-communicator it keeps: hoop_comm_shrink on
 * a sub-communicator gives its surviving members, in its order, as a sub-communicator of the new
 * generation, asking nobody. A sub-communicator cannot grow (HOOP_ERR_UNSUPPORTED). Splits of one
 * job's communicators are made one at a time, in the same order on every rank (a split while
 * another runs in another thread is refused), at most 65535 in a job. */
#define HOOP_SPLIT_NONE (-1)
HOOP_API hoop_result hoop_comm_split(hoop_comm *comm, int color, int key, hoop_comm **newcomm);

/* A sub-communicator of the n ranks of comm listed in ranks (no repeats; this rank among them), in
 * that order, as MPI_Comm_create_group: only they call it, at the same point of their calls on
 * comm, and the other ranks are not involved (torch.distributed's new_group). A few point-to-point
 * messages on comm among them are its cost. Everything said of hoop_comm_split's communicators
 * holds for it, and it counts as a split. */
HOOP_API hoop_result hoop_comm_create_group(hoop_comm *comm, const int *ranks, int n,
                                            hoop_comm **newcomm);

/* How many newcomers wait to join comm's job, as the rendezvous server last told this rank
 * (taken when a call on comm runs, or by this call itself). */
HOOP_API int hoop_comm_newcomers(hoop_comm *comm);

/* The generation of comm's job: 0 for the job as it started, one more for each shrink or growth.
 * A newcomer's communicator starts at the generation it joined. */
HOOP_API unsigned int hoop_comm_generation(const hoop_comm *comm);

/* How long a call on comm waits with nothing moving before it fails with HOOP_ERR_TIMEOUT naming
 * the rank it waits for: seconds > 0, from the next call on (HOOP_TIMEOUT, or hoop_config's
 * timeout_s, until set). A peer that is alive but late (a rank writing a checkpoint) is waited
 * for that long, with stall warnings (HOOP_STALL_WARN) saying whom it waits for; a peer that dies
 * still fails the call at once. Sub-communicators made from comm afterwards start with its
 * timeout and may set their own. Not while a call runs on comm in another thread.
 * HOOP_ERR_INVALID_ARG for a NULL comm or seconds not > 0 (comm unchanged). */
HOOP_API hoop_result hoop_comm_set_timeout(hoop_comm *comm, double seconds);
/* comm's timeout in seconds (0 for a NULL comm). */
HOOP_API double hoop_comm_timeout(const hoop_comm *comm);

/* Reproducible mode (hoop(3), "Reproducible reductions"): on (1), every reducing call on comm
 * (allreduce, reduce-scatter, reduce, allreduce_many, in every form) returns bits that depend only
 * on the inputs and the rank count: each element is combined over one fixed binary tree of the
 * ranks in rank order, whatever algorithm, transport, host layout, chunk size, fusion or buffer
 * kind the call goes by. Off (0), the fastest algorithm decides the order, and the bits may change
 * with those. From the next call on; every rank of comm must set it alike (with HOOP_CHECK_CALLS,
 * ranks that differ fail with HOOP_ERR_MISMATCH where messages carry the difference).
 * Sub-communicators made afterwards start with comm's setting. HOOP_REPRODUCIBLE=1, or
 * hoop_config's reproducible, turns it on at init. HOOP_ERR_INVALID_ARG for a NULL comm or another
 * value. */
HOOP_API hoop_result hoop_comm_set_reproducible(hoop_comm *comm, int on);
/* 1 when comm is in reproducible mode (0 for a NULL comm). */
HOOP_API int hoop_comm_reproducible(const hoop_comm *comm);

/* Compressed reductions (hoop(3), "Slow links"): float32, float16 and bfloat16 sum and average
 * in allreduce, reduce-scatter and allreduce_many may cross hosts in a smaller wire format. Within
 * a host nothing is compressed: each host's ranks reduce exactly, the ranks at the same place on
 * every host exchange their host's partial sums compressed, once each, adding them in float32,
 * and each block's result is compressed once more by the rank that summed it, which keeps the
 * values it sent, as every other rank does: every rank ends with the same bits. Jobs on one host,
 * or whose hosts run different numbers of ranks, are not compressed. The formats, and what each
 * costs in accuracy (per conversion; a result has been through at most two):
 *   HOOP_COMPRESS_BF16: bfloat16, 2 bytes an element; relative error at most 2^-8.
 *   HOOP_COMPRESS_FP8:  float8 e4m3 scaled per block of HOOP_COMPRESS_BLOCK elements (448 is the
 *                       block's largest magnitude), 1 byte an element and 4 a block; relative
 *                       error at most 2^-4, absolute at most 2^-10 of the scale below 2^-6 of it.
 *   HOOP_COMPRESS_INT8: integers -127..127 scaled per block by its largest magnitude; error at
 *                       most 1/254 of that magnitude, about 3.9x fewer bytes than float32.
 * Flags, or'ed into the format: HOOP_COMPRESS_STOCHASTIC rounds stochastically instead of to
 * nearest (unbiased; error below one step; the random bits come from the call's number, so every
 * run of a job draws the same); HOOP_COMPRESS_FEEDBACK keeps what compression dropped and adds it
 * to the next call of the same shape on the same input (error feedback, for training), with the
 * registration (hoop_register) that holds the call's sendbuf: 4 bytes for each element this rank
 * sends between hosts (the call's count over the ranks per host; a reduce-scatter's whole input
 * over them) and for each element of the block it sums (that over the hosts), per registered
 * buffer and call shape, freed by hoop_deregister. Asked for one call (hoop_compress_next) on an
 * unregistered input, or for allreduce_many, it is refused; set on the communicator it applies
 * to registered inputs. A block holding a NaN or infinity arrives as NaN (and leaves no residual);
 * a block whose largest magnitude is below 2^-100 arrives as zeros. */
typedef enum hoop_compress {
  HOOP_COMPRESS_NONE = 0,
  HOOP_COMPRESS_BF16 = 1,
  HOOP_COMPRESS_FP8 = 2,
  HOOP_COMPRESS_INT8 = 3,
} hoop_compress;
#define HOOP_COMPRESS_STOCHASTIC 0x100
#define HOOP_COMPRESS_FEEDBACK 0x200
#define HOOP_COMPRESS_BLOCK 128

/* comm's format from the next call on: it applies to every call it can (the dtypes and ops
 * above), and the others stay exact. Every rank sets it alike (with HOOP_CHECK_CALLS, ranks that
 * differ fail with HOOP_ERR_MISMATCH). Reproducible mode overrides it: its calls are never
 * compressed. Sub-communicators start with comm's format. HOOP_COMPRESS (none, bf16, fp8, int8,
 * with +stochastic and +feedback) or hoop_config's compress sets it at init.
 * HOOP_ERR_INVALID_ARG for a NULL comm or an unknown format or flag. */
HOOP_API hoop_result hoop_comm_set_compress(hoop_comm *comm, int format);
/* comm's format and flags (0 for a NULL comm). */
HOOP_API int hoop_comm_compress(const hoop_comm *comm);
/* The format of the next collective this thread posts on comm (as hoop_name_next: that one call,
 * blocking or not; HOOP_COMPRESS_NONE makes it exact). Unlike the communicator's format, a call
 * given one that it cannot take (another dtype or op, a collective other than allreduce,
 * reduce-scatter and allreduce_many) is refused with HOOP_ERR_INVALID_ARG naming both.
 * HOOP_ERR_INVALID_ARG for a NULL comm or an unknown format. */
HOOP_API hoop_result hoop_compress_next(hoop_comm *comm, int format);
/* "int8+stochastic" for a format and its flags, NULL for an unknown one; and back (0, or -1). */
HOOP_API const char *hoop_compress_name(int format, char *buf, size_t len);
HOOP_API int hoop_compress_from_name(const char *name, int *format);

HOOP_API int hoop_rank(const hoop_comm *comm);
HOOP_API int hoop_size(const hoop_comm *comm);
HOOP_API int hoop_local_rank(const hoop_comm *comm); /* index among the ranks on this host */
HOOP_API int hoop_local_size(const hoop_comm *comm); /* number of ranks on this host */
/* Horovod's cross rank and size: among the ranks whose local rank is this rank's, this rank's
 * index (in rank order) and their number; on hosts that each run the same number of ranks, this
 * host's index and the number of hosts. -1 for a NULL comm. */
HOOP_API int hoop_cross_rank(const hoop_comm *comm);
HOOP_API int hoop_cross_size(const hoop_comm *comm);

/* 1 when collectives accept CUDA device buffers: this libhoop was built with CUDA and the driver
 * (HOOP_CUDA_LIBRARY) loads, which this call does if no collective has yet; it never initialises
 * CUDA. 0 otherwise: every buffer is taken for host memory. */
HOOP_API int hoop_cuda_supported(void);

/* The detailed message of the last failure on comm ("" if none). Valid until the next call. */
HOOP_API const char *hoop_last_error(const hoop_comm *comm);

/* ---- Statistics: who is slow ----------------------------------------------------------------- */
/* Every collective measures how long this rank waited in it and for which peer; on the job's
 * communicator each rank also describes its waits in its last calls to the rendezvous server
 * every HOOP_STATS_PERIOD seconds, and the server, comparing the ranks call by call, answers with
 * how late each rank comes to the calls that need every rank (allreduce, allgather, barrier,
 * reduce-scatter, all-to-all): the others' extra wait. hoop(3), "Finding the slow rank". */

/* One collective's figures. */
typedef struct hoop_coll_stats {
  uint64_t calls;  /* calls made (refused ones too) */
  uint64_t bytes;  /* their payload on this rank (allgather: its own block) */
  double time_s;   /* time inside them: of the calls that waited or moved 64 KiB or more (a
                      small call that found its peers' data there is not timed) */
  double waited_s; /* of which waiting for peers */
} hoop_coll_stats;

/* The collectives in hoop_stats.colls, in this order (hoop_stats_coll_name names each). */
#define HOOP_STATS_COLLS 10
HOOP_API const char *hoop_stats_coll_name(int index); /* "allreduce"...; NULL out of range */

typedef struct hoop_stats {
  double since_s;    /* since the communicator began */
  uint64_t calls;    /* every collective's calls */
  uint64_t bytes;    /* and their payload */
  double in_calls_s; /* time inside collectives */
  double waited_s;   /* of which waiting for peers */
  double wait_share; /* waited_s / since_s: the share of this rank's time spent waiting */
  hoop_coll_stats colls[HOOP_STATS_COLLS];
  /* From the rendezvous server's last answer (the job's communicator, and the communicators
   * split from it, whose ranks it maps): the rank that came latest (by its median lateness) and
   * how late; -1 and 0 while none is known. */
  int slowest_rank;
  double slowest_late_s;
  unsigned int late_calls; /* the calls the lateness figures cover (every rank described them) */
  int reporting;           /* ranks whose account the server holds */
  double view_age_s;       /* since the server's answer came; -1: none came */
  /* The job's slowest link in the ranks' last periods, from the same answer: messages of 64 KiB
   * or more from rank slowest_link_from to rank slowest_link_to (of comm; -1 when either is not
   * one of comm's, or none is known) came at slowest_link_goodput bytes per second, first byte to
   * last. TCP links only; 0 while none is known. */
  int slowest_link_from, slowest_link_to;
  double slowest_link_goodput;
} hoop_stats;

/* One peer's figures; the lateness is from the server's answer (-1 when the answer names no such
 * figure: none came, or the job has more ranks than an answer names, the latest 32). */
typedef struct hoop_peer_stats {
  int rank;                /* the peer's rank in the communicator */
  double late_median_s;    /* how much later than the earliest rank it came: median */
  double late_p99_s;       /* 99th percentile */
  double late_max_s;       /* and most, over the calls of late_calls */
  double waited_s;         /* time this rank waited for it (any communicator sharing the link) */
  uint64_t bytes_sent;     /* bytes this rank posted to it */
  uint64_t bytes_received; /* and from it */
  double goodput;          /* bytes per second of its messages of 64 KiB or more to this rank,
                              from first byte to last, over the communicator's life (TCP); -1:
                              none measured */
} hoop_peer_stats;

/* Fill *stats, and peers[0..npeers) for the communicator's ranks 0..npeers-1 (this rank's own
 * entry: no waits or bytes, its lateness as for any rank); peers may be NULL when npeers is 0.
 * Any thread, any time (a call's figures count once it ends). HOOP_ERR_INVALID_ARG for a NULL
 * comm or stats, a negative npeers or one above the size. Call it through hoop_comm_stats: the
 * sizes let a newer library fill only the fields this program knows. */
HOOP_API hoop_result hoop_comm_stats_sized(hoop_comm *comm, hoop_stats *stats, size_t stats_size,
                                           hoop_peer_stats *peers, size_t peer_size, int npeers);

static inline hoop_result hoop_comm_stats(hoop_comm *comm, hoop_stats *stats,
                                          hoop_peer_stats *peers, int npeers) {
  return hoop_comm_stats_sized(comm, stats, sizeof *stats, peers, sizeof *peers, npeers);
}

/* ---- Collectives ----------------------------------------------------------------------------- */
/* All ranks call the same collectives in the same order with matching arguments. count is in
 * elements and may be 0. Buffers must not overlap except as stated. In a build with CUDA, any
 * buffer may be CUDA device memory (detected per call, staged through host memory; see hoop(3)):
 * its inputs must be ready when the call is made, and its results are there when it returns. */

/* Name the next collective this thread posts on comm (blocking, non-blocking, stream or
 * allreduce_many), as Horovod programs name their tensors: the name's hash becomes part of the
 * call's fingerprint, so ranks whose calls at one position carry different names (or a name and
 * none) fail with HOOP_ERR_MISMATCH naming both calls and their names, instead of mixing the two
 * calls' data. The name applies to that one call; the thread's next collective on another
 * communicator drops it. NULL or "" clears it. Names are compared in full; messages show their
 * first HOOP_NAME_MAX - 1 bytes. HOOP_ERR_INVALID_ARG for a NULL comm. */
#define HOOP_NAME_MAX 64
HOOP_API hoop_result hoop_name_next(hoop_comm *comm, const char *name);

/* recvbuf[i] = op over ranks of sendbuf[i]. In place when sendbuf == recvbuf. */
HOOP_API hoop_result hoop_allreduce(hoop_comm *comm, const void *sendbuf, void *recvbuf,
                                    size_t count, hoop_dtype dtype, hoop_op op);

/* Copy root's buf to every rank's buf. */
HOOP_API hoop_result hoop_broadcast(hoop_comm *comm, void *buf, size_t count, hoop_dtype dtype,
                                    int root);

/* recvbuf holds size * count elements: rank r's sendbuf lands at recvbuf + r * count elements.
 * In place when sendbuf == recvbuf + rank * count elements. */
HOOP_API hoop_result hoop_allgather(hoop_comm *comm, const void *sendbuf, void *recvbuf,
                                    size_t count, hoop_dtype dtype);

/* Reduce size * recvcount elements over the ranks and leave block r of the result with rank r:
 * recvbuf[i] = op over ranks of sendbuf[rank * recvcount + i] for i < recvcount (NCCL's
 * convention; sendbuf holds size * recvcount elements). In place when recvbuf == sendbuf + rank *
 * recvcount elements. */
HOOP_API hoop_result hoop_reduce_scatter(hoop_comm *comm, const void *sendbuf, void *recvbuf,
                                         size_t recvcount, hoop_dtype dtype, hoop_op op);

/* Every rank sends count elements to every rank: block j of sendbuf (count elements at j * count)
 * goes to rank j, and block i of recvbuf receives rank i's block for this rank. sendbuf and
 * recvbuf hold size * count elements each. In place when sendbuf == recvbuf. */
HOOP_API hoop_result hoop_alltoall(hoop_comm *comm, const void *sendbuf, void *recvbuf,
                                   size_t count, hoop_dtype dtype);

/* The same with a count per pair: sendcounts[j] elements at sendbuf + sdispls[j] elements go to
 * rank j, and recvcounts[i] elements from rank i land at recvbuf + rdispls[i] elements. Counts may
 * be 0; what rank i sends to j must be what j expects from i (else both fail with
 * HOOP_ERR_MISMATCH, naming each other). Not in place: the buffers must not overlap where blocks
 * lie. recvbuf outside the blocks is left as it was. */
HOOP_API hoop_result hoop_alltoallv(hoop_comm *comm, const void *sendbuf, const size_t *sendcounts,
                                    const size_t *sdispls, void *recvbuf, const size_t *recvcounts,
                                    const size_t *rdispls, hoop_dtype dtype);

/* The collectives with a root (all ranks pass the same root, count, dtype and op). Reduce:
 * root's recvbuf[i] = op over ranks of sendbuf[i] (in place at the root when sendbuf == recvbuf;
 * recvbuf is not used on other ranks and may be NULL). Gather: root's recvbuf holds size * count
 * elements, rank r's sendbuf landing at recvbuf + r * count (in place at the root when sendbuf ==
 * recvbuf + root * count; recvbuf unused elsewhere). Scatter: root's sendbuf holds size * count
 * elements, block r going to rank r's recvbuf (in place at the root when recvbuf == sendbuf + root
 * * count; sendbuf unused elsewhere). */
HOOP_API hoop_result hoop_reduce(hoop_comm *comm, const void *sendbuf, void *recvbuf, size_t count,
                                 hoop_dtype dtype, hoop_op op, int root);
HOOP_API hoop_result hoop_gather(hoop_comm *comm, const void *sendbuf, void *recvbuf, size_t count,
                                 hoop_dtype dtype, int root);
HOOP_API hoop_result hoop_scatter(hoop_comm *comm, const void *sendbuf, void *recvbuf, size_t count,
                                  hoop_dtype dtype, int root);

/* Return once every rank has entered the barrier. */
HOOP_API hoop_result hoop_barrier(hoop_comm *comm);

/* Allreduce n buffers of one dtype as one transfer: recvbufs[i][j] = op over ranks of
 * sendbufs[i][j] for j < counts[i] (in place when sendbufs[i] == recvbufs[i]). The buffers are
 * packed into the library's own buffer piece by piece (HOOP_FUSION_BYTES, default 8 MiB, each
 * piece one allreduce), so a large set needs no allocation of its total size; a buffer of 512 KiB
 * or more (or half a piece, if less) is allreduced where it lies, not copied. All ranks pass the
 * same n and counts. Horovod's tensor fusion, below the framework. */
HOOP_API hoop_result hoop_allreduce_many(hoop_comm *comm, size_t n, const void *const *sendbufs,
                                         void *const *recvbufs, const size_t *counts,
                                         hoop_dtype dtype, hoop_op op);

/* ---- Non-blocking collectives ---------------------------------------------------------------- */
/* Each call posts the collective and returns at once with *request set; the collective then runs
 * on the communicator's progress thread (started by the first non-blocking post, asleep while
 * there is nothing to do), in the order the rank posted it, while the program computes. Until it
 * completes, the buffers belong to the library: inputs must not change, outputs must not be read.
 * Many requests of any collectives may be outstanding at once and completed in any order; a
 * blocking call is a post and a wait, queued behind the outstanding ones. A failure or an abort
 * completes every outstanding request with the error (within HOOP_TIMEOUT for a peer that died or
 * hangs). A post whose arguments are bad returns the error and sets no request. */
typedef struct hoop_request hoop_request;
HOOP_API hoop_result hoop_iallreduce(hoop_comm *comm, const void *sendbuf, void *recvbuf,
                                     size_t count, hoop_dtype dtype, hoop_op op,
                                     hoop_request **request);
HOOP_API hoop_result hoop_ibroadcast(hoop_comm *comm, void *buf, size_t count, hoop_dtype dtype,
                                     int root, hoop_request **request);
HOOP_API hoop_result hoop_iallgather(hoop_comm *comm, const void *sendbuf, void *recvbuf,
                                     size_t count, hoop_dtype dtype, hoop_request **request);
HOOP_API hoop_result hoop_ireduce_scatter(hoop_comm *comm, const void *sendbuf, void *recvbuf,
                                          size_t recvcount, hoop_dtype dtype, hoop_op op,
                                          hoop_request **request);
HOOP_API hoop_result hoop_ialltoall(hoop_comm *comm, const void *sendbuf, void *recvbuf,
                                    size_t count, hoop_dtype dtype, hoop_request **request);
/* The four arrays are copied; the buffers they describe are not. */
HOOP_API hoop_result hoop_ialltoallv(hoop_comm *comm, const void *sendbuf, const size_t *sendcounts,
                                     const size_t *sdispls, void *recvbuf, const size_t *recvcounts,
                                     const size_t *rdispls, hoop_dtype dtype,
                                     hoop_request **request);
HOOP_API hoop_result hoop_ibarrier(hoop_comm *comm, hoop_request **request);
HOOP_API hoop_result hoop_ireduce(hoop_comm *comm, const void *sendbuf, void *recvbuf, size_t count,
                                  hoop_dtype dtype, hoop_op op, int root, hoop_request **request);
HOOP_API hoop_result hoop_igather(hoop_comm *comm, const void *sendbuf, void *recvbuf, size_t count,
                                  hoop_dtype dtype, int root, hoop_request **request);
HOOP_API hoop_result hoop_iscatter(hoop_comm *comm, const void *sendbuf, void *recvbuf,
                                   size_t count, hoop_dtype dtype, int root,
                                   hoop_request **request);
/* hoop_allreduce_many, posted. The arrays are copied; the buffers they point to are not. */
HOOP_API hoop_result hoop_iallreduce_many(hoop_comm *comm, size_t n, const void *const *sendbufs,
                                          void *const *recvbufs, const size_t *counts,
                                          hoop_dtype dtype, hoop_op op, hoop_request **request);
/* *done = 0 while the request runs (HOOP_OK). Once it has completed, *done = 1 and the request's
 * result is returned and the request freed, as MPI_Test does; hoop_last_error then tells why it
 * failed, if it did. */
HOOP_API hoop_result hoop_test(hoop_request *request, int *done);
/* Block until the request completes; return its result and free it. */
HOOP_API hoop_result hoop_wait(hoop_request *request);

/* ---- Point-to-point ------------------------------------------------------------------------- */
/* Messages between two ranks of a communicator, for pipelines' activations and gradients. A send
 * of count elements to peer matches a receive of count elements of the same dtype and tag from
 * this rank, in the order each posted them, as NCCL's: between two ranks, the k-th message one
 * sends is the k-th the other receives, and sends, receives and collectives on a communicator are
 * posted in the same order on both ranks of a pair. The tag does not choose among messages; it is
 * checked with the count and dtype, and any difference is HOOP_ERR_MISMATCH on the receiver naming
 * both calls (the sender learns it at its next call or wait, as the communicator fails). count may
 * be 0; peer must be another rank; tag is 0 or more. Buffers may be CUDA device memory (staged
 * through host memory). The non-blocking forms return at once with *request set, complete in any
 * order through hoop_test and hoop_wait, and move while the progress thread runs (or while any
 * call of this communicator waits): sends and receives posted together in a cycle (a ring shift,
 * a pipeline's exchange) complete whatever their sizes. Until then the buffer belongs to the
 * library. The blocking forms are a post and a wait. */
HOOP_API hoop_result hoop_send(hoop_comm *comm, const void *buf, size_t count, hoop_dtype dtype,
                               int peer, int tag);
HOOP_API hoop_result hoop_recv(hoop_comm *comm, void *buf, size_t count, hoop_dtype dtype, int peer,
                               int tag);
HOOP_API hoop_result hoop_isend(hoop_comm *comm, const void *buf, size_t count, hoop_dtype dtype,
                                int peer, int tag, hoop_request **request);
HOOP_API hoop_result hoop_irecv(hoop_comm *comm, void *buf, size_t count, hoop_dtype dtype,
                                int peer, int tag, hoop_request **request);

/* ---- Stream-ordered collectives (CUDA) ---------------------------------------------------------
 */
/* hoop_allreduce, hoop_broadcast and hoop_allgather ordered on a CUDA stream (a CUstream or
 * cudaStream_t, passed as void * so that this header needs no CUDA header; NULL: the legacy default
 * stream of the buffers' context): the collective reads its inputs after the work queued on stream
 * before the call, and work queued on stream after the call sees its results. Today the call waits
 * for the stream, runs the collective and returns with the results in place (the calling thread
 * blocks meanwhile); these rules also allow a later release to enqueue it instead. A stream given
 * to a libhoop that takes no CUDA buffers (hoop_cuda_supported() == 0) is HOOP_ERR_UNSUPPORTED. */
HOOP_API hoop_result hoop_allreduce_stream(hoop_comm *comm, const void *sendbuf, void *recvbuf,
                                           size_t count, hoop_dtype dtype, hoop_op op,
                                           void *stream);
HOOP_API hoop_result hoop_broadcast_stream(hoop_comm *comm, void *buf, size_t count,
                                           hoop_dtype dtype, int root, void *stream);
HOOP_API hoop_result hoop_allgather_stream(hoop_comm *comm, const void *sendbuf, void *recvbuf,
                                           size_t count, hoop_dtype dtype, void *stream);
HOOP_API hoop_result hoop_reduce_scatter_stream(hoop_comm *comm, const void *sendbuf, void *recvbuf,
                                                size_t recvcount, hoop_dtype dtype, hoop_op op,
                                                void *stream);
HOOP_API hoop_result hoop_alltoall_stream(hoop_comm *comm, const void *sendbuf, void *recvbuf,
                                          size_t count, hoop_dtype dtype, void *stream);
HOOP_API hoop_result hoop_alltoallv_stream(hoop_comm *comm, const void *sendbuf,
                                           const size_t *sendcounts, const size_t *sdispls,
                                           void *recvbuf, const size_t *recvcounts,
                                           const size_t *rdispls, hoop_dtype dtype, void *stream);
HOOP_API hoop_result hoop_reduce_stream(hoop_comm *comm, const void *sendbuf, void *recvbuf,
                                        size_t count, hoop_dtype dtype, hoop_op op, int root,
                                        void *stream);
HOOP_API hoop_result hoop_gather_stream(hoop_comm *comm, const void *sendbuf, void *recvbuf,
                                        size_t count, hoop_dtype dtype, int root, void *stream);
HOOP_API hoop_result hoop_scatter_stream(hoop_comm *comm, const void *sendbuf, void *recvbuf,
                                         size_t count, hoop_dtype dtype, int root, void *stream);

/* ---- Registered buffers ---------------------------------------------------------------------- */
/* A buffer used in many collectives can be registered once, as with NCCL's ncclCommRegister. Over
 * ibverbs, collectives whose buffers (every rank's) lie inside registered ranges move large
 * messages zero-copy, RDMA-written straight between the users' buffers; other buffers keep
 * working, copied through the transport's own. Over TCP registration is bookkeeping only, so the
 * same code runs on both. The memory must stay allocated until hoop_deregister (or
 * hoop_finalize, which deregisters whatever is left): freeing it first is undefined behaviour. */

typedef uint64_t hoop_mem_handle; /* 0 is never a valid handle */

/* Register bytes at ptr; *handle names the registration. HOOP_ERR_INVALID_ARG for a NULL ptr or
 * handle or zero bytes; HOOP_ERR_SYSTEM if the device refuses (see hoop_last_error). */
HOOP_API hoop_result hoop_register(hoop_comm *comm, void *ptr, size_t bytes,
                                   hoop_mem_handle *handle);

/* Release a registration. HOOP_ERR_INVALID_ARG for a handle this communicator did not return or
 * has already released. Never call it while a collective on that buffer runs in another thread. */
HOOP_API hoop_result hoop_deregister(hoop_comm *comm, hoop_mem_handle handle);

#ifdef __cplusplus
}
#endif

#endif /* HOOP_H */
