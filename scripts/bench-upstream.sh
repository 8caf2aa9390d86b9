#!/usr/bin/env bash
# `tern-bench upstream` against the three-broker test cluster: builds tern (release profile unless
# --debug), starts the cluster with scripts/kafka-cluster.sh in a temporary directory, runs the
# bench with the remaining flags (and the cluster's jars as --kafka-classpath, so the drain is
# compared with Kafka's own producer), and stops the cluster by the PIDs it started, also on
# failure.
#
#   scripts/bench-upstream.sh [--debug] [BENCH FLAGS...]
#   scripts/bench-upstream.sh --records 1000000 --json
#   scripts/bench-upstream.sh [--debug] downstream [BENCH FLAGS...]   (tern-bench downstream)
#   scripts/bench-upstream.sh [--debug] thin-link [BENCH FLAGS...]    (tern-bench thin-link)
#   scripts/bench-upstream.sh [--debug] fleet [BENCH FLAGS...]        (tern-bench fleet)
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
profile=release
if [ "${1:-}" = "--debug" ]; then
    profile=debug
    shift
fi
target=${CARGO_TARGET_DIR:-$root/target}

if [ "$profile" = release ]; then
    (cd "$root" && cargo build -q --release -p tern -p tern-bench)
else
    (cd "$root" && cargo build -q -p tern -p tern-bench)
fi

dir=$(mktemp -d -t tern-bench-kafka.XXXXXX)
cleanup() {
    "$root/scripts/kafka-cluster.sh" stop "$dir" || true
    rm -rf "$dir"
}
trap cleanup EXIT

started=$("$root/scripts/kafka-cluster.sh" start "$dir")
bootstrap=$(sed -n 's/^bootstrap=\([^ ]*\).*/\1/p' <<<"$started")
if [ -z "$bootstrap" ]; then
    echo "the cluster printed no bootstrap servers: $started" >&2
    exit 1
fi
echo "kafka cluster: $started" >&2
if [ "${1:-}" = downstream ]; then
    shift
    "$target/$profile/tern-bench" downstream --kafka "$bootstrap" \
        --kafka-classpath "$root/tests/kafka/cache/*" "$@"
elif [ "${1:-}" = thin-link ]; then
    shift
    "$target/$profile/tern-bench" thin-link --kafka "$bootstrap" "$@"
elif [ "${1:-}" = fleet ]; then
    shift
    "$target/$profile/tern-bench" fleet --kafka "$bootstrap" "$@"
else
    "$target/$profile/tern-bench" upstream --kafka "$bootstrap" \
        --kafka-classpath "$root/tests/kafka/cache/*" "$@"
fi
