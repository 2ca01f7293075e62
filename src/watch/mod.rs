//! Watching a job from outside, the I/O shells that `fairway serve` runs (and that the
//! workers publish to): [`events`] (lifecycle and progress events, the history recorder,
//! the live feed behind `/jobs/{id}/events`) and [`webhooks`] (each result POSTed,
//! signed, to its job type's URL). Their rules are `core::events` and `core::webhooks`,
//! their statements `store::events`, their routes `api::events`.

pub mod events;
pub mod webhooks;
