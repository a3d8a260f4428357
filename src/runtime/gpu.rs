//! The GPU runtime: one CUDA device through `cudarc` (driver API, dynamic loading), device
//! buffers, NVRTC-compiled kernels, launches and event timing.
//!
//! Invariants: every CUDA error is wrapped once, here, into [`Error::Cuda`] naming the kernel
//! or operation; a machine without a driver or a device gets [`Error::NoGpu`]; nothing panics
//! (`cudarc` panics when a library is missing, so both libraries are checked before use).
//! Buffers are plain device allocations (never managed memory).

use std::sync::Arc;

use cudarc::driver::sys::{CUdevice_attribute, CUevent_flags};
use cudarc::driver::{
    CudaContext, CudaEvent, CudaFunction, CudaSlice, CudaStream, DevicePtr, DriverError, LaunchConfig, PushKernelArg,
};
use cudarc::nvrtc::Ptx;

use crate::codegen::KernelSource;
use crate::error::{Error, Result};
use crate::ir::tensor::Tensor;
use crate::ir::types::{DType, TensorType};

/// A device buffer of bytes.
pub type Buffer = CudaSlice<u8>;

/// Wraps a driver error with what was being done.
fn cuda<T>(r: std::result::Result<T, DriverError>, context: &str) -> Result<T> {
    r.map_err(|e| Error::Cuda { context: context.to_string(), message: e.to_string() })
}

/// [`cuda`] for other modules of the runtime (the cuBLASLt path).
pub(crate) fn cuda_result<T>(r: std::result::Result<T, DriverError>, context: &str) -> Result<T> {
    cuda(r, context)
}

/// The device all GPU work of a process goes to.
pub struct Gpu {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    /// The device's name as the driver reports it.
    pub name: String,
    /// `sm_{major}{minor}`.
    pub arch: String,
    pub sms: u32,
    pub l2_bytes: usize,
    pub memory_bytes: usize,
}

/// Launches captured once into a CUDA graph, replayed as one unit.
pub struct Graph(cudarc::driver::CudaGraph);

/// A compiled kernel ready to launch.
pub struct Loaded {
    pub source: KernelSource,
    /// The compiled kernel, or (for a gemm kernel that is one cuBLASLt call) the prepared call.
    func: Option<CudaFunction>,
    lt: Option<crate::runtime::cublas::LtGemm>,
    /// Whether NVRTC's output came from the disk cache.
    pub cached: bool,
    /// For a persistent kernel, the blocks that fit on the device at once (one wave).
    pub resident_blocks: Option<u32>,
    /// Whether the source's Hopper path was compiled (for sm_90a) and its launch shape taken.
    pub sm90a: bool,
}

