#!/bin/sh
# Collectives on CUDA device buffers (tests/support/coll_worker.c --device): every dtype and op at
# odd counts (the small reductions pairwise: each dtype with every op, each op at every count, each
# count with every dtype), in place and out of place, broadcast from every root, allgather; every
# rank on the device, even ranks only (host and device ranks in one call), and send and receive
# buffers of different kinds on one rank; on 1 to 3 ranks, each result against reference.c.
#
# Where there is a GPU (the driver loads and cuInit finds a device), on it. Everywhere else on the
# stand-in driver tests/support/fakecuda/, whose device memory faults if the CPU touches it, so
# every device byte must go through the driver's copies; the stand-in counts them, and the test
# requires that device buffers were copied. A libhoop built without CUDA skips (77).
set -u
build=${HOOP_BUILDDIR:-.}
worker=$build/tests/coll_worker
hooprun=$build/tools/hooprun
if ! grep -q '^#define HOOP_HAVE_CUDA 1' "$build/config.h" 2>/dev/null; then
  echo "SKIP: libhoop was configured without CUDA (./configure --with-cuda; needs cuda.h)"; exit 77
fi
status=0
run() { # label, np, extra args...
  label=$1 np=$2; shift 2
  out=$("$hooprun" -np "$np" --timeout 120 "$worker" --quick "$@" 2>&1)
  code=$?
  good=$(echo "$out" | grep -c ' checks, 0 failed')
  echo "$out" | grep -E 'checks|FAIL' | head -8
  if [ $code != 0 ] || [ "$good" != "$np" ]; then
    echo "FAIL: $label on $np ranks: hooprun exited $code, $good of $np ranks passed"
    # A sanitizer's report starts with its first line: show that, not only the end of the legend.
    echo "$out" | grep -A25 -m1 -E 'ERROR: (Address|Leak)Sanitizer|runtime error' || true
    echo "$out" | tail -20; status=1
  fi
}

python=${HOOP_PYTHON:-/usr/bin/python3}
src=${HOOP_SRCDIR:-.}

