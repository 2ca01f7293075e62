//! The pool topic and its consumer group in memory ([`SimGroup`]), for the real pool
//! loop (`worker::pool::run_in`) to consume as a member, as it consumes a broker's.
//!
//! What it keeps of a broker: partitions of records with offsets; members that join, leave
//! or die; an assignment of the partitions over the live members, moved as members come
//! and go (a partition leaves its owner with a revocation before the next owner gets it
//! with an assignment, both as `RebalanceEvent`s); a fetch position per owned partition,
//! starting at the committed offset; pauses, kept by the member across revocations as
//! librdkafka keeps them; stored commit points, committed by [`SimGroup::commit`] (the
//! consumer's auto-commit) and at a revocation or a leave, never for a partition the
//! member no longer owns. A dead member ([`SimGroup::kill`]) fetches and commits nothing
//! more and keeps its partitions until [`SimGroup::expire`] (the session timeout). A live
//! member cut off past its session ([`SimGroup::lose`]) is told its partitions are lost,
//! as librdkafka tells it on its own session timeout, while the others get them; it joins
//! again when its link is back.

use crate::kafka::{ConsumeError, KafkaError, RebalanceEvent, TopicPartition};
use crate::seams::{CommitPoint, Pausable, PoolConsumer, PoolGroup, PoolRecord};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use tokio::sync::{mpsc, Notify};

/// A pool topic and its group; clones share them. A member joins with the tag of the
/// handle it joined through ([`SimGroup::tagged`]): its worker, which kills it.
#[derive(Clone)]
pub struct SimGroup {
    state: Arc<Mutex<GroupState>>,
    tag: Arc<str>,
}

struct GroupState {
    topic: String,
    /// Each partition's records: (payload, epoch ms appended).
    parts: Vec<Vec<(Vec<u8>, i64)>>,
    /// Each partition's committed offset (the next to read) and commit metadata.
    committed: Vec<(i64, String)>,
    members: BTreeMap<u64, Member>,
    next_member: u64,
    /// A misconfigured consumer (tests only): each record's offset is stored as it is
    /// fetched, as librdkafka's `enable.auto.offset.store=true` does, so the auto-commit
    /// commits records whose outcome is not durable yet.
    store_at_fetch: bool,
}

struct Member {
    tag: Arc<str>,
    /// False once killed: it fetches and commits nothing more.
    alive: bool,
    /// Cut from the broker: it fetches and commits nothing until the link is back (a cut
    /// shorter than the session: it stays a member).
    cut: bool,
    /// Out of the group: its session timed out during a cut ([`SimGroup::lose`]); it joins
    /// again when the cut ends.
    expelled: bool,
    /// Owned partitions and their fetch positions.
    owned: BTreeMap<i32, i64>,
    paused: HashSet<i32>,
    /// Commit points stored and not committed yet, with their metadata.
    stored: HashMap<i32, (i64, String)>,
    events: mpsc::UnboundedSender<RebalanceEvent>,
    wake: Arc<Notify>,
    /// The partition the next fetch looks at first (round robin).
    cursor: usize,
}

impl SimGroup {
    pub fn new(topic: &str, partitions: usize) -> SimGroup {
        let state = GroupState {
            topic: topic.to_string(),
            parts: vec![Vec::new(); partitions],
            committed: vec![(0, String::new()); partitions],
            members: BTreeMap::new(),
            next_member: 0,
            store_at_fetch: false,
        };
        SimGroup { state: Arc::new(Mutex::new(state)), tag: Arc::from("") }
    }

