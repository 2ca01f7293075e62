//! Pure decision cores: no I/O, no clock, no randomness of their own. Each takes `now`
//! (and a jitter draw where it needs one) as an argument and returns a decision, so the
//! worker's tasks only move data between these and Kafka/ScyllaDB, and the rules are
//! unit- and property-tested in isolation.
//!
//! | module | the rules of |
//! |---|---|
//! | `scheduler` | fair scheduling: deficit round robin in slot-seconds, tiers, caps, priorities, aging |
//! | `offsets` | out-of-order completion per partition: what offset may be committed |
//! | `retry` | failure classes' retries, backoff and jitter, the retry budget, the DLQ |
//! | `backoff` | the doubling wait between tries (webhook deliveries, a job taken in again, a start waiting for its database) |
//! | `breaker`, `window` | circuit breakers and the rolling counts they judge from |
//! | `dependency` | the fleet-wide dependency breaker: a dependency's counts from every worker's cells, when it opens, holds, goes on trial and closes; which job types it holds |
//! | `poison` | quarantine of job types that fail most of the time |
//! | `fleet_counts` | the retry budget and poison detection on the pool's fleet-wide counts |
//! | `backlog`, `buffer` | spilled backlogs of floods beyond the buffer; what the buffer holds per tenant (jobs, bytes) |
//! | `refusals` | what held a tenant's submissions back, per hour: refusals and near-limit admissions by limit and pool, the page's hourly series, one alert per limit |
//! | `quota`, `fleet`, `flow` | fleet-wide limits (allotments, rate shares), fleet fairness, flow keys |
//! | `lanes` | how a tenant's jobs spread over a pool topic's partitions: lanes from its submission rate, ordering keys' fixed places |
//! | `admission`, `api_limits`, `auth` | the front door (queue limits and rates), the API process's per-key limits, API keys |
//! | `tenants` | a tenant's record, tiers and defaults, free accounts |
//! | `regions` | a tenant's home region: which region's API serves it, the 421 elsewhere, failover to its secondary, a region's outage state |
//! | `classifier` | which pool a job type's jobs go to, from measured run times |
//! | `promotion` | scheduled jobs: submission-time jitter and the promoter's pace |
//! | `due` | reading the due index of schedules and debounce windows: tenant turns, the floor a read starts from |
//! | `recurring`, `unique` | recurring schedules (fire times, DST, catch-up); unique jobs and debounce |
//! | `limits`, `recycling`, `stuck` | `process` jobs' limits and exit verdicts, the recycling cap, the stuck-job rule |
//! | `sandbox`, `checkpoint_pace` | a `process` attempt's private directory name, uids and required confinements; checkpoint writes coalesced |
//! | `pooled` | pooled `process` jobs: the job frame on a child's stdin, the `result` line ending a job, when a child is kept |
//! | `vitals` | whether a worker can still make progress, and when it must give up |
//! | `outcomes` | outcomes in flight: how many, and how many bytes, before no job starts |
//! | `frontier`, `finished` | skipping the effectively-once read; where a finished record lives |
//! | `events`, `webhooks`, `receivers`, `console` | job events, webhook deliveries, webhook receivers' bounded lanes, the console's pure parts |
//! | `recent_events` | the recent job events the console's search looks through, per tenant under one bound (a burst evicts its own tenant's first) |
//! | `ledger` | the usage ledger: what a result adds to its tenant's account, windows of the results topic every reader totals alike, reports, the console's chart points (shares, entitlements, top tenants) |
//! | `alerts` | tenant-facing alerts: per-period observations of a tenant (waits, failures; the wait histogram the ledger keeps too), when an alert opens and resolves (once each), alert ids |
//! | `replay`, `rerun` | which records `fairway replay` and `fairway rerun` send back |
//! | `trace` | W3C trace context values |
//! | `dr` | disaster recovery: the tables a backup copies and how, the consistent cut, the manifest and record framing |
//! | `bounds` | what a time a caller gives may be (1970 to 9999), checked arithmetic on it, and how many days a period may span |
//! | `invalid` | a setting a rule refuses: its field and the fix (what every settings `validate` returns) |

/// A map a job passes through on the hot path (keyed by tenant, job type, partition):
/// hashed with foldhash, seeded per map, not std's SipHash (several lookups per job; a
/// per-map seed still keeps keys a tenant chooses from colliding by design).
pub type FastMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

pub mod admission;
pub mod alerts;
pub mod api_limits;
pub mod auth;
pub mod backlog;
pub mod backoff;
pub mod bounds;
pub mod breaker;
pub mod buffer;
pub mod checkpoint_pace;
pub mod classifier;
pub mod console;
pub mod dependency;
pub mod dr;
pub mod due;
pub mod events;
pub mod finished;
pub mod fleet;
pub mod fleet_counts;
pub mod flow;
pub mod frontier;
pub mod invalid;
pub mod lanes;
pub mod ledger;
pub mod limits;
pub mod offsets;
pub mod outcomes;
pub mod poison;
pub mod pooled;
pub mod promotion;
pub mod quota;
pub mod receivers;
pub mod recent_events;
pub mod recurring;
pub mod recycling;
pub mod refusals;
pub mod regions;
pub mod replay;
pub mod rerun;
pub mod retry;
pub mod sandbox;
pub mod scheduler;
pub mod stuck;
pub mod tenants;
pub mod trace;
pub mod unique;
pub mod vitals;
pub mod webhooks;
pub mod window;
