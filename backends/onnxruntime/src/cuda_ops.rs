//! Operators of eeane's own for ONNX Runtime's CUDA provider, which lacks
//! them, each one cuBLASLt matmul with an epilogue:
//! `ai.eeane.cuda:GemmFastGelu(X, W, bias) = FastGelu(X·W + bias)` and
//! `ai.eeane.cuda:GemmBias(X, W, bias) = X·W + bias`.
//!
//! Why: in a BERT layer the CUDA provider runs the feed-forward's first
//! matmul, then BiasGelu over its output (1,536 values a token for
//! all-MiniLM-L6-v2) as a kernel of its own, which reads and writes that
//! tensor once more: 16 % of the kernels' time on an H100
//! (docs/performance.md). cuBLASLt's GELU epilogue does it while the matmul
//! writes its output. Its GELU is the tanh form (com.microsoft's FastGelu),
//! not the erf form that BERT was trained with: models/prepare.py checks the
//! graph with FastGelu on the CPU against the float64 network before it
//! writes this operator in, and the card's fp16 gate checks it again.
//! Likewise the Attention operator's Q/K/V bias is added by a kernel that
//! also transposes its packed output (11 % of the kernels' time); with Q, K
//! and V as three GemmBias into MultiHeadAttention
//! (models/gpu_graph.py's `split_attention`) neither pass remains.
//!
//! cuBLASLt is the library the CUDA provider itself loads
//! (`cuda::preload`), opened here by the same path; cudarc gives its types.

use std::collections::HashMap;
use std::ffi::c_void;
use std::path::Path;
use std::ptr;
use std::sync::OnceLock;

use cudarc::cublaslt::sys::{
    cublasComputeType_t, cublasLtEpilogue_t, cublasLtHandle_t, cublasLtMatmulAlgo_t, cublasLtMatmulDescAttributes_t, cublasLtMatmulDesc_t,
    cublasLtMatmulHeuristicResult_t, cublasLtMatmulPreferenceAttributes_t, cublasLtMatmulPreference_t, cublasLtMatrixLayout_t, cublasStatus_t, cudaDataType,
    cudaStream_t,
};
use eeane_backend_core::EngineError;
use ort::memory::{Allocator, MemoryType};
use ort::operator::{ComputeContext, Kernel, KernelContext, Operator, OperatorDomain, OperatorInput, OperatorOutput, ShapeInferenceContext};
use ort::value::{DynTensorValueType, TensorElementType, ValueType};

/// The domain of eeane's CUDA operators in a graph.
pub const DOMAIN: &str = "ai.eeane.cuda";

/// cuBLASLt's scratch memory for one operator node: what its heuristics may
/// use for these shapes (NVIDIA suggests 32 MiB on Hopper for the largest).
const WORKSPACE_BYTES: usize = 8 << 20;

