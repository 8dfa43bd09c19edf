/* buf.c - the growable buffer of buf.h. */
#include "util/buf.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Room for more bytes and the NUL after them. */
static int reserve(hoop__buf *buf, size_t more) {
  if (buf->failed)
    return -1;
  if (more < buf->cap - buf->len)
    return 0;
  size_t cap = buf->cap ? buf->cap : 256;
  while (cap - buf->len <= more) {
    if (cap > SIZE_MAX / 2) {
      buf->failed = 1;
      return -1;
    }
    cap *= 2;
  }
  char *data = realloc(buf->data, cap);
  if (!data) {
    buf->failed = 1;
    return -1;
  }
  buf->data = data;
  buf->cap = cap;
  return 0;
}

int hoop__buf_append(hoop__buf *buf, const void *bytes, size_t len) {
  if (reserve(buf, len) != 0)
    return -1;
  if (len > 0)
    memcpy(buf->data + buf->len, bytes, len);
  buf->len += len;
  buf->data[buf->len] = '\0';
  return 0;
}

int hoop__buf_vprintf(hoop__buf *buf, const char *fmt, va_list ap) {
  va_list again;
  va_copy(again, ap);
  int len = vsnprintf(NULL, 0, fmt, again);
  va_end(again);
  if (len < 0 || reserve(buf, (size_t)len) != 0)
    return -1;
  vsnprintf(buf->data + buf->len, (size_t)len + 1, fmt, ap);
  buf->len += (size_t)len;
  return 0;
}

int hoop__buf_printf(hoop__buf *buf, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int rc = hoop__buf_vprintf(buf, fmt, ap);
  va_end(ap);
  return rc;
}

void hoop__buf_free(hoop__buf *buf) {
  free(buf->data);
  memset(buf, 0, sizeof *buf);
}
