//! Topic access control: `[[mqtt.acl]]` rules grant read (subscribe) or write (publish) access
//! to topic patterns, per user and/or client id, with `%u` (user name) and `%c` (client id)
//! substituted in the pattern. Without rules everything is allowed; with rules, whatever no rule
//! grants is denied. A subscription is allowed only if every topic its filter can match is
//! readable. Pure decisions; never logs or touches the connection.

use serde::{Deserialize, Serialize};

use super::topic;

/// What a rule grants.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Access {
    Read,
    Write,
    ReadWrite,
}

/// One `[[mqtt.acl]]` rule.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AclRule {
    /// Applies to this user name only (absent: any client, with or without a user name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// Applies to this client id only (absent: any).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client: Option<String>,
    /// Topic filter pattern; `%u` and `%c` are replaced by the user name and client id.
    pub topic: String,
    pub access: Access,
}

/// Who is asking.
#[derive(Debug, Clone, Copy)]
pub struct Identity<'a> {
    pub user: Option<&'a str>,
    pub client: &'a str,
}

/// May `who` publish to `topic_name`?
pub fn may_publish(rules: &[AclRule], who: Identity<'_>, topic_name: &str) -> bool {
    rules.is_empty()
        || granted(rules, who, Access::Write).any(|pattern| topic::matches(&pattern, topic_name))
}

/// May `who` subscribe to `filter`?
pub fn may_subscribe(rules: &[AclRule], who: Identity<'_>, filter: &str) -> bool {
    rules.is_empty() || granted(rules, who, Access::Read).any(|pattern| covers(&pattern, filter))
}

/// The patterns of rules applying to `who` that grant `wanted`, with `%u`/`%c` substituted.
fn granted<'r>(
    rules: &'r [AclRule],
    who: Identity<'r>,
    wanted: Access,
) -> impl Iterator<Item = String> + 'r {
    rules
        .iter()
        .filter(move |r| r.access == wanted || r.access == Access::ReadWrite)
        .filter(move |r| r.user.as_deref().is_none_or(|u| who.user == Some(u)))
        .filter(move |r| r.client.as_deref().is_none_or(|c| who.client == c))
        .filter(move |r| who.user.is_some() || !r.topic.contains("%u"))
        .map(move |r| {
            r.topic
                .replace("%u", who.user.unwrap_or_default())
                .replace("%c", who.client)
        })
}

/// Whether every topic matching `filter` also matches `pattern`.
fn covers(pattern: &str, filter: &str) -> bool {
    let mut wanted = filter.split('/');
    for level in pattern.split('/') {
        match (level, wanted.next()) {
            ("#", _) => return true,
            (_, None) => return false,
            ("+", Some(w)) if w != "#" => {}
            (p, Some(w)) if p == w && p != "+" && p != "#" => {}
            _ => return false,
        }
    }
    wanted.next().is_none()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(user: Option<&str>, topic: &str, access: Access) -> AclRule {
        AclRule {
            user: user.map(str::to_owned),
            client: None,
            topic: topic.to_owned(),
            access,
        }
    }

    #[test]
    fn patterns_substitute_user_and_client() {
        let rules = [
            rule(None, "devices/%c/#", Access::ReadWrite),
            rule(Some("ops"), "#", Access::Read),
            rule(None, "users/%u/in", Access::Write),
        ];
        let dev = Identity {
            user: None,
            client: "d1",
        };
        assert!(may_publish(&rules, dev, "devices/d1/temp"));
        assert!(!may_publish(&rules, dev, "devices/d2/temp"));
        assert!(
            !may_publish(&rules, dev, "users//in"),
            "%u never matches without a user"
        );
        assert!(may_subscribe(&rules, dev, "devices/d1/+"));
        assert!(!may_subscribe(&rules, dev, "devices/+/temp"));
        let ops = Identity {
            user: Some("ops"),
            client: "console",
        };
        assert!(may_subscribe(&rules, ops, "#"));
        assert!(!may_publish(&rules, ops, "devices/d1/temp"));
        assert!(may_publish(&rules, ops, "users/ops/in"));
        assert!(may_publish(&[], dev, "anything"), "no rules: open");
    }

    #[test]
    fn coverage_of_filters_by_patterns() {
        let cases = [
            ("a/#", "a/b/+", true),
            ("a/+", "a/b", true),
            ("a/+", "a/#", false),
            ("a/+", "a/+", true),
            ("a/b", "a/+", false),
            ("#", "#", true),
            ("a/+/c", "a/b/c/d", false),
            ("a", "a/#", false),
        ];
        for (pattern, filter, expected) in cases {
            assert_eq!(
                covers(pattern, filter),
                expected,
                "{pattern} covers {filter}"
            );
        }
    }
}
