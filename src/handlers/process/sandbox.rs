//! The OS side of a `process` job's sandbox: what this machine allows (detected once,
//! stated at start-up and by `fairway stats`), the confinement applied in the child
//! between fork and exec (cgroup join, rlimits, its own uid, no new privileges, no
//! network), the control pipe on fd 3, and /proc readings of a child where no cgroup
//! measures it.
//!
//! The mechanism is plain syscalls through `libc` in the `pre_exec` hook, not a wrapper
//! program (bubblewrap, nsjail): no package to install on the worker's image, no exec of
//! a helper per job, and the worker (root in its container) already holds what they would
//! need. What it does not do (a pid or mount namespace per attempt) is stated, never
//! silently skipped; `[sandbox] require` refuses to start without a confinement.

use super::cgroup::{self, Hierarchy};
use crate::core::sandbox::Confinement;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::Mutex;
use std::time::Duration;

/// How often the watchdog samples a running child (memory, CPU, stop requests).
pub const WATCH_INTERVAL: Duration = Duration::from_millis(50);

/// The file descriptor the child writes its control lines to.
pub const CONTROL_FD: i32 = 3;

/// The uids attempts run as: `UID_BASE + n` for the `n`th attempt running at once (no
/// user of the image or the host has them; no passwd entry is needed).
pub const UID_BASE: u32 = 2_100_000_000;
pub const UID_COUNT: u32 = 4096;

/// What this worker's children get, as detected on this machine.
#[derive(Debug)]
pub struct Enforcement {
    /// Attempt cgroups, or why not (then rlimits and the watchdog stand in).
    pub tree: Result<Hierarchy, String>,
    /// A uid of its own per attempt, or why not.
    pub uids: Result<(), String>,
    /// The network namespace without network the attempts enter, or why none.
    pub netns: Result<OwnedFd, String>,
    /// A mount namespace per attempt (its own /proc showing only its uid's processes, a
    /// private /tmp), or why not.
    pub mountns: Result<(), String>,
    /// A pid namespace per attempt (`enter_pid_namespace`), or why not.
    pub pidns: Result<(), String>,
    /// An IPC namespace per attempt (its SysV shared memory, semaphores and message
    /// queues, and POSIX message queues, die with it), or why not.
    pub ipcns: Result<(), String>,
    in_use: Mutex<Vec<bool>>,
}

impl Enforcement {
    /// Looks at this machine once (start-up).
    pub fn detect() -> Enforcement {
        Enforcement {
            tree: Hierarchy::detect(),
            uids: detect_uids(),
            netns: detect_netns(),
            mountns: detect_mountns(),
            pidns: detect_pidns(),
            ipcns: detect_ipcns(),
            in_use: Mutex::new(vec![false; UID_COUNT as usize]),
        }
    }

