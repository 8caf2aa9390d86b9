//! Unit tests of `kafka/`: TLS settings, the upstream copy of an edge record, and batches.

use std::collections::BTreeMap;

use kafka_protocol::records::RecordBatchDecoder;
use tern_log::StoredRecord;

use super::record::*;
use super::*;
use crate::client::produce::{self, OutRecord, SEQUENCE_WRAP};
use crate::config::{Codec, ValueFormat};
use crate::provenance::{H_GATEWAY, H_OFFSET, H_PARTITION, H_TIMESTAMP, H_TOPIC, Provenance};

#[test]
fn a_ca_file_without_certificates_is_a_clear_error() -> std::io::Result<()> {
    let path = std::env::temp_dir().join(format!("tern-ca-{}.pem", std::process::id()));
    std::fs::write(&path, "not a certificate\n")?;
    let result = tls_config(&TlsSettings {
        ca_file: path.clone(),
    });
    std::fs::remove_file(&path)?;
    let err = result.err().map(|e| e.to_string()).unwrap_or_default();
    assert!(err.contains("holds no usable CA certificate"), "{err}");
    let missing = tls_config(&TlsSettings {
        ca_file: path.clone(),
    });
    assert!(matches!(missing, Err(UpstreamError::Tls { .. })));
    Ok(())
}

#[test]
fn upstream_records_carry_edge_fields_and_tern_headers() {
    let edge = StoredRecord {
        offset: 42,
        record: tern_log::Record {
            timestamp_ms: 1_700_000_000_123,
            key: Some(b"k".to_vec().into()),
            value: b"v".to_vec().into(),
            headers: tern_log::Headers::from(vec![
                ("tern-offset".into(), b"spoofed".to_vec().into()),
                ("tern-timestamp".into(), b"spoofed".to_vec().into()),
                ("unit".into(), b"C".to_vec().into()),
            ]),
        },
    };
    let source = Provenance {
        gateway: "gw1".into(),
        topic: "sensors".into(),
        partition: 3,
    };
    let record = upstream_record(&edge, &source, ValueFormat::Raw);
    assert_eq!(record.key.as_deref(), Some(&b"k"[..]));
    assert_eq!(record.value, b"v");
    assert_eq!(record.timestamp_ms, 1_700_000_000_123);
    let header = |name: &str| record.headers.get(name).map(Vec::as_slice);
    assert_eq!(header("unit"), Some(&b"C"[..]));
    assert_eq!(header(H_OFFSET), Some(&b"42"[..]));
    assert_eq!(header(H_GATEWAY), Some(&b"gw1"[..]));
    assert_eq!(header(H_TOPIC), Some(&b"sensors"[..]));
    assert_eq!(header(H_PARTITION), Some(&b"3"[..]));
    assert_eq!(header(H_TIMESTAMP), Some(&b"1700000000123"[..]));
}

#[test]
fn readings_can_be_forwarded_as_json_and_undecodable_values_stay_raw() {
    let reading = tern_shared::Reading {
        device_id: 7,
        sequence: 3,
        uptime_ms: 600,
        dropped: 0,
        values: tern_shared::SensorValues {
            temperature_centi_c: 2150,
            humidity_centi_pct: 4520,
            supply_mv: 3300,
        },
    };
    let mut buf = [0u8; 64];
    let encoded = reading.encode(&mut buf).expect("encodes").to_vec();
    let source = Provenance {
        gateway: "gw1".into(),
        topic: "mqtt".into(),
        partition: 0,
    };
    let edge = |value: Vec<u8>| StoredRecord {
        offset: 0,
        record: tern_log::Record {
            timestamp_ms: 1_700_000_000_000,
            key: None,
            value: value.into(),
            headers: tern_log::Headers::new(),
        },
    };
    let record = upstream_record(&edge(encoded), &source, ValueFormat::ReadingJson);
    let json: serde_json::Value = serde_json::from_slice(&record.value).expect("JSON");
    assert_eq!(json["device_id"], 7);
    assert_eq!(json["sequence"], 3);
    assert!(!record.headers.contains_key(H_DECODE_ERROR));

    let record = upstream_record(
        &edge(b"not a reading".to_vec()),
        &source,
        ValueFormat::ReadingJson,
    );
    assert_eq!(record.value, b"not a reading");
    let reason = record
        .headers
        .get(H_DECODE_ERROR)
        .expect("decode error header");
    assert!(String::from_utf8_lossy(reason).contains("not a reading"));
}

