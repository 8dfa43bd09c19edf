/* test_mismatch.c - the mismatch table: on a real 2-rank job, the two ranks post calls that differ
 * in one thing (dtype, op, root, count) where the call's fingerprint must catch it. Each must fail
 * with HOOP_ERR_MISMATCH on both ranks within 5 s, the message naming what each side called (both
 * values), never a hang or a wrong result. One job per case: a mismatch fails the communicator. */
#include <check.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "hoop.h"
#include "support/procs.h"

#define N 8

typedef struct mismatch {
  const char *what;
  const char *words[2]; /* each side's value, as the message must show it */
  hoop_result (*run)(hoop_comm *comm, int rank);
} mismatch;

static float fs[2 * N * 2], gs[2 * N * 2];
static int32_t is[2 * N * 2];

static hoop_result dtype_differs(hoop_comm *c, int r) {
  return r == 0 ? hoop_allreduce(c, fs, gs, N, HOOP_FLOAT32, HOOP_SUM)
                : hoop_allreduce(c, is, is, N, HOOP_INT32, HOOP_SUM);
}
static hoop_result op_differs(hoop_comm *c, int r) {
  return hoop_allreduce(c, fs, gs, N, HOOP_FLOAT32, r == 0 ? HOOP_SUM : HOOP_MAX);
}
static hoop_result broadcast_root(hoop_comm *c, int r) {
  return hoop_broadcast(c, fs, N, HOOP_FLOAT32, r);
}
static hoop_result reduce_root(hoop_comm *c, int r) {
  return hoop_reduce(c, fs, gs, N, HOOP_FLOAT32, HOOP_SUM, r);
}
static hoop_result reduce_count(hoop_comm *c, int r) {
  return hoop_reduce(c, fs, gs, r == 0 ? N : 2 * N, HOOP_FLOAT32, HOOP_SUM, 0);
}
static hoop_result gather_root(hoop_comm *c, int r) {
  return hoop_gather(c, fs, gs, N, HOOP_FLOAT32, 1 - r);
}
static hoop_result scatter_root(hoop_comm *c, int r) {
  return hoop_scatter(c, fs, gs, N, HOOP_FLOAT32, r);
}
static hoop_result reduce_scatter_count(hoop_comm *c, int r) {
  return hoop_reduce_scatter(c, fs, gs, r == 0 ? N : 2 * N, HOOP_FLOAT32, HOOP_SUM);
}
static hoop_result alltoall_count(hoop_comm *c, int r) {
  return hoop_alltoall(c, fs, gs, r == 0 ? N : 2 * N, HOOP_FLOAT32);
}
static hoop_result allgather_count(hoop_comm *c, int r) {
  return hoop_allgather(c, fs, gs, r == 0 ? N : 2 * N, HOOP_FLOAT32);
}
static hoop_result collective_differs(hoop_comm *c, int r) {
  return r == 0 ? hoop_allreduce(c, fs, gs, N, HOOP_FLOAT32, HOOP_SUM)
                : hoop_allgather(c, fs, gs, N, HOOP_FLOAT32);
}

static const mismatch table[] = {
    {"allreduce float32 / int32", {"8, float32,", "8, int32,"}, dtype_differs},
    {"allreduce sum / max", {"float32, sum)", "float32, max)"}, op_differs},
    {"broadcast root 0 / 1", {"root 0", "root 1"}, broadcast_root},
    {"reduce root 0 / 1", {"root 0", "root 1"}, reduce_root},
    {"reduce count 8 / 16", {"count 8,", "count 16,"}, reduce_count},
    {"gather root 1 / 0", {"root 1", "root 0"}, gather_root},
    {"scatter root 0 / 1", {"root 0", "root 1"}, scatter_root},
    {"reduce_scatter count 8 / 16", {"count 8,", "count 16,"}, reduce_scatter_count},
    {"alltoall count 8 / 16", {"count 8,", "count 16,"}, alltoall_count},
    {"allgather count 8 / 16", {"count 8,", "count 16,"}, allgather_count},
    {"allreduce / allgather", {"allreduce", "allgather"}, collective_differs},
};
#define CASES (sizeof table / sizeof table[0])

typedef struct job {
  int port;
  const mismatch *m;
} job;

static int mismatch_rank(int rank, int n, void *arg) {
  const job *j = arg;
  hoop_comm *comm = procs_join(j->port, rank, n, 30, NULL);
  if (!comm)
    return 1;
  double start = procs_now();
  hoop_result result = j->m->run(comm, rank);
  double took = procs_now() - start;
  const char *message = hoop_last_error(comm);
  int bad = result != HOOP_ERR_MISMATCH || took > 5.0 || !strstr(message, j->m->words[0]) ||
            !strstr(message, j->m->words[1]);
  fprintf(stderr, "rank %d, %s: %s after %.2f s: %s%s\n", rank, j->m->what, hoop_strerror(result),
          took, message, bad ? "  <-- expected a mismatch naming both, within 5 s" : "");
  hoop_finalize(comm);
  return bad;
}

START_TEST(test_mismatch_table) {
  const mismatch *m = &table[_i];
  job j = {procs_free_port(), m};
  ck_assert_msg(procs_fork_ranks(2, mismatch_rank, &j, 60) == 0,
                "%s: not a mismatch on both "
                "ranks within 5 s naming both "
                "(above)",
                m->what);
}
END_TEST

int main(void) {
  Suite *s = suite_create("mismatch");
  TCase *tc = tcase_create("table");
  tcase_set_timeout(tc, 90);
  tcase_add_loop_test(tc, test_mismatch_table, 0, (int)CASES);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
