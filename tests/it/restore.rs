//! `fairway backup` signs its manifest with the operator's backup key and `fairway
//! restore` checks it before anything is written (issue 63, item 6): on the real broker
//! and CQL database, a backup of a test deployment restored with another key, after its
//! table file was swapped (and the manifest's checksum rewritten to match), or without
//! its digest file is refused, and the keyspace it would restore into is never created.
//! The key is never printed, nor shown by `--help`.

use crate::common;

use fairway::core::auth::Caller;
use std::path::Path;
use std::process::{Command, Output};

/// `fairway --config <config> args` with the suite's overriding variables removed.
fn fairway(config: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_fairway"));
    for var in ["FAIRWAY_BROKERS", "FAIRWAY_CQL", "FAIRWAY_KEYSPACE", "FAIRWAY_TOPIC_PREFIX", "FAIRWAY_CONFIG"] {
        c.env_remove(var);
    }
    c.env_remove("FAIRWAY_BACKUP_KEY").env_remove("FAIRWAY_BACKUP_KEY_FILE").env("FAIRWAY_LOG", "warn");
    c.envs(env.iter().copied()).arg("--config").arg(config).args(args).output().expect("run fairway")
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restore_refuses_a_tampered_unsigned_or_wrongly_keyed_archive_before_writing_anything() {
    let cfg = common::arc(common::config(""));
    common::init(&cfg).await;
    common::create_key(&cfg, &Caller::Admin, "it_restore").await;
    let dir = tempfile::tempdir().unwrap();
    let config = common::config_file(&cfg, "", dir.path());
    let secret = format!("it-restore-key-{}", uuid::Uuid::new_v4().simple());
    let key_file = dir.path().join("backup.key");
    std::fs::write(&key_file, format!("{secret}\n")).unwrap();
    let out = dir.path().join("b");
    let (out_s, key_s) = (out.to_str().unwrap(), key_file.to_str().unwrap());

    // Without a key: refused, saying where a key goes.
    let o = fairway(&config, &["backup", "--out", out_s, "--results-window", "10m"], &[]);
    assert!(!o.status.success() && text(&o).contains("FAIRWAY_BACKUP_KEY"), "{}", text(&o));
    let o = fairway(&config, &["backup", "--out", out_s, "--results-window", "10m", "--key-file", key_s], &[]);
    assert!(o.status.success(), "backup: {}", text(&o));
    assert!(!text(&o).contains(&secret), "the key is never printed");
    let digest = std::fs::read_to_string(out.join("manifest.json.hmac")).expect("a keyed digest beside the manifest");
    assert_eq!(digest.trim().len(), 64, "HMAC-SHA256 in hex: {digest}");

    // Restore into a keyspace that does not exist: a refusal must leave it so.
    let target = format!("it_restore_{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
    let mut tcfg = (*cfg).clone();
    tcfg.scylla.keyspace = target.clone();
    std::fs::create_dir_all(dir.path().join("t")).unwrap();
    let target_config = common::config_file(&tcfg, "", &dir.path().join("t"));
    let store = fairway::store::Store::open(&cfg).await.expect("store");
    let keyspace_exists = || async {
        let cql = "SELECT keyspace_name FROM system_schema.keyspaces WHERE keyspace_name = ?";
        let res = store.session().query_unpaged(cql, (target.as_str(),)).await.expect("schema read");
        res.into_rows_result().expect("rows").rows_num() > 0
    };
    let restore = |env: &[(&str, &str)]| fairway(&target_config, &["restore", "--from", out_s], env);
    let refused = |o: &Output, says: &str| {
        let t = text(o);
        assert!(!o.status.success(), "restore went ahead: {t}");
        assert!(t.contains(says), "{says:?} not in: {t}");
        assert!(!t.contains(&secret), "the key is never printed: {t}");
    };

    // Another key.
    let other = format!("another-operators-key-{}", uuid::Uuid::new_v4().simple());
    refused(&restore(&[("FAIRWAY_BACKUP_KEY", &other)]), "does not match its keyed digest");
    assert!(!keyspace_exists().await, "nothing written with another key");

    // The archive changed: an API key row appended, the manifest's checksum rewritten.
    let table = out.join("tables/api_keys.ndjson");
    let mut rows = std::fs::read(&table).unwrap();
    rows.extend_from_slice(b"{\"id\": \"planted\", \"hash\": \"00\", \"caller\": \"admin\"}\n");
    std::fs::write(&table, &rows).unwrap();
    let manifest_path = out.join("manifest.json");
    let mut m: serde_json::Value = serde_json::from_slice(&std::fs::read(&manifest_path).unwrap()).unwrap();
    use sha2::Digest;
    m["tables"]["api_keys"]["sha256"] = fairway::core::dr::to_hex(&sha2::Sha256::digest(&rows)).into();
    m["tables"]["api_keys"]["bytes"] = (rows.len() as u64).into();
    m["tables"]["api_keys"]["items"] = (m["tables"]["api_keys"]["items"].as_u64().unwrap_or(0) + 1).into();
    std::fs::write(&manifest_path, serde_json::to_vec_pretty(&m).unwrap()).unwrap();
    refused(&restore(&[("FAIRWAY_BACKUP_KEY_FILE", key_s)]), "does not match its keyed digest");
    assert!(!keyspace_exists().await, "nothing written from a tampered archive");

    // No digest.
    std::fs::remove_file(out.join("manifest.json.hmac")).unwrap();
    refused(&restore(&[("FAIRWAY_BACKUP_KEY", &secret)]), "carries no keyed digest");
    assert!(!keyspace_exists().await, "nothing written from an unsigned archive");

    // --help shows neither the key nor the key file's path taken from the environment.
    for cmd in ["backup", "restore"] {
        let o =
            fairway(&config, &[cmd, "--help"], &[("FAIRWAY_BACKUP_KEY", &secret), ("FAIRWAY_BACKUP_KEY_FILE", key_s)]);
        let t = text(&o);
        assert!(o.status.success() && t.contains("--key-file"), "{t}");
        assert!(!t.contains(&secret) && !t.contains(key_s), "--help shows no key: {t}");
    }
}
