//! Who is connecting. The gateway asks an [`AuthProvider`] once per new session, with the token
//! from the Hello; a resume is proven by the session's resume token instead.

use std::fmt;

use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde::Deserialize;

use crate::config::{AuthConfig, AuthMode, ConfigError, JwtAlgorithm};

/// The identity an accepted token stands for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub player_id: String,
}

/// Why a token was refused. The reason goes back to the client in the Close message.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    #[error("a token is required")]
    MissingToken,
    #[error("token rejected: {0}")]
    Invalid(#[from] jsonwebtoken::errors::Error),
    #[error("token has an empty `sub` claim")]
    EmptySubject,
}

/// Turns a Hello token into an identity. Called on the connection's task: keep it fast.
pub trait AuthProvider: Send + Sync + fmt::Debug + 'static {
    fn authenticate(&self, token: &str) -> Result<Identity, AuthError>;

    /// True when anyone may connect; logged loudly at startup.
    fn is_dev(&self) -> bool {
        false
    }
}

/// Accepts everyone. The token, if any, is taken as the player id; otherwise the gateway makes
/// one up from the session id.
#[derive(Debug, Default)]
pub struct DevAuth;

impl AuthProvider for DevAuth {
    fn authenticate(&self, token: &str) -> Result<Identity, AuthError> {
        Ok(Identity { player_id: token.to_owned() })
    }

    fn is_dev(&self) -> bool {
        true
    }
}

/// Verifies JWTs signed with HS256 (shared secret) or RS256 (public key). `exp` is required;
/// `sub` becomes the player id.
pub struct JwtAuth {
    key: DecodingKey,
    validation: Validation,
}

impl fmt::Debug for JwtAuth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JwtAuth").field("algorithms", &self.validation.algorithms).finish()
    }
}

#[derive(Deserialize)]
struct Claims {
    sub: String,
}

impl JwtAuth {
    pub fn new(key: DecodingKey, algorithm: Algorithm) -> JwtAuth {
        let mut validation = Validation::new(algorithm);
        validation.set_required_spec_claims(&["exp", "sub"]);
        JwtAuth { key, validation }
    }

    /// Builds the provider from the `[auth]` section.
    pub fn from_config(config: &AuthConfig) -> Result<JwtAuth, ConfigError> {
        let invalid = |m: String| ConfigError::Invalid(m);
        let (key, algorithm) = match config.jwt_algorithm {
            JwtAlgorithm::HS256 => {
                let secret = config
                    .jwt_secret
                    .as_deref()
                    .filter(|s| !s.is_empty())
                    .ok_or_else(|| invalid("auth.jwt_secret is required for HS256".into()))?;
                (DecodingKey::from_secret(secret.as_bytes()), Algorithm::HS256)
            }
            JwtAlgorithm::RS256 => {
                let path = config
                    .jwt_public_key_file
                    .as_ref()
                    .ok_or_else(|| invalid("auth.jwt_public_key_file is required for RS256".into()))?;
                let pem =
                    std::fs::read(path).map_err(|source| ConfigError::Read { path: path.clone(), source })?;
                let key = DecodingKey::from_rsa_pem(&pem)
                    .map_err(|e| invalid(format!("{}: {e}", path.display())))?;
                (key, Algorithm::RS256)
            }
        };
        let mut auth = JwtAuth::new(key, algorithm);
        if let Some(iss) = &config.jwt_issuer {
            auth.validation.set_issuer(&[iss]);
        }
        if let Some(aud) = &config.jwt_audience {
            auth.validation.set_audience(&[aud]);
        }
        Ok(auth)
    }
}

impl AuthProvider for JwtAuth {
    fn authenticate(&self, token: &str) -> Result<Identity, AuthError> {
        if token.is_empty() {
            return Err(AuthError::MissingToken);
        }
        let data = jsonwebtoken::decode::<Claims>(token, &self.key, &self.validation)?;
        if data.claims.sub.is_empty() {
            return Err(AuthError::EmptySubject);
        }
        Ok(Identity { player_id: data.claims.sub })
    }
}

/// The provider the configuration asks for.
pub(crate) fn provider_from_config(config: &AuthConfig) -> Result<Box<dyn AuthProvider>, ConfigError> {
    Ok(match config.mode {
        AuthMode::Dev => Box::new(DevAuth),
        AuthMode::Jwt => Box::new(JwtAuth::from_config(config)?),
    })
}

#[cfg(test)]
mod tests {
    use std::time::{SystemTime, UNIX_EPOCH};

    use jsonwebtoken::{EncodingKey, Header};

    use super::*;

    fn token(secret: &str, sub: &str, exp_offset: i64) -> String {
        let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs() as i64;
        let claims = serde_json_like(sub, now + exp_offset);
        jsonwebtoken::encode(
            &Header::new(Algorithm::HS256),
            &claims,
            &EncodingKey::from_secret(secret.as_bytes()),
        )
        .unwrap()
    }

    #[derive(serde::Serialize)]
    struct TestClaims {
        sub: String,
        exp: i64,
    }

    fn serde_json_like(sub: &str, exp: i64) -> TestClaims {
        TestClaims { sub: sub.into(), exp }
    }

    fn hs256(secret: &str) -> JwtAuth {
        JwtAuth::from_config(&AuthConfig {
            mode: AuthMode::Jwt,
            jwt_secret: Some(secret.into()),
            ..Default::default()
        })
        .unwrap()
    }

    #[test]
    fn valid_hs256_token_yields_its_subject() {
        let auth = hs256("s3cret");
        let id = auth.authenticate(&token("s3cret", "player-7", 60)).unwrap();
        assert_eq!(id.player_id, "player-7");
    }

    #[test]
    fn forged_expired_missing_and_garbage_tokens_are_refused() {
        let auth = hs256("s3cret");
        assert!(matches!(auth.authenticate(&token("other", "p", 60)), Err(AuthError::Invalid(_))));
        assert!(matches!(auth.authenticate(&token("s3cret", "p", -3600)), Err(AuthError::Invalid(_))));
        assert!(matches!(auth.authenticate(""), Err(AuthError::MissingToken)));
        assert!(matches!(auth.authenticate("not.a.jwt"), Err(AuthError::Invalid(_))));
        assert!(matches!(auth.authenticate(&token("s3cret", "", 60)), Err(AuthError::EmptySubject)));
    }

    #[test]
    fn jwt_mode_needs_a_key() {
        let cfg = AuthConfig { mode: AuthMode::Jwt, ..Default::default() };
        assert!(JwtAuth::from_config(&cfg).is_err());
        let rs = AuthConfig { jwt_algorithm: JwtAlgorithm::RS256, ..cfg };
        assert!(JwtAuth::from_config(&rs).is_err());
    }
}