#[test]
fn produced_bytes_count_key_value_every_header_and_framing() {
    let edge = StoredRecord {
        offset: 7,
        record: tern_log::Record {
            timestamp_ms: 0,
            key: Some(b"key".to_vec().into()),
            value: vec![0; 100].into(),
            headers: tern_log::Headers::new(),
        },
    };
    let source = Provenance {
        gateway: "gw".into(),
        topic: "t".into(),
        partition: 0,
    };
    let record = upstream_record(&edge, &source, ValueFormat::Raw);
    // tern-gateway gw, tern-topic t, tern-partition 0, tern-offset 7, tern-timestamp 0.
    let headers = (12 + 2) + (10 + 1) + (14 + 1) + (11 + 1) + (14 + 1);
    assert_eq!(produced_bytes(&record), 3 + 100 + headers + 14);
}

#[test]
fn batches_are_split_in_order_under_the_byte_limit() {
    let record = |len: usize| OutRecord {
        key: None,
        value: vec![b'x'; len],
        headers: BTreeMap::new(),
        timestamp_ms: 0,
    };
    // 86 + 14 = 100 bytes each; a limit of 250 holds two; a record above it travels alone.
    let records = vec![record(86), record(86), record(86), record(486), record(86)];
    let sizes: Vec<(Vec<usize>, u64)> = split(records, 250)
        .into_iter()
        .map(|(batch, bytes)| {
            let lens = batch.iter().map(|r| r.value.len()).collect();
            (lens, bytes)
        })
        .collect();
    assert_eq!(
        sizes,
        [
            (vec![86, 86], 200),
            (vec![86], 100),
            (vec![486], 500),
            (vec![86], 100)
        ]
    );
}

fn record_of(bytes: usize) -> OutRecord {
    OutRecord {
        key: None,
        value: vec![b'x'; bytes],
        headers: BTreeMap::new(),
        timestamp_ms: 0,
    }
}

#[test]
fn idempotent_batches_hold_consecutive_sequences_only() {
    let size = produced_bytes(&record_of(10));
    // A gap in edge offsets and the sequence wrap both start a new request.
    let wrap = SEQUENCE_WRAP;
    let offsets = [5, 6, 7, 9, 10, wrap - 1, wrap, wrap + 1];
    let records: Vec<OutRecord> = offsets.iter().map(|_| record_of(10)).collect();
    let lengths: Vec<usize> = split_idempotent(records, &offsets, 100 * size)
        .iter()
        .map(|(batch, _)| batch.len())
        .collect();
    assert_eq!(lengths, [3, 2, 1, 2]);
    // And the byte limit still applies.
    let records: Vec<OutRecord> = (0..5).map(|_| record_of(10)).collect();
    let lengths: Vec<usize> = split_idempotent(records, &[0, 1, 2, 3, 4], 2 * size)
        .iter()
        .map(|(batch, _)| batch.len())
        .collect();
    assert_eq!(lengths, [2, 2, 1]);
}

#[test]
fn an_idempotent_batch_carries_the_producer_and_the_edge_offsets_as_sequences()
-> Result<(), Box<dyn std::error::Error>> {
    let identity = crate::producer::Identity {
        cluster_id: "c".into(),
        producer_id: 4711,
        epoch: 2,
    };
    let mut records: Vec<OutRecord> = (0..3).map(|_| record_of(10)).collect();
    records[1]
        .headers
        .insert("tern-offset".into(), b"7985".to_vec());
    for codec in [
        Codec::None,
        Codec::Gzip,
        Codec::Lz4,
        Codec::Snappy,
        Codec::Zstd,
    ] {
        let encoded = produce::encode_batch(identity.stamp(), 7984, records.clone(), codec)?;
        let info = RecordBatchDecoder::decode_batch_info(&mut encoded.clone())?;
        assert_eq!(info.len(), 1, "one batch per request");
        let mut encoded = encoded;
        let decoded = RecordBatchDecoder::decode(&mut encoded)?.records;
        assert_eq!(decoded.len(), 3, "{codec:?}");
        for (i, record) in decoded.iter().enumerate() {
            assert_eq!(record.producer_id, 4711);
            assert_eq!(record.producer_epoch, 2);
            assert_eq!(record.sequence, 7984 + i as i32, "{codec:?}");
            assert_eq!(record.offset, i as i64);
            assert!(!record.transactional);
        }
        let header = decoded[1]
            .headers
            .iter()
            .find(|(k, _)| k.as_str() == "tern-offset")
            .and_then(|(_, v)| v.clone());
        assert_eq!(header.as_deref(), Some(&b"7985"[..]));
    }
    Ok(())
}

