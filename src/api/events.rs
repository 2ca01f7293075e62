//! Watching jobs over HTTP (the events shell is `crate::watch::events`, rules `core::events`):
//!
//! | route | answer |
//! |-------|--------|
//! | `GET /v1/jobs/{id}/events` | 200 `{job_id, state, events: [...]}`: the job's history, oldest first |
//! | `GET /v1/jobs/{id}/events?follow=1` | Server-Sent Events: the history, then live events, until the job ends |
//! | `GET /v1/events?follow=1[&tenant=T]` | Server-Sent Events: every live event of the caller's tenant (admin: all, or `tenant`) |
//!
//! Each SSE message has `id` = event id, `event` = kind, `data` = the event as JSON. A
//! job stream ends after the terminal event (`succeeded`, `failed`, `cancelled`,
//! `expired`); if that event never arrives (lost before the recorder saw it) the stream
//! ends with one made from the job's row 5 s after the row says it finished.
//!
//! Streams are bounded per API key and in total (`[api.limits]` `streams_per_key`,
//! `streams`: 429 `TOO_MANY_STREAMS`), end when their key is revoked, and a job stream
//! is fed by the live feed (after its first 10 s the store is read every 15 s as a backstop, or when the feed lags).

use super::{check_job_id, codes, may_see, ApiError, ApiState, Caller};
use crate::core::events::{ends_stream, shown_state, with_submission, JobState, WaitReason};
use crate::model::{EventKind, JobEvent};
use crate::store::{EventStatements, JobRow};
use crate::{metrics as m, now_ms};
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::sse::Event;
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures::StreamExt;
use serde::Deserialize;
use std::collections::{HashSet, VecDeque};
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::broadcast;

/// How often a job stream without the live feed re-reads the history.
const POLL: Duration = Duration::from_secs(1);
/// How often a job stream fed by the live feed re-reads it anyway (a backstop for
/// events the feed missed; a lagging feed triggers a read at once), once the stream is
/// `FED_AFTER` old: before that it reads every `POLL`, since the feed starts at the
/// topic's end and misses what was produced just before it subscribed.
const POLL_FED: Duration = Duration::from_secs(15);
const FED_AFTER: Duration = Duration::from_secs(10);
/// A job whose row is terminal this long without a terminal event ends its stream anyway.
const END_GRACE_MS: i64 = 5_000;
/// Longest a stream stays open (the client reconnects; bounded resources per stream).
const MAX_STREAM: Duration = Duration::from_secs(6 * 3600);

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct EventsQuery {
    #[serde(default)]
    follow: Option<String>,
    #[serde(default)]
    tenant: Option<String>,
}

fn follow(q: &EventsQuery) -> Result<bool, ApiError> {
    match q.follow.as_deref() {
        None | Some("0") | Some("false") => Ok(false),
        Some("1") | Some("true") | Some("") => Ok(true),
        Some(other) => Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            codes::INVALID_QUERY,
            format!(
                "follow={other:?} is not understood; use follow=1 to stream events, or leave it out for the history"
            ),
        )),
    }
}

fn event_json(e: &JobEvent) -> serde_json::Value {
    serde_json::to_value(e).unwrap_or_default()
}

fn sse(e: &JobEvent) -> Event {
    Event::default().id(e.event_id.clone()).event(e.kind.as_str()).data(event_json(e).to_string())
}

/// What a tenant's live stream passes on from the feed.
#[derive(Debug, PartialEq)]
enum Fed {
    Event(Arc<JobEvent>),
    /// The stream fell behind the feed: events were skipped.
    Gap,
}

/// The feed's events of `tenant` (every tenant's for None) until `deadline`, and a
/// [`Fed::Gap`] wherever the stream fell behind and events were skipped.
fn tenant_feed(
    rx: broadcast::Receiver<Arc<JobEvent>>,
    tenant: Option<String>,
    deadline: tokio::time::Instant,
) -> impl futures::Stream<Item = Fed> {
    futures::stream::unfold((rx, tenant), move |(mut rx, tenant)| async move {
        loop {
            match tokio::time::timeout_at(deadline, rx.recv()).await.ok()? {
                Ok(e) if tenant.as_deref().is_none_or(|t| t == e.tenant) => return Some((Fed::Event(e), (rx, tenant))),
                Ok(_) => continue,
                Err(broadcast::error::RecvError::Lagged(_)) => return Some((Fed::Gap, (rx, tenant))),
                Err(broadcast::error::RecvError::Closed) => return None,
            }
        }
    })
}

