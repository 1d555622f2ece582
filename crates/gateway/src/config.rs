//! The gateway's settings: one TOML file, every key overridable from the command line with
//! `--set section.key=value`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tickwire_session::SessionConfig;

/// Why a configuration could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("invalid configuration: {0}")]
    Parse(#[from] toml::de::Error),
    #[error("override `{0}` is not of the form section.key=value")]
    BadOverride(String),
    #[error("override `{key}`: `{section}` is not a table")]
    NotATable { key: String, section: String },
    #[error("invalid configuration: {0}")]
    Invalid(String),
}

/// Everything the gateway reads from `tickwire.toml`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GatewayConfig {
    pub listen: ListenConfig,
    pub session: SessionSettings,
    pub limits: LimitsConfig,
    pub auth: AuthConfig,
    pub metrics: MetricsConfig,
    pub channels: crate::channel::ChannelsConfig,
    pub tls: TlsConfig,
    /// `[spatial]`: the grid of cells and spatial servers, when the world is split among game
    /// servers (docs/protocol.md section 14).
    pub spatial: Option<tickwire_spatial::LayoutConfig>,
}

/// `[tls]`: TLS on every session listener (TCP and WebSocket), off by default. Either a
/// certificate and key from PEM files (re-read on SIGHUP), or a self-signed certificate made at
/// start, for demos and tests.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TlsConfig {
    /// The certificate chain, PEM, leaf first.
    pub cert_file: Option<PathBuf>,
    /// Its private key, PEM (PKCS#8, PKCS#1 or SEC1).
    pub key_file: Option<PathBuf>,
    /// Make a self-signed certificate for localhost, 127.0.0.1 and ::1 at start.
    pub self_signed: bool,
    /// With `self_signed`: write its certificate (PEM) here, for clients to trust.
    pub self_signed_cert_out: Option<PathBuf>,
}

impl TlsConfig {
    /// Whether TLS is on.
    pub fn enabled(&self) -> bool {
        self.self_signed || self.cert_file.is_some()
    }
}
/// The Prometheus endpoint.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MetricsConfig {
    /// Serve `GET /metrics` here (off when unset). Worker process i of `--processes` adds i to
    /// the port.
    pub listen: Option<SocketAddr>,
}

/// Where the gateway listens.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ListenConfig {
    /// TCP listeners (raw framed protocol).
    pub tcp: Vec<SocketAddr>,
    /// WebSocket listeners (one or more frames per binary message).
    pub ws: Vec<SocketAddr>,
}

/// Session timers and bounds, sent to clients in the Welcome.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SessionSettings {
    #[serde(with = "humantime_serde")]
    pub heartbeat: Duration,
    /// Defaults to twice the heartbeat.
    #[serde(with = "humantime_serde")]
    pub read_timeout: Option<Duration>,
    #[serde(with = "humantime_serde")]
    pub resume_window: Duration,
    pub max_unacked_messages: usize,
    pub max_unacked_bytes: usize,
    pub ack_every: u64,
    /// Clients acknowledge what they received within this time (sent in the Welcome).
    #[serde(with = "humantime_serde")]
    pub ack_delay: Duration,
}

/// Per-connection limits.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LimitsConfig {
    /// Largest accepted frame (value of the length prefix).
    pub max_frame_bytes: u32,
    /// A connection that has not sent a valid Hello by then is closed.
    #[serde(with = "humantime_serde")]
    pub auth_timeout: Duration,
    /// A write that takes longer than this drops the connection (the session waits to resume).
    #[serde(with = "humantime_serde")]
    pub write_timeout: Duration,
    /// Frames per second a connection may send after its Hello, sustained.
    pub messages_per_second: u32,
    /// Burst allowance above the sustained rate.
    pub message_burst: u32,
    /// The same for a game server's connection (role `server`), which speaks for all of its
    /// players: a frame per tick, answers, and a message per player it tells something.
    pub server_messages_per_second: u32,
    /// Burst allowance above a game server's sustained rate.
    pub server_message_burst: u32,
    /// Pushes queued for one session before it counts as a slow consumer.
    pub outbox_capacity: usize,
    /// Connections that may be waiting for their Hello at once, in all; more are closed with
    /// OVERLOADED.
    pub max_pending_handshakes: usize,
    /// The same, from one IP address.
    pub max_pending_per_ip: usize,
    /// Connections one IP address may hold open at once, logged in or not (a NAT or proxy puts
    /// many players behind one address: size it for that).
    pub max_connections_per_ip: usize,
    /// Sessions that may live at once, connected or waiting for a resume
    /// (`session.resume_window`); a Hello for a new session past it is closed with OVERLOADED.
    pub max_sessions: usize,
    /// The same, for the sessions opened from one IP address (however many connections they
    /// have now): what one client that logs in and drops its link in a loop can hold.
    pub max_sessions_per_ip: usize,
    /// What "one IP address" is for an IPv6 client in the limits above: its first this many
    /// bits (64, the block a site is usually given, so that a host cannot pass them by changing
    /// the low bits of its address; 128, each address on its own).
    pub ipv6_prefix: u8,
}

