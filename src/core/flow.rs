//! Flow-control keys (`flow_key` on a job): the rules for the value a job may carry.
//! Jobs with the same key share the key's fleet-wide limits.

/// Longest flow key accepted, in bytes: it is a row key in the store and a label in
/// logs, not a payload.
pub const MAX_KEY_LEN: usize = 128;

/// A flow key is 1 to [`MAX_KEY_LEN`] bytes of text without control characters.
pub fn check_key(key: &str) -> Result<(), String> {
    if key.is_empty() {
        return Err("flow_key is empty; leave it out (null) for no flow control, or name the flow".into());
    }
    if key.len() > MAX_KEY_LEN {
        return Err(format!("flow_key is {} bytes long; at most {MAX_KEY_LEN} are accepted", key.len()));
    }
    if let Some(c) = key.chars().find(|c| c.is_control()) {
        return Err(format!("flow_key contains the control character {c:?}; use printable text"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_rules() {
        assert_eq!(check_key("vectorizer"), Ok(()));
        assert_eq!(check_key("user:ümlaut-42"), Ok(()));
        assert_eq!(check_key(&"k".repeat(MAX_KEY_LEN)), Ok(()));
        assert!(check_key("").unwrap_err().contains("empty"));
        assert!(check_key(&"k".repeat(MAX_KEY_LEN + 1)).unwrap_err().contains("129 bytes"));
        assert!(check_key("a\nb").unwrap_err().contains("control"));
    }
}
