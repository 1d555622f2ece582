//! The Prometheus endpoint serves live figures under channeld's names, and closes by reason.

mod common;

use std::time::Duration;

use tickwire_client::{Client, ConnectOptions};

fn value(text: &str, series: &str) -> f64 {
    common::metric(text, series).unwrap_or_else(|| panic!("no {series} in\n{text}"))
}

#[tokio::test]
async fn metrics_follow_the_traffic() {
    let gw = common::start(&["metrics.listen=\"127.0.0.1:0\""]).await;
    let addr = gw.metrics_addr().expect("metrics enabled");
    let before = common::scrape(addr).await;
    assert_eq!(value(&before, "connection_num"), 0.0);

    let client = Client::connect(ConnectOptions::new(common::tcp_target(&gw))).await.unwrap();
    for _ in 0..5 {
        client.call("echo", common::echo_body(10, 10)).await.unwrap();
    }
    let during = common::scrape(addr).await;
    assert_eq!(value(&during, "connection_num"), 1.0);
    assert!(value(&during, "messages_in") >= 5.0);
    assert!(value(&during, "bytes_out") > value(&before, "bytes_out"));
    // The pass-time histogram, under channeld's name, in Prometheus' layout.
    let count = value(&during, "channel_tick_duration_seconds_count");
    assert_eq!(value(&during, "channel_tick_duration_seconds_bucket{le=\"+Inf\"}"), count);
    assert!(value(&during, "channel_tick_duration_seconds_bucket{le=\"0.02\"}") <= count);
    assert!(value(&during, "channel_tick_duration_seconds_sum") >= 0.0);

    // A handshake that is not a Hello is refused and counted by reason.
    common::raw_close(gw.tcp_addrs()[0], &[0, 0, 0, 1, 0x09]).await.expect("a Close");
    client.close().await;
    // The gateway counts the client's close when its session task ends: wait for that.
    let after = common::scrape_until(addr, "the closed session is counted", |text| {
        value(text, "closes{reason=\"normal\"}") == 1.0
    })
    .await;
    assert_eq!(value(&after, "closes{reason=\"protocol_error\"}"), 1.0);
    assert_eq!(value(&after, "closes{reason=\"normal\"}"), 1.0);
    assert_eq!(value(&after, "connection_num"), 0.0);
    assert!(gw.shutdown(Duration::from_secs(5)).await);
}

#[tokio::test]
async fn metrics_are_off_unless_configured() {
    let gw = common::start(&[]).await;
    assert!(gw.metrics_addr().is_none());
}
