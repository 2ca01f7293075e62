//! ScyllaDB credentials against a real PasswordAuthenticator: the test starts its own
//! Apache Cassandra 5 (`scripts/services up cassandra` with a private services directory,
//! free ports and `authenticator: PasswordAuthenticator`; stopped and deleted at the end).
//! The shared local Cassandra is not touched. A session with credentials works
//! (`fairway init`'s schema step), without them or with a wrong password it fails with an
//! error that says which settings to check, and the password appears in no error.

use crate::common;

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const SERVICES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/services");

/// A Cassandra this test started through `scripts/services`; stopped (by the script,
/// which ends only the PID it started) and deleted when dropped.
struct Cassandra {
    dir: PathBuf,
    port: u16,
    env: Vec<(&'static str, String)>,
}

impl Cassandra {
    fn start() -> Cassandra {
        let dir = std::env::temp_dir().join(format!("fairway-it-cql-auth-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let (port, storage) = (common::free_port(), common::free_port());
        let env = vec![
            ("FAIRWAY_SERVICES_DIR", dir.display().to_string()),
            ("FAIRWAY_CQL_PORT", port.to_string()),
            ("FAIRWAY_CASSANDRA_STORAGE_PORT", storage.to_string()),
            ("FAIRWAY_CASSANDRA_HEAP", "512m".to_string()),
            ("FAIRWAY_SERVICES_TIMEOUT", "120".to_string()),
            (
                "FAIRWAY_CASSANDRA_EXTRA",
                "authenticator: PasswordAuthenticator\nauthorizer: AllowAllAuthorizer".to_string(),
            ),
        ];
        let c = Cassandra { dir, port, env };
        let status = Command::new(SERVICES)
            .args(["up", "cassandra"])
            .envs(c.env.iter().map(|(k, v)| (*k, v.as_str())))
            .stdout(Stdio::null())
            .status()
            .expect("run scripts/services");
        assert!(status.success(), "scripts/services up cassandra (private, with a PasswordAuthenticator) failed");
        c
    }
}

impl Drop for Cassandra {
    fn drop(&mut self) {
        let _ = Command::new(SERVICES)
            .args(["down", "--wipe", "cassandra"])
            .envs(self.env.iter().map(|(k, v)| (*k, v.as_str())))
            .status();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cql_credentials_are_required_and_checked_by_a_password_authenticator() {
    let cass = tokio::task::block_in_place(Cassandra::start);
    let addr = format!("127.0.0.1:{}", cass.port);

    let cfg = |user: Option<&str>, password: Option<&str>| {
        let mut c = common::config("");
        c.scylla.contact_points = vec![addr.clone()];
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
    // A long-running process's start (`store::reach`) does not wait on a wrong setting:
    // no try is heard, and the error is the settings', not an unreachable database's.
    for (user, password) in [(None, None), (Some("cassandra"), Some("not-the-password-123"))] {
        let c = cfg(user, password);
        let opened = tokio::time::timeout(
            Duration::from_secs(60),
            fairway::store::open_waiting(&c, Duration::from_secs(600), |w| {
                panic!("a wrong setting was waited on as if the database were down: {}", w.describe())
            }),
        )
        .await
        .expect("bounded");
        let err = opened.err().expect("wrong credentials refused");
        assert!(matches!(err, fairway::store::StoreError::Connect { .. }), "{err}");
    }

    drop(cass);
}
