/* shm.h - the shared-memory transport's private state, shared by its files: conn.c opens the
 * listener, decides which peers share this host, and sets up each pair's segment; data.c moves
 * messages through the segment (or lets the receiver copy them straight out of the sender with
 * CMA) and sleeps on the pair's socket; board.c hands a communicator's board out over the pairs;
 * shm.c implements the transport ops. The design is described at the top of shm.c. */
#ifndef HOOP__SHM_H
#define HOOP__SHM_H

#include <poll.h>
#include <stdatomic.h>
#include <stddef.h>
#include <sys/types.h>

#include "transport/pending.h"
#include "transport/transport.h"

#define SHM_LINE 64
/* A pair's segment holds two lanes (one per direction) of SHM_SLOTS slots each. */
#define SHM_SLOTS 16
#define SHM_SLOT_BYTES (64 * 1024)

#define SHM_MAGIC 0x53504f48u /* "HOPS" */
#define SHM_VERSION 3u
enum shm_frame_type {
  SHM_DATA = 1, /* a message's first slot: its header and first bytes */
  SHM_MORE = 2, /* the next bytes of the message before it */
  SHM_RNDV = 3  /* a message the receiver reads from the sender's memory (CMA) */
};

/* Control messages on a pair's socket (a byte stream: a stream socket queues bells by the
 * byte, where a datagram socket would refuse the eleventh unread one, and a notice after it). */
enum shm_control {
  SHM_BELL = 'D',   /* something changed in the segment while the peer slept */
  SHM_NOTICE = 'N', /* {N, 0, be16 text length, be32 code, be32 origin rank, text}: this rank
                       failed or aborted */
  SHM_BYE = 'B',    /* this rank finalized: its closing is no failure */
  SHM_HELLO = 'H',  /* the accepting rank's answer to the connecting one */
  SHM_BOARD = 'G',  /* {G, made, be16 channel, be32 bytes}: a communicator's board (board.c), its
                       descriptor with the first byte when made is 1 */
};
#define SHM_BOARD_BYTES 8

#define SHM_NOTICE_HEAD 12
#define SHM_NOTICE_MAX 1000

/* A slot's first cache line holds all a small message needs: the receiver waits on seq, and the
 * line that brings the new seq brings the frame and up to SHM_INLINE bytes of payload with it, so a
 * small message costs the receiver one cache miss. Bigger payloads go in data. */
#define SHM_INLINE 8
typedef struct shm_slot {
  /* The slot's position in the lane + 1 once its message is published (written last). */
  _Alignas(SHM_LINE) _Atomic uint64_t seq;
  uint32_t bytes; /* payload in this slot: in inline_data when at most SHM_INLINE, else in data */
  uint32_t unused;
  /* The frame (hoop__frame_encode's) for SHM_DATA and SHM_RNDV; the type alone for SHM_MORE. */
  uint8_t frame[HOOP__FRAME_BYTES];
  unsigned char inline_data[SHM_INLINE]; /* SHM_RNDV: where the message is in the sender */
  _Alignas(SHM_LINE) unsigned char data[SHM_SLOT_BYTES];
} shm_slot;
_Static_assert(offsetof(shm_slot, inline_data) + SHM_INLINE == SHM_LINE,
               "a slot's header and inline payload fill one cache line");

/* One direction of a pair: a single-producer single-consumer queue of slots. The producer
 * publishes a slot by its seq; the consumer frees slots by advancing tail, which the producer
 * reads only when the queue looks full. Counters only grow; each is written by one side, on a cache
 * line of its own. */
typedef struct shm_lane {
  _Alignas(SHM_LINE) _Atomic uint64_t tail; /* slots taken (consumer) */
  _Alignas(SHM_LINE) _Atomic uint64_t read; /* SHM_RNDV messages read (consumer) */
  _Alignas(SHM_LINE) shm_slot slots[SHM_SLOTS];
} shm_lane;

