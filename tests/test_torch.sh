#!/bin/sh
# hoop.torch under hooprun with Debian's /usr/bin/python3 and python3-torch:
# - tests/python/autograd_worker.py on 1, 3 and 4 ranks: gradients through the collectives;
# - tests/python/hvd_worker.py on 1 to 4 ranks: Horovod's API, every dtype and op, both
#   broadcasts, allgather, objects, DistributedOptimizer against a one-process reference (plain,
#   fp16, buckets, backward_passes_per_step, a missing gradient), join, and the refusals;
# - tests/python/join_worker.py on 2 to 4 ranks: hvd.join with uneven inputs and a loop of every
#   kind of call and SyncBatchNorm, each result against a reference over the ranks still training;
# - tests/python/trust_worker.py on 3 ranks, shared memory and TCP: no peer's bytes unpickled
#   outside the *_object calls (a member's crafted pickle is refused naming it, and never runs),
#   and Horovod's names in each call's fingerprint;
# - tests/python/lifecycle_worker.py on 3 ranks: destroy_process_group, init again, abort;
# - tests/python/stats_worker.py on 3 ranks: hvd.stats() and the group's stats() name the slow rank;
# - tests/python/timeout_worker.py on 3 ranks: init_process_group's and new_group's timeouts
#   and Work.wait(timeout), as torch.distributed programs set them;
# - tests/python/hvd_elastic.py: hvd.elastic on 3 ranks (hooprun --min-np 2) losing one, and
#   tests/python/hvd_elastic_sampler.py: the same with a DistributedOptimizer and an ElasticSampler;
# - tests/python/fail_worker.py: an exception on one rank, under the Horovod API and under the
#   torch.distributed backend, ends every other rank within 2 s naming it; a mismatched model fails
#   on every rank within 5 s; a killed rank is PeerLost naming it; two DistributedOptimizers
#   stepped in another order on one rank fail on every rank naming both buckets;
# - examples/torch, short runs: the Horovod program on 4 ranks ends with the parameters of 1 rank
#   at the same global batch (1e-5), the torch.distributed program prints the same loss lines
#   on gloo and on hoop, and so does the sharded trainer (sharded_mnist.py: parameters gathered,
#   gradients reduce-scattered), whose 4 ranks end within 1e-5 of 1 rank's parameters, and the
#   pipeline (pipeline_mnist.py: 4 stages passing micro-batches with send/recv) against 1 stage,
#   and the mixture of experts (moe_mnist.py: all_to_all_single) against one process; the elastic
#   example loses a rank, goes on, and takes a replacement in;
# - examples/horovod: Horovod's own pytorch_mnist.py, pytorch_synthetic_benchmark.py and
#   pytorch_mnist_elastic.py (through a rank killed from outside), unchanged but for the import
#   and the data (needs python3-torchvision and python3-filelock).
# Skipped (77) without python3 or torch or Debian's dataset-fashion-mnist (the examples only), and
# under the sanitizers (an ASan-built libhoop cannot load into a python that is not).
set -u
src=${HOOP_SRCDIR:-.}
build=${HOOP_BUILDDIR:-.}
python=${HOOP_PYTHON:-/usr/bin/python3}
if [ ! -x "$python" ] || ! "$python" -c 'import torch' 2>/dev/null; then
  echo "SKIP: no torch for $python (Debian: apt-get install python3-torch)"; exit 77
fi
if [ "${HOOP_SANITIZED:-no}" = yes ]; then
  echo "SKIP: libhoop is built with the sanitizers, which $python cannot load"; exit 77
fi
HOOP_LIBRARY=$build/lib/.libs/libhoop.so.1
PYTHONPATH=$src/python${PYTHONPATH:+:$PYTHONPATH}
export HOOP_LIBRARY PYTHONPATH
hooprun=$build/tools/hooprun
tmp=${TMPDIR:-/tmp}/hoop-torch.$$
mkdir -p "$tmp"
trap 'rm -rf "$tmp"' EXIT
status=0

