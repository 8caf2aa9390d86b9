//! A topic's own settings, given when it was created (a Kafka client's CreateTopics configs such
//! as `max.message.bytes`): `topics/<name>/topic.config`, a checksummed list of key/value text
//! pairs. The log keeps them and hands them back; what a key means is its user's business (the
//! Kafka listener's). Written by temp file + fdatasync + rename + directory fsync before
//! `topic.meta`, the topic's commit point, so a topic that exists has its settings complete or
//! had none; removed with the topic's directory. A topic without the file has no settings.
//!
//! Layout (little-endian): `TERNTCF\0`, version u16, reserved u16, entry count u16, then per
//! entry key length u16, key (UTF-8), value length u16, value (UTF-8), and last the CRC32C of
//! every byte before it.

use std::collections::BTreeMap;
use std::path::Path;

use super::batch::{DecodeError, FILE_VERSION_1, Reader, check_version};
use super::error::{LogError, Result};
use super::fs::{self, Fs};

/// Key → value, in key order.
pub type TopicConfig = BTreeMap<String, String>;

/// File name of a topic's settings inside its directory.
pub const TOPIC_CONFIG: &str = "topic.config";
const MAGIC: [u8; 8] = *b"TERNTCF\0";
/// Most entries one topic keeps.
pub const MAX_ENTRIES: usize = 64;
/// Longest key or value, in bytes.
pub const MAX_TEXT: usize = 1024;

/// Why a topic's settings cannot be kept: the reason names the entry.
pub fn check(config: &TopicConfig) -> std::result::Result<(), String> {
    if config.len() > MAX_ENTRIES {
        return Err(format!("at most {MAX_ENTRIES} settings per topic"));
    }
    match config
        .iter()
        .find(|(k, v)| k.is_empty() || k.len() > MAX_TEXT || v.len() > MAX_TEXT)
    {
        Some((key, _)) => Err(format!(
            "setting {key:?}: a key of 1 to {MAX_TEXT} bytes and a value of at most {MAX_TEXT}"
        )),
        None => Ok(()),
    }
}

