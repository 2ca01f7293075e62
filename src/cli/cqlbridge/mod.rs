//! A loopback TCP bridge that lets native-protocol-v4 drivers (the `scylla` crate
//! speaks only v4) talk to Apache Cassandra 2.1, which speaks v1-v3.
//!
//! It exists for local development and integration tests only (`scripts/services`
//! starts it in front of Cassandra 2.1, because ScyllaDB cannot run on the dev
//! machines). Production talks to ScyllaDB directly; nothing in the service depends on
//! this module.
//!
//! Each client connection gets its own upstream connection; bytes are cut into frames
//! and each frame goes through a pure per-connection [`Conversation`]: `frame` has the
//! v3/v4 differences, `system_local` the patch for the driver's topology query (2.1.0's
//! `system.local` lacks `rpc_address`). Driver compression must stay off.
//!
//! Run it as `fairway cql-bridge --listen 127.0.0.1:19042 --upstream 127.0.0.1:19142`
//! (`scripts/services up` does). Point sessions at it with
//! `fetch_schema_metadata(false)`: Cassandra 2.1 has no `system_schema` keyspace.

mod conversation;
mod frame;
mod system_local;

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::BytesMut;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::task::JoinSet;

use conversation::{Conversation, PatchedStatements};
use frame::{FrameError, Request};

/// Read buffer size per direction.
const READ_CHUNK: usize = 64 * 1024;
/// How long to wait for a client's first frame when the upstream is unreachable, so
/// the client gets a readable ERROR instead of a bare connection reset.
const REFUSE_WAIT: Duration = Duration::from_secs(5);

