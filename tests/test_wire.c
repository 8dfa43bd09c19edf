/* test_wire.c - the rendezvous wire format: every message survives a round trip, and the decoders
 * refuse (without crashing) truncated, oversized, out-of-range, NUL-carrying, trailing and random
 * input. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hoop.h"
#include "proto/wire.h"
#include "util/be.h"

/* ---- helpers --------------------------------------------------------------------------------- */

/* A deterministic generator, so that a failing random input can be reproduced. */
static uint64_t rng_state;

static uint32_t rng_next(void) {
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return (uint32_t)(rng_state >> 16);
}

static void sample_hello(hoop__hello *hello, int32_t rank) {
  memset(hello, 0, sizeof *hello);
  snprintf(hello->job, sizeof hello->job, "train-42");
  hello->size = 8;
  hello->rank = rank;
  hello->timeout_ms = 300000;
  snprintf(hello->host, sizeof hello->host, "node-a.example");
  snprintf(hello->addr, sizeof hello->addr, "10.0.0.7:41234");
  hello->proof_len = 32;
  for (int i = 0; i < 32; i++)
    hello->proof[i] = (uint8_t)(i * 7 + 1);
  for (int i = 0; i < HOOP__WIRE_CHALLENGE; i++)
    hello->nonce[i] = (uint8_t)(200 - i);
  for (int i = 0; i < HOOP__WIRE_KEY; i++)
    hello->key[i] = (uint8_t)(i * 5 + 3);
  hello->flags = HOOP__HELLO_SEALED;
}

/* A table of size ranks, two hosts; the caller frees peers. */
static void sample_table(hoop__table *table, uint32_t size, uint32_t rank) {
  memset(table, 0, sizeof *table);
  table->size = size;
  table->rank = rank;
  for (int i = 0; i < HOOP__WIRE_NONCE; i++)
    table->nonce[i] = (uint8_t)(0xa0 + i);
  table->peers = calloc(size, sizeof *table->peers);
  ck_assert_ptr_nonnull(table->peers);
  uint32_t first_host = (size + 1) / 2;
  for (uint32_t r = 0; r < size; r++) {
    hoop__peer_entry *peer = &table->peers[r];
    int on_first = r < first_host;
    snprintf(peer->host, sizeof peer->host, "%s", on_first ? "node-a" : "node-b");
    snprintf(peer->addr, sizeof peer->addr, "10.0.0.%u:%u", on_first ? 1u : 2u, 40000u + r);
    peer->local_rank = on_first ? r : r - first_host;
    peer->local_size = on_first ? first_host : size - first_host;
  }
}

static void sample_error(hoop__error_msg *error) {
  memset(error, 0, sizeof *error);
  error->code = HOOP_ERR_TIMEOUT;
  snprintf(error->message, sizeof error->message,
           "rendezvous for job 'x' timed out after 5 s: 1 of 2 ranks joined; missing ranks: 1");
}

/* Two jobs: one with missing ranks listed, one without. */
static void sample_status(hoop__status *status, hoop__job_status jobs[2]) {
  memset(jobs, 0, 2 * sizeof jobs[0]);
  snprintf(jobs[0].job, sizeof jobs[0].job, "alpha");
  jobs[0].size = 4;
  jobs[0].joined = 2;
  jobs[0].waited_ms = 1500;
  jobs[0].nmissing = 2;
  jobs[0].missing[0] = 1;
  jobs[0].missing[1] = 3;
  jobs[0].nhosts = 2;
  snprintf(jobs[0].hosts[0].name, sizeof jobs[0].hosts[0].name, "node-a");
  jobs[0].hosts[0].ranks = 1;
  snprintf(jobs[0].hosts[1].name, sizeof jobs[0].hosts[1].name, "node-b");
  jobs[0].hosts[1].ranks = 1;
  snprintf(jobs[1].job, sizeof jobs[1].job, "beta");
  jobs[1].size = 16;
  jobs[1].joined = 5;
  jobs[1].waited_ms = 70000;
  jobs[1].health = (hoop__job_health){.running = 1,
                                      .reporting = 5,
                                      .calls_per_s = 812,
                                      .wait_permille = 431,
                                      .calls = 64,
                                      .nlate = 2,
                                      .late = {{3, 5100, 5900, 6200}, {0, 10, 300, 310}},
                                      .nlinks = 1,
                                      .links = {{3, 0, 65536, 500}}};
  status->njobs = 2;
  status->jobs = jobs;
}

/* Check the header of an encoded message and return a pointer to its payload. */
static const uint8_t *payload_of(const hoop__wbuf *wb, hoop__msg_type type) {
  hoop__wire_header header;
  ck_assert_msg(!wb->failed, "encoder: expected success, the buffer says it failed");
  int rc =
      hoop__wire_decode_header(((uint8_t *)wb->data), wb->len, HOOP__WIRE_MAX_PAYLOAD, &header);
  ck_assert_msg(rc == 0, "header of an encoded message: expected 0, got %d", rc);
  ck_assert_msg(header.type == type, "header type: expected %d, got %u", (int)type, header.type);
  ck_assert_msg(header.length == wb->len - HOOP__WIRE_HEADER_SIZE,
                "header length: expected %zu, got %u", wb->len - HOOP__WIRE_HEADER_SIZE,
                header.length);
  return ((uint8_t *)wb->data) + HOOP__WIRE_HEADER_SIZE;
}

static void sample_abort(hoop__abort_msg *msg) {
  memset(msg, 0, sizeof *msg);
  msg->rank = 3;
  snprintf(msg->reason, sizeof msg->reason, "loss is NaN at step 812");
}

static void sample_notice(hoop__notice *msg) {
  memset(msg, 0, sizeof *msg);
  msg->code = HOOP_ERR_ABORTED;
  msg->origin = 3;
  snprintf(msg->message, sizeof msg->message, "aborted by rank 3: loss is NaN at step 812");
}

static void sample_shrink(hoop__shrink_msg *msg) {
  memset(msg, 0, sizeof *msg);
  msg->generation = 2;
  msg->rank = 5;
  msg->timeout_ms = 30000;
  snprintf(msg->addr, sizeof msg->addr, "tcp=10.0.0.7:41000");
  msg->naccused = 2;
  msg->accused[0] = 3;
  msg->accused[1] = 6;
}

/* A STATS of three calls, and a VIEW naming two ranks of a job of 5. */
static void sample_stats(hoop__stats_msg *msg) {
  memset(msg, 0, sizeof *msg);
  *msg = (hoop__stats_msg){
      .calls = 1234567890123ull,
      .bytes = 0x0102030405060708ull,
      .in_calls_us = 700000,
      .waited_us = 650000,
      .since_us = 1000000,
      .clock = 0x8877665544332211ull,
      .nsamples = 3,
      .samples = {{40, 5000, 0xfffff000u}, {41, 5100, 0x00001234u}, {0xfffffff0u, 4900, 77}},
      .nlinks = 1,
      .links = {{.from = 2, .bytes = 1048576, .us = 8000}}};
}

static void sample_view(hoop__view_msg *msg) {
  memset(msg, 0, sizeof *msg);
  *msg = (hoop__view_msg){.calls = 63,
                          .reporting = 5,
                          .nlate = 2,
                          .late = {{3, 5100, 5900, 6200}, {4, 0, 0, 7}},
                          .nlinks = 1,
                          .links = {{.from = 2, .to = 4, .bytes = 1048576, .us = 8000}}};
}

static hoop__dump_entry sample_entries[2] = {
    {0, "rank 0 (pid 7 on vm): in hoop_allreduce (call #3) for 0.006 s, waiting for rank 1\n"},
    {1, "(no answer within 5 s)"}};

/* Decode payload as type; 0 or -1 as the decoder says, with anything allocated freed. */
static int decode_as(hoop__msg_type type, const uint8_t *payload, size_t len) {
  hoop__hello hello;
  hoop__table table;
  hoop__error_msg error;
  hoop__status status;
  hoop__abort_msg abort_msg;
  hoop__notice notice;
  hoop__shrink_msg shrink;
  hoop__stats_msg stats;
  hoop__view_msg view;
  hoop__dump_req dump_req;
  hoop__dump_reply dump_reply;
  char flight[HOOP__WIRE_MAX_FLIGHT + 1];
  int rc = -1;
  switch (type) {
  case HOOP_MSG_HELLO: rc = hoop__wire_decode_hello(payload, len, &hello); break;
  case HOOP_MSG_DUMP_REQ: rc = hoop__wire_decode_dump_req(payload, len, &dump_req); break;
  case HOOP_MSG_FLIGHT: rc = hoop__wire_decode_flight(payload, len, flight); break;
  case HOOP_MSG_DUMP_REPLY:
    rc = hoop__wire_decode_dump_reply(payload, len, &dump_reply);
    if (rc == 0)
      hoop__dump_reply_free(&dump_reply);
    break;
  case HOOP_MSG_STATS: rc = hoop__wire_decode_stats(payload, len, &stats); break;
  case HOOP_MSG_VIEW: rc = hoop__wire_decode_view(payload, len, 5, &view); break;
  case HOOP_MSG_TABLE:
    rc = hoop__wire_decode_table(payload, len, &table);
    if (rc == 0)
      hoop__table_free(&table);
    break;
  case HOOP_MSG_ERROR: rc = hoop__wire_decode_error(payload, len, &error); break;
  case HOOP_MSG_STATUS:
    rc = hoop__wire_decode_status(payload, len, &status);
    if (rc == 0)
      hoop__status_free(&status);
    break;
  case HOOP_MSG_ABORT: rc = hoop__wire_decode_abort(payload, len, &abort_msg); break;
  case HOOP_MSG_NOTICE: rc = hoop__wire_decode_notice(payload, len, &notice); break;
  case HOOP_MSG_SHRINK: rc = hoop__wire_decode_shrink(payload, len, &shrink); break;
  default: ck_abort_msg("decode_as: no decoder for type %d", (int)type);
  }
  return rc;
}

