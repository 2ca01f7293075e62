//! ScyllaDB credentials against a real PasswordAuthenticator: the test starts its own
//! Cassandra 2.1 (the distribution `scripts/services up` installed, in a temporary
//! directory, on free ports, with `authenticator: PasswordAuthenticator`; its PID is
//! killed at the end) and a `fairway cql-bridge` process in front of it (on a port it
//! binds itself and logs). The shared local
//! Cassandra is not touched. A session with credentials works (`fairway init`'s schema
//! step), without them or with a wrong password it fails with an error that says which
//! settings to check, and the password appears in no error.

mod common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// A Cassandra this test started; killed (by its PID) when dropped.
struct Cassandra {
    child: std::process::Child,
    port: u16,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Drop for Cassandra {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A `fairway cql-bridge` this test started on 127.0.0.1:0; killed (by its PID) when dropped.
struct Bridge {
    child: std::process::Child,
    /// The address it bound, read from its "listening" log line.
    addr: String,
}

impl Bridge {
    fn start(upstream: &str, within: Duration) -> Bridge {
        use std::io::BufRead;
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_fairway"))
            .args(["cql-bridge", "--listen", "127.0.0.1:0", "--upstream", upstream])
            .env("FAIRWAY_LOG", "info")
            .env("NO_COLOR", "1")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("start fairway cql-bridge");
        let stderr = child.stderr.take().expect("the bridge's stderr");
        let (tx, rx) = std::sync::mpsc::channel();
        // Reads the log to its end (the pipe never fills), sending the bound address once.
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stderr).lines().map_while(Result::ok) {
                eprintln!("bridge: {line}");
                if let Some(rest) = line.split_once("listen=").map(|(_, r)| r) {
                    let _ = tx.send(rest.split_whitespace().next().unwrap_or_default().to_string());
                }
            }
        });
        match rx.recv_timeout(within) {
            Ok(addr) => Bridge { child, addr },
            Err(_) => {
                let _ = child.kill();
                panic!("fairway cql-bridge logged no listening address within {within:?}");
            }
        }
    }
}

