//! W3C Trace Context (`traceparent`, `tracestate`): the rules for the values a job
//! carries from the request that submitted it to its handler. Pure: randomness comes in
//! as arguments.
//!
//! `traceparent` is `version-traceid-parentid-flags`, e.g.
//! `00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01` (lowercase hex; trace and
//! parent ids not all zeros; version `ff` invalid).

/// Why a `traceparent` value was refused, worded for the person who sent it.
pub fn check_traceparent(v: &str) -> Result<(), String> {
    let parts: Vec<&str> = v.split('-').collect();
    let want = "expected version-traceid-parentid-flags, e.g. 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    if parts.len() < 4 {
        return Err(format!("traceparent {v:?} has {} dash-separated parts; {want}", parts.len()));
    }
    let (version, trace_id, parent_id, flags) = (parts[0], parts[1], parts[2], parts[3]);
    let hex = |s: &str, n: usize| s.len() == n && s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    if !hex(version, 2) || version == "ff" {
        return Err(format!(
            "traceparent {v:?}: version {version:?} is not two lowercase hex digits other than ff; {want}"
        ));
    }
    // Version 00 has exactly four parts; later versions may append more.
    if version == "00" && parts.len() != 4 {
        return Err(format!("traceparent {v:?}: version 00 has exactly four parts; {want}"));
    }
    if !hex(trace_id, 32) || trace_id.bytes().all(|b| b == b'0') {
        return Err(format!("traceparent {v:?}: trace id must be 32 lowercase hex digits, not all zero; {want}"));
    }
    if !hex(parent_id, 16) || parent_id.bytes().all(|b| b == b'0') {
        return Err(format!("traceparent {v:?}: parent id must be 16 lowercase hex digits, not all zero; {want}"));
    }
    if !hex(flags, 2) {
        return Err(format!("traceparent {v:?}: flags must be two lowercase hex digits; {want}"));
    }
    Ok(())
}

/// `tracestate` is a list of at most 32 `key=value` members, at most 512 characters in
/// all (the limit vendors must accept); it is passed on unchanged.
pub fn check_tracestate(v: &str) -> Result<(), String> {
    if v.len() > 512 {
        return Err(format!("tracestate is {} characters long; at most 512 are accepted", v.len()));
    }
    let members: Vec<&str> = v.split(',').map(str::trim).filter(|m| !m.is_empty()).collect();
    if members.len() > 32 {
        return Err(format!("tracestate has {} members; at most 32 are allowed", members.len()));
    }
    if let Some(bad) = members.iter().find(|m| !m.contains('=') || m.starts_with('=')) {
        return Err(format!("tracestate member {bad:?} is not key=value"));
    }
    Ok(())
}

/// A new trace, for a submission that came without one (sampled).
pub fn new_traceparent(trace_id: u128, parent_id: u64) -> String {
    // Zero ids are invalid: map them to one (a 2^-64 chance, kept deterministic).
    let trace_id = if trace_id == 0 { 1 } else { trace_id };
    let parent_id = if parent_id == 0 { 1 } else { parent_id };
    format!("00-{trace_id:032x}-{parent_id:016x}-01")
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const GOOD: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn accepts_the_spec_example() {
        assert_eq!(check_traceparent(GOOD), Ok(()));
        // A future version may carry more parts.
        assert_eq!(check_traceparent(&format!("01-{}-extra", &GOOD[3..])), Ok(()));
    }

    #[test]
    fn refuses_what_the_spec_refuses() {
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-1",
        ] {
            let e = check_traceparent(bad).unwrap_err();
            assert!(e.contains("traceparent"), "{e}");
        }
    }

    #[test]
    fn tracestate_limits() {
        assert_eq!(check_tracestate("rojo=00f067aa0ba902b7,congo=t61rcWkgMzE"), Ok(()));
        assert!(check_tracestate(&"a=b,".repeat(33)).is_err());
        assert!(check_tracestate(&"x".repeat(513)).is_err());
        assert!(check_tracestate("novalue").is_err());
    }

    proptest! {
        #[test]
        fn new_traces_are_valid(trace in any::<u128>(), parent in any::<u64>()) {
            prop_assert_eq!(check_traceparent(&new_traceparent(trace, parent)), Ok(()));
        }
    }
}
