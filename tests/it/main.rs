//! The integration suite in one test binary (one build and link instead of one per
//! file; tests of different files share its threads). Each module is one subject, on the
//! real local services (`scripts/services up`): `cargo test --test it <module>::` runs one.
//! Tests that need the process to themselves (a global metrics recorder, process-wide
//! environment) or a machine to themselves (their own broker, fleet or services) stay
//! binaries of their own: `tests/it_*.rs`.

#[path = "../common/mod.rs"]
mod common;

mod admission;
mod assignment;
mod backlog;
mod blast;
mod classifier;
mod clients;
mod console;
mod cql;
mod cql_auth;
mod deploy;
mod docs_links;
mod edges;
mod events;
mod failures;
mod fairness;
mod fleet;
mod fleet_failures;
mod front_door;
mod groups;
mod kafka;
mod lanes;
mod long_jobs;
mod observability;
mod probes;
mod process;
mod python_client;
mod readiness_restart;
mod recurring;
mod regions;
mod replay;
mod rerun;
mod restore;
mod scale;
mod schema_upgrade;
mod store_contract;
mod tenants;
mod tls;
mod trace;
mod typescript_client;
mod usage;
mod worker;
