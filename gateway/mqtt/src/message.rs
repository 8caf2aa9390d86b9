//! The mapping between an MQTT message and a log record: the payload becomes the value, the
//! broker's receive time the timestamp, and the MQTT topic, QoS, retain flag, client id and
//! MQTT 5 properties become headers (names below, values as UTF-8 text or raw bytes). Both
//! directions live here so they cannot drift apart. Pure; never touches storage.

use std::ops::Range;

use bytes::{Bytes, BytesMut};
pub use bytestring::ByteString;

use super::codec::{PublishProperties, QoS};
use tern_log::{HeaderBlock, HeaderName, HeaderValue, Headers, Record};

pub const TOPIC: &str = "mqtt.topic";
pub const QOS: &str = "mqtt.qos";
pub const RETAIN: &str = "mqtt.retain";
pub const CLIENT_ID: &str = "mqtt.client_id";
pub const PAYLOAD_FORMAT: &str = "mqtt.payload_format";
pub const MESSAGE_EXPIRY: &str = "mqtt.message_expiry";
pub const CONTENT_TYPE: &str = "mqtt.content_type";
pub const RESPONSE_TOPIC: &str = "mqtt.response_topic";
pub const CORRELATION_DATA: &str = "mqtt.correlation_data";
/// Prefix of one header per user property: `mqtt.user.{name}` = value (repeats allowed).
pub const USER_PREFIX: &str = "mqtt.user.";

/// An MQTT application message as tern stores and delivers it. Topic and client id are
/// [`ByteString`]s: an ingested message's topic is a slice of the PUBLISH frame it arrived in
/// and its client id the connection's one copy, so neither is allocated per message, and a
/// clone shares them (issue #29).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    pub topic: ByteString,
    pub payload: Bytes,
    pub qos: QoS,
    pub retain: bool,
    /// The publisher. A publish a connection queues for the log carries it only when
    /// retained: its batch carries it for the others (`ingest`, [`RecordHeaders::for_client`]).
    pub client_id: ByteString,
    /// Boxed, as in [`super::codec::InPublish`]: a message moves several times on its way to
    /// the log, and most have no properties (issue #29).
    pub properties: Option<Box<PublishProperties>>,
    pub timestamp_ms: i64,
}

impl Message {
    /// The record for the log, keyed by `key`.
    pub fn to_record(&self, key: Option<Bytes>) -> Record {
        let mut headers = RecordHeaders::for_batch([self]);
        self.to_record_in(key, &mut headers)
    }

    /// [`Message::to_record`] with the headers from `headers` (see
    /// [`Message::into_record_in`]).
    pub fn to_record_in(&self, key: Option<Bytes>, headers: &mut RecordHeaders) -> Record {
        self.clone().into_record_in(key, headers)
    }

    /// The record for the log, keyed by `key`, its headers encoded by `headers` (the batch's)
    /// when the message has no MQTT 5 properties (nearly every one). Nothing else is copied:
    /// the payload is shared (an ingested message's lies in its PUBLISH frame). A batch's
    /// records share one buffer for their headers: no allocation per record, and the writer
    /// copies each record's headers in one piece (issues #16 and #29).
    pub fn into_record_in(mut self, key: Option<Bytes>, headers: &mut RecordHeaders) -> Record {
        let headers = self.record_headers(headers);
        Record {
            timestamp_ms: self.timestamp_ms,
            key,
            value: self.payload,
            headers,
        }
    }

    /// [`Message::into_record_in`] keyed by `key` of this message's topic or client id: the
    /// record takes that buffer over instead of sharing it once more.
    pub fn into_record_keyed(mut self, key: &Key, headers: &mut RecordHeaders) -> Record {
        let encoded = self.record_headers(headers);
        let own = &self.client_id;
        let client_id = || publisher(&headers.client, own).clone().into_bytes();
        Record {
            timestamp_ms: self.timestamp_ms,
            key: Some(key.take(self.topic.into_bytes(), client_id)),
            value: self.payload,
            headers: encoded,
        }
    }

