//! The `process` executor: each attempt of a job type with `handler = "process"` runs
//! its `command` as a child process in a sandbox (`sandbox`, `cgroup`): its own cgroup
//! (memory and processes limits over its whole tree, killed whole when the attempt
//! ends), its own uid, no network unless the job type needs it, a private directory.
//! The payload goes to the child's stdin, its stdout (capped) is the output, the tail
//! of its stderr goes to the worker's log (and into the error if the job type opts in);
//! its exit code is its verdict. The job's identity and a checkpoint file path are in
//! its environment; it reports progress, checkpoints and heartbeats as lines on fd 3
//! (`control`). The protocol is in docs/process-jobs.md.
//!
//! Cancel, drain (hand-off) and the stuck detector send SIGTERM to the child's process
//! group, then SIGKILL after `kill_grace`. A job dropped by the worker (aborted) takes its
//! child's group with it; the end of every attempt takes its whole cgroup. Job types with
//! `mode = "pooled"` run on long-lived children instead (`pooled`).

mod cgroup;
mod control;
mod fsafe;
mod pooled;
mod reaper;
mod sandbox;

pub use sandbox::{confine_worker, Enforcement, CONTROL_FD};

use super::{Handler, HandlerError, HandlerResult, JobContext, JobLive};
use crate::config::Config;
use crate::core::checkpoint_pace::CheckpointPace;
use crate::core::limits::{self, Bytes, ChildEnd, LimitHit, Limits, Verdict};
use crate::core::retry::DurationMs;
use futures::future::BoxFuture;
use futures::FutureExt;
use std::os::fd::AsRawFd;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Bytes of stderr kept (its tail goes to the log, and into the error if opted in).
const STDERR_TAIL: usize = 2048;
/// How long the worker waits for a child's last control lines and output after it exits
/// (a grandchild that keeps the pipes open must not hold the slot where no cgroup kills it).
const AFTER_EXIT: Duration = Duration::from_secs(2);

/// Everything an attempt needs, fixed at start-up from the job type's configuration.
#[derive(Debug, Clone)]
pub struct Spec {
    pub argv: Vec<String>,
    /// The working directory; the attempt's private directory when None.
    pub cwd: Option<PathBuf>,
    /// The allow-listed variables of the worker's environment, as they were at start-up.
    pub env: Vec<(String, String)>,
    pub limits: Limits,
    /// Bytes of stdout kept as the output (see `Limits::output_cap`).
    pub output_cap: u64,
    /// Largest checkpoint accepted from the child (`worker.max_payload_bytes`).
    pub max_checkpoint: u64,
    pub kill_grace: Duration,
    /// Where the attempts' private directories live (`[sandbox] dir`).
    pub sandbox_root: PathBuf,
    /// The child keeps the worker's network (else: a namespace of its own where possible).
    pub network: bool,
    /// The tail of stderr goes into the error (else only into the worker's log).
    pub stderr_in_error: bool,
    /// mode = "pooled": long-lived children (`pooled`); None: a child per attempt.
    pub pooled: Option<pooled::Settings>,
}

impl Spec {
    pub fn from_config(cfg: &Config, job_type: &str) -> Result<Spec, String> {
        let jt = cfg.job_types.get(job_type).ok_or_else(|| format!("job_types.{job_type}: no such job type"))?;
        let limits = cfg.limits(job_type, jt.pool);
        // Checked where the job runs (a submitter's copy of the config need not have it).
        if let Some(dir) = jt.cwd.as_deref().filter(|d| !std::path::Path::new(d).is_dir()) {
            return Err(format!(
                "job_types.{job_type}.cwd: {dir:?} is not a directory on this worker; create it or fix the path"
            ));
        }
        let argv = jt.command.clone().unwrap_or_default();
        if argv.is_empty() {
            return Err(format!("job_types.{job_type}.command: handler = \"process\" needs a command"));
        }
        let root = cfg.sandbox.dir.as_ref().map(PathBuf::from).unwrap_or_else(std::env::temp_dir);
        Ok(Spec {
            argv,
            cwd: jt.cwd.as_ref().map(PathBuf::from),
            env: jt.env.iter().filter_map(|k| std::env::var(k).ok().map(|v| (k.clone(), v))).collect(),
            limits,
            output_cap: limits.output_cap(cfg.worker.max_payload_bytes),
            max_checkpoint: cfg.worker.max_payload_bytes as u64,
            kill_grace: cfg.kill_grace(job_type),
            sandbox_root: root.join(format!("fairway-sandboxes-{}", std::process::id())),
            network: jt.network,
            stderr_in_error: jt.stderr_in_error,
            pooled: (jt.mode == crate::config::ProcessMode::Pooled).then(|| {
                let p = jt.pooled.unwrap_or_default();
                pooled::Settings {
                    jobs_per_child: p.jobs_per_child,
                    idle: Duration::from_millis(p.idle.0.max(1) as u64),
                    max_idle: cfg.pool(jt.pool).slots.max(1),
                }
            }),
        })
    }
}

/// Runs a job type's attempts as child processes: a child per attempt, or pooled
/// children taking jobs one after another.
pub struct ProcessExecutor {
    spec: Arc<Spec>,
    children: Option<Arc<pooled::Children>>,
}

