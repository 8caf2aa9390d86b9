//! The downstream's bookkeeping on the honest in-memory log (nothing visible before it is
//! durable): what an append stores, when a position only skipped records moved is stored, and
//! that a failed append claims nothing. No Kafka: `store` and `Book::load` never reach it.

use std::time::Duration;

use tern_core::HumanDuration;
use tern_log::{MemoryLog, Record};

use super::*;

fn downstream(log: &MemoryLog) -> Result<Downstream<MemoryLog>, UpstreamError> {
    let commands = CommandsConfig {
        allow: vec!["#".to_owned()],
        checkpoint_interval: HumanDuration(Duration::from_secs(60)),
        ..CommandsConfig::default()
    };
    let config = UpstreamConfig {
        // Never contacted: these tests only store.
        bootstrap: vec!["127.0.0.1:9".to_owned()],
        commands: Some(commands.clone()),
        ..UpstreamConfig::default()
    };
    ensure_log_topic(log, &commands.log_topic)?;
    let book = Book::load(log, &commands, Ablation::NONE)?;
    let settings = Settings {
        bootstrap: config.bootstrap.clone(),
        tls: None,
        sasl: None,
    };
    Ok(Downstream {
        kafka: KafkaUpstream::new(&config)?,
        group: GroupClient::new(settings, "g".to_owned()),
        book: tokio::sync::Mutex::new(book),
        commands,
        config,
        ablation: Ablation::NONE,
        gateway: "gw".to_owned(),
        log: log.clone(),
        status: StatusMap::default(),
    })
}

fn command(value: &str) -> Record {
    Record {
        timestamp_ms: 1,
        key: None,
        value: value.as_bytes().to_vec().into(),
        headers: tern_log::Headers::from(vec![(
            "mqtt.topic".into(),
            b"devices/1/cmd".to_vec().into(),
        )]),
    }
}

fn stored(log: &MemoryLog) -> Result<Vec<Record>, LogError> {
    Ok(log
        .read("commands", 0, 0, usize::MAX)?
        .into_iter()
        .map(|r| r.record)
        .collect())
}

#[tokio::test(start_paused = true)]
async fn commands_and_the_position_after_them_are_one_append_read_back_at_start()
-> Result<(), Box<dyn std::error::Error>> {
    let log = MemoryLog::new(1);
    let first = downstream(&log)?;
    first
        .store(0, vec![command("a"), command("b")], 12, false)
        .await?;
    first.store(2, vec![command("c")], 5, false).await?;
    let records = stored(&log)?;
    let values: Vec<&[u8]> = records.iter().map(|r| &r.value[..]).collect();
    assert_eq!(values[..2], [b"a", b"b"]);
    assert_eq!(records[2].header(H_POSITION), Some(&b"tern-commands"[..]));
    assert_eq!(
        decode_position(&records[2].value)?,
        Positions::from([(0, 12)])
    );
    assert_eq!(
        decode_position(&records[4].value)?,
        Positions::from([(0, 12), (2, 5)])
    );
    // A restart reads the last one back.
    let again = downstream(&log)?;
    assert_eq!(
        again.book.lock().await.next,
        Positions::from([(0, 12), (2, 5)])
    );
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn a_position_moved_only_by_other_gateways_records_is_stored_at_most_once_a_checkpoint()
-> Result<(), Box<dyn std::error::Error>> {
    let log = MemoryLog::new(1);
    let downstream = downstream(&log)?;
    downstream.store(0, Vec::new(), 3, true).await?;
    assert_eq!(
        stored(&log)?.len(),
        1,
        "a forced position is stored at once"
    );
    downstream.store(0, Vec::new(), 7, false).await?;
    downstream.store(1, Vec::new(), 2, false).await?;
    assert_eq!(
        stored(&log)?.len(),
        1,
        "skips within the interval only noted"
    );
    tokio::time::advance(Duration::from_secs(61)).await;
    downstream.store(0, Vec::new(), 9, false).await?;
    let records = stored(&log)?;
    assert_eq!(records.len(), 2);
    assert_eq!(
        decode_position(&records[1].value)?,
        Positions::from([(0, 9), (1, 2)])
    );
    // An append of commands stores the noted position with it.
    downstream.store(1, Vec::new(), 4, false).await?;
    downstream.store(0, vec![command("x")], 10, false).await?;
    let last = stored(&log)?.pop().ok_or("no record")?;
    assert_eq!(
        decode_position(&last.value)?,
        Positions::from([(0, 10), (1, 4)])
    );
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn a_failed_append_claims_nothing_in_later_positions()
-> Result<(), Box<dyn std::error::Error>> {
    let log = MemoryLog::new(1);
    let downstream = downstream(&log)?;
    downstream.store(0, vec![command("a")], 1, false).await?;
    log.set_disk_full(true);
    let failed = downstream.store(1, vec![command("lost")], 8, false).await;
    assert!(failed.is_err(), "{failed:?}");
    log.set_disk_full(false);
    downstream.store(0, vec![command("b")], 2, false).await?;
    let last = stored(&log)?.pop().ok_or("no record")?;
    assert_eq!(
        decode_position(&last.value)?,
        Positions::from([(0, 2)]),
        "partition 1 resumes before the command that was never stored"
    );
    Ok(())
}