# The real thing, where there is one.
gpu=no
if HOOP_CUDA_LIBRARY=libcuda.so.1 "$worker" --device all --probe-device >/dev/null 2>&1; then gpu=yes; fi
if [ $gpu = yes ]; then
  echo "== a GPU: device buffers on it"
  for np in ${HOOP_CUDA_NP:-1 2 3}; do
    for mode in all even mixed; do HOOP_CUDA_LIBRARY=libcuda.so.1 run "GPU --device $mode" $np --device $mode; done
    HOOP_CUDA_LIBRARY=libcuda.so.1 run "GPU --device all --stream" $np --device all --stream
    # cuMemCreate's memory, exportable as file descriptors: CUDA IPC through them.
    if [ "$np" -ge 2 ]; then
      DEVMEM_VMM=1 HOOP_CUDA_LIBRARY=libcuda.so.1 HOOP_CUDA_IPC_MIN_BYTES=0 HOOP_DEBUG=info \
        HOOP_DEBUG_SUBSYS=coll run "GPU --device all, VMM memory" $np --device all
      echo "$out" | grep -m 2 'ipc: .*\(directly\|staged\)' | cut -c1-200
      echo "$out" | grep -q "reads the peers' device buffers directly" || {
        echo "FAIL: VMM memory did not go by CUDA IPC on the GPU"; status=1; }
    fi
    # The VMM descriptor servers with the real driver, asked wrong by a process of the same user.
    if [ "$np" = 3 ]; then
      DEVMEM_VMM=1 HOOP_CUDA_LIBRARY=libcuda.so.1 HOOP_CUDA_IPC_MIN_BYTES=0 \
        run "GPU --device all, VMM memory, hostile asks" 3 --device all --hostile-vmm
      echo "$out" | grep -q '4 of 4 hostile asks to 2 servers refused' || {
        echo "FAIL: the VMM descriptor servers on the GPU"; status=1; }
    fi
  done
  # Point-to-point messages between device buffers (staged through host memory).
  for np in 2 3; do
    out=$(HOOP_CUDA_LIBRARY=libcuda.so.1 "$hooprun" -np $np --timeout 120 "$build/tests/p2p_worker" \
      --quick --device 2>&1)
    echo "$out" | grep -E 'checks|FAIL' | head -4
    [ "$(echo "$out" | grep -c ' checks, 0 failed')" = $np ] || {
      echo "FAIL: point-to-point on device buffers, $np ranks"; echo "$out" | tail -20; status=1; }
  done
  # Sub-communicators on device buffers: rows and columns at once from two threads, each thread
  # with the context current.
  out=$(HOOP_CUDA_LIBRARY=libcuda.so.1 "$hooprun" -np 4 --timeout 120 "$build/tests/split_worker" \
    --device --rounds 6 2>&1)
  echo "$out" | grep -E 'checks|FAIL' | head -4
  [ "$(echo "$out" | grep -c ' checks, 0 failed')" = 4 ] || {
    echo "FAIL: sub-communicators on device buffers"; echo "$out" | tail -20; status=1; }
  # Tensors on the GPU through the Python package, where torch has CUDA.
  if [ -x "$python" ] && "$python" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    for np in ${HOOP_CUDA_NP:-1 2 3}; do
      out=$(PYTHONPATH=$src/python HOOP_LIBRARY=$build/lib/.libs/libhoop.so.1 \
        "$hooprun" -np $np --timeout 300 "$python" "$src/tests/python/cuda_worker.py" 2>&1)
      echo "$out" | grep -E 'checks|FAIL' | head -8
      [ "$(echo "$out" | grep -c ' checks, 0 failed')" = $np ] || {
        echo "FAIL: CUDA tensors on $np ranks"; echo "$out" | tail -20; status=1; }
    done
  fi
  # Compressed allreduces on device buffers: IPC within each host, the codec's kernels between.
  for hosts in 2 1; do
    out=$(HOOP_CUDA_LIBRARY=libcuda.so.1 "$hooprun" -np 4 --timeout 300 "$build/tests/compress_worker" \
      --quick --fake-hosts $hosts --device all 2>&1)
    echo "$out" | grep -E 'checks|FAIL' | head -4
    [ "$(echo "$out" | grep -c ' checks, 0 failed')" = 4 ] || {
      echo "FAIL: compressed allreduce on the GPU, hosts of $hosts"; echo "$out" | tail -20; status=1; }
  done
  # The pipelined ring and direct allreduces on the GPU.
  for np in ${HOOP_CUDA_NP:-2 3}; do
    for algo in ring direct; do
      [ $algo = direct ] && [ $np -lt 3 ] && continue
      HOOP_CUDA_LIBRARY=libcuda.so.1 HOOP_ALGO=allreduce:$algo HOOP_CUDA_PIPELINE_BYTES=0 \
        run "GPU --device all, pipelined $algo" $np --device all
    done
  done
  # HOOP_CUDA_GPU_ONLY=1 (bench/gpu-run): the stand-in's cases below are CI's; not again here.
  if [ "${HOOP_CUDA_GPU_ONLY:-0}" = 1 ]; then
    echo "== HOOP_CUDA_GPU_ONLY=1: the stand-in's cases are left to CI"
    exit $status
  fi
else
  echo "== no GPU here: device buffers on the stand-in driver (tests/support/fakecuda/)"
fi

fake=$build/tests/.libs/libfakecuda.so
[ -f "$fake" ] || { echo "FAIL: $fake was not built"; exit 1; }
lanes=$(mktemp -d "${TMPDIR:-/tmp}/hoop-cuda.XXXXXX") || exit 1
chmod 711 "$lanes" # the case run as nobody writes its count file there
trap 'rm -rf "$lanes"' EXIT

# The stand-in's cases run in lanes, several at once (HOOP_CUDA_LANES of them, default 4; 2 built
# with the sanitizers): a job on the stand-in mostly waits for its delayed copies, not for a CPU.
# Each lane has a count file of its own ($counts) and its own output, printed in order at the end.
ipc_run() { # label, np, extra args...: requires kernels and IPC mappings
  label=$1 np=$2; shift 2
  rm -f "$counts"
  HOOP_CUDA_LIBRARY=$fake FAKECUDA_COUNT=$counts FAKECUDA_ASYNC_DELAY_US=50 HOOP_CUDA_IPC_MIN_BYTES=0 \
    run "$label" $np "$@"
  kernels=$(awk '{n += $12} END {print n + 0}' "$counts" 2>/dev/null)
  opens=$(awk '{n += $14} END {print n + 0}' "$counts" 2>/dev/null)
  echo "  $label on $np ranks: $kernels kernels, $opens IPC mappings"
}

