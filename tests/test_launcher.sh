#!/bin/sh
# A job ends when its launcher does (issue: orphaned ranks after hooprun is SIGKILLed). hooprun -np 3
# starts ranks (tests/nb_worker) that either make no call for 60 s (idle) or allreduce in a loop
# (busy); once all three are ready, hooprun is killed with SIGKILL, and every rank must be gone
# within 5 s, each saying why on its stderr (kept in a file: hooprun's pipes die with it). Then the
# same job left alone must run to its end: the watch kills nothing while hooprun lives; a rank
# killed in a job leaves the others the moment to report it before hooprun stops them; a
# job whose hoopd (its rendezvous) is killed and started again. Last, a
# rank left out of an elastic job while hooprun lives says so instead of ending as if it were gone,
# and one stopped for good is stopped by hooprun once the others have finished.
set -u
build=${HOOP_BUILDDIR:-.}
worker=$build/tests/nb_worker
hooprun=$build/tools/hooprun
work=$(mktemp -d)
trap 'pkill -9 -f "$work/tag" 2>/dev/null; rm -rf "$work"' EXIT
status=0
now() { date +%s.%N; }
alive() { pgrep -f "$work/tag-$1" >/dev/null 2>&1; }

for mode in idle busy; do
  # The tag in the command line names this test's ranks for pgrep.
  "$hooprun" -np 3 --timeout 30 sh -c "exec \"$worker\" --$mode 60 \"$work/tag-$mode\" 2>\"$work/err-$mode.\$HOOP_RANK\"" \
    >"$work/out-$mode" 2>&1 &
  launcher=$!
  for _ in $(seq 1 200); do
    [ "$(grep -c ready "$work/out-$mode" 2>/dev/null)" = 3 ] && break
    sleep 0.1
  done
  if [ "$(grep -c ready "$work/out-$mode" 2>/dev/null)" != 3 ]; then
    echo "FAIL: $mode: the ranks did not start"; cat "$work/out-$mode"; status=1; kill -9 $launcher; continue
  fi
  kill -9 $launcher
  start=$(now)
  for _ in $(seq 1 100); do alive $mode || break; sleep 0.1; done
  took=$(awk -v a="$start" -v b="$(now)" 'BEGIN {printf "%.2f", b - a}')
  if alive $mode; then
    echo "FAIL: $mode: ranks still running $took s after hooprun was killed:"
    pgrep -af "$work/tag-$mode"; status=1
  else
    echo "$mode ranks: all gone $took s after hooprun was SIGKILLed"
    awk -v t="$took" 'BEGIN {exit !(t <= 5)}' || { echo "FAIL: more than 5 s"; status=1; }
  fi
  said=$(grep -l "launcher hooprun (pid $launcher) is gone" "$work"/err-$mode.* 2>/dev/null | wc -l)
  echo "  $said of 3 ranks said: $(grep -h 'is gone' "$work"/err-$mode.* | head -1)"
  [ "$said" -ge 1 ] || { echo "FAIL: no rank said that its launcher is gone"; status=1; }
done

# No false alarm: a job whose launcher lives runs to its end (idle 3 s, then finalize).
out=$("$hooprun" -np 3 --timeout 30 "$worker" --idle 3 "$work/tag-live" 2>&1)
code=$?
if [ $code != 0 ] || echo "$out" | grep -q "is gone"; then
  echo "FAIL: a job with its launcher alive was ended (exit $code):"; echo "$out"; status=1
else
  echo "a job whose launcher lives ran to its end"
fi

# A rank killed in the middle of a job: before hooprun stops the others, each gets the moment to
# report the loss itself (the ranks here do not ignore SIGTERM), naming the rank.
"$hooprun" -np 3 --timeout 30 sh -c "echo pid \$HOOP_RANK \$\$; exec \"$worker\" --busy 60 \"$work/tag-report\"" \
  >"$work/out-report" 2>&1 &
launcher=$!
for _ in $(seq 1 200); do
  [ "$(grep -c ready "$work/out-report" 2>/dev/null)" = 3 ] && break
  sleep 0.1
done
victim=$(sed -n 's/^\[1\] pid 1 \([0-9]*\)$/\1/p' "$work/out-report")
kill -9 "$victim"
start=$(now)
wait $launcher
code=$?
took=$(awk -v a="$start" -v b="$(now)" 'BEGIN {printf "%.2f", b - a}')
reported=$(grep -cE "^\[[02]\] rank [02] FAIL: hoop_allreduce returned .*rank 1" "$work/out-report")
if [ $code = 0 ] || [ "$reported" != 2 ] || ! awk -v t="$took" 'BEGIN {exit !(t <= 5)}'; then
  echo "FAIL: a killed rank: hooprun exited $code after $took s, $reported of 2 ranks reported it:"
  cat "$work/out-report"; status=1
else
  echo "a killed rank: both others reported it, and the job ended $took s after the kill"
fi

