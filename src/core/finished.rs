//! Where a job's recorded states live when they need no row of their own, and how they
//! are found again from the job's id alone.
//!
//! The hot path's store cost is one write at submission (the job is visible at once) and
//! one terminal write per job. Written as rows of their own (`jobs`, keyed by job id)
//! every job is a partition mutation with ~16 cells. A job submitted through fairway is
//! instead one **queued record** of a pack, and one that succeeded on a plain run one
//! **finished record** of a pack: a pack is one blob holding the records of many jobs,
//! written once (`finished_packs`), lz4-compressed. A pack holds the records of one
//! coalesced write that share a [`pack_bucket`]: the 100 ms of submission their UUIDv7
//! ids carry, and one of [`PACK_SHARDS`] shards of the ids' random bits. The database's
//! cost is per row and per byte (memtable, commit log, flush, compaction), so a pack of
//! k jobs costs about what one job's row cost.
//!
//! The id is enough to find the records again: its bucket is read whole (every pack of
//! jobs submitted in the same 100 ms and shard) and the packs searched. That read is the
//! trade: a lookup costs up to (jobs submitted per 100 ms ÷ [`PACK_SHARDS`]) × 2 records
//! (a queued and a finished one each), so ~1,000 at 40,000 jobs/s. Records written before
//! packs (`finished_jobs`, one row per job in [`bucket`]) are read as well, and that
//! layout still takes the records larger than [`PACK_ENTRY_MAX`].
//!
//! A job's state is then the newest of its `jobs` row and its records ([`record_wins`]):
//! by generation, then by write time; on a tie a finished record wins (it is terminal)
//! and a queued one loses (anything written about the job after its submission is
//! newer). Only jobs whose `jobs` row can hold no claim on them are finished this way
//! (the worker decides: never a job marked running or claimed after a hand-off, whose
//! row's status conditions the store's compare-and-set steps).

use serde::{Deserialize, Serialize};
use std::borrow::Cow;

/// Partitions per second of submission of the per-job layout (`finished_jobs`, read
/// only). Part of the stored layout: changing it would hide the records written under it.
pub const SHARDS: i64 = 8;

/// Milliseconds of submission per pack bucket. Part of the stored layout.
pub const PACK_SPAN_MS: i64 = 100;
/// Pack buckets per [`PACK_SPAN_MS`]. Part of the stored layout.
pub const PACK_SHARDS: i64 = 8;
/// Largest encoded record packed. A bigger one (a job with a large output) keeps a row of
/// its own in the per-job layout (`finished_jobs`, read by id), so a lookup that reads a
/// pack bucket never reads another job's large output: its cost stays ~[`PACK_ENTRY_MAX`]
/// per job of the bucket whatever one tenant's jobs return.
pub const PACK_ENTRY_MAX: usize = 4 * 1024;
/// Most bytes of records in one pack (a write of many packs stays under the database's
/// batch limits: ScyllaDB warns at 128 KiB and fails at 1 MiB by default).
pub const PACK_MAX_BYTES: usize = 64 * 1024;

/// The pack bucket of a job: the 100 ms of submission its UUIDv7 id carries, times
/// [`PACK_SHARDS`], plus a shard from the id's random bits. None when the id is not a
/// UUIDv7 (ids chosen by raw Kafka producers): such jobs keep the `jobs` row.
pub fn pack_bucket(job_id: &str) -> Option<i64> {
    let (ms, shard) = v7_parts(job_id, PACK_SHARDS)?;
    Some(ms.div_euclid(PACK_SPAN_MS) * PACK_SHARDS + shard)
}

/// (submission ms, shard of `shards`) of a UUIDv7 id.
fn v7_parts(job_id: &str, shards: i64) -> Option<(i64, i64)> {
    let id = uuid::Uuid::parse_str(job_id).ok()?;
    if id.get_version_num() != 7 {
        return None;
    }
    let bits = id.as_u128();
    Some(((bits >> 80) as i64, (bits as u64 % shards as u64) as i64))
}

/// The partition of a job's finished record: its submission second (from the UUIDv7)
/// times [`SHARDS`], plus a shard from the id's random bits. None when the id is not a
/// UUIDv7 (ids chosen by raw Kafka producers): such jobs keep the `jobs` row.
pub fn bucket(job_id: &str) -> Option<i64> {
    let (ms, shard) = v7_parts(job_id, SHARDS)?;
    Some(ms.div_euclid(1000) * SHARDS + shard)
}