impl ProcessExecutor {
    pub fn new(spec: Spec) -> Self {
        let children = spec.pooled.map(|_| Arc::new(pooled::Children::default()));
        ProcessExecutor { spec: Arc::new(spec), children }
    }
}

impl Handler for ProcessExecutor {
    fn run(&self, ctx: JobContext) -> BoxFuture<'static, HandlerResult> {
        let spec = self.spec.clone();
        match self.children.clone() {
            Some(children) => async move { pooled::run(&spec, &children, &ctx).await }.boxed(),
            None => async move { attempt(&spec, &ctx).await }.boxed(),
        }
    }
}

/// One attempt's confinement: its directory, uid and cgroup. Dropping it (the attempt
/// aborted by the worker) kills what is left of the child's process group and cgroup.
struct Confined {
    dir: PathBuf,
    checkpoint_file: PathBuf,
    uid: Option<sandbox::UidLease>,
    tree: Option<cgroup::Tree>,
    pgid: u32,
    ended: bool,
}

impl Confined {
    /// A private 0700 directory `dir_name` (owned by the attempt's uid), its uid and its
    /// cgroup.
    fn new(spec: &Spec, dir_name: &str) -> Result<Confined, HandlerError> {
        let enforcement = Enforcement::current();
        let io = |what: &str, e: std::io::Error| {
            HandlerError::dependency(format!("cannot prepare the sandbox ({what}): {e}"))
        };
        std::fs::create_dir_all(&spec.sandbox_root).map_err(|e| io("root", e))?;
        // Others may pass through the root to their own directory, not list it.
        std::fs::set_permissions(&spec.sandbox_root, std::fs::Permissions::from_mode(0o711))
            .map_err(|e| io("root", e))?;
        let dir = spec.sandbox_root.join(dir_name);
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir(&dir).map_err(|e| io("directory", e))?;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).map_err(|e| io("directory", e))?;
        let uid = enforcement.take_uid();
        if let Some(u) = &uid {
            std::os::unix::fs::chown(&dir, Some(u.uid), Some(u.uid)).map_err(|e| io("owner", e))?;
        }
        let tree = match &enforcement.tree {
            Ok(h) => Some(
                h.create(cgroup::TreeLimits {
                    memory: spec.limits.memory.map(|m| m.0),
                    processes: spec.limits.processes,
                    cpu_quota_us: spec.limits.cpus.map(crate::core::limits::cpu_quota_us),
                })
                .map_err(|e| io("cgroup", e))?,
            ),
            Err(_) => None,
        };
        let checkpoint_file = dir.join(CHECKPOINT_FILE);
        Ok(Confined { dir, checkpoint_file, uid, tree, pgid: 0, ended: false })
    }

    /// What the child applies to itself before exec.
    fn child_setup(&self, spec: &Spec) -> Result<sandbox::ChildSetup, HandlerError> {
        let enforcement = Enforcement::current();
        // A private /proc hides other uids' processes: only worth it with a uid of its own.
        let mounts = match (&enforcement.mountns, &self.uid) {
            (Ok(()), Some(_)) => Some(
                sandbox::Mounts::new(&self.dir, spec.cwd.as_deref(), spec.limits.memory.map(|m| m.0))
                    .map_err(|e| HandlerError::dependency(format!("cannot prepare the sandbox (mounts): {e}")))?,
            ),
            _ => None,
        };
        // One-shot attempts only (a pooled child is kept across jobs, and its pid is what
        // the pool talks to and watches); with its own mounts, whose /proc is then the
        // namespace's, and its cgroup, which measures the program under the outer waiter.
        let pidns = spec.pooled.is_none() && mounts.is_some() && self.tree.is_some() && enforcement.pid_namespaces();
        Ok(sandbox::ChildSetup {
            mounts,
            // A pooled child's CPU time is checked per job from its tree (RLIMIT_CPU would
            // count its whole life).
            cpu_secs: spec
                .limits
                .cpu_time
                .filter(|_| spec.pooled.is_none())
                .map(|d| (d.0.max(1) as u64).div_ceil(1000)),
            open_files: spec.limits.open_files,
            fallback: self.fallback(spec),
            join: self.tree.as_ref().map(|t| t.join_files()).unwrap_or_default(),
            uid: self.uid.as_ref().map(|u| u.uid),
            pidns,
            netns: enforcement.netns.as_ref().ok().filter(|_| !spec.network).map(|fd| fd.as_raw_fd()),
            ipcns: enforcement.ipcns.is_ok(),
        })
    }

    /// The rlimits standing in for a missing cgroup. RLIMIT_NPROC counts every process
    /// of the uid: only set where the attempt has a uid of its own (else it would count
    /// the worker's threads and the other attempts' processes).
    fn fallback(&self, spec: &Spec) -> crate::core::limits::Fallback {
        if self.tree.is_some() {
            return Default::default();
        }
        let f = spec.limits.fallback();
        crate::core::limits::Fallback { nproc: f.nproc.filter(|_| self.uid.is_some()), ..f }
    }

    /// Kills everything the attempt started: the whole cgroup (or the process group where
    /// there is none), then reaps the orphans it leaves.
    async fn end(&mut self) -> Vec<u32> {
        self.ended = true;
        let killed = match &self.tree {
            Some(tree) => tree.kill_all().await,
            None => {
                sandbox::signal_group(self.pgid, libc::SIGKILL);
                Vec::new()
            }
        };
        reaper::sweep();
        killed
    }
}

