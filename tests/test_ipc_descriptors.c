/* test_ipc_descriptors.c - a member that lies in its CUDA IPC descriptors cannot have a peer read
 * or write past what it exported (issue 37). On the stand-in driver (tests/support/fakecuda/),
 * rank 1 of a real 3-rank job on device buffers exports its buffers through a wrapper of
 * hoop__cuda_ipc_export (linked with --wrap, so libhoop is unchanged) that falsifies what it
 * returns: an offset past the allocation (whose sum with the length wraps, so the liar's own check
 * lets it through), or an allocation larger than the one its handle maps, with the buffer past the
 * real end; or (through a wrapper of hoop__ipc_process) it copies rank 0's process number, so that
 * rank 0 would take the liar's addresses for pointers of its own process. The others must refuse
 * the descriptor with a message naming rank 1, every rank must then stage the call through host
 * memory, and every result must match its closed form. An honest run first shows that the same
 * calls go by CUDA IPC. */
#include <check.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "hoop.h"
#include "mem/cuda.h"
#include "support/devmem.h"
#include "support/procs.h"

#define RANKS 3
#define LIAR 1
#define COUNT 1024
#define ALLREDUCES 5
/* The calls in which the others need rank 1's descriptor: the allreduces, the allgather and the
 * broadcast from rank 1 (a broadcast maps only its root's buffer). */
#define CALLS_NEEDING_LIAR (ALLREDUCES + 2)

typedef enum ipc_lie { LIE_NONE, LIE_OFFSET, LIE_SIZE, LIE_PROCESS } ipc_lie;

/* What the rank's exports say; set in each forked rank. */
static ipc_lie telling = LIE_NONE;

int __real_hoop__cuda_ipc_export(const void *ptr, size_t len, hoop__cuda_export *out, char *why,
                                 size_t whylen);
int __wrap_hoop__cuda_ipc_export(const void *ptr, size_t len, hoop__cuda_export *out, char *why,
                                 size_t whylen);

int __wrap_hoop__cuda_ipc_export(const void *ptr, size_t len, hoop__cuda_export *out, char *why,
                                 size_t whylen) {
  int result = __real_hoop__cuda_ipc_export(ptr, len, out, why, whylen);
  if (result != 0)
    return result;
  if (telling == LIE_OFFSET) {
    out->offset = UINT64_MAX - 15; /* offset + len wraps to len - 16 */
  } else if (telling == LIE_SIZE) {
    out->offset = out->size;
    out->size = 2 * out->size + len;
  }
  return result;
}

typedef struct ipc_case {
  int port;
  ipc_lie lie;
  char dir[64];
  uint64_t victim_process; /* rank 0's process number, written before it joins */
} ipc_case;

/* The case this forked rank runs (shared with the others). */
static ipc_case *this_case;

uint64_t __real_hoop__ipc_process(void);
uint64_t __wrap_hoop__ipc_process(void);

uint64_t __wrap_hoop__ipc_process(void) {
  if (telling == LIE_PROCESS && this_case && this_case->victim_process)
    return this_case->victim_process;
  return __real_hoop__ipc_process();
}

static int64_t *device_result(const void *dev, size_t count) {
  int64_t *host = malloc(count * sizeof *host);
  if (host)
    devmem_get(host, dev, count * sizeof *host);
  return host;
}

/* Whether host[k] == first + k * step for every k < count; says the first that is not. */
static int expect_series(int rank, const char *what, const int64_t *host, size_t count,
                         int64_t first, int64_t step) {
  for (size_t k = 0; host && k < count; k++)
    if (host[k] != first + (int64_t)k * step) {
      fprintf(stderr, "rank %d: %s element %zu: expected %lld, got %lld\n", rank, what, k,
              (long long)(first + (int64_t)k * step), (long long)host[k]);
      return -1;
    }
  return host ? 0 : -1;
}

static int call_ok(hoop_comm *comm, int rank, const char *what, hoop_result result) {
  if (result == HOOP_OK)
    return 0;
  fprintf(stderr, "rank %d: %s: %s\n", rank, what, hoop_last_error(comm));
  return -1;
}

/* Allreduces, then an allgather, then broadcasts from rank 0 and rank 1, each on device buffers
 * and checked on the host against its closed form. */
