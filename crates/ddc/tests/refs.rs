//! The editor's whole put/get flow over real HTTP, with the spec's test vectors as content:
//! ref PUT → `needs` → attachment PUTs on the ref path (bucket in mixed case) and the legacy
//! path → finalize → GET in every format and through the batch endpoint. Then the other ref
//! endpoints, raw (octet-stream) refs, packages, and every kind of bad input getting its 4xx
//! and storing nothing.

use std::io::Read;

use serde_json::Value as Json;
use tickwire_ddc::IoHash;
use tickwire_ddc::cb::{self, EntryFlags, Package, Value};

mod common;

use common::{Server, start, url};

const NS: &str = "ue.ddc";
const CB: &str = "application/x-ue-cb";
const COMP: &str = "application/x-ue-comp";

fn vectors() -> Json {
    serde_json::from_str(include_str!("fixtures/ddc-vectors.json")).unwrap()
}

fn vector(group: &str, name: &str, field: &str) -> Vec<u8> {
    let all = vectors();
    let v = all[group].as_array().unwrap().iter().find(|o| o["name"] == name).unwrap().clone();
    hex::decode(v[field].as_str().unwrap()).unwrap()
}

fn object(name: &str) -> Vec<u8> {
    vector("cb_objects", name, "hex")
}

fn buffer(name: &str) -> Vec<u8> {
    vector("compressed_buffers", name, "compressed_hex")
}

fn raw_hash(name: &str) -> String {
    let all = vectors();
    let v = all["compressed_buffers"].as_array().unwrap().iter().find(|o| o["name"] == name).unwrap().clone();
    v["raw_hash"].as_str().unwrap().to_owned()
}

/// A response: status, headers we look at, body.
struct Reply {
    status: u16,
    content_type: Option<String>,
    iohash: Option<String>,
    inline_hash: Option<String>,
    body: Vec<u8>,
}

impl Reply {
    fn json(&self) -> Json {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&self.body)))
    }
}

fn send(req: ureq::Request, body: Option<&[u8]>) -> Reply {
    let result = match body {
        Some(b) => req.send_bytes(b),
        None => req.call(),
    };
    let resp = match result {
        Ok(r) => r,
        Err(ureq::Error::Status(_, r)) => r,
        Err(e) => panic!("transport error: {e}"),
    };
    let status = resp.status();
    let content_type = resp.header("Content-Type").map(str::to_owned);
    let iohash = resp.header("X-Jupiter-IoHash").map(str::to_owned);
    let inline_hash = resp.header("X-Jupiter-InlinePayloadHash").map(str::to_owned);
    let mut body = Vec::new();
    resp.into_reader().read_to_end(&mut body).unwrap();
    Reply { status, content_type, iohash, inline_hash, body }
}

fn req(s: &Server, method: &str, path: &str) -> ureq::Request {
    ureq::request(method, &url(s, path)).set("Authorization", "Bearer writer")
}

fn put_ref(s: &Server, bucket: &str, key: &str, object: &[u8]) -> Reply {
    let r = req(s, "PUT", &format!("/api/v1/refs/{NS}/{bucket}/{key}"))
        .set("Content-Type", CB)
        .set("Accept", "application/json")
        .set("X-Jupiter-IoHash", &IoHash::of(object).to_hex());
    send(r, Some(object))
}

fn get_ref(s: &Server, bucket: &str, key: &str, accept: &str) -> Reply {
    send(req(s, "GET", &format!("/api/v1/refs/{NS}/{bucket}/{key}")).set("Accept", accept), None)
}

fn key(label: &str) -> String {
    IoHash::of(label.as_bytes()).to_hex()
}

fn needs(reply: &Reply) -> Vec<String> {
    assert_eq!(reply.status, 200, "{}", String::from_utf8_lossy(&reply.body));
    reply.json()["needs"].as_array().unwrap().iter().map(|h| h.as_str().unwrap().to_owned()).collect()
}

fn batch(s: &Server, ops: Vec<Value>) -> Reply {
    let body = Value::Object(vec![("ops".into(), Value::Array(ops))]).to_bytes();
    send(req(s, "POST", &format!("/api/v1/refs/{NS}")).set("Content-Type", CB).set("Accept", CB), Some(&body))
}

fn get_op(id: i128, bucket: &str, key: &str) -> Value {
    Value::Object(vec![
        ("opId".into(), Value::Integer(id)),
        ("op".into(), Value::String("GET".into())),
        ("bucket".into(), Value::String(bucket.into())),
        ("key".into(), Value::String(key.into())),
        ("resolveAttachments".into(), Value::Bool(true)),
    ])
}

/// opId → (statusCode, response as JSON) of a batch reply.
fn results(reply: &Reply) -> std::collections::BTreeMap<i128, (u64, Json)> {
    assert_eq!(reply.status, 200);
    assert_eq!(reply.content_type.as_deref(), Some(CB));
    let root = cb::parse(&reply.body).unwrap();
    root.get("results")
        .unwrap()
        .iter()
        .map(|r| {
            let id = r.get("opId").unwrap().as_i128().unwrap();
            let status = r.get("statusCode").unwrap().as_u64().unwrap();
            (id, (status, cb::to_json(&r.get("response").unwrap())))
        })
        .collect()
}

