//! Attention with dropout of its probabilities (`attention_dropout`, `attention_bias_dropout`
//! and their backward composites): the composites drop exactly the elements `dropout` drops
//! from the written probabilities, the pattern rules plan written spellings as one kernel, the
//! gradients agree with finite differences and with the decomposed backward, and the expansion
//! and every plan agree with the reference.

use std::collections::HashMap;

mod common;

use eqfuse::{
    eval, eval_plan, eval_with, parse_program, random_inputs, DType, DeviceProfile, OptimizeOptions, Precision,
    Program, Tensor,
};

fn ops(p: &Program) -> Vec<&'static str> {
    p.expr().as_ref().iter().filter_map(|n| n.opcode()).map(|c| c.name()).collect()
}

fn parse(text: &str) -> Program {
    parse_program("drop.eqf", text, &[]).unwrap_or_else(|e| panic!("{e}\n{text}"))
}

/// The causal mask of `[S, S]` scores written from indices, for the decomposed spellings.
const CAUSAL: &str = "row = reshape(iota(S), [S, 1])\ncol = iota(S)\n";

/// With values the identity (`v = I`, head size = keys), attention's output is its (dropped)
/// probabilities: `attention_dropout` gives exactly the zeros of `dropout(softmax(scores))` at
/// every batch index (two batch axes), query and key, causal or not, for a literal and a tensor
/// seed, and the same values; so does `attention_bias_dropout` with a padding bias.
#[test]
fn the_mask_is_dropouts_bit_for_bit() {
    for (causal, seed, p) in [(0, "s", 0.5), (1, "11", 0.1), (1, "s", 0.5), (0, "4294967295", 0.3)] {
        let scores = if causal == 1 {
            "where(col <= row, q @ transpose(k, -1, -2) * 0.3, -1e30)"
        } else {
            "q @ transpose(k, -1, -2) * 0.3"
        };
        let text = format!(
            "dim S = 9\ninput q: f32[2, 3, S, 4]\ninput k: f32[2, 3, S, 4]\ninput v: f32[2, 3, S, S]\n\
             input b: f32[2, 1, 1, S]\ninput s: i32[]\n{CAUSAL}\
             o1 = attention_dropout(q, k, v, 0.3, {causal}, {p}, {seed})\n\
             o2 = dropout(softmax({scores}, -1), {p}, {seed})\n\
             o3 = attention_bias_dropout(q, k, v, b, 0.3, {causal}, {p}, {seed})\n\
             o4 = dropout(softmax({scores} + b, -1), {p}, {seed})\noutput o1, o2, o3, o4\n"
        );
        let program = parse(&text);
        let mut inputs = random_inputs(&program, 3);
        let eye: Vec<f64> = (0..6 * 81).map(|i| if (i % 81) / 9 == i % 9 { 1.0 } else { 0.0 }).collect();
        inputs.insert("v".into(), Tensor::new(DType::F32, vec![2, 3, 9, 9], eye).unwrap());
        let out = eval_with(&program, &inputs, Precision::F64).unwrap();
        for (got, want, what) in [(&out[0], &out[1], "attention_dropout"), (&out[2], &out[3], "attention_bias_dropout")]
        {
            let dropped = want.data.iter().filter(|&&x| x == 0.0).count();
            assert!(dropped > 0 && dropped < want.numel(), "{what}: {dropped} of {} dropped", want.numel());
            for (i, (g, w)) in got.data.iter().zip(&want.data).enumerate() {
                assert_eq!(*g == 0.0, *w == 0.0, "{what} causal {causal} seed {seed}: element {i}: {g} vs {w}");
                assert!((g - w).abs() <= 1e-6 * w.abs().max(1.0), "{what}: element {i}: {g} vs {w}");
            }
        }
    }
}

