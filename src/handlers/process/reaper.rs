//! No zombies, no strays: the worker is a child subreaper, so a job's orphans (a
//! grandchild whose parent exited, a `setsid` daemon) become the worker's children
//! rather than PID 1's, and are reaped here once dead. Only orphans of jobs are reaped:
//! zombies in a `fairway-` attempt cgroup, or any zombie child when the worker is PID 1
//! (its image's init); a job's leader is the executor's to wait for (tokio), and other
//! children of an embedding program are left to it.

use std::collections::HashSet;
use std::sync::Mutex;

/// Leaders being spawned or waited for by the executor: never reaped here. Held while
/// spawning, so a leader that exits at once is registered before a sweep can see it.
static LEADERS: Mutex<Option<HashSet<u32>>> = Mutex::new(None);

/// Makes this process the subreaper of its descendants (once, at start-up).
pub fn become_subreaper() -> std::io::Result<()> {
    // SAFETY: prctl with integer arguments on this process.
    let rc = unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Spawns a job's leader, registered before any sweep can see it.
pub fn spawn_leader(cmd: &mut tokio::process::Command) -> std::io::Result<tokio::process::Child> {
    let mut leaders = LEADERS.lock().unwrap_or_else(|e| e.into_inner());
    let child = cmd.spawn()?;
    if let Some(pid) = child.id() {
        leaders.get_or_insert_with(HashSet::new).insert(pid);
    }
    Ok(child)
}

/// The executor has waited for this leader.
pub fn leader_done(pid: u32) {
    if let Some(l) = LEADERS.lock().unwrap_or_else(|e| e.into_inner()).as_mut() {
        l.remove(&pid);
    }
}

/// Reaps the dead orphans of jobs among this process's children; how many.
pub fn sweep() -> usize {
    let leaders = LEADERS.lock().unwrap_or_else(|e| e.into_inner());
    let init = std::process::id() == 1;
    let mut reaped = 0;
    for pid in children() {
        if leaders.as_ref().is_some_and(|l| l.contains(&pid)) || !is_zombie(pid) {
            continue;
        }
        let from_a_job = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).is_ok_and(|c| c.contains("/fairway-"));
        if init || from_a_job {
            let mut status = 0;
            // SAFETY: waitpid on one zombie child of ours, without blocking.
            if unsafe { libc::waitpid(pid as i32, &mut status, libc::WNOHANG) } == pid as i32 {
                reaped += 1;
            }
        }
    }
    reaped
}

/// This process's children (every thread's: an orphan is given to one of them).
fn children() -> Vec<u32> {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else { return Vec::new() };
    tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("children")).ok())
        .flat_map(|c| c.split_whitespace().filter_map(|p| p.parse().ok()).collect::<Vec<u32>>())
        .collect()
}

fn is_zombie(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(')').map(|(_, rest)| rest.trim_start().starts_with('Z')))
        .unwrap_or(false)
}
