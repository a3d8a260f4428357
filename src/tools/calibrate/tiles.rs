//! Step times of the tiled kernels, measured: the generated gemm kernel's per tile (`tiles` on
//! f32 operands, `tiles_16bit` on 16-bit operands off the tensor cores, `tiles_mma` on them) and
//! the attention template's f32 path (`64x64`: 64 query rows a block, 64-key tiles, each thread
//! a register tile of 4 rows by 8 keys; its row epilogue is the fixed time of a wave of blocks:
//! the query tile's loads, the first key tile's latency and the output's writes).
//!
//! For every tile key codegen can choose, single-product programs of growing reduction depth K
//! run in two forms: about one block per SM (*lone*: each block alone on its SM, bound by the
//! step's latency) and about eight blocks per SM (*shared*: bound by the SM's throughput); the
//! tiles a row epilogue takes also run the product followed by a row softmax. One least-squares
//! fit per tile then takes the cost model's own form (`DeviceProfile::tile_us` after the launch
//! overhead, which the model adds to every kernel):
//!
//! ```text
//! time = launch overhead + K x lone step                               (lone form)
//! time = launch overhead + K x (blocks / SMs) x shared step            (shared form)
//!        + ceil(blocks / SMs) x row epilogue                           (with a row softmax)
//! ```
//!
//! each probe's residual taken relative to its time, so that short and long probes count alike.
//! (A fit with a free intercept in place of the launch overhead finds the kernels' real fixed
//! time, several microseconds more for some tiles; with it the model, which adds only the launch
//! overhead, predicted the H100's probes about twice as far off: 7.8% against 3.4% on average,
//! benches/results/2026-11-22-h100-9428d28-calibrate. Its intercept is still reported.)
//!
//! Invariant: a probe is measured only when it plans as the one kernel it is meant to measure
//! (template, implementation, tile, tensor-core path, row epilogue, block count); anything else
//! is an error naming the probe, never a figure for another kernel.

use std::collections::BTreeMap;

use crate::codegen::gemm::{kernel_tile, reduces, TALL_BM, TALL_MAX_N, TALL_MIN_BLOCKS};
use crate::cost::profile::{DeviceProfile, TileRate};
use crate::error::{Error, Result};
use crate::ir::program::Program;
use crate::ir::types::{DType, TensorType};
use crate::plan::{FusionPlan, GemmImpl, Template};

/// Reduction depths of the lone and the shared probes.
pub const LONE_K: [usize; 3] = [512, 1024, 2048];
pub const SHARED_K: [usize; 3] = [128, 256, 512];
/// Blocks per SM of the shared probes.
const SHARED_PER_SM: usize = 8;
/// Reduction depth of the block probes: 2 (1 is an outer product, no gemm), so that what a
/// block takes is its fixed time (its setup, one staged slice's loads and the epilogue's walk
/// over its tile), whatever its steps (two on CUDA cores, the tensor cores' 16:
/// `GemmTiles::steps`). Probes 16 deep left the fixed time to the step times: a batch of
/// 32,768 products 2 deep in the f32 128 x 64 tile ran 143 us on the H100, priced 85 us with
/// them.
pub const BLOCK_K: usize = 2;
/// Blocks per SM of the block probes (fewer where the tile is taken only with fewer blocks).
const BLOCK_PER_SM: [usize; 2] = [32, 64];
/// Sequence lengths of the f32 attention probes (head size [`ATTENTION_D`]; K = keys x head /
/// 2, `codegen::attention::f32_steps`). 128 keys, the shortest, is the size of the small
/// attentions of the examples (composites).
pub const ATTENTION_S: [usize; 4] = [128, 256, 512, 1024];
const ATTENTION_D: usize = 64;

/// Which step times a probe measures (which map of the profile its fit goes to).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Family {
    /// The generated gemm kernel on f32 operands (`tiles`).
    F32,
    /// On bf16 operands, on CUDA cores (`tiles_16bit`; strict numerics, or a tile under 64
    /// rows or with a row epilogue).
    Sixteen,
    /// On bf16 operands, on the tensor cores (`tiles_mma`).
    Mma,
    /// The attention template's f32 path (`attention.tiles`).
    AttentionF32,
}

impl Family {
    pub const ALL: [Family; 4] = [Family::F32, Family::Sixteen, Family::Mma, Family::AttentionF32];