    /// The record's headers (the properties are taken).
    fn record_headers(&mut self, headers: &mut RecordHeaders) -> Headers {
        match self.properties.take() {
            None => headers.encode(self),
            // Shared, not copied, in a list sized for the properties up front.
            Some(p) => {
                let client_id = headers.client_id(self).clone().into_bytes();
                let mut list = Vec::with_capacity(4 + property_headers(&p));
                list.extend([
                    (TOPIC.into(), self.topic.clone().into_bytes()),
                    (QOS.into(), Bytes::from_static(qos_value(self.qos))),
                    (RETAIN.into(), Bytes::from_static(retain_value(self.retain))),
                    (CLIENT_ID.into(), client_id),
                ]);
                push_properties(&mut list, &p);
                list.into()
            }
        }
    }

    /// The headers after the topic, which a connection's messages share, for publisher
    /// `client_id`.
    fn shared_headers(&self, client_id: &ByteString) -> HeaderBlock {
        HeaderBlock::new(&self.shared_entries(client_id))
    }

    /// The entries of [`Message::shared_headers`], before encoding.
    fn shared_entries<'a>(&self, client_id: &'a ByteString) -> [(&'static str, &'a [u8]); 3] {
        [
            (QOS, qos_value(self.qos)),
            (RETAIN, retain_value(self.retain)),
            (CLIENT_ID, client_id.as_bytes()),
        ]
    }

    /// The message a record holds; `None` for records not written by the MQTT server.
    pub fn from_record(record: &Record) -> Option<Message> {
        let topic = std::str::from_utf8(record.header(TOPIC)?).ok()?.into();
        let qos = match record.header(QOS) {
            Some(b"1") => QoS::AtLeastOnce,
            Some(b"2") => QoS::ExactlyOnce,
            _ => QoS::AtMostOnce,
        };
        Some(Message {
            topic,
            payload: record.value.clone(),
            qos,
            retain: record.header(RETAIN) == Some(b"1"),
            client_id: text(record, CLIENT_ID).unwrap_or_default().into(),
            properties: read_properties(record).map(Box::new),
            timestamp_ms: record.timestamp_ms,
        })
    }

    /// Whether a message expiry interval has passed by `now_ms`.
    pub fn expired(&self, now_ms: i64) -> bool {
        self.remaining_expiry(now_ms) == Some(0)
    }

    /// Seconds of the message expiry interval left at `now_ms`.
    pub fn remaining_expiry(&self, now_ms: i64) -> Option<u32> {
        let interval = self.properties.as_ref()?.message_expiry_interval?;
        let elapsed = u32::try_from((now_ms - self.timestamp_ms).max(0) / 1000).unwrap_or(u32::MAX);
        Some(interval.saturating_sub(elapsed))
    }
}

/// The part of a publish that keys its record: named, not copied or shared, so the record can
/// take the message's own buffer over (issue #29).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Key {
    /// The whole MQTT topic.
    Topic,
    ClientId,
    /// These bytes of the MQTT topic (one level).
    TopicPart(Range<usize>),
}

impl Key {
    /// The key's bytes in a publish on `topic` by `client_id`.
    pub fn of<'m>(&self, topic: &'m [u8], client_id: &'m [u8]) -> &'m [u8] {
        match self {
            Self::Topic => topic,
            Self::ClientId => client_id,
            Self::TopicPart(part) => topic.get(part.clone()).unwrap_or(topic),
        }
    }

    /// The key of a publish whose topic is this buffer (taken over) and whose client id
    /// `client_id` gives (asked only for a key by client id).
    pub fn take(&self, topic: Bytes, client_id: impl FnOnce() -> Bytes) -> Bytes {
        match self {
            Self::Topic => topic,
            Self::ClientId => client_id(),
            Self::TopicPart(part) if topic.get(part.clone()).is_some() => topic.slice(part.clone()),
            Self::TopicPart(_) => topic,
        }
    }
}

/// The headers of a batch's records, which come from one connection: one buffer for all of
/// them, sized up front, and the headers after the topic (QoS, retain flag, client id) encoded
/// once per combination, not per record (issue #29).
#[derive(Debug)]
pub struct RecordHeaders {
    arena: BytesMut,
    /// The publisher of every message of the batch, if one connection sent them all
    /// ([`RecordHeaders::for_client`]); otherwise each message's own client id counts.
    client: Option<ByteString>,
    /// QoS, retain flag and client id, and their encoding (a batch has one or a few).
    shared: Vec<(QoS, bool, ByteString, HeaderBlock)>,
    /// The entry of `shared` the last message used.
    last: usize,
}

