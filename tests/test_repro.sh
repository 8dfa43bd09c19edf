#!/bin/sh
# test_repro.sh - reproducible mode (HOOP_REPRODUCIBLE=1, hoop(3) "Reproducible reductions") on
# every path this host has: repro_worker compares every reducing call's bytes with the fixed tree
# it computes itself, on 2, 3, 5 and 8 ranks, over shared memory (with and without the board) and
# TCP, with each allreduce, reduce-scatter and reduce algorithm forced (reproducible mode must
# pass over those that do not combine over the tree), chunks of 4 KiB and 1 MiB, one host and 2x2
# fake hosts, the progress thread on and off, host and device buffers (stand-in driver). Every run of one rank count must then print one
# digest. Four of the same paths in the default mode must not all print one digest (from 3 ranks
# on): the inputs can tell orders apart, so a mode that only looked reproducible would be caught.
set -u
build=${HOOP_BUILDDIR:-.}
hooprun=$build/tools/hooprun
worker=$build/tests/repro_worker
work=$(mktemp -d)
trap '[ -n "${HOOP_TEST_KEEP:-}" ] || rm -rf "$work"' EXIT
failures=0
runs=0
fail() {
  echo "FAIL: $*"
  failures=$((failures + 1))
}

# run NP MODE LABEL [VAR=value ...] [-- worker args]: one job; its ranks' digests are appended to
# $work/digests.MODE.NP as "0:DIGEST 1:DIGEST ... # LABEL" (MODE repro or default).
run() {
  np=$1 mode=$2 label=$3
  shift 3
  args=""
  [ "$mode" = default ] && args="--default"
  log=$work/run.$runs.log
  runs=$((runs + 1))
  env "$@" "$hooprun" -np "$np" --timeout 120 "$worker" $args $extra >"$log" 2>&1
  code=$?
  if [ "$code" != 0 ] || [ "$(grep -c ', 0 failed, digest' "$log")" != "$np" ]; then
    fail "$np ranks, $mode, $label: exit $code"
    sed -n '1,15p' "$log"
    return
  fi
  digests=$(grep -o 'rank [0-9]*: .*digest [0-9a-f]*' "$log" |
    sed 's/^rank \([0-9]*\):.*digest /\1:/' | sort -n | tr '\n' ' ')
  echo "$digests# $label" >>"$work/digests.$mode.$np"
}

# distinct FILE: how many different results the runs in FILE gave.
distinct() {
  sed 's/ *#.*//' "$1" | sort -u | wc -l
}

# The paths of one rank count, in one mode.
paths() {
  np=$1 mode=$2
  extra=""
  run "$np" "$mode" "shm" HOOP_TRANSPORT=shm
  run "$np" "$mode" "shm, no board, 4 KiB chunks" HOOP_TRANSPORT=shm HOOP_SHM_BOARD=0 \
    HOOP_CHUNK_BYTES=4096
  run "$np" "$mode" "tcp" HOOP_TRANSPORT=tcp
  run "$np" "$mode" "tcp, 4 KiB chunks, progress thread" HOOP_TRANSPORT=tcp HOOP_CHUNK_BYTES=4096 \
    HOOP_ASYNC_PROGRESS=1
  for algo in "allreduce:ring,reduce_scatter:ring,reduce:tree" \
    "allreduce:rd,reduce_scatter:halving,reduce:linear" \
    "allreduce:hd,reduce_scatter:direct,reduce:direct" "allreduce:direct,reduce:repro-tree" \
    "allreduce:hier" "allreduce:repro,reduce:repro,reduce_scatter:repro" \
    "allreduce:repro-all,reduce:repro-all,reduce_scatter:repro-rd" \
    "allreduce:repro-hd,reduce_scatter:repro-halving"; do
    run "$np" "$mode" "tcp, HOOP_ALGO=$algo" HOOP_TRANSPORT=tcp HOOP_ALGO="$algo"
  done
  if [ "$np" = 4 ]; then
    extra="--fake-hosts 2"
    run "$np" "$mode" "2x2 hosts" HOOP_TRANSPORT=auto
    run "$np" "$mode" "2x2 hosts, HOOP_ALGO=allreduce:hier" HOOP_ALGO=allreduce:hier
    run "$np" "$mode" "2x2 hosts over TCP, HOOP_ALGO=allreduce:repro-hier, 4 KiB chunks" \
      HOOP_TRANSPORT=tcp HOOP_ALGO=allreduce:repro-hier,reduce_scatter:repro-hier HOOP_CHUNK_BYTES=4096
    extra=""
  fi
  # Device buffers: on the stand-in driver here (the GPU's with HOOP_REPRO_DRIVER=libcuda.so.1),
  # where the default mode reads peers' buffers by CUDA IPC from the first byte.
  if [ "$cuda" = yes ] && [ "$np" -le 4 ]; then
    extra="--device"
    run "$np" "$mode" "shm, device buffers, CUDA IPC from 0 bytes" HOOP_TRANSPORT=shm \
      HOOP_CUDA_LIBRARY="$driver" HOOP_CUDA_IPC_MIN_BYTES=0 HOOP_DEBUG=info HOOP_DEBUG_SUBSYS=coll
    # The mode's own GPU kernel read the peers' buffers (the tree over up to 8 ranks of one host).
    grep -q "ipc: .* reads the peers' device buffers directly" "$log" ||
      fail "$np ranks, $mode: device buffers on one host did not go by CUDA IPC"
    extra="--stream"
    run "$np" "$mode" "tcp, device buffers, stream-ordered calls" HOOP_TRANSPORT=tcp \
      HOOP_CUDA_LIBRARY="$driver"
    extra=""
  fi
}

