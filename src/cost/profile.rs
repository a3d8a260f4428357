//! `DeviceProfile`: the measured numbers of one GPU that the cost model reads.
//!
//! Profiles are data (`profiles/*.json`), written by `eqfuse calibrate` on the GPU and committed;
//! the built-in `h100` and `h200` are embedded. Invariant: the planner reads machine numbers only
//! from a profile, never from constants in code.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::ir::types::DType;
use crate::plan::{GemmImpl, Template};

/// The `schema` a profile file declares.
pub const PROFILE_SCHEMA: &str = "eqfuse.profile/1";

/// Rates of one kernel template.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TemplateRates {
    /// Achieved bandwidth as a share of copy bandwidth.
    pub bandwidth_efficiency: f64,
    /// Arithmetic rate in f32, in TFLOP/s.
    pub flops_f32_tflops: f64,
    /// Arithmetic rate for bf16/f16 operands (tensor cores), in TFLOP/s, where it differs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flops_bf16_tflops: Option<f64>,
    /// Rates of each implementation of the template where it has several (gemm: `cublaslt`
    /// and `generated`), measured by `eqfuse calibrate`; the template's own rates otherwise.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub implementations: BTreeMap<String, TemplateRates>,
    /// Time each dependent reduction stage adds to a kernel of this template (a block must
    /// finish one stage's reduction before the next reads it), in microseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stage_latency_us: Option<f64>,
    /// Fixed time of one call in place of the launch overhead (a library call such as
    /// cuBLASLt's), in microseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub call_overhead_us: Option<f64>,
    /// Device-wide time of one output tile of 64 x 64 (`LT_TILE`) elements of each matrix
    /// of a call, in nanoseconds (cuBLASLt): a call over a batch of small matrices runs at
    /// least a block per tile of every matrix, each with its own prologue, loads and epilogue,
    /// however few elements the tile holds, so such a call takes at least its tiles times this
    /// (a batch of a million 1 x 13 by 13 x 1 products: 4.1 ms, where its bytes take 20 us).
    /// Absent: not priced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tile_ns: Option<f64>,
    /// The share of copy bandwidth a cuBLASLt call moves its bytes at where its matrices have
    /// at most `SKINNY_OUTPUT` (16) output rows or columns (a matrix times a few vectors, such as a
    /// classifier of few classes or a low-rank adapter): the library runs such products well
    /// below the bandwidth of its other memory-bound calls (f32 on an H200: 400 to 2600 GB/s,
    /// `benches/results/2026-11-28-h200-session19`). It bounds the call's whole traffic.
    /// Absent: priced as other calls.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skinny_share: Option<f64>,
    /// Device-wide time of one row of a row kernel, in nanoseconds (rowreduce): each iteration
    /// of a block's loop over its rows loads them, reduces across the row's threads and stores,
    /// one dependent round trip, so rows of a few elements (a thread's one load each) cost a
    /// time a row beyond their bytes (a mean over 4M rows of 3 f32 on an H100: 62 us, its
    /// bytes 24 us). Added to the row kernel's time; rows of a few thousand elements make it
    /// negligible. Absent: not priced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub row_ns: Option<f64>,
    /// Time a split-K product of the generated gemm adds past its steps and the parts' reads,
    /// in microseconds: the last block of a tile learns it is last (a fence and a counter) and
    /// only then fetches the parts, a chain of dependent round trips no bandwidth hides.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub split_latency_us: Option<f64>,
    /// The generated gemm kernel's measured time per step of its reduction axis, by tile
    /// (`"BMxBN"`): see `TileRate`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub tiles: BTreeMap<String, TileRate>,
    /// The same, measured on 16-bit (bf16) operands and used for bf16 and f16 operands where
    /// the tile is listed (16-bit loads make the generated kernel's steps slower); other tiles
    /// of 16-bit products take `tiles`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub tiles_16bit: BTreeMap<String, TileRate>,
    /// The same for the tensor-core mainloop (16-bit operands outside strict numerics), by tile:
    /// `BMxBN` where both operands are staged in 16-byte chunks, `BMxBN/e` where one is staged
    /// element by element (a product width or reduction depth not a multiple of 8); a tile
    /// without a rate here is timed as its products at the implementation's bf16 rate.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub tiles_mma: BTreeMap<String, TileRate>,
    /// Arithmetic rates measured at several product sizes, by operand dtype (`"f32"`, `"bf16"`):
    /// points `[GFLOP of one call, TFLOP/s]` in increasing size (a library's rate falls on
    /// products too small to fill the GPU). A call's rate is interpolated in log-size between
    /// the points, and held at the end points beyond them; `flops_*_tflops` where absent.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub rate_by_size: BTreeMap<String, Vec<[f64; 2]>>,
    /// Share of `bandwidth_efficiency` a kernel reaches when each lane accesses fewer than 16
    /// bytes at a time, by bytes per access (`"1"`, `"2"`, `"4"`, `"8"`: lanes x the widest
    /// element along the last axis, `caps::vector_width`; an odd last extent of f32 is read 4
    /// bytes a lane). It bounds the kernel's whole traffic, L2 hits included (the loads a warp
    /// can have in flight, not device memory, limit it). Absent: every access is priced as 16
    /// bytes.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub narrow_access_share: BTreeMap<String, f64>,
}

/// How fast one tile shape of the generated gemm kernel runs: each block walks the reduction
/// axis one step at a time (staging a BM-row slice of A and a BN-column slice of B), so its time
/// is `K` times a step time. A block alone on its SM is bound by latency (`lone_ns_per_k`);
/// blocks sharing the SMs are bound by the SM's throughput (`sm_ns_per_k` per block).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TileRate {
    /// Nanoseconds per reduction step of one block alone on its SM.
    pub lone_ns_per_k: f64,
    /// Nanoseconds per reduction step per block when several blocks share each SM.
    pub sm_ns_per_k: f64,
    /// Microseconds a row-reducing epilogue (softmax of the tile's rows) adds per wave of blocks.
    #[serde(default)]
    pub row_epilogue_us: f64,
    /// Microseconds each block of an elementwise epilogue takes beyond its steps (its setup and
    /// the epilogue's walk over the whole tile, whatever part of it the product covers), at the
    /// SM's throughput: `blocks / SMs` of them. What a batch of tiny products costs: the steps
    /// of a product 2 deep are nothing, its 32,768 blocks are not (measured by `eqfuse
    /// calibrate`'s one-slice probes of many blocks; 0 for row tiles, whose fixed time per
    /// wave is the row epilogue).
    #[serde(default)]
    pub block_us: f64,
}

