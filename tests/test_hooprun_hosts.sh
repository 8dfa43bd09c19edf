#!/bin/sh
# hooprun with host lists, without root or other machines: a stand-in remote shell that drops the
# host name and runs the rest here, and one that joins its words into a shell line as ssh does.
# Checks placement (ranks fill hosts in order, HOOP_HOSTNAME), -H and --hostfile parsing and their
# errors, quoting for ssh, a real job over the stand-in hosts, and the report of a failed rank;
# --bind-to and --map-by on made-up machines, for ranks hooprun starts and ranks that bind
# themselves; and, on this host alone, how hooprun fits its ranks' descriptors under the open-file limit.
set -u
build=${HOOP_BUILDDIR:-.}
hooprun=$build/tools/hooprun
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0
fail() {
  echo "FAIL: $*"
  failures=$((failures + 1))
}
# expect NAME FILE: FILE must hold exactly the lines on stdin.
expect() {
  if ! diff -u - "$2" >"$work/diff"; then
    fail "$1: unexpected output (- expected, + got):"
    cat "$work/diff"
  fi
}

printf '#!/bin/sh\nshift\nexec "$@"\n' >"$work/stand-in"
mkdir "$work/bin"
printf '#!/bin/sh\nshift\nexec sh -c "$*"\n' >"$work/bin/ssh"
chmod +x "$work/stand-in" "$work/bin/ssh"
# The embedded server's address for other hosts: loopback will do for stand-ins.
export HOOP_IFNAME==lo

# Ranks fill the hosts in order, each up to its slots.
"$hooprun" --rsh "$work/stand-in" -H hosta:2,hostb,hostc:3 -np 5 \
  sh -c 'echo "$HOOP_RANK $HOOP_HOSTNAME $HOOP_SIZE"' 2>&1 | sort >"$work/out"
expect "-H placement" "$work/out" <<'OUT'
[0] 0 hosta 5
[1] 1 hosta 5
[2] 2 hostb 5
[3] 3 hostc 5
[4] 4 hostc 5
OUT

# The same hosts from a file; -np defaults to every slot.
cat >"$work/hosts" <<'HOSTS'
# a comment, then a blank line

hosta slots=2   # two ranks
hostb
  hostc slots=3
HOSTS
"$hooprun" --rsh "$work/stand-in" --hostfile "$work/hosts" \
  sh -c 'echo "$HOOP_RANK $HOOP_HOSTNAME $HOOP_SIZE"' 2>&1 | sort >"$work/out"
expect "--hostfile placement" "$work/out" <<'OUT'
[0] 0 hosta 6
[1] 1 hosta 6
[2] 2 hostb 6
[3] 3 hostc 6
[4] 4 hostc 6
[5] 5 hostc 6
OUT

# Usage errors: exit 2 and a message that names the problem.
usage_error() {
  local name=$1 pattern=$2
  shift 2
  "$hooprun" "$@" true >"$work/out" 2>&1
  local code=$?
  [ $code = 2 ] && grep -q -e "$pattern" "$work/out" ||
    { fail "$name: expected exit 2 and '$pattern', got $code:"; cat "$work/out"; }
}
usage_error "more ranks than slots" "more than the 3 slots" -np 4 -H a:2,b
usage_error "bad slots" "does not end in :SLOTS" -H a:0
printf 'a\nb slot=3\n' >"$work/hosts.bad"
usage_error "bad hostfile line" "hosts.bad:2: 'slot=3' is not slots=N" --hostfile "$work/hosts.bad"
usage_error "missing hostfile" "cannot open" --hostfile "$work/none"
usage_error "bad --rendezvous" "is not host:port" --rendezvous nohostport
# A host name that the remote shell would read as an option, from -H or a host file.
usage_error "host as an option" "starts with '-'" -H "-oProxyCommand=touch $work/pwned:2"
printf -- '-oProxyCommand=true slots=2\n' >"$work/hosts.opt"
usage_error "host file line as an option" "starts with '-'" --hostfile "$work/hosts.opt"
[ ! -e "$work/pwned" ] || fail "a host name ran as a remote shell option"

# ssh joins its words into one shell line: hooprun quotes each of them.
PATH="$work/bin:$PATH" "$hooprun" -H far:1 -x "MSG=it's a \$HOME" \
  printf '%s|%s|\n' "a  b" "\$MSG" >"$work/out" 2>&1
expect "ssh quoting" "$work/out" <<'OUT'
[0] a  b|$MSG|
OUT
PATH="$work/bin:$PATH" "$hooprun" -H far:1 -x "MSG=it's a \$HOME" \
  sh -c 'echo "$MSG"' >"$work/out" 2>&1
