//! What the cluster says about itself: Metadata (its id, its brokers, a topic's partitions and
//! their leaders), leader discovery (the address of a partition's leader), CreateTopics (with
//! topic configs) through the controller Metadata names, and DescribeConfigs of a topic. It only asks; it never caches an
//! answer (a leader may move at any time, and the caller asks again after an error) and never
//! opens a connection itself beyond returning the address to open.

use kafka_protocol::messages::TopicName;
use kafka_protocol::messages::create_topics_request::{
    CreatableTopic, CreatableTopicConfig, CreateTopicsRequest,
};
use kafka_protocol::messages::describe_configs_request::{
    DescribeConfigsRequest, DescribeConfigsResource,
};
use kafka_protocol::messages::metadata_request::{MetadataRequest, MetadataRequestTopic};
use kafka_protocol::messages::metadata_response::MetadataResponse;
use kafka_protocol::protocol::StrBytes;

use super::{ClientError, Connection, broker_addr};

/// Kafka's UNKNOWN_TOPIC_OR_PARTITION.
const UNKNOWN_TOPIC: i16 = 3;
/// Kafka's TOPIC_ALREADY_EXISTS.
const TOPIC_ALREADY_EXISTS: i16 = 36;
/// How long the controller may take to create a topic.
const CREATE_TIMEOUT_MS: i32 = 10_000;
/// DescribeConfigs' resource type of a topic.
const RESOURCE_TOPIC: i8 = 2;

/// Metadata of `topic` (of no topic with `None`: the cluster id, the brokers and the
/// controller), never creating it.
pub async fn metadata(
    connection: &mut Connection,
    topic: Option<&str>,
) -> Result<MetadataResponse, ClientError> {
    let topics: Vec<MetadataRequestTopic> = topic
        .map(|t| MetadataRequestTopic::default().with_name(Some(topic_name(t))))
        .into_iter()
        .collect();
    connection
        .call(|_| {
            MetadataRequest::default()
                .with_topics(Some(topics))
                .with_allow_auto_topic_creation(false)
        })
        .await
}

/// The partition count of `topic` in `metadata` (0 when the cluster does not know it).
pub fn partition_count(metadata: &MetadataResponse, topic: &str) -> Result<u32, ClientError> {
    let Some(found) = find_topic(metadata, topic) else {
        return Ok(0);
    };
    match found.error_code {
        0 => Ok(u32::try_from(found.partitions.len()).unwrap_or(u32::MAX)),
        UNKNOWN_TOPIC => Ok(0),
        code => Err(ClientError::kafka(
            "Metadata",
            code,
            format!(" for {topic}"),
        )),
    }
}

/// `host:port` of the leader of `topic`/`partition` in `metadata`.
pub fn leader_addr(
    metadata: &MetadataResponse,
    topic: &str,
    partition: i32,
) -> Result<String, ClientError> {
    let context = || format!(" for {topic}/{partition}");
    let found = find_topic(metadata, topic)
        .ok_or_else(|| ClientError::kafka("Metadata", UNKNOWN_TOPIC, context()))?;
    if found.error_code != 0 {
        return Err(ClientError::kafka("Metadata", found.error_code, context()));
    }
    let leader = found
        .partitions
        .iter()
        .find(|p| p.partition_index == partition)
        .ok_or_else(|| ClientError::kafka("Metadata", UNKNOWN_TOPIC, context()))?;
    if leader.error_code != 0 {
        return Err(ClientError::kafka("Metadata", leader.error_code, context()));
    }
    broker(metadata, leader.leader_id.0).ok_or_else(|| ClientError::Missing {
        api: "Metadata",
        what: format!(
            "broker {} (the leader of {topic}/{partition})",
            leader.leader_id.0
        ),
    })
}

/// `host:port` of broker `node` in `metadata`.
pub fn broker(metadata: &MetadataResponse, node: i32) -> Option<String> {
    metadata
        .brokers
        .iter()
        .find(|b| b.node_id.0 == node)
        .map(|b| broker_addr(b.host.as_str(), b.port))
}

fn find_topic<'a>(
    metadata: &'a MetadataResponse,
    topic: &str,
) -> Option<&'a kafka_protocol::messages::metadata_response::MetadataResponseTopic> {
    metadata
        .topics
        .iter()
        .find(|t| t.name.as_ref().is_some_and(|n| n.0.as_str() == topic))
}

