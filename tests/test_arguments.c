/* test_arguments.c - the argument-error table: every entry point that takes a communicator,
 * called on both ranks of a real 2-rank job with one bad argument at a time. Each refusal must be
 * HOOP_ERR_INVALID_ARG, its message must name the call and the argument, and the communicator must
 * go on working: after each, an allreduce on both ranks gives the right sum (a refused call sent
 * nothing, so the ranks' calls still pair up). Calls without a communicator (hoop_wait(NULL),
 * hoop_test without a flag, NULL comms) refuse by code alone. */
#include <check.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hoop.h"
#include "support/procs.h"

#define N 4

typedef struct bad_call {
  const char *call; /* the entry point's name, which the message must hold */
  const char *arg;  /* a word of the message naming what is wrong */
  hoop_result (*run)(hoop_comm *comm, int rank);
} bad_call;

static float xs[2 * N], ys[2 * N];
static const size_t counts[2] = {N, N}, displs[2] = {0, N};

static hoop_result allreduce_dtype(hoop_comm *c, int r) {
  (void)r;
  return hoop_allreduce(c, xs, ys, N, (hoop_dtype)99, HOOP_SUM);
}
static hoop_result allreduce_op(hoop_comm *c, int r) {
  (void)r;
  return hoop_allreduce(c, xs, ys, N, HOOP_FLOAT32, (hoop_op)42);
}
static hoop_result allreduce_bitwise_float(hoop_comm *c, int r) {
  (void)r;
  return hoop_allreduce(c, xs, ys, N, HOOP_FLOAT32, HOOP_BAND);
}
static hoop_result allreduce_null_send(hoop_comm *c, int r) {
  (void)r;
  return hoop_allreduce(c, NULL, ys, N, HOOP_FLOAT32, HOOP_SUM);
}
static hoop_result allreduce_null_recv(hoop_comm *c, int r) {
  (void)r;
  return hoop_allreduce(c, xs, NULL, N, HOOP_FLOAT32, HOOP_SUM);
}
static hoop_result broadcast_root_past(hoop_comm *c, int r) {
  (void)r;
  return hoop_broadcast(c, xs, N, HOOP_FLOAT32, 2);
}
static hoop_result broadcast_root_negative(hoop_comm *c, int r) {
  (void)r;
  return hoop_broadcast(c, xs, N, HOOP_FLOAT32, -1);
}
static hoop_result broadcast_null(hoop_comm *c, int r) {
  (void)r;
  return hoop_broadcast(c, NULL, N, HOOP_FLOAT32, 0);
}
static hoop_result allgather_null(hoop_comm *c, int r) {
  (void)r;
  return hoop_allgather(c, NULL, ys, N, HOOP_FLOAT32);
}
static hoop_result allgather_huge(hoop_comm *c, int r) {
  (void)r;
  return hoop_allgather(c, xs, ys, SIZE_MAX / 2, HOOP_FLOAT32);
}
static hoop_result reduce_scatter_null(hoop_comm *c, int r) {
  (void)r;
  return hoop_reduce_scatter(c, xs, NULL, N, HOOP_FLOAT32, HOOP_SUM);
}
static hoop_result reduce_scatter_dtype(hoop_comm *c, int r) {
  (void)r;
  return hoop_reduce_scatter(c, xs, ys, N, (hoop_dtype)-3, HOOP_SUM);
}
static hoop_result alltoall_null(hoop_comm *c, int r) {
  (void)r;
  return hoop_alltoall(c, NULL, ys, N, HOOP_FLOAT32);
}
static hoop_result alltoallv_null_counts(hoop_comm *c, int r) {
  (void)r;
  return hoop_alltoallv(c, xs, NULL, displs, ys, counts, displs, HOOP_FLOAT32);
}
static hoop_result alltoallv_null_recvcounts(hoop_comm *c, int r) {
  (void)r;
  return hoop_alltoallv(c, xs, counts, displs, ys, NULL, displs, HOOP_FLOAT32);
}
static hoop_result reduce_root(hoop_comm *c, int r) {
  (void)r;
  return hoop_reduce(c, xs, ys, N, HOOP_FLOAT32, HOOP_SUM, 5);
}
static hoop_result gather_root(hoop_comm *c, int r) {
  (void)r;
  return hoop_gather(c, xs, ys, N, HOOP_FLOAT32, -2);
}
static hoop_result scatter_root(hoop_comm *c, int r) {
  (void)r;
  return hoop_scatter(c, xs, ys, N, HOOP_FLOAT32, 2);
}
static hoop_result allreduce_many_null(hoop_comm *c, int r) {
  (void)r;
  return hoop_allreduce_many(c, 2, NULL, NULL, counts, HOOP_FLOAT32, HOOP_SUM);
}
static hoop_result iallreduce_no_request(hoop_comm *c, int r) {
  (void)r;
  return hoop_iallreduce(c, xs, ys, N, HOOP_FLOAT32, HOOP_SUM, NULL);
}
static hoop_result ibroadcast_root(hoop_comm *c, int r) {
  (void)r;
  hoop_request *req = NULL;
  return hoop_ibroadcast(c, xs, N, HOOP_FLOAT32, 7, &req);
}
static hoop_result send_negative_peer(hoop_comm *c, int r) {
  (void)r;
  return hoop_send(c, xs, N, HOOP_FLOAT32, -1, 0);
}
static hoop_result send_peer_past(hoop_comm *c, int r) {
  (void)r;
  return hoop_send(c, xs, N, HOOP_FLOAT32, 2, 0);
}
static hoop_result send_self(hoop_comm *c, int r) {
  return hoop_send(c, xs, N, HOOP_FLOAT32, r, 0);
}
static hoop_result recv_negative_tag(hoop_comm *c, int r) {
  return hoop_recv(c, ys, N, HOOP_FLOAT32, 1 - r, -4);
}
static hoop_result irecv_null(hoop_comm *c, int r) {
  hoop_request *req = NULL;
  return hoop_irecv(c, NULL, N, HOOP_FLOAT32, 1 - r, 0, &req);
}
static hoop_result split_color(hoop_comm *c, int r) {
  (void)r;
  hoop_comm *sub = NULL;
  return hoop_comm_split(c, -5, 0, &sub);
}
static hoop_result group_rank_past(hoop_comm *c, int r) {
  (void)r;
  int ranks[2] = {0, 2};
  hoop_comm *sub = NULL;
  return hoop_comm_create_group(c, ranks, 2, &sub);
}
static hoop_result group_repeated(hoop_comm *c, int r) {
  int ranks[2] = {r, r};
  hoop_comm *sub = NULL;
  return hoop_comm_create_group(c, ranks, 2, &sub);
}
static hoop_result register_null(hoop_comm *c, int r) {
  (void)r;
  hoop_mem_handle handle;
  return hoop_register(c, NULL, 64, &handle);
}
static hoop_result set_timeout_zero(hoop_comm *c, int r) {
  (void)r;
  return hoop_comm_set_timeout(c, 0.0);
}
static hoop_result set_compress_unknown(hoop_comm *c, int r) {
  (void)r;
  return hoop_comm_set_compress(c, 0x7777);
}
static hoop_result compressed_int32(hoop_comm *c, int r) {
  (void)r;
  int32_t a[N] = {1, 2, 3, 4}, b[N];
  hoop_compress_next(c, HOOP_COMPRESS_INT8);
  return hoop_allreduce(c, a, b, N, HOOP_INT32, HOOP_SUM);
}