/// How clients prove who they are.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AuthConfig {
    pub mode: AuthMode,
    /// Dev mode lets anyone log in, as a game server too, so the gateway refuses to start
    /// with it on an address other than loopback (127.0.0.0/8, ::1) unless this is set: a
    /// try-out on a LAN, on purpose.
    pub dev_beyond_loopback: bool,
    pub jwt_algorithm: JwtAlgorithm,
    /// HS256 shared secret.
    pub jwt_secret: Option<String>,
    /// RS256 public key, PEM file.
    pub jwt_public_key_file: Option<PathBuf>,
    /// Required `iss` claim, if set.
    pub jwt_issuer: Option<String>,
    /// Required `aud` claim, if set.
    pub jwt_audience: Option<String>,
    /// How far the token issuer's clock may be from ours, for `exp` and `nbf`.
    #[serde(with = "humantime_serde")]
    pub jwt_leeway: Duration,
}

/// The default clock leeway for a JWT's `exp` and `nbf`, in seconds.
pub const DEFAULT_JWT_LEEWAY_SECS: u64 = 5;

impl Default for AuthConfig {
    fn default() -> Self {
        AuthConfig {
            mode: AuthMode::default(),
            dev_beyond_loopback: false,
            jwt_algorithm: JwtAlgorithm::default(),
            jwt_secret: None,
            jwt_public_key_file: None,
            jwt_issuer: None,
            jwt_audience: None,
            jwt_leeway: Duration::from_secs(DEFAULT_JWT_LEEWAY_SECS),
        }
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AuthMode {
    /// Anyone may connect; the token (if any) becomes the player id.
    #[default]
    Dev,
    /// The token must be a JWT signed with the configured key.
    Jwt,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum JwtAlgorithm {
    #[default]
    HS256,
    RS256,
}

impl Default for ListenConfig {
    fn default() -> Self {
        ListenConfig {
            tcp: vec![SocketAddr::from(([127, 0, 0, 1], 7400))],
            ws: vec![SocketAddr::from(([127, 0, 0, 1], 7401))],
        }
    }
}

impl Default for SessionSettings {
    fn default() -> Self {
        let d = SessionConfig::default();
        SessionSettings {
            heartbeat: d.heartbeat,
            read_timeout: None,
            resume_window: d.resume_window,
            max_unacked_messages: d.max_unacked_messages,
            max_unacked_bytes: d.max_unacked_bytes,
            ack_every: d.ack_every,
            ack_delay: d.ack_delay,
        }
    }
}

impl Default for LimitsConfig {
    fn default() -> Self {
        LimitsConfig {
            max_frame_bytes: tickwire_wire::DEFAULT_MAX_FRAME_BYTES,
            auth_timeout: Duration::from_secs(5),
            write_timeout: Duration::from_secs(10),
            messages_per_second: 200,
            message_burst: 400,
            server_messages_per_second: 20_000,
            server_message_burst: 40_000,
            outbox_capacity: 256,
            max_pending_handshakes: 4096,
            max_pending_per_ip: 256,
            max_connections_per_ip: 10_000,
            max_sessions: 250_000,
            max_sessions_per_ip: 10_000,
            ipv6_prefix: 64,
        }
    }
}

impl SessionSettings {
    /// The session state machine's view of these settings.
    pub fn to_session_config(&self) -> SessionConfig {
        SessionConfig {
            heartbeat: self.heartbeat,
            read_timeout: self.read_timeout.unwrap_or(self.heartbeat * 2),
            resume_window: self.resume_window,
            max_unacked_messages: self.max_unacked_messages,
            max_unacked_bytes: self.max_unacked_bytes,
            ack_every: self.ack_every,
            ack_bytes: SessionConfig::default().ack_bytes,
            ack_delay: self.ack_delay,
        }
    }
}

impl GatewayConfig {
    /// Reads `path` (if any), then applies `section.key=value` overrides in order.
    pub fn load(path: Option<&Path>, overrides: &[String]) -> Result<GatewayConfig, ConfigError> {
        let mut doc = match path {
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .map_err(|source| ConfigError::Read { path: path.to_owned(), source })?;
                toml::from_str::<toml::Table>(&text)?
            }
            None => toml::Table::new(),
        };
        for item in overrides {
            apply_override(&mut doc, item)?;
        }
        let config: GatewayConfig = toml::Value::Table(doc).try_into()?;
        config.validate()?;
        Ok(config)
    }

    fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |m: &str| Err(ConfigError::Invalid(m.to_owned()));
        if self.listen.tcp.is_empty() && self.listen.ws.is_empty() {
            return invalid("listen: at least one tcp or ws address is needed");
        }
        if self.session.heartbeat < Duration::from_millis(1) {
            // The Welcome carries it in whole milliseconds: less would read as 0 ("not said").
            return invalid("session.heartbeat must be at least 1ms");
        }
        if self.session.heartbeat > Duration::from_secs(3600) {
            return invalid("session.heartbeat must be at most 1h");
        }
        if self.session.read_timeout.is_some_and(|t| t <= self.session.heartbeat) {
            return invalid("session.read_timeout must be longer than session.heartbeat (default: twice it)");
        }
        if self.limits.max_frame_bytes < 64 {
            return invalid("limits.max_frame_bytes must be at least 64");
        }
        let l = &self.limits;
        if l.auth_timeout.is_zero() || l.auth_timeout > Duration::from_secs(300) {
            return invalid("limits.auth_timeout must be above zero and at most 5m");
        }
        if [l.messages_per_second, l.message_burst, l.server_messages_per_second, l.server_message_burst]
            .contains(&0)
        {
            return invalid("limits.*messages_per_second and *message_burst must be above zero");
        }
        if [
            l.max_pending_handshakes,
            l.max_pending_per_ip,
            l.max_connections_per_ip,
            l.max_sessions,
            l.max_sessions_per_ip,
        ]
        .contains(&0)
        {
            return invalid(
                "limits.max_pending_handshakes, max_pending_per_ip, max_connections_per_ip, max_sessions \
                 and max_sessions_per_ip must be above zero (nobody could connect)",
            );
        }
        if l.outbox_capacity > 1 << 20 {
            return invalid("limits.outbox_capacity must be at most 1048576");
        }
        if self.limits.outbox_capacity == 0 || self.session.max_unacked_messages == 0 {
            return invalid("limits.outbox_capacity and session.max_unacked_messages must be above zero");
        }
        if self.session.ack_every == 0 {
            return invalid("session.ack_every must be above zero");
        }
        if self.limits.ipv6_prefix > 128 {
            return invalid("limits.ipv6_prefix is a prefix length: at most 128");
        }
        let window = &self.channels.update_window;
        if window.max_bytes >= self.session.max_unacked_bytes
            || window.max_updates >= self.session.max_unacked_messages
        {
            return invalid(
                "channels.update_window.max_bytes and max_updates must be below session.max_unacked_bytes \
                 and session.max_unacked_messages: channel updates must never fill the session's window",
            );
        }
        self.check_dev_exposure()?;
        let tls = &self.tls;
        if tls.cert_file.is_some() != tls.key_file.is_some() {
            return invalid("tls.cert_file and tls.key_file go together");
        }
        if tls.self_signed && tls.cert_file.is_some() {
            return invalid("tls: either cert_file and key_file, or self_signed, not both");
        }
        if tls.self_signed_cert_out.is_some() && !tls.self_signed {
            return invalid("tls.self_signed_cert_out needs tls.self_signed = true");
        }
        if window.max_updates == 0 || window.target.is_zero() || window.min_bytes > window.max_bytes {
            return invalid(
                "channels.update_window: max_updates and target must be above zero, min_bytes at most max_bytes",
            );
        }
        if let Some(spatial) = &self.spatial {
            tickwire_spatial::Layout::new(spatial.clone())
                .map_err(|e| ConfigError::Invalid(e.to_string()))?;
        }
        Ok(())
    }
}

impl GatewayConfig {
    /// Dev mode only on loopback listeners, unless `auth.dev_beyond_loopback` says otherwise.
    fn check_dev_exposure(&self) -> Result<(), ConfigError> {
        if self.auth.mode != AuthMode::Dev || self.auth.dev_beyond_loopback {
            return Ok(());
        }
        let exposed = self.listen.tcp.iter().chain(&self.listen.ws).find(|a| !a.ip().is_loopback());
        match exposed {
            None => Ok(()),
            Some(addr) => Err(ConfigError::Invalid(format!(
                "auth.mode = \"dev\" lets anyone log in, as a game server too, and {addr} is not a \
                 loopback address: set auth.mode = \"jwt\" (docs/security.md), listen on 127.0.0.1 or \
                 ::1 only, or set auth.dev_beyond_loopback = true to expose dev mode on purpose"
            ))),
        }
    }
}

/// Sets one dotted key. The value is parsed as a TOML value, and taken as a string if that
/// fails, so `--set auth.mode=jwt` and `--set listen.tcp=["0.0.0.0:7400"]` both work.
fn apply_override(doc: &mut toml::Table, item: &str) -> Result<(), ConfigError> {
    let (key, raw) = item.split_once('=').ok_or_else(|| ConfigError::BadOverride(item.into()))?;
    let parts: Vec<&str> = key.trim().split('.').collect();
    if parts.iter().any(|p| p.is_empty()) {
        return Err(ConfigError::BadOverride(item.into()));
    }
    let value = toml::from_str::<toml::Table>(&format!("v = {raw}"))
        .ok()
        .and_then(|mut t| t.remove("v"))
        .unwrap_or_else(|| toml::Value::String(raw.to_owned()));
    let (last, sections) = parts.split_last().expect("split yields at least one part");
    let mut table = doc;
    for section in sections {
        let entry =
            table.entry(section.to_string()).or_insert_with(|| toml::Value::Table(Default::default()));
        table = entry
            .as_table_mut()
            .ok_or_else(|| ConfigError::NotATable { key: key.to_owned(), section: section.to_string() })?;
    }
    table.insert(last.to_string(), value);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overrides_win_over_defaults_and_are_typed() {
        let cfg = GatewayConfig::load(
            None,
            &[
                "session.heartbeat=500ms".into(),
                "listen.tcp=[\"127.0.0.1:9000\"]".into(),
                "auth.mode=jwt".into(),
                "limits.messages_per_second=5".into(),
            ],
        )
        .unwrap();
        assert_eq!(cfg.session.heartbeat, Duration::from_millis(500));
        assert_eq!(cfg.session.to_session_config().read_timeout, Duration::from_secs(1));
        assert_eq!(cfg.listen.tcp, vec!["127.0.0.1:9000".parse().unwrap()]);
        assert_eq!(cfg.auth.mode, AuthMode::Jwt);
        assert_eq!(cfg.limits.messages_per_second, 5);
    }

    #[test]
    fn the_spatial_delivery_is_the_worlds_unless_set_to_the_io_threads() {
        use crate::channel::SpatialDelivery;
        assert_eq!(GatewayConfig::default().channels.spatial_delivery, SpatialDelivery::World);
        let set = |v: &str| GatewayConfig::load(None, &[format!("channels.spatial_delivery={v}")]);
        assert_eq!(set("\"io_threads\"").unwrap().channels.spatial_delivery, SpatialDelivery::IoThreads);
        assert_eq!(set("\"world\"").unwrap().channels.spatial_delivery, SpatialDelivery::World);
        assert!(set("\"io\"").is_err(), "an unknown place is an error");
    }

    #[test]
    fn the_sample_config_is_the_defaults() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../deploy/tickwire.toml");
        let sample = GatewayConfig::load(Some(Path::new(path)), &[]).unwrap();
        let defaults = GatewayConfig::default();
        assert_eq!(toml::to_string(&sample).unwrap(), toml::to_string(&defaults).unwrap());
        assert_eq!(sample.channels.private.preset, crate::channel::Preset::Lofi);
    }

