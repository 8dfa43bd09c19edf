/* compress_worker.c - compressed reductions (hoop(3), "Slow links") checked against sums computed
 * here in double, without libhoop (tests/test_compress.sh and netns-test.sh run it under hooprun).
 * Inputs are random floats of both signs whose magnitudes change every few hundred elements over
 * 2^-6..2^6, so that blocks get scales of their own and no sum is exact. For each format (bf16,
 * fp8, int8; to nearest and stochastic), dtype (float32, float16, bfloat16) and op (sum, avg) it
 * runs allreduce (out of place, in place, non-blocking, allreduce_many) and reduce-scatter, with
 * the format asked per call (hoop_compress_next) or set on the communicator, and checks:
 *   - every element within the bound hoop(3) derives: each of the H hosts' partial sums (and the
 *     finished sum, for an allreduce) converted once, each conversion off by at most the format's
 *     step of the largest partial sum near the element (the sum of the ranks' magnitudes over the
 *     128 elements either side bounds every block's scale there), plus the 16-bit dtypes' own
 *     rounding on each host and at the end; on one host (H = 1) that leaves only the exact call's
 *     rounding: nothing is compressed within a host;
 *   - across hosts, that some element is not what the exact call gives (the format was applied);
 *   - every rank's allreduce result bitwise the same (digests gathered);
 *   - refusals: integer dtypes, max, broadcast and reproducible mode with a format asked per call
 *     (HOOP_ERR_INVALID_ARG naming the call), while the communicator's format leaves them exact.
 *
 * With --device, allreduce's and reduce-scatter's buffers are CUDA device memory
 * (tests/support/devmem.c: the GPU, or the stand-in driver) on every rank (all) or on the first
 * host's (host0), the others' on the host, so that a host whose ranks reduce by CUDA IPC and encode
 * with the device's kernels meets one that encodes on the CPU; where each host runs at most 2 ranks
 * (so that the order of a host's own sum cannot differ), a device call rounding to nearest must
 * also have the same bits as the same call on host buffers (error feedback's calls too, on a
 * registered device buffer).
 *
 * usage: compress_worker [--quick] [--fake-hosts PER_HOST] [--uneven] [--device all|host0]
 *   --uneven: the hosts run different numbers of ranks, and every call must be exact.
 * Prints "compress_worker rank R: C checks, F failed (H hosts x L)"; exit 1 on a failure. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "devmem.h"
#include "floats.h"
#include "hoop.h"

static hoop_comm *comm;
static int rank, nranks, hosts, per_host;
static int uneven;     /* --uneven: hosts of different sizes, where no call is compressed */
static int device_run; /* --device: some ranks' allreduce buffers are device memory */
static int on_device;  /* and this rank's are */
static size_t checks, failures;

static void must(hoop_result result, const char *what) {
  if (result != HOOP_OK) {
    fprintf(stderr, "compress_worker rank %d: %s: %s: %s\n", rank, what, hoop_strerror(result),
            hoop_last_error(comm));
    exit(1);
  }
}

static void check(int ok, const char *what, const char *detail) {
  checks++;
  if (!ok) {
    failures++;
    if (failures <= 10)
      fprintf(stderr, "compress_worker rank %d: FAIL %s: %s\n", rank, what, detail);
  }
}

static void *xcalloc(size_t n, size_t size) {
  void *p = calloc(n ? n : 1, size);
  if (!p) {
    fprintf(stderr, "compress_worker: out of memory\n");
    exit(1);
  }
  return p;
}

/* Rank r's element i, before it is rounded to the dtype. */
static double value(int r, size_t i, unsigned seed) {
  uint64_t h = mix(mix(mix(seed) ^ (uint64_t)r) ^ i);
  double u = (double)(h >> 11) / 9007199254740992.0 * 2.0 - 1.0;
  int exp = (int)(mix(seed ^ (i / 300)) % 13) - 6;
  return ldexp(u, exp);
}

static double load(const void *buf, size_t i, hoop_dtype dtype) {
  switch (dtype) {
  case HOOP_FLOAT16: return half_to_float(((const uint16_t *)buf)[i]);
  case HOOP_BFLOAT16: return bf16_to_float(((const uint16_t *)buf)[i]);
  default: return ((const float *)buf)[i];
  }
}

