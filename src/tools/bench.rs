//! `eqfuse bench`: does the predicted saving show up on the GPU?
//!
//! For each program, eqfuse's eager unfused plan and its fused plan are each predicted and
//! measured (median of CUDA-event timings after a warm-up, the fused plan's outputs checked
//! against the CPU reference); over all plans the Spearman rank correlation of predicted against
//! measured time, and per program the error of the predicted speedup.
//! Invariant: every figure printed or written is measured in this run; nothing is estimated.

use std::fmt;

use serde_json::{json, Value};

use crate::codegen::codegen_plan;
use crate::error::{Error, Result};
use crate::ir::program::Program;
use crate::runtime::gpu::Gpu;
use crate::runtime::run_gpu::{run_on, unfused_plan, GpuRunOptions, GpuRunReport};
use crate::search::optimize::{optimize, OptimizeOptions};

/// One program's measurements.
#[derive(Clone, Debug)]
pub struct BenchRow {
    pub program: String,
    pub fused: GpuRunReport,
    pub unfused: GpuRunReport,
    pub fused_bytes: u64,
    pub unfused_bytes: u64,
}

impl BenchRow {
    pub fn speedup_measured(&self) -> f64 {
        self.unfused.total_measured_us / self.fused.total_measured_us
    }
    pub fn speedup_predicted(&self) -> f64 {
        self.unfused.total_predicted_us / self.fused.total_predicted_us
    }
    /// Relative error of the predicted speedup against the measured one.
    pub fn speedup_error(&self) -> f64 {
        (self.speedup_predicted() - self.speedup_measured()).abs() / self.speedup_measured()
    }
    /// Achieved bandwidth of the fused plan as a share of copy bandwidth (measured in the same
    /// run, see [`BenchReport::copy_bandwidth_gbs`]; else the profile's).
    pub fn copy_share(&self) -> Option<f64> {
        let gbs = self.fused_bytes as f64 / (self.fused.total_measured_us * 1e3);
        self.fused.copy_bandwidth_gbs.map(|c| gbs / c)
    }
}

/// The whole bench.
#[derive(Clone, Debug)]
pub struct BenchReport {
    pub device: String,
    pub rows: Vec<BenchRow>,
    /// Copy bandwidth (bytes read plus written per second, in GB/s) measured at the start of this
    /// run: a 1 GiB device-to-device copy, median of 20 after 3 warm-ups. Shares of copy
    /// bandwidth are taken against it, so they compare with the same GPU in the same state.
    pub copy_bandwidth_gbs: f64,
    /// The profile's copy bandwidth (what predictions used).
    pub profile_copy_bandwidth_gbs: f64,
}

/// Benches programs on the GPU at hand.
pub fn bench_programs(programs: &[Program], opts: &OptimizeOptions, repeat: usize) -> Result<BenchReport> {
    let gpu = Gpu::open()?;
    let copy_bytes = crate::tools::calibrate::copy_bytes(&gpu);
    let copy_gbs = 2.0 * copy_bytes as f64 / (crate::tools::calibrate::copy_time(&gpu, copy_bytes as usize)? * 1e3);
    let mut rows = Vec::new();
    for program in programs {
        let fused = optimize(program, opts)?.plan;
        if fused.kernels.is_empty() {
            // Nothing to time: its speedups would be 0 / 0.
            return Err(Error::Invalid(format!(
                "{}: the plan runs no kernel, so there is nothing to bench",
                program.source
            )));
        }
        let unfused = unfused_plan(program, &opts.profile, opts.strict)?;
        let run = GpuRunOptions { repeat, profile: Some(opts.profile.clone()), ..GpuRunOptions::default() };
        let mut f = run_on(&gpu, program, &fused, &codegen_plan(&fused)?, &run)?;
        let mut u = run_on(&gpu, program, &unfused, &codegen_plan(&unfused)?, &GpuRunOptions { check: false, ..run })?;
        // Achieved bandwidth against the copy measured in this run (predictions use the profile).
        f.copy_bandwidth_gbs = Some(copy_gbs);
        u.copy_bandwidth_gbs = Some(copy_gbs);
        rows.push(BenchRow {
            program: program.source.clone(),
            fused: f,
            unfused: u,
            fused_bytes: fused.total.bytes,
            unfused_bytes: unfused.total.bytes,
        });
    }
    Ok(BenchReport {
        device: gpu.name.clone(),
        rows,
        copy_bandwidth_gbs: copy_gbs,
        profile_copy_bandwidth_gbs: opts.profile.copy_bandwidth_gbs,
    })
}

/// Spearman's rank correlation of two equally long lists (ties get their mean rank).
pub fn spearman(a: &[f64], b: &[f64]) -> Option<f64> {
    if a.len() != b.len() || a.len() < 2 {
        return None;
    }
    let (ra, rb) = (ranks(a), ranks(b));
    let mean = (a.len() as f64 + 1.0) / 2.0;
    let cov: f64 = ra.iter().zip(&rb).map(|(x, y)| (x - mean) * (y - mean)).sum();
    let va: f64 = ra.iter().map(|x| (x - mean).powi(2)).sum();
    let vb: f64 = rb.iter().map(|y| (y - mean).powi(2)).sum();
    (va > 0.0 && vb > 0.0).then(|| cov / (va * vb).sqrt())
}

