//! Channels: state that game servers own and clients subscribe to (docs/protocol.md section 13).
//!
//! [`ChannelRouter`] is a [`Router`]: it answers the `channel.*` methods, checks the access
//! rules of each channel type, and forwards to the channel's actor (`actor.rs`), which owns the
//! state and fans out. Anything else goes to the router it wraps (by default, echo).

mod actor;
mod config;
mod registry;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use bytes::Bytes;
use prost::Message;
use tickwire_state::{Codec, Limits, Schema, SchemaDef, State};
use tickwire_wire::proto::{
    ChannelInfo, ChannelRef, ChannelSend, ChannelType, CreateChannel, CreateChannelResult, DataAccess,
    DeltaCodec, ListChannels, ListChannelsResult, Request, Response, Status, Subscribe, UpdateChannel,
};
use tokio::runtime::Handle;
use tokio::sync::mpsc;

pub(crate) use actor::Figures;
pub use config::{Access, ChannelTypeConfig, ChannelsConfig, Preset, SpatialDelivery, UpdateWindowConfig};

use crate::auth::Role;
use crate::pass_times::{Names, PassTimes};
use crate::router::{EchoRouter, Gauge, Reply, Router, SessionHandle, Startup, error_response};
use actor::{Channel, Msg, Op};
use registry::Registry;
use registry::{Entry, SharedRegistry, lock};

/// The state engine's codec for a subscription's wire `DeltaCodec`.
pub(crate) fn state_codec(codec: DeltaCodec) -> Codec {
    match codec {
        DeltaCodec::Binary => Codec::Binary,
        DeltaCodec::Json => Codec::Json,
    }
}

/// The most channels one `channel.list` answer holds.
const MAX_LISTED: usize = 1000;

/// Channel figures at one instant, summed over every channel. The counters are totals since
/// the start; rates are differences over time.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ChannelFigures {
    /// Channels open (`channel_num`).
    pub channels: u64,
    /// Subscribers now, over every channel (`channel_subscribers`).
    pub subscribers: u64,
    /// Channel ticks run, one per channel per tick (`channel_ticks`): over `channels`, the
    /// tick rate.
    pub ticks: u64,
    /// State updates queued to subscribers, one per subscriber per update (`channel_fanouts`):
    /// over `subscribers`, the update rate each one gets.
    pub fanouts: u64,
    /// Updates not queued because the outbox was full; a later one merged them
    /// (`channel_updates_coalesced`).
    pub coalesced: u64,
}

/// Why a channel router could not be built.
#[derive(Debug, thiserror::Error)]
pub enum ChannelConfigError {
    #[error("cannot read the schema file {path}: {source}")]
    Read { path: std::path::PathBuf, source: std::io::Error },
    #[error("schema file {path}: {source}")]
    Schema { path: std::path::PathBuf, source: tickwire_state::SchemaError },
    #[error("{0}")]
    Layout(tickwire_spatial::LayoutError),
}

/// Serves the `channel.*` methods.
pub struct ChannelRouter {
    config: ChannelsConfig,
    /// Per type: the configured schema (its text, for subscribers, and compiled).
    schemas: HashMap<i32, (Arc<str>, Arc<Schema>)>,
    registry: SharedRegistry,
    next_id: AtomicU64,
    figures: Arc<Figures>,
    fallback: Arc<dyn Router>,
    /// The gateway's runtimes: channel actors are dealt over them round-robin.
    runtimes: OnceLock<Vec<Handle>>,
    next_runtime: AtomicUsize,
}