    /// This machine's mode, detected once.
    pub fn current() -> &'static Enforcement {
        static CURRENT: std::sync::OnceLock<Enforcement> = std::sync::OnceLock::new();
        CURRENT.get_or_init(Enforcement::detect)
    }

    /// The confinements this machine lacks, with why.
    pub fn unavailable(&self) -> Vec<(Confinement, String)> {
        let mut out = Vec::new();
        for (c, r) in [
            (Confinement::Cgroup, &self.tree.as_ref().map(|_| ())),
            (Confinement::Uid, &self.uids.as_ref().map(|_| ())),
            (Confinement::Network, &self.netns.as_ref().map(|_| ())),
            (Confinement::Ipc, &self.ipcns.as_ref().map(|_| ())),
        ] {
            if let Err(why) = r {
                out.push((c, why.to_string()));
            }
        }
        out
    }

    /// A short name for `fairway stats`: `cgroup-v1+uid+netns`, `rlimit`, ...
    pub fn name(&self) -> String {
        let mut parts = vec![match &self.tree {
            Ok(h) => format!("cgroup-{}", h.version()),
            Err(_) => "rlimit".to_string(),
        }];
        if self.uids.is_ok() {
            parts.push("uid".into());
        }
        if self.netns.is_ok() {
            parts.push("netns".into());
        }
        if self.ipcns.is_ok() {
            parts.push("ipcns".into());
        }
        if self.mountns.is_ok() && self.uids.is_ok() {
            parts.push("mountns".into());
        }
        if self.pid_namespaces() {
            parts.push("pidns".into());
        }
        parts.join("+")
    }

    /// What is enforced and why not more (the start-up log line).
    pub fn describe(&self) -> String {
        let limits = match &self.tree {
            Ok(h) => format!(
                "cgroup {} per attempt (memory and processes limits over the whole tree, peak memory and CPU read from it, the tree killed at the end of every attempt; CPU bandwidth (limits.cpus) {})",
                h.version(),
                if h.cpu() { "throttled by its cpu controller" } else { "not bounded: no cpu controller for the worker's cgroup" }
            ),
            Err(why) => format!(
                "rlimits (RLIMIT_CPU, RLIMIT_NOFILE, RLIMIT_AS = {}x memory, RLIMIT_NPROC only with a uid per attempt) + a watchdog sampling the leader's memory every {WATCH_INTERVAL:?}; no cgroup: {why}",
                crate::core::limits::AS_FACTOR
            ),
        };
        let said = |r: Result<(), &String>, yes: &str| match r {
            Ok(()) => yes.to_string(),
            Err(why) => format!("not available: {why}"),
        };
        let mounts = match (&self.mountns, &self.uids) {
            (Ok(()), Ok(())) => "a mount namespace per attempt (/proc mounted with hidepid=2: only its own uid's processes; /tmp, /dev/shm and /var/tmp private tmpfs mounts of the memory limit's size, charged to its cgroup, gone with the attempt)".to_string(),
            (Err(why), _) => format!("no mount namespace: {why}; children write the host's /tmp, /dev/shm and /var/tmp"),
            (_, Err(_)) => "no mount namespace (a private /proc hides only other uids' processes: needs a uid per attempt); children write the host's /tmp, /dev/shm and /var/tmp".to_string(),
        };
        let pids = match (&self.pidns, &self.tree, &self.mountns) {
            (Ok(()), Ok(_), Ok(())) => "a pid namespace per one-shot attempt (the program is pid 2 under a minimal init that reaps its orphans; it cannot see or signal a process outside, even by number; pooled children keep the host's pids)".to_string(),
            (Err(why), _, _) => format!("no pid namespace: {why}"),
            _ => "no pid namespace (it needs the cgroup, which measures the tree, and the mount namespace, which mounts the namespace's /proc)".to_string(),
        };
        let ipc = match &self.ipcns {
            Ok(()) => "an IPC namespace per attempt (SysV shared memory, semaphores and message queues end with it)"
                .to_string(),
            Err(why) => format!("no IPC namespace: {why}; SysV objects a child makes outlive it on the host"),
        };
        format!(
            "{limits}; uid per attempt: {}; network namespace: {}; {ipc}; {mounts}; {pids}; PR_SET_NO_NEW_PRIVS; worker non-dumpable",
            said(self.uids.as_ref().map(|_| ()), &format!("{UID_BASE}+n")),
            said(self.netns.as_ref().map(|_| ()), "one without network (a loopback, down) shared by the attempts, unless the job type sets network = true"),
        )
    }

    /// Whether one-shot attempts get a pid namespace: it needs the attempt cgroup (the
    /// leader the worker sees is then an outer waiter, not the program, so only the tree's
    /// counters measure the program) and a mount namespace (for the namespace's /proc).
    pub fn pid_namespaces(&self) -> bool {
        self.pidns.is_ok() && self.tree.is_ok() && self.mountns.is_ok()
    }

    /// A uid for one attempt, released when the returned guard drops. Never one that still
    /// owns a process: without a cgroup (whose kill at the end of every attempt takes the
    /// whole tree), a stray of an ended attempt (it left its process group) can outlive it.
    /// Then each take makes one pass over `/proc`: such strays are killed, and their uid
    /// waits for a later take, once they are gone.
    pub fn take_uid(&'static self) -> Option<UidLease> {
        self.uids.as_ref().ok()?;
        let mut used = self.in_use.lock().unwrap_or_else(|e| e.into_inner());
        let alive = if self.tree.is_ok() { Default::default() } else { kill_strays(&used) };
        let n = crate::core::sandbox::pick_uid(&used, UID_BASE, &alive)?;
        used[n] = true;
        Some(UidLease { uid: crate::core::sandbox::uid_for(UID_BASE, UID_COUNT, n as u32)?, owner: self })
    }
}

