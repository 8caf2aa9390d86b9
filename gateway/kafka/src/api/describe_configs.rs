//! DescribeConfigs: a topic's retention and durability settings as Kafka names them, so
//! `kafka-configs --describe` shows what the log applies. Every value comes from tern.toml
//! (`[log]`, `[[log.topic]]`), so each is read-only with source `STATIC_BROKER_CONFIG`:
//!
//! | Kafka key | from |
//! |---|---|
//! | `retention.ms` | `retention_age` (`-1`: no limit) |
//! | `retention.bytes` | `retention_bytes` per partition (`-1`: no limit) |
//! | `cleanup.policy` | `delete` (whole segments, oldest first) |
//! | `flush.messages` | `1` under `durability = "sync"` (fdatasync before every answer), else unbounded |
//! | `tern.durability` | `sync` or `periodic` |
//! | `tern.on.full` | `reject` or `drop_oldest` |
//!
//! Besides these, the configs the topic was created with (`crate::configs`: `max.message.bytes`
//! and the few values naming what tern does anyway), with source `DYNAMIC_TOPIC_CONFIG`; still
//! read-only, since tern serves no AlterConfigs.
//!
//! No (or an empty) key list means every key. The broker resource answers with no entries (nothing of tern's is a Kafka broker setting).

use kafka_protocol::ResponseError;
use kafka_protocol::messages::describe_configs_response::{
    DescribeConfigsResourceResult, DescribeConfigsResult,
};
use kafka_protocol::messages::{ApiKey, DescribeConfigsRequest, DescribeConfigsResponse};
use kafka_protocol::protocol::StrBytes;
use tern_log::{Durability, LogPort, OnFull, TopicConfig, TopicSettings};

use super::create_topics::DYNAMIC_TOPIC_CONFIG;
use super::{ApiError, Conn, Ctx, Reply, Versions, decode, encode};
use crate::header::Request;

/// v1-v4 (Kafka 4.x's admin client sends v4).
pub const VERSIONS: Versions = Versions { min: 1, max: 4 };

/// Kafka's resource types.
const TOPIC: i8 = 2;
const BROKER: i8 = 4;
/// Kafka's `ConfigSource.STATIC_BROKER_CONFIG`: from the broker's configuration file.
const STATIC_BROKER_CONFIG: i8 = 4;
/// Kafka's `ConfigType`s.
const STRING: i8 = 2;
const INT: i8 = 3;
const LONG: i8 = 5;

/// The settings of `settings` as (Kafka key, value, type).
pub fn entries(settings: &TopicSettings) -> Vec<(&'static str, String, i8)> {
    let unlimited = |v: u64| {
        if v == 0 {
            "-1".to_owned()
        } else {
            v.to_string()
        }
    };
    let (flush, durability) = match settings.durability {
        Durability::Sync => ("1".to_owned(), "sync"),
        Durability::Periodic => (i64::MAX.to_string(), "periodic"),
    };
    let on_full = match settings.on_full {
        OnFull::Reject => "reject",
        OnFull::DropOldest => "drop_oldest",
    };
    vec![
        ("cleanup.policy", "delete".to_owned(), STRING),
        ("retention.ms", unlimited(settings.retention_age_ms), LONG),
        ("retention.bytes", unlimited(settings.retention_bytes), LONG),
        ("flush.messages", flush, LONG),
        ("tern.durability", durability.to_owned(), STRING),
        ("tern.on.full", on_full.to_owned(), STRING),
    ]
}

/// `entries` with their source, then the configs the topic was created with; a created one
/// replaces the entry of the same key (they agree on its value: `crate::configs`).
fn with_created(
    entries: Vec<(&'static str, String, i8)>,
    created: &TopicConfig,
) -> Vec<(String, String, i8, i8)> {
    let mut out: Vec<_> = entries
        .into_iter()
        .filter(|(key, ..)| !created.contains_key(*key))
        .map(|(key, value, kind)| (key.to_owned(), value, kind, STATIC_BROKER_CONFIG))
        .collect();
    out.extend(created.iter().map(|(key, value)| {
        let kind = match key.as_str() {
            "max.message.bytes" | "min.insync.replicas" => INT,
            _ => STRING,
        };
        (key.clone(), value.clone(), kind, DYNAMIC_TOPIC_CONFIG)
    }));
    out
}

pub fn handle<L: LogPort>(ctx: &Ctx<L>, conn: &Conn, request: &Request) -> Result<Reply, ApiError> {
    let version = request.version();
    let body: DescribeConfigsRequest = decode(request)?;
    let mut results = Vec::with_capacity(body.resources.len());
    for resource in body.resources {
        let mut result = DescribeConfigsResult::default()
            .with_resource_type(resource.resource_type)
            .with_resource_name(resource.resource_name.clone());
        let described = match resource.resource_type {
            TOPIC if !ctx.sees(conn, request, &resource.resource_name) => Err((
                ResponseError::TopicAuthorizationFailed,
                "needs read or write access to the topic".to_owned(),
            )),
            TOPIC => ctx
                .log
                .topic_settings(&resource.resource_name)
                .and_then(|s| Ok((s, ctx.log.topic_config(&resource.resource_name)?)))
                .map(|(s, config)| with_created(entries(&s), &config))
                .map_err(|err| (ResponseError::UnknownTopicOrPartition, err.to_string())),
            BROKER => Ok(Vec::new()),
            other => Err((
                ResponseError::InvalidRequest,
                format!("resource type {other} is not served"),
            )),
        };
        match described {
            Ok(entries) => {
                let wanted = |key: &str| {
                    resource
                        .configuration_keys
                        .as_ref()
                        .filter(|keys| !keys.is_empty())
                        .is_none_or(|keys| keys.iter().any(|k| k.as_str() == key))
                };
                result.configs = entries
                    .into_iter()
                    .filter(|(key, ..)| wanted(key))
                    .map(|(key, value, kind, source)| {
                        DescribeConfigsResourceResult::default()
                            .with_name(StrBytes::from_string(key))
                            .with_value(Some(StrBytes::from_string(value)))
                            .with_read_only(true)
                            .with_config_source(source)
                            .with_config_type(kind)
                    })
                    .collect();
            }
            Err((error, message)) => {
                result.error_code = error.code();
                result.error_message = Some(StrBytes::from_string(message));
            }
        }
        results.push(result);
    }
    let response = DescribeConfigsResponse::default().with_results(results);
    Ok(Reply::Now(encode(
        ApiKey::DescribeConfigs,
        version,
        &response,
    )?))
}
