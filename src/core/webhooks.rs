//! Webhooks, the pure rules: which URLs may be called, what is POSTed for a job's result,
//! how it is signed, which answers count as delivered, and when to try again. No I/O;
//! `now` is an argument (the I/O shell is `crate::watch::webhooks`).
//!
//! **Signature.** Every POST carries
//! `Fairway-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256(secret, "<t>.<body>")>`
//! with the tenant's secret (`webhooks.secrets.<tenant>`), the exact request body bytes,
//! and `Fairway-Delivery: <delivery id>` (`<job id>.g<generation>`, the same for every
//! attempt: receivers drop copies by it). A receiver recomputes the HMAC over
//! `t + "." + body`, compares in constant time, and refuses timestamps older than its
//! tolerance (e.g. 5 minutes) against replays.

use crate::model::{EventKind, JobEvent, JobResult, Millis};
use hmac::{Hmac, Mac};
use sha2::Sha256;
use std::time::Duration;

/// The signature header's name.
pub const SIGNATURE_HEADER: &str = "Fairway-Signature";
/// The delivery id header's name.
pub const DELIVERY_HEADER: &str = "Fairway-Delivery";

/// Longest callback URL accepted.
const MAX_URL_LEN: usize = 2048;

/// Checks a callback URL: `http://` or `https://` with a host, no credentials (they would
/// show in events), at most 2048 characters. Other schemes (`file:`, `gopher:`...) are
/// refused so a callback cannot reach anything but an HTTP server. Returns what is wrong
/// and how to fix it.
pub fn check_url(url: &str) -> Result<(), String> {
    if url.len() > MAX_URL_LEN {
        return Err(format!("is {} characters; at most {MAX_URL_LEN} are accepted", url.len()));
    }
    let rest = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"))
        .ok_or_else(|| format!("{url:?} is not an http:// or https:// URL (only HTTP callbacks are allowed)"))?;
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    if authority.contains('@') {
        return Err("must not carry credentials (user:password@); authenticate with the signature header".into());
    }
    if authority.is_empty() || authority.starts_with(':') {
        return Err(format!("{url:?} has no host; e.g. \"https://example.com/hooks/fairway\""));
    }
    if url.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err("must not contain spaces or control characters (percent-encode them)".into());
    }
    Ok(())
}

/// The host (and port) of a checked URL, for events and logs (never the path or query,
/// which may hold tokens).
pub fn host_of(url: &str) -> &str {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    rest.split(['/', '?', '#']).next().unwrap_or("")
}

/// The delivery id of a result: the same for every attempt and every copy of the result.
pub fn delivery_id(r: &JobResult) -> String {
    format!("{}.g{}", r.job_id, r.generation)
}

/// The JSON body POSTed for a result (the output as text, as `GET /v1/jobs/{id}` shows it).
pub fn body(r: &JobResult) -> Vec<u8> {
    let v = serde_json::json!({
        "delivery_id": delivery_id(r),
        "job_id": r.job_id,
        "tenant": r.tenant,
        "job_type": r.job_type,
        "pool": r.pool.as_str(),
        "status": r.status.as_str(),
        "output": r.output.as_ref().map(|o| String::from_utf8_lossy(o).into_owned()),
        "error": r.error,
        "failure_class": r.failure_class.map(|c| c.as_str()),
        "attempts": r.attempts,
        "generation": r.generation,
        "submitted_at": r.submitted_at,
        "started_at": r.started_at,
        "finished_at": r.finished_at,
        "peak_memory_bytes": r.peak_memory_bytes,
        "cpu_ms": r.cpu_ms,
    });
    serde_json::to_vec(&v).expect("a JSON value serializes")
}

/// The `Fairway-Signature` value for `body` signed at `now` with `secret` (see the module
/// docs for the format).
pub fn signature(secret: &[u8], now: Millis, body: &[u8]) -> String {
    let t = now.div_euclid(1000);
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).expect("HMAC takes keys of any length");
    mac.update(t.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    let hex: String = mac.finalize().into_bytes().iter().map(|b| format!("{b:02x}")).collect();
    format!("t={t},v1={hex}")
}

/// A receiver's answer to one attempt: its HTTP status, or why there was none.
#[derive(Debug, Clone, Copy)]
pub struct Answer<'a> {
    pub status: Option<u16>,
    pub error: &'a str,
}

/// What an attempt's answer means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// 2xx: done.
    Delivered,
    /// No answer, 408, 429 or 5xx: the receiver may take it later.
    Retry,
    /// Any other status (3xx: redirects are not followed; 4xx: the receiver refuses it).
    Refused,
}

