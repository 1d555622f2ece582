//! `tickwire demo` end to end, briefly: the game server runs at its frame rate, every bot
//! connects and rebuilds the world from the updates it receives, and it all stops by itself.

use std::time::Duration;

use tickwire_bench::sim::demo::{DemoOptions, run};
use tickwire_gateway::GatewayConfig;

#[test]
fn the_demo_runs_and_stops() {
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
    let opts = DemoOptions { bots: 8, duration: Some(Duration::from_secs(3)), config, print: false };
    let main = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let seconds = main.block_on(run(opts, &runtimes)).unwrap();
    assert!(seconds.len() >= 3, "{seconds:?}");
    let last = seconds.last().unwrap();
    assert_eq!(last.clients, 8, "{seconds:?}");
    assert_eq!(last.characters, 8, "every bot's input spawned its character: {seconds:?}");
    // Loose bounds: this is a functional check on a shared machine, not a rate measurement.
    assert!(last.server_fps > 10.0, "{seconds:?}");
    assert!(last.fanout_hz_mean > 5.0, "{seconds:?}");
    assert!(last.gateway_fanout_hz > 10.0, "{seconds:?}");
    assert!(last.bytes_per_s > 0.0, "{seconds:?}");
    assert_eq!(last.decode_errors, 0, "every update applied to every replica");
}
