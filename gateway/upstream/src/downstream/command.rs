//! One command record from the datacenter, as the downstream judges and stores it: whether it is
//! addressed to this gateway (its key: the gateway id, `*`, or `group:{g}`), and the edge record
//! it becomes — accepted (its `mqtt.*` headers kept, so MQTT delivers it like any record of the
//! MQTT route) or refused (its `mqtt.topic` moved aside, so nothing delivers it, with the reason
//! in `tern-refused`). Pure: never touches Kafka or the log.

use tern_log::{HeaderName, HeaderValue, Record};

use crate::client::fetch::FetchedRecord;

/// The command's id, `{topic}/{partition}/{offset}` of its record upstream (Kafka topic names
/// hold no `/`): the key of its edge record and of everything reported about it.
pub const H_COMMAND: &str = "tern-command";
/// The upstream record's timestamp (ms since the epoch, decimal).
pub const H_COMMAND_TIMESTAMP: &str = "tern-command-timestamp";
/// The upstream record's key (its address), as it was.
pub const H_COMMAND_KEY: &str = "tern-command-key";
/// Why a command was refused (its edge record is never delivered).
pub const H_REFUSED: &str = "tern-refused";
/// A refused command's `mqtt.topic`, kept for the operator.
pub const H_REFUSED_TOPIC: &str = "tern-refused-topic";

/// The MQTT route's headers (tern-mqtt writes and reads them, `docs/kafka.md`).
const MQTT_TOPIC: &str = "mqtt.topic";
const MQTT_QOS: &str = "mqtt.qos";
const MQTT_RETAIN: &str = "mqtt.retain";
const MQTT_EXPIRY: &str = "mqtt.message_expiry";
/// Every header whose name starts with it is tern's own: a command's are dropped, so the
/// datacenter can neither forge an id nor a stored position.
const TERN_PREFIX: &str = "tern-";

/// The key that addresses every gateway.
pub const EVERY_GATEWAY: &[u8] = b"*";
/// The prefix of a key that addresses a group of gateways.
pub const GROUP_PREFIX: &[u8] = b"group:";

/// Whether a record with `key` is for `gateway`, a member of `groups`. A keyless record is
/// for no gateway.
pub fn addressed_to(key: Option<&[u8]>, gateway: &str, groups: &[String]) -> bool {
    let Some(key) = key else {
        return false;
    };
    if key == gateway.as_bytes() || key == EVERY_GATEWAY {
        return true;
    }
    key.strip_prefix(GROUP_PREFIX)
        .is_some_and(|group| groups.iter().any(|g| g.as_bytes() == group))
}

/// What became of a command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Stored for delivery to MQTT subscribers.
    Accepted,
    /// Stored, never delivered, for this reason.
    Refused(String),
}

/// The command's id ([`H_COMMAND`]).
pub fn command_id(topic: &str, partition: i32, offset: i64) -> String {
    format!("{topic}/{partition}/{offset}")
}

/// The edge record `record` (offset `record.offset` of `topic`/`partition` upstream) becomes,
/// stamped `now_ms` by the gateway (a message expiry counts from it), and whether it was
/// accepted: its `mqtt.topic` must be a valid topic name matched by one of the `allow` filters,
/// its `mqtt.qos`, `mqtt.retain` and `mqtt.message_expiry` values what a publish may carry.
pub fn edge_record(
    record: &FetchedRecord,
    (topic, partition): (&str, i32),
    allow: &[String],
    now_ms: i64,
) -> (Record, Verdict) {
    let verdict = match judge(record, allow) {
        Ok(()) => Verdict::Accepted,
        Err(reason) => Verdict::Refused(reason),
    };
    let id = command_id(topic, partition, record.offset);
    let mut headers: Vec<(HeaderName, HeaderValue)> = Vec::with_capacity(record.headers.len() + 4);
    for (name, value) in &record.headers {
        if name.starts_with(TERN_PREFIX) {
            continue;
        }
        if name == MQTT_TOPIC && verdict != Verdict::Accepted {
            headers.push((H_REFUSED_TOPIC.into(), value.clone().into()));
            continue;
        }
        headers.push((name.clone().into(), value.clone().into()));
    }
    headers.push((H_COMMAND.into(), id.clone().into_bytes().into()));
    headers.push((
        H_COMMAND_TIMESTAMP.into(),
        record.timestamp_ms.to_string().into_bytes().into(),
    ));
    if let Some(key) = &record.key {
        headers.push((H_COMMAND_KEY.into(), key.clone().into()));
    }
    if let Verdict::Refused(reason) = &verdict {
        headers.push((H_REFUSED.into(), reason.clone().into_bytes().into()));
    }
    let edge = Record {
        timestamp_ms: now_ms,
        key: Some(id.into_bytes().into()),
        value: record.value.clone().unwrap_or_default().into(),
        headers: headers.into(),
    };
    (edge, verdict)
}