static void store(void *buf, size_t i, hoop_dtype dtype, double v) {
  switch (dtype) {
  case HOOP_FLOAT16: ((uint16_t *)buf)[i] = float_to_half((float)v); break;
  case HOOP_BFLOAT16: ((uint16_t *)buf)[i] = float_to_bf16((float)v); break;
  default: ((float *)buf)[i] = (float)v; break;
  }
}

/* Rank r's input as the dtype holds it. */
static double input(int r, size_t i, hoop_dtype dtype, unsigned seed) {
  uint32_t scratch[2] = {0, 0};
  store(scratch, 0, dtype, value(r, i, seed));
  return load(scratch, 0, dtype);
}

/* The step of one conversion into the format, as a share of the largest magnitude in its block. */
static double format_step(int format) {
  int stochastic = (format & HOOP_COMPRESS_STOCHASTIC) != 0;
  switch (format & 0xff) {
  case HOOP_COMPRESS_BF16: return stochastic ? 0x1p-7 : 0x1p-8;
  case HOOP_COMPRESS_FP8: return stochastic ? 0x1p-3 : 0x1p-4;
  default: return (stochastic ? 1.0 : 0.5) / 127.0 * (1 + 0x1p-10);
  }
}

/* The dtype's unit roundoff. */
static double dtype_step(hoop_dtype dtype) {
  return dtype == HOOP_BFLOAT16 ? 0x1p-8 : dtype == HOOP_FLOAT16 ? 0x1p-11 : 0x1p-24;
}

/* The sum over ranks of element i (total elements n of each rank's input), exact in double, and
 * the largest sum of magnitudes within 128 elements of it. */
typedef struct expected {
  double *sum, *near;
} expected;

static expected expect(size_t n, hoop_dtype dtype, unsigned seed) {
  expected e = {xcalloc(n, sizeof(double)), xcalloc(n, sizeof(double))};
  double *magnitude = xcalloc(n, sizeof(double));
  for (int r = 0; r < nranks; r++)
    for (size_t i = 0; i < n; i++) {
      double v = input(r, i, dtype, seed);
      e.sum[i] += v;
      magnitude[i] += fabs(v);
    }
  for (size_t i = 0; i < n; i++) {
    size_t lo = i >= HOOP_COMPRESS_BLOCK ? i - HOOP_COMPRESS_BLOCK : 0;
    size_t hi = i + HOOP_COMPRESS_BLOCK < n ? i + HOOP_COMPRESS_BLOCK : n - 1;
    for (size_t j = lo; j <= hi; j++)
      e.near[i] = magnitude[j] > e.near[i] ? magnitude[j] : e.near[i];
  }
  free(magnitude);
  return e;
}

static void forget(expected *e) {
  free(e->sum);
  free(e->near);
}

/* Element first + i of the reduced inputs, held at i of buf, against its bound. */
static void check_element(const void *buf, size_t i, size_t first, hoop_dtype dtype, hoop_op op,
                          int format, const expected *e, const char *what) {
  double got = load(buf, i, dtype), sum = e->sum[first + i], near = e->near[first + i];
  double divide = op == HOOP_AVG ? nranks : 1;
  double u = dtype_step(dtype);
  /* The exact call's own rounding: each host's ranks combine in the dtype, and so do hosts. */
  double exact_bound = (nranks + 2) * u * near / divide;
  double bound = exact_bound;
  if (format && hosts > 1)
    bound += ((hosts + 1) * format_step(format) + (hosts + 2) * 0x1p-24) * near / divide +
             u * (fabs(sum) / divide + bound);
  double err = fabs(got - sum / divide);
  checks++;
  if (!(err <= bound + 1e-30)) {
    failures++;
    if (failures <= 10)
      fprintf(stderr,
              "compress_worker rank %d: FAIL %s: element %zu is %.9g, the sum %.9g: off by %.3g, "
              "the bound %.3g\n",
              rank, what, first + i, got, sum / divide, err, bound);
  }
}

