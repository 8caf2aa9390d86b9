//! One client connection: framing with the packet size limit, the CONNECT handshake, keep alive
//! (1.5 × the client's value), client-id takeover, and the packet loop. Publishes are stored in
//! batches through `ingest.rs` (several in flight, kept in order: `connection/appends.rs`)
//! and acknowledged in the order they arrived, only after the log confirmed them; deliveries
//! come from the log through `delivery.rs`. Bad input ends only this connection, with a log
//! line; nothing here may panic.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadHalf, WriteHalf};
use tokio::sync::{Notify, OwnedMutexGuard};
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::Instant;

use super::admission::{Handshake, Slot};
use super::auth::Origin;
use super::broker::{Broker, SessionEntry};
use super::clip::clip;
use super::codec::{self, CodecError, Connect, DisconnectReason, Incoming, Outgoing, Version};
use super::error::ConnError;
use super::ingest::{Ingested, Pending, Turn};
use super::message::{self, ByteString};
use super::metrics::MqttMetrics;
use super::router::PartitionId;
use super::session::{Matched, Session};
use super::shared::{Delivery, Memberships};
use super::will::Will;
use inbuf::ReadBuffer;
use out_alias::OutboundAliases;
use quota::InboundQuota;
use rate::RateLimit;
use tern_core::shutdown::Shutdown;
use tern_log::{LogPort, StoredRecord};

/// How long a write to a client may take before the connection is given up.
const WRITE_TIMEOUT: Duration = Duration::from_secs(30);
/// The most output buffer a connection keeps once everything was written.
const OUT_KEPT: usize = 16 * 1024;
/// How long a closed connection still reads (and drops) what its client sends (`linger`).
const LINGER: Duration = Duration::from_secs(5);

mod appends;
mod authz;
mod delivery;
mod handshake;
mod inbuf;
mod lease;
mod out_alias;
mod packets;
mod quota;
mod rate;
mod resend;
mod retained;
mod saves;
mod share;
#[cfg(test)]
mod test;

/// What the packet loop does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Flow {
    Continue,
    /// The client sent DISCONNECT; `will` says whether its will is still published.
    Disconnect {
        will: bool,
    },
}

/// Serves one accepted socket, which came through a listener described by `origin`, until it
/// closes; `pending` is its place among the sockets that have not sent CONNECT yet.
pub async fn serve<S, IO>(
    broker: Arc<Broker<S>>,
    io: IO,
    peer: SocketAddr,
    (origin, pending): (Origin, Handshake),
    shutdown: Shutdown,
) where
    S: LogPort,
    IO: AsyncRead + AsyncWrite + Send + 'static,
{
    let (mut reader, writer) = tokio::io::split(io);
    // Grown by the reads as the client needs it (`inbuf.rs`); a CONNECT is small.
    let mut inbuf = BytesMut::new();
    // Every phase but the packet loop is boxed: a connection task is sized by its largest
    // state, and an idle connection should pay for the loop only (idle memory, issues #16 and
    // #29). The handshake's locals live in its own box and are gone once it returns.
    let opened = Box::pin(open(
        &broker,
        &mut reader,
        writer,
        &mut inbuf,
        peer,
        origin,
        pending,
    ));
    let Some((mut conn, _slot)) = opened.await else {
        return;
    };
    MqttMetrics::inc(&broker.metrics.connections);
    MqttMetrics::inc(&broker.metrics.connections_total);
    tracing::debug!(%peer, client_id = %clip(&conn.client_id), "MQTT client connected");
    let result = conn.run(&mut reader, inbuf, shutdown.clone()).await;
    Box::pin(conn.finish(result, peer)).await;
    MqttMetrics::dec(&broker.metrics.connections);
    // Still holding its connection slot: the socket is open until the linger ends.
    Box::pin(linger(&mut reader, shutdown)).await;
}

