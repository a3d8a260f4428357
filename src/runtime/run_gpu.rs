//! `eqfuse run PROG` on the GPU: generated kernels run in plan order, every output checked
//! against the CPU reference, every kernel timed against its prediction.
//!
//! Inputs come from `INPUTS/NAME.npy` when present, else from the seeded generator (the same
//! values `run --cpu` uses). Every tensor a kernel writes is poisoned (all bytes 0xFF: NaN in
//! every float type) just before that kernel's checked launch, so an element no kernel writes
//! cannot pass, also in a buffer that an earlier, dead tensor used: intermediates share device
//! buffers by liveness ([`MemoryPlan`]), inputs and outputs have their own. With `graph`, the
//! plan's launches are also captured once into a CUDA graph and its replays timed. Timings are CUDA-event
//! medians over `repeat` runs after that warm-up run, with the L2 cache flushed before each run
//! when the plan's data would fit in it.
//! Invariants: a plan with a kernel codegen cannot generate fails before the GPU is touched;
//! the check compares each output's largest absolute error with its largest reference value
//! (f32 within 1e-5, f16 and bf16 within 1e-2, integers exactly).

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Instant;

use crate::codegen::{codegen_plan, ArgRole, KernelSource};
use crate::cost::profile::DeviceProfile;
use crate::error::{Error, Result};
use crate::ir::program::Program;
use crate::ir::tensor::Tensor;
use crate::ir::types::TensorType;
use crate::plan::FusionPlan;
use crate::reference::check::{check, close_to, longest_contraction, OutputCheck, REFERENCE_ERROR_FACTOR};
use crate::reference::npy::read_npy;
use crate::runtime::gpu::{tensor_bytes, tensor_from_bytes, Buffer, Gpu, Loaded};
use crate::runtime::memplan::MemoryPlan;

/// Options of a GPU run.
#[derive(Clone, Debug)]
pub struct GpuRunOptions {
    /// Folder holding `NAME.npy` for some or all inputs.
    pub inputs_dir: Option<PathBuf>,
    /// Folder to write outputs (and generated inputs) to as `.npy`; nothing is written if `None`.
    pub outputs_dir: Option<PathBuf>,
    /// Timed runs after the checked one (0: no timing).
    pub repeat: usize,
    /// Seed of generated inputs.
    pub seed: u64,
    /// Whether to compare outputs with the CPU reference.
    pub check: bool,
    /// Numbers to report bandwidth shares against; by default the profile the plan names.
    pub profile: Option<DeviceProfile>,
    /// Whether kernels that loop over their work launch one wave of resident blocks instead of
    /// one block per unit of work. Off by default: on an H100 (2026-11-22) it made softmax and
    /// layernorm 16384x4096 slower (86% and 91% of copy bandwidth against 96% and 97%) and
    /// cross-entropy's row kernel 2% faster.
    pub persistent: bool,
    /// Whether to also time replays of the plan captured as one CUDA graph.
    pub graph: bool,
}

impl Default for GpuRunOptions {
    fn default() -> Self {
        GpuRunOptions {
            inputs_dir: None,
            outputs_dir: None,
            repeat: 20,
            seed: 0,
            check: true,
            profile: None,
            persistent: false,
            graph: false,
        }
    }
}

/// One kernel's timing.
#[derive(Clone, Debug, PartialEq)]
pub struct KernelTiming {
    pub id: usize,
    pub name: String,
    /// Bytes the plan counts for the kernel (each read once, each write once).
    pub bytes: u64,
    pub predicted_us: f64,
    /// Median over the timed runs (NaN when not timed).
    pub measured_us: f64,
    /// `bytes / measured`, in GB/s.
    pub achieved_gbs: f64,
}