    pub fn name(self) -> &'static str {
        match self {
            Family::F32 => "gemm f32",
            Family::Sixteen => "gemm bf16",
            Family::Mma => "gemm mma",
            Family::AttentionF32 => "attention f32",
        }
    }

    /// The profile map its figures go to.
    pub fn map(self) -> &'static str {
        match self {
            Family::F32 => "gemm.generated.tiles",
            Family::Sixteen => "gemm.generated.tiles_16bit",
            Family::Mma => "gemm.generated.tiles_mma",
            Family::AttentionF32 => "attention.tiles",
        }
    }

    fn dtype(self) -> DType {
        match self {
            Family::F32 | Family::AttentionF32 => DType::F32,
            Family::Sixteen | Family::Mma => DType::Bf16,
        }
    }

    fn tag(self) -> &'static str {
        match self {
            Family::F32 => "f32",
            Family::Sixteen => "bf16",
            Family::Mma => "mma",
            Family::AttentionF32 => "attention-f32",
        }
    }

    /// The tile keys of the family that codegen can choose (`codegen::gemm::tile`,
    /// `uses_mma`; the attention f32 path's one block shape).
    pub fn keys(self) -> Vec<(usize, usize)> {
        let tall = [(TALL_BM, 16), (TALL_BM, 32), (TALL_BM, 64)];
        match self {
            // The elementwise tiles, then (f32) the CUDA-core row tiles: a 16-bit row epilogue
            // runs on the tensor cores, or under strict numerics in f32's row tile.
            Family::F32 | Family::Sixteen => {
                let mut v = vec![(16, 16), (8, 32), (8, 64), (8, 128), (64, 128)];
                v.extend(tall);
                if self == Family::F32 {
                    v.extend(ROW_TILES);
                }
                v
            }
            // The elementwise tiles, then the row tiles (`codegen::gemm::kernel_tile`).
            Family::Mma => {
                let mut v = vec![(64, 128)];
                v.extend(tall);
                v.extend(MMA_ROW_TILES);
                v
            }
            Family::AttentionF32 => {
                vec![crate::codegen::caps::ATTENTION_F32_BLOCK]
            }
        }
    }
}

/// Lone (about one block per SM), shared (about eight), or block: one slice deep over tens of
/// blocks per SM, timing each block's fixed time (tiles of elementwise epilogues only).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Form {
    Lone,
    Shared,
    Block(usize),
}

impl Form {
    pub fn name(self) -> String {
        match self {
            Form::Lone => "lone".into(),
            Form::Shared => "shared".into(),
            Form::Block(per_sm) => format!("block{per_sm}"),
        }
    }

    /// Blocks a probe of this form aims at on `sms` SMs (a block probe sizes its own batch).
    fn target_blocks(self, sms: usize) -> usize {
        match self {
            Form::Lone => sms,
            Form::Shared => SHARED_PER_SM * sms,
            Form::Block(per_sm) => per_sm * sms,
        }
    }
}

/// One program whose single kernel is timed.
#[derive(Clone, Debug)]
pub struct Probe {
    pub family: Family,
    pub bm: usize,
    pub bn: usize,
    pub form: Form,
    /// Whether the product is followed by a row softmax (the row epilogue).
    pub rows: bool,
    /// Reduction steps per block as the cost model counts them (K in whole slices of the
    /// tile, `cost::profile::slice_steps`; keys x head / 2 for attention).
    pub steps: usize,
    /// The product's depth K (the attention probe's keys x head).
    pub depth: usize,
    pub blocks: usize,
    /// `M x K x N` (gemm) or `batch x S x D` (attention).
    pub shape: String,
    /// Planned under strict numerics (the CUDA-core mainloop of 16-bit tiles of 64 or more
    /// rows is taken only there).
    pub strict: bool,
    pub program: Program,
}

impl Probe {
    pub fn key(&self) -> String {
        format!("{}x{}", self.bm, self.bn)
    }
}

/// The tensor-core row tiles: 32 rows of the padded row, 64 at 16 columns.
const MMA_ROW_TILES: [(usize, usize); 5] = [(64, 16), (32, 32), (32, 64), (32, 128), (32, 256)];

/// The CUDA-core row tiles (`codegen::gemm::tile`): 32 rows of the padded row, 64 at 16 columns.
const ROW_TILES: [(usize, usize); 5] = [(64, 16), (32, 32), (32, 64), (32, 128), (32, 256)];

/// Whether a key of `family` is a tile only a row epilogue takes.
fn row_tile(family: Family, bm: usize, bn: usize) -> bool {
    match family {
        Family::Mma => MMA_ROW_TILES.contains(&(bm, bn)),
        Family::F32 => ROW_TILES.contains(&(bm, bn)),
        _ => false,
    }
}

/// Whether a key of `family` is timed by block probes: a tile of an elementwise epilogue that
/// products take with many blocks (the tall tiles, and the tiles 128 wide).
fn block_tile(family: Family, bm: usize, bn: usize) -> bool {
    family != Family::AttentionF32 && !row_tile(family, bm, bn) && (bm == TALL_BM || bn >= 128)
}