impl Drop for Confined {
    fn drop(&mut self) {
        if self.pgid != 0 {
            reaper::leader_done(self.pgid);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
        if !self.ended {
            sandbox::signal_group(self.pgid, libc::SIGKILL);
        }
        let Some(tree) = self.tree.take() else { return };
        // Ended, or never started: nothing left in it.
        if self.ended || self.pgid == 0 {
            tree.remove();
            return;
        }
        // Aborted: the tree's kill takes a few passes, which a drop cannot await; its uid
        // is free again only once they are done.
        let uid = self.uid.take();
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                rt.spawn(async move {
                    tree.kill_all().await;
                    tree.remove();
                    reaper::sweep();
                    drop(uid);
                });
            }
            Err(_) => tree.remove(),
        }
    }
}

/// One attempt: confine, spawn, feed, watch, kill what is left, collect, judge.
async fn attempt(spec: &Spec, ctx: &JobContext) -> HandlerResult {
    let mut confined =
        Confined::new(spec, &crate::core::sandbox::dir_name(&ctx.job.job_id, ctx.attempt.max(0) as u32))?;
    let dir = fsafe::Dir::open(&confined.dir)
        .map_err(|e| HandlerError::dependency(format!("cannot open the attempt's directory: {e}")))?;
    prepare_checkpoint(ctx, &dir, &confined).await?;
    let (control_read, control_write) = sandbox::control_pipe()
        .map_err(|e| HandlerError::dependency(format!("cannot create the control pipe: {e}")))?;
    let mut cmd = command(spec, ctx, &confined);
    let setup = confined.child_setup(spec)?;
    // SAFETY: the closure only makes async-signal-safe syscalls (see `sandbox::in_child`).
    unsafe {
        cmd.pre_exec(move || sandbox::in_child(&control_write, &setup));
    }
    let mut child = reaper::spawn_leader(&mut cmd).map_err(|e| {
        HandlerError::permanent(format!("cannot start {:?}: {e}; fix job_types.<type>.command", spec.argv[0]))
    })?;
    drop(cmd); // closes our copy of the control pipe's write end (moved into the closure)
    let pid = child.id().unwrap_or(0);
    confined.pgid = pid;
    let control = tokio::net::unix::pipe::Receiver::from_owned_fd(control_read)
        .map_err(|e| HandlerError::dependency(format!("cannot read the control pipe: {e}")))?;
    let mut stdin = child.stdin.take().expect("piped stdin");
    let payload = ctx.job.payload.clone();
    tokio::spawn(async move {
        // A child that does not read its stdin closes it: not our problem.
        let _ = stdin.write_all(&payload).await;
    });
    let overflow = Arc::new(AtomicBool::new(false));
    let stdout =
        tokio::spawn(read_capped(child.stdout.take().expect("piped stdout"), spec.output_cap, overflow.clone()));
    let stderr = tokio::spawn(read_tail(child.stderr.take().expect("piped stderr")));
    let mut lines = control::Lines::new(control);
    let mut pace = CheckpointPace::default();
    let mut x =
        Watch { child: &mut child, lines: &mut lines, pace: &mut pace, confined: &confined, overflow: &overflow, pid };
    let watched = watch(spec, ctx, &mut x).await;
    let killed = confined.end().await;
    // Reports written just before the exit (the last checkpoint before a hand-off).
    let _ = tokio::time::timeout(AFTER_EXIT, async {
        while let Ok(Some(line)) = lines.next_line().await {
            if let Some(state) = control_line(spec, ctx, &confined, &line).await {
                pace.offer(crate::now_ms(), state);
            }
        }
    })
    .await;
    if let Some(state) = pace.flush() {
        save_checkpoint(ctx, &state).await;
    }
    let output = join_or_default(stdout).await;
    let stderr_tail = String::from_utf8_lossy(&join_or_default(stderr).await).into_owned();
    let Watched { status, mut hit, mut peak, mut cpu_ms, stopped } = watched?;
    if let Some(tree) = &confined.tree {
        let usage = tree.usage();
        peak = peak.max(usage.peak_bytes);
        cpu_ms = cpu_ms.max(usage.cpu_ms);
        hit = hit.or(limits::tree_hit(&spec.limits, usage.counts, Bytes(peak)));
    }
    if overflow.load(Ordering::SeqCst) && hit.is_none() {
        hit = Some(LimitHit::Output { limit: Bytes(spec.output_cap) });
    }
    let strays = killed.iter().filter(|p| **p != pid).count();
    tracing::debug!(job_id = %ctx.job.job_id, peak_memory = peak, cpu_ms, strays, "process attempt ended");
    let failed = hit.is_some() || !status.success();
    if failed && !stderr_tail.trim().is_empty() {
        tracing::info!(job_id = %ctx.job.job_id, tenant = %ctx.job.tenant, stderr = %stderr_tail.trim(), "stderr of a failed process attempt");
    }
    let end = ChildEnd {
        code: status.code(),
        signal: status.signal(),
        hit,
        cpu_used: DurationMs(cpu_ms),
        cpu_limit: spec.limits.cpu_time,
        peak_memory: Bytes(peak),
        stderr_tail: if spec.stderr_in_error { stderr_tail } else { String::new() },
    };
    drop(confined);
    judge(ctx.live(), &end, stopped, output)
}
/// The verdict on an ended child, told to the worker through the job's live state with
/// what its tree used (carried on the result).
fn judge(live: &JobLive, end: &ChildEnd, stopped: Option<&'static str>, output: Vec<u8>) -> HandlerResult {
    live.record_usage(crate::model::ProcessUsage {
        peak_memory_bytes: i64::try_from(end.peak_memory.0).unwrap_or(i64::MAX),
        cpu_ms: end.cpu_used.0,
    });
    let verdict = limits::verdict(end);
    if matches!(verdict, Verdict::Failed { abnormal: true, .. }) {
        live.mark_abnormal();
    }
    match (verdict, stopped) {
        // Finished although asked to stop: its output stands.
        (Verdict::Success, _) => Ok(output),
        // Stopped by us (cancel, hand-off, stuck): that is why it failed, whatever it exited with.
        (Verdict::Failed { message, .. }, Some(why)) => {
            Err(HandlerError::app(format!("stopped ({why}) with SIGTERM: {message}")))
        }
        (Verdict::Failed { class, message, .. }, None) => Err(HandlerError { class, message, retry_after: None }),
    }
}

