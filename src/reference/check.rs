//! Checking a device's results against the reference: each output's largest absolute error
//! relative to its largest reference value, within a tolerance of its dtype (f32 widened with
//! the program's longest product contraction, f16 and bf16 1e-2, integers exact); an output
//! outside it is compared again with the unrounded reference, then allowing a straightforward
//! f32 evaluation's own error, then leaving out elements that follow a comparison rounding could
//! decide either way ([`check`]).

use std::collections::HashMap;

use crate::error::Result;
use crate::ir::lang::{Kind, TensorLang};
use crate::ir::program::Program;
use crate::ir::tensor::Tensor;
use crate::ir::types::{DType, TensorType};

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

/// Tolerance of a dtype, relative to the largest reference value, for a program whose longest
/// matrix-product contraction is `k` (0 without products). An f32 dot product of `k` terms
/// rounds once per addition, so its error grows with `k` (Higham's bound is k·u times the sum
/// of the terms' magnitudes, u = 2^-24) while the reference sums in f64: f32 outputs get
/// max(1e-5, k·u), which is 1e-5 up to k = 167 and 6.1e-5 at k = 1024.
pub fn tolerance(d: DType, k: usize) -> f64 {
    match d {
        DType::F32 => 1e-5f64.max(k as f64 * f64::powi(2.0, -24)),
        DType::F16 | DType::Bf16 => 1e-2,
        DType::I32 | DType::Bool => 0.0,
    }
}

/// The longest contraction of any matrix product in the program, or sum in an order the device
/// schedules (attention's gradients, `scatter_add`); 0 if none.
pub fn longest_contraction(program: &Program) -> usize {
    let nodes = program.expr().as_ref();
    let mut k = 0;
    for n in nodes {
        if let TensorLang::Op(code, ch) = n {
            if code.kind() == Kind::MatMul {
                let a = program.ty(ch[0]);
                k = k.max(a.and_then(|t| t.shape.last().copied()).unwrap_or(0));
            }
            // Attention's gradients sum over every query (keys) or key (queries).
            if matches!(code.kind(), Kind::Composite(c) if c.is_attention_backward()) {
                let rows = |c: egg::Id| program.ty(c).and_then(|t| t.shape.iter().rev().nth(1).copied()).unwrap_or(0);
                k = k.max(rows(ch[0])).max(rows(ch[1]));
            }
            // A scatter_add sums one value per index into an element, in the order its atomics
            // land on the GPU (one after another, not pairwise): as many terms as indices.
            if code.kind() == Kind::ScatterAdd {
                k = k.max(program.ty(ch[0]).map_or(0, |t| t.numel()));
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
pub fn check(
    program: &Program,
    inputs: &HashMap<String, Tensor>,
    got: &[(String, Tensor)],
) -> Result<Vec<OutputCheck>> {
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
pub const REFERENCE_ERROR_FACTOR: f64 = 4.0;

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

/// Whether each output of `a` is within its dtype's tolerance of `b`'s, relative to `b`'s largest
/// magnitude (`k`: the program's longest contraction, as `tolerance` takes it).
pub fn close_to(a: &[(String, Tensor)], b: &[(String, Tensor)], k: usize) -> bool {
    a.len() == b.len()
        && a.iter().zip(b).all(|((_, x), (_, y))| {
            let scale = y.data.iter().filter(|v| v.is_finite()).fold(0.0f64, |m, v| m.max(v.abs()));
            x.shape == y.shape && x.compare(y, 0.0, tolerance(y.dtype, k) * scale).ok()
        })
}

#[cfg(test)]
mod tests {
    use super::*;

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
