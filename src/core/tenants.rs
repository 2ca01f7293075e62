//! The tenants registry's pure rules: a tenant's record as stored (tier, weight, limits,
//! suspension, labels), its validation (every error names the field and the fix), its
//! scheduling policy, and what happens to a job of a tenant nobody registered. The
//! registry itself is live data in the store (`crate::ops::tenants`); the config file's
//! `[tenants.*]` only seeds it (`fairway init`).

use super::scheduler::{RateLimit, TenantPolicy, Tier};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// One registered tenant, as stored in the live registry: what is enforced. The config
/// file's `[tenants.<name>]` (`config::TenantConfig`) only seeds it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantRecord {
    pub name: String,
    #[serde(default)]
    pub tier: Tier,
    /// Overrides the tier's weight (not for free tenants: they share the free weight).
    pub weight: Option<f64>,
    /// Most running jobs per pool: across the pool's workers when `worker.fleet_limits`
    /// is on (the default; shared out by `core::quota`), else per worker.
    pub max_concurrency: Option<usize>,
    /// Most dispatches per second per pool: across the pool's workers when
    /// `worker.fleet_limits` is on (the default; shared by demand, `core::quota`), else
    /// per worker.
    pub rate_per_sec: Option<u32>,
    /// Enterprise only: slots per pool reserved for it.
    #[serde(default)]
    pub reserved_slots: usize,
    /// Most jobs queued fleet-wide before the front door refuses submissions (429
    /// `TENANT_QUEUE_FULL`); unset: `admission.max_queued` of the tier, if any.
    pub max_queued: Option<usize>,
    /// Suspended: its jobs wait (nothing is dispatched, nothing is dead-lettered).
    #[serde(default)]
    pub suspended: bool,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// The region whose API serves this tenant (`core::regions`); unset: every region's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub home_region: Option<String>,
    /// Where its client fails over to when the home region is down.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secondary_region: Option<String>,
}

/// A setting that cannot be stored: which field, and what to do.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("tenant {tenant}: {field} {problem}")]
pub struct TenantError {
    pub tenant: String,
    pub field: &'static str,
    pub problem: String,
}

/// One pool's room for reservations: its slots per worker and how many of them must
/// stay shared (`SchedulerConfig::min_shared_slots`).
#[derive(Debug, Clone, PartialEq)]
pub struct PoolRoom {
    pub pool: String,
    pub slots: usize,
    pub min_shared: usize,
}

/// Whether the enterprise tenants' reservations fit every pool once `changed` is stored
/// in `registry`: each worker's scheduler holds every tenant's reserved slots in each
/// pool it serves, so per pool they must leave `min_shared` of its slots shared. Err
/// names the tenants, the pool and the fix. A change that reserves nothing always passes
/// (it cannot make a misfit worse).
pub fn check_reservations(
    registry: &BTreeMap<String, TenantRecord>,
    changed: &TenantRecord,
    pools: &[PoolRoom],
) -> Result<(), TenantError> {
    let reserved = |t: &TenantRecord| if t.tier == Tier::Enterprise { t.reserved_slots } else { 0 };
    if reserved(changed) == 0 {
        return Ok(());
    }
    let mut holders: Vec<(&str, usize)> = registry
        .values()
        .filter(|t| t.name != changed.name && reserved(t) > 0)
        .map(|t| (t.name.as_str(), reserved(t)))
        .collect();
    holders.push((changed.name.as_str(), reserved(changed)));
    let total: usize = holders.iter().fold(0usize, |sum, (_, r)| sum.saturating_add(*r));
    for p in pools {
        if total.saturating_add(p.min_shared) <= p.slots {
            continue;
        }
        let who: Vec<String> = holders.iter().map(|(n, r)| format!("{n} ({r})")).collect();
        let others = total.saturating_sub(reserved(changed));
        let room = p.slots.saturating_sub(p.min_shared).saturating_sub(others);
        return Err(TenantError {
            tenant: changed.name.clone(),
            field: "reserved_slots",
            problem: format!(
                "does not fit pool {}: tenants {} would reserve {total} of its {} slots per worker and at least {} \
                 must stay shared; reserve at most {room} here, lower another tenant's reservation, or give \
                 pools.{}.slots more",
                p.pool,
                who.join(", "),
                p.slots,
                p.min_shared,
                p.pool
            ),
        });
    }
    Ok(())
}

