//! Which queued sequences run together. Pure bookkeeping, no engine: the worker
//! adds each request's token lengths and asks for the next batch.
//!
//! Sorted order (the default): the next batch is the run of similar lengths in
//! any bucket that wastes least on padding and per-call cost, across all waiting requests, up to the
//! bucket's batch size and the token budget. A request that has waited
//! `STARVATION_LIMIT` batches goes first instead: the batch is built around its
//! shortest waiting sequence. So one huge request cannot starve small ones, and
//! batches hold sequences of similar length, so little compute goes to padding.
//!
//! Arrival order is the baseline `eeane bench` compares against: sequences in
//! the order they came, padded to the longest of each batch.

use std::collections::HashMap;
use std::time::{Duration, Instant};

pub use crate::config::{BatchOrder as Order, Bucket};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchPolicy {
    /// Ascending by `max_tokens`; the last one takes everything longer too.
    pub buckets: Vec<Bucket>,
    /// Most tokens (rows × padded length) in one batch; a single sequence always fits.
    pub max_batch_tokens: usize,
    /// Dispatch length is the batch's longest sequence rounded up to this
    /// (0: the worker fills in the engine's preference).
    pub pad_to_multiple_of: usize,
    /// Pad every batch to its bucket's `max_tokens` (engines with static shapes).
    pub pad_to_bucket: bool,
    pub order: Order,
}

impl BatchPolicy {
    pub fn bucket_of(&self, len: usize) -> usize {
        self.buckets.iter().position(|b| len <= b.max_tokens).unwrap_or(self.buckets.len() - 1)
    }

    /// The sequence length a batch whose longest row is `longest` runs at.
    pub fn dispatch_len(&self, bucket: usize, longest: usize) -> usize {
        let ceiling = self.buckets[bucket].max_tokens.max(longest);
        if self.pad_to_bucket {
            return ceiling;
        }
        if self.order == Order::Arrival {
            return longest;
        }
        let multiple = self.pad_to_multiple_of.max(1);
        longest.div_ceil(multiple).saturating_mul(multiple).min(ceiling).max(longest)
    }
}

/// Batches a request may wait, once others are being served, before it is served.
const STARVATION_LIMIT: u64 = 4;

struct Window {
    /// Real tokens per computed token, counting a fixed cost per engine call.
    efficiency: f64,
    seq: usize,
    items: Vec<(u64, usize)>,
    lo: usize,
    hi: usize,
}

/// What one engine call costs beyond its tokens, in tokens. On the CPU a call
/// costs little more than its tokens, so padding weighs more than batch size.
const CALL_COST_TOKENS: usize = 128;

impl Window {
    fn better_than(&self, other: &Window) -> bool {
        self.efficiency > other.efficiency
    }
}

/// A planned batch: `(job, index)` pairs and the length to pad them to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Planned {
    pub items: Vec<(u64, usize)>,
    pub seq: usize,
}

struct Waiting {
    lens: Vec<usize>,
    /// Indices not yet planned; ascending by length in sorted order.
    remaining: Vec<usize>,
    last_served: u64,
    arrival: u64,
}

#[derive(Default)]
pub struct Pool {
    jobs: HashMap<u64, Waiting>,
    arrivals: u64,
    tick: u64,
}

impl Pool {
    pub fn add(&mut self, job: u64, lens: Vec<usize>, order: Order) {
        let mut remaining: Vec<usize> = (0..lens.len()).collect();
        if order == Order::Sorted {
            remaining.sort_by_key(|&i| lens[i]);
        }
        self.arrivals += 1;
        // A new request counts as served now: it waits at most STARVATION_LIMIT batches.
        self.jobs.insert(job, Waiting { lens, remaining, last_served: self.tick, arrival: self.arrivals });
    }

    pub fn remove(&mut self, job: u64) {
        self.jobs.remove(&job);
    }

    pub fn is_empty(&self) -> bool {
        self.jobs.values().all(|j| j.remaining.is_empty())
    }

    /// Sequences waiting for an engine.
    pub fn waiting(&self) -> usize {
        self.jobs.values().map(|j| j.remaining.len()).sum()
    }

