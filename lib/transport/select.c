/* select.c - choosing a transport for each peer: the transports of this build in priority order,
 * each listening under HOOP_TRANSPORT, the choice agreed from the rank table, and the calls made
 * on every chosen transport (connect, shutdown, wake, finalize). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "core/log.h"
#include "transport/state.h"
#include "transport/transport.h"

/* ---- choosing transports --------------------------------------------------------------------- */

static const char *const transport_names =
#ifdef HOOP_HAVE_VERBS
    "auto, shm, tcp, ibverbs";
#else
    "auto, shm, tcp";
#endif

/* Every transport of this build, in priority order: shared memory for the peers on this host,
 * then verbs, then TCP. */
static const hoop__transport_ops *const all_transports[] = {
    &hoop__shm_transport,
#ifdef HOOP_HAVE_VERBS
    &hoop__ibverbs_transport,
#endif
    &hoop__tcp_transport,
};
#define ALL_TRANSPORTS (sizeof all_transports / sizeof all_transports[0])

hoop_result hoop__transport_check(hoop_comm *comm, const char *mode) {
  if (strcmp(mode, "auto") == 0)
    return HOOP_OK;
  for (size_t i = 0; i < ALL_TRANSPORTS; i++)
    if (strcmp(mode, all_transports[i]->name) == 0)
      return HOOP_OK;
  return hoop__set_error(
      comm, strcmp(mode, "ibverbs") == 0 ? HOOP_ERR_UNSUPPORTED : HOOP_ERR_INVALID_ARG,
      "hoop_init: transport '%s' is not available (this build has: %s)", mode, transport_names);
}

/* The transport of this build whose entries an address entry is: the one whose prefix it starts
 * with, else the one without a prefix. */
static const hoop__transport_ops *entry_owner(const char *entry) {
  const hoop__transport_ops *plain = NULL;
  for (size_t i = 0; i < ALL_TRANSPORTS; i++) {
    const char *prefix = all_transports[i]->addr_prefix;
    if (!prefix[0])
      plain = all_transports[i];
    else if (strncmp(entry, prefix, strlen(prefix)) == 0)
      return all_transports[i];
  }
  return plain;
}

/* ops's entry in a published address, copied to out without its prefix; 0 if found. */
static int find_entry(const char *addr, const hoop__transport_ops *ops, char *out, size_t outlen) {
  while (*addr) {
    size_t len = strcspn(addr, " ");
    if (len > 0) {
      char entry[HOOP__WIRE_MAX_ADDR + 1];
      snprintf(entry, sizeof entry, "%.*s", (int)len, addr);
      if (entry_owner(entry) == ops) {
        size_t skip = strlen(ops->addr_prefix);
        snprintf(out, outlen, "%s", entry + skip);
        return 0;
      }
    }
    addr += len;
    addr += strspn(addr, " ");
  }
  return -1;
}

int hoop__tctx_offered(const hoop__tctx *ctx, int rank) {
  char entry[HOOP__WIRE_MAX_ADDR + 1];
  return hoop__tctx_entry(ctx, rank, entry, sizeof entry) == 0;
}

int hoop__tctx_entry(const hoop__tctx *ctx, int rank, char *out, size_t outlen) {
  return find_entry(ctx->table->peers[rank].addr, ctx->ops, out, outlen);
}

