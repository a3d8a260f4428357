//! The cuBLASLt implementation of the gemm template: a gemm kernel whose epilogue cuBLASLt has
//! (bias, relu, tanh-form gelu, and bias with either) runs as ONE `cublasLtMatmul` call, or one
//! per index of the batch axes no single stride spans (`LtCall::outer`).
//!
//! Row-major tensors are handed to cuBLASLt (column-major) as their transposes: the row-major
//! product `D[M, N] = A[M, K] @ B[K, N]` is the column-major `D^T = B^T A^T`, so B is
//! cuBLASLt's first operand and the bias (one value per output column) is its per-row bias
//! vector. A transposed view of an operand is read in place by flipping that operand's op flag,
//! never materialized. f32 runs with `CUBLAS_COMPUTE_32F` (no TF32); bf16 and f16 accumulate
//! in f32 (`CUBLAS_COMPUTE_32F`).
//! Invariants: `LtCall` is a pure description (built by codegen, serialisable into the launch
//! manifest); every cuBLASLt status becomes `Error::Cuda` naming the kernel, here; a machine
//! without `libcublasLt` gets `Error::NoGpu`, never cudarc's panic.

use std::sync::Arc;

use crate::codegen::cublaslt::{LtCall, LtEpilogue};
use crate::error::{Error, Result};
use crate::ir::types::DType;
use cudarc::cublaslt::result as lt;
use cudarc::cublaslt::sys;
use cudarc::driver::{CudaStream, DevicePtr};

fn data_type(d: DType) -> Result<sys::cudaDataType> {
    match d {
        DType::F32 => Ok(sys::cudaDataType_t::CUDA_R_32F),
        DType::Bf16 => Ok(sys::cudaDataType_t::CUDA_R_16BF),
        DType::F16 => Ok(sys::cudaDataType_t::CUDA_R_16F),
        _ => Err(Error::Invalid(format!("cuBLASLt has no {d} matrix product"))),
    }
}

fn status<T>(r: std::result::Result<T, lt::CublasError>, what: &str) -> Result<T> {
    r.map_err(|e| Error::Cuda { context: what.to_string(), message: e.to_string() })
}

/// Whether `libcublasLt` can be loaded (cudarc panics on first use otherwise).
pub fn available() -> bool {
    // SAFETY: only tries to open the library by name.
    unsafe { sys::is_culib_present() }
}

/// A prepared call: descriptors, layouts and the algorithm chosen once, so that each launch is
/// one `cublasLtMatmul` with no host-side planning.
pub struct LtGemm {
    pub call: LtCall,
    name: String,
    handle: sys::cublasLtHandle_t,
    desc: sys::cublasLtMatmulDesc_t,
    layouts: [sys::cublasLtMatrixLayout_t; 3],
    /// The heuristic's candidates, best first (at most [`CANDIDATES`]).
    algos: Vec<sys::cublasLtMatmulAlgo_t>,
    /// The candidate the launches run: the heuristic's first for a call not tuned, else the one
    /// the first launch timed fastest (`None` before it).
    chosen: std::sync::Mutex<Option<usize>>,
    /// Each call's element offsets of `a`, `b` and `d` (`LtCall::offsets`).
    offsets: Vec<[i64; 3]>,
    workspace: cudarc::driver::CudaSlice<u8>,
    stream: Arc<CudaStream>,
}

const WORKSPACE_BYTES: usize = 32 << 20;

/// The alignment in bytes (a power of two, at most 256: that of a device allocation) of every
/// pointer at these byte offsets from the start of a buffer.
fn pointer_alignment(byte_offsets: impl Iterator<Item = i64>) -> u32 {
    byte_offsets.fold(256u32, |a, off| if off == 0 { a } else { a.min(1 << off.trailing_zeros().min(8)) })
}

/// The heuristic's algorithms the first launch times (each 5 times, after one untimed run): its
/// first guess is not always the fastest for mid-sized f32 products.
const CANDIDATES: usize = 8;

/// Products of fewer flops keep the heuristic's first algorithm: their few microseconds time too
/// noisily on warm caches (a 256x512x50 f32 product with a bias epilogue, tuned, took 21.5 us in
/// a bench that flushes L2 against 15.1 untuned; H100, reports at f126434 and c156a40).
const TUNE_MIN_FLOPS: u64 = 1 << 30;

