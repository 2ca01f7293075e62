//! The API's listener: who may hold a connection, and for how long (`[api.limits]`).
//!
//! - At most `connections` open at once, `connections_per_ip` from one client address
//!   and `connections_per_prefix` from one network prefix (an IPv4 /24, an IPv6 /64:
//!   many addresses of one client count together). Past any, the new connection is
//!   answered `503` with `Retry-After: 1`
//!   (written within one second, at most [`REFUSING`] at once) and closed after the
//!   same linger as below (what the client sent is discarded for at most [`LINGER`], at
//!   most [`REFUSED_LINGERING`] at once and [`REFUSED_LINGERING_PER_PREFIX`] of one
//!   network prefix, past which it closes once answered): a client
//!   that holds many connections shuts out itself, not the others, and a full process
//!   says so instead of leaving callers in the kernel's accept queue.
//! - A request's head must arrive whole within `head_timeout`, however slowly its bytes
//!   trickle (hyper's header-read timer for HTTP/1; for both HTTP/1 and HTTP/2, bytes
//!   read while no request is open must become a request within it:
//!   [`super::connection`]); a connection without a byte read or written for
//!   `idle_timeout` is closed ([`IdleIo`]).
//! - A connection closed with a request body left unread (a body refused before it was
//!   read: `TOO_MANY_SUBMISSIONS`, `PAYLOAD_TOO_LARGE`) first sends its end and then
//!   reads and discards what the client still sends, until the client ends too or for
//!   at most [`LINGER`] (in an 8 KiB scratch buffer, holding its connection slot):
//!   closing with unread bytes would reset the connection, and a reset can destroy the
//!   refusal before the client reads it.
//! - Each tenant (all its keys) and admin key holds at most `connections_per_tenant` of
//!   the connections its requests came on ([`super::connection::Conn::carry`]).
//! - Saturation shows in `fairway_api_connections` (open), in
//!   `fairway_api_connections_refused_total{reason}` and in `/readyz`, which answers
//!   `ready (busy: ...)` while every connection is taken ([`Connections::saturated`]):
//!   still 200, so a flood that fills every replica does not take them all out of their
//!   Service at once.

use super::connection::{hold_until_sent, Conn};
use crate::core::api_limits::{client_prefix, ApiLimits, Bound, Busy, Usage};
use crate::metrics::{API_CONNECTIONS, API_CONNECTIONS_REFUSED};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::AsyncWriteExt;

/// Refusals being written at once; past it a refused connection is closed unanswered.
pub const REFUSING: usize = 256;
/// Refused connections lingering at once after their answer (a slot is taken once the
/// answer is written, and the write's slot is given back); past it a refused connection
/// is closed as soon as its answer is written, so one client holding its refused
/// connections open never takes the answers from the others.
pub const REFUSED_LINGERING: usize = 256;
/// Refused connections of one network prefix ([`client_prefix`]) lingering at once; past
/// it that client's next refused connections close once answered, so one client never
/// takes the lingering slots from the others.
pub const REFUSED_LINGERING_PER_PREFIX: usize = 8;
/// How long a refusal may take to write.
const REFUSAL_WRITE: Duration = Duration::from_secs(1);
/// How long a closing connection reads and discards what its client still sends.
pub const LINGER: Duration = Duration::from_secs(2);
/// Reads a lingering connection makes in one poll before it yields.
const LINGER_READS_PER_POLL: usize = 64;

/// What the per-prefix bound counts (and how its refusals are told apart).
const PER_PREFIX: &str = "connections from one network prefix";
/// What the per-owner bound counts.
pub const PER_OWNER: &str = "connections carrying one tenant's requests";

/// The open connections, per client address, per network prefix and in all.
pub struct Connections {
    usage: Mutex<Usage>,
    /// Per prefix ([`client_prefix`]); its total bound is `usage`'s.
    prefixes: Mutex<Usage>,
    /// Per key owner (a tenant, an admin key): the connections carrying its requests.
    owners: Arc<Mutex<Usage>>,
    most: u64,
    refusing: Arc<tokio::sync::Semaphore>,
    /// Refused connections lingering after their answer ([`REFUSED_LINGERING`], and
    /// per prefix [`REFUSED_LINGERING_PER_PREFIX`]).
    lingering: Arc<Lingering>,
}

/// The refused connections lingering after their answer, in all and per network prefix.
#[derive(Debug, Default)]
struct Lingering {
    /// Lingering connections per prefix (an entry only while it has one: at most
    /// [`REFUSED_LINGERING`] entries).
    by_prefix: Mutex<std::collections::HashMap<String, usize>>,
}

