//! The sensor node's behaviour: sample every period into the backlog, publish the backlog oldest
//! first at QoS 1 to `sensors/{device_id}/reading`, and reconnect with exponential backoff when
//! the broker stops answering. Commands arrive on `sensors/{device_id}/command` in a persistent
//! session (`tern_shared::command`): `period <ms> <tag>` sets the sampling period once per tag and
//! replies `applied <tag> period <ms>` to `sensors/{device_id}/reply`; `halt` ends the run.
//!
//! It owns the policy, not the mechanics: MQTT framing is in `tern_shared::mqtt`, the backlog
//! and the simulated sensor in `tern_shared::device`. It must never forget a reading or a reply
//! before its PUBACK arrived, except by the backlog's counted drop-oldest when it is full (the
//! broker acknowledged the command before the node applied it, so a reply lost with the
//! connection would never be asked for again).

use heapless::String;
use tern_shared::command::{self, DeviceCommand, REPLY_LEN, Tag};
use tern_shared::device::{Backlog, simulate};
use tern_shared::mqtt::{self, Client, ClientConfig, Credentials, QoS};
use tern_shared::{READING_MAX_ENCODED_LEN, Reading};

use crate::board::Uart;
use crate::clock::Millis;

/// Readings kept while the broker is away: 64 of 32 bytes, about 13 s at 200 ms per sample.
pub const BACKLOG: usize = 64;
const FIRST_BACKOFF_MS: u32 = 250;
const MAX_BACKOFF_MS: u32 = 4_000;
/// How long a CONNECT waits for its CONNACK. The gateway verifies the password with argon2
/// (tens of ms on a Pi, 1.5 to 2.2 s on an emulated gateway under load) and is often still
/// starting after a reboot; a shorter wait abandons logins that would have succeeded, and each
/// abandoned CONNECT costs the gateway a whole verification for nothing. A longer one (10 s was
/// tried) leaves a CONNECT lost by a reconnecting link unanswered too long (firmware suite).
const CONNECT_TIMEOUT_MS: u32 = 3_000;
const TOPIC_LEN: usize = 40;

/// Why `Node::run` returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// The broker sent `halt` on the command topic.
    Halted,
    /// A topic name did not fit its buffer (a device id cannot make it that long).
    TopicTooLong,
}

/// One sensor node.
#[derive(Debug)]
pub struct Node<'a> {
    /// The command slot holds the longest command, `period <ms> <tag>` (46 bytes).
    client: Client<'a, Uart, Millis, 128, 128, 48>,
    device_id: u32,
    period_ms: u32,
    backlog: Backlog<BACKLOG>,
    next_sample_ms: u64,
    next_connect_ms: u64,
    backoff_ms: u32,
    /// The tag of the last `period` command applied: a redelivery of it is not applied again.
    applied: Option<Tag>,
    /// The reply to the last command applied until the broker acknowledged it, resent on every
    /// connection until then.
    reply: Option<Reply>,
}

/// A reply waiting for its PUBACK.
type Reply = String<REPLY_LEN>;

impl<'a> Node<'a> {
    pub fn new(
        link: Uart,
        clock: Millis,
        identity: &'a Identity,
        device_id: u32,
        period_ms: u32,
    ) -> Self {
        Node {
            client: Client::new(link, clock, identity.client_config()),
            device_id,
            period_ms,
            backlog: Backlog::new(),
            next_sample_ms: clock.now_ms(),
            next_connect_ms: 0,
            backoff_ms: FIRST_BACKOFF_MS,
            applied: None,
            reply: None,
        }
    }

    /// Runs until a `halt` command arrives.
    pub fn run(&mut self) -> Stop {
        let (Some(reading_topic), Some(command_topic), Some(reply_topic)) = (
            mqtt::reading_topic::<TOPIC_LEN>(self.device_id),
            mqtt::command_topic::<TOPIC_LEN>(self.device_id),
            mqtt::reply_topic::<TOPIC_LEN>(self.device_id),
        ) else {
            return Stop::TopicTooLong;
        };
        loop {
            self.sample_due();
            if !self.client.is_connected() {
                self.try_connect(&command_topic);
            }
            self.send_reply(&reply_topic);
            self.drain(&reading_topic);
            if self.serve_commands(&reply_topic) {
                return Stop::Halted;
            }
            self.clock().sleep_until(self.wake_at());
        }
    }

    fn clock(&self) -> Millis {
        *self.client.clock()
    }

    /// Takes every sample that is due (several, if publishing kept the node busy past a period).
    fn sample_due(&mut self) {
        let now = self.clock().now_ms();
        while self.next_sample_ms <= now {
            let sequence = self.backlog.next_sequence();
            let values = simulate(self.device_id, sequence);
            // Stamped with the scheduled instant, so late samples keep their period spacing.
            let reading = self
                .backlog
                .record(self.device_id, self.next_sample_ms, values);
            if reading.dropped > 0 && self.backlog.len() == BACKLOG {
                warn!(
                    "backlog full: {=u32} readings dropped so far",
                    reading.dropped
                );
            }
            self.next_sample_ms += u64::from(self.period_ms);
        }
    }

    fn try_connect(&mut self, command_topic: &str) {
        let now = self.clock().now_ms();
        if now < self.next_connect_ms {
            return;
        }
        let connected = self
            .client
            .connect()
            .and_then(|()| self.client.subscribe(command_topic));
        match connected {
            Ok(()) => {
                info!(
                    "connected to broker, {=usize} readings waiting",
                    self.backlog.len()
                );
                self.backoff_ms = FIRST_BACKOFF_MS;
            }
            Err(err) => {
                warn!(
                    "connect failed ({}); retry in {=u32} ms",
                    err, self.backoff_ms
                );
                self.next_connect_ms = now + u64::from(self.backoff_ms);
                self.backoff_ms = (self.backoff_ms * 2).min(MAX_BACKOFF_MS);
            }
        }
    }