/// A candidate replaces the heuristic's first only when at least this much faster.
const TUNE_MARGIN: f32 = 0.95;

impl LtGemm {
    /// Builds the descriptors of `call` and asks cuBLASLt's heuristic for its best algorithms
    /// (up to [`CANDIDATES`]; a call of [`TUNE_MIN_FLOPS`] or more is tuned at its first launch).
    pub fn new(stream: Arc<CudaStream>, call: &LtCall, name: &str) -> Result<LtGemm> {
        if !available() {
            return Err(Error::NoGpu("the cuBLASLt library (libcublasLt.so) is not installed".into()));
        }
        let what = |s: &str| format!("{name}: {s}");
        let ty = data_type(call.dtype)?;
        let handle = status(lt::create_handle(), &what("creating a cuBLASLt handle"))?;
        let mut g = LtGemm {
            call: call.clone(),
            name: name.to_string(),
            handle,
            desc: std::ptr::null_mut(),
            layouts: [std::ptr::null_mut(); 3],
            algos: Vec::new(),
            chosen: std::sync::Mutex::new(None),
            offsets: call.offsets(),
            // SAFETY: scratch for cuBLASLt, which writes before it reads.
            workspace: crate::runtime::gpu::cuda_result(
                unsafe { stream.alloc::<u8>(WORKSPACE_BYTES) },
                "cuBLASLt workspace",
            )?,
            stream,
        };
        g.desc = status(
            lt::create_matmul_desc(sys::cublasComputeType_t::CUBLAS_COMPUTE_32F, sys::cudaDataType_t::CUDA_R_32F),
            &what("creating the matmul descriptor"),
        )?;
        let set_desc = |attr, ptr: *const std::ffi::c_void, size: usize| {
            // SAFETY: `ptr` points at `size` bytes of the attribute's type.
            status(unsafe { lt::set_matmul_desc_attribute(g.desc, attr, ptr, size) }, &what("setting an attribute"))
        };
        use sys::cublasLtMatmulDescAttributes_t as D;
        let (ta, tb): (i32, i32) = (call.a.transpose.into(), call.b.transpose.into());
        set_desc(D::CUBLASLT_MATMUL_DESC_TRANSA, &ta as *const i32 as *const _, 4)?;
        set_desc(D::CUBLASLT_MATMUL_DESC_TRANSB, &tb as *const i32 as *const _, 4)?;
        let epi = match call.epilogue {
            LtEpilogue::Default => sys::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_DEFAULT,
            LtEpilogue::Bias => sys::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_BIAS,
            LtEpilogue::Relu => sys::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_RELU,
            LtEpilogue::ReluBias => sys::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_RELU_BIAS,
            LtEpilogue::Gelu => sys::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_GELU,
            LtEpilogue::GeluBias => sys::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_GELU_BIAS,
        };
        set_desc(D::CUBLASLT_MATMUL_DESC_EPILOGUE, &epi as *const _ as *const _, std::mem::size_of_val(&epi))?;
        if call.bias.is_some() {
            set_desc(D::CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &ty as *const _ as *const _, std::mem::size_of_val(&ty))?;
        }
        let layout = |o: (u64, u64, i64, i64)| -> Result<sys::cublasLtMatrixLayout_t> {
            let l = status(lt::create_matrix_layout(ty, o.0, o.1, o.2), &what("creating a matrix layout"))?;
            if call.batch > 1 {
                let count = call.batch as i32;
                use sys::cublasLtMatrixLayoutAttribute_t as L;
                // SAFETY: the attributes are an i32 and an i64, passed with their sizes.
                unsafe {
                    status(
                        lt::set_matrix_layout_attribute(
                            l,
                            L::CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                            &count as *const i32 as *const _,
                            4,
                        ),
                        &what("setting the batch count"),
                    )?;
                    status(
                        lt::set_matrix_layout_attribute(
                            l,
                            L::CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                            &o.3 as *const i64 as *const _,
                            8,
                        ),
                        &what("setting the batch stride"),
                    )?;
                }
            }
            Ok(l)
        };
        g.layouts[0] = layout((call.a.rows, call.a.cols, call.a.ld, call.a.batch_stride))?;
        g.layouts[1] = layout((call.b.rows, call.b.cols, call.b.ld, call.b.batch_stride))?;
        g.layouts[2] = layout((call.m, call.n, call.m as i64, (call.m * call.n) as i64))?;
        let pref = status(lt::create_matmul_pref(), &what("creating a preference"))?;
        let ws = WORKSPACE_BYTES;
        use sys::cublasLtMatmulPreferenceAttributes_t as P;
        // SAFETY: plain data the heuristic overwrites (its first `count` entries are read).
        let mut results: Vec<sys::cublasLtMatmulHeuristicResult_t> = vec![unsafe { std::mem::zeroed() }; CANDIDATES];
        let mut count = 0i32;
        // SAFETY: the attribute is a usize, passed with its size; `pref` is live; `results`
        // holds `CANDIDATES` entries.
        unsafe {
            let r = status(
                lt::set_matmul_pref_attribute(
                    pref,
                    P::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                    &ws as *const usize as *const _,
                    8,
                ),
                &what("setting the workspace size"),
            )
            .and_then(|_| {
                // The alignment of each matrix's first element (a slice read in place, a looped
                // batch axis: an offset from the buffer): the heuristic otherwise assumes 256
                // bytes and may pick an algorithm the pointers do not suit. (C is D.)
                let size = call.dtype.size() as i64;
                let align = |which: usize| pointer_alignment(g.offsets.iter().map(|o| o[which] * size));
                let prefs = [
                    (P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align(0)),
                    (P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align(1)),
                    (P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, align(2)),
                    (P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align(2)),
                ];
                for (attr, bytes) in prefs {
                    status(
                        lt::set_matmul_pref_attribute(pref, attr, &bytes as *const u32 as *const _, 4),
                        &what("setting an operand's alignment"),
                    )?;
                }
                Ok(())
            })
            .and_then(|_| {
                status(
                    sys::cublasLtMatmulAlgoGetHeuristic(
                        g.handle,
                        g.desc,
                        g.layouts[0],
                        g.layouts[1],
                        g.layouts[2],
                        g.layouts[2],
                        pref,
                        CANDIDATES as i32,
                        results.as_mut_ptr(),
                        &mut count,
                    )
                    .result(),
                    &what("asking cuBLASLt's heuristic"),
                )
            });
            let _ = lt::destroy_matmul_pref(pref);
            r?
        };
        g.algos = results
            .iter()
            .take(count.max(0) as usize)
            .filter(|r| r.state == sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS && r.workspaceSize <= WORKSPACE_BYTES)
            .map(|r| r.algo)
            .collect();
        if g.algos.is_empty() {
            return Err(Error::Cuda {
                context: what("no cuBLASLt algorithm for this product"),
                message: "the heuristic returned none".into(),
            });
        }
        let flops = 2 * call.m * call.n * call.k * call.batch * call.calls();
        if g.algos.len() == 1 || flops < TUNE_MIN_FLOPS || std::env::var_os("EQFUSE_NO_LT_TUNE").is_some() {
            g.chosen = std::sync::Mutex::new(Some(0));
        }
        Ok(g)
    }