/// What a GPU run did.
#[derive(Clone, Debug)]
pub struct GpuRunReport {
    pub program: String,
    pub device: String,
    pub arch: String,
    pub seed: u64,
    pub repeat: usize,
    pub kernels: Vec<KernelTiming>,
    /// Median over the timed runs of the whole plan, launch gaps included.
    pub total_measured_us: f64,
    pub total_predicted_us: f64,
    /// Median over the timed replays of the plan captured as one CUDA graph (`graph` option).
    pub graph_measured_us: Option<f64>,
    /// Whether the outputs after the graph's replays equal those of the checked run, bit for bit
    /// (within their dtype's tolerance for a plan with a kernel that sums in scheduling order,
    /// `KernelSource::scheduled_sums`).
    pub graph_same: Option<bool>,
    /// Whether a kernel sums in scheduling order (its outputs' last bits vary from run to run).
    pub scheduled_sums: bool,
    /// Device bytes the run allocated (tensors, shared by liveness, and workspace): its peak.
    pub device_bytes: u64,
    /// Device bytes with one buffer per tensor (no sharing), workspace included.
    pub unshared_device_bytes: u64,
    /// Copy bandwidth the shares are relative to (GB/s, read plus write).
    pub copy_bandwidth_gbs: Option<f64>,
    /// Empty when the run was not checked.
    pub outputs: Vec<OutputCheck>,
    /// Kernels compiled, and how many came from the NVRTC disk cache.
    pub compiled: usize,
    pub cached: usize,
    /// Kernels that run their Hopper path (compiled for sm_90a).
    pub sm90a: usize,
    pub compile_ms: f64,
    /// The outputs' values, in plan output order.
    pub values: Vec<(String, Tensor)>,
}

impl GpuRunReport {
    /// Whether every checked output matched the reference.
    pub fn ok(&self) -> bool {
        self.outputs.iter().all(OutputCheck::ok) && self.graph_same != Some(false)
    }
}

/// Generates the plan's kernels, opens the GPU, and runs. With no usable GPU this is
/// [`Error::NoGpu`]; a kernel codegen does not support is an error naming it.
pub fn run_plan_gpu(program: &Program, plan: &FusionPlan, opts: &GpuRunOptions) -> Result<GpuRunReport> {
    let sources = codegen_plan(plan)?;
    let gpu = Gpu::open()?;
    run_on(&gpu, program, plan, &sources, opts)
}

/// Runs generated kernels on an open GPU (calibration and benches reuse one device).
pub fn run_on(
    gpu: &Gpu,
    program: &Program,
    plan: &FusionPlan,
    sources: &[KernelSource],
    opts: &GpuRunOptions,
) -> Result<GpuRunReport> {
    let t0 = Instant::now();
    let mut loaded: Vec<Loaded> = sources.iter().map(|s| gpu.load(s)).collect::<Result<_>>()?;
    if !opts.persistent {
        loaded.iter_mut().filter(|k| !k.source.launch.wave).for_each(|k| k.resident_blocks = None);
    }
    let compile_ms = t0.elapsed().as_secs_f64() * 1e3;
    if opts.check {
        crate::reference::check_fits(program)?;
    }
    let inputs = gather_inputs(program, opts)?;
    let memory = MemoryPlan::of_plan(plan);
    let mut bufs = Buffers::new(gpu, plan, &memory, &inputs, &loaded)?;
    for k in &loaded {
        bufs.poison(gpu, &plan.kernels[k.source.kernel])?;
        gpu.launch(k, &bufs.args(k)?)?;
        gpu.sync(&k.source.name)?;
    }
    let values = bufs.outputs(gpu, plan)?;
    let outputs = if opts.check { check(program, &inputs, &values)? } else { vec![] };
    let (kernels, total) = time_plan(gpu, plan, &loaded, &bufs, opts.repeat)?;
    let (graph_measured_us, graph_same) = if opts.graph {
        let t = time_graph(gpu, plan, &loaded, &bufs, opts.repeat)?;
        let replayed = bufs.outputs(gpu, plan)?;
        // A plan with sums in scheduling order (f32 atomics) replays to the checked run's
        // outputs within their dtype's tolerance, not bit for bit.
        let same = if sources.iter().any(|s| s.scheduled_sums) {
            close_to(&replayed, &values, longest_contraction(program))
        } else {
            same_bits(&values, &replayed)
        };
        (Some(t), Some(same))
    } else {
        (None, None)
    };
    let workspace: u64 = bufs.workspace.values().flatten().map(|b| b.len() as u64).sum();
    if let Some(dir) = &opts.outputs_dir {
        write_outputs(dir, program, opts, &inputs, &values)?;
    }
    let profile = opts.profile.clone().or_else(|| DeviceProfile::load(&plan.device).ok());
    Ok(GpuRunReport {
        program: plan.program.clone(),
        device: gpu.name.clone(),
        arch: gpu.arch.clone(),
        seed: opts.seed,
        repeat: opts.repeat,
        kernels,
        total_measured_us: total,
        total_predicted_us: plan.total.predicted_us,
        graph_measured_us,
        graph_same,
        scheduled_sums: sources.iter().any(|s| s.scheduled_sums),
        device_bytes: memory.peak_bytes + workspace,
        unshared_device_bytes: memory.unshared_bytes + workspace,
        copy_bandwidth_gbs: profile.map(|p| p.copy_bandwidth_gbs),
        outputs,
        compiled: loaded.len(),
        cached: loaded.iter().filter(|k| k.cached).count(),
        sm90a: loaded.iter().filter(|k| k.sm90a).count(),
        compile_ms,
        values,
    })
}

