//! Engines in child processes (`isolation = "process"`, the default).
//!
//! `eeane engine-host` loads engines of one model and runs the batches it
//! reads on stdin, answering each with pooled vectors on stdout; end of input
//! ends it. The server keeps one such process per loaded model and device,
//! except that a model's sessions on one GPU (its device list naming the card
//! several times) share one process: sessions of separate processes on one
//! card time-slice between CUDA contexts, where those of one process run side
//! by side. So an unload hands back everything the runtime allocated (in the
//! server's own process, glibc's heap keeps fragments of every load, and a
//! CUDA context stays: docs/lifecycle.md), and a crash inside a runtime fails
//! only the batches that process was running.
//!
//! Frames are a u32 little-endian length and a postcard body, each addressed
//! to one of the process's sessions. Pooling and the non-finite check run in
//! the child, so only `[batch, dim]` vectors cross the pipe, never token states.

use std::collections::HashMap;
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use eeane_backend_core::{Engine, EngineError, EngineInfo, EngineSpec, TokenBatch};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::config::Pooling;
use crate::pooling::pool_output;
use crate::sync::Recover;

/// What a session loads, and how it pools its output.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct HostedModel {
    /// The model's id, for messages.
    pub model: String,
    pub engine: String,
    pub spec: EngineSpec,
    pub pooling: Pooling,
}

type Answer<T> = Result<T, EngineError>;

/// What the server asks of one session of the child: to load (answered with
/// the engine's info), a batch (its vectors), the engine's idle work
/// (`Engine::warm_next`: whether more remains), or to unload. The server
/// writes `Order<&TokenBatch>`; the child reads `Order<TokenBatch>`: the
/// same frame.
#[derive(Debug, Serialize, Deserialize)]
enum Order<B> {
    Load(Box<HostedModel>),
    Run(B),
    Warm,
    Unload,
}

/// The child's answer to one order, in kind.
#[derive(Debug, Serialize, Deserialize)]
enum Reply {
    Loaded(Answer<EngineInfo>),
    Vectors(Answer<Vec<Vec<f32>>>),
    Warmed(Answer<bool>),
}

/// A frame for, or from, session `session` of the process.
#[derive(Debug, Serialize, Deserialize)]
struct Addressed<T> {
    session: u32,
    body: T,
}

fn write_frame<T: Serialize>(out: &mut impl Write, value: &T) -> io::Result<()> {
    let body = postcard::to_stdvec(value).map_err(io::Error::other)?;
    let len = u32::try_from(body.len()).map_err(io::Error::other)?;
    out.write_all(&len.to_le_bytes())?;
    out.write_all(&body)?;
    out.flush()
}

/// Reads one frame into `buf` (reused, so steady traffic allocates no new buffers).
fn read_frame<T: DeserializeOwned>(input: &mut impl Read, buf: &mut Vec<u8>) -> io::Result<T> {
    let mut len = [0u8; 4];
    input.read_exact(&mut len)?;
    buf.resize(u32::from_le_bytes(len) as usize, 0);
    input.read_exact(buf)?;
    postcard::from_bytes(buf).map_err(io::Error::other)
}

