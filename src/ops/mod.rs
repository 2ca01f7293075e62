//! The I/O shells of the operators' commands, shared by the CLI (`src/cli/`) and the
//! HTTP API's admin routes and console: [`backup`] (`fairway backup` / `fairway restore`:
//! disaster recovery), [`replay`] (`fairway replay`: dead letters and
//! retry records back to their pool), [`rerun`] (`fairway rerun`: a tenant's jobs again,
//! by generation), [`schedules`] (`fairway schedules`: recurring schedules' management)
//! and [`tenants`] (`fairway tenants`: the tenants registry's rows, and the live view of
//! them every worker and API process keeps). Their decisions live in `core` (`replay`,
//! `rerun`, `recurring`, `tenants`), their statements in `store`.

pub mod backup;
pub mod replay;
pub mod rerun;
pub mod schedules;
pub mod tenants;
