//! The broker as a job's route sees it ([`RouteBroker`]): the producer's sends.

use super::{KafkaError, Producer};
use crate::seams::{Io, RouteBroker};

impl RouteBroker for Producer {
    fn send<'a>(
        &'a self,
        topic: &'a str,
        key: &'a str,
        payload: &'a [u8],
        headers: &'a [(&'a str, &'a str)],
    ) -> Io<'a, Result<(i32, i64), KafkaError>> {
        Box::pin(Producer::send(self, topic, key, payload, headers))
    }
    fn send_nowait(&self, topic: &str, key: &str, payload: &[u8]) -> bool {
        Producer::send_nowait(self, topic, key, payload)
    }
}
