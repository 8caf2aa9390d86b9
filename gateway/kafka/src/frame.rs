//! Kafka's framing, spoken by the listener's connections (and read by `tern-bench`'s counting
//! proxy): a 4-byte big-endian size, then that many bytes, on a stream the caller owns. Knows
//! nothing about what a frame holds. (tern-upstream's client frames its own requests.)
//!
//! It never allocates more than the size prefix announces and the limit allows, and a short or
//! oversized frame is an error, never a panic.
#![expect(
    clippy::big_endian_bytes,
    reason = "Kafka's protocol is big-endian by definition"
)]

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// Why a frame could not be read.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// The size prefix is negative or larger than the reader accepts.
    #[error("frame of {size} bytes (at most {max} accepted)")]
    Size { size: i64, max: usize },
}

/// Reads one size-prefixed frame without its prefix; `Ok(None)` when the stream ends cleanly
/// before a frame starts.
pub async fn read_frame<R: AsyncRead + Unpin>(
    from: &mut R,
    max: usize,
) -> Result<Option<Vec<u8>>, FrameError> {
    let mut prefix = [0u8; 4];
    match from.read_exact(&mut prefix).await {
        Ok(_) => {}
        Err(err) if err.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(err) => return Err(err.into()),
    }
    let size = i32::from_be_bytes(prefix);
    let len = usize::try_from(size)
        .ok()
        .filter(|&len| len <= max)
        .ok_or(FrameError::Size {
            size: i64::from(size),
            max,
        })?;
    let mut frame = vec![0u8; len];
    from.read_exact(&mut frame).await?;
    Ok(Some(frame))
}

/// Writes the frame made of `parts` (header, body) with its size prefix.
pub async fn write_frame<W: AsyncWrite + Unpin>(
    to: &mut W,
    parts: &[&[u8]],
) -> std::io::Result<()> {
    let total: usize = parts.iter().map(|p| p.len()).sum();
    let size = i32::try_from(total)
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidInput, "frame over 2 GiB"))?;
    to.write_all(&size.to_be_bytes()).await?;
    for part in parts {
        to.write_all(part).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn read_all(bytes: &[u8], max: usize) -> Vec<Result<Option<Vec<u8>>, String>> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime");
        runtime.block_on(async {
            let mut reader = bytes;
            let mut out = Vec::new();
            loop {
                match read_frame(&mut reader, max).await {
                    Ok(Some(frame)) => out.push(Ok(Some(frame))),
                    Ok(None) => {
                        out.push(Ok(None));
                        break;
                    }
                    Err(err) => {
                        out.push(Err(err.to_string()));
                        break;
                    }
                }
            }
            out
        })
    }

    #[test]
    fn a_frame_round_trips_and_the_limit_and_sign_are_checked() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime");
        let mut wire = Vec::new();
        runtime
            .block_on(write_frame(&mut wire, &[b"ab", b"cde"]))
            .expect("write");
        assert_eq!(wire, [0, 0, 0, 5, b'a', b'b', b'c', b'd', b'e']);
        let frames = read_all(&wire, 5);
        assert_eq!(
            frames[0].as_ref().ok().cloned().flatten().as_deref(),
            Some(&b"abcde"[..])
        );
        assert!(read_all(&wire, 4)[0].is_err(), "over the limit");
        assert!(
            read_all(&[0xff, 0xff, 0xff, 0xff], 10)[0].is_err(),
            "negative"
        );
        assert!(read_all(&[0, 0, 0, 3, 1], 10)[0].is_err(), "truncated body");
        assert_eq!(read_all(&[], 10), vec![Ok(None)]);
    }

    proptest! {
        /// Any byte stream: frames come out whole, in order, or the reader stops with an error.
        #[test]
        fn any_stream_splits_into_its_frames_or_an_error(
            frames in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..64), 0..8),
            garbage in proptest::collection::vec(any::<u8>(), 0..16),
        ) {
            let runtime = tokio::runtime::Builder::new_current_thread().build().expect("runtime");
            let mut wire = Vec::new();
            for frame in &frames {
                runtime.block_on(write_frame(&mut wire, &[frame])).expect("write");
            }
            wire.extend_from_slice(&garbage);
            let read = read_all(&wire, 64);
            for (i, frame) in frames.iter().enumerate() {
                let got = read[i].as_ref().ok().cloned().flatten();
                prop_assert_eq!(got.as_deref(), Some(frame.as_slice()));
            }
            // After the good frames: the garbage is a frame, an error or the clean end.
            prop_assert!(read.len() > frames.len());
        }
    }
}