impl Gpu {
    /// Opens device 0, or says why there is no usable GPU.
    pub fn open() -> Result<Gpu> {
        // SAFETY: only tries to open the driver library by name.
        if !unsafe { cudarc::driver::sys::is_culib_present() } {
            return Err(Error::NoGpu("the NVIDIA driver library (libcuda.so) is not installed".into()));
        }
        let count = CudaContext::device_count().map_err(|e| Error::NoGpu(format!("the CUDA driver failed: {e}")))?;
        if count < 1 {
            return Err(Error::NoGpu("the CUDA driver sees no device".into()));
        }
        crate::runtime::nvrtc::available()
            .map_err(|why| Error::NoGpu(format!("a GPU is present but NVRTC is not: {why}")))?;
        let ctx = CudaContext::new(0).map_err(|e| Error::NoGpu(format!("cannot open device 0: {e}")))?;
        // One stream, so cudarc's cross-stream event tracking is pure overhead.
        // SAFETY: no buffers exist yet; everything runs on the one stream below.
        unsafe { ctx.disable_event_tracking() };
        // A created stream, not the legacy default one, which CUDA-graph capture refuses.
        let stream = cuda(ctx.new_stream(), "creating a stream")?;
        let (major, minor) = cuda(ctx.compute_capability(), "reading the compute capability")?;
        let attr = |a, what| cuda(ctx.attribute(a), what);
        let sms = attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, "reading the SM count")? as u32;
        let l2 = attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE, "reading the L2 size")? as usize;
        Ok(Gpu {
            name: cuda(ctx.name(), "reading the device name")?,
            arch: format!("sm_{major}{minor}"),
            sms,
            l2_bytes: l2,
            memory_bytes: cuda(ctx.total_mem(), "reading the memory size")?,
            stream,
            ctx,
        })
    }

    /// An uninitialised buffer of `bytes` (at least 16, so every pointer is valid).
    pub fn alloc(&self, bytes: usize, what: &str) -> Result<Buffer> {
        // SAFETY: the contents are written (upload, fill or a kernel) before they are read.
        cuda(unsafe { self.stream.alloc::<u8>(bytes.max(16)) }, &format!("allocating {bytes} bytes for {what}"))
    }

    /// Sets every byte of `buf` to `byte`.
    pub fn fill(&self, buf: &mut Buffer, byte: u8, what: &str) -> Result<()> {
        let (ptr, _sync) = buf.device_ptr(&self.stream);
        // SAFETY: `ptr` is a live allocation of `buf.len()` bytes on this stream.
        let r = unsafe { cudarc::driver::result::memset_d8_async(ptr, byte, buf.len(), self.stream.cu_stream()) };
        cuda(r, &format!("filling {what}"))
    }

    pub fn upload(&self, bytes: &[u8], what: &str) -> Result<Buffer> {
        let mut buf = self.alloc(bytes.len(), what)?;
        if !bytes.is_empty() {
            let mut view = buf.slice_mut(..bytes.len());
            cuda(self.stream.memcpy_htod(bytes, &mut view), &format!("uploading {what}"))?;
        }
        Ok(buf)
    }

    /// The first `len` bytes of `buf`.
    pub fn download(&self, buf: &Buffer, len: usize, what: &str) -> Result<Vec<u8>> {
        cuda(self.stream.clone_dtoh(&buf.slice(..len)), &format!("downloading {what}"))
    }

    /// Copies `len` bytes device to device.
    pub fn copy(&self, src: &Buffer, dst: &mut Buffer, len: usize) -> Result<()> {
        let mut to = dst.slice_mut(..len);
        cuda(self.stream.memcpy_dtod(&src.slice(..len), &mut to), "a device-to-device copy")
    }

    /// Compiles (through the NVRTC disk cache) and loads a kernel.
    pub fn load(&self, source: &KernelSource) -> Result<Loaded> {
        if let Some(call) = &source.cublaslt {
            let lt = crate::runtime::cublas::LtGemm::new(self.stream.clone(), call, &source.name)?;
            return Ok(Loaded {
                source: source.clone(),
                func: None,
                lt: Some(lt),
                cached: true,
                resident_blocks: None,
                sm90a: false,
            });
        }
        // A source with a Hopper path runs it on a 9.0 device: compiled for sm_90a, launched
        // with that path's shape (`EQFUSE_NO_SM90A` set keeps the portable path, for comparisons).
        let mut source = source.clone();
        let mut arch = self.arch.as_str();
        if let Some(hopper) = source.launch.sm90a.take() {
            if self.arch == "sm_90" && std::env::var_os("EQFUSE_NO_SM90A").is_none() {
                source.launch = *hopper;
                arch = "sm_90a";
            }
        }
        let c = crate::runtime::nvrtc::compile_cached(&source.source, &source.name, arch)?;
        let ptx = String::from_utf8_lossy(&c.ptx).into_owned();
        let module = cuda(self.ctx.load_module(Ptx::from_src(ptx)), &format!("loading {}", source.name))?;
        let func = cuda(module.load_function(&source.name), &format!("finding {}", source.name))?;
        // (Any dynamic size is allowed explicitly: 48 KiB of it plus the kernel's static shared
        // memory already exceed the default limit.)
        if source.launch.smem_bytes > 0 {
            use cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES as MAX_SMEM;
            let what = format!("allowing {} bytes of shared memory to {}", source.launch.smem_bytes, source.name);
            cuda(func.set_attribute(MAX_SMEM, source.launch.smem_bytes as i32), &what)?;
        }
        let l = &source.launch;
        let resident_blocks = if l.persistent && l.cluster > 1 {
            // A wave of whole clusters, as many as the device holds at once (a cluster's
            // blocks share one GPC, so this is not the blocks an SM holds times the SMs).
            // `EQFUSE_CLUSTER_GRID=whole` launches the whole grid instead, for comparisons.
            if std::env::var("EQFUSE_CLUSTER_GRID").as_deref() == Ok("whole") {
                None
            } else {
                let cfg = LaunchConfig {
                    grid_dim: (l.grid[0], l.grid[1], l.grid[2]),
                    block_dim: (l.block[0], l.block[1], l.block[2]),
                    shared_mem_bytes: l.smem_bytes,
                };
                let clusters = cuda(
                    func.occupancy_max_active_clusters(cfg, &self.stream),
                    &format!("the cluster occupancy of {}", source.name),
                )?;
                Some(clusters.max(1) * l.cluster)
            }
        } else if l.persistent {
            let threads = l.block.iter().product::<u32>();
            let per_sm = cuda(
                func.occupancy_max_active_blocks_per_multiprocessor(threads, l.smem_bytes as usize, None),
                &format!("the occupancy of {}", source.name),
            )?;
            Some(per_sm.max(1) * self.sms)
        } else {
            None
        };
        let sm90a = arch == "sm_90a";
        Ok(Loaded { source, func: Some(func), lt: None, cached: c.cached, resident_blocks, sm90a })
    }

    /// Launches a kernel on `args` (in the order of its `args` list); asynchronous.
    pub fn launch(&self, k: &Loaded, args: &[&Buffer]) -> Result<()> {
        if let Some(lt) = &k.lt {
            let arg = |name: &str| {
                k.source.args.iter().position(|a| a.name == name).and_then(|i| args.get(i).copied()).ok_or_else(|| {
                    Error::Invalid(format!("{}: no argument `{name}` for the cuBLASLt call", k.source.name))
                })
            };
            let c = &lt.call;
            let bias = c.bias.as_deref().map(arg).transpose()?;
            return lt.launch(arg(&c.a.tensor)?, arg(&c.b.tensor)?, bias, arg(&c.d)?);
        }
        let Some(func) = &k.func else { return Ok(()) };
        let l = &k.source.launch;
        if l.grid.contains(&0) {
            return Ok(());
        }
        let gx = k.resident_blocks.map_or(l.grid[0], |r| l.grid[0].min(r));
        let cfg = LaunchConfig {
            grid_dim: (gx, l.grid[1], l.grid[2]),
            block_dim: (l.block[0], l.block[1], l.block[2]),
            shared_mem_bytes: l.smem_bytes,
        };
        let mut b = self.stream.launch_builder(func);
        for a in args {
            b.arg(*a);
        }
        // SAFETY: the kernel's parameters are pointers, one per entry of its `args` list, and
        // the runtime passes a buffer of at least each entry's size for each.
        cuda(unsafe { b.launch(cfg) }.map(|_| ()), &k.source.name)
    }

    /// Waits for all queued work; an asynchronous kernel fault is reported against `what`.
    pub fn sync(&self, what: &str) -> Result<()> {
        cuda(self.stream.synchronize(), what)
    }

    /// An event that records timestamps.
    pub fn event(&self) -> Result<CudaEvent> {
        cuda(self.ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT)), "creating an event")
    }

    pub fn record(&self, e: &CudaEvent) -> Result<()> {
        cuda(e.record(&self.stream), "recording an event")
    }

    /// Microseconds between two recorded events (waits for the second).
    pub fn elapsed_us(&self, start: &CudaEvent, end: &CudaEvent) -> Result<f64> {
        cuda(start.elapsed_ms(end), "reading an event time").map(|ms| ms as f64 * 1e3)
    }

    /// Captures the launches `body` queues on the stream into a CUDA graph (nothing runs
    /// while capturing). Capture ends even when `body` fails, so the stream stays usable.
    pub fn capture(&self, body: impl FnOnce() -> Result<()>) -> Result<Graph> {
        use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
        let mode = CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
        cuda(self.stream.begin_capture(mode), "beginning a graph capture")?;
        let queued = body();
        let graph = cuda(self.stream.end_capture(CUgraphInstantiate_flags(0)), "ending a graph capture");
        queued?;
        let graph = graph?.ok_or_else(|| Error::Cuda {
            context: "a graph capture".into(),
            message: "the capture produced no graph".into(),
        })?;
        cuda(graph.upload(), "uploading a graph")?;
        Ok(Graph(graph))
    }

    /// Queues one replay of a captured graph.
    pub fn replay(&self, g: &Graph) -> Result<()> {
        cuda(g.0.launch(), "replaying a graph")
    }

    /// Compiles and loads raw CUDA source holding `extern "C"` kernel `name` (calibration).
    pub fn load_raw(&self, source: &str, name: &str) -> Result<CudaFunction> {
        let c = crate::runtime::nvrtc::compile_cached(source, name, &self.arch)?;
        let module = cuda(self.ctx.load_module(Ptx::from_src(String::from_utf8_lossy(&c.ptx).into_owned())), name)?;
        cuda(module.load_function(name), name)
    }

    /// Launches a raw kernel with no arguments.
    pub fn launch_empty(&self, f: &CudaFunction, grid: u32, block: u32) -> Result<()> {
        let cfg = LaunchConfig { grid_dim: (grid, 1, 1), block_dim: (block, 1, 1), shared_mem_bytes: 0 };
        let mut b = self.stream.launch_builder(f);
        // SAFETY: the kernel takes no parameters.
        cuda(unsafe { b.launch(cfg) }.map(|_| ()), "an empty kernel")
    }
}

