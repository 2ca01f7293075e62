//! Kafka over TLS and SASL for real, on 127.0.0.1 only. The test starts its own tansu
//! broker (the binary `scripts/services up` installed; its PID is killed at the end)
//! whose advertised listener is a TLS terminator run by the test (rustls, a CA made in
//! the test), so every connection librdkafka makes goes through TLS:
//! - `fairway init`'s topic creation, a worker and the HTTP API run over `SSL` with
//!   `ssl.ca.location` from `[kafka.properties]`; without the CA nothing gets through;
//! - with `--authentication` (SCRAM-SHA-512 is all tansu offers), SASL_SSL credentials
//!   set through `FAIRWAY_KAFKA_SASL_*` reach the broker and an unknown user is refused,
//!   and the password appears in no error.
//!
//! What tansu cannot do here: create SCRAM users (`tansu user create` fails against an
//! auth-enabled broker), so a *successful* SASL login is not exercised.

mod common;

use fairway::api::{self, ApiState, Caller};
use fairway::config::Config;
use fairway::handlers::Registry;
use fairway::kafka::{self, Consumer};
use fairway::model::{JobStatus, Pool};
use fairway::worker::{Policy, Worker};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use std::io::Write;
use std::net::TcpStream;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

fn tansu_bin() -> std::path::PathBuf {
    let p = std::env::var("FAIRWAY_TANSU_BIN").map(Into::into).unwrap_or_else(|_| {
        let services = std::env::var("FAIRWAY_SERVICES_DIR")
            .map(std::path::PathBuf::from)
            .unwrap_or_else(|_| std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(".services"));
        services.join("bin/tansu")
    });
    assert!(p.exists(), "no tansu binary at {} (run scripts/services up, or set FAIRWAY_TANSU_BIN)", p.display());
    p
}

/// A tansu broker this test started; killed (by its PID) when dropped.
struct Broker {
    child: std::process::Child,
}

impl Drop for Broker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts tansu on 127.0.0.1:<free port>, advertising `advertised` (the terminator).
fn start_broker(advertised: u16, authentication: bool) -> (Broker, u16) {
    let port = common::free_port();
    let mut cmd = std::process::Command::new(tansu_bin());
    cmd.arg("broker")
        .arg("--listener-url")
        .arg(format!("tcp://127.0.0.1:{port}"))
        .arg("--advertised-listener-url")
        .arg(format!("tcp://127.0.0.1:{advertised}"))
        .arg("--storage-engine")
        .arg("memory://tansu/")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    if authentication {
        cmd.arg("--authentication");
    }
    let broker = Broker { child: cmd.spawn().expect("start tansu") };
    let deadline = Instant::now() + Duration::from_secs(15);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "tansu did not listen on {port} within 15 s");
        std::thread::sleep(Duration::from_millis(50));
    }
    (broker, port)
}

struct Tls {
    ca_pem: tempfile::NamedTempFile,
    acceptor: TlsAcceptor,
}

fn tls_for_localhost() -> Tls {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let ck = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_string(), "localhost".to_string()]).unwrap();
    let der = CertificateDer::from(ck.cert.der().to_vec());
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(ck.key_pair.serialize_der()));
    let server = rustls::ServerConfig::builder().with_no_client_auth().with_single_cert(vec![der], key).unwrap();
    let mut ca_pem = tempfile::NamedTempFile::new().unwrap();
    ca_pem.write_all(ck.cert.pem().as_bytes()).unwrap();
    Tls { ca_pem, acceptor: TlsAcceptor::from(Arc::new(server)) }
}

/// TLS on `listener`, plain TCP to 127.0.0.1:`upstream`.
fn terminate(tls: &Tls, listener: TcpListener, upstream: u16) {
    let acceptor = tls.acceptor.clone();
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else { return };
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(mut s) = acceptor.accept(tcp).await else { return };
                let Ok(mut plain) = tokio::net::TcpStream::connect(("127.0.0.1", upstream)).await else { return };
                let _ = tokio::io::copy_bidirectional(&mut s, &mut plain).await;
            });
        }
    });
}

/// A broker reachable only through TLS at the returned port.
async fn tls_broker(tls: &Tls, authentication: bool) -> (Broker, u16) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let tls_port = listener.local_addr().unwrap().port();
    let (broker, plain) = start_broker(tls_port, authentication);
    terminate(tls, listener, plain);
    (broker, tls_port)
}

