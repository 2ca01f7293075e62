//! The `process` executor: each attempt of a job type with `handler = "process"` runs
//! its `command` as a child process, isolated from the worker by limits
//! (`core::limits`, enforced as `sandbox` says). The payload goes to the child's stdin,
//! its stdout (capped) is the output, the tail of its stderr goes into the error; its
//! exit code is its verdict. The job's identity and a checkpoint file path are in its
//! environment; it reports progress, checkpoints and heartbeats as lines on fd 3. The
//! protocol is in docs/process-jobs.md.
//!
//! Cancel, drain (hand-off) and the stuck detector send SIGTERM to the child's process
//! group, then SIGKILL after `kill_grace`. A job dropped by the worker (aborted) takes its
//! child's group with it.

mod sandbox;

pub use sandbox::{Enforcement, CONTROL_FD};

use super::{Handler, HandlerError, HandlerResult, JobContext, JobLive};
use crate::config::Config;
use crate::core::limits::{self, Bytes, ChildEnd, LimitHit, Limits, Verdict};
use crate::core::retry::DurationMs;
use futures::future::BoxFuture;
use futures::FutureExt;
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};

/// Bytes of stderr kept (its tail goes into the error message).
const STDERR_TAIL: usize = 2048;
/// How long the worker waits for a child's last control lines and output after it exits
/// (a grandchild that keeps the pipes open must not hold the slot).
const AFTER_EXIT: Duration = Duration::from_secs(2);

/// Everything an attempt needs, fixed at start-up from the job type's configuration.
#[derive(Debug, Clone)]
pub struct Spec {
    pub argv: Vec<String>,
    pub cwd: Option<PathBuf>,
    /// The allow-listed variables of the worker's environment, as they were at start-up.
    pub env: Vec<(String, String)>,
    pub limits: Limits,
    /// Bytes of stdout kept as the output (see `Limits::output_cap`).
    pub output_cap: u64,
    /// Largest checkpoint accepted from the child (`worker.max_payload_bytes`).
    pub max_checkpoint: u64,
    pub kill_grace: Duration,
    /// Where checkpoint files live (one per running job, removed after the attempt).
    pub checkpoint_dir: PathBuf,
}

impl Spec {
    pub fn from_config(cfg: &Config, job_type: &str, _enforcement: &Enforcement) -> Result<Spec, String> {
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
        Ok(Spec {
            argv,
            cwd: jt.cwd.as_ref().map(PathBuf::from),
            env: jt.env.iter().filter_map(|k| std::env::var(k).ok().map(|v| (k.clone(), v))).collect(),
            limits,
            output_cap: limits.output_cap(cfg.worker.max_payload_bytes),
            max_checkpoint: cfg.worker.max_payload_bytes as u64,
            kill_grace: cfg.kill_grace(job_type),
            checkpoint_dir: std::env::temp_dir().join(format!("fairway-checkpoints-{}", std::process::id())),
        })
    }
}

/// Runs a job type's attempts as child processes.
pub struct ProcessExecutor {
    spec: Arc<Spec>,
}

impl ProcessExecutor {
    pub fn new(spec: Spec) -> Self {
        ProcessExecutor { spec: Arc::new(spec) }
    }
}

impl Handler for ProcessExecutor {
    fn run(&self, ctx: JobContext) -> BoxFuture<'static, HandlerResult> {
        let spec = self.spec.clone();
        async move { attempt(&spec, &ctx).await }.boxed()
    }
}

/// Kills the child's process group if the attempt is dropped before the child ended.
struct GroupGuard {
    pgid: u32,
    ended: bool,
}

impl Drop for GroupGuard {
    fn drop(&mut self) {
        if !self.ended {
            sandbox::signal_group(self.pgid, libc::SIGKILL);
        }
    }
}

