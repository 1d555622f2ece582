//! The blob endpoints over real HTTP: round trips, and every kind of bad request getting its
//! 4xx, storing nothing, and leaving the server serving.

use tickwire_ddc::IoHash;

mod common;

use common::{Server, start, status, url};

fn put(s: &Server, ns: &str, id: &str, token: &str, body: &[u8]) -> u16 {
    status(
        ureq::put(&url(s, &format!("/api/v1/blobs/{ns}/{id}")))
            .set("Authorization", &format!("Bearer {token}"))
            .send_bytes(body),
    )
}

fn get(s: &Server, ns: &str, id: &str, token: &str) -> Result<Vec<u8>, u16> {
    match ureq::get(&url(s, &format!("/api/v1/blobs/{ns}/{id}")))
        .set("Authorization", &format!("Bearer {token}"))
        .call()
    {
        Ok(resp) => {
            assert_eq!(resp.header("X-Jupiter-IoHash"), Some(id));
            let mut out = Vec::new();
            std::io::Read::read_to_end(&mut resp.into_reader(), &mut out).unwrap();
            Ok(out)
        }
        Err(ureq::Error::Status(code, _)) => Err(code),
        Err(e) => panic!("transport error: {e}"),
    }
}

#[test]
fn blobs_round_trip() {
    let s = start();
    assert_eq!(status(ureq::get(&url(&s, "/health/live")).call()), 200);
    let body: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    let id = IoHash::of(&body).to_hex();
    assert_eq!(put(&s, "ue.ddc", &id, "writer", &body), 200);
    assert_eq!(get(&s, "ue.ddc", &id, "reader").unwrap(), body);
    let head = ureq::request("HEAD", &url(&s, &format!("/api/v1/blobs/ue.ddc/{id}")))
        .set("Authorization", "Bearer reader")
        .call();
    assert_eq!(status(head), 200);

    // POST: the server computes the id.
    let posted: serde_json::Value = ureq::post(&url(&s, "/api/v1/blobs/ue.ddc"))
        .set("Authorization", "Bearer writer")
        .send_bytes(b"posted")
        .unwrap()
        .into_json()
        .unwrap();
    assert_eq!(posted["identifier"], IoHash::of(b"posted").to_hex());

    let missing = IoHash::of(b"never uploaded").to_hex();
    let exists: serde_json::Value =
        ureq::post(&url(&s, &format!("/api/v1/blobs/ue.ddc/exists?id={id}&id={missing}")))
            .set("Authorization", "Bearer reader")
            .call()
            .unwrap()
            .into_json()
            .unwrap();
    assert_eq!(exists["needs"], serde_json::json!([missing]));

    let del = ureq::delete(&url(&s, &format!("/api/v1/blobs/ue.ddc/{id}")))
        .set("Authorization", "Bearer writer")
        .call();
    assert_eq!(status(del), 200);
    assert_eq!(get(&s, "ue.ddc", &id, "reader"), Err(404));
}

#[test]
fn bad_requests_get_4xx_and_store_nothing() {
    let s = start();
    let body = b"the real bytes";
    let id = IoHash::of(body).to_hex();
    let other = IoHash::of(b"other bytes").to_hex();

    // A body that does not hash to its id.
    assert_eq!(put(&s, "ue.ddc", &other, "writer", body), 400);
    assert_eq!(get(&s, "ue.ddc", &other, "writer"), Err(404));
    assert_eq!(get(&s, "ue.ddc", &id, "writer"), Err(404));
    // A header that disagrees with the URL.
    let r = ureq::put(&url(&s, &format!("/api/v1/blobs/ue.ddc/{id}")))
        .set("Authorization", "Bearer writer")
        .set("X-Jupiter-IoHash", &other)
        .send_bytes(body);
    assert_eq!(status(r), 400);
    // Bad namespaces and ids (including path traversal attempts).
    for ns in ["a%20b", "trailing.", "a..b", ".hidden", &"x".repeat(65)] {
        assert_eq!(put(&s, ns, &id, "writer", body), 400, "{ns}");
    }
    assert_eq!(put(&s, "ue.ddc", "not-a-hash", "writer", body), 400);
    assert_eq!(
        status(
            ureq::get(&url(&s, "/api/v1/blobs/ue.ddc/..%2F..%2Fetc%2Fpasswd"))
                .set("Authorization", "Bearer writer")
                .call()
        ),
        400
    );
    // Too large.
    assert_eq!(
        put(
            &s,
            "ue.ddc",
            &IoHash::of(&vec![1u8; (1 << 20) + 1]).to_hex(),
            "writer",
            &vec![1u8; (1 << 20) + 1]
        ),
        413
    );
    // Missing, forged and insufficient tokens.
    assert_eq!(status(ureq::put(&url(&s, &format!("/api/v1/blobs/ue.ddc/{id}"))).send_bytes(body)), 401);
    assert_eq!(put(&s, "ue.ddc", &id, "forged", body), 401);
    assert_eq!(put(&s, "ue.ddc", &id, "reader", body), 403);
    assert_eq!(put(&s, "other", &id, "writer", body), 403);
    assert_eq!(get(&s, "ue.ddc", &id, "writer"), Err(404), "none of that stored anything");

    // A body cut off before its Content-Length.
    {
        use std::io::{Read, Write};
        let mut raw = std::net::TcpStream::connect(s.addr).unwrap();
        let head = format!(
            "PUT /api/v1/blobs/ue.ddc/{id} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer writer\r\nContent-Length: 1000\r\n\r\n"
        );
        raw.write_all(head.as_bytes()).unwrap();
        raw.write_all(&body[..5]).unwrap();
        raw.shutdown(std::net::Shutdown::Write).unwrap();
        let mut answer = String::new();
        let _ = raw.read_to_string(&mut answer);
        assert!(answer.is_empty() || answer.starts_with("HTTP/1.1 400"), "{answer}");
    }
    assert_eq!(get(&s, "ue.ddc", &id, "writer"), Err(404), "a cut-off body is not stored");

    // And the server still serves.
    assert_eq!(put(&s, "ue.ddc", &id, "writer", body), 200);
    assert_eq!(get(&s, "ue.ddc", &id, "reader").unwrap(), body);
}