    /// The same group, joined through as `tag`.
    pub fn tagged(&self, tag: &str) -> SimGroup {
        SimGroup { state: self.state.clone(), tag: Arc::from(tag) }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, GroupState> {
        self.state.lock().expect("sim group")
    }

    /// Appends a record to `partition`: its offset.
    pub fn append(&self, partition: i32, payload: Vec<u8>, at: i64) -> i64 {
        let mut st = self.lock();
        let records = &mut st.parts[partition as usize];
        records.push((payload, at));
        let offset = records.len() as i64 - 1;
        st.wake_owner(partition);
        offset
    }

    /// Stores each record's offset as it is fetched from now on (the misconfiguration
    /// the fleet's tests inject to show a loss is caught).
    pub fn store_at_fetch(&self) {
        self.lock().store_at_fetch = true;
    }

    pub fn partitions(&self) -> usize {
        self.lock().parts.len()
    }

    /// Commits every live member's stored commit points (the consumers' auto-commit).
    pub fn commit(&self) {
        let mut st = self.lock();
        let ids: Vec<u64> = st.members.keys().copied().collect();
        ids.into_iter().for_each(|id| st.commit_member(id, None));
    }

    /// The members joined as `tag` die: they fetch and commit nothing more; what they
    /// stored is lost. Their partitions stay theirs until [`SimGroup::expire`].
    pub fn kill(&self, tag: &str) {
        for m in self.lock().members.values_mut().filter(|m| &*m.tag == tag) {
            m.alive = false;
            m.stored.clear();
        }
    }

    /// The members joined as `tag` lose (`on`) or get back their link to the broker; a
    /// member expelled meanwhile joins again.
    pub fn set_cut(&self, tag: &str, on: bool) {
        let mut st = self.lock();
        let mut rejoined = false;
        for m in st.members.values_mut().filter(|m| &*m.tag == tag) {
            m.cut = on;
            rejoined |= !on && std::mem::take(&mut m.expelled);
            m.wake.notify_one();
        }
        if rejoined {
            st.rebalance();
        }
    }

    /// The sessions of the live members joined as `tag`, cut off from the broker, time out:
    /// each is told its partitions are lost (`RebalanceEvent::Lost`, what it stored is
    /// never committed) and is out of the group until its cut ends; the others get its
    /// partitions.
    pub fn lose(&self, tag: &str) {
        let mut st = self.lock();
        let topic = st.topic.clone();
        for m in st.members.values_mut().filter(|m| m.alive && m.cut && &*m.tag == tag) {
            let lost: Vec<(String, i32)> = m.owned.keys().map(|p| (topic.clone(), *p)).collect();
            m.owned.clear();
            m.stored.clear();
            m.expelled = true;
            if !lost.is_empty() {
                let _ = m.events.send(RebalanceEvent::Lost(lost));
            }
        }
        st.rebalance();
    }

    /// The sessions of the dead members joined as `tag` time out: their partitions move
    /// to the others.
    pub fn expire(&self, tag: &str) {
        let mut st = self.lock();
        st.members.retain(|_, m| m.alive || &*m.tag != tag);
        st.rebalance();
    }

    /// Per partition: (records, committed offset).
    pub fn progress(&self) -> Vec<(i64, i64)> {
        let st = self.lock();
        st.parts.iter().zip(&st.committed).map(|(r, c)| (r.len() as i64, c.0)).collect()
    }

    /// Partitions of live members: (partition, the member's tag, records left to fetch).
    pub fn owned_with_lag(&self) -> Vec<(i32, String, i64)> {
        let st = self.lock();
        let mut out = Vec::new();
        for m in st.members.values().filter(|m| m.alive) {
            for (&p, &pos) in &m.owned {
                out.push((p, m.tag.to_string(), st.parts[p as usize].len() as i64 - pos));
            }
        }
        out
    }
}

impl GroupState {
    fn wake_owner(&self, partition: i32) {
        if let Some(m) = self.members.values().find(|m| m.owned.contains_key(&partition)) {
            m.wake.notify_one();
        }
    }

    /// Commits a live member's stored points (of `only` those partitions, if given). As
    /// librdkafka's commit of stored offsets, a partition whose stored offset is not past
    /// its committed one is left out, its metadata too.
    fn commit_member(&mut self, id: u64, only: Option<&BTreeSet<i32>>) {
        let Some(m) = self.members.get_mut(&id).filter(|m| m.alive && !m.cut) else { return };
        let points: Vec<i32> = m.stored.keys().copied().collect();
        for p in points {
            if only.is_some_and(|only| !only.contains(&p)) {
                continue;
            }
            let Some(point) = m.stored.remove(&p) else { continue };
            if m.owned.contains_key(&p) && point.0 > self.committed[p as usize].0 {
                self.committed[p as usize] = point;
            }
        }
    }

    /// Spreads the partitions over the members in join order (dead ones keep theirs until
    /// they expire): revocations first (with a commit of their stored points), then
    /// assignments at the committed offsets.
    fn rebalance(&mut self) {
        let ids: Vec<u64> = self.members.iter().filter(|(_, m)| !m.expelled).map(|(id, _)| *id).collect();
        if ids.is_empty() {
            return;
        }
        let target = |p: usize| ids[p % ids.len()];
        let topic = self.topic.clone();
        for &id in &ids {
            let gone: BTreeSet<i32> =
                self.members[&id].owned.keys().copied().filter(|&p| target(p as usize) != id).collect();
            if gone.is_empty() {
                continue;
            }
            self.commit_member(id, Some(&gone));
            let m = self.members.get_mut(&id).expect("member");
            gone.iter().for_each(|p| {
                m.owned.remove(p);
            });
            let _ = m.events.send(RebalanceEvent::Revoked(gone.iter().map(|p| (topic.clone(), *p)).collect()));
        }
        for p in 0..self.parts.len() {
            let id = target(p);
            let committed = self.committed[p].0;
            let m = self.members.get_mut(&id).expect("member");
            if m.owned.contains_key(&(p as i32)) {
                continue;
            }
            m.owned.insert(p as i32, committed);
            let _ = m.events.send(RebalanceEvent::Assigned(vec![(topic.clone(), p as i32)]));
            m.wake.notify_one();
        }
    }