fn ssl_config(tls_port: u16, ca: Option<&std::path::Path>) -> Config {
    let mut cfg = common::config("");
    cfg.kafka.brokers = format!("127.0.0.1:{tls_port}");
    cfg.kafka.properties.set("security.protocol", "SSL");
    if let Some(ca) = ca {
        cfg.kafka.properties.set("ssl.ca.location", ca.to_str().unwrap());
    }
    cfg
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn init_worker_and_api_run_over_tls() {
    let tls = tls_for_localhost();
    let (_broker, tls_port) = tls_broker(&tls, false).await;
    let cfg = Arc::new(ssl_config(tls_port, Some(tls.ca_pem.path())));

    // `fairway init`: topics created over TLS (then schema and tenants as every test).
    let created = tokio::time::timeout(Duration::from_secs(30), kafka::ensure_topics(&cfg))
        .await
        .expect("topic creation over TLS is bounded")
        .expect("topics created over TLS");
    assert!(created.contains(&cfg.pool_topic(Pool::Short)), "{created:?}");
    common::init(&cfg).await;

    // The `fairway init` command itself, TLS set only through FAIRWAY_KAFKA_* variables.
    let prefix = format!("{}cli.", cfg.kafka.topic_prefix);
    let mut init = tokio::process::Command::new(env!("CARGO_BIN_EXE_fairway"));
    init.args(["init", "--brokers", &cfg.kafka.brokers, "--topic-prefix", &prefix])
        .args(["--cql", &cfg.scylla.contact_points[0], "--keyspace", &cfg.scylla.keyspace])
        .env("FAIRWAY_KAFKA_SECURITY_PROTOCOL", "SSL")
        .env("FAIRWAY_KAFKA_SSL_CA_LOCATION", tls.ca_pem.path())
        .env("FAIRWAY_LOG", "warn")
        .kill_on_drop(true);
    let out = tokio::time::timeout(Duration::from_secs(60), init.output()).await.expect("init within 60 s").unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "fairway init over TLS: {}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains(&format!("created topic {prefix}jobs.short")), "{stdout}");

    // Without the CA (or without TLS) the same broker is unreachable.
    for bad in [ssl_config(tls_port, None), common::config("")] {
        let mut bad = bad;
        bad.kafka.brokers = cfg.kafka.brokers.clone();
        bad.kafka.topic_prefix = format!("{}untrusted.", cfg.kafka.topic_prefix);
        let r = tokio::time::timeout(Duration::from_secs(15), kafka::ensure_topics(&bad)).await;
        assert!(!matches!(r, Ok(Ok(_))), "a client without the CA / TLS must not get through: {r:?}");
    }

    // The API (producer) and a worker (consumer group, results) over TLS.
    let worker = Worker::start(
        cfg.clone(),
        &[Pool::Short],
        Registry::from_config(&cfg, Default::default()).unwrap(),
        Policy::Fair,
    )
    .await
    .expect("worker over TLS");
    let state = ApiState::connect(cfg.clone(), None).await.expect("API over TLS");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(api::serve(listener, state, async move {
        let _ = stopped.await;
    }));
    let store = fairway::store::Store::open(&cfg).await.unwrap();
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
        .json(&serde_json::json!({"tenant": "acme", "job_type": "echo", "payload": {"over": "tls"}}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), reqwest::StatusCode::CREATED);
    let id = r.json::<serde_json::Value>().await.unwrap()["job_id"].as_str().unwrap().to_string();
    let results = common::results_for(&cfg, std::slice::from_ref(&id), Duration::from_secs(60)).await;
    worker.stop().await;
    let _ = stop.send(());
    let _ = tokio::time::timeout(Duration::from_secs(10), server).await;
    let r = results.get(&id).and_then(|v| v.first()).unwrap_or_else(|| panic!("no result over TLS for {id}"));
    assert_eq!(r.status, JobStatus::Succeeded, "{r:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sasl_credentials_reach_the_broker_and_an_unknown_user_is_refused() {
    let tls = tls_for_localhost();
    let (_broker, tls_port) = tls_broker(&tls, true).await;
    let mut cfg = ssl_config(tls_port, Some(tls.ca_pem.path()));
    let password = format!("pw-{}", uuid::Uuid::new_v4().simple());
    let set = cfg.apply_env([
        ("FAIRWAY_KAFKA_SECURITY_PROTOCOL".to_string(), "SASL_SSL".to_string()),
        ("FAIRWAY_KAFKA_SASL_MECHANISM".to_string(), "SCRAM-SHA-512".to_string()),
        ("FAIRWAY_KAFKA_SASL_USERNAME".to_string(), "fairway-it".to_string()),
        ("FAIRWAY_KAFKA_SASL_PASSWORD".to_string(), password.clone()),
    ]);
    assert_eq!(set.len(), 4, "{set:?}");
    assert!(!format!("{cfg:?}").contains(&password), "Debug of the config shows no password");

    // The consumer reports the broker's refusal: SASL was negotiated over TLS and the
    // credentials were checked (tansu knows no users, so every login is refused).
    let c = kafka::reader(&cfg, "sasl-probe", false).expect("client with SASL properties");
    c.subscribe(&[cfg.pool_topic(Pool::Short).as_str()]).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let refusal = loop {
        assert!(Instant::now() < deadline, "no authentication error within 20 s");
        match tokio::time::timeout(Duration::from_secs(2), c.recv()).await {
            Ok(Err(e)) => {
                let text = e.to_string();
                if text.to_ascii_lowercase().contains("auth") || text.contains("SASL") {
                    break text;
                }
            }
            Ok(Ok(m)) => panic!("a message was read without a valid login: {:?}", fairway::kafka::Message::offset(&m)),
            Err(_) => {}
        }
    };
    eprintln!("broker refusal: {refusal}");
    assert!(!refusal.contains(&password), "the password leaked into an error: {refusal}");
    // And nothing gets created with refused credentials.
    let r = tokio::time::timeout(Duration::from_secs(15), kafka::ensure_topics(&cfg)).await;
    match r {
        Ok(Ok(t)) => panic!("topics created without a valid login: {t:?}"),
        Ok(Err(e)) => assert!(!e.to_string().contains(&password), "{e}"),
        Err(_) => {}
    }
}
