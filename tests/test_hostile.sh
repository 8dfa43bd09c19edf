#!/bin/bash
# The hostile suite of issue 37, attacks made while a real job runs, over TCP and shared memory, as
# this user and (as root) as the unprivileged user nobody; every attack must fail, the job complete
# with correct results, and each rank end (after finalize) with the descriptors it had before.
#
# 1. Strangers at the data listeners: a 6-rank job (hooprun, tests/support/hostile_worker.py)
#    forms, and before ranks 0-2 connect to ranks 3-5 (the job's barrier of 6 ranks never pairs
#    them), a stranger (tests/support/hostile.py) opens 1,000 connections spread over the ranks'
#    listeners, one in ten sending 64 random bytes, the others silent, and holds them open. The
#    job must take at most 2 s more than without the attack (before, each silent connection held
#    an accept up to 5 s, and the job timed out).
# 2. The rendezvous and replays (rdzv_run below; needs strace, which shows what someone reading the
#    wire would see): forged HELLOs and status requests, garbage, HELLOs seen on the wire replayed,
#    at a hoopd with a token and at a rank 0 hosting the rendezvous with and without one; then every
#    data handshake seen, replayed to the listeners of ranks that accept after it. Each attempt
#    must be refused and logged with its address.
# A member's own attacks (segments it could cut, another member's place, lying CUDA IPC
# descriptors) are tests/test_hostile_member.c and tests/test_ipc_descriptors.c.
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
  fds=$(sed -n 's/^\[\([0-9]\)\] DONE [0-9] ok [0-9.]* \([0-9]*\) \([0-9]*\) [0-9]*$/\1:\2-\3/p' "$log" | sort | tr '\n' ' ')
  for pair in $fds; do
    pair=${pair#*:}
    [ "${pair%-*}" = "${pair#*-}" ] || fail "$name: a rank's descriptors before init and after finalize: $pair"
  done
  refused=$(grep -c 'refused a connection' "$log")
  peak=$(sed -n 's/^\[[0-9]\] MEM [0-9] \([0-9]*\)$/\1/p' "$log" | sort -n | tail -1)
  echo "  $name: slowest rank ${took:-?} s; descriptors (rank:before init-after finalize) $fds; peak memory of the largest rank ${peak:-?} kB; $refused refusals logged"
}

users="$(id -un)"
[ "$(id -u)" = 0 ] && id nobody >/dev/null 2>&1 && users="$users nobody"
for transport in ${HOSTILE_LISTENERS-tcp shm}; do
  echo "== hostile: $transport"
  run "$transport-quiet" "$transport" "" 0
  base_took=$took base_fds=$fds base_peak=$peak
  for user in $users; do
    run "$transport-$user" "$transport" "$user" 1000
    awk -v t="${took:-99}" -v b="${base_took:-0}" 'BEGIN{exit !(t <= b + 2)}' ||
      fail "$transport, 1000 connections of $user: the job took $took s, $base_took s without"
    [ "$fds" = "$base_fds" ] ||
      fail "$transport, 1000 connections of $user: descriptors at the end $fds, without: $base_fds"
    [ "${peak:-999999}" -le $((${base_peak:-0} + 4096)) ] ||
      fail "$transport, 1000 connections of $user: a rank's peak memory $peak kB, without: $base_peak kB"
  done
done
# Ports P and P + 1 (torchrun's rank 0 hosts the rendezvous at MASTER_PORT + 1), reserved.
. "$src/tests/support/ports.sh"

# as USER CMD...: run CMD as USER (this one, or another through runuser).
as_user() {
  local user=$1
  shift
  if [ "$user" = "$(id -un)" ]; then "$@"; else runuser -u "$user" -- "$@"; fi
}