    pub fn next_batch(&mut self, policy: &BatchPolicy) -> Option<Planned> {
        let planned = match policy.order {
            Order::Sorted => self.next_sorted(policy)?,
            Order::Arrival => self.next_arrival(policy)?,
        };
        self.tick += 1;
        let mut taken: HashMap<u64, Vec<usize>> = HashMap::new();
        for &(job, index) in &planned.items {
            taken.entry(job).or_default().push(index);
        }
        for (job, indices) in taken {
            // Planned from the waiting jobs just above, so it is there.
            let Some(waiting) = self.jobs.get_mut(&job) else { continue };
            waiting.remaining.retain(|i| !indices.contains(i));
            waiting.last_served = self.tick;
        }
        self.jobs.retain(|_, j| !j.remaining.is_empty());
        Some(planned)
    }

    fn next_sorted(&self, policy: &BatchPolicy) -> Option<Planned> {
        let waiting = self.jobs.iter().filter(|(_, j)| !j.remaining.is_empty());
        // A request that has waited STARVATION_LIMIT batches anchors the next one,
        // on its shortest waiting sequence; otherwise the fullest, least padded
        // batch of any bucket goes first.
        let starving = waiting.filter(|(_, j)| self.tick.saturating_sub(j.last_served) >= STARVATION_LIMIT).min_by_key(|(_, j)| (j.last_served, j.arrival));
        let mut best: Option<Window> = None;
        match starving {
            Some((&id, job)) => {
                let index = job.remaining[0];
                best = self.best_window(policy, policy.bucket_of(job.lens[index]), Some((id, index)));
            }
            None => {
                for bucket in 0..policy.buckets.len() {
                    if let Some(w) = self.best_window(policy, bucket, None) {
                        if best.as_ref().is_none_or(|b| w.better_than(b)) {
                            best = Some(w);
                        }
                    }
                }
            }
        }
        let window = best?;
        Some(Planned { items: window.items, seq: window.seq })
    }

    /// The window of similar lengths in `bucket` (holding `anchor`, if given)
    /// that computes the most real tokens per token spent (padding and the
    /// cost of a call included).
    fn best_window(&self, policy: &BatchPolicy, bucket: usize, anchor: Option<(u64, usize)>) -> Option<Window> {
        let mut candidates: Vec<(usize, u64, u64, usize)> = self
            .jobs
            .iter()
            .flat_map(|(&id, j)| j.remaining.iter().map(move |&i| (j.lens[i], j.arrival, id, i)))
            .filter(|&(len, ..)| policy.bucket_of(len) == bucket)
            .collect();
        if candidates.is_empty() {
            return None;
        }
        candidates.sort_unstable();
        let cap = policy.buckets[bucket].max_batch.max(1);
        let fits = |rows: usize, longest: usize| rows * policy.dispatch_len(bucket, longest) <= policy.max_batch_tokens;
        let starts = match anchor {
            Some((id, index)) => {
                let at = candidates.iter().position(|&(_, _, j, i)| j == id && i == index)?;
                at.saturating_sub(cap - 1)..at + 1
            }
            None => 0..candidates.len(),
        };
        let must_reach = anchor.and_then(|(id, index)| candidates.iter().position(|&(_, _, j, i)| j == id && i == index));
        let mut best: Option<Window> = None;
        for lo in starts {
            let mut hi = lo + 1;
            while hi - lo < cap && hi < candidates.len() && fits(hi - lo + 1, candidates[hi].0) {
                hi += 1;
            }
            if must_reach.is_some_and(|at| at >= hi) {
                continue;
            }
            let rows = hi - lo;
            let seq = policy.dispatch_len(bucket, candidates[hi - 1].0);
            let real: usize = candidates[lo..hi].iter().map(|c| c.0).sum();
            let efficiency = real as f64 / (rows * seq + CALL_COST_TOKENS) as f64;
            let window = Window { efficiency, seq, items: Vec::new(), lo, hi };
            if best.as_ref().is_none_or(|b| window.better_than(b)) {
                best = Some(window);
            }
        }
        let mut best = best?;
        best.items = candidates[best.lo..best.hi].iter().map(|&(_, _, id, i)| (id, i)).collect();
        Some(best)
    }

