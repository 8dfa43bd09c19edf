/* procs.h - starting real processes from the Check suites: a program with extra environment and a
 * wall-clock limit, or N forked ranks running a function, each reaped with its status. */
#ifndef HOOP_TEST_PROCS_H
#define HOOP_TEST_PROCS_H

#include <stddef.h>
#include <sys/types.h>

/* Path of a program in the build tree: $HOOP_BUILDDIR/rel (or ./rel). Static buffer. */
const char *procs_build_path(const char *rel);

/* Start argv[0] with env_add ("NAME=value" strings, NULL-ended; may be NULL) added to the
 * environment. Output goes to the test's stdout/stderr, or to out_path when not NULL. */
pid_t procs_start(char *const argv[], char *const env_add[], const char *out_path);

/* Wait for pid for at most timeout_s; on timeout kill it (SIGKILL) and return -1. Otherwise
 * return the exit status (0..255), or 128 + signal. */
int procs_wait(pid_t pid, double timeout_s);

/* Run and wait. */
int procs_run(char *const argv[], char *const env_add[], const char *out_path, double timeout_s);

/* Fork n children; child i runs fn(i, n, arg) and exits with its return value. Waits for all
 * within timeout_s (killing the rest past it) and returns how many did not exit 0. */
int procs_fork_ranks(int n, int (*fn)(int index, int n, void *arg), void *arg, double timeout_s);

/* Fill config for rank index of an n-rank job whose rendezvous rank 0 hosts on 127.0.0.1:port,
 * from hoop_config_init's defaults. config->rendezvous points into rendezvous (len bytes), which
 * must outlive it. Callers set what else their test needs. */
struct hoop_config;
void procs_local_config(struct hoop_config *config, char *rendezvous, size_t len, int port,
                        int index, int n);

/* hoop_init for rank index of such a job, with timeout_s and a transport (NULL: the default);
 * NULL after saying why on stderr. */
struct hoop_comm;
struct hoop_comm *procs_join(int port, int index, int n, double timeout_s, const char *transport);

/* A TCP port that no other test takes while this process lives, free on 127.0.0.1 now: below
 * the kernel's ephemeral range (which bind to port 0 and outgoing connections draw from, so no
 * connection made meanwhile can land on it), and reserved by a lock on a file named for it in
 * /tmp/hoop-test-ports, which tests/support/ports.sh and k8s_contract.py take too. The lock is
 * held until this process and the children it forked exit. -1 if none could be had. */
int procs_free_port(void);

/* Read a whole file into a malloc'ed string (NULL on error). */
char *procs_slurp(const char *path);

/* Run a worker of the build tree (rel, e.g. "tests/nb_worker") on np ranks under hooprun
 * --timeout 10 with env_add and up to two arguments (NULL: none); hooprun's exit status, or -1
 * if it could not run; its output in *out (malloc'ed, NULL if none). */
int procs_hooprun(int np, char *const env_add[], const char *rel, const char *arg1,
                  const char *arg2, char **out);

/* How many times needle occurs in text. */
int procs_count(const char *text, const char *needle);

/* The monotonic clock, in seconds. */
double procs_now(void);

#endif