#[test]
fn the_editors_record_flow_end_to_end() {
    let s = start();
    let record = object("cache-record");
    let record_hash = IoHash::of(&record).to_hex();
    let k = key("record");
    let (small, multi) = (raw_hash("none-small"), raw_hash("lz4-multi-block"));

    // 1. PUT the record: both values are needed.
    assert_eq!(needs(&put_ref(&s, "legacyconformance", &k, &record)), vec![small.clone(), multi.clone()]);
    // Not finalized: not served, by GET, HEAD or batch.
    assert_eq!(get_ref(&s, "legacyconformance", &k, CB).status, 400);
    assert_eq!(send(req(&s, "HEAD", &format!("/api/v1/refs/{NS}/legacyconformance/{k}")), None).status, 404);
    let early = results(&batch(&s, vec![get_op(0, "legacyconformance", &k)]));
    assert_eq!(early[&0].0, 400);
    // Finalize now still reports both missing.
    let fin = format!("/api/v1/refs/{NS}/legacyconformance/{k}/finalize/{record_hash}");
    let form = "application/x-www-form-urlencoded";
    assert_eq!(needs(&send(req(&s, "POST", &fin).set("Content-Type", form), Some(b""))).len(), 2);

    // 2. The values: one on the ref path with the bucket in its original case, one on the
    // legacy path.
    let r = send(
        req(&s, "PUT", &format!("/api/v1/refs/{NS}/LegacyConformance/{k}/blobs/{small}"))
            .set("Content-Type", COMP),
        Some(&buffer("none-small")),
    );
    assert_eq!((r.status, r.json()["identifier"].as_str()), (200, Some(small.as_str())));
    let r = send(
        req(&s, "PUT", &format!("/api/v1/compressed-blobs/{NS}/{multi}")).set("Content-Type", COMP),
        Some(&buffer("lz4-multi-block")),
    );
    assert_eq!(r.status, 200);

    // 3. Finalize: nothing missing.
    assert!(needs(&send(req(&s, "POST", &fin).set("Content-Type", form), Some(b""))).is_empty());

    // 4. GET in every format.
    let got = get_ref(&s, "legacyconformance", &k, CB);
    assert_eq!((got.status, got.content_type.as_deref()), (200, Some(CB)));
    assert_eq!(got.body, record, "served byte for byte");
    assert_eq!(got.iohash.as_deref(), Some(record_hash.as_str()));
    let json = get_ref(&s, "legacyconformance", &k, "application/json");
    assert_eq!(
        json.json(),
        vectors()["cb_objects"].as_array().unwrap().iter().find(|o| o["name"] == "cache-record").unwrap()["json"]
    );
    assert_eq!(json.iohash.as_deref(), Some(record_hash.as_str()), "the object hash, whatever the format");
    let pkg = send(req(&s, "GET", &format!("/api/v1/refs/{NS}/legacyconformance/{k}.uecbpkg")), None);
    assert_eq!(pkg.status, 200);
    let package = Package::parse(&pkg.body).unwrap();
    assert_eq!(package.root.payload, record.as_slice());
    let mut entries: Vec<(String, EntryFlags, Vec<u8>)> =
        package.attachments.iter().map(|e| (hex::encode(e.hash), e.flags, e.payload.to_vec())).collect();
    entries.sort_by(|a, b| a.0.cmp(&b.0));
    let mut want = vec![
        (small.clone(), EntryFlags::COMPRESSED, buffer("none-small")),
        (multi.clone(), EntryFlags::COMPRESSED, buffer("lz4-multi-block")),
    ];
    want.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(entries, want);
    // Two attachments: raw gives the object itself, inline refuses.
    assert_eq!(get_ref(&s, "legacyconformance", &k, "application/octet-stream").body, record);
    assert_eq!(get_ref(&s, "legacyconformance", &k, "application/x-jupiter-inline").status, 400);
    assert_eq!(get_ref(&s, "legacyconformance", &k, "text/html").status, 406);
    assert_eq!(
        send(req(&s, "GET", &format!("/api/v1/refs/{NS}/legacyconformance/{k}.xml")), None).status,
        400
    );

    // 5. The values, as the editor fetches them: Accept */*, checked against X-Jupiter-IoHash.
    for (id, name) in [(&small, "none-small"), (&multi, "lz4-multi-block")] {
        for path in [
            format!("/api/v1/refs/{NS}/LegacyConformance/{k}/blobs/{id}"),
            format!("/api/v1/compressed-blobs/{NS}/{id}"),
        ] {
            let v = send(req(&s, "GET", &path).set("Accept", "*/*"), None);
            assert_eq!((v.status, v.content_type.as_deref()), (200, Some(COMP)), "{path}");
            assert_eq!(v.body, buffer(name));
            assert_eq!(v.iohash, Some(IoHash::of(&v.body).to_hex()));
        }
    }
    let wrong_accept = send(
        req(&s, "GET", &format!("/api/v1/compressed-blobs/{NS}/{small}")).set("Accept", "text/plain"),
        None,
    );
    assert_eq!(wrong_accept.status, 415);

    // 6. The editor's existence batch: one hit, one miss, the count kept.
    let reply =
        batch(&s, vec![get_op(0, "legacyconformance", &k), get_op(1, "legacyconformance", &key("absent"))]);
    let r = results(&reply);
    assert_eq!(r.len(), 2);
    assert_eq!(r[&0].0, 200);
    assert_eq!(r[&0].1["Values"][1]["RawSize"], 11096);
    assert_eq!(r[&1], (404, serde_json::json!({ "title": "Object not found", "status": 404 })));

    // 7. HEAD, exists, metadata, delete.
    let head = send(req(&s, "HEAD", &format!("/api/v1/refs/{NS}/legacyconformance/{k}")), None);
    assert_eq!((head.status, head.iohash.as_deref()), (200, Some(record_hash.as_str())));
    let absent = key("absent");
    let ex = send(
        req(&s, "GET", &format!("/api/v1/refs/{NS}/exists?names=legacyconformance.{k}&names=other.{absent}")),
        None,
    );
    assert_eq!(ex.json(), serde_json::json!({ "missing": [{ "bucket": "other", "key": absent }] }));
    let meta =
        send(req(&s, "GET", &format!("/api/v1/refs/{NS}/legacyconformance/{k}/metadata")), None).json();
    assert_eq!(
        (meta["payloadIdentifier"].as_str(), meta["isFinalized"].as_bool()),
        (Some(record_hash.as_str()), Some(true))
    );
    assert_eq!(send(req(&s, "GET", "/api/v1/refs"), None).json(), serde_json::json!({ "namespaces": [NS] }));
    let del = send(req(&s, "DELETE", &format!("/api/v1/refs/{NS}/legacyconformance/{k}")), None);
    assert_eq!(del.json(), serde_json::json!({ "deletedCount": 1 }));
    assert_eq!(get_ref(&s, "legacyconformance", &k, CB).status, 404);
}