static int collectives(hoop_comm *comm, int rank, int n) {
  int64_t host[RANKS * COUNT];
  int bad = 0;
  void *send = devmem_put(NULL, COUNT * sizeof(int64_t));
  void *recv = devmem_put(NULL, RANKS * COUNT * sizeof(int64_t));
  for (int round = 0; round < ALLREDUCES && !bad; round++) {
    for (size_t k = 0; k < COUNT; k++)
      host[k] = (int64_t)(rank + 1) * (int64_t)(k + 1) + round;
    devmem_upload(send, host, COUNT * sizeof(int64_t));
    bad |= call_ok(comm, rank, "hoop_allreduce",
                   hoop_allreduce(comm, send, recv, COUNT, HOOP_INT64, HOOP_SUM));
    int64_t *got = device_result(recv, COUNT);
    /* sum over r of (r + 1)(k + 1) + round = (k + 1) n(n + 1)/2 + n round */
    bad |= expect_series(rank, "allreduce", got, COUNT, n * (n + 1) / 2 + (int64_t)n * round,
                         n * (n + 1) / 2);
    free(got);
  }
  for (size_t k = 0; k < COUNT; k++)
    host[k] = (int64_t)rank * COUNT + (int64_t)k;
  devmem_upload(send, host, COUNT * sizeof(int64_t));
  bad |= call_ok(comm, rank, "hoop_allgather", hoop_allgather(comm, send, recv, COUNT, HOOP_INT64));
  int64_t *got = device_result(recv, (size_t)n * COUNT);
  bad |= expect_series(rank, "allgather", got, (size_t)n * COUNT, 0, 1);
  free(got);
  for (int root = 0; root <= LIAR; root++) {
    for (size_t k = 0; k < COUNT; k++)
      host[k] = rank == root ? 7 * (int64_t)k + root : -1;
    devmem_upload(send, host, COUNT * sizeof(int64_t));
    bad |=
        call_ok(comm, rank, "hoop_broadcast", hoop_broadcast(comm, send, COUNT, HOOP_INT64, root));
    got = device_result(send, COUNT);
    bad |= expect_series(rank, "broadcast", got, COUNT, root, 7);
    free(got);
  }
  devmem_free(recv);
  devmem_free(send);
  return bad;
}

/* One rank, its stderr (the library's log too) in DIR/rank<N>.log. */
static int ipc_rank(int rank, int n, void *arg) {
  const ipc_case *c = arg;
  char path[128], msg[256];
  snprintf(path, sizeof path, "%s/rank%d.log", c->dir, rank);
  int log = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (log < 0 || dup2(log, 2) < 0)
    return 3;
  close(log);
  setvbuf(stderr, NULL, _IONBF, 0);
  setenv("HOOP_CUDA_IPC_MIN_BYTES", "0", 1);
  setenv("HOOP_DEBUG", "trace", 1);
  setenv("HOOP_DEBUG_SUBSYS", "coll", 1);
  if (devmem_init(msg, sizeof msg) != 0) {
    fprintf(stderr, "rank %d: %s\n", rank, msg);
    return 2;
  }
  telling = rank == LIAR ? c->lie : LIE_NONE;
  this_case = (ipc_case *)c;
  if (rank == 0)
    this_case->victim_process = __real_hoop__ipc_process();
  hoop_comm *comm = procs_join(c->port, rank, n, 30.0, "shm");
  if (!comm)
    return 2;
  int bad = collectives(comm, rank, n);
  if (hoop_finalize(comm) != HOOP_OK)
    bad = -1;
  fprintf(stderr, "rank %d: %s\n", rank, bad ? "FAILED" : "ok");
  return bad ? 1 : 0;
}

