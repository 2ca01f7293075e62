//! Wire codec: Avro single-object encoding of the record types that travel on
//! Kafka ([`JobSubmitted`], [`JobResult`], [`DeadLetter`], [`JobEvent`]).
//!
//! A message is
//!
//! ```text
//! C3 01 | 8-byte little-endian CRC-64-AVRO (Rabin) fingerprint of the schema's
//!       |   parsing canonical form
//!       | Avro binary body
//! ```
//!
//! The schemas live in `schemas/*.avsc` (namespace `io.fairway`) and are compiled into
//! the binary. They are parsed once with apache-avro, which also computes the
//! fingerprints; any Avro implementation that reads those `.avsc` files can talk to us
//! (see `scripts/gen_avro_fixture.py` for a Python/fastavro example).
//!
//! The body encoder/decoder is written by hand for these three fixed schemas. apache-avro's
//! serde path decodes through its generic `Value` (4-6 µs per job with a 100-byte payload,
//! 2 cores), its direct serde encoder cannot follow the named-type reference in
//! `dead_letter.avsc`, and it allocates whatever length a corrupt message claims (up to
//! 512 MiB) before noticing the message is shorter. The hand path takes ~0.1 µs to encode
//! and ~0.3-0.4 µs to decode a job, never allocates more than the message holds, and the
//! tests cross-check it byte for byte against apache-avro (and against fastavro fixtures),
//! so the `.avsc` files stay the single source of truth: a schema edit that this code does
//! not follow fails the tests (and changes a pinned fingerprint).
//!
//! Schema evolution: a message is read by its writer schema's fingerprint. The current
//! schema takes the fast hand-written path; a released earlier version (kept in
//! `schemas/history/`, see `History`) is read by Avro schema resolution into the current
//! record (fields added since take their defaults), so a rolling upgrade loses nothing an
//! older producer or worker wrote. v2 of `JobSubmitted` (and the `DeadLetter` that embeds
//! it) added the W3C trace-context fields, v3 the flow-control key `flow_key`, v4 (and
//! v2 of `JobResult`) the failure class `resource` (appended, so old symbols keep their
//! indexes), v5 the end-user key `user_key` and the hand-off count `handoff_count`;
//! messages of each released version are fixtures in `tests/fixtures/v<N>`.
//! Any other fingerprint is refused with an error that names it.

use std::fmt;
use std::sync::LazyLock;

use apache_avro::rabin::Rabin;
use apache_avro::Schema;

use crate::model::{DeadLetter, EventKind, FailureClass, JobEvent, JobResult, JobStatus, JobSubmitted, Pool, Priority};

/// The two marker bytes that start every Avro single-object encoded message.
pub const MAGIC: [u8; 2] = [0xC3, 0x01];
/// Marker plus fingerprint: the fixed-size prefix before the Avro body.
pub const HEADER_LEN: usize = 10;

/// Which of fairway's wire records a message holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RecordKind {
    JobSubmitted,
    JobResult,
    DeadLetter,
    JobEvent,
}

impl RecordKind {
    pub const ALL: [RecordKind; 4] =
        [RecordKind::JobSubmitted, RecordKind::JobResult, RecordKind::DeadLetter, RecordKind::JobEvent];

    /// Full Avro name of the record, e.g. `io.fairway.JobSubmitted`.
    pub fn full_name(self) -> &'static str {
        match self {
            RecordKind::JobSubmitted => "io.fairway.JobSubmitted",
            RecordKind::JobResult => "io.fairway.JobResult",
            RecordKind::DeadLetter => "io.fairway.DeadLetter",
            RecordKind::JobEvent => "io.fairway.JobEvent",
        }
    }

    fn decode_fn(self) -> &'static str {
        match self {
            RecordKind::JobSubmitted => "decode_job",
            RecordKind::JobResult => "decode_result",
            RecordKind::DeadLetter => "decode_dead_letter",
            RecordKind::JobEvent => "decode_event",
        }
    }

    fn wire(self) -> &'static WireSchema {
        match self {
            RecordKind::JobSubmitted => &JOB_SUBMITTED,
            RecordKind::JobResult => &JOB_RESULT,
            RecordKind::DeadLetter => &DEAD_LETTER,
            RecordKind::JobEvent => &JOB_EVENT,
        }
    }
}

impl fmt::Display for RecordKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.full_name())
    }
}

/// An 8-byte schema fingerprint as it appears on the wire (little-endian CRC-64-AVRO).
/// Displays as 16 lowercase hex digits in wire order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fingerprint(pub [u8; 8]);

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for b in self.0 {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

/// Everything that can go wrong turning bytes into a record.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CodecError {
    #[error(
        "not Avro single-object encoding: message is {len} bytes, but the C3 01 marker plus the \
         8-byte schema fingerprint alone take {HEADER_LEN}; expected a {expected} message written \
         by fairway's codec (or any Avro single-object encoder using schemas/*.avsc)"
    )]
    TooShort { len: usize, expected: RecordKind },

    #[error(
        "not Avro single-object encoding: expected magic C3 01 at the start of the message, found \
         {found0:02X} {found1:02X}; the producer must write {expected} with fairway's codec (or any \
         Avro single-object encoder using schemas/*.avsc), not JSON, raw Avro or a Confluent \
         schema-registry frame"
    )]
    BadMagic { found0: u8, found1: u8, expected: RecordKind },

    #[error(
        "unknown schema fingerprint {found}: expected {expected} (fingerprint {expected_fp}); the \
         producer used a different or outdated version of schemas/{file}; make both sides build from \
         the same schemas"
    )]
    UnknownFingerprint { found: Fingerprint, expected: RecordKind, expected_fp: Fingerprint, file: &'static str },

    #[error(
        "wrong record type: message holds {found} but {expected} was expected; it was probably \
         produced to the wrong topic, read it with codec::{decode_fn} instead"
    )]
    WrongRecord { found: RecordKind, expected: RecordKind, decode_fn: &'static str },

    #[error(
        "corrupt {record} body: field `{field}` at message byte {offset}: {problem}; the message was \
         truncated or damaged in transit, or written by a producer whose schema does not match \
         its fingerprint"
    )]
    Body { record: RecordKind, field: &'static str, offset: usize, problem: String },

    #[error(
        "{extra} trailing bytes after a complete {record} body ({body} bytes); the message holds \
         more than one record or was written with a different schema under the same fingerprint"
    )]
    TrailingBytes { record: RecordKind, body: usize, extra: usize },
}

// ---------------------------------------------------------------------------------------
// Schemas
// ---------------------------------------------------------------------------------------

struct WireSchema {
    schema: Schema,
    fingerprint: Fingerprint,
    file: &'static str,
}

impl WireSchema {
    fn load(file: &'static str, json: &'static str) -> WireSchema {
        let schema =
            Schema::parse_str(json).unwrap_or_else(|e| panic!("schemas/{file} is not a valid Avro schema: {e}"));
        let fp = schema.fingerprint::<Rabin>();
        let fingerprint = Fingerprint(fp.bytes.as_slice().try_into().expect("CRC-64-AVRO fingerprint is 8 bytes"));
        WireSchema { schema, fingerprint, file }
    }
}

static JOB_SUBMITTED: LazyLock<WireSchema> =
    LazyLock::new(|| WireSchema::load("job_submitted.avsc", include_str!("../../schemas/job_submitted.avsc")));
static JOB_RESULT: LazyLock<WireSchema> =
    LazyLock::new(|| WireSchema::load("job_result.avsc", include_str!("../../schemas/job_result.avsc")));
static DEAD_LETTER: LazyLock<WireSchema> =
    LazyLock::new(|| WireSchema::load("dead_letter.avsc", include_str!("../../schemas/dead_letter.avsc")));
static JOB_EVENT: LazyLock<WireSchema> =
    LazyLock::new(|| WireSchema::load("job_event.avsc", include_str!("../../schemas/job_event.avsc")));

/// Released earlier versions of a schema (`schemas/history/<name>.v<N>.avsc`), still read.
/// A message written with one of them is decoded by Avro schema resolution into the
/// current schema (fields added since take their defaults), so a rolling upgrade loses
/// nothing that an older producer or worker wrote. When a schema changes, copy the
/// released version here first and list it below.
struct History {
    version: u32,
    wire: WireSchema,
}

static JOB_SUBMITTED_HISTORY: LazyLock<Vec<History>> = LazyLock::new(|| {
    vec![
        History {
            version: 1,
            wire: WireSchema::load(
                "history/job_submitted.v1.avsc",
                include_str!("../../schemas/history/job_submitted.v1.avsc"),
            ),
        },
        History {
            version: 2,
            wire: WireSchema::load(
                "history/job_submitted.v2.avsc",
                include_str!("../../schemas/history/job_submitted.v2.avsc"),
            ),
        },
        History {
            version: 3,
            wire: WireSchema::load(
                "history/job_submitted.v3.avsc",
                include_str!("../../schemas/history/job_submitted.v3.avsc"),
            ),
        },
        History {
            version: 4,
            wire: WireSchema::load(
                "history/job_submitted.v4.avsc",
                include_str!("../../schemas/history/job_submitted.v4.avsc"),
            ),
        },
    ]
});
static DEAD_LETTER_HISTORY: LazyLock<Vec<History>> = LazyLock::new(|| {
    vec![
        History {
            version: 1,
            wire: WireSchema::load(
                "history/dead_letter.v1.avsc",
                include_str!("../../schemas/history/dead_letter.v1.avsc"),
            ),
        },
        History {
            version: 2,
            wire: WireSchema::load(
                "history/dead_letter.v2.avsc",
                include_str!("../../schemas/history/dead_letter.v2.avsc"),
            ),
        },
        History {
            version: 3,
            wire: WireSchema::load(
                "history/dead_letter.v3.avsc",
                include_str!("../../schemas/history/dead_letter.v3.avsc"),
            ),
        },
        History {
            version: 4,
            wire: WireSchema::load(
                "history/dead_letter.v4.avsc",
                include_str!("../../schemas/history/dead_letter.v4.avsc"),
            ),
        },
    ]
});
static JOB_RESULT_HISTORY: LazyLock<Vec<History>> = LazyLock::new(|| {
    vec![
        History {
            version: 1,
            wire: WireSchema::load(
                "history/job_result.v1.avsc",
                include_str!("../../schemas/history/job_result.v1.avsc"),
            ),
        },
        History {
            version: 2,
            wire: WireSchema::load(
                "history/job_result.v2.avsc",
                include_str!("../../schemas/history/job_result.v2.avsc"),
            ),
        },
    ]
});

