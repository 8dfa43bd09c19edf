/* fingerprint.c - call fingerprints: each message carries {seq, collective, count, dtype, op,
 * root} of the call that sent it, so that ranks whose calls differ fail with HOOP_ERR_MISMATCH
 * naming both sides instead of waiting for data that never comes (HOOP_CHECK_CALLS). */
#include <stdio.h>
#include <string.h>

#include "core/fingerprint.h"
#include "util/be.h"

/* Layout: seq (8 bytes), collective (hoop__coll + 1), dtype (1), op (1), root (+1, 4 bytes: 0 for
 * none), count (8), 1 reserved byte; integers big-endian. */
static const char *const collective_names[HOOP__COLL_COUNT] = {
    [HOOP__COLL_ALLREDUCE] = "hoop_allreduce",
    [HOOP__COLL_BROADCAST] = "hoop_broadcast",
    [HOOP__COLL_ALLGATHER] = "hoop_allgather",
    [HOOP__COLL_BARRIER] = "hoop_barrier",
    [HOOP__COLL_REDUCE_SCATTER] = "hoop_reduce_scatter",
    [HOOP__COLL_ALLTOALL] = "hoop_alltoall",
    [HOOP__COLL_ALLTOALLV] = "hoop_alltoallv",
    [HOOP__COLL_REDUCE] = "hoop_reduce",
    [HOOP__COLL_GATHER] = "hoop_gather",
    [HOOP__COLL_SCATTER] = "hoop_scatter"};

/* A point-to-point message's mark in the collective byte, and its direction in the last byte (1
 * send, 2 receive), which comparisons leave out. */
#define FP_P2P 0x80

void hoop__fingerprint_p2p(uint8_t *fp, int is_send, size_t count, hoop_dtype dtype, int tag) {
  memset(fp, 0, HOOP__FINGERPRINT_BYTES);
  fp[8] = FP_P2P;
  fp[9] = (uint8_t)dtype;
  hoop__put_be32(fp + 11, (uint32_t)tag + 1);
  hoop__put_be64(fp + 15, count);
  fp[23] = is_send ? 1 : 2;
}

int hoop__fingerprint_is_p2p(const uint8_t *fp) {
  return fp[8] == FP_P2P;
}

int hoop__fingerprints_match(const uint8_t *a, const uint8_t *b) {
  if (a[8] == FP_P2P && b[8] == FP_P2P)
    return memcmp(a, b, HOOP__FINGERPRINT_BYTES - 1) == 0;
  return memcmp(a, b, HOOP__FINGERPRINT_BYTES) == 0;
}

size_t hoop__fingerprint_count(const uint8_t *fp) {
  return (size_t)hoop__get_be64(fp + 15);
}

void hoop__fingerprint_encode(hoop_comm *comm, hoop__coll coll, size_t count, hoop_dtype dtype,
                              int op, int root) {
  uint8_t *fp = comm->fingerprint;
  hoop__put_be64(fp, comm->seq);
  fp[8] = (uint8_t)(coll + 1);
  fp[9] = (uint8_t)dtype;
  fp[10] = (uint8_t)(op + 1);
  hoop__put_be32(fp + 11, (uint32_t)(root + 1));
  hoop__put_be64(fp + 15, count);
  fp[23] = 0;
}

/* "hoop_allreduce (call #5, count 1000, float32, sum)", "hoop_broadcast (call #5, count 10,
 * root 0)". */
static void fingerprint_describe(const uint8_t *fp, char *out, size_t outlen) {
  static const uint8_t unchecked[HOOP__FINGERPRINT_BYTES];
  if (memcmp(fp, unchecked, sizeof unchecked) == 0) {
    snprintf(out, outlen, "a collective (HOOP_CHECK_CALLS=0: not named)");
    return;
  }
  if (fp[8] == FP_P2P) {
    const char *dtype = hoop_dtype_name((hoop_dtype)fp[9]);
    snprintf(out, outlen, "%s (tag %ld, count %zu, %s)", fp[23] == 1 ? "hoop_send" : "hoop_recv",
             (long)hoop__get_be32(fp + 11) - 1, hoop__fingerprint_count(fp),
             dtype ? dtype : "unknown dtype");
    return;
  }
  const char *call =
      fp[8] >= 1 && fp[8] <= HOOP__COLL_COUNT ? collective_names[fp[8] - 1] : "an unknown call";
  const char *dtype = hoop_dtype_name((hoop_dtype)fp[9]);
  const char *op = fp[10] ? hoop_op_name((hoop_op)(fp[10] - 1)) : NULL;
  long root = (long)hoop__get_be32(fp + 11) - 1;
  int n = snprintf(out, outlen, "%s (call #%llu", call, (unsigned long long)hoop__get_be64(fp));
  /* An alltoallv has a count per pair, which the lengths of its messages carry. */
  if (fp[8] == HOOP__COLL_ALLTOALLV + 1 && n >= 0 && (size_t)n < outlen)
    n += snprintf(out + n, outlen - (size_t)n, ", %s", dtype ? dtype : "unknown dtype");
  else if (fp[8] != HOOP__COLL_BARRIER + 1 && n >= 0 && (size_t)n < outlen)
    n += snprintf(out + n, outlen - (size_t)n, ", count %zu, %s", hoop__fingerprint_count(fp),
                  dtype ? dtype : "unknown dtype");
  if (op && n >= 0 && (size_t)n < outlen)
    n += snprintf(out + n, outlen - (size_t)n, ", %s", op);
  if (root >= 0 && n >= 0 && (size_t)n < outlen)
    n += snprintf(out + n, outlen - (size_t)n, ", root %ld", root);
  if (n >= 0 && (size_t)n < outlen)
    snprintf(out + n, outlen - (size_t)n, ")");
}

hoop_result hoop__mismatch(hoop_comm *comm, int peer, const uint8_t *theirs, const uint8_t *ours,
                           uint64_t len, uint64_t expected_len) {
  char mine[160], other[160];
  fingerprint_describe(ours, mine, sizeof mine);
  fingerprint_describe(theirs, other, sizeof other);
  if (!hoop__fingerprints_match(theirs, ours))
    return hoop__fail(comm, HOOP_ERR_MISMATCH, "%s on rank %d does not match %s on rank %d", mine,
                      comm->rank, other, peer);
  return hoop__fail(comm, HOOP_ERR_MISMATCH,
                    "%s on rank %d expected a message of %llu bytes from rank %d, which sent %llu",
                    mine, comm->rank, (unsigned long long)expected_len, peer,
                    (unsigned long long)len);
}

hoop_result hoop__mismatch_early(hoop_comm *comm, int peer, uint16_t channel,
                                 const uint8_t *theirs) {
  static const uint8_t unchecked[HOOP__FINGERPRINT_BYTES];
  /* Another communicator's message: its receive, when posted, compares it. So does net's own
   * message while a view's thread drives the transports: net's running call may be changing in
   * its own thread. */
  if (channel != comm->channel || (comm->net_caller && comm->net_caller != comm))
    return HOOP_OK;
  /* A later call's message is the peer running ahead, which is fine; so is a point-to-point
   * message, which a receive posted later takes. */
  if (!comm->check_calls || !comm->call || memcmp(theirs, unchecked, sizeof unchecked) == 0 ||
      theirs[8] == FP_P2P || hoop__get_be64(theirs) > comm->seq ||
      memcmp(theirs, comm->fingerprint, sizeof unchecked) == 0)
    return HOOP_OK;
  return hoop__mismatch(comm, peer, theirs, comm->fingerprint, 0, 0);
}