    #[test]
    fn unknown_keys_and_bad_values_are_errors() {
        assert!(GatewayConfig::load(None, &["session.hartbeat=1s".into()]).is_err());
        assert!(GatewayConfig::load(None, &["session.heartbeat=soon".into()]).is_err());
        let sub_ms = GatewayConfig::load(None, &["session.heartbeat=500us".into()]).unwrap_err().to_string();
        assert!(sub_ms.contains("at least 1ms"), "{sub_ms}");
        assert!(GatewayConfig::load(None, &["noequals".into()]).is_err());
        assert!(GatewayConfig::load(None, &["session.heartbeat.x=1".into()]).is_err());
        assert!(GatewayConfig::load(None, &["session.heartbeat=0s".into()]).is_err());
        // Values that would start a gateway nobody can use, or that overflow.
        let refused = |set: &str, says: &str| {
            let err = GatewayConfig::load(None, &[set.into()]).unwrap_err().to_string();
            assert!(err.contains(says), "{set}: {err}");
        };
        refused("session.heartbeat=\"2h\"", "at most 1h");
        refused("session.read_timeout=\"3s\"", "longer than session.heartbeat");
        refused("limits.auth_timeout=\"0s\"", "limits.auth_timeout");
        refused("limits.messages_per_second=0", "above zero");
        refused("limits.max_connections_per_ip=0", "nobody could connect");
        refused("limits.max_sessions=0", "nobody could connect");
        refused("limits.outbox_capacity=100000000", "at most 1048576");
    }