static JOB_EVENT_HISTORY: LazyLock<Vec<History>> = LazyLock::new(|| {
    vec![
        History {
            version: 1,
            wire: WireSchema::load(
                "history/job_event.v1.avsc",
                include_str!("../../schemas/history/job_event.v1.avsc"),
            ),
        },
        History {
            version: 2,
            wire: WireSchema::load(
                "history/job_event.v2.avsc",
                include_str!("../../schemas/history/job_event.v2.avsc"),
            ),
        },
    ]
});

/// The released earlier versions of a record kind's schema that are still decoded.
fn history(kind: RecordKind) -> &'static [History] {
    match kind {
        RecordKind::JobSubmitted => &JOB_SUBMITTED_HISTORY,
        RecordKind::DeadLetter => &DEAD_LETTER_HISTORY,
        RecordKind::JobEvent => &JOB_EVENT_HISTORY,
        RecordKind::JobResult => &JOB_RESULT_HISTORY,
    }
}

/// Largest allocation apache-avro may make while resolving an older-version message: a
/// corrupt length prefix must not allocate more than any real message holds.
const RESOLVE_MAX_ALLOCATION: usize = 64 << 20;

/// Rewrites the Avro body of a message written with an older schema version into a body
/// of the current schema (Avro schema resolution), for the hand decoder to read.
fn resolve_body(kind: RecordKind, old: &History, body: &[u8]) -> Result<Vec<u8>, CodecError> {
    static LIMIT: std::sync::Once = std::sync::Once::new();
    LIMIT.call_once(|| {
        apache_avro::max_allocation_bytes(RESOLVE_MAX_ALLOCATION);
    });
    let current = schema(kind);
    let problem = |what: &str, e: apache_avro::Error| CodecError::Body {
        record: kind,
        field: "(whole record)",
        offset: HEADER_LEN,
        problem: format!("written with schema version {} (schemas/{}), which {what}: {e}", old.version, old.wire.file),
    };
    let mut reader = body;
    let value = apache_avro::from_avro_datum(&old.wire.schema, &mut reader, Some(current))
        .map_err(|e| problem("does not resolve into the current schema", e))?;
    if !reader.is_empty() {
        return Err(CodecError::TrailingBytes { record: kind, body: body.len() - reader.len(), extra: reader.len() });
    }
    apache_avro::to_avro_datum(current, value).map_err(|e| problem("resolved to a value the current schema rejects", e))
}

/// The parsed Avro schema of a record kind (from `schemas/*.avsc`).
pub fn schema(kind: RecordKind) -> &'static Schema {
    &kind.wire().schema
}

/// The wire fingerprint of a record kind's schema.
pub fn fingerprint(kind: RecordKind) -> Fingerprint {
    kind.wire().fingerprint
}

/// Which record a message claims to hold, judged from its header alone (no body check).
/// `None` if it is not single-object encoded or carries a fingerprint we do not know.
pub fn sniff(bytes: &[u8]) -> Option<RecordKind> {
    if bytes.len() < HEADER_LEN || bytes[..2] != MAGIC {
        return None;
    }
    let fp = &bytes[2..HEADER_LEN];
    RecordKind::ALL.into_iter().find(|k| k.wire().fingerprint.0 == fp)
}

// ---------------------------------------------------------------------------------------
// Public API
// ---------------------------------------------------------------------------------------

/// Encode a job as an Avro single-object message (schema `io.fairway.JobSubmitted`).
///
/// The encoders cannot fail with the current schemas (every model value is
/// representable); they return `Result` so a future schema may reject values.
pub fn encode_job(job: &JobSubmitted) -> Result<Vec<u8>, CodecError> {
    let mut out = Vec::with_capacity(HEADER_LEN + 64 + job_size_hint(job));
    encode_job_into(job, &mut out)?;
    Ok(out)
}

/// Like [`encode_job`], appending the message (header included) to the end of `out`,
/// so one buffer can be reused on hot paths.
pub fn encode_job_into(job: &JobSubmitted, out: &mut Vec<u8>) -> Result<(), CodecError> {
    write_header(RecordKind::JobSubmitted, out);
    write_job(job, out);
    Ok(())
}

/// Decode an Avro single-object `io.fairway.JobSubmitted` message.
pub fn decode_job(bytes: &[u8]) -> Result<JobSubmitted, CodecError> {
    decode_with(bytes, RecordKind::JobSubmitted, read_job)
}

/// Encode a job result as an Avro single-object message (schema `io.fairway.JobResult`).
pub fn encode_result(res: &JobResult) -> Result<Vec<u8>, CodecError> {
    let hint = res.job_id.len()
        + res.tenant.len()
        + res.job_type.len()
        + res.output.as_ref().map_or(0, Vec::len)
        + res.error.as_ref().map_or(0, String::len)
        + res.worker_id.len();
    let mut out = Vec::with_capacity(HEADER_LEN + 64 + hint);
    encode_result_into(res, &mut out)?;
    Ok(out)
}

/// Like [`encode_result`], appending to `out`.
pub fn encode_result_into(res: &JobResult, out: &mut Vec<u8>) -> Result<(), CodecError> {
    write_header(RecordKind::JobResult, out);
    write_str(out, &res.job_id);
    write_str(out, &res.tenant);
    write_str(out, &res.job_type);
    write_long(out, pool_index(res.pool));
    write_long(out, status_index(res.status));
    write_opt(out, res.output.as_deref(), write_bytes);
    write_opt(out, res.error.as_deref(), write_str);
    write_opt(out, res.failure_class, |o, c| write_long(o, failure_index(c)));
    write_long(out, res.attempts.into());
    write_long(out, res.generation);
    write_long(out, res.submitted_at);
    write_opt(out, res.started_at, write_long);
    write_long(out, res.finished_at);
    write_str(out, &res.worker_id);
    write_opt(out, res.peak_memory_bytes, write_long);
    write_opt(out, res.cpu_ms, write_long);
    Ok(())
}

/// Decode an Avro single-object `io.fairway.JobResult` message.
pub fn decode_result(bytes: &[u8]) -> Result<JobResult, CodecError> {
    decode_with(bytes, RecordKind::JobResult, |r| {
        Ok(JobResult {
            job_id: r.string("job_id")?,
            tenant: r.string("tenant")?,
            job_type: r.string("job_type")?,
            pool: r.pool("pool")?,
            status: r.status("status")?,
            output: r.opt("output", |r, f| r.bytes(f))?,
            error: r.opt("error", |r, f| r.string(f))?,
            failure_class: r.opt("failure_class", |r, f| r.failure_class(f))?,
            attempts: r.int("attempts")?,
            generation: r.long("generation")?,
            submitted_at: r.long("submitted_at")?,
            started_at: r.opt("started_at", |r, f| r.long(f))?,
            finished_at: r.long("finished_at")?,
            worker_id: r.string("worker_id")?,
            peak_memory_bytes: r.opt("peak_memory_bytes", |r, f| r.long(f))?,
            cpu_ms: r.opt("cpu_ms", |r, f| r.long(f))?,
        })
    })
}

/// Encode a dead letter as an Avro single-object message (schema `io.fairway.DeadLetter`).
pub fn encode_dead_letter(dl: &DeadLetter) -> Result<Vec<u8>, CodecError> {
    let hint = dl.job.as_ref().map_or(0, job_size_hint)
        + dl.raw.as_ref().map_or(0, Vec::len)
        + dl.reason.len()
        + dl.last_error.as_ref().map_or(0, String::len)
        + dl.origin_topic.len();
    let mut out = Vec::with_capacity(HEADER_LEN + 128 + hint);
    encode_dead_letter_into(dl, &mut out)?;
    Ok(out)
}

/// Like [`encode_dead_letter`], appending to `out`.
pub fn encode_dead_letter_into(dl: &DeadLetter, out: &mut Vec<u8>) -> Result<(), CodecError> {
    write_header(RecordKind::DeadLetter, out);
    write_opt(out, dl.job.as_ref(), |o, j| write_job(j, o));
    write_opt(out, dl.raw.as_deref(), write_bytes);
    write_long(out, failure_index(dl.failure_class));
    write_str(out, &dl.reason);
    write_opt(out, dl.last_error.as_deref(), write_str);
    write_long(out, dl.attempts.into());
    write_long(out, dl.first_failure_at);
    write_long(out, dl.last_failure_at);
    write_str(out, &dl.origin_topic);
    write_long(out, dl.origin_partition.into());
    write_long(out, dl.origin_offset);
    write_long(out, dl.replay_count.into());
    Ok(())
}

/// Decode an Avro single-object `io.fairway.DeadLetter` message.
pub fn decode_dead_letter(bytes: &[u8]) -> Result<DeadLetter, CodecError> {
    decode_with(bytes, RecordKind::DeadLetter, |r| {
        Ok(DeadLetter {
            job: r.opt("job", |r, _| read_job(r))?,
            raw: r.opt("raw", |r, f| r.bytes(f))?,
            failure_class: r.failure_class("failure_class")?,
            reason: r.string("reason")?,
            last_error: r.opt("last_error", |r, f| r.string(f))?,
            attempts: r.int("attempts")?,
            first_failure_at: r.long("first_failure_at")?,
            last_failure_at: r.long("last_failure_at")?,
            origin_topic: r.string("origin_topic")?,
            origin_partition: r.int("origin_partition")?,
            origin_offset: r.long("origin_offset")?,
            replay_count: r.int("replay_count")?,
        })
    })
}

