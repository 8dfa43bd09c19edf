/* dtype.c - names and sizes of the data types and reduction operations, and result names. */
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "core/internal.h"
#include "hoop.h"

static const struct {
  const char *name;
  size_t size;
} dtypes[HOOP_DTYPE_COUNT] = {
    [HOOP_INT8] = {"int8", 1},       [HOOP_UINT8] = {"uint8", 1},
    [HOOP_INT32] = {"int32", 4},     [HOOP_UINT32] = {"uint32", 4},
    [HOOP_INT64] = {"int64", 8},     [HOOP_UINT64] = {"uint64", 8},
    [HOOP_FLOAT16] = {"float16", 2}, [HOOP_BFLOAT16] = {"bfloat16", 2},
    [HOOP_FLOAT32] = {"float32", 4}, [HOOP_FLOAT64] = {"float64", 8},
    [HOOP_INT16] = {"int16", 2},     [HOOP_UINT16] = {"uint16", 2},
    [HOOP_BOOL] = {"bool", 1},
};

static const char *const ops[HOOP_OP_COUNT] = {
    [HOOP_SUM] = "sum", [HOOP_PROD] = "prod", [HOOP_MIN] = "min", [HOOP_MAX] = "max",
    [HOOP_AVG] = "avg", [HOOP_BAND] = "band", [HOOP_BOR] = "bor", [HOOP_BXOR] = "bxor",
};

static int is_float(hoop_dtype dtype) {
  return dtype == HOOP_FLOAT16 || dtype == HOOP_BFLOAT16 || dtype == HOOP_FLOAT32 ||
         dtype == HOOP_FLOAT64;
}

const char *hoop__op_refused(hoop_dtype dtype, hoop_op op) {
  if ((unsigned)op >= HOOP_OP_COUNT)
    return "unknown op";
  if ((unsigned)dtype >= HOOP_DTYPE_COUNT)
    return "unknown dtype";
  if (op >= HOOP_BAND && is_float(dtype))
    return "a bitwise op takes integer and bool dtypes only";
  if (op == HOOP_AVG && dtype == HOOP_BOOL)
    return "bool has no average (sum is logical or)";
  return NULL;
}

size_t hoop_dtype_size(hoop_dtype dtype) {
  return (unsigned)dtype < HOOP_DTYPE_COUNT ? dtypes[dtype].size : 0;
}

const char *hoop_dtype_name(hoop_dtype dtype) {
  return (unsigned)dtype < HOOP_DTYPE_COUNT ? dtypes[dtype].name : NULL;
}

const char *hoop_op_name(hoop_op op) {
  return (unsigned)op < HOOP_OP_COUNT ? ops[op] : NULL;
}

int hoop_dtype_from_name(const char *name, hoop_dtype *dtype) {
  /* Aliases that users of NCCL and PyTorch type. */
  static const struct {
    const char *alias;
    hoop_dtype dtype;
  } aliases[] = {{"float", HOOP_FLOAT32}, {"double", HOOP_FLOAT64}, {"half", HOOP_FLOAT16},
                 {"bf16", HOOP_BFLOAT16}, {"fp16", HOOP_FLOAT16},   {"fp32", HOOP_FLOAT32},
                 {"fp64", HOOP_FLOAT64},  {"int", HOOP_INT32},      {"char", HOOP_INT8},
                 {"short", HOOP_INT16},   {"int16_t", HOOP_INT16},  {"uint16_t", HOOP_UINT16},
                 {"_Bool", HOOP_BOOL}};
  if (!name)
    return -1;
  for (int i = 0; i < HOOP_DTYPE_COUNT; i++)
    if (strcasecmp(name, dtypes[i].name) == 0) {
      *dtype = (hoop_dtype)i;
      return 0;
    }
  for (size_t i = 0; i < sizeof aliases / sizeof aliases[0]; i++)
    if (strcasecmp(name, aliases[i].alias) == 0) {
      *dtype = aliases[i].dtype;
      return 0;
    }
  return -1;
}

int hoop_op_from_name(const char *name, hoop_op *op) {
  if (!name)
    return -1;
  for (int i = 0; i < HOOP_OP_COUNT; i++)
    if (strcasecmp(name, ops[i]) == 0) {
      *op = (hoop_op)i;
      return 0;
    }
  return -1;
}

/* ---- compressed wire formats ----------------------------------------------------------------- */

static const char *const compress_formats[] = {"none", "bf16", "fp8", "int8"};
static const struct {
  const char *name;
  int flag;
} compress_flags[] = {{"stochastic", HOOP_COMPRESS_STOCHASTIC},
                      {"feedback", HOOP_COMPRESS_FEEDBACK}};
#define COMPRESS_FLAGS (HOOP_COMPRESS_STOCHASTIC | HOOP_COMPRESS_FEEDBACK)

int hoop__compress_known(int format) {
  int base = format & 0xff, flags = format & ~0xff;
  return format >= 0 && base <= HOOP_COMPRESS_INT8 && (flags & ~COMPRESS_FLAGS) == 0 &&
         (base != HOOP_COMPRESS_NONE || flags == 0);
}

const char *hoop_compress_name(int format, char *buf, size_t len) {
  if (!buf || !hoop__compress_known(format))
    return NULL;
  int n = snprintf(buf, len, "%s", compress_formats[format & 0xff]);
  for (size_t i = 0; i < sizeof compress_flags / sizeof compress_flags[0]; i++)
    if (format & compress_flags[i].flag && n >= 0 && (size_t)n < len)
      n += snprintf(buf + n, len - (size_t)n, "+%s", compress_flags[i].name);
  return n >= 0 && (size_t)n < len ? buf : NULL;
}

int hoop_compress_from_name(const char *name, int *format) {
  if (!name || !format)
    return -1;
  int parsed = -1;
  size_t len = strcspn(name, "+");
  for (int i = 0; i <= HOOP_COMPRESS_INT8; i++)
    if (strlen(compress_formats[i]) == len && strncasecmp(name, compress_formats[i], len) == 0)
      parsed = i;
  if (parsed < 0 && len == 8 && strncasecmp(name, "bfloat16", 8) == 0)
    parsed = HOOP_COMPRESS_BF16;
  for (const char *at = name + len; parsed >= 0 && *at == '+'; at += len) {
    at++;
    len = strcspn(at, "+");
    int flag = 0;
    for (size_t i = 0; i < sizeof compress_flags / sizeof compress_flags[0]; i++)
      if (strlen(compress_flags[i].name) == len &&
          strncasecmp(at, compress_flags[i].name, len) == 0)
        flag = compress_flags[i].flag;
    parsed = flag ? parsed | flag : -1;
  }
  if (parsed < 0 || !hoop__compress_known(parsed))
    return -1;
  *format = parsed;
  return 0;
}

const char *hoop_strerror(hoop_result result) {
  switch (result) {
  case HOOP_OK: return "success";
  case HOOP_ERR_INVALID_ARG: return "invalid argument";
  case HOOP_ERR_TIMEOUT: return "timed out";
  case HOOP_ERR_PEER_LOST: return "peer lost";
  case HOOP_ERR_AUTH: return "authentication failed";
  case HOOP_ERR_SYSTEM: return "system error";
  case HOOP_ERR_UNSUPPORTED: return "unsupported";
  case HOOP_ERR_ABORTED: return "aborted";
  case HOOP_ERR_MISMATCH: return "mismatched collective calls";
  case HOOP_ERR_PROTOCOL: return "protocol error";
  case HOOP_ERR_FAILED: return "communicator failed earlier";
  }
  return "unknown result code";
}
