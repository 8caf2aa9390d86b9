#!/usr/bin/env bash
# Cross-builds tern for the ARM gateways and runs the gateway's tests under QEMU user mode.
#
#   scripts/cross.sh [aarch64|armv7]...     (default: both)
#
# rustup cannot download extra targets on every machine, so this uses the distro toolchain
# (Debian's rustc-web/cargo-web/rust-web-src) with -Z build-std, which works offline. Where rustup
# has the target installed, the same commands work with rustup's cargo. Prints each target's
# stripped release binary size and fails if it exceeds the budget.
set -euo pipefail
cd "$(dirname "$0")/.."

BUDGET_BYTES=$((8 * 1024 * 1024))
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

status=0
for name in "${targets[@]}"; do
  triple=$(triple_of "$name")
  configure "$name"
  echo "== $triple: release build"
  cargo build --locked --release -p tern --bin tern \
    -Z build-std=std,panic_abort --target "$triple"
  binary="$CARGO_TARGET_DIR/$triple/release/tern"
  size=$(stat -c %s "$binary")
  awk -v t="$triple" -v s="$size" 'BEGIN { printf "size: %s tern %d bytes (%.2f MiB, budget 8 MiB)\n", t, s, s / 1048576 }'
  if [ "$size" -gt "$BUDGET_BYTES" ]; then
    echo "FAIL: $triple binary exceeds the 8 MiB budget" >&2
    status=1
  fi
  echo "== $triple: release binary runs under QEMU"
  runner_var="CARGO_TARGET_$(echo "$triple" | tr 'a-z-' 'A-Z_')_RUNNER"
  ${!runner_var} "$binary" --version
  echo "== $triple: tests under QEMU"
  cargo test --locked -p tern-core -p tern-log -p tern-mqtt -p tern-upstream -p tern -Z build-std=std,panic_abort --target "$triple" || status=1
done
exit $status
