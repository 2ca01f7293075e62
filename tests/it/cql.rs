//! Smoke test of the CQL path: the `scylla` crate (protocol v4) straight to the local
//! Apache Cassandra 5.0 (what ScyllaDB speaks too).
//!
//! Needs the local services: `scripts/services up`. Address from `FAIRWAY_CQL`
//! (default 127.0.0.1:19042). Each test works in its own keyspace and drops it.
//! CQL stays inside what both Cassandra 2.1 and ScyllaDB accept.

use std::time::Duration;

use scylla::client::session::Session;
use scylla::client::session_builder::SessionBuilder;
use scylla::statement::batch::{Batch, BatchType};
use scylla::value::{CqlValue, Row};

const TEST_TIMEOUT: Duration = Duration::from_secs(60);

fn cql_addr() -> String {
    std::env::var("FAIRWAY_CQL").unwrap_or_else(|_| "127.0.0.1:19042".to_owned())
}

async fn session() -> Session {
    let addr = cql_addr();
    SessionBuilder::new().known_node(&addr).connection_timeout(Duration::from_secs(5)).build().await.unwrap_or_else(
        |e| panic!("cannot connect to CQL at {addr} ({e}); start the local services with `scripts/services up`"),
    )
}

/// Creates a fresh keyspace (SimpleStrategy, rf 1) and returns its name.
async fn keyspace(s: &Session) -> String {
    let ks = format!("it_{}", uuid::Uuid::new_v4().simple());
    s.query_unpaged(
        format!("CREATE KEYSPACE {ks} WITH replication = {{'class': 'SimpleStrategy', 'replication_factor': 1}}"),
        &[],
    )
    .await
    .expect("create keyspace");
    ks
}

async fn drop_keyspace(s: &Session, ks: &str) {
    s.query_unpaged(format!("DROP KEYSPACE {ks}"), &[]).await.expect("drop keyspace");
}

async fn bounded<F: std::future::Future<Output = ()>>(f: F) {
    tokio::time::timeout(TEST_TIMEOUT, f).await.expect("test timed out");
}

/// `[applied]` from an LWT result (first column; later columns hold the existing row).
fn applied(result: scylla::response::query_result::QueryResult) -> bool {
    let rows = result.into_rows_result().expect("LWT returns rows");
    let row: Row = rows.first_row().expect("one row");
    match row.columns.first() {
        Some(Some(CqlValue::Boolean(b))) => *b,
        other => panic!("unexpected [applied] column: {other:?}"),
    }
}

#[tokio::test]
async fn prepared_insert_and_select() {
    bounded(async {
        let s = session().await;
        let ks = keyspace(&s).await;
        s.query_unpaged(
            format!(
                "CREATE TABLE {ks}.jobs (tenant text, id bigint, payload blob, attempts int, PRIMARY KEY (tenant, id))"
            ),
            &[],
        )
        .await
        .expect("create table");

        let insert = s
            .prepare(format!("INSERT INTO {ks}.jobs (tenant, id, payload, attempts) VALUES (?, ?, ?, ?)"))
            .await
            .expect("prepare insert");
        for id in 0..5i64 {
            s.execute_unpaged(&insert, ("acme", id, vec![id as u8; 3], 0i32)).await.expect("insert");
        }
        s.execute_unpaged(&insert, ("globex", 1i64, vec![9u8], 2i32)).await.expect("insert");

        let select = s
            .prepare(format!("SELECT id, payload, attempts FROM {ks}.jobs WHERE tenant = ? AND id >= ?"))
            .await
            .expect("prepare select");
        let rows: Vec<(i64, Vec<u8>, i32)> = s
            .execute_unpaged(&select, ("acme", 2i64))
            .await
            .expect("select")
            .into_rows_result()
            .expect("rows")
            .rows::<(i64, Vec<u8>, i32)>()
            .expect("typed rows")
            .collect::<Result<_, _>>()
            .expect("deserialize");
        assert_eq!(rows, vec![(2, vec![2; 3], 0), (3, vec![3; 3], 0), (4, vec![4; 3], 0)]);

        // Clustering-key equality on a single row.
        let one =
            s.prepare(format!("SELECT attempts FROM {ks}.jobs WHERE tenant = ? AND id = ?")).await.expect("prepare");
        let (attempts,): (i32,) = s
            .execute_unpaged(&one, ("globex", 1i64))
            .await
            .expect("select one")
            .into_rows_result()
            .expect("rows")
            .single_row()
            .expect("exactly one row");
        assert_eq!(attempts, 2);
        drop_keyspace(&s, &ks).await;
    })
    .await;
}