/* One valid encoding of each message type that has a payload decoder. */
static void encode_sample(hoop__msg_type type, hoop__wbuf *wb) {
  hoop__hello hello;
  hoop__table table;
  hoop__error_msg error;
  hoop__status status;
  hoop__job_status jobs[2];
  hoop__abort_msg abort_msg;
  hoop__notice notice;
  hoop__shrink_msg shrink;
  hoop__stats_msg stats;
  hoop__view_msg view;
  hoop__dump_req dump_req = {.proof_len = 32, .proof = {1, 2}, .job = "run7"};
  hoop__dump_reply dump_reply = {.n = 2, .entries = sample_entries};
  int rc = -1;
  switch (type) {
  case HOOP_MSG_DUMP_REQ: rc = hoop__wire_encode_dump_req(wb, &dump_req); break;
  case HOOP_MSG_FLIGHT: rc = hoop__wire_encode_flight(wb, sample_entries[0].text); break;
  case HOOP_MSG_DUMP_REPLY: rc = hoop__wire_encode_dump_reply(wb, &dump_reply, 4096); break;
  case HOOP_MSG_STATS:
    sample_stats(&stats);
    rc = hoop__wire_encode_stats(wb, &stats);
    break;
  case HOOP_MSG_VIEW:
    sample_view(&view);
    rc = hoop__wire_encode_view(wb, &view);
    break;
  case HOOP_MSG_HELLO:
    sample_hello(&hello, 3);
    rc = hoop__wire_encode_hello(wb, &hello);
    break;
  case HOOP_MSG_TABLE:
    sample_table(&table, 5, 2);
    rc = hoop__wire_encode_table(wb, &table);
    free(table.peers);
    break;
  case HOOP_MSG_ERROR:
    sample_error(&error);
    rc = hoop__wire_encode_error(wb, &error);
    break;
  case HOOP_MSG_STATUS:
    sample_status(&status, jobs);
    rc = hoop__wire_encode_status(wb, &status);
    break;
  case HOOP_MSG_ABORT:
    sample_abort(&abort_msg);
    rc = hoop__wire_encode_abort(wb, &abort_msg);
    break;
  case HOOP_MSG_NOTICE:
    sample_notice(&notice);
    rc = hoop__wire_encode_notice(wb, &notice);
    break;
  case HOOP_MSG_SHRINK:
    sample_shrink(&shrink);
    rc = hoop__wire_encode_shrink(wb, &shrink);
    break;
  default: ck_abort_msg("encode_sample: no sample for type %d", (int)type);
  }
  ck_assert_msg(rc == 0, "encoding the sample of type %d: expected 0, got %d", (int)type, rc);
}

static const hoop__msg_type decoded_types[] = {
    HOOP_MSG_HELLO, HOOP_MSG_TABLE,    HOOP_MSG_ERROR,  HOOP_MSG_STATUS,
    HOOP_MSG_ABORT, HOOP_MSG_NOTICE,   HOOP_MSG_SHRINK, HOOP_MSG_STATS,
    HOOP_MSG_VIEW,  HOOP_MSG_DUMP_REQ, HOOP_MSG_FLIGHT, HOOP_MSG_DUMP_REPLY};
#define NDECODED (sizeof decoded_types / sizeof decoded_types[0])

/* ---- round trips ----------------------------------------------------------------------------- */

START_TEST(test_hello_round_trip) {
  int32_t ranks[] = {-1, 0, 7};
  for (int i = 0; i < 3; i++) {
    hoop__hello in, out;
    hoop__wbuf wb = {0};
    sample_hello(&in, ranks[i]);
    ck_assert_int_eq(hoop__wire_encode_hello(&wb, &in), 0);
    const uint8_t *payload = payload_of(&wb, HOOP_MSG_HELLO);
    int rc = hoop__wire_decode_hello(payload, wb.len - HOOP__WIRE_HEADER_SIZE, &out);
    ck_assert_msg(rc == 0, "decoding a valid HELLO (rank %d): expected 0, got %d", ranks[i], rc);
    ck_assert_str_eq(out.job, in.job);
    ck_assert_uint_eq(out.size, in.size);
    ck_assert_int_eq(out.rank, in.rank);
    ck_assert_uint_eq(out.timeout_ms, in.timeout_ms);
    ck_assert_str_eq(out.host, in.host);
    ck_assert_str_eq(out.addr, in.addr);
    ck_assert_uint_eq(out.proof_len, in.proof_len);
    ck_assert_msg(memcmp(out.proof, in.proof, in.proof_len) == 0, "HELLO proof bytes differ");
    ck_assert_msg(memcmp(out.nonce, in.nonce, sizeof in.nonce) == 0, "HELLO nonce bytes differ");
    ck_assert_msg(memcmp(out.key, in.key, sizeof in.key) == 0, "HELLO key bytes differ");
    ck_assert_uint_eq(out.flags, in.flags);
    /* Cut short of its flags, it is malformed. */
    ck_assert_int_eq(hoop__wire_decode_hello(payload, wb.len - HOOP__WIRE_HEADER_SIZE - 1, &out),
                     -1);
    hoop__wbuf_free(&wb);
  }
}
END_TEST

/* The server's proof after a TABLE: its bytes come back; empty or oversized proofs do not. */
/* Names read from a stranger before any proof go into logs: a job id, host name or address with a
 * control byte (a newline would forge a log line) is refused, as a table's host names are. */
START_TEST(test_names_with_control_bytes_refused) {
  const char *bad[] = {"job\nhoopd: forged line", "job\r", "job\x1b[2J", "job\x7f"};
  for (int field = 0; field < 3; field++)
    for (size_t b = 0; b < sizeof bad / sizeof *bad; b++) {
      hoop__hello hello, out;
      sample_hello(&hello, 3);
      char *text = field == 0 ? hello.job : field == 1 ? hello.host : hello.addr;
      snprintf(text, 32, "%s", bad[b]);
      hoop__wbuf wb = {0};
      ck_assert_int_eq(hoop__wire_encode_hello(&wb, &hello), 0);
      const uint8_t *payload = (const uint8_t *)wb.data + HOOP__WIRE_HEADER_SIZE;
      ck_assert_msg(hoop__wire_decode_hello(payload, wb.len - HOOP__WIRE_HEADER_SIZE, &out) == -1,
                    "a HELLO whose field %d is '%s': expected -1", field, bad[b]);
      hoop__wbuf_free(&wb);
    }
  hoop__table table, back;
  sample_table(&table, 2, 0);
  snprintf(table.peers[1].host, sizeof table.peers[1].host, "node\nb");
  hoop__wbuf wb = {0};
  ck_assert_int_eq(hoop__wire_encode_table(&wb, &table), 0);
  ck_assert_int_eq(hoop__wire_decode_table((const uint8_t *)wb.data + HOOP__WIRE_HEADER_SIZE,
                                           wb.len - HOOP__WIRE_HEADER_SIZE, &back),
                   -1);
  hoop__wbuf_free(&wb);
  free(table.peers);
}
END_TEST

START_TEST(test_table_proof_round_trip) {
  hoop__table_proof in = {.proof_len = 32}, out;
  for (int i = 0; i < 32; i++)
    in.proof[i] = (uint8_t)(i * 3);
  hoop__wbuf wb = {0};
  ck_assert_int_eq(hoop__wire_encode_table_proof(&wb, &in), 0);
  const uint8_t *payload = payload_of(&wb, HOOP_MSG_TABLE_PROOF);
  size_t len = wb.len - HOOP__WIRE_HEADER_SIZE;
  ck_assert_int_eq(hoop__wire_decode_table_proof(payload, len, &out), 0);
  ck_assert_uint_eq(out.proof_len, 32);
  ck_assert(memcmp(out.proof, in.proof, 32) == 0);
  ck_assert_int_eq(hoop__wire_decode_table_proof(payload, len - 1, &out), -1);
  uint8_t empty[2] = {0, 0};
  ck_assert_int_eq(hoop__wire_decode_table_proof(empty, sizeof empty, &out), -1);
  hoop__wbuf_free(&wb);
  hoop__wbuf none = {0};
  hoop__table_proof zero = {.proof_len = 0};
  ck_assert_int_eq(hoop__wire_encode_table_proof(&none, &zero), -1);
  hoop__wbuf_free(&none);
}
END_TEST

START_TEST(test_table_round_trip) {
  hoop__table in, out;
  hoop__wbuf wb = {0};
  sample_table(&in, 5, 4);
  ck_assert_int_eq(hoop__wire_encode_table(&wb, &in), 0);
  const uint8_t *payload = payload_of(&wb, HOOP_MSG_TABLE);
  int rc = hoop__wire_decode_table(payload, wb.len - HOOP__WIRE_HEADER_SIZE, &out);
  ck_assert_msg(rc == 0, "decoding a valid TABLE: expected 0, got %d", rc);
  ck_assert_uint_eq(out.size, 5);
  ck_assert_uint_eq(out.rank, 4);
  ck_assert_msg(memcmp(out.nonce, in.nonce, HOOP__WIRE_NONCE) == 0, "TABLE nonce differs");
  for (uint32_t r = 0; r < 5; r++) {
    ck_assert_str_eq(out.peers[r].host, in.peers[r].host);
    ck_assert_str_eq(out.peers[r].addr, in.peers[r].addr);
    ck_assert_uint_eq(out.peers[r].local_rank, in.peers[r].local_rank);
    ck_assert_uint_eq(out.peers[r].local_size, in.peers[r].local_size);
  }
  hoop__table_free(&out);
  ck_assert_ptr_null(out.peers);
  free(in.peers);
  hoop__wbuf_free(&wb);
}
END_TEST

