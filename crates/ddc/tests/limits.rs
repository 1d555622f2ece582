//! The HTTP server's limits, tried as an attacker would, over real sockets: idle sockets that
//! never send a request, more connections than the cap, in all and from one address, a body that stalls halfway, and a
//! non-text `X-Jupiter-IoHash`, a compressed buffer that claims a block larger than the memory
//! budget, a reader that stops reading a large answer or a batch's reply, answers larger than
//! the whole budget, a batch PUT payload the budget cannot hold beside its body.
//! The attacker is cut off with a status or a closed socket, and a health check and an
//! authenticated upload beside it still succeed.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use common::{start_with, status, url};
use tickwire_ddc::IoHash;
use tickwire_ddc::serve::ServeLimits;

/// Reads what the server sends until it closes the socket, within `limit`.
fn read_until_closed(stream: &mut TcpStream, limit: Duration) -> Option<String> {
    stream.set_read_timeout(Some(limit)).unwrap();
    let mut out = Vec::new();
    match stream.read_to_end(&mut out) {
        Ok(_) => Some(String::from_utf8_lossy(&out).into_owned()),
        Err(_) => None,
    }
}

fn health(s: &common::Server) -> u16 {
    status(ureq::get(&url(s, "/health/live")).timeout(Duration::from_secs(5)).call())
}

#[test]
fn idle_and_surplus_connections_cannot_hold_the_server() {
    let limits =
        ServeLimits { max_connections: 20, header_timeout: Duration::from_secs(2), ..ServeLimits::default() };
    let s = start_with(limits, Duration::from_secs(30));
    // 30 sockets that never send a request: 20 take every slot and are closed (with nothing
    // sent) once their header deadline passes; the other 10 get 503 at once (a whole answer
    // and a clean close, not a reset). Which ones is up to the order the server accepts them
    // in. The 2 s deadline leaves a loaded machine ample time to accept all 30 first.
    let mut sockets: Vec<TcpStream> = (0..30).map(|_| TcpStream::connect(s.addr).unwrap()).collect();
    let answers: Vec<String> = sockets
        .iter_mut()
        .map(|socket| read_until_closed(socket, Duration::from_secs(5)).expect("a socket stayed open"))
        .collect();
    let busy = answers.iter().filter(|a| a.starts_with("HTTP/1.1 503")).count();
    let reaped = answers.iter().filter(|a| a.is_empty()).count();
    assert_eq!((busy, reaped), (10, 20), "{answers:?}");
    // The server serves again.
    assert_eq!(health(&s), 200);
}

/// A connection from `source` (a loopback address) to the server.
fn connect_from(source: [u8; 4], s: &common::Server) -> TcpStream {
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    socket.bind(&std::net::SocketAddr::from((source, 0)).into()).unwrap();
    socket.connect(&s.addr.into()).unwrap();
    socket.into()
}

/// `GET path` on a socket of its own from `source`: the whole answer.
fn get_from(source: [u8; 4], s: &common::Server, path: &str) -> String {
    let mut stream = connect_from(source, s);
    write!(stream, "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").unwrap();
    read_until_closed(&mut stream, Duration::from_secs(5)).expect("answered and closed")
}

