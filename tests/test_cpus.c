/* test_cpus.c - which CPUs hooprun --bind-to and --map-by give a host's ranks (util/cpus.c), on
 * made-up machines written as sysfs trees (HOOP_SYSFS): two sockets of two cores of two hardware
 * threads, each core its own NUMA node; CPUs a cgroup leaves; no topology at all. Then a rank
 * binding itself from HOOP_BIND_TO (lib/comm/bind.c), in a child, on this machine's own CPUs. */
#include <check.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "comm/launchers.h"
#include "hoop.h"
#include "util/cpus.h"

static char root[64];

static void write_file(const char *path, const char *text) {
  FILE *out = fopen(path, "w");
  ck_assert_msg(out != NULL, "%s: %s", path, strerror(errno));
  fputs(text, out);
  fclose(out);
}

/* CPU cpu of the made-up machine: its socket, core id, NUMA node, and its core's hardware threads
 * (NULL: the file is not there, as on older kernels). */
static void add_cpu(int cpu, int socket, int core_id, int node, const char *siblings) {
  char path[256], text[16];
  snprintf(path, sizeof path, "%s/devices/system/cpu/cpu%d/topology", root, cpu);
  char mkdirs[300];
  snprintf(mkdirs, sizeof mkdirs, "mkdir -p %s", path);
  ck_assert_int_eq(system(mkdirs), 0);
  snprintf(path, sizeof path, "%s/devices/system/cpu/cpu%d/topology/physical_package_id", root,
           cpu);
  snprintf(text, sizeof text, "%d\n", socket);
  write_file(path, text);
  snprintf(path, sizeof path, "%s/devices/system/cpu/cpu%d/topology/core_id", root, cpu);
  snprintf(text, sizeof text, "%d\n", core_id);
  write_file(path, text);
  snprintf(path, sizeof path, "%s/devices/system/cpu/cpu%d/node%d", root, cpu, node);
  ck_assert_int_eq(mkdir(path, 0755), 0);
  if (siblings) {
    snprintf(path, sizeof path, "%s/devices/system/cpu/cpu%d/topology/thread_siblings_list", root,
             cpu);
    write_file(path, siblings);
  }
}

static void make_root(void) {
  snprintf(root, sizeof root, "/tmp/hoop-cpus-XXXXXX");
  ck_assert_ptr_nonnull(mkdtemp(root));
  setenv("HOOP_SYSFS", root, 1);
}

/* 8 CPUs as Linux numbers them: CPU c and c+4 are one core's two threads; cores 0-1 (CPUs 0, 1,
 * 4, 5) are socket 0's, cores 2-3 socket 1's; core k is NUMA node k. With the threads' lists, or
 * (siblings 0) with package and core ids alone. */
static void two_sockets_as(int siblings) {
  make_root();
  for (int cpu = 0; cpu < 8; cpu++) {
    int core = cpu % 4;
    char list[16];
    snprintf(list, sizeof list, "%d,%d\n", core, core + 4);
    add_cpu(cpu, core / 2, core % 2, core, siblings ? list : NULL);
  }
}

static void two_sockets(void) {
  two_sockets_as(1);
}

static void remove_tree(void) {
  char command[128];
  snprintf(command, sizeof command, "rm -rf %s", root);
  ck_assert_int_eq(system(command), 0);
  unsetenv("HOOP_SYSFS");
}

static cpu_set_t cpus_of(const char *list) {
  cpu_set_t set;
  CPU_ZERO(&set);
  for (const char *c = list; *c;) {
    char *end;
    long first = strtol(c, &end, 10), last = first;
    if (*end == '-')
      last = strtol(end + 1, &end, 10);
    for (long cpu = first; cpu <= last; cpu++)
      CPU_SET((int)cpu, &set);
    c = *end == ',' ? end + 1 : end;
  }
  return set;
}

