//! Human units in configuration files: byte sizes such as `"32KiB"` and durations such as
//! `"50ms"`. Both also accept a bare integer (bytes, milliseconds).

use std::fmt;
use std::time::Duration;

use serde::de::{self, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A size in bytes, written `4096`, `"4096"`, `"16KiB"`, `"64MiB"`, `"1GiB"` or `"10MB"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ByteSize(pub u64);

const UNITS: [(&str, u64); 9] = [
    ("GiB", 1 << 30),
    ("MiB", 1 << 20),
    ("KiB", 1 << 10),
    ("GB", 1_000_000_000),
    ("MB", 1_000_000),
    ("KB", 1_000),
    ("kB", 1_000),
    ("B", 1),
    ("", 1),
];

impl ByteSize {
    /// Parses `"64MiB"`-style text. Whitespace between number and unit is allowed.
    pub fn parse(text: &str) -> Result<Self, String> {
        let text = text.trim();
        let split = text
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(text.len());
        let (digits, unit) = text.split_at(split);
        let unit = unit.trim();
        let number: u64 = digits.parse().map_err(|_| {
            format!("`{text}` is not a size (examples: 4096, \"16KiB\", \"64MiB\")")
        })?;
        let (_, factor) = UNITS
            .iter()
            .find(|(name, _)| *name == unit)
            .ok_or_else(|| {
                format!("`{unit}` is not a size unit (use B, KiB, MiB, GiB, KB, MB, GB)")
            })?;
        number
            .checked_mul(*factor)
            .map(ByteSize)
            .ok_or_else(|| format!("`{text}` is too large"))
    }
}

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (name, factor) in &UNITS[..3] {
            if self.0 != 0 && self.0 % factor == 0 {
                return write!(f, "{}{name}", self.0 / factor);
            }
        }
        write!(f, "{}B", self.0)
    }
}

impl Serialize for ByteSize {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct SizeVisitor;
        impl Visitor<'_> for SizeVisitor {
            type Value = ByteSize;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a size such as 4096 or \"64MiB\"")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<ByteSize, E> {
                Ok(ByteSize(v))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<ByteSize, E> {
                u64::try_from(v)
                    .map(ByteSize)
                    .map_err(|_| E::custom(format!("a size cannot be negative ({v})")))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<ByteSize, E> {
                ByteSize::parse(v).map_err(E::custom)
            }
        }
        deserializer.deserialize_any(SizeVisitor)
    }
}

/// A duration, written `"50ms"`, `"5s"`, `"7days"`, `"1h 30m"` or a bare number of milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct HumanDuration(pub Duration);

impl fmt::Display for HumanDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", humantime::format_duration(self.0))
    }
}

impl std::str::FromStr for HumanDuration {
    type Err = String;

    /// `500ms`, `30s`, `5m`, `1h 30m`: humantime's syntax, as the configuration takes it.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        humantime::parse_duration(text)
            .map(HumanDuration)
            .map_err(|err| format!("`{text}` is not a duration: {err}"))
    }
}

impl Serialize for HumanDuration {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for HumanDuration {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct DurationVisitor;
        impl Visitor<'_> for DurationVisitor {
            type Value = HumanDuration;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a duration such as \"50ms\", \"5s\" or \"7days\"")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<HumanDuration, E> {
                Ok(HumanDuration(Duration::from_millis(v)))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<HumanDuration, E> {
                u64::try_from(v)
                    .map(|ms| HumanDuration(Duration::from_millis(ms)))
                    .map_err(|_| E::custom(format!("a duration cannot be negative ({v})")))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<HumanDuration, E> {
                humantime::parse_duration(v)
                    .map(HumanDuration)
                    .map_err(|err| E::custom(format!("`{v}` is not a duration: {err}")))
            }
        }
        deserializer.deserialize_any(DurationVisitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_binary_and_decimal_units() {
        assert_eq!(ByteSize::parse("4096"), Ok(ByteSize(4096)));
        assert_eq!(ByteSize::parse("16KiB"), Ok(ByteSize(16 * 1024)));
        assert_eq!(ByteSize::parse("64 MiB"), Ok(ByteSize(64 << 20)));
        assert_eq!(ByteSize::parse("10MB"), Ok(ByteSize(10_000_000)));
        assert!(ByteSize::parse("12XB").is_err());
        assert!(ByteSize::parse("").is_err());
        assert!(ByteSize::parse("99999999999GiB").is_err());
    }

    #[test]
    fn sizes_display_in_the_largest_exact_binary_unit() {
        assert_eq!(ByteSize(64 << 20).to_string(), "64MiB");
        assert_eq!(ByteSize(4096).to_string(), "4KiB");
        assert_eq!(ByteSize(1000).to_string(), "1000B");
        assert_eq!(ByteSize(0).to_string(), "0B");
        for size in [0, 1, 1023, 1024, 3 << 20, 5 << 30, 1_000_000] {
            assert_eq!(
                ByteSize::parse(&ByteSize(size).to_string()),
                Ok(ByteSize(size))
            );
        }
    }

    #[test]
    fn durations_round_trip_through_text() {
        for ms in [0, 5, 50, 1_000, 90_000, 7 * 86_400_000] {
            let d = HumanDuration(Duration::from_millis(ms));
            let back = humantime::parse_duration(&d.to_string()).expect("own output parses");
            assert_eq!(back, d.0);
        }
    }
}
