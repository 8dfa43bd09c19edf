#!/bin/bash
# A real Slurm cluster of four hosts made of network namespaces (10.77.0.1..4 on a bridge, as in
# netns-test.sh), each with its own host name (a UTS namespace) and Debian's slurmd; slurmctld on
# the first, one munged for all. Then, with no hoopd and no HOOP_ variable (hoop_init_from_env
# reads Slurm's and meets at the first node of the step, on a port Slurm reserved for it):
#   1. srun -N 4 --ntasks-per-node=2 of the collectives check (coll_worker): 8 ranks, 2 per host,
#      shared memory within a host and TCP between hosts;
#   2. sbatch of examples/slurm/sgd.sbatch: the SGD example on Fashion-MNIST, 4 nodes x 2 ranks;
#   3. a rank SIGKILLed mid-job: every other rank ends within HOOP_TIMEOUT + 1 s, naming it, and
#      srun reports the failing task;
#   4. scancel of a running step, and a job past its time limit: no rank left behind.
# Needs root, ip netns, Debian's slurmd, slurmctld, slurm-client and munge; skipped (exit 77)
# otherwise. SLURM_TEST_KEEP=1 keeps the logs ($work) for a look afterwards.
set -u
build=$(cd "${HOOP_BUILDDIR:-.}" && pwd)
src=$(cd "${HOOP_SRCDIR:-.}" && pwd)
worker=$build/tests/coll_worker
bench=$build/bench/hoop-bench

skip() {
  echo "SKIP: $*"
  exit 77
}
[ "$(id -u)" = 0 ] || skip "needs root to make network namespaces and run Slurm's daemons"
for t in ip nsenter unshare slurmctld slurmd srun sbatch scontrol squeue scancel sinfo munged mungekey; do
  command -v $t >/dev/null 2>&1 || PATH=$PATH:/usr/sbin command -v $t >/dev/null 2>&1 ||
    skip "'$t' not found (Debian: apt-get install slurmd slurmctld slurm-client munge iproute2)"
done
export PATH=$PATH:/usr/sbin

. "$src/tests/support/netns-lib.sh"
netns_hosts= netns_switch=
tag=sl$$
work=$(mktemp -d)
chmod 755 "$work"
munged_pid=
failed=0

