//! CUDA graphs for a CUDA session's small batches (`cuda_graph_rows`): each
//! batch shape up to that many rows is captured once as a CUDA graph and
//! then replayed with one launch, in place of the hundred-odd kernels ONNX
//! Runtime's executor launches one by one.
//!
//! Why: one text a request makes batches of about 44-58 rows, and on an H100
//! such a call cost about 2 ms of host time (launches, the executor's
//! bookkeeping) beside about 1 ms of the card's (docs/performance.md "One text
//! a request: what a call costs the host"). A replay costs the host one
//! launch: on an H200, eight sessions, one text a request at 480 in flight
//! ran 1.32x (docs/performance.md "NVIDIA H200: one text a request as CUDA
//! graphs"). Bulk batches (more rows) run as before: graphs saved them 1-4 %
//! on the engine alone.
//!
//! How ONNX Runtime 1.31's CUDA provider does graphs, which shapes this code:
//! - the first call annotated with `gpu_graph_id = N` runs three times
//!   within that call (two plain runs, for the arena to grow, then the
//!   capture, which replays once), and from then on a call replays graph N
//!   without looking at its inputs: each shape has its own id and its own
//!   input and output buffers on the card, bound once, which the host fills
//!   and reads around a replay;
//! - `gpu_graph_id = -1` runs plainly: every other batch;
//! - the graphs live in the calling thread's context: an engine captures and
//!   replays on its own thread (`warm_next` and `run` share it);
//! - capture is in CUDA's global mode, where another thread's CUDA
//!   allocation, synchronous copy or stream wait fails and breaks the
//!   capture: every CUDA session of this process runs, loads and drops
//!   holding `CUDA_WORK` shared, and a capture holds it alone; while a
//!   session loads (seconds), captures wait instead of queueing on the lock,
//!   where they would stall every other session's runs behind the load.
//!
//! The CUDA runtime is the one the CUDA provider loads (`cuda::preload`),
//! opened here by the same path.

use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::path::Path;
use std::ptr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{OnceLock, RwLock, RwLockReadGuard};

use eeane_backend_core::EngineError;
use ort::memory::{AllocationDevice, Allocator, AllocatorType, MemoryInfo, MemoryType};
use ort::session::{IoBinding, RunOptions, Session};
use ort::value::Tensor;

/// Held shared by every CUDA session's work in this process (load, run,
/// drop), and alone by a capture (see the module's notes).
static CUDA_WORK: RwLock<()> = RwLock::new(());

/// CUDA sessions of this process being loaded.
static LOADING: AtomicUsize = AtomicUsize::new(0);

/// Holds off captures while this thread does CUDA work.
pub fn shared_work() -> RwLockReadGuard<'static, ()> {
    CUDA_WORK.read().unwrap_or_else(|e| e.into_inner())
}

/// Holds off captures while a CUDA session loads, and tells captures to
/// wait for the load to end.
pub struct Loading {
    _work: RwLockReadGuard<'static, ()>,
}

pub fn loading() -> Loading {
    LOADING.fetch_add(1, Ordering::AcqRel);
    Loading { _work: shared_work() }
}

impl Drop for Loading {
    fn drop(&mut self) {
        LOADING.fetch_sub(1, Ordering::AcqRel);
    }
}

/// What became of a shape that was to be captured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Capture {
    /// It replays from now on.
    Captured,
    /// It runs plainly: its replay differed from its plain run, or capturing
    /// failed (then every shape of the session runs plainly).
    Plain,
    /// A session of this process is loading: try again later.
    Later,
}

/// The run options of a plain run in a session with graphs on: without an
/// id a run is graph 0's, and its third would be captured.
fn plain_run() -> Result<RunOptions, EngineError> {
    let mut options = RunOptions::new().map_err(|e| EngineError::Runtime(e.to_string()))?;
    options.set("gpu_graph_id", "-1").map_err(|e| EngineError::Runtime(e.to_string()))?;
    Ok(options)
}

type CudaError = c_int;
type Stream = *mut c_void;
const MEMCPY_HOST_TO_DEVICE: c_int = 1;
const MEMCPY_DEVICE_TO_HOST: c_int = 2;
const STREAM_NON_BLOCKING: c_uint = 1;

/// The CUDA runtime's entry points this module calls, with their C signatures.
struct Cudart {
    _library: libloading::Library,
    set_device: unsafe extern "C" fn(c_int) -> CudaError,
    stream_create: unsafe extern "C" fn(*mut Stream, c_uint) -> CudaError,
    stream_destroy: unsafe extern "C" fn(Stream) -> CudaError,
    stream_synchronize: unsafe extern "C" fn(Stream) -> CudaError,
    memcpy_async: unsafe extern "C" fn(*mut c_void, *const c_void, usize, c_int, Stream) -> CudaError,
    error_string: unsafe extern "C" fn(CudaError) -> *const c_char,
}

