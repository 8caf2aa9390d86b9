//! MQTT topic names and topic filters: validation against the spec and tern's limits, and
//! matching with `+`/`#` wildcards under the `$`-topic rule (a filter starting with a wildcard
//! never matches a topic starting with `$`), and which filters are shared (`$share/`). Pure
//! functions; never allocates per match.

use bytes::Bytes;

use super::message::ByteString;

/// The filter prefix that makes a subscription shared (`$share/{group}/{filter}`).
pub const SHARE_PREFIX: &str = "$share/";

/// Whether a subscription filter names a shared subscription.
pub fn is_shared(filter: &str) -> bool {
    filter.starts_with(SHARE_PREFIX)
}

/// Limits applied on top of the spec's rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TopicLimits {
    /// Longest topic name or filter in bytes.
    pub max_len: usize,
    /// Most levels (`/`-separated parts).
    pub max_levels: usize,
}

/// Why a topic name or filter was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TopicError {
    #[error("empty topic")]
    Empty,
    #[error("topic of {len} bytes exceeds the limit of {max}")]
    TooLong { len: usize, max: usize },
    #[error("topic has {levels} levels, the limit is {max}")]
    TooManyLevels { levels: usize, max: usize },
    #[error("topic is not valid UTF-8")]
    NotUtf8,
    #[error("topic contains a NUL character")]
    Nul,
    #[error("topic name contains a wildcard")]
    WildcardInName,
    #[error("wildcard `{wildcard}` must occupy a whole level{tail}")]
    MisplacedWildcard { wildcard: char, tail: &'static str },
}

/// Checks a topic name as used in PUBLISH; returns it as `&str`.
pub fn validate_name<'a>(raw: &'a [u8], limits: &TopicLimits) -> Result<&'a str, TopicError> {
    let (name, scan) = common(raw, limits)?;
    if scan.wildcard {
        return Err(TopicError::WildcardInName);
    }
    Ok(name)
}

/// [`validate_name`] of a name in a frame's buffer: the name becomes the buffer's slice (moved,
/// not shared again), and its bytes are checked as UTF-8 once (the per-publish instruction
/// count, issue #29).
pub fn shared_name(raw: Bytes, limits: &TopicLimits) -> Result<ByteString, TopicError> {
    length(&raw, limits)?;
    let scan = Scan::of(&raw);
    let name = if scan.ascii {
        // SAFETY: every byte is below 0x80 (the scan looked at each one), and ASCII is UTF-8.
        // The general check walks a short topic a byte at a time (issue #29).
        unsafe { ByteString::from_bytes_unchecked(raw) }
    } else {
        ByteString::try_from(raw).map_err(|_| TopicError::NotUtf8)?
    };
    if checked(scan, limits)?.wildcard {
        return Err(TopicError::WildcardInName);
    }
    Ok(name)
}

/// Checks a topic filter as used in SUBSCRIBE/UNSUBSCRIBE and in routes.
pub fn validate_filter(filter: &str, limits: &TopicLimits) -> Result<(), TopicError> {
    common(filter.as_bytes(), limits)?;
    let mut levels = filter.split('/').peekable();
    while let Some(level) = levels.next() {
        let last = levels.peek().is_none();
        if level.contains('#') && (level != "#" || !last) {
            return Err(TopicError::MisplacedWildcard {
                wildcard: '#',
                tail: " and be the last one",
            });
        }
        if level.contains('+') && level != "+" {
            return Err(TopicError::MisplacedWildcard {
                wildcard: '+',
                tail: "",
            });
        }
    }
    Ok(())
}

fn common<'a>(raw: &'a [u8], limits: &TopicLimits) -> Result<(&'a str, Scan), TopicError> {
    length(raw, limits)?;
    let text = std::str::from_utf8(raw).map_err(|_| TopicError::NotUtf8)?;
    Ok((text, checked(Scan::of(raw), limits)?))
}

/// The checks of [`common`] before the UTF-8 one: not empty, not too long.
fn length(raw: &[u8], limits: &TopicLimits) -> Result<(), TopicError> {
    if raw.is_empty() {
        return Err(TopicError::Empty);
    }
    if raw.len() > limits.max_len {
        return Err(TopicError::TooLong {
            len: raw.len(),
            max: limits.max_len,
        });
    }
    Ok(())
}

/// The checks of [`common`] after the UTF-8 one, on the topic's scan: no NUL, not too many
/// levels.
fn checked(scan: Scan, limits: &TopicLimits) -> Result<Scan, TopicError> {
    if scan.nul {
        return Err(TopicError::Nul);
    }
    let levels = scan.slashes + 1;
    if levels > limits.max_levels {
        return Err(TopicError::TooManyLevels {
            levels,
            max: limits.max_levels,
        });
    }
    Ok(scan)
}

/// What one pass over a topic's bytes finds. The characters looked for are ASCII, and no byte
/// of a multi-byte UTF-8 character is ASCII, so bytes stand for characters (one pass instead of
/// a search per character: the per-publish instruction count, issue #29). Eight bytes are
/// looked at at a time, as one word.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Scan {
    nul: bool,
    wildcard: bool,
    slashes: usize,
    /// Every byte below 0x80: the bytes are UTF-8 without checking further.
    ascii: bool,
}

