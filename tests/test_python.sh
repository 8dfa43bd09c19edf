#!/bin/sh
# The Python package (python/hoop) on 1 to 4 ranks under hooprun, with Debian's /usr/bin/python3:
# tests/python/worker.py runs every dtype and op, blocking and non-blocking, broadcast, allgather,
# barrier and the errors, checked against references computed in Python. Skipped (77) where there is
# no python3, and under the sanitizers (an ASan-built libhoop cannot load into a python that is not).
set -u
src=${HOOP_SRCDIR:-.}
build=${HOOP_BUILDDIR:-.}
python=${HOOP_PYTHON:-/usr/bin/python3}
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
exit $status
