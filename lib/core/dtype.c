/* dtype.c - names and sizes of the data types and reduction operations, and result names. */
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
