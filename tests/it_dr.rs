//! The disaster-recovery drill (issue 52, docs/disaster-recovery.md): jobs running across
//! tenants (long checkpointing ones among them), a schedule and an API key; `fairway
//! backup` mid-run; the worker killed and BOTH services wiped (their data folders
//! removed); fresh services; `fairway restore` (twice: the second changes nothing); a
//! worker again. Every job accepted before the backup point ends with a result, exactly
//! one for those finished at it (duplicates only for jobs not finished at the backup
//! point, counted); the schedule fires again; the key still authenticates. It prints the
//! RPO (jobs accepted after the backup point and gone) and the RTO (wipe to first job run).
//!
//! It runs its own Kafka and Cassandra (`scripts/services` with a private directory and
//! free ports), never the shared ones, since it wipes them.

mod common;

use fairway::config::Config;
use fairway::core::auth::Caller;
use fairway::core::recurring::ScheduleSpec;
use fairway::model::JobResult;
use fairway::submit::Submitter;
use std::collections::{HashMap, HashSet};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

const SERVICES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/services");

const EXTRA: &str = "[pools.long]\nslots = 8\nheartbeat_interval = \"1s\"\ndefault_estimate = \"10s\"\n\
                     [pools.short]\nslots = 16\nheartbeat_interval = \"1s\"\n\
                     [job_types.crunch]\npool = \"long\"\nhandler = \"sleep\"\ntimeout = \"2min\"\n\
                     [job_types.echo]\npool = \"short\"\nhandler = \"echo\"\n";

/// This test's own Kafka and Cassandra: one private services directory, free ports kept
/// across the wipe (the restored cluster answers where the old one did). Stopped and
/// deleted on drop.
struct Private {
    dir: std::path::PathBuf,
    env: Vec<(String, String)>,
}

impl Private {
    fn new() -> Private {
        let id = uuid::Uuid::new_v4().simple().to_string();
        let dir = std::env::temp_dir().join(format!("fairway-it-dr-{}", &id[..12]));
        std::fs::create_dir_all(&dir).expect("create the private services directory");
        // Below the ephemeral range (`common::free_port`): the drill restarts the services
        // on the same ports.
        let p: Vec<String> = (0..4).map(|_| common::free_port().to_string()).collect();
        let env = [
            ("FAIRWAY_SERVICES_DIR", dir.display().to_string()),
            ("FAIRWAY_SERVICES_TIMEOUT", "150".into()),
            ("FAIRWAY_KAFKA_PORT", p[0].clone()),
            ("FAIRWAY_KAFKA_CONTROLLER_PORT", p[1].clone()),
            ("FAIRWAY_KAFKA_HEAP", "384m".into()),
            ("FAIRWAY_CQL_PORT", p[2].clone()),
            ("FAIRWAY_CASSANDRA_STORAGE_PORT", p[3].clone()),
            ("FAIRWAY_CASSANDRA_HEAP", "512m".into()),
            ("FAIRWAY_SERVICES_HOST", "127.0.0.1".into()),
        ];
        Private { dir, env: env.into_iter().map(|(k, v)| (k.to_string(), v)).collect() }
    }

    fn brokers(&self) -> String {
        format!("127.0.0.1:{}", self.var("FAIRWAY_KAFKA_PORT"))
    }

    fn cql(&self) -> String {
        format!("127.0.0.1:{}", self.var("FAIRWAY_CQL_PORT"))
    }

    fn var(&self, k: &str) -> &str {
        &self.env.iter().find(|(n, _)| n == k).unwrap().1
    }

    /// `scripts/services ARGS` on this instance; panics when it fails.
    fn services(&self, args: &[&str]) {
        let ok = Command::new(SERVICES)
            .args(args)
            .envs(self.env.iter().cloned())
            .stdout(Stdio::null())
            .status()
            .expect("run scripts/services")
            .success();
        assert!(ok, "scripts/services {args:?} failed (its log is above)");
    }

    /// Both services up (Kafka and Cassandra started side by side).
    fn up(&self) {
        std::thread::scope(|s| {
            s.spawn(|| self.services(&["up", "kafka"]));
            self.services(&["up", "cassandra"]);
        });
    }
}