/* Each of count ranks' CPUs under bind and map, from allowed: want[i] as a CPU list. */
static void expect_binding(const char *bind, const char *map, const char *allowed, int count,
                           const char *const *want) {
  hoop__bind_level b;
  hoop__map_level m;
  ck_assert_int_eq(hoop__bind_parse(bind, &b), 0);
  ck_assert_int_eq(hoop__map_parse(map, &m), 0);
  cpu_set_t from = cpus_of(allowed);
  for (int i = 0; i < count; i++) {
    cpu_set_t got;
    char err[256] = "", list[128];
    ck_assert_msg(hoop__bind_cpus(b, m, i, count, &from, &got, err, sizeof err) == 0,
                  "--bind-to %s --map-by %s, rank %d of %d: %s", bind, map, i, count, err);
    hoop__cpus_format(&got, list, sizeof list);
    ck_assert_msg(strcmp(list, want[i]) == 0,
                  "--bind-to %s --map-by %s from %s, rank %d of %d: CPUs %s, not %s", bind, map,
                  allowed, i, count, list, want[i]);
  }
}

START_TEST(test_cores_sockets_numa) {
  two_sockets();
  /* In order: a core each, with both its threads. */
  expect_binding("core", "core", "0-7", 4, (const char *[]){"0,4", "1,5", "2,6", "3,7"});
  expect_binding("core", "slot", "0-7", 2, (const char *[]){"0,4", "1,5"});
  /* Spread: one socket's first core, the other's, then their second ones. */
  expect_binding("core", "socket", "0-7", 4, (const char *[]){"0,4", "2,6", "1,5", "3,7"});
  expect_binding("core", "numa", "0-7", 4, (const char *[]){"0,4", "1,5", "2,6", "3,7"});
  /* A socket each: the socket of the core the mapping gives. */
  expect_binding("socket", "core", "0-7", 4,
                 (const char *[]){"0-1,4-5", "0-1,4-5", "2-3,6-7", "2-3,6-7"});
  expect_binding("package", "package", "0-7", 4,
                 (const char *[]){"0-1,4-5", "2-3,6-7", "0-1,4-5", "2-3,6-7"});
  /* Sockets and NUMA nodes can take more ranks than there are cores: the mapping goes round. */
  expect_binding(
      "socket", "socket", "0-7", 6,
      (const char *[]){"0-1,4-5", "2-3,6-7", "0-1,4-5", "2-3,6-7", "0-1,4-5", "2-3,6-7"});
  expect_binding("numa", "core", "0-7", 5, (const char *[]){"0,4", "1,5", "2,6", "3,7", "0,4"});
  /* None: what was given. */
  expect_binding("none", "socket", "1-2,6", 2, (const char *[]){"1-2,6", "1-2,6"});
  /* A cgroup that leaves socket 1 and one thread of core 0: two cores, the first with one CPU. */
  expect_binding("core", "core", "2-4,6-7", 3, (const char *[]){"2,6", "3,7", "4"});
  expect_binding("socket", "core", "2-4,6-7", 3, (const char *[]){"2-3,6-7", "2-3,6-7", "4"});
  remove_tree();
}
END_TEST

/* Without the threads' lists, cores are told apart by package and core id. */
START_TEST(test_ids_alone) {
  two_sockets_as(0);
  expect_binding("core", "socket", "0-7", 4, (const char *[]){"0,4", "2,6", "1,5", "3,7"});
  remove_tree();
}
END_TEST

/* A package of two dies, each numbering its cores from 0: core ids repeat within the package,
 * the threads' lists do not. Four cores of one thread each. */
START_TEST(test_dies_repeat_core_ids) {
  make_root();
  for (int cpu = 0; cpu < 4; cpu++) {
    char list[8];
    snprintf(list, sizeof list, "%d\n", cpu);
    add_cpu(cpu, 0, cpu % 2, cpu / 2, list);
  }
  expect_binding("core", "core", "0-3", 4, (const char *[]){"0", "1", "2", "3"});
  expect_binding("numa", "numa", "0-3", 2, (const char *[]){"0-1", "2-3"});
  remove_tree();
}
END_TEST

