//! `[mqtt.auth]` and `[[mqtt.acl]]` settings: where the password file is, when anonymous
//! clients are let in, and the topic access rules. Describes settings and validates them (naming
//! the offending key); never opens the password file or a socket.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

pub use tern_auth::{Access, AclConfig, Anonymous};
use tern_core::{InvalidConfig, invalid};

use super::super::topic::{self, TopicLimits};

/// `[mqtt.auth]`: who may connect.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AuthConfig {
    /// File of `user:$argon2id$...` lines written by `tern passwd`. None = no passwords: a
    /// username alone proves nothing and its client counts as anonymous.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub password_file: Option<PathBuf>,
    /// Whether clients without verified credentials may connect.
    pub allow_anonymous: Anonymous,
}

impl AuthConfig {
    /// Checks the ACL rules' topic filters (with `%u`/`%c` still in place).
    pub fn validate(&self, acl: &[AclConfig], limits: &TopicLimits) -> Result<(), InvalidConfig> {
        if self
            .password_file
            .as_ref()
            .is_some_and(|p| p.as_os_str().is_empty())
        {
            return Err(invalid("mqtt.auth.password_file", "must not be empty"));
        }
        for (i, rule) in acl.iter().enumerate() {
            topic::validate_filter(&rule.topic, limits)
                .map_err(|err| invalid(&format!("mqtt.acl[{i}].topic"), err.to_string()))?;
            let empty = |v: &Option<String>| v.as_ref().is_some_and(String::is_empty);
            if empty(&rule.user) {
                return Err(invalid(&format!("mqtt.acl[{i}].user"), "must not be empty"));
            }
            if empty(&rule.client_id) {
                return Err(invalid(
                    &format!("mqtt.acl[{i}].client_id"),
                    "must not be empty",
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Deserialize)]
    struct Wrapper {
        auth: AuthConfig,
        #[serde(default)]
        acl: Vec<AclConfig>,
    }

    fn parse(text: &str) -> Result<Wrapper, toml::de::Error> {
        toml::from_str(text)
    }

    #[test]
    fn allow_anonymous_takes_a_flag_or_loopback() {
        let cases = [
            ("true", Anonymous::Always),
            ("false", Anonymous::Never),
            ("\"loopback\"", Anonymous::Loopback),
            ("\"always\"", Anonymous::Always),
            ("\"never\"", Anonymous::Never),
        ];
        for (text, expected) in cases {
            let parsed = parse(&format!("[auth]\nallow_anonymous = {text}\n")).expect("parses");
            assert_eq!(parsed.auth.allow_anonymous, expected);
        }
        assert!(parse("[auth]\nallow_anonymous = \"yes\"\n").is_err());
    }

    #[test]
    fn anonymous_decision_per_listener() {
        assert!(Anonymous::Loopback.allows(true));
        assert!(!Anonymous::Loopback.allows(false));
        assert!(Anonymous::Always.allows(false));
        assert!(!Anonymous::Never.allows(true));
    }

    #[test]
    fn acl_rules_parse_and_bad_ones_are_named() {
        let aliased = parse("[auth]\n[[acl]]\nclient = \"d\"\ntopic = \"t\"\naccess = \"read\"\n")
            .expect("client is an alias of client_id");
        assert_eq!(aliased.acl[0].client_id.as_deref(), Some("d"));
        let text = "[auth]\n[[acl]]\nuser = \"a\"\ntopic = \"s/%u/#\"\naccess = \"readwrite\"\n\
                    [[acl]]\ntopic = \"x/#/y\"\naccess = \"read\"\n";
        let parsed = parse(text).expect("parses");
        assert_eq!(parsed.acl[0].access, Access::ReadWrite);
        let limits = TopicLimits {
            max_len: 256,
            max_levels: 16,
        };
        let err = parsed
            .auth
            .validate(&parsed.acl, &limits)
            .expect_err("bad filter");
        assert!(err.to_string().contains("mqtt.acl[1].topic"), "{err}");
        assert!(parse("[auth]\n[[acl]]\ntopic = \"a\"\naccess = \"all\"\n").is_err());
    }
}
