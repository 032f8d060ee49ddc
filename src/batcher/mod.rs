//! The engine worker: one thread per loaded model owns the engine, takes jobs
//! from a channel, forms batches, runs them and pools the result. Inference
//! never runs on the async runtime.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Instant;

use eeane_backend_core::{EngineError, EngineInfo, EngineLoader, EngineOutput, EngineSpec, TokenBatch};
use tokio::sync::oneshot;

use crate::config::Pooling;
use crate::pooling::{normalize, pool};
use crate::tokenize::Encoded;

/// What the worker does with engine output, and how it forms batches.
#[derive(Debug, Clone)]
pub struct Pipeline {
    pub pooling: Pooling,
    pub normalize: bool,
    pub max_batch: usize,
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

/// A handle to a running engine thread; dropping the last handle stops the
/// thread and drops (unloads) the engine.
pub struct EngineWorker {
    jobs: mpsc::Sender<Job>,
    info: EngineInfo,
}

impl EngineWorker {
    /// Loads the engine on a new thread and waits until it is ready.
    pub async fn start(name: &str, loader: EngineLoader, spec: EngineSpec, pipeline: Pipeline) -> Result<Self, EngineError> {
        let (jobs, queue) = mpsc::channel::<Job>();
        let (ready_tx, ready_rx) = oneshot::channel();
        std::thread::Builder::new()
            .name(format!("engine-{name}"))
            .spawn(move || {
                let mut engine = match loader(&spec) {
                    Ok(engine) => engine,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                let _ = ready_tx.send(Ok(engine.info().clone()));
                for job in queue {
                    // Skip jobs whose request gave up (queue_timeout) or went away.
                    if job.reply.is_closed() || job.claim.compare_exchange(QUEUED, STARTED, Ordering::AcqRel, Ordering::Acquire).is_err() {
                        continue;
                    }
                    let result = catch_unwind(AssertUnwindSafe(|| run_job(&mut *engine, &pipeline, &job.seqs)))
                        .unwrap_or_else(|_| Err(EngineError::Inference("the engine panicked".into())));
                    let _ = job.reply.send(result);
                }
                drop(engine);
                release_freed_memory();
            })
            .map_err(|e| EngineError::Runtime(format!("cannot start the engine thread: {e}")))?;
        let info = ready_rx.await.map_err(|_| EngineError::Runtime("the engine thread died while loading".into()))??;
        Ok(Self { jobs, info })
    }

    pub fn info(&self) -> &EngineInfo {
        &self.info
    }

    /// Embeds `seqs`, returning one vector per sequence in the same order. If
    /// the engine has not taken the job by `deadline`, gives up with `QueueTimeout`;
    /// once it has, the job runs to the end.
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

/// Runs `seqs` in batches of similar length (sorted, so little padding), and
/// returns their vectors in input order.
fn run_job(engine: &mut dyn eeane_backend_core::Engine, pipeline: &Pipeline, seqs: &[Encoded]) -> Result<Vec<Vec<f32>>, EngineError> {
    let mut order: Vec<usize> = (0..seqs.len()).collect();
    order.sort_by_key(|&i| seqs[i].ids.len());
    let mut out = vec![Vec::new(); seqs.len()];
    for chunk in order.chunks(pipeline.max_batch) {
        let rows: Vec<(&[i64], Option<&[i64]>)> =
            chunk.iter().map(|&i| (seqs[i].ids.as_slice(), Some(seqs[i].type_ids.as_slice()))).collect();
        let seq = rows.iter().map(|(ids, _)| ids.len()).max().unwrap_or(0);
        let batch = TokenBatch::from_rows(&rows, seq, pipeline.pad_id);
        let vectors = pool_output(engine.run(&batch)?, &batch, pipeline)?;
        for (&i, v) in chunk.iter().zip(vectors) {
            out[i] = v;
        }
    }
    Ok(out)
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
    use eeane_backend_core::{Engine, InputShapes};

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
            accelerated_layers: None,
            runtime_version: None,
        })))
    }

    #[tokio::test]
    async fn vectors_come_back_in_input_order_across_batches() {
        let pipeline = Pipeline { pooling: Pooling::Mean, normalize: false, max_batch: 2, pad_id: 0 };
        let worker = EngineWorker::start("echo", echo, EngineSpec::default(), pipeline).await.unwrap();
        let seqs: Vec<Encoded> = [vec![4, 4, 4, 4], vec![2], vec![6, 8], vec![10, 10, 10]]
            .into_iter()
            .map(|ids| Encoded { type_ids: vec![0; ids.len()], ids })
            .collect();
        let got = worker.embed(seqs, None).await.unwrap();
        assert_eq!(got, vec![vec![4.0, 1.0], vec![2.0, 1.0], vec![7.0, 1.0], vec![10.0, 1.0]]);
    }
}
