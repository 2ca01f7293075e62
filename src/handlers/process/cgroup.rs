//! A cgroup per attempt: the whole process tree of a `process` job under one memory,
//! pids and CPU-accounting limit, read for its peak memory and CPU time, and killed
//! whole at the end of every attempt (a `setsid` grandchild included).
//!
//! cgroup v2 is used where this worker's own cgroup offers the `memory` and `pids`
//! controllers and lets it enable them for children (a delegated subtree); otherwise the
//! v1 `memory`, `pids` and `cpuacct` hierarchies where they are mounted writable. CPU
//! bandwidth (`limits.cpus`) is enforced where the `cpu` controller is there too (v2:
//! offered to the worker's cgroup; v1: its hierarchy mounted, alone or with `cpuacct`). The
//! attempt's cgroups are created under the worker's own (so its limits still cover
//! them), named `fairway-<worker pid>-<n>`, and removed after the attempt. The child
//! joins them itself between fork and exec (`in_child`), before it can fork.

use crate::core::limits::CPU_PERIOD_US;
use std::ffi::CString;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Where the cgroup file systems are mounted.
const MOUNTS: &str = "/sys/fs/cgroup";
/// Most passes of the end-of-attempt kill (each: signal every member, wait a little).
const KILL_PASSES: u32 = 200;
const KILL_PAUSE: Duration = Duration::from_millis(5);

/// Which cgroup interface the attempts use, and the worker's own cgroup directories.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hierarchy {
    /// One directory (the worker's v2 cgroup) with memory + pids (+ cpu) enabled below.
    V2 { parent: PathBuf, cpu: bool },
    /// The worker's cgroup in each v1 hierarchy (`cpu`: that of the `cpu` controller, if
    /// mounted; the same as `cpuacct` where the two are mounted together).
    V1 { memory: PathBuf, pids: PathBuf, cpuacct: PathBuf, cpu: Option<PathBuf> },
}

/// Limits written into an attempt's cgroup.
#[derive(Debug, Clone, Copy, Default)]
pub struct TreeLimits {
    pub memory: Option<u64>,
    pub processes: Option<u64>,
    /// CPU quota in µs per `core::limits::CPU_PERIOD_US`.
    pub cpu_quota_us: Option<u64>,
}

/// What the cgroup measured over the attempt.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub peak_bytes: u64,
    pub cpu_ms: i64,
    pub counts: crate::core::limits::TreeCounts,
}

impl Hierarchy {
    /// The hierarchy this worker can create attempt cgroups in, or why none.
    pub fn detect() -> Result<Hierarchy, String> {
        let own = std::fs::read_to_string("/proc/self/cgroup").map_err(|e| format!("/proc/self/cgroup: {e}"))?;
        let v2 = v2_parent(&own).and_then(|(parent, cpu)| probe(&Hierarchy::V2 { parent, cpu }));
        let v1 = || v1_dirs(&own).and_then(|h| probe(&h));
        match v2 {
            Ok(h) => Ok(h),
            Err(why2) => v1().map_err(|why1| format!("cgroup v2: {why2}; cgroup v1: {why1}")),
        }
    }

    pub fn version(&self) -> &'static str {
        match self {
            Hierarchy::V2 { .. } => "v2",
            Hierarchy::V1 { .. } => "v1",
        }
    }

    /// A new, empty cgroup for one attempt with `limits` written.
    pub fn create(&self, limits: TreeLimits) -> std::io::Result<Tree> {
        static SEQ: AtomicU64 = AtomicU64::new(0);
        let name = format!("fairway-{}-{}", std::process::id(), SEQ.fetch_add(1, Ordering::Relaxed));
        let tree = match self {
            Hierarchy::V2 { parent, .. } => Tree { v2: true, dirs: vec![parent.join(&name)] },
            Hierarchy::V1 { memory, pids, cpuacct, cpu } => {
                let mut dirs = vec![memory.join(&name), pids.join(&name), cpuacct.join(&name)];
                dirs.extend(cpu.as_ref().filter(|c| *c != cpuacct).map(|c| c.join(&name)));
                Tree { v2: false, dirs }
            }
        };
        let limits = TreeLimits { cpu_quota_us: limits.cpu_quota_us.filter(|_| self.cpu()), ..limits };
        for d in &tree.dirs {
            std::fs::create_dir(d)?;
        }
        if let Err(e) = tree.write_limits(limits) {
            tree.remove();
            return Err(e);
        }
        Ok(tree)
    }

    /// Whether attempts' CPU bandwidth can be bounded here.
    pub fn cpu(&self) -> bool {
        match self {
            Hierarchy::V2 { cpu, .. } => *cpu,
            Hierarchy::V1 { cpu, .. } => cpu.is_some(),
        }
    }
}

