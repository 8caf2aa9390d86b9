//! Topic access rules (`[[mqtt.acl]]`), with Mosquitto's semantics:
//!
//! - no rules at all: every client may publish and subscribe everywhere;
//! - otherwise deny by default. A rule applies to a client when its `user` and `client_id` (each
//!   only if set) equal the client's; a rule with neither applies to every client (Mosquitto's
//!   `pattern`). Access is granted when an applying rule grants it and no applying `deny` rule
//!   matches; the order of the rules does not matter.
//! - `%u` and `%c` in a rule's topic become the username and client id. A rule using `%u`
//!   never applies to an anonymous client, and a name containing `/`, `+` or `#` never
//!   substitutes (it could otherwise widen the rule).
//! - publish: the topic name must match the rule's filter. Subscribe: the client's filter must
//!   lie entirely inside the rule's filter (`a/#` allows `a/+/b`, not the reverse). Every message
//!   is checked again for read access when delivered, so a `deny` rule inside a granted
//!   wildcard subscription still holds.
//!
//! The rules are the MQTT listener's; the Kafka listener checks a Kafka topic name as an MQTT
//! topic name of one level. Topic filter matching lives here ([`topic_matches`]) and tern-mqtt
//! routes subscriptions with it too, so the two can never disagree.
//!
//! Pure decisions; never does I/O and never logs message contents.

use serde::{Deserialize, Serialize};

/// One `[[mqtt.acl]]` rule.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AclConfig {
    /// The rule applies only to clients authenticated as this user.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// The rule applies only to clients with this client id (also accepted as `client`).
    #[serde(default, alias = "client", skip_serializing_if = "Option::is_none")]
    pub client_id: Option<String>,
    /// Topic filter, `+`/`#` allowed; `%u` becomes the username, `%c` the client id.
    pub topic: String,
    /// "read" (subscribe, receive), "write" (publish), "readwrite", or "deny" (neither, even
    /// if another rule grants it).
    pub access: Access,
}

/// What an ACL rule grants.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Access {
    Read,
    Write,
    ReadWrite,
    Deny,
}

/// Why `topic` cannot be the name an MQTT message is published on (1 to 65535 bytes, no `+`,
/// `#` or NUL), if it cannot: the one check of a topic that arrives in a Kafka record's
/// `mqtt.topic` header (the Kafka listener's produce, the downstream's commands).
pub fn invalid_topic_name(topic: &str) -> Option<&'static str> {
    if topic.is_empty() || topic.len() > usize::from(u16::MAX) {
        return Some("must be 1 to 65535 bytes");
    }
    if topic.contains(['+', '#', '\0']) {
        return Some("must not contain +, # or NUL");
    }
    None
}

/// Whether the MQTT topic filter `filter` matches the topic name `topic` (`+` one level, `#`
/// the rest; wildcards at the start never match `$` topics).
pub fn topic_matches(filter: &str, topic: &str) -> bool {
    if topic.starts_with('$') && filter.starts_with(['+', '#']) {
        return false;
    }
    let mut names = topic.split('/');
    for part in filter.split('/') {
        match (part, names.next()) {
            ("#", _) => return true,
            ("+", Some(_)) => {}
            (part, Some(name)) if part == name => {}
            _ => return false,
        }
    }
    names.next().is_none()
}

/// Who is asking.
#[derive(Debug, Clone, Copy)]
pub struct Client<'a> {
    /// The authenticated username; `None` for anonymous clients.
    pub user: Option<&'a str>,
    pub client_id: &'a str,
}

/// What the client wants to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Want {
    /// Publish to a topic name.
    Publish,
    /// Subscribe with a topic filter.
    Subscribe,
    /// Receive a message on a topic name.
    Receive,
}

/// The configured rules.
#[derive(Debug, Clone, Default)]
pub struct Acl {
    rules: Vec<AclConfig>,
}

impl Acl {
    pub fn new(rules: Vec<AclConfig>) -> Self {
        Self { rules }
    }

    /// Whether any rule is configured (otherwise everything is allowed).
    pub fn is_active(&self) -> bool {
        !self.rules.is_empty()
    }

    /// Whether `client` may do `want` on `topic` (a name, or a filter for `Subscribe`).
    pub fn allows(&self, client: Client<'_>, want: Want, topic: &str) -> bool {
        if !self.is_active() {
            return true;
        }
        let mut granted = false;
        for rule in self.rules.iter().filter(|r| applies(r, client)) {
            let Some(pattern) = substitute(&rule.topic, client) else {
                continue;
            };
            if !covers(&pattern, want, topic) {
                continue;
            }
            match (rule.access, want) {
                (Access::Deny, _) => return false,
                (Access::ReadWrite, _)
                | (Access::Write, Want::Publish)
                | (Access::Read, Want::Subscribe | Want::Receive) => granted = true,
                _ => {}
            }
        }
        granted
    }
}

fn applies(rule: &AclConfig, client: Client<'_>) -> bool {
    let user_ok = rule.user.as_deref().is_none_or(|u| client.user == Some(u));
    let id_ok = rule
        .client_id
        .as_deref()
        .is_none_or(|c| c == client.client_id);
    user_ok && id_ok
}

/// The rule's filter with `%u`/`%c` replaced; `None` when a needed name is missing or unsafe.
fn substitute(pattern: &str, client: Client<'_>) -> Option<String> {
    let safe = |name: &str| !name.is_empty() && !name.contains(['/', '+', '#']);
    let mut out = pattern.to_owned();
    if pattern.contains("%u") {
        let user = client.user.filter(|u| safe(u))?;
        out = out.replace("%u", user);
    }
    if pattern.contains("%c") {
        if !safe(client.client_id) {
            return None;
        }
        out = out.replace("%c", client.client_id);
    }
    Some(out)
}

