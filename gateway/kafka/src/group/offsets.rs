//! A consumer group's committed offsets are cursors in the log's cursor store: group `g`'s
//! offset for partition `p` of topic `t` is cursor `kafka.group:g` at (`t`, `p`), holding the
//! next offset to read exactly as Kafka's committed offset does. So they survive restarts,
//! hold retention like every cursor, show in `tern cursors list` under owner `kafka group`,
//! and cannot collide with MQTT's cursors (`mqtt:…`, `mqtt-sent:…`, `mqtt.share:…`).
//!
//! Only offsets are stored: the commit's metadata string and leader epoch are not kept
//! (OffsetFetch answers `""` and `-1`). It never decides who may commit (that is the
//! coordinator).

use tern_log::{LogError, LogPort};

/// Prefix of every consumer group's cursor.
pub const CURSOR_PREFIX: &str = "kafka.group:";

/// Longest group id accepted (the cursor store takes names of at most 1,024 bytes).
pub const MAX_GROUP_ID: usize = 1000;

/// The cursor holding `group`'s offsets.
pub fn cursor_name(group: &str) -> String {
    format!("{CURSOR_PREFIX}{group}")
}

/// Whether `group` can be a group id: not empty, short enough for a cursor name.
pub fn valid_group_id(group: &str) -> bool {
    !group.is_empty() && group.len() <= MAX_GROUP_ID
}

/// Every group that has committed offsets.
pub fn groups_with_offsets<L: LogPort>(log: &L) -> Vec<String> {
    log.cursor_names()
        .into_iter()
        .filter_map(|name| name.strip_prefix(CURSOR_PREFIX).map(str::to_owned))
        .collect()
}

/// The committed offset of `group` in a partition.
pub fn committed<L: LogPort>(log: &L, group: &str, topic: &str, partition: u32) -> Option<u64> {
    log.cursor(&cursor_name(group), topic, partition)
}

/// Every committed offset of `group`: (topic, partition, offset), by topic and partition.
pub fn committed_all<L: LogPort>(log: &L, group: &str) -> Vec<(String, u32, u64)> {
    let name = cursor_name(group);
    let mut topics = log.topics();
    topics.sort_by(|a, b| a.name.cmp(&b.name));
    topics
        .into_iter()
        .flat_map(|info| {
            let name = &name;
            (0..info.partitions).filter_map(move |p| {
                log.cursor(name, &info.name, p)
                    .map(|offset| (info.name.clone(), p, offset))
            })
        })
        .collect()
}

/// Whether `group` has any committed offset.
pub fn has_offsets<L: LogPort>(log: &L, group: &str) -> bool {
    let name = cursor_name(group);
    log.cursor_names().contains(&name)
}

/// Durably commits `offset` (the next offset to read) for `group` in a partition.
pub async fn commit<L: LogPort>(
    log: &L,
    group: &str,
    topic: &str,
    partition: u32,
    offset: u64,
) -> Result<(), LogError> {
    log.commit_cursor(&cursor_name(group), topic, partition, offset)
        .await
}

/// Durably removes every offset of `group`.
pub async fn delete_group<L: LogPort>(log: &L, group: &str) -> Result<(), LogError> {
    log.remove_cursors(&cursor_name(group)).await
}

/// Durably removes `group`'s offsets of the given partitions and keeps the others. The
/// cursor store removes a cursor's positions all at once, so the others are committed again
/// after the removal; a crash between the two leaves the group without offsets, and its
/// consumers start where their `auto.offset.reset` says.
pub async fn delete_offsets<L: LogPort>(
    log: &L,
    group: &str,
    partitions: &[(String, u32)],
) -> Result<(), LogError> {
    let kept: Vec<(String, u32, u64)> = committed_all(log, group)
        .into_iter()
        .filter(|(t, p, _)| !partitions.iter().any(|(dt, dp)| dt == t && dp == p))
        .collect();
    delete_group(log, group).await?;
    for (topic, partition, offset) in kept {
        commit(log, group, &topic, partition, offset).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tern_log::MemoryLog;

    #[tokio::test]
    async fn offsets_are_cursors_named_by_the_group() {
        let log = MemoryLog::new(2);
        log.ensure_topic("mqtt").expect("topic");
        commit(&log, "analytics", "mqtt", 0, 5)
            .await
            .expect("commit");
        commit(&log, "analytics", "mqtt", 1, 7)
            .await
            .expect("commit");
        commit(&log, "other", "mqtt", 1, 1).await.expect("commit");
        assert_eq!(log.cursor("kafka.group:analytics", "mqtt", 1), Some(7));
        assert_eq!(committed(&log, "analytics", "mqtt", 0), Some(5));
        assert_eq!(groups_with_offsets(&log), vec!["analytics", "other"]);
        let all = committed_all(&log, "analytics");
        assert_eq!(
            all,
            vec![("mqtt".to_owned(), 0, 5), ("mqtt".to_owned(), 1, 7)]
        );

        delete_offsets(&log, "analytics", &[("mqtt".to_owned(), 0)])
            .await
            .expect("delete offsets");
        assert_eq!(
            committed_all(&log, "analytics"),
            vec![("mqtt".to_owned(), 1, 7)]
        );
        delete_group(&log, "analytics").await.expect("delete");
        assert!(!has_offsets(&log, "analytics"));
        assert!(has_offsets(&log, "other"));
        assert!(!valid_group_id("") && !valid_group_id(&"g".repeat(1001)));
    }
}
