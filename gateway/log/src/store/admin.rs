//! Topic administration on a running log: creating a topic with a given partition count,
//! adding partitions, deleting a topic, and a topic's effective settings (for the Kafka
//! listener's CreateTopics, CreatePartitions, DeleteTopics and DescribeConfigs).
//!
//! Every change has one commit point, `topic.meta` (`meta.rs`): partitions exist once it names
//! them, a topic is gone once it is removed. A deletion is refused while the topic is in use:
//! internal topics (`__*`) and topics any cursor holds a position on (an MQTT session, a
//! forwarder, a consumer group) stay, and the error names the cursor. Never touches cursors.

use std::sync::{Arc, PoisonError};

use super::super::config::TopicSettings;
use super::super::error::{LogError, Result};
use super::super::topic_config::{self, TopicConfig};
use super::super::{TopicInfo, check_partition_count, check_topic_name, meta};
use super::{Log, TopicEntry, open_partitions, open_topic};

/// Most partitions one topic may have (the `[log]` configuration's limit too).
pub const MAX_PARTITIONS: u32 = 10_000;

impl Log {
    /// Creates `topic` with `partitions` partitions; `TopicExists` if it already exists.
    /// Blocking file I/O (a few fsyncs).
    pub fn create_topic(&self, topic: &str, partitions: u32) -> Result<TopicInfo> {
        self.create_topic_with(topic, partitions, &TopicConfig::new())
    }

    /// [`Log::create_topic`] keeping `config` as the topic's own settings (`topic.config`,
    /// written before the topic exists); [`Log::topic_config`] hands them back.
    pub fn create_topic_with(
        &self,
        topic: &str,
        partitions: u32,
        config: &TopicConfig,
    ) -> Result<TopicInfo> {
        self.check_open()?;
        check_topic_name(topic)?;
        check_partition_count(topic, partitions)?;
        topic_config::check(config).map_err(|reason| LogError::InvalidTopicConfig {
            topic: topic.to_owned(),
            reason,
        })?;
        let mut topics = self
            .inner
            .topics
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        if topics.contains_key(topic) {
            return Err(LogError::TopicExists {
                topic: topic.to_owned(),
            });
        }
        let shared = &self.inner.shared;
        meta::create(&*shared.fs, &self.inner.dir, topic, partitions, config)?;
        let info = TopicInfo {
            name: topic.to_owned(),
            partitions,
        };
        let entry = open_topic(shared, &self.inner.dir, info.clone(), &self.inner.runtime)?;
        topics.insert(topic.to_owned(), Arc::new(entry));
        tracing::info!(topic, partitions, "topic created");
        Ok(info)
    }

    /// Grows `topic` to `total` partitions (more than it has). Existing partitions, their
    /// records and keys' placement under the old count are untouched; new ones start empty.
    pub fn add_partitions(&self, topic: &str, total: u32) -> Result<TopicInfo> {
        self.check_open()?;
        check_partition_count(topic, total)?;
        let mut topics = self
            .inner
            .topics
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        let old = topics
            .get(topic)
            .cloned()
            .ok_or_else(|| LogError::UnknownTopic {
                topic: topic.to_owned(),
            })?;
        let current = old.info.partitions;
        if total <= current {
            return Err(LogError::InvalidPartitions {
                topic: topic.to_owned(),
                reason: format!("the topic already has {current} partitions"),
            });
        }
        let shared = &self.inner.shared;
        meta::grow(&*shared.fs, &self.inner.dir, topic, current, total)?;
        let info = TopicInfo {
            name: topic.to_owned(),
            partitions: total,
        };
        let added = open_partitions(shared, &self.inner.dir, &info, current, &self.inner.runtime)?;
        let mut partitions = old.partitions.clone();
        partitions.extend(added);
        topics.insert(
            topic.to_owned(),
            Arc::new(TopicEntry {
                info: info.clone(),
                config: Arc::clone(&old.config),
                partitions,
            }),
        );
        tracing::info!(topic, from = current, to = total, "partitions added");
        Ok(info)
    }

    /// Deletes `topic`: its writers finish their queued appends, then its metadata, segments,
    /// indexes and directories are removed. Refused (`TopicInUse`) for internal topics and
    /// while a cursor holds a position on the topic.
    pub async fn delete_topic(&self, topic: &str) -> Result<()> {
        self.check_open()?;
        let in_use = |reason: String| LogError::TopicInUse {
            topic: topic.to_owned(),
            reason,
        };
        if topic.starts_with("__") {
            return Err(in_use("internal topics cannot be deleted".to_owned()));
        }
        let entry = {
            let mut topics = self
                .inner
                .topics
                .write()
                .unwrap_or_else(PoisonError::into_inner);
            if !topics.contains_key(topic) {
                return Err(LogError::UnknownTopic {
                    topic: topic.to_owned(),
                });
            }
            let holder = self
                .cursors()
                .list()
                .into_iter()
                .find(|(_, t, _, _)| t == topic);
            if let Some((cursor, _, partition, _)) = holder {
                return Err(in_use(format!(
                    "cursor {cursor:?} holds a position on partition {partition}; delete it first"
                )));
            }
            topics.remove(topic).ok_or_else(|| LogError::UnknownTopic {
                topic: topic.to_owned(),
            })?
        };
        for p in &entry.partitions {
            p.tx.lock().unwrap_or_else(PoisonError::into_inner).take();
        }
        for p in &entry.partitions {
            let task = p.task.lock().unwrap_or_else(PoisonError::into_inner).take();
            if let Some(task) = task {
                let _ = task.await;
            }
        }
        let shared = Arc::clone(&self.inner.shared);
        let (dir, name) = (self.inner.dir.clone(), topic.to_owned());
        tokio::task::spawn_blocking(move || meta::delete(&*shared.fs, &shared.cache, &dir, &name))
            .await
            .map_err(|_| LogError::Closed)??;
        tracing::info!(topic, "topic deleted");
        Ok(())
    }

    /// The settings in effect for `topic`: its partition count, durability (fixed at start)
    /// and retention (as last reloaded).
    pub fn topic_settings(&self, topic: &str) -> Result<TopicSettings> {
        let entry = self.topic(topic)?;
        let mut settings = self
            .inner
            .shared
            .live
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .topic_settings(topic);
        settings.durability = self.inner.shared.config.topic_settings(topic).durability;
        settings.partitions = entry.info.partitions;
        Ok(settings)
    }

    /// The settings `topic` was created with (empty for none).
    pub fn topic_config(&self, topic: &str) -> Result<Arc<TopicConfig>> {
        Ok(Arc::clone(&self.topic(topic)?.config))
    }

    /// The partition count a topic created now by [`Log::ensure_topic`] gets.
    pub fn default_partitions(&self, topic: &str) -> u32 {
        self.inner.shared.config.topic_settings(topic).partitions
    }
}

#[cfg(test)]
mod test;