    #[test]
    fn dev_mode_listens_on_loopback_only_unless_asked() {
        let load = |extra: &[&str]| {
            let o: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
            GatewayConfig::load(None, &o)
        };
        assert!(load(&[]).is_ok(), "the defaults are loopback");
        assert!(load(&["listen.tcp=[\"127.0.0.2:7400\"]", "listen.ws=[\"[::1]:7401\"]"]).is_ok());
        let err = load(&["listen.ws=[\"0.0.0.0:7401\"]"]).unwrap_err().to_string();
        assert!(err.contains("0.0.0.0:7401 is not a loopback address"), "{err}");
        assert!(err.contains("auth.dev_beyond_loopback"), "{err}");
        let err = load(&["listen.tcp=[\"127.0.0.1:7400\", \"[::]:7400\"]"]).unwrap_err().to_string();
        assert!(err.contains("[::]:7400"), "{err}");
        assert!(load(&["listen.tcp=[\"0.0.0.0:7400\"]", "auth.dev_beyond_loopback=true"]).is_ok());
        let jwt = ["listen.tcp=[\"0.0.0.0:7400\"]", "auth.mode=jwt", "auth.jwt_secret=s"];
        assert!(load(&jwt).is_ok(), "jwt may listen anywhere");
    }

    #[test]
    fn a_spatial_layout_is_checked_at_start() {
        let report = ["spatial.cell_size=20.0".into(), "spatial.cells=[15, 15]".into()];
        let with_servers = |servers: &str| {
            let mut o: Vec<String> = report.to_vec();
            o.push(format!("spatial.servers={servers}"));
            GatewayConfig::load(None, &o)
        };
        let cfg = with_servers("[3, 3]").unwrap();
        assert_eq!(cfg.spatial.unwrap().servers, [3, 3]);
        let err = with_servers("[2, 3]").unwrap_err().to_string();
        assert!(err.contains("cannot be split evenly among spatial.servers"), "{err}");
        assert!(GatewayConfig::load(None, &["spatial.cell_size=20.0".into()]).is_err(), "cells are required");
        assert!(GatewayConfig::default().spatial.is_none());
    }
}
