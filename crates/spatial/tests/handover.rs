//! Handovers under random interleavings: an entity's messages are numbered and sent while it is
//! handed from server to server. Servers read their connection in order but process what they
//! read later (at their own frame), so a release can come while messages were read and not
//! processed: the server drops those, and the gateway must forward them. "Processed" reports
//! and releases come back late. Every message must be processed exactly once, in the order it
//! was sent, whoever processed it.

use std::collections::VecDeque;

use proptest::prelude::*;
use tickwire_spatial::handover::{Action, Route, RouteError, ServerId};

const SERVERS: u64 = 3;

/// What a server receives, in order.
#[derive(Debug, Clone)]
enum Inbox {
    Message(u64, u32),
    Release(u64),
    Acquire(Vec<(u64, u32)>),
}

/// What comes back to the gateway, late.
#[derive(Debug, Clone)]
enum Reply {
    Processed(ServerId, u64),
    Released { handover: u64, processed: u64 },
}

struct World {
    route: Route<u32>,
    inboxes: Vec<VecDeque<Inbox>>,
    /// Read by each server, not yet processed.
    pending: Vec<VecDeque<(u64, u32)>>,
    replies: VecDeque<Reply>,
    /// The last sequence number each server processed for the entity.
    last: Vec<u64>,
    /// Every message processed, in processing order, by any server.
    log: Vec<u32>,
    sent: u32,
}

impl World {
    fn act(&mut self, action: Action<u32>) {
        match action {
            Action::Deliver { to, seq, message } => {
                self.inboxes[to as usize].push_back(Inbox::Message(seq, message))
            }
            Action::Release { to, handover } => self.inboxes[to as usize].push_back(Inbox::Release(handover)),
            Action::Acquire { to, messages, .. } => {
                self.inboxes[to as usize].push_back(Inbox::Acquire(messages))
            }
        }
    }

    /// Server `s` reads the front of its connection.
    fn read(&mut self, s: usize) {
        let Some(item) = self.inboxes[s].pop_front() else { return };
        match item {
            Inbox::Message(seq, m) => self.pending[s].push_back((seq, m)),
            Inbox::Release(handover) => {
                // Answered at once with what was processed; what was read and not processed
                // is dropped here (the gateway forwards it to the new owner).
                self.pending[s].clear();
                self.replies.push_back(Reply::Released { handover, processed: self.last[s] });
            }
            Inbox::Acquire(messages) => self.pending[s].extend(messages),
        }
    }

    /// Server `s` processes the oldest message it has read. It reports progress only now
    /// and then (every third message), so the release's count is what the gateway must trust.
    fn process(&mut self, s: usize) {
        if let Some((seq, m)) = self.pending[s].pop_front() {
            self.log.push(m);
            self.last[s] = seq;
            if seq % 3 == 0 {
                self.replies.push_back(Reply::Processed(s as u64, seq));
            }
        }
    }

    /// The gateway handles the oldest reply.
    fn reply(&mut self) {
        match self.replies.pop_front() {
            Some(Reply::Processed(s, seq)) => self.route.processed(s, seq),
            Some(Reply::Released { handover, processed }) => {
                let acquire = self.route.released(handover, processed, vec![]).expect("a valid release");
                self.act(acquire);
            }
            None => {}
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 500, ..ProptestConfig::default() })]

    #[test]
    fn every_message_is_processed_once_in_order(ops in prop::collection::vec((0u8..10, 0u64..SERVERS), 1..400)) {
        let mut w = World {
            route: Route::new(0, 64),
            inboxes: vec![VecDeque::new(); SERVERS as usize],
            pending: vec![VecDeque::new(); SERVERS as usize],
            replies: VecDeque::new(),
            last: vec![0; SERVERS as usize],
            log: Vec::new(),
            sent: 0,
        };
        let mut handovers = 0;
        for (op, arg) in ops {
            match op {
                0..=3 => match w.route.send(w.sent + 1) {
                    Ok(action) => {
                        w.sent += 1;
                        if let Some(a) = action {
                            w.act(a);
                        }
                    }
                    Err(RouteError::Full(_)) => {} // The client is told to slow down.
                    Err(e) => prop_assert!(false, "{e}"),
                },
                4 | 5 => w.read(arg as usize),
                6 => w.process(arg as usize),
                7 | 8 => w.reply(),
                _ => {
                    if !w.route.handing_over() && arg != w.route.owner() {
                        let release = w.route.begin_handover(arg).unwrap();
                        w.act(release);
                        handovers += 1;
                    }
                }
            }
        }
        // Let everything settle.
        while w.inboxes.iter().any(|q| !q.is_empty())
            || w.pending.iter().any(|q| !q.is_empty())
            || !w.replies.is_empty()
        {
            for s in 0..SERVERS as usize {
                w.read(s);
                w.process(s);
            }
            w.reply();
        }
        let want: Vec<u32> = (1..=w.sent).collect();
        prop_assert_eq!(&w.log, &want, "after {} handovers", handovers);
    }
}