/// The event a tenant's live stream sends when it fell behind the feed and events were
/// skipped: never silent. How many is left out (the feed carries every tenant's events).
fn gap() -> Event {
    let data = serde_json::json!({
        "missed": true,
        "message": "this stream fell behind and some events were skipped; read GET /v1/jobs/{id}/events for \
                    the jobs you follow (their history is complete)",
    });
    Event::default().event("gap").data(data.to_string())
}

/// Counts open streams (the gauge goes down when the stream is dropped).
struct StreamGauge;
impl StreamGauge {
    fn open() -> StreamGauge {
        metrics::gauge!(m::EVENT_STREAMS).increment(1.0);
        StreamGauge
    }
}
impl Drop for StreamGauge {
    fn drop(&mut self) {
        metrics::gauge!(m::EVENT_STREAMS).decrement(1.0);
    }
}

/// Why the tenant of a queued job waits, from the live workers' scheduler snapshots of
/// its pool (what `fairway stats` shows). None when nothing is known.
async fn tenant_wait(st: &ApiState, row: &JobRow) -> Option<WaitReason> {
    let (tenant, pool) = (row.tenant.as_deref()?, row.pool.as_deref()?.parse().ok()?);
    let stmts = st.store().fleet_statements().await.ok()?;
    let rows = stmts.worker_stats(&st.config().pool_topic(pool)).await.ok()?;
    let fleet = crate::core::fleet::aggregate(&rows, now_ms(), 30_000);
    let t = fleet.tenants.iter().find(|t| t.tenant == tenant)?;
    WaitReason::from_scheduler(t.wait_reason.as_deref()?)
}

/// Adds the state model's view to a job's status JSON: `state` (queued jobs whose tenant
/// waits show `waiting` with `wait_reason`), and `next_attempt_at` while retrying.
pub(super) async fn add_state(st: &ApiState, row: &JobRow, out: &mut serde_json::Value) {
    let status = row.status.as_deref().unwrap_or_default();
    let wait = if JobState::from_status(status) == Some(JobState::Queued) { tenant_wait(st, row).await } else { None };
    let Some((state, why)) = shown_state(status, wait) else { return };
    out["state"] = state.as_str().into();
    out["wait_reason"] = why.map(WaitReason::as_str).into();
    if state == JobState::Retrying {
        if let Ok(stmts) = st.event_statements().await {
            let history = stmts.events(&row.job_id, None).await.unwrap_or_default();
            let next = history.iter().rev().find(|e| e.kind == EventKind::Retrying).and_then(|e| e.next_attempt_at);
            out["next_attempt_at"] = next.into();
        }
    }
}

/// `GET /v1/jobs/{id}` of a job without a row (produced straight to Kafka, not recorded
/// by a worker yet): its state from its history, if it has one; else 404.
pub(super) async fn status_from_history(
    st: &ApiState,
    caller: &Caller,
    id: &str,
) -> Result<Json<serde_json::Value>, ApiError> {
    let history = st.event_statements().await?.events(id, None).await?;
    let (Some(first), Some(state)) = (history.first(), crate::core::events::fold(&history)) else {
        return Err(ApiError::not_found(id));
    };
    if !caller.may_see(Some(&first.tenant)) {
        return Err(ApiError::not_found(id));
    }
    let last = history.last().expect("not empty");
    Ok(Json(serde_json::json!({
        "job_id": id, "tenant": first.tenant, "job_type": first.job_type, "status": state.as_str(),
        "state": state.as_str(), "attempts": last.attempt, "worker": last.worker,
        "progress": history.iter().rev().find_map(|e| e.progress),
        "source": "events (no state row yet)",
    })))
}

