/* fingerprint.c - call fingerprints: each message carries {seq, collective, count, dtype, op,
 * root} of the call that sent it, so that ranks whose calls differ fail with HOOP_ERR_MISMATCH
 * naming both sides instead of waiting for data that never comes (HOOP_CHECK_CALLS). */
#include <stdio.h>
#include <string.h>

#include "core/fingerprint.h"
#include "util/be.h"
#include "util/hash.h"

/* Layout of a collective's: seq (8 bytes), collective (hoop__coll + 1), dtype (1), op (+1, 1),
 * root (+1, 2 bytes: 0 for none; a job has at most HOOP__WIRE_MAX_RANKS ranks), count (6 bytes:
 * 2^48 - 1 stands for that many or more, which no memory holds), the tag of the call's name (4
 * bytes, 0 for none), 1 byte: 1 for a reducing call in reproducible mode, else the wire format
 * across hosts shifted left by one, with 0x40 for stochastic rounding; integers
 * big-endian. A point-to-point message's: see
 * hoop__fingerprint_p2p. */
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

#define COUNT_MAX ((UINT64_C(1) << 48) - 1)

size_t hoop__fingerprint_count(const uint8_t *fp) {
  if (fp[8] == FP_P2P)
    return (size_t)hoop__get_be64(fp + 15);
  return (size_t)(hoop__get_be64(fp + 11) & COUNT_MAX);
}

static uint32_t fingerprint_tag(const uint8_t *fp) {
  return fp[8] == FP_P2P ? 0 : hoop__get_be32(fp + 19);
}

void hoop__fingerprint_encode(hoop_comm *comm, hoop__coll coll, size_t count, hoop_dtype dtype,
                              int op, int root, uint32_t name_tag, int compress) {
  uint8_t *fp = comm->fingerprint;
  uint64_t wide = (uint64_t)count < COUNT_MAX ? (uint64_t)count : COUNT_MAX;
  hoop__put_be64(fp, comm->seq);
  fp[8] = (uint8_t)(coll + 1);
  fp[9] = (uint8_t)dtype;
  fp[10] = (uint8_t)(op + 1);
  hoop__put_be16(fp + 11, (uint16_t)(root + 1));
  hoop__put_be16(fp + 13, (uint16_t)(wide >> 32));
  hoop__put_be32(fp + 15, (uint32_t)wide);
  hoop__put_be32(fp + 19, name_tag);
  /* Reproducible mode changes what a reducing call computes: ranks that differ in it must not
   * meet as if they agreed. */
  fp[23] = comm->reproducible && hoop__coll_reduces(coll);
  /* So does a wire format, and its encoded messages' lengths differ. */
  if (compress > 0)
    fp[23] = (uint8_t)((compress & 0x1f) << 1 | (compress & HOOP_COMPRESS_STOCHASTIC ? 0x40 : 0));
}

/* ---- the calls' names ------------------------------------------------------------------------ */

/* The name hoop_name_next gave this thread's next collective, and the communicator it is for. */
static _Thread_local struct {
  const hoop_comm *comm;
  uint32_t tag;
} pending;

/* FNV-1a over the whole name; 0 stands for "no name", so a name that hashes to it takes 1. */
static uint32_t name_hash(const char *name) {
  uint32_t h = hoop__fnv1a(name);
  return h ? h : 1;
}

hoop_result hoop_name_next(hoop_comm *comm, const char *name) {
  if (!comm)
    return HOOP_ERR_INVALID_ARG;
  pending.comm = NULL;
  pending.tag = 0;
  if (!name || !*name)
    return HOOP_OK;
  uint32_t tag = name_hash(name);
  hoop__names *names = &comm->names;
  hoop__lock_take(&names->lock);
  int known = 0;
  for (unsigned i = 0; i < HOOP__NAMES && !known; i++)
    known = names->tag[i] == tag && strncmp(names->text[i], name, HOOP_NAME_MAX - 1) == 0;
  if (!known) {
    /* Kept printable: the name goes into error messages and logs as it is. */
    unsigned slot = names->next++ % HOOP__NAMES;
    size_t n = 0;
    for (; name[n] && n < HOOP_NAME_MAX - 1; n++)
      names->text[slot][n] = (unsigned char)name[n] >= 0x20 && name[n] != 0x7f ? name[n] : '?';
    names->text[slot][n] = '\0';
    names->tag[slot] = tag;
  }
  hoop__lock_release(&names->lock);
  pending.comm = comm;
  pending.tag = tag;
  return HOOP_OK;
}

