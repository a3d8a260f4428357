//! Written-out attention under `grad` (issue 20): the autodiff pass recognises
//! `softmax(q @ kᵀ * scale [+ bias] [masked]) @ v` in its spellings and differentiates it as the
//! composite it equals, so the backward plans as the flash-style kernels (`attention_grad_*`,
//! their bias and dropout forms) and no `[.., S, S]` tensor is written; every plan agrees with
//! the reference. (That the recognised gradients equal the primitive VJPs' is tested beside the
//! recogniser, `src/autodiff/attention.rs`, which can turn it off.)

use eqfuse::{eval, eval_plan, parse_program, random_inputs, DeviceProfile, OptimizeOptions, Program};

/// The spellings: (name, the lines defining `p` from q, k, v and the extra inputs, the backward
/// composite expected).
const SPELLINGS: &[(&str, &str, &str)] = &[
    ("divided", "p = softmax(q @ transpose(k, 2, 3) / 8, -1)", "attention_grad_q"),
    ("scaled queries", "p = softmax((q * 0.125) @ transpose(k, -2, -1), -1)", "attention_grad_q"),
    (
        "decomposed",
        "s = q @ transpose(k, -1, -2) * 0.125\ne = exp(s - amax(s, -1))\np = e / sum(e, -1)",
        "attention_grad_q",
    ),
    (
        "causal where",
        "row = reshape(iota(S), [S, 1])\np = softmax(where(iota(S) <= row, q @ transpose(k, -1, -2) * 0.125, -1e30), -1)",
        "attention_grad_q",
    ),
    (
        "causal bias",
        "row = reshape(iota(S), [S, 1])\nmask = cast(where(iota(S) > row, -1e30, 0), bf16)\n\
         p = softmax(q @ transpose(k, 2, 3) * 0.125 + mask, -1)",
        "attention_grad_q",
    ),
    ("bias", "input b: bf16[B, 1, 1, S]\np = softmax(q @ transpose(k, 2, 3) * 0.125 + b, -1)", "attention_bias_grad_q"),
    (
        "f32 bias",
        "input b: f32[B, 1, 1, S]\np = cast(softmax(cast(q @ transpose(k, 2, 3) * 0.125, f32) + b, -1), bf16)",
        "attention_bias_grad_q",
    ),
    (
        "bool mask",
        "input m: bool[B, 1, 1, S]\np = softmax(where(m, q @ transpose(k, 2, 3) / sqrt(64), -1e9), -1)",
        "attention_bias_grad_q",
    ),
    ("dropout", "p = dropout(softmax(q @ transpose(k, 2, 3) * 0.125, -1), 0.1, 7)", "attention_dropout_grad_q"),
];

/// `o = p @ v` with `p` as `body` defines it, the loss `sum(o * dy)` and the gradients of q, k, v
/// (and `p` among the outputs with `p_out`).
fn program(dims: (usize, usize, usize, usize), body: &str, p_out: bool) -> Program {
    let (b, h, s, d) = dims;
    let out = if p_out { "output o, p, dq, dk, dv" } else { "output o, dq, dk, dv" };
    let text = format!(
        "dim B = {b}\ndim H = {h}\ndim S = {s}\ndim D = {d}\n\
         input q: bf16[B, H, S, D]\ninput k: bf16[B, H, S, D]\ninput v: bf16[B, H, S, D]\ninput dy: bf16[B, H, S, D]\n\
         {body}\no = p @ v\nloss = sum(sum(sum(sum(cast(o, f32) * cast(dy, f32), -1), -2), -3), -4)\n\
         dq = grad(loss, q)\ndk = grad(loss, k)\ndv = grad(loss, v)\n{out}\n"
    );
    parse_program("written.eqf", &text, &[]).unwrap_or_else(|e| panic!("{e}"))
}

fn optimize(p: &Program) -> eqfuse::FusionPlan {
    eqfuse::optimize(p, &OptimizeOptions::new(DeviceProfile::load("h100").unwrap())).unwrap().plan
}

