//! Where a finished job's record lives, and how it is found again from its id alone.
//!
//! The hot path's store cost is one terminal write per job. Written as a row of its own
//! (`jobs`, keyed by job id) every job is a partition mutation of its own with ~16 cells;
//! here a job that succeeded on a plain run is instead one clustering row — one blob —
//! in a partition shared with the jobs submitted in the same second
//! (`finished_jobs`, partition key [`bucket`]), so one batch of finished jobs is a
//! handful of partition mutations. The id is enough to find the row again: a UUIDv7
//! carries its submission time, which names the bucket; a few shards per second spread a
//! busy second over several partitions (and so over a real cluster's nodes).
//!
//! A job's state is then the newer of its `jobs` row and its finished record
//! ([`newer_is_finished`]): by generation, then by write time, the finished record
//! winning a tie (it is terminal). Only jobs whose `jobs` row can hold no claim on them
//! go this way (the worker decides: never a job marked running or claimed after a
//! hand-off, whose row's status conditions the store's compare-and-set steps).

use serde::{Deserialize, Serialize};

/// Partitions per second of submission. Part of the stored layout: changing it would hide
/// the records already written under the old value.
pub const SHARDS: i64 = 8;

/// The partition of a job's finished record: its submission second (from the UUIDv7)
/// times [`SHARDS`], plus a shard from the id's random bits. None when the id is not a
/// UUIDv7 (ids chosen by raw Kafka producers): such jobs keep the `jobs` row.
pub fn bucket(job_id: &str) -> Option<i64> {
    let id = uuid::Uuid::parse_str(job_id).ok()?;
    if id.get_version_num() != 7 {
        return None;
    }
    let bits = id.as_u128();
    let ms = (bits >> 80) as i64;
    let shard = (bits as u64 % SHARDS as u64) as i64;
    Some(ms.div_euclid(1000) * SHARDS + shard)
}

/// What a finished record holds besides the job id and its output (a column of its own,
/// written only when there is one). Short field names: one blob per job.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FinishedRecord {
    #[serde(rename = "s")]
    pub status: String,
    #[serde(rename = "t")]
    pub tenant: String,
    #[serde(rename = "y")]
    pub job_type: String,
    #[serde(rename = "p")]
    pub pool: String,
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
    pub worker: String,
    #[serde(rename = "u")]
    pub updated_at: i64,
}

/// Layout of the stored blob: this byte, the record's length (u32, big-endian), the record
/// (JSON), then the job's output bytes if it has one. One cell, so an overwrite (a rerun)
/// replaces the output too.
const WITH_OUTPUT: u8 = 1;
const WITHOUT_OUTPUT: u8 = 0;

impl FinishedRecord {
    pub fn encode(&self, output: Option<&[u8]>) -> Vec<u8> {
        let json = serde_json::to_vec(self).expect("a finished record always encodes");
        let mut out = Vec::with_capacity(5 + json.len() + output.map_or(0, <[u8]>::len));
        out.push(if output.is_some() { WITH_OUTPUT } else { WITHOUT_OUTPUT });
        out.extend_from_slice(&(json.len() as u32).to_be_bytes());
        out.extend_from_slice(&json);
        out.extend_from_slice(output.unwrap_or_default());
        out
    }

    /// Decodes a stored blob into the record and the output; the error names what is
    /// wrong with it.
    pub fn decode(bytes: &[u8]) -> Result<(FinishedRecord, Option<Vec<u8>>), String> {
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

/// The order of two records of one job: (generation, write time). `jobs` row and finished
/// record compared: true when the finished record is the job's state.
pub fn newer_is_finished(row: (Option<i64>, Option<i64>), finished: (i64, i64)) -> bool {
    let (row_gen, row_at) = (row.0.unwrap_or(0), row.1.unwrap_or(i64::MIN));
    (finished.0, finished.1) >= (row_gen, row_at)
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
        assert!(!newer_is_finished((Some(2), Some(10)), (1, 50)));
        // The same generation: the later write wins; a tie goes to the finished record.
        assert!(newer_is_finished((Some(1), Some(10)), (1, 50)));
        assert!(!newer_is_finished((Some(1), Some(60)), (1, 50)));
        assert!(newer_is_finished((Some(1), Some(50)), (1, 50)));
        // A row without generation or write time (a bare cancel flag) loses.
        assert!(newer_is_finished((None, None), (0, 1)));
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

    proptest! {
        #[test]
        fn every_v7_id_of_a_second_lands_in_that_seconds_buckets(ms in 0u64..(1u64 << 47), rand in any::<u128>()) {
            let b = bucket(&v7_at(ms, rand)).unwrap();
            prop_assert_eq!(b.div_euclid(SHARDS), (ms / 1000) as i64);
            prop_assert!((0..SHARDS).contains(&b.rem_euclid(SHARDS)));
        }
    }
}