/// The child's side: `eeane engine-host`. Returns the exit status. Each
/// session runs on a thread of its own, fed by this one, which reads stdin.
pub fn serve_stdio() -> u8 {
    // The server decides when this process ends (end of input); a terminal's
    // Ctrl-C or a service manager's SIGTERM to the whole group must not cut a
    // batch short while the server drains.
    #[cfg(unix)]
    // SAFETY: setting dispositions to SIG_IGN, before any thread starts.
    unsafe {
        for signal in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
            libc::signal(signal, libc::SIG_IGN);
        }
    }
    let (mut input, output) = match protocol_pipes() {
        Ok(pipes) => pipes,
        Err(e) => {
            eprintln!("eeane engine-host: {e}");
            return 2;
        }
    };
    let output = Arc::new(Mutex::new(output));
    // Loads of an engine that cannot load two at a time in one process wait for each other.
    let serial_loads = Arc::new(Mutex::new(()));
    let mut sessions: HashMap<u32, mpsc::Sender<Order<TokenBatch>>> = HashMap::new();
    let mut threads = Vec::new();
    let mut buf = Vec::new();
    let mut orders = 0u64;
    loop {
        let Addressed { session, body } = match read_frame::<Addressed<Order<TokenBatch>>>(&mut input, &mut buf) {
            Ok(order) => order,
            Err(e) if orders == 0 => {
                eprintln!("eeane engine-host: no model to load on stdin ({e}); this command is started by `eeane serve`");
                return 2;
            }
            Err(_) => break,
        };
        orders += 1;
        match body {
            Order::Load(hosted) => {
                let (tx, rx) = mpsc::channel();
                let (session_output, serial_loads) = (output.clone(), serial_loads.clone());
                let spawned = std::thread::Builder::new()
                    .name(format!("session-{session}"))
                    .spawn(move || run_session(session, &hosted, &rx, &session_output, &serial_loads));
                match spawned {
                    Ok(thread) => {
                        sessions.insert(session, tx);
                        threads.push(thread);
                    }
                    Err(e) => {
                        let failed = Reply::Loaded(Err(EngineError::Runtime(format!("cannot start a session thread: {e}"))));
                        if write_frame(&mut *output.locked(), &Addressed { session, body: failed }).is_err() {
                            break;
                        }
                    }
                }
            }
            Order::Unload => drop(sessions.remove(&session)),
            order => {
                // A session that failed to load has ended: its orders are
                // answered here, in their kind, that it is not loaded.
                let refused = match sessions.get(&session) {
                    Some(tx) => tx.send(order).err().map(|unsent| unsent.0),
                    None => Some(order),
                };
                if let Some(order) = refused {
                    let why = EngineError::Runtime(format!("session {session} of this engine process is not loaded"));
                    let body = match order {
                        Order::Warm => Reply::Warmed(Err(why)),
                        _ => Reply::Vectors(Err(why)),
                    };
                    if write_frame(&mut *output.locked(), &Addressed { session, body }).is_err() {
                        break;
                    }
                }
            }
        }
    }
    // End of input: every session drops its engine, then the runtime's
    // process-wide state goes.
    drop(sessions);
    for thread in threads {
        let _ = thread.join();
    }
    crate::engines::at_exit();
    0
}

/// One session of the child: loads its engine, answers, then serves its
/// orders until the server unloads it or input ends.
fn run_session(
    session: u32,
    hosted: &HostedModel,
    orders: &mpsc::Receiver<Order<TokenBatch>>,
    output: &Mutex<BufWriter<std::fs::File>>,
    serial_loads: &Mutex<()>,
) {
    let answer = |body: Reply| write_frame(&mut *output.locked(), &Addressed { session, body });
    let loaded = match crate::engines::find(&hosted.engine) {
        Some(engine) => {
            let _one_at_a_time = (!engine.loads_in_parallel()).then(|| serial_loads.locked());
            catch_unwind(AssertUnwindSafe(|| engine.load(&hosted.spec)))
                .unwrap_or_else(|_| Err(EngineError::Runtime("the engine panicked while loading".into())))
        }
        None => Err(EngineError::Runtime(format!("engine {:?} is not compiled into this build", hosted.engine))),
    };
    let mut engine: Box<dyn Engine> = match loaded {
        Ok(engine) => engine,
        Err(e) => {
            let _ = answer(Reply::Loaded(Err(e)));
            return;
        }
    };
    if answer(Reply::Loaded(Ok(engine.info().clone()))).is_err() {
        return;
    }
    let who = format!("model {:?} ({} on {})", hosted.model, engine.info().engine, engine.info().device);
    while let Ok(order) = orders.recv() {
        let reply = match order {
            Order::Run(batch) => Reply::Vectors(
                catch_unwind(AssertUnwindSafe(|| pool_output(engine.run(&batch)?, &batch, hosted.pooling, &who)))
                    .unwrap_or_else(|_| Err(EngineError::Inference("the engine panicked".into()))),
            ),
            Order::Warm => Reply::Warmed(
                catch_unwind(AssertUnwindSafe(|| engine.warm_next()))
                    .unwrap_or_else(|_| Err(EngineError::Inference("the engine panicked while warming".into()))),
            ),
            Order::Load(_) | Order::Unload => continue,
        };
        if answer(reply).is_err() {
            break;
        }
    }
}

