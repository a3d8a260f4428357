//! `eqfuse calibrate`: the device profile's numbers, measured on the GPU at hand.
//!
//! Copy bandwidth is a large device-to-device copy (bytes read plus bytes written); launch
//! overhead is the time per launch of an empty kernel launched back to back; each generated
//! template's bandwidth efficiency is its achieved bandwidth on a large synthetic kernel
//! (at least 256 MB moved) as a share of the copy bandwidth. The compute entries the planner
//! reads are measured too, each on programs that must plan as the kernel they measure:
//! cuBLASLt's fixed time per call (a tiny product); each gemm implementation's f32 and bf16 rate
//! (a 4096-cubed product, net of that fixed time or the launch overhead) and cuBLASLt's at
//! smaller squares too (its rate by size: 512, 1024, 2048); the generated gemm's
//! step times for every tile codegen can choose and the attention f32 path's (`tiles.rs`: fits
//! over probes of growing depth); the attention forward's bf16 rate on the path the device takes
//! (wgmma on a 9.0 device) and on the portable mma.sync path (the `portable` implementation);
//! and the attention backward kernel's rates (an attention_grad program's one dq/dk/dv kernel,
//! bf16 and f32).
//! The other rates (elementwise and reduction arithmetic, which no kernel is bound by) and the
//! plan-order terms (L2 reuse capacity and bandwidth) keep the base profile's
//! figures, which the profile's `source` says.
//! Invariant: calibration only measures; it never changes a committed profile itself (the
//! caller writes the JSON where asked).

mod tiles;

use std::collections::BTreeMap;
use std::fmt;
use std::time::Instant;

use crate::codegen::{codegen_plan, KernelSource};
use crate::cost::profile::{DeviceProfile, TemplateRates, TileRate};
use crate::error::{Error, Result};
use crate::ir::program::Program;
use crate::ir::types::{DType, TensorType};
use crate::plan::{FusionPlan, GemmImpl, Template};
use crate::runtime::gpu::Gpu;
use crate::runtime::run_gpu::{run_on, unfused_plan, GpuRunOptions};
use crate::search::optimize::{optimize, OptimizeOptions};

/// One gemm implementation's measured rate: (implementation, dtype, program, median
/// microseconds, TFLOP/s).
pub type GemmRate = (GemmImpl, DType, String, f64, f64);

/// One rate measured on whole kernels: what, the program, its kernels' flops, their median
/// microseconds (summed), and the TFLOP/s taken (net of the launch overhead per kernel).
#[derive(Clone, Debug)]
pub struct KernelRate {
    pub what: String,
    pub program: String,
    pub flops: u64,
    pub us: f64,
    pub tflops: f64,
}

/// A strided-read probe: the figure it measures, the program, the bytes the kernel moves and the
/// sectors' excess over them (as the cost model counts both), its median microseconds, and the
/// figure taken (a share of copy bandwidth, or GB/s of sectors).
pub type StridedProbe = (String, String, u64, u64, f64, f64);

/// What calibration measured, and the profile made from it.
#[derive(Clone, Debug)]
pub struct Calibration {
    pub profile: DeviceProfile,
    pub copy_bytes: u64,
    /// Median time of one copy of `copy_bytes` bytes.
    pub copy_us: f64,
    pub launch_us: f64,
    /// (template, program, bytes moved, median microseconds, share of copy bandwidth).
    pub templates: Vec<TemplateShare>,
    /// The row kernels' stage latency: its probes and the fitted microseconds per stage.
    pub stages: (Vec<StageProbe>, f64),
    /// The written bytes L2 holds: see `DirtyProbe`.
    pub dirty: DirtyProbe,
    /// Elementwise kernels whose lanes access fewer than 16 bytes: see `NarrowProbe`.
    pub narrow: Vec<NarrowProbe>,
    /// L2's reuse distances: see `ReuseProbe`.
    pub reuse: ReuseProbe,
    /// cuBLASLt's fixed time per call: (program, median microseconds).
    pub cublaslt_call: (String, f64),
    /// cuBLASLt's time per output tile of a batch of tiny matrices: (program, median
    /// microseconds of the call, nanoseconds per tile).
    pub cublaslt_tile: (String, f64, f64),
    /// cuBLASLt's share of copy bandwidth on a skinny product: (program, bytes, median
    /// microseconds of the call, share).
    pub cublaslt_skinny: (String, u64, f64, f64),
    /// The row template's time a row: (program, median microseconds, nanoseconds a row).
    pub row: (String, f64, f64),
    /// (gemm implementation, dtype, program, median microseconds, TFLOP/s).
    pub gemm: Vec<GemmRate>,
    /// The step-time fits of every tile (generated gemm and attention f32).
    pub tiles: Vec<tiles::TileFit>,
    /// The generated gemm's split-K latency: its probes and the mean residual.
    pub split: (Vec<SplitProbe>, f64),
    /// The attention forward's rates (per path) and the backward's.
    pub attention: Vec<KernelRate>,
    /// The elementwise template's tiled path and the sectors of strided reads on its plain path.
    pub strided: Vec<StridedProbe>,
    /// Seconds each part took: (part, seconds).
    pub seconds: Vec<(String, f64)>,
}

/// A template's measured share of copy bandwidth: (template, program, bytes moved, median
/// microseconds, share).
pub type TemplateShare = (Template, String, u64, f64, f64);

/// Calibrates device 0 against the built-in profile of its kind (`h100`, `h200`, else `h100`).
pub fn calibrate() -> Result<Calibration> {
    let gpu = Gpu::open()?;
    let base = DeviceProfile::load(&short_name(&gpu.name)).or_else(|_| DeviceProfile::load("h100"))?;
    calibrate_on(&gpu, &base)
}

/// `h100` for an H100, `h200` for an H200, else the device name in lower case with dashes.
pub fn short_name(device: &str) -> String {
    let lower = device.to_lowercase();
    for kind in ["h100", "h200"] {
        if lower.contains(kind) {
            return kind.to_string();
        }
    }
    lower.split(|c: char| !c.is_ascii_alphanumeric()).filter(|s| !s.is_empty()).collect::<Vec<_>>().join("-")
}

/// Calibrates an open GPU; rates it does not measure come from `base`.
pub fn calibrate_on(gpu: &Gpu, base: &DeviceProfile) -> Result<Calibration> {
    let mut seconds = Vec::new();
    let mut clock = Instant::now();
    let mut lap = |what: &str, seconds: &mut Vec<(String, f64)>| {
        seconds.push((what.to_string(), clock.elapsed().as_secs_f64()));
        clock = Instant::now();
    };
    let copy_bytes = copy_bytes(gpu);
    let copy_us = copy_time(gpu, copy_bytes as usize)?;
    let copy_gbs = 2.0 * copy_bytes as f64 / (copy_us * 1e3);
    let launch_us = launch_time(gpu, base)?;
    let mut profile = base.clone();
    profile.name = short_name(&gpu.name);
    profile.device = gpu.name.clone();
    profile.copy_bandwidth_gbs = round(copy_gbs, 1);
    profile.launch_overhead_us = round(launch_us, 2);
    profile.l2_bytes = Some(gpu.l2_bytes as u64);
    profile.sm_count = Some(gpu.sms);
    let mut templates = Vec::new();
    for (template, program) in synthetic()? {
        let plan = optimize(&program, &OptimizeOptions::new(profile.clone()))?.plan;
        if plan.kernels.len() != 1 || plan.kernels[0].template != template {
            return Err(Error::Invalid(format!(
                "calibration program {} did not plan as one {} kernel",
                program.source,
                template.name()
            )));
        }
        let sources = codegen_plan(&plan)?;
        let r = run_on(gpu, &program, &plan, &sources, &run_options(&profile, 30))?;
        let k = &r.kernels[0];
        let share = (k.achieved_gbs / copy_gbs).min(1.0);
        if let Some(rates) = profile.templates.get_mut(template.name()) {
            rates.bandwidth_efficiency = round(share, 3);
        }
        templates.push((template, program.source.clone(), k.bytes, k.measured_us, share));
    }
    let strided = strided_rates(gpu, &mut profile, copy_gbs, launch_us)?;
    if let Some(t) = cluster_rows(gpu, &mut profile, copy_gbs)? {
        templates.push(t);
    }
    let row = row_time(gpu, &mut profile, copy_gbs)?;
    let stages = stage_latency(gpu, &mut profile)?;
    let dirty = dirty_bytes(gpu, &mut profile, copy_gbs)?;
    templates.push(online_columns(gpu, &mut profile, copy_gbs)?);
    let narrow = narrow_access(gpu, &mut profile, copy_gbs)?;
    let reuse = reuse_distance(gpu, &mut profile)?;
    lap(
        "copy, launch, template efficiencies, strided reads, row stage latency, L2's written bytes and reuse distances",
        &mut seconds,
    );
    let cublaslt_call = cublaslt_call_time(gpu, &mut profile)?;
    let cublaslt_tile = cublaslt_tile_time(gpu, &mut profile)?;
    let cublaslt_skinny = cublaslt_skinny_share(gpu, &mut profile, copy_gbs)?;
    let gemm = gemm_rates(gpu, &mut profile)?;
    lap("gemm rates and cuBLASLt's call", &mut seconds);
    let tiles = tile_rates(gpu, &mut profile, base)?;
    let split = split_latency(gpu, &mut profile)?;
    lap("tile step times and split-K latency", &mut seconds);
    let mut attention = attention_forward(gpu, &mut profile)?;
    attention.extend(attention_backward(gpu, &mut profile)?);
    lap("attention rates", &mut seconds);
    let notes: Vec<String> =
        tiles.iter().filter_map(|f| Some(format!("{} {}: {}", f.family.map(), f.key, f.note.as_ref()?))).collect();
    let poor: Vec<String> = tiles
        .iter()
        .filter(|f| f.worst() > POOR_FIT)
        .map(|f| format!("{} {} ({:.0}%)", f.family.map(), f.key, 100.0 * f.worst()))
        .collect();
    profile.source = format!(
        "calibrated by `eqfuse calibrate` on {} ({}, {}); measured: copy bandwidth, launch overhead, \
         the elementwise, rowreduce and colreduce efficiencies (and on a 9.0 device, rows over clusters of \
         blocks: rowreduce.implementations.cluster, an f32 softmax over 1024x128256), the column template's online pairs' (colreduce.implementations.online: \
         sum(exp(x - amax(x, 0)), 0) over 8192 x 2048 f32, after a plain column sum that takes the flush's \
         write-backs), the elementwise tiled path's \
         (implementations.tiled: an 8192 x 8192 f32 transpose), the row kernels' time a row (rowreduce.row_ns: \
         a mean over 2^22 rows of 3 f32, net of the launch and its bytes), the sector bandwidth of strided reads \
         (sector_bandwidth_gbs: [2^24, 4] bf16 read as [4, 2^24] on the plain path, its bytes and the \
         excess of the sectors its warps touch over the time past the launch overhead), cuBLASLt's call overhead (a 64x128x64 \
         f32 product) and its time per 64 x 64 output tile of each matrix of a call (gemm.implementations.cublaslt.tile_ns: \
         a batch of 262144 8x8x8 f32 products as one call, net of the call overhead) and its share of copy \
         bandwidth on skinny products (gemm.implementations.cublaslt.skinny_share: [131072, 128] by [128, 4] f32, \
         net of the call overhead), the row kernels' latency per dependent reduction stage (least squares, in \
         the model's form, over 4 MiB row kernels of 1, 2 and 3 stages), the elementwise template's share of its efficiency with lanes of 1, 2, 4 and 8 bytes \
         (elementwise.narrow_access_share: an odd or even last extent of bool, bf16 and f32), the written bytes L2 holds (l2_dirty_bytes) and the colreduce efficiency \
         without them (two 128 MiB column sums in one plan: the first after the flush, the second with L2 clean), \
         L2's reuse distances (l2_reuse_bytes and l2_reuse_limit_bytes: least squares of the log of measured over \
         predicted times of every kernel of unfused chains, exp, sigmoid, tanh, a row sum and sin, over f32 tensors of \
         8 to 64 MiB), \
         the gemm implementations' f32 and bf16 rates (4096^3 products, net of the call \
         or launch overhead) and cuBLASLt's at 512^3, 1024^3 and 2048^3 too (rate_by_size), the generated gemm's step times for every tile codegen can choose \
         (tiles on f32, tiles_16bit on bf16 CUDA-core and tiles_mma on bf16 tensor-core products) and \
         the attention f32 path's (attention.tiles; K = keys x head / parts): least-squares fits, relative to \
         each probe's time, of time = launch overhead + K x step to single products of growing K, \
         about one block per SM for the lone step and eight for the shared one, plus a row softmax \
         for the row epilogue per wave; the generated gemm's split-K latency (the mean residual of \
         two f32 row-softmax products split along K: 256x1024x50, 256x4096x50); the attention bf16 forward rate on the path this device takes \
         ({}) and on the portable mma.sync path (implementations.portable), and the attention \
         backward kernels' rates (implementations.backward_fused: the one kernel of dq, dk and dv \
         of an 8x16x2048x64 attention_grad, bf16 and f32), each flops / (time - launch overhead); kept from \
         the base profile ({}): the deterministic attention backward kernels' rate \
         (implementations.backward, which no default plan runs), \
         the elementwise and reduction templates' arithmetic rates, the gemm and attention templates' \
         own rates (used only where an implementation or tile has none), the gemm and attention \
         bandwidth efficiencies, and L2's bandwidth{}{}",
        today(),
        gpu.name,
        gpu.arch,
        attention.first().map_or("none", |a| if a.what.contains("wgmma") { "wgmma, sm_90a" } else { "mma.sync" }),
        base.name,
        if notes.is_empty() { String::new() } else { format!("; not taken as fitted: {}", notes.join("; ")) },
        if poor.is_empty() {
            String::new()
        } else {
            format!("; fits off by more than {:.0}% on some probe (worst): {}", 100.0 * POOR_FIT, poor.join(", "))
        }
    );
    Ok(Calibration {
        profile,
        copy_bytes,
        copy_us,
        launch_us,
        templates,
        stages,
        dirty,
        narrow,
        reuse,
        cublaslt_call,
        cublaslt_tile,
        cublaslt_skinny,
        row,
        gemm,
        tiles,
        split,
        attention,
        strided,
        seconds,
    })
}

