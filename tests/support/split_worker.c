/* split_worker.c - sub-communicators (hoop_comm_split) on real ranks under hooprun
 * (tests/test_split.c).
 *
 * Default: the job split in halves (keys reversing the order) and each half's collectives and
 * point-to-point messages checked; a rank that stays out (HOOP_SPLIT_NONE); a half split again;
 * bad arguments; finalizing the job's communicator while views live, refused. Then a grid of rows
 * and columns (2 x size/2, or 3 wide when size is a multiple of 3): the rows' collectives in one
 * thread, the columns' in another and the whole job's in the main thread, all at once, each
 * result checked against values computed here. Sockets and shared-memory segments are counted
 * before the splits and after all of it, with every pair connected first: a split opens none.
 *
 * --mismatch: in the even ranks' half, rank 0 calls an allreduce of another count: every rank's
 * half and the job's communicator must fail with the mismatch, naming both sides.
 * --shrink (under hooprun --min-np): as --kill, then every survivor shrinks the job's communicator,
 * then its row and its column (hoop_comm_shrink on each), and runs rounds on the new ones, rows and
 * columns at once from two threads beside the new job's calls.
 * --kill: after the grid split the last rank dies; every survivor's row and column calls must
 * fail within HOOP_TIMEOUT, naming it; --kill-jitter US: the same, each rank leaving the barrier
 * before the death up to US microseconds late (the death then meets the survivors' first calls
 * at any step). --device: the buffers of every call in CUDA device memory
 * (HOOP_CUDA_LIBRARY's driver; the stand-in where there is no GPU), checked through host copies.
 * --rounds N: the grid's rounds per communicator (default 12).
 *
 * Prints "split_worker rank R of N: C checks, F failed". */
#include <dirent.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "devmem.h"
#include "hoop.h"

static int world_rank, world_size, device_buffers;
static atomic_long checks, failures;

static void fail(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  char line[512];
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  fprintf(stderr, "rank %d FAIL: %s\n", world_rank, line);
  atomic_fetch_add(&failures, 1);
}

static void check(int ok, const char *fmt, ...) {
  atomic_fetch_add(&checks, 1);
  if (ok)
    return;
  va_list ap;
  va_start(ap, fmt);
  char line[512];
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  fail("%s", line);
}

static void must(hoop_comm *comm, hoop_result result, const char *what) {
  if (result != HOOP_OK) {
    fprintf(stderr, "rank %d FAIL: %s returned %s: %s\n", world_rank, what, hoop_strerror(result),
            comm ? hoop_last_error(comm) : "");
    exit(1);
  }
}

