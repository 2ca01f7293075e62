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
    let mut a = region("a", "fairway_it", &tenant, ports, dir.path()).await;
    let mut b = region("b", "fairway_it_region_b", &tenant, ports, dir.path()).await;
    // One key for the tenant in both regions (the same id and secret stored in each).
    let key = fairway::core::auth::new_key(rand::random());
    let caller = fairway::api::Caller::Tenant(tenant.clone());
    for r in [&a, &b] {
        let store = fairway::store::Store::open(&r.cfg).await.expect("store");
        let keys = store.key_statements().await.expect("key statements");
        assert!(keys.insert(&key.id, &key.hash, &caller, Some("it_regions"), fairway::now_ms()).await.unwrap());
    }
    for (name, r, port) in [("a", &mut a, ports[2]), ("b", &mut b, ports[3])] {
        let addr = format!("127.0.0.1:{port}");
        let ready = common::wait_for(Duration::from_secs(60), async || {
            (common::http_get_status(&addr, "/readyz") == Some(200)).then_some(())
        })
        .await;
        let exited = r.serve.try_wait().ok().flatten();
        assert!(
            ready.is_some(),
            "region {name}'s API did not get ready within 60 s (its serve process: {}; /readyz answers {:?})",
            exited.map_or("running".to_string(), |s| format!("exited, {s}")),
            common::http_get_status(&addr, "/readyz"),
        );
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

/// Issue 63 (7): `Fairway-Failover-From` is believed only while the home cannot serve.
/// Two in-process APIs stand for regions a and b (a tenant homed in a, secondary b):
/// with a up, b answers the header with 421 to a (it used to serve it, so a tenant could
/// submit in both regions at once and double its limits); with a down, or draining (for
/// submissions), or not answering at all, b serves it; with a up again, 421 again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failover_header_is_believed_only_while_the_home_cannot_serve() {
    use fairway::core::auth::Caller;
    use fairway::core::regions::RegionState;
    use fairway::core::scheduler::Tier;
    use fairway::core::tenants::TenantRecord;
    use fairway::store::{RegionStateRow, Store};
    let (la, lb) = (
        tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap(),
        tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap(),
    );
    let (pa, pb) = (la.local_addr().unwrap().port(), lb.local_addr().unwrap().port());
    let section = |name: &str| {
        format!(
            "{JOB_TYPES}[region]\nname = \"{name}\"\n[region.endpoints]\na = \"http://127.0.0.1:{pa}\"\n\
             b = \"http://127.0.0.1:{pb}\"\n"
        )
    };
    let (ca, cb) = (common::arc(common::config(&section("a"))), common::arc(common::config(&section("b"))));
    common::init(&ca).await;
    common::init(&cb).await;
    let (store_a, store_b) = (Store::open(&ca).await.unwrap(), Store::open(&cb).await.unwrap());
    let mut roam = TenantRecord::new("roam", Tier::Standard);
    roam.home_region = Some("a".into());
    roam.secondary_region = Some("b".into());
    store_b.tenant_statements().await.unwrap().put(&roam, fairway::now_ms()).await.expect("register roam in b");
    let (_, key) = common::create_key(&cb, &Caller::Tenant("roam".into()), "it_regions").await;
    let serve = |cfg: Arc<Config>, l: tokio::net::TcpListener| async move {
        let state = fairway::api::ApiState::connect(cfg, None).await.expect("API state");
        let (stop, rx) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(fairway::api::serve(l, state, async move {
            let _ = rx.await;
        }));
        stop
    };
    let stop_a = serve(ca.clone(), la).await;
    let _stop_b = serve(cb.clone(), lb).await;
    let http = reqwest::Client::builder().timeout(Duration::from_secs(20)).build().unwrap();
    let submit = |failover: bool| {
        let mut req = http
            .post(format!("http://127.0.0.1:{pb}/v1/jobs"))
            .bearer_auth(&key)
            .json(&serde_json::json!({"job_type": "echo", "payload": {}}));
        if failover {
            req = req.header("Fairway-Failover-From", "a");
        }
        async move {
            let r = req.send().await.expect("b answers");
            let status = r.status().as_u16();
            (status, r.json::<serde_json::Value>().await.unwrap_or_default())
        }
    };
    let set_a = |state: RegionState| {
        let store_a = store_a.clone();
        async move {
            let row =
                RegionStateRow { state, reason: Some("it".into()), at: Some(fairway::now_ms()), ..Default::default() };
            store_a.set_region_state(&row).await.expect("a's state");
            // a's API sees it within its poll (1 s); b's view of a is kept 1 s.
            tokio::time::sleep(Duration::from_millis(2_600)).await;
        }
    };

    // a is up: the header alone is not believed.
    let (s, body) = submit(true).await;
    assert_eq!((s, body["code"].as_str()), (421, Some("MISDIRECTED_REGION")), "a is up: {body}");
    assert_eq!(body["home_region"], "a", "{body}");
    assert_eq!(submit(false).await.0, 421);
    // a is down: b stands in.
    set_a(RegionState::Down).await;
    let (s, body) = submit(true).await;
    assert_eq!(s, 201, "a is down, b stands in: {body}");
    let id = body["job_id"].as_str().unwrap().to_string();
    assert_eq!(submit(false).await.0, 421, "without the header the tenant is still sent home");
    // a drains: submissions fail over, reads of jobs do not (a serves reads).
    set_a(RegionState::Draining).await;
    assert_eq!(submit(true).await.0, 201, "a is draining: submissions fail over");
    let read = http
        .get(format!("http://127.0.0.1:{pb}/v1/jobs/{id}"))
        .bearer_auth(&key)
        .header("Fairway-Failover-From", "a")
        .send()
        .await
        .unwrap();
    assert_eq!(read.status().as_u16(), 421, "a is draining and still serves reads");
    // a is up again: the header is not believed again.
    set_a(RegionState::Up).await;
    let (s, body) = submit(true).await;
    assert_eq!(s, 421, "a is back up: {body}");
    // a's API does not answer at all: b stands in.
    let _ = stop_a.send(());
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let (s, body) = submit(true).await;
    assert_eq!(s, 201, "a cannot be reached, b stands in: {body}");
}