/// Every probe for a device of `sms` SMs, in family and key order.
pub fn probes(sms: usize) -> Result<Vec<Probe>> {
    let mut out = Vec::new();
    for family in Family::ALL {
        for (bm, bn) in family.keys() {
            if family == Family::AttentionF32 {
                for form in [Form::Lone, Form::Shared] {
                    for s in ATTENTION_S {
                        out.push(attention_probe(sms, form, s)?);
                    }
                }
                continue;
            }
            // The row tiles run with a row epilogue, the others without.
            let only_rows = row_tile(family, bm, bn);
            for form in [Form::Lone, Form::Shared] {
                let ks = if form == Form::Lone { LONE_K } else { SHARED_K };
                for k in ks {
                    out.push(gemm_probe(family, bm, bn, form, only_rows, k, sms)?);
                }
            }
            // A row tile's fixed time per wave is its row epilogue; the narrow tiles of fewer
            // rows than the tall one are taken only with few blocks.
            if block_tile(family, bm, bn) {
                // (On the tensor cores, outside strict numerics, a product 16 deep or less and at
                // most 16 wide plans as rows: 17 deep, one slice of 32 steps.)
                let k = if family == Family::Mma { 17 } else { BLOCK_K };
                for per_sm in BLOCK_PER_SM {
                    out.push(gemm_probe(family, bm, bn, Form::Block(per_sm), false, k, sms)?);
                }
            }
        }
    }
    Ok(out)
}

/// The product shape (M, N) for a tile, a lone or shared form and an epilogue.
fn gemm_shape(bm: usize, bn: usize, form: Form, rows: bool, sms: usize) -> (usize, usize) {
    let target = form.target_blocks(sms);
    if rows && bm >= 32 {
        // A tensor-core row tile: one tile column, the row padded to bn.
        return (bm * target, bn);
    }
    if bm == TALL_BM {
        // The tall tile is taken only with at least TALL_MIN_BLOCKS of them.
        let mb = target.max(TALL_MIN_BLOCKS);
        return (TALL_BM * mb, bn);
    }
    if bm == 64 {
        let n = if form == Form::Lone { 2 * bn } else { 8 * bn };
        return (64 * (target / (n / bn)).max(1), n);
    }
    // Without a row epilogue a narrow product with enough rows would take the tall tile.
    let cap = if rows || bn > TALL_MAX_N { usize::MAX } else { ((TALL_MIN_BLOCKS - 1) * TALL_BM) / bm };
    (bm * target.min(cap), bn)
}

/// Rows of each matrix of a block probe's batch: a block's fixed time, not its output's bytes
/// (a tile of 128 x 64 f32 outputs, all of them real, is 32 KiB a block to write).
const BLOCK_ROWS: usize = 2;

fn gemm_probe(family: Family, bm: usize, bn: usize, form: Form, rows: bool, k: usize, sms: usize) -> Result<Probe> {
    // A block probe: a batch of BLOCK_ROWS-row products, each one tile row (two tiles wide
    // at 64 x 128, whose tile a product only wider than 128 takes).
    let (batch, (m, n)) = match form {
        Form::Block(_) => {
            let n = if bm == 64 { 2 * bn } else { bn };
            (form.target_blocks(sms) / n.div_ceil(bn), (BLOCK_ROWS, n))
        }
        _ => (1, gemm_shape(bm, bn, form, rows, sms)),
    };
    let dt = family.dtype();
    let strict = !rows && family != Family::Mma;
    // The steps the model counts for the tile codegen takes (a product shallower than a slice
    // takes its own depth, on the tensor cores rounded up to 16: the 17-deep block probe's 32).
    let dom: Vec<usize> = if batch > 1 { vec![batch, m, n] } else { vec![m, n] };
    let (t, mma) = kernel_tile(&dom, k, rows, dt, dt, strict);
    let steps = crate::cost::profile::slice_steps(t.bk, mma, k);
    let name =
        format!("calibrate-tile-{}-{bm}x{bn}-{}{}-k{k}", family.tag(), form.name(), if rows { "-softmax" } else { "" });
    let body = if rows { "(softmax (@ a b) -1)" } else { "(@ a b)" };
    let a = if batch > 1 { vec![batch, m, k] } else { vec![m, k] };
    let program = Program::from_sexprs(
        &name,
        &[("a", TensorType::new(dt, a)), ("b", TensorType::new(dt, vec![k, n]))],
        &[("y", body)],
    )
    .map_err(Error::Invalid)?;
    Ok(Probe {
        family,
        bm,
        bn,
        form,
        rows,
        steps,
        depth: k,
        blocks: batch * m.div_ceil(bm) * n.div_ceil(bn),
        shape: if batch > 1 {
            format!("{batch}x{m}x{k}x{n}")
        } else {
            format!("{m}x{k}x{n}{}", if rows { " softmax" } else { "" })
        },
        strict,
        program,
    })
}

