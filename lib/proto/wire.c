/* wire.c - encode and decode every rendezvous message (see wire.h), byte by byte in big-endian,
 * with bounds checked on both sides so that a decoder is safe on any input at all.
 *
 * Payload layouts (after the 12-byte header; str = u16 length + bytes, blob likewise):
 *   HELLO       str job, u32 size, i32 rank (-1: any, -2: a newcomer), u32 timeout_ms, str host,
 *               str addr, blob proof
 *   TABLE       u32 size, u32 rank, u8 nonce[16],
 *               then size x {str host, str addr, u32 local_rank, u32 local_size},
 *               then u32 generation when it is not 0 (a table after a shrink or growth)
 *               (the receiver's rank is the u32 at payload offset 4: the server encodes the table
 *               once and patches that field per member)
 *   ERROR       u32 code (a hoop_result, not 0), str message
 *   STATUS_REQ  blob proof (empty when the server asks for none)
 *   STATUS      u32 njobs, then njobs x {str job, u32 size, u32 joined, u32 waited_ms,
 *               u32 nmissing, nmissing x i32 missing rank,
 *               u32 nhosts, nhosts x {str host, u32 ranks}, health}
 *   CHALLENGE   u8 flags, u8 nonce[32]
 *   ABORT       u32 rank, str reason
 *   BYE         (empty)
 *   NOTICE      u32 code (a hoop_result, not 0), u32 origin rank, str message
 *   SHRINK      u32 generation, u32 rank, u32 timeout_ms, u32 flags, str addr,
 *               u32 naccused, naccused x u32 rank
 *   PENDING     u32 newcomers waiting
 *   STATS, VIEW, and the health a STATUS gives each job after its hosts: see wire_health.c
 */
#include "proto/wire.h"
#include "proto/wire_io.h"
#include "util/be.h"

#include <stdlib.h>
#include <string.h>

/* ---- encoders -------------------------------------------------------------------------------- */

int hoop__wire_encode_hello(hoop__wbuf *wb, const hoop__hello *msg) {
  long job = field_len(msg->job, sizeof msg->job, HOOP__WIRE_MAX_JOB);
  long host = field_len(msg->host, sizeof msg->host, HOOP__WIRE_MAX_HOST);
  long addr = field_len(msg->addr, sizeof msg->addr, HOOP__WIRE_MAX_ADDR);
  if (job < 0 || host < 0 || addr < 0 || msg->size == 0 || msg->size > HOOP__WIRE_MAX_RANKS ||
      msg->rank < HOOP__HELLO_NEWCOMER || (msg->rank >= 0 && (uint32_t)msg->rank >= msg->size) ||
      msg->proof_len > HOOP__WIRE_MAX_PROOF || (msg->flags & ~HOOP__HELLO_FLAGS))
    return -1;
  size_t start = begin_message(wb, HOOP_MSG_HELLO);
  put_str(wb, msg->job, (size_t)job);
  put_u32(wb, msg->size);
  put_u32(wb, (uint32_t)msg->rank);
  put_u32(wb, msg->timeout_ms);
  put_str(wb, msg->host, (size_t)host);
  put_str(wb, msg->addr, (size_t)addr);
  put_u16(wb, msg->proof_len);
  put_bytes(wb, msg->proof, msg->proof_len);
  put_bytes(wb, msg->nonce, HOOP__WIRE_CHALLENGE);
  put_bytes(wb, msg->key, HOOP__WIRE_KEY);
  put_u32(wb, msg->flags);
  return finish_message(wb, start);
}

static int peer_entry_valid(const hoop__peer_entry *peer, uint32_t size) {
  return field_len(peer->host, sizeof peer->host, HOOP__WIRE_MAX_HOST) >= 0 &&
         field_len(peer->addr, sizeof peer->addr, HOOP__WIRE_MAX_ADDR) >= 0 &&
         peer->local_rank < peer->local_size && peer->local_size <= size;
}

int hoop__wire_encode_table(hoop__wbuf *wb, const hoop__table *msg) {
  if (msg->size == 0 || msg->size > HOOP__WIRE_MAX_RANKS || msg->rank >= msg->size || !msg->peers)
    return -1;
  for (uint32_t i = 0; i < msg->size; i++)
    if (!peer_entry_valid(&msg->peers[i], msg->size))
      return -1;
  size_t start = begin_message(wb, HOOP_MSG_TABLE);
  put_u32(wb, msg->size);
  put_u32(wb, msg->rank);
  put_bytes(wb, msg->nonce, HOOP__WIRE_NONCE);
  for (uint32_t i = 0; i < msg->size; i++) {
    const hoop__peer_entry *peer = &msg->peers[i];
    put_str(wb, peer->host, strlen(peer->host));
    put_str(wb, peer->addr, strlen(peer->addr));
    put_u32(wb, peer->local_rank);
    put_u32(wb, peer->local_size);
    put_bytes(wb, peer->key, HOOP__WIRE_KEY);
  }
  if (msg->generation)
    put_u32(wb, msg->generation);
  return finish_message(wb, start);
}

