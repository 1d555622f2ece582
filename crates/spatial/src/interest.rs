//! Areas of interest: what part of the world a client wants to see. The gateway subscribes a
//! client to the cells its area touches ([`Area::cells`]: never missing one, so no entity
//! inside the area can be missed) and a client's view holds the entities inside it
//! ([`Area::contains`], exact). Areas come from clients, so [`Area::check`] refuses anything
//! that is not finite, positive and bounded before it is used.

use crate::layout::{Cell, Layout};

/// A region of 3D space. Cells are columns (the grid ignores height), so on the grid an area
/// counts by its footprint on the `x`/`z` plane.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Area {
    Sphere {
        center: [f32; 3],
        radius: f32,
    },
    /// Axis-aligned, between two corners.
    Box {
        min: [f32; 3],
        max: [f32; 3],
    },
    /// Points within `range` of `apex` and within `half_angle` (radians) of `direction`.
    Cone {
        apex: [f32; 3],
        direction: [f32; 3],
        half_angle: f32,
        range: f32,
    },
}

/// Why an area is refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum AreaError {
    #[error("an area's coordinates must be finite")]
    NotFinite,
    #[error("an area's size must be between 0 and {max}, got {got}")]
    Size { got: f32, max: f32 },
    #[error("a box's min must not exceed its max on any axis")]
    InvertedBox,
    #[error("a cone needs a non-zero direction")]
    NoDirection,
    #[error("a cone's half angle must be in (0, pi], got {0}")]
    Angle(f32),
}

/// The largest radius, range or box side accepted (in world units).
pub const MAX_EXTENT: f32 = 100_000.0;

fn sub(a: [f32; 3], b: [f32; 3]) -> [f32; 3] {
    [a[0] - b[0], a[1] - b[1], a[2] - b[2]]
}

fn dot(a: [f32; 3], b: [f32; 3]) -> f32 {
    a[0] * b[0] + a[1] * b[1] + a[2] * b[2]
}

fn size(got: f32) -> Result<(), AreaError> {
    if (0.0..=MAX_EXTENT).contains(&got) { Ok(()) } else { Err(AreaError::Size { got, max: MAX_EXTENT }) }
}

impl Area {
    /// Refuses what cannot be used: non-finite numbers, negative or huge sizes, an inverted
    /// box, a cone without a direction or with an angle outside (0, pi].
    pub fn check(&self) -> Result<(), AreaError> {
        let finite = |v: &[f32]| v.iter().all(|x| x.is_finite());
        match *self {
            Area::Sphere { center, radius } => {
                if !finite(&center) || !radius.is_finite() {
                    return Err(AreaError::NotFinite);
                }
                size(radius)
            }
            Area::Box { min, max } => {
                if !finite(&min) || !finite(&max) {
                    return Err(AreaError::NotFinite);
                }
                if (0..3).any(|i| min[i] > max[i]) {
                    return Err(AreaError::InvertedBox);
                }
                (0..3).try_for_each(|i| size(max[i] - min[i]))
            }
            Area::Cone { apex, direction, half_angle, range } => {
                if !finite(&apex) || !finite(&direction) || !half_angle.is_finite() || !range.is_finite() {
                    return Err(AreaError::NotFinite);
                }
                if dot(direction, direction) == 0.0 {
                    return Err(AreaError::NoDirection);
                }
                if !(half_angle > 0.0 && half_angle <= std::f32::consts::PI) {
                    return Err(AreaError::Angle(half_angle));
                }
                size(range)
            }
        }
    }

    /// Whether a point is inside (boundaries included).
    pub fn contains(&self, p: [f32; 3]) -> bool {
        match *self {
            Area::Sphere { center, radius } => {
                let d = sub(p, center);
                dot(d, d) <= radius * radius
            }
            Area::Box { min, max } => (0..3).all(|i| min[i] <= p[i] && p[i] <= max[i]),
            Area::Cone { apex, direction, half_angle, range } => {
                let v = sub(p, apex);
                let len2 = dot(v, v);
                if len2 > range * range {
                    return false;
                }
                if len2 == 0.0 {
                    return true;
                }
                let cos = dot(v, direction) / (len2.sqrt() * dot(direction, direction).sqrt());
                cos >= half_angle.cos()
            }
        }
    }

    /// The area's reference point: a sphere's centre, a box's centre, a cone's apex. What
    /// [`Area::centred_at`] moves, and what level-of-detail distances count from.
    pub fn reference_point(&self) -> [f32; 3] {
        match *self {
            Area::Sphere { center, .. } => center,
            Area::Box { min, max } => std::array::from_fn(|i| min[i] + (max[i] - min[i]) / 2.0),
            Area::Cone { apex, .. } => apex,
        }
    }

    /// The same area moved so that its reference point (a sphere's centre, a box's centre, a
    /// cone's apex) is at `p`: how an area follows its client's entity.
    pub fn centred_at(&self, p: [f32; 3]) -> Area {
        match *self {
            Area::Sphere { radius, .. } => Area::Sphere { center: p, radius },
            Area::Box { min, max } => {
                let half = [(max[0] - min[0]) / 2.0, (max[1] - min[1]) / 2.0, (max[2] - min[2]) / 2.0];
                Area::Box {
                    min: [p[0] - half[0], p[1] - half[1], p[2] - half[2]],
                    max: [p[0] + half[0], p[1] + half[1], p[2] + half[2]],
                }
            }
            Area::Cone { direction, half_angle, range, .. } => {
                Area::Cone { apex: p, direction, half_angle, range }
            }
        }
    }

