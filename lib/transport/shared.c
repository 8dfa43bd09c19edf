/* shared.c - what the transports call besides their ops: the core's side (the watched
 * descriptor, the failure, the library's scratch, registrations), and what both do alike (the wake
 * eventfd, waiting on a listener, the frame header, the lost-peer error, a peer's address). */
#include <errno.h>
#include <poll.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "core/fingerprint.h"
#include "core/log.h"
#include "proto/auth.h"
#include "rdzv/client.h"
#include "transport/transport.h"
#include "util/be.h"
#include "util/netaddr.h"

/* How long a rank that saw a peer's connection close waits for the server's word that the peer
 * aborted; any other news from the server, or its connection closing, ends the wait sooner. */
#define LAST_WORDS_WAIT_S 0.1

/* ---- the core's side, for transports --------------------------------------------------------- */

hoop_result hoop__tctx_watched(hoop__tctx *ctx) {
  return hoop__rendezvous_check(ctx->comm);
}

void hoop__tctx_failure(const hoop__tctx *ctx, int *origin, const char **cause) {
  const hoop_comm *comm = ctx->comm;
  *origin = comm->fail_origin >= 0 ? comm->fail_origin : comm->rank;
  *cause = comm->fail_cause[0] ? comm->fail_cause : hoop_strerror(comm->failed);
}

void hoop__tctx_scratch(const hoop__tctx *ctx, void **ptr, size_t *bytes) {
  *ptr = ctx->comm->scratch.ptr;
  *bytes = ctx->comm->scratch.bytes;
}

void *hoop__tctx_registered(const hoop__tctx *ctx, const void *ptr, size_t len) {
  const hoop__registration *reg = hoop__registration_find(ctx->comm, ptr, len);
  return reg ? reg->transport_mem[ctx->index] : NULL;
}

/* ---- what both transports do alike ----------------------------------------------------------- */

/* The keys of the pair this rank makes with peer, computed on first use; NULL when the peer's key
 * is unusable or memory ran out (every MAC of the pair is then random, and refused). */
static const uint8_t (*pair_keys(const hoop__tctx *ctx, int peer))[HOOP__AUTH_KEY] {
  hoop__keyring *ring = ctx->keyring;
  if (!ring || !ctx->table || peer < 0 || peer >= (int)ctx->table->size || peer == ctx->rank)
    return NULL;
  if (ring->size != (int)ctx->table->size) {
    hoop__keyring_free(ring);
    ring->known = calloc(ctx->table->size, sizeof *ring->known);
    ring->keys = calloc(ctx->table->size, sizeof *ring->keys);
    if (!ring->known || !ring->keys) {
      hoop__keyring_free(ring);
      return NULL;
    }
    ring->size = (int)ctx->table->size;
  }
  if (ring->known[peer] == 0)
    ring->known[peer] = hoop__auth_pair_keys(ctx->rank < peer, ctx->key_public, ctx->key_secret,
                                             ctx->table->peers[peer].key, ring->keys[peer][0],
                                             ring->keys[peer][1]) == 0
                            ? 1
                            : -1;
  return ring->known[peer] == 1 ? ring->keys[peer] : NULL;
}

void hoop__keyring_free(hoop__keyring *ring) {
  if (ring->keys)
    hoop__auth_wipe(ring->keys, (size_t)ring->size * sizeof *ring->keys);
  free(ring->keys);
  free(ring->known);
  *ring = (hoop__keyring){0};
}

int hoop__link_mac(const hoop__tctx *ctx, const char *purpose, const char *transport, uint32_t from,
                   uint32_t to, uint32_t stream, const uint8_t *bind, size_t bind_len,
                   uint8_t out[HOOP__AUTH_PROOF]) {
  int outward = from == (uint32_t)ctx->rank;
  const uint8_t(*keys)[HOOP__AUTH_KEY] =
      outward || to == (uint32_t)ctx->rank ? pair_keys(ctx, (int)(outward ? to : from)) : NULL;
  if (!keys) {
    hoop__auth_random(out, HOOP__AUTH_PROOF);
    return -1;
  }
  uint8_t ends[16 + HOOP__WIRE_NONCE + 256];
  size_t len = 16 + HOOP__WIRE_NONCE;
  hoop__put_be32(ends, from);
  hoop__put_be32(ends + 4, to);
  hoop__put_be32(ends + 8, stream);
  hoop__put_be32(ends + 12, ctx->table ? ctx->table->generation : 0);
  memcpy(ends + 16, ctx->data_nonce, HOOP__WIRE_NONCE);
  if (bind_len > sizeof ends - len)
    bind_len = sizeof ends - len;
  if (bind_len)
    memcpy(ends + len, bind, bind_len);
  len += bind_len;
  /* A transport's name and its NUL, then the rest, keyed by the pair's key of this direction. */
  hoop__auth_proof((const char *)keys[outward ? 0 : 1], HOOP__AUTH_KEY, purpose,
                   (const uint8_t *)transport, strlen(transport) + 1, ends, len, out);
  return 0;
}

