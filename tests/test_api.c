/* test_api.c - the API's contract outside the happy path: invalid arguments give
 * HOOP_ERR_INVALID_ARG with a message and leave the communicator usable; a join that cannot
 * complete times out naming the missing ranks; a missing server is reported; abort and failure
 * make later calls fail; names and sizes of dtypes, ops and results. */
#include <check.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/env.h"
#include "core/fingerprint.h"
#include "hoop.h"
#include "proto/auth.h"
#include "support/procs.h"
#include "util/lock.h"
#include "util/netaddr.h"

static hoop_comm *single_rank(void) {
  hoop_config config;
  hoop_config_init(&config);
  config.size = 1;
  hoop_comm *comm = NULL;
  ck_assert_int_eq(hoop_init(&comm, &config), HOOP_OK);
  return comm;
}

#define ASSERT_INVALID(call, comm)                                                                 \
  do {                                                                                             \
    hoop_result got_ = (call);                                                                     \
    ck_assert_msg(got_ == HOOP_ERR_INVALID_ARG, "%s: expected invalid argument, got %s", #call,    \
                  hoop_strerror(got_));                                                            \
    ck_assert_msg(strlen(hoop_last_error(comm)) > 0, "%s: no message in hoop_last_error", #call);  \
  } while (0)

START_TEST(test_invalid_arguments) {
  hoop_comm *comm = single_rank();
  float x[4] = {1, 2, 3, 4}, y[4];
  ASSERT_INVALID(hoop_allreduce(comm, x, y, 4, (hoop_dtype)99, HOOP_SUM), comm);
  ck_assert_ptr_nonnull(strstr(hoop_last_error(comm), "dtype"));
  ASSERT_INVALID(hoop_allreduce(comm, x, y, 4, HOOP_FLOAT32, (hoop_op)42), comm);
  ck_assert_ptr_nonnull(strstr(hoop_last_error(comm), "op"));
  ASSERT_INVALID(hoop_allreduce(comm, NULL, y, 4, HOOP_FLOAT32, HOOP_SUM), comm);
  ASSERT_INVALID(hoop_allreduce(comm, x, NULL, 4, HOOP_FLOAT32, HOOP_SUM), comm);
  ASSERT_INVALID(hoop_broadcast(comm, x, 4, HOOP_FLOAT32, 1), comm);
  ck_assert_ptr_nonnull(strstr(hoop_last_error(comm), "root"));
  ASSERT_INVALID(hoop_broadcast(comm, x, 4, HOOP_FLOAT32, -1), comm);
  ASSERT_INVALID(hoop_broadcast(comm, NULL, 4, HOOP_FLOAT32, 0), comm);
  ASSERT_INVALID(hoop_allgather(comm, NULL, y, 4, HOOP_FLOAT32), comm);
  ASSERT_INVALID(hoop_allgather(comm, x, y, (size_t)-1 / 2, HOOP_FLOAT32), comm);
  ck_assert_int_eq(hoop_allreduce(NULL, x, y, 4, HOOP_FLOAT32, HOOP_SUM), HOOP_ERR_INVALID_ARG);
  /* Count 0 is valid with NULL buffers, and nothing was lost: the communicator still works. */
  ck_assert_int_eq(hoop_allreduce(comm, NULL, NULL, 0, HOOP_FLOAT32, HOOP_SUM), HOOP_OK);
  ck_assert_int_eq(hoop_allreduce(comm, x, y, 4, HOOP_FLOAT32, HOOP_SUM), HOOP_OK);
  ck_assert(y[0] == 1 && y[3] == 4);
  ck_assert_int_eq(hoop_barrier(comm), HOOP_OK);
  /* The stream variants: with no stream and host buffers, the plain call; a stream where no CUDA
   * driver loads is refused, naming the call, and loses nothing. */
  ck_assert_int_eq(hoop_allreduce_stream(comm, x, y, 4, HOOP_FLOAT32, HOOP_MAX, NULL), HOOP_OK);
  ck_assert(y[0] == 1 && y[3] == 4);
  ck_assert_int_eq(hoop_broadcast_stream(comm, y, 4, HOOP_FLOAT32, 0, NULL), HOOP_OK);
  ck_assert_int_eq(hoop_allgather_stream(comm, x, y, 4, HOOP_FLOAT32, NULL), HOOP_OK);
  if (!hoop_cuda_supported()) {
    int not_a_stream;
    ck_assert_int_eq(hoop_allreduce_stream(comm, x, y, 4, HOOP_FLOAT32, HOOP_SUM, &not_a_stream),
                     HOOP_ERR_UNSUPPORTED);
    ck_assert_ptr_nonnull(strstr(hoop_last_error(comm), "hoop_allreduce_stream"));
    ck_assert_int_eq(hoop_allreduce(comm, x, y, 4, HOOP_FLOAT32, HOOP_SUM), HOOP_OK);
  }
  hoop_finalize(comm);
}
END_TEST

/* hoop_name_next: a name goes into the next call's fingerprint on that communicator only, once;
 * two calls that differ only in their names do not match, and the mismatch names both (a peer's
 * name this rank never used by its hash); names are shown printable and cut at HOOP_NAME_MAX. */
START_TEST(test_call_names) {
  hoop_comm *comm = single_rank(), *other = single_rank();
  ck_assert_int_eq(hoop_name_next(NULL, "x"), HOOP_ERR_INVALID_ARG);
  ck_assert_int_eq(hoop_name_next(comm, "grad.a"), HOOP_OK);
  uint32_t a = hoop__name_take(comm);
  ck_assert_uint_ne(a, 0);
  ck_assert_uint_eq(hoop__name_take(comm), 0); /* one call only */
  ck_assert_int_eq(hoop_name_next(comm, "grad.b"), HOOP_OK);
  ck_assert_uint_eq(hoop__name_take(other), 0); /* a post on another communicator drops it */
  ck_assert_uint_eq(hoop__name_take(comm), 0);
  ck_assert_int_eq(hoop_name_next(comm, "grad.b"), HOOP_OK);
  ck_assert_int_eq(hoop_name_next(comm, NULL), HOOP_OK); /* cleared */
  ck_assert_uint_eq(hoop__name_take(comm), 0);
  ck_assert_int_eq(hoop_name_next(comm, "grad.b"), HOOP_OK);
  uint32_t b = hoop__name_take(comm);
  ck_assert_uint_ne(a, b);

  uint8_t ours[HOOP__FINGERPRINT_BYTES], theirs[HOOP__FINGERPRINT_BYTES];
  hoop__fingerprint_encode(comm, HOOP__COLL_ALLREDUCE, 3, HOOP_FLOAT32, HOOP_SUM, -1, a, 0);
  memcpy(ours, hoop__fingerprint_bytes(comm), sizeof ours);
  hoop__fingerprint_encode(comm, HOOP__COLL_ALLREDUCE, 3, HOOP_FLOAT32, HOOP_SUM, -1, b, 0);
  memcpy(theirs, hoop__fingerprint_bytes(comm), sizeof theirs);
  ck_assert(!hoop__fingerprints_match(ours, theirs));
  ck_assert_uint_eq(hoop__fingerprint_count(ours), 3);
  hoop__fingerprint_encode(comm, HOOP__COLL_BROADCAST, (size_t)1 << 47, HOOP_INT8, -1, 16383, 0, 0);
  ck_assert_uint_eq(hoop__fingerprint_count(hoop__fingerprint_bytes(comm)), (size_t)1 << 47);
  ck_assert_int_eq(hoop__mismatch(comm, 1, theirs, ours, 0, 0), HOOP_ERR_MISMATCH);
  const char *text = hoop_last_error(comm);
  ck_assert_msg(strstr(text, "name \"grad.a\") on rank 0") &&
                    strstr(text, "name \"grad.b\") on rank 1"),
                "%s", text);

  /* A peer's name this rank never used: its hash. Long and unprintable names: cut, '?'. */
  char long_name[200];
  memset(long_name, 'n', sizeof long_name - 1);
  long_name[sizeof long_name - 1] = '\0';
  long_name[3] = '\n';
  ck_assert_int_eq(hoop_name_next(other, long_name), HOOP_OK);
  uint32_t l = hoop__name_take(other);
  hoop__fingerprint_encode(other, HOOP__COLL_BARRIER, 0, HOOP_UINT8, -1, -1, l, 0);
  memcpy(ours, hoop__fingerprint_bytes(other), sizeof ours);
  hoop__fingerprint_encode(other, HOOP__COLL_BARRIER, 0, HOOP_UINT8, -1, -1, 0x1234abcd, 0);
  memcpy(theirs, hoop__fingerprint_bytes(other), sizeof theirs);
  hoop__mismatch(other, 1, theirs, ours, 0, 0);
  text = hoop_last_error(other);
  ck_assert_msg(strstr(text, "name \"nnn?nnnn") && strstr(text, "name #1234abcd"), "%s", text);
  const char *shown = strstr(text, "name \"") + 6;
  ck_assert_msg(strchr(shown, '"') - shown == HOOP_NAME_MAX - 1, "%s", text);
  hoop_comm *third = single_rank();
  /* A call compressed on one rank and exact, or in another format, on the other. */
  hoop__fingerprint_encode(third, HOOP__COLL_ALLREDUCE, 3, HOOP_FLOAT32, HOOP_SUM, -1, 0,
                           HOOP_COMPRESS_INT8 | HOOP_COMPRESS_STOCHASTIC);
  memcpy(ours, hoop__fingerprint_bytes(third), sizeof ours);
  hoop__fingerprint_encode(third, HOOP__COLL_ALLREDUCE, 3, HOOP_FLOAT32, HOOP_SUM, -1, 0,
                           HOOP_COMPRESS_BF16);
  memcpy(theirs, hoop__fingerprint_bytes(third), sizeof theirs);
  ck_assert(!hoop__fingerprints_match(ours, theirs));
  ck_assert_int_eq(hoop__mismatch(third, 1, theirs, ours, 0, 0), HOOP_ERR_MISMATCH);
  text = hoop_last_error(third);
  ck_assert_msg(strstr(text, "compressed int8+stochastic) on rank 0") &&
                    strstr(text, "compressed bf16) on rank 1"),
                "%s", text);

  hoop_finalize(third);
  hoop_finalize(other);
  hoop_finalize(comm);
}
END_TEST

/* hoop_comm_set_timeout: a number of seconds above 0 is taken and read back, and a sub-communicator
 * made afterwards starts with it; others are refused with a message, the timeout unchanged. */
START_TEST(test_comm_timeout) {
  hoop_comm *comm = single_rank();
  ck_assert(hoop_comm_timeout(comm) > 0);
  ck_assert_int_eq(hoop_comm_set_timeout(comm, 12.5), HOOP_OK);
  ck_assert(hoop_comm_timeout(comm) == 12.5);
  ASSERT_INVALID(hoop_comm_set_timeout(comm, 0), comm);
  ASSERT_INVALID(hoop_comm_set_timeout(comm, -1), comm);
  ASSERT_INVALID(hoop_comm_set_timeout(comm, 0.0 / 0.0), comm);
  ck_assert(hoop_comm_timeout(comm) == 12.5);
  ck_assert_int_eq(hoop_comm_set_timeout(NULL, 1), HOOP_ERR_INVALID_ARG);
  ck_assert(hoop_comm_timeout(NULL) == 0);
  hoop_comm *row = NULL;
  ck_assert_int_eq(hoop_comm_split(comm, 0, 0, &row), HOOP_OK);
  ck_assert(hoop_comm_timeout(row) == 12.5);
  ck_assert_int_eq(hoop_comm_set_timeout(row, 3), HOOP_OK);
  ck_assert(hoop_comm_timeout(row) == 3 && hoop_comm_timeout(comm) == 12.5);
  ck_assert_int_eq(hoop_finalize(row), HOOP_OK);
  ck_assert_int_eq(hoop_finalize(comm), HOOP_OK); /* the view counted out: nothing held */
}
END_TEST

/* hoop_comm_set_reproducible: off by default, 1 and 0 taken and read back, a sub-communicator
 * made afterwards starts with it; other values refused with a message; HOOP_REPRODUCIBLE and
 * hoop_config's reproducible turn it on at init, a bad HOOP_REPRODUCIBLE fails init. A reducing
 * call on one rank gives its input in the mode too. */
START_TEST(test_comm_reproducible) {
  hoop_comm *comm = single_rank();
  ck_assert_int_eq(hoop_comm_reproducible(comm), 0);
  ck_assert_int_eq(hoop_comm_set_reproducible(comm, 1), HOOP_OK);
  ck_assert_int_eq(hoop_comm_reproducible(comm), 1);
  ASSERT_INVALID(hoop_comm_set_reproducible(comm, 2), comm);
  ck_assert_int_eq(hoop_comm_reproducible(comm), 1);
  ck_assert_int_eq(hoop_comm_set_reproducible(NULL, 1), HOOP_ERR_INVALID_ARG);
  ck_assert_int_eq(hoop_comm_reproducible(NULL), 0);
  hoop_comm *row = NULL;
  ck_assert_int_eq(hoop_comm_split(comm, 0, 0, &row), HOOP_OK);
  ck_assert_int_eq(hoop_comm_reproducible(row), 1);
  float in[3] = {1.5f, -2.25f, 1e-8f}, out[3] = {0};
  ck_assert_int_eq(hoop_allreduce(row, in, out, 3, HOOP_FLOAT32, HOOP_AVG), HOOP_OK);
  ck_assert(memcmp(in, out, sizeof in) == 0);
  ck_assert_int_eq(hoop_comm_set_reproducible(row, 0), HOOP_OK);
  ck_assert(hoop_comm_reproducible(row) == 0 && hoop_comm_reproducible(comm) == 1);
  ck_assert_int_eq(hoop_finalize(row), HOOP_OK);
  ck_assert_int_eq(hoop_finalize(comm), HOOP_OK);

  hoop_config config;
  hoop_config_init(&config);
  config.size = 1;
  config.reproducible = 1;
  ck_assert_int_eq(hoop_init(&comm, &config), HOOP_OK);
  ck_assert_int_eq(hoop_comm_reproducible(comm), 1);
  ck_assert_int_eq(hoop_finalize(comm), HOOP_OK);
  setenv("HOOP_REPRODUCIBLE", "1", 1);
  comm = single_rank();
  ck_assert_int_eq(hoop_comm_reproducible(comm), 1);
  ck_assert_int_eq(hoop_finalize(comm), HOOP_OK);
  setenv("HOOP_REPRODUCIBLE", "yes", 1);
  config.reproducible = 0;
  ck_assert_int_eq(hoop_init(&comm, &config), HOOP_ERR_INVALID_ARG);
  ck_assert_msg(strstr(hoop_last_error(comm), "HOOP_REPRODUCIBLE 'yes' is not 0 or 1"), "%s",
                hoop_last_error(comm));
  hoop_finalize(comm);
  unsetenv("HOOP_REPRODUCIBLE");
}
END_TEST

/* hoop_register and hoop_deregister: bad arguments are refused with a message that names them,
 * and a registered buffer works in collectives (over TCP registration is bookkeeping only). */
START_TEST(test_register_arguments) {
  hoop_comm *comm = single_rank();
  float x[64] = {0}, y[64];
  hoop_mem_handle handle = 12345, other;
  ASSERT_INVALID(hoop_register(comm, NULL, sizeof x, &handle), comm);
  ck_assert_msg(strstr(hoop_last_error(comm), "ptr is NULL") != NULL,
                "NULL ptr: expected 'ptr is NULL', got: %s", hoop_last_error(comm));
  ck_assert_msg(handle == 0, "a refused registration must leave handle 0, got %llu",
                (unsigned long long)handle);
  ASSERT_INVALID(hoop_register(comm, x, 0, &handle), comm);
  ck_assert_msg(strstr(hoop_last_error(comm), "bytes is 0") != NULL,
                "zero bytes: expected 'bytes is 0', got: %s", hoop_last_error(comm));
  ASSERT_INVALID(hoop_register(comm, x, sizeof x, NULL), comm);
  ck_assert_msg(strstr(hoop_last_error(comm), "handle is NULL") != NULL,
                "NULL handle: expected 'handle is NULL', got: %s", hoop_last_error(comm));
  ASSERT_INVALID(hoop_register(comm, x, SIZE_MAX, &handle), comm);
  ck_assert_int_eq(hoop_register(NULL, x, sizeof x, &handle), HOOP_ERR_INVALID_ARG);

  ck_assert_int_eq(hoop_register(comm, x, sizeof x, &handle), HOOP_OK);
  ck_assert_msg(handle != 0, "a registration must return a non-zero handle");
  ck_assert_int_eq(hoop_register(comm, y, sizeof y, &other), HOOP_OK);
  ck_assert_msg(other != handle, "two registrations got the same handle %llu",
                (unsigned long long)handle);
  ck_assert_int_eq(hoop_allreduce(comm, x, y, 64, HOOP_FLOAT32, HOOP_SUM), HOOP_OK);

  ASSERT_INVALID(hoop_deregister(comm, handle + other + 1000), comm);
  ck_assert_msg(strstr(hoop_last_error(comm), "not registered") != NULL,
                "unknown handle: expected 'not registered', got: %s", hoop_last_error(comm));
  ASSERT_INVALID(hoop_deregister(comm, 0), comm);
  ck_assert_int_eq(hoop_deregister(comm, handle), HOOP_OK);
  ASSERT_INVALID(hoop_deregister(comm, handle), comm); /* the second time */
  ck_assert_msg(strstr(hoop_last_error(comm), "already deregistered") != NULL,
                "double deregister: expected 'already deregistered', got: %s",
                hoop_last_error(comm));
  ck_assert_int_eq(hoop_deregister(NULL, other), HOOP_ERR_INVALID_ARG);
  /* A new registration of the same memory never gets the released handle back. */
  hoop_mem_handle again;
  ck_assert_int_eq(hoop_register(comm, x, sizeof x, &again), HOOP_OK);
  ck_assert_msg(again != handle, "a released handle (%llu) was handed out again",
                (unsigned long long)handle);
  /* other and again are left for hoop_finalize, which releases them (ASan sees any leak). */
  hoop_finalize(comm);
}
END_TEST

START_TEST(test_invalid_config) {
  hoop_config config;
  hoop_config_init(&config);
  hoop_comm *comm = NULL;
  config.size = 0;
  ck_assert_int_eq(hoop_init(&comm, &config), HOOP_ERR_INVALID_ARG);
  ck_assert_ptr_nonnull(strstr(hoop_last_error(comm), "size"));
  hoop_finalize(comm);
  config.size = 2;
  config.rendezvous = NULL;
  ck_assert_int_eq(hoop_init(&comm, &config), HOOP_ERR_INVALID_ARG);
  ck_assert_ptr_nonnull(strstr(hoop_last_error(comm), "HOOP_RENDEZVOUS"));
  hoop_finalize(comm);
  config.rendezvous = "127.0.0.1:1";
  config.rank = 2;
  ck_assert_int_eq(hoop_init(&comm, &config), HOOP_ERR_INVALID_ARG);
  hoop_finalize(comm);
  config.rank = -1;
  config.rendezvous = "no-port-here";
  ck_assert_int_eq(hoop_init(&comm, &config), HOOP_ERR_INVALID_ARG);
  ck_assert_ptr_nonnull(strstr(hoop_last_error(comm), "host:port"));
  hoop_finalize(comm);
  ck_assert_int_eq(hoop_init(NULL, &config), HOOP_ERR_INVALID_ARG);
}
END_TEST

/* hoop_config carries its own size: a config hoop_config_init never saw is refused; a program
 * built against a newer hoop.h (a bigger struct) runs while it leaves the fields unknown here
 * unset, and is refused, naming the versions, when it sets one; hoop_version is configure's. */
START_TEST(test_config_size_and_version) {
  ck_assert_str_eq(hoop_version(), HOOP_VERSION_STRING);
  ck_assert_int_eq(HOOP_VERSION_NUMBER,
                   HOOP_VERSION_MAJOR * 10000 + HOOP_VERSION_MINOR * 100 + HOOP_VERSION_PATCH);
  hoop_config config;
  memset(&config, 0, sizeof config);
  config.size = 1;
  hoop_comm *comm = NULL;
  ck_assert_int_eq(hoop_init(&comm, &config), HOOP_ERR_INVALID_ARG);
  ck_assert_msg(strstr(hoop_last_error(comm), "hoop_config_init") != NULL, "got '%s'",
                hoop_last_error(comm));
  hoop_finalize(comm);

  hoop_config_init(&config);
  ck_assert_uint_eq(config.struct_size, sizeof config);
  ck_assert_uint_eq(config.version, HOOP_VERSION_NUMBER);

  /* A newer program's config: 32 more bytes that this library does not know. */
  size_t newer = sizeof(hoop_config) + 32;
  unsigned char *bytes = calloc(1, newer);
  ck_assert_ptr_nonnull(bytes);
  memset(bytes, 0xAB, newer);
  hoop_config *grown = (hoop_config *)bytes;
  hoop_config_init_sized(grown, newer, HOOP_VERSION_NUMBER + 100);
  ck_assert_uint_eq(grown->struct_size, newer);
  ck_assert_int_eq(bytes[sizeof(hoop_config) + 31], 0); /* the unknown fields are unset */
  ck_assert_int_eq(grown->tcp_streams, 2);              /* the known ones have defaults */
  grown->size = 1;
  ck_assert_int_eq(hoop_init(&comm, grown), HOOP_OK);
  ck_assert_int_eq(hoop_barrier(comm), HOOP_OK);
  hoop_finalize(comm);
  bytes[sizeof(hoop_config) + 5] = 1;
  ck_assert_int_eq(hoop_init(&comm, grown), HOOP_ERR_UNSUPPORTED);
  ck_assert_msg(strstr(hoop_last_error(comm), "does not know") != NULL, "got '%s'",
                hoop_last_error(comm));
  hoop_finalize(comm);
  free(bytes);
}
END_TEST

START_TEST(test_env_errors) {
  setenv("HOOP_SIZE", "three", 1);
  hoop_comm *comm = NULL;
  ck_assert_int_eq(hoop_init_from_env(&comm), HOOP_ERR_INVALID_ARG);
  ck_assert_ptr_nonnull(strstr(hoop_last_error(comm), "HOOP_SIZE"));
  hoop_finalize(comm);
  unsetenv("HOOP_SIZE");
  setenv("HOOP_TIMEOUT", "-4", 1);
  ck_assert_int_eq(hoop_init_from_env(&comm), HOOP_ERR_INVALID_ARG);
  ck_assert_ptr_nonnull(strstr(hoop_last_error(comm), "HOOP_TIMEOUT"));
  hoop_finalize(comm);
  unsetenv("HOOP_TIMEOUT");
  /* No launcher variables at all: a job of one rank. */
  ck_assert_int_eq(hoop_init_from_env(&comm), HOOP_OK);
  ck_assert_int_eq(hoop_size(comm), 1);
  ck_assert_int_eq(hoop_rank(comm), 0);
  hoop_finalize(comm);
}
END_TEST

START_TEST(test_names) {
  ck_assert_str_eq(hoop_strerror(HOOP_ERR_PEER_LOST), "peer lost");
  ck_assert_str_eq(hoop_strerror(HOOP_OK), "success");
  for (int d = 0; d < HOOP_DTYPE_COUNT; d++) {
    hoop_dtype parsed;
    ck_assert_int_eq(hoop_dtype_from_name(hoop_dtype_name((hoop_dtype)d), &parsed), 0);
    ck_assert_int_eq(parsed, d);
    ck_assert_uint_gt(hoop_dtype_size((hoop_dtype)d), 0);
  }
  ck_assert_uint_eq(hoop_dtype_size(HOOP_BFLOAT16), 2);
  ck_assert_uint_eq(hoop_dtype_size(HOOP_UINT64), 8);
  ck_assert_uint_eq(hoop_dtype_size((hoop_dtype)77), 0);
  for (int o = 0; o < HOOP_OP_COUNT; o++) {
    hoop_op parsed;
    ck_assert_int_eq(hoop_op_from_name(hoop_op_name((hoop_op)o), &parsed), 0);
    ck_assert_int_eq(parsed, o);
  }
  hoop_op op;
  ck_assert_int_eq(hoop_op_from_name("median", &op), -1);
}
END_TEST

/* HOOP_IFNAME's syntax is NCCL_SOCKET_IFNAME's: prefixes, ^ to exclude, = for exact names. */
START_TEST(test_ifname_syntax) {
  ck_assert(hoop__ifname_matches("eth", "eth3"));
  ck_assert(hoop__ifname_matches("ib,eth", "eth0"));
  ck_assert(!hoop__ifname_matches("ib,eth", "docker0"));
  ck_assert(!hoop__ifname_matches("^docker,lo", "lo"));
  ck_assert(hoop__ifname_matches("^docker,lo", "ens5"));
  ck_assert(hoop__ifname_matches("=eth0", "eth0"));
  ck_assert(!hoop__ifname_matches("=eth0", "eth01"));
  ck_assert(!hoop__ifname_matches("^=eth0", "eth0"));
  ck_assert(hoop__ifname_matches("^=eth0", "eth01"));
}
END_TEST

/* hoop-env(7) documents every variable of the table in lib/core/env.c, each as a tagged paragraph.
 */
START_TEST(test_env_manual_complete) {
  char path[4096];
  const char *srcdir = getenv("HOOP_SRCDIR");
  snprintf(path, sizeof path, "%s/man/hoop-env.7", srcdir && srcdir[0] ? srcdir : ".");
  char *manual = procs_slurp(path);
  ck_assert_msg(manual != NULL, "cannot read %s", path);
  for (const hoop__env_var *var = hoop__env_table(); var->name; var++) {
    char entry[128];
    snprintf(entry, sizeof entry, ".TP\n.B %s\n", var->name);
    ck_assert_msg(strstr(manual, entry) != NULL, "hoop-env.7 does not document %s", var->name);
  }
  free(manual);
}
END_TEST

/* Every variable the library reads through env.h is in the table: a name missing there reads as
 * empty (no default: a byte count then warns on every communicator), and hoop-env(7), --help and
 * the configuration log line miss it. The sources are searched for the calls. */
START_TEST(test_env_names_in_table) {
  const char *srcdir = getenv("HOOP_SRCDIR");
  char command[4096];
  snprintf(command, sizeof command,
           "cd '%s' && grep -rhoE 'hoop__env_(get|bytes|is_set)\\(\"HOOP_[A-Z0-9_]+\"' lib "
           "transports tools --include='*.c' | grep -oE 'HOOP_[A-Z0-9_]+' | sort -u",
           srcdir && srcdir[0] ? srcdir : ".");
  FILE *names = popen(command, "r");
  ck_assert_msg(names != NULL, "cannot run: %s", command);
  char name[128];
  int seen = 0;
  while (fgets(name, sizeof name, names)) {
    name[strcspn(name, "\n")] = '\0';
    int found = 0;
    for (const hoop__env_var *var = hoop__env_table(); var->name && !found; var++)
      found = strcmp(var->name, name) == 0;
    ck_assert_msg(found, "%s is read through env.h but is not in lib/core/env.c's table", name);
    seen++;
  }
  ck_assert_int_eq(pclose(names), 0);
  ck_assert_msg(seen >= 20, "found only %d variables in the sources (%s)", seen, command);
}
END_TEST

/* A token and a token file at once, an overlong token and an unreadable token file are refused
 * with a message; a job of one rank with a token needs no server and works. */
START_TEST(test_token_config) {
  hoop_config config;
  hoop_config_init(&config);
  config.size = 1;
  config.token = "secret";
  config.token_file = "/nonexistent";
  hoop_comm *comm = NULL;
  ck_assert_int_eq(hoop_init(&comm, &config), HOOP_ERR_INVALID_ARG);
  ck_assert_msg(strstr(hoop_last_error(comm), "set one") != NULL,
                "token and token file: expected 'set one', got: %s", hoop_last_error(comm));
  hoop_finalize(comm);
  config.token = NULL;
  ck_assert_int_eq(hoop_init(&comm, &config), HOOP_ERR_AUTH);
  ck_assert_msg(strstr(hoop_last_error(comm), "/nonexistent") != NULL,
                "a missing token file: expected its path in the message, got: %s",
                hoop_last_error(comm));
  hoop_finalize(comm);
  static char long_token[HOOP__MAX_TOKEN + 2];
  memset(long_token, 'k', sizeof long_token - 1);
  config.token = long_token;
  config.token_file = NULL;
  ck_assert_int_eq(hoop_init(&comm, &config), HOOP_ERR_INVALID_ARG);
  hoop_finalize(comm);
  config.token = "secret";
  ck_assert_int_eq(hoop_init(&comm, &config), HOOP_OK);
  ck_assert_int_eq(hoop_barrier(comm), HOOP_OK);
  hoop_finalize(comm);
}
END_TEST

typedef struct token_case {
  int port;
  const char *tokens[2]; /* rank i's token */
} token_case;

/* Rank 0 hosts the rendezvous with its token. With equal tokens both ranks sum their ranks; with
 * another token rank 1 is refused (HOOP_ERR_AUTH) and rank 0, whose job then never completes,
 * times out naming the missing rank. */
static int join_with_token(int index, int n, void *arg) {
  token_case *tc = arg;
  char rendezvous[64];
  hoop_config config;
  procs_local_config(&config, rendezvous, sizeof rendezvous, tc->port, index, n);
  config.token = tc->tokens[index];
  config.timeout_s = 3;
  int same = strcmp(tc->tokens[0], tc->tokens[1]) == 0;
  hoop_comm *comm = NULL;
  hoop_result result = hoop_init(&comm, &config);
  int value = index, bad;
  if (same)
    bad = result != HOOP_OK ||
          hoop_allreduce(comm, &value, &value, 1, HOOP_INT32, HOOP_SUM) != HOOP_OK || value != 1;
  else if (index == 1)
    bad = result != HOOP_ERR_AUTH || strstr(hoop_last_error(comm), "authentication failed") == NULL;
  else
    bad = result != HOOP_ERR_TIMEOUT || strstr(hoop_last_error(comm), "missing ranks: 1") == NULL;
  if (bad)
    fprintf(stderr, "rank %d with token '%s': %s: %s\n", index, tc->tokens[index],
            hoop_strerror(result), hoop_last_error(comm));
  hoop_finalize(comm);
  return bad;
}

START_TEST(test_self_hosted_job_with_token) {
  token_case same = {procs_free_port(), {"shared secret", "shared secret"}};
  ck_assert_int_eq(procs_fork_ranks(2, join_with_token, &same, 30), 0);
  token_case other = {procs_free_port(), {"shared secret", "shared secreT"}};
  ck_assert_int_eq(procs_fork_ranks(2, join_with_token, &other, 30), 0);
}
END_TEST

/* ---- multi-rank failures --------------------------------------------------------------------- */

typedef struct join_case {
  int port;
  int size;       /* the size every rank claims */
  double timeout; /* HOOP_TIMEOUT of the ranks */
  const char *must_contain[3];
  hoop_result expect;
} join_case;

static int join_and_expect(int index, int n, void *arg) {
  const join_case *jc = arg;
  char rendezvous[64];
  snprintf(rendezvous, sizeof rendezvous, "127.0.0.1:%d", jc->port);
  hoop_config config;
  hoop_config_init(&config);
  config.rendezvous = rendezvous;
  config.job = "incomplete";
  config.size = jc->size;
  config.rank = index;
  config.serve_rendezvous = index == 0;
  config.timeout_s = jc->timeout;
  hoop_comm *comm = NULL;
  hoop_result result = hoop_init(&comm, &config);
  int bad = result != jc->expect;
  for (int i = 0; i < 3 && jc->must_contain[i]; i++)
    bad |= strstr(hoop_last_error(comm), jc->must_contain[i]) == NULL;
  if (bad)
    fprintf(stderr, "rank %d: expected %s mentioning '%s', got %s: %s\n", index,
            hoop_strerror(jc->expect), jc->must_contain[0], hoop_strerror(result),
            hoop_last_error(comm));
  hoop_finalize(comm);
  return bad;
}

START_TEST(test_join_timeout_names_missing) {
  /* Ranks 0 and 1 of a job of 4 start; 2 and 3 never come. */
  join_case jc = {
      procs_free_port(), 4, 2.0, {"2 of 4", "missing ranks: 2, 3", NULL}, HOOP_ERR_TIMEOUT};
  ck_assert_int_eq(procs_fork_ranks(2, join_and_expect, &jc, 30), 0);
}
END_TEST

START_TEST(test_no_server) {
  /* Nobody hosts the rendezvous: the rank says so once its timeout passes. */
  join_case jc = {procs_free_port(), 2, 1.0, {"no server answered", NULL, NULL}, HOOP_ERR_TIMEOUT};
  hoop_config config;
  hoop_config_init(&config);
  char rendezvous[64];
  snprintf(rendezvous, sizeof rendezvous, "127.0.0.1:%d", jc.port);
  config.rendezvous = rendezvous;
  config.size = 2;
  config.rank = 1;
  config.timeout_s = 1.0;
  hoop_comm *comm = NULL;
  ck_assert_int_eq(hoop_init(&comm, &config), HOOP_ERR_TIMEOUT);
  ck_assert_msg(strstr(hoop_last_error(comm), jc.must_contain[0]) != NULL,
                "expected a message about no server, got: %s", hoop_last_error(comm));
  hoop_finalize(comm);
}
END_TEST

static int abort_then_call(int index, int n, void *arg) {
  int port = *(int *)arg;
  char rendezvous[64];
  hoop_config config;
  procs_local_config(&config, rendezvous, sizeof rendezvous, port, index, n);
  config.timeout_s = 20;
  hoop_comm *comm = NULL;
  if (hoop_init(&comm, &config) != HOOP_OK)
    return 10;
  int bad = 0;
  int value = 1;
  /* An invalid call on every rank changes nothing: the next collective still works. */
  bad |= hoop_broadcast(comm, &value, 1, HOOP_INT32, n) != HOOP_ERR_INVALID_ARG;
  hoop_result before = hoop_allreduce(comm, &value, &value, 1, HOOP_INT32, HOOP_SUM);
  if (before != HOOP_OK || value != n) {
    fprintf(stderr, "rank %d before the abort: allreduce gave %s (%d): %s\n", index,
            hoop_strerror(before), value, hoop_last_error(comm));
    bad = 1;
  }
  if (index == 0) {
    bad |= hoop_abort(comm, "test abort") != HOOP_OK;
    bad |= hoop_barrier(comm) != HOOP_ERR_ABORTED;
    bad |= strstr(hoop_last_error(comm), "test abort") == NULL;
  } else {
    /* The aborting rank told this one why before closing: its next call fails with the reason,
     * it does not hang, and later calls are refused. */
    hoop_result result = hoop_allreduce(comm, &value, &value, 1, HOOP_INT32, HOOP_SUM);
    char first[1024];
    snprintf(first, sizeof first, "%s", hoop_last_error(comm));
    hoop_result later = hoop_barrier(comm);
    bad |= result != HOOP_ERR_ABORTED || strstr(first, "aborted by rank 0: test abort") == NULL;
    bad |= later != HOOP_ERR_ABORTED;
    if (bad)
      fprintf(stderr,
              "rank %d after abort: expected HOOP_ERR_ABORTED with the reason, then a "
              "refused barrier; got %s: %s; then %s: %s\n",
              index, hoop_strerror(result), first, hoop_strerror(later), hoop_last_error(comm));
  }
  hoop_finalize(comm);
  return bad;
}

START_TEST(test_abort_and_refusal) {
  int port = procs_free_port();
  ck_assert_int_eq(procs_fork_ranks(2, abort_then_call, &port, 40), 0);
}
END_TEST

/* Ranks that disagree on HOOP_TCP_STREAMS would cut messages differently: the accepting rank
 * refuses with a message naming both values, and neither rank hangs. */
static int streams_disagree(int index, int n, void *arg) {
  int port = *(int *)arg;
  char rendezvous[64];
  hoop_config config;
  procs_local_config(&config, rendezvous, sizeof rendezvous, port, index, n);
  config.timeout_s = 10;
  config.tcp_streams = index == 0 ? 4 : 2;
  config.transport = "tcp"; /* streams are TCP's: between ranks of one host too */
  hoop_comm *comm = NULL;
  hoop_result result = hoop_init(&comm, &config);
  /* The connecting rank may finish its init before the other refuses (connections complete in
   * the kernel's backlog): then its first collective must fail instead of succeeding or hanging. */
  if (result == HOOP_OK && index == 0)
    result = hoop_barrier(comm);
  int bad = result == HOOP_OK;
  if (index == 1)
    bad |= result != HOOP_ERR_INVALID_ARG ||
           strstr(hoop_last_error(comm), "HOOP_TCP_STREAMS=4 but this rank uses 2") == NULL;
  if (bad)
    fprintf(stderr, "rank %d: expected a refused init or call, got %s: %s\n", index,
            hoop_strerror(result), hoop_last_error(comm));
  hoop_finalize(comm);
  return bad;
}

START_TEST(test_streams_must_agree) {
  int port = procs_free_port();
  ck_assert_int_eq(procs_fork_ranks(2, streams_disagree, &port, 40), 0);
}
END_TEST

/* hoop_config's encrypt reaches the TCP transport: a job sealed with ChaCha20-Poly1305 through it
 * works, whatever HOOP_ENCRYPT says; a rank whose config says "0" beside one that seals is refused
 * naming both; a value that is not one is refused at the listener. */
typedef struct encrypt_case {
  int port;
  const char *mine[2];
  int ok; /* the job should work */
} encrypt_case;
static int encrypt_by_config(int index, int n, void *arg) {
  const encrypt_case *c = arg;
  char rendezvous[64];
  hoop_config config;
  procs_local_config(&config, rendezvous, sizeof rendezvous, c->port, index, n);
  config.timeout_s = 10;
  config.transport = "tcp";
  config.encrypt = c->mine[index];
  hoop_comm *comm = NULL;
  hoop_result result = hoop_init(&comm, &config);
  float value[3] = {1.5f, (float)index, 2.0f};
  if (result == HOOP_OK)
    result = hoop_allreduce(comm, value, value, 3, HOOP_FLOAT32, HOOP_SUM);
  const char *error = hoop_last_error(comm);
  int bad = c->ok ? result != HOOP_OK || value[0] != 3.0f || value[1] != 1.0f : result == HOOP_OK;
  if (!c->ok && index == 1 && strcmp(c->mine[1], "rot13") != 0)
    bad |= strstr(error, "seals its connections with ChaCha20-Poly1305 but this rank with "
                         "nothing (in clear)") == NULL;
  if (!c->ok && strcmp(c->mine[index], "rot13") == 0)
    bad |= strstr(error, "HOOP_ENCRYPT 'rot13'") == NULL;
  if (bad)
    fprintf(stderr, "rank %d (encrypt %s): got %s: %s\n", index, c->mine[index],
            hoop_strerror(result), error);
  hoop_finalize(comm);
  return bad;
}

START_TEST(test_encrypt_config) {
  setenv("HOOP_ENCRYPT", "0", 1);
  encrypt_case cases[] = {{0, {"chacha20poly1305", "chacha20poly1305"}, 1},
                          {0, {"chacha20poly1305", "0"}, 0},
                          {0, {"rot13", "rot13"}, 0}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    cases[i].port = procs_free_port();
    ck_assert_msg(procs_fork_ranks(2, encrypt_by_config, &cases[i], 40) == 0, "case %zu", i);
  }
  unsetenv("HOOP_ENCRYPT");
}
END_TEST

/* ---- the call lock (util/lock.h) ---------------------------------------------------------- */

/* Threads add to a plain counter under the lock, half of them taking it, half trying until they
 * get it: a lock that let two in at once loses increments. */
enum { LOCK_THREADS = 4, LOCK_ROUNDS = 100000 };
static hoop__lock counter_lock;
static long counter;

static void *add_under_lock(void *arg) {
  int taking = (int)(long)arg % 2 == 0;
  for (int i = 0; i < LOCK_ROUNDS; i++) {
    if (taking)
      hoop__lock_take(&counter_lock);
    else
      while (!hoop__lock_try(&counter_lock))
        hoop__cpu_pause();
    long seen = counter;
    if (i % 64 == 0)
      sched_yield(); /* a holder that loses its CPU with the lock held */
    counter = seen + 1;
    hoop__lock_release(&counter_lock);
  }
  return NULL;
}

/* hoop__lock_take waits out a holder that keeps the lock past the spin and the yields. */
static _Atomic int held_long;
static void *hold_a_while(void *arg) {
  (void)arg;
  hoop__lock_take(&counter_lock);
  atomic_store(&held_long, 1);
  struct timespec pause = {0, 50 * 1000 * 1000};
  nanosleep(&pause, NULL);
  atomic_store(&held_long, 2);
  hoop__lock_release(&counter_lock);
  return NULL;
}

START_TEST(test_call_lock) {
  hoop__lock_init(&counter_lock);
  ck_assert(hoop__lock_try(&counter_lock));
  ck_assert(!hoop__lock_try(&counter_lock)); /* held: a second try fails */
  hoop__lock_release(&counter_lock);
  ck_assert(hoop__lock_try(&counter_lock));
  hoop__lock_release(&counter_lock);

  pthread_t threads[LOCK_THREADS];
  counter = 0;
  for (long t = 0; t < LOCK_THREADS; t++)
    ck_assert_int_eq(pthread_create(&threads[t], NULL, add_under_lock, (void *)t), 0);
  for (int t = 0; t < LOCK_THREADS; t++)
    pthread_join(threads[t], NULL);
  ck_assert_int_eq(counter, (long)LOCK_THREADS * LOCK_ROUNDS);

  pthread_t holder;
  ck_assert_int_eq(pthread_create(&holder, NULL, hold_a_while, NULL), 0);
  while (atomic_load(&held_long) == 0)
    sched_yield();
  hoop__lock_take(&counter_lock);
  ck_assert_int_eq(atomic_load(&held_long), 2); /* not before the holder let go */
  hoop__lock_release(&counter_lock);
  pthread_join(holder, NULL);
}
END_TEST

static Suite *api_suite(void) {
  Suite *s = suite_create("api");
  TCase *tc = tcase_create("local");
  tcase_add_test(tc, test_invalid_arguments);
  tcase_add_test(tc, test_call_names);
  tcase_add_test(tc, test_comm_timeout);
  tcase_add_test(tc, test_comm_reproducible);
  tcase_add_test(tc, test_invalid_config);
  tcase_add_test(tc, test_config_size_and_version);
  tcase_add_test(tc, test_register_arguments);
  tcase_add_test(tc, test_env_errors);
  tcase_add_test(tc, test_names);
  tcase_add_test(tc, test_env_manual_complete);
  tcase_add_test(tc, test_env_names_in_table);
  tcase_add_test(tc, test_ifname_syntax);
  tcase_add_test(tc, test_token_config);
  tcase_add_test(tc, test_self_hosted_job_with_token);
  tcase_add_test(tc, test_call_lock);
  suite_add_tcase(s, tc);
  tc = tcase_create("failures");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_join_timeout_names_missing);
  tcase_add_test(tc, test_no_server);
  tcase_add_test(tc, test_abort_and_refusal);
  tcase_add_test(tc, test_streams_must_agree);
  tcase_add_test(tc, test_encrypt_config);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  SRunner *sr = srunner_create(api_suite());
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