/* The format hoop_compress_next gave this thread's next collective, and the communicator. */
static _Thread_local struct {
  const hoop_comm *comm;
  int format;
} pending_format;

hoop_result hoop_compress_next(hoop_comm *comm, int format) {
  if (!comm)
    return HOOP_ERR_INVALID_ARG;
  pending_format.comm = NULL;
  if (!hoop__compress_known(format))
    return hoop__set_error(comm, HOOP_ERR_INVALID_ARG, "hoop_compress_next: unknown format %#x",
                           (unsigned)format);
  pending_format.comm = comm;
  pending_format.format = format;
  return HOOP_OK;
}

int hoop__compress_take(const hoop_comm *comm) {
  int format = pending_format.comm == comm ? pending_format.format : HOOP__COMPRESS_COMM;
  pending_format.comm = NULL;
  return format;
}

uint32_t hoop__name_take(const hoop_comm *comm) {
  uint32_t tag = pending.comm == comm ? pending.tag : 0;
  pending.comm = NULL;
  pending.tag = 0;
  return tag;
}

/* ", name \"grad.a\"" for a tag this rank named a call with, else ", name #1a2b3c4d" (the peer's
 * name, which this rank never used); "" for no name. */
static void name_describe(hoop_comm *comm, uint32_t tag, char *out, size_t outlen) {
  out[0] = '\0';
  if (!tag)
    return;
  hoop__names *names = &comm->names;
  hoop__lock_take(&names->lock);
  for (unsigned i = 0; i < HOOP__NAMES; i++)
    if (names->tag[i] == tag) {
      snprintf(out, outlen, ", name \"%s\"", names->text[i]);
      break;
    }
  hoop__lock_release(&names->lock);
  if (!out[0])
    snprintf(out, outlen, ", name #%08x", (unsigned)tag);
}

/* "hoop_allreduce (call #5, count 1000, float32, sum)", "hoop_broadcast (call #5, count 10,
 * root 0)". */
static void fingerprint_describe(hoop_comm *comm, const uint8_t *fp, char *out, size_t outlen) {
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
  long root = (long)hoop__get_be16(fp + 11) - 1;
  char name[HOOP_NAME_MAX + 16];
  name_describe(comm, fingerprint_tag(fp), name, sizeof name);
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
  char format[48];
  if (fp[23] == 1 && n >= 0 && (size_t)n < outlen)
    n += snprintf(out + n, outlen - (size_t)n, ", reproducible");
  else if (fp[23] && n >= 0 && (size_t)n < outlen)
    n += snprintf(
        out + n, outlen - (size_t)n, ", compressed %s",
        hoop_compress_name((fp[23] >> 1 & 0x1f) | (fp[23] & 0x40 ? HOOP_COMPRESS_STOCHASTIC : 0),
                           format, sizeof format)
            ? format
            : "in an unknown format");
  if (n >= 0 && (size_t)n < outlen)
    snprintf(out + n, outlen - (size_t)n, "%s)", name);
}

hoop_result hoop__mismatch(hoop_comm *comm, int peer, const uint8_t *theirs, const uint8_t *ours,
                           uint64_t len, uint64_t expected_len) {
  char mine[256], other[256];
  fingerprint_describe(comm, ours, mine, sizeof mine);
  fingerprint_describe(comm, theirs, other, sizeof other);
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
