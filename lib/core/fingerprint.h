/* fingerprint.h - a call's fingerprint (HOOP__FINGERPRINT_BYTES in internal.h): written at the
 * start of every collective, carried opaquely by the transports, compared on arrival. */
#ifndef HOOP__FINGERPRINT_H
#define HOOP__FINGERPRINT_H

#include "core/internal.h"

/* Write comm->fingerprint for the call about to run (comm->seq already counts it); op and root -1
 * when the call has none, name_tag 0 when it has no name (hoop__name_take). */
void hoop__fingerprint_encode(hoop_comm *comm, hoop__coll coll, size_t count, hoop_dtype dtype,
                              int op, int root, uint32_t name_tag, int compress);
/* The tag of the name hoop_name_next gave this thread's next collective on comm (0: none), taken:
 * the thread's next call carries no name unless it is named again. Called once per post. */
uint32_t hoop__name_take(const hoop_comm *comm);
/* The format hoop_compress_next gave this thread's next collective on comm (HOOP__COMPRESS_COMM:
 * none asked), taken as the name is. */
int hoop__compress_take(const hoop_comm *comm);
/* A point-to-point message's fingerprint, into fp: always carried and compared (count, dtype and
 * tag), whatever HOOP_CHECK_CALLS says. */
void hoop__fingerprint_p2p(uint8_t *fp, int is_send, size_t count, hoop_dtype dtype, int tag);
/* Whether fp is a point-to-point message's. */
int hoop__fingerprint_is_p2p(const uint8_t *fp);
/* Whether two fingerprints agree (a send's and a receive's of one message do). */
int hoop__fingerprints_match(const uint8_t *a, const uint8_t *b);
/* The running call's fingerprint (what hoop__fingerprint_encode wrote). */
static inline const uint8_t *hoop__fingerprint_bytes(const hoop_comm *comm) {
  return comm->fingerprint;
}
/* The count a fingerprint carries. */
size_t hoop__fingerprint_count(const uint8_t *fp);

#endif /* HOOP__FINGERPRINT_H */
