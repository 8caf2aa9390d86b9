//! The `[log]` configuration section: segment geometry, durability policy, commit window,
//! retention and per-topic overrides, with defaults and a validation pass that names the key.
//!
//! Settings only: this module never opens files.

use serde::{Deserialize, Serialize};

use tern_core::{ByteSize, HumanDuration, InvalidConfig, invalid};

/// When an append's future resolves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Durability {
    /// After the group-committed fdatasync: nothing acknowledged is ever lost.
    #[default]
    Sync,
    /// After the write; fdatasync every `sync_interval`: a power cut loses at most that window.
    Periodic,
}

/// What a partition does when retention cannot make room.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OnFull {
    /// Refuse the append with `LogError::Full` (callers turn it into backpressure).
    #[default]
    Reject,
    /// Delete the oldest segments even if a cursor still needs them.
    DropOldest,
}

/// `[log.flush]`: the group-commit window of the `sync` policy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FlushConfig {
    /// While no fdatasync is running, a commit is written and synced once its first append
    /// has waited this long (0: at once); while one is running, the commit gathers until it
    /// returns. Bounds the fdatasync rate of a trickle of appends (see `writer.rs`). Capped at
    /// `max_delay`, so a short `max_delay` alone still means short commits.
    pub min_delay: HumanDuration,
    /// While no fdatasync is running, a commit holding this many bytes is written and synced
    /// at once, before `min_delay`: large enough that one fdatasync's fixed device writes are
    /// small beside it, so load gets short commits without a trickle getting many syncs.
    pub min_bytes: ByteSize,
    /// Longest an append waits for companions before the commit's write and fdatasync (the
    /// window also closes once `max_bytes` are waiting; see `writer.rs`).
    pub max_delay: HumanDuration,
    /// A commit starts early once this many bytes are waiting.
    pub max_bytes: ByteSize,
    /// The wear budget: the commit window a trickle gets (see `wear.rs`).
    pub wear: WearConfig,
}

/// `[log.flush.wear]`: the flash card's endurance and the lifetime wanted. The commit
/// controller measures the arrival rate and chooses the commit window of a trickle (in place
/// of `min_delay`) so that the projected device writes stay within
/// `card_size × write_cycles / lifetime`, and never longer than `max_ack_delay`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WearConfig {
    /// Off: `min_delay` alone decides the window of a trickle.
    pub enabled: bool,
    /// Size of the card (or eMMC) holding the data directory.
    pub card_size: ByteSize,
    /// Program/erase cycles each cell endures (consumer TLC microSD: about 1,000).
    pub write_cycles: u32,
    /// How long the card must last at the measured rate.
    pub lifetime: HumanDuration,
    /// Longest commit window the controller may choose: an acknowledgement waits at most this
    /// plus one fdatasync.
    pub max_ack_delay: HumanDuration,
    /// How much of the budget a closed-loop producer (one that sends its next append only once
    /// the last is answered) may spend at once: its commits get no window, and cost a page
    /// each, while this much of the budget's time is saved up. 0: such commits are windowed
    /// like a trickle's.
    pub closed_loop_burst: HumanDuration,
}

impl Default for WearConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            card_size: ByteSize(32_000_000_000),
            write_cycles: 1000,
            lifetime: HumanDuration(std::time::Duration::from_secs(20 * 31_557_600)),
            max_ack_delay: HumanDuration(std::time::Duration::from_millis(140)),
            closed_loop_burst: HumanDuration(std::time::Duration::from_secs(3600)),
        }
    }
}

impl Default for FlushConfig {
    fn default() -> Self {
        Self {
            min_delay: HumanDuration(std::time::Duration::from_millis(10)),
            min_bytes: ByteSize(16 << 10),
            max_delay: HumanDuration(std::time::Duration::from_millis(30)),
            max_bytes: ByteSize(1 << 20),
            wear: WearConfig::default(),
        }
    }
}

/// `[log.retention]`: when whole segments are deleted, oldest first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RetentionConfig {
    /// Largest size of one partition; 0 means no limit.
    pub bytes: ByteSize,
    /// Segments held this long since their newest record was written are deleted; 0 means no
    /// limit. Counted in elapsed running time, never by the wall clock (`clock.rs`).
    pub age: HumanDuration,
    pub on_full: OnFull,
}

impl Default for RetentionConfig {
    fn default() -> Self {
        Self {
            bytes: ByteSize(1 << 30),
            age: HumanDuration(std::time::Duration::from_secs(7 * 86_400)),
            on_full: OnFull::Reject,
        }
    }
}

/// `[[log.topic]]`: settings of one topic that differ from the `[log]` defaults.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TopicOverride {
    pub name: String,
    pub partitions: Option<u32>,
    pub durability: Option<Durability>,
    pub retention_bytes: Option<ByteSize>,
    pub retention_age: Option<HumanDuration>,
    pub on_full: Option<OnFull>,
}

