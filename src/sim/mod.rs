//! The deterministic fleet simulator (docs/simulation.md): a fleet of workers running the
//! shipping code (`worker::pool::run_in`, the route `worker::exec::execute` and the
//! heartbeat loop `worker::liveness::heartbeat_loop`) over in-memory doubles of the store
//! and the broker, on tokio's paused time in one thread, with the workload, the faults
//! and every random draw taken from one `u64` seed; the invariants are checked after each
//! run, and a seed replays exactly. Nothing of the worker is copied here: the modules are
//! the edges' doubles and the harness around them.
//!
//! - `doubles`: the store (`RouteStore`, `BacklogStore`) and broker (`RouteBroker`)
//!   doubles, with seeded answer times, slow tails, outages and refusals; `contract`: the
//!   cases both the double and the real store must pass (`it::store_contract`), so the
//!   double cannot drift from Cassandra.
//! - `broker`: a consumer group in memory (`PoolGroup`): partitions, assignment and
//!   revocation, stored and committed offsets, session timeouts, members that die or are
//!   cut off.
//! - `fleet`: the seed's shape, the fleet's loop (submissions, the retry relay, faults,
//!   crashes and restarts) and the invariants; `fairway-sim` runs its seeds.
//! - `ledger`: the usage ledger's leader simulated over a seed's results topic, for the
//!   usage counted once.

#[cfg(any(test, feature = "sim-route"))]
pub mod broker;
pub mod contract;
pub mod doubles;
#[cfg(any(test, feature = "sim-route"))]
pub mod fleet;
#[cfg(any(test, feature = "sim-route"))]
mod ledger;
mod rng;
