//! Idempotent producers through Produce on the in-memory log: duplicates answered with the
//! first copy's offset (also while it is in flight), gaps and old epochs refused; and the batch
//! header's producer fields, for any bytes.

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use kafka_protocol::indexmap::IndexMap;
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{ApiKey, ProduceRequest, ProduceResponse, TopicName};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::records::{
    Compression, Record as KafkaRecord, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
};
use proptest::prelude::*;
use tern_log::{LogPort, MemoryLog};

use super::{MAX_PRODUCERS_PER_PARTITION, Offset, Producers, Verdict, follows};
use crate::api::test::{body, conn, ctx, decode_as, request};
use crate::api::{Ctx, Reply, dispatch};
use crate::records::{ProducerBatch, producer_batch};

/// One batch of `values` from producer `id` at `epoch`, its first record at sequence `seq`.
fn batch(id: i64, epoch: i16, seq: i32, values: &[&str], compression: Compression) -> Bytes {
    let records: Vec<KafkaRecord> = values
        .iter()
        .enumerate()
        .map(|(i, value)| KafkaRecord {
            transactional: false,
            control: false,
            delete_horizon: false,
            partition_leader_epoch: -1,
            producer_id: id,
            producer_epoch: epoch,
            timestamp_type: TimestampType::Creation,
            offset: i as i64,
            sequence: seq.wrapping_add(i as i32),
            timestamp: 1_000,
            key: None,
            value: Some(Bytes::copy_from_slice(value.as_bytes())),
            headers: IndexMap::new(),
        })
        .collect();
    let mut buf = BytesMut::new();
    let options = RecordEncodeOptions {
        version: 2,
        compression,
    };
    RecordBatchEncoder::encode(&mut buf, records.iter(), &options).expect("encode");
    buf.freeze()
}

fn produce(records: Bytes) -> crate::header::Request {
    let body = ProduceRequest::default()
        .with_acks(-1)
        .with_topic_data(vec![
            TopicProduceData::default()
                .with_name(TopicName(StrBytes::from_static_str("t")))
                .with_partition_data(vec![
                    PartitionProduceData::default()
                        .with_index(0)
                        .with_records(Some(records)),
                ]),
        ]);
    request(ApiKey::Produce, 9, &body)
}

/// Sends a Produce of `records` to partition 0 of `t`, returns its reply unawaited.
async fn send(ctx: &Ctx<MemoryLog>, records: Bytes) -> Reply {
    dispatch(ctx, &mut conn(), &produce(records))
        .await
        .expect("reply")
}

/// (error code, base offset) a reply answers.
async fn answer(reply: Reply) -> (i16, i64) {
    let response: ProduceResponse = decode_as(body(reply).await.expect("answered"), 9);
    let partition = &response.responses[0].partition_responses[0];
    (partition.error_code, partition.base_offset)
}

fn stored(ctx: &Ctx<MemoryLog>) -> Vec<String> {
    ctx.log
        .read("t", 0, 0, 1 << 20)
        .expect("read")
        .into_iter()
        .map(|s| String::from_utf8_lossy(&s.record.value).into_owned())
        .collect()
}

fn test_ctx() -> Ctx<MemoryLog> {
    let ctx = ctx();
    ctx.log.ensure_topic("t").expect("topic");
    ctx
}

#[tokio::test]
async fn a_resent_batch_is_stored_once_and_answered_with_the_first_offset() {
    let ctx = test_ctx();
    let first = batch(7, 0, 0, &["a", "b"], Compression::None);
    assert_eq!(answer(send(&ctx, first.clone()).await).await, (0, 0));
    let second = batch(7, 0, 2, &["c"], Compression::Gzip);
    assert_eq!(answer(send(&ctx, second.clone()).await).await, (0, 2));
    // Both resent (the answers were lost): the same offsets, nothing appended.
    assert_eq!(answer(send(&ctx, first).await).await, (0, 0));
    assert_eq!(answer(send(&ctx, second).await).await, (0, 2));
    assert_eq!(stored(&ctx), ["a", "b", "c"]);
    // Another producer's batch with the same sequences is no duplicate.
    assert_eq!(
        answer(send(&ctx, batch(8, 0, 0, &["d", "e"], Compression::None)).await).await,
        (0, 3)
    );
    // A batch without a producer id is never deduplicated.
    let plain = batch(-1, -1, -1, &["f"], Compression::None);
    assert_eq!(answer(send(&ctx, plain.clone()).await).await, (0, 5));
    assert_eq!(answer(send(&ctx, plain).await).await, (0, 6));
    assert_eq!(stored(&ctx), ["a", "b", "c", "d", "e", "f", "f"]);
}