/// The v2 cgroup of this process (the `0::` line) if its mount offers memory and pids,
/// and whether it offers cpu.
fn v2_parent(own: &str) -> Result<(PathBuf, bool), String> {
    let rel = own.lines().find_map(|l| l.strip_prefix("0::")).ok_or("this process is in no v2 cgroup")?;
    let mount = [PathBuf::from(MOUNTS), Path::new(MOUNTS).join("unified")]
        .into_iter()
        .find(|m| m.join("cgroup.controllers").exists())
        .ok_or("no cgroup2 mount")?;
    let dir = mount.join(rel.trim_start_matches('/'));
    let offered = std::fs::read_to_string(dir.join("cgroup.controllers")).unwrap_or_default();
    let has = |c: &str| offered.split_whitespace().any(|x| x == c);
    if !(has("memory") && has("pids")) {
        return Err(format!("{} offers {:?}, not memory and pids (not delegated)", dir.display(), offered.trim()));
    }
    let enable = if has("cpu") { "+memory +pids +cpu" } else { "+memory +pids" };
    std::fs::write(dir.join("cgroup.subtree_control"), enable)
        .map_err(|e| format!("cannot enable memory and pids below {}: {e}", dir.display()))?;
    Ok((dir, has("cpu")))
}

/// This process's cgroups in the v1 memory, pids and cpuacct hierarchies.
fn v1_dirs(own: &str) -> Result<Hierarchy, String> {
    let dir = |controller: &str| -> Result<PathBuf, String> {
        let (mount, rel) = own
            .lines()
            .filter_map(|l| l.split_once(':').and_then(|(_, rest)| rest.split_once(':')))
            .find(|(list, _)| list.split(',').any(|c| c == controller))
            .ok_or_else(|| format!("no v1 {controller} hierarchy"))?;
        let d = Path::new(MOUNTS).join(mount).join(rel.trim_start_matches('/'));
        if d.join("cgroup.procs").exists() {
            Ok(d)
        } else {
            Err(format!("{} is not mounted here", d.display()))
        }
    };
    Ok(Hierarchy::V1 { memory: dir("memory")?, pids: dir("pids")?, cpuacct: dir("cpuacct")?, cpu: dir("cpu").ok() })
}

/// Creates and removes a cgroup with limits: proof that attempts can have one.
fn probe(h: &Hierarchy) -> Result<Hierarchy, String> {
    let tree = h
        .create(TreeLimits { memory: Some(64 << 20), processes: Some(8), cpu_quota_us: None })
        .map_err(|e| format!("cannot create a cgroup with limits: {e} (read-only or not delegated to this worker)"))?;
    tree.remove();
    // CPU bandwidth where a cgroup with a quota can be made too; else without it.
    let quota = TreeLimits { cpu_quota_us: Some(CPU_PERIOD_US), ..TreeLimits::default() };
    match h.create(quota) {
        Ok(tree) => {
            tree.remove();
            Ok(h.clone())
        }
        Err(_) => Ok(match h.clone() {
            Hierarchy::V2 { parent, .. } => Hierarchy::V2 { parent, cpu: false },
            Hierarchy::V1 { memory, pids, cpuacct, .. } => Hierarchy::V1 { memory, pids, cpuacct, cpu: None },
        }),
    }
}

/// One attempt's cgroup (a directory per v1 hierarchy, or one v2 directory).
#[derive(Debug)]
pub struct Tree {
    v2: bool,
    dirs: Vec<PathBuf>,
}