/* One call's result: every element against its bound; and its bytes against the same call's
 * made exact (exact): where a format crossed hosts some differ, elsewhere none. */
static void check_result(const void *buf, const void *exact, size_t first, size_t count,
                         hoop_dtype dtype, hoop_op op, int format, const expected *e,
                         const char *what) {
  for (size_t i = 0; i < count; i++)
    check_element(buf, i, first, dtype, op, format, e, what);
  size_t esize = hoop_dtype_size(dtype), differ = 0;
  for (size_t i = 0; i < count; i++)
    differ += memcmp((const char *)buf + i * esize, (const char *)exact + i * esize, esize) != 0;
  char detail[128];
  snprintf(detail, sizeof detail, "%zu of %zu elements differ from the exact call's", differ,
           count);
  /* bfloat16 in bf16 carries the hosts' sums exactly: on two hosts its one rounding is the exact
   * call's. */
  int carried = dtype == HOOP_BFLOAT16 && (format & 0xff) == HOOP_COMPRESS_BF16;
  if (format && hosts > 1 && count >= 1001 && !carried)
    check(differ > 0, what, detail);
  else if (!format || hosts == 1)
    check(differ == 0, what, detail);
}

/* Every rank's allreduce result the same bits. */
static void check_same_bits(const void *buf, size_t bytes, const char *what) {
  uint64_t digest = 1469598103934665603ull, *all = xcalloc((size_t)nranks, sizeof *all);
  for (size_t i = 0; i < bytes; i++)
    digest = (digest ^ ((const unsigned char *)buf)[i]) * 1099511628211ull;
  must(hoop_allgather(comm, &digest, all, 1, HOOP_UINT64), "allgather of digests");
  int same = 1;
  for (int r = 0; r < nranks; r++)
    same &= all[r] == digest;
  check(same, what, "the ranks' results differ in their bits");
  free(all);
}

/* The call (form 0, 1 or 2) on device copies of send and recv, its result back in recv. */
static hoop_result on_the_device(int form, const char *send, char *recv, size_t count,
                                 hoop_dtype dtype, hoop_op op) {
  size_t bytes = count * hoop_dtype_size(dtype);
  char *dsend = devmem_put(send, bytes), *drecv = form == 1 ? dsend : devmem_put(NULL, bytes);
  devmem_sync();
  hoop_result result;
  hoop_request *req = NULL;
  if (form == 2 &&
      (result = hoop_iallreduce(comm, dsend, drecv, count, dtype, op, &req)) == HOOP_OK)
    result = hoop_wait(req);
  else if (form != 2)
    result = hoop_allreduce(comm, dsend, drecv, count, dtype, op);
  devmem_get(recv, drecv, bytes);
  if (drecv != dsend)
    devmem_free(drecv);
  devmem_free(dsend);
  return result;
}

/* A reduce-scatter on a device copy of send (in place: the result in its block of it), its
 * result back in out. */
static hoop_result rs_on_the_device(int in_place, const char *send, char *out, size_t count,
                                    hoop_dtype dtype, hoop_op op) {
  size_t bytes = count * hoop_dtype_size(dtype), total = bytes * (size_t)nranks;
  char *dsend = devmem_put(send, total),
       *dout = in_place ? dsend + (size_t)rank * bytes : devmem_put(NULL, bytes);
  devmem_sync();
  hoop_result result = hoop_reduce_scatter(comm, dsend, dout, count, dtype, op);
  devmem_get(out, dout, bytes);
  if (!in_place)
    devmem_free(dout);
  devmem_free(dsend);
  return result;
}

/* One allreduce form: 0 out of place, 1 in place, 2 non-blocking, 3 allreduce_many (two pieces;
 * with --device out of place instead). */
