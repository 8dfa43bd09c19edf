#!/bin/sh
# test_shm.sh - the shared-memory transport as a user meets it, on this host: what
# HOOP_TRANSPORT=auto chooses and logs, a job that mixes shared memory and TCP, HOOP_SHM=0, and
# what a rank killed in the middle of a transfer leaves: an error naming it on every other rank,
# and no segment, socket or file behind; a stranger's hellos carrying many descriptors, refused
# with every descriptor closed; a listener's queue kept full, a connect that fails in time.
set -u
build=${HOOP_BUILDDIR:-.}
hooprun=$build/tools/hooprun
worker=$build/tests/coll_worker
bench=$build/bench/hoop-bench
work=$(mktemp -d)
trap '[ -n "${HOOP_TEST_KEEP:-}" ] || rm -rf "$work"' EXIT
failures=0
fail() {
  echo "FAIL: $*"
  failures=$((failures + 1))
}
# count PATTERN FILE: how many lines of FILE hold PATTERN.
count() {
  grep -c -- "$1" "$2"
}

# 1. Every rank of a one-host job takes shared memory and says so, and says which copy path each
# pair takes.
HOOP_DEBUG=info HOOP_DEBUG_SUBSYS=net "$hooprun" -np 3 --timeout 60 "$worker" --quick \
  >"$work/auto.log" 2>&1 || fail "3 ranks over shm: exit $?"
[ "$(count 'checks, 0 failed' "$work/auto.log")" = 3 ] || fail "3 ranks over shm: checks failed"
[ "$(count 'HOOP_TRANSPORT=auto: using shm (every peer is on this host)' "$work/auto.log")" = 3 ] ||
  fail "3 ranks over shm: not every rank logged its choice of shm"
# HOOP_SHM_CMA_BYTES=auto: 3 ranks on a host of fewer CPUs read large messages in one copy (CMA,
# where Yama allows it); with a CPU each, every message goes through the segment, and they say so.
scope=$(cat /proc/sys/kernel/yama/ptrace_scope 2>/dev/null || echo 0)
cpus=$(getconf _NPROCESSORS_ONLN)
if [ "$cpus" -ge 3 ]; then
  grep -q "through the segment (two copies): HOOP_SHM_CMA_BYTES=auto, and this host has a CPU" \
    "$work/auto.log" || fail "3 ranks over shm on $cpus CPUs: no pair says auto chose the segment"
elif [ "$scope" = 0 ]; then
  grep -q "shm: rank . reads rank .'s messages of 262144 bytes and more straight from its memory" \
    "$work/auto.log" || fail "3 ranks over shm on $cpus CPUs: ptrace_scope 0, yet no pair reads with CMA"
fi
# Asked for, the single-copy path must be the one taken where Yama does not restrict ptrace (no
# file, or 0), or the CMA cases of test_collectives would quietly run through the segment.
HOOP_SHM_CMA_BYTES=262144 HOOP_DEBUG=info HOOP_DEBUG_SUBSYS=net "$hooprun" -np 2 --timeout 60 \
  "$worker" --quick >"$work/cma.log" 2>&1 || fail "2 ranks over shm, CMA asked for: exit $?"
[ "$(count 'checks, 0 failed' "$work/cma.log")" = 2 ] || fail "2 ranks over shm, CMA: checks failed"
if [ "$scope" = 0 ]; then
  grep -q "shm: rank . reads rank .'s messages of 262144 bytes and more straight from its memory" \
    "$work/cma.log" || fail "2 ranks over shm: ptrace_scope 0, yet no pair reads with CMA"
else
  grep -q "shm: rank . takes every message of rank . through the segment (two copies): " \
    "$work/cma.log" || fail "2 ranks over shm (ptrace_scope $scope): no line says why not CMA"
fi

# The sleep protocol with and without membarrier: with HOOP_SHM_SPIN_US=0 every wait sleeps, so
# every message to a waiting peer must ring its bell. 2 ranks (a CPU each here, so membarrier is
# taken where the kernel allows it); fences on both sides; and rank 0 fencing while rank 1 relies
# on membarrier (each side's flag in the segment tells the other which).
for mode in membarrier fences mixed; do
  case $mode in
  membarrier) set -- env ;;
  fences) set -- env HOOP_SHM_MEMBARRIER=0 ;;
  mixed) set -- sh -c '[ "$HOOP_RANK" = 0 ] && export HOOP_SHM_MEMBARRIER=0; exec "$@"' sh ;;
  esac
  HOOP_SHM_SPIN_US=0 HOOP_DEBUG=trace HOOP_DEBUG_SUBSYS=net "$hooprun" -np 2 --timeout 120 \
    "$@" "$worker" --quick >"$work/sleep-$mode.log" 2>&1 || fail "sleeping ranks ($mode): exit $?"
  [ "$(count 'checks, 0 failed' "$work/sleep-$mode.log")" = 2 ] ||
    fail "sleeping ranks ($mode): checks failed"
  # A missed bell costs a sleeper the poll's timeout, not a result: the trace names each one.
  [ "$(count 'a bell was missed' "$work/sleep-$mode.log")" = 0 ] ||
    fail "sleeping ranks ($mode): $(count 'a bell was missed' "$work/sleep-$mode.log") bells missed"
