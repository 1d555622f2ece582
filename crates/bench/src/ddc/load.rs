//! HTTP load, as vegeta makes it: open loop at a fixed rate (each request has a due time, and
//! its latency counts from then, so a stalled server cannot hide its backlog: no coordinated
//! omission), or closed loop (N workers back to back). Every response is checked: a non-2xx
//! status, a transport error, a timeout, or a body that does not verify is a failure, counted
//! by kind.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use hdrhistogram::Histogram;
use http_body_util::BodyExt;
use hyper::Method;
use hyper_util::client::legacy::Client as HyperClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tickwire_ddc::IoHash;
use tickwire_ddc::cb::{EntryFlags, Package};
use tokio::sync::Semaphore;
use tokio::time::Instant;

pub type Client = HyperClient<HttpConnector, Chunks>;

/// A request body sent as a few shared chunks (no copy), with its exact length declared: how a
/// unique upload is a short prefix before a large shared blob.
#[derive(Debug, Clone, Default)]
pub struct Chunks {
    chunks: std::collections::VecDeque<Bytes>,
    left: u64,
}

impl Chunks {
    pub fn new(chunks: Vec<Bytes>) -> Chunks {
        let left = chunks.iter().map(|c| c.len() as u64).sum();
        Chunks { chunks: chunks.into_iter().filter(|c| !c.is_empty()).collect(), left }
    }

    pub fn len(&self) -> u64 {
        self.left
    }
}

impl From<Bytes> for Chunks {
    fn from(b: Bytes) -> Chunks {
        Chunks::new(vec![b])
    }
}

impl hyper::body::Body for Chunks {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, Self::Error>>> {
        let next = self.chunks.pop_front();
        if let Some(c) = &next {
            self.left -= c.len() as u64;
        }
        std::task::Poll::Ready(next.map(|c| Ok(hyper::body::Frame::data(c))))
    }

    fn is_end_stream(&self) -> bool {
        self.chunks.is_empty()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        hyper::body::SizeHint::with_exact(self.left)
    }
}

/// A pooled HTTP/1.1 client (one connection per request in flight, reused). A connection idle
/// for 5 s is dropped: `tickwire ddc` closes those idle for 10 s (its header timeout), and a
/// request sent on one just as the server closes it fails (seen once between two tests).
pub fn client() -> Client {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    HyperClient::builder(TokioExecutor::new())
        .pool_timer(hyper_util::rt::TokioTimer::new())
        .pool_idle_timeout(std::time::Duration::from_secs(5))
        .pool_max_idle_per_host(1024)
        .http1_max_buf_size(4 << 20)
        .build(connector)
}

/// What a successful answer must look like, beyond a 2xx status.
#[derive(Debug, Clone)]
pub enum Expect {
    Status,
    /// The body hashes to this.
    BodyHash(IoHash),
    /// A package whose root object has this hash and that carries this raw attachment, intact.
    Package {
        root: IoHash,
        attachment: IoHash,
    },
}

/// One request.
#[derive(Debug, Clone)]
pub struct Call {
    pub method: Method,
    pub url: String,
    pub headers: Vec<(&'static str, String)>,
    pub body: Chunks,
    pub expect: Expect,
}

/// What a run measured.
#[derive(Debug)]
pub struct Tally {
    /// Microseconds from each request's due time (open loop) or send time (closed loop) to
    /// the end of its response body, for every request: a failed one at the moment it failed
    /// (a timeout at the timeout), so failures cannot flatter the percentiles.
    pub latency_us: Histogram<u64>,
    pub ok: u64,
    /// Failed requests by kind (`HTTP 503`, `timeout`, `body hash`, ...).
    pub errors: BTreeMap<String, u64>,
    /// Response body bytes of successful requests.
    pub bytes_in: u64,
    /// Request body bytes sent.
    pub bytes_out: u64,
    /// From the first due time to the last completion.
    pub elapsed: Duration,
}

impl Tally {
    fn new() -> Tally {
        Tally {
            latency_us: Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("valid bounds"),
            ok: 0,
            errors: BTreeMap::new(),
            bytes_in: 0,
            bytes_out: 0,
            elapsed: Duration::ZERO,
        }
    }

    pub fn requests(&self) -> u64 {
        self.ok + self.errors.values().sum::<u64>()
    }