lane_staged() { # every mode, TCP, point-to-point, sub-communicators
  # The kernels' own code (lib/mem/cuda/kernels.cu, which the stand-in runs compiled for the CPU,
  # grid and all) against reduce.c: every dtype and op, NaN, zeros, subnormals, wraparound, half
  # rounding, aligned and not, in place. 77: a build without kernels (no nvcc).
  out=$(HOOP_CUDA_LIBRARY=$fake FAKECUDA_ASYNC_DELAY_US=0 "$build/tests/test_cuda_kernels" 2>&1)
  code=$?
  echo "$out" | grep -E '^(FAIL|SKIP|test_cuda_kernels)' | head -8 | sed 's/^/  stand-in kernels: /'
  if [ $code != 0 ] && [ $code != 77 ]; then
    echo "FAIL: kernels.cu on the stand-in (exit $code)"; echo "$out" | tail -10; status=1
  fi
  for np in 1 2 3; do
    for mode in all even mixed; do
      [ $np = 1 ] && [ $mode = even ] && continue # one rank: even is all
      rm -f "$counts"
      HOOP_CUDA_LIBRARY=$fake FAKECUDA_COUNT=$counts run "fake --device $mode" $np --device $mode
      copies=$(awk '{n += $2} END {print n + 0}' "$counts" 2>/dev/null)
      pinned=$(awk '{n += $8} END {print n + 0}' "$counts" 2>/dev/null)
      echo "  --device $mode on $np ranks: $copies copies through the driver, $pinned page-locked stages"
      if [ "${copies:-0}" -lt 100 ]; then
        echo "FAIL: the device buffers were not staged through the driver ($copies copies)"; status=1
      fi
      if [ "$mode" = all ] && [ "${pinned:-0}" -lt 1 ]; then
        echo "FAIL: no stage was page-locked"; status=1
      fi
    done
  done
  # The same over TCP (HOOP_SHM=0: no shared memory, so no CUDA IPC either), every rank on the
  # device and host and device ranks mixed.
  for mode in all mixed; do
    rm -f "$counts"
    HOOP_SHM=0 HOOP_CUDA_LIBRARY=$fake FAKECUDA_COUNT=$counts HOOP_DEBUG=info HOOP_DEBUG_SUBSYS=init \
      run "fake --device $mode over tcp" 3 --device $mode
    copies=$(awk '{n += $2} END {print n + 0}' "$counts" 2>/dev/null)
    echo "  --device $mode over tcp on 3 ranks: $copies copies through the driver"
    [ "${copies:-0}" -ge 100 ] && [ "$(echo "$out" | grep -c 'shm: turned off by HOOP_SHM=0')" = 3 ] || {
      echo "FAIL: device buffers over tcp (not staged, or shared memory used)"; status=1; }
  done
  # Point-to-point messages between device buffers, each staged through host memory of its own: the
  # stand-in faults if the CPU touches device memory, so every byte must go through its copies.
  for np in 2 3; do
    rm -f "$counts"
    out=$(HOOP_CUDA_LIBRARY=$fake FAKECUDA_COUNT=$counts "$hooprun" -np $np --timeout 120 \
      "$build/tests/p2p_worker" --quick --device 2>&1)
    copies=$(awk '{n += $2} END {print n + 0}' "$counts" 2>/dev/null)
    echo "$out" | grep -E 'checks|FAIL' | head -4
    echo "  point-to-point on device buffers, $np ranks: $copies copies through the driver"
    [ "$(echo "$out" | grep -c ' checks, 0 failed')" = $np ] && [ "${copies:-0}" -ge 100 ] || {
      echo "FAIL: point-to-point on device buffers, $np ranks"; echo "$out" | tail -20; status=1; }
  done
  # Sub-communicators on device buffers (split_worker --device): halves, a split of a split, and
  # the grid's rows and columns at once from two threads beside the job's calls; CUDA IPC among a
  # view's members.
  rm -f "$counts"
  out=$(HOOP_CUDA_LIBRARY=$fake FAKECUDA_COUNT=$counts HOOP_DEBUG=info HOOP_DEBUG_SUBSYS=coll \
    "$hooprun" -np 4 --timeout 120 "$build/tests/split_worker" --device --rounds 6 2>&1)
  copies=$(awk '{n += $2} END {print n + 0}' "$counts" 2>/dev/null)
  echo "$out" | grep -E 'checks|FAIL' | head -4
  echo "  sub-communicators on device buffers, 4 ranks: $copies copies through the driver"
  [ "$(echo "$out" | grep -c ' checks, 0 failed')" = 4 ] && [ "${copies:-0}" -ge 100 ] &&
    echo "$out" | grep -q "reads the peers' device buffers directly" || {
    echo "FAIL: sub-communicators on device buffers"; echo "$out" | grep -v INFO | tail -20; status=1; }
}

