//! Who may do what: bearer tokens with grants per namespace and action, as Cloud DDC scopes
//! them. A missing or unknown token is 401; a known token without the grant is 403. Running
//! without auth must be asked for (`Auth::Dev`) and is logged as a warning.

use serde::Deserialize;
use subtle::ConstantTimeEq;

use crate::Name;

/// The actions Cloud DDC checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize)]
pub enum Action {
    ReadObject,
    WriteObject,
    DeleteObject,
    EnumerateBucket,
    DeleteBucket,
    DeleteNamespace,
    AdminAction,
}

/// One token's grant: namespaces (`"*"` for all) and actions.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Grant {
    pub token: String,
    pub namespaces: Vec<String>,
    pub actions: Vec<Action>,
}

/// A tokens file: `[[tokens]]` tables of [`Grant`].
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokensFile {
    pub tokens: Vec<Grant>,
}

#[derive(Debug, Clone)]
pub enum Auth {
    /// Anyone may do anything. Only when explicitly configured.
    Dev,
    Tokens(Vec<Grant>),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    #[error("missing or unknown bearer token")]
    Unauthorized,
    #[error("this token may not {0:?} in this namespace")]
    Forbidden(Action),
}

impl Auth {
    pub fn from_toml(text: &str) -> Result<Auth, toml::de::Error> {
        Ok(Auth::Tokens(toml::from_str::<TokensFile>(text)?.tokens))
    }

    /// Checks an `Authorization` header value for `action` on `ns`.
    pub fn check(&self, header: Option<&str>, ns: &Name, action: Action) -> Result<(), AuthError> {
        let grants = match self {
            Auth::Dev => return Ok(()),
            Auth::Tokens(grants) => grants,
        };
        let token = header.and_then(|h| h.strip_prefix("Bearer ")).ok_or(AuthError::Unauthorized)?;
        // Compare every token in constant time, so timing does not reveal a prefix.
        let mut found = None;
        for g in grants {
            if bool::from(g.token.as_bytes().ct_eq(token.as_bytes())) {
                found = Some(g);
            }
        }
        let grant = found.ok_or(AuthError::Unauthorized)?;
        let ns_ok = grant.namespaces.iter().any(|n| n == "*" || n == ns.as_str());
        if ns_ok && grant.actions.contains(&action) { Ok(()) } else { Err(AuthError::Forbidden(action)) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_grant_per_namespace_and_action() {
        let auth = Auth::from_toml(
            r#"
            [[tokens]]
            token = "reader"
            namespaces = ["ue.ddc"]
            actions = ["ReadObject"]

            [[tokens]]
            token = "admin"
            namespaces = ["*"]
            actions = ["ReadObject", "WriteObject", "DeleteObject"]
            "#,
        )
        .unwrap();
        let ns: Name = "ue.ddc".parse().unwrap();
        let other: Name = "other".parse().unwrap();
        assert_eq!(auth.check(Some("Bearer reader"), &ns, Action::ReadObject), Ok(()));
        assert_eq!(
            auth.check(Some("Bearer reader"), &ns, Action::WriteObject),
            Err(AuthError::Forbidden(Action::WriteObject))
        );
        assert_eq!(
            auth.check(Some("Bearer reader"), &other, Action::ReadObject),
            Err(AuthError::Forbidden(Action::ReadObject))
        );
        assert_eq!(auth.check(Some("Bearer admin"), &other, Action::DeleteObject), Ok(()));
        for bad in [None, Some("reader"), Some("Bearer nope"), Some("Bearer "), Some("Basic cmVhZGVy")] {
            assert_eq!(auth.check(bad, &ns, Action::ReadObject), Err(AuthError::Unauthorized), "{bad:?}");
        }
        assert_eq!(Auth::Dev.check(None, &ns, Action::AdminAction), Ok(()));
        assert!(Auth::from_toml("[[tokens]]\ntoken = 1").is_err());
    }
}
