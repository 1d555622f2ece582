//! What a WebSocket peer may make the server hold before it logs in. The bytes read from it
//! are bounded ([`WsLimits::before_login`](crate::WsLimits)), and so is each frame's length:
//! tungstenite reserves room for a frame's whole payload as soon as it has its header, so a
//! bound on bytes alone would still let every stranger make it reserve 64 KiB (the message
//! limit) with a 14-byte header. [`Metered`] passes the peer's bytes to tungstenite and reads
//! the frame headers in them as they pass ([`HeaderScan`]); a frame longer than what the peer
//! has left before login ends the connection. After login, bytes pass untouched.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::WsStream;

/// The frame headers in the bytes a peer sends, read as they pass, so that a frame's length
/// is known before tungstenite reserves room for it. Sans-IO.
#[derive(Debug, Default)]
pub(crate) struct HeaderScan {
    /// The current header's bytes so far (a header is at most 14).
    header: [u8; 14],
    have: usize,
    /// Payload bytes of the current frame still to pass.
    payload_left: u64,
}

/// A frame announced longer than the bytes its sender has left before login.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "a WebSocket frame of {len} bytes before login, with {left} bytes left to the peer before it logs in"
)]
pub(crate) struct TooLong {
    pub len: u64,
    pub left: usize,
}

impl HeaderScan {
    /// Passes `bytes`, the next the peer sent, of which it had `left` left before login
    /// (`bytes` included: `left >= bytes.len()`). A frame whose header ends in `bytes` must fit
    /// in what is left after that header.
    pub fn feed(&mut self, mut bytes: &[u8], mut left: usize) -> Result<(), TooLong> {
        debug_assert!(left >= bytes.len());
        while let Some((&first, rest)) = bytes.split_first() {
            if self.payload_left > 0 {
                let n = self.payload_left.min(bytes.len() as u64) as usize;
                self.payload_left -= n as u64;
                bytes = &bytes[n..];
                left -= n;
                continue;
            }
            self.header[self.have] = first;
            self.have += 1;
            bytes = rest;
            left -= 1;
            if let Some(len) = self.header_len() {
                self.have = 0;
                if len > left as u64 {
                    return Err(TooLong { len, left });
                }
                self.payload_left = len;
            }
        }
        Ok(())
    }

    /// Whether the peer is between frames.
    #[cfg(test)]
    fn at_boundary(&self) -> bool {
        self.have == 0 && self.payload_left == 0
    }

    /// The payload length, once the header is complete (RFC 6455 section 5.2: 7 bits, or 126
    /// and 16 bits, or 127 and 64 bits; then the 4-byte mask if the mask bit is set).
    fn header_len(&self) -> Option<u64> {
        let h = &self.header;
        if self.have < 2 {
            return None;
        }
        let len7 = h[1] & 0x7f;
        let extended = match len7 {
            126 => 2,
            127 => 8,
            _ => 0,
        };
        let mask = if h[1] & 0x80 != 0 { 4 } else { 0 };
        if self.have < 2 + extended + mask {
            return None;
        }
        Some(match extended {
            0 => u64::from(len7),
            2 => u64::from(u16::from_be_bytes([h[2], h[3]])),
            _ => u64::from_be_bytes([h[2], h[3], h[4], h[5], h[6], h[7], h[8], h[9]]),
        })
    }
}

/// The end of an HTTP request's head.
const HEAD_END: &[u8; 4] = b"\r\n\r\n";

/// Where the HTTP head ends in `bytes`, the next bytes of a request of which the last bytes
/// before them matched `matched` bytes of [`HEAD_END`]: the index just past it, if it ends
/// there.
fn head_end(matched: &mut usize, bytes: &[u8]) -> Option<usize> {
    for (i, &b) in bytes.iter().enumerate() {
        if b == HEAD_END[*matched] {
            *matched += 1;
            if *matched == HEAD_END.len() {
                return Some(i + 1);
            }
        } else {
            *matched = usize::from(b == HEAD_END[0]);
        }
    }
    None
}

/// Bytes passed to tungstenite per read while something is metered.
const CHUNK: usize = 2048;

/// What a WebSocket reads from: the stream under it and, on a server, the upgrade request
/// passed on exactly (what the peer sent after it is held back, so that the frame scan starts
/// on a frame's first byte), then until login how much more may be read, and the frame headers
/// read so far.
#[derive(Debug)]
pub(crate) struct Metered {
    io: WsStream,
    /// While the upgrade request passes: how many bytes of [`HEAD_END`] its last bytes matched.
    upgrade: Option<usize>,
    /// Bytes read past the upgrade request, given out before the stream's next (at most a
    /// read's worth).
    held: Vec<u8>,
    /// `None` once the peer has logged in (and on a client's side).
    before_login: Option<(usize, HeaderScan)>,
}

impl Metered {
    /// A server's side: the upgrade request comes first.
    pub fn server(io: WsStream) -> Metered {
        Metered { io, upgrade: Some(0), held: Vec::new(), before_login: None }
    }

    /// A client's side: nothing metered.
    pub fn client(io: WsStream) -> Metered {
        Metered { io, upgrade: None, held: Vec::new(), before_login: None }
    }

