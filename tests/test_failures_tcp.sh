#!/bin/sh
# test_failures_tcp.sh - the failure suite (kill, stop, abort, mismatch) over TCP loopback: ranks
# of one host share memory by default, and test_failures itself runs that way. HOOP_TEST_TRANSPORT
# reaches the ranks that the suite forks with a config of their own (tests/support/procs.c),
# HOOP_TRANSPORT those that start from the environment.
HOOP_TRANSPORT=tcp
HOOP_TEST_TRANSPORT=tcp
export HOOP_TRANSPORT HOOP_TEST_TRANSPORT
exec "${HOOP_BUILDDIR:-.}/tests/test_failures" "$@"
