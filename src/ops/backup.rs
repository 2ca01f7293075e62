//! `fairway backup` and `fairway restore`: a consistent, online copy of what fairway
//! owns to a directory, and its restore onto an empty cluster and keyspace. The rules
//! (which tables, the cut, the manifest, the record framing) live in `core::dr`; the
//! statements in `store::dr` and the broker I/O in `kafka::copy`. docs/disaster-recovery.md
//! is the operator's side.
//!
//! A backup directory holds `manifest.json` (written last: a directory without it is
//! unfinished), `cut.json` (the cut, written first: a second run with the same `--out`
//! resumes at the same cut), `tables/<table>.ndjson` (one CQL JSON row a line) and
//! `topics/<topic>/<partition>.rec` (framed records, `core::dr::frame`). Each file is
//! written under a temporary name, renamed when complete, and described by a
//! `<file>.done` entry (count, bytes, SHA-256) that a resumed run trusts only when the
//! file's checksum still matches.
//!
//! The manifest is keyed: `manifest.json.hmac` (written just before it) holds its
//! HMAC-SHA256 under the operator's backup key (`core::dr::BackupKey`), and a restore
//! checks it before it reads anything else of the archive or reaches a broker or store:
//! an archive changed anywhere (every file's SHA-256 is in the manifest), unsigned, or
//! checked with another key is refused.

use crate::config::Config;
use crate::core::dr::{
    self, BackupKey, FileEntry, Manifest, Range, Record, Role, MANIFEST, MANIFEST_MAC, MANIFEST_VERSION,
};
use crate::kafka::{self, copy, KafkaError};
use crate::model::Pool;
use crate::now_ms;
use crate::store::{Store, StoreError};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum DrError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Kafka(#[from] KafkaError),
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{0}")]
    Refused(String),
}

fn io(path: &Path) -> impl Fn(std::io::Error) -> DrError + '_ {
    move |source| DrError::Io { path: path.to_path_buf(), source }
}

/// What `fairway backup` is asked for.
pub struct BackupOptions {
    pub out: PathBuf,
    /// Signs the manifest.
    pub key: BackupKey,
    /// Results and events finished in this window before the cut are copied.
    pub results_window_ms: i64,
}

/// The cut, written before anything is copied: a resumed backup keeps it.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Cut {
    backup_id: String,
    t0: i64,
    results_window_ms: i64,
    started_at: i64,
    /// Where each topic partition's copy starts (committed offsets, or the log start).
    from: BTreeMap<String, BTreeMap<i32, i64>>,
    /// Where the DLQ's copy ends: its high watermark at the cut.
    dlq_to: BTreeMap<i32, i64>,
    /// The committed offsets at the cut of the groups whose place a restore carries over
    /// ([`carried_groups`]), by group, topic and partition.
    #[serde(default)]
    carried: BTreeMap<String, BTreeMap<String, BTreeMap<i32, i64>>>,
}

/// A finished file's entry beside it (`<file>.done`).
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Done {
    entry: FileEntry,
    range: Option<Range>,
    /// Per carried group ([`carried_groups`]): how many of the copied records it had
    /// consumed at the cut, i.e. where it goes on in the restored partition.
    #[serde(default)]
    consumed: BTreeMap<String, i64>,
}

/// Groups reading a copied topic whose place a restore carries over, so they do not start
/// the restored records again: the webhook sender (results: a restore would otherwise
/// send a callback again for every copied result). The history recorder is not among
/// them: it rebuilds `job_events` (not copied) from the copied events.
fn carried_groups(cfg: &Config) -> Vec<(String, String)> {
    vec![(cfg.group("webhooks"), cfg.results_topic())]
}

/// The topics a backup copies, with how: (topic, consumer group whose committed offsets
/// start its copy, or None to start at the log's start).
fn copied_topics(cfg: &Config) -> Vec<(String, Option<String>)> {
    let mut t: Vec<(String, Option<String>)> =
        Pool::ALL.iter().map(|p| (cfg.pool_topic(*p), Some(cfg.group(p.as_str())))).collect();
    for topic in crate::worker::relay::relay_topics(cfg) {
        t.push((topic, Some(cfg.group("retry"))));
    }
    for topic in [cfg.dlq_topic(), cfg.results_topic(), cfg.events_topic()] {
        t.push((topic, None));
    }
    t
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T, DrError> + Send + 'static) -> Result<T, DrError> {
    tokio::task::spawn_blocking(f).await.map_err(|e| DrError::Refused(format!("a backup task failed: {e}")))?
}