# The last run: 3 ranks as 2 hosts (2 + 1; HOOP_HOSTNAME), for the local and cross ranks.
for np in 1 2 3 4 3x2; do
  per_host=0
  [ "$np" = 3x2 ] && np=3 per_host=2
  out=$(HVD_WORKER_PER_HOST=$per_host "$hooprun" -np "$np" --timeout 120 "$python" \
    "$src/tests/python/hvd_worker.py" 2>&1)
  code=$?
  echo "$out" | grep -E 'checks|FAIL|Error' | head -20
  good=$(echo "$out" | grep -c ' checks, 0 failed')
  if [ $code != 0 ] || [ "$good" != "$np" ]; then
    echo "FAIL: hvd_worker.py on $np ranks ($per_host per host): hooprun exited $code, $good of $np ranks passed"
    echo "$out" | tail -30; status=1
  fi
done

# Failures: 3 ranks; the culprit is rank 2 (model: rank 1), the others must say PASS (model and
# order: every rank).
for mode in raise dist model kill order; do
  out=$("$hooprun" -np 3 --timeout 60 "$python" "$src/tests/python/fail_worker.py" $mode 2>&1)
  echo "$out" | grep -E '^\[[0-9]\] (PASS|FAIL)' | cut -c1-240
  want=2; [ $mode = model ] || [ $mode = order ] && want=3
  if [ "$(echo "$out" | grep -c "PASS $mode:")" != $want ] || echo "$out" | grep -q "FAIL $mode:"; then
    echo "FAIL: failure case '$mode':"; echo "$out" | tail -30; status=1
  fi
done

# Trust and names (tests/python/trust_worker.py), over shared memory and TCP: a member's pickle
# in hoop.torch's own exchanges is refused naming it and never runs; named calls posted in
# another order fail on every rank naming both names.
for transport in shm tcp; do
  rm -rf "$tmp/trust" && mkdir -p "$tmp/trust"
  out=$(HOOP_TRANSPORT=$transport "$hooprun" -np 3 --timeout 60 "$python" \
    "$src/tests/python/trust_worker.py" "$tmp/trust" 2>&1)
  echo "$out" | grep -E 'trust worker|FAIL' | sed "s/^/  $transport: /"
  if [ "$(echo "$out" | grep -c 'trust worker: 7 cases, 0 failed')" != 3 ] ||
     ! echo "$out" | grep -q 'PASS names: .*"grad\.[ab]".*"grad\.[ab]"' ||
     ls "$tmp/trust" | grep -q '^ran-'; then
    echo "FAIL: trust_worker.py over $transport:"; echo "$out" | grep -E 'PASS|FAIL' | cut -c1-300
    echo "$out" | tail -20; status=1
  fi
done

# Gradients through hvd.allreduce, allgather, broadcast, alltoall and reducescatter
# (tests/python/autograd_worker.py): each input's gradient against one computed in the worker from
# every rank's weights, on 1 to 4 ranks.
for np in 1 3 4; do
  out=$("$hooprun" -np $np --timeout 60 "$python" "$src/tests/python/autograd_worker.py" 2>&1)
  echo "$out" | grep -E "autograd worker|FAIL" | head -8 | cut -c1-200 | sed "s/^/  $np ranks: /"
  [ "$(echo "$out" | grep -c "autograd worker: 9 cases, 0 failed")" = $np ] || {
    echo "FAIL: autograd_worker.py on $np ranks:"; echo "$out" | tail -20; status=1; }
done

# Reproducible mode from Python (tests/python/repro_worker.py): hoop.Communicator(reproducible=
# True), the backend under torch.use_deterministic_algorithms(True), and hvd on the same job, bit
# for bit against the fixed tree computed in torch; over shared memory and TCP.
for transport in shm tcp; do
  for part in comm torch; do
    out=$(HOOP_TRANSPORT=$transport "$hooprun" -np 3 --timeout 60 "$python" \
      "$src/tests/python/repro_worker.py" $part 2>&1)
    echo "$out" | grep -E "repro worker|FAIL" | head -4 | cut -c1-200 | sed "s/^/  $transport $part: /"
    [ "$(echo "$out" | grep -c "repro worker: [0-9]* cases, 0 failed")" = 3 ] || {
      echo "FAIL: repro_worker.py $part over $transport:"; echo "$out" | tail -20; status=1; }
  done
done

