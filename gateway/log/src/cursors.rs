//! The cursor store: named durable positions (forwarders, MQTT sessions, consumer groups) as an
//! append-only file `cursors.log` of CRC-protected updates, replaced by a compact snapshot
//! (temp file + fdatasync + rename + directory fsync) when it grows. Read back on open, entry by
//! entry: every entry whose own CRC holds is kept, damage (even over the header) is skipped and
//! the damaged file kept aside; a torn tail is dropped. Retention asks it for the lowest
//! position of a partition.
//!
//! It stores positions only; it never reads or deletes records.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use super::batch::{DecodeError, FILE_VERSION_1, FORMAT_VERSION, Reader};
use super::error::{LogError, Result};
use super::fs::{Fs, WriteFile};
use super::stats::Counters;

const MAGIC: [u8; 8] = *b"TERNCUR\0";
const HEADER_LEN: u64 = 12;
/// File name inside the log directory.
pub const CURSORS_FILE: &str = "cursors.log";
/// The file is compacted once it is larger than this and four times its live content.
const COMPACT_AT: u64 = 64 * 1024;

/// Longest cursor or topic name stored.
const MAX_NAME: usize = 1024;

type Key = (String, String, u32);

#[derive(Debug)]
struct Inner {
    fs: Arc<dyn Fs>,
    dir: PathBuf,
    counters: Arc<Counters>,
    positions: Mutex<BTreeMap<Key, u64>>,
    file: Mutex<(Arc<dyn WriteFile>, u64)>,
}

/// Named durable positions. Cheap to clone.
#[derive(Debug, Clone)]
pub struct CursorStore {
    inner: Arc<Inner>,
}

enum Update {
    Set(Key, u64),
    Remove(String),
}

fn encode(update: &Update) -> Vec<u8> {
    let mut body = Vec::new();
    let put_str = |body: &mut Vec<u8>, s: &str| {
        let len = u16::try_from(s.len()).unwrap_or(u16::MAX);
        body.extend_from_slice(&len.to_le_bytes());
        body.extend_from_slice(s.as_bytes().get(..usize::from(len)).unwrap_or_default());
    };
    match update {
        Update::Set((name, topic, partition), offset) => {
            body.push(1);
            put_str(&mut body, name);
            put_str(&mut body, topic);
            body.extend_from_slice(&partition.to_le_bytes());
            body.extend_from_slice(&offset.to_le_bytes());
        }
        Update::Remove(name) => {
            body.push(2);
            put_str(&mut body, name);
        }
    }
    let len = u32::try_from(body.len() + 8).unwrap_or(u32::MAX);
    let mut out = len.to_le_bytes().to_vec();
    let crc = crc32c::crc32c_append(crc32c::crc32c(&out), &body);
    out.extend_from_slice(&crc.to_le_bytes());
    out.extend_from_slice(&body);
    out
}

fn decode_one(r: &mut Reader<'_>) -> Result<Update, DecodeError> {
    let len = r.u32()? as usize;
    let crc = r.u32()?;
    let body = r.take(
        len.checked_sub(8)
            .ok_or(DecodeError::Corrupt("short cursor entry"))?,
    )?;
    let got = crc32c::crc32c_append(crc32c::crc32c(&(len as u32).to_le_bytes()), body);
    if got != crc {
        return Err(DecodeError::Checksum { expected: crc, got });
    }
    let mut b = Reader::new(body);
    let string = |b: &mut Reader<'_>| -> Result<String, DecodeError> {
        let n = usize::from(b.u16()?);
        String::from_utf8(b.take(n)?.to_vec())
            .map_err(|_| DecodeError::Corrupt("cursor name is not UTF-8"))
    };
    let [kind] = <[u8; 1]>::try_from(b.take(1)?).map_err(|_| DecodeError::Corrupt("kind"))?;
    match kind {
        1 => {
            let name = string(&mut b)?;
            let topic = string(&mut b)?;
            Ok(Update::Set((name, topic, b.u32()?), b.u64()?))
        }
        2 => Ok(Update::Remove(string(&mut b)?)),
        _ => Err(DecodeError::Corrupt("unknown cursor entry kind")),
    }
}

