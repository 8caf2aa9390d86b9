#!/usr/bin/env bash
# Builds the sensor firmware for every board, checks its size budget, and smoke-tests it in QEMU.
#
#   scripts/firmware.sh [lm3s6965evb|mps2-an385]...     (default: both)
#   scripts/firmware.sh --clippy                         clippy -D warnings for each board
#
# For each board: a release build with the distro toolchain (-Z build-std=core, linked by ld.lld),
# flash and RAM use read from the ELF (budget: 64 KiB flash, 16 KiB RAM = static RAM plus the
# stack high-water mark the firmware reports), then a boot in qemu-system-arm with the board's
# UART on a TCP socket to tests/firmware/responder.py (a loopback MQTT responder that cuts the
# connection once mid-exchange, sends a `period` command and cuts the connection again when its
# reply comes, unacknowledged, and finally sends `halt`). Passes when the readings arrive with
# sequence numbers 0..N and no gap, the reply arrives on a later connection, QEMU exits 0, and the
# defmt log decodes (defmt-print) and has the expected lines. Idempotent; everything it writes is
# under firmware/target/.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

FLASH_BUDGET=$((64 * 1024))
RAM_BUDGET=$((16 * 1024))
READINGS=20          # the responder sends `halt` after this many acknowledged readings
DROP_AT=6            # ...and cuts the first connection when this PUBLISH arrives
COMMAND_AT=10        # ...sends COMMAND after this many acknowledged readings, cuts its first reply
COMMAND="period 200 smoke-1"   # the firmware's default period: the run's timing stays the same
REPLY="applied smoke-1 period 200"
QEMU_TIMEOUT=120     # seconds; a hung boot fails instead of blocking the test command

lint=false
if [ "${1:-}" = "--clippy" ]; then
  lint=true
  shift