# cases TRANSPORT SCRIPT LABEL NP...: tests/python/SCRIPT on NP ranks over HOOP_TRANSPORT (auto,
# tcp...), for each NP; every rank must end with "LABEL: N cases, 0 failed".
cases() {
  transport=$1 script=$2 label=$3
  shift 3
  for np; do
    out=$(HOOP_TRANSPORT=$transport "$hooprun" -np "$np" --timeout 60 "$python" \
      "$src/tests/python/$script" 2>&1)
    echo "$out" | grep -E "$label|FAIL" | head -4 | cut -c1-200 | sed "s/^/  $np ranks: /"
    [ "$(echo "$out" | grep -c "$label: [0-9]* cases, 0 failed")" = "$np" ] || {
      echo "FAIL: $script on $np ranks:"; echo "$out" | tail -20; status=1; }
  done
}

# Compressed reductions from Python (tests/python/compress_worker.py): the Communicator's compress
# setting and per-call keyword, refusals, error feedback on a registered buffer,
# hvd.Compression.int8 in DistributedOptimizer (replicas bitwise alike) and the backend's
# pg_options; 2 fake hosts of 2 ranks over TCP (compressed) and one host (exact).
cases tcp compress_worker.py "compress worker" 2 4

# hoop's DistributedDataParallel comm hook (tests/python/ddp_hooks.py): hvd.allreduce_hook with
# Compression.none against DDP's own allreduce, .fp16 against torch's fp16_compress_hook, .int8
# within its bound of the exact average, replicas alike and error feedback; 2 fake hosts of 2 ranks
# over TCP (compressed), one host and hosts of 2 and 1 (exact).
cases tcp ddp_hooks.py "ddp hooks" 2 3 4

# What torch 2.x asks of a group by device (tests/python/devices_worker.py), called as torch 2.x
# calls it: _get_backend, split_group, coalescing around sends and receives; 3 ranks.
cases auto devices_worker.py "devices worker" 3

# hvd.join with uneven inputs (tests/python/join_worker.py, a model with hvd.SyncBatchNorm): the
# ranks still training get, step by step, every kind of call's result over themselves alone while
# the joined ranks repeat the loop; then a loop whose calls change from step to step, refused on
# every rank (hoop.Mismatch).
cases auto join_worker.py "join worker" 2 3 4
out=$("$hooprun" -np 3 --timeout 60 "$python" "$src/tests/python/join_worker.py" irregular 2>&1)
echo "$out" | grep "irregular loop refused" | head -1 | cut -c1-200
[ "$(echo "$out" | grep -c "irregular loop refused: Mismatch")" = 3 ] &&
  [ "$(echo "$out" | grep -c "join worker: [0-9]* cases, 0 failed")" = 3 ] || {
  echo "FAIL: join_worker.py irregular:"; echo "$out" | tail -20; status=1; }

# Timeouts as torch.distributed programs set them (tests/python/timeout_worker.py, scaled down):
# HOOP_TIMEOUT=2 in the environment, a group's own timeout wins over it, a late rank 0 is waited
# for that long and not longer, and Work.wait(timeout) stops at its own.
for case in pass fail wait; do
  out=$(HOOP_TIMEOUT=2 "$hooprun" -np 3 --timeout 60 "$python" "$src/tests/python/timeout_worker.py" \
    $case 2>&1)
  echo "$out" | grep -E "^\[[0-9]\] (PASS|FAIL) $case" | cut -c1-200
  if [ "$(echo "$out" | grep -c "PASS $case:")" != 3 ] || echo "$out" | grep -q "FAIL $case:" ||
     { [ $case = fail ] && ! echo "$out" | grep -q "PASS fail: rank [12]: .*, naming rank 0"; }; then
    echo "FAIL: timeout case '$case':"; echo "$out" | tail -20; status=1
  fi
done

# A group's life cycle (tests/python/lifecycle_worker.py): destroy_process_group frees a new
# group's communicator and lets init_process_group run again; abort() fails every member at once.
out=$("$hooprun" -np 3 --timeout 60 "$python" "$src/tests/python/lifecycle_worker.py" 2>&1)
echo "$out" | grep -E "lifecycle worker|FAIL" | head -6 | cut -c1-200
# Rank 0 runs 29 cases, the others 30, and 31 where rank 0's abort overtook their barrier (the
# worker then checks that the barrier failed as the calls after it must).
[ "$(echo "$out" | grep -c "lifecycle worker: \(29\|30\|31\) cases, 0 failed")" = 3 ] || {
  echo "FAIL: lifecycle_worker.py:"; echo "$out" | tail -20; status=1; }

