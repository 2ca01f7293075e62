//! A tenant's home region on two deployments standing for two regions (docs/regions.md):
//! two topic prefixes and two keyspaces on the one local broker and CQL database, a
//! `fairway serve` and a `fairway worker` for each. The tenant (home a, secondary b)
//! drives the Python client (tests/it_regions.py): through b's endpoint it is answered
//! 421 naming a, and sent there; a is put down (`fairway region down`) and its
//! submissions move to b; a comes back and they move home. Every accepted job ends with
//! one result, in the region that accepted it.
//!
//! API ports: `IT_REGION_PORTS` (four comma-separated ports: a's and b's API, a's and
//! b's /readyz listener), else free ones the OS picks.

use crate::common;

use fairway::config::Config;
use std::collections::HashMap;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

const JOB_TYPES: &str = "[job_types.echo]\npool = \"short\"\nhandler = \"echo\"\n";

fn ports() -> [u16; 4] {
    match std::env::var("IT_REGION_PORTS") {
        Ok(list) => {
            let p: Vec<u16> = list.split(',').map(|p| p.trim().parse().expect("IT_REGION_PORTS: a port")).collect();
            p.try_into().expect("IT_REGION_PORTS: four ports")
        }
        Err(_) => [common::free_port(), common::free_port(), common::free_port(), common::free_port()],
    }
}

/// `[region]` of region `name`, both regions' endpoints listed.
fn region_section(name: &str, api: [u16; 2]) -> String {
    format!(
        "[region]\nname = \"{name}\"\nretry_after_secs = 2\n[region.endpoints]\n\
         a = \"http://127.0.0.1:{}\"\nb = \"http://127.0.0.1:{}\"\n",
        api[0], api[1]
    )
}

struct Region {
    cfg: Arc<Config>,
    file: std::path::PathBuf,
    serve: Child,
    worker: common::LoggedWorker,
}

impl Drop for Region {
    fn drop(&mut self) {
        let _ = self.serve.kill();
        let _ = self.serve.wait();
        let _ = self.worker.child.kill();
        let _ = self.worker.child.wait();
    }
}

fn fairway(file: &Path, args: &[&str]) {
    common::python::run(
        Command::new(env!("CARGO_BIN_EXE_fairway")).arg("--config").arg(file).args(args),
        &format!("fairway {}", args.join(" ")),
    );
}