impl ChannelRouter {
    /// Loads the schema files the config names. Methods other than `channel.*` go to
    /// `fallback`.
    pub fn new(
        config: ChannelsConfig,
        fallback: Arc<dyn Router>,
    ) -> Result<ChannelRouter, ChannelConfigError> {
        let mut schemas = HashMap::new();
        for (ty, cfg) in [
            (ChannelType::Global, &config.global),
            (ChannelType::Subworld, &config.subworld),
            (ChannelType::Private, &config.private),
            (ChannelType::Entity, &config.entity),
        ] {
            if let Some(path) = &cfg.schema_file {
                let text = std::fs::read_to_string(path)
                    .map_err(|source| ChannelConfigError::Read { path: path.clone(), source })?;
                let schema = SchemaDef::parse(&text, &path.to_string_lossy())
                    .and_then(Schema::new)
                    .map_err(|source| ChannelConfigError::Schema { path: path.clone(), source })?;
                let json = serde_json::to_string(schema.def()).expect("schemas serialize");
                schemas.insert(ty as i32, (Arc::from(json), schema));
            }
        }
        Ok(ChannelRouter {
            config,
            schemas,
            registry: Arc::new(Mutex::new(Registry::default())),
            next_id: AtomicU64::new(1),
            figures: Arc::new(Figures {
                pass_times: PassTimes::default(),
                ticks: AtomicU64::new(0),
                fanouts: AtomicU64::new(0),
                subscribers: AtomicU64::new(0),
                coalesced: AtomicU64::new(0),
            }),
            fallback,
            runtimes: OnceLock::new(),
            next_runtime: AtomicUsize::new(0),
        })
    }

    /// The gateway's default router for `config`: its channel settings, in front of echo
    /// (answers up to half a frame).
    pub fn for_gateway(config: &crate::GatewayConfig) -> Result<ChannelRouter, ChannelConfigError> {
        let echo = Arc::new(EchoRouter::new(config.limits.max_frame_bytes as usize / 2));
        ChannelRouter::new(config.channels.clone(), echo)
    }

    fn type_config(&self, ty: ChannelType) -> &ChannelTypeConfig {
        match ty {
            ChannelType::Global => &self.config.global,
            ChannelType::Private => &self.config.private,
            ChannelType::Entity => &self.config.entity,
            _ => &self.config.subworld,
        }
    }