/// The default `max_mapped_bytes`: no limit on a 64-bit build; on a 32-bit one (armv7, such
/// as a Raspberry Pi 3), whose whole user address space (3 GiB at most) also holds the heap,
/// thread stacks and libraries, 512 MiB (eight 64 MiB segments), where 64 open files of 64 MiB
/// segments would map 2 GiB.
pub const DEFAULT_MAX_MAPPED_BYTES: u64 = if cfg!(target_pointer_width = "32") {
    512 << 20
} else {
    0
};

/// The largest `max_mapped_bytes` a 32-bit build accepts: a quarter of its 4 GiB of address
/// space, so the maps fit beside everything else even on a kernel that leaves user space 2 GiB.
pub const MAX_MAPPED_BYTES_32BIT: u64 = 1 << 30;

/// The `[log]` section.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LogConfig {
    /// Partitions of a topic created without an override.
    pub partitions: u32,
    /// A segment is sealed and a new one started once it would grow past this size.
    pub segment_bytes: ByteSize,
    /// Bytes of batches between two sparse index entries.
    pub index_interval: ByteSize,
    pub durability: Durability,
    /// fdatasync cadence of the `periodic` policy (its loss window on a power cut).
    pub sync_interval: HumanDuration,
    /// Most sealed files (segments and indexes) kept open and mapped at once.
    pub max_open_files: usize,
    /// Most bytes of sealed files mapped at once (the address space reads take); 0: no limit
    /// but `max_open_files`, refused on a 32-bit build. Default [`DEFAULT_MAX_MAPPED_BYTES`].
    pub max_mapped_bytes: ByteSize,
    pub flush: FlushConfig,
    pub retention: RetentionConfig,
    /// Per-topic overrides.
    pub topic: Vec<TopicOverride>,
}

impl Default for LogConfig {
    fn default() -> Self {
        Self {
            partitions: 1,
            segment_bytes: ByteSize(64 << 20),
            index_interval: ByteSize(4096),
            durability: Durability::Sync,
            sync_interval: HumanDuration(std::time::Duration::from_secs(1)),
            max_open_files: 64,
            max_mapped_bytes: ByteSize(DEFAULT_MAX_MAPPED_BYTES),
            flush: FlushConfig::default(),
            retention: RetentionConfig::default(),
            topic: Vec::new(),
        }
    }
}

/// The effective settings of one topic.
#[derive(Debug, Clone, PartialEq)]
pub struct TopicSettings {
    pub partitions: u32,
    pub durability: Durability,
    pub retention_bytes: u64,
    pub retention_age_ms: u64,
    pub on_full: OnFull,
}

impl LogConfig {
    /// This configuration without its retention limits (`[log.retention]` and the retention
    /// fields of `[[log.topic]]`, dropping overrides left empty): what a live reload of
    /// retention ([`crate::Log::set_retention`]) cannot change.
    pub fn without_retention(&self) -> Self {
        let mut rest = self.clone();
        rest.retention = RetentionConfig::default();
        for o in &mut rest.topic {
            o.retention_bytes = None;
            o.retention_age = None;
            o.on_full = None;
        }
        rest.topic
            .retain(|o| o.partitions.is_some() || o.durability.is_some());
        rest
    }

    /// The settings that apply to `topic`.
    pub fn topic_settings(&self, topic: &str) -> TopicSettings {
        let o = self.topic.iter().find(|t| t.name == topic);
        let o = o.cloned().unwrap_or_default();
        TopicSettings {
            partitions: o.partitions.unwrap_or(self.partitions),
            durability: o.durability.unwrap_or(self.durability),
            retention_bytes: o.retention_bytes.unwrap_or(self.retention.bytes).0,
            retention_age_ms: u64::try_from(
                o.retention_age.unwrap_or(self.retention.age).0.as_millis(),
            )
            .unwrap_or(u64::MAX),
            on_full: o.on_full.unwrap_or(self.retention.on_full),
        }
    }