/// The cuBLASLt entry points this operator calls, with their C signatures.
struct CublasLt {
    _library: libloading::Library,
    create: unsafe extern "C" fn(*mut cublasLtHandle_t) -> cublasStatus_t,
    destroy: unsafe extern "C" fn(cublasLtHandle_t) -> cublasStatus_t,
    desc_create: unsafe extern "C" fn(*mut cublasLtMatmulDesc_t, cublasComputeType_t, cudaDataType) -> cublasStatus_t,
    desc_destroy: unsafe extern "C" fn(cublasLtMatmulDesc_t) -> cublasStatus_t,
    desc_set: unsafe extern "C" fn(cublasLtMatmulDesc_t, cublasLtMatmulDescAttributes_t, *const c_void, usize) -> cublasStatus_t,
    layout_create: unsafe extern "C" fn(*mut cublasLtMatrixLayout_t, cudaDataType, u64, u64, i64) -> cublasStatus_t,
    layout_destroy: unsafe extern "C" fn(cublasLtMatrixLayout_t) -> cublasStatus_t,
    pref_create: unsafe extern "C" fn(*mut cublasLtMatmulPreference_t) -> cublasStatus_t,
    pref_destroy: unsafe extern "C" fn(cublasLtMatmulPreference_t) -> cublasStatus_t,
    pref_set: unsafe extern "C" fn(cublasLtMatmulPreference_t, cublasLtMatmulPreferenceAttributes_t, *const c_void, usize) -> cublasStatus_t,
    #[allow(clippy::type_complexity)]
    heuristic: unsafe extern "C" fn(
        cublasLtHandle_t,
        cublasLtMatmulDesc_t,
        cublasLtMatrixLayout_t,
        cublasLtMatrixLayout_t,
        cublasLtMatrixLayout_t,
        cublasLtMatrixLayout_t,
        cublasLtMatmulPreference_t,
        i32,
        *mut cublasLtMatmulHeuristicResult_t,
        *mut i32,
    ) -> cublasStatus_t,
    #[allow(clippy::type_complexity)]
    matmul: unsafe extern "C" fn(
        cublasLtHandle_t,
        cublasLtMatmulDesc_t,
        *const c_void,
        *const c_void,
        cublasLtMatrixLayout_t,
        *const c_void,
        cublasLtMatrixLayout_t,
        *const c_void,
        *const c_void,
        cublasLtMatrixLayout_t,
        *mut c_void,
        cublasLtMatrixLayout_t,
        *const cublasLtMatmulAlgo_t,
        *mut c_void,
        usize,
        cudaStream_t,
    ) -> cublasStatus_t,
}

static CUBLASLT: OnceLock<Result<CublasLt, EngineError>> = OnceLock::new();

fn open(path: &Path) -> Result<CublasLt, EngineError> {
    // SAFETY: cuBLASLt's documented entry points, each field typed as its C
    // signature (cudarc's bindings of cublasLt.h give the argument types).
    unsafe {
        crate::cuda::entry_points!(
            path,
            "cuBLASLt",
            CublasLt {
                create: "cublasLtCreate",
                destroy: "cublasLtDestroy",
                desc_create: "cublasLtMatmulDescCreate",
                desc_destroy: "cublasLtMatmulDescDestroy",
                desc_set: "cublasLtMatmulDescSetAttribute",
                layout_create: "cublasLtMatrixLayoutCreate",
                layout_destroy: "cublasLtMatrixLayoutDestroy",
                pref_create: "cublasLtMatmulPreferenceCreate",
                pref_destroy: "cublasLtMatmulPreferenceDestroy",
                pref_set: "cublasLtMatmulPreferenceSetAttribute",
                heuristic: "cublasLtMatmulAlgoGetHeuristic",
                matmul: "cublasLtMatmul",
            }
        )
    }
}

fn lt() -> ort::Result<&'static CublasLt> {
    match CUBLASLT.get() {
        Some(Ok(lt)) => Ok(lt),
        Some(Err(e)) => Err(ort::Error::new(e.to_string())),
        None => Err(ort::Error::new("cuBLASLt was not opened before the session")),
    }
}

/// `operator`: the operator's name, so that an error says which one failed.
fn check(operator: &str, what: &str, status: cublasStatus_t) -> ort::Result<()> {
    match status {
        cublasStatus_t::CUBLAS_STATUS_SUCCESS => Ok(()),
        other => Err(ort::Error::new(format!("{DOMAIN}:{operator}: {what} returned {other:?}"))),
    }
}

/// eeane's CUDA operators, for a session on the CUDA provider; `cublas_lt`
/// is libcublasLt's path, the one the provider loaded.
pub fn domain(cublas_lt: &Path) -> Result<OperatorDomain, EngineError> {
    CUBLASLT.get_or_init(|| open(cublas_lt)).as_ref().map_err(Clone::clone)?;
    OperatorDomain::new(DOMAIN)
        .and_then(|d| d.add(Gemm::FAST_GELU))
        .and_then(|d| d.add(Gemm::BIAS))
        .map_err(|e| EngineError::Runtime(format!("cannot register the {DOMAIN} operators: {e}")))
}

