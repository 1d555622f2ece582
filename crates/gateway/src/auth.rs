//! Who is connecting, and in which role. The gateway asks an [`AuthProvider`] once per new
//! session, with the token from the Hello; a resume is proven by the session's resume token
//! instead. The role comes from the credential: a player and a game server are different
//! principals, in dev mode too (docs/protocol.md section 4).

use std::fmt;

use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde::Deserialize;

use crate::config::{AuthConfig, AuthMode, ConfigError, DEFAULT_JWT_LEEWAY_SECS, JwtAlgorithm};

/// The shortest HS256 secret accepted, in bytes (RFC 7518 §3.2: the hash's size).
const MIN_HS256_SECRET: usize = 32;
/// The most clock skew tolerated on `exp` and `nbf`.
const MAX_JWT_LEEWAY: std::time::Duration = std::time::Duration::from_secs(600);

/// The identity an accepted token stands for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub player_id: String,
    pub role: Role,
}

/// What a session may do. Only game servers create, own, claim and remove channels (unless a
/// channel type's config lets players own it).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Role {
    #[default]
    Player,
    Server,
}

/// The longest player id (a JWT `sub`, or a dev token), in bytes.
pub const MAX_PLAYER_ID_BYTES: usize = 128;

/// In dev mode, a token with this prefix logs in as a game server named by the rest.
pub const DEV_SERVER_PREFIX: &str = "server:";

/// Checks a player id: 1 to 128 bytes of `A-Z a-z 0-9` and `_ - . : @ | +`.
pub fn check_player_id(id: &str) -> Result<(), AuthError> {
    if id.is_empty() {
        return Err(AuthError::EmptySubject);
    }
    if id.len() > MAX_PLAYER_ID_BYTES {
        return Err(AuthError::BadSubject(format!("longer than {MAX_PLAYER_ID_BYTES} bytes")));
    }
    match id.bytes().find(|b| !(b.is_ascii_alphanumeric() || b"_-.:@|+".contains(b))) {
        Some(b) => Err(AuthError::BadSubject(format!("byte 0x{b:02x} is not allowed"))),
        None => Ok(()),
    }
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
    #[error("the player id is not allowed: {0}")]
    BadSubject(String),
    #[error("unknown role {0:?} (want \"player\" or \"server\")")]
    UnknownRole(String),
}

/// Turns a Hello token into an identity. Called on the connection's task: keep it fast.
pub trait AuthProvider: Send + Sync + fmt::Debug + 'static {
    fn authenticate(&self, token: &str) -> Result<Identity, AuthError>;

    /// True when anyone may connect; logged loudly at startup.
    fn is_dev(&self) -> bool {
        false
    }
}

/// Accepts everyone. The token, if any, is taken as the player id (the gateway makes one up
/// from the session id for an empty one); `server:NAME` logs in as the game server `NAME`.
#[derive(Debug, Default)]
pub struct DevAuth;

impl AuthProvider for DevAuth {
    fn authenticate(&self, token: &str) -> Result<Identity, AuthError> {
        let (player_id, role) = match token.strip_prefix(DEV_SERVER_PREFIX) {
            Some(name) => (name, Role::Server),
            None => (token, Role::Player),
        };
        if !player_id.is_empty() || role == Role::Server {
            check_player_id(player_id)?;
        }
        Ok(Identity { player_id: player_id.to_owned(), role })
    }

    fn is_dev(&self) -> bool {
        true
    }
}

/// Verifies JWTs signed with HS256 (shared secret) or RS256 (public key). `exp` and `sub` are
/// required, and `iss` and `aud` when configured; `nbf` is honoured; clocks may differ by the
/// configured leeway (5 s by default). `sub` becomes the player id; the optional `role` claim
/// (`"player"` or `"server"`) the role.
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
    #[serde(default)]
    role: Option<String>,
}

