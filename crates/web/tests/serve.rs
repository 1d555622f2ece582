//! The web view's server over HTTP: the page and its script are embedded and served with their
//! types, `/view.json` says what it was given, `/figures.json` follows what is sent, and an
//! unknown path is a 404.

use std::time::Duration;

use tickwire_web::{Layout, Page, WebView, World};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

fn page() -> Page {
    Page {
        ws_port: 7401,
        ws_tls: false,
        scenario: "spatial".into(),
        title: "demo · spatial".into(),
        world: World {
            min: Some([-150.0, -150.0]),
            max: Some([150.0, 150.0]),
            obstacles: vec![[1.0, 2.0, 3.0, 4.0]],
            layout: Some(Layout {
                origin: [-150.0, -150.0],
                cell_size: 20.0,
                cells: [15, 15],
                servers: [3, 3],
            }),
        },
    }
}

/// GET `url`: status, content type and body (an HTTP error status is an answer, not a failure).
fn get(url: &str) -> (u16, String, String) {
    let agent = ureq::AgentBuilder::new().timeout(Duration::from_secs(10)).build();
    let response = match agent.get(url).call() {
        Ok(r) => r,
        Err(ureq::Error::Status(_, r)) => r,
        Err(e) => panic!("GET {url}: {e}"),
    };
    let (status, kind) = (response.status(), response.content_type().to_owned());
    (status, kind, response.into_string().expect("a text body"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serves_the_page_its_assets_and_the_live_figures() {
    let (figures, seen) = watch::channel(serde_json::json!({}));
    let view = WebView::bind("127.0.0.1:0".parse().unwrap(), page(), seen).await.expect("bind");
    let base = format!("http://{}", view.local_addr().unwrap());
    let cancel = CancellationToken::new();
    let server = tokio::spawn(view.run(cancel.clone()));

    let b = base.clone();
    let checks = tokio::task::spawn_blocking(move || {
        let (status, kind, body) = get(&format!("{b}/"));
        assert_eq!((status, kind.as_str()), (200, "text/html"));
        assert!(body.contains(r#"src="view.js""#), "the page loads its script: {body}");

        let (status, kind, body) = get(&format!("{b}/view.js"));
        assert_eq!((status, kind.as_str()), (200, "text/javascript"));
        assert!(
            body.len() > 10_000 && body.contains("view.json"),
            "the bundled script ({} bytes)",
            body.len()
        );
        for css in ["style.css", "uPlot.min.css"] {
            assert_eq!(get(&format!("{b}/{css}")).1, "text/css", "{css}");
        }

        let (status, kind, body) = get(&format!("{b}/view.json"));
        assert_eq!((status, kind.as_str()), (200, "application/json"));
        let told: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(told["ws_port"], 7401);
        assert_eq!(told["scenario"], "spatial");
        assert_eq!(told["ws_tls"], false);
        assert_eq!(told["world"]["min"], serde_json::json!([-150.0, -150.0]));
        assert_eq!(told["world"]["layout"]["cells"], serde_json::json!([15, 15]));
        assert_eq!(told["world"]["obstacles"], serde_json::json!([[1.0, 2.0, 3.0, 4.0]]));

        assert_eq!(get(&format!("{b}/figures.json")).2, "{}");
        let (status, _, body) = get(&format!("{b}/no-such-file.js"));
        assert_eq!(status, 404);
        assert!(body.contains("no-such-file.js"), "{body}");
        // Only the embedded files: nothing beside them on disk.
        assert_eq!(get(&format!("{b}/..%2FCargo.toml")).0, 404);
        assert_eq!(get(&format!("{b}/%2E%2E%2Fsrc%2Flib.rs")).0, 404);
    });
    checks.await.expect("checks");

    figures.send_replace(serde_json::json!({"clients": 200, "server_fps": 30.0}));
    let b = base.clone();
    let body = tokio::task::spawn_blocking(move || get(&format!("{b}/figures.json")).2).await.unwrap();
    let now: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(now, serde_json::json!({"clients": 200, "server_fps": 30.0}));

    cancel.cancel();
    tokio::time::timeout(Duration::from_secs(5), server).await.expect("stops when cancelled").unwrap();
}