/// stdin for frames, and a private copy of stdout for answers; fd 1 itself
/// then points at stderr, so that a native runtime's stray prints (ncnn and
/// OpenVINO print now and then) land in the log instead of in a frame.
fn protocol_pipes() -> io::Result<(BufReader<io::Stdin>, BufWriter<std::fs::File>)> {
    #[cfg(unix)]
    {
        use std::os::fd::FromRawFd;
        // SAFETY: plain descriptor calls on this process's own fds 1 and 2; the
        // duplicate is owned by the File alone. Close-on-exec: a process a
        // runtime starts must not hold the answers open, or the server would
        // never see them end when this process dies.
        let answers = unsafe {
            let fd = libc::fcntl(1, libc::F_DUPFD_CLOEXEC, 0);
            if fd < 0 || libc::dup2(2, 1) < 0 {
                return Err(io::Error::last_os_error());
            }
            std::fs::File::from_raw_fd(fd)
        };
        Ok((BufReader::new(io::stdin()), BufWriter::new(answers)))
    }
    #[cfg(not(unix))]
    Err(io::Error::other("engine processes need a Unix platform; set isolation = \"thread\""))
}

/// An `eeane engine-host` that one or more sessions of a model share. The
/// first session to need it starts it; after it died, the first session to
/// run a batch starts it again, and each session loads itself in the new one
/// before its next batch.
pub struct EngineProcess {
    model: String,
    state: Mutex<ProcessState>,
}

#[derive(Default)]
struct ProcessState {
    /// How many times a child was started: the live one's number.
    generation: u64,
    live: Option<Live>,
}

/// A running child and its pipes.
struct Live {
    child: Child,
    input: BufWriter<ChildStdin>,
    routes: Arc<Mutex<Routes>>,
    reader: std::thread::JoinHandle<()>,
}

/// Where the reader thread sends each session's replies, until the child's
/// output ends (`open` is then `None`), and why it ended when that was not
/// the plain end of a process's output.
struct Routes {
    open: Option<HashMap<u32, mpsc::Sender<Reply>>>,
    broken: Option<String>,
}

impl Live {
    fn exited(&mut self) -> bool {
        self.routes.locked().open.is_none() || self.child.try_wait().ok().flatten().is_some()
    }

    /// Ends the child: end of input, then up to `limit` for it to exit
    /// (`None`: it was killed). The reader thread ends with its output.
    fn end(mut self, limit: Duration) -> Option<ExitStatus> {
        drop(self.input);
        let status = exit_status(&mut self.child, limit);
        let _ = self.reader.join();
        status
    }
}

impl EngineProcess {
    pub fn new(model: &str) -> Arc<Self> {
        Arc::new(Self { model: model.to_string(), state: Mutex::new(ProcessState::default()) })
    }

    pub fn pid(&self) -> Option<u32> {
        self.state.locked().live.as_ref().map(|live| live.child.id())
    }

    /// Whether `generation` is the live child's and it still runs.
    fn current(&self, generation: u64) -> bool {
        let mut state = self.state.locked();
        state.generation == generation && state.live.as_mut().is_some_and(|live| !live.exited())
    }

    /// Routes `session`'s replies to the returned receiver and asks the
    /// child to load it, starting the child first when none runs: the
    /// child's generation, the receiver, and whether this started a child
    /// again after one had died.
    fn attach(&self, session: u32, hosted: &HostedModel) -> (Result<(u64, mpsc::Receiver<Reply>), EngineError>, bool) {
        let mut state = self.state.locked();
        let (mut restarted, mut dead) = (false, Vec::new());
        // Twice at most: the child's output may end between the check and the route.
        let attached = loop {
            if let Some(mut gone) = state.live.take_if(|live| live.exited()) {
                let status = gone.child.try_wait().ok().flatten().map(describe).unwrap_or_else(|| "its output ended".into());
                tracing::warn!(model = %self.model, pid = gone.child.id(), "the engine process had exited ({status}); starting it again");
                dead.push(gone);
                restarted = true;
            }
            if state.live.is_none() {
                match spawn() {
                    Ok(live) => state.live = Some(live),
                    Err(e) => break Err(e),
                }
                state.generation += 1;
            }
            let generation = state.generation;
            let live = state.live.as_mut().expect("started above");
            let (tx, rx) = mpsc::channel();
            let routed = live.routes.locked().open.as_mut().map(|routes| routes.insert(session, tx)).is_some();
            if !routed && dead.len() < 2 {
                continue;
            } else if !routed {
                break Err(EngineError::Runtime(format!("the engine process of model {:?} ended as it started, twice", self.model)));
            }
            let load = Addressed { session, body: Order::<&TokenBatch>::Load(Box::new(hosted.clone())) };
            break write_frame(&mut live.input, &load)
                .map(|()| (generation, rx))
                .map_err(|e| EngineError::Runtime(format!("the engine process of model {:?} would not take the load ({e})", self.model)));
        };
        drop(state);
        // Reaped outside the lock, so that the other sessions go on meanwhile.
        for gone in dead {
            gone.end(Duration::from_secs(2));
        }
        (attached, restarted)
    }

