//! The spatial world of channeld's scenario 2, as pure geometry with no I/O and no clock: a
//! grid of square cells on the horizontal plane, blocks of cells owned by spatial servers
//! ([`layout`]), areas of interest and the cells they touch ([`interest`]), and what a move
//! of an entity means: nothing, a cell change within one server, or a handover to another
//! server ([`Layout::classify`]), and the route of an entity's messages through a handover
//! with nothing lost, duplicated or reordered ([`handover`]), and how often a client hears of
//! each cell by its distance ([`lod`]). The gateway drives channels,
//! subscriptions and handovers from these answers; keeping them here makes them testable
//! against brute force and random interleavings.
//!
//! Coordinates: positions are `[x, y, z]` with `y` up; the grid lies on the `x`/`z` plane (as
//! in tickwire's simulated world). A cell is `[column, row]`: column along `x`, row along `z`.

pub mod handover;
pub mod interest;
pub mod layout;
pub mod lod;

pub use interest::Area;
pub use layout::{Cell, Layout, LayoutConfig, LayoutError, Move, ServerSlot};
pub use lod::{Band, Bands, LodError};