/// A lingering refused connection's place; given back when dropped.
#[derive(Debug)]
struct LingerSlot {
    lingering: Arc<Lingering>,
    prefix: String,
}

impl Lingering {
    /// A place to linger for a refused connection of `prefix`, unless [`REFUSED_LINGERING`]
    /// linger already, or [`REFUSED_LINGERING_PER_PREFIX`] of that prefix.
    fn take(self: &Arc<Self>, prefix: &str) -> Option<LingerSlot> {
        let mut by = self.by_prefix.lock().expect("lingering");
        let total: usize = by.values().sum();
        let mine = by.get(prefix).copied().unwrap_or(0);
        if total >= REFUSED_LINGERING || mine >= REFUSED_LINGERING_PER_PREFIX {
            return None;
        }
        by.insert(prefix.to_string(), mine + 1);
        Some(LingerSlot { lingering: self.clone(), prefix: prefix.to_string() })
    }
}

impl Drop for LingerSlot {
    fn drop(&mut self) {
        let mut by = self.lingering.by_prefix.lock().expect("lingering");
        if let Some(n) = by.get_mut(&self.prefix) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                by.remove(&self.prefix);
            }
        }
    }
}

/// One open connection's place; given back when dropped.
pub struct Held {
    conns: Arc<Connections>,
    ip: String,
    prefix: String,
}

impl Held {
    /// The network prefix the connection came from ([`client_prefix`]).
    pub fn prefix(&self) -> &str {
        &self.prefix
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        let open = {
            let mut u = self.conns.usage.lock().expect("connections");
            u.give_back(&self.ip, 0);
            u.held("").1
        };
        self.conns.prefixes.lock().expect("connections").give_back(&self.prefix, 0);
        metrics::gauge!(API_CONNECTIONS).set(open as f64);
    }
}

impl Connections {
    pub fn new(limits: &ApiLimits) -> Arc<Connections> {
        let count = Bound { per_key: limits.connections_per_ip, total: limits.connections };
        Arc::new(Connections {
            usage: Mutex::new(Usage::new("connections", count, Bound::NONE)),
            prefixes: Mutex::new(Usage::new(
                PER_PREFIX,
                Bound { per_key: limits.connections_per_prefix, total: limits.connections },
                Bound::NONE,
            )),
            owners: Arc::new(Mutex::new(Usage::new(
                PER_OWNER,
                Bound { per_key: limits.connections_per_tenant, total: u64::MAX },
                Bound::NONE,
            ))),
            most: limits.connections,
            refusing: Arc::new(tokio::sync::Semaphore::new(REFUSING)),
            lingering: Arc::default(),
        })
    }

    /// A place for a connection from `ip`, or which bound refused it.
    pub fn admit(self: &Arc<Self>, ip: IpAddr) -> Result<Held, Busy> {
        let prefix = client_prefix(ip);
        let ip = ip.to_canonical().to_string();
        let open = {
            let mut u = self.usage.lock().expect("connections");
            u.take(&ip, 0)?;
            if let Err(busy) = self.prefixes.lock().expect("connections").take(&prefix, 0) {
                u.give_back(&ip, 0);
                return Err(busy);
            }
            u.held("").1
        };
        metrics::gauge!(API_CONNECTIONS).set(open as f64);
        Ok(Held { conns: self.clone(), ip, prefix })
    }

    /// The state of a connection given `held`.
    pub fn open(&self, held: Held) -> Arc<Conn> {
        Conn::new(held, self.owners.clone())
    }

    /// Why this process cannot take another connection, if it cannot (for `/readyz`).
    pub fn saturated(&self) -> Option<String> {
        let open = self.usage.lock().expect("connections").held("").1;
        (open >= self.most).then(|| {
            format!("the API holds {open} connections, its limit (api.limits.connections); new ones are refused 503")
        })
    }

