//! The API process's own limits, pure (the shell is `api::limits`): what one API
//! key, and all keys together, may hold of an API process at once, so that no tenant can
//! run it out of memory, connections or streams for the others.
//!
//! [`Usage`] counts what each key holds (requests and body bytes, or streams) against a
//! per-key and a total [`Bound`]; taking is all-or-nothing and says which bound refused.
//! The settings are `[api.limits]` ([`ApiLimits`]); docs/security.md tabulates them.

use crate::core::retry::DurationMs;
use serde::Deserialize;
use std::collections::HashMap;

/// Bounds of `api.limits.ledger_rows_per_request`.
pub const MIN_LEDGER_ROWS: u64 = 1_000;
pub const MAX_LEDGER_ROWS: u64 = 10_000_000;

/// `[api.limits]`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ApiLimits {
    /// Submission requests (`POST /v1/jobs`, `POST /v1/jobs:batch`) one tenant (all its
    /// keys together) or admin key may have in flight at once.
    pub submissions_per_key: u64,
    /// Submission requests in flight at once, all keys.
    pub submissions: u64,
    /// Request body bytes one tenant's (all its keys') or admin key's submissions in flight
    /// may hold (each request holds its `Content-Length`, or the route's body limit when it
    /// sends none).
    pub body_bytes_per_key: u64,
    /// Request body bytes all submissions in flight may hold.
    pub body_bytes: u64,
    /// Largest `POST /v1/jobs:batch` body.
    pub batch_body_bytes: u64,
    /// Server-Sent Event streams (`?follow=1`, console live view) one tenant (all its keys)
    /// or admin key may hold open.
    pub streams_per_key: u64,
    /// Server-Sent Event streams open at once, all keys.
    pub streams: u64,
    /// Open connections to the API listener; past it a new connection is answered 503
    /// (`Retry-After: 1`) and closed, and `/readyz` reports the process saturated.
    pub connections: u64,
    /// Open connections from one client address (behind a proxy, the proxy's: raise
    /// it to the proxy's pool and let the proxy bound its clients); past it, 503.
    pub connections_per_ip: u64,
    /// Open connections from one network prefix ([`client_prefix`]: an IPv4 /24, an
    /// IPv6 /64), so a client with many addresses (an IPv6 /64, 127.0.0.x aliases)
    /// counts as one; past it, 503.
    pub connections_per_prefix: u64,
    /// Connections carrying the requests of one tenant (all its keys) or one admin key
    /// (taken at its first request on a connection, held until the connection closes),
    /// so a tenant with many addresses or behind a shared proxy is held to its share;
    /// past it, 503.
    pub connections_per_tenant: u64,
    /// A request's head (request line and headers) must arrive whole within this long
    /// (else the connection is closed), however the bytes trickle in; over HTTP/2 too,
    /// bytes read while no request is open must start one within it.
    pub head_timeout: DurationMs,
    /// A connection with no bytes read or written for this long is closed (stalled
    /// headers or bodies, idle keep-alive; live streams write a keep-alive every 15 s).
    pub idle_timeout: DurationMs,
    /// Largest body of the other routes that take one (schedules, tenants, console
    /// actions).
    pub control_body_bytes: u64,
    /// Requests per second one API key may make to any `/v1` or `/console` route (a
    /// token bucket holding two seconds' worth); past it, 429 `TOO_MANY_REQUESTS`.
    pub requests_per_key: u32,
    /// Requests per second all keys of one tenant may make together (admin keys count
    /// only against their own key's bucket).
    pub requests_per_tenant: u32,
    /// Store lookups per second of API key ids this process has not found before (made-up
    /// or new keys), per client network prefix ([`client_prefix`]; behind a proxy, the
    /// proxy's: raise it); past it, 429 `TOO_MANY_REQUESTS` before any store read. Known
    /// keys' refreshes (every `api.key_refresh`) are not counted.
    pub key_lookups_per_prefix: u32,
    /// The same, all prefixes together.
    pub key_lookups: u32,
    /// A submission's whole body must arrive within this long (else 408).
    pub body_timeout: DurationMs,
    /// Heavy reads (usage reports and exports, tenant and overview console pages,
    /// listings of every schedule or tenant) one tenant (all its keys) or admin key may
    /// have in flight at once; past it, 429 `TOO_MANY_HEAVY_READS`.
    pub heavy_reads_per_key: u64,
    /// Heavy reads in flight at once, all keys.
    pub heavy_reads: u64,
    /// Usage-ledger rows one request may read from the store (a report's days, a tenant
    /// page's days, one fleet day of the console's); past it, 422 `READ_TOO_LARGE`
    /// naming what to narrow. Between 1,000 and 10,000,000.
    pub ledger_rows_per_request: u64,
}