    /// Queues the call on the stream: `a`, `b`, the bias (if any) and `d` are device buffers
    /// of the sizes the plan gives those tensors.
    pub fn launch(
        &self,
        a: &crate::runtime::gpu::Buffer,
        b: &crate::runtime::gpu::Buffer,
        bias: Option<&crate::runtime::gpu::Buffer>,
        d: &crate::runtime::gpu::Buffer,
    ) -> Result<()> {
        let s = &self.stream;
        let (pa, _ra) = a.device_ptr(s);
        let (pb, _rb) = b.device_ptr(s);
        let (pd, _rd) = d.device_ptr(s);
        let (pw, _rw) = self.workspace.device_ptr(s);
        let bias_ptr = bias.map(|x| x.device_ptr(s));
        if let Some((p, _)) = &bias_ptr {
            let p: u64 = *p;
            // SAFETY: the attribute is a device pointer, passed with its size.
            status(
                unsafe {
                    lt::set_matmul_desc_attribute(
                        self.desc,
                        sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                        &p as *const u64 as *const _,
                        8,
                    )
                },
                &self.name,
            )?;
        }
        let chosen = *self.chosen.lock().unwrap_or_else(|e| e.into_inner());
        let algo = match chosen {
            Some(i) => i,
            // Nothing runs while a graph is captured: the heuristic's first, untuned.
            None if !matches!(
                s.capture_status(),
                Ok(cudarc::driver::sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE)
            ) =>
            {
                0
            }
            None => {
                let best = self.tune(pa, pb, pd, pw)?;
                *self.chosen.lock().unwrap_or_else(|e| e.into_inner()) = Some(best);
                best
            }
        };
        self.matmul(algo, pa, pb, pd, pw)
    }

