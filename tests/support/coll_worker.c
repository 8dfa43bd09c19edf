/* coll_worker.c - one rank of the collectives test: runs every collective for every dtype and op
 * (allreduce, broadcast, allgather, reduce-scatter, all-to-all, barrier) on awkward counts, in
 * place and out of place, and checks each result against reference.c. Started N times by hooprun
 * (or by the test itself); exits non-zero if any check failed.
 *
 * Usage: coll_worker [--quick | --big N] [--barrier-dir DIR] [--ranks-per-host N]
 *                    [--register all|even] [--fake-hosts N]
 *                    [--no-shm-on RANK] [--device all|even|mixed|host0 [--stream] [--late-input]]
 *                    [--no-ptrace] [--hostile-vmm]
 *
 * The large cases are about 1300021 elements, 150001 with --quick, N with --big N.
 *
 * --register all: only the large cases, each buffer registered with hoop_register (over ibverbs:
 * zero-copy); --register even: the same, but only even ranks register, so registered senders
 * meet unregistered receivers and the other way round. --register every: every case, every
 * rank's buffers registered (with --device: GPUDirect RDMA over ibverbs where it can).
 *
 * --ranks-per-host N: the job runs N ranks on each host, in order of rank (as hooprun -H fills
 * hosts), so rank r must be local rank r % N of N; without it, all ranks are on one host.
 *
 * --no-shm-on RANK: the rank that hooprun starts as RANK sets HOOP_SHM=0, so that its pairs run
 * over the network transport while the other ranks of the host share memory: a mixed job.
 *
 * --device all: every buffer in CUDA device memory (devmem.c: the real driver, or the stand-in of
 * fakecuda/ through HOOP_CUDA_LIBRARY); even: only even ranks' buffers, so host and device ranks
 * meet in one call; mixed: even ranks send from device memory into host memory, odd ranks from host
 * into device memory; host0: the ranks of the first host (--fake-hosts) on the device, the others
 * on the host. Inputs are written and results checked on host copies. --stream: the calls
 * are the stream-ordered variants (hoop_allreduce_stream...) on a stream of the device.
 * --late-input: device buffers are filled by copies queued on the legacy default stream (with
 * --stream, on the calls' stream) and not waited for, as a program's kernels may still be writing
 * its inputs when it calls: hoop must order its reads after them (the stand-in driver carries
 * such copies out late, each stream on its own).
 *
 * --no-ptrace: each rank makes itself not dumpable, so that (unless root) no other process may
 * ptrace it, as Yama's default on Ubuntu refuses it between sibling processes: whatever needs that
 * permission (process_vm_readv, pidfd_getfd) must do without it or fall back.
 *
 * --hostile-vmm (with --device and DEVMEM_VMM=1): at the end, rank 1 plays a process of the same
 * user that found the other ranks' VMM descriptor servers (lib/mem/cuda/vmm_server.c) in
 * /proc/net/unix: to each it sends bytes of the wrong size (the connection must close), then a
 * well-formed ask without the export's token (it must be refused, with a reason); then every rank
 * allreduces fresh device buffers again, which must still go through those servers.
 *
 * --fake-hosts N: the rank that hooprun starts as RANK names its host fake-host-(RANK / N)
 * (HOOP_HOSTNAME), so that ranks of one machine make a job of several hosts of N ranks as the rank
 * table sees them (the host-by-host algorithms); the transports still share memory. Implies
 * --ranks-per-host N.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "devmem.h"
#include "hoop.h"
#include "reference.h"

static hoop_comm *comm;
static int rank, nranks;
static size_t checks, failures;

static void fail(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "rank %d FAIL: ", rank);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
  failures++;
}

static void *xmalloc(size_t bytes) {
  void *p = malloc(bytes ? bytes : 1);
  if (!p) {
    fprintf(stderr, "rank %d: out of memory\n", rank);
    exit(2);
  }
  return p;
}

/* Calls must succeed; a failed call is reported and ends the run (the communicator is gone). */
static void must(hoop_result result, const char *what) {
  if (result != HOOP_OK) {
    fprintf(stderr, "rank %d FAIL: %s returned %s: %s\n", rank, what, hoop_strerror(result),
            hoop_last_error(comm));
    exit(1);
  }
}

/* --register: 0 none, 1 every rank, 2 even ranks only, 3 every rank and every case. */
static int register_mode;

static hoop_mem_handle reg(void *buf, size_t bytes) {
  hoop_mem_handle handle = 0;
  if (register_mode == 1 || register_mode == 3 || (register_mode == 2 && rank % 2 == 0))
    must(hoop_register(comm, buf, bytes ? bytes : 1, &handle), "hoop_register");
  return handle;
}

static void unreg(hoop_mem_handle handle) {
  if (handle)
    must(hoop_deregister(comm, handle), "hoop_deregister");
}

/* --device: 0 host memory, 1 every rank's buffers on the device, 2 even ranks', 3 mixed. */
static int device_mode;
static int per_host; /* ranks per host (--ranks-per-host, --fake-hosts; 0 until known: all) */
static void *stream; /* --stream: the stream of the stream-ordered calls */

/* Whether this rank's send (which 0) or receive (which 1) buffers live on the device. */
static int on_device(int which) {
  switch (device_mode) {
  case 1: return 1;
  case 2: return rank % 2 == 0;
  case 3: return (rank % 2 == 0) == (which == 0);
  case 4: return rank < per_host; /* the first host's ranks only */
  default: return 0;
  }
}

/* The buffer the collective gets: host itself, or a device copy of it. */
static int late_input; /* --late-input: device buffers filled on the legacy stream, unwaited */

