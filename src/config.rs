//! fairway's configuration: one TOML file, overridable by environment variables and
//! command-line flags (see `cli`). Everything is validated up front so that a bad file
//! fails at start-up with the key that is wrong and how to fix it, never mid-run.

use crate::model::Pool;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

mod admission;
mod retention;
mod security;
pub use admission::AdmissionConfig;
mod webhooks;
pub use retention::{EventsConfig, IdempotencyConfig, RetentionConfig};
pub use security::{
    is_secret_property, kafka_env_property, ApiConfig, AuthMode, KafkaProperties, ScyllaTls, Secret, KAFKA_ENV_PREFIX,
};
pub use webhooks::{secret_env_var, WebhooksConfig};

/// The bundled `fairway.toml`'s text ([`Config::builtin`]).
pub const BUNDLED: &str = include_str!("../fairway.toml");

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read { path: String, source: std::io::Error },
    #[error("config file {path} is not valid: {message}")]
    Parse { path: String, message: String },
    #[error("config key `{key}`: {message}")]
    Invalid { key: String, message: String },
}

fn invalid(key: impl Into<String>, message: impl Into<String>) -> ConfigError {
    ConfigError::Invalid { key: key.into(), message: message.into() }
}

/// A section's refusal (`core::invalid::Invalid`, its field relative to the section) as
/// the config key it sits at: `section.field`.
fn invalid_in(section: impl std::fmt::Display) -> impl Fn(crate::core::invalid::Invalid) -> ConfigError {
    move |e| invalid(format!("{section}.{}", e.field), e.problem)
}

/// Tenant tier: decides the scheduling weight (free tenants share one weight of 1.0).
pub use crate::core::scheduler::Tier;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default)]
    pub kafka: KafkaConfig,
    #[serde(default)]
    pub scylla: ScyllaConfig,
    #[serde(default)]
    pub worker: WorkerConfig,
    #[serde(default = "default_pools", deserialize_with = "pools_over_defaults")]
    pub pools: BTreeMap<Pool, PoolConfig>,
    /// Seeds the tenants registry (`fairway init`); the registry in the store is the truth.
    #[serde(default)]
    pub tenants: BTreeMap<String, TenantConfig>,
    #[serde(default)]
    pub registry: RegistryConfig,
    #[serde(default)]
    pub job_types: BTreeMap<String, JobTypeConfig>,
    /// The HTTP API: authentication, the metrics listener.
    #[serde(default)]
    pub api: ApiConfig,
    /// TTLs of job rows and history, topic retention (`[retention]`).
    #[serde(default)]
    pub retention: RetentionConfig,
    /// Idempotency keys (`[idempotency]`).
    #[serde(default)]
    pub idempotency: IdempotencyConfig,
    /// Job events (`[events]`).
    #[serde(default)]
    pub events: EventsConfig,
    /// Flow-control keys' limits (`[flow.keys."<key>"]`), fleet-wide per pool.
    #[serde(default)]
    pub flow: FlowConfig,
    /// Front-door limits (`[admission]`): queue depth, rates, quota alerts.
    #[serde(default)]
    pub admission: AdmissionConfig,
    /// Result callbacks (`[webhooks]`).
    #[serde(default)]
    pub webhooks: WebhooksConfig,
    /// Tenant-facing alerts (`[alerts]`): tier defaults, per-tenant settings and webhooks.
    #[serde(default)]
    pub alerts: crate::core::alerts::AlertsConfig,
    /// The fleet-wide dependency breaker (`[dependency_breaker]`, `core::dependency`):
    /// job types name their dependencies in `job_types.<name>.dependencies`.
    #[serde(default)]
    pub dependency_breaker: crate::core::dependency::DependencyConfig,
    /// The pool classifier (`[classifier]`): job types move to the pool their measured
    /// run times fit (`core::classifier`).
    #[serde(default)]
    pub classifier: crate::core::classifier::ClassifierConfig,
    /// Bounds of recurring schedules (`[schedules]`): per tenant and in total.
    #[serde(default)]
    pub schedules: crate::core::recurring::SchedulesConfig,
    /// Bounds of debounce windows (`[debounce]`): open ones per tenant, a job's payload.
    #[serde(default)]
    pub debounce: crate::core::unique::DebounceConfig,
    /// The sandbox of `process` jobs (`[sandbox]`): where attempts' private directories
    /// live and which confinements a worker must have to start.
    #[serde(default)]
    pub sandbox: SandboxConfig,
    /// This deployment's region and the others' endpoints (`[region]`, docs/regions.md):
    /// tenants with a home region elsewhere are sent there.
    #[serde(default)]
    pub region: crate::core::regions::RegionConfig,
}

/// `[sandbox]`: docs/process-jobs.md, "The sandbox".
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SandboxConfig {
    /// Root of the attempts' private directories (default: the system's temporary
    /// directory); on Kubernetes an `emptyDir` with a size limit.
    pub dir: Option<String>,
    /// Confinements a worker running `process` jobs refuses to start without
    /// (`"cgroup"`, `"uid"`, `"network"`).
    pub require: Vec<crate::core::sandbox::Confinement>,
}

/// Limits of flow-control keys (`core::flow`): per key here, or per job type with
/// `[job_types.<t>] flow = { parallelism = N, rate = N, period = "1m" }` (at least one
/// of `parallelism` and `rate`).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FlowConfig {
    pub keys: BTreeMap<String, crate::core::flow::FlowLimit>,
}

impl Config {
    /// The quota scope and limits of a job, if its flow key has a limit.
    pub fn flow_scope(&self, job: &crate::model::JobSubmitted) -> Option<(String, crate::core::flow::FlowLimit)> {
        let key = job.flow_key.as_deref()?;
        let jt = self.job_types.get(&job.job_type).and_then(|t| t.flow.as_ref());
        let of = crate::core::flow::FlowOf { key, job_type: &job.job_type, tenant: &job.tenant };
        crate::core::flow::scope_of(&self.flow.keys, jt, of)
    }
}

/// The tenants registry: what to do with unknown tenants, how fast changes arrive.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RegistryConfig {
    /// `reject`: a job of an unregistered tenant is refused (dead-lettered by a worker);
    /// `admit`: its first job registers it at `default_tier`.
    pub unknown_tenants: crate::core::tenants::UnknownTenants,
    pub default_tier: Tier,
    /// Name patterns of free accounts that have no row (`"free-*"`): admitted at the free
    /// tier's defaults whatever `unknown_tenants` says, never stored (a tenant with a row
    /// of its own keeps its row's settings).
    pub free_accounts: Vec<crate::core::tenants::AccountPattern>,
    /// How often each process checks the registry's version (a change shows within it).
    #[serde(with = "humantime_serde_compat")]
    pub poll_interval: Duration,
}

impl RegistryConfig {
    /// What happens to a tenant without a row.
    pub fn unregistered(&self) -> crate::core::tenants::Unregistered<'_> {
        crate::core::tenants::Unregistered {
            policy: self.unknown_tenants,
            default_tier: self.default_tier,
            free_accounts: &self.free_accounts,
        }
    }
}