/// What replaying a cursor file found.
#[derive(Debug, Default)]
struct Replayed {
    map: BTreeMap<Key, u64>,
    /// Entries read back.
    entries: usize,
    /// End of the last valid entry (0 if there is none and no valid header).
    valid: u64,
    /// Whether the file starts with a valid header.
    header_ok: bool,
    /// Damaged byte ranges with valid entries after them (skipped).
    skipped: Vec<std::ops::Range<u64>>,
}

/// Longest entry a writer produces: two names, partition and offset, framing.
const MAX_ENTRY: usize = 8 + 1 + 2 * (2 + MAX_NAME) + 4 + 8;

/// The entry starting at `pos`, if one whose own CRC matches does, and its length.
fn entry_at(bytes: &[u8], pos: usize) -> Option<(Update, usize)> {
    let rest = bytes.get(pos..)?;
    let len = rest
        .get(..4)
        .and_then(|b| <[u8; 4]>::try_from(b).ok())
        .map(u32::from_le_bytes)? as usize;
    if !(9..=MAX_ENTRY).contains(&len) || len > rest.len() {
        return None;
    }
    let mut r = Reader::new(rest.get(..len)?);
    decode_one(&mut r).ok().map(|update| (update, len))
}

/// Replays a cursor file: every entry whose own check is valid, in order, resyncing past damage
/// (the header included) on the next valid entry.
fn replay(bytes: &[u8]) -> Replayed {
    let mut out = Replayed::default();
    let mut r = Reader::new(bytes);
    out.header_ok = r.take(8).is_ok_and(|m| m == MAGIC)
        && r.u16().is_ok_and(|v| (1..=FORMAT_VERSION).contains(&v))
        && r.u16().is_ok();
    let mut pos = if out.header_ok {
        HEADER_LEN as usize
    } else {
        0
    };
    let mut damaged_from = (!out.header_ok).then_some(0);
    while pos < bytes.len() {
        match entry_at(bytes, pos) {
            Some((update, len)) => {
                if let Some(from) = damaged_from.take() {
                    out.skipped.push(from as u64..pos as u64);
                }
                apply(&mut out.map, update);
                out.entries += 1;
                pos += len;
                out.valid = pos as u64;
            }
            None => {
                damaged_from.get_or_insert(pos);
                pos += 1;
            }
        }
    }
    if out.header_ok && out.valid == 0 {
        out.valid = HEADER_LEN;
    }
    out
}

/// The version in a cursor log's header, if the file starts with the cursor log's magic.
pub fn header_version(bytes: &[u8]) -> Option<u16> {
    let mut r = Reader::new(bytes);
    r.take(8).ok().filter(|m| *m == MAGIC)?;
    r.u16().ok()
}

/// What `tern log verify` reports of a cursor file.
#[derive(Debug)]
pub struct CursorCheck {
    pub positions: usize,
    pub header_ok: bool,
    /// Damaged byte ranges with valid entries after them.
    pub skipped: Vec<std::ops::Range<u64>>,
    /// End of the last valid entry; bytes after it are a torn tail.
    pub valid: u64,
}

/// For `tern log verify`: what replaying `bytes` finds, without changing anything.
pub fn check_for_tools(bytes: &[u8]) -> CursorCheck {
    let replayed = replay(bytes);
    CursorCheck {
        positions: replayed.map.len(),
        header_ok: replayed.header_ok,
        skipped: replayed.skipped,
        valid: replayed.valid,
    }
}

fn apply(map: &mut BTreeMap<Key, u64>, update: Update) {
    match update {
        Update::Set(key, offset) => {
            map.insert(key, offset);
        }
        Update::Remove(name) => map.retain(|(n, _, _), _| *n != name),
    }
}

fn snapshot(map: &BTreeMap<Key, u64>) -> Vec<u8> {
    let mut out = MAGIC.to_vec();
    out.extend_from_slice(&FILE_VERSION_1.to_le_bytes());
    out.extend_from_slice(&0u16.to_le_bytes());
    for (key, offset) in map {
        out.extend_from_slice(&encode(&Update::Set(key.clone(), *offset)));
    }
    out
}

