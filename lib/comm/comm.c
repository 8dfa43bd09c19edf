/* comm.c - the communicator: configuration (from a struct or the environment), joining the job
 * through the rendezvous, connecting the transport, error state, abort and finalize. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "coll/coll.h"
#include "coll/paths.h"
#include "comm/comm.h"
#include "comm/launchers.h"
#include "comm/state.h"
#include "comm/watch.h"
#include "config.h"
#include "core/env.h"
#include "core/flight.h"
#include "core/request.h"
#include "core/trace.h"
#include "mem/cuda/kind.h"
#include "mem/kind.h"
#include "mem/stage.h"
#include "rdzv/client.h"
#include "rdzv/server.h"
#include "transport/stray.h"
#include "transport/transport.h"
#include "util/netaddr.h"

#define HOOP__DEFAULT_TIMEOUT_S 300.0

/* ---- accessors ------------------------------------------------------------------------------- */

int hoop_rank(const hoop_comm *comm) {
  return comm ? comm->rank : -1;
}
int hoop_size(const hoop_comm *comm) {
  return comm ? comm->size : -1;
}
int hoop_local_rank(const hoop_comm *comm) {
  return comm ? comm->local_rank : -1;
}
int hoop_local_size(const hoop_comm *comm) {
  return comm ? comm->local_size : -1;
}
/* The ranks that share this rank's local rank: how many come before it (index) and in all. A job
 * of one rank has no table. */
static int cross_count(const hoop_comm *comm, int *index) {
  int count = 0;
  *index = 0;
  for (int i = 0; i < comm->size && comm->table.peers; i++)
    if ((int)comm->table.peers[i].local_rank == comm->local_rank) {
      *index += i < comm->rank;
      count++;
    }
  return count ? count : 1;
}
int hoop_cross_rank(const hoop_comm *comm) {
  int index;
  if (!comm)
    return -1;
  cross_count(comm, &index);
  return index;
}
int hoop_cross_size(const hoop_comm *comm) {
  int index;
  return comm ? cross_count(comm, &index) : -1;
}
unsigned int hoop_comm_generation(const hoop_comm *comm) {
  return comm ? comm->generation : 0;
}
const char *hoop_last_error(const hoop_comm *comm) {
  return comm ? hoop__error_for_caller(comm)
              : "no communicator (hoop_init failed before allocating one)";
}

/* ---- configuration --------------------------------------------------------------------------- */

const char *hoop_version(void) {
  return PACKAGE_VERSION;
}

/* The size of the first hoop_config that carried its size: a smaller struct_size is not a
 * hoop_config_init's. Fields added later go after hostname, and this stays as it is. */
#define CONFIG_FIRST_SIZE (offsetof(hoop_config, hostname) + sizeof(const char *))
/* A struct_size past this is not a size at all (memory that hoop_config_init never saw). */
#define CONFIG_MAX_SIZE 65536

static void config_defaults(hoop_config *config) {
  memset(config, 0, sizeof *config);
  config->struct_size = sizeof *config;
  config->version = HOOP_VERSION_NUMBER;
  config->job = "default";
  config->size = 0;
  config->rank = -1;
  config->timeout_s = HOOP__DEFAULT_TIMEOUT_S;
  config->transport = "auto";
  config->tcp_streams = 2;
}

void hoop_config_init_sized(hoop_config *config, size_t struct_size, unsigned int version) {
  if (!config || struct_size < CONFIG_FIRST_SIZE || struct_size > CONFIG_MAX_SIZE)
    return; /* hoop_init refuses it: struct_size stays what it was */
  hoop_config defaults;
  config_defaults(&defaults);
  /* A program built against a newer hoop.h: its fields unknown here stay zero, unset. */
  memset(config, 0, struct_size);
  memcpy(config, &defaults, struct_size < sizeof defaults ? struct_size : sizeof defaults);
  config->struct_size = struct_size;
  config->version = version;
}

/* The caller's config as this library's hoop_config: fields of an older program's smaller struct
 * keep their defaults; a newer program's fields that this library does not know must be unset. */
