//! Smoke test of the Kafka path against the local broker (Apache Kafka).
//!
//! Needs the local services: `scripts/services up`. Address from `FAIRWAY_KAFKA`, else
//! `FAIRWAY_BROKERS` (default 127.0.0.1:19092). Topic and group names are unique per run.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{CommitMode, Consumer, StreamConsumer};
use rdkafka::error::RDKafkaErrorCode;
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{Message, Offset, TopicPartitionList};

const PARTITIONS: i32 = 3;
const KEYS: usize = 6;

fn brokers() -> String {
    std::env::var("FAIRWAY_KAFKA")
        .or_else(|_| std::env::var("FAIRWAY_BROKERS"))
        .unwrap_or_else(|_| "127.0.0.1:19092".to_owned())
}

fn config() -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", brokers()).set("socket.timeout.ms", "10000").set("message.timeout.ms", "10000");
    c
}

fn consumer(group: &str, topic: &str) -> StreamConsumer {
    let c: StreamConsumer = config()
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .set("session.timeout.ms", "10000")
        .create()
        .expect("create consumer");
    c.subscribe(&[topic]).expect("subscribe");
    c
}

async fn produce(producer: &FutureProducer, topic: &str, round: &str, n: usize) -> BTreeSet<String> {
    let mut sent = BTreeSet::new();
    for i in 0..n {
        let key = format!("tenant-{}", i % KEYS);
        let payload = format!("{round}-{i}");
        producer
            .send(FutureRecord::to(topic).key(&key).payload(&payload), Duration::from_secs(10))
            .await
            .unwrap_or_else(|(e, _)| {
                panic!("produce to {topic} at {}: {e}; is `scripts/services up` running?", brokers())
            });
        sent.insert(payload);
    }
    sent
}

/// Receives exactly `n` messages (or panics after `limit`); returns (key, partition, offset, payload).
async fn receive(c: &StreamConsumer, n: usize, limit: Duration) -> Vec<(String, i32, i64, String)> {
    let mut got = Vec::with_capacity(n);
    let deadline = tokio::time::Instant::now() + limit;
    while got.len() < n {
        let m = tokio::time::timeout_at(deadline, c.recv())
            .await
            .unwrap_or_else(|_| panic!("received {} of {n} messages before timing out", got.len()))
            .expect("consume");
        let key = String::from_utf8(m.key().expect("key").to_vec()).unwrap();
        let payload = String::from_utf8(m.payload().expect("payload").to_vec()).unwrap();
        got.push((key, m.partition(), m.offset(), payload));
    }
    got
}

#[tokio::test]
async fn produce_consume_commit_resume() {
    tokio::time::timeout(Duration::from_secs(120), async {
        let id = uuid::Uuid::new_v4().simple().to_string();
        let topic = format!("it-topic-{id}");
        let group = format!("it-group-{id}");

        let admin: AdminClient<DefaultClientContext> = config().create().expect("admin client");
        let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
        let results = admin
            .create_topics(&[NewTopic::new(&topic, PARTITIONS, TopicReplication::Fixed(1))], &opts)
            .await
            .unwrap_or_else(|e| panic!("create topic at {}: {e}; is `scripts/services up` running?", brokers()));
        for r in results {
            match r {
                Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
                Err((t, e)) => panic!("create topic {t}: {e}"),
            }
        }

        let producer: FutureProducer =
            config().set("enable.idempotence", "true").set("acks", "all").create().expect("producer");
        let first = produce(&producer, &topic, "first", 30).await;

        // Consumer 1 reads everything, then commits manually and leaves the group.
        let c1 = consumer(&group, &topic);
        let got = receive(&c1, first.len(), Duration::from_secs(45)).await;
        assert_eq!(got.iter().map(|m| m.3.clone()).collect::<BTreeSet<_>>(), first);
        let mut partition_of_key = BTreeMap::new();
        let mut next_offsets = BTreeMap::new();
        for (key, partition, offset, _) in &got {
            assert!((0..PARTITIONS).contains(partition));
            let p = *partition_of_key.entry(key.clone()).or_insert(*partition);
            assert_eq!(p, *partition, "key {key} must always map to one partition");
            let next = next_offsets.entry(*partition).or_insert(0);
            *next = (*next).max(offset + 1);
        }
        let mut tpl = TopicPartitionList::new();
        for (p, next) in &next_offsets {
            tpl.add_partition_offset(&topic, *p, Offset::Offset(*next)).unwrap();
        }
        c1.commit(&tpl, CommitMode::Sync).expect("manual commit");
        drop(c1);

        // Consumer 2 in the same group must resume after the committed offsets:
        // it sees the new messages only.
        let second = produce(&producer, &topic, "second", 9).await;
        let c2 = consumer(&group, &topic);
        let got = receive(&c2, second.len(), Duration::from_secs(45)).await;
        assert_eq!(got.iter().map(|m| m.3.clone()).collect::<BTreeSet<_>>(), second);
        // Nothing else (no redelivery of the committed first round) shortly after.
        if let Ok(m) = tokio::time::timeout(Duration::from_secs(2), c2.recv()).await {
            let m = m.expect("consume");
            panic!("unexpected extra message {:?}", m.payload().map(String::from_utf8_lossy));
        }
    })
    .await
    .expect("kafka smoke test timed out");
}

