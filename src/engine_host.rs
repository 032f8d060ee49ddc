//! Engines in child processes (`isolation = "process"`, the default).
//!
//! `eeane engine-host` loads one model's engine and runs the batches it reads
//! on stdin, answering each with pooled vectors on stdout; end of input ends
//! it. The server keeps one such process per loaded model and device, so an
//! unload hands back everything the runtime allocated (in the server's own
//! process, glibc's heap keeps fragments of every load: docs/lifecycle.md has
//! the soak), and a crash inside a runtime fails only the batch it was running.
//!
//! Frames are a u32 little-endian length and a postcard body. Pooling and the
//! non-finite check run in the child, so only `[batch, dim]` vectors cross the
//! pipe, never token states.

use std::io::{self, BufReader, BufWriter, Read, Write};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::process::{Child, ChildStdin, ChildStdout, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use eeane_backend_core::{Engine, EngineError, EngineInfo, EngineSpec, TokenBatch};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::config::Pooling;
use crate::pooling::pool_output;

/// The first frame the server sends: what to load and how to pool its output.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct HostedModel {
    /// The model's id, for messages.
    pub model: String,
    pub engine: String,
    pub spec: EngineSpec,
    pub pooling: Pooling,
    pub normalize: bool,
}

type Answer<T> = Result<T, EngineError>;

/// What the server asks of the child after the load: a batch, answered with
/// its vectors, or the engine's idle work (`Engine::warm_next`), answered
/// with whether more remains. The server writes `Order<&TokenBatch>`; the
/// child reads `Order<TokenBatch>`: the same frame.
#[derive(Debug, Serialize, Deserialize)]
enum Order<B> {
    Run(B),
    Warm,
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

/// The child's side: `eeane engine-host`. Returns the exit status.
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
    let (mut input, mut output) = match protocol_pipes() {
        Ok(pipes) => pipes,
        Err(e) => {
            eprintln!("eeane engine-host: {e}");
            return 2;
        }
    };
    let mut buf = Vec::new();
    let hosted: HostedModel = match read_frame(&mut input, &mut buf) {
        Ok(hosted) => hosted,
        Err(e) => {
            eprintln!("eeane engine-host: no model to load on stdin ({e}); this command is started by `eeane serve`");
            return 2;
        }
    };
    let loaded = match crate::engines::find(&hosted.engine) {
        Some(engine) => catch_unwind(AssertUnwindSafe(|| engine.load(&hosted.spec)))
            .unwrap_or_else(|_| Err(EngineError::Runtime("the engine panicked while loading".into()))),
        None => Err(EngineError::Runtime(format!("engine {:?} is not compiled into this build", hosted.engine))),
    };
    let mut engine: Box<dyn Engine> = match loaded {
        Ok(engine) => engine,
        Err(e) => {
            let _ = write_frame(&mut output, &Answer::<EngineInfo>::Err(e));
            return 0;
        }
    };
    if write_frame(&mut output, &Answer::Ok(engine.info().clone())).is_ok() {
        let who = format!("model {:?} ({} on {})", hosted.model, engine.info().engine, engine.info().device);
        while let Ok(order) = read_frame::<Order<TokenBatch>>(&mut input, &mut buf) {
            let written = match order {
                Order::Run(batch) => {
                    let result = catch_unwind(AssertUnwindSafe(|| pool_output(engine.run(&batch)?, &batch, hosted.pooling, hosted.normalize, &who)))
                        .unwrap_or_else(|_| Err(EngineError::Inference("the engine panicked".into())));
                    write_frame(&mut output, &result)
                }
                Order::Warm => {
                    let more = catch_unwind(AssertUnwindSafe(|| engine.warm_next()))
                        .unwrap_or_else(|_| Err(EngineError::Inference("the engine panicked while warming".into())));
                    write_frame(&mut output, &more)
                }
            };
            if written.is_err() {
                break;
            }
        }
    }
    drop(engine);
    crate::engines::at_exit();
    0
}

