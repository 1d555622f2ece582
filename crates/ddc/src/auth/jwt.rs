//! JWT bearer tokens for the DDC: verified against a configured key set (HS256 secrets, RS256
//! and ES256 public keys, chosen by the token's `kid` or else by its algorithm), with `exp`
//! required, `nbf` honoured, and `iss`/`aud` when configured. What a token may do comes from one
//! claim (`scope` unless configured otherwise): a list of `NAMESPACE:read`, `NAMESPACE:write`,
//! `NAMESPACE:delete` and `NAMESPACE:admin` entries (`*` for every namespace), as an array or a
//! space-separated string, the way OAuth scopes are written.

use std::path::PathBuf;
use std::time::Duration;

use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde::Deserialize;

use super::Action;
use crate::Name;

/// The `[jwt]` table of a tokens file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JwtConfig {
    pub keys: Vec<KeyConfig>,
    #[serde(default)]
    pub issuer: Option<String>,
    #[serde(default)]
    pub audience: Option<String>,
    /// The claim holding the scopes.
    #[serde(default = "default_claim")]
    pub scopes_claim: String,
    /// Clock difference tolerated on `exp` and `nbf`.
    #[serde(default = "default_leeway", with = "humantime_serde")]
    pub leeway: Duration,
}

fn default_claim() -> String {
    "scope".into()
}

fn default_leeway() -> Duration {
    Duration::from_secs(5)
}

/// One verification key.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeyConfig {
    /// Matched against the token header's `kid`, when both have one.
    #[serde(default)]
    pub kid: Option<String>,
    pub algorithm: KeyAlgorithm,
    /// HS256: the shared secret.
    #[serde(default)]
    pub secret: Option<String>,
    /// RS256 and ES256: the public key, PEM.
    #[serde(default)]
    pub public_key_file: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub enum KeyAlgorithm {
    HS256,
    RS256,
    ES256,
}

#[derive(Debug, thiserror::Error)]
pub enum JwtConfigError {
    #[error("jwt.keys[{index}]: {what}")]
    Key { index: usize, what: String },
    #[error("jwt.keys is empty")]
    NoKeys,
}

struct Key {
    kid: Option<String>,
    algorithm: Algorithm,
    key: DecodingKey,
}

/// A key set and the rules tokens are checked by.
pub struct Jwt {
    keys: Vec<Key>,
    issuer: Option<String>,
    audience: Option<String>,
    scopes_claim: String,
    leeway: u64,
}

impl std::fmt::Debug for Jwt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Jwt")
            .field("keys", &self.keys.len())
            .field("scopes_claim", &self.scopes_claim)
            .finish()
    }
}

/// What a verified token grants: (namespace or `*`, action).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scopes(Vec<(String, Action)>);

impl Scopes {
    pub fn allows(&self, ns: &Name, action: Action) -> bool {
        self.0.iter().any(|(n, a)| *a == action && (n == "*" || n == ns.as_str()))
    }
}

impl Jwt {
    pub fn from_config(config: &JwtConfig) -> Result<Jwt, JwtConfigError> {
        if config.keys.is_empty() {
            return Err(JwtConfigError::NoKeys);
        }
        let keys = config
            .keys
            .iter()
            .enumerate()
            .map(|(index, k)| {
                let bad = |what: String| JwtConfigError::Key { index, what };
                let pem = || -> Result<Vec<u8>, JwtConfigError> {
                    let path = k
                        .public_key_file
                        .as_ref()
                        .ok_or_else(|| bad("public_key_file is required".into()))?;
                    std::fs::read(path).map_err(|e| bad(format!("{}: {e}", path.display())))
                };
                let (algorithm, key) = match k.algorithm {
                    KeyAlgorithm::HS256 => {
                        let secret = k.secret.as_deref().filter(|s| !s.is_empty());
                        let secret = secret.ok_or_else(|| bad("secret is required for HS256".into()))?;
                        (Algorithm::HS256, DecodingKey::from_secret(secret.as_bytes()))
                    }
                    KeyAlgorithm::RS256 => (
                        Algorithm::RS256,
                        DecodingKey::from_rsa_pem(&pem()?).map_err(|e| bad(e.to_string()))?,
                    ),
                    KeyAlgorithm::ES256 => {
                        (Algorithm::ES256, DecodingKey::from_ec_pem(&pem()?).map_err(|e| bad(e.to_string()))?)
                    }
                };
                Ok(Key { kid: k.kid.clone(), algorithm, key })
            })
            .collect::<Result<_, _>>()?;
        Ok(Jwt {
            keys,
            issuer: config.issuer.clone(),
            audience: config.audience.clone(),
            scopes_claim: config.scopes_claim.clone(),
            leeway: config.leeway.as_secs(),
        })
    }

    /// Verifies a token and returns its scopes; `None` if it is not valid (signature, expiry,
    /// issuer, audience, or no key for it).
    pub fn verify(&self, token: &str) -> Option<Scopes> {
        let header = jsonwebtoken::decode_header(token).ok()?;
        let candidates = self.keys.iter().filter(|k| {
            k.algorithm == header.alg
                && match (&header.kid, &k.kid) {
                    (Some(a), Some(b)) => a == b,
                    _ => true,
                }
        });
        for key in candidates {
            let mut validation = Validation::new(key.algorithm);
            let mut required = vec!["exp"];
            validation.validate_nbf = true;
            validation.leeway = self.leeway;
            if let Some(iss) = &self.issuer {
                validation.set_issuer(&[iss]);
                required.push("iss");
            }
            match &self.audience {
                Some(aud) => {
                    validation.set_audience(&[aud]);
                    required.push("aud");
                }
                None => validation.validate_aud = false,
            }
            validation.set_required_spec_claims(&required);
            if let Ok(data) = jsonwebtoken::decode::<serde_json::Value>(token, &key.key, &validation) {
                return Some(scopes(data.claims.get(&self.scopes_claim)));
            }
        }
        None
    }
}

/// The grants of a scopes claim; entries it does not understand grant nothing.
fn scopes(claim: Option<&serde_json::Value>) -> Scopes {
    let entries: Vec<String> = match claim {
        Some(serde_json::Value::String(s)) => s.split_whitespace().map(str::to_owned).collect(),
        Some(serde_json::Value::Array(a)) => a.iter().filter_map(|v| v.as_str().map(str::to_owned)).collect(),
        _ => Vec::new(),
    };
    let mut out = Vec::new();
    for entry in entries {
        let Some((ns, what)) = entry.rsplit_once(':') else { continue };
        let actions: &[Action] = match what {
            "read" => &[Action::ReadObject, Action::EnumerateBucket],
            "write" => &[Action::WriteObject],
            "delete" => &[Action::DeleteObject, Action::DeleteBucket, Action::DeleteNamespace],
            "admin" => &[
                Action::ReadObject,
                Action::EnumerateBucket,
                Action::WriteObject,
                Action::DeleteObject,
                Action::DeleteBucket,
                Action::DeleteNamespace,
                Action::AdminAction,
            ],
            _ => continue,
        };
        let ns = if ns == "*" { ns.to_owned() } else { ns.to_ascii_lowercase() };
        out.extend(actions.iter().map(|a| (ns.clone(), *a)));
    }
    Scopes(out)
}
