#!/bin/sh
# Faults injected from outside, as a user meets them (bench/fault-trials, a few trials of each): a
# 4-rank job of back-to-back 16 MiB allreduces under hooprun (HOOP_TIMEOUT 5) loses a random rank
# to SIGKILL, a random rank to SIGSTOP, or hooprun itself to SIGKILL; every survivor must end
# within the bound (HOOP_TIMEOUT + 1 s for a rank, 5 s for the launcher) and no process of the job
# may be left. On one host, then (root, with `ip netns`) across four network-namespace hosts. The
# 100-trial runs behind the issue's figures are the same script with -n 100.
set -u
here=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${HOOP_BUILDDIR:-.}" && pwd)
trials=$here/bench/fault-trials
status=0
try() { # label, fault-trials options...
  label=$1
  shift
  out=$(HOOP_BUILDDIR=$build bash "$trials" "$@" 2>&1)
  code=$?
  echo "$out" | tail -1
  if [ $code != 0 ]; then
    echo "FAIL: $label"
    echo "$out" | tail -8
    status=1
  fi
}
for kind in kill stop launcher; do
  try "$kind, one host" -k $kind -n 2
done
if [ "$(id -u)" = 0 ] && command -v ip >/dev/null 2>&1 && ip netns list >/dev/null 2>&1; then
  for kind in kill stop launcher; do
    try "$kind, four netns hosts" -N -k $kind -n 1
  done
else
  echo "SKIP-PART: the netns trials: no root or no 'ip netns'"
fi
exit $status