/// Judges an attempt by its HTTP status (None: no answer, e.g. connection refused or
/// timed out).
pub fn judge(status: Option<u16>) -> Verdict {
    match status {
        Some(s) if (200..300).contains(&s) => Verdict::Delivered,
        None | Some(408) | Some(429) => Verdict::Retry,
        Some(s) if s >= 500 => Verdict::Retry,
        Some(_) => Verdict::Refused,
    }
}

/// Retry schedule of deliveries: attempt n (1-based) failed, the next waits
/// `initial * 2^(n-1)`, at most `max`; after `max_attempts` attempts it gives up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    pub initial: Duration,
    pub max: Duration,
    pub max_attempts: u32,
}

impl Backoff {
    /// The wait after attempt `attempt` (1-based) failed with a retryable answer; None
    /// when that was the last attempt.
    pub fn after(&self, attempt: u32) -> Option<Duration> {
        if attempt >= self.max_attempts {
            return None;
        }
        Some(super::backoff::doubling(self.initial, self.max, attempt))
    }
}

/// What one attempt led to: the event that tells watchers, and when to try again.
#[derive(Debug, Clone, PartialEq)]
pub struct AttemptOutcome {
    pub event: JobEvent,
    /// Some: try again at this time.
    pub retry_at: Option<Millis>,
}

/// One delivery attempt: the id of the event that will tell of it, the result sent, where
/// to, and which attempt it is (1-based; 0: not sent at all).
#[derive(Debug, Clone)]
pub struct Delivery<'a> {
    pub event_id: String,
    pub result: &'a JobResult,
    pub url: &'a str,
    pub attempt: u32,
}

/// The outcome of a delivery attempt, answered with `answer` at `now`. The event's
/// `attempt` is the delivery attempt, its `message` the answer, `next_attempt_at` the
/// next try.
pub fn attempt_outcome(delivery: Delivery<'_>, answer: Answer<'_>, backoff: &Backoff, now: Millis) -> AttemptOutcome {
    let Delivery { event_id, result: r, url, attempt } = delivery;
    let verdict = judge(answer.status);
    let answer = match answer.status {
        Some(s) => format!("HTTP {s}"),
        None => format!("no answer ({})", answer.error),
    };
    let retry_at = match verdict {
        Verdict::Retry => backoff.after(attempt).map(|d| now + d.as_millis() as Millis),
        _ => None,
    };
    let host = host_of(url);
    let message = match (verdict, retry_at) {
        (Verdict::Delivered, _) => format!("delivered to {host}: {answer} (attempt {attempt})"),
        (Verdict::Retry, Some(_)) => format!("to {host}: {answer} (attempt {attempt}); retrying"),
        (Verdict::Retry, None) => {
            format!("to {host}: {answer} (attempt {attempt} of {}); giving up", backoff.max_attempts)
        }
        (Verdict::Refused, _) => format!(
            "to {host}: {answer} (attempt {attempt}); not retried: a 3xx or 4xx means the receiver refuses it \
             (redirects are not followed; fix the URL or the receiver)"
        ),
    };
    let kind = if verdict == Verdict::Delivered { EventKind::WebhookDelivered } else { EventKind::WebhookFailed };
    let about = Delivery { event_id, result: r, url, attempt };
    AttemptOutcome { event: delivery_event(about, kind, message, retry_at, now), retry_at }
}