static void *xmalloc(size_t bytes) {
  void *p = calloc(1, bytes ? bytes : 1);
  if (!p) {
    fprintf(stderr, "rank %d: out of memory\n", world_rank);
    exit(2);
  }
  return p;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Sockets and shared-memory segments this process holds. */
static int connections(void) {
  DIR *dir = opendir("/proc/self/fd");
  if (!dir)
    return -1;
  int n = 0;
  struct dirent *entry;
  while ((entry = readdir(dir)) != NULL) {
    char path[300], target[256];
    snprintf(path, sizeof path, "/proc/self/fd/%s", entry->d_name);
    ssize_t len = readlink(path, target, sizeof target - 1);
    if (len <= 0)
      continue;
    target[len] = '\0';
    if (strncmp(target, "socket:", 7) == 0 || strncmp(target, "/memfd:", 7) == 0)
      n++;
  }
  closedir(dir);
  return n;
}

/* What a communicator's member w (its rank in the job) contributes at element i in round salt. */
static int64_t value(int w, size_t i, int salt) {
  return (int64_t)(w + 1) * 1000 + (int64_t)(i % 97) + salt;
}

/* The job ranks of comm's members, in comm's order (an allgather checked elsewhere). */
typedef struct group {
  hoop_comm *comm;
  const char *name;
  int rank, size;
  int *world; /* size entries */
} group;

static void group_init(group *g, hoop_comm *comm, const char *name) {
  g->comm = comm;
  g->name = name;
  g->rank = hoop_rank(comm);
  g->size = hoop_size(comm);
  g->world = xmalloc((size_t)g->size * sizeof *g->world);
  int32_t mine = world_rank;
  must(comm, hoop_allgather(comm, &mine, g->world, 1, HOOP_INT32), "hoop_allgather of ranks");
}

/* The buffers of one round: host memory, or device memory with host copies to fill and check. */
typedef struct bufs {
  int64_t *send, *recv;           /* what the calls get */
  int64_t *host_send, *host_recv; /* what this program fills and checks */
  size_t bytes;
} bufs;

static void bufs_init(bufs *b, size_t elements) {
  b->bytes = elements * sizeof(int64_t);
  b->host_send = xmalloc(b->bytes);
  b->host_recv = xmalloc(b->bytes);
  if (device_buffers) {
    b->send = devmem_put(NULL, b->bytes);
    b->recv = devmem_put(NULL, b->bytes);
  } else {
    b->send = b->host_send;
    b->recv = b->host_recv;
  }
}

/* host_send (and host_recv, for calls that read their receive buffer) to the calls' buffers. */
static void bufs_in(bufs *b, int with_recv) {
  if (!device_buffers)
    return;
  devmem_upload(b->send, b->host_send, b->bytes);
  if (with_recv)
    devmem_upload(b->recv, b->host_recv, b->bytes);
}

static void bufs_out(bufs *b) {
  if (device_buffers)
    devmem_get(b->host_recv, b->recv, b->bytes);
}

static void bufs_free(bufs *b) {
  if (device_buffers) {
    devmem_free(b->send);
    devmem_free(b->recv);
  }
  free(b->host_send);
  free(b->host_recv);
}

/* One round of every kind of call on g, with count elements, each result checked. */
static void round_of_calls(group *g, size_t count, int salt) {
  hoop_comm *comm = g->comm;
  int n = g->size;
  bufs b;
  bufs_init(&b, count * (size_t)n);
  int64_t *send = b.host_send, *recv = b.host_recv;
  /* allreduce: the sum over the members */
  for (size_t i = 0; i < count; i++)
    send[i] = value(world_rank, i, salt);
  bufs_in(&b, 0);
  must(comm, hoop_allreduce(comm, b.send, b.recv, count, HOOP_INT64, HOOP_SUM), "hoop_allreduce");
  bufs_out(&b);
  size_t bad = 0;
  for (size_t i = 0; i < count; i++) {
    int64_t want = 0;
    for (int r = 0; r < n; r++)
      want += value(g->world[r], i, salt);
    bad += recv[i] != want;
  }
  check(bad == 0, "%s allreduce of %zu (round %d): %zu wrong", g->name, count, salt, bad);
  /* allgather: each member's block in comm's order */
  must(comm, hoop_allgather(comm, b.send, b.recv, count, HOOP_INT64), "hoop_allgather");
  bufs_out(&b);
  bad = 0;
  for (int r = 0; r < n; r++)
    for (size_t i = 0; i < count; i++)
      bad += recv[(size_t)r * count + i] != value(g->world[r], i, salt);
  check(bad == 0, "%s allgather of %zu (round %d): %zu wrong", g->name, count, salt, bad);
  /* broadcast from a root that moves */
  int root = salt % n;
  if (g->rank != root)
    memset(recv, 0, count * sizeof *recv);
  else
    memcpy(recv, send, count * sizeof *recv);
  bufs_in(&b, 1);
  must(comm, hoop_broadcast(comm, b.recv, count, HOOP_INT64, root), "hoop_broadcast");
  bufs_out(&b);
  bad = 0;
  for (size_t i = 0; i < count; i++)
    bad += recv[i] != value(g->world[root], i, salt);
  check(bad == 0, "%s broadcast of %zu from %d (round %d): %zu wrong", g->name, count, root, salt,
        bad);
  /* reduce_scatter: block b of member w holds value(w, b * count + i) */
  for (size_t i = 0; i < count * (size_t)n; i++)
    send[i] = value(world_rank, i, salt);
  bufs_in(&b, 0);
  must(comm, hoop_reduce_scatter(comm, b.send, b.recv, count, HOOP_INT64, HOOP_SUM),
       "hoop_reduce_scatter");
  bufs_out(&b);
  bad = 0;
  for (size_t i = 0; i < count; i++) {
    int64_t want = 0;
    for (int r = 0; r < n; r++)
      want += value(g->world[r], (size_t)g->rank * count + i, salt);
    bad += recv[i] != want;
  }
  check(bad == 0, "%s reduce_scatter of %zu (round %d): %zu wrong", g->name, count, salt, bad);
  /* alltoall: what member r sends to member d is value(r, d * count + i) */
  must(comm, hoop_alltoall(comm, b.send, b.recv, count, HOOP_INT64), "hoop_alltoall");
  bufs_out(&b);
  bad = 0;
  for (int r = 0; r < n; r++)
    for (size_t i = 0; i < count; i++)
      bad += recv[(size_t)r * count + i] != value(g->world[r], (size_t)g->rank * count + i, salt);
  check(bad == 0, "%s alltoall of %zu (round %d): %zu wrong", g->name, count, salt, bad);
  /* a ring shift of point-to-point messages */
  if (n > 1) {
    hoop_request *sent, *got;
    int to = (g->rank + 1) % n, from = (g->rank + n - 1) % n;
    must(comm, hoop_irecv(comm, b.recv, count, HOOP_INT64, from, salt, &got), "hoop_irecv");
    must(comm, hoop_isend(comm, b.send, count, HOOP_INT64, to, salt, &sent), "hoop_isend");
    must(comm, hoop_wait(got), "hoop_wait (receive)");
    must(comm, hoop_wait(sent), "hoop_wait (send)");
    bufs_out(&b);
    bad = 0;
    for (size_t i = 0; i < count; i++)
      bad += recv[i] != value(g->world[from], i, salt);
    check(bad == 0, "%s ring shift of %zu (round %d): %zu wrong", g->name, count, salt, bad);
    /* Empty messages travel too (their frames carry the channel), posted both ways at once: they
     * write nothing, and are taken, so that the one-element messages that follow on the same tags
     * are the ones those tags match next. */
    recv[0] = recv[count * (size_t)n - 1] = -1;
    bufs_in(&b, 1);
    if (device_buffers)
      devmem_sync(); /* the empty calls copy nothing that would order the upload before bufs_out */
    hoop_request *e[4];
    must(comm, hoop_irecv(comm, b.recv, 0, HOOP_INT64, from, 1, &e[0]), "hoop_irecv (empty)");
    must(comm, hoop_irecv(comm, b.recv, 0, HOOP_INT64, to, 2, &e[1]), "hoop_irecv (empty)");
    must(comm, hoop_isend(comm, b.send, 0, HOOP_INT64, to, 1, &e[2]), "hoop_isend (empty)");
    must(comm, hoop_isend(comm, b.send, 0, HOOP_INT64, from, 2, &e[3]), "hoop_isend (empty)");
    for (int k = 3; k >= 0; k--)
      must(comm, hoop_wait(e[k]), "hoop_wait (empty)");
    bufs_out(&b);
    check(recv[0] == -1 && recv[count * (size_t)n - 1] == -1,
          "%s empty messages (round %d) wrote into the receive buffer", g->name, salt);
    if (count * (size_t)n >= 2) {
      int64_t *last = b.recv + count * (size_t)n - 1;
      must(comm, hoop_irecv(comm, b.recv, 1, HOOP_INT64, from, 1, &e[0]), "hoop_irecv (after)");
      must(comm, hoop_irecv(comm, last, 1, HOOP_INT64, to, 2, &e[1]), "hoop_irecv (after)");
      must(comm, hoop_isend(comm, b.send, 1, HOOP_INT64, to, 1, &e[2]), "hoop_isend (after)");
      must(comm, hoop_isend(comm, b.send, 1, HOOP_INT64, from, 2, &e[3]), "hoop_isend (after)");
      for (int k = 0; k < 4; k++)
        must(comm, hoop_wait(e[k]), "hoop_wait (after)");
      bufs_out(&b);
      check(recv[0] == value(g->world[from], 0, salt) &&
                recv[count * (size_t)n - 1] == value(g->world[to], 0, salt),
            "%s the messages after the empty ones (round %d): got %lld and %lld, expected %lld "
            "and %lld",
            g->name, salt, (long long)recv[0], (long long)recv[count * (size_t)n - 1],
            (long long)value(g->world[from], 0, salt), (long long)value(g->world[to], 0, salt));
    }
  }
  /* Non-blocking calls outstanding together (the communicator's progress thread runs them),
   * completed out of order: an allreduce into the upper half and an alltoall. */
  for (size_t i = 0; i < count * (size_t)n; i++)
    send[i] = value(world_rank, i, salt + 1);
  bufs_in(&b, 0);
  hoop_request *ar, *aa;
  int64_t *sum = xmalloc(count * sizeof *sum), *got = xmalloc(count * (size_t)n * sizeof *got);
  void *sum_buf = device_buffers ? devmem_put(NULL, count * sizeof *sum) : sum;
  must(comm, hoop_iallreduce(comm, b.send, sum_buf, count, HOOP_INT64, HOOP_SUM, &ar),
       "hoop_iallreduce");
  must(comm, hoop_ialltoall(comm, b.send, b.recv, count, HOOP_INT64, &aa), "hoop_ialltoall");
  must(comm, hoop_wait(aa), "hoop_wait (alltoall)");
  must(comm, hoop_wait(ar), "hoop_wait (allreduce)");
  bufs_out(&b);
  memcpy(got, recv, count * (size_t)n * sizeof *got);
  if (device_buffers) {
    devmem_get(sum, sum_buf, count * sizeof *sum);
    devmem_free(sum_buf);
  }
  bad = 0;
  for (size_t i = 0; i < count; i++) {
    int64_t want = 0;
    for (int r = 0; r < n; r++)
      want += value(g->world[r], i, salt + 1);
    bad += sum[i] != want;
  }
  for (int r = 0; r < n; r++)
    for (size_t i = 0; i < count; i++)
      bad +=
          got[(size_t)r * count + i] != value(g->world[r], (size_t)g->rank * count + i, salt + 1);
  check(bad == 0, "%s non-blocking allreduce and alltoall of %zu (round %d): %zu wrong", g->name,
        count, salt, bad);
  free(sum);
  free(got);
  bufs_free(&b);
}

static const size_t counts[] = {1, 7, 1000, 70001};
#define NCOUNTS (sizeof counts / sizeof counts[0])

typedef struct runner {
  group *g;
  int rounds;
} runner;

/* The rounds of one communicator, with pauses that differ by rank and round, so that the threads'
 * calls interleave differently on every rank. */
static void *run_rounds(void *arg) {
  runner *run = arg;
  if (device_buffers)
    devmem_attach();
  for (int round = 0; round < run->rounds; round++) {
    round_of_calls(run->g, counts[round % NCOUNTS], round);
    usleep((useconds_t)(((world_rank * 7 + round * 13) % 5) * 150));
  }
  return NULL;
}

static hoop_comm *split(hoop_comm *comm, int color, int key, double *took_ms) {
  hoop_comm *out = NULL;
  double t0 = now_s();
  must(comm, hoop_comm_split(comm, color, key, &out), "hoop_comm_split");
  if (took_ms)
    *took_ms = (now_s() - t0) * 1e3;
  if (color == HOOP_SPLIT_NONE)
    check(out == NULL, "a split with HOOP_SPLIT_NONE gave a communicator");
  else
    check(out != NULL, "a split with color %d gave no communicator", color);
  return out;
}

/* The halves, a rank left out, a half split again, bad arguments. */
static void halves(hoop_comm *world) {
  int half = world_size / 2;
  int color = world_rank < half ? 0 : 1;
  double took;
  hoop_comm *mine = split(world, color, -world_rank, &took);
  printf("split_worker rank %d: split in halves in %.3f ms\n", world_rank, took);
  int first = color == 0 ? 0 : half, members = color == 0 ? half : world_size - half;
  check(hoop_size(mine) == members, "half %d has %d ranks, not %d", color, hoop_size(mine),
        members);
  /* Keys reverse the order. */
  check(hoop_rank(mine) == first + members - 1 - world_rank, "rank %d is %d of its half",
        world_rank, hoop_rank(mine));
  group g = {0};
  group_init(&g, mine, color == 0 ? "first half" : "second half");
  for (int r = 0; r < g.size; r++)
    check(g.world[r] == first + members - 1 - r, "member %d of the half is job rank %d", r,
          g.world[r]);
  for (size_t c = 0; c < NCOUNTS; c++)
    round_of_calls(&g, counts[c], (int)c);
  /* Rank 0 stays out of the next split; the others form one communicator in their order. */
  hoop_comm *rest = split(world, world_rank == 0 ? HOOP_SPLIT_NONE : 5, 0, NULL);
  if (rest) {
    group r = {0};
    group_init(&r, rest, "all but rank 0");
    check(r.size == world_size - 1 && r.rank == world_rank - 1, "all but rank 0: %d of %d", r.rank,
          r.size);
    round_of_calls(&r, 1000, 3);
    free(r.world);
  }
  /* A half split again: pairs. */
  hoop_comm *pair = split(mine, g.rank / 2, 0, NULL);
  group p = {0};
  group_init(&p, pair, "pair in a half");
  round_of_calls(&p, 70001, 1);
  round_of_calls(&p, 3, 2);
  free(p.world);
  /* The odd ranks alone, the last first (hoop_comm_create_group: the even ones take no part). */
  if (world_rank % 2 == 1) {
    int n = world_size / 2, *ranks = xmalloc((size_t)n * sizeof *ranks);
    for (int i = 0; i < n; i++)
      ranks[i] = (world_size % 2 == 0 ? world_size - 1 : world_size - 2) - 2 * i;
    hoop_comm *odd = NULL;
    must(world, hoop_comm_create_group(world, ranks, n, &odd), "hoop_comm_create_group");
    group og = {0};
    group_init(&og, odd, "odd ranks");
    for (int i = 0; i < n; i++)
      check(og.world[i] == ranks[i], "member %d of the odd ranks is job rank %d, not %d", i,
            og.world[i], ranks[i]);
    round_of_calls(&og, 1000, 4);
    round_of_calls(&og, 7, 5);
    must(odd, hoop_finalize(odd), "hoop_finalize (odd ranks)");
    free(og.world);
    free(ranks);
  }
  int others[2] = {(world_rank + 1) % world_size, (world_rank + 1) % world_size};
  hoop_comm *none = (hoop_comm *)&none;
  check(hoop_comm_create_group(world, others, 1, &none) == HOOP_ERR_INVALID_ARG && none == NULL,
        "a group without this rank was not refused");
  int twice[2] = {world_rank, world_rank};
  check(hoop_comm_create_group(world, twice, 2, &none) == HOOP_ERR_INVALID_ARG,
        "a rank listed twice was not refused");
  /* Bad arguments, refused with nothing lost. */
  hoop_comm *out = (hoop_comm *)&out;
  check(hoop_comm_split(world, -7, 0, &out) == HOOP_ERR_INVALID_ARG && out == NULL,
        "color -7 was not refused");
  check(hoop_comm_split(world, 0, 0, NULL) == HOOP_ERR_INVALID_ARG,
        "a NULL newcomm was not refused");
  hoop_result refused = hoop_finalize(world);
  check(refused == HOOP_ERR_INVALID_ARG && strstr(hoop_last_error(world), "sub-communicator"),
        "finalizing the job's communicator with views alive gave %s: %s", hoop_strerror(refused),
        hoop_last_error(world));
  must(world, hoop_barrier(world), "hoop_barrier after the refused finalize");
  must(pair, hoop_finalize(pair), "hoop_finalize (pair)");
  must(rest, hoop_finalize(rest), "hoop_finalize (all but rank 0)");
  must(mine, hoop_finalize(mine), "hoop_finalize (half)");
  free(g.world);
}

/* Rows and columns at once from two threads, the job's calls in a third. */
static void grid(hoop_comm *world, int rounds) {
  int width = world_size % 3 == 0 ? 3 : 2;
  /* Every pair connected first: then a split and its calls may open nothing. */
  int64_t *all = xmalloc((size_t)world_size * 70001 * sizeof *all);
  int64_t *back = xmalloc((size_t)world_size * 70001 * sizeof *back);
  memset(all, 0, (size_t)world_size * 70001 * sizeof *all);
  must(world, hoop_alltoall(world, all, back, 70001, HOOP_INT64), "hoop_alltoall (connecting)");
  must(world, hoop_alltoall(world, all, back, 1, HOOP_INT64), "hoop_alltoall (connecting)");
  free(all);
  free(back);
  int before = connections();
  double row_ms, col_ms;
  hoop_comm *row = split(world, world_rank / width, world_rank, &row_ms);
  hoop_comm *col = split(world, world_rank % width, -world_rank, &col_ms);
  printf("split_worker rank %d: rows in %.3f ms, columns in %.3f ms\n", world_rank, row_ms, col_ms);
  group rows = {0}, cols = {0}, job = {0};
  group_init(&rows, row, "row");
  group_init(&cols, col, "column");
  group_init(&job, world, "job");
  runner r = {&rows, rounds}, c = {&cols, rounds}, w = {&job, rounds / 2};
  pthread_t rt, ct;
  if (pthread_create(&rt, NULL, run_rounds, &r) != 0 || pthread_create(&ct, NULL, run_rounds, &c))
    must(NULL, HOOP_ERR_SYSTEM, "pthread_create");
  run_rounds(&w);
  pthread_join(rt, NULL);
  pthread_join(ct, NULL);
  must(world, hoop_barrier(world), "hoop_barrier");
  int after = connections();
  printf("split_worker rank %d: sockets and segments before the splits %d, after the grid %d\n",
         world_rank, before, after);
  check(before >= 0 && before == after, "the splits and their calls opened %d connections",
        after - before);
  must(row, hoop_finalize(row), "hoop_finalize (row)");
  must(col, hoop_finalize(col), "hoop_finalize (column)");
  free(rows.world);
  free(cols.world);
  free(job.world);
}

/* The last rank dies after the grid split; every survivor's row and column calls fail naming it. */
static int kill_last(hoop_comm *world, int jitter_us) {
  /* hooprun stops the job 1 s after the death (SIGTERM, SIGKILL 3 s later): on a loaded machine a
   * survivor may not have reported by then, so the survivors stay for the 3 s, and each report
   * leaves at once (not in a buffer that a later kill would lose). */
  signal(SIGTERM, SIG_IGN);
  setvbuf(stdout, NULL, _IOLBF, 0);
  int width = world_size % 3 == 0 ? 3 : 2, last = world_size - 1;
  hoop_comm *row = split(world, world_rank / width, world_rank, NULL);
  hoop_comm *col = split(world, world_rank % width, world_rank, NULL);
  /* A survivor may learn of the death inside this barrier (told by another that left it first):
   * its row and column must then refuse their calls with the same story. */
  hoop_result barrier = hoop_barrier(world);
  /* --kill-jitter: each rank leaves the barrier a random moment later, so that the death lands
   * anywhere in the survivors' first calls (their boards' setup included). */
  if (jitter_us > 0) {
    srand((unsigned)getpid() ^ (unsigned)(now_s() * 1e6));
    usleep((useconds_t)(rand() % jitter_us));
  }
  if (world_rank == last && barrier == HOOP_OK)
    raise(SIGKILL);
  hoop_comm *comms[2] = {row, col};
  const char *names[2] = {"row", "column"};
  char needle[32];
  snprintf(needle, sizeof needle, "rank %d", last);
  int told = 0;
  double give_up = now_s() + 60;
  for (int k = 0; k < 2; k++) {
    int64_t x = world_rank, y;
    hoop_result result = HOOP_OK;
    while (result == HOOP_OK && now_s() < give_up) {
      result = hoop_allreduce(comms[k], &x, &y, 1, HOOP_INT64, HOOP_SUM);
      if (result == HOOP_OK)
        usleep(1000);
    }
    if (result != HOOP_OK && strstr(hoop_last_error(comms[k]), needle)) {
      told++;
      printf("split_worker rank %d: the %s failed naming rank %d: %s\n", world_rank, names[k], last,
             hoop_last_error(comms[k]));
    } else {
      fail("the %s gave %s: %s", names[k], hoop_strerror(result), hoop_last_error(comms[k]));
    }
  }
  hoop_finalize(row);
  hoop_finalize(col);
  hoop_finalize(world);
  return told == 2 ? 0 : 1;
}

/* A mismatch inside one half fails that half, the other half and the job's communicator. A rank
 * of the other half may still be in the split when the story reaches it: the split then fails
 * with it, which is the same report. */
static int mismatch(hoop_comm *world) {
  /* Every pair connected first: a rank waiting for a peer to connect hears of a failure elsewhere
   * only at HOOP_TIMEOUT, naming that peer (a mismatch is not relayed by the rendezvous server),
   * and this case is about the story reaching every rank. */
  int64_t *ones = xmalloc((size_t)world_size * sizeof *ones),
          *back = xmalloc((size_t)world_size * sizeof *back);
  must(world, hoop_alltoall(world, ones, back, 1, HOOP_INT64), "hoop_alltoall (connecting)");
  free(ones);
  free(back);
  hoop_comm *half = NULL;
  hoop_result result = hoop_comm_split(world, world_rank % 2, world_rank, &half);
  float buf[8] = {0};
  if (result == HOOP_OK && world_rank % 2 == 0)
    result = hoop_allreduce(half, buf, buf, hoop_rank(half) == 0 ? 5 : 4, HOOP_FLOAT32, HOOP_SUM);
  double give_up = now_s() + 60;
  while (result == HOOP_OK && now_s() < give_up) {
    result = hoop_allreduce(half, buf, buf, 4, HOOP_FLOAT32, HOOP_SUM);
    if (result == HOOP_OK)
      usleep(1000);
  }
  char story[1024];
  snprintf(story, sizeof story, "%s", hoop_last_error(half ? half : world));
  hoop_result job = hoop_barrier(world);
  int told = result != HOOP_OK && job != HOOP_OK && strstr(story, "does not match") &&
             strstr(hoop_last_error(world), "does not match");
  if (told)
    printf("split_worker rank %d: the mismatch failed its half and the job: %s\n", world_rank,
           story);
  else
    fail("after a mismatch in a half, its half gave %s (%s), the job %s (%s)",
         hoop_strerror(result), story, hoop_strerror(job), hoop_last_error(world));
  hoop_finalize(half);
  hoop_finalize(world);
  return told ? 0 : 1;
}

/* Call on comm until it fails (the death of a rank reaches every communicator of the job). */
static hoop_result until_it_fails(hoop_comm *comm) {
  int64_t x = world_rank, y;
  hoop_result result = HOOP_OK;
  double give_up = now_s() + 60;
  while (result == HOOP_OK && now_s() < give_up) {
    result = hoop_allreduce(comm, &x, &y, 1, HOOP_INT64, HOOP_SUM);
    if (result == HOOP_OK)
      usleep(1000);
  }
  return result;
}

static int shrink_after_kill(hoop_comm *world, int rounds) {
  int width = world_size % 3 == 0 ? 3 : 2, last = world_size - 1;
  hoop_comm *row = split(world, world_rank / width, world_rank, NULL);
  hoop_comm *col = split(world, world_rank % width, world_rank, NULL);
  int row_size = hoop_size(row), col_size = hoop_size(col);
  hoop_result barrier = hoop_barrier(world);
  if (world_rank == last && barrier == HOOP_OK)
    raise(SIGKILL);
  check(until_it_fails(row) != HOOP_OK, "the row never failed");
  hoop_comm *world2, *row2, *col2;
  must(world, hoop_comm_shrink(world, &world2), "hoop_comm_shrink (the job's)");
  must(row, hoop_comm_shrink(row, &row2), "hoop_comm_shrink (row)");
  must(col, hoop_comm_shrink(col, &col2), "hoop_comm_shrink (column)");
  int lost_row = world_rank / width == last / width, lost_col = world_rank % width == last % width;
  check(hoop_size(world2) == world_size - 1, "the job shrank to %d ranks", hoop_size(world2));
  check(hoop_size(row2) == row_size - lost_row, "the row shrank to %d of %d", hoop_size(row2),
        row_size);
  check(hoop_size(col2) == col_size - lost_col, "the column shrank to %d of %d", hoop_size(col2),
        col_size);
  /* The old ones go first: the job's refuses while its row and column live. */
  must(row, hoop_finalize(row), "hoop_finalize (old row)");
  must(col, hoop_finalize(col), "hoop_finalize (old column)");
  must(world, hoop_finalize(world), "hoop_finalize (old job)");
  group rows = {0}, cols = {0}, job = {0};
  group_init(&rows, row2, "shrunk row");
  group_init(&cols, col2, "shrunk column");
  group_init(&job, world2, "shrunk job");
  runner r = {&rows, rounds}, c = {&cols, rounds}, w = {&job, rounds / 2};
  pthread_t rt, ct;
  if (pthread_create(&rt, NULL, run_rounds, &r) != 0 || pthread_create(&ct, NULL, run_rounds, &c))
    must(NULL, HOOP_ERR_SYSTEM, "pthread_create");
  run_rounds(&w);
  pthread_join(rt, NULL);
  pthread_join(ct, NULL);
  must(world2, hoop_barrier(world2), "hoop_barrier (shrunk job)");
  printf("split_worker rank %d of %d: %ld checks, %ld failed (after the shrink)\n", world_rank,
         world_size, (long)atomic_load(&checks), (long)atomic_load(&failures));
  must(row2, hoop_finalize(row2), "hoop_finalize (row)");
  must(col2, hoop_finalize(col2), "hoop_finalize (column)");
  must(world2, hoop_finalize(world2), "hoop_finalize (job)");
  free(rows.world);
  free(cols.world);
  free(job.world);
  return atomic_load(&failures) ? 1 : 0;
}

int main(int argc, char **argv) {
  int kill = 0, jitter_us = 0, mismatched = 0, shrink = 0, rounds = 12;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--kill") == 0)
      kill = 1;
    else if (strcmp(argv[i], "--kill-jitter") == 0 && i + 1 < argc)
      kill = 1, jitter_us = atoi(argv[++i]);
    else if (strcmp(argv[i], "--mismatch") == 0)
      mismatched = 1;
    else if (strcmp(argv[i], "--shrink") == 0)
      shrink = 1;
    else if (strcmp(argv[i], "--rounds") == 0 && i + 1 < argc)
      rounds = atoi(argv[++i]);
    else if (strcmp(argv[i], "--device") == 0)
      device_buffers = 1;
  }
  char why[256];
  if (device_buffers && devmem_init(why, sizeof why) != 0) {
    fprintf(stderr, "split_worker: --device: %s\n", why);
    return 77;
  }
  hoop_comm *world;
  must(NULL, hoop_init_from_env(&world), "hoop_init_from_env");
  world_rank = hoop_rank(world);
  world_size = hoop_size(world);
  if (kill)
    return kill_last(world, jitter_us);
  if (mismatched)
    return mismatch(world);
  if (shrink)
    return shrink_after_kill(world, rounds);
  if (world_size >= 2)
    halves(world);
  if (world_size >= 4)
    grid(world, rounds);
  must(world, hoop_barrier(world), "hoop_barrier");
  printf("split_worker rank %d of %d: %ld checks, %ld failed\n", world_rank, world_size,
         (long)atomic_load(&checks), (long)atomic_load(&failures));
  must(world, hoop_finalize(world), "hoop_finalize");
  return atomic_load(&failures) ? 1 : 0;
}