int hoop__wire_encode_error(hoop__wbuf *wb, const hoop__error_msg *msg) {
  long message = field_len(msg->message, sizeof msg->message, HOOP__WIRE_MAX_MESSAGE);
  if (message < 0 || msg->code == 0)
    return -1;
  size_t start = begin_message(wb, HOOP_MSG_ERROR);
  put_u32(wb, msg->code);
  put_str(wb, msg->message, (size_t)message);
  return finish_message(wb, start);
}

int hoop__wire_encode_status_req(hoop__wbuf *wb, const hoop__status_req *msg) {
  if (msg->proof_len > HOOP__WIRE_MAX_PROOF)
    return -1;
  size_t start = begin_message(wb, HOOP_MSG_STATUS_REQ);
  put_u16(wb, msg->proof_len);
  put_bytes(wb, msg->proof, msg->proof_len);
  return finish_message(wb, start);
}

int hoop__wire_encode_challenge(hoop__wbuf *wb, const hoop__challenge *msg) {
  if (msg->flags & ~HOOP__CHALLENGE_AUTH)
    return -1;
  size_t start = begin_message(wb, HOOP_MSG_CHALLENGE);
  put_bytes(wb, &msg->flags, 1);
  put_bytes(wb, msg->nonce, sizeof msg->nonce);
  return finish_message(wb, start);
}

int hoop__wire_encode_abort(hoop__wbuf *wb, const hoop__abort_msg *msg) {
  long reason = field_len(msg->reason, sizeof msg->reason, HOOP__WIRE_MAX_MESSAGE);
  if (reason < 0 || msg->rank >= HOOP__WIRE_MAX_RANKS)
    return -1;
  size_t start = begin_message(wb, HOOP_MSG_ABORT);
  put_u32(wb, msg->rank);
  put_str(wb, msg->reason, (size_t)reason);
  return finish_message(wb, start);
}

int hoop__wire_encode_bye(hoop__wbuf *wb) {
  return finish_message(wb, begin_message(wb, HOOP_MSG_BYE));
}

int hoop__wire_encode_notice(hoop__wbuf *wb, const hoop__notice *msg) {
  long message = field_len(msg->message, sizeof msg->message, HOOP__WIRE_MAX_MESSAGE);
  if (message < 0 || msg->code == 0 || msg->origin >= HOOP__WIRE_MAX_RANKS)
    return -1;
  size_t start = begin_message(wb, HOOP_MSG_NOTICE);
  put_u32(wb, msg->code);
  put_u32(wb, msg->origin);
  put_str(wb, msg->message, (size_t)message);
  return finish_message(wb, start);
}

static int shrink_valid(const hoop__shrink_msg *msg) {
  if (msg->rank >= HOOP__WIRE_MAX_RANKS || (msg->flags & ~HOOP__SHRINK_FLAGS) ||
      msg->naccused > HOOP__WIRE_MAX_ACCUSED)
    return 0;
  for (uint32_t i = 0; i < msg->naccused; i++)
    if (msg->accused[i] >= HOOP__WIRE_MAX_RANKS)
      return 0;
  return 1;
}

int hoop__wire_encode_shrink(hoop__wbuf *wb, const hoop__shrink_msg *msg) {
  long addr = field_len(msg->addr, sizeof msg->addr, HOOP__WIRE_MAX_ADDR);
  if (addr < 0 || !shrink_valid(msg))
    return -1;
  size_t start = begin_message(wb, HOOP_MSG_SHRINK);
  put_u32(wb, msg->generation);
  put_u32(wb, msg->rank);
  put_u32(wb, msg->timeout_ms);
  put_u32(wb, msg->flags);
  put_str(wb, msg->addr, (size_t)addr);
  put_u32(wb, msg->naccused);
  for (uint32_t i = 0; i < msg->naccused; i++)
    put_u32(wb, msg->accused[i]);
  return finish_message(wb, start);
}