static CUDART: OnceLock<Result<Cudart, EngineError>> = OnceLock::new();

fn cudart(path: &Path) -> Result<&'static Cudart, EngineError> {
    CUDART
        .get_or_init(|| {
            // SAFETY: the CUDA runtime's documented entry points, each field
            // typed as its C signature.
            unsafe {
                crate::cuda::entry_points!(
                    path,
                    "the CUDA runtime",
                    Cudart {
                        set_device: "cudaSetDevice",
                        stream_create: "cudaStreamCreateWithFlags",
                        stream_destroy: "cudaStreamDestroy",
                        stream_synchronize: "cudaStreamSynchronize",
                        memcpy_async: "cudaMemcpyAsync",
                        error_string: "cudaGetErrorString",
                    }
                )
            }
        })
        .as_ref()
        .map_err(Clone::clone)
}

impl Cudart {
    fn check(&self, what: &str, status: CudaError) -> Result<(), EngineError> {
        if status == 0 {
            return Ok(());
        }
        // SAFETY: cudaGetErrorString returns a static C string for any code.
        let text = unsafe { CStr::from_ptr((self.error_string)(status)) }.to_string_lossy();
        Err(EngineError::Inference(format!("CUDA graphs: {what}: {text} ({status})")))
    }
}

/// One captured shape: its buffers on the card, bound once, and its graph's id.
struct Shape {
    inputs: Vec<Tensor<i64>>,
    output: Tensor<f32>,
    binding: IoBinding,
    /// `gpu_graph_id = N`, this shape's graph.
    graph: RunOptions,
}

/// A session's graphs, one a shape, for batches of up to `max_rows` rows.
pub struct Graphs {
    cudart: &'static Cudart,
    ordinal: i32,
    /// For the copies in and out, which must be done before the replay
    /// starts and after it ends (a stream of its own, not the legacy default
    /// stream, so that it waits for no other session).
    stream: Stream,
    pub max_rows: usize,
    dim: usize,
    output_name: String,
    input_names: Vec<&'static str>,
    allocator: Allocator,
    /// `gpu_graph_id = -1`: the plain runs a capture's check compares with.
    plain: RunOptions,
    shapes: HashMap<(usize, usize), Shape>,
    /// Shapes whose replay did not match their plain run: they run plainly.
    refused: Vec<(usize, usize)>,
    /// A capture failed: every batch runs plainly from then on.
    failed: bool,
}

// SAFETY: the stream is a CUDA handle used only by the engine that owns these
// graphs, from one thread at a time (`Engine` methods take `&mut self`).
unsafe impl Send for Graphs {}

/// A captured replay's vectors against the plain run's, per row: below this
/// the capture is refused (the two run the same kernels on the same data).
const CAPTURE_MIN_COSINE: f64 = 0.99999;

impl Graphs {
    /// Graphs for `session`, whose output `output_name` is `[rows, dim]`;
    /// `runtime` is the ONNX Runtime library the CUDA libraries sit beside.
    pub fn new(
        session: &Session,
        runtime: &Path,
        ordinal: i32,
        max_rows: usize,
        output_name: &str,
        dim: usize,
        input_names: Vec<&'static str>,
    ) -> Result<Self, EngineError> {
        let cudart = cudart(&crate::cuda::cudart(runtime)?)?;
        let memory =
            MemoryInfo::new(AllocationDevice::CUDA, ordinal, AllocatorType::Device, MemoryType::Default).map_err(|e| EngineError::Runtime(e.to_string()))?;
        let allocator = Allocator::new(session, memory).map_err(|e| EngineError::Runtime(format!("CUDA graphs: the session's allocator: {e}")))?;
        let mut stream = ptr::null_mut();
        // SAFETY: an out-pointer for a stream these graphs own, destroyed in Drop.
        unsafe {
            cudart.check("cudaSetDevice", (cudart.set_device)(ordinal))?;
            cudart.check("cudaStreamCreateWithFlags", (cudart.stream_create)(&mut stream, STREAM_NON_BLOCKING))?;
        }
        Ok(Graphs {
            cudart,
            ordinal,
            stream,
            max_rows,
            dim,
            output_name: output_name.to_string(),
            input_names,
            allocator,
            plain: plain_run()?,
            shapes: HashMap::new(),
            refused: Vec::new(),
            failed: false,
        })
    }