lane_pipelined() { # the ring and direct allreduces pipelined
  # The pipelined ring and direct allreduces (mem/stage.c): every allreduce on one of them,
  # pipelined at every size, while the stand-in carries out asynchronous copies late
  # (FAKECUDA_ASYNC_DELAY_US): a segment read before its copy in is waited for, or a result not
  # copied back, fails the checks.
  for algo in ring direct; do
    for np in 2 3 4; do
      [ $algo = direct ] && [ $np = 2 ] && continue
      for mode in all mixed; do
        rm -f "$counts"
        HOOP_CUDA_LIBRARY=$fake FAKECUDA_COUNT=$counts FAKECUDA_ASYNC_DELAY_US=200 \
          HOOP_ALGO=allreduce:$algo HOOP_CUDA_PIPELINE_BYTES=0 HOOP_CUDA_IPC=0 \
          run "fake --device $mode, pipelined $algo" $np --device $mode
        async=$(awk '{n += $10} END {print n + 0}' "$counts" 2>/dev/null)
        echo "  --device $mode on $np ranks, pipelined $algo: $async asynchronous copies"
        [ "${async:-0}" -ge 100 ] || { echo "FAIL: the $algo's copies were not pipelined"; status=1; }
      done
    done
  done
}

lane_chain() { # broadcast and allgather pipelined, late inputs, the stream variants
  # The chain broadcast and the ring allgather pipelined the same way (the root's buffer in segment
  # by segment, received pieces back as they arrive); allreduce on rd, which stages whole, so that
  # every asynchronous copy counted is theirs.
  for np in 2 3; do
    for mode in all even mixed; do
      rm -f "$counts"
      HOOP_CUDA_LIBRARY=$fake FAKECUDA_COUNT=$counts FAKECUDA_ASYNC_DELAY_US=200 \
        HOOP_ALGO=allreduce:rd,broadcast:chain,allgather:ring HOOP_CUDA_PIPELINE_BYTES=0 \
        HOOP_CUDA_IPC=0 run "fake --device $mode, pipelined chain and ring" $np --device $mode
      async=$(awk '{n += $10} END {print n + 0}' "$counts" 2>/dev/null)
      echo "  --device $mode on $np ranks, pipelined broadcast and allgather: $async asynchronous copies"
      [ "${async:-0}" -ge 100 ] || { echo "FAIL: broadcast and allgather were not pipelined"; status=1; }
    done
  done
  # Inputs still being written on the legacy default stream at the call, every pipelined algorithm.
  for algos in allreduce:ring,broadcast:chain,allgather:ring allreduce:direct; do
    HOOP_CUDA_LIBRARY=$fake FAKECUDA_ASYNC_DELAY_US=200 HOOP_ALGO=$algos HOOP_CUDA_PIPELINE_BYTES=0 \
      HOOP_CUDA_IPC=0 run "fake --device all --late-input, pipelined $algos" 3 --device all --late-input
  done

  # The stream-ordered variants: each call waits for the stream first.
  rm -f "$counts"
  HOOP_CUDA_LIBRARY=$fake FAKECUDA_COUNT=$counts run "fake --device all --stream" 2 --device all --stream
  syncs=$(awk '{n += $6} END {print n + 0}' "$counts" 2>/dev/null)
  echo "  --device all --stream on 2 ranks: $syncs stream waits"
  [ "${syncs:-0}" -ge 100 ] || { echo "FAIL: the stream variants did not wait for their stream"; status=1; }
}

