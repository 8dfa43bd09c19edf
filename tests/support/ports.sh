# ports.sh - sourced by the bash tests: reserve_port [COUNT] sets PORT to a TCP port P, with
# P .. P + COUNT - 1 all reserved for this shell, the way procs_free_port (procs.h) reserves them:
# below the kernel's ephemeral range (which bind to port 0 and outgoing connections draw from),
# each locked (flock) through a file named for it in /tmp/hoop-test-ports on a descriptor this
# shell keeps open until it exits, and none listening now. Fails (returns 1) if none could be had.
reserve_port() {
  local count=${1:-1} dir=/tmp/hoop-test-ports low first try p k fd ok
  local -a held
  low=$(cut -f1 /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || echo 32768)
  first=$((low - 12000 > 1024 ? low - 12000 : 1024))
  mkdir -p "$dir" 2>/dev/null && chmod 1777 "$dir" 2>/dev/null
  for try in $(seq 0 3999); do
    p=$((first + ($$ * 7919 + RANDOM + try * 131) % (low - first - count)))
    ok=1 held=()
    for k in $(seq 0 $((count - 1))); do
      fd=
      [ -e "$dir/$((p + k))" ] || { : >"$dir/$((p + k))" && chmod 666 "$dir/$((p + k))"; } 2>/dev/null
      if exec {fd}<"$dir/$((p + k))" 2>/dev/null && flock -n "$fd" &&
        ! (exec 3<>"/dev/tcp/127.0.0.1/$((p + k))") 2>/dev/null; then
        held+=("$fd")
      else
        [ -n "${fd:-}" ] && exec {fd}<&-
        ok=0
        break
      fi
    done
    if [ $ok = 1 ]; then
      PORT=$p
      return 0
    fi
    for fd in "${held[@]}"; do exec {fd}<&-; done
  done
  return 1
}
