#!/bin/sh
# The README's API example must compile against this tree and print the right average when run
# under hooprun: the example is taken out of README.md, so the README cannot drift from the API.
set -eu
src=${HOOP_SRCDIR:-.}
build=${HOOP_BUILDDIR:-.}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
awk '/^## The API in one example/{f=1} f&&/^```c$/{c=1;next} c&&/^```$/{exit} c{print}' \
  "$src/README.md" >"$work/example.c"
test -s "$work/example.c" || { echo "FAIL: no C example found in README.md"; exit 1; }
${HOOP_TEST_CC:-cc} -std=c11 -Wall -Wextra -Werror -I"$src/lib" -I"$build/lib" "$work/example.c" -o "$work/example" \
  -L"$build/lib/.libs" -Wl,-rpath,"$build/lib/.libs" -lhoop
"$build/tools/hooprun" -np 3 --timeout 30 "$work/example" >"$work/out" 2>&1 || {
  echo "FAIL: the README example exited non-zero:"; cat "$work/out"; exit 1; }
# Ranks 0, 1, 2 contribute their rank: the average is 1.
grep -q '^\[0\] average of the ranks: 1$' "$work/out" || {
  echo "FAIL: expected '[0] average of the ranks: 1', got:"; cat "$work/out"; exit 1; }
echo "README example: compiled, ran on 3 ranks, printed the right average"
