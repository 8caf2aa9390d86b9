//! The connection's read buffer, sized by what the client sends rather than reserved up front:
//! an idle client holds [`MIN_READ`] bytes, a client whose reads fill the buffer gets twice as
//! much for the next read (up to [`MAX_READ`]), and one whose reads stay small shrinks back, the
//! buffer being released whenever it is empty and small. Never holds a frame back: what was
//! read stays until the packet loop takes it.

use bytes::BytesMut;

/// What an idle connection reserves for its next read.
pub(super) const MIN_READ: usize = 128;
/// The most one read asks for.
pub(super) const MAX_READ: usize = 64 * 1024;

/// Bytes read from the client and not yet decoded, and the size of the next read.
#[derive(Debug)]
pub(super) struct ReadBuffer {
    pub(super) bytes: BytesMut,
    want: usize,
}

impl ReadBuffer {
    /// Takes over `bytes` (what the handshake read past CONNECT).
    pub(super) fn new(bytes: BytesMut) -> Self {
        Self {
            bytes,
            want: MIN_READ,
        }
    }

    /// Makes room for the next read.
    pub(super) fn reserve(&mut self) {
        if self.bytes.capacity() - self.bytes.len() < self.want / 2 {
            self.bytes.reserve(self.want);
        }
    }

    /// Adapts the next read's size to a read of `n` bytes that had `room` bytes to fill.
    pub(super) fn read(&mut self, n: usize, room: usize) {
        if n >= room {
            self.want = (self.want * 2).min(MAX_READ);
        } else if n < self.want / 4 {
            self.want = (self.want / 2).max(MIN_READ);
        }
    }

    /// Room for the next read right now.
    pub(super) fn room(&self) -> usize {
        self.bytes.capacity() - self.bytes.len()
    }

    /// Once every frame was taken: gives a buffer back that an idle client would not fill.
    pub(super) fn settle(&mut self) {
        if self.bytes.is_empty() && self.want == MIN_READ && self.bytes.capacity() > MIN_READ {
            self.bytes = BytesMut::new();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One read of `n` bytes (at most the room there is) into `buffer`.
    fn read(buffer: &mut ReadBuffer, n: usize) {
        buffer.reserve();
        let room = buffer.room();
        let n = n.min(room);
        buffer.bytes.extend_from_slice(&vec![0u8; n]);
        buffer.read(n, room);
    }

    #[test]
    fn a_busy_client_grows_the_buffer_and_an_idle_one_gives_it_back() {
        let mut buffer = ReadBuffer::new(BytesMut::new());
        buffer.reserve();
        assert!(buffer.room() < 4096, "idle: {} bytes", buffer.room());
        for _ in 0..20 {
            read(&mut buffer, usize::MAX);
            buffer.bytes.clear();
        }
        assert_eq!(buffer.want, MAX_READ);
        assert!(buffer.room() >= MAX_READ / 2);
        for _ in 0..20 {
            read(&mut buffer, 2);
            buffer.bytes.clear();
            buffer.settle();
        }
        assert_eq!(buffer.want, MIN_READ);
        let kept = buffer.bytes.capacity();
        assert!(
            kept <= 2 * MIN_READ,
            "the large buffer was given back: {kept} bytes kept"
        );
    }

    #[test]
    fn unread_bytes_are_kept() {
        let mut buffer = ReadBuffer::new(BytesMut::from(&b"abc"[..]));
        buffer.settle();
        assert_eq!(&buffer.bytes[..], b"abc");
        read(&mut buffer, 5);
        assert_eq!(buffer.bytes.len(), 8);
    }
}
