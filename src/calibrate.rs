//! `eqfuse calibrate`: the device profile's numbers, measured on the GPU at hand.
//!
//! Copy bandwidth is a large device-to-device copy (bytes read plus bytes written); launch
//! overhead is the time per launch of an empty kernel launched back to back; each generated
//! template's bandwidth efficiency is its achieved bandwidth on a large synthetic kernel
//! (at least 256 MB moved) as a share of the copy bandwidth. Arithmetic rates, and the gemm and
//! attention templates (not generated yet), keep the base profile's figures, which the profile's
//! `source` says.
//! Invariant: calibration only measures; it never changes a committed profile itself (the
//! caller writes the JSON where asked).

use std::fmt;

use crate::codegen::codegen_plan;
use crate::error::{Error, Result};
use crate::gpu::Gpu;
use crate::optimize::{optimize, OptimizeOptions};
use crate::plan::{GemmImpl, Template};
use crate::profile::{DeviceProfile, TemplateRates};
use crate::program::Program;
use crate::run_gpu::{run_on, GpuRunOptions};
use crate::types::{DType, TensorType};

/// One gemm implementation's measured rate: (implementation, dtype, program, median
/// microseconds, TFLOP/s).
pub type GemmRate = (GemmImpl, DType, String, f64, f64);

/// What calibration measured, and the profile made from it.
#[derive(Clone, Debug)]
pub struct Calibration {
    pub profile: DeviceProfile,
    pub copy_bytes: u64,
    /// Median time of one copy of `copy_bytes` bytes.
    pub copy_us: f64,
    pub launch_us: f64,
    /// (template, program, bytes moved, median microseconds, share of copy bandwidth).
    pub templates: Vec<(Template, String, u64, f64, f64)>,
    /// (gemm implementation, dtype, program, median microseconds, TFLOP/s).
    pub gemm: Vec<GemmRate>,
}

/// Calibrates device 0 against the built-in profile of its kind (`h100`, `h200`, else `h100`).
pub fn calibrate() -> Result<DeviceProfile> {
    let gpu = Gpu::open()?;
    let base = DeviceProfile::load(&short_name(&gpu.name)).or_else(|_| DeviceProfile::load("h100"))?;
    Ok(calibrate_on(&gpu, &base)?.profile)
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
    let copy_bytes = copy_bytes(gpu);
    let copy_us = copy_time(gpu, copy_bytes as usize)?;
    let copy_gbs = 2.0 * copy_bytes as f64 / (copy_us * 1e3);
    let launch_us = launch_time(gpu)?;
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
        let opts =
            GpuRunOptions { repeat: 30, check: false, profile: Some(profile.clone()), ..GpuRunOptions::default() };
        let r = run_on(gpu, &program, &plan, &sources, &opts)?;
        let k = &r.kernels[0];
        let share = (k.achieved_gbs / copy_gbs).min(1.0);
        if let Some(rates) = profile.templates.get_mut(template.name()) {
            rates.bandwidth_efficiency = round(share, 3);
        }
        templates.push((template, program.source.clone(), k.bytes, k.measured_us, share));
    }
    let gemm = gemm_rates(gpu, &mut profile)?;
    profile.source = format!(
        "calibrated by `eqfuse calibrate` on {} ({}, {}): copy bandwidth, launch overhead, the elementwise, rowreduce and colreduce efficiencies and the gemm implementations' f32 and bf16 rates measured; the other arithmetic rates, the attention row and the plan-order terms (L2 reuse capacity and bandwidth, row stage latency, cuBLASLt call overhead, generated-gemm tile step times) kept from the previous profile",
        today(),
        gpu.name,
        gpu.arch
    );
    Ok(Calibration { profile, copy_bytes, copy_us, launch_us, templates, gemm })
}

/// The arithmetic rate of each gemm implementation on a large square product per dtype
/// (compute-bound: 4096 cubed), written into the gemm template's `implementations`.
fn gemm_rates(gpu: &Gpu, profile: &mut DeviceProfile) -> Result<Vec<GemmRate>> {
    let mut out = Vec::new();
    for dtype in [DType::F32, DType::Bf16] {
        let n = 4096;
        let t = TensorType::new(dtype, vec![n, n]);
        let name = format!("calibrate-gemm-{dtype}");
        let program =
            Program::from_sexprs(&name, &[("x", t.clone()), ("w", t)], &[("y", "(@ x w)")]).map_err(Error::Invalid)?;
        let mut plan = optimize(&program, &OptimizeOptions::new(profile.clone()))?.plan;
        if plan.kernels.len() != 1 || plan.kernels[0].template != Template::Gemm {
            return Err(Error::Invalid(format!("calibration program {name} did not plan as one gemm kernel")));
        }
        for imp in [GemmImpl::Cublaslt, GemmImpl::Generated] {
            // Calibration measures each implementation, whichever the planner would pick.
            plan.kernels[0].implementation = Some(imp);
            let sources = codegen_plan(&plan)?;
            let opts =
                GpuRunOptions { repeat: 10, check: false, profile: Some(profile.clone()), ..GpuRunOptions::default() };
            let r = run_on(gpu, &program, &plan, &sources, &opts)?;
            let us = r.kernels[0].measured_us;
            let tflops = plan.kernels[0].flops as f64 / (us * 1e6);
            let g = profile.templates.entry(Template::Gemm.name().into()).or_insert_with(|| TemplateRates {
                bandwidth_efficiency: 0.8,
                flops_f32_tflops: tflops,
                flops_bf16_tflops: None,
                implementations: Default::default(),
                stage_latency_us: None,
                call_overhead_us: None,
                tiles: Default::default(),
                tiles_16bit: Default::default(),
                tiles_mma: Default::default(),
            });
            let base = TemplateRates { implementations: Default::default(), ..g.clone() };
            let rates = g.implementations.entry(imp.name().into()).or_insert(base);
            match dtype {
                DType::F32 => rates.flops_f32_tflops = round(tflops, 1),
                _ => rates.flops_bf16_tflops = Some(round(tflops, 1)),
            }
            out.push((imp, dtype, name.clone(), us, tflops));
        }
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

/// Microseconds per launch of an empty kernel, launched back to back.
fn launch_time(gpu: &Gpu) -> Result<f64> {
    let f = gpu.load_raw("extern \"C\" __global__ void eq_empty() {}\n", "eq_empty")?;
    let (a, b) = (gpu.event()?, gpu.event()?);
    let n = 2000;
    let mut times = Vec::new();
    for _ in 0..5 {
        gpu.record(&a)?;
        for _ in 0..n {
            gpu.launch_empty(&f, 1, 32)?;
        }
        gpu.record(&b)?;
        times.push(gpu.elapsed_us(&a, &b)? / n as f64);
    }
    Ok(median(times))
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
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
            crate::render::human_bytes(self.copy_bytes),
            self.copy_us
        )?;
        writeln!(f, "  launch overhead  {:.2} us per empty kernel, back to back", self.launch_us)?;
        for (t, prog, bytes, us, share) in &self.templates {
            writeln!(
                f,
                "  {:<12} {:>5.1}% of copy bandwidth ({prog}: {} in {us:.1} us)",
                t.name(),
                100.0 * share,
                crate::render::human_bytes(*bytes)
            )?;
        }
        for (imp, dtype, prog, us, tflops) in &self.gemm {
            writeln!(f, "  gemm {:<9} {dtype:<4} {tflops:>6.1} TFLOP/s ({prog}: {us:.1} us)", imp.name())?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn dates() {
        assert_eq!(today().len(), 10);
    }
}