/// Encode a job event as an Avro single-object message (schema `io.fairway.JobEvent`).
pub fn encode_event(ev: &JobEvent) -> Result<Vec<u8>, CodecError> {
    let hint = ev.event_id.len()
        + ev.job_id.len()
        + ev.tenant.len()
        + ev.job_type.len()
        + ev.worker.as_ref().map_or(0, String::len)
        + ev.message.as_ref().map_or(0, String::len);
    let mut out = Vec::with_capacity(HEADER_LEN + 48 + hint);
    write_header(RecordKind::JobEvent, &mut out);
    write_str(&mut out, &ev.event_id);
    write_str(&mut out, &ev.job_id);
    write_str(&mut out, &ev.tenant);
    write_str(&mut out, &ev.job_type);
    write_long(&mut out, event_kind_index(ev.kind));
    write_long(&mut out, ev.at);
    write_long(&mut out, ev.attempt.into());
    write_opt(&mut out, ev.worker.as_deref(), write_str);
    write_opt(&mut out, ev.progress, |o, p| o.extend_from_slice(&p.to_le_bytes()));
    write_opt(&mut out, ev.message.as_deref(), write_str);
    write_opt(&mut out, ev.next_attempt_at, write_long);
    Ok(out)
}

/// Decode an Avro single-object `io.fairway.JobEvent` message.
pub fn decode_event(bytes: &[u8]) -> Result<JobEvent, CodecError> {
    decode_with(bytes, RecordKind::JobEvent, |r| {
        Ok(JobEvent {
            event_id: r.string("event_id")?,
            job_id: r.string("job_id")?,
            tenant: r.string("tenant")?,
            job_type: r.string("job_type")?,
            kind: r.symbol("kind", &EventKind::ALL)?,
            at: r.long("at")?,
            attempt: r.int("attempt")?,
            worker: r.opt("worker", |r, f| r.string(f))?,
            progress: r.opt("progress", |r, f| r.double(f))?,
            message: r.opt("message", |r, f| r.string(f))?,
            next_attempt_at: r.opt("next_attempt_at", |r, f| r.long(f))?,
        })
    })
}

/// Index of an event kind in `job_event.avsc`'s symbols (`EventKind::ALL` is that order).
fn event_kind_index(k: EventKind) -> i64 {
    EventKind::ALL.iter().position(|x| *x == k).expect("every kind is in ALL") as i64
}

// ---------------------------------------------------------------------------------------
// JobSubmitted body (shared by the top-level record and DeadLetter.job)
// ---------------------------------------------------------------------------------------

fn job_size_hint(j: &JobSubmitted) -> usize {
    j.job_id.len()
        + j.tenant.len()
        + j.job_type.len()
        + j.payload.len()
        + j.idempotency_key.as_ref().map_or(0, String::len)
        + j.last_error.as_ref().map_or(0, String::len)
        + j.replayed_from.as_ref().map_or(0, String::len)
        + j.traceparent.as_ref().map_or(0, String::len)
        + j.tracestate.as_ref().map_or(0, String::len)
        + j.flow_key.as_ref().map_or(0, String::len)
        + j.user_key.as_ref().map_or(0, String::len)
        + 64
}

fn write_job(j: &JobSubmitted, out: &mut Vec<u8>) {
    write_str(out, &j.job_id);
    write_str(out, &j.tenant);
    write_str(out, &j.job_type);
    write_opt(out, j.pool, |o, p| write_long(o, pool_index(p)));
    write_long(out, priority_index(j.priority));
    write_bytes(out, &j.payload);
    write_opt(out, j.idempotency_key.as_deref(), write_str);
    write_opt(out, j.execute_at, write_long);
    write_opt(out, j.not_after, write_long);
    write_long(out, j.attempt.into());
    write_long(out, j.crash_count.into());
    write_long(out, j.generation);
    write_long(out, j.submitted_at);
    write_opt(out, j.not_before, write_long);
    write_opt(out, j.last_error.as_deref(), write_str);
    write_opt(out, j.last_failure_class, |o, c| write_long(o, failure_index(c)));
    write_opt(out, j.first_failure_at, write_long);
    write_long(out, j.replay_count.into());
    write_opt(out, j.replayed_from.as_deref(), write_str);
    write_opt(out, j.traceparent.as_deref(), write_str);
    write_opt(out, j.tracestate.as_deref(), write_str);
    write_opt(out, j.flow_key.as_deref(), write_str);
    write_opt(out, j.user_key.as_deref(), write_str);
    write_long(out, j.handoff_count.into());
}

fn read_job(r: &mut BodyReader<'_>) -> Result<JobSubmitted, CodecError> {
    Ok(JobSubmitted {
        job_id: r.string("job_id")?,
        tenant: r.string("tenant")?,
        job_type: r.string("job_type")?,
        pool: r.opt("pool", |r, f| r.pool(f))?,
        priority: r.priority("priority")?,
        payload: r.bytes("payload")?,
        idempotency_key: r.opt("idempotency_key", |r, f| r.string(f))?,
        execute_at: r.opt("execute_at", |r, f| r.long(f))?,
        not_after: r.opt("not_after", |r, f| r.long(f))?,
        attempt: r.int("attempt")?,
        crash_count: r.int("crash_count")?,
        generation: r.long("generation")?,
        submitted_at: r.long("submitted_at")?,
        not_before: r.opt("not_before", |r, f| r.long(f))?,
        last_error: r.opt("last_error", |r, f| r.string(f))?,
        last_failure_class: r.opt("last_failure_class", |r, f| r.failure_class(f))?,
        first_failure_at: r.opt("first_failure_at", |r, f| r.long(f))?,
        replay_count: r.int("replay_count")?,
        replayed_from: r.opt("replayed_from", |r, f| r.string(f))?,
        traceparent: r.opt("traceparent", |r, f| r.string(f))?,
        tracestate: r.opt("tracestate", |r, f| r.string(f))?,
        flow_key: r.opt("flow_key", |r, f| r.string(f))?,
        user_key: r.opt("user_key", |r, f| r.string(f))?,
        handoff_count: r.int("handoff_count")?,
    })
}

// ---------------------------------------------------------------------------------------
// Enum symbol indexes: the order of "symbols" in the .avsc files (checked by tests).
// ---------------------------------------------------------------------------------------

fn pool_index(p: Pool) -> i64 {
    match p {
        Pool::Short => 0,
        Pool::Medium => 1,
        Pool::Long => 2,
    }
}
const POOLS: [Pool; 3] = [Pool::Short, Pool::Medium, Pool::Long];

fn priority_index(p: Priority) -> i64 {
    match p {
        Priority::Urgent => 0,
        Priority::Normal => 1,
        Priority::Low => 2,
    }
}
const PRIORITIES: [Priority; 3] = [Priority::Urgent, Priority::Normal, Priority::Low];

fn failure_index(c: FailureClass) -> i64 {
    match c {
        FailureClass::AppError => 0,
        FailureClass::Timeout => 1,
        FailureClass::Dependency => 2,
        FailureClass::WorkerCrash => 3,
        FailureClass::Poison => 4,
        FailureClass::Permanent => 5,
        FailureClass::Resource => 6,
    }
}
const FAILURE_CLASSES: [FailureClass; 7] = [
    FailureClass::AppError,
    FailureClass::Timeout,
    FailureClass::Dependency,
    FailureClass::WorkerCrash,
    FailureClass::Poison,
    FailureClass::Permanent,
    FailureClass::Resource,
];

fn status_index(s: JobStatus) -> i64 {
    match s {
        JobStatus::Succeeded => 0,
        JobStatus::Failed => 1,
        JobStatus::Cancelled => 2,
        JobStatus::Expired => 3,
    }
}
const STATUSES: [JobStatus; 4] = [JobStatus::Succeeded, JobStatus::Failed, JobStatus::Cancelled, JobStatus::Expired];

// ---------------------------------------------------------------------------------------
// Avro binary primitives
// ---------------------------------------------------------------------------------------

fn write_header(kind: RecordKind, out: &mut Vec<u8>) {
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&kind.wire().fingerprint.0);
}

/// Avro `int` and `long`: zig-zag, then base-128 varint, low group first.
#[inline]
fn write_long(out: &mut Vec<u8>, v: i64) {
    let mut z = ((v << 1) ^ (v >> 63)) as u64;
    while z >= 0x80 {
        out.push((z as u8) | 0x80);
        z >>= 7;
    }
    out.push(z as u8);
}

#[inline]
fn write_bytes(out: &mut Vec<u8>, b: &[u8]) {
    write_long(out, b.len() as i64);
    out.extend_from_slice(b);
}

#[inline]
fn write_str(out: &mut Vec<u8>, s: &str) {
    write_bytes(out, s.as_bytes());
}

/// `["null", T]` union: branch index 0 for null, 1 then the value otherwise.
#[inline]
fn write_opt<T>(out: &mut Vec<u8>, v: Option<T>, write: impl FnOnce(&mut Vec<u8>, T)) {
    match v {
        None => out.push(0),
        Some(v) => {
            out.push(2); // zig-zag of 1
            write(out, v);
        }
    }
}

