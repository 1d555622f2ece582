//! Areas of interest over real sockets, against a brute-force filter of the layout.

use super::*;

fn layout() -> tickwire_spatial::Layout {
    tickwire_spatial::Layout::new(tickwire_spatial::LayoutConfig {
        origin: [0.0, 0.0],
        cell_size: 10.0,
        cells: [4, 4],
        servers: [2, 2],
        server_interest_border: 0,
    })
    .unwrap()
}

fn random_area(rng: &mut SmallRng) -> (tickwire_spatial::Area, set_interest::Area) {
    let p = [rng.random_range(-5.0..45.0), rng.random_range(-5.0..5.0), rng.random_range(-5.0..45.0)];
    let size: f32 = rng.random_range(0.5..25.0);
    match rng.random_range(0..3) {
        0 => (
            tickwire_spatial::Area::Sphere { center: p, radius: size },
            set_interest::Area::Sphere(Sphere { center: v3(p), radius: size }),
        ),
        1 => {
            let max = [p[0] + size, p[1] + size, p[2] + size * 0.5];
            (
                tickwire_spatial::Area::Box { min: p, max },
                set_interest::Area::Box(AreaBox { min: v3(p), max: v3(max) }),
            )
        }
        _ => {
            let a: f32 = rng.random_range(0.0..std::f32::consts::TAU);
            let direction = [a.cos(), 0.0, a.sin()];
            let half_angle = rng.random_range(0.1..3.1);
            (
                tickwire_spatial::Area::Cone { apex: p, direction, half_angle, range: size },
                set_interest::Area::Cone(tickwire_wire::proto::Cone {
                    apex: v3(p),
                    direction: v3(direction),
                    half_angle,
                    range: size,
                }),
            )
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_area_shows_exactly_the_entities_of_the_cells_it_touches_and_no_area_none() {
    shows_exactly_the_entities_in_the_area(&start().await).await;
}

/// The same with the sessions on I/O threads, as the binary runs them, and
/// `channels.spatial_delivery = "io_threads"`: the world's passes go through the mailboxes to a
/// delivery on each thread, not to the world's own one (`crates/gateway/src/spatial/delivery.rs`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_area_shows_the_same_when_passes_are_delivered_on_the_io_threads() {
    let gw = start_on_io_threads(&["channels.spatial_delivery=\"io_threads\""]).await;
    shows_exactly_the_entities_in_the_area(&gw).await;
    // Only a delivery on an I/O thread records its runs' CPU time.
    let metrics = common::scrape(gw.metrics_addr().expect("metrics on")).await;
    let runs = common::metric(&metrics, "spatial_delivery_cpu_seconds_count");
    assert!(runs.is_some_and(|n| n > 0.0), "no pass was delivered on an I/O thread: {runs:?}");
}

async fn shows_exactly_the_entities_in_the_area(gw: &RunningGateway) {
    let mut servers = Vec::new();
    for slot in 0..4 {
        servers.push(server(gw, &format!("s{slot}"), Some(slot)).await);
    }
    let layout = layout();
    let mut rng = SmallRng::seed_from_u64(12);
    // Entity id → its position.
    let mut placed: BTreeMap<u64, [f32; 3]> = BTreeMap::new();
    for _ in 0..80 {
        let p = [rng.random_range(0.0..40.0), 0.0, rng.random_range(0.0..40.0)];
        let spawn = SpawnEntity {
            position: v3(p),
            value_json: format!(r#"{{"pos":[{},0,{}]}}"#, p[0], p[2]),
            ..SpawnEntity::default()
        };
        placed.insert(servers[slot_of(p) as usize].spatial_spawn(spawn).await.unwrap().entity_id, p);
    }
    let viewer = client(gw, "viewer").await;
    let mut view: Option<View> = None;
    for round in 0..30 {
        let (area, wire) = random_area(&mut rng);
        let req = SetInterest { area: Some(wire), follow: Follow::Off as i32, ..Default::default() };
        let result = viewer.spatial_interest(req).await.unwrap();
        let view = view.get_or_insert_with(|| View::new(&result.cell_schema_json));
        let cells: BTreeSet<[u32; 2]> = area.cells(&layout).into_iter().collect();
        let got: BTreeSet<[u32; 2]> = result.cells.iter().map(|c| [c.column, c.row]).collect();
        assert_eq!(got, cells, "round {round}: the cells of {area:?}");
        // Brute force: every entity whose cell the area touches, and nothing else.
        let expected: BTreeSet<u64> = placed
            .iter()
            .filter(|(_, p)| layout.cell_of(**p).is_some_and(|c| cells.contains(&c)))
            .map(|(&id, _)| id)
            .collect();
        for (id, p) in &placed {
            if area.contains(*p) {
                assert!(expected.contains(id), "round {round}: entity {id} at {p:?} is inside {area:?}");
            }
        }
        let ids: BTreeSet<u64> = result.cells.iter().map(|c| c.channel_id).collect();
        view.until(&viewer, &format!("round {round} shows {} entities", expected.len()), |v, _| {
            v.cells.keys().copied().collect::<BTreeSet<_>>() == ids
                && v.entities().keys().copied().collect::<BTreeSet<_>>() == expected
        })
        .await;
        for (id, p) in view.entities() {
            let q = placed[&id];
            assert!(
                (p[0] - f64::from(q[0])).abs() < 1e-3 && (p[2] - f64::from(q[2])).abs() < 1e-3,
                "{id}: {p:?} {q:?}"
            );
        }
    }
    // The whole world, then no area: every cell leaves the view, and the client is told
    // (UNSUBSCRIBED per cell).
    let view = view.as_mut().expect("a view after 30 rounds");
    let all = AreaBox { min: v3([0.0, 0.0, 0.0]), max: v3([40.0, 0.0, 40.0]) };
    let req = SetInterest {
        area: Some(set_interest::Area::Box(all)),
        follow: Follow::Off as i32,
        ..Default::default()
    };
    assert_eq!(viewer.spatial_interest(req).await.unwrap().cells.len(), 16);
    view.until(&viewer, "all 16 cells in view", |v, _| v.cells.len() == 16).await;
    let none = SetInterest { area: None, follow: Follow::Off as i32, ..Default::default() };
    assert!(viewer.spatial_interest(none).await.unwrap().cells.is_empty());
    view.until(&viewer, "every cell to leave the view", |v, _| v.cells.is_empty()).await;
}

/// An area may touch at most the outbox's messages less 16 in cells, or half of them if that is
/// more (here 8 of 16): leaving all of
/// them at once queues one UNSUBSCRIBED event per cell, which must not close the session as a
/// slow consumer. One more is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leaving_the_largest_area_at_once_keeps_the_session() {
    let mut overrides = LAYOUT.to_vec();
    overrides.push("limits.outbox_capacity=16");
    let gw = common::start(&overrides).await;
    let viewer = client(&gw, "viewer").await;
    let area = |max_x: f32, max_z: f32| SetInterest {
        area: Some(set_interest::Area::Box(AreaBox {
            min: v3([0.0, -1.0, 0.0]),
            max: v3([max_x, 1.0, max_z]),
        })),
        ..SetInterest::default()
    };
    // 4 columns of 3 rows: 12 cells.
    assert_eq!(status(viewer.spatial_interest(area(35.0, 25.0)).await), Status::ResourceExhausted);
    // 4 columns of 2 rows: 8 cells.
    assert_eq!(viewer.spatial_interest(area(35.0, 15.0)).await.unwrap().cells.len(), 8);
    // Once the client holds them (a cell it never got leaves without an event).
    let first = ChannelUpdates::decode(common::channels::next(&viewer, "channel.updates").await).unwrap();
    assert_eq!(first.updates.len(), 8);
    viewer.spatial_interest(SetInterest::default()).await.unwrap();
    let mut left = BTreeSet::new();
    while left.len() < 8 {
        let e = ChannelEvent::decode(common::channels::next(&viewer, "channel.event").await).unwrap();
        assert_eq!(e.kind(), ChannelEventKind::Unsubscribed);
        left.insert(e.channel_id);
    }
    // Still connected and served.
    assert_eq!(viewer.spatial_interest(area(15.0, 15.0)).await.unwrap().cells.len(), 4);
}

/// An area is judged by the most cells it can span anywhere, before any cell is built: a huge
/// sphere is refused at once even where it would touch few cells (off the world's edge, or
/// following an entity that is not there yet), so that neither its cost nor a later move of a
/// followed area depends on where it is now.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_area_that_could_span_too_many_cells_is_refused_wherever_it_is() {
    let mut overrides = LAYOUT.to_vec();
    // A view of at most 2 cells (half of an outbox of 4).
    overrides.push("limits.outbox_capacity=4");
    let gw = common::start(&overrides).await;
    let viewer = client(&gw, "viewer").await;
    let sphere = |x: f32, radius: f32, follow: Follow| SetInterest {
        area: Some(set_interest::Area::Sphere(Sphere { center: v3([x, 0.0, 5.0]), radius })),
        follow: follow as i32,
        ..SetInterest::default()
    };
    // Far off the world, touching no cell, and following nothing yet: still refused.
    match viewer.spatial_interest(sphere(-5000.0, 100.0, Follow::Always)).await {
        Err(tickwire_client::ClientError::Status { status, message, .. }) => {
            assert_eq!(status, Status::ResourceExhausted);
            assert!(message.contains("spans up to 16 cells"), "{message}");
        }
        other => panic!("expected RESOURCE_EXHAUSTED, got {other:?}"),
    }
    // A small one is taken.
    assert_eq!(viewer.spatial_interest(sphere(5.0, 1.0, Follow::Off)).await.unwrap().cells.len(), 1);
}
