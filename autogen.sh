#!/bin/sh
# Generate ./configure and the Makefile templates from configure.ac and Makefile.am.
set -e
cd "$(dirname "$0")"
mkdir -p m4
autoreconf --install --force >/dev/null 2>&1 || autoreconf --install --force