/// One attempt: spawn, feed, watch, collect, judge.
async fn attempt(spec: &Spec, ctx: &JobContext) -> HandlerResult {
    let job = &ctx.job;
    let checkpoint_file = spec.checkpoint_dir.join(format!("{}.ckpt", job.job_id));
    prepare_checkpoint(ctx, &spec.checkpoint_dir, &checkpoint_file).await?;
    let (control_read, control_write) = sandbox::control_pipe()
        .map_err(|e| HandlerError::dependency(format!("cannot create the control pipe: {e}")))?;
    let mut cmd = command(spec, ctx, &checkpoint_file);
    let child_limits = sandbox::ChildLimits {
        cpu_secs: spec.limits.cpu_time.map(|d| (d.0.max(1) as u64).div_ceil(1000)),
        open_files: spec.limits.open_files,
    };
    // SAFETY: the closure only makes async-signal-safe syscalls (see `sandbox::in_child`).
    unsafe {
        cmd.pre_exec(move || sandbox::in_child(&control_write, child_limits));
    }
    let mut child = cmd.spawn().map_err(|e| {
        HandlerError::permanent(format!("cannot start {:?}: {e}; fix job_types.<type>.command", spec.argv[0]))
    })?;
    drop(cmd); // closes our copy of the control pipe's write end (moved into the closure)
    let pid = child.id().unwrap_or(0);
    let mut guard = GroupGuard { pgid: pid, ended: false };
    let control = tokio::net::unix::pipe::Receiver::from_owned_fd(control_read)
        .map_err(|e| HandlerError::dependency(format!("cannot read the control pipe: {e}")))?;
    let mut stdin = child.stdin.take().expect("piped stdin");
    let payload = job.payload.clone();
    tokio::spawn(async move {
        // A child that does not read its stdin closes it: not our problem.
        let _ = stdin.write_all(&payload).await;
    });
    let overflow = Arc::new(AtomicBool::new(false));
    let stdout =
        tokio::spawn(read_capped(child.stdout.take().expect("piped stdout"), spec.output_cap, overflow.clone()));
    let stderr = tokio::spawn(read_tail(child.stderr.take().expect("piped stderr")));
    let mut lines = tokio::io::BufReader::new(control).lines();
    let watched = watch(spec, ctx, &mut child, &mut lines, &overflow, pid).await;
    guard.ended = true;
    // Reports written just before the exit (the last checkpoint before a hand-off).
    let _ = tokio::time::timeout(AFTER_EXIT, async {
        while let Ok(Some(line)) = lines.next_line().await {
            control_line(spec, ctx, &checkpoint_file, &line).await;
        }
    })
    .await;
    let output = join_or_default(stdout).await;
    let stderr_tail = join_or_default(stderr).await;
    let _ = tokio::fs::remove_file(&checkpoint_file).await;
    let Watched { status, mut hit, peak, cpu_ms, stopped } = watched?;
    if overflow.load(Ordering::SeqCst) && hit.is_none() {
        hit = Some(LimitHit::Output { limit: Bytes(spec.output_cap) });
    }
    let end = ChildEnd {
        code: status.code(),
        signal: status.signal(),
        hit,
        cpu_used: DurationMs(cpu_ms),
        cpu_limit: spec.limits.cpu_time,
        peak_memory: Bytes(peak),
        stderr_tail: String::from_utf8_lossy(&stderr_tail).into_owned(),
    };
    judge(ctx.live(), &end, stopped, output)
}

/// The verdict on an ended child, told to the worker through the job's live state.
fn judge(live: &JobLive, end: &ChildEnd, stopped: Option<&'static str>, output: Vec<u8>) -> HandlerResult {
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
fn command(spec: &Spec, ctx: &JobContext, checkpoint_file: &std::path::Path) -> tokio::process::Command {
    let job = &ctx.job;
    let mut cmd = tokio::process::Command::new(&spec.argv[0]);
    cmd.args(&spec.argv[1..]).env_clear().envs(spec.env.iter().map(|(k, v)| (k, v)));
    if let Some(dir) = &spec.cwd {
        cmd.current_dir(dir);
    }
    let (traceparent, tracestate) = ctx.trace_context();
    cmd.env("FAIRWAY_JOB_ID", &job.job_id)
        .env("FAIRWAY_TENANT", &job.tenant)
        .env("FAIRWAY_JOB_TYPE", &job.job_type)
        .env("FAIRWAY_ATTEMPT", ctx.attempt.to_string())
        .env("FAIRWAY_GENERATION", job.generation.to_string())
        .env("FAIRWAY_FIRST_ATTEMPT", if ctx.first_attempt() { "1" } else { "0" })
        .env("FAIRWAY_CRASH_COUNT", job.crash_count.to_string())
        .env("FAIRWAY_HANDOFF_COUNT", job.handoff_count.to_string())
        .env("FAIRWAY_REPLAY_COUNT", job.replay_count.to_string())
        .env("FAIRWAY_CHECKPOINT_FILE", checkpoint_file)
        .env("FAIRWAY_CONTROL_FD", CONTROL_FD.to_string());
    if let Some(tp) = traceparent {
        cmd.env("TRACEPARENT", tp);
    }
    if let Some(ts) = tracestate {
        cmd.env("TRACESTATE", ts);
    }
    cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).process_group(0);
    cmd
}