/// The program as eager execution runs it: composites expanded, every primitive operator its
/// own kernel writing its result (the plan whose totals are `FusionPlan::unfused`).
///
/// `strict` marks it for strict code generation (the baseline that `--strict` plans are
/// bit-identical to).
pub fn unfused_plan(program: &Program, profile: &DeviceProfile, strict: bool) -> Result<FusionPlan> {
    let expanded = crate::autodiff::expand::expand_composites(program).map_err(Error::Invalid)?;
    let profile = &DeviceProfile { strict, ..profile.clone() };
    let dag = crate::plan::dag::Dag::from_program(&expanded);
    let fusion = crate::search::fuse::Fusion::try_unfused(&dag, profile).map_err(Error::Invalid)?;
    let totals = crate::search::optimize::unfused_totals(program, profile)?;
    let search = crate::plan::SearchReport { extractor: "unfused".into(), strict, ..Default::default() };
    Ok(crate::search::extract::build_plan(program, &dag, &fusion, profile, totals, search))
}

/// Each input from `INPUTS/NAME.npy` if that file exists, else seeded.
fn gather_inputs(program: &Program, opts: &GpuRunOptions) -> Result<HashMap<String, Tensor>> {
    let mut out = HashMap::new();
    crate::reference::run_cpu::check_run_folders(opts.inputs_dir.as_deref(), opts.outputs_dir.as_deref())?;
    if opts.outputs_dir.is_some() {
        crate::reference::run_cpu::check_names(program)?;
    }
    for (k, input) in program.inputs.iter().enumerate() {
        let file = match &opts.inputs_dir {
            Some(d) => crate::reference::run_cpu::input_file(d, &input.name)?,
            None => None,
        };
        let t = match file {
            Some(p) => read_npy(&p, &input.ty)?,
            None => seeded_input(program, k, opts.seed),
        };
        out.insert(input.name.clone(), t);
    }
    Ok(out)
}

/// Input `k` from the seeded generator: `rng::random_program_input`, drawn in parallel for large
/// float inputs (every element is a function of its index alone, so the values are the same).
fn seeded_input(program: &Program, k: usize, seed: u64) -> Tensor {
    use rayon::prelude::*;
    let ty = &program.inputs[k].ty;
    if !ty.dtype.is_float() || ty.numel() < 1 << 20 || program.values.contains_key(&program.inputs[k].name) {
        return crate::reference::rng::random_program_input(program, k, seed);
    }
    let s = crate::reference::rng::input_seed(seed, k);
    let normal = |i: u64| {
        let u1 = (crate::reference::rng::bits(s, 2 * i) as f64 + 0.5) / 4_294_967_296.0;
        let u2 = crate::reference::rng::bits(s, 2 * i + 1) as f64 / 4_294_967_296.0;
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    };
    let data = (0..ty.numel() as u64).into_par_iter().map(|i| ty.dtype.round(normal(i))).collect();
    Tensor { dtype: ty.dtype, shape: ty.shape.clone(), data }
}

/// Device buffers: each input and output its own, intermediates shared by liveness
/// ([`MemoryPlan`]), plus each kernel's workspace.
struct Buffers {
    buffers: Vec<Buffer>,
    /// Each tensor's buffer (an index into `buffers`) and type.
    tensors: HashMap<String, (usize, TensorType)>,
    /// Each kernel's workspace buffers, by kernel name.
    workspace: HashMap<String, Vec<Buffer>>,
}