fi
boards=("$@")
[ ${#boards[@]} -gt 0 ] || boards=(lm3s6965evb mps2-an385)

ensure_tools() {
  local missing=()
  for tool in /usr/bin/cargo /usr/bin/rustc ld.lld qemu-system-arm python3; do
    command -v "$tool" >/dev/null || missing+=("$tool")
  done
  [ -d /usr/lib/rustlib/src/rust/library ] || missing+=(rust-web-src)
  if [ ${#missing[@]} -gt 0 ]; then
    echo "firmware: missing ${missing[*]}; installing"
    if [ -x scripts/ensure-deps.sh ]; then
      scripts/ensure-deps.sh
    else
      local sudo=""
      [ "$(id -u)" -eq 0 ] || sudo="sudo"
      $sudo apt-get update -qq
      DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends \
        rustc-web cargo-web rust-web-src lld qemu-system-arm python3 >/dev/null
    fi
  fi
  # defmt-print decodes the log frames; it builds with the default (rustup) cargo.
  command -v defmt-print >/dev/null || cargo install defmt-print --locked --quiet
}

build() {
  local board=$1
  (
    cd firmware
    # The distro toolchain first in PATH; RUSTC_BOOTSTRAP lets its stable rustc take -Z build-std.
    # The target dir is pinned to firmware/target, where the ELF is copied from below (and where
    # the tests build theirs): a CARGO_TARGET_DIR of the caller's would leave the copy stale.
    PATH="/usr/bin:$PATH" RUSTC_BOOTSTRAP=1 RUSTUP_TOOLCHAIN='' CARGO_TARGET_DIR=target \
      cargo build --release --locked --quiet --no-default-features --features "$board,semihosting"
  )
  mkdir -p firmware/target/elf
  cp firmware/target/thumbv7m-none-eabi/release/tern-firmware "firmware/target/elf/$board.elf"
}

device_id_of() {
  case "$1" in
    lm3s6965evb) echo 1 ;;
    mps2-an385) echo 2 ;;
    *) echo "unknown board '$1' (use lm3s6965evb or mps2-an385)" >&2; exit 2 ;;
  esac
}

responder_pid=""
# Ends the loopback responder this script started (by its PID), if it still runs.
stop_responder() {
  if [ -n "$responder_pid" ] && kill -0 "$responder_pid" 2>/dev/null; then
    kill "$responder_pid" 2>/dev/null || true
  fi
  responder_pid=""
}

# Boots one board; progress goes to stderr, and the last line on stdout is `stack=BYTES`.
# It runs as an `if` condition, where `set -e` is off: every check returns explicitly.
smoke() {
  local board=$1 elf=$2 device_id=$3
  local dir="$root/firmware/target/smoke/$board"
  rm -rf "$dir" && mkdir -p "$dir"
  python3 tests/firmware/responder.py serve --port-file "$dir/port" --record "$dir/readings.jsonl" \
    --drop-after "$DROP_AT" --halt-after "$READINGS" --timeout "$QEMU_TIMEOUT" \
    --period-command "$COMMAND" --command-after "$COMMAND_AT" \
    2>"$dir/responder.log" &
  responder_pid=$!
  # smoke runs in a command substitution (a subshell): end the responder when it exits.
  trap stop_responder EXIT
  for _ in $(seq 100); do [ -s "$dir/port" ] && break; sleep 0.1; done
  [ -s "$dir/port" ] || { echo "firmware: responder did not start" >&2; return 1; }
  local port
  port=$(cat "$dir/port") || return 1
  local status=0
  timeout "$QEMU_TIMEOUT" qemu-system-arm -machine "$board" -display none -monitor none \
    -semihosting-config enable=on,target=native \
    -serial "tcp:127.0.0.1:$port,reconnect=1" \
    -kernel "$elf" >"$dir/defmt.bin" 2>"$dir/qemu.log" || status=$?
  wait "$responder_pid" || true
  responder_pid=""
  cat "$dir/responder.log" >&2
  [ "$status" -eq 0 ] || { echo "firmware: $board: QEMU exited with $status" >&2; cat "$dir/qemu.log" >&2; return 1; }
  python3 tests/firmware/responder.py check --record "$dir/readings.jsonl" \
    --device-id "$device_id" --min-readings "$READINGS" --reply "$REPLY" >&2 || return 1
  defmt-print -e "$elf" <"$dir/defmt.bin" >"$dir/log.txt" || return 1
  local expected=(
    "INFO  tern firmware [0-9.]+ on $board: device $device_id, period [0-9]+ ms"
    "INFO  connected to broker"
    "INFO  reading 0 acknowledged"
    "WARN  reading $((DROP_AT - 1)) not acknowledged"
    "INFO  command smoke-1 applied: period 200 ms"
    "WARN  reply not acknowledged"
    "INFO  reply acknowledged: $REPLY"
    "INFO  reading $((READINGS - 1)) acknowledged"
    "INFO  halting on command"
    "INFO  stack high-water mark [0-9]+ bytes"
  )
  for line in "${expected[@]}"; do
    grep -Eq "$line" "$dir/log.txt" || {
      echo "firmware: $board: defmt log lacks /$line/:" >&2
      cat "$dir/log.txt" >&2
      return 1
    }
  done
  echo "firmware: $board: defmt log decoded, $(wc -l <"$dir/log.txt") lines, expected lines present" >&2
  sed -nE 's/.*stack high-water mark ([0-9]+) bytes.*/stack=\1/p' "$dir/log.txt" | tail -1
}

check_budget() {
  local board=$1 elf=$2 stack=$3
  local sizes flash ram
  sizes=$(python3 tests/firmware/elf_size.py "$elf" | tail -1)
  flash=$(sed -E 's/flash=([0-9]+).*/\1/' <<<"$sizes")
  ram=$(sed -E 's/.*ram=([0-9]+)/\1/' <<<"$sizes")
  printf 'firmware: %-12s flash %6d B (budget %d)  RAM %6d B = %d static + %d stack high-water (budget %d)\n' \
    "$board" "$flash" "$FLASH_BUDGET" "$((ram + stack))" "$ram" "$stack" "$RAM_BUDGET"
  [ "$flash" -le "$FLASH_BUDGET" ] || { echo "firmware: $board: flash over budget" >&2; return 1; }
  [ $((ram + stack)) -le "$RAM_BUDGET" ] || { echo "firmware: $board: RAM over budget" >&2; return 1; }
}

# clippy of the distro toolchain (Debian's rust-web-clippy, the same 1.85 as the build), since
# the firmware's core is built from the distro's rust-web-src.
clippy_board() {
  (
    cd firmware
    PATH="/usr/bin:$PATH" RUSTC_BOOTSTRAP=1 RUSTUP_TOOLCHAIN='' CARGO_TARGET_DIR=target/clippy \
      cargo clippy --locked --quiet --no-default-features --features "$1,semihosting" -- -D warnings
  )
}

ensure_tools
if $lint; then
  command -v /usr/bin/cargo-clippy >/dev/null || scripts/ensure-deps.sh
  for board in "${boards[@]}"; do
    echo "firmware: clippy $board"
    clippy_board "$board" || exit 1
  done
  exit 0
fi
failed=0
for board in "${boards[@]}"; do
  device_id=$(device_id_of "$board")
  echo "===== firmware $board"
  build "$board"
  elf="firmware/target/elf/$board.elf"
  if stack=$(smoke "$board" "$elf" "$device_id" | sed -n 's/^stack=//p') && [ -n "$stack" ] &&
    check_budget "$board" "$elf" "$stack"; then
    echo "firmware: $board ok"
  else
    echo "firmware: $board FAILED"
    failed=$((failed + 1))
  fi
done
[ "$failed" -eq 0 ]
