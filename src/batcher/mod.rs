//! The engine worker: one thread per loaded model owns the engine, gathers the
//! sequences of every request waiting for it, plans batches across requests
//! (see `plan`), runs them, pools the output and hands each request its
//! vectors in input order. Inference never runs on the async runtime.

mod plan;

use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Instant;

use eeane_backend_core::{Engine, EngineError, EngineInfo, EngineLoader, EngineOutput, EngineSpec, InputShapes, TokenBatch};
use tokio::sync::oneshot;

pub use plan::{BatchPolicy, Bucket, Order, Planned, Pool};

use crate::config::Pooling;
use crate::pooling::{normalize, pool};
use crate::tokenize::Encoded;

/// What the worker does with engine output, and how it forms batches.
#[derive(Debug, Clone)]
pub struct Pipeline {
    pub pooling: Pooling,
    pub normalize: bool,
    pub policy: BatchPolicy,
    pub pad_id: i64,
}

#[derive(Debug, Clone, thiserror::Error)]
pub enum WorkerError {
    #[error(transparent)]
    Engine(#[from] EngineError),
    /// The job waited past its deadline before the engine took it.
    #[error("the request waited longer than queue_timeout before its inference started")]
    QueueTimeout,
}

type Reply = oneshot::Sender<Result<Vec<Vec<f32>>, EngineError>>;

/// Who owns a queued job: the engine (started) or the waiting request (abandoned).
const QUEUED: u8 = 0;
const STARTED: u8 = 1;
const ABANDONED: u8 = 2;

struct Job {
    seqs: Vec<Encoded>,
    reply: Reply,
    claim: Arc<AtomicU8>,
}

/// Engine calls and their shape, for /health and `eeane bench`.
#[derive(Debug, Default)]
pub struct WorkerStats {
    pub batches: AtomicU64,
    pub rows: AtomicU64,
    /// Tokens the engine computed, padding included.
    pub padded_tokens: AtomicU64,
    /// Tokens of the sequences themselves.
    pub real_tokens: AtomicU64,
}

/// A handle to a running engine thread; dropping the last handle stops the
/// thread and drops (unloads) the engine.
pub struct EngineWorker {
    jobs: mpsc::Sender<Job>,
    info: EngineInfo,
    pub stats: Arc<WorkerStats>,
}

impl EngineWorker {
    /// Loads the engine on a new thread and waits until it is ready.
    pub async fn start(name: &str, loader: EngineLoader, spec: EngineSpec, pipeline: Pipeline) -> Result<Self, EngineError> {
        let (jobs, queue) = mpsc::channel::<Job>();
        let (ready_tx, ready_rx) = oneshot::channel();
        let stats = Arc::new(WorkerStats::default());
        let thread_stats = stats.clone();
        std::thread::Builder::new()
            .name(format!("engine-{name}"))
            .spawn(move || {
                let engine = match loader(&spec) {
                    Ok(engine) => engine,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                let _ = ready_tx.send(Ok(engine.info().clone()));
                serve_jobs(engine, pipeline, queue, &thread_stats);
                release_freed_memory();
            })
            .map_err(|e| EngineError::Runtime(format!("cannot start the engine thread: {e}")))?;
        let info = ready_rx.await.map_err(|_| EngineError::Runtime("the engine thread died while loading".into()))??;
        Ok(Self { jobs, info, stats })
    }

    pub fn info(&self) -> &EngineInfo {
        &self.info
    }

    /// Embeds `seqs`, returning one vector per sequence in the same order. If
    /// the engine has not started on the job by `deadline`, gives up with
    /// `QueueTimeout`; once it has, the job runs to the end.
    pub async fn embed(&self, seqs: Vec<Encoded>, deadline: Option<Instant>) -> Result<Vec<Vec<f32>>, WorkerError> {
        let stopped = || WorkerError::Engine(EngineError::Runtime("the engine thread has stopped".into()));
        let (reply, mut answer) = oneshot::channel();
        let claim = Arc::new(AtomicU8::new(QUEUED));
        self.jobs.send(Job { seqs, reply, claim: claim.clone() }).map_err(|_| stopped())?;
        if let Some(deadline) = deadline {
            if let Ok(result) = tokio::time::timeout_at(deadline.into(), &mut answer).await {
                return Ok(result.map_err(|_| stopped())??);
            }
            if claim.compare_exchange(QUEUED, ABANDONED, Ordering::AcqRel, Ordering::Acquire).is_ok() {
                return Err(WorkerError::QueueTimeout);
            }
        }
        Ok(answer.await.map_err(|_| stopped())??)
    }
}

/// A request in the worker: its sequences and the vectors computed so far.
struct Active {
    job: Job,
    vectors: Vec<Vec<f32>>,
    left: usize,
    started: bool,
}

/// The worker loop: take every job that has arrived, plan one batch across
/// them, run it, deliver finished jobs; block only when nothing is waiting.
fn serve_jobs(mut engine: Box<dyn Engine>, mut pipeline: Pipeline, queue: mpsc::Receiver<Job>, stats: &WorkerStats) {
    if matches!(engine.info().shapes, InputShapes::Fixed(_)) {
        pipeline.policy.pad_to_bucket = true;
    }
    if pipeline.policy.pad_to_multiple_of == 0 {
        pipeline.policy.pad_to_multiple_of = engine.info().seq_multiple.max(1);
    }
    let mut pool = Pool::default();
    let mut active: HashMap<u64, Active> = HashMap::new();
    let mut next_id = 0u64;
    let mut admit = |job: Job, pool: &mut Pool, active: &mut HashMap<u64, Active>| {
        next_id += 1;
        let lens = job.seqs.iter().map(|s| s.ids.len()).collect();
        pool.add(next_id, lens, pipeline.policy.order);
        let left = job.seqs.len();
        active.insert(next_id, Active { vectors: vec![Vec::new(); left], left, started: false, job });
    };
    loop {
        if pool.is_empty() {
            match queue.recv() {
                Ok(job) => admit(job, &mut pool, &mut active),
                Err(_) => break,
            }
        }
        while let Ok(job) = queue.try_recv() {
            admit(job, &mut pool, &mut active);
        }
        // Forget requests that went away, or gave up (queue_timeout) before starting.
        active.retain(|&id, a| {
            let keep = !a.job.reply.is_closed() && (a.started || a.job.claim.load(Ordering::Acquire) == QUEUED);
            if !keep {
                pool.remove(id);
            }
            keep
        });
        let Some(mut planned) = pool.next_batch(&pipeline.policy) else { continue };
        planned.items.retain(|(id, _)| match active.get_mut(id) {
            Some(a) if a.started => true,
            Some(a) => {
                a.started = a.job.claim.compare_exchange(QUEUED, STARTED, Ordering::AcqRel, Ordering::Acquire).is_ok();
                a.started
            }
            None => false,
        });
        if planned.items.is_empty() {
            continue;
        }
        let result = catch_unwind(AssertUnwindSafe(|| run_batch(&mut *engine, &pipeline, &active, &planned, stats)))
            .unwrap_or_else(|_| Err(EngineError::Inference("the engine panicked".into())));
        match result {
            Ok(vectors) => {
                for (&(id, index), vector) in planned.items.iter().zip(vectors) {
                    let a = active.get_mut(&id).expect("planned job is active");
                    a.vectors[index] = vector;
                    a.left -= 1;
                    if a.left == 0 {
                        let done = active.remove(&id).expect("active");
                        let _ = done.job.reply.send(Ok(done.vectors));
                    }
                }
            }
            Err(e) => {
                for &(id, _) in &planned.items {
                    if let Some(failed) = active.remove(&id) {
                        pool.remove(id);
                        let _ = failed.job.reply.send(Err(e.clone()));
                    }
                }
            }
        }
    }
    drop(engine);
}

fn run_batch(
    engine: &mut dyn Engine,
    pipeline: &Pipeline,
    active: &HashMap<u64, Active>,
    planned: &Planned,
    stats: &WorkerStats,
) -> Result<Vec<Vec<f32>>, EngineError> {
    let rows: Vec<(&[i64], Option<&[i64]>)> = planned
        .items
        .iter()
        .map(|(id, index)| {
            let seq = &active[id].job.seqs[*index];
            (seq.ids.as_slice(), Some(seq.type_ids.as_slice()))
        })
        .collect();
    let batch = TokenBatch::from_rows(&rows, planned.seq, pipeline.pad_id);
    stats.batches.fetch_add(1, Ordering::Relaxed);
    stats.rows.fetch_add(batch.batch as u64, Ordering::Relaxed);
    stats.padded_tokens.fetch_add((batch.batch * batch.seq) as u64, Ordering::Relaxed);
    stats.real_tokens.fetch_add(batch.lengths.iter().sum::<usize>() as u64, Ordering::Relaxed);
    pool_output(engine.run(&batch)?, &batch, pipeline)
}

fn pool_output(output: EngineOutput, batch: &TokenBatch, pipeline: &Pipeline) -> Result<Vec<Vec<f32>>, EngineError> {
    let mut vectors: Vec<Vec<f32>> = match (output, pipeline.pooling) {
        (EngineOutput::Pooled { data, dim, .. }, Pooling::None) => data.chunks_exact(dim).map(<[f32]>::to_vec).collect(),
        (EngineOutput::Hidden { data, seq, dim, .. }, pooling @ (Pooling::Mean | Pooling::Cls)) => data
            .chunks_exact(seq * dim)
            .zip(&batch.lengths)
            .map(|(states, &len)| pool(states, dim, len, pooling))
            .collect(),
        (EngineOutput::Pooled { .. }, p) => {
            return Err(EngineError::Model(format!("the graph returns pooled vectors, but the model is configured with pooling = {p:?}; use pooling = \"none\"")))
        }
        (EngineOutput::Hidden { .. }, _) => {
            return Err(EngineError::Model("the graph returns token states, but the model is configured with pooling = \"none\"".into()))
        }
    };
    // A NaN or infinity is never a vector the model means: fail loudly instead.
    if let Some(row) = vectors.iter().position(|v| v.iter().any(|x| !x.is_finite())) {
        return Err(EngineError::Inference(format!("the engine produced a non-finite value for row {row} of a batch")));
    }
    if pipeline.normalize {
        vectors.iter_mut().for_each(|v| normalize(v));
    }
    Ok(vectors)
}

/// Hands memory freed by an unloaded engine back to the OS, so that an unload
/// shows in the process's resident size (glibc keeps freed heap otherwise).
fn release_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only walks the allocator's own free lists.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Returns each token's id as its state, so pooling is checkable by hand.
    struct EchoEngine(EngineInfo);

