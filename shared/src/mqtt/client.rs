//! A blocking MQTT 3.1.1 client for one constrained device over any `embedded-io` byte stream.
//!
//! It owns the session state of one connection: packet identifiers, the receive buffer, the
//! keep-alive clock and the last command received. It publishes one QoS 1 message at a time and
//! waits for its PUBACK, resending with DUP set on timeout. It never allocates (fixed `heapless`
//! and array buffers), never blocks on a read without first asking `ReadReady`, and never keeps
//! a message once `publish` returned: remembering unacknowledged readings and replies is the
//! caller's job.

use embedded_io::{Read, ReadReady, Write};

use super::packet::{self, Connect, Credentials, Packet, Publish, QoS};

/// A monotonic millisecond clock (SysTick on the device, `Instant` on a host).
pub trait Clock {
    fn now_ms(&self) -> u64;
}

/// What a connection is configured with.
#[derive(Debug, Clone, Copy)]
pub struct ClientConfig<'a> {
    pub client_id: &'a str,
    /// Username and password sent in every CONNECT; `None` connects anonymously.
    pub credentials: Option<Credentials<'a>>,
    /// Keep alive announced in CONNECT; a PINGREQ goes out after half of it without traffic.
    pub keep_alive_s: u16,
    /// CONNECT's clean-session flag. A persistent session (`false`) keeps the subscription and
    /// the QoS 1 commands that arrive while the device is away on the server.
    pub clean_session: bool,
    /// How long to wait for CONNACK and the SUBACK that completes the session. A gateway checks
    /// the password (argon2, slow by design) and may still be starting, so this is longer than
    /// `ack_timeout_ms`.
    pub connect_timeout_ms: u32,
    /// How long to wait for PUBACK or PINGRESP before giving up or resending.
    pub ack_timeout_ms: u32,
    /// How often a QoS 1 PUBLISH is resent (with DUP) before `publish` fails.
    pub max_retries: u8,
}

/// What the client waits for after sending something.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Awaiting {
    ConnAck,
    PubAck { packet_id: u16 },
    SubAck { packet_id: u16 },
    PingResp,
}

/// Why a client operation failed; after any of them the caller should reconnect.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
pub enum ClientError<E: core::fmt::Debug> {
    /// The byte stream failed.
    #[error("transport error: {0:?}")]
    Transport(E),
    /// An outgoing packet did not fit the transmit buffer.
    #[error("cannot encode packet: {0}")]
    Encode(#[from] packet::EncodeError),
    /// The server sent bytes that are not a packet this client understands.
    #[error("cannot decode packet from server: {0}")]
    Decode(#[from] packet::DecodeError),
    /// The server announced a packet larger than the receive buffer.
    #[error("incoming packet larger than the {capacity}-byte receive buffer")]
    ReceiveBufferFull { capacity: usize },
    /// No answer arrived in time (after all retries, for a PUBLISH).
    #[error("timed out waiting for {awaiting:?}")]
    Timeout { awaiting: Awaiting },
    /// The server refused the connection with this CONNACK return code.
    #[error("connection refused with return code {code}")]
    Refused { code: u8 },
    /// The server refused the subscription.
    #[error("subscription to the command topic refused")]
    SubscriptionRefused,
    /// An operation that needs a session was called without one.
    #[error("not connected")]
    NotConnected,
}

/// A received command: the payload of the newest PUBLISH on a subscribed topic.
pub type Command<const N: usize> = heapless::Vec<u8, N>;

/// The client. `RX` and `TX` size the receive and transmit buffers; `CMD` the command slot.
#[derive(Debug)]
pub struct Client<'a, T, C, const RX: usize = 256, const TX: usize = 256, const CMD: usize = 64> {
    transport: T,
    clock: C,
    config: ClientConfig<'a>,
    rx: heapless::Vec<u8, RX>,
    tx: [u8; TX],
    next_packet_id: u16,
    last_sent_ms: u64,
    connected: bool,
    command: Option<Command<CMD>>,
}

/// A server packet reduced to what the client keeps once its bytes are gone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Incoming {
    ConnAck { code: u8 },
    PubAck { packet_id: u16 },
    SubAck { packet_id: u16, code: u8 },
    PingResp,
    Other,
}

type Result<T, E> = core::result::Result<T, ClientError<E>>;