/// Written attention with dropout of its probabilities, in the spellings the attention rules
/// take (scale by `*` or `/`, causal mask by `where`, an additive bias, a bool mask, an f32
/// softmax of bf16 operands with dropout before or after its cast back, heads split from
/// projections), plans as one `attention_dropout` or `attention_bias_dropout` kernel: no kernel
/// writes a tensor of the scores' size, and the plan evaluates (kernel by kernel) to the program.
#[test]
fn written_dropout_attention_plans_as_one_kernel() {
    let head = "dim S = 64\ninput q: bf16[2, 4, S, 32]\ninput k: bf16[2, 4, S, 32]\ninput v: bf16[2, 4, S, 32]\n\
                input s: i32[1]\ninput b: bf16[2, 1, 1, S]\ninput m: bool[2, 1, 1, S]\ninput bf: f32[2, 1, 1, S]\n";
    let sc = "q @ transpose(k, -1, -2)";
    let cases = [
        ("mul", format!("o = dropout(softmax({sc} * 0.125, -1), 0.1, s) @ v"), "attention_dropout"),
        ("div literal seed", format!("o = dropout(softmax({sc} / 8, -1), 0.5, 42) @ v"), "attention_dropout"),
        (
            "causal where",
            format!("{CAUSAL}o = dropout(softmax(where(col <= row, {sc} * 0.125, -1e30), -1), 0.1, s) @ v"),
            "attention_dropout",
        ),
        ("bias", format!("o = dropout(softmax({sc} * 0.125 + b, -1), 0.1, s) @ v"), "attention_bias_dropout"),
        (
            "bool mask",
            format!("o = dropout(softmax(where(m, {sc} * 0.125, -1e30), -1), 0.1, s) @ v"),
            "attention_bias_dropout",
        ),
        (
            "f32 softmax, dropout then cast",
            format!("o = cast(dropout(softmax(cast({sc} * 0.125, f32) + bf, -1), 0.1, s), bf16) @ v"),
            "attention_bias_dropout",
        ),
        (
            "f32 softmax, cast then dropout",
            format!("o = dropout(cast(softmax(cast({sc} * 0.125, f32) + bf, -1), bf16), 0.1, s) @ v"),
            "attention_bias_dropout",
        ),
        ("scale on q", "o = dropout(softmax((q * 0.125) @ transpose(k, -1, -2), -1), 0.1, s) @ v".to_string(), "attention_dropout"),
        (
            "grouped-query keys and values",
            "input kg: bf16[2, 2, S, 32]\ninput vg: bf16[2, 2, S, 32]\n\
             kk = reshape(broadcast(reshape(kg, [2, 2, 1, S, 32]), [2, 2, 2, S, 32]), [2, 4, S, 32])\n\
             vv = reshape(broadcast(reshape(vg, [2, 2, 1, S, 32]), [2, 2, 2, S, 32]), [2, 4, S, 32])\n\
             o = dropout(softmax(q @ transpose(kk, -1, -2) * 0.125, -1), 0.5, s) @ vv"
                .to_string(),
            "attention_dropout",
        ),
        (
            "split heads",
            "input x: bf16[2, S, 128]\nh = transpose(reshape(x, [2, S, 4, 32]), 1, 2)\n\
             o = reshape(transpose(dropout(softmax(h @ transpose(h, -1, -2) * 0.125, -1), 0.1, s) @ h, 1, 2), [2, S, 128])"
                .to_string(),
            "attention_dropout",
        ),
    ];
    let opts = OptimizeOptions::new(DeviceProfile::load("h100").unwrap());
    for (name, body, op) in cases {
        let program = parse(&format!("{head}{body}\noutput o\n"));
        let plan = eqfuse::optimize(&program, &opts).unwrap().plan;
        let shown: Vec<_> = plan.kernels.iter().map(|k| (k.template, k.ops.clone())).collect();
        assert!(plan.kernels.iter().any(|k| k.ops.iter().any(|o| o == op)), "{name}: {shown:?}");
        let scores = 2 * 4 * 64 * 64;
        for k in &plan.kernels {
            assert!(k.writes.iter().all(|w| w.ty.numel() < scores), "{name}: a score matrix written: {shown:?}");
        }
        let inputs = random_inputs(&program, 5);
        let want = eval(&program, &inputs).unwrap();
        let got = eval_plan(&plan, &inputs).unwrap();
        let scale = want[0].data.iter().fold(1.0f64, |m, v| m.max(v.abs()));
        let cmp = got[0].compare(&want[0], 3e-2, 3e-2 * scale);
        assert!(cmp.ok(), "{name}: {cmp}");
    }
}