    /// One request: its result, and when it was due (open loop) or sent (closed loop).
    fn record(&mut self, result: Result<(u64, Instant), String>, start: Instant, sent: u64) {
        self.bytes_out += sent;
        match result {
            Ok((bytes, done)) => {
                self.ok += 1;
                self.bytes_in += bytes;
                self.latency_us.saturating_record(done.duration_since(start).as_micros().max(1) as u64);
            }
            Err(kind) => {
                *self.errors.entry(kind).or_default() += 1;
                self.latency_us.saturating_record(start.elapsed().as_micros().max(1) as u64);
            }
        }
    }
}

/// Sends one call and checks its answer: the body size and the instant its last byte
/// arrived (checking comes after, so it is not timed), or the failure's kind.
pub async fn execute(client: &Client, call: &Call, timeout: Duration) -> Result<(u64, Instant), String> {
    let mut request = hyper::Request::builder().method(call.method.clone()).uri(&call.url);
    for (name, value) in &call.headers {
        request = request.header(*name, value);
    }
    let request = request.body(call.body.clone()).map_err(|e| format!("request: {e}"))?;
    let exchange = async {
        let response = client.request(request).await.map_err(|e| format!("transport: {e}"))?;
        let status = response.status();
        // The frames as they come, uncopied.
        let mut body = response.into_body();
        let mut chunks = Vec::new();
        while let Some(frame) = body.frame().await {
            if let Ok(data) = frame.map_err(|e| format!("body: {e}"))?.into_data() {
                chunks.push(data);
            }
        }
        let done = Instant::now();
        if !status.is_success() {
            return Err(format!("HTTP {}", status.as_u16()));
        }
        Ok((chunks, done))
    };
    let (chunks, done) =
        tokio::time::timeout(timeout, exchange).await.map_err(|_| "timeout".to_owned())??;
    let size = chunks.iter().map(|c| c.len() as u64).sum();
    if size > 256 * 1024 {
        // Hashing megabytes takes milliseconds: off the thread that receives the others.
        let expect = call.expect.clone();
        tokio::task::spawn_blocking(move || verify(&expect, &chunks))
            .await
            .map_err(|e| format!("verifying: {e}"))??;
    } else {
        verify(&call.expect, &chunks)?;
    }
    Ok((size, done))
}

fn verify(expect: &Expect, chunks: &[Bytes]) -> Result<(), String> {
    match expect {
        Expect::Status => Ok(()),
        Expect::BodyHash(h) => {
            let mut hasher = blake3::Hasher::new();
            for c in chunks {
                hasher.update(c);
            }
            if IoHash::from_hasher(&hasher) == *h { Ok(()) } else { Err("body hash".into()) }
        }
        Expect::Package { root, attachment } => {
            let body = chunks.concat();
            let package = Package::parse(&body).map_err(|e| format!("package: {e}"))?;
            let root_ok = package.root.hash == *root.as_bytes();
            let found = package.attachments.iter().any(|e| {
                e.hash == *attachment.as_bytes()
                    && e.flags == EntryFlags::RAW
                    && IoHash::of(e.payload) == *attachment
            });
            if root_ok && found { Ok(()) } else { Err("package content".into()) }
        }
    }
}

/// How early the open-loop scheduler wakes before a due time (the timer's granularity).
const TIMER_SLACK: Duration = Duration::from_millis(1);

/// How requests are paced.
#[derive(Debug, Clone, Copy)]
pub enum Pace {
    /// `rate` requests per second, each due at its slot whatever the server does.
    Open { rate: f64 },
    /// `workers` requests in flight, each sent when the previous one ended.
    Closed { workers: usize },
}

/// Limits of one run.
#[derive(Debug, Clone, Copy)]
pub struct RunLimits {
    pub duration: Duration,
    /// Open loop: requests in flight at most; a due request waits for a slot (and its wait
    /// counts in its latency).
    pub max_in_flight: usize,
    /// Per request.
    pub timeout: Duration,
}

/// Runs `calls(i)` for request i under `pace` for `limits.duration`, then waits for the
/// requests still in flight (each bounded by its timeout).
pub async fn run(
    client: &Client,
    pace: Pace,
    limits: RunLimits,
    calls: Arc<dyn Fn(u64) -> Call + Send + Sync>,
    progress: &indicatif::ProgressBar,
) -> Tally {
    let tally = Arc::new(Mutex::new(Tally::new()));
    let start = Instant::now();
    let end = start + limits.duration;
    match pace {
        Pace::Open { rate } => {
            let slots = Arc::new(Semaphore::new(limits.max_in_flight));
            for i in 0u64.. {
                let due = start + Duration::from_secs_f64(i as f64 / rate);
                if due >= end {
                    break;
                }
                // The request is built before its due time (hashing a fresh upload takes time).
                // Tokio's timer fires up to a millisecond late: wake a millisecond early, so a
                // request goes out at its due time, not after it.
                let call = calls(i);
                tokio::time::sleep_until(due - TIMER_SLACK).await;
                let slot = slots.clone().acquire_owned().await.expect("never closed");
                let (client, tally) = (client.clone(), tally.clone());
                tokio::spawn(async move {
                    // Timed from the due time, or from sending if that came first.
                    let start = Instant::now().min(due);
                    let result = execute(&client, &call, limits.timeout).await;
                    tally.lock().expect("not poisoned").record(result, start, call.body.len());
                    drop(slot);
                });
                progress.set_position(start.elapsed().as_secs().min(limits.duration.as_secs()));
            }
            // Every slot back: every request answered or timed out.
            let _all = slots.acquire_many(limits.max_in_flight as u32).await.expect("never closed");
        }
        Pace::Closed { workers } => {
            let next = Arc::new(std::sync::atomic::AtomicU64::new(0));
            let handles: Vec<_> = (0..workers)
                .map(|_| {
                    let (client, tally, calls, next) =
                        (client.clone(), tally.clone(), calls.clone(), next.clone());
                    tokio::spawn(async move {
                        while Instant::now() < end {
                            let call = calls(next.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
                            let sent = Instant::now();
                            let result = execute(&client, &call, limits.timeout).await;
                            tally.lock().expect("not poisoned").record(result, sent, call.body.len());
                        }
                    })
                })
                .collect();
            let ticker = async {
                loop {
                    progress.set_position(start.elapsed().as_secs().min(limits.duration.as_secs()));
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
            };
            let all = async {
                for h in handles {
                    let _ = h.await;
                }
            };
            tokio::select! {
                () = all => {}
                () = ticker => {}
            }
        }
    }
    // Every request has been recorded (a task may still hold its clone of the Arc).
    let mut tally = std::mem::replace(&mut *tally.lock().expect("not poisoned"), Tally::new());
    tally.elapsed = start.elapsed();
    tally
}