/// At the size of issue 20's example (bf16, 8 x 12 heads of 1024 x 64), every spelling plans as
/// the attention forward, the `delta` row kernel and the backward composite's kernel (the bias
/// forms' statistics in one more), and no kernel reads or writes a tensor of the score matrix's
/// size: the primitive backward wrote it 8 kernels over (977.6 us predicted for the first).
/// Their kernels compile with NVRTC (where it is available).
#[test]
fn each_spelling_plans_its_backward_as_the_flash_kernels() {
    let dims = (8, 12, 1024, 64);
    let scores = 8 * 12 * 1024 * 1024;
    for &(name, body, composite) in SPELLINGS {
        let plan = optimize(&program(dims, body, false));
        let ops: Vec<Vec<String>> = plan.kernels.iter().map(|k| k.ops.clone()).collect();
        let grads: Vec<_> = plan.kernels.iter().filter(|k| k.ops.iter().any(|o| o == composite)).collect();
        assert_eq!(grads.len(), 1, "{name}: {ops:?}");
        assert_eq!(grads[0].writes.len(), 3, "{name}: dq, dk and dv in one kernel: {ops:?}");
        for k in &plan.kernels {
            for t in k.reads.iter().chain(&k.writes) {
                assert!(t.ty.numel() < scores / 8, "{name}: kernel {} moves {} {}", k.id, t.name, t.ty);
            }
        }
        let bias = composite.starts_with("attention_bias");
        assert!(plan.total.kernels <= if bias { 4 } else { 3 }, "{name}: {ops:?}");
        assert!(plan.total.predicted_us < 420.0, "{name}: {} us predicted", plan.total.predicted_us);
        let sources = eqfuse::codegen_plan(&plan).unwrap_or_else(|e| panic!("{name}: {e}"));
        if eqfuse::nvrtc_available().is_ok() {
            for src in &sources {
                let c = eqfuse::nvrtc_compile(&src.source, &src.file, eqfuse::DEFAULT_ARCH, &[])
                    .unwrap_or_else(|e| panic!("{name}: {}: {e}", src.name));
                assert!(c.log.trim().is_empty(), "{name}: {}: warnings\n{}", src.name, c.log);
            }
        }
    }
}

/// The probabilities also an output: the forward writes them (their scores, then their softmax,
/// as it would without `grad`), and the backward is still the flash kernels, which read no
/// tensor of the score matrix's size.
#[test]
fn probabilities_used_elsewhere_keep_the_flash_backward() {
    let plan = optimize(&program((8, 12, 1024, 64), "p = softmax(q @ transpose(k, 2, 3) * 0.125, -1)", true));
    let ops: Vec<Vec<String>> = plan.kernels.iter().map(|k| k.ops.clone()).collect();
    let scores = 8 * 12 * 1024 * 1024;
    let backward: Vec<_> =
        plan.kernels.iter().filter(|k| k.ops.iter().any(|o| o.starts_with("attention_grad"))).collect();
    assert_eq!(backward.len(), 1, "{ops:?}");
    for t in backward[0].reads.iter().chain(&backward[0].writes) {
        assert!(t.ty.numel() < scores / 8, "the backward moves {} {}: {ops:?}", t.name, t.ty);
    }
    let big = plan.kernels.iter().filter(|k| k.writes.iter().any(|t| t.ty.numel() >= scores)).count();
    assert!(big <= 2, "only the forward's scores and p: {ops:?}");
}

/// Every spelling's plan (small sizes), strict or not, evaluates kernel by kernel to the
/// program's values on the reference.
#[test]
fn plans_of_written_attention_agree_with_the_reference() {
    for &(name, body, _) in SPELLINGS {
        let p = program((2, 2, 40, 16), body, false);
        let inputs = random_inputs(&p, 9);
        let want = eval(&p, &inputs).unwrap();
        for strict in [false, true] {
            let mut opts = OptimizeOptions::new(DeviceProfile::load("h100").unwrap());
            opts.strict = strict;
            let plan = eqfuse::optimize(&p, &opts).unwrap().plan;
            let fused = plan.kernels.iter().any(|k| k.ops.iter().any(|o| o.starts_with("attention_")));
            assert_eq!(fused, !strict, "{name}, strict {strict}: strict plans expand attention");
            let got = eval_plan(&plan, &inputs).unwrap();
            for ((o, g), w) in p.outputs.iter().zip(&got).zip(&want) {
                let scale = w.data.iter().fold(1.0f64, |m, v| m.max(v.abs()));
                let cmp = g.compare(w, 3e-2, 3e-2 * scale);
                assert!(cmp.ok(), "{name}, strict {strict}, {}: {cmp}", o.name);
            }
        }
    }
}