/* A table after a shrink or growth carries its generation at its end (4 bytes more); the first
 * table has none, as before; a generation of 0 written out is malformed. PENDING {newcomers} and a
 * newcomer's HELLO (rank -2) come back intact; rank -3 does not. */
START_TEST(test_generation_pending_newcomer) {
  hoop__table in, out;
  hoop__wbuf plain = {0}, later = {0};
  sample_table(&in, 3, 1);
  ck_assert_int_eq(hoop__wire_encode_table(&plain, &in), 0);
  in.generation = 7;
  ck_assert_int_eq(hoop__wire_encode_table(&later, &in), 0);
  ck_assert_uint_eq(later.len, plain.len + 4);
  const uint8_t *payload = payload_of(&later, HOOP_MSG_TABLE);
  size_t len = later.len - HOOP__WIRE_HEADER_SIZE;
  ck_assert_int_eq(hoop__wire_decode_table(payload, len, &out), 0);
  ck_assert_uint_eq(out.generation, 7);
  hoop__table_free(&out);
  ck_assert_int_eq(hoop__wire_decode_table(payload_of(&plain, HOOP_MSG_TABLE),
                                           plain.len - HOOP__WIRE_HEADER_SIZE, &out),
                   0);
  ck_assert_uint_eq(out.generation, 0);
  hoop__table_free(&out);
  uint8_t zeroed[4096];
  ck_assert_uint_le(len, sizeof zeroed);
  memcpy(zeroed, payload, len);
  memset(zeroed + len - 4, 0, 4);
  ck_assert_int_eq(hoop__wire_decode_table(zeroed, len, &out), -1);
  ck_assert_int_eq(hoop__wire_decode_table(payload, len - 2, &out), -1); /* half a generation */
  free(in.peers);
  hoop__wbuf_free(&plain);
  hoop__wbuf_free(&later);

  hoop__wbuf wb = {0};
  uint32_t newcomers = 0;
  ck_assert_int_eq(hoop__wire_encode_pending(&wb, 3), 0);
  payload = payload_of(&wb, HOOP_MSG_PENDING);
  ck_assert_int_eq(hoop__wire_decode_pending(payload, 4, &newcomers), 0);
  ck_assert_uint_eq(newcomers, 3);
  ck_assert_int_eq(hoop__wire_decode_pending(payload, 3, &newcomers), -1);
  hoop__wbuf_free(&wb);

  hoop__hello hello, back;
  sample_hello(&hello, HOOP__HELLO_NEWCOMER);
  ck_assert_int_eq(hoop__wire_encode_hello(&wb, &hello), 0);
  payload = payload_of(&wb, HOOP_MSG_HELLO);
  ck_assert_int_eq(hoop__wire_decode_hello(payload, wb.len - HOOP__WIRE_HEADER_SIZE, &back), 0);
  ck_assert_int_eq(back.rank, HOOP__HELLO_NEWCOMER);
  hoop__wbuf_free(&wb);
  hello.rank = -3;
  ck_assert_int_eq(hoop__wire_encode_hello(&wb, &hello), -1);
  hoop__wbuf_free(&wb);
}
END_TEST

START_TEST(test_error_round_trip) {
  hoop__error_msg in, out;
  hoop__wbuf wb = {0};
  sample_error(&in);
  ck_assert_int_eq(hoop__wire_encode_error(&wb, &in), 0);
  const uint8_t *payload = payload_of(&wb, HOOP_MSG_ERROR);
  int rc = hoop__wire_decode_error(payload, wb.len - HOOP__WIRE_HEADER_SIZE, &out);
  ck_assert_msg(rc == 0, "decoding a valid ERROR: expected 0, got %d", rc);
  ck_assert_uint_eq(out.code, HOOP_ERR_TIMEOUT);
  ck_assert_str_eq(out.message, in.message);
  hoop__wbuf_free(&wb);
}
END_TEST

/* Without a proof a STATUS_REQ is just an empty blob; with one, the proof comes back intact. */
START_TEST(test_status_req_round_trip) {
  hoop__status_req in = {0}, out;
  hoop__wbuf wb = {0};
  ck_assert_int_eq(hoop__wire_encode_status_req(&wb, &in), 0);
  const uint8_t *payload = payload_of(&wb, HOOP_MSG_STATUS_REQ);
  ck_assert_msg(wb.len == HOOP__WIRE_HEADER_SIZE + 2, "STATUS_REQ: expected %d bytes, got %zu",
                HOOP__WIRE_HEADER_SIZE + 2, wb.len);
  ck_assert_int_eq(hoop__wire_decode_status_req(payload, 2, &out), 0);
  ck_assert_uint_eq(out.proof_len, 0);
  hoop__wbuf_free(&wb);
  in.proof_len = HOOP__WIRE_MAX_PROOF;
  for (int i = 0; i < HOOP__WIRE_MAX_PROOF; i++)
    in.proof[i] = (uint8_t)(255 - i);
  ck_assert_int_eq(hoop__wire_encode_status_req(&wb, &in), 0);
  payload = payload_of(&wb, HOOP_MSG_STATUS_REQ);
  ck_assert_int_eq(hoop__wire_decode_status_req(payload, wb.len - HOOP__WIRE_HEADER_SIZE, &out), 0);
  ck_assert_msg(out.proof_len == in.proof_len && memcmp(out.proof, in.proof, in.proof_len) == 0,
                "STATUS_REQ proof: expected the %u bytes sent, got %u others", in.proof_len,
                out.proof_len);
  hoop__wbuf_free(&wb);
  in.proof_len = HOOP__WIRE_MAX_PROOF + 1;
  ck_assert_msg(hoop__wire_encode_status_req(&wb, &in) == -1,
                "STATUS_REQ with a proof over the limit: expected -1, got 0");
  hoop__wbuf_free(&wb);
  uint8_t truncated[3] = {3, 0, 1}, empty[1] = {0};
  ck_assert_int_eq(hoop__wire_decode_status_req(truncated, sizeof truncated, &out), -1);
  ck_assert_int_eq(hoop__wire_decode_status_req(empty, 0, &out), -1);
}
END_TEST

/* A CHALLENGE carries its flags and all 32 bytes of its nonce; unknown flags and any other
 * length are refused. */
START_TEST(test_challenge_round_trip) {
  hoop__challenge in = {.flags = HOOP__CHALLENGE_AUTH}, out;
  for (int i = 0; i < HOOP__WIRE_CHALLENGE; i++)
    in.nonce[i] = (uint8_t)(i * 13 + 5);
  hoop__wbuf wb = {0};
  ck_assert_int_eq(hoop__wire_encode_challenge(&wb, &in), 0);
  const uint8_t *payload = payload_of(&wb, HOOP_MSG_CHALLENGE);
  size_t len = wb.len - HOOP__WIRE_HEADER_SIZE;
  ck_assert_uint_eq(len, 1 + HOOP__WIRE_CHALLENGE);
  ck_assert_int_eq(hoop__wire_decode_challenge(payload, len, &out), 0);
  ck_assert_msg(out.flags == in.flags && memcmp(out.nonce, in.nonce, sizeof in.nonce) == 0,
                "CHALLENGE: expected the flags and nonce sent, got others");
  ck_assert_int_eq(hoop__wire_decode_challenge(payload, len - 1, &out), -1);
  uint8_t longer[2 + HOOP__WIRE_CHALLENGE] = {0};
  ck_assert_int_eq(hoop__wire_decode_challenge(longer, sizeof longer, &out), -1);
  uint8_t unknown_flag[1 + HOOP__WIRE_CHALLENGE] = {2};
  ck_assert_int_eq(hoop__wire_decode_challenge(unknown_flag, sizeof unknown_flag, &out), -1);
  hoop__wbuf_free(&wb);
  in.flags = 0x80;
  ck_assert_int_eq(hoop__wire_encode_challenge(&wb, &in), -1);
  hoop__wbuf_free(&wb);
}
END_TEST

/* SHRINK {generation, rank, timeout, flags, address, accused ranks} comes back intact; unknown
 * flags, too many accused ranks and ranks past HOOP__WIRE_MAX_RANKS are refused both ways. */
START_TEST(test_shrink_round_trip) {
  hoop__shrink_msg in, out;
  hoop__wbuf wb = {0};
  sample_shrink(&in);
  ck_assert_int_eq(hoop__wire_encode_shrink(&wb, &in), 0);
  const uint8_t *payload = payload_of(&wb, HOOP_MSG_SHRINK);
  size_t len = wb.len - HOOP__WIRE_HEADER_SIZE;
  ck_assert_int_eq(hoop__wire_decode_shrink(payload, len, &out), 0);
  ck_assert_msg(out.generation == 2 && out.rank == 5 && out.timeout_ms == 30000 && out.flags == 0 &&
                    strcmp(out.addr, in.addr) == 0 && out.naccused == 2 && out.accused[0] == 3 &&
                    out.accused[1] == 6,
                "SHRINK: fields changed on the way (generation %u rank %u addr '%s' naccused %u)",
                out.generation, out.rank, out.addr, out.naccused);
  /* One byte short, one byte more. */
  ck_assert_int_eq(hoop__wire_decode_shrink(payload, len - 1, &out), -1);
  uint8_t longer[HOOP__WIRE_MAX_CLIENT_PAYLOAD];
  memcpy(longer, payload, len);
  longer[len] = 0;
  ck_assert_int_eq(hoop__wire_decode_shrink(longer, len + 1, &out), -1);
  hoop__wbuf_free(&wb);
  /* An accused rank out of range, in the payload and in the struct. */
  longer[len - 4] = 0x7f; /* the last accused rank becomes huge */
  ck_assert_int_eq(hoop__wire_decode_shrink(longer, len, &out), -1);
  in.accused[1] = HOOP__WIRE_MAX_RANKS;
  ck_assert_int_eq(hoop__wire_encode_shrink(&wb, &in), -1);
  hoop__wbuf_free(&wb);
  /* A count of accused ranks past the limit, with the bytes for them. */
  sample_shrink(&in);
  in.naccused = HOOP__WIRE_MAX_ACCUSED + 1;
  ck_assert_int_eq(hoop__wire_encode_shrink(&wb, &in), -1);
  hoop__wbuf_free(&wb);
  sample_shrink(&in);
  in.flags = 1;
  ck_assert_int_eq(hoop__wire_encode_shrink(&wb, &in), -1);
  hoop__wbuf_free(&wb);
}
END_TEST