/// A `webhook_*` event about a delivery of its result.
pub fn delivery_event(
    delivery: Delivery<'_>,
    kind: EventKind,
    message: String,
    next_attempt_at: Option<Millis>,
    now: Millis,
) -> JobEvent {
    let Delivery { event_id, result: r, attempt, .. } = delivery;
    JobEvent {
        event_id,
        job_id: r.job_id.clone(),
        tenant: r.tenant.clone(),
        job_type: r.job_type.clone(),
        kind,
        at: now,
        attempt: attempt.min(i32::MAX as u32) as i32,
        worker: None,
        progress: None,
        message: Some(message),
        next_attempt_at,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{JobStatus, Pool};
    use proptest::prelude::*;

    fn result() -> JobResult {
        JobResult {
            job_id: "j1".into(),
            tenant: "acme".into(),
            job_type: "noop".into(),
            pool: Pool::Short,
            status: JobStatus::Succeeded,
            output: Some(b"{\"ok\":true}".to_vec()),
            error: None,
            failure_class: None,
            attempts: 1,
            generation: 0,
            submitted_at: 1,
            started_at: Some(2),
            finished_at: 3,
            worker_id: "w".into(),
            peak_memory_bytes: None,
            cpu_ms: None,
        }
    }

    #[test]
    fn urls_only_http_with_a_host_and_no_credentials() {
        for ok in ["http://127.0.0.1:8080/hook", "https://example.com", "https://example.com/a?b=c"] {
            assert_eq!(check_url(ok), Ok(()), "{ok}");
        }
        for (bad, says) in [
            ("file:///etc/passwd", "http://"),
            ("gopher://x", "http://"),
            ("ftp://example.com", "http://"),
            ("http://", "no host"),
            ("http://:80/x", "no host"),
            ("https://u:p@example.com/", "credentials"),
            ("http://example.com/a b", "spaces"),
        ] {
            let e = check_url(bad).unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
        assert!(check_url(&format!("https://e.com/{}", "a".repeat(3000))).unwrap_err().contains("at most"));
        assert_eq!(host_of("https://example.com:8443/p?token=x"), "example.com:8443");
    }

    /// RFC 4231 test case 2 (key "Jefe"), through the signature format.
    #[test]
    fn signature_is_hmac_sha256_of_t_dot_body() {
        // Seconds (not milliseconds) before the dot, then the body bytes.
        let s = signature(b"Jefe", 1_700_000_000_999, b"{}");
        assert!(s.starts_with("t=1700000000,v1="), "{s}");
        let mut mac = Hmac::<Sha256>::new_from_slice(b"Jefe").unwrap();
        mac.update(b"1700000000.{}");
        let want: String = mac.finalize().into_bytes().iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(s, format!("t=1700000000,v1={want}"));
        // The HMAC itself: RFC 4231 test case 2.
        let mut mac = Hmac::<Sha256>::new_from_slice(b"Jefe").unwrap();
        mac.update(b"what do ya want for nothing?");
        let hex: String = mac.finalize().into_bytes().iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(hex, "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
    }

    #[test]
    fn body_names_the_result_and_the_delivery() {
        let v: serde_json::Value = serde_json::from_slice(&body(&result())).unwrap();
        assert_eq!(v["delivery_id"], "j1.g0");
        assert_eq!(v["status"], "succeeded");
        assert_eq!(v["output"], "{\"ok\":true}");
        assert_eq!(v["finished_at"], 3);
    }

    #[test]
    fn verdicts() {
        assert_eq!(judge(Some(200)), Verdict::Delivered);
        assert_eq!(judge(Some(204)), Verdict::Delivered);
        for s in [None, Some(408), Some(429), Some(500), Some(503)] {
            assert_eq!(judge(s), Verdict::Retry, "{s:?}");
        }
        for s in [301, 302, 400, 401, 404, 410] {
            assert_eq!(judge(Some(s)), Verdict::Refused, "{s}");
        }
    }

    #[test]
    fn outcomes_say_what_happened_and_when_next() {
        let b = Backoff { initial: Duration::from_secs(1), max: Duration::from_secs(60), max_attempts: 3 };
        let r = result();
        let to = |url, attempt| Delivery { event_id: "e".into(), result: &r, url, attempt };
        let o = attempt_outcome(to("http://h:1/p?secret=x", 1), Answer { status: Some(500), error: "" }, &b, 10_000);
        assert_eq!((o.event.kind, o.retry_at, o.event.attempt), (EventKind::WebhookFailed, Some(11_000), 1));
        assert!(o.event.message.as_deref().unwrap().contains("HTTP 500"));
        assert!(!o.event.message.as_deref().unwrap().contains("secret"), "no path or query in events");
        let o = attempt_outcome(to("http://h:1/", 2), Answer { status: Some(200), error: "" }, &b, 20_000);
        assert_eq!((o.event.kind, o.retry_at), (EventKind::WebhookDelivered, None));
        let o = attempt_outcome(to("http://h:1/", 3), Answer { status: None, error: "connection refused" }, &b, 0);
        assert_eq!((o.event.kind, o.retry_at), (EventKind::WebhookFailed, None));
        assert!(o.event.message.as_deref().unwrap().contains("giving up"));
        let o = attempt_outcome(to("http://h:1/", 1), Answer { status: Some(404), error: "" }, &b, 0);
        assert_eq!(o.retry_at, None);
        assert!(o.event.message.as_deref().unwrap().contains("not retried"));
    }

    proptest! {
        /// The schedule doubles, never exceeds `max`, and ends after `max_attempts`.
        #[test]
        fn backoff_doubles_is_capped_and_bounded(init_ms in 1u64..10_000, max_ms in 1u64..1_000_000, n in 1u32..40) {
            let b = Backoff { initial: Duration::from_millis(init_ms), max: Duration::from_millis(max_ms), max_attempts: n };
            let mut prev = Duration::ZERO;
            for a in 1..n {
                let d = b.after(a).unwrap();
                prop_assert!(d <= b.max && d >= prev.min(b.max));
                prop_assert!(d == b.max || d == b.initial * 2u32.pow(a - 1));
                prev = d;
            }
            prop_assert_eq!(b.after(n), None);
            prop_assert_eq!(b.after(n + 1), None);
        }
    }
}
