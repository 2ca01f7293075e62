//! Kafka over TLS and SASL for real, on 127.0.0.1 only. The tests share an Apache Kafka
//! broker of their own (`scripts/services up kafka` with a private services directory in
//! a temp dir and free ports; stopped, wiped and deleted by `scripts/services down --wipe
//! kafka` when the last test using it ends, on every exit path). The shared local broker
//! is not touched. Its listeners:
//! - `SSL`: a server certificate made in the test (rcgen, self-signed: it is its own CA),
//!   given to Kafka as a PEM keystore;
//! - `SASL_SSL` with SCRAM-SHA-512 (same certificate); one user is created when the
//!   broker's storage is formatted (`FAIRWAY_KAFKA_SCRAM`: `--add-scram`);
//! - `PLAINTEXT` for the broker's own inter-broker listener and the `CONTROLLER` listener
//!   (KRaft), which the tests do not use.
//!
//! What is proved:
//! - `fairway init`'s topic creation (library and command), a worker and the HTTP API run
//!   over `SSL` with `ssl.ca.location` from `[kafka.properties]` (the command: from
//!   `FAIRWAY_KAFKA_*` variables); without the CA, or without TLS, nothing gets through;
//! - SASL_SSL credentials set through `FAIRWAY_KAFKA_SASL_*` reach the broker: an unknown
//!   user and a wrong password are refused (nothing created), TLS without SASL is refused,
//!   and the password appears in no error; with the right password `fairway init` (library
//!   and command), a worker and the HTTP API run a job end to end over SASL_SSL.

mod common;

use fairway::api::{self, ApiState, Caller};
use fairway::config::Config;
use fairway::handlers::Registry;
use fairway::kafka::{self, Consumer};
use fairway::model::{JobStatus, Pool};
use fairway::worker::{Policy, Worker};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

const SERVICES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/services");
/// The SCRAM user created when the broker's storage is formatted.
const SASL_USER: &str = "fairway-it";

/// An Apache Kafka broker this test binary started through `scripts/services` with a
/// private services directory; stopped (by the script, which ends only the PID it
/// started), wiped and deleted when dropped.
struct Broker {
    dir: PathBuf,
    env: Vec<(&'static str, String)>,
    ssl_port: u16,
    sasl_ssl_port: u16,
    /// The broker's certificate (self-signed, so also the CA clients trust).
    ca: PathBuf,
    /// `SASL_USER`'s password.
    password: String,
}

impl Broker {
    fn start() -> Broker {
        static STARTED: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "fairway-it-kafka-tls-{}-{}",
            std::process::id(),
            STARTED.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create the private services directory");

        // The server certificate for 127.0.0.1 (IP SAN) and localhost; Kafka reads a PEM
        // keystore: the unencrypted PKCS#8 private key and the certificate in one file.
        let ck = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_string(), "localhost".to_string()]).unwrap();
        let (ca, keystore) = (dir.join("ca.pem"), dir.join("server.pem"));
        std::fs::write(&ca, ck.cert.pem()).unwrap();
        std::fs::write(&keystore, format!("{}{}", ck.key_pair.serialize_pem(), ck.cert.pem())).unwrap();