    /// Whether a batch of this shape (rows as the engine pads them) is to run
    /// as a graph.
    pub fn covers(&self, rows: usize, seq: usize) -> bool {
        rows <= self.max_rows && !self.failed && !self.refused.contains(&(rows, seq))
    }

    /// The run options of a batch that runs plainly in this session.
    pub fn plain(&self) -> &RunOptions {
        &self.plain
    }

    /// How many shapes run as graphs.
    pub fn count(&self) -> usize {
        self.shapes.len()
    }

    /// Whether this shape has been captured.
    pub fn captured(&self, rows: usize, seq: usize) -> bool {
        self.shapes.contains_key(&(rows, seq))
    }

    /// Captures a shape from two sets of inputs of it (one `[rows, seq]`
    /// array per input name, padded): beside the process's other CUDA work,
    /// a plain run of each (`gpu_graph_id = -1`, which also pays the shape's
    /// first-run cost, 50-80 ms); then, with that work held off, the graph's
    /// first call with `first` (two plain runs, the capture, a replay) and a
    /// replay with `second`. Each replay must give its set's plain vectors,
    /// which shows that it reads the buffers the host fills; a shape that
    /// does not runs plainly. A capture that fails turns this session's
    /// graphs off, with a warning.
    ///
    /// Only the capture holds the process alone: eight sessions capturing
    /// 112 shapes each with every run of a shape alone kept a first request
    /// waiting 16.5 s on an H200 (1.9 s in the run before it).
    pub fn capture(&mut self, session: &mut Session, rows: usize, seq: usize, first: &[Vec<i64>], second: &[Vec<i64>]) -> Capture {
        if LOADING.load(Ordering::Acquire) > 0 {
            std::thread::sleep(std::time::Duration::from_millis(5));
            return Capture::Later;
        }
        match self.try_capture(session, rows, seq, first, second) {
            Ok(capture) => capture,
            Err(e) => {
                tracing::warn!(rows, seq, "CUDA graphs are off for this session, whose batches run plainly: {e}");
                self.failed = true;
                Capture::Plain
            }
        }
    }

    fn try_capture(&mut self, session: &mut Session, rows: usize, seq: usize, first: &[Vec<i64>], second: &[Vec<i64>]) -> Result<Capture, EngineError> {
        let fail = |e: ort::Error| EngineError::Inference(format!("CUDA graphs: capturing {rows}x{seq}: {e}"));
        let work = shared_work();
        let mut shape_inputs = Vec::new();
        let mut binding = session.create_binding().map_err(fail)?;
        for name in &self.input_names {
            let tensor = Tensor::<i64>::new(&self.allocator, [rows, seq]).map_err(fail)?;
            binding.bind_input(*name, &tensor).map_err(fail)?;
            shape_inputs.push(tensor);
        }
        let mut output = Tensor::<f32>::new(&self.allocator, [rows, self.dim]).map_err(fail)?;
        binding.bind_output(self.output_name.as_str(), &mut output).map_err(fail)?;
        let mut graph = RunOptions::new().map_err(fail)?;
        // Ids from 1: 0 is a run's without one.
        graph.set("gpu_graph_id", (self.shapes.len() + self.refused.len() + 1).to_string()).map_err(fail)?;
        let mut shape = Shape { inputs: shape_inputs, output, binding, graph };
        let plain = [self.call(session, &mut shape, first, rows, false)?, self.call(session, &mut shape, second, rows, false)?];
        drop(work);
        let alone = CUDA_WORK.write().unwrap_or_else(|e| e.into_inner());
        let replayed = [self.call(session, &mut shape, first, rows, true)?, self.call(session, &mut shape, second, rows, true)?];
        drop(alone);
        let low = plain.iter().zip(&replayed).map(|(p, r)| min_row_cosine(p, r, self.dim)).fold(f64::INFINITY, f64::min);
        if low < CAPTURE_MIN_COSINE {
            tracing::warn!(rows, seq, min_cosine = low, "a CUDA graph's replay differs from its plain run: this shape runs plainly");
            // The graph stays captured under its id in ONNX Runtime, unused.
            self.refused.push((rows, seq));
            return Ok(Capture::Plain);
        }
        self.shapes.insert((rows, seq), shape);
        Ok(Capture::Captured)
    }

