//! The engine worker: per loaded model, one dispatcher thread gathers the
//! sequences of every request waiting for it and plans batches across
//! requests (see `plan`), and one thread per device owns an engine, runs the
//! batches it is handed and pools the output; each request gets its vectors in
//! input order. Several devices pull from the same pool. Inference never runs
//! on the async runtime.

mod plan;

use crate::sync::Recover;
use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use eeane_backend_core::{Backend, DeviceName, Devices, Engine, EngineError, EngineInfo, EngineSpec, InputShapes, TokenBatch};
use tokio::sync::oneshot;

pub use plan::{full_rows, pick_idle, worth_sharing, BatchPolicy, Bucket, FillWait, Order, Planned, Pool};

use crate::config::Pooling;
use crate::cpu_sets::CpuSet;
use crate::engine_host::{EngineProcess, HostedEngine, HostedModel};
use crate::pooling::pool_output;
use crate::tokenize::Encoded;

/// What the worker does with engine output, and how it forms batches.
#[derive(Debug, Clone)]
pub struct Pipeline {
    pub pooling: Pooling,
    pub policy: BatchPolicy,
    pub pad_id: i64,
}

/// Why the engine worker returned no vectors for a job: the engine failed,
/// or the job's deadline passed in the queue (which no engine sees).
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

/// What the dispatcher thread waits for.
enum Event {
    Job(Job),
    /// A device finished a batch: the vectors of `items`, in order.
    Done {
        device: usize,
        items: Vec<(u64, usize)>,
        result: Result<Vec<Vec<f32>>, EngineError>,
    },
    /// The last handle went away: finish what runs, then drop the engines.
    Shutdown,
}

/// A batch for a device thread.
struct Work {
    batch: TokenBatch,
    items: Vec<(u64, usize)>,
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
    /// Sequences waiting for an engine (the model's queue depth).
    pub waiting_sequences: AtomicU64,
    /// Batches per device, in the order the devices loaded.
    pub device_batches: std::sync::Mutex<Vec<u64>>,
    /// Sequences per device, in the same order: an uneven split shows here.
    pub device_rows: std::sync::Mutex<Vec<u64>>,
    /// Each device's engine process (isolation = "process"), by device.
    pub engine_pids: std::sync::Mutex<Vec<Option<u32>>>,
    /// Engine processes started again after they died.
    pub engine_restarts: AtomicU64,
    /// This model's engine threads that hold (or are loading) an engine.
    engines_alive: AtomicUsize,
    /// Its engines that still have idle work to do (a GPU's batch shapes).
    engines_warming: AtomicUsize,
}

/// Counts an engine thread as warming until `done` or the thread's end.
struct Warming(Arc<WorkerStats>, bool);