/// Writes `map` as the new cursor file, atomically; returns its handle and length.
fn write_snapshot(
    fs: &dyn Fs,
    counters: &Counters,
    dir: &Path,
    map: &BTreeMap<Key, u64>,
) -> Result<(Arc<dyn WriteFile>, u64)> {
    let path = dir.join(CURSORS_FILE);
    let data = snapshot(map);
    counters.wrote(data.len());
    counters
        .timed_sync(|| super::fs::write_atomic(fs, &path, &data, super::fs::NewFile::Plain))
        .map_err(|e| LogError::io("write", &path, e))?;
    let file = fs
        .open_write(&path)
        .map_err(|e| LogError::io("open", &path, e))?;
    Ok((file, data.len() as u64))
}

/// Keeps a damaged cursor file beside the log for the operator and says what was salvaged.
fn salvaged(fs: &dyn Fs, path: &Path, replayed: &Replayed, len: u64) -> Result<()> {
    let now = tern_core::time::now_ms();
    let mut kept = path.as_os_str().to_owned();
    kept.push(format!(".damaged-{now}"));
    let kept = PathBuf::from(kept);
    fs.rename(path, &kept)
        .map_err(|e| LogError::io("rename", path, e))?;
    let lost: u64 = replayed
        .skipped
        .iter()
        .map(|r| r.end - r.start)
        .sum::<u64>()
        + (len - replayed.valid.min(len));
    tracing::warn!(
        path = %path.display(),
        kept = %kept.display(),
        header_ok = replayed.header_ok,
        damaged = ?replayed.skipped,
        bytes_lost = lost,
        entries = replayed.entries,
        positions = replayed.map.len(),
        "cursor log damaged: salvaged every entry whose own check is valid; a position updated only in the damaged bytes is older than it was or missing (an MQTT session missing one is redelivered from the earliest retained record)"
    );
    Ok(())
}

impl Inner {
    fn path(&self) -> PathBuf {
        self.dir.join(CURSORS_FILE)
    }

    fn positions(&self) -> MutexGuard<'_, BTreeMap<Key, u64>> {
        self.positions
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Appends one update durably, then applies it (compacting when the file is large).
    fn write(&self, update: Update) -> Result<()> {
        let entry = encode(&update);
        let path = self.path();
        let mut file = self.file.lock().unwrap_or_else(PoisonError::into_inner);
        let (handle, len) = (Arc::clone(&file.0), file.1);
        handle
            .write_at(len, &entry)
            .map_err(|e| LogError::io("write", &path, e))?;
        self.counters.wrote(entry.len());
        self.counters
            .timed_sync(|| handle.sync_data())
            .map_err(|e| LogError::io("fdatasync", &path, e))?;
        file.1 = len + entry.len() as u64;
        let map = {
            let mut positions = self.positions();
            apply(&mut positions, update);
            positions.clone()
        };
        let live = snapshot(&map).len() as u64;
        if file.1 > COMPACT_AT && file.1 > 4 * live {
            *file = write_snapshot(&*self.fs, &self.counters, &self.dir, &map)?;
        }
        Ok(())
    }
}

impl CursorStore {
    /// Reads back (or creates) `dir/cursors.log`; a torn tail is dropped by rewriting a snapshot.
    pub(crate) fn open(fs: Arc<dyn Fs>, dir: &Path, counters: Arc<Counters>) -> Result<Self> {
        let path = dir.join(CURSORS_FILE);
        let bytes = if fs.exists(&path) {
            fs.read(&path).map_err(|e| LogError::io("read", &path, e))?
        } else {
            Vec::new()
        };
        if let Some(found) = header_version(&bytes).filter(|v| !(1..=FORMAT_VERSION).contains(v)) {
            return Err(LogError::UnsupportedVersion {
                path,
                what: "cursor log",
                found,
                supported: FORMAT_VERSION,
            });
        }
        let replayed = replay(&bytes);
        let len = bytes.len() as u64;
        let damaged = !bytes.is_empty() && (!replayed.header_ok || !replayed.skipped.is_empty());
        let opened = if !damaged && replayed.valid == len && replayed.valid >= HEADER_LEN {
            let file = fs
                .open_write(&path)
                .map_err(|e| LogError::io("open", &path, e))?;
            (file, replayed.valid)
        } else {
            if damaged {
                salvaged(&*fs, &path, &replayed, len)?;
            } else if !bytes.is_empty() {
                tracing::info!(path = %path.display(), valid = replayed.valid, len, "dropping the torn tail of the cursor log (an interrupted write)");
            }
            write_snapshot(&*fs, &counters, dir, &replayed.map)?
        };
        let map = replayed.map;
        let inner = Inner {
            fs,
            dir: dir.to_owned(),
            counters,
            positions: Mutex::new(map),
            file: Mutex::new(opened),
        };
        Ok(Self {
            inner: Arc::new(inner),
        })
    }