/* ABORT {rank, reason} and NOTICE {code, origin, message} come back intact; a rank or origin
 * past HOOP__WIRE_MAX_RANKS, a code 0 and an over-long text are refused by encoder and decoder. */
START_TEST(test_abort_and_notice_round_trip) {
  hoop__abort_msg abort_in, abort_out;
  hoop__notice notice_in, notice_out;
  hoop__wbuf wb = {0};
  sample_abort(&abort_in);
  ck_assert_int_eq(hoop__wire_encode_abort(&wb, &abort_in), 0);
  const uint8_t *payload = payload_of(&wb, HOOP_MSG_ABORT);
  size_t len = wb.len - HOOP__WIRE_HEADER_SIZE;
  ck_assert_int_eq(hoop__wire_decode_abort(payload, len, &abort_out), 0);
  ck_assert_msg(abort_out.rank == 3 && strcmp(abort_out.reason, abort_in.reason) == 0,
                "ABORT: expected rank 3 and '%s', got rank %u and '%s'", abort_in.reason,
                abort_out.rank, abort_out.reason);
  uint8_t far_rank[6] = {0x00, 0x40, 0, 0, 0, 0}; /* rank 16384, empty reason */
  ck_assert_int_eq(hoop__wire_decode_abort(far_rank, sizeof far_rank, &abort_out), -1);
  hoop__wbuf_free(&wb);
  abort_in.rank = HOOP__WIRE_MAX_RANKS;
  ck_assert_int_eq(hoop__wire_encode_abort(&wb, &abort_in), -1);
  hoop__wbuf_free(&wb);

  sample_notice(&notice_in);
  ck_assert_int_eq(hoop__wire_encode_notice(&wb, &notice_in), 0);
  payload = payload_of(&wb, HOOP_MSG_NOTICE);
  len = wb.len - HOOP__WIRE_HEADER_SIZE;
  ck_assert_int_eq(hoop__wire_decode_notice(payload, len, &notice_out), 0);
  ck_assert_msg(notice_out.code == HOOP_ERR_ABORTED && notice_out.origin == 3 &&
                    strcmp(notice_out.message, notice_in.message) == 0,
                "NOTICE: expected code %d, origin 3, '%s'; got code %u, origin %u, '%s'",
                HOOP_ERR_ABORTED, notice_in.message, notice_out.code, notice_out.origin,
                notice_out.message);
  uint8_t code_zero[10] = {0};
  ck_assert_int_eq(hoop__wire_decode_notice(code_zero, sizeof code_zero, &notice_out), -1);
  hoop__wbuf_free(&wb);
  notice_in.code = 0;
  ck_assert_int_eq(hoop__wire_encode_notice(&wb, &notice_in), -1);
  hoop__wbuf_free(&wb);
  notice_in.code = HOOP_ERR_PEER_LOST;
  memset(notice_in.message, 'x', sizeof notice_in.message - 1);
  notice_in.message[sizeof notice_in.message - 1] = '\0';
  ck_assert_int_eq(hoop__wire_encode_notice(&wb, &notice_in), 0); /* exactly at the limit */
  hoop__wbuf_free(&wb);
}
END_TEST

/* A BYE is a header alone: any payload byte makes it malformed. */
START_TEST(test_bye_is_empty) {
  hoop__wbuf wb = {0};
  ck_assert_int_eq(hoop__wire_encode_bye(&wb), 0);
  ck_assert_msg(wb.len == HOOP__WIRE_HEADER_SIZE, "BYE: expected %d bytes, got %zu",
                HOOP__WIRE_HEADER_SIZE, wb.len);
  hoop__wire_header header;
  ck_assert_int_eq(hoop__wire_decode_header(((uint8_t *)wb.data), wb.len, 0, &header), 0);
  ck_assert_uint_eq(header.type, HOOP_MSG_BYE);
  ck_assert_int_eq(hoop__wire_decode_bye(NULL, 0), 0);
  uint8_t extra = 0;
  ck_assert_int_eq(hoop__wire_decode_bye(&extra, 1), -1);
  hoop__wbuf_free(&wb);
}
END_TEST

START_TEST(test_status_round_trip) {
  hoop__status in, out;
  hoop__job_status jobs[2];
  hoop__wbuf wb = {0};
  sample_status(&in, jobs);
  ck_assert_int_eq(hoop__wire_encode_status(&wb, &in), 0);
  const uint8_t *payload = payload_of(&wb, HOOP_MSG_STATUS);
  int rc = hoop__wire_decode_status(payload, wb.len - HOOP__WIRE_HEADER_SIZE, &out);
  ck_assert_msg(rc == 0, "decoding a valid STATUS: expected 0, got %d", rc);
  ck_assert_uint_eq(out.njobs, 2);
  for (int j = 0; j < 2; j++) {
    ck_assert_str_eq(out.jobs[j].job, jobs[j].job);
    ck_assert_uint_eq(out.jobs[j].size, jobs[j].size);
    ck_assert_uint_eq(out.jobs[j].joined, jobs[j].joined);
    ck_assert_uint_eq(out.jobs[j].waited_ms, jobs[j].waited_ms);
    ck_assert_uint_eq(out.jobs[j].nmissing, jobs[j].nmissing);
    for (uint32_t m = 0; m < jobs[j].nmissing; m++)
      ck_assert_int_eq(out.jobs[j].missing[m], jobs[j].missing[m]);
    ck_assert_uint_eq(out.jobs[j].nhosts, jobs[j].nhosts);
    for (uint32_t h = 0; h < jobs[j].nhosts; h++) {
      ck_assert_str_eq(out.jobs[j].hosts[h].name, jobs[j].hosts[h].name);
      ck_assert_uint_eq(out.jobs[j].hosts[h].ranks, jobs[j].hosts[h].ranks);
    }
  }
  hoop__status_free(&out);
  hoop__wbuf_free(&wb);
}
END_TEST

/* A status whose hosts claim more ranks than joined, or list a host with none, is refused by the
 * encoder and by the decoder alike. */
/* STATS and VIEW survive a round trip, and their bytes are the ones committed here: a change to
 * the encoder and the decoder together, which a round trip cannot see, breaks them against a
 * hoopd of this version. */
static const char stats_bytes[] = /* header, six u64, the count, three {seq, wait, came}, a link */
    "484f4f500007000d00000070"
    "0000011f71fb04cb"
    "0102030405060708"
    "00000000000aae60"
    "000000000009eb10"
    "00000000000f4240"
    "8877665544332211"
    "00000003"
    "0000002800001388fffff000"
    "00000029000013ec00001234"
    "fffffff0000013240000004d"
    "00000001"
    "00000002"
    "0000000000100000"
    "0000000000001f40";
static const char view_bytes[] = /* header, calls, reporting, count, two late ranks, a link */
    "484f4f500007000e00000048"
    "0000003f"
    "00000005"
    "00000002"
    "00000003000013ec0000170c00001838"
    "00000004000000000000000000000007"
    "00000001"
    "00000002"
    "00000004"
    "0000000000100000"
    "0000000000001f40";

static void expect_bytes(const hoop__wbuf *wb, const char *hex, const char *what) {
  char got[2 * 1024 + 1] = "";
  ck_assert(wb->len * 2 < sizeof got);
  for (size_t i = 0; i < wb->len; i++)
    snprintf(got + 2 * i, 3, "%02x", ((const uint8_t *)wb->data)[i]);
  ck_assert_msg(strcmp(got, hex) == 0, "%s: expected the bytes\n%s\ngot\n%s", what, hex, got);
}

/* A HELLO's flags: one this version does not know is refused both ways. */
START_TEST(test_hello_flags) {
  hoop__hello hello, back;
  sample_hello(&hello, 3);
  hoop__wbuf wb = {0};
  ck_assert_int_eq(hoop__wire_encode_hello(&wb, &hello), 0);
  const uint8_t *payload = payload_of(&wb, HOOP_MSG_HELLO);
  uint8_t *flags = (uint8_t *)wb.data + wb.len - 1;
  *flags = 2;
  ck_assert_int_eq(hoop__wire_decode_hello(payload, wb.len - HOOP__WIRE_HEADER_SIZE, &back), -1);
  hoop__wbuf_free(&wb);
  hello.flags = 2;
  ck_assert_int_eq(hoop__wire_encode_hello(&wb, &hello), -1);
  hoop__wbuf_free(&wb);
}
END_TEST

/* ---- every message's bytes, committed ------------------------------------------------------- */

/* One encoding of every message type, its bytes written down here: a change to an encoder and its
 * decoder together (a field moved, a byte order turned), which round trips cannot see, breaks
 * them, as it would break this version against an installed hoopd. Each is decoded from these
 * bytes too. HOOP_TEST_PRINT_GOLDEN=1 prints the encoder's bytes instead, to write a deliberate
 * change of the protocol (with its version) down. */
