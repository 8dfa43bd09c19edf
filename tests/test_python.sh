#!/bin/sh
# The Python package (python/hoop) on 1 to 4 ranks under hooprun, with Debian's /usr/bin/python3:
# tests/python/worker.py runs every dtype and op, blocking and non-blocking, broadcast, allgather,
# reduce-scatter, all-to-all(v), barrier and the errors, checked against references computed in
# Python. Skipped (77) where there is
# no python3, and under the sanitizers (an ASan-built libhoop cannot load into a python that is not).
set -u
src=${HOOP_SRCDIR:-.}
build=${HOOP_BUILDDIR:-.}
python=${HOOP_PYTHON:-/usr/bin/python3}

# hooprun gives every rank torchrun's variables (unless the user set them): 3 ranks on this host.
out=$("$build/tools/hooprun" -np 3 sh -c 'echo "$RANK $WORLD_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE $MASTER_ADDR $MASTER_PORT $OMP_NUM_THREADS"' 2>&1)
for r in 0 1 2; do
  echo "$out" | grep -qE "^\[$r\] $r 3 $r 3 127\.0\.0\.1 [0-9]+ 1\$" || {
    echo "FAIL: rank $r's torchrun variables:"; echo "$out"; exit 1; }
done
out=$(OMP_NUM_THREADS=4 "$build/tools/hooprun" -np 2 -x MASTER_PORT=1234 -x RANK=7 sh -c 'echo "$RANK $MASTER_PORT $OMP_NUM_THREADS"' 2>&1)
[ "$(echo "$out" | grep -c ' 7 1234 4$')" = 2 ] || {
  echo "FAIL: variables the user set were overridden:"; echo "$out"; exit 1; }
echo "hooprun sets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, OMP_NUM_THREADS, and keeps the user's"

if [ ! -x "$python" ]; then
  echo "SKIP: no $python (Debian: apt-get install python3)"; exit 77
fi
if [ "${HOOP_SANITIZED:-no}" = yes ]; then
  echo "SKIP: libhoop is built with the sanitizers, which $python cannot load"; exit 77
fi
HOOP_LIBRARY=$build/lib/.libs/libhoop.so.1
PYTHONPATH=$src/python${PYTHONPATH:+:$PYTHONPATH}
export HOOP_LIBRARY PYTHONPATH
status=0
for np in 1 2 3 4; do
  out=$("$build/tools/hooprun" -np "$np" --timeout 60 "$python" "$src/tests/python/worker.py" 2>&1)
  code=$?
  echo "$out" | grep -E 'checks|FAIL|Error|error' | head -20
  good=$(echo "$out" | grep -c ' checks, 0 failed')
  if [ $code != 0 ] || [ "$good" != "$np" ]; then
    echo "FAIL: $np ranks: hooprun exited $code, $good of $np ranks passed"; echo "$out" | tail -30
    status=1
  fi
done
# A chain of waits reaching a timeout: the rank that a peer gave up on names the rank it waits
# for itself (tests/python/chain_worker.py).
out=$(HOOP_TRANSPORT=shm "$build/tools/hooprun" -np 3 --timeout 60 "$python" \
  "$src/tests/python/chain_worker.py" 2>&1)
echo "$out" | grep '^\[1\] chain' | cut -c1-160
echo "$out" | grep -q '^\[1\] chain: rank 1: .*gave up waiting for this rank, which was itself waiting for rank 0' || {
  echo "FAIL: chain of waits: rank 1 did not name rank 0"; echo "$out" | tail -10; status=1; }
# Finding the slow rank: Communicator.stats() on every rank names the rank slowed on purpose.
out=$(HOOP_STATS_PERIOD=0.3 "$build/tools/hooprun" -np 3 --timeout 60 "$python" \
  "$src/tests/python/stats_worker.py" 2>&1)
code=$?
if [ $code != 0 ] || [ "$(echo "$out" | grep -c 'stats: rank [0-9]: ok')" != 3 ]; then
  echo "FAIL: Communicator.stats(): hooprun exited $code; its output:"; echo "$out" | tail -20
  status=1
else
  echo "$out" | grep 'stats: rank'
fi
# A job that loses a rank and goes on: Communicator.shrink() under hooprun --min-np.
out=$("$build/tools/hooprun" -np 3 --min-np 2 --timeout 30 "$python" \
  "$src/tests/python/elastic_worker.py" 2>&1)
code=$?
if [ $code != 0 ] || [ "$(echo "$out" | grep -c 'elastic ok')" != 2 ]; then
  echo "FAIL: shrink from Python: hooprun exited $code; its output:"; echo "$out" | tail -20
  status=1
else
  echo "$out" | grep 'elastic ok'