/// The first byte of a pack: its layout. Both are read; packs are written compressed.
/// Plain: the entries as they are (each: the id's length (u8), the id, the record's
/// length (u32, big-endian), the record).
const PACK_PLAIN: u8 = 1;
/// Compressed: a plain pack's entries as one lz4 block, its size first. A pack's
/// records share their keys, tenants, types and worker ids, so this is ~4x smaller:
/// the database's cost of a pack follows its bytes (commit log, memtable, flush).
const PACK_LZ4: u8 = 2;
/// Largest size a compressed pack may claim to open to (a pack is at most
/// [`PACK_MAX_BYTES`] plus one record): a corrupt size is refused, not allocated.
const PACK_OPEN_MAX: usize = 16 * 1024 * 1024;

/// Groups encoded records (job id, [`FinishedRecord::encode`]d blob) into packs: one per
/// [`pack_bucket`], split so none holds more than [`PACK_MAX_BYTES`] of records (a record
/// larger than that gets a pack of its own), each compressed. Returns (bucket, pack, the
/// indexes of the input entries it holds). Entries whose id is not a UUIDv7 are left out
/// (the caller refuses them first).
pub fn packs(entries: &[(String, Vec<u8>)]) -> Vec<(i64, Vec<u8>, Vec<usize>)> {
    let mut by_bucket: std::collections::BTreeMap<i64, Vec<usize>> = std::collections::BTreeMap::new();
    for (i, (id, _)) in entries.iter().enumerate() {
        if let Some(b) = pack_bucket(id) {
            by_bucket.entry(b).or_default().push(i);
        }
    }
    let mut out = Vec::new();
    for (bucket, idx) in by_bucket {
        let mut body = Vec::new();
        let mut held = Vec::new();
        for i in idx {
            let (id, blob) = &entries[i];
            let size = 1 + id.len() + 4 + blob.len();
            if !held.is_empty() && 1 + body.len() + size > PACK_MAX_BYTES {
                out.push((bucket, seal(&body), std::mem::take(&mut held)));
                body.clear();
            }
            let id_len = u8::try_from(id.len()).expect("a UUID's text is 36 bytes");
            body.push(id_len);
            body.extend_from_slice(id.as_bytes());
            body.extend_from_slice(&(blob.len() as u32).to_be_bytes());
            body.extend_from_slice(blob);
            held.push(i);
        }
        out.push((bucket, seal(&body), held));
    }
    out
}

/// A compressed pack of plain entries.
fn seal(entries: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(1 + 4 + lz4_flex::block::get_maximum_output_size(entries.len()));
    out.push(PACK_LZ4);
    out.extend_from_slice(&lz4_flex::block::compress_prepend_size(entries));
    out
}

/// A stored pack's entries in the plain layout (opened if compressed), for [`entries`];
/// the error names what is wrong with it.
pub fn open(pack: &[u8]) -> Result<std::borrow::Cow<'_, [u8]>, String> {
    let (&layout, rest) = pack.split_first().ok_or_else(|| bad_pack("empty"))?;
    match layout {
        PACK_PLAIN => Ok(std::borrow::Cow::Borrowed(rest)),
        PACK_LZ4 => {
            let (size, block) = lz4_flex::block::uncompressed_size(rest).map_err(|e| bad_pack(&e.to_string()))?;
            if size > PACK_OPEN_MAX {
                return Err(bad_pack(&format!("claims {size} bytes, more than a pack ever holds")));
            }
            let plain = lz4_flex::block::decompress(block, size).map_err(|e| bad_pack(&e.to_string()))?;
            Ok(std::borrow::Cow::Owned(plain))
        }
        other => Err(bad_pack(&format!("unknown layout byte {other}"))),
    }
}

/// The entries (job id, encoded record) of an [`open`]ed pack; the error names what is
/// wrong with it.
pub fn entries(mut rest: &[u8]) -> Result<Vec<(&str, &[u8])>, String> {
    let mut out = Vec::new();
    while let Some((&id_len, r)) = rest.split_first() {
        let id = r.get(..id_len as usize).ok_or_else(|| bad_pack("truncated job id"))?;
        let id = std::str::from_utf8(id).map_err(|_| bad_pack("a job id is not UTF-8"))?;
        let r = &r[id_len as usize..];
        let len = r.get(..4).ok_or_else(|| bad_pack("truncated record length"))?;
        let len = u32::from_be_bytes(len.try_into().expect("4 bytes")) as usize;
        let blob = r.get(4..4 + len).ok_or_else(|| bad_pack("truncated record"))?;
        out.push((id, blob));
        rest = &r[4 + len..];
    }
    Ok(out)
}

