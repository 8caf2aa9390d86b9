//! Which upstream partition a record goes to in shared mode: Kafka's own default partitioner for
//! keyed records (murmur2 of the key, sign bit cleared, modulo the partition count, as
//! `org.apache.kafka.common.utils.Utils.murmur2` / `toPositive`), so tern and every Kafka client
//! put one key in the same partition. Pure functions; never looks at values.

use std::borrow::Cow;

use super::super::Provenance;
use super::super::config::SharedKey;
use super::super::edge::EdgeRecord;

/// Kafka's murmur2 (32-bit, seed `0x9747b28c`), bit for bit as the Java client computes it.
pub fn murmur2(data: &[u8]) -> i32 {
    const SEED: u32 = 0x9747_b28c;
    const M: u32 = 0x5bd1_e995;
    const R: u32 = 24;
    // Java hashes the length as an int; keys longer than 2 GiB do not exist here.
    let mut h = SEED ^ (data.len() as u32);
    let mut chunks = data.chunks_exact(4);
    for chunk in &mut chunks {
        let mut k = chunk
            .iter()
            .rev()
            .fold(0u32, |k, &b| (k << 8) | u32::from(b));
        k = k.wrapping_mul(M);
        k ^= k >> R;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M) ^ k;
    }
    let tail = chunks.remainder();
    if !tail.is_empty() {
        for (i, &b) in tail.iter().enumerate().rev() {
            h ^= u32::from(b) << (8 * i);
        }
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^= h >> 15;
    h as i32
}

/// `toPositive(murmur2(key)) % partitions`; `partitions` must be at least 1.
pub fn partition_for(key: &[u8], partitions: u32) -> u32 {
    let positive = (murmur2(key) & 0x7fff_ffff) as u32;
    positive % partitions.max(1)
}

/// The bytes `shared_key` hashes for `record` from `source`.
pub fn routing_key<'a>(
    choice: SharedKey,
    record: &'a EdgeRecord,
    source: &Provenance,
) -> Cow<'a, [u8]> {
    match (choice, &record.key) {
        (SharedKey::RecordKey, Some(key)) => Cow::Borrowed(key),
        (SharedKey::Gateway, _) => Cow::Owned(source.gateway.clone().into_bytes()),
        (SharedKey::RecordKey | SharedKey::EdgePartition, _) => Cow::Owned(
            format!("{}/{}/{}", source.gateway, source.topic, source.partition).into_bytes(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `UtilsTest.testMurmur2` of Apache Kafka's clients module.
    const JAVA_VECTORS: &[(&[u8], i32)] = &[
        (b"21", -973_932_308),
        (b"foobar", -790_332_482),
        (b"a-little-bit-long-string", -985_981_536),
        (b"a-little-bit-longer-string", -1_486_304_829),
        (
            b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8",
            -58_897_971,
        ),
        (b"abc", 479_470_107),
    ];

    #[test]
    fn murmur2_matches_kafkas_java_implementation() {
        for (input, expected) in JAVA_VECTORS {
            assert_eq!(
                murmur2(input),
                *expected,
                "{}",
                String::from_utf8_lossy(input)
            );
        }
    }

    #[test]
    fn partitions_clear_the_sign_bit_like_to_positive() {
        // toPositive(-790332482) = 1357151166; % 10 = 6.
        assert_eq!(partition_for(b"foobar", 10), 6);
        for (input, _) in JAVA_VECTORS {
            assert!(partition_for(input, 3) < 3);
        }
        assert_eq!(partition_for(b"x", 0), 0);
    }

    #[test]
    fn routing_keys_follow_shared_key() {
        let source = Provenance {
            gateway: "gw1".into(),
            topic: "mqtt".into(),
            partition: 2,
        };
        let mut record = EdgeRecord {
            offset: 0,
            timestamp_ms: 0,
            key: Some(b"dev-7".to_vec()),
            value: Vec::new(),
            headers: Vec::new(),
        };
        let key = |choice, record: &EdgeRecord| routing_key(choice, record, &source).into_owned();
        assert_eq!(key(SharedKey::RecordKey, &record), b"dev-7");
        assert_eq!(key(SharedKey::Gateway, &record), b"gw1");
        assert_eq!(key(SharedKey::EdgePartition, &record), b"gw1/mqtt/2");
        record.key = None;
        assert_eq!(key(SharedKey::RecordKey, &record), b"gw1/mqtt/2");
    }
}