static hoop_result config_as_built(hoop_comm *comm, const hoop_config *given, hoop_config *config) {
  size_t size = given->struct_size;
  if (size < CONFIG_FIRST_SIZE || size > CONFIG_MAX_SIZE)
    return hoop__set_error(comm, HOOP_ERR_INVALID_ARG,
                           "hoop_init: the config was not set up with hoop_config_init (its "
                           "struct_size is %zu)",
                           size);
  config_defaults(config);
  memcpy(config, given, size < sizeof *config ? size : sizeof *config);
  for (size_t i = sizeof *config; i < size; i++)
    if (((const unsigned char *)given)[i] != 0)
      return hoop__set_error(comm, HOOP_ERR_UNSUPPORTED,
                             "hoop_init: the program set hoop_config fields of hoop %u.%u.%u, "
                             "which this library (hoop %s) does not know",
                             given->version / 10000, given->version / 100 % 100,
                             given->version % 100, PACKAGE_VERSION);
  config->struct_size = sizeof *config;
  return HOOP_OK;
}

static hoop_result check_config(hoop_comm *comm, const hoop_config *config) {
  if (config->size < 1 || config->size > HOOP__WIRE_MAX_RANKS)
    return hoop__set_error(comm, HOOP_ERR_INVALID_ARG, "hoop_init: size %d is not in 1..%d",
                           config->size, HOOP__WIRE_MAX_RANKS);
  if (config->rank < -1 || config->rank >= config->size)
    return hoop__set_error(comm, HOOP_ERR_INVALID_ARG,
                           "hoop_init: rank %d is not -1 (any) or in 0..%d", config->rank,
                           config->size - 1);
  if (config->join_running && config->serve_rendezvous)
    return hoop__set_error(comm, HOOP_ERR_INVALID_ARG,
                           "hoop_init: a newcomer (join_running, HOOP_JOIN=1) cannot host the "
                           "rendezvous of the job it joins");
  if ((config->size > 1 || config->join_running) && (!config->rendezvous || !config->rendezvous[0]))
    return hoop__set_error(comm, HOOP_ERR_INVALID_ARG,
                           "hoop_init: no rendezvous address (set HOOP_RENDEZVOUS=host:port, or "
                           "start the job with hooprun)");
  const char *job = config->job ? config->job : "default";
  if (!job[0] || strlen(job) > HOOP__WIRE_MAX_JOB)
    return hoop__set_error(comm, HOOP_ERR_INVALID_ARG, "hoop_init: job id must have 1 to %d bytes",
                           HOOP__WIRE_MAX_JOB);
  if (!(config->timeout_s > 0))
    return hoop__set_error(comm, HOOP_ERR_INVALID_ARG, "hoop_init: timeout must be positive");
  if (config->tcp_streams < 1 || config->tcp_streams > HOOP__MAX_STREAMS)
    return hoop__set_error(comm, HOOP_ERR_INVALID_ARG, "hoop_init: tcp_streams %d is not in 1..%d",
                           config->tcp_streams, HOOP__MAX_STREAMS);
  hoop_result result = hoop__transport_check(
      comm, config->transport && config->transport[0] ? config->transport : "auto");
  if (result != HOOP_OK)
    return result;
  if (config->token && config->token[0] && config->token_file && config->token_file[0])
    return hoop__set_error(comm, HOOP_ERR_INVALID_ARG,
                           "hoop_init: both a token and a token file were given (HOOP_TOKEN and "
                           "HOOP_TOKEN_FILE): set one");
  if (config->token && strlen(config->token) > HOOP__MAX_TOKEN)
    return hoop__set_error(comm, HOOP_ERR_INVALID_ARG,
                           "hoop_init: the token is longer than %d "
                           "bytes",
                           HOOP__MAX_TOKEN);
  if (config->rendezvous && strlen(config->rendezvous) >= sizeof comm->rendezvous)
    return hoop__set_error(comm, HOOP_ERR_INVALID_ARG, "hoop_init: rendezvous address too long");
  if (config->ifname && strlen(config->ifname) >= sizeof comm->ifname)
    return hoop__set_error(comm, HOOP_ERR_INVALID_ARG, "hoop_init: interface list too long");
  if (config->hostname && (!config->hostname[0] || strlen(config->hostname) > HOOP__WIRE_MAX_HOST))
    return hoop__set_error(comm, HOOP_ERR_INVALID_ARG,
                           "hoop_init: host name must have 1 to %d bytes", HOOP__WIRE_MAX_HOST);
  return HOOP_OK;
}

/* ---- joining the job ------------------------------------------------------------------------- */