/// `Y = epilogue(X·W + bias)`: X fp16 [.., K], W fp16 [K, N], bias fp16 [N],
/// Y fp16 [.., N]; compute and scale in fp32, as the CUDA provider's MatMul.
#[derive(Clone, Copy)]
struct Gemm {
    name: &'static str,
    epilogue: cublasLtEpilogue_t,
}

impl Gemm {
    /// GELU in the tanh form after the bias.
    const FAST_GELU: Gemm = Gemm { name: "GemmFastGelu", epilogue: cublasLtEpilogue_t::CUBLASLT_EPILOGUE_GELU_BIAS };
    /// The bias alone.
    const BIAS: Gemm = Gemm { name: "GemmBias", epilogue: cublasLtEpilogue_t::CUBLASLT_EPILOGUE_BIAS };
}

impl Operator for Gemm {
    type Kernel<'attr> = GemmKernel;

    fn name(&self) -> &str {
        self.name
    }

    fn execution_provider_type(&self) -> Option<&str> {
        Some("CUDAExecutionProvider")
    }

    fn inputs(&self) -> impl IntoIterator<Item = OperatorInput> {
        [const { OperatorInput::required(TensorElementType::Float16) }; 3]
    }

    fn outputs(&self) -> impl IntoIterator<Item = OperatorOutput> {
        [OperatorOutput::required(TensorElementType::Float16)]
    }

    fn create_kernel<'attr>(&self, kctx: &KernelContext<'attr>) -> ort::Result<GemmKernel> {
        let lt = lt()?;
        let allocator = kctx.allocator(MemoryType::Default)?;
        let workspace = allocator.alloc::<u8>(WORKSPACE_BYTES)?.into_raw();
        let mut kernel =
            GemmKernel { name: self.name, allocator, workspace, handle: ptr::null_mut(), desc: ptr::null_mut(), pref: ptr::null_mut(), plans: HashMap::new() };
        // SAFETY: out-pointers to handles the kernel owns and destroys in Drop.
        unsafe {
            check(self.name, "cublasLtCreate", (lt.create)(&mut kernel.handle))?;
            check(
                self.name,
                "cublasLtMatmulDescCreate",
                (lt.desc_create)(&mut kernel.desc, cublasComputeType_t::CUBLAS_COMPUTE_32F, cudaDataType::CUDA_R_32F),
            )?;
            let epilogue = self.epilogue;
            check(
                self.name,
                "cublasLtMatmulDescSetAttribute(EPILOGUE)",
                (lt.desc_set)(
                    kernel.desc,
                    cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_EPILOGUE,
                    (&epilogue as *const cublasLtEpilogue_t).cast(),
                    size_of_val(&epilogue),
                ),
            )?;
            check(self.name, "cublasLtMatmulPreferenceCreate", (lt.pref_create)(&mut kernel.pref))?;
            let bytes = WORKSPACE_BYTES as u64;
            check(
                self.name,
                "cublasLtMatmulPreferenceSetAttribute(MAX_WORKSPACE_BYTES)",
                (lt.pref_set)(
                    kernel.pref,
                    cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                    (&bytes as *const u64).cast(),
                    size_of_val(&bytes),
                ),
            )?;
        }
        Ok(kernel)
    }

    fn infer_shape(&self, ctx: &mut ShapeInferenceContext) -> ort::Result<()> {
        let inputs = ctx.inputs();
        let (Some(ValueType::Tensor { ty, shape: x, dimension_symbols }), Some(ValueType::Tensor { shape: w, .. })) = (inputs.first(), inputs.get(1)) else {
            return Err(ort::Error::new(format!("{} takes tensors", self.name)));
        };
        let (Some(_), Some(&n)) = (x.last(), w.last()) else { return Err(ort::Error::new(format!("{} takes X [.., K] and W [K, N]", self.name))) };
        let mut shape = x.clone();
        let last = shape.len() - 1;
        shape[last] = n;
        // The batch's symbols carry over; N is a number.
        let symbols = dimension_symbols.iter().enumerate().map(|(i, s)| if i == last { String::new() } else { s.clone() }).collect();
        ctx.set_output(0, &ValueType::Tensor { ty: *ty, shape, dimension_symbols: symbols })
    }
}

