//! Front-door admission, the pure rules (the I/O shell is `crate::admission`, used by
//! the HTTP API and `fairway submit`). No I/O, `now` is an argument.
//!
//! A submission is admitted only when every scope agrees:
//! - **queue depth** – a tenant's jobs queued fleet-wide (enqueued at the front door
//!   minus dequeued by workers, counter rows in the store) plus this submission stay
//!   within its `max_queued` ([`queue_check`]);
//! - **tenant rate** – a token bucket per tenant ([`TokenBucket`]: burst = one period's
//!   worth, refilled evenly), smoothing bursts;
//! - **end-user rate** – a sliding window per (tenant, `user_key`) ([`SlidingWindow`]:
//!   exact count of the last period, no boundary bursts).
//!
//! Rates are [`Rate`]s such as `"3/min"`, `"30/min"`, `"100/s"`, `"5/10s"`, so limits
//! below one per second are expressible. When both rate scopes refuse, the longer wait
//! is reported (the tighter limit wins) and nothing is taken from either
//! ([`RateLimiters::admit`] is all-or-nothing across a whole batch).
//!
//! Circuit breaker at submission per pool and job type: [`breaker`].
//!
//! Quota alerts: [`QuotaLevels`] turns the share of a limit in use into crossings of the
//! alert levels (60 % and 80 % by default), once per crossing upwards.

pub mod breaker;

use crate::core::FastMap;
use crate::model::Millis;
use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::str::FromStr;

/// A rate: `count` events per `per_ms` milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rate {
    pub count: u32,
    pub per_ms: i64,
}

impl Rate {
    pub fn per_second(count: u32) -> Rate {
        Rate { count, per_ms: 1_000 }
    }
    /// One of `n` equal shares: `1/n` of the steady rate and of the burst (at least one
    /// event per period, the period stretched to keep the share exact).
    pub fn share(self, n: u32) -> Rate {
        if n <= 1 {
            return self;
        }
        let count = (self.count / n).max(1);
        let per_ms = (self.per_ms as i128 * i128::from(count) * i128::from(n) / i128::from(self.count.max(1))) as i64;
        Rate { count, per_ms: per_ms.max(1) }
    }

    /// Milliseconds between two events at the steady rate.
    pub fn interval_ms(&self) -> f64 {
        self.per_ms as f64 / f64::from(self.count.max(1))
    }
}

impl FromStr for Rate {
    type Err = String;
    /// `"<count>/<period>"`: the period a unit (`s`, `min`, `h`, `d`) or a duration
    /// (`10s`, `5m`).
    fn from_str(s: &str) -> Result<Rate, String> {
        let bad = |why: &str| format!("rate {s:?} {why}; write <count>/<period>, e.g. \"3/min\", \"100/s\", \"5/10s\"");
        let (count, period) = s.trim().split_once('/').ok_or_else(|| bad("has no '/'"))?;
        let count: u32 = count.trim().parse().map_err(|_| bad("does not start with a whole number"))?;
        if count == 0 {
            return Err(bad("allows nothing (0); to stop a tenant, suspend it"));
        }
        let period = period.trim();
        let period =
            if period.starts_with(|c: char| c.is_ascii_digit()) { period.to_string() } else { format!("1{period}") };
        let per_ms =
            period.parse::<crate::core::retry::DurationMs>().map_err(|e| bad(&format!("has a bad period ({e})")))?.0;
        if per_ms < 1 {
            return Err(bad("has an empty period"));
        }
        Ok(Rate { count, per_ms })
    }
}

impl fmt::Display for Rate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.per_ms {
            1_000 => write!(f, "{}/s", self.count),
            60_000 => write!(f, "{}/min", self.count),
            3_600_000 => write!(f, "{}/h", self.count),
            ms => write!(f, "{}/{}", self.count, crate::core::retry::DurationMs(ms)),
        }
    }
}

impl<'de> serde::Deserialize<'de> for Rate {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Rate, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// Whether `n` more events fit now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fit {
    Yes,
    /// Not before this many milliseconds from now.
    Wait(i64),
    /// Never at once: `n` is above what the limit ever allows in one go.
    Never {
        most: u32,
    },
}

/// Token bucket: holds up to `rate.count` tokens, refilled at the rate.
#[derive(Debug, Clone)]
pub struct TokenBucket {
    rate: Rate,
    tokens: f64,
    at: Millis,
}

