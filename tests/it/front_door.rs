//! The API's front door, round 2, on the real broker and CQL database: what one caller
//! (with one tenant key, or with none) can make `fairway serve` spend, and that the harm
//! stays with that caller: bodies that would parse into huge trees, slow connections
//! from one address, reads in a loop, and a tenant's rate across replicas.
//! (docs/security.md: the bounds and their settings.)

use crate::common;

use fairway::config::Config;
use fairway::core::auth::Caller;
use fairway::core::retry::DurationMs;
use reqwest::StatusCode;
use serde_json::{json, Value};
use std::net::IpAddr;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

async fn key(cfg: &Config, tenant: &str) -> String {
    common::create_key(cfg, &Caller::Tenant(tenant.into()), "it_front_door").await.1
}

/// A client that sends `key` from the loopback address `from` (Linux routes 127/8 to lo,
/// so each test party has an address of its own).
fn client(key: &str, from: &str) -> reqwest::Client {
    let mut h = reqwest::header::HeaderMap::new();
    h.insert("authorization", format!("Bearer {key}").parse().unwrap());
    reqwest::Client::builder()
        .default_headers(h)
        .local_address(from.parse::<IpAddr>().unwrap())
        .timeout(Duration::from_secs(20))
        .build()
        .unwrap()
}

/// A `fairway serve` child process for `cfg` (+ `extra` settings), killed on drop.
struct Serve {
    child: Child,
    base: String,
    _dir: tempfile::TempDir,
}

impl Serve {
    fn start(cfg: &Config, extra: &str, args: &[&str]) -> Serve {
        let dir = tempfile::tempdir().unwrap();
        let extra = format!("[job_types.echo]\npool = \"short\"\nhandler = \"echo\"\n{extra}");
        let path = common::config_file(cfg, &extra, dir.path());
        let port = common::free_port();
        let listen = format!("127.0.0.1:{port}");
        let child = Command::new(env!("CARGO_BIN_EXE_fairway"))
            .args(["--config", path.to_str().unwrap(), "serve", "--listen", &listen, "--metrics-listen", "off"])
            .args(args)
            .env("FAIRWAY_LOG", "warn")
            .stdout(Stdio::null())
            .spawn()
            .expect("spawn fairway serve");
        let deadline = Instant::now() + Duration::from_secs(60);
        while common::http_get_status(&listen, "/healthz") != Some(200) {
            assert!(Instant::now() < deadline, "fairway serve did not answer /healthz within 60 s");
            std::thread::sleep(Duration::from_millis(200));
        }
        Serve { child, base: format!("http://{listen}"), _dir: dir }
    }

