/* internal.h - the communicator's private state and the helpers every part of libhoop shares:
 * error recording, deadlines and argument checks. Nothing here is installed. */
#ifndef HOOP__INTERNAL_H
#define HOOP__INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/socket.h>

#include "core/log.h"
#include "hoop.h"
#include "proto/auth.h"
#include "proto/wire.h"
#include "util/clock.h"
#include "util/lock.h"

/* A call's fingerprint {seq, collective, count, dtype, op, root}, encoded in network order. The
 * transport carries it as opaque bytes with each message and compares it on arrival. */
#define HOOP__FINGERPRINT_BYTES 24

/* The names this rank gave its calls on a communicator (hoop_name_next), kept by the tag their
 * fingerprints carry, so that a mismatch names both ranks' calls: the last HOOP__NAMES of them
 * (core/fingerprint.c). Zeroed is empty. */
#define HOOP__NAMES 64
typedef struct hoop__names {
  hoop__lock lock; /* util/lock.h: hoop_name_next may run in any thread */
  unsigned next;
  uint32_t tag[HOOP__NAMES];
  char text[HOOP__NAMES][HOOP_NAME_MAX];
} hoop__names;

/* The collectives, as the dispatcher (coll/dispatch.c) and the tuning table (coll/tune.c) know
 * them. */
typedef enum hoop__coll {
  HOOP__COLL_ALLREDUCE,
  HOOP__COLL_BROADCAST,
  HOOP__COLL_ALLGATHER,
  HOOP__COLL_BARRIER,
  HOOP__COLL_REDUCE_SCATTER,
  HOOP__COLL_ALLTOALL,
  HOOP__COLL_ALLTOALLV,
  HOOP__COLL_REDUCE,
  HOOP__COLL_GATHER,
  HOOP__COLL_SCATTER,
  HOOP__COLL_COUNT
} hoop__coll;

/* NULL where op applies to dtype; else why not ("a bitwise op takes integer and bool dtypes
 * only", ...), for the calls' errors (dtype.c). */
const char *hoop__op_refused(hoop_dtype dtype, hoop_op op);
/* Whether format is a HOOP_COMPRESS_* format with known flags (none takes no flags). */
int hoop__compress_known(int format);
/* A call's wire format when none was asked for it: the communicator's. */
#define HOOP__COMPRESS_COMM (-1)

/* The collectives that take an op and combine the ranks' values (reproducible mode's). */
static inline int hoop__coll_reduces(hoop__coll coll) {
  return coll == HOOP__COLL_ALLREDUCE || coll == HOOP__COLL_REDUCE_SCATTER ||
         coll == HOOP__COLL_REDUCE;
}

struct hoop__tctx;
struct hoop__mem_ops;

typedef enum hoop__hook_kind {
  HOOP__HOOK_FAIL,
  HOOP__HOOK_ABORT,
  HOOP__HOOK_WAKE, /* wake a thread that sleeps in the transports (the transport layer's) */
  HOOP__HOOK_KINDS
} hoop__hook_kind;
typedef void (*hoop__hook_fn)(hoop_comm *comm);
#define HOOP__HOOKS_MAX 4
struct hoop__rdzv_thread;
struct pollfd;

/* A buffer of the library's own in host memory, which the transports may keep registrations of
 * (mem/host.c: hoop__host_buf_grow). */
typedef struct hoop__host_buf {
  void *ptr;
  size_t bytes;
  int pinned; /* page-locked memory from the driver */
} hoop__host_buf;

struct hoop__stray;
/* The collectives' state of a communicator (coll/state.h, which only lib/coll sees). */
typedef struct hoop__coll_state hoop__coll_state;
/* The memory kinds' state of a communicator (mem/state.h, which only lib/mem sees). */
typedef struct hoop__mem_state hoop__mem_state;
/* The rendezvous client's state of a communicator (rdzv/state.h, which only lib/rdzv sees). */
typedef struct hoop__rdzv_state hoop__rdzv_state;
/* The transport layer's state of a communicator (transport/state.h, which only lib/transport
 * sees). */