    /// Checks ranges and relations; the error names the dotted key.
    pub fn validate(&self) -> Result<(), InvalidConfig> {
        let bad = |key: &str, msg: &str| Err(invalid(&format!("log.{key}"), msg));
        if !(1..=10_000).contains(&self.partitions) {
            return bad("partitions", "must be between 1 and 10000");
        }
        if !(4096..=1 << 30).contains(&self.segment_bytes.0) {
            return bad("segment_bytes", "must be between 4KiB and 1GiB");
        }
        if self.index_interval.0 == 0 || self.index_interval.0 > self.segment_bytes.0 {
            return bad("index_interval", "must be between 1 byte and segment_bytes");
        }
        if self.flush.max_delay.0 > std::time::Duration::from_secs(10) {
            return bad("flush.max_delay", "must be at most 10s");
        }
        let wear = &self.flush.wear;
        if wear.enabled && (wear.card_size.0 == 0 || wear.write_cycles == 0) {
            return bad(
                "flush.wear",
                "card_size and write_cycles must be larger than zero (or enabled = false)",
            );
        }
        if wear.enabled && wear.lifetime.0.is_zero() {
            return bad("flush.wear.lifetime", "must be longer than zero");
        }
        if wear.max_ack_delay.0 > std::time::Duration::from_secs(10) {
            return bad("flush.wear.max_ack_delay", "must be at most 10s");
        }
        if self.flush.max_bytes.0 == 0 {
            return bad("flush.max_bytes", "must be larger than zero");
        }
        if self.sync_interval.0.is_zero() {
            return bad("sync_interval", "must be longer than zero");
        }
        let retention = self.retention.bytes.0;
        if retention != 0 && retention < self.segment_bytes.0 {
            return bad(
                "retention.bytes",
                "must be 0 (no limit) or at least segment_bytes",
            );
        }
        if self.max_open_files < 2 {
            return bad("max_open_files", "must be at least 2");
        }
        self.check_mapped_bytes(usize::BITS)?;
        for (i, t) in self.topic.iter().enumerate() {
            if let Err(reason) = super::validate_topic_name(&t.name) {
                return Err(invalid(&format!("log.topic[{i}].name"), reason));
            }
            if t.partitions.is_some_and(|p| !(1..=10_000).contains(&p)) {
                return Err(invalid(
                    &format!("log.topic[{i}].partitions"),
                    "must be between 1 and 10000",
                ));
            }
            if self.topic.iter().take(i).any(|o| o.name == t.name) {
                return Err(invalid(
                    &format!("log.topic[{i}].name"),
                    "topic listed twice",
                ));
            }
        }
        Ok(())
    }

    /// Checks `max_mapped_bytes` for a build whose pointers have `pointer_bits` bits: reads must
    /// be able to map two sealed segments (a reader crossing from one to the next), and a
    /// 32-bit build must have a limit that leaves it address space for everything else.
    fn check_mapped_bytes(&self, pointer_bits: u32) -> Result<(), InvalidConfig> {
        let budget = self.max_mapped_bytes.0;
        let key = "log.max_mapped_bytes";
        if pointer_bits <= 32 && !(1..=MAX_MAPPED_BYTES_32BIT).contains(&budget) {
            return Err(invalid(
                key,
                "must be between 1 byte and 1GiB on a 32-bit build (mapped sealed segments share its 4GiB of address space with everything else)",
            ));
        }
        if budget != 0 && budget < self.segment_bytes.0.saturating_mul(2) {
            return Err(invalid(
                key,
                format!(
                    "must be at least twice segment_bytes ({}): lower log.segment_bytes or raise this{}",
                    self.segment_bytes,
                    if pointer_bits <= 32 {
                        " (at most 1GiB on a 32-bit build)"
                    } else {
                        ""
                    }
                ),
            ));
        }
        Ok(())
    }

    /// Settings for tests and tools: small segments, no commit window.
    pub fn for_tests(segment_bytes: u64) -> Self {
        Self {
            segment_bytes: ByteSize(segment_bytes),
            index_interval: ByteSize(256),
            flush: FlushConfig {
                min_delay: HumanDuration(std::time::Duration::ZERO),
                min_bytes: ByteSize(0),
                max_delay: HumanDuration(std::time::Duration::ZERO),
                max_bytes: ByteSize(1 << 20),
                wear: WearConfig {
                    enabled: false,
                    ..WearConfig::default()
                },
            },
            retention: RetentionConfig {
                bytes: ByteSize(0),
                age: HumanDuration(std::time::Duration::ZERO),
                on_full: OnFull::Reject,
            },
            ..Self::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(segment_bytes: u64, max_mapped_bytes: u64) -> LogConfig {
        LogConfig {
            segment_bytes: ByteSize(segment_bytes),
            max_mapped_bytes: ByteSize(max_mapped_bytes),
            ..LogConfig::default()
        }
    }

    #[test]
    fn a_32_bit_build_refuses_maps_that_cannot_fit_its_address_space() {
        let refused = |c: LogConfig| c.check_mapped_bytes(32).expect_err("refused").to_string();
        // The defaults of a 64-bit build: 64 MiB segments, no byte limit.
        assert!(refused(with(64 << 20, 0)).contains("log.max_mapped_bytes"));
        assert!(refused(with(64 << 20, 2 << 30)).contains("1GiB on a 32-bit build"));
        let big_segments = refused(with(1 << 30, 1 << 30));
        assert!(
            big_segments.contains("lower log.segment_bytes"),
            "{big_segments}"
        );
        with(64 << 20, 512 << 20)
            .check_mapped_bytes(32)
            .expect("the 32-bit default fits");
        with(64 << 20, 0)
            .check_mapped_bytes(64)
            .expect("no limit on 64-bit");
    }

    #[test]
    fn the_default_fits_the_build() {
        LogConfig::default().validate().expect("defaults valid");
        let bytes = LogConfig::default().max_mapped_bytes.0;
        assert_eq!(bytes == 0, usize::BITS == 64, "{bytes}");
    }
}