typedef struct golden {
  hoop__msg_type type;
  const char *hex;
} golden;
#include "wire_golden.h"

/* The messages decoded_types lacks: fixed samples, encoded. */
static void encode_other(hoop__msg_type type, hoop__wbuf *wb) {
  hoop__status_req status_req = {.proof_len = 32};
  hoop__challenge challenge = {.flags = HOOP__CHALLENGE_AUTH};
  hoop__table_proof table_proof = {.proof_len = 32};
  for (int i = 0; i < 32; i++) {
    status_req.proof[i] = (uint8_t)(i + 9);
    challenge.nonce[i] = (uint8_t)(i * 3);
    table_proof.proof[i] = (uint8_t)(255 - i);
  }
  int rc = -1;
  switch (type) {
  case HOOP_MSG_STATUS_REQ: rc = hoop__wire_encode_status_req(wb, &status_req); break;
  case HOOP_MSG_CHALLENGE: rc = hoop__wire_encode_challenge(wb, &challenge); break;
  case HOOP_MSG_BYE: rc = hoop__wire_encode_bye(wb); break;
  case HOOP_MSG_PENDING: rc = hoop__wire_encode_pending(wb, 3); break;
  case HOOP_MSG_TABLE_PROOF: rc = hoop__wire_encode_table_proof(wb, &table_proof); break;
  case HOOP_MSG_DUMP: rc = hoop__wire_encode_dump(wb); break;
  default: encode_sample(type, wb); return;
  }
  ck_assert_msg(rc == 0, "encoding the sample of type %d: expected 0, got %d", (int)type, rc);
}

static int decode_other(hoop__msg_type type, const uint8_t *payload, size_t len) {
  hoop__status_req status_req;
  hoop__challenge challenge;
  hoop__table_proof table_proof;
  uint32_t newcomers = 0;
  switch (type) {
  case HOOP_MSG_STATUS_REQ: return hoop__wire_decode_status_req(payload, len, &status_req);
  case HOOP_MSG_CHALLENGE: return hoop__wire_decode_challenge(payload, len, &challenge);
  case HOOP_MSG_BYE: return hoop__wire_decode_bye(payload, len);
  case HOOP_MSG_PENDING:
    return hoop__wire_decode_pending(payload, len, &newcomers) != 0 || newcomers != 3 ? -1 : 0;
  case HOOP_MSG_TABLE_PROOF: return hoop__wire_decode_table_proof(payload, len, &table_proof);
  case HOOP_MSG_DUMP: return hoop__wire_decode_dump(payload, len);
  default: return decode_as(type, payload, len);
  }
}

START_TEST(test_golden_bytes) {
  int print = getenv("HOOP_TEST_PRINT_GOLDEN") != NULL;
  ck_assert_uint_eq(sizeof goldens / sizeof goldens[0], HOOP__MSG_LAST);
  for (size_t g = 0; g < sizeof goldens / sizeof goldens[0]; g++) {
    hoop__wbuf wb = {0};
    encode_other(goldens[g].type, &wb);
    if (print) {
      printf("    {%d, \"", (int)goldens[g].type);
      for (size_t i = 0; i < wb.len; i++)
        printf("%02x%s", ((const uint8_t *)wb.data)[i],
               i + 1 < wb.len && (i + 1) % 44 == 0 ? "\"\n     \"" : "");
      printf("\"},\n");
      hoop__wbuf_free(&wb);
      continue;
    }
    char what[32];
    snprintf(what, sizeof what, "message type %d", (int)goldens[g].type);
    expect_bytes(&wb, goldens[g].hex, what);
    size_t len = strlen(goldens[g].hex) / 2;
    uint8_t *bytes = malloc(len);
    for (size_t i = 0; i < len; i++)
      ck_assert_int_eq(sscanf(goldens[g].hex + 2 * i, "%2hhx", &bytes[i]), 1);
    ck_assert_int_eq(hoop__get_be16(bytes + 6), goldens[g].type);
    ck_assert_msg(decode_other(goldens[g].type, bytes + HOOP__WIRE_HEADER_SIZE,
                               len - HOOP__WIRE_HEADER_SIZE) == 0,
                  "the committed bytes of message type %d do not decode", (int)goldens[g].type);
    free(bytes);
    hoop__wbuf_free(&wb);
  }
}
END_TEST

START_TEST(test_stats_and_view_round_trip) {
  hoop__stats_msg stats, stats_back;
  sample_stats(&stats);
  hoop__wbuf wb = {0};
  ck_assert_int_eq(hoop__wire_encode_stats(&wb, &stats), 0);
  const uint8_t *payload = payload_of(&wb, HOOP_MSG_STATS);
  ck_assert_int_eq(hoop__wire_decode_stats(payload, wb.len - HOOP__WIRE_HEADER_SIZE, &stats_back),
                   0);
  ck_assert(memcmp(&stats, &stats_back, sizeof stats) == 0);
  expect_bytes(&wb, stats_bytes, "STATS");
  hoop__wbuf_free(&wb);

  hoop__view_msg view, view_back;
  sample_view(&view);
  ck_assert_int_eq(hoop__wire_encode_view(&wb, &view), 0);
  payload = payload_of(&wb, HOOP_MSG_VIEW);
  size_t len = wb.len - HOOP__WIRE_HEADER_SIZE;
  ck_assert_int_eq(hoop__wire_decode_view(payload, len, 5, &view_back), 0);
  ck_assert(memcmp(&view, &view_back, sizeof view) == 0);
  expect_bytes(&wb, view_bytes, "VIEW");
  /* Ranks outside the job, more reporting than ranks. */
  ck_assert_int_eq(hoop__wire_decode_view(payload, len, 4, &view_back), -1);
  ck_assert_int_eq(hoop__wire_decode_view(payload, len, 3, &view_back), -1);
  hoop__wbuf_free(&wb);
}
END_TEST

/* What a STATS or a VIEW may not say: calls out of order or twice, more samples than fit,
 * waiting longer than the calls took or the calls longer than the time measured, a late rank
 * whose median passes its p99 or its p99 its maximum, a link from a rank to itself or with
 * nothing measured, more links than fit. */
START_TEST(test_stats_and_view_refusals) {
  hoop__stats_msg stats;
  hoop__wbuf wb = {0};
  sample_stats(&stats);
  stats.samples[1].seq = 40;
  ck_assert_int_eq(hoop__wire_encode_stats(&wb, &stats), -1);
  sample_stats(&stats);
  stats.nsamples = HOOP__WIRE_STATS_SAMPLES + 1;
  ck_assert_int_eq(hoop__wire_encode_stats(&wb, &stats), -1);
  struct {
    uint64_t in_calls, waited, since;
  } bad[] = {{100, 101, 1000}, {1001, 10, 1000}};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    sample_stats(&stats);
    stats.in_calls_us = bad[i].in_calls;
    stats.waited_us = bad[i].waited;
    stats.since_us = bad[i].since;
    hoop__wbuf_free(&wb);
    ck_assert_int_eq(hoop__wire_encode_stats(&wb, &stats), 0); /* the encoder leaves them */
    hoop__stats_msg back;
    ck_assert_int_eq(hoop__wire_decode_stats(payload_of(&wb, HOOP_MSG_STATS),
                                             wb.len - HOOP__WIRE_HEADER_SIZE, &back),
                     -1);
  }
  hoop__wbuf_free(&wb);
  hoop__view_msg view;
  sample_view(&view);
  view.late[0].median_us = 6000; /* above its p99 */
  ck_assert_int_eq(hoop__wire_encode_view(&wb, &view), -1);
  sample_view(&view);
  view.late[1].p99_us = 8; /* above its maximum */
  ck_assert_int_eq(hoop__wire_encode_view(&wb, &view), -1);
  sample_view(&view);
  view.nlate = HOOP__WIRE_MAX_LATE + 1;
  ck_assert_int_eq(hoop__wire_encode_view(&wb, &view), -1);
  /* A link from a rank to itself, one that measured nothing, one too many. */
  sample_view(&view);
  view.links[0].to = view.links[0].from;
  ck_assert_int_eq(hoop__wire_encode_view(&wb, &view), -1);
  sample_view(&view);
  view.links[0].bytes = 0;
  ck_assert_int_eq(hoop__wire_encode_view(&wb, &view), -1);
  sample_stats(&stats);
  stats.nlinks = HOOP__WIRE_MAX_LINKS + 1;
  ck_assert_int_eq(hoop__wire_encode_stats(&wb, &stats), -1);
  hoop__status status;
  hoop__job_status jobs[2];
  sample_status(&status, jobs);
  jobs[1].health.wait_permille = 1001;
  ck_assert_int_eq(hoop__wire_encode_status(&wb, &status), -1);
  sample_status(&status, jobs);
  jobs[1].health.late[0].rank = 16; /* the job has 16 ranks */
  ck_assert_int_eq(hoop__wire_encode_status(&wb, &status), -1);
  hoop__wbuf_free(&wb);
}
END_TEST

/* hoopd --dump's messages round trip; a request names a job, a FLIGHT is bounded, a reply's
 * texts are cut to the cap asked. */