    /// Publishes the backlog oldest first; stops at the first failure (the client is then
    /// disconnected and the reading stays for the next connection).
    fn drain(&mut self, topic: &str) {
        while self.client.is_connected() {
            let Some(reading) = self.backlog.oldest().copied() else {
                return;
            };
            match self.publish(topic, &reading) {
                Ok(()) => {
                    self.backlog.acknowledge_oldest();
                    info!(
                        "reading {=u32} acknowledged (dropped {=u32})",
                        reading.sequence, reading.dropped
                    );
                }
                Err(err) => {
                    warn!("reading {=u32} not acknowledged: {}", reading.sequence, err);
                    self.reconnect_later();
                    return;
                }
            }
            self.sample_due();
        }
    }

    /// The connection failed: the next attempt waits for the backoff.
    fn reconnect_later(&mut self) {
        self.next_connect_ms = self.clock().now_ms() + u64::from(self.backoff_ms);
    }

    fn publish(
        &mut self,
        topic: &str,
        reading: &Reading,
    ) -> Result<(), mqtt::ClientError<crate::uart::UartError>> {
        let mut buf = [0u8; READING_MAX_ENCODED_LEN];
        // A READING_MAX_ENCODED_LEN buffer always holds a reading.
        let payload = reading.encode(&mut buf).map_or(&[][..], |p| &*p);
        self.client.publish(topic, payload, QoS::AtLeastOnce)
    }

    /// Keeps the connection alive and handles commands; true when `halt` arrived.
    fn serve_commands(&mut self, reply_topic: &str) -> bool {
        if !self.client.is_connected() {
            return false;
        }
        if let Err(err) = self.client.poll() {
            warn!("connection lost: {}", err);
            return false;
        }
        let Some(payload) = self.client.take_command() else {
            return false;
        };
        match DeviceCommand::parse(&payload) {
            Ok(DeviceCommand::Halt) => {
                info!("halting on command");
                // Best effort: the broker may already be gone.
                let _ = self.client.disconnect();
                true
            }
            Ok(DeviceCommand::SetPeriod { period_ms, tag }) => {
                self.set_period(period_ms, tag, reply_topic);
                false
            }
            Err(err) => {
                warn!("command of {=usize} bytes ignored: {}", payload.len(), err);
                false
            }
        }
    }

    /// Applies a `period` command unless its tag was the last one applied (a redelivery), and
    /// replies either way (the first reply may have been lost with the connection); the reply
    /// replaces one still unacknowledged (the newer command's answer is the one that counts).
    fn set_period(&mut self, period_ms: u32, tag: Tag, reply_topic: &str) {
        if self.applied.as_ref() == Some(&tag) {
            info!("command {=str} already applied", tag.as_str());
        } else {
            self.period_ms = period_ms;
            self.next_sample_ms = self.clock().now_ms() + u64::from(period_ms);
            info!(
                "command {=str} applied: period {=u32} ms",
                tag.as_str(),
                period_ms
            );
        }
        self.reply = command::reply(&tag, period_ms);
        self.applied = Some(tag);
        self.send_reply(reply_topic);
    }

    /// Publishes the unacknowledged reply, if any, and forgets it once its PUBACK arrived; on
    /// failure it stays for the next connection.
    fn send_reply(&mut self, reply_topic: &str) {
        if !self.client.is_connected() {
            return;
        }
        let Some(reply) = &self.reply else {
            return;
        };
        match self
            .client
            .publish(reply_topic, reply.as_bytes(), QoS::AtLeastOnce)
        {
            Ok(()) => {
                info!("reply acknowledged: {=str}", reply.as_str());
                self.reply = None;
            }
            Err(err) => {
                warn!(
                    "reply not acknowledged, kept for the next connection: {}",
                    err
                );
                self.reconnect_later();
            }
        }
    }

    /// When to wake: the next sample, or the next connection attempt if that comes first.
    fn wake_at(&self) -> u64 {
        if self.client.is_connected() {
            self.next_sample_ms
        } else {
            self.next_sample_ms.min(self.next_connect_ms)
        }
    }
}

/// Who the node is to the broker: client id `tern-{device_id}`, and with a password, username
/// `{device_id}` (the segment of its topics, so `sensors/%u/#` ACLs match). Its Debug output
/// hides the password.
pub struct Identity {
    client_id: String<16>,
    username: String<10>,
    password: Option<&'static str>,
}

impl core::fmt::Debug for Identity {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Identity")
            .field("client_id", &self.client_id)
            .field("username", &self.username)
            .field("password", &self.password.map(|_| "<redacted>"))
            .finish()
    }
}

impl Identity {
    pub fn new(device_id: u32, password: Option<&'static str>) -> Option<Self> {
        let mut client_id = String::new();
        core::fmt::write(&mut client_id, format_args!("tern-{device_id}")).ok()?;
        let mut username = String::new();
        core::fmt::write(&mut username, format_args!("{device_id}")).ok()?;
        Some(Identity {
            client_id,
            username,
            password,
        })
    }

    /// The client id, login and connection timing handed to the MQTT client.
    fn client_config(&self) -> ClientConfig<'_> {
        ClientConfig {
            client_id: &self.client_id,
            credentials: self.password.map(|password| Credentials {
                username: &self.username,
                password: password.as_bytes(),
            }),
            keep_alive_s: 30,
            // Commands that arrive while the gateway reboots or the link is down wait there.
            clean_session: false,
            connect_timeout_ms: CONNECT_TIMEOUT_MS,
            ack_timeout_ms: 500,
            max_retries: 2,
        }
    }
}
