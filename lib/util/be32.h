/* be32.h - 32-bit big-endian fields in byte buffers, for the transports' frame and handshake
 * headers (unaligned-safe: memcpy, not casts). */
#ifndef HOOP_BE32_H
#define HOOP_BE32_H

#include <arpa/inet.h>
#include <stdint.h>
#include <string.h>

static inline void hoop__put_be32(uint8_t *out, uint32_t value) {
  value = htonl(value);
  memcpy(out, &value, 4);
}

static inline uint32_t hoop__get_be32(const uint8_t *in) {
  uint32_t value;
  memcpy(&value, in, 4);
  return ntohl(value);
}

#endif /* HOOP_BE32_H */
