//! `tickwire demo` end to end, briefly: the game server runs at its frame rate, every bot
//! connects and rebuilds the world from the updates it receives, and it all stops by itself.

use std::time::Duration;

use tickwire_bench::replication::Scenario;
use tickwire_bench::sim::demo::{DemoOptions, Second, run};
use tickwire_gateway::GatewayConfig;

fn demo(scenario: Scenario, bots: usize) -> Vec<Second> {
    let runtimes = tickwire_transport::io_threads(2, "demo-test").unwrap();
    let config = GatewayConfig::load(
        None,
        &[
            "listen.tcp=[\"127.0.0.1:0\"]".into(),
            "listen.ws=[]".into(),
            "metrics.listen=\"127.0.0.1:0\"".into(),
        ],
    )
    .unwrap();
    let opts = DemoOptions {
        scenario,
        bots,
        duration: Some(Duration::from_secs(3)),
        config,
        print: false,
        web: None,
    };
    let main = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    main.block_on(run(opts, &runtimes)).unwrap()
}

#[test]
fn the_demo_runs_and_stops() {
    let seconds = demo(Scenario::Single, 8);
    assert!(seconds.len() >= 3, "{seconds:?}");
    let last = seconds.last().unwrap();
    assert_eq!(last.clients, 8, "{seconds:?}");
    assert_eq!(last.characters, 8, "every bot's input spawned its character: {seconds:?}");
    // A functional check, not a rate measurement (rates are `tickwire bench`'s job): every bot
    // received state, and every update it received applied to its replica.
    assert!(last.min_updates > 0, "every bot received updates: {seconds:?}");
    assert_eq!(last.decode_errors, 0, "every update applied to every replica");
}

#[test]
fn the_spatial_demo_runs_and_stops() {
    let seconds = demo(Scenario::Spatial, 12);
    assert!(seconds.len() >= 3, "{seconds:?}");
    let last = seconds.last().unwrap();
    assert_eq!(last.clients, 12, "{seconds:?}");
    assert_eq!(last.characters, 12, "every bot's character was spawned by its spot's server: {seconds:?}");
    assert!(last.min_updates > 0, "every bot received the cells around it: {seconds:?}");
    assert_eq!(last.decode_errors, 0, "every cell update applied to its cell's replica");
    assert!(last.server_fps > 0.0, "every spatial server publishes: {seconds:?}");
}