#[test]
fn an_existing_create_time_topic_is_warned_about_and_log_append_time_is_not() {
    let configs = |kind: Option<&str>| -> Vec<(String, Option<String>)> {
        let mut configs = vec![("retention.ms".to_owned(), Some("604800000".to_owned()))];
        if let Some(kind) = kind {
            configs.push(("message.timestamp.type".to_owned(), Some(kind.to_owned())));
        }
        configs
    };
    let warning = super::existing_topic_warning(&configs(Some("CreateTime")));
    let warning = warning.unwrap_or_default();
    assert!(warning.contains("retention.ms=604800000"), "{warning}");
    assert!(warning.contains("LogAppendTime"), "{warning}");
    assert_eq!(
        super::existing_topic_warning(&configs(Some("LogAppendTime"))),
        None
    );
    // A broker that leaves the config out (or hides it) is not guessed at.
    assert_eq!(super::existing_topic_warning(&configs(None)), None);
}

#[test]
fn reconnect_gaps_grow_by_half_to_their_cap_and_are_jittered_between_half_and_whole() {
    let max = Duration::from_secs(5);
    let whole = |failures| reconnect_gap(failures, max, 1.0);
    let gaps: Vec<u128> = (1..=8).map(|n| whole(n).as_millis()).collect();
    assert_eq!(gaps, [500, 750, 1125, 1687, 2531, 3796, 5000, 5000]);
    assert_eq!(reconnect_gap(1, max, 0.0), Duration::from_millis(250));
    assert_eq!(reconnect_gap(40, max, 0.0), Duration::from_millis(2500));
    assert_eq!(
        reconnect_gap(u32::MAX, max, 0.5),
        Duration::from_millis(3750)
    );
    // A cap below the first gap leaves the first gap.
    assert_eq!(reconnect_gap(9, Duration::ZERO, 1.0), PROBE_INTERVAL);
    let drawn: Vec<f64> = (0..64).map(|_| jitter()).collect();
    assert!(drawn.iter().all(|r| (0.0..1.0).contains(r)), "{drawn:?}");
    assert!(drawn.windows(2).any(|w| w[0] != w[1]), "{drawn:?}");
}

/// How long each of `rounds` failed connects in a row held the next one, looked at every `step`
/// on the paused clock, with `reconnect_max` = `max` and `reconnect_jitter` = `jitter`.
async fn held_gaps(max: Duration, jitter: bool, rounds: usize, step: Duration) -> Vec<Duration> {
    let upstream = KafkaUpstream::new(&UpstreamConfig {
        bootstrap: vec!["127.0.0.1:9".into()],
        reconnect_max: tern_core::HumanDuration(max),
        reconnect_jitter: jitter,
        ..UpstreamConfig::default()
    })
    .expect("an upstream");
    let slot = &upstream.slot;
    let refused = || ClientError::Timeout {
        addr: "127.0.0.1:9".into(),
        op: "connect",
    };
    let mut held = Vec::new();
    for _ in 0..rounds {
        assert!(slot.install(Err(refused())).is_err());
        let started = tokio::time::Instant::now();
        while slot.live_or_recent_failure().is_err() {
            tokio::time::sleep(step).await;
        }
        held.push(started.elapsed());
    }
    assert_eq!(
        slot.lock().failures,
        u32::try_from(rounds).unwrap_or(u32::MAX)
    );
    held
}

#[tokio::test(start_paused = true)]
async fn failed_connects_hold_the_next_one_for_a_growing_jittered_gap() {
    let held = held_gaps(Duration::from_secs(5), true, 6, Duration::from_millis(10)).await;
    // Each gap between half and whole of 500 ms × 1.5^n (10 ms steps of the look).
    let wholes = [500u64, 750, 1125, 1687, 2531, 3796];
    for (gap, whole) in held.iter().zip(wholes) {
        let range = Duration::from_millis(whole / 2)..=Duration::from_millis(whole + 10);
        assert!(range.contains(gap), "{held:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn without_jitter_each_gap_is_its_whole() {
    let held: Vec<u128> = held_gaps(Duration::from_secs(2), false, 5, Duration::from_millis(1))
        .await
        .iter()
        .map(Duration::as_millis)
        .collect();
    // 500 ms × 1.5^n up to the 2 s cap, to the millisecond step of the look.
    let wholes = [500u128, 750, 1125, 1687, 2000];
    for (gap, whole) in held.iter().zip(wholes) {
        assert!((whole..=whole + 1).contains(gap), "{held:?}");
    }
}
