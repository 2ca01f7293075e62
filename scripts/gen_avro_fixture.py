#!/usr/bin/env python3
"""Cross-implementation fixtures for fairway's wire codec (src/codec).

Writes Avro single-object encoded messages with Python's fastavro, independently of
the Rust code, so the Rust tests can prove they read what another Avro implementation
writes:

    C3 01 | CRC-64-AVRO fingerprint of the schema's parsing canonical form (8 bytes,
          |   little-endian) | Avro binary body (fastavro schemaless_writer)

The fingerprint is computed here from the CRC-64-AVRO definition and checked against
fastavro's own helper.

Setup (keep fastavro out of the project; any throwaway venv will do):

    python3 -m venv /tmp/avro-venv && /tmp/avro-venv/bin/pip install fastavro

Regenerate the committed fixtures (run from the repository root):

    /tmp/avro-venv/bin/python scripts/gen_avro_fixture.py

Check a message written by the Rust codec (prints it as JSON, fails loudly if fastavro
cannot read it):

    /tmp/avro-venv/bin/python scripts/gen_avro_fixture.py --verify job_submitted msg.bin

tests/fixtures/v1/ holds the messages this script wrote with the v1 schemas (before the
trace-context fields of v2), tests/fixtures/v2/ those of v2 (before v3's flow_key),
tests/fixtures/v3/ those of v3 (before the `resource` failure class of v4) and
tests/fixtures/v4/ those of v4 (before v5's user_key and handoff_count),
tests/fixtures/v5/ the result of v5 (before the result's peak_memory_bytes and cpu_ms): they
are the "schema from last month" the decoder must still read (by schema resolution, see
`History` in src/codec). Never regenerate them; when a schema changes again, keep the
current fixtures as tests/fixtures/v<N>/ the same way.

The field values below are asserted by `fastavro_fixture_*` tests in src/codec/mod.rs:
change both together.
"""

import argparse
import io
import json
import struct
import sys
from pathlib import Path

try:
    import fastavro
    from fastavro.schema import fingerprint, load_schema, to_parsing_canonical_form
except ImportError:  # pragma: no cover
    sys.exit(
        "fastavro is not installed: python3 -m venv /tmp/avro-venv && "
        "/tmp/avro-venv/bin/pip install fastavro, then run this script with /tmp/avro-venv/bin/python"
    )

ROOT = Path(__file__).resolve().parent.parent
SCHEMAS = ROOT / "schemas"
MAGIC = b"\xc3\x01"

# CRC-64-AVRO (Rabin), as defined in the Avro specification.
EMPTY = 0xC15D213AA4D7A795


def _table():
    table = []
    for i in range(256):
        fp = i
        for _ in range(8):
            fp = (fp >> 1) ^ (EMPTY & -(fp & 1))
        table.append(fp)
    return table


_TABLE = _table()


def crc64_avro(data: bytes) -> int:
    fp = EMPTY
    for b in data:
        fp = (fp >> 8) ^ _TABLE[(fp ^ b) & 0xFF]
    return fp


def header(schema) -> bytes:
    pcf = to_parsing_canonical_form(schema)
    fp = struct.pack("<Q", crc64_avro(pcf.encode("utf-8")))
    # fastavro's helper prints the same 8 bytes as hex, in wire order.
    assert fp.hex() == fingerprint(pcf, "CRC-64-AVRO"), "CRC-64-AVRO mismatch with fastavro"
    return MAGIC + fp


def load(kind: str):
    return load_schema(str(SCHEMAS / f"{kind}.avsc"))


def encode(kind: str, record: dict) -> bytes:
    schema = load(kind)
    buf = io.BytesIO()
    buf.write(header(schema))
    fastavro.schemaless_writer(buf, schema, record)
    return buf.getvalue()


def decode(kind: str, data: bytes) -> dict:
    schema = load(kind)
    want = header(schema)
    if data[:10] != want:
        raise SystemExit(f"header {data[:10].hex()} is not {kind}'s {want.hex()}")
    buf = io.BytesIO(data[10:])
    rec = fastavro.schemaless_reader(buf, schema, schema)
    rest = buf.read()
    if rest:
        raise SystemExit(f"{len(rest)} trailing bytes after the {kind} body")
    return rec


