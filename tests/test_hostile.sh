#!/bin/bash
# Strangers at a running job's data listeners (issue 37's hostile suite, its first attacks): a
# 6-rank job (hooprun, tests/support/hostile_worker.py) forms, and before ranks 0-2 connect to
# ranks 3-5 (the job's barrier of 6 ranks never pairs them), a stranger (tests/support/hostile.py) opens 1,000 connections spread over the ranks'
# listeners, one in ten sending 64 random bytes, the others silent, and holds them open. Over TCP
# and over shared memory, as this user and (as root) as the unprivileged user nobody. Every attack
# must fail: the job completes with correct results within 2 s of its time without the attack,
# and each rank ends (after finalize) with as many descriptors open as before hoop.init, as it does
# without the attack. Before, each silent
# connection held an accept up to 5 s, and the job timed out.
set -u
build=${HOOP_BUILDDIR:-.}
src=${HOOP_SRCDIR:-.}
python=${HOOP_PYTHON:-/usr/bin/python3}
hooprun=$build/tools/hooprun

[ -x "$python" ] || { echo "SKIP: no $python"; exit 77; }
if [ "${HOOP_SANITIZED:-no}" = yes ]; then
  echo "SKIP: libhoop is built with the sanitizers, which $python cannot load"
  exit 77
fi
export PYTHONPATH=$src/python HOOP_LIBRARY=$build/lib/.libs/libhoop.so.1
work=$(mktemp -d)
chmod 755 "$work"
attacker=
cleanup() {
  [ -n "$attacker" ] && kill "$attacker" 2>/dev/null
  [ "${HOSTILE_KEEP:-0}" = 1 ] && echo "kept $work" || rm -rf "$work"
}
trap cleanup EXIT
failures=0
fail() {
  echo "FAIL: $*"
  failures=$((failures + 1))
}

# run NAME TRANSPORT USER COUNT: one job, attacked by COUNT connections of USER (COUNT 0: none).
# Leaves "took" (the slowest rank's seconds) and "fds" (each rank's descriptors at the end).
run() {
  local name=$1 transport=$2 user=$3 count=$4 log=$work/$1.log pids= job
  rm -f "$work/go"
  HOOP_TRANSPORT=$transport HOOP_DEBUG=${HOSTILE_DEBUG:-info} timeout 120 "$hooprun" -np 6 --timeout 60 "$python" \
    "$src/tests/support/hostile_worker.py" "$work/go" >"$log" 2>&1 &
  job=$!
  for _ in $(seq 300); do
    [ "$(grep -c '^\[[0-9]\] PID ' "$log")" = 6 ] && break
    sleep 0.1
  done
  pids=$(sed -n 's/^\[[0-9]\] PID [0-9]* \([0-9]*\) .*/\1/p' "$log")
  if [ "$count" -gt 0 ]; then
    # shellcheck disable=SC2086
    targets=$("$python" "$src/tests/support/hostile.py" list "$transport" $pids)
    mkfifo "$work/hold"
    # shellcheck disable=SC2086
    if [ "$user" = "$(id -un)" ]; then
      "$python" "$src/tests/support/hostile.py" attack "$count" $targets <"$work/hold" >>"$log" 2>&1 &
    else
      runuser -u "$user" -- "$python" "$src/tests/support/hostile.py" attack "$count" $targets \
        <"$work/hold" >>"$log" 2>&1 &
    fi
    attacker=$!
    exec 3>"$work/hold"
    for _ in $(seq 300); do
      grep -q '^hostile: ' "$log" && break
      sleep 0.1
    done
    grep '^hostile: ' "$log" | sed 's/^/  /'
  fi
  touch "$work/go"
  wait "$job" || fail "$name: the job failed: $(grep -v '^\[[0-9]\] PID' "$log" | tail -5)"
  if [ "$count" -gt 0 ]; then
    exec 3>&-
    wait "$attacker" 2>/dev/null
    attacker=
    rm -f "$work/hold"
  fi
  [ "$(grep -c '^\[[0-9]\] DONE [0-9] ok ' "$log")" = 6 ] ||
    fail "$name: not every rank finished with correct results: $(tail -5 "$log")"
  took=$(sed -n 's/^\[[0-9]\] DONE [0-9] ok \([0-9.]*\) .*/\1/p' "$log" | sort -n | tail -1)
  fds=$(sed -n 's/^\[\([0-9]\)\] DONE [0-9] ok [0-9.]* \([0-9]*\) \([0-9]*\)$/\1:\2-\3/p' "$log" | sort | tr '\n' ' ')
  for pair in $fds; do
    pair=${pair#*:}
    [ "${pair%-*}" = "${pair#*-}" ] || fail "$name: a rank's descriptors before init and after finalize: $pair"
  done
  refused=$(grep -c 'refused a connection' "$log")
  echo "  $name: slowest rank ${took:-?} s; descriptors (rank:before init-after finalize) $fds; $refused refusals logged"
}

users="$(id -un)"
[ "$(id -u)" = 0 ] && id nobody >/dev/null 2>&1 && users="$users nobody"
for transport in tcp shm; do
  echo "== hostile: $transport"
  run "$transport-quiet" "$transport" "" 0
  base_took=$took base_fds=$fds
  for user in $users; do
    run "$transport-$user" "$transport" "$user" 1000
    awk -v t="${took:-99}" -v b="${base_took:-0}" 'BEGIN{exit !(t <= b + 2)}' ||
      fail "$transport, 1000 connections of $user: the job took $took s, $base_took s without"
    [ "$fds" = "$base_fds" ] ||
      fail "$transport, 1000 connections of $user: descriptors at the end $fds, without: $base_fds"
  done
done
if [ $failures -gt 0 ]; then
  for log in "$work"/*.log; do
    echo "---- $log"
    tail -n 20 "$log"
  done
  exit 1
fi
echo "hostile: 1000 stranger connections at the listeners, over tcp and shm, as $users: every job completed, in time, with its descriptors"