/// The attempts' uids that own a live process (one pass over `/proc`); each process of
/// a uid no attempt holds now (`in_use`) is sent SIGKILL.
fn kill_strays(in_use: &[bool]) -> std::collections::HashSet<u32> {
    let mut alive = std::collections::HashSet::new();
    let Ok(entries) = std::fs::read_dir("/proc") else { return alive };
    for entry in entries.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|p| p.parse::<i32>().ok()) else { continue };
        let Ok(status) = std::fs::read_to_string(entry.path().join("status")) else { continue };
        let ours = crate::core::sandbox::status_uids(&status)
            .into_iter()
            .filter(|u| (UID_BASE..UID_BASE + UID_COUNT).contains(u))
            .collect::<Vec<_>>();
        if ours.is_empty() {
            continue;
        }
        if ours.iter().all(|u| !in_use[(u - UID_BASE) as usize]) {
            // SAFETY: kill has no memory effects; a pid gone meanwhile only fails.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        alive.extend(ours);
    }
    alive
}

/// A uid held by one attempt (free again once its processes are gone).
#[derive(Debug)]
pub struct UidLease {
    pub uid: u32,
    owner: &'static Enforcement,
}

impl Drop for UidLease {
    fn drop(&mut self) {
        let mut used = self.owner.in_use.lock().unwrap_or_else(|e| e.into_inner());
        used[(self.uid - UID_BASE) as usize] = false;
    }
}

fn detect_uids() -> Result<(), String> {
    // SAFETY: geteuid reads this process's credentials.
    if unsafe { libc::geteuid() } != 0 {
        return Err("the worker is not root, so it cannot give children other uids".into());
    }
    let map = std::fs::read_to_string("/proc/self/uid_map").unwrap_or_default();
    let covered = map.lines().any(|l| {
        let f: Vec<u64> = l.split_whitespace().filter_map(|x| x.parse().ok()).collect();
        f.len() == 3 && f[0] <= UID_BASE as u64 && (UID_BASE + UID_COUNT) as u64 <= f[0] + f[2]
    });
    if covered {
        Ok(())
    } else {
        Err(format!("uids {UID_BASE}..{} are not mapped in this user namespace ({})", UID_BASE + UID_COUNT, map.trim()))
    }
}

/// An empty network namespace (a loopback, down), made once and entered by every attempt:
/// creating and tearing down one per attempt costs the kernel ~5 ms under a global lock.
/// A short-lived holder process creates it; the descriptor keeps it alive.
fn detect_netns() -> Result<OwnedFd, String> {
    let mut holder = std::process::Command::new("/bin/sleep");
    holder.arg("10").stdin(std::process::Stdio::null()).stdout(std::process::Stdio::null());
    // SAFETY: unshare is async-signal-safe.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut holder, || {
            if libc::unshare(libc::CLONE_NEWNET) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = holder.spawn().map_err(|e| format!("unshare(CLONE_NEWNET) failed: {e}"))?;
    let ns = std::fs::File::open(format!("/proc/{}/ns/net", child.id()))
        .map_err(|e| format!("cannot open the namespace: {e}"));
    let _ = child.kill();
    let _ = child.wait();
    Ok(OwnedFd::from(ns?))
}