impl Warming {
    fn done(&mut self) {
        if std::mem::take(&mut self.1) {
            self.0.engines_warming.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

impl Drop for Warming {
    fn drop(&mut self) {
        self.done();
    }
}

/// How a device thread gets its engine.
#[derive(Clone)]
pub enum Launch {
    /// Loaded on the device thread itself.
    Thread(&'static dyn Backend),
    /// In a child process (`eeane engine-host`) that the device thread feeds.
    Process { engine: String },
}

/// A device thread's engine, wherever it runs.
enum Runner {
    Thread(Box<dyn Engine>),
    Process(Box<HostedEngine>),
}

impl Runner {
    /// `host`: for a launch in a process, the process and this engine's session in it.
    fn start(launch: &Launch, host: Option<(Arc<EngineProcess>, u32)>, model: &str, spec: EngineSpec, pipeline: &Pipeline) -> Result<Self, EngineError> {
        match (launch, host) {
            (Launch::Thread(engine), _) => engine.load(&spec).map(Runner::Thread),
            (Launch::Process { engine }, host) => {
                let (process, session) = host.unwrap_or_else(|| (EngineProcess::new(model), 0));
                let hosted = HostedModel { model: model.to_string(), engine: engine.clone(), spec, pooling: pipeline.pooling };
                HostedEngine::start(hosted, process, session).map(|hosted| Runner::Process(Box::new(hosted)))
            }
        }
    }

    fn info(&self) -> &EngineInfo {
        match self {
            Runner::Thread(engine) => engine.info(),
            Runner::Process(hosted) => hosted.info(),
        }
    }

    fn pid(&self) -> Option<u32> {
        match self {
            Runner::Thread(_) => None,
            Runner::Process(hosted) => hosted.pid(),
        }
    }

    /// The engine's idle work, one step: whether more remains.
    fn warm_next(&mut self) -> Result<bool, EngineError> {
        match self {
            Runner::Thread(engine) => catch_unwind(AssertUnwindSafe(|| engine.warm_next()))
                .unwrap_or_else(|_| Err(EngineError::Inference("the engine panicked while warming".into()))),
            Runner::Process(hosted) => hosted.warm_next(),
        }
    }

    /// One vector per row of `batch`, pooled and checked.
    fn run(&mut self, batch: &TokenBatch, pipeline: &Pipeline, who: &str) -> Result<Vec<Vec<f32>>, EngineError> {
        match self {
            Runner::Thread(engine) => catch_unwind(AssertUnwindSafe(|| pool_output(engine.run(batch)?, batch, pipeline.pooling, who)))
                .unwrap_or_else(|_| Err(EngineError::Inference("the engine panicked".into()))),
            Runner::Process(hosted) => hosted.run(batch),
        }
    }
}

/// A handle to a running model: one dispatcher thread that plans batches
/// across requests, and one thread per device that owns an engine. Dropping
/// the handle stops them and drops (unloads) the engines.
pub struct EngineWorker {
    events: mpsc::Sender<Event>,
    info: EngineInfo,
    pub stats: Arc<WorkerStats>,
}

impl Drop for EngineWorker {
    fn drop(&mut self) {
        let _ = self.events.send(Event::Shutdown);
    }
}

/// Engine threads that hold (or are loading) an engine.
static ENGINE_THREADS: AtomicUsize = AtomicUsize::new(0);

/// Waits, up to `limit`, until every engine thread has dropped its engine. The
/// process should not exit before: a runtime's static destructors (ncnn's GPU
/// instance) must not run while an engine still holds what they free.
pub fn wait_for_engines(limit: Duration) {
    let until = Instant::now() + limit;
    while ENGINE_THREADS.load(Ordering::SeqCst) > 0 && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A device thread: loads its engine, then runs the batches it is sent.
struct Device {
    work: mpsc::Sender<Work>,
    info: EngineInfo,
    /// The device as the model names it, for a GPU (sessions named alike share a card).
    card: Option<String>,
}

/// One engine of a model to start: which of the model's devices it is, how
/// it is launched, its spec and its share of the CPUs.
struct EngineStart<'a> {
    model: &'a str,
    /// Its place in the model's device list.
    position: usize,
    launch: Launch,
    /// In a process: the process, shared by the model's sessions on one
    /// GPU, and this engine's session in it.
    host: Option<(Arc<EngineProcess>, u32)>,
    spec: EngineSpec,
    cpus: Option<CpuSet>,
}

/// A device thread that is loading its engine.
struct LoadingDevice {
    work: mpsc::Sender<Work>,
    ready: mpsc::Receiver<Result<EngineInfo, EngineError>>,
    place: mpsc::Sender<usize>,
}

impl LoadingDevice {
    /// Waits until the engine has loaded, then gives the device its place
    /// among the model's loaded devices.
    fn ready(self, place: usize, device: &DeviceName) -> Result<Device, EngineError> {
        let info = self.ready.recv().map_err(|_| EngineError::Runtime("the engine thread died while loading".into()))??;
        let _ = self.place.send(place);
        Ok(Device { work: self.work, info, card: (!device.is_cpu()).then(|| device.to_string()) })
    }
}

fn start_device(engine: EngineStart<'_>, pipeline: Pipeline, events: mpsc::Sender<Event>, stats: Arc<WorkerStats>) -> Result<LoadingDevice, EngineError> {
    let EngineStart { model: name, position, launch, host, spec, cpus } = engine;
    let (work, queue) = mpsc::channel::<Work>();
    let (ready_tx, ready_rx) = mpsc::channel();
    let (place, place_rx) = mpsc::channel::<usize>();
    let model = name.to_string();
    ENGINE_THREADS.fetch_add(1, Ordering::SeqCst);
    stats.engines_alive.fetch_add(1, Ordering::SeqCst);
    stats.engines_warming.fetch_add(1, Ordering::SeqCst);
    let counted = stats.clone();
    std::thread::Builder::new()
        .name(format!("engine-{name}-{position}"))
        .spawn(move || {
            // Counts this thread down however it ends.
            struct Alive(Arc<WorkerStats>);
            impl Drop for Alive {
                fn drop(&mut self) {
                    self.0.engines_alive.fetch_sub(1, Ordering::SeqCst);
                    ENGINE_THREADS.fetch_sub(1, Ordering::SeqCst);
                }
            }
            let _alive = Alive(stats.clone());
            let mut still_warming = Warming(stats.clone(), true);
            // Before the engine starts: its runtime's threads, or its engine
            // process and that process's restarts, inherit this thread's mask.
            let pinned = cpus.filter(|set| match crate::cpu_sets::pin_current_thread(set) {
                Ok(()) => true,
                Err(e) => {
                    tracing::warn!(model, cpus = set.describe(), "engine shares every CPU: cannot pin it to its own: {e}");
                    false
                }
            });
            let spec = EngineSpec { own_cpus_in_shared_process: pinned.is_some() && matches!(launch, Launch::Thread(_)), ..spec };
            let mut engine = match Runner::start(&launch, host, &model, spec, &pipeline) {
                Ok(engine) => engine,
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                    return;
                }
            };
            let mut info = engine.info().clone();
            if let Some(set) = &pinned {
                info.device = format!("{} (cpus {})", info.device, set.describe());
            }
            let _ = ready_tx.send(Ok(info));
            // The device's place among those of the model that loaded (the
            // index in Done events and /health's lists); none: the model failed.
            let Ok(index) = place_rx.recv() else { return };
            let who = format!("model {model:?} ({} on {})", engine.info().engine, engine.info().device);
            // The tokens a batch computes count the rows the engine pads it to.
            let row_counts = engine.info().row_counts.clone();
            let (rows, tokens, seconds) = (
                metrics::histogram!("eeane_batch_rows", "model" => model.clone()),
                metrics::histogram!("eeane_batch_tokens", "model" => model.clone()),
                metrics::histogram!("eeane_inference_seconds", "model" => model.clone()),
            );
            // The engine process's pid for /health, updated when a restart changes it.
            let mut shown_pid = None;
            let mut show_pid = |pid: Option<u32>| {
                if pid != shown_pid {
                    let mut pids = stats.engine_pids.locked();
                    if pids.len() <= index {
                        pids.resize(index + 1, None);
                    }
                    pids[index] = pid;
                    shown_pid = pid;
                }
            };
            show_pid(engine.pid());
            let mut restarts_counted = 0;
            let mut warming = true;
            loop {
                // While no batch waits, the engine warms, one step at a time.
                let work = match queue.try_recv() {
                    Ok(work) => work,
                    Err(mpsc::TryRecvError::Disconnected) => break,
                    Err(mpsc::TryRecvError::Empty) if warming => {
                        warming = engine.warm_next().unwrap_or_else(|e| {
                            tracing::warn!(model, "the engine stopped warming: {e}");
                            false
                        });
                        if !warming {
                            still_warming.done();
                        }
                        continue;
                    }
                    Err(mpsc::TryRecvError::Empty) => match queue.recv() {
                        Ok(work) => work,
                        Err(_) => break,
                    },
                };
                let Work { batch, items } = work;
                let started = Instant::now();
                let result = engine.run(&batch, &pipeline, &who);
                if let Runner::Process(hosted) = &engine {
                    stats.engine_restarts.fetch_add(hosted.restarts - restarts_counted, Ordering::Relaxed);
                    restarts_counted = hosted.restarts;
                    show_pid(hosted.pid());
                }
                seconds.record(started.elapsed().as_secs_f64());
                rows.record(batch.batch as f64);
                tokens.record((eeane_backend_core::rows_run(&row_counts, batch.batch) * batch.seq) as f64);
                if events.send(Event::Done { device: index, items, result }).is_err() {
                    break;
                }
            }
            let unloading = Instant::now();
            drop(engine);
            crate::allocator::release_freed_memory();
            metrics::histogram!("eeane_model_unload_seconds", "model" => model.clone()).record(unloading.elapsed().as_secs_f64());
        })
        .map_err(|e| {
            counted.engines_alive.fetch_sub(1, Ordering::SeqCst);
            counted.engines_warming.fetch_sub(1, Ordering::SeqCst);
            ENGINE_THREADS.fetch_sub(1, Ordering::SeqCst);
            EngineError::Runtime(format!("cannot start the engine thread: {e}"))
        })?;
    Ok(LoadingDevice { work, ready: ready_rx, place })
}

impl EngineWorker {
    /// Loads the engine on every one of `asked` (in order of preference),
    /// each on a thread of its own with `spec` for that device, and waits
    /// until they are ready. A device that fails with a device error is
    /// skipped and shown in the info's device; the model fails only when no
    /// device loads.
    pub async fn start(name: &str, launch: Launch, asked: Devices, spec: EngineSpec, pipeline: Pipeline) -> Result<Self, EngineError> {
        let (events, inbox) = mpsc::channel::<Event>();
        let (ready_tx, ready_rx) = oneshot::channel();
        let stats = Arc::new(WorkerStats::default());
        let (thread_stats, thread_events, name) = (stats.clone(), events.clone(), name.to_string());
        std::thread::Builder::new()
            .name(format!("batcher-{name}"))
            .spawn(move || {
                let (mut loading, mut devices, mut skipped) = (Vec::new(), Vec::new(), Vec::new());
                let parallel = match &launch {
                    Launch::Thread(engine) => engine.loads_in_parallel(),
                    Launch::Process { .. } => true,
                };
                let cpu_engines = asked.iter().filter(|d| d.is_cpu()).count();
                // Several CPU engines split the cores; one engine in a process kept to
                // some of the machine's CPUs gets them all, so that its thread count
                // follows the mask rather than the machine.
                let share = cpu_engines > 1 || (cpu_engines == 1 && crate::cpu_sets::restricted());
                let mut cpu_sets = if share { crate::cpu_sets::split(&crate::cpu_sets::cores(), cpu_engines) } else { Vec::new() }.into_iter();
                // In processes: a GPU's sessions share one (each CPU engine has
                // its own, kept to its own cores).
                let mut processes: HashMap<&DeviceName, (Arc<EngineProcess>, u32)> = HashMap::new();
                for (position, device) in asked.iter().enumerate() {
                    let host = matches!(launch, Launch::Process { .. }).then(|| {
                        if device.is_cpu() {
                            return (EngineProcess::new(&name), 0);
                        }
                        let (process, sessions) = processes.entry(device).or_insert_with(|| (EngineProcess::new(&name), 0));
                        *sessions += 1;
                        (process.clone(), *sessions - 1)
                    });
                    let cpus = if device.is_cpu() { cpu_sets.next() } else { None };
                    // A share of the cores computes on as many threads as it has cores, unless the entry says.
                    let threads = match &cpus {
                        Some(set) if spec.threads == 0 => set.cores,
                        _ => spec.threads,
                    };
                    let spec = EngineSpec { device: device.clone(), threads, ..spec.clone() };
                    let engine = EngineStart { model: &name, position, launch: launch.clone(), host, spec, cpus };
                    let started = start_device(engine, pipeline.clone(), thread_events.clone(), thread_stats.clone());
                    if parallel {
                        loading.push((device, started));
                        continue;
                    }
                    let loaded = started.and_then(|d| d.ready(devices.len(), device));
                    if let Err(e) = take_device(&name, device, loaded, asked.len(), &mut devices, &mut skipped) {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                }
                // The sessions hold their processes from here: the last one
                // unloaded ends its process.
                drop(processes);
                for (device, started) in loading {
                    let loaded = started.and_then(|d| d.ready(devices.len(), device));
                    if let Err(e) = take_device(&name, device, loaded, asked.len(), &mut devices, &mut skipped) {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                }
                if devices.is_empty() {
                    let _ = ready_tx.send(Err(EngineError::Device(format!("none of the devices {asked} could be used"))));
                    return;
                }
                drop(thread_events);
                let mut info = devices[0].info.clone();
                if devices.len() > 1 {
                    info.device = devices.iter().map(|d| d.info.device.as_str()).collect::<Vec<_>>().join(" + ");
                }
                if !skipped.is_empty() {
                    info.device = format!("{} (missing: {})", info.device, skipped.join(", "));
                }
                *thread_stats.device_batches.locked() = vec![0; devices.len()];
                *thread_stats.device_rows.locked() = vec![0; devices.len()];
                let _ = ready_tx.send(Ok(info.clone()));
                dispatch(&info, devices, pipeline, inbox, &thread_stats);
            })
            .map_err(|e| EngineError::Runtime(format!("cannot start the batcher thread: {e}")))?;
        let info = ready_rx.await.map_err(|_| EngineError::Runtime("the engine thread died while loading".into()))??;
        Ok(Self { events, info, stats })
    }

    pub fn info(&self) -> &EngineInfo {
        &self.info
    }

    /// Waits, up to `limit`, until no engine of the model has idle work
    /// left (a GPU's batch shapes run once): a measurement taken meanwhile
    /// shares the device with that work.
    pub async fn warmed(&self, limit: Duration) {
        let until = Instant::now() + limit;
        while self.stats.engines_warming.load(Ordering::SeqCst) > 0 && Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Stops the model and waits, up to `limit`, until its engines are
    /// dropped and their memory given back: for a caller that loads another
    /// model in its place (dropping the handle alone returns at once).
    pub async fn unload(self, limit: Duration) {
        let stats = self.stats.clone();
        drop(self);
        let until = Instant::now() + limit;
        while stats.engines_alive.load(Ordering::SeqCst) > 0 && Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Embeds `seqs`, returning one vector per sequence in the same order. If
    /// no device has started on the job by `deadline`, gives up with
    /// `QueueTimeout`; once one has, the job runs to the end.
    pub async fn embed(&self, seqs: Vec<Encoded>, deadline: Option<Instant>) -> Result<Vec<Vec<f32>>, WorkerError> {
        let stopped = || WorkerError::Engine(EngineError::Runtime("the engine thread has stopped".into()));
        let (reply, mut answer) = oneshot::channel();
        let claim = Arc::new(AtomicU8::new(QUEUED));
        self.events.send(Event::Job(Job { seqs, reply, claim: claim.clone() })).map_err(|_| stopped())?;
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

/// Keeps a loaded device; a device error skips the device when the model has
/// others to try; any other error fails the model.
fn take_device(
    model: &str,
    device: &DeviceName,
    loaded: Result<Device, EngineError>,
    asked: usize,
    devices: &mut Vec<Device>,
    skipped: &mut Vec<String>,
) -> Result<(), EngineError> {
    match loaded {
        Ok(d) => devices.push(d),
        Err(EngineError::Device(why)) if asked > 1 => {
            tracing::warn!(model, device = %device, "device skipped: {why}");
            skipped.push(device.to_string());
        }
        Err(e) => return Err(e),
    }
    Ok(())
}

/// A request in the worker: its sequences and the vectors computed so far.
struct Active {
    job: Job,
    vectors: Vec<Vec<f32>>,
    left: usize,
    started: bool,
}

/// The dispatcher loop: take every job that has arrived, and whenever a device
/// is idle plan one batch across the waiting jobs for it (so every device pulls
/// from the same pool); deliver each job once all its vectors are back. Blocks
/// only when no device is idle or nothing waits.
fn dispatch(info: &EngineInfo, devices: Vec<Device>, mut pipeline: Pipeline, inbox: mpsc::Receiver<Event>, stats: &WorkerStats) {
    if matches!(info.shapes, InputShapes::Fixed(_)) {
        pipeline.policy.pad_to_bucket = true;
    }
    if pipeline.policy.pad_to_multiple_of == 0 {
        pipeline.policy.pad_to_multiple_of = info.seq_multiple.max(1);
    }
    pipeline.policy.call_cost_tokens = info.call_cost_tokens;
    pipeline.policy.row_counts = info.row_counts.clone();
    let mut pool = Pool::default();
    let mut active: HashMap<u64, Active> = HashMap::new();
    let mut idle: Vec<usize> = (0..devices.len()).rev().collect();
    let mut next_id = 0u64;
    let mut shutting_down = false;
    let mut fill = FillWait::default();
    let mut sent_at: Vec<Option<Instant>> = vec![None; devices.len()];
    let mut fill_wait: Option<Duration> = None;
    // Sessions named alike share one GPU: numbered by their first session.
    let cards: Vec<Option<usize>> =
        devices.iter().map(|d| d.card.as_ref().map(|c| devices.iter().position(|o| o.card.as_ref() == Some(c)).unwrap_or(0))).collect();
    let full = full_rows(&pipeline.policy);
    let shared_cards = cards.iter().any(Option::is_some);
    let mut held_for_card = false;
    loop {
        let event = if let Some(wait) = fill_wait.take() {
            match inbox.recv_timeout(wait) {
                Ok(event) => Some(event),
                Err(mpsc::RecvTimeoutError::Timeout) => None,
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
            }
        } else if !shutting_down && !idle.is_empty() && !pool.is_empty() && !held_for_card {
            inbox.try_recv().ok()
        } else if shutting_down && idle.len() == devices.len() {
            break;
        } else {
            match inbox.recv() {
                Ok(event) => Some(event),
                Err(_) => break,
            }
        };
        if event.is_some() {
            held_for_card = false;
        }
        match event {
            Some(Event::Job(job)) => {
                next_id += 1;
                pool.add(next_id, job.seqs.iter().map(|s| s.ids.len()).collect(), pipeline.policy.order);
                let left = job.seqs.len();
                active.insert(next_id, Active { vectors: vec![Vec::new(); left], left, started: false, job });
                continue; // take every job that has arrived before planning
            }
            Some(Event::Done { device, items, result }) => {
                idle.push(device);
                let answered = deliver(&mut active, &mut pool, items, result);
                fill.answered(answered, sent_at[device].take().map_or(Duration::ZERO, |t| t.elapsed()), Instant::now());
                continue;
            }
            Some(Event::Shutdown) => {
                shutting_down = true;
                continue;
            }
            None => {}
        }
        // Forget requests that went away, or gave up (queue_timeout) before starting.
        active.retain(|&id, a| {
            let keep = !a.job.reply.is_closed() && (a.started || a.job.claim.load(Ordering::Acquire) == QUEUED);
            if !keep {
                pool.remove(id);
            }
            keep
        });
        if !shutting_down && !idle.is_empty() {
            let queued = active.values().filter(|a| !a.started).count();
            if let Some(wait) = fill.wait(queued, Instant::now()) {
                fill_wait = Some(wait);
                continue;
            }
        }
        loop {
            let waiting = pool.waiting();
            let share = shared_cards && worth_sharing(waiting, full, active.iter().any(|(&id, a)| a.started && pool.holds(id)));
            let Some(slot) = pick_idle(&idle, &cards, share) else {
                // Idle sessions wait for their card, until an answer or new jobs.
                held_for_card = !pool.is_empty();
                break;
            };
            let device = idle[slot];
            let Some(mut planned) = pool.next_batch(&pipeline.policy) else { break };
            // How full the pool was against what the plan took: with few
            // requests in flight, the batches' size and padding follow from it.
            tracing::trace!(target: "eeane::batcher", waiting, rows = planned.items.len(), seq = planned.seq, "batch planned");
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
            let batch = token_batch(&pipeline, &active, &planned, stats);
            stats.device_batches.locked()[device] += 1;
            stats.device_rows.locked()[device] += planned.items.len() as u64;
            if devices[device].work.send(Work { batch, items: planned.items.clone() }).is_err() {
                deliver(&mut active, &mut pool, planned.items, Err(EngineError::Runtime("the engine thread has stopped".into())));
                continue;
            }
            sent_at[device] = Some(Instant::now());
            idle.remove(slot);
        }
        stats.waiting_sequences.store(pool.waiting() as u64, Ordering::Relaxed);
    }
    // Dropping the devices closes their queues: each thread drops its engine.
    drop(devices);
}

/// Hands a finished batch's vectors to their jobs, and answers jobs that are
/// complete; how many it answered.
fn deliver(active: &mut HashMap<u64, Active>, pool: &mut Pool, items: Vec<(u64, usize)>, result: Result<Vec<Vec<f32>>, EngineError>) -> usize {
    let mut answered = 0;
    match result {
        Ok(vectors) => {
            for ((id, index), vector) in items.into_iter().zip(vectors) {
                // A job that failed in another device's batch is gone already.
                let Some(a) = active.get_mut(&id) else { continue };
                a.vectors[index] = vector;
                a.left -= 1;
                if a.left == 0 {
                    if let Some(done) = active.remove(&id) {
                        let _ = done.job.reply.send(Ok(done.vectors));
                        answered += 1;
                    }
                }
            }
        }
        Err(e) => {
            for (id, _) in items {
                if let Some(failed) = active.remove(&id) {
                    pool.remove(id);
                    let _ = failed.job.reply.send(Err(e.clone()));
                    answered += 1;
                }
            }
        }
    }
    answered
}

fn token_batch(pipeline: &Pipeline, active: &HashMap<u64, Active>, planned: &Planned, stats: &WorkerStats) -> TokenBatch {
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
    batch
}

#[cfg(test)]
mod tests {
    use super::*;
    use eeane_backend_core::{Engine, EngineOutput, InvalidOptions, Options, PathResolver};

    /// A fake engine's loader as a `Backend`, for the batcher's own tests.
    struct Loader(fn(&EngineSpec) -> Result<Box<dyn Engine>, EngineError>);

    impl Backend for Loader {
        fn name(&self) -> &'static str {
            "echo"
        }
        fn default_runtime(&self) -> Option<&'static str> {
            None
        }
        fn open(&self, _: Option<&std::path::Path>) -> Result<String, EngineError> {
            Ok("echo".into())
        }
        fn load(&self, spec: &EngineSpec) -> Result<Box<dyn Engine>, EngineError> {
            (self.0)(spec)
        }
        fn options(&self, _: &serde_json::Map<String, serde_json::Value>, _: PathResolver) -> Result<Options, InvalidOptions> {
            Ok(Options::default())
        }
    }

    static ECHO: Loader = Loader(echo);
    static SLOW_ECHO: Loader = Loader(slow_echo);

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
            call_cost_tokens: eeane_backend_core::CPU_CALL_COST_TOKENS,
            row_counts: Vec::new(),
            accelerated_layers: None,
            runtime_version: None,
        })))
    }

    /// Like EchoEngine, but slow, so that a second device gets work.
    struct SlowEcho(EchoEngine);

    impl Engine for SlowEcho {
        fn info(&self) -> &EngineInfo {
            self.0.info()
        }
        fn run(&mut self, b: &TokenBatch) -> Result<EngineOutput, EngineError> {
            std::thread::sleep(std::time::Duration::from_millis(20));
            self.0.run(b)
        }
    }

    fn slow_echo(spec: &EngineSpec) -> Result<Box<dyn Engine>, EngineError> {
        if spec.device == "missing" {
            return Err(EngineError::Device("no such device".into()));
        }
        let info = EngineInfo { device: spec.device.to_string(), ..echo(spec)?.info().clone() };
        Ok(Box::new(SlowEcho(EchoEngine(info))))
    }

    /// Engines of SLOW_TO_DROP dropped so far.
    static DROPPED: AtomicUsize = AtomicUsize::new(0);
    static SLOW_TO_DROP: Loader = Loader(|spec| Ok(Box::new(SlowToDrop(EchoEngine(echo(spec)?.info().clone())))));

    /// Like EchoEngine, taking 300 ms to give its memory back.
    struct SlowToDrop(EchoEngine);

    impl Engine for SlowToDrop {
        fn info(&self) -> &EngineInfo {
            self.0.info()
        }
        fn run(&mut self, b: &TokenBatch) -> Result<EngineOutput, EngineError> {
            self.0.run(b)
        }
    }

    impl Drop for SlowToDrop {
        fn drop(&mut self) {
            std::thread::sleep(Duration::from_millis(300));
            DROPPED.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[tokio::test]
    async fn unload_returns_once_every_engine_is_dropped() {
        let asked = Devices::new(["cpu", "cpu"]).unwrap();
        let worker = EngineWorker::start("slow-to-drop", Launch::Thread(&SLOW_TO_DROP), asked, EngineSpec::default(), two_per_batch()).await.unwrap();
        let got = worker.embed(vec![Encoded { ids: vec![3; 2], type_ids: vec![0; 2] }], None).await.unwrap();
        assert_eq!(got, vec![vec![3.0, 1.0]]);
        assert_eq!(DROPPED.load(Ordering::SeqCst), 0);
        worker.unload(Duration::from_secs(30)).await;
        assert_eq!(DROPPED.load(Ordering::SeqCst), 2, "unload returned before both engines were dropped");
    }

    /// Steps of idle work the warming engine has done.
    static WARM_STEPS: AtomicUsize = AtomicUsize::new(0);
    const WARM_STEPS_IN_ALL: usize = 40;
    static WARMING_ECHO: Loader = Loader(|spec| Ok(Box::new(WarmingEcho(EchoEngine(echo(spec)?.info().clone())))));

    /// Like EchoEngine, with idle work to do: WARM_STEPS_IN_ALL steps of 2 ms.
    struct WarmingEcho(EchoEngine);

    impl Engine for WarmingEcho {
        fn info(&self) -> &EngineInfo {
            self.0.info()
        }
        fn run(&mut self, b: &TokenBatch) -> Result<EngineOutput, EngineError> {
            self.0.run(b)
        }
        fn warm_next(&mut self) -> Result<bool, EngineError> {
            std::thread::sleep(Duration::from_millis(2));
            Ok(WARM_STEPS.fetch_add(1, Ordering::SeqCst) + 1 < WARM_STEPS_IN_ALL)
        }
    }

    #[tokio::test]
    async fn a_model_serves_while_it_warms_and_warms_until_its_engine_is_done() {
        let worker = EngineWorker::start("warming", Launch::Thread(&WARMING_ECHO), Devices::cpu(), EngineSpec::default(), two_per_batch()).await.unwrap();
        let seqs: Vec<Encoded> = (1..=6).map(|i| Encoded { ids: vec![i; 3], type_ids: vec![0; 3] }).collect();
        let got = worker.embed(seqs, None).await.unwrap();
        assert_eq!(got, (1..=6).map(|i| vec![i as f32, 1.0]).collect::<Vec<_>>());
        // 40 steps of 2 ms: warmed waits for them all.
        worker.warmed(Duration::from_secs(30)).await;
        assert_eq!(WARM_STEPS.load(Ordering::SeqCst), WARM_STEPS_IN_ALL, "warmed returned before the engine was done");
        // Once the engine says nothing remains it is not asked again.
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(WARM_STEPS.load(Ordering::SeqCst), WARM_STEPS_IN_ALL);
        let again = worker.embed(vec![Encoded { ids: vec![9; 2], type_ids: vec![0; 2] }], None).await.unwrap();
        assert_eq!(again, vec![vec![9.0, 1.0]]);
    }

    /// Batches running at once on the counting engine, and the most seen.
    static RUNNING: AtomicUsize = AtomicUsize::new(0);
    static MOST_RUNNING: AtomicUsize = AtomicUsize::new(0);
    static COUNTING_ECHO: Loader = Loader(|spec| {
        let info = EngineInfo { device: spec.device.to_string(), ..echo(spec)?.info().clone() };
        Ok(Box::new(CountingEcho(EchoEngine(info))))
    });

    /// Like EchoEngine, 10 ms a batch, counting the batches that overlap.
    struct CountingEcho(EchoEngine);

    impl Engine for CountingEcho {
        fn info(&self) -> &EngineInfo {
            self.0.info()
        }
        fn run(&mut self, b: &TokenBatch) -> Result<EngineOutput, EngineError> {
            MOST_RUNNING.fetch_max(RUNNING.fetch_add(1, Ordering::SeqCst) + 1, Ordering::SeqCst);
            std::thread::sleep(Duration::from_millis(10));
            RUNNING.fetch_sub(1, Ordering::SeqCst);
            self.0.run(b)
        }
    }

    #[tokio::test]
    async fn sessions_sharing_a_card_start_more_small_batches_only_for_a_full_one_or_a_requests_rest() {
        let pipeline = mean_of_one_bucket(256, 4096);
        assert_eq!(full_rows(&pipeline.policy), 128);
        // Six sessions on one card: two more than it runs small batches at once.
        let limit = plan::SMALL_BATCHES_PER_CARD;
        assert_eq!(limit, 4);
        let asked = Devices::new(["gpu"; 6]).unwrap();
        let worker = Arc::new(EngineWorker::start("card", Launch::Thread(&COUNTING_ECHO), asked, EngineSpec::default(), pipeline).await.unwrap());
        // 120 clients, one text a request: never a full batch waiting.
        let clients: Vec<_> = (0..120)
            .map(|c| {
                let worker = worker.clone();
                tokio::spawn(async move {
                    for i in 0..10 {
                        // Out of step, so that small batches could overlap.
                        tokio::time::sleep(Duration::from_millis(((c * 7 + i * 3) % 11) as u64)).await;
                        let id = 1 + c * 10 + i;
                        let got = worker.embed(vec![Encoded { ids: vec![id; 3], type_ids: vec![0; 3] }], None).await.unwrap();
                        assert_eq!(got, vec![vec![id as f32, 1.0]]);
                    }
                })
            })
            .collect();
        for client in clients {
            client.await.unwrap();
        }
        let most = MOST_RUNNING.load(Ordering::SeqCst);
        assert!(most <= limit, "small batches on one card, {most} at once");
        // A bulk request: six full batches start at once, one per session.
        let before = worker.stats.device_batches.locked().clone();
        let seqs: Vec<Encoded> = (1..=1536).map(|i| Encoded { ids: vec![i; 4], type_ids: vec![0; 4] }).collect();
        let got = worker.embed(seqs, None).await.unwrap();
        assert_eq!(got, (1..=1536).map(|i| vec![i as f32, 1.0]).collect::<Vec<_>>());
        let after = worker.stats.device_batches.locked().clone();
        assert!(before.iter().zip(&after).all(|(b, a)| a > b), "every session ran a full batch: {before:?} -> {after:?}");
        // Four batches of 256 and 10 texts: the last 10, the rest of a running
        // request, start at once on a fifth session instead of waiting for the card.
        let before = worker.stats.device_batches.locked().clone();
        let seqs: Vec<Encoded> = (1..=1034).map(|i| Encoded { ids: vec![i; 4], type_ids: vec![0; 4] }).collect();
        assert_eq!(worker.embed(seqs, None).await.unwrap().len(), 1034);
        let after = worker.stats.device_batches.locked().clone();
        let sessions = before.iter().zip(&after).filter(|(b, a)| a > b).count();
        assert_eq!(sessions, 5, "five batches on five sessions: {before:?} -> {after:?}");
    }

    /// Mean pooling, one bucket of 16 tokens.
    fn mean_of_one_bucket(max_batch: usize, max_batch_tokens: usize) -> Pipeline {
        let policy = BatchPolicy {
            buckets: vec![Bucket { max_tokens: 16, max_batch }],
            max_batch_tokens,
            pad_to_multiple_of: 0,
            pad_to_bucket: false,
            order: Order::Sorted,
            call_cost_tokens: eeane_backend_core::CPU_CALL_COST_TOKENS,
            row_counts: Vec::new(),
        };
        Pipeline { pooling: Pooling::Mean, policy, pad_id: 0 }
    }

    /// Batches of at most two.
    fn two_per_batch() -> Pipeline {
        mean_of_one_bucket(2, 1024)
    }

    #[tokio::test]
    async fn several_devices_pull_from_one_pool() {
        let pipeline = two_per_batch();
        let asked = Devices::new(["a", "missing", "b"]).unwrap();
        let worker = EngineWorker::start("echo", Launch::Thread(&SLOW_ECHO), asked, EngineSpec::default(), pipeline).await.unwrap();
        assert_eq!(worker.info().device, "a + b (missing: missing)");
        let seqs: Vec<Encoded> = (1..=40).map(|i| Encoded { ids: vec![i; 1 + i as usize % 5], type_ids: vec![0; 1 + i as usize % 5] }).collect();
        let got = worker.embed(seqs, None).await.unwrap();
        assert_eq!(got, (1..=40).map(|i| vec![i as f32, 1.0]).collect::<Vec<_>>());
        let per_device = worker.stats.device_batches.locked().clone();
        assert_eq!(per_device.iter().sum::<u64>(), 20);
        assert!(per_device.iter().all(|&n| n > 0), "both devices should run batches: {per_device:?}");
        assert_eq!(worker.stats.device_rows.locked().iter().sum::<u64>(), 40, "every sequence counted on the device that ran it");
    }

    #[tokio::test]
    async fn vectors_come_back_in_input_order_across_batches() {
        let pipeline = two_per_batch();
        let worker = EngineWorker::start("echo", Launch::Thread(&ECHO), Devices::cpu(), EngineSpec::default(), pipeline).await.unwrap();
        let seqs: Vec<Encoded> =
            [vec![4, 4, 4, 4], vec![2], vec![6, 8], vec![10, 10, 10]].into_iter().map(|ids| Encoded { type_ids: vec![0; ids.len()], ids }).collect();
        let got = worker.embed(seqs, None).await.unwrap();
        assert_eq!(got, vec![vec![4.0, 1.0], vec![2.0, 1.0], vec![7.0, 1.0], vec![10.0, 1.0]]);
    }
}
