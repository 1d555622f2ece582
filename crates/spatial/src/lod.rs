//! Level of detail: how often a client hears of each cell in its view, by the cell's distance
//! from its area's reference point (channeld's LOD and distance damping: near things often,
//! far things seldom). A client gives *bands*, each a distance and an interval; a cell takes the
//! interval of the first band that reaches it. Distances count to the cell's nearest point, so
//! every entity in a cell is at least that far, and as intervals may not shrink from band to
//! band, a client never hears of an entity less often than the band of its distance from the
//! reference point (as the bands were last measured) asks. Bands come from clients, so
//! [`Bands::new`] refuses anything that is not finite, increasing and bounded.

use std::time::Duration;

use crate::layout::{Cell, Layout};

/// The most bands a client may give.
pub const MAX_BANDS: usize = 8;

/// The longest interval a band may ask for.
pub const MAX_INTERVAL: Duration = Duration::from_secs(60);

/// One band: cells whose nearest point is at most `within` away (and beyond every earlier band)
/// are heard of at most once per `interval`. `Duration::ZERO`: at every update the client gets.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Band {
    pub within: f32,
    pub interval: Duration,
}

/// Why bands are refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum LodError {
    #[error("at most {max} level-of-detail bands, got {got}")]
    TooMany { got: usize, max: usize },
    #[error("band {index}: its distance must be finite and at least 0, got {got}")]
    Distance { index: usize, got: f32 },
    #[error("band {index}: distances must increase from band to band ({got} after {previous})")]
    NotIncreasing { index: usize, got: f32, previous: f32 },
    #[error("band {index}: its interval must be at most {max:?}, got {got:?}")]
    Interval { index: usize, got: Duration, max: Duration },
    #[error("band {index}: intervals must not shrink from band to band ({got:?} after {previous:?})")]
    Shrinking { index: usize, got: Duration, previous: Duration },
}

/// A client's bands, checked, nearest first. Empty: no level of detail (every cell at every
/// update the client gets).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Bands(Vec<Band>);