fn read_json<T: for<'de> Deserialize<'de>>(path: &Path) -> Result<Option<T>, DrError> {
    match std::fs::read(path) {
        Ok(b) => serde_json::from_slice(&b)
            .map(Some)
            .map_err(|e| DrError::Refused(format!("{} is damaged ({e}): remove it to start over", path.display()))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io(path)(e)),
    }
}

fn write_json(path: &Path, v: &impl Serialize) -> Result<(), DrError> {
    write_bytes(path, &serde_json::to_vec_pretty(v).expect("serialisable"))
}

fn write_bytes(path: &Path, bytes: &[u8]) -> Result<(), DrError> {
    let tmp = path.with_extension("tmp");
    let mut f = private_file(&tmp)?;
    f.write_all(bytes).map_err(io(&tmp))?;
    std::fs::rename(&tmp, path).map_err(io(path))
}

/// The manifest of the backup in `dir`, read only once its keyed digest checks out with
/// `key` (None: no manifest, an unfinished backup). The manifest and its digest are read
/// as plain files inside `dir`.
fn signed_manifest(dir: &Path, key: &BackupKey) -> Result<Option<Manifest>, DrError> {
    if !dir.join(MANIFEST).exists() {
        return Ok(None);
    }
    let path = inside(dir, MANIFEST)?;
    let bytes = read_small(&path)?;
    let digest = match dir.join(MANIFEST_MAC).exists() {
        true => Some(String::from_utf8_lossy(&read_small(&inside(dir, MANIFEST_MAC)?)?).into_owned()),
        false => None,
    };
    key.verify(&bytes, digest.as_deref()).map_err(|e| DrError::Refused(format!("{}: {e}", dir.display())))?;
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|e| DrError::Refused(format!("{} is damaged ({e})", path.display())))
}

/// Largest manifest (or digest) file read.
const MAX_MANIFEST_BYTES: u64 = 256 << 20;

fn read_small(path: &Path) -> Result<Vec<u8>, DrError> {
    let f = std::fs::File::open(path).map_err(io(path))?;
    let mut out = Vec::new();
    f.take(MAX_MANIFEST_BYTES + 1).read_to_end(&mut out).map_err(io(path))?;
    if out.len() as u64 > MAX_MANIFEST_BYTES {
        return Err(DrError::Refused(format!("{} is over {MAX_MANIFEST_BYTES} bytes", path.display())));
    }
    Ok(out)
}

/// A backup's files are its owner's only (0600; directories 0700): they hold API key
/// hashes, tenants' payloads and results.
fn private_file(path: &Path) -> Result<std::fs::File, DrError> {
    use std::os::unix::fs::OpenOptionsExt;
    let f =
        std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(path).map_err(io(path))?;
    // An existing file keeps its mode through `open`: set it.
    f.set_permissions(std::os::unix::fs::PermissionsExt::from_mode(0o600)).map_err(io(path))?;
    Ok(f)
}

/// Makes `dir` and its missing parents, the backup's own ones 0700.
fn private_dir(dir: &Path) -> Result<(), DrError> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir).map_err(io(dir))?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).map_err(io(dir))
}

/// `name` (a manifest's file) as a path inside `dir`: a regular file reached through
/// no symbolic link, so a restore reads nothing outside the archive.
fn inside(dir: &Path, name: &str) -> Result<PathBuf, DrError> {
    let refused = |why: &str| DrError::Refused(format!("{name:?} {why}: the archive is not one fairway wrote"));
    let rel = Path::new(name);
    if !rel.components().all(|c| matches!(c, std::path::Component::Normal(_))) {
        return Err(refused("is not a path inside the backup"));
    }
    let root = std::fs::canonicalize(dir).map_err(io(dir))?;
    let path = dir.join(rel);
    let real = std::fs::canonicalize(&path).map_err(io(&path))?;
    let meta = std::fs::symlink_metadata(&path).map_err(io(&path))?;
    if real != root.join(rel) || !meta.file_type().is_file() {
        return Err(refused("leaves the backup directory or is not a plain file"));
    }
    Ok(path)
}

/// SHA-256 and length of a file, read in blocks.
fn checksum(path: &Path) -> Result<(String, u64), DrError> {
    let mut f = std::fs::File::open(path).map_err(io(path))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 16];
    let mut n = 0u64;
    loop {
        let k = f.read(&mut buf).map_err(io(path))?;
        if k == 0 {
            break;
        }
        h.update(&buf[..k]);
        n += k as u64;
    }
    Ok((dr::to_hex(&h.finalize()), n))
}

/// A file being written: temporary name, hashed as it goes, renamed by [`Sink::finish`].
struct Sink {
    dir: PathBuf,
    name: String,
    out: BufWriter<std::fs::File>,
    hash: Sha256,
    bytes: u64,
    items: u64,
}

