//! What a gateway's shutdown waits for besides its sessions: the tasks a router runs under the
//! tracker it is given at start (the spatial world's is one). And a start that fails after the
//! router started stops what the router started.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tickwire_gateway::{Gateway, GatewayConfig, GatewayError, Router, SessionHandle, Startup};
use tickwire_wire::proto::{Request, Response};
use tokio_util::sync::CancellationToken;

/// A router with one tracked task that outlives the gateway's stop by a while, and that keeps
/// the stop token it was given.
#[derive(Default)]
struct SlowToStop {
    stop: Mutex<Option<CancellationToken>>,
    ended: Arc<AtomicBool>,
}

impl Router for SlowToStop {
    fn on_request(&self, _session: &SessionHandle, _request: Request) -> Option<Response> {
        None
    }

    fn on_start(&self, startup: &Startup<'_>) -> std::io::Result<()> {
        let (stop, ended) = (startup.stop.clone(), self.ended.clone());
        *self.stop.lock().unwrap() = Some(stop.clone());
        startup.runtimes[0].spawn(startup.tracker.track_future(async move {
            stop.cancelled().await;
            tokio::time::sleep(Duration::from_millis(300)).await;
            ended.store(true, Ordering::SeqCst);
        }));
        Ok(())
    }
}

fn config(extra: &[String]) -> GatewayConfig {
    let mut overrides = vec!["listen.tcp=[\"127.0.0.1:0\"]".to_owned(), "listen.ws=[]".to_owned()];
    overrides.extend_from_slice(extra);
    GatewayConfig::load(None, &overrides).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_waits_for_the_tasks_a_router_runs_under_its_tracker() {
    let router = Arc::new(SlowToStop::default());
    let gw = Gateway::new(config(&[])).unwrap().with_router(router.clone()).start().await.unwrap();
    assert!(!router.ended.load(Ordering::SeqCst));
    assert!(gw.shutdown(Duration::from_secs(10)).await, "everything ended within the grace");
    assert!(router.ended.load(Ordering::SeqCst), "shutdown returned before the router's task ended");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_that_fails_after_the_router_started_stops_the_router() {
    // The metrics port is taken, and the metrics listener is bound after the router started.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let metrics = format!("metrics.listen=\"{}\"", taken.local_addr().unwrap());
    let router = Arc::new(SlowToStop::default());
    let started = Gateway::new(config(&[metrics])).unwrap().with_router(router.clone()).start().await;
    assert!(matches!(started, Err(GatewayError::Bind { .. })), "{:?}", started.err());
    let stop = router.stop.lock().unwrap().clone().expect("the router was started");
    assert!(stop.is_cancelled(), "the router was told to stop");
}
