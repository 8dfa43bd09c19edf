#!/bin/sh
# Open MPI's mpirun starts 3 ranks of coll_worker, which know nothing of hooprun: hoop_init_from_env
# must take their numbers from OMPI_COMM_WORLD_* and meet on the loopback port rank 0 hosts.
# Skipped (exit 77) where Open MPI's mpirun is not installed (Debian: apt-get install openmpi-bin).
set -eu
build=${HOOP_BUILDDIR:-.}
if ! command -v mpirun >/dev/null 2>&1; then
  echo "SKIP: mpirun not found; install Open MPI (apt-get install openmpi-bin) to run this test"
  exit 77
fi
if ! mpirun --version 2>/dev/null | grep -q "Open MPI"; then
  echo "SKIP: mpirun is not Open MPI's ($(mpirun --version 2>&1 | head -n 1))"
  exit 77
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# Nothing of a surrounding hooprun or launcher may leak in; Open MPI refuses root without these.
unset HOOP_RENDEZVOUS HOOP_JOB HOOP_SIZE HOOP_RANK HOOP_RDZV_SERVE MASTER_ADDR MASTER_PORT RANK \
  WORLD_SIZE SLURM_PROCID SLURM_NTASKS
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export HOOP_TIMEOUT=60 HOOP_DEBUG=info HOOP_DEBUG_SUBSYS=env
if ! timeout 180 mpirun --oversubscribe --bind-to none -np 3 "$build/tests/coll_worker" --quick \
  >"$work/out" 2>&1; then
  echo "FAIL: mpirun -np 3 coll_worker exited non-zero:"
  cat "$work/out"
  exit 1
fi
for rank in 0 1 2; do
  grep -q "^coll_worker rank $rank of 3: [0-9]* checks, 0 failed$" "$work/out" || {
    echo "FAIL: no passing line from rank $rank; the output was:"; cat "$work/out"; exit 1; }
done
grep -q "using Open MPI's variables" "$work/out" || {
  echo "FAIL: HOOP_DEBUG=info did not log which launcher's variables were used:"; cat "$work/out"
  exit 1; }
grep "using Open MPI's variables" "$work/out" | head -n 1
echo "mpirun -np 3 coll_worker --quick: 3 ranks passed"