# A job whose rendezvous runs in hoopd outlives a restart of hoopd: only hooprun's process is
# watched there. hoopd is killed (SIGKILL) and started again on its port while the ranks allreduce
# in a loop; the job must run to its end, and no rank may say that its launcher is gone.
hoopd=$build/tools/hoopd
"$hoopd" --listen 127.0.0.1:0 >"$work/hoopd.1" 2>&1 &
hoopd_pid=$!
port=
for _ in $(seq 1 50); do
  port=$(sed -n 's/.*listening on 127\.0\.0\.1:\([0-9]*\).*/\1/p' "$work/hoopd.1")
  [ -n "$port" ] && break
  sleep 0.1
done
"$hooprun" -np 3 --timeout 10 --rendezvous 127.0.0.1:$port \
  sh -c "exec \"$worker\" --busy 4 \"$work/tag-hoopd\"" >"$work/out-hoopd" 2>&1 &
launcher=$!
for _ in $(seq 1 200); do
  [ "$(grep -c ready "$work/out-hoopd" 2>/dev/null)" = 3 ] && break
  sleep 0.1
done
kill -9 $hoopd_pid
wait $hoopd_pid 2>/dev/null
"$hoopd" --listen 127.0.0.1:$port >"$work/hoopd.2" 2>&1 &
hoopd_pid=$!
wait $launcher
code=$?
kill $hoopd_pid 2>/dev/null
if [ "$(grep -c ready "$work/out-hoopd")" != 3 ] || [ $code != 0 ] || grep -q "is gone" "$work/out-hoopd"; then
  echo "FAIL: a job at a restarted hoopd: hooprun exited $code; its output:"
  cat "$work/out-hoopd"; status=1
else
  echo "a job whose hoopd was killed and started again ran to its end"
fi

# Left out while hooprun lives: rank 2 of an elastic sgd run is stopped (SIGSTOP); the others
# time out on it, shrink without it after the grace and go on; resumed, rank 2 finds itself left
# out (its next call fails saying so, or its launcher watch sees the server close its connection
# while hooprun runs on): it must not take that for hooprun's death, and it fails on its own;
# hooprun --min-np 2 reports it and the run ends well.
sgd=$build/examples/sgd/sgd
"$hooprun" -np 3 --min-np 2 --timeout 3 "$sgd" --synthetic 60000 --epochs 4 --hidden 32 \
  --elastic >"$work/out-left" 2>&1 &
launcher=$!
victim=
for _ in $(seq 1 200); do
  victim=$(pgrep -P $launcher | sed -n 3p)
  grep -q "epoch 1:" "$work/out-left" && [ -n "$victim" ] && break
  sleep 0.1
done
if [ -z "$victim" ]; then
  echo "FAIL: left out: the run did not start"; cat "$work/out-left"; status=1
else
  kill -STOP "$victim"
  for _ in $(seq 1 200); do grep -q "going on with 2 of 3" "$work/out-left" && break; sleep 0.1; done
  kill -CONT "$victim"
  wait $launcher
  code=$?
  if [ $code != 0 ] || ! grep -q "going on with 2 of 3" "$work/out-left" ||
    ! grep -qE "this rank is out of the job|rank 2 was left out of generation" "$work/out-left" ||
    grep -q "is gone" "$work/out-left"; then
    echo "FAIL: left out: hooprun exited $code; its output:"; cat "$work/out-left"; status=1
  else
    echo "left out while hooprun lives: $(grep -m1 -oE 'the rendezvous server closed.*|rank 2 was left out of generation.*' "$work/out-left")"
  fi
fi

# The same rank stopped for good: the others finish, and hooprun, instead of waiting for ever,
# stops it HOOP_TIMEOUT + 1 s after the first of them ended; the job ends with 0.
"$hooprun" -np 3 --min-np 2 --timeout 3 "$sgd" --synthetic 60000 --epochs 6 --hidden 32 \
  --elastic >"$work/out-stopped" 2>&1 &
launcher=$!
victim=
for _ in $(seq 1 200); do
  victim=$(pgrep -P $launcher | sed -n 3p)
  grep -q "epoch 1:" "$work/out-stopped" && [ -n "$victim" ] && break
  sleep 0.1
done
if [ -z "$victim" ]; then
  echo "FAIL: stopped for good: the run did not start"; cat "$work/out-stopped"; status=1
else
  kill -STOP "$victim"
  ( sleep 90; kill -9 $launcher 2>/dev/null ) &
  guard=$!
  wait $launcher
  code=$?
  kill $guard 2>/dev/null
  if [ $code != 0 ] || ! grep -q "still running long after the others finished" "$work/out-stopped" ||
    kill -0 "$victim" 2>/dev/null; then
    echo "FAIL: stopped for good: hooprun exited $code; its output:"; cat "$work/out-stopped"
    kill -9 "$victim" 2>/dev/null; status=1
  else
    echo "stopped for good: $(grep -m1 -o 'hooprun: 1 rank still running.*' "$work/out-stopped")"
  fi
fi
exit $status