/// The child's command line, environment and pipes (not yet spawned).
fn command(spec: &Spec, ctx: &JobContext, confined: &Confined) -> tokio::process::Command {
    let mut cmd = base_command(spec, &confined.dir);
    cmd.envs(job_vars(ctx, &confined.dir, &confined.checkpoint_file));
    cmd.env("TMPDIR", &confined.dir);
    cmd
}

/// The program with the allowed environment, `FAIRWAY_CONTROL_FD`, piped stdio and a
/// process group of its own, working in `dir` unless the job type sets `cwd`.
fn base_command(spec: &Spec, dir: &std::path::Path) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(&spec.argv[0]);
    cmd.args(&spec.argv[1..]).env_clear().envs(spec.env.iter().map(|(k, v)| (k, v)));
    cmd.current_dir(spec.cwd.as_deref().unwrap_or(dir));
    cmd.env("FAIRWAY_CONTROL_FD", CONTROL_FD.to_string());
    cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).process_group(0);
    cmd
}

/// One job's variables (docs/process-jobs.md "The contract"): a one-shot child's
/// environment, a pooled child's job header.
fn job_vars(ctx: &JobContext, dir: &std::path::Path, checkpoint_file: &std::path::Path) -> Vec<(&'static str, String)> {
    let job = &ctx.job;
    let (traceparent, tracestate) = ctx.trace_context();
    let mut vars = vec![
        ("FAIRWAY_JOB_ID", job.job_id.clone()),
        ("FAIRWAY_TENANT", job.tenant.clone()),
        ("FAIRWAY_JOB_TYPE", job.job_type.clone()),
        ("FAIRWAY_ATTEMPT", ctx.attempt.to_string()),
        ("FAIRWAY_GENERATION", job.generation.to_string()),
        ("FAIRWAY_FIRST_ATTEMPT", if ctx.first_attempt() { "1" } else { "0" }.to_string()),
        ("FAIRWAY_CRASH_COUNT", job.crash_count.to_string()),
        ("FAIRWAY_HANDOFF_COUNT", job.handoff_count.to_string()),
        ("FAIRWAY_REPLAY_COUNT", job.replay_count.to_string()),
        ("FAIRWAY_CHECKPOINT_FILE", checkpoint_file.display().to_string()),
        ("FAIRWAY_SANDBOX_DIR", dir.display().to_string()),
    ];
    if let Some(tp) = traceparent {
        vars.push(("TRACEPARENT", tp.to_string()));
    }
    if let Some(ts) = tracestate {
        vars.push(("TRACESTATE", ts.to_string()));
    }
    vars
}

/// Writes the job's last checkpoint (if any) where the child will look for it, owned by
/// the attempt's uid.
/// The checkpoint file's name in an attempt's (or a pooled job's) directory.
const CHECKPOINT_FILE: &str = "checkpoint";

/// Writes the job's saved checkpoint, if it has one, as a new file `checkpoint` in `dir`
/// (the attempt's directory, `confined.checkpoint_file`), owned by the attempt's uid:
/// through `fsafe`, so a link or file put there first is refused, never written through.
async fn prepare_checkpoint(ctx: &JobContext, dir: &fsafe::Dir, confined: &Confined) -> Result<(), HandlerError> {
    let io = |e: std::io::Error| HandlerError::dependency(format!("cannot prepare the checkpoint file: {e}"));
    match ctx.load_checkpoint().await {
        Ok(Some(state)) => dir.write_new(CHECKPOINT_FILE, &state, confined.uid.as_ref().map(|u| u.uid)).map_err(io),
        Ok(None) => Ok(()),
        Err(e) => Err(HandlerError::dependency(format!("cannot read the checkpoint: {e}"))),
    }
}