/// One GPU's numbers.
///
/// Invariant: a profile from [`DeviceProfile::parse`] (every file, the built-in ones too) has
/// passed [`DeviceProfile::validate`]: no unknown field, the known schema, every template, and
/// every rate, bandwidth, count and latency positive (latencies non-negative) and finite, so no
/// prediction is infinite or NaN and a single operator always fits a kernel's arguments.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeviceProfile {
    pub schema: String,
    /// Short name shown in plans (`h100`).
    pub name: String,
    /// The device's own name.
    pub device: String,
    /// Where the numbers come from (calibration date and commit, or the datasheet).
    pub source: String,
    /// Device-to-device copy bandwidth, bytes read plus bytes written, in GB/s.
    pub copy_bandwidth_gbs: f64,
    /// A kernel's fixed time in a plan timed kernel by kernel (events recorded around every
    /// launch, as `eqfuse run` and `eqfuse bench` time plans): a small kernel's time, in
    /// microseconds.
    pub launch_overhead_us: f64,
    /// Shared memory one block may use, in bytes.
    pub smem_per_block_bytes: u64,
    pub registers_per_thread: u32,
    /// Most tensors one kernel may take (reads plus writes).
    pub max_kernel_args: usize,
    /// L2 cache size in bytes, read off the device by `eqfuse calibrate` (absent in profiles
    /// calibrated before it was recorded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub l2_bytes: Option<u64>,
    /// Bytes of recently touched tensors that a later kernel finds in L2 (the model's
    /// least-recently-used capacity; less than `l2_bytes` where the cache is partitioned).
    /// Absent: the plan order is not modelled and every read comes from device memory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub l2_reuse_bytes: Option<u64>,
    /// With `l2_reuse_bytes`, the reuse-distance form of the plan-order model
    /// (`search::residency::l2_hits_by_distance`): a line read again after fewer than
    /// `l2_reuse_bytes` of distinct bytes were touched since its last touch hits, one after more
    /// than this many misses, and between the two its chance falls linearly (a set-associative,
    /// partitioned L2 is no exact least-recently-used cache). Absent: the whole-tensor
    /// least-recently-used form of `l2_reuse_bytes` alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub l2_reuse_limit_bytes: Option<u64>,
    /// Written bytes L2 holds before device memory has them: a kernel's writes stay in L2, up
    /// to this many, when it ends, and are written back while later kernels' reads and writes
    /// take their lines, at device-memory bandwidth in those kernels' time (a kernel that only
    /// reads, after one that wrote, pays for them; one after a kernel that only read finds L2
    /// clean). Copy bandwidth and the template efficiencies are measured in the steady state
    /// (L2 as dirty after the kernel as before it). Absent: written bytes cost their writer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub l2_dirty_bytes: Option<u64>,
    /// Bandwidth of reads that hit L2, in GB/s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub l2_bandwidth_gbs: Option<f64>,
    /// Bandwidth, in GB/s, of the 32-byte sectors that L2 serves to the SMs when
    /// each lane of a warp touches a sector of its own (uncoalesced loads; a kernel's whole
    /// traffic counted in sectors, writes included). Absent: `l2_bandwidth_gbs`; both absent (the
    /// h200 profile): sectors are not priced, only their excess fetched from device memory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sector_bandwidth_gbs: Option<f64>,
    /// Streaming multiprocessors (for wave counts of tiled kernels).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sm_count: Option<u32>,
    pub templates: BTreeMap<String, TemplateRates>,
    /// Plans for strict numerics (not part of the file): matrix products take the generated
    /// kernel, whose accumulation order does not depend on the epilogue, never cuBLASLt.
    #[serde(skip)]
    pub strict: bool,
}

const H100: &str = include_str!("../../profiles/h100.json");
const H200: &str = include_str!("../../profiles/h200.json");

impl DeviceProfile {
    /// `h100`, `h200`, or a path to a profile JSON file.
    pub fn load(spec: &str) -> Result<DeviceProfile> {
        match spec {
            "h100" => DeviceProfile::parse("profiles/h100.json", H100),
            "h200" => DeviceProfile::parse("profiles/h200.json", H200),
            path => {
                if !std::path::Path::new(path).exists() && !path.contains(['/', '\\', '.']) {
                    return Err(Error::Usage(format!(
                        "unknown device `{path}`: give h100, h200, or the path of a profile JSON file"
                    )));
                }
                let bytes = crate::files::read_file(path)?;
                let text = String::from_utf8(bytes)
                    .map_err(|_| Error::Invalid(format!("{path}: bad device profile: not UTF-8 text")))?;
                DeviceProfile::parse(path, &text)
            }
        }
    }

    pub fn parse(file: &str, text: &str) -> Result<DeviceProfile> {
        let p: DeviceProfile = serde_json::from_str(text).map_err(|e| {
            Error::input(crate::error::Diagnostic::at(file, text, e.line(), e.column(), {
                let m = e.to_string();
                let at = format!(" at line {} column {}", e.line(), e.column());
                format!("bad device profile: {}", m.strip_suffix(&at).unwrap_or(&m))
            }))
        })?;
        p.validate().map_err(|e| Error::Invalid(format!("{file}: bad device profile: {e}")))?;
        Ok(p)
    }

    /// Checks every field once, on load: `Err` names the field (`templates.gemm.flops_f32_tflops`)
    /// and what is wrong with it.
    pub fn validate(&self) -> std::result::Result<(), String> {
        if self.schema != PROFILE_SCHEMA {
            return Err(format!("schema is `{}`, expected `{PROFILE_SCHEMA}`", self.schema));
        }
        if self.name.trim().is_empty() {
            return Err("name is empty".into());
        }
        positive("copy_bandwidth_gbs", self.copy_bandwidth_gbs)?;
        non_negative("launch_overhead_us", self.launch_overhead_us)?;
        at_least("smem_per_block_bytes", self.smem_per_block_bytes, 1)?;
        at_least("registers_per_thread", u64::from(self.registers_per_thread), 1)?;
        let widest = min_kernel_args();
        if self.max_kernel_args < widest {
            return Err(format!(
                "max_kernel_args is {}, but the widest single operator takes {widest} tensors (its operands and \
                 result), so it must be at least {widest}",
                self.max_kernel_args
            ));
        }
        if let Some(b) = self.l2_bytes {
            at_least("l2_bytes", b, 1)?;
        }
        if let (Some(reuse), Some(l2)) = (self.l2_reuse_bytes, self.l2_bytes) {
            if reuse > l2 {
                return Err(format!("l2_reuse_bytes ({reuse}) exceeds l2_bytes ({l2})"));
            }
        }
        if let Some(limit) = self.l2_reuse_limit_bytes {
            match self.l2_reuse_bytes {
                Some(reuse) if limit > reuse => {}
                Some(reuse) => {
                    return Err(format!("l2_reuse_limit_bytes ({limit}) must exceed l2_reuse_bytes ({reuse})"))
                }
                None => return Err("l2_reuse_limit_bytes needs l2_reuse_bytes".into()),
            }
        }
        if let (Some(dirty), Some(l2)) = (self.l2_dirty_bytes, self.l2_bytes) {
            if dirty > l2 {
                return Err(format!("l2_dirty_bytes ({dirty}) exceeds l2_bytes ({l2})"));
            }
        }
        if let Some(b) = self.sector_bandwidth_gbs {
            positive("sector_bandwidth_gbs", b)?;
        }
        if let Some(b) = self.l2_bandwidth_gbs {
            positive("l2_bandwidth_gbs", b)?;
        }
        if let Some(n) = self.sm_count {
            at_least("sm_count", u64::from(n), 1)?;
        }
        for t in Template::ALL {
            if !self.templates.contains_key(t.name()) {
                return Err(format!("templates has no rates for template `{}`", t.name()));
            }
        }
        for (name, rates) in &self.templates {
            let Some(t) = Template::ALL.into_iter().find(|t| t.name() == name) else {
                let known: Vec<&str> = Template::ALL.iter().map(|t| t.name()).collect();
                return Err(format!("templates has an unknown template `{name}` (known: {})", known.join(", ")));
            };
            let path = format!("templates.{name}");
            rates.validate(&path)?;
            let implementations: &[&str] = match t {
                Template::Gemm => &["cublaslt", "generated"],
                Template::Attention => &["backward", "backward_fused", "portable"],
                Template::RowReduce => &["cluster"],
                Template::Elementwise => &["tiled"],
                Template::ColReduce => &["online"],
            };
            for (imp, r) in &rates.implementations {
                if !implementations.contains(&imp.as_str()) {
                    return Err(format!(
                        "{path}.implementations has an unknown implementation `{imp}` ({})",
                        if implementations.is_empty() {
                            format!("template `{name}` has none")
                        } else {
                            format!("known: {}", implementations.join(", "))
                        }
                    ));
                }
                let path = format!("{path}.implementations.{imp}");
                if !r.implementations.is_empty() {
                    return Err(format!("{path}.implementations: an implementation has no implementations of its own"));
                }
                r.validate(&path)?;
            }
        }
        Ok(())
    }