fn ranks(v: &[f64]) -> Vec<f64> {
    let mut idx: Vec<usize> = (0..v.len()).collect();
    idx.sort_by(|&i, &j| v[i].total_cmp(&v[j]));
    let mut r = vec![0.0; v.len()];
    let mut i = 0;
    while i < idx.len() {
        let mut j = i;
        while j + 1 < idx.len() && v[idx[j + 1]] == v[idx[i]] {
            j += 1;
        }
        for &k in &idx[i..=j] {
            r[k] = (i + j) as f64 / 2.0 + 1.0;
        }
        i = j + 1;
    }
    r
}

/// The check column: ok, or MISMATCH; an ok that needed the f32 reference's own error as
/// allowance (a badly conditioned program) or left out elements that follow a decision within
/// rounding of its threshold says so (see `run_gpu::check`).
fn check_cell(r: &GpuRunReport) -> String {
    if !r.ok() {
        return "MISMATCH".into();
    }
    let mut notes = vec![];
    if r.outputs.iter().any(|o| o.reference_error > 0.0) {
        notes.push("within an f32 evaluation's error".to_string());
    }
    let near: usize = r.outputs.iter().map(|o| o.near_decisions).sum();
    if near > 0 {
        notes.push(format!("{near} near a decision"));
    }
    if notes.is_empty() {
        "ok".into()
    } else {
        format!("ok ({})", notes.join("; "))
    }
}

impl BenchReport {
    /// Rank correlation of predicted against measured time over every plan (fused and unfused).
    pub fn rank_correlation(&self) -> Option<f64> {
        let (p, m): (Vec<f64>, Vec<f64>) = self
            .rows
            .iter()
            .flat_map(|r| {
                [
                    (r.fused.total_predicted_us, r.fused.total_measured_us),
                    (r.unfused.total_predicted_us, r.unfused.total_measured_us),
                ]
            })
            .unzip();
        spearman(&p, &m)
    }

    pub fn to_json(&self) -> Value {
        let report = |r: &GpuRunReport, bytes: u64| {
            let per_kernel: Vec<Value> = r
                .kernels
                .iter()
                .map(|k| {
                    json!({"name": k.name, "id": k.id, "bytes": k.bytes, "predicted_us": k.predicted_us,
                                "measured_us": k.measured_us,
                                "copy_share": r.copy_bandwidth_gbs.map(|c| k.achieved_gbs / c)})
                })
                .collect();
            json!({"kernels": r.kernels.len(), "bytes": bytes, "predicted_us": r.total_predicted_us,
                   "measured_us": r.total_measured_us, "ok": r.ok(),
                   "near_decisions": r.outputs.iter().map(|o| o.near_decisions).sum::<usize>(),
                   "within_reference_error": r.outputs.iter().any(|o| o.reference_error > 0.0),
                   "per_kernel": per_kernel})
        };
        json!({
            "schema": "eqfuse.bench/1",
            "device": self.device,
            "copy_bandwidth_gbs": self.copy_bandwidth_gbs,
            "profile_copy_bandwidth_gbs": self.profile_copy_bandwidth_gbs,
            "programs": self.rows.iter().map(|r| json!({
                "program": r.program,
                "fused": report(&r.fused, r.fused_bytes),
                "unfused": report(&r.unfused, r.unfused_bytes),
                "speedup_measured": r.speedup_measured(),
                "speedup_predicted": r.speedup_predicted(),
                "speedup_error": r.speedup_error(),
                "copy_share": r.copy_share(),
            })).collect::<Vec<_>>(),
            "rank_correlation": self.rank_correlation(),
        })
    }
}

impl fmt::Display for BenchReport {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        let mut t = comfy_table::Table::new();
        t.load_preset(comfy_table::presets::UTF8_FULL_CONDENSED);
        t.set_header(vec![
            "program",
            "kernels",
            "fused us (pred)",
            "unfused us (pred)",
            "speedup",
            "predicted",
            "of copy bw",
            "check",
        ]);
        for r in &self.rows {
            t.add_row(vec![
                r.program.clone(),
                format!("{} / {}", r.fused.kernels.len(), r.unfused.kernels.len()),
                format!("{:.1} ({:.1})", r.fused.total_measured_us, r.fused.total_predicted_us),
                format!("{:.1} ({:.1})", r.unfused.total_measured_us, r.unfused.total_predicted_us),
                format!("{:.2}x", r.speedup_measured()),
                format!("{:.2}x", r.speedup_predicted()),
                r.copy_share().map_or("-".into(), |s| format!("{:.0}%", 100.0 * s)),
                check_cell(&r.fused),
            ]);
        }
        writeln!(f, "bench on {}\n{t}", self.device)?;
        writeln!(
            f,
            "copy bandwidth measured in this run: {:.0} GB/s (the profile's: {:.0} GB/s); shares of copy \
             bandwidth are against the measured one",
            self.copy_bandwidth_gbs, self.profile_copy_bandwidth_gbs
        )?;
        match self.rank_correlation() {
            Some(rho) => writeln!(f, "rank correlation of predicted and measured time: {rho:.3}"),
            None => writeln!(f, "rank correlation: too few plans"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spearman_of_monotone_and_reversed_lists() {
        assert_eq!(spearman(&[1.0, 2.0, 3.0], &[10.0, 20.0, 35.0]), Some(1.0));
        assert_eq!(spearman(&[1.0, 2.0, 3.0], &[3.0, 2.0, 1.0]), Some(-1.0));
        assert_eq!(spearman(&[1.0], &[1.0]), None);
        let r = spearman(&[1.0, 2.0, 3.0, 4.0], &[1.0, 3.0, 2.0, 4.0]).unwrap();
        assert!((r - 0.8).abs() < 1e-12);
    }
}
