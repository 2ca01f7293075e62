"""Replaying dead letters, as `fairway replay` does (src/core/replay.rs): the job goes
back to its pool with a fresh attempt counter and its provenance; the previous run's
failure bookkeeping is cleared (it stays on the DLQ record).

One difference: `fairway replay` keeps the job id, because it also resets the job's state
row in the store (without that, a worker's effectively-once check acknowledges the copy
as already finished). A client with only Kafka cannot do that, so its replay is a new
job: a new job id (and no idempotency key, which the original holds), with
`replayed_from` and `replay_count` pointing back at the original."""

import dataclasses

from .records import POOLS, DeadLetter, JobSubmitted, uuid7

#: Replays of one job allowed before `force` is needed (as `fairway replay`).
DEFAULT_MAX_REPLAYS = 3


class ReplayRefused(ValueError):
    """The dead letter cannot be replayed (no decodable job, or the loop guard)."""


def prepare_replay(dl: DeadLetter, source_topic: str, max_replays: int = DEFAULT_MAX_REPLAYS, force: bool = False) -> JobSubmitted:
    """The submission record that replays `dl` (read from `source_topic`) as a new job."""
    if dl.job is None:
        raise ReplayRefused(
            f"dead letter at {dl.origin_topic}/{dl.origin_partition}@{dl.origin_offset} holds no decodable job "
            "(only raw bytes): fix and resubmit it by hand"
        )
    replays = max(dl.replay_count, dl.job.replay_count)
    if replays >= max_replays and not force:
        raise ReplayRefused(
            f"job {dl.job.job_id} was already replayed {replays} times (limit {max_replays}): it keeps failing, "
            "so fix the cause first (or pass force=True)"
        )
    return dataclasses.replace(
        dl.job,
        job_id=uuid7(),
        idempotency_key=None,
        attempt=0,
        crash_count=0,
        not_before=None,
        last_error=None,
        last_failure_class=None,
        first_failure_at=None,
        replay_count=replays + 1,
        replayed_from=source_topic,
        # The replay starts a new trace (as `fairway replay`).
        traceparent=None,
        tracestate=None,
        pool=dl.job.pool or _pool_of(dl.origin_topic),
    )


def _pool_of(topic: str):
    """The pool of a pool topic name (`<prefix>jobs.<pool>`), else None."""
    for pool in POOLS:
        if topic.endswith(f"jobs.{pool}"):
            return pool
    return None