fn attention_probe(sms: usize, form: Form, s: usize) -> Result<Probe> {
    let (bm, bn) = crate::codegen::caps::ATTENTION_F32_BLOCK;
    let target = form.target_blocks(sms);
    let per = s.div_ceil(bm);
    let batch = (target / per).max(1);
    let name = format!("calibrate-tile-attention-f32-{}-s{s}", form.name());
    let t = TensorType::new(DType::F32, vec![batch, s, ATTENTION_D]);
    let program = Program::from_sexprs(
        &name,
        &[("q", t.clone()), ("k", t.clone()), ("v", t)],
        &[("y", "(attention q k v 0.125 0)")],
    )
    .map_err(Error::Invalid)?;
    Ok(Probe {
        family: Family::AttentionF32,
        bm,
        bn,
        form,
        rows: true,
        steps: crate::codegen::attention::f32_steps(s, ATTENTION_D),
        depth: s * ATTENTION_D,
        blocks: batch * per,
        shape: format!("{batch}x{s}x{ATTENTION_D}"),
        strict: false,
        program,
    })
}

/// The profile a probe is planned with: cuBLASLt priced out (the generated kernel is measured)
/// and the probe's own tile free (so that a product and its row softmax fuse, and the f32
/// attention kernel is chosen over the decomposed form, whatever the profile says of the figure
/// being measured). Only the plan's choice of kernels depends on it; the kernel codegen renders
/// for the plan does not.
pub fn probe_profile(p: &DeviceProfile, probe: &Probe) -> DeviceProfile {
    let mut q = p.clone();
    let free = TileRate { lone_ns_per_k: 1e-6, sm_ns_per_k: 1e-6, row_epilogue_us: 0.0, block_us: 0.0 };
    if probe.family == Family::AttentionF32 {
        if let Some(a) = q.templates.get_mut(Template::Attention.name()) {
            a.tiles.insert(probe.key(), free);
        }
        return q;
    }
    if let Some(g) = q.templates.get_mut(Template::Gemm.name()) {
        let own = crate::cost::profile::TemplateRates { implementations: BTreeMap::new(), ..g.clone() };
        let lt = g.implementations.entry(GemmImpl::Cublaslt.name().into()).or_insert_with(|| own.clone());
        lt.call_overhead_us = Some(1e9);
        let generated = g.implementations.entry(GemmImpl::Generated.name().into()).or_insert(own);
        let map = match probe.family {
            Family::F32 => &mut generated.tiles,
            Family::Sixteen => &mut generated.tiles_16bit,
            _ => &mut generated.tiles_mma,
        };
        map.insert(probe.key(), free);
    }
    q
}

/// Whether `plan` is the one kernel `probe` is meant to measure; the difference otherwise.
pub fn check(plan: &FusionPlan, probe: &Probe) -> Result<()> {
    let fail = |what: String| {
        Err(Error::Invalid(format!(
            "calibration program {} ({} {} tile {}) did not plan as the kernel it measures: {what}",
            probe.program.source,
            probe.family.name(),
            probe.form.name(),
            probe.key()
        )))
    };
    let [k] = plan.kernels.as_slice() else {
        return fail(format!("{} kernels", plan.kernels.len()));
    };
    if probe.family == Family::AttentionF32 {
        if k.template != Template::Attention || k.ops != ["attention"] {
            return fail(format!("a {} kernel of {:?}", k.template.name(), k.ops));
        }
        return Ok(());
    }
    if k.template != Template::Gemm {
        return fail(format!("a {} kernel", k.template.name()));
    }
    if k.implementation != Some(GemmImpl::Generated) {
        return fail("not the generated kernel".into());
    }
    let rows = reduces(k);
    let sixteen = probe.family.dtype();
    let (t, mma) = kernel_tile(&k.domain, probe.depth, rows, sixteen, sixteen, plan.search.strict);
    if (t.bm, t.bn) != (probe.bm, probe.bn)
        || rows != probe.rows
        || mma != (probe.family == Family::Mma)
        || t.splits != 1
    {
        return fail(format!(
            "tile {}x{}{}{}{}",
            t.bm,
            t.bn,
            if rows { " with a row epilogue" } else { "" },
            if mma { " on the tensor cores" } else { "" },
            if t.splits > 1 { format!(" split {} ways", t.splits) } else { String::new() }
        ));
    }
    let rank = k.domain.len();
    let blocks = k.domain[..rank - 2].iter().product::<usize>()
        * k.domain[rank - 2].div_ceil(t.bm)
        * k.domain[rank - 1].div_ceil(t.bn);
    if blocks != probe.blocks {
        return fail(format!("{blocks} blocks, not {}", probe.blocks));
    }
    Ok(())
}