fi
# A torch.distributed program written for torchrun runs unchanged under hooprun (backend gloo).
if [ $status = 0 ] && "$python" -c 'import torch' 2>/dev/null; then
  out=$("$build/tools/hooprun" -np 2 --timeout 60 "$python" -c '
import torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.ones(3) * (dist.get_rank() + 1)
dist.all_reduce(t)
print("gloo", dist.get_rank(), dist.get_world_size(), t.tolist())
dist.destroy_process_group()' 2>&1)
  if [ "$(echo "$out" | grep -c 'gloo [01] 2 \[3.0, 3.0, 3.0\]')" != 2 ]; then
    echo "FAIL: torch.distributed (gloo) under hooprun:"; echo "$out" | tail -20; status=1
  else
    echo "torch.distributed with backend gloo ran under hooprun on 2 ranks"
  fi
  # The same DistributedDataParallel program on gloo and on hoop: the same lines.
  for backend in gloo hoop; do
    "$build/tools/hooprun" -np 2 --timeout 60 "$python" "$src/tests/python/ddp.py" $backend \
      >"${TMPDIR:-/tmp}/hoop-ddp-$backend.$$" 2>&1 || {
      echo "FAIL: ddp.py on $backend:"; tail -20 "${TMPDIR:-/tmp}/hoop-ddp-$backend.$$"; status=1; }
  done
  gloo_lines=$(grep -E '^\[0\] (step|max|params|reduce |scatter|alltoall|zero|hook)' "${TMPDIR:-/tmp}/hoop-ddp-gloo.$$")
  hoop_lines=$(grep -E '^\[0\] (step|max|params|reduce |scatter|alltoall|zero|hook)' "${TMPDIR:-/tmp}/hoop-ddp-hoop.$$")
  if [ -z "$gloo_lines" ] || [ "$gloo_lines" != "$hoop_lines" ]; then
    echo "FAIL: DistributedDataParallel on hoop and on gloo differ:"
    echo "gloo:"; echo "$gloo_lines"; echo "hoop:"; echo "$hoop_lines"; status=1
  elif ! grep -q 'unsupported: hoop backend: recv_anysource is not supported' \
      "${TMPDIR:-/tmp}/hoop-ddp-hoop.$$"; then
    echo "FAIL: a receive from any source on hoop did not raise NotImplementedError naming it"; status=1
  elif ! grep -q '^\[0\] reduce_scatter ok' "${TMPDIR:-/tmp}/hoop-ddp-hoop.$$" ||
      grep -q 'reduce_scatter gave' "${TMPDIR:-/tmp}/hoop-ddp-hoop.$$"; then
    echo "FAIL: reduce_scatter on the hoop backend:"; grep reduce_scatter "${TMPDIR:-/tmp}/hoop-ddp-hoop.$$"; status=1
  elif ! grep -q '^\[0\] premul ok: the factor applied (an op as torch 2.x makes it)' \
      "${TMPDIR:-/tmp}/hoop-ddp-hoop.$$" || grep -q 'premul gave' "${TMPDIR:-/tmp}/hoop-ddp-hoop.$$" ||
      ! grep -qE '^\[0\] premul ok: (the factor applied \(this torch|refused: hoop backend: all_reduce with PREMUL_SUM: this torch)' \
      "${TMPDIR:-/tmp}/hoop-ddp-hoop.$$"; then
    echo "FAIL: PREMUL_SUM on the hoop backend:"; grep -E 'premul|Error' "${TMPDIR:-/tmp}/hoop-ddp-hoop.$$"; status=1
  elif ! grep -q '^\[0\] coalesced ok' "${TMPDIR:-/tmp}/hoop-ddp-hoop.$$"; then
    echo "FAIL: the coalesced calls or the group's name on the hoop backend:"
    grep -E 'coalesced|Error' "${TMPDIR:-/tmp}/hoop-ddp-hoop.$$"; status=1
  else
    echo "DistributedDataParallel on the hoop backend: the same 5 losses, collectives (reduce, gather, scatter, isend/irecv, uneven all_to_all_single, new_group subsets), ZeroRedundancyOptimizer steps and parameters, and torch's own comm hooks (fp16, PowerSGD) as on gloo; reduce_scatter, PREMUL_SUM, the coalesced calls and the group's name checked"
  fi
  rm -f "${TMPDIR:-/tmp}/hoop-ddp-gloo.$$" "${TMPDIR:-/tmp}/hoop-ddp-hoop.$$"
elif [ $status = 0 ]; then
  echo "SKIP-PART: torch.distributed (gloo, DistributedDataParallel, the hoop backend) and the workers' torch cases: $python has no torch (Debian: apt-get install python3-torch)"
fi
exit $status
