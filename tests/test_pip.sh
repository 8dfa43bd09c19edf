#!/bin/sh
# The Python package as pip installs it: `pip install --no-build-isolation --no-index ./python`
# (offline, with Debian's setuptools and wheel) into a virtual environment made from
# /usr/bin/python3 (--system-site-packages: Debian's torch is seen there too). Then, with neither
# PYTHONPATH nor the build tree's _build.py to lean on, from outside the tree:
# - `import hoop` loads the package from the environment and changes no global hook;
# - it finds libhoop through pkg-config (a hoop.pc whose libdir is this build's) and through
#   HOOP_LIBRARY, and fails with a message naming HOOP_LIBRARY when neither leads to it;
# - a 3-rank job of the environment's python allreduces odd floats and checks the sum.
# Skipped (77) under the sanitizers (an ASan-built libhoop cannot load into a python that is not),
# and where python3's venv, setuptools and wheel or pkg-config are missing, as the other Python
# suites are without torch (CI installs them: .ci/run).
set -u
src=${HOOP_SRCDIR:-.}
build=$(cd "${HOOP_BUILDDIR:-.}" && pwd)
python=${HOOP_PYTHON:-/usr/bin/python3}
if [ "${HOOP_SANITIZED:-no}" = yes ]; then
  echo "SKIP: libhoop is built with the sanitizers, which $python cannot load"; exit 77
fi
for need in "$python -c 'import venv, ensurepip, wheel, setuptools'" "pkg-config --version"; do
  if ! sh -c "$need" >/dev/null 2>&1; then
    echo "SKIP: '$need' fails (Debian: apt-get install python3-venv python3-wheel pkg-config)"
    exit 77
  fi
done
tmp=$(mktemp -d "${TMPDIR:-/tmp}/hoop-pip.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
status=0
fail() { echo "FAIL: $*"; status=1; }

cp -r "$src/python" "$tmp/src" && rm -f "$tmp/src/hoop/_build.py"
"$python" -m venv --system-site-packages "$tmp/env" || { echo "FAIL: python3 -m venv"; exit 1; }
if ! "$tmp/env/bin/pip" install --no-build-isolation --no-index -q "$tmp/src" >"$tmp/pip.log" 2>&1
then
  cat "$tmp/pip.log"; echo "FAIL: pip install ./python"; exit 1
fi
mkdir -p "$tmp/pc" "$tmp/run"
cat >"$tmp/pc/hoop.pc" <<PC
libdir=$build/lib/.libs
Name: hoop
Description: this build's libhoop
Version: 0
Libs: -L\${libdir} -lhoop
PC
cd "$tmp/run" || exit 1
check='import sys; before = sys.excepthook
import hoop
assert hoop.__file__.startswith(sys.argv[1]), hoop.__file__
assert sys.excepthook is before, "import hoop changed sys.excepthook"
print("loaded", hoop.__file__, hoop.library_version())'
out=$(env -u PYTHONPATH -u HOOP_LIBRARY PKG_CONFIG_PATH="$tmp/pc" "$tmp/env/bin/python" -c "$check" \
  "$tmp/env/lib") || fail "import hoop through pkg-config: $out"
echo "  pkg-config: $out"
out=$(env -u PYTHONPATH PKG_CONFIG_PATH=/nonexistent HOOP_LIBRARY="$build/lib/.libs/libhoop.so.1" \
  "$tmp/env/bin/python" -c "$check" "$tmp/env/lib") || fail "import hoop through HOOP_LIBRARY: $out"
echo "  HOOP_LIBRARY: $out"
out=$(env -u PYTHONPATH -u HOOP_LIBRARY PKG_CONFIG_PATH=/nonexistent LD_LIBRARY_PATH= \
  "$tmp/env/bin/python" -c 'import hoop' 2>&1) && fail "import hoop with no libhoop to find passed"
echo "$out" | grep -q 'Set HOOP_LIBRARY' || fail "no libhoop: the error does not say what to set: $out"

job='import array, hoop
c = hoop.init()
x = array.array("d", [0.1 * (c.rank + 1) + 1e-9 * i for i in range(1001)])
c.allreduce(x, name="grads")
want = [sum(0.1 * (r + 1) + 1e-9 * i for r in range(c.size)) for i in range(1001)]
bad = [i for i in range(1001) if abs(x[i] - want[i]) > 1e-12]
print("rank %d of %d: %d wrong" % (c.rank, c.size, len(bad)))
c.finalize()'
out=$(env -u PYTHONPATH -u HOOP_LIBRARY PKG_CONFIG_PATH="$tmp/pc" "$build/tools/hooprun" -np 3 \
  --timeout 60 "$tmp/env/bin/python" -c "$job" 2>&1)
echo "$out" | sed 's/^/  /'
[ "$(echo "$out" | grep -c ' of 3: 0 wrong')" = 3 ] || fail "the environment's 3-rank job"
exit $status
