//! The MQTT durability promises against the real binary and log: every PUBACKed message
//! survives SIGKILL and reaches a persistent subscriber; a full log is refused with MQTT 5
//! "quota exceeded" or a withheld MQTT 3.1.1 PUBACK, never acknowledged.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tern_tests::raw_mqtt::RawClient;
use tern_tests::{Gateway, ServeOptions, TempDir, read_log, wait_until};

/// A process-crash test: tern is SIGKILLed three times while 20 publishers keep publishing, and
/// every PUBACKed message must be in the log and reach the persistent subscriber. The page cache
/// survives SIGKILL, so this proves nothing about power cuts; that proof is the fault-injecting
/// file system in tern-log's tests (`gateway/log/src/tests/crash.rs`).
#[test]
fn every_acknowledged_qos1_message_survives_repeated_process_crashes() -> anyhow::Result<()> {
    const PUBLISHERS: usize = 20;
    let dir = TempDir::new("mqtt-process-crash")?;
    let mut gateway = Gateway::start(dir.path(), &ServeOptions::default())?;
    let mut subscriber = RawClient::connect(gateway.mqtt, "process-crash-sub", 60, false, false)?;
    assert_eq!(subscriber.subscribe("process-crash/#", 1, 1)?, 1);
    subscriber.disconnect()?;

    let addr = Arc::new(Mutex::new(gateway.mqtt));
    let running = Arc::new(AtomicBool::new(true));
    let acked = Arc::new(Mutex::new(Vec::new()));
    let mut threads = Vec::new();
    for publisher in 0..PUBLISHERS {
        let (addr, running, acked) = (addr.clone(), running.clone(), acked.clone());
        threads.push(std::thread::spawn(move || {
            publish_until_stopped(publisher, &addr, &running, &acked)
        }));
    }
    for _ in 0..3 {
        wait_for_more_acks(&acked, 200)?;
        gateway.signal(libc::SIGKILL)?;
        gateway.wait_exit(Duration::from_secs(10))?;
        gateway = Gateway::start(dir.path(), &ServeOptions::default())?;
        *addr.lock().unwrap_or_else(|e| e.into_inner()) = gateway.mqtt;
    }
    wait_for_more_acks(&acked, 200)?;
    running.store(false, Ordering::SeqCst);
    for thread in threads {
        let _ = thread.join();
    }
    let acked: BTreeSet<String> = acked
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .cloned()
        .collect();
    assert!(
        acked.len() > 100,
        "too few acknowledged messages: {}",
        acked.len()
    );

    let mut subscriber = RawClient::connect(gateway.mqtt, "process-crash-sub", 60, false, false)?;
    let mut received = BTreeSet::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !acked.is_subset(&received) && Instant::now() < deadline {
        let publish = subscriber.next_publish()?;
        received.insert(String::from_utf8_lossy(&publish.payload).into_owned());
    }
    let missed = acked.difference(&received).count();
    assert_eq!(
        missed,
        0,
        "the persistent subscriber missed {missed} of {}",
        acked.len()
    );
    gateway.stop()?;

    let stored: BTreeSet<String> = read_log(dir.path(), "mqtt")?
        .into_iter()
        .map(|r| r.value)
        .collect();
    let lost: Vec<&String> = acked.difference(&stored).collect();
    assert!(
        lost.is_empty(),
        "{} of {} acknowledged messages lost, e.g. {:?}",
        lost.len(),
        acked.len(),
        lost.first()
    );
    eprintln!(
        "process-crash test: {} acknowledged messages, all stored and delivered",
        acked.len()
    );
    Ok(())
}

/// Waits until `more` publishes beyond those acknowledged so far are acknowledged: the
/// publishers are connected to the current gateway and in full flow.
fn wait_for_more_acks(acked: &Mutex<Vec<String>>, more: usize) -> anyhow::Result<()> {
    let count = || acked.lock().unwrap_or_else(|e| e.into_inner()).len();
    let target = count() + more;
    let what = format!("{more} more acknowledged publishes");
    wait_until(Duration::from_secs(30), &what, || Ok(count() >= target))
}

/// One process-crash-test publisher: QoS 1 messages with unique payloads, one at a time, reconnecting
/// after every failure; records each payload whose PUBACK arrived.
fn publish_until_stopped(
    publisher: usize,
    addr: &Mutex<SocketAddr>,
    running: &AtomicBool,
    acked: &Mutex<Vec<String>>,
) {
    let mut sequence = 0u64;
    while running.load(Ordering::SeqCst) {
        let target = *addr.lock().unwrap_or_else(|e| e.into_inner());
        let id = format!("process-crash-{publisher}");
        let Ok(mut client) = RawClient::connect(target, &id, 30, true, false) else {
            // tern is down between a SIGKILL and its restart: pause between reconnect attempts.
            std::thread::sleep(Duration::from_millis(50));
            continue;
        };
        while running.load(Ordering::SeqCst) {
            sequence += 1;
            let payload = format!("p{publisher}-m{sequence}");
            let pkid = (sequence % 65_535 + 1) as u16;
            let topic = format!("process-crash/{publisher}");
            match client.publish_qos1(&topic, payload.as_bytes(), pkid) {
                Ok(0) => acked
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(payload),
                _ => break,
            }
        }
    }
}

#[test]
fn a_full_log_gets_quota_exceeded_on_v5_and_no_puback_on_v311() -> anyhow::Result<()> {
    let dir = TempDir::new("mqtt-full")?;
    let config = dir.path().join("tern.toml");
    std::fs::write(
        &config,
        "[log]\nsegment_bytes = \"4KiB\"\n[log.retention]\nbytes = \"16KiB\"\non_full = \"reject\"\n",
    )?;
    let options = ServeOptions {
        args: vec!["--config".to_owned(), config.display().to_string()],
        ..ServeOptions::default()
    };
    let mut gateway = Gateway::start(dir.path(), &options)?;
    // A persistent session that never reads keeps its cursor at the start of the log.
    let mut laggard = RawClient::connect(gateway.mqtt, "laggard", 60, false, false)?;
    assert_eq!(laggard.subscribe("fill/#", 1, 1)?, 1);
    laggard.disconnect()?;

    let mut v5 = RawClient::connect(gateway.mqtt, "filler", 60, true, true)?;
    let payload = vec![b'x'; 1000];
    let mut stored = 0;
    let mut refused = None;
    for pkid in 1..=200u16 {
        match v5.publish_qos1("fill/a", &payload, pkid)? {
            0 => stored += 1,
            reason => {
                refused = Some(reason);
                break;
            }
        }
    }
    assert_eq!(
        refused,
        Some(0x97),
        "MQTT 5 gets quota exceeded once the log is full"
    );
    assert!(stored > 5, "{stored} stored before the log filled");

    let mut v4 = RawClient::connect(gateway.mqtt, "old-device", 60, true, false)?;
    v4.publish("fill/b", &payload, 1, 7, false)?;
    v4.write_packet(0xc0, &[])?;
    let (first, _) = v4.read_packet()?;
    assert_eq!(first, 0xd0, "PINGRESP arrives; the PUBACK is withheld");
    v4.set_timeout(Duration::from_millis(500))?;
    assert!(
        v4.read_packet().is_err(),
        "no PUBACK for a message not stored"
    );
    gateway.stop()?;

    let records = read_log(dir.path(), "mqtt")?;
    assert_eq!(
        records.len(),
        stored,
        "exactly the acknowledged messages are stored"
    );
    Ok(())
}
