//! Records that arrived compressed (a Kafka producer's codec) keep their codec: they are
//! stored uncompressed in batches of that codec only, whose attributes name it, and a reader
//! sees each record with its batch's end and codec, also after a reopen.

use super::super::fs::FaultyFs;
use super::super::{BatchSpan, Codec, LogConfig};
use super::{open, record, runtime};

/// (offset, span) of every record of partition 0 of `t`.
fn spans(log: &super::super::Log) -> Vec<(u64, BatchSpan)> {
    let mut out = Vec::new();
    let mut next = 0;
    let end = log.offsets("t", 0).expect("offsets").1;
    while next < end {
        log.read_batched("t", 0, next, 1 << 20, &mut |offset, _, span| {
            out.push((offset, span));
            next = offset + 1;
        })
        .expect("read");
    }
    out
}

#[test]
fn appends_keep_their_codec_and_never_share_a_batch_with_another_codec() {
    let rt = runtime();
    let fs = FaultyFs::new(7);
    let appends = [
        (Codec::None, 2),
        (Codec::Gzip, 3),
        (Codec::Gzip, 1),
        (Codec::Zstd, 2),
        (Codec::None, 1),
    ];
    rt.block_on(async {
        let log = open(&fs, &LogConfig::default()).await;
        log.create_topic("t", 1).expect("creates");
        // All queued before any is answered, so one commit may gather several.
        let mut answers = Vec::new();
        let mut seq = 0;
        for (codec, count) in appends {
            let records = (0..count).map(|_| {
                seq += 1;
                record(1, seq, 1_000)
            });
            answers.push(
                log.enqueue_with("t", 0, records.collect(), codec)
                    .await
                    .expect("queued"),
            );
        }
        for answer in answers {
            answer.await.expect("answered").expect("durable");
        }
        let check = |spans: &[(u64, BatchSpan)]| {
            let want: Vec<Codec> = appends
                .iter()
                .flat_map(|(codec, count)| std::iter::repeat_n(*codec, *count))
                .collect();
            let got: Vec<Codec> = spans.iter().map(|(_, s)| s.codec).collect();
            assert_eq!(got, want);
            // Every record of a batch has the batch's codec.
            for (offset, span) in spans {
                let inside = spans.iter().filter(|(o, s)| {
                    *o >= *offset && *o < span.next_offset && s.codec != span.codec
                });
                assert_eq!(inside.count(), 0, "{spans:?}");
            }
        };
        let before = spans(&log);
        check(&before);
        log.close().await.expect("close");
        let log = open(&fs, &LogConfig::default()).await;
        assert_eq!(spans(&log), before, "the codecs survive a reopen");
        // A reader that knows nothing of codecs still reads every record.
        assert_eq!(super::read_all(&log, "t", 0).len(), 9);
    });
}
