//! One open API connection, shared by its I/O ([`super::listener::IdleIo`]) and its
//! requests (which find it in their extensions):
//!
//! - **its requests open**: a request counts from its head until its response body is
//!   done (or dropped). Bytes read while none is open must become a request head within
//!   `api.limits.head_timeout` ([`Conn::head_wait`]), or the connection is closed:
//!   hyper's header-read timer covers HTTP/1 only, and over HTTP/2 a client could
//!   otherwise trickle frames (PINGs, a HEADERS frame's CONTINUATIONs) forever, each
//!   byte resetting the idle timer. An HTTP/2 client that only keeps an idle connection
//!   alive with frames is closed after `head_timeout` too (it reconnects on its next
//!   request).
//! - **the key owners it carries**: the first request of each tenant (all its keys) or
//!   admin key on a connection takes one of that owner's `api.limits.connections_per_tenant`
//!   ([`Conn::carry`]), held until the connection closes; past it the request is
//!   answered 503 `TOO_MANY_CONNECTIONS`. The per-address bounds are taken before any
//!   request is read; this one holds a tenant with many addresses (or behind a shared
//!   proxy) to its share. One connection carries at most [`OWNERS_PER_CONNECTION`]
//!   owners (a proxy's connection serving many tenants: past it, 503 until the proxy
//!   opens another).

use super::listener::Held;
use crate::core::api_limits::{Busy, Usage};
use axum::body::Body;
use axum::response::Response;
use http_body_util::BodyExt;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// Distinct key owners (tenants, admin keys) one connection may carry requests of.
pub const OWNERS_PER_CONNECTION: usize = 16;

/// What one connection is carrying now.
pub struct Conn {
    _place: Held,
    /// Every connection's owners: per owner `connections_per_tenant`.
    all_owners: Arc<Mutex<Usage>>,
    /// The owners this connection holds a share of.
    owners: Mutex<Vec<String>>,
    open: AtomicUsize,
    started: AtomicU64,
}

/// Why a connection may not carry another owner's request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CarryRefused {
    /// The owner holds its share of connections already.
    Owner(Busy),
    /// This connection carries [`OWNERS_PER_CONNECTION`] owners already.
    Crowded,
}

/// A request in progress on its connection; dropped with its response body.
pub struct OpenRequest(Arc<Conn>);

impl Drop for OpenRequest {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Conn {
    /// The network prefix the connection came from (`core::api_limits::client_prefix`).
    pub fn origin(&self) -> &str {
        self._place.prefix()
    }

    pub fn new(place: Held, all_owners: Arc<Mutex<Usage>>) -> Arc<Conn> {
        Arc::new(Conn {
            _place: place,
            all_owners,
            owners: Mutex::new(Vec::new()),
            open: AtomicUsize::new(0),
            started: AtomicU64::new(0),
        })
    }

    /// A request's head has arrived: it is open until the returned guard drops.
    pub fn start(self: &Arc<Self>) -> OpenRequest {
        self.open.fetch_add(1, Ordering::AcqRel);
        self.started.fetch_add(1, Ordering::AcqRel);
        OpenRequest(self.clone())
    }

    /// For the I/O after bytes were read: `Some(n)` when no request is open (a head
    /// is expected, `n` requests having started so far), `None` while one is.
    pub fn head_wait(&self) -> Option<u64> {
        (self.open.load(Ordering::Acquire) == 0).then(|| self.started.load(Ordering::Acquire))
    }

    /// Whether a head awaited since `started` requests is still awaited.
    pub fn still_waiting(&self, since: u64) -> bool {
        self.open.load(Ordering::Acquire) == 0 && self.started.load(Ordering::Acquire) == since
    }

    /// Lets this connection carry `owner`'s requests (a no-op once it does).
    pub fn carry(&self, owner: &str) -> Result<(), CarryRefused> {
        let mut owners = self.owners.lock().expect("connection owners");
        if owners.iter().any(|o| o == owner) {
            return Ok(());
        }
        if owners.len() >= OWNERS_PER_CONNECTION {
            return Err(CarryRefused::Crowded);
        }
        self.all_owners.lock().expect("connection owners").take(owner, 0).map_err(CarryRefused::Owner)?;
        owners.push(owner.to_string());
        Ok(())
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        let owners = std::mem::take(self.owners.get_mut().expect("connection owners"));
        let mut all = self.all_owners.lock().expect("connection owners");
        for o in owners {
            all.give_back(&o, 0);
        }
    }
}

/// `resp` with its body holding `open` until the body is done or dropped.
pub fn hold_until_sent(resp: Response, open: OpenRequest) -> Response {
    resp.map(|body| {
        Body::new(body.map_frame(move |f| {
            let _open = &open;
            f
        }))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::api_limits::{ApiLimits, Bound};

    fn conn(all: &Arc<Mutex<Usage>>, conns: &Arc<super::super::listener::Connections>) -> Arc<Conn> {
        Conn::new(conns.admit("10.1.0.1".parse().unwrap()).unwrap(), all.clone())
    }

    #[test]
    fn an_owner_is_held_to_its_share_of_connections_until_they_close() {
        let limits = ApiLimits { connections_per_ip: 100, ..Default::default() };
        let conns = super::super::listener::Connections::new(&limits);
        let all = Arc::new(Mutex::new(Usage::new(
            "connections of one tenant",
            Bound { per_key: 2, total: u64::MAX },
            Bound::NONE,
        )));
        let (a, b, c) = (conn(&all, &conns), conn(&all, &conns), conn(&all, &conns));
        a.carry("tenant:acme").unwrap();
        a.carry("tenant:acme").expect("the same owner again on one connection takes nothing more");
        b.carry("tenant:acme").unwrap();
        assert!(matches!(c.carry("tenant:acme"), Err(CarryRefused::Owner(Busy::Key { most: 2, .. }))));
        c.carry("tenant:globex").expect("another tenant is not shut out");
        drop(a);
        c.carry("tenant:acme").expect("a closed connection gives its share back");
        assert_eq!(all.lock().unwrap().held("tenant:acme").0, 2);
    }

    #[test]
    fn one_connection_carries_a_bounded_number_of_owners() {
        let conns = super::super::listener::Connections::new(&ApiLimits::default());
        let all = Arc::new(Mutex::new(Usage::new("connections of one tenant", Bound::NONE, Bound::NONE)));
        let c = conn(&all, &conns);
        for i in 0..OWNERS_PER_CONNECTION {
            c.carry(&format!("tenant:t{i}")).unwrap();
        }
        assert_eq!(c.carry("tenant:one-more"), Err(CarryRefused::Crowded));
        assert!(all.lock().unwrap().held("tenant:one-more").0 == 0, "a refused owner holds nothing");
    }

    #[test]
    fn a_head_is_awaited_only_while_no_request_is_open() {
        let conns = super::super::listener::Connections::new(&ApiLimits::default());
        let all = Arc::new(Mutex::new(Usage::new("connections of one tenant", Bound::NONE, Bound::NONE)));
        let c = conn(&all, &conns);
        let since = c.head_wait().expect("a new connection awaits a head");
        let open = c.start();
        assert!(!c.still_waiting(since), "a head arrived");
        assert_eq!(c.head_wait(), None, "bytes of an open request (a body) are not a head");
        drop(open);
        let next = c.head_wait().expect("after the response, the next head is awaited");
        assert!(c.still_waiting(next));
        let resp = hold_until_sent(Response::new(Body::from("x")), c.start());
        assert_eq!(c.head_wait(), None, "the response body holds its request open");
        drop(resp);
        assert!(c.head_wait().is_some());
    }
}