/// Whether a child can have a mount namespace of its own with a private /proc and /tmp:
/// tried once in a short-lived child (the same calls as `mount_private`).
fn detect_mountns() -> Result<(), String> {
    let dir = std::env::temp_dir().join(format!("fairway-mountns-probe-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| format!("cannot make a probe directory: {e}"))?;
    let mut probe = std::process::Command::new("/bin/true");
    probe.stdin(std::process::Stdio::null()).stdout(std::process::Stdio::null()).stderr(std::process::Stdio::null());
    let m = Mounts::new(&dir, None, Some(1 << 20)).map_err(|e| e.to_string())?;
    // SAFETY: `mount_private` makes only async-signal-safe syscalls.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut probe, move || mount_private(&m));
    }
    let status = probe.status();
    let _ = std::fs::remove_dir(&dir);
    match status {
        Ok(s) if s.success() => Ok(()),
        Ok(s) => Err(format!("the probe exited {s}")),
        Err(e) => Err(format!("unshare(CLONE_NEWNS) or a mount failed: {e}")),
    }
}

/// Whether a child can have an IPC namespace of its own: tried once in a short-lived child.
fn detect_ipcns() -> Result<(), String> {
    let mut probe = std::process::Command::new("/bin/true");
    probe.stdin(std::process::Stdio::null()).stdout(std::process::Stdio::null()).stderr(std::process::Stdio::null());
    // SAFETY: unshare is async-signal-safe.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut probe, || {
            if libc::unshare(libc::CLONE_NEWIPC) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    match probe.status() {
        Ok(s) if s.success() => Ok(()),
        Ok(s) => Err(format!("the probe exited {s}")),
        Err(e) => Err(format!("unshare(CLONE_NEWIPC) failed (needs root or CAP_SYS_ADMIN): {e}")),
    }
}

/// Whether a child can have a pid namespace of its own: tried once in a short-lived
/// child (the same calls as `enter_pid_namespace`).
fn detect_pidns() -> Result<(), String> {
    let mut probe = std::process::Command::new("/bin/true");
    probe.stdin(std::process::Stdio::null()).stdout(std::process::Stdio::null()).stderr(std::process::Stdio::null());
    // SAFETY: `enter_pid_namespace` makes only async-signal-safe syscalls.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut probe, enter_pid_namespace);
    }
    match probe.status() {
        Ok(s) if s.success() => Ok(()),
        Ok(s) => Err(format!("the probe exited {s}")),
        Err(e) => Err(format!("unshare(CLONE_NEWPID) or its fork failed: {e}")),
    }
}

/// Exit code of the namespace's helpers when a syscall of their own fails (EX_OSERR).
const EX_OSERR: i32 = 71;

/// In the child between fork and exec: a pid namespace of its own. Forks twice. This
/// process stays outside as the worker's child: it ignores SIGTERM (the program gets the
/// group's), waits, and ends as the program ended (the same code or signal). The first
/// fork is the namespace's init (pid 1): it reaps every orphan and, when the program
/// exits, passes its status out and exits, which kills whatever is left in the
/// namespace. The second fork is the program (pid 2): it returns here to be confined
/// and exec'd. The helpers close every descriptor (the pipes, and the spawner's error
/// pipe, which must see EOF at the program's exec). Only async-signal-safe syscalls.
pub fn enter_pid_namespace() -> std::io::Result<()> {
    let err = std::io::Error::last_os_error;
    // SAFETY: syscalls of this forked, single-threaded child; the shared page is written
    // by the init and read by the outer process after the init has exited.
    unsafe {
        // The program's wait status: the init, as pid 1, cannot end by a signal of its
        // own, so it passes the status out through this page instead of mirroring it.
        let page = libc::mmap(
            std::ptr::null_mut(),
            4096,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_ANONYMOUS,
            -1,
            0,
        );
        if page == libc::MAP_FAILED {
            return Err(err());
        }
        let status = page.cast::<i32>();
        status.write_volatile(-1);
        if libc::unshare(libc::CLONE_NEWPID) != 0 {
            return Err(err());
        }
        let init = libc::fork();
        if init < 0 {
            return Err(err());
        }
        if init > 0 {
            outside(init, status);
        }
        let program = libc::fork();
        if program < 0 {
            libc::_exit(EX_OSERR);
        }
        if program > 0 {
            namespace_init(program, status);
        }
    }
    Ok(())
}

/// The outer process: waits for the namespace's init, then ends as the program did.
unsafe fn outside(init: libc::pid_t, status: *mut i32) -> ! {
    for sig in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
        libc::signal(sig, libc::SIG_IGN);
    }
    close_all();
    let mut st = 0;
    loop {
        let r = libc::waitpid(init, &mut st, 0);
        if r == init {
            break;
        }
        if r < 0 && *libc::__errno_location() != libc::EINTR {
            libc::_exit(EX_OSERR);
        }
    }
    // The program's status; the init's own if it was killed first (SIGKILL from outside).
    let program = status.read_volatile();
    end_as(if program >= 0 { program } else { st })
}

