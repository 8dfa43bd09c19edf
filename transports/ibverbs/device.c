/* device.c - which RDMA device, port and address the verbs transport uses: HOOP_IB_DEV and
 * HOOP_IB_PORT, else the first active port; on RoCE the IP address in the GID at
 * HOOP_IB_GID_INDEX, else the IPv4 GID that holds the address TCP would use (HOOP_IFNAME's, or the
 * one that routes to the rendezvous server), else the first IPv4 GID; on InfiniBand the IPoIB
 * address that routes to the rendezvous server. librdmacm binds to that address, which selects the
 * device and GID. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>

#include "core/env.h"
#include "ibverbs.h"
#include "util/netaddr.h"

static hoop_result env_long(hoop__tctx *ctx, const char *name, long min, long max, long *out) {
  if (hoop__parse_int(hoop__env_get(name), min, max, out) != 0)
    return hoop__set_error(ctx->comm, HOOP_ERR_INVALID_ARG,
                           "ibverbs: %s='%s' is not a number in "
                           "%ld..%ld",
                           name, hoop__env_get(name), min, max);
  return HOOP_OK;
}

static hoop_result read_tuning(hoop__tctx *ctx, ib_state *state) {
  long slots, slot_bytes, timeout, spin_us, zcopy_min;
  hoop_result result;
  if ((result = env_long(ctx, "HOOP_IB_SLOTS", 2, 1024, &slots)) != HOOP_OK ||
      (result = env_long(ctx, "HOOP_IB_SLOT_BYTES", 4096, 64L << 20, &slot_bytes)) != HOOP_OK ||
      (result = env_long(ctx, "HOOP_IB_QP_TIMEOUT", 1, 31, &timeout)) != HOOP_OK ||
      (result = env_long(ctx, "HOOP_IB_SPIN_US", 0, 1000000, &spin_us)) != HOOP_OK ||
      (result = env_long(ctx, "HOOP_IB_ZCOPY_MIN", 0, 1L << 40, &zcopy_min)) != HOOP_OK)
    return result;
  state->slots = (int)slots;
  state->slot_bytes = (size_t)slot_bytes;
  state->qp_timeout = (int)timeout;
  state->spin_s = (double)spin_us * 1e-6;
  state->zcopy_min = (size_t)zcopy_min;
  /* Zero-copy pieces of four slots, as many in flight as the slots allow: the same bytes in
   * flight per queue pair as the copy path (soft-RoCE collapses under deep queues). */
  state->zcopy_piece = 4 * state->slot_bytes;
  state->zcopy_depth = state->slots / 4 > 0 ? state->slots / 4 : 1;
  return HOOP_OK;
}

/* ::ffff:a.b.c.d */
static int gid_is_ipv4(const union ibv_gid *gid) {
  static const uint8_t prefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  return memcmp(gid->raw, prefix, sizeof prefix) == 0;
}

static int gid_is_usable_ipv6(const union ibv_gid *gid) {
  static const uint8_t zero[16];
  return memcmp(gid->raw, zero, sizeof zero) != 0 && !(gid->raw[0] == 0xfe && gid->raw[1] == 0x80);
}

static void gid_to_sockaddr(const union ibv_gid *gid, struct sockaddr_storage *out) {
  memset(out, 0, sizeof *out);
  if (gid_is_ipv4(gid)) {
    struct sockaddr_in *in = (struct sockaddr_in *)out;
    in->sin_family = AF_INET;
    memcpy(&in->sin_addr, gid->raw + 12, 4);
  } else {
    struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)out;
    in6->sin6_family = AF_INET6;
    memcpy(&in6->sin6_addr, gid->raw, 16);
  }
}

/* The IPv4 address TCP would listen on (HOOP_IFNAME's, or the route to the rendezvous server);
 * 0 if there is none. */
static int tcp_ipv4(const hoop__tctx *ctx, const struct sockaddr *toward, struct in_addr *out) {
  struct sockaddr_storage local;
  socklen_t len;
  char chosen[64], err[256];
  if (hoop__choose_local_addr(ctx->ifname, toward, &local, &len, chosen, sizeof chosen, err,
                              sizeof err) != 0 ||
      local.ss_family != AF_INET)
    return 0;
  *out = ((const struct sockaddr_in *)&local)->sin_addr;
  return 1;
}

/* RoCE: the address comes from a GID, which is what selects the GID librdmacm uses. A host may
 * hold IPv4 GIDs on several subnets; the one on the interface TCP would use reaches the peers
 * that the rendezvous found, so it comes first. */