/// Why one bridged connection ended abnormally.
#[derive(Debug, thiserror::Error)]
pub enum BridgeError {
    #[error("i/o: {0}")]
    Io(#[from] io::Error),
    #[error("protocol: {0}")]
    Frame(#[from] FrameError),
}

/// Binds `listen` and bridges every accepted connection to `upstream` until `shutdown`
/// completes; then stops accepting and closes open connections.
pub async fn run(
    listen: SocketAddr,
    upstream: SocketAddr,
    shutdown: impl Future<Output = ()> + Send,
) -> io::Result<()> {
    let listener = TcpListener::bind(listen).await?;
    serve(listener, upstream, shutdown).await
}

/// Like [`run`] with an already bound listener (tests bind 127.0.0.1:0).
pub async fn serve(
    listener: TcpListener,
    upstream: SocketAddr,
    shutdown: impl Future<Output = ()> + Send,
) -> io::Result<()> {
    tracing::info!(listen = %listener.local_addr()?, %upstream, "cql bridge (protocol v4 -> v3) listening");
    tokio::pin!(shutdown);
    let mut conns = JoinSet::new();
    let statements = PatchedStatements::default();
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok((client, peer)) => {
                    let statements = statements.clone();
                    conns.spawn(async move {
                        tracing::debug!(%peer, "client connected");
                        match handle(client, upstream, statements).await {
                            Ok(()) => tracing::debug!(%peer, "client disconnected"),
                            Err(BridgeError::Io(e)) => tracing::debug!(%peer, error = %e, "connection ended"),
                            Err(e) => tracing::warn!(%peer, error = %e, "connection dropped"),
                        }
                    });
                }
                Err(e) => {
                    // E.g. out of file descriptors: back off instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            },
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
    // Drivers keep pooled connections open forever, so there is nothing to drain.
    tracing::info!(open = conns.len(), "cql bridge shutting down");
    conns.shutdown().await;
    Ok(())
}

async fn handle(client: TcpStream, upstream: SocketAddr, statements: PatchedStatements) -> Result<(), BridgeError> {
    client.set_nodelay(true)?;
    let server = match TcpStream::connect(upstream).await {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(%upstream, error = %e, "cannot reach upstream CQL server");
            let msg = format!("fairway cql-bridge: cannot reach upstream {upstream}: {e}");
            refuse(client, &msg).await;
            return Err(e.into());
        }
    };
    server.set_nodelay(true)?;
    // The address the client reached us at is what the driver must see as the node's.
    let conversation = Arc::new(Mutex::new(Conversation::new(client.local_addr()?.ip(), statements)));
    let (client_rd, client_wr) = client.into_split();
    let (server_rd, server_wr) = server.into_split();
    // ERROR frames the bridge itself answers with (refused v4-only features).
    let (reply_tx, reply_rx) = mpsc::channel(16);

    let requests = pump_requests(client_rd, server_wr, conversation.clone(), reply_tx);
    let responses = pump_responses(server_rd, client_wr, conversation, reply_rx);
    tokio::pin!(requests, responses);
    tokio::select! {
        r = &mut responses => r,
        // Client finished sending (half-close): keep relaying what the server still sends.
        r = &mut requests => { r?; responses.await }
    }
}

/// Client -> server.
async fn pump_requests(
    mut rd: OwnedReadHalf,
    mut wr: OwnedWriteHalf,
    conversation: Arc<Mutex<Conversation>>,
    replies: mpsc::Sender<BytesMut>,
) -> Result<(), BridgeError> {
    let mut buf = BytesMut::with_capacity(READ_CHUNK);
    let mut out = BytesMut::with_capacity(READ_CHUNK);
    loop {
        if buf.capacity() - buf.len() < READ_CHUNK / 8 {
            buf.reserve(READ_CHUNK);
        }
        if rd.read_buf(&mut buf).await? == 0 {
            if !buf.is_empty() {
                tracing::debug!(pending = buf.len(), "client closed mid-frame");
            }
            let _ = wr.shutdown().await;
            return Ok(());
        }
        while let Some(f) = frame::split_frame(&mut buf)? {
            // Recorded before the frame goes upstream, so before its response arrives.
            let verdict = lock(&conversation).on_request(f)?;
            match verdict {
                Request::Forward(f) => out.extend_from_slice(&f),
                Request::Reject(err) => {
                    tracing::warn!("refused a v4-only request feature (see ERROR sent to client)");
                    if replies.send(err).await.is_err() {
                        return Ok(());
                    }
                }
            }
        }
        if !out.is_empty() {
            wr.write_all(&out).await?;
            out.clear();
        }
    }
}

/// Server -> client, plus the bridge's own ERROR replies.
async fn pump_responses(
    mut rd: OwnedReadHalf,
    mut wr: OwnedWriteHalf,
    conversation: Arc<Mutex<Conversation>>,
    mut replies: mpsc::Receiver<BytesMut>,
) -> Result<(), BridgeError> {
    let mut buf = BytesMut::with_capacity(READ_CHUNK);
    let mut out = BytesMut::with_capacity(READ_CHUNK);
    let mut replies_open = true;
    loop {
        if buf.capacity() - buf.len() < READ_CHUNK / 8 {
            buf.reserve(READ_CHUNK);
        }
        tokio::select! {
            // `read_buf` is cancel safe: bytes are either in `buf` or still in the socket.
            n = rd.read_buf(&mut buf) => {
                if n? == 0 {
                    let _ = wr.shutdown().await;
                    return Ok(());
                }
                {
                    let mut conv = lock(&conversation);
                    while let Some(f) = frame::split_frame(&mut buf)? {
                        out.extend_from_slice(&conv.on_response(f)?);
                    }
                }
                if !out.is_empty() {
                    wr.write_all(&out).await?;
                    out.clear();
                }
            }
            reply = replies.recv(), if replies_open => match reply {
                Some(err) => wr.write_all(&err).await?,
                None => replies_open = false,
            },
        }
    }
}

fn lock(c: &Mutex<Conversation>) -> std::sync::MutexGuard<'_, Conversation> {
    // The state is plain data; a panic elsewhere cannot leave it half-updated.
    c.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Answers the client's first frame with an ERROR carrying `msg`, then closes.
async fn refuse(mut client: TcpStream, msg: &str) {
    let mut buf = BytesMut::with_capacity(1024);
    let first = tokio::time::timeout(REFUSE_WAIT, async {
        loop {
            if let Some(f) = frame::split_frame(&mut buf)? {
                return Ok::<_, BridgeError>(Some(f));
            }
            if client.read_buf(&mut buf).await? == 0 {
                return Ok(None);
            }
        }
    })
    .await;
    if let Ok(Ok(Some(f))) = first {
        let version = match frame::version(&f) {
            v @ 1..=5 => v,
            _ => frame::CLIENT_VERSION,
        };
        let err = frame::error_frame(version, frame::stream(&f), frame::ERR_SERVER, msg);
        let _ = client.write_all(&err).await;
    }
    let _ = client.shutdown().await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::BufMut;
    use tokio::sync::oneshot;

    fn frame(version: u8, stream: i16, op: u8, body: &[u8]) -> Vec<u8> {
        let mut f = BytesMut::new();
        f.put_u8(version);
        f.put_u8(0);
        f.put_i16(stream);
        f.put_u8(op);
        f.put_u32(body.len() as u32);
        f.extend_from_slice(body);
        f.to_vec()
    }

    async fn read_frame(s: &mut TcpStream) -> Vec<u8> {
        let mut header = [0u8; 9];
        s.read_exact(&mut header).await.unwrap();
        let len = u32::from_be_bytes([header[5], header[6], header[7], header[8]]) as usize;
        let mut body = vec![0u8; len];
        s.read_exact(&mut body).await.unwrap();
        let mut f = header.to_vec();
        f.extend_from_slice(&body);
        f
    }

    async fn start_bridge(
        upstream: SocketAddr,
    ) -> (SocketAddr, oneshot::Sender<()>, tokio::task::JoinHandle<io::Result<()>>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = oneshot::channel::<()>();
        let task = tokio::spawn(serve(listener, upstream, async {
            let _ = rx.await;
        }));
        (addr, tx, task)
    }

    /// A fake v3 server: answers each request on the same stream with a RESULT Void,
    /// after pushing one EVENT; the client writes its frames split into tiny pieces.
    #[tokio::test]
    async fn bridges_split_frames_both_ways() {
        let upstream = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let up_addr = upstream.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let (mut s, _) = upstream.accept().await.unwrap();
            let req = read_frame(&mut s).await;
            assert_eq!(req[0], 0x03, "request version lowered");
            let stream = i16::from_be_bytes([req[2], req[3]]);
            let mut reply = frame(0x83, -1, 0x0C, b"\x00\x00");
            reply.extend(frame(0x83, stream, 0x08, b"\x00\x00\x00\x01"));
            // Trickle the two frames out byte by byte.
            for b in reply {
                s.write_all(&[b]).await.unwrap();
            }
            req
        });
        let (addr, stop, bridge) = start_bridge(up_addr).await;

        let mut client = TcpStream::connect(addr).await.unwrap();
        let query = frame(0x04, 42, 0x07, b"\x00\x00\x00\x08SELECT 1\x00\x01\x00");
        for chunk in query.chunks(3) {
            client.write_all(chunk).await.unwrap();
            tokio::task::yield_now().await;
        }
        let event = read_frame(&mut client).await;
        assert_eq!((event[0], event[4]), (0x84, 0x0C));
        let result = read_frame(&mut client).await;
        assert_eq!(result, frame(0x84, 42, 0x08, b"\x00\x00\x00\x01"));
        let seen = server.await.unwrap();
        assert_eq!(&seen[1..], &query[1..]);

        stop.send(()).unwrap();
        bridge.await.unwrap().unwrap();
    }

    #[test]
    fn run_future_is_send() {
        // The binary may `tokio::spawn` the bridge.
        fn is_send<T: Send>(_: &T) {}
        let addr: SocketAddr = "127.0.0.1:0".parse().unwrap();
        is_send(&run(addr, addr, async {}));
    }

    #[tokio::test]
    async fn unreachable_upstream_answers_with_error_frame() {
        // Grab a free port, then close it so nothing listens there.
        let dead = TcpListener::bind("127.0.0.1:0").await.unwrap().local_addr().unwrap();
        let (addr, stop, bridge) = start_bridge(dead).await;
        let mut client = TcpStream::connect(addr).await.unwrap();
        client.write_all(&frame(0x04, 1, 0x05, b"")).await.unwrap();
        let err = read_frame(&mut client).await;
        assert_eq!((err[0], err[4]), (0x84, 0x00));
        assert_eq!(i16::from_be_bytes([err[2], err[3]]), 1);
        assert!(String::from_utf8_lossy(&err[15..]).contains("cannot reach upstream"));
        stop.send(()).unwrap();
        bridge.await.unwrap().unwrap();
    }
}