impl RecordHeaders {
    /// Ready for the records of `messages`, in one allocation, each with its own client id.
    pub fn for_batch<'a>(messages: impl IntoIterator<Item = &'a Message>) -> Self {
        Self::sized(None, messages)
    }

    /// [`RecordHeaders::for_batch`] of messages that connection `client_id` published: their
    /// records carry that client id, whatever the messages' own (a connection's queued publish
    /// carries none, only a shared count less per message: issue #29).
    pub fn for_client<'a>(
        client_id: &ByteString,
        messages: impl IntoIterator<Item = &'a Message>,
    ) -> Self {
        Self::sized(Some(client_id.clone()), messages)
    }

    fn sized<'a>(
        client: Option<ByteString>,
        messages: impl IntoIterator<Item = &'a Message>,
    ) -> Self {
        let mut headers = Self {
            arena: BytesMut::new(),
            client,
            shared: Vec::new(),
            last: 0,
        };
        let mut size = 0;
        // The shared headers' size for the previous message's client id: their QoS and retain
        // values are one byte each, whatever the message, so only another client id changes
        // it. Told from their entries once, not per message (issue #29).
        let mut shared: Option<(&ByteString, usize)> = None;
        for message in messages {
            if message.properties.is_none() {
                let topic: &[u8] = message.topic.as_bytes();
                let id = headers.client_id(message);
                let shared_size = match shared {
                    Some((last, known)) if same(last, id) => known,
                    _ => {
                        let told = Headers::encoded_size(&message.shared_entries(id));
                        shared = Some((id, told));
                        told
                    }
                };
                size += Headers::encoded_size(&[(TOPIC, topic)]) + shared_size;
            }
        }
        headers.arena.reserve(size);
        headers
    }

    /// The headers of `message`'s record: its topic, then the shared ones.
    fn encode(&mut self, message: &Message) -> Headers {
        let index = self.index(message);
        let block = self.shared.get(index).map(|(_, _, _, block)| block);
        let entries: [(&str, &[u8]); 1] = [(TOPIC, message.topic.as_bytes())];
        Headers::encode_in_with(&mut self.arena, &entries, block.unwrap_or(&EMPTY))
    }

    /// The client id the record of `message` carries.
    fn client_id<'m>(&'m self, message: &'m Message) -> &'m ByteString {
        publisher(&self.client, &message.client_id)
    }

    /// Where the shared headers of `message` are: nearly always the previous message's.
    #[inline]
    fn index(&mut self, message: &Message) -> usize {
        let id = publisher(&self.client, &message.client_id);
        match self.shared.get(self.last) {
            Some((qos, retain, client_id, _))
                if *qos == message.qos && *retain == message.retain && same(client_id, id) =>
            {
                self.last
            }
            _ => self.search(message),
        }
    }

    /// [`RecordHeaders::index`] of a message unlike the previous one: found, or encoded and
    /// added.
    #[inline(never)]
    fn search(&mut self, message: &Message) -> usize {
        let id = publisher(&self.client, &message.client_id);
        let fits = |(qos, retain, client_id, _): &(QoS, bool, ByteString, HeaderBlock)| {
            *qos == message.qos && *retain == message.retain && same(client_id, id)
        };
        let found = self.shared.iter().position(fits);
        self.last = found.unwrap_or_else(|| {
            let block = message.shared_headers(id);
            let entry = (message.qos, message.retain, id.clone(), block);
            self.shared.push(entry);
            self.shared.len() - 1
        });
        self.last
    }
}

static EMPTY: HeaderBlock = HeaderBlock::EMPTY;

/// The client id a record carries: the batch's publisher if it has one, else the message's own.
fn publisher<'a>(batch: &'a Option<ByteString>, own: &'a ByteString) -> &'a ByteString {
    batch.as_ref().unwrap_or(own)
}

/// Whether two client ids are equal, at a glance when both are the connection's one copy.
fn same(a: &ByteString, b: &ByteString) -> bool {
    let (a, b): (&[u8], &[u8]) = (a.as_bytes(), b.as_bytes());
    std::ptr::eq(a, b) || a == b
}

/// How many headers [`push_properties`] adds for `p`.
fn property_headers(p: &PublishProperties) -> usize {
    usize::from(p.payload_format_indicator.is_some())
        + usize::from(p.message_expiry_interval.is_some())
        + usize::from(p.content_type.is_some())
        + usize::from(p.response_topic.is_some())
        + usize::from(p.correlation_data.is_some())
        + p.user_properties.len()
}

