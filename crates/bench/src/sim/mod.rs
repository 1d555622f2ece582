//! The simulated game of workload B3 (`BENCHMARKS.md`, "common setup"), shared by
//! `tickwire bench replication` and `tickwire demo`: an authoritative character simulation at a
//! fixed 30 frames per second, and the bots that drive the characters.
//!
//! Pure logic with injected randomness, so that both sides can be tested without a network.

mod bot;
mod world;

pub use bot::Bot;
pub use world::{Aabb, Arena, Character, FPS, GRAVITY, Input, JUMP_SPEED, RADIUS, WALK_SPEED};
