//! Watching a job from outside, the I/O shells that `fairway serve` runs (and that the
//! workers publish to): [`events`] (lifecycle and progress events, the history recorder,
//! the live feed behind `/jobs/{id}/events`) and [`webhooks`] (each result POSTed,
//! signed, to its job type's URL) and [`alerts`] (tenant alert events POSTed, signed the
//! same way, to the tenant's alerts webhook). Their rules are `core::events` and `core::webhooks`,
//! their statements `store::events`, their routes `api::events`.

pub mod alerts;
pub mod events;
pub mod webhooks;