JOB = {
    "job_id": "01890a5d-ac96-774b-bcce-b302099a8057",
    "tenant": "acme-ümlaut",  # non-ASCII on purpose
    "job_type": "email.send",
    "pool": "medium",
    "priority": "urgent",
    "payload": bytes(range(100)),
    "idempotency_key": "order-4711",
    "execute_at": 1_700_000_060_000,
    "not_after": 1_700_003_600_000,
    "attempt": 2,
    "crash_count": 1,
    "generation": 3,
    "submitted_at": 1_700_000_000_000,
    "not_before": 1_700_000_090_000,
    "last_error": "upstream returned 503",
    "last_failure_class": "worker_crash",
    "first_failure_at": 1_700_000_070_000,
    "replay_count": 4,
    "replayed_from": "fairway.dlq",
    "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
    "tracestate": "vendor=opaque",
    "flow_key": "vectorizer",
    "user_key": "user-42",
    "handoff_count": 2,
}

# Optional fields left out on purpose: fastavro fills them from the schema defaults
# (null, 0, "normal"), which the Rust test then sees.
JOB_MINIMAL = {
    "job_id": "01890a5d-ac96-774b-bcce-b302099a8058",
    "tenant": "t",
    "job_type": "noop",
    "payload": b"",
    "submitted_at": -1,
}

DEAD_LETTER = {
    "job": JOB_MINIMAL,
    "raw": None,
    "failure_class": "poison",
    "reason": "job type noop is quarantined: fix the handler, then replay",
    "last_error": None,
    "attempts": 5,
    "first_failure_at": 1_700_000_000_000,
    "last_failure_at": 1_700_000_500_000,
    "origin_topic": "fairway.jobs.short",
    "origin_partition": 7,
    "origin_offset": 9_876_543_210,
    "replay_count": 0,
}

DEAD_LETTER_RAW = {
    "job": None,
    "raw": b"\x00\xffnot avro",
    "failure_class": "permanent",
    "reason": "undecodable",
    "last_error": "bad magic",
    "attempts": 0,
    "first_failure_at": 1,
    "last_failure_at": 2,
    "origin_topic": "fairway.jobs.long",
    "origin_partition": 0,
    "origin_offset": 0,
    "replay_count": 1,
}

JOB_RESULT = {
    "job_id": "01890a5d-ac96-774b-bcce-b302099a8057",
    "tenant": "acme-ümlaut",
    "job_type": "email.send",
    "pool": "long",
    "status": "failed",
    "output": None,
    "error": "deadline of 30s passed",
    "failure_class": "timeout",
    "attempts": 3,
    "generation": 0,
    "submitted_at": 1_700_000_000_000,
    "started_at": 1_700_000_001_000,
    "finished_at": 1_700_000_031_000,
    "worker_id": "worker-2",
    "peak_memory_bytes": 268435456,
    "cpu_ms": 1234,
}

FIXTURES = [
    ("job_submitted_fastavro.bin", "job_submitted", JOB),
    ("job_submitted_minimal_fastavro.bin", "job_submitted", JOB_MINIMAL),
    ("dead_letter_fastavro.bin", "dead_letter", DEAD_LETTER),
    ("dead_letter_raw_fastavro.bin", "dead_letter", DEAD_LETTER_RAW),
    ("job_result_fastavro.bin", "job_result", JOB_RESULT),
]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out-dir", type=Path, default=ROOT / "tests" / "fixtures")
    ap.add_argument(
        "--verify",
        nargs=2,
        metavar=("KIND", "FILE"),
        help="decode FILE as KIND (job_submitted, job_result, dead_letter) and print it",
    )
    args = ap.parse_args()

    if args.verify:
        kind, path = args.verify
        rec = decode(kind, Path(path).read_bytes())
        print(json.dumps(rec, default=lambda b: b.hex(), ensure_ascii=False, indent=1))
        return

    args.out_dir.mkdir(parents=True, exist_ok=True)
    for name, kind, record in FIXTURES:
        data = encode(kind, record)
        assert decode(kind, data) is not None
        (args.out_dir / name).write_bytes(data)
        print(f"wrote {args.out_dir / name} ({len(data)} bytes, header {data[:10].hex()})")


if __name__ == "__main__":
    main()
