#!/usr/bin/env bash
# Steady-state write amplification with segment recycling (docs/log-format.md, "Measured
# choices"). Run as root from the repository root after building tern-bench:
#   scripts/recycle-experiment.sh [path/to/tern-bench]
# One `tern-bench stress` run per record size, 35 s at a fixed rate, 1 MiB segments and a 3 MiB
# partition limit: after about 15 s every roll reuses a deleted segment file. Device bytes are
# read from the loop device's sectors-written counter between second 20 and second 30 of the
# run, when the partition is in that steady state, and divided by the payload of those 10 s.
set -euo pipefail
source "$(dirname "$0")/loopfs.sh"
printf "%-6s %-6s %-8s %-7s %-9s %-9s %-9s\n" bytes rate window WA fsync/s recycled p50_ms
for spec in "100 2000" "1024 500"; do
  set -- $spec
  rm -rf "$WORK/mnt/d"
  "$TERN_BENCH" stress --data-dir "$WORK/mnt/d" --max-delay-ms 20 --segment-bytes 1048576 \
    --retention-bytes 3145728 --rate "$2" --record-bytes "$1" --seconds 35 > "$WORK/out" &
  pid=$!
  sleep 20; sync; before=$(sectors)
  sleep 10; sync; after=$(sectors)
  wait "$pid"
  python3 - "$(cat "$WORK/out")" "$before" "$after" "$2" <<'PY'
import json, sys
s = json.loads(sys.argv[1]); dev = (int(sys.argv[3]) - int(sys.argv[2])) * 512
payload = int(sys.argv[4]) * s['record_bytes'] * 10
print(f"{s['record_bytes']:<6} {sys.argv[4]:<6} {s['max_delay_ms']:<8} {dev / payload:<7.2f} "
      f"{s['fsyncs'] / s['elapsed_s']:<9.1f} {s['segments_recycled']:<9} {s['ack_p50_ms']:<9.2f}")
PY
done