/// A tile fit off by more than this share on some probe is named in the profile's source.
const POOR_FIT: f64 = 0.15;

fn run_options(profile: &DeviceProfile, repeat: usize) -> GpuRunOptions {
    GpuRunOptions { repeat, check: false, profile: Some(profile.clone()), ..GpuRunOptions::default() }
}

/// The gemm template's rates, with an entry for each implementation (made from the template's
/// own where the profile has none).
fn gemm_impl(profile: &mut DeviceProfile, imp: GemmImpl) -> &mut TemplateRates {
    let g = profile.templates.entry(Template::Gemm.name().into()).or_insert_with(|| TemplateRates {
        bandwidth_efficiency: 0.8,
        flops_f32_tflops: 1.0,
        flops_bf16_tflops: None,
        implementations: Default::default(),
        stage_latency_us: None,
        call_overhead_us: None,
        tile_ns: None,
        skinny_share: None,
        row_ns: None,
        split_latency_us: None,
        tiles: Default::default(),
        tiles_16bit: Default::default(),
        tiles_mma: Default::default(),
        rate_by_size: Default::default(),
        narrow_access_share: Default::default(),
    });
    let own = TemplateRates { implementations: Default::default(), ..g.clone() };
    g.implementations.entry(imp.name().into()).or_insert(own)
}

/// The profile map of a tile family's step times.
fn tile_map(profile: &mut DeviceProfile, family: tiles::Family) -> Result<&mut BTreeMap<String, TileRate>> {
    Ok(match family {
        tiles::Family::AttentionF32 => {
            &mut profile
                .templates
                .get_mut(Template::Attention.name())
                .ok_or_else(|| Error::Invalid("the profile has no attention template".into()))?
                .tiles
        }
        tiles::Family::F32 => &mut gemm_impl(profile, GemmImpl::Generated).tiles,
        tiles::Family::Sixteen => &mut gemm_impl(profile, GemmImpl::Generated).tiles_16bit,
        tiles::Family::Mma => &mut gemm_impl(profile, GemmImpl::Generated).tiles_mma,
    })
}

/// The base profile's figure for a tile, if it has one.
fn base_tile(base: &DeviceProfile, family: tiles::Family, key: &str) -> Option<TileRate> {
    let g = base.gemm_rates(GemmImpl::Generated);
    let map = match family {
        tiles::Family::AttentionF32 => &base.templates.get(Template::Attention.name())?.tiles,
        tiles::Family::F32 => &g.tiles,
        tiles::Family::Sixteen => &g.tiles_16bit,
        tiles::Family::Mma => &g.tiles_mma,
    };
    map.get(key).cloned()
}

/// cuBLASLt's fixed time per call: the median time of a product too small to cost anything
/// else (64x128x64 f32: 1 MFLOP), run as one cuBLASLt call.
fn cublaslt_call_time(gpu: &Gpu, profile: &mut DeviceProfile) -> Result<(String, f64)> {
    let (name, program, plan, sources) = cublaslt_call_plan(profile)?;
    let r = run_on(gpu, &program, &plan, &sources, &run_options(profile, 30))?;
    let us = r.kernels[0].measured_us;
    gemm_impl(profile, GemmImpl::Cublaslt).call_overhead_us = Some(round(us, 1));
    Ok((name.to_string(), us))
}

/// The batch of tiny products cuBLASLt's time per tile is measured on: `TILE_PROBE_BATCH`
/// products of 8 x 8 by 8 x 8 f32 (one tile each), one call.
const TILE_PROBE_BATCH: usize = 262_144;

/// cuBLASLt's time per output tile (`tile_ns`): the call over [`TILE_PROBE_BATCH`] tiny
/// matrices, net of the call overhead, divided by its tiles (one a matrix). Its bytes (200 MB)
/// and flops take a fraction of that time.
fn cublaslt_tile_time(gpu: &Gpu, profile: &mut DeviceProfile) -> Result<(String, f64, f64)> {
    let (name, program, plan, sources) = cublaslt_tile_plan(profile)?;
    let r = run_on(gpu, &program, &plan, &sources, &run_options(profile, 10))?;
    let us = r.kernels[0].measured_us;
    let launch = profile.launch_overhead_us;
    let lt = gemm_impl(profile, GemmImpl::Cublaslt);
    let ns = 1e3 * (us - lt.call_overhead_us.unwrap_or(launch)).max(0.0) / TILE_PROBE_BATCH as f64;
    lt.tile_ns = Some(round(ns, 2));
    Ok((name.to_string(), us, ns))
}

/// The skinny product cuBLASLt's share of copy bandwidth is measured on (`skinny_share`): rows
/// of 128 f32 times 4 columns, one call (the shared right operand folds the rows into one
/// matrix), 64 MiB read, 2 MiB written.
const SKINNY_PROBE: (usize, usize, usize) = (131_072, 128, 4);

/// cuBLASLt's share of copy bandwidth on a product of few output columns (`skinny_share`):
/// the call's bytes over its time net of the call overhead, over copy bandwidth.
fn cublaslt_skinny_share(gpu: &Gpu, profile: &mut DeviceProfile, copy_gbs: f64) -> Result<(String, u64, f64, f64)> {
    let (name, program, plan, sources) = cublaslt_skinny_plan(profile)?;
    let r = run_on(gpu, &program, &plan, &sources, &run_options(profile, 30))?;
    let (bytes, us) = (r.kernels[0].bytes, r.kernels[0].measured_us);
    let launch = profile.launch_overhead_us;
    let lt = gemm_impl(profile, GemmImpl::Cublaslt);
    let net = (us - lt.call_overhead_us.unwrap_or(launch)).max(1e-3);
    let share = (bytes as f64 / (net * 1e3) / copy_gbs).min(1.0);
    lt.skinny_share = Some(round(share, 3));
    Ok((name.to_string(), bytes, us, share))
}

/// The skinny probe program, unfused, marked cuBLASLt; error unless it renders as one call
/// whose output matrices have at most `SKINNY_OUTPUT` rows or columns.
fn cublaslt_skinny_plan(profile: &DeviceProfile) -> Result<(&'static str, Program, FusionPlan, Vec<KernelSource>)> {
    let name = "calibrate-cublaslt-skinny";
    let (rows, depth, cols) = SKINNY_PROBE;
    let (program, plan, sources) = one_cublaslt_call(profile, name, vec![rows, depth], vec![depth, cols])?;
    let skinny = crate::cost::profile::SKINNY_OUTPUT as u64;
    match &sources[0].cublaslt {
        Some(call) if call.m.min(call.n) <= skinny => Ok((name, program, plan, sources)),
        _ => Err(Error::Invalid(format!("calibration program {name} did not render as one skinny cuBLASLt call"))),
    }
}

/// The tile probe program, unfused (one gemm kernel, whatever form the planner would pick),
/// marked cuBLASLt; error unless it renders as one cuBLASLt call.
fn cublaslt_tile_plan(profile: &DeviceProfile) -> Result<(&'static str, Program, FusionPlan, Vec<KernelSource>)> {
    let name = "calibrate-cublaslt-tiles";
    let shape = vec![TILE_PROBE_BATCH, 8, 8];
    let (program, plan, sources) = one_cublaslt_call(profile, name, shape.clone(), shape)?;
    Ok((name, program, plan, sources))
}

/// `x @ w` over f32 operands of these shapes, unfused (one gemm kernel, whatever form the
/// planner would pick), marked cuBLASLt: its program, plan and source; error unless it renders
/// as one cuBLASLt call.
fn one_cublaslt_call(
    profile: &DeviceProfile,
    name: &str,
    x: Vec<usize>,
    w: Vec<usize>,
) -> Result<(Program, FusionPlan, Vec<KernelSource>)> {
    let program = Program::from_sexprs(
        name,
        &[("x", TensorType::new(DType::F32, x)), ("w", TensorType::new(DType::F32, w))],
        &[("y", "(@ x w)")],
    )
    .map_err(Error::Invalid)?;
    let mut plan = unfused_plan(&program, profile, false)?;
    if plan.kernels.len() != 1 || plan.kernels[0].template != Template::Gemm {
        return Err(Error::Invalid(format!("calibration program {name} did not plan as one gemm kernel")));
    }
    plan.kernels[0].implementation = Some(GemmImpl::Cublaslt);
    let sources = codegen_plan(&plan)?;
    match &sources[0].cublaslt {
        Some(call) if call.calls() == 1 => Ok((program, plan, sources)),
        _ => Err(Error::Invalid(format!("calibration program {name} did not render as one cuBLASLt call"))),
    }
}

