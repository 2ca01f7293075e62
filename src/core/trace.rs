//! W3C Trace Context (`traceparent`, `tracestate`): the rules for the values a job
//! carries from the request that submitted it to its handler. Pure: randomness comes in
//! as arguments.
//!
//! `traceparent` is `version-traceid-parentid-flags`, e.g.
//! `00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01` (lowercase hex; trace and
//! parent ids not all zeros; version `ff` invalid).

/// Why a `traceparent` value was refused, worded for the person who sent it.
pub fn check_traceparent(v: &str) -> Result<(), String> {
    // Checked on every job a worker runs: the parts are read in place, not collected.
    let mut parts = v.split('-');
    let want = "expected version-traceid-parentid-flags, e.g. 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let (Some(version), Some(trace_id), Some(parent_id), Some(flags)) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(format!("traceparent {v:?} has {} dash-separated parts; {want}", v.split('-').count()));
    };
    let more_parts = parts.next().is_some();
    let hex = |s: &str, n: usize| s.len() == n && s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    if !hex(version, 2) || version == "ff" {
        return Err(format!(
            "traceparent {v:?}: version {version:?} is not two lowercase hex digits other than ff; {want}"
        ));
    }
    // Version 00 has exactly four parts; later versions may append more.
    if version == "00" && more_parts {
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
/// all (the limit vendors must accept), each member to the W3C grammar; it is passed on
/// unchanged, so a value that could not be sent as an HTTP header never gets in:
/// - key: `lcalpha 0*255(lcalpha / DIGIT / "_" / "-" / "*" / "/")`, or a multi-tenant
///   key `tenant@system` (tenant: `(lcalpha / DIGIT) 0*240(...)`, system: `lcalpha 0*13(...)`);
/// - value: 1 to 256 printable ASCII characters other than `,` and `=`, not ending in a space.
pub fn check_tracestate(v: &str) -> Result<(), String> {
    if v.len() > 512 {
        return Err(format!("tracestate is {} characters long; at most 512 are accepted", v.len()));
    }
    let members: Vec<&str> = v.split(',').map(|m| m.trim_matches([' ', '\t'])).filter(|m| !m.is_empty()).collect();
    if members.len() > 32 {
        return Err(format!("tracestate has {} members; at most 32 are allowed", members.len()));
    }
    for m in members {
        let Some((key, value)) = m.split_once('=') else {
            return Err(format!("tracestate member {m:?} is not key=value"));
        };
        if !tracestate_key(key) {
            return Err(format!(
                "tracestate member {m:?}: key {key:?} must be lowercase letters, digits, '_', '-', '*', '/' \
                 starting with a letter (or tenant@system), at most 256 characters"
            ));
        }
        if !tracestate_value(value) {
            return Err(format!(
                "tracestate member {m:?}: value must be 1 to 256 printable ASCII characters other than ',' and '=', \
                 not ending in a space"
            ));
        }
    }
    Ok(())
}

fn key_char(b: u8) -> bool {
    b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'_' | b'-' | b'*' | b'/')
}

fn tracestate_key(key: &str) -> bool {
    let b = key.as_bytes();
    match key.split_once('@') {
        None => !b.is_empty() && b.len() <= 256 && b[0].is_ascii_lowercase() && b.iter().all(|c| key_char(*c)),
        Some((tenant, system)) => {
            let (t, s) = (tenant.as_bytes(), system.as_bytes());
            !t.is_empty()
                && t.len() <= 241
                && (t[0].is_ascii_lowercase() || t[0].is_ascii_digit())
                && t.iter().all(|c| key_char(*c))
                && !s.is_empty()
                && s.len() <= 14
                && s[0].is_ascii_lowercase()
                && s.iter().all(|c| key_char(*c))
        }
    }
}

fn tracestate_value(value: &str) -> bool {
    let b = value.as_bytes();
    let chr = |c: &u8| (0x20..=0x7e).contains(c) && *c != b',' && *c != b'=';
    !b.is_empty() && b.len() <= 256 && b.iter().all(chr) && b[b.len() - 1] != b' '
}

/// A new trace, for a submission that came without one (sampled).
pub fn new_traceparent(trace_id: u128, parent_id: u64) -> String {
    // Zero ids are invalid: map them to one (a 2^-64 chance, kept deterministic).
    let trace_id = if trace_id == 0 { 1 } else { trace_id };
    let parent_id = if parent_id == 0 { 1 } else { parent_id };
    let mut value = String::with_capacity(55);
    value.push_str("00-");
    push_hex(&mut value, trace_id, 32);
    value.push('-');
    push_hex(&mut value, u128::from(parent_id), 16);
    value.push_str("-01");
    value
}

/// The low `digits` hex digits of `v`, lowercase and zero-padded (a traceparent is made
/// for every job submitted without one: no formatting machinery per job).
fn push_hex(out: &mut String, v: u128, digits: u32) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    for i in (0..digits).rev() {
        out.push(char::from(HEX[((v >> (i * 4)) & 0xf) as usize]));
    }
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
        assert_eq!(check_tracestate("fw@acme=v1, 0t@sys=x y"), Ok(()), "multi-tenant keys, inner spaces");
        for bad in ["k=v\u{1}", "k=v\r\nx-evil: 1", "Key=v", "1k=v", "k=", "k=a=b", "k=caf\u{e9}", "t@=v", "@s=v"] {
            assert!(check_tracestate(bad).is_err(), "{bad:?} accepted");
        }
    }

    proptest! {
        #[test]
        fn new_traces_are_valid(trace in any::<u128>(), parent in any::<u64>()) {
            prop_assert_eq!(check_traceparent(&new_traceparent(trace, parent)), Ok(()));
        }

        #[test]
        fn new_traces_carry_their_ids_in_hex(trace in 1..=u128::MAX, parent in 1..=u64::MAX) {
            prop_assert_eq!(new_traceparent(trace, parent), format!("00-{trace:032x}-{parent:016x}-01"));
        }
    }
}