/// The namespace's pid 1: reaps every process that ends in it until the program does.
unsafe fn namespace_init(program: libc::pid_t, status: *mut i32) -> ! {
    close_all();
    let mut st = 0;
    loop {
        let r = libc::wait(&mut st);
        if r == program {
            status.write_volatile(st);
            libc::_exit(0);
        }
        if r < 0 && *libc::__errno_location() == libc::ECHILD {
            libc::_exit(EX_OSERR);
        }
    }
}

/// Ends this process as a wait status says: the same exit code, or the same signal.
unsafe fn end_as(st: i32) -> ! {
    if libc::WIFSIGNALED(st) {
        let sig = libc::WTERMSIG(st);
        libc::signal(sig, libc::SIG_DFL);
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, sig);
        libc::sigprocmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
        libc::kill(libc::getpid(), sig);
        libc::_exit(128 + sig);
    }
    libc::_exit(if libc::WIFEXITED(st) { libc::WEXITSTATUS(st) } else { EX_OSERR })
}

/// Closes every descriptor of this process.
unsafe fn close_all() {
    if libc::syscall(libc::SYS_close_range, 0u32, u32::MAX, 0u32) != 0 {
        for fd in 0..4096 {
            libc::close(fd);
        }
    }
}

/// Confines the worker itself (start-up): other processes of its uid cannot read its
/// memory, environment or descriptors, and job orphans come back to it to be reaped.
pub fn confine_worker() {
    // SAFETY: prctl with integer arguments on this process.
    if unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) } != 0 {
        tracing::warn!(error = %std::io::Error::last_os_error(), "could not make the worker non-dumpable");
    }
    if let Err(e) = super::reaper::become_subreaper() {
        tracing::warn!(error = %e, "could not become the subreaper of job processes; orphans go to PID 1");
    }
}

/// What the child applies to itself between fork and exec (prepared before fork:
/// nothing allocates after).
#[derive(Debug, Clone, Default)]
pub struct ChildSetup {
    /// RLIMIT_CPU soft limit in whole seconds (SIGXCPU), hard one second later (SIGKILL).
    pub cpu_secs: Option<u64>,
    pub open_files: Option<u64>,
    /// RLIMIT_NPROC and RLIMIT_AS where no cgroup holds the tree.
    pub fallback: crate::core::limits::Fallback,
    /// The attempt cgroup's `cgroup.procs` files.
    pub join: Vec<std::ffi::CString>,
    /// The attempt's own uid (and gid).
    pub uid: Option<u32>,
    /// The network namespace without network to enter.
    pub netns: Option<std::os::fd::RawFd>,
    /// An IPC namespace of its own.
    pub ipcns: bool,
    /// A mount namespace of its own (private /proc and /tmp).
    pub mounts: Option<Mounts>,
    /// A pid namespace of its own (`enter_pid_namespace`).
    pub pidns: bool,
}

/// The directories every attempt gets a private tmpfs at: what a job writes there is
/// its own and is gone with its mount namespace (when its last process ends).
pub const PRIVATE_TMPFS: [&str; 3] = ["/tmp", "/dev/shm", "/var/tmp"];
/// Size of `/dev/shm` and `/var/tmp` for a job type without a memory limit (with one, each
/// is its size; pages written there are charged to the attempt's cgroup either way).
pub const SHARED_TMPFS_BYTES: u64 = 256 << 20;

/// What a child's own mount namespace needs, prepared before fork (no allocation after).
#[derive(Debug, Clone)]
pub struct Mounts {
    /// The attempt's private directory, mounted back at its own path when it lies under
    /// one of the private tmpfs mounts.
    dir: std::ffi::CString,
    /// Directories to make in the new tmpfs down to `dir` (when it is under one).
    mkdirs: Vec<std::ffi::CString>,
    /// The tmpfs mounts: where (the [`PRIVATE_TMPFS`] that exist on this host) and their
    /// options (mode, and the size).
    tmpfs: Vec<(std::ffi::CString, std::ffi::CString)>,
    /// The working directory to return to (the job type's `cwd`).
    cwd: Option<std::ffi::CString>,
}