impl JwtAuth {
    pub fn new(key: DecodingKey, algorithm: Algorithm) -> JwtAuth {
        let mut validation = Validation::new(algorithm);
        validation.set_required_spec_claims(&["exp", "sub"]);
        validation.validate_nbf = true;
        validation.leeway = DEFAULT_JWT_LEEWAY_SECS;
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
                // RFC 7518 §3.2: an HS256 key of at least the hash's 256 bits. A short one can
                // be found offline from one token, and then any token forged, `role: server`
                // included.
                if secret.len() < MIN_HS256_SECRET {
                    return Err(invalid(format!(
                        "auth.jwt_secret must be at least {MIN_HS256_SECRET} bytes (it is {}): use a random one, e.g. `openssl rand -hex 32`",
                        secret.len()
                    )));
                }
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
        if config.jwt_leeway > MAX_JWT_LEEWAY {
            return Err(invalid(format!(
                "auth.jwt_leeway must be at most {}s: more would make `exp` meaningless",
                MAX_JWT_LEEWAY.as_secs()
            )));
        }
        let mut auth = JwtAuth::new(key, algorithm);
        auth.validation.leeway = config.jwt_leeway.as_secs();
        let mut required = vec!["exp", "sub"];
        if let Some(iss) = &config.jwt_issuer {
            auth.validation.set_issuer(&[iss]);
            required.push("iss");
        }
        if let Some(aud) = &config.jwt_audience {
            auth.validation.set_audience(&[aud]);
            required.push("aud");
        }
        // A configured issuer or audience must be present, not only right when present.
        auth.validation.set_required_spec_claims(&required);
        Ok(auth)
    }
}

impl AuthProvider for JwtAuth {
    fn authenticate(&self, token: &str) -> Result<Identity, AuthError> {
        if token.is_empty() {
            return Err(AuthError::MissingToken);
        }
        let data = jsonwebtoken::decode::<Claims>(token, &self.key, &self.validation)?;
        check_player_id(&data.claims.sub)?;
        let role = match data.claims.role.as_deref() {
            None | Some("player") => Role::Player,
            Some("server") => Role::Server,
            Some(other) => return Err(AuthError::UnknownRole(other.to_owned())),
        };
        Ok(Identity { player_id: data.claims.sub, role })
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

    #[derive(serde::Serialize, Default)]
    struct TestClaims {
        sub: String,
        exp: i64,
        #[serde(skip_serializing_if = "Option::is_none")]
        nbf: Option<i64>,
        #[serde(skip_serializing_if = "Option::is_none")]
        iss: Option<String>,
        #[serde(skip_serializing_if = "Option::is_none")]
        aud: Option<String>,
        #[serde(skip_serializing_if = "Option::is_none")]
        role: Option<String>,
    }

    fn serde_json_like(sub: &str, exp: i64) -> TestClaims {
        TestClaims { sub: sub.into(), exp, ..Default::default() }
    }

    fn now() -> i64 {
        SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs() as i64
    }

    fn signed(secret: &str, claims: &TestClaims) -> String {
        jsonwebtoken::encode(
            &Header::new(Algorithm::HS256),
            claims,
            &EncodingKey::from_secret(secret.as_bytes()),
        )
        .unwrap()
    }

    /// A secret of the shortest length accepted.
    const K: &str = "0123456789abcdef0123456789abcdef";

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
        let auth = hs256(K);
        let id = auth.authenticate(&token(K, "player-7", 60)).unwrap();
        assert_eq!(id.player_id, "player-7");
    }

    #[test]
    fn forged_expired_missing_and_garbage_tokens_are_refused() {
        let auth = hs256(K);
        assert!(matches!(auth.authenticate(&token("other", "p", 60)), Err(AuthError::Invalid(_))));
        assert!(matches!(auth.authenticate(&token(K, "p", -3600)), Err(AuthError::Invalid(_))));
        assert!(matches!(auth.authenticate(""), Err(AuthError::MissingToken)));
        assert!(matches!(auth.authenticate("not.a.jwt"), Err(AuthError::Invalid(_))));
        assert!(matches!(auth.authenticate(&token(K, "", 60)), Err(AuthError::EmptySubject)));
    }