impl Default for RegistryConfig {
    fn default() -> Self {
        RegistryConfig {
            unknown_tenants: Default::default(),
            default_tier: Tier::Free,
            free_accounts: Vec::new(),
            poll_interval: Duration::from_secs(1),
        }
    }
}

/// `kafka.assignor`: how the classic group protocol shares a pool topic's partitions
/// among its workers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Assignor {
    /// Incremental and sticky: a rebalance moves only the partitions that change owner;
    /// the others keep being consumed, with their held jobs and backlog indexes.
    CooperativeSticky,
    /// Eager `range`: every rebalance revokes every partition of every member first.
    Range,
}

impl Assignor {
    /// librdkafka's `partition.assignment.strategy` value.
    pub fn strategy(self) -> &'static str {
        match self {
            Assignor::CooperativeSticky => "cooperative-sticky",
            Assignor::Range => "range",
        }
    }
}

/// `kafka.group_protocol`: which consumer group protocol pool consumers speak.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GroupProtocol {
    #[default]
    Classic,
    Consumer,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct KafkaConfig {
    /// Bootstrap servers, comma separated.
    pub brokers: String,
    /// Prefix of every topic name (`<prefix>jobs.short`, `<prefix>dlq`...).
    pub topic_prefix: String,
    /// Partitions per topic created by `fairway init`.
    pub partitions: i32,
    pub replication_factor: i32,
    /// Consumer group prefix; the group of pool P is `<group_prefix><P>`. Empty (the
    /// default): `<topic_prefix>workers.`, so deployments never share a group unless
    /// configured to. See [`Config::group`].
    pub group_prefix: String,
    /// A pool consumer without any partition for longer than this logs a warning, sets
    /// `fairway_pool_unassigned_seconds` and shows in `fairway stats`.
    #[serde(with = "humantime_serde_compat")]
    pub unassigned_warning: Duration,
    /// With `group_protocol = "classic"`: how fast a dead (kill -9) member's partitions
    /// move. With `"consumer"` the broker sets it (`group.consumer.session.timeout.ms`).
    #[serde(with = "humantime_serde_compat")]
    pub session_timeout: Duration,
    /// The consumer group protocol of pool consumers: `classic` (JoinGroup/SyncGroup, an
    /// eager rebalance moves every partition) or `consumer` (KIP-848, Kafka 4.x: the
    /// broker assigns, partitions move one by one). Measured side by side:
    /// docs/partitions.md.
    pub group_protocol: GroupProtocol,
    /// With `group_protocol = "classic"`: `range` (unset: the default) or
    /// `cooperative-sticky`. Members of one group must agree: librdkafka cannot mix an eager and a
    /// cooperative assignor, so a fleet changes it with all of a pool's workers stopped
    /// (docs/partitions.md). Under `"consumer"` the broker assigns, and setting it is an
    /// error.
    pub assignor: Option<Assignor>,
    /// Submissions a second (per submitting process) that earn a tenant one more lane on
    /// a pool topic: a tenant submitting faster spreads over more partitions, and so
    /// workers (`core::lanes`, docs/design/lanes.md). 1 to 1,000,000.
    pub lane_rate: u32,
    /// librdkafka properties for every client (SASL, TLS...); `FAIRWAY_KAFKA_<NAME>`
    /// environment variables override them (see [`Config::apply_env`]).
    pub properties: KafkaProperties,
}