lane_ipc() { # CUDA IPC: every call, traced, the legacy attribute, 10 ranks
  # CUDA IPC (coll/path_ipc.c, coll/mapped.c): every call of every size (HOOP_CUDA_IPC_MIN_BYTES=0) on ranks whose
  # buffers are all on the device reads the peers' buffers through the stand-in's IPC mappings, with
  # its reduction kernels carried out late (FAKECUDA_ASYNC_DELAY_US): a block read before its
  # reduction is waited for, or a result copied before its owner finished, fails the checks. Also
  # registered buffers reused call after call (mapped once), and the stream variants.
  for np in 2 3 4; do
    ipc_run "IPC --device all" $np --device all
    [ "${kernels:-0}" -ge 100 ] && [ "${opens:-0}" -ge 100 ] || {
      echo "FAIL: the collectives did not go by CUDA IPC"; status=1; }
  done
  # Reduce-scatter and all-to-all go by IPC too (each rank reduces, or copies, its block of every
  # peer's input): the trace names the algorithm of every run.
  trace=${TMPDIR:-/tmp}/hoop-cuda-trace.$$
  HOOP_TRACE=$trace
  export HOOP_TRACE
  ipc_run "IPC --device all, traced" 3 --device all
  unset HOOP_TRACE
  for call in hoop_reduce_scatter hoop_alltoall; do
    runs=$(grep -o "\"name\":\"$call\",\"cat\":\"collective\"[^}]*\"algorithm\":\"ipc\"" "$trace.0" | wc -l)
    echo "  $call by IPC on rank 0: $runs runs"
    [ "$runs" -ge 10 ] || { echo "FAIL: $call did not go by CUDA IPC"; status=1; }
  done
  rm -f "$trace".*
  # A driver whose pointer query says cudaMalloc's memory cannot go by legacy IPC (some have): its
  # handles are asked for anyway once the VMM export finds no VMM allocation there.
  FAKECUDA_LEGACY_ATTR=0 ipc_run "IPC --device all, legacy attribute 0" 2 --device all
  [ "${opens:-0}" -ge 100 ] || { echo "FAIL: legacy IPC was not tried despite the attribute"; status=1; }
  # 10 ranks: more sources than one pass of the many-source kernel takes (8), so two passes, and
  # in place the ranks past 8 reduce into scratch.
  ipc_run "IPC --device all" 10 --device all
  [ "${kernels:-0}" -ge 1000 ] || { echo "FAIL: 10 ranks did not go by CUDA IPC"; status=1; }
}

lane_compress() { # compressed allreduces: IPC within a host, the codec's kernels between hosts
  # tests/support/compress_worker.c --device: each result within its format's bound, every rank's
  # bits alike, and (hosts of at most 2 ranks, rounding to nearest) the same bits as the call on
  # host buffers. host0: only the first host's ranks on the device, the others encoding on the CPU,
  # and the two kinds of host must meet message for message (4 KiB chunks: many of them).
  for case in "4 2 all" "6 2 host0 4096" "4 1 all" "3 1 host0" "6 3 all" "3 3 all"; do
    set -- $case
    rm -f "$counts"
    out=$(HOOP_CUDA_LIBRARY=$fake FAKECUDA_COUNT=$counts FAKECUDA_ASYNC_DELAY_US=50 \
      HOOP_CUDA_IPC_MIN_BYTES=0 HOOP_CHUNK_BYTES=${4:-1048576} "$hooprun" -np $1 --timeout 300 \
      "$build/tests/compress_worker" --quick --fake-hosts $2 --device $3 2>&1)
    codecs=$(awk '{n += $20} END {print n + 0}' "$counts" 2>/dev/null)
    echo "  compressed, $(($1 / $2)) hosts x $2, --device $3: $codecs codec kernels"
    if [ "$(echo "$out" | grep -c ' checks, 0 failed')" != "$1" ]; then
      echo "FAIL: compressed allreduce, $(($1 / $2)) hosts x $2, --device $3"
      echo "$out" | grep -m 10 'FAIL\|rror'; echo "$out" | tail -5; status=1
    fi
    # Across hosts the device ranks encode with the kernels; on one host nothing is encoded.
    if [ "$1" != "$2" ] && [ "${codecs:-0}" -lt 100 ]; then
      echo "FAIL: the device ranks did not encode with the codec's kernels"; status=1
    elif [ "$1" = "$2" ] && [ "${codecs:-0}" != 0 ]; then
      echo "FAIL: a call within one host was encoded"; status=1
    fi
  done
}

