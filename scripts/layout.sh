#!/usr/bin/env bash
# Checks the workspace's shape, the facts docs/ARCHITECTURE.md states as invariants:
#   - the shipped `tern` binary's crate graph (`cargo tree -e normal`) has no rusqlite and no
#     tern-bench: no benchmark code is compiled into what is flashed onto a gateway;
#   - only tern-mqtt depends on rumqttd, no gateway crate on rskafka (the tests crate keeps it as
#     a reference client), and only tern-upstream and tern-kafka on kafka-protocol (among the
#     gateway's crates; the tests crate drives them as reference clients);
#   - inside tern-upstream only the client module (`src/client/`) opens connections
#     (`TcpStream::connect`) or names kafka-protocol (tests decoding its batches aside);
#   - one owner per fact: the storage engine depends on no tern crate but tern-core and names no
#     key partitioner or device schema (Kafka's partitioner is tern-partitioner's, the one crate
#     that defines murmur2; `tern log dump --decode`'s schemas are the binary's); tern-core
#     names no Kafka (its framing is tern-kafka's); no shipped crate declares a benchmark knob
#     (`bench_…` field, "bench only" in a config module: tern-bench's ablations are
#     tern-upstream's `Ablation`, never a setting);
#   - the storage engine reaches files only through tern-core's `fs` module (re-exported as its
#     `fs.rs`, so the power-cut simulation covers every write); `datadir.rs`, the lock beside the
#     log, is the one exception; the upstream producer state (`producer/`) and the password file
#     (`passwd.rs`) reach files only through it too;
#   - only tern-core's `sys` module calls statvfs, getrlimit and setrlimit, and only the binary
#     (and the bench) raises the open-files limit;
#   - the gateway's crates form no import cycle (cargo refuses cycles between crates) and no
#     crate has an import cycle between its modules (scripts/module-cycles.py).
set -euo pipefail
cd "$(dirname "$0")/.."

fail=0
# Fails the run, naming what was found, when `$2` (the offending files) is not empty.
refuse() {
  if [ -n "$2" ]; then
    echo "layout: $1: ${2//$'\n'/ }" >&2
    fail=1
  fi
}
tree=$(cargo tree --locked -p tern -e normal --prefix none --format '{p}')
for banned in rusqlite tern-bench; do
  if grep -q "^$banned " <<<"$tree"; then
    echo "layout: the tern binary depends on $banned" >&2
    fail=1
  fi
done

# Which gateway crate depends directly on $1 (normal dependencies).
direct_users() {
  cargo tree --locked --workspace -e normal --invert "$1" --depth 1 --prefix none --format '{p}' |
    awk '{print $1}' | grep -v "^$1$" | grep '^tern' | sort -u || true
}
# dep:owner[,owner...]
for pair in rumqttd:tern-mqtt rskafka:tern-tests kafka-protocol:tern-upstream,tern-kafka; do
  dep=${pair%%:*}
  owners=${pair##*:}
  owner=${owners//,/ and }
  allowed=(-e tern-tests)
  for o in ${owners//,/ }; do allowed+=(-e "$o"); done
  users=$(direct_users "$dep" | grep -vxF "${allowed[@]}" || true)
  if [ -n "$users" ]; then
    echo "layout: $dep is used by $users (only $owner may)" >&2
    fail=1
  fi
done

# tern-upstream's one Kafka client: connections and the codec only under src/client/.
upstream_net=$(grep -rlE 'TcpStream::connect|kafka_protocol' gateway/upstream/src --include='*.rs' |
  grep -vE '^gateway/upstream/src/(client/|.*test\.rs$)' || true)
refuse "Kafka connections or kafka-protocol outside tern-upstream's client/" "$upstream_net"

# One owner per fact: each concern lives in the crate that owns it, not where it was handy.
log_deps=$(cargo tree --locked -p tern-log -e normal --depth 1 --prefix none --format '{p}' |
  awk '$1 ~ /^tern/ && $1 != "tern-log" && $1 != "tern-core" {print $1}' | sort -u | xargs)
refuse "tern-log depends on a tern crate besides tern-core" "$log_deps"
log_leaks=$(grep -rlE 'murmur|partition_for_key|tern_shared|\bReading\b|\bDecoder\b' gateway/log/src \
  --include='*.rs' || true)
refuse "tern-log knows Kafka's partitioner or a device schema" "$log_leaks"
partitioners=$(grep -rlE 'fn (murmur2|partition_for_key)\b' gateway tests shared --include='*.rs' |
  grep -v '^gateway/partitioner/' || true)
refuse "Kafka's partitioner defined outside tern-partitioner" "$partitioners"
core_kafka=$(grep -rliE 'kafka' gateway/core || true)
refuse "tern-core names Kafka (its framing is tern-kafka's)" "$core_kafka"
# A benchmark's switches are tern-upstream's `Ablation`, handed to `run_ablated`: no shipped
# crate declares a `bench_…` field, and no configuration module documents a "bench only" one.
config_files=$(find gateway -path gateway/bench -prune -o \( -name 'config.rs' -o -path '*/config/*.rs' \) -print)
# shellcheck disable=SC2086 # one word per file
bench_knobs=$( { grep -liE 'bench only' $config_files
  grep -rlE '\bbench_[a-z_]+\s*:([^:]|$)' gateway --include='*.rs' | grep -v '^gateway/bench/'; } |
  sort -u || true)
refuse "a benchmark knob in a shipped crate" "$bench_knobs"

direct_io=$(grep -rlE 'std::fs|\bFile::|OpenOptions' gateway/log/src --include='*.rs' |
  grep -vE '^gateway/log/src/(datadir\.rs|tests/|.*test\.rs)' || true)
refuse "tern-log opens files outside tern-core's fs" "$direct_io"
small_io=$(grep -rlE 'std::fs|\bFile::|OpenOptions' gateway/upstream/src/producer gateway/auth/src/passwd.rs \
  --include='*.rs' | grep -vE 'test\.rs$' || true)
refuse "a small durable file written outside tern-core's fs" "$small_io"

# The OS calls outside std have one home, tern-core's sys module; raising the open-files limit
# is the binary's start-up (and the bench's), never a library crate's.
os_calls=$(grep -rlE 'libc::(statvfs|getrlimit|setrlimit)' gateway tests --include='*.rs' |
  grep -vx 'gateway/core/src/sys.rs' || true)
refuse "statvfs/getrlimit/setrlimit called outside tern_core::sys" "$os_calls"
fd_raise=$(grep -rlE 'sys::raise_fd_limit' gateway --include='*.rs' |
  grep -vE '^gateway/(tern|bench)/' || true)
refuse "the open-files limit raised outside the binary's start-up" "$fd_raise"

python3 scripts/module-cycles.py || fail=1
[ "$fail" -eq 0 ] && echo "layout: ok"
exit "$fail"