#[test]
fn a_cache_value_is_served_inline_and_raw() {
    let s = start();
    let value = object("cache-value");
    let k = key("value");
    let raw = raw_hash("lz4-single-block");
    assert_eq!(needs(&put_ref(&s, "bucket", &k, &value)), vec![raw.clone()]);
    let r = send(
        req(&s, "PUT", &format!("/api/v1/refs/{NS}/bucket/{k}/blobs/{raw}")).set("Content-Type", COMP),
        Some(&buffer("lz4-single-block")),
    );
    assert_eq!(r.status, 200);
    let fin = format!("/api/v1/refs/{NS}/bucket/{k}/finalize/{}", IoHash::of(&value).to_hex());
    assert!(needs(&send(req(&s, "POST", &fin), None)).is_empty());

    // Inline: the compressed buffer as stored, with the hash of the returned bytes.
    let inline = get_ref(&s, "bucket", &k, "application/x-jupiter-inline");
    assert_eq!(inline.status, 200);
    assert_eq!(inline.body, buffer("lz4-single-block"));
    assert_eq!(inline.inline_hash, Some(IoHash::of(&inline.body).to_hex()));
    assert_eq!(inline.iohash, Some(IoHash::of(&value).to_hex()));
    // Raw: decompressed (the reference server answers 404 here; the spec allows this).
    let raw_reply = send(req(&s, "GET", &format!("/api/v1/refs/{NS}/bucket/{k}.raw")), None);
    assert_eq!(raw_reply.status, 200);
    assert_eq!(raw_reply.body, vector("compressed_buffers", "lz4-single-block", "raw_hex"));
}

#[test]
fn raw_refs_and_packages() {
    let s = start();
    // The benchmark's refs_raw_*: an octet-stream body becomes a blob and a wrapper object.
    let payload: Vec<u8> = (0..1025u32).map(|i| (i % 251) as u8).collect();
    let k = key("raw");
    let r = req(&s, "PUT", &format!("/api/v1/refs/{NS}/default/{k}"))
        .set("Content-Type", "application/octet-stream")
        .set("X-Jupiter-IoHash", &IoHash::of(&payload).to_hex());
    assert!(needs(&send(r, Some(&payload))).is_empty(), "finalized at once");
    assert_eq!(send(req(&s, "GET", &format!("/api/v1/refs/{NS}/default/{k}.raw")), None).body, payload);
    let wrapper = send(req(&s, "GET", &format!("/api/v1/refs/{NS}/default/{k}.uecb")), None);
    assert_eq!(
        cb::to_json(&cb::parse(&wrapper.body).unwrap()),
        serde_json::json!({ "RawHash": IoHash::of(&payload).to_hex(), "RawSize": 1025 })
    );
    let pkg = send(req(&s, "GET", &format!("/api/v1/refs/{NS}/default/{k}.uecbpkg")), None);
    let package = Package::parse(&pkg.body).unwrap();
    assert_eq!(package.attachments.len(), 1);
    assert_eq!(
        (package.attachments[0].flags, package.attachments[0].payload),
        (EntryFlags::RAW, payload.as_slice())
    );

    // A package PUT stores its attachments and finalizes at once.
    let body = vector("packages", "http-cbpkg-record", "hex");
    let k = key("package");
    let r =
        req(&s, "PUT", &format!("/api/v1/refs/{NS}/pkg/{k}")).set("Content-Type", "application/x-ue-cbpkg");
    assert!(needs(&send(r, Some(&body))).is_empty());
    assert_eq!(get_ref(&s, "pkg", &k, CB).body, object("cache-record"));
}

#[test]
fn overwrites_and_conflicts() {
    let s = start();
    let k = key("overwrite");
    let a = object("empty-object");
    let b = object("single-string-field");
    assert!(needs(&put_ref(&s, "b", &k, &a)).is_empty());
    assert!(needs(&put_ref(&s, "b", &k, &a)).is_empty(), "the same object again is a no-op 200");
    // The default policy allows overwriting, as the reference server's does.
    assert!(needs(&put_ref(&s, "b", &k, &b)).is_empty());
    assert_eq!(get_ref(&s, "b", &k, CB).body, b);
}

