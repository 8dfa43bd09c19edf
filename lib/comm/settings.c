/* settings.c - what a program sets on a communicator after init, from the next call on: its
 * timeout, reproducible mode and wire format across hosts. */
#include "core/internal.h"

hoop_result hoop_comm_set_timeout(hoop_comm *comm, double seconds) {
  if (!comm)
    return HOOP_ERR_INVALID_ARG;
  if (!(seconds > 0) || seconds > 1e9)
    return hoop__set_error(comm, HOOP_ERR_INVALID_ARG,
                           "hoop_comm_set_timeout: %g is not a number of seconds above 0 (and "
                           "at most 1e9)",
                           seconds);
  comm->timeout_s = seconds;
  return HOOP_OK;
}

double hoop_comm_timeout(const hoop_comm *comm) {
  return comm ? comm->timeout_s : 0;
}

hoop_result hoop_comm_set_reproducible(hoop_comm *comm, int on) {
  if (!comm)
    return HOOP_ERR_INVALID_ARG;
  if (on != 0 && on != 1)
    return hoop__set_error(comm, HOOP_ERR_INVALID_ARG,
                           "hoop_comm_set_reproducible: %d is not 0 or 1", on);
  comm->reproducible = on;
  return HOOP_OK;
}

int hoop_comm_reproducible(const hoop_comm *comm) {
  return comm ? comm->reproducible : 0;
}

hoop_result hoop_comm_set_compress(hoop_comm *comm, int format) {
  if (!comm)
    return HOOP_ERR_INVALID_ARG;
  if (!hoop__compress_known(format))
    return hoop__set_error(comm, HOOP_ERR_INVALID_ARG,
                           "hoop_comm_set_compress: %#x is not a format with known flags",
                           (unsigned)format);
  comm->compress = format;
  return HOOP_OK;
}

int hoop_comm_compress(const hoop_comm *comm) {
  return comm ? comm->compress : 0;
}