    pub fn rates(&self, t: Template) -> &TemplateRates {
        &self.templates[t.name()]
    }

    /// The rates of one gemm implementation (the gemm template's own where the profile has none).
    pub fn gemm_rates(&self, imp: GemmImpl) -> &TemplateRates {
        let g = self.rates(Template::Gemm);
        g.implementations.get(imp.name()).unwrap_or(g)
    }

    /// Predicted time of a gemm kernel in implementation `imp`, in microseconds (`work.hit`
    /// bytes read from L2; `tiles`: the generated kernel's tile and product shape, timed by the
    /// profile's tile rates where it has them).
    pub fn gemm_us(&self, imp: GemmImpl, work: &Work, dtype: DType, tiles: Option<&GemmTiles>) -> f64 {
        let r = self.gemm_rates(imp);
        let memory = self.memory_us(r, work);
        let fixed = r.call_overhead_us.unwrap_or(self.launch_overhead_us) * work.calls.max(1) as f64;
        let compute = match (imp, tiles.and_then(|t| self.tile_us(r, t, dtype))) {
            (GemmImpl::Generated, Some(us)) => us,
            _ => {
                let per_call = work.flops as f64 / work.calls.max(1) as f64;
                1e6 * work.flops as f64 / (sized_rate_tflops(r, dtype, per_call) * 1e12)
            }
        };
        // A library call's tiles: a block per tile of every matrix of the batch.
        let tiled = match (imp, tiles, r.tile_ns) {
            (GemmImpl::Cublaslt, Some(t), Some(ns)) => 1e-3 * ns * lt_tiles(t) as f64,
            _ => 0.0,
        };
        let skinny = match (imp, tiles, r.skinny_share) {
            (GemmImpl::Cublaslt, Some(t), Some(share)) if t.m.min(t.n) <= SKINNY_OUTPUT => {
                work.bytes as f64 / (self.copy_bandwidth_gbs * 1e3 * share)
            }
            _ => 0.0,
        };
        fixed + memory.max(compute).max(tiled).max(skinny)
    }

    /// The generated kernel's time from its tile's measured step times: `K` steps per block,
    /// each the lone-block step time or the SM's share of its blocks' steps, whichever is longer,
    /// plus the row epilogue once per wave, plus the implementation's split latency when the
    /// product is split along K. `None` when the profile has no rate for the tile.
    fn tile_us(&self, r: &TemplateRates, t: &GemmTiles, dtype: DType) -> Option<f64> {
        let split = if t.splits > 1 { r.split_latency_us.unwrap_or(0.0) } else { 0.0 };
        self.tile_steps_us(r, t, dtype).map(|us| us + split)
    }

    fn tile_steps_us(&self, r: &TemplateRates, t: &GemmTiles, dtype: DType) -> Option<f64> {
        let key = format!("{}x{}", t.bm, t.bn);
        if t.mma {
            let key = if t.wide { key } else { format!("{key}/e") };
            return r.tiles_mma.get(&key).and_then(|rate| self.tile_time(rate, t));
        }
        let sixteen = matches!(dtype, DType::Bf16 | DType::F16);
        if let Some(rate) = r.tiles_16bit.get(&key).filter(|_| sixteen) {
            return self.tile_time(rate, t);
        }
        if let Some(rate) = r.tiles.get(&key) {
            return self.tile_time(rate, t);
        }
        // A tile the profile has no rate for takes the measured tile nearest in operand
        // elements staged per step (BM + BN), its step times scaled by that count; the blocked
        // 128-row tiles (another loop shape) are taken only for themselves.
        let staged = |key: &str| -> Option<usize> {
            let (m, n) = key.split_once('x')?;
            Some(m.parse::<usize>().ok()? + n.parse::<usize>().ok()?)
        };
        let tall = |key: &str| key.split_once('x').is_some_and(|(m, _)| m == "128");
        let own = t.bm + t.bn;
        let (key, rate) = r
            .tiles
            .iter()
            .filter(|(k, _)| staged(k).is_some() && !tall(k))
            .min_by_key(|(k, _)| staged(k).unwrap_or(0).abs_diff(own))?;
        let scale = own as f64 / staged(key)? as f64;
        let rate = TileRate {
            lone_ns_per_k: rate.lone_ns_per_k * scale,
            sm_ns_per_k: rate.sm_ns_per_k * scale,
            row_epilogue_us: rate.row_epilogue_us,
            block_us: rate.block_us,
        };
        self.tile_time(&rate, t)
    }