impl Default for KafkaConfig {
    fn default() -> Self {
        KafkaConfig {
            brokers: "127.0.0.1:19092".into(),
            topic_prefix: "fairway.".into(),
            partitions: 6,
            replication_factor: 1,
            group_prefix: String::new(),
            unassigned_warning: Duration::from_secs(30),
            session_timeout: Duration::from_secs(10),
            group_protocol: GroupProtocol::default(),
            assignor: None,
            lane_rate: 50,
            properties: KafkaProperties::default(),
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ScyllaConfig {
    pub contact_points: Vec<String>,
    pub keyspace: String,
    pub replication_factor: i32,
    /// Address translation: a node's address as the cluster reports it (`rpc_address:port`)
    /// -> the address to connect to (a node behind NAT, a port forward, a test lab's link).
    /// Nodes not listed are reached at the address they report.
    pub address_map: BTreeMap<String, String>,
    /// PasswordAuthenticator credentials (`FAIRWAY_SCYLLA_PASSWORD` overrides the password).
    pub username: Option<String>,
    pub password: Option<Secret>,
    /// `[scylla.tls]`: TLS to the nodes (present = on).
    pub tls: Option<ScyllaTls>,
    /// Replicas per datacenter for `fairway init`'s keyspace: non-empty selects
    /// NetworkTopologyStrategy (`{ dc1 = 3, dc2 = 3 }`) instead of SimpleStrategy.
    pub datacenters: BTreeMap<String, i32>,
    /// How long `fairway worker` and `fairway serve` wait at their start for a database
    /// that does not answer (down, restarting, not yet started) before they exit; they
    /// log each try and are not ready meanwhile (`store::reach`). A wrong setting
    /// (credentials, TLS, keyspace) fails at once. 0 = do not wait; at most a day.
    #[serde(with = "humantime_serde_compat")]
    pub connect_wait: Duration,
}

/// The longest `scylla.connect_wait` accepted.
pub const MAX_CONNECT_WAIT: Duration = Duration::from_secs(86_400);

impl Default for ScyllaConfig {
    fn default() -> Self {
        ScyllaConfig {
            contact_points: vec!["127.0.0.1:19042".into()],
            keyspace: "fairway".into(),
            replication_factor: 1,
            address_map: BTreeMap::new(),
            username: None,
            password: None,
            tls: None,
            datacenters: BTreeMap::new(),
            connect_wait: Duration::from_secs(180),
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WorkerConfig {
    /// Largest accepted job payload; bigger submissions are refused (and dead-lettered if
    /// they reach a worker by another producer).
    pub max_payload_bytes: usize,
    /// Jobs buffered in memory per tenant and pool; a tenant's jobs beyond it spill to
    /// its backlog in the store (`spill_backlogs`), so its partition keeps flowing.
    pub tenant_queue_limit: usize,
    /// Spill a tenant's jobs beyond `tenant_queue_limit` to the store instead of pausing
    /// the Kafka partitions it shares with other tenants (`false`: pause, as a plain
    /// consumer would; every tenant on a flooded partition then waits for the flood).
    pub spill_backlogs: bool,
    /// The removed `worker.metrics_port`: read only to refuse it with its replacement
    /// (`metrics_listen`), never used.
    #[serde(rename = "metrics_port")]
    pub removed_metrics_port: Option<u16>,
    /// Address of the Prometheus exporter, `/readyz` and `/livez` (host:port, e.g.
    /// "127.0.0.1:9464", or "0.0.0.0:9464" so Prometheus on another host can scrape);
    /// off when absent.
    pub metrics_listen: Option<String>,
    /// How long a running job may ignore a cancellation before the worker aborts it.
    #[serde(with = "humantime_serde_compat")]
    pub cancel_grace: Duration,
    /// Retries and scheduled jobs due within this long wait in the relay (their partition
    /// paused); later ones are parked in the store for the promoter.
    #[serde(with = "humantime_serde_compat")]
    pub relay_hold_max: Duration,
    /// Most parked jobs the promoter moves back to their pool topics per second (fleet
    /// wide: one promoter leads): 10 M jobs due at one instant take 10 M / this seconds.
    pub promoter_rate: u32,
    /// Quarantine of job types that fail most of the time.
    pub poison: crate::core::poison::PoisonConfig,
    /// Per-tenant retry budget (retries above ~2x the dispatch rate are dead-lettered),
    /// per pool across its workers with `fleet_limits`.
    pub retry_budget: crate::core::retry::RetryBudgetConfig,
    /// Skip the per-job state read for jobs no worker can have started (fresh offsets
    /// above the partition's dispatch frontier, original submissions, no cancel on the
    /// feed). The frontier is always maintained; this only decides whether to use it.
    pub skip_fresh_reads: bool,
    /// Tenants' `max_concurrency` and `rate_per_sec` and flow keys' `parallelism` and `rate` hold
    /// across all workers of a pool (`core::quota`, via the `quotas` table), and so do
    /// the retry budget and poison detection (`core::fleet_counts`, via `fleet_counts`).
    /// Off: each worker enforces them on its own (N workers allow N times the limit);
    /// for comparison and benchmarks.
    pub fleet_limits: bool,
    /// How long the store may stay unreachable from this worker (its probe failing)
    /// before the worker gives up: it leaves its consumer groups, so members that reach
    /// the store serve its partitions, and exits non-zero for its supervisor to restart
    /// it (`worker::watchdog`). Longer than a restart of the database; 0 = never.
    #[serde(with = "humantime_serde_compat")]
    pub store_outage_limit: Duration,
    /// A tenant with nothing queued or running in a pool of this worker and no activity
    /// there for this long is forgotten by that pool's scheduler (its registry settings
    /// stay; it comes back as a new tenant, with no banked credit): memory follows the
    /// tenants active lately, not every tenant ever seen.
    #[serde(with = "humantime_serde_compat")]
    pub tenant_idle_evict: Duration,
}

impl Default for WorkerConfig {
    fn default() -> Self {
        WorkerConfig {
            max_payload_bytes: 1 << 20,
            tenant_queue_limit: 20_000,
            spill_backlogs: true,
            removed_metrics_port: None,
            metrics_listen: None,
            cancel_grace: Duration::from_secs(300),
            relay_hold_max: Duration::from_secs(30),
            promoter_rate: 20_000,
            poison: Default::default(),
            retry_budget: Default::default(),
            skip_fresh_reads: true,
            fleet_limits: true,
            store_outage_limit: Duration::from_secs(180),
            tenant_idle_evict: Duration::from_secs(600),
        }
    }
}

/// One pool's settings (read from `[pools.<p>]` over the pool's defaults).
#[derive(Debug, Clone)]
pub struct PoolConfig {
    /// Concurrent jobs one worker runs for this pool.
    pub slots: usize,
    /// Cost estimate for a job type never measured yet.
    pub default_estimate: Duration,
    /// Heartbeat interval of running jobs.
    pub heartbeat_interval: Duration,
    /// Default deadline for job types that set none.
    pub default_timeout: Duration,
    /// Lanes beyond `slots` for latency: when every slot is busy, a tenant with nothing
    /// running here (and not ahead of its fair share) starts one cheap job at once
    /// instead of waiting for run-to-completion jobs of others to end. Unset: slots / 16
    /// rounded up for the short and medium pools, 0 for long. 0 = `slots` is a strict cap.
    pub fast_lanes: Option<usize>,
    /// Largest estimated run time of a job that may take a fast lane. Unset: the pool's
    /// `default_estimate`.
    pub fast_lane_max_estimate: Option<Duration>,
    /// On SIGTERM/SIGINT running jobs get this long to finish; then they are asked to
    /// stop (`ctx.stop_reason()`) and handed off to another worker through their
    /// checkpoints. 0 (the long pool's default): hand off at once.
    pub drain_timeout: Duration,
    /// Upper end of the pool's run-time range; the lower end is the previous pool's
    /// (short < 1 s, medium 1 s - 1 min, long beyond: seed 002). Runs outside it are
    /// pool violations (`core::classifier`). None: no upper end (long).
    pub max_run: Option<Duration>,
    /// Default limits of this pool's `process` jobs (`core::limits`).
    pub limits: crate::core::limits::Limits,
    /// Default `stuck_after` of this pool's jobs (`core::stuck`); None: not watched.
    pub stuck_after: Option<crate::core::retry::DurationMs>,
    /// Kills and abnormal exits per tenant per window before its jobs wait (`core::recycling`).
    pub recycling: crate::core::recycling::RecyclingConfig,
}

impl PoolConfig {
    pub fn default_for(pool: Pool) -> PoolConfig {
        let s = Duration::from_secs;
        match pool {
            Pool::Short => PoolConfig {
                slots: 64,
                default_estimate: Duration::from_millis(100),
                heartbeat_interval: s(5),
                default_timeout: s(30),
                fast_lanes: None,
                fast_lane_max_estimate: None,
                drain_timeout: s(30),
                max_run: Some(s(1)),
                limits: Default::default(),
                stuck_after: None,
                recycling: Default::default(),
            },
            Pool::Medium => PoolConfig {
                slots: 16,
                default_estimate: s(10),
                heartbeat_interval: s(10),
                default_timeout: s(300),
                fast_lanes: None,
                fast_lane_max_estimate: None,
                drain_timeout: s(60),
                max_run: Some(s(60)),
                limits: Default::default(),
                stuck_after: None,
                recycling: Default::default(),
            },
            Pool::Long => PoolConfig {
                slots: 4,
                default_estimate: s(600),
                heartbeat_interval: s(30),
                default_timeout: s(6 * 3600),
                fast_lanes: None,
                fast_lane_max_estimate: None,
                drain_timeout: s(0),
                max_run: None,
                limits: Default::default(),
                stuck_after: None,
                recycling: Default::default(),
            },
        }
    }
}

impl PoolConfig {
    /// Fast lanes in force for `pool` (see `fast_lanes`).
    pub fn fast_lanes_for(&self, pool: Pool) -> usize {
        self.fast_lanes.unwrap_or(if pool == Pool::Long { 0 } else { self.slots.div_ceil(16) })
    }
    pub fn fast_lane_max_estimate(&self) -> Duration {
        self.fast_lane_max_estimate.unwrap_or(self.default_estimate)
    }
}

impl Default for PoolConfig {
    fn default() -> Self {
        PoolConfig::default_for(Pool::Short)
    }
}

fn default_pools() -> BTreeMap<Pool, PoolConfig> {
    Pool::ALL.iter().map(|p| (*p, PoolConfig::default_for(*p))).collect()
}

/// A `[pools.<p>]` section overrides only the keys it names; the others keep *that*
/// pool's defaults (`[pools.long] slots = 2` must not give long jobs the short pool's
/// 30 s timeout).
fn pools_over_defaults<'de, D: serde::Deserializer<'de>>(d: D) -> Result<BTreeMap<Pool, PoolConfig>, D::Error> {
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Section {
        slots: Option<usize>,
        #[serde(default, with = "humantime_serde_opt")]
        default_estimate: Option<Duration>,
        #[serde(default, with = "humantime_serde_opt")]
        heartbeat_interval: Option<Duration>,
        #[serde(default, with = "humantime_serde_opt")]
        default_timeout: Option<Duration>,
        fast_lanes: Option<usize>,
        #[serde(default, with = "humantime_serde_opt")]
        fast_lane_max_estimate: Option<Duration>,
        #[serde(default, with = "humantime_serde_opt")]
        drain_timeout: Option<Duration>,
        #[serde(default, with = "humantime_serde_opt")]
        max_run: Option<Duration>,
        limits: Option<crate::core::limits::Limits>,
        stuck_after: Option<crate::core::retry::DurationMs>,
        recycling: Option<crate::core::recycling::RecyclingConfig>,
    }
    let mut pools = default_pools();
    for (pool, s) in BTreeMap::<Pool, Section>::deserialize(d)? {
        let c = pools.entry(pool).or_insert_with(|| PoolConfig::default_for(pool));
        c.slots = s.slots.unwrap_or(c.slots);
        c.default_estimate = s.default_estimate.unwrap_or(c.default_estimate);
        c.heartbeat_interval = s.heartbeat_interval.unwrap_or(c.heartbeat_interval);
        c.default_timeout = s.default_timeout.unwrap_or(c.default_timeout);
        c.fast_lanes = s.fast_lanes.or(c.fast_lanes);
        c.fast_lane_max_estimate = s.fast_lane_max_estimate.or(c.fast_lane_max_estimate);
        c.drain_timeout = s.drain_timeout.unwrap_or(c.drain_timeout);
        c.max_run = s.max_run.or(c.max_run);
        c.limits = s.limits.unwrap_or(c.limits);
        c.stuck_after = s.stuck_after.or(c.stuck_after);
        c.recycling = s.recycling.unwrap_or(c.recycling);
    }
    Ok(pools)
}

/// A tenant's seed in the config file (`[tenants.<name>]`). It is not what runs: `fairway
/// init` copies it into the live tenants registry (`core::tenants::TenantRecord::from_config`),
/// and the registry's record is what the workers and the front door enforce. Each field
/// means what the record's field of the same name means (see `TenantRecord`).
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct TenantConfig {
    #[serde(default)]
    pub tier: Tier,
    /// Overrides the tier's weight (not for free tenants: they share the free weight).
    pub weight: Option<f64>,
    /// Most running jobs per pool: across the pool's workers when `worker.fleet_limits`
    /// is on (the default), else per worker.
    pub max_concurrency: Option<usize>,
    /// Most dispatches per second per pool: across the pool's workers when
    /// `worker.fleet_limits` is on (the default), else per worker.
    pub rate_per_sec: Option<u32>,
    /// Enterprise only: slots per pool reserved for this tenant.
    #[serde(default)]
    pub reserved_slots: usize,
    /// Most jobs queued fleet-wide before the front door refuses submissions (429
    /// `TENANT_QUEUE_FULL`); unset: `admission.max_queued` of the tier, if any.
    pub max_queued: Option<usize>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum HandlerKind {
    Echo,
    Sleep,
    Fail,
    Flaky,
    /// `{"steps": N, "step_ms": M}`: N steps, a checkpoint after each, hand-off friendly.
    Steps,
    Http,
    /// A handler registered in Rust by an embedding binary under the job type's name.
    Custom,
    /// A child process per attempt (`command`, `cwd`, `env`, `limits`): jobs in any
    /// language, isolated from the worker (`handlers::process`, docs/process-jobs.md).
    Process,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobTypeConfig {
    pub pool: Pool,
    pub handler: HandlerKind,
    /// Deadline of one attempt; the pool's default when absent.
    #[serde(default, with = "humantime_serde_opt")]
    pub timeout: Option<Duration>,
    /// HTTP executor target (handler = "http"); https uses rustls with the webpki roots.
    pub url: Option<String>,
    /// PEM file of extra CA certificates the HTTP executor trusts for this job type's
    /// https URL (a private CA), besides the built-in roots.
    pub ca_file: Option<String>,
    /// Retry policy per failure class; defaults in `core::retry`.
    #[serde(default)]
    pub retry: Option<crate::core::retry::RetryPolicy>,
    /// Circuit breaker of this job type's dependency; defaults in `core::breaker`.
    #[serde(default)]
    pub breaker: Option<crate::core::breaker::BreakerConfig>,
    /// Names of the dependencies this type's jobs call (`payments-api`): the fleet-wide
    /// dependency breaker (`[dependency_breaker]`) of each holds them while it is open.
    #[serde(default)]
    pub dependencies: Vec<String>,
    /// Per flow key of this type's jobs: each key's own fleet-wide `parallelism` and/or
    /// `rate` per `period` (`core::flow`).
    #[serde(default)]
    pub flow: Option<crate::core::flow::FlowLimit>,
    /// Callback URL: each job's result is POSTed there, signed (`[webhooks]`).
    #[serde(default)]
    pub webhook_url: Option<String>,
    /// handler = "process": the program and its arguments (no shell).
    #[serde(default)]
    pub command: Option<Vec<String>>,
    /// handler = "process": the child's working directory (default: the worker's).
    #[serde(default)]
    pub cwd: Option<String>,
    /// handler = "process": names of the worker's environment variables the child
    /// inherits (nothing else is passed on, besides the `FAIRWAY_*` job variables).
    #[serde(default)]
    pub env: Vec<String>,
    /// handler = "process": limits of one attempt over the pool's (`core::limits`).
    #[serde(default)]
    pub limits: crate::core::limits::Limits,
    /// A running job silent (no progress, checkpoint or heartbeat) this long is
    /// cancelled, killed after `kill_grace` and dead-lettered (`core::stuck`); over the
    /// pool's `stuck_after`.
    #[serde(default)]
    pub stuck_after: Option<crate::core::retry::DurationMs>,
    /// handler = "process": time between SIGTERM (cancel, drain, stuck) and SIGKILL.
    #[serde(default)]
    pub kill_grace: Option<crate::core::retry::DurationMs>,
    /// handler = "process": the child keeps the worker's network (default: a network
    /// namespace without network, where the host allows one).
    #[serde(default)]
    pub network: bool,
    /// handler = "process": the tail of the child's stderr goes into the error tenants
    /// read (default: only into the worker's log; a program may print its config).
    #[serde(default)]
    pub stderr_in_error: bool,
    /// handler = "process": a child per attempt (`one_shot`, the default) or long-lived
    /// children taking one tenant's jobs one after another (`pooled`, docs/process-jobs.md).
    #[serde(default)]
    pub mode: ProcessMode,
    /// mode = "pooled": when a child is replaced and how long an idle one waits.
    #[serde(default)]
    pub pooled: Option<PooledConfig>,
    /// HTTP executor: follow up to 5 redirects (off by default: a redirect answers
    /// `permanent`, so a job type's endpoint cannot send fairway elsewhere).
    #[serde(default)]
    pub follow_redirects: bool,
    /// Only these tenants may submit this job type (absent: every tenant); others get
    /// 403 `JOB_TYPE_NOT_ALLOWED`.
    #[serde(default)]
    pub tenants: Option<Vec<String>>,
}

/// How a `process` job type runs its jobs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProcessMode {
    /// A fresh child per attempt.
    #[default]
    OneShot,
    /// A long-lived child per slot and tenant takes jobs one after another.
    Pooled,
}

/// `job_types.<name>.pooled`: the life of a pooled child.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PooledConfig {
    /// A child is replaced by a fresh one after this many jobs.
    pub jobs_per_child: u32,
    /// An idle child is ended after this long without a job.
    pub idle: crate::core::retry::DurationMs,
}

impl Default for PooledConfig {
    fn default() -> Self {
        PooledConfig { jobs_per_child: 100, idle: crate::core::retry::DurationMs::secs(30) }
    }
}

/// Default time between a child's SIGTERM and its SIGKILL.
pub const DEFAULT_KILL_GRACE: Duration = Duration::from_secs(10);

impl JobTypeConfig {
    /// Validates the `process` keys (`job_types.<name>.*`).
    fn validate_process(&self, name: &str, pool: &PoolConfig) -> Result<(), ConfigError> {
        let key = |k: &str| format!("job_types.{name}.{k}");
        if self.handler != HandlerKind::Process {
            let set = [
                ("command", self.command.is_some()),
                ("cwd", self.cwd.is_some()),
                ("env", !self.env.is_empty()),
                ("limits", self.limits != Default::default()),
                ("network", self.network),
                ("stderr_in_error", self.stderr_in_error),
                ("mode", self.mode != ProcessMode::OneShot),
                ("pooled", self.pooled.is_some()),
            ];
            if let Some((k, _)) = set.iter().find(|(_, on)| *on) {
                return Err(invalid(
                    key(k),
                    "command, cwd, env, limits, network, stderr_in_error, mode and pooled apply to handler = \"process\" only; remove it or set handler = \"process\"",
                ));
            }
            return Ok(());
        }
        if let Some(p) = &self.pooled {
            if self.mode != ProcessMode::Pooled {
                return Err(invalid(key("pooled"), "applies to mode = \"pooled\" only; set it or remove pooled"));
            }
            if p.jobs_per_child == 0 || p.idle.0 <= 0 {
                return Err(invalid(
                    key("pooled"),
                    "jobs_per_child and idle must be above 0, e.g. { jobs_per_child = 100, idle = \"30s\" }",
                ));
            }
        }
        match &self.command {
            Some(argv) if !argv.is_empty() && !argv[0].trim().is_empty() => {}
            _ => {
                return Err(invalid(
                    key("command"),
                    "handler = \"process\" needs command = [\"program\", \"arg\", ...]",
                ))
            }
        }
        if let Some(v) = self.env.iter().find(|v| v.is_empty() || v.contains('=')) {
            return Err(invalid(
                key("env"),
                format!("{v:?} is not a variable name; list names only, e.g. [\"PATH\", \"HOME\"]"),
            ));
        }
        self.limits.or(pool.limits).validate().map_err(invalid_in(key("limits")))
    }
}

impl Config {
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|source| ConfigError::Read { path: path.display().to_string(), source })?;
        Config::parse(&text, &path.display().to_string())
    }

    pub fn parse(text: &str, origin: &str) -> Result<Config, ConfigError> {
        let cfg: Config = toml::from_str(text)
            .map_err(|e| ConfigError::Parse { path: origin.to_string(), message: e.to_string() })?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// Built-in configuration used when no file is given: the demo tenants and job types.
    pub fn builtin() -> Config {
        Config::parse(BUNDLED, "built-in fairway.toml").expect("the bundled fairway.toml is valid")
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.kafka.brokers.trim().is_empty() {
            return Err(invalid("kafka.brokers", "is empty; set host:port of a broker, e.g. \"127.0.0.1:19092\""));
        }
        if !(1..=1_000_000).contains(&self.kafka.lane_rate) {
            return Err(invalid("kafka.lane_rate", "must be 1 to 1000000 submissions a second per lane"));
        }
        if self.kafka.assignor.is_some() && self.kafka.group_protocol == GroupProtocol::Consumer {
            return Err(invalid(
                "kafka.assignor",
                "applies to group_protocol = \"classic\" only: under \"consumer\" (KIP-848) the broker assigns \
                 (its group.consumer.assignors); remove kafka.assignor or set group_protocol = \"classic\"",
            ));
        }
        if self.kafka.partitions < 1 {
            return Err(invalid("kafka.partitions", "must be at least 1"));
        }
        if let Some(port) = self.worker.removed_metrics_port {
            let fix = match port {
                0 => "remove it (the listener is off without worker.metrics_listen)".to_string(),
                p => format!("write worker.metrics_listen = \"127.0.0.1:{p}\" instead"),
            };
            return Err(invalid(
                "worker.metrics_port",
                format!("was removed in favour of worker.metrics_listen; {fix}"),
            ));
        }
        self.retention.validate()?;
        self.idempotency.validate()?;
        self.admission.validate()?;
        self.webhooks.validate()?;
        self.region.validate().map_err(invalid_in("region"))?;
        self.alerts.validate().map_err(invalid_in("alerts"))?;
        self.dependency_breaker.validate().map_err(invalid_in("dependency_breaker"))?;
        if self.scylla.password.is_some() && self.scylla.username.is_none() {
            return Err(invalid("scylla.username", "a password is set but no username; set scylla.username too"));
        }
        if let Some(t) = &self.scylla.tls {
            if t.cert_file.is_some() != t.key_file.is_some() {
                return Err(invalid(
                    "scylla.tls",
                    "cert_file and key_file go together (a client certificate and its key)",
                ));
            }
        }
        for (dc, rf) in &self.scylla.datacenters {
            if *rf < 1 || dc.is_empty() || dc.contains('\'') {
                return Err(invalid(
                    format!("scylla.datacenters.{dc}"),
                    "needs a datacenter name and at least 1 replica",
                ));
            }
        }
        if self.scylla.connect_wait > MAX_CONNECT_WAIT {
            return Err(invalid("scylla.connect_wait", "is longer than a day; use at most \"24h\" (0s: do not wait)"));
        }
        if self.scylla.contact_points.is_empty() {
            return Err(invalid("scylla.contact_points", "is empty; list at least one host:port"));
        }
        if !self.scylla.keyspace.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            || self.scylla.keyspace.is_empty()
        {
            return Err(invalid("scylla.keyspace", "may contain only letters, digits and '_'"));
        }
        self.worker.poison.validate().map_err(invalid_in("worker.poison"))?;
        self.worker.retry_budget.validate().map_err(invalid_in("worker.retry_budget"))?;
        if self.worker.tenant_idle_evict.as_millis() == 0 {
            return Err(invalid("worker.tenant_idle_evict", "must be positive, e.g. \"10m\""));
        }
        if self.worker.promoter_rate == 0 {
            return Err(invalid("worker.promoter_rate", "must be at least 1 (jobs per second), e.g. 20000"));
        }
        for (pool, pc) in &self.pools {
            if pc.slots == 0 {
                return Err(invalid(format!("pools.{pool}.slots"), "must be at least 1"));
            }
            pc.limits.validate().map_err(invalid_in(format!("pools.{pool}.limits")))?;
            pc.recycling.validate().map_err(invalid_in(format!("pools.{pool}.recycling")))?;
        }
        self.check_run_ranges()?;
        self.classifier.validate().map_err(invalid_in("classifier"))?;
        self.schedules.validate().map_err(invalid_in("schedules"))?;
        self.debounce.validate().map_err(invalid_in("debounce"))?;
        for (name, t) in &self.tenants {
            if name.is_empty() || name.len() > 128 {
                return Err(invalid("tenants", "tenant names must be 1 to 128 characters"));
            }
            if let Some(w) = t.weight {
                if !(w > 0.0 && w.is_finite()) {
                    return Err(invalid(format!("tenants.{name}.weight"), "must be a positive number"));
                }
            }
            if t.reserved_slots > 0 && t.tier != Tier::Enterprise {
                return Err(invalid(
                    format!("tenants.{name}.reserved_slots"),
                    "only enterprise tenants can reserve slots; set tier = \"enterprise\" or remove it",
                ));
            }
        }
        for (key, l) in &self.flow.keys {
            crate::core::flow::check_key(key).map_err(|e| invalid(format!("flow.keys.{key:?}"), e))?;
            l.validate().map_err(invalid_in(format!("flow.keys.{key:?}")))?;
        }
        let limits = &self.api.limits;
        limits.validate(limits.batch_body(self.worker.max_payload_bytes)).map_err(invalid_in("api.limits"))?;
        for (name, jt) in &self.job_types {
            if let Some(l) = &jt.flow {
                l.validate().map_err(invalid_in(format!("job_types.{name}.flow")))?;
            }
            if let Some(b) = &jt.breaker {
                b.validate().map_err(invalid_in(format!("job_types.{name}.breaker")))?;
            }
            crate::core::dependency::validate_names(&jt.dependencies)
                .map_err(invalid_in(format!("job_types.{name}")))?;
            if let Some(u) = &jt.webhook_url {
                crate::core::webhooks::check_url(u).map_err(|e| invalid(format!("job_types.{name}.webhook_url"), e))?;
            }
            if !self.pools.contains_key(&jt.pool) {
                return Err(invalid(
                    format!("job_types.{name}.pool"),
                    format!("pool {} has no [pools.{}] section", jt.pool, jt.pool),
                ));
            }
            jt.validate_process(name, &self.pool(jt.pool))?;
            if jt.handler == HandlerKind::Http {
                crate::handlers::http::check_url(jt.url.as_deref().unwrap_or_default())
                    .map_err(|e| invalid(format!("job_types.{name}.url"), e))?;
            }
            if jt.tenants.as_ref().is_some_and(Vec::is_empty) {
                return Err(invalid(
                    format!("job_types.{name}.tenants"),
                    "is empty: no tenant could submit it; list tenants, or remove the key to allow every tenant",
                ));
            }
        }
        Ok(())
    }

    /// Applies secret-bearing environment variables: `FAIRWAY_KAFKA_<NAME>` sets the
    /// Kafka client property `<name>` (lower case, `_` -> `.`), `FAIRWAY_SCYLLA_USERNAME`
    /// and `FAIRWAY_SCYLLA_PASSWORD` the CQL credentials. Returns the property names set.
    pub fn apply_env(&mut self, vars: impl IntoIterator<Item = (String, String)>) -> Vec<String> {
        let mut set = Vec::new();
        for (k, v) in vars {
            if let Some(p) = kafka_env_property(&k) {
                self.kafka.properties.set(p.clone(), v);
                set.push(p);
            } else if k == "FAIRWAY_SCYLLA_USERNAME" {
                self.scylla.username = Some(v);
            } else if k == "FAIRWAY_SCYLLA_PASSWORD" {
                self.scylla.password = Some(Secret::new(v));
            }
        }
        set
    }

    /// The consumer group `<group prefix><name>` (every group fairway creates: pools,
    /// relay, replay, rerun, results readers, benches); the prefix is `kafka.group_prefix`
    /// or, when that is empty, `<topic_prefix>workers.`.
    pub fn group(&self, name: &str) -> String {
        if self.kafka.group_prefix.is_empty() {
            format!("{}workers.{name}", self.kafka.topic_prefix)
        } else {
            format!("{}{name}", self.kafka.group_prefix)
        }
    }

    pub fn topic(&self, suffix: &str) -> String {
        format!("{}{}", self.kafka.topic_prefix, suffix)
    }
    /// The dependencies `job_type` declares (none for a type not configured).
    pub fn dependencies_of(&self, job_type: &str) -> &[String] {
        self.job_types.get(job_type).map_or(&[][..], |jt| jt.dependencies.as_slice())
    }
    /// A pool's job topic (named on every submission: joined, not formatted).
    pub fn pool_topic(&self, pool: Pool) -> String {
        let (prefix, name) = (self.kafka.topic_prefix.as_str(), pool.as_str());
        let mut topic = String::with_capacity(prefix.len() + "jobs.".len() + name.len());
        topic.push_str(prefix);
        topic.push_str("jobs.");
        topic.push_str(name);
        topic
    }
    pub fn retry_topic(&self, class: crate::model::FailureClass) -> String {
        self.topic(&format!("retry.{class}"))
    }
    /// Jobs whose `execute_at` is still ahead, waiting in the relay.
    pub fn delayed_topic(&self) -> String {
        self.topic("delayed")
    }
    pub fn dlq_topic(&self) -> String {
        self.topic("dlq")
    }
    pub fn results_topic(&self) -> String {
        self.topic("results")
    }
    /// Job lifecycle and progress events (key = job id): `crate::watch::events`.
    pub fn events_topic(&self) -> String {
        self.topic("events")
    }
    /// The limits of a `process` job type's attempts: its own over its pool's.
    pub fn limits(&self, job_type: &str, pool: Pool) -> crate::core::limits::Limits {
        let jt = self.job_types.get(job_type).map(|t| t.limits).unwrap_or_default();
        jt.or(self.pool(pool).limits).or(crate::core::limits::PROCESS_DEFAULTS)
    }
    /// `stuck_after` of a job type in a pool: its own, else the pool's.
    pub fn stuck_after(&self, job_type: &str, pool: Pool) -> Option<crate::core::retry::DurationMs> {
        self.job_types.get(job_type).and_then(|t| t.stuck_after).or(self.pools.get(&pool).and_then(|p| p.stuck_after))
    }
    /// Time between SIGTERM and SIGKILL for a job type's children (and the stuck
    /// detector's grace).
    pub fn kill_grace(&self, job_type: &str) -> Duration {
        self.job_types
            .get(job_type)
            .and_then(|t| t.kill_grace)
            .map_or(DEFAULT_KILL_GRACE, |d| Duration::from_millis(d.0.max(0) as u64))
    }
    pub fn pool(&self, pool: Pool) -> PoolConfig {
        self.pools.get(&pool).cloned().unwrap_or_else(|| PoolConfig::default_for(pool))
    }
    /// The pools' run-time ranges (`max_run`), for the classifier.
    pub fn run_ranges(&self) -> crate::core::classifier::Ranges {
        let ms = |d: Duration| d.as_millis().min(i64::MAX as u128) as i64;
        crate::core::classifier::Ranges::new(Pool::ALL.map(|p| (p, self.pool(p).max_run.map(ms))))
    }

    /// Each pool's `max_run` is above the previous pool's.
    fn check_run_ranges(&self) -> Result<(), ConfigError> {
        let mut below: Option<(Pool, Duration)> = None;
        for p in Pool::ALL {
            let max = self.pool(p).max_run;
            if let (Some((q, b)), Some(m)) = (below, max) {
                if m <= b {
                    return Err(invalid(
                        format!("pools.{p}.max_run"),
                        format!("must be above pools.{q}.max_run ({b:?}): the ranges follow short < medium < long"),
                    ));
                }
            }
            below = max.map(|m| (p, m)).or(below);
        }
        Ok(())
    }

    /// A job type's deadline per attempt in the pool it runs in: its own `timeout`, else
    /// that pool's default (a type the classifier moved to another pool gets the new
    /// pool's default, not its configured pool's).
    pub fn job_timeout(&self, job_type: &JobTypeConfig, runs_in: Pool) -> Duration {
        job_type.timeout.unwrap_or_else(|| self.pool(runs_in).default_timeout)
    }
}

mod humantime_serde_compat {
    use serde::{Deserialize, Deserializer};
    use std::time::Duration;
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let s = String::deserialize(d)?;
        humantime::parse_duration(&s).map_err(|e| {
            serde::de::Error::custom(format!("{s:?} is not a duration ({e}); write e.g. \"100ms\", \"5s\", \"10min\""))
        })
    }
}
mod humantime_serde_opt {
    use serde::Deserializer;
    use std::time::Duration;
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
        Ok(Some(super::humantime_serde_compat::deserialize(d)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_compose_config_is_valid() {
        let c = Config::parse(include_str!("../docker/fairway.toml"), "docker/fairway.toml").unwrap();
        assert_eq!(c.worker.metrics_listen.as_deref(), Some("0.0.0.0:9464"), "Prometheus scrapes it over the network");
    }

    /// `worker.metrics_port` was removed: a file still setting it is refused with the
    /// replacement, not silently ignored.
    #[test]
    fn the_removed_metrics_port_is_refused_naming_metrics_listen() {
        let err = Config::parse("[worker]\nmetrics_port = 9464\n", "t.toml").unwrap_err().to_string();
        assert!(err.contains("worker.metrics_port") && err.contains("metrics_listen = \"127.0.0.1:9464\""), "{err}");
        let err = Config::parse("[worker]\nmetrics_port = 0\n", "t.toml").unwrap_err().to_string();
        assert!(err.contains("remove it"), "{err}");
        assert!(Config::parse("[worker]\nmetrics_listen = \"127.0.0.1:9464\"\n", "t.toml").is_ok());
    }

    #[test]
    fn consumer_groups_follow_the_deployment_unless_a_prefix_is_set() {
        let mut a = Config::builtin();
        let mut b = Config::builtin();
        a.kafka.topic_prefix = "blue.".into();
        b.kafka.topic_prefix = "green.".into();
        assert_eq!(a.group("short"), "blue.workers.short");
        assert_ne!(a.group("short"), b.group("short"), "two deployments never share a group by default");
        assert_eq!(a.group("retry"), "blue.workers.retry");
        b.kafka.group_prefix = "shared.".into();
        assert_eq!(b.group("short"), "shared.short", "an explicit prefix still wins");
    }

    #[test]
    fn process_only_keys_on_another_handler_are_refused_naming_the_key() {
        for (k, v) in [
            ("network", "true"),
            ("stderr_in_error", "true"),
            ("mode", "\"pooled\""),
            ("pooled", "{ jobs_per_child = 5 }"),
            ("command", "[\"cat\"]"),
        ] {
            let text = format!("[job_types.e]\npool = \"short\"\nhandler = \"echo\"\n{k} = {v}\n");
            let err = Config::parse(&text, "t").unwrap_err().to_string();
            assert!(
                err.contains(&format!("job_types.e.{k}")) && err.contains("handler = \"process\" only"),
                "{k}: {err}"
            );
        }
        let pooled = "[job_types.p]\npool = \"short\"\nhandler = \"process\"\ncommand = [\"cat\"]\n";
        let err = Config::parse(&format!("{pooled}pooled = {{ jobs_per_child = 5 }}\n"), "t").unwrap_err().to_string();
        assert!(err.contains("job_types.p.pooled") && err.contains("mode = \"pooled\""), "{err}");
        let c = Config::parse(&format!("{pooled}mode = \"pooled\"\npooled = {{ jobs_per_child = 5 }}\n"), "t").unwrap();
        assert_eq!(c.job_types["p"].pooled.map(|p| (p.jobs_per_child, p.idle.0)), Some((5, 30_000)));
    }

    #[test]
    fn builtin_config_is_valid() {
        let c = Config::builtin();
        assert!(c.tenants.len() >= 3);
        assert!(c.job_types.contains_key("echo"));
    }

    #[test]
    fn a_pool_section_overrides_only_what_it_names() {
        let c = Config::parse("[pools.long]\nslots = 2\n[pools.short]\nfast_lanes = 0\n", "t").unwrap();
        let long = c.pool(Pool::Long);
        assert_eq!(long.slots, 2);
        assert_eq!(long.default_timeout, Duration::from_secs(6 * 3600), "long keeps its own defaults");
        assert_eq!(long.default_estimate, Duration::from_secs(600));
        assert_eq!(long.fast_lanes_for(Pool::Long), 0);
        let short = c.pool(Pool::Short);
        assert_eq!((short.slots, short.fast_lanes_for(Pool::Short)), (64, 0));
        assert_eq!(c.pool(Pool::Medium).fast_lanes_for(Pool::Medium), 1, "16 slots / 16");
        let err = Config::parse("[pools.medium]\nslotz = 3\n", "t").unwrap_err().to_string();
        assert!(err.contains("slotz"), "{err}");
    }

    #[test]
    fn pool_run_ranges_default_to_the_seed_and_must_increase() {
        let r = Config::builtin().run_ranges();
        assert_eq!(r.range(Pool::Short), (0, Some(1_000)));
        assert_eq!(r.range(Pool::Medium), (1_000, Some(60_000)));
        assert_eq!(r.range(Pool::Long), (60_000, None));
        let c = Config::parse("[pools.short]\nmax_run = \"30s\"\n[pools.medium]\nmax_run = \"10min\"\n", "t").unwrap();
        assert_eq!(c.run_ranges().range(Pool::Medium), (30_000, Some(600_000)));
        let err = Config::parse("[pools.medium]\nmax_run = \"500ms\"\n", "t").unwrap_err().to_string();
        assert!(err.contains("pools.medium.max_run") && err.contains("short < medium"), "{err}");
        let err = Config::parse("[classifier]\nmax_violation_share = 2.0\n", "t").unwrap_err().to_string();
        assert!(err.contains("classifier") && err.contains("0.01"), "{err}");
    }

    #[test]
    fn unknown_key_is_named() {
        let err = Config::parse("[kafka]\nbrokerz = \"x\"\n", "t").unwrap_err().to_string();
        assert!(err.contains("brokerz"), "{err}");
    }

    #[test]
    fn bad_duration_says_how_to_fix() {
        let err = Config::parse("[pools.short]\ndefault_estimate = \"fast\"\n", "t").unwrap_err().to_string();
        assert!(err.contains("100ms"), "{err}");
    }

    #[test]
    fn executor_urls_with_credentials_are_refused_at_load() {
        let toml = "[job_types.x]\npool = \"short\"\nhandler = \"http\"\nurl = \"https://u:hunter2@svc/run\"\n";
        let err = Config::parse(toml, "t").unwrap_err().to_string();
        assert!(err.contains("job_types.x.url") && err.contains("credentials") && !err.contains("hunter2"), "{err}");
    }

    #[test]
    fn http_handler_needs_url() {
        let err = Config::parse("[job_types.x]\npool = \"short\"\nhandler = \"http\"\n", "t").unwrap_err().to_string();
        assert!(err.contains("job_types.x.url"), "{err}");
    }

    #[test]
    fn a_job_types_default_timeout_follows_the_pool_it_runs_in() {
        let c =
            Config::parse(
            "[job_types.x]\npool = \"short\"\nhandler = \"echo\"\n[job_types.y]\npool = \"short\"\nhandler = \"echo\"\ntimeout = \"7s\"\n",
            "t",
        )
                .unwrap();
        let (x, y) = (&c.job_types["x"], &c.job_types["y"]);
        assert_eq!(c.job_timeout(x, Pool::Short), c.pool(Pool::Short).default_timeout);
        assert_eq!(c.job_timeout(x, Pool::Medium), c.pool(Pool::Medium).default_timeout, "reclassified to medium");
        assert_ne!(c.pool(Pool::Short).default_timeout, c.pool(Pool::Medium).default_timeout);
        assert_eq!(c.job_timeout(y, Pool::Medium), Duration::from_secs(7), "its own timeout wins");
    }

    #[test]
    fn breaker_poison_and_retry_budget_settings_are_validated_at_start() {
        let bad = [
            (
                "[job_types.x]\npool = \"short\"\nhandler = \"echo\"\n[job_types.x.breaker]\nfailure_ratio = 1.5\n",
                "job_types.x.breaker.failure_ratio",
            ),
            (
                "[job_types.x]\npool = \"short\"\nhandler = \"echo\"\n[job_types.x.breaker]\nmin_requests = 0\n",
                "job_types.x.breaker.min_requests",
            ),
            ("[worker.poison]\nenter_ratio = 0.3\nexit_ratio = 0.4\n", "worker.poison.exit_ratio"),
            ("[worker.poison]\nbuckets = 0\n", "worker.poison.buckets"),
            ("[worker.retry_budget]\nratio = -1.0\n", "worker.retry_budget.ratio"),
            ("[worker.retry_budget]\nwindow = \"10ms\"\n", "worker.retry_budget.window"),
            ("[worker.retry_budget]\nallowance = -5.0\n", "worker.retry_budget.allowance"),
        ];
        for (text, key) in bad {
            let err = Config::parse(text, "t").expect_err(text).to_string();
            assert!(err.contains(&format!("`{key}`")) && err.contains("e.g."), "{text}: {err}");
        }
        let ok = "[job_types.x]\npool = \"short\"\nhandler = \"echo\"\n[job_types.x.breaker]\nfailure_ratio = 0.6\n\
                  [worker.poison]\nenter_ratio = 0.6\n[worker.retry_budget]\nratio = 3.0\n";
        Config::parse(ok, "t").unwrap();
    }

    #[test]
    fn the_assignor_is_range_unless_set_and_belongs_to_the_classic_protocol() {
        let c = Config::parse("", "t").unwrap();
        assert_eq!(crate::kafka::assignor(&c).strategy(), "range");
        let c = Config::parse("[kafka]\nassignor = \"cooperative-sticky\"\n", "t").unwrap();
        assert_eq!(crate::kafka::assignor(&c).strategy(), "cooperative-sticky");
        let err = Config::parse("[kafka]\nassignor = \"sticky\"\n", "t").unwrap_err().to_string();
        assert!(err.contains("cooperative-sticky") && err.contains("range"), "{err}");
        let err = Config::parse("[kafka]\ngroup_protocol = \"consumer\"\nassignor = \"range\"\n", "t")
            .unwrap_err()
            .to_string();
        assert!(err.contains("kafka.assignor") && err.contains("classic"), "{err}");
        Config::parse("[kafka]\ngroup_protocol = \"consumer\"\n", "t").unwrap();
    }

    #[test]
    fn bad_tier_is_named() {
        let err = Config::parse("[tenants.a]\ntier = \"gold\"\n", "t").unwrap_err().to_string();
        assert!(err.contains("gold") && err.contains("enterprise"), "{err}");
    }

    #[test]
    fn reserved_slots_need_enterprise() {
        let err = Config::parse("[tenants.a]\ntier = \"pro\"\nreserved_slots = 2\n", "t").unwrap_err().to_string();
        assert!(err.contains("tenants.a.reserved_slots"), "{err}");
    }

    #[test]
    fn flow_key_limits_take_a_rate_per_period_and_say_what_is_missing() {
        let c = Config::parse(
            "[flow.keys.\"vectorizer\"]\nrate = 10\nperiod = \"1m\"\n\
             [job_types.x]\npool = \"short\"\nhandler = \"echo\"\nflow = { parallelism = 2, rate = 3 }\n",
            "t",
        )
        .unwrap();
        let l = c.flow.keys["vectorizer"];
        assert_eq!((l.parallelism, l.rate, l.period), (None, Some(10), Some(crate::core::retry::DurationMs::mins(1))));
        assert_eq!(c.job_types["x"].flow.and_then(|f| f.rate), Some(3));
        let err = Config::parse("[flow.keys.\"v\"]\nperiod = \"1m\"\n", "t").unwrap_err().to_string();
        assert!(err.contains("flow.keys.\"v\"") && err.contains("rate = N"), "{err}");
        let err = Config::parse("[flow.keys.\"v\"]\nrate = 0\n", "t").unwrap_err().to_string();
        assert!(err.contains("flow.keys.\"v\".rate`: must be at least 1"), "{err}");
        let err = Config::parse("[flow.keys.\"v\"]\nrate = 5\nperiod = \"soon\"\n", "t").unwrap_err().to_string();
        assert!(err.contains("soon"), "{err}");
    }
}
