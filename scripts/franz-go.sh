#!/usr/bin/env bash
# franz-go's pkg/kgo tests (v1.22.3, a Go client's own integration suite) against tern and, in the
# same run, a single-node Apache Kafka 4.4 (KRaft, broker and controller in one process, from the
# jars of scripts/kafka-cluster.sh fetch). Gets franz-go through Go modules, builds its test binary
# once (cached per franz-go and Go version), runs every top-level Test* alone, one at a time,
# against each broker, prints a table and exits non-zero when tern fails a test Kafka passes
# (tests of a feature docs/kafka.md says tern does not serve aside: --unserved). Stops what it
# started by the PIDs it started; restarts tern (loudly) if it died during a test. docs/kafka.md
# "franz-go's test suite" has the last result.
#
#   scripts/franz-go.sh [--only REGEX] [--tern-only] [--timeout SECONDS] [--records N] [--keep]
#   scripts/franz-go.sh --only 'Produce|Group'          a subset (a regex over test names)
#   TERN_BIN=path/to/tern scripts/franz-go.sh           that binary instead of target/release/tern
#
#   --timeout S    per-test limit (default 300; go test's own -test.timeout, `timeout` 30 s later)
#   --records N    KGO_TEST_RECORDS, the record count of the ETL tests (default franz-go's 500000)
#   --unserved RE  tests of a feature tern does not serve: listed, never failing the run
#   --keep         keep the work directory (logs, data, franz-go's source); otherwise only the logs
#                  of a failing run are kept
#
# Needs go, java 17+, python3, mvn (for the jars) and network for the Go module download once.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
franz_version=v1.22.3
only='.*'
tern_only=0
limit=300
records=
keep=0
# Tests of what docs/kafka.md says tern does not serve: transactions (TestTxnEtl), share groups
# (TestShareGroup*, TestConsumeRegexShareSkipsInternal skip without ShareFetch) and the KIP-848
# consumer protocol (Test848RegexBrokerResolves skips).
unserved='^(TestTxnEtl|TestShareGroup.*|TestConsumeRegexShareSkipsInternal|Test848RegexBrokerResolves)$'

usage() {
    sed -n '11,20s/^#   //p' "${BASH_SOURCE[0]}" >&2
    exit 2
}

while [ $# -gt 0 ]; do
    case "$1" in
        --only) only=${2:?--only REGEX}; shift 2 ;;
        --tern-only) tern_only=1; shift ;;
        --timeout) limit=${2:?--timeout SECONDS}; shift 2 ;;
        --records) records=${2:?--records N}; shift 2 ;;
        --unserved) unserved=${2:?--unserved REGEX}; shift 2 ;;
        --keep) keep=1; shift ;;
        -h|--help) usage ;;
        *) echo "unknown argument: $1" >&2; usage ;;
    esac
done

work=$(mktemp -d -t tern-franz-go.XXXXXX)
logs=$work/logs
mkdir -p "$logs"
kafka_pid=
tern_pid=
gate_failed=0

# Whether PID $1 runs (a zombie does not).
alive() {
    local state
    [ -n "$1" ] || return 1
    state=$(ps -o stat= -p "$1" 2>/dev/null) || return 1
    [[ $state != Z* ]]
}

stop_pid() {
    local pid=$1
    alive "$pid" || return 0
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 1 100); do
        alive "$pid" || break
        sleep 0.1
    done
    if alive "$pid"; then kill -9 "$pid" 2>/dev/null || true; fi
    wait "$pid" 2>/dev/null || true
}