    /// The next record for member `id` from an owned, unpaused partition.
    fn fetch(&mut self, id: u64) -> Option<PoolRecord> {
        let m = self.members.get_mut(&id).filter(|m| m.alive && !m.cut)?;
        let owned: Vec<(i32, i64)> = m.owned.iter().map(|(p, o)| (*p, *o)).collect();
        let n = owned.len();
        for i in 0..n {
            let (p, pos) = owned[(m.cursor + i) % n];
            let records = &self.parts[p as usize];
            if m.paused.contains(&p) || pos >= records.len() as i64 {
                continue;
            }
            let (payload, at) = records[pos as usize].clone();
            m.owned.insert(p, pos + 1);
            if self.store_at_fetch {
                m.stored.insert(p, (pos + 1, String::new()));
            }
            m.cursor = (m.cursor + i + 1) % n;
            return Some(PoolRecord { partition: p, offset: pos, payload, submitted: false, timestamp: Some(at) });
        }
        None
    }
}

impl PoolGroup for SimGroup {
    type Consumer = SimConsumer;
    fn join(&self) -> Result<(SimConsumer, mpsc::UnboundedReceiver<RebalanceEvent>), KafkaError> {
        let (events, rx) = mpsc::unbounded_channel();
        let wake = Arc::new(Notify::new());
        let mut st = self.lock();
        let id = st.next_member;
        st.next_member += 1;
        let member = Member {
            tag: self.tag.clone(),
            alive: true,
            cut: false,
            expelled: false,
            owned: BTreeMap::new(),
            paused: HashSet::new(),
            stored: HashMap::new(),
            events,
            wake: wake.clone(),
            cursor: 0,
        };
        st.members.insert(id, member);
        st.rebalance();
        Ok((SimConsumer { group: self.clone(), id, wake }, rx))
    }
}

/// One member of a [`SimGroup`].
pub struct SimConsumer {
    group: SimGroup,
    id: u64,
    wake: Arc<Notify>,
}

impl SimConsumer {
    fn with_member(&self, f: impl FnOnce(&mut Member)) {
        if let Some(m) = self.group.lock().members.get_mut(&self.id) {
            f(m)
        }
    }
}

impl Pausable for SimConsumer {
    fn pause(&self, parts: &[TopicPartition]) -> Result<(), ConsumeError> {
        self.with_member(|m| m.paused.extend(parts.iter().map(|(_, p)| *p)));
        Ok(())
    }
    fn resume(&self, parts: &[TopicPartition]) -> Result<(), ConsumeError> {
        self.with_member(|m| {
            parts.iter().for_each(|(_, p)| {
                m.paused.remove(p);
            });
            m.wake.notify_one();
        });
        Ok(())
    }
}

impl PoolConsumer for SimConsumer {
    async fn recv(&self) -> Result<PoolRecord, ConsumeError> {
        loop {
            if let Some(r) = self.group.lock().fetch(self.id) {
                return Ok(r);
            }
            self.wake.notified().await;
        }
    }
    fn try_recv(&self) -> Option<Result<PoolRecord, ConsumeError>> {
        self.group.lock().fetch(self.id).map(Ok)
    }
    fn store_offsets(&self, _topic: &str, commits: &[CommitPoint]) -> Result<(), ConsumeError> {
        let mut st = self.group.lock();
        let Some(m) = st.members.get_mut(&self.id) else { return Ok(()) };
        let mut now = Vec::new();
        for c in commits.iter().filter(|c| m.owned.contains_key(&c.partition)) {
            let point = (c.next, c.metadata.clone().unwrap_or_default());
            if c.now && m.alive && !m.cut {
                now.push((c.partition, point.clone()));
            }
            m.stored.insert(c.partition, point);
        }
        // An explicit commit: taken whatever the committed offset is.
        for (p, point) in now {
            st.committed[p as usize] = point;
        }
        Ok(())
    }
    fn committed_metadata(&self, _topic: &str, partitions: &[i32]) -> Result<Vec<(i32, i64, String)>, ConsumeError> {
        let st = self.group.lock();
        let member = st.members.get(&self.id).filter(|m| m.alive && !m.cut);
        if member.is_none() {
            // The real consumer's offset fetch times out (`kafka::seam`).
            return Err(crate::kafka::offset_fetch_unanswered());
        }
        let committed = |&p: &i32| st.committed.get(p as usize).map(|(next, md)| (p, *next, md.clone()));
        Ok(partitions.iter().filter_map(committed).collect())
    }
    fn fatal_error(&self) -> Option<String> {
        None
    }
    fn restart_fetchers(
        &self,
        _books: &HashMap<TopicPartition, i64>,
        _resume: &[TopicPartition],
    ) -> Result<Option<Vec<crate::kafka::stall::Start>>, KafkaError> {
        Ok(None)
    }
    fn leave(&self) {
        let mut st = self.group.lock();
        st.commit_member(self.id, None);
        st.members.remove(&self.id);
        st.rebalance();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point(partition: i32, next: i64, metadata: Option<&str>, now: bool) -> CommitPoint {
        CommitPoint { partition, next, metadata: metadata.map(str::to_string), now }
    }

    /// Metadata goes with its offset; the auto-commit leaves a partition whose offset did
    /// not move (as librdkafka's does), an explicit commit takes it; the next owner reads it.
    #[tokio::test]
    async fn commit_metadata_goes_with_moved_offsets_or_an_explicit_commit() {
        let g = SimGroup::new("t", 1);
        let (a, _rx) = g.tagged("a").join().unwrap();
        let meta = |c: &SimConsumer| c.committed_metadata("t", &[0]).unwrap();
        a.store_offsets("t", &[point(0, 2, Some("fw1@2:3"), false)]).unwrap();
        g.commit();
        assert_eq!(meta(&a), vec![(0, 2, "fw1@2:3".to_string())]);
        a.store_offsets("t", &[point(0, 2, Some("fw1@2:3,1"), false)]).unwrap();
        g.commit();
        assert_eq!(meta(&a), vec![(0, 2, "fw1@2:3".to_string())], "the offset did not move");
        a.store_offsets("t", &[point(0, 2, Some("fw1@2:3,1"), true)]).unwrap();
        assert_eq!(meta(&a), vec![(0, 2, "fw1@2:3,1".to_string())], "committed at once");
        a.store_offsets("t", &[point(0, 9, None, false)]).unwrap();
        g.commit();
        assert_eq!(meta(&a), vec![(0, 9, String::new())]);
        g.set_cut("a", true);
        assert!(a.committed_metadata("t", &[0]).is_err(), "cut off: the fetch fails");
    }

    fn drain(c: &SimConsumer) -> Vec<(i32, i64)> {
        std::iter::from_fn(|| c.try_recv()).map(|r| r.map(|r| (r.partition, r.offset)).unwrap()).collect()
    }

    /// Partitions spread over the members; a dead member's move once it expires, and the
    /// next owner reads from the committed offset (what was stored after it, again).
    #[tokio::test]
    async fn partitions_move_at_the_committed_offset() {
        let g = SimGroup::new("t", 2);
        let (a, mut a_rx) = g.tagged("a").join().unwrap();
        for i in 0..3 {
            g.append(0, vec![i], 0);
            g.append(1, vec![i], 0);
        }
        assert_eq!(drain(&a).len(), 6);
        let (b, mut b_rx) = g.join().unwrap();
        assert!(matches!(a_rx.recv().await, Some(RebalanceEvent::Assigned(_))));
        assert!(matches!(b_rx.recv().await, Some(RebalanceEvent::Assigned(_))));
        // a kept partition 0; it commits 2 of its 3 records, stores the third and dies.
        a.store_offsets("t", &[point(0, 2, None, false)]).unwrap();
        g.commit();
        a.store_offsets("t", &[point(0, 3, None, false)]).unwrap();
        g.kill("a");
        assert_eq!(drain(&a), vec![]);
        g.expire("a");
        assert_eq!(g.progress(), vec![(3, 2), (3, 0)]);
        let got = drain(&b);
        assert!(got.contains(&(0, 2)) && !got.contains(&(0, 1)), "{got:?}");
        assert!(got.contains(&(1, 0)), "{got:?}");
    }

    /// A paused partition is not fetched; its pause outlives a revocation and a new
    /// assignment, as librdkafka's does (`kafka::Pauses::assigned` lifts it).
    #[tokio::test]
    async fn a_pause_holds_and_outlives_a_revocation() {
        let g = SimGroup::new("t", 2);
        let (a, _a_rx) = g.join().unwrap();
        g.append(1, vec![1], 0);
        a.pause(&[("t".into(), 1)]).unwrap();
        assert!(a.try_recv().is_none());
        let (b, _b_rx) = g.join().unwrap();
        b.leave();
        assert!(a.try_recv().is_none(), "the pause came back with the partition");
        a.resume(&[("t".into(), 1)]).unwrap();
        assert_eq!(drain(&a), vec![(1, 0)]);
    }
}
