//! InitProducerId, so idempotent producers (the default of Kafka's Java producer and of
//! kafka-python) can produce: each call gets a fresh producer id, epoch 0. Produce then
//! deduplicates their batches by producer id, epoch and sequence (`crate::producers`): a batch
//! resent after a lost answer is stored once, also when the gateway restarted or crashed in
//! between (the log keeps each batch's producer stamp). Transactional ids are refused
//! with `TRANSACTIONAL_ID_AUTHORIZATION_FAILED`: tern has no transactions.

use std::sync::atomic::{AtomicI64, Ordering};

use kafka_protocol::ResponseError;
use kafka_protocol::messages::{ApiKey, InitProducerIdRequest, InitProducerIdResponse, ProducerId};

use super::{ApiError, Ctx, Reply, Versions, decode, encode};
use crate::header::Request;

/// v0-v5 (v6 adds two-phase commit for transactions). Kafka 4.x Java producers use v5,
/// kafka-python v0-v4 or higher.
pub const VERSIONS: Versions = Versions { min: 0, max: 5 };

/// Hands out producer ids: milliseconds since the epoch at start, times 1024, then counting, so
/// a restarted gateway does not give an id out twice.
#[derive(Debug)]
pub struct ProducerIds(AtomicI64);

impl Default for ProducerIds {
    fn default() -> Self {
        Self(AtomicI64::new(
            super::produce::now_ms().max(1).saturating_mul(1024),
        ))
    }
}

impl ProducerIds {
    fn next(&self) -> i64 {
        self.0.fetch_add(1, Ordering::Relaxed)
    }
}

pub fn handle<L>(ctx: &Ctx<L>, request: &Request) -> Result<Reply, ApiError> {
    let version = request.version();
    let body: InitProducerIdRequest = decode(request)?;
    let response = if body.transactional_id.is_some() {
        InitProducerIdResponse::default()
            .with_error_code(ResponseError::TransactionalIdAuthorizationFailed.code())
            .with_producer_id(ProducerId(-1))
            .with_producer_epoch(-1)
    } else {
        InitProducerIdResponse::default()
            .with_producer_id(ProducerId(ctx.producers.next()))
            .with_producer_epoch(0)
    };
    Ok(Reply::Now(encode(
        ApiKey::InitProducerId,
        version,
        &response,
    )?))
}