void hoop__link_tag(const hoop__tctx *ctx, const char *purpose, const char *transport,
                    uint32_t from, uint32_t to, uint32_t stream, const uint8_t *bind,
                    size_t bind_len, uint8_t *out) {
  uint8_t mac[HOOP__AUTH_PROOF];
  hoop__link_mac(ctx, purpose, transport, from, to, stream, bind, bind_len, mac);
  memcpy(out, mac, HOOP__WIRE_NONCE);
}

int hoop__link_tag_ok(const hoop__tctx *ctx, const char *purpose, const char *transport,
                      uint32_t from, uint32_t to, uint32_t stream, const uint8_t *bind,
                      size_t bind_len, const uint8_t *got) {
  uint8_t want[HOOP__WIRE_NONCE];
  hoop__link_tag(ctx, purpose, transport, from, to, stream, bind, bind_len, want);
  return hoop__auth_equal(got, want, sizeof want);
}

void hoop__link_proof(const hoop__tctx *ctx, const char *transport, uint32_t from, uint32_t to,
                      uint32_t stream, uint8_t *out) {
  hoop__link_tag(ctx, HOOP__AUTH_LINK, transport, from, to, stream, NULL, 0, out);
}

int hoop__link_proof_ok(const hoop__tctx *ctx, const char *transport, uint32_t from, uint32_t to,
                        uint32_t stream, const uint8_t *got) {
  return hoop__link_tag_ok(ctx, HOOP__AUTH_LINK, transport, from, to, stream, NULL, 0, got);
}

int hoop__wake_open(void) {
  return eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
}

void hoop__wake_signal(int fd, const char *name) {
  uint64_t one = 1;
  if (fd >= 0 && write(fd, &one, sizeof one) < 0)
    HOOP__TRACE(HOOP_SUBSYS_NET, "%s: waking the progress engine: %s", name, strerror(errno));
}

hoop_result hoop__wait_listener(hoop__tctx *ctx, int listen_fd, int wake_fd, const char *name,
                                double deadline) {
  for (;;) {
    struct pollfd pfds[3] = {{.fd = listen_fd, .events = POLLIN},
                             {.fd = wake_fd, .events = POLLIN},
                             {.fd = *ctx->watch_fd, .events = POLLIN}};
    double left = deadline - hoop__now();
    if (left <= 0)
      return HOOP_ERR_TIMEOUT;
    int ready = poll(pfds, 3, left > 0.1 ? 100 : (int)(left * 1000) + 1);
    if (ready < 0 && errno != EINTR)
      return hoop__fail(ctx->comm, HOOP_ERR_SYSTEM, "%s: poll: %s", name, strerror(errno));
    hoop_result result = HOOP_OK;
    if (ready > 0 && pfds[1].revents) {
      if ((result = hoop__wake_drain(ctx, wake_fd, name)) != HOOP_OK)
        return result;
      result = hoop__check_abort(ctx->comm);
    }
    if (result == HOOP_OK && ready > 0 && pfds[2].revents)
      result = hoop__tctx_watched(ctx);
    if (result != HOOP_OK || *ctx->failed)
      return result != HOOP_OK ? result : *ctx->failed;
    if (ready > 0 && pfds[0].revents)
      return HOOP_OK;
  }
}

hoop_result hoop__wake_drain(hoop__tctx *ctx, int fd, const char *name) {
  uint64_t count;
  if (read(fd, &count, sizeof count) < 0 && errno != EAGAIN)
    return hoop__fail(ctx->comm, HOOP_ERR_SYSTEM, "%s: reading the wake eventfd: %s", name,
                      strerror(errno));
  return HOOP_OK;
}

