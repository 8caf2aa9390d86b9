//! The CONNECT/CONNACK handshake: the first packet within the connect timeout, protocol version
//! detection, connection and client-id limits, session takeover, clean start and session expiry,
//! keep alive, and the MQTT 5 CONNACK properties announcing tern's limits.

use std::collections::{BTreeMap, VecDeque};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadHalf, WriteHalf};
use tokio::sync::Notify;
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::super::admission::Slot;
use super::super::broker::Broker;
use super::super::clip::clip;
use super::super::codec::{
    self, ConnAckCode, ConnAckProperties, Connect, Incoming, Outgoing, Version,
};
use super::super::message;
use super::super::will::Will;
use super::{ConnError, Connection, InboundQuota, OutboundAliases, RateLimit, client_limits};
use tern_log::LogPort;

/// Longest client id accepted, in bytes: a session's cursors are named `mqtt:{id}` and
/// `mqtt-sent:{id}`, and tern-log's cursor names are at most 1,024 bytes.
pub(crate) const MAX_CLIENT_ID: usize = 1024 - "mqtt-sent:".len();

/// A refusal: the error and, when the client can understand one, the CONNACK to send.
pub(super) type Refusal = (ConnError, Option<(Version, ConnAckCode)>);

/// Reads and checks the CONNECT packet.
pub(super) async fn read_connect<S: LogPort, R: AsyncRead>(
    broker: &Broker<S>,
    reader: &mut ReadHalf<R>,
    inbuf: &mut BytesMut,
    peer: SocketAddr,
) -> Result<(Box<Connect>, Slot), Refusal> {
    let limit = broker.config.connect_timeout.0;
    let frame = tokio::time::timeout(limit, read_frame(broker, reader, inbuf))
        .await
        .map_err(|_| {
            let err = std::io::Error::new(std::io::ErrorKind::TimedOut, "no CONNECT in time");
            (ConnError::Io(err), None)
        })??;
    let version = codec::connect_version(&frame).map_err(|err| {
        let reply = matches!(err, codec::CodecError::UnsupportedVersion { .. })
            .then_some((Version::V4, ConnAckCode::UnsupportedProtocolVersion));
        (ConnError::Codec(err), reply)
    })?;
    let Incoming::Connect(connect) =
        codec::decode(version, &frame).map_err(|err| refusal(version, err))?
    else {
        return Err((protocol("first packet is not CONNECT"), None));
    };
    check_connect(version, &connect)?;
    let Some(slot) = broker.admission.reserve() else {
        tracing::warn!(%peer, "connection limit reached");
        return Err((
            protocol("connection limit reached"),
            Some((version, ConnAckCode::ServerBusy)),
        ));
    };
    if connect.client_id.is_empty() && version == Version::V4 && !connect.clean_start {
        let reply = Some((version, ConnAckCode::ClientIdentifierNotValid));
        return Err((protocol("empty client id needs clean session"), reply));
    }
    Ok((connect, slot))
}

/// A CONNECT that does not decode: MQTT 5 clients are told why (0x81 or 0x82), 3.1.1 clients
/// are closed without CONNACK, as their spec says.
fn refusal(version: Version, err: codec::CodecError) -> Refusal {
    let code = match &err {
        codec::CodecError::ProtocolViolation { .. } => ConnAckCode::ProtocolError,
        _ => ConnAckCode::MalformedPacket,
    };
    let reply = (version == Version::V5).then_some((version, code));
    (ConnError::Codec(err), reply)
}

/// What a decoded CONNECT may not ask for: enhanced authentication (MQTT 5 only, which tern
/// does not offer) and a client id longer than [`MAX_CLIENT_ID`].
fn check_connect(version: Version, connect: &Connect) -> Result<(), Refusal> {
    let properties = connect.properties.as_ref();
    if properties.is_some_and(|p| p.authentication_method.is_some()) {
        let reply = Some((version, ConnAckCode::BadAuthenticationMethod));
        return Err((protocol("enhanced authentication is not supported"), reply));
    }
    if connect.client_id.len() > MAX_CLIENT_ID {
        let reply = Some((version, ConnAckCode::ClientIdentifierNotValid));
        return Err((protocol("client id too long"), reply));
    }
    Ok(())
}

async fn read_frame<S: LogPort, R: AsyncRead>(
    broker: &Broker<S>,
    reader: &mut ReadHalf<R>,
    inbuf: &mut BytesMut,
) -> Result<BytesMut, Refusal> {
    let max = broker.config.max_packet_size.0 as usize;
    loop {
        if let Some(len) = codec::frame_len(inbuf, max).map_err(|e| (e.into(), None))? {
            return Ok(inbuf.split_to(len));
        }
        let read = reader.read_buf(inbuf).await.map_err(|e| (e.into(), None))?;
        if read == 0 {
            let eof = std::io::Error::from(std::io::ErrorKind::UnexpectedEof);
            return Err((eof.into(), None));
        }
    }
}

fn protocol(reason: &'static str) -> ConnError {
    ConnError::Protocol {
        reason,
        code: codec::DisconnectReason::ProtocolError,
    }
}

