/* make_seeds.c - writes one valid message of each type into DIR, the fuzzer's seed corpus, so that
 * it starts from inputs that pass the header and reach every decoder. Usage: make_seeds DIR */
#include <stdio.h>
#include <string.h>

#include "proto/wire.h"

static int save(const char *dir, const char *name, const hoop__wbuf *wb) {
  char path[4096];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, "wb");
  if (!f || fwrite(wb->data, 1, wb->len, f) != wb->len) {
    perror(path);
    return 1;
  }
  return fclose(f) != 0;
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: make_seeds DIR\n");
    return 2;
  }
  hoop__wbuf wb[15] = {{0}};
  hoop__hello hello = {
      .size = 4, .rank = 2, .timeout_ms = 30000, .proof_len = 3, .proof = {1, 2, 3}, .nonce = {6}};
  strcpy(hello.job, "job-1");
  strcpy(hello.host, "node7");
  strcpy(hello.addr, "10.0.0.7:41000");
  hoop__peer_entry peers[2] = {{"node1", "10.0.0.1:5000", 0, 2, {1, 2, 3}},
                               {"node1", "[::1]:5001", 1, 2, {4, 5, 6}}};
  hoop__table table = {.size = 2, .rank = 1, .nonce = {9, 8, 7}, .peers = peers};
  hoop__error_msg error = {.code = 2};
  strcpy(error.message, "rendezvous timed out: 1 of 2 ranks joined; missing ranks: 1");
  hoop__job_status job = {
      .size = 4, .joined = 1, .waited_ms = 1200, .nmissing = 2, .missing = {1, 3}};
  strcpy(job.job, "waiting");
  job.nhosts = 1;
  strcpy(job.hosts[0].name, "node1");
  job.hosts[0].ranks = 1;
  hoop__status status = {.njobs = 1, .jobs = &job};
  hoop__status_req request = {0}, proven = {.proof_len = 32, .proof = {4, 5, 6}};
  hoop__challenge challenge = {.flags = HOOP__CHALLENGE_AUTH, .nonce = {7, 7, 7}};
  hoop__abort_msg abort_msg = {.rank = 2};
  strcpy(abort_msg.reason, "loss is NaN");
  hoop__notice notice = {.code = 7, .origin = 2};
  strcpy(notice.message, "aborted by rank 2: loss is NaN");
  hoop__shrink_msg shrink = {
      .generation = 1, .rank = 2, .timeout_ms = 5000, .naccused = 1, .accused = {3}};
  strcpy(shrink.addr, "tcp=10.0.0.7:41000");
  hoop__table_proof table_proof = {.proof_len = 32, .proof = {3, 1, 4}};
  hoop__stats_msg stats = {.calls = 99,
                           .bytes = 4096,
                           .in_calls_us = 900,
                           .waited_us = 800,
                           .since_us = 5000,
                           .nsamples = 2,
                           .samples = {{7, 400}, {8, 410}}};
  hoop__view_msg view = {.calls = 2, .reporting = 4, .nlate = 1, .late = {{3, 400, 410, 410}}};
  hoop__job_status running = {.size = 4, .joined = 4, .waited_ms = 9000};
  strcpy(running.job, "running");
  running.health = (hoop__job_health){.running = 1,
                                      .reporting = 4,
                                      .calls_per_s = 50,
                                      .wait_permille = 300,
                                      .calls = 2,
                                      .nlate = 1,
                                      .late = {{3, 400, 410, 410}}};
  hoop__status running_status = {.njobs = 1, .jobs = &running};
  int bad =
      hoop__wire_encode_hello(&wb[0], &hello) | hoop__wire_encode_table(&wb[1], &table) |
      hoop__wire_encode_error(&wb[2], &error) | hoop__wire_encode_status_req(&wb[3], &request) |
      hoop__wire_encode_status(&wb[4], &status) | hoop__wire_encode_status_req(&wb[5], &proven) |
      hoop__wire_encode_challenge(&wb[6], &challenge) |
      hoop__wire_encode_abort(&wb[7], &abort_msg) | hoop__wire_encode_bye(&wb[8]) |
      hoop__wire_encode_notice(&wb[9], &notice) | hoop__wire_encode_shrink(&wb[10], &shrink) |
      hoop__wire_encode_table_proof(&wb[11], &table_proof) |
      hoop__wire_encode_stats(&wb[12], &stats) | hoop__wire_encode_view(&wb[13], &view) |
      hoop__wire_encode_status(&wb[14], &running_status);
  const char *names[15] = {
      "hello",     "table", "error",         "status_req", "status", "status_req_proof",
      "challenge", "abort", "bye",           "notice",     "shrink", "table_proof",
      "stats",     "view",  "status_running"};
  for (int i = 0; i < 15 && !bad; i++)
    bad |= save(argv[1], names[i], &wb[i]);
  for (int i = 0; i < 15; i++)
    hoop__wbuf_free(&wb[i]);
  return bad ? 1 : 0;
}
