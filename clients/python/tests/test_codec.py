"""The codec against fixtures other Avro code wrote, for every released schema version."""

from pathlib import Path

import pytest

from fairway_client import DecodeError, JobSubmitted, codec, records

REPO = Path(__file__).resolve().parents[3]
FIXTURES = REPO / "tests" / "fixtures"


def test_packaged_schemas_are_the_repositorys():
    packaged = Path(codec.__file__).parent / "schemas"
    for src in list((REPO / "schemas").glob("*.avsc")) + list((REPO / "schemas" / "history").glob("*.avsc")):
        copy = packaged / src.relative_to(REPO / "schemas")
        assert copy.exists() and copy.read_bytes() == src.read_bytes(), (
            f"{copy} differs from {src}: copy schemas/ into clients/python/src/fairway_client/schemas/"
        )


@pytest.mark.parametrize("version", ["", "v1", "v2", "v3", "v4"])
def test_reads_every_released_job_submitted_and_dead_letter(version):
    job = codec.decode("job_submitted", (FIXTURES / version / "job_submitted_fastavro.bin").read_bytes())
    assert job["job_id"] == "01890a5d-ac96-774b-bcce-b302099a8057"
    assert job["tenant"] == "acme-ümlaut" and job["pool"] == "medium" and job["payload"] == bytes(range(100))
    # Fields added after the writer's version read as their defaults.
    assert job["flow_key"] == ("vectorizer" if version not in ("v1", "v2") else None)
    assert (job["user_key"], job["handoff_count"]) == (("user-42", 2) if version == "" else (None, 0))
    dl = records.DeadLetter.from_record(
        codec.decode("dead_letter", (FIXTURES / version / "dead_letter_fastavro.bin").read_bytes())
    )
    assert isinstance(dl.job, JobSubmitted) and dl.job.job_type == "noop"


def test_round_trip_and_clear_errors():
    rec = records.Job(tenant="acme", job_type="echo", payload={"a": 1}, pool="short").to_submitted()
    data = codec.encode("job_submitted", rec.to_record())
    assert data[:2] == b"\xc3\x01"
    assert JobSubmitted.from_record(codec.decode("job_submitted", data)) == rec
    with pytest.raises(DecodeError, match="no released job_result schema"):
        codec.decode("job_result", data)
    with pytest.raises(DecodeError, match="not an Avro single-object message"):
        codec.decode("job_submitted", b"{}")


def test_job_ids_are_uuid_v7():
    a, b = records.uuid7(), records.uuid7()
    assert a != b and a[14] == "7" and a[19] in "89ab" and len(a) == 36
