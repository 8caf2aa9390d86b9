//! Metadata: tern is a cluster of one broker (node 0) that leads every partition of every log
//! topic. The broker's address is `[kafka_listener] advertised` or the address the client
//! reached. Topics named `__…` (tern's own state) are listed as internal. A missing topic is
//! created when the client allows it and `auto_create_topics` is on, as Kafka's
//! `auto.create.topics.enable`. Only topics the client may read or write are listed (see
//! `Ctx::sees`).
//!
//! `__consumer_offsets` is an internal topic of one partition, named or in a full listing, as
//! Kafka lists it: tern coordinates every group, so a client that finds a coordinator may expect
//! Kafka's offsets topic to exist (its committed offsets are tern's cursors,
//! `docs/consumer-model.md`), and a regex consumer expects to see it flagged internal to skip it
//! (franz-go's TestConsumeRegex). Nothing can be produced to or fetched from it, as from any
//! internal topic.

use kafka_protocol::messages::metadata_response::{
    MetadataResponseBroker, MetadataResponsePartition, MetadataResponseTopic,
};
use kafka_protocol::messages::{ApiKey, BrokerId, MetadataRequest, MetadataResponse, TopicName};
use kafka_protocol::protocol::StrBytes;

use super::{ApiError, Conn, Ctx, Reply, Versions, decode, encode};
use crate::header::Request;
use crate::topics::{self, Lookup};
use tern_auth::Want;
use tern_log::LogPort;

/// v0-v12: every version up to the one Kafka 4.0 answers (v13 only adds a top-level error for
/// rebootstrapping). Topic ids (v10+) are all zero: tern has none, and no served API takes one.
pub const VERSIONS: Versions = Versions { min: 0, max: 12 };

/// The one broker's id.
pub const NODE_ID: i32 = 0;

/// Kafka's committed-offsets topic, answered when named (module doc).
pub const OFFSETS_TOPIC: &str = "__consumer_offsets";

/// The cluster id in every Metadata answer.
pub const CLUSTER_ID: &str = "tern";

pub fn handle<L: LogPort>(ctx: &Ctx<L>, conn: &Conn, request: &Request) -> Result<Reply, ApiError> {
    let version = request.version();
    let body: MetadataRequest = decode(request)?;
    // v0: an empty list means every topic; v1+: null means every topic.
    let wanted: Option<Vec<String>> = match body.topics {
        Some(list) if !(version == 0 && list.is_empty()) => Some(
            list.into_iter()
                .map(|t| t.name.map(|n| n.0.to_string()).unwrap_or_default())
                .collect(),
        ),
        _ => None,
    };
    let create = ctx.config.auto_create_topics && (version < 4 || body.allow_auto_topic_creation);
    // Kafka hides the topics a client may neither read nor write; a named one answers
    // TOPIC_AUTHORIZATION_FAILED, and only write access creates it.
    let topics = match wanted {
        None => {
            let mut listed: Vec<MetadataResponseTopic> = ctx
                .log
                .topics()
                .into_iter()
                .filter(|info| info.name != OFFSETS_TOPIC && ctx.sees(conn, request, &info.name))
                .map(|info| topic_entry(&info.name, Ok(info.partitions)))
                .collect();
            if ctx.sees(conn, request, OFFSETS_TOPIC) {
                listed.push(topic_entry(OFFSETS_TOPIC, Ok(1)));
            }
            listed
        }
        Some(names) => names
            .iter()
            .map(|name| topic_entry(name, named(ctx, conn, request, name, create)))
            .collect(),
    };
    let (host, port) = advertised(ctx, conn);
    let broker = MetadataResponseBroker::default()
        .with_node_id(BrokerId(NODE_ID))
        .with_host(StrBytes::from_string(host))
        .with_port(i32::from(port));
    let mut response = MetadataResponse::default()
        .with_brokers(vec![broker])
        .with_topics(topics);
    if version >= 1 {
        response = response.with_controller_id(BrokerId(NODE_ID));
    }
    if version >= 2 {
        response = response.with_cluster_id(Some(StrBytes::from_static_str(CLUSTER_ID)));
    }
    Ok(Reply::Now(encode(ApiKey::Metadata, version, &response)?))
}

/// A named topic: its partitions, if the client may see it.
fn named<L: LogPort>(
    ctx: &Ctx<L>,
    conn: &Conn,
    request: &Request,
    name: &str,
    create: bool,
) -> Lookup {
    if !ctx.sees(conn, request, name) {
        return Err(kafka_protocol::ResponseError::TopicAuthorizationFailed);
    }
    if name == OFFSETS_TOPIC {
        return Ok(1);
    }
    let create = create && ctx.allows(conn, request, Want::Publish, name);
    topics::lookup(&ctx.log, name, create)
}

fn topic_entry(name: &str, found: Lookup) -> MetadataResponseTopic {
    let topic = MetadataResponseTopic::default()
        .with_name(Some(TopicName(StrBytes::from_string(name.to_owned()))))
        .with_is_internal(topics::is_internal(name));
    match found {
        Ok(partitions) => topic.with_partitions((0..partitions).map(partition_entry).collect()),
        Err(error) => topic.with_error_code(error.code()),
    }
}

fn partition_entry(partition: u32) -> MetadataResponsePartition {
    let node = BrokerId(NODE_ID);
    MetadataResponsePartition::default()
        .with_partition_index(i32::try_from(partition).unwrap_or(i32::MAX))
        .with_leader_id(node)
        .with_replica_nodes(vec![node])
        .with_isr_nodes(vec![node])
}

/// The host and port Metadata names as the broker.
pub(super) fn advertised<L>(ctx: &Ctx<L>, conn: &Conn) -> (String, u16) {
    ctx.config
        .advertised
        .as_deref()
        .and_then(|text| crate::config::advertised_parts(text).ok())
        .unwrap_or_else(|| (conn.local.ip().to_string(), conn.local.port()))
}