hoop_result hoop__transport_listen(hoop_comm *comm, const char *mode, const struct sockaddr *toward,
                                   char *addr, size_t addrlen) {
  int is_auto = strcmp(mode, "auto") == 0;
  comm->transport->transports = calloc(HOOP__MAX_TRANSPORTS, sizeof *comm->transport->transports);
  if (!comm->transport->transports)
    return hoop__set_error(comm, HOOP_ERR_SYSTEM, "hoop_init: out of memory");
  addr[0] = '\0';
  for (size_t i = 0; i < ALL_TRANSPORTS && comm->transport->ntransports < HOOP__MAX_TRANSPORTS;
       i++) {
    const hoop__transport_ops *ops = all_transports[i];
    if (!is_auto && strcmp(mode, ops->name) != 0)
      continue;
    hoop__tctx *ctx = &comm->transport->transports[comm->transport->ntransports];
    *ctx = (hoop__tctx){.comm = comm,
                        .ops = ops,
                        .index = comm->transport->ntransports,
                        .rank = comm->rank,
                        .size = comm->size,
                        .table = &comm->table,
                        .timeout_s = comm->timeout_s,
                        .ifname = comm->ifname,
                        .tcp_streams = comm->tcp_streams,
                        .encrypt = comm->encrypt,
                        .data_nonce = comm->data_nonce,
                        .key_public = comm->key_public,
                        .key_secret = comm->key_secret,
                        .keyring = &comm->transport->keyring,
                        .failed = &comm->failed,
                        .kernel_ranks = &comm->kernel_ranks,
                        .watch_fd = &comm->rdzv_fd,
                        .multiplexed = &comm->multiplexed};
    char entry[HOOP__WIRE_MAX_ADDR + 1];
    hoop_result result = ops->listen(ctx, toward, entry, sizeof entry);
    /* Under auto, one transport must work; the others are left out if they cannot (see
     * hoop__auto_role). */
    if (result != HOOP_OK && is_auto && ops->auto_role != HOOP__AUTO_MUST &&
        (ops->auto_role == HOOP__AUTO_IF_USABLE || result != HOOP_ERR_INVALID_ARG)) {
      HOOP__INFO(HOOP_SUBSYS_NET, "HOOP_TRANSPORT=auto: %s is not usable here (%s)", ops->name,
                 comm->last_error);
      comm->last_error[0] = '\0';
      ops->finalize(ctx);
      continue;
    }
    comm->transport->ntransports++;
    if (result != HOOP_OK)
      return result;
    size_t used = strlen(addr);
    if (used + 1 + strlen(ops->addr_prefix) + strlen(entry) >= addrlen)
      return hoop__set_error(comm, HOOP_ERR_SYSTEM,
                             "hoop_init: transport addresses longer than %zu bytes", addrlen - 1);
    snprintf(addr + used, addrlen - used, "%s%s%s", used ? " " : "", ops->addr_prefix, entry);
  }
  return HOOP_OK;
}

/* The first of this rank's transports that peer offered too and that can reach it; -1 if none. */
static int choose_for(hoop_comm *comm, int peer) {
  for (int t = 0; t < comm->transport->ntransports; t++) {
    hoop__tctx *ctx = &comm->transport->transports[t];
    if (hoop__tctx_offered(ctx, peer) && (!ctx->ops->can_reach || ctx->ops->can_reach(ctx, peer)))
      return t;
  }
  return -1;
}

/* Under auto, say what was chosen and why; before agree keeps only the chosen entries. */
static void log_choice(const hoop_comm *comm, const int *served) {
  if (strcmp(comm->transport_mode, "auto") != 0)
    return;
  const hoop__tctx *only = NULL;
  int serving = 0;
  char list[256] = "";
  size_t used = 0;
  for (int t = 0; t < comm->transport->ntransports; t++) {
    const hoop__tctx *ctx = &comm->transport->transports[t];
    if (served[t] > 0) {
      serving++;
      only = ctx;
      if (used < sizeof list)
        used += (size_t)snprintf(list + used, sizeof list - used, "%s%s for %d peer%s",
                                 used ? ", " : "", ctx->ops->name, served[t],
                                 served[t] == 1 ? "" : "s");
    }
  }
  if (serving > 1) {
    HOOP__INFO(HOOP_SUBSYS_NET, "HOOP_TRANSPORT=auto: using several transports, by peer: %s", list);
    return;
  }
  if (!only)
    return;
  if (only->ops->auto_alone) {
    HOOP__INFO(HOOP_SUBSYS_NET, "HOOP_TRANSPORT=auto: using %s (%s)", only->ops->name,
               only->ops->auto_alone);
    return;
  }
  /* The transport every pair falls back on: why not one that would say why it is absent. A rank
   * that did not offer it, where it listens here; else its own reason. */
  for (int t = 0; t < comm->transport->ntransports; t++) {
    const hoop__tctx *ctx = &comm->transport->transports[t];
    for (int r = 0; ctx->ops->auto_absent && r < comm->size; r++)
      if (!hoop__tctx_offered(ctx, r)) {
        HOOP__INFO(HOOP_SUBSYS_NET,
                   "HOOP_TRANSPORT=auto: using %s (rank %d offered no %s address: '%s')",
                   only->ops->name, r, ctx->ops->name, comm->table.peers[r].addr);
        return;
      }
  }
  for (size_t i = 0; i < ALL_TRANSPORTS; i++)
    if (all_transports[i]->auto_absent) {
      HOOP__INFO(HOOP_SUBSYS_NET, "HOOP_TRANSPORT=auto: using %s (%s)", only->ops->name,
                 all_transports[i]->auto_absent);
      return;
    }
  HOOP__INFO(HOOP_SUBSYS_NET,
             "HOOP_TRANSPORT=auto: using %s (no other transport serves these peers)",
             only->ops->name);
}