    fn next_arrival(&self, policy: &BatchPolicy) -> Option<Planned> {
        let mut jobs: Vec<(&u64, &Waiting)> = self.jobs.iter().filter(|(_, j)| !j.remaining.is_empty()).collect();
        jobs.sort_by_key(|(_, j)| j.arrival);
        let cap = policy.buckets.last().map_or(1, |b| b.max_batch).max(1);
        let mut items = Vec::new();
        let mut longest = 0;
        'fill: for (&id, j) in jobs {
            for &i in &j.remaining {
                let len = j.lens[i];
                if items.len() == cap || (!items.is_empty() && (items.len() + 1) * longest.max(len) > policy.max_batch_tokens) {
                    break 'fill;
                }
                longest = longest.max(len);
                items.push((id, i));
            }
        }
        (!items.is_empty()).then_some(Planned { items, seq: longest })
    }
}

/// How long an idle device waits for a batch to fill before it runs what has
/// arrived. When a batch's answers go out, the clients that sent them tend to
/// send again within a millisecond or so (Open WebUI: one text a request, many
/// at once); running the first that arrives alone leaves the others for the
/// next call, and batches swing between one row and many. So after answering
/// `answered` jobs the device waits for as many to queue, but never longer
/// than a quarter of its last call (capped at `FILL_WAIT_CAP`); a server
/// that answered nothing recently (an idle one) never waits.
#[derive(Debug, Clone, Default)]
pub struct FillWait {
    /// Jobs answered by the last call; as many are expected back.
    expected: usize,
    last_call: Duration,
    until: Option<Instant>,
}

/// The longest a device waits for a batch to fill.
pub const FILL_WAIT_CAP: Duration = Duration::from_millis(20);

impl FillWait {
    /// A call that took `took` answered `answered` jobs.
    pub fn answered(&mut self, answered: usize, took: Duration) {
        self.expected = answered;
        self.last_call = took;
        self.until = None;
    }

