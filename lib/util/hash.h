/* hash.h - FNV-1a, the one string hash of the tree: a job's port (comm/launchers.c), a call's name
 * tag (core/fingerprint.c), the addresses of a full rendezvous server (rdzv/conn.c). Not for
 * anything an attacker must not collide on purpose. */
#ifndef HOOP__HASH_H
#define HOOP__HASH_H

#include <stdint.h>

static inline uint32_t hoop__fnv1a(const char *text) {
  uint32_t h = 2166136261u;
  for (const unsigned char *p = (const unsigned char *)text; *p; p++)
    h = (h ^ *p) * 16777619u;
  return h;
}

#endif /* HOOP__HASH_H */