    /// Times each candidate algorithm on the launch's own buffers (one untimed run, then the
    /// median of 5) and returns the fastest one's index, the heuristic's first unless another is
    /// [`TUNE_MARGIN`] of its time or less. Writes `d` (every candidate computes the same product;
    /// the launch then runs the chosen one).
    fn tune(&self, pa: u64, pb: u64, pd: u64, pw: u64) -> Result<usize> {
        let s = &self.stream;
        let ctx = s.context();
        let flags = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
        let ev = |what: &str| crate::runtime::gpu::cuda_result(ctx.new_event(flags), &format!("{}: {what}", self.name));
        let (a, b) = (ev("a timing event")?, ev("a timing event")?);
        let mut best = (f32::INFINITY, 0);
        let mut first = f32::INFINITY;
        for i in 0..self.algos.len() {
            // A candidate that fails to run is skipped (the heuristic's first must run).
            if self.matmul(i, pa, pb, pd, pw).is_err() && i > 0 {
                continue;
            }
            let mut times = Vec::with_capacity(5);
            for _ in 0..5 {
                crate::runtime::gpu::cuda_result(a.record(s), &self.name)?;
                self.matmul(i, pa, pb, pd, pw)?;
                crate::runtime::gpu::cuda_result(b.record(s), &self.name)?;
                times.push(crate::runtime::gpu::cuda_result(a.elapsed_ms(&b), &self.name)?);
            }
            times.sort_by(|x, y| x.total_cmp(y));
            let median = times[2];
            if i == 0 {
                first = median;
            }
            if median < best.0 {
                best = (median, i);
            }
        }
        Ok(if best.0 <= TUNE_MARGIN * first { best.1 } else { 0 })
    }

    /// The call (looped over its outer batch axes) with candidate `algo`.
    fn matmul(&self, algo: usize, pa: u64, pb: u64, pd: u64, pw: u64) -> Result<()> {
        let s = &self.stream;
        let (alpha, beta) = (self.call.alpha, 0.0f32);
        let size = self.call.dtype.size() as i64;
        let at = |p: u64, elements: i64| (p as i64 + elements * size) as u64;
        for &[oa, ob, od] in &self.offsets {
            let (pa, pb, pd) = (at(pa, oa), at(pb, ob), at(pd, od));
            // SAFETY: descriptors are live; the buffers hold the matrices the layouts describe
            // at each call's offsets (codegen built both from the tensors' shapes and views);
            // C is D with beta = 0.
            status(
                unsafe {
                    lt::matmul(
                        self.handle,
                        self.desc,
                        &alpha as *const f32 as *const _,
                        &beta as *const f32 as *const _,
                        pa as *const _,
                        self.layouts[0],
                        pb as *const _,
                        self.layouts[1],
                        pd as *const _,
                        self.layouts[2],
                        pd as *mut _,
                        self.layouts[2],
                        &self.algos[algo],
                        pw as *mut _,
                        WORKSPACE_BYTES,
                        s.cu_stream() as *mut _,
                    )
                },
                &self.name,
            )?;
        }
        Ok(())
    }
}

impl Drop for LtGemm {
    fn drop(&mut self) {
        // SAFETY: each handle was created by this value and is destroyed once; errors on
        // teardown are ignored (nothing can be done about them).
        unsafe {
            for l in self.layouts {
                if !l.is_null() {
                    let _ = lt::destroy_matrix_layout(l);
                }
            }
            if !self.desc.is_null() {
                let _ = lt::destroy_matmul_desc(self.desc);
            }
            let _ = lt::destroy_handle(self.handle);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::pointer_alignment;

    #[test]
    fn alignment_of_offset_pointers() {
        assert_eq!(pointer_alignment([0i64].into_iter()), 256);
        assert_eq!(pointer_alignment([0i64, 1536].into_iter()), 256);
        // A bf16 slice from element 768 of each row: 1536 bytes, then rows 4608 bytes apart.
        assert_eq!(pointer_alignment([1536i64, 4608 + 1536].into_iter()), 256);
        assert_eq!(pointer_alignment([2i64].into_iter()), 2);
        assert_eq!(pointer_alignment([48i64, 64].into_iter()), 16);
    }
}