static void run_allreduce(int form, size_t count, hoop_dtype dtype, hoop_op op, int format,
                          int per_call, unsigned seed) {
  size_t esize = hoop_dtype_size(dtype);
  char *send = xcalloc(count, esize), *recv = xcalloc(count, esize), what[160], name[48];
  for (size_t i = 0; i < count; i++)
    store(send, i, dtype, value(rank, i, seed));
  if (device_run && form == 3)
    form = 0;
  static const char *const forms[] = {"allreduce", "allreduce in place", "iallreduce",
                                      "allreduce_many"};
  snprintf(what, sizeof what, "%s %s %s count %zu %s (%s)", forms[form], hoop_dtype_name(dtype),
           hoop_op_name(op), count, hoop_compress_name(format, name, sizeof name) ? name : "?",
           per_call ? "per call" : "communicator");
  if (per_call)
    must(hoop_compress_next(comm, format), "hoop_compress_next");
  if (on_device) {
    must(on_the_device(form, send, recv, count, dtype, op), what);
  } else if (form == 0) {
    must(hoop_allreduce(comm, send, recv, count, dtype, op), what);
  } else if (form == 1) {
    memcpy(recv, send, count * esize);
    must(hoop_allreduce(comm, recv, recv, count, dtype, op), what);
  } else if (form == 2) {
    hoop_request *req;
    must(hoop_iallreduce(comm, send, recv, count, dtype, op, &req), what);
    must(hoop_wait(req), what);
  } else {
    size_t half = count / 3;
    const void *sends[2] = {send, send + half * esize};
    void *recvs[2] = {recv, recv + half * esize};
    size_t counts[2] = {half, count - half};
    must(hoop_allreduce_many(comm, 2, sends, recvs, counts, dtype, op), what);
  }
  char *exact = xcalloc(count, esize);
  must(hoop_compress_next(comm, HOOP_COMPRESS_NONE), "hoop_compress_next");
  /* (On the device too: on one host its order of the sum may not be the host's.) */
  must(on_device ? on_the_device(0, send, exact, count, dtype, op)
                 : hoop_allreduce(comm, send, exact, count, dtype, op),
       "the exact allreduce");
  expected e = expect(count, dtype, seed);
  check_result(recv, exact, 0, count, dtype, op, format, &e, what);
  check_same_bits(recv, count * esize, what);
  /* The same call on every rank's host buffers: the same bits, where no draw (they differ from
   * call to call) or host's order of its sum can tell them apart. */
  int twin = device_run && !(format & HOOP_COMPRESS_STOCHASTIC) && per_host <= 2;
  if (twin) {
    must(hoop_compress_next(comm, format), "hoop_compress_next");
    must(hoop_allreduce(comm, send, exact, count, dtype, op), "the same call on host buffers");
    size_t differ = 0;
    for (size_t i = 0; i < count * esize; i++)
      differ += recv[i] != exact[i];
    char detail[96];
    snprintf(detail, sizeof detail, "%zu bytes differ from the same call on host buffers", differ);
    check(differ == 0, what, detail);
  }
  forget(&e);
  free(exact);
  free(send);
  free(recv);
}

static void run_reduce_scatter(int in_place, size_t count, hoop_dtype dtype, hoop_op op, int format,
                               int per_call, unsigned seed) {
  size_t esize = hoop_dtype_size(dtype), total = count * (size_t)nranks;
  char *send = xcalloc(total, esize), *recv = xcalloc(total, esize), what[160], name[48];
  for (size_t i = 0; i < total; i++)
    store(send, i, dtype, value(rank, i, seed));
  snprintf(what, sizeof what, "reduce_scatter%s %s %s count %zu %s (%s)",
           in_place ? " in place" : "", hoop_dtype_name(dtype), hoop_op_name(op), count,
           hoop_compress_name(format, name, sizeof name) ? name : "?",
           per_call ? "per call" : "communicator");
  if (per_call)
    must(hoop_compress_next(comm, format), "hoop_compress_next");
  char *out = recv;
  if (in_place) {
    memcpy(recv, send, total * esize);
    out = recv + (size_t)rank * count * esize;
  }
  if (on_device)
    must(rs_on_the_device(in_place, send, out, count, dtype, op), what);
  else
    must(hoop_reduce_scatter(comm, in_place ? recv : send, out, count, dtype, op), what);
  char *exact = xcalloc(count, esize);
  must(hoop_compress_next(comm, HOOP_COMPRESS_NONE), "hoop_compress_next");
  must(on_device ? rs_on_the_device(0, send, exact, count, dtype, op)
                 : hoop_reduce_scatter(comm, send, exact, count, dtype, op),
       "the exact reduce_scatter");
  expected e = expect(total, dtype, seed);
  check_result(out, exact, (size_t)rank * count, count, dtype, op, format, &e, what);
  /* As for allreduce: the same bits as the call on host buffers, where nothing tells them apart. */
  if (device_run && !(format & HOOP_COMPRESS_STOCHASTIC) && per_host <= 2) {
    must(hoop_compress_next(comm, format), "hoop_compress_next");
    must(hoop_reduce_scatter(comm, send, exact, count, dtype, op), "the same call on host buffers");
    check(memcmp(out, exact, count * esize) == 0, what,
          "the result differs from the same call on host buffers");
  }
  free(exact);
  forget(&e);
  free(send);
  free(recv);
}