    impl Engine for EchoEngine {
        fn info(&self) -> &EngineInfo {
            &self.0
        }
        fn run(&mut self, b: &TokenBatch) -> Result<EngineOutput, EngineError> {
            let data = b.input_ids.iter().flat_map(|&id| [id as f32, 1.0]).collect();
            Ok(EngineOutput::Hidden { data, batch: b.batch, seq: b.seq, dim: 2 })
        }
    }

    fn echo(_: &EngineSpec) -> Result<Box<dyn Engine>, EngineError> {
        Ok(Box::new(EchoEngine(EngineInfo {
            engine: "echo".into(),
            device: "cpu".into(),
            precision: "fp32".into(),
            shapes: InputShapes::Dynamic,
            takes_token_type_ids: false,
            seq_multiple: 8,
            accelerated_layers: None,
            runtime_version: None,
        })))
    }

    #[tokio::test]
    async fn vectors_come_back_in_input_order_across_batches() {
        let policy = BatchPolicy {
            buckets: vec![Bucket { max_tokens: 16, max_batch: 2 }],
            max_batch_tokens: 1024,
            pad_to_multiple_of: 0,
            pad_to_bucket: false,
            order: Order::Sorted,
        };
        let pipeline = Pipeline { pooling: Pooling::Mean, normalize: false, policy, pad_id: 0 };
        let worker = EngineWorker::start("echo", echo, EngineSpec::default(), pipeline).await.unwrap();
        let seqs: Vec<Encoded> = [vec![4, 4, 4, 4], vec![2], vec![6, 8], vec![10, 10, 10]]
            .into_iter()
            .map(|ids| Encoded { type_ids: vec![0; ids.len()], ids })
            .collect();
        let got = worker.embed(seqs, None).await.unwrap();
        assert_eq!(got, vec![vec![4.0, 1.0], vec![2.0, 1.0], vec![7.0, 1.0], vec![10.0, 1.0]]);
    }
}
