//! The Python client (`clients/python`) on the real broker and CQL database: installs it
//! from its pyproject.toml into a virtual environment under target/python and runs its
//! pytest suite against the services `clients` starts (a `fairway worker` of the short
//! pool and the HTTP API), the ones the TypeScript client is tested against too.

use crate::common;

use std::path::Path;
use std::process::Command;

/// The job types the client's tests submit.
pub const JOB_TYPES: &str = "[job_types.echo]\npool = \"short\"\nhandler = \"echo\"\n\
                             [job_types.sleep]\npool = \"short\"\nhandler = \"sleep\"\ntimeout = \"10s\"\n";

/// Installs the client and runs its pytest suite against `services`; panics with the
/// suite's output (and the worker's log tail) when a test fails.
pub async fn its_tests_pass(services: &common::ClientServices) {
    let (cfg, api, key, worker) = (services.cfg.clone(), services.api.clone(), services.key.clone(), &services.worker);
    let client = Path::new(env!("CARGO_MANIFEST_DIR")).join("clients/python");
    let venv = tokio::task::spawn_blocking(common::python::client_venv).await.unwrap();
    let python = venv.join("bin/python");
    // The package as a user installs it (pyproject.toml, package data), from this tree.
    common::python::run(
        Command::new(&python)
            .args(["-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation", "--force-reinstall"])
            .arg(&client),
        "pip install clients/python",
    );
    let out = tokio::task::spawn_blocking(move || {
        Command::new("timeout")
            .args(["300", python.to_str().unwrap(), "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"])
            .current_dir(&client)
            .env("FAIRWAY_TEST_BROKERS", &cfg.kafka.brokers)
            .env("FAIRWAY_TEST_TOPIC_PREFIX", &cfg.kafka.topic_prefix)
            .env("FAIRWAY_TEST_API", &api)
            .env("FAIRWAY_TEST_API_KEY", &key)
            .output()
            .expect("run pytest")
    })
    .await
    .unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    if !out.status.success() {
        worker.print_tail("worker");
    }
    assert!(out.status.success(), "the Python client's tests failed ({}):\n{text}", out.status);
    eprintln!("{text}");
}