expect "ssh quoting of -x" "$work/out" <<'OUT'
[0] it's a $HOME
OUT

# A real job on two stand-in hosts of two ranks: local ranks follow the host list.
"$hooprun" --rsh "$work/stand-in" -H hosta:2,hostb:2 --timeout 60 \
  "$build/tests/coll_worker" --quick --ranks-per-host 2 >"$work/out" 2>&1 ||
  { fail "coll_worker on 2 hosts x 2:"; cat "$work/out"; }
[ "$(grep -c 'checks, 0 failed$' "$work/out")" = 4 ] ||
  { fail "coll_worker on 2 hosts x 2: not 4 passing ranks:"; cat "$work/out"; }

# A rank on another host that fails is named with its host, and its status is hooprun's.
"$hooprun" --rsh "$work/stand-in" -H hosta,hostb \
  sh -c 'if [ "$HOOP_RANK" = 1 ]; then exit 3; fi; sleep 30' >"$work/out" 2>&1
code=$?
[ $code = 3 ] &&
  grep -q "^hooprun: rank 1 on hostb (pid [0-9]*) exited with status 3$" "$work/out" ||
  { fail "failed remote rank: expected exit 3 and a message naming rank 1 on hostb, got $code:"
    cat "$work/out"; }

# --bind-to: hooprun binds the ranks it starts here, and ranks on other hosts bind themselves in
# hoop_init_from_env. The machine is made up (HOOP_SYSFS): CPUs 0 and 1 are two cores of two
# sockets, or one core's two threads; the ranks run on CPUs 0 and 1 (taskset).
for cpu in 0 1; do
  mkdir -p "$work/sys2/devices/system/cpu/cpu$cpu/topology" \
    "$work/sys2/devices/system/cpu/cpu$cpu/node$cpu" \
    "$work/sys1/devices/system/cpu/cpu$cpu/topology" "$work/sys1/devices/system/cpu/cpu$cpu/node0"
  echo "$cpu" >"$work/sys2/devices/system/cpu/cpu$cpu/topology/physical_package_id"
  echo 0 >"$work/sys2/devices/system/cpu/cpu$cpu/topology/core_id"
  echo 0 >"$work/sys1/devices/system/cpu/cpu$cpu/topology/physical_package_id"
  echo 0 >"$work/sys1/devices/system/cpu/cpu$cpu/topology/core_id"
done
cpus='grep Cpus_allowed_list /proc/self/status | sed "s/^/$HOOP_RANK /"'
HOOP_SYSFS=$work/sys2 taskset -c 0,1 "$hooprun" -np 2 --bind-to core sh -c "$cpus" 2>&1 |
  sort >"$work/out"
expect "--bind-to core" "$work/out" <<'OUT'
[0] 0 Cpus_allowed_list:	0
[1] 1 Cpus_allowed_list:	1
OUT
HOOP_SYSFS=$work/sys2 taskset -c 0,1 "$hooprun" -np 3 --bind-to socket --map-by socket \
  sh -c "$cpus" 2>&1 | sort >"$work/out"
expect "--bind-to socket --map-by socket" "$work/out" <<'OUT'
[0] 0 Cpus_allowed_list:	0
[1] 1 Cpus_allowed_list:	1
[2] 2 Cpus_allowed_list:	0
OUT
HOOP_SYSFS=$work/sys1 taskset -c 0,1 "$hooprun" -np 2 --bind-to core sh -c "$cpus" >"$work/out" 2>&1
code=$?
[ $code = 2 ] && ! grep -q Cpus_allowed "$work/out" &&
  grep -q "^hooprun: --bind-to core: 2 ranks on this host bound to a core each, but the 2 CPUs allowed (0-1) make 1 core; bind to none" "$work/out" ||
  { fail "--bind-to core, 2 ranks on one core: expected exit 2, no rank started, a message; got $code:"
    cat "$work/out"; }
HOOP_SYSFS=$work/sys1 taskset -c 0,1 "$hooprun" -np 2 --bind-to none sh -c "$cpus" 2>&1 |
  sort >"$work/out"
expect "--bind-to none" "$work/out" <<'OUT'
[0] 0 Cpus_allowed_list:	0-1
[1] 1 Cpus_allowed_list:	0-1
OUT
# A taskset around hooprun: its ranks learn how many CPUs they share (HOOP_HOST_CPUS), and with
# more ranks than that libhoop takes the host as crowded (shm fences every message), as it does
# where the CPUs online are fewer than the ranks; a user's HOOP_HOST_CPUS wins.
if [ "$(nproc --all)" -gt 1 ]; then
  taskset -c 0 "$hooprun" -np 2 sh -c 'echo "$HOOP_RANK ${HOOP_HOST_CPUS:-unset}"' 2>&1 |
    sort >"$work/out"
  expect "taskset -c 0: HOOP_HOST_CPUS" "$work/out" <<'OUT'
