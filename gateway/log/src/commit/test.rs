use super::*;
use crate::fs::{Fs, RealFs};

#[test]
fn small_commits_zero_ahead_once_per_chunk_large_ones_never() -> std::io::Result<()> {
    let dir = std::env::temp_dir().join(format!("tern-zero-ahead-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let file = RealFs.create(&dir.join("s.log"))?;
    file.set_len(1 << 20)?;
    file.write_at(0, &[7; 100])?;
    let (to, zeros) = zero_ahead(&*file, 100, 100, 32);
    assert_eq!(
        (to, zeros as u64),
        (4096 + ZERO_AHEAD, 4096 + ZERO_AHEAD - 100)
    );
    let mut back = vec![1u8; zeros];
    file.read_at(100, &mut back)?;
    assert!(back.iter().all(|&b| b == 0), "zeros written");
    // The next small commits land on written blocks: nothing to do.
    assert_eq!(zero_ahead(&*file, 5000, 100, to), (to, 0));
    // Near the frontier a small commit zeroes the next chunk, capped at the file's length.
    let (again, _) = zero_ahead(&*file, to - 10, 100, to);
    assert_eq!(again, (to.div_ceil(4096) * 4096 + ZERO_AHEAD).min(1 << 20));
    let (last, _) = zero_ahead(&*file, (1 << 20) - 10, 10, again);
    assert_eq!(last, 1 << 20, "never past the preallocated length");
    // A large commit converts its own extents.
    assert_eq!(
        zero_ahead(&*file, 200_000, ZERO_AHEAD_BELOW, 32),
        (200_000, 0)
    );
    std::fs::remove_dir_all(&dir)
}