fn push_properties(headers: &mut Vec<(HeaderName, HeaderValue)>, p: &PublishProperties) {
    if let Some(format) = p.payload_format_indicator {
        headers.push((
            PAYLOAD_FORMAT.into(),
            format.to_string().into_bytes().into(),
        ));
    }
    if let Some(expiry) = p.message_expiry_interval {
        headers.push((
            MESSAGE_EXPIRY.into(),
            expiry.to_string().into_bytes().into(),
        ));
    }
    if let Some(content_type) = &p.content_type {
        headers.push((CONTENT_TYPE.into(), content_type.as_bytes().to_vec().into()));
    }
    if let Some(topic) = &p.response_topic {
        headers.push((RESPONSE_TOPIC.into(), topic.as_bytes().to_vec().into()));
    }
    if let Some(data) = &p.correlation_data {
        headers.push((CORRELATION_DATA.into(), data.clone()));
    }
    for (name, value) in &p.user_properties {
        let name = format!("{USER_PREFIX}{name}");
        headers.push((name.into(), value.as_bytes().to_vec().into()));
    }
}

/// The `mqtt.qos` value: one fixed byte, borrowed (no allocation per record).
fn qos_value(qos: QoS) -> &'static [u8] {
    match qos {
        QoS::AtMostOnce => b"0",
        QoS::AtLeastOnce => b"1",
        QoS::ExactlyOnce => b"2",
    }
}

/// The `mqtt.retain` value: `0` or `1`, borrowed.
fn retain_value(retain: bool) -> &'static [u8] {
    if retain { b"1" } else { b"0" }
}

fn text(record: &Record, name: &str) -> Option<String> {
    record
        .header(name)
        .and_then(|v| std::str::from_utf8(v).ok())
        .map(str::to_owned)
}

fn read_properties(record: &Record) -> Option<PublishProperties> {
    let text = |name| text(record, name);
    let user_properties: Vec<(String, String)> = record
        .headers
        .iter()
        .filter_map(|(name, value)| {
            let name = name.strip_prefix(USER_PREFIX)?;
            Some((name.to_owned(), String::from_utf8(value.to_vec()).ok()?))
        })
        .collect();
    let properties = PublishProperties {
        payload_format_indicator: text(PAYLOAD_FORMAT).and_then(|v| v.parse().ok()),
        message_expiry_interval: text(MESSAGE_EXPIRY).and_then(|v| v.parse().ok()),
        topic_alias: None,
        response_topic: text(RESPONSE_TOPIC),
        correlation_data: record.header(CORRELATION_DATA).map(Bytes::copy_from_slice),
        user_properties,
        subscription_identifiers: Vec::new(),
        content_type: text(CONTENT_TYPE),
    };
    (properties != PublishProperties::default()).then_some(properties)
}

/// Milliseconds since the Unix epoch, now (the clock record timestamps and expiries use).
pub use tern_core::time::now_ms;

#[cfg(test)]
mod tests {
    use super::*;

    fn message(properties: Option<PublishProperties>) -> Message {
        Message {
            topic: "site/a/temp".into(),
            payload: Bytes::from_static(b"21.5"),
            qos: QoS::ExactlyOnce,
            retain: true,
            client_id: "dev-a".into(),
            properties: properties.map(Box::new),
            timestamp_ms: 1_700_000_000_000,
        }
    }

    #[test]
    fn headers_carry_topic_qos_retain_and_client() {
        let record = message(None).to_record(Some(Bytes::from_static(b"k")));
        assert_eq!(record.header(TOPIC), Some(&b"site/a/temp"[..]));
        assert_eq!(record.header(QOS), Some(&b"2"[..]));
        assert_eq!(record.header(RETAIN), Some(&b"1"[..]));
        assert_eq!(record.header(CLIENT_ID), Some(&b"dev-a"[..]));
        assert_eq!(record.value, &b"21.5"[..]);
        assert_eq!(record.timestamp_ms, 1_700_000_000_000);
        assert_eq!(Message::from_record(&record), Some(message(None)));
    }