/// The cuBLASLt call program, its plan marked cuBLASLt and its one source (a cuBLASLt call,
/// error otherwise).
fn cublaslt_call_plan(profile: &DeviceProfile) -> Result<(&'static str, Program, FusionPlan, Vec<KernelSource>)> {
    let name = "calibrate-cublaslt-call";
    let program = Program::from_sexprs(
        name,
        &[("x", TensorType::new(DType::F32, vec![64, 128])), ("w", TensorType::new(DType::F32, vec![128, 64]))],
        &[("y", "(@ x w)")],
    )
    .map_err(Error::Invalid)?;
    let mut plan = optimize(&program, &OptimizeOptions::new(profile.clone()))?.plan;
    if plan.kernels.len() != 1 || plan.kernels[0].template != Template::Gemm {
        return Err(Error::Invalid(format!("calibration program {name} did not plan as one gemm kernel")));
    }
    // Measured as cuBLASLt whichever implementation the planner would pick.
    plan.kernels[0].implementation = Some(GemmImpl::Cublaslt);
    let sources = codegen_plan(&plan)?;
    if sources[0].cublaslt.is_none() {
        return Err(Error::Invalid(format!("calibration program {name} did not render as a cuBLASLt call")));
    }
    Ok((name, program, plan, sources))
}

/// The arithmetic rate of each gemm implementation on a large square product per dtype
/// (compute-bound: 4096 cubed), net of its fixed time (cuBLASLt's call overhead, else the
/// launch overhead), written into the gemm template's `implementations`; and cuBLASLt's at the
/// smaller squares [`LT_SIZES`] too, its `rate_by_size` (a library product too small to fill
/// the GPU runs well below the large product's rate).
fn gemm_rates(gpu: &Gpu, profile: &mut DeviceProfile) -> Result<Vec<GemmRate>> {
    let mut out = Vec::new();
    for dtype in [DType::F32, DType::Bf16] {
        let mut points = Vec::new();
        for n in LT_SIZES.into_iter().chain([4096]) {
            let t = TensorType::new(dtype, vec![n, n]);
            let name =
                if n == 4096 { format!("calibrate-gemm-{dtype}") } else { format!("calibrate-gemm-{dtype}-{n}") };
            let program = Program::from_sexprs(&name, &[("x", t.clone()), ("w", t)], &[("y", "(@ x w)")])
                .map_err(Error::Invalid)?;
            let mut plan = optimize(&program, &OptimizeOptions::new(profile.clone()))?.plan;
            if plan.kernels.len() != 1 || plan.kernels[0].template != Template::Gemm {
                return Err(Error::Invalid(format!("calibration program {name} did not plan as one gemm kernel")));
            }
            let imps: &[GemmImpl] =
                if n == 4096 { &[GemmImpl::Cublaslt, GemmImpl::Generated] } else { &[GemmImpl::Cublaslt] };
            for &imp in imps {
                // Calibration measures each implementation, whichever the planner would pick.
                plan.kernels[0].implementation = Some(imp);
                let sources = codegen_plan(&plan)?;
                let r = run_on(gpu, &program, &plan, &sources, &run_options(profile, 10))?;
                let us = r.kernels[0].measured_us;
                let launch = profile.launch_overhead_us;
                let rates = gemm_impl(profile, imp);
                let fixed = rates.call_overhead_us.unwrap_or(launch);
                let flops = plan.kernels[0].flops as f64;
                let tflops = flops / ((us - fixed).max(0.5 * us) * 1e6);
                if imp == GemmImpl::Cublaslt {
                    points.push([round(flops * 1e-9, 3), round(tflops, 1)]);
                }
                if n == 4096 {
                    match dtype {
                        DType::F32 => rates.flops_f32_tflops = round(tflops, 1),
                        _ => rates.flops_bf16_tflops = Some(round(tflops, 1)),
                    }
                }
                out.push((imp, dtype, name.clone(), us, tflops));
            }
        }
        let key = if dtype == DType::F32 { "f32" } else { "bf16" };
        gemm_impl(profile, GemmImpl::Cublaslt).rate_by_size.insert(key.into(), points);
    }
    Ok(out)
}

/// The squares cuBLASLt's rate is measured at below 4096 (`rate_by_size`).
pub const LT_SIZES: [usize; 3] = [512, 1024, 2048];

/// Every tile's step times (`tiles.rs`), written into the generated gemm's tile maps and the
/// attention template's; a fit that comes out non-positive keeps `base`'s figure (noted).
fn tile_rates(gpu: &Gpu, profile: &mut DeviceProfile, base: &DeviceProfile) -> Result<Vec<tiles::TileFit>> {
    let sms = gpu.sms as usize;
    let probes = tiles::probes(sms)?;
    let planned: Vec<(FusionPlan, Vec<KernelSource>)> = probes
        .iter()
        .map(|p| {
            let opts = OptimizeOptions { strict: p.strict, ..OptimizeOptions::new(tiles::probe_profile(profile, p)) };
            let plan = optimize(&p.program, &opts)?.plan;
            tiles::check(&plan, p)?;
            let sources = codegen_plan(&plan)?;
            Ok((plan, sources))
        })
        .collect::<Result<_>>()?;
    // Every probe's kernels compiled at once, on all cores, into NVRTC's disk cache, where the
    // runs below find them (a cache that cannot be written only costs the time saved).
    {
        use rayon::prelude::*;
        let arch = gpu.arch.clone();
        planned
            .par_iter()
            .flat_map(|(_, sources)| sources.par_iter())
            .filter(|s| s.cublaslt.is_none() && s.launch.sm90a.is_none())
            .try_for_each(|s| crate::runtime::nvrtc::compile_cached(&s.source, &s.name, &arch).map(|_| ()))?;
    }
    let mut measured: Vec<(tiles::Family, String, tiles::Measured)> = Vec::new();
    for (p, (plan, sources)) in probes.iter().zip(&planned) {
        let r = run_on(gpu, &p.program, plan, sources, &run_options(profile, 10))?;
        measured.push((
            p.family,
            p.key(),
            tiles::Measured {
                program: p.program.source.clone(),
                form: p.form,
                rows: p.rows,
                shape: p.shape.clone(),
                steps: p.steps,
                blocks: p.blocks,
                us: r.kernels[0].measured_us,
                fit_us: f64::NAN,
            },
        ));
    }
    let mut fits = Vec::new();
    for family in tiles::Family::ALL {
        for (bm, bn) in family.keys() {
            let key = format!("{bm}x{bn}");
            let of: Vec<tiles::Measured> =
                measured.iter().filter(|(f, k, _)| *f == family && *k == key).map(|(_, _, m)| m.clone()).collect();
            let mut fit = tiles::fit(family, &key, of, sms, profile.launch_overhead_us).ok_or_else(|| {
                Error::Invalid(format!("the {} tile {key} probes do not determine its step times", family.name()))
            })?;
            let old = base_tile(base, family, &key);
            let r = &fit.rate;
            let rate = if r.lone_ns_per_k > 0.0 && r.sm_ns_per_k > 0.0 {
                TileRate {
                    lone_ns_per_k: round(r.lone_ns_per_k, 1),
                    sm_ns_per_k: round(r.sm_ns_per_k, 1),
                    row_epilogue_us: round(r.row_epilogue_us, 2),
                    block_us: round(r.block_us, 3),
                }
            } else if let Some(old) = old {
                fit.note = Some(format!(
                    "fit {:.1} ns lone, {:.1} ns shared per step: not positive, base figures kept",
                    r.lone_ns_per_k, r.sm_ns_per_k
                ));
                old
            } else {
                return Err(Error::Invalid(format!(
                    "the {} tile {key} fit {:.1} ns lone, {:.1} ns shared per step, and the base profile has no figure",
                    family.name(),
                    r.lone_ns_per_k,
                    r.sm_ns_per_k
                )));
            };
            tile_map(profile, family)?.insert(key.clone(), rate);
            fits.push(fit);
        }
    }
    Ok(fits)
}

/// The attention forward measured: 8x16x2048x64 bf16, the attention example's size.
const ATTENTION_FORWARD: &str = "\
# calibrate-attention-bf16.eqf: one attention forward kernel (eqfuse calibrate)
dim B = 8
dim H = 16
dim S = 2048
dim D = 64
input q: bf16[B, H, S, D]
input k: bf16[B, H, S, D]
input v: bf16[B, H, S, D]
o = attention(q, k, v, 0.125, 0)
output o
";

/// The attention backward measured: examples/attention_grad.eqf.
const ATTENTION_GRAD: &str = "\
# calibrate-attention-grad-bf16.eqf: attention's backward kernels (eqfuse calibrate)
dim B = 8
dim H = 16
dim S = 2048
dim D = 64
input q: bf16[B, H, S, D]
input k: bf16[B, H, S, D]
input v: bf16[B, H, S, D]
input dout: bf16[B, H, S, D]
o = attention(q, k, v, 0.125, 0)
loss = sum(sum(sum(sum(cast(o, f32) * cast(dout, f32), -1), -2), -3), -4)
dq = grad(loss, q)
dk = grad(loss, k)
dv = grad(loss, v)
output dq, dk, dv
";

/// TFLOP/s of `flops` done in `us` microseconds of `kernels` launches, net of their launch
/// overhead (the model's launch + flops / rate).
fn net_tflops(flops: u64, us: f64, kernels: usize, launch_us: f64) -> f64 {
    let net = (us - kernels as f64 * launch_us).max(0.5 * us);
    flops as f64 / (net * 1e6)
}

/// The attention template's rates with an entry for implementation `name` (made from the
/// template's own where the profile has none: the arithmetic rates, no tiles).
fn attention_impl<'a>(profile: &'a mut DeviceProfile, name: &str) -> Result<&'a mut TemplateRates> {
    let a = profile
        .templates
        .get_mut(Template::Attention.name())
        .ok_or_else(|| Error::Invalid("the profile has no attention template".into()))?;
    let own = TemplateRates {
        implementations: Default::default(),
        tiles: Default::default(),
        tiles_16bit: Default::default(),
        tiles_mma: Default::default(),
        ..a.clone()
    };
    Ok(a.implementations.entry(name.into()).or_insert(own))
}

/// The attention forward program, its plan (one attention kernel, error otherwise) and its
/// sources (which must carry the Hopper path).
fn attention_forward_plan(profile: &DeviceProfile) -> Result<(&'static str, Program, FusionPlan, Vec<KernelSource>)> {
    let file = "calibrate-attention-bf16.eqf";
    let program = crate::frontend::parse::parse_program(file, ATTENTION_FORWARD, &[])?;
    let plan = optimize(&program, &OptimizeOptions::new(profile.clone()))?.plan;
    if plan.kernels.len() != 1
        || plan.kernels[0].template != Template::Attention
        || plan.kernels[0].ops != ["attention"]
    {
        return Err(Error::Invalid(format!("calibration program {file} did not plan as one attention kernel")));
    }
    let sources = codegen_plan(&plan)?;
    if sources[0].launch.sm90a.is_none() {
        return Err(Error::Invalid(format!("calibration program {file} rendered without the Hopper path")));
    }
    Ok((file, program, plan, sources))
}

/// The attention_grad program planned: its backward kernels' ids (dq, then dk/dv) and its
/// forward kernel's, if there is one.
struct BackwardPlan {
    file: &'static str,
    program: Program,
    plan: FusionPlan,
    backward: Vec<usize>,
    forward: Option<usize>,
}