/* A format asked for a call that cannot take it is refused, naming the call; the communicator's
 * format leaves the same call exact. */
static void refusals(void) {
  int32_t ints[4] = {rank, 1, 2, 3}, sum[4];
  float floats[4] = {1, 2, 3, 4};
  char detail[512];
  must(hoop_compress_next(comm, HOOP_COMPRESS_INT8), "hoop_compress_next");
  hoop_result r = hoop_allreduce(comm, ints, sum, 4, HOOP_INT32, HOOP_SUM);
  snprintf(detail, sizeof detail, "%s: %s", hoop_strerror(r), hoop_last_error(comm));
  check(r == HOOP_ERR_INVALID_ARG && strstr(hoop_last_error(comm), "hoop_allreduce") &&
            strstr(hoop_last_error(comm), "int32"),
        "int32 allreduce asked for int8 is refused", detail);
  must(hoop_compress_next(comm, HOOP_COMPRESS_BF16), "hoop_compress_next");
  r = hoop_allreduce(comm, floats, floats, 4, HOOP_FLOAT32, HOOP_MAX);
  snprintf(detail, sizeof detail, "%s: %s", hoop_strerror(r), hoop_last_error(comm));
  check(r == HOOP_ERR_INVALID_ARG && strstr(hoop_last_error(comm), "max"),
        "float32 max asked for bf16 is refused", detail);
  must(hoop_compress_next(comm, HOOP_COMPRESS_FP8), "hoop_compress_next");
  r = hoop_broadcast(comm, floats, 4, HOOP_FLOAT32, 0);
  snprintf(detail, sizeof detail, "%s: %s", hoop_strerror(r), hoop_last_error(comm));
  check(r == HOOP_ERR_INVALID_ARG && strstr(hoop_last_error(comm), "hoop_broadcast"),
        "broadcast asked for fp8 is refused", detail);
  check(hoop_compress_next(comm, 0x7f) == HOOP_ERR_INVALID_ARG, "an unknown format is refused",
        hoop_last_error(comm));
  must(hoop_comm_set_reproducible(comm, 1), "reproducible on");
  must(hoop_compress_next(comm, HOOP_COMPRESS_INT8), "hoop_compress_next");
  r = hoop_allreduce(comm, floats, floats, 4, HOOP_FLOAT32, HOOP_SUM);
  snprintf(detail, sizeof detail, "%s: %s", hoop_strerror(r), hoop_last_error(comm));
  check(r == HOOP_ERR_INVALID_ARG && strstr(hoop_last_error(comm), "reproducible"),
        "int8 asked in reproducible mode is refused", detail);
  must(hoop_comm_set_reproducible(comm, 0), "reproducible off");
  /* The communicator's format applies where it can: integers stay exact, and the next call
   * after the refusals still works. */
  must(hoop_comm_set_compress(comm, HOOP_COMPRESS_INT8), "hoop_comm_set_compress");
  must(hoop_allreduce(comm, ints, sum, 4, HOOP_INT32, HOOP_SUM), "int32 allreduce, int8 set");
  snprintf(detail, sizeof detail, "sums %d and %d", sum[0], sum[3]);
  check(sum[0] == nranks * (nranks - 1) / 2 && sum[3] == 3 * nranks,
        "int32 sums under the communicator's int8 are exact", detail);
  check(hoop_comm_compress(comm) == HOOP_COMPRESS_INT8, "hoop_comm_compress", "not int8");
  must(hoop_comm_set_compress(comm, HOOP_COMPRESS_NONE), "hoop_comm_set_compress");
  char name[48];
  int parsed = -1;
  check(hoop_compress_from_name("int8+stochastic", &parsed) == 0 &&
            parsed == (HOOP_COMPRESS_INT8 | HOOP_COMPRESS_STOCHASTIC) &&
            strcmp(hoop_compress_name(parsed, name, sizeof name), "int8+stochastic") == 0 &&
            hoop_compress_from_name("int9", &parsed) != 0 &&
            hoop_compress_from_name("none+stochastic", &parsed) != 0,
        "format names", "int8+stochastic, int9 or none+stochastic read wrong");
}

