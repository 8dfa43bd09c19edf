/* nomemfd.c - loaded with LD_PRELOAD by tests/test_shm.sh: a host where memfd_create fails for
 * some segments, as it does at a descriptor or memory limit. NOMEMFD_NAMES lists the names
 * (separated by commas, e.g. "hoop-board") whose creation fails with EMFILE; every other name
 * goes to the C library's memfd_create. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* RTLD_NEXT; configure may have defined it already */
#endif
#include <dlfcn.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

static int refused(const char *name) {
  const char *names = getenv("NOMEMFD_NAMES");
  size_t len = name ? strlen(name) : 0;
  for (const char *at = names; at && *at && len;) {
    const char *end = strchr(at, ',');
    size_t n = end ? (size_t)(end - at) : strlen(at);
    if (n == len && strncmp(at, name, n) == 0)
      return 1;
    at = end ? end + 1 : NULL;
  }
  return 0;
}

int memfd_create(const char *name, unsigned int flags) {
  if (refused(name)) {
    errno = EMFILE;
    return -1;
  }
  int (*real)(const char *, unsigned int);
  *(void **)&real = dlsym(RTLD_NEXT, "memfd_create");
  if (!real) {
    errno = ENOSYS;
    return -1;
  }
  return real(name, flags);
}
