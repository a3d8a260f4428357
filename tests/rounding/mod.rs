//! Rounding measures shared by the CPU and GPU differential tests (`tests/differential.rs`,
//! `tests/gpu_differential.rs`): how far a result is from the f64 values, and how much error a
//! few roundings may explain.

use std::collections::HashMap;

use eqfuse::{eval_all, kernel_program, DType, FusionPlan, Tensor};

/// The largest distance of `t` from `exact`, and where it is.
pub fn worst_error(t: &Tensor, exact: &Tensor) -> (f64, usize) {
    let errors = t.data.iter().zip(&exact.data).map(|(a, x)| (a - x).abs());
    errors.enumerate().fold((0.0, 0), |(m, at), (i, e)| if e > m || e.is_nan() { (e, i) } else { (m, at) })
}

/// The unit roundoff of a float dtype (half the distance from 1 to the next value).
pub fn unit_roundoff(d: DType) -> f64 {
    match d {
        DType::F32 => f64::powi(2.0, -24),
        DType::F16 => f64::powi(2.0, -11),
        DType::Bf16 => f64::powi(2.0, -8),
        DType::I32 | DType::Bool => 0.0,
    }
}

/// The forward error a few roundings may cause in a plan: 8 units of roundoff of its narrowest
/// float dtype times the largest magnitude any of its kernels computes.
pub fn rounding_allowance(plan: &FusionPlan, inputs: &HashMap<String, Tensor>) -> f64 {
    let (mut unit, mut largest) = (0.0f64, 0.0f64);
    let mut env = inputs.clone();
    for k in &plan.kernels {
        let Ok(p) = kernel_program(k) else { return 0.0 };
        let args: HashMap<String, Tensor> =
            k.reads.iter().filter_map(|r| Some((r.name.clone(), env.get(&r.name)?.clone()))).collect();
        let Ok(values) = eval_all(&p, &args) else { return 0.0 };
        for t in values.iter().flatten().filter(|t| t.dtype.is_float()) {
            unit = unit.max(unit_roundoff(t.dtype));
            largest = t.data.iter().filter(|v| v.is_finite()).fold(largest, |m, v| m.max(v.abs()));
        }
        for (w, o) in k.writes.iter().zip(&p.outputs) {
            if let Some(t) = &values[usize::from(o.id)] {
                env.insert(w.name.clone(), t.clone());
            }
        }
    }
    8.0 * unit * largest
}
