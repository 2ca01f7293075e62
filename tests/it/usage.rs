//! The usage ledger reconciles with the results topic: jobs of 200 tenants (one with 100x
//! the others' jobs), succeeding, retried and dead-lettered, on two worker processes of
//! which one is killed and restarted, while the ledger's leader is itself killed without a
//! flush and replaced. Afterwards every tenant's ledger counts equal the results topic's
//! exactly, and its run time equals the results' (started, finished) sums (the bar is 1 %).
//! The report is read through `GET /v1/usage` too: a tenant key sees its own usage only.

use crate::common::*;
use fairway::codec;
use fairway::core::ledger::{Granularity, ReportLine};
use fairway::model::{JobResult, JobStatus, JobSubmitted, Pool};
use fairway::now_ms;
use std::collections::BTreeMap;
use std::time::Duration;

const TENANTS: usize = 200;

/// Per tenant: results, succeeded, failed, attempts, run ms.
type Tally = BTreeMap<String, (i64, i64, i64, i64, i64)>;

fn tally_results(rs: &[JobResult]) -> Tally {
    let mut t = Tally::new();
    for r in rs {
        let e = t.entry(r.tenant.clone()).or_default();
        e.0 += 1;
        e.1 += i64::from(r.status == JobStatus::Succeeded);
        e.2 += i64::from(r.status == JobStatus::Failed);
        e.3 += i64::from(r.attempts);
        e.4 += r.started_at.map(|s| (r.finished_at - s).max(0)).unwrap_or(0);
    }
    t
}

fn tally_lines(tenant: &str, lines: &[ReportLine], t: &mut Tally) {
    for l in lines {
        let e = t.entry(tenant.to_string()).or_default();
        e.0 += l.usage.results;
        e.1 += l.usage.succeeded;
        e.2 += l.usage.failed;
        e.3 += l.usage.attempts;
        e.4 += l.usage.run_ms;
    }
}

