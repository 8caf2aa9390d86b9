#!/usr/bin/env bash
# Installs what tern's builds and tests need on a fresh Debian machine, and nothing that is
# already there: idempotent, safe to run before every test run (tests/run calls it).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

# Debian packages whose command is missing: "command:package".
missing=()
need() {
    command -v "${1%%:*}" >/dev/null 2>&1 || missing+=("${1#*:}")
}

# --- Kafka test cluster (tests/src/kafka.rs): a Java 17 runtime and Maven for the jars ---
need java:openjdk-17-jre-headless
need mvn:maven

if [ ${#missing[@]} -gt 0 ]; then
    if [ "$(id -u)" -ne 0 ]; then
        echo "ensure-deps: missing packages ${missing[*]} (run as root to install)" >&2
        exit 1
    fi
    apt-get update -q
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

# Kafka 4.x brokers need Java 17 or newer.
java_major=$(java -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -n1)
if [ "${java_major:-0}" -lt 17 ]; then
    echo "ensure-deps: java ${java_major:-?} found, Kafka needs 17 or newer" >&2
    exit 1
fi

# The Kafka jars, cached in tests/kafka/cache between runs.
"$root/scripts/kafka-cluster.sh" fetch
