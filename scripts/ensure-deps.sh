#!/usr/bin/env bash
# Installs what tern's test suites need on a fresh Debian/Ubuntu machine. Idempotent: only
# packages that are missing are installed, so a second run does nothing.
set -euo pipefail

# Debian packages: (package, a command it provides).
packages=(
    "mosquitto-clients mosquitto_pub"
    "openssl openssl"
)

missing=()
for entry in "${packages[@]}"; do
    read -r package command <<<"$entry"
    if ! command -v "$command" >/dev/null 2>&1; then
        missing+=("$package")
    fi
done

if ((${#missing[@]} > 0)); then
    sudo=""
    if [[ $(id -u) -ne 0 ]]; then
        sudo="sudo"
    fi
    echo "ensure-deps: installing ${missing[*]}"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}"
else
    echo "ensure-deps: everything present"
fi