static void *to_call(void *host, size_t bytes, int which) {
  if (!on_device(which))
    return host;
  return late_input ? devmem_put_late(host, bytes, stream) : devmem_put(host, bytes);
}

/* After the call: the device buffer's bytes back into host, and the device buffer freed. */
static void from_call(void *host, void *used, size_t bytes) {
  if (used != host) {
    devmem_get(host, used, bytes);
    devmem_free(used);
  }
}

/* The pairs hoop.h refuses: bitwise ops on float types, bool's average. */
static int refused_pair(hoop_dtype dtype, hoop_op op) {
  int is_float = dtype == HOOP_FLOAT16 || dtype == HOOP_BFLOAT16 || dtype == HOOP_FLOAT32 ||
                 dtype == HOOP_FLOAT64;
  return (is_float && (op == HOOP_BAND || op == HOOP_BOR || op == HOOP_BXOR)) ||
         (dtype == HOOP_BOOL && op == HOOP_AVG);
}

/* A refused pair fails with HOOP_ERR_INVALID_ARG on every rank, naming the op, and the
 * communicator goes on. */
static void check_refused(const char *call, hoop_result got, hoop_dtype dtype, hoop_op op) {
  checks++;
  if (got != HOOP_ERR_INVALID_ARG || !strstr(hoop_last_error(comm), hoop_op_name(op)))
    fail("%s %s %s: expected HOOP_ERR_INVALID_ARG naming the op, got %s (%s)", call,
         hoop_dtype_name(dtype), hoop_op_name(op), hoop_strerror(got), hoop_last_error(comm));
}

/* REF_WIDE while the reducing checks draw inputs over the whole range (reference.h), else 0. */
static unsigned wide_inputs;

static void check_allreduce(size_t count, hoop_dtype dtype, hoop_op op, int in_place) {
  if (refused_pair(dtype, op)) {
    char buf[64] = {0}, out[64];
    check_refused("hoop_allreduce", hoop_allreduce(comm, buf, in_place ? buf : out, 1, dtype, op),
                  dtype, op);
    return;
  }
  size_t esize = hoop_dtype_size(dtype);
  unsigned seed = (unsigned)(count * 31 + (size_t)dtype * 7 + (size_t)op) | wide_inputs;
  char *send = xmalloc(count * esize), *recv = xmalloc(count * esize),
       *copy = xmalloc(count * esize);
  ref_fill(send, count, dtype, op, rank, seed);
  memcpy(copy, send, count * esize);
  memset(recv, 0x5a, count * esize);
  char *out = in_place ? send : recv;
  void *call_send = to_call(send, count * esize, 0);
  void *call_out = in_place ? call_send : to_call(recv, count * esize, 1);
  /* The buffers the call gets are the ones registered: device memory with --device. */
  hoop_mem_handle send_handle = reg(call_send, count * esize),
                  recv_handle = in_place ? 0 : reg(call_out, count * esize);
  must(stream ? hoop_allreduce_stream(comm, call_send, call_out, count, dtype, op, stream)
              : hoop_allreduce(comm, call_send, call_out, count, dtype, op),
       "hoop_allreduce");
  unreg(recv_handle);
  unreg(send_handle);
  if (!in_place)
    from_call(recv, call_out, count * esize);
  from_call(send, call_send, count * esize);
  char msg[256];
  checks++;
  if (ref_check_allreduce(out, count, dtype, op, nranks, seed, msg, sizeof msg))
    fail("allreduce %s %s count %zu %s: %s", hoop_dtype_name(dtype), hoop_op_name(op), count,
         in_place ? "in place" : "out of place", msg);
  if (!in_place && memcmp(send, copy, count * esize) != 0)
    fail("allreduce %s %s count %zu changed sendbuf", hoop_dtype_name(dtype), hoop_op_name(op),
         count);
  free(copy);
  free(recv);
  free(send);
}

static void check_broadcast(size_t count, hoop_dtype dtype, int root) {
  size_t esize = hoop_dtype_size(dtype);
  unsigned seed = (unsigned)(count * 17 + (size_t)root);
  char *buf = xmalloc(count * esize);
  if (rank == root)
    ref_fill(buf, count, dtype, HOOP_MIN, root, seed);
  else
    memset(buf, 0xa5, count * esize);
  void *call_buf = to_call(buf, count * esize, rank == root ? 0 : 1);
  hoop_mem_handle handle = reg(call_buf, count * esize);
  must(stream ? hoop_broadcast_stream(comm, call_buf, count, dtype, root, stream)
              : hoop_broadcast(comm, call_buf, count, dtype, root),
       "hoop_broadcast");
  unreg(handle);
  from_call(buf, call_buf, count * esize);
  char msg[256];
  checks++;
  if (ref_check_equal(buf, count, dtype, HOOP_MIN, root, seed, msg, sizeof msg))
    fail("broadcast %s count %zu root %d: %s", hoop_dtype_name(dtype), count, root, msg);
  free(buf);
}