/// On a server that denies overwrites (`tickwire ddc --deny-overwrite`), a PUT of another
/// object over a finalized ref gets 409 with the stored object as compact binary (the editor
/// adopts it), alone or as a batch op, and the ref keeps its object; the same object again is
/// 200, `X-Jupiter-Allow-Overwrite: true` replaces it, and an unfinalized ref may be replaced.
#[test]
fn a_server_that_denies_overwrites_answers_409_with_the_stored_object() {
    let s = common::start_configured(
        tickwire_ddc::serve::ServeLimits::default(),
        tickwire_ddc::http::Limits::default(),
        None,
        |ddc| ddc.allow_overwrite = false,
    );
    let k = key("deny");
    let (a, b) = (object("empty-object"), object("single-string-field"));
    assert!(needs(&put_ref(&s, "b", &k, &a)).is_empty());
    assert!(needs(&put_ref(&s, "b", &k, &a)).is_empty(), "the same object again is 200");
    let conflict = put_ref(&s, "b", &k, &b);
    assert_eq!(conflict.status, 409);
    assert_eq!(conflict.content_type.as_deref(), Some(CB));
    assert_eq!(conflict.body, a, "the stored object, which the editor adopts");
    assert_eq!(get_ref(&s, "b", &k, CB).body, a, "not replaced");

    let op = common::put_op(1, "b", &k, &b);
    let (status, response) = results(&batch(&s, vec![op])).remove(&1).unwrap();
    assert_eq!((status, response), (409, cb::to_json(&cb::parse(&a).unwrap())), "a batch op's 409");
    assert_eq!(get_ref(&s, "b", &k, CB).body, a, "not replaced by the batch either");

    let allowed = req(&s, "PUT", &format!("/api/v1/refs/{NS}/b/{k}"))
        .set("Content-Type", CB)
        .set("Accept", "application/json")
        .set("X-Jupiter-IoHash", &IoHash::of(&b).to_hex())
        .set("X-Jupiter-Allow-Overwrite", "true");
    assert!(needs(&send(allowed, Some(&b))).is_empty());
    assert_eq!(get_ref(&s, "b", &k, CB).body, b, "replaced when the PUT allows it");

    // Not finalized (it names a blob never stored): another object replaces it.
    let u = key("unfinalized");
    let absent = IoHash::of(b"never stored");
    let waiting = Value::Object(vec![("x".into(), Value::BinaryAttachment(*absent.as_bytes()))]).to_bytes();
    assert_eq!(needs(&put_ref(&s, "b", &u, &waiting)), vec![absent.to_hex()]);
    assert!(needs(&put_ref(&s, "b", &u, &a)).is_empty(), "an unfinalized ref is replaced");
    assert_eq!(get_ref(&s, "b", &u, CB).body, a);
}

#[test]
fn bad_input_gets_its_4xx_and_stores_nothing() {
    let s = start();
    let record = object("cache-record");
    let k = key("bad");
    let path = format!("/api/v1/refs/{NS}/bucket/{k}");
    let put = |ct: &str, hash: Option<&str>, body: &[u8]| {
        let mut r = req(&s, "PUT", &path).set("Content-Type", ct);
        if let Some(h) = hash {
            r = r.set("X-Jupiter-IoHash", h);
        }
        send(r, Some(body)).status
    };
    let wrong = IoHash::of(b"wrong").to_hex();
    assert_eq!(put(CB, Some(&wrong), &record), 400, "hash header does not match the body");
    assert_eq!(put(CB, None, &record), 400, "hash header missing");
    assert_eq!(put(CB, Some("xyz"), &record), 400, "hash header malformed");
    let mut broken = record.clone();
    broken.truncate(record.len() - 3);
    assert_eq!(put(CB, Some(&IoHash::of(&broken).to_hex()), &broken), 400, "not valid compact binary");
    assert_eq!(put("text/plain", Some(&IoHash::of(&record).to_hex()), &record), 415);
    assert_eq!(put("application/x-ue-cbpkg", None, b"not a package"), 400);
    for (bucket, key) in [
        ("bucket", "short"),
        ("bucket", &"g!".repeat(20)),
        ("bad%20bucket", k.as_str()),
        (&"b".repeat(257), k.as_str()),
    ] {
        let r = req(&s, "PUT", &format!("/api/v1/refs/{NS}/{bucket}/{key}"))
            .set("Content-Type", CB)
            .set("X-Jupiter-IoHash", &IoHash::of(&record).to_hex());
        assert_eq!(send(r, Some(&record)).status, 400, "{bucket}/{key}");
    }
    assert_eq!(get_ref(&s, "bucket", &k, CB).status, 404, "none of that stored a ref");
    assert_eq!(send(req(&s, "GET", &format!("{path}/metadata")), None).status, 404);

    // Compressed buffers: raw hash not the URL's, payload not the raw hash, not a buffer.
    let small = buffer("none-small");
    let small_hash = raw_hash("none-small");
    let comp = |id: &str, body: &[u8]| {
        send(
            req(&s, "PUT", &format!("/api/v1/compressed-blobs/{NS}/{id}")).set("Content-Type", COMP),
            Some(body),
        )
        .status
    };
    assert_eq!(comp(&wrong, &small), 400);
    let mut corrupt = small.clone();
    *corrupt.last_mut().unwrap() ^= 1;
    assert_eq!(comp(&small_hash, &corrupt), 400, "payload does not hash to the raw hash");
    assert_eq!(comp(&small_hash, b"junk"), 400);
    let as_octet = send(
        req(&s, "PUT", &format!("/api/v1/compressed-blobs/{NS}/{small_hash}"))
            .set("Content-Type", "application/octet-stream"),
        Some(&small),
    );
    assert_eq!(as_octet.status, 415);
    assert_eq!(
        send(req(&s, "GET", &format!("/api/v1/compressed-blobs/{NS}/{small_hash}")), None).status,
        404
    );
    // An Oodle buffer whose blocks are all stored raw is verified like any other (one with a
    // block this server cannot decode: `an_oodle_buffer_is_accepted_stored_and_served_as_it_came`).
    assert_eq!(comp(&raw_hash("oodle-method-raw-blocks"), &buffer("oodle-method-raw-blocks")), 200);

    // Finalize: unknown ref, other object.
    let fin = |h: &str| send(req(&s, "POST", &format!("{path}/finalize/{h}")), None).status;
    assert_eq!(fin(&IoHash::of(&record).to_hex()), 404);
    assert_eq!(put(CB, Some(&IoHash::of(&record).to_hex()), &record), 200);
    assert_eq!(fin(&wrong), 400);
    assert_eq!(fin("nothex"), 400);

    // Batch: wrong type, duplicate ids, not compact binary, one op without access.
    let ops = Value::Object(vec![("ops".into(), Value::Array(vec![get_op(0, "b", &k), get_op(0, "b", &k)]))])
        .to_bytes();
    let post = |ct: &str, body: &[u8], token: &str| {
        send(
            ureq::request("POST", &url(&s, &format!("/api/v1/refs/{NS}")))
                .set("Authorization", &format!("Bearer {token}"))
                .set("Content-Type", ct),
            Some(body),
        )
        .status
    };
    assert_eq!(post("application/json", b"{}", "writer"), 415);
    assert_eq!(post(CB, &ops, "writer"), 400, "duplicate opId");
    assert_eq!(post(CB, b"\x02\x05", "writer"), 400);
    let put_op = Value::Object(vec![
        ("opId".into(), Value::Integer(1)),
        ("op".into(), Value::String("PUT".into())),
        ("bucket".into(), Value::String("b".into())),
        ("key".into(), Value::String(k.clone())),
    ]);
    let mixed = Value::Object(vec![("ops".into(), Value::Array(vec![get_op(0, "b", &k), put_op.clone()]))])
        .to_bytes();
    assert_eq!(post(CB, &mixed, "reader"), 403, "one op without access fails the whole batch");
    assert_eq!(post(CB, &mixed, "putter"), 403, "a GET needs ReadObject");
    // A token that may only write may send a batch of PUTs (spec 4: checked op by op).
    let only_puts =
        Value::Object(vec![("ops".into(), Value::Array(vec![common::put_op(7, "w", &k, &record)]))])
            .to_bytes();
    assert_eq!(post(CB, &only_puts, "putter"), 200);
    let r = results(&batch(&s, vec![put_op]));
    assert_eq!(r[&1].0, 400, "a PUT op without payload");

    // Auth: none, forged, read-only writing.
    assert_eq!(send(ureq::get(&url(&s, &path)), None).status, 401);
    assert_eq!(send(ureq::get(&url(&s, &path)).set("Authorization", "Bearer forged"), None).status, 401);
    let ro =
        ureq::request("PUT", &url(&s, &path)).set("Authorization", "Bearer reader").set("Content-Type", CB);
    assert_eq!(send(ro.set("X-Jupiter-IoHash", &IoHash::of(&record).to_hex()), Some(&record)).status, 403);

    // The health checks need no token.
    let health = send(ureq::get(&url(&s, "/health/ready")), None);
    assert_eq!((health.status, health.body.as_slice()), (200, &b"Healthy"[..]));
}