/// Whether `t`'s home and secondary regions are regions of `regions` (`core::regions`).
pub fn check_regions(t: &TenantRecord, regions: &super::regions::RegionConfig) -> Result<(), TenantError> {
    regions.check_home(t.home_region.as_deref(), t.secondary_region.as_deref()).map_err(|e| TenantError {
        tenant: t.name.clone(),
        field: if e.field == "home_region" { "home_region" } else { "secondary_region" },
        problem: e.problem,
    })
}

impl TenantRecord {
    pub fn new(name: &str, tier: Tier) -> Self {
        TenantRecord {
            name: name.to_string(),
            tier,
            weight: None,
            max_concurrency: None,
            rate_per_sec: None,
            reserved_slots: 0,
            max_queued: None,
            suspended: false,
            labels: BTreeMap::new(),
            home_region: None,
            secondary_region: None,
        }
    }

    /// Its regions, for `core::regions::route`.
    pub fn homes(&self) -> super::regions::Homes<'_> {
        super::regions::Homes { home: self.home_region.as_deref(), secondary: self.secondary_region.as_deref() }
    }

    /// The record a `[tenants.<name>]` section of the config file seeds.
    pub fn from_config(name: &str, t: &crate::config::TenantConfig) -> Self {
        TenantRecord {
            weight: t.weight,
            max_concurrency: t.max_concurrency,
            rate_per_sec: t.rate_per_sec,
            reserved_slots: t.reserved_slots,
            max_queued: t.max_queued,
            ..TenantRecord::new(name, t.tier)
        }
    }

    /// Checks every field; a record that fails is never stored or applied.
    pub fn validate(&self) -> Result<(), TenantError> {
        let bad =
            |field, problem: &str| Err(TenantError { tenant: self.name.clone(), field, problem: problem.to_string() });
        if !valid_name(&self.name) {
            return bad("name", "must be 1 to 128 characters of letters, digits, '_', '-' or '.'");
        }
        if let Some(w) = self.weight {
            if !(w > 0.0 && w.is_finite()) {
                return bad("weight", "must be a positive number (or leave it unset for the tier's weight)");
            }
            if self.tier == Tier::Free {
                return bad("weight", "cannot be set for a free tenant (free tenants share the free tier's weight); choose a paid tier or drop the weight");
            }
        }
        if let Some(w) = self.weight.filter(|w| *w > MAX_WEIGHT) {
            return bad("weight", &format!("{w} is above {MAX_WEIGHT}, the largest weight a tenant may have"));
        }
        for (field, v) in [
            ("max_concurrency", self.max_concurrency),
            ("max_queued", self.max_queued),
            ("reserved_slots", Some(self.reserved_slots)),
        ] {
            if v.is_some_and(|v| v > MAX_COUNT) {
                return bad(field, &format!("must be at most {MAX_COUNT} (what the registry stores)"));
            }
        }
        if self.max_concurrency == Some(0) {
            return bad("max_concurrency", "must be at least 1 (to stop a tenant, suspend it)");
        }
        if self.rate_per_sec == Some(0) {
            return bad("rate_per_sec", "must be at least 1 (to stop a tenant, suspend it)");
        }
        if self.max_queued == Some(0) {
            return bad("max_queued", "must be at least 1 (to stop a tenant, suspend it)");
        }
        if self.reserved_slots > 0 && self.tier != Tier::Enterprise {
            return bad("reserved_slots", "is for enterprise tenants only; set the tier to enterprise or use 0");
        }
        if self.labels.len() > MAX_LABELS {
            return bad("labels", &format!("at most {MAX_LABELS} labels"));
        }
        for (k, v) in &self.labels {
            if k.is_empty() || k.len() > 64 {
                return bad("labels", "keys must be 1 to 64 characters");
            }
            if v.len() > MAX_LABEL_VALUE {
                return bad("labels", &format!("values must be at most {MAX_LABEL_VALUE} bytes"));
            }
        }
        for (field, region) in [("home_region", &self.home_region), ("secondary_region", &self.secondary_region)] {
            if region.as_deref().is_some_and(|r| !super::regions::valid_region_name(r)) {
                return bad(field, "must be 1 to 64 characters of lowercase letters, digits, '-' or '_' (e.g. \"eu\")");
            }
        }
        Ok(())
    }

    /// The scheduler's policy for this tenant in one pool of one worker.
    pub fn policy(&self) -> TenantPolicy {
        TenantPolicy {
            tier: self.tier,
            weight: if self.tier == Tier::Free { None } else { self.weight },
            max_running: self.max_concurrency,
            rate_limit: self.rate_per_sec.map(|r| RateLimit { per_second: f64::from(r), burst: r.max(1) }),
            max_queued: None,
            reserved_slots: (self.reserved_slots > 0).then_some(self.reserved_slots),
            min_share: None,
            suspended: self.suspended,
        }
    }
}