    fn registry(&self) -> std::sync::MutexGuard<'_, Registry> {
        lock(&self.registry)
    }

    /// Refuses `what` (create, claim, remove) unless `session` is a game server or the type
    /// lets players own channels.
    fn check_role(&self, session: &SessionHandle, id: u64, ty: ChannelType, what: &str) -> Option<Response> {
        if session.role() == Role::Server || self.type_config(ty).players_may_own {
            return None;
        }
        let msg = format!(
            "only game servers may {what} {} channels (log in with a server credential)",
            ty.as_str_name()
        );
        Some(error_response(id, Status::PermissionDenied, msg))
    }

    /// [`ChannelRouter::check_role`], and refuses unless the session has room in its quota of
    /// owned channels.
    fn check_owner(
        &self,
        reg: &Registry,
        session: &SessionHandle,
        id: u64,
        ty: ChannelType,
        what: &str,
    ) -> Option<Response> {
        if let Some(refused) = self.check_role(session, id, ty, what) {
            return Some(refused);
        }
        let server = session.role() == Role::Server;
        let quota = if server { self.config.max_owned_per_server } else { self.config.max_owned_per_player };
        let owned = reg.members.get(&session.conn_id()).map_or(0, |m| m.owned.len());
        if owned >= quota {
            let msg = format!("this session owns {owned} channels, its quota");
            return Some(error_response(id, Status::ResourceExhausted, msg));
        }
        None
    }

    fn create(&self, session: &SessionHandle, id: u64, body: Bytes) -> Response {
        let req = match CreateChannel::decode(body) {
            Ok(r) => r,
            Err(e) => {
                return error_response(id, Status::InvalidArgument, format!("malformed CreateChannel: {e}"));
            }
        };
        let ty = req.r#type();
        if matches!(ty, ChannelType::Unspecified | ChannelType::Spatial) {
            let msg = format!(
                "channel type {} cannot be created (spatial channels are not served yet)",
                ty.as_str_name()
            );
            return error_response(id, Status::InvalidArgument, msg);
        }
        let (schema_json, schema) = if req.schema_json.is_empty() {
            match self.schemas.get(&(ty as i32)) {
                Some(s) => s.clone(),
                None => {
                    let msg = format!("no schema given and none configured for {}", ty.as_str_name());
                    return error_response(id, Status::InvalidArgument, msg);
                }
            }
        } else {
            match SchemaDef::parse(&req.schema_json, "request.json").and_then(Schema::new) {
                Ok(schema) => (Arc::from(req.schema_json.as_str()), schema),
                Err(e) => return error_response(id, Status::InvalidArgument, format!("schema: {e}")),
            }
        };
        let cfg = self.type_config(ty);
        let channel_id = {
            let mut reg = self.registry();
            if let Some(refused) = self.check_owner(&reg, session, id, ty, "create") {
                return refused;
            }
            if reg.channels.len() >= self.config.max_channels {
                let msg = format!("the gateway holds its maximum of {} channels", self.config.max_channels);
                return error_response(id, Status::Unavailable, msg);
            }
            if ty == ChannelType::Global && reg.global.is_some() {
                return error_response(id, Status::AlreadyExists, "the global channel exists".into());
            }
            let channel_id = self.next_id.fetch_add(1, Ordering::Relaxed);
            let (tx, rx) = mpsc::channel(self.config.inbox_capacity);
            let channel = Channel::new(
                channel_id,
                State::with_limits(
                    schema,
                    Limits {
                        max_len: self.config.max_list_len,
                        max_bytes: self.config.max_state_bytes,
                        ..Limits::default()
                    },
                ),
                schema_json,
                session.clone(),
                cfg.remove_when_owner_lost,
                cfg.tick(),
                cfg.fanout(),
                cfg.max_subscribers,
                self.figures.clone(),
                (Arc::downgrade(&self.registry), self.config.orphan_ttl),
            );
            // Channels are dealt over the I/O threads, whoever creates them.
            match self.runtimes.get().filter(|r| !r.is_empty()) {
                Some(runtimes) => {
                    let i = self.next_runtime.fetch_add(1, Ordering::Relaxed) % runtimes.len();
                    runtimes[i].spawn(channel.run(rx));
                }
                None => {
                    tokio::spawn(channel.run(rx));
                }
            }
            reg.channels.insert(
                channel_id,
                Entry { name: Arc::from(req.name.as_str()), inbox: tx, ty, owner: Some(session.conn_id()) },
            );
            let member = reg.members.entry(session.conn_id()).or_default();
            member.owned.insert(channel_id);
            if ty == ChannelType::Global {
                reg.global = Some(channel_id);
                reg.master = Some(session.conn_id());
            }
            channel_id
        };
        let master = ty == ChannelType::Global;
        ok(id, CreateChannelResult { channel_id, master }.encode_to_vec().into())
    }

    /// Whether `who` passes `access` on a channel owned by `owner`.
    fn allowed(access: Access, who: u64, owner: Option<u64>, master: Option<u64>) -> bool {
        match access {
            Access::Any => true,
            Access::None => false,
            Access::Owner => owner == Some(who),
            Access::OwnerOrMaster => owner == Some(who) || master == Some(who),
        }
    }

    /// Looks the channel up, checks the access rule the request is under (if any), keeps the
    /// registry in step, and queues `msg` for the channel's actor.
    fn forward(&self, session: &SessionHandle, id: u64, channel_id: u64, op: Op) -> Option<Response> {
        let mut reg = self.registry();
        let master = reg.master;
        if matches!(op, Op::Subscribe { .. } | Op::Unsubscribe { .. }) {
            // Channels removed since the session subscribed no longer hold its places: their
            // subscribers are told (REMOVED), not made to unsubscribe.
            let Registry { channels, members, .. } = &mut *reg;
            if let Some(m) = members.get_mut(&session.conn_id()) {
                m.subscribed.retain(|c, _| channels.contains_key(c));
            }
        }
        let Some(entry) = reg.channels.get(&channel_id) else {
            return Some(error_response(id, Status::NotFound, format!("no channel {channel_id}")));
        };
        let cfg = self.type_config(entry.ty);
        let rule = match &op {
            Op::Subscribe { .. } => Some(("subscribe", cfg.subscribe)),
            Op::Remove => Some(("remove", cfg.remove)),
            // A client may send where it may subscribe (a `PRIVATE` channel: nobody but its
            // owner); the owner always may.
            Op::Send { .. } if entry.owner != Some(session.conn_id()) => Some(("send", cfg.subscribe)),
            _ => None,
        };
        if let Some((what, access)) = rule
            && !Self::allowed(access, session.conn_id(), entry.owner, master)
        {
            let msg = format!(
                "{what} on channel {channel_id} ({}) needs {access:?} access",
                entry.ty.as_str_name()
            );
            return Some(error_response(id, Status::PermissionDenied, msg));
        }
        let inbox = entry.inbox.clone();
        if let Op::Remove = &op
            && let Some(refused) = self.check_role(session, id, entry.ty, "remove")
        {
            return Some(refused);
        }
        if let Op::Subscribe { .. } = &op {
            let member = reg.members.get(&session.conn_id());
            let subscribed = member.map_or(0, |m| m.subscribed.len());
            let again = member.is_some_and(|m| m.subscribed.contains_key(&channel_id));
            if subscribed >= self.config.max_subscriptions_per_session && !again {
                let msg = format!("this session has {subscribed} subscriptions, its quota");
                return Some(error_response(id, Status::ResourceExhausted, msg));
            }
        }
        // Places in the actor's inbox and for the answer first: the registry changes only for
        // a message that will reach the actor.
        let (permit, reply) = match reserve(&inbox, session, id, channel_id) {
            Ok(places) => places,
            Err(refused) => return Some(refused),
        };
        match &op {
            Op::Remove => {
                reg.forget(channel_id);
            }
            // The place is the actor's to give back once it has handled this subscribe
            // (`Registry::handled`).
            Op::Subscribe { .. } => {
                let member = reg.members.entry(session.conn_id()).or_default();
                let place = member.subscribed.entry(channel_id).or_default();
                place.pending = place.pending.saturating_add(1);
            }
            // Given back now when no subscribe of it is on its way (the actor handles this one
            // before any later), so that an unsubscribe and a subscribe sent back to back fit a
            // full quota; otherwise when the actor has handled them. Only once it will reach
            // the actor: one refused as busy leaves the subscription, and so its place.
            Op::Unsubscribe { .. } => {
                if let Some(m) = reg.members.get_mut(&session.conn_id())
                    && m.subscribed.get(&channel_id).is_some_and(|p| p.pending == 0)
                {
                    m.subscribed.remove(&channel_id);
                }
            }
            _ => {}
        }
        drop(reg);
        permit.send(Msg::Request(op, reply));
        None
    }

    fn on_channel_request(&self, session: &SessionHandle, request: Request) -> Option<Response> {
        let id = request.id;
        let bad = |e: prost::DecodeError| {
            Some(error_response(id, Status::InvalidArgument, format!("malformed body: {e}")))
        };
        match request.method.as_str() {
            "channel.create" => Some(self.create(session, id, request.body)),
            "channel.list" => Some(match ListChannels::decode(request.body) {
                Ok(req) => self.list(session, id, &req),
                Err(e) => return bad(e),
            }),
            "channel.subscribe" => {
                let sub = match Subscribe::decode(request.body) {
                    Ok(s) => s,
                    Err(e) => return bad(e),
                };
                let options = sub.options.unwrap_or_default();
                let write = options.access() == DataAccess::Write;
                let server = session.role() == Role::Server;
                let op = Op::Subscribe { member: session.clone(), server, options };
                if write {
                    let rule =
                        self.registry().channels.get(&sub.channel_id).map(|e| self.type_config(e.ty).write);
                    if let Some(refused) = rule.and_then(|rule| {
                        self.check(session, id, sub.channel_id, "subscribe with write access", rule)
                    }) {
                        return Some(refused);
                    }
                }
                self.forward(session, id, sub.channel_id, op)
            }
            "channel.unsubscribe" => {
                let r = match ChannelRef::decode(request.body) {
                    Ok(r) => r,
                    Err(e) => return bad(e),
                };
                let op = Op::Unsubscribe { member: session.clone() };
                self.forward(session, id, r.channel_id, op)
            }
            "channel.update" => {
                let u = match UpdateChannel::decode(request.body) {
                    Ok(u) => u,
                    Err(e) => return bad(e),
                };
                if u.patch.len() > self.config.max_patch_bytes {
                    let msg = format!(
                        "a patch of {} bytes is over the limit of {} (channels.max_patch_bytes)",
                        u.patch.len(),
                        self.config.max_patch_bytes
                    );
                    return Some(error_response(id, Status::ResourceExhausted, msg));
                }
                let op = Op::Update { from: session.clone(), patch: u.patch };
                self.forward(session, id, u.channel_id, op)
            }
            "channel.remove" => {
                let r = match ChannelRef::decode(request.body) {
                    Ok(r) => r,
                    Err(e) => return bad(e),
                };
                self.forward(session, id, r.channel_id, Op::Remove)
            }
            "channel.claim" => {
                let r = match ChannelRef::decode(request.body) {
                    Ok(r) => r,
                    Err(e) => return bad(e),
                };
                self.claim(session, id, r.channel_id)
            }
            "channel.send" => {
                let send = match ChannelSend::decode(request.body) {
                    Ok(s) => s,
                    Err(e) => return bad(e),
                };
                let channel_id = send.channel_id;
                let op = Op::Send { from: session.clone(), send };
                self.forward(session, id, channel_id, op)
            }
            other => Some(error_response(id, Status::NotFound, format!("unknown method `{other}`"))),
        }
    }

    /// The channels `session` may subscribe to that match the filter, by id.
    fn list(&self, session: &SessionHandle, id: u64, req: &ListChannels) -> Response {
        let reg = self.registry();
        let mut found: Vec<ChannelInfo> = reg
            .channels
            .iter()
            .filter(|(_, e)| req.r#type == 0 || e.ty as i32 == req.r#type)
            .filter(|(_, e)| req.name.is_empty() || *e.name == *req.name)
            .filter(|(_, e)| {
                Self::allowed(self.type_config(e.ty).subscribe, session.conn_id(), e.owner, reg.master)
            })
            .map(|(&channel_id, e)| ChannelInfo {
                channel_id,
                r#type: e.ty as i32,
                name: e.name.to_string(),
                owner_connection: e.owner.unwrap_or(0),
            })
            .collect();
        drop(reg);
        found.sort_unstable_by_key(|c| c.channel_id);
        let truncated = found.len() > MAX_LISTED;
        found.truncate(MAX_LISTED);
        ok(id, ListChannelsResult { channels: found, truncated }.encode_to_vec().into())
    }

    /// Makes `session` the owner of a channel whose owner left (kept by its type's rule).
    fn claim(&self, session: &SessionHandle, id: u64, channel_id: u64) -> Option<Response> {
        let mut reg = self.registry();
        let Some(entry) = reg.channels.get_mut(&channel_id) else {
            return Some(error_response(id, Status::NotFound, format!("no channel {channel_id}")));
        };
        if let Some(owner) = entry.owner {
            let msg = format!("channel {channel_id} has an owner (connection {owner})");
            return Some(error_response(id, Status::AlreadyExists, msg));
        }
        let ty = entry.ty;
        if let Some(refused) = self.check_owner(&reg, session, id, ty, "claim") {
            return Some(refused);
        }
        let entry = reg.channels.get_mut(&channel_id).expect("looked up above");
        let inbox = entry.inbox.clone();
        let (permit, reply) = match reserve(&inbox, session, id, channel_id) {
            Ok(places) => places,
            Err(refused) => return Some(refused),
        };
        entry.owner = Some(session.conn_id());
        let member = reg.members.entry(session.conn_id()).or_default();
        member.owned.insert(channel_id);
        if ty == ChannelType::Global {
            reg.master = Some(session.conn_id());
        }
        drop(reg);
        permit.send(Msg::Request(Op::Claim { owner: session.clone() }, reply));
        None
    }

    /// The figures every channel adds to, for another actor that reports as a channel (the
    /// spatial world).
    pub(crate) fn shared_figures(&self) -> Arc<Figures> {
        self.figures.clone()
    }

    /// The channel figures the metrics endpoint exports, read directly.
    pub fn figures(&self) -> ChannelFigures {
        let f = &self.figures;
        ChannelFigures {
            channels: self.registry().channels.len() as u64,
            subscribers: f.subscribers.load(Ordering::Relaxed),
            ticks: f.ticks.load(Ordering::Relaxed),
            fanouts: f.fanouts.load(Ordering::Relaxed),
            coalesced: f.coalesced.load(Ordering::Relaxed),
        }
    }

    /// Checks one access rule of the channel's type without forwarding anything.
    fn check(
        &self,
        session: &SessionHandle,
        id: u64,
        channel_id: u64,
        what: &str,
        rule: Access,
    ) -> Option<Response> {
        let reg = self.registry();
        let entry = reg.channels.get(&channel_id)?;
        if Self::allowed(rule, session.conn_id(), entry.owner, reg.master) {
            return None;
        }
        let msg =
            format!("{what} on channel {channel_id} ({}) needs {rule:?} access", entry.ty.as_str_name());
        Some(error_response(id, Status::PermissionDenied, msg))
    }
}