    /// Answers a refused connection 503 and closes it (or just closes it when
    /// [`REFUSING`] refusals are being written already).
    fn refuse(&self, mut stream: tokio::net::TcpStream, peer: IpAddr, why: Busy) {
        let reason = match why {
            Busy::Key { what, .. } if what == PER_PREFIX => "per_prefix",
            Busy::Key { .. } => "per_ip",
            Busy::Total { .. } => "total",
        };
        metrics::counter!(API_CONNECTIONS_REFUSED, "reason" => reason).increment(1);
        let Ok(permit) = self.refusing.clone().try_acquire_owned() else { return };
        let (lingering, prefix) = (self.lingering.clone(), client_prefix(peer));
        let body = match why {
            Busy::Key { what, most, .. } if what == PER_PREFIX => format!(
                "{{\"error\":\"this client's network (its IPv4 /24 or IPv6 /64) holds {most} connections to the \
                 API, its limit (api.limits.connections_per_prefix); reuse kept-alive connections or close idle \
                 ones\",\"code\":\"TOO_MANY_CONNECTIONS\"}}"
            ),
            Busy::Key { most, .. } => format!(
                "{{\"error\":\"this client address holds {most} connections to the API, its limit \
                 (api.limits.connections_per_ip); reuse kept-alive connections or close idle ones\",\
                 \"code\":\"TOO_MANY_CONNECTIONS\"}}"
            ),
            Busy::Total { most, .. } => format!(
                "{{\"error\":\"the API holds {most} connections, its limit (api.limits.connections); retry after \
                 1s\",\"code\":\"TOO_MANY_CONNECTIONS\"}}"
            ),
        };
        let answer = format!(
            "HTTP/1.1 503 Service Unavailable\r\nretry-after: 1\r\ncontent-type: application/json\r\n\
             content-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        );
        tokio::spawn(async move {
            let answered = tokio::time::timeout(REFUSAL_WRITE, async {
                stream.write_all(answer.as_bytes()).await?;
                stream.shutdown().await
            })
            .await;
            drop(permit);
            if !matches!(answered, Ok(Ok(()))) {
                return;
            }
            // The request it carried was never read: closing on it would reset the
            // connection, and the reset can destroy the answer (see the module).
            if let Some(slot) = lingering.take(&prefix) {
                let _ = tokio::time::timeout(LINGER, discard(&mut stream)).await;
                drop(slot);
            }
        });
    }
}

/// Reads and drops what `stream` receives until the client ends or fails.
async fn discard(stream: &mut tokio::net::TcpStream) {
    use tokio::io::AsyncReadExt;
    let mut scratch = [0u8; 8192];
    while matches!(stream.read(&mut scratch).await, Ok(n) if n > 0) {}
}

/// Serves `router` on `listener` within `conns`' bounds until `shutdown` completes, then
/// waits for the connections in flight to finish.
pub async fn serve(
    listener: tokio::net::TcpListener,
    router: axum::Router,
    conns: Arc<Connections>,
    limits: &ApiLimits,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let mut http = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    http.http1().timer(TokioTimer::new()).header_read_timeout(Duration::from_millis(limits.head_timeout.0 as u64));
    let idle = Duration::from_millis(limits.idle_timeout.0 as u64);
    let head = Duration::from_millis(limits.head_timeout.0 as u64);
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Out of file descriptors or a connection reset before accept:
                    // wait a little rather than spin.
                    tracing::warn!("accepting an API connection failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let held = match conns.admit(peer.ip()) {
            Ok(h) => h,
            Err(why) => {
                conns.refuse(stream, peer.ip(), why);
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let conn = conns.open(held);
        let io = TokioIo::new(IdleIo::new(stream, Deadlines { idle, head }, conn.clone()));
        let service = hyper_util::service::TowerToHyperService::new(counted(router.clone(), conn));
        let conn = graceful.watch(http.serve_connection_with_upgrades(io, service).into_owned());
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!("API connection ended: {e}");
            }
        });
    }
    drop(listener);
    graceful.shutdown().await;
    Ok(())
}

/// `router` with each request counted open on `conn` (and given it in its
/// extensions) until its response body is sent.
fn counted(
    router: axum::Router,
    conn: Arc<Conn>,
) -> impl tower::Service<
    axum::extract::Request<hyper::body::Incoming>,
    Response = axum::response::Response,
    Error = std::convert::Infallible,
    Future = impl Future<Output = Result<axum::response::Response, std::convert::Infallible>> + Send,
> + Clone {
    tower::service_fn(move |mut req: axum::extract::Request<hyper::body::Incoming>| {
        let open = conn.start();
        req.extensions_mut().insert(conn.clone());
        let resp = tower::ServiceExt::oneshot(router.clone(), req);
        async move { Ok(hold_until_sent(resp.await?, open)) }
    })
}

/// How long a connection may go without progress, and without a request head.
#[derive(Clone, Copy)]
struct Deadlines {
    idle: Duration,
    head: Duration,
}