/// Largest count a tenant's record may hold (`max_concurrency`, `max_queued`,
/// `reserved_slots`): what the registry's `int` columns store.
pub const MAX_COUNT: usize = i32::MAX as usize;
/// Largest weight a tenant may have.
pub const MAX_WEIGHT: f64 = 1e6;
/// Labels one tenant may carry, and the longest value.
pub const MAX_LABELS: usize = 64;
pub const MAX_LABEL_VALUE: usize = 256;

pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 128
        && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
}

/// The registry as one process sees it: every tenant, and the version it was read at.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TenantSet {
    pub version: i64,
    pub tenants: BTreeMap<String, TenantRecord>,
}

/// What to do with a job of a tenant nobody registered (`[registry] unknown_tenants`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum UnknownTenants {
    /// Refuse it at the front door; a worker dead-letters it (permanent).
    #[default]
    Reject,
    /// Register the tenant at the default tier on its first job and run it.
    Admit,
}

/// How a job's tenant is admitted.
#[derive(Debug, Clone, PartialEq)]
pub enum Standing<'a> {
    Known(&'a TenantRecord),
    /// Unknown, admitted by policy: register this record, then run the job.
    Register(TenantRecord),
    /// A row-less account (its name matches `registry.free_accounts`): the free tier's
    /// defaults, never stored.
    Rowless(TenantRecord),
    /// Unknown and refused: why, and how to fix it.
    Refused(String),
}

/// What happens to tenants without a row (`[registry]`): the policy, the tier they get,
/// and the names that are free accounts by pattern.
#[derive(Debug, Clone, Copy)]
pub struct Unregistered<'a> {
    pub policy: UnknownTenants,
    pub default_tier: Tier,
    pub free_accounts: &'a [AccountPattern],
}

/// A tenant-name pattern of row-less free accounts (`registry.free_accounts`): letters,
/// digits, '_', '-', '.' and `*`, which matches any run of characters (`"free-*"`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct AccountPattern(String);

impl TryFrom<String> for AccountPattern {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        let literal = s.replace('*', "");
        let ok = !s.is_empty() && s.len() <= 128 && (literal.is_empty() || valid_name(&literal)) && s != "*";
        if !ok {
            return Err(format!(
                "registry.free_accounts: {s:?} is not a pattern of letters, digits, '_', '-', '.' and '*' \
                 (e.g. \"free-*\"; a lone \"*\" is refused: use unknown_tenants = \"admit\" with default_tier = \"free\")"
            ));
        }
        Ok(AccountPattern(s))
    }
}

impl From<AccountPattern> for String {
    fn from(p: AccountPattern) -> String {
        p.0
    }
}