fn bad_pack(why: &str) -> String {
    format!("unreadable finished-job pack: {why}")
}

/// Bytes [`FinishedRecord::encode`] reserves for a record's JSON (most are ~170-250).
const RECORD_JSON_GUESS: usize = 256;

/// What a finished record holds besides the job id and its output (a column of its own,
/// written only when there is one). Short field names: one blob per job. Its text fields
/// borrow when a record is written (no copies per job) and own when one is read.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FinishedRecord<'a> {
    #[serde(rename = "s")]
    pub status: Cow<'a, str>,
    #[serde(rename = "t")]
    pub tenant: Cow<'a, str>,
    #[serde(rename = "y")]
    pub job_type: Cow<'a, str>,
    #[serde(rename = "p")]
    pub pool: Cow<'a, str>,
    #[serde(rename = "a")]
    pub attempts: i32,
    #[serde(rename = "c", default)]
    pub crash_count: i32,
    #[serde(rename = "g", default)]
    pub generation: i64,
    #[serde(rename = "sub")]
    pub submitted_at: i64,
    #[serde(rename = "st", default)]
    pub started_at: Option<i64>,
    #[serde(rename = "fin", default)]
    pub finished_at: Option<i64>,
    #[serde(rename = "w")]
    pub worker: Cow<'a, str>,
    #[serde(rename = "u")]
    pub updated_at: i64,
    /// Process jobs: the last attempt's peak memory and CPU time (`model::ProcessUsage`).
    #[serde(rename = "pm", default, skip_serializing_if = "Option::is_none")]
    pub peak_memory_bytes: Option<i64>,
    #[serde(rename = "cpu", default, skip_serializing_if = "Option::is_none")]
    pub cpu_ms: Option<i64>,
}

/// Layout of the stored blob: this byte, the record's length (u32, big-endian), the record
/// (JSON), then the job's output bytes if it has one. One cell, so an overwrite (a rerun)
/// replaces the output too.
const WITH_OUTPUT: u8 = 1;
const WITHOUT_OUTPUT: u8 = 0;

/// The status of a queued record (a submission); every other status a record holds is
/// terminal.
pub const QUEUED: &str = "queued";

impl<'a> FinishedRecord<'a> {
    /// The record of a submission: queued, nothing run, no worker (written at `submitted_at`).
    pub fn queued(
        tenant: &'a str,
        job_type: &'a str,
        pool: &'a str,
        generation: i64,
        submitted_at: i64,
    ) -> FinishedRecord<'a> {
        FinishedRecord {
            status: Cow::Borrowed(QUEUED),
            tenant: Cow::Borrowed(tenant),
            job_type: Cow::Borrowed(job_type),
            pool: Cow::Borrowed(pool),
            attempts: 0,
            crash_count: 0,
            generation,
            submitted_at,
            started_at: None,
            finished_at: None,
            worker: Cow::Borrowed(""),
            updated_at: submitted_at,
            peak_memory_bytes: None,
            cpu_ms: None,
        }
    }

    /// A finished record; false for a queued one.
    pub fn is_terminal(&self) -> bool {
        self.status != QUEUED
    }

    pub fn encode(&self, output: Option<&[u8]>) -> Vec<u8> {
        // One buffer, the JSON written in place after a length filled in afterwards (every
        // finished job is encoded here).
        let mut out = Vec::with_capacity((5 + RECORD_JSON_GUESS).saturating_add(output.map_or(0, <[u8]>::len)));
        out.push(if output.is_some() { WITH_OUTPUT } else { WITHOUT_OUTPUT });
        out.extend_from_slice(&[0; 4]);
        serde_json::to_writer(&mut out, self).expect("a finished record always encodes");
        let json_len = u32::try_from(out.len() - 5).expect("a record's names and numbers are bounded");
        out[1..5].copy_from_slice(&json_len.to_be_bytes());
        out.extend_from_slice(output.unwrap_or_default());
        out
    }

    /// Decodes a stored blob into the record and the output; the error names what is
    /// wrong with it.
    pub fn decode(bytes: &[u8]) -> Result<(FinishedRecord<'static>, Option<Vec<u8>>), String> {
        let bad = |why: &str| format!("unreadable finished-job record: {why}");
        let (&flag, rest) = bytes.split_first().ok_or_else(|| bad("empty"))?;
        if flag != WITH_OUTPUT && flag != WITHOUT_OUTPUT {
            return Err(bad(&format!("unknown layout byte {flag}")));
        }
        let len = rest.get(..4).ok_or_else(|| bad("truncated length"))?;
        let len = u32::from_be_bytes(len.try_into().expect("4 bytes")) as usize;
        let json = rest.get(4..4 + len).ok_or_else(|| bad("truncated record"))?;
        let record = serde_json::from_slice(json).map_err(|e| bad(&e.to_string()))?;
        let output = (flag == WITH_OUTPUT).then(|| rest[4 + len..].to_vec());
        Ok((record, output))
    }
}

