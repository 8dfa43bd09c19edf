#!/bin/bash
# Four hosts made of network namespaces (h1..h4, 10.77.0.1..4 on a bridge that lives in a fifth,
# switch namespace, so nothing of the machine's own network changes): hoopd runs in h1 and hooprun
# starts coll_worker across the hosts with `--rsh 'ip netns exec'`, at 1 and 2 ranks per host,
# through hoopd and through hooprun's embedded server; then one remote rank is killed and hooprun
# must say which; then hooprun itself is killed and every rank on every host must end on its own;
# then one host's link goes down under a running job (no FIN, no RST) and every
# rank elsewhere must fail within HOOP_TIMEOUT plus a bound, saying why, and hoopd must drop
# that host's silent connections within its --keepalive; then an elastic sgd run loses a rank on
# one host, goes on, and takes in its replacement; reproducible mode's layouts; a rank slowed on
# purpose among 16 is named by every rank; last, one host's link shaped to a quarter of the
# others' is named the slowest link. Needs root and working
# `ip netns`; skipped (exit 77) otherwise.
set -u
build=$(cd "${HOOP_BUILDDIR:-.}" && pwd)
hooprun=$build/tools/hooprun
hoopd=$build/tools/hoopd
worker=$build/tests/coll_worker
bench=$build/bench/hoop-bench

skip() {
  echo "SKIP: $*"
  exit 77
}
[ "$(id -u)" = 0 ] || skip "needs root to make network namespaces (run 'make check' as root)"
command -v ip >/dev/null 2>&1 || skip "'ip' not found (Debian: apt-get install iproute2)"

# Unique names, so that runs in parallel do not collide.
. "$(cd "$(dirname "$0")" && pwd)/support/netns-lib.sh"
netns_hosts= netns_switch=
work=$(mktemp -d)
hoopd_pid=