/// One region's deployment: its keyspace and topics, the tenant with its home, its
/// worker and its API.
async fn region(name: &str, keyspace: &str, tenant: &str, ports: [u16; 4], dir: &Path) -> Region {
    let api = [ports[0], ports[1]];
    let section = format!("{JOB_TYPES}{}", region_section(name, api));
    let mut cfg = common::config(&section);
    cfg.scylla.keyspace = keyspace.to_string();
    fairway::kafka::ensure_topics(&cfg).await.expect("create topics");
    fairway::store::ensure_schema(&cfg).await.expect("create schema");
    let dir = dir.join(name);
    std::fs::create_dir_all(&dir).unwrap();
    let file = common::config_file(&cfg, &section, &dir);
    fairway(&file, &["tenants", "add", tenant, "--tier", "pro", "--home-region", "a", "--secondary-region", "b"]);
    let worker = common::spawn_logged_worker(&file, "short");
    let (listen, ready) = match name {
        "a" => (ports[0], ports[2]),
        _ => (ports[1], ports[3]),
    };
    let serve = Command::new(env!("CARGO_BIN_EXE_fairway"))
        .arg("--config")
        .arg(&file)
        .args(["serve", "--listen", &format!("127.0.0.1:{listen}")])
        .args(["--metrics-listen", &format!("127.0.0.1:{ready}"), "--no-metrics"])
        .env("FAIRWAY_LOG", "warn")
        .stdout(Stdio::null())
        .spawn()
        .expect("spawn fairway serve");
    Region { cfg: Arc::new(cfg), file, serve, worker }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_tenants_submissions_follow_its_home_and_move_to_its_secondary_when_home_is_down() {
    let run = &uuid::Uuid::new_v4().simple().to_string()[..10];
    let tenant = format!("rg{run}");
    let ports = ports();
    let dir = tempfile::tempdir().unwrap();
    let a = region("a", "fairway_it", &tenant, ports, dir.path()).await;
    let b = region("b", "fairway_it_region_b", &tenant, ports, dir.path()).await;
    // One key for the tenant in both regions (the same id and secret stored in each).
    let key = fairway::core::auth::new_key(rand::random());
    let caller = fairway::api::Caller::Tenant(tenant.clone());
    for r in [&a, &b] {
        let store = fairway::store::Store::open(&r.cfg).await.expect("store");
        let keys = store.key_statements().await.expect("key statements");
        assert!(keys.insert(&key.id, &key.hash, &caller, Some("it_regions"), fairway::now_ms()).await.unwrap());
    }
    for (name, r, port) in [("a", &a, ports[2]), ("b", &b, ports[3])] {
        let addr = format!("127.0.0.1:{port}");
        let ready = common::wait_for(Duration::from_secs(60), async || {
            (common::http_get_status(&addr, "/readyz") == Some(200)).then_some(())
        })
        .await;
        assert!(ready.is_some(), "region {name}'s API did not get ready within 60 s");
        assert!(r.worker.wait_owning(1, Duration::from_secs(60)).is_some(), "region {name}'s worker owns nothing");
    }

    let venv = tokio::task::spawn_blocking(common::python::client_venv).await.unwrap();
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut cmd = Command::new("timeout");
    cmd.args(["180", venv.join("bin/python").to_str().unwrap()])
        .arg(root.join("tests/it_regions.py"))
        .env("PYTHONPATH", root.join("clients/python/src"))
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env("IT_A", format!("http://127.0.0.1:{}", ports[0]))
        .env("IT_B", format!("http://127.0.0.1:{}", ports[1]))
        .env("IT_A_READY", format!("http://127.0.0.1:{}/readyz", ports[2]))
        .env("IT_KEY", &key.token)
        .env("IT_TENANT", &tenant)
        .env("IT_FAIRWAY", env!("CARGO_BIN_EXE_fairway"))
        .env("IT_A_CONFIG", &a.file)
        .env("no_proxy", "*");
    let out = tokio::task::spawn_blocking(move || common::python::run(&mut cmd, "tests/it_regions.py")).await.unwrap();
    let report: serde_json::Value = serde_json::from_str(out.trim()).expect("the script's JSON");
    eprintln!("{report}");

    // Through b: 421 naming a and its endpoint, and the client followed it there.
    let steps = &report["steps"];
    assert_eq!(steps["b_answers"][0], 421, "region b served a tenant homed in region a: {steps}");
    assert_eq!(steps["b_answers"][1], "MISDIRECTED_REGION");
    assert_eq!(steps["b_answers"][2], "a");
    assert_eq!(steps["b_answers"][3], format!("http://127.0.0.1:{}", ports[0]));
    assert_eq!(steps["followed_to"], "a");
    let accepted: Vec<(String, String)> = serde_json::from_value(report["accepted"].clone()).unwrap();
    let regions: Vec<&str> = accepted.iter().map(|(_, r)| r.as_str()).collect();
    // 1 followed + 10 at home, 10 + a batch of 5 while a is down, 5 back home.
    let want: Vec<&str> = [vec!["a"; 11], vec!["b"; 15], vec!["a"; 5]].concat();
    assert_eq!(regions, want, "where each submission was accepted");

    // Every job ends once, in the region that accepted it, and never in the other.
    let mut by_region: HashMap<&str, Vec<String>> = HashMap::new();
    for (id, r) in &accepted {
        by_region.entry(r.as_str()).or_default().push(id.clone());
    }
    let unique: std::collections::HashSet<&String> = accepted.iter().map(|(id, _)| id).collect();
    assert_eq!(unique.len(), accepted.len(), "a job id was accepted twice");
    for (name, r) in [("a", &a), ("b", &b)] {
        let mine = &by_region[name];
        let results = common::results_for(&r.cfg, mine, Duration::from_secs(90)).await;
        for id in mine {
            let n = results.get(id).map_or(0, Vec::len);
            assert_eq!(n, 1, "job {id} accepted in region {name} has {n} results there");
        }
    }
}