impl AccountPattern {
    /// Whether `name` matches (`*` = any run of characters, possibly empty).
    pub fn matches(&self, name: &str) -> bool {
        let parts: Vec<&str> = self.0.split('*').collect();
        let (first, last) = (parts[0], parts[parts.len() - 1]);
        if parts.len() == 1 {
            return name == first;
        }
        if name.len() < first.len() + last.len() || !name.starts_with(first) || !name.ends_with(last) {
            return false;
        }
        let mut rest = &name[first.len()..name.len() - last.len()];
        for mid in &parts[1..parts.len() - 1] {
            match rest.find(mid) {
                Some(i) => rest = &rest[i + mid.len()..],
                None => return false,
            }
        }
        true
    }

    /// Whether any of `patterns` matches `name`.
    pub fn any(patterns: &[AccountPattern], name: &str) -> bool {
        patterns.iter().any(|p| p.matches(name))
    }
}

/// One entry of the registry's change feed (`tenant_changes`): what happened to one
/// tenant, at the writer's clock. Processes apply the feed instead of reloading rows.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TenantChange {
    pub at: i64,
    pub name: String,
    pub kind: ChangeKind,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ChangeKind {
    /// An operator's add or set: the tenant's whole record from now on.
    Put(TenantRecord),
    /// Registered by policy: counts only where the tenant is unknown (the row is written
    /// under an operator's changes, so it never overrides one).
    Register(TenantRecord),
    Removed,
}