impl Sink {
    fn create(dir: &Path, name: &str) -> Result<Sink, DrError> {
        let tmp = dir.join(format!("{name}.tmp"));
        if let Some(parent) = tmp.parent() {
            private_dir(parent)?;
        }
        let f = private_file(&tmp)?;
        Ok(Sink {
            dir: dir.to_path_buf(),
            name: name.to_string(),
            out: BufWriter::new(f),
            hash: Sha256::new(),
            bytes: 0,
            items: 0,
        })
    }

    fn put(&mut self, bytes: &[u8]) -> Result<(), String> {
        self.out.write_all(bytes).map_err(|e| format!("writing {}: {e}", self.name))?;
        self.hash.update(bytes);
        self.bytes += bytes.len() as u64;
        self.items += 1;
        Ok(())
    }

    fn finish(mut self, range: Option<Range>, consumed: BTreeMap<String, i64>) -> Result<FileEntry, DrError> {
        let path = self.dir.join(&self.name);
        let tmp = self.dir.join(format!("{}.tmp", self.name));
        self.out.flush().map_err(io(&tmp))?;
        self.out.get_ref().sync_all().map_err(io(&tmp))?;
        std::fs::rename(&tmp, &path).map_err(io(&path))?;
        let entry = FileEntry {
            name: self.name.clone(),
            items: self.items,
            bytes: self.bytes,
            sha256: dr::to_hex(&self.hash.finalize()),
        };
        write_json(&self.dir.join(format!("{}.done", self.name)), &Done { entry: entry.clone(), range, consumed })?;
        Ok(entry)
    }
}

/// A finished file from an earlier run, if its checksum still matches its entry.
fn already_done(dir: &Path, name: &str) -> Result<Option<Done>, DrError> {
    let Some(done) = read_json::<Done>(&dir.join(format!("{name}.done")))? else { return Ok(None) };
    let path = dir.join(name);
    if !path.exists() {
        return Ok(None);
    }
    let (sha, bytes) = checksum(&path)?;
    Ok((sha == done.entry.sha256 && bytes == done.entry.bytes).then_some(done))
}

use dr::{table_file, topic_file};

/// Takes a backup into `opts.out` (see the module's docs); `progress` gets a line per
/// step. Resumes an unfinished backup in the same directory at its cut; a finished one
/// (its manifest present) is left as it is.
pub async fn backup(cfg: &Config, opts: &BackupOptions, progress: &mut dyn FnMut(String)) -> Result<Manifest, DrError> {
    let dir = opts.out.clone();
    private_dir(&dir)?;
    if let Some(m) = signed_manifest(&dir, &opts.key)? {
        progress(format!("backup {} in {} is already complete: nothing to do", m.backup_id, dir.display()));
        return Ok(m);
    }
    let cut = match read_json::<Cut>(&dir.join("cut.json"))? {
        Some(c) => {
            progress(format!("resuming backup {} at its cut {}", c.backup_id, c.t0));
            c
        }
        None => {
            let c = take_cut(cfg, opts).await?;
            write_json(&dir.join("cut.json"), &c)?;
            progress(format!("cut at {}: offsets of {} topics taken", c.t0, c.from.len()));
            c
        }
    };
    let store = Store::open(cfg).await?;
    let mut tables = BTreeMap::new();
    for (table, role) in dr::TABLES {
        if matches!(role, Role::Skipped(_)) {
            continue;
        }
        let entry = copy_table(&store, &dir, table, *role, cut.t0).await?;
        progress(format!("table {table}: {} rows, {} bytes", entry.items, entry.bytes));
        tables.insert(table.to_string(), entry);
    }
    let mut topics: BTreeMap<String, BTreeMap<i32, (Range, FileEntry)>> = BTreeMap::new();
    let mut consumer_offsets: BTreeMap<String, BTreeMap<String, BTreeMap<i32, i64>>> = BTreeMap::new();
    for (topic, from) in &cut.from {
        for (partition, start) in from {
            let (range, entry, consumed) = copy_partition(cfg, &dir, &cut, topic, *partition, *start).await?;
            for (group, n) in consumed {
                consumer_offsets.entry(group).or_default().entry(topic.clone()).or_default().insert(*partition, n);
            }
            if entry.items > 0 {
                progress(format!(
                    "topic {topic} partition {partition}: {} records of [{}, {})",
                    entry.items, range.from, range.to
                ));
            }
            topics.entry(topic.clone()).or_default().insert(*partition, (range, entry));
        }
    }
    let m = Manifest {
        version: MANIFEST_VERSION,
        backup_id: cut.backup_id.clone(),
        t0: cut.t0,
        results_window_ms: cut.results_window_ms,
        topic_prefix: cfg.kafka.topic_prefix.clone(),
        keyspace: cfg.scylla.keyspace.clone(),
        tables,
        topics,
        consumer_offsets,
        started_at: cut.started_at,
        finished_at: now_ms(),
    };
    // The digest first: a manifest (what marks a finished backup) is never unsigned.
    let bytes = serde_json::to_vec_pretty(&m).expect("serialisable");
    write_bytes(&dir.join(MANIFEST_MAC), opts.key.sign(&bytes).as_bytes())?;
    write_bytes(&dir.join(MANIFEST), &bytes)?;
    Ok(m)
}