    /// Runs a captured shape: `inputs` copied into its buffers, the graph
    /// replayed, the first `real` rows of its output copied back. A replay
    /// that fails turns this session's graphs off (the caller runs the batch
    /// plainly).
    pub fn run(&mut self, session: &mut Session, rows: usize, seq: usize, inputs: &[Vec<i64>], real: usize) -> Result<Vec<f32>, EngineError> {
        let mut shape = self.shapes.remove(&(rows, seq)).ok_or_else(|| EngineError::Inference(format!("CUDA graphs: {rows}x{seq} was not captured")))?;
        let result = self.call(session, &mut shape, inputs, real, true);
        match &result {
            Ok(_) => {
                self.shapes.insert((rows, seq), shape);
            }
            Err(e) => {
                tracing::warn!(rows, seq, "a CUDA graph's replay failed; this session's batches run plainly from now on: {e}");
                self.failed = true;
            }
        }
        result
    }

    /// One call of a shape's binding, as its graph or plainly: `inputs`
    /// copied in, the first `real` rows of the output copied out.
    fn call(&self, session: &mut Session, shape: &mut Shape, inputs: &[Vec<i64>], real: usize, as_graph: bool) -> Result<Vec<f32>, EngineError> {
        let rows = shape.output.shape()[0] as usize;
        let elements = shape.inputs.first().map_or(0, |t| t.shape().iter().product::<i64>() as usize);
        if inputs.len() != shape.inputs.len() || inputs.iter().any(|host| host.len() != elements) || real > rows {
            return Err(EngineError::Input(format!(
                "CUDA graphs: a batch of {} inputs of {:?} values for a shape of {} inputs of {elements}",
                inputs.len(),
                inputs.iter().map(Vec::len).collect::<Vec<_>>(),
                shape.inputs.len()
            )));
        }
        let cudart = self.cudart;
        let mut out = vec![0f32; real * self.dim];
        let options = if as_graph { &shape.graph } else { &self.plain };
        // SAFETY: each copy's device side is a buffer of this shape holding
        // exactly the bytes copied in (checked above: [rows, seq] values) or
        // at least those copied out ([rows, dim], `real` <= rows), the host
        // side a live slice of that length; the stream is synchronized
        // before the run and before `out` is read.
        unsafe {
            cudart.check("cudaSetDevice", (cudart.set_device)(self.ordinal))?;
            for (tensor, host) in shape.inputs.iter_mut().zip(inputs) {
                let bytes = size_of_val(host.as_slice());
                cudart
                    .check("cudaMemcpyAsync", (cudart.memcpy_async)(tensor.data_ptr_mut(), host.as_ptr().cast(), bytes, MEMCPY_HOST_TO_DEVICE, self.stream))?;
            }
            cudart.check("cudaStreamSynchronize", (cudart.stream_synchronize)(self.stream))?;
            session.run_binding_with_options(&shape.binding, options).map_err(|e| EngineError::Inference(e.to_string()))?;
            let bytes = size_of_val(out.as_slice());
            cudart
                .check("cudaMemcpyAsync", (cudart.memcpy_async)(out.as_mut_ptr().cast(), shape.output.data_ptr(), bytes, MEMCPY_DEVICE_TO_HOST, self.stream))?;
            cudart.check("cudaStreamSynchronize", (cudart.stream_synchronize)(self.stream))?;
        }
        Ok(out)
    }
}

impl Drop for Graphs {
    fn drop(&mut self) {
        // SAFETY: the stream was created by `new` and is destroyed once.
        unsafe {
            (self.cudart.stream_destroy)(self.stream);
        }
    }
}

/// The lowest cosine between matching rows of two `[rows, dim]` arrays.
fn min_row_cosine(a: &[f32], b: &[f32], dim: usize) -> f64 {
    a.chunks(dim.max(1))
        .zip(b.chunks(dim.max(1)))
        .map(|(x, y)| {
            let dot: f64 = x.iter().zip(y).map(|(&p, &q)| p as f64 * q as f64).sum();
            let norm = |v: &[f32]| v.iter().map(|&p| p as f64 * p as f64).sum::<f64>().sqrt();
            let (nx, ny) = (norm(x), norm(y));
            if nx == 0.0 && ny == 0.0 {
                1.0
            } else {
                dot / (nx * ny).max(f64::MIN_POSITIVE)
            }
        })
        .fold(1.0, f64::min)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_replay_that_moves_one_row_is_refused() {
        let plain = [1.0f32, 0.0, 0.0, 1.0];
        assert_eq!(min_row_cosine(&plain, &plain, 2), 1.0);
        let moved = [1.0f32, 0.0, 1.0, 0.0];
        assert!(min_row_cosine(&plain, &moved, 2) < CAPTURE_MIN_COSINE);
        let rounded = [1.0f32, 0.0, 1e-4, 1.0];
        assert!(min_row_cosine(&plain, &rounded, 2) >= CAPTURE_MIN_COSINE);
    }
}