static int job_status_valid(const hoop__job_status *job) {
  if (field_len(job->job, sizeof job->job, HOOP__WIRE_MAX_JOB) < 0 || job->size == 0 ||
      job->size > HOOP__WIRE_MAX_RANKS || job->joined > job->size ||
      job->nmissing > HOOP__WIRE_MAX_MISSING || job->nmissing > job->size - job->joined)
    return 0;
  for (uint32_t i = 0; i < job->nmissing; i++)
    if (job->missing[i] < 0 || (uint32_t)job->missing[i] >= job->size)
      return 0;
  if (job->nhosts > HOOP__WIRE_MAX_STATUS_HOSTS)
    return 0;
  uint32_t ranks = 0;
  for (uint32_t h = 0; h < job->nhosts; h++) {
    if (field_len(job->hosts[h].name, sizeof job->hosts[h].name, HOOP__WIRE_MAX_HOST) < 0 ||
        job->hosts[h].ranks == 0 || job->hosts[h].ranks > job->joined - ranks)
      return 0;
    ranks += job->hosts[h].ranks;
  }
  return hoop__wire_health_valid(&job->health, job->size);
}

int hoop__wire_encode_status(hoop__wbuf *wb, const hoop__status *msg) {
  if (msg->njobs > HOOP__WIRE_MAX_STATUS_JOBS || (msg->njobs > 0 && !msg->jobs))
    return -1;
  for (uint32_t i = 0; i < msg->njobs; i++)
    if (!job_status_valid(&msg->jobs[i]))
      return -1;
  size_t start = begin_message(wb, HOOP_MSG_STATUS);
  put_u32(wb, msg->njobs);
  for (uint32_t i = 0; i < msg->njobs; i++) {
    const hoop__job_status *job = &msg->jobs[i];
    put_str(wb, job->job, strlen(job->job));
    put_u32(wb, job->size);
    put_u32(wb, job->joined);
    put_u32(wb, job->waited_ms);
    put_u32(wb, job->nmissing);
    for (uint32_t m = 0; m < job->nmissing; m++)
      put_u32(wb, (uint32_t)job->missing[m]);
    put_u32(wb, job->nhosts);
    for (uint32_t h = 0; h < job->nhosts; h++) {
      put_str(wb, job->hosts[h].name, strlen(job->hosts[h].name));
      put_u32(wb, job->hosts[h].ranks);
    }
    hoop__wire_put_health(wb, &job->health);
  }
  return finish_message(wb, start);
}

/* ---- decoders -------------------------------------------------------------------------------- */

int hoop__wire_decode_header(const uint8_t *buf, size_t len, size_t max_payload,
                             hoop__wire_header *out) {
  if (len < HOOP__WIRE_HEADER_SIZE)
    return 1;
  /* Filled even when invalid, so that the caller can log what came. */
  out->magic = hoop__get_be32(buf);
  out->version = hoop__get_be16(buf + 4);
  out->type = hoop__get_be16(buf + 6);
  out->length = hoop__get_be32(buf + 8);
  if (out->magic != HOOP__WIRE_MAGIC || out->version != HOOP__WIRE_VERSION ||
      out->type < HOOP_MSG_HELLO || out->type > HOOP__MSG_LAST || out->length > max_payload)
    return -1;
  return 0;
}

int hoop__wire_decode_hello(const uint8_t *payload, size_t len, hoop__hello *out) {
  reader in = {payload, len, 0};
  memset(out, 0, sizeof *out);
  get_name(&in, out->job, HOOP__WIRE_MAX_JOB);
  out->size = get_u32(&in);
  out->rank = get_i32(&in);
  out->timeout_ms = get_u32(&in);
  get_name(&in, out->host, HOOP__WIRE_MAX_HOST);
  get_name(&in, out->addr, HOOP__WIRE_MAX_ADDR);
  out->proof_len = get_proof(&in, out->proof);
  const uint8_t *nonce = take(&in, HOOP__WIRE_CHALLENGE);
  if (nonce)
    memcpy(out->nonce, nonce, HOOP__WIRE_CHALLENGE);
  const uint8_t *key = take(&in, HOOP__WIRE_KEY);
  if (key)
    memcpy(out->key, key, HOOP__WIRE_KEY);
  out->flags = get_u32(&in);
  if (reader_done(&in) != 0 || (out->flags & ~HOOP__HELLO_FLAGS) || out->size == 0 ||
      out->size > HOOP__WIRE_MAX_RANKS || out->rank < HOOP__HELLO_NEWCOMER ||
      (out->rank >= 0 && (uint32_t)out->rank >= out->size))
    return -1;
  return 0;
}

/* Smallest encoding of one table entry: two empty strings, two u32 and a key. */
#define TABLE_ENTRY_MIN (12 + HOOP__WIRE_KEY)