cleanup() {
  # Whatever still runs in our namespaces (the daemons, any rank) is ours.
  netns_remove
  [ -n "$munged_pid" ] && kill "$munged_pid" 2>/dev/null
  if [ "${SLURM_TEST_KEEP:-0}" = 1 ]; then echo "logs kept in $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

fail() {
  echo "FAIL: $*"
  failed=1
}

netns_make "$tag" 2>"$work/err" || skip "cannot build the namespaces (ip netns, veth, bridge): $(cat "$work/err")"

# The hosts' /etc/hosts (bind-mounted over the real one for every command on them): the ranks
# find the first node of their step by name, as on a cluster.
{
  echo "127.0.0.1 localhost"
  for j in 1 2 3 4; do echo "10.77.0.$j node$j"; done
} >"$work/hosts"

# ---- munge: one daemon, a key of this test's own ------------------------------------------------
mkdir -p "$work/munge"
mungekey --create --keyfile="$work/munge/munge.key" >/dev/null 2>&1 || skip "mungekey --create failed"
chown -R munge:munge "$work/munge" 2>/dev/null || skip "no user 'munge' (apt-get install munge)"
chmod 600 "$work/munge/munge.key"
runuser -u munge -- munged --socket="$work/munge/munge.sock" --key-file="$work/munge/munge.key" \
  --pid-file="$work/munge/munged.pid" --log-file="$work/munge/munged.log" \
  --seed-file="$work/munge/seed" || skip "munged did not start: $(tail -3 "$work/munge/munged.log")"
munged_pid=$(cat "$work/munge/munged.pid")

# ---- slurm.conf ------------------------------------------------------------------------------
mkdir -p "$work/ctld" "$work/out" "$work"/slurmd-node1 "$work"/slurmd-node2 "$work"/slurmd-node3 \
  "$work"/slurmd-node4
export SLURM_CONF=$work/slurm.conf
cat >"$SLURM_CONF" <<EOF
ClusterName=hooptest
SlurmctldHost=node1(10.77.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$work/munge/munge.sock
StateSaveLocation=$work/ctld
SlurmdSpoolDir=$work/slurmd-%n
SlurmctldPidFile=$work/slurmctld.pid
SlurmdPidFile=$work/slurmd-%n.pid
SlurmctldLogFile=$work/slurmctld.log
SlurmdLogFile=$work/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
MpiParams=ports=12000-12999
ReturnToService=2
KillWait=2
MessageTimeout=20
MinJobAge=300
NodeName=node1 NodeAddr=10.77.0.1 CPUs=2 RealMemory=512 State=UNKNOWN
NodeName=node2 NodeAddr=10.77.0.2 CPUs=2 RealMemory=512 State=UNKNOWN
NodeName=node3 NodeAddr=10.77.0.3 CPUs=2 RealMemory=512 State=UNKNOWN
NodeName=node4 NodeAddr=10.77.0.4 CPUs=2 RealMemory=512 State=UNKNOWN
PartitionName=debug Nodes=node[1-4] Default=YES MaxTime=INFINITE OverSubscribe=FORCE:2 State=UP
EOF

# A command on host i: its network namespace, its host name, its /etc/hosts. Not `ip netns exec`,
# which mounts a sysfs of the namespace's own over /sys and so hides the cgroup file systems that
# slurmd needs (it refuses to start without them).
on() {
  local i=$1
  shift
  nsenter --net="/run/netns/${tag}h$i" unshare --mount --uts sh -c \
    'hostname "$0" && mount --bind "$1" /etc/hosts && shift && exec "$@"' \
    "node$i" "$work/hosts" "$@"
}

on 1 slurmctld -D -c >"$work/slurmctld.out" 2>&1 &
for i in 1 2 3 4; do
  on "$i" slurmd -D -N "node$i" >"$work/slurmd-node$i.out" 2>&1 &
done
up=
for _ in $(seq 150); do
  if [ "$(on 1 sinfo -h -N -o '%T' 2>/dev/null | grep -c '^idle')" = 4 ]; then
    up=1
    break
  fi
  sleep 0.2
done
if [ -z "$up" ]; then
  on 1 sinfo -N 2>&1
  tail -20 "$work/slurmctld.log" "$work"/slurmd-node1.log "$work/slurmctld.out" 2>/dev/null
  echo "FAIL: the Slurm cluster did not come up"
  exit 1
fi
echo "== slurm: 4 nodes up: $(on 1 sinfo -h -o '%P %a %D %N %T' | tr '\n' ' ')"

now_ms() { echo $(($(date +%s%N) / 1000000)); }

# Rank processes still alive (zombies count as gone) of a program, in any of the hosts.
alive() {
  local name=$1 ns pid n=0
  for ns in $netns_hosts; do
    for pid in $(ip netns pids "$ns" 2>/dev/null); do
      [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$name" ] || continue
      [ "$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null)" = Z ] && continue
      n=$((n + 1))
    done
  done
  echo $n
}

# ---- 0. a job past its time limit (checked last) -------------------------------------------------
# Slurm ends a job 60-90 s after its limit of 1 minute: the job begins first and runs beside the
# others (the partition lets two jobs share a CPU: OverSubscribe=FORCE:2), its 8 ranks idle in
# their job (nb_worker --idle: initialised, no calls). Ranks busy in allreduce, as before, held
# both CPUs all that time, and the test waited for it alone; a step ended in the middle of its
# calls is the scancel case's.
echo "== slurm: a job with a time limit of 1 minute: 8 ranks idle in it"
limit_job=$(on 1 sbatch --parsable -t 1 -N 4 --ntasks-per-node=2 -o "$work/out/limit-%j.out" \
  --wrap "srun $build/tests/nb_worker --idle 600")
limit_t0=$(date +%s)
seen=0 ready=0 # the most nb_worker processes seen at once (12 once, under load); the ranks ready
for _ in $(seq 300); do
  n=$(alive nb_worker)
  [ "$n" -gt "$seen" ] && seen=$n
  ready=$(cat "$work/out/limit-$limit_job.out" 2>/dev/null | grep -c 'nb_worker rank [0-7] ready')
  [ "$seen" -ge 8 ] && [ "$ready" = 8 ] && break
  sleep 0.1
done
echo "  job $limit_job: $seen ranks running, $ready said ready, $(($(date +%s) - limit_t0)) s after sbatch"

# ---- 1. srun of the collectives check, with a token file as the README says ----------------------------------------------------------
echo "== slurm: srun -N 4 --ntasks-per-node=2 coll_worker --quick --ranks-per-host 2 (HOOP_TOKEN_FILE)"
export HOOP_TIMEOUT=20
(umask 077 && head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$work/token")
if on 1 env HOOP_TOKEN_FILE="$work/token" srun -N 4 --ntasks-per-node=2 -l "$worker" --quick \
  --ranks-per-host 2 >"$work/coll.out" 2>&1; then
  sort -n "$work/coll.out" | sed 's/^/  /'
  [ "$(grep -c ' 0 failed' "$work/coll.out")" = 8 ] || fail "srun coll_worker: not 8 ranks with 0 failed"
  ! grep -q 'has no token' "$work/coll.out" || fail "a rank with HOOP_TOKEN_FILE warned of no token"
else
  cat "$work/coll.out"
  fail "srun coll_worker exited non-zero"
fi

echo "== slurm: where the ranks met (HOOP_DEBUG=info)"
on 1 srun -N 4 --ntasks-per-node=1 --export=ALL,HOOP_DEBUG=info "$bench" broadcast -b 8 -e 8 -n 1 -w 0 \
  >"$work/where.out" 2>&1 || { cat "$work/where.out"; fail "srun hoop-bench broadcast"; }
grep -o "using Slurm's variables.*" "$work/where.out" | sort | sed 's/^/  /'
[ "$(grep -c "using Slurm's variables.*rendezvous node1:" "$work/where.out")" = 4 ] ||
  fail "the ranks did not meet at node1"
# No token here: rank 0 says once what that means, for the whole job.
grep -m1 -o 'job .* has no token.*' "$work/where.out" | sed 's/^/  /'
[ "$(grep -c 'has no token' "$work/where.out")" = 1 ] || fail "the job did not warn once of no token"

# ---- 2. sbatch: the SGD example on Fashion-MNIST -----------------------------------------------
echo "== slurm: sbatch examples/slurm/sgd.sbatch (4 nodes x 2 ranks, Fashion-MNIST)"
if [ -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]; then
  job=$(on 1 sbatch --parsable --wait -o "$work/out/sgd-%j.out" -D "$work/out" \
    --export=ALL,HOOP_SGD="$build/examples/sgd/sgd",SGD_EPOCHS=1 "$src/examples/slurm/sgd.sbatch")
  rc=$?
  out=$work/out/sgd-$job.out
  sed 's/^/  /' "$out" 2>/dev/null | tail -12
  [ $rc = 0 ] || fail "the sbatch job $job ended with $rc"
  grep -q 'test accuracy' "$out" 2>/dev/null || fail "no test accuracy in the job's output"
  grep -q 'sgd: 8 ranks' "$out" 2>/dev/null || fail "the job did not run 8 ranks"
else
  echo "SKIP-PART: the sbatch job: no dataset-fashion-mnist (apt-get install dataset-fashion-mnist)"
fi

# ---- 3. a rank killed: every other rank ends within HOOP_TIMEOUT + 1 s ------------------------
echo "== slurm: task 5 of 8 SIGKILLed under srun"
export HOOP_TIMEOUT=5
on 1 srun -N 4 --ntasks-per-node=2 "$bench" allreduce -b 64K -e 64K -n 1000000 -w 1 -c 0 \
  >"$work/kill.out" 2>"$work/kill.err" &
srun_pid=$!
victim=
for _ in $(seq 200); do
  for pid in $(ip netns pids "${tag}h3" 2>/dev/null); do
    [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = hoop-bench ] || continue
    tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | grep -qx 'SLURM_PROCID=5' && victim=$pid
  done
  # Running: every rank past hoop_init (the header line is printed after it).
  [ -n "$victim" ] && grep -q 'float32' "$work/kill.out" 2>/dev/null && break
  sleep 0.1
done
if [ -z "$victim" ]; then
  cat "$work/kill.out" "$work/kill.err"
  fail "task 5 never ran"
else
  kill -KILL "$victim"
  t0=$(now_ms)
  while [ "$(alive hoop-bench)" != 0 ] && [ $(($(now_ms) - t0)) -lt 30000 ]; do sleep 0.05; done
  took=$(($(now_ms) - t0))
  wait $srun_pid
  srun_rc=$?
  echo "  every rank gone $took ms after the kill (HOOP_TIMEOUT=$HOOP_TIMEOUT s); srun exit $srun_rc"
  grep -E 'task 5|peer|rank 5' "$work/kill.err" | sort | uniq -c | sort -rn | head -5 | sed 's/^/  /'
  [ "$took" -le $(((HOOP_TIMEOUT + 1) * 1000)) ] || fail "ranks outlived the kill by $took ms"
  [ "$srun_rc" != 0 ] || fail "srun exited 0 after a rank was killed"
  grep -q 'task 5' "$work/kill.err" || fail "srun did not report task 5"
fi

# ---- 4. scancel, and a time limit: nothing left behind ----------------------------------------
echo "== slurm: scancel of a running job step"
on 1 srun -N 4 --ntasks-per-node=2 -J hoop-cancel "$bench" allreduce -b 64K -e 64K -n 1000000 -w 1 -c 0 \
  >"$work/cancel.out" 2>&1 &
srun_pid=$!
for _ in $(seq 200); do
  grep -q 'float32' "$work/cancel.out" 2>/dev/null && [ "$(alive hoop-bench)" = 8 ] && break
  sleep 0.1
done
[ "$(alive hoop-bench)" = 8 ] || fail "the job to cancel never ran 8 ranks"
job=$(on 1 squeue -h -n hoop-cancel -o %i)
on 1 scancel "$job"
t0=$(now_ms)
while [ "$(alive hoop-bench)" != 0 ] && [ $(($(now_ms) - t0)) -lt 30000 ]; do sleep 0.05; done
took=$(($(now_ms) - t0))
wait $srun_pid
echo "  job $job cancelled: $(alive hoop-bench) ranks left $took ms later"
[ "$(alive hoop-bench)" = 0 ] || fail "ranks left behind after scancel"

echo "== slurm: the job past its time limit, begun with the others"
t0=$limit_t0
state=
# Asked at least once: under load the parts before this took longer than the 150 s allowed.
while :; do
  state=$(on 1 squeue -h -j "$limit_job" -t all -o %T 2>/dev/null)
  case $state in TIMEOUT | FAILED | COMPLETED | CANCELLED) break ;; esac
  [ $(($(date +%s) - t0)) -lt 150 ] || break
  sleep 1
done
job=$limit_job
for _ in $(seq 100); do
  [ "$(alive nb_worker)" = 0 ] && break
  sleep 0.1
done
echo "  job $job: $seen ranks ran ($ready said ready); $state after $(($(date +%s) - t0)) s; $(alive nb_worker) ranks left"
[ "$seen" -ge 8 ] && [ "$ready" = 8 ] || fail "job $job: not 8 ranks running in their job before the limit"
[ "$state" = TIMEOUT ] || fail "job $job ended $state, not TIMEOUT"
[ "$(alive nb_worker)" = 0 ] || fail "ranks left behind after the time limit"

[ $failed = 0 ] || exit 1
echo "== slurm: all passed"
