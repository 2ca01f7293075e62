//! Who is calling: API keys in `Authorization: Bearer <key>` (see `core::auth` for the
//! key format and the check). Every `/v1` route sits behind [`require_caller`], which
//! puts the [`Caller`] into the request's extensions; handlers take it as an extractor
//! (`caller: Caller`), and admin-only handlers take [`Admin`] (403 for tenant keys).
//!
//! Keys are read from the store per key id and cached for `api.key_refresh` (2 s): a
//! revoked key is refused within that, a new key works at once (unless its id was probed
//! in the last refresh period). Unknown and known ids take the same path (cache, then one
//! read) and the same hash-and-compare work, so timing does not tell them apart.

use super::{codes, ApiError, ApiState};
use crate::config::AuthMode;
pub use crate::core::auth::Caller;
use crate::core::auth::{bearer, parse_token, verify, KeyRecord};
use crate::store::{KeyStatements, Store};
use axum::extract::{FromRequestParts, Request, State};
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Most key ids cached of each side of [`KeyCache`] (a side is emptied when full:
/// bounded memory under probing).
const CACHE_MAX: usize = 100_000;

pub(super) struct Keys {
    mode: AuthMode,
    refresh: Duration,
    statements: tokio::sync::OnceCell<KeyStatements>,
    cache: Mutex<KeyCache>,
}

/// Key records read from the store, each for `api.key_refresh`: the ids found apart from
/// the ids not found, each bounded ([`CACHE_MAX`]), so a caller sending made-up ids fills
/// only the second and never evicts the real keys' records.
struct KeyCache {
    /// Store lookups of ids not found before: per client network prefix and in all.
    lookups: Lookups,
    found: HashMap<String, (Instant, Option<KeyRecord>)>,
    unknown: HashMap<String, (Instant, Option<KeyRecord>)>,
}

/// Store lookups of key ids not found before (`api.limits.key_lookups_per_prefix`,
/// `key_lookups`): made-up ids cost a store read each, so they are bounded per client
/// network and in all, while known keys' refreshes are not counted.
struct Lookups {
    by_origin: governor::DefaultKeyedRateLimiter<String>,
    total: governor::DefaultDirectRateLimiter,
    checks: u32,
}

impl Lookups {
    fn new(per_origin: u32, total: u32) -> Lookups {
        let (per, all) = (super::limits::quota(per_origin), super::limits::quota(total));
        Lookups { by_origin: governor::RateLimiter::keyed(per), total: governor::RateLimiter::direct(all), checks: 0 }
    }

    /// One lookup from `origin` (None: a request that did not come through the listener,
    /// counted in the total only), or which bound refused it.
    fn allow(&mut self, origin: Option<&str>) -> Result<(), &'static str> {
        self.checks = self.checks.wrapping_add(1);
        if self.checks.is_multiple_of(4096) {
            self.by_origin.retain_recent();
        }
        if origin.is_some_and(|o| self.by_origin.check_key(&o.to_string()).is_err()) {
            return Err("from this client network (api.limits.key_lookups_per_prefix)");
        }
        self.total.check().map_err(|_| "from all clients (api.limits.key_lookups)")
    }
}

impl KeyCache {
    fn get(&self, id: &str) -> Option<&(Instant, Option<KeyRecord>)> {
        self.found.get(id).or_else(|| self.unknown.get(id))
    }

    fn insert(&mut self, id: &str, at: Instant, r: Option<KeyRecord>) {
        let (side, other) =
            if r.is_some() { (&mut self.found, &mut self.unknown) } else { (&mut self.unknown, &mut self.found) };
        other.remove(id);
        if side.len() >= CACHE_MAX && !side.contains_key(id) {
            side.clear();
        }
        side.insert(id.to_string(), (at, r));
    }
}

fn unauthenticated(why: &str) -> ApiError {
    metrics::counter!(crate::metrics::API_AUTH_REFUSED).increment(1);
    ApiError::new(
        StatusCode::UNAUTHORIZED,
        codes::UNAUTHENTICATED,
        format!(
            "{why}: send the header `Authorization: Bearer <API key>`; an admin creates keys with \
             `fairway keys create --tenant <tenant>` (or --admin)"
        ),
    )
}

impl Keys {
    pub(super) fn new(mode: AuthMode, refresh: Duration, limits: &crate::core::api_limits::ApiLimits) -> Self {
        if mode == AuthMode::Off {
            tracing::warn!(
                "api.auth = \"off\": the HTTP API trusts every caller as admin; use this only for local demos"
            );
        }
        let lookups = Lookups::new(limits.key_lookups_per_prefix, limits.key_lookups);
        let cache = KeyCache { lookups, found: HashMap::new(), unknown: HashMap::new() };
        Keys { mode, refresh, statements: Default::default(), cache: Mutex::new(cache) }
    }

