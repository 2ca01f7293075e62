//! Pooled mode (`mode = "pooled"`): long-lived children take a job type's jobs one
//! after another over the same protocol (the framing: `core::pooled`, docs/process-jobs.md
//! "Pooled mode"). A child has a one-shot attempt's confinement for its whole life (its
//! cgroup, uid, private directory, no network); each job runs in a private directory of
//! its own inside the child's and is watched under the job type's limits (the tree's
//! memory and processes counters, its CPU time since the job started, wall time, output,
//! control lines). A limit, a stop request (cancel, hand-off, stuck), a protocol error,
//! an exit or the `jobs_per_child`-th job ends the child with its whole cgroup; what a
//! job left running in the tree is killed when the job ends.
//!
//! A child serves one tenant for its whole life: idle children wait keyed by tenant (at
//! most the pool's `slots` per job type, the longest idle ended first, each ended after
//! `idle`), and a job of a tenant with no idle child starts a fresh one. So no job ever
//! runs in a process, directory or uid another tenant's job has used.

use super::{
    base_command, control, control_line, fsafe, job_vars, judge, prepare_checkpoint, reaper, sandbox, save_checkpoint,
    Confined, Spec, AFTER_EXIT, STDERR_TAIL,
};
use crate::core::checkpoint_pace::CheckpointPace;
use crate::core::limits::{self, Bytes, ChildEnd, LimitHit};
use crate::core::pooled::{self as framing, BadResult, JobEnd, ResultHead};
use crate::core::retry::DurationMs;
use crate::handlers::{HandlerError, HandlerResult, JobContext};
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::process::ChildStdin;
use tokio::time::Instant;

/// How long the worker waits, after a child's `result`, for its stdin frame to be
/// fully written: a child that answers without reading its whole job is out of step.
const FRAME_READ: Duration = Duration::from_millis(100);

/// A pooled job type's settings (`job_types.<name>.pooled`, the pool's `slots`).
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    pub jobs_per_child: u32,
    pub idle: Duration,
    pub max_idle: usize,
}

/// The idle children of one pooled job type.
#[derive(Default)]
pub struct Children {
    idle: Mutex<Vec<PooledChild>>,
    sweeper: AtomicBool,
}

impl Children {
    /// An idle child of `tenant`, if one waits.
    fn take(&self, tenant: &str) -> Option<PooledChild> {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        let i = idle.iter().position(|c| c.tenant == tenant)?;
        Some(idle.remove(i))
    }

    /// Puts a child back to wait for its tenant's next job; ends the longest idle one
    /// past `max_idle`, and (once) starts the sweeper ending children idle too long.
    fn put(self: &Arc<Self>, mut child: PooledChild, settings: Settings) {
        child.idle_since = Instant::now();
        let evicted = {
            let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
            idle.push(child);
            let over = idle.len().saturating_sub(settings.max_idle);
            idle.drain(..over).collect::<Vec<_>>()
        };
        for c in evicted {
            tokio::spawn(c.end());
        }
        if !self.sweeper.swap(true, Ordering::SeqCst) {
            tokio::spawn(sweep(Arc::downgrade(self), settings.idle));
        }
    }

    /// Removes the children idle for `idle` or longer.
    fn expired(&self, idle: Duration) -> Vec<PooledChild> {
        let mut list = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        let (old, keep): (Vec<_>, Vec<_>) = list.drain(..).partition(|c| c.idle_since.elapsed() >= idle);
        *list = keep;
        old
    }
}

/// Ends idle children past `idle` until the job type's executor is gone.
async fn sweep(children: Weak<Children>, idle: Duration) {
    let every = (idle / 4).clamp(Duration::from_millis(100), Duration::from_secs(5));
    loop {
        tokio::time::sleep(every).await;
        let Some(c) = children.upgrade() else { return };
        for child in c.expired(idle) {
            child.end().await;
        }
    }
}

/// One long-lived child and its confinement.
struct PooledChild {
    tenant: String,
    confined: Confined,
    child: tokio::process::Child,
    stdin: Option<ChildStdin>,
    lines: control::Lines,
    /// The tail of what it wrote to stdout and stderr (cleared at each job's start).
    tail: Arc<Mutex<Vec<u8>>>,
    jobs: u32,
    pid: u32,
    idle_since: Instant,
}