/// stdin for frames, and a private copy of stdout for answers; fd 1 itself
/// then points at stderr, so that a native runtime's stray prints (ncnn and
/// OpenVINO print now and then) land in the log instead of in a frame.
fn protocol_pipes() -> io::Result<(BufReader<io::Stdin>, BufWriter<std::fs::File>)> {
    #[cfg(unix)]
    {
        use std::os::fd::FromRawFd;
        // SAFETY: plain descriptor calls on this process's own fds 1 and 2; the
        // duplicate is owned by the File alone.
        let answers = unsafe {
            let fd = libc::dup(1);
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

/// A running `eeane engine-host` and its pipes.
struct Process {
    child: Child,
    input: BufWriter<ChildStdin>,
    output: BufReader<ChildStdout>,
}

/// The server's side: an engine in a child process. A child that dies is
/// started again (and its model loaded again) before the next batch.
pub struct HostedEngine {
    hosted: HostedModel,
    process: Option<Process>,
    info: EngineInfo,
    buf: Vec<u8>,
    /// Times the child was started again after it died.
    pub restarts: u64,
}

impl HostedEngine {
    /// Starts the child and waits until its engine has loaded.
    pub fn start(hosted: HostedModel) -> Result<Self, EngineError> {
        let mut buf = Vec::new();
        let (process, info) = spawn(&hosted, &mut buf)?;
        Ok(Self { hosted, process: Some(process), info, buf, restarts: 0 })
    }

    pub fn info(&self) -> &EngineInfo {
        &self.info
    }

    pub fn pid(&self) -> Option<u32> {
        self.process.as_ref().map(|p| p.child.id())
    }

    /// The child's idle work (`Engine::warm_next`): whether more remains. A
    /// child that is gone is not started again for it.
    pub fn warm_next(&mut self) -> Result<bool, EngineError> {
        let Some(process) = &mut self.process else { return Ok(false) };
        write_frame(&mut process.input, &Order::<&TokenBatch>::Warm)
            .and_then(|()| read_frame::<Answer<bool>>(&mut process.output, &mut self.buf))
            .map_err(|e| EngineError::Inference(format!("the engine process of model {:?} did not answer while warming ({e})", self.hosted.model)))?
    }

    /// Runs one batch in the child: the pooled, checked (and normalized) vectors.
    pub fn run(&mut self, batch: &TokenBatch) -> Result<Vec<Vec<f32>>, EngineError> {
        if let Some(status) = self.process.as_mut().and_then(|p| p.child.try_wait().ok().flatten()) {
            tracing::warn!(model = %self.hosted.model, "the engine process had exited ({}); starting it again", describe(status));
            self.process = None;
        }
        let process = match &mut self.process {
            Some(process) => process,
            None => {
                let (process, _) = spawn(&self.hosted, &mut self.buf)?;
                self.restarts += 1;
                metrics::counter!("eeane_engine_restarts_total", "model" => self.hosted.model.clone()).increment(1);
                self.process.insert(process)
            }
        };
        let answer = write_frame(&mut process.input, &Order::Run(batch)).and_then(|()| read_frame::<Answer<Vec<Vec<f32>>>>(&mut process.output, &mut self.buf));
        match (answer, self.process.take()) {
            (Ok(answer), process) => {
                self.process = process;
                answer
            }
            (Err(_), None) => Err(EngineError::Inference(format!("the engine process of model {:?} is gone", self.hosted.model))),
            (Err(e), Some(mut process)) => {
                let pid = process.child.id();
                let status = exit_status(&mut process.child, Duration::from_secs(2));
                Err(EngineError::Inference(format!(
                    "the engine process of model {:?} (pid {pid}) ended during the batch ({}{}); nothing is returned for it, \
                     and the engine starts again with the model's next batch",
                    self.hosted.model,
                    status.map(describe).unwrap_or_else(|| "still running, killed".into()),
                    pipe_detail(&e)
                )))
            }
        }
    }
}

impl Drop for HostedEngine {
    /// End of input unloads the engine and ends the child; wait for it, so that
    /// the model counts as unloaded only once its memory is back.
    fn drop(&mut self) {
        if let Some(Process { mut child, input, output }) = self.process.take() {
            drop(input);
            drop(output);
            if exit_status(&mut child, Duration::from_secs(30)).is_none() {
                tracing::warn!(model = %self.hosted.model, pid = child.id(), "the engine process did not end within 30 s of its unload; killed");
            }
        }
    }
}

/// Starts `eeane engine-host` for `hosted` and waits for its engine to load.
fn spawn(hosted: &HostedModel, buf: &mut Vec<u8>) -> Result<(Process, EngineInfo), EngineError> {
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
    let mut process = Process { input: BufWriter::new(stdin), output: BufReader::new(stdout), child };
    let answer = write_frame(&mut process.input, hosted).and_then(|()| read_frame::<Answer<EngineInfo>>(&mut process.output, buf));
    match answer {
        Ok(Ok(info)) => Ok((process, info)),
        Ok(Err(e)) => {
            drop(process.input);
            let _ = exit_status(&mut process.child, Duration::from_secs(10));
            Err(e)
        }
        Err(e) => {
            let status = exit_status(&mut process.child, Duration::from_secs(2));
            Err(EngineError::Runtime(format!(
                "the engine process of model {:?} ended while loading ({}{})",
                hosted.model,
                status.map(describe).unwrap_or_else(|| "still running, killed".into()),
                pipe_detail(&e)
            )))
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

/// A pipe error worth showing: not the plain end of input of a process that ended.
fn pipe_detail(e: &io::Error) -> String {
    match e.kind() {
        io::ErrorKind::UnexpectedEof | io::ErrorKind::BrokenPipe => String::new(),
        _ => format!("; pipe: {e}"),
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
        write_frame(&mut wire, &Order::Run(&batch)).unwrap();
        write_frame(&mut wire, &Order::<&TokenBatch>::Warm).unwrap();
        let (mut reader, mut buf) = (wire.as_slice(), Vec::new());
        match read_frame::<Order<TokenBatch>>(&mut reader, &mut buf).unwrap() {
            Order::Run(back) => assert_eq!(back, batch),
            Order::Warm => panic!("a batch read back as a warm order"),
        }
        assert!(matches!(read_frame::<Order<TokenBatch>>(&mut reader, &mut buf).unwrap(), Order::Warm));
    }
}