impl Bands {
    /// `bands`, nearest first, if they make sense.
    pub fn new<I>(bands: I) -> Result<Bands, LodError>
    where
        I: IntoIterator<Item = Band>,
        I::IntoIter: ExactSizeIterator,
    {
        let bands = bands.into_iter();
        if bands.len() > MAX_BANDS {
            return Err(LodError::TooMany { got: bands.len(), max: MAX_BANDS });
        }
        let bands: Vec<Band> = bands.collect();
        for (index, band) in bands.iter().enumerate() {
            if !band.within.is_finite() || band.within < 0.0 {
                return Err(LodError::Distance { index, got: band.within });
            }
            if band.interval > MAX_INTERVAL {
                return Err(LodError::Interval { index, got: band.interval, max: MAX_INTERVAL });
            }
            let Some(before) = index.checked_sub(1).map(|i| bands[i]) else { continue };
            if band.within <= before.within {
                return Err(LodError::NotIncreasing { index, got: band.within, previous: before.within });
            }
            if band.interval < before.interval {
                let (got, previous) = (band.interval, before.interval);
                return Err(LodError::Shrinking { index, got, previous });
            }
        }
        Ok(Bands(bands))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The interval at `distance`: the first band's that reaches it; past the last band, the
    /// last band's (zero with no bands).
    pub fn interval_at(&self, distance: f32) -> Duration {
        let band = self.0.iter().find(|b| distance <= b.within).or(self.0.last());
        band.map_or(Duration::ZERO, |b| b.interval)
    }

    /// The interval of each of `cells`, by its distance from `point` (in order; empty with no
    /// bands).
    pub fn of_cells(&self, layout: &Layout, point: [f32; 3], cells: &[Cell]) -> Vec<Duration> {
        if self.is_empty() {
            return Vec::new();
        }
        cells.iter().map(|&cell| self.interval_at(layout.distance_to(cell, point))).collect()
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::layout::tests::report as layout;

    const MS: Duration = Duration::from_millis(1);

    /// The bands of BENCHMARKS.md's B3 `lod`: 0–10 m at 20 Hz, 10–50 m at 10 Hz, beyond at 1 Hz.
    fn b3() -> Bands {
        let band = |within: f32, ms: u64| Band { within, interval: MS * ms as u32 };
        Bands::new([band(10.0, 50), band(50.0, 100), band(f32::MAX, 1000)]).unwrap()
    }

    #[test]
    fn a_distance_takes_the_first_band_that_reaches_it() {
        let bands = b3();
        assert_eq!(bands.interval_at(0.0), MS * 50);
        assert_eq!(bands.interval_at(10.0), MS * 50, "a band's distance is inclusive");
        assert_eq!(bands.interval_at(10.001), MS * 100);
        assert_eq!(bands.interval_at(50.0), MS * 100);
        assert_eq!(bands.interval_at(400.0), MS * 1000);
        let near = Bands::new([Band { within: 10.0, interval: MS * 50 }]).unwrap();
        assert_eq!(near.interval_at(30.0), MS * 50, "past the last band: the last band's");
        assert_eq!(Bands::default().interval_at(30.0), Duration::ZERO);
    }

    #[test]
    fn cells_count_from_their_nearest_point() {
        // The report's layout: cell [7, 7] spans -10..10 on both axes.
        let l = layout();
        let at = [5.0, 0.0, 0.0];
        assert_eq!(l.distance_to([7, 7], at), 0.0, "inside");
        assert_eq!(l.distance_to([8, 7], at), 5.0, "its edge is at x = 10");
        assert_eq!(l.distance_to([9, 9], at), (25.0f32 * 25.0 + 30.0 * 30.0).sqrt());
        let cells = [[7, 7], [8, 7], [10, 7], [14, 7], [0, 0]];
        // 0, 5, 45 and 125 m, and the far corner.
        assert_eq!(b3().of_cells(&l, at, &cells), [MS * 50, MS * 50, MS * 100, MS * 1000, MS * 1000]);
        assert!(Bands::default().of_cells(&l, at, &cells).is_empty());
    }

    #[test]
    fn bad_bands_are_refused_with_their_reason() {
        let band = |within: f32, ms: u64| Band { within, interval: MS * ms as u32 };
        let refused = |bands: Vec<Band>| Bands::new(bands).unwrap_err();
        assert!(matches!(refused(vec![band(1.0, 10); 20]), LodError::TooMany { got: 20, max: 8 }));
        assert!(matches!(refused(vec![band(f32::NAN, 10)]), LodError::Distance { index: 0, .. }));
        assert!(matches!(refused(vec![band(f32::INFINITY, 10)]), LodError::Distance { .. }));
        assert!(matches!(refused(vec![band(5.0, 10), band(-1.0, 10)]), LodError::Distance { index: 1, .. }));
        assert_eq!(
            refused(vec![band(5.0, 10), band(5.0, 20)]),
            LodError::NotIncreasing { index: 1, got: 5.0, previous: 5.0 }
        );
        assert!(matches!(refused(vec![band(5.0, 60_001)]), LodError::Interval { index: 0, .. }));
        let message = refused(vec![band(5.0, 10), band(2.0, 20)]).to_string();
        assert!(message.contains("increase"), "{message}");
        assert!(matches!(refused(vec![band(5.0, 100), band(9.0, 50)]), LodError::Shrinking { index: 1, .. }));
        assert!(
            Bands::new(
                vec![band(1.0, 10); 8]
                    .into_iter()
                    .enumerate()
                    .map(|(i, b)| Band { within: b.within + i as f32, ..b })
            )
            .is_ok()
        );
    }

    proptest! {
        /// Against brute force: no point of a cell is nearer than its distance, and a cell's
        /// interval is never longer than the band of any point in it asks for (bands are
        /// slower further out).
        #[test]
        fn no_point_of_a_cell_is_nearer_nor_heard_of_less_often(
            px in -200.0f32..200.0, pz in -200.0f32..200.0,
            column in 0u32..15, row in 0u32..15,
            u in 0.0f32..=1.0, v in 0.0f32..=1.0,
        ) {
            let l = layout();
            let point = [px, 0.0, pz];
            let (lo, hi) = l.bounds([column, row]);
            let inside = [lo[0] + u * (hi[0] - lo[0]), lo[1] + v * (hi[1] - lo[1])];
            let to_inside = ((inside[0] - px).powi(2) + (inside[1] - pz).powi(2)).sqrt();
            let d = l.distance_to([column, row], point);
            prop_assert!(d <= to_inside + 1e-3, "{d} > {to_inside}");
            let bands = b3();
            prop_assert!(bands.interval_at(d) <= bands.interval_at(to_inside + 1e-3));
        }
    }
}
