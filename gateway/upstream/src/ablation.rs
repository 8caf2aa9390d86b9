//! What `tern-bench upstream` switches off to print what it costs. Never a setting: it is not
//! part of `UpstreamConfig`, so no `tern.toml` can ask for it (an `[[upstream]]` key of that
//! name is an unknown field), and `tern serve` always forwards with [`Ablation::NONE`]. Only
//! [`run_ablated`](crate::run_ablated) takes one.

/// The safeguards a benchmark run turns off; [`Ablation::NONE`] (the default) turns off none.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Ablation {
    /// Mirror mode's producer sends its batches with producer id −1 and no sequence numbers,
    /// otherwise the same way: a batch resent while a leader still held it is stored twice.
    pub without_idempotence: bool,
    /// Shared mode produces plain batches and commits the group offset with a plain
    /// OffsetCommit after them, as before transactions: a failure between the two sends the
    /// batch again (at least once).
    pub without_transactions: bool,
    /// The downstream commits the command group's offset before its append is durable and
    /// resumes from that offset alone (no position records read back): a crash between the
    /// two skips the commands of that fetch. The negative control of the downstream's tests.
    pub commit_before_append: bool,
    /// Live first's copies go into the forwarded topic itself instead of `{topic}.live`, as a
    /// naive "send the new records first" would: the forwarded topic gets records out of edge
    /// order and twice, and its catch-up resumes after the last copy, skipping the backlog's
    /// rest. The negative control of the thin-link bench's checks.
    pub live_into_forwarded_topic: bool,
}

impl Ablation {
    /// The product: every safeguard on.
    pub const NONE: Self = Self {
        without_idempotence: false,
        without_transactions: false,
        commit_before_append: false,
        live_into_forwarded_topic: false,
    };
}