    /// Writes `order` for `session` to the child of `generation`.
    fn send(&self, generation: u64, session: u32, order: &Order<&TokenBatch>) -> io::Result<()> {
        let mut state = self.state.locked();
        let state = &mut *state;
        match state.live.as_mut() {
            Some(live) if state.generation == generation => write_frame(&mut live.input, &Addressed { session, body: order }),
            _ => Err(io::Error::new(io::ErrorKind::BrokenPipe, "the engine process was started again")),
        }
    }

    /// Why the child of `generation` stopped answering, while `what` ran: its
    /// pid and exit status (waiting up to 2 s for it, then killing it).
    fn ended(&self, generation: u64, what: &str) -> String {
        let mut state = self.state.locked();
        let state = &mut *state;
        let status = match state.live.as_mut() {
            Some(live) if state.generation == generation => {
                let pid = live.child.id();
                let status = exit_status(&mut live.child, Duration::from_secs(2)).map(describe).unwrap_or_else(|| "still running, killed".into());
                match live.routes.locked().broken.as_deref() {
                    Some(broken) => format!("pid {pid}, {status}; its answers: {broken}"),
                    None => format!("pid {pid}, {status}"),
                }
            }
            _ => "started again since".into(),
        };
        format!("the engine process of model {:?} ended {what} ({status})", self.model)
    }

    /// Stops routing `session`'s replies and unloads it in the child of `generation`.
    fn forget(&self, generation: u64, session: u32) {
        let mut state = self.state.locked();
        if state.generation == generation {
            if let Some(live) = state.live.as_mut() {
                if let Some(routes) = live.routes.locked().open.as_mut() {
                    routes.remove(&session);
                }
                let _ = write_frame(&mut live.input, &Addressed { session, body: Order::<&TokenBatch>::Unload });
            }
        }
    }
}

impl Drop for EngineProcess {
    /// End of input unloads the engines and ends the child; wait for it, so
    /// that the model counts as unloaded only once its memory is back.
    fn drop(&mut self) {
        if let Some(live) = self.state.get_mut().unwrap_or_else(|e| e.into_inner()).live.take() {
            let pid = live.child.id();
            if live.end(Duration::from_secs(30)).is_none() {
                tracing::warn!(model = %self.model, pid, "the engine process did not end within 30 s of its unload; killed");
            }
        }
    }
}

/// The child's generation a session is loaded in, and the session's replies.
type Attached = (u64, mpsc::Receiver<Reply>);

/// The server's side: one session of a model in an engine process, which it
/// may share with the model's other sessions on the same GPU.
pub struct HostedEngine {
    process: Arc<EngineProcess>,
    session: u32,
    hosted: HostedModel,
    info: EngineInfo,
    attached: Option<Attached>,
    /// Times this session started the child again after it died.
    pub restarts: u64,
}

impl HostedEngine {
    /// Loads session `session` of `process` (starting the process if it
    /// does not run yet) and waits until its engine has loaded.
    pub fn start(hosted: HostedModel, process: Arc<EngineProcess>, session: u32) -> Result<Self, EngineError> {
        let (loaded, restarted) = load_session(&process, session, &hosted);
        let restarts = count_restart(restarted, &hosted.model);
        let (info, attached) = loaded?;
        Ok(Self { process, session, hosted, info, attached: Some(attached), restarts })
    }

    pub fn info(&self) -> &EngineInfo {
        &self.info
    }

    pub fn pid(&self) -> Option<u32> {
        self.process.pid()
    }

    /// Loads this session again, in the live child (starting one when none runs).
    fn reload(&mut self) -> Result<(), EngineError> {
        self.attached = None;
        let (loaded, restarted) = load_session(&self.process, self.session, &self.hosted);
        self.restarts += count_restart(restarted, &self.hosted.model);
        self.attached = Some(loaded?.1);
        Ok(())
    }

