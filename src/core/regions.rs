//! A tenant's home region (docs/regions.md): which region's API serves a tenant's
//! submissions and reads, what an API in another region answers instead (421 naming the
//! home and its endpoint), when a secondary region takes over (the client says its home
//! failed), and a region's own outage state (`fairway region down`: 503 + `Retry-After`).
//! Pure: the deployment's `[region]` settings, the tenant's record and the request in,
//! a decision out.

use super::invalid::Invalid;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The request header a client sets when it fails over: the region it left (the
/// tenant's home, which answered 503 or could not be reached).
pub const FAILOVER_HEADER: &str = "fairway-failover-from";
/// The answer headers of a 421: the tenant's home region and its public endpoint.
pub const HOME_REGION_HEADER: &str = "fairway-home-region";
pub const HOME_ENDPOINT_HEADER: &str = "fairway-home-endpoint";

/// `[region]`: this deployment's region and the other regions' public endpoints.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RegionConfig {
    /// This deployment's region (e.g. "eu"); unset: no regions (every tenant is served here).
    pub name: Option<String>,
    /// What an API answers a tenant homed elsewhere.
    pub misdirected: Misdirected,
    /// Seconds a refused client is told to wait (`Retry-After`) while this region is
    /// draining or down, unless `fairway region down --retry-after` says otherwise.
    pub retry_after_secs: u64,
    /// Every region's public API endpoint by name (this one's too, if clients reach it).
    pub endpoints: BTreeMap<String, String>,
}

impl Default for RegionConfig {
    fn default() -> Self {
        RegionConfig {
            name: None,
            misdirected: Misdirected::Redirect,
            retry_after_secs: 30,
            endpoints: BTreeMap::new(),
        }
    }
}

/// What an API answers a submission or read of a tenant homed in another region.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Misdirected {
    /// 421 naming the home region and its endpoint; the client goes there.
    #[default]
    Redirect,
    /// Forward the request to the home region (not built: refused by validation).
    Forward,
}

/// A region's own state for submissions (set by `fairway region up|draining|down`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RegionState {
    #[default]
    Up,
    /// Submissions refused (503); reads still served, so clients can follow their jobs.
    Draining,
    /// Submissions and reads refused (503).
    Down,
}

impl RegionState {
    pub fn as_str(self) -> &'static str {
        match self {
            RegionState::Up => "up",
            RegionState::Draining => "draining",
            RegionState::Down => "down",
        }
    }

    pub fn parse(s: &str) -> Result<RegionState, String> {
        match s {
            "up" => Ok(RegionState::Up),
            "draining" => Ok(RegionState::Draining),
            "down" => Ok(RegionState::Down),
            other => Err(format!("region state {other:?} is not one of up, draining, down")),
        }
    }
}

/// Most seconds a `Retry-After` of a region's outage may say.
pub const MAX_RETRY_AFTER_SECS: u64 = 3600;

/// 1 to 64 characters of lowercase letters, digits, '-' and '_'.
pub fn valid_region_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '-' | '_'))
}

const NAME_RULE: &str = "must be 1 to 64 characters of lowercase letters, digits, '-' or '_' (e.g. \"eu\")";

impl RegionConfig {
    /// Checks the section; fields are relative to `[region]`.
    pub fn validate(&self) -> Result<(), Invalid> {
        if self.misdirected == Misdirected::Forward {
            return Invalid::err(
                "misdirected",
                "= \"forward\" is not built yet; use \"redirect\" (421 naming the home region's endpoint)",
            );
        }
        if self.retry_after_secs == 0 || self.retry_after_secs > MAX_RETRY_AFTER_SECS {
            return Invalid::err("retry_after_secs", format!("must be 1 to {MAX_RETRY_AFTER_SECS} seconds, e.g. 30"));
        }
        let Some(name) = &self.name else {
            if !self.endpoints.is_empty() {
                return Invalid::err("name", "is missing but endpoints are listed; name this deployment's region");
            }
            return Ok(());
        };
        if !valid_region_name(name) {
            return Invalid::err("name", NAME_RULE);
        }
        for (region, url) in &self.endpoints {
            if !valid_region_name(region) {
                return Invalid::err(format!("endpoints.{region}"), format!("region name {NAME_RULE}"));
            }
            if !valid_endpoint(url) {
                return Invalid::err(
                    format!("endpoints.{region}"),
                    format!("{url:?} is not an http(s) URL with a host; give e.g. \"https://eu.fairway.example.com\""),
                );
            }
        }
        Ok(())
    }

