#!/usr/bin/env bash
# Installs the system packages tern's build, tests and benches need, only those missing.
# Idempotent: a second run installs nothing. Needs root (or sudo) only when something is missing.
set -euo pipefail

packages=(
  # `tern bench log` as root: mkfs.ext4 for the image, losetup and mount for the loop mount.
  e2fsprogs
  mount
  util-linux
  # A C compiler for the bundled SQLite of the bench's comparison (feature bench-sqlite).
  gcc
  libc6-dev
)

missing=()
for package in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$package")
  fi
done

if [ "${#missing[@]}" -eq 0 ]; then
  exit 0
fi

sudo=()
if [ "$(id -u)" -ne 0 ]; then
  sudo=(sudo)
fi
echo "ensure-deps: installing ${missing[*]}" >&2
"${sudo[@]}" apt-get update -qq
DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
