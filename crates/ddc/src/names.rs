//! Namespace and bucket names. They become directory names and SQL keys, so they are checked
//! once, here: lowercase letters, digits, `.`, `_` and `-`, 1 to 64 characters, and nothing
//! that could climb out of a directory.

use std::fmt;
use std::str::FromStr;

/// A valid namespace or bucket name.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Name(String);

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum NameError {
    #[error("a name has 1 to 64 characters, got {0}")]
    Length(usize),
    #[error("a name may hold only a-z, 0-9, '.', '_' and '-': {0:?}")]
    Characters(String),
    #[error("a name may not start with '.' or contain '..': {0:?}")]
    Dots(String),
}

pub const MAX_NAME: usize = 64;

impl FromStr for Name {
    type Err = NameError;

    fn from_str(s: &str) -> Result<Name, NameError> {
        if s.is_empty() || s.len() > MAX_NAME {
            return Err(NameError::Length(s.len()));
        }
        let shown = || s.chars().take(MAX_NAME).collect::<String>();
        if !s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'.' | b'_' | b'-'))
        {
            return Err(NameError::Characters(shown()));
        }
        if s.starts_with('.') || s.contains("..") {
            return Err(NameError::Dots(shown()));
        }
        Ok(Name(s.to_owned()))
    }
}

impl Name {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn accepts_unreal_names_and_refuses_the_rest() {
        for ok in ["ue.ddc", "test-namespace", "bucket_1", "a"] {
            assert!(ok.parse::<Name>().is_ok(), "{ok}");
        }
        for bad in ["", "..", "../etc", ".hidden", "a/b", "A", "ns with space", "é", &"x".repeat(65), "a\0b"]
        {
            assert!(bad.parse::<Name>().is_err(), "{bad:?}");
        }
    }

    proptest! {
        #[test]
        fn a_valid_name_is_one_safe_path_component(s in ".{0,80}") {
            if let Ok(name) = s.parse::<Name>() {
                let path = std::path::Path::new(name.as_str());
                prop_assert_eq!(path.components().count(), 1);
                prop_assert!(matches!(path.components().next(), Some(std::path::Component::Normal(_))));
            }
        }
    }
}
