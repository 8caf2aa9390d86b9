//! Kafka's own producer against a gateway that dies between storing a batch and answering it
//! (issue 24): the producer's answers are lost on the way (a proxy drops them), tern is
//! SIGKILLed once the batch is durable, and the producer resends it to the restarted gateway.
//! An idempotent producer's retry is recognised from the producer stamp stored with the batch
//! and answered with the first copy's offset; the negative control, the same run with
//! `enable.idempotence=false`, stores the resent batch twice, so the harness is shown to put
//! the kill between the write and the answer.

use std::io::Write;
use std::time::Duration;

use anyhow::{Context, bail};
use tern_tests::kafka_tools::spawn_tool_at;
use tern_tests::proxy::TcpProxy;
use tern_tests::{Gateway, TempDir, free_port, read_log, wait_until};

const TOPIC: &str = "crash";

/// `lines` values `v{from}`..`v{from + lines}`, one per line.
fn values(from: usize, lines: usize) -> String {
    (from..from + lines).map(|i| format!("v{i}\n")).collect()
}

/// Runs the producer across a crash; returns the values the log holds, in offset order.
fn produce_across_a_crash(label: &str, idempotent: bool) -> anyhow::Result<Vec<String>> {
    let dir = TempDir::new(label)?;
    let kafka = free_port()?;
    let proxy = TcpProxy::start("127.0.0.1:0".parse()?, kafka)?;
    // Clients learn the proxy's address from Metadata, so every connection goes through it.
    let config = dir.path().join("tern.toml");
    std::fs::write(
        &config,
        format!("[kafka_listener]\nadvertised = \"{}\"\n", proxy.addr()),
    )?;
    let data = dir.path().join("data");
    let (config, data, kafka_listen) = (
        config.display().to_string(),
        data.display().to_string(),
        kafka.to_string(),
    );
    let serve = [
        "serve",
        "--config",
        &config,
        "--data-dir",
        &data,
        "--mqtt-listen",
        "127.0.0.1:0",
        "--admin-listen",
        "127.0.0.1:0",
        "--kafka-listen",
        &kafka_listen,
    ];
    let mut gateway = Gateway::start_exact(dir.path(), &serve)?;
    let idempotence = format!("enable.idempotence={idempotent}");
    let mut properties = vec![
        "acks=all",
        &idempotence,
        // One batch for the lines written at once; retries for as long as the test runs.
        "linger.ms=200",
        "retries=2147483647",
        "delivery.timeout.ms=120000",
        "request.timeout.ms=20000",
        "retry.backoff.ms=100",
        "reconnect.backoff.ms=100",
        "reconnect.backoff.max.ms=500",
    ];
    if !idempotent {
        // Kafka's producer refuses more in flight without idempotence only for ordering.
        properties.push("max.in.flight.requests.per.connection=1");
    }
    let mut args = vec!["--topic", TOPIC];
    for property in &properties {
        args.extend(["--producer-property", property]);
    }
    let bootstrap = proxy.addr().to_string();
    let mut producer = spawn_tool_at(
        dir.path(),
        &bootstrap,
        "org.apache.kafka.tools.ConsoleProducer",
        &args,
    )?;
    let outcome = (|| -> anyhow::Result<()> {
        let mut input = producer.stdin.take().context("producer stdin")?;
        let labels = format!("topic=\"{TOPIC}\",partition=\"0\"");
        // Writes ten more values and waits until the log's durable end reaches `end`.
        let mut send_until = |gateway: &mut Gateway, from: usize, what: &str| {
            input.write_all(values(from, 10).as_bytes())?;
            input.flush()?;
            let end = u64::try_from(from + 10)?;
            gateway.wait_metric(
                "tern_log_end_offset",
                &labels,
                what,
                Duration::from_secs(60),
                |stored| stored == Some(end),
            )
        };
        send_until(&mut gateway, 0, "the first ten records stored and answered")?;
        // The next batch is stored, but its answer never reaches the producer.
        proxy.lose_responses(true);
        send_until(
            &mut gateway,
            10,
            "the second batch durable, its answer lost",
        )?;
        gateway.signal(libc::SIGKILL)?;
        gateway.wait_exit(Duration::from_secs(20))?;
        proxy.lose_responses(false);
        gateway = Gateway::start_exact(dir.path(), &serve)?;
        input.write_all(values(20, 10).as_bytes())?;
        drop(input);
        let mut status = None;
        wait_until(
            Duration::from_secs(120),
            "the producer delivered and exited",
            || {
                status = producer.try_wait()?;
                Ok(status.is_some())
            },
        )?;
        if !status.is_some_and(|s| s.success()) {
            bail!("the console producer failed: {status:?}");
        }
        Ok(())
    })();
    if outcome.is_err() {
        let _ = producer.kill();
    }
    let output = producer.wait_with_output()?;
    outcome
        .with_context(|| format!("producer said: {}", String::from_utf8_lossy(&output.stderr)))?;
    gateway.stop()?;
    Ok(read_log(std::path::Path::new(&data), TOPIC)?
        .into_iter()
        .map(|r| r.value)
        .collect())
}

#[test]
fn an_idempotent_producers_batch_resent_after_a_gateway_crash_is_stored_once() -> anyhow::Result<()>
{
    let stored = produce_across_a_crash("kafka-crash-idempotent", true)?;
    let expected: Vec<String> = (0..30).map(|i| format!("v{i}")).collect();
    assert_eq!(stored, expected, "each value once, in order");
    let control = produce_across_a_crash("kafka-crash-control", false)?;
    let twice = (10..20)
        .filter(|i| control.iter().filter(|v| **v == format!("v{i}")).count() == 2)
        .count();
    eprintln!(
        "negative control (enable.idempotence=false): {} records stored for 30 values, {twice} of the lost answers' values twice",
        control.len()
    );
    assert!(
        twice > 0,
        "without idempotence the resent batch must be stored twice (the kill fell between the write and the answer): {control:?}"
    );
    Ok(())
}