/// One probe's time and what the fit makes of it.
#[derive(Clone, Debug)]
pub struct Measured {
    pub program: String,
    pub form: Form,
    pub rows: bool,
    pub shape: String,
    pub steps: usize,
    pub blocks: usize,
    /// Median microseconds of the kernel.
    pub us: f64,
    /// The fit's time for it.
    pub fit_us: f64,
}

/// One tile's fit.
#[derive(Clone, Debug)]
pub struct TileFit {
    pub family: Family,
    pub key: String,
    /// The fitted rate (the row epilogue 0 where no probe has one).
    pub rate: TileRate,
    /// The intercept a fit with a free intercept finds (the kernels' real fixed time, against
    /// the launch overhead the model takes), in microseconds; a diagnostic, not in the profile.
    pub free_overhead_us: Option<f64>,
    /// Why a figure was not taken as fitted, if one was not.
    pub note: Option<String>,
    pub probes: Vec<Measured>,
}

impl TileFit {
    /// The largest relative distance of a probe's time from the fit.
    pub fn worst(&self) -> f64 {
        self.probes.iter().map(|m| ((m.fit_us - m.us) / m.us).abs()).fold(0.0, f64::max)
    }

    /// The mean relative distance of the probes' times from the fit.
    pub fn mean(&self) -> f64 {
        self.probes.iter().map(|m| ((m.fit_us - m.us) / m.us).abs()).sum::<f64>() / self.probes.len().max(1) as f64
    }
}

/// The least-squares fit of one tile's probes on `sms` SMs with the launch overhead `launch_us`:
/// see the module docs. `None` when the probes do not determine it (fewer probes than unknowns,
/// or a singular system).
pub fn fit(family: Family, key: &str, probes: Vec<Measured>, sms: usize, launch_us: f64) -> Option<TileFit> {
    let sms = sms as f64;
    // Columns: lone step (ns), shared step (ns), row epilogue (us per wave), block (us per
    // block per SM; only where block probes were run: every probe's blocks pay it). The block
    // probes' steps are the SM's share of theirs.
    let blocks = probes.iter().any(|m| matches!(m.form, Form::Block(_)));
    let row = |m: &Measured| -> [f64; 4] {
        let k = m.steps as f64 * 1e-3;
        let share = m.blocks as f64 / sms;
        [
            if m.form == Form::Lone { k } else { 0.0 },
            if m.form != Form::Lone { k * share } else { 0.0 },
            if m.rows { share.ceil() } else { 0.0 },
            if blocks { share } else { 0.0 },
        ]
    };
    let x: Vec<[f64; 4]> = probes.iter().map(row).collect();
    let used: Vec<usize> = (0..4).filter(|&c| x.iter().any(|r| r[c] != 0.0)).collect();
    // Relative residuals: each row and its target divided by the probe's time.
    let a: Vec<Vec<f64>> = x.iter().zip(&probes).map(|(r, m)| used.iter().map(|&c| r[c] / m.us).collect()).collect();
    let y: Vec<f64> = probes.iter().map(|m| (m.us - launch_us) / m.us).collect();
    let beta = least_squares(&a, &y)?;
    let mut coef = [0.0; 4];
    for (i, &c) in used.iter().enumerate() {
        coef[c] = beta[i];
    }
    // The same with a free intercept, unweighted (the diagnostic).
    let free: Vec<Vec<f64>> =
        x.iter().map(|r| std::iter::once(1.0).chain(used.iter().map(|&c| r[c])).collect()).collect();
    let times: Vec<f64> = probes.iter().map(|m| m.us).collect();
    let free_overhead_us = least_squares(&free, &times).map(|b| b[0]);
    let probes = probes
        .into_iter()
        .zip(&x)
        .map(|(m, r)| Measured { fit_us: launch_us + (0..4).map(|c| r[c] * coef[c]).sum::<f64>(), ..m })
        .collect();
    let mut note = None;
    if coef[2] < 0.0 {
        note = Some(format!("row epilogue fit {:.2} us per wave, taken as 0", coef[2]));
        coef[2] = 0.0;
    }
    if coef[3] < 0.0 {
        note = Some(format!("block fit {:.3} us per block, taken as 0", coef[3]));
        coef[3] = 0.0;
    }
    Some(TileFit {
        family,
        key: key.to_string(),
        rate: TileRate { lone_ns_per_k: coef[0], sm_ns_per_k: coef[1], row_epilogue_us: coef[2], block_us: coef[3] },
        free_overhead_us,
        note,
        probes,
    })
}