/// Two members of one pool's group on a one-partition topic: the one left without a
/// partition says so in its stats (and logs a warning) once `kafka.unassigned_warning`
/// has passed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_worker_without_partitions_reports_it_after_the_threshold() {
    use fairway::handlers::Registry;
    use fairway::model::Pool;
    use fairway::worker::{Policy, Worker};
    let mut cfg = common::config("");
    cfg.kafka.partitions = 1;
    // Longer than a group join with a rebalance, so only a member really left out reports.
    cfg.kafka.unassigned_warning = Duration::from_secs(8);
    let cfg = common::arc(cfg);
    common::init(&cfg).await;
    let registry = Registry::from_config(&cfg, Default::default()).unwrap();
    let first = Worker::start(cfg.clone(), &[Pool::Short], registry.clone(), Policy::Fair).await.unwrap();
    assert!(first.wait_assigned(Duration::from_secs(60)).await, "the first worker got no partition");
    let second = Worker::start(cfg.clone(), &[Pool::Short], registry, Policy::Fair).await.unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let idle = |w: &Worker| w.shared[0].stats.lock().unwrap()["pool"]["unassigned_ms"].as_u64().unwrap_or(0);
    let owns = |w: &Worker| w.shared[0].assigned.load(std::sync::atomic::Ordering::SeqCst) > 0;
    loop {
        // Whichever member the rebalance left without the partition must report it, and
        // only that one.
        let (a, b) = (idle(&first), idle(&second));
        let reporter = match (a, b) {
            (0, 0) => None,
            (a, 0) => Some((a, &first, &second)),
            (0, b) => Some((b, &second, &first)),
            (a, b) => panic!("both members report no partition ({a} ms, {b} ms) on a one-partition topic"),
        };
        if let Some((ms, idle_one, owner)) = reporter {
            if owns(owner) && !owns(idle_one) {
                assert!(ms >= 8_000, "reported only past the threshold ({ms} ms)");
                break;
            }
        }
        assert!(std::time::Instant::now() < deadline, "no member reported being without partitions");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let group = first.shared[0].stats.lock().unwrap()["pool"]["group"].as_str().unwrap_or("").to_string();
    assert_eq!(group, cfg.group("short"));
    second.stop().await;
    first.stop().await;
}

/// A group member driven like the worker loop drives its consumer: rebalance events
/// applied to its [`Pauses`](fairway::kafka::Pauses), then the wanted pauses set, then a poll.
struct Member {
    consumer: fairway::kafka::WorkerConsumer,
    events: tokio::sync::mpsc::UnboundedReceiver<fairway::kafka::RebalanceEvent>,
    pauses: fairway::kafka::Pauses,
    want: std::collections::HashSet<fairway::kafka::TopicPartition>,
    /// Assignments and revocations seen so far.
    assigned: usize,
    revoked: usize,
}

impl Member {
    /// Polls for up to `limit`; the first payload received, if any. The rebalance events
    /// that poll delivered are applied before it returns (the assignment callback runs
    /// inside the poll that also returns the partition's first record).
    async fn pump(&mut self, limit: Duration) -> Option<String> {
        let deadline = tokio::time::Instant::now() + limit;
        while tokio::time::Instant::now() < deadline {
            self.apply_events();
            self.pauses.set(&self.consumer, &self.want);
            let got = match tokio::time::timeout(Duration::from_millis(100), self.consumer.recv()).await {
                Ok(Ok(m)) => Some(String::from_utf8_lossy(m.payload().unwrap_or_default()).to_string()),
                _ => None,
            };
            if got.is_some() {
                self.apply_events();
                return got;
            }
        }
        None
    }

