//! Which key picks a record's upstream partition in shared mode (`shared_key`); the partition
//! is Kafka's own default partitioner of that key (`tern_partitioner`), so tern and every Kafka
//! client put one key in the same partition. Pure functions; never looks at values.

use std::borrow::Cow;

use tern_log::StoredRecord;

use crate::config::SharedKey;
use crate::provenance::Provenance;

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
                key: Some(b"dev-7".to_vec().into()),
                value: Vec::new().into(),
                headers: tern_log::Headers::new(),
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