static void check_allgather(size_t count, hoop_dtype dtype, int in_place) {
  size_t esize = hoop_dtype_size(dtype), block = count * esize;
  unsigned seed = (unsigned)(count * 13 + (size_t)dtype);
  char *all = xmalloc(block * (size_t)nranks), *mine = xmalloc(block);
  memset(all, 0x3c, block * (size_t)nranks);
  ref_fill(mine, count, dtype, HOOP_MAX, rank, seed);
  if (in_place)
    memcpy(all + (size_t)rank * block, mine, block);
  char *call_all = to_call(all, block * (size_t)nranks, in_place ? 0 : 1);
  void *call_mine = in_place ? NULL : to_call(mine, block, 0);
  const void *send = in_place ? call_all + (size_t)rank * block : call_mine;
  hoop_mem_handle all_handle = reg(call_all, block * (size_t)nranks),
                  mine_handle = call_mine ? reg(call_mine, block) : 0;
  must(stream ? hoop_allgather_stream(comm, send, call_all, count, dtype, stream)
              : hoop_allgather(comm, send, call_all, count, dtype),
       "hoop_allgather");
  unreg(mine_handle);
  unreg(all_handle);
  from_call(all, call_all, block * (size_t)nranks);
  if (call_mine)
    from_call(mine, call_mine, block);
  char msg[256];
  for (int r = 0; r < nranks; r++) {
    checks++;
    if (ref_check_equal(all + (size_t)r * block, count, dtype, HOOP_MAX, r, seed, msg, sizeof msg))
      fail("allgather %s count %zu %s, block of rank %d: %s", hoop_dtype_name(dtype), count,
           in_place ? "in place" : "out of place", r, msg);
  }
  free(mine);
  free(all);
}

/* Rank r's block of the reduced input: recvcount elements out of size * recvcount, in place
 * (the result where the rank's own block of the input was) or out of place. The other blocks of
 * an in-place input, and the whole input out of place, must come back unchanged. */
static void check_reduce_scatter(size_t count, hoop_dtype dtype, hoop_op op, int in_place) {
  if (refused_pair(dtype, op)) {
    char buf[64] = {0}, out[8];
    (void)in_place;
    check_refused("hoop_reduce_scatter", hoop_reduce_scatter(comm, buf, out, 1, dtype, op), dtype,
                  op);
    return;
  }
  size_t esize = hoop_dtype_size(dtype), block = count * esize, total = block * (size_t)nranks;
  unsigned seed = (unsigned)(count * 37 + (size_t)dtype * 11 + (size_t)op) | wide_inputs;
  char *send = xmalloc(total), *recv = xmalloc(block), *copy = xmalloc(total);
  ref_fill(send, count * (size_t)nranks, dtype, op, rank, seed);
  memcpy(copy, send, total);
  memset(recv, 0x5a, block);
  char *call_send = to_call(send, total, 0);
  char *call_recv = in_place ? call_send + (size_t)rank * block : to_call(recv, block, 1);
  hoop_mem_handle send_handle = reg(call_send, total),
                  recv_handle = in_place ? 0 : reg(call_recv, block);
  must(stream ? hoop_reduce_scatter_stream(comm, call_send, call_recv, count, dtype, op, stream)
              : hoop_reduce_scatter(comm, call_send, call_recv, count, dtype, op),
       "hoop_reduce_scatter");
  unreg(recv_handle);
  unreg(send_handle);
  if (!in_place)
    from_call(recv, call_recv, block);
  from_call(send, call_send, total);
  const char *out = in_place ? send + (size_t)rank * block : recv;
  char msg[256];
  checks++;
  if (ref_check_reduced(out, (size_t)rank * count, count, dtype, op, nranks, seed, msg, sizeof msg))
    fail("reduce_scatter %s %s recvcount %zu %s: %s", hoop_dtype_name(dtype), hoop_op_name(op),
         count, in_place ? "in place" : "out of place", msg);
  for (int r = 0; r < nranks; r++)
    if ((!in_place || r != rank) &&
        memcmp(send + (size_t)r * block, copy + (size_t)r * block, block) != 0)
      fail("reduce_scatter %s %s recvcount %zu %s changed block %d of sendbuf",
           hoop_dtype_name(dtype), hoop_op_name(op), count, in_place ? "in place" : "out of place",
           r);
  free(copy);
  free(recv);
  free(send);
}

/* Reduce: the root's result is the op over every rank's input; the other ranks pass no result
 * buffer. In place at the root only. Inputs come back unchanged (but the root's in place). */
static void check_reduce(size_t count, hoop_dtype dtype, hoop_op op, int root, int in_place) {
  if (refused_pair(dtype, op)) {
    char buf[8] = {0}, out[8];
    (void)in_place;
    check_refused("hoop_reduce", hoop_reduce(comm, buf, out, 1, dtype, op, root), dtype, op);
    return;
  }
  size_t esize = hoop_dtype_size(dtype), bytes = count * esize;
  unsigned seed =
      (unsigned)(count * 41 + (size_t)dtype * 5 + (size_t)op + (size_t)root) | wide_inputs;
  int is_root = rank == root;
  in_place = in_place && is_root;
  char *send = xmalloc(bytes), *recv = xmalloc(bytes), *copy = xmalloc(bytes);
  ref_fill(send, count, dtype, op, rank, seed);
  memcpy(copy, send, bytes);
  memset(recv, 0x5a, bytes);
  void *call_send = to_call(send, bytes, 0);
  void *call_recv = !is_root ? NULL : in_place ? call_send : to_call(recv, bytes, 1);
  must(stream ? hoop_reduce_stream(comm, call_send, call_recv, count, dtype, op, root, stream)
              : hoop_reduce(comm, call_send, call_recv, count, dtype, op, root),
       "hoop_reduce");
  if (is_root && !in_place)
    from_call(recv, call_recv, bytes);
  from_call(send, call_send, bytes);
  char msg[256];
  checks++;
  if (is_root &&
      ref_check_allreduce(in_place ? send : recv, count, dtype, op, nranks, seed, msg, sizeof msg))
    fail("reduce %s %s count %zu root %d %s: %s", hoop_dtype_name(dtype), hoop_op_name(op), count,
         root, in_place ? "in place" : "out of place", msg);
  if (!in_place && memcmp(send, copy, bytes) != 0)
    fail("reduce %s %s count %zu root %d changed sendbuf", hoop_dtype_name(dtype), hoop_op_name(op),
         count, root);
  free(copy);
  free(recv);
  free(send);
}