    fn apply_events(&mut self) {
        use fairway::kafka::RebalanceEvent;
        while let Ok(ev) = self.events.try_recv() {
            match ev {
                RebalanceEvent::Assigned(tps) => {
                    self.assigned += 1;
                    self.pauses.assigned(&self.consumer, &tps);
                }
                RebalanceEvent::Revoked(tps) | RebalanceEvent::Lost(tps) => {
                    // As in the worker: a revoked partition's queued jobs are dropped,
                    // so nothing wants it paused any more.
                    self.revoked += 1;
                    self.want.retain(|tp| !tps.contains(tp));
                    self.pauses.revoked(&tps);
                }
                // Partitions not fetched (no statistics on this consumer: never sent).
                RebalanceEvent::Stalled(_) | RebalanceEvent::GroupStuck(_) => {}
            }
        }
    }
}

/// librdkafka keeps an application pause across a rebalance: a worker that paused a
/// partition (its tenants' buffers full), lost it in a rebalance and got it back must
/// still receive its records once it no longer wants it paused. Before `kafka::Pauses`
/// lifted old pauses on assignment, such a partition's jobs stopped arriving for good
/// (issue 16: "a partition's jobs never reach its owner").
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_partition_paused_before_a_rebalance_flows_again_when_assigned_back() {
    use fairway::model::Pool;
    let mut cfg = common::config("");
    cfg.kafka.partitions = 1;
    // The eager assignor (the default, set here for what the test needs): a member
    // joining revokes every partition (cooperative-sticky would leave partition 0 be).
    cfg.kafka.assignor = Some(fairway::config::Assignor::Range);
    common::init(&cfg).await;
    let (topic, other) = (cfg.pool_topic(Pool::Short), cfg.pool_topic(Pool::Medium));
    let group = format!("{}pauses", cfg.kafka.group_prefix);
    let producer = fairway::kafka::producer(&cfg).unwrap();
    let (consumer, events) = fairway::kafka::consumer(&cfg, &group, std::slice::from_ref(&topic)).unwrap();
    let mut m =
        Member { consumer, events, pauses: Default::default(), want: Default::default(), assigned: 0, revoked: 0 };
    fairway::kafka::send(&producer, &topic, "k", b"first").await.unwrap();
    assert_eq!(m.pump(Duration::from_secs(60)).await.as_deref(), Some("first"), "the group never formed");
    assert_eq!((m.assigned, m.revoked), (1, 0));
    // Paused, with a record waiting behind the pause.
    m.want.insert((topic.clone(), 0));
    assert_eq!(m.pump(Duration::from_millis(300)).await, None);
    fairway::kafka::send(&producer, &topic, "k", b"second").await.unwrap();
    assert_eq!(m.pump(Duration::from_secs(2)).await, None, "a paused partition delivered");
    // A second member joins for another topic: the (eager) rebalance takes partition 0
    // from the first and gives it back.
    let (c2, _ev2) = fairway::kafka::consumer(&cfg, &group, std::slice::from_ref(&other)).unwrap();
    let poll_c2 = tokio::spawn(async move {
        loop {
            let _ = tokio::time::timeout(Duration::from_millis(100), c2.recv()).await;
        }
    });
    // When it comes back nothing wants it paused (its jobs were dropped on revocation):
    // the waiting record arrives (after "first" again: no offset was stored, so the new
    // assignment starts from the beginning).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let mut got = Vec::new();
    while !got.iter().any(|p| p == "second") && tokio::time::Instant::now() < deadline {
        got.extend(m.pump(Duration::from_millis(200)).await);
    }
    poll_c2.abort();
    assert!(
        m.assigned >= 2 && m.revoked >= 1,
        "partition 0 was not revoked and assigned back within 60 s ({} assignments, {} revocations)",
        m.assigned,
        m.revoked
    );
    assert_eq!(m.pauses.paused().count(), 0);
    assert!(got.iter().any(|p| p == "second"), "the partition stayed paused after it was assigned back (got {got:?})");
}