hoop_result hoop__comm_resolve_server(hoop_comm *comm, struct sockaddr_storage *addr,
                                      socklen_t *addrlen, char *host, size_t hostlen, int *port) {
  char err[256];
  if (hoop__split_hostport(comm->rendezvous, host, hostlen, port) != 0 || *port == 0)
    return hoop__set_error(comm, HOOP_ERR_INVALID_ARG,
                           "hoop_init: rendezvous address '%s' is not host:port or [v6]:port",
                           comm->rendezvous);
  /* A name may not resolve yet: a Kubernetes pod's DNS record appears only once the pod runs, and
   * the other pods may start first. It is waited for as a server not yet listening is. */
  double start = hoop__now();
  int told = 0;
  while (hoop__resolve(host[0] ? host : "127.0.0.1", *port, addr, addrlen, err, sizeof err) != 0) {
    double waited = hoop__now() - start;
    if (waited >= comm->timeout_s)
      return hoop__set_error(comm, HOOP_ERR_TIMEOUT,
                             "hoop_init: rendezvous: %s (tried for %.1f s, HOOP_TIMEOUT)", err,
                             waited);
    if (!told++)
      HOOP__INFO(HOOP_SUBSYS_RDZV, "rendezvous: %s; trying again until HOOP_TIMEOUT (%.1f s)", err,
                 comm->timeout_s);
    struct timespec pause = {0, 200 * 1000 * 1000};
    double left = comm->timeout_s - waited;
    if (left < 0.2)
      pause.tv_nsec = (long)(left * 1e9);
    nanosleep(&pause, NULL);
  }
  return HOOP_OK;
}

/* Descriptors a rank hosting the rendezvous keeps beside the server's connections (its data
 * sockets, the program's own files), with room to spare. */
#define HOSTING_OWN_FILES 64

/* Rank 0 hosting the job: a server on its own thread that stops after this job, admitting this
 * job alone. It listens where the rendezvous address names (MASTER_ADDR's interface, a Slurm
 * node's, loopback for one host) when that is an address of this host; else on every address of
 * its family, since the name other hosts use may resolve to something else here. */
static hoop_result host_rendezvous(hoop_comm *comm, const struct sockaddr *server, int port) {
  char listen[sizeof comm->rendezvous], ifname[64];
  if (hoop__is_loopback(server))
    snprintf(listen, sizeof listen, "%s", comm->rendezvous);
  else if (hoop__interface_of(server, ifname, sizeof ifname))
    hoop__format_sockaddr(server, listen, sizeof listen);
  else
    snprintf(listen, sizeof listen, server->sa_family == AF_INET6 ? "[::]:%d" : ":%d", port);
  /* A connection per rank while the job runs, beside this rank's own descriptors: below the
   * connections alone the job cannot start; below the room to spare it may still fit. */
  long hard, want = (long)comm->size + HOSTING_OWN_FILES;
  long files = hoop__raise_open_files(want, &hard);
  if (files <= comm->size)
    return hoop__set_error(comm, HOOP_ERR_SYSTEM,
                           "hoop_init: hosting the rendezvous for %d ranks needs about %ld open "
                           "files, but the limit is %ld and its hard limit %ld: raise the hard "
                           "limit (ulimit -Hn) or meet at a hoopd",
                           comm->size, want, files, hard);
  if (files < want)
    HOOP__WARN(HOOP_SUBSYS_RDZV,
               "hosting the rendezvous for %d ranks: the open-file limit is %ld (its hard limit "
               "%ld), under the %ld wanted; ranks may be refused (raise it: ulimit -Hn)",
               comm->size, files, hard, want);
  hoop__rdzv_options options = {0};
  options.listen = listen;
  if (want > HOOP__RDZV_MAX_CONNECTIONS)
    options.max_connections = (int)want;
  options.once = 1;
  /* Every rank may come from one address (one host, or behind one NAT). */
  options.max_idle_per_address = comm->size > 64 ? comm->size : 0;
  options.only_job = comm->job;
  options.only_size = (unsigned)comm->size;
  options.only_timeout_ms =
      (unsigned)(comm->timeout_s * 1000 > 4e9 ? 4e9 : comm->timeout_s * 1000 + 0.5);
  options.token = comm->token[0] ? comm->token : NULL;
  char err[256];
  if (hoop__rdzv_thread_start(&options, &comm->life->server, err, sizeof err) != 0)
    return hoop__set_error(comm, HOOP_ERR_SYSTEM, "hoop_init: hosting the rendezvous on %s: %s",
                           comm->rendezvous, err);
  HOOP__INFO(HOOP_SUBSYS_RDZV, "hosting the rendezvous for job '%s' on %s", comm->job, listen);
  return HOOP_OK;
}