/* Side 0 is the lower rank, which creates the segment; lane s carries side s's messages. */
typedef struct shm_segment {
  _Alignas(SHM_LINE) uint32_t magic, version;
  /* sleeping[s]: side s is about to sleep or sleeps in poll(); whoever changes what it waits for
   * clears it and rings its bell. */
  struct {
    _Alignas(SHM_LINE) _Atomic uint32_t flag;
  } sleeping[2];
  /* can_read[s]: side s reads the other side's memory with process_vm_readv, so the other side
   * may send it SHM_RNDV messages. */
  struct {
    _Alignas(SHM_LINE) _Atomic uint32_t flag;
  } can_read[2];
  /* asym[s]: side s fences with membarrier() before it sleeps (hoop__shm_asym), so that the
   * other side, when it too is registered, needs no fence of its own when it rings. */
  struct {
    _Alignas(SHM_LINE) _Atomic uint32_t flag;
  } asym[2];
  shm_lane lane[2];
} shm_segment;

/* What shm keeps in a request. */
typedef struct shm_request {
  struct hoop__transfer *next;
  char *buf;
  size_t done;     /* bytes placed (send) or taken (receive) */
  int started;     /* send: its first slot is out; receive: its header was checked */
  uint64_t ticket; /* SHM_RNDV send: complete when the lane's read count passes it */
} shm_request;
_Static_assert(sizeof(shm_request) <= HOOP__TRANSFER_STATE_BYTES,
               "a request's transport state holds shm's");

static inline shm_request *shm_req(hoop__transfer *req) {
  return (shm_request *)(void *)req->transport_state;
}

typedef struct shm_queue {
  hoop__transfer *head, *tail;
} shm_queue;

/* Boards a peer may have handed over that no communicator has taken yet. */
#define SHM_PEER_FDS 4

/* The connecting rank's hello (conn.c): {magic, version, from, to, proof, probe address, probe
 * value}. */
#define SHM_HELLO_BYTES (16 + HOOP__WIRE_NONCE + 16)

typedef struct shm_peer {
  int fd; /* the pair's socket: bells, notices, bye; its closing is the peer's death */
  uint8_t hello[SHM_HELLO_BYTES]; /* side 0: the hello it sent, which the answer must prove */
  shm_segment *seg;
  int side; /* this rank's side of the segment */
  pid_t pid;
  int answered;    /* side 0: the peer's hello came (its pid, its probe) */
  int said_bye;    /* it finalized */
  int eof;         /* its socket closed */
  uint64_t peeked; /* the slot whose header was compared with the running call (+1) */
  /* and that call's number: a message of a call ahead compares again in the next call, which may
   * post no receive for it (a call on the board) */
  unsigned long long peeked_call;
  shm_queue sends;  /* not fully placed yet */
  shm_queue unread; /* SHM_RNDV sends waiting for the peer to read them */
  shm_queue recvs;
  uint64_t tickets; /* SHM_RNDV messages sent */
  uint64_t head;    /* slots this rank published to the peer */
  uint64_t freed;   /* the peer's tail as last read: slots it has taken */
  uint64_t taken;   /* slots this rank took from the peer's lane */
  uint8_t in[2048]; /* what came on the socket and is not taken yet */
  size_t in_len;
  shm_queue watches; /* watches of words the peer raises on a board (board.c) */
  /* Descriptors that came on the socket and no board message has taken yet, oldest first; and
   * the boards that came and no communicator has taken yet (board.c). */
  int fds[SHM_PEER_FDS];
  int nfds;
  struct {
    uint16_t channel;
    uint32_t bytes;
    int fd; /* -1: its creator could not make it */
  } boards[SHM_PEER_FDS];
  int nboards;
} shm_peer;

typedef struct shm_state {
  int listen_fd;
  int wake_fd;
  hoop__pending pending; /* accepted connections whose hello is not all in */
  char name[108];        /* the listener's abstract socket name (without its leading NUL) */
  double spin_s;
  size_t cma_min; /* HOOP_SHM_CMA_BYTES: messages this big go by CMA where it works; 0 never */
  int cma_auto;   /* HOOP_SHM_CMA_BYTES=auto (decided by conn.c's settle) */
  uint64_t probe; /* what a peer must read here to show it can use CMA */
  shm_peer *peers;
  hoop__pollset pollset; /* owners: the peer whose socket it is */
  int sleeping;          /* the sleeping flags are up for a shared sleep (sleep_prepare) */
  int asym;        /* this rank fences its peers with membarrier() before it sleeps (data.c) */
  int settled;     /* conn.c's settle ran */
  unsigned rounds; /* progress rounds since the sockets were last looked at */
} shm_state;