/// A place in a channel actor's inbox for request `id`, and one for its answer in the
/// caller's outbox; or the answer to give at once when there is none.
fn reserve<'a>(
    inbox: &'a mpsc::Sender<Msg>,
    session: &SessionHandle,
    id: u64,
    channel_id: u64,
) -> Result<(mpsc::Permit<'a, Msg>, Reply), Response> {
    let permit = inbox.try_reserve().map_err(|e| match e {
        mpsc::error::TrySendError::Full(()) => {
            error_response(id, Status::Unavailable, format!("channel {channel_id} is busy; retry"))
        }
        mpsc::error::TrySendError::Closed(()) => {
            error_response(id, Status::NotFound, format!("channel {channel_id} is gone"))
        }
    })?;
    Ok((permit, session.reply(id)?))
}

fn ok(id: u64, body: Bytes) -> Response {
    Response { id, status: Status::Ok as i32, body, error: String::new() }
}

impl Router for ChannelRouter {
    fn on_request(&self, session: &SessionHandle, request: Request) -> Option<Response> {
        if request.method.starts_with("channel.") {
            self.on_channel_request(session, request)
        } else {
            self.fallback.on_request(session, request)
        }
    }

    fn on_start(&self, startup: &Startup<'_>) -> std::io::Result<()> {
        let _ = self.runtimes.set(startup.runtimes.to_vec());
        self.fallback.on_start(startup)
    }