/// The CreateTopics request for one topic with `configs` (name, value).
pub fn create_topic_request(
    topic: &str,
    partitions: i32,
    replication: i16,
    configs: &[(&str, &str)],
) -> CreateTopicsRequest {
    let configs = configs
        .iter()
        .map(|(name, value)| {
            CreatableTopicConfig::default()
                .with_name(StrBytes::from_string((*name).to_owned()))
                .with_value(Some(StrBytes::from_string((*value).to_owned())))
        })
        .collect();
    let topic = CreatableTopic::default()
        .with_name(topic_name(topic))
        .with_num_partitions(partitions)
        .with_replication_factor(replication)
        .with_configs(configs);
    CreateTopicsRequest::default()
        .with_topics(vec![topic])
        .with_timeout_ms(CREATE_TIMEOUT_MS)
        .with_validate_only(false)
}

/// Creates `topic` with `configs` over `controller` (a broker forwards it where the cluster
/// needs): `true` when this request created it, `false` when it already existed (created
/// meanwhile by another gateway or by hand; its configs are then whatever it has).
pub async fn create_topic(
    controller: &mut Connection,
    topic: &str,
    partitions: i32,
    replication: i16,
    configs: &[(&str, &str)],
) -> Result<bool, ClientError> {
    let request = create_topic_request(topic, partitions, replication, configs);
    let answer = controller.call(|_| request).await?;
    let result = answer
        .topics
        .iter()
        .find(|t| t.name.0.as_str() == topic)
        .ok_or_else(|| ClientError::Missing {
            api: "CreateTopics",
            what: format!("result for {topic}"),
        })?;
    match result.error_code {
        0 => Ok(true),
        TOPIC_ALREADY_EXISTS => Ok(false),
        code => {
            let context = result
                .error_message
                .as_ref()
                .map(|m| format!(" for {topic}: {}", m.as_str()))
                .unwrap_or_else(|| format!(" for {topic}"));
            Err(ClientError::kafka("CreateTopics", code, context))
        }
    }
}

/// The DescribeConfigs request for the configs `names` of `topic` (no synonyms, no documentation).
pub fn describe_topic_configs_request(topic: &str, names: &[&str]) -> DescribeConfigsRequest {
    let names = names
        .iter()
        .map(|name| StrBytes::from_string((*name).to_owned()))
        .collect();
    let resource = DescribeConfigsResource::default()
        .with_resource_type(RESOURCE_TOPIC)
        .with_resource_name(StrBytes::from_string(topic.to_owned()))
        .with_configuration_keys(Some(names));
    DescribeConfigsRequest::default()
        .with_resources(vec![resource])
        .with_include_synonyms(false)
        .with_include_documentation(false)
}

/// The values of the configs `names` of `topic` as the broker answering `connection` sees them
/// (set on the topic or the broker's default), `(name, value)` in the broker's order; a config
/// the broker does not know is left out, a sensitive one has no value.
pub async fn topic_configs(
    connection: &mut Connection,
    topic: &str,
    names: &[&str],
) -> Result<Vec<(String, Option<String>)>, ClientError> {
    let request = describe_topic_configs_request(topic, names);
    let answer = connection.call(|_| request).await?;
    let result = answer
        .results
        .iter()
        .find(|r| r.resource_type == RESOURCE_TOPIC && r.resource_name.as_str() == topic)
        .ok_or_else(|| ClientError::Missing {
            api: "DescribeConfigs",
            what: format!("result for {topic}"),
        })?;
    if result.error_code != 0 {
        let context = result
            .error_message
            .as_ref()
            .map(|m| format!(" for {topic}: {}", m.as_str()))
            .unwrap_or_else(|| format!(" for {topic}"));
        return Err(ClientError::kafka(
            "DescribeConfigs",
            result.error_code,
            context,
        ));
    }
    Ok(result
        .configs
        .iter()
        .map(|c| {
            let value = c.value.as_ref().map(|v| v.as_str().to_owned());
            (c.name.as_str().to_owned(), value)
        })
        .collect())
}

pub(crate) fn topic_name(topic: &str) -> TopicName {
    TopicName(StrBytes::from_string(topic.to_owned()))
}
