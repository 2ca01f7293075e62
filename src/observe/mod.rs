//! Watching a fairway process (rather than a job): [`probes`] (readiness and liveness,
//! `/readyz` and `/livez`) and [`telemetry`] (OpenTelemetry spans of a job's life over
//! OTLP/HTTP, off unless configured). Metric names stay in `crate::metrics`, beside
//! everything that records them.

pub mod probes;
pub mod telemetry;