impl TokenBucket {
    /// A full bucket.
    pub fn new(rate: Rate, now: Millis) -> Self {
        TokenBucket { rate, tokens: f64::from(rate.count), at: now }
    }
    pub fn rate(&self) -> Rate {
        self.rate
    }
    fn refill(&mut self, now: Millis) {
        let elapsed = (now - self.at).max(0) as f64;
        self.tokens = (self.tokens + elapsed / self.rate.interval_ms()).min(f64::from(self.rate.count));
        self.at = self.at.max(now);
    }
    pub fn fits(&mut self, n: u32, now: Millis) -> Fit {
        self.refill(now);
        if n > self.rate.count {
            return Fit::Never { most: self.rate.count };
        }
        let missing = f64::from(n) - self.tokens;
        if missing <= 1e-9 {
            Fit::Yes
        } else {
            Fit::Wait((missing * self.rate.interval_ms()).ceil().max(1.0) as i64)
        }
    }
    /// Takes `n` tokens (call after [`TokenBucket::fits`] said yes).
    pub fn take(&mut self, n: u32, now: Millis) {
        self.refill(now);
        self.tokens = (self.tokens - f64::from(n)).max(0.0);
    }
    /// Share of the bucket in use (0 full, 1 empty).
    pub fn used(&mut self, now: Millis) -> f64 {
        self.refill(now);
        1.0 - self.tokens / f64::from(self.rate.count.max(1))
    }
}

/// Sliding window log: at most `rate.count` events in any `rate.per_ms`.
#[derive(Debug, Clone)]
pub struct SlidingWindow {
    rate: Rate,
    log: VecDeque<Millis>,
}

impl SlidingWindow {
    pub fn new(rate: Rate) -> Self {
        SlidingWindow { rate, log: VecDeque::new() }
    }
    pub fn rate(&self) -> Rate {
        self.rate
    }
    fn evict(&mut self, now: Millis) {
        while self.log.front().is_some_and(|t| *t + self.rate.per_ms <= now) {
            self.log.pop_front();
        }
    }
    pub fn fits(&mut self, n: u32, now: Millis) -> Fit {
        self.evict(now);
        let (n, count) = (n as usize, self.rate.count as usize);
        if n > count {
            return Fit::Never { most: self.rate.count };
        }
        let len = self.log.len();
        if len + n <= count {
            return Fit::Yes;
        }
        // The (len + n - count)th oldest event must leave the window first.
        let must_leave = self.log[len + n - count - 1];
        Fit::Wait((must_leave + self.rate.per_ms - now).max(1))
    }
    pub fn take(&mut self, n: u32, now: Millis) {
        self.evict(now);
        self.log.extend(std::iter::repeat_n(now, n as usize));
    }
    /// Share of the window in use.
    pub fn used(&mut self, now: Millis) -> f64 {
        self.evict(now);
        self.log.len() as f64 / f64::from(self.rate.count.max(1))
    }
    pub fn is_idle(&mut self, now: Millis) -> bool {
        self.evict(now);
        self.log.is_empty()
    }
}

/// What one request asks of the rate limiters: `n` jobs of `tenant` (of end user `key`).
#[derive(Debug, Clone, PartialEq)]
pub struct Demand {
    pub tenant: String,
    pub key: Option<String>,
    pub n: u32,
    pub tenant_rate: Rate,
    /// The per-user limit of the tenant's tier (None: no per-user limit).
    pub user_rate: Option<Rate>,
}

/// Which limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Limit {
    Queue,
    TenantRate,
    UserRate,
}

impl Limit {
    pub const ALL: [Limit; 3] = [Limit::Queue, Limit::TenantRate, Limit::UserRate];
    pub fn as_str(self) -> &'static str {
        match self {
            Limit::Queue => "max_queued",
            Limit::TenantRate => "tenant_rate",
            Limit::UserRate => "user_rate",
        }
    }
}

/// Why a submission is refused.
#[derive(Debug, Clone, PartialEq)]
pub enum Refusal {
    /// The tenant's queue would pass `max_queued`.
    QueueFull { tenant: String, queued: u64, n: u64, max: u64 },
    /// Over a rate; retry after `wait_ms`.
    Rate { scope: Limit, tenant: String, key: Option<String>, rate: Rate, wait_ms: i64 },
    /// More jobs in one request than the limit ever allows at once.
    AboveBurst { scope: Limit, tenant: String, key: Option<String>, n: u32, most: u32 },
}

/// Queue-depth rule: `n` more jobs on top of `queued` must stay within `max`.
pub fn queue_check(tenant: &str, queued: u64, n: u64, max: Option<u64>) -> Result<(), Refusal> {
    match max {
        Some(max) if queued.saturating_add(n) > max => {
            Err(Refusal::QueueFull { tenant: tenant.to_string(), queued, n, max })
        }
        _ => Ok(()),
    }
}