/// One address holding its whole share of connections gets 503 for more; another address is
/// served beside it, and the first again once one of its connections closes. `/metrics` counts
/// the refusal.
#[test]
fn one_address_cannot_take_every_connection() {
    let limits = ServeLimits {
        max_connections_per_address: 3,
        header_timeout: Duration::from_secs(30),
        ..ServeLimits::default()
    };
    let s = start_with(limits, Duration::from_secs(30));
    let mut held: Vec<TcpStream> = (0..3).map(|_| connect_from([127, 0, 0, 1], &s)).collect();
    // The server takes connections in order: a request on the last shows all three are in.
    let mut last = held.pop().unwrap();
    last.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(last, "GET /health/live HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let mut head = [0u8; 12];
    last.read_exact(&mut head).unwrap();
    assert_eq!(&head, b"HTTP/1.1 200");
    held.push(last);

    let refused = get_from([127, 0, 0, 1], &s, "/health/live");
    assert!(refused.starts_with("HTTP/1.1 503"), "{refused:?}");
    let other = get_from([127, 0, 0, 2], &s, "/health/live");
    assert!(other.starts_with("HTTP/1.1 200"), "{other:?}");
    let metrics = get_from([127, 0, 0, 2], &s, "/metrics");
    assert!(metrics.contains("ddc_connections_refused_total{reason=\"per_address\"} 1"), "{metrics}");
    let open = |metrics: &str| -> f64 {
        let line = metrics.lines().find_map(|line| line.strip_prefix("ddc_connections_open "));
        line.and_then(|n| n.parse().ok()).expect("ddc_connections_open")
    };
    // Three held and this one; the health check's, closed, may not have ended its task yet.
    assert!((4.0..=5.0).contains(&open(&metrics)), "{metrics}");

    drop(held.pop());
    // The server sees the close when it next reads that socket: soon, not at once.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let again = get_from([127, 0, 0, 1], &s, "/health/live");
        if again.starts_with("HTTP/1.1 200") {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "still refused: {again:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
    // Every connection closed is counted out: the two held and the one asking.
    drop(held);
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while open(&get_from([127, 0, 0, 2], &s, "/metrics")) > 1.0 {
        assert!(std::time::Instant::now() < deadline, "connections closed are still counted open");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_body_that_stalls_gets_408_and_is_stored_nowhere() {
    let s = start_with(ServeLimits::default(), Duration::from_millis(300));
    let data = b"0123456789".repeat(100);
    let id = IoHash::of(&data).to_hex();
    let mut stream = TcpStream::connect(s.addr).unwrap();
    let head = format!(
        "PUT /api/v1/blobs/ue.ddc/{id} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer writer\r\nContent-Length: {}\r\n\r\n",
        data.len()
    );
    stream.write_all(head.as_bytes()).unwrap();
    stream.write_all(&data[..10]).unwrap();
    // ... and nothing more.
    let answer = read_until_closed(&mut stream, Duration::from_secs(5)).expect("answered and closed");
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer:?}");
    let get = ureq::get(&url(&s, &format!("/api/v1/blobs/ue.ddc/{id}")))
        .set("Authorization", "Bearer writer")
        .call();
    assert_eq!(status(get), 404, "nothing was stored");
    // A whole upload beside it works.
    let put = ureq::put(&url(&s, &format!("/api/v1/blobs/ue.ddc/{id}")))
        .set("Authorization", "Bearer writer")
        .send_bytes(&data);
    assert_eq!(status(put), 200);
}

#[test]
fn a_non_text_iohash_header_is_a_bad_request() {
    let s = start_with(ServeLimits::default(), Duration::from_secs(30));
    let data = b"abc";
    let id = IoHash::of(data).to_hex();
    let mut stream = TcpStream::connect(s.addr).unwrap();
    let mut request = format!(
        "PUT /api/v1/blobs/ue.ddc/{id} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer writer\r\nContent-Length: 3\r\nConnection: close\r\nX-Jupiter-IoHash: "
    )
    .into_bytes();
    request.extend_from_slice(&[0xff, 0xfe, 0x80]);
    request.extend_from_slice(b"\r\n\r\nabc");
    stream.write_all(&request).unwrap();
    let answer = read_until_closed(&mut stream, Duration::from_secs(5)).expect("answered");
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer:?}");
    assert_eq!(health(&s), 200);
}

/// An LZ4 buffer of about 8.4 MB whose one block claims 2 GiB of raw bytes (the most LZ4 can
/// expand 8.4 MB to): verifying it would decode into a 2 GiB buffer, more than the server's
/// memory budget (1 GiB), so it is refused with 413 (no retry could get it) before anything is
/// allocated. Before, the
/// budget counted only the body, and the block was allocated.
#[test]
fn a_compressed_block_larger_than_the_memory_budget_is_refused() {
    let s = common::start();
    let raw: u64 = 1 << 31;
    let stored = (raw - 64).div_ceil(255) as usize;
    let mut body = Vec::with_capacity(68 + stored);
    body.extend_from_slice(&0xb775_6362u32.to_be_bytes()); // Magic.
    body.extend_from_slice(&[0; 4]); // CRC, below.
    body.extend_from_slice(&[4, 0, 0, 31]); // LZ4, compressor, level, block size exponent.
    body.extend_from_slice(&1u32.to_be_bytes());
    body.extend_from_slice(&raw.to_be_bytes());
    body.extend_from_slice(&((68 + stored) as u64).to_be_bytes());
    let raw_hash = [7u8; 20];
    body.extend_from_slice(&raw_hash);
    body.extend_from_slice(&[0; 12]);
    body.extend_from_slice(&(stored as u32).to_be_bytes());
    let crc = crc32fast::hash(&body[8..68]);
    body[4..8].copy_from_slice(&crc.to_be_bytes());
    body.resize(68 + stored, 0);
    let id = IoHash::from_bytes(raw_hash).to_hex();
    let put = ureq::put(&url(&s, &format!("/api/v1/compressed-blobs/ue.ddc/{id}")))
        .set("Authorization", "Bearer writer")
        .set("Content-Type", "application/x-ue-comp")
        .send_bytes(&body);
    assert_eq!(status(put), 413, "past what the budget could ever hold: the same on every try");
    // The budget it did not take is there for the next upload.
    let data = b"fits".repeat(64);
    let small = ureq::put(&url(&s, &format!("/api/v1/blobs/ue.ddc/{}", IoHash::of(&data).to_hex())))
        .set("Authorization", "Bearer writer")
        .send_bytes(&data);
    assert_eq!(status(small), 200);
}

/// A GET whose reader stops reading keeps its object's share of the memory budget while its
/// answer waits to be sent, and a HEAD of the same ref (which reads the object too) is charged
/// for it, alone or in a batch: the two do not fit the budget, so the HEAD gets 429 until the
/// reader goes. (On
/// Linux's default loopback buffers; buffers tuned past the object's 12 MiB would let the GET
/// finish.)
#[test]
fn a_stopped_reader_keeps_its_share_and_a_head_is_charged_too() {
    let api = tickwire_ddc::http::Limits {
        memory_budget: 20 << 20,
        max_buffered_bytes: 16 << 20,
        ..tickwire_ddc::http::Limits::default()
    };
    let s = common::start_api(ServeLimits::default(), api, None);
    let (path, object) = common::put_large_object(&s, 12 << 20);
    let path = path.as_str();
    let head = || status(ureq::head(&url(&s, path)).set("Authorization", "Bearer writer").call());
    assert_eq!(head(), 200, "alone, the object fits");
    // A `.raw` GET of it (no attachment: the object itself) is charged for it once, not twice.
    let raw = ureq::get(&url(&s, &format!("{path}.raw"))).set("Authorization", "Bearer writer").call();
    let mut body = Vec::new();
    raw.expect("200").into_reader().read_to_end(&mut body).unwrap();
    assert_eq!(body, object);
    // A reader that asks for the object and reads nothing: the kernel's buffers take a few MiB
    // of the 12, the rest waits in the server.
    let mut stalled = TcpStream::connect(s.addr).unwrap();
    let get = format!(
        "GET {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer writer\r\nAccept: application/x-ue-cb\r\n\r\n"
    );
    stalled.write_all(get.as_bytes()).unwrap();
    let mut first = [0u8; 12];
    stalled.read_exact(&mut first).unwrap();
    assert_eq!(&first, b"HTTP/1.1 200", "the answer started");
    assert_eq!(head(), 429, "the stopped reader's share and the HEAD's do not fit");
    // A batch's HEAD op reads the object too, charged the same way: the whole batch gets 429.
    use tickwire_ddc::cb::Value;
    let op = Value::Object(vec![
        ("opId".into(), Value::Integer(1)),
        ("op".into(), Value::String("HEAD".into())),
        ("bucket".into(), Value::String("bucket".into())),
        ("key".into(), Value::String(path.rsplit('/').next().unwrap().into())),
    ]);
    let batch = Value::Object(vec![("ops".into(), Value::Array(vec![op]))]).to_bytes();
    let post = || {
        status(
            ureq::post(&url(&s, "/api/v1/refs/ue.ddc"))
                .set("Authorization", "Bearer writer")
                .set("Content-Type", "application/x-ue-cb")
                .send_bytes(&batch),
        )
    };
    assert_eq!(post(), 429, "a batch HEAD is charged for the object it reads");
    drop(stalled);
    // Its connection gone, the share comes back (the server notices at its next write).
    assert_eq!(once_200(head), 200, "the share came back");
    assert_eq!(post(), 200);
}

/// Asks `status` again until it answers 200, for up to 5 s (a share comes back when the server
/// notices a closed connection, at its next write); the last answer.
fn once_200(status: impl Fn() -> u16) -> u16 {
    let mut last = 0;
    for _ in 0..100 {
        last = status();
        if last == 200 {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    last
}

/// A server with a memory budget of 20 MiB and bodies up to 16 MiB: less than twice the body
/// limit, so that one request can need more than the whole budget.
fn small_budget() -> common::Server {
    let api = tickwire_ddc::http::Limits {
        memory_budget: 20 << 20,
        max_buffered_bytes: 16 << 20,
        ..tickwire_ddc::http::Limits::default()
    };
    common::start_api(ServeLimits::default(), api, None)
}

/// Stores `bytes` as a raw blob (200 asserted) and gives its hash.
fn put_blob(s: &common::Server, bytes: &[u8]) -> [u8; 20] {
    let hash = IoHash::of(bytes);
    let put = ureq::put(&url(s, &format!("/api/v1/blobs/ue.ddc/{}", hash.to_hex())))
        .set("Authorization", "Bearer writer")
        .send_bytes(bytes);
    assert_eq!(status(put), 200);
    *hash.as_bytes()
}

/// PUTs compact-binary `object` as ref `bucket/key`; its status.
fn put_ref(s: &common::Server, key: &str, object: &[u8]) -> u16 {
    status(
        ureq::put(&url(s, &format!("/api/v1/refs/ue.ddc/bucket/{key}")))
            .set("Authorization", "Bearer writer")
            .set("Content-Type", "application/x-ue-cb")
            .set("X-Jupiter-IoHash", &IoHash::of(object).to_hex())
            .send_bytes(object),
    )
}

/// GETs ref `bucket/key` (with any suffix); its status. It reads the answer to the end, so the
/// next request does not race the server's notice of a closed socket.
fn get(s: &common::Server, key: &str) -> u16 {
    let answer = ureq::get(&url(s, &format!("/api/v1/refs/ue.ddc/bucket/{key}")))
        .set("Authorization", "Bearer writer")
        .call();
    let code = match &answer {
        Ok(r) => r.status(),
        Err(ureq::Error::Status(code, _)) => *code,
        Err(e) => panic!("{e}"),
    };
    if let Ok(r) = answer {
        std::io::copy(&mut r.into_reader(), &mut std::io::sink()).unwrap();
    }
    code
}

/// On a budget of 20 MiB with bodies up to 16 MiB: a ref PUT again (its object compared by hash,
/// not read), one naming an object attachment, and a batch GET of an 8 MiB ref are all served,
/// again and again: no request needs more than the whole budget, so none is a 429 its retries
/// would meet forever. An object attachment the budget cannot hold beside what the request
/// holds is a 413, the same every time, charged nothing (not "missing", which would
/// unfinalize a ref whose attachments are all there).
#[test]
fn no_request_needs_more_than_the_whole_budget() {
    use tickwire_ddc::cb::Value;
    let s = small_budget();
    let put_blob = |bytes: &[u8]| put_blob(&s, bytes);
    let put_ref = |key: &str, object: &[u8]| put_ref(&s, key, object);
    let get = |key: &str| get(&s, key);
    // 12 MiB of object naming a small object attachment, itself naming a binary one.
    let binary = put_blob(b"payload");
    let small = Value::Object(vec![("b".into(), Value::BinaryAttachment(binary))]).to_bytes();
    let small = put_blob(&small);
    let big = |attachment: [u8; 20]| {
        Value::Object(vec![
            ("pad".into(), Value::Binary(vec![1u8; 12 << 20])),
            ("o".into(), Value::ObjectAttachment(attachment)),
        ])
        .to_bytes()
    };
    let key = "00000000000000000000000000000000000000aa";
    let object = big(small);
    for round in 0..3 {
        assert_eq!(put_ref(key, &object), 200, "PUT, round {round}");
        assert_eq!(get(key), 200, "GET, round {round}");
    }
    // A batch GET of an 8 MiB object: within the reply's bound (half the budget), and charged
    // twice in the reply, never three times.
    let key8 = "00000000000000000000000000000000000000cc";
    let eight = Value::Object(vec![("pad".into(), Value::Binary(vec![3u8; 8 << 20]))]).to_bytes();
    assert_eq!(put_ref(key8, &eight), 200);
    let op = Value::Object(vec![
        ("opId".into(), Value::Integer(1)),
        ("op".into(), Value::String("GET".into())),
        ("bucket".into(), Value::String("bucket".into())),
        ("key".into(), Value::String(key8.into())),
    ]);
    let batch = Value::Object(vec![("ops".into(), Value::Array(vec![op]))]).to_bytes();
    for round in 0..3 {
        let reply = ureq::post(&url(&s, "/api/v1/refs/ue.ddc"))
            .set("Authorization", "Bearer writer")
            .set("Content-Type", "application/x-ue-cb")
            .send_bytes(&batch)
            .unwrap_or_else(|e| panic!("batch, round {round}: {e}"));
        let mut bytes = Vec::new();
        reply.into_reader().read_to_end(&mut bytes).unwrap();
        let reply = tickwire_ddc::cb::parse(&bytes).unwrap();
        let result = reply.get("results").unwrap().iter().next().unwrap();
        assert_eq!(result.get("statusCode").and_then(|f| f.as_i128()), Some(200), "round {round}");
    }
    // A 9 MiB object attachment beside the PUT's 16 MiB of body: past the budget's 20, so the
    // PUT is 413, every time, stores nothing, and does not call the attachment missing.
    let nine = Value::Object(vec![("pad".into(), Value::Binary(vec![2u8; 9 << 20]))]).to_bytes();
    let nine = put_blob(&nine);
    let key = "00000000000000000000000000000000000000bb";
    for round in 0..2 {
        assert_eq!(put_ref(key, &big(nine)), 413, "PUT, round {round}");
        assert_eq!(get(key), 404, "GET, round {round}: nothing stored");
    }
}

/// On the same small budget, two answers that need more memory than the whole budget are 413,
/// the same on every try (they were 429s that retries would meet forever): `.raw` of a 12 MiB
/// compressed attachment (its stored buffer and its decoded payload, 24 MiB together), and
/// `/metadata` of a 15.5 MiB object (its base64 alone is over 20 MiB). Smaller ones are served.
#[test]
fn answers_past_the_whole_budget_are_413_not_429() {
    use tickwire_ddc::cb::Value;
    let s = small_budget();
    let compressed_ref = |key: &str, payload: &[u8]| {
        let buffer = tickwire_ddc::compressed::encode_none(payload);
        let raw = IoHash::of(payload);
        let put = ureq::put(&url(&s, &format!("/api/v1/compressed-blobs/ue.ddc/{}", raw.to_hex())))
            .set("Authorization", "Bearer writer")
            .set("Content-Type", "application/x-ue-comp")
            .send_bytes(&buffer);
        assert_eq!(status(put), 200);
        let object = Value::Object(vec![
            ("RawHash".into(), Value::BinaryAttachment(*raw.as_bytes())),
            ("RawSize".into(), Value::Integer(payload.len() as i128)),
        ])
        .to_bytes();
        assert_eq!(put_ref(&s, key, &object), 200);
    };
    let large = "00000000000000000000000000000000000000d1";
    compressed_ref(large, &vec![5u8; 12 << 20]);
    let small = "00000000000000000000000000000000000000d2";
    compressed_ref(small, &vec![6u8; 8 << 20]);
    for round in 0..2 {
        assert_eq!(get(&s, &format!("{large}.raw")), 413, ".raw, round {round}");
        assert_eq!(get(&s, &format!("{small}.raw")), 200, ".raw of 16 MiB together, round {round}");
    }
    let metadata = |key: &str| get(&s, &format!("{key}/metadata"));
    let padded = |len: usize| Value::Object(vec![("pad".into(), Value::Binary(vec![4u8; len]))]).to_bytes();
    let big = "00000000000000000000000000000000000000d3";
    assert_eq!(put_ref(&s, big, &padded(31 << 19)), 200);
    let fits = "00000000000000000000000000000000000000d4";
    assert_eq!(put_ref(&s, fits, &padded(12 << 20)), 200);
    for round in 0..2 {
        assert_eq!(metadata(big), 413, "/metadata, round {round}");
        assert_eq!(metadata(fits), 200, "/metadata of 16 MiB of text, round {round}");
    }
}

/// A batch's reply keeps its share of the memory budget while it is sent, as any answer from
/// memory does: a reader that asks for a batch GET of a 9 MiB object and reads nothing holds
/// about 9 MiB, so a HEAD of a 12 MiB ref (charged for the object it reads) does not fit the
/// 20 MiB budget beside it and gets 429 until the reader goes. Before, the reply's share went
/// back once it was built, and the HEAD got 200.
#[test]
fn a_stopped_batch_reader_keeps_its_replys_share() {
    use tickwire_ddc::cb::Value;
    let s = small_budget();
    let padded = |len: usize| Value::Object(vec![("pad".into(), Value::Binary(vec![8u8; len]))]).to_bytes();
    let nine = "00000000000000000000000000000000000000e1";
    let twelve = "00000000000000000000000000000000000000e2";
    assert_eq!(put_ref(&s, nine, &padded(9 << 20)), 200);
    assert_eq!(put_ref(&s, twelve, &padded(12 << 20)), 200);
    let head = || {
        let path = format!("/api/v1/refs/ue.ddc/bucket/{twelve}");
        status(ureq::head(&url(&s, &path)).set("Authorization", "Bearer writer").call())
    };
    assert_eq!(head(), 200, "alone, the object fits");
    let op = Value::Object(vec![
        ("opId".into(), Value::Integer(1)),
        ("op".into(), Value::String("GET".into())),
        ("bucket".into(), Value::String("bucket".into())),
        ("key".into(), Value::String(nine.into())),
    ]);
    let batch = Value::Object(vec![("ops".into(), Value::Array(vec![op]))]).to_bytes();
    let mut stalled = TcpStream::connect(s.addr).unwrap();
    let post = format!(
        "POST /api/v1/refs/ue.ddc HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer writer\r\n\
         Content-Type: application/x-ue-cb\r\nContent-Length: {}\r\n\r\n",
        batch.len()
    );
    stalled.write_all(post.as_bytes()).unwrap();
    stalled.write_all(&batch).unwrap();
    let mut first = [0u8; 12];
    stalled.read_exact(&mut first).unwrap();
    assert_eq!(&first, b"HTTP/1.1 200", "the reply started");
    assert_eq!(head(), 429, "the stopped reader's reply and the HEAD's object do not fit");
    drop(stalled);
    assert_eq!(once_200(head), 200, "the share came back");
}

/// A batch PUT op's payload is copied out of the body only when the op runs, charged: on the
/// 20 MiB budget, a 12 MiB payload cannot be held beside its 12 MiB body (buffered in up to
/// 16), so the op gets its own 413 and stores nothing, every time; a 3 MiB one is stored.
/// Before, every op's payload was copied when the batch was parsed, uncharged, and both got
/// 200.
#[test]
fn a_batch_puts_payload_is_charged() {
    use tickwire_ddc::cb::Value;
    let s = small_budget();
    let put_op = |key: &str, len: usize| {
        let object = Value::Object(vec![("pad".into(), Value::Binary(vec![9u8; len]))]).to_bytes();
        let op = common::put_op(1, "bucket", key, &object);
        let batch = Value::Object(vec![("ops".into(), Value::Array(vec![op]))]).to_bytes();
        let reply = ureq::post(&url(&s, "/api/v1/refs/ue.ddc"))
            .set("Authorization", "Bearer writer")
            .set("Content-Type", "application/x-ue-cb")
            .send_bytes(&batch)
            .expect("the batch itself is 200");
        let mut bytes = Vec::new();
        reply.into_reader().read_to_end(&mut bytes).unwrap();
        let reply = tickwire_ddc::cb::parse(&bytes).unwrap();
        let result = reply.get("results").unwrap().iter().next().unwrap();
        result.get("statusCode").and_then(|f| f.as_i128()).unwrap()
    };
    let large = "00000000000000000000000000000000000000f1";
    for round in 0..2 {
        assert_eq!(put_op(large, 12 << 20), 413, "round {round}");
        assert_eq!(get(&s, large), 404, "round {round}: nothing stored");
    }
    let small = "00000000000000000000000000000000000000f2";
    assert_eq!(put_op(small, 3 << 20), 200);
    assert_eq!(get(&s, small), 200);
}

/// `POST .../exist` with a JSON array of ids: charged for the ids and the answer beside its
/// body (on the 20 MiB budget: 5 MiB of ids are answered, 12 MiB are 413 for good), and a body
/// of anything but ids is refused at its first element (it allocated a `String` per element
/// before: 16 MiB of `""` took 200 MiB uncharged).
#[test]
fn a_presence_check_is_charged_for_its_ids_and_its_answer() {
    let s = small_budget();
    // The answer's status, and its JSON when 200.
    let exist = |body: &[u8]| -> (u16, Option<serde_json::Value>) {
        let r = ureq::post(&url(&s, "/api/v1/blobs/ue.ddc/exist"))
            .set("Authorization", "Bearer writer")
            .set("Content-Type", "application/json")
            .send_bytes(body);
        match r {
            Ok(r) => (r.status(), r.into_json().ok()),
            Err(ureq::Error::Status(code, _)) => (code, None),
            Err(e) => panic!("transport error: {e}"),
        }
    };
    let ids = |mib: usize| {
        let n = (mib << 20) / 43;
        let ids: Vec<String> = (0..n as u64).map(|i| IoHash::of(&i.to_le_bytes()).to_hex()).collect();
        (n, serde_json::to_vec(&ids).unwrap())
    };
    let (n, five) = ids(5);
    let (code, reply) = exist(&five);
    assert_eq!(code, 200);
    assert_eq!(reply.unwrap()["needs"].as_array().unwrap().len(), n, "none stored, all needed");
    let (_, twelve) = ids(12);
    assert_eq!(exist(&twelve).0, 413);
    let junk = format!("[{}\"\"]", "\"\",".repeat(1 << 20));
    assert_eq!(exist(junk.as_bytes()).0, 400);
    // The budget is whole again: the five MiB are answered again.
    assert_eq!(exist(&five).0, 200);
}
