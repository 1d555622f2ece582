//! Areas of interest against brute force: over random layouts, areas and entities, the
//! entities in the cells an area touches, filtered by `contains`, are exactly the entities
//! inside it (nothing inside is ever missed), and a sphere's or box's cells include every cell
//! a fine sampling finds its footprint in.

use proptest::prelude::*;
use tickwire_spatial::interest::Area;
use tickwire_spatial::{Layout, LayoutConfig};

fn layout() -> impl Strategy<Value = Layout> {
    (1u32..6, 1u32..6, 1u32..4, 1u32..4, 1.0f32..40.0, -100.0f32..100.0, -100.0f32..100.0).prop_map(
        |(bx, bz, sx, sz, cell_size, ox, oz)| {
            Layout::new(LayoutConfig {
                origin: [ox, oz],
                cell_size,
                cells: [bx * sx, bz * sz],
                servers: [sx, sz],
                server_interest_border: 0,
            })
            .unwrap()
        },
    )
}

fn point() -> impl Strategy<Value = [f32; 3]> {
    [-300.0f32..300.0, -50.0f32..50.0, -300.0f32..300.0]
}

fn area() -> impl Strategy<Value = Area> {
    prop_oneof![
        (point(), 0.0f32..120.0).prop_map(|(center, radius)| Area::Sphere { center, radius }),
        (point(), [0.0f32..150.0, 0.0f32..100.0, 0.0f32..150.0]).prop_map(|(min, size)| Area::Box {
            min,
            max: [min[0] + size[0], min[1] + size[1], min[2] + size[2]],
        }),
        (point(), [-1.0f32..1.0, -1.0f32..1.0, -1.0f32..1.0], 0.05f32..3.1, 0.0f32..120.0)
            .prop_filter("a direction", |(_, d, _, _)| d.iter().map(|v| v * v).sum::<f32>() > 1e-3)
            .prop_map(|(apex, direction, half_angle, range)| Area::Cone {
                apex,
                direction,
                half_angle,
                range
            }),
    ]
}

/// Whether a cell's rectangle overlaps the area's footprint, by sampling a fine grid of points
/// of the cell (brute force, for spheres and boxes). Cells are half-open: the upper edges
/// belong to the next cell and are not sampled.
fn overlaps_by_sampling(layout: &Layout, cell: [u32; 2], area: &Area) -> bool {
    let (lo, hi) = layout.bounds(cell);
    let n = 40;
    (0..n).any(|i| {
        (0..n).any(|j| {
            let x = lo[0] + (hi[0] - lo[0]) * i as f32 / n as f32;
            let z = lo[1] + (hi[1] - lo[1]) * j as f32 / n as f32;
            let y = match area {
                Area::Sphere { center, .. } => center[1],
                Area::Box { min, .. } => min[1],
                Area::Cone { apex, .. } => apex[1],
            };
            area.contains([x, y, z])
        })
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    #[test]
    fn no_entity_inside_an_area_is_missed(layout in layout(), area in area(), entities in prop::collection::vec(point(), 0..200)) {
        prop_assume!(area.check().is_ok());
        let cells: std::collections::HashSet<[u32; 2]> = area.cells(&layout).into_iter().collect();
        let brute: Vec<[f32; 3]> = entities.iter().copied().filter(|e| area.contains(*e) && layout.cell_of(*e).is_some()).collect();
        let via_cells: Vec<[f32; 3]> = entities
            .iter()
            .copied()
            .filter(|e| layout.cell_of(*e).is_some_and(|c| cells.contains(&c)) && area.contains(*e))
            .collect();
        prop_assert_eq!(via_cells, brute);
    }

    #[test]
    fn spheres_and_boxes_touch_every_cell_they_overlap(layout in layout(), area in area()) {
        prop_assume!(area.check().is_ok() && !matches!(area, Area::Cone { .. }));
        let cells: std::collections::HashSet<[u32; 2]> = area.cells(&layout).into_iter().collect();
        let [nx, nz] = layout.config().cells;
        for col in 0..nx {
            for row in 0..nz {
                let sampled = overlaps_by_sampling(&layout, [col, row], &area);
                // Sampling can miss a sliver overlap, never invent one.
                if sampled {
                    prop_assert!(cells.contains(&[col, row]), "{:?} overlaps {:?}", [col, row], area);
                }
            }
        }
        for cell in &cells {
            prop_assert!(cell[0] < nx && cell[1] < nz);
        }
    }

    #[test]
    fn every_position_in_the_world_has_one_cell_and_its_server_owns_it(layout in layout(), p in point()) {
        if let Some(cell) = layout.cell_of(p) {
            let (lo, hi) = layout.bounds(cell);
            prop_assert!(lo[0] <= p[0] && p[0] <= hi[0] && lo[1] <= p[2] && p[2] <= hi[1]);
            prop_assert!(layout.cells_of(layout.server_of(cell)).any(|c| c == cell));
        }
    }
}