/// The queued count from the counter row: enqueued minus dequeued, never negative.
pub fn queued(enqueued: i64, dequeued: i64) -> u64 {
    enqueued.saturating_sub(dequeued).max(0) as u64
}

/// Most end-user windows kept per tenant: past it the tenant's idle windows are
/// forgotten (at most once a second), and if it is still full its new end users share
/// one window ([`OVERFLOW_KEY`]) at the user rate, so one tenant with a million
/// `user_key`s neither grows this process's memory nor slows other tenants' admissions.
pub const MAX_USER_WINDOWS: usize = 10_000;

/// The window a tenant's new end users share while its windows are at
/// [`MAX_USER_WINDOWS`] (no `user_key` is empty).
const OVERFLOW_KEY: &str = "";

/// How often a full tenant's idle windows are looked for, at most.
const SWEEP_MS: Millis = 1_000;

/// One tenant's end-user windows.
#[derive(Debug, Default)]
struct UserWindows {
    windows: FastMap<String, SlidingWindow>,
    swept_at: Option<Millis>,
}

impl UserWindows {
    /// The key `key`'s demand is counted under: its own window, or the shared overflow
    /// window when the tenant's windows are full.
    fn slot<'k>(&mut self, key: &'k str, now: Millis) -> &'k str {
        if self.windows.contains_key(key) || self.windows.len() < MAX_USER_WINDOWS {
            return key;
        }
        if self.swept_at.is_none_or(|t| now - t >= SWEEP_MS) {
            self.swept_at = Some(now);
            self.windows.retain(|_, w| !w.is_idle(now));
        }
        if self.windows.len() < MAX_USER_WINDOWS {
            key
        } else {
            OVERFLOW_KEY
        }
    }
}

/// The rate limiters of one process: a token bucket per tenant and a sliding window per
/// (tenant, end user), at most [`MAX_USER_WINDOWS`] per tenant.
#[derive(Debug, Default)]
pub struct RateLimiters {
    tenants: FastMap<String, TokenBucket>,
    users: FastMap<String, UserWindows>,
}

fn worse(a: Option<Refusal>, b: Refusal) -> Option<Refusal> {
    let wait = |r: &Refusal| match r {
        Refusal::Rate { wait_ms, .. } => *wait_ms,
        _ => i64::MAX,
    };
    Some(match a {
        Some(a) if wait(&a) >= wait(&b) => a,
        _ => b,
    })
}

impl RateLimiters {
    fn bucket(&mut self, tenant: &str, rate: Rate, now: Millis) -> &mut TokenBucket {
        let b = self.tenants.entry(tenant.to_string()).or_insert_with(|| TokenBucket::new(rate, now));
        if b.rate() != rate {
            *b = TokenBucket::new(rate, now);
        }
        b
    }
    fn window(&mut self, tenant: &str, key: &str, rate: Rate, now: Millis) -> &mut SlidingWindow {
        let u = self.users.entry(tenant.to_string()).or_default();
        let key = u.slot(key, now);
        let w = u.windows.entry(key.to_string()).or_insert_with(|| SlidingWindow::new(rate));
        if w.rate() != rate {
            *w = SlidingWindow::new(rate);
        }
        w
    }

    /// Admits every demand or none: Ok takes from every bucket and window concerned;
    /// Err reports the refusal with the longest wait (the tighter limit) and takes nothing.
    pub fn admit(&mut self, demands: &[Demand], now: Millis) -> Result<(), Refusal> {
        let mut tenant_n: HashMap<&str, (u32, Rate)> = HashMap::new();
        let mut user_n: HashMap<(&str, &str), (u32, Rate)> = HashMap::new();
        for d in demands {
            tenant_n.entry(&d.tenant).or_insert((0, d.tenant_rate)).0 += d.n;
            if let (Some(key), Some(rate)) = (&d.key, d.user_rate) {
                user_n.entry((&d.tenant, key)).or_insert((0, rate)).0 += d.n;
            }
        }
        let mut refused = None;
        for (tenant, (n, rate)) in &tenant_n {
            let fit = self.bucket(tenant, *rate, now).fits(*n, now);
            if let Some(r) = refusal(fit, Limit::TenantRate, tenant, None, *n, *rate) {
                refused = worse(refused.take(), r);
            }
        }
        for ((tenant, key), (n, rate)) in &user_n {
            let fit = self.window(tenant, key, *rate, now).fits(*n, now);
            let key = Some(key.to_string());
            if let Some(r) = refusal(fit, Limit::UserRate, tenant, key, *n, *rate) {
                refused = worse(refused.take(), r);
            }
        }
        if let Some(r) = refused {
            return Err(r);
        }
        for (tenant, (n, rate)) in tenant_n {
            self.bucket(tenant, rate, now).take(n, now);
        }
        for ((tenant, key), (n, rate)) in user_n {
            self.window(tenant, key, rate, now).take(n, now);
        }
        Ok(())
    }