        // Four free ports, held together so they differ, released just before the start.
        let held: Vec<std::net::TcpListener> =
            (0..4).map(|_| std::net::TcpListener::bind("127.0.0.1:0").expect("a free port")).collect();
        let p: Vec<u16> = held.iter().map(|l| l.local_addr().unwrap().port()).collect();
        drop(held);
        let (plain, controller, ssl_port, sasl_ssl_port) = (p[0], p[1], p[2], p[3]);
        // No whitespace or commas: the script splits FAIRWAY_KAFKA_SCRAM on whitespace and
        // the StorageTool's `[name=...,password=...]` on commas.
        let password = format!("pw-{}", uuid::Uuid::new_v4().simple());
        let extra = [
            format!(
                "listeners=PLAINTEXT://127.0.0.1:{plain},CONTROLLER://127.0.0.1:{controller},\
                 SSL://127.0.0.1:{ssl_port},SASL_SSL://127.0.0.1:{sasl_ssl_port}"
            ),
            format!(
                "advertised.listeners=PLAINTEXT://127.0.0.1:{plain},SSL://127.0.0.1:{ssl_port},\
                 SASL_SSL://127.0.0.1:{sasl_ssl_port}"
            ),
            "ssl.keystore.type=PEM".to_string(),
            format!("ssl.keystore.location={}", keystore.display()),
            "sasl.enabled.mechanisms=SCRAM-SHA-512".to_string(),
            "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config=\
             org.apache.kafka.common.security.scram.ScramLoginModule required;"
                .to_string(),
        ]
        .join("\n");
        let env = vec![
            ("FAIRWAY_SERVICES_DIR", dir.display().to_string()),
            ("FAIRWAY_KAFKA_PORT", plain.to_string()),
            ("FAIRWAY_KAFKA_CONTROLLER_PORT", controller.to_string()),
            ("FAIRWAY_KAFKA_HEAP", "384m".to_string()),
            ("FAIRWAY_SERVICES_TIMEOUT", "120".to_string()),
            ("FAIRWAY_KAFKA_EXTRA", extra),
            ("FAIRWAY_KAFKA_SCRAM", format!("--add-scram SCRAM-SHA-512=[name={SASL_USER},password={password}]")),
        ];
        // Built before the start, so a failed start is stopped and deleted too.
        let broker = Broker { dir, env, ssl_port, sasl_ssl_port, ca, password };
        let t = Instant::now();
        // The script bounds its own wait (FAIRWAY_SERVICES_TIMEOUT) and prints the log's
        // tail when the broker does not come up.
        let status = broker.services(&["up", "kafka"]);
        assert!(status.success(), "scripts/services up kafka (private, SSL + SASL_SSL listeners) failed");
        eprintln!(
            "private Kafka up in {:.1} s: SSL on 127.0.0.1:{ssl_port}, SASL_SSL on 127.0.0.1:{sasl_ssl_port}",
            t.elapsed().as_secs_f64()
        );
        broker
    }

    fn services(&self, args: &[&str]) -> std::process::ExitStatus {
        Command::new(SERVICES)
            .args(args)
            .envs(self.env.iter().map(|(k, v)| (*k, v.as_str())))
            .stdout(Stdio::null())
            .status()
            .expect("run scripts/services")
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        let _ = self.services(&["down", "--wipe", "kafka"]);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The broker the tests share: started by the first that needs it, stopped when the last
/// `Arc` is dropped (a test that ends, passed or panicked, drops its own).
fn broker() -> Arc<Broker> {
    static SHARED: Mutex<Weak<Broker>> = Mutex::new(Weak::new());
    let mut slot = SHARED.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some(b) = slot.upgrade() {
        return b;
    }
    let b = Arc::new(Broker::start());
    *slot = Arc::downgrade(&b);
    b
}

async fn shared_broker() -> Arc<Broker> {
    tokio::task::spawn_blocking(broker).await.unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()))
}

fn ssl_config(port: u16, ca: Option<&Path>) -> Config {
    let mut cfg = common::config("");
    cfg.kafka.brokers = format!("127.0.0.1:{port}");
    cfg.kafka.properties.set("security.protocol", "SSL");
    if let Some(ca) = ca {
        cfg.kafka.properties.set("ssl.ca.location", ca.to_str().unwrap());
    }
    cfg
}

