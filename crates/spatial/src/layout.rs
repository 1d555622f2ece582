//! The grid: where the world starts, how big its cells are, how many there are, and which
//! spatial server owns each (a rectangular block of cells per server, as channeld assigns
//! them). Checked once, when the configuration is read.

use serde::{Deserialize, Serialize};

/// `[spatial]` in the gateway's configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LayoutConfig {
    /// World coordinates `[x, z]` of the grid's lower corner.
    #[serde(default)]
    pub origin: [f32; 2],
    /// Side of a (square) cell, in world units (metres in the report).
    pub cell_size: f32,
    /// Cells along `x` and along `z`.
    pub cells: [u32; 2],
    /// Spatial servers along `x` and along `z`; each owns an equal block of cells.
    pub servers: [u32; 2],
    /// How many cells beyond its own block a spatial server also receives (0 in the report).
    #[serde(default)]
    pub server_interest_border: u32,
}

/// Why a layout cannot be used.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum LayoutError {
    #[error("spatial.cell_size must be a positive finite number, got {0}")]
    CellSize(f32),
    #[error("spatial.origin must be finite, got {0:?}")]
    Origin([f32; 2]),
    #[error("spatial.cells must be at least 1x1, got {0:?}")]
    NoCells([u32; 2]),
    #[error("spatial.cells {cells:?} holds more than {max} cells")]
    TooManyCells { cells: [u32; 2], max: u64 },
    #[error("spatial.servers must be at least 1x1, got {0:?}")]
    NoServers([u32; 2]),
    #[error(
        "spatial.cells {cells:?} cannot be split evenly among spatial.servers {servers:?} (each server owns an equal block)"
    )]
    Uneven { cells: [u32; 2], servers: [u32; 2] },
}

/// The most cells a world may have: each is a channel.
pub const MAX_CELLS: u64 = 65_536;

/// A cell: `[column, row]`.
pub type Cell = [u32; 2];

/// A spatial server's place in the server grid: `[column, row]` of blocks.
pub type ServerSlot = [u32; 2];

/// A checked layout.
#[derive(Debug, Clone, PartialEq)]
pub struct Layout {
    config: LayoutConfig,
    /// Cells per server block along `x` and `z`.
    block: [u32; 2],
}

/// What a move of an entity from one position to another means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Move {
    /// Still in the same cell.
    Stay,
    /// Into another cell of the same server: only the cell channels change.
    CellChange {
        from: Cell,
        to: Cell,
    },
    /// Into a cell of another server: the entity is handed over.
    Handover {
        from: Cell,
        to: Cell,
        from_server: ServerSlot,
        to_server: ServerSlot,
    },
    /// Out of the world (or into it, from outside): no cell holds the new position.
    Left {
        from: Cell,
    },
    Entered {
        to: Cell,
    },
    /// Outside before and after.
    Outside,
}

impl Layout {
    pub fn new(config: LayoutConfig) -> Result<Layout, LayoutError> {
        let c = &config;
        if !(c.cell_size.is_finite() && c.cell_size > 0.0) {
            return Err(LayoutError::CellSize(c.cell_size));
        }
        if !c.origin.iter().all(|v| v.is_finite()) {
            return Err(LayoutError::Origin(c.origin));
        }
        if c.cells.contains(&0) {
            return Err(LayoutError::NoCells(c.cells));
        }
        if u64::from(c.cells[0]) * u64::from(c.cells[1]) > MAX_CELLS {
            return Err(LayoutError::TooManyCells { cells: c.cells, max: MAX_CELLS });
        }
        if c.servers.contains(&0) {
            return Err(LayoutError::NoServers(c.servers));
        }
        if !c.cells[0].is_multiple_of(c.servers[0]) || !c.cells[1].is_multiple_of(c.servers[1]) {
            return Err(LayoutError::Uneven { cells: c.cells, servers: c.servers });
        }
        let block = [c.cells[0] / c.servers[0], c.cells[1] / c.servers[1]];
        Ok(Layout { config, block })
    }

    pub fn config(&self) -> &LayoutConfig {
        &self.config
    }

    /// How many cells there are.
    pub fn cell_count(&self) -> u32 {
        self.config.cells[0] * self.config.cells[1]
    }

