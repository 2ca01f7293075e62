//! Who is using the console: an API key as `Authorization: Bearer` (scripts), or a
//! session from the login form. A session is a random token in an HttpOnly,
//! SameSite=Strict cookie that names a server-side entry (the key itself never leaves the
//! server again); every request re-checks the key through the API's key cache, so a
//! revoked key ends its sessions within `api.key_refresh`. Actions (POST) need the
//! session's CSRF token in `X-CSRF-Token` (a Bearer caller needs none: browsers do not
//! send that header cross-site on their own). Keys and tokens are never logged.

use crate::api::{codes, ApiError, ApiState, Caller};
use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

pub(super) const COOKIE: &str = "fairway_console";
pub(super) const CSRF_HEADER: &str = "x-csrf-token";
/// A session ends this long after login.
const SESSION_TTL: Duration = Duration::from_secs(8 * 3600);
/// Most sessions kept (expired ones are dropped first; then logins are refused).
const MAX_SESSIONS: usize = 10_000;
/// Most sessions of one key: a new login evicts the key's oldest, so one key cannot fill
/// the table for everyone else.
const MAX_SESSIONS_PER_KEY: usize = 8;

struct Session {
    /// The API key, kept in memory only, re-checked on every request.
    key: String,
    csrf: String,
    expires: Instant,
}

#[derive(Default)]
pub(super) struct Sessions {
    by_token: Mutex<HashMap<String, Session>>,
}

fn random_token() -> String {
    let bytes: [u8; 32] = rand::random();
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn bearer_headers(key: &str) -> HeaderMap {
    let mut h = HeaderMap::new();
    if let Ok(v) = HeaderValue::from_str(&format!("Bearer {key}")) {
        h.insert(header::AUTHORIZATION, v);
    }
    h
}

impl Sessions {
    /// Checks `key`; on success opens a session and returns its cookie value.
    /// `extensions`: the login request's (naming the client's network).
    pub(super) async fn login(
        &self,
        st: &ApiState,
        key: &str,
        extensions: &axum::http::Extensions,
    ) -> Result<(Caller, String), ApiError> {
        let caller = st.authenticate_from(&bearer_headers(key.trim()), extensions).await?;
        Ok((caller, self.open(key.trim())?))
    }

    /// Opens a session of (a checked) `key`: evicts the key's oldest beyond
    /// `MAX_SESSIONS_PER_KEY - 1`, refuses when the table is full of other keys' sessions.
    fn open(&self, key: &str) -> Result<String, ApiError> {
        let token = random_token();
        let mut all = self.by_token.lock().expect("sessions");
        let now = Instant::now();
        all.retain(|_, s| s.expires > now);
        let mut own: Vec<(Instant, String)> =
            all.iter().filter(|(_, s)| s.key == key).map(|(t, s)| (s.expires, t.clone())).collect();
        if own.len() >= MAX_SESSIONS_PER_KEY {
            own.sort();
            for (_, t) in &own[..=own.len() - MAX_SESSIONS_PER_KEY] {
                all.remove(t);
            }
        }
        if all.len() >= MAX_SESSIONS {
            return Err(ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                codes::TOO_MANY_SESSIONS,
                "too many open console sessions; log out elsewhere or wait for sessions to expire (8 h)",
            ));
        }
        let s = Session { key: key.to_string(), csrf: random_token(), expires: now + SESSION_TTL };
        all.insert(token.clone(), s);
        Ok(token)
    }

    pub(super) fn logout(&self, token: &str) {
        self.by_token.lock().expect("sessions").remove(token);
    }

    /// How many live sessions `key` has.
    #[cfg(test)]
    fn of_key(&self, key: &str) -> usize {
        self.by_token.lock().expect("sessions").values().filter(|s| s.key == key).count()
    }

    /// The key and CSRF token of a live session.
    fn get(&self, token: &str) -> Option<(String, String)> {
        let all = self.by_token.lock().expect("sessions");
        let s = all.get(token).filter(|s| s.expires > Instant::now())?;
        Some((s.key.clone(), s.csrf.clone()))
    }
}

/// The cookie that opens a session (Path=/console, HttpOnly, SameSite=Strict).
pub(super) fn set_cookie(token: &str) -> String {
    format!("{COOKIE}={token}; Path=/console; HttpOnly; SameSite=Strict; Max-Age={}", SESSION_TTL.as_secs())
}

pub(super) fn clear_cookie() -> String {
    format!("{COOKIE}=; Path=/console; HttpOnly; SameSite=Strict; Max-Age=0")
}