/// A connection that fails with `TimedOut` after `idle` without progress either way, or
/// `head` after bytes were read while no request was open without one starting.
pub struct IdleIo {
    io: tokio::net::TcpStream,
    deadlines: Deadlines,
    timer: Pin<Box<tokio::time::Sleep>>,
    conn: Arc<Conn>,
    /// While a head is awaited: the connection's requests started when it began to be.
    head_since: Option<u64>,
    head_timer: Pin<Box<tokio::time::Sleep>>,
    /// Once its end is sent: until when it reads and discards the client's bytes.
    linger: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl IdleIo {
    fn new(io: tokio::net::TcpStream, deadlines: Deadlines, conn: Arc<Conn>) -> Self {
        IdleIo {
            io,
            deadlines,
            timer: Box::pin(tokio::time::sleep(deadlines.idle)),
            conn,
            head_since: None,
            head_timer: Box::pin(tokio::time::sleep(deadlines.head)),
            linger: None,
        }
    }

    /// After its end is sent: discards what the client still sends until it ends too,
    /// fails, or `linger` passes.
    fn poll_linger(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        let mut scratch = [0u8; 8192];
        for _ in 0..LINGER_READS_PER_POLL {
            let mut buf = tokio::io::ReadBuf::new(&mut scratch);
            match tokio::io::AsyncRead::poll_read(Pin::new(&mut self.io), cx, &mut buf) {
                Poll::Ready(Ok(())) if buf.filled().is_empty() => return Poll::Ready(()),
                Poll::Ready(Ok(())) => continue,
                Poll::Ready(Err(_)) => return Poll::Ready(()),
                Poll::Pending => {
                    return match self.linger.as_mut().map(|t| t.as_mut().poll(cx)) {
                        Some(Poll::Pending) => Poll::Pending,
                        _ => Poll::Ready(()),
                    }
                }
            }
        }
        cx.waker().wake_by_ref();
        Poll::Pending
    }

    /// After bytes were read: a head is awaited from now when no request is open.
    fn read_some(&mut self) {
        if self.head_since.is_some_and(|n| self.conn.still_waiting(n)) {
            return;
        }
        self.head_since = self.conn.head_wait();
        if self.head_since.is_some() {
            self.head_timer.as_mut().reset(tokio::time::Instant::now() + self.deadlines.head);
        }
    }

    /// After an inner poll: progress moves the idle deadline; while pending, a deadline
    /// passing turns into an error.
    fn check<T>(&mut self, cx: &mut Context<'_>, r: Poll<std::io::Result<T>>) -> Poll<std::io::Result<T>> {
        match r {
            Poll::Ready(r) => {
                self.timer.as_mut().reset(tokio::time::Instant::now() + self.deadlines.idle);
                Poll::Ready(r)
            }
            Poll::Pending => {
                let timed_out = |what| Poll::Ready(Err(std::io::Error::new(std::io::ErrorKind::TimedOut, what)));
                if self.timer.as_mut().poll(cx).is_ready() {
                    return timed_out("connection idle longer than api.limits.idle_timeout");
                }
                if self.head_since.is_some_and(|n| self.conn.still_waiting(n)) {
                    if self.head_timer.as_mut().poll(cx).is_ready() {
                        return timed_out("bytes without a request head for longer than api.limits.head_timeout");
                    }
                } else {
                    self.head_since = None;
                }
                Poll::Pending
            }
        }
    }
}

impl tokio::io::AsyncRead for IdleIo {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let r = Pin::new(&mut this.io).poll_read(cx, buf);
        if matches!(r, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            this.read_some();
        }
        this.check(cx, r)
    }
}