/// `GET /v1/jobs/{id}/events[?follow=1]`.
pub(super) async fn job_events(
    State(st): State<ApiState>,
    caller: Caller,
    headers: axum::http::HeaderMap,
    Path(id): Path<String>,
    Query(q): Query<EventsQuery>,
) -> Result<Response, ApiError> {
    check_job_id(&id)?;
    let follow = follow(&q)?;
    let stmts = st.event_statements().await?.clone();
    let (row, history) = tokio::try_join!(st.store().job(&id), stmts.events(&id, None))?;
    let history = with_submission(history, row.as_ref().and_then(JobRow::submitted_state));
    let owner_known = row.is_some() || !history.is_empty();
    let visible = match history.first() {
        // The history names the tenant (a job without a row yet, or whose row expired).
        Some(e) if row.is_none() => caller.may_see(Some(&e.tenant)),
        _ => may_see(&st, &caller, &id, row.as_ref()).await?,
    };
    if !visible || (!owner_known && caller.is_admin()) {
        return Err(ApiError::not_found(&id));
    }
    if !follow {
        let state = row.as_ref().and_then(|r| JobState::from_status(r.status.as_deref()?));
        let state = state.or_else(|| crate::core::events::fold(&history));
        let body = serde_json::json!({
            "job_id": id,
            "state": state.map(JobState::as_str),
            "events": history.iter().map(event_json).collect::<Vec<_>>(),
        });
        return Ok(Json(body).into_response());
    }
    let slot = st.limits().stream_slot(&super::auth::key_id(&headers), Some(&caller))?;
    let live = st.feed().map(|f| f.subscribe());
    let fed_from = live.is_some().then(|| tokio::time::Instant::now() + FED_AFTER);
    let follower = JobFollower {
        fed_from,
        id,
        stmts,
        store: st.store().clone(),
        live,
        seen: HashSet::new(),
        pending: history.into(),
        next_poll: tokio::time::Instant::now() + POLL,
        done: false,
        deadline: tokio::time::Instant::now() + MAX_STREAM,
        _gauge: StreamGauge::open(),
        _slot: slot,
    };
    let stream = futures::stream::unfold(follower, |mut f| async move {
        let e = f.next().await?;
        Some((Ok::<_, Infallible>(sse(&e)), f))
    });
    Ok(super::limits::live_stream(super::drain::ending(&st, stream), &st, headers))
}

/// One job's stream: history first, then live events and periodic re-reads, deduplicated.
struct JobFollower {
    /// From when the live feed alone feeds the stream (history re-read every `POLL_FED`;
    /// None: no feed, re-read every `POLL`).
    fed_from: Option<tokio::time::Instant>,
    id: String,
    stmts: EventStatements,
    store: crate::store::Store,
    live: Option<broadcast::Receiver<Arc<JobEvent>>>,
    seen: HashSet<String>,
    pending: VecDeque<JobEvent>,
    next_poll: tokio::time::Instant,
    done: bool,
    deadline: tokio::time::Instant,
    _gauge: StreamGauge,
    _slot: super::limits::Slot,
}