# Finding the slow rank through hvd.stats() and the backend's group (tests/python/stats_worker.py).
out=$(HOOP_STATS_PERIOD=0.3 "$hooprun" -np 3 --timeout 60 "$python" \
  "$src/tests/python/stats_worker.py" torch 2>&1)
echo "$out" | grep 'stats: rank'
[ "$(echo "$out" | grep -c 'stats: rank [0-9]: ok')" = 3 ] || {
  echo "FAIL: hvd.stats():"; echo "$out" | tail -20; status=1; }

# hvd.elastic: a rank lost in the middle of an epoch; the survivors restore, shrink, sync, finish.
out=$("$hooprun" -np 3 --min-np 2 --timeout 30 "$python" "$src/tests/python/hvd_elastic.py" 2>&1)
echo "$out" | grep -E 'elastic|FAIL|Error' | head -6
[ "$(echo "$out" | grep -c 'hvd elastic ok')" = 2 ] || {
  echo "FAIL: hvd.elastic did not go on without the lost rank"; echo "$out" | tail -20; status=1; }
# The same as Horovod's elastic example keeps it: a DistributedOptimizer and an ElasticSampler in
# the TorchState (tests/python/hvd_elastic_sampler.py).
out=$("$hooprun" -np 3 --min-np 2 --timeout 30 "$python" "$src/tests/python/hvd_elastic_sampler.py" 2>&1)
echo "$out" | grep -E 'elastic sampler|FAIL|Error' | head -6
[ "$(echo "$out" | grep -c 'hvd elastic sampler ok')" = 2 ] || {
  echo "FAIL: hvd.elastic with DistributedOptimizer and ElasticSampler"; echo "$out" | tail -20
  status=1; }

data=${FASHION_MNIST_DIR:-/usr/share/datasets/fashion-mnist}
if [ ! -f "$data/train-images-idx3-ubyte.gz" ]; then
  echo "SKIP-PART: the examples: no Fashion-MNIST in $data (Debian: apt-get install dataset-fashion-mnist)"
  exit $status
fi
ex=$src/examples/torch
# The Horovod program: 4 ranks x 16 against 1 rank x 64, 30 steps; fp16 on the wire runs too.
"$hooprun" -np 4 --timeout 120 "$python" "$ex/horovod_mnist.py" --global-batch 64 --steps 30 \
  --lr 0.05 --train-limit 4096 --save "$tmp/four.pt" >"$tmp/four.log" 2>&1 || {
  echo "FAIL: horovod_mnist.py on 4 ranks:"; tail -20 "$tmp/four.log"; status=1; }
"$hooprun" -np 1 --timeout 120 "$python" "$ex/horovod_mnist.py" --global-batch 64 --steps 30 \
  --lr 0.05 --train-limit 4096 --save "$tmp/one.pt" >"$tmp/one.log" 2>&1 || {
  echo "FAIL: horovod_mnist.py on 1 rank:"; tail -20 "$tmp/one.log"; status=1; }
"$hooprun" -np 2 --timeout 120 "$python" "$ex/horovod_mnist.py" --steps 10 --fp16 \
  --train-limit 2048 >"$tmp/fp16.log" 2>&1 && grep -q 'test accuracy.*fp16' "$tmp/fp16.log" || {
  echo "FAIL: horovod_mnist.py --fp16:"; tail -20 "$tmp/fp16.log"; status=1; }