    /// The most cells the area's footprint can touch wherever it is placed in `layout`: per
    /// axis, the cells its extent spans (at most the world's), multiplied. Computed without
    /// building the cells, so that a huge area is judged (and refused) in constant time, and an
    /// area that follows its entity is judged once for every place it may go.
    pub fn most_cells(&self, layout: &Layout) -> u64 {
        let c = layout.config();
        let (w, d) = match *self {
            Area::Box { min, max } => (max[0] - min[0], max[2] - min[2]),
            Area::Sphere { radius, .. } | Area::Cone { range: radius, .. } => (2.0 * radius, 2.0 * radius),
        };
        let span = |extent: f32, n: u32| -> u64 {
            let cells = (f64::from(extent.max(0.0)) / f64::from(c.cell_size)).ceil() + 1.0;
            (cells.min(f64::from(n))) as u64
        };
        span(w, c.cells[0]) * span(d, c.cells[1])
    }

    /// The cells the area's footprint touches: for a sphere and a box exactly those; for a
    /// cone, those within its range of the apex (a superset: it may include cells behind the
    /// apex, never miss one the cone reaches).
    pub fn cells(&self, layout: &Layout) -> Vec<Cell> {
        match *self {
            Area::Box { min, max } => layout.cells_in_rect([min[0], min[2]], [max[0], max[2]]),
            Area::Sphere { center, radius } | Area::Cone { apex: center, range: radius, .. } => {
                let c = [center[0], center[2]];
                let candidates =
                    layout.cells_in_rect([c[0] - radius, c[1] - radius], [c[0] + radius, c[1] + radius]);
                let reached = |&cell: &Cell| layout.squared_distance_to(cell, center) <= radius * radius;
                candidates.into_iter().filter(reached).collect()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::tests::report as layout;

    /// `most_cells` bounds the cells an area touches wherever it is, without building them.
    #[test]
    fn most_cells_bounds_the_cells_an_area_touches_anywhere() {
        let world = layout();
        let sphere = |x: f32, z: f32, radius: f32| Area::Sphere { center: [x, 0.0, z], radius };
        // A 30 m sphere over 20 m cells spans at most 4 x 4.
        assert_eq!(sphere(150.0, 150.0, 30.0).most_cells(&world), 16);
        for (x, z) in [(150.0, 150.0), (10.0, 10.0), (119.0, 201.0), (299.0, 0.5)] {
            let a = sphere(x, z, 30.0);
            assert!(a.cells(&world).len() as u64 <= a.most_cells(&world), "at ({x}, {z})");
        }
        // Past the world's size it is the world's, whatever the radius.
        assert_eq!(sphere(0.0, 0.0, 1e5).most_cells(&world), 225);
        let b = Area::Box { min: [0.0, 0.0, 0.0], max: [39.0, 1.0, 19.0] };
        assert_eq!(b.most_cells(&world), 3 * 2);
    }

    #[test]
    fn an_area_centred_elsewhere_keeps_its_shape() {
        let b = Area::Box { min: [0.0, 0.0, 0.0], max: [4.0, 2.0, 6.0] };
        assert_eq!(
            b.centred_at([10.0, 1.0, 10.0]),
            Area::Box { min: [8.0, 0.0, 7.0], max: [12.0, 2.0, 13.0] }
        );
        let s = Area::Sphere { center: [0.0; 3], radius: 30.0 };
        assert_eq!(s.centred_at([1.0, 2.0, 3.0]), Area::Sphere { center: [1.0, 2.0, 3.0], radius: 30.0 });
        let c = Area::Cone { apex: [0.0; 3], direction: [1.0, 0.0, 0.0], half_angle: 0.5, range: 9.0 };
        assert!(matches!(
            c.centred_at([5.0, 0.0, 0.0]),
            Area::Cone { apex: [5.0, 0.0, 0.0], range: 9.0, .. }
        ));
    }

    #[test]
    fn the_reports_30_m_sphere() {
        let l = layout();
        // Centred in cell [7, 7] (which spans -10..10 on both axes). Cells are half-open:
        // x = 30 belongs to column 9 (reached), x = -30 to column 6, so column 5 holds no
        // point of the sphere.
        let area = Area::Sphere { center: [0.0, 0.0, 0.0], radius: 30.0 };
        let cells = area.cells(&l);
        assert!(cells.contains(&[7, 7]) && cells.contains(&[9, 7]) && !cells.contains(&[5, 7]));
        assert!(cells.contains(&[6, 6]) && !cells.contains(&[9, 6]), "(30, -10) is 31.6 m away");
        assert!(!cells.contains(&[9, 9]), "the far corner is 42 m away");
        // Rows 7 (columns 6-9), 6 and 8 (columns 6-8), 9 (column 7).
        assert_eq!(cells.len(), 4 + 3 + 3 + 1);
    }

    #[test]
    fn bad_areas_are_refused() {
        let bad = [
            Area::Sphere { center: [f32::NAN, 0.0, 0.0], radius: 1.0 },
            Area::Sphere { center: [0.0; 3], radius: -1.0 },
            Area::Sphere { center: [0.0; 3], radius: 1e9 },
            Area::Box { min: [1.0, 0.0, 0.0], max: [0.0, 1.0, 1.0] },
            Area::Cone { apex: [0.0; 3], direction: [0.0; 3], half_angle: 0.5, range: 10.0 },
            Area::Cone { apex: [0.0; 3], direction: [1.0, 0.0, 0.0], half_angle: 0.0, range: 10.0 },
            Area::Cone { apex: [0.0; 3], direction: [1.0, 0.0, 0.0], half_angle: 4.0, range: 10.0 },
        ];
        for area in bad {
            assert!(area.check().is_err(), "{area:?}");
        }
        assert_eq!(Area::Sphere { center: [0.0; 3], radius: 30.0 }.check(), Ok(()));
    }
}
