#!/usr/bin/env bash
# Cross-builds tern for the ARM gateways, runs the release binary under QEMU user mode (a real
# publish through `tern serve`, read back with `tern log dump`) and the storage engine's tests.
#
#   scripts/cross.sh [--symbols] [aarch64|armv7]...     (default: both)
#
# --symbols also builds each target's unstripped twin of the release binary (profile
# `release-symbols`: the same build with its symbol table, the same symbol names) for
# `tern-bench icount --symbols`, into $CARGO_TARGET_DIR/cross/<triple>/release-symbols/tern.
#
# rustup cannot download extra targets on every machine, so this uses the distro toolchain
# (Debian's rustc-web/cargo-web/rust-web-src) with -Z build-std, which works offline. Where rustup
# has the target installed, the same commands work with rustup's cargo. Prints each target's
# stripped release binary size and fails if it exceeds the budget.
set -euo pipefail
cd "$(dirname "$0")/.."

BUDGET_BYTES=$((8 * 1024 * 1024))
symbols=false
if [ "${1:-}" = --symbols ]; then
  symbols=true
  shift
fi
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(aarch64 armv7)

# The distro toolchain, first in PATH; RUSTC_BOOTSTRAP lets its stable rustc take -Z build-std.
export PATH="/usr/bin:$PATH"
export RUSTC_BOOTSTRAP=1
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}/cross"
unset RUSTUP_TOOLCHAIN

triple_of() {
  case "$1" in
    aarch64) echo aarch64-unknown-linux-gnu ;;
    armv7) echo armv7-unknown-linux-gnueabihf ;;
    *) echo "unknown target '$1' (use aarch64 or armv7)" >&2; exit 2 ;;
  esac
}

configure() {
  case "$1" in
    aarch64)
      export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
      export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="qemu-aarch64 -L /usr/aarch64-linux-gnu"
      export CC_aarch64_unknown_linux_gnu=aarch64-linux-gnu-gcc
      ;;
    armv7)
      export CARGO_TARGET_ARMV7_UNKNOWN_LINUX_GNUEABIHF_LINKER=arm-linux-gnueabihf-gcc
      export CARGO_TARGET_ARMV7_UNKNOWN_LINUX_GNUEABIHF_RUNNER="qemu-arm -L /usr/arm-linux-gnueabihf"
      export CC_armv7_unknown_linux_gnueabihf=arm-linux-gnueabihf-gcc
      ;;
  esac
}

# Holds tern's default loopback ports (MQTT 1883, admin 9090, Kafka 9092) where they are free,
# as another broker on the machine would, until its standard input closes; prints "held" when
# it listens. A test that depends on a default port being free fails under it.
hold_default_ports() {
  python3 -c '
import socket, sys
held = []
for port in (1883, 9090, 9092):
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", port))
        s.listen(1)
        held.append(s)
    except OSError:
        pass
print("held", flush=True)
sys.stdin.read()
'
}

# Runs the release binary under QEMU: `--version`, then `tern serve` on loopback ports the OS
# picks (every listener: while it runs, the default ports are held by another process), one
# QoS 1 publish with mosquitto_pub, SIGTERM (exit 0), and the record read back with
# `tern log dump`. Waits for the binary's own lines, never a fixed time.
smoke() {
  local held holder status=0
  held=$(mktemp)
  # The holder lives as long as this file descriptor stays open.
  exec {holder}> >(hold_default_ports >"$held")
  for _ in $(seq 100); do grep -q held "$held" 2>/dev/null && break; sleep 0.1; done
  serve_one_publish "$@" || status=1
  exec {holder}>&-
  rm -f "$held"
  return "$status"
}

serve_one_publish() {
  local runner=$1 binary=$2 dir log pid addr port line
  $runner "$binary" --version || return 1
  dir=$(mktemp -d)
  log="$dir/stderr"
  $runner "$binary" serve --data-dir "$dir/data" --mqtt-listen 127.0.0.1:0 \
    --admin-listen 127.0.0.1:0 --kafka-listen 127.0.0.1:0 2>"$log" &
  pid=$!
  for _ in $(seq 600); do
    grep -q ' ready' "$log" 2>/dev/null && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  line=$(grep -m1 'mqtt listener on' "$log" || true)
  addr=${line##*mqtt listener on }
  port=${addr##*:}
  if [ -z "$port" ] || ! mosquitto_pub -h 127.0.0.1 -p "$port" -q 1 -t smoke/1 -m "hello from $(uname -m) host"; then
    echo "FAIL: no publish through tern serve under QEMU" >&2
    cat "$log" >&2
    kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; rm -rf "$dir"
    return 1
  fi
  kill -TERM "$pid"
  wait "$pid" || { echo "FAIL: tern serve did not exit 0 on SIGTERM" >&2; rm -rf "$dir"; return 1; }
  if ! $runner "$binary" log dump --data-dir "$dir/data" --topic mqtt | grep -q 'hello from'; then
    echo "FAIL: the publish is not in the log" >&2
    rm -rf "$dir"
    return 1
  fi
  echo "smoke: publish stored and read back"
  rm -rf "$dir"
}

status=0
for name in "${targets[@]}"; do
  triple=$(triple_of "$name")
  configure "$name"
  echo "== $triple: release build"
  cargo build --locked --release -p tern --bin tern \
    -Z build-std=std,panic_abort --target "$triple"
  if $symbols; then
    echo "== $triple: release build with symbols (tern-bench icount --symbols)"
    cargo build --locked --profile release-symbols -p tern --bin tern \
      -Z build-std=std,panic_abort --target "$triple"
  fi
  binary="$CARGO_TARGET_DIR/$triple/release/tern"
  size=$(stat -c %s "$binary")
  awk -v t="$triple" -v s="$size" 'BEGIN { printf "size: %s tern %d bytes (%.2f MiB, budget 8 MiB)\n", t, s, s / 1048576 }'
  if [ "$size" -gt "$BUDGET_BYTES" ]; then
    echo "FAIL: $triple binary exceeds the 8 MiB budget" >&2
    status=1
  fi
  echo "== $triple: release binary serves a publish under QEMU"
  runner_var="CARGO_TARGET_$(echo "$triple" | tr 'a-z-' 'A-Z_')_RUNNER"
  smoke "${!runner_var}" "$binary" || status=1
  # Only the crates with target-dependent code run their tests here: the storage engine (mmap,
  # fallocate and off_t, fdatasync, flock, u64/usize conversions on 32-bit armv7), tern-core
  # (sysconf), the wire types shared with the firmware and Kafka's partitioner (a key must land
  # in the same partition on every target; it ran here inside tern-log before it got its own
  # crate). The protocol crates are the same
  # portable Rust on every target; the smoke run above drives them on ARM end to end. The
  # power-cut sweep runs on the in-memory FaultyFs, the same logic on every target, and takes
  # minutes under emulation: it runs natively in the `test` suite.
  echo "== $triple: storage and wire tests under QEMU"
  cargo test --locked -p tern-core -p tern-log -p tern-shared -p tern-partitioner \
    -Z build-std=std,panic_abort --target "$triple" -- \
    --skip tests::crash::power_cuts_never_lose_acknowledged_records || status=1
done
exit $status