impl tokio::io::AsyncWrite for IdleIo {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.io).poll_write(cx, buf);
        this.check(cx, r)
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.io).poll_flush(cx);
        this.check(cx, r)
    }
    /// Sends the end, then lingers ([`LINGER`]) so unread bytes do not reset the
    /// connection before the client reads the answer.
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        if this.linger.is_none() {
            std::task::ready!(Pin::new(&mut this.io).poll_shutdown(cx))?;
            this.linger = Some(Box::pin(tokio::time::sleep(LINGER)));
        }
        this.poll_linger(cx).map(Ok)
    }
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.io).poll_write_vectored(cx, bufs);
        this.check(cx, r)
    }
    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One network prefix lingers at most `REFUSED_LINGERING_PER_PREFIX` refused
    /// connections; others still get theirs, up to `REFUSED_LINGERING` in all, and a
    /// place given back is free again (its prefix forgotten once it holds none).
    #[test]
    fn one_client_lingers_only_its_share_of_refused_connections() {
        let lingering = Arc::new(Lingering::default());
        let mine: Vec<LingerSlot> =
            std::iter::from_fn(|| lingering.take("10.0.0.0/24")).take(REFUSED_LINGERING).collect();
        assert_eq!(mine.len(), REFUSED_LINGERING_PER_PREFIX, "one prefix past its share");
        let others: Vec<LingerSlot> = (0..REFUSED_LINGERING)
            .map_while(|i| lingering.take(&format!("10.{}.{}.0/24", i / 256 + 1, i % 256)))
            .collect();
        assert_eq!(others.len(), REFUSED_LINGERING - REFUSED_LINGERING_PER_PREFIX, "the total bound");
        assert!(lingering.take("10.9.9.0/24").is_none(), "nothing past the total");
        drop(mine);
        assert!(lingering.take("10.0.0.0/24").is_some(), "places given back are free again");
        drop(others);
        assert_eq!(lingering.by_prefix.lock().unwrap().len(), 0, "prefixes holding none are forgotten");
    }

    /// Bodies refused before they are read (8 at once, 8 MiB each, far past the
    /// sockets' buffers) reach the client as the refusal, not as a reset.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_body_refused_unread_reaches_the_client_as_its_answer() {
        let refuse = || async { (axum::http::StatusCode::TOO_MANY_REQUESTS, "refused unread") };
        let router = axum::Router::new().route("/", axum::routing::post(refuse));
        let limits = ApiLimits::default();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/", listener.local_addr().unwrap());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(async move {
            let conns = Connections::new(&limits);
            serve(listener, router, conns, &limits, async move {
                let _ = stopped.await;
            })
            .await
        });
        let body = bytes::Bytes::from(vec![b'0'; 8 << 20]);
        let client = reqwest::Client::new();
        for round in 0..3 {
            let sends = (0..8).map(|_| {
                let (client, url, body) = (client.clone(), url.clone(), body.clone());
                tokio::spawn(async move { client.post(url).body(body).send().await.map(|r| r.status()) })
            });
            for answer in futures::future::join_all(sends).await {
                let answer = answer.unwrap().map_err(|e| format!("{e:?}"));
                assert_eq!(answer, Ok(reqwest::StatusCode::TOO_MANY_REQUESTS), "round {round}");
            }
        }
        let _ = stop.send(());
        server.await.unwrap().unwrap();
    }

    /// Connections refused past the per-address bound, each carrying a large body,
    /// reach the client as the 503, not as a reset.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_connection_refused_with_its_body_unread_reaches_the_client_as_the_503() {
        let router = axum::Router::new().route("/", axum::routing::post(|| async { "served" }));
        let limits = ApiLimits { connections_per_ip: 1, ..Default::default() };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let conns = Connections::new(&limits);
        let served = conns.clone();
        let server = tokio::spawn(async move {
            serve(listener, router, served, &limits, async move {
                let _ = stopped.await;
            })
            .await
        });
        let holder = tokio::net::TcpStream::connect(addr).await.unwrap();
        for _ in 0..5_000 {
            if conns.usage.lock().unwrap().held("").1 == 1 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        assert_eq!(conns.usage.lock().unwrap().held("").1, 1, "the holder's connection is admitted");
        // A raw client that writes its request whole, then reads, as most HTTP/1.1
        // clients do: a reset while it writes is what such a client reports. (An HTTP
        // client library may also fail on an answer that arrives before it wrote anything,
        // which is not what this test is about.)
        let body = Arc::new(vec![b'0'; 8 << 20]);
        for round in 0..3 {
            let sends = (0..4).map(|_| {
                let body = body.clone();
                tokio::spawn(async move {
                    use tokio::io::{AsyncReadExt, AsyncWriteExt};
                    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
                    let head = format!("POST / HTTP/1.1\r\nhost: x\r\ncontent-length: {}\r\n\r\n", body.len());
                    s.write_all(head.as_bytes()).await.map_err(|e| format!("writing the head: {e}"))?;
                    s.write_all(&body).await.map_err(|e| format!("writing the body: {e}"))?;
                    let mut answer = Vec::new();
                    s.read_to_end(&mut answer).await.map_err(|e| format!("reading the answer: {e}"))?;
                    Ok::<_, String>(String::from_utf8_lossy(&answer).into_owned())
                })
            });
            for answer in futures::future::join_all(sends).await {
                let answer = answer.unwrap();
                let status = answer.as_deref().map(|a| a.lines().next().unwrap_or_default().to_string());
                assert_eq!(status.as_deref(), Ok("HTTP/1.1 503 Service Unavailable"), "round {round}");
            }
        }
        drop(holder);
        let _ = stop.send(());
        server.await.unwrap().unwrap();
    }

    /// The server's end of a connection from `listener`, wrapped as the API wraps it.
    async fn accepted(listener: &tokio::net::TcpListener, conns: &Arc<Connections>) -> IdleIo {
        let (stream, peer) = listener.accept().await.unwrap();
        let conn = conns.open(conns.admit(peer.ip()).unwrap());
        let long = Duration::from_secs(600);
        IdleIo::new(stream, Deadlines { idle: long, head: long }, conn)
    }

    /// After its answer, a connection whose client keeps sending is closed once
    /// [`LINGER`] passes (its slot with it); one whose client ends is let go at once.
    #[tokio::test(start_paused = true)]
    async fn the_linger_ends_at_its_bound_or_when_the_client_ends() {
        use tokio::io::AsyncWriteExt;
        let conns = Connections::new(&ApiLimits::default());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();

        let mut chatty = tokio::net::TcpStream::connect(addr).await.unwrap();
        let mut io = accepted(&listener, &conns).await;
        let trickle = tokio::spawn(async move {
            while chatty.write_all(b"x").await.is_ok() {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
        let t0 = tokio::time::Instant::now();
        io.shutdown().await.unwrap();
        let took = t0.elapsed();
        assert!(took >= LINGER && took < LINGER + Duration::from_millis(500), "lingered {took:?}");
        drop(io);
        assert_eq!(conns.usage.lock().unwrap().held("").1, 0, "its slot is given back");
        trickle.abort();

        let mut done = tokio::net::TcpStream::connect(addr).await.unwrap();
        let mut io = accepted(&listener, &conns).await;
        done.shutdown().await.unwrap();
        let t0 = tokio::time::Instant::now();
        io.shutdown().await.unwrap();
        assert!(t0.elapsed() < Duration::from_millis(100), "a client that ended is let go at once");
    }

    #[test]
    fn one_address_is_held_to_its_share_and_all_to_the_total() {
        let limits = ApiLimits { connections: 3, connections_per_ip: 2, ..Default::default() };
        let conns = Connections::new(&limits);
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let mapped: IpAddr = "::ffff:10.0.0.1".parse().unwrap();
        let first = conns.admit(a).unwrap();
        let _second = conns.admit(mapped).expect("same client over IPv6-mapped: its second");
        assert!(matches!(conns.admit(a), Err(Busy::Key { most: 2, .. })));
        let _other = conns.admit("10.0.0.2".parse().unwrap()).expect("another client is not shut out");
        assert!(conns.saturated().is_some());
        assert!(matches!(conns.admit("10.0.0.3".parse().unwrap()), Err(Busy::Total { most: 3, .. })));
        drop(first);
        assert!(conns.saturated().is_none());
        assert!(conns.admit(a).is_ok());
    }

    /// Many addresses of one network (127.0.0.x aliases, one IPv6 /64) are held to the
    /// prefix's share together; a refused one takes nothing, and another network is
    /// not shut out.
    #[test]
    fn many_addresses_of_one_network_are_held_to_its_share() {
        let limits =
            ApiLimits { connections: 10, connections_per_ip: 2, connections_per_prefix: 3, ..Default::default() };
        let conns = Connections::new(&limits);
        let held: Vec<Held> =
            (1..=3).map(|i| conns.admit(format!("2001:db8::{i}").parse().unwrap()).unwrap()).collect();
        let refused = conns.admit("2001:db8::ffff:1".parse().unwrap());
        assert!(matches!(refused, Err(Busy::Key { what: PER_PREFIX, most: 3, .. })), "{:?}", refused.err());
        assert_eq!(conns.usage.lock().unwrap().held("").1, 3, "the refused one holds nothing");
        let _elsewhere = conns.admit("2001:db8:0:1::1".parse().unwrap()).expect("another /64");
        let _v4: Vec<Held> = (1..=3).map(|i| conns.admit(format!("127.0.0.{i}").parse().unwrap()).unwrap()).collect();
        assert!(conns.admit("127.0.0.9".parse().unwrap()).is_err(), "loopback aliases are one network");
        drop(held);
        assert!(conns.admit("2001:db8::9".parse().unwrap()).is_ok());
    }
}
