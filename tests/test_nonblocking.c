/* test_nonblocking.c - non-blocking collectives on 1 to 4 real ranks under hooprun, over shared
 * memory and over TCP: many mixed requests outstanding at once, completed in scrambled order by
 * hoop_test and hoop_wait and checked against reference.c, the fused allreduce on many buffers of
 * odd counts cut into small pieces, hoop_finalize refusing while a request is outstanding
 * (support/nb_worker.c); a rank that aborts or is killed while the others have requests
 * outstanding, which must fail every one of them naming it; and HOOP_TRACE's files, which must
 * parse as JSON and hold every call. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "support/procs.h"

/* Run nb_worker on np ranks with env_add and extra arguments; return hooprun's exit status and
 * the output in *out (malloc'ed). */
static int run_nb(int np, char *const env_add[], const char *arg1, const char *arg2, char **out) {
  int code = procs_hooprun(np, env_add, "tests/nb_worker", arg1, arg2, out);
  ck_assert_msg(*out != NULL, "no output from hooprun");
  return code;
}

/* Pieces of 4 KiB, so that fused sets span many pieces and buffers span pieces. */
static char *const over_shm[] = {"HOOP_FUSION_BYTES=4096", NULL};
static char *const over_tcp[] = {"HOOP_FUSION_BYTES=4096", "HOOP_TRANSPORT=tcp", NULL};
/* Without the progress thread, posted calls run inside test and wait only. */
static char *const no_thread[] = {"HOOP_FUSION_BYTES=4096", "HOOP_ASYNC_PROGRESS=0", NULL};

static void run_ok(int np, char *const env[], int quick) {
  char *out;
  int code = run_nb(np, env, quick ? "--quick" : NULL, NULL, &out);
  if (code != 0 || procs_count(out, " 0 failed") != np)
    fprintf(stderr, "%s\n", out);
  ck_assert_msg(code == 0, "hooprun -np %d nb_worker: exit %d", np, code);
  ck_assert_int_eq(procs_count(out, " 0 failed"), np);
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

START_TEST(test_mixed_without_thread) {
  run_ok(3, no_thread, 1);
}
END_TEST

/* A request advances while its rank computes (here: sleeps) and makes no call: the others'
 * blocking barrier ends long before rank 0 waits for its posted one. */
START_TEST(test_progress_without_calls) {
  char *out;
  int code = run_nb(3, over_shm, "--progress", NULL, &out);
  if (code != 0)
    fprintf(stderr, "%s\n", out);
  ck_assert_msg(code == 0, "hooprun -np 3 nb_worker --progress: exit %d", code);
  ck_assert_int_eq(procs_count(out, "barrier done in"), 2);
  free(out);
}
END_TEST

/* Every survivor's requests fail naming rank 1 (nb_worker checks it and says so). */
static void run_failing(int np, char *const env[], const char *how) {
  char *out;
  int code = run_nb(np, env, "--fail", how, &out);
  int told = procs_count(out, "requests failed naming rank 1");
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

/* ---- HOOP_TRACE --------------------------------------------------------------------------------
 */

/* A strict JSON reader that only checks: value at *at, moving past it; 0 if malformed. */
static int json_value(const char **at);

static void json_space(const char **at) {
  while (**at == ' ' || **at == '\n' || **at == '\t' || **at == '\r')
    (*at)++;
}

static int json_string(const char **at) {
  if (**at != '"')
    return 0;
  for ((*at)++; **at != '"'; (*at)++) {
    if (!**at || (unsigned char)**at < 0x20)
      return 0;
    if (**at == '\\' && !*++*at)
      return 0;
  }
  (*at)++;
  return 1;
}

static int json_items(const char **at, char close, int keyed) {
  (*at)++;
  json_space(at);
  if (**at == close) {
    (*at)++;
    return 1;
  }
  for (;;) {
    json_space(at);
    if (keyed) {
      if (!json_string(at))
        return 0;
      json_space(at);
      if (*(*at)++ != ':')
        return 0;
    }
    if (!json_value(at))
      return 0;
    json_space(at);
    if (**at == close) {
      (*at)++;
      return 1;
    }
    if (*(*at)++ != ',')
      return 0;
  }
}

static int json_value(const char **at) {
  json_space(at);
  switch (**at) {
  case '{': return json_items(at, '}', 1);
  case '[': return json_items(at, ']', 0);
  case '"': return json_string(at);
  default: {
    char *end;
    strtod(*at, &end);
    if (end == *at)
      return 0;
    *at = end;
    return 1;
  }
  }
}

/* Two ranks with HOOP_TRACE: each rank's file is one JSON array that holds a span ("b" and "e")
 * for every collective the rank called and a run (a "collective" event) with its algorithm for
 * each, beside the waits' events. */
START_TEST(test_trace) {
  char dir[] = "/tmp/hoop-trace-XXXXXX";
  ck_assert_msg(mkdtemp(dir) != NULL, "mkdtemp failed");
  char var[4200];
  snprintf(var, sizeof var, "HOOP_TRACE=%s/timeline", dir);
  char *env[] = {var, "HOOP_FUSION_BYTES=65536", NULL};
  char *out;
  int code = run_nb(2, env, "--quick", NULL, &out);
  ck_assert_msg(code == 0, "hooprun -np 2 nb_worker with HOOP_TRACE: exit %d\n%s", code, out);
  for (int r = 0; r < 2; r++) {
    char needle[64], path[4300];
    snprintf(needle, sizeof needle, "nb_worker rank %d called ", r);
    const char *said = strstr(out, needle);
    ck_assert_msg(said != NULL, "rank %d did not say how many collectives it called", r);
    int calls = atoi(said + strlen(needle));
    snprintf(path, sizeof path, "%s/timeline.%d", dir, r);
    char *text = procs_slurp(path);
    ck_assert_msg(text != NULL, "no trace file %s", path);
    const char *at = text;
    ck_assert_msg(json_value(&at), "%s is not JSON (at byte %ld)", path, (long)(at - text));
    json_space(&at);
    ck_assert_msg(*at == '\0', "%s has bytes after its JSON value", path);
    ck_assert_msg(text[0] == '[', "%s is not a JSON array", path);
    int posted = procs_count(text, "\"ph\":\"b\""), done = procs_count(text, "\"ph\":\"e\"");
    /* Runs are the collectives' complete events; the waits' are complete events too. */
    int runs = procs_count(text, "\"cat\":\"collective\""),
        algos = procs_count(text, "\"algorithm\":\"");
    ck_assert_msg(posted == calls && done == calls,
                  "rank %d called %d collectives; its trace has %d posts and %d completions", r,
                  calls, posted, done);
    ck_assert_msg(runs >= calls - 10 && algos == runs,
                  "rank %d: %d runs (%d with an algorithm) for %d calls", r, runs, algos, calls);
    free(text);
  }
  free(out);
  snprintf(var, sizeof var, "rm -rf '%s'", dir);
  ck_assert_int_eq(system(var), 0);
}
END_TEST

static Suite *nonblocking_suite(void) {
  Suite *s = suite_create("nonblocking");
  TCase *tc = tcase_create("mixed");
  tcase_set_timeout(tc, 600);
  tcase_add_loop_test(tc, test_mixed_shm, 0, (int)(sizeof shm_ranks / sizeof shm_ranks[0]));
  tcase_add_loop_test(tc, test_mixed_tcp, 0, (int)(sizeof tcp_ranks / sizeof tcp_ranks[0]));
  tcase_add_test(tc, test_trace);
  tcase_add_test(tc, test_mixed_without_thread);
  tcase_add_test(tc, test_progress_without_calls);
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