impl PooledChild {
    /// Kills the child and its whole tree, reaps it; the drop removes its directory,
    /// cgroup and uid.
    async fn end(mut self) {
        self.confined.end().await;
        let _ = tokio::time::timeout(AFTER_EXIT, self.child.wait()).await;
    }

    fn tail(&self) -> String {
        String::from_utf8_lossy(&self.tail.lock().unwrap_or_else(|e| e.into_inner())).trim().to_string()
    }
}

/// Starts a child for `ctx`'s tenant, confined like a one-shot attempt.
fn spawn(spec: &Spec, ctx: &JobContext) -> Result<PooledChild, HandlerError> {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let mut confined = Confined::new(spec, &format!("pooled-{}", SEQ.fetch_add(1, Ordering::Relaxed)))?;
    let (control_read, control_write) = sandbox::control_pipe()
        .map_err(|e| HandlerError::dependency(format!("cannot create the control pipe: {e}")))?;
    let mut cmd = base_command(spec, &confined.dir);
    cmd.env("FAIRWAY_MODE", "pooled")
        .env("FAIRWAY_TENANT", &ctx.job.tenant)
        .env("FAIRWAY_JOB_TYPE", &ctx.job.job_type)
        .env("TMPDIR", &confined.dir);
    let setup = confined.child_setup(spec)?;
    // SAFETY: the closure only makes async-signal-safe syscalls (see `sandbox::in_child`).
    unsafe {
        cmd.pre_exec(move || sandbox::in_child(&control_write, &setup));
    }
    let mut child = reaper::spawn_leader(&mut cmd).map_err(|e| {
        HandlerError::permanent(format!("cannot start {:?}: {e}; fix job_types.<type>.command", spec.argv[0]))
    })?;
    drop(cmd);
    let pid = child.id().unwrap_or(0);
    confined.pgid = pid;
    let pipe = tokio::net::unix::pipe::Receiver::from_owned_fd(control_read)
        .map_err(|e| HandlerError::dependency(format!("cannot read the control pipe: {e}")))?;
    let tail = Arc::new(Mutex::new(Vec::new()));
    if let Some(out) = child.stdout.take() {
        tokio::spawn(keep_tail(out, tail.clone()));
    }
    if let Some(err) = child.stderr.take() {
        tokio::spawn(keep_tail(err, tail.clone()));
    }
    Ok(PooledChild {
        tenant: ctx.job.tenant.clone(),
        confined,
        stdin: child.stdin.take(),
        child,
        lines: control::Lines::new(pipe),
        tail,
        jobs: 0,
        pid,
        idle_since: Instant::now(),
    })
}

/// Keeps the last `STDERR_TAIL` bytes a child writes to one of its outputs.
async fn keep_tail(mut out: impl AsyncRead + Unpin, tail: Arc<Mutex<Vec<u8>>>) {
    let mut chunk = [0u8; 4096];
    while let Ok(n) = out.read(&mut chunk).await {
        if n == 0 {
            break;
        }
        let mut t = tail.lock().unwrap_or_else(|e| e.into_inner());
        t.extend_from_slice(&chunk[..n]);
        if t.len() > STDERR_TAIL {
            let cut = t.len() - STDERR_TAIL;
            t.drain(..cut);
        }
    }
}

/// One job on a pooled child of its tenant (a fresh one if none waits).
pub async fn run(spec: &Spec, children: &Arc<Children>, ctx: &JobContext) -> HandlerResult {
    let settings = spec.pooled.expect("a pooled job type");
    let mut child = match children.take(&ctx.job.tenant) {
        Some(c) => c,
        None => spawn(spec, ctx)?,
    };
    child.jobs += 1;
    let job_dir = child.confined.dir.join(crate::core::sandbox::dir_name(&ctx.job.job_id, ctx.attempt.max(0) as u32));
    if let Err(e) = prepare_job_dir(ctx, &mut child, &job_dir).await {
        child.end().await;
        return Err(e);
    }
    let ran = one_job(spec, ctx, &mut child, &job_dir).await;
    let _ = std::fs::remove_dir_all(&job_dir);
    if let Some(tree) = &child.confined.tree {
        tree.kill_others(child.pid);
    }
    reaper::sweep();
    let tail = child.tail();
    let end = JobEnd {
        answered: ran.result.is_some() && ran.broken.is_none(),
        read_all_input: ran.read_all_input,
        ended: ran.hit.is_some() || ran.stopped.is_some() || ran.status.is_some(),
        jobs: child.jobs,
    };
    if framing::keep_child(end, settings.jobs_per_child) {
        children.put(child, settings);
    } else {
        child.end().await;
    }
    tracing::debug!(job_id = %ctx.job.job_id, peak_memory = ran.peak, cpu_ms = ran.cpu_ms, jobs = end.jobs, "pooled job ended");
    verdict(spec, ctx, ran, tail)
}

