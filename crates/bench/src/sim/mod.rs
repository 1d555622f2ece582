//! The simulated game of workload B3 (`BENCHMARKS.md`, "common setup"), shared by
//! `tickwire bench replication` and `tickwire demo`: an authoritative character simulation at a
//! fixed 30 frames per second, and the bots that drive the characters.
//!
//! `world` and `bot` are pure logic with injected randomness, tested without a network;
//! `server` and `bots` put them on the wire as a game server and its clients.

pub mod ages;
mod bot;
pub mod bots;
pub mod demo;
pub mod game;
pub mod load_lag;
pub mod server;
pub mod slow_link;
pub mod spatial_bots;
pub mod spatial_server;
mod world;

pub use bot::Bot;
pub use world::{Aabb, Arena, Character, FPS, GRAVITY, Input, JUMP_SPEED, RADIUS, WALK_SPEED};
