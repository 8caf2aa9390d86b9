//! Outbound MQTT 5 topic aliases: a bounded, least-recently-used map from topic names to alias
//! numbers for one connection. The first delivery on a topic carries the topic and a new alias,
//! later ones an empty topic and the alias; when every alias is taken, the least recently used
//! one is reassigned (with the full topic again). Never hands out an alias above its maximum
//! (the smaller of the client's Topic Alias Maximum and `mqtt.outbound_topic_aliases`), and
//! never outlives its connection: resends after a reconnect start from an empty map.

use std::collections::{BTreeMap, HashMap};

use bytes::Bytes;

/// How a delivery names its topic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum AliasUse {
    /// Send the topic and this alias: the client learns (or relearns) the mapping.
    Assign(u16),
    /// Send an empty topic and this alias.
    Reuse(u16),
}

/// One connection's outbound alias map. Its maps are allocated on the first alias: most
/// connections never use one, and every idle connection would carry their room (issue #29).
#[derive(Debug, Default)]
pub(super) struct OutboundAliases {
    max: u16,
    maps: Option<Box<Maps>>,
    clock: u64,
}

#[derive(Debug, Default)]
struct Maps {
    /// Topic → (alias, last use).
    by_topic: HashMap<Bytes, (u16, u64)>,
    /// Last use → topic, oldest first.
    by_use: BTreeMap<u64, Bytes>,
}

impl OutboundAliases {
    /// A map handing out aliases 1..=`max`; 0 disables aliases.
    pub(super) fn new(max: u16) -> Self {
        Self {
            max,
            ..Self::default()
        }
    }

    /// The alias for a delivery on `topic`; `None` when aliases are disabled.
    pub(super) fn alias_for(&mut self, topic: &Bytes) -> Option<AliasUse> {
        if self.max == 0 || topic.is_empty() {
            return None;
        }
        self.clock += 1;
        let now = self.clock;
        let maps = self.maps.get_or_insert_with(Box::default);
        if let Some((alias, used)) = maps.by_topic.get_mut(topic) {
            let alias = *alias;
            maps.by_use.remove(used);
            *used = now;
            maps.by_use.insert(now, topic.clone());
            return Some(AliasUse::Reuse(alias));
        }
        let alias = match u16::try_from(maps.by_topic.len()) {
            Ok(len) if len < self.max => len + 1,
            _ => maps.evict_oldest()?,
        };
        maps.by_topic.insert(topic.clone(), (alias, now));
        maps.by_use.insert(now, topic.clone());
        Some(AliasUse::Assign(alias))
    }
}

impl Maps {
    /// Forgets the least recently used topic and returns its alias.
    fn evict_oldest(&mut self) -> Option<u16> {
        let (_, topic) = self.by_use.pop_first()?;
        self.by_topic.remove(&topic).map(|(alias, _)| alias)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn topic(name: &'static str) -> Bytes {
        Bytes::from_static(name.as_bytes())
    }

    #[test]
    fn topics_get_an_alias_once_then_reuse_it() {
        let mut aliases = OutboundAliases::new(2);
        assert_eq!(aliases.alias_for(&topic("a")), Some(AliasUse::Assign(1)));
        assert_eq!(aliases.alias_for(&topic("b")), Some(AliasUse::Assign(2)));
        assert_eq!(aliases.alias_for(&topic("a")), Some(AliasUse::Reuse(1)));
        assert_eq!(aliases.alias_for(&topic("b")), Some(AliasUse::Reuse(2)));
    }

    #[test]
    fn the_least_recently_used_alias_is_reassigned() {
        let mut aliases = OutboundAliases::new(2);
        aliases.alias_for(&topic("a"));
        aliases.alias_for(&topic("b"));
        aliases.alias_for(&topic("a"));
        assert_eq!(aliases.alias_for(&topic("c")), Some(AliasUse::Assign(2)));
        assert_eq!(aliases.alias_for(&topic("a")), Some(AliasUse::Reuse(1)));
        assert_eq!(aliases.alias_for(&topic("b")), Some(AliasUse::Assign(2)));
        assert_eq!(aliases.alias_for(&topic("c")), Some(AliasUse::Assign(1)));
    }

    #[test]
    fn aliases_never_exceed_the_maximum() {
        let mut aliases = OutboundAliases::new(3);
        for i in 0..100u32 {
            let name = Bytes::from(format!("t/{}", i % 7));
            let alias = match aliases.alias_for(&name) {
                Some(AliasUse::Assign(a) | AliasUse::Reuse(a)) => a,
                None => 0,
            };
            assert!((1..=3).contains(&alias), "alias {alias}");
        }
        let maps = aliases.maps.expect("aliases were handed out");
        assert!(maps.by_topic.len() <= 3 && maps.by_use.len() <= 3);
    }

    #[test]
    fn a_zero_maximum_disables_aliases() {
        let mut aliases = OutboundAliases::new(0);
        assert_eq!(aliases.alias_for(&topic("a")), None);
    }
}