START_TEST(test_dump_round_trip) {
  hoop__wbuf wb = {0};
  hoop__dump_req req = {.proof_len = 32, .proof = {9}, .job = "run7"}, req_back;
  ck_assert_int_eq(hoop__wire_encode_dump_req(&wb, &req), 0);
  ck_assert_int_eq(hoop__wire_decode_dump_req(payload_of(&wb, HOOP_MSG_DUMP_REQ),
                                              wb.len - HOOP__WIRE_HEADER_SIZE, &req_back),
                   0);
  /* Field by field: a struct's padding need not match. */
  ck_assert(req_back.proof_len == req.proof_len &&
            memcmp(req_back.proof, req.proof, req.proof_len) == 0 &&
            strcmp(req_back.job, req.job) == 0);
  hoop__wbuf_free(&wb);
  req.job[0] = '\0';
  ck_assert_int_eq(hoop__wire_encode_dump_req(&wb, &req), -1);
  hoop__wbuf_free(&wb);
  ck_assert_int_eq(hoop__wire_encode_dump(&wb), 0);
  ck_assert_int_eq(hoop__wire_decode_dump(payload_of(&wb, HOOP_MSG_DUMP), 0), 0);
  hoop__wbuf_free(&wb);
  static char big[HOOP__WIRE_MAX_FLIGHT + 2];
  memset(big, 'x', sizeof big - 1);
  ck_assert_int_eq(hoop__wire_encode_flight(&wb, big), -1);
  big[HOOP__WIRE_MAX_FLIGHT] = '\0';
  hoop__wbuf_free(&wb);
  ck_assert_int_eq(hoop__wire_encode_flight(&wb, big), 0);
  static char text[HOOP__WIRE_MAX_FLIGHT + 1];
  ck_assert_int_eq(hoop__wire_decode_flight(payload_of(&wb, HOOP_MSG_FLIGHT),
                                            wb.len - HOOP__WIRE_HEADER_SIZE, text),
                   0);
  ck_assert(strcmp(text, big) == 0);
  hoop__wbuf_free(&wb);
  hoop__dump_reply reply = {.n = 2, .entries = sample_entries}, back;
  ck_assert_int_eq(hoop__wire_encode_dump_reply(&wb, &reply, 10), 0);
  ck_assert_int_eq(hoop__wire_decode_dump_reply(payload_of(&wb, HOOP_MSG_DUMP_REPLY),
                                                wb.len - HOOP__WIRE_HEADER_SIZE, &back),
                   0);
  ck_assert(back.n == 2 && back.entries[1].rank == 1 &&
            strcmp(back.entries[0].text, "rank 0 (pi") == 0);
  hoop__dump_reply_free(&back);
  hoop__wbuf_free(&wb);
}
END_TEST

START_TEST(test_status_hosts_must_add_up) {
  hoop__status in;
  hoop__job_status jobs[2];
  hoop__wbuf wb = {0};
  sample_status(&in, jobs);
  jobs[0].hosts[1].ranks = 2; /* 1 + 2 ranks from hosts, 2 joined */
  ck_assert_int_eq(hoop__wire_encode_status(&wb, &in), -1);
  hoop__wbuf_free(&wb);
  jobs[0].hosts[1].ranks = 0;
  ck_assert_int_eq(hoop__wire_encode_status(&wb, &in), -1);
  hoop__wbuf_free(&wb);
  /* Encode a valid one, then raise the second host's count on the wire. */
  jobs[0].hosts[1].ranks = 1;
  ck_assert_int_eq(hoop__wire_encode_status(&wb, &in), 0);
  uint8_t *payload = ((uint8_t *)wb.data) + HOOP__WIRE_HEADER_SIZE;
  size_t len = wb.len - HOOP__WIRE_HEADER_SIZE;
  /* job 0's last field is the second host's count, just before job 1's u16 id length ("beta"):
   * its low byte, the last of the big-endian u32. */
  size_t at = 4 + 2 + 5 + 16 + 2 * 4 + 4 + (2 + 6 + 4) + (2 + 6) + 3;
  ck_assert_uint_eq(payload[at], 1);
  payload[at] = 2;
  hoop__status out;
  ck_assert_int_eq(hoop__wire_decode_status(payload, len, &out), -1);
  hoop__wbuf_free(&wb);
}
END_TEST

START_TEST(test_empty_status_round_trip) {
  hoop__status in = {0}, out;
  hoop__wbuf wb = {0};
  ck_assert_int_eq(hoop__wire_encode_status(&wb, &in), 0);
  const uint8_t *payload = payload_of(&wb, HOOP_MSG_STATUS);
  ck_assert_int_eq(hoop__wire_decode_status(payload, wb.len - HOOP__WIRE_HEADER_SIZE, &out), 0);
  ck_assert_uint_eq(out.njobs, 0);
  hoop__status_free(&out);
  hoop__wbuf_free(&wb);
}
END_TEST

/* Two messages appended to one buffer stay two whole messages. */
START_TEST(test_encoders_append) {
  hoop__wbuf wb = {0};
  hoop__wire_header header;
  hoop__status_req request = {0};
  ck_assert_int_eq(hoop__wire_encode_status_req(&wb, &request), 0);
  encode_sample(HOOP_MSG_ERROR, &wb);
  size_t first = HOOP__WIRE_HEADER_SIZE + 2;
  ck_assert_int_eq(
      hoop__wire_decode_header(((uint8_t *)wb.data) + first, wb.len - first, 4096, &header), 0);
  ck_assert_msg(header.type == HOOP_MSG_ERROR &&
                    header.length == wb.len - first - HOOP__WIRE_HEADER_SIZE,
                "second message: expected an ERROR of %zu bytes, got type %u of %u bytes",
                wb.len - first - HOOP__WIRE_HEADER_SIZE, header.type, header.length);
  hoop__wbuf_free(&wb);
}
END_TEST

/* The largest job: HOOP__WIRE_MAX_RANKS ranks with the longest host and address fit in
 * HOOP__WIRE_MAX_PAYLOAD and come back intact. */
START_TEST(test_table_of_max_ranks) {
  hoop__table in, out;
  hoop__wbuf wb = {0};
  sample_table(&in, HOOP__WIRE_MAX_RANKS, HOOP__WIRE_MAX_RANKS - 1);
  for (uint32_t r = 0; r < in.size; r++) {
    memset(in.peers[r].host, 'h', HOOP__WIRE_MAX_HOST);
    in.peers[r].host[HOOP__WIRE_MAX_HOST] = '\0';
    memset(in.peers[r].addr, 'a', HOOP__WIRE_MAX_ADDR);
    in.peers[r].addr[HOOP__WIRE_MAX_ADDR] = '\0';
    in.peers[r].addr[0] = (char)('0' + r % 10);
  }
  ck_assert_int_eq(hoop__wire_encode_table(&wb, &in), 0);
  const uint8_t *payload = payload_of(&wb, HOOP_MSG_TABLE);
  int rc = hoop__wire_decode_table(payload, wb.len - HOOP__WIRE_HEADER_SIZE, &out);
  ck_assert_msg(rc == 0, "decoding a TABLE of %d ranks: expected 0, got %d", HOOP__WIRE_MAX_RANKS,
                rc);
  ck_assert_uint_eq(out.size, HOOP__WIRE_MAX_RANKS);
  ck_assert_uint_eq(out.rank, HOOP__WIRE_MAX_RANKS - 1);
  for (uint32_t r = 0; r < out.size; r++) {
    ck_assert_msg(strcmp(out.peers[r].addr, in.peers[r].addr) == 0 &&
                      strcmp(out.peers[r].host, in.peers[r].host) == 0 &&
                      out.peers[r].local_rank == in.peers[r].local_rank,
                  "entry %u of the largest TABLE differs after the round trip", r);
  }
  hoop__table_free(&out);
  free(in.peers);
  hoop__wbuf_free(&wb);
}
END_TEST

/* ---- header ---------------------------------------------------------------------------------- */

START_TEST(test_header_needs_twelve_bytes) {
  hoop__wbuf wb = {0};
  hoop__wire_header header;
  encode_sample(HOOP_MSG_HELLO, &wb);
  for (size_t len = 0; len < HOOP__WIRE_HEADER_SIZE; len++) {
    int rc = hoop__wire_decode_header(((uint8_t *)wb.data), len, 4096, &header);
    ck_assert_msg(rc == 1, "header of %zu bytes: expected 1 (need more), got %d", len, rc);
  }
  hoop__wbuf_free(&wb);
}
END_TEST

START_TEST(test_header_rejects_oversized_length) {
  hoop__wbuf wb = {0};
  hoop__wire_header header;
  encode_sample(HOOP_MSG_ERROR, &wb);
  uint32_t length = (uint32_t)(wb.len - HOOP__WIRE_HEADER_SIZE);
  int rc = hoop__wire_decode_header(((uint8_t *)wb.data), wb.len, length, &header);
  ck_assert_msg(rc == 0, "length equal to the limit: expected 0, got %d", rc);
  rc = hoop__wire_decode_header(((uint8_t *)wb.data), wb.len, length - 1, &header);
  ck_assert_msg(rc == -1, "length one over the limit: expected -1, got %d", rc);
  ((uint8_t *)wb.data)[8] = ((uint8_t *)wb.data)[9] = ((uint8_t *)wb.data)[10] =
      ((uint8_t *)wb.data)[11] = 0xff;
  rc = hoop__wire_decode_header(((uint8_t *)wb.data), wb.len, HOOP__WIRE_MAX_PAYLOAD, &header);
  ck_assert_msg(rc == -1, "length 0xffffffff: expected -1, got %d", rc);
  hoop__wbuf_free(&wb);
}
END_TEST

/* Flip one header field to value and expect the header refused. */
static void expect_header_refused(size_t offset, size_t width, uint32_t value, const char *what) {
  hoop__wbuf wb = {0};
  hoop__wire_header header;
  hoop__status_req request = {0};
  ck_assert_int_eq(hoop__wire_encode_status_req(&wb, &request), 0);
  for (size_t i = 0; i < width; i++) /* big-endian, like every field */
    ((uint8_t *)wb.data)[offset + i] = (uint8_t)(value >> (8 * (width - 1 - i)));
  int rc = hoop__wire_decode_header(((uint8_t *)wb.data), wb.len, 4096, &header);
  ck_assert_msg(rc == -1, "header with %s: expected -1, got %d", what, rc);
  hoop__wbuf_free(&wb);
}