    /// The upgrade is done: from now on, at most `bytes` more are read until
    /// [`Metered::logged_in`]. (An upgrade request whose head ended other than in a blank
    /// CRLF line, which httparse also takes, left nothing after it: tungstenite refuses bytes
    /// after the request.)
    pub fn bound(&mut self, bytes: Option<usize>) {
        self.upgrade = None;
        self.before_login = bytes.map(|left| (left, HeaderScan::default()));
    }

    pub fn logged_in(&mut self) {
        self.before_login = None;
    }
}

impl AsyncRead for Metered {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.upgrade.is_none() && this.before_login.is_none() && this.held.is_empty() {
            return Pin::new(&mut this.io).poll_read(cx, buf);
        }
        let mut room = buf.remaining().min(CHUNK);
        if let Some((left, _)) = &this.before_login {
            if *left == 0 {
                // Not read again until `logged_in`, after which the reader polls anew (the
                // session's task). Nobody is woken: a peer stuck here never logs in, and the
                // login deadline ends it.
                return Poll::Pending;
            }
            room = room.min(*left);
        }
        // Through a small buffer of our own: only around login, a few reads per connection.
        let mut chunk = [0u8; CHUNK];
        let n = if this.held.is_empty() {
            let mut limited = ReadBuf::new(&mut chunk[..room]);
            std::task::ready!(Pin::new(&mut this.io).poll_read(cx, &mut limited))?;
            limited.filled().len()
        } else {
            let n = room.min(this.held.len());
            chunk[..n].copy_from_slice(&this.held[..n]);
            this.held.drain(..n);
            n
        };
        let mut got = &chunk[..n];
        if let Some(matched) = &mut this.upgrade
            && let Some(end) = head_end(matched, got)
        {
            this.held.splice(0..0, got[end..].iter().copied());
            got = &got[..end];
            this.upgrade = None;
        }
        if let Some((left, scan)) = &mut this.before_login {
            scan.feed(got, *left).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
            *left -= got.len();
        }
        buf.put_slice(got);
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for Metered {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, data: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, data)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// One frame's bytes: `len` payload bytes, its length in the shortest form or (`wide`) a
    /// longer one, masked or not.
    fn frame(opcode: u8, len: usize, masked: bool, wide: u8) -> Vec<u8> {
        let mask_bit = if masked { 0x80 } else { 0 };
        let mut out = vec![0x80 | opcode];
        match (len, wide) {
            (0..=125, 0) => out.push(mask_bit | len as u8),
            (0..=0xffff, 0 | 1) => {
                out.push(mask_bit | 126);
                out.extend_from_slice(&(len as u16).to_be_bytes());
            }
            _ => {
                out.push(mask_bit | 127);
                out.extend_from_slice(&(len as u64).to_be_bytes());
            }
        }
        if masked {
            out.extend_from_slice(&[9, 8, 7, 6]);
        }
        out.resize(out.len() + len, 0xab);
        out
    }

    #[test]
    fn the_head_ends_after_the_blank_line_wherever_the_reads_cut_it() {
        let request = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n\x82\x85";
        let end = request.len() - 2;
        for cut in 1..request.len() {
            let mut matched = 0;
            let found = head_end(&mut matched, &request[..cut])
                .or_else(|| head_end(&mut matched, &request[cut..]).map(|i| cut + i));
            assert_eq!(found, Some(end), "cut at {cut}");
        }
        let mut matched = 0;
        assert_eq!(head_end(&mut matched, b"a\r\r\n\r\r\n"), None, "no blank line");
        assert_eq!(head_end(&mut matched, b"\r\nz"), Some(2), "the partial match carries over");
    }

    proptest! {
        /// Frames of every header form, split anywhere, pass within a large enough allowance,
        /// and the scan ends between frames.
        #[test]
        fn frames_split_anywhere_pass_and_end_on_a_boundary(
            frames in prop::collection::vec((0u8..16, 0usize..400, any::<bool>(), 0u8..3), 0..12),
            cuts in prop::collection::vec(1usize..64, 1..40),
        ) {
            let bytes: Vec<u8> =
                frames.iter().flat_map(|&(op, len, masked, wide)| frame(op, len, masked, wide)).collect();
            let mut scan = HeaderScan::default();
            let mut left = bytes.len();
            let mut rest = &bytes[..];
            for cut in cuts.iter().cycle() {
                if rest.is_empty() {
                    break;
                }
                let (now, later) = rest.split_at((*cut).min(rest.len()));
                scan.feed(now, left).unwrap();
                left -= now.len();
                rest = later;
            }
            prop_assert!(scan.at_boundary());
        }

        /// A frame is refused, from its header, exactly when its payload is longer than what is
        /// left after the header, in whichever form its length is written.
        #[test]
        fn a_frame_longer_than_what_is_left_is_refused_at_its_header(
            len in 0usize..70_000, masked in any::<bool>(), wide in 0u8..3, allowance in 0usize..70_000,
        ) {
            let bytes = frame(2, len, masked, wide);
            let header = bytes.len() - len;
            let left = allowance.max(header);
            let mut scan = HeaderScan::default();
            let result = scan.feed(&bytes[..header], left);
            if len > left - header {
                prop_assert_eq!(result, Err(TooLong { len: len as u64, left: left - header }));
            } else {
                prop_assert_eq!(result, Ok(()));
            }
        }

        /// Any bytes at all: no panic, within the allowance.
        #[test]
        fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..200), extra in 0usize..100) {
            let _ = HeaderScan::default().feed(&bytes, bytes.len() + extra);
        }
    }
}