/// Check the header and return a reader positioned on the body.
/// Reads a message of the `expected` kind with `read`: its header checked, its body
/// read directly if written with the current schema, or resolved first if written with
/// a released earlier version (see `History`).
fn decode_with<T>(
    bytes: &[u8],
    expected: RecordKind,
    read: impl FnOnce(&mut BodyReader<'_>) -> Result<T, CodecError>,
) -> Result<T, CodecError> {
    let resolved;
    let body = match writer_version(bytes, expected)? {
        None => &bytes[HEADER_LEN..],
        Some(old) => {
            resolved = resolve_body(expected, old, &bytes[HEADER_LEN..])?;
            &resolved[..]
        }
    };
    let mut r = BodyReader { buf: body, pos: 0, record: expected };
    let value = read(&mut r)?;
    r.finish()?;
    Ok(value)
}

/// Checks a message's header: `None` if written with the current schema of `expected`,
/// `Some(version)` if with a released earlier one.
fn writer_version(bytes: &[u8], expected: RecordKind) -> Result<Option<&'static History>, CodecError> {
    if bytes.len() >= 2 && bytes[..2] != MAGIC {
        return Err(CodecError::BadMagic { found0: bytes[0], found1: bytes[1], expected });
    }
    if bytes.len() < HEADER_LEN {
        return Err(CodecError::TooShort { len: bytes.len(), expected });
    }
    let found: [u8; 8] = bytes[2..HEADER_LEN].try_into().expect("8 bytes");
    let wire = expected.wire();
    if found == wire.fingerprint.0 {
        return Ok(None);
    }
    if let Some(old) = history(expected).iter().find(|h| h.wire.fingerprint.0 == found) {
        return Ok(Some(old));
    }
    if let Some(other) = RecordKind::ALL.into_iter().find(|k| k.wire().fingerprint.0 == found) {
        return Err(CodecError::WrongRecord { found: other, expected, decode_fn: other.decode_fn() });
    }
    Err(CodecError::UnknownFingerprint {
        found: Fingerprint(found),
        expected,
        expected_fp: wire.fingerprint,
        file: wire.file,
    })
}

struct BodyReader<'a> {
    buf: &'a [u8],
    pos: usize,
    record: RecordKind,
}

impl<'a> BodyReader<'a> {
    fn err(&self, field: &'static str, at: usize, problem: impl Into<String>) -> CodecError {
        CodecError::Body { record: self.record, field, offset: HEADER_LEN + at, problem: problem.into() }
    }

    fn long(&mut self, field: &'static str) -> Result<i64, CodecError> {
        let start = self.pos;
        let mut z: u64 = 0;
        for i in 0..10 {
            let Some(&b) = self.buf.get(self.pos) else {
                return Err(self.err(field, start, "message ends inside a varint"));
            };
            self.pos += 1;
            if i == 9 && b > 1 {
                return Err(self.err(field, start, "varint does not fit in 64 bits"));
            }
            z |= u64::from(b & 0x7f) << (7 * i);
            if b & 0x80 == 0 {
                return Ok((z >> 1) as i64 ^ -((z & 1) as i64));
            }
        }
        Err(self.err(field, start, "varint longer than 10 bytes"))
    }

    /// Avro `double`: 8 bytes, little-endian IEEE 754.
    fn double(&mut self, field: &'static str) -> Result<f64, CodecError> {
        let start = self.pos;
        let Some(b) = self.buf.get(self.pos..self.pos + 8) else {
            return Err(self.err(field, start, "message ends inside a double"));
        };
        self.pos += 8;
        Ok(f64::from_le_bytes(b.try_into().expect("8 bytes")))
    }

    fn int(&mut self, field: &'static str) -> Result<i32, CodecError> {
        let start = self.pos;
        let v = self.long(field)?;
        i32::try_from(v).map_err(|_| self.err(field, start, format!("{v} is out of Avro int range")))
    }