static const bad_call table[] = {
    {"hoop_allreduce", "dtype", allreduce_dtype},
    {"hoop_allreduce", "op", allreduce_op},
    {"hoop_allreduce", "band", allreduce_bitwise_float},
    {"hoop_allreduce", "sendbuf", allreduce_null_send},
    {"hoop_allreduce", "recvbuf", allreduce_null_recv},
    {"hoop_broadcast", "root", broadcast_root_past},
    {"hoop_broadcast", "root", broadcast_root_negative},
    {"hoop_broadcast", "buf", broadcast_null},
    {"hoop_allgather", "sendbuf", allgather_null},
    {"hoop_allgather", "count", allgather_huge},
    {"hoop_reduce_scatter", "recvbuf", reduce_scatter_null},
    {"hoop_reduce_scatter", "dtype", reduce_scatter_dtype},
    {"hoop_alltoall", "sendbuf", alltoall_null},
    {"hoop_alltoallv", "sendcounts", alltoallv_null_counts},
    {"hoop_alltoallv", "recvcounts", alltoallv_null_recvcounts},
    {"hoop_reduce", "root", reduce_root},
    {"hoop_gather", "root", gather_root},
    {"hoop_scatter", "root", scatter_root},
    {"hoop_allreduce_many", "sendbufs", allreduce_many_null},
    {"hoop_iallreduce", "request", iallreduce_no_request},
    {"hoop_ibroadcast", "root", ibroadcast_root},
    {"hoop_send", "peer", send_negative_peer},
    {"hoop_send", "peer", send_peer_past},
    {"hoop_send", "peer", send_self},
    {"hoop_recv", "tag", recv_negative_tag},
    {"hoop_irecv", "buf", irecv_null},
    {"hoop_comm_split", "color", split_color},
    {"hoop_comm_create_group", "rank", group_rank_past},
    {"hoop_comm_create_group", "rank", group_repeated},
    {"hoop_register", "ptr", register_null},
    {"hoop_comm_set_timeout", "seconds", set_timeout_zero},
    {"hoop_comm_set_compress", "format", set_compress_unknown},
    {"hoop_allreduce", "compress", compressed_int32},
};
#define CALLS (sizeof table / sizeof table[0])

