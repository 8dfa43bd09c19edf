/* test_nonblocking.c - non-blocking collectives on 1 to 4 real ranks under hooprun, over shared
 * memory and over TCP: many mixed requests outstanding at once, completed in scrambled order by
 * hoop_test and hoop_wait and checked against reference.c, the fused allreduce on many buffers of
 * odd counts cut into small pieces, hoop_finalize refusing while a request is outstanding
 * (nb_worker.c); and a rank that aborts or is killed while the others have requests outstanding,
 * which must fail every one of them naming it. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "procs.h"

/* Run nb_worker on np ranks with env_add and extra arguments; return hooprun's exit status and
 * the output in *out (malloc'ed). */
static int run_nb(int np, char *const env_add[], const char *arg1, const char *arg2, char **out) {
  char np_text[16], hooprun[4096], worker[4096];
  snprintf(np_text, sizeof np_text, "%d", np);
  snprintf(hooprun, sizeof hooprun, "%s", procs_build_path("tools/hooprun"));
  snprintf(worker, sizeof worker, "%s", procs_build_path("tests/nb_worker"));
  char path[] = "/tmp/hoop-nb-XXXXXX";
  int fd = mkstemp(path);
  ck_assert_msg(fd >= 0, "mkstemp failed");
  close(fd);
  char *argv[] = {hooprun, "-np", np_text, "--timeout", "10",        worker,
                  (char *)arg1, (char *)arg2, NULL};
  int code = procs_run(argv, env_add, path, 300);
  *out = procs_slurp(path);
  unlink(path);
  ck_assert_msg(*out != NULL, "no output from hooprun");
  return code;
}

static int count_lines(const char *text, const char *needle) {
  int n = 0;
  for (const char *at = text; (at = strstr(at, needle)) != NULL; at += strlen(needle))
    n++;
  return n;
}

/* Pieces of 4 KiB, so that fused sets span many pieces and buffers span pieces. */
static char *const over_shm[] = {"HOOP_FUSION_BYTES=4096", NULL};
static char *const over_tcp[] = {"HOOP_FUSION_BYTES=4096", "HOOP_TRANSPORT=tcp", NULL};

static void run_ok(int np, char *const env[], int quick) {
  char *out;
  int code = run_nb(np, env, quick ? "--quick" : NULL, NULL, &out);
  if (code != 0 || count_lines(out, " 0 failed") != np)
    fprintf(stderr, "%s\n", out);
  ck_assert_msg(code == 0, "hooprun -np %d nb_worker: exit %d", np, code);
  ck_assert_int_eq(count_lines(out, " 0 failed"), np);
  free(out);
}

static const int shm_ranks[] = {1, 2, 3, 4};
START_TEST(test_mixed_shm) {
  run_ok(shm_ranks[_i], over_shm, shm_ranks[_i] > 2);
}
END_TEST

static const int tcp_ranks[] = {2, 3, 4};
START_TEST(test_mixed_tcp) {
  run_ok(tcp_ranks[_i], over_tcp, 1);
}
END_TEST

/* Every survivor's requests fail naming rank 1 (nb_worker checks it and says so). */
static void run_failing(int np, char *const env[], const char *how) {
  char *out;
  int code = run_nb(np, env, "--fail", how, &out);
  int told = count_lines(out, "requests failed naming rank 1");
  if (told != np - 1)
    fprintf(stderr, "hooprun exit %d:\n%s\n", code, out);
  ck_assert_msg(told == np - 1, "%d of %d survivors saw every request fail naming rank 1 (%s)",
                told, np - 1, how);
  ck_assert_msg(!strstr(out, " FAIL"), "a check failed (%s)", how);
  free(out);
}

START_TEST(test_abort_shm) {
  run_failing(3, over_shm, "abort");
}
END_TEST
START_TEST(test_kill_shm) {
  run_failing(3, over_shm, "kill");
}
END_TEST
START_TEST(test_abort_tcp) {
  run_failing(3, over_tcp, "abort");
}
END_TEST
START_TEST(test_kill_tcp) {
  run_failing(4, over_tcp, "kill");
}
END_TEST

static Suite *nonblocking_suite(void) {
  Suite *s = suite_create("nonblocking");
  TCase *tc = tcase_create("mixed");
  tcase_set_timeout(tc, 600);
  tcase_add_loop_test(tc, test_mixed_shm, 0, (int)(sizeof shm_ranks / sizeof shm_ranks[0]));
  tcase_add_loop_test(tc, test_mixed_tcp, 0, (int)(sizeof tcp_ranks / sizeof tcp_ranks[0]));
  suite_add_tcase(s, tc);
  tc = tcase_create("failures");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_abort_shm);
  tcase_add_test(tc, test_kill_shm);
  tcase_add_test(tc, test_abort_tcp);
  tcase_add_test(tc, test_kill_tcp);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  SRunner *runner = srunner_create(nonblocking_suite());
  srunner_run_all(runner, CK_NORMAL);
  int failed = srunner_ntests_failed(runner);
  srunner_free(runner);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
