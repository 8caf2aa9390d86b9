//! What became of the datacenter's commands on the MQTT side (`docs/downstream.md`): a record
//! of a command log topic (`MqttConfig::command_log_topics`) delivered to a client — its PUBACK
//! (QoS 1) or PUBCOMP (QoS 2) received, or written to the socket at QoS 0 — or skipped because
//! its message expiry passed, is reported by one outcome record queued to the same log topic:
//! key and `tern-command` the command's id, `tern-outcome` (`delivered` or `expired`),
//! `tern-client-id`, `tern-qos`. It has no `mqtt.topic`, so it is never delivered itself; the
//! upstream forwards it with the command. An event seen again after a crash (a redelivery
//! acknowledged twice) is reported again: outcomes are at least once per event. Pure but for
//! [`report`], which reads the command's id and queues the record.

use tern_log::{Bytes, LogPort, Record};

use super::codec::QoS;
use super::router::PartitionId;

/// The downstream's header naming a command (tern-upstream's `downstream::H_COMMAND`; the
/// binary's tests check they agree).
pub const COMMAND_HEADER: &str = "tern-command";
/// What became of the command.
pub const OUTCOME_HEADER: &str = "tern-outcome";
/// The client that received (or missed) it.
pub const CLIENT_HEADER: &str = "tern-client-id";
/// The QoS it was delivered at.
pub const QOS_HEADER: &str = "tern-qos";

/// An outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Acknowledged by the client (QoS 1, 2), or written to its socket (QoS 0).
    Delivered,
    /// Not delivered to this client: its message expiry had passed.
    Expired,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Self::Delivered => "delivered",
            Self::Expired => "expired",
        }
    }
}

/// One outcome waiting to be reported: the record it is about, what happened, at which QoS.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Due {
    pub source: (PartitionId, u64),
    pub kind: Kind,
    pub qos: QoS,
}

/// The outcome record of command `id` for `client_id`, stamped `now_ms`.
pub fn outcome_record(id: &[u8], due: &Due, client_id: &str, now_ms: i64) -> Record {
    let qos: &'static [u8] = match due.qos {
        QoS::AtMostOnce => b"0",
        QoS::AtLeastOnce => b"1",
        QoS::ExactlyOnce => b"2",
    };
    let mut record = record_of(id, due.kind.name(), now_ms);
    record.headers.extend([
        (CLIENT_HEADER.into(), client_id.as_bytes().to_vec().into()),
        (QOS_HEADER.into(), qos.into()),
    ]);
    record
}

/// An outcome record of command `id`: its key and `tern-command` the id, `tern-outcome`
/// `outcome`, no value and no `mqtt.topic` (never delivered), stamped `now_ms`.
pub fn record_of(id: &[u8], outcome: &'static str, now_ms: i64) -> Record {
    Record {
        timestamp_ms: now_ms,
        key: Some(Bytes::copy_from_slice(id)),
        value: Bytes::new(),
        headers: tern_log::Headers::from(vec![
            (COMMAND_HEADER.into(), Bytes::copy_from_slice(id)),
            (OUTCOME_HEADER.into(), outcome.as_bytes().into()),
        ]),
    }
}

/// Queues the outcome record of each of `due` whose record is a command (it carries
/// `tern-command`) to its log topic; a failure is logged, never the connection's end. The
/// records are durable with the topic's next commit (their answers are not awaited).
pub async fn report<S: LogPort>(log: &S, due: Vec<Due>, client_id: &str, now_ms: i64) {
    for due in due {
        let ((topic, partition), offset) = &due.source;
        let read = log.read(topic, *partition, *offset, 1);
        let id = match read {
            Ok(records) => records
                .into_iter()
                .find(|r| r.offset == *offset)
                .and_then(|r| r.record.header(COMMAND_HEADER).map(<[u8]>::to_vec)),
            Err(err) => {
                tracing::warn!(%topic, partition, offset, %err, "cannot read a command to report its outcome");
                None
            }
        };
        let Some(id) = id else {
            continue;
        };
        let record = outcome_record(&id, &due, client_id, now_ms);
        match log.enqueue(topic, *partition, vec![record]).await {
            Ok(answer) => drop(answer),
            Err(err) => {
                tracing::warn!(%topic, partition, %err, outcome = due.kind.name(), "command outcome not stored");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use tern_log::MemoryLog;

    use super::*;

    fn command(id: &str) -> Record {
        Record {
            timestamp_ms: 1,
            key: Some(id.as_bytes().to_vec().into()),
            value: b"reboot".to_vec().into(),
            headers: tern_log::Headers::from(vec![
                ("mqtt.topic".into(), b"devices/1/cmd".to_vec().into()),
                (COMMAND_HEADER.into(), id.as_bytes().to_vec().into()),
            ]),
        }
    }

    #[tokio::test]
    async fn an_outcome_names_its_command_and_client_and_is_never_an_mqtt_message()
    -> Result<(), Box<dyn std::error::Error>> {
        let log = MemoryLog::new(1);
        log.create_topic("commands", 1)?;
        log.append("commands", 0, vec![command("t/0/7")]).await?;
        let plain = Record {
            headers: tern_log::Headers::from(vec![("mqtt.topic".into(), b"a".to_vec().into())]),
            ..command("x")
        };
        log.append("commands", 0, vec![plain]).await?;
        let partition = ("commands".to_owned(), 0);
        let due = vec![
            Due {
                source: (partition.clone(), 0),
                kind: Kind::Delivered,
                qos: QoS::AtLeastOnce,
            },
            // Not a command (no tern-command): nothing to report.
            Due {
                source: (partition.clone(), 1),
                kind: Kind::Expired,
                qos: QoS::AtMostOnce,
            },
        ];
        report(&log, due, "device-1", 5).await;
        let mut end = log.subscribe("commands", 0)?;
        end.wait_for(|e| *e >= 3).await?;
        let stored = log.read("commands", 0, 2, usize::MAX)?;
        assert_eq!(stored.len(), 1);
        let record = &stored[0].record;
        assert_eq!(record.key.as_deref(), Some(&b"t/0/7"[..]));
        assert_eq!(record.header(OUTCOME_HEADER), Some(&b"delivered"[..]));
        assert_eq!(record.header(CLIENT_HEADER), Some(&b"device-1"[..]));
        assert_eq!(record.header(QOS_HEADER), Some(&b"1"[..]));
        assert_eq!(record.header("mqtt.topic"), None);
        Ok(())
    }
}