    fn on_push(&self, session: &SessionHandle, push: tickwire_wire::proto::Push) {
        self.fallback.on_push(session, push);
    }

    fn on_session_closed(&self, session: &SessionHandle) {
        let conn_id = session.conn_id();
        let mut inboxes = Vec::new();
        {
            let mut reg = self.registry();
            let Some(member) = reg.members.remove(&conn_id) else {
                return self.fallback.on_session_closed(session);
            };
            if reg.master == Some(conn_id) {
                reg.master = None;
            }
            for channel_id in member.subscribed.keys().chain(&member.owned) {
                let Some(entry) = reg.channels.get_mut(channel_id) else { continue };
                inboxes.push(entry.inbox.clone());
                if entry.owner == Some(conn_id) {
                    entry.owner = None;
                    if self.type_config(entry.ty).remove_when_owner_lost {
                        reg.forget(*channel_id);
                    }
                }
            }
        }
        for inbox in inboxes {
            // Delivered even when the inbox is momentarily full; never blocks this task.
            tokio::spawn(async move {
                let _ = inbox.send(Msg::Left { conn_id }).await;
            });
        }
        self.fallback.on_session_closed(session);
    }

    fn gauges(&self) -> Vec<Gauge> {
        let c = self.figures();
        let f = &self.figures;
        let mut out = vec![
            Gauge::new("channel_num", c.channels as f64),
            Gauge::new("channel_subscribers", c.subscribers as f64),
            Gauge::counter("channel_ticks", c.ticks),
            Gauge::counter("channel_fanouts", c.fanouts),
            Gauge::counter("channel_updates_coalesced", c.coalesced),
        ];
        // channel_tick_duration_seconds: every fan-out pass (tick and after-patch) since the
        // start, a cumulative histogram in Prometheus' layout. Nothing here resets on a scrape.
        out.extend(f.pass_times.gauges(Names {
            bucket: "channel_tick_duration_seconds_bucket",
            count: "channel_tick_duration_seconds_count",
            sum: "channel_tick_duration_seconds_sum",
        }));
        out
    }
}