    /// `K` steps of one tile rate: see [`tile_us`](Self::tile_us). The SM's share takes the
    /// average block's steps (`mean_k`), the lone block's latency all `K`.
    ///
    /// Under split-K each of `splits` blocks per tile runs `kspan` of the `K` steps, and the
    /// tile's last block then reads every split's partial tile back (f32, from L2, at an SM's
    /// share of the L2 bandwidth) before its epilogue.
    fn tile_time(&self, rate: &TileRate, t: &GemmTiles) -> Option<f64> {
        let sms = f64::from(self.sm_count?);
        let tiles = (t.m.div_ceil(t.bm) * t.n.div_ceil(t.bn) * t.batch) as f64;
        let splits = t.splits.max(1);
        let blocks = tiles * splits as f64;
        let epilogue =
            if t.rows { rate.row_epilogue_us * (tiles / sms).ceil() } else { 0.0 } + rate.block_us * blocks / sms;
        let steps = t.steps(if splits > 1 { t.kspan.min(t.k) } else { t.k });
        let mean = if splits > 1 { steps } else { t.steps(t.mean_k.min(t.k)) };
        // The SM's share is that of the busiest SM: whole blocks (192 blocks on 132 SMs leave 60
        // of them two; the calibration's probes are whole multiples of the SMs).
        let share = (blocks / sms).ceil();
        let ns = (steps as f64 * rate.lone_ns_per_k).max(mean as f64 * share * rate.sm_ns_per_k);
        let fixup = if splits > 1 {
            let l2 = self.l2_bandwidth_gbs.unwrap_or(self.copy_bandwidth_gbs);
            let bytes = (splits * t.bm * t.bn * 4) as f64 * (tiles / sms).ceil();
            bytes / (l2 * 1e3 / sms)
        } else {
            0.0
        };
        Some(1e-3 * ns + epilogue + fixup)
    }

    /// Microseconds to move a kernel's bytes: misses at the template's share of copy bandwidth,
    /// L2 hits at L2 bandwidth.
    /// A kernel whose reads touch more sectors than they use takes the longer of that and its
    /// sectors (all of its bytes and the sectors' excess) at the sector bandwidth.
    fn memory_us(&self, r: &TemplateRates, work: &Work) -> f64 {
        let hit = work.hit.min(work.bytes);
        let hbm = (work.bytes - hit) as f64 / (self.copy_bandwidth_gbs * 1e3 * r.bandwidth_efficiency);
        let l2 = self
            .l2_bandwidth_gbs
            .map_or(hit as f64 / (self.copy_bandwidth_gbs * 1e3 * r.bandwidth_efficiency), |b| hit as f64 / (b * 1e3));
        let sectors = match self.sector_bandwidth_gbs.or(self.l2_bandwidth_gbs) {
            Some(b) if work.sector_bytes > 0 => work.bytes.saturating_add(work.sector_bytes) as f64 / (b * 1e3),
            _ => 0.0,
        };
        let narrow = match r.narrow_access_share.get(&work.access_bytes.to_string()) {
            Some(share) => work.bytes as f64 / (self.copy_bandwidth_gbs * 1e3 * r.bandwidth_efficiency * share),
            None => 0.0,
        };
        (hbm + l2).max(sectors).max(narrow)
    }

    /// Seconds to move `bytes` with template `t`.
    pub fn memory_seconds(&self, t: Template, bytes: u64) -> f64 {
        bytes as f64 / (self.copy_bandwidth_gbs * 1e9 * self.rates(t).bandwidth_efficiency)
    }

    /// Seconds for `flops` with template `t` on operands of `dtype`.
    pub fn compute_seconds(&self, t: Template, flops: u64, dtype: DType) -> f64 {
        flops as f64 / (rate_tflops(self.rates(t), dtype) * 1e12)
    }

    /// Predicted time of one kernel in microseconds: launch + max(memory, compute).
    pub fn kernel_us(&self, t: Template, bytes: u64, flops: u64, dtype: DType) -> f64 {
        self.launch_overhead_us + 1e6 * self.memory_seconds(t, bytes).max(self.compute_seconds(t, flops, dtype))
    }

    /// [`kernel_us`](Self::kernel_us) with L2 hits and dependent reduction stages: launch +
    /// stages x the template's stage latency + max(memory, compute).
    /// A kernel with `tiles` (attention's CUDA-core f32 path) is timed by the template's tile
    /// rates where the profile has them.
    pub fn kernel_work_us(&self, t: Template, work: &Work, dtype: DType, tiles: Option<&GemmTiles>) -> f64 {
        self.work_us(self.rates(t), work, dtype, tiles)
    }

    /// [`kernel_work_us`](Self::kernel_work_us) of a row kernel; one whose rows are spread over
    /// clusters of `cluster` blocks (more than 1: `caps::row_cluster`) at the rates of the row
    /// template's `cluster` implementation where the profile has one (else the template's).
    pub fn row_work_us(&self, work: &Work, dtype: DType, cluster: u32) -> f64 {
        let r = self.rates(Template::RowReduce);
        let r = if cluster > 1 { r.implementations.get("cluster").unwrap_or(r) } else { r };
        self.work_us(r, work, dtype, None)
    }

    /// [`kernel_work_us`](Self::kernel_work_us) of the attention template's backward kernels
    /// (the log-sum-exp pass and the gradients, mma.sync kernels), at the rates of its
    /// `backward` implementation where the profile has one; `fused`: the one kernel of the
    /// query, key and value gradients (dq summed by atomics), at the rates of `backward_fused`
    /// where the profile has them (else `backward`'s).
    pub fn attention_backward_us(&self, work: &Work, dtype: DType, fused: bool) -> f64 {
        let a = self.rates(Template::Attention);
        let separate = a.implementations.get("backward").unwrap_or(a);
        let r = if fused { a.implementations.get("backward_fused").unwrap_or(separate) } else { separate };
        self.work_us(r, work, dtype, None)
    }

    /// [`kernel_work_us`](Self::kernel_work_us) at the rates of template `t`'s implementation
    /// `imp` where the profile has them, else at the template's own: attention's `portable`
    /// mma.sync path (the template's own rates are those of the path the device takes, wgmma on
    /// a 9.0 device), the column template's `online` pairs (a running max and the sum of
    /// exponentials rescaled to it), the elementwise template's `tiled` path (transposed reads
    /// through shared memory).
    pub fn implementation_us(&self, t: Template, imp: &str, work: &Work, dtype: DType) -> f64 {
        let r = self.rates(t);
        self.work_us(r.implementations.get(imp).unwrap_or(r), work, dtype, None)
    }

    fn work_us(&self, r: &TemplateRates, work: &Work, dtype: DType, tiles: Option<&GemmTiles>) -> f64 {
        let stages = r.stage_latency_us.unwrap_or(0.0) * f64::from(work.stages);
        let compute = tiles
            .and_then(|g| self.tile_us(r, g, dtype))
            .unwrap_or_else(|| 1e6 * work.flops as f64 / (rate_tflops(r, dtype) * 1e12));
        self.launch_overhead_us + stages + self.memory_us(r, work).max(compute)
    }
}