impl Buffers {
    fn new(
        gpu: &Gpu,
        plan: &FusionPlan,
        memory: &MemoryPlan,
        inputs: &HashMap<String, Tensor>,
        loaded: &[Loaded],
    ) -> Result<Buffers> {
        let mut buffers = Vec::new();
        let mut tensors = HashMap::new();
        for i in &plan.inputs {
            let t = inputs.get(&i.name).ok_or_else(|| Error::Invalid(format!("missing input `{}`", i.name)))?;
            buffers.push(gpu.upload(&tensor_bytes(t), &i.name)?);
            tensors.insert(i.name.clone(), (buffers.len() - 1, i.ty.clone()));
        }
        let shared = buffers.len();
        for (k, &bytes) in memory.slots.iter().enumerate() {
            buffers.push(gpu.alloc(bytes as usize, &format!("shared buffer {k}"))?);
        }
        for k in &plan.kernels {
            for w in &k.writes {
                if tensors.contains_key(&w.name) {
                    continue;
                }
                let at = match memory.slot_of.get(&w.name) {
                    Some(slot) => shared + slot,
                    None => {
                        buffers.push(gpu.alloc(w.ty.bytes() as usize, &w.name)?);
                        buffers.len() - 1
                    }
                };
                tensors.insert(w.name.clone(), (at, w.ty.clone()));
            }
        }
        let mut workspace = HashMap::new();
        for k in loaded {
            let mut ws = Vec::new();
            for a in k.source.args.iter().filter(|a| a.role == ArgRole::Workspace) {
                let mut b = gpu.alloc(a.bytes as usize, &format!("{} of {}", a.name, k.source.name))?;
                gpu.fill(&mut b, 0, &a.name)?;
                ws.push(b);
            }
            workspace.insert(k.source.name.clone(), ws);
        }
        Ok(Buffers { buffers, tensors, workspace })
    }

    /// Fills the buffer of every tensor a kernel writes with 0xFF bytes.
    fn poison(&mut self, gpu: &Gpu, k: &crate::plan::Kernel) -> Result<()> {
        for w in &k.writes {
            if let Some(&(b, _)) = self.tensors.get(&w.name) {
                gpu.fill(&mut self.buffers[b], 0xff, &w.name)?;
            }
        }
        Ok(())
    }

    /// A kernel's arguments in launch order.
    fn args(&self, k: &Loaded) -> Result<Vec<&Buffer>> {
        let mut ws = self.workspace.get(&k.source.name).into_iter().flatten();
        k.source
            .args
            .iter()
            .map(|a| match a.role {
                ArgRole::Workspace => ws.next().ok_or_else(|| missing(&a.name)),
                _ => self.tensors.get(&a.name).map(|(b, _)| &self.buffers[*b]).ok_or_else(|| missing(&a.name)),
            })
            .collect()
    }

    /// The plan's outputs, downloaded.
    fn outputs(&self, gpu: &Gpu, plan: &FusionPlan) -> Result<Vec<(String, Tensor)>> {
        plan.outputs
            .iter()
            .map(|(name, tensor)| {
                let (b, ty) = self.tensors.get(tensor).ok_or_else(|| missing(tensor))?;
                let bytes = gpu.download(&self.buffers[*b], ty.bytes() as usize, name)?;
                Ok((name.clone(), tensor_from_bytes(ty, &bytes)))
            })
            .collect()
    }
}

fn missing(name: &str) -> Error {
    Error::Invalid(format!("no device buffer for `{name}`"))
}

fn median(v: &mut [f64]) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        0.5 * (v[n / 2 - 1] + v[n / 2])
    }
}

