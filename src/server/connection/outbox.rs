//! What a connection has to write: encoded packets, and the payloads of large
//! publishes, which go out from the message they belong to rather than being copied
//! into the buffer for every subscriber. One vectored write sends it all in order.

use std::io::{self, IoSlice};
use std::sync::Arc;

use smol::io::AsyncWriteExt;

use super::Socket;
use crate::codec::{self, Packet, ProtocolVersion, Publish};

/// A payload at least this long is written from the message itself; a shorter one is
/// copied, since an extra slice costs more than copying a few hundred bytes.
const SHARED_PAYLOAD: usize = 2048;
/// The most slices handed to one vectored write (Linux takes at most 1024).
const MAX_SLICES: usize = 64;
/// Buffer capacity kept between writes; anything larger is released once written.
const KEEP_CAPACITY: usize = 1024;

/// Bytes waiting to be written, in order: `bytes`, with each shared payload going
/// after the byte of `bytes` its offset names.
#[derive(Debug, Default)]
pub(super) struct Outbox {
    bytes: Vec<u8>,
    payloads: Vec<(usize, Arc<[u8]>)>,
    /// How much of the whole a write that could not finish has written.
    written: usize,
}

impl Outbox {
    /// Whether nothing is waiting.
    pub(super) fn is_empty(&self) -> bool {
        self.bytes.is_empty() && self.payloads.is_empty()
    }

    /// Appends `packet`, encoded for `version`; one other than a PUBLISH sheds what it
    /// may to stay within `max_size` bytes (`codec::encode_within`), a PUBLISH larger
    /// than that is left out, as if sent (MQTT-3.1.2-24, -25).
    pub(super) fn packet(&mut self, packet: &Packet, version: ProtocolVersion, max_size: usize) {
        match packet {
            Packet::Publish(p) => {
                self.publish(p, version, max_size);
            }
            _ => codec::encode_within(packet, version, max_size, &mut self.bytes),
        }
    }

    /// Appends a PUBLISH unless it would be larger than `max_size` bytes; returns
    /// whether it was appended. A packet with no encoding (over MQTT's largest remaining
    /// length) appends nothing and counts as appended, as `codec::encode` has it.
    pub(super) fn publish(
        &mut self,
        p: &Publish,
        version: ProtocolVersion,
        max_size: usize,
    ) -> bool {
        let start = self.bytes.len();
        if !codec::encode_publish_header(p, version, &mut self.bytes) {
            return true;
        }
        if self.bytes.len() - start + p.payload.len() > max_size {
            self.bytes.truncate(start);
            return false;
        }
        if p.payload.len() >= SHARED_PAYLOAD {
            self.payloads.push((self.bytes.len(), p.payload.clone()));
        } else {
            self.bytes.extend_from_slice(&p.payload);
        }
        true
    }

    /// The slices still to write once `skip` bytes of the whole have been written, at
    /// most `MAX_SLICES` of them: on the stack, as every write takes them afresh.
    fn slices(&self, mut skip: usize) -> Slices<'_> {
        if self.payloads.is_empty() {
            // The usual case: no room for more to be made ready.
            return Slices::One([IoSlice::new(&self.bytes[skip.min(self.bytes.len())..])]);
        }
        let mut all = [IoSlice::new(&[]); MAX_SLICES];
        let mut len = 0;
        let mut from = 0;
        let ends = self.payloads.iter().map(|(at, p)| (*at, Some(p)));
        for (at, payload) in ends.chain([(self.bytes.len(), None)]) {
            let parts = [&self.bytes[from..at], payload.map_or(&[][..], |p| &p[..])];
            for part in parts {
                if skip >= part.len() {
                    skip -= part.len();
                } else if len < MAX_SLICES {
                    all[len] = IoSlice::new(&part[skip..]);
                    len += 1;
                    skip = 0;
                }
            }
            from = at;
        }
        Slices::Many { all, len }
    }

    /// Total bytes waiting.
    pub(super) fn len(&self) -> usize {
        self.bytes.len() + self.payloads.iter().map(|(_, p)| p.len()).sum::<usize>()
    }

    /// Writes what the socket takes at once, as a broker writing in place would: most
    /// writes finish here, and no future is made for them. Returns whether everything
    /// is written; what is not, `write_to` writes by waiting.
    ///
    /// # Errors
    /// The socket's, or `WriteZero` when it takes nothing.
    pub(super) fn write_now(&mut self, stream: &Socket) -> io::Result<bool> {
        let total = self.len();
        while self.written < total {
            let n = match stream.write_now(self.slices(self.written).as_slice()) {
                None => return Ok(false),
                Some(Err(e)) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Some(Err(e)) if e.kind() == io::ErrorKind::Interrupted => continue,
                Some(written) => written?,
            };
            if n == 0 {
                return Err(io::ErrorKind::WriteZero.into());
            }
            self.written += n;
        }
        Ok(true)
    }

    /// Writes the rest and flushes. Safe to drop part-way: every write the socket took
    /// is counted, and the next call goes on from there (a connection told to end
    /// stops waiting, and its `finish` writes the rest).
    ///
    /// # Errors
    /// The socket's, or `WriteZero` when it takes nothing.
    pub(super) async fn write_to(&mut self, stream: &mut Socket) -> io::Result<()> {
        let total = self.len();
        while self.written < total {
            let n = stream
                .write_vectored(self.slices(self.written).as_slice())
                .await?;
            if n == 0 {
                return Err(io::ErrorKind::WriteZero.into());
            }
            self.written += n;
        }
        stream.flush().await
    }

    /// Empties the outbox after a write, releasing a large buffer.
    pub(super) fn clear(&mut self) {
        self.written = 0;
        self.bytes.clear();
        self.payloads.clear();
        if self.bytes.capacity() > KEEP_CAPACITY {
            self.bytes = Vec::new();
        }
        if self.payloads.capacity() > MAX_SLICES {
            self.payloads = Vec::new();
        }
    }
}