    #[test]
    fn v5_properties_round_trip_through_headers() {
        let properties = PublishProperties {
            payload_format_indicator: Some(1),
            message_expiry_interval: Some(60),
            content_type: Some("application/json".to_owned()),
            response_topic: Some("reply/a".to_owned()),
            correlation_data: Some(Bytes::from_static(&[0, 1, 255])),
            user_properties: vec![
                ("a".to_owned(), "1".to_owned()),
                ("a".to_owned(), "2".to_owned()),
            ],
            ..PublishProperties::default()
        };
        let original = message(Some(properties));
        let record = original.to_record(None);
        assert_eq!(record.header("mqtt.user.a"), Some(&b"1"[..]));
        assert_eq!(Message::from_record(&record), Some(original));
    }

    #[test]
    fn expiry_counts_down_from_the_receive_time() {
        let properties = PublishProperties {
            message_expiry_interval: Some(10),
            ..PublishProperties::default()
        };
        let m = message(Some(properties));
        assert_eq!(m.remaining_expiry(m.timestamp_ms + 3_500), Some(7));
        assert!(m.expired(m.timestamp_ms + 11_000));
        assert!(!message(None).expired(i64::MAX));
    }

    /// A batch's records share one buffer and the encoding of their QoS, retain flag and
    /// client id; each still holds exactly its own message's headers, in order, whatever mix
    /// the batch has (properties, other QoS and retain flags, another client id).
    #[test]
    fn a_batchs_records_hold_their_own_headers() {
        let properties = PublishProperties {
            content_type: Some("text/plain".to_owned()),
            ..PublishProperties::default()
        };
        let mut batch = Vec::new();
        for i in 0..24u8 {
            let mut m = message((i % 7 == 3).then(|| properties.clone()));
            m.topic = format!("site/{i}/temp").into();
            m.qos = [QoS::AtMostOnce, QoS::AtLeastOnce, QoS::ExactlyOnce][usize::from(i % 3)];
            m.retain = i % 2 == 0;
            if i % 5 == 4 {
                m.client_id = format!("dev-{i}").into();
            }
            batch.push(m);
        }
        let mut headers = RecordHeaders::for_batch(&batch);
        let records: Vec<Record> = batch
            .iter()
            .map(|m| m.to_record_in(None, &mut headers))
            .collect();
        assert_eq!(headers.arena.capacity(), 0, "sized for the batch up front");
        for (m, record) in batch.iter().zip(&records) {
            let alone = m.to_record(None);
            assert_eq!(record, &alone);
            assert_eq!(
                record
                    .headers
                    .iter()
                    .map(|(n, _)| n)
                    .take(4)
                    .collect::<Vec<_>>(),
                [TOPIC, QOS, RETAIN, CLIENT_ID]
            );
            assert_eq!(Message::from_record(record).as_ref(), Some(m));
        }
    }

    /// A connection's queued publishes carry no client id: the batch's publisher is written
    /// into every record, as if each message carried it, whatever the key.
    #[test]
    fn a_connections_records_carry_the_batchs_client_id() {
        let properties = PublishProperties {
            content_type: Some("text/plain".to_owned()),
            ..PublishProperties::default()
        };
        let client_id = ByteString::from("dev-7");
        let mut queued = Vec::new();
        for i in 0..6u8 {
            let mut m = message((i == 4).then(|| properties.clone()));
            m.topic = format!("site/{i}/temp").into();
            m.retain = i % 3 == 0;
            m.client_id = ByteString::new();
            queued.push(m);
        }
        for key in [Key::Topic, Key::ClientId, Key::TopicPart(5..6)] {
            let mut headers = RecordHeaders::for_client(&client_id, &queued);
            for m in &queued {
                let record = m.clone().into_record_keyed(&key, &mut headers);
                let mut carrying = m.clone();
                carrying.client_id = client_id.clone();
                let expected_key = key.of(carrying.topic.as_bytes(), client_id.as_bytes());
                assert_eq!(
                    record,
                    carrying.to_record(Some(Bytes::copy_from_slice(expected_key)))
                );
                assert_eq!(Message::from_record(&record), Some(carrying));
            }
            assert_eq!(headers.arena.capacity(), 0, "sized for the batch up front");
        }
    }

    #[test]
    fn foreign_records_are_not_messages() {
        let record = Record {
            timestamp_ms: 0,
            key: None,
            value: Bytes::new(),
            headers: tern_log::Headers::new(),
        };
        assert_eq!(Message::from_record(&record), None);
    }
}