START_TEST(test_header_rejects_bad_magic_version_type) {
  expect_header_refused(0, 4, 0x54534f50, "magic 'POST'");
  expect_header_refused(0, 1, 'h', "magic 'hOOP'");
  expect_header_refused(4, 2, 0, "version 0");
  expect_header_refused(4, 2, HOOP__WIRE_VERSION - 1, "version 1");
  expect_header_refused(4, 2, HOOP__WIRE_VERSION + 1, "version 3");
  expect_header_refused(6, 2, 0, "type 0");
  expect_header_refused(6, 2, HOOP__MSG_LAST + 1, "type 10");
  expect_header_refused(6, 2, 0xffff, "type 65535");
}
END_TEST

/* ---- malformed payloads ---------------------------------------------------------------------- */

/* Every proper prefix of a valid payload must be refused. Each prefix is copied to a buffer of its
 * exact size, so that AddressSanitizer catches a decoder reading past the end. */
START_TEST(test_every_truncation_is_refused) {
  for (size_t t = 0; t < NDECODED; t++) {
    hoop__wbuf wb = {0};
    encode_sample(decoded_types[t], &wb);
    size_t full = wb.len - HOOP__WIRE_HEADER_SIZE;
    for (size_t len = 0; len < full; len++) {
      uint8_t *prefix = malloc(len ? len : 1);
      ck_assert_ptr_nonnull(prefix);
      memcpy(prefix, ((uint8_t *)wb.data) + HOOP__WIRE_HEADER_SIZE, len);
      int rc = decode_as(decoded_types[t], len ? prefix : NULL, len);
      ck_assert_msg(rc == -1, "type %d cut to %zu of %zu bytes: expected -1, got %d",
                    (int)decoded_types[t], len, full, rc);
      free(prefix);
    }
    hoop__wbuf_free(&wb);
  }
}
END_TEST

START_TEST(test_trailing_bytes_are_refused) {
  for (size_t t = 0; t < NDECODED; t++) {
    hoop__wbuf wb = {0};
    encode_sample(decoded_types[t], &wb);
    uint8_t extra = 0;
    size_t full = wb.len - HOOP__WIRE_HEADER_SIZE;
    uint8_t *longer = malloc(full + 1);
    ck_assert_ptr_nonnull(longer);
    memcpy(longer, ((uint8_t *)wb.data) + HOOP__WIRE_HEADER_SIZE, full);
    longer[full] = extra;
    int rc = decode_as(decoded_types[t], longer, full + 1);
    ck_assert_msg(rc == -1, "type %d with one trailing byte: expected -1, got %d",
                  (int)decoded_types[t], rc);
    free(longer);
    hoop__wbuf_free(&wb);
  }
}
END_TEST

/* Find needle in the encoded payload and overwrite its byte at index with value. */
static void patch_payload(hoop__wbuf *wb, const char *needle, size_t index, uint8_t value) {
  size_t nlen = strlen(needle);
  for (size_t i = HOOP__WIRE_HEADER_SIZE; i + nlen <= wb->len; i++) {
    if (memcmp(((uint8_t *)wb->data) + i, needle, nlen) == 0) {
      ((uint8_t *)wb->data)[i + index] = value;
      return;
    }
  }
  ck_abort_msg("patch_payload: '%s' not found in the encoded message", needle);
}

START_TEST(test_embedded_nul_is_refused) {
  struct {
    hoop__msg_type type;
    const char *needle;
  } cases[] = {{HOOP_MSG_HELLO, "train-42"},  {HOOP_MSG_HELLO, "node-a.example"},
               {HOOP_MSG_HELLO, "10.0.0.7"},  {HOOP_MSG_TABLE, "node-b"},
               {HOOP_MSG_ERROR, "timed out"}, {HOOP_MSG_STATUS, "beta"}};
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    hoop__wbuf wb = {0};
    encode_sample(cases[c].type, &wb);
    patch_payload(&wb, cases[c].needle, 2, '\0');
    int rc = decode_as(cases[c].type, ((uint8_t *)wb.data) + HOOP__WIRE_HEADER_SIZE,
                       wb.len - HOOP__WIRE_HEADER_SIZE);
    ck_assert_msg(rc == -1, "type %d with a NUL inside '%s': expected -1, got %d",
                  (int)cases[c].type, cases[c].needle, rc);
    hoop__wbuf_free(&wb);
  }
}
END_TEST

/* Payload offsets of HELLO's fixed fields after the sample's job id "train-42". */
#define HELLO_SIZE_AT (2 + 8)
#define HELLO_RANK_AT (HELLO_SIZE_AT + 4)

static void put32(uint8_t *at, uint32_t value) {
  hoop__put_be32(at, value);
}

static int decode_hello_with(size_t offset, uint32_t value) {
  hoop__wbuf wb = {0};
  hoop__hello out;
  encode_sample(HOOP_MSG_HELLO, &wb);
  put32(((uint8_t *)wb.data) + HOOP__WIRE_HEADER_SIZE + offset, value);
  int rc = hoop__wire_decode_hello(((uint8_t *)wb.data) + HOOP__WIRE_HEADER_SIZE,
                                   wb.len - HOOP__WIRE_HEADER_SIZE, &out);
  hoop__wbuf_free(&wb);
  return rc;
}

START_TEST(test_hello_rank_and_size_ranges) {
  /* The sample has size 8. */
  struct {
    size_t offset;
    uint32_t value;
    int expected;
    const char *what;
  } cases[] = {
      {HELLO_RANK_AT, 7, 0, "rank 7 of 8"},
      {HELLO_RANK_AT, 0xffffffffu, 0, "rank -1 (any)"},
      {HELLO_RANK_AT, 8, -1, "rank 8 of 8"},
      {HELLO_RANK_AT, 0xfffffffeu, 0, "rank -2 (a newcomer)"},
      {HELLO_RANK_AT, 0xfffffffdu, -1, "rank -3"},
      {HELLO_RANK_AT, 0x80000000u, -1, "rank INT32_MIN"},
      {HELLO_SIZE_AT, 0, -1, "size 0"},
      {HELLO_SIZE_AT, HOOP__WIRE_MAX_RANKS + 1, -1, "size over HOOP_WIRE_MAX_RANKS"},
      {HELLO_SIZE_AT, 3, -1, "size 3 with rank 3"},
  };
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    int rc = decode_hello_with(cases[c].offset, cases[c].value);
    ck_assert_msg(rc == cases[c].expected, "HELLO with %s: expected %d, got %d", cases[c].what,
                  cases[c].expected, rc);
  }
}
END_TEST

/* Payload offsets in the sample TABLE (size 5, rank 2); entry 0 is "node-a", "10.0.0.1:40000". */
#define TABLE_SIZE_AT 0
#define TABLE_RANK_AT 4
#define TABLE_LOCAL_RANK0_AT (8 + HOOP__WIRE_NONCE + 2 + 6 + 2 + 14)
#define TABLE_LOCAL_SIZE0_AT (TABLE_LOCAL_RANK0_AT + 4)

START_TEST(test_table_ranges) {
  struct {
    size_t offset;
    uint32_t value;
    const char *what;
  } cases[] = {
      {TABLE_RANK_AT, 5, "rank 5 of 5"},
      {TABLE_RANK_AT, 0xffffffffu, "rank 0xffffffff"},
      {TABLE_SIZE_AT, 0, "size 0"},
      {TABLE_SIZE_AT, HOOP__WIRE_MAX_RANKS + 1, "size over HOOP_WIRE_MAX_RANKS"},
      {TABLE_SIZE_AT, 4, "size 4 with 5 entries"},
      {TABLE_SIZE_AT, 6, "size 6 with 5 entries"},
      {TABLE_LOCAL_RANK0_AT, 3, "local_rank 3 of local_size 3"},
      {TABLE_LOCAL_SIZE0_AT, 0, "local_size 0"},
      {TABLE_LOCAL_SIZE0_AT, 6, "local_size 6 in a job of 5"},
  };
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    hoop__wbuf wb = {0};
    hoop__table out;
    encode_sample(HOOP_MSG_TABLE, &wb);
    put32(((uint8_t *)wb.data) + HOOP__WIRE_HEADER_SIZE + cases[c].offset, cases[c].value);
    int rc = hoop__wire_decode_table(((uint8_t *)wb.data) + HOOP__WIRE_HEADER_SIZE,
                                     wb.len - HOOP__WIRE_HEADER_SIZE, &out);
    ck_assert_msg(rc == -1, "TABLE with %s: expected -1, got %d", cases[c].what, rc);
    ck_assert_msg(out.peers == NULL, "TABLE with %s: a refused table still holds peers",
                  cases[c].what);
    hoop__wbuf_free(&wb);
  }
}
END_TEST

