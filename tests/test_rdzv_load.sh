#!/bin/bash
# A short run of the rendezvous load generator (bench/rdzv-load, issue 39): 512 ranks' worth of
# clients on 64 simulated hosts join one job at a hoopd (with a token and without) and at the
# server a rank hosts; every client must get its table (a sample checked in full), and the
# server's descriptors must return to their count before the job. Times and memory are printed,
# never asserted: this machine is shared.
set -u
build=${HOOP_BUILDDIR:-.}
load=$build/bench/rdzv-load
[ -x "$load" ] || { echo "SKIP: no $load"; exit 77; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$work/token"
chmod 600 "$work/token"
status=0
check() {
  local name=$1 rc
  shift
  "$load" -n 512 -H 64 -r 1 "$@" >"$work/out" 2>&1 || {
    rc=$?
    echo "FAIL: $name: rdzv-load exited $rc"; cat "$work/out"; status=1; return
  }
  sed "s/^/  $name: /" "$work/out"
  # server ranks hosts conn tables p50 p99 rss0 rss rss1 fds0 fds fds1 chk fail held (a rank's
  # server stops listening once its job is whole: one descriptor fewer while the members hold)
  awk -v name="$name" '$1 ~ /^(hoopd|embedded)$/ && $2 ~ /^[0-9]+$/ {
    row = 1
    if ($15 != 0) { print "FAIL: " name ": " $15 " clients failed"; bad = 1 }
    if ($16 != $2) { print "FAIL: " name ": " $16 " of " $2 " clients hold their table"; bad = 1 }
    if ($14 < 6) { print "FAIL: " name ": only " $14 " tables checked"; bad = 1 }
    if ($13 > $11) { print "FAIL: " name ": descriptors " $11 " before the job, " $13 " after"; bad = 1 }
    if ($12 < $13 + $2 - 1) { print "FAIL: " name ": " $12 " descriptors with every member connected"; bad = 1 }
  } END { if (!row) { print "FAIL: " name ": no result line"; bad = 1 } exit bad }' "$work/out" || status=1
}
check hoopd --hoopd "$build/tools/hoopd"
check hoopd+token --hoopd "$build/tools/hoopd" --token-file "$work/token"
check embedded --embedded
check embedded+token --embedded --token-file "$work/token"
[ $status = 0 ] && echo "rdzv-load: 512 clients got their tables at each server, descriptors back"
exit $status
