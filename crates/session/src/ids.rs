//! Session identifiers and resume tokens: 128-bit random values chosen by the server.

use std::fmt;

use subtle::ConstantTimeEq;

/// Public identifier of a session.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SessionId(pub [u8; 16]);

/// Secret that proves the right to resume a session. Compared in constant time.
#[derive(Clone, Copy)]
pub struct ResumeToken(pub [u8; 16]);

impl SessionId {
    /// Reads an id from wire bytes; `None` unless exactly 16 bytes.
    pub fn from_slice(bytes: &[u8]) -> Option<SessionId> {
        bytes.try_into().ok().map(SessionId)
    }
}

impl ResumeToken {
    /// Reads a token from wire bytes; `None` unless exactly 16 bytes.
    pub fn from_slice(bytes: &[u8]) -> Option<ResumeToken> {
        bytes.try_into().ok().map(ResumeToken)
    }

    /// Constant-time comparison against a presented token.
    pub fn verify(&self, presented: &[u8]) -> bool {
        presented.len() == 16 && bool::from(self.0.ct_eq(presented))
    }
}

impl fmt::Debug for SessionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl fmt::Display for SessionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for b in &self.0 {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for ResumeToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ResumeToken(..)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_verification_needs_exact_bytes() {
        let token = ResumeToken([7; 16]);
        assert!(token.verify(&[7; 16]));
        assert!(!token.verify(&[7; 15]));
        let mut other = [7; 16];
        other[15] = 8;
        assert!(!token.verify(&other));
        assert_eq!(SessionId::from_slice(&[1; 16]).unwrap().to_string(), "01".repeat(16));
        assert!(SessionId::from_slice(&[1; 17]).is_none());
    }
}