/// The retry relay holds a job that is not due yet with its partition paused. A
/// rebalance that takes the partition away and gives it back (another member joining
/// the relay's group) must not leave it paused: the job is read again and handed back to
/// its pool when due. Before the relay lifted old pauses on assignment, it never was.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_held_retry_is_relayed_after_its_partition_was_revoked_and_given_back() {
    use fairway::kafka::RebalanceEvent;
    let mut cfg = common::config("");
    cfg.kafka.partitions = 1;
    cfg.kafka.assignor = Some(fairway::config::Assignor::Range); // eager, as above
    cfg.worker.relay_hold_max = Duration::from_secs(60);
    common::init(&cfg).await;
    let cfg = common::arc(cfg);
    // A job due in 25 s on the delayed topic: the relay holds it, its partition paused.
    let mut job = common::job_record("acme", "echo");
    let due = fairway::now_ms() + 25_000;
    job.not_before = Some(due);
    let producer = fairway::kafka::producer(&cfg).unwrap();
    let bytes = fairway::codec::encode_job(&job).unwrap();
    fairway::kafka::send(&producer, &cfg.delayed_topic(), &job.tenant, &bytes).await.unwrap();
    let store = fairway::store::Store::open(&cfg).await.expect("store");
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let relay = tokio::spawn(fairway::worker::relay::run(cfg.clone(), producer.clone(), store, stopped));
    // Another member joins the relay's group for another topic: the (eager) rebalance
    // revokes the relay's partitions and gives them back. Its own assignment says the
    // rebalance is over.
    tokio::time::sleep(Duration::from_secs(8)).await;
    let other = vec![cfg.results_topic()];
    let (c2, mut ev2) = fairway::kafka::consumer(&cfg, &cfg.group("retry"), &other).unwrap();
    let poll_c2 = tokio::spawn(async move {
        loop {
            let _ = tokio::time::timeout(Duration::from_millis(100), c2.recv()).await;
        }
    });
    let joined = tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(ev) = ev2.recv().await {
            if matches!(ev, RebalanceEvent::Assigned(ref tps) if !tps.is_empty()) {
                return;
            }
        }
    })
    .await;
    assert!(joined.is_ok(), "the second member got no assignment within 30 s");
    assert!(fairway::now_ms() < due, "the rebalance ended after the job was due: the test proves nothing");
    // Handed back to its pool when due.
    let id = job.job_id.clone();
    let seen = common::read_until(
        &cfg,
        &cfg.pool_topic(fairway::model::Pool::Short),
        Duration::from_secs(45),
        |b, _, _| fairway::codec::decode_job(b).ok().filter(|j| j.job_id == id),
        |got| !got.is_empty(),
    )
    .await;
    let _ = stop.send(true);
    poll_c2.abort();
    let _ = tokio::time::timeout(Duration::from_secs(10), relay).await;
    assert_eq!(seen.len(), 1, "the held job was never relayed after its partition came back");
    assert!(fairway::now_ms() >= due);
}

/// Commit metadata through the pool consumer's seam, as `worker::early_commit` uses it on
/// the real broker: an explicit commit of an offset that did not move, with new metadata;
/// a moved offset stored with its metadata and committed as the member leaves; and the
/// partition's next member reading both back.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn commit_metadata_reaches_the_partitions_next_owner() {
    use fairway::model::Pool;
    use fairway::seams::{CommitPoint, PoolConsumer, PoolGroup};
    let mut cfg = common::config("");
    cfg.kafka.partitions = 1;
    common::init(&cfg).await;
    let topic = cfg.pool_topic(Pool::Short);
    let group = fairway::kafka::seam::KafkaPoolGroup {
        cfg: std::sync::Arc::new(cfg.clone()),
        group: format!("{}metadata", cfg.kafka.group_prefix),
        topic: topic.clone(),
        pool: "short",
    };
    let producer = fairway::kafka::producer(&cfg).unwrap();
    for i in 0..5 {
        fairway::kafka::send(&producer, &topic, "k", format!("r{i}").as_bytes()).await.unwrap();
    }
    let (first, _events) = group.join().unwrap();
    let mut read = 0;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while read < 5 && tokio::time::Instant::now() < deadline {
        if let Ok(Ok(_)) = tokio::time::timeout(Duration::from_millis(200), PoolConsumer::recv(&first)).await {
            read += 1;
        }
    }
    assert_eq!(read, 5, "the group never formed or the records did not arrive within 60 s");
    let point = |next, metadata: &str, now| CommitPoint { partition: 0, next, metadata: Some(metadata.into()), now };
    let committed = |c: &fairway::kafka::WorkerConsumer| PoolConsumer::committed_metadata(c, &topic, &[0]).unwrap();
    // Nothing committed yet, then the offset 1 with offset 3 finished above it.
    PoolConsumer::store_offsets(&first, &topic, &[point(1, "fw1@1:2", false)]).unwrap();
    PoolConsumer::store_offsets(&first, &topic, &[point(1, "fw1@1:2", true)]).unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while committed(&first) != [(0, 1, "fw1@1:2".to_string())] && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(committed(&first), [(0, 1, "fw1@1:2".to_string())], "the explicit commit with metadata");
    // The offset moves to 2; 3 still finished above it. Stored only: committed as it leaves.
    PoolConsumer::store_offsets(&first, &topic, &[point(2, "fw1@2:1", false)]).unwrap();
    PoolConsumer::leave(&first);
    drop(first);
    let (next, _events) = group.join().unwrap();
    assert_eq!(committed(&next), [(0, 2, "fw1@2:1".to_string())], "the stored offset's metadata went with it");
    PoolConsumer::leave(&next);
}