static void get_peer_entry(reader *in, hoop__peer_entry *peer, uint32_t size) {
  get_name(in, peer->host, HOOP__WIRE_MAX_HOST);
  get_name(in, peer->addr, HOOP__WIRE_MAX_ADDR);
  peer->local_rank = get_u32(in);
  peer->local_size = get_u32(in);
  const uint8_t *key = take(in, HOOP__WIRE_KEY);
  if (key)
    memcpy(peer->key, key, HOOP__WIRE_KEY);
  if (peer->local_rank >= peer->local_size || peer->local_size > size)
    in->bad = 1;
}

int hoop__wire_decode_table(const uint8_t *payload, size_t len, hoop__table *out) {
  reader in = {payload, len, 0};
  memset(out, 0, sizeof *out);
  uint32_t size = get_u32(&in);
  uint32_t rank = get_u32(&in);
  const uint8_t *nonce = take(&in, HOOP__WIRE_NONCE);
  /* Check the entry count against the bytes left before allocating for it, so that a short
   * hostile payload cannot make us allocate megabytes. */
  if (in.bad || size == 0 || size > HOOP__WIRE_MAX_RANKS || rank >= size ||
      in.left / TABLE_ENTRY_MIN < size)
    return -1;
  hoop__peer_entry *peers = calloc(size, sizeof *peers);
  if (!peers)
    return -1;
  for (uint32_t i = 0; i < size && !in.bad; i++)
    get_peer_entry(&in, &peers[i], size);
  /* A generation is sent only when it is not 0, so a 0 there is malformed. */
  int has_generation = !in.bad && in.left == 4;
  uint32_t generation = has_generation ? get_u32(&in) : 0;
  if (reader_done(&in) != 0 || (has_generation && generation == 0)) {
    free(peers);
    return -1;
  }
  out->size = size;
  out->rank = rank;
  memcpy(out->nonce, nonce, HOOP__WIRE_NONCE);
  out->peers = peers;
  out->generation = generation;
  return 0;
}

int hoop__wire_decode_error(const uint8_t *payload, size_t len, hoop__error_msg *out) {
  reader in = {payload, len, 0};
  memset(out, 0, sizeof *out);
  out->code = get_u32(&in);
  get_str(&in, out->message, HOOP__WIRE_MAX_MESSAGE);
  return reader_done(&in) != 0 || out->code == 0 ? -1 : 0;
}

/* Smallest encoding of one job in a status: an empty job id, five u32, and a health of seven. */
#define STATUS_JOB_MIN 50

static void get_job_status(reader *in, hoop__job_status *job) {
  get_name(in, job->job, HOOP__WIRE_MAX_JOB);
  job->size = get_u32(in);
  job->joined = get_u32(in);
  job->waited_ms = get_u32(in);
  job->nmissing = get_u32(in);
  if (job->size == 0 || job->size > HOOP__WIRE_MAX_RANKS || job->joined > job->size ||
      job->nmissing > HOOP__WIRE_MAX_MISSING || job->nmissing > job->size - job->joined) {
    in->bad = 1;
    return;
  }
  for (uint32_t m = 0; m < job->nmissing && !in->bad; m++) {
    job->missing[m] = get_i32(in);
    if (job->missing[m] < 0 || (uint32_t)job->missing[m] >= job->size)
      in->bad = 1;
  }
  job->nhosts = get_u32(in);
  if (job->nhosts > HOOP__WIRE_MAX_STATUS_HOSTS) {
    in->bad = 1;
    return;
  }
  uint32_t ranks = 0;
  for (uint32_t h = 0; h < job->nhosts && !in->bad; h++) {
    get_name(in, job->hosts[h].name, HOOP__WIRE_MAX_HOST);
    job->hosts[h].ranks = get_u32(in);
    if (job->hosts[h].ranks == 0 || job->hosts[h].ranks > job->joined - ranks)
      in->bad = 1;
    ranks += job->hosts[h].ranks;
  }
  hoop__wire_get_health(in, &job->health, job->size);
}

int hoop__wire_decode_status(const uint8_t *payload, size_t len, hoop__status *out) {
  reader in = {payload, len, 0};
  memset(out, 0, sizeof *out);
  uint32_t njobs = get_u32(&in);
  if (in.bad || njobs > HOOP__WIRE_MAX_STATUS_JOBS || in.left / STATUS_JOB_MIN < njobs)
    return -1;
  hoop__job_status *jobs = NULL;
  if (njobs > 0 && !(jobs = calloc(njobs, sizeof *jobs)))
    return -1;
  for (uint32_t i = 0; i < njobs && !in.bad; i++)
    get_job_status(&in, &jobs[i]);
  if (reader_done(&in) != 0) {
    free(jobs);
    return -1;
  }
  out->njobs = njobs;
  out->jobs = jobs;
  return 0;
}