/* Run the job with rank 1 telling lie; each rank's log in logs[] (malloc'ed). */
static void run_job(ipc_lie lie, char *logs[RANKS]) {
  ipc_case *c = mmap(NULL, sizeof *c, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  ck_assert_msg(c != MAP_FAILED, "mmap failed");
  c->port = procs_free_port();
  c->lie = lie;
  snprintf(c->dir, sizeof c->dir, "/tmp/hoop-ipc-XXXXXX");
  ck_assert_msg(mkdtemp(c->dir) != NULL, "mkdtemp failed");
  int failed = procs_fork_ranks(RANKS, ipc_rank, c, 120);
  for (int r = 0; r < RANKS; r++) {
    char path[128], ok[32];
    snprintf(path, sizeof path, "%s/rank%d.log", c->dir, r);
    logs[r] = procs_slurp(path);
    snprintf(ok, sizeof ok, "rank %d: ok\n", r);
    if (failed || !logs[r] || procs_count(logs[r], ok) != 1)
      fprintf(stderr, "---- rank %d's log\n%s", r, logs[r] ? logs[r] : "(none)\n");
    ck_assert_msg(logs[r] && procs_count(logs[r], ok) == 1,
                  "rank %d did not end with '%s' (%d ranks failed; logs above)", r, ok, failed);
  }
  if (!getenv("HOOP_TEST_KEEP")) {
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", c->dir);
    ck_assert_int_eq(system(cmd), 0);
  }
  munmap(c, sizeof *c);
}

static void free_logs(char *logs[RANKS]) {
  for (int r = 0; r < RANKS; r++)
    free(logs[r]);
}

/* Rank 1's honest descriptors: the calls go by CUDA IPC, so the lies below meet that path. */
START_TEST(test_honest_goes_by_ipc) {
  char *logs[RANKS];
  run_job(LIE_NONE, logs);
  for (int r = 0; r < RANKS; r++)
    ck_assert_msg(strstr(logs[r], "ipc: hoop_allreduce of 8192 bytes reads the peers' device "
                                  "buffers directly (CUDA IPC)"),
                  "rank %d's allreduces did not go by CUDA IPC (its log above)", r);
  free_logs(logs);
}
END_TEST

/* Whether a line of log says that call read the peers' device buffers by CUDA IPC. */
static int went_by_ipc(const char *log, const char *call) {
  for (const char *line = log; line && *line;
       line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL) {
    const char *end = strchr(line, '\n'), *at = strstr(line, call),
               *ipc = strstr(line, "reads the peers' device buffers directly");
    if (at && ipc && (!end || (at < end && ipc < end)))
      return 1;
  }
  return 0;
}

/* The others refuse rank 1's descriptor in every call that needs it, saying why, and stage. */
static void expect_refused(char *logs[RANKS], const char *why) {
  for (int r = 0; r < RANKS; r++) {
    if (r == LIAR)
      continue;
    int refused = procs_count(logs[r], why);
    if (refused != CALLS_NEEDING_LIAR)
      fprintf(stderr, "---- rank %d's log\n%s", r, logs[r]);
    ck_assert_msg(refused == CALLS_NEEDING_LIAR,
                  "rank %d refused rank 1's descriptor in %d calls: expected %d ('%s')", r, refused,
                  CALLS_NEEDING_LIAR, why);
    /* Only the broadcast from rank 0 may still go by IPC: it needs nothing of rank 1's. */
    ck_assert_msg(!went_by_ipc(logs[r], "hoop_allreduce") &&
                      !went_by_ipc(logs[r], "hoop_allgather"),
                  "rank %d went by CUDA IPC in a call that needs rank 1's buffer", r);
  }
}

START_TEST(test_offset_past_allocation_refused) {
  char *logs[RANKS];
  run_job(LIE_OFFSET, logs);
  expect_refused(logs, "rank 1's descriptor puts 8192 bytes at offset 18446744073709551600 of an "
                       "allocation of ");
  free_logs(logs);
}
END_TEST

START_TEST(test_allocation_larger_than_mapped_refused) {
  char *logs[RANKS];
  run_job(LIE_SIZE, logs);
  expect_refused(logs, "rank 1's buffer: it claims an allocation of ");
  free_logs(logs);
}
END_TEST

/* Rank 1 copies rank 0's process number: rank 0 alone would have taken its descriptors for
 * pointers of its own process (rank 2's process number differs); it refuses them, knowing which
 * ranks live in its process, and every rank stages. */
START_TEST(test_forged_process_refused) {
  char *logs[RANKS];
  run_job(LIE_PROCESS, logs);
  const char *why = "rank 1's descriptor says it comes from this process, where no such rank lives";
  int refused = procs_count(logs[0], why);
  if (refused != CALLS_NEEDING_LIAR)
    fprintf(stderr, "---- rank 0's log\n%s", logs[0]);
  ck_assert_msg(refused == CALLS_NEEDING_LIAR,
                "rank 0 refused rank 1's forged descriptor in %d calls: expected %d", refused,
                CALLS_NEEDING_LIAR);
  for (int r = 0; r < RANKS; r++)
    ck_assert_msg(!went_by_ipc(logs[r], "hoop_allreduce") &&
                      !went_by_ipc(logs[r], "hoop_allgather"),
                  "rank %d went by CUDA IPC in a call that needs rank 1's buffer", r);
  free_logs(logs);
}
END_TEST

static Suite *ipc_descriptors_suite(void) {
  Suite *s = suite_create("ipc_descriptors");
  TCase *tc = tcase_create("fakecuda");
  tcase_set_timeout(tc, 180);
  tcase_add_test(tc, test_honest_goes_by_ipc);
  tcase_add_test(tc, test_offset_past_allocation_refused);
  tcase_add_test(tc, test_allocation_larger_than_mapped_refused);
  tcase_add_test(tc, test_forged_process_refused);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  /* The stand-in driver always: its IPC mappings are what the lies are told against. */
  char fake[4096];
  snprintf(fake, sizeof fake, "%s", procs_build_path("tests/.libs/libfakecuda.so"));
  if (access(fake, R_OK) != 0) {
    printf("SKIP: %s was not built\n", fake);
    return 77;
  }
  setenv("HOOP_CUDA_LIBRARY", fake, 1);
  SRunner *sr = srunner_create(ipc_descriptors_suite());
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