/* With a token, the data key is a proof keyed by it instead of the table's nonce, so that someone
 * who reads the (unencrypted) rank table on its way still cannot connect to a rank. */
void hoop__comm_derive_nonce(hoop_comm *comm) {
  if (!comm->token[0]) {
    memcpy(comm->data_nonce, comm->table.nonce, HOOP__WIRE_NONCE);
    return;
  }
  uint8_t proof[HOOP__AUTH_PROOF];
  hoop__auth_proof(comm->token, strlen(comm->token), HOOP__AUTH_DATA, comm->table.nonce,
                   HOOP__WIRE_NONCE, NULL, 0, proof);
  memcpy(comm->data_nonce, proof, HOOP__WIRE_NONCE);
}

/* The token from the config or its file, into comm->token (check_config has refused both, and a
 * token too long, with the config's own words). */
static hoop_result load_token(hoop_comm *comm, const hoop_config *config) {
  char err[HOOP__WIRE_MAX_HOST + 256];
  if (hoop__auth_load_token(config->token, config->token_file, comm->token, sizeof comm->token, err,
                            sizeof err) != 0)
    return hoop__set_error(comm, HOOP_ERR_AUTH, "hoop_init: %s", err);
  return HOOP_OK;
}

/* A job without a token: whoever reaches its rendezvous and knows (or guesses) the job id can
 * join, read the ranks' data and change it; on loopback, any user of this host, who can also take
 * the port first. Said once per job, by rank 0 (once per process). */
static void warn_no_token(const hoop_comm *comm, const struct sockaddr *server) {
  static atomic_int warned;
  if (comm->token[0] || comm->size < 2 || comm->rank != 0 || atomic_exchange(&warned, 1))
    return;
  if (hoop__is_loopback(server))
    HOOP__WARN(HOOP_SUBSYS_RDZV,
               "job '%s' has no token: any user of this host can take the rendezvous port (%s) "
               "first, or join the job and read or change its data; give every rank "
               "HOOP_TOKEN_FILE, a file of mode 600 holding the same secret, or start it with "
               "hooprun, which makes one (hoopd(8), SECURITY)",
               comm->job, comm->rendezvous);
  else
    HOOP__WARN(HOOP_SUBSYS_RDZV,
               "job '%s' has no token: anyone who can reach the rendezvous at %s can join it and "
               "read or change its data; give every rank HOOP_TOKEN_FILE, a file of mode 600 "
               "holding the same secret (hoopd(8), SECURITY)",
               comm->job, comm->rendezvous);
}

