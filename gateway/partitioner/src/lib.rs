//! Kafka's default partitioner for keyed records: murmur2 of the key (seed 0x9747b28c), sign
//! bit cleared, modulo the partition count, bit for bit as the Java client
//! (`org.apache.kafka.common.utils.Utils.murmur2`, `toPositive`). tern applies it twice, so a
//! key lands where a Kafka producer would put it: tern-mqtt picks a routed publish's log
//! partition with it, and tern-upstream's shared mode the upstream partition. The storage engine
//! never partitions by key: it stores in the partition it is given.
//!
//! Pure functions, no dependencies; pinned against Kafka's own test vectors below.
#![no_std]
#![deny(clippy::unwrap_used, clippy::indexing_slicing)]

/// The partition of a keyed record among `partitions` (0 when there are none):
/// `toPositive(murmur2(key)) % partitions`.
pub fn partition_for_key(key: &[u8], partitions: u32) -> u32 {
    // Any hash modulo one is 0: a topic of one partition (the default) hashes nothing.
    if partitions <= 1 {
        return 0;
    }
    (murmur2(key) & 0x7fff_ffff) % partitions
}

/// Kafka's murmur2 (seed 0x9747b28c).
pub fn murmur2(data: &[u8]) -> u32 {
    const M: u32 = 0x5bd1_e995;
    let len = u32::try_from(data.len()).unwrap_or(u32::MAX);
    let mut h: u32 = 0x9747_b28c ^ len;
    let mut chunks = data.chunks_exact(4);
    for chunk in &mut chunks {
        let mut word = [0u8; 4];
        word.copy_from_slice(chunk);
        let mut k = u32::from_le_bytes(word).wrapping_mul(M);
        k ^= k >> 24;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M) ^ k;
    }
    let tail = chunks.remainder();
    for (i, byte) in tail.iter().enumerate().rev() {
        h ^= u32::from(*byte) << (8 * i);
    }
    if !tail.is_empty() {
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^ (h >> 15)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Kafka's `UtilsTest.testMurmur2`.
    #[test]
    fn murmur2_matches_kafka() {
        let cases: [(&[u8], i32); 6] = [
            (b"21", -973_932_308),
            (b"foobar", -790_332_482),
            (b"a-little-bit-long-string", -985_981_536),
            (b"a-little-bit-longer-string", -1_486_304_829),
            (
                b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8",
                -58_897_971,
            ),
            (b"abc", 479_470_107),
        ];
        for (key, expected) in cases {
            assert_eq!(murmur2(key) as i32, expected, "{key:?}");
        }
    }

    #[test]
    fn partitions_clear_the_sign_bit_like_to_positive() {
        // toPositive(-790332482) = 1357151166; % 10 = 6.
        assert_eq!(partition_for_key(b"foobar", 10), 6);
        for input in [&b"21"[..], b"abc", b"a-little-bit-long-string"] {
            assert!(partition_for_key(input, 3) < 3);
        }
        assert_eq!(partition_for_key(b"x", 0), 0);
        for input in [&b""[..], b"21", b"foobar"] {
            assert_eq!(partition_for_key(input, 1), 0, "{input:?}");
        }
    }
}
