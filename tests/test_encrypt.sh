#!/bin/sh
# test_encrypt.sh - HOOP_ENCRYPT (hoop-env(7)) in real jobs over TCP, with Debian's python3 and
# tests/python/encrypt_worker.py, which checks every allreduce and broadcast against values it
# computes. Each run below must end as it says:
#  - 3 ranks sealed with the default cipher (HOOP_ENCRYPT=1, and hooprun --encrypt), 2 through
#    hoop.Communicator(encrypt=...), and 2 with ChaCha20-Poly1305 over 4 streams: right
#    results; strace sees every byte the ranks send, and the marker the broadcast carries is in
#    none of them, where a run in clear shows it (so the check can see it);
#  - one rank in clear beside one sealed: refused, saying HOOP_ENCRYPT differs;
#  - a man in the middle (tests/support/tamper.c, preloaded into rank 1) changing a byte of a
#    sealed record, or sending a record twice: rank 0's call fails naming rank 1 and saying the
#    frame failed its check, rank 1's names rank 0, and no rank reports a wrong result;
#  - HOOP_ENCRYPT with HOOP_TRANSPORT=ibverbs, or a value that is not one, and hooprun -x
#    HOOP_TOKEN (the token on a command line): refused, saying why.
#  - the torch backend's ProcessGroupHoop.Options(encrypt=...): sealed (strace), right, and a
#    new_group asking for another setting refused.
# It skips without python3, strace or torch (after running the rest), and under the sanitizers (an
# ASan-built libhoop cannot load into a python that is not).
set -u
build=${HOOP_BUILDDIR:-.}
src=${HOOP_SRCDIR:-.}
python=${HOOP_PYTHON:-/usr/bin/python3}
hooprun=$build/tools/hooprun
worker=$src/tests/python/encrypt_worker.py
tamper=$build/tests/.libs/libtamper.so
if [ ! -x "$python" ]; then
  echo "SKIP: no $python (Debian: apt-get install python3)"; exit 77
fi
if [ "${HOOP_SANITIZED:-no}" = yes ]; then
  echo "SKIP: libhoop is built with the sanitizers, which $python cannot load"; exit 77
fi
if ! command -v strace >/dev/null 2>&1; then
  echo "SKIP: no strace (Debian: apt-get install strace)"; exit 77
fi
HOOP_LIBRARY=$build/lib/.libs/libhoop.so.1
PYTHONPATH=$src/python${PYTHONPATH:+:$PYTHONPATH}
export HOOP_LIBRARY PYTHONPATH
work=$(mktemp -d)
trap '[ -n "${HOOP_TEST_KEEP:-}" ] || rm -rf "$work"' EXIT
failures=0
fail() {
  echo "FAIL: $*"
  failures=$((failures + 1))
}

# sealed NP LABEL HOOPRUN-OPTION [VAR=value ...]: the run passes, and no send of it carries the
# marker.
sealed() {
  np=$1 label=$2 option=$3
  shift 3
  log=$work/sealed.log trace=$work/sealed.trace
  # shellcheck disable=SC2086
  env HOOP_TRANSPORT=tcp "$@" strace -f -qq -e trace=sendmsg,sendto,write,writev -s 100000 \
    -o "$trace" "$hooprun" -np "$np" --timeout 120 $option "$python" "$worker" 3 >"$log" 2>&1
  code=$?
  right=$(grep -c 'rounds right' "$log")
  sends=$(grep -c 'sendmsg\|sendto' "$trace")
  seen=$(grep -c 'hoop-plaintext-marker' "$trace")
  if [ "$code" != 0 ] || [ "$right" != "$np" ]; then
    fail "$label: exit $code, $right of $np ranks right"
    tail -n 15 "$log"
  elif [ "$seen" != 0 ] || [ "$sends" -lt 10 ]; then
    fail "$label: $seen of $sends sends carried the marker in clear"
  else
    echo "ok: $label: $np ranks right; none of $sends sends traced carried the marker"
  fi
}

# The check can see the marker: in clear, the broadcast's sends carry it.
HOOP_TRANSPORT=tcp strace -f -qq -e trace=sendmsg,sendto,write,writev -s 100000 \
  -o "$work/clear.trace" "$hooprun" -np 2 --timeout 120 "$python" "$worker" 1 >"$work/clear.log" 2>&1
seen=$(grep -c 'hoop-plaintext-marker' "$work/clear.trace")
if [ "$seen" -lt 1 ]; then
  fail "in clear, no send traced carried the marker: the sealed runs' check sees nothing"
  tail -n 5 "$work/clear.log"
else
  echo "ok: in clear, $seen sends traced carry the marker"
fi
sealed 3 "3 ranks, HOOP_ENCRYPT=1" --tag-output HOOP_ENCRYPT=1
sealed 3 "3 ranks, hooprun --encrypt" --encrypt
sealed 2 "2 ranks, hoop.Communicator(encrypt='chacha20poly1305')" --tag-output \
  PY_ENCRYPT=chacha20poly1305
sealed 2 "2 ranks, chacha20poly1305, 4 streams" --tag-output HOOP_ENCRYPT=chacha20poly1305 \
  HOOP_TCP_STREAMS=4