static hoop_result join_job(hoop_comm *comm, const hoop_config *config) {
  struct sockaddr_storage server;
  socklen_t server_len;
  char host[HOOP__WIRE_MAX_HOST + 1];
  int port;
  hoop_result result =
      hoop__comm_resolve_server(comm, &server, &server_len, host, sizeof host, &port);
  if (result != HOOP_OK)
    return result;
  if (config->serve_rendezvous &&
      (result = host_rendezvous(comm, (struct sockaddr *)&server, port)) != HOOP_OK)
    return result;

  hoop__hello hello;
  memset(&hello, 0, sizeof hello);
  if (hoop__auth_keypair(comm->key_public, comm->key_secret) != 0)
    return hoop__set_error(comm, HOOP_ERR_SYSTEM, "hoop_init: libsodium cannot make a key pair");
  memcpy(hello.key, comm->key_public, sizeof hello.key);
  if (hoop__encrypt_asked(comm->encrypt))
    hello.flags |= HOOP__HELLO_SEALED;
  snprintf(hello.job, sizeof hello.job, "%s", comm->job);
  hello.size = config->join_running ? 1 : (uint32_t)config->size;
  hello.rank = config->join_running ? HOOP__HELLO_NEWCOMER : config->rank;
  hello.timeout_ms = (uint32_t)(comm->timeout_s * 1000 > 4e9 ? 4e9 : comm->timeout_s * 1000);
  if (config->hostname)
    snprintf(hello.host, sizeof hello.host, "%s", config->hostname);
  else if (gethostname(hello.host, sizeof hello.host - 1) != 0)
    snprintf(hello.host, sizeof hello.host, "unknown");
  result = hoop__transport_listen(comm, comm->transport_mode, (struct sockaddr *)&server,
                                  hello.addr, sizeof hello.addr);
  if (result != HOOP_OK)
    return result;
  result = hoop__rendezvous_join(comm, (struct sockaddr *)&server, server_len, &hello,
                                 comm->timeout_s, &comm->table);
  if (result != HOOP_OK)
    return result;
  hoop__comm_derive_nonce(comm);
  comm->generation = comm->table.generation;
  if (config->join_running) {
    /* A newcomer learns the job's size from its table. */
    comm->size = (int)comm->table.size;
    if (hoop__coll_state_size(comm) != HOOP_OK)
      return hoop__set_error(comm, HOOP_ERR_SYSTEM, "hoop_init: out of memory");
  } else if ((int)comm->table.size != config->size ||
             (config->rank >= 0 && (int)comm->table.rank != config->rank))
    return hoop__set_error(comm, HOOP_ERR_PROTOCOL,
                           "rendezvous: the table says rank %u of %u, expected %d of %d",
                           comm->table.rank, comm->table.size, config->rank, config->size);
  comm->rank = (int)comm->table.rank;
  HOOP__INFO(HOOP_SUBSYS_RDZV, "joined job '%s' as rank %d of %d", comm->job, comm->rank,
             comm->size);
  warn_no_token(comm, (const struct sockaddr *)&server);
  if ((result = hoop__transport_agree(comm)) != HOOP_OK)
    return result;
  comm->local_rank = (int)comm->table.peers[comm->rank].local_rank;
  comm->local_size = (int)comm->table.peers[comm->rank].local_size;
  return HOOP_OK;
}

hoop_result hoop__comm_connect_ring(hoop_comm *comm) {
  int next = (comm->rank + 1) % comm->size;
  int prev = (comm->rank + comm->size - 1) % comm->size;
  /* The lower rank of a pair connects and the higher accepts, so connecting to the higher
   * neighbour first never waits on a peer that is itself waiting to accept. */
  int first = next > prev ? next : prev, second = next > prev ? prev : next;
  hoop_result result = hoop__transport_connect(comm, first);
  if (result == HOOP_OK && second != first)
    result = hoop__transport_connect(comm, second);
  return result;
}

void hoop__comm_log_config(const hoop_comm *comm) {
  if (comm->rank != 0 || !hoop__log_enabled(HOOP_LOG_INFO, HOOP_SUBSYS_ENV))
    return;
  char transports[64];
  HOOP__INFO(HOOP_SUBSYS_ENV,
             "effective configuration: job=%s size=%d rendezvous=%s transport=%s timeout=%.1fs "
             "tcp_streams=%d ifname=%s",
             comm->job, comm->size, comm->rendezvous[0] ? comm->rendezvous : "(none)",
             hoop__transport_names(comm, transports, sizeof transports), comm->timeout_s,
             comm->tcp_streams, comm->ifname[0] ? comm->ifname : "(route to rendezvous)");
}

/* Each layer's state (its own folder's state.h), freed: every free takes one never made. */
static void free_states(hoop_comm *comm) {
  hoop__coll_state_free(comm);
  hoop__mem_state_free(comm);
  hoop__rendezvous_state_free(comm);
  hoop__transport_state_free(comm);
  free(comm->life);
  comm->life = NULL;
}

