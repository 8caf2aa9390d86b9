#!/usr/bin/env bash
# Commit-window experiment behind the default `log.flush.max_delay` (docs/log-format.md,
# "Measured choices"). Run as root from the repository root after building tern-bench:
#   scripts/commit-window-experiment.sh [path/to/tern-bench]
# For each window it runs `tern-bench stress` in open-loop mode (a fixed rate of one-record
# appends, as sensors publish) on a loop-mounted ext4 image and prints device bytes per payload
# byte (the loop device's sectors-written counter), fdatasyncs per second and ack latency.
# A window is "MIN/MAX/BYTES": `flush.min_delay` and `flush.max_delay` in milliseconds and
# `flush.min_bytes`; 30/30/1048576 is the fixed window of the engine before adaptive group commit.
set -euo pipefail
source "$(dirname "$0")/loopfs.sh"
printf "%-6s %-6s %-13s %-7s %-9s %-9s %-9s\n" bytes rate window WA fsync/s p50_ms p99_ms
for spec in "100 2000" "1024 500" "100 20000"; do
  set -- $spec
  for window in 30/30/1048576 0/30/0 10/30/16384 30/30/16384 30/30/65536; do
    IFS=/ read -r min max bytes <<< "$window"
    rm -rf "$WORK/mnt/d"
    sync; before=$(sectors)
    out=$("$TERN_BENCH" stress --data-dir "$WORK/mnt/d" --rate "$2" --seconds 5 \
      --record-bytes "$1" --min-delay-ms "$min" --max-delay-ms "$max" --min-bytes "$bytes" \
      --segment-bytes 67108864)
    sync; after=$(sectors)
    python3 - "$out" "$before" "$after" "$2" <<'PY'
import json, sys
s = json.loads(sys.argv[1]); dev = (int(sys.argv[3]) - int(sys.argv[2])) * 512
window = f"{s['min_delay_ms']}/{s['max_delay_ms']}/{s['min_bytes']}"
print(f"{s['record_bytes']:<6} {sys.argv[4]:<6} {window:<13} {dev / s['payload_bytes']:<7.2f} "
      f"{s['fsyncs'] / s['elapsed_s']:<9.1f} {s['ack_p50_ms']:<9.2f} {s['ack_p99_ms']:<9.2f}")
PY
  done
done
