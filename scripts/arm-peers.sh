#!/usr/bin/env bash
# Unpacks Debian's own arm64 and armhf Mosquitto, with the libraries it loads and their C
# library, into one root per architecture for `tern-bench icount`, which runs it under QEMU user
# mode (`qemu-aarch64 -L ROOT` finds the dynamic loader and libraries there):
#
#   scripts/arm-peers.sh [OUTDIR]     (default: $CARGO_TARGET_DIR/peers)
#
# Writes OUTDIR/arm64 and OUTDIR/armhf (each with usr/sbin/mosquitto). The packages are fetched
# with `apt-get download` into OUTDIR/debs and kept there; the roots are unpacked with dpkg -x,
# which needs no root. Prints each root's path and its Mosquitto version.
#
# Where Go is installed it also cross-builds NATS with JetStream, the durable-ack peer, into each
# root's usr/sbin/nats-server: module github.com/nats-io/nats-server/v2 at $NATS_VERSION, without
# cgo (a static binary), GOARCH=arm64 and GOARCH=arm GOARM=7, fetched through Go's module proxy
# into a module directory OUTDIR/nats-module kept between runs.
set -euo pipefail
cd "$(dirname "$0")/.."

out=${1:-${CARGO_TARGET_DIR:-$PWD/target}/peers}
NATS_VERSION=${NATS_VERSION:-v2.15.3}
debs="$out/debs"
mkdir -p "$debs"

# mosquitto and what its binary links (readelf -d of Debian's build), their libraries in turn,
# and the C library with its loader.
packages=(
  mosquitto libc6 libwrap0 libsystemd0 libdlt2 libssl3 libcap2 libnsl2 libtirpc3 libgcrypt20
  libgpg-error0 liblzma5 libzstd1 liblz4-1 libgssapi-krb5-2 libkrb5-3 libk5crypto3 libcom-err2
  libkrb5support0 libkeyutils1 libcjson1
)

for debarch in arm64 armhf; do
  if ! dpkg --print-foreign-architectures | grep -qx "$debarch"; then
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    $SUDO dpkg --add-architecture "$debarch"
    $SUDO apt-get update -qq
  fi
  root="$out/$debarch"
  rm -rf "$root"
  mkdir -p "$root"
  for name in "${packages[@]}"; do
    if ! ls "$debs/${name}_"*"_$debarch.deb" >/dev/null 2>&1; then
      (cd "$debs" && apt-get download -qq "$name:$debarch")
    fi
    dpkg -x "$(ls -t "$debs/${name}_"*"_$debarch.deb" | head -n1)" "$root"
  done
  echo "$debarch: $root ($(ls "$debs"/mosquitto_*_"$debarch".deb | xargs -n1 basename))"
done

if ! command -v go >/dev/null; then
  echo "go not found: NATS is not built (tern-bench icount measures it only where it is)" >&2
  exit 0
fi
module="$out/nats-module"
mkdir -p "$module"
(
  cd "$module"
  [ -f go.mod ] || go mod init tern-bench-nats >/dev/null 2>&1
  GOFLAGS=-mod=mod go get "github.com/nats-io/nats-server/v2@$NATS_VERSION"
  for debarch in arm64 armhf; do
    case "$debarch" in
      arm64) export GOARCH=arm64; unset GOARM ;;
      armhf) export GOARCH=arm GOARM=7 ;;
    esac
    CGO_ENABLED=0 GOOS=linux GOFLAGS=-mod=mod go build -trimpath \
      -o "$out/$debarch/usr/sbin/nats-server" github.com/nats-io/nats-server/v2
    echo "$debarch: nats-server $NATS_VERSION ($GOARCH${GOARM:+ GOARM=$GOARM})"
  done
)
