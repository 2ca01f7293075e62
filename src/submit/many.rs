//! Submitting many jobs at once (`POST /v1/jobs:batch`): the common job (no idempotency,
//! unique or debounce key, queued now, its state packed, spans not exported) takes one
//! shared path: every record of the batch is handed at once to the producer of batches
//! (`kafka::bulk_producer`, which lingers 5 ms where single submissions linger 25;
//! `kafka::Producer::send_many`) and each job's packed `queued` record is written once
//! it is on its topic, as [`Submitter::submit`] does for one. A batch then holds a
//! thousand small acknowledgement futures instead of a thousand whole submissions (a
//! submission's future is kilobytes; a thousand of them were allocated, moved and faulted
//! in per request). Any other job goes through [`Submitter::submit`] alongside.

use super::{NewJob, SubmitError, Submitted, Submitter};
use crate::kafka::Outgoing;
use crate::model::{JobSubmitted, Millis, Pool};
use crate::store::EventStatements;
use crate::{codec, now_ms};

/// A job of the batch on the shared path: its record and where it stands in the batch.
struct Ready {
    index: usize,
    rec: JobSubmitted,
    pool: Pool,
}

impl Submitter {
    /// Submits `jobs`: one answer each, in order, the one [`Submitter::submit`] gives.
    pub async fn submit_many(&self, jobs: &[NewJob]) -> Vec<Result<Submitted, SubmitError>> {
        self.refresh_classes().await;
        let now = now_ms();
        // Without statements nothing packs: every job goes alone and says why it failed.
        let stmts = self.statements().await.ok().flatten();
        let mut answers: Vec<Option<Result<Submitted, SubmitError>>> = jobs.iter().map(|_| None).collect();
        let (mut ready, mut alone) = (Vec::new(), Vec::new());
        for (index, job) in jobs.iter().enumerate() {
            match self.ready(job, stmts, now) {
                Some(Ok((rec, pool))) => ready.push(Ready { index, rec, pool }),
                Some(Err(e)) => answers[index] = Some(Err(e)),
                None => alone.push(index),
            }
        }
        self.count_batch(jobs, now);
        let singles = futures::future::join_all(alone.iter().map(|&i| Box::pin(self.submit_counted(&jobs[i], true))));
        let (singles, shared) = tokio::join!(singles, self.produce_ready(&ready, jobs, stmts, now));
        for (i, answer) in alone.into_iter().zip(singles) {
            answers[i] = Some(answer);
        }
        for (r, answer) in ready.iter().zip(shared) {
            answers[r.index] = Some(answer);
        }
        answers.into_iter().map(|a| a.expect("every job answered")).collect()
    }

    /// The job's record and pool if it takes the shared path; an error if it is invalid;
    /// None if it goes through [`Submitter::submit`].
    fn ready(
        &self,
        job: &NewJob,
        stmts: Option<&EventStatements>,
        now: Millis,
    ) -> Option<Result<(JobSubmitted, Pool), SubmitError>> {
        let keyed = job.idempotency_key.is_some() || job.unique_key.is_some() || job.debounce_key.is_some();
        if keyed || crate::observe::telemetry::exporting() {
            return None;
        }
        let payload = job.payload_bytes();
        let pool = match self.validate(job, payload.len()) {
            Ok(p) => p,
            Err(e) => return Some(Err(e)),
        };
        let job_id = job.job_id.clone().unwrap_or_else(|| uuid::Uuid::now_v7().to_string());
        let rec = self.record(job, job_id, pool, payload, now);
        self.packs_submission(stmts, &rec, now).then_some(Ok((rec, pool)))
    }

    /// Produces the ready jobs together, then writes the packed `queued` record of each
    /// one on its topic; their answers, in order.
    async fn produce_ready(
        &self,
        ready: &[Ready],
        jobs: &[NewJob],
        stmts: Option<&EventStatements>,
        now: Millis,
    ) -> Vec<Result<Submitted, SubmitError>> {
        let topics: Vec<(Pool, String)> = Pool::ALL.iter().map(|p| (*p, self.cfg.pool_topic(*p))).collect();
        let topic = |pool: Pool| topics.iter().find(|(p, _)| *p == pool).map(|(_, t)| t.as_str()).expect("every pool");
        let encoded: Vec<Result<Vec<u8>, SubmitError>> =
            ready.iter().map(|r| codec::encode_job(&r.rec).map_err(SubmitError::from)).collect();
        // Every ready job's packed `queued` state is written here (the recorder skips it).
        let headers: Vec<_> = ready.iter().map(|r| super::record_headers(&r.rec, true)).collect();
        if encoded.iter().all(Result::is_err) {
            // Nothing to produce (every job failed to encode, or none took this path).
            return encoded.into_iter().map(|e| Err(e.expect_err("no record: every encoding failed"))).collect();
        }
        let bulk = match self.bulk.get_or_try_init(|| async { crate::kafka::bulk_producer(&self.cfg) }).await {
            Ok(bulk) => bulk,
            Err(e) => {
                let (brokers, message) = (self.cfg.kafka.brokers.clone(), e.to_string());
                let err = || crate::kafka::KafkaError::Client { brokers: brokers.clone(), message: message.clone() };
                return ready.iter().map(|_| Err(SubmitError::from(err()))).collect();
            }
        };
        let lanes = self.batch_lanes(ready.iter().map(|r| (&r.rec, jobs[r.index].ordering_key.as_deref())), now);
        let mut placements = Vec::with_capacity(ready.len());
        for (r, lane) in ready.iter().zip(lanes) {
            placements.push(Self::place(bulk, topic(r.pool), &r.rec.tenant, lane).await);
        }
        let outgoing: Vec<Outgoing> = ready
            .iter()
            .zip(&encoded)
            .zip(&headers)
            .zip(&placements)
            .filter_map(|(((r, bytes), headers), at)| {
                Some(Outgoing {
                    topic: topic(r.pool),
                    partition: at.partition,
                    key: &at.key,
                    payload: bytes.as_ref().ok()?,
                    headers,
                })
            })
            .collect();
        let mut sent = bulk.send_many(&outgoing).await.into_iter();
        let produced: Vec<Result<(), SubmitError>> = encoded
            .into_iter()
            .map(|bytes| match bytes {
                Ok(_) => sent.next().expect("one answer per record").map(|_| ()).map_err(SubmitError::from),
                Err(e) => Err(e),
            })
            .collect();
        let answers = ready.iter().zip(produced).map(|(r, produced)| async move {
            produced?;
            let written = self.put_submitted(stmts, &r.rec, r.pool, now, true).await;
            Ok(Submitted {
                job_id: r.rec.job_id.clone(),
                duplicate: false,
                pool: r.pool,
                original: None,
                joined: false,
                queued_row: written,
            })
        });
        futures::future::join_all(answers).await
    }
}
