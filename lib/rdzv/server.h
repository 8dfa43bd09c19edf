/* server.h - the rendezvous server, on libuv: collects HELLOs per job id and, once a job has
 * all its ranks, assigns ranks (contiguous per host) and sends every member the rank table.
 *
 * One implementation serves three hosts: the hoopd daemon (tools/hoopd.c), hooprun's embedded
 * server (its own libuv loop), and rank 0 when told to host the job (a thread with its own loop).
 */
#ifndef HOOP__RDZV_SERVER_H
#define HOOP__RDZV_SERVER_H

#include <uv.h>

#include "proto/wire.h"

typedef struct hoop__rdzv_server hoop__rdzv_server;

/* Client connections a server holds at once unless told otherwise. */
#define HOOP__RDZV_MAX_CONNECTIONS 4096

typedef struct hoop__rdzv_options {
  const char *listen;       /* "host:port", "[v6]:port" or ":port"; port 0 picks a free one */
  int max_jobs;             /* jobs waiting at once (0: default 1024) */
  int max_connections;      /* client connections at once (0: HOOP__RDZV_MAX_CONNECTIONS) */
  int max_idle_per_address; /* connections from one address that have sent no request yet (0:
                               default 64); past it the oldest of them is closed, so that one
                               address cannot fill max_connections with silence */
  double idle_timeout_s;    /* close a client that sends no complete message for this long
                               (0: default 30 s); a client that has joined waits for its job */
  int keepalive_s;          /* a connection whose host stops answering TCP keepalive probes (it
                               vanished: no FIN, no RST) is dropped after about this long, and
                               a running job's other members are told (0: default 300 s, as
                               HOOP_TIMEOUT) */
  const char *token;        /* NULL or "": admit anyone; else every request must prove it
                               (HMAC-SHA256 over a per-connection challenge). Copied. */
  int once;                 /* 1: stop listening after the first job completes or fails */
  int elastic;              /* with once: go on listening while that job runs, for newcomers
                               to it alone (HOOP__HELLO_NEWCOMER), and after it until closed,
                               telling a newcomer that comes late that the job is over */
  const char *only_job;     /* with once: NULL, or the one job this server hosts (a rank's
                               own): a HELLO for another id or size is refused and ends nothing,
                               and the job waits for its ranks as long as only_timeout_ms says
                               (not as the first HELLO says). Copied. */
  unsigned only_size, only_timeout_ms;
  int require_sealed; /* 1: refuse every HELLO of a rank that does not seal its TCP connections
                         (HOOP__HELLO_SEALED; hoopd --require-encrypt) */
  void (*on_done)(void *arg); /* with once: called when that job is over and its replies flushed */
  void *arg;
} hoop__rdzv_options;

/* Start serving on loop. The options are copied. Returns 0, or -1 with a message in err and *out
 * set to NULL; a failed start may leave a closing handle that frees itself on the loop's next
 * run, so the caller should still run the loop before closing it. */
int hoop__rdzv_server_start(uv_loop_t *loop, const hoop__rdzv_options *options,
                            hoop__rdzv_server **out, char *err, size_t errlen);

/* The server's jobs, ranks, joins, refusals, failures and running jobs' health, appended to out
 * in Prometheus' text exposition format (metrics.c), from the loop's thread. */
struct hoop__buf;
void hoop__rdzv_metrics_text(hoop__rdzv_server *server, struct hoop__buf *out);

/* The jobs waiting, oldest first, then those running with their health, as a STATUS lists them
 * (at most HOOP__WIRE_MAX_STATUS_JOBS), into *status (free it with hoop__status_free), from the
 * loop's thread: 0, or -1 out of memory. */
int hoop__rdzv_server_status(hoop__rdzv_server *server, hoop__status *status);

/* A running job's late ranks ("2: 5.2 ms (p99 5.5, max 5.9); 0: ...") and slowest links
 * ("2 -> 3: 12.3 MB/s; ..."), appended to out (health_text.c). */
void hoop__health_late_text(const hoop__job_health *health, struct hoop__buf *out);
void hoop__health_links_text(const hoop__job_health *health, struct hoop__buf *out);

/* The port actually bound (useful with port 0). */
int hoop__rdzv_server_port(const hoop__rdzv_server *server);

/* Stop listening, drop every client and free the server once libuv has closed its handles; the
 * loop then has nothing of the server's left alive. Call it from the loop's thread, outside
 * on_done. */
void hoop__rdzv_server_close(hoop__rdzv_server *server);

/* A server holds a descriptor per client, and a soft open-file limit of 1024 is common: raise the
 * soft limit towards want, as far as the hard limit allows. Returns want when the soft limit now
 * reaches it; else the soft limit, with the hard limit in *hard. A server with fewer descriptors
 * than clients drops those past them at accept(), without a word. */
long hoop__raise_open_files(long want, long *hard);

/* A server on its own thread and loop (for rank 0 hosting the job). */
typedef struct hoop__rdzv_thread hoop__rdzv_thread;
int hoop__rdzv_thread_start(const hoop__rdzv_options *options, hoop__rdzv_thread **out, char *err,
                            size_t errlen);
int hoop__rdzv_thread_port(const hoop__rdzv_thread *thread);
/* Stop the server and join the thread. Safe on NULL. */
void hoop__rdzv_thread_stop(hoop__rdzv_thread *thread);

#endif /* HOOP__RDZV_SERVER_H */