/* Error feedback on a registered buffer: a constant gradient allreduced K times (in place, refilled
 * each time) sums to K times the exact sum within what one call's conversions can leave behind
 * (each member's residual of its pieces and of its sums: (H + 1) steps of the nearby magnitude,
 * and float32's rounding of each call's sums), where without feedback each call drops about as
 * much again. Feedback asked on an unregistered buffer, or for allreduce_many, is refused. */
static void feedback(void) {
  enum { K = 16 };
  size_t count = 20011;
  unsigned seed = 77;
  float *buf = xcalloc(count, sizeof *buf);
  double *total = xcalloc(count, sizeof *total);
  char detail[512];
  must(hoop_compress_next(comm, HOOP_COMPRESS_INT8 | HOOP_COMPRESS_FEEDBACK), "hoop_compress_next");
  hoop_result r = hoop_allreduce(comm, buf, buf, count, HOOP_FLOAT32, HOOP_SUM);
  snprintf(detail, sizeof detail, "%s: %s", hoop_strerror(r), hoop_last_error(comm));
  check(r == HOOP_ERR_INVALID_ARG && strstr(hoop_last_error(comm), "hoop_register"),
        "feedback on an unregistered buffer is refused", detail);
  must(hoop_compress_next(comm, HOOP_COMPRESS_INT8 | HOOP_COMPRESS_FEEDBACK), "hoop_compress_next");
  const void *sends[1] = {buf};
  void *recvs[1] = {buf};
  r = hoop_allreduce_many(comm, 1, sends, recvs, &count, HOOP_FLOAT32, HOOP_SUM);
  snprintf(detail, sizeof detail, "%s: %s", hoop_strerror(r), hoop_last_error(comm));
  check(r == HOOP_ERR_INVALID_ARG && strstr(hoop_last_error(comm), "allreduce_many"),
        "feedback for allreduce_many is refused", detail);
  /* With --device, the calls' buffer is device memory (its residuals too, where it is reduced on
   * the device). */
  float *dbuf = on_device ? devmem_put(NULL, count * sizeof *buf) : NULL, *at = dbuf ? dbuf : buf;
  hoop_mem_handle handle;
  must(hoop_register(comm, at, count * sizeof *buf, &handle), "hoop_register");
  expected e = expect(count, HOOP_FLOAT32, seed);
  double worst[2] = {0,
                     0}; /* with feedback, without: the largest error over the nearby magnitude */
  for (int with = 1; with >= 0; with--) {
    memset(total, 0, count * sizeof *total);
    for (int k = 0; k < K; k++) {
      for (size_t i = 0; i < count; i++)
        buf[i] = (float)value(rank, i, seed);
      must(hoop_compress_next(comm, HOOP_COMPRESS_INT8 | (with ? HOOP_COMPRESS_FEEDBACK : 0)),
           "hoop_compress_next");
      if (dbuf)
        devmem_upload(dbuf, buf, count * sizeof *buf);
      must(hoop_allreduce(comm, at, at, count, HOOP_FLOAT32, HOOP_SUM), "feedback allreduce");
      if (dbuf)
        devmem_get(buf, dbuf, count * sizeof *buf);
      for (size_t i = 0; i < count; i++)
        total[i] += buf[i];
    }
    for (size_t i = 0; i < count; i++) {
      double err = fabs(total[i] - K * e.sum[i]) / e.near[i];
      worst[with] = err > worst[with] ? err : worst[with];
    }
  }
  double bound = (hosts + 1) * format_step(HOOP_COMPRESS_INT8) + K * (nranks + 4) * 0x1p-24;
  snprintf(detail, sizeof detail,
           "%d calls with feedback: off by %.3g of the nearby magnitude, the bound %.3g "
           "(without feedback %.3g)",
           K, worst[1], bound, worst[0]);
  if (hosts > 1) {
    check(worst[1] <= bound, "feedback drains what compression dropped", detail);
    check(worst[0] > bound, "without feedback the same calls drift past the bound", detail);
  } else {
    check(worst[1] <= K * (nranks + 4) * 0x1p-24, "one host: exact with or without", detail);
  }
  if (rank == 0)
    printf("compress_worker: %s\n", detail);
  must(hoop_deregister(comm, handle), "hoop_deregister");
  if (dbuf)
    devmem_free(dbuf);
  forget(&e);
  free(total);
  free(buf);
}

