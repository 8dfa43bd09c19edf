/* error.c - the ground floor every layer calls down to: a call's error message, the failure that
 * leaves a communicator unusable, an abort carried out, a peer's notice of its failure. Failure
 * reaches the layers above through hooks they register (the transports drop their connections;
 * the rendezvous connection tells the server of an abort), so that nothing here calls up. */
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "core/internal.h"

void hoop__hook_register(hoop_comm *comm, hoop__hook_kind kind, hoop__hook_fn fn) {
  for (int i = 0; i < HOOP__HOOKS_MAX; i++) {
    if (comm->hooks[kind][i] == fn)
      return;
    if (!comm->hooks[kind][i]) {
      comm->hooks[kind][i] = fn;
      return;
    }
  }
}

static void run_hooks(hoop_comm *comm, hoop__hook_kind kind) {
  for (int i = 0; i < HOOP__HOOKS_MAX && comm->hooks[kind][i]; i++)
    comm->hooks[kind][i](comm);
}

/* ---- errors and clocks --------------------------------------------------------------------- */

/* The words of the last failure this thread was told of by another (a request it waited for or
 * tested, its blocking call run by the progress thread): hoop_last_error shows them rather than
 * comm->last_error, which that thread may have overwritten since with a later call's. A failure
 * this thread records itself replaces them. */
static _Thread_local struct {
  const hoop_comm *comm;
  char text[1024];
} told;

void hoop__error_told(const hoop_comm *comm, const char *text) {
  told.comm = comm;
  snprintf(told.text, sizeof told.text, "%s", text);
}

const char *hoop__error_for_caller(const hoop_comm *comm) {
  return told.comm == comm ? told.text : comm->last_error;
}

static hoop_result record(hoop_comm *comm, hoop_result code, const char *fmt, va_list ap) {
  if (!comm)
    return code;
  if (told.comm == comm)
    told.comm = NULL;
  vsnprintf(comm->last_error, sizeof comm->last_error, fmt, ap);
  HOOP__INFO(HOOP_SUBSYS_ALL, "%s: %s", hoop_strerror(code), comm->last_error);
  return code;
}

hoop_result hoop__set_error(hoop_comm *comm, hoop_result code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  record(comm, code, fmt, ap);
  va_end(ap);
  return code;
}

/* From now on every call on comm is refused with the last error recorded. The code goes last,
 * with release: a view of this net that reads it in another thread without the net's lock
 * (hoop__net_failed) then reads the words and origin whole. */
static void mark_failed(hoop_comm *comm, hoop_result code) {
  memcpy(comm->fail_reason, comm->last_error, sizeof comm->fail_reason);
  /* A failure of this rank's own (not a peer's notice): peers are told it started here. */
  if (!comm->fail_cause[0]) {
    if (comm->fail_origin < 0)
      comm->fail_origin = comm->rank;
    memcpy(comm->fail_cause, comm->last_error, sizeof comm->fail_cause);
  }
  __atomic_store_n(&comm->failed, code, __ATOMIC_RELEASE);
}

hoop_result hoop__fail(hoop_comm *comm, hoop_result code, const char *fmt, ...) {
  /* Once failed, what goes wrong next (connections closing after the shutdown) is a consequence:
   * the first story stays in hoop_last_error, or the call that failed would report the echo. */
  if (comm && comm->failed) {
    if (hoop__log_enabled(HOOP_LOG_TRACE, HOOP_SUBSYS_ALL)) {
      char echo[256];
      va_list ap;
      va_start(ap, fmt);
      vsnprintf(echo, sizeof echo, fmt, ap);
      va_end(ap);
      HOOP__TRACE(HOOP_SUBSYS_ALL, "after the failure: %s", echo);
    }
    return code;
  }
  va_list ap;
  va_start(ap, fmt);
  record(comm, code, fmt, ap);
  va_end(ap);
  if (comm) {
    mark_failed(comm, code);
    HOOP__WARN(HOOP_SUBSYS_ALL, "%s", comm->last_error);
    run_hooks(comm, HOOP__HOOK_FAIL);
    /* A sub-communicator's failure is its net's: the connections it shares go down, telling the
     * peers, which would otherwise wait for what this rank never sends. */
    if (comm->net && comm->net != comm) {
      hoop__net_enter(comm);
      hoop__fail(comm->net, code, "%s", comm->last_error);
      hoop__net_leave(comm);
    }
  }
  return code;
}

hoop_result hoop__fail_as_recorded(hoop_comm *comm, hoop_result code) {
  if (!comm->failed) {
    char message[sizeof comm->last_error];
    memcpy(message, comm->last_error, sizeof message);
    hoop__fail(comm, code, "%s", message);
  }
  return code;
}

hoop_result hoop__refuse_failed(hoop_comm *comm, const char *call) {
  return hoop__set_error(comm,
                         comm->failed == HOOP_ERR_ABORTED ? HOOP_ERR_ABORTED : HOOP_ERR_FAILED,
                         "%s refused: the communicator failed earlier: %s", call,
                         comm->fail_reason[0] ? comm->fail_reason : hoop_strerror(comm->failed));
}

