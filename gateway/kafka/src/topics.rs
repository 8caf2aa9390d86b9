//! Log topics as Kafka clients name them: looking one up (creating it when allowed), the
//! partition check every partition-level API makes, and which topics are tern's own
//! (`__…`, such as the MQTT state), which clients may read but never write.

use kafka_protocol::ResponseError;
use tern_log::LogPort;

/// A topic's partition count, or the Kafka error for it.
pub type Lookup = Result<u32, ResponseError>;

/// Whether `name` is one of tern's own topics.
pub fn is_internal(name: &str) -> bool {
    name.starts_with("__")
}

/// The partition count of `name`; creates the topic when `create` and the name is valid.
pub fn lookup<L: LogPort>(log: &L, name: &str, create: bool) -> Lookup {
    if let Some(info) = log.topics().into_iter().find(|t| t.name == name) {
        return Ok(info.partitions);
    }
    if tern_log::validate_topic_name(name).is_err() || is_internal(name) {
        return Err(if create {
            ResponseError::InvalidTopicException
        } else {
            ResponseError::UnknownTopicOrPartition
        });
    }
    if !create {
        return Err(ResponseError::UnknownTopicOrPartition);
    }
    log.ensure_topic(name).map_err(|err| {
        tracing::warn!(topic = name, %err, "cannot create a topic for a Kafka client");
        ResponseError::UnknownServerError
    })
}

/// The partition `index` of a topic with `partitions`, or `UNKNOWN_TOPIC_OR_PARTITION`.
pub fn partition(index: i32, partitions: u32) -> Result<u32, ResponseError> {
    u32::try_from(index)
        .ok()
        .filter(|&p| p < partitions)
        .ok_or(ResponseError::UnknownTopicOrPartition)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tern_log::MemoryLog;

    #[test]
    fn lookup_creates_only_valid_non_internal_names_when_allowed() {
        let log = MemoryLog::new(1);
        assert_eq!(
            lookup(&log, "telemetry", false),
            Err(ResponseError::UnknownTopicOrPartition)
        );
        assert!(lookup(&log, "telemetry", true).is_ok_and(|n| n > 0));
        assert!(lookup(&log, "telemetry", false).is_ok());
        assert_eq!(
            lookup(&log, "a/b", true),
            Err(ResponseError::InvalidTopicException)
        );
        assert_eq!(
            lookup(&log, "__own", true),
            Err(ResponseError::InvalidTopicException)
        );
        assert_eq!(partition(0, 1), Ok(0));
        assert_eq!(partition(1, 1), Err(ResponseError::UnknownTopicOrPartition));
        assert_eq!(
            partition(-1, 1),
            Err(ResponseError::UnknownTopicOrPartition)
        );
    }
}