cleanup() {
    local rc=$?
    stop_pid "$tern_pid"
    stop_pid "$kafka_pid"
    if [ "$keep" = 1 ]; then
        echo "work directory kept: $work" >&2
    elif [ "$rc" != 0 ] || [ "$gate_failed" = 1 ]; then
        rm -rf "$work/src" "$work/kafka/data" "$work/tern-data"
        echo "logs kept: $logs" >&2
    else
        rm -rf "$work"
    fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# --- franz-go's test binary ---------------------------------------------------------------
cd "$work"
mod_dir=$(go mod download -json "github.com/twmb/franz-go@$franz_version" |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')
cp -r "$mod_dir" "$work/src"
chmod -R u+w "$work/src"
cache=${XDG_CACHE_HOME:-$HOME/.cache}/tern/franz-go-$franz_version-$(go env GOVERSION)
kgo_test=$cache/kgo.test
if [ ! -x "$kgo_test" ]; then
    echo "building franz-go $franz_version's pkg/kgo test binary (minutes on a small machine)" >&2
    mkdir -p "$cache"
    (cd "$work/src" && GOFLAGS=-mod=mod go test -c ./pkg/kgo/ -o "$kgo_test.tmp")
    mv "$kgo_test.tmp" "$kgo_test"
fi
mapfile -t tests < <("$kgo_test" -test.list '.*' | grep -E '^Test' | grep -E -- "$only" || true)
if [ "${#tests[@]}" = 0 ]; then
    echo "no test matches $only" >&2
    exit 2
fi
echo "${#tests[@]} tests of franz-go $franz_version pkg/kgo" >&2

# --- tern --------------------------------------------------------------------------------
tern_bin=${TERN_BIN:-$root/target/release/tern}
if [ -z "${TERN_BIN:-}" ] && [ ! -x "$tern_bin" ]; then
    (cd "$root" && cargo build -q --release -p tern)
    tern_bin=${CARGO_TARGET_DIR:-$root/target}/release/tern
fi
[ -x "$tern_bin" ] || { echo "no tern binary at $tern_bin" >&2; exit 1; }
tern_port=$(free_port)
mkdir -p "$work/tern-data"

start_tern() {
    local from
    from=0
    if [ -f "$logs/tern.log" ]; then from=$(wc -l <"$logs/tern.log"); fi
    "$tern_bin" serve --data-dir "$work/tern-data" --kafka-listen "127.0.0.1:$tern_port" \
        --mqtt-listen 127.0.0.1:0 --admin-listen 127.0.0.1:0 \
        </dev/null >>"$logs/tern.log" 2>&1 &
    tern_pid=$!
    wait_started tern "$tern_pid" "$logs/tern.log" "$from" ' ready' 30
    tail -n +"$((from + 1))" "$logs/tern.log" | grep -q 'kafka listener on' || {
        echo "tern started without its Kafka listener:" >&2
        tail -n 20 "$logs/tern.log" >&2
        exit 1
    }
}

# Waits until the log file $3, from its line $4 on, holds $5, while the process $1 (PID $2)
# runs; exits with the log's tail when it ends or after $6 seconds.
wait_started() {
    local name=$1 pid=$2 log=$3 from=$4 pattern=$5 seconds=$6
    for _ in $(seq 1 $((seconds * 10))); do
        if tail -n +"$((from + 1))" "$log" | grep -q "$pattern"; then
            return
        fi
        if ! alive "$pid"; then
            echo "$name exited at start:" >&2
            tail -n 30 "$log" >&2
            exit 1
        fi
        sleep 0.1
    done
    echo "$name did not start within $seconds s" >&2
    exit 1
}

# --- Kafka -------------------------------------------------------------------------------
start_kafka() {
    "$root/scripts/kafka-cluster.sh" fetch
    local classpath="$root/tests/kafka/cache/*" dir=$work/kafka broker controller
    mkdir -p "$dir"
    broker=$(free_port)
    controller=$(free_port)
    while [ "$controller" = "$broker" ]; do controller=$(free_port); done
    # scripts/kafka-cluster.sh's single-node sibling (gateway/bench/src/kafka/broker.rs), plus
    # the share-group settings franz-go's CI gives Kafka.
    cat >"$dir/server.properties" <<EOF
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$controller
listeners=PLAINTEXT://127.0.0.1:$broker,CONTROLLER://127.0.0.1:$controller
advertised.listeners=PLAINTEXT://127.0.0.1:$broker
controller.listener.names=CONTROLLER
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
inter.broker.listener.name=PLAINTEXT
log.dirs=$dir/data
num.partitions=1
default.replication.factor=1
offsets.topic.replication.factor=1
offsets.topic.num.partitions=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
group.initial.rebalance.delay.ms=0
group.coordinator.rebalance.protocols=classic,consumer,share
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
share.coordinator.state.topic.num.partitions=5
group.share.delivery.count.limit=10
EOF
    cat >"$dir/log4j2.properties" <<'EOF'
status = warn
appender.console.type = Console
appender.console.name = STDOUT
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = warn
rootLogger.appenderRef.stdout.ref = STDOUT
logger.raft.name = kafka.server.KafkaRaftServer
logger.raft.level = info
EOF
    local jvm=(java -Djava.awt.headless=true "-Dlog4j2.configurationFile=$dir/log4j2.properties"
        -cp "$classpath")
    "${jvm[@]}" -Xmx128m kafka.tools.StorageTool format -t dGVybi1mcmFuei1nby1rYQ \
        -c "$dir/server.properties" >"$logs/kafka-format.log" 2>&1 || {
        cat "$logs/kafka-format.log" >&2
        exit 1
    }
    "${jvm[@]}" -Xmx512m kafka.Kafka "$dir/server.properties" </dev/null >"$logs/kafka.log" 2>&1 &
    kafka_pid=$!
    wait_started kafka "$kafka_pid" "$logs/kafka.log" 0 'Kafka Server started' 180
    kafka_seeds=127.0.0.1:$broker
}

# --- one test ----------------------------------------------------------------------------
# run_test BROKER NAME SEEDS: sets $result (PASS, FAIL, SKIP, TIMEOUT), $secs and $reason.
run_test() {
    local broker=$1 name=$2 seeds=$3 out rc start
    out=$logs/$broker-$name.log
    start=$(date +%s)
    rc=0
    (
        cd "$work/src/pkg/kgo"
        env KGO_SEEDS="$seeds" KGO_TEST_RF=1 ${records:+KGO_TEST_RECORDS="$records"} \
            timeout -k 10 "$((limit + 30))" "$kgo_test" -test.run "^$name\$" -test.v \
            -test.timeout "${limit}s"
    ) >"$out" 2>&1 || rc=$?
    secs=$(($(date +%s) - start))
    reason=
    if [ "$rc" = 0 ]; then
        if grep -qE "^--- SKIP: $name " "$out"; then
            result=SKIP
            reason=$(grep -B3 -E "^--- SKIP: $name " "$out" | grep -E '_test\.go:[0-9]+:' |
                tail -n 1 | sed 's/^[[:space:]]*//' || true)
        else
            result=PASS
        fi
    elif [ "$rc" = 124 ] || [ "$rc" = 137 ] || grep -q '^panic: test timed out' "$out"; then
        result=TIMEOUT
        reason="no end within ${limit} s"
    else
        result=FAIL
        reason=$(grep -m1 -E '^[[:space:]]+[A-Za-z0-9_]+_test\.go:[0-9]+: ' "$out" |
            sed 's/^[[:space:]]*//' || true)
        [ -n "$reason" ] || reason=$(grep -m1 -E '^panic: |FAIL' "$out" || true)
    fi
}

# --- the run -----------------------------------------------------------------------------
run_start=$(date +%s)
if [ "$tern_only" = 0 ]; then
    start_kafka
    echo "kafka 4.4 on $kafka_seeds (pid $kafka_pid)" >&2
fi
start_tern
echo "tern ($tern_bin) on 127.0.0.1:$tern_port (pid $tern_pid)" >&2

declare -A kafka_result kafka_secs tern_result tern_secs tern_reason kafka_reason
deaths=()
for name in "${tests[@]}"; do
    if [ "$tern_only" = 0 ]; then
        run_test kafka "$name" "$kafka_seeds"
        kafka_result[$name]=$result kafka_secs[$name]=$secs kafka_reason[$name]=$reason
        if ! alive "$kafka_pid"; then
            echo "kafka died during $name; see $logs/kafka.log" >&2
            exit 1
        fi
    fi
    run_test tern "$name" "127.0.0.1:$tern_port"
    tern_result[$name]=$result tern_secs[$name]=$secs tern_reason[$name]=$reason
    if ! alive "$tern_pid"; then
        code=0
        wait "$tern_pid" || code=$?
        tern_result[$name]=DIED tern_reason[$name]="tern exited with code $code during the test"
        deaths+=("$name (exit $code)")
        {
            echo "!!! tern DIED during $name: exit code $code; last log lines:"
            tail -n 20 "$logs/tern.log" | sed 's/^/!!!   /'
            echo "!!! restarting tern for the next test"
        } >&2
        echo "=== tern died during $name (exit $code); restarted" >>"$logs/tern.log"
        start_tern
    fi
    if [ "$tern_only" = 0 ]; then
        printf '%-52s kafka %-7s %4ss   tern %-7s %4ss\n' "$name" "${kafka_result[$name]}" \
            "${kafka_secs[$name]}" "${tern_result[$name]}" "${tern_secs[$name]}" >&2
    else
        printf '%-52s tern %-7s %4ss\n' "$name" "${tern_result[$name]}" "${tern_secs[$name]}" >&2
    fi
done
wall=$(($(date +%s) - run_start))

# --- the table ---------------------------------------------------------------------------
n=${#tests[@]}
kafka_passed=0
tern_passed=0
regressions=()
unserved_failed=()
echo
echo "| test | kafka 4.4 | tern |"
echo "|---|---|---|"
for name in "${tests[@]}"; do
    t=${tern_result[$name]}
    [ "$t" = PASS ] && tern_passed=$((tern_passed + 1))
    if [ "$tern_only" = 0 ]; then
        k=${kafka_result[$name]}
        [ "$k" = PASS ] && kafka_passed=$((kafka_passed + 1))
        printf '| %s | %s %ss | %s %ss |\n' "$name" "$k" "${kafka_secs[$name]}" "$t" \
            "${tern_secs[$name]}"
    else
        k=PASS
        printf '| %s | - | %s %ss |\n' "$name" "$t" "${tern_secs[$name]}"
    fi
    if [ "$k" = PASS ] && [ "$t" != PASS ]; then
        if [[ $name =~ $unserved ]]; then
            unserved_failed+=("$name")
        else
            regressions+=("$name")
        fi
    fi
done
echo
for name in "${tests[@]}"; do
    case "${tern_result[$name]}" in
        PASS) ;;
        *) echo "tern ${tern_result[$name]} $name: ${tern_reason[$name]}" ;;
    esac
done
if [ "$tern_only" = 0 ]; then
    for name in "${tests[@]}"; do
        case "${kafka_result[$name]}" in
            PASS) ;;
            *) echo "kafka ${kafka_result[$name]} $name: ${kafka_reason[$name]}" ;;
        esac
    done
fi
echo
list() { if [ $# = 0 ]; then echo none; else local IFS=' '; echo "$*"; fi; }
if [ "$tern_only" = 0 ]; then
    echo "kafka: $kafka_passed passed of $n; tern: $tern_passed passed of $n;" \
        "tern fails where kafka passes: $(list "${regressions[@]}");" \
        "not passed, features tern does not serve (not failing the run):" \
        "$(list "${unserved_failed[@]}")"
else
    echo "tern: $tern_passed passed of $n; tern fails: $(list "${regressions[@]}");" \
        "not passed, features tern does not serve (not failing the run):" \
        "$(list "${unserved_failed[@]}")"
fi
if [ "${#deaths[@]}" -gt 0 ]; then
    echo "!!! tern DIED during: $(list "${deaths[@]}") (see $logs/tern.log)"
fi
echo "wall time ${wall} s; franz-go $franz_version; per-test limit ${limit} s; logs in $logs"
if [ "${#regressions[@]}" -gt 0 ] || [ "${#deaths[@]}" -gt 0 ]; then
    gate_failed=1
    exit 1
fi
