//! What the CPU and GPU differential tests (`tests/differential.rs`, `tests/gpu_differential.rs`)
//! share: how far a result is from the f64 values, how much error a few roundings may explain,
//! and the case files failing programs are saved as.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use eqfuse::{eval_all, kernel_program, DType, FusionPlan, Recipe, Tensor};

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

/// A case file: the program with a header saying how it was found (`what`, `origin`) and what
/// failed.
pub fn case_text(recipe: &Recipe, why: &str, what: &str, origin: &str) -> String {
    let mut head = format!("# {what}: {origin}\n");
    for line in why.lines() {
        head += &format!("# failed: {line}\n");
    }
    head += &format!("# input-seed: {}\n", recipe.input_seed);
    head + &recipe.render()
}

/// Saves a failing case in `dir`, named by a hash of its program.
pub fn save_case(dir: &Path, recipe: &Recipe, why: &str, what: &str, origin: &str) -> PathBuf {
    let text = recipe.render();
    let hash = text.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3));
    std::fs::create_dir_all(dir).expect("case folder");
    let path = dir.join(format!("case_{:08x}.eqf", hash as u32));
    std::fs::write(&path, case_text(recipe, why, what, origin)).expect("case file");
    path
}
