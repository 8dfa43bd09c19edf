/* wire_dump.c - the messages of hoopd --dump (see wire.h): a client's DUMP_REQ, the server's DUMP
 * to each member, a member's FLIGHT, the server's DUMP_REPLY.
 *
 * Payload layouts (after the 12-byte header):
 *   DUMP_REQ    blob proof, str job
 *   DUMP        (empty)
 *   FLIGHT      str text (at most HOOP__WIRE_MAX_FLIGHT bytes)
 *   DUMP_REPLY  u32 n, n x {u32 rank, str text}
 */
#include <stdlib.h>

#include "proto/wire.h"
#include "proto/wire_io.h"

int hoop__wire_encode_dump_req(hoop__wbuf *wb, const hoop__dump_req *msg) {
  long job = field_len(msg->job, sizeof msg->job, HOOP__WIRE_MAX_JOB);
  if (job <= 0 || msg->proof_len > HOOP__WIRE_MAX_PROOF)
    return -1;
  size_t start = begin_message(wb, HOOP_MSG_DUMP_REQ);
  put_u16(wb, msg->proof_len);
  put_bytes(wb, msg->proof, msg->proof_len);
  put_str(wb, msg->job, (size_t)job);
  return finish_message(wb, start);
}

int hoop__wire_decode_dump_req(const uint8_t *payload, size_t len, hoop__dump_req *out) {
  reader in = {payload, len, 0};
  memset(out, 0, sizeof *out);
  out->proof_len = get_proof(&in, out->proof);
  get_name(&in, out->job, HOOP__WIRE_MAX_JOB);
  return reader_done(&in) != 0 || !out->job[0] ? -1 : 0;
}

int hoop__wire_encode_dump(hoop__wbuf *wb) {
  return finish_message(wb, begin_message(wb, HOOP_MSG_DUMP));
}

int hoop__wire_decode_dump(const uint8_t *payload, size_t len) {
  (void)payload;
  return len == 0 ? 0 : -1;
}

int hoop__wire_encode_flight(hoop__wbuf *wb, const char *text) {
  size_t len = strnlen(text, HOOP__WIRE_MAX_FLIGHT + 1);
  if (len > HOOP__WIRE_MAX_FLIGHT)
    return -1;
  size_t start = begin_message(wb, HOOP_MSG_FLIGHT);
  put_str(wb, text, len);
  return finish_message(wb, start);
}

int hoop__wire_decode_flight(const uint8_t *payload, size_t len, char *text) {
  reader in = {payload, len, 0};
  get_str(&in, text, HOOP__WIRE_MAX_FLIGHT);
  return reader_done(&in);
}

int hoop__wire_encode_dump_reply(hoop__wbuf *wb, const hoop__dump_reply *msg, size_t text_cap) {
  if (msg->n > HOOP__WIRE_MAX_RANKS || (msg->n > 0 && !msg->entries))
    return -1;
  if (text_cap > HOOP__WIRE_MAX_FLIGHT)
    text_cap = HOOP__WIRE_MAX_FLIGHT;
  size_t start = begin_message(wb, HOOP_MSG_DUMP_REPLY);
  put_u32(wb, msg->n);
  for (uint32_t i = 0; i < msg->n; i++) {
    const hoop__dump_entry *entry = &msg->entries[i];
    if (entry->rank >= HOOP__WIRE_MAX_RANKS)
      return -1;
    size_t len = strnlen(entry->text, sizeof entry->text);
    put_u32(wb, entry->rank);
    put_str(wb, entry->text, len < text_cap ? len : text_cap);
  }
  return finish_message(wb, start);
}

/* Smallest encoding of an entry: its rank and an empty text. */
#define DUMP_ENTRY_MIN 6

int hoop__wire_decode_dump_reply(const uint8_t *payload, size_t len, hoop__dump_reply *out) {
  reader in = {payload, len, 0};
  memset(out, 0, sizeof *out);
  uint32_t n = get_u32(&in);
  if (in.bad || n > HOOP__WIRE_MAX_RANKS || in.left / DUMP_ENTRY_MIN < n)
    return -1;
  hoop__dump_entry *entries = n ? calloc(n, sizeof *entries) : NULL;
  if (n && !entries)
    return -1;
  for (uint32_t i = 0; i < n && !in.bad; i++) {
    entries[i].rank = get_u32(&in);
    if (entries[i].rank >= HOOP__WIRE_MAX_RANKS)
      in.bad = 1;
    get_str(&in, entries[i].text, HOOP__WIRE_MAX_FLIGHT);
  }
  if (reader_done(&in) != 0) {
    free(entries);
    return -1;
  }
  out->n = n;
  out->entries = entries;
  return 0;
}

void hoop__dump_reply_free(hoop__dump_reply *reply) {
  free(reply->entries);
  reply->entries = NULL;
  reply->n = 0;
}