START_TEST(test_status_ranges) {
  hoop__status in;
  hoop__job_status jobs[2];
  struct {
    uint32_t joined, nmissing;
    int32_t missing0;
    const char *what;
  } cases[] = {
      {5, 0, 0, "joined 5 of 4"},
      {2, 3, 0, "3 missing with 2 of 4 joined"},
      {2, 2, 4, "missing rank 4 of 4"},
      {2, 2, -1, "missing rank -1"},
  };
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    hoop__wbuf wb = {0};
    sample_status(&in, jobs);
    ck_assert_int_eq(hoop__wire_encode_status(&wb, &in), 0);
    /* Job 0 ("alpha", size 4) starts at payload offset 4: str (2 + 5), size, joined,
     * waited_ms, nmissing, missing[0]. */
    uint8_t *job0 = ((uint8_t *)wb.data) + HOOP__WIRE_HEADER_SIZE + 4 + 7;
    put32(job0 + 4, cases[c].joined);
    put32(job0 + 12, cases[c].nmissing);
    put32(job0 + 16, (uint32_t)cases[c].missing0);
    hoop__status out;
    int rc = hoop__wire_decode_status(((uint8_t *)wb.data) + HOOP__WIRE_HEADER_SIZE,
                                      wb.len - HOOP__WIRE_HEADER_SIZE, &out);
    ck_assert_msg(rc == -1, "STATUS with %s: expected -1, got %d", cases[c].what, rc);
    hoop__wbuf_free(&wb);
  }
}
END_TEST

/* Lengths and counts far over the limits, in otherwise well-formed payloads. */
START_TEST(test_over_limit_lengths_are_refused) {
  uint8_t hello[4 + HOOP__WIRE_MAX_JOB + 1] = {0};
  hello[0] = (uint8_t)((HOOP__WIRE_MAX_JOB + 1) & 0xff); /* job id one byte too long */
  memset(hello + 2, 'j', HOOP__WIRE_MAX_JOB + 1);
  ck_assert_msg(decode_as(HOOP_MSG_HELLO, hello, sizeof hello) == -1,
                "HELLO with a %d-byte job id: expected -1", HOOP__WIRE_MAX_JOB + 1);
  uint8_t error[4 + 2] = {1, 0, 0, 0, 0xff, 0xff}; /* a 65535-byte message, absent */
  ck_assert_msg(decode_as(HOOP_MSG_ERROR, error, sizeof error) == -1,
                "ERROR announcing 65535 bytes: expected -1");
  uint8_t status[4] = {0x01, 0x01, 0, 0}; /* 257 jobs */
  ck_assert_msg(decode_as(HOOP_MSG_STATUS, status, sizeof status) == -1,
                "STATUS announcing 257 jobs: expected -1");
  uint8_t table[24] = {0x00, 0x40, 0, 0}; /* 16384 ranks, no entries */
  ck_assert_msg(decode_as(HOOP_MSG_TABLE, table, sizeof table) == -1,
                "TABLE announcing 16384 ranks with no entries: expected -1");
  uint8_t code_zero[4 + 2] = {0};
  ck_assert_msg(decode_as(HOOP_MSG_ERROR, code_zero, sizeof code_zero) == -1,
                "ERROR with code 0: expected -1");
}
END_TEST

START_TEST(test_encoders_refuse_bad_structs) {
  hoop__wbuf wb = {0};
  hoop__hello hello;
  sample_hello(&hello, 8);
  ck_assert_msg(hoop__wire_encode_hello(&wb, &hello) == -1, "encoding rank 8 of 8: expected -1");
  sample_hello(&hello, -1);
  memset(hello.job, 'j', sizeof hello.job); /* not terminated */
  ck_assert_msg(hoop__wire_encode_hello(&wb, &hello) == -1,
                "encoding an unterminated job id: expected -1");
  sample_hello(&hello, -1);
  hello.proof_len = HOOP__WIRE_MAX_PROOF + 1;
  ck_assert_msg(hoop__wire_encode_hello(&wb, &hello) == -1, "encoding a %d-byte proof: expected -1",
                HOOP__WIRE_MAX_PROOF + 1);
  hoop__table table;
  sample_table(&table, 3, 1);
  table.peers[1].local_rank = table.peers[1].local_size;
  ck_assert_msg(hoop__wire_encode_table(&wb, &table) == -1,
                "encoding local_rank == local_size: expected -1");
  free(table.peers);
  hoop__error_msg error;
  sample_error(&error);
  error.code = 0;
  ck_assert_msg(hoop__wire_encode_error(&wb, &error) == -1, "encoding error code 0: expected -1");
  ck_assert_msg(wb.len == 0, "refused encodings appended %zu bytes, expected none", wb.len);
  hoop__wbuf_free(&wb);
}
END_TEST

/* ---- random input ---------------------------------------------------------------------------- */

/* Random byte strings at every decoder, each in a buffer of its exact length. */
START_TEST(test_random_bytes_never_crash) {
  rng_state = 0x9e3779b97f4a7c15ull;
  int accepted = 0;
  for (int i = 0; i < 4000; i++) {
    size_t len = rng_next() % 700;
    uint8_t *bytes = malloc(len ? len : 1);
    ck_assert_ptr_nonnull(bytes);
    for (size_t b = 0; b < len; b++)
      bytes[b] = (uint8_t)rng_next();
    hoop__wire_header header;
    if (hoop__wire_decode_header(bytes, len, HOOP__WIRE_MAX_PAYLOAD, &header) == 0)
      accepted++;
    for (size_t t = 0; t < NDECODED; t++)
      accepted += decode_as(decoded_types[t], len ? bytes : NULL, len) == 0;
    free(bytes);
  }
  /* Random bytes essentially never form a valid message; many acceptances would mean the
   * decoders check too little. */
  ck_assert_msg(accepted < 10, "random input: expected almost nothing accepted, %d accepted",
                accepted);
}
END_TEST

/* Valid messages with a few random bytes changed: these get past the first checks and exercise the
 * deeper paths. Whatever decodes must hold its invariants. */
START_TEST(test_mutated_messages_never_crash) {
  rng_state = 0x2545f4914f6cdd1dull;
  for (int i = 0; i < 4000; i++) {
    hoop__msg_type type = decoded_types[i % NDECODED];
    hoop__wbuf wb = {0};
    encode_sample(type, &wb);
    size_t len = wb.len - HOOP__WIRE_HEADER_SIZE;
    int flips = 1 + (int)(rng_next() % 4);
    for (int f = 0; f < flips; f++)
      ((uint8_t *)wb.data)[HOOP__WIRE_HEADER_SIZE + rng_next() % len] = (uint8_t)rng_next();
    len -= rng_next() % 3 == 0 ? rng_next() % len : 0;
    uint8_t *bytes = malloc(len ? len : 1);
    ck_assert_ptr_nonnull(bytes);
    memcpy(bytes, ((uint8_t *)wb.data) + HOOP__WIRE_HEADER_SIZE, len);
    hoop__table table;
    if (type == HOOP_MSG_TABLE && hoop__wire_decode_table(len ? bytes : NULL, len, &table) == 0) {
      ck_assert_msg(table.rank < table.size, "mutated TABLE accepted with rank %u of %u",
                    table.rank, table.size);
      for (uint32_t r = 0; r < table.size; r++)
        ck_assert_msg(table.peers[r].local_rank < table.peers[r].local_size,
                      "mutated TABLE accepted with local_rank %u of %u", table.peers[r].local_rank,
                      table.peers[r].local_size);
      hoop__table_free(&table);
    } else if (type != HOOP_MSG_TABLE) {
      decode_as(type, len ? bytes : NULL, len);
    }
    free(bytes);
    hoop__wbuf_free(&wb);
  }
}
END_TEST

/* ---- runner ---------------------------------------------------------------------------------- */

static Suite *wire_suite(void) {
  Suite *s = suite_create("wire");
  TCase *round = tcase_create("round trip");
  tcase_add_test(round, test_hello_round_trip);
  tcase_add_test(round, test_names_with_control_bytes_refused);
  tcase_add_test(round, test_table_proof_round_trip);
  tcase_add_test(round, test_table_round_trip);
  tcase_add_test(round, test_error_round_trip);
  tcase_add_test(round, test_status_req_round_trip);
  tcase_add_test(round, test_challenge_round_trip);
  tcase_add_test(round, test_abort_and_notice_round_trip);
  tcase_add_test(round, test_shrink_round_trip);
  tcase_add_test(round, test_generation_pending_newcomer);
  tcase_add_test(round, test_bye_is_empty);
  tcase_add_test(round, test_status_round_trip);
  tcase_add_test(round, test_status_hosts_must_add_up);
  tcase_add_test(round, test_stats_and_view_round_trip);
  tcase_add_test(round, test_hello_flags);
  tcase_add_test(round, test_golden_bytes);
  tcase_add_test(round, test_stats_and_view_refusals);
  tcase_add_test(round, test_dump_round_trip);
  tcase_add_test(round, test_empty_status_round_trip);
  tcase_add_test(round, test_encoders_append);
  tcase_add_test(round, test_table_of_max_ranks);
  suite_add_tcase(s, round);

  TCase *header = tcase_create("header");
  tcase_add_test(header, test_header_needs_twelve_bytes);
  tcase_add_test(header, test_header_rejects_oversized_length);
  tcase_add_test(header, test_header_rejects_bad_magic_version_type);
  suite_add_tcase(s, header);

  TCase *malformed = tcase_create("malformed");
  tcase_add_test(malformed, test_every_truncation_is_refused);
  tcase_add_test(malformed, test_trailing_bytes_are_refused);
  tcase_add_test(malformed, test_embedded_nul_is_refused);
  tcase_add_test(malformed, test_hello_rank_and_size_ranges);
  tcase_add_test(malformed, test_table_ranges);
  tcase_add_test(malformed, test_status_ranges);
  tcase_add_test(malformed, test_over_limit_lengths_are_refused);
  tcase_add_test(malformed, test_encoders_refuse_bad_structs);
  suite_add_tcase(s, malformed);

  TCase *random = tcase_create("random");
  tcase_set_timeout(random, 120);
  tcase_add_test(random, test_random_bytes_never_crash);
  tcase_add_test(random, test_mutated_messages_never_crash);
  suite_add_tcase(s, random);
  return s;
}

int main(void) {
  SRunner *sr = srunner_create(wire_suite());
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