impl TemplateRates {
    /// See [`DeviceProfile::validate`]; `path` names these rates in messages.
    fn validate(&self, path: &str) -> std::result::Result<(), String> {
        positive(&format!("{path}.bandwidth_efficiency"), self.bandwidth_efficiency)?;
        positive(&format!("{path}.flops_f32_tflops"), self.flops_f32_tflops)?;
        if let Some(v) = self.flops_bf16_tflops {
            positive(&format!("{path}.flops_bf16_tflops"), v)?;
        }
        for (field, v) in [
            ("stage_latency_us", self.stage_latency_us),
            ("call_overhead_us", self.call_overhead_us),
            ("split_latency_us", self.split_latency_us),
            ("tile_ns", self.tile_ns),
            ("row_ns", self.row_ns),
        ] {
            if let Some(v) = v {
                non_negative(&format!("{path}.{field}"), v)?;
            }
        }
        if let Some(share) = self.skinny_share {
            if !(share > 0.0 && share <= 1.0) {
                return Err(format!("{path}.skinny_share must be in (0, 1], got {share}"));
            }
        }
        for (width, share) in &self.narrow_access_share {
            if !matches!(width.as_str(), "1" | "2" | "4" | "8") {
                return Err(format!("{path}.narrow_access_share has a width `{width}` (1, 2, 4 or 8 bytes)"));
            }
            if !(*share > 0.0 && *share <= 1.0) {
                return Err(format!("{path}.narrow_access_share.{width} must be in (0, 1], got {share}"));
            }
        }
        for (field, tiles, split) in [
            ("tiles", &self.tiles, false),
            ("tiles_16bit", &self.tiles_16bit, false),
            ("tiles_mma", &self.tiles_mma, true),
        ] {
            for (key, rate) in tiles {
                let shape = if split { key.strip_suffix("/e").unwrap_or(key) } else { key };
                let ok = shape.split_once('x').is_some_and(|(m, n)| {
                    [m, n]
                        .iter()
                        .all(|d| d.parse::<usize>().is_ok_and(|d| d > 0) && d.bytes().all(|b| b.is_ascii_digit()))
                });
                if !ok {
                    let form = if split { "`BMxBN` or `BMxBN/e`" } else { "`BMxBN`" };
                    return Err(format!("{path}.{field} has a tile `{key}` that is not of the form {form}"));
                }
                let at = format!("{path}.{field}.{key}");
                positive(&format!("{at}.lone_ns_per_k"), rate.lone_ns_per_k)?;
                positive(&format!("{at}.sm_ns_per_k"), rate.sm_ns_per_k)?;
                non_negative(&format!("{at}.row_epilogue_us"), rate.row_epilogue_us)?;
                non_negative(&format!("{at}.block_us"), rate.block_us)?;
            }
        }
        for (key, points) in &self.rate_by_size {
            let at = format!("{path}.rate_by_size.{key}");
            if key != "f32" && key != "bf16" {
                return Err(format!("{path}.rate_by_size has an unknown dtype `{key}` (known: f32, bf16)"));
            }
            for (i, [gflop, tflops]) in points.iter().enumerate() {
                positive(&format!("{at}[{i}][0] (GFLOP)"), *gflop)?;
                positive(&format!("{at}[{i}][1] (TFLOP/s)"), *tflops)?;
            }
            if let Some(w) = points.windows(2).position(|w| w[1][0] <= w[0][0]) {
                return Err(format!("{at}: the sizes must increase, but point {} is not larger than point {w}", w + 1));
            }
        }
        Ok(())
    }
}

/// The most tensors (operands and result) one primitive operator's kernel takes: a profile's
/// `max_kernel_args` must allow it, or the unfused plan itself would not fit.
pub fn min_kernel_args() -> usize {
    crate::ir::lang::OPS.iter().map(|o| o.arity).max().unwrap_or(0) + 1
}

fn positive(field: &str, v: f64) -> std::result::Result<(), String> {
    if v.is_finite() && v > 0.0 {
        Ok(())
    } else {
        Err(format!("{field} must be a positive number, got {v}"))
    }
}

fn non_negative(field: &str, v: f64) -> std::result::Result<(), String> {
    if v.is_finite() && v >= 0.0 {
        Ok(())
    } else {
        Err(format!("{field} must be a non-negative number, got {v}"))
    }
}

fn at_least(field: &str, v: u64, min: u64) -> std::result::Result<(), String> {
    if v >= min {
        Ok(())
    } else {
        Err(format!("{field} must be at least {min}, got {v}"))
    }
}

/// The side of the output tile a library call's time per tile ([`TemplateRates::tile_ns`]) is
/// counted in: a nominal tile (cuBLASLt's heuristics pick their own, none smaller than this
/// on a matrix this size or larger).
pub const LT_TILE: usize = 64;

/// The most output rows or columns of a cuBLASLt call's matrices priced at its skinny rate
/// ([`TemplateRates::skinny_share`]).
pub const SKINNY_OUTPUT: usize = 16;

/// Output tiles of [`LT_TILE`] x [`LT_TILE`] in every matrix of a product.
pub fn lt_tiles(t: &GemmTiles) -> u64 {
    (t.batch as u64).saturating_mul((t.m.div_ceil(LT_TILE) * t.n.div_ceil(LT_TILE)) as u64)
}

/// What one kernel moves and computes, as the time model sees it.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Work {
    /// Bytes read and written.
    pub bytes: u64,
    /// Of those, bytes read from L2 (written or read by a recent kernel).
    pub hit: u64,
    pub flops: u64,
    /// Dependent reduction stages (a softmax has two: its max, then its sum).
    pub stages: u32,
    /// Library calls the kernel makes (a cuBLASLt call looped over batch axes; 0 or 1: one).
    pub calls: u64,
    /// Bytes of 32-byte sectors the SMs fetch beyond `bytes`, where a read's lanes touch more
    /// of each sector than they use (a transposed read on the plain elementwise path): served
    /// from L2 at `sector_bandwidth_gbs` (`bytes` plus these), beside device memory's time.
    pub sector_bytes: u64,
    /// Bytes each lane accesses at a time where fewer than 16 (`narrow_access_share`); 0: 16.
    pub access_bytes: u32,
}

/// The shape a generated gemm kernel runs: the product (batch x M x N, reduction K) and the tile
/// code generation picks for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GemmTiles {
    pub batch: usize,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    /// The reduction steps of the average block (`k` where every block runs them all; fewer
    /// where blocks' depths differ, as in causal attention): the SM's throughput bound takes it,
    /// a lone block's latency `k`.
    pub mean_k: usize,
    pub bm: usize,
    pub bn: usize,
    /// Depth of the slice a block stages per step of its mainloop (`EQ_BK`; 1 where steps are
    /// not staged in slices, as attention's key tiles).
    pub bk: usize,
    /// Blocks splitting each tile's depth (split-K; 1 for none) and each one's depth.
    pub splits: usize,
    pub kspan: usize,
    /// Whether the epilogue reduces rows.
    pub rows: bool,
    /// Whether the product runs on the tensor cores (16-bit operands; `tiles_mma`).
    pub mma: bool,
    /// Whether the tensor-core mainloop stages both operands in 16-byte chunks (their
    /// contiguous axes and other strides multiples of 8; `caps::gemm_staging`).
    pub wide: bool,
}

impl GemmTiles {
    /// The steps a block's mainloop takes over `depth` of the reduction axis: whole slices of
    /// `bk` (the last one padded with zeros), or, shallower than one slice, the depth itself
    /// (rounded up to the tensor cores' 16; `EQ_KSTEPS` in kernels/gemm.cu). A product of
    /// depth 2 in a 64-deep tile takes 2 steps; one of depth 65 takes 128.
    pub fn steps(&self, depth: usize) -> usize {
        slice_steps(self.bk, self.mma, depth)
    }
}

