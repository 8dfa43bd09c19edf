/* wire_io.h - the byte-level helpers the rendezvous messages are written and read with (wire.c,
 * wire_health.c): big-endian integers, bounded strings, and a reader that checks every read. Only
 * lib/proto includes it. */
#ifndef HOOP__WIRE_IO_H
#define HOOP__WIRE_IO_H

#include <stdint.h>
#include <string.h>

#include "proto/wire.h"
#include "util/be.h"

/* ---- output buffer --------------------------------------------------------------------------- */

static inline void put_bytes(hoop__wbuf *wb, const void *src, size_t n) {
  hoop__buf_append(wb, src, n);
}

static inline void put_u16(hoop__wbuf *wb, uint16_t value) {
  uint8_t bytes[2];
  hoop__put_be16(bytes, value);
  put_bytes(wb, bytes, sizeof bytes);
}

static inline void put_u32(hoop__wbuf *wb, uint32_t value) {
  uint8_t bytes[4];
  hoop__put_be32(bytes, value);
  put_bytes(wb, bytes, sizeof bytes);
}

/* len has been checked against the field's limit, which is below 65536. */
static inline void put_str(hoop__wbuf *wb, const char *text, size_t len) {
  put_u16(wb, (uint16_t)len);
  put_bytes(wb, text, len);
}

/* The length of a string field of the struct being encoded, or -1 when it is not terminated inside
 * its array (cap bytes) or is longer than max. */
static inline long field_len(const char *text, size_t cap, size_t max) {
  size_t len = strnlen(text, cap);
  return len == cap || len > max ? -1 : (long)len;
}

/* Append a header with a zero length; finish_message patches the length in. */
static inline size_t begin_message(hoop__wbuf *wb, hoop__msg_type type) {
  size_t start = wb->len;
  put_u32(wb, HOOP__WIRE_MAGIC);
  put_u16(wb, HOOP__WIRE_VERSION);
  put_u16(wb, (uint16_t)type);
  put_u32(wb, 0);
  return start;
}

static inline int finish_message(hoop__wbuf *wb, size_t start) {
  if (wb->failed)
    return -1;
  size_t length = wb->len - start - HOOP__WIRE_HEADER_SIZE;
  hoop__put_be32((uint8_t *)wb->data + start + 8, (uint32_t)length);
  return 0;
}

/* ---- input reader ---------------------------------------------------------------------------- */

/* Reads from a payload; any read past the end sets `bad`, and later reads then yield zeros, so a
 * decoder checks once at the end instead of after every field. */
typedef struct reader {
  const uint8_t *at;
  size_t left;
  int bad;
} reader;

/* n bytes, or NULL when they are not there. n must be > 0. */
static inline const uint8_t *take(reader *in, size_t n) {
  if (in->bad || n > in->left) {
    in->bad = 1;
    return NULL;
  }
  const uint8_t *bytes = in->at;
  in->at += n;
  in->left -= n;
  return bytes;
}

static inline uint16_t get_u16(reader *in) {
  const uint8_t *b = take(in, 2);
  return b ? hoop__get_be16(b) : 0;
}

static inline uint32_t get_u32(reader *in) {
  const uint8_t *b = take(in, 4);
  return b ? hoop__get_be32(b) : 0;
}

/* Two's complement by arithmetic, so that no implementation-defined conversion is involved. */
static inline int32_t get_i32(reader *in) {
  uint32_t raw = get_u32(in);
  return raw <= INT32_MAX ? (int32_t)raw : -(int32_t)(UINT32_MAX - raw) - 1;
}

/* A string of at most max bytes into out (max + 1 bytes), NUL-terminated; an embedded NUL makes
 * the payload bad. */
static inline void get_str(reader *in, char *out, size_t max) {
  uint16_t len = get_u16(in);
  out[0] = '\0';
  if (in->bad || len == 0)
    return;
  const uint8_t *bytes = len <= max ? take(in, len) : NULL;
  if (!bytes || memchr(bytes, '\0', len)) {
    in->bad = 1;
    return;
  }
  memcpy(out, bytes, len);
  out[len] = '\0';
}

/* A name (a job's id, a host's name, an address): a string as get_str takes it, refused if it holds
 * a control byte, so that a name read from a stranger before any proof cannot forge lines in the
 * logs it is written to. */
static inline void get_name(reader *in, char *out, size_t max) {
  get_str(in, out, max);
  for (const unsigned char *p = (const unsigned char *)out; *p && !in->bad; p++)
    if (*p < 0x20 || *p == 0x7f)
      in->bad = 1;
}

/* A proof blob of at most HOOP__WIRE_MAX_PROOF bytes into out; returns its length. */
static inline uint16_t get_proof(reader *in, uint8_t *out) {
  uint16_t len = get_u16(in);
  if (in->bad || len == 0)
    return 0;
  const uint8_t *proof = len <= HOOP__WIRE_MAX_PROOF ? take(in, len) : NULL;
  if (!proof) {
    in->bad = 1;
    return 0;
  }
  memcpy(out, proof, len);
  return len;
}

/* 0 when the whole payload was read and nothing was out of place. */
static inline int reader_done(const reader *in) {
  return !in->bad && in->left == 0 ? 0 : -1;
}

/* A job's health in a STATUS (wire_health.c), after its other fields. */
void hoop__wire_put_health(hoop__wbuf *wb, const hoop__job_health *health);
void hoop__wire_get_health(reader *in, hoop__job_health *health, uint32_t size);
int hoop__wire_health_valid(const hoop__job_health *health, uint32_t size);

#endif
