//! Recurring schedules over HTTP: the face of `fairway schedules` (`crate::ops::schedules`).
//! A tenant key manages its own tenant's schedules (`tenant` may be omitted; another
//! tenant answers 403); an admin key names the tenant (`?tenant=` on the paths with a
//! name, the body's `tenant` on POST) and lists every tenant's.
//!
//! | method | path | what |
//! |---|---|---|
//! | GET | `/v1/schedules` | the caller's schedules with their next fire times (admin: all, or `?tenant=`) |
//! | POST | `/v1/schedules` | add (a schedule object; 201; 409 if the name is taken; 429 beyond `[schedules]` bounds; 413 over `schedules.max_payload_bytes`) |
//! | GET | `/v1/schedules/{name}` | one schedule |
//! | PUT | `/v1/schedules/{name}` | replace its definition (its next fire is computed afresh) |
//! | POST | `/v1/schedules/{name}:pause`, `:resume` | stop / restart firing |
//! | DELETE | `/v1/schedules/{name}` | remove |
//! | GET | `/v1/admin/schedules` | every tenant's (admin only) |

use super::auth::{acting_tenant as tenant_of, check_tenant, Admin, Caller};
use super::error::ApiError;
use super::ApiState;
use crate::core::recurring::ScheduleSpec;
use crate::now_ms;
use crate::ops::schedules::{Listed, ScheduleError, Schedules};
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::Json;
use serde::Deserialize;

pub mod codes {
    pub const INVALID_SCHEDULE: &str = "INVALID_SCHEDULE";
    pub const SCHEDULE_EXISTS: &str = "SCHEDULE_EXISTS";
    pub const UNKNOWN_SCHEDULE: &str = "UNKNOWN_SCHEDULE";
    pub const TOO_MANY_SCHEDULES: &str = "TOO_MANY_SCHEDULES";
}

impl From<ScheduleError> for ApiError {
    fn from(e: ScheduleError) -> Self {
        let (status, code) = match &e {
            ScheduleError::Invalid(_) | ScheduleError::Template { .. } | ScheduleError::NeverFires => {
                (StatusCode::UNPROCESSABLE_ENTITY, codes::INVALID_SCHEDULE)
            }
            ScheduleError::Exists { .. } => (StatusCode::CONFLICT, codes::SCHEDULE_EXISTS),
            ScheduleError::NotFound { .. } => (StatusCode::NOT_FOUND, codes::UNKNOWN_SCHEDULE),
            ScheduleError::TooMany(_) => (StatusCode::TOO_MANY_REQUESTS, codes::TOO_MANY_SCHEDULES),
            ScheduleError::PayloadTooLarge { .. } => {
                (StatusCode::PAYLOAD_TOO_LARGE, super::error::codes::PAYLOAD_TOO_LARGE)
            }
            ScheduleError::Store(s) => return ApiError::from(s.clone()),
        };
        ApiError::new(status, code, e.to_string())
    }
}

#[derive(Debug, Deserialize)]
pub struct TenantQuery {
    tenant: Option<String>,
}

/// The API's schedules (prepared on first use).
pub(super) async fn schedules(st: &ApiState) -> Result<&Schedules, ApiError> {
    Ok(st.inner.schedules.get_or_try_init(|| Schedules::connect(st.config().clone(), st.store())).await?)
}

fn invalid(field: &str, message: String) -> ApiError {
    ApiError::new(
        StatusCode::UNPROCESSABLE_ENTITY,
        codes::INVALID_SCHEDULE,
        format!("schedule field `{field}`: {message}"),
    )
}

fn spec_of(body: serde_json::Value) -> Result<ScheduleSpec, ApiError> {
    serde_json::from_value(body).map_err(|e| {
        ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            codes::INVALID_SCHEDULE,
            format!(
                "not a schedule object ({e}); fields: name, tenant, job_type, cron | every, tz, payload, priority, \
                 pool, flow_key, start_at, end_at (epoch ms), catch_up (none|one|all), jitter"
            ),
        )
    })
}

pub async fn list(
    State(st): State<ApiState>,
    caller: Caller,
    Query(q): Query<TenantQuery>,
) -> Result<Json<Vec<Listed>>, ApiError> {
    let tenant = match (&caller, q.tenant) {
        (c, None) if c.is_admin() => None,
        (c, t) => Some(tenant_of(c, t)?),
    };
    Ok(Json(schedules(&st).await?.list(tenant.as_deref()).await?))
}

pub async fn list_all(_: Admin, State(st): State<ApiState>) -> Result<Json<Vec<Listed>>, ApiError> {
    Ok(Json(schedules(&st).await?.list(None).await?))
}

pub async fn add(
    State(st): State<ApiState>,
    caller: Caller,
    Json(body): Json<serde_json::Value>,
) -> Result<(StatusCode, Json<Listed>), ApiError> {
    let mut spec = spec_of(body)?;
    let asked = Some(spec.tenant.clone()).filter(|t| !t.is_empty());
    spec.tenant = tenant_of(&caller, asked)?;
    Ok((StatusCode::CREATED, Json(schedules(&st).await?.add(spec, now_ms()).await?)))
}

pub async fn get_one(
    State(st): State<ApiState>,
    caller: Caller,
    Path(name): Path<String>,
    Query(q): Query<TenantQuery>,
) -> Result<Json<Listed>, ApiError> {
    let tenant = tenant_of(&caller, q.tenant)?;
    Ok(Json(schedules(&st).await?.get(&tenant, &name).await?.listed()))
}

pub async fn replace(
    State(st): State<ApiState>,
    caller: Caller,
    Path(name): Path<String>,
    Query(q): Query<TenantQuery>,
    Json(body): Json<serde_json::Value>,
) -> Result<Json<Listed>, ApiError> {
    let tenant = tenant_of(&caller, q.tenant)?;
    let new = spec_of(body)?;
    if !new.tenant.is_empty() && new.tenant != tenant {
        check_tenant(&caller, &new.tenant)?;
        return Err(invalid("tenant", format!("{:?} is not the schedule's tenant {tenant:?}: omit it", new.tenant)));
    }
    if new.name != name {
        return Err(invalid(
            "name",
            format!("{:?} is not {name:?}: rename a schedule by removing it and adding it anew", new.name),
        ));
    }
    Ok(Json(schedules(&st).await?.set(&tenant, &name, |s| *s = new, now_ms()).await?))
}

pub async fn remove(
    State(st): State<ApiState>,
    caller: Caller,
    Path(name): Path<String>,
    Query(q): Query<TenantQuery>,
) -> Result<StatusCode, ApiError> {
    let tenant = tenant_of(&caller, q.tenant)?;
    schedules(&st).await?.remove(&tenant, &name).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `POST /v1/schedules/{name}:pause` and `:resume`.
pub async fn action(
    State(st): State<ApiState>,
    caller: Caller,
    Path(segment): Path<String>,
    Query(q): Query<TenantQuery>,
) -> Result<Json<Listed>, ApiError> {
    let (name, paused) = match segment.rsplit_once(':') {
        Some((n, "pause")) => (n.to_string(), true),
        Some((n, "resume")) => (n.to_string(), false),
        _ => {
            return Err(ApiError::new(
                StatusCode::NOT_FOUND,
                super::codes::NO_SUCH_ROUTE,
                format!("POST /v1/schedules/{segment}: use /v1/schedules/<name>:pause or :resume"),
            ))
        }
    };
    let tenant = tenant_of(&caller, q.tenant)?;
    Ok(Json(schedules(&st).await?.pause(&tenant, &name, paused, now_ms()).await?))
}
