/* test_split.c - sub-communicators (hoop_comm_split) on 2 to 7 real ranks under hooprun
 * (support/split_worker.c): halves, a rank left out, a split of a split, bad arguments, and a grid
 * of rows and columns running at once from two threads beside the job's own calls, over shared
 * memory and TCP, with and without the progress thread, with no connection opened by a split; and
 * the last rank killed after a split, which every survivor's row and column must report; a mismatch
 * inside a sub-communicator, which fails every communicator of the job on every rank; and the
 * survivors of a killed rank shrinking the job's communicator, then their rows and columns. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "support/procs.h"

static void run_ok(int np, char *const env[], const char *arg) {
  char *out;
  int code = procs_hooprun(np, env, "tests/split_worker", arg, NULL, &out);
  ck_assert_msg(out != NULL, "no output from hooprun");
  if (code != 0 || procs_count(out, " 0 failed") != np)
    fprintf(stderr, "%s\n", out);
  ck_assert_msg(code == 0, "hooprun -np %d split_worker: exit %d", np, code);
  ck_assert_int_eq(procs_count(out, " 0 failed"), np);
  free(out);
}

static char *const over_shm[] = {NULL};
static char *const over_tcp[] = {"HOOP_TRANSPORT=tcp", NULL};
static char *const no_thread[] = {"HOOP_ASYNC_PROGRESS=0", NULL};

static const int shm_ranks[] = {2, 4, 6, 7};
START_TEST(test_shm) {
  run_ok(shm_ranks[_i], over_shm, NULL);
}
END_TEST

static const int tcp_ranks[] = {4, 6};
START_TEST(test_tcp) {
  run_ok(tcp_ranks[_i], over_tcp, NULL);
}
END_TEST

START_TEST(test_without_thread) {
  run_ok(6, no_thread, NULL);
}
END_TEST

static void run_kill(int np, char *const env[], const char *jitter_us) {
  char *out;
  int code = jitter_us
                 ? procs_hooprun(np, env, "tests/split_worker", "--kill-jitter", jitter_us, &out)
                 : procs_hooprun(np, env, "tests/split_worker", "--kill", NULL, &out);
  ck_assert_msg(out != NULL, "no output from hooprun");
  char row[64], col[64];
  snprintf(row, sizeof row, "the row failed naming rank %d", np - 1);
  snprintf(col, sizeof col, "the column failed naming rank %d", np - 1);
  int rows = procs_count(out, row), cols = procs_count(out, col);
  if (rows != np - 1 || cols != np - 1)
    fprintf(stderr, "hooprun exit %d:\n%s\n", code, out);
  ck_assert_msg(rows == np - 1 && cols == np - 1,
                "of %d survivors, %d saw their row and %d their column fail naming rank %d", np - 1,
                rows, cols, np - 1);
  free(out);
}

/* A mismatch inside the even ranks' half: every rank's half and the job fail with it. */
static void run_mismatch(int np, char *const env[]) {
  char *out;
  int code = procs_hooprun(np, env, "tests/split_worker", "--mismatch", NULL, &out);
  ck_assert_msg(out != NULL, "no output from hooprun");
  int told = procs_count(out, "the mismatch failed its half and the job");
  if (told != np)
    fprintf(stderr, "hooprun exit %d:\n%s\n", code, out);
  ck_assert_msg(told == np, "%d of %d ranks saw the mismatch fail their half and the job", told,
                np);
  free(out);
}

START_TEST(test_mismatch_shm) {
  run_mismatch(4, over_shm);
}
END_TEST

START_TEST(test_mismatch_tcp) {
  run_mismatch(4, over_tcp);
}
END_TEST

/* The last rank killed after a split; the survivors shrink the job's communicator, then their row
 * and column, and run every call on the new ones at once (hooprun --min-np keeps the job). */
static void run_shrink(int np, char *const env[]) {
  char np_text[16], min_np[16], hooprun[4096], worker[4096];
  snprintf(np_text, sizeof np_text, "%d", np);
  snprintf(min_np, sizeof min_np, "%d", np - 1);
  snprintf(hooprun, sizeof hooprun, "%s", procs_build_path("tools/hooprun"));
  snprintf(worker, sizeof worker, "%s", procs_build_path("tests/split_worker"));
  char path[] = "/tmp/hoop-split-XXXXXX";
  int fd = mkstemp(path);
  ck_assert_int_ge(fd, 0);
  close(fd);
  char *argv[] = {hooprun, "-np",  np_text,    "--min-np", min_np, "--timeout",
                  "10",    worker, "--shrink", "--rounds", "4",    NULL};
  int code = procs_run(argv, env, path, 300);
  char *out = procs_slurp(path);
  unlink(path);
  ck_assert_msg(out != NULL, "no output from hooprun");
  int good = procs_count(out, " 0 failed (after the shrink)");
  if (good != np - 1)
    fprintf(stderr, "hooprun exit %d:\n%s\n", code, out);
  ck_assert_msg(good == np - 1, "%d of %d survivors went on after shrinking their row and column",
                good, np - 1);
  free(out);
}

START_TEST(test_shrink_shm) {
  run_shrink(6, over_shm);
}
END_TEST

START_TEST(test_shrink_tcp) {
  run_shrink(4, over_tcp);
}
END_TEST

START_TEST(test_kill_shm) {
  run_kill(6, over_shm, NULL);
}
END_TEST

START_TEST(test_kill_tcp) {
  run_kill(4, over_tcp, NULL);
}
END_TEST

/* The death at any step of the survivors' first calls on their row and column: until 2026-11-30 a
 * survivor whose first call had a step left that makes a pair (the board's) went on to it after
 * the failure and waited for the timeout on a transport that listened no more: one run in 20-30
 * here, seen once in CI's package build. 60 runs over shared memory (about 10 s), 20 over TCP. */
START_TEST(test_kill_jitter_shm) {
  run_kill(6, over_shm, "300");
}
END_TEST

START_TEST(test_kill_jitter_tcp) {
  run_kill(4, over_tcp, "300");
}
END_TEST

static Suite *split_suite(void) {
  Suite *s = suite_create("split");
  TCase *tc = tcase_create("views");
  tcase_set_timeout(tc, 600);
  tcase_add_loop_test(tc, test_shm, 0, (int)(sizeof shm_ranks / sizeof shm_ranks[0]));
  tcase_add_loop_test(tc, test_tcp, 0, (int)(sizeof tcp_ranks / sizeof tcp_ranks[0]));
  tcase_add_test(tc, test_without_thread);
  suite_add_tcase(s, tc);
  tc = tcase_create("failures");
  tcase_set_timeout(tc, 180);
  tcase_add_test(tc, test_mismatch_shm);
  tcase_add_test(tc, test_mismatch_tcp);
  tcase_add_test(tc, test_kill_shm);
  tcase_add_test(tc, test_shrink_shm);
  tcase_add_test(tc, test_shrink_tcp);
  tcase_add_test(tc, test_kill_tcp);
  tcase_add_loop_test(tc, test_kill_jitter_shm, 0, 60);
  tcase_add_loop_test(tc, test_kill_jitter_tcp, 0, 20);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  SRunner *runner = srunner_create(split_suite());
  srunner_run_all(runner, CK_NORMAL);
  int failed = srunner_ntests_failed(runner);
  srunner_free(runner);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