START_TEST(test_more_ranks_than_cores) {
  two_sockets();
  hoop__bind_level core;
  ck_assert_int_eq(hoop__bind_parse("core", &core), 0);
  cpu_set_t from = cpus_of("0-7"), got;
  char err[256] = "";
  ck_assert_int_eq(hoop__bind_cpus(core, HOOP__MAP_CORE, 0, 5, &from, &got, err, sizeof err), -1);
  ck_assert_str_eq(err, "5 ranks on this host bound to a core each, but the 8 CPUs allowed (0-7) "
                        "make 4 cores");
  from = cpus_of("0,4");
  ck_assert_int_eq(hoop__bind_cpus(core, HOOP__MAP_CORE, 1, 2, &from, &got, err, sizeof err), -1);
  ck_assert_str_eq(err, "2 ranks on this host bound to a core each, but the 2 CPUs allowed (0,4) "
                        "make 1 core");
  remove_tree();
}
END_TEST

/* Without a topology every CPU is a core of socket 0 and NUMA node 0. */
START_TEST(test_no_topology) {
  setenv("HOOP_SYSFS", "/nonexistent/hoop", 1);
  expect_binding("core", "socket", "0-3", 4, (const char *[]){"0", "1", "2", "3"});
  expect_binding("numa", "core", "0-3", 2, (const char *[]){"0-3", "0-3"});
  unsetenv("HOOP_SYSFS");
}
END_TEST

START_TEST(test_names_and_lists) {
  hoop__bind_level b;
  hoop__map_level m;
  ck_assert_int_eq(hoop__bind_parse("cores", &b), -1);
  ck_assert_int_eq(hoop__bind_parse("", &b), -1);
  ck_assert_int_eq(hoop__map_parse("ppr:2:socket", &m), -1);
  ck_assert_int_eq(hoop__bind_parse("package", &b), 0);
  ck_assert_str_eq(hoop__bind_name(b), "socket");
  ck_assert_int_eq(hoop__map_parse("slot", &m), 0);
  ck_assert_str_eq(hoop__map_name(m), "core");
  char list[64];
  cpu_set_t set = cpus_of("0-3,8,10-11,1000");
  hoop__cpus_format(&set, list, sizeof list);
  ck_assert_str_eq(list, "0-3,8,10-11,1000");
  CPU_ZERO(&set);
  hoop__cpus_format(&set, list, sizeof list);
  ck_assert_str_eq(list, "");
  set = cpus_of("0,2,4,6,8,10,12,14,16,18,20");
  hoop__cpus_format(&set, list, 16);
  ck_assert_str_eq(list, "0,2,4,6,8,...");
}
END_TEST

/* A rank on another host binds itself in hoop_init_from_env: a child (so that the suite keeps its
 * own CPUs) told it is local rank 1 of 2 runs on this machine's second core afterwards, a thread
 * it started before as well; told it is one of more ranks than there are cores, it refuses with
 * HOOP_ERR_INVALID_ARG and says why. The job is of one rank (HOOP_SIZE=1): init needs nobody
 * else, and the local rank and size are HOOP_BIND_TO's alone. */
static void *idle_thread(void *arg) {
  int fd = *(int *)arg;
  char byte;
  return read(fd, &byte, 1) == 1 ? NULL : arg;
}