/// [`GemmTiles::steps`] of a tile staging slices of `bk`, on the tensor cores where `mma`.
pub fn slice_steps(bk: usize, mma: bool, depth: usize) -> usize {
    let bk = bk.max(1);
    match depth {
        d if d < bk && mma => d.next_multiple_of(16).min(bk),
        d if d < bk => d,
        d => d.next_multiple_of(bk),
    }
}

/// The arithmetic rate of `r` for operands of `dtype` on calls of `flops` each, in TFLOP/s: its
/// `rate_by_size` points interpolated in log-size where it has them for `dtype` (f16 takes
/// bf16's), else [`rate_tflops`].
fn sized_rate_tflops(r: &TemplateRates, dtype: DType, flops: f64) -> f64 {
    let key = match dtype {
        DType::Bf16 | DType::F16 => "bf16",
        _ => "f32",
    };
    let Some(points) = r.rate_by_size.get(key).filter(|p| !p.is_empty()) else {
        return rate_tflops(r, dtype);
    };
    let x = (flops.max(1.0) / 1e9).ln();
    let first = points[0];
    let last = points[points.len() - 1];
    if x <= first[0].ln() {
        return first[1];
    }
    if x >= last[0].ln() {
        return last[1];
    }
    for w in points.windows(2) {
        let (a, b) = (w[0], w[1]);
        if x <= b[0].ln() {
            let t = (x - a[0].ln()) / (b[0].ln() - a[0].ln());
            return a[1] + t * (b[1] - a[1]);
        }
    }
    last[1]
}

