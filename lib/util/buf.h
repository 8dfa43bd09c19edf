/* buf.h - the one growable buffer: bytes appended or printed at its end, kept NUL-terminated so
 * that text in it reads as a string. Wire messages, hooprun's lines and the server's messages are
 * built in it. */
#ifndef HOOP__BUF_H
#define HOOP__BUF_H

#include <stdarg.h>
#include <stddef.h>

#include "util/attr.h"

/* Start from {0}. On allocation failure `failed` is set, the buffer keeps what it had, and later
 * appends do nothing. */
typedef struct hoop__buf {
  char *data;
  size_t len;
  size_t cap;
  int failed;
} hoop__buf;

/* Append len bytes; 0, or -1 once the buffer has failed. */
int hoop__buf_append(hoop__buf *buf, const void *bytes, size_t len);
int hoop__buf_vprintf(hoop__buf *buf, const char *fmt, va_list ap);
int hoop__buf_printf(hoop__buf *buf, const char *fmt, ...) HOOP__PRINTF(2, 3);
void hoop__buf_free(hoop__buf *buf);

#endif /* HOOP__BUF_H */