static hoop_result roce_address(hoop__tctx *ctx, ib_state *state, struct ibv_context *context,
                                const struct ibv_port_attr *attr, const struct sockaddr *toward) {
  long wanted = -1;
  if (hoop__env_is_set("HOOP_IB_GID_INDEX") &&
      env_long(ctx, "HOOP_IB_GID_INDEX", 0, attr->gid_tbl_len - 1, &wanted) != HOOP_OK)
    return HOOP_ERR_INVALID_ARG;
  struct in_addr preferred;
  char text[INET_ADDRSTRLEN] = "";
  int have_preferred = wanted < 0 && tcp_ipv4(ctx, toward, &preferred);
  if (have_preferred)
    inet_ntop(AF_INET, &preferred, text, sizeof text);
  int fallback = -1, first_ipv4 = -1;
  for (int index = 0; index < attr->gid_tbl_len; index++) {
    if (wanted >= 0 && index != wanted)
      continue;
    union ibv_gid gid;
    if (ibv_query_gid(context, (uint8_t)state->port, index, &gid) != 0) {
      if (wanted >= 0)
        return hoop__set_error(ctx->comm, HOOP_ERR_SYSTEM,
                               "ibverbs: ibv_query_gid(%s port %d index "
                               "%d): %s",
                               state->device, state->port, index, strerror(errno));
      continue;
    }
    if (wanted >= 0 && (gid_is_ipv4(&gid) || gid_is_usable_ipv6(&gid))) {
      gid_to_sockaddr(&gid, &state->bind_addr);
      return HOOP_OK;
    }
    if (gid_is_ipv4(&gid) && have_preferred && memcmp(gid.raw + 12, &preferred, 4) == 0) {
      gid_to_sockaddr(&gid, &state->bind_addr);
      HOOP__INFO(HOOP_SUBSYS_NET, "ibverbs: %s port %d GID %d holds %s, the address TCP would use",
                 state->device, state->port, index, text);
      return HOOP_OK;
    }
    if (gid_is_ipv4(&gid) && first_ipv4 < 0) {
      first_ipv4 = index;
      gid_to_sockaddr(&gid, &state->bind_addr);
    }
    if (fallback < 0 && first_ipv4 < 0 && gid_is_usable_ipv6(&gid)) {
      fallback = index;
      gid_to_sockaddr(&gid, &state->bind_addr);
    }
  }
  if (first_ipv4 >= 0 && have_preferred)
    HOOP__INFO(HOOP_SUBSYS_NET,
               "ibverbs: no GID of %s port %d holds %s (the address TCP would "
               "use); using GID %d",
               state->device, state->port, text, first_ipv4);
  if (first_ipv4 >= 0 || fallback >= 0)
    return HOOP_OK;
  if (wanted >= 0)
    return hoop__set_error(ctx->comm, HOOP_ERR_UNSUPPORTED,
                           "ibverbs: GID %ld of %s port %d holds no "
                           "IP address (HOOP_IB_GID_INDEX)",
                           wanted, state->device, state->port);
  return hoop__set_error(ctx->comm, HOOP_ERR_UNSUPPORTED,
                         "ibverbs: %s port %d has no GID with an IP "
                         "address (is its network interface up with an address?)",
                         state->device, state->port);
}

/* The first active port of device (or HOOP_IB_PORT's), with its attributes; 0 if none. */
static int active_port(struct ibv_context *context, long only_port, struct ibv_port_attr *attr) {
  struct ibv_device_attr device_attr;
  if (ibv_query_device(context, &device_attr) != 0)
    return 0;
  for (int port = 1; port <= device_attr.phys_port_cnt; port++) {
    if (only_port > 0 && port != only_port)
      continue;
    if (ibv_query_port(context, (uint8_t)port, attr) == 0 && attr->state == IBV_PORT_ACTIVE)
      return port;
  }
  return 0;
}

hoop_result hoop__ib_choose_device(hoop__tctx *ctx, ib_state *state,
                                   const struct sockaddr *toward) {
  hoop_result result = read_tuning(ctx, state);
  if (result != HOOP_OK)
    return result;
  long only_port = 0;
  if (hoop__env_is_set("HOOP_IB_PORT") &&
      (result = env_long(ctx, "HOOP_IB_PORT", 1, 255, &only_port)) != HOOP_OK)
    return result;
  const char *only_device = hoop__env_get("HOOP_IB_DEV");
  int count = 0;
  struct ibv_device **devices = ibv_get_device_list(&count);
  if (!devices)
    return hoop__set_error(ctx->comm, HOOP_ERR_UNSUPPORTED, "ibverbs: no RDMA devices (%s)",
                           strerror(errno));
  result = HOOP_ERR_UNSUPPORTED;
  int seen = 0, described = 0;
  for (int i = 0; i < count && result == HOOP_ERR_UNSUPPORTED; i++) {
    const char *name = ibv_get_device_name(devices[i]);
    if (only_device[0] && strcmp(name, only_device) != 0)
      continue;
    seen++;
    struct ibv_context *context = ibv_open_device(devices[i]);
    if (!context) {
      HOOP__INFO(HOOP_SUBSYS_NET, "ibverbs: cannot open %s: %s", name, strerror(errno));
      continue;
    }
    struct ibv_port_attr attr;
    int port = active_port(context, only_port, &attr);
    if (port > 0) {
      snprintf(state->device, sizeof state->device, "%s", name);
      state->port = port;
      described = 1;
      if (attr.link_layer == IBV_LINK_LAYER_ETHERNET) {
        result = roce_address(ctx, state, context, &attr, toward);
      } else {
        socklen_t len;
        char chosen[64], err[256];
        result = hoop__choose_local_addr(ctx->ifname, toward, &state->bind_addr, &len, chosen,
                                         sizeof chosen, err, sizeof err) == 0
                     ? HOOP_OK
                     : hoop__set_error(ctx->comm, HOOP_ERR_UNSUPPORTED,
                                       "ibverbs: no IPoIB address for %s: %s", name, err);
      }
    }
    if (ibv_close_device(context) != 0)
      HOOP__INFO(HOOP_SUBSYS_NET, "ibverbs: closing %s: %s", name, strerror(errno));
  }
  ibv_free_device_list(devices);
  if (result == HOOP_ERR_UNSUPPORTED && !described) {
    if (only_device[0] && !seen)
      hoop__set_error(ctx->comm, HOOP_ERR_UNSUPPORTED,
                      "ibverbs: no device named '%s' (HOOP_IB_DEV)", only_device);
    else
      hoop__set_error(ctx->comm, HOOP_ERR_UNSUPPORTED, "ibverbs: no active port on %s%s%s",
                      only_device[0] ? only_device
                      : count        ? "any device"
                                     : "any device (none found)",
                      only_port ? " with HOOP_IB_PORT=" : "",
                      only_port ? hoop__env_get("HOOP_IB_PORT") : "");
  }
  return result;
}