async fn save_checkpoint(ctx: &JobContext, state: &[u8]) {
    if let Err(e) = ctx.checkpoint(state).await {
        tracing::warn!(job_id = %ctx.job.job_id, error = %e, "could not save the child's checkpoint");
    }
}

/// How the watched child ended.
struct Watched {
    status: std::process::ExitStatus,
    hit: Option<LimitHit>,
    peak: u64,
    cpu_ms: i64,
    /// Why we sent SIGTERM, if we did.
    stopped: Option<&'static str>,
}

/// What `watch` reads from and writes to while the child runs.
struct Watch<'a> {
    child: &'a mut tokio::process::Child,
    lines: &'a mut control::Lines,
    pace: &'a mut CheckpointPace,
    confined: &'a Confined,
    overflow: &'a AtomicBool,
    pid: u32,
}

/// Waits for the child while relaying its control lines and enforcing the limits the
/// kernel does not: the tree's counters (or the leader's memory where there is no
/// cgroup), CPU time of the tree, wall time, output size, control lines, stop requests.
async fn watch(spec: &Spec, ctx: &JobContext, x: &mut Watch<'_>) -> Result<Watched, HandlerError> {
    let live = ctx.live();
    let pid = x.pid;
    let wall = spec.limits.wall_time.map(|d| tokio::time::Instant::now() + Duration::from_millis(d.0 as u64));
    let mut tick = tokio::time::interval(sandbox::WATCH_INTERVAL);
    let mut w = Watched { status: std::process::ExitStatus::from_raw(0), hit: None, peak: 0, cpu_ms: 0, stopped: None };
    let mut term_at: Option<tokio::time::Instant> = None;
    let mut control_open = true;
    loop {
        let kill_now = |w: &mut Watched, hit: LimitHit| {
            if w.hit.is_none() {
                w.hit = Some(hit);
                sandbox::signal_group(pid, libc::SIGKILL);
            }
        };
        tokio::select! {
            status = x.child.wait() => {
                w.status = status.map_err(|e| HandlerError::dependency(format!("cannot wait for the child: {e}")))?;
                return Ok(w);
            }
            line = x.lines.next_line(), if control_open => match line {
                Ok(Some(line)) => {
                    if let Some(state) = control_line(spec, ctx, x.confined, &line).await {
                        if let Some(now) = x.pace.offer(crate::now_ms(), state) {
                            save_checkpoint(ctx, &now).await;
                        }
                    }
                }
                Err(control::Overlong) => {
                    control_open = false;
                    kill_now(&mut w, LimitHit::Control { limit: limits::CONTROL_LINE_MAX });
                }
                Ok(None) => control_open = false,
            },
            _ = tokio::time::sleep_until(wall.unwrap_or_else(far_future)), if wall.is_some() && w.hit.is_none() => {
                kill_now(&mut w, LimitHit::WallTime { limit: spec.limits.wall_time.unwrap_or_default() });
            }
            _ = tick.tick() => {
                if let Some(hit) = sample(spec, x.confined, pid, &mut w) {
                    kill_now(&mut w, hit);
                }
                if x.overflow.load(Ordering::SeqCst) {
                    kill_now(&mut w, LimitHit::Output { limit: Bytes(spec.output_cap) });
                }
                if let Some(state) = x.pace.due(crate::now_ms()) {
                    save_checkpoint(ctx, &state).await;
                }
                if let (None, Some(why)) = (w.stopped, live.stop_reason()) {
                    w.stopped = Some(stop_name(why));
                    sandbox::signal_group(pid, libc::SIGTERM);
                    term_at = Some(tokio::time::Instant::now());
                }
                if term_at.is_some_and(|t| t.elapsed() >= spec.kill_grace) {
                    live.mark_abnormal();
                    sandbox::signal_group(pid, libc::SIGKILL);
                    term_at = None;
                }
            }
        }
    }
}

/// Reads the tree's (or, without a cgroup, the leader's) memory and CPU into `w`; the
/// limit they say is crossed, if any.
fn sample(spec: &Spec, confined: &Confined, pid: u32, w: &mut Watched) -> Option<LimitHit> {
    let cpu_hit = |w: &Watched| {
        spec.limits
            .cpu_time
            .filter(|l| w.cpu_ms > l.0)
            .map(|limit| LimitHit::CpuTime { limit, used: DurationMs(w.cpu_ms) })
    };
    if let Some(tree) = &confined.tree {
        let u = tree.usage();
        w.peak = w.peak.max(u.peak_bytes);
        w.cpu_ms = w.cpu_ms.max(u.cpu_ms);
        return limits::tree_hit(&spec.limits, u.counts, Bytes(w.peak)).or_else(|| cpu_hit(w));
    }
    let s = sandbox::sample(pid)?;
    w.peak = w.peak.max(s.hwm_bytes).max(s.rss_bytes);
    w.cpu_ms = w.cpu_ms.max(s.cpu_ms);
    spec.limits.memory.filter(|l| s.rss_bytes > l.0).map(|limit| LimitHit::Memory { limit, peak: Bytes(w.peak) })
}

/// Why a child was sent SIGTERM, as errors say it.
fn stop_name(why: super::StopReason) -> &'static str {
    match why {
        super::StopReason::Cancelled => "cancelled",
        super::StopReason::ShuttingDown => "hand-off",
        super::StopReason::Stuck => "stuck",
    }
}

