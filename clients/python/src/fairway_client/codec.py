"""fairway's wire format: Avro single-object encoding of the records in `schemas/`.

A message is ``C3 01`` + the 8-byte CRC-64-AVRO fingerprint of the writer schema's parsing
canonical form (little-endian, as fastavro prints it) + the Avro binary body. Records are
written with the current schemas; a message is read with the schema version its
fingerprint names (the current one or any released one in ``schemas/history``) and
resolved into the current schema, so fields added later get their defaults.
"""

import io
import json
from dataclasses import dataclass
from importlib import resources
from typing import Dict, List, Tuple

import fastavro
from fastavro.schema import fingerprint, parse_schema, to_parsing_canonical_form

MAGIC = b"\xc3\x01"
HEADER_LEN = 10

#: The record kinds fairway puts on Kafka, by schema file name.
KINDS = ("job_submitted", "job_result", "dead_letter", "job_event")


class DecodeError(ValueError):
    """A message that is not a fairway record of the expected kind."""


@dataclass(frozen=True)
class _Schema:
    parsed: dict
    fingerprint: bytes
    version: str


def _load(path) -> dict:
    return parse_schema(json.loads(path.read_text(encoding="utf-8")), named_schemas={})


def _fingerprint(parsed: dict) -> bytes:
    return bytes.fromhex(fingerprint(to_parsing_canonical_form(parsed), "CRC-64-AVRO"))


def _versions() -> Tuple[Dict[str, _Schema], Dict[str, Dict[bytes, _Schema]]]:
    root = resources.files("fairway_client") / "schemas"
    current, known = {}, {}
    for kind in KINDS:
        parsed = _load(root / f"{kind}.avsc")
        current[kind] = _Schema(parsed, _fingerprint(parsed), "current")
        known[kind] = {current[kind].fingerprint: current[kind]}
    for path in (root / "history").iterdir():
        kind, version, _ = path.name.rsplit(".", 2)
        if kind in known:
            parsed = _load(path)
            known[kind].setdefault(_fingerprint(parsed), _Schema(parsed, _fingerprint(parsed), version))
    return current, known


_CURRENT, _KNOWN = _versions()


def versions(kind: str) -> List[str]:
    """The schema versions of `kind` this client reads ("current", "v1", ...)."""
    return sorted(s.version for s in _KNOWN[kind].values())


def encode(kind: str, record: dict) -> bytes:
    """`record` (a dict in the schema's field names) as a single-object message."""
    schema = _CURRENT[kind]
    buf = io.BytesIO()
    buf.write(MAGIC + schema.fingerprint)
    fastavro.schemaless_writer(buf, schema.parsed, record)
    return buf.getvalue()


def decode(kind: str, data: bytes) -> dict:
    """A single-object message of `kind` written with any released schema version, as a
    dict in the current schema's field names."""
    if len(data) < HEADER_LEN or data[:2] != MAGIC:
        raise DecodeError(f"not an Avro single-object message (starts {data[:2].hex()!r}, want c301)")
    writer = _KNOWN[kind].get(data[2:HEADER_LEN])
    if writer is None:
        raise DecodeError(
            f"fingerprint {data[2:HEADER_LEN].hex()} is no released {kind} schema "
            f"(known: {', '.join(versions(kind))}); is this a {kind} record, or is the client older than the writer?"
        )
    buf = io.BytesIO(data[HEADER_LEN:])
    record = fastavro.schemaless_reader(buf, writer.parsed, _CURRENT[kind].parsed)
    if buf.read():
        raise DecodeError(f"trailing bytes after the {kind} body")
    return record
