//! A setting a pure rule refuses: which field, what is wrong with it, and the fix. The
//! `validate` of every settings section in `core` returns it; `config` puts the section's
//! place in the file in front of the field (`config::ConfigError::Invalid`).

/// An invalid setting: `field` relative to its section (e.g. `window`), `problem` what
/// is wrong and how to fix it (e.g. "must be at least 1s, e.g. \"30s\"").
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{field}` {problem}")]
pub struct Invalid {
    pub field: String,
    pub problem: String,
}

impl Invalid {
    pub fn new(field: impl Into<String>, problem: impl Into<String>) -> Invalid {
        Invalid { field: field.into(), problem: problem.into() }
    }

    /// `Err` of [`Invalid::new`], for a validator's early returns.
    pub fn err<T>(field: impl Into<String>, problem: impl Into<String>) -> Result<T, Invalid> {
        Err(Invalid::new(field, problem))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_invalid_setting_names_its_field_and_fix() {
        let e = Invalid::new("window", "must be at least 1s, e.g. \"30s\"");
        assert_eq!(e.to_string(), "`window` must be at least 1s, e.g. \"30s\"");
        assert_eq!(Invalid::err::<()>("max", "must be at least 1"), Err(Invalid::new("max", "must be at least 1")));
    }
}
