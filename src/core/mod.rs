//! Pure decision cores: no I/O, no clock, no randomness of their own. Each takes `now`
//! (and a jitter draw where it needs one) as an argument and returns a decision, so the
//! worker's tasks only move data between these and Kafka/ScyllaDB, and the rules are
//! unit- and property-tested in isolation.

pub mod admission;
pub mod auth;
pub mod backlog;
pub mod breaker;
pub mod classifier;
pub mod console;
pub mod events;
pub mod finished;
pub mod fleet;
pub mod fleet_counts;
pub mod flow;
pub mod frontdoor;
pub mod frontier;
pub mod limits;
pub mod offsets;
pub mod poison;
pub mod promotion;
pub mod quota;
pub mod recurring;
pub mod recycling;
pub mod replay;
pub mod rerun;
pub mod retry;
pub mod scheduler;
pub mod stuck;
pub mod tenants;
pub mod trace;
pub mod unique;
pub mod vitals;
pub mod webhooks;
pub mod window;