/// The arithmetic rate of `r` for operands of `dtype`, in TFLOP/s.
fn rate_tflops(r: &TemplateRates, dtype: DType) -> f64 {
    match dtype {
        DType::Bf16 | DType::F16 => r.flops_bf16_tflops.unwrap_or(r.flops_f32_tflops),
        _ => r.flops_f32_tflops,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Row kernels over clusters of blocks take the row template's `cluster` rates where the
    /// profile has them (an implementation the row template may have, and no other), and the
    /// template's own otherwise and for rows in one block.
    #[test]
    fn rows_over_clusters_take_their_own_rates_where_measured() {
        let mut p = DeviceProfile::load("h100").unwrap();
        // (The profile's own `cluster` rates, calibrated, set aside: without them clusters take
        // the template's.)
        p.templates.get_mut("rowreduce").unwrap().implementations.remove("cluster");
        let work = Work { bytes: 1 << 30, ..Work::default() };
        let one = p.row_work_us(&work, DType::Bf16, 1);
        assert_eq!(p.row_work_us(&work, DType::Bf16, 7), one);
        let mut cluster = p.rates(Template::RowReduce).clone();
        cluster.bandwidth_efficiency /= 2.0;
        p.templates.get_mut("rowreduce").unwrap().implementations.insert("cluster".into(), cluster.clone());
        p.validate().unwrap();
        let slow = p.row_work_us(&work, DType::Bf16, 7);
        assert!(slow > 1.9 * (one - p.launch_overhead_us), "{slow} against {one}");
        assert_eq!(p.row_work_us(&work, DType::Bf16, 1), one);
        p.templates.get_mut("colreduce").unwrap().implementations.insert("cluster".into(), cluster);
        assert!(p.validate().unwrap_err().contains("unknown implementation `cluster`"));
    }

    #[test]
    fn rates_by_size_interpolate_in_log_size_and_hold_at_the_ends() {
        let mut r = DeviceProfile::load("h100").unwrap().gemm_rates(GemmImpl::Cublaslt).clone();
        r.rate_by_size.clear();
        let flat = r.flops_f32_tflops;
        assert_eq!(sized_rate_tflops(&r, DType::F32, 1e9), flat);
        r.rate_by_size.insert("f32".into(), vec![[0.1, 10.0], [10.0, 30.0], [1000.0, 50.0]]);
        assert_eq!(sized_rate_tflops(&r, DType::F32, 1e6), 10.0);
        assert_eq!(sized_rate_tflops(&r, DType::F32, 1e8), 10.0);
        assert!((sized_rate_tflops(&r, DType::F32, 1e9) - 20.0).abs() < 1e-9);
        assert!((sized_rate_tflops(&r, DType::F32, 1e11) - 40.0).abs() < 1e-9);
        assert_eq!(sized_rate_tflops(&r, DType::F32, 1e14), 50.0);
        // 16-bit operands take the bf16 points, or the flat bf16 rate without them.
        assert_eq!(sized_rate_tflops(&r, DType::F16, 1e9), rate_tflops(&r, DType::Bf16));
        r.rate_by_size.insert("bf16".into(), vec![[1.0, 300.0]]);
        assert_eq!(sized_rate_tflops(&r, DType::F16, 1e9), 300.0);
        assert_eq!(sized_rate_tflops(&r, DType::Bf16, 1e12), 300.0);
    }

    fn tiles(m: usize, n: usize, k: usize, bm: usize, bn: usize, rows: bool) -> GemmTiles {
        GemmTiles { batch: 1, m, n, k, mean_k: k, bm, bn, bk: 1, splits: 1, kspan: 0, rows, mma: false, wide: false }
    }

    /// A profile with one measured tile (8x64: 30 ns per step alone, 20 shared) and 100 SMs.
    fn tiled() -> (DeviceProfile, TemplateRates) {
        let mut p = DeviceProfile::load("h100").unwrap();
        p.sm_count = Some(100);
        let mut r = p.gemm_rates(GemmImpl::Generated).clone();
        r.tiles = [(
            "8x64".to_string(),
            TileRate { lone_ns_per_k: 30.0, sm_ns_per_k: 20.0, row_epilogue_us: 2.0, block_us: 0.0 },
        )]
        .into();
        (p, r)
    }

    #[test]
    fn generated_gemm_steps_are_latency_bound_alone_and_throughput_bound_shared() {
        let (p, r) = tiled();
        // 800 rows in 8-row tiles: 100 blocks, one per SM: 1000 steps of 30 ns.
        assert!((p.tile_us(&r, &tiles(800, 64, 1000, 8, 64, false), DType::F32).unwrap() - 30.0).abs() < 1e-9);
        // 8000 rows: 10 blocks per SM share it, 10 x 20 ns a step.
        assert!((p.tile_us(&r, &tiles(8000, 64, 1000, 8, 64, false), DType::F32).unwrap() - 200.0).abs() < 1e-9);
        // Blocks of different depths (causal attention): the SM's share counts the average
        // block's steps (10 x 20 ns x 400), a lone block all of its own (30 ns x 1000).
        let uneven = GemmTiles { mean_k: 400, ..tiles(8000, 64, 1000, 8, 64, false) };
        assert!((p.tile_us(&r, &uneven, DType::F32).unwrap() - 80.0).abs() < 1e-9);
        let lone = GemmTiles { mean_k: 400, ..tiles(800, 64, 1000, 8, 64, false) };
        assert!((p.tile_us(&r, &lone, DType::F32).unwrap() - 30.0).abs() < 1e-9);
        // 1450 blocks on 100 SMs: the busiest SMs run 15 of them (15 x 20 ns a step), not the
        // average 14.5 (f32 attention's 192 blocks on 132 SMs ran 1.42x their average's time).
        assert!((p.tile_us(&r, &tiles(11600, 64, 1000, 8, 64, false), DType::F32).unwrap() - 300.0).abs() < 1e-9);
        // A row epilogue adds its time once per wave.
        assert!((p.tile_us(&r, &tiles(8000, 64, 1000, 8, 64, true), DType::F32).unwrap() - 220.0).abs() < 1e-9);
        // An unmeasured tile takes the nearest measured one, scaled by the elements staged per
        // step: 8x128 stages 136 against 72.
        let us = p.tile_us(&r, &tiles(800, 128, 1000, 8, 128, false), DType::F32).unwrap();
        assert!((us - 30.0 * 136.0 / 72.0).abs() < 1e-9);
        // Without an SM count there is no tile model.
        let q = DeviceProfile { sm_count: None, ..p.clone() };
        assert!(q.tile_us(&r, &tiles(800, 64, 1000, 8, 64, false), DType::F32).is_none());
    }

    #[test]
    fn a_block_steps_through_whole_slices_or_a_shallower_product_s_own_depth() {
        let (p, r) = tiled();
        let deep = |k: usize, mma: bool| GemmTiles { bk: 64, mma, ..tiles(800, 64, k, 8, 64, false) };
        // Shallower than a slice: its own depth (the tensor cores' 16 at least).
        assert_eq!(deep(2, false).steps(2), 2);
        assert_eq!(deep(2, true).steps(2), 16);
        // Deeper: whole slices, the last padded with zeros.
        assert_eq!(deep(65, false).steps(65), 128);
        assert_eq!(deep(128, false).steps(128), 128);
        // 100 lone blocks of 65 steps take 128 steps of 30 ns.
        assert!((p.tile_us(&r, &deep(65, false), DType::F32).unwrap() - 128.0 * 0.03).abs() < 1e-9);
        // Each block's fixed time, at the SM's throughput: 32,768 blocks of a product 2 deep.
        let mut fixed = r.clone();
        if let Some(t) = fixed.tiles.get_mut("8x64") {
            t.block_us = 0.5;
        }
        let many = GemmTiles { bk: 64, ..tiles(8 * 32768, 64, 2, 8, 64, false) };
        let extra = p.tile_us(&fixed, &many, DType::F32).unwrap() - p.tile_us(&r, &many, DType::F32).unwrap();
        let sms = f64::from(p.sm_count.unwrap());
        assert!((extra - 0.5 * 32768.0 / sms).abs() < 1e-9, "{extra}");
    }

    #[test]
    fn split_latency_is_paid_by_split_products_only() {
        let (p, mut r) = tiled();
        r.split_latency_us = Some(1.5);
        let whole = tiles(80, 64, 1000, 8, 64, false);
        assert!((p.tile_us(&r, &whole, DType::F32).unwrap() - 30.0).abs() < 1e-9);
        // 10 tiles split 10 ways: 100 blocks of 100 steps, the parts' reads, and the latency.
        let split = GemmTiles { splits: 10, kspan: 100, ..whole };
        let without = p.tile_steps_us(&r, &split, DType::F32).unwrap();
        assert!(without > 3.0 && without < 30.0, "{without}");
        assert!((p.tile_us(&r, &split, DType::F32).unwrap() - without - 1.5).abs() < 1e-9);
    }

    #[test]
    fn sixteen_bit_operands_take_their_own_tile_rates_where_measured() {
        let (p, mut r) = tiled();
        r.tiles_16bit = [(
            "8x64".to_string(),
            TileRate { lone_ns_per_k: 90.0, sm_ns_per_k: 60.0, row_epilogue_us: 0.0, block_us: 0.0 },
        )]
        .into();
        let t = tiles(800, 64, 1000, 8, 64, false);
        assert!((p.tile_us(&r, &t, DType::Bf16).unwrap() - 90.0).abs() < 1e-9);
        assert!((p.tile_us(&r, &t, DType::F16).unwrap() - 90.0).abs() < 1e-9);
        assert!((p.tile_us(&r, &t, DType::F32).unwrap() - 30.0).abs() < 1e-9);
        // A tile with no 16-bit rate takes the f32 tiles (nearest, scaled).
        let wide = tiles(800, 128, 1000, 8, 128, false);
        assert!((p.tile_us(&r, &wide, DType::Bf16).unwrap() - 30.0 * 136.0 / 72.0).abs() < 1e-9);
    }

    #[test]
    fn tensor_core_tiles_take_the_rate_of_their_staging() {
        let (p, mut r) = tiled();
        r.tiles_mma = [
            (
                "32x128".to_string(),
                TileRate { lone_ns_per_k: 10.0, sm_ns_per_k: 10.0, row_epilogue_us: 1.0, block_us: 0.0 },
            ),
            (
                "32x128/e".to_string(),
                TileRate { lone_ns_per_k: 60.0, sm_ns_per_k: 60.0, row_epilogue_us: 1.0, block_us: 0.0 },
            ),
        ]
        .into();
        // 3200 rows: 100 blocks on 100 SMs, one wave; 1000 steps plus one row epilogue.
        let wide = GemmTiles { mma: true, wide: true, ..tiles(3200, 128, 1000, 32, 128, true) };
        assert!((p.tile_us(&r, &wide, DType::Bf16).unwrap() - 11.0).abs() < 1e-9);
        let narrow = GemmTiles { wide: false, ..wide };
        assert!((p.tile_us(&r, &narrow, DType::Bf16).unwrap() - 61.0).abs() < 1e-9);
        // A tensor-core tile without a rate has no tile model (timed by its flops).
        let other = GemmTiles { bm: 64, ..wide };
        assert!(p.tile_us(&r, &other, DType::Bf16).is_none());
    }

    #[test]
    fn l2_hits_and_reduction_stages_change_a_kernels_time() {
        let p = DeviceProfile::load("h100").unwrap();
        let work = Work { bytes: 32 << 20, hit: 0, flops: 0, stages: 0, calls: 1, sector_bytes: 0, access_bytes: 0 };
        let miss = p.kernel_work_us(Template::RowReduce, &work, DType::F32, None);
        let hit = p.kernel_work_us(Template::RowReduce, &Work { hit: 16 << 20, ..work }, DType::F32, None);
        assert!(hit < miss, "{hit} {miss}");
        let staged = p.kernel_work_us(Template::RowReduce, &Work { stages: 2, ..work }, DType::F32, None);
        let stage = p.rates(Template::RowReduce).stage_latency_us.unwrap();
        assert!((staged - miss - 2.0 * stage).abs() < 1e-9);
        // With no L2 figures a hit costs what a miss does.
        let plain = DeviceProfile { l2_bandwidth_gbs: None, ..p.clone() };
        let a = plain.kernel_work_us(Template::Elementwise, &work, DType::F32, None);
        let b = plain.kernel_work_us(Template::Elementwise, &Work { hit: 16 << 20, ..work }, DType::F32, None);
        assert!((a - b).abs() < 1e-9);
    }

    /// The plain path's transposed copy of an 8192 x 2048 bf16 activation, every element read
    /// through a sector of its own (16 bytes of sectors per byte used, each sector fetched from
    /// device memory once): priced at the 139.1 us it measured on an H100 (2026-11-26), where its
    /// bytes alone said 26.1 us; a kernel touching whole sectors keeps its price.
    #[test]
    fn strided_sectors_are_priced_at_the_sector_bandwidth() {
        let p = DeviceProfile::load("h100").unwrap();
        let bytes = 2 * 8192 * 2048 * 2;
        let plain = Work { bytes, calls: 1, ..Work::default() };
        let strided = Work { sector_bytes: 15 * bytes / 2, ..plain };
        let us = |w: &Work| p.kernel_work_us(Template::Elementwise, w, DType::Bf16, None);
        assert!((us(&plain) - 26.1).abs() < 0.1, "{}", us(&plain));
        assert!((us(&strided) - 139.1).abs() < 0.1, "{}", us(&strided));
    }

    /// A cuBLASLt call whose matrices have at most `SKINNY_OUTPUT` output columns moves its
    /// bytes at the profile's skinny share of copy bandwidth; wider calls, or a profile without
    /// the share, are priced as before.
    #[test]
    fn skinny_cublaslt_calls_move_their_bytes_at_the_skinny_share() {
        let mut p = DeviceProfile::load("h100").unwrap();
        let lt = GemmImpl::Cublaslt;
        let set = |p: &mut DeviceProfile, share: Option<f64>| {
            p.templates.get_mut("gemm").unwrap().implementations.get_mut("cublaslt").unwrap().skinny_share = share;
        };
        set(&mut p, Some(0.4));
        let fixed = p.gemm_rates(lt).call_overhead_us.unwrap();
        // [131072, 128] @ [128, 4] f32: 4 output columns, memory-bound.
        let skinny = tiles(131_072, 4, 128, 64, 64, false);
        let work = Work { bytes: (131_072 * 132 + 512) * 4, flops: 2 * 131_072 * 128 * 4, calls: 1, ..Work::default() };
        let us = p.gemm_us(lt, &work, DType::F32, Some(&skinny));
        let expect = fixed + work.bytes as f64 / (p.copy_bandwidth_gbs * 1e3 * 0.4);
        assert!((us - expect).abs() < 1e-6, "{us} against {expect}");
        // 17 columns and more, or no share in the profile: priced as other calls.
        let wider = GemmTiles { n: SKINNY_OUTPUT + 1, ..skinny };
        let plain = p.gemm_us(lt, &work, DType::F32, Some(&wider));
        assert!(plain < 0.6 * us, "{plain} against {us}");
        set(&mut p, None);
        assert_eq!(p.gemm_us(lt, &work, DType::F32, Some(&skinny)), plain);
        // A skinny share above 1 is refused.
        set(&mut p, Some(1.5));
        assert!(p.validate().is_err());
    }

    /// A cuBLASLt call over a large batch of tiny matrices costs its tiles, not its bytes or
    /// flops; a single large product is not changed by the tile term.
    #[test]
    fn cublaslt_calls_over_batches_of_tiny_matrices_cost_their_tiles() {
        let mut p = DeviceProfile::load("h100").unwrap();
        let lt = GemmImpl::Cublaslt;
        let tiny = GemmTiles { batch: 1 << 20, ..tiles(1, 1, 13, 64, 64, false) };
        let work = Work { bytes: 58_720_256, flops: (2 * 13) << 20, calls: 1, ..Work::default() };
        let without = {
            let mut q = p.clone();
            q.templates.get_mut("gemm").unwrap().implementations.get_mut("cublaslt").unwrap().tile_ns = None;
            q.gemm_us(lt, &work, DType::F32, Some(&tiny))
        };
        let ns = p.gemm_rates(lt).tile_ns.expect("the h100 profile prices cuBLASLt's tiles");
        let with = p.gemm_us(lt, &work, DType::F32, Some(&tiny));
        let fixed = p.gemm_rates(lt).call_overhead_us.unwrap();
        assert!((with - fixed - 1e-3 * ns * (1u64 << 20) as f64).abs() < 1e-6, "{with}");
        assert!(with > 10.0 * without, "{with} against {without}");
        // 4096^3: compute-bound, 4096 tiles add nothing.
        let big = tiles(4096, 4096, 4096, 64, 64, false);
        let work = Work { bytes: 3 * 4096 * 4096 * 4, flops: 2 * 4096u64.pow(3), calls: 1, ..Work::default() };
        let a = p.gemm_us(lt, &work, DType::F32, Some(&big));
        p.templates.get_mut("gemm").unwrap().implementations.get_mut("cublaslt").unwrap().tile_ns = None;
        assert_eq!(a, p.gemm_us(lt, &work, DType::F32, Some(&big)));
    }

    /// The elementwise template's `tiled` path and the column template's `online` pairs take
    /// their implementation's rates where the profile has them, the template's otherwise; a
    /// profile with them loads (`eqfuse calibrate` writes both; its own output was refused on
    /// 2026-11-28 for `tiled`), and another template may not have them.
    #[test]
    fn implementations_take_their_own_rates_where_measured() {
        for (t, imp, other) in
            [(Template::Elementwise, "tiled", "colreduce"), (Template::ColReduce, "online", "rowreduce")]
        {
            let mut p = DeviceProfile::load("h100").unwrap();
            p.templates.get_mut(t.name()).unwrap().implementations.remove(imp);
            let work = Work { bytes: 1 << 30, ..Work::default() };
            let plain = p.implementation_us(t, imp, &work, DType::F32);
            assert_eq!(plain, p.kernel_work_us(t, &work, DType::F32, None));
            let mut own = p.rates(t).clone();
            own.bandwidth_efficiency /= 2.0;
            p.templates.get_mut(t.name()).unwrap().implementations.insert(imp.into(), own.clone());
            p.validate().unwrap();
            let text = serde_json::to_string(&p).unwrap();
            let q = DeviceProfile::parse("calibrated.json", &text).unwrap();
            let slow = q.implementation_us(t, imp, &work, DType::F32);
            assert!(slow > 1.9 * (plain - p.launch_overhead_us), "{imp}: {slow} against {plain}");
            p.templates.get_mut(other).unwrap().implementations.insert(imp.into(), own);
            assert!(p.validate().unwrap_err().contains(&format!("unknown implementation `{imp}`")));
        }
    }

    #[test]
    fn builtin_profiles_load() {
        for name in ["h100", "h200"] {
            let p = DeviceProfile::load(name).unwrap();
            assert_eq!(p.name, name);
        }
        assert!(DeviceProfile::load("/nonexistent/profile.json").is_err());
    }
}
