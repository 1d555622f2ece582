//! A DATA frame's payload as its sender holds it: one buffer, or a short head and several
//! shared buffers that go on the wire back to back.
//!
//! It exists for messages assembled from pieces encoded once and shared by many receivers (the
//! spatial world's `channel.updates`: each viewer's message is its cells' shared updates). Joined
//! into one buffer, each such message costs an allocation and a copy per receiver, kept until
//! the receiver acknowledges it. As [`Parts`], it is copied once, into the connection's write
//! buffer, and a session that may have to resend it keeps references to the shared pieces, not
//! a copy. On
//! the wire the two are the same bytes; a decoded frame's payload is always [`Payload::Whole`].

use std::sync::Arc;

use bytes::{BufMut, Bytes, BytesMut};

/// The bytes of one DATA frame's payload.
#[derive(Clone, Debug)]
pub enum Payload {
    Whole(Bytes),
    /// Shared, so that the copy the retransmit buffer keeps costs one reference count.
    Parts(Arc<Parts>),
}

/// A head of at most [`Parts::MAX_HEAD`] bytes, then `parts`, back to back.
pub struct Parts {
    head: [u8; Parts::MAX_HEAD],
    head_len: u8,
    parts: Vec<Bytes>,
    len: usize,
}

impl Parts {
    /// The longest head: room for a protobuf envelope's tags and lengths and a short topic.
    pub const MAX_HEAD: usize = 48;

    /// Gives `parts` back if `head` is longer than [`Parts::MAX_HEAD`].
    pub fn new(head: &[u8], parts: Vec<Bytes>) -> Result<Parts, Vec<Bytes>> {
        let mut inline = [0; Parts::MAX_HEAD];
        let Some(room) = inline.get_mut(..head.len()) else { return Err(parts) };
        room.copy_from_slice(head);
        let len = head.len() + parts.iter().map(Bytes::len).sum::<usize>();
        Ok(Parts { head: inline, head_len: head.len() as u8, parts, len })
    }

    fn head(&self) -> &[u8] {
        &self.head[..usize::from(self.head_len)]
    }

    /// The head, then each part.
    fn chunks(&self) -> impl Iterator<Item = &[u8]> {
        std::iter::once(self.head()).chain(self.parts.iter().map(|p| &p[..]))
    }
}

impl std::fmt::Debug for Parts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Parts").field("head", &self.head()).field("parts", &self.parts).finish()
    }
}

impl Payload {
    /// Its length on the wire.
    pub fn len(&self) -> usize {
        match self {
            Payload::Whole(bytes) => bytes.len(),
            Payload::Parts(parts) => parts.len,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Appends its bytes to `dst`.
    pub fn put_into(&self, dst: &mut BytesMut) {
        match self {
            Payload::Whole(bytes) => dst.put_slice(bytes),
            Payload::Parts(parts) => {
                dst.reserve(parts.len);
                parts.chunks().for_each(|chunk| dst.put_slice(chunk));
            }
        }
    }

    /// Its bytes, in the pieces it holds them in.
    fn chunks(&self) -> Box<dyn Iterator<Item = &[u8]> + '_> {
        match self {
            Payload::Whole(bytes) => Box::new(std::iter::once(&bytes[..])),
            Payload::Parts(parts) => Box::new(parts.chunks()),
        }
    }

    /// Its bytes in one buffer: free for [`Payload::Whole`], a copy for [`Payload::Parts`].
    pub fn into_bytes(self) -> Bytes {
        match self {
            Payload::Whole(bytes) => bytes,
            Payload::Parts(_) => {
                let mut buf = BytesMut::with_capacity(self.len());
                self.put_into(&mut buf);
                buf.freeze()
            }
        }
    }
}

impl From<Bytes> for Payload {
    fn from(bytes: Bytes) -> Payload {
        Payload::Whole(bytes)
    }
}

impl From<Parts> for Payload {
    fn from(parts: Parts) -> Payload {
        Payload::Parts(Arc::new(parts))
    }
}

/// Equal when the bytes on the wire are, however each is cut.
impl PartialEq for Payload {
    fn eq(&self, other: &Payload) -> bool {
        if self.len() != other.len() {
            return false;
        }
        let (mut a, mut b) = (self.chunks(), other.chunks());
        let (mut x, mut y): (&[u8], &[u8]) = (&[], &[]);
        loop {
            while x.is_empty() {
                match a.next() {
                    Some(chunk) => x = chunk,
                    // Same length, so `other` is done too.
                    None => return true,
                }
            }
            while y.is_empty() {
                match b.next() {
                    Some(chunk) => y = chunk,
                    None => return false,
                }
            }
            let n = x.len().min(y.len());
            if x[..n] != y[..n] {
                return false;
            }
            (x, y) = (&x[n..], &y[n..]);
        }
    }
}

impl Eq for Payload {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_are_the_head_then_each_part() {
        let parts = Parts::new(
            b"\x1a\x05",
            vec![Bytes::from_static(b"ab"), Bytes::new(), Bytes::from_static(b"cde")],
        )
        .expect("a short head");
        let payload = Payload::from(parts);
        assert_eq!(payload.len(), 7);
        let mut buf = BytesMut::from(&b"x"[..]);
        payload.put_into(&mut buf);
        assert_eq!(&buf[..], b"x\x1a\x05abcde");
        assert_eq!(payload, Payload::from(Bytes::from_static(b"\x1a\x05abcde")));
        assert_ne!(payload, Payload::from(Bytes::from_static(b"\x1a\x05abcdf")));
        assert_ne!(payload, Payload::from(Bytes::from_static(b"\x1a\x05abcd")));
        let cut_elsewhere =
            Parts::new(b"\x1a", vec![Bytes::from_static(b"\x05abc"), Bytes::from_static(b"de")]);
        assert_eq!(payload, Payload::from(cut_elsewhere.unwrap()));
        assert_eq!(payload.into_bytes(), Bytes::from_static(b"\x1a\x05abcde"));
    }

    #[test]
    fn a_head_past_the_maximum_is_refused() {
        assert!(Parts::new(&[0; Parts::MAX_HEAD], Vec::new()).is_ok());
        let given_back = Parts::new(&[0; Parts::MAX_HEAD + 1], vec![Bytes::from_static(b"p")]);
        assert_eq!(given_back.unwrap_err(), [Bytes::from_static(b"p")]);
        assert!(Payload::from(Parts::new(&[], Vec::new()).unwrap()).is_empty());
    }
}