fn covers(pattern: &str, want: Want, topic: &str) -> bool {
    match want {
        Want::Publish | Want::Receive => topic_matches(pattern, topic),
        Want::Subscribe => filter_within(pattern, topic),
    }
}

/// Whether every topic `filter` can match is also matched by `pattern`.
fn filter_within(pattern: &str, filter: &str) -> bool {
    if filter.starts_with('$') && pattern.starts_with(['+', '#']) {
        return false;
    }
    let mut wanted = filter.split('/');
    for rule_level in pattern.split('/') {
        if rule_level == "#" {
            return true;
        }
        let Some(level) = wanted.next() else {
            return false;
        };
        let ok = match rule_level {
            "+" => level != "#",
            literal => level == literal,
        };
        if !ok {
            return false;
        }
    }
    wanted.next().is_none()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(user: Option<&str>, client_id: Option<&str>, topic: &str, access: Access) -> AclConfig {
        AclConfig {
            user: user.map(str::to_owned),
            client_id: client_id.map(str::to_owned),
            topic: topic.to_owned(),
            access,
        }
    }

    fn alice() -> Client<'static> {
        Client {
            user: Some("alice"),
            client_id: "dev-1",
        }
    }

    #[test]
    fn no_rules_allow_everything() {
        let acl = Acl::default();
        assert!(acl.allows(alice(), Want::Publish, "any/thing"));
        assert!(acl.allows(alice(), Want::Subscribe, "#"));
    }

    #[test]
    fn any_rule_makes_everything_else_denied() {
        let acl = Acl::new(vec![rule(Some("bob"), None, "#", Access::ReadWrite)]);
        assert!(!acl.allows(alice(), Want::Publish, "a"));
        assert!(!acl.allows(alice(), Want::Subscribe, "a"));
    }

    #[test]
    fn access_kinds_split_publish_and_subscribe() {
        let acl = Acl::new(vec![
            rule(Some("alice"), None, "in/#", Access::Write),
            rule(Some("alice"), None, "out/#", Access::Read),
        ]);
        assert!(acl.allows(alice(), Want::Publish, "in/x"));
        assert!(!acl.allows(alice(), Want::Subscribe, "in/x"));
        assert!(acl.allows(alice(), Want::Subscribe, "out/+"));
        assert!(acl.allows(alice(), Want::Receive, "out/y"));
        assert!(!acl.allows(alice(), Want::Publish, "out/y"));
    }

    #[test]
    fn patterns_substitute_user_and_client_id() {
        let acl = Acl::new(vec![
            rule(None, None, "users/%u/#", Access::ReadWrite),
            rule(None, None, "devices/%c/cmd", Access::Read),
        ]);
        assert!(acl.allows(alice(), Want::Publish, "users/alice/t"));
        assert!(!acl.allows(alice(), Want::Publish, "users/bob/t"));
        assert!(acl.allows(alice(), Want::Subscribe, "devices/dev-1/cmd"));
        assert!(!acl.allows(alice(), Want::Subscribe, "devices/+/cmd"));
        let anonymous = Client {
            user: None,
            client_id: "dev-1",
        };
        assert!(!acl.allows(anonymous, Want::Publish, "users//t"));
        assert!(acl.allows(anonymous, Want::Receive, "devices/dev-1/cmd"));
    }

    #[test]
    fn wildcard_names_never_substitute() {
        let acl = Acl::new(vec![rule(None, None, "users/%u/#", Access::ReadWrite)]);
        for user in ["#", "+", "a/b"] {
            let client = Client {
                user: Some(user),
                client_id: "c",
            };
            assert!(!acl.allows(client, Want::Subscribe, "users/#"), "{user}");
            assert!(!acl.allows(client, Want::Publish, "users/x/y"), "{user}");
        }
    }

    #[test]
    fn deny_overrides_grants_in_any_order() {
        let acl = Acl::new(vec![
            rule(None, None, "a/secret", Access::Deny),
            rule(None, None, "a/#", Access::ReadWrite),
        ]);
        assert!(acl.allows(alice(), Want::Publish, "a/open"));
        assert!(!acl.allows(alice(), Want::Publish, "a/secret"));
        assert!(acl.allows(alice(), Want::Subscribe, "a/#"));
        assert!(!acl.allows(alice(), Want::Receive, "a/secret"));
    }

    #[test]
    fn rules_for_a_client_id() {
        let acl = Acl::new(vec![rule(None, Some("dev-1"), "t", Access::Write)]);
        assert!(acl.allows(alice(), Want::Publish, "t"));
        let other = Client {
            user: Some("alice"),
            client_id: "dev-2",
        };
        assert!(!acl.allows(other, Want::Publish, "t"));
    }

    #[test]
    fn subscription_filters_must_lie_inside_the_rule() {
        let cases = [
            ("a/#", "a/#", true),
            ("a/#", "a/+/b", true),
            ("a/#", "a", true),
            ("a/+", "a/b", true),
            ("a/+", "a/+", true),
            ("a/+", "a/#", false),
            ("a/b", "a/+", false),
            ("a/+/c", "a/b/c/d", false),
            ("#", "$SYS/x", false),
            ("$SYS/#", "$SYS/x", true),
        ];
        for (pattern, filter, expected) in cases {
            assert_eq!(
                filter_within(pattern, filter),
                expected,
                "{pattern} {filter}"
            );
        }
    }
}
