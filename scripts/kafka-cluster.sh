#!/usr/bin/env bash
# The Apache Kafka test cluster (three KRaft nodes on loopback, RF 3, min.insync.replicas=2) for
# manual runs and `tern bench upstream`. The e2e tests start their own through tests/src/kafka.rs.
#
#   scripts/kafka-cluster.sh fetch          copy the jars into tests/kafka/cache (via mvn)
#   scripts/kafka-cluster.sh start DIR      start a cluster in DIR, print its bootstrap servers
#   scripts/kafka-cluster.sh status DIR     print whether it runs, its bootstrap servers, node PIDs
#   scripts/kafka-cluster.sh stop DIR       stop it (only the PIDs it started)
#   scripts/kafka-cluster.sh kill-node DIR N   SIGKILL node N (by the PID in DIR/node-N.pid)
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cmd=${1:-}
dir=${2:-}

usage() {
    sed -n '5,9s/^#   //p' "${BASH_SOURCE[0]}" >&2
    exit 2
}

need_dir() {
    [ -n "$dir" ] || usage
}

fetch() {
    if ! ls "$root"/tests/kafka/cache/kafka_2.13-*.jar >/dev/null 2>&1; then
        (cd "$root/tests/kafka" && mvn -q -B -Dstyle.color=never dependency:copy-dependencies)
    fi
}

# Whether the PID in file $1 runs (a killed node stays a zombie until the cluster reaps it).
alive() {
    local state
    [ -f "$1" ] || return 1
    state=$(ps -o stat= -p "$(cat "$1")" 2>/dev/null) || return 1
    [[ $state != Z* ]]
}

start() {
    need_dir
    mkdir -p "$dir"
    dir=$(cd "$dir" && pwd)
    if alive "$dir/cluster.pid"; then
        echo "already running: $(grep -h '^bootstrap=' "$dir/cluster.log")"
        return
    fi
    fetch
    (cd "$root" && cargo build -q -p tern-tests --bin kafka-cluster)
    local target=${CARGO_TARGET_DIR:-$root/target}
    nohup "$target/debug/kafka-cluster" "$dir" >"$dir/cluster.log" 2>&1 </dev/null &
    echo $! >"$dir/cluster.pid"
    for _ in $(seq 1 1800); do
        if grep -q '^bootstrap=' "$dir/cluster.log"; then
            grep -h '^bootstrap=' "$dir/cluster.log"
            return
        fi
        if ! alive "$dir/cluster.pid"; then
            cat "$dir/cluster.log" >&2
            exit 1
        fi
        sleep 0.1
    done
    echo "cluster did not start within 180 s; see $dir/node-*.log" >&2
    stop
    exit 1
}

status() {
    need_dir
    if ! alive "$dir/cluster.pid"; then
        echo "stopped"
        exit 1
    fi
    grep -h '^bootstrap=' "$dir/cluster.log" || echo "starting"
    for pidfile in "$dir"/node-*.pid; do
        [ -f "$pidfile" ] || continue
        local node
        node=$(basename "$pidfile" .pid)
        if alive "$pidfile"; then echo "$node running pid $(cat "$pidfile")"; else echo "$node down"; fi
    done
}

stop() {
    need_dir
    if alive "$dir/cluster.pid"; then
        # The brokers die with the cluster process (PR_SET_PDEATHSIG); wait for each by its PID.
        kill "$(cat "$dir/cluster.pid")"
        for pidfile in "$dir"/node-*.pid; do
            [ -f "$pidfile" ] || continue
            while kill -0 "$(cat "$pidfile")" 2>/dev/null; do sleep 0.1; done
        done
    fi
    rm -f "$dir/cluster.pid" "$dir"/node-*.pid
}

kill_node() {
    need_dir
    local pidfile="$dir/node-${3:?node id}.pid"
    alive "$pidfile" || { echo "node ${3} is not running" >&2; exit 1; }
    kill -9 "$(cat "$pidfile")"
}

case "$cmd" in
    fetch) fetch ;;
    start) start ;;
    status) status ;;
    stop) stop ;;
    kill-node) kill_node "$@" ;;
    *) usage ;;
esac