/// After a restart (a new table of producers over the same log), a batch stored before it is
/// recognised from its stamp: its retry is answered with the first copy's offset, the
/// producer's next batch must follow its last sequence, and a producer whose stamps the log
/// does not hold is accepted as new.
#[tokio::test]
async fn a_batch_retried_after_a_restart_is_answered_with_its_first_offset() {
    let ctx = test_ctx();
    let first = batch(7, 0, 0, &["a", "b"], Compression::None);
    let second = batch(7, 0, 2, &["c"], Compression::Lz4);
    assert_eq!(answer(send(&ctx, first.clone()).await).await, (0, 0));
    assert_eq!(answer(send(&ctx, second.clone()).await).await, (0, 2));
    let stamps = ctx.log.producer_stamps("t", 0).expect("stamps");
    assert_eq!(stamps.len(), 2, "{stamps:?}");
    let mut restarted = test_ctx();
    restarted.log = ctx.log.clone();
    assert_eq!(answer(send(&restarted, second).await).await, (0, 2));
    assert_eq!(answer(send(&restarted, first).await).await, (0, 0));
    assert_eq!(
        answer(send(&restarted, batch(7, 0, 4, &["gap"], Compression::None)).await).await,
        (45, -1)
    );
    assert_eq!(
        answer(send(&restarted, batch(7, 0, 3, &["d"], Compression::None)).await).await,
        (0, 3)
    );
    assert_eq!(
        answer(send(&restarted, batch(9, 0, 40, &["e"], Compression::None)).await).await,
        (0, 4)
    );
    assert_eq!(stored(&restarted), ["a", "b", "c", "d", "e"]);
}

/// A deleted topic's producers are forgotten with it: the same producer and sequences on a
/// topic created again under its name are a new batch.
#[tokio::test]
async fn a_topic_created_again_starts_with_no_producers() {
    let ctx = test_ctx();
    let first = batch(7, 0, 0, &["a"], Compression::None);
    assert_eq!(answer(send(&ctx, first.clone()).await).await, (0, 0));
    ctx.log.delete_topic("t").await.expect("delete");
    ctx.producer_states.forget_topic("t");
    ctx.log.ensure_topic("t").expect("topic again");
    assert_eq!(answer(send(&ctx, first).await).await, (0, 0));
    assert_eq!(stored(&ctx), ["a"]);
}

#[tokio::test]
async fn a_gap_an_old_epoch_or_a_new_epoch_not_at_zero_is_refused() {
    let ctx = test_ctx();
    // A producer the partition has never seen is accepted at any sequence (as after a restart).
    assert_eq!(
        answer(send(&ctx, batch(7, 3, 10, &["a"], Compression::None)).await).await,
        (0, 0)
    );
    let refused = [
        (batch(7, 3, 12, &["gap"], Compression::None), 45),
        (batch(7, 3, 9, &["before"], Compression::None), 45),
        (batch(7, 2, 11, &["old epoch"], Compression::None), 47),
        (batch(7, 4, 11, &["new epoch"], Compression::None), 45),
    ];
    for (records, code) in refused {
        assert_eq!(answer(send(&ctx, records).await).await, (code, -1));
    }
    assert_eq!(
        answer(send(&ctx, batch(7, 3, 11, &["b"], Compression::None)).await).await,
        (0, 1)
    );
    // A new epoch starts at 0; the old epoch is then fenced.
    assert_eq!(
        answer(send(&ctx, batch(7, 4, 0, &["c"], Compression::None)).await).await,
        (0, 2)
    );
    assert_eq!(
        answer(send(&ctx, batch(7, 3, 12, &["d"], Compression::None)).await).await,
        (47, -1)
    );
    assert_eq!(stored(&ctx), ["a", "b", "c"]);
}