/// [`program`]'s f32 form differentiated by [`eqfuse::grad_decomposed`]: through dropout and
/// softmax (its dropout the forward's mask), never the flash composites.
fn decomposed_program((sq, sk, d): (usize, usize, usize), causal: u8, bias: bool, p: f64) -> Program {
    let att = if bias {
        format!("attention_bias_dropout(q, k, v, b, 0.3, {causal}, {p}, s)")
    } else {
        format!("attention_dropout(q, k, v, 0.3, {causal}, {p}, s)")
    };
    let mut prog = parse(&format!(
        "input q: f32[2, {sq}, {d}]\ninput k: f32[2, {sk}, {d}]\ninput v: f32[2, {sk}, {d}]\n\
         input r: f32[2, {sq}, {d}]\ninput b: f32[2, 1, {sk}]\ninput s: i32[1]\n\
         y = {att}\nloss = sum(sum(sum(cast(y * r, f32), -1), -2), -3)\noutput loss\n"
    ));
    let loss = prog.outputs[0].id;
    let ws: Vec<_> = ["q", "k", "v"].iter().map(|w| prog.input(w).unwrap().id).collect();
    let gs = eqfuse::grad_decomposed(&mut prog, loss, &ws).unwrap();
    for (w, g) in ["q", "k", "v"].iter().zip(gs) {
        prog.add_output(&format!("d_{w}"), g).unwrap();
    }
    prog
}

/// `loss = sum(attention_dropout(q, k, v) * r)` (or `attention_bias_dropout` with an f32 bias
/// `[2, 1, SK]` that needs no gradient) over `[2, sq, d]` operands and its gradients with
/// respect to q, k and v; the seed `seed` (a literal, or the i32 input `s`).
fn program(dtype: &str, (sq, sk, d): (usize, usize, usize), causal: u8, bias: bool, p: f64, seed: &str) -> Program {
    let att = if bias {
        format!("attention_bias_dropout(q, k, v, b, 0.3, {causal}, {p}, {seed})")
    } else {
        format!("attention_dropout(q, k, v, 0.3, {causal}, {p}, {seed})")
    };
    parse(&format!(
        "input q: {dtype}[2, {sq}, {d}]\ninput k: {dtype}[2, {sk}, {d}]\ninput v: {dtype}[2, {sk}, {d}]\n\
         input r: {dtype}[2, {sq}, {d}]\ninput b: f32[2, 1, {sk}]\ninput s: i32[1]\n\
         y = {att}\nloss = sum(sum(sum(cast(y * r, f32), -1), -2), -3)\n\
         d_q = grad(loss, q)\nd_k = grad(loss, k)\nd_v = grad(loss, v)\noutput loss, d_q, d_k, d_v\n"
    ))
}

/// bf16, f16 and f32 gradients run as the flash-style dropout composites (`attention_lse` or
/// `attention_bias_lse`, `attention_*dropout_grad_{q,k,v}`) and agree with central finite differences of the forward
/// (unrounded reference: the mask does not depend on q, k, v).
#[test]
fn gradients_match_finite_differences() {
    let cases = [
        ("bf16", (5, 7, 8), 0, false, 0.5, "s"),
        ("f16", (6, 6, 16), 1, false, 0.1, "3"),
        ("bf16", (9, 4, 8), 1, true, 0.5, "s"),
        ("f16", (4, 9, 8), 0, true, 0.1, "123456789"),
        ("f32", (5, 6, 8), 1, false, 0.5, "s"),
        ("f32", (6, 5, 8), 0, true, 0.1, "s"),
    ];
    for (dtype, dims, causal, bias, p, seed) in cases {
        let prog = program(dtype, dims, causal, bias, p, seed);
        let names = ops(&prog);
        let what = format!("{dtype} {dims:?} causal {causal} bias {bias} p {p} seed {seed}");
        let flash = if bias { "attention_bias_dropout_grad_q" } else { "attention_dropout_grad_q" };
        assert!(names.contains(&flash), "{what}: {names:?}");
        assert!(!names.contains(&"dropout"), "{what}: {names:?}");
        common::assert_gradients_match_finite_differences(&prog, &["q", "k", "v"], 3, &what);
    }
}