    /// Sends `order` and waits for its reply; when the child ended first (or
    /// this session is not loaded: 0), the generation of the child it was in.
    fn ask(&mut self, order: &Order<&TokenBatch>) -> Result<Reply, u64> {
        let Some((generation, replies)) = &self.attached else { return Err(0) };
        let generation = *generation;
        if self.process.send(generation, self.session, order).is_err() {
            self.attached = None;
            return Err(generation);
        }
        replies.recv().map_err(|_| {
            self.attached = None;
            generation
        })
    }

    /// The child's idle work (`Engine::warm_next`): whether more remains. A
    /// child that is gone is not started again for it.
    pub fn warm_next(&mut self) -> Result<bool, EngineError> {
        if !self.attached.as_ref().is_some_and(|(generation, _)| self.process.current(*generation)) {
            return Ok(false);
        }
        match self.ask(&Order::Warm) {
            Ok(Reply::Warmed(answer)) => answer,
            Ok(_) => Err(EngineError::Inference(format!("the engine process of model {:?} answered out of turn while warming", self.hosted.model))),
            Err(generation) => Err(EngineError::Inference(self.process.ended(generation, "while warming"))),
        }
    }

    /// Runs one batch in the child: the pooled, checked vectors.
    pub fn run(&mut self, batch: &TokenBatch) -> Result<Vec<Vec<f32>>, EngineError> {
        if !self.attached.as_ref().is_some_and(|(generation, _)| self.process.current(*generation)) {
            self.reload()?;
        }
        match self.ask(&Order::Run(batch)) {
            Ok(Reply::Vectors(answer)) => answer,
            Ok(_) => Err(EngineError::Inference(format!("the engine process of model {:?} answered a batch out of turn", self.hosted.model))),
            Err(generation) => Err(EngineError::Inference(format!(
                "{}; nothing is returned for it, and the engine starts again with the model's next batch",
                self.process.ended(generation, "during the batch")
            ))),
        }
    }
}

impl Drop for HostedEngine {
    /// Unloads this session; the last session's `EngineProcess` ends the child.
    fn drop(&mut self) {
        if let Some((generation, _)) = self.attached.take() {
            self.process.forget(generation, self.session);
        }
    }
}

/// Loads `session` in `process`'s live child: its engine's info with the
/// child's generation and the session's replies; and whether the child was
/// started again for it, whether or not the load then succeeded.
fn load_session(process: &EngineProcess, session: u32, hosted: &HostedModel) -> (Result<(EngineInfo, Attached), EngineError>, bool) {
    let (attached, restarted) = process.attach(session, hosted);
    let loaded = attached.and_then(|(generation, replies)| match replies.recv() {
        Ok(Reply::Loaded(Ok(info))) => Ok((info, (generation, replies))),
        Ok(Reply::Loaded(Err(e))) => {
            process.forget(generation, session);
            Err(e)
        }
        Ok(_) => Err(EngineError::Runtime(format!("the engine process of model {:?} answered a load out of turn", hosted.model))),
        Err(_) => Err(EngineError::Runtime(process.ended(generation, "while loading"))),
    });
    (loaded, restarted)
}

/// One restart counted (for /health and the metric) when `restarted`.
fn count_restart(restarted: bool, model: &str) -> u64 {
    if restarted {
        metrics::counter!("eeane_engine_restarts_total", "model" => model.to_string()).increment(1);
    }
    u64::from(restarted)
}

/// Starts `eeane engine-host`, and a thread that routes its replies.
fn spawn() -> Result<Live, EngineError> {
    let started = |e: io::Error| EngineError::Runtime(format!("cannot start the engine process: {e}"));
    let mut command = Command::new(host_executable().map_err(started)?);
    #[cfg(unix)]
    {
        // Shown by ps and top as the server's own name, not /proc/self/exe.
        use std::os::unix::process::CommandExt;
        command.arg0(std::env::args_os().next().unwrap_or_else(|| "eeane".into()));
    }
    let mut child = command.arg("engine-host").stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::inherit()).spawn().map_err(started)?;
    let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
        let _ = child.kill();
        return Err(started(io::Error::other("its stdin or stdout is not a pipe")));
    };
    let routes = Arc::new(Mutex::new(Routes { open: Some(HashMap::new()), broken: None }));
    let thread_routes = routes.clone();
    let reader = std::thread::Builder::new().name("engine-replies".into()).spawn(move || {
        let (mut output, mut buf) = (BufReader::new(stdout), Vec::new());
        let ended = loop {
            match read_frame::<Addressed<Reply>>(&mut output, &mut buf) {
                Ok(Addressed { session, body }) => {
                    if let Some(route) = thread_routes.locked().open.as_ref().and_then(|routes| routes.get(&session)) {
                        let _ = route.send(body);
                    }
                }
                Err(e) => break e,
            }
        };
        // Closing the routes wakes every waiting session; each then finds the child ended.
        let mut routes = thread_routes.locked();
        routes.open = None;
        if !matches!(ended.kind(), io::ErrorKind::UnexpectedEof | io::ErrorKind::BrokenPipe) {
            routes.broken = Some(ended.to_string());
        }
    });
    match reader {
        Ok(reader) => Ok(Live { child, input: BufWriter::new(stdin), routes, reader }),
        Err(e) => {
            let _ = child.kill();
            let _ = child.wait();
            Err(started(e))
        }
    }
}

