//! Reading whole packets off a socket without trusting the peer: the declared length
//! is checked against the limit before a byte of the body is buffered, and the buffer
//! grows with the packet and is released once it is handled.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use smol::io::{AsyncRead, AsyncReadExt};

use super::socket::Socket;
use crate::codec::{self, DecodeError, FixedHeader};

/// Bytes read at a time while no packet is in progress. An idle connection holds no
/// buffer at all (see `consume`), so this costs only a busy one; 4 KiB takes most
/// packets, and the next ones behind them, in one read.
const READ_CHUNK: usize = 4096;
/// Bytes read at a time before the CONNECT has been read.
const CONNECT_CHUNK: usize = 512;
/// The most read at once into a packet in progress.
const MAX_READ: usize = 64 * 1024;
/// Chunk buffers kept for the next read on this thread. A buffer goes back as soon as
/// what it held is handled, so the next connection to read takes it: a handful serve
/// every connection, and at most this many (64 KiB) wait unused.
const SPARE_CHUNKS: usize = 16;

thread_local! {
    /// Released chunk buffers, each `READ_CHUNK` long. Taking one saves allocating and
    /// zeroing 4 KiB for every read of a connection that holds no buffer between
    /// packets (a subscriber's PUBACK, a publisher's next message): under callgrind,
    /// 4,400 of the 17,000 instructions a QoS 1 fan-out delivery cost (BENCHMARKS.md).
    static SPARE: std::cell::RefCell<Vec<Vec<u8>>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// A complete packet sitting in the buffer.
#[derive(Debug, Clone, Copy)]
pub struct Frame {
    /// The fixed header's first byte.
    pub first_byte: u8,
    start: usize,
    end: usize,
}

/// Why no frame could be taken.
#[derive(Debug)]
pub enum FrameError {
    /// The fixed header itself is unreadable.
    Decode(DecodeError),
    /// The declared length is over the limit; nothing of the body was buffered.
    TooLarge {
        /// The fixed header's first byte.
        first_byte: u8,
        /// The declared packet size.
        declared: usize,
    },
}

/// The inbound half of a connection's buffering.
#[derive(Debug, Default)]
pub struct FrameReader {
    buf: Vec<u8>,
    filled: usize,
    /// Bytes of the packet in progress, when its header has been read.
    expected: Option<usize>,
    /// Past the CONNECT: reads may take `READ_CHUNK` at once.
    connected: bool,
    /// The size of the last whole packet, when it was larger than a chunk: the next
    /// read from empty takes that much, so a stream of large publishes costs one read
    /// each rather than a chunk and then the rest.
    last_large: Option<usize>,
}

impl FrameReader {
    /// The next complete packet in the buffer, `Ok(None)` if more bytes are needed.
    ///
    /// # Errors
    /// An unreadable fixed header, or a declared size above `max_size`.
    pub fn next_frame(&mut self, max_size: u32) -> Result<Option<Frame>, FrameError> {
        let data = &self.buf[..self.filled];
        let Some(FixedHeader {
            first_byte,
            remaining_length,
            header_len,
        }) = codec::read_fixed_header(data).map_err(FrameError::Decode)?
        else {
            self.expected = None;
            return Ok(None);
        };
        let total = header_len + remaining_length;
        if total > max_size as usize {
            return Err(FrameError::TooLarge {
                first_byte,
                declared: total,
            });
        }
        if data.len() < total {
            self.expected = Some(total);
            return Ok(None);
        }
        self.expected = None;
        self.last_large = (total > READ_CHUNK).then_some(total);
        Ok(Some(Frame {
            first_byte,
            start: header_len,
            end: total,
        }))
    }

    /// Lets reads take `READ_CHUNK` at once, once the CONNECT is in.
    pub fn connected(&mut self) {
        self.connected = true;
    }

    /// Whether nothing is buffered: no packet is partly read.
    pub fn is_empty(&self) -> bool {
        self.filled == 0
    }

    /// Bytes read and not yet consumed.
    pub fn buffered(&self) -> usize {
        self.filled
    }

    /// The body of `frame`.
    pub fn body(&self, frame: &Frame) -> &[u8] {
        &self.buf[frame.start..frame.end]
    }

    /// Drops `frame` from the buffer, releasing memory once nothing is left.
    pub fn consume(&mut self, frame: Frame) {
        self.buf.copy_within(frame.end..self.filled, 0);
        self.filled -= frame.end;
        if self.filled == 0 {
            // An idle connection holds no read buffer at all.
            let buf = std::mem::take(&mut self.buf);
            if buf.len() == READ_CHUNK {
                SPARE.with_borrow_mut(|spare| {
                    if spare.len() < SPARE_CHUNKS {
                        spare.push(buf);
                    }
                });
            }
        }
    }

    /// The first bytes of the body of an oversized packet, read to learn a CONNECT's
    /// protocol level; at most `n` bytes, never the whole packet.
    pub fn peek(&self, n: usize) -> &[u8] {
        &self.buf[..self.filled.min(n)]
    }

    /// Reads what `stream` already holds, without waiting; `Ok(0)` when nothing is
    /// there or the stream has ended.
    ///
    /// # Errors
    /// The socket's.
    pub async fn try_fill(&mut self, stream: &mut Socket) -> io::Result<usize> {
        let want = READ_CHUNK;
        self.grow(self.filled + want);
        // One poll: a read that would wait is dropped unstarted (reads are cancel-safe).
        let read = stream.read(&mut self.buf[self.filled..self.filled + want]);
        let n = futures_lite::future::poll_once(read)
            .await
            .transpose()?
            .unwrap_or(0);
        self.filled += n;
        Ok(n)
    }

    /// Reads more bytes from `stream`. Safe to cancel: bytes count only once read.
    /// Returns 0 at end of stream.
    ///
    /// # Errors
    /// The socket's.
    pub async fn fill(&mut self, stream: &mut Socket) -> io::Result<usize> {
        std::future::poll_fn(|cx| self.poll_fill(stream, cx)).await
    }

    /// [`FrameReader::fill`] as a poll, for a wait on several things at once that keeps
    /// no read future of its own: an idle connection's task is as large as that wait.
    ///
    /// # Errors
    /// The socket's.
    pub fn poll_fill(
        &mut self,
        stream: &mut Socket,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<usize>> {
        if self.filled == 0 {
            // Nothing buffered: wait with no buffer at all.
            ready!(stream.poll_readable(cx))?;
        }
        let want = self.read_size();
        self.grow(self.filled + want);
        let n =
            ready!(Pin::new(stream).poll_read(cx, &mut self.buf[self.filled..self.filled + want]))?;
        self.filled += n;
        Poll::Ready(Ok(n))
    }

    /// How many bytes the next read from the socket may take.
    fn read_size(&self) -> usize {
        match self.expected {
            // A large packet's rest and the head of the next one behind it, in one
            // read. Only for a packet larger than a chunk: reading ahead of small
            // ones let a publisher outrun its subscribers' acknowledgements (peak RSS
            // 9.4 -> 18 MiB on qos1-1to100-128B). The total was checked against the
            // size limit before anything was buffered.
            Some(total) if self.connected && total > READ_CHUNK => {
                (total - self.filled + READ_CHUNK).min(MAX_READ)
            }
            Some(total) => (total - self.filled).min(MAX_READ),
            // A CONNECT is small and every socket sends one: reading it in a small
            // buffer keeps the handshake of a thousand idle clients cheap.
            None if !self.connected => CONNECT_CHUNK,
            // After a large packet, as much again and the head of the one behind it
            // (as above): a stream of them then never waits for the reactor between
            // packets. After a small one a chunk, so a publisher of small packets
            // cannot outrun its subscribers.
            None => self
                .last_large
                .map_or(READ_CHUNK, |last| (last + READ_CHUNK).min(MAX_READ)),
        }
    }

    /// Makes the buffer at least `len` bytes long, keeping what is filled: a spare
    /// chunk when one does, else a new buffer zeroed by the allocator (`vec![0; len]`
    /// is one `calloc`; the shipped build optimizes for size, and there `Vec::resize`
    /// zeroes a byte at a time, which cost a fifth of the broker's time on 16 KiB
    /// publishes).
    fn grow(&mut self, len: usize) {
        if self.buf.len() >= len {
            return;
        }
        if self.buf.is_empty()
            && len <= READ_CHUNK
            && let Some(spare) = SPARE.with_borrow_mut(Vec::pop)
        {
            self.buf = spare;
            return;
        }
        // A packet arriving in many small reads doubles its buffer, up to the packet
        // and a chunk behind it: growing it by each read copied all that was
        // buffered once a read, quadratic in the packet (a 1 MiB publish in 1,448-byte
        // segments cost some 700 copies of up to 1 MiB).
        let most = self
            .expected
            .map_or(len, |total| total + READ_CHUNK)
            .max(len);
        let len = len.max(self.buf.len().saturating_mul(2)).min(most);
        let mut bigger = vec![0; len];
        bigger[..self.filled].copy_from_slice(&self.buf[..self.filled]);
        self.buf = bigger;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reader holding `bytes` as if read off a socket.
    fn holding(bytes: &[u8]) -> FrameReader {
        let mut reader = FrameReader::default();
        reader.grow(READ_CHUNK);
        reader.buf[..bytes.len()].copy_from_slice(bytes);
        reader.filled = bytes.len();
        reader
    }

    /// A large publish arriving a TCP segment at a time grows its buffer a few
    /// times, not once a read: each growth copies all that is buffered.
    #[test]
    fn a_packet_read_in_small_pieces_grows_its_buffer_by_doubling() {
        const TOTAL: usize = 1 << 20;
        const SEGMENT: usize = 1448;
        // A PUBLISH whose remaining length is TOTAL - 4 (a 4-byte fixed header).
        let remaining = TOTAL - 4;
        let header = [
            0x30,
            (remaining & 0x7F) as u8 | 0x80,
            ((remaining >> 7) & 0x7F) as u8 | 0x80,
            (remaining >> 14) as u8,
        ];
        let mut reader = holding(&header);
        reader.connected();
        assert!(matches!(reader.next_frame(u32::MAX), Ok(None)));
        let mut growths = 0;
        while reader.filled < TOTAL {
            let want = reader.read_size();
            let before = reader.buf.len();
            reader.grow(reader.filled + want);
            growths += usize::from(reader.buf.len() != before);
            reader.filled += want.min(SEGMENT);
        }
        assert!(growths <= 10, "{growths} growths for one packet");
        assert!(reader.buf.len() <= TOTAL + READ_CHUNK);
        assert!(matches!(reader.next_frame(u32::MAX), Ok(Some(_))));
    }

    #[test]
    fn a_handled_chunk_is_the_next_readers_buffer() {
        let mut first = holding(&[0xC0, 0x00]); // PINGREQ
        let frame = first
            .next_frame(1024)
            .ok()
            .flatten()
            .expect("a whole PINGREQ");
        let chunk = first.buf.as_ptr();
        first.consume(frame);
        assert!(first.buf.is_empty(), "an idle reader holds no buffer");
        let mut second = FrameReader::default();
        second.grow(CONNECT_CHUNK);
        assert_eq!(
            second.buf.as_ptr(),
            chunk,
            "the spare chunk is taken, not a new one"
        );
        assert_eq!(second.buf.len(), READ_CHUNK);
    }

    #[test]
    fn spare_chunks_are_bounded_and_larger_buffers_are_not_kept() {
        // Many connections reading at once, then all of them idle.
        let mut readers: Vec<FrameReader> = (0..SPARE_CHUNKS + 4)
            .map(|_| holding(&[0xC0, 0x00]))
            .collect();
        for reader in &mut readers {
            let frame = reader
                .next_frame(1024)
                .ok()
                .flatten()
                .expect("a whole PINGREQ");
            reader.consume(frame);
        }
        assert_eq!(SPARE.with_borrow(Vec::len), SPARE_CHUNKS);
        let mut large = FrameReader::default();
        large.grow(READ_CHUNK * 2);
        large.buf[..2].copy_from_slice(&[0xC0, 0x00]);
        large.filled = 2;
        let frame = large
            .next_frame(1024)
            .ok()
            .flatten()
            .expect("a whole PINGREQ");
        large.consume(frame);
        assert_eq!(SPARE.with_borrow(Vec::len), SPARE_CHUNKS);
        assert!(SPARE.with_borrow(|s| s.iter().all(|b| b.len() == READ_CHUNK)));
    }
}