/* A new communicator with no job yet: enough for hoop_last_error and hoop_finalize. */
hoop_comm *hoop__comm_new(void) {
  /* A stray message's bytes reach device buffers through the memory kinds (a floor above the
   * transports', which cannot call it by name). */
  hoop__strays_set_copy(hoop__mem_copy);
  hoop_comm *comm = calloc(1, sizeof *comm);
  if (!comm)
    return NULL;
  /* Each layer's state (its own folder's state.h). */
  comm->coll = hoop__coll_state_new();
  comm->mem_state = hoop__mem_state_new();
  comm->transport = hoop__transport_state_new();
  comm->rdzv = hoop__rendezvous_state_new();
  comm->life = calloc(1, sizeof *comm->life);
  if (!comm->coll || !comm->mem_state || !comm->transport || !comm->rdzv || !comm->life) {
    free_states(comm);
    free(comm);
    return NULL;
  }
  comm->rank = 0;
  comm->size = 1;
  comm->local_size = 1;
  comm->fail_origin = -1;
  comm->rdzv_fd = -1;
  comm->waiting_for = -1;
  comm->mem = &hoop__mem_host;
  hoop__lock_init(&comm->call_lock);
  comm->net = comm;
  comm->life->next_channel = 1;
  pthread_mutexattr_t recursive;
  pthread_mutexattr_init(&recursive);
  pthread_mutexattr_settype(&recursive, PTHREAD_MUTEX_RECURSIVE);
  pthread_mutex_init(&comm->net_lock, &recursive);
  pthread_mutexattr_destroy(&recursive);
  pthread_mutex_init(&comm->queue_lock, NULL);
  pthread_cond_init(&comm->queue_cond, NULL);
  pthread_cond_init(&comm->done_cond, NULL);
  comm->async_progress = -1;
  atomic_init(&comm->abort_requested, 0);
  return comm;
}

/* HOOP_CHECK_CALLS, HOOP_STALL_WARN, HOOP_REPRODUCIBLE (which hoop_config's reproducible can
 * only turn on) and HOOP_COMPRESS (which hoop_config's compress overrides). */
hoop_result hoop__comm_read_checks(hoop_comm *comm) {
  long check;
  if (hoop__parse_int(hoop__env_get("HOOP_CHECK_CALLS"), 0, 1, &check) != 0)
    return hoop__set_error(comm, HOOP_ERR_INVALID_ARG,
                           "hoop_init: HOOP_CHECK_CALLS '%s' is not 0 or 1",
                           hoop__env_get("HOOP_CHECK_CALLS"));
  comm->check_calls = (int)check;
  long reproducible;
  if (hoop__parse_int(hoop__env_get("HOOP_REPRODUCIBLE"), 0, 1, &reproducible) != 0)
    return hoop__set_error(comm, HOOP_ERR_INVALID_ARG,
                           "hoop_init: HOOP_REPRODUCIBLE '%s' is not 0 or 1",
                           hoop__env_get("HOOP_REPRODUCIBLE"));
  comm->reproducible = (int)reproducible;
  const char *compress = hoop__env_get("HOOP_COMPRESS");
  if (compress && hoop_compress_from_name(compress, &comm->compress) != 0)
    return hoop__set_error(comm, HOOP_ERR_INVALID_ARG,
                           "hoop_init: HOOP_COMPRESS '%s' is not none, bf16, fp8 or int8 (with "
                           "+stochastic, +feedback)",
                           compress);
  if (hoop__parse_double(hoop__env_get("HOOP_STALL_WARN"), 0.001, 1e9, &comm->stall_warn_s) != 0)
    return hoop__set_error(comm, HOOP_ERR_INVALID_ARG,
                           "hoop_init: HOOP_STALL_WARN '%s' is not a positive number of seconds",
                           hoop__env_get("HOOP_STALL_WARN"));
  return HOOP_OK;
}

/* Every failed init leaves the communicator failed, so that a caller who only logs the error
 * cannot go on to run collectives on a half-made (or one-rank) communicator. */
static hoop_result init_failed(hoop_comm *comm, hoop_result result) {
  comm->failed = result;
  memcpy(comm->fail_reason, comm->last_error, sizeof comm->fail_reason);
  return result;
}