typedef struct hoop__transport_state hoop__transport_state;
/* The communicator's life's state (comm/state.h, which only lib/comm sees). */
typedef struct hoop__comm_life hoop__comm_life;

struct hoop_comm {
  int rank, size, local_rank, local_size;
  /* Sub-communicators (hoop_comm_split, comm/split.c) are views of the communicator hoop_init
   * made, "net": its transports, connections and rendezvous connection carry their messages,
   * marked by a channel of their own. net is the communicator itself for the one hoop_init made;
   * net_rank_of maps a sub-communicator's ranks to net's (NULL in net), and transfers, the
   * transports and their messages speak net's ranks. */
  hoop_comm *net;
  int *net_rank_of;
  uint16_t channel;
  /* net's own: what its views share. net_lock guards the transports, their requests and the
   * strays while views exist (net_shared), so that calls on several communicators may run at once
   * from different threads; a wait takes it round by round. net_waiters: threads waiting for it
   * (the holder wakes from its sleep and lets them in). */
  pthread_mutex_t net_lock;
  atomic_int net_shared;
  atomic_int net_waiters;
  atomic_int multiplexed; /* a split began on this rank (hoop__tctx.multiplexed) */
  /* The communicator whose post or wait drives the transports now (under the lock), for the
   * call its failure messages name; NULL: net's own. */
  const hoop_comm *net_caller;
  uint32_t generation; /* shrinks since the job's first table (hoop_comm_shrink) */
  char job[HOOP__WIRE_MAX_JOB + 1];
  char rendezvous[HOOP__WIRE_MAX_HOST + 8];
  double timeout_s;
  int tcp_streams;
  char ifname[256];
  hoop__table table;                    /* rank -> host, address, local rank */
  char token[HOOP__MAX_TOKEN + 1];      /* the shared secret, "" for none; wiped at finalize */
  uint8_t data_nonce[HOOP__WIRE_NONCE]; /* the job's data key, which data connections' proofs are
                                          keyed by (transport/shared.c): the table's nonce, or
                                          with a token a proof derived from it and the token */
  /* This rank's key pair (proto/auth.h), made at hoop_init and kept by every generation: the
   * public half travels in the HELLO and the rank table, the secret half is wiped at finalize. */
  uint8_t key_public[HOOP__AUTH_KEY];
  uint8_t key_secret[HOOP__AUTH_KEY];

  char transport_mode[16]; /* HOOP_TRANSPORT: auto, shm, tcp or ibverbs */
  char encrypt[24];        /* HOOP_ENCRYPT or hoop_config's encrypt: what seals TCP connections */
  /* The rendezvous connection, kept after the join (-1: none): this rank's ABORT and BYE go out
   * on it, and NOTICEs of other ranks' aborts and losses come in (see rdzv/client.h). */
  int rdzv_fd;
  hoop__rdzv_state *rdzv; /* the rendezvous client's own (rdzv/state.h) */