    /// Durably records that `name` has consumed everything before `offset` (next to read).
    pub async fn commit(&self, name: &str, topic: &str, partition: u32, offset: u64) -> Result<()> {
        if name.len() > MAX_NAME || topic.len() > MAX_NAME {
            return Err(LogError::InvalidAppend {
                topic: topic.to_owned(),
                reason: format!("cursor names are at most {MAX_NAME} bytes"),
            });
        }
        let key = (name.to_owned(), topic.to_owned(), partition);
        self.write(Update::Set(key, offset)).await
    }

    pub fn get(&self, name: &str, topic: &str, partition: u32) -> Option<u64> {
        let key = (name.to_owned(), topic.to_owned(), partition);
        self.inner.positions().get(&key).copied()
    }

    /// All cursors: (name, topic, partition, offset).
    pub fn list(&self) -> Vec<(String, String, u32, u64)> {
        let positions = self.inner.positions();
        positions
            .iter()
            .map(|((n, t, p), o)| (n.clone(), t.clone(), *p, *o))
            .collect()
    }

    /// Removes every position of `name` (durably).
    pub async fn remove(&self, name: &str) -> Result<()> {
        if name.len() > MAX_NAME {
            return Ok(());
        }
        self.write(Update::Remove(name.to_owned())).await
    }

    /// The lowest position any cursor holds in a partition.
    pub fn min_offset(&self, topic: &str, partition: u32) -> Option<u64> {
        let positions = self.inner.positions();
        positions
            .iter()
            .filter(|((_, t, p), _)| t == topic && *p == partition)
            .map(|(_, o)| *o)
            .min()
    }

    async fn write(&self, update: Update) -> Result<()> {
        let inner = Arc::clone(&self.inner);
        tokio::task::spawn_blocking(move || inner.write(update))
            .await
            .unwrap_or(Err(LogError::Closed))
    }

    /// Bytes of the cursor file (for tests of compaction).
    pub fn file_len(&self) -> u64 {
        self.inner
            .file
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A cursor file of `n` entries and where each entry starts and ends.
    fn file(n: u64) -> (Vec<u8>, Vec<std::ops::Range<usize>>) {
        let mut out = snapshot(&BTreeMap::new());
        let mut spans = Vec::new();
        for i in 0..n {
            let key = (format!("c{i}"), "t".to_owned(), 0);
            let start = out.len();
            out.extend_from_slice(&encode(&Update::Set(key, i * 10)));
            spans.push(start..out.len());
        }
        (out, spans)
    }

    proptest::proptest! {
        #[test]
        fn replay_never_panics_on_any_bytes(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..300)) {
            let _ = replay(&bytes);
        }

        /// Garbage over any stretch (the header included) loses only the entries it touches.
        #[test]
        fn garbage_loses_only_the_entries_it_covers(n in 1u64..20, at in 0usize..400, len in 1usize..30) {
            let (mut bytes, spans) = file(n);
            let at = at % bytes.len();
            let end = (at + len).min(bytes.len());
            for byte in bytes.get_mut(at..end).unwrap_or_default() {
                *byte = !*byte;
            }
            let replayed = replay(&bytes);
            for (i, span) in (0..n).zip(&spans) {
                let touched = span.start < end && at < span.end;
                let got = replayed.map.get(&(format!("c{i}"), "t".to_owned(), 0));
                if !touched {
                    proptest::prop_assert_eq!(got, Some(&(i * 10)));
                }
            }
        }
    }
}