impl JobFollower {
    async fn next(&mut self) -> Option<JobEvent> {
        loop {
            if let Some(e) = self.pending.pop_front() {
                if self.done || !self.seen.insert(e.event_id.clone()) {
                    continue;
                }
                self.done = ends_stream(e.kind);
                return Some(e);
            }
            if self.done || tokio::time::Instant::now() >= self.deadline {
                return None;
            }
            let next_poll = self.next_poll;
            let recv = async {
                match &mut self.live {
                    Some(rx) => Some(rx.recv().await),
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                r = recv => match r {
                    Some(Ok(e)) if e.job_id == self.id => self.pending.push_back((*e).clone()),
                    Some(Ok(_)) => {}
                    Some(Err(broadcast::error::RecvError::Lagged(_))) => self.next_poll = tokio::time::Instant::now(),
                    Some(Err(broadcast::error::RecvError::Closed)) | None => self.live = None,
                },
                _ = tokio::time::sleep_until(next_poll) => {
                    let now = tokio::time::Instant::now();
                    let fed = self.fed_from.is_some_and(|t| now >= t);
                    self.next_poll = now + if fed { POLL_FED } else { POLL };
                    self.poll().await;
                }
            }
        }
    }

    /// Re-reads the history (new events go out in time order); ends the stream from the
    /// row when the terminal event is overdue.
    async fn poll(&mut self) {
        if let Ok(h) = self.stmts.events(&self.id, None).await {
            self.pending.extend(h.into_iter().filter(|e| !self.seen.contains(&e.event_id)));
        }
        if !self.pending.is_empty() {
            return;
        }
        let Ok(Some(row)) = self.store.job(&self.id).await else { return };
        let Some(status) = row.status.as_deref().and_then(|s| s.parse::<crate::model::JobStatus>().ok()) else {
            return;
        };
        let finished = row.finished_at.unwrap_or(0);
        if now_ms() - finished >= END_GRACE_MS {
            self.pending.push_back(JobEvent {
                event_id: format!("row-{}", self.id),
                job_id: self.id.clone(),
                tenant: row.tenant.clone().unwrap_or_default(),
                job_type: row.job_type.clone().unwrap_or_default(),
                kind: status.into(),
                at: finished,
                attempt: row.attempts.unwrap_or(0),
                worker: row.worker.clone(),
                progress: None,
                message: row.error.clone(),
                next_attempt_at: None,
            });
        }
    }
}

/// `GET /v1/events?follow=1[&tenant=T]`: live events of a tenant.
pub(super) async fn tenant_events(
    State(st): State<ApiState>,
    caller: Caller,
    headers: axum::http::HeaderMap,
    Query(q): Query<EventsQuery>,
) -> Result<Response, ApiError> {
    if !follow(&q)? {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            codes::INVALID_QUERY,
            "GET /v1/events only streams (add ?follow=1); a job's history is at GET /v1/jobs/{id}/events",
        ));
    }
    let tenant = match (caller.tenant(), q.tenant) {
        (Some(own), Some(asked)) if own != asked => {
            return Err(ApiError::new(
                StatusCode::FORBIDDEN,
                codes::FORBIDDEN,
                format!("this key belongs to tenant {own:?} and cannot follow tenant {asked:?}; leave `tenant` out"),
            ))
        }
        (Some(own), _) => Some(own.to_string()),
        (None, asked) => asked,
    };
    let Some(feed) = st.feed() else {
        return Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            codes::KAFKA_UNAVAILABLE,
            "this server has no live events feed (built without one); use GET /v1/jobs/{id}/events",
        ));
    };
    let slot = st.limits().stream_slot(&super::auth::key_id(&headers), Some(&caller))?;
    let rx = feed.subscribe();
    let gauge = (StreamGauge::open(), slot);
    let deadline = tokio::time::Instant::now() + MAX_STREAM;
    let stream = tenant_feed(rx, tenant, deadline).map(move |fed| {
        let _held = &gauge;
        Ok::<_, Infallible>(match fed {
            Fed::Event(e) => sse(&e),
            Fed::Gap => {
                metrics::counter!(m::EVENT_STREAM_GAPS).increment(1);
                gap()
            }
        })
    });
    Ok(super::limits::live_stream(super::drain::ending(&st, stream), &st, headers))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(tenant: &str, n: i64) -> Arc<JobEvent> {
        Arc::new(crate::core::events::succeeded_for_test(tenant, &format!("j{n}"), n))
    }

    /// A burst of another tenant's events past the feed's buffer: the tenant's stream says
    /// it skipped events (a gap) instead of going on as if nothing was missed.
    #[tokio::test]
    async fn a_stream_that_falls_behind_says_so_and_goes_on_with_its_tenants_events() {
        let (tx, rx) = broadcast::channel(4);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        let feed = tenant_feed(rx, Some("acme".into()), deadline);
        tx.send(event("acme", 0)).unwrap();
        for n in 1..=10 {
            tx.send(event("globex", n)).unwrap();
        }
        tx.send(event("acme", 11)).unwrap();
        drop(tx);
        let got: Vec<Fed> = feed.collect().await;
        assert_eq!(got, vec![Fed::Gap, Fed::Event(event("acme", 11))], "acme's first event was overrun");
    }
}