impl<'a, T, C, const RX: usize, const TX: usize, const CMD: usize> Client<'a, T, C, RX, TX, CMD>
where
    T: Read + Write + ReadReady,
    C: Clock,
{
    pub fn new(transport: T, clock: C, config: ClientConfig<'a>) -> Self {
        Client {
            transport,
            clock,
            config,
            rx: heapless::Vec::new(),
            tx: [0; TX],
            next_packet_id: 1,
            last_sent_ms: 0,
            connected: false,
            command: None,
        }
    }

    /// Whether the last CONNECT was accepted and nothing has failed since.
    pub fn is_connected(&self) -> bool {
        self.connected
    }

    /// The clock the client measures timeouts with.
    pub fn clock(&self) -> &C {
        &self.clock
    }

    /// Gives the transport back (for tests and for tearing the device link down).
    pub fn into_transport(self) -> T {
        self.transport
    }

    /// Sends CONNECT (clean or persistent, as configured) and waits for CONNACK.
    pub fn connect(&mut self) -> Result<(), T::Error> {
        self.connected = false;
        self.rx.clear();
        let connect = Packet::Connect(Connect {
            client_id: self.config.client_id,
            keep_alive_s: self.config.keep_alive_s,
            clean_session: self.config.clean_session,
            credentials: self.config.credentials,
        });
        self.send(&connect)?;
        match self.wait_for(Awaiting::ConnAck)? {
            Incoming::ConnAck { code: 0 } => {
                self.connected = true;
                Ok(())
            }
            Incoming::ConnAck { code } => Err(ClientError::Refused { code }),
            _ => Err(ClientError::Timeout {
                awaiting: Awaiting::ConnAck,
            }),
        }
    }

    /// Subscribes to `filter` at QoS 1 and waits for SUBACK.
    pub fn subscribe(&mut self, filter: &str) -> Result<(), T::Error> {
        let packet_id = self.take_packet_id();
        self.connected_send(&Packet::Subscribe {
            packet_id,
            filter,
            qos: QoS::AtLeastOnce,
        })?;
        match self.wait_for(Awaiting::SubAck { packet_id })? {
            Incoming::SubAck { code, .. } if code <= 1 => Ok(()),
            _ => self.fail(ClientError::SubscriptionRefused),
        }
    }

    /// Publishes `payload`. At QoS 1, blocks until the PUBACK arrives, resending with DUP set
    /// after each `ack_timeout_ms`, at most `max_retries` times.
    pub fn publish(&mut self, topic: &str, payload: &[u8], qos: QoS) -> Result<(), T::Error> {
        let packet_id = match qos {
            QoS::AtMostOnce => None,
            QoS::AtLeastOnce => Some(self.take_packet_id()),
        };
        let mut publish = Publish {
            topic,
            payload,
            qos,
            packet_id,
            dup: false,
            retain: false,
        };
        self.connected_send(&Packet::Publish(publish))?;
        let Some(packet_id) = packet_id else {
            return Ok(());
        };
        let awaiting = Awaiting::PubAck { packet_id };
        for _ in 0..self.config.max_retries {
            match self.wait_once(awaiting) {
                Err(ClientError::Timeout { .. }) => {}
                other => return other.map(|_| ()),
            }
            publish.dup = true;
            self.connected_send(&Packet::Publish(publish))?;
        }
        self.wait_for(awaiting).map(|_| ())
    }

    /// Handles whatever the server sent (commands, stray acks) and keeps the connection alive:
    /// after half the keep alive without sending, a PINGREQ, and waits for its PINGRESP.
    pub fn poll(&mut self) -> Result<(), T::Error> {
        if !self.connected {
            return Err(ClientError::NotConnected);
        }
        loop {
            while self.next_incoming()?.is_some() {}
            if !self.read_available()? {
                break;
            }
        }
        let idle_ms = self.clock.now_ms().saturating_sub(self.last_sent_ms);
        let ping_after_ms = u64::from(self.config.keep_alive_s) * 500;
        if ping_after_ms > 0 && idle_ms >= ping_after_ms {
            self.connected_send(&Packet::PingReq)?;
            self.wait_for(Awaiting::PingResp)?;
        }
        Ok(())
    }

    /// The newest command received since the last call, if any.
    pub fn take_command(&mut self) -> Option<Command<CMD>> {
        self.command.take()
    }

    /// Sends DISCONNECT and forgets the session.
    pub fn disconnect(&mut self) -> Result<(), T::Error> {
        let sent = self.send(&Packet::Disconnect);
        self.connected = false;
        sent
    }

    fn take_packet_id(&mut self) -> u16 {
        let id = self.next_packet_id;
        self.next_packet_id = id.checked_add(1).unwrap_or(1);
        id
    }

    fn fail<V>(&mut self, error: ClientError<T::Error>) -> Result<V, T::Error> {
        self.connected = false;
        Err(error)
    }

    fn connected_send(&mut self, packet: &Packet<'_>) -> Result<(), T::Error> {
        if !self.connected {
            return Err(ClientError::NotConnected);
        }
        self.send(packet)
    }

    fn send(&mut self, packet: &Packet<'_>) -> Result<(), T::Error> {
        let len = packet.encode(&mut self.tx)?;
        let bytes = self.tx.get(..len).unwrap_or(&[]);
        let written = self
            .transport
            .write_all(bytes)
            .and_then(|()| self.transport.flush());
        if let Err(err) = written {
            return self.fail(ClientError::Transport(err));
        }
        self.last_sent_ms = self.clock.now_ms();
        Ok(())
    }

    /// Waits until `awaiting` arrives; a timeout ends the session.
    fn wait_for(&mut self, awaiting: Awaiting) -> Result<Incoming, T::Error> {
        let waited = self.wait_once(awaiting);
        if waited.is_err() {
            self.connected = false;
        }
        waited
    }

    /// Waits until `awaiting` arrives or its timeout (`connect_timeout_ms` for CONNACK and
    /// SUBACK, `ack_timeout_ms` otherwise) passes, handling other packets. A timeout leaves the session
    /// up, so a PUBLISH can be resent.
    fn wait_once(&mut self, awaiting: Awaiting) -> Result<Incoming, T::Error> {
        let timeout_ms = match awaiting {
            Awaiting::ConnAck | Awaiting::SubAck { .. } => self.config.connect_timeout_ms,
            _ => self.config.ack_timeout_ms,
        };
        let deadline = self.clock.now_ms() + u64::from(timeout_ms);
        loop {
            while let Some(incoming) = self.next_incoming()? {
                if answers(awaiting, incoming) {
                    return Ok(incoming);
                }
            }
            if self.clock.now_ms() >= deadline {
                return Err(ClientError::Timeout { awaiting });
            }
            self.read_available()?;
        }
    }

    /// Reads what the transport has ready without blocking; false if nothing was ready.
    fn read_available(&mut self) -> Result<bool, T::Error> {
        match self.transport.read_ready() {
            Ok(false) => return Ok(false),
            Ok(true) => {}
            Err(err) => return self.fail(ClientError::Transport(err)),
        }
        let mut chunk = [0u8; 32];
        let spare = RX - self.rx.len();
        if spare == 0 {
            return self.fail(ClientError::ReceiveBufferFull { capacity: RX });
        }
        let want = chunk.len().min(spare);
        let n = match self
            .transport
            .read(chunk.get_mut(..want).unwrap_or(&mut []))
        {
            Ok(n) => n,
            Err(err) => return self.fail(ClientError::Transport(err)),
        };
        // Cannot fail: `n <= want <= spare`.
        let _ = self.rx.extend_from_slice(chunk.get(..n).unwrap_or(&[]));
        Ok(n > 0)
    }

    /// Decodes and handles one buffered packet, if a whole one is there.
    fn next_incoming(&mut self) -> Result<Option<Incoming>, T::Error> {
        let (incoming, used) = match packet::decode(&self.rx) {
            Ok((packet, used)) => (react(packet, &mut self.command), used),
            Err(packet::DecodeError::Incomplete { needed }) => {
                if self.rx.len() + needed > RX {
                    return self.fail(ClientError::ReceiveBufferFull { capacity: RX });
                }
                return Ok(None);
            }
            Err(err) => return self.fail(ClientError::Decode(err)),
        };
        let (incoming, reply) = incoming;
        self.consume(used);
        if let Some(reply) = reply {
            self.send(&reply)?;
        }
        Ok(Some(incoming))
    }

    /// Drops the first `used` bytes of the receive buffer.
    fn consume(&mut self, used: usize) {
        let len = self.rx.len();
        self.rx.copy_within(used.min(len).., 0);
        self.rx.truncate(len - used.min(len));
    }
}