/// The cut: the committed offsets of every group first (where each topic's copy starts),
/// then `t0`, then the DLQ's end. A job's offset is committed only after its state is
/// durable, so a job committed before the offsets were read finished before `t0` (its
/// state and result are kept), and any other is in its topic's copied range. The DLQ's
/// end is read after `t0`: a dead letter is acknowledged before its job's state is
/// written, so a failed state kept has its dead letter copied.
async fn take_cut(cfg: &Config, opts: &BackupOptions) -> Result<Cut, DrError> {
    let started_at = now_ms();
    let (topics, groups) = (copied_topics(cfg), carried_groups(cfg));
    let cfg2 = cfg.clone();
    let (from, carried) = blocking(move || {
        let mut from: BTreeMap<String, BTreeMap<i32, i64>> = BTreeMap::new();
        for (topic, group) in topics {
            let marks = copy::watermarks(&cfg2, &topic)?;
            let parts: Vec<i32> = marks.iter().map(|m| m.0).collect();
            let committed = match &group {
                Some(g) => copy::committed(&cfg2, g, &topic, &parts)?,
                None => parts.iter().map(|p| (*p, None)).collect(),
            };
            for ((p, low, _), (_, c)) in marks.iter().zip(committed) {
                from.entry(topic.clone()).or_default().insert(*p, c.unwrap_or(*low).max(*low));
            }
        }
        let mut carried: BTreeMap<String, BTreeMap<String, BTreeMap<i32, i64>>> = BTreeMap::new();
        for (group, topic) in groups {
            let parts: Vec<i32> = copy::watermarks(&cfg2, &topic)?.iter().map(|m| m.0).collect();
            for (p, c) in copy::committed(&cfg2, &group, &topic, &parts)? {
                if let Some(c) = c {
                    carried.entry(group.clone()).or_default().entry(topic.clone()).or_default().insert(p, c);
                }
            }
        }
        Ok((from, carried))
    })
    .await?;
    let t0 = now_ms();
    let (cfg3, dlq) = (cfg.clone(), cfg.dlq_topic());
    let dlq_to =
        blocking(move || Ok(copy::watermarks(&cfg3, &dlq)?.into_iter().map(|(p, _, high)| (p, high)).collect()))
            .await?;
    Ok(Cut {
        backup_id: uuid::Uuid::now_v7().to_string(),
        t0,
        results_window_ms: opts.results_window_ms,
        started_at,
        from,
        dlq_to,
        carried,
    })
}

/// One table to `tables/<table>.ndjson`, cut at `t0` by its role.
async fn copy_table(store: &Store, dir: &Path, table: &str, role: Role, t0: i64) -> Result<FileEntry, DrError> {
    let name = table_file(table);
    if let Some(done) = already_done(dir, &name)? {
        return Ok(done.entry);
    }
    let mut sink = Sink::create(dir, &name)?;
    store
        .dump_table(table, |row| match dr::cut_row(role, &row, t0)? {
            Some(kept) => sink.put(format!("{kept}\n").as_bytes()),
            None => Ok(()),
        })
        .await?;
    sink.finish(None, BTreeMap::new())
}