/// The connection's handshake: reads CONNECT (or gives the socket up to make room for others,
/// `pending`), authenticates it against `origin` and takes the session. `None` once the client
/// was refused (and told so where MQTT allows). Returns the connection and its slot among the
/// open connections, held until the socket closes.
async fn open<S, R, W>(
    broker: &Arc<Broker<S>>,
    reader: &mut ReadHalf<R>,
    writer: WriteHalf<W>,
    inbuf: &mut BytesMut,
    peer: SocketAddr,
    origin: Origin,
    pending: Handshake,
) -> Option<(Connection<S, W>, Slot)>
where
    S: LogPort,
    R: AsyncRead,
    W: AsyncWrite + Send + 'static,
{
    let read = tokio::select! {
        read = handshake::read_connect(broker, reader, inbuf, peer) => read,
        () = pending.evicted() => {
            tracing::debug!(%peer, "closing a socket that sent no CONNECT to make room");
            return None;
        }
    };
    drop(pending);
    let (connect, slot) = match read {
        Ok(read) => read,
        Err((err, reply)) => {
            refuse(broker, writer, reply, peer, &err).await;
            return None;
        }
    };
    let connect = match authz::authenticate(broker, connect, &origin).await {
        Ok(connect) => connect,
        Err((err, reply)) => {
            refuse(broker, writer, reply, peer, &err).await;
            return None;
        }
    };
    let id = broker.connection_id();
    match handshake::accept(broker.clone(), writer, *connect, id).await {
        Ok(conn) => Some((conn, slot)),
        Err(err) => {
            tracing::warn!(%peer, %err, "MQTT connection refused");
            MqttMetrics::inc(&broker.metrics.connections_refused);
            None
        }
    }
}

/// Once tern's side is closed (its FIN went out after any DISCONNECT), reads and drops what the
/// client still sends until it closes too, for at most [`LINGER`] and never past shutdown.
/// Closing a socket with input unread, or receiving input after closing it, makes the kernel
/// reset the connection, and a reset can destroy what tern sent last before the client read
/// it: a client answering the PUBRECs that preceded a DISCONNECT 0x93 (Receive Maximum
/// exceeded) with PUBRELs, as MQTT requires, hit "Broken pipe" and never read the DISCONNECT
/// (issue 24). Nothing is sent any more (MQTT-3.14.4-1); the close is only deferred.
async fn linger<R: AsyncRead>(reader: &mut ReadHalf<R>, mut shutdown: Shutdown) {
    let mut sink = vec![0; 4096];
    let drain = async {
        while let Ok(read) = reader.read(&mut sink).await {
            if read == 0 {
                break;
            }
        }
    };
    tokio::select! {
        () = drain => {}
        () = tokio::time::sleep(LINGER) => {}
        () = shutdown.wait() => {}
    }
}

async fn refuse<S: LogPort, W: AsyncWrite>(
    broker: &Broker<S>,
    mut writer: WriteHalf<W>,
    reply: Option<(Version, codec::ConnAckCode)>,
    peer: SocketAddr,
    err: &ConnError,
) {
    MqttMetrics::inc(&broker.metrics.connections_refused);
    tracing::info!(%peer, %err, "MQTT connection refused before CONNACK");
    if let Some((version, code)) = reply {
        let mut out = BytesMut::new();
        let packet = Outgoing::ConnAck {
            session_present: false,
            code,
            properties: None,
        };
        if codec::encode(version, packet, &mut out).is_ok() {
            let _ = writer.write_all(&out).await;
            let _ = writer.shutdown().await;
        }
    }
}