/// The slices one vectored write is handed.
#[allow(clippy::large_enum_variant)] // a transient value on the writer's stack
enum Slices<'a> {
    /// The bytes alone, with no shared payload among them.
    One([IoSlice<'a>; 1]),
    /// The first `len` of `all`.
    Many {
        all: [IoSlice<'a>; MAX_SLICES],
        len: usize,
    },
}

impl<'a> Slices<'a> {
    fn as_slice(&self) -> &[IoSlice<'a>] {
        match self {
            Slices::One(one) => one,
            Slices::Many { all, len } => &all[..*len],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outbox(parts: &[&[u8]]) -> Outbox {
        // Even parts are encoded bytes, odd parts shared payloads.
        let mut o = Outbox::default();
        for (i, part) in parts.iter().enumerate() {
            if i % 2 == 0 {
                o.bytes.extend_from_slice(part);
            } else {
                o.payloads.push((o.bytes.len(), Arc::from(*part)));
            }
        }
        o
    }

    fn joined(o: &Outbox, skip: usize) -> Vec<u8> {
        o.slices(skip)
            .as_slice()
            .iter()
            .flat_map(|s| s.to_vec())
            .collect()
    }

    #[test]
    fn slices_are_the_bytes_in_order_from_any_point() {
        let o = outbox(&[b"ab", b"cde", b"", b"fg", b"h"]);
        let all = b"abcdefgh";
        assert_eq!(o.len(), all.len());
        for skip in 0..=all.len() {
            assert_eq!(joined(&o, skip), &all[skip..]);
        }
        assert!(o.slices(0).as_slice().iter().all(|s| !s.is_empty()));
        let bytes_only = outbox(&[b"abc"]);
        for skip in 0..3 {
            assert_eq!(joined(&bytes_only, skip), &b"abc"[skip..]);
            assert_eq!(bytes_only.slices(skip).as_slice().len(), 1);
        }
    }

    #[test]
    fn a_vectored_write_takes_at_most_max_slices() {
        let parts: Vec<&[u8]> = (0..300)
            .map(|i| if i % 2 == 0 { &b"h"[..] } else { &b"pp"[..] })
            .collect();
        let o = outbox(&parts);
        assert_eq!(o.slices(0).as_slice().len(), MAX_SLICES);
        assert_eq!(o.slices(o.len() - 1).as_slice().len(), 1);
    }

    #[test]
    fn an_oversized_publish_appends_nothing() {
        let mut o = Outbox::default();
        let p = Publish {
            dup: false,
            qos: crate::codec::QoS::AtMostOnce,
            retain: false,
            topic: Arc::from("t"),
            packet_id: None,
            properties: Default::default(),
            payload: Arc::from(vec![7u8; 4096]),
        };
        // 0x30, a two-byte remaining length, the topic's length and its byte.
        let size = 1 + 2 + 2 + 1 + 4096;
        assert!(!o.publish(&p, ProtocolVersion::V311, size - 1));
        assert!(o.is_empty());
        assert!(o.publish(&p, ProtocolVersion::V311, size));
        assert_eq!(o.len(), size);
        let mut whole = Vec::new();
        codec::encode(&Packet::Publish(p), ProtocolVersion::V311, &mut whole);
        assert_eq!(joined(&o, 0), whole);
    }
}