hoop_result hoop_init(hoop_comm **out, const hoop_config *given) {
  if (!out)
    return HOOP_ERR_INVALID_ARG;
  *out = NULL;
  hoop_comm *comm = hoop__comm_new();
  if (!comm)
    return HOOP_ERR_SYSTEM;
  *out = comm;
  if (!given)
    return init_failed(comm,
                       hoop__set_error(comm, HOOP_ERR_INVALID_ARG, "hoop_init: config is NULL"));
  hoop_config built;
  const hoop_config *config = &built;
  hoop_result result = config_as_built(comm, given, &built);
  if (result == HOOP_OK)
    result = check_config(comm, config);
  if (result == HOOP_OK)
    result = hoop__comm_read_checks(comm);
  if (result == HOOP_OK)
    result = load_token(comm, config);
  if (result != HOOP_OK)
    return init_failed(comm, result);
  snprintf(comm->job, sizeof comm->job, "%s", config->job ? config->job : "default");
  snprintf(comm->rendezvous, sizeof comm->rendezvous, "%s",
           config->rendezvous ? config->rendezvous : "");
  snprintf(comm->ifname, sizeof comm->ifname, "%s", config->ifname ? config->ifname : "");
  snprintf(comm->transport_mode, sizeof comm->transport_mode, "%s",
           config->transport && config->transport[0] ? config->transport : "auto");
  comm->timeout_s = config->timeout_s;
  comm->tcp_streams = config->tcp_streams;
  const char *encrypt = config->encrypt ? config->encrypt : hoop__env_get("HOOP_ENCRYPT");
  if (strlen(encrypt) >= sizeof comm->encrypt)
    return init_failed(comm, hoop__set_error(comm, HOOP_ERR_INVALID_ARG,
                                             "hoop_init: encrypt '%.40s' is not 0, 1, aes256gcm "
                                             "or chacha20poly1305",
                                             encrypt));
  snprintf(comm->encrypt, sizeof comm->encrypt, "%s", encrypt);
  if (config->reproducible)
    comm->reproducible = 1;
  if (config->compress && !hoop__compress_known(config->compress))
    return init_failed(comm, hoop__set_error(comm, HOOP_ERR_INVALID_ARG,
                                             "hoop_init: compress %#x is not a format with known "
                                             "flags",
                                             (unsigned)config->compress));
  if (config->compress)
    comm->compress = config->compress;
  comm->size = config->size;
  if (hoop__coll_state_size(comm) != HOOP_OK)
    return init_failed(comm, hoop__set_error(comm, HOOP_ERR_SYSTEM, "hoop_init: out of memory"));

  /* A job of one rank needs nobody: no server, no transport. A newcomer always joins one. */
  if (comm->size > 1 || config->join_running) {
    result = join_job(comm, config);
    if (result == HOOP_OK) {
      char prefix[32];
      snprintf(prefix, sizeof prefix, "hoop rank %d", comm->rank);
      hoop__log_set_prefix(prefix);
      result = hoop__comm_connect_ring(comm);
      /* A newcomer's generation is checked with a barrier, as its members' (comm/shrink.c). */
      if (result == HOOP_OK && comm->generation > 0)
        result = hoop_barrier(comm);
    }
    if (result != HOOP_OK)
      return init_failed(comm, result);
  }
  hoop__comm_log_config(comm);
  hoop__log_cpus();
  hoop__flight_install();
  char serving[64];
  if ((result = hoop__trace_open(comm, hoop__transports_serving(comm, serving, sizeof serving))) !=
      HOOP_OK)
    return init_failed(comm, result);
  hoop__launcher_watch_start(comm);
  return HOOP_OK;
}

hoop_result hoop_init_from_env(hoop_comm **out) {
  if (!out)
    return HOOP_ERR_INVALID_ARG;
  /* A throwaway communicator carries the message if the environment itself is wrong. */
  hoop_comm scratch_comm;
  memset(&scratch_comm, 0, sizeof scratch_comm);
  hoop_config config;
  hoop__launcher_env found;
  memset(&found, 0, sizeof found);
  hoop_result result = hoop__config_from_env(&scratch_comm, &config, &found);
  if (result == HOOP_OK)
    result = hoop__bind_from_env(&scratch_comm);
  if (result != HOOP_OK) {
    *out = hoop__comm_new();
    if (*out) {
      memcpy((*out)->last_error, scratch_comm.last_error, sizeof scratch_comm.last_error);
      (*out)->failed = result;
    }
    return result;
  }
  result = hoop_init(out, &config);
  if (result == HOOP_OK)
    hoop__launcher_check_local_rank(*out, &found);
  return result;
}

/* ---- the end --------------------------------------------------------------------------------- */

/* Any thread may call this. The reason is written once, before the flag that publishes it; the
 * abort itself runs under call_lock: here if no call holds it, else in the calling thread, which
 * the transport wakes. The holder looks at the flag before it lets the lock go: an abort asked
 * for between that look and the release waits for the communicator's next call or wait. */