    pub(super) async fn statements(&self, store: &Store) -> Result<&KeyStatements, ApiError> {
        Ok(self.statements.get_or_try_init(|| store.key_statements()).await?)
    }

    async fn record(&self, store: &Store, id: &str, origin: Option<&str>) -> Result<Option<KeyRecord>, ApiError> {
        let now = Instant::now();
        {
            let mut cache = self.cache.lock().expect("key cache");
            let known = match cache.get(id) {
                Some((at, r)) if now.duration_since(*at) < self.refresh => return Ok(r.clone()),
                Some((_, r)) => r.is_some(),
                None => false,
            };
            if !known {
                if let Err(bound) = cache.lookups.allow(origin) {
                    metrics::counter!(crate::metrics::API_AUTH_REFUSED).increment(1);
                    return Err(ApiError {
                        retry_after_secs: Some(1),
                        ..ApiError::new(
                            StatusCode::TOO_MANY_REQUESTS,
                            super::codes::TOO_MANY_REQUESTS,
                            format!(
                                "too many lookups of unknown API keys {bound}; check the key (fwk_<id>_<secret>) \
                                 and retry after 1s"
                            ),
                        )
                    });
                }
            }
        }
        let r = self.statements(store).await?.get(id).await?;
        self.cache.lock().expect("key cache").insert(id, now, r.clone());
        Ok(r)
    }

    /// The caller of `headers`; `origin` is the client's network prefix (its lookups of
    /// unknown key ids are bounded, [`Lookups`]).
    pub(super) async fn authenticate(
        &self,
        store: &Store,
        headers: &HeaderMap,
        origin: Option<&str>,
    ) -> Result<Caller, ApiError> {
        if self.mode == AuthMode::Off {
            return Ok(Caller::Admin);
        }
        let Some(value) = headers.get(header::AUTHORIZATION) else {
            return Err(unauthenticated("no API key (the Authorization header is missing)"));
        };
        let Some(token) = value.to_str().ok().and_then(bearer) else {
            return Err(unauthenticated("the Authorization header is not `Bearer <API key>`"));
        };
        let Some((id, secret)) = parse_token(token) else {
            return Err(unauthenticated("the bearer token is not a fairway API key (fwk_<id>_<secret>)"));
        };
        let record = self.record(store, id, origin).await?;
        verify(secret, record.as_ref()).ok_or_else(|| unauthenticated("the API key is unknown or revoked"))
    }
}

impl ApiState {
    /// The caller of a request with these headers (401 if it cannot be told).
    pub async fn authenticate(&self, headers: &HeaderMap) -> Result<Caller, ApiError> {
        self.inner.keys.authenticate(&self.inner.store, headers, None).await
    }

    /// [`ApiState::authenticate`] for a request that came with `extensions` (the
    /// listener's connection names the client's network, whose lookups of unknown keys
    /// are bounded).
    pub async fn authenticate_from(
        &self,
        headers: &HeaderMap,
        extensions: &axum::http::Extensions,
    ) -> Result<Caller, ApiError> {
        let origin = extensions.get::<Arc<super::connection::Conn>>().map(|c| c.origin());
        self.inner.keys.authenticate(&self.inner.store, headers, origin).await
    }
}

/// Middleware of every `/v1` route: authenticates the request (401 JSON error
/// otherwise) and leaves the [`Caller`] in its extensions.
pub async fn require_caller(State(st): State<ApiState>, mut req: Request, next: Next) -> Response {
    match st.authenticate_from(req.headers(), req.extensions()).await {
        Ok(caller) => {
            let key = key_id(req.headers());
            if let Some(refused) = carried(&req, &caller, &key) {
                return refused;
            }
            req.extensions_mut().insert(key);
            req.extensions_mut().insert(caller);
            next.run(req).await
        }
        Err(e) => e.into_response(),
    }
}

/// Takes the caller's share of the request's connection (`api.limits.connections_per_tenant`),
/// or the 503 (closing the connection) that refuses it.
fn carried(req: &Request, caller: &Caller, key: &super::limits::KeyId) -> Option<Response> {
    use super::connection::{CarryRefused, Conn, OWNERS_PER_CONNECTION};
    let conn = req.extensions().get::<std::sync::Arc<Conn>>()?;
    let owner = match caller.tenant() {
        Some(t) => format!("tenant:{t}"),
        None => format!("key:{}", key.0),
    };
    let message = match conn.carry(&owner).err()? {
        CarryRefused::Owner(busy) => {
            let most = match busy {
                crate::core::api_limits::Busy::Key { most, .. } | crate::core::api_limits::Busy::Total { most, .. } => {
                    most
                }
            };
            format!(
                "{caller} has requests on {most} connections to this API process, its limit \
                 (api.limits.connections_per_tenant); reuse kept-alive connections or close idle ones"
            )
        }
        CarryRefused::Crowded => format!(
            "this connection carries the requests of {OWNERS_PER_CONNECTION} tenants or admin keys already; \
             open another connection for {caller}"
        ),
    };
    metrics::counter!(crate::metrics::API_CONNECTIONS_REFUSED, "reason" => "per_tenant").increment(1);
    let mut err = super::ApiError::new(StatusCode::SERVICE_UNAVAILABLE, super::codes::TOO_MANY_CONNECTIONS, message);
    err.retry_after_secs = Some(1);
    let mut resp = err.into_response();
    resp.headers_mut().insert(header::CONNECTION, axum::http::HeaderValue::from_static("close"));
    Some(resp)
}