/// cuBLASLt's layouts and chosen algorithm for one count of rows.
struct Plan {
    w: cublasLtMatrixLayout_t,
    x: cublasLtMatrixLayout_t,
    y: cublasLtMatrixLayout_t,
    algo: cublasLtMatmulAlgo_t,
}

struct GemmKernel {
    /// The operator's name, for errors.
    name: &'static str,
    allocator: Allocator,
    workspace: *mut c_void,
    handle: cublasLtHandle_t,
    desc: cublasLtMatmulDesc_t,
    pref: cublasLtMatmulPreference_t,
    /// By (rows, K, N): a shape's heuristic query once, not per run.
    plans: HashMap<(u64, u64, u64), Plan>,
}

// SAFETY: the raw pointers are cuBLASLt objects and device memory this kernel
// alone uses; a kernel belongs to one session, and eeane runs a session from
// one engine at a time (`Engine::run` takes `&mut self`), so its computes
// never overlap.
unsafe impl Send for GemmKernel {}

impl GemmKernel {
    /// Row-major Y[M,N] = X[M,K]·W[K,N] is column-major Yᵀ = Wᵀ·Xᵀ: cuBLASLt's
    /// A is W as an N×K matrix, B is X as K×M, D is Y as N×M, and its bias
    /// (one value per row of D) is the model's bias over N.
    fn plan(&mut self, lt: &CublasLt, m: u64, k: u64, n: u64) -> ort::Result<&Plan> {
        if !self.plans.contains_key(&(m, k, n)) {
            let mut plan = Plan { w: ptr::null_mut(), x: ptr::null_mut(), y: ptr::null_mut(), algo: cublasLtMatmulAlgo_t { data: [0; 8] } };
            // SAFETY: layouts this kernel owns (destroyed in Drop), and the
            // heuristic's out-pointers.
            unsafe {
                let made = check(self.name, "cublasLtMatrixLayoutCreate", (lt.layout_create)(&mut plan.w, cudaDataType::CUDA_R_16F, n, k, n as i64))
                    .and_then(|()| check(self.name, "cublasLtMatrixLayoutCreate", (lt.layout_create)(&mut plan.x, cudaDataType::CUDA_R_16F, k, m, k as i64)))
                    .and_then(|()| check(self.name, "cublasLtMatrixLayoutCreate", (lt.layout_create)(&mut plan.y, cudaDataType::CUDA_R_16F, n, m, n as i64)))
                    .and_then(|()| {
                        let mut found = std::mem::zeroed::<cublasLtMatmulHeuristicResult_t>();
                        let mut count = 0;
                        let status = (lt.heuristic)(self.handle, self.desc, plan.w, plan.x, plan.y, plan.y, self.pref, 1, &mut found, &mut count);
                        if status != cublasStatus_t::CUBLAS_STATUS_SUCCESS || count == 0 {
                            return Err(ort::Error::new(format!("{DOMAIN}:{}: cuBLASLt has no algorithm for [{m}, {k}]·[{k}, {n}] ({status:?})", self.name)));
                        }
                        plan.algo = found.algo;
                        Ok(())
                    });
                if let Err(e) = made {
                    for layout in [plan.w, plan.x, plan.y].into_iter().filter(|l| !l.is_null()) {
                        (lt.layout_destroy)(layout);
                    }
                    return Err(e);
                }
            }
            self.plans.insert((m, k, n), plan);
        }
        Ok(&self.plans[&(m, k, n)])
    }
}

