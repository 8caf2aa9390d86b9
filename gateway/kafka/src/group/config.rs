//! `[kafka_listener.groups]`: the consumer-group coordinator's limits, Kafka's broker settings
//! of the same meaning with the same defaults. Describes settings only.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::coordinator::Limits;
use tern_core::{HumanDuration, InvalidConfig, invalid};

/// `[kafka_listener.groups]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GroupsConfig {
    /// Shortest session timeout a member may ask for (`group.min.session.timeout.ms`).
    pub min_session_timeout: HumanDuration,
    /// Longest session timeout a member may ask for (`group.max.session.timeout.ms`).
    pub max_session_timeout: HumanDuration,
    /// How long the first join of an empty group waits for more members before it assigns
    /// (`group.initial.rebalance.delay.ms`); each new member extends it, up to the rebalance
    /// timeout. `0s` assigns at once.
    pub initial_rebalance_delay: HumanDuration,
}

impl Default for GroupsConfig {
    fn default() -> Self {
        let limits = Limits::default();
        Self {
            min_session_timeout: HumanDuration(limits.min_session),
            max_session_timeout: HumanDuration(limits.max_session),
            initial_rebalance_delay: HumanDuration(limits.initial_delay),
        }
    }
}

impl GroupsConfig {
    /// Checks the settings; the error names the key.
    pub fn validate(&self) -> Result<(), InvalidConfig> {
        if self.min_session_timeout.0 > self.max_session_timeout.0 {
            return Err(invalid(
                "kafka_listener.groups.min_session_timeout",
                "must not be longer than max_session_timeout",
            ));
        }
        if self.initial_rebalance_delay.0 > Duration::from_secs(300) {
            return Err(invalid(
                "kafka_listener.groups.initial_rebalance_delay",
                "must be at most 5min",
            ));
        }
        Ok(())
    }

    pub fn limits(&self) -> Limits {
        Limits {
            min_session: self.min_session_timeout.0,
            max_session: self.max_session_timeout.0,
            initial_delay: self.initial_rebalance_delay.0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_kafkas_and_the_limits_are_checked() {
        let config = GroupsConfig::default();
        assert!(config.validate().is_ok());
        assert_eq!(config.limits().initial_delay, Duration::from_secs(3));
        let parsed: GroupsConfig =
            toml::from_str("min_session_timeout = \"1m\"\nmax_session_timeout = \"30s\"")
                .expect("parses");
        let err = parsed.validate().expect_err("min above max");
        assert!(
            err.to_string().contains("groups.min_session_timeout"),
            "{err}"
        );
    }
}