int hoop__wire_decode_status_req(const uint8_t *payload, size_t len, hoop__status_req *out) {
  reader in = {payload, len, 0};
  memset(out, 0, sizeof *out);
  out->proof_len = get_proof(&in, out->proof);
  return reader_done(&in);
}

int hoop__wire_decode_challenge(const uint8_t *payload, size_t len, hoop__challenge *out) {
  reader in = {payload, len, 0};
  memset(out, 0, sizeof *out);
  const uint8_t *flags = take(&in, 1);
  const uint8_t *nonce = take(&in, HOOP__WIRE_CHALLENGE);
  if (reader_done(&in) != 0 || (flags[0] & ~HOOP__CHALLENGE_AUTH))
    return -1;
  out->flags = flags[0];
  memcpy(out->nonce, nonce, HOOP__WIRE_CHALLENGE);
  return 0;
}

int hoop__wire_decode_abort(const uint8_t *payload, size_t len, hoop__abort_msg *out) {
  reader in = {payload, len, 0};
  memset(out, 0, sizeof *out);
  out->rank = get_u32(&in);
  get_str(&in, out->reason, HOOP__WIRE_MAX_MESSAGE);
  return reader_done(&in) != 0 || out->rank >= HOOP__WIRE_MAX_RANKS ? -1 : 0;
}

int hoop__wire_decode_bye(const uint8_t *payload, size_t len) {
  (void)payload;
  return len == 0 ? 0 : -1;
}

int hoop__wire_decode_notice(const uint8_t *payload, size_t len, hoop__notice *out) {
  reader in = {payload, len, 0};
  memset(out, 0, sizeof *out);
  out->code = get_u32(&in);
  out->origin = get_u32(&in);
  get_str(&in, out->message, HOOP__WIRE_MAX_MESSAGE);
  return reader_done(&in) != 0 || out->code == 0 || out->origin >= HOOP__WIRE_MAX_RANKS ? -1 : 0;
}

int hoop__wire_decode_shrink(const uint8_t *payload, size_t len, hoop__shrink_msg *out) {
  reader in = {payload, len, 0};
  memset(out, 0, sizeof *out);
  out->generation = get_u32(&in);
  out->rank = get_u32(&in);
  out->timeout_ms = get_u32(&in);
  out->flags = get_u32(&in);
  get_name(&in, out->addr, HOOP__WIRE_MAX_ADDR);
  out->naccused = get_u32(&in);
  if (in.bad || out->naccused > HOOP__WIRE_MAX_ACCUSED)
    return -1;
  for (uint32_t i = 0; i < out->naccused; i++)
    out->accused[i] = get_u32(&in);
  return reader_done(&in) != 0 || !shrink_valid(out) ? -1 : 0;
}

int hoop__wire_encode_pending(hoop__wbuf *wb, uint32_t newcomers) {
  size_t start = begin_message(wb, HOOP_MSG_PENDING);
  put_u32(wb, newcomers);
  return finish_message(wb, start);
}

int hoop__wire_decode_pending(const uint8_t *payload, size_t len, uint32_t *newcomers) {
  reader in = {payload, len, 0};
  *newcomers = get_u32(&in);
  return reader_done(&in);
}

int hoop__wire_encode_table_proof(hoop__wbuf *wb, const hoop__table_proof *msg) {
  if (msg->proof_len == 0 || msg->proof_len > HOOP__WIRE_MAX_PROOF)
    return -1;
  size_t start = begin_message(wb, HOOP_MSG_TABLE_PROOF);
  put_u16(wb, msg->proof_len);
  put_bytes(wb, msg->proof, msg->proof_len);
  return finish_message(wb, start);
}

int hoop__wire_decode_table_proof(const uint8_t *payload, size_t len, hoop__table_proof *out) {
  reader in = {payload, len, 0};
  memset(out, 0, sizeof *out);
  out->proof_len = get_proof(&in, out->proof);
  return reader_done(&in) != 0 || out->proof_len == 0 ? -1 : 0;
}

void hoop__table_free(hoop__table *table) {
  free(table->peers);
  table->peers = NULL;
  table->size = 0;
}

void hoop__status_free(hoop__status *status) {
  free(status->jobs);
  status->jobs = NULL;
  status->njobs = 0;
}