  uint64_t seq;                                 /* collective calls made, for error messages */
  const char *call;                             /* the collective running now, for error messages */
  uint8_t fingerprint[HOOP__FINGERPRINT_BYTES]; /* the running call's, see coll/dispatch.c */
  hoop__names names;                            /* the calls' names, see core/fingerprint.c */
  int check_calls;       /* HOOP_CHECK_CALLS: send and compare fingerprints */
  int reproducible;      /* reducing calls' bits fixed by the inputs alone (HOOP_REPRODUCIBLE,
                            hoop_comm_set_reproducible; lib/coll/repro.c) */
  int compress;          /* the wire format across hosts and its flags (HOOP_COMPRESS,
                            hoop_comm_set_compress; lib/coll/compressed.c) */
  double stall_warn_s;   /* HOOP_STALL_WARN */
  double call_started;   /* when the running call began, for the stall warning */
  int stall_warned;      /* stall warnings the running call has logged (one per HOOP_STALL_WARN) */
  int call_waited;       /* the running call read the clock while it waited (transport/wait.c) */
  uint64_t call_wait_ns; /* how long the running call waited for peers (transport/wait.c) */
  /* When the running call began and last read the precise clock, read only where it costs
   * nothing worth saying: at the start and end of a call of 64 KiB or more, else where its first
   * wait began and its last wait ended (transport/wait.c); 0 while not read. A call that never
   * waited took no time to count. */
  double call_clock_start, call_clock_last;
  /* When the running call began by the precise clock, read only where the coarse clock moved
   * since the last call ended (call_ended, coarse): this rank was away a tick or more, which a
   * reading costs nothing beside; 0 while not read. Where it came to a call that needs every
   * rank (coll/state.h), for the rendezvous server's lateness figures. */
  double call_came, call_ended;
  int waiting_for;    /* net's: the rank its running wait waits for (transport/wait.c), or -1 */
  int kernel_ranks;   /* ranks on this rank's kernel, any network namespace (transport/select.c) */
  hoop_result failed; /* sticky: once set, every call is refused */
  char last_error[1024];
  char fail_reason[1024]; /* the message of the failure that set `failed` */
  int fail_origin;        /* the rank whose failure started it (this one, a lost peer...) */
  char fail_cause[1024];  /* the origin's own message, forwarded to peers in a notice */
  hoop__hook_fn hooks[HOOP__HOOK_KINDS][HOOP__HOOKS_MAX]; /* core/error.c */
  hoop__coll_state *coll;                                 /* the collectives' own (coll/state.h) */
  hoop__mem_state *mem_state;                             /* the memory kinds' own (mem/state.h) */
  hoop__transport_state *transport; /* the transport layer's own (transport/state.h) */
  hoop__comm_life *life;            /* the communicator's life's own (comm/state.h) */

  /* hoop_abort from another thread: the reason is stored, the flag raised, and whoever holds
   * call_lock (the thread inside a call, woken through the transport) carries it out. */
  hoop__lock call_lock; /* util/lock.h */
  atomic_int abort_requested;
  atomic_int abort_done;
  char abort_reason[512];

  /* The running call's memory kind (mem/kind.h): host memory but while a path runs an algorithm
   * on other memory. */
  const struct hoop__mem_ops *mem;
  /* The host kind's scratch, that algorithms receive into (mem/host.c): the memory kinds', read
   * by the transports (hoop__tctx_scratch), which may keep registrations of it. */
  hoop__host_buf scratch;

  /* Posted calls not yet started, run in order by whoever holds call_lock (core/progress.c): the
   * progress thread, or a thread waiting for one of them. queue_lock guards the queue, the
   * requests' completion and the progress thread's state. */
  pthread_mutex_t queue_lock;
  pthread_cond_t queue_cond; /* something was posted, or the progress thread must stop */
  pthread_cond_t done_cond;  /* a request completed */
  struct hoop_request *queue_head, *queue_tail;
  size_t outstanding; /* requests posted by the non-blocking calls and not yet freed */
  /* Point-to-point requests whose transfers are posted and have not ended (under call_lock), and
   * how many (read without it by the progress thread, which moves them while there are any). */
  struct hoop_request *in_flight;
  atomic_int in_flight_count;
  pthread_t progress;
  int progress_started, progress_stop, progress_idle;
  int async_progress; /* HOOP_ASYNC_PROGRESS (-1: not read yet) */
  FILE *trace;        /* HOOP_TRACE's file (core/trace.c), or NULL */
  char trace_transport[64];
  atomic_ullong trace_ids; /* calls posted, numbering their spans in the trace */
};

/* A buffer registered on a communicator: [base, base + bytes), and what each transport made of
 * it (the verbs transport's ibv_mr; NULL for TCP), by its index in the communicator's transports.
 * The table is net's, shared by its sub-communicators (whose transports are net's), and read and
 * changed under the net lock; owner is the communicator that registered it (its handle, its
 * finalize). */
