/* stray.h - messages diverted from their receive's place, and the net lock (transport/stray.c),
 * for the wait loop and the communicator's life. */
#ifndef HOOP__STRAY_H
#define HOOP__STRAY_H

#include "core/internal.h"
#include "transport/transport.h"

typedef struct hoop__stray hoop__stray;

/* Before a receive (stamped, its channel set) from wpeer (net's rank) is posted to the transport:
 * if a stray of its channel came from wpeer, the receive takes the oldest; returns 1 and in
 * *result HOOP_OK (the receive complete, or pending until the stray's last byte: see settle) or
 * the mismatch recorded. 0 when there is none: post it. Under the net lock. */
int hoop__stray_take(hoop_comm *comm, int wpeer, void *buf, hoop__transfer *req,
                     hoop_result *result);
/* Complete the receives whose strays are now whole (after a round of progress; under the lock). */
hoop_result hoop__strays_settle(hoop_comm *net);
/* At net's finalize. */
void hoop__strays_free(hoop_comm *net);
/* How a stray's bytes reach its receive's buffer, which may be device memory: the memory kinds'
 * copy (hoop__mem_copy), which the communicator's floor registers at init, the memory floor being
 * above this one; memcpy until then. */
typedef hoop_result (*hoop__stray_copy_fn)(hoop_comm *comm, void *dst, const void *src, size_t n);
void hoop__strays_set_copy(hoop__stray_copy_fn copy);

#endif /* HOOP__STRAY_H */
