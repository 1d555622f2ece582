//! Namespace and bucket names, and ref keys. They become directory names and SQL keys, so they
//! are checked once, here: letters, digits, `.`, `_` and `-` (upper case folded to lower case,
//! as the editor sends buckets in mixed case on some paths), 1 to 64 characters for a
//! namespace and 1 to 256 for a bucket, and nothing that could climb out of a directory.

use std::fmt;
use std::str::FromStr;

/// A valid namespace or bucket name.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Name(String);

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum NameError {
    #[error("a name has 1 to {max} characters, got {len}")]
    Length { len: usize, max: usize },
    #[error("a name may hold only a-z, 0-9, '.', '_' and '-': {0:?}")]
    Characters(String),
    #[error("a name may not start or end with '.' or contain '..': {0:?}")]
    Dots(String),
    #[error("a ref key is 40 characters of 0-9 and a-z: {0:?}")]
    Key(String),
}

/// The longest namespace name.
pub const MAX_NAMESPACE: usize = 64;
/// The longest bucket name.
pub const MAX_BUCKET: usize = 256;

/// A namespace name (`FromStr`); see [`Name::bucket`] for buckets.
impl FromStr for Name {
    type Err = NameError;

    fn from_str(s: &str) -> Result<Name, NameError> {
        Name::checked(s, MAX_NAMESPACE)
    }
}

impl Name {
    /// A bucket name: as a namespace, but up to [`MAX_BUCKET`] characters.
    pub fn bucket(s: &str) -> Result<Name, NameError> {
        Name::checked(s, MAX_BUCKET)
    }

    fn checked(s: &str, max: usize) -> Result<Name, NameError> {
        if s.is_empty() || s.len() > max {
            return Err(NameError::Length { len: s.len(), max });
        }
        let shown = || s.chars().take(MAX_NAMESPACE).collect::<String>();
        if !s.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-')) {
            return Err(NameError::Characters(shown()));
        }
        if s.starts_with('.') || s.ends_with('.') || s.contains("..") {
            return Err(NameError::Dots(shown()));
        }
        Ok(Name(s.to_ascii_lowercase()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// A ref key: 40 characters of `0-9a-z` after folding to lower case (in practice the IoHash of
/// the editor's cache key).
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RefKey(String);

impl FromStr for RefKey {
    type Err = NameError;

    fn from_str(s: &str) -> Result<RefKey, NameError> {
        if s.len() != 40 || !s.bytes().all(|b| b.is_ascii_alphanumeric()) {
            return Err(NameError::Key(s.chars().take(MAX_NAMESPACE).collect()));
        }
        Ok(RefKey(s.to_ascii_lowercase()))
    }
}

impl RefKey {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for RefKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for RefKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.0)
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
            assert_eq!(ok.parse::<Name>().unwrap().as_str(), ok);
        }
        for bad in
            ["", "..", "../etc", ".hidden", "trailing.", "a/b", "ns with space", "é", &"x".repeat(65), "a\0b"]
        {
            assert!(bad.parse::<Name>().is_err(), "{bad:?}");
        }
        // Upper case is folded: the editor sends `LegacyDDC...` on blob paths and
        // `legacyddc...` on ref paths, and both must name one bucket.
        assert_eq!(Name::bucket("LegacyDDC_Mesh").unwrap(), Name::bucket("legacyddc_mesh").unwrap());
        assert_eq!("UE.DDC".parse::<Name>().unwrap().as_str(), "ue.ddc");
        assert!(Name::bucket(&"b".repeat(256)).is_ok());
        assert!(Name::bucket(&"b".repeat(257)).is_err());
        assert!("b".repeat(65).parse::<Name>().is_err(), "namespaces stop at 64");
    }

    #[test]
    fn ref_keys_are_40_alphanumerics_folded() {
        let key = "4878CA0425c739fa427f7eda20fe845f6b2e46ba";
        assert_eq!(key.parse::<RefKey>().unwrap().as_str(), key.to_ascii_lowercase());
        for bad in [
            "",
            "abc",
            &"a".repeat(41),
            "4878ca0425c739fa427f7eda20fe845f6b2e46b.",
            "../../../../../../../../../../../../etc/x",
        ] {
            assert!(bad.parse::<RefKey>().is_err(), "{bad:?}");
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
