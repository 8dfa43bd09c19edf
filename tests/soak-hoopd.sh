#!/bin/bash
# Soak: 200 short jobs of 2 ranks through one hoopd, up to 8 at once. hoopd's open descriptors and
# resident memory are read after a warm-up and at the end and must stay flat; with SOAK_VALGRIND=1
# hoopd runs under valgrind memcheck, which must report no error and no leak at exit.
# Usage: tests/soak-hoopd.sh [JOBS] (run from the build tree, or with HOOP_BUILDDIR set)
set -eu
build=${HOOP_BUILDDIR:-.}
jobs=${1:-200}
parallel=8
work=$(mktemp -d)
# A port below the ephemeral range, reserved for this run (tests/support/ports.sh).
. "$(dirname "$0")/support/ports.sh"
reserve_port || { echo "soak: no free port"; exit 1; }
port=$PORT
hoopd_pid=
cleanup() {
  [ -n "$hoopd_pid" ] && kill "$hoopd_pid" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

hoopd="$build/tools/hoopd"
# libtool's wrapper script would be what valgrind sees; run the real binary.
[ -x "$build/tools/.libs/hoopd" ] && hoopd="$build/tools/.libs/hoopd" &&
  export LD_LIBRARY_PATH="$build/lib/.libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
if [ "${SOAK_VALGRIND:-0}" = 1 ]; then
  valgrind --leak-check=full --show-leak-kinds=definite,indirect --errors-for-leak-kinds=definite,indirect \
    --error-exitcode=99 --log-file="$work/valgrind.log" "$hoopd" --listen "127.0.0.1:$port" 2>"$work/hoopd.log" &
else
  "$hoopd" --listen "127.0.0.1:$port" 2>"$work/hoopd.log" &
fi
hoopd_pid=$!
for _ in $(seq 100); do
  "$build/tools/hoopd" --status "127.0.0.1:$port" >/dev/null 2>&1 && break
  sleep 0.1
done

# One job: two ranks of the benchmark's barrier, through the daemon.
run_job() {
  for rank in 0 1; do
    HOOP_RENDEZVOUS="127.0.0.1:$port" HOOP_JOB="soak-$1" HOOP_SIZE=2 HOOP_RANK=$rank HOOP_TIMEOUT=60 \
      "$build/bench/hoop-bench" barrier -n 2 -w 0 >/dev/null 2>>"$work/ranks.log" &
  done
  wait
}
measure() {
  fds=$(ls /proc/"$hoopd_pid"/fd | wc -l)
  rss=$(awk '/VmRSS/{print $2}' /proc/"$hoopd_pid"/status)
  echo "$fds $rss"
}

failed=0
batch() { # jobs $1..$2, $parallel at a time (a bare wait would also wait for hoopd)
  i=$1
  while [ "$i" -le "$2" ]; do
    pids=
    for j in $(seq "$i" $(( i + parallel - 1 ))); do
      if [ "$j" -le "$2" ]; then
        run_job "$j" &
        pids="$pids $!"
      fi
    done
    for pid in $pids; do wait "$pid"; done
    i=$(( i + parallel ))
  done
}
batch 1 16 # warm-up: allocator pools and libuv's structures reach their working size
set -- $(measure); fds0=$1; rss0=$2
batch 17 "$jobs"
# Ranks keep their rendezvous connection until they finalize, so hoopd may still be closing the
# last job's connections when the ranks have exited: give it up to 5 s to settle.
for settle in $(seq 50); do
  set -- $(measure); fds1=$1; rss1=$2
  [ "$fds1" -le "$fds0" ] && break
  sleep 0.1
done
if grep -q "FAIL\|error" "$work/ranks.log"; then
  echo "FAIL: a job's rank reported an error:"; head -20 "$work/ranks.log"; failed=1
fi
completed=$(grep -c "complete:" "$work/hoopd.log" || true)
echo "soak: $jobs jobs, $completed completed; hoopd descriptors $fds0 -> $fds1, RSS ${rss0} kB -> ${rss1} kB"
[ "$completed" -eq "$jobs" ] || { echo "FAIL: expected $jobs completed jobs"; failed=1; }
[ "$fds1" -le "$fds0" ] || { echo "FAIL: hoopd holds more descriptors than after warm-up"; failed=1; }
# Flat: allow 512 kB of noise (allocator arenas), far less than 184 jobs' worth of state would leak.
# Under valgrind or AddressSanitizer the resident size is theirs (ASan's quarantine grows by design);
# their leak checks at hoopd's exit judge memory instead.
if [ "${SOAK_VALGRIND:-0}" != 1 ] && [ "${HOOP_SANITIZED:-no}" != yes ] &&
   [ "$rss1" -gt $(( rss0 + 512 )) ]; then
  echo "FAIL: hoopd's memory grew"; failed=1
fi
kill -TERM "$hoopd_pid"
wait "$hoopd_pid" || { echo "FAIL: hoopd exited with $? after SIGTERM"; failed=1; }
hoopd_pid=
if [ "${SOAK_VALGRIND:-0}" = 1 ]; then
  grep -E "ERROR SUMMARY|definitely lost|indirectly lost|All heap blocks" "$work/valgrind.log" |
    sed 's/^==[0-9]*== /valgrind: /'
fi
exit $failed