impl Default for ApiLimits {
    fn default() -> Self {
        const MIB: u64 = 1 << 20;
        ApiLimits {
            submissions_per_key: 8,
            submissions: 256,
            body_bytes_per_key: 32 * MIB,
            body_bytes: 96 * MIB,
            batch_body_bytes: 32 * MIB,
            streams_per_key: 8,
            streams: 1024,
            connections: 4096,
            connections_per_ip: 256,
            connections_per_prefix: 1024,
            connections_per_tenant: 512,
            head_timeout: DurationMs::secs(10),
            idle_timeout: DurationMs::secs(60),
            control_body_bytes: 256 << 10,
            requests_per_key: 200,
            requests_per_tenant: 400,
            key_lookups_per_prefix: 20,
            key_lookups: 500,
            body_timeout: DurationMs::secs(30),
            heavy_reads_per_key: 2,
            heavy_reads: 16,
            ledger_rows_per_request: 200_000,
        }
    }
}

impl ApiLimits {
    /// Largest body of `POST /v1/jobs`: a payload of `max_payload_bytes` may grow up to
    /// 6x when JSON-escaped (oversize payloads inside this get the precise 413 from
    /// validation).
    pub fn single_body_bytes(max_payload_bytes: usize) -> u64 {
        (max_payload_bytes as u64).saturating_mul(6).saturating_add(64 << 10)
    }

    /// Largest body of `POST /v1/jobs:batch`.
    pub fn batch_body(&self, max_payload_bytes: usize) -> u64 {
        self.batch_body_bytes.max(Self::single_body_bytes(max_payload_bytes))
    }

    /// Checks the settings; `largest_body` is the largest body a submission route accepts.
    pub fn validate(&self, largest_body: u64) -> Result<(), crate::core::invalid::Invalid> {
        let positive = [
            ("submissions_per_key", self.submissions_per_key),
            ("submissions", self.submissions),
            ("streams_per_key", self.streams_per_key),
            ("streams", self.streams),
            ("connections", self.connections),
            ("connections_per_ip", self.connections_per_ip),
            ("connections_per_prefix", self.connections_per_prefix),
            ("connections_per_tenant", self.connections_per_tenant),
            ("control_body_bytes", self.control_body_bytes),
            ("requests_per_key", u64::from(self.requests_per_key)),
            ("requests_per_tenant", u64::from(self.requests_per_tenant)),
            ("key_lookups_per_prefix", u64::from(self.key_lookups_per_prefix)),
            ("key_lookups", u64::from(self.key_lookups)),
            ("heavy_reads_per_key", self.heavy_reads_per_key),
            ("heavy_reads", self.heavy_reads),
        ];
        if let Some((name, _)) = positive.iter().find(|(_, v)| *v == 0) {
            return crate::core::invalid::Invalid::err(*name, "must be at least 1");
        }
        if self.body_bytes_per_key < largest_body {
            return crate::core::invalid::Invalid::err(
                "body_bytes_per_key",
                format!(
                    "{} is below the largest request body the API accepts ({largest_body} bytes: batch_body_bytes, \
                     or 6 x worker.max_payload_bytes + 64 KiB for one job), so such a request could never be read; \
                     raise it to at least {largest_body}",
                    self.body_bytes_per_key
                ),
            );
        }
        if self.body_bytes < self.body_bytes_per_key {
            return crate::core::invalid::Invalid::err("body_bytes", "must be at least body_bytes_per_key");
        }
        if self.heavy_reads < self.heavy_reads_per_key {
            return crate::core::invalid::Invalid::err("heavy_reads", "must be at least heavy_reads_per_key");
        }
        if !(MIN_LEDGER_ROWS..=MAX_LEDGER_ROWS).contains(&self.ledger_rows_per_request) {
            return crate::core::invalid::Invalid::err(
                "ledger_rows_per_request",
                format!("must be between {MIN_LEDGER_ROWS} and {MAX_LEDGER_ROWS}"),
            );
        }
        if self.idle_timeout.0 < 1_000 {
            return crate::core::invalid::Invalid::err("idle_timeout", "must be at least \"1s\"");
        }
        if self.head_timeout.0 < 1_000 {
            return crate::core::invalid::Invalid::err("head_timeout", "must be at least \"1s\"");
        }
        if self.body_timeout.0 < 1_000 {
            return crate::core::invalid::Invalid::err("body_timeout", "must be at least \"1s\"");
        }
        Ok(())
    }
}

