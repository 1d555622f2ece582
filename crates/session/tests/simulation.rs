//! Deterministic simulation of a client and a server session over a network that cuts
//! connections, delays frames, delivers duplicates and lets time pass.
//!
//! The property: each side's application receives exactly the messages the other side sent,
//! once each and in order. If the session legitimately expires or overflows, what was delivered
//! is still an in-order prefix with no duplicate. Proptest shrinks a failing run to a minimal
//! list of operations and records it in `proptest-regressions/`, so it replays exactly.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use bytes::Bytes;
use proptest::prelude::*;
use tickwire_session::{Received, Role, Session, SessionConfig, Timeout};
use tickwire_wire::Frame;

#[derive(Debug, Clone)]
enum Op {
    ClientSend,
    ServerSend,
    DeliverToServer,
    DeliverToClient,
    /// Re-deliver a DATA frame the client already received on some connection.
    DuplicateToClient(prop::sample::Index),
    DuplicateToServer(prop::sample::Index),
    Cut,
    Reconnect,
    Advance(u64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => Just(Op::ClientSend),
        4 => Just(Op::ServerSend),
        6 => Just(Op::DeliverToServer),
        6 => Just(Op::DeliverToClient),
        1 => any::<prop::sample::Index>().prop_map(Op::DuplicateToClient),
        1 => any::<prop::sample::Index>().prop_map(Op::DuplicateToServer),
        1 => Just(Op::Cut),
        2 => Just(Op::Reconnect),
        2 => (0u64..4000).prop_map(Op::Advance),
    ]
}

struct Side {
    session: Session,
    sent: Vec<Bytes>,
    delivered: Vec<Bytes>,
    /// DATA frames this side has seen, for duplicate injection.
    seen: Vec<Frame>,
}

struct World {
    now: Instant,
    client: Side,
    server: Side,
    /// (to_server, to_client) queues of the live connection.
    link: Option<(VecDeque<Frame>, VecDeque<Frame>)>,
    over: bool,
    counter: u32,
}

impl World {
    fn new(config: SessionConfig) -> World {
        let now = Instant::now();
        let side = |role| Side {
            session: Session::new(role, config.clone(), now),
            sent: Vec::new(),
            delivered: Vec::new(),
            seen: Vec::new(),
        };
        World {
            now,
            client: side(Role::Client),
            server: side(Role::Server),
            link: Some((VecDeque::new(), VecDeque::new())),
            over: false,
            counter: 0,
        }
    }

    fn send(&mut self, from_client: bool) {
        self.counter += 1;
        let payload = Bytes::from(self.counter.to_be_bytes().to_vec());
        let side = if from_client { &mut self.client } else { &mut self.server };
        match side.session.send(self.now, payload.clone()) {
            Ok(frame) => {
                side.sent.push(payload);
                if let (Some(frame), Some((to_s, to_c))) = (frame, &mut self.link) {
                    if from_client { to_s.push_back(frame) } else { to_c.push_back(frame) }
                }
            }
            Err(_) => self.over = true,
        }
    }

    fn deliver(&mut self, to_client: bool, duplicate: Option<prop::sample::Index>) {
        let Some((to_s, to_c)) = &mut self.link else { return };
        let (queue, back, side) =
            if to_client { (to_c, to_s, &mut self.client) } else { (to_s, to_c, &mut self.server) };
        let frame = match duplicate {
            Some(i) if !side.seen.is_empty() => side.seen[i.index(side.seen.len())].clone(),
            Some(_) => return,
            None => match queue.pop_front() {
                Some(f) => f,
                None => return,
            },
        };
        if matches!(frame, Frame::Data { .. }) {
            side.seen.push(frame.clone());
        }
        match side.session.on_frame(self.now, frame) {
            Ok(Received::Deliver(p)) => side.delivered.push(p),
            Ok(Received::Duplicate | Received::Nothing) => {}
            Err(e) => panic!("protocol error on a well-behaved network: {e}"),
        }
        if let Some(reply) = side.session.poll_transmit(self.now) {
            back.push_back(reply);
        }
    }

    fn cut(&mut self) {
        if self.link.take().is_some() {
            self.client.session.detach(self.now);
            self.server.session.detach(self.now);
        }
    }

    fn reconnect(&mut self) {
        if self.link.is_some() || self.over {
            return;
        }
        // Hello carries the client's last_received, Welcome the server's.
        let to_client = match self.server.session.attach(self.now, self.client.session.last_received()) {
            Ok(frames) => frames,
            Err(e) => panic!("server refused a valid resume: {e}"),
        };
        let to_server = match self.client.session.attach(self.now, self.server.session.last_received()) {
            Ok(frames) => frames,
            Err(e) => panic!("client refused a valid welcome: {e}"),
        };
        self.link = Some((to_server.into(), to_client.into()));
    }

    fn advance(&mut self, ms: u64) {
        self.now += Duration::from_millis(ms);
        for from_client in [true, false] {
            let side = if from_client { &mut self.client } else { &mut self.server };
            while side.session.poll_timeout() <= self.now {
                match side.session.on_timeout(self.now) {
                    Timeout::Nothing => break,
                    Timeout::Transmit(frame) => {
                        if let Some((to_s, to_c)) = &mut self.link {
                            if from_client { to_s.push_back(frame) } else { to_c.push_back(frame) }
                        }
                    }
                    Timeout::LinkDead => {
                        self.cut();
                        break;
                    }
                    Timeout::Expired => {
                        self.over = true;
                        return;
                    }
                }
            }
        }
    }

    fn apply(&mut self, op: Op) {
        if self.over {
            return;
        }
        match op {
            Op::ClientSend => self.send(true),
            Op::ServerSend => self.send(false),
            Op::DeliverToServer => self.deliver(false, None),
            Op::DeliverToClient => self.deliver(true, None),
            Op::DuplicateToClient(i) => self.deliver(true, Some(i)),
            Op::DuplicateToServer(i) => self.deliver(false, Some(i)),
            Op::Cut => self.cut(),
            Op::Reconnect => self.reconnect(),
            Op::Advance(ms) => self.advance(ms),
        }
    }

    /// Reconnects if needed and runs the network until both queues are empty.
    fn settle(&mut self) {
        self.reconnect();
        for _ in 0..100_000 {
            let Some((to_s, to_c)) = &self.link else { return };
            if to_s.is_empty() && to_c.is_empty() {
                return;
            }
            self.deliver(false, None);
            self.deliver(true, None);
        }
        panic!("network did not settle");
    }
}

fn is_prefix(delivered: &[Bytes], sent: &[Bytes]) -> bool {
    delivered.len() <= sent.len() && delivered == &sent[..delivered.len()]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn exactly_once_in_order_across_cuts(
        ops in proptest::collection::vec(op(), 1..300),
        ack_every in 1u64..20,
    ) {
        let config = SessionConfig { ack_every, ..SessionConfig::default() };
        let mut world = World::new(config);
        for op in ops {
            world.apply(op);
        }
        if !world.over {
            world.settle();
        }
        let (c, s) = (&world.client, &world.server);
        if world.over {
            prop_assert!(is_prefix(&c.delivered, &s.sent));
            prop_assert!(is_prefix(&s.delivered, &c.sent));
        } else {
            prop_assert_eq!(&c.delivered, &s.sent);
            prop_assert_eq!(&s.delivered, &c.sent);
        }
    }
}