static int argument_rank(int rank, int n, void *arg) {
  int port = *(int *)arg;
  hoop_comm *comm = procs_join(port, rank, n, 30, NULL);
  if (!comm)
    return 1;
  int bad = 0;
  for (size_t i = 0; i < CALLS; i++) {
    const bad_call *c = &table[i];
    hoop_result result = c->run(comm, rank);
    char message[1024];
    snprintf(message, sizeof message, "%s", hoop_last_error(comm));
    if (result != HOOP_ERR_INVALID_ARG || !strstr(message, c->call) || !strstr(message, c->arg)) {
      fprintf(stderr,
              "rank %d: %s with a bad %s: expected HOOP_ERR_INVALID_ARG naming both, got %s: %s\n",
              rank, c->call, c->arg, hoop_strerror(result), message);
      bad++;
    }
    /* The communicator goes on: both ranks' next call pairs up and is right. */
    int32_t one = rank + 1, sum = 0;
    hoop_result next = hoop_allreduce(comm, &one, &sum, 1, HOOP_INT32, HOOP_SUM);
    if (next != HOOP_OK || sum != 3) {
      fprintf(stderr, "rank %d: after %s with a bad %s, an allreduce gave %s (%d): %s\n", rank,
              c->call, c->arg, hoop_strerror(next), (int)sum, hoop_last_error(comm));
      bad++;
      break;
    }
  }
  /* Without a communicator to name anything: the code alone. */
  int done = 0;
  hoop_request *req = NULL;
  bad += hoop_wait(NULL) != HOOP_ERR_INVALID_ARG;
  bad += hoop_test(NULL, &done) != HOOP_ERR_INVALID_ARG;
  bad += hoop_barrier(NULL) != HOOP_ERR_INVALID_ARG;
  bad += hoop_send(NULL, xs, N, HOOP_FLOAT32, 0, 0) != HOOP_ERR_INVALID_ARG;
  bad += hoop_name_next(NULL, "x") != HOOP_ERR_INVALID_ARG;
  if (hoop_iallreduce(comm, xs, ys, N, HOOP_FLOAT32, HOOP_SUM, &req) == HOOP_OK) {
    bad += hoop_test(req, NULL) != HOOP_ERR_INVALID_ARG; /* no flag: refused, the request kept */
    bad += hoop_wait(req) != HOOP_OK;
  } else {
    bad++;
  }
  if (bad)
    fprintf(stderr,
            "rank %d: %d of the table's %zu refusals (and the calls without a "
            "communicator) were not as expected\n",
            rank, bad, CALLS);
  else
    fprintf(stderr,
            "rank %d: %zu bad calls refused, each naming the call and the argument, the "
            "communicator working after each\n",
            rank, CALLS);
  hoop_finalize(comm);
  return bad != 0;
}

START_TEST(test_argument_table) {
  int port = procs_free_port();
  ck_assert_int_eq(procs_fork_ranks(2, argument_rank, &port, 120), 0);
}
END_TEST

int main(void) {
  Suite *s = suite_create("arguments");
  TCase *tc = tcase_create("table");
  tcase_set_timeout(tc, 150);
  tcase_add_test(tc, test_argument_table);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