/// The job's own 0700 directory inside the child's (owned by the child's uid), with
/// its last checkpoint if it has one.
/// Makes the job's directory inside the child's (which the running child can write):
/// made and filled by this process through descriptors (`fsafe`), given to the child's
/// uid last, so nothing the child swaps in meanwhile is written, chmodded or chowned.
async fn prepare_job_dir(ctx: &JobContext, child: &mut PooledChild, dir: &Path) -> Result<(), HandlerError> {
    let io = |e: std::io::Error| HandlerError::dependency(format!("cannot prepare the job's directory: {e}"));
    let name = dir.file_name().and_then(|n| n.to_str()).ok_or_else(|| io(std::io::ErrorKind::InvalidInput.into()))?;
    let parent = fsafe::Dir::open(&child.confined.dir).map_err(io)?;
    let _ = std::fs::remove_dir_all(dir);
    let job_dir = parent.make_private(name).map_err(io)?;
    child.confined.checkpoint_file = dir.join(super::CHECKPOINT_FILE);
    prepare_checkpoint(ctx, &job_dir, &child.confined).await?;
    if let Some(u) = &child.confined.uid {
        job_dir.chown(u.uid).map_err(io)?;
    }
    Ok(())
}

/// How one pooled job went.
#[derive(Default)]
struct Ran {
    /// The exit code and output of its `result`.
    result: Option<(i32, Vec<u8>)>,
    /// The child's exit during the job.
    status: Option<std::process::ExitStatus>,
    hit: Option<LimitHit>,
    /// The protocol error that ended the child.
    broken: Option<String>,
    stopped: Option<&'static str>,
    read_all_input: bool,
    peak: u64,
    cpu_ms: i64,
}

/// What the watch loop waits for on fd 3: a line, or the output a `result` announced.
enum Item {
    Line(Result<Option<String>, control::Overlong>),
    Output(Option<Vec<u8>>),
}