impl TenantSet {
    pub fn standing(&self, tenant: &str, rules: Unregistered<'_>) -> Standing<'_> {
        if let Some(t) = self.tenants.get(tenant) {
            return Standing::Known(t);
        }
        if AccountPattern::any(rules.free_accounts, tenant) && valid_name(tenant) {
            return Standing::Rowless(TenantRecord::new(tenant, Tier::Free));
        }
        match rules.policy {
            UnknownTenants::Admit if valid_name(tenant) => {
                Standing::Register(TenantRecord::new(tenant, rules.default_tier))
            }
            UnknownTenants::Admit => Standing::Refused(format!(
                "tenant name {tenant:?} is not valid (1 to 128 letters, digits, '_', '-', '.'); fix the producer"
            )),
            UnknownTenants::Reject => Standing::Refused(format!(
                "unknown tenant {tenant:?}; register it with `fairway tenants add {tenant} --tier <tier>` \
                 (or set [registry] unknown_tenants = \"admit\")"
            )),
        }
    }

    /// Tenants added or changed from `old` to `self` (what a scheduler must re-apply).
    pub fn changed_since<'a>(&'a self, old: &TenantSet) -> Vec<&'a TenantRecord> {
        self.tenants.values().filter(|t| old.tenants.get(&t.name) != Some(*t)).collect()
    }

    /// Applies feed entries in (time, name) order; true if the set changed. Applying a
    /// window of the feed again (readers re-read a few seconds of overlap) changes nothing.
    pub fn apply(&mut self, changes: &[TenantChange]) -> bool {
        let mut ordered: Vec<&TenantChange> = changes.iter().collect();
        ordered.sort_by(|a, b| (a.at, &a.name).cmp(&(b.at, &b.name)));
        // Each touched tenant's record before: the set changed if any differs after.
        let mut before: BTreeMap<&str, Option<TenantRecord>> = BTreeMap::new();
        for c in ordered {
            before.entry(c.name.as_str()).or_insert_with(|| self.tenants.get(&c.name).cloned());
            match &c.kind {
                ChangeKind::Put(t) => {
                    self.tenants.insert(c.name.clone(), t.clone());
                }
                ChangeKind::Register(t) => {
                    self.tenants.entry(c.name.clone()).or_insert_with(|| t.clone());
                }
                ChangeKind::Removed => {
                    self.tenants.remove(&c.name);
                }
            }
        }
        before.into_iter().any(|(name, was)| self.tenants.get(name) != was.as_ref())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reservations_must_fit_every_pool_with_a_shared_slot_left() {
        let ent =
            |name: &str, r: usize| TenantRecord { reserved_slots: r, ..TenantRecord::new(name, Tier::Enterprise) };
        let pools = [
            PoolRoom { pool: "short".into(), slots: 64, min_shared: 1 },
            PoolRoom { pool: "long".into(), slots: 4, min_shared: 1 },
        ];
        let mut reg = BTreeMap::new();
        reg.insert("a".to_string(), ent("a", 2));
        // The case: two enterprise tenants with 2 reserved slots each on the 4-slot pool.
        let e = check_reservations(&reg, &ent("b", 2), &pools).unwrap_err();
        assert_eq!((e.tenant.as_str(), e.field), ("b", "reserved_slots"));
        for part in ["pool long", "a (2)", "b (2)", "reserve at most 1", "pools.long.slots"] {
            assert!(e.to_string().contains(part), "{part}: {e}");
        }
        check_reservations(&reg, &ent("b", 1), &pools).unwrap();
        // Replacing a tenant's own reservation counts it once; reserving nothing always passes.
        check_reservations(&reg, &ent("a", 3), &pools).unwrap();
        reg.insert("b".to_string(), ent("b", 3));
        check_reservations(&reg, &TenantRecord::new("c", Tier::Pro), &pools).unwrap();
        // Reservations whose sum would wrap are refused, not wrapped to a small number.
        reg.insert("huge".to_string(), ent("huge", usize::MAX / 2 + 1));
        assert!(check_reservations(&reg, &ent("d", usize::MAX / 2 + 1), &pools).is_err());
    }

    #[test]
    fn invalid_settings_name_the_field_and_the_fix() {
        let mut t = TenantRecord::new("acme", Tier::Standard);
        assert!(t.validate().is_ok());
        t.max_concurrency = Some(0);
        let e = t.validate().unwrap_err();
        assert_eq!(e.field, "max_concurrency");
        assert!(e.to_string().contains("suspend"), "{e}");
        let mut t = TenantRecord::new("acme", Tier::Pro);
        t.reserved_slots = 2;
        assert_eq!(t.validate().unwrap_err().field, "reserved_slots");
        let mut t = TenantRecord::new("free1", Tier::Free);
        t.weight = Some(5.0);
        assert_eq!(t.validate().unwrap_err().field, "weight");
        assert_eq!(TenantRecord::new("bad name", Tier::Free).validate().unwrap_err().field, "name");
        let mut t = TenantRecord::new("acme", Tier::Standard);
        t.rate_per_sec = Some(0);
        assert_eq!(t.validate().unwrap_err().field, "rate_per_sec");
        // Counts and weights an admin gives are bounded.
        let mut t = TenantRecord::new("acme", Tier::Enterprise);
        t.reserved_slots = usize::MAX;
        assert!(t.validate().unwrap_err().to_string().contains("at most 2147483647"));
        let mut t = TenantRecord::new("acme", Tier::Pro);
        t.max_queued = Some(MAX_COUNT + 1);
        assert_eq!(t.validate().unwrap_err().field, "max_queued");
        t.max_queued = Some(MAX_COUNT);
        t.weight = Some(1e300);
        assert_eq!(t.validate().unwrap_err().field, "weight");
        t.weight = None;
        t.labels = (0..=MAX_LABELS).map(|i| (format!("k{i}"), String::new())).collect();
        assert_eq!(t.validate().unwrap_err().field, "labels");
    }

    #[test]
    fn policy_carries_limits_and_suspension() {
        let mut t = TenantRecord::new("acme", Tier::Enterprise);
        t.max_concurrency = Some(3);
        t.rate_per_sec = Some(7);
        t.reserved_slots = 2;
        t.suspended = true;
        let p = t.policy();
        assert_eq!((p.max_running, p.reserved_slots, p.suspended), (Some(3), Some(2), true));
        assert_eq!(p.rate_limit.unwrap().per_second, 7.0);
        assert_eq!(p.max_queued, None, "max_queued is a front-door limit, not a worker buffer");
    }

    #[test]
    fn unknown_tenants_are_refused_or_registered_by_policy() {
        let mut set = TenantSet::default();
        set.tenants.insert("acme".into(), TenantRecord::new("acme", Tier::Pro));
        let rules = |policy| Unregistered { policy, default_tier: Tier::Free, free_accounts: &[] };
        assert!(matches!(set.standing("acme", rules(UnknownTenants::Reject)), Standing::Known(_)));
        match set.standing("newco", rules(UnknownTenants::Reject)) {
            Standing::Refused(why) => assert!(why.contains("fairway tenants add newco"), "{why}"),
            other => panic!("{other:?}"),
        }
        match set.standing("newco", rules(UnknownTenants::Admit)) {
            Standing::Register(r) => assert_eq!((r.name.as_str(), r.tier), ("newco", Tier::Free)),
            other => panic!("{other:?}"),
        }
        assert!(matches!(set.standing("bad name", rules(UnknownTenants::Admit)), Standing::Refused(_)));
    }

    #[test]
    fn changes_are_what_differs() {
        let mut a = TenantSet::default();
        a.tenants.insert("x".into(), TenantRecord::new("x", Tier::Free));
        a.tenants.insert("y".into(), TenantRecord::new("y", Tier::Free));
        let mut b = a.clone();
        b.tenants.get_mut("y").unwrap().tier = Tier::Pro;
        b.tenants.insert("z".into(), TenantRecord::new("z", Tier::Free));
        let names: Vec<&str> = b.changed_since(&a).iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["y", "z"]);
    }

    #[test]
    fn free_accounts_by_pattern_are_admitted_rowless_whatever_the_policy() {
        let mut set = TenantSet::default();
        set.tenants.insert("free-vip".into(), TenantRecord::new("free-vip", Tier::Pro));
        let pats: Vec<AccountPattern> =
            ["free-*", "*.trial", "a*b*c"].iter().map(|p| AccountPattern::try_from(p.to_string()).unwrap()).collect();
        let rules = Unregistered { policy: UnknownTenants::Reject, default_tier: Tier::Standard, free_accounts: &pats };
        match set.standing("free-42", rules) {
            Standing::Rowless(r) => assert_eq!(r.tier, Tier::Free),
            other => panic!("{other:?}"),
        }
        assert!(matches!(set.standing("free-vip", rules), Standing::Known(t) if t.tier == Tier::Pro));
        assert!(matches!(set.standing("x.trial", rules), Standing::Rowless(_)));
        assert!(matches!(set.standing("aXbYc", rules), Standing::Rowless(_)));
        assert!(matches!(set.standing("acb", rules), Standing::Refused(_)));
        assert!(matches!(set.standing("free", rules), Standing::Refused(_)));
        for bad in ["", "*", "free *", "x/y*"] {
            let e = AccountPattern::try_from(bad.to_string()).unwrap_err();
            assert!(e.contains("registry.free_accounts"), "{e}");
        }
    }

    #[test]
    fn the_change_feed_applies_in_order_and_registrations_never_override() {
        let rec = |tier| TenantRecord::new("x", tier);
        let ch = |at, kind| TenantChange { at, name: "x".into(), kind };
        let feed = vec![
            ch(3, ChangeKind::Register(rec(Tier::Free))),
            ch(1, ChangeKind::Put(rec(Tier::Pro))),
            ch(2, ChangeKind::Put(rec(Tier::Enterprise))),
        ];
        let mut set = TenantSet::default();
        assert!(set.apply(&feed));
        assert_eq!(set.tenants["x"].tier, Tier::Enterprise, "the latest put wins; the registration does not");
        assert!(!set.apply(&feed), "re-applying an overlapping window changes nothing");
        assert!(set.apply(&[ch(4, ChangeKind::Removed)]));
        assert!(set.tenants.is_empty());
        assert!(set.apply(&[ch(5, ChangeKind::Register(rec(Tier::Free)))]));
        assert_eq!(set.tenants["x"].tier, Tier::Free);
    }
}
