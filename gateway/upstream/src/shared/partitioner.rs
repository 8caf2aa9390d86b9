//! Which upstream partition a record goes to in shared mode: Kafka's own default partitioner for
//! keyed records (murmur2 of the key, sign bit cleared, modulo the partition count, as
//! `org.apache.kafka.common.utils.Utils.murmur2` / `toPositive`), so tern and every Kafka client
//! put one key in the same partition. Pure functions; never looks at values.

use std::borrow::Cow;

use tern_log::StoredRecord;

use crate::config::SharedKey;
use crate::provenance::Provenance;

/// `toPositive(murmur2(key)) % partitions` (Kafka's default partitioner; the log partitions
/// keys the same way, with the same murmur2 pinned against Kafka's test vectors in the log's
/// tests); `partitions` must be at least 1.
pub fn partition_for(key: &[u8], partitions: u32) -> u32 {
    tern_log::partition_for_key(key, partitions)
}

/// The bytes `shared_key` hashes for `record` from `source`.
pub fn routing_key<'a>(
    choice: SharedKey,
    record: &'a StoredRecord,
    source: &Provenance,
) -> Cow<'a, [u8]> {
    match (choice, &record.record.key) {
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

    #[test]
    fn partitions_clear_the_sign_bit_like_to_positive() {
        // toPositive(-790332482) = 1357151166; % 10 = 6.
        assert_eq!(partition_for(b"foobar", 10), 6);
        for input in [&b"21"[..], b"abc", b"a-little-bit-long-string"] {
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
        let mut record = StoredRecord {
            offset: 0,
            record: tern_log::Record {
                timestamp_ms: 0,
                key: Some(b"dev-7".to_vec()),
                value: Vec::new(),
                headers: Vec::new(),
            },
        };
        let key = |choice, record: &StoredRecord| routing_key(choice, record, &source).into_owned();
        assert_eq!(key(SharedKey::RecordKey, &record), b"dev-7");
        assert_eq!(key(SharedKey::Gateway, &record), b"gw1");
        assert_eq!(key(SharedKey::EdgePartition, &record), b"gw1/mqtt/2");
        record.record.key = None;
        assert_eq!(key(SharedKey::RecordKey, &record), b"gw1/mqtt/2");
    }
}