/// The flash composites' gradients equal the decomposed backward of the same forward (the
/// f32-dtype program differentiated by `grad_decomposed`, through dropout and softmax), evaluated unrounded; the
/// composites' expansion (strict plans, the unfused baseline) equals their reference; and every
/// plan, strict or not, evaluates kernel by kernel to the program's values.
#[test]
fn composites_match_the_decomposed_backward_the_expansion_and_the_plans() {
    for (causal, bias) in [(0, false), (1, false), (0, true), (1, true)] {
        let flash = program("bf16", (12, 10, 16), causal, bias, 0.25, "s");
        let decomposed = decomposed_program((12, 10, 16), causal, bias, 0.25);
        assert!(ops(&flash).iter().any(|n| n.contains("dropout_grad")));
        assert!(!ops(&decomposed).iter().any(|n| n.contains("dropout_grad")));
        let inputs = random_inputs(&flash, 5);
        let as_f32: HashMap<String, Tensor> = inputs
            .iter()
            .map(|(n, t)| {
                let t = if t.dtype == DType::Bf16 {
                    Tensor::new(DType::F32, t.shape.clone(), t.data.clone()).unwrap()
                } else {
                    t.clone()
                };
                (n.clone(), t)
            })
            .collect();
        let want = eval_with(&flash, &inputs, Precision::F64).unwrap();
        let other = eval_with(&decomposed, &as_f32, Precision::F64).unwrap();
        // (`dropout` multiplies by its scale in f32, as its kernels do, even unrounded: relative
        // errors of 1e-7; a dropped element against a kept one would be of order 1.)
        for (i, (g, w)) in other.iter().zip(&want).enumerate() {
            let cmp = g.compare(w, 1e-5, 1e-6);
            assert!(cmp.ok(), "causal {causal} bias {bias}, output {i}, decomposed backward: {cmp}");
        }
        // The expansion: of bf16 operands `dropout` rounds its products to bf16 even unrounded
        // (its definition), so to bf16's precision; of f32 ones as closely as above.
        for (p, x, tol) in [(&flash, &inputs, 2e-2), (&decomposed, &as_f32, 1e-5)] {
            let expanded = eqfuse::expand_composites(p).unwrap();
            assert!(!ops(&expanded).iter().any(|n| n.starts_with("attention")));
            for (g, w) in eval_with(&expanded, x, Precision::F64).unwrap().iter().zip(&want) {
                let scale = w.data.iter().fold(1.0f64, |m, v| m.max(v.abs()));
                let cmp = g.compare(w, tol, tol * scale);
                assert!(cmp.ok(), "causal {causal} bias {bias}, expanded (tolerance {tol}): {cmp}");
            }
        }
        let declared = eval(&flash, &inputs).unwrap();
        for strict in [false, true] {
            let mut opts = OptimizeOptions::new(DeviceProfile::load("h100").unwrap());
            opts.strict = strict;
            let plan = eqfuse::optimize(&flash, &opts).unwrap().plan;
            let got = eval_plan(&plan, &inputs).unwrap();
            for ((o, g), w) in flash.outputs.iter().zip(&got).zip(&declared) {
                let scale = w.data.iter().fold(1.0f64, |m, v| m.max(v.abs()));
                let cmp = g.compare(w, 3e-2, 3e-2 * scale);
                assert!(cmp.ok(), "causal {causal} bias {bias}, strict {strict}, {}: {cmp}", o.name);
            }
        }
    }
}

/// Bad arguments are errors naming the operator, never a panic: a probability outside
/// `[0, 1)`, a seed tensor of the wrong dtype or shape, a negative literal seed, an argument
/// missing.
#[test]
fn bad_arguments_are_errors() {
    let head = "input q: bf16[2, 8, 16]\ninput k: bf16[2, 8, 16]\ninput v: bf16[2, 8, 16]\n\
                input sf: f32[]\ninput s2: i32[2]\ninput g: bf16[2, 8, 16]\ninput l: f32[2, 8, 1]\n";
    for (call, want) in [
        ("attention_dropout(q, k, v, 0.25, 0, 1, 3)", "probability"),
        ("attention_dropout(q, k, v, 0.25, 0, -0.1, 3)", "probability"),
        ("attention_dropout(q, k, v, 0.25, 0, 0.1, sf)", "seed"),
        ("attention_dropout(q, k, v, 0.25, 0, 0.1, s2)", "seed"),
        ("attention_dropout(q, k, v, 0.25, 0, 0.1, -1)", "seed"),
        ("attention_dropout(q, k, v, 0.25, 0, 0.1)", "attention_dropout"),
        ("attention_bias_dropout(q, k, v, l, 0.25, 0, 2, 1)", "probability"),
        ("attention_dropout_grad_q(q, k, v, g, l, l, 0.25, 0, 0.1, sf)", "seed"),
        ("attention_bias_dropout_grad_v(q, k, v, g, l, l, l, 0.25, 0, 0.1, 1)", "statistics"),
    ] {
        let err = parse_program("bad.eqf", &format!("{head}y = {call}\noutput y\n"), &[]).unwrap_err().to_string();
        assert!(err.contains(want), "{call}: {err}");
    }
}