# rdzv_run NAME MODE TRANSPORT USER: the attacks on the rendezvous and the replays. A 6-rank job is
# started by hand, each rank under strace (what someone who reads the wire sees), MODE hoopd: at a
# hoopd holding a token; token: torchrun's variables, rank 0 hosting the rendezvous, with a token
# file; open: the same without a token. While ranks 0-4 wait for rank 5, USER sends the server
# forged requests (tests/support/hostile.py rdzv) and replays the HELLOs seen; once the job has
# formed (init and the barrier opened data connections), USER replays every data handshake seen
# to the listeners of ranks 3-5, which accept ranks 0-2 after that (a rank reads what waits at its
# listener when it next accepts). Then the job runs: every attempt must be refused and logged with
# the address it came from; the job completes with correct results, every rank's descriptors and
# the server's return to their counts before, a hoopd serves on. Without the board, which would
# connect every pair at the barrier and leave the replays unread at listeners nobody accepts on.
rdzv_run() {
  local name=$1 mode=$2 transport=$3 user=$4 dir=$work/$1 port addr job token_known=1 server=
  local -a env=(HOOP_TRANSPORT="$transport" HOOP_DEBUG=info HOOP_TIMEOUT=120 HOOP_SHM_BOARD=0)
  local rank_var=HOOP_RANK server_fds= server_log pids=() r hellos_seen=
  mkdir -p "$dir"
  chmod 755 "$dir"
  rm -f "$work/go"
  reserve_port 2 || fail "$name: no free port"
  port=$PORT
  case $mode in
  hoopd)
    "$build/tools/hoopd" --listen "127.0.0.1:$port" --token-file "$work/token" >"$dir/server.log" 2>&1 &
    server=$!
    for _ in $(seq 100); do grep -q "listening" "$dir/server.log" && break; sleep 0.1; done
    server_fds=$(ls /proc/$server/fd | wc -l)
    addr=127.0.0.1:$port job=hostile-$name server_log=$dir/server.log
    env+=(HOOP_RENDEZVOUS="$addr" HOOP_JOB="$job" HOOP_SIZE=6 HOOP_TOKEN_FILE="$work/token")
    ;;
  *)
    addr=127.0.0.1:$((port + 1)) job=torchrun-$name rank_var=RANK server_log=$dir/rank0.log
    env+=(MASTER_ADDR=127.0.0.1 MASTER_PORT="$port" WORLD_SIZE=6 LOCAL_WORLD_SIZE=6
      TORCHELASTIC_RUN_ID="$name")
    if [ "$mode" = token ]; then env+=(HOOP_TOKEN_FILE="$work/token"); else token_known=0; fi
    ;;
  esac
  for r in 0 1 2 3 4 5; do
    [ $r = 5 ] && rdzv_attack
    env "${env[@]}" "$rank_var=$r" LOCAL_RANK=$r strace -f -qq -o "$dir/strace.$r" -xx -s 65536 \
      -e trace=write,sendto,sendmsg "$python" "$src/tests/support/hostile_worker.py" "$work/go" \
      >"$dir/rank$r.log" 2>&1 &
    pids+=($!)
  done
  for _ in $(seq 600); do
    [ "$(cat "$dir"/rank?.log | grep -c '^PID ')" = 6 ] && break
    sleep 0.1
  done
  local targets seen replayer
  # shellcheck disable=SC2046
  targets=$("$python" "$src/tests/support/hostile.py" list "$transport" \
    $(sed -n 's/^PID [3-5] \([0-9]*\) .*/\1/p' "$dir"/rank?.log))
  seen=$("$python" "$src/tests/support/hostile.py" seen "$transport" "$dir"/strace.? | paste -sd,)
  [ -n "$seen" ] || fail "$name: strace saw no $transport handshake to replay"
  mkfifo "$dir/hold"
  # shellcheck disable=SC2086
  as_user "$user" "$python" "$src/tests/support/hostile.py" replay "$transport" "${seen:-00}" \
    $targets <"$dir/hold" >>"$dir/attacks.log" 2>&1 &
  replayer=$!
  exec 4>"$dir/hold"
  for _ in $(seq 300); do
    grep -q '^hostile-replay: ' "$dir/attacks.log" && break
    sleep 0.1
  done
  touch "$work/go"
  for pid in "${pids[@]}"; do wait "$pid"; done
  exec 4>&-
  wait "$replayer" || fail "$name: the replaying stranger failed: $(tail -n 3 "$dir/attacks.log")"
  [ "$(cat "$dir"/rank?.log | grep -c '^DONE [0-9] ok ')" = 6 ] ||
    fail "$name: not every rank finished with correct results: $(tail -n 3 "$dir"/rank?.log)"
  local fds
  # A rank that hosted the rendezvous keeps libuv's signal pipe (2 descriptors, once a process).
  fds=$(sed -n 's/^DONE \([0-9]\) ok [0-9.]* \([0-9]*\) \([0-9]*\) \([0-9]*\)$/\1:\2-\3-\4/p' "$dir"/rank?.log | sort | tr '\n' ' ')
  for entry in $fds; do
    local rank=${entry%%:*} counts=${entry#*:} allowed=0
    [ "$mode" != hoopd ] && [ "$rank" = 0 ] && allowed=2
    local before=${counts%%-*} after=${counts#*-} pipes=${counts##*-}
    after=${after%-*}
    [ $((after - before)) -le $allowed ] && [ $((after - before)) -le "$pipes" -o $((after - before)) -le 0 ] ||
      fail "$name: rank $rank's descriptors before init and after finalize: $before, $after ($pipes new pipes)"
  done
  local attempts admitted replayed refused_rdzv refused_data
  attempts=$(grep -c '^hostile-rdzv: ' "$dir/attacks.log")
  admitted=$(grep '^hostile-rdzv: ' "$dir/attacks.log" | grep -vc ': refused (')
  replayed=$(sed -n 's/^hostile-replay: .* sent again: \([0-9]*\) connections.*/\1/p' "$dir/attacks.log")
  refused_rdzv=$(grep -c "refused .*127\.0\.0\.1\|closing 127\.0\.0\.1" "$server_log")
  refused_data=$(cat "$dir"/rank?.log | grep -c 'refused a connection')
  # Every forged request was made: 6 always, 5 more with a token, and each HELLO seen, replayed.
  local want_attempts=$((6 + 5 * token_known + $(tr ',' '\n' <<<"$hellos_seen" | grep -c .)))
  [ "$attempts" = "$want_attempts" ] ||
    fail "$name: $attempts forged requests made, $want_attempts meant (hostile.py rdzv failed?)"
  [ "${replayed:-0}" -gt 0 ] && [ "$replayed" = $(($(tr ',' '\n' <<<"$seen" | grep -c .) * $(wc -w <<<"$targets"))) ] ||
    fail "$name: ${replayed:-no} replayed connections, not one per handshake seen and listener"
  [ "$refused_rdzv" -ge "$attempts" ] ||
    fail "$name: $attempts forged requests, $refused_rdzv refusals logged with the address"
  [ "$admitted" = 0 ] || fail "$name: the server admitted a forged request: $(grep '^hostile-rdzv: ' "$dir/attacks.log" | grep -v ': refused (')"
  [ "$refused_data" -ge "${replayed:-0}" ] ||
    fail "$name: $replayed handshakes replayed, $refused_data refusals logged"
  if [ -n "$server" ]; then
    for _ in $(seq 20); do # the members' connections close as hoopd reads their ends
      [ "$(ls /proc/$server/fd | wc -l)" = "$server_fds" ] && break
      sleep 0.1
    done
    [ "$(ls /proc/$server/fd | wc -l)" = "$server_fds" ] ||
      fail "$name: hoopd had $server_fds descriptors before the attacks, $(ls /proc/$server/fd | wc -l) after"
    HOOP_TOKEN_FILE=$work/token "$build/tools/hoopd" --status "$addr" >/dev/null 2>&1 ||
      fail "$name: hoopd does not answer after the attacks"
    kill "$server"
    wait "$server" 2>/dev/null
  fi
  echo "  $name: $attempts forged requests, $admitted admitted, $refused_rdzv refusals logged with the address; $(echo "$seen" | tr ',' '\n' | grep -c .) handshakes replayed in $replayed connections, $refused_data refusals logged; descriptors (rank:before-after-pipes) $fds"
}

# rdzv_attack: called by rdzv_run once ranks 0-4 wait (their HELLOs seen) for rank 5.
rdzv_attack() {
  local hellos
  for _ in $(seq 300); do
    hellos=$("$python" "$src/tests/support/hostile.py" seen hello "$dir"/strace.? | wc -l)
    [ "$hellos" -ge 5 ] && break
    sleep 0.1
  done
  hellos_seen=$("$python" "$src/tests/support/hostile.py" seen hello "$dir"/strace.? | paste -sd,)
  [ "$hellos" -ge 5 ] || fail "$name: strace saw $hellos of ranks 0-4's HELLOs (hostile.py's header out of date?)"
  # shellcheck disable=SC2046
  as_user "$user" "$python" "$src/tests/support/hostile.py" rdzv "$addr" "$job" 6 5 "$token_known" \
    $(tr ',' ' ' <<<"$hellos_seen") >"$dir/attacks.log" 2>&1 ||
    fail "$name: the forging stranger failed: $(tail -n 3 "$dir/attacks.log")"
  cut -c1-110 "$dir/attacks.log" | sed 's/^/    /'
}

# strace must be allowed to trace (ptrace: a container may forbid it, or Yama's scope 3).
if command -v strace >/dev/null && strace -f -qq -o /dev/null true 2>/dev/null; then
  head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$work/token"
  chmod 600 "$work/token"
  for transport in ${HOSTILE_RDZV_TRANSPORTS-tcp shm}; do
    for mode in ${HOSTILE_RDZV_MODES-hoopd token open}; do
      for user in $users; do
        echo "== hostile: the rendezvous ($mode) and replays, $transport, as $user"
        rdzv_run "rdzv-$mode-$transport-$user" "$mode" "$transport" "$user"
      done
    done
  done
else
  echo "SKIP-PART: the rendezvous attacks and replays: no strace that may trace (it shows what someone who reads the wire sees)"
fi

if [ $failures -gt 0 ]; then
  for log in "$work"/*.log "$work"/*/*.log; do
    echo "---- $log"
    tail -n 20 "$log"
  done
  exit 1
fi
echo "hostile: 1000 stranger connections at the listeners, over tcp and shm, as $users: every job completed, in time, with its descriptors"