/* Gather: every rank's block in the root's buffer in rank order (in place at the root: its own
 * block already there). */
static void check_gather(size_t count, hoop_dtype dtype, int root, int in_place) {
  size_t esize = hoop_dtype_size(dtype), block = count * esize, total = block * (size_t)nranks;
  unsigned seed = (unsigned)(count * 19 + (size_t)dtype + (size_t)root * 3);
  int is_root = rank == root;
  in_place = in_place && is_root;
  char *all = xmalloc(total), *mine = xmalloc(block);
  memset(all, 0x3c, total);
  ref_fill(mine, count, dtype, HOOP_MAX, rank, seed);
  if (in_place)
    memcpy(all + (size_t)rank * block, mine, block);
  char *call_all = is_root ? to_call(all, total, in_place ? 0 : 1) : NULL;
  void *call_mine = in_place ? NULL : to_call(mine, block, 0);
  const void *send = in_place ? call_all + (size_t)rank * block : call_mine;
  must(stream ? hoop_gather_stream(comm, send, call_all, count, dtype, root, stream)
              : hoop_gather(comm, send, call_all, count, dtype, root),
       "hoop_gather");
  if (call_all)
    from_call(all, call_all, total);
  if (call_mine)
    from_call(mine, call_mine, block);
  char msg[256];
  for (int r = 0; is_root && r < nranks; r++) {
    checks++;
    if (ref_check_equal(all + (size_t)r * block, count, dtype, HOOP_MAX, r, seed, msg, sizeof msg))
      fail("gather %s count %zu root %d %s, block of rank %d: %s", hoop_dtype_name(dtype), count,
           root, in_place ? "in place" : "out of place", r, msg);
  }
  free(mine);
  free(all);
}

/* Scatter: block r of the root's buffer to rank r (in place at the root: its own block stays
 * where it is). The root's buffer comes back unchanged. */
static void check_scatter(size_t count, hoop_dtype dtype, int root, int in_place) {
  size_t esize = hoop_dtype_size(dtype), block = count * esize, total = block * (size_t)nranks;
  unsigned seed = (unsigned)(count * 23 + (size_t)dtype + (size_t)root * 5);
  int is_root = rank == root;
  in_place = in_place && is_root;
  char *all = xmalloc(total), *mine = xmalloc(block), *copy = xmalloc(total);
  for (int r = 0; r < nranks; r++)
    ref_fill(all + (size_t)r * block, count, dtype, HOOP_MIN, r, seed);
  memcpy(copy, all, total);
  memset(mine, 0xa5, block);
  char *call_all = is_root ? to_call(all, total, 0) : NULL;
  char *call_mine = in_place ? call_all + (size_t)rank * block : to_call(mine, block, 1);
  must(stream ? hoop_scatter_stream(comm, call_all, call_mine, count, dtype, root, stream)
              : hoop_scatter(comm, call_all, call_mine, count, dtype, root),
       "hoop_scatter");
  if (!in_place)
    from_call(mine, call_mine, block);
  if (call_all)
    from_call(all, call_all, total);
  char msg[256];
  checks++;
  if (ref_check_equal(in_place ? all + (size_t)rank * block : mine, count, dtype, HOOP_MIN, rank,
                      seed, msg, sizeof msg))
    fail("scatter %s count %zu root %d %s: %s", hoop_dtype_name(dtype), count, root,
         in_place ? "in place" : "out of place", msg);
  if (is_root && memcmp(all, copy, total) != 0)
    fail("scatter %s count %zu root %d changed sendbuf", hoop_dtype_name(dtype), count, root);
  free(copy);
  free(mine);
  free(all);
}

/* Rank q's block for rank r of an alltoall(v): elements [first, first + count) of rank q's input
 * for this case, first being where q's block for r starts in q's sendbuf. The blocks of an
 * alltoallv: rank q sends rank r (q + r) % 3 + count * ((q * 7 + r) % 4) / 3 elements, in
 * sendbuf in rank order, one element of gap between blocks; received in rank order, two apart. */
static size_t a2av_count(int q, int r, size_t count) {
  return (size_t)((q + r) % 3) + count * (size_t)((q * 7 + r) % 4) / 3;
}

static void check_alltoall(size_t count, hoop_dtype dtype, int in_place) {
  size_t esize = hoop_dtype_size(dtype), block = count * esize, total = block * (size_t)nranks;
  unsigned seed = (unsigned)(count * 41 + (size_t)dtype * 3);
  char *send = xmalloc(total), *recv = xmalloc(total);
  ref_fill(send, count * (size_t)nranks, dtype, HOOP_MAX, rank, seed);
  memset(recv, 0x6b, total);
  if (in_place)
    memcpy(recv, send, total);
  char *call_recv = to_call(recv, total, 1);
  char *call_send = in_place ? call_recv : to_call(send, total, 0);
  hoop_mem_handle recv_handle = reg(call_recv, total),
                  send_handle = in_place ? 0 : reg(call_send, total);
  must(stream ? hoop_alltoall_stream(comm, call_send, call_recv, count, dtype, stream)
              : hoop_alltoall(comm, call_send, call_recv, count, dtype),
       "hoop_alltoall");
  unreg(send_handle);
  unreg(recv_handle);
  from_call(recv, call_recv, total);
  if (!in_place)
    from_call(send, call_send, total);
  char *want = xmalloc(block ? block : 1);
  for (int q = 0; q < nranks; q++) {
    /* Rank q's input, block rank: fill rank q's whole input and take that block. */
    char *input = xmalloc(total);
    ref_fill(input, count * (size_t)nranks, dtype, HOOP_MAX, q, seed);
    memcpy(want, input + (size_t)rank * block, block);
    free(input);
    checks++;
    if (memcmp(recv + (size_t)q * block, want, block) != 0)
      fail("alltoall %s count %zu %s: the block from rank %d differs", hoop_dtype_name(dtype),
           count, in_place ? "in place" : "out of place", q);
  }
  free(want);
  free(recv);
  free(send);
}

