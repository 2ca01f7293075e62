//! `fairway status ID --follow`: live progress of one job until it ends, from the store
//! (the job's row, its heartbeat and its event history), redrawn every 500 ms.

use fairway::config::Config;
use fairway::core::events::JobState;
use fairway::model::JobEvent;
use fairway::store::Store;
use std::collections::HashSet;
use std::io::{IsTerminal, Write};
use std::process::ExitCode;
use std::time::{Duration, Instant};

/// How long a job may be unknown (no row, no events) before following gives up.
const UNKNOWN_GRACE: Duration = Duration::from_secs(10);

fn bar(p: f64, width: usize) -> String {
    let p = p.clamp(0.0, 1.0);
    let full = (p * width as f64).round() as usize;
    format!("[{}{}] {:>3.0}%", "#".repeat(full), "-".repeat(width - full), p * 100.0)
}

pub async fn follow(cfg: &Config, job_id: &str, json: bool, timeout: Duration) -> anyhow::Result<ExitCode> {
    let store = Store::open(cfg).await?;
    let stmts = store.event_statements().await?;
    let tty = std::io::stdout().is_terminal() && !json;
    let start = Instant::now();
    let mut seen: HashSet<String> = HashSet::new();
    let mut last_line = String::new();
    loop {
        let (row, hb, history) =
            tokio::try_join!(store.job_direct(job_id), store.heartbeat(job_id), stmts.events(job_id, None))?;
        let history = fairway::core::events::with_submission(
            history,
            row.as_ref().and_then(fairway::store::JobRow::submitted_state),
        );
        let new: Vec<&JobEvent> = history.iter().filter(|e| seen.insert(e.event_id.clone())).collect();
        let state = row
            .as_ref()
            .and_then(|r| JobState::from_status(r.status.as_deref()?))
            .or_else(|| fairway::core::events::fold(&history));
        if json {
            for e in &new {
                println!("{}", serde_json::to_string(e)?);
            }
        } else {
            for e in new.iter().filter(|e| e.kind != fairway::model::EventKind::Progress) {
                let detail = e.message.clone().unwrap_or_default();
                if tty && !last_line.is_empty() {
                    print!("\r{}\r", " ".repeat(last_line.chars().count()));
                }
                println!("{:>13}  {}  {}", e.kind.as_str(), e.at, detail);
                last_line.clear();
            }
            let progress =
                hb.as_ref().and_then(|h| h.progress).or_else(|| history.iter().rev().find_map(|e| e.progress));
            let message = hb.as_ref().and_then(|h| h.message.clone()).unwrap_or_default();
            let line = format!(
                "{} {:<9} {}",
                bar(progress.unwrap_or(0.0), 30),
                state.map(JobState::as_str).unwrap_or("unknown"),
                message
            );
            if line != last_line {
                if tty {
                    print!("\r{line}");
                    std::io::stdout().flush()?;
                } else {
                    println!("{line}");
                }
                last_line = line;
            }
        }
        if let Some(s) = state.filter(|s| s.is_terminal()) {
            if tty {
                println!();
            }
            if !json {
                let r = row.as_ref();
                let took = r.and_then(|r| Some(r.finished_at? - r.submitted_at?));
                println!("{job_id}: {} {}", s.as_str(), took.map(|t| format!("after {t} ms")).unwrap_or_default());
                if let Some(e) = r.and_then(|r| r.error.clone()) {
                    println!("error: {e}");
                }
            }
            return Ok(if s == JobState::Succeeded { ExitCode::SUCCESS } else { ExitCode::from(1) });
        }
        if state.is_none() && start.elapsed() > UNKNOWN_GRACE {
            eprintln!(
                "{job_id}: no such job after {} s (never submitted, expired after retention.results, or produced \
                 straight to Kafka and no worker has seen it)",
                UNKNOWN_GRACE.as_secs()
            );
            return Ok(ExitCode::from(2));
        }
        if !timeout.is_zero() && start.elapsed() > timeout {
            eprintln!(
                "\n{job_id}: still {} after {timeout:?}; stopped following",
                state.map(JobState::as_str).unwrap_or("unknown")
            );
            return Ok(ExitCode::from(3));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
