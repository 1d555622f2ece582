//! One channel on its own task: its state tree, its owner and subscribers, and the fan-out.
//!
//! A fan-out pass runs on every tick and right after every applied patch. Who is due and from
//! which version is decided by the pure scheduler in `tickwire-fanout`, which this actor feeds
//! with the instant of each pass (a tick's due instant, or the clock when it handles a patch);
//! the actor does the I/O: it encodes each due subscriber's update and offers it to the
//! subscriber's session.
//!
//! The actor never waits on a peer. An update is offered only while the session's window of
//! updates in flight (queued, or sent and not yet acknowledged: `tickwire_fanout::Window`) has
//! room, and then to its bounded outbox. Otherwise the scheduler keeps the subscriber's old
//! version and a later pass sends one merged delta (state coalesces): a slow reader gets fresh
//! merged updates at the pace it reads, never a backlog. Messages and events use the outbox's
//! limit: a session that lets them pile up is closed as a slow consumer by its own task. So one
//! stuck subscriber costs the channel nothing.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use bytes::Bytes;
use prost::Message;
use tickwire_fanout::{Due, Options, Outcome, Scheduler};
use tickwire_state::{FieldMask, Key, Patch, PatchError, PreparedCache, State, StateError, Version};
use tickwire_transport::wake_batch::batch;
use tickwire_wire::proto::{
    Broadcast, ChannelEvent, ChannelEventKind, ChannelMessage, ChannelSend, ChannelUpdate, DataAccess,
    Response, Status, SubscribeResult, SubscriptionOptions,
};
use tokio::sync::mpsc;
use tokio::time::MissedTickBehavior;

use super::Registry;
use crate::pass_times::PassTimes;
use crate::router::{PushError, Reply, SessionHandle, error_response, push_envelope};

/// Figures every channel adds to, read by the metrics endpoint. All are cumulative: a scrape
/// never resets them, so any number of readers can take their own windows from differences.
pub(crate) struct Figures {
    /// Wall-clock time per fan-out pass (tick and after-patch passes), since the start.
    pub pass_times: PassTimes,
    /// Channel ticks run (timer passes, one per channel per tick).
    pub ticks: AtomicU64,
    /// State updates queued to subscribers, one per subscriber per update: with `subscribers`,
    /// the update rate each subscriber gets.
    pub fanouts: AtomicU64,
    /// Subscribers of every channel.
    pub subscribers: AtomicU64,
    /// Updates held back because the subscriber's window of updates in flight (or its outbox)
    /// was full; a later update merges each one.
    pub coalesced: AtomicU64,
}

impl Figures {
    /// One tick's fan-out pass took `elapsed`.
    pub fn record_pass(&self, elapsed: Duration) {
        self.ticks.fetch_add(1, Ordering::Relaxed);
        self.record_pass_time(elapsed);
    }

    /// A fan-out pass (tick or after-patch) took `elapsed`.
    fn record_pass_time(&self, elapsed: Duration) {
        self.pass_times.record(elapsed);
    }
}

/// What the router asks of a channel.
pub(crate) enum Msg {
    /// A request, with the place held for its answer in the caller's outbox.
    Request(Op, Reply),
    /// A member's session ended.
    Left { conn_id: u64 },
}

/// A request a channel answers.
pub(crate) enum Op {
    Subscribe {
        member: SessionHandle,
        server: bool,
        options: SubscriptionOptions,
    },
    Unsubscribe {
        member: SessionHandle,
    },
    Update {
        from: SessionHandle,
        patch: Bytes,
    },
    Send {
        from: SessionHandle,
        send: ChannelSend,
    },
    Remove,
    /// A server takes an ownerless channel.
    Claim {
        owner: SessionHandle,
    },
}

struct Subscriber {
    handle: SessionHandle,
    player: Key,
    /// The field filter, from `options.fields`.
    mask: Option<FieldMask>,
    server: bool,
    options: SubscriptionOptions,
}