cat "$tmp/four.log" "$tmp/one.log" "$tmp/fp16.log" | grep 'epoch'
if [ -f "$tmp/four.pt" ] && [ -f "$tmp/one.pt" ]; then
  diff=$("$python" -c 'import sys, torch
a, b = torch.load(sys.argv[1]), torch.load(sys.argv[2])
print("%.3g" % max((a[k] - b[k]).abs().max().item() for k in a))' "$tmp/one.pt" "$tmp/four.pt")
  echo "horovod_mnist.py: 4 ranks and 1 rank differ by $diff after 30 steps"
  "$python" -c "import sys; sys.exit(0 if float('$diff') <= 1e-5 else 1)" || {
    echo "FAIL: more than 1e-5"; status=1; }
fi
# The torch.distributed program: the same loss lines on gloo and on hoop (2 ranks).
for backend in gloo hoop; do
  "$hooprun" -np 2 --timeout 120 "$python" "$ex/dist_mnist.py" --backend $backend --steps 20 \
    --train-limit 2048 >"$tmp/$backend.log" 2>&1 || {
    echo "FAIL: dist_mnist.py on $backend:"; tail -20 "$tmp/$backend.log"; status=1; }
done
gloo=$(grep -E 'loss' "$tmp/gloo.log" | sort)
hoop=$(grep -E 'loss' "$tmp/hoop.log" | sort)
if [ -z "$gloo" ] || [ "$gloo" != "$hoop" ]; then
  echo "FAIL: dist_mnist.py's loss lines differ:"; echo "gloo:"; echo "$gloo"; echo "hoop:"; echo "$hoop"
  status=1
else
  echo "dist_mnist.py: the same loss lines on gloo and on hoop:"; echo "$hoop"
fi
# The sharded trainer (ZeRO-3's pattern: all_gather_into_tensor, reduce_scatter_tensor): 4 ranks
# on hoop and on gloo print the same loss lines and end within 1e-5 of 1 rank's parameters, and
# so does hoop with --compress int8+feedback (a group of its own, a registered gradient: on one
# host nothing is compressed).
sharded="--global-batch 128 --hidden 256 --steps 20"
for run in "4 hoop" "4 gloo" "1 hoop" "4 hoop --compress int8+feedback"; do
  set -- $run
  "$hooprun" -np "$1" --timeout 120 "$python" "$ex/sharded_mnist.py" --backend "$2" $sharded \
    ${3:-} ${4:-} --save "$tmp/sharded-$1-$2${3:-}.pt" >"$tmp/sharded-$1-$2${3:-}.log" 2>&1 || {
    echo "FAIL: sharded_mnist.py on $1 ranks, $2 ${3:-} ${4:-}:"; tail -20 "$tmp/sharded-$1-$2${3:-}.log"; status=1; }
done
gloo=$(grep -E '\] epoch [0-9]+ loss' "$tmp/sharded-4-gloo.log")
hoop=$(grep -E '\] epoch [0-9]+ loss' "$tmp/sharded-4-hoop.log")
if [ -z "$hoop" ] || [ "$gloo" != "$hoop" ]; then
  echo "FAIL: sharded_mnist.py's loss lines differ:"; echo "gloo: $gloo"; echo "hoop: $hoop"; status=1
elif [ -f "$tmp/sharded-1-hoop.pt" ]; then
  diff=$("$python" -c 'import sys, torch
a = torch.load(sys.argv[1])
print("%.3g" % max((a - torch.load(p)).abs().max().item() for p in sys.argv[2:]))' \
    "$tmp/sharded-1-hoop.pt" "$tmp/sharded-4-hoop.pt" "$tmp/sharded-4-gloo.pt" \
    "$tmp/sharded-4-hoop--compress.pt")
  echo "sharded_mnist.py: the same loss on gloo and hoop ($hoop); 4 ranks and 1 rank differ by $diff"
  "$python" -c "import sys; sys.exit(0 if float('$diff') <= 1e-5 else 1)" || {
    echo "FAIL: more than 1e-5"; status=1; }
fi
# The pipeline (send/recv of activations and gradients, a GPipe schedule): 4 stages (a Linear
# layer each) on hoop and on gloo print the same loss line and end within 1e-5 of 1 stage's
# parameters; 5 stages for 4 Linear layers are refused, naming --linear.
pipeline="--batch 64 --micro 4 --hidden 256 --steps 20 --linear 4"
for run in "4 hoop" "4 gloo" "1 hoop"; do
  set -- $run
  "$hooprun" -np "$1" --timeout 120 "$python" "$ex/pipeline_mnist.py" --backend "$2" $pipeline \
    --save "$tmp/pipeline-$1-$2.pt" >"$tmp/pipeline-$1-$2.log" 2>&1 || {
    echo "FAIL: pipeline_mnist.py on $1 ranks, $2:"; tail -20 "$tmp/pipeline-$1-$2.log"; status=1; }
done
gloo=$(grep -E '\] epoch [0-9]+ loss' "$tmp/pipeline-4-gloo.log")
hoop=$(grep -E '\] epoch [0-9]+ loss' "$tmp/pipeline-4-hoop.log")
if [ -z "$hoop" ] || [ "$gloo" != "$hoop" ]; then
  echo "FAIL: pipeline_mnist.py's loss lines differ:"; echo "gloo: $gloo"; echo "hoop: $hoop"; status=1
elif [ -f "$tmp/pipeline-1-hoop.pt" ]; then
  diff=$("$python" -c 'import sys, torch
a = torch.load(sys.argv[1])
print("%.3g" % max((a - torch.load(p)).abs().max().item() for p in sys.argv[2:]))' \
    "$tmp/pipeline-1-hoop.pt" "$tmp/pipeline-4-hoop.pt" "$tmp/pipeline-4-gloo.pt")
  echo "pipeline_mnist.py: the same loss on gloo and hoop ($hoop); 4 stages and 1 differ by $diff"
  "$python" -c "import sys; sys.exit(0 if float('$diff') <= 1e-5 else 1)" || {
    echo "FAIL: more than 1e-5"; status=1; }
fi
out=$("$hooprun" -np 5 --timeout 120 "$python" "$ex/pipeline_mnist.py" $pipeline 2>&1)
echo "$out" | grep -q "5 stages for a classifier of 4 Linear layers: give --linear 5" || {
  echo "FAIL: 5 stages for 4 Linear layers were not refused by name:"; echo "$out" | tail -5; status=1; }
# The mixture of experts (tokens to their expert's rank and back with all_to_all_single, uneven
# splits): 4 ranks on hoop and on gloo print the same loss line and end within 1e-5 of one process
# running the 4 experts itself.
moe="--batch 32 --hidden 128 --steps 20"
for backend in hoop gloo; do
  "$hooprun" -np 4 --timeout 120 "$python" "$ex/moe_mnist.py" --backend $backend $moe \
    --save "$tmp/moe-$backend.pt" >"$tmp/moe-$backend.log" 2>&1 || {
    echo "FAIL: moe_mnist.py on $backend:"; tail -20 "$tmp/moe-$backend.log"; status=1; }
done
"$python" "$ex/moe_mnist.py" --experts 4 $moe --save "$tmp/moe-alone.pt" >"$tmp/moe-alone.log" \
  2>&1 || { echo "FAIL: moe_mnist.py --experts 4:"; tail -20 "$tmp/moe-alone.log"; status=1; }
gloo=$(grep -E '\] epoch [0-9]+ loss' "$tmp/moe-gloo.log")
hoop=$(grep -E '\] epoch [0-9]+ loss' "$tmp/moe-hoop.log")
if [ -z "$hoop" ] || [ "$gloo" != "$hoop" ]; then
  echo "FAIL: moe_mnist.py's loss lines differ:"; echo "gloo: $gloo"; echo "hoop: $hoop"; status=1
elif [ -f "$tmp/moe-alone.pt" ]; then
  diff=$("$python" -c 'import sys, torch
a = torch.load(sys.argv[1])
print("%.3g" % max((a - torch.load(p)).abs().max().item() for p in sys.argv[2:]))' \
    "$tmp/moe-alone.pt" "$tmp/moe-hoop.pt" "$tmp/moe-gloo.pt")
  echo "moe_mnist.py: the same loss on gloo and hoop ($hoop); 4 ranks and one process differ by $diff"
  "$python" -c "import sys; sys.exit(0 if float('$diff') <= 1e-5 else 1)" || {
    echo "FAIL: more than 1e-5"; status=1; }
fi
# The elastic example: rank 3 of 4 killed at step 100 (hooprun --min-np 2 --max-np 4): the job
# goes on with 3, takes the replacement in at a later commit, and finishes with 4.
"$hooprun" -np 4 --min-np 2 --max-np 4 --timeout 60 "$python" "$ex/elastic_mnist.py" \
  --kill 3:100 >"$tmp/elastic.log" 2>&1
grep -E '\] (reset|test accuracy)' "$tmp/elastic.log"
grep -q '\[0\] reset: 3 ranks' "$tmp/elastic.log" && grep -q '\[0\] reset: 4 ranks' "$tmp/elastic.log" &&
  grep -q '\[0\] test accuracy .* on 4 ranks' "$tmp/elastic.log" || {
  echo "FAIL: elastic_mnist.py did not shrink to 3 ranks and grow back to 4"
  tail -20 "$tmp/elastic.log"; status=1; }

# Horovod's own examples (examples/horovod: as published, but for the import and the data), on
# torchvision's FashionMNIST laid out from Debian's files: the MNIST program for an epoch on 2
# ranks; the synthetic benchmark (ResNet-18 with SyncBatchNorm, tiny batches) on 2; the elastic
# one on 4 ranks (--min-np 2 --max-np 4) with rank 3 SIGKILLed from outside after its 3rd log line:
# it must finish with a test accuracy, the replacement ([4]) having trained with the others (it
# makes its DistributedOptimizer while they sync it in, which once failed the job).
if ! "$python" -c 'import torchvision, filelock' 2>/dev/null; then
  echo "SKIP-PART: Horovod's examples: no torchvision or filelock for $python (Debian: apt-get install python3-torchvision python3-filelock)"
  exit $status
fi
hex=$src/examples/horovod
sh "$hex/prepare-data.sh" "$tmp/hvdata" >/dev/null || { echo "FAIL: prepare-data.sh"; exit 1; }
# Above 60%: one epoch of this model reaches 70-75% (73.8% on 1 rank), a broken average far less.
accuracy_ok() { # log: rank 0's last test accuracy, above 60%
  grep -o '^\[0\] Test set: .*Accuracy: [0-9.]*' "$1" | tail -1 | awk '{a = $NF} END {exit !(a + 0 > 60)}'
}
"$hooprun" -np 2 --timeout 120 "$python" "$hex/pytorch_mnist.py" --data-dir "$tmp/hvdata" \
  --epochs 1 --log-interval 100 >"$tmp/hvd-mnist.log" 2>&1 && accuracy_ok "$tmp/hvd-mnist.log" || {
  echo "FAIL: Horovod's pytorch_mnist.py on 2 ranks:"; tail -20 "$tmp/hvd-mnist.log"; status=1; }
grep '\] Test set' "$tmp/hvd-mnist.log"
"$hooprun" -np 2 --timeout 120 "$python" "$hex/pytorch_synthetic_benchmark.py" --model resnet18 \
  --batch-size 2 --num-warmup-batches 1 --num-batches-per-iter 2 --num-iters 2 \
  >"$tmp/hvd-bench.log" 2>&1 && grep '\[0\] Total img/sec on 2 CPU(s)' "$tmp/hvd-bench.log" || {
  echo "FAIL: Horovod's pytorch_synthetic_benchmark.py on 2 ranks:"; tail -20 "$tmp/hvd-bench.log"
  status=1; }
: >"$tmp/hvd-elastic.log" # there before the loop below reads it
"$hooprun" -np 4 --min-np 2 --max-np 4 --timeout 60 "$python" "$hex/pytorch_mnist_elastic.py" \
  --data-dir "$tmp/hvdata" --epochs 1 --log-interval 20 >"$tmp/hvd-elastic.log" 2>&1 &
job=$!
waited=0
while [ "$(grep -c '^\[3\] Train Epoch' "$tmp/hvd-elastic.log")" -lt 3 ] && [ $waited -lt 1200 ]; do
  sleep 0.1; waited=$((waited + 1))
done
victim=
for pid in $(pgrep -f pytorch_mnist_elastic.py); do
  tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | grep -qx 'HOOP_RANK=3' && victim=$pid
done
[ -n "$victim" ] && kill -KILL "$victim"
wait $job
code=$?
grep -E 'hooprun.*rank 3|\] Test set' "$tmp/hvd-elastic.log" | cut -c1-200
if [ -z "$victim" ] || [ $code != 0 ] || ! accuracy_ok "$tmp/hvd-elastic.log" ||
  ! grep -q '^\[4\] Train Epoch' "$tmp/hvd-elastic.log"; then
  echo "FAIL: Horovod's pytorch_mnist_elastic.py through a kill (rank 3: ${victim:-not found}; hooprun exited $code)"
  tail -20 "$tmp/hvd-elastic.log"; status=1
fi
exit $status