lane_hosts() { # CUDA IPC host by host, registered buffers, late inputs, streams, refusals
  # Host by host (--fake-hosts: several hosts as the rank table sees them): the allreduce that
  # takes hier reduces on each host by IPC and crosses hosts as hier does, so a host whose ranks
  # cannot (host0: only the first host's buffers are on the device) stages and runs hier itself.
  export HOOP_ALGO=allreduce:hier
  ipc_run "IPC host by host, 2 hosts" 4 --device all --fake-hosts 2
  [ "${kernels:-0}" -ge 100 ] || { echo "FAIL: host by host did not go by CUDA IPC"; status=1; }
  # hier forced on one host: the whole host reads each other's buffers (the flat IPC shape), not
  # host by host with a step between hosts of one rank (which hung).
  ipc_run "IPC, hier forced on one host" 3 --device all
  [ "${kernels:-0}" -ge 100 ] || { echo "FAIL: hier on one host did not go by CUDA IPC"; status=1; }
  # Small chunks: the step between hosts in many messages, cut alike by both kinds of host.
  export HOOP_CHUNK_BYTES=4096
  ipc_run "IPC host by host, the first of 2 hosts only" 6 --device host0 --fake-hosts 3
  [ "${kernels:-0}" -ge 100 ] || { echo "FAIL: the first host did not go by CUDA IPC"; status=1; }
  unset HOOP_CHUNK_BYTES
  unset HOOP_ALGO
  ipc_run "IPC host by host, algorithms by size" 8 --device all --fake-hosts 4
  ipc_run "IPC --device all --register all" 3 --device all --register all
  [ "${kernels:-0}" -ge 10 ] || { echo "FAIL: registered buffers did not go by CUDA IPC"; status=1; }
  ipc_run "IPC --device all --late-input" 3 --device all --late-input
  [ "${kernels:-0}" -ge 100 ] || { echo "FAIL: late inputs did not go by CUDA IPC"; status=1; }
  HOOP_CUDA_LIBRARY=$fake HOOP_CUDA_IPC=0 run "staged --device all --late-input" 2 --device all --late-input
  ipc_run "IPC --device all --stream" 2 --device all --stream
  # Inputs written late on the calls' own stream: the stream variants wait for it.
  ipc_run "IPC --device all --stream --late-input" 3 --device all --stream --late-input
  HOOP_CUDA_LIBRARY=$fake HOOP_CUDA_IPC=0 FAKECUDA_ASYNC_DELAY_US=50 \
    run "staged --device all --stream --late-input" 2 --device all --stream --late-input
  [ "${kernels:-0}" -ge 100 ] || { echo "FAIL: the stream variants did not go by CUDA IPC"; status=1; }
  # A host buffer on any rank: every rank stages, alike.
  ipc_run "IPC --device mixed" 3 --device mixed
  [ "${kernels:-0}" = 0 ] || { echo "FAIL: mixed buffers went by CUDA IPC"; status=1; }
  # IPC refused by the driver: staged, and HOOP_DEBUG=info says why.
  out=$(HOOP_CUDA_LIBRARY=$fake FAKECUDA_IPC=0 HOOP_CUDA_IPC_MIN_BYTES=0 HOOP_DEBUG=info \
    HOOP_DEBUG_SUBSYS=coll "$hooprun" -np 2 --timeout 120 "$worker" --quick --device all 2>&1)
  if [ "$(echo "$out" | grep -c ' checks, 0 failed')" != 2 ] ||
    ! echo "$out" | grep -q "staged through host memory: rank [0-9]*'s buffer: cuIpcOpenMemHandle"; then
    echo "FAIL: IPC refused: not staged, or not said why"; echo "$out" | tail -20; status=1
  fi
  # No kernels in the driver: allreduce staged, broadcast and allgather (copies) still by IPC.
  export FAKECUDA_KERNELS=0
  ipc_run "IPC without kernels" 2 --device all
  unset FAKECUDA_KERNELS
  [ "${opens:-0}" -ge 10 ] && [ "${kernels:-1}" = 0 ] || {
    echo "FAIL: without kernels, broadcast and allgather not by IPC, or kernels launched"; status=1; }
}

