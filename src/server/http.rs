//! The one HTTP/1.1 request-head reader the broker's HTTP speakers share: the
//! operations listener and the WebSocket upgrade.

use std::io;

use smol::io::{AsyncRead, AsyncReadExt};

/// The most a request head may take.
pub const MAX_REQUEST_HEAD: usize = 8 * 1024;

/// Reads a request head up to its blank line; returns it and whatever the client sent
/// after it (a body, or an upgraded protocol's first bytes).
///
/// # Errors
/// The socket's; `UnexpectedEof` when it closes first; `InvalidData` past
/// [`MAX_REQUEST_HEAD`] (a 400 where there is somebody to tell).
pub async fn read_request_head(
    stream: &mut (impl AsyncRead + Unpin),
) -> io::Result<(Vec<u8>, Vec<u8>)> {
    let mut head = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    loop {
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "closed before its request head",
            ));
        }
        let searched_from = head.len().saturating_sub(3);
        head.extend_from_slice(&chunk[..n]);
        if let Some(at) = head[searched_from..]
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
        {
            let rest = head.split_off(searched_from + at + 4);
            return Ok((head, rest));
        }
        if head.len() > MAX_REQUEST_HEAD {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "request head over 8 KiB",
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_head_ends_at_its_blank_line_even_split_across_reads() {
        let mut input: &[u8] = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n\x10\x0c";
        let (head, rest) = smol::block_on(read_request_head(&mut input)).expect("a head");
        assert!(head.ends_with(b"\r\n\r\n"));
        assert_eq!(rest, b"\x10\x0c");
        let mut endless: &[u8] = &[b'a'; 10_000];
        let e = smol::block_on(read_request_head(&mut endless)).expect_err("too long");
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
    }
}
