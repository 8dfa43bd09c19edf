#!/bin/sh
# test_compress.sh - compressed reductions (hoop(3), "Slow links") on the layouts this host can
# make: compress_worker checks every result against sums it computes in double, within the bound
# hoop(3) derives for the format, that every rank's result has the same bits, that a call across
# hosts was compressed and a call within one was not, and the refusals. One host (shared memory:
# nothing may be compressed), 4 hosts of 1, 2 of 2, 3 of 2, 2 of 3, 3 of 3 and 9 of 1 ranks (hosts
# told apart by HOOP_HOSTNAME, over TCP and over shared memory), hosts of different sizes (exact),
# and the progress thread. The namespace hosts run it over real links in netns-test.sh.
set -u
build=${HOOP_BUILDDIR:-.}
hooprun=$build/tools/hooprun
worker=$build/tests/compress_worker
work=$(mktemp -d)
trap '[ -n "${HOOP_TEST_KEEP:-}" ] || rm -rf "$work"' EXIT
failures=0
runs=0

# run NP LABEL [VAR=value ...] -- WORKER ARGS
run() {
  np=$1 label=$2
  shift 2
  vars=""
  while [ $# -gt 0 ] && [ "$1" != -- ]; do
    vars="$vars $1"
    shift
  done
  [ $# -gt 0 ] && shift
  log=$work/run.$runs.log
  runs=$((runs + 1))
  # shellcheck disable=SC2086
  env $vars "$hooprun" -np "$np" --timeout 120 "$worker" "$@" >"$log" 2>&1
  code=$?
  passed=$(grep -c 'checks, 0 failed' "$log")
  if [ "$code" != 0 ] || [ "$passed" != "$np" ]; then
    echo "FAIL: $label: exit $code, $passed of $np ranks passed"
    grep -m 12 'FAIL\|error\|rank' "$log"
    failures=$((failures + 1))
  else
    echo "ok: $label: $(grep -m 1 -o '[0-9]* checks, 0 failed ([0-9]* hosts x [0-9]*)' "$log") on each rank"
  fi
}

run 2 "one host, 2 ranks, shared memory" HOOP_TRANSPORT=shm --
run 3 "one host, 3 ranks, TCP" HOOP_TRANSPORT=tcp -- --quick
run 4 "4 hosts x 1, TCP" HOOP_TRANSPORT=tcp -- --fake-hosts 1
run 4 "2 hosts x 2, TCP" HOOP_TRANSPORT=tcp -- --fake-hosts 2
run 4 "2 hosts x 2, shared memory, 4 KiB chunks" HOOP_TRANSPORT=shm HOOP_CHUNK_BYTES=4096 -- \
  --quick --fake-hosts 2
run 4 "2 hosts x 2, TCP, progress thread" HOOP_TRANSPORT=tcp HOOP_ASYNC_PROGRESS=1 -- --quick \
  --fake-hosts 2
run 6 "3 hosts x 2, TCP" HOOP_TRANSPORT=tcp -- --quick --fake-hosts 2
run 6 "2 hosts x 3, TCP" HOOP_TRANSPORT=tcp -- --quick --fake-hosts 3
run 9 "3 hosts x 3, TCP" HOOP_TRANSPORT=tcp -- --quick --fake-hosts 3
run 9 "9 hosts x 1, shared memory" HOOP_TRANSPORT=shm -- --quick --fake-hosts 1
run 5 "hosts of 2, 2 and 1 ranks: exact" HOOP_TRANSPORT=tcp -- --quick --fake-hosts 2 --uneven

echo "test_compress.sh: $runs runs, $failures failures"
[ "$failures" = 0 ]