#[tokio::test]
async fn ttl_expires_rows() {
    bounded(async {
        let s = session().await;
        let ks = keyspace(&s).await;
        s.query_unpaged(format!("CREATE TABLE {ks}.leases (k text PRIMARY KEY, owner text)"), &[])
            .await
            .expect("create table");
        // TTL 3, not 1: the database counts expiry in whole seconds from the write's second,
        // so a row with TTL 1 written late in a second can be gone a millisecond later.
        let insert =
            s.prepare(format!("INSERT INTO {ks}.leases (k, owner) VALUES (?, ?) USING TTL 3")).await.expect("prepare");
        s.execute_unpaged(&insert, ("lease-1", "worker-a")).await.expect("insert");
        let select = s.prepare(format!("SELECT owner FROM {ks}.leases WHERE k = ?")).await.expect("prepare");
        let count = |r: scylla::response::query_result::QueryResult| r.into_rows_result().expect("rows").rows_num();
        assert_eq!(count(s.execute_unpaged(&select, ("lease-1",)).await.expect("select")), 1);
        tokio::time::sleep(Duration::from_millis(4500)).await;
        assert_eq!(
            count(s.execute_unpaged(&select, ("lease-1",)).await.expect("select")),
            0,
            "row with TTL 3 must be gone after 4.5 s"
        );
        drop_keyspace(&s, &ks).await;
    })
    .await;
}

#[tokio::test]
async fn lwt_insert_if_not_exists() {
    bounded(async {
        let s = session().await;
        let ks = keyspace(&s).await;
        s.query_unpaged(format!("CREATE TABLE {ks}.dedup (id text PRIMARY KEY, owner text)"), &[])
            .await
            .expect("create table");
        let insert = s
            .prepare(format!("INSERT INTO {ks}.dedup (id, owner) VALUES (?, ?) IF NOT EXISTS"))
            .await
            .expect("prepare");
        assert!(applied(s.execute_unpaged(&insert, ("job-1", "a")).await.expect("lwt 1")));
        assert!(!applied(s.execute_unpaged(&insert, ("job-1", "b")).await.expect("lwt 2")));
        let (owner,): (String,) = s
            .query_unpaged(format!("SELECT owner FROM {ks}.dedup WHERE id = 'job-1'"), &[])
            .await
            .expect("select")
            .into_rows_result()
            .expect("rows")
            .single_row()
            .expect("one row");
        assert_eq!(owner, "a", "the losing LWT must not overwrite");
        drop_keyspace(&s, &ks).await;
    })
    .await;
}

#[tokio::test]
async fn unlogged_batch() {
    bounded(async {
        let s = session().await;
        let ks = keyspace(&s).await;
        s.query_unpaged(
            format!("CREATE TABLE {ks}.events (tenant text, seq int, body text, PRIMARY KEY (tenant, seq))"),
            &[],
        )
        .await
        .expect("create table");
        let insert =
            s.prepare(format!("INSERT INTO {ks}.events (tenant, seq, body) VALUES (?, ?, ?)")).await.expect("prepare");
        let mut batch = Batch::new(BatchType::Unlogged);
        batch.append_statement(insert.clone());
        batch.append_statement(insert.clone());
        batch.append_statement(
            format!("UPDATE {ks}.events SET body = 'third' WHERE tenant = 't1' AND seq = 3").as_str(),
        );
        s.batch(&batch, (("t1", 1i32, "first"), ("t1", 2i32, "second"), ())).await.expect("batch");
        let rows: Vec<(i32, String)> = s
            .query_unpaged(format!("SELECT seq, body FROM {ks}.events WHERE tenant = 't1'"), &[])
            .await
            .expect("select")
            .into_rows_result()
            .expect("rows")
            .rows::<(i32, String)>()
            .expect("typed rows")
            .collect::<Result<_, _>>()
            .expect("deserialize");
        assert_eq!(rows, vec![(1, "first".to_owned()), (2, "second".to_owned()), (3, "third".to_owned())]);
        drop_keyspace(&s, &ks).await;
    })
    .await;
}