/* The failure hook (core/error.c): every transport drops its connections, telling its peers. */
static void fail_hook(hoop_comm *comm) {
  if (comm->transport->peer_transport) {
    hoop__net_enter(comm);
    hoop__transports_shutdown(comm);
    hoop__net_leave(comm);
  }
}

hoop_result hoop__transport_agree(hoop_comm *comm) {
  comm->transport->peer_transport =
      calloc((size_t)comm->size, sizeof *comm->transport->peer_transport);
  size_t n = (size_t)comm->size;
  comm->transport->peer_wait_ns = calloc(n, sizeof *comm->transport->peer_wait_ns);
  comm->transport->peer_sent = calloc(n, sizeof *comm->transport->peer_sent);
  comm->transport->peer_received = calloc(n, sizeof *comm->transport->peer_received);
  comm->transport->link_bytes = calloc(n, sizeof *comm->transport->link_bytes);
  comm->transport->link_ns = calloc(n, sizeof *comm->transport->link_ns);
  if (!comm->transport->peer_transport || !comm->transport->peer_wait_ns ||
      !comm->transport->peer_sent || !comm->transport->peer_received ||
      !comm->transport->link_bytes || !comm->transport->link_ns)
    return hoop__set_error(comm, HOOP_ERR_SYSTEM, "hoop_init: out of memory");
  hoop__hook_register(comm, HOOP__HOOK_FAIL, fail_hook);
  hoop__hook_register(comm, HOOP__HOOK_WAKE, hoop__transports_wake);
  /* A shrunken job's transports listened before its size was known (comm/shrink.c). */
  for (int t = 0; t < comm->transport->ntransports; t++) {
    comm->transport->transports[t].rank = comm->rank;
    comm->transport->transports[t].size = comm->size;
    comm->transport->transports[t].local_size = (int)comm->table.peers[comm->rank].local_size;
  }
  int served[HOOP__MAX_TRANSPORTS] = {0};
  for (int r = 0; r < comm->size; r++) {
    if (r == comm->rank)
      continue;
    int t = choose_for(comm, r);
    if (t < 0)
      return hoop__set_error(comm, HOOP_ERR_INVALID_ARG,
                             "hoop_init: no transport that every rank offers: this rank "
                             "(HOOP_TRANSPORT=%s) offers '%s' but rank %d offers '%s'; set the "
                             "same HOOP_TRANSPORT on every rank",
                             comm->transport_mode, comm->table.peers[comm->rank].addr, r,
                             comm->table.peers[r].addr);
    comm->transport->peer_transport[r] = (uint8_t)t;
    served[t]++;
  }
  log_choice(comm, served);
  /* Containers of one machine, or bench/netns-sweep's hosts, name other hosts yet share this
   * kernel's CPUs (hoop__host_oversubscribed). */
  comm->kernel_ranks = 0;
  for (int t = 0; t < comm->transport->ntransports && !comm->kernel_ranks; t++)
    if (comm->transport->transports[t].state && comm->transport->transports[t].ops->kernel_ranks)
      comm->kernel_ranks =
          comm->transport->transports[t].ops->kernel_ranks(&comm->transport->transports[t]);
  /* This rank's own entry names the transport of the first pair (it is only logged). */
  comm->transport->peer_transport[comm->rank] =
      comm->size > 1 ? comm->transport->peer_transport[(comm->rank + 1) % comm->size] : 0;
  for (int r = 0; r < comm->size; r++) {
    char entry[HOOP__WIRE_MAX_ADDR + 1] = "";
    find_entry(comm->table.peers[r].addr,
               comm->transport->transports[comm->transport->peer_transport[r]].ops, entry,
               sizeof entry);
    snprintf(comm->table.peers[r].addr, sizeof comm->table.peers[r].addr, "%s", entry);
  }
  comm->transport->ntransports_serving = 0;
  comm->transport->sleep_shared = 1;
  comm->transport->spin_s = -1;
  for (int t = 0; t < comm->transport->ntransports; t++) {
    hoop__tctx *ctx = &comm->transport->transports[t];
    if (!served[t]) {
      ctx->ops->finalize(ctx);
      continue;
    }
    comm->transport->ntransports_serving++;
    if (!ctx->ops->sleep_prepare || !ctx->ops->sleep_done)
      comm->transport->sleep_shared = 0;
  }
  return HOOP_OK;
}

