# netns-lib.sh - four hosts made of network namespaces, for tests/netns-test.sh and
# bench/fault-trials -N (sourced, not run). netns_make TAG builds hosts TAGh1..TAGh4 (10.77.0.1..4
# on a bridge that lives in a fifth, switch namespace TAGsw, so nothing of the machine's own
# network changes) and sets $netns_hosts and $netns_switch; it returns non-zero with the reason on
# stderr when it cannot. netns_remove kills whatever still runs in them and deletes them.

netns_remove() {
  local ns pids
  for ns in $netns_hosts $netns_switch; do
    pids=$(ip netns pids "$ns" 2>/dev/null)
    [ -n "$pids" ] && kill -KILL $pids 2>/dev/null
    ip netns del "$ns" 2>/dev/null
  done
}

netns_make() {
  local tag=$1 i=0 ns
  # Interface names stay under 16 bytes.
  netns_hosts="${tag}h1 ${tag}h2 ${tag}h3 ${tag}h4"
  netns_switch=${tag}sw
  ip netns add "$netns_switch" || return 1
  ip -n "$netns_switch" link add br0 type bridge || return 1
  ip -n "$netns_switch" link set br0 up || return 1
  for ns in $netns_hosts; do
    i=$((i + 1))
    ip netns add "$ns" || return 1
    ip link add "${tag}v$i" type veth peer name "${tag}p$i" || return 1
    ip link set "${tag}v$i" netns "$ns" || return 1
    ip link set "${tag}p$i" netns "$netns_switch" || return 1
    ip -n "$ns" link set "${tag}v$i" name eth0 || return 1
    ip -n "$ns" addr add "10.77.0.$i/24" dev eth0 || return 1
    ip -n "$ns" link set eth0 up || return 1
    ip -n "$ns" link set lo up || return 1
    ip -n "$netns_switch" link set "${tag}p$i" master br0 up || return 1
  done
  # The bridge (no STP) forwards as soon as its ports are up: wait until all four say so, without
  # ping, which a minimal Debian lacks.
  for _ in $(seq 50); do
    [ "$(bridge -n "$netns_switch" link show 2>/dev/null | grep -c 'state forwarding')" -ge 4 ] &&
      return 0
    sleep 0.1
  done
  return 0
}