lane_vmm() { # VMM memory, descriptors, non-blocking calls, failures, Python, host buffers
  # Buffers of the virtual memory management API (cuMemCreate, cuMemMap: PyTorch's expandable
  # segments), exportable as file descriptors: each exporter's descriptor server passes them over a
  # Unix socket, the peers map them (cuMemImportFromShareableHandle), not legacy handles.
  for np in 2 3; do
    DEVMEM_VMM=1 ipc_run "IPC of VMM memory --device all" $np --device all
    vmm=$(awk '{n += $18} END {print n + 0}' "$counts" 2>/dev/null)
    echo "  VMM imports: $vmm"
    [ "${kernels:-0}" -ge 100 ] && [ "${vmm:-0}" -ge 100 ] && [ "${opens:-1}" = 0 ] || {
      echo "FAIL: VMM memory did not go by CUDA IPC through file descriptors"; status=1; }
  done
  # A process of the same user that finds the descriptor servers and asks them wrong (bytes of the
  # wrong size; an ask without the export's token) gets nothing, and the servers serve on.
  DEVMEM_VMM=1 ipc_run "IPC of VMM memory, hostile asks" 3 --device all --hostile-vmm
  echo "$out" | grep -E 'hostile asks' | sed 's/^/  /'
  echo "$out" | grep -q '4 of 4 hostile asks to 2 servers refused' || {
    echo "FAIL: the VMM descriptor servers and hostile asks"; status=1; }
  # The same where no rank may ptrace another (--no-ptrace: not dumpable; as Ubuntu's Yama default
  # has it between sibling processes): the descriptors need no such permission. Only root can run
  # the job as an ordinary user (nobody), and only if the build tree is readable to it.
  if [ "$(id -u)" = 0 ] && command -v setpriv >/dev/null &&
    setpriv --reuid=nobody --regid=nogroup --clear-groups test -x "$worker" 2>/dev/null; then
    rm -f "$counts"; : >"$counts"; chmod 666 "$counts"
    out=$(setpriv --reuid=nobody --regid=nogroup --clear-groups env HOME=/tmp DEVMEM_VMM=1 \
      HOOP_CUDA_LIBRARY=$fake FAKECUDA_COUNT=$counts HOOP_CUDA_IPC_MIN_BYTES=0 \
      "$hooprun" -np 2 --timeout 120 "$worker" --quick --device all --no-ptrace 2>&1)
    vmm=$(awk '{n += $18} END {print n + 0}' "$counts" 2>/dev/null)
    echo "  VMM memory, no rank may ptrace another (as nobody): $vmm VMM imports"
    if [ "$(echo "$out" | grep -c ' checks, 0 failed')" != 2 ] || [ "${vmm:-0}" -lt 100 ]; then
      echo "FAIL: VMM memory without ptrace permission"; echo "$out" | tail -20; status=1
    fi
  else
    echo "SKIP-PART: VMM memory without ptrace permission: it needs root and a build tree nobody can read"
  fi
  # Not exportable (requestedHandleTypes without POSIX file descriptors): staged, saying why.
  out=$(DEVMEM_VMM=noexport HOOP_CUDA_LIBRARY=$fake HOOP_CUDA_IPC_MIN_BYTES=0 HOOP_DEBUG=info \
    HOOP_DEBUG_SUBSYS=coll "$hooprun" -np 2 --timeout 120 "$worker" --quick --device all 2>&1)
  if [ "$(echo "$out" | grep -c ' checks, 0 failed')" != 2 ] ||
    ! echo "$out" | grep -q "staged through host memory: .*was not made exportable as a file descriptor"; then
    echo "FAIL: unexportable VMM memory: not staged, or not said why"; echo "$out" | tail -20; status=1
  fi
  # Buffers across physical allocations mapped one after the other, a granule each (an expandable
  # segment that grew): mapped by the peers piece after piece, up to 16 pieces; past that, staged.
  rm -f "$counts"
  out=$(DEVMEM_VMM=split HOOP_CUDA_LIBRARY=$fake FAKECUDA_COUNT=$counts HOOP_CUDA_IPC_MIN_BYTES=0 \
    HOOP_DEBUG=trace HOOP_DEBUG_SUBSYS=coll "$hooprun" -np 2 --timeout 120 "$build/bench/hoop-bench" \
    allreduce -D -s 1M,4M,20M,40M -n 2 -w 1 -c 1 2>&1)
  echo "$out" | grep -E '^\[0\] +[0-9]'
  vmm=$(awk '{n += $18} END {print n + 0}' "$counts" 2>/dev/null)
  echo "  VMM imports: $vmm"
  if ! echo "$out" | grep -q 'Out of bounds values : 0 OK' ||
    ! echo "$out" | grep -q "of 41943040 bytes is staged: .*more than 16 VMM allocations" ||
    echo "$out" | grep -qE "of (1048576|4194304|20971520) bytes is staged" ||
    ! echo "$out" | grep -q 'of 1048576 bytes reads the peers'"'"' device buffers directly' ||
    [ "$vmm" -lt 24 ]; then
    echo "FAIL: VMM buffers across allocations"; echo "$out" | grep -v TRACE | tail -20; status=1
  fi
  # Many non-blocking calls on device buffers outstanding at once, completed in scrambled order,
  # by CUDA IPC on hoop's progress thread.
  out=$(HOOP_CUDA_LIBRARY=$fake HOOP_CUDA_IPC_MIN_BYTES=0 FAKECUDA_ASYNC_DELAY_US=20 "$hooprun" -np 3 \
    --timeout 200 "$build/tests/nb_worker" --quick --device 2>&1)
  echo "$out" | grep -E 'checks|FAIL' | head -4
  if [ "$(echo "$out" | grep -c ' checks, 0 failed')" != 3 ]; then
    echo "FAIL: non-blocking calls on device buffers"; echo "$out" | tail -20; status=1
  fi
  # A rank killed while requests on device buffers are in flight: an error naming it on the others;
  # with cudaMalloc's memory (legacy handles) and VMM memory (its descriptor server dies with it).
  for vmm in 0 1; do
    out=$(DEVMEM_VMM=$vmm HOOP_CUDA_LIBRARY=$fake HOOP_CUDA_IPC_MIN_BYTES=0 "$hooprun" -np 3 \
      --timeout 10 "$build/tests/nb_worker" --fail kill-device 2>&1)
    echo "$out" | grep -E 'failed naming|FAIL' | cut -c1-160
    if [ "$(echo "$out" | grep -c ' checks, 0 failed')" != 2 ]; then
      echo "FAIL: a rank killed during IPC collectives (DEVMEM_VMM=$vmm)"; echo "$out" | tail -20
      status=1
    fi
  done

  # The driver failing a copy while rank 1 packs its device buffers into a fused allreduce: rank 1
  # reports the driver's error, and the others an error naming rank 1 at once, not at the timeout.
  out=$(HOOP_CUDA_LIBRARY=$fake "$hooprun" -np 3 --timeout 10 "$build/tests/nb_worker" --fail pack 2>&1)
  code=$?
  echo "$out" | grep -E 'failed in|FAIL' | cut -c1-160
  if [ $code != 0 ] || [ "$(echo "$out" | grep -c ' checks, 0 failed')" != 3 ]; then
    echo "FAIL: a driver failure in a fused allreduce (hooprun exited $code)"
    echo "$out" | tail -20; status=1
  fi

  # The Python package sees whether libhoop takes CUDA buffers.
  if [ -x "$python" ] && [ "${HOOP_SANITIZED:-no}" != yes ]; then
    said=$(HOOP_CUDA_LIBRARY=$fake PYTHONPATH=$src/python HOOP_LIBRARY=$build/lib/.libs/libhoop.so.1 \
      "$python" -c 'import hoop; print(hoop.cuda_supported())' 2>&1)
    [ "$said" = True ] || { echo "FAIL: hoop.cuda_supported() with the stand-in: $said"; status=1; }
    said=$(HOOP_CUDA_LIBRARY=/nonexistent/libcuda.so.1 PYTHONPATH=$src/python \
      HOOP_LIBRARY=$build/lib/.libs/libhoop.so.1 "$python" -c 'import hoop; print(hoop.cuda_supported())' 2>&1)
    [ "$said" = False ] || { echo "FAIL: hoop.cuda_supported() without a driver: $said"; status=1; }
  fi
  # The stand-in loaded but every buffer on the host: nothing goes through the driver.
  rm -f "$counts"
  HOOP_CUDA_LIBRARY=$fake FAKECUDA_COUNT=$counts run "fake, host buffers" 2
  if [ -s "$counts" ]; then
    echo "FAIL: host buffers went through the driver: $(cat "$counts")"; status=1
  fi
}

max=${HOOP_CUDA_LANES:-4}
[ "${HOOP_SANITIZED:-no}" = yes ] && max=${HOOP_CUDA_LANES:-2}
all_lanes="lane_ipc lane_hosts lane_staged lane_pipelined lane_chain lane_vmm lane_compress"
running=""
for lane in $all_lanes; do
  if [ "$(echo $running | wc -w)" -ge "$max" ]; then # wait for the oldest
    set -- $running
    wait "$1"
    shift
    running="$*"
  fi
  (
    counts=$lanes/$lane.counts
    began=$(date +%s)
    $lane
    echo "  ($lane took $(($(date +%s) - began)) s)"
    echo "$status" >"$lanes/$lane.status"
  ) >"$lanes/$lane.out" 2>&1 &
  running="$running $!"
done
wait
for lane in $all_lanes; do
  echo "== $lane"
  cat "$lanes/$lane.out"
  case $(cat "$lanes/$lane.status" 2>/dev/null) in
    0) ;;
    1) status=1 ;;
    *) echo "FAIL: $lane ended before its last case"; status=1 ;;
  esac
done
exit $status