/// Hands the job to the child and watches it until its `result`, its exit or a kill.
async fn one_job(spec: &Spec, ctx: &JobContext, c: &mut PooledChild, job_dir: &Path) -> Ran {
    let live = ctx.live();
    let mut ran = Ran::default();
    if let Some(tree) = &c.confined.tree {
        tree.reset_peak();
    }
    let cpu_base = cpu_now(c);
    c.tail.lock().unwrap_or_else(|e| e.into_inner()).clear();
    let writer = tokio::spawn(write_frame(c.stdin.take(), frame(ctx, job_dir, &c.confined.checkpoint_file)));
    let mut pace = CheckpointPace::default();
    let wall = spec.limits.wall_time.map(|d| Instant::now() + Duration::from_millis(d.0 as u64));
    let mut tick = tokio::time::interval(sandbox::WATCH_INTERVAL);
    let mut term_at: Option<Instant> = None;
    let mut want: Option<ResultHead> = None;
    let mut control_open = true;
    let pid = c.pid;
    let kill = |ran: &mut Ran, hit: Option<LimitHit>, broken: Option<String>| {
        if ran.hit.is_none() && ran.broken.is_none() {
            ran.hit = hit;
            ran.broken = broken;
            sandbox::signal_group(pid, libc::SIGKILL);
        }
    };
    loop {
        tokio::select! {
            status = c.child.wait() => {
                ran.status = Some(status.unwrap_or_else(|_| std::process::ExitStatus::from_raw(libc::SIGKILL)));
                break;
            }
            item = next_item(&mut c.lines, want), if control_open => match item {
                Item::Output(Some(out)) => {
                    ran.result = want.map(|h| (h.code, out));
                    break;
                }
                Item::Line(Ok(Some(line))) => match framing::parse_result(&line, spec.output_cap) {
                    Some(Ok(head)) => want = Some(head),
                    Some(Err(BadResult::OverCap { .. })) => {
                        kill(&mut ran, Some(LimitHit::Output { limit: Bytes(spec.output_cap) }), None);
                    }
                    Some(Err(BadResult::Malformed(why))) => kill(&mut ran, None, Some(why)),
                    None => {
                        if let Some(state) = control_line(spec, ctx, &c.confined, &line).await {
                            if let Some(now) = pace.offer(crate::now_ms(), state) {
                                save_checkpoint(ctx, &now).await;
                            }
                        }
                    }
                },
                Item::Line(Err(control::Overlong)) => {
                    control_open = false;
                    kill(&mut ran, Some(LimitHit::Control { limit: limits::CONTROL_LINE_MAX }), None);
                }
                Item::Line(Ok(None)) | Item::Output(None) => {
                    control_open = false;
                    kill(&mut ran, None, Some("fd 3 closed before the job's result".into()));
                }
            },
            _ = tokio::time::sleep_until(wall.unwrap_or_else(super::far_future)), if wall.is_some() && ran.hit.is_none() => {
                kill(&mut ran, Some(LimitHit::WallTime { limit: spec.limits.wall_time.unwrap_or_default() }), None);
            }
            _ = tick.tick() => {
                if let Some(hit) = sample(spec, c, cpu_base, &mut ran) {
                    kill(&mut ran, Some(hit), None);
                }
                if let Some(state) = pace.due(crate::now_ms()) {
                    save_checkpoint(ctx, &state).await;
                }
                if let (None, Some(why)) = (ran.stopped, live.stop_reason()) {
                    ran.stopped = Some(super::stop_name(why));
                    sandbox::signal_group(pid, libc::SIGTERM);
                    term_at = Some(Instant::now());
                }
                if term_at.is_some_and(|t| t.elapsed() >= spec.kill_grace) {
                    live.mark_abnormal();
                    sandbox::signal_group(pid, libc::SIGKILL);
                    term_at = None;
                }
            }
        }
    }
    if ran.status.is_some() {
        // Exited: its last reports (the checkpoint before a hand-off) are in the pipe.
        c.confined.end().await;
        let _ = tokio::time::timeout(AFTER_EXIT, async {
            while let Ok(Some(line)) = c.lines.next_line().await {
                if let Some(state) = control_line(spec, ctx, &c.confined, &line).await {
                    pace.offer(crate::now_ms(), state);
                }
            }
        })
        .await;
    }
    if let Some(state) = pace.flush() {
        save_checkpoint(ctx, &state).await;
    }
    sample(spec, c, cpu_base, &mut ran);
    if let Some(tree) = &c.confined.tree {
        ran.hit = ran.hit.or(limits::tree_hit(&spec.limits, tree.usage().counts, Bytes(ran.peak)));
    }
    ran.read_all_input = match tokio::time::timeout(FRAME_READ, writer).await {
        Ok(Ok(Some(stdin))) if ran.result.is_some() => {
            c.stdin = Some(stdin);
            true
        }
        _ => false,
    };
    ran
}

/// The next line on fd 3, or the `want`ed output once a `result` line announced it.
async fn next_item(lines: &mut control::Lines, want: Option<ResultHead>) -> Item {
    match want {
        Some(head) => Item::Output(lines.next_bytes(head.len as usize).await),
        None => Item::Line(lines.next_line().await),
    }
}

/// `job <header bytes> <payload bytes>\n`, the header (the job's variables as a JSON
/// object), the payload.
fn frame(ctx: &JobContext, job_dir: &Path, checkpoint_file: &Path) -> Vec<u8> {
    let vars: serde_json::Map<String, serde_json::Value> =
        job_vars(ctx, job_dir, checkpoint_file).into_iter().map(|(k, v)| (k.to_string(), v.into())).collect();
    let header = serde_json::to_vec(&vars).unwrap_or_default();
    let payload = &ctx.job.payload;
    let mut f = framing::job_head(header.len(), payload.len()).into_bytes();
    f.extend_from_slice(&header);
    f.extend_from_slice(payload);
    f
}

