//! The spatial world's two inboxes, one per role, and the order the world takes from them.
//!
//! Why two: players' requests (areas of interest, messages to entities) can fill theirs without
//! holding up a game server's publish or release. Why an order with a turn for players: the
//! world takes servers' messages first, so that a crowd of players never delays a frame; but a
//! server that never stops sending (one flooding publishes, or many servers in a burst) must
//! not keep every player waiting for good either, so after [`SERVERS_BEFORE_A_PLAYER`] servers'
//! messages in a row a waiting player's goes first. A session's messages, and the notice that
//! it left, all go through its role's inbox, so they stay in order.

use tokio::sync::mpsc;

use super::Msg;
use crate::auth::Role;

/// Game servers' messages the world takes in a row, while a player's waits, before it takes
/// that player's. Servers still have most of the world's time under a flood (32 to 1), and
/// players get an answer within 32 servers' messages of theirs reaching the front.
pub(super) const SERVERS_BEFORE_A_PLAYER: u32 = 32;

/// The senders' side, one per role, each `channels.inbox_capacity` long.
pub(super) struct Inboxes {
    pub servers: mpsc::Sender<Msg>,
    pub players: mpsc::Sender<Msg>,
}

impl Inboxes {
    /// Two inboxes of `capacity` messages each, and the world's side of them.
    pub fn new(capacity: usize) -> (Inboxes, Taker) {
        let (servers, servers_rx) = mpsc::channel(capacity);
        let (players, players_rx) = mpsc::channel(capacity);
        let taker = Taker { servers: servers_rx, players: players_rx, servers_in_a_row: 0 };
        (Inboxes { servers, players }, taker)
    }

    pub fn of(&self, role: Role) -> &mpsc::Sender<Msg> {
        match role {
            Role::Server => &self.servers,
            Role::Player => &self.players,
        }
    }
}

/// The world's side: takes the next message in the order above.
pub(super) struct Taker {
    servers: mpsc::Receiver<Msg>,
    players: mpsc::Receiver<Msg>,
    /// Servers' messages taken since a player's was (or since none was waiting).
    servers_in_a_row: u32,
}

impl Taker {
    /// The next message: a game server's before a player's, except a player's that waited
    /// through [`SERVERS_BEFORE_A_PLAYER`] servers' in a row. `None` once either side's senders
    /// are all gone (the gateway is stopping).
    ///
    /// Cancel safe, for the world's `select!`: a message is taken only in the poll that returns
    /// it.
    pub async fn next(&mut self) -> Option<Msg> {
        if self.servers_in_a_row >= SERVERS_BEFORE_A_PLAYER {
            self.servers_in_a_row = 0;
            if let Ok(msg) = self.players.try_recv() {
                return Some(msg);
            }
        }
        tokio::select! {
            biased;
            msg = self.servers.recv() => {
                self.servers_in_a_row = self.servers_in_a_row.saturating_add(1);
                msg
            }
            msg = self.players.recv() => {
                self.servers_in_a_row = 0;
                msg
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Which inbox a taken message came from, by its `Left` id: servers' are below 1,000.
    fn from_a_player(msg: &Msg) -> bool {
        matches!(msg, Msg::Left(id) if *id >= 1_000)
    }

    #[tokio::test]
    async fn servers_go_first_but_a_waiting_player_gets_a_turn_every_32_of_theirs() {
        let (inboxes, mut taker) = Inboxes::new(256);
        for id in 0..100 {
            inboxes.servers.try_send(Msg::Left(id)).unwrap();
        }
        for id in 1_000..1_003 {
            inboxes.players.try_send(Msg::Left(id)).unwrap();
        }
        let mut order = Vec::new();
        for _ in 0..103 {
            order.push(taker.next().await.unwrap());
        }
        let players: Vec<usize> =
            order.iter().enumerate().filter(|(_, m)| from_a_player(m)).map(|(at, _)| at).collect();
        // 32 servers', a player's, 32 servers', a player's, ...: the third player's comes after
        // 96 servers', and the last 4 servers' after it.
        assert_eq!(players, [32, 65, 98]);
        // Each inbox's messages still come in the order they were sent.
        let ids = |player: bool| -> Vec<u64> {
            order
                .iter()
                .filter(|m| from_a_player(m) == player)
                .map(|m| match m {
                    Msg::Left(id) => *id,
                    _ => unreachable!("only Left was sent"),
                })
                .collect()
        };
        assert_eq!(ids(false), (0..100).collect::<Vec<_>>());
        assert_eq!(ids(true), [1_000, 1_001, 1_002]);
    }

    #[tokio::test]
    async fn a_player_goes_at_once_when_no_server_waits_and_the_count_starts_over() {
        let (inboxes, mut taker) = Inboxes::new(256);
        inboxes.players.try_send(Msg::Left(1_000)).unwrap();
        assert!(from_a_player(&taker.next().await.unwrap()));
        // 31 servers' then a player's that arrives: still servers first until the 32nd.
        for id in 0..40 {
            inboxes.servers.try_send(Msg::Left(id)).unwrap();
        }
        for _ in 0..31 {
            assert!(!from_a_player(&taker.next().await.unwrap()));
        }
        inboxes.players.try_send(Msg::Left(1_001)).unwrap();
        assert!(!from_a_player(&taker.next().await.unwrap()), "the 32nd server's");
        assert!(from_a_player(&taker.next().await.unwrap()), "then the player's");
    }

    #[tokio::test]
    async fn it_ends_when_the_senders_are_gone() {
        let (inboxes, mut taker) = Inboxes::new(4);
        drop(inboxes);
        assert!(taker.next().await.is_none());
    }
}