/// A seed given as an element of a seeds input (`slice(seeds, 0, k, k + 1, 1)`, as the PyTorch
/// backend passes it) is read by the attention kernels in place: no kernel of its own, and the
/// forward and backward kernels read `seeds`. The plan is attention's: the forward writing the
/// log-sum-exp too, a row kernel (delta), and one kernel of dq, dk and dv.
#[test]
fn a_sliced_seed_is_read_in_place() {
    let text = "input q: bf16[2, 4, 64, 32]\ninput k: bf16[2, 4, 64, 32]\ninput v: bf16[2, 4, 64, 32]\n\
                input seeds: i32[3]\ninput r: bf16[2, 4, 64, 32]\n\
                y = attention_dropout(q, k, v, 0.125, 1, 0.1, slice(seeds, 0, 2, 3, 1))\n\
                loss = sum(sum(sum(sum(cast(y * r, f32), -1), -2), -3), -4)\n\
                d_q = grad(loss, q)\nd_k = grad(loss, k)\nd_v = grad(loss, v)\noutput y, d_q, d_k, d_v\n";
    let program = parse(text);
    let plan = eqfuse::optimize(&program, &OptimizeOptions::new(DeviceProfile::load("h100").unwrap())).unwrap().plan;
    let shown: Vec<_> = plan.kernels.iter().map(|k| (k.template, k.ops.clone())).collect();
    assert_eq!(plan.kernels.len(), 3, "{shown:?}");
    let grads = ["attention_dropout_grad_q", "attention_dropout_grad_k", "attention_dropout_grad_v"];
    assert!(plan.kernels.iter().any(|k| grads.iter().all(|g| k.ops.iter().any(|o| o == g))), "{shown:?}");
    let readers: Vec<_> = plan.kernels.iter().filter(|k| k.reads.iter().any(|r| r.name == "seeds")).collect();
    assert!(readers.len() >= 2, "{shown:?}");
    assert!(readers.iter().all(|k| k.template == eqfuse::Template::Attention), "{shown:?}");
    assert!(!plan.kernels.iter().any(|k| k.ops == ["slice"]), "{shown:?}");
    let inputs = random_inputs(&program, 9);
    let want = eval(&program, &inputs).unwrap();
    for ((o, g), w) in program.outputs.iter().zip(&eval_plan(&plan, &inputs).unwrap()).zip(&want) {
        let scale = w.data.iter().fold(1.0f64, |m, v| m.max(v.abs()));
        let cmp = g.compare(w, 3e-2, 3e-2 * scale);
        assert!(cmp.ok(), "{}: {cmp}", o.name);
    }
}

/// The cost model prices attention with dropout as attention plus dropout's hash of each score
/// (12 operations a score computed), on the Hopper path as attention without dropout: the
/// forward kernel and each backward kernel cost more flops than without dropout, by that much,
/// and the forward kernel is predicted no faster.
#[test]
fn dropout_is_priced_as_attention_plus_the_hash() {
    let opts = OptimizeOptions::new(DeviceProfile::load("h100").unwrap());
    let kernel = |att: &str| {
        let program = parse(&format!(
            "input q: bf16[2, 4, 256, 64]\ninput k: bf16[2, 4, 256, 64]\ninput v: bf16[2, 4, 256, 64]\n\
             input s: i32[]\ny = {att}\noutput y\n"
        ));
        let plan = eqfuse::optimize(&program, &opts).unwrap().plan;
        assert_eq!(plan.kernels.len(), 1, "{att}");
        let kind = format!("{:?}", plan.kernels[0].kind);
        assert_eq!(kind, "Attention { path: Hopper, lse: false }", "{att}");
        (plan.kernels[0].flops, plan.kernels[0].predicted_us)
    };
    let (plain, plain_us) = kernel("attention(q, k, v, 0.125, 0)");
    let (drop, drop_us) = kernel("attention_dropout(q, k, v, 0.125, 0, 0.1, s)");
    assert_eq!(drop - plain, 12 * 2 * 4 * 256 * 256, "{plain} {drop}");
    assert!(drop_us > plain_us, "{plain_us} {drop_us}");
}
