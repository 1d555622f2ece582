//! Who may do what: bearer tokens with grants per namespace and action, as Cloud DDC scopes
//! them. Two kinds of token, from one TOML file: static tokens (`[[tokens]]`, what an editor's
//! `OAuthAccessToken=` sends) and JWTs verified against a key set (`[jwt]`, see [`jwt`]). A
//! missing or unknown token is 401; a known token without the grant is 403. Running without
//! auth must be asked for (`Auth::Dev`) and is logged as a warning.

pub mod jwt;

use serde::Deserialize;
use subtle::ConstantTimeEq;

use crate::Name;
use jwt::{Jwt, JwtConfig};

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

/// A tokens file: `[[tokens]]` tables of [`Grant`], and an optional `[jwt]` table.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokensFile {
    #[serde(default)]
    pub tokens: Vec<Grant>,
    #[serde(default)]
    pub jwt: Option<JwtConfig>,
}

#[derive(Debug)]
pub enum Auth {
    /// Anyone may do anything. Only when explicitly configured.
    Dev,
    /// Static tokens, and JWTs when a key set is configured.
    Tokens { grants: Vec<Grant>, jwt: Option<Jwt> },
}

#[derive(Debug, thiserror::Error)]
pub enum AuthConfigError {
    #[error(transparent)]
    Toml(#[from] toml::de::Error),
    #[error(transparent)]
    Jwt(#[from] jwt::JwtConfigError),
    #[error("the tokens file grants nothing: add [[tokens]] or a [jwt] key set")]
    Empty,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    #[error("missing or unknown bearer token")]
    Unauthorized,
    #[error("this token may not {0:?} in this namespace")]
    Forbidden(Action),
}

impl Auth {
    pub fn from_toml(text: &str) -> Result<Auth, AuthConfigError> {
        let file = toml::from_str::<TokensFile>(text)?;
        if file.tokens.is_empty() && file.jwt.is_none() {
            return Err(AuthConfigError::Empty);
        }
        let jwt = file.jwt.as_ref().map(Jwt::from_config).transpose()?;
        Ok(Auth::Tokens { grants: file.tokens, jwt })
    }

    /// Checks an `Authorization` header value (`Bearer <token>`, the scheme in any case: the
    /// editor's `AuthScheme` is configurable) for `action` on `ns`.
    pub fn check(&self, header: Option<&str>, ns: &Name, action: Action) -> Result<(), AuthError> {
        let (grants, jwt) = match self {
            Auth::Dev => return Ok(()),
            Auth::Tokens { grants, jwt } => (grants, jwt),
        };
        let token = header.and_then(bearer_token).ok_or(AuthError::Unauthorized)?;
        // A JWT has three dot-separated parts; a static token is looked up.
        if let Some(jwt) = jwt
            && token.split('.').count() == 3
            && let Some(scopes) = jwt.verify(token)
        {
            return if scopes.allows(ns, action) { Ok(()) } else { Err(AuthError::Forbidden(action)) };
        }
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

/// The token of an `Authorization` value of the bearer scheme, whose name HTTP compares
/// without case (RFC 9110 11.1).
fn bearer_token(value: &str) -> Option<&str> {
    let (scheme, token) = value.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then_some(token)
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
        for scheme in ["bearer", "BEARER", "BeArEr"] {
            let header = format!("{scheme} reader");
            assert_eq!(auth.check(Some(&header), &ns, Action::ReadObject), Ok(()), "{scheme}");
        }
        for bad in [
            None,
            Some("reader"),
            Some("Bearer nope"),
            Some("Bearer "),
            Some("Basic cmVhZGVy"),
            Some("Bearerreader"),
        ] {
            assert_eq!(auth.check(bad, &ns, Action::ReadObject), Err(AuthError::Unauthorized), "{bad:?}");
        }
        assert_eq!(Auth::Dev.check(None, &ns, Action::AdminAction), Ok(()));
        assert!(Auth::from_toml("[[tokens]]\ntoken = 1").is_err());
    }
}

#[cfg(test)]
mod jwt_tests {
    use std::time::{SystemTime, UNIX_EPOCH};

    use jsonwebtoken::{EncodingKey, Header};
    use serde_json::json;

    use super::*;

    fn now() -> u64 {
        SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs()
    }

    fn sign(
        alg: jsonwebtoken::Algorithm,
        kid: Option<&str>,
        key: &EncodingKey,
        claims: serde_json::Value,
    ) -> String {
        let mut header = Header::new(alg);
        header.kid = kid.map(str::to_owned);
        format!("Bearer {}", jsonwebtoken::encode(&header, &claims, key).unwrap())
    }

    #[test]
    fn jwts_grant_their_scopes_per_namespace() {
        let dir = tempfile::tempdir().unwrap();
        let ec = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let ec_pub = dir.path().join("ec.pem");
        std::fs::write(&ec_pub, ec.public_key_pem()).unwrap();
        let auth = Auth::from_toml(&format!(
            r#"
            [[tokens]]
            token = "static"
            namespaces = ["*"]
            actions = ["ReadObject"]

            [jwt]
            audience = "ddc"
            keys = [
                {{ kid = "one", algorithm = "HS256", secret = "first secret" }},
                {{ kid = "two", algorithm = "HS256", secret = "second secret" }},
                {{ algorithm = "ES256", public_key_file = "{}" }},
            ]
            "#,
            ec_pub.display()
        ))
        .unwrap();
        let ns: Name = "ue.ddc".parse().unwrap();
        let other: Name = "other".parse().unwrap();
        let claims = |scope: serde_json::Value| json!({ "exp": now() + 60, "aud": "ddc", "scope": scope });
        let hs = |kid: &str, secret: &str, c| {
            sign(jsonwebtoken::Algorithm::HS256, Some(kid), &EncodingKey::from_secret(secret.as_bytes()), c)
        };

        // Scopes as a space-separated string: read one namespace, write it.
        let t = hs("two", "second secret", claims(json!("ue.ddc:read ue.ddc:write")));
        assert_eq!(auth.check(Some(&t), &ns, Action::ReadObject), Ok(()));
        assert_eq!(auth.check(Some(&t), &ns, Action::WriteObject), Ok(()));
        assert_eq!(
            auth.check(Some(&t), &ns, Action::DeleteObject),
            Err(AuthError::Forbidden(Action::DeleteObject))
        );
        assert_eq!(
            auth.check(Some(&t), &other, Action::ReadObject),
            Err(AuthError::Forbidden(Action::ReadObject))
        );
        // As an array, with `*`; ES256.
        let es_key = EncodingKey::from_ec_pem(ec.serialize_pem().as_bytes()).unwrap();
        let t = sign(jsonwebtoken::Algorithm::ES256, None, &es_key, claims(json!(["*:delete"])));
        assert_eq!(auth.check(Some(&t), &other, Action::DeleteBucket), Ok(()));
        assert_eq!(
            auth.check(Some(&t), &other, Action::ReadObject),
            Err(AuthError::Forbidden(Action::ReadObject))
        );

        // Refused: wrong secret for the kid, expired, wrong audience, no audience, garbage.
        let bad = [
            hs("one", "second secret", claims(json!("ue.ddc:read"))),
            hs("one", "first secret", json!({ "exp": now() - 3600, "aud": "ddc", "scope": "ue.ddc:read" })),
            hs("one", "first secret", json!({ "exp": now() + 60, "aud": "other", "scope": "ue.ddc:read" })),
            hs("one", "first secret", json!({ "exp": now() + 60, "scope": "ue.ddc:read" })),
            "Bearer a.b.c".to_owned(),
        ];
        for t in &bad {
            assert_eq!(auth.check(Some(t), &ns, Action::ReadObject), Err(AuthError::Unauthorized), "{t}");
        }
        // The static token still works beside them.
        assert_eq!(auth.check(Some("Bearer static"), &other, Action::ReadObject), Ok(()));
        assert!(matches!(Auth::from_toml(""), Err(AuthConfigError::Empty)));
        assert!(matches!(
            Auth::from_toml("[jwt]\nkeys = [{ algorithm = \"HS256\" }]"),
            Err(AuthConfigError::Jwt(_))
        ));
    }

    /// A test-only RSA key pair (tests/fixtures/jwt-rs256-test-key*.pem, made with openssl for
    /// these tests and nothing else).
    #[test]
    fn rs256_tokens_verify_and_the_public_key_is_no_hmac_secret() {
        let public = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/jwt-rs256-test-key.pub.pem");
        let auth = Auth::from_toml(&format!(
            "[jwt]\nkeys = [{{ kid = \"rsa\", algorithm = \"RS256\", public_key_file = \"{public}\" }}]"
        ))
        .unwrap();
        let ns: Name = "ue.ddc".parse().unwrap();
        let private = include_str!("../../tests/fixtures/jwt-rs256-test-key.pem");
        let claims = json!({ "exp": now() + 60, "scope": ["ue.ddc:write"] });
        let key = EncodingKey::from_rsa_pem(private.as_bytes()).unwrap();
        let t = sign(jsonwebtoken::Algorithm::RS256, Some("rsa"), &key, claims.clone());
        assert_eq!(auth.check(Some(&t), &ns, Action::WriteObject), Ok(()));
        assert_eq!(
            auth.check(Some(&t), &ns, Action::ReadObject),
            Err(AuthError::Forbidden(Action::ReadObject))
        );
        // The classic confusion: an HS256 token whose secret is the (public) RSA key.
        let public_pem = std::fs::read(public).unwrap();
        let forged =
            sign(jsonwebtoken::Algorithm::HS256, Some("rsa"), &EncodingKey::from_secret(&public_pem), claims);
        assert_eq!(auth.check(Some(&forged), &ns, Action::WriteObject), Err(AuthError::Unauthorized));
    }
}