impl Drop for Private {
    fn drop(&mut self) {
        let _ = Command::new(SERVICES).args(["down", "--wipe"]).envs(self.env.iter().cloned()).status();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A `fairway` command of this test's deployment: its config file only (the suite's
/// FAIRWAY_BROKERS / FAIRWAY_CQL name the shared services and would override it).
fn fairway_cmd(config: &std::path::Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_fairway"));
    for var in ["FAIRWAY_BROKERS", "FAIRWAY_CQL", "FAIRWAY_KEYSPACE", "FAIRWAY_TOPIC_PREFIX", "FAIRWAY_CONFIG"] {
        c.env_remove(var);
    }
    // The backup key that signs the drill's backup and checks it at the restore.
    c.env("FAIRWAY_BACKUP_KEY", "it-dr-drill-backup-key-0123456789abcdef").env_remove("FAIRWAY_BACKUP_KEY_FILE");
    c.arg("--config").arg(config);
    c
}

/// `fairway --config PATH ARGS`: its stdout's last line as JSON (the command's summary).
fn fairway(config: &std::path::Path, args: &[&str]) -> serde_json::Value {
    let out = fairway_cmd(config)
        .args(args)
        .env("FAIRWAY_LOG", "warn")
        .stderr(Stdio::inherit())
        .output()
        .expect("run fairway");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "fairway {args:?} failed: {stdout}");
    serde_json::from_str(stdout.lines().last().unwrap_or(""))
        .unwrap_or_else(|e| panic!("{args:?} printed {stdout}: {e}"))
}

/// Every result on the results topic now (read up to its high watermarks of this moment).
async fn all_results(cfg: &Config) -> Vec<JobResult> {
    use fairway::kafka::Message;
    let topic = cfg.results_topic();
    let ends = fairway::kafka::copy::watermarks(cfg, &topic).unwrap();
    let group = format!("dr-results-{}", uuid::Uuid::new_v4().simple());
    let reader = fairway::kafka::reader_from_start(cfg, &group, &topic).unwrap();
    let mut next: HashMap<i32, i64> = ends.iter().map(|(p, low, _)| (*p, *low)).collect();
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut out = Vec::new();
    while ends.iter().any(|(p, _, high)| next[p] < *high) && Instant::now() < deadline {
        if let Ok(Ok(m)) = tokio::time::timeout(Duration::from_millis(500), reader.recv()).await {
            next.insert(m.partition(), m.offset() + 1);
            out.extend(m.payload().and_then(|b| fairway::codec::decode_result(b).ok()));
        }
    }
    out
}

fn by_job(results: &[JobResult]) -> HashMap<String, Vec<&JobResult>> {
    let mut by: HashMap<String, Vec<&JobResult>> = HashMap::new();
    for r in results {
        by.entry(r.job_id.clone()).or_default().push(r);
    }
    by
}

/// Records on every topic of the deployment (sum of high watermarks).
fn records_on_topics(cfg: &Config) -> i64 {
    fairway::kafka::all_topics(cfg)
        .iter()
        .map(|t| fairway::kafka::copy::watermarks(cfg, t).unwrap().iter().map(|m| m.2).sum::<i64>())
        .sum()
}

fn spawn_worker(config: &std::path::Path) -> std::process::Child {
    fairway_cmd(config)
        .args(["worker", "--pools", "short,long"])
        .env("FAIRWAY_LOG", "warn")
        .stdout(Stdio::null())
        .spawn()
        .expect("spawn worker")
}

async fn key_status(base: &str, token: &str) -> u16 {
    let http = reqwest::Client::builder().timeout(Duration::from_secs(20)).build().unwrap();
    let r = http.get(format!("{base}/v1/schedules")).bearer_auth(token).send().await.expect("GET /v1/schedules");
    r.status().as_u16()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn drill_backup_wipe_restore_every_job_accepted_before_the_backup_point_ends_once() {
    let services = Private::new();
    services.up();
    let mut cfg = common::config(EXTRA);
    cfg.kafka.brokers = services.brokers();
    cfg.scylla.contact_points = vec![services.cql()];
    cfg.scylla.keyspace = "fairway_dr".into();
    common::init(&cfg).await;
    let dir = tempfile::tempdir().unwrap();
    let config = common::config_file(&cfg, EXTRA, dir.path());
    let cfg = Arc::new(cfg);

    // The control plane: a tenant key and a schedule (initech's, every 3 s).
    let (_, token) = common::create_key(&cfg, &Caller::Tenant("initech".into()), "it_dr").await;
    let store = fairway::store::Store::open(&cfg).await.unwrap();
    let schedules = fairway::ops::schedules::Schedules::connect(cfg.clone(), &store).await.unwrap();
    let spec = ScheduleSpec {
        name: "drill-tick".into(),
        tenant: "initech".into(),
        job_type: "echo".into(),
        every: Some("3s".into()),
        ..Default::default()
    };
    schedules.add(spec, fairway::now_ms()).await.expect("add schedule");

    // Work across tenants: quick jobs, and long checkpointing ones (20 s each, a checkpoint every 2 steps).
    let mut worker = spawn_worker(&config);
    let sub = Submitter::new(cfg.clone(), None).unwrap();
    let mut before: Vec<String> = Vec::new();
    for t in ["acme", "globex", "initech"] {
        let long = common::new_job(t, "crunch", serde_json::json!({"ms": 20000, "checkpoint_every": 2}));
        before.push(sub.submit(&long).await.unwrap().job_id);
    }
    let long_ids: HashSet<String> = before.iter().cloned().collect();
    for i in 0..300 {
        let t = ["acme", "globex", "initech"][i % 3];
        before.push(sub.submit(&common::new_job(t, "echo", serde_json::json!({"i": i}))).await.unwrap().job_id);
    }
    // Mid-run: some quick jobs done, the long ones checkpointing.
    let resumable = common::wait_for(Duration::from_secs(60), async || {
        let mut n = 0;
        for id in &long_ids {
            n += usize::from(store.checkpoint(id, 0).await.ok().flatten().is_some());
        }
        (n == long_ids.len()).then_some(())
    })
    .await;
    assert!(resumable.is_some(), "the long jobs checkpointed before the backup");
    let seen_before = all_results(&cfg).await;

    // The backup, online (the worker keeps running).
    let backup_dir = dir.path().join("backup");
    let b = fairway(&config, &["backup", "--out", backup_dir.to_str().unwrap(), "--results-window", "1h"]);
    let t0 = b["t0"].as_i64().unwrap();
    println!("backup: {b}");
    // Finished at the backup point: their result is before it (with a second's margin for
    // the state write that follows each result).
    let finished_at_t0: HashSet<String> = seen_before
        .iter()
        .filter(|r| r.finished_at <= t0 - 1000 && !long_ids.contains(&r.job_id))
        .map(|r| r.job_id.clone())
        .collect();
    // Accepted after the backup point: what the drill expects to lose (the RPO).
    let mut after = Vec::new();
    for i in 0..20 {
        after.push(sub.submit(&common::new_job("acme", "echo", serde_json::json!({"late": i}))).await.unwrap().job_id);
    }
    drop(sub);
    drop(schedules);
    drop(store);

    // The disaster: the fleet dies, both services lose their data.
    worker.kill().unwrap();
    worker.wait().unwrap();
    let wiped_at = fairway::now_ms();
    services.services(&["down", "--wipe"]);
    for data in ["kafka-data", "cassandra-data"] {
        assert!(!services.dir.join(data).exists(), "{data} was removed");
    }
    services.up();
    let restore_started = fairway::now_ms();
    let r = fairway(&config, &["restore", "--from", backup_dir.to_str().unwrap()]);
    println!("restore: {r}");
    assert_eq!(r["changed"], true);
    let restored_at = fairway::now_ms();
    let on_topics = records_on_topics(&cfg);
    let again = fairway(&config, &["restore", "--from", backup_dir.to_str().unwrap()]);
    assert_eq!(again["changed"], false, "a second restore changes nothing: {again}");
    assert_eq!(records_on_topics(&cfg), on_topics, "a second restore produced records");

    // The key authenticates against the restored keyspace (a wrong one does not).
    let (base, stop) = common::serve_api(&cfg).await;
    assert_eq!(key_status(&base, &token).await, 200, "the restored key authenticates");
    assert_eq!(key_status(&base, "fw_bogus").await, 401);
    let _ = stop.send(());

    let mut worker = spawn_worker(&config);
    let got = common::results_for(&cfg, &before, Duration::from_secs(120)).await;
    let missing: Vec<&String> = before.iter().filter(|id| !got.contains_key(*id)).collect();
    // The schedule fires again on the restored cluster.
    let fired = common::wait_for(Duration::from_secs(30), async || {
        let rs = common::read_until(
            &cfg,
            &cfg.results_topic(),
            Duration::from_secs(3),
            |b, _, _| fairway::codec::decode_result(b).ok().filter(|r| r.tenant == "initech" && r.job_type == "echo"),
            |v: &[JobResult]| v.iter().any(|r| r.submitted_at > restored_at),
        )
        .await;
        rs.iter().any(|r| r.submitted_at > restored_at).then_some(())
    })
    .await;
    let results = all_results(&cfg).await;
    worker.kill().ok();
    worker.wait().ok();
    assert!(missing.is_empty(), "{} jobs accepted before the backup point have no result: {missing:?}", missing.len());
    assert!(fired.is_some(), "the restored schedule fired on the restored cluster");

    let by = by_job(&results);
    let dup: Vec<&String> = before.iter().filter(|id| by.get(*id).is_some_and(|v| v.len() > 1)).collect();
    let wrong: Vec<&&String> = dup.iter().filter(|id| finished_at_t0.contains(**id)).collect();
    assert!(wrong.is_empty(), "jobs finished at the backup point ran again: {wrong:?}");
    let resumed = long_ids
        .iter()
        .filter_map(|id| by.get(id)?.last()?.output.clone())
        .filter(|o| {
            String::from_utf8_lossy(o).contains("\"resumed_from_step\":")
                && !String::from_utf8_lossy(o).contains("\"resumed_from_step\":0")
        })
        .count();
    let first_run = results.iter().filter(|r| r.finished_at > restore_started).map(|r| r.finished_at).min();
    let lost = after.iter().filter(|id| !by.contains_key(*id)).count();
    let summary = serde_json::json!({
        "jobs_before_backup_point": before.len(),
        "finished_at_backup_point": finished_at_t0.len(),
        "duplicates": dup.len(),
        "long_jobs_resumed_from_checkpoint": resumed,
        "rpo_jobs_lost": lost,
        "rpo_jobs_accepted_after_backup_point": after.len(),
        "rpo_ms": wiped_at - t0,
        "restore_ms": restored_at - restore_started,
        "rto_ms": first_run.map(|f| f - wiped_at),
        "backup": b,
    });
    println!("drill: {summary}");
    assert!(first_run.is_some(), "a job ran after the restore");
}