# A build without CUDA has no device buffers to run (CI's has them: .ci/run fails without).
cuda=no
grep -q '^#define HOOP_HAVE_CUDA 1' "$build/config.h" 2>/dev/null && cuda=yes
driver=${HOOP_REPRO_DRIVER:-$build/tests/.libs/libfakecuda.so}
[ "$cuda" = yes ] || echo "note: libhoop was configured without CUDA: no device buffer runs"

for np in 2 3 4 5 8; do
  # 8 ranks on this host's few CPUs: the quick set of calls.
  [ "$np" = 8 ] && quick=--quick || quick=""
  : >"$work/digests.repro.$np"
  : >"$work/digests.default.$np"
  if [ -n "$quick" ]; then
    extra=$quick
    run "$np" repro "shm" HOOP_TRANSPORT=shm
    run "$np" repro "tcp, 4 KiB chunks" HOOP_TRANSPORT=tcp HOOP_CHUNK_BYTES=4096
    run "$np" repro "tcp, HOOP_ALGO=ring" HOOP_TRANSPORT=tcp HOOP_ALGO=ring
    run "$np" repro "tcp, HOOP_ALGO=hd" HOOP_TRANSPORT=tcp HOOP_ALGO=hd
    run "$np" repro "tcp, HOOP_ALGO=repro-hd, repro-halving" HOOP_TRANSPORT=tcp \
      HOOP_ALGO=allreduce:repro-hd,reduce_scatter:repro-halving
  else
    paths "$np" repro
  fi
  # The default mode on a few of the same paths, enough to see orders differ (two ranks combine
  # two values, which every order does alike: from 3 ranks on).
  if [ "$np" -ge 3 ]; then
    extra=$quick
    run "$np" default "shm" HOOP_TRANSPORT=shm
    run "$np" default "tcp" HOOP_TRANSPORT=tcp
    run "$np" default "tcp, 4 KiB chunks" HOOP_TRANSPORT=tcp HOOP_CHUNK_BYTES=4096
    run "$np" default "tcp, HOOP_ALGO=ring" HOOP_TRANSPORT=tcp HOOP_ALGO=ring
    extra=""
  fi
  distinct=$(distinct "$work/digests.repro.$np")
  [ "$distinct" = 1 ] || {
    fail "$np ranks: reproducible mode gave $distinct different results"
    cat "$work/digests.repro.$np"
  }
  default_distinct=$(distinct "$work/digests.default.$np")
  echo "$np ranks: reproducible mode $distinct result(s) over $(wc -l <"$work/digests.repro.$np") runs;" \
    "the default mode $default_distinct"
  if [ "$np" -ge 3 ] && [ "$default_distinct" -lt 2 ]; then
    fail "$np ranks: the default mode gave one result on every path: the inputs cannot tell orders apart"
  fi
done

echo "test_repro.sh: $runs runs, $failures failures"
[ "$failures" = 0 ]