static void check_alltoallv(size_t count, hoop_dtype dtype) {
  size_t esize = hoop_dtype_size(dtype), n = (size_t)nranks;
  unsigned seed = (unsigned)(count * 43 + (size_t)dtype * 5);
  size_t *sc = xmalloc(4 * n * sizeof *sc), *sd = sc + n, *rc = sc + 2 * n, *rd = sc + 3 * n;
  size_t sent = 0, received = 0;
  for (int p = 0; p < nranks; p++) {
    sc[p] = a2av_count(rank, p, count);
    sd[p] = sent;
    sent += sc[p] + 1;
    rc[p] = a2av_count(p, rank, count);
    rd[p] = received + 1;
    received += rc[p] + 2;
  }
  char *send = xmalloc(sent * esize), *recv = xmalloc(received * esize);
  char *keep = xmalloc(received * esize);
  ref_fill(send, sent, dtype, HOOP_MAX, rank, seed);
  memset(recv, 0x77, received * esize);
  memcpy(keep, recv, received * esize);
  char *call_send = to_call(send, sent * esize, 0), *call_recv = to_call(recv, received * esize, 1);
  if (stream) {
    must(hoop_alltoallv_stream(comm, call_send, sc, sd, call_recv, rc, rd, dtype, stream),
         "hoop_alltoallv_stream");
  } else if (count % 2) {
    /* Posted, then the four arrays scribbled over before the wait: the request has its own copy. */
    hoop_request *req;
    size_t *kept = xmalloc(4 * n * sizeof *kept);
    memcpy(kept, sc, 4 * n * sizeof *kept);
    must(hoop_ialltoallv(comm, call_send, sc, sd, call_recv, rc, rd, dtype, &req),
         "hoop_ialltoallv");
    memset(sc, 0xff, 4 * n * sizeof *sc);
    must(hoop_wait(req), "hoop_wait (hoop_ialltoallv)");
    memcpy(sc, kept, 4 * n * sizeof *kept);
    free(kept);
  } else {
    must(hoop_alltoallv(comm, call_send, sc, sd, call_recv, rc, rd, dtype), "hoop_alltoallv");
  }
  from_call(recv, call_recv, received * esize);
  from_call(send, call_send, sent * esize);
  for (int q = 0; q < nranks; q++) {
    /* Rank q's sendbuf: its blocks to ranks 0.. in order, one element apart. */
    size_t at = 0;
    for (int p = 0; p < rank; p++)
      at += a2av_count(q, p, count) + 1;
    size_t len = rc[q] * esize;
    char *input = xmalloc((at + rc[q] + 1) * esize);
    ref_fill(input, at + rc[q], dtype, HOOP_MAX, q, seed);
    checks++;
    if (memcmp(recv + rd[q] * esize, input + at * esize, len) != 0)
      fail("alltoallv %s count %zu: the block from rank %d (%zu elements) differs",
           hoop_dtype_name(dtype), count, q, rc[q]);
    /* The element before each block was left as it was. */
    if (memcmp(recv + (rd[q] - 1) * esize, keep + (rd[q] - 1) * esize, esize) != 0)
      fail("alltoallv %s count %zu: recvbuf changed outside the blocks (before rank %d's)",
           hoop_dtype_name(dtype), count, q);
    free(input);
  }
  free(keep);
  free(recv);
  free(send);
  free(sc);
}

/* Each rank leaves a file before the barrier and, after it, must see every rank's file: a rank
 * that left the barrier early would miss one. Ranks arrive at staggered times. */
static void check_barrier(const char *dir, int round) {
  char path[4096];
  struct timespec stagger = {0, (long)((rank * 7 + round * 3) % 5) * 10 * 1000 * 1000};
  nanosleep(&stagger, NULL);
  snprintf(path, sizeof path, "%s/round%d.rank%d", dir, round, rank);
  int fd = open(path, O_CREAT | O_WRONLY, 0600);
  if (fd < 0) {
    fail("barrier: cannot create %s: %s", path, strerror(errno));
    return;
  }
  close(fd);
  must(hoop_barrier(comm), "hoop_barrier");
  for (int r = 0; r < nranks; r++) {
    struct stat st;
    snprintf(path, sizeof path, "%s/round%d.rank%d", dir, round, r);
    checks++;
    if (stat(path, &st) != 0)
      fail("barrier round %d: left the barrier before rank %d entered it", round, r);
  }
}

static const size_t small_counts[] = {0, 1, 2, 3, 5, 7, 13, 31, 97, 1031};

/* Whether the small reductions skip op at dtype and small_counts[c]: on device buffers they take
 * one op per dtype and count, turning with both, so that each dtype meets every op, each op every
 * count and each count every dtype (every kernel still runs on device memory, and
 * test_cuda_kernels checks each against reduce.c on its own); on host buffers the whole product.
 * Each device call costs the stand-in driver's checks, and test_cuda.sh runs about 60 jobs of
 * this worker. */
static int op_skipped(int dtype, int op, size_t c) {
  return device_mode && op != (int)(((size_t)dtype + c) % HOOP_OP_COUNT);
}