done
if ! grep -q "membarrier is off or refused" "$work/sleep-membarrier.log"; then
  [ "$(count 'shm: a rank about to sleep fences its peers with membarrier' \
    "$work/sleep-membarrier.log")" = 2 ] || fail "sleeping ranks: membarrier allowed, yet not used"
fi
[ "$(count 'shm: membarrier is off or refused: every message fences' "$work/sleep-fences.log")" \
  = 2 ] || fail "sleeping ranks: HOOP_SHM_MEMBARRIER=0 did not turn membarrier off"

# The board takes the small calls of ranks that share one host (each rank's trace names the
# algorithm of every run: board), and HOOP_SHM_BOARD=0 leaves them to messages.
for board in 1 0; do
  rm -f "$work/trace-$board".*
  HOOP_SHM_BOARD=$board HOOP_TRACE=$work/trace-$board "$hooprun" -np 2 --timeout 60 "$bench" \
    allreduce -s 8 -n 3 -w 0 >"$work/board-$board.log" 2>&1 || fail "board=$board: exit $?"
  for r in 0 1; do
    ran=$(grep -o '"algorithm":"board"' "$work/trace-$board.$r" 2>/dev/null | wc -l)
    if [ "$board" = 1 ] && [ "$ran" -lt 3 ]; then
      fail "board: rank $r ran $ran calls on the board, not every allreduce"
    elif [ "$board" = 0 ] && [ "$ran" != 0 ]; then
      fail "HOOP_SHM_BOARD=0: rank $r still ran $ran calls on the board"
    fi
  done
done

# A crowded host (one rank more than its CPUs): an 8 KiB broadcast over TCP goes down the chain,
# over shared memory by the tree (tune.c); each rank's trace names the algorithm of every run.
crowd=$(($(getconf _NPROCESSORS_ONLN) + 1))
if [ "$crowd" -le 9 ]; then
  for transport in tcp shm; do
    want=chain
    [ "$transport" = shm ] && want=tree
    rm -f "$work/trace-crowd-$transport".*
    HOOP_TRANSPORT=$transport HOOP_TRACE=$work/trace-crowd-$transport "$hooprun" -np "$crowd" \
      --timeout 60 "$bench" broadcast -s 8K -n 3 -w 0 -c 1 >"$work/crowd-$transport.log" 2>&1 ||
      fail "crowded broadcast over $transport: exit $?"
    for r in $(seq 0 $((crowd - 1))); do
      [ "$(grep -c "\"algorithm\":\"$want\"" "$work/trace-crowd-$transport.$r" 2>/dev/null)" -ge 3 ] ||
        fail "crowded broadcast over $transport: rank $r did not run every call by $want"
    done
  done
fi

# The board cannot be made (memfd_create refused for it, as at a descriptor or memory limit): the
# creator says so, every rank goes on with messages, and every collective is right.
nomemfd=$build/tests/.libs/libnomemfd.so
if [ -f "$nomemfd" ]; then
  rm -f "$work/trace-nomemfd".*
  # A sanitized build's runtime must come first among the libraries, and the stand-in would.
  LD_PRELOAD=$nomemfd NOMEMFD_NAMES=hoop-board HOOP_DEBUG=info HOOP_DEBUG_SUBSYS=net \
    ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}verify_asan_link_order=0 \
    HOOP_TRACE=$work/trace-nomemfd "$hooprun" -np 3 --timeout 60 "$worker" --quick \
    >"$work/nomemfd.log" 2>&1 || fail "no board (memfd refused): exit $?"
  [ "$(count 'checks, 0 failed' "$work/nomemfd.log")" = 3 ] ||
    fail "no board (memfd refused): checks failed"
  grep -q "^\[0\].*shm: no [0-9]*-byte board for small calls (Too many open files): they go as messages" \
    "$work/nomemfd.log" || fail "no board (memfd refused): rank 0 did not say why there is no board"
  for r in 0 1 2; do
    [ "$(grep -c '"algorithm":"board"' "$work/trace-nomemfd.$r" 2>/dev/null)" = 0 ] ||
      fail "no board (memfd refused): rank $r ran calls on a board"
    grep -q '"algorithm"' "$work/trace-nomemfd.$r" 2>/dev/null ||
      fail "no board (memfd refused): rank $r's trace is empty"
  done
