/* fingerprint.h - a call's fingerprint (HOOP__FINGERPRINT_BYTES in internal.h): written at the
 * start of every collective, carried opaquely by the transports, compared on arrival. */
#ifndef HOOP__FINGERPRINT_H
#define HOOP__FINGERPRINT_H

#include "core/internal.h"

/* Write comm->fingerprint for the call about to run (comm->seq already counts it); op and root -1
 * when the call has none. */
void hoop__fingerprint_encode(hoop_comm *comm, hoop__coll coll, size_t count, hoop_dtype dtype,
                              int op, int root);
/* The count a fingerprint carries. */
size_t hoop__fingerprint_count(const uint8_t *fp);

#endif /* HOOP__FINGERPRINT_H */