/// Ordinary least squares by the normal equations (Gaussian elimination with partial pivoting):
/// the `beta` minimising |a beta - y|. `None` if there are fewer rows than columns or the
/// system is singular.
pub fn least_squares(a: &[Vec<f64>], y: &[f64]) -> Option<Vec<f64>> {
    let n = a.first()?.len();
    if a.len() < n || n == 0 {
        return None;
    }
    let mut m = vec![vec![0.0; n + 1]; n];
    for (r, &t) in a.iter().zip(y) {
        for i in 0..n {
            for j in 0..n {
                m[i][j] += r[i] * r[j];
            }
            m[i][n] += r[i] * t;
        }
    }
    for c in 0..n {
        let p = (c..n).max_by(|&i, &j| m[i][c].abs().total_cmp(&m[j][c].abs()))?;
        let scale = (0..n).map(|i| m[i][c].abs()).fold(0.0, f64::max);
        if m[p][c].abs() <= 1e-12 * scale.max(1e-300) {
            return None;
        }
        m.swap(c, p);
        let pivot = m[c].clone();
        for (i, row) in m.iter_mut().enumerate() {
            if i != c {
                let f = row[c] / pivot[c];
                for (x, p) in row.iter_mut().zip(&pivot).skip(c) {
                    *x -= f * p;
                }
            }
        }
    }
    Some((0..n).map(|i| m[i][n] / m[i][i]).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::search::optimize::{optimize, OptimizeOptions};

    #[test]
    fn every_probe_plans_as_its_one_kernel_and_tile() {
        let base = DeviceProfile::load("h100").unwrap();
        let probes = probes(132).unwrap();
        // Every tile key of every family is probed, each in both forms.
        for family in Family::ALL {
            for (bm, bn) in family.keys() {
                let of: Vec<&Probe> =
                    probes.iter().filter(|p| p.family == family && (p.bm, p.bn) == (bm, bn)).collect();
                assert!(of.iter().any(|p| p.form == Form::Lone), "{family:?} {bm}x{bn}");
                assert!(of.iter().any(|p| p.form == Form::Shared), "{family:?} {bm}x{bn}");
                // Tiles of elementwise epilogues time their blocks' fixed time too.
                let blocks = of.iter().any(|p| matches!(p.form, Form::Block(_)));
                assert_eq!(blocks, block_tile(family, bm, bn), "{family:?} {bm}x{bn}");
            }
        }
        for p in &probes {
            let opts = OptimizeOptions { strict: p.strict, ..OptimizeOptions::new(probe_profile(&base, p)) };
            let plan = optimize(&p.program, &opts).unwrap().plan;
            check(&plan, p).unwrap();
            match p.form {
                Form::Lone => assert!(p.blocks <= 132, "{}: {} blocks", p.program.source, p.blocks),
                Form::Shared => assert!(p.blocks >= 7 * 132, "{}: {} blocks", p.program.source, p.blocks),
                Form::Block(n) => assert!(p.blocks == n * 132 && p.steps <= 32, "{}", p.program.source),
            }
        }
    }

    #[test]
    fn a_probe_planned_as_another_kernel_is_refused() {
        let base = DeviceProfile::load("h100").unwrap();
        let probes = probes(132).unwrap();
        // The 64x128 bf16 CUDA-core probe planned outside strict numerics takes the tensor cores.
        let p = probes.iter().find(|p| p.family == Family::Sixteen && p.bm == 64).unwrap();
        let plan = optimize(&p.program, &OptimizeOptions::new(probe_profile(&base, p))).unwrap().plan;
        let e = check(&plan, p).unwrap_err().to_string();
        assert!(e.contains("tensor cores"), "{e}");
        // A product left to the base profile takes cuBLASLt.
        let p = probes.iter().find(|p| p.family == Family::Mma && p.bm == 64).unwrap();
        let plan = optimize(&p.program, &OptimizeOptions::new(base.clone())).unwrap().plan;
        let e = check(&plan, p).unwrap_err().to_string();
        assert!(e.contains("not the generated kernel"), "{e}");
    }

    /// One probe of every tile compiles (NVRTC, sm_90; skipped where NVRTC is missing), so that
    /// a calibration run on the GPU does not stop at a kernel that cannot compile.
    #[test]
    fn one_probe_of_every_tile_compiles() {
        if let Err(why) = crate::runtime::nvrtc::available() {
            assert!(std::env::var("CI").as_deref() != Ok("true"), "CI=true but NVRTC is unusable: {why}");
            eprintln!("skipped: NVRTC is not available ({why})");
            return;
        }
        let base = DeviceProfile::load("h100").unwrap();
        let mut seen = std::collections::BTreeSet::new();
        let t0 = std::time::Instant::now();
        for p in probes(132).unwrap() {
            if !seen.insert((p.family, p.key(), p.rows)) {
                continue;
            }
            let opts = OptimizeOptions { strict: p.strict, ..OptimizeOptions::new(probe_profile(&base, &p)) };
            let plan = optimize(&p.program, &opts).unwrap().plan;
            for s in crate::codegen::codegen_plan(&plan).unwrap() {
                crate::runtime::nvrtc::compile(&s.source, &s.file, crate::runtime::nvrtc::DEFAULT_ARCH, &[])
                    .unwrap_or_else(|e| panic!("{}: {e}", p.program.source));
            }
        }
        eprintln!("compiled {} probes in {:.1} s", seen.len(), t0.elapsed().as_secs_f64());
    }

    /// Times the model gives each probe of a tile from known figures (plus a fixed overhead).
    fn synthetic(family: Family, key: (usize, usize), rate: &TileRate, overhead: f64, noise: f64) -> Vec<Measured> {
        probes(132)
            .unwrap()
            .into_iter()
            .filter(|p| p.family == family && (p.bm, p.bn) == key)
            .enumerate()
            .map(|(i, p)| {
                let share = p.blocks as f64 / 132.0;
                let step = match p.form {
                    Form::Lone => rate.lone_ns_per_k,
                    Form::Shared | Form::Block(_) => share * rate.sm_ns_per_k,
                };
                let epi = if p.rows {
                    share.ceil() * rate.row_epilogue_us
                } else if block_tile(family, key.0, key.1) {
                    share * rate.block_us
                } else {
                    0.0
                };
                let us = (overhead + 1e-3 * p.steps as f64 * step + epi)
                    * (1.0 + noise * if i % 2 == 0 { 1.0 } else { -1.0 });
                Measured {
                    program: p.program.source.clone(),
                    form: p.form,
                    rows: p.rows,
                    shape: p.shape.clone(),
                    steps: p.steps,
                    blocks: p.blocks,
                    us,
                    fit_us: f64::NAN,
                }
            })
            .collect()
    }

    #[test]
    fn the_fit_recovers_known_step_times() {
        let rate = TileRate { lone_ns_per_k: 27.9, sm_ns_per_k: 19.5, row_epilogue_us: 2.1, block_us: 0.35 };
        for (family, key) in
            [(Family::F32, (32, 64)), (Family::F32, (32, 256)), (Family::Mma, (32, 128)), (Family::F32, (64, 16))]
        {
            let f = fit(family, "k", synthetic(family, key, &rate, 4.2, 0.0), 132, 4.2).unwrap();
            assert!((f.rate.lone_ns_per_k - 27.9).abs() < 1e-6, "{key:?} {f:?}");
            assert!((f.rate.sm_ns_per_k - 19.5).abs() < 1e-6, "{key:?} {f:?}");
            assert!((f.rate.row_epilogue_us - 2.1).abs() < 1e-6, "{key:?} {f:?}");
            assert!((f.free_overhead_us.unwrap() - 4.2).abs() < 1e-6, "{key:?} {f:?}");
            assert!(f.worst() < 1e-9);
        }
        // A row tile fits no block time (its fixed time per wave is the row epilogue).
        let f = fit(Family::F32, "k", synthetic(Family::F32, (32, 64), &rate, 4.2, 0.0), 132, 4.2).unwrap();
        assert_eq!(f.rate.block_us, 0.0);
        // A tile no row epilogue takes fits no epilogue, and its blocks' fixed time.
        for (family, key) in [(Family::Mma, (128, 32)), (Family::F32, (8, 128)), (Family::F32, (64, 128))] {
            let f = fit(family, "k", synthetic(family, key, &rate, 4.2, 0.0), 132, 4.2).unwrap();
            assert!((f.rate.lone_ns_per_k - 27.9).abs() < 1e-6 && (f.rate.sm_ns_per_k - 19.5).abs() < 1e-6);
            assert_eq!(f.rate.row_epilogue_us, 0.0);
            assert!((f.rate.block_us - 0.35).abs() < 1e-6, "{key:?} {f:?}");
            assert!(f.worst() < 1e-9);
        }
        // The f32 attention path: K is keys x head elements / 2.
        let key = Family::AttentionF32.keys()[0];
        let f =
            fit(Family::AttentionF32, "k", synthetic(Family::AttentionF32, key, &rate, 4.2, 0.0), 132, 4.2).unwrap();
        assert!((f.rate.lone_ns_per_k - 27.9).abs() < 1e-6 && (f.rate.sm_ns_per_k - 19.5).abs() < 1e-6);
        // Its fixed time per wave of blocks (the query loads and the merge of the parts) fits as
        // the row epilogue.
        assert!((f.rate.row_epilogue_us - 2.1).abs() < 1e-6, "{f:?}");
        // With 2% noise the steps stay within a few percent, and the residuals show it.
        let f = fit(Family::F32, "k", synthetic(Family::F32, (32, 64), &rate, 4.2, 0.02), 132, 4.2).unwrap();
        assert!((f.rate.lone_ns_per_k / 27.9 - 1.0).abs() < 0.05, "{f:?}");
        assert!((f.rate.sm_ns_per_k / 19.5 - 1.0).abs() < 0.05, "{f:?}");
        assert!(f.worst() > 0.005 && f.worst() < 0.05, "{}", f.worst());
        assert!(f.mean() <= f.worst());
        // Kernels with more fixed time than the launch: the model's form (launch + K x step)
        // takes a steeper step, so that its relative errors stay small at both ends; the free
        // fit reports the fixed time.
        let f = fit(Family::F32, "k", synthetic(Family::F32, (8, 64), &rate, 14.2, 0.0), 132, 4.2).unwrap();
        assert!(f.rate.lone_ns_per_k > 27.9 && f.rate.sm_ns_per_k > 19.5, "{f:?}");
        assert!((f.free_overhead_us.unwrap() - 14.2).abs() < 1e-6, "{f:?}");
        // A negative row epilogue is taken as 0, and said.
        let flat = TileRate { row_epilogue_us: -1.0, ..rate };
        let f = fit(Family::F32, "k", synthetic(Family::F32, (32, 64), &flat, 4.2, 0.0), 132, 4.2).unwrap();
        assert_eq!(f.rate.row_epilogue_us, 0.0);
        assert!(f.note.as_deref().is_some_and(|n| n.contains("taken as 0")), "{f:?}");
    }

    /// The H100's f32 8x64 probes (benches/results/2026-11-22-h100-9428d28-calibrate,
    /// calibrate.log; launch overhead 2.84 us) fit as numpy's weighted least squares fits them.
    #[test]
    fn the_fit_of_measured_probes_matches_an_independent_one() {
        let m = |form, rows, steps, blocks, us| Measured {
            program: String::new(),
            form,
            rows,
            shape: String::new(),
            steps,
            blocks,
            us,
            fit_us: f64::NAN,
        };
        let probes = vec![
            m(Form::Lone, false, 512, 132, 16.0),
            m(Form::Lone, false, 1024, 132, 27.8),
            m(Form::Lone, false, 2048, 132, 51.7),
            m(Form::Shared, false, 128, 1056, 22.9),
            m(Form::Shared, false, 256, 1056, 41.5),
            m(Form::Shared, false, 512, 1056, 76.5),
            m(Form::Shared, true, 256, 1056, 51.0),
        ];
        let f = fit(Family::F32, "8x64", probes, 132, 2.84).unwrap();
        // numpy.linalg.lstsq of the rows and targets divided by each time: 24.514, 18.721, 1.227.
        assert!((f.rate.lone_ns_per_k - 24.514).abs() < 1e-3, "{f:?}");
        assert!((f.rate.sm_ns_per_k - 18.721).abs() < 1e-3, "{f:?}");
        assert!((f.rate.row_epilogue_us - 1.227).abs() < 1e-3, "{f:?}");
    }

    #[test]
    fn least_squares_solves_and_refuses_what_it_cannot() {
        // y = 1 + 2x, exactly.
        let a: Vec<Vec<f64>> = (0..4).map(|x| vec![1.0, f64::from(x)]).collect();
        let y: Vec<f64> = (0..4).map(|x| 1.0 + 2.0 * f64::from(x)).collect();
        let b = least_squares(&a, &y).unwrap();
        assert!((b[0] - 1.0).abs() < 1e-12 && (b[1] - 2.0).abs() < 1e-12);
        // Fewer rows than unknowns, and a singular system.
        assert!(least_squares(&a[..1], &y[..1]).is_none());
        let same: Vec<Vec<f64>> = (0..4).map(|_| vec![1.0, 3.0]).collect();
        assert!(least_squares(&same, &y).is_none());
    }
}
