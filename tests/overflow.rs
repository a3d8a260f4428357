//! Plans keep the numerical safeguards programs are written with: a softmax subtracts its
//! maximum before `exp` so that large logits do not overflow, and a plan may not trade that for
//! a faster form (`exp(x - m)` as `exp(x) * exp(-m)` is infinite times zero past x = 88 in f32).
//! Each program runs with logits of hundreds on the CPU, plan against reference.

use eqfuse::{check_plan, optimize, random_inputs, DeviceProfile, OptimizeOptions, Program, Tensor};

fn scaled(program: &Program, seed: u64, by: f64) -> std::collections::HashMap<String, Tensor> {
    let mut inputs = random_inputs(program, seed);
    for t in inputs.values_mut() {
        if t.dtype.is_float() {
            for v in t.data.iter_mut() {
                *v *= by;
            }
        }
    }
    inputs
}

/// Plans each program and checks every output against the reference, the float inputs
/// scaled by `by` (seeds from `seed0` on).
fn assert_plans_match_at_scale(programs: &[&str], seed0: u64, by: f64) {
    let opts = OptimizeOptions::new(DeviceProfile::load("h100").unwrap());
    for (i, text) in programs.iter().enumerate() {
        let p = eqfuse::parse_program("p", text, &[]).unwrap_or_else(|e| panic!("{text}: {e}"));
        let plan = optimize(&p, &opts).unwrap().plan;
        let inputs = scaled(&p, seed0 + i as u64, by);
        for (name, c) in check_plan(&p, &plan, &inputs).unwrap() {
            let bodies: Vec<_> = plan.kernels.iter().map(|k| &k.body).collect();
            assert!(c.ok(), "{text}: output {name}: {c:?}\n{bodies:#?}");
        }
    }
}

#[test]
fn softmaxes_of_large_logits_stay_finite_in_every_plan() {
    let programs = [
        // Classes along axis 0 (a column kernel): the single pass `exp-add` made possible.
        "input x: f32[100, 512]\ninput t: i32[512]\n\
         lp = log_softmax(x, 0)\n\
         loss = neg(sum(sum(lp * transpose(onehot(t, 100), 0, 1), 0), 1)) / 512\noutput loss\n",
        "input x: f32[64, 300]\ny = softmax(x, 0)\noutput y\n",
        "input x: f32[64, 300]\ny = log_softmax(x, -1)\noutput y\n",
        "input x: f32[64, 300]\nm = amax(x, -1)\ne = exp(x - m)\ny = e / sum(e, -1)\noutput y\n",
        "input x: f32[300, 64]\nm = amax(x, 0)\ny = log(sum(exp(x - m), 0)) + m\noutput y\n",
        "input x: f32[64, 300]\ninput t: i32[64]\nl = cross_entropy(x, t)\noutput l\n",
    ];
    assert_plans_match_at_scale(&programs, 7, 200.0);
}

/// Nor a sum of logarithms for the logarithm of a product: with values past 1.8e19 the product
/// overflows f32 where each logarithm is about 46.
#[test]
fn sums_of_logarithms_of_large_values_stay_finite() {
    let programs = [
        "input x: f32[64, 300]\ninput z: f32[64, 300]\ny = log(abs(x) + 1) + log(abs(z) + 1)\noutput y\n",
        "input x: f32[64, 300]\ninput z: f32[64, 300]\ny = log(abs(x) + 1) - log(1 / (abs(z) + 1))\noutput y\n",
    ];
    assert_plans_match_at_scale(&programs, 11, 1e20);
}