    /// Forgets the idle windows of every tenant (the shell calls it every few seconds,
    /// outside admissions); tenants without windows go.
    pub fn prune(&mut self, now: Millis) {
        for u in self.users.values_mut() {
            u.windows.retain(|_, w| !w.is_idle(now));
        }
        self.users.retain(|_, u| !u.windows.is_empty());
    }

    /// End-user windows kept for `tenant`.
    pub fn user_windows(&self, tenant: &str) -> usize {
        self.users.get(tenant).map_or(0, |u| u.windows.len())
    }

    /// Share in use of the tenant's bucket and of its busiest end user's window.
    pub fn used(&mut self, tenant: &str, now: Millis) -> (Option<f64>, Option<f64>) {
        let t = self.tenants.get_mut(tenant).map(|b| b.used(now));
        let u = self.users.get_mut(tenant).and_then(|u| {
            u.windows.values_mut().map(|w| w.used(now)).fold(None, |m: Option<f64>, v| Some(m.map_or(v, |m| m.max(v))))
        });
        (t, u)
    }

    /// Forgets tenants not in `keep` (removed from the registry).
    pub fn retain_tenants(&mut self, keep: impl Fn(&str) -> bool) {
        self.tenants.retain(|t, _| keep(t));
        self.users.retain(|t, _| keep(t));
    }
}

fn refusal(fit: Fit, scope: Limit, tenant: &str, key: Option<String>, n: u32, rate: Rate) -> Option<Refusal> {
    let tenant = tenant.to_string();
    match fit {
        Fit::Yes => None,
        Fit::Wait(wait_ms) => Some(Refusal::Rate { scope, tenant, key, rate, wait_ms }),
        Fit::Never { most } => Some(Refusal::AboveBurst { scope, tenant, key, n, most }),
    }
}

/// One alert: a tenant's use of a limit rose past an alert level.
#[derive(Debug, Clone, PartialEq)]
pub struct Crossing {
    pub tenant: String,
    pub limit: Limit,
    /// The level crossed (e.g. 0.8).
    pub level: f64,
    pub used: f64,
}

/// The highest alert level each (tenant, limit) is at, to report each crossing upwards
/// once (falling back below a level re-arms it).
#[derive(Debug, Clone, Default)]
pub struct QuotaLevels {
    levels: Vec<f64>,
    at: HashMap<(String, Limit), usize>,
}

impl QuotaLevels {
    /// Alert levels as shares (e.g. `[0.6, 0.8]`), sorted.
    pub fn new(mut levels: Vec<f64>) -> Self {
        levels.retain(|l| l.is_finite() && *l > 0.0);
        levels.sort_by(f64::total_cmp);
        QuotaLevels { levels, at: HashMap::new() }
    }
    pub fn levels(&self) -> &[f64] {
        &self.levels
    }

    /// Records `used` (share of the limit in use); returns the highest level newly crossed.
    pub fn observe(&mut self, tenant: &str, limit: Limit, used: f64) -> Option<Crossing> {
        let reached = self.levels.iter().take_while(|l| used >= **l).count();
        let key = (tenant.to_string(), limit);
        let before = self.at.get(&key).copied().unwrap_or(0);
        if reached == 0 {
            self.at.remove(&key);
        } else {
            self.at.insert(key, reached);
        }
        (reached > before).then(|| Crossing {
            tenant: tenant.to_string(),
            limit,
            level: self.levels[reached - 1],
            used,
        })
    }

    /// How many tenants are at or above each level, per limit (for the gauge).
    pub fn tenants_at(&self) -> Vec<(Limit, f64, usize)> {
        let mut out = Vec::new();
        for limit in Limit::ALL {
            for (i, level) in self.levels.iter().enumerate() {
                let n = self.at.iter().filter(|((_, l), at)| *l == limit && **at > i).count();
                out.push((limit, *level, n));
            }
        }
        out
    }

    /// Forgets tenants not in `keep`.
    pub fn retain_tenants(&mut self, keep: impl Fn(&str) -> bool) {
        self.at.retain(|(t, _), _| keep(t));
    }
}

#[cfg(test)]
mod tests;