pub(super) fn cookie_token(headers: &HeaderMap) -> Option<String> {
    headers.get_all(header::COOKIE).iter().filter_map(|v| v.to_str().ok()).flat_map(|v| v.split(';')).find_map(|c| {
        let (k, v) = c.trim().split_once('=')?;
        (k == COOKIE && !v.is_empty()).then(|| v.to_string())
    })
}

/// A console user: the caller, and the session's CSRF token (None for a Bearer caller
/// or `api.auth = "off"`).
#[derive(Clone)]
pub(super) struct Viewer {
    pub caller: Caller,
    pub csrf: Option<String>,
    /// Headers that authenticate as this viewer again (a live stream re-checks its key).
    pub auth: HeaderMap,
}

impl Viewer {
    pub(super) fn tenant(&self) -> Option<&str> {
        self.caller.tenant()
    }
}

impl Viewer {
    /// The viewer's key, for per-key bounds.
    pub(super) fn key(&self) -> crate::api::limits::KeyId {
        crate::api::auth::key_id(&self.auth)
    }
}

/// The console's caller, after one request from its key's and tenant's buckets
/// (`api::limits::Limits::request`).
async fn viewer(parts: &Parts, st: &ApiState) -> Result<Viewer, ApiError> {
    let v = authenticated(parts, st).await?;
    st.limits().request(&v.key(), v.tenant())?;
    Ok(v)
}

async fn authenticated(parts: &Parts, st: &ApiState) -> Result<Viewer, ApiError> {
    let auth = match cookie_token(&parts.headers).and_then(|t| st.console().sessions.get(&t)) {
        Some((key, csrf)) if !parts.headers.contains_key(header::AUTHORIZATION) => {
            let auth = bearer_headers(&key);
            return Ok(Viewer {
                caller: st.authenticate_from(&auth, &parts.extensions).await?,
                csrf: Some(csrf),
                auth,
            });
        }
        _ => parts.headers.get(header::AUTHORIZATION).cloned(),
    };
    // A Bearer key; or no key and no session: 401, unless the API runs with auth off.
    let mut headers = HeaderMap::new();
    if let Some(v) = auth {
        headers.insert(header::AUTHORIZATION, v);
    }
    Ok(Viewer { caller: st.authenticate_from(&headers, &parts.extensions).await?, csrf: None, auth: headers })
}

impl FromRequestParts<ApiState> for Viewer {
    type Rejection = ApiError;
    async fn from_request_parts(parts: &mut Parts, st: &ApiState) -> Result<Viewer, ApiError> {
        viewer(parts, st).await
    }
}

/// A console user allowed to act (POST): a Bearer caller, or a session caller whose
/// request carries the session's CSRF token. With `api.auth = "off"` the header must
/// still be present (a cross-site form cannot set it).
pub(super) struct Actor(pub Viewer);

impl FromRequestParts<ApiState> for Actor {
    type Rejection = ApiError;
    async fn from_request_parts(parts: &mut Parts, st: &ApiState) -> Result<Actor, ApiError> {
        let v = viewer(parts, st).await?;
        let bearer = parts.headers.contains_key(header::AUTHORIZATION);
        let sent = parts.headers.get(CSRF_HEADER).and_then(|h| h.to_str().ok());
        let ok = match (&v.csrf, sent) {
            _ if bearer => true,
            (Some(want), Some(got)) => bool::from(subtle::ConstantTimeEq::ct_eq(want.as_bytes(), got.as_bytes())),
            (None, Some(_)) => true,
            (_, None) => false,
        };
        if !ok {
            return Err(ApiError::new(
                StatusCode::FORBIDDEN,
                codes::FORBIDDEN,
                "console actions need the page's CSRF token in the X-CSRF-Token header (reload the page), or an \
                 `Authorization: Bearer <API key>` header",
            ));
        }
        Ok(Actor(v))
    }
}

/// 403 unless `v` is an admin (a tenant key's only action in the console is replaying its
/// own dead letters).
pub(super) fn require_admin(v: &Viewer, what: &str) -> Result<(), ApiError> {
    if v.caller.is_admin() {
        return Ok(());
    }
    Err(ApiError::new(
        StatusCode::FORBIDDEN,
        codes::FORBIDDEN,
        format!("{what} needs an admin key; {} may only replay its own dead letters in the console", v.caller),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_key_keeps_its_newest_sessions_and_never_fills_the_table() {
        let sessions = Sessions::default();
        let first = sessions.open("key-a").unwrap();
        let tokens: Vec<String> = (0..10_000).map(|_| sessions.open("key-a").unwrap()).collect();
        assert_eq!(sessions.of_key("key-a"), MAX_SESSIONS_PER_KEY);
        assert!(sessions.get(&first).is_none(), "the oldest session was evicted");
        assert!(sessions.get(tokens.last().unwrap()).is_some());
        sessions.open("key-b").expect("another key still logs in");
    }
}
