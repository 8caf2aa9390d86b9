#!/usr/bin/env bash
# Installs what tern's test command needs when it is missing: idempotent, and quick when
# everything is present. Called by tests/run; safe to run by hand (as root, or with sudo).
set -euo pipefail

# Debian packages, one group per purpose.
packages=(
  # ARM cross-builds with the distro toolchain (-Z build-std), run under QEMU user mode.
  rustc-web cargo-web rust-web-src
  # clippy of the same toolchain, for the firmware's lint (tests/run clippy).
  rust-web-clippy
  gcc-aarch64-linux-gnu gcc-arm-linux-gnueabihf libc6-dev-arm64-cross libc6-dev-armhf-cross
  qemu-user
  # lld links the firmware's thumbv7m binaries and the gateway's ARM release binaries (in the
  # order of gateway/tern/link-order/, gateway/tern/build.rs); qemu-system-arm runs the firmware
  # (and, with qemu-system-aarch64 from the same package, the system-QEMU gateways).
  lld qemu-system-arm
  # The system-QEMU gateway's initramfs (scripts/system-image.sh): depmod for the kernel's
  # modules.dep, cpio for the archive; debugfs and e2fsck (e2fsprogs, below) read the SD card.
  kmod cpio
  # Independent MQTT clients and a reference broker for tests and benchmarks.
  mosquitto-clients mosquitto
  # Test helpers (firmware responder, ELF size reader).
  python3
  # `tern-bench log` as root: mkfs.ext4 for the image, losetup and mount for the loop mount.
  e2fsprogs mount util-linux
  # `ip`: the one test of the default ports brings up loopback in a network namespace of its own.
  iproute2
  # A C compiler for the bundled SQLite of the bench's comparison (feature sqlite of tern-bench).
  gcc libc6-dev
  # The real Apache Kafka 4.x test cluster (tests/src/kafka.rs): Java 17 and Maven for its jars.
  openjdk-17-jre-headless maven
  # Certificates for the Kafka test cluster's TLS listener and the MQTT TLS tests.
  openssl
  # libfaketime: the clock-step tests run `tern serve` with a faked wall clock (LD_PRELOAD).
  faketime
  # librdkafka's command-line client: the Kafka listener's e2e tests (e2e/kafka_listener.rs).
  kcat
  # A venv for kafka-python, the Python client of the Kafka listener's e2e tests.
  python3-venv
  # A real headless browser for the status page test (e2e/operations.rs: --dump-dom, --screenshot).
  chromium
  # The package suite (scripts/package.sh): Debian's package checker, systemd-analyze verify of
  # the unit, readelf for the binary's glibc needs and ELF machine.
  lintian systemd binutils
)

# Debian's ARM kernels and busybox for the system-QEMU gateways are fetched with
# `apt-get download PKG:arm64|armhf` (scripts/system-image.sh), so dpkg must know the
# architectures.
for arch in arm64 armhf; do
  if ! dpkg --print-foreign-architectures | grep -qx "$arch"; then
    echo "ensure-deps: adding dpkg architecture $arch"
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    $SUDO dpkg --add-architecture "$arch"
    # A mirror caught mid-sync fails one index; the install below says so if it mattered.
    $SUDO apt-get update -qq || echo "ensure-deps: apt-get update reported errors (above)" >&2
  fi
done

missing=()
for pkg in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' || missing+=("$pkg")
done

if [ ${#missing[@]} -gt 0 ]; then
  echo "ensure-deps: installing ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq || echo "ensure-deps: apt-get update reported errors (above)" >&2
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# rustfmt and clippy come with the rustup toolchain; say clearly if they are not there.
for tool in rustfmt cargo-clippy; do
  command -v "$tool" >/dev/null || { echo "ensure-deps: $tool is missing (rustup component add ${tool#cargo-})" >&2; exit 1; }
done
# defmt-print decodes the firmware's defmt log in the firmware suites.
if ! command -v defmt-print >/dev/null; then
  echo "ensure-deps: installing defmt-print"
  cargo install --quiet --locked defmt-print
fi
# kafka-python (the Kafka listener's scripted checks) in tests/.venv, kept there (git ignores it).
venv="$(dirname "${BASH_SOURCE[0]}")/../tests/.venv"
if ! "$venv/bin/python" -c 'import kafka' 2>/dev/null; then
  echo "ensure-deps: installing kafka-python into tests/.venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet 'kafka-python>=3,<4'
fi
# The Kafka jars (tests/kafka/pom.xml), copied into tests/kafka/cache once and kept there.
"$(dirname "${BASH_SOURCE[0]}")/kafka-cluster.sh" fetch
# MirrorMaker 2 (tests/kafka/mirror/pom.xml, connect-mirror 4.1 with its own kafka-clients) for
# e2e/kafka_mirror.rs, copied into tests/kafka/mirror/cache once and kept there.
mirror="$(dirname "${BASH_SOURCE[0]}")/../tests/kafka/mirror"
if ! ls "$mirror"/cache/connect-mirror-*.jar >/dev/null 2>&1; then
  echo "ensure-deps: fetching the MirrorMaker 2 jars into tests/kafka/mirror/cache"
  (cd "$mirror" && mvn -q -B -Dstyle.color=never dependency:copy-dependencies)
fi

echo "ensure-deps: all present"