impl Mounts {
    /// For an attempt whose private directory is `dir` (absolute), working in `cwd`.
    pub fn new(dir: &std::path::Path, cwd: Option<&std::path::Path>, memory: Option<u64>) -> std::io::Result<Mounts> {
        let c = |p: &std::path::Path| {
            std::ffi::CString::new(p.as_os_str().as_encoded_bytes())
                .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))
        };
        let mut mkdirs = Vec::new();
        let mut tmpfs = Vec::new();
        for (i, at) in PRIVATE_TMPFS.iter().enumerate() {
            let at = std::path::Path::new(at);
            // A host without the directory has nothing there for a job to share.
            if !at.is_dir() {
                continue;
            }
            if let Ok(rest) = dir.strip_prefix(at) {
                let mut p = at.to_path_buf();
                for part in rest.components() {
                    p.push(part);
                    mkdirs.push(c(&p)?);
                }
            }
            let size = match (i, memory) {
                (_, Some(m)) => format!(",size={m}"),
                (0, None) => String::new(),
                (_, None) => format!(",size={SHARED_TMPFS_BYTES}"),
            };
            tmpfs.push((c(at)?, c(std::path::Path::new(&format!("mode=1777{size}")))?));
        }
        let cwd = match cwd {
            Some(p) => Some(c(&std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf()))?),
            None => None,
        };
        Ok(Mounts { dir: c(dir)?, mkdirs, tmpfs, cwd })
    }
}

/// A pipe for the control lines: (read end for the worker, write end for the child).
pub fn control_pipe() -> std::io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0i32; 2];
    // SAFETY: pipe2 writes two new descriptors into `fds`, which we then own.
    let rc = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: both descriptors were just created and are owned by nothing else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Runs in the child between fork and exec: the control pipe on fd 3, its cgroup, the