pub(crate) struct Channel {
    pub id: u64,
    pub state: State,
    pub schema_json: Arc<str>,
    pub owner: Option<SessionHandle>,
    pub remove_when_owner_lost: bool,
    pub tick: Duration,
    pub default_fanout: Duration,
    pub max_subscribers: usize,
    /// Tick durations and coalesced updates, shared with the metrics endpoint.
    pub figures: Arc<Figures>,
    subscribers: HashMap<u64, Subscriber>,
    /// Who of `subscribers` gets state updates (access other than NONE), when, from which version.
    schedule: Scheduler<u64>,
    /// The due list of a pass, kept to reuse its allocation.
    due: Vec<Due<u64>>,
    cache: PreparedCache,
    /// This channel's share of `figures.subscribers`.
    counted: u64,
    /// The registry (to remove this channel from it when it expires) and how long the channel
    /// lives without an owner.
    registry: Weak<Mutex<Registry>>,
    orphan_ttl: Duration,
    /// When the owner's session ended, while nobody has claimed the channel since.
    orphaned_at: Option<Instant>,
}

/// Whether the actor goes on after a message.
#[derive(PartialEq, Eq)]
enum Flow {
    Continue,
    Stop,
}

impl Channel {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        id: u64,
        state: State,
        schema_json: Arc<str>,
        owner: SessionHandle,
        remove_when_owner_lost: bool,
        tick: Duration,
        default_fanout: Duration,
        max_subscribers: usize,
        figures: Arc<Figures>,
        (registry, orphan_ttl): (Weak<Mutex<Registry>>, Duration),
    ) -> Channel {
        Channel {
            id,
            state,
            schema_json,
            owner: Some(owner),
            remove_when_owner_lost,
            tick,
            default_fanout,
            max_subscribers,
            figures,
            subscribers: HashMap::new(),
            schedule: Scheduler::new(),
            due: Vec::new(),
            cache: PreparedCache::default(),
            counted: 0,
            registry,
            orphan_ttl,
            orphaned_at: None,
        }
    }

    /// The actor: messages as they come, a fan-out pass every tick.
    pub async fn run(mut self, mut inbox: mpsc::Receiver<Msg>) {
        let mut ticker = tokio::time::interval(self.tick);
        ticker.set_missed_tick_behavior(MissedTickBehavior::Skip);
        loop {
            tokio::select! {
                msg = inbox.recv() => match msg {
                    Some(msg) => if batch(|| self.on_msg(Instant::now(), msg)) == Flow::Stop { break },
                    None => break,
                },
                due = ticker.tick() => {
                    let now = Instant::now();
                    self.figures.ticks.fetch_add(1, Ordering::Relaxed);
                    batch(|| self.on_tick(due.into_std(), now));
                    if self.orphan_expired(now) && self.expire() {
                        break;
                    }
                }
            }
        }
        // Rewinds and updates in flight of this channel mean nothing any more.
        for sub in self.subscribers.values() {
            sub.handle.flow.lock().forget(self.id);
        }
        self.subscribers.clear();
        self.count_subscribers();
        // Whatever was still queued will never be handled: answer it rather than leave the
        // callers waiting.
        inbox.close();
        while let Ok(msg) = inbox.try_recv() {
            if let Msg::Request(_, mut reply) = msg {
                let gone = format!("channel {} is gone", self.id);
                reply.send(error_response(reply.id(), Status::NotFound, gone));
            }
        }
    }

    /// Whether the channel has been without an owner for longer than its type allows.
    fn orphan_expired(&self, now: Instant) -> bool {
        self.orphaned_at.is_some_and(|since| now.saturating_duration_since(since) >= self.orphan_ttl)
    }

    /// Removes the ownerless channel: from the registry, then tells its subscribers. Returns
    /// `false` (and removes nothing) if a claim got into the registry first: its Claim message
    /// is on its way, and the channel goes on.
    fn expire(&mut self) -> bool {
        if let Some(registry) = self.registry.upgrade() {
            let mut reg = super::lock(&registry);
            if reg.channels.get(&self.id).is_some_and(|e| e.owner.is_some()) {
                self.orphaned_at = None;
                return false;
            }
            reg.forget(self.id);
        }
        let reason =
            format!("no game server claimed the channel within {:?} of its owner leaving", self.orphan_ttl);
        self.event_to_all(ChannelEventKind::Removed, &reason);
        true
    }

    /// Keeps this channel's share of the subscriber count current.
    fn count_subscribers(&mut self) {
        let now = self.subscribers.len() as u64;
        if now > self.counted {
            self.figures.subscribers.fetch_add(now - self.counted, Ordering::Relaxed);
        } else {
            self.figures.subscribers.fetch_sub(self.counted - now, Ordering::Relaxed);
        }
        self.counted = now;
    }

    fn remove_subscriber(&mut self, conn_id: u64) {
        if let Some(sub) = self.subscribers.remove(&conn_id) {
            sub.handle.flow.lock().forget(self.id);
        }
        self.schedule.leave(conn_id);
    }

    /// Handles one message that arrived at `now`.
    fn on_msg(&mut self, now: Instant, msg: Msg) -> Flow {
        match msg {
            Msg::Request(op, mut reply) => return self.on_request(now, op, &mut reply),
            Msg::Left { conn_id } => {
                self.remove_subscriber(conn_id);
                if self.owner.as_ref().is_some_and(|o| o.conn_id() == conn_id) {
                    self.owner = None;
                    if self.remove_when_owner_lost {
                        self.event_to_all(ChannelEventKind::Removed, "the owner left");
                        return Flow::Stop;
                    }
                    self.orphaned_at = Some(now);
                    self.event_to_all(ChannelEventKind::OwnerLost, "the owner's session ended");
                }
            }
        }
        Flow::Continue
    }

    /// Handles and answers one request that arrived at `now`.
    fn on_request(&mut self, now: Instant, op: Op, reply: &mut Reply) -> Flow {
        let id = reply.id();
        match op {
            Op::Subscribe { member, server, options } => {
                let conn_id = member.conn_id();
                let response = self.subscribe(now, member, server, options, id);
                // The quota first: a client that sends its next subscribe on this answer must
                // find the place this one gave back.
                self.handled(conn_id, true);
                reply.send(response);
            }
            Op::Unsubscribe { member } => {
                self.remove_subscriber(member.conn_id());
                self.handled(member.conn_id(), false);
                reply.send(ok(id, Bytes::new()));
            }
            Op::Update { from, patch } => {
                let response = self.update(&from, &patch, id);
                let applied = response.status == Status::Ok as i32;
                reply.send(response);
                if applied {
                    // Subscribers that are due get the change now instead of at the next tick;
                    // the others get it when they are due. Each still gets at most one update
                    // per fan-out interval.
                    batch(|| self.on_tick(now, now));
                }
            }
            Op::Send { from, send } => {
                let response = self.send(&from, send, id);
                reply.send(response);
            }
            Op::Remove => {
                self.event_to_all(ChannelEventKind::Removed, "the channel was removed");
                reply.send(ok(id, Bytes::new()));
                return Flow::Stop;
            }
            Op::Claim { owner } => {
                reply.send(ok(id, Bytes::new()));
                self.owner = Some(owner);
                self.orphaned_at = None;
                self.event_to_all(ChannelEventKind::OwnerRecovered, "a new owner took the channel");
            }
        }
        Flow::Continue
    }

    /// Tells the registry this actor handled a subscribe (or an unsubscribe) of `conn_id`, and
    /// whether it holds it as a subscriber now: its place in the quota goes when it is not
    /// subscribed and nothing else is on its way ([`super::registry::Place`]).
    fn handled(&self, conn_id: u64, subscribe: bool) {
        if let Some(registry) = self.registry.upgrade() {
            let active = self.subscribers.contains_key(&conn_id);
            super::lock(&registry).handled(conn_id, self.id, subscribe, active);
        }
    }

    fn subscribe(
        &mut self,
        now: Instant,
        member: SessionHandle,
        server: bool,
        options: SubscriptionOptions,
        request_id: u64,
    ) -> Response {
        let schedule = Options {
            interval: match options.fanout_interval_ms {
                0 => self.default_fanout,
                ms => Duration::from_millis(u64::from(ms)),
            },
            delay: Duration::from_millis(u64::from(options.fanout_delay_ms)),
            skip_first_full_state: options.skip_first_full_state,
        };
        let receives = options.access() != DataAccess::None;
        let mask = if options.fields.is_empty() {
            None
        } else {
            match FieldMask::from_names(self.state.schema(), &options.fields) {
                Ok(mask) => Some(mask),
                Err(e) => {
                    let msg = format!("channel {}: field filter: {e}", self.id);
                    return error_response(request_id, Status::InvalidArgument, msg);
                }
            }
        };
        let conn_id = member.conn_id();
        if let Some(sub) = self.subscribers.get_mut(&conn_id) {
            // New options take effect at the next fan-out. A new field filter changes what the
            // replica must hold, so it starts again from a snapshot.
            let resnapshot = sub.mask != mask;
            if resnapshot {
                // Updates of the old filter in flight must not rewind the new one.
                sub.handle.flow.lock().forget(self.id);
            }
            sub.options = options;
            sub.mask = mask;
            if !receives {
                self.schedule.leave(conn_id);
            } else if !self.schedule.set_options(conn_id, schedule, resnapshot) {
                self.schedule.join(conn_id, schedule, now, self.state.version());
            }
        } else {
            if self.subscribers.len() >= self.max_subscribers {
                let msg =
                    format!("channel {} has its maximum of {} subscribers", self.id, self.max_subscribers);
                return error_response(request_id, Status::Unavailable, msg);
            }
            // Updates of an earlier subscription still in flight must not rewind this one.
            member.flow.lock().forget(self.id);
            let sub = Subscriber {
                player: Key::str(member.player_id()),
                mask,
                handle: member.clone(),
                server,
                options,
            };
            self.subscribers.insert(conn_id, sub);
            if receives {
                // The version now, not at the first pass: a subscriber that skips the full
                // state holds this one, and every later change must reach it.
                self.schedule.join(conn_id, schedule, now, self.state.version());
            }
        }
        let result = SubscribeResult {
            channel_id: self.id,
            connection_id: conn_id,
            schema_json: self.schema_json.to_string(),
        };
        ok(request_id, result.encode_to_vec().into())
    }

    fn may_write(&self, from: &SessionHandle) -> bool {
        self.owner.as_ref().is_some_and(|o| o.conn_id() == from.conn_id())
            || self.subscribers.get(&from.conn_id()).is_some_and(|s| s.options.access() == DataAccess::Write)
    }

    fn update(&mut self, from: &SessionHandle, patch: &[u8], request_id: u64) -> Response {
        if !self.may_write(from) {
            let msg = format!("channel {}: only its owner and write subscribers may update it", self.id);
            return error_response(request_id, Status::PermissionDenied, msg);
        }
        let applied = Patch::parse_json(self.state.schema(), patch).and_then(|p| self.state.apply_patch(&p));
        match applied {
            Ok(()) => ok(request_id, Bytes::new()),
            Err(e) => {
                // Past a size limit is a quota, not a malformed request.
                let (status, key) = match &e {
                    PatchError::Rejected { source: StateError::TooLong { .. }, .. } => {
                        (Status::ResourceExhausted, " (channels.max_list_len)")
                    }
                    PatchError::Rejected { source: StateError::TooBig { .. }, .. } => {
                        (Status::ResourceExhausted, " (channels.max_state_bytes)")
                    }
                    _ => (Status::InvalidArgument, ""),
                };
                error_response(request_id, status, format!("channel {}: {e}{key}", self.id))
            }
        }
    }

    fn send(&mut self, from: &SessionHandle, send: ChannelSend, request_id: u64) -> Response {
        let from_owner = self.owner.as_ref().is_some_and(|o| o.conn_id() == from.conn_id());
        let from_server = from_owner || self.subscribers.get(&from.conn_id()).is_some_and(|s| s.server);
        let message =
            ChannelMessage { channel_id: self.id, from_connection: from.conn_id(), body: send.body.clone() };
        let body: Bytes = message.encode_to_vec().into();
        let broadcast = send.broadcast();
        if broadcast == Broadcast::None {
            let target = match send.to_connection {
                0 => self.owner.clone(),
                id => self
                    .subscribers
                    .get(&id)
                    .map(|s| s.handle.clone())
                    .or_else(|| self.owner.clone().filter(|o| o.conn_id() == id)),
            };
            if !from_server && send.to_connection != 0 {
                let msg = "clients may only send to the channel's owner (to_connection 0)".to_owned();
                return error_response(request_id, Status::PermissionDenied, msg);
            }
            return match target {
                Some(to) if from_server => deliver(&to, body, request_id),
                Some(to) => relay(&to, body, request_id),
                None => {
                    error_response(request_id, Status::NotFound, format!("no member {}", send.to_connection))
                }
            };
        }
        if !from_server {
            let msg = "only servers may broadcast on a channel".to_owned();
            return error_response(request_id, Status::PermissionDenied, msg);
        }
        // Members: every subscriber, and the owner (a server) even if it did not subscribe.
        let owner_id = self.owner.as_ref().map(SessionHandle::conn_id);
        let mut members: Vec<(&SessionHandle, bool)> =
            self.subscribers.values().map(|s| (&s.handle, s.server)).collect();
        if let Some(owner) = &self.owner
            && !self.subscribers.contains_key(&owner.conn_id())
        {
            members.push((owner, true));
        }
        let targets = members.into_iter().filter(|(h, server)| match broadcast {
            Broadcast::AllButSender => h.conn_id() != from.conn_id(),
            Broadcast::AllButOwner => Some(h.conn_id()) != owner_id,
            Broadcast::Clients => !server,
            Broadcast::Servers => *server,
            Broadcast::All | Broadcast::None => true,
        });
        for (to, _) in targets {
            // A full outbox ends that session as a slow consumer; the others are unaffected.
            let _ = to.push("channel.message", body.clone());
        }
        ok(request_id, Bytes::new())
    }

    fn event_to_all(&self, kind: ChannelEventKind, reason: &str) {
        let event = ChannelEvent { channel_id: self.id, kind: kind as i32, reason: reason.to_owned() };
        let body: Bytes = event.encode_to_vec().into();
        for sub in self.subscribers.values() {
            let _ = sub.handle.push("channel.event", body.clone());
        }
    }

    /// One fan-out pass: every subscriber the scheduler finds due, and whose session has room in
    /// its window of updates in flight, gets one update from its own version. The schedule runs
    /// on `scheduled`: for a pass on the timer, the instant its tick was due, so a tick that runs
    /// late does not make the next one skip a subscriber (`tickwire_fanout`'s module comment);
    /// for a pass after a patch, the clock. The windows and outboxes get the clock, `now`.
    fn on_tick(&mut self, scheduled: Instant, now: Instant) {
        let started = std::time::Instant::now();
        let to = self.state.seal();
        let Channel { id, state, subscribers, schedule, due, cache, figures, .. } = self;
        // A resume dropped updates the client never received: start again from what it holds.
        for (&conn_id, sub) in subscribers.iter() {
            if let Some(base) = sub.handle.flow.take_rewind(*id) {
                schedule.rewind(conn_id, base);
            }
        }
        due.clear();
        schedule.due(scheduled, to, due);
        let mut gone = Vec::new();
        let mut encoded: HashMap<(Version, i32, Option<FieldMask>), Bytes> = HashMap::new();
        for &Due { id: conn_id, from } in due.iter() {
            let Some(sub) = subscribers.get(&conn_id) else {
                gone.push(conn_id);
                continue;
            };
            if !sub.handle.flow.has_room(now) {
                // Still reading what it has: this change merges into its next update.
                figures.coalesced.fetch_add(1, Ordering::Relaxed);
                schedule.record(conn_id, scheduled, Outcome::Refused);
                continue;
            }
            let codec = super::state_codec(sub.options.codec());
            let base = from.unwrap_or(0);
            let update = cache
                .get_masked(state, base, codec, sub.mask.as_ref())
                .and_then(|p| Ok((p.update_for(state, &sub.player, sub.options.skip_self)?, p.to())));
            let Ok((update, version)) = update else {
                // The state no longer holds the history for a delta from `from` (a subscriber
                // far behind, or rewound after a resume): it gets a snapshot next pass.
                schedule.resnapshot(conn_id);
                continue;
            };
            if from.is_some() && !update.has_changes() {
                schedule.record(conn_id, scheduled, Outcome::Empty);
                continue;
            }
            // Subscribers at the same version with nothing of their own (no private segment, no
            // skipped entry) get the very same message: encode it once, share the bytes.
            let shared = update.segments.len() == 2;
            let key = (base, sub.options.codec, sub.mask.clone());
            let envelope = match shared.then(|| encoded.get(&key)).flatten() {
                Some(bytes) => bytes.clone(),
                None => {
                    let body = ChannelUpdate {
                        channel_id: *id,
                        codec: sub.options.codec,
                        update: update.to_vec().into(),
                    };
                    let bytes = push_envelope("channel.update", body.encode_to_vec().into());
                    if shared {
                        encoded.insert(key, bytes.clone());
                    }
                    bytes
                }
            };
            let outcome = match sub.handle.offer_update(now, *id, from, envelope) {
                Ok(()) => {
                    figures.fanouts.fetch_add(1, Ordering::Relaxed);
                    Outcome::Sent { to: version }
                }
                Err(PushError::Full) => {
                    figures.coalesced.fetch_add(1, Ordering::Relaxed);
                    Outcome::Refused
                }
                Err(PushError::Closed) => {
                    gone.push(conn_id);
                    continue;
                }
            };
            schedule.record(conn_id, scheduled, outcome);
        }
        for conn_id in gone {
            self.remove_subscriber(conn_id);
        }
        self.count_subscribers();
        self.figures.record_pass_time(started.elapsed());
    }
}

fn ok(id: u64, body: Bytes) -> Response {
    Response { id, status: Status::Ok as i32, body, error: String::new() }
}

fn deliver(to: &SessionHandle, body: Bytes, request_id: u64) -> Response {
    match to.push("channel.message", body) {
        Ok(()) => ok(request_id, Bytes::new()),
        Err(e) => error_response(request_id, Status::Unavailable, format!("recipient: {e}")),
    }
}

/// A client's message to the owner: if the owner's outbox is short of room, the client is told
/// to retry, and the owner is not made a slow consumer ([`SessionHandle::relay`]).
fn relay(to: &SessionHandle, body: Bytes, request_id: u64) -> Response {
    match to.relay(body.len()) {
        Ok(place) => {
            place.push("channel.message", body);
            ok(request_id, Bytes::new())
        }
        Err(PushError::Full) => error_response(
            request_id,
            Status::Unavailable,
            "the channel's owner has more messages waiting than it takes from clients; retry".into(),
        ),
        Err(e) => error_response(request_id, Status::Unavailable, format!("recipient: {e}")),
    }
}