fn jobs(run: &str) -> Vec<JobSubmitted> {
    let mut out = Vec::new();
    for i in 0..TENANTS {
        let tenant = format!("u{run}-{i:03}");
        // Tenant 0 floods (100x); the rest submit 3 jobs: a sleep, a flaky one retried once,
        // and every tenth tenant one that fails for good (dead-lettered).
        let n = if i == 0 { 300 } else { 3 };
        for k in 0..n {
            let (job_type, payload) = match (i, k) {
                (0, _) => ("echo", b"{}".to_vec()),
                (_, 0) => ("sleep", br#"{"ms":60}"#.to_vec()),
                (_, 1) => ("flaky", br#"{"fail_attempts":1}"#.to_vec()),
                (i, _) if i % 10 == 0 => ("fail", b"{}".to_vec()),
                _ => ("echo", b"{}".to_vec()),
            };
            let mut j = job_record(&tenant, job_type);
            j.payload = payload;
            j.pool = Some(Pool::Short);
            out.push(j);
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_ledger_counts_every_result_once_across_worker_and_leader_deaths() {
    let retry = "[registry]\nunknown_tenants = \"admit\"\n\
                 [job_types.echo]\npool = \"short\"\nhandler = \"echo\"\n\
                 [job_types.sleep]\npool = \"short\"\nhandler = \"sleep\"\n\
                 [job_types.flaky]\npool = \"short\"\nhandler = \"flaky\"\n\
                 [job_types.flaky.retry.app_error]\ndelays = [\"300ms\"]\nmax_attempts = 3\njitter = 0\n\
                 [job_types.fail]\npool = \"short\"\nhandler = \"fail\"\n\
                 [job_types.fail.retry.app_error]\ndelays = [\"300ms\"]\nmax_attempts = 2\njitter = 0\n";
    let cfg = arc(config(retry));
    init(&cfg).await;
    let dir = tempfile::tempdir().unwrap();
    let path = config_file(&cfg, retry, dir.path());
    let mut fleet = Fleet(vec![spawn_worker(&path, "short"), spawn_worker(&path, "short")]);
    let store = fairway::store::Store::open(&cfg).await.unwrap();

    // Leader A: killed (aborted: no final flush, its lease left to lapse) mid-run.
    let (stop_a, stopped_a) = tokio::sync::watch::channel(false);
    let leader_a = tokio::spawn(fairway::ledger::run(cfg.clone(), store.clone(), stopped_a));

    let run = &uuid::Uuid::new_v4().simple().to_string()[..6];
    let all = jobs(run);
    let from = now_ms() - 3_600_000;
    // Every tenant has jobs in both halves: its accounts span both leaders.
    let (first, rest): (Vec<JobSubmitted>, Vec<JobSubmitted>) =
        all.iter().cloned().enumerate().fold((Vec::new(), Vec::new()), |(mut a, mut b), (i, j)| {
            if i % 2 == 0 {
                a.push(j)
            } else {
                b.push(j)
            }
            (a, b)
        });
    produce_spread(&cfg, &first, None).await;
    // A has written totals and positions at least once before it dies.
    let stmts = store.ledger_statements().await.unwrap();
    let flushed = wait_for(Duration::from_secs(30), || async {
        let p = stmts.positions(&cfg.results_topic()).await.ok()?;
        p.iter().any(|p| p.next > 0).then_some(())
    })
    .await;
    assert!(flushed.is_some(), "the first ledger leader wrote no position within 30 s");
    // A worker dies mid-run (its jobs are redelivered: crashes use up no attempts).
    fleet.0[0].kill().unwrap();
    fleet.0[0].wait().unwrap();
    leader_a.abort();
    drop(stop_a);
    produce_spread(&cfg, &rest, None).await;
    fleet.0[0] = spawn_worker(&path, "short");
    // Leader B takes over once A's lease lapses, from the positions A wrote.
    let (stop_b, stopped_b) = tokio::sync::watch::channel(false);
    let leader_b = tokio::spawn(fairway::ledger::run(cfg.clone(), store.clone(), stopped_b));

    let ids: Vec<String> = all.iter().map(|j| j.job_id.clone()).collect();
    let got = results_for(&cfg, &ids, Duration::from_secs(120)).await;
    assert_eq!(got.len(), ids.len(), "every job has a result");
    // Everything on the results topic (duplicates of at-least-once included).
    let published = whole_topic(&cfg, &cfg.results_topic()).await;
    let expected = tally_results(&published);
    let failed: i64 = expected.values().map(|e| e.2).sum();
    let sample: Vec<_> =
        published.iter().filter(|r| r.status == JobStatus::Failed).take(3).map(|r| (&r.job_type, &r.error)).collect();
    assert_eq!(
        failed,
        (TENANTS / 10 - 1) as i64,
        "every tenth tenant but the flooder has one dead-lettered job: {sample:?}"
    );

    let to = now_ms() + 3_600_000;
    let read_all = || async {
        let mut t = Tally::new();
        for tenant in expected.keys() {
            let period = fairway::core::ledger::report_period(from, to).unwrap();
            let q = fairway::ledger::ReportQuery { tenant: tenant.clone(), period, granularity: Granularity::Hour };
            tally_lines(
                tenant,
                &fairway::ledger::report(&stmts, &q, &mut fairway::core::ledger::RowBudget::new(u64::MAX))
                    .await
                    .ok()?,
                &mut t,
            );
        }
        Some(t)
    };
    let caught_up = wait_for(Duration::from_secs(60), || async {
        let t = read_all().await?;
        (t == expected).then_some(t)
    })
    .await;
    if caught_up.is_none() {
        let t = read_all().await.unwrap_or_default();
        let differ: Vec<_> = expected.iter().filter(|(k, v)| t.get(*k) != Some(v)).take(5).collect();
        panic!(
            "the ledger does not equal the results topic; first differing tenants (expected): {differ:?}, ledger: {:?}",
            differ.iter().map(|(k, _)| t.get(*k)).collect::<Vec<_>>()
        );
    }

    // The same through the API: a tenant key reads its own usage, not another's.
    let flooder = format!("u{run}-000");
    let (_, token) = create_key(&cfg, &fairway::core::auth::Caller::Tenant(flooder.clone()), "usage").await;
    let (base, stop_api) = serve_api(&cfg).await;
    let http = reqwest::Client::new();
    let url = format!("{base}/v1/usage?from={from}&to={to}&granularity=day");
    let body: serde_json::Value =
        http.get(&url).bearer_auth(&token).send().await.unwrap().error_for_status().unwrap().json().await.unwrap();
    assert_eq!(body["total"]["results"], expected[&flooder].0, "{body}");
    let other = http.get(format!("{url}&tenant=u{run}-001")).bearer_auth(&token).send().await.unwrap();
    assert_eq!(other.status(), 403);

    let _ = stop_api.send(());
    stop_b.send(true).unwrap();
    let _ = tokio::time::timeout(Duration::from_secs(10), leader_b).await;
}

/// Every result on `topic` up to its high watermarks as of now.
/// Times a caller gives are refused before any arithmetic or loop uses them: the request
/// that used to make `core::ledger::days` wrap and fill one `Vec` until `serve` was killed
/// (from/to near `i64::MAX`) answers 400 naming the field and the range, so do a period
/// below 1970, one past 93 days and `execute_at`/`not_after` outside 1970..9999; the API
/// answers a valid report afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn times_a_caller_gives_are_bounded_before_use() {
    let cfg = arc(config("[registry]\nunknown_tenants = \"admit\"\n"));
    init(&cfg).await;
    let tenant = format!("bound-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let (_, token) = create_key(&cfg, &fairway::core::auth::Caller::Tenant(tenant.clone()), "bounds").await;
    let (_, admin) = create_key(&cfg, &fairway::core::auth::Caller::Admin, "bounds").await;
    let (base, stop_api) = serve_api(&cfg).await;
    let http = reqwest::Client::builder().timeout(Duration::from_secs(20)).build().unwrap();
    let get = |query: String, key: &str| {
        let req = http.get(format!("{base}{query}")).bearer_auth(key);
        async move {
            let r = req.send().await.expect("an answer, not a dropped connection");
            let status = r.status().as_u16();
            (status, r.json::<serde_json::Value>().await.unwrap_or_default())
        }
    };
    const DAY: i64 = 86_400_000;
    for (from, to, field, says) in [
        ("9223372036854775000".to_string(), "9223372036854775807".to_string(), "`from`", "253402300799999"),
        ("-9223372036854775808".to_string(), "0".to_string(), "`from`", "253402300799999"),
        ("0".to_string(), "9223372036854775807".to_string(), "`to`", "253402300799999"),
        ("0".to_string(), (94 * DAY).to_string(), "`from` to `to`", "at most 93 days"),
        ("5000".to_string(), "5000".to_string(), "`to`", "must be after"),
    ] {
        let (status, body) = get(format!("/v1/usage?from={from}&to={to}&granularity=hour"), &token).await;
        assert_eq!(status, 400, "from={from} to={to}: {body}");
        assert_eq!(body["code"], "INVALID_QUERY", "{body}");
        let msg = body["error"].as_str().unwrap_or_default();
        assert!(msg.contains(field) && msg.contains(says), "from={from} to={to}: {msg}");
    }
    for month in ["10000-01", "1969-12"] {
        let (status, body) = get(format!("/v1/admin/usage?month={month}"), &admin).await;
        assert_eq!(status, 400, "month={month}: {body}");
        assert!(body["error"].as_str().unwrap_or_default().contains("1970-01 to 9999-12"), "{body}");
    }
    for (field, value) in [("execute_at", i64::MIN), ("execute_at", -1), ("not_after", i64::MAX)] {
        let job = serde_json::json!({"job_type": "echo", "payload": {}, field: value});
        let r = http.post(format!("{base}/v1/jobs")).bearer_auth(&token).json(&job).send().await.expect("an answer");
        let status = r.status().as_u16();
        let body: serde_json::Value = r.json().await.unwrap_or_default();
        assert_eq!((status, body["code"].as_str()), (400, Some("TIME_OUT_OF_RANGE")), "{field}={value}: {body}");
        assert!(body["error"].as_str().unwrap_or_default().contains(field), "{body}");
    }
    // Still serving: a valid period answers (nothing used yet: zero lines).
    let now = now_ms();
    let (status, body) = get(format!("/v1/usage?from={}&to={now}&granularity=day", now - 93 * DAY), &token).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["lines"], serde_json::json!([]), "{body}");
    let _ = stop_api.send(());
}

/// Issue 63 (2): heavy reads are weighed. 30 concurrent 93-day reports from one tenant
/// (over two of its keys) hold at most `heavy_reads_per_key` (2) at once, the rest are
/// refused at once with `TOO_MANY_HEAVY_READS`, and another tenant's report meanwhile is
/// answered promptly; a report or tenant page past `ledger_rows_per_request` stops at the
/// budget with `READ_TOO_LARGE` and says what to narrow.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn heavy_reads_are_bounded_in_flight_per_tenant_and_in_rows() {
    use fairway::core::auth::Caller;
    use fairway::core::ledger::{Account, Flush, Usage};
    let mut c = config("[registry]\nunknown_tenants = \"admit\"\n");
    c.api.limits.ledger_rows_per_request = 1_000;
    let cfg = arc(c);
    init(&cfg).await;
    let run = &uuid::Uuid::new_v4().simple().to_string()[..8];
    let (a, b) = (format!("heavy-a-{run}"), format!("heavy-b-{run}"));
    let (_, a1) = create_key(&cfg, &Caller::Tenant(a.clone()), "heavy").await;
    let (_, a2) = create_key(&cfg, &Caller::Tenant(a.clone()), "heavy").await;
    let (_, b1) = create_key(&cfg, &Caller::Tenant(b.clone()), "heavy").await;
    let (base, stop_api) = serve_api(&cfg).await;
    let http = reqwest::Client::builder().timeout(Duration::from_secs(60)).build().unwrap();
    const DAY: i64 = 86_400_000;
    let now = now_ms();
    let today = now.div_euclid(DAY) * DAY;

    // A's usage today: 1,200 ledger rows (3 partitions x 4 windows x 100 job types),
    // past the budget of 1,000 rows.
    let store = fairway::store::Store::open(&cfg).await.expect("store");
    let stmts = store.ledger_statements().await.expect("ledger statements");
    for part in 0..3 {
        for w in 0..4 {
            let window = today + w * fairway::core::ledger::WINDOW_MS;
            let rows = (0..100)
                .map(|j| {
                    let account = Account { tenant: a.clone(), pool: Pool::Short, job_type: format!("t{j}") };
                    (account, Usage { results: 1, succeeded: 1, run_ms: 10, ..Usage::default() })
                })
                .collect();
            let f = Flush { window, first: 0, upto: 1, rows, fleet: vec![] };
            stmts.put_flush(part, &f, 3_600).await.expect("ledger rows");
        }
    }

    let get = |path: String, key: String| {
        let req = http.get(format!("{base}{path}")).bearer_auth(key);
        async move {
            let t = std::time::Instant::now();
            let r = req.send().await.expect("an answer");
            let status = r.status().as_u16();
            let text = r.text().await.unwrap_or_default();
            (
                status,
                serde_json::from_str::<serde_json::Value>(&text).unwrap_or(serde_json::Value::String(text)),
                t.elapsed(),
            )
        }
    };
    // Before A's usage: 93 days, one partition read per day (nothing over the budget).
    let long = format!("/v1/usage?from={}&to={}&granularity=day", today - 92 * DAY, today);
    let floods: Vec<_> =
        (0..30).map(|i| tokio::spawn(get(long.clone(), if i % 2 == 0 { a1.clone() } else { a2.clone() }))).collect();
    let mut b_waits = Vec::new();
    for _ in 0..5 {
        let (status, body, took) = get(long.clone(), b1.clone()).await;
        assert_eq!(status, 200, "B's report while A floods: {body}");
        b_waits.push(took);
    }
    let answers: Vec<(u16, serde_json::Value, Duration)> =
        futures::future::join_all(floods).await.into_iter().map(Result::unwrap).collect();
    let ok = answers.iter().filter(|(s, _, _)| *s == 200).count();
    let refused: Vec<_> = answers.iter().filter(|(s, _, _)| *s == 429).collect();
    println!("A's 30 heavy reads: {ok} answered, {} refused; B's 5 reports took {b_waits:?}", refused.len());
    assert_eq!(ok + refused.len(), 30, "every one answered 200 or 429: {answers:?}");
    assert!(refused.len() >= 20, "at most a few of A's 30 concurrent reads ran: {ok} answered");
    for (_, body, _) in &refused {
        assert_eq!(body["code"], "TOO_MANY_HEAVY_READS", "{body}");
        assert!(body["error"].as_str().unwrap_or_default().contains("heavy_reads_per_key"), "{body}");
    }
    for w in &b_waits {
        assert!(*w < Duration::from_secs(5), "B's report took {w:?} while A flooded");
    }

    // Today's 1,200 rows are past the budget: 422 naming what to narrow.
    let (status, body, _) = get(format!("/v1/usage?from={today}&to={now}&granularity=hour"), a1.clone()).await;
    assert_eq!((status, body["code"].as_str()), (422, Some("READ_TOO_LARGE")), "{body}");
    let msg = body["error"].as_str().unwrap_or_default();
    assert!(msg.contains("1000") && msg.contains("narrow from/to"), "{msg}");
    // B's today is small: answered.
    let (status, body, _) = get(format!("/v1/usage?from={today}&to={now}&granularity=hour"), b1.clone()).await;
    assert_eq!(status, 200, "{body}");
    // A's tenant page reads the same rows: refused the same way, not read whole.
    let (status, body, _) = get(format!("/console/tenants/{a}"), a1.clone()).await;
    assert_eq!(status, 503, "{body}");
    assert!(body.to_string().contains("api.limits.ledger_rows_per_request"), "{body}");
    let (status, body, _) = get(format!("/console/tenants/{b}"), b1.clone()).await;
    assert_eq!(status, 200, "{body}");
    let _ = stop_api.send(());
}

/// The admin export streams every tenant's day a chunk of tenants at a time: 100
/// tenants' usage today comes out as 100 lines (ndjson and csv); a tenant whose day is
/// past `ledger_rows_per_request` ends the stream with an error instead of being read
/// whole into memory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_export_streams_every_tenant_and_bounds_each_tenants_day() {
    use fairway::core::auth::Caller;
    use fairway::core::ledger::{Account, Flush, Usage};
    let mut c = config("[registry]\nunknown_tenants = \"admit\"\n");
    c.api.limits.ledger_rows_per_request = 1_000;
    let cfg = arc(c);
    init(&cfg).await;
    let (_, admin) = create_key(&cfg, &Caller::Admin, "export").await;
    let (base, stop_api) = serve_api(&cfg).await;
    const DAY: i64 = 86_400_000;
    let today = now_ms().div_euclid(DAY) * DAY;
    let month = chrono::DateTime::from_timestamp_millis(today).unwrap().format("%Y-%m").to_string();
    let store = fairway::store::Store::open(&cfg).await.expect("store");
    let stmts = store.ledger_statements().await.expect("ledger statements");
    let usage = Usage { results: 2, succeeded: 2, run_ms: 10, ..Usage::default() };
    let account = |t: String, j: usize| Account { tenant: t, pool: Pool::Short, job_type: format!("t{j}") };
    let rows = (0..100).map(|i| (account(format!("export-{i:03}"), 0), usage)).collect();
    stmts.put_flush(0, &Flush { window: today, first: 0, upto: 1, rows, fleet: vec![] }, 3_600).await.unwrap();
    let http = reqwest::Client::builder().timeout(Duration::from_secs(60)).build().unwrap();
    let export =
        |format: &str| http.get(format!("{base}/v1/admin/usage?month={month}&format={format}")).bearer_auth(&admin);

    let text = export("ndjson").send().await.unwrap().text().await.expect("the whole export");
    let lines: Vec<serde_json::Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let mut tenants: Vec<&str> = lines.iter().map(|l| l["tenant"].as_str().unwrap()).collect();
    tenants.sort_unstable();
    tenants.dedup();
    assert_eq!(tenants.len(), 100, "{text}");
    assert!(lines.iter().all(|l| l["results"] == 2), "{}", lines[0]);
    let csv = export("csv").send().await.unwrap().text().await.expect("the whole export");
    assert_eq!(csv.lines().count(), 1 + lines.len(), "a header and the same lines: {csv}");

    // One tenant's day of 1,200 rows (100 job types x 12 windows), past the budget.
    for w in 0..12 {
        let rows = (0..100).map(|j| (account("export-huge".into(), j), usage)).collect();
        let window = today + w * fairway::core::ledger::WINDOW_MS;
        stmts.put_flush(0, &Flush { window, first: 0, upto: 1, rows, fleet: vec![] }, 3_600).await.unwrap();
    }
    let resp = export("ndjson").send().await.unwrap();
    assert_eq!(resp.status(), 200);
    let cut = resp.text().await;
    assert!(cut.is_err(), "an export past a tenant's row budget ended as if whole: {} bytes", cut.unwrap().len());
    let _ = stop_api.send(());
}

async fn whole_topic(cfg: &fairway::config::Config, topic: &str) -> Vec<JobResult> {
    let (c, t) = (cfg.clone(), topic.to_string());
    let reader = tokio::task::spawn_blocking(move || fairway::kafka::reader_from_start(&c, "usage-check", &t))
        .await
        .unwrap()
        .expect("reader");
    let reader = std::sync::Arc::new(reader);
    let ends: BTreeMap<i32, i64> =
        fairway::kafka::partition_ends(reader.clone(), topic.to_string()).await.expect("ends").into_iter().collect();
    let mut next: BTreeMap<i32, i64> = ends.keys().map(|p| (*p, 0)).collect();
    let mut out = Vec::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while next.iter().any(|(p, n)| n < &ends[p]) {
        assert!(std::time::Instant::now() < deadline, "the results topic was not read to its end in 30 s");
        use fairway::kafka::Message;
        if let Ok(Ok(m)) = tokio::time::timeout(Duration::from_millis(500), reader.recv()).await {
            next.insert(m.partition(), m.offset() + 1);
            out.extend(m.payload().and_then(|b| codec::decode_result(b).ok()));
        }
    }
    out
}

/// The test's worker processes, killed however the test ends.
struct Fleet(Vec<std::process::Child>);

impl Drop for Fleet {
    fn drop(&mut self) {
        for w in &mut self.0 {
            let _ = w.kill();
            let _ = w.wait();
        }
    }
}
