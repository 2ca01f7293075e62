//! The built-in HTTP executor: jobs written in any language behind an HTTP endpoint.
//! POSTs the payload with the job's identity in headers and maps the response:
//! 2xx success (body = output), 408/429/5xx retryable (Retry-After honoured),
//! 502/503/504 and connect errors = dependency failure, other 4xx = permanent.
//! https URLs use rustls (webpki roots, plus `job_types.<j>.ca_file` for a private CA).

use super::{Handler, HandlerError, HandlerResult, JobContext};
use crate::model::FailureClass;
use futures::future::BoxFuture;
use futures::FutureExt;
use std::time::Duration;

pub struct HttpExecutor {
    client: reqwest::Client,
    url: String,
}

impl HttpExecutor {
    pub fn new(client: reqwest::Client, url: String) -> Self {
        HttpExecutor { client, url }
    }
}

/// A client that also trusts the CA certificates in the PEM file `ca_file`.
pub fn client_with_ca(ca_file: &str) -> Result<reqwest::Client, String> {
    let pem = std::fs::read(ca_file).map_err(|e| format!("cannot read {ca_file:?}: {e}"))?;
    let certs = reqwest::Certificate::from_pem_bundle(&pem)
        .map_err(|e| format!("{ca_file:?} is not a PEM certificate bundle: {e}"))?;
    if certs.is_empty() {
        return Err(format!("{ca_file:?} holds no PEM certificate (-----BEGIN CERTIFICATE-----)"));
    }
    let mut b = reqwest::Client::builder();
    for c in certs {
        b = b.add_root_certificate(c);
    }
    b.build().map_err(|e| format!("cannot build an HTTP client with {ca_file:?}: {e}"))
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

fn retry_after(headers: &reqwest::header::HeaderMap) -> Option<Duration> {
    let v = headers.get(reqwest::header::RETRY_AFTER)?.to_str().ok()?;
    v.trim().parse::<u64>().ok().map(Duration::from_secs)
}

impl Handler for HttpExecutor {
    fn run(&self, ctx: JobContext) -> BoxFuture<'static, HandlerResult> {
        let client = self.client.clone();
        let url = self.url.clone();
        async move {
            let job = &ctx.job;
            let req = client
                .post(&url)
                .header("content-type", "application/octet-stream")
                .header("idempotency-key", &job.job_id)
                .header("x-fairway-job-id", &job.job_id)
                .header("x-fairway-tenant", &job.tenant)
                .header("x-fairway-job-type", &job.job_type)
                .header("x-fairway-attempt", ctx.attempt.to_string());
            // The submitter's W3C trace context, so the service's spans join its trace.
            let req = match ctx.trace_context() {
                (Some(tp), Some(ts)) => req.header("traceparent", tp).header("tracestate", ts),
                (Some(tp), None) => req.header("traceparent", tp),
                _ => req,
            };
            let resp = req.body(job.payload.clone()).send().await;
            let resp = match resp {
                Ok(r) => r,
                Err(e) if e.is_connect() || e.is_timeout() => {
                    return Err(HandlerError::dependency(format!("POST {url}: {e}")))
                }
                Err(e) => return Err(HandlerError::dependency(format!("POST {url}: {e}"))),
            };
            let status = resp.status().as_u16();
            let wait = retry_after(resp.headers());
            let body = resp.bytes().await.map(|b| b.to_vec()).unwrap_or_default();
            match classify_status(status) {
                None => Ok(body),
                Some(class) => {
                    let text = String::from_utf8_lossy(&body[..body.len().min(512)]).into_owned();
                    Err(HandlerError {
                        class,
                        message: format!("POST {url} returned {status}: {text}"),
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
    }
}
