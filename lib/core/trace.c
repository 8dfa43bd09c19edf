/* trace.c - HOOP_TRACE's timeline (see trace.h). Events go through stdio with a buffer of
 * TRACE_BUFFER bytes, one fprintf each (stdio locks the stream per call, so the progress thread
 * and the posting thread never interleave within an event): a few hundred nanoseconds per event,
 * three or four events per call, and a write to the file every few thousand events. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/env.h"
#include "core/trace.h"

#define TRACE_BUFFER (1 << 20)

hoop_result hoop__trace_open(hoop_comm *comm, const char *transports) {
  const char *path = hoop__env_get("HOOP_TRACE");
  if (!path[0])
    return HOOP_OK;
  char name[4096];
  /* A shrunken job's ranks are renumbered: each generation writes files of its own. */
  if (comm->generation)
    snprintf(name, sizeof name, "%s.g%u.%d", path, comm->generation, comm->rank);
  else
    snprintf(name, sizeof name, "%s.%d", path, comm->rank);
  FILE *file = fopen(name, "w");
  if (!file)
    return hoop__set_error(comm, HOOP_ERR_SYSTEM, "hoop_init: HOOP_TRACE: cannot write %s: %s",
                           name, strerror(errno));
  setvbuf(file, NULL, _IOFBF, TRACE_BUFFER);
  snprintf(comm->trace_transport, sizeof comm->trace_transport, "%s", transports);
  fprintf(file,
          "[\n{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,\"args\":{\"name\":\"rank %d of "
          "%d\"}},\n"
          "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":1,\"args\":{\"name\":"
          "\"collectives\"}},\n"
          "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":2,\"args\":{\"name\":"
          "\"waits\"}}",
          comm->rank, comm->rank, comm->size, comm->rank, comm->rank);
  comm->trace = file;
  HOOP__INFO(HOOP_SUBSYS_INIT, "HOOP_TRACE: writing this rank's timeline to %s", name);
  return HOOP_OK;
}

void hoop__trace_close(hoop_comm *comm) {
  if (!comm->trace)
    return;
  fprintf(comm->trace, "\n]\n");
  fclose(comm->trace);
  comm->trace = NULL;
}

void hoop__trace_post(hoop_comm *comm, uint64_t id, const char *call, size_t bytes, double at) {
  fprintf(comm->trace,
          ",\n{\"name\":\"%s\",\"cat\":\"request\",\"ph\":\"b\",\"id\":%llu,\"pid\":%d,\"tid\":0,"
          "\"ts\":%.3f,\"args\":{\"bytes\":%zu}}",
          call, (unsigned long long)id, comm->rank, at * 1e6, bytes);
}

void hoop__trace_done(hoop_comm *comm, uint64_t id, const char *call, hoop_result result,
                      double at) {
  fprintf(comm->trace,
          ",\n{\"name\":\"%s\",\"cat\":\"request\",\"ph\":\"e\",\"id\":%llu,\"pid\":%d,\"tid\":0,"
          "\"ts\":%.3f,\"args\":{\"result\":\"%s\"}}",
          call, (unsigned long long)id, comm->rank, at * 1e6, hoop_strerror(result));
}

void hoop__trace_wait(hoop_comm *comm, int peer, size_t bytes, double start, double end) {
  fprintf(comm->trace,
          ",\n{\"name\":\"wait for rank %d\",\"cat\":\"wait\",\"ph\":\"X\",\"pid\":%d,\"tid\":2,"
          "\"ts\":%.3f,\"dur\":%.3f,\"args\":{\"peer\":%d,\"bytes\":%zu,\"seq\":%llu}}",
          peer, comm->rank, start * 1e6, (end - start) * 1e6, peer, bytes,
          (unsigned long long)comm->seq);
}

void hoop__trace_run(hoop_comm *comm, const char *call, size_t count, hoop_dtype dtype,
                     size_t bytes, const char *algorithm, hoop_result result, double start,
                     double end) {
  const char *dtype_name = hoop_dtype_name(dtype);
  fprintf(comm->trace,
          ",\n{\"name\":\"%s\",\"cat\":\"collective\",\"ph\":\"X\",\"pid\":%d,\"tid\":1,"
          "\"ts\":%.3f,\"dur\":%.3f,\"args\":{\"seq\":%llu,\"count\":%zu,\"dtype\":\"%s\","
          "\"bytes\":%zu,\"algorithm\":\"%s\",\"transport\":\"%s\",\"result\":\"%s\","
          "\"waited_us\":%.3f}}",
          call, comm->rank, start * 1e6, (end - start) * 1e6, (unsigned long long)comm->seq, count,
          dtype_name ? dtype_name : "?", bytes, algorithm, comm->trace_transport,
          hoop_strerror(result), (double)comm->call_wait_ns * 1e-3);
}