/// `FAIRWAY_KAFKA_*` variables for SASL_SSL with SCRAM-SHA-512 as `user`/`password`.
fn sasl_env(ca: &Path, user: &str, password: &str) -> Vec<(String, String)> {
    [
        ("FAIRWAY_KAFKA_SECURITY_PROTOCOL", "SASL_SSL"),
        ("FAIRWAY_KAFKA_SSL_CA_LOCATION", ca.to_str().unwrap()),
        ("FAIRWAY_KAFKA_SASL_MECHANISM", "SCRAM-SHA-512"),
        ("FAIRWAY_KAFKA_SASL_USERNAME", user),
        ("FAIRWAY_KAFKA_SASL_PASSWORD", password),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

/// A config for the SASL_SSL listener, its Kafka settings from `FAIRWAY_KAFKA_*` only.
fn sasl_config(b: &Broker, user: &str, password: &str) -> Config {
    let mut cfg = common::config("");
    cfg.kafka.brokers = format!("127.0.0.1:{}", b.sasl_ssl_port);
    let set = cfg.apply_env(sasl_env(&b.ca, user, password));
    assert_eq!(set.len(), 5, "{set:?}");
    assert!(!format!("{cfg:?}").contains(password), "Debug of the config shows no password");
    cfg
}

/// Topic creation with `cfg`, bounded: the topics created.
async fn create_topics(cfg: &Config, over: &str) -> Vec<String> {
    let created = tokio::time::timeout(Duration::from_secs(30), kafka::ensure_topics(cfg))
        .await
        .unwrap_or_else(|_| panic!("topic creation over {over} is bounded"))
        .unwrap_or_else(|e| panic!("topics created over {over}: {e}"));
    assert!(created.contains(&cfg.pool_topic(Pool::Short)), "{created:?}");
    created
}

/// The `fairway init` command against `cfg`'s broker and keyspace, its Kafka client
/// settings only from `env` (`FAIRWAY_KAFKA_*`); asserts it created the topics under its
/// own prefix, and that no output shows any of `secrets`.
async fn init_command(cfg: &Config, env: &[(String, String)], secrets: &[&str]) {
    let prefix = format!("{}cli.", cfg.kafka.topic_prefix);
    let mut init = tokio::process::Command::new(env!("CARGO_BIN_EXE_fairway"));
    init.args(["init", "--brokers", &cfg.kafka.brokers, "--topic-prefix", &prefix])
        .args(["--cql", &cfg.scylla.contact_points[0], "--keyspace", &cfg.scylla.keyspace])
        .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .env("FAIRWAY_LOG", "warn")
        .kill_on_drop(true);
    let out = tokio::time::timeout(Duration::from_secs(60), init.output()).await.expect("init within 60 s").unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    for s in secrets {
        assert!(!stdout.contains(s) && !stderr.contains(s), "fairway init printed a password: {stdout}{stderr}");
    }
    assert!(out.status.success(), "fairway init: {stderr}");
    assert!(stdout.contains(&format!("created topic {prefix}jobs.short")), "{stdout}");
}

/// A client with `bad` settings (otherwise `cfg`'s broker) gets nothing created within
/// 15 s; the error, if one comes, shows none of `secrets`.
async fn nothing_gets_through(cfg: &Config, mut bad: Config, what: &str, secrets: &[&str]) {
    bad.kafka.brokers = cfg.kafka.brokers.clone();
    bad.kafka.topic_prefix = format!("{}untrusted.", cfg.kafka.topic_prefix);
    let r = tokio::time::timeout(Duration::from_secs(15), kafka::ensure_topics(&bad)).await;
    match r {
        Ok(Ok(t)) => panic!("{what}: topics created: {t:?}"),
        Ok(Err(e)) => {
            let text = e.to_string();
            eprintln!("{what}: refused: {text}");
            for s in secrets {
                assert!(!text.contains(s), "a password leaked into an error: {text}");
            }
        }
        Err(_) => eprintln!("{what}: nothing within 15 s"),
    }
}

/// A worker (consumer group, results) and the HTTP API (producer) on `cfg`'s Kafka
/// settings: a job submitted over HTTP runs and its result is read back.
async fn api_and_worker_run_a_job(cfg: &Arc<Config>, over: &str) {
    let worker = tokio::time::timeout(
        Duration::from_secs(60),
        Worker::start(
            cfg.clone(),
            &[Pool::Short],
            Registry::from_config(cfg, Default::default()).unwrap(),
            Policy::Fair,
        ),
    )
    .await
    .unwrap_or_else(|_| panic!("worker over {over} started within 60 s"))
    .unwrap_or_else(|e| panic!("worker over {over}: {e}"));
    let state = tokio::time::timeout(Duration::from_secs(30), ApiState::connect(cfg.clone(), None))
        .await
        .unwrap_or_else(|_| panic!("API over {over} connected within 30 s"))
        .unwrap_or_else(|e| panic!("API over {over}: {e}"));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(api::serve(listener, state, async move {
        let _ = stopped.await;
    }));
    let store = fairway::store::Store::open(cfg).await.unwrap();
    let key = fairway::core::auth::new_key(rand::random());
    store
        .key_statements()
        .await
        .unwrap()
        .insert(&key.id, &key.hash, &Caller::Admin, None, fairway::now_ms())
        .await
        .unwrap();
    let http = reqwest::Client::builder().timeout(Duration::from_secs(30)).build().unwrap();
    let r = http
        .post(format!("{base}/v1/jobs"))
        .bearer_auth(&key.token)
        .json(&serde_json::json!({"tenant": "acme", "job_type": "echo", "payload": {"over": over}}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), reqwest::StatusCode::CREATED);
    let id = r.json::<serde_json::Value>().await.unwrap()["job_id"].as_str().unwrap().to_string();
    let results = common::results_for(cfg, std::slice::from_ref(&id), Duration::from_secs(60)).await;
    let _ = tokio::time::timeout(Duration::from_secs(60), worker.stop()).await;
    let _ = stop.send(());
    let _ = tokio::time::timeout(Duration::from_secs(10), server).await;
    let r = results.get(&id).and_then(|v| v.first()).unwrap_or_else(|| panic!("no result over {over} for {id}"));
    assert_eq!(r.status, JobStatus::Succeeded, "{r:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn init_worker_and_api_run_over_tls() {
    let broker = shared_broker().await;
    let cfg = Arc::new(ssl_config(broker.ssl_port, Some(&broker.ca)));

    // `fairway init`: topics created over TLS (then schema and tenants as every test).
    create_topics(&cfg, "TLS").await;
    common::init(&cfg).await;

    // The `fairway init` command itself, TLS set only through FAIRWAY_KAFKA_* variables.
    let env = [
        ("FAIRWAY_KAFKA_SECURITY_PROTOCOL".to_string(), "SSL".to_string()),
        ("FAIRWAY_KAFKA_SSL_CA_LOCATION".to_string(), broker.ca.display().to_string()),
    ];
    init_command(&cfg, &env, &[]).await;

    // Without the CA (or without TLS) the same listener is unreachable.
    nothing_gets_through(&cfg, ssl_config(broker.ssl_port, None), "TLS without the CA", &[]).await;
    nothing_gets_through(&cfg, common::config(""), "plaintext to the SSL listener", &[]).await;

    // The API (producer) and a worker (consumer group, results) over TLS.
    api_and_worker_run_a_job(&cfg, "tls").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sasl_scram_over_tls_logs_in_with_the_right_password_and_refuses_others() {
    let broker = shared_broker().await;
    let wrong = format!("wrong-{}", uuid::Uuid::new_v4().simple());

    // Refused logins: an unknown user, and the known user with a wrong password. The
    // consumer reports the broker's refusal (SASL negotiated over TLS, the credentials
    // checked by the broker's SCRAM store), nothing is created, and neither the password
    // tried nor the real one appears in an error.
    for (user, password, what) in
        [("nobody", broker.password.as_str(), "an unknown user"), (SASL_USER, wrong.as_str(), "a wrong password")]
    {
        let cfg = sasl_config(&broker, user, password);
        let secrets = [password, broker.password.as_str()];
        let c = kafka::reader(&cfg, "sasl-probe", false).expect("client with SASL properties");
        c.subscribe(&[cfg.pool_topic(Pool::Short).as_str()]).unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        let refusal = loop {
            assert!(Instant::now() < deadline, "{what}: no authentication error within 30 s");
            match tokio::time::timeout(Duration::from_secs(2), c.recv()).await {
                Ok(Err(e)) => {
                    let text = e.to_string();
                    if text.to_ascii_lowercase().contains("auth") || text.contains("SASL") {
                        break text;
                    }
                }
                Ok(Ok(m)) => {
                    panic!("{what}: a message was read without a valid login: {:?}", kafka::Message::offset(&m))
                }
                Err(_) => {}
            }
        };
        eprintln!("{what}: broker refusal: {refusal}");
        for s in secrets {
            assert!(!refusal.contains(s), "the password leaked into an error: {refusal}");
        }
        drop(c);
        nothing_gets_through(&cfg, sasl_config(&broker, user, password), what, &secrets).await;
    }
    // TLS alone (no SASL) to the SASL_SSL listener: refused.
    nothing_gets_through(
        &sasl_config(&broker, SASL_USER, &broker.password),
        ssl_config(broker.sasl_ssl_port, Some(&broker.ca)),
        "SSL without SASL to the SASL_SSL listener",
        &[],
    )
    .await;

    // The right password: `fairway init` (library and command), then the API and a worker
    // run a job, every Kafka client logged in with SCRAM-SHA-512 over TLS.
    let cfg = Arc::new(sasl_config(&broker, SASL_USER, &broker.password));
    create_topics(&cfg, "SASL_SSL").await;
    common::init(&cfg).await;
    init_command(&cfg, &sasl_env(&broker.ca, SASL_USER, &broker.password), &[&broker.password]).await;
    api_and_worker_run_a_job(&cfg, "sasl_ssl").await;
}
