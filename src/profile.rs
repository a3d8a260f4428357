//! `DeviceProfile`: the measured numbers of one GPU that the cost model reads.
//!
//! Profiles are data (`profiles/*.json`), written by `eqfuse calibrate` on the GPU and committed;
//! the built-in `h100` and `h200` are embedded. Invariant: the planner reads machine numbers only
//! from a profile, never from constants in code.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::plan::{GemmImpl, Template};
use crate::types::DType;

/// Rates of one kernel template.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
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
}

/// One GPU's numbers.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
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
    /// Time from one launch to the next for an empty kernel, in microseconds.
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
    pub templates: BTreeMap<String, TemplateRates>,
    /// Plans for strict numerics (not part of the file): matrix products take the generated
    /// kernel, whose accumulation order does not depend on the epilogue, never cuBLASLt.
    #[serde(skip)]
    pub strict: bool,
}

const H100: &str = include_str!("../profiles/h100.json");
const H200: &str = include_str!("../profiles/h200.json");

impl DeviceProfile {
    /// `h100`, `h200`, or a path to a profile JSON file.
    pub fn load(spec: &str) -> Result<DeviceProfile> {
        match spec {
            "h100" => DeviceProfile::parse("profiles/h100.json", H100),
            "h200" => DeviceProfile::parse("profiles/h200.json", H200),
            path => {
                let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
                DeviceProfile::parse(path, &text)
            }
        }
    }

    pub fn parse(file: &str, text: &str) -> Result<DeviceProfile> {
        let p: DeviceProfile = serde_json::from_str(text).map_err(|e| {
            Error::input(crate::error::Diagnostic::at(
                file,
                text,
                e.line(),
                e.column(),
                format!("bad device profile: {e}"),
            ))
        })?;
        for t in Template::ALL {
            if !p.templates.contains_key(t.name()) {
                return Err(Error::Invalid(format!("{file}: device profile has no rates for template `{}`", t.name())));
            }
        }
        if p.copy_bandwidth_gbs <= 0.0 || p.launch_overhead_us < 0.0 {
            return Err(Error::Invalid(format!("{file}: bandwidth must be positive and launch overhead non-negative")));
        }
        Ok(p)
    }

    pub fn rates(&self, t: Template) -> &TemplateRates {
        &self.templates[t.name()]
    }

    /// The rates of one gemm implementation (the gemm template's own where the profile has none).
    pub fn gemm_rates(&self, imp: GemmImpl) -> &TemplateRates {
        let g = self.rates(Template::Gemm);
        g.implementations.get(imp.name()).unwrap_or(g)
    }

    /// Predicted time of a gemm kernel in implementation `imp`, in microseconds.
    pub fn gemm_us(&self, imp: GemmImpl, bytes: u64, flops: u64, dtype: DType) -> f64 {
        let r = self.gemm_rates(imp);
        let memory = bytes as f64 / (self.copy_bandwidth_gbs * 1e9 * r.bandwidth_efficiency);
        self.launch_overhead_us + 1e6 * memory.max(flops as f64 / (rate_tflops(r, dtype) * 1e12))
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

    #[test]
    fn builtin_profiles_load() {
        for name in ["h100", "h200"] {
            let p = DeviceProfile::load(name).unwrap();
            assert_eq!(p.name, name);
        }
        assert!(DeviceProfile::load("/nonexistent/profile.json").is_err());
    }
}
