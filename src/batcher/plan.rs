//! Which queued sequences run together. Pure bookkeeping, no engine: the worker
//! adds each request's token lengths and asks for the next batch.
//!
//! Sorted order (the default): everything waiting, across requests and
//! buckets, is planned as runs of similar lengths that waste least on padding
//! and per-call cost, each up to the batch size of the bucket of its longest
//! sequence and the token budget. The runs are taken in a sweep, shortest to
//! longest and round again, so that requests finish in the order they came
//! (see `Pool::sweep`). A request that has waited `STARVATION_LIMIT` batches
//! goes first instead: the batch is built around its shortest waiting
//! sequence. So one huge request cannot starve small ones, and batches hold
//! sequences of similar length, so little compute goes to padding.
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
    /// Pad every batch to its bucket's `max_tokens` (engines of fixed shapes,
    /// `InputShapes::Fixed`: Core ML's static ones).
    pub pad_to_bucket: bool,
    pub order: Order,
    /// What one engine call costs beyond its tokens, in tokens (the worker
    /// fills in the engine's `EngineInfo::call_cost_tokens`).
    pub call_cost_tokens: usize,
    /// The row counts the engine runs, ascending: a batch of other rows runs
    /// padded up to the next one (empty: every batch runs its own rows; the
    /// worker fills in the engine's `EngineInfo::row_counts`).
    pub row_counts: Vec<usize>,
}

impl BatchPolicy {
    pub fn bucket_of(&self, len: usize) -> usize {
        self.buckets.iter().position(|b| len <= b.max_tokens).unwrap_or(self.buckets.len() - 1)
    }

    /// Most rows a batch of `bucket` padded to `seq` holds: its batch size
    /// within the token budget, and always one.
    pub fn rows_at(&self, bucket: usize, seq: usize) -> usize {
        self.buckets[bucket].max_batch.max(1).min((self.max_batch_tokens / seq.max(1)).max(1))
    }