else
  fail "no $nomemfd (make check builds it)"
fi

# 2. A mixed job: rank 1 turns shared memory off, so its pairs run over TCP while ranks 0 and 2
# share memory; every collective must still be right.
HOOP_DEBUG=info HOOP_DEBUG_SUBSYS=net "$hooprun" -np 3 --timeout 60 "$worker" --quick \
  --no-shm-on 1 >"$work/mixed.log" 2>&1 || fail "mixed shm+tcp job: exit $?"
[ "$(count 'checks, 0 failed' "$work/mixed.log")" = 3 ] || fail "mixed shm+tcp job: checks failed"
[ "$(count 'using several transports, by peer: shm for 1 peer, tcp for 1 peer' "$work/mixed.log")" \
  = 2 ] || fail "mixed shm+tcp job: ranks 0 and 2 did not log shm for one peer and tcp for one"
grep -q '^\[1\].*shm is not usable here (shm: turned off by HOOP_SHM=0)' "$work/mixed.log" ||
  fail "mixed shm+tcp job: rank 1 did not say that HOOP_SHM=0 turned shm off"

# 3. A bad HOOP_SHM value is an error, not a silent fallback.
HOOP_SHM=maybe "$hooprun" -np 2 --timeout 30 "$bench" barrier -n 1 -w 0 >"$work/bad.log" 2>&1 &&
  fail "HOOP_SHM=maybe: the job ran"
grep -q "HOOP_SHM 'maybe'" "$work/bad.log" || fail "HOOP_SHM=maybe: no error naming it"

# 4. A rank killed in the middle of large allreduces, and of barriers (on the board, where the
# others wait on its slot): the others fail within the timeout naming it, and nothing is left
# behind: no /dev/shm entry, no listening socket of the job, no process.
for what in "allreduce -s 16M -n 100000 -w 1" "barrier -n 100000000 -w 1"; do
  ls -a /dev/shm >"$work/shm-before" 2>/dev/null
  # hooprun stops the other ranks with SIGTERM as soon as one dies, often before they notice: the
  # ranks ignore SIGTERM here (an ignored signal stays ignored across exec), so each survivor has
  # hooprun's 3 s grace to find the death through shared memory and report it.
  "$hooprun" -np 3 --timeout 60 sh -c 'trap "" TERM; echo "pid $HOOP_RANK $$"; exec "$0" "$@"' \
    "$bench" $what >"$work/kill.log" 2>&1 &
  job=$!
  victim=
  for _ in $(seq 1 100); do
    victim=$(sed -n 's/^\[2\] pid 2 \([0-9]*\)$/\1/p' "$work/kill.log")
    [ -n "$victim" ] && break
    sleep 0.1
  done
  # Time to set up and to be in the middle of the calls (hoop-bench prints no row
  # before its last iteration).
  sleep 2
  if [ -z "$victim" ]; then
    fail "kill ($what): rank 2 never started"
    kill "$job" 2>/dev/null
  else
    kill -9 "$victim"
  fi
  started=$(date +%s)
  wait "$job"
  took=$(($(date +%s) - started))
  [ "$took" -le 30 ] || fail "kill ($what): the job took $took s to end after rank 2 was killed"
  for survivor in 0 1; do
    grep -Eq "^\[$survivor\].*(lost rank 2|rank 2 lost|rank 2 failed)" "$work/kill.log" ||
      fail "kill ($what): rank $survivor's error does not name rank 2"
  done
  grep -E "^\[[01]\].*(lost rank [013]|rank [013] lost)" "$work/kill.log" &&
    fail "kill ($what): a survivor blames another rank"
  ls -a /dev/shm >"$work/shm-after" 2>/dev/null
  cmp -s "$work/shm-before" "$work/shm-after" || fail "kill ($what): /dev/shm changed: $(cat "$work/shm-after")"
  pids=$(sed -n 's/^\[[0-9]\] pid [0-9] \([0-9]*\)$/\1/p' "$work/kill.log")
  for pid in $pids; do
    if kill -0 "$pid" 2>/dev/null; then
      fail "kill ($what): rank process $pid still runs"
      kill -9 "$pid"
    fi
    if command -v ss >/dev/null && ss -xlp 2>/dev/null | grep -q "hoop-shm-$pid-"; then
      fail "kill ($what): a listener of process $pid is left"
    fi
  done
done

