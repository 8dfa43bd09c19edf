/* output.c - hooprun's output: the ranks' stdout and stderr forwarded line by line, tagged with
 * the rank, to hooprun's own (the sinks); hooprun's messages; and the growable text buffer and
 * memory helpers that every file uses. */
#include "config.h"

#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <uv.h>

#include "hooprun.h"

/* A longer line is forwarded in pieces, so that output without newlines cannot make hooprun's
 * memory grow without bound. */
#define LINE_MAX_BYTES (1024 * 1024)
/* Reads at once from a rank that has just exited: 16 x 64 KiB empty even a pipe grown to the
 * 1 MiB an unprivileged process may ask for; anything more comes from a process the rank left
 * behind, and the loop reads that as usual. */
#define EXIT_READS 16

/* ---- memory and text ------------------------------------------------------------------------ */

static void out_of_memory(void) {
  /* Nothing sensible is left to do; the ranks see their output pipes close. */
  fputs("hooprun: out of memory\n", stderr);
  exit(EXIT_FAILURE);
}

void *hooprun_xrealloc(void *ptr, size_t size) {
  void *grown = realloc(ptr, size);
  if (!grown)
    out_of_memory();
  return grown;
}

char *hooprun_xstrdup(const char *text) {
  size_t size = strlen(text) + 1;
  return memcpy(hooprun_xrealloc(NULL, size), text, size);
}

void hooprun_text_append(hooprun_text *text, const char *bytes, size_t len) {
  if (hoop__buf_append(text, bytes, len) != 0)
    out_of_memory();
}

void hooprun_text_vprintf(hooprun_text *text, const char *fmt, va_list ap) {
  if (hoop__buf_vprintf(text, fmt, ap) != 0)
    out_of_memory();
}

void hooprun_text_printf(hooprun_text *text, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  hooprun_text_vprintf(text, fmt, ap);
  va_end(ap);
}

void hooprun_text_free(hooprun_text *text) {
  hoop__buf_free(text);
}

/* ---- output and messages -------------------------------------------------------------------- */

/* libuv's codes are negated errno values on Unix, except its own (UV_EOF, UV_EAI_*) below -1000;
 * strerror words the first as users know them ("No such file or directory"). */
const char *hooprun_error_text(int err) {
  return err > -1000 ? strerror(-err) : uv_strerror(err);
}

/* Returns 0 or an errno value. */
static int write_all(int fd, const char *data, size_t len) {
  while (len > 0) {
    ssize_t written = write(fd, data, len);
    if (written >= 0) {
      data += written;
      len -= (size_t)written;
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      /* Whoever opened the descriptor made it non-blocking: wait until it takes more. */
      struct pollfd ready = {.fd = fd, .events = POLLOUT};
      if (poll(&ready, 1, -1) < 0 && errno != EINTR)
        return errno;
    } else if (errno != EINTR) {
      return errno;
    }
  }
  return 0;
}

/* Each call writes whole lines at once, so lines from different ranks never mix. */
void hooprun_sink_write(hooprun_job *job, hooprun_sink *sink, const char *data, size_t len) {
  if (sink->broken || len == 0)
    return;
  int err = write_all(sink->fd, data, len);
  if (err == 0)
    return;
  sink->broken = 1;
  hooprun_say(job, "cannot write to %s: %s", sink->name, strerror(err));
  hooprun_job_stop(job, EXIT_FAILURE);
}

void hooprun_say_va(hooprun_job *job, const char *fmt, va_list ap) {
  hooprun_text line = {0};
  hooprun_text_append(&line, "hooprun: ", 9);
  hooprun_text_vprintf(&line, fmt, ap);
  hooprun_text_append(&line, "\n", 1);
  hooprun_sink_write(job, &job->stderr_sink, line.data, line.len);
  hooprun_text_free(&line);
}

/* A message for the user on stderr. */
void hooprun_say(hooprun_job *job, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  hooprun_say_va(job, fmt, ap);
  va_end(ap);
}

/* A message for --verbose only. */
void hooprun_verbose(hooprun_job *job, const char *fmt, ...) {
  if (!job->options.verbose)
    return;
  va_list ap;
  va_start(ap, fmt);
  hooprun_say_va(job, fmt, ap);
  va_end(ap);
}