/// One topic partition to `topics/<topic>/<partition>.rec`: from `start` to its high
/// watermark now (the DLQ: at the cut); results and events only of the window.
async fn copy_partition(
    cfg: &Config,
    dir: &Path,
    cut: &Cut,
    topic: &str,
    partition: i32,
    start: i64,
) -> Result<(Range, FileEntry, BTreeMap<String, i64>), DrError> {
    let name = topic_file(topic, partition);
    if let Some(Done { entry, range: Some(range), consumed }) = already_done(dir, &name)? {
        return Ok((range, entry, consumed));
    }
    let (cfg, dir, cut, topic) = (cfg.clone(), dir.to_path_buf(), cut.clone(), topic.to_string());
    blocking(move || {
        let high = copy::watermarks(&cfg, &topic)?.into_iter().find(|m| m.0 == partition).map_or(start, |m| m.2);
        let to = if topic == cfg.dlq_topic() { cut.dlq_to.get(&partition).copied().unwrap_or(high) } else { high };
        let range = Range { from: start, to: to.max(start) };
        let (results, events) = (topic == cfg.results_topic(), topic == cfg.events_topic());
        let (t0, window) = (cut.t0, cut.results_window_ms);
        let carried: Vec<(String, i64)> = cut
            .carried
            .iter()
            .filter_map(|(g, topics)| Some((g.clone(), *topics.get(&topic)?.get(&partition)?)))
            .collect();
        let mut consumed: BTreeMap<String, i64> = carried.iter().map(|(g, _)| (g.clone(), 0)).collect();
        let mut sink = Sink::create(&dir, &name)?;
        copy::read_range(&cfg, &topic, partition, range, |offset, r: Record| {
            let keep = if results {
                // A record that is not a result (a foreign producer's) is judged by its
                // timestamp: copied, never dropped for being unreadable.
                match crate::codec::decode_result(r.value.as_deref().unwrap_or_default()) {
                    Ok(result) => dr::keep_result(result.finished_at, t0, window),
                    Err(_) => dr::keep_event(r.timestamp, t0, window),
                }
            } else if events {
                dr::keep_event(r.timestamp, t0, window)
            } else {
                true
            };
            if keep {
                sink.put(&dr::frame(&r))?;
                for (group, at) in &carried {
                    if offset < *at {
                        *consumed.get_mut(group).expect("every carried group counted") += 1;
                    }
                }
            }
            Ok(())
        })
        .map_err(DrError::Refused)?;
        let entry = sink.finish(Some(range), consumed.clone())?;
        Ok((range, entry, consumed))
    })
    .await
}

/// What `fairway restore` is asked for.
pub struct RestoreOptions {
    pub from: PathBuf,
    /// What the manifest's keyed digest is checked with.
    pub key: BackupKey,
}

/// What a restore did.
#[derive(Debug, Default, Clone, Serialize)]
pub struct RestoreSummary {
    pub backup_id: String,
    /// False: the backup was restored here before, and nothing changed.
    pub changed: bool,
    pub rows: u64,
    pub records: u64,
    pub ms: i64,
}

/// The step names of a restore's bookkeeping (`store::dr`).
const COMPLETE: &str = "complete";