/// Times `repeat` runs of the plan with events around every kernel; returns per-kernel and
/// whole-plan medians.
fn time_plan(
    gpu: &Gpu,
    plan: &FusionPlan,
    loaded: &[Loaded],
    bufs: &Buffers,
    repeat: usize,
) -> Result<(Vec<KernelTiming>, f64)> {
    let n = loaded.len();
    let mut per: Vec<Vec<f64>> = vec![Vec::with_capacity(repeat); n];
    let mut totals = Vec::with_capacity(repeat);
    let bytes: u64 = plan.total.bytes;
    let mut flush = if repeat > 0 && bytes < 8 * gpu.l2_bytes as u64 {
        Some(gpu.alloc(2 * gpu.l2_bytes, "the L2 flush buffer")?)
    } else {
        None
    };
    let args: Vec<Vec<&Buffer>> = loaded.iter().map(|k| bufs.args(k)).collect::<Result<_>>()?;
    let events: Vec<_> = (0..=n).map(|_| gpu.event()).collect::<Result<_>>()?;
    // Untimed runs first, for at least 20 ms: after the reference check the GPU has been idle
    // and its clocks low (a 4 MB fused kernel timed at 15.9 us right after a check ran in 6.7 us
    // once warm, H100, 2026-11-22).
    let warm = Instant::now();
    let mut runs = 0;
    while repeat > 0 && (runs < 3 || warm.elapsed().as_secs_f64() < 0.02) {
        if let Some(f) = flush.as_mut() {
            gpu.fill(f, 0, "the L2 flush buffer")?;
        }
        for (i, k) in loaded.iter().enumerate() {
            gpu.launch(k, &args[i])?;
        }
        gpu.sync("a warm-up run of the plan")?;
        runs += 1;
    }
    for _ in 0..repeat {
        if let Some(f) = flush.as_mut() {
            gpu.fill(f, 0, "the L2 flush buffer")?;
        }
        gpu.record(&events[0])?;
        for (i, k) in loaded.iter().enumerate() {
            gpu.launch(k, &args[i])?;
            gpu.record(&events[i + 1])?;
        }
        gpu.sync("a timed run of the plan")?;
        for i in 0..n {
            per[i].push(gpu.elapsed_us(&events[i], &events[i + 1])?);
        }
        totals.push(gpu.elapsed_us(&events[0], &events[n])?);
    }
    let kernels = loaded
        .iter()
        .zip(per.iter_mut())
        .map(|(k, times)| {
            let pk = &plan.kernels[k.source.kernel];
            let bytes = pk.bytes_read + pk.bytes_written;
            let measured_us = median(times);
            KernelTiming {
                id: pk.id,
                name: k.source.name.clone(),
                bytes,
                predicted_us: pk.predicted_us,
                measured_us,
                achieved_gbs: bytes as f64 / (measured_us * 1e3),
            }
        })
        .collect();
    Ok((kernels, median(&mut totals)))
}

/// Captures the plan's launches once as a CUDA graph and times `repeat` replays after one
/// warm-up replay (the L2 flush, when needed, runs before each replay, outside the graph);
/// the median, in microseconds.
fn time_graph(gpu: &Gpu, plan: &FusionPlan, loaded: &[Loaded], bufs: &Buffers, repeat: usize) -> Result<f64> {
    let args: Vec<Vec<&Buffer>> = loaded.iter().map(|k| bufs.args(k)).collect::<Result<_>>()?;
    let graph = gpu.capture(|| loaded.iter().zip(&args).try_for_each(|(k, a)| gpu.launch(k, a)))?;
    let mut flush = if plan.total.bytes < 8 * gpu.l2_bytes as u64 {
        Some(gpu.alloc(2 * gpu.l2_bytes, "the L2 flush buffer")?)
    } else {
        None
    };
    let (start, end) = (gpu.event()?, gpu.event()?);
    let mut times = Vec::with_capacity(repeat);
    for rep in 0..=repeat {
        if let Some(f) = flush.as_mut() {
            gpu.fill(f, 0, "the L2 flush buffer")?;
        }
        gpu.record(&start)?;
        gpu.replay(&graph)?;
        gpu.record(&end)?;
        gpu.sync("a replay of the plan's graph")?;
        if rep > 0 {
            times.push(gpu.elapsed_us(&start, &end)?);
        }
    }
    Ok(median(&mut times))
}

/// Whether two lists of outputs hold the same bits.
fn same_bits(a: &[(String, Tensor)], b: &[(String, Tensor)]) -> bool {
    a.len() == b.len()
        && a.iter().zip(b).all(|((_, x), (_, y))| {
            x.data.len() == y.data.len() && x.data.iter().zip(&y.data).all(|(p, q)| p.to_bits() == q.to_bits())
        })
}

