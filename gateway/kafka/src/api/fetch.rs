//! Fetch: durable records from each requested offset, as v2 record batches whose offsets are the
//! log's offsets, with their headers; records a Kafka producer sent compressed are answered
//! compressed with its codec, batch for batch, and such a batch is answered whole
//! (`crate::records::FetchBatch`). When fewer than `min_bytes` are there, the answer waits up to
//! `max_wait_ms` for any requested partition's durable end to move (the same watch MQTT delivery
//! waits on), or for shutdown, then answers with what it has. A partition error
//! (unknown topic or partition, offset out of range) answers at once, as Kafka does.
//!
//! tern keeps no fetch sessions: every answer has session id 0, so clients send full requests;
//! a request naming a session gets `FETCH_SESSION_ID_NOT_FOUND`.

use std::future::{Future, poll_fn};
use std::pin::Pin;
use std::task::Poll;
use std::time::Duration;

use kafka_protocol::ResponseError;
use kafka_protocol::messages::fetch_response::{FetchableTopicResponse, PartitionData};
use kafka_protocol::messages::{ApiKey, FetchRequest, FetchResponse, TopicName};
use tern_auth::Want;
use tern_log::LogPort;
use tokio::sync::watch;

use super::{ApiError, Conn, Ctx, PendingReply, Reply, Versions, decode, encode};
use crate::header::Request;
use crate::records;
use crate::topics;

/// v4-v12, the versions that name topics (v13 names them by id, which tern does not have).
/// Kafka 4.x Java consumers use v12, librdkafka 2.x v11, kafka-python up to v10 or higher.
pub const VERSIONS: Versions = Versions { min: 4, max: 12 };

/// The longest a fetch waits, whatever the client asks.
const MAX_WAIT: Duration = Duration::from_secs(30);

/// One requested partition, resolved.
#[derive(Debug, Clone)]
struct Wanted {
    index: i32,
    /// The log partition, or why it cannot be read.
    target: Result<u32, ResponseError>,
    offset: i64,
    max_bytes: usize,
}

/// The partitions of one requested topic.
#[derive(Debug, Clone)]
struct Plan {
    name: TopicName,
    topic: String,
    partitions: Vec<Wanted>,
}

pub async fn handle<L: LogPort>(
    ctx: &Ctx<L>,
    conn: &Conn,
    request: &Request,
) -> Result<Reply, ApiError> {
    let version = request.version();
    let body: FetchRequest = decode(request)?;
    if body.session_id != 0 {
        let response =
            FetchResponse::default().with_error_code(ResponseError::FetchSessionIdNotFound.code());
        return Ok(Reply::Now(encode(ApiKey::Fetch, version, &response)?));
    }
    let plans = plan(ctx, conn, request, &body);
    let max_bytes = usize::try_from(body.max_bytes).unwrap_or(0);
    let min_bytes = usize::try_from(body.min_bytes).unwrap_or(0);
    // Watched before the first read, so an append between the two is not missed.
    let mut watches = subscribe(&ctx.log, &plans);
    let first = collect(ctx, &plans, max_bytes);
    let wait = Duration::from_millis(u64::try_from(body.max_wait_ms).unwrap_or(0)).min(MAX_WAIT);
    if first.bytes >= min_bytes || first.failed || wait.is_zero() {
        return Ok(Reply::Now(encode(ApiKey::Fetch, version, &first.response)?));
    }
    let log = ctx.log.clone();
    let mut shutdown = ctx.shutdown.clone();
    let answer = async move {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let stop = tokio::select! {
                () = any_changed(&mut watches) => false,
                () = tokio::time::sleep_until(deadline) => true,
                () = shutdown.wait() => true,
            };
            // Subscribed again before reading: a partition deleted (and perhaps created again)
            // meanwhile is watched anew, and no append after the read goes unseen.
            watches = subscribe(&log, &plans);
            let now = collect_from(&log, &plans, max_bytes);
            if stop || now.failed || now.bytes >= min_bytes {
                return encode(ApiKey::Fetch, version, &now.response);
            }
        }
    };
    Ok(Reply::Later(PendingReply(Box::pin(answer))))
}

/// Resolves every requested topic and partition (never creating a topic); a topic the client
/// may not read answers TOPIC_AUTHORIZATION_FAILED.
fn plan<L: LogPort>(
    ctx: &Ctx<L>,
    conn: &Conn,
    request: &Request,
    body: &FetchRequest,
) -> Vec<Plan> {
    body.topics
        .iter()
        .map(|topic| {
            let name = topic.topic.0.to_string();
            let found = ctx.lookup(conn, request, Want::Receive, &name, false);
            let partitions = topic
                .partitions
                .iter()
                .map(|p| Wanted {
                    index: p.partition,
                    target: found.and_then(|count| topics::partition(p.partition, count)),
                    offset: p.fetch_offset,
                    max_bytes: usize::try_from(p.partition_max_bytes).unwrap_or(0),
                })
                .collect();
            Plan {
                name: topic.topic.clone(),
                topic: name,
                partitions,
            }
        })
        .collect()
}

/// A response as it stands, with the record bytes it carries.
struct Collected {
    response: FetchResponse,
    bytes: usize,
    failed: bool,
}