/// rlimits, no network, its own pid namespace, its own uid, no new privileges. Only
/// async-signal-safe calls.
pub fn in_child(control_write: &OwnedFd, setup: &ChildSetup) -> std::io::Result<()> {
    cgroup::in_child(&setup.join)?;
    // Before fd 3 is taken: the namespace's descriptor may be number 3 in the worker.
    if let Some(ns) = setup.netns {
        // SAFETY: setns on a namespace descriptor the worker holds open.
        if unsafe { libc::setns(ns, libc::CLONE_NEWNET) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    if setup.ipcns {
        // SAFETY: unshare on this (forked) process.
        if unsafe { libc::unshare(libc::CLONE_NEWIPC) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    if setup.pidns {
        enter_pid_namespace()?;
    }
    let fd = control_write.as_raw_fd();
    let check = |rc: i32| if rc < 0 { Err(std::io::Error::last_os_error()) } else { Ok(()) };
    // SAFETY: plain syscalls on descriptors and limits of this (forked) process.
    unsafe {
        if fd == CONTROL_FD {
            check(libc::fcntl(fd, libc::F_SETFD, 0))?;
        } else {
            check(libc::dup2(fd, CONTROL_FD))?;
        }
        let set = |res, soft: u64, hard: u64| {
            let r = libc::rlimit { rlim_cur: soft as libc::rlim_t, rlim_max: hard as libc::rlim_t };
            check(libc::setrlimit(res, &r))
        };
        set(libc::RLIMIT_CORE, 0, 0)?;
        if let Some(s) = setup.cpu_secs {
            set(libc::RLIMIT_CPU, s, s + 1)?;
        }
        if let Some(n) = setup.open_files {
            set(libc::RLIMIT_NOFILE, n, n)?;
        }
        if let Some(n) = setup.fallback.nproc {
            set(libc::RLIMIT_NPROC, n, n)?;
        }
        if let Some(n) = setup.fallback.address_space {
            set(libc::RLIMIT_AS, n, n)?;
        }
        if let Some(m) = &setup.mounts {
            mount_private(m)?;
        }
        if let Some(uid) = setup.uid {
            check(libc::setgroups(0, std::ptr::null()))?;
            check(libc::setgid(uid))?;
            check(libc::setuid(uid))?;
        }
        check(libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0))?;
    }
    Ok(())
}

/// In the child (root, before its uid is set): a mount namespace of its own, /proc
/// mounted anew with `hidepid=2` (only its own uid's processes are listed or readable),
/// /tmp, /dev/shm and /var/tmp fresh tmpfs mounts, with the attempt's private directory
/// mounted back at its own path (so the paths in its environment hold). Only
/// async-signal-safe syscalls.
pub fn mount_private(m: &Mounts) -> std::io::Result<()> {
    let check = |rc: i32| if rc < 0 { Err(std::io::Error::last_os_error()) } else { Ok(()) };
    let none = std::ptr::null::<libc::c_char>();
    // SAFETY: syscalls on C strings prepared before fork; this process is the forked child.
    unsafe {
        check(libc::unshare(libc::CLONE_NEWNS))?;
        check(libc::mount(none, c"/".as_ptr(), none, libc::MS_REC | libc::MS_PRIVATE, std::ptr::null()))?;
        // Opened in the new namespace: a bind mount's source must be in the caller's
        // namespace (one opened before `unshare` is not: the bind fails with EINVAL).
        let dir = libc::open(m.dir.as_ptr(), libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC);
        check(dir)?;
        let flags = libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC;
        check(libc::mount(c"proc".as_ptr(), c"/proc".as_ptr(), c"proc".as_ptr(), flags, c"hidepid=2".as_ptr().cast()))?;
        check(libc::fchdir(dir))?;
        for (at, options) in &m.tmpfs {
            check(libc::mount(
                c"tmpfs".as_ptr(),
                at.as_ptr(),
                c"tmpfs".as_ptr(),
                libc::MS_NOSUID | libc::MS_NODEV,
                options.as_ptr().cast(),
            ))?;
        }
        for d in &m.mkdirs {
            check(libc::mkdir(d.as_ptr(), 0o711))?;
        }
        if !m.mkdirs.is_empty() {
            // "." is still the private directory (the working directory held across the mount).
            check(libc::mount(c".".as_ptr(), m.dir.as_ptr(), none, libc::MS_BIND, std::ptr::null()))?;
        }
        check(libc::chdir(m.cwd.as_ref().unwrap_or(&m.dir).as_ptr()))?;
        libc::close(dir);
    }
    Ok(())
}

/// Sends `signal` to the child's whole process group (it leads its own group).
pub fn signal_group(pgid: u32, signal: i32) {
    // 0 would signal the worker's own process group.
    if pgid == 0 {
        return;
    }
    // SAFETY: kill(2) with a negative pid signals a process group; no memory involved.
    unsafe {
        libc::kill(-(pgid as i32), signal);
    }
}

/// One sample of a running process: resident memory (now and peak) and CPU time.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Sample {
    pub rss_bytes: u64,
    pub hwm_bytes: u64,
    pub cpu_ms: i64,
}

/// Samples `pid` from /proc; None once it is gone.
pub fn sample(pid: u32) -> Option<Sample> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kib = |key: &str| {
        status
            .lines()
            .find(|l| l.starts_with(key))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
            * 1024
    };
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    Some(Sample { rss_bytes: kib("VmRSS:"), hwm_bytes: kib("VmHWM:"), cpu_ms: cpu_ms_of_stat(&stat) })
}

/// utime + stime (fields 14 and 15 of /proc/<pid>/stat, after the parenthesised name).
fn cpu_ms_of_stat(stat: &str) -> i64 {
    let after_name = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|v| v.parse::<i64>().ok()).unwrap_or(0);
    // SAFETY: sysconf reads a constant of the system.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1);
    // After the name: field 3 (state) is index 0, so utime (14) is 11 and stime (15) 12.
    (ticks(11) + ticks(12)) * 1000 / hz
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_this_process_and_parses_names_with_spaces() {
        let s = sample(std::process::id()).expect("our own /proc entry");
        assert!(s.rss_bytes > 0 && s.hwm_bytes >= s.rss_bytes, "{s:?}");
        let stat = "42 (a b) c) S 1 1 1 0 -1 0 0 0 0 0 300 200 0 0 20 0 1 0";
        // SAFETY: as above.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
        assert_eq!(cpu_ms_of_stat(stat), 500 * 1000 / hz);
    }

    #[test]
    fn this_machine_reports_an_enforcement_with_a_reason_for_what_it_lacks() {
        let e = Enforcement::detect();
        let described = e.describe();
        assert!(described.contains("pid namespace"), "{described}");
        for (c, why) in e.unavailable() {
            assert!(!why.is_empty() && described.contains(&why), "{c:?}: {described}");
        }
    }
}