/// Keys stored transposed (`q @ kt`, `kt: [B, H, D, S]`) and a bool mask beside the causal one:
/// the backward is the flash composite's kernel (its key gradient transposed back to `kt`),
/// reading and writing no tensor of the score matrix's size, and every plan, strict or not,
/// evaluates to the program's values on the reference. (Their forward is planned as written.)
#[test]
fn keys_stored_transposed_and_a_mask_beside_the_causal_one_use_the_flash_backward() {
    let cases: &[(&str, &str, &str, &str)] = &[
        ("keys transposed", "kt", "p = softmax(q @ kt * 0.125, -1)", "attention_grad_q"),
        (
            "keys transposed, padding mask",
            "kt",
            "input m: bool[B, 1, 1, S]\np = softmax(where(m, q @ kt / 8, -1e9), -1)",
            "attention_bias_grad_q",
        ),
        (
            "causal and a padding mask",
            "k",
            "row = reshape(iota(S), [S, 1])\n\
             p = softmax(where(iota(S) <= row, where(iota(S) < S - 3, q @ transpose(k, 2, 3) * 0.125, -1e9), -1e30), -1)",
            "attention_bias_grad_q",
        ),
    ];
    for &(name, keys, body, composite) in cases {
        let text = |(b, h, s, d): (usize, usize, usize, usize)| {
            let key_type = if keys == "kt" { "bf16[B, H, D, S]" } else { "bf16[B, H, S, D]" };
            format!(
                "dim B = {b}\ndim H = {h}\ndim S = {s}\ndim D = {d}\n\
                 input q: bf16[B, H, S, D]\ninput {keys}: {key_type}\ninput v: bf16[B, H, S, D]\ninput dy: bf16[B, H, S, D]\n\
                 {body}\no = p @ v\nloss = sum(sum(sum(sum(cast(o, f32) * cast(dy, f32), -1), -2), -3), -4)\n\
                 dq = grad(loss, q)\ndk = grad(loss, {keys})\ndv = grad(loss, v)\noutput o, dq, dk, dv\n"
            )
        };
        let parse = |dims| parse_program("written.eqf", &text(dims), &[]).unwrap_or_else(|e| panic!("{name}: {e}"));
        let big = optimize(&parse((8, 12, 1024, 64)));
        let ops: Vec<Vec<String>> = big.kernels.iter().map(|k| k.ops.clone()).collect();
        let grads: Vec<_> = big.kernels.iter().filter(|k| k.ops.iter().any(|o| o == composite)).collect();
        assert_eq!(grads.len(), 1, "{name}: {ops:?}");
        for t in grads[0].reads.iter().chain(&grads[0].writes) {
            assert!(t.ty.numel() < 8 * 12 * 1024 * 1024 / 8, "{name}: the backward moves {} {}", t.name, t.ty);
        }
        let sources = eqfuse::codegen_plan(&big).unwrap_or_else(|e| panic!("{name}: {e}"));
        if eqfuse::nvrtc_available().is_ok() {
            for src in &sources {
                let c = eqfuse::nvrtc_compile(&src.source, &src.file, eqfuse::DEFAULT_ARCH, &[])
                    .unwrap_or_else(|e| panic!("{name}: {}: {e}", src.name));
                assert!(c.log.trim().is_empty(), "{name}: {}: warnings\n{}", src.name, c.log);
            }
        }
        let p = parse((2, 2, 40, 16));
        let inputs = random_inputs(&p, 9);
        let want = eval(&p, &inputs).unwrap();
        for strict in [false, true] {
            let mut opts = OptimizeOptions::new(DeviceProfile::load("h100").unwrap());
            opts.strict = strict;
            let plan = eqfuse::optimize(&p, &opts).unwrap().plan;
            let got = eval_plan(&plan, &inputs).unwrap();
            for ((o, g), w) in p.outputs.iter().zip(&got).zip(&want) {
                let scale = w.data.iter().fold(1.0f64, |m, v| m.max(v.abs()));
                let cmp = g.compare(w, 3e-2, 3e-2 * scale);
                assert!(cmp.ok(), "{name}, strict {strict}, {}: {cmp}", o.name);
            }
        }
    }
}
