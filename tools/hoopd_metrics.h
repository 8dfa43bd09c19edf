/* hoopd_metrics.h - hoopd --metrics: the rendezvous server's metrics over HTTP (hoopd_metrics.c).
 */
#ifndef HOOPD_METRICS_H
#define HOOPD_METRICS_H

#include <stddef.h>
#include <uv.h>

#include "rdzv/server.h"

typedef struct hoopd_metrics hoopd_metrics;

/* Serve server's metrics at http://listen/metrics on loop. bearer: NULL or "" to serve anyone,
 * which only a loopback address may; else the token a request must carry. 0, or -1 with a message
 * in err. */
int hoopd_metrics_start(uv_loop_t *loop, hoop__rdzv_server *server, const char *listen,
                        const char *bearer, hoopd_metrics **out, char *err, size_t errlen);
/* Stop serving (the open connections closed), freed once libuv has closed its handles. NULL: a
 * no-op. */
void hoopd_metrics_close(hoopd_metrics *metrics);

#endif