fn write_outputs(
    dir: &Path,
    program: &Program,
    opts: &GpuRunOptions,
    inputs: &HashMap<String, Tensor>,
    values: &[(String, Tensor)],
) -> Result<()> {
    let mut files = vec![];
    for i in &program.inputs {
        let from_file = match &opts.inputs_dir {
            Some(d) => crate::reference::run_cpu::input_file(d, &i.name)?.is_some(),
            None => false,
        };
        if let (false, Some(t)) = (from_file, inputs.get(&i.name)) {
            files.push((dir.join(format!("{}.npy", i.name)), t));
        }
    }
    for (name, t) in values {
        files.push((dir.join(format!("{name}.npy")), t));
    }
    crate::reference::run_cpu::write_all(dir, &files)
}

impl fmt::Display for GpuRunReport {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        writeln!(f, "ran {} on {} ({}), seed {}", self.program, self.device, self.arch, self.seed)?;
        writeln!(
            f,
            "compiled {} ({} from the NVRTC cache{}) in {:.0} ms",
            crate::plan::render::plural(self.compiled, "kernel"),
            self.cached,
            if self.sm90a > 0 { format!("; {} on the sm_90a path", self.sm90a) } else { String::new() },
            self.compile_ms
        )?;
        if self.repeat > 0 {
            writeln!(f, "times: median of {} after a warm-up", crate::plan::render::plural(self.repeat, "run"))?;
            writeln!(
                f,
                "  {:<28} {:>12} {:>12} {:>12} {:>10} {:>10}",
                "kernel", "predicted us", "measured us", "bytes", "GB/s", "of copy"
            )?;
            for k in &self.kernels {
                let share = self
                    .copy_bandwidth_gbs
                    .map_or(String::from("-"), |c| format!("{:.0}%", 100.0 * k.achieved_gbs / c));
                writeln!(
                    f,
                    "  {:<28} {:>12.1} {:>12.1} {:>12} {:>10.0} {:>10}",
                    k.name,
                    k.predicted_us,
                    k.measured_us,
                    crate::plan::render::human_bytes(k.bytes),
                    k.achieved_gbs,
                    share
                )?;
            }
            writeln!(f, "  {:<28} {:>12.1} {:>12.1}", "total", self.total_predicted_us, self.total_measured_us)?;
            if let Some(g) = self.graph_measured_us {
                let same = match self.graph_same {
                    Some(false) => " (outputs DIFFER from the checked run)",
                    _ if self.scheduled_sums => " (outputs within tolerance of the checked run: f32 atomics)",
                    _ => " (outputs identical to the checked run)",
                };
                writeln!(f, "  {:<28} {:>12} {:>12.1}{same}", "total, one CUDA graph", "", g)?;
            }
        }
        writeln!(
            f,
            "device memory: {} allocated (intermediates share buffers by liveness); {} with one buffer per tensor",
            crate::plan::render::human_bytes(self.device_bytes),
            crate::plan::render::human_bytes(self.unshared_device_bytes)
        )?;
        if !self.outputs.is_empty() {
            writeln!(f, "outputs against the CPU reference:")?;
        }
        for o in &self.outputs {
            let verdict = if o.ok() { "ok" } else { "MISMATCH" };
            write!(
                f,
                "  {:<12} {:<20} {verdict}: max error {:.2e} of max |ref| {:.3} (scaled {:.2e}, tolerance {:.0e})",
                o.name,
                o.ty.to_string(),
                o.max_abs_error,
                o.max_abs_ref,
                o.scaled_error,
                o.tolerance
            )?;
            if o.unrounded {
                write!(f, " against the unrounded reference")?;
            }
            if o.reference_error > 0.0 {
                write!(
                    f,
                    " (within {REFERENCE_ERROR_FACTOR}x an f32 evaluation's own error {:.2e} from the exact values)",
                    o.reference_error
                )?;
            }
            if o.near_decisions > 0 {
                write!(
                    f,
                    " ({} differing elements that follow a comparison rounding can decide either way left out)",
                    o.near_decisions
                )?;
            }
            if o.unwritten > 0 || o.mismatches > 0 {
                write!(f, "; {} unwritten, {} outside tolerance", o.unwritten, o.mismatches)?;
            }
            writeln!(f)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::types::DType;

    #[test]
    fn parallel_inputs_equal_the_reference_generator() {
        let ty = TensorType::new(DType::Bf16, vec![1 << 20]);
        let p = Program::from_sexprs("p", &[("x", ty)], &[("y", "(exp x)")]).unwrap();
        assert_eq!(seeded_input(&p, 0, 9), crate::reference::rng::random_program_input(&p, 0, 9));
    }
}
