//! Topic administration on the fault-injecting file system: create, grow and delete survive a
//! reopen; deletion is refused while in use; and a power cut at every operation of a deletion
//! or a growth leaves the topic either as it was or as asked, never half of each.

use super::super::super::fs::{CrashMode, FaultyFs};
use super::super::super::tests::{open, read_all, record, runtime};
use super::super::super::{LogConfig, LogError, OnFull, TopicOverride};
use super::*;

fn config() -> LogConfig {
    LogConfig {
        // Small segments: the fault-injecting disk preallocates them in memory.
        segment_bytes: tern_core::ByteSize(64 << 10),
        topic: vec![TopicOverride {
            name: "alarms".to_owned(),
            retention_bytes: Some(tern_core::ByteSize(1 << 30)),
            on_full: Some(OnFull::Reject),
            ..TopicOverride::default()
        }],
        ..LogConfig::default()
    }
}

async fn fill(log: &Log, topic: &str, partitions: u32) {
    for p in 0..partitions {
        log.append(
            topic,
            p,
            vec![record(u64::from(p), 0, 1), record(u64::from(p), 1, 2)],
        )
        .await
        .expect("append");
    }
}

#[test]
fn created_and_grown_topics_survive_a_reopen() {
    let rt = runtime();
    let fs = FaultyFs::new(1);
    rt.block_on(async {
        let log = open(&fs, &config()).await;
        assert_eq!(log.create_topic("t", 3).expect("creates").partitions, 3);
        assert!(matches!(
            log.create_topic("t", 3),
            Err(LogError::TopicExists { .. })
        ));
        assert!(matches!(
            log.create_topic("u", 0),
            Err(LogError::InvalidPartitions { .. })
        ));
        assert!(matches!(
            log.create_topic("a/b", 1),
            Err(LogError::InvalidTopicName { .. })
        ));
        fill(&log, "t", 3).await;
        assert!(matches!(
            log.add_partitions("t", 3),
            Err(LogError::InvalidPartitions { .. })
        ));
        assert!(matches!(
            log.add_partitions("x", 3),
            Err(LogError::UnknownTopic { .. })
        ));
        assert_eq!(log.add_partitions("t", 5).expect("grows").partitions, 5);
        log.append("t", 4, vec![record(9, 0, 3)])
            .await
            .expect("new partition takes appends");
        log.close().await.expect("close");
        let log = open(&fs, &config()).await;
        let t = log
            .topics()
            .into_iter()
            .find(|t| t.name == "t")
            .expect("kept");
        assert_eq!(t.partitions, 5);
        assert_eq!(read_all(&log, "t", 0).len(), 2);
        assert_eq!(read_all(&log, "t", 3).len(), 0);
        assert_eq!(read_all(&log, "t", 4).len(), 1);
    });
}

#[test]
fn a_topics_own_settings_survive_a_reopen_and_growth_and_go_with_it() {
    let rt = runtime();
    let fs = FaultyFs::new(3);
    let given = crate::TopicConfig::from([("max.message.bytes".to_owned(), "51200".to_owned())]);
    rt.block_on(async {
        let log = open(&fs, &config()).await;
        log.create_topic_with("t", 1, &given).expect("creates");
        log.create_topic("plain", 1).expect("creates");
        assert_eq!(*log.topic_config("t").expect("exists"), given);
        assert!(log.topic_config("plain").expect("exists").is_empty());
        assert!(
            fs.contents()
                .contains_key(std::path::Path::new("/data/log/topics/t/topic.config"))
        );
        let too_many: crate::TopicConfig =
            (0..100).map(|i| (format!("k{i}"), String::new())).collect();
        assert!(matches!(
            log.create_topic_with("u", 1, &too_many),
            Err(LogError::InvalidTopicConfig { .. })
        ));
        log.add_partitions("t", 2).expect("grows");
        assert_eq!(*log.topic_config("t").expect("exists"), given);
        log.close().await.expect("close");
        let log = open(&fs, &config()).await;
        assert_eq!(*log.topic_config("t").expect("kept"), given);
        log.delete_topic("t").await.expect("deletes");
        log.create_topic("t", 1).expect("the name is free again");
        assert!(log.topic_config("t").expect("exists").is_empty());
    });
}

