//! A `process` attempt's sandbox, the pure parts: the name of its private directory
//! (from a hash of the job id, so no job id, whatever bytes it holds, names a path
//! outside the sandbox root), the uid an attempt runs as, and whether a worker may
//! start with the confinements this host offers.

use sha2::{Digest, Sha256};

/// The directory name of one attempt of a job: 32 hex digits of SHA-256 of the job id,
/// then the attempt.
pub fn dir_name(job_id: &str, attempt: u32) -> String {
    let digest = Sha256::digest(job_id.as_bytes());
    let hex: String = digest.iter().take(16).map(|b| format!("{b:02x}")).collect();
    format!("{hex}-{attempt}")
}

/// One confinement a worker may apply to its children.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Confinement {
    /// cgroup memory, pids and CPU accounting over the attempt's whole process tree.
    Cgroup,
    /// A uid of its own per running attempt (the worker must be root).
    Uid,
    /// A network namespace of its own (no network) unless the job type needs one.
    Network,
}

impl Confinement {
    pub const ALL: [Confinement; 3] = [Confinement::Cgroup, Confinement::Uid, Confinement::Network];

    pub fn name(self) -> &'static str {
        match self {
            Confinement::Cgroup => "cgroup",
            Confinement::Uid => "uid",
            Confinement::Network => "network",
        }
    }
}

/// The confinements an operator requires (`[sandbox] require`) that this host lacks,
/// with why: a worker refuses to start rather than run children less confined than asked.
pub fn missing<'a>(
    required: &[Confinement],
    unavailable: &'a [(Confinement, String)],
) -> Vec<&'a (Confinement, String)> {
    unavailable.iter().filter(|(c, _)| required.contains(c)).collect()
}

/// The uid of the `n`th concurrent attempt: `base + n`, or None past `count`.
pub fn uid_for(base: u32, count: u32, n: u32) -> Option<u32> {
    (n < count).then(|| base + n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dir_names_are_hex_whatever_the_job_id() {
        let a = dir_name("../../etc/passwd", 2);
        assert!(a.ends_with("-2") && a.len() == 34, "{a}");
        assert!(a[..32].chars().all(|c| c.is_ascii_hexdigit()), "{a}");
        assert_ne!(dir_name("a", 0), dir_name("b", 0));
        assert_eq!(dir_name("a", 0), dir_name("a", 0));
    }

    #[test]
    fn only_required_confinements_that_are_missing_refuse_a_start() {
        let unavailable = vec![(Confinement::Network, "no netns".to_string())];
        assert!(missing(&[Confinement::Cgroup, Confinement::Uid], &unavailable).is_empty());
        assert_eq!(missing(&Confinement::ALL, &unavailable)[0].0, Confinement::Network);
        assert_eq!(uid_for(200_000, 4, 3), Some(200_003));
        assert_eq!(uid_for(200_000, 4, 4), None);
    }
}
