//! `tickwire gateway --web ADDR`: the live web view (crates/web) beside a gateway that serves
//! some game. The page learns the world from the gateway like any client; what it cannot learn
//! there (the WebSocket port, the spatial layout) it is told here, and its figures panel shows
//! the gateway's own counts, sampled once a second.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context;
use serde_json::json;
use tickwire_gateway::RunningGateway;
use tickwire_spatial::LayoutConfig;
use tickwire_web::{Page, WebView, World};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// Binds the web view on `addr` and serves it until `cancel`; prints its address.
pub async fn start(
    addr: &str,
    gateway: &RunningGateway,
    spatial: Option<&LayoutConfig>,
    cancel: CancellationToken,
) -> anyhow::Result<JoinHandle<()>> {
    let addr: SocketAddr =
        addr.parse().with_context(|| format!("--web {addr}: not an address like 127.0.0.1:7480"))?;
    let ws = gateway.ws_addrs().first().context("--web needs a WebSocket listener (--ws ADDR)")?;
    let world = match spatial {
        Some(layout) => World::spatial(layout, Vec::new()),
        None => World { min: None, max: None, obstacles: Vec::new(), layout: None },
    };
    let page = Page {
        ws_port: ws.port(),
        ws_tls: gateway.tls_enabled(),
        scenario: if spatial.is_some() { "spatial" } else { "channel" }.into(),
        title: "gateway".into(),
        world,
    };
    let (figures, seen) = watch::channel(json!({}));
    let view =
        WebView::bind(addr, page, seen).await.with_context(|| format!("binding the web view on {addr}"))?;
    crate::announce(&format!("live view at http://{}/", view.local_addr()?));

    let stats = gateway.stats();
    let sampling = cancel.clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last = stats.snapshot().bytes_out;
        loop {
            tokio::select! {
                () = sampling.cancelled() => return,
                _ = tick.tick() => {}
            }
            let now = stats.snapshot();
            // Every session counts: this gateway cannot tell game servers from players.
            figures.send_replace(json!({
                "clients": now.sessions_open,
                "bytes_per_s": now.bytes_out.saturating_sub(last),
            }));
            last = now.bytes_out;
        }
    });
    Ok(tokio::spawn(view.run(cancel)))
}
