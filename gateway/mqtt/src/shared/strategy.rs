//! How a shared group picks the member for a record, per subscription type
//! (`config::SharedType`): `shared` is round robin over the members with room in their window;
//! `key_shared` picks by rendezvous hashing of (member client id, record key), so one key always
//! reaches the same live member and only the keys of a member that joins or leaves move, and a
//! key that moved waits until its previous member has acknowledged what it holds of it (Pulsar's
//! "draining hashes": per-key order survives a rebalance); `failover` and `exclusive` give
//! everything to the active member, the one joined longest. Pure functions; never blocks and
//! never sends.

use super::super::config::SharedType;

/// What the picker needs to know of a member.
pub trait Candidate {
    /// Stable identity for hashing (the client id).
    fn name(&self) -> &str;
    /// Whether the member can take one more record now.
    fn has_room(&self) -> bool;
    /// Whether the member holds unacknowledged records whose key hashes to `hash`.
    fn holds_key(&self, hash: u64) -> bool;
}

/// Round-robin state of one group.
#[derive(Debug, Default)]
pub struct Picker {
    next: usize,
}

impl Picker {
    /// The index of the member to receive a record with `key`, if one can take it now.
    /// `members` are in join order.
    pub fn pick<C: Candidate>(
        &mut self,
        kind: SharedType,
        members: &[C],
        key: &[u8],
    ) -> Option<usize> {
        let can_take = |i: &usize| members.get(*i).is_some_and(C::has_room);
        match kind {
            SharedType::Shared => self.round_robin(members),
            SharedType::KeyShared => {
                let owner = rendezvous(members, key)?;
                let hash = key_hash(key);
                let draining = members
                    .iter()
                    .enumerate()
                    .any(|(i, m)| i != owner && m.holds_key(hash));
                Some(owner).filter(|i| !draining && can_take(i))
            }
            SharedType::Failover | SharedType::Exclusive => Some(0).filter(can_take),
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

/// The hash a member's outstanding keys are counted by (`Candidate::holds_key`).
pub fn key_hash(key: &[u8]) -> u64 {
    score(&[], key)
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

    /// A member holding unacknowledged records of key `k`.
    struct Holding(&'static str, &'static [u8]);

    impl Candidate for Holding {
        fn name(&self) -> &str {
            self.0
        }
        fn has_room(&self) -> bool {
            true
        }
        fn holds_key(&self, hash: u64) -> bool {
            !self.1.is_empty() && key_hash(self.1) == hash
        }
    }

    impl Candidate for M {
        fn name(&self) -> &str {
            self.0
        }
        fn has_room(&self) -> bool {
            self.1
        }
        fn holds_key(&self, _: u64) -> bool {
            false
        }
    }

    #[test]
    fn round_robin_skips_members_without_room() {
        let mut picker = Picker::default();
        let members = [M("a", true), M("b", false), M("c", true)];
        let picks: Vec<Option<usize>> = (0..4)
            .map(|_| picker.pick(SharedType::Shared, &members, b"k"))
            .collect();
        assert_eq!(picks, [Some(0), Some(2), Some(0), Some(2)]);
        let busy = [M("a", false)];
        assert_eq!(picker.pick(SharedType::Shared, &busy, b"k"), None);
        assert_eq!(picker.pick::<M>(SharedType::Shared, &[], b"k"), None);
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
        assert_eq!(picker.pick(SharedType::KeyShared, &busy, b"k"), None);
        let again = picker.pick(SharedType::KeyShared, &three, b"dev-7");
        assert_eq!(again, rendezvous(&three, b"dev-7"));
    }

    #[test]
    fn a_key_that_moved_waits_for_its_previous_member() {
        let mut picker = Picker::default();
        let key = (0..100)
            .map(|i| format!("k{i}"))
            .find(|k| {
                let two = [M("a", true), M("b", true)];
                rendezvous(&two, k.as_bytes()) == Some(1)
            })
            .expect("some key hashes to b");
        let key: &'static [u8] = Box::leak(key.into_bytes().into_boxed_slice());
        let draining = [Holding("a", key), Holding("b", b"")];
        assert_eq!(picker.pick(SharedType::KeyShared, &draining, key), None);
        let drained = [Holding("a", b""), Holding("b", b"")];
        assert_eq!(picker.pick(SharedType::KeyShared, &drained, key), Some(1));
        let owner_holds = [Holding("a", b""), Holding("b", key)];
        assert_eq!(
            picker.pick(SharedType::KeyShared, &owner_holds, key),
            Some(1)
        );
    }

    #[test]
    fn failover_and_exclusive_give_everything_to_the_first_member() {
        let mut picker = Picker::default();
        for kind in [SharedType::Failover, SharedType::Exclusive] {
            let members = [M("a", true), M("b", true)];
            for key in [b"x".as_slice(), b"y", b"z"] {
                assert_eq!(picker.pick(kind, &members, key), Some(0));
            }
            let busy = [M("a", false), M("b", true)];
            assert_eq!(picker.pick(kind, &busy, b"x"), None, "the standby waits");
        }
    }

    #[test]
    fn type_names_parse() {
        let parsed: SharedType = serde_json::from_str("\"key_shared\"").expect("parses");
        assert_eq!(parsed, SharedType::KeyShared);
        for kind in [
            SharedType::Shared,
            SharedType::KeyShared,
            SharedType::Failover,
            SharedType::Exclusive,
        ] {
            let printed = serde_json::to_string(&kind).expect("prints");
            assert_eq!(printed, format!("\"{}\"", kind.name()));
        }
    }
}