/// This very program: on Linux the running image itself, so that an
/// upgrade or rebuild of the file on disk never starts a different version.
fn host_executable() -> io::Result<std::path::PathBuf> {
    if cfg!(target_os = "linux") {
        Ok("/proc/self/exe".into())
    } else {
        std::env::current_exe()
    }
}

/// Waits up to `limit` for the child to exit; kills it after that (`None`).
fn exit_status(child: &mut Child, limit: Duration) -> Option<ExitStatus> {
    let until = Instant::now() + limit;
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Some(status),
            Ok(None) if Instant::now() < until => std::thread::sleep(Duration::from_millis(5)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return None;
            }
        }
    }
}

fn describe(status: ExitStatus) -> String {
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        if let Some(signal) = status.signal() {
            let name = match signal {
                libc::SIGSEGV => " (SIGSEGV)",
                libc::SIGKILL => " (SIGKILL)",
                libc::SIGABRT => " (SIGABRT)",
                libc::SIGBUS => " (SIGBUS)",
                _ => "",
            };
            return format!("killed by signal {signal}{name}");
        }
    }
    format!("exited with {status}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_floats_bit_for_bit() {
        let vectors: Answer<Vec<Vec<f32>>> = Ok(vec![vec![0.1, -0.0, f32::MIN_POSITIVE, 1.0e-45, 3.4028235e38], vec![]]);
        let mut wire = Vec::new();
        write_frame(&mut wire, &vectors).unwrap();
        write_frame(&mut wire, &Answer::<Vec<Vec<f32>>>::Err(EngineError::Inference("x".into()))).unwrap();
        let (mut reader, mut buf) = (wire.as_slice(), Vec::new());
        let back: Answer<Vec<Vec<f32>>> = read_frame(&mut reader, &mut buf).unwrap();
        let bits = |v: &Answer<Vec<Vec<f32>>>| v.as_ref().unwrap().iter().flatten().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&back), bits(&vectors));
        let error: Answer<Vec<Vec<f32>>> = read_frame(&mut reader, &mut buf).unwrap();
        assert_eq!(error, Err(EngineError::Inference("x".into())));
        // A cut frame is an error, not a hang or a panic.
        let cut = &wire[..wire.len() - 3];
        let (mut reader, mut buf) = (cut, Vec::new());
        let _: Answer<Vec<Vec<f32>>> = read_frame(&mut reader, &mut buf).unwrap();
        assert!(read_frame::<Answer<Vec<Vec<f32>>>>(&mut reader, &mut buf).is_err());
    }

    #[test]
    fn the_servers_borrowed_orders_read_back_as_the_childs_owned_ones() {
        let rows: Vec<i64> = vec![101, 7, 102];
        let batch = TokenBatch::from_rows(&[(rows.as_slice(), None)], 4, 0);
        let mut wire = Vec::new();
        write_frame(&mut wire, &Addressed { session: 3, body: Order::Run(&batch) }).unwrap();
        write_frame(&mut wire, &Addressed { session: 70_000, body: Order::<&TokenBatch>::Warm }).unwrap();
        let (mut reader, mut buf) = (wire.as_slice(), Vec::new());
        match read_frame::<Addressed<Order<TokenBatch>>>(&mut reader, &mut buf).unwrap() {
            Addressed { session: 3, body: Order::Run(back) } => assert_eq!(back, batch),
            other => panic!("a batch for session 3 read back as {other:?}"),
        }
        let warm = read_frame::<Addressed<Order<TokenBatch>>>(&mut reader, &mut buf).unwrap();
        assert!(matches!(warm, Addressed { session: 70_000, body: Order::Warm }), "{warm:?}");
    }
}