/// Takes over the session, answers CONNACK and returns the ready connection.
pub(super) async fn accept<S: LogPort, W: AsyncWrite + Send + 'static>(
    broker: Arc<Broker<S>>,
    writer: WriteHalf<W>,
    connect: Connect,
    id: u64,
) -> Result<Connection<S, W>, ConnError> {
    let assigned = connect
        .client_id
        .is_empty()
        .then(|| broker.assign_client_id(id));
    let client_id = assigned
        .clone()
        .unwrap_or_else(|| connect.client_id.clone());
    let will = Will::from_connect(&connect, &client_id, &broker.limits)?;
    let kick = Arc::new(Notify::new());
    let (entry, mut session, expired) = broker
        .take_session(&client_id, kick.clone())
        .await
        .map_err(|_| ConnError::Takeover {
            client_id: clip(&client_id).to_string(),
        })?;
    session.charge_to(broker.metrics.queued.clone());
    if connect.clean_start || expired {
        broker.forget_session(&mut session).await?;
    }
    let session_present = !connect.clean_start && session.present();
    let (expiry, expiry_changed) = session_expiry(&broker, &connect);
    session.expiry = expiry;
    if session.persistent() {
        broker
            .state
            .put_session(&client_id, Some(&session.to_stored()))
            .await?;
        session.stored = true;
    }
    let (keep_alive, server_keep_alive) = keep_alive(&broker, &connect);
    let (client_receive_max, client_max_packet) = client_limits(&connect);
    let properties = (connect.version == Version::V5).then(|| ConnAckProperties {
        session_expiry_interval: expiry_changed.then_some(expiry),
        receive_max: Some(broker.config.inflight),
        max_packet_size: u32::try_from(broker.config.max_packet_size.0).ok(),
        retain_available: Some(1),
        topic_alias_max: Some(broker.config.topic_alias_maximum),
        assigned_client_identifier: assigned,
        wildcard_subscription_available: Some(1),
        subscription_identifiers_available: Some(1),
        shared_subscription_available: Some(1),
        server_keep_alive,
        ..ConnAckProperties::default()
    });
    let mut conn = Connection {
        out: BytesMut::new(),
        version: connect.version,
        client_id: client_id.into(),
        user: connect.username.clone(),
        entry,
        session,
        kick,
        wake: Arc::new(Notify::new()),
        watchers: JoinSet::new(),
        watched: Default::default(),
        readahead: Default::default(),
        lease_due: Default::default(),
        keep_alive,
        last_packet: Instant::now(),
        received_ms: message::now_ms(),
        client_receive_max,
        client_max_packet,
        client_problem_info: connect
            .properties
            .as_ref()
            .and_then(|p| p.request_problem_info)
            != Some(0),
        will: will.map(Box::new),
        aliases: BTreeMap::new(),
        out_aliases: OutboundAliases::new(outbound_aliases(&broker, &connect)),
        inbound: InboundQuota::new(
            (connect.version == Version::V5).then_some(usize::from(broker.config.inflight)),
        ),
        pending: Vec::new(),
        appending: VecDeque::new(),
        turn: None,
        rate: RateLimit::new(broker.config.max_publish_rate),
        groups: Default::default(),
        retained_due: VecDeque::new(),
        outcomes: Vec::new(),
        retained_early: VecDeque::new(),
        saves: Default::default(),
        resend: VecDeque::new(),
        room: broker.metrics.queued.room(),
        writer,
        broker,
    };
    conn.send(Outgoing::ConnAck {
        session_present,
        code: ConnAckCode::Success,
        properties,
    })?;
    Ok(conn)
}

/// How many topic aliases tern may use for deliveries: the client's Topic Alias Maximum
/// (MQTT 5; absent means none), capped by `mqtt.outbound_topic_aliases`.
fn outbound_aliases<S: LogPort>(broker: &Broker<S>, connect: &Connect) -> u16 {
    let client = connect
        .properties
        .as_ref()
        .and_then(|p| p.topic_alias_max)
        .unwrap_or(0);
    match connect.version {
        Version::V4 => 0,
        Version::V5 => client.min(broker.config.outbound_topic_aliases),
    }
}

/// The granted session expiry and whether it differs from what the client asked.
fn session_expiry<S: LogPort>(broker: &Broker<S>, connect: &Connect) -> (u32, bool) {
    let max = u32::try_from(broker.config.max_session_expiry.0.as_secs()).unwrap_or(u32::MAX);
    match connect.version {
        Version::V4 if connect.clean_start => (0, false),
        Version::V4 => (max, false),
        Version::V5 => {
            let asked = connect
                .properties
                .as_ref()
                .and_then(|p| p.session_expiry_interval)
                .unwrap_or(0);
            let granted = asked.min(max);
            (granted, granted != asked)
        }
    }
}

/// How long the client may stay silent (1.5 times its keep alive; for a 3.1.1 client that
/// asked for none, `mqtt.idle_timeout`) and, for MQTT 5, the Server Keep Alive to announce.
fn keep_alive<S: LogPort>(
    broker: &Broker<S>,
    connect: &Connect,
) -> (Option<Duration>, Option<u16>) {
    let max = u16::try_from(broker.config.max_keep_alive.0.as_secs()).unwrap_or(u16::MAX);
    let asked = connect.keep_alive;
    match connect.version {
        Version::V4 if asked == 0 => (Some(broker.config.idle_timeout.0), None),
        Version::V4 => (Some(silence(asked)), None),
        Version::V5 if asked == 0 || asked > max => {
            (Some(silence(max)).filter(|_| max > 0), Some(max))
        }
        Version::V5 => (Some(silence(asked)), None),
    }
}

/// 1.5 times a keep alive of `value` seconds.
fn silence(value: u16) -> Duration {
    Duration::from_millis(u64::from(value) * 1500)
}
