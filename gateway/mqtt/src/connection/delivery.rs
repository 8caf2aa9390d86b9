//! Delivery of log records to a subscriber: every partition its filters may match gets a read
//! position and a watcher on the log's durable end offset (woken, never polling); records are
//! read ahead once, matched against the session's filters by their MQTT-topic header, checked
//! against the ACL (`authz.rs`) and sent at QoS 0, 1 or 2 within the in-flight window, with a
//! topic alias when the client allows them (`out_alias.rs`) and DUP when a restart may have
//! hidden an earlier send (`lease.rs`); persistent sessions commit their cursors (the oldest
//! unacknowledged offset) durably. Never acknowledges publishes and never writes records.

use std::collections::BTreeMap;

use bytes::Bytes;
use tokio::io::AsyncWrite;

use super::super::broker::cursor_name;
use super::super::clip::clip;
use super::super::codec::{OutPublish, Outgoing, PublishProperties, QoS};
use super::super::message::{self, Message};
use super::super::metrics::MqttMetrics;
use super::super::outcome::{self, Due, Kind};
use super::super::router::PartitionId;
use super::super::session::{Inflight, Matched};
use super::super::topic::is_shared;
use super::out_alias::AliasUse;
use super::{ConnError, Connection};
use tern_log::{LogError, LogPort, StoredRecord};

/// Bytes read ahead from the log per partition; what the window cannot take yet waits in the
/// connection's read-ahead buffer instead of being read again.
const READ_BYTES: usize = 32 * 1024;
/// Outgoing bytes buffered before the socket must take them.
pub(super) const OUT_HIGH_WATER: usize = 64 * 1024;

/// The log record a delivery carries, and who tracks its acknowledgement.
#[derive(Debug, Clone)]
pub(super) enum Origin {
    /// Not a log record (a retained message sent on subscribe).
    Nowhere,
    /// A record the session reads itself: its in-flight window and cursors track it.
    Session((PartitionId, u64)),
    /// A record a shared group handed over: the group tracks it (`share.rs`).
    Group((PartitionId, u64)),
}

impl Origin {
    fn record(&self) -> Option<(PartitionId, u64)> {
        match self {
            Self::Nowhere => None,
            Self::Session(source) | Self::Group(source) => Some(source.clone()),
        }
    }
}