/// A per-key and a total bound of one quantity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bound {
    pub per_key: u64,
    pub total: u64,
}

impl Bound {
    pub const NONE: Bound = Bound { per_key: u64::MAX, total: u64::MAX };
}

/// Which bound refused a take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Busy {
    /// The key holds `held` of `what` and may hold `most`.
    Key { what: &'static str, held: u64, most: u64 },
    /// All keys together hold `most` of `what`.
    Total { what: &'static str, most: u64 },
}

/// What each key holds: a count (requests or streams) and bytes.
#[derive(Debug, Clone)]
pub struct Usage {
    what: &'static str,
    count: Bound,
    bytes: Bound,
    per_key: HashMap<String, (u64, u64)>,
    total: (u64, u64),
}

impl Usage {
    /// `what` names the counted thing in refusals (e.g. "submissions", "streams").
    pub fn new(what: &'static str, count: Bound, bytes: Bound) -> Self {
        Usage { what, count, bytes, per_key: HashMap::new(), total: (0, 0) }
    }

    /// Takes one more of the count and `bytes` for `key`, or refuses and takes nothing.
    pub fn take(&mut self, key: &str, bytes: u64) -> Result<(), Busy> {
        let (n, b) = self.per_key.get(key).copied().unwrap_or_default();
        if n + 1 > self.count.per_key {
            return Err(Busy::Key { what: self.what, held: n, most: self.count.per_key });
        }
        if b.saturating_add(bytes) > self.bytes.per_key {
            return Err(Busy::Key { what: "body bytes", held: b, most: self.bytes.per_key });
        }
        if self.total.0 + 1 > self.count.total {
            return Err(Busy::Total { what: self.what, most: self.count.total });
        }
        if self.total.1.saturating_add(bytes) > self.bytes.total {
            return Err(Busy::Total { what: "body bytes", most: self.bytes.total });
        }
        let e = self.per_key.entry(key.to_string()).or_default();
        *e = (n + 1, b + bytes);
        self.total = (self.total.0 + 1, self.total.1 + bytes);
        Ok(())
    }

    /// Gives back what one [`Usage::take`] of `bytes` took.
    pub fn give_back(&mut self, key: &str, bytes: u64) {
        if let Some(e) = self.per_key.get_mut(key) {
            *e = (e.0.saturating_sub(1), e.1.saturating_sub(bytes));
            if e.0 == 0 {
                self.per_key.remove(key);
            }
        }
        self.total = (self.total.0.saturating_sub(1), self.total.1.saturating_sub(bytes));
    }

    /// How many `key` holds, and in all.
    pub fn held(&self, key: &str) -> (u64, u64) {
        (self.per_key.get(key).map_or(0, |e| e.0), self.total.0)
    }
}

/// The network prefix a client address is counted under for `connections_per_prefix`:
/// its IPv4 /24 (an IPv4-mapped IPv6 address as IPv4), or its IPv6 /64 (what one site or
/// host is usually given).
pub fn client_prefix(ip: std::net::IpAddr) -> String {
    match ip.to_canonical() {
        std::net::IpAddr::V4(v4) => {
            let [a, b, c, _] = v4.octets();
            format!("{a}.{b}.{c}.0/24")
        }
        std::net::IpAddr::V6(v6) => {
            let s = v6.segments();
            let net = std::net::Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0);
            format!("{net}/64")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn addresses_count_under_their_24_or_64() {
        let p = |s: &str| client_prefix(s.parse().unwrap());
        assert_eq!(p("127.0.0.1"), "127.0.0.0/24");
        assert_eq!(p("127.0.0.254"), p("127.0.0.1"), "loopback aliases are one client");
        assert_eq!(p("::ffff:10.1.2.3"), "10.1.2.0/24", "IPv4-mapped is IPv4");
        assert_eq!(p("2001:db8:1:2:aaaa::1"), "2001:db8:1:2::/64");
        assert_eq!(p("2001:db8:1:2:ffff:ffff:ffff:ffff"), p("2001:db8:1:2::"), "one /64, however many addresses");
        assert_ne!(p("2001:db8:1:3::1"), p("2001:db8:1:2::1"));
    }

    fn usage() -> Usage {
        Usage::new("submissions", Bound { per_key: 2, total: 3 }, Bound { per_key: 100, total: 150 })
    }

    #[test]
    fn a_key_is_held_to_its_share_and_all_keys_to_the_total() {
        let mut u = usage();
        u.take("a", 10).unwrap();
        u.take("a", 10).unwrap();
        assert_eq!(u.take("a", 10), Err(Busy::Key { what: "submissions", held: 2, most: 2 }));
        assert_eq!(u.take("b", 101), Err(Busy::Key { what: "body bytes", held: 0, most: 100 }));
        u.take("b", 100).unwrap();
        assert_eq!(u.take("c", 1), Err(Busy::Total { what: "submissions", most: 3 }));
        u.give_back("a", 10);
        assert_eq!(u.take("c", 41), Err(Busy::Total { what: "body bytes", most: 150 }));
        u.take("c", 30).unwrap();
        assert_eq!(u.held("a"), (1, 3));
    }

    #[test]
    fn limits_refuse_a_body_budget_below_the_largest_body() {
        let l = ApiLimits::default();
        assert!(l.validate(32 << 20).is_ok());
        let crate::core::invalid::Invalid { field, problem: why } = l.validate(64 << 20).unwrap_err();
        assert_eq!(field, "body_bytes_per_key");
        assert!(why.contains("raise it"), "{why}");
        let l = ApiLimits { streams: 0, ..Default::default() };
        assert_eq!(l.validate(1).unwrap_err().field, "streams");
    }

    proptest! {
        /// Whatever the order of takes and give-backs, no key and no total ever exceeds
        /// its bound, and giving everything back leaves nothing held.
        #[test]
        fn bounds_hold(ops in proptest::collection::vec((0u8..4, 0u64..60, any::<bool>()), 0..200)) {
            let mut u = usage();
            let mut held: Vec<(String, u64)> = Vec::new();
            for (k, bytes, give) in ops {
                if give && !held.is_empty() {
                    let (key, b) = held.remove(bytes as usize % held.len());
                    u.give_back(&key, b);
                } else {
                    let key = format!("k{k}");
                    if u.take(&key, bytes).is_ok() {
                        held.push((key, bytes));
                    }
                }
                for k in 0..4 {
                    let key = format!("k{k}");
                    let n = held.iter().filter(|(h, _)| *h == key).count() as u64;
                    let b: u64 = held.iter().filter(|(h, _)| *h == key).map(|(_, b)| b).sum();
                    prop_assert!(n <= 2 && b <= 100);
                    prop_assert_eq!(u.held(&key).0, n);
                }
                prop_assert!(held.len() <= 3 && held.iter().map(|(_, b)| b).sum::<u64>() <= 150);
            }
            for (key, b) in held.drain(..) {
                u.give_back(&key, b);
            }
            prop_assert_eq!(u.held("k0"), (0, 0));
        }
    }
}