cleanup() {
  [ -n "$hoopd_pid" ] && kill "$hoopd_pid" 2>/dev/null
  # Whatever still runs in our namespaces is ours: stop it before the namespaces go.
  netns_remove
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

netns_make hp$$ 2>"$work/err" || skip "cannot build the namespaces (ip netns, veth, bridge): $(cat "$work/err")"
hosts=$netns_hosts
tag=hp$$
set -- $hosts
h1=$1 h2=$2 h3=$3 h4=$4

failures=0
failed=
fail() {
  echo "FAIL: $*"
  failures=$((failures + 1))
  failed="$failed
FAIL: $*"
}

# run_job NAME PER_HOST EXTRA_OPTIONS...: coll_worker on the 4 hosts, PER_HOST ranks each; every
# rank must pass, with contiguous ranks per host and local ranks that say so.
run_job() {
  local name=$1 per_host=$2
  shift 2
  local np=$((4 * per_host)) out=$work/$name.out barrier=$work/$name.barrier
  mkdir -p "$barrier"
  local start=$SECONDS
  "$@" --rsh 'ip netns exec' -H "$h1:$per_host,$h2:$per_host,$h3:$per_host,$h4:$per_host" \
    --timeout 60 "$worker" --quick --ranks-per-host "$per_host" --barrier-dir "$barrier" \
    >"$out" 2>&1
  local code=$?
  if [ $code != 0 ]; then
    fail "$name: hooprun exited with $code; its output:"
    cat "$out"
    return
  fi
  local r
  for r in $(seq 0 $((np - 1))); do
    grep -q "^\[$r\] coll_worker rank $r of $np: [0-9]* checks, 0 failed$" "$out" ||
      { fail "$name: no passing line from rank $r; the output:"; cat "$out"; return; }
  done
  echo "ok: $name: $np ranks on 4 hosts ($per_host per host) passed in $((SECONDS - start)) s"
  grep "coll_worker rank" "$out" | sort -t' ' -k4n | sed 's/^/    /'
}

# hoopd on h1, as on a head node.
ip netns exec "$h1" "$hoopd" --listen 10.77.0.1:29400 --keepalive 5 2>"$work/hoopd.log" &
hoopd_pid=$!
for _ in $(seq 100); do
  ip netns exec "$h2" "$hoopd" --status 10.77.0.1:29400 >/dev/null 2>&1 && break
  sleep 0.1
done

run_job hoopd-1-per-host 1 "$hooprun" --rendezvous 10.77.0.1:29400
run_job hoopd-2-per-host 2 "$hooprun" --rendezvous 10.77.0.1:29400
# The embedded server: hooprun itself runs on h1 and must give the ranks an address of h1's that
# they reach (not 127.0.0.1).
run_job embedded-2-per-host 2 ip netns exec "$h1" "$hooprun" -v
grep -q "^hooprun: rendezvous server on 10\.77\.0\.1:[0-9]* " "$work/embedded-2-per-host.out" ||
  fail "embedded: the server's address given to the ranks is not h1's 10.77.0.1:" \
    "$(grep "^hooprun: rendezvous server" "$work/embedded-2-per-host.out")"
grep "^hooprun: ranks reach" "$work/embedded-2-per-host.out" | sed 's/^/    /'

# The four hosts share this machine's kernel and CPUs: each rank counts the ranks on its kernel
# from the table (the shared-memory entries' boot ids, whatever the namespace) and, where they
# outnumber the CPUs, spins briefly and yields, as ranks crowded on one host do.
out=$work/kernel.out
HOOP_DEBUG=trace HOOP_DEBUG_SUBSYS=net "$hooprun" --rendezvous 10.77.0.1:29400 \
  --rsh 'ip netns exec' -H "$h1:1,$h2:1,$h3:1,$h4:1" --timeout 60 "$bench" allreduce -s 8 -n 20 \
  >"$out" 2>&1 || fail "kernel count: hooprun exited with $?"
spin=1000
[ "$(nproc)" -lt 4 ] && spin=50
n=$(grep -c "HOOP_TCP_SPIN_US=auto: $spin us (1 ranks on this host, 4 on its kernel)" "$out")
if [ "$n" = 4 ]; then
  echo "ok: 4 namespace hosts on $(nproc) CPUs: every rank counts 4 on its kernel, spins $spin us"
else
  fail "kernel count: $n of 4 ranks said they spin $spin us with 4 ranks on their kernel:"
  grep "HOOP_TCP_SPIN_US" "$out"
fi

# A remote rank killed by SIGKILL: hooprun names it, stops the others and exits with 128+9.
out=$work/killed.out
"$hooprun" --rsh 'ip netns exec' -H "$h1:2,$h2:2,$h3:2,$h4:2" --rendezvous 10.77.0.1:29400 \
  sleep 60 >"$out" 2>&1 &
hooprun_pid=$!
victim=
for _ in $(seq 100); do
  victim=$(ip netns pids "$h3" | head -n 1)
  [ -n "$victim" ] && [ "$(ip netns pids "$h3" | wc -l)" -ge 2 ] && break
  sleep 0.1
done
if [ -z "$victim" ]; then
  fail "killed rank: no rank appeared on $h3 within 10 s"
else
  kill -KILL "$victim"
fi
wait "$hooprun_pid"
code=$?
if [ $code != 137 ]; then
  fail "killed rank: expected hooprun to exit with 137, got $code; its output:"
  cat "$out"
elif ! grep -q "^hooprun: rank [45] on $h3 (pid $victim) was killed by signal 9" "$out"; then
  fail "killed rank: hooprun did not name rank 4 or 5 on $h3 (pid $victim); its output:"
  cat "$out"
else
  echo "ok: a killed remote rank is reported: $(grep "^hooprun: rank" "$out")"
fi
# Every other rank was stopped: nothing of the job is left in the namespaces.
for ns in $hosts; do
  [ -z "$(ip netns pids "$ns")" ] || [ "$ns" = "$h1" ] ||
    fail "killed rank: processes left in $ns after hooprun exited: $(ip netns pids "$ns")"
done

# hooprun itself (on h1, serving the rendezvous) killed by SIGKILL, its ranks on the four hosts
# making no call: each must end on its own within 5 s (lib/comm/watch.c), leaving nothing behind.
out=$work/launcher.out
ip netns exec "$h1" "$hooprun" --rsh 'ip netns exec' -H "$h1:1,$h2:1,$h3:1,$h4:1" \
  "$build/tests/nb_worker" --idle 60.5 >"$out" 2>&1 &
hooprun_pid=$!
for _ in $(seq 100); do
  [ "$(grep -c ready "$out")" = 4 ] && break
  sleep 0.1
done
if [ "$(grep -c ready "$out")" != 4 ]; then
  fail "killed hooprun: the ranks did not all start:"; cat "$out"
else
  kill -KILL "$hooprun_pid"
  start=$SECONDS
  left=
  for _ in $(seq 60); do
    left=$(pgrep -f "nb_worker --idle 60.5")
    [ -z "$left" ] && break
    sleep 0.1
  done
  if [ -n "$left" ]; then
    fail "killed hooprun: ranks still running on the hosts 6 s later"
  else
    echo "ok: hooprun SIGKILLed: its ranks on the other hosts ended within $((SECONDS - start)) s"
  fi
fi
wait "$hooprun_pid" 2>/dev/null

# A host's link goes down in the middle of a job, so that no FIN or RST ever comes: every rank
# that waits on one of that host's ranks must stop within HOOP_TIMEOUT plus a bound, with an error
# that names a rank of that host or says it timed out, and hooprun must report it and exit
# non-zero. `timeout` guards the whole case: a hang is a failure, not a stuck `make check`.
# The ranks of other hosts than h3 (0-3, 6, 7) whose output in $1 has no error of theirs that
# names rank 4 or 5 or says it timed out; the notices that spread a failure reach them all before
# hooprun stops anyone, so each says it itself.
silent_survivors() {
  local r
  for r in 0 1 2 3 6 7; do
    grep -Eq "^\[$r\] .*(rank [45]\b|timed out|HOOP_TIMEOUT)" "$1" || printf ' %s' "$r"
  done
}

link_down() {
  local out=$work/link-down.out timeout_s=3 bound_s=20 job=${tag}-link-down started= code=
  local down_at took
  timeout -k 5 60 "$hooprun" --rsh 'ip netns exec' -H "$h1:2,$h2:2,$h3:2,$h4:2" \
    --rendezvous 10.77.0.1:29400 --job "$job" --timeout "$timeout_s" \
    "$bench" allreduce -b 1M -e 1M -n 100000000 -w 1 -c 0 >"$out" 2>&1 &
  local pid=$!
  # Once every rank has joined (hoopd says so; the ranks' own output is buffered), let the
  # allreduces run a while.
  for _ in $(seq 200); do
    grep -q "job '$job' complete" "$work/hoopd.log" && { started=1; break; }
    sleep 0.1
  done
  if [ -z "$started" ]; then
    kill "$pid" 2>/dev/null
    wait "$pid"
    fail "link down: the job did not start within 20 s; its output:"
    cat "$out"
    return
  fi
  sleep 1
  ip -n "$h3" link set eth0 down
  down_at=$(date +%s.%N)
  wait "$pid"
  code=$?
  took=$(awk -v from="$down_at" -v to="$(date +%s.%N)" 'BEGIN { printf "%.1f", to - from }')
  # hoopd still holds the connections of h3's ranks, whose goodbyes cannot reach it: its
  # keepalive probes go unanswered, and it must drop them and end the job while the link is
  # still down (--keepalive 5), not hold them until it comes back, or for ever. (The first of the
  # two to time out is named; the other's socket may then read as closed.)
  local over=
  for _ in $(seq 150); do
    grep -q "job '$job' is over" "$work/hoopd.log" && { over=1; break; }
    sleep 0.1
  done
  ip -n "$h3" link set eth0 up
  if [ -z "$over" ]; then
    fail "link down: hoopd still held the job 15 s after the link went down; its log:"
    cat "$work/hoopd.log"
  elif ! grep -q "job '$job': rank [45] .* stopped answering for 5 s" "$work/hoopd.log"; then
    fail "link down: hoopd did not say that rank 4 or 5 stopped answering; its log:"
    cat "$work/hoopd.log"
  else
    echo "ok: hoopd dropped the silent host's ranks and ended the job:"
    grep "job '$job': rank [45] .* stopped answering\|job '$job' is over" "$work/hoopd.log" |
      sed 's/^/    /'
  fi
  if [ "$code" = 124 ] || [ "$code" = 137 ]; then
    fail "link down: the job was still running 60 s after it started (hung); its output:"
    cat "$out"
  elif [ "$code" = 0 ]; then
    fail "link down: hooprun exited with 0; its output:"
    cat "$out"
  elif awk -v t="$took" -v limit=$((timeout_s + bound_s)) 'BEGIN { exit !(t > limit) }'; then
    fail "link down: hooprun exited $took s after the link went down (expected within" \
      "$timeout_s + $bound_s s); its output:"
    cat "$out"
  elif [ -n "$(silent_survivors "$out")" ]; then
    fail "link down: rank(s)$(silent_survivors "$out") on other hosts printed no error naming" \
      "rank 4 or 5 (on $h3) or saying it timed out; the output:"
    cat "$out"
  elif ! grep -Eq '^hooprun: rank [0-9]+ on [^ ]+ \(pid [0-9]+\) exited with status [1-9]' "$out"; then
    fail "link down: hooprun did not report a rank that failed; its output:"
    cat "$out"
  else
    echo "ok: a host whose link went down is reported within $took s (HOOP_TIMEOUT=$timeout_s):"
    grep -E '^\[[0-9]+\] .*(rank [45]\b|timed out|HOOP_TIMEOUT)|^hooprun: ' "$out" | sed 's/^/    /'
  fi
  for ns in $hosts; do
    [ -z "$(ip netns pids "$ns")" ] || [ "$ns" = "$h1" ] ||
      fail "link down: processes left in $ns after hooprun exited: $(ip netns pids "$ns")"
  done
}
link_down

# An elastic run across the hosts (TCP between them, shared memory within): rank 5 (on h3) kills
# itself in the second epoch; hooprun --min-np 4 --max-np 8 lets the others go on and starts a
# replacement on h3, which joins between two epochs; the run ends with eight bit-identical ranks.
elastic() {
  local out=$work/elastic.out params=$work/elastic.params
  timeout 120 ip netns exec "$h1" "$hooprun" --rsh 'ip netns exec' \
    -H "$h1:2,$h2:2,$h3:2,$h4:2" --min-np 4 --max-np 8 --timeout 20 \
    "$build/examples/sgd/sgd" --synthetic 4096 --epochs 8 --hidden 32 --elastic \
    --fail-rank 5 --fail-step 100 --save-params "$params" >"$out" 2>&1
  local code=$? r bad=
  for r in 1 2 3 4 5 6 7; do
    cmp -s "$params" "$params.rank$r" || bad="$bad $r"
  done
  if [ $code != 0 ]; then
    fail "elastic: hooprun exited with $code; its output:"
    cat "$out"
  elif ! grep -q "going on with 7 of 8\|going on with 8 of 8" "$out" ||
    ! grep -q "started a replacement for rank 5 as \[8\] (pid [0-9]*) on $h3" "$out" ||
    [ "$(grep -c "rank 0, epoch " "$out")" != 8 ] || [ -n "$bad" ]; then
    fail "elastic: expected the loss, the replacement on $h3, 8 epochs and 8 identical" \
      "replicas (differing:${bad:- none}); the output:"
    cat "$out"
  else
    echo "ok: elastic sgd lost rank 5 on $h3, took in its replacement, ended with 8 identical ranks:"
    grep -E "going on|took in|replacement|epoch 8" "$out" | sed 's/^/    /'
  fi
}
elastic

# Reproducible mode across hosts (hoop(3), "Reproducible reductions"): 4 ranks laid out 4x1, 2x2
# and 1x4 over the namespace hosts (TCP between them, shared memory within) compare every reducing
# call with the fixed tree (tests/support/repro_worker.c) and must print the same digests; in the
# default mode the 4x1 and 1x4 layouts (ring or halving-doubling across hosts, the board and
# direct within one) must not, or the inputs could not tell a layout's order.
repro() {
  local mode=$1 layout out digests=$work/repro.$1.digests
  : >"$digests"
  for layout in "$h1:1,$h2:1,$h3:1,$h4:1" "$h1:2,$h2:2" "$h1:4"; do
    out=$work/repro.$mode.$(echo "$layout" | tr -c '0-9a-z' '_').out
    "$hooprun" --rendezvous 10.77.0.1:29400 --rsh 'ip netns exec' -H "$layout" --timeout 60 \
      "$build/tests/repro_worker" --quick $([ "$mode" = default ] && echo --default) \
      >"$out" 2>&1 || { fail "reproducible ($mode) on $layout: hooprun exited with $?:"; cat "$out"; return; }
    [ "$(grep -c ', 0 failed, digest' "$out")" = 4 ] ||
      { fail "reproducible ($mode) on $layout: not every rank passed:"; cat "$out"; return; }
    grep -o 'rank [0-9]*: .*digest [0-9a-f]*' "$out" | sed 's/: .*digest / /' | sort -n |
      tr '\n' ' ' >>"$digests"
    echo >>"$digests"
  done
}
repro repro
n=$(sort -u "$work/repro.repro.digests" | wc -l)
if [ "$n" = 1 ]; then
  echo "ok: reproducible mode: 4 ranks as 4x1, 2x2 and 1x4 hosts give the tree's bits, one result"
else
  fail "reproducible mode: the layouts 4x1, 2x2 and 1x4 gave $n different results"
  cat "$work/repro.repro.digests"
fi
repro default
n=$(sort -u "$work/repro.default.digests" | wc -l)
if [ "$n" -ge 2 ]; then
  echo "ok: the default mode: the same layouts give $n different results"
else
  fail "the default mode gave one result on 4x1, 2x2 and 1x4: the check cannot see a layout"
fi

# Compressed reductions across real hosts (hoop(3), "Slow links"): compress_worker checks each
# format's results against sums in double within hoop(3)'s bound, the same bits on every rank, the
# calls compressed between hosts and exact within one, and error feedback draining, over TCP
# between the namespace hosts and shared memory within them: 4x1, 2x2 and 4x2.
for layout in "$h1:1,$h2:1,$h3:1,$h4:1" "$h1:2,$h2:2" "$h1:2,$h2:2,$h3:2,$h4:2"; do
  out=$work/compress.$(echo "$layout" | tr -c '0-9a-z' '_').out
  np=$(echo "$layout" | tr ',' '\n' | awk -F: '{n += $2} END {print n}')
  "$hooprun" --rendezvous 10.77.0.1:29400 --rsh 'ip netns exec' -H "$layout" --timeout 120 \
    "$build/tests/compress_worker" --quick >"$out" 2>&1
  code=$?
  if [ $code != 0 ] || [ "$(grep -c 'checks, 0 failed' "$out")" != "$np" ]; then
    fail "compressed reductions on $layout: exit $code; the output:"
    grep -m 20 'FAIL\|error\|checks' "$out"
  else
    echo "ok: compressed reductions on $layout: $(grep -m 1 -o '[0-9]* checks, 0 failed ([0-9]* hosts x [0-9]*)' "$out") on each rank; $(grep -m 1 -o '16 calls with feedback: off by [0-9.e-]*' "$out")"
  fi
done

# The slow rank at scale (issue 55's goal): 16 ranks over the 4 hosts, 4 each (which also checks
# that a rank whose first calls go over shared memory polls TCP safely: that crashed before any
# TCP peer had a slot), rank 9 sleeping 5 ms before each allreduce, the default HOOP_STATS_PERIOD
# of 2 s: every rank's hoop_comm_stats names rank 9 within 10 s, late by what the clock shows
# within 20% of the 5 ms (stats_worker's default). 16 ranks on this machine's 2 CPUs make rank 9
# come later than its sleep, by more the busier the machine: stats_worker holds the lateness
# named to the median of the lateness the ranks' arrival times show, and hoopd compares the
# ranks' arrivals by the same clock (one kernel's, which the namespaces share). Before it did
# (waits alone), a loaded make check saw hoop's figure move 5.71-9.44 ms from period to period
# where the clock said 7.08 ms. hoopd --status must list it first while the job runs, 4-10 ms
# late.
# The lateness each rank saw, that of the clock, and rank 9's sleep are printed.
# Built with the sanitizers, every call is several times slower and rank 9 comes later still
# (7-8 ms): there the test asks only that it be named, whatever its lateness.
out=$work/slowrank.out
tolerance=0.2
[ "${HOOP_SANITIZED:-no}" = yes ] && tolerance=20
"$hooprun" --rendezvous 10.77.0.1:29400 --rsh 'ip netns exec' -H "$h1:4,$h2:4,$h3:4,$h4:4" \
  --timeout 120 "$build/tests/stats_worker" --slow 9 --delay-ms 5 --seconds 12 \
  --tolerance "$tolerance" >"$out" 2>&1 &
job=$!
# Polled while the job lasts, not for a fixed count of polls: how long 16 ranks take to reach
# hoopd depends on the machine's load.
status=""
while kill -0 $job 2>/dev/null; do
  sleep 0.2
  line=$(ip netns exec "$h2" "$hoopd" --status 10.77.0.1:29400 2>&1 | grep '^hooprun')
  if [ "$tolerance" = 20 ]; then
    echo "$line" | grep -q '%  *9: [0-9.]* ms' && { status=$line; break; }
  else
    echo "$line" | grep -q '%  *9: [4-9]\.[0-9]* ms' && { status=$line; break; }
  fi
done
wait "$job"
code=$?
if [ $code != 0 ] || [ "$(grep -c ', 0 failed' "$out")" != 16 ]; then
  fail "slow rank on 16 ranks: hooprun exited $code; its output:"
  grep -v -e 'no token' -e ' 0 failed$' "$out" | tail -40
else
  late=$(grep -o 'named rank 9 late [0-9.]* ms after [0-9.]* s' "$out" | awk '{print $5}' | sort -n)
  after=$(grep -o 'named rank 9 late [0-9.]* ms after [0-9.]* s' "$out" | awk '{print $8}' | sort -n)
  came=$(grep -o 'the slow rank came [0-9.]* ms late' "$out" | awk '{print $5}' | sort -n)
  slept=$(grep -o 'it slept [0-9.]* ms' "$out" | awk '{print $3}' | sort -n | uniq | paste -sd/)
  shares=$(grep -o 'stats_worker rank [0-9]*: named.*(share [0-9.]*)' "$out" |
    sed 's/stats_worker rank \([0-9]*\):.*(share \([0-9.]*\))/\1 \2/' | sort -n -k2)
  echo "ok: 16 ranks on 4 hosts name rank 9, late $(echo "$late" | head -1)-$(echo "$late" | tail -1) ms (by the clock it came $(echo "$came" | head -1)-$(echo "$came" | tail -1) ms late; it slept $slept ms), within $(echo "$after" | tail -1) s"
  echo "    shares of time waiting: rank 9 $(echo "$shares" | awk '$1 == 9 {print $2}'), the others $(echo "$shares" | awk '$1 != 9 {print $2}' | head -1)-$(echo "$shares" | awk '$1 != 9 {print $2}' | tail -1)"
  [ -n "$(echo "$after" | awk '$1 > 10')" ] && fail "slow rank on 16 ranks: named after more than 10 s"
  [ -z "$status" ] && fail "slow rank on 16 ranks: hoopd --status never named rank 9 first, 4-10 ms late"
fi

# The slow link (hoop(3), "Finding the slow rank"): every host's link shaped to 400 Mbit/s, h3's
# to a quarter of it; 4 ranks (rank 2 on h3) allreduce 1 MiB over TCP for 8 s, and every rank's
# hoop_comm_stats must name rank 2 as the sender on the job's slowest link, and hoopd --status
# must list it first while the job runs. The goodputs are printed, not checked: a message that
# waited whole in the socket's buffer while its receiver was busy is read at memory speed (runs
# gave 12-29 MB/s for the 12.5 MB/s link, once 195 MB/s, and 50-58 MB/s for 400 Mbit/s).
# HOOP_STATS_PERIOD=1, scaled from the default 2 s.
out=$work/slowlink.out
for h in $h1 $h2 $h3 $h4; do
  rate=400mbit
  [ "$h" = "$h3" ] && rate=100mbit
  ip netns exec "$h" tc qdisc add dev eth0 root tbf rate $rate burst 256kb latency 20ms ||
    fail "slow link: tc tbf on $h"
done
HOOP_STATS_PERIOD=1 "$hooprun" --rendezvous 10.77.0.1:29400 --rsh 'ip netns exec' \
  -H "$h1:1,$h2:1,$h3:1,$h4:1" -x HOOP_STATS_PERIOD=1 --timeout 60 "$build/tests/stats_worker" \
  --slow -1 --slow-link 2 --count 262144 --seconds 8 >"$out" 2>&1 &
job=$!
status=""
while kill -0 $job 2>/dev/null; do
  sleep 0.2
  line=$(ip netns exec "$h2" "$hoopd" --status 10.77.0.1:29400 2>&1 | grep 'slowest links')
  case $line in *": 2 -> "*) status=$line; break ;; esac
done
wait "$job"
code=$?
for h in $h1 $h2 $h3 $h4; do
  ip netns exec "$h" tc qdisc del dev eth0 root 2>/dev/null
done
if [ $code != 0 ] || [ "$(grep -c ', 0 failed' "$out")" != 4 ]; then
  fail "slow link: hooprun exited $code; its output:"
  cat "$out"
else
  grep 'slowest link' "$out" | sed 's/^/    /'
  bad=$(grep 'slowest link' "$out" | awk '{ if ($7 != "2") print }')
  [ -z "$bad" ] || fail "slow link: a rank did not name the link from rank 2: $bad"
  if [ -z "$status" ]; then
    fail "slow link: hoopd --status never named the link from rank 2 first"
  else
    echo "ok: the slow link named by every rank and by hoopd --status:$status"
  fi
fi

if [ $failures != 0 ]; then
  echo "hoopd's log:"
  cat "$work/hoopd.log"
  echo "netns: $failures failed:$failed"
  exit 1
fi
echo "netns: all passed"
