#!/bin/sh
# PUBACK latency under a cold backlog read, on a loop-mounted ext4 of its own (root): runs
# `tern-bench cold-read` (argument 1, default the release build) with tern's data there; further
# arguments go to tern-bench (e.g. --records, --read-iops). TERN_BIN picks the tern under test.
set -eu
. "$(dirname "$0")/loopfs.sh" "${1:-target/release/tern-bench}"
[ $# -gt 0 ] && shift
"$TERN_BENCH" cold-read --dir "$WORK/mnt" "$@"