impl Scan {
    fn of(raw: &[u8]) -> Self {
        const fn splat(byte: u8) -> u64 {
            u64::from_le_bytes([byte; 8])
        }
        let mut scan = Self {
            nul: false,
            wildcard: false,
            slashes: 0,
            ascii: true,
        };
        let mut high = 0;
        let mut words = raw.chunks_exact(8);
        for word in &mut words {
            let word = u64::from_le_bytes(word.try_into().unwrap_or_default());
            high |= word;
            scan.nul |= zero_bytes(word) != 0;
            scan.wildcard |= zero_bytes(word ^ splat(b'+')) | zero_bytes(word ^ splat(b'#')) != 0;
            scan.slashes += zero_bytes(word ^ splat(b'/')).count_ones() as usize;
        }
        for &byte in words.remainder() {
            high |= u64::from(byte);
            match byte {
                0 => scan.nul = true,
                b'/' => scan.slashes += 1,
                b'+' | b'#' => scan.wildcard = true,
                _ => {}
            }
        }
        scan.ascii = high & splat(0x80) == 0;
        scan
    }
}

/// The high bit of every byte of `word` that is zero, and no other bit (exact: no borrow runs
/// from one byte into the next).
fn zero_bytes(word: u64) -> u64 {
    const LOW7: u64 = u64::from_le_bytes([0x7f; 8]);
    !(((word & LOW7) + LOW7) | word | LOW7)
}

/// Whether topic name `topic` matches the (valid) filter `filter`: tern-auth's, which the ACL
/// checks use too.
pub use tern_auth::topic_matches as matches;

/// The `n`-th level (0-based) of a topic name, if it has one.
pub fn level(topic: &str, n: usize) -> Option<&str> {
    topic.split('/').nth(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: TopicLimits = TopicLimits {
        max_len: 64,
        max_levels: 4,
    };

    #[test]
    fn wildcards_match_per_the_spec() {
        let cases = [
            ("a/b/c", "a/b/c", true),
            ("a/+/c", "a/b/c", true),
            ("a/+/c", "a/b/d", false),
            ("a/#", "a", true),
            ("a/#", "a/b/c", true),
            ("#", "a/b", true),
            ("+", "a", true),
            ("+", "a/b", false),
            ("+/+", "/a", true),
            ("a/b", "a/b/c", false),
            ("a/b/c", "a/b", false),
            ("+/#", "a", true),
            ("#", "$SYS/x", false),
            ("+/x", "$SYS/x", false),
            ("$SYS/#", "$SYS/x", true),
            ("a/+", "a/", true),
        ];
        for (filter, topic, expected) in cases {
            assert_eq!(matches(filter, topic), expected, "{filter} vs {topic}");
        }
    }

    #[test]
    fn filters_are_validated() {
        for good in ["a", "a/+/c", "#", "a/#", "+", "/", "+/+"] {
            assert_eq!(validate_filter(good, &LIMITS), Ok(()), "{good}");
        }
        for bad in ["", "a#", "a/#/b", "a+", "a/b+/c", "a/b/c/d/e", "x\0"] {
            assert!(validate_filter(bad, &LIMITS).is_err(), "{bad}");
        }
        let long = "a".repeat(65);
        assert_eq!(
            validate_filter(&long, &LIMITS),
            Err(TopicError::TooLong { len: 65, max: 64 })
        );
    }

    #[test]
    fn names_are_validated() {
        assert_eq!(validate_name(b"a/b", &LIMITS), Ok("a/b"));
        assert_eq!(
            validate_name(b"a/+", &LIMITS),
            Err(TopicError::WildcardInName)
        );
        assert_eq!(validate_name(b"", &LIMITS), Err(TopicError::Empty));
        assert_eq!(
            validate_name(&[0xff, 0xfe], &LIMITS),
            Err(TopicError::NotUtf8)
        );
        assert!(validate_name(b"a/b/c/d/e", &LIMITS).is_err());
    }

    /// The character-by-character checks the one-pass scan replaced, as the reference.
    fn reference_name<'a>(raw: &'a [u8], limits: &TopicLimits) -> Result<&'a str, TopicError> {
        if raw.is_empty() {
            return Err(TopicError::Empty);
        }
        if raw.len() > limits.max_len {
            return Err(TopicError::TooLong {
                len: raw.len(),
                max: limits.max_len,
            });
        }
        let text = std::str::from_utf8(raw).map_err(|_| TopicError::NotUtf8)?;
        if text.contains('\0') {
            return Err(TopicError::Nul);
        }
        let levels = text.split('/').count();
        if levels > limits.max_levels {
            return Err(TopicError::TooManyLevels {
                levels,
                max: limits.max_levels,
            });
        }
        if text.contains(['+', '#']) {
            return Err(TopicError::WildcardInName);
        }
        Ok(text)
    }

    proptest::proptest! {
        #[test]
        fn names_are_judged_as_the_reference_judges_them(
            parts in proptest::collection::vec(
                proptest::prop_oneof![
                    proptest::prelude::Just(b"/".to_vec()),
                    proptest::prelude::Just(b"+".to_vec()),
                    proptest::prelude::Just(b"#".to_vec()),
                    proptest::prelude::Just(b"\0".to_vec()),
                    proptest::prelude::Just("é€𝄞".as_bytes().to_vec()),
                    proptest::collection::vec(proptest::prelude::any::<u8>(), 0..4),
                    proptest::prelude::Just(b"dev".to_vec()),
                ],
                0..12,
            ),
        ) {
            let raw = parts.concat();
            proptest::prop_assert_eq!(validate_name(&raw, &LIMITS), reference_name(&raw, &LIMITS));
            // The frame's name, shared: judged the same, and the same text when valid.
            let shared = shared_name(Bytes::from(raw.clone()), &LIMITS);
            proptest::prop_assert_eq!(
                shared.as_deref().map_err(Clone::clone),
                reference_name(&raw, &LIMITS)
            );
        }
    }

    #[test]
    fn levels_are_indexed_from_zero() {
        assert_eq!(level("site/dev-7/temp", 1), Some("dev-7"));
        assert_eq!(level("site", 1), None);
    }
}
