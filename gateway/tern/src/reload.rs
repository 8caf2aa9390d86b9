//! SIGHUP: reads the configuration again (same file, same command-line overrides) and applies
//! what can change live: `[[route]]` and `[[mqtt.acl]]` (through the broker's reload handle;
//! connections stay up), `[logging] level`, retention (`[log.retention]` and the retention
//! fields of `[[log.topic]]`, taken by every partition's next retention check), and
//! `[[upstream]]` (its forwarders are restarted with the new settings). Everything else is
//! logged as not applied: it needs a restart.
//!
//! A configuration that fails to load or validate changes nothing.

use std::path::PathBuf;

use crate::config::{self, Config, Overrides};
use tern_core::logging::LevelHandle;

/// Where the configuration came from, to read it again.
#[derive(Debug, Clone)]
pub struct Source {
    pub path: Option<PathBuf>,
    pub overrides: Overrides,
    pub level: LevelHandle,
}

impl Source {
    /// The configuration as it is now on disk, secrets read; its deprecated keys are reported
    /// (WARN).
    pub fn load(&self) -> Result<Config, config::ConfigError> {
        let (mut config, deprecated) = config::load(self.path.as_deref(), &self.overrides)?;
        for key in &deprecated {
            tracing::warn!("{key}");
        }
        config.resolve_secrets()?;
        Ok(config)
    }
}

/// What a reload changed and what it left alone.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Outcome {
    pub applied: Vec<&'static str>,
    pub not_applied: Vec<String>,
    /// The upstream settings changed: the caller restarts the forwarders.
    pub restart_upstream: bool,
    /// Retention limits changed: the caller hands the new `[log]` to the log.
    pub retention: bool,
}

/// Compares the running configuration with the new one: what needs a restart, what the caller
/// applies (log level here; MQTT and upstream by the caller, which holds them).
pub fn plan(old: &Config, new: &Config, level: &LevelHandle) -> Outcome {
    let mut outcome = Outcome::default();
    let restart = |name: &str| format!("{name} changed: needs a restart to apply");
    let sections: [(&str, bool); 8] = [
        ("data_dir", old.data_dir != new.data_dir),
        ("[kafka_listener]", old.kafka_listener != new.kafka_listener),
        ("[admin]", old.admin != new.admin),
        ("[shutdown]", old.shutdown != new.shutdown),
        (
            "[log] (segments, flush, durability, partitions)",
            old.log.without_retention() != new.log.without_retention(),
        ),
        ("[health]", old.health != new.health),
        ("[status]", old.status != new.status),
        ("[cursors]", old.cursors != new.cursors),
    ];
    for (name, changed) in sections {
        if changed {
            outcome.not_applied.push(restart(name));
        }
    }
    if old.logging != new.logging {
        match level.set(new.logging.level.as_str()) {
            Ok(()) => outcome.applied.push("[logging] level"),
            Err(why) => outcome.not_applied.push(format!("[logging] level: {why}")),
        }
    }
    if old.route != new.route || old.mqtt.acl != new.mqtt.acl {
        outcome.applied.push("[[route]] and [[mqtt.acl]]");
    }
    if old.log.retention != new.log.retention
        || old
            .log
            .topic
            .iter()
            .map(retention_of)
            .ne(new.log.topic.iter().map(retention_of))
    {
        outcome.retention = true;
        outcome
            .applied
            .push("[log.retention] and per-topic retention");
    }
    if old.upstream != new.upstream {
        outcome.restart_upstream = true;
        outcome.applied.push("[[upstream]] (forwarders restarted)");
    }
    outcome
}

/// The retention part of a `[[log.topic]]` override.
fn retention_of(
    o: &tern_log::TopicOverride,
) -> (
    &str,
    Option<tern_core::ByteSize>,
    Option<tern_core::HumanDuration>,
    Option<tern_log::OnFull>,
) {
    (&o.name, o.retention_bytes, o.retention_age, o.on_full)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reload_sorts_live_changes_from_those_needing_a_restart() {
        let level = tern_core::logging::init("info");
        let old = Config::default();
        let mut new = old.clone();
        new.log.retention.age = tern_core::HumanDuration(std::time::Duration::from_secs(60));
        new.upstream = vec![tern_upstream::UpstreamConfig::default()];
        new.mqtt.acl.clear();
        let outcome = plan(&old, &new, &level);
        assert!(outcome.restart_upstream);
        assert!(outcome.retention, "{outcome:?}");
        assert!(outcome.not_applied.is_empty(), "{outcome:?}");
        new.log.segment_bytes = tern_core::ByteSize(1 << 20);
        let outcome = plan(&old, &new, &level);
        assert_eq!(outcome.not_applied.len(), 1, "{outcome:?}");
        assert!(outcome.not_applied[0].contains("[log]"), "{outcome:?}");
        assert_eq!(plan(&old, &old, &level), Outcome::default());
    }
}