/// The id of the (authenticated) key in `headers`, for per-key bounds.
pub fn key_id(headers: &HeaderMap) -> super::limits::KeyId {
    let token = headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()).and_then(bearer);
    let id = token.and_then(parse_token).map_or("anonymous", |(id, _)| id);
    super::limits::KeyId(id.to_string())
}

impl FromRequestParts<ApiState> for Caller {
    type Rejection = ApiError;
    async fn from_request_parts(parts: &mut Parts, st: &ApiState) -> Result<Caller, ApiError> {
        if let Some(c) = parts.extensions.get::<Caller>() {
            return Ok(c.clone());
        }
        st.authenticate_from(&parts.headers, &parts.extensions).await
    }
}

/// Extractor for admin-only endpoints: 401 without a valid key, 403 for a tenant key.
#[derive(Debug, Clone, Copy)]
pub struct Admin;

impl FromRequestParts<ApiState> for Admin {
    type Rejection = ApiError;
    async fn from_request_parts(parts: &mut Parts, st: &ApiState) -> Result<Admin, ApiError> {
        let caller = Caller::from_request_parts(parts, st).await?;
        if caller.is_admin() {
            Ok(Admin)
        } else {
            Err(ApiError::new(
                StatusCode::FORBIDDEN,
                codes::FORBIDDEN,
                format!("this endpoint needs an admin key; the key used is for {caller}"),
            ))
        }
    }
}

/// The tenant a request acts for: a tenant key's own, or the admin's `?tenant=` (403 for
/// another tenant's; 400 for an admin key that names none).
pub fn acting_tenant(caller: &Caller, asked: Option<String>) -> Result<String, ApiError> {
    let tenant = match (caller.tenant(), asked) {
        (Some(own), None) => own.to_string(),
        (_, Some(t)) => t,
        (None, None) => {
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                super::codes::INVALID_QUERY,
                "an admin key names the tenant: add ?tenant=<name>",
            ))
        }
    };
    check_tenant(caller, &tenant)?;
    Ok(tenant)
}

/// 403 when `caller` may not submit for `tenant`.
pub fn check_tenant(caller: &Caller, tenant: &str) -> Result<(), ApiError> {
    if caller.may_act_for(tenant) {
        return Ok(());
    }
    Err(ApiError::new(
        StatusCode::FORBIDDEN,
        codes::FORBIDDEN,
        format!(
            "this API key is for {caller} and cannot submit jobs for tenant {tenant:?}; omit `tenant` or use its own"
        ),
    ))
}

#[cfg(test)]
mod cache_tests {
    use super::*;

    #[test]
    fn made_up_ids_are_bounded_per_client_network_and_in_all() {
        let mut l = Lookups::new(2, 100);
        let from_a = (0..10).filter(|_| l.allow(Some("10.0.0.0/24")).is_ok()).count();
        assert_eq!(from_a, 4, "2/s with two seconds' burst");
        assert!(l.allow(Some("10.0.1.0/24")).is_ok(), "another network is served");
        let mut t = Lookups::new(100, 1);
        let all = (0..10).filter(|i| t.allow(Some(&format!("10.0.{i}.0/24"))).is_ok()).count();
        assert_eq!(all, 2, "the total bounds many networks together");
    }

    #[test]
    fn made_up_ids_never_evict_the_real_keys() {
        let mut c = KeyCache { lookups: Lookups::new(1, 1), found: HashMap::new(), unknown: HashMap::new() };
        let now = Instant::now();
        let real = KeyRecord { id: "real".into(), hash: vec![1], caller: None, revoked: false };
        c.insert("real", now, Some(real));
        for i in 0..CACHE_MAX + 10 {
            c.insert(&format!("made-up-{i}"), now, None);
        }
        assert!(c.get("real").is_some_and(|(_, r)| r.is_some()), "the real key's record stays cached");
        assert!(c.unknown.len() <= CACHE_MAX, "the unknown side is bounded: {}", c.unknown.len());
        c.insert("real", now, None);
        assert!(c.get("real").is_some_and(|(_, r)| r.is_none()), "a key gone from the store is now unknown");
        assert!(!c.found.contains_key("real"));
    }
}