/* The large cases on registered buffers: several zero-copy chunks per ring segment, odd counts,
 * in and out of place; the same buffers reused, as a training loop would. */
static void check_registered(int quick) {
  size_t big = quick ? 300007 : 1300021;
  check_allreduce(big, HOOP_FLOAT32, HOOP_SUM, 0);
  check_allreduce(big, HOOP_FLOAT32, HOOP_SUM, 1);
  check_allreduce(big / 3, HOOP_FLOAT64, HOOP_MAX, 0);
  check_allreduce(big + 2, HOOP_BFLOAT16, HOOP_AVG, 1);
  for (int root = 0; root < nranks; root++)
    check_broadcast(big, HOOP_UINT8, root);
  check_broadcast(big / 4 + 1, HOOP_FLOAT32, nranks - 1);
  check_allgather(big / 4, HOOP_FLOAT32, 0);
  check_allgather(big / 2 + 1, HOOP_UINT8, 1);
  check_reduce_scatter(big / 4 + 1, HOOP_FLOAT32, HOOP_SUM, 0);
  check_reduce_scatter(big / 4, HOOP_FLOAT64, HOOP_AVG, 1);
  /* The same registered buffers for several calls in a row (on the device under --device, where
   * peers map them once: CUDA IPC's cache). */
  size_t count = big / 2 + 3, bytes = count * sizeof(float);
  float *send = xmalloc(bytes), *recv = xmalloc(bytes);
  float *call_send = to_call(send, bytes, 0), *call_recv = to_call(recv, bytes, 1);
  hoop_mem_handle send_handle = reg(call_send, bytes), recv_handle = reg(call_recv, bytes);
  for (int round = 0; round < 4; round++) {
    unsigned seed = (unsigned)(round * 101 + 7);
    ref_fill(send, count, HOOP_FLOAT32, HOOP_SUM, rank, seed);
    if (call_send != send)
      devmem_upload(call_send, send, bytes);
    must(hoop_allreduce(comm, call_send, call_recv, count, HOOP_FLOAT32, HOOP_SUM),
         "hoop_allreduce");
    if (call_recv != recv)
      devmem_get(recv, call_recv, bytes);
    char msg[256];
    checks++;
    if (ref_check_allreduce(recv, count, HOOP_FLOAT32, HOOP_SUM, nranks, seed, msg, sizeof msg))
      fail("allreduce on reused registered buffers, round %d: %s", round, msg);
  }
  unreg(recv_handle);
  unreg(send_handle);
  if (call_recv != recv)
    devmem_free(call_recv);
  if (call_send != send)
    devmem_free(call_send);
  free(recv);
  free(send);
}

/* --hostile-vmm: the asks lib/mem/cuda/vmm_server.c's descriptor servers take (its wire format),
 * wrong. */
static void hostile_vmm(void) {
  FILE *f = fopen("/proc/net/unix", "r");
  char line[512], mine[64];
  snprintf(mine, sizeof mine, "@hoop-vmm-%d-", (int)getpid());
  int servers = 0, refused = 0;
  while (f && fgets(line, sizeof line, f)) {
    char *name = strstr(line, "@hoop-vmm-");
    if (!name || strncmp(name, mine, strlen(mine)) == 0)
      continue;
    name[strcspn(name, " \n")] = '\0';
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    size_t n = strlen(name);
    memcpy(sa.sun_path + 1, name + 1, n - 1); /* abstract: a NUL, then the name */
    socklen_t len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n);
    struct timeval tv = {5, 0};
    servers++;
    for (int round = 0; round < 2; round++) {
      int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
      setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
      if (fd < 0 || connect(fd, (struct sockaddr *)&sa, len) != 0) {
        fail("--hostile-vmm: connecting to %s: %s", name + 1, strerror(errno));
        if (fd >= 0)
          close(fd);
        break;
      }
      char answer[128] = {0};
      if (round == 0) { /* five bytes: not an ask */
        ssize_t got =
            send(fd, "hoop!", 5, MSG_NOSIGNAL) == 5 ? recv(fd, answer, sizeof answer, 0) : -2;
        if (got != 0)
          fail("--hostile-vmm: %s answered bytes of the wrong size (%zd)", name + 1, got);
        else
          refused++;
      } else { /* a well-formed ask, its token made up */
        uint64_t ask[6] = {0x686f6f702d766d6dull, 12345, 67890, 0x7f0000000000ull, 1, 1};
        ssize_t got = send(fd, ask, sizeof ask, MSG_NOSIGNAL) == (ssize_t)sizeof ask
                          ? recv(fd, answer, sizeof answer, 0)
                          : -2;
        int32_t status = 0;
        memcpy(&status, answer, sizeof status);
        answer[sizeof answer - 1] = '\0';
        if (got != (ssize_t)sizeof answer || status == 0 || !strstr(answer + 4, "token"))
          fail("--hostile-vmm: %s did not refuse an ask without the token (%zd, %d)", name + 1, got,
               (int)status);
        else {
          refused++;
          printf("coll_worker rank %d: a server refused a made-up ask: %s\n", rank, answer + 4);
        }
      }
      close(fd);
    }
  }
  if (f)
    fclose(f);
  checks++;
  if (servers == 0)
    fail("--hostile-vmm: no other rank's VMM descriptor server in /proc/net/unix");
  printf("coll_worker rank %d: %d of %d hostile asks to %d servers refused\n", rank, refused,
         2 * servers, servers);
}