/// Turns a decoded packet into what the client keeps, plus any reply it owes; a PUBLISH from the
/// server is a command and lands in `command` (if it fits).
fn react<const CMD: usize>(
    packet: Packet<'_>,
    command: &mut Option<Command<CMD>>,
) -> (Incoming, Option<Packet<'static>>) {
    match packet {
        Packet::ConnAck { code, .. } => (Incoming::ConnAck { code }, None),
        Packet::PubAck { packet_id } => (Incoming::PubAck { packet_id }, None),
        Packet::SubAck { packet_id, code } => (Incoming::SubAck { packet_id, code }, None),
        Packet::PingResp => (Incoming::PingResp, None),
        Packet::Publish(publish) => {
            let mut received = Command::new();
            if received.extend_from_slice(publish.payload).is_ok() {
                *command = Some(received);
            }
            let reply = publish
                .packet_id
                .map(|packet_id| Packet::PubAck { packet_id });
            (Incoming::Other, reply)
        }
        _ => (Incoming::Other, None),
    }
}

fn answers(awaiting: Awaiting, incoming: Incoming) -> bool {
    match (awaiting, incoming) {
        (Awaiting::ConnAck, Incoming::ConnAck { .. }) => true,
        (Awaiting::PingResp, Incoming::PingResp) => true,
        (Awaiting::PubAck { packet_id: want }, Incoming::PubAck { packet_id }) => want == packet_id,
        (Awaiting::SubAck { packet_id: want }, Incoming::SubAck { packet_id, .. }) => {
            want == packet_id
        }
        _ => false,
    }
}

#[cfg(test)]
mod test;