fn far_future() -> tokio::time::Instant {
    tokio::time::Instant::now() + Duration::from_secs(86_400 * 365)
}

/// One control line from the child (docs/process-jobs.md): `progress <fraction>
/// [message]`, `checkpoint [state]`, `heartbeat`. A checkpoint's state is returned for
/// the caller to pace.
async fn control_line(spec: &Spec, ctx: &JobContext, confined: &Confined, line: &str) -> Option<Vec<u8>> {
    let (verb, rest) = line.trim_end_matches('\r').split_once(' ').unwrap_or((line.trim(), ""));
    match verb {
        "progress" => {
            let (fraction, message) = rest.split_once(' ').unwrap_or((rest, ""));
            match fraction.parse::<f64>() {
                Ok(f) if f.is_finite() => ctx.progress(f, message.chars().take(200).collect::<String>()),
                _ => tracing::debug!(job_id = %ctx.job.job_id, line, "progress line without a number; ignored"),
            }
            None
        }
        "heartbeat" => {
            ctx.heartbeat();
            None
        }
        "checkpoint" => {
            let state = if rest.is_empty() {
                match control::read_checkpoint_file(
                    &confined.checkpoint_file,
                    confined.uid.as_ref().map(|u| u.uid),
                    spec.max_checkpoint,
                ) {
                    Ok(b) => b,
                    Err(e) => {
                        tracing::warn!(job_id = %ctx.job.job_id, error = %e, "checkpoint line but no acceptable checkpoint file");
                        return None;
                    }
                }
            } else {
                rest.as_bytes().to_vec()
            };
            if state.len() as u64 > spec.max_checkpoint {
                tracing::warn!(job_id = %ctx.job.job_id, bytes = state.len(), "checkpoint over worker.max_payload_bytes; ignored");
                return None;
            }
            // The stuck detector counts the report now, whenever the write goes out.
            ctx.heartbeat();
            Some(state)
        }
        _ => {
            tracing::debug!(job_id = %ctx.job.job_id, line, "unknown control line; ignored");
            None
        }
    }
}

/// Reads stdout up to `cap` bytes; sets `overflow` if the child wrote more (the watchdog
/// then kills it).
async fn read_capped(mut out: tokio::process::ChildStdout, cap: u64, overflow: Arc<AtomicBool>) -> Vec<u8> {
    let mut buf = Vec::new();
    let mut limited = (&mut out).take(cap + 1);
    let _ = limited.read_to_end(&mut buf).await;
    if buf.len() as u64 > cap {
        buf.truncate(cap as usize);
        overflow.store(true, Ordering::SeqCst);
    }
    buf
}

/// Reads stderr to its end, keeping the last `STDERR_TAIL` bytes.
async fn read_tail(mut err: tokio::process::ChildStderr) -> Vec<u8> {
    let mut tail = Vec::new();
    let mut chunk = [0u8; 4096];
    while let Ok(n) = err.read(&mut chunk).await {
        if n == 0 {
            break;
        }
        tail.extend_from_slice(&chunk[..n]);
        if tail.len() > STDERR_TAIL {
            tail.drain(..tail.len() - STDERR_TAIL);
        }
    }
    tail
}