int main(int argc, char **argv) {
  int quick = 0;
  size_t big_count = 0; /* --big */
  const char *barrier_dir = NULL;
  int probe_only = 0, want_stream = 0, hostile = 0;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--quick") == 0)
      quick = 1;
    else if (strcmp(argv[i], "--big") == 0 && i + 1 < argc)
      big_count = strtoul(argv[++i], NULL, 10);
    else if (strcmp(argv[i], "--barrier-dir") == 0 && i + 1 < argc)
      barrier_dir = argv[++i];
    else if (strcmp(argv[i], "--ranks-per-host") == 0 && i + 1 < argc)
      per_host = atoi(argv[++i]);
    else if (strcmp(argv[i], "--fake-hosts") == 0 && i + 1 < argc) {
      per_host = atoi(argv[++i]);
      const char *mine = getenv("HOOP_RANK");
      char name[64];
      snprintf(name, sizeof name, "fake-host-%d",
               (mine ? atoi(mine) : 0) / (per_host ? per_host : 1));
      setenv("HOOP_HOSTNAME", name, 1);
    } else if (strcmp(argv[i], "--register") == 0 && i + 1 < argc)
      register_mode = strcmp(argv[++i], "even") == 0 ? 2 : strcmp(argv[i], "every") == 0 ? 3 : 1;
    else if (strcmp(argv[i], "--stream") == 0)
      want_stream = 1;
    else if (strcmp(argv[i], "--late-input") == 0)
      late_input = 1;
    else if (strcmp(argv[i], "--probe-device") == 0)
      probe_only = 1; /* with --device: only say (exit 0) whether device memory can be had */
    else if (strcmp(argv[i], "--device") == 0 && i + 1 < argc) {
      const char *mode = argv[++i];
      device_mode = strcmp(mode, "even") == 0    ? 2
                    : strcmp(mode, "mixed") == 0 ? 3
                    : strcmp(mode, "host0") == 0 ? 4
                                                 : 1;
    } else if (strcmp(argv[i], "--hostile-vmm") == 0) {
      hostile = 1;
    } else if (strcmp(argv[i], "--no-ptrace") == 0) {
      if (prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0)
        perror("coll_worker: prctl(PR_SET_DUMPABLE)");
    } else if (strcmp(argv[i], "--no-shm-on") == 0 && i + 1 < argc) {
      const char *mine = getenv("HOOP_RANK");
      if (mine && strcmp(mine, argv[++i]) == 0)
        setenv("HOOP_SHM", "0", 1);
    }
  }
  if (device_mode) {
    char why[256];
    if (devmem_init(why, sizeof why) != 0) {
      fprintf(stderr, "coll_worker: --device: %s\n", why);
      return 77;
    }
    if (probe_only)
      return 0;
    if (want_stream)
      stream = devmem_stream();
  }
  must(hoop_init_from_env(&comm), "hoop_init_from_env");
  rank = hoop_rank(comm);
  nranks = hoop_size(comm);
  if (per_host <= 0)
    per_host = nranks;
  if (hoop_local_rank(comm) != rank % per_host || hoop_local_size(comm) != per_host)
    fail("%d ranks per host: expected local rank %d of %d, got %d of %d", per_host, rank % per_host,
         per_host, hoop_local_rank(comm), hoop_local_size(comm));

  if (register_mode == 1 || register_mode == 2) {
    check_registered(quick);
    printf("coll_worker rank %d of %d: %zu checks, %zu failed\n", rank, nranks, checks, failures);
    hoop_finalize(comm);
    return failures ? 1 : 0;
  }
  size_t ncounts = sizeof small_counts / sizeof small_counts[0];
  for (int dtype = 0; dtype < HOOP_DTYPE_COUNT; dtype++)
    for (int op = 0; op < HOOP_OP_COUNT; op++)
      for (size_t c = 0; c < ncounts; c++)
        for (int in_place = 0; in_place < 2 && !op_skipped(dtype, op, c); in_place++)
          check_allreduce(small_counts[c], (hoop_dtype)dtype, (hoop_op)op, in_place);
  /* Big enough for several pipelined chunks per ring segment; not a multiple of anything. */
  size_t big = big_count ? big_count : quick ? 150001 : 1300021;
  check_allreduce(big, HOOP_FLOAT32, HOOP_SUM, 0);
  check_allreduce(big, HOOP_FLOAT32, HOOP_SUM, 1);
  check_allreduce(big, HOOP_BFLOAT16, HOOP_AVG, 1);
  check_allreduce(big / 3, HOOP_INT64, HOOP_MAX, 0);
  check_allreduce(big, HOOP_INT8, HOOP_PROD, 0);

  for (int dtype = 0; dtype < HOOP_DTYPE_COUNT; dtype++)
    for (size_t c = 0; c < ncounts; c++)
      check_broadcast(small_counts[c], (hoop_dtype)dtype, (int)(c % (size_t)nranks));
  /* A root that runs ahead of receivers that dawdle, past the board's 32 slots, with allreduces
   * between (every rank writes its slot again): each call still delivers its own data. */
  for (int i = 0; i < 80; i++) {
    struct timespec nap = {0, 2 * 1000 * 1000};
    if (rank != 0 && i % 7 == 0)
      nanosleep(&nap, NULL);
    if (i % 40 == 39)
      check_allreduce(5, HOOP_INT32, HOOP_SUM, i % 2);
    check_broadcast(3 + (size_t)i, HOOP_INT32, 0);
  }
  for (int root = 0; root < nranks; root++) {
    check_broadcast(40009, HOOP_FLOAT32, root); /* past the chain threshold */
    /* Striped over two streams as 131072 + 131073 bytes: half the length is a multiple of the
     * stripe alignment, and the odd byte must still travel. */
    check_broadcast(262145, HOOP_UINT8, root);
    check_broadcast(big, HOOP_UINT8, root);
  }

  for (int dtype = 0; dtype < HOOP_DTYPE_COUNT; dtype++)
    for (size_t c = 0; c < ncounts; c++)
      for (int in_place = 0; in_place < 2; in_place++)
        check_allgather(small_counts[c], (hoop_dtype)dtype, in_place);
  check_allgather(big / 4, HOOP_FLOAT64, 0);
  check_allgather(big / 2 + 1, HOOP_UINT8, 1);

  for (int dtype = 0; dtype < HOOP_DTYPE_COUNT; dtype++)
    for (int op = 0; op < HOOP_OP_COUNT; op++)
      for (size_t c = 0; c < ncounts; c++)
        for (int in_place = 0; in_place < 2 && !op_skipped(dtype, op, c); in_place++)
          check_reduce_scatter(small_counts[c], (hoop_dtype)dtype, (hoop_op)op, in_place);
  /* Several pipelined chunks per block, odd counts. */
  check_reduce_scatter(big / 2 + 1, HOOP_FLOAT32, HOOP_SUM, 0);
  check_reduce_scatter(big / 2, HOOP_FLOAT32, HOOP_SUM, 1);
  check_reduce_scatter(big / 3, HOOP_BFLOAT16, HOOP_AVG, 1);
  check_reduce_scatter(big / 5, HOOP_INT64, HOOP_MIN, 0);

  for (int dtype = 0; dtype < HOOP_DTYPE_COUNT; dtype++)
    for (size_t c = 0; c < ncounts; c++) {
      for (int in_place = 0; in_place < 2; in_place++)
        check_alltoall(small_counts[c], (hoop_dtype)dtype, in_place);
      check_alltoallv(small_counts[c], (hoop_dtype)dtype);
    }
  check_alltoall(big / 4 + 1, HOOP_FLOAT32, 0);
  check_alltoall(big / 4, HOOP_UINT8, 1);
  check_alltoallv(big / 3, HOOP_FLOAT64);

  for (int dtype = 0; dtype < HOOP_DTYPE_COUNT; dtype++)
    for (size_t c = 0; c < ncounts; c++) {
      int root = (int)((c + (size_t)dtype) % (size_t)nranks);
      for (int op = 0; op < HOOP_OP_COUNT; op++)
        if (!op_skipped(dtype, op, c))
          check_reduce(small_counts[c], (hoop_dtype)dtype, (hoop_op)op, root, (int)c % 2);
      check_gather(small_counts[c], (hoop_dtype)dtype, root, (int)c % 2);
      check_scatter(small_counts[c], (hoop_dtype)dtype, root, (int)(c + 1) % 2);
    }
  /* Every root at sizes past the cut-overs (the direct reduce, linear gather and scatter). */
  for (int root = 0; root < nranks; root++) {
    check_reduce(big / 2 + 1, HOOP_FLOAT32, HOOP_SUM, root, root % 2);
    check_reduce(big / 5, HOOP_INT32, HOOP_AVG, root, 0);
    check_gather(big / 8 + 1, HOOP_UINT8, root, root % 2);
    check_scatter(big / 8 + 3, HOOP_FLOAT64, root, (root + 1) % 2);
  }

  /* Inputs that can show an order or precision bug: floats that round (checked within the bound
   * any order keeps) and integers over their whole width (int64 and uint64 past 2^63). */
  wide_inputs = REF_WIDE;
  static const size_t wide_counts[] = {1, 7, 1031};
  for (int dtype = 0; dtype < HOOP_DTYPE_COUNT; dtype++)
    for (int op = 0; op < HOOP_OP_COUNT; op++)
      for (size_t c = device_mode ? 2 : 0; c < sizeof wide_counts / sizeof wide_counts[0]; c++) {
        check_allreduce(wide_counts[c], (hoop_dtype)dtype, (hoop_op)op, (int)c % 2);
        check_reduce_scatter(wide_counts[c], (hoop_dtype)dtype, (hoop_op)op, (int)(c + 1) % 2);
        check_reduce(wide_counts[c], (hoop_dtype)dtype, (hoop_op)op, (int)c % nranks, (int)c % 2);
      }
  /* On device buffers only the 1031-element cases: the algorithms are the same as on host
   * memory, and each call there costs the stand-in driver's checks (test_cuda.sh runs about 50
   * jobs of this worker). */
  if (!device_mode) {
    check_allreduce(big, HOOP_FLOAT32, HOOP_SUM, 0);
    check_allreduce(big, HOOP_BFLOAT16, HOOP_SUM, 1);
    check_allreduce(big / 3, HOOP_UINT64, HOOP_SUM, 0);
    check_reduce_scatter(big / 2 + 1, HOOP_FLOAT16, HOOP_AVG, 0);
    check_reduce(big / 2 + 1, HOOP_FLOAT64, HOOP_SUM, nranks - 1, 0);
  }
  wide_inputs = 0;

  if (register_mode == 3)
    check_registered(quick);
  if (hostile && device_mode) {
    must(hoop_barrier(comm), "hoop_barrier");
    if (rank == 1)
      hostile_vmm();
    must(hoop_barrier(comm), "hoop_barrier");
    check_allreduce(big, HOOP_FLOAT32, HOOP_SUM, 0); /* the servers serve on */
  }
  for (int round = 0; barrier_dir && round < 3; round++)
    check_barrier(barrier_dir, round);
  must(hoop_barrier(comm), "hoop_barrier");

  printf("coll_worker rank %d of %d: %zu checks, %zu failed\n", rank, nranks, checks, failures);
  hoop_finalize(comm);
  return failures ? 1 : 0;
}