impl Drop for Bridge {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn cassandra_home() -> PathBuf {
    let services = std::env::var("FAIRWAY_SERVICES_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| Path::new(env!("CARGO_MANIFEST_DIR")).join(".services"));
    let home = services.join("dist/apache-cassandra-2.1.0");
    assert!(home.join("lib").is_dir(), "no Cassandra 2.1 at {} (run scripts/services up)", home.display());
    home
}

fn java() -> PathBuf {
    match std::env::var("JAVA_HOME") {
        Ok(h) if Path::new(&h).join("bin/java").exists() => Path::new(&h).join("bin/java"),
        _ => PathBuf::from("java"),
    }
}

const OPENS: &[&str] = &[
    "java.base/java.lang",
    "java.base/java.util",
    "java.base/java.util.concurrent",
    "java.base/java.util.concurrent.atomic",
    "java.base/java.util.concurrent.locks",
    "java.base/java.nio",
    "java.base/sun.nio.ch",
    "java.base/java.io",
    "java.base/java.lang.reflect",
    "java.base/java.net",
    "java.base/jdk.internal.misc",
    "java.base/jdk.internal.ref",
    "java.base/java.lang.ref",
    "java.base/sun.nio.cs",
    "java.base/java.math",
    "java.base/java.text",
    "java.base/java.time",
    "java.base/java.security",
    "java.base/javax.security.auth",
    "java.base/jdk.internal.loader",
    "java.base/java.nio.charset",
    "java.base/java.util.regex",
    "java.base/java.lang.invoke",
    "java.base/sun.security.util",
    "java.management/sun.management",
];

fn start_cassandra() -> Cassandra {
    let home = cassandra_home();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display();
    let (port, storage, ssl) = (common::free_port(), common::free_port(), common::free_port());
    let yaml = format!(
        "cluster_name: fairway-auth-it\nnum_tokens: 1\npartitioner: org.apache.cassandra.dht.Murmur3Partitioner\n\
         endpoint_snitch: SimpleSnitch\nseed_provider:\n  - class_name: org.apache.cassandra.locator.SimpleSeedProvider\n    \
         parameters:\n      - seeds: \"127.0.0.1\"\nlisten_address: 127.0.0.1\nrpc_address: 127.0.0.1\nstart_rpc: false\n\
         start_native_transport: true\nnative_transport_port: {port}\nstorage_port: {storage}\nssl_storage_port: {ssl}\n\
         data_file_directories:\n  - {d}/data\ncommitlog_directory: {d}/commitlog\nsaved_caches_directory: {d}/caches\n\
         commitlog_sync: periodic\ncommitlog_sync_period_in_ms: 10000\nauto_snapshot: false\n\
         authenticator: PasswordAuthenticator\nauthorizer: AllowAllAuthorizer\n"
    );
    std::fs::File::create(dir.path().join("cassandra.yaml")).unwrap().write_all(yaml.as_bytes()).unwrap();
    let logback = std::fs::read_to_string(home.join("conf/logback.xml")).unwrap();
    std::fs::write(dir.path().join("logback.xml"), logback.replace("<root level=\"DEBUG\">", "<root level=\"INFO\">"))
        .unwrap();
    let log = dir.path().join("cassandra.log");
    let out = std::fs::File::create(&log).unwrap();
    let mut cmd = std::process::Command::new(java());
    cmd.args(["-Xms128m", "-Xmx256m", "-Xss512k", "-Djava.net.preferIPv4Stack=true"])
        .arg(format!("-Dcassandra.config=file://{d}/cassandra.yaml"))
        .arg(format!("-Dlogback.configurationFile={d}/logback.xml"))
        .arg("-Dcassandra-foreground=yes")
        .arg(format!("-Dcassandra.logdir={d}"))
        // The default superuser (cassandra/cassandra) is created at once, not after 10 s.
        .arg("-Dcassandra.superuser_setup_delay_ms=0");
    for o in OPENS {
        cmd.arg("--add-opens").arg(format!("{o}=ALL-UNNAMED"));
    }
    cmd.arg("-cp")
        .arg(format!("{d}:{}/lib/*", home.display()))
        .arg("org.apache.cassandra.service.CassandraDaemon")
        .stdout(out.try_clone().unwrap())
        .stderr(out);
    let child = cmd.spawn().expect("start java (Cassandra 2.1)");
    Cassandra { child, port, log, _dir: dir }
}

impl Cassandra {
    fn wait_ready(&mut self, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            let log = std::fs::read_to_string(&self.log).unwrap_or_default();
            if log.contains("Starting listening for CQL clients") {
                return;
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("Cassandra exited ({status}) during start-up:\n{}", &log[log.len().saturating_sub(3000)..]);
            }
            assert!(
                Instant::now() < deadline,
                "Cassandra not ready within {within:?}:\n{}",
                &log[log.len().saturating_sub(3000)..]
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cql_credentials_are_required_and_checked_by_a_password_authenticator() {
    let mut cass = start_cassandra();
    tokio::task::block_in_place(|| cass.wait_ready(Duration::from_secs(120)));
    let upstream = format!("127.0.0.1:{}", cass.port);
    let bridge = Bridge::start(&upstream, Duration::from_secs(30));
    let bridge_addr = bridge.addr.clone();

    let cfg = |user: Option<&str>, password: Option<&str>| {
        let mut c = common::config("");
        c.scylla.contact_points = vec![bridge_addr.clone()];
        c.scylla.keyspace = "fairway_auth_it".into();
        c.scylla.username = user.map(str::to_string);
        c.scylla.password = password.map(fairway::config::Secret::new);
        c
    };
    let init = |c: fairway::config::Config| async move {
        tokio::time::timeout(Duration::from_secs(60), fairway::store::ensure_schema(&c)).await.expect("bounded")
    };

    // With the default superuser's credentials: the schema is created (retried while
    // Cassandra finishes setting up its auth tables).
    let deadline = Instant::now() + Duration::from_secs(60);
    let created = loop {
        match init(cfg(Some("cassandra"), Some("cassandra"))).await {
            Ok(c) => break c,
            Err(e) if Instant::now() < deadline => {
                eprintln!("not yet: {e}");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            Err(e) => panic!("no session with valid credentials within 60 s: {e}"),
        }
    };
    assert!(created.iter().any(|t| t.contains("fairway_auth_it")), "{created:?}");

    // Without credentials: refused, and the error says what to set.
    let err = init(cfg(None, None)).await.expect_err("no credentials refused").to_string();
    assert!(err.contains("scylla.username"), "{err}");
    // A wrong password: refused, the error names the settings, never the password.
    let err = init(cfg(Some("cassandra"), Some("not-the-password-123"))).await.expect_err("wrong password").to_string();
    assert!(err.contains("scylla.password") && !err.contains("not-the-password-123"), "{err}");

    drop(bridge);
    drop(cass);
}