[0] 0 1
[1] 1 1
OUT
  taskset -c 0 "$hooprun" -np 1 -x HOOP_HOST_CPUS=7 sh -c 'echo "$HOOP_HOST_CPUS"' >"$work/out" 2>&1
  expect "-x HOOP_HOST_CPUS=7" "$work/out" <<'OUT'
[0] 7
OUT
  crowded=$(HOOP_DEBUG=trace taskset -c 0 "$hooprun" -np 2 "$build/tests/coll_worker" --quick 2>&1 |
    grep -c "shm: this host's ranks outnumber its CPUs")
  [ "$crowded" = 2 ] || fail "taskset -c 0, 2 ranks: $crowded of 2 ranks took the host as crowded"
fi
usage_error "bad --bind-to" "--bind-to: 'hwthread' is not none, core, socket or numa" --bind-to hwthread -np 1
usage_error "bad --map-by" "--map-by: 'ppr:1:node' is not core, slot, socket or numa" --map-by ppr:1:node -np 1
# Ranks on two stand-in hosts, started through the remote shell, bind themselves; HOOP_DEBUG=info
# says where each runs.
HOOP_SYSFS=$work/sys2 HOOP_DEBUG=info taskset -c 0,1 "$hooprun" --rsh "$work/stand-in" \
  -H hosta:2,hostb:1 --bind-to core "$build/bench/hoop-bench" allreduce -s 8 -n 2 -w 1 -c 1 \
  >"$work/bench" 2>&1 || { fail "--bind-to core on stand-in hosts:"; cat "$work/bench"; }
sed -n 's/^\(\[[0-9]\]\) hoop rank [0-9]* [0-9.]* INFO init: runs on \(CPUs [0-9-]*\) .*, \(HOOP_BIND_TO=core\)$/\1 \2 \3/p' \
  "$work/bench" | sort >"$work/out"
expect "--bind-to core on stand-in hosts" "$work/out" <<'OUT'
[0] CPUs 0 HOOP_BIND_TO=core
[1] CPUs 1 HOOP_BIND_TO=core
[2] CPUs 0 HOOP_BIND_TO=core
OUT
HOOP_SYSFS=$work/sys1 taskset -c 0,1 "$hooprun" --rsh "$work/stand-in" -H hosta:2 --bind-to core \
  "$build/bench/hoop-bench" allreduce -s 8 -n 2 -w 1 -c 1 >"$work/out" 2>&1
code=$?
[ $code != 0 ] && grep -q "HOOP_BIND_TO=core: 2 ranks on this host bound to a core each, but the 2 CPUs allowed (0-1) make 1 core" "$work/out" ||
  { fail "--bind-to core, 2 ranks of a stand-in host on one core: expected a failure saying why; got $code:"
    cat "$work/out"; }

# hooprun holds 3 descriptors per rank (its stdout and stderr, its rendezvous connection): under a
# soft limit of 40, 16 ranks still run, as hooprun raises the limit (before, one rank failed
# with "Connection reset by peer"); under a hard limit of 40, below the ranks' own 48,
# hooprun says so and starts none.
prlimit --nofile=40: "$hooprun" -np 16 "$build/bench/hoop-bench" allreduce -s 8 -n 2 -w 1 -c 1 \
  >"$work/out" 2>&1 || { fail "16 ranks under a soft limit of 40 open files:"; cat "$work/out"; }
# Under a hard limit of 50, 12 ranks (36 descriptors) still fit: hooprun warns and runs them.
prlimit --nofile=50:50 "$hooprun" -np 12 "$build/bench/hoop-bench" allreduce -s 8 -n 2 -w 1 -c 1 \
  >"$work/out" 2>&1 &&
  grep -q "^hooprun: warning: the open-file limit is 50 (its hard limit 50), under the 52" \
    "$work/out" ||
  { fail "12 ranks under a hard limit of 50: expected a warning and a job that runs:"
    cat "$work/out"; }
prlimit --nofile=40:40 "$hooprun" -np 16 sh -c 'echo started' >"$work/out" 2>&1
code=$?
[ $code = 1 ] && ! grep -q started "$work/out" &&
  grep -q "^hooprun: 16 ranks need about 64 open files here (3 each), but the limit is 40 and its hard limit 40: raise" "$work/out" ||
  { fail "16 ranks under a hard limit of 40: expected exit 1 and a message, got $code:"
    cat "$work/out"; }

[ $failures = 0 ] || exit 1
echo "hooprun host lists: all passed"
