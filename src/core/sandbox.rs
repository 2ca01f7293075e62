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
    /// An IPC namespace of its own: SysV shared memory, semaphores and message queues
    /// a child makes end with its attempt.
    Ipc,
}

impl Confinement {
    pub const ALL: [Confinement; 4] = [Confinement::Cgroup, Confinement::Uid, Confinement::Network, Confinement::Ipc];

    pub fn name(self) -> &'static str {
        match self {
            Confinement::Cgroup => "cgroup",
            Confinement::Uid => "uid",
            Confinement::Network => "network",
            Confinement::Ipc => "ipc",
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

/// What an enforcement name (`Enforcement::name`: `cgroup-v1+uid+netns`, `rlimit`, ...)
/// enforces, and why not more: the legend `fairway stats` prints under its pools.
pub fn explain(name: &str) -> String {
    let parts: Vec<&str> = name.split('+').collect();
    let mut said = Vec::new();
    for p in &parts {
        said.push(match *p {
            "cgroup-v1" => "cgroup-v1: memory and processes limits over the whole tree, peak memory and CPU read from it, the tree killed at each attempt's end".to_string(),
            "cgroup-v2" => "cgroup-v2: the same over a delegated v2 subtree (this path is untested on the project's machine kind, whose v2 hierarchy offers only hugetlb)".to_string(),
            "rlimit" => "rlimit: no cgroup (RLIMIT_CPU, RLIMIT_NOFILE, RLIMIT_AS, a watchdog on the leader's memory; strays that leave the process group survive)".to_string(),
            "uid" => "uid: a uid of its own per attempt (no reading or signalling another child or the worker)".to_string(),
            "netns" => "netns: no network unless the job type sets network = true".to_string(),
            "ipcns" => "ipcns: an IPC namespace per attempt (SysV shared memory, semaphores and message queues end with it)".to_string(),
            "mountns" => "mountns: a mount namespace per attempt (/proc lists only its own uid's processes; /tmp, /dev/shm and /var/tmp private tmpfs mounts, sized, gone with it)".to_string(),
            "pidns" => "pidns: a pid namespace per one-shot attempt (the program is pid 2 under a reaping init; no process outside it can be seen or signalled, even by number)".to_string(),
            other => format!("{other}: unknown to this fairway version"),
        });
    }
    for (part, why) in [
        ("uid", "no uid per attempt (the worker is not root)"),
        ("netns", "no network namespace (needs root or CAP_SYS_ADMIN): children keep the worker's network"),
        ("ipcns", "no IPC namespace (needs root or CAP_SYS_ADMIN): SysV objects a child makes outlive it on the host"),
        ("mountns", "no mount namespace (needs root and a uid per attempt): children see the host's /proc and write its /tmp, /dev/shm and /var/tmp"),
        ("pidns", "no pid namespace (needs root, a cgroup and a mount namespace per attempt; pooled children never get one): a child's pids are the host's"),
    ] {
        if !parts.contains(&part) {
            said.push(why.to_string());
        }
    }
    said.push(
        "never: seccomp, CPU bandwidth, I/O limits; other files by their permissions (docs/process-jobs.md)"
            .to_string(),
    );
    said.join("; ")
}

/// The uid of the `n`th concurrent attempt: `base + n`, or None past `count`.
pub fn uid_for(base: u32, count: u32, n: u32) -> Option<u32> {
    (n < count).then(|| base + n)
}

/// The uids a process holds, from its `/proc/<pid>/status` text: the four of its `Uid:`
/// line (real, effective, saved, file system). Any of them keeps a uid in use: a process
/// that dropped to another effective uid still belongs to the one it can return to.
pub fn status_uids(status: &str) -> Vec<u32> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .map(|rest| rest.split_whitespace().filter_map(|u| u.parse().ok()).collect())
        .unwrap_or_default()
}

/// Which of the `in_use` slots (uid `base + n`) to hand out next: the first that is not
/// leased and whose uid owns no live process (`alive`: a stray of an ended attempt, e.g.
/// one that left its process group, must not share a uid with the next attempt, often
/// another tenant's). None if every free slot's uid is still alive or none is free.
pub fn pick_uid(in_use: &[bool], base: u32, alive: &std::collections::HashSet<u32>) -> Option<usize> {
    in_use.iter().enumerate().position(|(n, used)| {
        !used && u32::try_from(n).ok().and_then(|n| base.checked_add(n)).is_some_and(|uid| !alive.contains(&uid))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_gives_every_uid_a_process_holds() {
        let status =
            "Name:\tsleep\nUmask:\t0022\nState:\tS (sleeping)\nUid:\t2100000003\t0\t2100000003\t0\nGid:\t1\t1\t1\t1\n";
        assert_eq!(status_uids(status), vec![2_100_000_003, 0, 2_100_000_003, 0]);
        assert!(status_uids("Name:\tx\n").is_empty());
    }

    #[test]
    fn a_uid_with_a_live_process_is_never_handed_out() {
        let alive: std::collections::HashSet<u32> = [101, 103].into_iter().collect();
        assert_eq!(pick_uid(&[true, false, false, false], 100, &alive), Some(2), "101 is alive, 100 leased");
        assert_eq!(pick_uid(&[true, false, true, false], 100, &alive), None, "every free uid still has a process");
        assert_eq!(pick_uid(&[false, false], u32::MAX, &Default::default()), Some(0));
        assert_eq!(pick_uid(&[true, false], u32::MAX, &Default::default()), None, "past u32::MAX is no uid");
    }

    #[test]
    fn dir_names_are_hex_whatever_the_job_id() {
        let a = dir_name("../../etc/passwd", 2);
        assert!(a.ends_with("-2") && a.len() == 34, "{a}");
        assert!(a[..32].chars().all(|c| c.is_ascii_hexdigit()), "{a}");
        assert_ne!(dir_name("a", 0), dir_name("b", 0));
        assert_eq!(dir_name("a", 0), dir_name("a", 0));
    }

    #[test]
    fn each_enforcement_name_is_explained_with_what_is_missing() {
        let full = explain("cgroup-v1+uid+netns+ipcns+mountns+pidns");
        assert!(full.contains("IPC namespace per attempt") && !full.contains("no IPC namespace"), "{full}");
        assert!(explain("cgroup-v1+uid+netns").contains("SysV objects a child makes outlive it"));
        assert!(
            full.contains("whole tree") && full.contains("uid of its own") && full.contains("no network"),
            "{full}"
        );
        assert!(full.contains("/proc lists only its own uid's"), "{full}");
        assert!(!full.contains("no uid per attempt") && full.contains("never: seccomp"), "{full}");
        assert!(full.contains("a pid namespace per one-shot attempt") && !full.contains("no pid namespace"), "{full}");
        assert!(explain("cgroup-v1+uid+netns").contains("no mount namespace"));
        assert!(explain("cgroup-v1+uid+netns+mountns").contains("no pid namespace"));
        let bare = explain("rlimit");
        assert!(
            bare.contains("no cgroup")
                && bare.contains("no uid per attempt")
                && bare.contains("keep the worker's network"),
            "{bare}"
        );
        assert!(explain("cgroup-v2+uid").contains("untested"), "the v2 path is said to be untested");
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