/// A connected client.
pub struct Connection<S: LogPort, W> {
    broker: Arc<Broker<S>>,
    writer: WriteHalf<W>,
    out: BytesMut,
    version: Version,
    /// Shared by every message of this connection (no copy per message).
    client_id: ByteString,
    /// The authenticated username (`None`: anonymous), for ACL checks.
    user: Option<String>,
    entry: Arc<SessionEntry>,
    session: OwnedMutexGuard<Session>,
    kick: Arc<Notify>,
    wake: Arc<Notify>,
    watchers: JoinSet<()>,
    watched: HashSet<PartitionId>,
    /// Records read from the log but not yet delivered, per partition.
    readahead: HashMap<PartitionId, VecDeque<StoredRecord>>,
    /// Partitions whose next record (at the offset given) waits for a "sent up to" lease
    /// (`lease.rs`).
    lease_due: BTreeMap<PartitionId, u64>,
    /// How long the client may stay silent before it is closed.
    keep_alive: Option<Duration>,
    last_packet: Instant,
    /// When the frames being handled were read: every publish of one read gets this receive
    /// time (one clock read per read, not per message: issue #29).
    received_ms: i64,
    /// The client's Receive Maximum for our QoS 1 deliveries.
    client_receive_max: usize,
    /// The client's Maximum Packet Size.
    client_max_packet: usize,
    /// MQTT 5 Request Problem Information: whether a SUBACK may carry a Reason String.
    client_problem_info: bool,
    /// Boxed: most clients have none, and every idle connection would carry its room.
    will: Option<Box<Will>>,
    /// MQTT 5 topic aliases the client set up for its publishes.
    /// A B-tree: empty, it is half a hash map's size and, like it, allocates nothing.
    aliases: BTreeMap<u16, ByteString>,
    /// MQTT 5 topic aliases tern sets up for its deliveries.
    out_aliases: OutboundAliases,
    /// The client's QoS 1/2 publishes not yet finally acknowledged (MQTT 5 Receive Maximum).
    inbound: InboundQuota,
    pending: Vec<Pending>,
    /// Batches being stored, oldest first; acks go out in this order.
    appending: VecDeque<JoinHandle<Ingested>>,
    /// The newest batch's turn: the next batch queues and settles after it.
    turn: Option<Turn>,
    rate: RateLimit,
    /// The shared groups this connection is a member of.
    groups: Memberships,
    /// Retained messages still to send for new subscriptions: the filter, how it matched,
    /// and the last topic sent (`retained.rs`).
    retained_due: VecDeque<(String, Matched, Option<String>)>,
    /// Retained messages sent before they were stored, whose records are not delivered again
    /// (`retained.rs`).
    retained_early: VecDeque<super::message::Message>,
    /// Packet ids of resumed deliveries not re-sent yet (`resend.rs`).
    resend: VecDeque<u16>,
    /// Changes when the process-wide queued bytes fall below their cap (`queued.rs`).
    room: tokio::sync::watch::Receiver<u64>,
    /// Subscription changes of a persistent session on their way to `__mqtt_state`.
    saves: saves::SubscriptionSaves,
    /// Outcomes of the datacenter's commands still to report (`outcome.rs`).
    outcomes: Vec<super::outcome::Due>,
}

impl<S: LogPort, W> std::fmt::Debug for Connection<S, W> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("client_id", &self.client_id)
            .field("version", &self.version)
            .finish_non_exhaustive()
    }
}

enum Event {
    Read(std::io::Result<usize>),
    Stored(Result<Ingested, tokio::task::JoinError>),
    Saved(saves::SaveResult),
    Wake,
    /// Room below `mqtt.max_queued_bytes_total` for a connection that waited for it.
    Room,
    Shared(String, Delivery),
    Kicked,
    KeepAliveExpired,
    Throttled,
    /// The timer fired before the deadline it stands for, which a read moved later: it is set
    /// for that deadline on the next turn.
    Postponed,
    Shutdown,
    Tick,
}