/// Restores the backup in `opts.from` onto an empty cluster and keyspace (see the module's
/// docs): topics and schema created, tables inserted, records produced into their
/// partitions, the pool topics' dispatch frontiers raised past the restored records (so
/// each gets the effectively-once read: they may have run before). Idempotent: a second
/// restore of the same backup finds it complete and changes nothing; an interrupted one
/// resumes (a partition already holding some of its records gets only the rest).
pub async fn restore(
    cfg: &Config,
    opts: &RestoreOptions,
    progress: &mut dyn FnMut(String),
) -> Result<RestoreSummary, DrError> {
    let started = now_ms();
    let dir = &opts.from;
    let m = signed_manifest(dir, &opts.key)?.ok_or_else(|| {
        DrError::Refused(format!(
            "{} has no {MANIFEST}: not a finished backup (run `fairway backup --out` again to finish it)",
            dir.display()
        ))
    })?;
    m.check().map_err(DrError::Refused)?;
    if m.topic_prefix != cfg.kafka.topic_prefix {
        return Err(DrError::Refused(format!(
            "the backup is of topic prefix {:?} but this configuration has {:?}: restore with --topic-prefix {:?} (rows name their deployment by it)",
            m.topic_prefix, cfg.kafka.topic_prefix, m.topic_prefix
        )));
    }
    let topics: Vec<String> = copied_topics(cfg).into_iter().map(|(t, _)| t).collect();
    let groups: Vec<String> = carried_groups(cfg).into_iter().map(|(g, _)| g).collect();
    m.check_contents(&topics, &groups).map_err(|e| DrError::Refused(format!("{}: {e}", dir.display())))?;
    for f in m.files() {
        let (sha, bytes) = checksum(&inside(dir, &f.name)?)?;
        if sha != f.sha256 || bytes != f.bytes {
            return Err(DrError::Refused(format!(
                "{} does not match its checksum in the manifest: the backup is damaged",
                f.name
            )));
        }
    }
    progress(format!("backup {} (cut {}): {} files verified", m.backup_id, m.t0, m.files().count()));
    kafka::ensure_topics(cfg).await?;
    crate::store::ensure_schema(cfg).await?;
    let store = Store::open(cfg).await?;
    let mut summary = RestoreSummary { backup_id: m.backup_id.clone(), ..Default::default() };
    let done = store.restore_steps(&m.backup_id).await?;
    if done.iter().any(|s| s == COMPLETE) {
        progress(format!("backup {} was restored here before: nothing to do", m.backup_id));
        summary.ms = now_ms() - started;
        return Ok(summary);
    }
    if done.is_empty() {
        refuse_unless_empty(cfg, &store, &m).await?;
    }
    summary.changed = true;
    for (table, f) in &m.tables {
        let step = format!("table:{table}");
        if done.contains(&step) {
            continue;
        }
        summary.rows += restore_table(&store, dir, table, f).await?;
        store.restore_step_done(&m.backup_id, &step, now_ms()).await?;
        progress(format!("table {table}: {} rows", f.items));
    }
    let producer = copy::restore_producer(cfg)?;
    let pools: Vec<String> = Pool::ALL.iter().map(|p| cfg.pool_topic(*p)).collect();
    for (topic, parts) in &m.topics {
        let marks = blocking({
            let (cfg, topic) = (cfg.clone(), topic.clone());
            move || Ok(copy::watermarks(&cfg, &topic)?)
        })
        .await?;
        for (partition, (_, f)) in parts {
            let step = format!("topic:{topic}:{partition}");
            if done.contains(&step) || f.items == 0 {
                continue;
            }
            let Some(&(_, _, high)) = marks.iter().find(|mk| mk.0 == *partition) else {
                return Err(DrError::Refused(format!(
                    "topic {topic} has no partition {partition} here: set kafka.partitions to at least the backed-up cluster's"
                )));
            };
            // Resumed: the partition holds the first `high` records already (only this
            // restore produces into it, in order).
            let n = restore_partition(&producer, dir, topic, *partition, f, high.max(0) as u64).await?;
            summary.records += n;
            if pools.contains(topic) {
                let (_, _, end) = blocking({
                    let (cfg, topic, p) = (cfg.clone(), topic.clone(), *partition);
                    move || Ok(copy::watermarks(&cfg, &topic)?.into_iter().find(|mk| mk.0 == p).unwrap_or((p, 0, 0)))
                })
                .await?;
                store.raise_dispatch_frontier(topic, *partition, end - 1).await?;
            }
            store.restore_step_done(&m.backup_id, &step, now_ms()).await?;
            progress(format!("topic {topic} partition {partition}: {} records", f.items));
        }
    }
    for (group, topics) in &m.consumer_offsets {
        for (topic, offsets) in topics {
            let (cfg, group, topic, offsets) = (cfg.clone(), group.clone(), topic.clone(), offsets.clone());
            blocking(move || Ok(copy::commit(&cfg, &group, &topic, &offsets)?)).await?;
        }
        progress(format!("group {group}: its place in the restored records carried over"));
    }
    store.restore_step_done(&m.backup_id, COMPLETE, now_ms()).await?;
    summary.ms = now_ms() - started;
    Ok(summary)
}

/// A restore starts only on an empty cluster and keyspace: no job state, keys or
/// schedules, and no record in any topic.
async fn refuse_unless_empty(cfg: &Config, store: &Store, m: &Manifest) -> Result<(), DrError> {
    let others = store.restored_backups().await?;
    if let Some(other) = others.iter().find(|b| **b != m.backup_id) {
        return Err(DrError::Refused(format!(
            "backup {other} was restored into keyspace {} already: a restore needs an empty keyspace and cluster",
            cfg.scylla.keyspace
        )));
    }
    for table in ["jobs", "finished_packs", "api_keys", "schedules"] {
        if store.has_rows(table).await? {
            return Err(DrError::Refused(format!(
                "keyspace {} is not empty (table {table} has rows): restore onto an empty keyspace (a new one: --keyspace)",
                cfg.scylla.keyspace
            )));
        }
    }
    for topic in kafka::all_topics(cfg) {
        let marks = blocking({
            let (cfg, topic) = (cfg.clone(), topic.clone());
            move || Ok(copy::watermarks(&cfg, &topic)?)
        })
        .await?;
        if marks.iter().any(|(_, _, high)| *high > 0) {
            return Err(DrError::Refused(format!(
                "topic {topic} holds records: restore onto an empty Kafka cluster (or a new --topic-prefix)"
            )));
        }
    }
    Ok(())
}

/// Rows inserted at a time (the file is read this many lines at once).
const ROWS_AT_ONCE: usize = 1000;