impl Kernel for GemmKernel {
    fn compute(&mut self, ctx: &ComputeContext) -> ort::Result<()> {
        let lt = lt()?;
        let name = self.name;
        let missing = || ort::Error::new(format!("{name}: an input is missing"));
        let x = ctx.input(0)?.ok_or_else(missing)?.downcast::<DynTensorValueType>()?;
        let w = ctx.input(1)?.ok_or_else(missing)?.downcast::<DynTensorValueType>()?;
        let bias = ctx.input(2)?.ok_or_else(missing)?.downcast::<DynTensorValueType>()?;
        let (x_shape, w_shape) = (x.shape().to_vec(), w.shape().to_vec());
        let (&[k_w, n], Some(&k)) = (w_shape.as_slice(), x_shape.last()) else {
            return Err(ort::Error::new(format!("{name}: W is {w_shape:?}, not [K, N]")));
        };
        if k != k_w || bias.shape().iter().product::<i64>() != n {
            return Err(ort::Error::new(format!("{name}: X {x_shape:?}, W {w_shape:?}, bias {:?} do not agree", bias.shape())));
        }
        let m: i64 = x_shape[..x_shape.len() - 1].iter().product();
        let mut y_shape = x_shape.clone();
        *y_shape.last_mut().expect("X has a last axis") = n;
        let y = ctx.output(0, y_shape)?.ok_or_else(|| ort::Error::new(format!("{name}: no output")))?.downcast::<DynTensorValueType>()?;
        if m == 0 {
            return Ok(());
        }
        // ONNX Runtime's stream for this session: the default stream would
        // not be ordered with the provider's kernels.
        let stream = ctx.stream()?.ok_or_else(|| ort::Error::new(format!("{name}: the CUDA provider gave no compute stream")))?.as_ptr().cast();
        let (x_ptr, w_ptr, bias_ptr, y_ptr) = (x.data_ptr(), w.data_ptr(), bias.data_ptr(), y.data_ptr().cast_mut());
        let (handle, desc, workspace) = (self.handle, self.desc, self.workspace);
        let plan = self.plan(lt, m as u64, k as u64, n as u64)?;
        let (alpha, beta) = (1.0f32, 0.0f32);
        // SAFETY: device pointers of tensors whose shapes were checked above
        // against the layouts; the bias attribute is read at enqueue time.
        unsafe {
            check(
                name,
                "cublasLtMatmulDescSetAttribute(BIAS_POINTER)",
                (lt.desc_set)(
                    desc,
                    cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                    (&bias_ptr as *const *const c_void).cast(),
                    size_of::<*const c_void>(),
                ),
            )?;
            check(
                name,
                "cublasLtMatmul",
                (lt.matmul)(
                    handle,
                    desc,
                    (&alpha as *const f32).cast(),
                    w_ptr,
                    plan.w,
                    x_ptr,
                    plan.x,
                    (&beta as *const f32).cast(),
                    y_ptr.cast_const(),
                    plan.y,
                    y_ptr,
                    plan.y,
                    &plan.algo,
                    workspace,
                    WORKSPACE_BYTES,
                    stream,
                ),
            )
        }
    }
}

impl Drop for GemmKernel {
    fn drop(&mut self) {
        let Ok(lt) = lt() else { return };
        // SAFETY: objects created by this kernel, destroyed once; the
        // workspace came from this allocator.
        unsafe {
            for plan in self.plans.values() {
                for layout in [plan.w, plan.x, plan.y] {
                    (lt.layout_destroy)(layout);
                }
            }
            if !self.pref.is_null() {
                (lt.pref_destroy)(self.pref);
            }
            if !self.desc.is_null() {
                (lt.desc_destroy)(self.desc);
            }
            if !self.handle.is_null() {
                (lt.destroy)(self.handle);
            }
            self.allocator.free(self.workspace);
        }
    }
}