void hooprun_close_fd(hooprun_job *job, int fd) {
  if (close(fd) != 0)
    hooprun_say(job, "close(%d): %s", fd, strerror(errno));
}

/* ---- forwarding the ranks' output ----------------------------------------------------------- */

static void on_alloc(uv_handle_t *handle, size_t suggested, uv_buf_t *buf) {
  (void)suggested;
  hooprun_output *output = handle->data;
  /* One buffer serves every pipe: each read is forwarded before the next one starts. */
  *buf = uv_buf_init(output->rank->job->read_buf, READ_BYTES);
}

/* Add one line to job->lines: the tag, the partial line kept so far, then rest (ending in '\n'). */
static void line_add(hooprun_job *job, hooprun_output *output, const char *rest, size_t len) {
  hooprun_text_append(&job->lines, output->rank->tag, strlen(output->rank->tag));
  hooprun_text_append(&job->lines, output->partial.data, output->partial.len);
  hooprun_text_append(&job->lines, rest, len);
  output->partial.len = 0;
}

/* Forward the whole lines in data with one write; keep the unfinished rest for later. */
static void output_forward(hooprun_job *job, hooprun_output *output, const char *data, size_t len) {
  const char *end = data + len;
  const char *newline;
  job->lines.len = 0;
  while ((newline = memchr(data, '\n', (size_t)(end - data))) != NULL) {
    line_add(job, output, data, (size_t)(newline + 1 - data));
    data = newline + 1;
  }
  hooprun_text_append(&output->partial, data, (size_t)(end - data));
  if (output->partial.len >= LINE_MAX_BYTES)
    line_add(job, output, "\n", 1);
  hooprun_sink_write(job, output->sink, job->lines.data, job->lines.len);
}

static void on_output_closed(uv_handle_t *handle) {
  hooprun_output *output = handle->data;
  hooprun_job *job = output->rank->job;
  job->outputs_open--;
  hooprun_job_progress(job);
}

/* The write end is closed, or given up on: forward the last line even without its newline. */
void hooprun_output_close(hooprun_job *job, hooprun_output *output) {
  job->lines.len = 0;
  if (output->partial.len > 0)
    line_add(job, output, "\n", 1);
  hooprun_sink_write(job, output->sink, job->lines.data, job->lines.len);
  hooprun_text_free(&output->partial);
  output->open = 0;
  uv_close((uv_handle_t *)&output->pipe, on_output_closed);
}

static void on_read(uv_stream_t *stream, ssize_t nread, const uv_buf_t *buf) {
  hooprun_output *output = stream->data;
  hooprun_job *job = output->rank->job;
  if (nread > 0) {
    output_forward(job, output, buf->base, (size_t)nread);
  } else if (nread < 0) {
    if (nread != UV_EOF)
      hooprun_say(job, "reading rank %d's %s: %s", output->rank->index, output->name,
                  hooprun_error_text((int)nread));
    hooprun_output_close(job, output);
  }
}

void hooprun_output_start(hooprun_job *job, hooprun_output *output) {
  int err = uv_read_start((uv_stream_t *)&output->pipe, on_alloc, on_read);
  if (err != 0) {
    hooprun_say(job, "cannot read rank %d's %s: %s", output->rank->index, output->name,
                hooprun_error_text(err));
    hooprun_job_stop(job, EXIT_FAILURE);
    return;
  }
  output->open = 1;
  job->outputs_open++;
}

/* Forward what a rank that has just exited left in its pipe, so that its last lines come out
 * before hooprun reports its exit. Stops at an empty pipe: a process the rank started may still
 * hold the write end, and the loop keeps reading that. */
void hooprun_output_read_now(hooprun_job *job, hooprun_output *output) {
  uv_os_fd_t fd;
  if (!output->open || uv_fileno((uv_handle_t *)&output->pipe, &fd) != 0)
    return;
  for (int reads = 0; reads < EXIT_READS; reads++) {
    ssize_t nread = read(fd, job->read_buf, READ_BYTES);
    if (nread > 0) {
      output_forward(job, output, job->read_buf, (size_t)nread);
      continue;
    }
    if (nread < 0 && errno == EINTR)
      continue;
    if (nread < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
      return;
    if (nread < 0)
      hooprun_say(job, "reading rank %d's %s: %s", output->rank->index, output->name,
                  strerror(errno));
    hooprun_output_close(job, output);
    return;
  }
}
