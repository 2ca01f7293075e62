//! The built-in HTTP executor: jobs written in any language behind an HTTP endpoint.
//! POSTs the payload with the job's identity in headers and maps the response:
//! 2xx success (body = output), 408/429/5xx retryable (`Retry-After` honoured in both its
//! seconds and HTTP-date forms, at most [`MAX_RETRY_AFTER`], an hour),
//! 502/503/504 and connect errors = dependency failure, other 4xx = permanent.
//! https URLs use rustls (webpki roots, plus `job_types.<j>.ca_file` for a private CA).
//!
//! One tenant's job must not become another's outage, so the executor is bounded:
//! a request it cannot build (e.g. a header value the job carries) is `permanent` (the
//! job's fault, not the dependency's, so it never opens the type's breaker); redirects
//! are not followed unless the job type sets `follow_redirects = true`; a response body
//! is read up to `worker.max_payload_bytes` (a larger success is `permanent`); errors
//! name the URL as scheme, host and path only ([`shown_url`]), and URLs with credentials
//! are refused at config load ([`check_url`]).

use super::{Handler, HandlerError, HandlerResult, JobContext};
use crate::model::FailureClass;
use futures::future::BoxFuture;
use futures::FutureExt;
use std::time::Duration;

pub struct HttpExecutor {
    client: reqwest::Client,
    url: String,
    /// The URL as errors show it (scheme, host, path).
    shown: String,
    /// Largest response body read (`worker.max_payload_bytes`).
    max_body: usize,
}

/// How one job type's executor is built (`[job_types.<j>]`).
#[derive(Debug, Clone, Default)]
pub struct ExecutorSettings<'a> {
    pub url: &'a str,
    /// PEM file of extra trusted CA certificates.
    pub ca_file: Option<&'a str>,
    pub follow_redirects: bool,
    pub max_body: usize,
}

/// Why a job type's executor could not be built: its `ca_file`, or the client itself.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error("{0}")]
    CaFile(String),
    #[error("cannot build an HTTP client: {0}")]
    Client(String),
}

impl HttpExecutor {
    pub fn new(s: &ExecutorSettings<'_>) -> Result<Self, BuildError> {
        let redirects =
            if s.follow_redirects { reqwest::redirect::Policy::limited(5) } else { reqwest::redirect::Policy::none() };
        let mut b = reqwest::Client::builder().redirect(redirects);
        if let Some(ca_file) = s.ca_file {
            for c in ca_certificates(ca_file).map_err(BuildError::CaFile)? {
                b = b.add_root_certificate(c);
            }
        }
        let client = b.build().map_err(|e| BuildError::Client(e.to_string()))?;
        Ok(HttpExecutor { client, url: s.url.to_string(), shown: shown_url(s.url), max_body: s.max_body })
    }
}

/// The CA certificates in the PEM file `ca_file`.
fn ca_certificates(ca_file: &str) -> Result<Vec<reqwest::Certificate>, String> {
    let pem = std::fs::read(ca_file).map_err(|e| format!("cannot read {ca_file:?}: {e}"))?;
    let certs = reqwest::Certificate::from_pem_bundle(&pem)
        .map_err(|e| format!("{ca_file:?} is not a PEM certificate bundle: {e}"))?;
    if certs.is_empty() {
        return Err(format!("{ca_file:?} holds no PEM certificate (-----BEGIN CERTIFICATE-----)"));
    }
    Ok(certs)
}

/// Checks an executor URL at config load: http(s), a host, no credentials (they would
/// show wherever the URL does), no spaces or control characters.
pub fn check_url(url: &str) -> Result<(), String> {
    let rest = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"))
        .ok_or("handler = \"http\" needs url = \"http://host:port/path\" (http:// or https://)")?;
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    if authority.contains('@') {
        return Err("must not carry credentials (user:password@): job errors and logs would show them; \
                    let the service trust fairway's network or its client certificate instead"
            .into());
    }
    if authority.is_empty() || authority.starts_with(':') {
        return Err("has no host; e.g. \"http://127.0.0.1:8080/run\"".into());
    }
    if url.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err("must not contain spaces or control characters (percent-encode them)".into());
    }
    Ok(())
}

