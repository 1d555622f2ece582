//! JWT authentication end to end: a valid token opens a session named after its subject; a
//! forged, expired or missing one is refused with AUTH_FAILED.

mod common;

use std::time::{SystemTime, UNIX_EPOCH};

use jsonwebtoken::{Algorithm, EncodingKey, Header};
use tickwire_client::{ClientError, ConnectOptions, Connection};
use tickwire_wire::proto::CloseReason;

fn jwt(secret: &str, sub: &str, ttl: i64) -> String {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs() as i64;
    let claims = serde_json::json!({ "sub": sub, "exp": now + ttl });
    jsonwebtoken::encode(
        &Header::new(Algorithm::HS256),
        &claims,
        &EncodingKey::from_secret(secret.as_bytes()),
    )
    .unwrap()
}

async fn connect_with(
    gw: &tickwire_gateway::RunningGateway,
    token: String,
) -> Result<Connection, ClientError> {
    let mut opts = ConnectOptions::new(common::tcp_target(gw));
    opts.token = token;
    Connection::connect(opts).await
}

#[tokio::test]
async fn jwt_mode_accepts_signed_tokens_only() {
    let gw =
        common::start(&["auth.mode=jwt", "auth.jwt_secret=\"correct horse battery staple, twice over\""])
            .await;
    let conn =
        connect_with(&gw, jwt("correct horse battery staple, twice over", "player-42", 300)).await.unwrap();
    assert_eq!(conn.welcome().player_id, "player-42");
    for (name, token) in [
        ("forged", jwt("wrong", "p", 300)),
        ("expired", jwt("correct horse battery staple, twice over", "p", -600)),
        ("missing", String::new()),
        ("garbage", "x.y.z".to_owned()),
    ] {
        match connect_with(&gw, token).await {
            Err(ClientError::Closed { reason: CloseReason::AuthFailed, message }) => {
                assert!(!message.is_empty())
            }
            other => panic!("{name} token: expected AUTH_FAILED, got {other:?}"),
        }
    }
}

#[test]
fn jwt_mode_without_a_key_fails_to_start() {
    let config = tickwire_gateway::GatewayConfig::load(None, &["auth.mode=jwt".into()]).unwrap();
    assert!(tickwire_gateway::Gateway::new(config).is_err());
}

#[tokio::test]
async fn rs256_tokens_are_verified_with_the_public_key() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures");
    let key_setting = format!("auth.jwt_public_key_file=\"{dir}/jwt-test-public.pem\"");
    let gw = common::start(&["auth.mode=jwt", "auth.jwt_algorithm=\"RS256\"", &key_setting]).await;
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs() as i64;
    let claims = serde_json::json!({ "sub": "rsa-player", "exp": now + 300 });
    let private = std::fs::read(format!("{dir}/jwt-test-private.pem")).unwrap();
    let key = EncodingKey::from_rsa_pem(&private).unwrap();
    let token = jsonwebtoken::encode(&Header::new(Algorithm::RS256), &claims, &key).unwrap();
    let conn = connect_with(&gw, token).await.unwrap();
    assert_eq!(conn.welcome().player_id, "rsa-player");
    // Algorithm confusion: an HS256 token "signed" with the public key as its secret.
    let public = std::fs::read(format!("{dir}/jwt-test-public.pem")).unwrap();
    let confused =
        jsonwebtoken::encode(&Header::new(Algorithm::HS256), &claims, &EncodingKey::from_secret(&public))
            .unwrap();
    match connect_with(&gw, confused).await {
        Err(ClientError::Closed { reason: CloseReason::AuthFailed, .. }) => {}
        other => panic!("an HS256 token must not pass RS256 verification: {other:?}"),
    }
}