    /// The process's peak resident set, MB (VmHWM).
    fn peak_rss_mb(&self) -> f64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        let line = status.lines().find(|l| l.starts_with("VmHWM:")).expect("VmHWM");
        line.split_whitespace().nth(1).unwrap().parse::<f64>().unwrap() / 1024.0
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// B's echo job: (status, answer, seconds it took).
async fn b_submits(b: &reqwest::Client, base: &str) -> (StatusCode, Value, f64) {
    let t = Instant::now();
    let r = b.post(format!("{base}/v1/jobs")).json(&json!({"job_type": "echo", "payload": {}})).send().await;
    let r = r.expect("B's submission got an answer");
    let s = r.status();
    (s, r.json().await.unwrap_or(Value::Null), t.elapsed().as_secs_f64())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn wide_json_bodies_cost_their_bytes_not_a_tree() {
    let cfg = common::arc(common::config(""));
    common::init(&cfg).await;
    let srv = Serve::start(&cfg, "", &[]);
    let (a, b) = (client(&key(&cfg, "acme").await, "127.0.0.1"), client(&key(&cfg, "globex").await, "127.0.0.1"));
    let before = srv.peak_rss_mb();
    // Three at once of the largest single-job body: a 6 MiB `[0,0,...]` payload (one
    // job's body may be ~6x max_payload_bytes), which parsed into a tree is ~700 MB.
    let body = bytes::Bytes::from(format!("{{\"job_type\":\"echo\",\"payload\":[{}0]}}", "0,".repeat(3 << 20)));
    let sends = (0..3).map(|_| {
        let req = a.post(format!("{}/v1/jobs", srv.base)).header("content-type", "application/json");
        req.body(body.clone()).send()
    });
    for r in futures::future::join_all(sends).await {
        let r = r.expect("an answer");
        assert_eq!(r.status(), StatusCode::PAYLOAD_TOO_LARGE, "{:?}", r.text().await);
    }
    // The same inside a batch element, and a schedule body of the same shape.
    let batch = bytes::Bytes::from(format!("[{{\"job_type\":\"echo\",\"payload\":[{}0]}}]", "0,".repeat(3 << 20)));
    let r = a.post(format!("{}/v1/jobs:batch", srv.base)).header("content-type", "application/json");
    refused(r.body(batch).send().await, "a batch with a 6 MiB element");
    let sched = format!(
        "{{\"name\":\"w\",\"cron\":\"* * * * *\",\"job_type\":\"echo\",\"payload\":[{}0]}}",
        "0,".repeat(1 << 20)
    );
    let r = a.post(format!("{}/v1/schedules", srv.base)).header("content-type", "application/json");
    refused(r.body(sched).send().await, "a 2 MiB schedule body (over api.limits.control_body_bytes)");
    let peak = srv.peak_rss_mb();
    eprintln!("fairway serve peak RSS: {before:.0} MB before, {peak:.0} MB after the wide bodies");
    assert!(peak < 300.0, "fairway serve peaked at {peak:.0} MB (a tree of the payload was built)");
    let (s, body, _) = b_submits(&b, &srv.base).await;
    assert_eq!(s, StatusCode::CREATED, "{body}");
    // A payload that fits is carried as its compact JSON text.
    let r = b.post(format!("{}/v1/jobs", srv.base)).json(&json!({"job_type": "echo", "payload": {"a": [1, 2]}}));
    assert_eq!(r.send().await.unwrap().status(), StatusCode::CREATED);
}

/// `n` connections to `srv`, the `i`th from address `from(i)`, each having sent the
/// first line of a request head and no more.
async fn trickling_heads(srv: &Serve, n: usize, from: impl Fn(usize) -> IpAddr) -> Vec<tokio::net::TcpStream> {
    let addr: std::net::SocketAddr = srv.base.trim_start_matches("http://").parse().unwrap();
    let mut open = Vec::with_capacity(n);
    for i in 0..n {
        let sock = tokio::net::TcpSocket::new_v4().unwrap();
        sock.bind((from(i), 0).into()).unwrap();
        let mut s = sock.connect(addr).await.unwrap();
        s.write_all(b"GET /healthz HTTP/1.1\r\n").await.unwrap();
        open.push(s);
    }
    open
}

/// How many of `open` were answered 503 naming `limit` (each read for 20 ms).
async fn refused_with(open: &mut [tokio::net::TcpStream], limit: &str) -> usize {
    let mut refused = 0;
    for s in open.iter_mut() {
        let mut buf = [0u8; 512];
        if let Ok(Ok(n)) = tokio::time::timeout(Duration::from_millis(20), s.read(&mut buf)).await {
            let said = String::from_utf8_lossy(&buf[..n]);
            refused += usize::from(said.starts_with("HTTP/1.1 503") && said.contains(limit));
        }
    }
    refused
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn slow_connections_from_one_address_shut_out_only_that_address() {
    let cfg = common::arc(common::config(""));
    common::init(&cfg).await;
    let limits = "[api.limits]\nconnections = 300\nconnections_per_ip = 100\nhead_timeout = \"2s\"\n";
    let srv = Serve::start(&cfg, limits, &[]);
    // The attacker, from 127.0.0.3: 400 connections, each trickling a request head.
    let mut open = trickling_heads(&srv, 400, |_| "127.0.0.3".parse().unwrap()).await;
    // Past its 100 the attacker's connections are answered 503 and closed.
    let refused = refused_with(&mut open, "api.limits.connections_per_ip").await;
    assert!(refused >= 290, "only {refused} of the attacker's 300 extra connections were refused");
    // B, from another address, is served at once while the attacker trickles.
    let b = client(&key(&cfg, "globex").await, "127.0.0.2");
    let trickle = async {
        for _ in 0..4 {
            for s in open.iter_mut() {
                let _ = s.write_all(b"X").await;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    };
    let (_, (s, body, secs)) = tokio::join!(trickle, b_submits(&b, &srv.base));
    assert_eq!(s, StatusCode::CREATED, "{body}");
    assert!(secs < 5.0, "B's submission took {secs:.1} s beside the slow connections");
    // The trickled heads are cut at head_timeout (2 s), not at idle_timeout (60 s).
    let mut closed = 0;
    for s in open.iter_mut().take(100) {
        let mut buf = [0u8; 256];
        let end = tokio::time::timeout(Duration::from_secs(5), async {
            loop {
                match s.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {}
                }
            }
        });
        closed += usize::from(end.await.is_ok());
    }
    assert!(closed >= 95, "only {closed} of 100 trickling connections were closed by head_timeout");
}

/// One client with many addresses of one network (20 loopback aliases 127.0.0.10-29,
/// as an IPv6 /64 would be): each address stays under its own share, the network is held
/// to its prefix's share, and a client on another network is served at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn many_addresses_of_one_network_are_held_to_its_share() {
    let cfg = common::arc(common::config(""));
    common::init(&cfg).await;
    let limits = "[api.limits]\nconnections = 1000\nconnections_per_ip = 100\nconnections_per_prefix = 150\n";
    let srv = Serve::start(&cfg, limits, &[]);
    let mut open = trickling_heads(&srv, 400, |i| format!("127.0.0.{}", 10 + i % 20).parse().unwrap()).await;
    let refused = refused_with(&mut open, "api.limits.connections_per_prefix").await;
    // 20 connections per alias, far under 100 each: only the network's 150 holds them.
    assert!(refused >= 240, "only {refused} of the network's 250 extra connections were refused for its prefix");
    let b = client(&key(&cfg, "globex").await, "127.0.1.2");
    let (s, body, secs) = b_submits(&b, &srv.base).await;
    assert_eq!(s, StatusCode::CREATED, "{body}");
    assert!(secs < 5.0, "another network's submission took {secs:.1} s");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_keys_reads_in_a_loop_are_throttled_and_another_key_is_not() {
    let mut c = common::config("");
    c.api.limits.requests_per_key = 20;
    c.api.limits.requests_per_tenant = 40;
    let cfg = common::arc(c);
    common::init(&cfg).await;
    let (base, _stop) = common::serve_api(&cfg).await;
    let a = client(&key(&cfg, "acme").await, "127.0.0.1");
    let b = client(&key(&cfg, "globex").await, "127.0.0.1");
    let (mut a_codes, mut b_codes) = (std::collections::BTreeMap::new(), std::collections::BTreeMap::new());
    let stop = Instant::now() + Duration::from_secs(3);
    let a_loop = async {
        while Instant::now() < stop {
            let id = uuid::Uuid::now_v7();
            let r = a.get(format!("{base}/v1/jobs/{id}")).send().await.unwrap();
            if r.status() == StatusCode::TOO_MANY_REQUESTS {
                assert!(r.headers().contains_key("retry-after"));
            }
            *a_codes.entry(r.status().as_u16()).or_insert(0) += 1;
        }
    };
    let b_loop = async {
        while Instant::now() < stop {
            let id = uuid::Uuid::now_v7();
            let r = b.get(format!("{base}/v1/jobs/{id}")).send().await.unwrap();
            *b_codes.entry(r.status().as_u16()).or_insert(0) += 1;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    tokio::join!(a_loop, b_loop);
    let a_served = a_codes.get(&404).copied().unwrap_or(0);
    assert!(a_served <= 20 * 3 + 40 + 5, "A's reads were not throttled: {a_codes:?}");
    assert!(a_codes.get(&429).copied().unwrap_or(0) > 0, "{a_codes:?}");
    assert_eq!(b_codes.get(&429), None, "B was throttled by A's reads: {b_codes:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_replicas_admit_one_tenant_at_its_configured_rate() {
    // Tenant "ratey" at 30 jobs/s, served by three processes behind a round robin.
    let cfg = common::arc(common::config("[tenants.ratey]\ntier = \"standard\"\nrate_per_sec = 30\n"));
    common::init(&cfg).await;
    let replicas: Vec<Serve> = (0..3).map(|_| Serve::start(&cfg, "", &["--replicas", "3"])).collect();
    let c = Arc::new(client(&key(&cfg, "ratey").await, "127.0.0.1"));
    let seconds = 10.0;
    let stop = Instant::now() + Duration::from_secs_f64(seconds);
    let clients = (0..6).map(|i| {
        let (c, base) = (c.clone(), replicas[i % 3].base.clone());
        tokio::spawn(async move {
            let mut accepted = 0u32;
            while Instant::now() < stop {
                let r = c.post(format!("{base}/v1/jobs")).json(&json!({"job_type": "echo"})).send().await.unwrap();
                match r.status() {
                    StatusCode::CREATED => accepted += 1,
                    StatusCode::TOO_MANY_REQUESTS => tokio::time::sleep(Duration::from_millis(20)).await,
                    s => panic!("unexpected {s}: {:?}", r.text().await),
                }
            }
            accepted
        })
    });
    let accepted: u32 = futures::future::join_all(clients).await.into_iter().map(Result::unwrap).sum();
    // The rate over the run, plus one burst (each replica's bucket starts full).
    let expected = 30.0 * seconds + 30.0;
    let off = (f64::from(accepted) - expected).abs() / expected;
    eprintln!("three replicas admitted {accepted} jobs of one 30/s tenant in {seconds} s (expected ~{expected})");
    assert!(off <= 0.10, "admitted {accepted}, {:.0}% off the configured {expected}", off * 100.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_says_busy_when_every_connection_is_taken_and_stays_ready() {
    let mut c: Config = common::config("");
    c.api.limits.connections = 20;
    c.api.limits.connections_per_ip = 20;
    c.api.limits.idle_timeout = DurationMs::secs(30);
    let cfg = common::arc(c);
    common::init(&cfg).await;
    let state = fairway::api::ApiState::connect(cfg.clone(), None).await.expect("API state");
    let ready = state.readiness_check();
    assert_eq!(ready().await, Ok(()));
    let ops = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let readyz = format!("http://{}/readyz", ops.local_addr().unwrap());
    let ops_router = fairway::api::ops_router(state.clone());
    tokio::spawn(async move { axum::serve(ops, ops_router).await });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(fairway::api::serve(listener, state, async move {
        let _ = rx.await;
    }));
    let probe = || async {
        let r = reqwest::get(&readyz).await.expect("/readyz answers");
        (r.status(), r.text().await.unwrap())
    };
    let mut held = Vec::new();
    for _ in 0..20 {
        held.push(tokio::net::TcpStream::connect(addr).await.unwrap());
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Busy is still ready: a flood that fills every replica does not empty the Service.
    let (status, body) = probe().await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(body.starts_with("ready (busy: ") && body.contains("api.limits.connections"), "{body}");
    assert_eq!(ready().await, Ok(()), "the store and broker still answer");
    drop(held);
    let deadline = Instant::now() + Duration::from_secs(5);
    while probe().await.1 != "ready\n" {
        assert!(Instant::now() < deadline, "still busy after the connections closed");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let _ = stop.send(());
}

/// One HTTP/2 frame: its 9-byte header (length, type, flags, stream) and payload.
fn h2_frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len() as u32;
    let mut f = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
    f.extend_from_slice(&stream.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// The payload of the first whole HEADERS frame of `stream` in `bytes` (frames from the
/// start).
fn h2_headers_of(mut bytes: &[u8], stream: u32) -> Option<&[u8]> {
    while bytes.len() >= 9 {
        let len = (usize::from(bytes[0]) << 16) | (usize::from(bytes[1]) << 8) | usize::from(bytes[2]);
        let id = u32::from_be_bytes([bytes[5], bytes[6], bytes[7], bytes[8]]) & 0x7fff_ffff;
        let payload = bytes.get(9..9 + len)?;
        if bytes[3] == H2_HEADERS && id == stream && !payload.is_empty() {
            return Some(payload);
        }
        bytes = &bytes[9 + len..];
    }
    None
}

const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const H2_HEADERS: u8 = 0x1;
const H2_SETTINGS: u8 = 0x4;
const H2_PING: u8 = 0x6;
const H2_CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;

/// Reads `s` until the server closes it (or `within` passes): how long it took, and
/// everything read.
async fn until_closed(s: &mut (impl tokio::io::AsyncRead + Unpin), within: Duration) -> (Option<f64>, Vec<u8>) {
    let start = Instant::now();
    let mut got = Vec::new();
    let closed = tokio::time::timeout(within, async {
        let mut buf = [0u8; 4096];
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    (closed.ok().map(|()| start.elapsed().as_secs_f64()), got)
}

/// HTTP/2 (prior knowledge, as `fairway serve` speaks it on plain TCP) has no header
/// read timer of hyper's: two clients that keep a connection busy without ever making a
/// request (PINGs every half second; a HEADERS frame whose CONTINUATIONs trickle a byte
/// at a time) are closed at `head_timeout`, while a real HTTP/2 request is answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn http2_frames_that_never_make_a_request_are_cut_at_head_timeout() {
    let cfg = common::arc(common::config(""));
    common::init(&cfg).await;
    let srv = Serve::start(&cfg, "[api.limits]\nhead_timeout = \"2s\"\nidle_timeout = \"60s\"\n", &[]);
    let addr = srv.base.trim_start_matches("http://").to_string();
    let open = || async {
        let mut s = tokio::net::TcpStream::connect(&addr).await.unwrap();
        s.write_all(&[H2_PREFACE, &h2_frame(H2_SETTINGS, 0, 0, &[])].concat()).await.unwrap();
        s
    };
    // A real request: GET /healthz (HPACK: :method GET, :scheme http, :path /healthz).
    let mut real = open().await;
    let mut head = vec![0x82, 0x86, 0x04, 8];
    head.extend_from_slice(b"/healthz");
    real.write_all(&h2_frame(H2_HEADERS, END_HEADERS | END_STREAM, 1, &head)).await.unwrap();
    let mut answered = Vec::new();
    let mut buf = [0u8; 4096];
    let deadline = Instant::now() + Duration::from_secs(5);
    let status = loop {
        if let Some(block) = h2_headers_of(&answered, 1) {
            break block[0];
        }
        assert!(Instant::now() < deadline, "no HTTP/2 answer within 5 s: {answered:?}");
        let n = tokio::time::timeout(Duration::from_secs(5), real.read(&mut buf)).await.unwrap().unwrap();
        assert!(n > 0, "the server closed a real HTTP/2 request's connection");
        answered.extend_from_slice(&buf[..n]);
    };
    // HPACK index 8 is `:status 200`.
    assert_eq!(status, 0x88, "GET /healthz over HTTP/2 was not answered 200: {answered:?}");

    // Each keeps writing every half second (each byte would reset the idle timer).
    let busy = |s: tokio::net::TcpStream, first: Vec<u8>, each: Vec<u8>| {
        let (mut rx, mut tx) = s.into_split();
        tokio::spawn(async move {
            let _ = tx.write_all(&first).await;
            for _ in 0..40 {
                if tx.write_all(&each).await.is_err() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        });
        async move { until_closed(&mut rx, Duration::from_secs(15)).await.0 }
    };
    // :method GET, :scheme http, :path /, then a literal header whose 1,000-byte value
    // never ends.
    let partial = [0x82, 0x86, 0x84, 0x00, 0x01, b'x', 0x7f, 0xe9, 0x06];
    let (pinged, trickled) = tokio::join!(
        busy(open().await, Vec::new(), h2_frame(H2_PING, 0, 0, &[7; 8])),
        busy(open().await, h2_frame(H2_HEADERS, 0, 1, &partial), h2_frame(H2_CONTINUATION, 0, 1, b"a")),
    );
    eprintln!("closed after: pinging {pinged:?} s, trickling a head {trickled:?} s (head_timeout 2 s, idle 60 s)");
    for (who, closed) in [("PINGs only", pinged), ("a trickled HEADERS frame", trickled)] {
        let secs = closed.unwrap_or_else(|| panic!("the connection sending {who} was still open after 15 s"));
        assert!((1.5..8.0).contains(&secs), "the connection sending {who} closed after {secs:.1} s");
    }
}

/// A tenant's keys on many connections (from many addresses, as behind a proxy or a NAT,
/// or one client's pool) hold at most `connections_per_tenant` of them; another tenant
/// is served at once, and a closed connection gives its share back.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_tenants_connections_are_held_to_its_share() {
    let cfg = common::arc(common::config(""));
    common::init(&cfg).await;
    let srv = Serve::start(&cfg, "[api.limits]\nconnections_per_tenant = 4\n", &[]);
    let addr: std::net::SocketAddr = srv.base.trim_start_matches("http://").parse().unwrap();
    let (acme1, acme2, globex) = (key(&cfg, "acme").await, key(&cfg, "acme").await, key(&cfg, "globex").await);
    // Each from an address of its own: the per-address bounds do not apply.
    let ask = |n: u8, key: String| async move {
        let sock = tokio::net::TcpSocket::new_v4().unwrap();
        sock.bind((std::net::Ipv4Addr::new(127, 0, 3, n), 0).into()).unwrap();
        let mut s = sock.connect(addr).await.unwrap();
        let req = format!("GET /v1/jobs/no-such-job HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {key}\r\n\r\n");
        s.write_all(req.as_bytes()).await.unwrap();
        let mut buf = vec![0u8; 4096];
        let n = tokio::time::timeout(Duration::from_secs(10), s.read(&mut buf)).await.unwrap().unwrap();
        (s, String::from_utf8_lossy(&buf[..n]).to_string())
    };
    let mut held = Vec::new();
    for i in 0..4 {
        let (s, said) = ask(10 + i, if i % 2 == 0 { acme1.clone() } else { acme2.clone() }).await;
        assert!(said.starts_with("HTTP/1.1 404"), "acme's connection {i}: {said}");
        held.push(s);
    }
    let (mut fifth, said) = ask(20, acme2.clone()).await;
    assert!(said.starts_with("HTTP/1.1 503"), "acme's fifth connection: {said}");
    assert!(said.contains("TOO_MANY_CONNECTIONS") && said.contains("api.limits.connections_per_tenant"), "{said}");
    assert!(said.to_lowercase().contains("retry-after: 1"), "{said}");
    assert!(until_closed(&mut fifth, Duration::from_secs(5)).await.0.is_some(), "the refused connection stays open");
    let (_g, said) = ask(21, globex).await;
    assert!(said.starts_with("HTTP/1.1 404"), "another tenant beside acme's connections: {said}");
    held.pop();
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let (_s, said) = ask(22, acme1.clone()).await;
        if said.starts_with("HTTP/1.1 404") {
            break;
        }
        assert!(Instant::now() < deadline, "acme's share was not given back when a connection closed: {said}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A body over its bound: answered 413, or refused unread (the server answered and closed
/// before the client had written it all, so the client's write failed).
fn refused(sent: reqwest::Result<reqwest::Response>, what: &str) {
    match sent {
        Ok(resp) => assert_eq!(resp.status(), StatusCode::PAYLOAD_TOO_LARGE, "{what}"),
        Err(e) => assert!(e.is_request() && format!("{e:?}").contains("BodyWrite"), "{what}: {e:?}"),
    }
}

/// Made-up API keys cost a store read each before any key is known, so their lookups are
/// bounded per client network: one network sending them gets 429 past its bound, while a
/// real key from another network is served throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn made_up_keys_are_bounded_per_network_and_a_real_key_is_served() {
    let mut c = common::config("");
    c.api.limits.key_lookups_per_prefix = 10;
    let cfg = common::arc(c);
    common::init(&cfg).await;
    let (base, _stop) = common::serve_api(&cfg).await;
    let real = client(&key(&cfg, "acme").await, "127.0.4.1");
    let (mut made_up, mut served) = (std::collections::BTreeMap::new(), std::collections::BTreeMap::new());
    let stop = Instant::now() + Duration::from_secs(3);
    let attack = async {
        while Instant::now() < stop {
            let hex = |n: usize| uuid::Uuid::new_v4().simple().to_string().repeat(2)[..n].to_string();
            let fake = client(&format!("fwk_{}_{}", hex(16), hex(64)), "127.0.3.1");
            let r = fake.get(format!("{base}/v1/jobs/{}", uuid::Uuid::now_v7())).send().await.unwrap();
            *made_up.entry(r.status().as_u16()).or_insert(0) += 1;
        }
    };
    let use_it = async {
        while Instant::now() < stop {
            let r = real.get(format!("{base}/v1/jobs/{}", uuid::Uuid::now_v7())).send().await.unwrap();
            *served.entry(r.status().as_u16()).or_insert(0) += 1;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    tokio::join!(attack, use_it);
    let looked_up = made_up.get(&401).copied().unwrap_or(0);
    assert!(looked_up <= 10 * 3 + 20 + 5, "made-up keys were looked up without a bound: {made_up:?}");
    assert!(made_up.get(&429).copied().unwrap_or(0) > 0, "{made_up:?}");
    assert_eq!(served.keys().copied().collect::<Vec<_>>(), vec![404], "the real key was served: {served:?}");
}