/// Writes the frame; the stdin back if all of it went in.
async fn write_frame(stdin: Option<ChildStdin>, frame: Vec<u8>) -> Option<ChildStdin> {
    let mut stdin = stdin?;
    stdin.write_all(&frame).await.ok()?;
    stdin.flush().await.ok()?;
    Some(stdin)
}

/// The child's CPU time so far (its tree's, else its own).
fn cpu_now(c: &PooledChild) -> i64 {
    match &c.confined.tree {
        Some(tree) => tree.usage().cpu_ms,
        None => sandbox::sample(c.pid).map_or(0, |s| s.cpu_ms),
    }
}

/// Reads the tree's (or the leader's) memory and this job's CPU time into `ran`; the
/// limit they say is crossed, if any.
fn sample(spec: &Spec, c: &PooledChild, cpu_base: i64, ran: &mut Ran) -> Option<LimitHit> {
    let (peak, cpu, over_memory, counts) = match &c.confined.tree {
        Some(tree) => {
            let u = tree.usage();
            (u.peak_bytes, u.cpu_ms, false, Some(u.counts))
        }
        None => {
            let s = sandbox::sample(c.pid)?;
            (s.rss_bytes, s.cpu_ms, spec.limits.memory.is_some_and(|l| s.rss_bytes > l.0), None)
        }
    };
    ran.peak = ran.peak.max(peak);
    ran.cpu_ms = ran.cpu_ms.max(cpu - cpu_base);
    let memory =
        spec.limits.memory.filter(|_| over_memory).map(|limit| LimitHit::Memory { limit, peak: Bytes(ran.peak) });
    let cpu_hit = spec
        .limits
        .cpu_time
        .filter(|l| ran.cpu_ms > l.0)
        .map(|limit| LimitHit::CpuTime { limit, used: DurationMs(ran.cpu_ms) });
    counts.and_then(|n| limits::tree_hit(&spec.limits, n, Bytes(ran.peak))).or(memory).or(cpu_hit)
}