fn collect<L: LogPort>(ctx: &Ctx<L>, plans: &[Plan], max_bytes: usize) -> Collected {
    collect_from(&ctx.log, plans, max_bytes)
}

fn collect_from<L: LogPort>(log: &L, plans: &[Plan], max_bytes: usize) -> Collected {
    let mut bytes = 0;
    let mut failed = false;
    let mut responses = Vec::with_capacity(plans.len());
    for plan in plans {
        let mut partitions = Vec::with_capacity(plan.partitions.len());
        for wanted in &plan.partitions {
            // Past the request's byte budget, partitions answer without records (the first
            // non-empty one always gets at least one record, as KIP-74 asks).
            let budget = if bytes == 0 {
                wanted.max_bytes
            } else {
                wanted.max_bytes.min(max_bytes.saturating_sub(bytes))
            };
            let data = read_partition(log, &plan.topic, wanted, budget);
            failed |= data.error_code != 0;
            bytes += data.records.as_ref().map_or(0, |r| r.len());
            partitions.push(data);
        }
        responses.push(
            FetchableTopicResponse::default()
                .with_topic(plan.name.clone())
                .with_partitions(partitions),
        );
    }
    Collected {
        response: FetchResponse::default().with_responses(responses),
        bytes,
        failed,
    }
}

fn read_partition<L: LogPort>(
    log: &L,
    topic: &str,
    wanted: &Wanted,
    budget: usize,
) -> PartitionData {
    let answer = PartitionData::default().with_partition_index(wanted.index);
    let failure = |code: ResponseError| answer.clone().with_error_code(code.code());
    let partition = match wanted.target {
        Ok(partition) => partition,
        Err(code) => return failure(code),
    };
    let Ok((start, end)) = log.offsets(topic, partition) else {
        return failure(ResponseError::UnknownTopicOrPartition);
    };
    let answer = answer
        .with_high_watermark(to_i64(end))
        .with_last_stable_offset(to_i64(end))
        .with_log_start_offset(to_i64(start));
    let offset = match u64::try_from(wanted.offset) {
        Ok(offset) if (start..=end).contains(&offset) => offset,
        _ => return answer.with_error_code(ResponseError::OffsetOutOfRange.code()),
    };
    if offset == end || budget == 0 {
        return answer.with_records(Some(Default::default()));
    }
    let mut batch = records::FetchBatch::with_capacity(budget);
    let mut read = log.read_batched(
        topic,
        partition,
        offset,
        budget,
        &mut |offset, record, span| {
            batch.push_in(offset, record, span);
        },
    );
    // A producer's compressed batch is answered whole or not at all, as Kafka does.
    let mut previous = None;
    while let (Ok(_), Some((from, until, only))) = (&read, batch.open_tail()) {
        if !only {
            batch.drop_tail();
            break;
        }
        if previous.replace(from) == Some(from) {
            // No progress (records missing to damage): answer what there is.
            break;
        }
        read = log.read_batched(
            topic,
            partition,
            from,
            budget,
            &mut |offset, record, span| {
                if offset < until {
                    batch.push_in(offset, record, span);
                }
            },
        );
    }
    match read {
        Ok(_) => {}
        Err(tern_log::LogError::OffsetOutOfRange { .. }) => {
            return answer.with_error_code(ResponseError::OffsetOutOfRange.code());
        }
        Err(err) => {
            tracing::warn!(topic, partition, %err, "kafka fetch cannot read the log");
            return answer.with_error_code(ResponseError::KafkaStorageError.code());
        }
    }
    match batch.encode() {
        Ok(batch) => answer.with_records(Some(batch)),
        Err(err) => {
            tracing::warn!(topic, partition, %err, "kafka fetch cannot encode records");
            answer.with_error_code(ResponseError::UnknownServerError.code())
        }
    }
}

fn to_i64(offset: u64) -> i64 {
    i64::try_from(offset).unwrap_or(i64::MAX)
}

/// The durable-end watch of every requested partition that exists now.
fn subscribe<L: LogPort>(log: &L, plans: &[Plan]) -> Vec<watch::Receiver<u64>> {
    plans
        .iter()
        .flat_map(|plan| {
            plan.partitions
                .iter()
                .filter_map(|w| w.target.ok())
                .filter_map(|p| log.subscribe(&plan.topic, p).ok())
        })
        // A watch closed already (its partition just deleted) would wake the wait at once.
        .filter(|watch| watch.has_changed().is_ok())
        .collect()
}

/// Resolves when any of `watches` reports a new durable end or is closed (its partition was
/// deleted, or the log is closing): either way the answer must be looked at again. Never
/// resolves for no watch. Each call polls fresh `changed` futures, and none is polled again
/// once it has completed (tokio's futures abort the process when resumed after completion).
async fn any_changed(watches: &mut [watch::Receiver<u64>]) {
    let mut changes: Vec<Pin<Box<_>>> = watches.iter_mut().map(|w| Box::pin(w.changed())).collect();
    poll_fn(|cx| {
        for change in &mut changes {
            if change.as_mut().poll(cx).is_ready() {
                return Poll::Ready(());
            }
        }
        Poll::Pending
    })
    .await;
}