    fn len_prefixed(&mut self, field: &'static str) -> Result<&'a [u8], CodecError> {
        let start = self.pos;
        let len = self.long(field)?;
        let remaining = self.buf.len() - self.pos;
        if len < 0 {
            return Err(self.err(field, start, format!("negative length {len}")));
        }
        if len as u64 > remaining as u64 {
            return Err(self.err(
                field,
                start,
                format!("length {len} exceeds the {remaining} bytes left in the message"),
            ));
        }
        let s = &self.buf[self.pos..self.pos + len as usize];
        self.pos += len as usize;
        Ok(s)
    }

    fn bytes(&mut self, field: &'static str) -> Result<Vec<u8>, CodecError> {
        Ok(self.len_prefixed(field)?.to_vec())
    }

    fn string(&mut self, field: &'static str) -> Result<String, CodecError> {
        let start = self.pos;
        let raw = self.len_prefixed(field)?;
        match std::str::from_utf8(raw) {
            Ok(s) => Ok(s.to_owned()),
            Err(e) => Err(self.err(field, start, format!("string is not valid UTF-8: {e}"))),
        }
    }

    fn opt<T>(
        &mut self,
        field: &'static str,
        read: impl FnOnce(&mut Self, &'static str) -> Result<T, CodecError>,
    ) -> Result<Option<T>, CodecError> {
        let start = self.pos;
        match self.long(field)? {
            0 => Ok(None),
            1 => read(self, field).map(Some),
            n => Err(self.err(
                field,
                start,
                format!("union branch {n} does not exist (the schema has [\"null\", T]: 0 or 1)"),
            )),
        }
    }

    fn symbol<T: Copy>(&mut self, field: &'static str, symbols: &[T]) -> Result<T, CodecError> {
        let start = self.pos;
        let i = self.long(field)?;
        usize::try_from(i).ok().and_then(|i| symbols.get(i).copied()).ok_or_else(|| {
            self.err(field, start, format!("enum symbol index {i} is out of range 0..{}", symbols.len()))
        })
    }

    fn pool(&mut self, field: &'static str) -> Result<Pool, CodecError> {
        self.symbol(field, &POOLS)
    }
    fn priority(&mut self, field: &'static str) -> Result<Priority, CodecError> {
        self.symbol(field, &PRIORITIES)
    }
    fn failure_class(&mut self, field: &'static str) -> Result<FailureClass, CodecError> {
        self.symbol(field, &FAILURE_CLASSES)
    }
    fn status(&mut self, field: &'static str) -> Result<JobStatus, CodecError> {
        self.symbol(field, &STATUSES)
    }

    fn finish(self) -> Result<(), CodecError> {
        if self.pos == self.buf.len() {
            Ok(())
        } else {
            Err(CodecError::TrailingBytes { record: self.record, body: self.pos, extra: self.buf.len() - self.pos })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use apache_avro::{from_avro_datum, from_value, to_avro_datum, to_value};
    use proptest::prelude::*;
    use serde::{de::DeserializeOwned, Serialize};

    // -- sample values ------------------------------------------------------------------

    fn job_full() -> JobSubmitted {
        JobSubmitted {
            job_id: "01890a5d-ac96-774b-bcce-b302099a8057".into(),
            tenant: "acme".into(),
            job_type: "email.send".into(),
            pool: Some(Pool::Long),
            priority: Priority::Low,
            payload: (0..100u8).collect(),
            idempotency_key: Some("order-4711".into()),
            execute_at: Some(1_700_000_060_000),
            not_after: Some(1_700_003_600_000),
            attempt: 2,
            crash_count: 1,
            generation: 3,
            submitted_at: 1_700_000_000_000,
            not_before: Some(1_700_000_090_000),
            last_error: Some("upstream returned 503 — retry".into()),
            last_failure_class: Some(FailureClass::Dependency),
            first_failure_at: Some(1_700_000_070_000),
            replay_count: 4,
            replayed_from: Some("fairway.dlq".into()),
            traceparent: Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into()),
            tracestate: Some("vendor=opaque".into()),
            flow_key: Some("vectorizer".into()),
            user_key: Some("user-42".into()),
            handoff_count: 5,
        }
    }

    fn job_min() -> JobSubmitted {
        JobSubmitted::original(String::new(), String::new(), String::new(), Vec::new(), 0)
    }

    fn result_full() -> JobResult {
        JobResult {
            job_id: "01890a5d-ac96-774b-bcce-b302099a8057".into(),
            tenant: "acme".into(),
            job_type: "email.send".into(),
            pool: Pool::Medium,
            status: JobStatus::Failed,
            output: Some(vec![1, 2, 3]),
            error: Some("boom".into()),
            failure_class: Some(FailureClass::Timeout),
            attempts: 3,
            generation: i64::MAX,
            submitted_at: i64::MIN,
            started_at: Some(-1),
            finished_at: 1_700_000_031_000,
            worker_id: "worker-1".into(),
            peak_memory_bytes: Some(256 << 20),
            cpu_ms: Some(1_234),
        }
    }

    fn result_min() -> JobResult {
        JobResult {
            job_id: "j".into(),
            tenant: "t".into(),
            job_type: "x".into(),
            pool: Pool::Short,
            status: JobStatus::Succeeded,
            output: None,
            error: None,
            failure_class: None,
            attempts: 0,
            generation: 0,
            submitted_at: 0,
            started_at: None,
            finished_at: 0,
            worker_id: String::new(),
            peak_memory_bytes: None,
            cpu_ms: None,
        }
    }

    fn dl_full() -> DeadLetter {
        DeadLetter {
            job: Some(job_full()),
            raw: Some(vec![0xC3, 0x00, 0xFF]),
            failure_class: FailureClass::Poison,
            reason: "job type email.send is quarantined".into(),
            last_error: Some("panic in handler".into()),
            attempts: i32::MAX,
            first_failure_at: 1,
            last_failure_at: 2,
            origin_topic: "fairway.jobs.short".into(),
            origin_partition: i32::MIN,
            origin_offset: 9_876_543_210,
            replay_count: 1,
        }
    }

    fn dl_min() -> DeadLetter {
        DeadLetter {
            job: None,
            raw: None,
            failure_class: FailureClass::Permanent,
            reason: String::new(),
            last_error: None,
            attempts: 0,
            first_failure_at: 0,
            last_failure_at: 0,
            origin_topic: String::new(),
            origin_partition: 0,
            origin_offset: 0,
            replay_count: 0,
        }
    }

    // -- cross-check against apache-avro -------------------------------------------------

    /// Our message must be exactly apache-avro's single-object encoding of the same value,
    /// and apache-avro must read our body back to the same value.
    fn assert_matches_apache_avro<T>(kind: RecordKind, value: &T, ours: &[u8])
    where
        T: Serialize + DeserializeOwned + PartialEq + fmt::Debug,
    {
        let schema = schema(kind);
        let fp = schema.fingerprint::<Rabin>().bytes;
        assert_eq!(&ours[..2], &MAGIC);
        assert_eq!(&ours[2..HEADER_LEN], fp.as_slice());
        let avro_value = to_value(value).expect("apache-avro to_value");
        let theirs = to_avro_datum(schema, avro_value).expect("apache-avro to_avro_datum");
        assert_eq!(&ours[HEADER_LEN..], theirs.as_slice(), "{kind} body differs from apache-avro");
        let mut body = &ours[HEADER_LEN..];
        let decoded = from_avro_datum(schema, &mut body, None).expect("apache-avro decode");
        assert!(body.is_empty(), "apache-avro left {} bytes", body.len());
        let back: T = from_value(&decoded).expect("apache-avro from_value");
        assert_eq!(&back, value);
    }

    fn check_job(j: &JobSubmitted) {
        let bytes = encode_job(j).unwrap();
        assert_eq!(&decode_job(&bytes).unwrap(), j);
        assert_matches_apache_avro(RecordKind::JobSubmitted, j, &bytes);
        assert_eq!(sniff(&bytes), Some(RecordKind::JobSubmitted));
        let mut reused = vec![9, 9];
        encode_job_into(j, &mut reused).unwrap();
        assert_eq!(&reused[2..], bytes.as_slice());
    }

    fn check_result(r: &JobResult) {
        let bytes = encode_result(r).unwrap();
        assert_eq!(&decode_result(&bytes).unwrap(), r);
        assert_matches_apache_avro(RecordKind::JobResult, r, &bytes);
        assert_eq!(sniff(&bytes), Some(RecordKind::JobResult));
    }

    fn event_full() -> JobEvent {
        JobEvent {
            event_id: "01890a5d-ac96-774b-bcce-b302099a8059".into(),
            job_id: "01890a5d-ac96-774b-bcce-b302099a8057".into(),
            tenant: "acme".into(),
            job_type: "email.send".into(),
            kind: EventKind::Retrying,
            at: 1_700_000_000_000,
            attempt: 2,
            worker: Some("worker-1".into()),
            progress: Some(0.25),
            message: Some("upstream returned 503".into()),
            next_attempt_at: Some(1_700_000_005_000),
        }
    }

    fn check_event(e: &JobEvent) {
        let bytes = encode_event(e).unwrap();
        assert_eq!(&decode_event(&bytes).unwrap(), e);
        assert_matches_apache_avro(RecordKind::JobEvent, e, &bytes);
        assert_eq!(sniff(&bytes), Some(RecordKind::JobEvent));
    }

    #[test]
    fn round_trip_event_every_kind_all_some_and_all_none() {
        check_event(&event_full());
        for (i, k) in EventKind::ALL.into_iter().enumerate() {
            let e = JobEvent {
                kind: k,
                worker: None,
                progress: None,
                message: None,
                next_attempt_at: None,
                attempt: i as i32,
                ..event_full()
            };
            check_event(&e);
        }
        let e = JobEvent { progress: Some(f64::MAX), at: i64::MIN, ..event_full() };
        check_event(&e);
        let (f, p) = body_problem(decode_event(&encode_event(&event_full()).unwrap()[..40]).unwrap_err());
        assert!(!f.is_empty() && !p.is_empty());
        // Pinned like the others (see `fingerprints_are_pinned`).
        assert_eq!(fingerprint(RecordKind::JobEvent).to_string(), "94314e4fbb8ae975");
        let je = schema(RecordKind::JobEvent);
        let kinds: Vec<String> = EventKind::ALL.iter().map(|k| k.as_str().to_string()).collect();
        assert_eq!(enum_symbols(je, "io.fairway.EventKind"), Some(kinds));
        assert!(decode_job(&encode_event(&event_full()).unwrap()).unwrap_err().to_string().contains("decode_event"));
    }

    fn check_dl(d: &DeadLetter) {
        let bytes = encode_dead_letter(d).unwrap();
        assert_eq!(&decode_dead_letter(&bytes).unwrap(), d);
        assert_matches_apache_avro(RecordKind::DeadLetter, d, &bytes);
        assert_eq!(sniff(&bytes), Some(RecordKind::DeadLetter));
    }

    #[test]
    fn round_trip_job_all_some_and_all_none() {
        check_job(&job_full());
        check_job(&job_min());
    }

    #[test]
    fn round_trip_result_all_some_and_all_none() {
        check_result(&result_full());
        check_result(&result_min());
    }

    #[test]
    fn round_trip_dead_letter_all_some_and_all_none() {
        check_dl(&dl_full());
        check_dl(&dl_min());
        let mut with_min_job = dl_min();
        with_min_job.job = Some(job_min());
        check_dl(&with_min_job);
    }

    #[test]
    fn every_enum_symbol_round_trips() {
        for (i, &pool) in Pool::ALL.iter().enumerate() {
            let mut j = job_min();
            j.pool = Some(pool);
            j.priority = Priority::ALL[i];
            check_job(&j);
        }
        for &c in FailureClass::ALL.iter() {
            let mut j = job_min();
            j.last_failure_class = Some(c);
            check_job(&j);
            let mut d = dl_min();
            d.failure_class = c;
            check_dl(&d);
        }
        for s in STATUSES {
            let mut r = result_min();
            r.status = s;
            check_result(&r);
        }
    }

    // -- schemas ------------------------------------------------------------------------

    /// Symbols of the enum named `full_name`, found anywhere inside `schema`.
    fn enum_symbols(schema: &Schema, full_name: &str) -> Option<Vec<String>> {
        match schema {
            Schema::Enum(e) if e.name.fullname(None) == full_name => Some(e.symbols.clone()),
            Schema::Record(r) => r.fields.iter().find_map(|f| enum_symbols(&f.schema, full_name)),
            Schema::Union(u) => u.variants().iter().find_map(|v| enum_symbols(v, full_name)),
            _ => None,
        }
    }

    #[test]
    fn enum_symbol_order_matches_schemas_and_serde_names() {
        let js = schema(RecordKind::JobSubmitted);
        let jr = schema(RecordKind::JobResult);
        let names = |v: Vec<&str>| v.into_iter().map(String::from).collect::<Vec<_>>();
        let pools = names(POOLS.iter().map(|p| p.as_str()).collect());
        let prios = names(PRIORITIES.iter().map(|p| p.as_str()).collect());
        let fails = names(FAILURE_CLASSES.iter().map(|p| p.as_str()).collect());
        let stats = names(STATUSES.iter().map(|p| p.as_str()).collect());
        let dl = schema(RecordKind::DeadLetter);
        assert_eq!(enum_symbols(js, "io.fairway.Pool"), Some(pools.clone()));
        assert_eq!(enum_symbols(js, "io.fairway.Priority"), Some(prios.clone()));
        assert_eq!(enum_symbols(js, "io.fairway.FailureClass"), Some(fails.clone()));
        assert_eq!(enum_symbols(jr, "io.fairway.Pool"), Some(pools));
        assert_eq!(enum_symbols(jr, "io.fairway.FailureClass"), Some(fails.clone()));
        assert_eq!(enum_symbols(jr, "io.fairway.JobStatus"), Some(stats));
        assert_eq!(enum_symbols(dl, "io.fairway.Priority"), Some(prios));
        assert_eq!(enum_symbols(dl, "io.fairway.FailureClass"), Some(fails));
        for (i, p) in POOLS.iter().enumerate() {
            assert_eq!(pool_index(*p), i as i64);
        }
        for (i, p) in PRIORITIES.iter().enumerate() {
            assert_eq!(priority_index(*p), i as i64);
        }
        for (i, c) in FAILURE_CLASSES.iter().enumerate() {
            assert_eq!(failure_index(*c), i as i64);
        }
        for (i, s) in STATUSES.iter().enumerate() {
            assert_eq!(status_index(*s), i as i64);
        }
        // The model's serde names are the Avro symbols (apache-avro's serde path relies on it).
        for p in POOLS {
            assert_eq!(to_value(p).unwrap(), apache_avro::types::Value::String(p.as_str().into()));
        }
    }

    #[test]
    fn dead_letter_embeds_the_same_job_schema() {
        let js = schema(RecordKind::JobSubmitted).canonical_form();
        let dl = schema(RecordKind::DeadLetter).canonical_form();
        assert!(dl.contains(&js), "dead_letter.avsc's nested JobSubmitted drifted from job_submitted.avsc");
    }

    /// Changing a fingerprint breaks every consumer still running the old schema: if this
    /// fails, the .avsc structure changed (docs and defaults do not count). Do it only with
    /// a compatibility plan, then update the pins.
    #[test]
    fn fingerprints_are_pinned() {
        assert_eq!(fingerprint(RecordKind::JobSubmitted).to_string(), "544d9ba32e64f602");
        assert_eq!(fingerprint(RecordKind::JobResult).to_string(), "e1176a52166366db");
        assert_eq!(fingerprint(RecordKind::DeadLetter).to_string(), "af34f1dc41a5e637");
    }

    #[test]
    fn header_equals_apache_avro_single_object_writer() {
        let j = job_full();
        let mut w =
            apache_avro::GenericSingleObjectWriter::new_with_capacity(schema(RecordKind::JobSubmitted), 1024).unwrap();
        let mut theirs = Vec::new();
        w.write_value(to_value(&j).unwrap(), &mut theirs).unwrap();
        assert_eq!(encode_job(&j).unwrap(), theirs);
    }

    // -- errors -------------------------------------------------------------------------

    #[test]
    fn too_short_and_empty() {
        for len in 0..HEADER_LEN {
            let mut b = encode_job(&job_min()).unwrap();
            b.truncate(len);
            let e = decode_job(&b).unwrap_err();
            assert!(matches!(e, CodecError::TooShort { len: l, .. } if l == len), "{e}");
            assert!(e.to_string().starts_with("not Avro single-object encoding"), "{e}");
        }
    }

    #[test]
    fn wrong_magic() {
        let mut b = encode_job(&job_full()).unwrap();
        b[0] = b'{';
        let e = decode_job(&b).unwrap_err();
        assert!(matches!(e, CodecError::BadMagic { found0: b'{', found1: 0x01, .. }));
        let msg = e.to_string();
        assert!(msg.contains("expected magic C3 01"), "{msg}");
        assert!(msg.contains("found 7B 01"), "{msg}");
        // Even a 2-byte message gets the more useful "bad magic" answer.
        assert!(matches!(decode_job(b"{}"), Err(CodecError::BadMagic { .. })));
    }

    #[test]
    fn unknown_fingerprint() {
        let mut b = encode_job(&job_full()).unwrap();
        b[2..10].copy_from_slice(&[0xde, 0xad, 0xbe, 0xef, 0, 1, 2, 3]);
        let e = decode_job(&b).unwrap_err();
        assert!(matches!(e, CodecError::UnknownFingerprint { .. }), "{e}");
        let msg = e.to_string();
        assert!(msg.contains("deadbeef00010203"), "{msg}");
        assert!(msg.contains("io.fairway.JobSubmitted"), "{msg}");
        assert!(msg.contains("544d9ba32e64f602"), "{msg}");
        assert!(msg.contains("job_submitted.avsc"), "{msg}");
        assert_eq!(sniff(&b), None);
    }

    #[test]
    fn wrong_record_type_is_named() {
        let b = encode_result(&result_full()).unwrap();
        let e = decode_job(&b).unwrap_err();
        assert_eq!(
            e,
            CodecError::WrongRecord {
                found: RecordKind::JobResult,
                expected: RecordKind::JobSubmitted,
                decode_fn: "decode_result",
            }
        );
        assert!(e.to_string().contains("codec::decode_result"), "{e}");
        assert!(matches!(
            decode_dead_letter(&encode_job(&job_min()).unwrap()),
            Err(CodecError::WrongRecord { found: RecordKind::JobSubmitted, .. })
        ));
    }

    #[test]
    fn every_truncation_of_the_body_is_an_error() {
        for bytes in [
            encode_job(&job_full()).unwrap(),
            encode_job(&job_min()).unwrap(),
            encode_result(&result_full()).unwrap(),
            encode_dead_letter(&dl_full()).unwrap(),
            encode_event(&event_full()).unwrap(),
        ] {
            for len in HEADER_LEN..bytes.len() {
                let cut = &bytes[..len];
                let e = match sniff(&bytes).unwrap() {
                    RecordKind::JobSubmitted => decode_job(cut).map(drop),
                    RecordKind::JobResult => decode_result(cut).map(drop),
                    RecordKind::DeadLetter => decode_dead_letter(cut).map(drop),
                    RecordKind::JobEvent => decode_event(cut).map(drop),
                }
                .unwrap_err();
                assert!(matches!(e, CodecError::Body { .. }), "len {len}: {e}");
            }
        }
        let e = decode_job(&encode_job(&job_full()).unwrap()[..20]).unwrap_err();
        let msg = e.to_string();
        assert!(msg.starts_with("corrupt io.fairway.JobSubmitted body: field `job_id`"), "{msg}");
        assert!(msg.contains("at message byte 10"), "{msg}");
        assert!(msg.contains("length 36 exceeds the 9 bytes left"), "{msg}");
    }

    #[test]
    fn trailing_bytes() {
        let mut b = encode_job(&job_min()).unwrap();
        let body = b.len() - HEADER_LEN;
        b.extend_from_slice(&[0, 0]);
        let e = decode_job(&b).unwrap_err();
        assert_eq!(e, CodecError::TrailingBytes { record: RecordKind::JobSubmitted, body, extra: 2 });
        assert!(e.to_string().starts_with("2 trailing bytes"), "{e}");
    }

    /// Header for `kind` followed by a hand-made body.
    fn msg(kind: RecordKind, body: &[u8]) -> Vec<u8> {
        let mut b = Vec::new();
        write_header(kind, &mut b);
        b.extend_from_slice(body);
        b
    }

    fn body_problem(e: CodecError) -> (&'static str, String) {
        match e {
            CodecError::Body { field, problem, .. } => (field, problem),
            other => panic!("expected a body error, got {other}"),
        }
    }

    #[test]
    fn corrupt_bodies_are_described() {
        let js = RecordKind::JobSubmitted;
        // job_id = "\xff" (invalid UTF-8)
        let (f, p) = body_problem(decode_job(&msg(js, &[2, 0xff])).unwrap_err());
        assert_eq!(f, "job_id");
        assert!(p.contains("not valid UTF-8"), "{p}");
        // negative length
        let (f, p) = body_problem(decode_job(&msg(js, &[1])).unwrap_err());
        assert_eq!((f, p.as_str()), ("job_id", "negative length -1"));
        // huge length claim: rejected without allocating
        let (f, p) =
            body_problem(decode_job(&msg(js, &[0xfe, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f])).unwrap_err());
        assert_eq!(f, "job_id");
        assert!(p.contains("exceeds the 0 bytes left"), "{p}");
        // varint overflow
        let (_, p) = body_problem(decode_job(&msg(js, &[0xff; 11])).unwrap_err());
        assert!(p.contains("64 bits"), "{p}");
        // three empty strings, then union branch 2 for `pool`
        let (f, p) = body_problem(decode_job(&msg(js, &[0, 0, 0, 4])).unwrap_err());
        assert_eq!(f, "pool");
        assert!(p.contains("union branch 2"), "{p}");
        // pool = null, priority symbol 3
        let (f, p) = body_problem(decode_job(&msg(js, &[0, 0, 0, 0, 6])).unwrap_err());
        assert_eq!(f, "priority");
        assert!(p.contains("enum symbol index 3 is out of range 0..3"), "{p}");
        // attempt = 2^31 (out of int range): fields up to attempt with minimal values
        let mut body = vec![0, 0, 0, 0, 2, 0, 0, 0, 0];
        write_long(&mut body, 1 << 31);
        let (f, p) = body_problem(decode_job(&msg(js, &body)).unwrap_err());
        assert_eq!(f, "attempt");
        assert!(p.contains("out of Avro int range"), "{p}");
        // apache-avro rejects the same bodies
        for bad in [&[2u8, 0xff][..], &[1], &[0, 0, 0, 4], &[0, 0, 0, 0, 6]] {
            let r = from_avro_datum(schema(js), &mut &bad[..], None).and_then(|v| from_value::<JobSubmitted>(&v));
            assert!(r.is_err(), "apache-avro accepted {bad:?}");
        }
    }

    #[test]
    fn non_minimal_varints_are_accepted_like_other_implementations() {
        // 0 encoded in two bytes (0x80 0x00) for job_id's length.
        let canonical = encode_job(&job_min()).unwrap();
        let mut b = canonical[..HEADER_LEN].to_vec();
        b.extend_from_slice(&[0x80, 0x00]);
        b.extend_from_slice(&canonical[HEADER_LEN + 1..]);
        assert_eq!(decode_job(&b).unwrap(), job_min());
    }

    #[test]
    fn extreme_integers_round_trip() {
        for v in [i64::MIN, i64::MIN + 1, -1, 0, 1, 63, 64, -64, -65, i64::MAX] {
            let mut j = job_min();
            j.submitted_at = v;
            j.generation = v;
            j.execute_at = Some(v);
            check_job(&j);
        }
        for v in [i32::MIN, -1, 0, 1, i32::MAX] {
            let mut j = job_min();
            j.attempt = v;
            j.crash_count = v;
            j.replay_count = v;
            j.handoff_count = v;
            check_job(&j);
        }
    }

    // -- fastavro fixtures (scripts/gen_avro_fixture.py) --------------------------------

    #[test]
    fn fastavro_fixture_job_submitted() {
        let bytes = include_bytes!("../../tests/fixtures/job_submitted_fastavro.bin");
        let j = decode_job(bytes).unwrap();
        assert_eq!(
            j,
            JobSubmitted {
                job_id: "01890a5d-ac96-774b-bcce-b302099a8057".into(),
                tenant: "acme-ümlaut".into(),
                job_type: "email.send".into(),
                pool: Some(Pool::Medium),
                priority: Priority::Urgent,
                payload: (0..100u8).collect(),
                idempotency_key: Some("order-4711".into()),
                execute_at: Some(1_700_000_060_000),
                not_after: Some(1_700_003_600_000),
                attempt: 2,
                crash_count: 1,
                generation: 3,
                submitted_at: 1_700_000_000_000,
                not_before: Some(1_700_000_090_000),
                last_error: Some("upstream returned 503".into()),
                last_failure_class: Some(FailureClass::WorkerCrash),
                first_failure_at: Some(1_700_000_070_000),
                replay_count: 4,
                replayed_from: Some("fairway.dlq".into()),
                traceparent: Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into()),
                tracestate: Some("vendor=opaque".into()),
                flow_key: Some("vectorizer".into()),
                user_key: Some("user-42".into()),
                handoff_count: 2,
            }
        );
        // And we write exactly what fastavro wrote.
        assert_eq!(encode_job(&j).unwrap(), bytes);
    }

    fn fastavro_minimal_job() -> JobSubmitted {
        JobSubmitted {
            job_id: "01890a5d-ac96-774b-bcce-b302099a8058".into(),
            tenant: "t".into(),
            job_type: "noop".into(),
            payload: Vec::new(),
            submitted_at: -1,
            ..job_min()
        }
    }

    #[test]
    fn fastavro_fixture_job_submitted_with_schema_defaults() {
        let bytes = include_bytes!("../../tests/fixtures/job_submitted_minimal_fastavro.bin");
        let j = decode_job(bytes).unwrap();
        assert_eq!(j, fastavro_minimal_job());
        assert_eq!(encode_job(&j).unwrap(), bytes);
    }

    #[test]
    fn fastavro_fixture_dead_letters() {
        let bytes = include_bytes!("../../tests/fixtures/dead_letter_fastavro.bin");
        let d = decode_dead_letter(bytes).unwrap();
        assert_eq!(
            d,
            DeadLetter {
                job: Some(fastavro_minimal_job()),
                raw: None,
                failure_class: FailureClass::Poison,
                reason: "job type noop is quarantined: fix the handler, then replay".into(),
                last_error: None,
                attempts: 5,
                first_failure_at: 1_700_000_000_000,
                last_failure_at: 1_700_000_500_000,
                origin_topic: "fairway.jobs.short".into(),
                origin_partition: 7,
                origin_offset: 9_876_543_210,
                replay_count: 0,
            }
        );
        assert_eq!(encode_dead_letter(&d).unwrap(), bytes);

        let bytes = include_bytes!("../../tests/fixtures/dead_letter_raw_fastavro.bin");
        let d = decode_dead_letter(bytes).unwrap();
        assert_eq!(
            d,
            DeadLetter {
                job: None,
                raw: Some(b"\x00\xffnot avro".to_vec()),
                failure_class: FailureClass::Permanent,
                reason: "undecodable".into(),
                last_error: Some("bad magic".into()),
                attempts: 0,
                first_failure_at: 1,
                last_failure_at: 2,
                origin_topic: "fairway.jobs.long".into(),
                origin_partition: 0,
                origin_offset: 0,
                replay_count: 1,
            }
        );
        assert_eq!(encode_dead_letter(&d).unwrap(), bytes);
    }

    // -- messages written with the released v1/v2 schemas (tests/fixtures/v1, v2) -------

    /// The v1 and v2 fingerprints must never change: messages with them sit on topics and in
    /// the store during and after an upgrade.
    #[test]
    fn history_fingerprints_are_pinned() {
        assert_eq!(history(RecordKind::JobSubmitted)[0].wire.fingerprint.to_string(), "44199d21e49bfe3e");
        assert_eq!(history(RecordKind::DeadLetter)[0].wire.fingerprint.to_string(), "90433191f998dfc5");
        assert_eq!(history(RecordKind::JobSubmitted)[1].wire.fingerprint.to_string(), "c23b839bafae9a45");
        assert_eq!(history(RecordKind::DeadLetter)[1].wire.fingerprint.to_string(), "eb1549c1dc0fc4a1");
        assert_eq!(history(RecordKind::JobEvent)[0].wire.fingerprint.to_string(), "9bbf7ca9dda07f29");
        // Before `replayed` and the dependency breaker's kinds were appended.
        assert_eq!(history(RecordKind::JobEvent)[1].wire.fingerprint.to_string(), "0e714a90587bf4f2");
        // Before `resource` was appended to the failure classes.
        assert_eq!(history(RecordKind::JobSubmitted)[2].wire.fingerprint.to_string(), "d636019c375f46a9");
        assert_eq!(history(RecordKind::DeadLetter)[2].wire.fingerprint.to_string(), "c4e69504e8b6f0a5");
        assert_eq!(history(RecordKind::JobResult)[0].wire.fingerprint.to_string(), "595d9eec35d310e9");
        // Before `user_key` and `handoff_count` were added.
        assert_eq!(history(RecordKind::JobSubmitted)[3].wire.fingerprint.to_string(), "33c444b9fcb33076");
        assert_eq!(history(RecordKind::DeadLetter)[3].wire.fingerprint.to_string(), "9e3461f5f3412786");
        // Before `peak_memory_bytes` and `cpu_ms` were added.
        assert_eq!(history(RecordKind::JobResult)[1].wire.fingerprint.to_string(), "d89b4525d941bddb");
    }

    /// Events written before `pool_reclassified` was appended to the kinds (v1) are read
    /// by schema resolution: their body is the same, only the header's fingerprint differs.
    #[test]
    fn v1_events_are_read_by_schema_resolution() {
        let e = event_full();
        let mut v1 = encode_event(&e).unwrap();
        v1[2..HEADER_LEN].copy_from_slice(&history(RecordKind::JobEvent)[0].wire.fingerprint.0);
        assert_eq!(decode_event(&v1).unwrap(), e);
        // And v2 (before `replayed` and `dependency_circuit_*`), with its last kind.
        let e = JobEvent { kind: EventKind::PoolReclassified, ..event_full() };
        let mut v2 = encode_event(&e).unwrap();
        v2[2..HEADER_LEN].copy_from_slice(&history(RecordKind::JobEvent)[1].wire.fingerprint.0);
        assert_eq!(decode_event(&v2).unwrap(), e);
    }

    #[test]
    fn v1_jobs_are_read_by_schema_resolution() {
        let v1 = include_bytes!("../../tests/fixtures/v1/job_submitted_fastavro.bin");
        assert_eq!(Fingerprint(v1[2..HEADER_LEN].try_into().unwrap()).to_string(), "44199d21e49bfe3e");
        let mut want = decode_job(include_bytes!("../../tests/fixtures/job_submitted_fastavro.bin")).unwrap();
        want.traceparent = None;
        want.tracestate = None;
        want.flow_key = None;
        want.user_key = None;
        want.handoff_count = 0;
        assert_eq!(decode_job(v1).unwrap(), want);
        let v1 = include_bytes!("../../tests/fixtures/v1/job_submitted_minimal_fastavro.bin");
        assert_eq!(decode_job(v1).unwrap(), fastavro_minimal_job());
    }

    #[test]
    fn v2_jobs_are_read_by_schema_resolution() {
        let v2 = include_bytes!("../../tests/fixtures/v2/job_submitted_fastavro.bin");
        assert_eq!(Fingerprint(v2[2..HEADER_LEN].try_into().unwrap()).to_string(), "c23b839bafae9a45");
        let mut want = decode_job(include_bytes!("../../tests/fixtures/job_submitted_fastavro.bin")).unwrap();
        want.flow_key = None;
        want.user_key = None;
        want.handoff_count = 0;
        assert_eq!(decode_job(v2).unwrap(), want);
        let v2 = include_bytes!("../../tests/fixtures/v2/job_submitted_minimal_fastavro.bin");
        assert_eq!(decode_job(v2).unwrap(), fastavro_minimal_job());
    }

    #[test]
    fn older_dead_letters_are_read_by_schema_resolution() {
        let current = [
            &include_bytes!("../../tests/fixtures/dead_letter_fastavro.bin")[..],
            &include_bytes!("../../tests/fixtures/dead_letter_raw_fastavro.bin")[..],
        ];
        let older = [
            &include_bytes!("../../tests/fixtures/v1/dead_letter_fastavro.bin")[..],
            &include_bytes!("../../tests/fixtures/v1/dead_letter_raw_fastavro.bin")[..],
            &include_bytes!("../../tests/fixtures/v2/dead_letter_fastavro.bin")[..],
            &include_bytes!("../../tests/fixtures/v2/dead_letter_raw_fastavro.bin")[..],
        ];
        for (i, old) in older.iter().enumerate() {
            assert_eq!(decode_dead_letter(old).unwrap(), decode_dead_letter(current[i % 2]).unwrap(), "fixture {i}");
        }
    }

    /// Written before `resource` was appended to the failure classes (job v3, dead letter
    /// v3, result v1): read by schema resolution, field for field what they were.
    #[test]
    fn messages_from_before_the_resource_class_are_read_by_schema_resolution() {
        let pairs: [(&[u8], &[u8]); 5] = [
            (
                include_bytes!("../../tests/fixtures/v3/job_submitted_fastavro.bin"),
                include_bytes!("../../tests/fixtures/job_submitted_fastavro.bin"),
            ),
            (
                include_bytes!("../../tests/fixtures/v3/job_submitted_minimal_fastavro.bin"),
                include_bytes!("../../tests/fixtures/job_submitted_minimal_fastavro.bin"),
            ),
            (
                include_bytes!("../../tests/fixtures/v3/dead_letter_fastavro.bin"),
                include_bytes!("../../tests/fixtures/dead_letter_fastavro.bin"),
            ),
            (
                include_bytes!("../../tests/fixtures/v3/dead_letter_raw_fastavro.bin"),
                include_bytes!("../../tests/fixtures/dead_letter_raw_fastavro.bin"),
            ),
            (
                include_bytes!("../../tests/fixtures/v3/job_result_fastavro.bin"),
                include_bytes!("../../tests/fixtures/job_result_fastavro.bin"),
            ),
        ];
        for (i, (old, new)) in pairs.iter().enumerate() {
            assert_ne!(old[2..HEADER_LEN], new[2..HEADER_LEN], "fixture {i} changed schema");
            match i {
                0 | 1 => assert_eq!(decode_job(old).unwrap(), before_v5(decode_job(new).unwrap()), "fixture {i}"),
                2 | 3 => assert_eq!(decode_dead_letter(old).unwrap(), decode_dead_letter(new).unwrap(), "fixture {i}"),
                _ => {
                    let new = JobResult { peak_memory_bytes: None, cpu_ms: None, ..decode_result(new).unwrap() };
                    assert_eq!(decode_result(old).unwrap(), new, "fixture {i}")
                }
            }
        }
        let mut j = job_full();
        j.last_failure_class = Some(FailureClass::Resource);
        check_job(&j);
    }

    /// A current job as a message from before v5 reads: no `user_key`, no hand-off count.
    fn before_v5(mut j: JobSubmitted) -> JobSubmitted {
        j.user_key = None;
        j.handoff_count = 0;
        j
    }

    /// Written before `user_key` and `handoff_count` were added (job v4, dead letter v4):
    /// read by schema resolution, the new fields at their defaults.
    #[test]
    fn messages_from_before_user_key_and_handoff_count_are_read_by_schema_resolution() {
        let pairs: [(&[u8], &[u8]); 4] = [
            (
                include_bytes!("../../tests/fixtures/v4/job_submitted_fastavro.bin"),
                include_bytes!("../../tests/fixtures/job_submitted_fastavro.bin"),
            ),
            (
                include_bytes!("../../tests/fixtures/v4/job_submitted_minimal_fastavro.bin"),
                include_bytes!("../../tests/fixtures/job_submitted_minimal_fastavro.bin"),
            ),
            (
                include_bytes!("../../tests/fixtures/v4/dead_letter_fastavro.bin"),
                include_bytes!("../../tests/fixtures/dead_letter_fastavro.bin"),
            ),
            (
                include_bytes!("../../tests/fixtures/v4/dead_letter_raw_fastavro.bin"),
                include_bytes!("../../tests/fixtures/dead_letter_raw_fastavro.bin"),
            ),
        ];
        for (i, (old, new)) in pairs.iter().enumerate() {
            assert_eq!(old[2..HEADER_LEN], history(sniff_or_old(old))[3].wire.fingerprint.0, "fixture {i} is v4");
            match i {
                0 | 1 => assert_eq!(decode_job(old).unwrap(), before_v5(decode_job(new).unwrap()), "fixture {i}"),
                _ => assert_eq!(decode_dead_letter(old).unwrap(), decode_dead_letter(new).unwrap(), "fixture {i}"),
            }
        }
        let full = decode_job(include_bytes!("../../tests/fixtures/job_submitted_fastavro.bin")).unwrap();
        assert_eq!((full.user_key.as_deref(), full.handoff_count), (Some("user-42"), 2));
    }

    /// The record kind of a v4 fixture (job or dead letter), by its v4 fingerprint.
    fn sniff_or_old(bytes: &[u8]) -> RecordKind {
        let fp = &bytes[2..HEADER_LEN];
        if history(RecordKind::JobSubmitted).iter().any(|h| h.wire.fingerprint.0 == fp) {
            RecordKind::JobSubmitted
        } else {
            RecordKind::DeadLetter
        }
    }

    #[test]
    fn a_damaged_v1_message_says_which_version_it_was() {
        let v1 = include_bytes!("../../tests/fixtures/v1/job_submitted_fastavro.bin");
        let err = decode_job(&v1[..v1.len() - 30]).unwrap_err().to_string();
        assert!(err.contains("schema version 1"), "{err}");
        let mut longer = v1.to_vec();
        longer.push(0);
        assert!(matches!(decode_job(&longer), Err(CodecError::TrailingBytes { .. })));
    }

    #[test]
    fn fastavro_fixture_job_result() {
        let bytes = include_bytes!("../../tests/fixtures/job_result_fastavro.bin");
        let r = decode_result(bytes).unwrap();
        assert_eq!(
            r,
            JobResult {
                job_id: "01890a5d-ac96-774b-bcce-b302099a8057".into(),
                tenant: "acme-ümlaut".into(),
                job_type: "email.send".into(),
                pool: Pool::Long,
                status: JobStatus::Failed,
                output: None,
                error: Some("deadline of 30s passed".into()),
                failure_class: Some(FailureClass::Timeout),
                attempts: 3,
                generation: 0,
                submitted_at: 1_700_000_000_000,
                started_at: Some(1_700_000_001_000),
                finished_at: 1_700_000_031_000,
                worker_id: "worker-2".into(),
                peak_memory_bytes: Some(256 << 20),
                cpu_ms: Some(1_234),
            }
        );
        assert_eq!(encode_result(&r).unwrap(), bytes);
    }

    /// A result written before `peak_memory_bytes` and `cpu_ms` were added (result v2) is
    /// read by schema resolution, both at null.
    #[test]
    fn results_from_before_the_process_usage_fields_are_read_by_schema_resolution() {
        let old = include_bytes!("../../tests/fixtures/v5/job_result_fastavro.bin");
        assert_eq!(old[2..HEADER_LEN], history(RecordKind::JobResult)[1].wire.fingerprint.0, "the fixture is v2");
        let new = decode_result(include_bytes!("../../tests/fixtures/job_result_fastavro.bin")).unwrap();
        assert_eq!(decode_result(old).unwrap(), JobResult { peak_memory_bytes: None, cpu_ms: None, ..new });
    }

    // -- property tests -----------------------------------------------------------------

    fn text() -> impl Strategy<Value = String> {
        "\\PC{0,24}"
    }

    fn arb_job() -> impl Strategy<Value = JobSubmitted> {
        let ids = (text(), text(), text());
        let head = (
            proptest::option::of(prop::sample::select(POOLS.to_vec())),
            prop::sample::select(PRIORITIES.to_vec()),
            prop::collection::vec(any::<u8>(), 0..200),
            proptest::option::of(text()),
            proptest::option::of(any::<i64>()),
            proptest::option::of(any::<i64>()),
        );
        let mid = (any::<i32>(), any::<i32>(), any::<i64>(), any::<i64>(), proptest::option::of(any::<i64>()));
        let tail = (
            proptest::option::of(text()),
            proptest::option::of(prop::sample::select(FAILURE_CLASSES.to_vec())),
            proptest::option::of(any::<i64>()),
            any::<i32>(),
            proptest::option::of(text()),
        );
        let trace = (proptest::option::of(text()), proptest::option::of(text()), proptest::option::of(text()));
        let v5 = (proptest::option::of(text()), any::<i32>());
        (ids, head, mid, tail, trace, v5).prop_map(
            |(
                (job_id, tenant, job_type),
                (pool, priority, payload, idempotency_key, execute_at, not_after),
                (attempt, crash_count, generation, submitted_at, not_before),
                (last_error, last_failure_class, first_failure_at, replay_count, replayed_from),
                (traceparent, tracestate, flow_key),
                (user_key, handoff_count),
            )| JobSubmitted {
                job_id,
                tenant,
                job_type,
                pool,
                priority,
                payload,
                idempotency_key,
                execute_at,
                not_after,
                attempt,
                crash_count,
                generation,
                submitted_at,
                not_before,
                last_error,
                last_failure_class,
                first_failure_at,
                replay_count,
                replayed_from,
                traceparent,
                tracestate,
                flow_key,
                user_key,
                handoff_count,
            },
        )
    }

    fn arb_result() -> impl Strategy<Value = JobResult> {
        let a = (
            text(),
            text(),
            text(),
            prop::sample::select(POOLS.to_vec()),
            prop::sample::select(STATUSES.to_vec()),
            proptest::option::of(prop::collection::vec(any::<u8>(), 0..64)),
            proptest::option::of(text()),
        );
        let b = (
            proptest::option::of(prop::sample::select(FAILURE_CLASSES.to_vec())),
            any::<i32>(),
            any::<i64>(),
            any::<i64>(),
            proptest::option::of(any::<i64>()),
            any::<i64>(),
            text(),
        );
        let c = (proptest::option::of(any::<i64>()), proptest::option::of(any::<i64>()));
        (a, b, c).prop_map(
            |(
                (job_id, tenant, job_type, pool, status, output, error),
                (failure_class, attempts, generation, submitted_at, started_at, finished_at, worker_id),
                (peak_memory_bytes, cpu_ms),
            )| JobResult {
                job_id,
                tenant,
                job_type,
                pool,
                status,
                output,
                error,
                failure_class,
                attempts,
                generation,
                submitted_at,
                started_at,
                finished_at,
                worker_id,
                peak_memory_bytes,
                cpu_ms,
            },
        )
    }

    fn arb_dl() -> impl Strategy<Value = DeadLetter> {
        let a = (
            proptest::option::of(arb_job()),
            proptest::option::of(prop::collection::vec(any::<u8>(), 0..64)),
            prop::sample::select(FAILURE_CLASSES.to_vec()),
            text(),
            proptest::option::of(text()),
            any::<i32>(),
        );
        let b = (any::<i64>(), any::<i64>(), text(), any::<i32>(), any::<i64>(), any::<i32>());
        (a, b).prop_map(
            |(
                (job, raw, failure_class, reason, last_error, attempts),
                (first_failure_at, last_failure_at, origin_topic, origin_partition, origin_offset, replay_count),
            )| DeadLetter {
                job,
                raw,
                failure_class,
                reason,
                last_error,
                attempts,
                first_failure_at,
                last_failure_at,
                origin_topic,
                origin_partition,
                origin_offset,
                replay_count,
            },
        )
    }

    fn decode_any(bytes: &[u8]) {
        let _ = decode_job(bytes);
        let _ = decode_result(bytes);
        let _ = decode_dead_letter(bytes);
        let _ = decode_event(bytes);
        let _ = sniff(bytes);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn prop_job_matches_apache_avro(j in arb_job()) {
            check_job(&j);
        }

        #[test]
        fn prop_result_matches_apache_avro(r in arb_result()) {
            check_result(&r);
        }

        #[test]
        fn prop_dead_letter_matches_apache_avro(d in arb_dl()) {
            check_dl(&d);
        }

        #[test]
        fn prop_garbage_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..300)) {
            decode_any(&bytes);
        }

        #[test]
        fn prop_garbage_body_after_valid_header_never_panics(
            body in prop::collection::vec(any::<u8>(), 0..300),
        ) {
            for kind in RecordKind::ALL {
                let bytes = msg(kind, &body);
                decode_any(&bytes);
            }
        }

        #[test]
        fn prop_mutated_messages_never_panic(
            d in arb_dl(),
            flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
            cut in any::<prop::sample::Index>(),
        ) {
            let mut bytes = encode_dead_letter(&d).unwrap();
            for (i, v) in flips {
                let i = HEADER_LEN + i.index(bytes.len() - HEADER_LEN);
                bytes[i] = v;
            }
            decode_any(&bytes);
            let cut = cut.index(bytes.len() + 1);
            decode_any(&bytes[..cut]);
        }
    }
}
