//! The TypeScript client (`clients/typescript`) on the real broker and CQL database, as
//! a user gets it: `npm ci` from its lockfile, build, types check, its unit tests
//! (node:test), `npm pack`, the tarball installed into an empty folder, and a script
//! there (`e2e/submit-2000.mjs`) that submits 2,000 jobs over the API started here,
//! follows one over Server-Sent Events to its result and reads all 2,000 results from
//! Kafka, against the services `clients` starts (a `fairway worker` of the short pool and
//! the HTTP API), the ones the Python client is tested against too. Before that, real
//! answers of the API are checked against its OpenAPI description
//! (`tests/common/openapi.rs`).

use crate::common;

use serde_json::{json, Value};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

/// Runs `args` (a program and its arguments) in `dir` under `timeout` seconds; its
/// output, or a panic naming `what` with the output.
fn run(dir: &Path, secs: u64, args: &[&str], env: &[(&str, &str)], what: &str) -> String {
    let start = Instant::now();
    let mut cmd = Command::new("timeout");
    cmd.arg(secs.to_string()).args(args).current_dir(dir);
    for (k, v) in env {
        cmd.env(k, v);
    }
    // npm's own update check and audit would reach the registry for nothing.
    cmd.env("npm_config_update_notifier", "false").env("npm_config_audit", "false").env("npm_config_fund", "false");
    let out = common::python::run(&mut cmd, what);
    eprintln!("{what}: {:.1} s", start.elapsed().as_secs_f64());
    out
}

/// Real answers of the API, checked against the description.
async fn answers_fit_the_description(api: &str, key: &str) {
    let http = reqwest::Client::builder().timeout(Duration::from_secs(30)).no_proxy().build().unwrap();
    let call = |method: reqwest::Method, path: &str, body: Option<Value>, auth: bool| {
        let mut req = http.request(method, format!("{api}{path}"));
        if auth {
            req = req.bearer_auth(key);
        }
        if let Some(b) = body {
            req = req.json(&b);
        }
        async move {
            let resp = req.send().await.expect("the API answers");
            let status = resp.status().as_u16();
            let text = resp.text().await.unwrap();
            (status, serde_json::from_str::<Value>(&text).unwrap_or(Value::String(text)))
        }
    };
    use reqwest::Method;
    // The description itself, without a key: the one built into the binary.
    let (status, body) = call(Method::GET, "/v1/openapi.json", None, false).await;
    assert_eq!((status, &body), (200, &common::openapi::doc()));

    let job =
        json!({"tenant": "acme", "job_type": "echo", "payload": {"n": 1}, "priority": "urgent", "user_key": "u1"});
    let (status, one) = call(Method::POST, "/v1/jobs", Some(job.clone()), true).await;
    assert_eq!(status, 201, "{one}");
    common::openapi::check("post", "/v1/jobs", status, &one);
    let id = one["job_id"].as_str().unwrap().to_string();
    let (status, batch) = call(Method::POST, "/v1/jobs:batch", Some(json!([job.clone(), job])), true).await;
    common::openapi::check("post", "/v1/jobs:batch", status, &batch);
    let done = common::wait_for(Duration::from_secs(60), async || {
        let (status, body) = call(Method::GET, &format!("/v1/jobs/{id}"), None, true).await;
        (status == 200 && body["status"] == "succeeded").then_some(body)
    })
    .await
    .expect("the job succeeded within 60 s");
    common::openapi::check("get", "/v1/jobs/{id}", 200, &done);
    let (status, history) = call(Method::GET, &format!("/v1/jobs/{id}/events"), None, true).await;
    common::openapi::check("get", "/v1/jobs/{id}/events", status, &history);
    let (status, finished) = call(Method::DELETE, &format!("/v1/jobs/{id}"), None, true).await;
    assert_eq!((status, finished["code"].as_str()), (409, Some("JOB_ALREADY_FINISHED")));
    common::openapi::check("delete", "/v1/jobs/{id}", status, &finished);
    let (status, unknown) = call(Method::GET, "/v1/jobs/no-such-job", None, true).await;
    common::openapi::check("get", "/v1/jobs/{id}", status, &unknown);
    let (status, anonymous) = call(Method::GET, "/v1/jobs/no-such-job", None, false).await;
    assert_eq!(status, 401);
    common::openapi::check("get", "/v1/jobs/{id}", status, &anonymous);
    let (status, invalid) =
        call(Method::POST, "/v1/jobs", Some(json!({"tenant": "acme", "job_type": "echo", "colour": 1})), true).await;
    common::openapi::check("post", "/v1/jobs", status, &invalid);
    let (status, schedules) = call(Method::GET, "/v1/schedules?tenant=acme", None, true).await;
    common::openapi::check("get", "/v1/schedules", status, &schedules);
    let now = fairway::now_ms();
    let (status, usage) =
        call(Method::GET, &format!("/v1/usage?tenant=acme&from={}&to={now}", now - 3_600_000), None, true).await;
    common::openapi::check("get", "/v1/usage", status, &usage);
    let (status, alerts) = call(Method::GET, "/v1/alerts?tenant=acme", None, true).await;
    common::openapi::check("get", "/v1/alerts", status, &alerts);
    let (status, no_follow) = call(Method::GET, "/v1/events", None, true).await;
    common::openapi::check("get", "/v1/events", status, &no_follow);

    // The checks can fail: a body off the description is refused.
    let mut errors = Vec::new();
    let doc = common::openapi::doc();
    let bad = json!({"job_id": 7, "pool": "tiny", "duplicate": false});
    common::openapi::validate(&doc, &json!({"$ref": "#/components/schemas/Submitted"}), &bad, "$", &mut errors);
    assert_eq!(errors.len(), 2, "{errors:?}");
}