/// The bytes a tensor occupies in device memory (little endian, its dtype's storage).
pub fn tensor_bytes(t: &Tensor) -> Vec<u8> {
    let mut out = Vec::with_capacity(t.numel() * t.dtype.size());
    for &v in &t.data {
        match t.dtype {
            DType::F32 => out.extend_from_slice(&(v as f32).to_le_bytes()),
            DType::F16 => out.extend_from_slice(&half::f16::from_f64(v).to_bits().to_le_bytes()),
            DType::Bf16 => out.extend_from_slice(&half::bf16::from_f64(v).to_bits().to_le_bytes()),
            DType::I32 => out.extend_from_slice(&(v as i32).to_le_bytes()),
            DType::Bool => out.push(u8::from(v != 0.0)),
        }
    }
    out
}

/// A tensor from device bytes (NaN stays NaN, so unwritten poisoned elements show).
pub fn tensor_from_bytes(ty: &TensorType, bytes: &[u8]) -> Tensor {
    let size = ty.dtype.size();
    let data = bytes
        .chunks_exact(size)
        .take(ty.numel())
        .map(|c| match ty.dtype {
            DType::F32 => f32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f64,
            DType::F16 => half::f16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f64(),
            DType::Bf16 => half::bf16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f64(),
            DType::I32 => i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f64,
            DType::Bool => f64::from(c[0]),
        })
        .collect();
    Tensor { dtype: ty.dtype, shape: ty.shape.clone(), data }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_round_trip_every_dtype() {
        for dtype in DType::ALL {
            let ty = TensorType::new(dtype, vec![5]);
            let data: Vec<f64> = [1.5, -2.0, 0.0, 3.0, 1.0].iter().map(|&v| dtype.round(v)).collect();
            let t = Tensor { dtype, shape: vec![5], data };
            assert_eq!(tensor_from_bytes(&ty, &tensor_bytes(&t)), t, "{dtype}");
        }
    }
}