/// Writes the job's last checkpoint (if any) where the child will look for it.
async fn prepare_checkpoint(
    ctx: &JobContext,
    dir: &std::path::Path,
    file: &std::path::Path,
) -> Result<(), HandlerError> {
    let io = |e: std::io::Error| HandlerError::dependency(format!("cannot prepare the checkpoint file: {e}"));
    tokio::fs::create_dir_all(dir).await.map_err(io)?;
    match ctx.load_checkpoint().await {
        Ok(Some(state)) => tokio::fs::write(file, state).await.map_err(io),
        Ok(None) => match tokio::fs::remove_file(file).await {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(io(e)),
            _ => Ok(()),
        },
        Err(e) => Err(HandlerError::dependency(format!("cannot read the checkpoint: {e}"))),
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

/// Waits for the child while relaying its control lines and enforcing the limits the
/// kernel does not: memory (watchdog), wall time, output size, stop requests.
async fn watch(
    spec: &Spec,
    ctx: &JobContext,
    child: &mut tokio::process::Child,
    lines: &mut tokio::io::Lines<tokio::io::BufReader<tokio::net::unix::pipe::Receiver>>,
    overflow: &AtomicBool,
    pid: u32,
) -> Result<Watched, HandlerError> {
    let checkpoint_file = spec.checkpoint_dir.join(format!("{}.ckpt", ctx.job.job_id));
    let live = ctx.live();
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
            status = child.wait() => {
                w.status = status.map_err(|e| HandlerError::dependency(format!("cannot wait for the child: {e}")))?;
                return Ok(w);
            }
            line = lines.next_line(), if control_open => match line {
                Ok(Some(line)) => control_line(spec, ctx, &checkpoint_file, &line).await,
                _ => control_open = false,
            },
            _ = tokio::time::sleep_until(wall.unwrap_or_else(far_future)), if wall.is_some() && w.hit.is_none() => {
                kill_now(&mut w, LimitHit::WallTime { limit: spec.limits.wall_time.unwrap_or_default() });
            }
            _ = tick.tick() => {
                if let Some(s) = sandbox::sample(pid) {
                    w.peak = w.peak.max(s.hwm_bytes).max(s.rss_bytes);
                    w.cpu_ms = w.cpu_ms.max(s.cpu_ms);
                    if let Some(limit) = spec.limits.memory.filter(|l| s.rss_bytes > l.0) {
                        let peak = Bytes(w.peak);
                        kill_now(&mut w, LimitHit::Memory { limit, peak });
                    }
                }
                if overflow.load(Ordering::SeqCst) {
                    kill_now(&mut w, LimitHit::Output { limit: Bytes(spec.output_cap) });
                }
                if let (None, Some(why)) = (w.stopped, live.stop_reason()) {
                    w.stopped = Some(match why {
                        super::StopReason::Cancelled => "cancelled",
                        super::StopReason::ShuttingDown => "hand-off",
                        super::StopReason::Stuck => "stuck",
                    });
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

fn far_future() -> tokio::time::Instant {
    tokio::time::Instant::now() + Duration::from_secs(86_400 * 365)
}

/// One control line from the child (docs/process-jobs.md):
/// `progress <fraction> [message]`, `checkpoint [state]`, `heartbeat`.
async fn control_line(spec: &Spec, ctx: &JobContext, checkpoint_file: &std::path::Path, line: &str) {
    let (verb, rest) = line.trim_end_matches('\r').split_once(' ').unwrap_or((line.trim(), ""));
    match verb {
        "progress" => {
            let (fraction, message) = rest.split_once(' ').unwrap_or((rest, ""));
            match fraction.parse::<f64>() {
                Ok(f) if f.is_finite() => ctx.progress(f, message.chars().take(200).collect::<String>()),
                _ => tracing::debug!(job_id = %ctx.job.job_id, line, "progress line without a number; ignored"),
            }
        }
        "heartbeat" => ctx.heartbeat(),
        "checkpoint" => {
            let state = if rest.is_empty() {
                match tokio::fs::read(checkpoint_file).await {
                    Ok(b) => b,
                    Err(e) => {
                        tracing::warn!(job_id = %ctx.job.job_id, error = %e, "checkpoint line but no readable checkpoint file");
                        return;
                    }
                }
            } else {
                rest.as_bytes().to_vec()
            };
            if state.len() as u64 > spec.max_checkpoint {
                tracing::warn!(job_id = %ctx.job.job_id, bytes = state.len(), "checkpoint over worker.max_payload_bytes; ignored");
                return;
            }
            if let Err(e) = ctx.checkpoint(&state).await {
                tracing::warn!(job_id = %ctx.job.job_id, error = %e, "could not save the child's checkpoint");
            }
        }
        _ => tracing::debug!(job_id = %ctx.job.job_id, line, "unknown control line; ignored"),
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
            checkpoint_dir: std::env::temp_dir().join("fairway-process-unit"),
        }
    }

    async fn run(spec: Spec, payload: &[u8]) -> (HandlerResult, Arc<JobLive>) {
        let job =
            JobSubmitted::original(uuid::Uuid::now_v7().to_string(), "acme".into(), "t".into(), payload.to_vec(), 0);
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