    /// Whether `region` is this deployment's or one with an endpoint.
    pub fn knows(&self, region: &str) -> bool {
        self.name.as_deref() == Some(region) || self.endpoints.contains_key(region)
    }

    /// The regions this deployment knows, for messages.
    fn known(&self) -> String {
        let mut all: Vec<&str> = self.endpoints.keys().map(String::as_str).collect();
        if let Some(n) = self.name.as_deref().filter(|n| !self.endpoints.contains_key(*n)) {
            all.push(n);
        }
        all.sort_unstable();
        all.join(", ")
    }

    /// Whether a tenant's `home` and `secondary` regions can be stored here: each a region
    /// this deployment knows, the secondary only with a home and not the same one. Err is
    /// the field (`home_region` / `secondary_region`) and the fix.
    pub fn check_home(&self, home: Option<&str>, secondary: Option<&str>) -> Result<(), Invalid> {
        if home.is_none() && secondary.is_none() {
            return Ok(());
        }
        if self.name.is_none() {
            return Invalid::err(
                "home_region",
                "cannot be set: this deployment has no region; set [region] name and [region.endpoints] in its config",
            );
        }
        let Some(home) = home else {
            return Invalid::err("secondary_region", "needs a home_region; set the home region too");
        };
        for (field, region) in [("home_region", Some(home)), ("secondary_region", secondary)] {
            let Some(region) = region else { continue };
            if !valid_region_name(region) {
                return Invalid::err(field, NAME_RULE);
            }
            if !self.knows(region) {
                return Invalid::err(
                    field,
                    format!(
                        "{region:?} is not a region this deployment knows ({}); add it to [region.endpoints]",
                        self.known()
                    ),
                );
            }
        }
        if secondary == Some(home) {
            return Invalid::err("secondary_region", "is the home region; name another region or leave it unset");
        }
        Ok(())
    }
}

fn valid_endpoint(url: &str) -> bool {
    let rest = url.strip_prefix("https://").or_else(|| url.strip_prefix("http://"));
    rest.is_some_and(|r| {
        let host = r.split(['/', '?', '#']).next().unwrap_or("");
        !host.is_empty() && !host.starts_with(':') && !url.chars().any(|c| c.is_whitespace() || c.is_control())
    })
}

/// A tenant's regions, as its record holds them.
#[derive(Debug, Clone, Copy, Default)]
pub struct Homes<'a> {
    pub home: Option<&'a str>,
    pub secondary: Option<&'a str>,
}

/// What a request asks of this region.
#[derive(Debug, Clone, Copy)]
pub struct Ask<'a> {
    /// A submission (else a read of the tenant's jobs).
    pub submission: bool,
    /// The region the client failed over from ([`FAILOVER_HEADER`]), if it says so.
    pub failover_from: Option<&'a str>,
    /// What this region last saw of that region's API (its state as it answers it, or
    /// that it could not be reached): a failover is believed only when it says the home
    /// cannot serve the request.
    pub home_seen: Seen,
}

/// Another region's API as this region last saw it (`GET /region` on its endpoint).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seen {
    /// Not asked (no failover header, no endpoint listed), or an answer that did not
    /// name that region: nothing to believe a failover on.
    Unknown,
    /// It answered with its state.
    State(RegionState),
    /// No answer: connection refused or reset, a timeout, a server error.
    Unreachable,
}

impl Seen {
    /// Whether a region seen so cannot serve a request (`submission`, else a read):
    /// unreachable, down, or draining for submissions (what its own API would answer 503).
    pub fn refuses(self, submission: bool) -> bool {
        match self {
            Seen::Unknown | Seen::State(RegionState::Up) => false,
            Seen::Unreachable | Seen::State(RegionState::Down) => true,
            Seen::State(RegionState::Draining) => submission,
        }
    }
}

