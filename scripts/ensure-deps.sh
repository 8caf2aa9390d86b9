#!/usr/bin/env bash
# Installs what tern's test suites and benchmarks need on a fresh Debian/Ubuntu machine.
# Idempotent: only packages that are missing are installed, so a second run does nothing.
set -euo pipefail

# mosquitto-clients: mosquitto_pub/mosquitto_sub, independent MQTT clients of the e2e suite.
# mosquitto: the broker `tern bench mqtt --compare` measures tern against.
# openssl: scripts/gen-test-certs.sh makes the certificates of the TLS e2e tests.
packages=(mosquitto-clients mosquitto openssl)

missing=()
for package in "${packages[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed"; then
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
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
    echo "ensure-deps: everything present"
fi