# 5. A stranger's hellos with several descriptors each (2, 3, 20...), queued ahead of a real peer
# in a rank's listener: each is refused, every descriptor it brought is closed (before, two per
# message leaked: 17 open went to 34 after 63 sent), and the job completes. The rank ends with one
# descriptor more than before: the socket of the pair it then accepts. (Without the board, which
# would connect every pair at the first call.)
python=${HOOP_PYTHON:-/usr/bin/python3}
src=${HOOP_SRCDIR:-.}
# Python cannot load a libhoop built with the sanitizers: that build leaves this to the other.
if [ -x "$python" ] && [ -d /proc/self/fd ] && [ "${HOOP_SANITIZED:-no}" != yes ]; then
  # Each refusal is logged at info (the first as a warning too).
  HOOP_SHM_BOARD=0 HOOP_DEBUG=info PYTHONPATH=$src/python HOOP_LIBRARY=$build/lib/.libs/libhoop.so.1 timeout 120 "$hooprun" -np 6 \
    --timeout 60 "$python" "$src/tests/support/shm_fd_worker.py" >"$work/hostile.log" 2>&1 &
  job=$!
  pid=
  for _ in $(seq 300); do
    pid=$(sed -n 's/^\[3\] RANK3PID \([0-9]*\)$/\1/p' "$work/hostile.log")
    [ -n "$pid" ] && grep -q 'RANK3FDS before' "$work/hostile.log" && break
    sleep 0.1
  done
  "$python" "$src/tests/support/shm_hostile.py" "$pid" >>"$work/hostile.log" 2>&1 ||
    fail "hostile hello: the stranger could not connect"
  wait "$job" || fail "hostile hello: the job failed"
  before=$(sed -n 's/^\[3\] RANK3FDS before \([0-9]*\)$/\1/p' "$work/hostile.log")
  after=$(sed -n 's/^\[3\] RANK3FDS after \([0-9]*\)$/\1/p' "$work/hostile.log")
  [ "$(count "refused a connection that did not present" "$work/hostile.log")" = 8 ] ||
    fail "hostile hello: not all 8 connections were refused"
  [ -n "$before" ] && [ "$after" = $((before + 1)) ] ||
    fail "hostile hello: rank 3 had $before descriptors open before and $after after"
  [ "$(count ' done' "$work/hostile.log")" = 6 ] || fail "hostile hello: the job did not complete"
fi

# 6. A listener's queue kept full by another process of the job's user (shm_backlog.py), while its
# rank is away from it: a rank connecting to it fails within the timeout (3 s), naming the rank and
# saying why, instead of blocking in connect(2) until the other accepts (before: for as long as
# the queue stayed full).
if [ -x "$python" ] && [ "${HOOP_SANITIZED:-no}" != yes ]; then
  HOOP_SHM_BOARD=0 HOOP_TRANSPORT=shm PYTHONPATH=$src/python HOOP_LIBRARY=$build/lib/.libs/libhoop.so.1 \
    timeout 60 "$hooprun" -np 4 --timeout 3 "$python" "$src/tests/support/shm_backlog_worker.py" \
    "$work/backlog.ready" >"$work/backlog.log" 2>&1 &
  job=$!
  pid=
  for _ in $(seq 300); do
    pid=$(sed -n 's/^\[2\] RANK2PID \([0-9]*\)$/\1/p' "$work/backlog.log")
    [ -n "$pid" ] && break
    sleep 0.1
  done
  timeout 30 "$python" "$src/tests/support/shm_backlog.py" "$pid" "$work/backlog.ready" \
    >"$work/filler.log" 2>&1 &
  filler=$!
  wait "$job"
  kill "$filler" 2>/dev/null
  took=$(sed -n 's/^\[0\] SEND-FAILED after \([0-9.]*\) s: .*lost rank 2 .*queue stayed full.*/\1/p' \
    "$work/backlog.log")
  queued=$(sed -n 's/^shm_backlog: \([0-9]*\) connections queued.*/\1/p' "$work/filler.log")
  if [ -z "$took" ] || [ "${queued:-0}" -lt 1 ] || [ "${took%.*}" -ge 6 ]; then
    fail "a listener's queue kept full: rank 0's send did not fail within the timeout naming rank 2 (queued ${queued:-none}, failed after ${took:-never})"
  else
    echo "a listener's queue kept full ($queued connections): rank 0's send failed after $took s naming rank 2"
  fi
fi

if [ "$failures" -gt 0 ]; then
  for log in auto mixed bad kill hostile backlog filler; do
    echo "---- $log.log"
    tail -n 30 "$work/$log.log"
  done
  exit 1
fi
echo "shm: choice, the board, mixed job, bad setting, kill and leftovers, hostile hellos, a full listener queue: all as expected"