const char *hoop__transport_names(const hoop_comm *comm, char *out, size_t outlen) {
  size_t used = 0;
  out[0] = '\0';
  for (int t = 0; t < comm->transport->ntransports && used < outlen; t++)
    if (comm->transport->transports[t].state)
      used += (size_t)snprintf(out + used, outlen - used, "%s%s", used ? "+" : "",
                               comm->transport->transports[t].ops->name);
  if (!out[0])
    snprintf(out, outlen, "(none)");
  return out;
}

const char *hoop__transports_serving(const hoop_comm *comm, char *out, size_t len) {
  size_t used = 0;
  out[0] = '\0';
  for (int t = 0; t < comm->transport->ntransports; t++) {
    int serves = 0;
    for (int peer = 0; peer < comm->size && comm->transport->peer_transport; peer++)
      if (peer != comm->rank && comm->transport->peer_transport[peer] == t)
        serves = 1;
    if (serves && used < len)
      used += (size_t)snprintf(out + used, len - used, "%s%s", used ? "+" : "",
                               comm->transport->transports[t].ops->name);
  }
  if (!out[0])
    snprintf(out, len, "none");
  return out;
}

hoop_result hoop__transport_connect(hoop_comm *comm, int peer) {
  hoop__tctx *ctx = hoop__transport_of(comm, peer);
  /* After a failure the transports are shut down: a pair is no longer made (an earlier step of
   * the call may have completed while the failure came in, and the caller goes on to this). */
  if (*ctx->failed)
    return *ctx->failed;
  return ctx->ops->connect(ctx, peer);
}

void hoop__transports_shutdown(hoop_comm *comm) {
  for (int t = 0; t < comm->transport->ntransports; t++)
    if (comm->transport->transports[t].state)
      comm->transport->transports[t].ops->shutdown(&comm->transport->transports[t]);
}

void hoop__transports_wake(hoop_comm *comm) {
  for (int t = 0; t < comm->transport->ntransports; t++)
    if (comm->transport->transports[t].state && comm->transport->transports[t].ops->wake)
      comm->transport->transports[t].ops->wake(&comm->transport->transports[t]);
}

void hoop__transports_forget_mem(hoop_comm *comm, const void *ptr, size_t bytes) {
  hoop__net_enter(comm);
  for (int t = 0; t < comm->transport->ntransports; t++)
    if (comm->transport->transports[t].state && comm->transport->transports[t].ops->forget_mem)
      comm->transport->transports[t].ops->forget_mem(&comm->transport->transports[t], ptr, bytes);
  hoop__net_leave(comm);
}

void hoop__transport_finalize(hoop_comm *comm) {
  for (int t = 0; t < comm->transport->ntransports; t++)
    if (comm->transport->transports[t].state)
      comm->transport->transports[t].ops->finalize(&comm->transport->transports[t]);
  free(comm->transport->transports);
  free(comm->transport->peer_transport);
  free(comm->transport->sleep_fds);
  comm->transport->sleep_fds = NULL;
  comm->transport->sleep_cap = 0;
  comm->transport->transports = NULL;
  comm->transport->peer_transport = NULL;
  comm->transport->ntransports = 0;
  hoop__keyring_free(&comm->transport->keyring);
}