static int child_binding(const char *local_rank, const char *local_size, const char *want_error) {
  unsetenv("HOOP_SYSFS");
  setenv("HOOP_BIND_TO", "core", 1);
  setenv("HOOP_LOCAL_RANK", local_rank, 1);
  setenv("HOOP_LOCAL_SIZE", local_size, 1);
  setenv("HOOP_SIZE", "1", 1);
  setenv("HOOP_RANK", "0", 1);
  setenv("HOOP_RENDEZVOUS", "127.0.0.1:1", 1); /* a job of one rank asks nobody */
  setenv("HOOP_TIMEOUT", "0.2", 1);
  cpu_set_t before, after, want;
  sched_getaffinity(0, sizeof before, &before);
  char err[256];
  if (hoop__bind_cpus(HOOP__BIND_CORE, HOOP__MAP_CORE, atoi(local_rank), atoi(local_size), &before,
                      &want, err, sizeof err) != 0 &&
      !want_error)
    return 10;
  /* A framework's thread, started before hoop_init_from_env, waiting on a pipe. */
  int pipe_fds[2];
  pthread_t thread;
  if (pipe(pipe_fds) != 0 || pthread_create(&thread, NULL, idle_thread, &pipe_fds[0]) != 0)
    return 13;
  hoop_comm *comm = NULL;
  hoop_result result = hoop_init_from_env(&comm);
  cpu_set_t thread_cpus;
  int got_thread = pthread_getaffinity_np(thread, sizeof thread_cpus, &thread_cpus);
  if (write(pipe_fds[1], "x", 1) != 1 || pthread_join(thread, NULL) != 0 || got_thread != 0)
    return 14;
  const char *message = comm ? hoop_last_error(comm) : "";
  if (want_error) {
    if (result != HOOP_ERR_INVALID_ARG || !strstr(message, want_error)) {
      fprintf(stderr, "got %d: %s\n", result, message);
      return 11;
    }
    return 0;
  }
  sched_getaffinity(0, sizeof after, &after);
  if (!CPU_EQUAL(&after, &want)) {
    char got_list[128], want_list[128];
    hoop__cpus_format(&after, got_list, sizeof got_list);
    hoop__cpus_format(&want, want_list, sizeof want_list);
    fprintf(stderr, "bound to %s, not %s (init: %d, %s)\n", got_list, want_list, result, message);
    return 12;
  }
  if (!CPU_EQUAL(&thread_cpus, &want))
    return 15;
  /* A second communicator of the process (finalize and init again, as Horovod's shutdown and
   * init do) keeps the binding: it does not divide the one core among the host's ranks again. */
  hoop_finalize(comm);
  comm = NULL;
  hoop_result again = hoop_init_from_env(&comm);
  sched_getaffinity(0, sizeof after, &after);
  if (again == HOOP_ERR_INVALID_ARG || again != result || !CPU_EQUAL(&after, &want)) {
    fprintf(stderr, "second init: %d (first %d): %s\n", again, result,
            comm ? hoop_last_error(comm) : "");
    return 16;
  }
  return 0;
}

static void expect_child(const char *local_rank, const char *local_size, const char *want_error) {
  pid_t pid = fork();
  ck_assert_int_ge(pid, 0);
  if (pid == 0)
    _exit(child_binding(local_rank, local_size, want_error));
  int status;
  ck_assert_int_eq(waitpid(pid, &status, 0), pid);
  ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0,
                "HOOP_BIND_TO=core as local rank %s of %s: child status %d", local_rank, local_size,
                status);
}

START_TEST(test_rank_binds_itself) {
  cpu_set_t mine;
  sched_getaffinity(0, sizeof mine, &mine);
  ck_assert_msg(CPU_COUNT(&mine) >= 2, "this test needs 2 CPUs, the suite has %d",
                CPU_COUNT(&mine));
  expect_child("1", "2", NULL);
  expect_child("0", "1", NULL);
  expect_child("0", "1000", "HOOP_BIND_TO=core: 1000 ranks on this host bound to a core each");
  expect_child("2", "2", "HOOP_BIND_TO needs HOOP_LOCAL_RANK, a number in 0..1 (it is '2')");
}
END_TEST

static Suite *cpus_suite(void) {
  Suite *s = suite_create("cpus");
  TCase *tc = tcase_create("topology");
  tcase_add_test(tc, test_cores_sockets_numa);
  tcase_add_test(tc, test_ids_alone);
  tcase_add_test(tc, test_dies_repeat_core_ids);
  tcase_add_test(tc, test_more_ranks_than_cores);
  tcase_add_test(tc, test_no_topology);
  tcase_add_test(tc, test_names_and_lists);
  suite_add_tcase(s, tc);
  tc = tcase_create("binding");
  tcase_set_timeout(tc, 30);
  tcase_add_test(tc, test_rank_binds_itself);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  SRunner *sr = srunner_create(cpus_suite());
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
