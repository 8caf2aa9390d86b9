//! The per-topic Kafka configs CreateTopics accepts, which the log keeps with the topic
//! (`topic.config`) and DescribeConfigs shows. A config is accepted only where tern does what it
//! says: `max.message.bytes` is enforced on Produce; `cleanup.policy=delete`,
//! `compression.type=producer`, `message.timestamp.type=CreateTime` and `min.insync.replicas=1`
//! name what tern does anyway (the last because tern is one broker keeping one replica). Every
//! other key or value is refused with `INVALID_CONFIG` and a message naming the key and where
//! tern's own setting lives, rather than accepted and ignored.

use kafka_protocol::messages::create_topics_request::CreatableTopicConfig;
use tern_log::TopicConfig;

/// Kafka's largest record batch for the topic, checked on every produced batch.
pub const MAX_MESSAGE_BYTES: &str = "max.message.bytes";

/// The configs tern keeps as given, and what their value must be (`None`: see [`check`]).
const KEPT: [(&str, Option<&str>); 5] = [
    (MAX_MESSAGE_BYTES, None),
    ("cleanup.policy", Some("delete")),
    ("compression.type", Some("producer")),
    ("message.timestamp.type", Some("CreateTime")),
    ("min.insync.replicas", Some("1")),
];

/// Where tern's own setting is, for the keys clients set most that tern refuses.
fn refused_reason(key: &str) -> &'static str {
    match key {
        "retention.ms" | "retention.bytes" => {
            "retention comes from tern.toml ([log.retention] or [[log.topic]] retention_age and retention_bytes); DescribeConfigs shows it"
        }
        "segment.bytes" | "segment.ms" => "segments are sized by [log] segment_bytes in tern.toml",
        "flush.messages" | "flush.ms" => {
            "durability comes from tern.toml ([log] or [[log.topic]] durability)"
        }
        _ => "not a config tern serves",
    }
}

/// The configs of one CreateTopics topic as the log keeps them, or the message that refuses
/// them (naming the key). A null value means the default and is left out.
pub fn check(configs: &[CreatableTopicConfig]) -> Result<TopicConfig, String> {
    let mut kept = TopicConfig::new();
    for config in configs {
        let key = config.name.as_str();
        let Some(value) = config.value.as_ref().map(|v| v.as_str()) else {
            continue;
        };
        let Some((_, wanted)) = KEPT.iter().find(|(k, _)| *k == key) else {
            return Err(format!("{key}: {}", refused_reason(key)));
        };
        match wanted {
            Some(wanted) if !value.eq_ignore_ascii_case(wanted) => {
                return Err(format!("{key}={value}: {}", value_reason(key)));
            }
            Some(wanted) => {
                kept.insert(key.to_owned(), (*wanted).to_owned());
            }
            None => {
                max_message_bytes(value).ok_or_else(|| {
                    format!("{key}={value}: must be a byte count from 0 to {}", i32::MAX)
                })?;
                kept.insert(key.to_owned(), value.to_owned());
            }
        }
    }
    Ok(kept)
}

fn value_reason(key: &str) -> &'static str {
    match key {
        "cleanup.policy" => "tern's log deletes whole segments and never compacts: only delete",
        "compression.type" => {
            "Fetch serves batches with the codec they were produced with: only producer"
        }
        "message.timestamp.type" => "tern keeps the producer's timestamps: only CreateTime",
        "min.insync.replicas" => "tern is one broker keeping one replica: only 1",
        _ => "not a value tern serves",
    }
}

/// A `max.message.bytes` value.
fn max_message_bytes(value: &str) -> Option<usize> {
    value
        .trim()
        .parse::<i32>()
        .ok()
        .and_then(|v| usize::try_from(v).ok())
}

/// The topic's `max.message.bytes`, if it was created with one.
pub fn batch_limit(config: &TopicConfig) -> Option<usize> {
    config
        .get(MAX_MESSAGE_BYTES)
        .and_then(|v| max_message_bytes(v))
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::protocol::StrBytes;

    fn config(key: &str, value: &str) -> CreatableTopicConfig {
        CreatableTopicConfig::default()
            .with_name(StrBytes::from_string(key.to_owned()))
            .with_value(Some(StrBytes::from_string(value.to_owned())))
    }

    #[test]
    fn keeps_what_tern_honours_and_names_the_key_it_refuses() {
        let kept = check(&[
            config("max.message.bytes", "51200"),
            config("cleanup.policy", "delete"),
            config("min.insync.replicas", "1"),
        ])
        .expect("accepted");
        assert_eq!(batch_limit(&kept), Some(51_200));
        assert_eq!(kept.len(), 3);
        for (key, value) in [
            ("max.message.bytes", "-1"),
            ("max.message.bytes", "10MiB"),
            ("cleanup.policy", "compact"),
            ("retention.ms", "1000"),
            ("segment.bytes", "1048576"),
            ("compression.type", "zstd"),
            ("min.insync.replicas", "2"),
            ("message.timestamp.type", "LogAppendTime"),
            ("x.unknown", "1"),
        ] {
            let refused = check(&[config(key, value)]).expect_err(key);
            assert!(refused.starts_with(key), "{refused}");
        }
        let null = CreatableTopicConfig::default()
            .with_name(StrBytes::from_static_str("retention.ms"))
            .with_value(None);
        assert_eq!(check(&[null]), Ok(TopicConfig::new()));
    }
}