    #[test]
    fn a_configured_issuer_and_audience_must_be_present() {
        let auth = JwtAuth::from_config(&AuthConfig {
            mode: AuthMode::Jwt,
            jwt_secret: Some(K.into()),
            jwt_issuer: Some("studio".into()),
            jwt_audience: Some("game".into()),
            ..Default::default()
        })
        .unwrap();
        let mut claims = serde_json_like("p", now() + 60);
        assert!(matches!(auth.authenticate(&signed(K, &claims)), Err(AuthError::Invalid(_))), "neither");
        claims.iss = Some("studio".into());
        assert!(matches!(auth.authenticate(&signed(K, &claims)), Err(AuthError::Invalid(_))), "no aud");
        claims.aud = Some("game".into());
        assert!(auth.authenticate(&signed(K, &claims)).is_ok());
        claims.aud = Some("other".into());
        assert!(matches!(auth.authenticate(&signed(K, &claims)), Err(AuthError::Invalid(_))), "wrong aud");
    }

    #[test]
    fn leeway_is_seconds_and_nbf_is_honoured() {
        let auth = hs256(K);
        // Expired 30 s ago: past the 5 s default leeway (the library's own default is 60 s).
        assert!(matches!(auth.authenticate(&token(K, "p", -30)), Err(AuthError::Invalid(_))));
        assert!(auth.authenticate(&token(K, "p", -2)).is_ok(), "within the leeway");
        let mut early = serde_json_like("p", now() + 600);
        early.nbf = Some(now() + 300);
        assert!(matches!(auth.authenticate(&signed(K, &early)), Err(AuthError::Invalid(_))), "not yet valid");
    }

    #[test]
    fn the_subject_is_bounded_and_the_role_comes_from_the_token() {
        let auth = hs256(K);
        let long = "x".repeat(MAX_PLAYER_ID_BYTES + 1);
        assert!(matches!(auth.authenticate(&token(K, &long, 60)), Err(AuthError::BadSubject(_))));
        assert!(matches!(auth.authenticate(&token(K, "a b", 60)), Err(AuthError::BadSubject(_))));
        assert!(matches!(auth.authenticate(&token(K, "p\u{e9}", 60)), Err(AuthError::BadSubject(_))));
        assert_eq!(auth.authenticate(&token(K, "auth0|42", 60)).unwrap().role, Role::Player);
        let mut server = serde_json_like("zone-1", now() + 60);
        server.role = Some("server".into());
        assert_eq!(auth.authenticate(&signed(K, &server)).unwrap().role, Role::Server);
        server.role = Some("admin".into());
        assert!(matches!(auth.authenticate(&signed(K, &server)), Err(AuthError::UnknownRole(_))));
    }

    #[test]
    fn dev_mode_says_server_with_a_prefix() {
        let dev = DevAuth;
        assert_eq!(
            dev.authenticate("alice").unwrap(),
            Identity { player_id: "alice".into(), role: Role::Player }
        );
        assert_eq!(
            dev.authenticate("server:zone-1").unwrap(),
            Identity { player_id: "zone-1".into(), role: Role::Server }
        );
        assert_eq!(dev.authenticate("").unwrap().role, Role::Player, "anonymous player");
        assert!(dev.authenticate("server:").is_err(), "a server needs a name");
        assert!(dev.authenticate("bad name").is_err());
    }

    #[test]
    fn a_short_secret_and_a_long_leeway_are_refused() {
        let cfg = |secret: &str, leeway: u64| AuthConfig {
            mode: AuthMode::Jwt,
            jwt_secret: Some(secret.into()),
            jwt_leeway: std::time::Duration::from_secs(leeway),
            ..Default::default()
        };
        let short = JwtAuth::from_config(&cfg(&K[1..], 5)).err().unwrap().to_string();
        assert!(short.contains("at least 32 bytes"), "{short}");
        let long = JwtAuth::from_config(&cfg(K, 601)).err().unwrap().to_string();
        assert!(long.contains("at most 600s"), "{long}");
        assert!(JwtAuth::from_config(&cfg(K, 600)).is_ok());
    }

    #[test]
    fn jwt_mode_needs_a_key() {
        let cfg = AuthConfig { mode: AuthMode::Jwt, ..Default::default() };
        assert!(JwtAuth::from_config(&cfg).is_err());
        let rs = AuthConfig { jwt_algorithm: JwtAlgorithm::RS256, ..cfg };
        assert!(JwtAuth::from_config(&rs).is_err());
    }
}