/// The first value of header `name`: the one MQTT delivery reads (`Record::header`).
fn header<'a>(record: &'a FetchedRecord, name: &str) -> Option<&'a [u8]> {
    record
        .headers
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.as_slice())
}

/// Why `record` may not be published, if it may not.
fn judge(record: &FetchedRecord, allow: &[String]) -> Result<(), String> {
    let topic = header(record, MQTT_TOPIC).ok_or("no mqtt.topic header")?;
    let topic = std::str::from_utf8(topic).map_err(|_| "mqtt.topic is not UTF-8")?;
    if let Some(reason) = tern_auth::invalid_topic_name(topic) {
        return Err(format!("mqtt.topic: {reason}"));
    }
    if !allow.iter().any(|f| tern_auth::topic_matches(f, topic)) {
        return Err(format!(
            "mqtt.topic {topic:?} is not allowed ([upstream.commands] allow)"
        ));
    }
    match header(record, MQTT_QOS) {
        None | Some(b"0" | b"1" | b"2") => {}
        Some(_) => return Err("mqtt.qos must be 0, 1 or 2".to_owned()),
    }
    match header(record, MQTT_RETAIN) {
        None | Some(b"0" | b"1") => {}
        Some(_) => return Err("mqtt.retain must be 0 or 1".to_owned()),
    }
    if let Some(expiry) = header(record, MQTT_EXPIRY) {
        let seconds = std::str::from_utf8(expiry)
            .ok()
            .and_then(|s| s.parse::<u32>().ok());
        if seconds.is_none() {
            return Err("mqtt.message_expiry must be seconds (0 to 4294967295)".to_owned());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn command(key: &[u8], headers: &[(&str, &[u8])]) -> FetchedRecord {
        FetchedRecord {
            offset: 7,
            timestamp_ms: 1_000,
            key: Some(key.to_vec()),
            value: Some(b"reboot".to_vec()),
            headers: headers
                .iter()
                .map(|(n, v)| ((*n).to_owned(), v.to_vec()))
                .collect(),
        }
    }

    fn allow() -> Vec<String> {
        vec!["devices/+/cmd".to_owned()]
    }

    fn value<'a>(record: &'a Record, name: &str) -> Option<&'a [u8]> {
        record.header(name)
    }

    #[test]
    fn a_command_is_for_its_gateway_every_gateway_or_a_group_it_is_in() {
        let groups = vec!["site-3".to_owned()];
        assert!(addressed_to(Some(b"gw-a"), "gw-a", &groups));
        assert!(addressed_to(Some(b"*"), "gw-a", &groups));
        assert!(addressed_to(Some(b"group:site-3"), "gw-a", &groups));
        assert!(!addressed_to(Some(b"group:site-4"), "gw-a", &groups));
        assert!(!addressed_to(Some(b"gw-b"), "gw-a", &groups));
        assert!(!addressed_to(Some(b"gw-a2"), "gw-a", &groups));
        assert!(!addressed_to(Some(b"group:"), "gw-a", &[]));
        assert!(!addressed_to(None, "gw-a", &groups));
    }

    #[test]
    fn an_accepted_command_keeps_its_mqtt_headers_and_gains_its_id() {
        let record = command(
            b"gw-a",
            &[
                ("mqtt.topic", b"devices/7/cmd"),
                ("mqtt.qos", b"1"),
                ("tern-command", b"forged/0/0"),
            ],
        );
        let (edge, verdict) = edge_record(&record, ("tern-commands", 2), &allow(), 5_000);
        assert_eq!(verdict, Verdict::Accepted);
        assert_eq!(edge.timestamp_ms, 5_000);
        assert_eq!(edge.key.as_deref(), Some(&b"tern-commands/2/7"[..]));
        assert_eq!(edge.value, &b"reboot"[..]);
        assert_eq!(value(&edge, "mqtt.topic"), Some(&b"devices/7/cmd"[..]));
        assert_eq!(value(&edge, "mqtt.qos"), Some(&b"1"[..]));
        assert_eq!(value(&edge, H_COMMAND), Some(&b"tern-commands/2/7"[..]));
        assert_eq!(value(&edge, H_COMMAND_TIMESTAMP), Some(&b"1000"[..]));
        assert_eq!(value(&edge, H_COMMAND_KEY), Some(&b"gw-a"[..]));
        let ids = edge
            .headers
            .iter()
            .filter(|(n, _)| &**n == H_COMMAND)
            .count();
        assert_eq!(ids, 1, "the forged id is dropped");
        assert_eq!(value(&edge, H_REFUSED), None);
    }

    #[test]
    fn a_refused_command_is_stored_without_its_mqtt_topic_and_with_the_reason() {
        type Headers<'a> = &'a [(&'a str, &'a [u8])];
        let cases: [(Headers<'_>, &str); 6] = [
            (&[], "no mqtt.topic"),
            (&[("mqtt.topic", b"devices/+/cmd")], "must not contain"),
            (&[("mqtt.topic", b"other/7")], "not allowed"),
            (
                &[("mqtt.topic", b"devices/7/cmd"), ("mqtt.qos", b"3")],
                "mqtt.qos",
            ),
            (
                &[("mqtt.topic", b"devices/7/cmd"), ("mqtt.retain", b"yes")],
                "mqtt.retain",
            ),
            (
                &[
                    ("mqtt.topic", b"devices/7/cmd"),
                    ("mqtt.message_expiry", b"-1"),
                ],
                "mqtt.message_expiry",
            ),
        ];
        for (headers, reason) in cases {
            let (edge, verdict) = edge_record(&command(b"*", headers), ("t", 0), &allow(), 0);
            let Verdict::Refused(why) = verdict else {
                panic!("{headers:?} accepted");
            };
            assert!(why.contains(reason), "{why}");
            assert_eq!(value(&edge, "mqtt.topic"), None, "{headers:?}");
            assert_eq!(value(&edge, H_REFUSED), Some(why.as_bytes()));
        }
        let (edge, _) = edge_record(
            &command(b"*", &[("mqtt.topic", b"other/7")]),
            ("t", 0),
            &allow(),
            0,
        );
        assert_eq!(value(&edge, H_REFUSED_TOPIC), Some(&b"other/7"[..]));
        let (_, verdict) = edge_record(
            &command(b"*", &[("mqtt.topic", b"devices/7/cmd")]),
            ("t", 0),
            &[],
            0,
        );
        assert!(
            matches!(verdict, Verdict::Refused(_)),
            "empty allow refuses all"
        );
    }

    proptest! {
        /// Whatever the datacenter sends, judging it never panics, a refused command never
        /// keeps an `mqtt.topic` header, and no `tern-` header but tern's own survives.
        #[test]
        fn any_record_is_judged_without_panicking(
            key in proptest::option::of(proptest::collection::vec(any::<u8>(), 0..12)),
            value in proptest::option::of(proptest::collection::vec(any::<u8>(), 0..12)),
            headers in proptest::collection::vec(
                (prop_oneof![
                    Just("mqtt.topic".to_owned()),
                    Just("mqtt.qos".to_owned()),
                    Just("mqtt.message_expiry".to_owned()),
                    Just("tern-command".to_owned()),
                    "[a-z.-]{0,8}",
                ], proptest::collection::vec(any::<u8>(), 0..16)),
                0..6,
            ),
        ) {
            let record = FetchedRecord { offset: 1, timestamp_ms: 2, key, value, headers };
            let allow = vec!["#".to_owned()];
            let (edge, verdict) = edge_record(&record, ("t", 0), &allow, 3);
            if verdict != Verdict::Accepted {
                prop_assert!(edge.header("mqtt.topic").is_none());
            }
            let ours = edge.headers.iter().filter(|(n, _)| n.starts_with("tern-command")).count();
            prop_assert!((2..=3).contains(&ours));
        }
    }
}