/// The attention_grad program and its plan, whose backward must be one kernel of dq, dk and dv
/// (`fused`: dq summed by atomics), or else one dq kernel and one dk/dv kernel; error otherwise.
fn attention_backward_plan(profile: &DeviceProfile, fused: bool, dtype: DType) -> Result<BackwardPlan> {
    let (file, text) = match dtype {
        DType::F32 => ("calibrate-attention-grad-f32.eqf", ATTENTION_GRAD.replace("bf16", "f32")),
        _ => ("calibrate-attention-grad-bf16.eqf", ATTENTION_GRAD.to_string()),
    };
    let program = crate::frontend::parse::parse_program(file, &text, &[])?;
    let plan = optimize(&program, &OptimizeOptions::new(profile.clone()))?.plan;
    let is_grad = |o: &String| o.starts_with("attention_grad");
    let backward: Vec<&crate::plan::Kernel> =
        plan.kernels.iter().filter(|k| k.template == Template::Attention && k.ops.iter().any(is_grad)).collect();
    let shapes: Vec<Vec<&str>> = backward.iter().map(|k| k.ops.iter().map(String::as_str).collect()).collect();
    let want: Vec<Vec<&str>> = if fused {
        vec![vec!["attention_grad_q", "attention_grad_k", "attention_grad_v"]]
    } else {
        vec![vec!["attention_grad_q"], vec!["attention_grad_k", "attention_grad_v"]]
    };
    if shapes != want {
        return Err(Error::Invalid(format!(
            "calibration program {file} did not plan its backward as {want:?}: {shapes:?}"
        )));
    }
    let backward = backward.iter().map(|k| k.id).collect();
    let forward = plan
        .kernels
        .iter()
        .find(|k| k.template == Template::Attention && k.ops.iter().any(|o| o == "attention"))
        .map(|k| k.id);
    Ok(BackwardPlan { file, program, plan, backward, forward })
}

/// The attention forward's bf16 rate on the path this device takes (wgmma where the source's
/// sm_90a launch is taken) and on the portable mma.sync path (the same sources without the
/// Hopper launch): the template's `flops_bf16_tflops` and its `portable` implementation's.
fn attention_forward(gpu: &Gpu, profile: &mut DeviceProfile) -> Result<Vec<KernelRate>> {
    let (file, program, plan, sources) = attention_forward_plan(profile)?;
    let flops = plan.kernels[0].flops;
    let launch = profile.launch_overhead_us;
    let r = run_on(gpu, &program, &plan, &sources, &run_options(profile, 10))?;
    let hopper = r.sm90a > 0;
    let us = r.kernels[0].measured_us;
    let what =
        if hopper { "attention forward bf16, wgmma (sm_90a) path" } else { "attention forward bf16, mma.sync path" };
    let mut out = vec![KernelRate {
        what: what.into(),
        program: file.into(),
        flops,
        us,
        tflops: net_tflops(flops, us, 1, launch),
    }];
    let portable_us = if hopper {
        let portable: Vec<_> = sources
            .iter()
            .cloned()
            .map(|mut s| {
                s.launch.sm90a = None;
                s
            })
            .collect();
        let r = run_on(gpu, &program, &plan, &portable, &run_options(profile, 10))?;
        if r.sm90a > 0 {
            return Err(Error::Invalid(format!("calibration program {file}: the portable path ran on sm_90a")));
        }
        let us = r.kernels[0].measured_us;
        out.push(KernelRate {
            what: "attention forward bf16, portable mma.sync path".into(),
            program: file.into(),
            flops,
            us,
            tflops: net_tflops(flops, us, 1, launch),
        });
        us
    } else {
        us
    };
    let own = net_tflops(flops, us, 1, launch);
    profile
        .templates
        .get_mut(Template::Attention.name())
        .ok_or_else(|| Error::Invalid("the profile has no attention template".into()))?
        .flops_bf16_tflops = Some(round(own, 1));
    attention_impl(profile, "portable")?.flops_bf16_tflops = Some(round(net_tflops(flops, portable_us, 1, launch), 1));
    Ok(out)
}

/// The attention backward kernels' rates, flops over time net of their launches: the one kernel
/// of dq, dk and dv the planner picks (`implementations.backward_fused`), in bf16 (tensor cores)
/// and f32 (CUDA cores). The forward kernel of each plan (which writes the log-sum-exp too) is
/// reported beside it. (The deterministic bf16 dq and dk/dv kernels' rate,
/// `implementations.backward`'s bf16 one, is the base profile's: no default plan runs them, and
/// strict numerics keep attention's backward decomposed.)
fn attention_backward(gpu: &Gpu, profile: &mut DeviceProfile) -> Result<Vec<KernelRate>> {
    let mut out = attention_backward_form(gpu, profile, true, DType::Bf16)?;
    out.extend(attention_backward_form(gpu, profile, true, DType::F32)?);
    Ok(out)
}

fn attention_backward_form(
    gpu: &Gpu,
    profile: &mut DeviceProfile,
    fused: bool,
    dtype: DType,
) -> Result<Vec<KernelRate>> {
    let BackwardPlan { file, program, plan, backward, forward } = attention_backward_plan(profile, fused, dtype)?;
    let backward: Vec<&crate::plan::Kernel> = backward.iter().map(|&id| &plan.kernels[id]).collect();
    let forward = forward.map(|id| &plan.kernels[id]);
    let sources = codegen_plan(&plan)?;
    let r = run_on(gpu, &program, &plan, &sources, &run_options(profile, 10))?;
    let launch = profile.launch_overhead_us;
    let time = |id: usize| r.kernels.iter().find(|t| t.id == id).map_or(f64::NAN, |t| t.measured_us);
    let mut out: Vec<KernelRate> = Vec::new();
    if let Some(f) = forward {
        let us = time(f.id);
        out.push(KernelRate {
            what: format!("attention forward {dtype} writing the log-sum-exp ({}; not stored)", f.ops.join(" ")),
            program: file.into(),
            flops: f.flops,
            us,
            tflops: net_tflops(f.flops, us, 1, launch),
        });
    }
    for k in &backward {
        let us = time(k.id);
        out.push(KernelRate {
            what: format!("attention backward {dtype}, {}", k.ops.join(" ")),
            program: file.into(),
            flops: k.flops,
            us,
            tflops: net_tflops(k.flops, us, 1, launch),
        });
    }
    let flops: u64 = backward.iter().map(|k| k.flops).sum();
    let us: f64 = backward.iter().map(|k| time(k.id)).sum();
    if !us.is_finite() {
        return Err(Error::Invalid(format!("calibration program {file}: a backward kernel was not timed")));
    }
    let tflops = net_tflops(flops, us, backward.len(), launch);
    let (what, entry) = if fused {
        (format!("attention backward {dtype} (one kernel: dq by atomics)"), "backward_fused")
    } else {
        (format!("attention backward {dtype} (dq and dk/dv kernels, deterministic)"), "backward")
    };
    out.push(KernelRate { what, program: file.into(), flops, us, tflops });
    let rates = attention_impl(profile, entry)?;
    if dtype == DType::F32 {
        rates.flops_f32_tflops = round(tflops, 1);
    } else {
        rates.flops_bf16_tflops = Some(round(tflops, 1));
    }
    Ok(out)
}

fn round(x: f64, digits: i32) -> f64 {
    let m = 10f64.powi(digits);
    (x * m).round() / m
}

/// Bytes the copy-bandwidth measurement copies: 1 GiB, or a 16th of a smaller device's memory.
pub(crate) fn copy_bytes(gpu: &Gpu) -> u64 {
    (gpu.memory_bytes / 16).min(1 << 30) as u64
}

/// Median microseconds of a device-to-device copy of `bytes`.
pub(crate) fn copy_time(gpu: &Gpu, bytes: usize) -> Result<f64> {
    let mut src = gpu.alloc(bytes, "the copy source")?;
    gpu.fill(&mut src, 0x3c, "the copy source")?;
    let mut dst = gpu.alloc(bytes, "the copy destination")?;
    let (a, b) = (gpu.event()?, gpu.event()?);
    let mut times = Vec::new();
    for i in 0..23 {
        gpu.record(&a)?;
        gpu.copy(&src, &mut dst, bytes)?;
        gpu.record(&b)?;
        let t = gpu.elapsed_us(&a, &b)?;
        if i >= 3 {
            times.push(t);
        }
    }
    Ok(median(times))
}

/// The launch probe: `LAUNCH_CHAIN` pointwise operators, negation and exponential by turns (the
/// values stay between about -20 and 20), over 256 f32 values.
fn launch_program() -> Result<Program> {
    let x = TensorType::new(DType::F32, vec![256]);
    let body =
        (0..LAUNCH_CHAIN).fold("x".to_string(), |e, i| format!("({} {e})", if i % 2 == 0 { "neg" } else { "exp" }));
    Program::from_sexprs("calibrate-launch", &[("x", x)], &[("y", &body)]).map_err(Error::Invalid)
}

/// Operators in the launch probe's chain (`launch_time`), each its own kernel.
const LAUNCH_CHAIN: usize = 33;