/// A pipe reader's bytes, or nothing if a grandchild keeps the pipe open past `AFTER_EXIT`.
async fn join_or_default(task: tokio::task::JoinHandle<Vec<u8>>) -> Vec<u8> {
    let abort = task.abort_handle();
    match tokio::time::timeout(AFTER_EXIT, task).await {
        Ok(Ok(v)) => v,
        _ => {
            abort.abort();
            Vec::new()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{FailureClass, JobSubmitted};

    fn spec(script: &str, limits: Limits) -> Spec {
        Spec {
            argv: vec!["/bin/sh".into(), "-c".into(), script.into()],
            cwd: None,
            env: vec![("PATH".into(), std::env::var("PATH").unwrap_or_default())],
            limits,
            output_cap: limits.output_cap(1 << 20),
            max_checkpoint: 1 << 20,
            kill_grace: Duration::from_millis(500),
            sandbox_root: std::env::temp_dir().join("fairway-process-unit"),
            network: false,
            stderr_in_error: true,
            pooled: None,
        }
    }

    async fn run(spec: Spec, payload: &[u8]) -> (HandlerResult, Arc<JobLive>) {
        run_as(spec, &uuid::Uuid::now_v7().to_string(), payload).await
    }

    async fn run_as(spec: Spec, job_id: &str, payload: &[u8]) -> (HandlerResult, Arc<JobLive>) {
        let job = JobSubmitted::original(job_id.to_string(), "acme".into(), "t".into(), payload.to_vec(), 0);
        let live = Arc::new(JobLive::default());
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        let ctx = JobContext::new(Arc::new(job), deadline, live.clone(), None);
        (ProcessExecutor::new(spec).run(ctx).await, live)
    }

    #[tokio::test]
    async fn stdin_to_stdout_with_only_the_allowed_environment_and_the_job_variables() {
        std::env::set_var("FAIRWAY_UNIT_SECRET", "not for children");
        let script = "cat; echo \" $FAIRWAY_TENANT $FAIRWAY_ATTEMPT $FAIRWAY_CONTROL_FD ${FAIRWAY_UNIT_SECRET:-none}\"";
        let (r, _) = run(spec(script, Limits::default()), b"payload").await;
        assert_eq!(String::from_utf8(r.unwrap()).unwrap(), "payload acme 0 3 none\n");
    }

    #[tokio::test]
    async fn exit_codes_give_classes_and_stderr_tail_goes_into_the_error() {
        for (code, class) in
            [(1, FailureClass::AppError), (65, FailureClass::Permanent), (75, FailureClass::Dependency)]
        {
            let (r, live) = run(spec(&format!("echo broken >&2; exit {code}"), Limits::default()), b"").await;
            let e = r.unwrap_err();
            assert_eq!(e.class, class, "{e}");
            assert!(e.message.ends_with("stderr: broken"), "{e}");
            assert!(!live.is_abnormal());
        }
    }

    #[tokio::test]
    async fn a_job_id_with_dot_dots_names_no_path_outside_the_sandbox() {
        let escape = std::env::temp_dir().join(format!("fairway-escape-{}", uuid::Uuid::now_v7().simple()));
        let job_id = format!("../../../../../../..{}", escape.display());
        let script =
            "printf stolen > \"$FAIRWAY_CHECKPOINT_FILE\"; echo checkpoint >&3; printf %s \"$FAIRWAY_CHECKPOINT_FILE\"";
        let s = spec(script, Limits::default());
        let root = s.sandbox_root.clone();
        let (r, _) = run_as(s, &job_id, b"").await;
        let path = String::from_utf8(r.unwrap()).unwrap();
        assert!(path.starts_with(&root.display().to_string()) && !path.contains(".."), "{path}");
        assert!(!escape.exists() && !escape.with_extension("ckpt").exists(), "nothing written outside the sandbox");
        assert!(!std::path::Path::new(&path).exists(), "the attempt's directory is removed after it");
    }

    #[tokio::test]
    async fn the_whole_tree_is_killed_when_the_leader_exits_normally() {
        let (r, _) = run(spec("setsid sleep 300 >/dev/null 2>&1 & echo $!", Limits::default()), b"").await;
        let pid: i32 = String::from_utf8(r.unwrap()).unwrap().trim().parse().unwrap();
        let alive = || std::fs::read_to_string(format!("/proc/{pid}/cmdline")).is_ok_and(|c| c.starts_with("sleep"));
        let mut gone = false;
        for _ in 0..50 {
            gone = !alive();
            if gone {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        if !gone {
            // SAFETY: kill(2) of the stray this test started.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        let cgroup = Enforcement::current().tree.is_ok();
        assert!(gone || !cgroup, "with a cgroup per attempt the setsid grandchild {pid} is gone");
    }

    #[tokio::test]
    async fn with_a_mount_namespace_a_child_sees_only_its_own_processes_and_its_own_tmp() {
        let e = Enforcement::current();
        if e.mountns.is_err() || e.uids.is_err() {
            eprintln!("no mount namespace or uid per attempt on this host: {:?}", e.mountns);
            return;
        }
        // Live processes only: earlier tests' children of the same uid may linger as
        // zombies here, where no reaper runs (a worker reaps them, `reaper`).
        let live = "for p in /proc/[0-9]*; do grep -qs '^State:.*Z' $p/status || echo $p; done | wc -l";
        let script = format!("ls /tmp; {live}; echo x > /tmp/mine; ls \"$FAIRWAY_SANDBOX_DIR\"");
        let (r, _) = run(spec(&script, Limits::default()), b"").await;
        let out = String::from_utf8(r.unwrap()).unwrap();
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines[0], "fairway-process-unit", "/tmp holds only the way to its own directory: {out}");
        let procs: usize = lines[1].trim().parse().unwrap();
        assert!(procs <= 4, "its /proc lists only its own uid's processes (sh, a subshell, grep, wc): {out}");
        assert_eq!(lines.get(2), None, "its private directory is empty at the start: {out}");
        assert!(!std::path::Path::new("/tmp/mine").exists(), "its /tmp is not the host's");
    }

    /// The host's SysV objects' keys (`/proc/sysvipc/{shm,sem,msg}`, first column).
    fn host_sysv_keys() -> Vec<String> {
        ["shm", "sem", "msg"]
            .iter()
            .flat_map(|f| {
                std::fs::read_to_string(format!("/proc/sysvipc/{f}"))
                    .unwrap_or_default()
                    .lines()
                    .skip(1)
                    .map(|l| l.split_whitespace().next().unwrap_or("").to_string())
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    #[tokio::test]
    async fn nothing_an_attempt_puts_in_dev_shm_var_tmp_or_sysv_ipc_outlives_it() {
        let e = Enforcement::current();
        if e.mountns.is_err() || e.uids.is_err() || e.ipcns.is_err() {
            eprintln!("no mount or IPC namespace or uid per attempt on this host: {:?} {:?}", e.mountns, e.ipcns);
            return;
        }
        let tag = uuid::Uuid::now_v7().simple().to_string();
        let host_file = format!("/dev/shm/host-{tag}");
        std::fs::write(&host_file, b"host").unwrap();
        let script = format!(
            "set -e; head -c 1048576 /dev/zero > /dev/shm/{tag}; head -c 1048576 /dev/zero > /var/tmp/{tag}; \
             ipcmk -M 65536 >/dev/null; ipcmk -S 1 >/dev/null; ipcmk -Q >/dev/null; \
             for f in shm sem msg; do tail -n +2 /proc/sysvipc/$f | awk '{{print \"key \" $1}}'; done; \
             ls /dev/shm /var/tmp"
        );
        let (r, _) = run(spec(&script, Limits::default()), b"").await;
        let out = String::from_utf8(r.unwrap()).unwrap();
        let _ = std::fs::remove_file(&host_file);
        let keys: Vec<&str> = out.lines().filter_map(|l| l.strip_prefix("key ")).collect();
        assert_eq!(keys.len(), 3, "the job made a segment, a semaphore set and a queue: {out}");
        assert!(!out.contains(&format!("host-{tag}")), "its /dev/shm is not the host's: {out}");
        assert_eq!(out.matches(tag.as_str()).count(), 2, "it wrote /dev/shm and /var/tmp: {out}");
        for path in [format!("/dev/shm/{tag}"), format!("/var/tmp/{tag}")] {
            assert!(!std::path::Path::new(&path).exists(), "{path} outlived the attempt");
        }
        let host = host_sysv_keys();
        for k in keys {
            assert!(!host.iter().any(|h| h == k), "SysV key {k} outlived the attempt on the host: {host:?}");
        }
    }

    #[tokio::test]
    async fn with_a_pid_namespace_a_child_is_pid_2_and_cannot_name_the_worker_even_by_number() {
        let e = Enforcement::current();
        if !e.pid_namespaces() || e.uids.is_err() {
            eprintln!("no pid namespace per attempt on this host: {:?}", e.pidns);
            return;
        }
        let me = std::process::id();
        let script = format!("echo $$; kill -0 {me} 2>&1; ls -d /proc/{me} 2>&1; exit 0");
        let (r, _) = run(spec(&script, Limits::default()), b"").await;
        let out = String::from_utf8(r.unwrap()).unwrap();
        assert_eq!(out.lines().next(), Some("2"), "the program is pid 2 of its own namespace (its init is 1): {out}");
        assert!(out.contains("kill: No such process"), "the worker's pid names no process there (ESRCH): {out}");
        assert!(out.contains(&format!("/proc/{me}': No such file")), "nor a /proc entry: {out}");
        // The outer waiter ends as the program did: a signal stays a signal.
        let (r, live) = run(spec("kill -KILL $$", Limits::default()), b"").await;
        assert!(r.unwrap_err().message.contains("signal 9"), "killed by SIGKILL");
        assert!(live.is_abnormal());
    }

    #[tokio::test]
    async fn progress_and_heartbeat_lines_reach_the_job_context() {
        let (r, live) = run(spec("echo 'progress 0.5 half way' >&3; echo heartbeat >&3", Limits::default()), b"").await;
        r.unwrap();
        assert_eq!(live.progress(), (0.5, "half way".to_string()));
        assert!(live.last_advance() > 0);
    }

    #[tokio::test]
    async fn output_past_its_limit_and_memory_past_its_limit_are_resource_kills() {
        let limits = Limits { output: Some(Bytes(10)), ..Limits::default() };
        let (r, live) = run(spec("head -c 100000 /dev/zero; sleep 30", limits), b"").await;
        let e = r.unwrap_err();
        assert_eq!(e.class, FailureClass::Resource, "{e}");
        assert!(e.message.contains("output limit 10B exceeded"), "{e}");
        assert!(live.is_abnormal(), "a kill counts toward the recycling cap");
        let limits = Limits { memory: Some(Bytes(32 << 20)), ..Limits::default() };
        // A shell variable doubling until it is killed.
        let (r, _) = run(spec("x=xxxxxxxx; while :; do x=\"$x$x\"; done", limits), b"").await;
        let e = r.unwrap_err();
        assert_eq!(e.class, FailureClass::Resource, "{e}");
        assert!(e.message.contains("memory limit 32MiB exceeded (peak "), "{e}");
    }

    #[tokio::test]
    async fn a_stop_request_sends_sigterm_then_sigkill_after_the_grace() {
        let (live_tx, live_rx) = tokio::sync::oneshot::channel();
        let job = JobSubmitted::original(uuid::Uuid::now_v7().to_string(), "acme".into(), "t".into(), vec![], 0);
        let live = Arc::new(JobLive::default());
        let ctx =
            JobContext::new(Arc::new(job), tokio::time::Instant::now() + Duration::from_secs(30), live.clone(), None);
        let _ = live_tx.send(());
        let started = std::time::Instant::now();
        let task = tokio::spawn(ProcessExecutor::new(spec("trap '' TERM; sleep 30", Limits::default())).run(ctx));
        live_rx.await.unwrap();
        tokio::time::sleep(Duration::from_millis(200)).await;
        live.cancel();
        let e = task.await.unwrap().unwrap_err();
        assert!(e.message.starts_with("stopped (cancelled) with SIGTERM"), "{e}");
        assert!(started.elapsed() < Duration::from_secs(10), "killed after the 500 ms grace");
        assert!(live.is_abnormal());
    }
}