/// The order key of a job's state already known (its `jobs` row, or a record merged
/// before) for [`record_wins`]: (generation, write time). A row without a status is a bare
/// cancel flag (written to a job whose state is packed): it orders nothing.
pub fn order_of(status: Option<&str>, generation: Option<i64>, updated_at: Option<i64>) -> (Option<i64>, Option<i64>) {
    if status.is_some() {
        (generation, updated_at)
    } else {
        (None, None)
    }
}

/// Whether a packed record becomes a job's state over the current one (its `jobs` row,
/// or a record merged before): the later (generation, write time) wins; on a tie a
/// `terminal` (finished) record wins and a queued one does not.
pub fn record_wins(current: (Option<i64>, Option<i64>), record: (i64, i64), terminal: bool) -> bool {
    let current = (current.0.unwrap_or(0), current.1.unwrap_or(i64::MIN));
    record > current || (terminal && record == current)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn v7_at(ms: u64, rand: u128) -> String {
        let bits = (u128::from(ms) << 80) | (0x7u128 << 76) | (rand & 0x0fff_3fff_ffff_ffff_ffff) | (0b10u128 << 62);
        uuid::Uuid::from_u128(bits).to_string()
    }

    #[test]
    fn a_uuid_v7_names_its_submission_second_and_a_shard() {
        let id = v7_at(1_700_000_123_456, 5);
        assert_eq!(uuid::Uuid::parse_str(&id).unwrap().get_version_num(), 7);
        assert_eq!(bucket(&id), Some(1_700_000_123 * SHARDS + 5));
        let now = uuid::Uuid::now_v7().to_string();
        assert!(bucket(&now).is_some());
    }

    #[test]
    fn other_ids_have_no_bucket() {
        assert_eq!(bucket("order-42"), None);
        assert_eq!(bucket(&uuid::Uuid::new_v4().to_string()), None);
        assert_eq!(bucket(""), None);
    }

    #[test]
    fn the_newer_record_wins_by_generation_then_write_time() {
        // A rerun's newer generation in the row beats an older finished record.
        assert!(!record_wins((Some(2), Some(10)), (1, 50), true));
        // The same generation: the later write wins; a tie goes to a finished record.
        assert!(record_wins((Some(1), Some(10)), (1, 50), true));
        assert!(!record_wins((Some(1), Some(60)), (1, 50), true));
        assert!(record_wins((Some(1), Some(50)), (1, 50), true));
        // A queued record loses a tie: whatever was written at the same time is newer.
        assert!(!record_wins((Some(1), Some(50)), (1, 50), false));
        assert!(record_wins((Some(1), Some(49)), (1, 50), false));
        // A row without generation or write time (a bare cancel flag) loses.
        assert!(record_wins((None, None), (0, 1), true));
        assert!(record_wins((None, None), (0, 1), false));
        // A cancel flag written after the submission does not hide the queued record.
        assert!(record_wins(order_of(None, None, Some(90)), (0, 50), false));
        assert!(!record_wins(order_of(Some("running"), Some(0), Some(90)), (0, 50), false));
    }

    #[test]
    fn records_round_trip_and_bad_bytes_are_named() {
        let r = FinishedRecord {
            status: "succeeded".into(),
            tenant: "acme".into(),
            job_type: "noop".into(),
            pool: "short".into(),
            attempts: 1,
            crash_count: 0,
            generation: 3,
            submitted_at: 1,
            started_at: Some(2),
            finished_at: Some(3),
            worker: "w-1".into(),
            updated_at: 3,
            peak_memory_bytes: Some(5 << 20),
            cpu_ms: Some(7),
        };
        assert_eq!(FinishedRecord::decode(&r.encode(None)).unwrap(), (r.clone(), None));
        assert_eq!(FinishedRecord::decode(&r.encode(Some(b""))).unwrap(), (r.clone(), Some(vec![])));
        assert_eq!(
            FinishedRecord::decode(&r.encode(Some(b"{\"n\":1}"))).unwrap(),
            (r.clone(), Some(b"{\"n\":1}".to_vec()))
        );
        for bad in [&b""[..], b"\x07", b"\x00\x00\x00", b"\x00\x00\x00\x00\x09{}", b"\x00\x00\x00\x00\x02{]"] {
            let e = FinishedRecord::decode(bad).unwrap_err();
            assert!(e.starts_with("unreadable finished-job record"), "{e}");
        }
    }

    #[test]
    fn packs_group_by_bucket_and_bad_packs_are_named() {
        let a = v7_at(1_700_000_000_000, 1);
        let b = v7_at(1_700_000_000_050, 1);
        let c = v7_at(1_700_000_000_150, 1);
        assert_eq!(pack_bucket(&a), pack_bucket(&b), "the same 100 ms and shard");
        assert_ne!(pack_bucket(&a), pack_bucket(&c), "the next 100 ms");
        let input = vec![
            (a.clone(), b"ra".to_vec()),
            ("order-1".to_string(), b"x".to_vec()),
            (c.clone(), b"rc".to_vec()),
            (b.clone(), b"rb".to_vec()),
        ];
        let p = packs(&input);
        assert_eq!(p.len(), 2);
        let held: Vec<Vec<usize>> = p.iter().map(|(_, _, h)| h.clone()).collect();
        assert_eq!(held, vec![vec![0, 3], vec![2]]);
        let opened = open(&p[0].1).unwrap();
        assert_eq!(entries(&opened).unwrap(), vec![(a.as_str(), &b"ra"[..]), (b.as_str(), &b"rb"[..])]);
        // The plain layout (written before packs were compressed) is still read.
        let plain = [&[PACK_PLAIN][..], &opened].concat();
        assert_eq!(entries(&open(&plain).unwrap()).unwrap(), entries(&opened).unwrap());
        for bad in [&b""[..], b"\x03", b"\x02", b"\x02\xff\xff\xff\x7fab", b"\x01\x05ab", b"\x01\x01a\x00\x00\x00\x09x"]
        {
            let e = open(bad).and_then(|body| entries(&body).map(|_| ())).unwrap_err();
            assert!(e.starts_with("unreadable finished-job pack"), "{e}");
        }
    }

    proptest! {
        #[test]
        fn packs_hold_every_entry_once_within_the_size_bound(
            ms in 1_600_000_000_000u64..1_600_000_001_000,
            sizes in proptest::collection::vec(0usize..40_000, 1..40),
        ) {
            let entries: Vec<(String, Vec<u8>)> = sizes
                .iter()
                .enumerate()
                .map(|(i, n)| (v7_at(ms + (i as u64 * 37) % 1000, i as u128 * 7919), vec![i as u8; *n]))
                .collect();
            let mut seen = vec![0; entries.len()];
            for (bucket, pack, held) in packs(&entries) {
                let body = open(&pack).unwrap();
                prop_assert!(body.len() < PACK_MAX_BYTES || held.len() == 1);
                let got = super::entries(&body).unwrap();
                prop_assert_eq!(got.len(), held.len());
                for ((id, blob), i) in got.into_iter().zip(held) {
                    prop_assert_eq!(pack_bucket(id), Some(bucket));
                    prop_assert_eq!((id, blob), (entries[i].0.as_str(), entries[i].1.as_slice()));
                    seen[i] += 1;
                }
            }
            prop_assert!(seen.iter().all(|n| *n == 1));
        }

        #[test]
        fn every_v7_id_of_a_second_lands_in_that_seconds_buckets(ms in 0u64..(1u64 << 47), rand in any::<u128>()) {
            let b = bucket(&v7_at(ms, rand)).unwrap();
            prop_assert_eq!(b.div_euclid(SHARDS), (ms / 1000) as i64);
            prop_assert!((0..SHARDS).contains(&b.rem_euclid(SHARDS)));
        }
    }
}