/// The decision on one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// Served here.
    Serve,
    /// The tenant's home is another region: 421 naming it and its endpoint (None when
    /// this deployment lists no endpoint for it).
    Elsewhere { region: String, endpoint: Option<String> },
    /// Served here, but this region is draining or down: 503 + `Retry-After`.
    Unavailable { state: RegionState },
}

/// Where a request of a tenant with `homes` goes, in a deployment with `cfg` whose own
/// state is `state`. A tenant without a home (or a deployment without a region) is
/// served here. A tenant homed elsewhere is served here only as its secondary, when the
/// client says it failed over from that home **and** this region saw the home unable to
/// serve it ([`Seen::refuses`]); else it is sent home (a client cannot double its limits
/// by claiming a failover while its home is up).
pub fn route(cfg: &RegionConfig, state: RegionState, homes: Homes<'_>, ask: Ask<'_>) -> Route {
    if let (Some(this), Some(home)) = (cfg.name.as_deref(), homes.home) {
        let stand_in =
            homes.secondary == Some(this) && ask.failover_from == Some(home) && ask.home_seen.refuses(ask.submission);
        if home != this && !stand_in {
            return Route::Elsewhere { region: home.to_string(), endpoint: cfg.endpoints.get(home).cloned() };
        }
    }
    match state {
        RegionState::Up => Route::Serve,
        RegionState::Draining if !ask.submission => Route::Serve,
        RegionState::Draining | RegionState::Down => Route::Unavailable { state },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn cfg(this: &str) -> RegionConfig {
        let endpoints = [("a", "http://127.0.0.1:49101"), ("b", "http://127.0.0.1:49102")]
            .into_iter()
            .map(|(r, u)| (r.to_string(), u.to_string()))
            .collect();
        RegionConfig { name: Some(this.into()), endpoints, ..Default::default() }
    }
    const SUBMIT: Ask<'static> = Ask { submission: true, failover_from: None, home_seen: Seen::Unknown };

    #[test]
    fn a_tenant_homed_elsewhere_is_sent_home_with_its_endpoint() {
        let homes = Homes { home: Some("a"), secondary: Some("b") };
        assert_eq!(
            route(&cfg("b"), RegionState::Up, homes, SUBMIT),
            Route::Elsewhere { region: "a".into(), endpoint: Some("http://127.0.0.1:49101".into()) }
        );
        assert_eq!(route(&cfg("a"), RegionState::Up, homes, SUBMIT), Route::Serve);
        // Failed over from its home to its secondary while the home is down: served there.
        let failover = Ask { submission: true, failover_from: Some("a"), home_seen: Seen::State(RegionState::Down) };
        assert_eq!(route(&cfg("b"), RegionState::Up, homes, failover), Route::Serve);
        let gone = Ask { home_seen: Seen::Unreachable, ..failover };
        assert_eq!(route(&cfg("b"), RegionState::Up, homes, gone), Route::Serve);
        // The header alone, with the home up (or not seen): sent home.
        for home_seen in [Seen::State(RegionState::Up), Seen::Unknown] {
            let claimed = Ask { home_seen, ..failover };
            assert!(matches!(route(&cfg("b"), RegionState::Up, homes, claimed), Route::Elsewhere { .. }));
        }
        // A draining home refuses submissions, not reads.
        let draining = Ask { home_seen: Seen::State(RegionState::Draining), ..failover };
        assert_eq!(route(&cfg("b"), RegionState::Up, homes, draining), Route::Serve);
        let read = Ask { submission: false, ..draining };
        assert!(matches!(route(&cfg("b"), RegionState::Up, homes, read), Route::Elsewhere { .. }));
        // A failover to a region that is not its secondary is sent home.
        let third = Homes { home: Some("a"), secondary: None };
        assert!(matches!(route(&cfg("b"), RegionState::Up, third, failover), Route::Elsewhere { .. }));
    }

    #[test]
    fn an_outage_refuses_submissions_and_down_refuses_reads_too() {
        let read = Ask { submission: false, failover_from: None, home_seen: Seen::Unknown };
        let none = Homes::default();
        let unavailable = |state| Route::Unavailable { state };
        assert_eq!(route(&cfg("a"), RegionState::Draining, none, SUBMIT), unavailable(RegionState::Draining));
        assert_eq!(route(&cfg("a"), RegionState::Draining, none, read), Route::Serve);
        assert_eq!(route(&cfg("a"), RegionState::Down, none, read), unavailable(RegionState::Down));
    }

    #[test]
    fn homes_must_be_known_regions_and_differ() {
        let c = cfg("a");
        assert!(c.check_home(Some("a"), Some("b")).is_ok());
        assert_eq!(c.check_home(Some("z"), None).unwrap_err().field, "home_region");
        assert_eq!(c.check_home(None, Some("b")).unwrap_err().field, "secondary_region");
        assert_eq!(c.check_home(Some("a"), Some("a")).unwrap_err().field, "secondary_region");
        let plain = RegionConfig::default();
        assert!(plain.check_home(Some("a"), None).unwrap_err().problem.contains("[region]"));
        assert!(plain.check_home(None, None).is_ok());
    }

    #[test]
    fn the_section_is_checked_with_the_fix() {
        assert!(cfg("a").validate().is_ok());
        let forward = RegionConfig { misdirected: Misdirected::Forward, ..cfg("a") };
        assert_eq!(forward.validate().unwrap_err().field, "misdirected");
        let mut bad = cfg("a");
        bad.endpoints.insert("c".into(), "ftp://x".into());
        assert_eq!(bad.validate().unwrap_err().field, "endpoints.c");
        let nameless = RegionConfig { name: None, ..cfg("a") };
        assert_eq!(nameless.validate().unwrap_err().field, "name");
        assert_eq!(RegionConfig { name: Some("EU".into()), ..cfg("a") }.validate().unwrap_err().field, "name");
    }

    fn region() -> impl Strategy<Value = Option<&'static str>> {
        prop_oneof![Just(None), Just(Some("a")), Just(Some("b")), Just(Some("c"))]
    }
    fn state() -> impl Strategy<Value = RegionState> {
        prop_oneof![Just(RegionState::Up), Just(RegionState::Draining), Just(RegionState::Down)]
    }
    fn seen() -> impl Strategy<Value = Seen> {
        prop_oneof![Just(Seen::Unknown), Just(Seen::Unreachable), state().prop_map(Seen::State)]
    }

    proptest! {
        #[test]
        fn a_tenant_without_a_home_is_served_as_before_whatever_the_region(
            this in prop_oneof![Just("a"), Just("b")], submission: bool, from in region(), home_seen in seen(),
        ) {
            let ask = Ask { submission, failover_from: from, home_seen };
            let r = route(&cfg(this), RegionState::Up, Homes::default(), ask);
            prop_assert_eq!(r, Route::Serve);
        }

        #[test]
        fn a_request_is_served_only_at_home_or_at_the_secondary_after_a_failover(
            this in prop_oneof![Just("a"), Just("b")], home in region(), secondary in region(),
            submission: bool, from in region(), st in state(), home_seen in seen(),
        ) {
            let homes = Homes { home, secondary };
            let r = route(&cfg(this), st, homes, Ask { submission, failover_from: from, home_seen });
            // Away from home only at the secondary, after a failover from a home seen
            // unable to serve the request.
            let failed_over = secondary == Some(this) && from == home && home_seen.refuses(submission);
            let here = home.is_none() || home == Some(this) || failed_over;
            match r {
                Route::Elsewhere { region, .. } => {
                    prop_assert!(!here);
                    prop_assert_eq!(Some(region.as_str()), home);
                }
                Route::Serve => prop_assert!(here && (st == RegionState::Up || (st == RegionState::Draining && !submission))),
                Route::Unavailable { state } => prop_assert!(here && state == st && st != RegionState::Up),
            }
        }
    }
}