    /// The rows a batch of `rows` runs with on the engine.
    pub fn rows_run(&self, rows: usize) -> usize {
        eeane_backend_core::rows_run(&self.row_counts, rows)
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
    seq: usize,
    items: Vec<(u64, usize)>,
    lo: usize,
    hi: usize,
    /// The run's longest sequence.
    top: SortKey,
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

/// Where a sequence stands in the sorted order: length, then arrival.
type SortKey = (usize, u64, u64, usize);

#[derive(Default)]
pub struct Pool {
    jobs: HashMap<u64, Waiting>,
    arrivals: u64,
    tick: u64,
    /// The longest sequence of the last run the sweep took: the next run is
    /// the plan's first one above it, or the shortest when none is. Taking
    /// the most efficient run first instead (the longest, in bulk) advanced
    /// every request at once: they finished together, the pool drained while
    /// their clients sent the next ones, and a simulated card (eight sessions,
    /// 24 clients of 256 texts: tests/gpu/dispatcher_probe.patch) was busy
    /// 0.84-0.86 of the time at 49,800-50,900 sequences/s; with the sweep
    /// 0.91-0.93 at 53,300-54,600, with the same padding.
    sweep: Option<SortKey>,
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

    /// Whether `job` still has sequences waiting.
    pub fn holds(&self, job: u64) -> bool {
        self.jobs.contains_key(&job)
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

    fn next_sorted(&mut self, policy: &BatchPolicy) -> Option<Planned> {
        // A request that has waited STARVATION_LIMIT batches anchors the next one,
        // on its shortest waiting sequence; otherwise the sweep takes its next run.
        let starving = self
            .jobs
            .iter()
            .filter(|(_, j)| !j.remaining.is_empty() && self.tick.saturating_sub(j.last_served) >= STARVATION_LIMIT)
            .min_by_key(|(_, j)| (j.last_served, j.arrival))
            .map(|(&id, job)| (id, job.remaining[0]));
        let window = self.best_window(policy, starving)?;
        if starving.is_none() {
            self.sweep = Some(window.top);
        }
        Some(Planned { items: window.items, seq: window.seq })
    }

    /// The next batch (the one holding `anchor`, if given) of the cheapest
    /// plan for everything waiting: runs of similar lengths, each costing its
    /// rows times its padded length plus the cost of a call, taken in the
    /// sweep's order (`Pool::sweep`). A run may take shorter
    /// sequences from lower buckets; it runs in the bucket of its longest, at
    /// that bucket's batch size. Choosing one best run at a time left
    /// stragglers to calls of their own, and keeping to one bucket split a
    /// few single texts from many clients into calls of 5 rows where one call
    /// of 15 pads a little more and costs less.
    fn best_window(&self, policy: &BatchPolicy, anchor: Option<(u64, usize)>) -> Option<Window> {
        let mut candidates: Vec<SortKey> = self.jobs.iter().flat_map(|(&id, j)| j.remaining.iter().map(move |&i| (j.lens[i], j.arrival, id, i))).collect();
        if candidates.is_empty() {
            return None;
        }
        candidates.sort_unstable();
        let lengths: Vec<usize> = candidates.iter().map(|c| c.0).collect();
        let n = lengths.len();
        let start = cheapest_runs(policy, &lengths);
        let at = match anchor {
            Some((id, index)) => Some(candidates.iter().position(|&(_, _, j, i)| j == id && i == index)?),
            None => None,
        };
        let mut best: Option<Window> = None;
        let mut hi = n;
        while hi > 0 {
            let lo = start[hi];
            let top = candidates[hi - 1];
            let wanted = match at {
                Some(at) => (lo..hi).contains(&at),
                // Runs come longest first: the last one above the sweep is
                // its next; with none above, the shortest (lo 0) starts the
                // sweep again.
                None => self.sweep.is_none_or(|s| top > s) || (lo == 0 && best.is_none()),
            };
            if wanted {
                let seq = policy.dispatch_len(policy.bucket_of(top.0), top.0);
                best = Some(Window { seq, items: Vec::new(), lo, hi, top });
            }
            hi = lo;
        }
        let mut best = best?;
        let mut taken: Vec<usize> = (best.lo..best.hi).collect();
        if let Some((job, _)) = anchor {
            // The starving request's other sequences that fit the batch's
            // length fill the rows it has room for, then take the places of
            // others' shortest: a request of two short texts whose second fell
            // just past the run waited for the limit a second time (4.2 s
            // during a 2,048-text request on two CPU engines, against 1.3-1.6 s
            // for the next ones).
            let mut rest = (0..n).filter(|&k| candidates[k].2 == job && !(best.lo..best.hi).contains(&k) && candidates[k].0 <= best.seq);
            let bucket = policy.bucket_of(candidates[best.hi - 1].0);
            let room = policy.rows_at(bucket, best.seq);
            let others: Vec<usize> = (0..taken.len()).filter(|&place| candidates[taken[place]].2 != job).collect();
            taken.extend(rest.by_ref().take(room.saturating_sub(taken.len())));
            for (place, k) in others.into_iter().zip(rest) {
                taken[place] = k;
            }
        }
        best.items = taken.into_iter().map(|k| (candidates[k].2, candidates[k].3)).collect();
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

/// The cheapest plan for sequences of `lengths` (ascending): runs of
/// consecutive sequences, each costing its rows times its padded length plus
/// a call. `start[hi]` is where the last run of the cheapest plan for the
/// `hi` shortest begins. A run ending at `hi` pads to one length and holds
/// at most its bucket's batch within the token budget, so its best start is
/// the least `cheapest[j] - j * seq` over a sliding window of starts, which
/// a deque keeps in O(1) a step. Trying every row count for every end cost
/// n x 256 steps: 1.41 ms a plan of 4,600 waiting sequences on a 2-core EPYC
/// (about 2 ms on a GPU host in bulk, on the dispatcher's thread while
/// sessions waited), against 0.083. Ties go to the shortest run, as before.
fn cheapest_runs(policy: &BatchPolicy, lengths: &[usize]) -> Vec<usize> {
    if !policy.row_counts.is_empty() {
        return cheapest_runs_in_row_steps(policy, lengths);
    }
    let n = lengths.len();
    let mut cheapest = vec![0i64; n + 1];
    let mut start = vec![0usize; n + 1];
    // Starts in reach, their `cheapest[j] - j * seq` ascending front to back.
    let mut window: std::collections::VecDeque<usize> = std::collections::VecDeque::new();
    let mut shape = None;
    for hi in 1..=n {
        let longest = lengths[hi - 1];
        let bucket = policy.bucket_of(longest);
        let seq = policy.dispatch_len(bucket, longest);
        let rows = policy.rows_at(bucket, seq).min(hi);
        let first = hi - rows;
        // A new length or bucket: every start in reach, valued at the new seq.
        let fresh = shape != Some((bucket, seq));
        if fresh {
            shape = Some((bucket, seq));
            window.clear();
        }
        let value = |j: usize| cheapest[j] - (j * seq) as i64;
        let mut push = |j: usize| {
            while window.back().is_some_and(|&b| value(b) >= value(j)) {
                window.pop_back();
            }
            window.push_back(j);
        };
        if fresh {
            (first..hi).for_each(&mut push);
        } else {
            push(hi - 1);
        }
        while window.front().is_some_and(|&j| j < first) {
            window.pop_front();
        }
        let best = *window.front().expect("the window holds hi - 1");
        cheapest[hi] = value(best) + (hi * seq + policy.call_cost_tokens) as i64;
        start[hi] = best;
    }
    start
}

/// `cheapest_runs` for an engine that pads a batch's rows up to its next row
/// count (`BatchPolicy::row_counts`; a GPU, which runs few shapes): a run
/// costs the rows it runs, not the rows it holds. A run between two row
/// counts costs as much as one that reaches the upper, which holds more of
/// the shorter sequences below it and leaves fewer for the runs before, so
/// only runs of a row count (or of the bucket's batch, or of everything
/// waiting) are tried: about 13 a step. The rows' padding had been left out
/// of the plan: one text a request came as batches of 64 rows on average,
/// and a run of 33 to 63 ran as 64.
fn cheapest_runs_in_row_steps(policy: &BatchPolicy, lengths: &[usize]) -> Vec<usize> {
    let n = lengths.len();
    let mut cheapest = vec![0i64; n + 1];
    let mut start = vec![0usize; n + 1];
    for hi in 1..=n {
        let longest = lengths[hi - 1];
        let bucket = policy.bucket_of(longest);
        let seq = policy.dispatch_len(bucket, longest);
        let most = policy.rows_at(bucket, seq).min(hi);
        let mut best: Option<(i64, usize)> = None;
        // Ascending, so that ties go to the shortest run.
        for rows in policy.row_counts.iter().map(|&r| r.min(most)).chain([most]) {
            let cost = cheapest[hi - rows] + (policy.rows_run(rows) * seq + policy.call_cost_tokens) as i64;
            if best.is_none_or(|(least, _)| cost < least) {
                best = Some((cost, hi - rows));
            }
        }
        let (cost, first) = best.expect("one row count at least");
        cheapest[hi] = cost;
        start[hi] = first;
    }
    start
}

/// How long an idle device waits for a batch to fill before it runs what has
/// arrived. When a batch's answers go out, the clients that sent them tend to
/// send again within a millisecond or so (Open WebUI: one text a request, many
/// at once); running the first that arrives alone leaves the others for the
/// next call, and batches swing between one row and many. So after answering
/// `answered` jobs the device waits for as many to queue, but never longer
/// than a quarter of its last call (capped at `FILL_WAIT_CAP`); a server
/// that answered nothing within its last call's time (an idle one) never
/// waits, so the first request after a burst is not held back either.
#[derive(Debug, Clone, Default)]
pub struct FillWait {
    /// Jobs answered by the last call; as many are expected back.
    expected: usize,
    answered_at: Option<Instant>,
    last_call: Duration,
    until: Option<Instant>,
}

/// The longest a device waits for a batch to fill.
pub const FILL_WAIT_CAP: Duration = Duration::from_millis(20);

impl FillWait {
    /// A call that took `took` answered `answered` jobs at `now`.
    pub fn answered(&mut self, answered: usize, took: Duration, now: Instant) {
        self.expected = answered;
        self.answered_at = Some(now);
        self.last_call = took;
        self.until = None;
    }

    /// With `queued` jobs waiting at `now`: how long to wait for more before
    /// planning a batch, or `None` to plan now.
    pub fn wait(&mut self, queued: usize, now: Instant) -> Option<Duration> {
        let recent = self.answered_at.is_some_and(|at| now.saturating_duration_since(at) <= self.last_call);
        if queued == 0 || queued >= self.expected || !recent {
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

/// Batches of one model a GPU runs at once when the queue holds less than a
/// full batch: four. Two kept batches large while padded rows made small
/// ones dear; with batches priced at the rows they run, four sessions of
/// all-MiniLM-L6-v2 on an H100 served one text a request at 64 in flight
/// 1.21-1.30x faster with three or four (p99 6.1-6.8 ms against 8.9-9.3),
/// and the same at 256 and 480 and in bulk.
pub const SMALL_BATCHES_PER_CARD: usize = 4;

/// Sequences that make a batch worth starting beside others on a busy card:
/// half the largest batch the buckets allow (rows, or rows of its longest
/// sequences within the token budget).
pub fn full_rows(policy: &BatchPolicy) -> usize {
    let rows = policy.buckets.iter().map(|b| b.max_batch.min(policy.max_batch_tokens / b.max_tokens.max(1)).max(1)).max().unwrap_or(1);
    rows.div_ceil(2)
}

/// Which of the idle devices takes the next batch: the one whose card runs
/// fewest of the model's batches. `card[d]` groups the sessions that share
/// one GPU (`None`: CPU engines, which have cores of their own). With little
/// queued, sessions on one card would split it into small batches that each
/// pay a GPU call's fixed cost (8 sessions on an H200 served one text a
/// request at 0.40 of their bulk rate, 2 sessions at 0.91): a card that
/// already runs `SMALL_BATCHES_PER_CARD` takes another only when `share`
/// (what waits is worth a batch beside the others: see `worth_sharing`).
/// `None`: nothing starts now.
pub fn pick_idle(idle: &[usize], card: &[Option<usize>], share: bool) -> Option<usize> {
    let running = |d: usize| card[d].map_or(0, |c| (0..card.len()).filter(|&o| card[o] == Some(c) && !idle.contains(&o)).count());
    // Among equals the device freed last, whose caches are warm.
    let (slot, busy) = idle.iter().enumerate().rev().map(|(slot, &d)| (slot, running(d))).min_by_key(|&(_, busy)| busy)?;
    (busy < SMALL_BATCHES_PER_CARD || share).then_some(slot)
}

/// Whether what waits deserves a batch beside others on a busy card: a full
/// batch (`full_rows`), or the rest of a request whose other sequences are
/// already running. Bulk requests' last sequences would otherwise wait for
/// the card while their requests, and the clients behind them, wait too.
pub fn worth_sharing(waiting: usize, full: usize, rest_of_a_running_request: bool) -> bool {
    waiting >= full || rest_of_a_running_request
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_busy_card_takes_another_batch_only_when_a_full_one_waits() {
        // Six sessions on card 0, two on card 1, one CPU engine.
        let card = [Some(0), Some(0), Some(0), Some(0), Some(0), Some(0), Some(1), Some(1), None];
        // Card 0 runs four (devices 0 to 3); card 1 runs one (device 6); the CPU engine is idle.
        assert_eq!(SMALL_BATCHES_PER_CARD, 4);
        assert_eq!(pick_idle(&[4, 5, 7], &card, false), Some(2), "device 7: its card runs one");
        assert_eq!(pick_idle(&[4, 5], &card, false), None, "card 0 runs four and little waits");
        assert_eq!(pick_idle(&[4, 5], &card, true), Some(1), "worth a batch: a fifth starts, on the device freed last");
        assert_eq!(pick_idle(&[8, 4, 5], &card, false), Some(0), "a CPU engine never waits for a card");
        assert_eq!(pick_idle(&[], &card, true), None);
        assert!(worth_sharing(64, 64, false) && worth_sharing(1, 64, true) && !worth_sharing(63, 64, false));
    }

    #[test]
    fn a_full_batch_is_half_the_largest_the_buckets_allow() {
        let mut p = policy(&[(64, 256), (128, 256), (256, 256)], Order::Sorted);
        p.max_batch_tokens = 65_536;
        assert_eq!(full_rows(&p), 128);
        p.max_batch_tokens = 16_384;
        assert_eq!(full_rows(&p), 128, "the 64-token bucket still holds 256 rows");
        p.buckets = vec![Bucket { max_tokens: 512, max_batch: 64 }];
        assert_eq!(full_rows(&p), 16, "16,384 tokens hold 32 rows of 512");
    }

    #[test]
    fn an_idle_server_never_waits_to_fill_a_batch() {
        let mut wait = FillWait::default();
        let now = Instant::now();
        assert_eq!(wait.wait(1, now), None, "nothing answered yet: run at once");
        wait.answered(1, Duration::from_millis(200), now);
        assert_eq!(wait.wait(1, now), None, "one answered, one back: run at once");
        wait.answered(32, Duration::from_millis(40), now);
        let later = now + Duration::from_millis(41);
        assert_eq!(wait.wait(1, later), None, "the last answers are older than the last call took: an idle server");
    }

    #[test]
    fn after_answering_many_a_device_waits_a_bounded_moment_for_them() {
        let mut wait = FillWait::default();
        let now = Instant::now();
        wait.answered(32, Duration::from_millis(40), now);
        assert_eq!(wait.wait(3, now), Some(Duration::from_millis(10)), "a quarter of the last call");
        assert_eq!(wait.wait(20, now + Duration::from_millis(4)), Some(Duration::from_millis(6)), "the same deadline");
        assert_eq!(wait.wait(32, now + Duration::from_millis(5)), None, "all back: run");
        wait.answered(32, Duration::from_secs(2), now);
        assert_eq!(wait.wait(1, now), Some(FILL_WAIT_CAP), "never longer than the cap");
        assert_eq!(wait.wait(1, now + FILL_WAIT_CAP), None, "the deadline passed: run what came");
        assert_eq!(wait.wait(1, now + FILL_WAIT_CAP), None, "and no second wait before the next answers");
        assert_eq!(wait.wait(0, now), None, "nothing queued: nothing to wait for");
    }
    use super::*;
    use eeane_backend_core::CPU_CALL_COST_TOKENS;

    fn policy(buckets: &[(usize, usize)], order: Order) -> BatchPolicy {
        BatchPolicy {
            buckets: buckets.iter().map(|&(max_tokens, max_batch)| Bucket { max_tokens, max_batch }).collect(),
            max_batch_tokens: 100_000,
            pad_to_multiple_of: 8,
            pad_to_bucket: false,
            order,
            call_cost_tokens: CPU_CALL_COST_TOKENS,
            row_counts: Vec::new(),
        }
    }

    /// Every row count tried for every end: the plan `cheapest_runs` must match.
    fn cheapest_runs_by_trying_every_run(policy: &BatchPolicy, lengths: &[usize]) -> Vec<usize> {
        let n = lengths.len();
        let mut cheapest = vec![0usize; n + 1];
        let mut start = vec![0usize; n + 1];
        for hi in 1..=n {
            let bucket = policy.bucket_of(lengths[hi - 1]);
            let seq = policy.dispatch_len(bucket, lengths[hi - 1]);
            cheapest[hi] = usize::MAX;
            for rows in 1..=policy.buckets[bucket].max_batch.max(1).min(hi) {
                if rows > 1 && rows * seq > policy.max_batch_tokens {
                    break;
                }
                let cost = cheapest[hi - rows] + policy.rows_run(rows) * seq + policy.call_cost_tokens;
                if cost < cheapest[hi] {
                    (cheapest[hi], start[hi]) = (cost, hi - rows);
                }
            }
        }
        start
    }

    /// What a plan (`start` of `cheapest_runs`) costs: the rows each run
    /// runs with, times its length, plus a call each.
    fn plan_cost(policy: &BatchPolicy, lengths: &[usize], start: &[usize]) -> usize {
        let (mut hi, mut cost) = (lengths.len(), 0);
        while hi > 0 {
            let bucket = policy.bucket_of(lengths[hi - 1]);
            let rows = hi - start[hi];
            assert!(rows >= 1 && rows <= policy.rows_at(bucket, policy.dispatch_len(bucket, lengths[hi - 1])), "a run within its bucket's batch");
            cost += policy.rows_run(rows) * policy.dispatch_len(bucket, lengths[hi - 1]) + policy.call_cost_tokens;
            hi = start[hi];
        }
        cost
    }

    #[test]
    fn the_sliding_window_plan_is_the_plan_of_every_run_tried() {
        let mut state: u64 = 7;
        let mut next = |below: u64| {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (state >> 33) % below
        };
        for case in 0..300 {
            let mut p = policy(&[(64, 256), (128, 128), (512, 32)], Order::Sorted);
            p.pad_to_multiple_of = [1, 8, 16, 32][case % 4];
            p.call_cost_tokens = [0, 128, 1024][case % 3];
            p.max_batch_tokens = [100_000, 65_536, 8_192, 300][case % 4];
            let n = 1 + next(if case % 10 == 0 { 3000 } else { 300 }) as usize;
            let mut lengths: Vec<usize> = (0..n).map(|_| 1 + next(if case % 2 == 0 { 600 } else { 40 }) as usize).collect();
            lengths.sort_unstable();
            assert_eq!(cheapest_runs(&p, &lengths), cheapest_runs_by_trying_every_run(&p, &lengths), "case {case}: {n} sequences");
            // An engine that pads rows up to its row counts (a GPU's: powers
            // of two to 32, then steps of 32; or coarser). Runs of equal cost
            // may differ: the plans must cost the same.
            p.row_counts = if case % 2 == 0 { vec![1, 2, 4, 8, 16, 32, 64, 96, 128, 160, 192, 224, 256] } else { vec![8, 64, 256] };
            let (planned, tried) = (cheapest_runs(&p, &lengths), cheapest_runs_by_trying_every_run(&p, &lengths));
            assert_eq!(plan_cost(&p, &lengths, &planned), plan_cost(&p, &lengths, &tried), "case {case} in row counts: {n} sequences");
        }
    }

    #[test]
    fn a_gpu_plan_fills_the_rows_it_pays_for() {
        // One text a request on a GPU: 48 texts of 100 tokens and 48 of 160.
        // Two runs of 48 pad least (5,376 + 7,680 tokens), but each runs as
        // 64 rows (7,168 + 10,240). Runs of 32 and 64, the 16 texts of 100
        // beyond 32 padded to 160, run 3,584 + 10,240, every row real.
        let mut p = BatchPolicy { pad_to_multiple_of: 16, call_cost_tokens: 1024, ..policy(&[(64, 256), (128, 256), (256, 256)], Order::Sorted) };
        let lengths: Vec<usize> = [100; 48].into_iter().chain([160; 48]).collect();
        let batches = |p: &BatchPolicy| {
            let mut pool = Pool::default();
            for (job, &len) in lengths.iter().enumerate() {
                pool.add(job as u64, vec![len], Order::Sorted);
            }
            drain(&mut pool, p).into_iter().map(|b| (b.items.len(), b.seq)).collect::<Vec<_>>()
        };
        assert_eq!(batches(&p), vec![(48, 112), (48, 160)], "rows that run as held: two runs of 48");
        p.row_counts = vec![1, 2, 4, 8, 16, 32, 64, 96, 128, 160, 192, 224, 256];
        assert_eq!(batches(&p), vec![(32, 112), (64, 160)], "rows padded up to a row count: runs of 32 and 64");
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

    /// Each batch as its rows' lengths and its padded length, in order.
    fn lens_and_seq(batches: Vec<Planned>, len_of: impl Fn(u64, usize) -> usize) -> Vec<(Vec<usize>, usize)> {
        let mut batches: Vec<(Vec<usize>, usize)> = batches.into_iter().map(|b| (b.items.iter().map(|&(j, i)| len_of(j, i)).collect(), b.seq)).collect();
        batches.sort();
        batches
    }

    #[test]
    fn a_costly_call_keeps_batches_whole_across_length_steps() {
        // 256 texts of 1 to 256 tokens, lengths in steps of 16: at the CPU's
        // 128 tokens a call, saving padding is worth a call at every step
        // (16 calls); at a GPU's 1,024 they run in 6 fuller batches that pad
        // about 10 % more.
        let lens: Vec<usize> = (1..=256).collect();
        let plan = |cost| {
            let p = BatchPolicy { pad_to_multiple_of: 16, call_cost_tokens: cost, ..policy(&[(256, 256)], Order::Sorted) };
            let mut pool = Pool::default();
            pool.add(1, lens.clone(), Order::Sorted);
            let batches = drain(&mut pool, &p);
            let padded: usize = batches.iter().map(|b| b.items.len() * b.seq).sum();
            (batches.len(), padded)
        };
        let (cpu_calls, cpu_padded) = plan(CPU_CALL_COST_TOKENS);
        let (gpu_calls, gpu_padded) = plan(1024);
        assert!(gpu_calls * 2 <= cpu_calls, "{gpu_calls} calls at 1,024 tokens a call, {cpu_calls} at 128");
        assert!(gpu_padded > cpu_padded, "fewer calls pad more: {gpu_padded} against {cpu_padded} tokens");
    }

    #[test]
    fn batches_pad_little_and_round_up_to_eight() {
        let p = policy(&[(16, 8), (64, 8)], Order::Sorted);
        let mut pool = Pool::default();
        let lens = vec![3, 60, 10, 17, 5];
        pool.add(1, lens.clone(), Order::Sorted);
        // 17 takes the short ones from the lower bucket into one call at 24:
        // padding them costs less than a second call. With 60 they would pad
        // 4 rows by 40 tokens or more.
        assert_eq!(lens_and_seq(drain(&mut pool, &p), |_, i| lens[i]), vec![(vec![3, 5, 10, 17], 24), (vec![60], 64)]);
    }

    #[test]
    fn a_batch_takes_shorter_rows_from_lower_buckets_up_to_its_own_batch_size() {
        // Single texts from many clients: a few in each bucket. A call each
        // would cost more than padding the shorter ones a little.
        let lens = vec![20, 22, 23, 30, 33, 38, 50, 55, 60, 62, 63];
        let plan = |top_batch| {
            let p = policy(&[(24, 64), (40, 64), (64, top_batch)], Order::Sorted);
            let mut pool = Pool::default();
            for (job, &len) in lens.iter().enumerate() {
                pool.add(job as u64, vec![len], Order::Sorted);
            }
            lens_and_seq(drain(&mut pool, &p), |job, _| lens[job as usize])
        };
        assert_eq!(plan(8), vec![(vec![20, 22, 23, 30, 33, 38], 40), (vec![50, 55, 60, 62, 63], 64)]);
        // The top bucket runs at most 4 rows, whatever their length.
        assert_eq!(plan(4), vec![(vec![20, 22, 23, 30, 33, 38], 40), (vec![50, 55], 56), (vec![60, 62, 63], 64)]);
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
    fn a_request_that_came_first_finishes_first() {
        // The second request comes when the sweep has run the first's 32
        // shortest: the first's others and the second's as long run next,
        // the second's short ones on the next round. Taking the longest
        // first left both requests' short ones to the end, together.
        let p = policy(&[(64, 8)], Order::Sorted);
        let mut pool = Pool::default();
        pool.add(1, (1..=64).collect(), Order::Sorted);
        let mut batches: Vec<Planned> = (0..4).map(|_| pool.next_batch(&p).unwrap()).collect();
        pool.add(2, (1..=64).collect(), Order::Sorted);
        batches.extend(drain(&mut pool, &p));
        let last_of = |job| batches.iter().rposition(|b| b.items.iter().any(|&(j, _)| j == job)).unwrap();
        assert_eq!(last_of(2), batches.len() - 1);
        assert!(last_of(1) + 3 <= last_of(2), "the first request's last batch {} of {}", last_of(1), batches.len());
    }

    #[test]
    fn a_starving_request_runs_whole_when_its_texts_fit_the_batch_length() {
        // The sweep has passed the short lengths when a request of 5 and 7
        // tokens comes, just before one of many texts of 5 to 8: the run
        // that holds the first one's 5 ends before its 7.
        let p = policy(&[(16, 8), (256, 4)], Order::Sorted);
        let mut pool = Pool::default();
        pool.add(1, vec![200; 64], Order::Sorted);
        let first = pool.next_batch(&p).unwrap();
        assert!(first.items.iter().all(|&(j, _)| j == 1));
        pool.add(2, vec![5, 7], Order::Sorted);
        pool.add(3, (0..64).map(|i| 5 + i % 4).collect(), Order::Sorted);
        let batches: Vec<Planned> = (0..=STARVATION_LIMIT).map(|_| pool.next_batch(&p).unwrap()).collect();
        let served = batches.iter().find(|b| b.items.iter().any(|&(j, _)| j == 2)).expect("served within the limit");
        assert!(served.items.contains(&(2, 0)) && served.items.contains(&(2, 1)), "both texts in one batch: {served:?}");
        assert_eq!(served.seq, 8, "at the run's own length");
        assert_eq!(served.items.len(), 8, "full");
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