async fn restore_table(store: &Store, dir: &Path, table: &str, f: &FileEntry) -> Result<u64, DrError> {
    let path = inside(dir, &f.name)?;
    let mut lines = BufReader::new(std::fs::File::open(&path).map_err(io(&path))?).lines();
    let mut n = 0;
    loop {
        let mut chunk = Vec::with_capacity(ROWS_AT_ONCE);
        for line in lines.by_ref().take(ROWS_AT_ONCE) {
            let line = line.map_err(io(&path))?;
            chunk.push(dr::split_ttl(&line).map_err(|e| DrError::Refused(format!("{}: {e}", path.display())))?);
        }
        if chunk.is_empty() {
            return Ok(n);
        }
        store.insert_json_rows(table, &chunk).await?;
        n += chunk.len() as u64;
    }
}

/// Records produced at a time (the file is read this many at once).
const RECORDS_AT_ONCE: usize = 1000;

/// Produces a partition's records after the first `skip`; returns how many it produced.
async fn restore_partition(
    producer: &kafka::copy::RestoreProducer,
    dir: &Path,
    topic: &str,
    partition: i32,
    f: &FileEntry,
    skip: u64,
) -> Result<u64, DrError> {
    let path = inside(dir, &f.name)?;
    let mut reader = BufReader::new(std::fs::File::open(&path).map_err(io(&path))?);
    let (mut seen, mut produced) = (0u64, 0u64);
    loop {
        let mut chunk = Vec::with_capacity(RECORDS_AT_ONCE);
        while chunk.len() < RECORDS_AT_ONCE {
            let Some(r) = next_record(&mut reader, &path)? else { break };
            seen += 1;
            if seen > skip {
                chunk.push(r);
            }
        }
        if chunk.is_empty() {
            // The end of the file (the inner loop reads until a chunk is full or the end).
            if seen != f.items {
                return Err(DrError::Refused(format!(
                    "{}: {seen} records, the manifest says {}",
                    path.display(),
                    f.items
                )));
            }
            return Ok(produced);
        }
        copy::produce_into(producer, topic, partition, &chunk).await?;
        produced += chunk.len() as u64;
    }
}