static inline shm_state *shm_of(hoop__tctx *ctx) {
  return ctx->state;
}

/* conn.c */
hoop_result hoop__shm_listen(hoop__tctx *ctx, const struct sockaddr *toward, char *addr,
                             size_t addrlen);
int hoop__shm_can_reach(const hoop__tctx *ctx, int peer);
/* The ranks that run on this rank's kernel, whatever their network namespaces, as the
 * shared-memory entries in the table tell (the ops' kernel_ranks). */
int hoop__shm_kernel_ranks(const hoop__tctx *ctx);
hoop_result hoop__shm_connect(hoop__tctx *ctx, int peer);
/* Read what the peer's socket holds (bells, its hello, a notice, a bye, its closing). */
hoop_result hoop__shm_read_socket(hoop__tctx *ctx, int peer);
void hoop__shm_unmap(shm_peer *peer);
/* Segments (a pair's, a board's): a memfd of bytes sealed against shrinking, growing and further
 * seals, mapped into *map; its descriptor, or -1 with errno set and nothing left open. */
int hoop__shm_segment_make(const char *name, size_t bytes, void **map);
/* Close what make returned, once handed over (the mapping stays). A function of its own, never
 * inlined, for one reason: ThreadSanitizer does not see memfd_create (gcc 12's), so a memfd that
 * takes the number of a descriptor another thread closed looks like that descriptor to it, and
 * its close like a race with that thread's last use; .ci/tsan.supp names this function. */
void hoop__shm_segment_close(int memfd);
/* A segment's descriptor from a peer, mapped if it is bytes long and sealed as make seals it (so
 * that no member can cut the mapping under this rank: SIGBUS); NULL with errno 0 when it is not
 * such a segment, with errno set when mapping failed. */
void *hoop__shm_segment_map(int fd, size_t bytes);

/* data.c */
hoop_result hoop__shm_post(hoop__tctx *ctx, int peer, void *buf, size_t len, hoop__transfer *req,
                           int is_send);
hoop_result hoop__shm_progress(hoop__tctx *ctx, int timeout_ms, int *moved);
hoop_result hoop__shm_sleep_prepare(hoop__tctx *ctx, struct pollfd **fds, nfds_t *n, int *moved);
hoop_result hoop__shm_sleep_done(hoop__tctx *ctx, int *moved);
/* Peers whose sleeping flag is up: asleep in a wait, or about to be (the ops' asleep_peers). */
int hoop__shm_asleep_peers(hoop__tctx *ctx);
/* After changing a word of a board that the n peers may wait for: wake those that sleep. */
void hoop__shm_wake(hoop__tctx *ctx, const int *peers, int n);
/* A watch: req completes once *word is at least value (a word of a board that peer raises). */
hoop_result hoop__shm_board_watch(hoop__tctx *ctx, int peer, const _Atomic uint64_t *word,
                                  uint64_t value, hoop__transfer *req);

/* board.c */
/* A descriptor that came on peer's socket, and a board message: both in the order sent. */
void hoop__shm_fd_came(hoop__tctx *ctx, int peer, int fd);
hoop_result hoop__shm_board_came(hoop__tctx *ctx, int peer, const uint8_t *msg);
/* Close what a peer handed over that nobody took. */
void hoop__shm_boards_drop(shm_peer *p);
hoop_result hoop__shm_board_create(hoop__tctx *ctx, uint16_t channel, const int *ranks, int n,
                                   size_t bytes, void **map);
hoop_result hoop__shm_board_attach(hoop__tctx *ctx, uint16_t channel, int creator, size_t bytes,
                                   void **map, int *settled);

/* 1 when this process is registered for membarrier()'s global expedited fences (once per
 * process; HOOP_SHM_MEMBARRIER=0 refuses them). */
int hoop__shm_asym(void);

#endif /* HOOP__SHM_H */