    /// Every spatial server slot, row by row.
    pub fn servers(&self) -> impl Iterator<Item = ServerSlot> + '_ {
        let [sx, sz] = self.config.servers;
        (0..sz).flat_map(move |r| (0..sx).map(move |c| [c, r]))
    }

    /// The cell holding a position, if it is inside the world. A position on a cell's upper
    /// edge belongs to the next cell (cells are half-open), the world's upper edge to none.
    pub fn cell_of(&self, position: [f32; 3]) -> Option<Cell> {
        let c = &self.config;
        let along = |v: f32, origin: f32, n: u32| -> Option<u32> {
            let i = ((v - origin) / c.cell_size).floor();
            (i.is_finite() && i >= 0.0 && i < n as f32).then_some(i as u32)
        };
        Some([along(position[0], c.origin[0], c.cells[0])?, along(position[2], c.origin[1], c.cells[1])?])
    }

    /// The server owning a cell.
    pub fn server_of(&self, cell: Cell) -> ServerSlot {
        [cell[0] / self.block[0], cell[1] / self.block[1]]
    }

    /// The cells a server owns, row by row.
    pub fn cells_of(&self, server: ServerSlot) -> impl Iterator<Item = Cell> + '_ {
        let [bx, bz] = self.block;
        (server[1] * bz..(server[1] + 1) * bz)
            .flat_map(move |r| (server[0] * bx..(server[0] + 1) * bx).map(move |c| [c, r]))
    }

    /// The cells a server receives: its own, and `server_interest_border` cells around them
    /// (clipped to the world).
    pub fn cells_received_by(&self, server: ServerSlot) -> Vec<Cell> {
        let b = self.config.server_interest_border;
        let [bx, bz] = self.block;
        let lo = |start: u32| start.saturating_sub(b);
        let hi = |end: u32, n: u32| (end + b).min(n);
        let (x0, x1) = (lo(server[0] * bx), hi((server[0] + 1) * bx, self.config.cells[0]));
        let (z0, z1) = (lo(server[1] * bz), hi((server[1] + 1) * bz, self.config.cells[1]));
        (z0..z1).flat_map(|r| (x0..x1).map(move |c| [c, r])).collect()
    }

    /// A cell's bounds on the plane: `([x_min, z_min], [x_max, z_max])`.
    pub fn bounds(&self, cell: Cell) -> ([f32; 2], [f32; 2]) {
        let c = &self.config;
        let min = [c.origin[0] + cell[0] as f32 * c.cell_size, c.origin[1] + cell[1] as f32 * c.cell_size];
        (min, [min[0] + c.cell_size, min[1] + c.cell_size])
    }

    /// The distance on the plane from `point` (its `x` and `z`) to the nearest point of
    /// `cell`'s square: 0 inside it. No point of the cell is nearer.
    pub fn distance_to(&self, cell: Cell, point: [f32; 3]) -> f32 {
        self.squared_distance_to(cell, point).sqrt()
    }

    /// [`Layout::distance_to`], squared.
    pub(crate) fn squared_distance_to(&self, cell: Cell, point: [f32; 3]) -> f32 {
        let (lo, hi) = self.bounds(cell);
        let dx = point[0] - point[0].clamp(lo[0], hi[0]);
        let dz = point[2] - point[2].clamp(lo[1], hi[1]);
        dx * dx + dz * dz
    }

    /// What moving from `from` to `to` means for the entity.
    pub fn classify(&self, from: [f32; 3], to: [f32; 3]) -> Move {
        match (self.cell_of(from), self.cell_of(to)) {
            (None, None) => Move::Outside,
            (Some(from), None) => Move::Left { from },
            (None, Some(to)) => Move::Entered { to },
            (Some(a), Some(b)) if a == b => Move::Stay,
            (Some(from), Some(to)) => {
                let (from_server, to_server) = (self.server_of(from), self.server_of(to));
                if from_server == to_server {
                    Move::CellChange { from, to }
                } else {
                    Move::Handover { from, to, from_server, to_server }
                }
            }
        }
    }

    /// The cells whose bounds intersect the axis-aligned rectangle `[min, max]` on the plane,
    /// clipped to the world.
    pub(crate) fn cells_in_rect(&self, min: [f32; 2], max: [f32; 2]) -> Vec<Cell> {
        let c = &self.config;
        let range = |lo: f32, hi: f32, origin: f32, n: u32| -> Option<(u32, u32)> {
            if !(lo.is_finite() && hi.is_finite()) || hi < lo {
                return None;
            }
            let first = ((lo - origin) / c.cell_size).floor().max(0.0);
            let last = ((hi - origin) / c.cell_size).floor().min(n as f32 - 1.0);
            (first <= last).then_some((first as u32, last as u32))
        };
        let (Some((x0, x1)), Some((z0, z1))) =
            (range(min[0], max[0], c.origin[0], c.cells[0]), range(min[1], max[1], c.origin[1], c.cells[1]))
        else {
            return Vec::new();
        };
        (z0..=z1).flat_map(|r| (x0..=x1).map(move |col| [col, r])).collect()
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// The report's world: 15x15 cells of 20 m, 3x3 servers of 5x5 cells.
    pub(crate) fn report() -> Layout {
        Layout::new(LayoutConfig {
            origin: [-150.0, -150.0],
            cell_size: 20.0,
            cells: [15, 15],
            servers: [3, 3],
            server_interest_border: 0,
        })
        .unwrap()
    }

    #[test]
    fn the_report_layout_from_toml() {
        let config: LayoutConfig =
            toml::from_str("origin = [-150.0, -150.0]\ncell_size = 20.0\ncells = [15, 15]\nservers = [3, 3]")
                .unwrap();
        assert_eq!(Layout::new(config).unwrap(), report());
        let l = report();
        assert_eq!(l.cell_count(), 225);
        assert_eq!(l.servers().count(), 9);
        assert_eq!(l.cells_of([1, 2]).count(), 25);
        assert!(l.cells_of([1, 2]).all(|c| l.server_of(c) == [1, 2]));
        assert_eq!(l.cell_of([-150.0, 0.0, -150.0]), Some([0, 0]));
        assert_eq!(l.cell_of([-130.0, 5.0, -150.0]), Some([1, 0]), "an upper edge belongs to the next cell");
        assert_eq!(l.cell_of([149.9, 0.0, 149.9]), Some([14, 14]));
        assert_eq!(l.cell_of([150.0, 0.0, 0.0]), None, "the world's upper edge is outside");
        assert_eq!(l.cell_of([f32::NAN, 0.0, 0.0]), None);
        assert_eq!(l.bounds([1, 0]), ([-130.0, -150.0], [-110.0, -130.0]));
    }

    #[test]
    fn bad_layouts_are_refused_with_their_reason() {
        let ok = report().config().clone();
        let with = |f: fn(&mut LayoutConfig)| {
            let mut c = ok.clone();
            f(&mut c);
            Layout::new(c).unwrap_err()
        };
        assert_eq!(with(|c| c.cell_size = 0.0), LayoutError::CellSize(0.0));
        assert!(matches!(with(|c| c.cell_size = f32::INFINITY), LayoutError::CellSize(_)));
        assert!(matches!(with(|c| c.origin = [f32::NAN, 0.0]), LayoutError::Origin(_)));
        assert_eq!(with(|c| c.cells = [0, 15]), LayoutError::NoCells([0, 15]));
        assert_eq!(with(|c| c.servers = [2, 3]), LayoutError::Uneven { cells: [15, 15], servers: [2, 3] });
        assert_eq!(with(|c| c.servers = [3, 0]), LayoutError::NoServers([3, 0]));
        assert!(matches!(with(|c| c.cells = [1000, 1000]), LayoutError::TooManyCells { .. }));
        let message = with(|c| c.servers = [2, 3]).to_string();
        assert!(message.contains("spatial.servers"), "{message}");
    }

    #[test]
    fn moves_are_stays_cell_changes_or_handovers() {
        let l = report();
        let at = |x: f32, z: f32| [x, 0.0, z];
        assert_eq!(l.classify(at(-145.0, -145.0), at(-141.0, -145.0)), Move::Stay);
        assert_eq!(
            l.classify(at(-145.0, -145.0), at(-125.0, -145.0)),
            Move::CellChange { from: [0, 0], to: [1, 0] }
        );
        // Cell 4 is server 0's last column, cell 5 server 1's first.
        assert_eq!(
            l.classify(at(-65.0, -145.0), at(-45.0, -145.0)),
            Move::Handover { from: [4, 0], to: [5, 0], from_server: [0, 0], to_server: [1, 0] }
        );
        assert_eq!(l.classify(at(145.0, 0.0), at(151.0, 0.0)), Move::Left { from: [14, 7] });
        assert_eq!(l.classify(at(151.0, 0.0), at(145.0, 0.0)), Move::Entered { to: [14, 7] });
        assert_eq!(l.classify(at(500.0, 0.0), at(501.0, 0.0)), Move::Outside);
    }

    #[test]
    fn a_border_adds_the_cells_around_a_block() {
        let mut config = report().config().clone();
        config.server_interest_border = 1;
        let l = Layout::new(config).unwrap();
        assert_eq!(l.cells_received_by([0, 0]).len(), 36, "5x5 plus one row and column inside the world");
        assert_eq!(l.cells_received_by([1, 1]).len(), 49, "7x7 in the middle");
        assert_eq!(report().cells_received_by([1, 1]).len(), 25);
    }
}
