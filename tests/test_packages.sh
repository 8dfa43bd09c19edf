#!/bin/sh
# hoop's Debian packages, end to end (root; CI runs it, `make check-packages` too): build them
# from a copy of this tree with dpkg-buildpackage, run lintian (errors and warnings fail), install
# them with apt-get as an operator would, run debian/tests/installed against the installed files,
# then purge them and check that nothing is left but the system user _hoopd (Debian keeps users).
# PKG_OUT=DIR keeps the .deb files, lintian's report and the file lists there.
set -eu
src=$(cd "${HOOP_SRCDIR:-.}" && pwd)
[ "$(id -u)" = 0 ] || { echo "SKIP: the package test installs packages: run it as root"; exit 77; }
for t in dpkg-buildpackage dh lintian apt-get; do
  command -v $t >/dev/null || { echo "SKIP: no $t (apt-get install debhelper dh-python lintian)"; exit 77; }
done
[ -d "$src/.git" ] || { echo "SKIP: the package test copies the files git knows: no .git in $src"; exit 77; }

version=$(dpkg-parsechangelog -l "$src/debian/changelog" -S Version)
configured=$(sed -n 's/^m4_define(\[hoop_\(major\|minor\|patch\)\], \[\([0-9]*\)\]).*/\2/p' \
  "$src/configure.ac" | paste -sd.)
[ "$version" = "$configured" ] ||
  { echo "FAIL: debian/changelog says $version, configure.ac $configured"; exit 1; }

out=${PKG_OUT:-$(mktemp -d)}
mkdir -p "$out"
build="$out/build"
rm -rf "$build" && mkdir -p "$build/hoop-$version"
# Tracked files and new ones git does not ignore, as they are in the working tree.
(cd "$src" && git ls-files -co --exclude-standard -z | xargs -0 cp --parents -t "$build/hoop-$version")
packages="libhoop1 libhoop-dev hoop-tools hoopd python3-hoop"
cleanup() { apt-get purge -y -qq $packages >/dev/null 2>&1 || true; }
trap cleanup EXIT

# The README's command, as a user types it in a fresh clone (the build runs debian/rules' tests).
command=$(grep -m1 '^apt-get install -y dpkg-dev .*dpkg-buildpackage' "$src/README.md")
[ -n "$command" ] || { echo "FAIL: no package command in README.md"; exit 1; }
echo "== packages: the README's command: $command"
(cd "$build/hoop-$version" && sh -c "$command" >"$out/build.log" 2>&1) ||
  { tail -40 "$out/build.log"; echo "FAIL: the README's package command"; exit 1; }
grep -E '^(PASS|FAIL|SKIP|ERROR): ' "$out/build.log" | sed 's/^/  build-time check: /'
grep -q '^PASS: tests/test_install.sh' "$out/build.log" ||
  { echo "FAIL: the package build did not run its tests (test_install.sh did not pass)"; exit 1; }
grep -E '^  cuda|^  ibverbs' "$out/build.log" || true

echo "== packages: lintian"
rc=0
lintian --fail-on error,warning --display-info "$build"/hoop_"$version"_*.changes >"$out/lintian.log" 2>&1 || rc=$?
grep -v 'running with root privileges' "$out/lintian.log" || true
[ $rc = 0 ] || { echo "FAIL: lintian reports errors or warnings"; exit 1; }

echo "== packages: what each holds"
for p in $packages; do
  deb=$(ls "$build"/"$p"_"$version"_*.deb)
  echo "$p ($(basename "$deb"), $(du -k "$deb" | cut -f1) KiB):"
  dpkg-deb -c "$deb" | awk '$1 !~ /^d/ {print "  " $6 ($7 ? " " $7 " " $8 : "")}'
done | tee "$out/contents.txt"

echo "== packages: apt-get install"
debs=$(for p in $packages; do ls "$build"/"$p"_"$version"_*.deb; done)
# shellcheck disable=SC2086
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $debs >"$out/install.log" 2>&1 ||
  { cat "$out/install.log"; echo "FAIL: apt-get install"; exit 1; }
for p in $packages; do dpkg -L "$p"; done | sort -u >"$out/installed-paths"

echo "== packages: the installed files"
(cd "$src" && sh debian/tests/installed)

echo "== packages: purge"
# shellcheck disable=SC2086
apt-get purge -y -qq $packages >"$out/purge.log" 2>&1 || { cat "$out/purge.log"; exit 1; }
trap - EXIT
left=$(while read -r path; do
  [ -e "$path" ] && [ ! -d "$path" ] && echo "$path"
  [ -d "$path" ] && case $path in *hoop*) echo "$path/" ;; esac
done <"$out/installed-paths"; true)
[ ! -e /etc/hoop ] || left="$left /etc/hoop"
[ ! -e /usr/lib/python3/dist-packages/hoop ] || left="$left /usr/lib/python3/dist-packages/hoop"
[ -z "$left" ] || { echo "FAIL: left behind after purge:"; printf '  %s\n' $left; exit 1; }
getent passwd _hoopd >/dev/null && echo "purged: nothing left but the system user _hoopd"
echo "== packages: all passed"
