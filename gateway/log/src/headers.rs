//! A record's headers: a list of names and values (what producers build and what a read gives
//! back), or already in the log's encoding, as a slice of a buffer the producer shares between
//! many records (tern-mqtt's ingest: no allocation per record, and the writer copies them in
//! one piece; issue #29). Either way they mean the same headers, compare equal, and lie on disk
//! as the same bytes.

use bytes::{BufMut, Bytes, BytesMut};

use super::batch;
use super::{HeaderName, HeaderValue};

/// The headers of one [`super::Record`], in order (names may repeat).
#[derive(Clone, Default)]
pub struct Headers(Repr);

#[derive(Clone)]
enum Repr {
    List(Vec<(HeaderName, HeaderValue)>),
    /// `count` headers as [`batch`] encodes them (without the count), built by
    /// [`Headers::encode_in`] only, so well formed.
    Encoded {
        count: usize,
        bytes: Bytes,
    },
}

impl Default for Repr {
    fn default() -> Self {
        Self::List(Vec::new())
    }
}

impl Headers {
    /// No headers.
    pub fn new() -> Self {
        Self::default()
    }

    /// Encodes `entries` at the end of `arena` and keeps them as a slice of it. A producer that
    /// makes many records at once gives them all one arena, sized by [`Headers::encoded_size`]:
    /// one allocation for all their headers, freed with the last of them.
    pub fn encode_in(arena: &mut BytesMut, entries: &[(&str, &[u8])]) -> Self {
        Self::encode_in_with(arena, entries, &HeaderBlock::default())
    }

    /// [`Headers::encode_in`] of `entries` followed by the headers of `block`, encoded once for
    /// many records (tern-mqtt: the QoS, retain flag and client id a batch's records share).
    /// The arena takes [`Headers::encoded_size`] of `entries` plus [`HeaderBlock::len`].
    pub fn encode_in_with(
        arena: &mut BytesMut,
        entries: &[(&str, &[u8])],
        block: &HeaderBlock,
    ) -> Self {
        arena.reserve(Self::encoded_size(entries) + block.bytes.len());
        for (name, value) in entries {
            put_bytes(arena, name.as_bytes());
            put_bytes(arena, value);
        }
        arena.put_slice(&block.bytes);
        Self(Repr::Encoded {
            count: entries.len() + block.count,
            bytes: arena.split().freeze(),
        })
    }

    /// The bytes [`Headers::encode_in`] adds to its arena for `entries`.
    #[inline]
    pub fn encoded_size(entries: &[(&str, &[u8])]) -> usize {
        entries
            .iter()
            .map(|(name, value)| entry_len(name, value))
            .sum()
    }

    /// How many headers there are.
    pub fn len(&self) -> usize {
        match &self.0 {
            Repr::List(list) => list.len(),
            Repr::Encoded { count, .. } => *count,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The headers, in order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &[u8])> + '_ {
        let (list, encoded) = match &self.0 {
            Repr::List(list) => (Some(list.iter().map(|(n, v)| (&**n, &**v))), None),
            Repr::Encoded { count, bytes } => (None, Some(batch::headers(bytes, *count))),
        };
        list.into_iter()
            .flatten()
            .chain(encoded.into_iter().flatten())
    }

    /// The value of the first header called `name`.
    pub fn get(&self, name: &str) -> Option<&[u8]> {
        self.iter().find(|(n, _)| *n == name).map(|(_, v)| v)
    }

    /// Adds a header at the end.
    pub fn push(&mut self, header: (HeaderName, HeaderValue)) {
        self.extend([header]);
    }

    /// Keeps only the headers `keep` accepts (encoded headers become a list first).
    pub fn retain(&mut self, keep: impl FnMut(&(HeaderName, HeaderValue)) -> bool) {
        let mut list = self.take_list();
        list.retain(keep);
        self.0 = Repr::List(list);
    }

    /// The list, taken out (copied out of an encoded form); the headers are empty after.
    fn take_list(&mut self) -> Vec<(HeaderName, HeaderValue)> {
        match std::mem::take(&mut self.0) {
            Repr::List(list) => list,
            encoded => Headers(encoded).to_vec(),
        }
    }

    /// The headers as a list (copied out of an encoded form).
    pub fn to_vec(&self) -> Vec<(HeaderName, HeaderValue)> {
        match &self.0 {
            Repr::List(list) => list.clone(),
            Repr::Encoded { .. } => self
                .iter()
                .map(|(n, v)| (n.to_owned().into(), Bytes::copy_from_slice(v)))
                .collect(),
        }
    }

    /// The headers as a [`super::RecordView`] holds them: an encoded form as if read from a
    /// segment, so a view's iterator has the two forms it always had.
    pub(crate) fn view(&self) -> super::HeadersView<'_> {
        match &self.0 {
            Repr::List(list) => super::HeadersView::Owned(list),
            Repr::Encoded { count, bytes } => super::HeadersView::Encoded {
                count: *count,
                bytes,
            },
        }
    }

    /// Bytes of the headers' encoding in a batch, the count included.
    pub(crate) fn encoded_len(&self) -> usize {
        let entries = match &self.0 {
            Repr::List(list) => list.iter().map(|(n, v)| entry_len(n, v)).sum(),
            Repr::Encoded { bytes, .. } => bytes.len(),
        };
        batch::uvarint_len(self.len() as u64) + entries
    }

    /// Appends the headers' encoding in a batch, the count first.
    pub(crate) fn encode(&self, out: &mut Vec<u8>) {
        batch::put_uvarint(out, self.len() as u64);
        match &self.0 {
            Repr::List(list) => {
                for (name, value) in list {
                    batch::put_bytes(out, name.as_bytes());
                    batch::put_bytes(out, value);
                }
            }
            Repr::Encoded { bytes, .. } => out.extend_from_slice(bytes),
        }
    }
}