    /// With `queued` jobs waiting at `now`: how long to wait for more before
    /// planning a batch, or `None` to plan now.
    pub fn wait(&mut self, queued: usize, now: Instant) -> Option<Duration> {
        if queued == 0 || queued >= self.expected {
            self.until = None;
            return None;
        }
        let until = *self.until.get_or_insert_with(|| now + (self.last_call / 4).min(FILL_WAIT_CAP));
        if now >= until {
            // Waited enough: run what came; wait again only after the next answers.
            self.expected = 0;
            self.until = None;
            return None;
        }
        Some(until - now)
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn an_idle_server_never_waits_to_fill_a_batch() {
        let mut wait = FillWait::default();
        let now = Instant::now();
        assert_eq!(wait.wait(1, now), None, "nothing answered yet: run at once");
        wait.answered(1, Duration::from_millis(200));
        assert_eq!(wait.wait(1, now), None, "one answered, one back: run at once");
    }

    #[test]
    fn after_answering_many_a_device_waits_a_bounded_moment_for_them() {
        let mut wait = FillWait::default();
        let now = Instant::now();
        wait.answered(32, Duration::from_millis(40));
        assert_eq!(wait.wait(3, now), Some(Duration::from_millis(10)), "a quarter of the last call");
        assert_eq!(wait.wait(20, now + Duration::from_millis(4)), Some(Duration::from_millis(6)), "the same deadline");
        assert_eq!(wait.wait(32, now + Duration::from_millis(5)), None, "all back: run");
        wait.answered(32, Duration::from_secs(2));
        assert_eq!(wait.wait(1, now), Some(FILL_WAIT_CAP), "never longer than the cap");
        assert_eq!(wait.wait(1, now + FILL_WAIT_CAP), None, "the deadline passed: run what came");
        assert_eq!(wait.wait(1, now + FILL_WAIT_CAP), None, "and no second wait before the next answers");
        assert_eq!(wait.wait(0, now), None, "nothing queued: nothing to wait for");
    }
    use super::*;

    fn policy(buckets: &[(usize, usize)], order: Order) -> BatchPolicy {
        BatchPolicy {
            buckets: buckets.iter().map(|&(max_tokens, max_batch)| Bucket { max_tokens, max_batch }).collect(),
            max_batch_tokens: 100_000,
            pad_to_multiple_of: 8,
            pad_to_bucket: false,
            order,
        }
    }

    fn drain(pool: &mut Pool, policy: &BatchPolicy) -> Vec<Planned> {
        std::iter::from_fn(|| pool.next_batch(policy)).collect()
    }

    #[test]
    fn every_sequence_is_planned_exactly_once() {
        let p = policy(&[(16, 3), (64, 2), (256, 4)], Order::Sorted);
        let mut pool = Pool::default();
        pool.add(1, vec![5, 70, 12, 200, 9, 40, 41, 3], Order::Sorted);
        pool.add(2, vec![100, 2], Order::Sorted);
        let mut seen: Vec<(u64, usize)> = drain(&mut pool, &p).into_iter().flat_map(|b| b.items).collect();
        seen.sort();
        let want: Vec<(u64, usize)> = (0..8).map(|i| (1, i)).chain((0..2).map(|i| (2, i))).collect();
        assert_eq!(seen, want);
        assert!(pool.is_empty());
    }

    #[test]
    fn batches_stay_in_one_bucket_and_round_up_to_eight() {
        let p = policy(&[(16, 8), (64, 8)], Order::Sorted);
        let mut pool = Pool::default();
        let lens = vec![3, 60, 10, 17, 5];
        pool.add(1, lens.clone(), Order::Sorted);
        let mut batches: Vec<(Vec<usize>, usize)> =
            drain(&mut pool, &p).into_iter().map(|b| (b.items.iter().map(|&(_, i)| lens[i]).collect(), b.seq)).collect();
        batches.sort();
        // 17 and 60 share a bucket, but together they would waste 43 tokens of padding:
        // each runs alone, rounded up to a multiple of 8.
        assert_eq!(batches, vec![(vec![3, 5, 10], 16), (vec![17], 24), (vec![60], 64)]);
    }

    #[test]
    fn a_small_request_does_not_wait_for_a_huge_one() {
        let p = policy(&[(256, 4)], Order::Sorted);
        let mut pool = Pool::default();
        pool.add(1, vec![50; 100], Order::Sorted);
        let first = pool.next_batch(&p).unwrap();
        assert!(first.items.iter().all(|&(j, _)| j == 1));
        pool.add(2, vec![200], Order::Sorted);
        let served = (0..=STARVATION_LIMIT).map(|_| pool.next_batch(&p).unwrap()).position(|b| b.items.contains(&(2, 0)));
        assert!(served.is_some(), "the newcomer is served within {STARVATION_LIMIT} batches");
    }

    #[test]
    fn the_token_budget_caps_a_batch_but_one_sequence_always_fits() {
        let mut p = policy(&[(256, 32)], Order::Sorted);
        p.max_batch_tokens = 64;
        let mut pool = Pool::default();
        pool.add(1, vec![16, 16, 16, 16, 16, 200], Order::Sorted);
        let batches = drain(&mut pool, &p);
        let long = batches.iter().find(|b| b.items.contains(&(1, 5))).unwrap();
        assert_eq!((long.items.len(), long.seq), (1, 200), "alone over the budget, but it runs");
        assert!(batches.iter().all(|b| b.items.len() * b.seq <= 64 || b.items.len() == 1));
        assert_eq!(batches.iter().map(|b| b.items.len()).max(), Some(4), "4 x 16 tokens fill the budget");
    }

    #[test]
    fn arrival_order_pads_to_the_longest() {
        let p = policy(&[(256, 3)], Order::Arrival);
        let mut pool = Pool::default();
        pool.add(1, vec![5, 90, 7, 6], Order::Arrival);
        let batches = drain(&mut pool, &p);
        assert_eq!(batches[0].items, vec![(1, 0), (1, 1), (1, 2)]);
        assert_eq!(batches[0].seq, 90);
        assert_eq!((batches[1].items.clone(), batches[1].seq), (vec![(1, 3)], 6));
    }
}