/// Builds, checks, packs and installs the client, then moves 2,000 jobs through
/// `services` with it and the admin key `key` (the job type `echo` of the short pool);
/// panics on any shortfall.
pub async fn installs_from_its_tarball_and_moves_2000_jobs(services: &common::ClientServices, key: String) {
    let (cfg, api, worker) = (services.cfg.clone(), services.api.clone(), &services.worker);
    answers_fit_the_description(&api, &key).await;

    let client = Path::new(env!("CARGO_MANIFEST_DIR")).join("clients/typescript");
    let packed = tempfile::tempdir().unwrap();
    let user = tempfile::tempdir().unwrap();
    let (brokers, prefix) = (cfg.kafka.brokers.clone(), cfg.kafka.topic_prefix.clone());
    let (api2, key2) = (api.clone(), key.clone());
    let out = tokio::task::spawn_blocking(move || {
        let c = client.as_path();
        run(c, 600, &["npm", "ci"], &[], "npm ci (clients/typescript, from package-lock.json)");
        run(c, 300, &["npm", "run", "build"], &[], "npm run build");
        run(c, 300, &["npm", "run", "typecheck"], &[], "tsc --noEmit (sources, tests, example)");
        let unit = run(c, 300, &["npm", "test"], &[], "the client's unit tests (node:test)");
        assert!(unit.contains("# fail 0"), "{unit}");
        let pack =
            run(c, 300, &["npm", "pack", "--pack-destination", packed.path().to_str().unwrap()], &[], "npm pack");
        let tarball = packed.path().join(pack.lines().last().expect("npm pack names the tarball").trim());
        assert!(tarball.exists(), "npm pack made no {tarball:?}");
        // An empty folder: the package as a user installs it.
        let u = user.path();
        std::fs::write(u.join("package.json"), r#"{"name": "fairway-ts-user", "private": true, "type": "module"}"#)
            .unwrap();
        run(u, 600, &["npm", "install", "--prefer-offline", tarball.to_str().unwrap()], &[], "npm install <tarball>");
        for f in ["submit-2000.mjs", "check.ts"] {
            std::fs::copy(c.join("e2e").join(f), u.join(f)).unwrap();
        }
        let tsconfig = json!({"compilerOptions": {"module": "NodeNext", "moduleResolution": "NodeNext", "target": "ES2022",
            "strict": true, "noEmit": true, "skipLibCheck": true, "types": ["node"],
            "typeRoots": [c.join("node_modules/@types").to_str().unwrap()]}, "files": ["check.ts"]});
        std::fs::write(u.join("tsconfig.json"), tsconfig.to_string()).unwrap();
        let tsc = c.join("node_modules/typescript/bin/tsc");
        run(
            u,
            300,
            &["node", tsc.to_str().unwrap(), "-p", "tsconfig.json"],
            &[],
            "tsc --noEmit against the installed tarball's types",
        );
        let env = [
            ("FAIRWAY_TEST_API", api2.as_str()),
            ("FAIRWAY_TEST_API_KEY", key2.as_str()),
            ("FAIRWAY_TEST_BROKERS", brokers.as_str()),
            ("FAIRWAY_TEST_TOPIC_PREFIX", prefix.as_str()),
        ];
        run(
            u,
            420,
            &["node", "submit-2000.mjs"],
            &env,
            "submit 2,000 jobs, follow one over SSE, read 2,000 results from Kafka",
        )
    });
    let out = match out.await {
        Ok(out) => out,
        Err(e) => {
            worker.print_tail("worker");
            std::panic::resume_unwind(e.into_panic());
        }
    };
    let summary: Value =
        serde_json::from_str(out.lines().last().unwrap_or_default()).unwrap_or_else(|e| panic!("{e}: {out}"));
    eprintln!("{summary}");
    assert_eq!(
        (summary["jobs"].as_u64(), summary["missing"].as_u64(), summary["wrong"].as_u64()),
        (Some(2000), Some(0), Some(0))
    );
    assert_eq!(summary["replay_dry_run"], json!({"done": true, "would_replay": 0}), "{summary}");
    assert_eq!(summary["followed_events"].as_array().and_then(|k| k.last()).and_then(Value::as_str), Some("succeeded"));
}
