//! The live web view (`--web ADDR`): one page that draws the world top-down, with the spatial
//! cells and the server that owns each, and charts the live figures. The page is a client like
//! any other: it connects to the gateway's WebSocket listener with the TypeScript SDK and
//! subscribes. This server only hands it its assets and two small JSON documents:
//!
//! - `/view.json`: what the page cannot learn from the gateway (the WebSocket port, the world's
//!   bounds, obstacles and spatial layout), fixed for the run;
//! - `/figures.json`: the latest figures of the process serving the page (the demo's last
//!   second), replaced as they change.
//!
//! The assets are built from `sdk/ts/view/` by `npm run view` and committed in `assets/`;
//! `sdk/ts`'s tests fail when they differ from a fresh build. `rust-embed` puts them in the
//! binary: the page needs no network and no files beside the binary.

pub mod bounded;

use std::net::SocketAddr;

use axum::extract::Path;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde::Serialize;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

#[derive(rust_embed::Embed)]
#[folder = "assets/"]
struct Assets;

/// What the page is told at load (`/view.json`).
#[derive(Debug, Clone, Serialize)]
pub struct Page {
    /// The gateway's WebSocket port; the page connects to it on the host it was loaded from.
    pub ws_port: u16,
    /// The WebSocket listener speaks TLS (`wss://`).
    pub ws_tls: bool,
    /// `spatial`: the page watches every cell of the spatial world; anything else: it
    /// subscribes to a global channel (`world`, or the first) and draws its characters.
    pub scenario: String,
    /// The page's heading, after "tickwire" (e.g. `demo · single`).
    pub title: String,
    pub world: World,
}

/// The world's floor on the `x`/`z` plane, in metres.
#[derive(Debug, Clone, Serialize)]
pub struct World {
    /// The floor's corners; unknown (a gateway serving some game): the page fits the map to
    /// the characters it sees.
    pub min: Option<[f32; 2]>,
    pub max: Option<[f32; 2]>,
    /// Obstacles' footprints: `[min_x, min_z, max_x, max_z]`.
    pub obstacles: Vec<[f32; 4]>,
    /// The spatial layout (`spatial` only): the page colours each cell by its server.
    pub layout: Option<Layout>,
}

/// docs/protocol.md §14's grid: `cells` and `servers` are `[along x, along z]`.
#[derive(Debug, Clone, Serialize)]
pub struct Layout {
    pub origin: [f32; 2],
    pub cell_size: f32,
    pub cells: [u32; 2],
    pub servers: [u32; 2],
}

impl From<&tickwire_spatial::LayoutConfig> for Layout {
    fn from(l: &tickwire_spatial::LayoutConfig) -> Layout {
        Layout { origin: l.origin, cell_size: l.cell_size, cells: l.cells, servers: l.servers }
    }
}

impl World {
    /// A spatial world: the floor is the grid.
    pub fn spatial(layout: &tickwire_spatial::LayoutConfig, obstacles: Vec<[f32; 4]>) -> World {
        let max = [
            layout.origin[0] + layout.cell_size * layout.cells[0] as f32,
            layout.origin[1] + layout.cell_size * layout.cells[1] as f32,
        ];
        World { min: Some(layout.origin), max: Some(max), obstacles, layout: Some(layout.into()) }
    }
}

/// The web view's server, bound and ready; `run` serves until `cancel`.
pub struct WebView {
    listener: TcpListener,
    page: Page,
    figures: watch::Receiver<serde_json::Value>,
}

impl WebView {
    /// Binds `addr`. `figures` is what `/figures.json` answers (any JSON object; the page shows
    /// the fields it knows).
    pub async fn bind(
        addr: SocketAddr,
        page: Page,
        figures: watch::Receiver<serde_json::Value>,
    ) -> std::io::Result<WebView> {
        let listener = TcpListener::bind(addr).await?;
        Ok(WebView { listener, page, figures })
    }

    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Serves until `cancel` is cancelled.
    pub async fn run(self, cancel: CancellationToken) {
        let page = serde_json::to_vec(&self.page).expect("a Page serializes");
        let figures = self.figures;
        let app = axum::Router::new()
            .route("/", get(|| async { asset("index.html") }))
            .route("/view.json", get(move || async move { json(page.clone()) }))
            .route(
                "/figures.json",
                get(move || {
                    let now = serde_json::to_vec(&*figures.borrow()).expect("JSON values serialize");
                    async move { json(now) }
                }),
            )
            .route("/{file}", get(|Path(file): Path<String>| async move { asset(&file) }));
        if let Err(e) = axum::serve(bounded::BoundedListener::new(self.listener), app)
            .with_graceful_shutdown(cancel.cancelled_owned())
            .await
        {
            tracing::warn!(error = %e, "the web view stopped");
        }
    }
}

fn json(body: Vec<u8>) -> Response {
    ([(header::CONTENT_TYPE, "application/json"), (header::CACHE_CONTROL, "no-store")], body).into_response()
}

fn asset(name: &str) -> Response {
    match Assets::get(name) {
        Some(file) => {
            let mime = file.metadata.mimetype().to_owned();
            ([(header::CONTENT_TYPE, mime)], file.data.into_owned()).into_response()
        }
        None => (StatusCode::NOT_FOUND, format!("no such file: {name}\n")).into_response(),
    }
}
