/* state.h - the rendezvous client's state of a communicator (hoop_comm.rdzv), which only lib/rdzv
 * sees (lib/floors: "own"): what the kept connection has said and been told. The connection's
 * descriptor itself, hoop_comm.rdzv_fd, is the interface the transports' waits poll. */
#ifndef HOOP__RDZV_STATE_H
#define HOOP__RDZV_STATE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "core/internal.h"
#include "proto/wire.h"

struct hoop__rdzv_state {
  int goodbye; /* ABORT or BYE sent: the server expects nothing more */
  /* Why the connection went, once it did, for a later shrink's error: the words, and the
   * server's code when it was an ERROR (the rank left out), else 0. */
  char lost[HOOP__WIRE_MAX_MESSAGE + 256];
  hoop_result lost_code;
  atomic_int newcomers; /* newcomers waiting, as the server last said (PENDING) */
  /* The server's last VIEW of the job (report.c), and when it came (hoop__now; 0: none yet),
   * under view_lock: hoop_comm_stats reads it from any thread. */
  pthread_mutex_t view_lock;
  hoop__view_msg view;
  double view_at;
  size_t inlen; /* bytes of in[] read and not yet taken */
  uint8_t in[HOOP__WIRE_HEADER_SIZE + HOOP__WIRE_MAX_NOTICE_PAYLOAD];
};

/* Stop using the kept connection (client.c), saying why in the log. */
void hoop__rendezvous_drop(hoop_comm *comm, const char *why);
/* The server asks for this rank's flight recorder (a DUMP of len payload bytes; report.c): the
 * FLIGHT goes out at once. */
void hoop__rendezvous_take_dump(hoop_comm *comm, size_t len);
/* A VIEW's payload from the kept connection (report.c): kept if well formed, else the connection
 * is dropped. */
void hoop__rendezvous_take_view(hoop_comm *comm, const uint8_t *payload, size_t len);

#endif
