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
use crate::ir::types::{DType, TensorType};
use crate::plan::FusionPlan;
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

/// One output compared with the reference.
#[derive(Clone, Debug, PartialEq)]
pub struct OutputCheck {
    pub name: String,
    pub ty: TensorType,
    /// Elements that are NaN where the reference is not (never written, or a real NaN).
    pub unwritten: usize,
    /// Elements outside the tolerance.
    pub mismatches: usize,
    pub max_abs_error: f64,
    /// The largest absolute reference value.
    pub max_abs_ref: f64,
    /// `max_abs_error / max_abs_ref`.
    pub scaled_error: f64,
    pub tolerance: f64,
    /// Whether the output matched only the unrounded (f64) reference, not the one rounded to
    /// each step's declared type.
    pub unrounded: bool,
    /// Elements left out of the comparison because they depend on a comparison whose operands
    /// lie within rounding of each other (see `near_decision`); 0 unless the output failed
    /// without leaving them out.
    pub near_decisions: usize,
    /// When the output matched only allowing `REFERENCE_ERROR_FACTOR` times a straightforward
    /// f32 evaluation's own largest distance from the exact values: that distance (else 0).
    pub reference_error: f64,
}

impl OutputCheck {
    pub fn ok(&self) -> bool {
        self.unwritten == 0 && self.mismatches == 0
    }
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
    let fusion = crate::search::fuse::Fusion::unfused(&dag, profile);
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

/// Tolerance of a dtype, relative to the largest reference value, for a program whose longest
/// matrix-product contraction is `k` (0 without products). An f32 dot product of `k` terms
/// rounds once per addition, so its error grows with `k` (Higham's bound is k·u times the sum
/// of the terms' magnitudes, u = 2^-24) while the reference sums in f64: f32 outputs get
/// max(1e-5, k·u), which is 1e-5 up to k = 167 and 6.1e-5 at k = 1024.
fn tolerance(d: DType, k: usize) -> f64 {
    match d {
        DType::F32 => 1e-5f64.max(k as f64 * f64::powi(2.0, -24)),
        DType::F16 | DType::Bf16 => 1e-2,
        DType::I32 | DType::Bool => 0.0,
    }
}

/// The longest contraction of any matrix product in the program (0 if none).
fn longest_contraction(program: &Program) -> usize {
    let nodes = program.expr().as_ref();
    let mut k = 0;
    for n in nodes {
        if let crate::ir::lang::TensorLang::Op(code, ch) = n {
            if code.kind() == crate::ir::lang::Kind::MatMul {
                let a = program.ty(ch[0]);
                k = k.max(a.and_then(|t| t.shape.last().copied()).unwrap_or(0));
            }
            // Attention's gradients sum over every query (keys) or key (queries).
            if crate::cost::is_attention_backward(Some(code.kind())) {
                let rows = |c: egg::Id| program.ty(c).and_then(|t| t.shape.iter().rev().nth(1).copied()).unwrap_or(0);
                k = k.max(rows(ch[0])).max(rows(ch[1]));
            }
        }
    }
    k
}

/// How close (relative to the operands' largest magnitude) the two operands of a comparison
/// must be for rounding to decide it either way: 4·sqrt(k)·u for an operand computed through a
/// `k`-term product (u the unit roundoff of its dtype; the typical rounding error of a `k`-term
/// dot product grows as sqrt(k)·u times its partial sums, which are no larger than the largest
/// result: this is several times the typical error), and 4·u without products.
fn near_decision(d: DType, k: usize) -> f64 {
    let u = match d {
        DType::F16 => f64::powi(2.0, -11),
        DType::Bf16 => f64::powi(2.0, -8),
        _ => f64::powi(2.0, -24),
    };
    4.0 * (k.max(1) as f64).sqrt() * u
}

/// Compares each output with the reference at the program's declared precision (the f32
/// tolerance widened with the longest matrix-product contraction); an output outside tolerance
/// is compared again with the unrounded (f64) reference, since a fused kernel may compute in f32
/// what the program spells out in rounded steps (a bf16 softmax written out rounds its scores,
/// exponentials and sums; the `attention` kernel rounds once). An output still outside
/// tolerance is compared a third time leaving out the elements that depend on a comparison
/// rounding could decide either way ([`crate::reference::eval_near_decisions`]): a ReLU whose
/// pre-activation is a few ulps from 0 on the reference may fall on the other side on the GPU,
/// and a whole column of a weight gradient follows it. Those elements are counted
/// (`near_decisions`) and reported; everything else must match.
fn check(program: &Program, inputs: &HashMap<String, Tensor>, got: &[(String, Tensor)]) -> Result<Vec<OutputCheck>> {
    let want = crate::reference::eval(program, inputs)?;
    let k = longest_contraction(program);
    let mut out: Vec<OutputCheck> =
        got.iter().zip(&want).map(|((name, g), w)| compare_k(name, g, w, k, None)).collect();
    if out.iter().any(|c| !c.ok()) {
        let exact = crate::reference::eval_with(program, inputs, crate::reference::Precision::F64)?;
        for (c, ((name, g), w)) in out.iter_mut().zip(got.iter().zip(&exact)) {
            if !c.ok() {
                let again = compare_k(name, g, w, k, None);
                if again.ok() {
                    *c = OutputCheck { unrounded: true, ..again };
                }
            }
        }
        if out.iter().all(OutputCheck::ok) {
            return Ok(out);
        }
        // As close to the exact values as a straightforward evaluation in the declared types
        // (each op rounded, each sum accumulated in f32 in order): a badly conditioned program
        // (a chain of products through a saturated softmax, a layernorm's backward) is that
        // far off in f32 whoever computes it. That evaluation's own error is measured away
        // from decisions rounding can flip (it may flip one itself, and a flipped ReLU moves a
        // whole column: that must not become an allowance everywhere).
        let near = crate::reference::eval_near_decisions(program, inputs, &near_decision)?;
        let f32_sums = crate::reference::eval_with(program, inputs, crate::reference::Precision::F32Sums)?;
        let slack: Vec<f64> = want
            .iter()
            .zip(&f32_sums)
            .zip(&exact)
            .zip(&near)
            .map(|(((w, f), x), m)| REFERENCE_ERROR_FACTOR * worst_diff(w, x, m).max(worst_diff(f, x, m)))
            .collect();
        for (c, (((name, g), x), &s)) in out.iter_mut().zip(got.iter().zip(&exact).zip(&slack)) {
            if !c.ok() && s > 0.0 {
                let again = compare_slack(name, g, x, k, None, s);
                if again.ok() {
                    *c = OutputCheck { unrounded: true, ..again };
                }
            }
        }
        for (c, ((((name, g), x), m), &s)) in out.iter_mut().zip(got.iter().zip(&exact).zip(&near).zip(&slack)) {
            for s in [0.0, s] {
                if !c.ok() {
                    let again = compare_slack(name, g, x, k, Some(m), s);
                    if again.ok() {
                        *c = OutputCheck { unrounded: true, ..again };
                    }
                }
            }
        }
    }
    Ok(out)
}

/// Compares a GPU output with the reference by the largest absolute error, scaled by the
/// largest absolute reference value.
pub fn compare(name: &str, got: &Tensor, want: &Tensor) -> OutputCheck {
    compare_k(name, got, want, 0, None)
}

/// How many times a straightforward evaluation's distance from the exact (f64) values (the
/// declared-type reference, or the same with sums accumulated in f32) a GPU output may be from
/// them (the GPU differential test allows the same factor over the declared-type reference).
const REFERENCE_ERROR_FACTOR: f64 = 4.0;

/// The largest absolute difference of two tensors' values away from the elements that are NaN in
/// `near` (NaN and infinite differences left out too).
fn worst_diff(a: &Tensor, b: &Tensor, near: &Tensor) -> f64 {
    let away = |i: usize| !near.data.get(i).is_some_and(|v| v.is_nan());
    a.data
        .iter()
        .zip(&b.data)
        .enumerate()
        .filter(|&(i, _)| away(i))
        .map(|(_, (x, y))| (x - y).abs())
        .filter(|e| e.is_finite())
        .fold(0.0, f64::max)
}

/// [`compare`] for a program whose longest product contraction is `k` (see [`tolerance`]),
/// leaving out the elements that are NaN in `near` where `want` is not (see [`check`]).
fn compare_k(name: &str, got: &Tensor, want: &Tensor, k: usize, near: Option<&Tensor>) -> OutputCheck {
    compare_slack(name, got, want, k, near, 0.0)
}

/// [`compare_k`] allowing `slack` more absolute error (see [`check`]).
fn compare_slack(name: &str, got: &Tensor, want: &Tensor, k: usize, near: Option<&Tensor>, slack: f64) -> OutputCheck {
    let tol = tolerance(want.dtype, k);
    let max_abs_ref = want.data.iter().filter(|v| v.is_finite()).fold(0.0f64, |m, v| m.max(v.abs()));
    let scale = if max_abs_ref > 0.0 { max_abs_ref } else { 1.0 };
    let (mut unwritten, mut mismatches, mut max_err, mut near_decisions) = (0, 0, 0.0f64, 0);
    let left_out = |i: usize, w: f64| near.is_some_and(|m| m.data.get(i).is_some_and(|v| v.is_nan()) && !w.is_nan());
    for (i, (&g, &w)) in got.data.iter().zip(&want.data).enumerate() {
        if g.is_nan() && !w.is_nan() {
            unwritten += 1;
            continue;
        }
        if g == w || (g.is_nan() && w.is_nan()) {
            continue;
        }
        if left_out(i, w) {
            near_decisions += 1;
            continue;
        }
        let err = (g - w).abs();
        if err.is_finite() {
            max_err = max_err.max(err);
        }
        if err.is_nan() || err > tol * scale + slack {
            mismatches += 1;
        }
    }
    if got.shape != want.shape {
        mismatches = mismatches.max(1);
    }
    OutputCheck {
        name: name.to_string(),
        ty: TensorType::new(want.dtype, want.shape.clone()),
        unwritten,
        mismatches,
        max_abs_error: max_err,
        max_abs_ref,
        scaled_error: max_err / scale,
        tolerance: tol,
        unrounded: false,
        near_decisions,
        reference_error: slack / REFERENCE_ERROR_FACTOR,
    }
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

/// Whether each output of `a` is within its dtype's tolerance of `b`'s, relative to `b`'s largest
/// magnitude (`k`: the program's longest contraction, as `tolerance` takes it).
fn close_to(a: &[(String, Tensor)], b: &[(String, Tensor)], k: usize) -> bool {
    a.len() == b.len()
        && a.iter().zip(b).all(|((_, x), (_, y))| {
            let scale = y.data.iter().filter(|v| v.is_finite()).fold(0.0f64, |m, v| m.max(v.abs()));
            x.shape == y.shape && x.compare(y, 0.0, tolerance(y.dtype, k) * scale).ok()
        })
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

    #[test]
    fn parallel_inputs_equal_the_reference_generator() {
        let ty = TensorType::new(DType::Bf16, vec![1 << 20]);
        let p = Program::from_sexprs("p", &[("x", ty)], &[("y", "(exp x)")]).unwrap();
        assert_eq!(seeded_input(&p, 0, 9), crate::reference::rng::random_program_input(&p, 0, 9));
    }

    #[test]
    fn an_output_more_exact_than_the_rounded_steps_passes_against_the_unrounded_reference() {
        // In bf16, (x + 256) - 256 rounds x to a multiple of 2; computed in one step it is x.
        let ty = TensorType::new(DType::Bf16, vec![64]);
        let p = Program::from_sexprs("p", &[("x", ty)], &[("y", "(- (+ x 256) 256)")]).unwrap();
        let inputs: HashMap<String, Tensor> =
            [("x".to_string(), crate::reference::rng::random_program_input(&p, 0, 1))].into();
        let exact = vec![("y".to_string(), inputs["x"].clone())];
        let c = check(&p, &inputs, &exact).unwrap();
        assert!(c[0].ok() && c[0].unrounded, "{:?}", c[0]);
        // The rounded steps are up to 1 from the exact values here, so the check allows the GPU
        // up to 4 (REFERENCE_ERROR_FACTOR) plus the tolerance; 16 off is wrong.
        let mut wrong = exact.clone();
        wrong[0].1.data[3] += 16.0;
        let c = check(&p, &inputs, &wrong).unwrap();
        assert!(!c[0].ok() && !c[0].unrounded);
    }

    #[test]
    fn a_decision_within_rounding_of_its_threshold_is_left_out_and_no_other() {
        // y = sum over j of where(h > 0, d, 0) * x: one flipped decision changes a whole column
        // of the result (as a ReLU gradient's column of a weight gradient does).
        let f = |s: Vec<usize>| TensorType::new(DType::F32, s);
        let p = Program::from_sexprs(
            "p",
            &[("h", f(vec![4, 3])), ("d", f(vec![4, 3])), ("x", f(vec![4, 5]))],
            &[("y", "(@ (transpose x 0 1) (where (> h 0) d 0))")],
        )
        .unwrap();
        let h = vec![0.5, -0.7, 0.9, 1e-9, 0.3, -0.2, -0.8, 0.6, 0.4, 0.25, -0.5, 0.75];
        let t = |shape: Vec<usize>, data: Vec<f64>| Tensor { dtype: DType::F32, shape, data };
        let d: Vec<f64> = (0..12).map(|i| 0.1 * i as f64 + 0.05).collect();
        let x: Vec<f64> = (0..20).map(|i| (i as f64 - 9.5) / 8.0).collect();
        let mut inputs: HashMap<String, Tensor> = [
            ("h".to_string(), t(vec![4, 3], h.clone())),
            ("d".to_string(), t(vec![4, 3], d)),
            ("x".to_string(), t(vec![4, 5], x)),
        ]
        .into();
        let want = crate::reference::eval(&p, &inputs).unwrap();
        // The "device" saw h[1][0] = -1e-9: column 0 of y loses row 1's term.
        inputs.get_mut("h").unwrap().data[3] = -1e-9;
        let flipped = crate::reference::eval(&p, &inputs).unwrap();
        inputs.get_mut("h").unwrap().data[3] = 1e-9;
        assert_ne!(want[0].data, flipped[0].data);
        let c = check(&p, &inputs, &[("y".to_string(), flipped[0].clone())]).unwrap();
        assert!(c[0].ok() && c[0].near_decisions == 5, "{:?}", c[0]);
        // A decision far from its threshold (h[0][1] = -0.7) flipped is a mismatch.
        inputs.get_mut("h").unwrap().data[1] = 0.7;
        let wrong = crate::reference::eval(&p, &inputs).unwrap();
        inputs.get_mut("h").unwrap().data[1] = -0.7;
        let c = check(&p, &inputs, &[("y".to_string(), wrong[0].clone())]).unwrap();
        assert!(!c[0].ok(), "{:?}", c[0]);
    }

    #[test]
    fn a_relu_gradient_is_near_its_threshold_only_where_the_pre_activation_is() {
        // relu(z) > 0 reads an exact 0 wherever z < 0: only a z within rounding of 0 is near.
        let f = |s: Vec<usize>| TensorType::new(DType::F32, s);
        let p = Program::from_sexprs(
            "p",
            &[("z", f(vec![4, 3])), ("d", f(vec![4, 3])), ("x", f(vec![4, 5]))],
            &[("y", "(@ (transpose x 0 1) (where (> (relu z) 0) d 0))")],
        )
        .unwrap();
        let t = |shape: Vec<usize>, data: Vec<f64>| Tensor { dtype: DType::F32, shape, data };
        let z = vec![0.5, -0.7, 0.9, -0.3, 0.3, -0.2, -0.8, 0.6, 0.4, 0.25, -0.5, 0.75];
        let mut inputs: HashMap<String, Tensor> = [
            ("z".to_string(), t(vec![4, 3], z)),
            ("d".to_string(), t(vec![4, 3], vec![1.0; 12])),
            ("x".to_string(), t(vec![4, 5], vec![1.0; 20])),
        ]
        .into();
        let marked = |inputs: &HashMap<String, Tensor>| {
            crate::reference::eval_near_decisions(&p, inputs, &near_decision).unwrap()[0]
                .data
                .iter()
                .filter(|v| v.is_nan())
                .count()
        };
        assert_eq!(marked(&inputs), 0);
        inputs.get_mut("z").unwrap().data[4] = -1e-9;
        assert_eq!(marked(&inputs), 5, "column 1 of y follows z[1][1]");
    }

    #[test]
    fn an_output_as_far_from_the_exact_values_as_the_rounded_reference_passes_and_no_further() {
        // In f32, (x + 2^24) - 2^24 loses x's fraction: the rounded steps are up to 0.5 from
        // the exact x. A device computing the same steps is as far off; 4x that is allowed, more
        // is not.
        let ty = TensorType::new(DType::F32, vec![64]);
        let p = Program::from_sexprs("p", &[("x", ty)], &[("y", "(- (+ x 16777216) 16777216)")]).unwrap();
        let inputs: HashMap<String, Tensor> =
            [("x".to_string(), crate::reference::rng::random_program_input(&p, 0, 1))].into();
        let rounded = crate::reference::eval(&p, &inputs).unwrap();
        let slack = worst_diff(&rounded[0], &inputs["x"], &inputs["x"]);
        assert!(slack > 0.1, "{slack}");
        let mut got = rounded[0].clone();
        got.data[5] = inputs["x"].data[5] + 3.0 * slack;
        let c = check(&p, &inputs, &[("y".to_string(), got.clone())]).unwrap();
        assert!(c[0].ok() && c[0].reference_error == slack, "{:?}", c[0]);
        got.data[5] = inputs["x"].data[5] + 5.0 * slack;
        let c = check(&p, &inputs, &[("y".to_string(), got)]).unwrap();
        assert!(!c[0].ok(), "{:?}", c[0]);
    }

    #[test]
    fn comparison_scales_by_the_largest_reference_value() {
        let want = Tensor { dtype: DType::F32, shape: vec![3], data: vec![100.0, 1e-3, -2.0] };
        let got = Tensor { dtype: DType::F32, shape: vec![3], data: vec![100.0, 1.5e-3, -2.0] };
        assert!(compare("y", &got, &want).ok());
        let bad = Tensor { dtype: DType::F32, shape: vec![3], data: vec![100.1, 1e-3, f64::NAN] };
        let c = compare("y", &bad, &want);
        assert_eq!((c.unwritten, c.mismatches), (1, 1));
        assert!(!c.ok());
    }
}