#[test]
fn a_deletion_is_refused_while_in_use_and_leaves_nothing_behind() {
    let rt = runtime();
    let fs = FaultyFs::new(2);
    rt.block_on(async {
        let log = open(&fs, &config()).await;
        log.create_topic("t", 2).expect("creates");
        fill(&log, "t", 2).await;
        log.cursors()
            .commit("group:g", "t", 1, 1)
            .await
            .expect("cursor");
        let refused = log.delete_topic("t").await.expect_err("a cursor holds it");
        assert!(refused.to_string().contains("group:g"), "{refused}");
        assert!(matches!(
            log.delete_topic("__mqtt_state").await,
            Err(LogError::TopicInUse { .. })
        ));
        log.cursors()
            .remove("group:g")
            .await
            .expect("remove cursor");
        log.delete_topic("t").await.expect("deletes");
        assert!(matches!(
            log.offsets("t", 0),
            Err(LogError::UnknownTopic { .. })
        ));
        assert!(matches!(
            log.delete_topic("t").await,
            Err(LogError::UnknownTopic { .. })
        ));
        let left: Vec<_> = fs
            .contents()
            .into_keys()
            .filter(|p| p.starts_with("/data/log/topics/t"))
            .collect();
        assert!(left.is_empty(), "{left:?}");
        log.create_topic("t", 1).expect("the name is free again");
        assert!(
            read_all(&log, "t", 0).is_empty(),
            "a new topic starts empty"
        );
        log.close().await.expect("close");
        let log = open(&fs, &config()).await;
        assert_eq!(log.topics().iter().filter(|t| t.name == "t").count(), 1);
        assert!(read_all(&log, "t", 0).is_empty());
    });
}

#[test]
fn settings_are_the_topics_effective_ones() {
    let rt = runtime();
    let fs = FaultyFs::new(3);
    rt.block_on(async {
        let log = open(&fs, &config()).await;
        log.create_topic("alarms", 4).expect("creates");
        let settings = log.topic_settings("alarms").expect("known");
        assert_eq!(settings.partitions, 4, "the topic's count, not the default");
        assert_eq!(settings.retention_bytes, 1 << 30);
        assert_eq!(settings.on_full, OnFull::Reject);
        assert!(log.topic_settings("none").is_err());
        assert_eq!(log.default_partitions("other"), 1);
    });
}

/// What a reopened log holds of topic `t`: its partition count and records per partition.
async fn shape(fs: &FaultyFs) -> Option<(u32, Vec<usize>)> {
    let log = open(fs, &config()).await;
    let info = log.topics().into_iter().find(|t| t.name == "t");
    let shape = info.map(|t| {
        let counts = (0..t.partitions)
            .map(|p| read_all(&log, "t", p).len())
            .collect();
        (t.partitions, counts)
    });
    log.close().await.expect("close");
    shape
}

#[test]
fn a_power_cut_during_delete_or_growth_leaves_one_state_or_the_other() {
    let rt = runtime();
    let before = Some((2, vec![2, 2]));
    let grown = Some((4, vec![2, 2, 0, 0]));
    let mut outcomes = std::collections::BTreeSet::new();
    for grow in [false, true] {
        for cut_after in 0..40 {
            let fs = FaultyFs::new(cut_after);
            rt.block_on(async {
                let log = open(&fs, &config()).await;
                log.create_topic("t", 2).expect("creates");
                fill(&log, "t", 2).await;
                fs.fail_after(cut_after);
                let _ = if grow {
                    log.add_partitions("t", 4).map(|_| ())
                } else {
                    log.delete_topic("t").await
                };
                let _ = log.close().await;
                fs.crash(CrashMode::DropUnsynced);
                let after = shape(&fs).await;
                let expected = if grow { &grown } else { &None };
                assert!(
                    after == before || after == *expected,
                    "grow={grow} cut after {cut_after} ops: {after:?}"
                );
                outcomes.insert((grow, after == before));
                // Whatever is left, the name can be used again.
                let log = open(&fs, &config()).await;
                if after.is_none() {
                    log.create_topic("t", 3).expect("recreates");
                    assert!((0..3).all(|p| read_all(&log, "t", p).is_empty()));
                }
                log.close().await.expect("close");
            });
        }
    }
    assert_eq!(
        outcomes.len(),
        4,
        "both outcomes seen for both changes: {outcomes:?}"
    );
}
