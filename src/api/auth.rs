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
use std::sync::Mutex;
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
#[derive(Default)]
struct KeyCache {
    found: HashMap<String, (Instant, Option<KeyRecord>)>,
    unknown: HashMap<String, (Instant, Option<KeyRecord>)>,
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
    pub(super) fn new(mode: AuthMode, refresh: Duration) -> Self {
        if mode == AuthMode::Off {
            tracing::warn!(
                "api.auth = \"off\": the HTTP API trusts every caller as admin; use this only for local demos"
            );
        }
        Keys { mode, refresh, statements: Default::default(), cache: Mutex::default() }
    }

    pub(super) async fn statements(&self, store: &Store) -> Result<&KeyStatements, ApiError> {
        Ok(self.statements.get_or_try_init(|| store.key_statements()).await?)
    }

    async fn record(&self, store: &Store, id: &str) -> Result<Option<KeyRecord>, ApiError> {
        let now = Instant::now();
        if let Some((at, r)) = self.cache.lock().expect("key cache").get(id) {
            if now.duration_since(*at) < self.refresh {
                return Ok(r.clone());
            }
        }
        let r = self.statements(store).await?.get(id).await?;
        self.cache.lock().expect("key cache").insert(id, now, r.clone());
        Ok(r)
    }

    pub(super) async fn authenticate(&self, store: &Store, headers: &HeaderMap) -> Result<Caller, ApiError> {
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
        let record = self.record(store, id).await?;
        verify(secret, record.as_ref()).ok_or_else(|| unauthenticated("the API key is unknown or revoked"))
    }
}

impl ApiState {
    /// The caller of a request with these headers (401 if it cannot be told).
    pub async fn authenticate(&self, headers: &HeaderMap) -> Result<Caller, ApiError> {
        self.inner.keys.authenticate(&self.inner.store, headers).await
    }
}

/// Middleware of every `/v1` route: authenticates the request (401 JSON error
/// otherwise) and leaves the [`Caller`] in its extensions.
pub async fn require_caller(State(st): State<ApiState>, mut req: Request, next: Next) -> Response {
    match st.authenticate(req.headers()).await {
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
        st.authenticate(&parts.headers).await
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
    fn made_up_ids_never_evict_the_real_keys() {
        let mut c = KeyCache::default();
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