typedef struct hoop__registration {
  void *base;
  size_t bytes;
  uint64_t handle;
  const hoop_comm *owner;
  int device;             /* a user's registration of device memory */
  void *transport_mem[4]; /* HOOP__MAX_TRANSPORTS */
  /* Floats kept with it for the calls on it (error feedback's residuals), one array per call
   * shape: hoop__registration_floats. */
  struct hoop__kept *kept;
} hoop__registration;

/* The registration in net's table that covers all of [ptr, ptr + len), or NULL (the transports,
 * under the net lock). */
const hoop__registration *hoop__registration_find(const hoop_comm *comm, const void *ptr,
                                                  size_t len);
/* Whether a registration holds all of [ptr, ptr + len) and every peer of comm's transport made
 * something of it (for device memory: mem/gdr.c found a way to register it for GPUDirect RDMA);
 * *device (if not NULL) says whether it is a user's registration of device memory. */
int hoop__registered_for_peers(hoop_comm *comm, const void *ptr, size_t len, int *device);
/* Whether a user's registration holds all of [ptr, ptr + len). */
int hoop__registered(hoop_comm *comm, const void *ptr, size_t len);
/* count floats kept with the user's registration that holds [ptr, ptr + len) until it is
 * deregistered, for calls at ptr of the shape key names (one array for each ptr, key, count and
 * device asked with; zeroed when made), in host memory, or with device in device memory of ptr's
 * context. NULL when no registration holds it, or memory ran out. Under call_lock. */
float *hoop__registration_floats(hoop_comm *comm, const void *ptr, size_t len, size_t count,
                                 uint64_t key, int device);
/* Deregister everything comm registered (hoop_finalize, before the transport goes). */
void hoop__registrations_release(hoop_comm *comm);
/* A registration of the library's own memory (the GPUDirect path's device scratch), made with
 * call_lock held, under handle 0, which hoop_deregister refuses: HOOP_OK, or the error recorded.
 * Dropped by hoop__deregister_internal (nothing if there is none at ptr) or at finalize. */
hoop_result hoop__register_internal(hoop_comm *comm, void *ptr, size_t bytes);
void hoop__deregister_internal(hoop_comm *comm, const void *ptr);

/* Failure hooks: what the layers above the core do when comm fails (FAIL: hoop__fail, and a
 * hoop__retire's goodbye; the transports drop their connections, telling their peers) or aborts
 * (ABORT: before the failure; the rendezvous connection tells the server, which reaches every
 * rank). Each layer registers its own once it has something to do (a function is kept once);
 * they run in the order registered. */
void hoop__hook_register(hoop_comm *comm, hoop__hook_kind kind, hoop__hook_fn fn);

/* The words of a failure another thread ran into for this one (see error.c), and what
 * hoop_last_error shows this thread: those words, or comm->last_error. */
void hoop__error_told(const hoop_comm *comm, const char *text);
const char *hoop__error_for_caller(const hoop_comm *comm);

/* Record a failure on comm and return code. Does not mark the communicator failed. */
hoop_result hoop__set_error(hoop_comm *comm, hoop_result code, const char *fmt, ...)
    HOOP__PRINTF(3, 4);

/* Record a failure that leaves the communicator unusable: later calls are refused. The transport
 * drops its connections so that peers notice at once rather than at their timeout. */
hoop_result hoop__fail(hoop_comm *comm, hoop_result code, const char *fmt, ...) HOOP__PRINTF(3, 4);

/* A call that failed after its arguments were checked: the communicator fails with the message
 * the call recorded (its peers would otherwise wait for what it never sent), unless it failed
 * already. Returns code. */
hoop_result hoop__fail_as_recorded(hoop_comm *comm, hoop_result code);

/* A call on a communicator that failed earlier (or was aborted): refused with the first failure's
 * story, HOOP_ERR_ABORTED or HOOP_ERR_FAILED. */
hoop_result hoop__refuse_failed(hoop_comm *comm, const char *call);

/* Leave comm on purpose (a shrink or growth of a communicator that has not failed): the peers are
 * told goodbye, as at finalize, not of a failure, so that a peer still finishing a call this rank
 * has finished gets what this rank sent it, and only a wait for more from this rank fails; this
 * rank's later calls are refused with the message. */