hoop_result hoop__retire(hoop_comm *comm, hoop_result code, const char *fmt, ...) {
  if (comm->failed)
    return comm->failed;
  /* Not failed yet, the transports say goodbye (as at finalize), after what this rank sent. */
  run_hooks(comm, HOOP__HOOK_FAIL);
  va_list ap;
  va_start(ap, fmt);
  record(comm, code, fmt, ap);
  va_end(ap);
  mark_failed(comm, code);
  return code;
}

hoop_result hoop__check_abort(hoop_comm *comm) {
  if (atomic_load(&comm->abort_requested) != 1) /* -1: the reason is being written */
    return HOOP_OK;
  if (!atomic_exchange(&comm->abort_done, 1)) {
    /* The rendezvous connection and the transports are net's, which views' threads drive. */
    hoop__net_enter(comm);
    /* The server first: it reaches every rank even when this rank's data connections are stuck
     * behind a stopped peer, which the notices on them below may wait for. */
    run_hooks(comm, HOOP__HOOK_ABORT);
    hoop__fail(comm, HOOP_ERR_ABORTED, "aborted by rank %d: %s", comm->rank, comm->abort_reason);
    hoop__net_leave(comm);
  }
  return HOOP_ERR_ABORTED;
}

hoop_result hoop__peer_notice(hoop_comm *comm, int peer, hoop_result code, int origin,
                              const char *text) {
  if (comm->failed)
    return comm->failed;
  /* Fields from the wire: a code outside the known failures is a protocol error, never "OK". */
  if (code < HOOP_ERR_INVALID_ARG || code > HOOP_ERR_FAILED)
    code = HOOP_ERR_PROTOCOL;
  if (origin < 0 || origin >= comm->size)
    origin = peer;
  comm->fail_origin = origin;
  /* A connection reset as the peer closed it can cut its notice's words off (TCP drops what was
   * not yet read): say so rather than nothing. */
  char cut[160];
  if (!text[0]) {
    snprintf(cut, sizeof cut, "rank %d failed: %s (told by rank %d, whose message did not arrive)",
             origin, hoop_strerror(code), peer);
    text = cut;
  }
  snprintf(comm->fail_cause, sizeof comm->fail_cause, "%s", text);
  /* An abort and a mismatch name their origin in their own words; both sides of a mismatch get
   * the same code. Anything else happened to someone else: say so, and who. */
  if (code == HOOP_ERR_ABORTED || code == HOOP_ERR_MISMATCH)
    return hoop__fail(comm, code, "%s", text);
  unsigned long long seq;
  const char *call = hoop__net_call(comm, &seq);
  /* A peer that gave up waiting for this rank while this rank waited for another (a chain of
   * waits that all reach the timeout at once): the story is the rank this one waits for. */
  int waited = hoop__net(comm)->waiting_for;
  if (origin == comm->rank && code == HOOP_ERR_TIMEOUT && waited >= 0 && waited != comm->rank &&
      waited != peer)
    return hoop__fail(comm, code,
                      "%s (call #%llu): rank %d gave up waiting for this rank, which was itself "
                      "waiting for rank %d (told by rank %d: %s)",
                      call ? call : "hoop", seq, peer, waited, peer, text);
  return hoop__fail(comm, code,
                    "%s (call #%llu): aborted because rank %d failed (told by rank %d): %s",
                    call ? call : "hoop", seq, origin, peer, text);
}

/* ---- the net lock (comm/split.c): sub-communicators' calls on net's transports ------------- */

void hoop__net_enter(hoop_comm *comm) {
  hoop_comm *net = hoop__net(comm);
  if (!atomic_load_explicit(&net->net_shared, memory_order_relaxed))
    return;
  if (pthread_mutex_trylock(&net->net_lock) == 0)
    return;
  /* The holder may sleep in the transports' poll: wake it, and it lets this thread in. */
  atomic_fetch_add(&net->net_waiters, 1);
  run_hooks(net, HOOP__HOOK_WAKE);
  pthread_mutex_lock(&net->net_lock);
  atomic_fetch_sub(&net->net_waiters, 1);
}

void hoop__net_leave(hoop_comm *comm) {
  hoop_comm *net = hoop__net(comm);
  if (!atomic_load_explicit(&net->net_shared, memory_order_relaxed))
    return;
  pthread_mutex_unlock(&net->net_lock);
}

void hoop__net_yield(hoop_comm *comm) {
  hoop_comm *net = hoop__net(comm);
  /* A mutex is no queue: this thread could take it again before a waiter wakes. Give the waiters
   * a moment to get it (each counts itself out once it has it). */
  for (int tries = 0;
       tries < 64 && atomic_load_explicit(&net->net_waiters, memory_order_relaxed) > 0; tries++)
    sched_yield();
}

hoop_result hoop__net_failed(hoop_comm *comm) {
  hoop_comm *net = hoop__net(comm);
  if (comm->failed || net == comm)
    return comm->failed;
  hoop_result failed = __atomic_load_n(&net->failed, __ATOMIC_ACQUIRE); /* see mark_failed */
  if (!failed)
    return HOOP_OK;
  comm->failed = failed;
  comm->fail_origin = net->fail_origin;
  memcpy(comm->fail_reason, net->fail_reason, sizeof comm->fail_reason);
  memcpy(comm->fail_cause, net->fail_cause, sizeof comm->fail_cause);
  memcpy(comm->last_error, net->fail_reason, sizeof comm->last_error);
  return comm->failed;
}
