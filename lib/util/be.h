/* be.h - big-endian fields in byte buffers, the one byte order of every hoop wire: the rendezvous
 * messages, the transports' frame and handshake headers, the call fingerprints (unaligned-safe:
 * bytes, not casts). */
#ifndef HOOP__BE_H
#define HOOP__BE_H

#include <stdint.h>

static inline void hoop__put_be16(uint8_t *out, uint16_t value) {
  out[0] = (uint8_t)(value >> 8);
  out[1] = (uint8_t)value;
}

static inline void hoop__put_be32(uint8_t *out, uint32_t value) {
  for (int i = 3; i >= 0; i--, value >>= 8)
    out[i] = (uint8_t)value;
}

static inline void hoop__put_be64(uint8_t *out, uint64_t value) {
  for (int i = 7; i >= 0; i--, value >>= 8)
    out[i] = (uint8_t)value;
}

static inline uint16_t hoop__get_be16(const uint8_t *in) {
  return (uint16_t)(in[0] << 8 | in[1]);
}

static inline uint32_t hoop__get_be32(const uint8_t *in) {
  return (uint32_t)in[0] << 24 | (uint32_t)in[1] << 16 | (uint32_t)in[2] << 8 | in[3];
}

static inline uint64_t hoop__get_be64(const uint8_t *in) {
  return (uint64_t)hoop__get_be32(in) << 32 | hoop__get_be32(in + 4);
}

#endif /* HOOP__BE_H */