hoop_result hoop__retire(hoop_comm *comm, hoop_result code, const char *fmt, ...)
    HOOP__PRINTF(3, 4);

/* Called by the transport. A message from peer carried fingerprint theirs (and len bytes where
 * ours expected expected_len): fail with HOOP_ERR_MISMATCH naming both sides. */
hoop_result hoop__mismatch(hoop_comm *comm, int peer, const uint8_t *theirs, const uint8_t *ours,
                           uint64_t len, uint64_t expected_len);

/* Called by the transport for a message from peer whose header came before any receive was
 * posted for it, with fingerprint theirs. A receive may never be posted for it (its sender's call
 * differs from this rank's), so if it was sent in this rank's running call or an earlier one yet
 * describes another call, fail with HOOP_ERR_MISMATCH now; HOOP_OK while it may still match. */
hoop_result hoop__mismatch_early(hoop_comm *comm, int peer, uint16_t channel,
                                 const uint8_t *theirs);

/* Called by the transport: peer sent a failure notice {code, origin rank, origin's message}
 * before closing. Fails comm so that it names the origin, not the neighbour. */
hoop_result hoop__peer_notice(hoop_comm *comm, int peer, hoop_result code, int origin,
                              const char *text);

/* Carry out a hoop_abort requested from another thread, if any: HOOP_ERR_ABORTED once done,
 * else HOOP_OK. The caller holds call_lock. */
hoop_result hoop__check_abort(hoop_comm *comm);

/* Sub-communicators (comm/split.c). The communicator that carries comm's messages. */
static inline hoop_comm *hoop__net(hoop_comm *comm) {
  return comm->net;
}
/* comm's rank r in its net's numbering. */
static inline int hoop__net_rank(const hoop_comm *comm, int r) {
  return comm->net_rank_of ? comm->net_rank_of[r] : r;
}
/* comm's rank whose net rank is net_rank, or -1 when that rank is not one of comm's (a search:
 * for statistics and traces, not for a call's path). */
static inline int hoop__comm_rank_of_net(const hoop_comm *comm, int net_rank) {
  if (!comm->net_rank_of)
    return net_rank >= 0 && net_rank < comm->size ? net_rank : -1;
  for (int r = 0; r < comm->size; r++)
    if (comm->net_rank_of[r] == net_rank)
      return r;
  return -1;
}
/* Take and give back net's lock (a no-op while no view exists); enter wakes a holder that
 * sleeps in the transports (HOOP__HOOK_WAKE). yield: between two rounds of a wait, with the lock
 * given back, let a thread that waits for it in. */
void hoop__net_enter(hoop_comm *comm);
void hoop__net_leave(hoop_comm *comm);
void hoop__net_yield(hoop_comm *comm);
/* The call a failure met in the transports belongs to: the running call of the communicator that
 * drives them (net's own, or a view's). */
static inline const char *hoop__net_call(const hoop_comm *net, unsigned long long *seq) {
  const hoop_comm *caller = net->net_caller ? net->net_caller : net;
  *seq = (unsigned long long)caller->seq;
  return caller->call;
}
/* A view whose net failed takes net's failure as its own (its message, origin and code):
 * returns comm->failed. */
hoop_result hoop__net_failed(hoop_comm *comm);

/* 1 when this host's ranks (the rank table's local size, or the ranks on this kernel where more)
 * outnumber its online CPUs, so that they take turns on the cores. Affinity masks are not
 * consulted: they could differ between ranks. */
int hoop__host_oversubscribed(const hoop_comm *comm);
/* The same by the rank table's local size alone, which every rank of a host sees alike: for
 * choices that must agree across ranks (the tuning table's crowded rows). */
int hoop__host_crowded(const hoop_comm *comm);
/* Whether this host's ranks, less the asleep of them known asleep in a wait, still outnumber its
 * CPUs: cheap enough for a spinning wait to ask every few rounds. */
int hoop__host_crowded_now(const hoop_comm *comm, int asleep);

#endif /* HOOP__INTERNAL_H */