hoop_result hoop_abort(hoop_comm *comm, const char *reason) {
  if (!comm)
    return HOOP_ERR_INVALID_ARG;
  /* A sub-communicator's abort is the job's: its connections are net's. */
  if (comm->net != comm)
    return hoop_abort(comm->net, reason);
  int expected = 0;
  if (atomic_compare_exchange_strong(&comm->abort_requested, &expected, -1)) {
    snprintf(comm->abort_reason, sizeof comm->abort_reason, "%s",
             reason ? reason : "(no reason given)");
    atomic_store(&comm->abort_requested, 1);
  }
  if (hoop__lock_try(&comm->call_lock)) {
    hoop__check_abort(comm);
    hoop__lock_release(&comm->call_lock);
  } else if (hoop__transports_up(comm)) {
    hoop__transports_wake(comm);
  }
  return HOOP_OK;
}

/* What every communicator has of its own, last: the layers' states, the locks, itself. */
static void free_struct(hoop_comm *comm) {
  free_states(comm);
  pthread_mutex_destroy(&comm->net_lock);
  pthread_mutex_destroy(&comm->queue_lock);
  pthread_cond_destroy(&comm->queue_cond);
  pthread_cond_destroy(&comm->done_cond);
  free(comm);
}

/* A sub-communicator's own parts; its net's transports and rendezvous connection stay. */
static hoop_result finalize_view(hoop_comm *comm) {
  hoop_comm *net = hoop__net(comm);
  hoop__fused_free(comm);
  hoop__compressed_free(comm);
  hoop__p2p_free(comm);
  hoop__trace_close(comm);
  if (hoop__transport_count(comm) > 0) {
    hoop__net_enter(comm);
    hoop__registrations_release(comm);
    hoop__net_leave(comm);
  }
  hoop__stage_free(comm);
  hoop__coll_board_free(comm);
  hoop__arena_spare_free(comm);
  hoop__cuda_pipe_free(comm);
  hoop__paths_free(comm);
  hoop__cuda_kind_free(comm);
  hoop__host_scratch_free(comm);
  /* Counted out whatever it had: a view of a job of one rank has no transports. */
  hoop__net_enter(comm);
  net->life->views--;
  hoop__net_leave(comm);
  hoop__table_free(&comm->table);
  free(comm->net_rank_of);
  free_struct(comm);
  return HOOP_OK;
}

hoop_result hoop_finalize(hoop_comm *comm) {
  if (!comm)
    return HOOP_OK;
  if (comm->net == comm && comm->life->views > 0)
    return hoop__set_error(comm, HOOP_ERR_INVALID_ARG,
                           "hoop_finalize: %d sub-communicator%s split from this communicator "
                           "must be finalized first (they use its connections)",
                           comm->life->views, comm->life->views == 1 ? "" : "s");
  hoop_result result = hoop__requests_finalize(comm);
  if (result != HOOP_OK)
    return result;
  if (comm->net != comm)
    return finalize_view(comm);
  /* The generations before and after this one on this rank forget it. */
  if (comm->life->successor)
    comm->life->successor->life->predecessor = NULL;
  if (comm->life->predecessor)
    comm->life->predecessor->life->successor = NULL;
  free(comm->life->prev_rank);
  hoop__fused_free(comm);
  hoop__compressed_free(comm);
  hoop__p2p_free(comm);
  hoop__launcher_watch_stop(comm);
  hoop__trace_close(comm);
  hoop__registrations_release(comm);
  hoop__stage_free(comm);
  hoop__coll_board_free(comm);
  hoop__arena_spare_free(comm);
  hoop__cuda_pipe_free(comm);
  hoop__paths_free(comm);
  hoop__cuda_kind_free(comm);
  hoop__transport_finalize(comm);
  /* BYE before closing, so that the server does not take this rank for lost. A server hosted here
   * stops last: the other ranks may still be finishing their last call; that their rendezvous
   * connections then close is no failure to them. */
  hoop__rendezvous_leave(comm);
  hoop__rdzv_thread_stop(comm->life->server);
  hoop__table_free(&comm->table);
  hoop__auth_wipe(comm->token, sizeof comm->token);
  hoop__auth_wipe(comm->key_secret, sizeof comm->key_secret);
  hoop__host_scratch_free(comm);
  hoop__strays_free(comm);
  free_struct(comm);
  return HOOP_OK;
}
