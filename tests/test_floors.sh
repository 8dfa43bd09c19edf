#!/bin/sh
# The tree's shape (tests/support/floors.py): no include climbs from a floor of lib/floors to one
# above it but those lib/floors allows (and each of those still there), no include cycle between
# folders, no source past 700 lines, no Python module past 500.
src=${HOOP_SRCDIR:-.}
python=$(command -v python3 || command -v /usr/bin/python3)
if [ -z "$python" ]; then
  echo "FAIL: no python3 to read the includes with"; exit 1
fi
exec "$python" "$src/tests/support/floors.py" "$src"