/// The job's outcome from how it went.
fn verdict(spec: &Spec, ctx: &JobContext, ran: Ran, tail: String) -> HandlerResult {
    if !tail.is_empty() && (ran.hit.is_some() || ran.broken.is_some() || !matches!(ran.result, Some((0, _)))) {
        tracing::info!(job_id = %ctx.job.job_id, tenant = %ctx.job.tenant, output = %tail, "stdout and stderr of a failed pooled job");
    }
    let shown = if spec.stderr_in_error { format!("; output: {tail}") } else { String::new() };
    if let (None, None, Some(why)) = (ran.hit, ran.stopped, &ran.broken) {
        return Err(HandlerError::app(format!("the pooled child broke the protocol ({why}); it was replaced{shown}")));
    }
    let (code, signal, output) = match (ran.result, ran.status) {
        (Some((code, out)), _) => (Some(code), None, out),
        (None, Some(st)) if st.code() == Some(0) && ran.hit.is_none() && ran.stopped.is_none() => {
            return Err(HandlerError::app(format!("the pooled child exited (code 0) before its result line{shown}")));
        }
        (None, Some(st)) => (st.code(), st.signal(), Vec::new()),
        (None, None) => (None, Some(libc::SIGKILL), Vec::new()),
    };
    let end = ChildEnd {
        code,
        signal,
        hit: ran.hit,
        cpu_used: DurationMs(ran.cpu_ms),
        cpu_limit: None,
        peak_memory: Bytes(ran.peak),
        stderr_tail: if spec.stderr_in_error { tail } else { String::new() },
    };
    judge(ctx.live(), &end, ran.stopped, output)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::limits::Limits;
    use crate::handlers::{Handler, JobLive};
    use crate::model::{FailureClass, JobSubmitted};

    /// A pooled job type running tests/fixtures/process/pooled.py.
    fn executor(limits: Limits, jobs_per_child: u32) -> super::super::ProcessExecutor {
        let python = if Path::new("/usr/bin/python3").exists() { "/usr/bin/python3" } else { "python3" };
        super::super::ProcessExecutor::new(Spec {
            argv: vec![python.into(), concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/process/pooled.py").into()],
            cwd: None,
            env: vec![("PATH".into(), std::env::var("PATH").unwrap_or_default())],
            limits,
            output_cap: limits.output_cap(1 << 20),
            max_checkpoint: 1 << 20,
            kill_grace: Duration::from_millis(500),
            sandbox_root: std::env::temp_dir().join("fairway-pooled-unit"),
            network: false,
            stderr_in_error: true,
            pooled: Some(Settings { jobs_per_child, idle: Duration::from_secs(30), max_idle: 4 }),
        })
    }

    async fn job(x: &super::super::ProcessExecutor, tenant: &str, payload: &str) -> (HandlerResult, Arc<JobLive>) {
        let id = uuid::Uuid::now_v7().to_string();
        let job = JobSubmitted::original(id, tenant.into(), "t".into(), payload.as_bytes().to_vec(), 0);
        let live = Arc::new(JobLive::default());
        let ctx = JobContext::new(Arc::new(job), Instant::now() + Duration::from_secs(30), live.clone(), None);
        (x.run(ctx).await, live)
    }

    async fn text(x: &super::super::ProcessExecutor, tenant: &str, payload: &str) -> String {
        let (r, _) = job(x, tenant, payload).await;
        String::from_utf8(r.unwrap_or_else(|e| panic!("{payload}: {e}"))).unwrap()
    }

    #[tokio::test]
    async fn jobs_of_one_tenant_run_one_after_another_on_one_child() {
        let x = executor(Limits::default(), 100);
        let first = text(&x, "acme", "pid").await;
        let (r, live) = job(&x, "acme", "echo hello there").await;
        assert_eq!(r.unwrap(), b"hello there");
        assert_eq!(live.progress().0, 0.5, "control lines reach the job's context");
        assert_eq!(text(&x, "acme", "pid").await, first, "the same child took the next jobs");
    }

    #[tokio::test]
    async fn a_limit_kills_only_that_jobs_child_and_the_next_job_gets_a_fresh_one() {
        let x = executor(Limits { memory: Some(Bytes(64 << 20)), ..Limits::default() }, 100);
        let before = text(&x, "acme", "pid").await;
        let (r, live) = job(&x, "acme", "hog").await;
        let e = r.unwrap_err();
        assert_eq!(e.class, FailureClass::Resource, "{e}");
        assert!(e.message.contains("memory limit 64MiB exceeded"), "{e}");
        assert!(live.is_abnormal());
        let after = text(&x, "acme", "pid").await;
        assert_ne!(after, before, "a fresh child after the kill");
        assert!(!Path::new(&format!("/proc/{before}")).exists(), "the killed child is gone");
    }

    #[tokio::test]
    async fn another_tenants_job_never_sees_what_a_tenants_job_left() {
        let x = executor(Limits::default(), 100);
        let pid = text(&x, "acme", "leave s3cret").await;
        let same: serde_json::Value = serde_json::from_str(&text(&x, "acme", "look").await).unwrap();
        assert_eq!(same["kept"], "s3cret", "the same tenant's next job runs in the same child: {same}");
        let other: serde_json::Value = serde_json::from_str(&text(&x, "globex", "look").await).unwrap();
        assert_ne!(other["pid"].to_string(), pid, "another tenant gets a child of its own: {other}");
        assert_eq!((&other["env"], &other["kept"]), (&serde_json::Value::Null, &serde_json::Value::Null), "{other}");
        let tmp = other["tmp"].as_array().unwrap();
        assert!(!tmp.iter().any(|f| f == "left-behind"), "no file of the other tenant's child: {other}");
    }

    #[tokio::test]
    async fn a_protocol_error_or_the_jobs_per_child_th_job_replaces_the_child() {
        let x = executor(Limits::default(), 2);
        let a = text(&x, "acme", "pid").await;
        assert_eq!(text(&x, "acme", "pid").await, a);
        let b = text(&x, "acme", "pid").await;
        assert_ne!(b, a, "replaced after 2 jobs");
        let (r, _) = job(&x, "acme", "garbage").await;
        let e = r.unwrap_err();
        assert!(e.message.contains("broke the protocol") && e.message.contains("banana"), "{e}");
        let (r, _) = job(&x, "acme", "exit").await;
        let e = r.unwrap_err().message;
        assert!(e.contains("before its result line") || e.contains("fd 3 closed before the job's result"), "{e}");
        let (r, _) = job(&x, "acme", "fail").await;
        assert_eq!(r.unwrap_err().class, FailureClass::AppError);
        assert_ne!(text(&x, "acme", "pid").await, b);
    }
}
