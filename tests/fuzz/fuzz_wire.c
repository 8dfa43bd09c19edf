/* fuzz_wire.c - libFuzzer target for the rendezvous wire decoders: any byte string is decoded as a
 * message (header, then the payload by its type); whatever decodes must encode back to exactly the
 * same bytes. A crash, a sanitizer report or a round-trip difference is a bug. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "proto/wire.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Re-encode what was decoded and insist on the input's exact bytes. */
static void expect_same(const hoop__wbuf *wb, const uint8_t *data, size_t size) {
  if (wb->failed || wb->len != size || memcmp(wb->data, data, size) != 0)
    abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  hoop__wire_header header;
  if (hoop__wire_decode_header(data, size, HOOP__WIRE_MAX_PAYLOAD, &header) != 0)
    return 0;
  if (size != HOOP__WIRE_HEADER_SIZE + (size_t)header.length)
    return 0;
  const uint8_t *payload = data + HOOP__WIRE_HEADER_SIZE;
  hoop__wbuf wb = {0};
  switch (header.type) {
  case HOOP_MSG_HELLO: {
    hoop__hello hello;
    if (hoop__wire_decode_hello(payload, header.length, &hello) == 0) {
      if (hoop__wire_encode_hello(&wb, &hello) != 0)
        abort();
      expect_same(&wb, data, size);
    }
    break;
  }
  case HOOP_MSG_TABLE: {
    hoop__table table;
    if (hoop__wire_decode_table(payload, header.length, &table) == 0) {
      if (hoop__wire_encode_table(&wb, &table) != 0)
        abort();
      expect_same(&wb, data, size);
      hoop__table_free(&table);
    }
    break;
  }
  case HOOP_MSG_ERROR: {
    hoop__error_msg error;
    if (hoop__wire_decode_error(payload, header.length, &error) == 0) {
      if (hoop__wire_encode_error(&wb, &error) != 0)
        abort();
      expect_same(&wb, data, size);
    }
    break;
  }
  case HOOP_MSG_STATUS: {
    hoop__status status;
    if (hoop__wire_decode_status(payload, header.length, &status) == 0) {
      if (hoop__wire_encode_status(&wb, &status) != 0)
        abort();
      expect_same(&wb, data, size);
      hoop__status_free(&status);
    }
    break;
  }
  case HOOP_MSG_STATUS_REQ: {
    hoop__status_req request;
    if (hoop__wire_decode_status_req(payload, header.length, &request) == 0) {
      if (hoop__wire_encode_status_req(&wb, &request) != 0)
        abort();
      expect_same(&wb, data, size);
    }
    break;
  }
  case HOOP_MSG_CHALLENGE: {
    hoop__challenge challenge;
    if (hoop__wire_decode_challenge(payload, header.length, &challenge) == 0) {
      if (hoop__wire_encode_challenge(&wb, &challenge) != 0)
        abort();
      expect_same(&wb, data, size);
    }
    break;
  }
  case HOOP_MSG_ABORT: {
    hoop__abort_msg abort_msg;
    if (hoop__wire_decode_abort(payload, header.length, &abort_msg) == 0) {
      if (hoop__wire_encode_abort(&wb, &abort_msg) != 0)
        abort();
      expect_same(&wb, data, size);
    }
    break;
  }
  case HOOP_MSG_BYE:
    if (hoop__wire_decode_bye(payload, header.length) == 0) {
      if (hoop__wire_encode_bye(&wb) != 0)
        abort();
      expect_same(&wb, data, size);
    }
    break;
  case HOOP_MSG_NOTICE: {
    hoop__notice notice;
    if (hoop__wire_decode_notice(payload, header.length, &notice) == 0) {
      if (hoop__wire_encode_notice(&wb, &notice) != 0)
        abort();
      expect_same(&wb, data, size);
    }
    break;
  }
  case HOOP_MSG_SHRINK: {
    hoop__shrink_msg shrink;
    if (hoop__wire_decode_shrink(payload, header.length, &shrink) == 0) {
      if (hoop__wire_encode_shrink(&wb, &shrink) != 0)
        abort();
      expect_same(&wb, data, size);
    }
    break;
  }
  case HOOP_MSG_TABLE_PROOF: {
    hoop__table_proof proof;
    if (hoop__wire_decode_table_proof(payload, header.length, &proof) == 0) {
      if (hoop__wire_encode_table_proof(&wb, &proof) != 0)
        abort();
      expect_same(&wb, data, size);
    }
    break;
  }
  case HOOP_MSG_STATS: {
    hoop__stats_msg stats;
    if (hoop__wire_decode_stats(payload, header.length, &stats) == 0) {
      if (hoop__wire_encode_stats(&wb, &stats) != 0)
        abort();
      expect_same(&wb, data, size);
    }
    break;
  }
  case HOOP_MSG_DUMP_REQ: {
    hoop__dump_req req;
    if (hoop__wire_decode_dump_req(payload, header.length, &req) == 0) {
      if (hoop__wire_encode_dump_req(&wb, &req) != 0)
        abort();
      expect_same(&wb, data, size);
    }
    break;
  }
  case HOOP_MSG_FLIGHT: {
    static char text[HOOP__WIRE_MAX_FLIGHT + 1];
    if (hoop__wire_decode_flight(payload, header.length, text) == 0) {
      if (hoop__wire_encode_flight(&wb, text) != 0)
        abort();
      expect_same(&wb, data, size);
    }
    break;
  }
  case HOOP_MSG_DUMP_REPLY: {
    hoop__dump_reply reply;
    if (hoop__wire_decode_dump_reply(payload, header.length, &reply) == 0) {
      if (hoop__wire_encode_dump_reply(&wb, &reply, HOOP__WIRE_MAX_FLIGHT) != 0)
        abort();
      hoop__dump_reply_free(&reply);
      expect_same(&wb, data, size);
    }
    break;
  }
  case HOOP_MSG_VIEW: {
    hoop__view_msg view;
    if (hoop__wire_decode_view(payload, header.length, HOOP__WIRE_MAX_RANKS, &view) == 0) {
      if (hoop__wire_encode_view(&wb, &view) != 0)
        abort();
      expect_same(&wb, data, size);
    }
    break;
  }
  default: break;
  }
  hoop__wbuf_free(&wb);
  return 0;
}