impl<S: LogPort, W: AsyncWrite + Send + 'static> Connection<S, W> {
    async fn run<R: AsyncRead>(
        &mut self,
        reader: &mut ReadHalf<R>,
        inbuf: BytesMut,
        mut shutdown: Shutdown,
    ) -> Result<Flow, ConnError> {
        let mut inbuf = ReadBuffer::new(inbuf);
        let mut room = 0;
        // Only a persistent session has cursors to commit: other connections never wake for it.
        let mut tick = self
            .session
            .persistent()
            .then(|| tokio::time::interval(Duration::from_secs(1)));
        Box::pin(self.resume()).await?;
        Box::pin(self.join_groups()).await;
        // The futures of the loop's rare events live across its turns: built anew on every
        // turn, each registered itself (a timer in the wheel, a waiter on a lock-guarded list)
        // and took itself off again, several times per read (issue #29).
        let stop = shutdown.wait();
        tokio::pin!(stop);
        let wake = Arc::clone(&self.wake);
        let woken = wake.notified();
        tokio::pin!(woken);
        // While tern itself stops reading (rate limit), the client's pings wait unread: one
        // timer serves both, the end of the throttle or else the keep-alive deadline (one timer
        // in every idle connection's task, not two). It is set for the earliest deadline due
        // and set again only when a deadline comes earlier or it fires before the deadline
        // it stands for (a read moves the keep-alive deadline later): not once per read.
        let alarm = tokio::time::sleep_until(Instant::now());
        tokio::pin!(alarm);
        let mut armed: Option<Instant> = None;
        loop {
            self.flush().await?;
            let throttled = self.rate.resume_at();
            let due = match throttled {
                Some(until) => Some(until),
                None => self.keep_alive.map(|k| self.last_packet + k),
            };
            if let Some(due) = due {
                if armed.is_none_or(|at| due < at) {
                    alarm.as_mut().reset(due);
                    armed = Some(due);
                }
            }
            let can_read = throttled.is_none()
                && self.pending.len() < usize::from(self.broker.config.inflight) * 2;
            if can_read {
                inbuf.reserve();
                room = inbuf.room();
            }
            self.room.borrow_and_update();
            let capped = self.capped();
            let event = tokio::select! {
                read = reader.read_buf(&mut inbuf.bytes), if can_read => Event::Read(read),
                stored = appends::join_oldest(&mut self.appending) => Event::Stored(stored),
                saved = self.saves.saved() => Event::Saved(saved),
                () = &mut woken => Event::Wake,
                // An error: the sender is gone (the process ends); delivering goes on.
                _ = self.room.changed(), if capped => Event::Room,
                (filter, delivery) = self.groups.recv(), if !self.window_full() => {
                    Event::Shared(filter, delivery)
                }
                () = self.kick.notified() => Event::Kicked,
                () = &mut alarm, if armed.is_some() => match (armed.take(), due) {
                    // The deadline it was set for is still the one due: it passed.
                    (Some(fired), Some(due)) if due <= fired => match throttled {
                        Some(_) => Event::Throttled,
                        None => Event::KeepAliveExpired,
                    },
                    _ => Event::Postponed,
                },
                () = &mut stop => Event::Shutdown,
                () = next_tick(&mut tick) => Event::Tick,
            };
            match event {
                Event::Read(read) => {
                    let read = read?;
                    if read == 0 {
                        return Err(std::io::Error::from(std::io::ErrorKind::UnexpectedEof).into());
                    }
                    inbuf.read(read, room);
                    // Boxed: the frames' handling is the largest future here, and inline it
                    // would size every idle connection's task (1,000 idle clients: 1 MiB, issue
                    // #29); one allocation per read, not per message.
                    let flow = Box::pin(self.process(&mut inbuf.bytes)).await?;
                    if let Flow::Disconnect { will } = flow {
                        return Ok(Flow::Disconnect { will });
                    }
                    inbuf.settle();
                }
                Event::Stored(done) => self.stored(done)?,
                Event::Saved(saved) => Box::pin(self.saved(saved)).await?,
                // Boxed: delivering is the run loop's largest future (idle memory, issue #29).
                Event::Wake => {
                    woken.set(wake.notified());
                    Box::pin(self.deliver_more()).await?;
                }
                Event::Room => Box::pin(self.deliver_more()).await?,
                Event::Shared(filter, delivery) => {
                    Box::pin(self.deliver_shared(filter, delivery)).await?;
                }
                Event::Kicked => {
                    Box::pin(self.disconnect(DisconnectReason::SessionTakenOver)).await;
                    return Ok(Flow::Disconnect { will: true });
                }
                Event::KeepAliveExpired => {
                    MqttMetrics::inc(&self.broker.metrics.keep_alive_timeouts);
                    Box::pin(self.disconnect(DisconnectReason::KeepAliveTimeout)).await;
                    return Err(ConnError::Protocol {
                        reason: "keep alive expired",
                        code: DisconnectReason::KeepAliveTimeout,
                    });
                }
                Event::Shutdown => {
                    Box::pin(self.drain_appends()).await?;
                    Box::pin(self.disconnect(DisconnectReason::ServerShuttingDown)).await;
                    return Ok(Flow::Disconnect { will: false });
                }
                Event::Tick => Box::pin(self.commit_cursors()).await?,
                Event::Throttled => self.last_packet = Instant::now(),
                Event::Postponed => {}
            }
        }
    }

    /// Decodes and handles every complete frame in `inbuf`.
    async fn process(&mut self, inbuf: &mut BytesMut) -> Result<Flow, ConnError> {
        let mut publishes = 0;
        let flow = self.process_frames(inbuf, &mut publishes).await;
        // One shared counter update per read, not per message.
        MqttMetrics::add(&self.broker.metrics.publishes_in, publishes);
        if let Ok(Flow::Continue) = flow {
            self.start_append();
        }
        flow
    }

    /// Handles the frames of [`Connection::process`], counting PUBLISH packets in `publishes`.
    async fn process_frames(
        &mut self,
        inbuf: &mut BytesMut,
        publishes: &mut u64,
    ) -> Result<Flow, ConnError> {
        let max = self.broker.config.max_packet_size.0 as usize;
        let mut next = codec::frame_len(inbuf, max)?;
        if next.is_some() {
            self.last_packet = Instant::now();
            self.received_ms = message::now_ms();
        }
        while let Some(len) = next {
            let frame = inbuf.split_to(len);
            // A PUBLISH is queued without waiting on anything: handled here, without building
            // `handle`'s future for it (the per-publish instruction count, issue #29).
            match codec::decode_frame(self.version, frame)? {
                codec::Incoming::Publish(publish) => {
                    *publishes += 1;
                    self.publish(publish)?;
                }
                packet => {
                    let flow = self.handle(packet).await?;
                    if flow != Flow::Continue {
                        return Ok(flow);
                    }
                }
            }
            next = codec::frame_len(inbuf, max)?;
        }
        Ok(Flow::Continue)
    }

    /// Writes everything queued in `out`. A client that stops reading cannot stall a takeover
    /// (the kick interrupts the write) nor hold its session forever (the write times out).
    async fn flush(&mut self) -> Result<(), ConnError> {
        if self.out.is_empty() {
            return Ok(());
        }
        tokio::select! {
            // The write first: it nearly always completes at once, and the other two are then
            // never polled, so never registered (issue #29).
            biased;
            written = self.writer.write_all(&self.out) => written?,
            () = self.kick.notified() => {
                self.kick.notify_one();
                return Err(ConnError::Protocol {
                    reason: "taken over while the client was not reading",
                    code: DisconnectReason::SessionTakenOver,
                });
            }
            () = tokio::time::sleep(WRITE_TIMEOUT) => {
                let err = std::io::Error::new(std::io::ErrorKind::TimedOut, "client stopped reading");
                return Err(err.into());
            }
        }
        if self.out.capacity() > OUT_KEPT {
            // A burst is over: an idle connection does not keep its high-water mark.
            self.out = BytesMut::new();
        } else {
            self.out.clear();
        }
        Ok(())
    }

    fn send(&mut self, packet: Outgoing) -> Result<(), ConnError> {
        codec::encode(self.version, packet, &mut self.out)?;
        Ok(())
    }

    /// Sends DISCONNECT with `reason` (MQTT 5 only) and flushes, ignoring socket errors.
    async fn disconnect(&mut self, reason: DisconnectReason) {
        if self.version == Version::V5 && self.send(Outgoing::Disconnect { reason }).is_ok() {
            let _ = self.flush().await;
        }
    }

    /// Cleans up after the packet loop: cursors, will, non-persistent state, takeover slot.
    async fn finish(mut self, result: Result<Flow, ConnError>, peer: SocketAddr) {
        // Publishes queued before the end are still settled, and their acks precede any
        // DISCONNECT (nothing may follow it on the wire).
        if let Err(err) = self.drain_appends().await {
            tracing::debug!(client_id = %clip(&self.client_id), %err, "unsettled publishes at close");
            self.join_leftovers().await;
        }
        let publish_will = match &result {
            Ok(Flow::Disconnect { will }) => *will,
            Ok(Flow::Continue) => false,
            Err(err) => {
                self.log_end(err, peer).await;
                true
            }
        };
        self.watchers.abort_all();
        self.leave_groups().await;
        if let Err(err) = self.commit_cursors().await {
            tracing::warn!(client_id = %clip(&self.client_id), %err, "cannot save session cursors");
        }
        if let Some(will) = self.will.take().filter(|_| publish_will) {
            super::will::schedule(
                self.broker.clone(),
                self.entry.clone(),
                *will,
                self.session.expiry,
            )
            .await;
        }
        if !self.session.persistent() {
            if let Err(err) = self.broker.forget_session(&mut self.session).await {
                tracing::warn!(client_id = %clip(&self.client_id), %err, "cannot remove session");
            }
        }
        self.entry.release(&self.kick);
        let _ = self.writer.shutdown().await;
    }

    async fn log_end(&mut self, err: &ConnError, peer: SocketAddr) {
        match err {
            ConnError::Io(_) => {
                tracing::debug!(%peer, client_id = %clip(&self.client_id), %err, "MQTT connection lost");
            }
            ConnError::Codec(codec_err) => {
                MqttMetrics::inc(&self.broker.metrics.malformed_packets);
                tracing::warn!(%peer, client_id = %clip(&self.client_id), %err, "closing MQTT connection");
                let reason = match codec_err {
                    CodecError::TooLarge { .. } => DisconnectReason::PacketTooLarge,
                    CodecError::Protocol { .. } | CodecError::ProtocolViolation { .. } => {
                        DisconnectReason::ProtocolError
                    }
                    _ => DisconnectReason::MalformedPacket,
                };
                self.disconnect(reason).await;
            }
            ConnError::Protocol { code, .. } => {
                tracing::warn!(%peer, client_id = %clip(&self.client_id), %err, "closing MQTT connection");
                let code = *code;
                if code != DisconnectReason::KeepAliveTimeout {
                    self.disconnect(code).await;
                }
            }
            ConnError::Log(_)
            | ConnError::State(_)
            | ConnError::Ingest(_)
            | ConnError::Task(_)
            | ConnError::Takeover { .. } => {
                tracing::error!(%peer, client_id = %clip(&self.client_id), %err, "closing MQTT connection");
                self.disconnect(DisconnectReason::UnspecifiedError).await;
            }
        }
    }
}

/// The next tick of the cursor-commit interval; never, for a connection without one.
async fn next_tick(tick: &mut Option<tokio::time::Interval>) {
    match tick {
        Some(tick) => {
            tick.tick().await;
        }
        None => std::future::pending().await,
    }
}

/// Builds the `Connect`-derived limits; shared by the handshake.
fn client_limits(connect: &Connect) -> (usize, usize) {
    let properties = connect.properties.as_ref();
    let receive_max = properties
        .and_then(|p| p.receive_maximum)
        .filter(|r| *r > 0)
        .map_or(usize::from(u16::MAX), usize::from);
    let max_packet = properties
        .and_then(|p| p.max_packet_size)
        .filter(|m| *m > 0)
        .map_or(usize::MAX, |m| m as usize);
    (receive_max, max_packet)
}