/// Bytes of one header in the record encoding: its name and value, each after its length.
#[inline]
fn entry_len(name: &str, value: &[u8]) -> usize {
    batch::uvarint_len(name.len() as u64)
        + name.len()
        + batch::uvarint_len(value.len() as u64)
        + value.len()
}

/// Whole headers encoded once, for [`Headers::encode_in_with`] to copy into many records.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HeaderBlock {
    count: usize,
    bytes: Vec<u8>,
}

impl HeaderBlock {
    /// No headers.
    pub const EMPTY: Self = Self {
        count: 0,
        bytes: Vec::new(),
    };

    /// The block of `entries`, in order.
    pub fn new(entries: &[(&str, &[u8])]) -> Self {
        let mut bytes = Vec::with_capacity(Headers::encoded_size(entries));
        for (name, value) in entries {
            batch::put_bytes(&mut bytes, name.as_bytes());
            batch::put_bytes(&mut bytes, value);
        }
        Self {
            count: entries.len(),
            bytes,
        }
    }

    /// The bytes the block adds to a record's headers.
    pub fn len(&self) -> usize {
        self.bytes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }
}

#[inline]
fn put_bytes(out: &mut BytesMut, bytes: &[u8]) {
    let mut v = bytes.len() as u64;
    while v >= 0x80 {
        out.put_u8((v as u8) | 0x80);
        v >>= 7;
    }
    out.put_u8(v as u8);
    out.put_slice(bytes);
}

impl From<Vec<(HeaderName, HeaderValue)>> for Headers {
    fn from(list: Vec<(HeaderName, HeaderValue)>) -> Self {
        Self(Repr::List(list))
    }
}

/// Adds headers at the end (encoded headers become a list first).
impl Extend<(HeaderName, HeaderValue)> for Headers {
    fn extend<I: IntoIterator<Item = (HeaderName, HeaderValue)>>(&mut self, iter: I) {
        let mut list = self.take_list();
        list.extend(iter);
        self.0 = Repr::List(list);
    }
}

impl FromIterator<(HeaderName, HeaderValue)> for Headers {
    fn from_iter<I: IntoIterator<Item = (HeaderName, HeaderValue)>>(iter: I) -> Self {
        Self(Repr::List(iter.into_iter().collect()))
    }
}

impl PartialEq for Headers {
    fn eq(&self, other: &Self) -> bool {
        self.len() == other.len() && self.iter().eq(other.iter())
    }
}

impl Eq for Headers {}

impl std::fmt::Debug for Headers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.iter().map(|(n, v)| (n, Bytes::copy_from_slice(v))))
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn entries() -> impl Strategy<Value = Vec<(String, Vec<u8>)>> {
        proptest::collection::vec(
            (".{0,20}", proptest::collection::vec(any::<u8>(), 0..300)),
            0..6,
        )
    }

    proptest! {
        /// Encoded headers are the list they were made from: the same entries, equal, the
        /// same bytes in a batch, and a list once pushed to.
        #[test]
        fn encoded_headers_are_the_list_they_came_from(entries in entries(), more in entries()) {
            let borrowed: Vec<(&str, &[u8])> =
                entries.iter().map(|(n, v)| (n.as_str(), v.as_slice())).collect();
            let list: Headers = entries
                .iter()
                .map(|(n, v)| (HeaderName::from(n.clone()), Bytes::from(v.clone())))
                .collect();
            let mut arena = BytesMut::new();
            let first = Headers::encode_in(&mut arena, &[("before", b"x")]);
            let encoded = Headers::encode_in(&mut arena, &borrowed);
            // The same entries, split anywhere between the record's own and a shared block.
            let split = entries.len() / 2;
            let block = HeaderBlock::new(borrowed.get(split..).unwrap_or_default());
            let joined = Headers::encode_in_with(
                &mut arena,
                borrowed.get(..split).unwrap_or_default(),
                &block,
            );
            prop_assert_eq!(&joined, &encoded);
            // A view of a record holding them reads the same headers.
            let record = crate::Record {
                timestamp_ms: 0,
                key: None,
                value: Bytes::new(),
                headers: encoded.clone(),
            };
            let view = crate::RecordView::of(&record);
            prop_assert_eq!(view.header_count(), entries.len());
            prop_assert!(view.headers().eq(borrowed.iter().copied()));
            prop_assert_eq!(arena.len(), 0);
            prop_assert_eq!(first.get("before"), Some(&b"x"[..]));
            prop_assert_eq!(&encoded, &list);
            prop_assert_eq!(encoded.len(), entries.len());
            prop_assert!(encoded.iter().eq(borrowed.iter().copied()));
            prop_assert_eq!(encoded.to_vec(), list.to_vec());
            let (mut a, mut b) = (Vec::new(), Vec::new());
            encoded.encode(&mut a);
            list.encode(&mut b);
            prop_assert_eq!(&a, &b);
            prop_assert_eq!(a.len(), encoded.encoded_len());
            prop_assert_eq!(b.len(), list.encoded_len());
            if let Some((name, _)) = entries.first() {
                prop_assert_eq!(encoded.get(name), list.get(name));
            }
            let (mut encoded, mut list) = (encoded, list);
            for (n, v) in &more {
                encoded.push((n.clone().into(), v.clone().into()));
                list.push((n.clone().into(), v.clone().into()));
            }
            prop_assert_eq!(&encoded, &list);
            prop_assert_eq!(encoded.len(), entries.len() + more.len());
        }
    }
}