/// A kernel's fixed time in a timed plan (`launch_overhead_us`): the median time of the kernels
/// of a chain of pointwise operators on 256 f32 values, each its own kernel (the unfused plan),
/// timed as `eqfuse run` and `eqfuse bench` time a plan's kernels (events recorded around every
/// launch), the first kernel (after the L2 flush) left out. Launched back to back with no
/// events between them, an empty kernel took 4.15 us on the H100 (2026-11-22), where kernels
/// of 4 KB or less took 3.65 us in timed plans (median of 401,
/// `benches/results/2026-11-26-h100-fidelity`): the cost model predicts the latter.
fn launch_time(gpu: &Gpu, base: &DeviceProfile) -> Result<f64> {
    let program = launch_program()?;
    let plan = unfused_plan(&program, base, false)?;
    let sources = codegen_plan(&plan)?;
    let r = run_on(gpu, &program, &plan, &sources, &run_options(base, 30))?;
    Ok(median(r.kernels.iter().skip(1).map(|k| k.measured_us).collect()))
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// Row programs over a 4 MiB f32 tensor whose longest chains of reductions are 1, 2 and 3 deep.
fn stage_programs() -> Result<Vec<Program>> {
    let x = TensorType::new(DType::F32, vec![1024, 1024]);
    let centred = "(- x (mean x -1))";
    let var = format!("(mean (* {centred} {centred}) -1)");
    let bodies = [
        "(sum x -1)".to_string(),
        "(softmax x -1)".to_string(),
        format!("(sum (* (- (* {centred} {centred}) {var}) (- (* {centred} {centred}) {var})) -1)"),
    ];
    bodies
        .iter()
        .enumerate()
        .map(|(i, b)| {
            Program::from_sexprs(&format!("calibrate-stages-{}", i + 1), &[("x", x.clone())], &[("y", b)])
                .map_err(Error::Invalid)
        })
        .collect()
}

/// The row kernels' latency per dependent reduction stage (`rowreduce.stage_latency_us`): small
/// row kernels (their bytes take about a microsecond) of 1, 2 and 3 stages as the cost model
/// counts them, each timed; the latency is the least-squares slope, through the origin, of
/// each kernel's time less the model's time for it without stage latency (launch overhead and
/// memory) against its stages.
fn stage_latency(gpu: &Gpu, profile: &mut DeviceProfile) -> Result<(Vec<StageProbe>, f64)> {
    let with = |latency: f64| {
        let mut p = profile.clone();
        if let Some(r) = p.templates.get_mut(Template::RowReduce.name()) {
            r.stage_latency_us = Some(latency);
        }
        p
    };
    let (zero, one) = (with(0.0), with(1.0));
    let mut probes = Vec::new();
    for program in stage_programs()? {
        let plan = optimize(&program, &OptimizeOptions::new(zero.clone()))?.plan;
        if plan.kernels.len() != 1 || plan.kernels[0].template != Template::RowReduce {
            return Err(Error::Invalid(format!(
                "calibration program {} did not plan as one row kernel",
                program.source
            )));
        }
        let base = plan.kernels[0].predicted_us;
        let plan1 = optimize(&program, &OptimizeOptions::new(one.clone()))?.plan;
        if plan1.kernels.len() != 1 {
            return Err(Error::Invalid(format!(
                "calibration program {} did not plan as one row kernel",
                program.source
            )));
        }
        let stages = (plan1.kernels[0].predicted_us - base).round().max(0.0) as u32;
        let sources = codegen_plan(&plan)?;
        let r = run_on(gpu, &program, &plan, &sources, &run_options(&zero, 30))?;
        probes.push((program.source.clone(), stages, r.kernels[0].measured_us, base));
    }
    let den: f64 = probes.iter().map(|p| f64::from(p.1).powi(2)).sum();
    let num: f64 = probes.iter().map(|p| f64::from(p.1) * (p.2 - p.3)).sum();
    let latency = if den > 0.0 { (num / den).max(0.0) } else { 0.0 };
    if let Some(r) = profile.templates.get_mut(Template::RowReduce.name()) {
        r.stage_latency_us = Some(round(latency, 2));
    }
    Ok((probes, latency))
}

/// The written bytes L2 holds (`l2_dirty_bytes`, see `search::residency::write_backs`) and the
/// column template's efficiency without them: two column sums of 128 MiB each in one plan,
/// timed as `eqfuse bench` times plans. The first kernel starts after the flush, L2 full of
/// written lines, and writes them back as its reads displace them; the second starts with L2
/// clean (the first wrote 16 KiB). The second's share of copy bandwidth is the template's
/// efficiency (`synthetic`'s column probe starts after the flush too, so its share includes the
/// write-back), and the difference of their times at that bandwidth is the bytes written back.
/// On an H100 in timed plans, large elementwise kernels right after a kernel that only read took
/// 4.96 us less than after one that wrote (median of 105, 14.8 MB at copy bandwidth), and column
/// and row kernels of 20 to 80 MB after writers about 4 us more than their bytes
/// (`benches/results/2026-11-26-h100-fidelity`).
fn dirty_bytes(gpu: &Gpu, profile: &mut DeviceProfile, copy_gbs: f64) -> Result<DirtyProbe> {
    let program = dirty_program()?;
    let plan = optimize(&program, &OptimizeOptions::new(profile.clone()))?.plan;
    if plan.kernels.len() != 2 || plan.kernels.iter().any(|k| k.template != Template::ColReduce) {
        return Err(Error::Invalid(format!(
            "calibration program {} did not plan as two column kernels",
            program.source
        )));
    }
    let sources = codegen_plan(&plan)?;
    let r = run_on(gpu, &program, &plan, &sources, &run_options(profile, 30))?;
    let (first, second) = (&r.kernels[0], &r.kernels[1]);
    let efficiency = (second.bytes as f64 / (copy_gbs * 1e3 * second.measured_us)).min(1.0);
    let dirty = (copy_gbs * 1e3 * efficiency * (first.measured_us - second.measured_us)).max(0.0) as u64;
    let dirty = profile.l2_bytes.map_or(dirty, |l2| dirty.min(l2));
    profile.l2_dirty_bytes = Some(dirty);
    if let Some(rates) = profile.templates.get_mut(Template::ColReduce.name()) {
        rates.bandwidth_efficiency = round(efficiency, 3);
    }
    Ok(DirtyProbe {
        program: program.source.clone(),
        after_flush_us: first.measured_us,
        clean_us: second.measured_us,
        dirty_bytes: dirty,
        efficiency,
    })
}

/// The elementwise template's share of its bandwidth efficiency where each lane accesses 1, 2, 4
/// or 8 bytes (`elementwise.narrow_access_share`): `narrow_programs`, each one elementwise kernel
/// of that many bytes a lane, its share of copy bandwidth over the template's (16-byte lanes).
fn narrow_access(gpu: &Gpu, profile: &mut DeviceProfile, copy_gbs: f64) -> Result<Vec<NarrowProbe>> {
    let efficiency = profile.rates(Template::Elementwise).bandwidth_efficiency;
    let mut out = Vec::new();
    for (width, program) in narrow_programs()? {
        let plan = narrow_plan(profile, &program, width)?;
        let sources = codegen_plan(&plan)?;
        let r = run_on(gpu, &program, &plan, &sources, &run_options(profile, 30))?;
        let k = &r.kernels[0];
        let share = (k.achieved_gbs / copy_gbs / efficiency).min(1.0);
        out.push((width, program.source.clone(), k.bytes, k.measured_us, share));
    }
    if let Some(rates) = profile.templates.get_mut(Template::Elementwise.name()) {
        for (width, _, _, _, share) in &out {
            rates.narrow_access_share.insert(width.to_string(), round(*share, 3));
        }
    }
    Ok(out)
}

/// A narrow-lane probe: (bytes per access, program, bytes moved, median microseconds, share of
/// the elementwise template's efficiency taken).
pub type NarrowProbe = (u32, String, u64, f64, f64);

/// `narrow_access`' probes, by bytes a lane: `(== x b)` over bool [16384, 16383] (1), and
/// `(* (+ x b) z)` over bf16 [8192, 8191] (2), f32 [8192, 4095] (4) and f32 [8192, 4094] (8),
/// `b` a row broadcast over the rows (of the last extent only), so that code generation cannot
/// walk the rows as one axis (it would read them 16 bytes a lane over the flat index).
fn narrow_programs() -> Result<Vec<(u32, Program)>> {
    let pointwise = |dt: DType, cols: usize| -> Result<Program> {
        let t = TensorType::new(dt, vec![8192, cols]);
        Program::from_sexprs(
            &format!("calibrate-lanes-{}-{cols}", dt.name()),
            &[("x", t.clone()), ("b", TensorType::new(dt, vec![cols])), ("z", t)],
            &[("y", "(* (+ x b) z)")],
        )
        .map_err(Error::Invalid)
    };
    let cols = 16383;
    let equal = Program::from_sexprs(
        "calibrate-lanes-bool-16383",
        &[("x", TensorType::new(DType::Bool, vec![16384, cols])), ("b", TensorType::new(DType::Bool, vec![cols]))],
        &[("y", "(== x b)")],
    )
    .map_err(Error::Invalid)?;
    Ok(vec![
        (1, equal),
        (2, pointwise(DType::Bf16, 8191)?),
        (4, pointwise(DType::F32, 4095)?),
        (8, pointwise(DType::F32, 4094)?),
    ])
}

/// A narrow-lane probe's plan: one elementwise kernel whose lanes access `width` bytes, as code
/// generation reads them (`caps::elementwise_reads`; error otherwise).
fn narrow_plan(profile: &DeviceProfile, program: &Program, width: u32) -> Result<FusionPlan> {
    let plan = optimize(program, &OptimizeOptions::new(profile.clone()))?.plan;
    let lanes = plan
        .kernels
        .first()
        .and_then(|k| crate::codegen::caps::elementwise_reads(k, false))
        .map(|r| r.lanes * r.widest);
    if plan.kernels.len() != 1 || plan.kernels[0].template != Template::Elementwise || lanes != Some(width as usize) {
        return Err(Error::Invalid(format!(
            "calibration program {} did not plan as one elementwise kernel of {width}-byte lanes",
            program.source
        )));
    }
    Ok(plan)
}

/// L2's reuse distances (`l2_reuse_bytes` and `l2_reuse_limit_bytes`, see
/// `search::residency::l2_hits_by_distance`): the unfused plans of `reuse_programs`, timed as
/// `eqfuse bench` times plans (after the flush), and the two distances whose prices of every
/// kernel fit the measured times best (least squares of the log of their ratio, `fit_reuse`),
/// the other rates as calibrated before.
fn reuse_distance(gpu: &Gpu, profile: &mut DeviceProfile) -> Result<ReuseProbe> {
    let mut measured = Vec::new();
    for program in reuse_programs()? {
        let plan = unfused_plan(&program, profile, false)?;
        let sources = codegen_plan(&plan)?;
        let r = run_on(gpu, &program, &plan, &sources, &run_options(profile, 30))?;
        measured.push((program, r.kernels.iter().map(|k| k.measured_us).collect::<Vec<_>>()));
    }
    let l2 = profile.l2_bytes.unwrap_or(50 << 20);
    let (near, far, rms) = fit_reuse(profile, &measured, l2)?;
    profile.l2_reuse_bytes = Some(near);
    profile.l2_reuse_limit_bytes = Some(far);
    Ok(ReuseProbe {
        programs: measured.iter().map(|(p, t)| (p.source.clone(), t.clone())).collect(),
        near,
        far,
        rms_log_error: rms,
    })
}

/// What `reuse_distance` measured: each program with its kernels' median microseconds in plan
/// order, the two distances taken, and the root mean square of the log of measured over
/// predicted times with them.
#[derive(Clone, Debug)]
pub struct ReuseProbe {
    pub programs: Vec<(String, Vec<f64>)>,
    pub near: u64,
    pub far: u64,
    pub rms_log_error: f64,
}

/// The reuse distances (bytes: near, far) that price the unfused plans of `measured` (each
/// program with its kernels' measured microseconds in plan order) closest to their times, on a
/// grid of 2 MiB steps for `near` (up to the L2 size `l2`) and 4 MiB steps beyond it for `far`
/// (up to twice `l2`), and the root mean square of the log of measured over predicted times
/// there.
fn fit_reuse(profile: &DeviceProfile, measured: &[(Program, Vec<f64>)], l2: u64) -> Result<(u64, u64, f64)> {
    const MIB: u64 = 1 << 20;
    let mut best: Option<(f64, u64, u64)> = None;
    for near in (2..=(l2 / MIB).max(2)).step_by(2).map(|m| m * MIB) {
        for far in (near + 4 * MIB..=2 * l2.max(near)).step_by(4 * MIB as usize) {
            let p = DeviceProfile { l2_reuse_bytes: Some(near), l2_reuse_limit_bytes: Some(far), ..profile.clone() };
            let (mut sum, mut n) = (0.0, 0usize);
            for (program, times) in measured {
                let plan = unfused_plan(program, &p, false)?;
                if plan.kernels.len() != times.len() {
                    return Err(Error::Invalid(format!(
                        "calibration program {} planned as {} kernels, measured {}",
                        program.source,
                        plan.kernels.len(),
                        times.len()
                    )));
                }
                for (k, &t) in plan.kernels.iter().zip(times) {
                    sum += (t / k.predicted_us).ln().powi(2);
                    n += 1;
                }
            }
            let rms = (sum / n.max(1) as f64).sqrt();
            if best.is_none_or(|b| rms < b.0) {
                best = Some((rms, near, far));
            }
        }
    }
    let (rms, near, far) = best.ok_or_else(|| Error::Invalid("no reuse distances to fit".into()))?;
    Ok((near, far, rms))
}

/// `reuse_distance`'s probes: over an f32 tensor `x` of 8 to 64 MiB (rows of 1024), a chain of
/// unary kernels, each reading the last one's result and writing one as large, a row sum of
/// the last and one more unary kernel on it, so that their reads come back after distances from
/// the tensor's size to four times it.
fn reuse_programs() -> Result<Vec<Program>> {
    [8usize, 12, 16, 20, 24, 28, 32, 40, 48, 64]
        .iter()
        .map(|&mib| {
            let x = TensorType::new(DType::F32, vec![mib * 256, 1024]);
            Program::from_sexprs(
                &format!("calibrate-l2-reuse-{mib}MiB"),
                &[("x", x)],
                &[("s", "(sum (tanh (sigmoid (exp x))) -1)"), ("d", "(sin (tanh (sigmoid (exp x))))")],
            )
            .map_err(Error::Invalid)
        })
        .collect()
}

/// `dirty_bytes`' probe: two column sums over f32 [8192, 4096], one of each input.
fn dirty_program() -> Result<Program> {
    let x = TensorType::new(DType::F32, vec![8192, 4096]);
    Program::from_sexprs(
        "calibrate-l2-written",
        &[("a", x.clone()), ("b", x)],
        &[("y", "(sum a 0)"), ("z", "(sum b 0)")],
    )
    .map_err(Error::Invalid)
}

/// The column template's rate on an online pair (a running max and the sum of exponentials
/// rescaled to it, `cost::KernelCost::online`): its share of copy bandwidth, as the template's
/// own, in `colreduce.implementations.online`. The probe's plan is two column kernels: a plain
/// sum of another tensor first, which takes the write-backs of the flush before a timed run
/// (the template's own efficiency is measured with L2 clean too, `dirty_bytes`), then the pair.
fn online_columns(gpu: &Gpu, profile: &mut DeviceProfile, copy_gbs: f64) -> Result<TemplateShare> {
    let program = online_program()?;
    let plan = optimize(&program, &OptimizeOptions::new(profile.clone()))?.plan;
    let online = |k: &crate::plan::Kernel| k.ops.iter().any(|o| o == "exp");
    if plan.kernels.len() != 2
        || plan.kernels.iter().any(|k| k.template != Template::ColReduce)
        || online(&plan.kernels[0])
        || !online(&plan.kernels[1])
    {
        return Err(Error::Invalid(format!(
            "calibration program {} did not plan as a plain column kernel, then an online one",
            program.source
        )));
    }
    let sources = codegen_plan(&plan)?;
    let r = run_on(gpu, &program, &plan, &sources, &run_options(profile, 30))?;
    let k = &r.kernels[1];
    let share = (k.achieved_gbs / copy_gbs).min(1.0);
    if let Some(rates) = profile.templates.get_mut(Template::ColReduce.name()) {
        let online = TemplateRates {
            implementations: Default::default(),
            bandwidth_efficiency: round(share, 3),
            ..rates.clone()
        };
        rates.implementations.insert("online".into(), online);
    }
    Ok((Template::ColReduce, program.source.clone(), k.bytes, k.measured_us, share))
}

fn online_program() -> Result<Program> {
    Program::from_sexprs(
        "calibrate-colreduce-online",
        &[("a", TensorType::new(DType::F32, vec![8192, 4096])), ("x", TensorType::new(DType::F32, vec![8192, 2048]))],
        &[("y", "(sum a 0)"), ("w", "(sum (exp (- x (amax x 0))) 0)")],
    )
    .map_err(Error::Invalid)
}

/// What `dirty_bytes` measured: the program, its two kernels' median microseconds (after the
/// flush, then with L2 clean), and the written bytes and column efficiency taken.
#[derive(Clone, Debug)]
pub struct DirtyProbe {
    pub program: String,
    pub after_flush_us: f64,
    pub clean_us: f64,
    pub dirty_bytes: u64,
    pub efficiency: f64,
}

/// One stage-latency probe: (program, stages, median microseconds, the model's time without
/// stage latency).
pub type StageProbe = (String, u32, f64, f64);

/// Products with a row softmax over few output tiles, which the planner runs as one generated
/// gemm kernel split along K (`EQ_SPLITS` > 1): f32 [256, K] x [K, 50] (softmax regression's
/// shape) at K 1024 and 4096 (the same as benches/gpu/split). Not on the tensor cores: their
/// tile fits are off by up to 30% on some probes, more than the latency (a bf16 512x2048x128
/// probe took 12.5 us against 8.3 predicted without split latency by calibrate's own tiles,
/// 16.7 by the committed profile's; benches/results/2026-11-22-h100-b76cf2b-latencies).
fn split_programs() -> Result<Vec<Program>> {
    [(DType::F32, 256, 1024, 50), (DType::F32, 256, 4096, 50)]
        .iter()
        .map(|&(dt, m, k, n)| {
            Program::from_sexprs(
                &format!("calibrate-split-{}-{m}x{k}x{n}", dt.name()),
                &[("a", TensorType::new(dt, vec![m, k])), ("b", TensorType::new(dt, vec![k, n]))],
                &[("y", "(softmax (@ a b) -1)")],
            )
            .map_err(Error::Invalid)
        })
        .collect()
}

/// The split-K latency of the generated gemm (`gemm.implementations.generated.split_latency_us`):
/// each probe of [`split_programs`] is planned without it and timed; the latency is the mean
/// of each kernel's time less the model's time for it (whose tile step times come from this
/// profile, so this follows `tile_rates`).
fn split_latency(gpu: &Gpu, profile: &mut DeviceProfile) -> Result<(Vec<SplitProbe>, f64)> {
    gemm_impl(profile, GemmImpl::Generated).split_latency_us = Some(0.0);
    let planning = without_cublaslt(profile);
    let mut probes = Vec::new();
    for program in split_programs()? {
        let plan = optimize(&program, &OptimizeOptions::new(planning.clone()))?.plan;
        let sources = codegen_plan(&plan)?;
        let splits = sources
            .first()
            .and_then(|s| s.source.lines().find_map(|l| l.strip_prefix("#define EQ_SPLITS ")?.trim().parse().ok()))
            .unwrap_or(1usize);
        if plan.kernels.len() != 1 || plan.kernels[0].template != Template::Gemm || splits < 2 {
            return Err(Error::Invalid(format!(
                "calibration program {} did not plan as one generated gemm kernel split along K",
                program.source
            )));
        }
        let r = run_on(gpu, &program, &plan, &sources, &run_options(profile, 30))?;
        probes.push((program.source.clone(), splits, r.kernels[0].measured_us, plan.kernels[0].predicted_us));
    }
    let latency = (probes.iter().map(|p| p.2 - p.3).sum::<f64>() / probes.len().max(1) as f64).max(0.0);
    gemm_impl(profile, GemmImpl::Generated).split_latency_us = Some(round(latency, 2));
    Ok((probes, latency))
}

/// One split-latency probe: (program, splits, median microseconds, the model's time without
/// split latency).
pub type SplitProbe = (String, usize, f64, f64);

/// `profile` with cuBLASLt priced out (a call overhead of a second), so that a probe of the
/// The strided-read probes: an f32 transpose, which codegen reads through its shared-memory
/// tile, and a bf16 `[N, 4]` read as `[4, N]`, which it reads on the plain path (a tile's
/// warp would use 8 bytes of a sector, as the plain lanes do), touching 4 bytes of sectors per
/// byte used, with every sector's rest used by the warps that follow (served from L2).
fn strided_programs() -> Result<Vec<Program>> {
    let p = |name: &str, x: TensorType, out: &str| {
        Program::from_sexprs(name, &[("x", x)], &[("y", out)]).map_err(Error::Invalid)
    };
    Ok(vec![
        p("calibrate-tiled", TensorType::new(DType::F32, vec![8192, 8192]), "(transpose x 0 1)")?,
        p("calibrate-sectors", TensorType::new(DType::Bf16, vec![1 << 24, 4]), "(+ (transpose x 0 1) 1)")?,
    ])
}

/// Plans a strided probe as its one elementwise kernel: its plan, sources, whether it takes the
/// tiled path, and the excess of the sectors it touches over its bytes read.
fn strided_plan(profile: &DeviceProfile, program: &Program) -> Result<(FusionPlan, Vec<KernelSource>, bool, u64)> {
    let plan = optimize(program, &OptimizeOptions::new(profile.clone()))?.plan;
    let (Some(k), 1) = (plan.kernels.first(), plan.kernels.len()) else {
        return Err(Error::Invalid(format!("calibration program {} did not plan as one kernel", program.source)));
    };
    let crate::codegen::caps::ElementwiseReads { tiled, traffic, .. } =
        crate::codegen::caps::elementwise_reads(k, false).ok_or_else(|| {
            Error::Invalid(format!("calibration program {} did not plan as an elementwise kernel", program.source))
        })?;
    let excess = traffic.iter().map(|t| (k.bytes_read as f64 * (t.sectors_per_byte - 1.0)) as u64).sum();
    let sources = codegen_plan(&plan)?;
    Ok((plan, sources, tiled, excess))
}

/// Measures the elementwise template's tiled path (its share of copy bandwidth, as the
/// templates' own) and the bandwidth of strided reads' sectors (the kernel's bytes plus the
/// sectors' excess, over its time past the launch overhead).
fn strided_rates(gpu: &Gpu, profile: &mut DeviceProfile, copy_gbs: f64, launch_us: f64) -> Result<Vec<StridedProbe>> {
    let programs = strided_programs()?;
    let mut probes = Vec::new();
    for (i, program) in programs.iter().enumerate() {
        let (plan, sources, tiled, excess) = strided_plan(profile, program)?;
        if tiled != (i == 0) {
            return Err(Error::Invalid(format!(
                "calibration program {} did not plan {} the tiled path",
                program.source,
                if i == 0 { "on" } else { "off" }
            )));
        }
        let r = run_on(gpu, program, &plan, &sources, &run_options(profile, 30))?;
        let k = &r.kernels[0];
        let rates = profile
            .templates
            .get_mut(Template::Elementwise.name())
            .ok_or_else(|| Error::Invalid("the profile has no elementwise rates".into()))?;
        if tiled {
            let share = round((k.achieved_gbs / copy_gbs).min(1.0), 3);
            let tiled_rates =
                TemplateRates { bandwidth_efficiency: share, implementations: BTreeMap::new(), ..rates.clone() };
            rates.implementations.insert("tiled".into(), tiled_rates);
            probes.push((
                "tiled path, share of copy bandwidth".into(),
                program.source.clone(),
                k.bytes,
                0,
                k.measured_us,
                share,
            ));
        } else {
            let net_us = (k.measured_us - launch_us).max(1e-3);
            let gbs = round((k.bytes + excess) as f64 / (net_us * 1e3), 1);
            profile.sector_bandwidth_gbs = Some(gbs);
            probes.push(("strided sectors, GB/s".into(), program.source.clone(), k.bytes, excess, k.measured_us, gbs));
        }
    }
    Ok(probes)
}

/// generated gemm plans as one whatever the profile's other figures make of cuBLASLt.
fn without_cublaslt(profile: &DeviceProfile) -> DeviceProfile {
    let mut p = profile.clone();
    gemm_impl(&mut p, GemmImpl::Cublaslt).call_overhead_us = Some(1e6);
    p
}

/// The share of copy bandwidth of row kernels whose rows are spread over clusters of blocks
/// (`rowreduce.implementations.cluster`, the template's other rates kept), measured on an f32
/// softmax over 1024 rows of 128256 (a Llama-3 vocabulary) where the device runs its Hopper path
/// (a 9.0 device); `None`, and the profile left as it is, elsewhere. (Rows of 16-bit values are
/// not spread over clusters by default since 2026-11-26: the bf16 softmax over 4096 x 50257,
/// the probe until then, no longer plans as one, and calibrate stopped at it.)
fn cluster_rows(gpu: &Gpu, profile: &mut DeviceProfile, copy_gbs: f64) -> Result<Option<TemplateShare>> {
    let (program, plan, sources) = cluster_probe(profile)?;
    let r = run_on(gpu, &program, &plan, &sources, &run_options(profile, 30))?;
    if r.sm90a == 0 {
        return Ok(None);
    }
    let k = &r.kernels[0];
    let share = (k.achieved_gbs / copy_gbs).min(1.0);
    if let Some(rates) = profile.templates.get_mut(Template::RowReduce.name()) {
        let mut cluster = TemplateRates { implementations: Default::default(), ..rates.clone() };
        cluster.bandwidth_efficiency = round(share, 3);
        rates.implementations.insert("cluster".into(), cluster);
    }
    Ok(Some((Template::RowReduce, program.source.clone(), k.bytes, k.measured_us, share)))
}

/// Rows of the row time's probe ([`row_time`]): a mean over each of `ROW_PROBE_ROWS` rows of 3 f32.
const ROW_PROBE_ROWS: usize = 1 << 22;

/// The row template's time a row (`rowreduce.row_ns`): a mean over [`ROW_PROBE_ROWS`] rows of
/// 3 f32 (a thread's one load a row), its time less the launch overhead and its bytes at the
/// template's efficiency (measured before it), divided by its rows.
fn row_time(gpu: &Gpu, profile: &mut DeviceProfile, copy_gbs: f64) -> Result<(String, f64, f64)> {
    let (program, plan, sources) = row_probe(profile)?;
    let r = run_on(gpu, &program, &plan, &sources, &run_options(profile, 20))?;
    let k = &r.kernels[0];
    let rates = profile
        .templates
        .get_mut(Template::RowReduce.name())
        .ok_or_else(|| Error::Invalid("the profile has no rowreduce template".into()))?;
    let bytes_us = k.bytes as f64 / (copy_gbs * rates.bandwidth_efficiency * 1e3);
    let ns = 1e3 * (k.measured_us - profile.launch_overhead_us - bytes_us).max(0.0) / ROW_PROBE_ROWS as f64;
    rates.row_ns = Some(round(ns, 4));
    Ok((program.source.clone(), k.measured_us, ns))
}

/// [`row_time`]'s probe, planned and generated: an error unless it is one row kernel whose rows
/// are neither segmented nor spread over clusters.
fn row_probe(profile: &DeviceProfile) -> Result<(Program, FusionPlan, Vec<KernelSource>)> {
    let x = TensorType::new(DType::F32, vec![ROW_PROBE_ROWS, 3]);
    let program = Program::from_sexprs("calibrate-rowreduce-rows", &[("x", x)], &[("y", "(mean x -1)")])
        .map_err(Error::Invalid)?;
    let plan = optimize(&program, &OptimizeOptions::new(profile.clone()))?.plan;
    let sources = codegen_plan(&plan)?;
    if plan.kernels.len() != 1 || plan.kernels[0].template != Template::RowReduce || sources[0].launch.sm90a.is_some() {
        return Err(Error::Invalid(format!("calibration program {} did not plan as one row kernel", program.source)));
    }
    Ok((program, plan, sources))
}

/// [`cluster_rows`]' probe, planned and generated: an error unless it is one row kernel whose
/// Hopper path spreads its rows over clusters.
fn cluster_probe(profile: &DeviceProfile) -> Result<(Program, FusionPlan, Vec<KernelSource>)> {
    let x = TensorType::new(DType::F32, vec![1024, 128256]);
    let program = Program::from_sexprs("calibrate-rowreduce-cluster", &[("x", x)], &[("y", "(softmax x -1)")])
        .map_err(Error::Invalid)?;
    let plan = optimize(&program, &OptimizeOptions::new(profile.clone()))?.plan;
    let sources = codegen_plan(&plan)?;
    if plan.kernels.len() != 1 || sources[0].launch.sm90a.as_ref().is_none_or(|l| l.cluster < 2) {
        return Err(Error::Invalid(format!(
            "calibration program {} did not plan as one row kernel over clusters",
            program.source
        )));
    }
    Ok((program, plan, sources))
}

/// One large program per generated template, each planning as a single kernel.
fn synthetic() -> Result<Vec<(Template, Program)>> {
    let f32 = |s: &[usize]| TensorType::new(DType::F32, s.to_vec());
    let n = 1 << 26;
    let (r, c) = (16384, 4096);
    let p = |name: &str, inputs: &[(&str, TensorType)], out: &str| {
        Program::from_sexprs(name, inputs, &[("y", out)]).map_err(Error::Invalid)
    };
    Ok(vec![
        (Template::Elementwise, p("calibrate-elementwise", &[("x", f32(&[n])), ("z", f32(&[n]))], "(* (+ x 1) z)")?),
        (Template::RowReduce, p("calibrate-rowreduce", &[("x", f32(&[r, c]))], "(softmax x -1)")?),
        (Template::ColReduce, p("calibrate-colreduce", &[("x", f32(&[r, c]))], "(sum x 0)")?),
    ])
}

/// Today's date (UTC) as `YYYY-MM-DD`.
fn today() -> String {
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let days = (secs / 86_400) as i64;
    // Howard Hinnant's civil-from-days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}")
}

impl fmt::Display for Calibration {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        let p = &self.profile;
        writeln!(f, "calibrated {} ({})", p.device, p.name)?;
        writeln!(
            f,
            "  copy bandwidth   {:.0} GB/s (read + write; {} copied in {:.1} us)",
            p.copy_bandwidth_gbs,
            crate::plan::render::human_bytes(self.copy_bytes),
            self.copy_us
        )?;
        writeln!(f, "  launch overhead  {:.2} us per small kernel in a timed plan", self.launch_us)?;
        for (t, prog, bytes, us, share) in &self.templates {
            writeln!(
                f,
                "  {:<12} {:>5.1}% of copy bandwidth ({prog}: {} in {us:.1} us)",
                t.name(),
                100.0 * share,
                crate::plan::render::human_bytes(*bytes)
            )?;
        }
        for (what, prog, bytes, excess, us, figure) in &self.strided {
            writeln!(
                f,
                "  {what:<36} {figure:>8.3} ({prog}: {} and {} of sectors' excess in {us:.1} us)",
                crate::plan::render::human_bytes(*bytes),
                crate::plan::render::human_bytes(*excess)
            )?;
        }
        let (probes, latency) = &self.stages;
        writeln!(f, "  row stage        {latency:.2} us per dependent reduction stage")?;
        for (prog, n, us, base) in probes {
            writeln!(f, "      {prog:<40} {n} stages {us:>7.1} us (model without stage latency {base:.1} us)")?;
        }
        for (width, prog, bytes, us, share) in &self.narrow {
            writeln!(
                f,
                "  {width}-byte lanes     {:>5.1}% of the elementwise efficiency ({prog}: {} in {us:.1} us)",
                100.0 * share,
                crate::plan::render::human_bytes(*bytes)
            )?;
        }
        let d = &self.dirty;
        writeln!(
            f,
            "  L2 written bytes {} held ({}: {:.1} us after the flush, {:.1} us with L2 clean; colreduce at {:.1}% of copy bandwidth)",
            crate::plan::render::human_bytes(d.dirty_bytes),
            d.program,
            d.after_flush_us,
            d.clean_us,
            100.0 * d.efficiency
        )?;
        let r = &self.reuse;
        writeln!(
            f,
            "  L2 reuse         hits within {} of distance, none beyond {} (log error {:.3} over {} programs)",
            crate::plan::render::human_bytes(r.near),
            crate::plan::render::human_bytes(r.far),
            r.rms_log_error,
            r.programs.len()
        )?;
        for (prog, times) in &r.programs {
            let times: Vec<String> = times.iter().map(|t| format!("{t:.1}")).collect();
            writeln!(f, "      {prog:<40} {} us", times.join(", "))?;
        }
        let (probes, latency) = &self.split;
        writeln!(f, "  split-K          {latency:.2} us past the model's steps and parts' reads")?;
        for (prog, n, us, base) in probes {
            writeln!(f, "      {prog:<40} {n} splits {us:>7.1} us (model without split latency {base:.1} us)")?;
        }
        let (prog, us) = &self.cublaslt_call;
        writeln!(f, "  cuBLASLt call    {us:.1} us ({prog}: 64x128x64 f32)")?;
        let (prog, us, ns) = &self.cublaslt_tile;
        writeln!(f, "  cuBLASLt tile    {ns:.2} ns ({prog}: {TILE_PROBE_BATCH} x 8x8x8 f32 in {us:.1} us)")?;
        let (prog, bytes, us, share) = &self.cublaslt_skinny;
        writeln!(
            f,
            "  cuBLASLt skinny  {:.1}% of copy bandwidth ({prog}: {} in {us:.1} us)",
            100.0 * share,
            crate::plan::render::human_bytes(*bytes)
        )?;
        let (prog, us, ns) = &self.row;
        writeln!(f, "  rowreduce row    {ns:.4} ns ({prog}: {ROW_PROBE_ROWS} rows of 3 f32 in {us:.1} us)")?;
        for (imp, dtype, prog, us, tflops) in &self.gemm {
            writeln!(f, "  gemm {:<9} {dtype:<4} {tflops:>6.1} TFLOP/s ({prog}: {us:.1} us)", imp.name())?;
        }
        for a in &self.attention {
            writeln!(
                f,
                "  {:<58} {:>6.1} TFLOP/s ({}: {:.1} GFLOP in {:.1} us)",
                a.what,
                a.tflops,
                a.program,
                a.flops as f64 * 1e-9,
                a.us
            )?;
        }
        writeln!(
            f,
            "  tile step times, fit relative to each probe's time: time = launch overhead + K x step \
             (lone: about one block per SM; shared and block: x blocks/SMs) + waves x row epilogue + blocks/SMs x block"
        )?;
        for t in &self.tiles {
            writeln!(
                f,
                "  {:<13} {:<7} lone {:>6.1} ns, shared {:>6.1} ns per step, row epilogue {:>5.2} us per wave, \
                 block {:>5.3} us; off by {:>4.1}% on average, {:>4.1}% at worst; a free intercept would be {:>5.1} us ({})",
                t.family.name(),
                t.key,
                t.rate.lone_ns_per_k,
                t.rate.sm_ns_per_k,
                t.rate.row_epilogue_us,
                t.rate.block_us,
                100.0 * t.mean(),
                100.0 * t.worst(),
                t.free_overhead_us.unwrap_or(f64::NAN),
                t.family.map()
            )?;
            if let Some(note) = &t.note {
                writeln!(f, "      note: {note}")?;
            }
            for m in &t.probes {
                writeln!(
                    f,
                    "      {:<48} {:<6} {:<22} {:>6} steps {:>5} blocks {:>9.1} us (fit {:>9.1})",
                    m.program,
                    m.form.name(),
                    m.shape,
                    m.steps,
                    m.blocks,
                    m.us,
                    m.fit_us
                )?;
            }
        }
        let parts: Vec<String> = self.seconds.iter().map(|(w, s)| format!("{w} {s:.1} s")).collect();
        writeln!(f, "  took {}", parts.join(", "))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The probe of rows over clusters must plan as one clustered row kernel on both profiles
    /// (the bf16 probe stopped `eqfuse calibrate` on the H100 and H200 once 16-bit rows were no
    /// longer clustered by default).
    /// The row time's probe is one row kernel, neither segmented nor over clusters, on both
    /// profiles; with a time a row, the kernel's price grows by rows x that time.
    #[test]
    fn row_probe_plans_as_one_row_kernel_and_row_ns_prices_its_rows() {
        for device in ["h100", "h200"] {
            let mut p = DeviceProfile::load(device).unwrap();
            p.templates.get_mut("rowreduce").unwrap().row_ns = None;
            let (program, plan, _) = row_probe(&p).unwrap();
            assert_eq!(plan.kernels.len(), 1);
            p.templates.get_mut("rowreduce").unwrap().row_ns = Some(10.0);
            let priced = optimize(&program, &OptimizeOptions::new(p)).unwrap().plan;
            let more = priced.kernels[0].predicted_us - plan.kernels[0].predicted_us;
            // (10 ns a row: 41.9 us over 2^22 rows.)
            assert!((more - 1e-2 * ROW_PROBE_ROWS as f64).abs() < 0.5, "{device}: {more}");
        }
    }

    #[test]
    fn cluster_probe_plans_as_one_row_kernel_over_clusters() {
        for device in ["h100", "h200"] {
            let (_, plan, sources) = cluster_probe(&DeviceProfile::load(device).unwrap()).unwrap();
            assert_eq!(plan.kernels.len(), 1);
            assert!(sources[0].launch.sm90a.as_ref().unwrap().cluster >= 2);
        }
    }

    #[test]
    fn strided_probes_plan_on_the_tiled_and_the_plain_path() {
        let base = DeviceProfile::load("h100").unwrap();
        let programs = strided_programs().unwrap();
        let (_, _, tiled, excess) = strided_plan(&base, &programs[0]).unwrap();
        assert!(tiled);
        assert_eq!(excess, 0);
        let (plan, _, tiled, excess) = strided_plan(&base, &programs[1]).unwrap();
        assert!(!tiled);
        assert_eq!(excess, 3 * plan.kernels[0].bytes_read);
    }

    #[test]
    fn stage_probes_plan_as_one_row_kernel_of_1_2_and_3_stages() {
        let base = DeviceProfile::load("h100").unwrap();
        for (i, program) in stage_programs().unwrap().into_iter().enumerate() {
            let mut times = Vec::new();
            for latency in [0.0, 1.0] {
                let mut p = base.clone();
                p.templates.get_mut("rowreduce").unwrap().stage_latency_us = Some(latency);
                let plan = optimize(&program, &OptimizeOptions::new(p)).unwrap().plan;
                assert_eq!(plan.kernels.len(), 1, "{}", program.source);
                assert_eq!(plan.kernels[0].template, Template::RowReduce);
                times.push(plan.kernels[0].predicted_us);
            }
            assert_eq!((times[1] - times[0]).round(), (i + 1) as f64, "{}", program.source);
        }
    }

    #[test]
    fn split_probes_plan_as_one_generated_gemm_split_along_k() {
        let mut p = DeviceProfile::load("h100").unwrap();
        gemm_impl(&mut p, GemmImpl::Generated).split_latency_us = Some(0.0);
        p.templates.get_mut("rowreduce").unwrap().stage_latency_us = Some(0.0);
        let p = without_cublaslt(&p);
        for program in split_programs().unwrap() {
            let plan = optimize(&program, &OptimizeOptions::new(p.clone())).unwrap().plan;
            assert_eq!(plan.kernels.len(), 1, "{}", program.source);
            assert_eq!(plan.kernels[0].template, Template::Gemm, "{}", program.source);
            let sources = codegen_plan(&plan).unwrap();
            let splits: usize = sources[0]
                .source
                .lines()
                .find_map(|l| l.strip_prefix("#define EQ_SPLITS ")?.trim().parse().ok())
                .unwrap_or(1);
            assert!(splits > 1, "{} runs unsplit", program.source);
        }
    }

    #[test]
    fn the_launch_probe_runs_one_small_kernel_per_operator() {
        let p = DeviceProfile::load("h100").unwrap();
        let program = launch_program().unwrap();
        let plan = unfused_plan(&program, &p, false).unwrap();
        assert_eq!(plan.kernels.len(), LAUNCH_CHAIN);
        for k in &plan.kernels {
            assert_eq!(k.template, Template::Elementwise);
            assert_eq!(k.bytes_read + k.bytes_written, 2048);
            assert!((k.predicted_us - p.launch_overhead_us).abs() < 0.01, "{}", k.predicted_us);
        }
        assert_eq!(codegen_plan(&plan).unwrap().len(), LAUNCH_CHAIN);
        let values = crate::reference::eval(&program, &crate::reference::rng::random_inputs(&program, 0)).unwrap();
        assert!(values[0].data.iter().all(|v| v.is_finite()));
    }

    #[test]
    fn the_online_probe_is_a_plain_column_kernel_then_an_online_pair_priced_at_its_rates() {
        for device in ["h100", "h200"] {
            let mut p = DeviceProfile::load(device).unwrap();
            let program = online_program().unwrap();
            let plan = optimize(&program, &OptimizeOptions::new(p.clone())).unwrap().plan;
            assert_eq!(plan.kernels.len(), 2, "{device}");
            assert!(plan.kernels.iter().all(|k| k.template == Template::ColReduce));
            assert!(!plan.kernels[0].ops.iter().any(|o| o == "exp"));
            assert!(plan.kernels[1].ops.iter().any(|o| o == "exp"));
            assert_eq!(plan.kernels[1].bytes_read, 64 << 20);
            // At half the plain rate the pair's kernel takes about twice its time.
            let mut online = p.templates["colreduce"].clone();
            online.implementations.clear();
            online.bandwidth_efficiency = p.templates["colreduce"].bandwidth_efficiency / 2.0;
            p.templates.get_mut("colreduce").unwrap().implementations.remove("online");
            let plain = optimize(&program, &OptimizeOptions::new(p.clone())).unwrap().plan.kernels[1].predicted_us;
            p.templates.get_mut("colreduce").unwrap().implementations.insert("online".into(), online);
            let slow = optimize(&program, &OptimizeOptions::new(p.clone())).unwrap().plan.kernels[1].predicted_us;
            let net = |us: f64| us - p.launch_overhead_us;
            assert!((net(slow) / net(plain) - 2.0).abs() < 0.05, "{device}: {slow} against {plain}");
        }
    }

    #[test]
    fn the_written_bytes_probe_is_two_column_kernels_of_128_mib_the_second_after_a_clean_l2() {
        let p = DeviceProfile::load("h100").unwrap();
        let dirty = p.l2_dirty_bytes.expect("the h100 profile's written bytes");
        let program = dirty_program().unwrap();
        let plan = optimize(&program, &OptimizeOptions::new(p.clone())).unwrap().plan;
        assert_eq!(plan.kernels.len(), 2);
        for k in &plan.kernels {
            assert_eq!(k.template, Template::ColReduce);
            assert_eq!(k.bytes_read, 128 << 20);
            assert!(k.bytes_written < 1 << 20);
        }
        // The model charges the first the written bytes it displaces, as the probe measures.
        let bandwidth = p.copy_bandwidth_gbs * 1e3 * p.templates["colreduce"].bandwidth_efficiency;
        let extra = plan.kernels[0].predicted_us - plan.kernels[1].predicted_us;
        assert!((extra - dirty as f64 / bandwidth).abs() < 0.01, "{extra}");
    }

    /// Each reuse probe plans unfused as its five kernels; the fit recovers the distances that
    /// priced a set of times, and the distances change the probes' prices (they measure them).
    #[test]
    fn the_reuse_fit_recovers_the_distances_that_priced_the_probes() {
        let mib = 1u64 << 20;
        let p = DeviceProfile::load("h200").unwrap();
        let truth = DeviceProfile { l2_reuse_bytes: Some(30 * mib), l2_reuse_limit_bytes: Some(70 * mib), ..p.clone() };
        let measured: Vec<(Program, Vec<f64>)> = reuse_programs()
            .unwrap()
            .into_iter()
            .map(|program| {
                let plan = unfused_plan(&program, &truth, false).unwrap();
                assert_eq!(plan.kernels.len(), 5, "{}", program.source);
                let times = plan.kernels.iter().map(|k| k.predicted_us).collect();
                (program, times)
            })
            .collect();
        let (near, far, rms) = fit_reuse(&p, &measured, p.l2_bytes.unwrap()).unwrap();
        assert_eq!((near / mib, far / mib), (30, 70), "rms {rms}");
        assert!(rms < 1e-9, "{rms}");
        // Another pair prices them otherwise.
        let other = DeviceProfile { l2_reuse_bytes: Some(10 * mib), l2_reuse_limit_bytes: Some(20 * mib), ..p };
        let (program, times) = &measured[5];
        let plan = unfused_plan(program, &other, false).unwrap();
        assert!(plan.kernels.iter().zip(times).any(|(k, t)| (k.predicted_us / t - 1.0).abs() > 0.05));
    }

    #[test]
    fn narrow_probes_plan_as_one_elementwise_kernel_of_their_lanes_priced_at_their_share() {
        let p = DeviceProfile::load("h100").unwrap();
        let rates = p.rates(Template::Elementwise);
        for (width, program) in narrow_programs().unwrap() {
            let plan = narrow_plan(&p, &program, width).unwrap();
            let k = &plan.kernels[0];
            assert!(k.bytes_read + k.bytes_written >= 256 << 20, "{}", program.source);
            let share = rates.narrow_access_share[&width.to_string()];
            let bandwidth = p.copy_bandwidth_gbs * 1e3 * rates.bandwidth_efficiency * share;
            let priced = p.launch_overhead_us + (k.bytes_read + k.bytes_written) as f64 / bandwidth;
            assert!((k.predicted_us - priced).abs() < 0.01, "{}: {} against {priced}", program.source, k.predicted_us);
        }
    }

    #[test]
    fn device_names_map_to_profiles() {
        assert_eq!(short_name("NVIDIA H100 80GB HBM3"), "h100");
        assert_eq!(short_name("NVIDIA H200"), "h200");
        assert_eq!(short_name("NVIDIA A100-SXM4-40GB"), "nvidia-a100-sxm4-40gb");
    }

    #[test]
    fn synthetic_programs_plan_as_one_kernel_of_their_template() {
        let opts = OptimizeOptions::new(DeviceProfile::load("h100").unwrap());
        for (t, p) in synthetic().unwrap() {
            let plan = optimize(&p, &opts).unwrap().plan;
            assert_eq!(plan.kernels.len(), 1, "{}", p.source);
            assert_eq!(plan.kernels[0].template, t, "{}", p.source);
            assert!(plan.total.bytes >= 256 << 20, "{}", p.source);
        }
    }

    #[test]
    fn attention_programs_plan_as_the_kernels_they_measure() {
        let p = DeviceProfile::load("h100").unwrap();
        let (_, _, plan, sources) = attention_forward_plan(&p).unwrap();
        assert!(plan.kernels[0].flops >= 4 * 8 * 16 * 2048 * 2048 * 64);
        assert!(sources[0].launch.sm90a.is_some());
        let BackwardPlan { plan, backward, forward, .. } = attention_backward_plan(&p, true, DType::Bf16).unwrap();
        assert_eq!(backward.len(), 1);
        assert!(backward.iter().chain(&forward).all(|&id| plan.kernels[id].id == id));
        assert!(forward.is_some());
        // The planner does not pick the two-kernel form: asking for it is an error, not a
        // measurement of something else.
        assert!(attention_backward_plan(&p, false, DType::Bf16).is_err());
        // And so does f32 (the CUDA-core kernels).
        let BackwardPlan { plan, backward, forward, .. } = attention_backward_plan(&p, true, DType::F32).unwrap();
        assert_eq!(backward.len(), 1);
        assert!(forward.is_some_and(|f| plan.kernels[f].ops.contains(&"attention_lse".to_string())));
    }

    #[test]
    fn the_cublaslt_call_program_renders_as_one_call() {
        let p = DeviceProfile::load("h100").unwrap();
        let (_, _, _, sources) = cublaslt_call_plan(&p).unwrap();
        assert!(sources[0].cublaslt.is_some());
    }

    #[test]
    fn the_cublaslt_skinny_program_renders_as_one_skinny_call() {
        let p = DeviceProfile::load("h100").unwrap();
        let (_, _, plan, sources) = cublaslt_skinny_plan(&p).unwrap();
        assert_eq!(plan.kernels[0].implementation, Some(GemmImpl::Cublaslt));
        let call = sources[0].cublaslt.as_ref().unwrap();
        assert_eq!((call.calls(), call.m.min(call.n), call.m.max(call.n)), (1, 4, 131_072));
    }

    #[test]
    fn the_cublaslt_tile_program_renders_as_one_call_over_its_batch() {
        let p = DeviceProfile::load("h100").unwrap();
        let (_, _, plan, sources) = cublaslt_tile_plan(&p).unwrap();
        assert_eq!(plan.kernels[0].implementation, Some(GemmImpl::Cublaslt));
        assert_eq!(sources[0].cublaslt.as_ref().map(|c| c.calls()), Some(1));
    }

    #[test]
    fn dates() {
        assert_eq!(today().len(), 10);
    }
}