/* ---- the layer's state, as the other layers see it ------------------------------------------- */

hoop__transport_state *hoop__transport_state_new(void) {
  return calloc(1, sizeof(hoop__transport_state));
}

void hoop__transport_state_free(hoop_comm *comm) {
  if (!comm->transport)
    return;
  free(comm->transport->peer_transport);
  free(comm->transport->peer_wait_ns);
  free(comm->transport->peer_sent);
  free(comm->transport->peer_received);
  free(comm->transport->link_bytes);
  free(comm->transport->link_ns);
  free(comm->transport->sleep_fds);
  free(comm->transport);
  comm->transport = NULL;
}

hoop_result hoop__transport_view(hoop_comm *view, const hoop_comm *net) {
  hoop__transport_state *mine = view->transport, *nets = net->transport;
  mine->spin_s = -1;
  mine->peer_transport = calloc((size_t)view->size, sizeof *mine->peer_transport);
  if (!mine->peer_transport)
    return HOOP_ERR_SYSTEM;
  for (int i = 0; i < view->size && nets->peer_transport; i++)
    if (i != view->rank)
      mine->peer_transport[i] = nets->peer_transport[view->net_rank_of[i]];
  return HOOP_OK;
}

void hoop__transport_view_join(hoop_comm *view, const hoop_comm *net) {
  view->transport->transports = net->transport->transports;
  view->transport->ntransports = net->transport->ntransports;
  view->transport->ntransports_serving = net->transport->ntransports_serving;
  view->transport->sleep_shared = net->transport->sleep_shared;
}

hoop__tctx *hoop__transport_of(const hoop_comm *comm, int peer) {
  return &comm->transport->transports[comm->transport->peer_transport[peer]];
}

int hoop__transport_count(const hoop_comm *comm) {
  return comm->transport->ntransports;
}

hoop__tctx *hoop__transport_at(const hoop_comm *comm, int t) {
  return &comm->transport->transports[t];
}

int hoop__transport_of_peer(const hoop_comm *comm, int peer) {
  return comm->transport->peer_transport[peer];
}

void hoop__transport_peer_tally(const hoop_comm *comm, int net_peer, hoop__peer_tally *out) {
  const hoop__transport_state *nets = comm->net->transport;
  memset(out, 0, sizeof *out);
  if (!nets->peer_wait_ns)
    return;
  out->wait_ns = atomic_load_explicit(&nets->peer_wait_ns[net_peer], memory_order_relaxed);
  out->sent = atomic_load_explicit(&nets->peer_sent[net_peer], memory_order_relaxed);
  out->received = atomic_load_explicit(&nets->peer_received[net_peer], memory_order_relaxed);
  out->link_bytes = atomic_load_explicit(&nets->link_bytes[net_peer], memory_order_relaxed);
  out->link_ns = atomic_load_explicit(&nets->link_ns[net_peer], memory_order_relaxed);
}

void hoop__tctx_link_time(hoop__tctx *ctx, int peer, size_t bytes, double seconds) {
  hoop__transport_state *mine = ctx->comm->transport;
  if (!mine->link_bytes || seconds <= 0)
    return;
  _Atomic uint64_t *b = &mine->link_bytes[peer], *ns = &mine->link_ns[peer];
  atomic_store_explicit(b, atomic_load_explicit(b, memory_order_relaxed) + bytes,
                        memory_order_relaxed);
  atomic_store_explicit(ns,
                        atomic_load_explicit(ns, memory_order_relaxed) + (uint64_t)(seconds * 1e9),
                        memory_order_relaxed);
}

int hoop__transports_up(const hoop_comm *comm) {
  return comm->transport->peer_transport != NULL;
}

hoop__board *hoop__transport_board(const hoop_comm *comm) {
  return comm->transport->board;
}

void hoop__transport_set_board(hoop_comm *comm, hoop__board *board) {
  comm->transport->board = board;
}
