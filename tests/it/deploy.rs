//! The Kubernetes manifests (`deploy/k8s`): every overlay renders with `kubectl kustomize`,
//! validates offline against the Kubernetes schemas (`kubernetes-validate`, strict) with
//! its references resolved (`deploy/k8s/validate.py`), passes `yamllint`, carries a
//! fairway.toml that fairway itself accepts, and gives each pool's pods a termination
//! grace period that covers that pool's drain. Needs `kubectl`; no cluster, no services.

use crate::common;

use fairway::config::Config;
use fairway::model::Pool;
use fairway::worker::pool::HAND_OFF_GRACE;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

/// Time a drained worker needs beyond the hand-off phases: leaving the group, committing.
const EXIT_MARGIN: Duration = Duration::from_secs(5);

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn every_overlay_renders_validates_and_covers_each_pools_drain() {
    // The monitoring files are copies of docker/'s (kustomize reads only below its root).
    for (source, copy) in [
        ("docker/grafana/dashboards/fairway.json", "deploy/k8s/base/monitoring/fairway-dashboard.json"),
        ("docker/prometheus/alerts.yml", "deploy/k8s/base/monitoring/fairway-alerts.yml"),
    ] {
        let (a, b) = (std::fs::read(root().join(source)).unwrap(), std::fs::read(root().join(copy)).unwrap());
        assert!(a == b, "{copy} differs from {source}: run `cp {source} {copy}`");
    }
    let venv = common::python::venv("deploy", &["kubernetes-validate==1.37.0", "yamllint==1.38.0"]);
    let k8s = root().join("deploy/k8s");
    let rendered = tempfile::tempdir().unwrap();
    let mut overlays: Vec<String> = std::fs::read_dir(k8s.join("overlays"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    overlays.sort();
    assert!(overlays.len() >= 2, "overlays: {overlays:?}");
    let mut args = Vec::new();
    for o in &overlays {
        let out = common::python::run(
            Command::new("kubectl").args(["kustomize"]).arg(k8s.join("overlays").join(o)),
            &format!("kubectl kustomize deploy/k8s/overlays/{o} (kubectl is needed for this test)"),
        );
        let path = rendered.path().join(format!("{o}.yaml"));
        std::fs::write(&path, out).unwrap();
        args.push(format!("{o}={}", path.display()));
    }

    let bin = venv.join("bin");
    common::python::run(
        Command::new(bin.join("yamllint")).arg("--strict").arg("-c").arg(k8s.join(".yamllint")).arg(&k8s),
        "yamllint of deploy/k8s",
    );
    // Rendered output: kustomize's own layout (long lines of embedded files, its indentation).
    let relaxed = "{extends: default, rules: {line-length: disable, document-start: disable, \
                   indentation: {indent-sequences: whatever}}}";
    common::python::run(
        Command::new(bin.join("yamllint")).arg("--strict").args(["-d", relaxed]).arg(rendered.path()),
        "yamllint of the rendered overlays",
    );
    let summary = common::python::run(
        Command::new(bin.join("python")).arg(k8s.join("validate.py")).args(&args),
        "deploy/k8s/validate.py (schemas and references)",
    );
    let summary: serde_json::Value = serde_json::from_str(&summary).unwrap();

    for o in &overlays {
        let s = &summary[o];
        let kinds: Vec<&str> = s["kinds"].as_array().unwrap().iter().map(|k| k.as_str().unwrap()).collect();
        for want in ["ConfigMap", "Deployment", "Job", "PodDisruptionBudget", "Service", "ServiceMonitor"] {
            assert!(kinds.contains(&want), "overlay {o} renders no {want}: {kinds:?}");
        }
        let toml = s["fairway_toml"].as_str().unwrap();
        let cfg = Config::parse(toml, &format!("deploy/k8s/overlays/{o} fairway.toml"))
            .unwrap_or_else(|e| panic!("overlay {o}: fairway rejects its fairway.toml: {e}"));
        for pool in Pool::ALL {
            let grace = s["grace_seconds"][pool.as_str()]
                .as_u64()
                .unwrap_or_else(|| panic!("overlay {o}: no worker Deployment for pool {pool}"));
            let drain = cfg.pool(pool).drain_timeout + 2 * HAND_OFF_GRACE + EXIT_MARGIN;
            assert!(
                Duration::from_secs(grace) >= drain,
                "overlay {o}: pool {pool}'s terminationGracePeriodSeconds {grace} is below its drain \
                 (drain_timeout {:?} + 2 x {HAND_OFF_GRACE:?} hand-off grace + {EXIT_MARGIN:?}); Kubernetes \
                 would kill draining jobs",
                cfg.pool(pool).drain_timeout
            );
        }
    }
}
