//! How a shared group picks the member for a record: round robin over the members with room in
//! their window, or key-sticky, where rendezvous hashing of (member client id, record key) picks
//! the member so one key always reaches the same member while the member set is unchanged (and
//! only the keys of a member that leaves move); the setting itself is `config::SharedStrategy`.
//! Pure functions; never blocks and never sends.

use super::super::config::SharedStrategy;

/// What the picker needs to know of a member.
pub trait Candidate {
    /// Stable identity for hashing (the client id).
    fn name(&self) -> &str;
    /// Whether the member can take one more record now.
    fn has_room(&self) -> bool;
}

/// Round-robin state of one group.
#[derive(Debug, Default)]
pub struct Picker {
    next: usize,
}

impl Picker {
    /// The index of the member to receive a record with `key`, if one can take it now.
    pub fn pick<C: Candidate>(
        &mut self,
        strategy: SharedStrategy,
        members: &[C],
        key: &[u8],
    ) -> Option<usize> {
        match strategy {
            SharedStrategy::RoundRobin => self.round_robin(members),
            SharedStrategy::KeySticky => {
                rendezvous(members, key).filter(|i| members.get(*i).is_some_and(C::has_room))
            }
        }
    }

    fn round_robin<C: Candidate>(&mut self, members: &[C]) -> Option<usize> {
        let count = members.len();
        let found = (0..count)
            .map(|step| (self.next + step) % count)
            .find(|i| members.get(*i).is_some_and(C::has_room))?;
        self.next = (found + 1) % count;
        Some(found)
    }
}

/// The member with the highest score for `key`, whether or not it has room.
pub fn rendezvous<C: Candidate>(members: &[C], key: &[u8]) -> Option<usize> {
    members
        .iter()
        .enumerate()
        .max_by_key(|(_, m)| (score(m.name().as_bytes(), key), m.name().to_owned()))
        .map(|(i, _)| i)
}

/// FNV-1a over `member`, a separator and `key`, finished with a 64-bit mix (stable across
/// releases, unlike std's hasher).
fn score(member: &[u8], key: &[u8]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in member.iter().chain(&[0xff]).chain(key) {
        hash ^= u64::from(*byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash ^= hash >> 33;
    hash = hash.wrapping_mul(0xff51_afd7_ed55_8ccd);
    hash ^ (hash >> 33)
}

#[cfg(test)]
mod tests {
    use super::*;

    struct M(&'static str, bool);

    impl Candidate for M {
        fn name(&self) -> &str {
            self.0
        }
        fn has_room(&self) -> bool {
            self.1
        }
    }

    #[test]
    fn round_robin_skips_members_without_room() {
        let mut picker = Picker::default();
        let members = [M("a", true), M("b", false), M("c", true)];
        let picks: Vec<Option<usize>> = (0..4)
            .map(|_| picker.pick(SharedStrategy::RoundRobin, &members, b"k"))
            .collect();
        assert_eq!(picks, [Some(0), Some(2), Some(0), Some(2)]);
        let busy = [M("a", false)];
        assert_eq!(picker.pick(SharedStrategy::RoundRobin, &busy, b"k"), None);
        assert_eq!(
            picker.pick::<M>(SharedStrategy::RoundRobin, &[], b"k"),
            None
        );
    }

    #[test]
    fn key_sticky_keeps_keys_and_moves_only_a_leavers_keys() {
        let mut picker = Picker::default();
        let three = [M("a", true), M("b", true), M("c", true)];
        let keys: Vec<String> = (0..200).map(|i| format!("dev-{i}")).collect();
        let owner = |members: &[M], key: &str| {
            let i = rendezvous(members, key.as_bytes()).expect("a member");
            members.get(i).map(|m| m.0).expect("in range")
        };
        let before: Vec<&str> = keys.iter().map(|k| owner(&three, k)).collect();
        for name in ["a", "b", "c"] {
            let share = before.iter().filter(|o| **o == name).count();
            assert!(share > 40, "{name} owns only {share} of 200 keys");
        }
        let two = [M("a", true), M("c", true)];
        for (key, old) in keys.iter().zip(&before) {
            let new = owner(&two, key);
            if *old != "b" {
                assert_eq!(new, *old, "{key} moved although its owner stayed");
            }
        }
        let busy = [M("a", false), M("b", false), M("c", false)];
        assert_eq!(picker.pick(SharedStrategy::KeySticky, &busy, b"k"), None);
        let again = picker.pick(SharedStrategy::KeySticky, &three, b"dev-7");
        assert_eq!(again, rendezvous(&three, b"dev-7"));
    }

    #[test]
    fn strategy_names_parse() {
        let parsed: SharedStrategy = serde_json::from_str("\"key-sticky\"").expect("parses");
        assert_eq!(parsed, SharedStrategy::KeySticky);
        assert_eq!(
            serde_json::to_string(&SharedStrategy::RoundRobin).expect("prints"),
            "\"round-robin\""
        );
    }
}