impl Tree {
    fn write_limits(&self, limits: TreeLimits) -> std::io::Result<()> {
        let put = |dir: &Path, file: &str, v: String| std::fs::write(dir.join(file), v);
        match (self.v2, self.dirs.as_slice()) {
            (true, [d]) => {
                if let Some(m) = limits.memory {
                    put(d, "memory.max", m.to_string())?;
                    let _ = put(d, "memory.swap.max", "0".into());
                }
                if let Some(n) = limits.processes {
                    put(d, "pids.max", n.to_string())?;
                }
                if let Some(q) = limits.cpu_quota_us {
                    put(d, "cpu.max", format!("{q} {CPU_PERIOD_US}"))?;
                }
            }
            (false, [mem, pids, cpuacct, rest @ ..]) => {
                if let Some(m) = limits.memory {
                    put(mem, "memory.limit_in_bytes", m.to_string())?;
                    // No swap beyond the limit, where swap accounting exists.
                    let _ = put(mem, "memory.memsw.limit_in_bytes", m.to_string());
                }
                if let Some(n) = limits.processes {
                    put(pids, "pids.max", n.to_string())?;
                }
                if let Some(q) = limits.cpu_quota_us {
                    // The cpu hierarchy's own directory, or cpuacct's where mounted together.
                    let cpu = rest.first().unwrap_or(cpuacct);
                    put(cpu, "cpu.cfs_period_us", CPU_PERIOD_US.to_string())?;
                    put(cpu, "cpu.cfs_quota_us", q.to_string())?;
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// The `cgroup.procs` files the child writes itself into (prepared before fork).
    pub fn join_files(&self) -> Vec<CString> {
        self.dirs
            .iter()
            .filter_map(|d| CString::new(d.join("cgroup.procs").into_os_string().into_encoded_bytes()).ok())
            .collect()
    }

    /// Peak memory, CPU time and the limit counters so far.
    pub fn usage(&self) -> Usage {
        let read = |dir: &Path, file: &str| std::fs::read_to_string(dir.join(file)).unwrap_or_default();
        let num = |s: String| s.trim().parse::<u64>().unwrap_or(0);
        let key = |s: &str, k: &str| {
            s.lines().find_map(|l| l.strip_prefix(k)).and_then(|v| v.trim().parse::<u64>().ok()).unwrap_or(0)
        };
        match (self.v2, self.dirs.as_slice()) {
            (true, [d]) => Usage {
                peak_bytes: num(read(d, "memory.peak")),
                cpu_ms: (key(&read(d, "cpu.stat"), "usage_usec ") / 1000) as i64,
                counts: crate::core::limits::TreeCounts {
                    oom_kills: key(&read(d, "memory.events"), "oom_kill "),
                    forks_refused: key(&read(d, "pids.events"), "max "),
                },
            },
            (false, [mem, pids, cpu, ..]) => Usage {
                peak_bytes: num(read(mem, "memory.max_usage_in_bytes")),
                cpu_ms: (num(read(cpu, "cpuacct.usage")) / 1_000_000) as i64,
                counts: crate::core::limits::TreeCounts {
                    oom_kills: key(&read(mem, "memory.oom_control"), "oom_kill "),
                    forks_refused: key(&read(pids, "pids.events"), "max "),
                },
            },
            _ => Usage::default(),
        }
    }

    /// SIGKILLs every process in the tree until none is left; the pids it killed.
    pub async fn kill_all(&self) -> Vec<u32> {
        let mut killed = Vec::new();
        if self.v2 {
            let _ = std::fs::write(self.dirs[0].join("cgroup.kill"), "1");
        }
        for _ in 0..KILL_PASSES {
            let members = self.members();
            if members.is_empty() {
                break;
            }
            for pid in members {
                // SAFETY: kill(2) on a pid read from the attempt's own cgroup.
                unsafe { libc::kill(pid as i32, libc::SIGKILL) };
                if !killed.contains(&pid) {
                    killed.push(pid);
                }
            }
            tokio::time::sleep(KILL_PAUSE).await;
        }
        killed
    }

    /// SIGKILLs every process in the tree but `keep` (a pooled child's leader between
    /// jobs: what a job left running does not outlive it); how many.
    pub fn kill_others(&self, keep: u32) -> usize {
        let others: Vec<u32> = self.members().into_iter().filter(|p| *p != keep).collect();
        for pid in &others {
            // SAFETY: kill(2) on a pid read from the tree's own cgroup.
            unsafe { libc::kill(*pid as i32, libc::SIGKILL) };
        }
        others.len()
    }

    /// Starts the peak memory afresh (a pooled child's next job); v1 only: v2's
    /// `memory.peak` keeps the cgroup's whole life.
    pub fn reset_peak(&self) {
        if let (false, [mem, _, _]) = (self.v2, self.dirs.as_slice()) {
            let _ = std::fs::write(mem.join("memory.max_usage_in_bytes"), "0");
        }
    }

    /// Processes in the tree now (the pids hierarchy counts every one of them).
    fn members(&self) -> Vec<u32> {
        let dir = if self.v2 { &self.dirs[0] } else { &self.dirs[1] };
        std::fs::read_to_string(dir.join("cgroup.procs"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect()
    }

    /// Removes the (empty) cgroup directories.
    pub fn remove(&self) {
        for d in &self.dirs {
            if let Err(e) = std::fs::remove_dir(d) {
                if e.kind() != std::io::ErrorKind::NotFound {
                    tracing::warn!(cgroup = %d.display(), error = %e, "could not remove an attempt's cgroup");
                }
            }
        }
    }
}

/// In the child between fork and exec: moves it into its attempt's cgroup (writing "0"
/// to `cgroup.procs` means "this process"). Only open/write/close.
pub fn in_child(join: &[CString]) -> std::io::Result<()> {
    for path in join {
        // SAFETY: async-signal-safe syscalls on a path prepared before fork.
        unsafe {
            let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
            if fd < 0 {
                return Err(std::io::Error::last_os_error());
            }
            let rc = libc::write(fd, b"0".as_ptr().cast(), 1);
            libc::close(fd);
            if rc != 1 {
                return Err(std::io::Error::last_os_error());
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v1_lines_name_each_hierarchys_directory() {
        let own = "9:name=systemd:/\n8:pids:/\n4:memory:/a/b\n2:cpu,cpuacct:/\n0::/\n";
        match v1_dirs(own) {
            Ok(Hierarchy::V1 { memory, .. }) => assert_eq!(memory, Path::new("/sys/fs/cgroup/memory/a/b")),
            Ok(h) => panic!("{h:?}"),
            // A host without these mounts says which is missing.
            Err(why) => assert!(why.contains("not mounted") || why.contains("no v1"), "{why}"),
        }
    }
}