int main(int argc, char **argv) {
  int quick = 0;
  const char *device = NULL;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--quick") == 0)
      quick = 1;
    else if (strcmp(argv[i], "--uneven") == 0)
      uneven = 1;
    else if (strcmp(argv[i], "--device") == 0 && i + 1 < argc)
      device = argv[++i];
    else if (strcmp(argv[i], "--fake-hosts") == 0 && i + 1 < argc) {
      int per = atoi(argv[++i]);
      const char *mine = getenv("HOOP_RANK");
      char host[64];
      snprintf(host, sizeof host, "fake-host-%d", (mine ? atoi(mine) : 0) / (per ? per : 1));
      setenv("HOOP_HOSTNAME", host, 1);
    }
  }
  if (device) {
    char why[256];
    if (devmem_init(why, sizeof why) != 0) {
      fprintf(stderr, "compress_worker: --device: %s\n", why);
      return 77;
    }
  }
  must(hoop_init_from_env(&comm), "hoop_init_from_env");
  rank = hoop_rank(comm);
  nranks = hoop_size(comm);
  per_host = hoop_local_size(comm);
  device_run = device != NULL;
  on_device = device && (strcmp(device, "all") == 0 || rank < per_host);
  hosts = uneven ? 1 : nranks / per_host;
  static const int formats[] = {HOOP_COMPRESS_INT8,
                                HOOP_COMPRESS_FP8,
                                HOOP_COMPRESS_BF16,
                                HOOP_COMPRESS_INT8 | HOOP_COMPRESS_STOCHASTIC,
                                HOOP_COMPRESS_FP8 | HOOP_COMPRESS_STOCHASTIC,
                                HOOP_COMPRESS_BF16 | HOOP_COMPRESS_STOCHASTIC};
  static const hoop_dtype dtypes[] = {HOOP_FLOAT32, HOOP_BFLOAT16, HOOP_FLOAT16};
  static const size_t counts[] = {1, 7, 1001, 70001};
  unsigned seed = 3;
  for (size_t f = 0; f < sizeof formats / sizeof formats[0]; f++)
    for (size_t d = 0; d < sizeof dtypes / sizeof dtypes[0]; d++)
      for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++) {
        if (quick && (d > 0 || c == 1) && f > 0)
          continue;
        hoop_op op = (c + f) % 2 ? HOOP_AVG : HOOP_SUM;
        int per_call = (c + d) % 2;
        if (!per_call)
          must(hoop_comm_set_compress(comm, formats[f]), "hoop_comm_set_compress");
        run_allreduce((int)((f + d + c) % 4), counts[c], dtypes[d], op, formats[f], per_call,
                      seed++);
        run_reduce_scatter((int)(c % 2), counts[c] / 3 + 1, dtypes[d], op, formats[f], per_call,
                           seed++);
        must(hoop_comm_set_compress(comm, HOOP_COMPRESS_NONE), "hoop_comm_set_compress");
      }
  refusals();
  feedback();
  printf("compress_worker rank %d: %zu checks, %zu failed (%d hosts x %d)\n", rank, checks,
         failures, hosts, per_host);
  must(hoop_finalize(comm), "hoop_finalize");
  return failures ? 1 : 0;
}