/// The file's bytes; `config` must pass [`check`].
pub fn encode(config: &TopicConfig) -> Vec<u8> {
    let mut out = Vec::with_capacity(18 + config.len() * 32);
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&FILE_VERSION_1.to_le_bytes());
    out.extend_from_slice(&0u16.to_le_bytes());
    let count = u16::try_from(config.len()).unwrap_or(u16::MAX);
    out.extend_from_slice(&count.to_le_bytes());
    for (key, value) in config.iter().take(usize::from(count)) {
        for text in [key, value] {
            let len = u16::try_from(text.len()).unwrap_or(u16::MAX);
            out.extend_from_slice(&len.to_le_bytes());
            out.extend_from_slice(text.as_bytes().get(..usize::from(len)).unwrap_or_default());
        }
    }
    let crc = crc32c::crc32c(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

/// The settings stored in a file's bytes.
pub fn decode(bytes: &[u8]) -> std::result::Result<TopicConfig, DecodeError> {
    let body_len = bytes
        .len()
        .checked_sub(4)
        .ok_or(DecodeError::Incomplete { needed: 18 })?;
    let (body, crc) = bytes.split_at(body_len);
    let mut r = Reader::new(body);
    if r.take(8)? != MAGIC {
        return Err(DecodeError::Corrupt("not a tern topic settings file"));
    }
    let version = r.u16()?;
    let stored = Reader::new(crc).u32()?;
    let got = crc32c::crc32c(body);
    if stored != got {
        return Err(DecodeError::Checksum {
            expected: stored,
            got,
        });
    }
    check_version(version)?;
    let _reserved = r.u16()?;
    let count = r.u16()?;
    let mut config = TopicConfig::new();
    for _ in 0..count {
        let mut text = || -> std::result::Result<String, DecodeError> {
            let len = r.u16()?;
            let raw = r.take(usize::from(len))?;
            String::from_utf8(raw.to_vec())
                .map_err(|_| DecodeError::Corrupt("topic setting that is not UTF-8"))
        };
        let key = text()?;
        let value = text()?;
        if config.insert(key, value).is_some() {
            return Err(DecodeError::Corrupt("topic setting given twice"));
        }
    }
    if !r.is_empty() {
        return Err(DecodeError::Corrupt("bytes after the topic settings"));
    }
    Ok(config)
}

/// Writes a topic's settings (before its `topic.meta`); nothing for no settings.
pub fn write(fs: &dyn Fs, topic_dir: &Path, config: &TopicConfig) -> Result<()> {
    if config.is_empty() {
        return Ok(());
    }
    let path = topic_dir.join(TOPIC_CONFIG);
    fs::write_atomic(fs, &path, &encode(config), fs::NewFile::Plain)
        .map_err(|e| LogError::io("write", &path, e))
}

/// A topic's settings: none without the file. A damaged file is reported and read as none (the
/// records do not depend on it); a newer format's was refused before the log opened.
pub fn read(fs: &dyn Fs, topic_dir: &Path) -> TopicConfig {
    let path = topic_dir.join(TOPIC_CONFIG);
    let Ok(bytes) = fs.read(&path) else {
        return TopicConfig::new();
    };
    decode(&bytes).unwrap_or_else(|err| {
        tracing::warn!(path = %path.display(), %err, "ignoring the topic's damaged settings");
        TopicConfig::new()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sample() -> TopicConfig {
        TopicConfig::from([("max.message.bytes".to_owned(), "51200".to_owned())])
    }

    #[test]
    fn golden_bytes() {
        let bytes = encode(&sample());
        let mut want = b"TERNTCF\0\x01\x00\x00\x00\x01\x00".to_vec();
        want.extend_from_slice(b"\x11\x00max.message.bytes\x05\x0051200");
        assert_eq!(bytes.get(..bytes.len() - 4), Some(&want[..]));
        assert_eq!(decode(&bytes), Ok(sample()));
        assert_eq!(decode(&encode(&TopicConfig::new())), Ok(TopicConfig::new()));
    }

    #[test]
    fn damage_and_newer_versions_are_told_apart() {
        let bytes = encode(&sample());
        let mut flipped = bytes.clone();
        if let Some(b) = flipped.get_mut(20) {
            *b ^= 1;
        }
        assert!(matches!(
            decode(&flipped),
            Err(DecodeError::Checksum { .. })
        ));
        let mut newer = bytes.clone();
        newer.truncate(newer.len() - 4);
        if let Some(v) = newer.get_mut(8) {
            *v = 3;
        }
        let crc = crc32c::crc32c(&newer);
        newer.extend_from_slice(&crc.to_le_bytes());
        assert_eq!(
            decode(&newer),
            Err(DecodeError::UnsupportedVersion {
                found: 3,
                supported: crate::batch::FORMAT_VERSION
            })
        );
        assert!(decode(&[]).is_err());
    }

    #[test]
    fn check_bounds_what_is_kept() {
        assert!(check(&sample()).is_ok());
        let long = TopicConfig::from([("k".to_owned(), "v".repeat(MAX_TEXT + 1))]);
        assert!(check(&long).is_err());
        let empty_key = TopicConfig::from([(String::new(), "v".to_owned())]);
        assert!(check(&empty_key).is_err());
    }

    proptest! {
        #[test]
        fn round_trips(config in prop::collection::btree_map("[a-z.]{1,40}", ".{0,40}", 0..8)) {
            prop_assert_eq!(decode(&encode(&config)), Ok(config));
        }

        #[test]
        fn any_bytes_decode_or_refuse_without_panicking(bytes in prop::collection::vec(any::<u8>(), 0..200)) {
            let _ = decode(&bytes);
        }

        #[test]
        fn any_corruption_of_a_valid_file_is_refused(
            config in prop::collection::btree_map("[a-z.]{1,20}", "[0-9]{0,12}", 1..5),
            at in any::<prop::sample::Index>(),
            flip in 1u8..=255,
        ) {
            let mut bytes = encode(&config);
            let i = at.index(bytes.len());
            if let Some(b) = bytes.get_mut(i) {
                *b ^= flip;
            }
            prop_assert!(decode(&bytes).is_err());
        }
    }
}