impl<S: LogPort, W: AsyncWrite + Send + 'static> Connection<S, W> {
    /// Gives every partition the (non-shared) `filters` just subscribed may read a position and
    /// a watcher; a partition without one starts at `starts` (a `tern-start`), else at the log
    /// end. Only the new filters are looked at: a SUBSCRIBE costs the same however many
    /// subscriptions the session holds.
    pub(super) async fn track_partitions(
        &mut self,
        filters: &[String],
        starts: &BTreeMap<PartitionId, u64>,
    ) -> Result<(), ConnError> {
        let wanted = filters
            .iter()
            .filter(|f| !is_shared(f))
            .flat_map(|f| self.broker.partitions_for(f))
            .collect();
        self.track(wanted, false, starts).await
    }

    /// Whether the session already reads `partition` or has a stored cursor there (which a
    /// new subscription continues from, whatever `tern-start` it names).
    pub(super) fn has_position(&self, partition: &PartitionId) -> bool {
        self.session.positions.contains_key(partition)
            || (self.session.stored
                && self
                    .broker
                    .log
                    .cursor(&cursor_name(&self.client_id), &partition.0, partition.1)
                    .is_some())
    }

    /// [`Self::track_partitions`]; `resumed` when the subscriptions are a stored session's,
    /// restored at CONNECT: each of their partitions had a cursor (it is committed before the
    /// subscription is stored), so a missing one was lost (a damaged cursor log) and delivery
    /// starts at the earliest retained record, redelivering rather than skipping.
    pub(super) async fn track_partitions_of(
        &mut self,
        resumed: bool,
        starts: &BTreeMap<PartitionId, u64>,
    ) -> Result<(), ConnError> {
        let wanted: Vec<PartitionId> = self
            .session
            .subscriptions
            .iter()
            .filter(|s| !is_shared(&s.filter))
            .flat_map(|s| self.broker.partitions_for(&s.filter))
            .collect();
        self.track(wanted, resumed, starts).await
    }

    /// [`Self::track_partitions_of`] for the partitions `wanted`.
    async fn track(
        &mut self,
        wanted: Vec<PartitionId>,
        resumed: bool,
        starts: &BTreeMap<PartitionId, u64>,
    ) -> Result<(), ConnError> {
        let name = cursor_name(&self.client_id);
        for partition in wanted {
            if !self.session.positions.contains_key(&partition) {
                self.load_lease(&partition);
                let (topic, p) = (&partition.0, partition.1);
                let saved = self
                    .broker
                    .log
                    .cursor(&name, topic, p)
                    .filter(|_| self.session.stored);
                let start = match saved {
                    Some(offset) => offset,
                    None if resumed && self.session.persistent() => {
                        let start = self.broker.log.offsets(topic, p)?.0;
                        tracing::warn!(client_id = %self.client_id, topic, partition = p, start, "the session's cursor is missing (lost with a damaged cursor log?): redelivering from the earliest retained record");
                        self.broker
                            .log
                            .commit_cursor(&name, topic, p, start)
                            .await?;
                        start
                    }
                    None => {
                        let start = match starts.get(&partition) {
                            Some(start) => *start,
                            None => self.broker.log.offsets(topic, p)?.1,
                        };
                        if self.session.persistent() {
                            self.broker
                                .log
                                .commit_cursor(&name, topic, p, start)
                                .await?;
                        }
                        start
                    }
                };
                self.session.positions.insert(partition.clone(), start);
            }
            if self.watched.insert(partition.clone()) {
                let mut end = self.broker.log.subscribe(&partition.0, partition.1)?;
                let wake = self.wake.clone();
                self.watchers.spawn(async move {
                    while end.changed().await.is_ok() {
                        wake.notify_one();
                    }
                });
            }
        }
        Ok(())
    }

    /// Whether the session takes no new delivery now: its in-flight window is full
    /// ([`Self::window_full_here`]) or the process-wide queued bytes are at
    /// `mqtt.max_queued_bytes_total` and the session holds its floor or more ([`Self::capped`]).
    pub(super) fn window_full(&self) -> bool {
        self.window_full_here() || self.capped()
    }

    /// Whether the in-flight window (min(`mqtt.inflight`, the client's Receive Maximum)) is
    /// full: deliveries sent on this connection, or released QoS 2 ones, not yet acknowledged
    /// (those still to be re-sent after a reconnect, `resend.rs`, are not on the wire), or
    /// their bytes reached `mqtt.max_queued_bytes`.
    pub(super) fn window_full_here(&self) -> bool {
        let window = usize::from(self.broker.config.inflight).min(self.client_receive_max);
        let held = self
            .session
            .inflight
            .len()
            .saturating_sub(self.resend.len());
        held >= window
            || self.session.inflight_bytes() >= self.broker.config.max_queued_bytes.0 as usize
    }

    /// Whether new deliveries wait for room under `mqtt.max_queued_bytes_total` (`queued.rs`).
    pub(super) fn capped(&self) -> bool {
        !self
            .broker
            .metrics
            .queued
            .admits(self.session.inflight_bytes())
    }

    /// Delivers what the log holds beyond each position, as far as the window allows.
    pub(super) fn pump(&mut self) -> Result<(), ConnError> {
        let partitions: Vec<PartitionId> = self.session.positions.keys().cloned().collect();
        let mut progressed = true;
        while progressed {
            progressed = false;
            for partition in &partitions {
                if self.out.len() >= OUT_HIGH_WATER {
                    self.wake.notify_one();
                    return Ok(());
                }
                if self.window_full() {
                    return Ok(());
                }
                progressed |= self.pump_partition(partition)?;
            }
        }
        Ok(())
    }

    /// One read step of one partition; true if the position moved.
    pub(super) fn pump_partition(&mut self, partition: &PartitionId) -> Result<bool, ConnError> {
        let Some(&next) = self.session.positions.get(partition) else {
            return Ok(false);
        };
        let mut buffer = self.readahead.remove(partition).unwrap_or_default();
        if buffer.front().is_some_and(|r| r.offset != next) {
            buffer.clear();
        }
        if buffer.is_empty() {
            match self
                .broker
                .log
                .read(&partition.0, partition.1, next, READ_BYTES)
            {
                Ok(records) => {
                    if let Some(first) = records
                        .first()
                        .map(|r| r.offset)
                        .filter(|first| *first > next)
                    {
                        self.skip_lost(partition, next, first);
                    }
                    buffer.extend(records);
                }
                Err(LogError::OffsetOutOfRange { start, .. }) if start > next => {
                    tracing::warn!(client_id = %clip(&self.client_id), ?partition, next, start, "records expired before delivery");
                    self.session.positions.insert(partition.clone(), start);
                    return Ok(true);
                }
                Err(err) => return Err(err.into()),
            }
        }
        let mut moved = false;
        while !self.window_full() && self.out.len() < OUT_HIGH_WATER {
            let Some(stored) = buffer.pop_front() else {
                break;
            };
            if !self.session.lease_covers(partition, stored.offset) {
                self.lease_due.insert(partition.clone(), stored.offset);
                buffer.push_front(stored);
                break;
            }
            self.session
                .positions
                .insert(partition.clone(), stored.offset + 1);
            if self.session.persistent() {
                self.session.dirty.insert(partition.clone());
            }
            moved = true;
            self.deliver_record(partition, stored)?;
        }
        if !buffer.is_empty() {
            self.readahead.insert(partition.clone(), buffer);
        }
        Ok(moved)
    }

    /// The log lost `next..first` to damage (it reads on past a damaged batch): counts them,
    /// says so, and moves the position past them instead of asking for them again.
    fn skip_lost(&mut self, partition: &PartitionId, next: u64, first: u64) {
        let lost = first - next;
        MqttMetrics::add(&self.broker.metrics.records_lost, lost);
        tracing::warn!(client_id = %self.client_id, ?partition, from = next, to = first, lost, "records lost to log damage skipped");
        self.session.positions.insert(partition.clone(), first);
        if self.session.persistent() {
            self.session.dirty.insert(partition.clone());
        }
    }

    pub(super) fn deliver_record(
        &mut self,
        partition: &PartitionId,
        stored: StoredRecord,
    ) -> Result<(), ConnError> {
        if self.session.is_released_record(partition, stored.offset) {
            return Ok(());
        }
        let Some(message) = Message::from_record(&stored.record) else {
            return Ok(());
        };
        if message.retain && !self.retained_early.is_empty() && self.was_sent_early(&message) {
            return Ok(());
        }
        let own = message.client_id == self.client_id;
        let Some(matched) = self.session.matching(&message.topic, own) else {
            return Ok(());
        };
        let source = Some((partition.clone(), stored.offset));
        self.deliver(message, &matched, source)
    }

    /// Sends one message at min(its QoS, granted QoS), with the retain flag only when a
    /// matching subscription asked for Retain As Published (retained messages sent on
    /// subscribe always carry it), the matching subscriptions' identifiers, and DUP when the
    /// record may have been sent before a restart.
    pub(super) fn deliver(
        &mut self,
        message: Message,
        matched: &Matched,
        source: Option<(PartitionId, u64)>,
    ) -> Result<(), ConnError> {
        let from = source.map_or(Origin::Nowhere, Origin::Session);
        self.deliver_tracked(message, matched, from, false)
            .map(drop)
    }

    /// `deliver` of a record `from` the session's own reading or a shared group, with the DUP
    /// flag given; returns the packet id when the message is now in flight at QoS 1 (awaiting
    /// the client's PUBACK).
    pub(super) fn deliver_tracked(
        &mut self,
        message: Message,
        matched: &Matched,
        from: Origin,
        dup: bool,
    ) -> Result<Option<u16>, ConnError> {
        let granted = matched.qos;
        let retain = message.retain && matched.retain_as_published;
        let now = message::now_ms();
        // The datacenter's command this delivery carries, if it is one (its outcome is
        // reported, its send noted for the no-subscriber watcher).
        let command = from.record().filter(|source| self.is_command(source));
        if message.expired(now) {
            self.note_outcome(command, Kind::Expired, message.qos);
            return Ok(None);
        }
        if !self.may_receive(&message.topic) {
            return Ok(None);
        }
        let qos = if (message.qos as u8) < (granted as u8) {
            message.qos
        } else {
            granted
        };
        let remaining = message.remaining_expiry(now);
        let properties = match (message.properties.clone(), matched.ids.is_empty()) {
            (None, true) => None,
            (properties, _) => Some(PublishProperties {
                message_expiry_interval: remaining,
                subscription_identifiers: matched.ids.clone(),
                ..properties.map(|p| *p).unwrap_or_default()
            }),
        };
        let size = message.topic.len() + message.payload.len() + 16;
        if size > self.client_max_packet {
            return Ok(None);
        }
        // Only the session's own records: it alone knows what it may have sent before.
        let session_source = match &from {
            Origin::Session(source) => Some(source.clone()),
            Origin::Nowhere | Origin::Group(_) => None,
        };
        let dup = qos != QoS::AtMostOnce
            && (dup
                || session_source
                    .as_ref()
                    .is_some_and(|(p, offset)| self.session.maybe_sent(p, *offset)));
        let mut publish = OutPublish {
            topic: message.topic.into_bytes(),
            payload: message.payload,
            qos,
            pkid: 0,
            dup,
            retain,
            properties,
        };
        if qos != QoS::AtMostOnce {
            let Some(pkid) = self.session.next_pkid() else {
                return Ok(None);
            };
            publish.pkid = pkid;
            let inflight = Inflight {
                // Reported when acknowledged; a group's record is acknowledged to its group.
                source: session_source,
                publish: publish.clone(),
                size,
                released: false,
            };
            self.session.add_inflight(pkid, inflight);
        }
        let tracked = (qos == QoS::AtLeastOnce).then_some(publish.pkid);
        MqttMetrics::inc(&self.broker.metrics.publishes_out);
        self.send_publish(publish)?;
        if let (Some(command), Some(_)) = (&command, remaining) {
            self.broker.unclaimed.sent(command);
        }
        if qos == QoS::AtMostOnce {
            self.note_outcome(command, Kind::Delivered, qos);
        }
        Ok(tracked)
    }

    /// Notes an outcome to report if `source` is a record of a command log topic.
    pub(super) fn note_outcome(
        &mut self,
        source: Option<(PartitionId, u64)>,
        kind: Kind,
        qos: QoS,
    ) {
        if let Some(source) = source.filter(|source| self.is_command(source)) {
            self.outcomes.push(Due { source, kind, qos });
        }
    }

    /// Whether `source` is a record of a command log topic.
    fn is_command(&self, (partition, _): &(PartitionId, u64)) -> bool {
        self.broker.config.command_log_topics.contains(&partition.0)
    }

    /// Reports the outcomes noted since the last call (`outcome.rs`).
    pub(super) async fn report_outcomes(&mut self) {
        if self.outcomes.is_empty() {
            return;
        }
        let due = std::mem::take(&mut self.outcomes);
        outcome::report(&self.broker.log, due, &self.client_id, message::now_ms()).await;
    }

    /// Sends a delivery, replacing its topic by an alias when the client allows them.
    fn send_publish(&mut self, mut publish: OutPublish) -> Result<(), ConnError> {
        let alias = match self.out_aliases.alias_for(&publish.topic) {
            None => None,
            Some(AliasUse::Assign(alias)) => Some(alias),
            Some(AliasUse::Reuse(alias)) => {
                publish.topic = Bytes::new();
                Some(alias)
            }
        };
        if let Some(alias) = alias {
            let properties = publish.properties.get_or_insert_with(Default::default);
            properties.topic_alias = Some(alias);
        }
        self.send(Outgoing::Publish(Box::new(publish)))
    }

    /// Durably stores the cursors that moved (persistent sessions only).
    pub(super) async fn commit_cursors(&mut self) -> Result<(), ConnError> {
        let dirty = std::mem::take(&mut self.session.dirty);
        if !self.session.persistent() {
            return Ok(());
        }
        let name = cursor_name(&self.client_id);
        for partition in dirty {
            let Some(offset) = self.session.cursor(&partition) else {
                continue;
            };
            let log = &self.broker.log;
            if log.cursor(&name, &partition.0, partition.1) != Some(offset) {
                let committed = log
                    .commit_cursor(&name, &partition.0, partition.1, offset)
                    .await;
                match committed {
                    Ok(()) => {}
                    // A full disk: the position stays in RAM and is committed at a later tick.
                    Err(err) if err.is_backpressure() => {
                        tracing::warn!(client_id = %self.client_id, %err, "cursor not saved: log full");
                        self.session.dirty.insert(partition);
                    }
                    Err(err) => return Err(err.into()),
                }
            }
        }
        Ok(())
    }
}