fn next_record(reader: &mut impl Read, path: &Path) -> Result<Option<Record>, DrError> {
    let mut len = [0u8; 4];
    match reader.read_exact(&mut len) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(io(path)(e)),
    }
    let len = u32::from_be_bytes(len) as usize;
    if len > dr::RECORD_MAX {
        return Err(DrError::Refused(format!("{}: a record claims {len} bytes: the file is damaged", path.display())));
    }
    let mut body = vec![0u8; len];
    reader.read_exact(&mut body).map_err(io(path))?;
    dr::unframe(&body).map(Some).map_err(|e| DrError::Refused(format!("{}: {e}", path.display())))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn mode(p: &Path) -> u32 {
        std::fs::metadata(p).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn backup_files_are_the_owners_only() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("b");
        private_dir(&dir).unwrap();
        write_json(&dir.join(MANIFEST), &serde_json::json!({})).unwrap();
        let mut sink = Sink::create(&dir, "tables/jobs.ndjson").unwrap();
        sink.put(b"{}\n").unwrap();
        sink.finish(None, BTreeMap::new()).unwrap();
        assert_eq!(mode(&dir), 0o700);
        assert_eq!(mode(&dir.join("tables")), 0o700);
        for f in [MANIFEST, "tables/jobs.ndjson", "tables/jobs.ndjson.done"] {
            assert_eq!(mode(&dir.join(f)), 0o600, "{f}");
        }
    }

    /// A manifest whose checksums match but whose file is a link out of the archive, or
    /// whose table a backup never holds, is refused before any broker or store is reached
    /// (this configuration's point at nothing that answers).
    #[tokio::test]
    async fn restore_refuses_a_hostile_archive_before_writing_anything() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("b");
        std::fs::create_dir_all(dir.join("tables")).unwrap();
        let outside = root.path().join("secret");
        std::fs::write(&outside, b"{\"id\":\"x\"}\n").unwrap();
        std::os::unix::fs::symlink(&outside, dir.join("tables/api_keys.ndjson")).unwrap();
        let (sha, bytes) = checksum(&outside).unwrap();
        let (cfg, mut m) = unreachable_deployment();
        let file = |name: &str| FileEntry { name: name.into(), items: 1, bytes, sha256: sha.clone() };
        m.tables.insert("api_keys".into(), file("tables/api_keys.ndjson"));
        signed(&dir, &m, &key(0));
        let opts = RestoreOptions { from: dir.clone(), key: key(0) };
        let e = restore(&cfg, &opts, &mut |_| {}).await.unwrap_err();
        assert!(matches!(&e, DrError::Refused(m) if m.contains("leaves the backup directory")), "{e}");

        std::fs::remove_file(dir.join("tables/api_keys.ndjson")).unwrap();
        std::fs::copy(&outside, dir.join("tables/region_states.ndjson")).unwrap();
        m.tables.clear();
        m.tables.insert("region_states".into(), file("tables/region_states.ndjson"));
        signed(&dir, &m, &key(0));
        let e = restore(&cfg, &opts, &mut |_| {}).await.unwrap_err();
        assert!(matches!(&e, DrError::Refused(m) if m.contains("never in a backup")), "{e}");
    }

    /// A configuration whose broker and store answer nothing, and an empty manifest of it.
    fn unreachable_deployment() -> (Config, Manifest) {
        let mut cfg = Config::builtin();
        cfg.kafka.brokers = "127.0.0.1:9".into();
        cfg.scylla.contact_points = vec!["127.0.0.1:9".into()];
        let m = Manifest {
            version: MANIFEST_VERSION,
            backup_id: "b1".into(),
            t0: 1,
            results_window_ms: 1,
            topic_prefix: cfg.kafka.topic_prefix.clone(),
            keyspace: cfg.scylla.keyspace.clone(),
            tables: BTreeMap::new(),
            topics: BTreeMap::new(),
            consumer_offsets: BTreeMap::new(),
            started_at: 0,
            finished_at: 1,
        };
        (cfg, m)
    }

    fn key(n: u8) -> BackupKey {
        BackupKey::new(&[b'a' + n; 32], "a test key").unwrap()
    }

    /// Writes `m` as the backup's manifest signed with `k`.
    fn signed(dir: &Path, m: &Manifest, k: &BackupKey) {
        let bytes = serde_json::to_vec_pretty(m).unwrap();
        write_bytes(&dir.join(MANIFEST_MAC), k.sign(&bytes).as_bytes()).unwrap();
        write_bytes(&dir.join(MANIFEST), &bytes).unwrap();
    }

    /// A manifest changed after it was signed (a file swapped and its checksum rewritten
    /// to match), one without a digest, or one checked with another key is refused before
    /// any file is read or any broker or store is reached; the message names no key.
    #[tokio::test]
    async fn restore_refuses_a_tampered_unsigned_or_wrongly_keyed_archive_before_writing_anything() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("b");
        std::fs::create_dir_all(dir.join("tables")).unwrap();
        std::fs::write(dir.join("tables/api_keys.ndjson"), b"{\"id\":\"mine\"}\n").unwrap();
        let (sha, bytes) = checksum(&dir.join("tables/api_keys.ndjson")).unwrap();
        let (cfg, mut m) = unreachable_deployment();
        m.tables.insert(
            "api_keys".into(),
            FileEntry { name: "tables/api_keys.ndjson".into(), items: 1, bytes, sha256: sha },
        );
        signed(&dir, &m, &key(0));
        let refused = |e: DrError| match e {
            DrError::Refused(m) => m,
            other => panic!("not refused before the broker or store: {other}"),
        };
        // The right key gets past the manifest (to the broker, which does not answer).
        let ok = restore(&cfg, &RestoreOptions { from: dir.clone(), key: key(0) }, &mut |_| {}).await.unwrap_err();
        assert!(!matches!(ok, DrError::Refused(_)), "a signed archive is believed: {ok}");
        // Another key.
        let e =
            refused(restore(&cfg, &RestoreOptions { from: dir.clone(), key: key(1) }, &mut |_| {}).await.unwrap_err());
        assert!(e.contains("does not match its keyed digest"), "{e}");
        assert!(!e.contains("bbbbbbbb") && !e.contains("aaaaaaaa"), "no key in the message: {e}");
        // An admin key slipped in: the file swapped, its checksum in the manifest rewritten.
        std::fs::write(dir.join("tables/api_keys.ndjson"), b"{\"id\":\"attacker\"}\n").unwrap();
        let (sha, bytes) = checksum(&dir.join("tables/api_keys.ndjson")).unwrap();
        let mut forged = m.clone();
        forged.tables.insert(
            "api_keys".into(),
            FileEntry { name: "tables/api_keys.ndjson".into(), items: 1, bytes, sha256: sha },
        );
        write_json(&dir.join(MANIFEST), &forged).unwrap();
        let opts = RestoreOptions { from: dir.clone(), key: key(0) };
        let e = refused(restore(&cfg, &opts, &mut |_| {}).await.unwrap_err());
        assert!(e.contains("does not match its keyed digest"), "{e}");
        // No digest at all.
        std::fs::remove_file(dir.join(MANIFEST_MAC)).unwrap();
        let e = refused(restore(&cfg, &opts, &mut |_| {}).await.unwrap_err());
        assert!(e.contains("carries no keyed digest"), "{e}");
    }
}
