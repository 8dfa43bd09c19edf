#!/bin/sh
# libhoop.so exports hoop.h's API and nothing else: every function hoop.h marks HOOP_API, and no
# internal symbol (hoop__*, or a stray global such as a transport's own function). Symbols that
# start with an underscore belong to the toolchain (_init, _fini, sanitizer hooks) and are skipped.
set -eu
src=${HOOP_SRCDIR:-.}
build=${HOOP_BUILDDIR:-.}
lib="$build/lib/.libs/libhoop.so"
test -e "$lib" || { echo "SKIP: no $lib (a static-only build)"; exit 77; }
exported=$(nm -D --defined-only "$lib" | awk '{print $NF}' | grep -v '^_' | sort)
declared=$(grep -o 'HOOP_API [^(]*\bhoop_[a-z_]*(' "$src/lib/hoop.h" | grep -o 'hoop_[a-z_]*(' |
  tr -d '(' | sort)
stray=$(printf '%s\n' "$exported" | grep -v '^hoop_[a-z]' || true)
internal=$(printf '%s\n' "$exported" | grep '^hoop__' || true)
if [ -n "$stray$internal" ]; then
  echo "FAIL: libhoop.so exports symbols outside the API:"; printf '%s\n' $stray $internal; exit 1
fi
# Fail, showing how the exported functions and list (named what) differ, unless they are the same.
same_as_exported() {
  [ "$exported" = "$2" ] && return 0
  echo "FAIL: $1 and the exported functions differ (< exported, > $1):"
  printf '%s\n' "$exported" >"${TMPDIR:-/tmp}/hoop-exported.$$"
  printf '%s\n' "$2" | diff "${TMPDIR:-/tmp}/hoop-exported.$$" - || true
  rm -f "${TMPDIR:-/tmp}/hoop-exported.$$"
  exit 1
}
same_as_exported "the HOOP_API-declared functions" "$declared"
# The Debian package's symbols file must list the same functions, so that a function added to the
# API is added there too (with the version that first has it).
symbols="$src/debian/libhoop1.symbols"
if [ -f "$symbols" ]; then
  same_as_exported "debian/libhoop1.symbols" \
    "$(awk '/^ hoop_/{sub(/@.*/, "", $1); print $1}' "$symbols" | sort)"
fi
echo "libhoop.so exports the $(printf '%s\n' "$exported" | wc -l) HOOP_API functions and nothing else"