#[tokio::test]
async fn the_sequence_wraps_from_i32_max_to_zero() {
    let ctx = test_ctx();
    let wrapping = batch(7, 0, i32::MAX - 1, &["a", "b", "c"], Compression::None);
    assert_eq!(
        producer_batch(&wrapping).expect("header"),
        Some(ProducerBatch {
            producer_id: 7,
            epoch: 0,
            first_seq: i32::MAX - 1,
            last_seq: 0
        })
    );
    assert_eq!(answer(send(&ctx, wrapping).await).await, (0, 0));
    assert_eq!(
        answer(send(&ctx, batch(7, 0, 1, &["d"], Compression::None)).await).await,
        (0, 3)
    );
    assert!(follows(i32::MAX, 0) && follows(4, 5) && !follows(i32::MAX, i32::MIN));
}

#[tokio::test(start_paused = true)]
async fn a_duplicate_of_an_append_in_flight_waits_for_its_offset() {
    let ctx = test_ctx();
    ctx.log.hold_answers([Duration::from_secs(5)]);
    let records = batch(7, 0, 0, &["a", "b"], Compression::None);
    let started = tokio::time::Instant::now();
    let first = send(&ctx, records.clone()).await;
    // The first answer is lost with its connection; the retry comes on another one.
    drop(first);
    let retry = send(&ctx, records).await;
    assert_eq!(answer(retry).await, (0, 0));
    assert!(
        started.elapsed() >= Duration::from_secs(5),
        "answered before the first copy was durable"
    );
    assert_eq!(stored(&ctx), ["a", "b"]);
}

#[test]
fn the_least_recently_used_producer_is_forgotten_beyond_the_limit() {
    let mut producers = Producers::default();
    let batch = |id| ProducerBatch {
        producer_id: id,
        epoch: 0,
        first_seq: 0,
        last_seq: 0,
    };
    for id in 0..MAX_PRODUCERS_PER_PARTITION as i64 {
        assert!(matches!(producers.check(&batch(id)), Verdict::Append));
        producers.record(&batch(id), Offset::Stored(id as u64));
    }
    // Producer 0 is used again, so 1 is the least recently used when one more comes.
    assert!(matches!(producers.check(&batch(0)), Verdict::Duplicate(_)));
    let new = MAX_PRODUCERS_PER_PARTITION as i64;
    assert!(matches!(producers.check(&batch(new)), Verdict::Append));
    producers.record(&batch(new), Offset::Stored(0));
    assert_eq!(producers.by_id.len(), MAX_PRODUCERS_PER_PARTITION);
    assert!(producers.by_id.contains_key(&0));
    assert!(!producers.by_id.contains_key(&1));
}

proptest! {
    /// Any bytes, or a valid idempotent batch with bytes flipped: a header or an error, never a
    /// panic; an intact batch gives back the fields it was built with.
    #[test]
    fn any_record_set_names_its_producer_or_is_refused(
        noise in proptest::collection::vec(any::<u8>(), 0..128),
        id in 0..i64::MAX,
        epoch in 0..i16::MAX,
        seq in 0..i32::MAX,
        count in 1_usize..5,
        flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..8),
    ) {
        let _ = producer_batch(&noise);
        let values: Vec<&str> = (0..count).map(|_| "v").collect();
        let valid = batch(id, epoch, seq, &values, Compression::None);
        let last = (i64::from(seq) + count as i64 - 1) % (i64::from(i32::MAX) + 1);
        prop_assert_eq!(
            producer_batch(&valid).expect("valid"),
            Some(ProducerBatch { producer_id: id, epoch, first_seq: seq, last_seq: last as i32 })
        );
        let mut flipped = valid.to_vec();
        for (at, byte) in flips {
            let i = at.index(flipped.len());
            flipped[i] ^= byte;
        }
        let _ = producer_batch(&flipped);
        // Two batches of which one names a producer: refused.
        let mut two = valid.to_vec();
        two.extend_from_slice(&batch(-1, -1, -1, &["w"], Compression::None));
        prop_assert!(producer_batch(&two).is_err());
    }
}
