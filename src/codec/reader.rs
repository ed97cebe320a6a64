//! A bounded reader over one packet's bytes, after rustls' `codec::Reader`.
//!
//! Every read names the field it is for. Reading past the end is `Malformed(field)`,
//! and a length-prefixed part is read through [`Reader::sub`], so a length that runs past
//! its packet, or a part that leaves bytes over, is an error by construction rather than
//! by remembering to check.

use super::error::DecodeError;

/// A cursor over a borrowed slice that never reads past its end.
#[derive(Debug, Clone)]
pub(crate) struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    /// A reader over all of `buf`.
    pub(crate) fn new(buf: &'a [u8]) -> Reader<'a> {
        Reader { buf }
    }

    /// Whether every byte has been read.
    pub(crate) fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    /// The next `n` bytes; `Malformed(field)` if fewer are left.
    pub(crate) fn take(&mut self, n: usize, field: &'static str) -> Result<&'a [u8], DecodeError> {
        if n > self.buf.len() {
            return Err(DecodeError::Malformed(field));
        }
        let (head, tail) = self.buf.split_at(n);
        self.buf = tail;
        Ok(head)
    }

    /// A reader over the next `len` bytes, which the caller must read to the end.
    pub(crate) fn sub(
        &mut self,
        len: usize,
        field: &'static str,
    ) -> Result<Reader<'a>, DecodeError> {
        self.take(len, field).map(Reader::new)
    }

    /// Everything not yet read (a PUBLISH payload, a SUBACK's codes).
    pub(crate) fn rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.buf)
    }

    /// `Malformed(field)` if any byte is left: the field was the last one.
    pub(crate) fn expect_empty(&self, field: &'static str) -> Result<(), DecodeError> {
        if self.buf.is_empty() {
            Ok(())
        } else {
            Err(DecodeError::Malformed(field))
        }
    }

    /// One byte.
    pub(crate) fn u8(&mut self, field: &'static str) -> Result<u8, DecodeError> {
        Ok(self.take(1, field)?[0])
    }

    /// A two-byte big-endian integer.
    pub(crate) fn u16(&mut self, field: &'static str) -> Result<u16, DecodeError> {
        let b = self.take(2, field)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }

    /// A four-byte big-endian integer.
    pub(crate) fn u32(&mut self, field: &'static str) -> Result<u32, DecodeError> {
        let b = self.take(4, field)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    /// A variable byte integer of at most four bytes (at most 268,435,455).
    pub(crate) fn varint(&mut self, field: &'static str) -> Result<u32, DecodeError> {
        let mut value = 0u32;
        for i in 0..4 {
            let byte = self.u8(field)?;
            value |= u32::from(byte & 0x7F) << (7 * i);
            if byte & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err(DecodeError::Malformed(field))
    }

    /// Binary Data: a two-byte length and that many bytes.
    pub(crate) fn binary(&mut self, field: &'static str) -> Result<&'a [u8], DecodeError> {
        let len = self.u16(field)?;
        self.take(usize::from(len), field)
    }

    /// A UTF-8 Encoded String. Invalid UTF-8 or U+0000 is `Malformed(field)`
    /// (MQTT 5 section 1.5.4, MQTT-1.5.4-1, MQTT-1.5.4-2).
    pub(crate) fn utf8(&mut self, field: &'static str) -> Result<&'a str, DecodeError> {
        let bytes = self.binary(field)?;
        match std::str::from_utf8(bytes) {
            Ok(s) if !s.contains('\0') => Ok(s),
            _ => Err(DecodeError::Malformed(field)),
        }
    }

    /// A topic name or filter: bytes that are not UTF-8 are [`DecodeError::TopicNotUtf8`]
    /// (the connection closes with nothing sent, A-189); U+0000 is `Malformed(field)`.
    pub(crate) fn topic(&mut self, field: &'static str) -> Result<&'a str, DecodeError> {
        let bytes = self.binary(field)?;
        let s = std::str::from_utf8(bytes).map_err(|_| DecodeError::TopicNotUtf8)?;
        if s.contains('\0') {
            return Err(DecodeError::Malformed(field));
        }
        Ok(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reading_past_the_end_names_the_field() {
        let mut r = Reader::new(&[0, 5, b'a']);
        assert_eq!(
            r.binary("client identifier"),
            Err(DecodeError::Malformed("client identifier"))
        );
    }

    #[test]
    fn a_sub_reader_cannot_see_past_its_length() {
        let mut r = Reader::new(&[1, 2, 3, 4]);
        let mut sub = r.sub(2, "properties").unwrap();
        assert_eq!(sub.u16("x"), Ok(0x0102));
        assert_eq!(sub.u8("x"), Err(DecodeError::Malformed("x")));
        assert_eq!(r.u16("y"), Ok(0x0304));
        assert!(r.is_empty());
    }

    #[test]
    fn bytes_left_over_are_malformed() {
        let r = Reader::new(&[0]);
        assert_eq!(
            r.expect_empty("packet"),
            Err(DecodeError::Malformed("packet"))
        );
    }

    #[test]
    fn a_varint_of_five_bytes_is_malformed() {
        let mut r = Reader::new(&[0x80, 0x80, 0x80, 0x80, 0x01]);
        assert_eq!(r.varint("len"), Err(DecodeError::Malformed("len")));
        let mut r = Reader::new(&[0xFF, 0xFF, 0xFF, 0x7F]);
        assert_eq!(r.varint("len"), Ok(268_435_455));
    }

    #[test]
    fn strings_refuse_nul_and_bad_utf8_topics_are_their_own_error() {
        assert_eq!(
            Reader::new(&[0, 1, 0]).utf8("s"),
            Err(DecodeError::Malformed("s"))
        );
        assert_eq!(
            Reader::new(&[0, 1, 0xFF]).utf8("s"),
            Err(DecodeError::Malformed("s"))
        );
        assert_eq!(
            Reader::new(&[0, 1, 0xFF]).topic("t"),
            Err(DecodeError::TopicNotUtf8)
        );
        assert_eq!(
            Reader::new(&[0, 1, 0]).topic("t"),
            Err(DecodeError::Malformed("t"))
        );
    }
}