#[test]
fn ranges_on_blob_gets() {
    let s = start();
    let body: Vec<u8> = (0..1000u32).map(|i| (i % 256) as u8).collect();
    let id = IoHash::of(&body).to_hex();
    let r =
        req(&s, "PUT", &format!("/api/v1/blobs/{NS}/{id}")).set("Content-Type", "application/octet-stream");
    assert_eq!(send(r, Some(&body)).status, 200);
    for path in [format!("/api/v1/blobs/{NS}/{id}"), format!("/api/v1/s/{NS}/{id}")] {
        let part = send(req(&s, "GET", &path).set("Range", "bytes=10-19"), None);
        assert_eq!((part.status, part.body.as_slice(), part.iohash), (206, &body[10..20], None));
        let tail = send(req(&s, "GET", &path).set("Range", "bytes=990-"), None);
        assert_eq!(tail.body, &body[990..]);
        assert_eq!(send(req(&s, "GET", &path).set("Range", "bytes=5000-6000"), None).status, 416);
        assert_eq!(send(req(&s, "GET", &path), None).body, body);
    }
}

#[test]
fn metrics_count_requests_by_route_and_the_store() {
    let s = start();
    let record = object("cache-record");
    let k = key("metrics");
    assert_eq!(needs(&put_ref(&s, "m", &k, &record)).len(), 2);
    assert_eq!(get_ref(&s, "m", &k, CB).status, 400);
    let body = b"some blob";
    let id = IoHash::of(body).to_hex();
    let r =
        req(&s, "PUT", &format!("/api/v1/blobs/{NS}/{id}")).set("Content-Type", "application/octet-stream");
    assert_eq!(send(r, Some(body)).status, 200);
    // Without a token, like the health checks.
    let text = String::from_utf8(send(ureq::get(&url(&s, "/metrics")), None).body).unwrap();
    let has = |needle: &str| text.lines().any(|l| l.contains(needle));
    assert!(
        has(r#"ddc_requests_total{route="/api/v1/refs/{ns}/{bucket}/{key}",method="PUT",status="200"} 1"#),
        "{text}"
    );
    assert!(has(
        r#"ddc_requests_total{route="/api/v1/refs/{ns}/{bucket}/{key}",method="GET",status="400"} 1"#
    ));
    assert!(has(r#"ddc_requests_total{route="/api/v1/blobs/{ns}/{id}",method="PUT",status="200"} 1"#));
    assert!(has(r#"ddc_request_duration_seconds_bucket{route="/api/v1/blobs/{ns}/{id}",le="+Inf"} 1"#));
    assert!(has(&format!(
        r#"ddc_request_body_bytes_total{{route="/api/v1/blobs/{{ns}}/{{id}}"}} {}"#,
        body.len()
    )));
    assert!(!text.contains(&k), "no key in a label");
    let stored = text.lines().find(|l| l.starts_with("ddc_store_bytes ")).unwrap();
    assert!(stored.ends_with(&format!(" {}", body.len())), "{stored}");
}

#[test]
fn a_ref_is_never_served_while_an_attachment_is_missing() {
    let s = start();
    let value = object("cache-value");
    let k = key("deleted-attachment");
    let raw = raw_hash("lz4-single-block");
    let upload = || {
        let r = req(&s, "PUT", &format!("/api/v1/compressed-blobs/{NS}/{raw}")).set("Content-Type", COMP);
        assert_eq!(send(r, Some(&buffer("lz4-single-block"))).status, 200);
    };
    upload();
    assert!(needs(&put_ref(&s, "b", &k, &value)).is_empty(), "finalized at once");
    assert_eq!(get_ref(&s, "b", &k, CB).status, 200);
    // The attachment goes: no format serves the ref, and finalize takes it back.
    assert_eq!(send(req(&s, "DELETE", &format!("/api/v1/compressed-blobs/{NS}/{raw}")), None).status, 200);
    // Again, and a raw blob never stored: gone either way, 200 (docs/ddc.md).
    assert_eq!(send(req(&s, "DELETE", &format!("/api/v1/compressed-blobs/{NS}/{raw}")), None).status, 200);
    assert_eq!(send(req(&s, "DELETE", &format!("/api/v1/blobs/{NS}/{}", key("never"))), None).status, 200);
    for accept in [CB, "application/json", "application/x-jupiter-inline", "application/octet-stream"] {
        assert_eq!(get_ref(&s, "b", &k, accept).status, 404, "{accept}");
    }
    assert_eq!(results(&batch(&s, vec![get_op(0, "b", &k)]))[&0].0, 404);
    let fin = format!("/api/v1/refs/{NS}/b/{k}/finalize/{}", IoHash::of(&value).to_hex());
    assert_eq!(needs(&send(req(&s, "POST", &fin), None)), vec![raw.clone()]);
    let meta = send(req(&s, "GET", &format!("/api/v1/refs/{NS}/b/{k}/metadata")), None).json();
    assert_eq!(meta["isFinalized"], false);
    // Back again: finalize serves it.
    upload();
    assert!(needs(&send(req(&s, "POST", &fin), None)).is_empty());
    assert_eq!(get_ref(&s, "b", &k, CB).body, value);
}

#[test]
fn hostile_requests_are_cheap_to_refuse() {
    let s = start();
    // A batch without a token is refused before its body is read.
    let body = Value::Object(vec![("ops".into(), Value::Array(vec![]))]).to_bytes();
    let anonymous = ureq::post(&url(&s, &format!("/api/v1/refs/{NS}"))).set("Content-Type", CB);
    assert_eq!(send(anonymous, Some(&body)).status, 401);
    // An unknown reply suffix on a PUT stores nothing.
    let object = object("empty-object");
    let k = key("suffix");
    let r = req(&s, "PUT", &format!("/api/v1/refs/{NS}/b/{k}.foo"))
        .set("Content-Type", CB)
        .set("X-Jupiter-IoHash", &IoHash::of(&object).to_hex());
    assert_eq!(send(r, Some(&object)).status, 400);
    assert_eq!(get_ref(&s, "b", &k, CB).status, 404);
    // An object graph that names each next level 100 times, 12 levels deep: each object is
    // judged once, not 100^12 times.
    let mut next: Option<IoHash> = None;
    for level in 0..12 {
        let fields = match next {
            None => vec![("leaf".into(), Value::Integer(level))],
            Some(h) => (0..100).map(|i| (format!("f{i}"), Value::ObjectAttachment(*h.as_bytes()))).collect(),
        };
        let bytes = Value::Object(fields).to_bytes();
        let id = IoHash::of(&bytes);
        let r = req(&s, "PUT", &format!("/api/v1/blobs/{NS}/{id}"))
            .set("Content-Type", "application/octet-stream");
        assert_eq!(send(r, Some(&bytes)).status, 200);
        next = Some(id);
    }
    let top =
        Value::Object(vec![("root".into(), Value::ObjectAttachment(*next.unwrap().as_bytes()))]).to_bytes();
    let started = std::time::Instant::now();
    assert!(needs(&put_ref(&s, "b", &key("deep"), &top)).is_empty());
    assert!(started.elapsed() < std::time::Duration::from_secs(20), "{:?}", started.elapsed());
    // Any method string is one label value, "other".
    assert_eq!(send(ureq::request("XYZZY", &url(&s, "/health/live")), None).status, 405);
    let text = String::from_utf8(send(ureq::get(&url(&s, "/metrics")), None).body).unwrap();
    assert!(!text.contains("XYZZY"), "{text}");
    assert!(text.contains(r#"method="other""#));
}

#[test]
fn existence_checks_by_kind_of_blob() {
    let s = start();
    let small = raw_hash("none-small");
    let r = req(&s, "PUT", &format!("/api/v1/compressed-blobs/{NS}/{small}")).set("Content-Type", COMP);
    assert_eq!(send(r, Some(&buffer("none-small"))).status, 200);
    let absent = IoHash::of(b"absent").to_hex();
    // The compressed-blob routes count a compressed buffer as present; the raw-blob routes do not.
    let q = format!("exists?id={small}&id={absent}");
    let comp = send(req(&s, "POST", &format!("/api/v1/compressed-blobs/{NS}/{q}")), None).json();
    assert_eq!(comp, serde_json::json!({ "needs": [absent] }));
    let raw = send(req(&s, "POST", &format!("/api/v1/blobs/{NS}/{q}")), None).json();
    assert_eq!(raw, serde_json::json!({ "needs": [small, absent] }));
    let body = serde_json::to_vec(&[&small]).unwrap();
    let comp = send(req(&s, "POST", &format!("/api/v1/compressed-blobs/{NS}/exist")), Some(&body)).json();
    assert_eq!(comp, serde_json::json!({ "needs": [] }));
    let raw = send(req(&s, "POST", &format!("/api/v1/blobs/{NS}/exist")), Some(&body)).json();
    assert_eq!(raw, serde_json::json!({ "needs": [small] }));
    assert_eq!(send(req(&s, "POST", &format!("/api/v1/blobs/{NS}/exist")), Some(b"not json")).status, 400);
}

/// A batch's reply holds at most `max_buffered_bytes` of embedded objects (here 64 KiB): GETs
/// past it get their own 413, and the editor asks for them again in another batch.
#[test]
fn a_batch_reply_is_bounded() {
    let api = tickwire_ddc::http::Limits { max_buffered_bytes: 64 << 10, ..Default::default() };
    let s = common::start_api(tickwire_ddc::serve::ServeLimits::default(), api, None);
    let object = Value::Object(vec![("data".into(), Value::String("x".repeat(20 << 10)))]).to_bytes();
    assert_eq!(put_ref(&s, "big", &key("big"), &object).status, 200);
    let reply = batch(&s, (0..5).map(|i| get_op(i, "big", &key("big"))).collect());
    let statuses: Vec<u64> = results(&reply).values().map(|(status, _)| *status).collect();
    assert_eq!(statuses, [200, 200, 200, 413, 413]);
    assert!(reply.body.len() < 64 << 10, "{} bytes", reply.body.len());
}

/// An object naming more than 4,096 attachments is refused (each would be looked up at every
/// read of its ref), on the ref path and as a batch op's own result.
#[test]
fn an_object_with_too_many_attachments_is_refused() {
    let s = start();
    let attachments = (0..4097u32).map(|i| Value::BinaryAttachment(*IoHash::of(&i.to_be_bytes()).as_bytes()));
    let object = Value::Object(vec![("parts".into(), Value::Array(attachments.collect()))]).to_bytes();
    let reply = put_ref(&s, "many", &key("many"), &object);
    assert_eq!(reply.status, 400, "{}", String::from_utf8_lossy(&reply.body));
    assert!(String::from_utf8_lossy(&reply.body).contains("4097 attachments"));
    assert_eq!(get_ref(&s, "many", &key("many"), CB).status, 404, "nothing stored");
    let put = common::put_op(1, "many", &key("many"), &object);
    let results = results(&batch(&s, vec![put, get_op(2, "many", &key("many"))]));
    assert_eq!(results[&1].0, 400, "{:?}", results[&1].1);
    assert!(results[&1].1["title"].as_str().unwrap().contains("4097 attachments"), "{:?}", results[&1].1);
    assert_eq!(results[&2].0, 404);
}

/// Rendering an object as JSON is charged to the memory budget at its worst case, 96 bytes per
/// byte: a 20,000-item array of nulls and bools (about 20 KB) could never fit this server's 1 MiB
/// budget, so it gets 413 (not a 429 its retries would meet again), while compact binary serves
/// it and a small object renders.
#[test]
fn json_renderings_are_bounded() {
    let api = tickwire_ddc::http::Limits {
        memory_budget: 1 << 20,
        max_buffered_bytes: 8 << 20,
        ..Default::default()
    };
    let s = common::start_api(tickwire_ddc::serve::ServeLimits::default(), api, None);
    let nulls = Value::Object(vec![(
        "n".into(),
        Value::Array((0..20_000).map(|i| if i % 2 == 0 { Value::Null } else { Value::Bool(true) }).collect()),
    )]);
    let nulls = nulls.to_bytes();
    assert_eq!(put_ref(&s, "nulls", &key("nulls"), &nulls).status, 200);
    assert_eq!(get_ref(&s, "nulls", &key("nulls"), "application/json").status, 413);
    assert_eq!(get_ref(&s, "nulls", &key("nulls"), CB).body, nulls);
    let small = Value::Object(vec![("n".into(), Value::Integer(7))]).to_bytes();
    assert_eq!(put_ref(&s, "small", &key("small"), &small).status, 200);
    let json = get_ref(&s, "small", &key("small"), "application/json");
    assert_eq!((json.status, json.json()["n"].as_i64()), (200, Some(7)));
}

/// A compressed buffer whose payload is past `storage::DECODE_INLINE_MAX` is verified and
/// decoded on the blocking pool: a good one is stored and served `.raw`, a corrupt one is
/// refused as any corrupt buffer is.
#[test]
fn a_large_compressed_buffer_is_verified_and_decoded() {
    let s = start();
    let payload: Vec<u8> = (0..(1u32 << 20)).map(|i| (i % 253) as u8).collect();
    assert!(payload.len() as u64 > tickwire_ddc::storage::DECODE_INLINE_MAX);
    let buffer = tickwire_ddc::compressed::encode_none(&payload);
    let raw = IoHash::of(&payload);
    let mut corrupt = buffer.clone();
    *corrupt.last_mut().unwrap() ^= 1;
    let path = format!("/api/v1/compressed-blobs/{NS}/{}", raw.to_hex());
    let refused = send(req(&s, "PUT", &path).set("Content-Type", COMP), Some(&corrupt));
    assert_eq!(refused.status, 400, "{}", String::from_utf8_lossy(&refused.body));
    assert_eq!(send(req(&s, "PUT", &path).set("Content-Type", COMP), Some(&buffer)).status, 200);
    let value = Value::Object(vec![
        ("RawHash".into(), Value::BinaryAttachment(*raw.as_bytes())),
        ("RawSize".into(), Value::Integer(payload.len() as i128)),
    ])
    .to_bytes();
    let k = key("large");
    assert!(needs(&put_ref(&s, "bucket", &k, &value)).is_empty());
    let got = send(req(&s, "GET", &format!("/api/v1/refs/{NS}/bucket/{k}.raw")), None);
    assert_eq!(got.status, 200);
    assert!(got.body == payload, "the payload, decoded");
}

/// A method-3 (Oodle) buffer of `raw` in blocks of 512 bytes whose first block is stored
/// "compressed" (`stored` bytes of noise, as an Oodle block would be: this server cannot
/// decode it), the others raw.
fn oodle_buffer(raw: &[u8], stored: usize) -> Vec<u8> {
    let blocks: Vec<&[u8]> = raw.chunks(512).collect();
    let sizes: Vec<u32> =
        blocks.iter().enumerate().map(|(i, b)| if i == 0 { stored } else { b.len() } as u32).collect();
    let total = 64 + 4 * sizes.len() + sizes.iter().map(|&s| s as usize).sum::<usize>();
    let mut out = Vec::with_capacity(total);
    out.extend_from_slice(&0xb775_6362u32.to_be_bytes());
    out.extend_from_slice(&[0; 4]); // The CRC, below.
    out.extend_from_slice(&[3, 0, 0, 9]); // Oodle, compressor, level, 2^9-byte blocks.
    out.extend_from_slice(&(sizes.len() as u32).to_be_bytes());
    out.extend_from_slice(&(raw.len() as u64).to_be_bytes());
    out.extend_from_slice(&(total as u64).to_be_bytes());
    out.extend_from_slice(blake3::hash(raw).as_bytes());
    sizes.iter().for_each(|s| out.extend_from_slice(&s.to_be_bytes()));
    let crc = crc32fast::hash(&out[8..]);
    out[4..8].copy_from_slice(&crc.to_be_bytes());
    out.extend((0..stored).map(|i| (i * 7) as u8));
    blocks[1..].iter().for_each(|b| out.extend_from_slice(b));
    out
}

/// The editor uploads Oodle-compressed buffers by default, and this server cannot decode their
/// blocks (spec 5.2: accept after the header checks). Such a buffer is stored, named by a ref,
/// and served byte for byte; only `.raw`, which would need its payload, is 404; a header whose
/// raw hash is not the URL's is still 400.
#[test]
fn an_oodle_buffer_is_accepted_stored_and_served_as_it_came() {
    let s = start();
    let payload: Vec<u8> = (0..1200u32).map(|i| (i % 251) as u8).collect();
    let buffer = oodle_buffer(&payload, 100);
    let raw = IoHash::of(&payload);
    assert_eq!(
        tickwire_ddc::compressed::verify(&buffer).err(),
        Some(tickwire_ddc::compressed::CompressedError::Oodle),
        "a block this server cannot decode"
    );
    let put = |path: &str, body: &[u8]| send(req(&s, "PUT", path).set("Content-Type", COMP), Some(body));
    let k = key("oodle");
    let on_ref = format!("/api/v1/refs/{NS}/bucket/{k}/blobs/{}", raw.to_hex());
    let r = put(&on_ref, &buffer);
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let wrong = format!("/api/v1/compressed-blobs/{NS}/{}", IoHash::of(b"other").to_hex());
    assert_eq!(put(&wrong, &buffer).status, 400, "the URL names another raw hash");
    let blob = format!("/api/v1/compressed-blobs/{NS}/{}", raw.to_hex());
    assert_eq!(put(&blob, &buffer).status, 200, "again: an idempotent upload");
    let got = send(req(&s, "GET", &blob), None);
    assert_eq!(got.status, 200);
    assert!(got.body == buffer, "served as it came");
    let value = Value::Object(vec![
        ("RawHash".into(), Value::BinaryAttachment(*raw.as_bytes())),
        ("RawSize".into(), Value::Integer(payload.len() as i128)),
    ])
    .to_bytes();
    assert!(
        needs(&put_ref(&s, "bucket", &k, &value)).is_empty(),
        "the ref finalizes: its attachment is there"
    );
    let inline = get_ref(&s, "bucket", &k, "application/x-jupiter-inline");
    assert_eq!(inline.status, 200);
    assert!(inline.body == buffer, "inline: the stored buffer");
    let pkg = send(req(&s, "GET", &format!("/api/v1/refs/{NS}/bucket/{k}.uecbpkg")), None);
    let package = Package::parse(&pkg.body).unwrap();
    assert_eq!(package.attachments.len(), 1);
    assert!(package.attachments[0].payload == buffer.as_slice(), "in a package: the stored buffer");
    assert_eq!(send(req(&s, "GET", &format!("/api/v1/refs/{NS}/bucket/{k}.raw")), None).status, 404);
    // Once the payload is stored as a raw blob too, `.raw` serves it (spec 5.3.3), before the
    // buffer it cannot decode.
    let r = send(req(&s, "PUT", &format!("/api/v1/blobs/{NS}/{}", raw.to_hex())), Some(&payload));
    assert_eq!(r.status, 200);
    let got = send(req(&s, "GET", &format!("/api/v1/refs/{NS}/bucket/{k}.raw")), None);
    assert_eq!(got.status, 200);
    assert!(got.body == payload, "the raw blob");
}

/// A buffer whose payload this server cannot check (Oodle) is stored as it came, right or
/// wrong. It is not final: a later upload of the same raw hash whose payload checks takes its
/// place. The reverse does not happen: a checked copy stays when an unchecked one comes.
#[test]
fn a_checked_upload_replaces_an_unchecked_one_and_not_the_reverse() {
    let s = start();
    let payload: Vec<u8> = (0..1200u32).map(|i| (i % 241) as u8).collect();
    let raw = IoHash::of(&payload);
    let blob = format!("/api/v1/compressed-blobs/{NS}/{}", raw.to_hex());
    let put = |body: &[u8]| send(req(&s, "PUT", &blob).set("Content-Type", COMP), Some(body));
    let get = || send(req(&s, "GET", &blob), None);
    // Unchecked, and wrong: its first block is noise, not an encoding of the payload.
    let unchecked = oodle_buffer(&payload, 100);
    assert_eq!(put(&unchecked).status, 200);
    assert!(get().body == unchecked);
    let other_unchecked = oodle_buffer(&payload, 90);
    assert_eq!(put(&other_unchecked).status, 200);
    assert!(get().body == unchecked, "an unchecked copy does not replace another");
    let checked = tickwire_ddc::compressed::encode_none(&payload);
    assert_eq!(put(&checked).status, 200);
    assert!(get().body == checked, "the checked copy took the unchecked one's place");
    assert_eq!(put(&unchecked).status, 200);
    assert!(get().body == checked, "an unchecked copy does not replace a checked one");
    // An Oodle buffer whose blocks are all stored raw is checked like any other.
    let mut all_raw = oodle_buffer(&payload, 512);
    let first = 64 + 4 * payload.len().div_ceil(512);
    all_raw[first..first + 512].copy_from_slice(&payload[..512]);
    assert_eq!(tickwire_ddc::compressed::verify(&all_raw).map(|h| h.raw_hash), Ok(raw));
    assert_eq!(put(&all_raw).status, 200);
    assert!(get().body == checked, "a checked copy does not replace a checked one");
}
