/* test_p2p.c - point-to-point messages on 1 to 5 real ranks under hooprun (support/p2p_worker.c):
 * over shared memory and TCP, with and without the progress thread, every dtype at odd counts,
 * cycles posted together, many messages in flight completed out of order, messages in flight
 * across a collective, each against reference.c; argument errors; and a rank killed while its
 * peers wait to receive from it, which each must report naming it. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "support/procs.h"

/* Run p2p_worker on np ranks with env_add and an extra argument; hooprun's exit status, the output
 * in *out (malloc'ed). */
static int run_p2p(int np, char *const env_add[], const char *arg, char **out) {
  int code = procs_hooprun(np, env_add, "tests/p2p_worker", arg, NULL, out);
  ck_assert_msg(*out != NULL, "no output from hooprun");
  return code;
}

static void run_ok(int np, char *const env[], const char *arg) {
  char *out;
  int code = run_p2p(np, env, arg, &out);
  if (code != 0 || procs_count(out, " 0 failed") != np)
    fprintf(stderr, "%s\n", out);
  ck_assert_msg(code == 0, "hooprun -np %d p2p_worker: exit %d", np, code);
  ck_assert_int_eq(procs_count(out, " 0 failed"), np);
  free(out);
}

static char *const over_shm[] = {NULL};
static char *const over_tcp[] = {"HOOP_TRANSPORT=tcp", NULL};
/* Without the progress thread, transfers move only inside test, wait and other calls. */
static char *const no_thread[] = {"HOOP_ASYNC_PROGRESS=0", NULL};

static const int shm_ranks[] = {1, 2, 3, 4, 5};
START_TEST(test_shm) {
  run_ok(shm_ranks[_i], over_shm, shm_ranks[_i] > 2 ? "--quick" : NULL);
}
END_TEST

static const int tcp_ranks[] = {2, 3};
START_TEST(test_tcp) {
  run_ok(tcp_ranks[_i], over_tcp, "--quick");
}
END_TEST

START_TEST(test_without_thread) {
  run_ok(4, no_thread, "--quick");
}
END_TEST

/* The survivors' receives fail naming the killed rank, within hooprun's --timeout. */
static void run_kill(int np, char *const env[]) {
  char *out;
  int code = run_p2p(np, env, "--kill", &out);
  char needle[64];
  snprintf(needle, sizeof needle, "the receive failed naming rank %d", np - 1);
  int told = procs_count(out, needle);
  if (told != np - 1)
    fprintf(stderr, "hooprun exit %d:\n%s\n", code, out);
  ck_assert_msg(told == np - 1, "%d of %d survivors saw their receive fail naming rank %d", told,
                np - 1, np - 1);
  free(out);
}

START_TEST(test_kill_shm) {
  run_kill(3, over_shm);
}
END_TEST

START_TEST(test_kill_tcp) {
  run_kill(3, over_tcp);
}
END_TEST

/* A receive from a stopped rank, only ever polled with hoop_test (and moved by the progress
 * thread, or not: HOOP_ASYNC_PROGRESS=0), fails within HOOP_TIMEOUT naming it. */
static void run_stopped(char *const env[]) {
  char *out;
  run_p2p(2, env, "--stopped", &out);
  int told = procs_count(out, "polling a receive from a stopped rank failed");
  if (told != 1)
    fprintf(stderr, "%s\n", out);
  ck_assert_msg(told == 1, "polling a receive from a stopped rank did not fail naming it");
  free(out);
}

START_TEST(test_stopped_shm) {
  run_stopped(over_shm);
}
END_TEST

START_TEST(test_stopped_tcp_polled) {
  static char *const env[] = {"HOOP_TRANSPORT=tcp", "HOOP_ASYNC_PROGRESS=0", NULL};
  run_stopped(env);
}
END_TEST

static Suite *p2p_suite(void) {
  Suite *s = suite_create("p2p");
  TCase *tc = tcase_create("messages");
  tcase_set_timeout(tc, 600);
  tcase_add_loop_test(tc, test_shm, 0, (int)(sizeof shm_ranks / sizeof shm_ranks[0]));
  tcase_add_loop_test(tc, test_tcp, 0, (int)(sizeof tcp_ranks / sizeof tcp_ranks[0]));
  tcase_add_test(tc, test_without_thread);
  suite_add_tcase(s, tc);
  tc = tcase_create("failures");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_kill_shm);
  tcase_add_test(tc, test_kill_tcp);
  tcase_add_test(tc, test_stopped_shm);
  tcase_add_test(tc, test_stopped_tcp_polled);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  SRunner *runner = srunner_create(p2p_suite());
  srunner_run_all(runner, CK_NORMAL);
  int failed = srunner_ntests_failed(runner);
  srunner_free(runner);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