void hoop__frame_encode(uint8_t *out, uint32_t magic, uint32_t type, uint16_t channel, uint64_t len,
                        const uint8_t *fingerprint) {
  hoop__put_be32(out, magic);
  hoop__put_be32(out + 4, (uint32_t)channel << 16 | (type & 0xffffu));
  hoop__put_be64(out + 8, len);
  if (fingerprint)
    memcpy(out + 16, fingerprint, HOOP__FINGERPRINT_BYTES);
  else
    memset(out + 16, 0, HOOP__FINGERPRINT_BYTES);
}

uint64_t hoop__frame_length(const uint8_t *frame) {
  return hoop__get_be64(frame + 8);
}

uint32_t hoop__frame_type(const uint8_t *frame) {
  return hoop__get_be32(frame + 4) & 0xffffu;
}

uint16_t hoop__frame_channel(const uint8_t *frame) {
  return (uint16_t)(hoop__get_be32(frame + 4) >> 16);
}

hoop__fragment *hoop__frags_bind(hoop__fragment **head, hoop__fragment **tail, uint16_t channel) {
  hoop__fragment *prev = NULL;
  for (hoop__fragment *frag = *head; frag; prev = frag, frag = frag->next) {
    if (frag->owner->channel != channel)
      continue;
    if (prev) { /* to the front: it is the next to fill */
      prev->next = frag->next;
      if (*tail == frag)
        *tail = prev;
      frag->next = *head;
      *head = frag;
    }
    return frag;
  }
  return NULL;
}

hoop_result hoop__frame_check(hoop__tctx *ctx, int peer, const uint8_t *frame,
                              const hoop__transfer *req) {
  static const uint8_t unchecked[HOOP__FINGERPRINT_BYTES];
  const uint8_t *theirs = frame + 16, *ours = req->fingerprint;
  if (hoop__frame_channel(frame) != req->channel) /* binding matched them: a transport's fault */
    return hoop__fail(ctx->comm, HOOP_ERR_PROTOCOL,
                      "a message of channel %u from rank %d went to a receive of channel %u",
                      hoop__frame_channel(frame), peer, req->channel);
  /* A point-to-point message's is always compared, with a collective's too (all zeros under
   * HOOP_CHECK_CALLS=0): the two never match. */
  int compare = (memcmp(theirs, unchecked, sizeof unchecked) != 0 &&
                 memcmp(ours, unchecked, sizeof unchecked) != 0) ||
                hoop__fingerprint_is_p2p(theirs) || hoop__fingerprint_is_p2p(ours);
  if ((compare && !hoop__fingerprints_match(theirs, ours)) || hoop__frame_length(frame) != req->len)
    return hoop__mismatch(ctx->comm, peer, theirs, ours, hoop__frame_length(frame), req->len);
  return HOOP_OK;
}

hoop_result hoop__peer_failed(hoop__tctx *ctx, int peer, hoop_result code, const char *what,
                              const char *detail) {
  hoop_comm *comm = ctx->comm;
  const hoop__peer_entry *entry = &comm->table.peers[peer];
  unsigned long long seq;
  const char *call = hoop__net_call(comm, &seq);
  /* A connection closed by a peer that aborted: its reason, which it told the server first, may
   * be on its way (its notice on the connection may not have come before the close). */
  if (code == HOOP_ERR_PEER_LOST && call && !comm->failed &&
      hoop__rendezvous_abort_pending(comm, LAST_WORDS_WAIT_S)) {
    hoop_result told = hoop__rendezvous_check(comm);
    if (told != HOOP_OK)
      return told;
  }
  /* This rank is fine; the peer is the one that failed, and peers told of it should say so. */
  if (!comm->failed && comm->fail_origin < 0)
    comm->fail_origin = peer;
  return hoop__fail(comm, code, "%s (call #%llu): lost rank %d (%s, host %s): %s: %s",
                    call ? call : "hoop_init", seq, peer, entry->addr, entry->host, what, detail);
}

hoop_result hoop__peer_sockaddr(hoop__tctx *ctx, int peer, const char *name,
                                struct sockaddr_storage *addr, socklen_t *addrlen) {
  const char *text = ctx->table->peers[peer].addr;
  char host[HOOP__WIRE_MAX_ADDR + 1], err[256];
  int port;
  if (hoop__split_hostport(text, host, sizeof host, &port) != 0 ||
      hoop__resolve(host, port, addr, addrlen, err, sizeof err) != 0)
    return hoop__fail(ctx->comm, HOOP_ERR_PROTOCOL, "%s: rank %d published a bad address '%s'",
                      name, peer, text);
  return HOOP_OK;
}
