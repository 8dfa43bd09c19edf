#!/bin/sh
# make install puts every file a user needs where it belongs, and make uninstall takes them all
# away: installed into a DESTDIR, the Python package must hold every module of python/hoop (a
# module missing from Makefile.am's lists installs a package that fails at import), the
# installed package must import and find the installed library, and nothing may be left after
# uninstall.
set -eu
src=${HOOP_SRCDIR:-.}
build=${HOOP_BUILDDIR:-.}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
dest="$work/root"
${MAKE:-make} -s -C "$build" install DESTDIR="$dest" >"$work/install.log" 2>&1 ||
  { cat "$work/install.log"; echo "FAIL: make install DESTDIR=$dest"; exit 1; }
fail() { echo "FAIL: $*"; exit 1; }
prefix=$(sed -n 's/^prefix=//p' "$build/hoop.pc")
# libdir as hoop.pc writes it: "${exec_prefix}/lib" by default, "${prefix}/lib/<triplet>" as
# Debian's packaging configures it; both expanded.
libdir=$(sed -n 's/^libdir=//p' "$build/hoop.pc" | sed "s|\${exec_prefix}|$prefix|; s|\${prefix}|$prefix|")
for f in bin/hooprun bin/hoopd bin/hoop-bench include/hoop.h include/hoop_version.h \
  share/man/man3/hoop.3 share/man/man1/hooprun.1 share/man/man1/hoop-bench.1 \
  share/man/man7/hoop-env.7 share/man/man8/hoopd.8; do
  test -e "$dest$prefix/$f" || fail "make install did not install $prefix/$f"
done
for f in libhoop.so libhoop.so.1 pkgconfig/hoop.pc; do
  test -e "$dest$libdir/$f" || fail "make install did not install $libdir/$f"
done
pkg=$(find "$dest" -path '*/hoop/__init__.py' | head -1)
if [ -n "$pkg" ]; then
  pydir=$(dirname "$(dirname "$pkg")")
  missing=$(cd "$src/python" && find hoop -name '*.py' | while read -r m; do
    test -e "$pydir/$m" || echo "$m"
  done)
  [ -z "$missing" ] || fail "the installed Python package lacks: $missing (add them to Makefile.am)"
  if [ "${HOOP_SANITIZED:-no}" = yes ]; then
    echo "the installed package not imported: libhoop is built with the sanitizers, which /usr/bin/python3 cannot load"
  else
    (cd "$work" && PYTHONPATH="$pydir" HOOP_LIBRARY="$dest$libdir/libhoop.so.1" /usr/bin/python3 -c '
import hoop, sys
assert hoop.__file__.startswith(sys.argv[1]), hoop.__file__
try:
    import torch  # noqa: F401
except ImportError:
    sys.exit(0)
import hoop.torch
print("the installed hoop.torch imports")' "$pydir") ||
      fail "the installed Python package does not import"
  fi
  echo "Python package: $(cd "$src/python" && find hoop -name '*.py' | wc -l) modules installed"
else
  echo "Python package not installed (configure --with-pythondir=no)"
fi
${MAKE:-make} -s -C "$build" uninstall DESTDIR="$dest" >"$work/uninstall.log" 2>&1 ||
  { cat "$work/uninstall.log"; fail "make uninstall"; }
left=$(find "$dest" -type f -o -type l)
[ -z "$left" ] || fail "make uninstall left: $left"
echo "make install installs the tools, library, header, pkg-config file, man pages and Python package; make uninstall removes them"
