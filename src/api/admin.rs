//! Admin endpoints of the tenants registry (admin API keys only): the HTTP face of
//! `fairway tenants`. Every change is validated whole before it is written (422 naming
//! the field and the fix), and reaches every worker within `registry.poll_interval`.
//!
//! | method | path | what |
//! |---|---|---|
//! | GET | `/v1/admin/tenants` | `{version, tenants: [...]}` |
//! | POST | `/v1/admin/tenants` | add (a tenant record; 409 if it exists) |
//! | PUT | `/v1/admin/tenants/{name}` | replace its settings (404 if unknown) |
//! | POST | `/v1/admin/tenants/{name}:suspend`, `:resume` | hold / release its jobs |
//! | DELETE | `/v1/admin/tenants/{name}` | unregister |

use super::auth::Admin;
use super::error::{codes, ApiError};
use super::ApiState;
use crate::core::tenants::TenantRecord;
use crate::now_ms;
use crate::store::TenantStatements;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;

fn registry(st: &ApiState) -> Result<&TenantStatements, ApiError> {
    st.live_tenants().map(|t| t.statements()).ok_or_else(|| {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            codes::STORE_UNAVAILABLE,
            "this API process runs without the tenants registry; start it with `fairway serve`",
        )
    })
}

fn store_error(e: crate::store::StoreError) -> ApiError {
    ApiError::new(StatusCode::SERVICE_UNAVAILABLE, codes::STORE_UNAVAILABLE, format!("the store is unavailable: {e}"))
}

fn invalid(e: crate::core::tenants::TenantError) -> ApiError {
    ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, codes::INVALID_TENANT, e.to_string())
}

fn unknown(name: &str) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        codes::UNKNOWN_TENANT,
        format!("no tenant {name:?} is registered; add it with POST /v1/admin/tenants"),
    )
}

pub async fn list(_: Admin, State(st): State<ApiState>) -> Result<Json<serde_json::Value>, ApiError> {
    let reg = registry(&st)?;
    let version = reg.version().await.map_err(store_error)?;
    let tenants = reg.list().await.map_err(store_error)?;
    Ok(Json(serde_json::json!({ "version": version, "tenants": tenants.values().collect::<Vec<_>>() })))
}

pub async fn add(
    _: Admin,
    State(st): State<ApiState>,
    Json(t): Json<TenantRecord>,
) -> Result<(StatusCode, Json<TenantRecord>), ApiError> {
    t.validate().map_err(invalid)?;
    fits(&st, &t).await?;
    if !registry(&st)?.add(&t, now_ms()).await.map_err(store_error)? {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            codes::TENANT_EXISTS,
            format!("tenant {:?} already exists; change it with PUT /v1/admin/tenants/{}", t.name, t.name),
        ));
    }
    Ok((StatusCode::CREATED, Json(t)))
}

/// Refuses (422) a change whose reserved slots would not fit a pool with the others', or
/// whose home region this deployment does not know.
async fn fits(st: &ApiState, t: &TenantRecord) -> Result<(), ApiError> {
    crate::core::tenants::check_regions(t, &st.config().region).map_err(invalid)?;
    let all = registry(st)?.list().await.map_err(store_error)?;
    crate::core::tenants::check_reservations(&all, t, &crate::ops::tenants::pool_rooms(st.config())).map_err(invalid)
}

async fn existing(reg: &TenantStatements, name: &str) -> Result<TenantRecord, ApiError> {
    reg.list().await.map_err(store_error)?.remove(name).ok_or_else(|| unknown(name))
}

pub async fn replace(
    _: Admin,
    State(st): State<ApiState>,
    Path(name): Path<String>,
    Json(mut t): Json<TenantRecord>,
) -> Result<Json<TenantRecord>, ApiError> {
    let reg = registry(&st)?;
    existing(reg, &name).await?;
    t.name = name;
    t.validate().map_err(invalid)?;
    fits(&st, &t).await?;
    reg.put(&t, now_ms()).await.map_err(store_error)?;
    Ok(Json(t))
}

/// `POST /v1/admin/tenants/{name}:suspend` and `:resume` (one route: axum matches the
/// whole segment).
pub async fn action(
    _: Admin,
    State(st): State<ApiState>,
    Path(segment): Path<String>,
) -> Result<Json<TenantRecord>, ApiError> {
    let (name, suspended) = match segment.rsplit_once(':') {
        Some((n, "suspend")) => (n.to_string(), true),
        Some((n, "resume")) => (n.to_string(), false),
        _ => {
            return Err(ApiError::new(
                StatusCode::NOT_FOUND,
                codes::NO_SUCH_ROUTE,
                format!("POST /v1/admin/tenants/{segment}: use /v1/admin/tenants/<name>:suspend or :resume"),
            ))
        }
    };
    Ok(Json(update(&st, &name, |t| t.suspended = suspended).await?))
}

/// Read, change, validate, write one tenant (the suspend/resume endpoints and the
/// console's tier and suspend actions): an invalid change is refused whole (422).
pub(super) async fn update(
    st: &ApiState,
    name: &str,
    change: impl FnOnce(&mut TenantRecord),
) -> Result<TenantRecord, ApiError> {
    let reg = registry(st)?;
    let mut t = existing(reg, name).await?;
    change(&mut t);
    t.validate().map_err(invalid)?;
    fits(st, &t).await?;
    reg.put(&t, now_ms()).await.map_err(store_error)?;
    Ok(t)
}

pub async fn remove(_: Admin, State(st): State<ApiState>, Path(name): Path<String>) -> Result<StatusCode, ApiError> {
    let reg = registry(&st)?;
    existing(reg, &name).await?;
    reg.remove(&name, now_ms()).await.map_err(store_error)?;
    Ok(StatusCode::NO_CONTENT)
}