/// A URL as errors and logs show it: scheme, host (and port) and path; never user
/// info, query or fragment, which may hold secrets.
pub fn shown_url(url: &str) -> String {
    let (scheme, rest) = url.split_once("://").unwrap_or(("", url));
    let end = rest.find(['?', '#']).unwrap_or(rest.len());
    let rest = &rest[..end];
    let (authority, path) = rest.find('/').map_or((rest, ""), |i| rest.split_at(i));
    let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    format!("{scheme}://{host}{path}")
}

/// Failure class of a request that got no response: one reqwest could not even build
/// (the job's own values, e.g. a header) is `permanent`; the rest are the dependency's.
fn send_error_class(e: &reqwest::Error) -> FailureClass {
    if e.is_builder() {
        FailureClass::Permanent
    } else {
        FailureClass::Dependency
    }
}

/// Reads up to `max` bytes of `resp`'s body; Err(n) when it is longer (n bytes read).
async fn read_capped(mut resp: reqwest::Response, max: usize) -> Result<Vec<u8>, usize> {
    let mut body = Vec::new();
    while let Ok(Some(chunk)) = resp.chunk().await {
        if body.len() + chunk.len() > max {
            return Err(body.len() + chunk.len());
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// Maps an HTTP status to the failure class of the attempt (None: success).
pub fn classify_status(status: u16) -> Option<FailureClass> {
    match status {
        200..=299 => None,
        502..=504 => Some(FailureClass::Dependency),
        408 | 429 | 500..=599 => Some(FailureClass::AppError),
        _ => Some(FailureClass::Permanent),
    }
}

/// Longest wait a dependency's `Retry-After` can impose on a job's next attempt: the
/// endpoint is the tenant's, and its answer must not park a job for days (or overflow the
/// next attempt's time).
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(3600);

fn retry_after(headers: &reqwest::header::HeaderMap) -> Option<Duration> {
    let v = headers.get(reqwest::header::RETRY_AFTER)?.to_str().ok()?;
    parse_retry_after(v, std::time::SystemTime::now())
}

/// A `Retry-After` value (RFC 9110: delay seconds, or an HTTP-date) as a wait from `now`,
/// at most [`MAX_RETRY_AFTER`]; a date in the past is no wait. None if it is neither form
/// (the header is then ignored, like a missing one).
fn parse_retry_after(value: &str, now: std::time::SystemTime) -> Option<Duration> {
    let value = value.trim();
    let wait = match value.parse::<u64>() {
        Ok(secs) => Duration::from_secs(secs),
        Err(_) => {
            let at = httpdate::parse_http_date(value).ok()?;
            at.duration_since(now).unwrap_or(Duration::ZERO)
        }
    };
    Some(wait.min(MAX_RETRY_AFTER))
}

impl Handler for HttpExecutor {
    fn run(&self, ctx: JobContext) -> BoxFuture<'static, HandlerResult> {
        let client = self.client.clone();
        let (url, shown, max_body) = (self.url.clone(), self.shown.clone(), self.max_body);
        async move {
            let job = &ctx.job;
            let req = client
                .post(&url)
                .header("content-type", "application/octet-stream")
                .header("idempotency-key", &job.job_id)
                .header("x-fairway-job-id", &job.job_id)
                .header("x-fairway-tenant", &job.tenant)
                .header("x-fairway-job-type", &job.job_type)
                .header("x-fairway-attempt", ctx.attempt.to_string())
                .header("x-fairway-first-attempt", if ctx.first_attempt() { "1" } else { "0" })
                .header("x-fairway-crash-count", job.crash_count.to_string())
                .header("x-fairway-handoff-count", job.handoff_count.to_string());
            // The submitter's W3C trace context, so the service's spans join its trace.
            let req = match ctx.trace_context() {
                (Some(tp), Some(ts)) => req.header("traceparent", tp).header("tracestate", ts),
                (Some(tp), None) => req.header("traceparent", tp),
                _ => req,
            };
            let resp = req.body(job.payload.clone()).send().await;
            let resp = match resp {
                Ok(r) => r,
                Err(e) => {
                    // reqwest's message names the URL in full: show ours instead.
                    let mut why = Vec::new();
                    let mut source = std::error::Error::source(&e);
                    while let Some(s) = source {
                        why.push(s.to_string());
                        source = s.source();
                    }
                    let why = if why.is_empty() { "request failed".to_string() } else { why.join(": ") };
                    let what = if e.is_builder() { "cannot build the request" } else { "no response" };
                    let message = format!("POST {shown}: {what}: {why}");
                    return Err(HandlerError { class: send_error_class(&e), message, retry_after: None });
                }
            };
            let status = resp.status().as_u16();
            let wait = retry_after(resp.headers());
            match classify_status(status) {
                None => read_capped(resp, max_body).await.map_err(|n| {
                    HandlerError::permanent(format!(
                        "POST {shown} returned a body of more than {n} bytes, above worker.max_payload_bytes = \
                         {max_body}; return a reference to large outputs"
                    ))
                }),
                Some(class) => {
                    let body = read_capped(resp, 512).await.unwrap_or_default();
                    let text = String::from_utf8_lossy(&body).into_owned();
                    let hint = if (300..400).contains(&status) {
                        " (redirects are not followed; point url at the final address or set follow_redirects = true)"
                    } else {
                        ""
                    };
                    Err(HandlerError {
                        class,
                        message: format!("POST {shown} returned {status}{hint}: {text}"),
                        retry_after: wait,
                    })
                }
            }
        }
        .boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Both forms of `Retry-After` are honoured, and neither can ask for more than an
    /// hour (a tenant's endpoint answering `u64::MAX` or a date in 9999).
    #[test]
    fn retry_after_takes_seconds_and_dates_and_is_bounded() {
        let now = httpdate::parse_http_date("Wed, 02 Dec 2026 05:00:00 GMT").unwrap();
        assert_eq!(parse_retry_after(" 120 ", now), Some(Duration::from_secs(120)));
        assert_eq!(parse_retry_after("Wed, 02 Dec 2026 05:01:30 GMT", now), Some(Duration::from_secs(90)));
        assert_eq!(parse_retry_after("Wed, 02 Dec 2026 04:00:00 GMT", now), Some(Duration::ZERO));
        assert_eq!(parse_retry_after("18446744073709551615", now), Some(MAX_RETRY_AFTER));
        assert_eq!(parse_retry_after("Fri, 31 Dec 9999 23:59:59 GMT", now), Some(MAX_RETRY_AFTER));
        assert_eq!(parse_retry_after("soon", now), None);
        assert_eq!(parse_retry_after("-5", now), None);
    }

    #[test]
    fn statuses_map_to_classes() {
        assert_eq!(classify_status(200), None);
        assert_eq!(classify_status(204), None);
        assert_eq!(classify_status(400), Some(FailureClass::Permanent));
        assert_eq!(classify_status(404), Some(FailureClass::Permanent));
        assert_eq!(classify_status(408), Some(FailureClass::AppError));
        assert_eq!(classify_status(429), Some(FailureClass::AppError));
        assert_eq!(classify_status(500), Some(FailureClass::AppError));
        assert_eq!(classify_status(503), Some(FailureClass::Dependency));
        assert_eq!(classify_status(302), Some(FailureClass::Permanent), "redirects are not followed");
    }

    #[test]
    fn urls_with_credentials_are_refused_and_errors_show_scheme_host_path() {
        assert_eq!(check_url("http://127.0.0.1:8080/run"), Ok(()));
        let e = check_url("https://user:pass@svc.example/run").unwrap_err();
        assert!(e.contains("credentials") && !e.contains("pass@"), "{e}");
        assert!(check_url("ftp://svc/run").is_err());
        assert!(check_url("http:///run").is_err());
        assert!(check_url("http://svc/a b").is_err());
        assert_eq!(shown_url("https://u:p@svc.example:8443/run/x?token=s3cret#f"), "https://svc.example:8443/run/x");
        assert_eq!(shown_url("http://svc"), "http://svc");
    }

    #[tokio::test]
    async fn a_request_that_cannot_be_built_is_permanent() {
        let exec = HttpExecutor::new(&ExecutorSettings {
            url: "http://127.0.0.1:9/run",
            max_body: 1024,
            ..Default::default()
        })
        .unwrap();
        let err = exec.client.post(&exec.url).header("tracestate", "a=b\u{1}").send().await.unwrap_err();
        assert_eq!(send_error_class(&err), FailureClass::Permanent, "{err}");
    }
}
