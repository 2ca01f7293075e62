"""fairway over Kafka (needs the `kafka` extra: confluent-kafka): submit jobs to the pool
topics, read results and dead letters as typed records, re-produce replayed jobs.

Topics are ``<prefix>jobs.<pool>``, ``<prefix>results``, ``<prefix>dlq`` (prefix
``kafka.topic_prefix`` of the deployment, default ``fairway.``); records are keyed by
tenant. Client settings (SASL, TLS) are librdkafka properties, as for fairway itself.

Submitting straight to Kafka skips the HTTP API's front door (API keys, rate limits,
queue-depth admission, idempotency keys are checked by the workers only): use it for
trusted producers inside the platform, the HTTP client for everything else.
"""

from typing import Dict, Iterable, Iterator, List, Optional

from confluent_kafka import Consumer, KafkaException, Producer

from . import codec
from .records import DeadLetter, Job, JobResult, JobSubmitted
from .replay import prepare_replay


class KafkaClient:
    """One producer, and consumers made on demand. `config`: extra librdkafka properties
    (e.g. ``{"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512", ...}``)."""

    def __init__(self, brokers: str, topic_prefix: str = "fairway.", config: Optional[Dict[str, str]] = None):
        self.brokers = brokers
        self.prefix = topic_prefix
        self.config = dict(config or {})
        self._producer = Producer(
            {
                **self.config,
                "bootstrap.servers": brokers,
                "enable.idempotence": True,
                "acks": "all",
                "linger.ms": 10,
            }
        )

    def topic(self, suffix: str) -> str:
        return f"{self.prefix}{suffix}"

    def submit(self, job: Job, timeout: float = 30.0) -> str:
        """Produces one job and waits for the broker's acknowledgement; its job id."""
        return self.submit_batch([job], timeout)[0]

    def submit_batch(self, jobs: Iterable[Job], timeout: float = 30.0) -> List[str]:
        """Produces every job (all checked first: none is sent if one is invalid), then
        waits for all acknowledgements; their job ids in order. Raises KafkaException
        naming the failed jobs (the others were accepted)."""
        records = []
        for i, job in enumerate(jobs):
            try:
                job.check(need_pool=True)
            except ValueError as e:
                raise ValueError(f"job [{i}]: {e}") from None
            records.append(job.to_submitted())
        return self.produce(records, timeout)

    def produce(self, records: List[JobSubmitted], timeout: float = 30.0) -> List[str]:
        """Produces ready-made submission records (e.g. replays) to their pool topics."""
        failed: Dict[str, str] = {}

        def delivered(err, msg):
            if err is not None:
                failed[msg.key().decode("utf-8", "replace") + "/" + str(len(failed))] = str(err)

        for rec in records:
            if rec.pool is None:
                raise ValueError(f"job {rec.job_id}: pool is None; over Kafka the pool picks the topic")
            headers = [(k, v) for k, v in (("traceparent", rec.traceparent), ("tracestate", rec.tracestate)) if v]
            self._producer.produce(
                self.topic(f"jobs.{rec.pool}"),
                key=rec.tenant.encode("utf-8"),
                value=codec.encode("job_submitted", rec.to_record()),
                headers=headers or None,
                on_delivery=delivered,
            )
            self._producer.poll(0)
        left = self._producer.flush(timeout)
        if left or failed:
            raise KafkaException(
                f"{len(failed) + left} of {len(records)} jobs not acknowledged within {timeout} s "
                f"(errors: {list(failed.values())[:3]}); resubmit them, with idempotency keys to be safe"
            )
        return [r.job_id for r in records]

    def _consumer(self, group: str, from_beginning: bool) -> Consumer:
        return Consumer(
            {
                **self.config,
                "bootstrap.servers": self.brokers,
                "group.id": group,
                "auto.offset.reset": "earliest" if from_beginning else "latest",
                "enable.auto.commit": True,
            }
        )

    def _read(self, suffix: str, kind: str, group: str, from_beginning: bool, timeout: Optional[float]) -> Iterator[dict]:
        consumer = self._consumer(group, from_beginning)
        consumer.subscribe([self.topic(suffix)])
        idle = 0.0
        try:
            while timeout is None or idle < timeout:
                msg = consumer.poll(0.5)
                if msg is None:
                    idle += 0.5
                    continue
                if msg.error():
                    raise KafkaException(msg.error())
                idle = 0.0
                yield codec.decode(kind, msg.value())
        finally:
            consumer.close()

    def results(self, group: str, from_beginning: bool = True, timeout: Optional[float] = None) -> Iterator[JobResult]:
        """Results as they come (consumer group `group`); stops after `timeout` seconds
        without a record (None: never)."""
        for rec in self._read("results", "job_result", group, from_beginning, timeout):
            yield JobResult.from_record(rec)

    def dead_letters(
        self, group: str, from_beginning: bool = True, timeout: Optional[float] = None
    ) -> Iterator[DeadLetter]:
        """Dead letters as they come; like `results`."""
        for rec in self._read("dlq", "dead_letter", group, from_beginning, timeout):
            yield DeadLetter.from_record(rec)

    def replay(self, dead_letters: Iterable[DeadLetter], max_replays: int = 3, force: bool = False) -> List[str]:
        """Sends dead letters back to their pools as new jobs (`prepare_replay`: new job
        id, fresh attempts, loop guard); the new job ids."""
        return self.produce([prepare_replay(dl, self.topic("dlq"), max_replays, force) for dl in dead_letters])

    def close(self, timeout: float = 10.0) -> None:
        self._producer.flush(timeout)