# The torch backend's option: ProcessGroupHoop.Options(encrypt=...) on the default group seals the
# job it joins (HOOP_ENCRYPT unset); a new_group asking for another setting is refused.
if "$python" -c 'import torch' 2>/dev/null; then
  HOOP_TRANSPORT=tcp strace -f -qq -e trace=sendmsg,sendto,write,writev -s 100000 \
    -o "$work/torch.trace" "$hooprun" -np 2 --timeout 120 "$python" \
    "$src/tests/python/encrypt_torch.py" chacha20poly1305 >"$work/torch.log" 2>&1
  code=$?
  right=$(grep -c 'encrypt torch rank .: right' "$work/torch.log")
  seen=$(grep -c 'hoop-plaintext-marker' "$work/torch.trace")
  if [ "$code" != 0 ] || [ "$right" != 2 ] || [ "$seen" != 0 ]; then
    fail "torch backend, Options(encrypt='chacha20poly1305'): exit $code, $right of 2 right, $seen sends with the marker"
    grep -v ' TRACE \| INFO ' "$work/torch.log" | tail -n 8
  else
    echo "ok: torch backend, Options(encrypt='chacha20poly1305'): 2 ranks right, no send with the marker, a new_group asking for another setting refused"
  fi
else
  torch_missing=yes
fi

# One rank in clear, one sealed.
HOOP_ENCRYPT=1 HOOP_TRANSPORT=tcp "$hooprun" -np 2 --timeout 30 sh -c \
  'if [ "$HOOP_RANK" = 1 ]; then HOOP_ENCRYPT=0; export HOOP_ENCRYPT; fi; exec "$0" "$@"' \
  "$python" "$worker" 1 >"$work/mixed.log" 2>&1
code=$?
if [ "$code" = 0 ] || ! grep -q 'every rank of a job must use the same HOOP_ENCRYPT' "$work/mixed.log"; then
  fail "a rank in clear beside a sealed one: exit $code"
  tail -n 8 "$work/mixed.log"
else
  echo "ok: a rank in clear beside a sealed one: refused ($(grep -m 1 -o 'rank [0-9] seals its connections with [^;]*' "$work/mixed.log"))"
fi

# A man in the middle of rank 1's sends.
for mode in flip replay; do
  log=$work/tamper-$mode.log
  HOOP_ENCRYPT=1 HOOP_TRANSPORT=tcp TAMPER=$mode TAMPER_AT=5 TAMPER_LIB=$tamper \
    "$hooprun" -np 2 --timeout 60 sh -c \
    'if [ "$HOOP_RANK" = 1 ]; then LD_PRELOAD=$TAMPER_LIB; export LD_PRELOAD; fi; exec "$0" "$@"' \
    "$python" "$worker" 8 >"$log" 2>&1
  code=$?
  done_it=$(grep -c '^\[1\] tamper: ' "$log")
  zero=$(grep -c '^\[0\] encrypt worker rank 0: round [0-9]* failed: .*lost rank 1 .*an encrypted frame failed its check' "$log")
  one=$(grep -c '^\[1\] encrypt worker rank 1: round [0-9]* failed: .*rank 0' "$log")
  wrong=$(grep -c 'WRONG' "$log")
  if [ "$code" = 0 ] || [ "$done_it" != 1 ] || [ "$zero" != 1 ] || [ "$one" != 1 ] || [ "$wrong" != 0 ]; then
    fail "$mode: exit $code, tampered $done_it, rank 0 named rank 1 $zero, rank 1 named rank 0 $one, wrong results $wrong"
    grep -v ' TRACE \| INFO ' "$log" | tail -n 12
  else
    echo "ok: $mode: $(grep -m 1 -o 'tamper: .*' "$log"); rank 0: $(grep -m 1 -o 'round [0-9]* failed: .*lost rank 1[^:]*' "$log"): ...failed its check; rank 1 failed naming rank 0; nothing wrong delivered"
  fi
done

# Refusals.
out=$(HOOP_ENCRYPT=1 HOOP_TRANSPORT=ibverbs "$hooprun" -np 2 --timeout 30 "$python" "$worker" 1 2>&1)
echo "$out" | grep -q 'RDMA carries data in clear' ||
  fail "HOOP_ENCRYPT with HOOP_TRANSPORT=ibverbs was not refused: $(echo "$out" | tail -n 3)"
out=$(HOOP_ENCRYPT=rot13 HOOP_TRANSPORT=tcp "$hooprun" -np 2 --timeout 30 "$python" "$worker" 1 2>&1)
echo "$out" | grep -q "HOOP_ENCRYPT 'rot13': not 0, 1, aes256gcm or chacha20poly1305" ||
  fail "HOOP_ENCRYPT=rot13 was not refused: $(echo "$out" | tail -n 3)"
# hooprun -x HOOP_TOKEN would put the token on the remote shell's command line, seen in ps.
out=$("$hooprun" -np 1 -x HOOP_TOKEN=not-here true 2>&1)
code=$?
[ "$code" = 2 ] && echo "$out" | grep -q 'the token would show on the ranks. command lines' ||
  fail "hooprun -x HOOP_TOKEN=...: exit $code: $out"
[ "$failures" = 0 ] &&
  echo "ok: HOOP_ENCRYPT with ibverbs, HOOP_ENCRYPT=rot13 and hooprun -x HOOP_TOKEN: refused, saying why"

echo "test_encrypt.sh: $failures failures"
[ "$failures" = 0 ] || exit 1
if [ "${torch_missing:-no}" = yes ]; then
  echo "SKIP: the torch backend's option: $python has no torch (Debian: apt-get install python3-torch); the rest passed"
  exit 77
fi
