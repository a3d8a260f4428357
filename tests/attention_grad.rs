//! Attention's flash-style backward (`attention_lse`, `attention_grad_{q,k,v}`): the gradients
//! the autodiff pass emits for bf16, f16 and f32 attention agree with central finite differences of
//! the forward (unrounded reference), the expansion of the composites (strict numerics, and
//! types the kernels do not run) computes the same values, and the plan of
//! `examples/attention_grad.eqf` moves no score matrix through device memory.

mod common;

use eqfuse::{
    eval, eval_plan, eval_with, grad, load_program, parse_program, random_inputs, Binary, DType, DeviceProfile, Kind,
    OptimizeOptions, Precision, Program, Reduce, Tensor, TensorType,
};

/// `loss = sum(attention(q, k, v) * r)` and its gradients with respect to q, k, v.
fn program(dtype: &str, sq: usize, sk: usize, d: usize, causal: u8) -> Program {
    let text = format!(
        "input q: {dtype}[2, {sq}, {d}]\ninput k: {dtype}[2, {sk}, {d}]\ninput v: {dtype}[2, {sk}, {d}]\n\
         y = attention(q, k, v, 0.3, {causal})\noutput y\n"
    );
    let mut p = parse_program("att.eqf", &text, &[]).unwrap();
    let y = p.outputs[0].id;
    let ty = p.ty(y).unwrap().clone();
    let r = p.add_input("r", TensorType::new(ty.dtype, ty.shape.clone())).unwrap();
    let mut loss = p.apply(Kind::Binary(Binary::Mul), vec![y, r]).unwrap();
    for axis in 0..ty.rank() {
        let a = p.num(axis as f64);
        loss = p.apply(Kind::Reduce(Reduce::Sum), vec![loss, a]).unwrap();
    }
    let ws: Vec<_> = ["q", "k", "v"].iter().map(|w| p.input(w).unwrap().id).collect();
    let gs = grad(&mut p, loss, &ws).unwrap();
    p.outputs.clear();
    p.add_output("loss", loss).unwrap();
    for (w, g) in ["q", "k", "v"].iter().zip(gs) {
        p.add_output(&format!("d_{w}"), g).unwrap();
    }
    p
}

fn ops(p: &Program) -> Vec<&'static str> {
    p.expr().as_ref().iter().filter_map(|n| n.opcode()).map(|c| c.name()).collect()
}

#[test]
fn bf16_and_f16_gradients_use_the_flash_backward_and_match_finite_differences() {
    for (dtype, sq, sk, d, causal) in [("bf16", 5, 7, 8, 0), ("f16", 6, 6, 16, 1), ("bf16", 9, 4, 8, 1)] {
        let p = program(dtype, sq, sk, d, causal);
        let names = ops(&p);
        for op in ["attention_lse", "attention_grad_q", "attention_grad_k", "attention_grad_v"] {
            assert!(names.contains(&op), "{dtype}: no `{op}` in {names:?}");
        }
        assert!(!names.contains(&"@") && !names.contains(&"softmax"), "{dtype}: the decomposed backward: {names:?}");
        common::assert_gradients_match_finite_differences(&p, &["q", "k", "v"], 3, &format!("{dtype} causal {causal}"));
    }
}

/// `attention_bias` of bf16 operands with an f32 bias `[2, 1, SK]`: the gradients with respect
/// to q, k, v and the bias come from its decomposition (the flash-style composites take no bias)
/// and agree with central finite differences of the forward (unrounded reference).
#[test]
fn attention_bias_gradients_match_finite_differences() {
    for causal in [0, 1] {
        let text = format!(
            "input q: bf16[2, 5, 8]\ninput k: bf16[2, 5, 8]\ninput v: bf16[2, 5, 8]\ninput b: f32[2, 1, 5]\n\
             y = attention_bias(q, k, v, b, 0.3, {causal})\noutput y\n"
        );
        let mut p = parse_program("att.eqf", &text, &[]).unwrap();
        let y = p.outputs[0].id;
        let ty = p.ty(y).unwrap().clone();
        let r = p.add_input("r", TensorType::new(ty.dtype, ty.shape.clone())).unwrap();
        let mut loss = p.apply(Kind::Binary(Binary::Mul), vec![y, r]).unwrap();
        for axis in 0..ty.rank() {
            let a = p.num(axis as f64);
            loss = p.apply(Kind::Reduce(Reduce::Sum), vec![loss, a]).unwrap();
        }
        let names = ["q", "k", "v", "b"];
        let ws: Vec<_> = names.iter().map(|w| p.input(w).unwrap().id).collect();
        let gs = grad(&mut p, loss, &ws).unwrap();
        p.outputs.clear();
        p.add_output("loss", loss).unwrap();
        for (w, g) in names.iter().zip(gs) {
            p.add_output(&format!("d_{w}"), g).unwrap();
        }
        assert!(!ops(&p).iter().any(|n| n.starts_with("attention_grad") || *n == "attention_lse"), "{:?}", ops(&p));
        common::assert_gradients_match_finite_differences(&p, &names, 5, &format!("causal {causal}"));
    }
}

/// f32 attention's gradients run as the flash-style composites too (the f32 kernels, CUDA
/// cores), with a head that is a multiple of 4, and agree with central finite differences of the
/// forward; a head of 6 keeps the decomposed backward.
#[test]
fn f32_gradients_use_the_flash_backward_and_match_finite_differences() {
    for (sq, sk, d, causal) in [(5, 7, 8, 0), (6, 6, 12, 1), (9, 4, 4, 1)] {
        let p = program("f32", sq, sk, d, causal);
        let names = ops(&p);
        for op in ["attention_lse", "attention_grad_q", "attention_grad_k", "attention_grad_v"] {
            assert!(names.contains(&op), "f32: no `{op}` in {names:?}");
        }
        assert!(!names.contains(&"@") && !names.contains(&"softmax"), "f32: the decomposed backward: {names:?}");
        common::assert_gradients_match_finite_differences(&p, &["q", "k", "v"], 3, &format!("f32 causal {causal}"));
    }
    let names = ops(&program("f32", 4, 4, 6, 1));
    assert!(!names.iter().any(|n| n.starts_with("attention_")), "{names:?}");
    assert!(names.contains(&"@"));
}

/// The f32 backward kernels (`kernels/attention_bwd.cu`, `EQ_F32`) compile with NVRTC at sm_90
/// and sm_80 in every mode a plan takes (the statistics alone, dq alone, dk and/or dv), with and
/// without a causal mask, a bias (a tensor, or a bool mask's select) and dropout, for heads of 64,
/// 40 and 128 (32-query tiles); the key kernel sums the query gradient (atomics) only for heads
/// up to 64.
#[test]
fn f32_backward_kernels_compile_for_every_mode() {
    if eqfuse::nvrtc_available().is_err() {
        eprintln!("skipped: NVRTC is not available");
        return;
    }
    let opts = OptimizeOptions::new(DeviceProfile::load("h100").unwrap());
    let mut seen = std::collections::BTreeSet::new();
    let forms = [
        "attention(q, k, v, 0.125, {c})",
        "attention_bias(q, k, v, b, 0.125, {c})",
        "attention_bias(q, k, v, where(m, cast(0, f32), cast(-1e30, f32)), 0.125, {c})",
        "attention_dropout(q, k, v, 0.125, {c}, 0.1, 7)",
    ];
    let mut cases: Vec<(usize, usize, u8, &str, &[&str])> = Vec::new();
    for (s, d, causal) in [(100, 64, 1), (72, 40, 0), (80, 128, 1)] {
        cases.extend(forms.iter().map(|&f| (s, d, causal, f, &["q", "k", "v"][..])));
    }
    cases.extend([&["k"][..], &["v"]].map(|ws| (100, 64, 0, forms[3], ws)));
    for (s, d, causal, form, ws) in cases {
        {
            {
                let grads: String = ws.iter().map(|w| format!("d{w} = grad(l, {w})\n")).collect();
                let outs: Vec<String> = ws.iter().map(|w| format!("d{w}")).collect();
                let att = form.replace("{c}", &causal.to_string());
                let text = format!(
                    "input q: f32[2, 3, {s}, {d}]\ninput k: f32[2, 3, {s}, {d}]\ninput v: f32[2, 3, {s}, {d}]\n\
                     input g: f32[2, 3, {s}, {d}]\ninput b: f32[2, 1, {s}, {s}]\ninput m: bool[2, 1, 1, {s}]\n\
                     o = {att}\nl = sum(sum(sum(sum(o * g, -1), -2), -3), -4)\n{grads}output {}\n",
                    outs.join(", ")
                );
                let p = parse_program("c.eqf", &text, &[]).unwrap();
                let plan = eqfuse::optimize(&p, &opts).unwrap().plan;
                let sources = eqfuse::codegen_plan(&plan).unwrap_or_else(|e| panic!("{att} {ws:?}: {e}"));
                let bwd: Vec<_> = sources.iter().filter(|s| s.name.starts_with("attention_bwd")).collect();
                assert!(!bwd.is_empty(), "{att} {ws:?}: no backward kernel");
                for src in bwd {
                    if d > 64 {
                        assert!(
                            !src.name.contains("_dqk") && !src.name.contains("_dqv"),
                            "{}: dq by atomics",
                            src.name
                        );
                    }
                    seen.insert(src.name.split("_f32").next().unwrap().to_string());
                    // (sm_80 for the first shape: each compile takes about a second.)
                    let archs: &[&str] =
                        if s == 100 { &[eqfuse::DEFAULT_ARCH, "sm_80"] } else { &[eqfuse::DEFAULT_ARCH] };
                    for arch in archs {
                        let c = eqfuse::nvrtc_compile(&src.source, &src.file, arch, &[])
                            .unwrap_or_else(|e| panic!("{} ({arch}): {e}", src.name));
                        assert!(c.log.trim().is_empty(), "{} ({arch}): warnings\n{}", src.name, c.log);
                    }
                }
            }
        }
    }
    // The statistics alone, written as a program.
    let text = "input q: f32[2, 70, 64]\ninput k: f32[2, 90, 64]\nl = attention_lse(q, k, 0.5, 1)\noutput l\n";
    let plan = eqfuse::optimize(&parse_program("l.eqf", text, &[]).unwrap(), &opts).unwrap().plan;
    for src in eqfuse::codegen_plan(&plan).unwrap() {
        seen.insert(src.name.split("_f32").next().unwrap().to_string());
        eqfuse::nvrtc_compile(&src.source, &src.file, eqfuse::DEFAULT_ARCH, &[]).unwrap();
    }
    for want in [
        "attention_bwd_lse",
        "attention_bwd_dq",
        "attention_bwd_dk",
        "attention_bwd_dv",
        "attention_bwd_dkv",
        "attention_bwd_dqkv",
    ] {
        assert!(seen.contains(want), "no {want} kernel: {seen:?}");
    }
}

/// The composites' expansion (what strict plans and the unfused baseline run) equals their
/// reference, and so does every plan of them, strict or not, kernel by kernel.
#[test]
fn the_expansion_and_the_plans_agree_with_the_reference() {
    for causal in [0, 1] {
        let p = program("bf16", 12, 10, 16, causal);
        let inputs = random_inputs(&p, 5);
        let want = eval_with(&p, &inputs, Precision::F64).unwrap();
        let expanded = eqfuse::expand_composites(&p).unwrap();
        assert!(!ops(&expanded).iter().any(|n| n.starts_with("attention")));
        let got = eval_with(&expanded, &inputs, Precision::F64).unwrap();
        for (g, w) in got.iter().zip(&want) {
            let cmp = g.compare(w, 1e-9, 1e-9);
            assert!(cmp.ok(), "causal {causal}, expanded: {cmp}");
        }
        let declared = eval(&p, &inputs).unwrap();
        for strict in [false, true] {
            let mut opts = OptimizeOptions::new(DeviceProfile::load("h100").unwrap());
            opts.strict = strict;
            let plan = eqfuse::optimize(&p, &opts).unwrap().plan;
            let got = eval_plan(&plan, &inputs).unwrap();
            for ((o, g), w) in p.outputs.iter().zip(&got).zip(&declared) {
                let scale = w.data.iter().fold(1.0f64, |m, v| m.max(v.abs()));
                let cmp = g.compare(w, 3e-2, 3e-2 * scale);
                assert!(cmp.ok(), "causal {causal}, strict {strict}, {}: {cmp}", o.name);
            }
        }
    }
}

/// The example's plan: the forward writing the log-sum-exp too, one row kernel (delta), and one
/// kernel for the query, key and value gradients; no tensor of a score matrix's size is read or
/// written, and the traffic stays within a small multiple of the inputs and outputs. Under strict
/// numerics no kernel sums the query gradient by atomics.
#[test]
fn attention_grad_plan_moves_no_score_matrix() {
    let p = load_program("examples/attention_grad.eqf", &[]).unwrap();
    let plan = eqfuse::optimize(&p, &OptimizeOptions::new(DeviceProfile::load("h100").unwrap())).unwrap().plan;
    let (b, h, s) = (8usize, 16usize, 2048usize);
    let scores = b * h * s * s;
    for k in &plan.kernels {
        for t in k.reads.iter().chain(&k.writes) {
            assert!(t.ty.numel() < scores / 16, "kernel {} moves {} {}", k.id, t.name, t.ty);
        }
    }
    let grads: Vec<_> = plan.kernels.iter().filter(|k| k.ops.iter().any(|o| o.starts_with("attention_grad"))).collect();
    assert_eq!(grads.len(), 1, "{:?}", plan.kernels.iter().map(|k| k.ops.clone()).collect::<Vec<_>>());
    assert_eq!(grads[0].writes.len(), 3, "dq, dk and dv in one kernel");
    let fwd = plan.kernels.iter().find(|k| k.ops.iter().any(|o| o == "attention")).unwrap();
    assert!(fwd.ops.iter().any(|o| o == "attention_lse"), "the forward kernel writes the log-sum-exp: {:?}", fwd.ops);
    let io: u64 = p.inputs.iter().map(|i| i.ty.bytes()).sum::<u64>()
        + p.outputs.iter().map(|o| p.ty(o.id).unwrap().bytes()).sum::<u64>();
    assert!(plan.total.bytes <= 6 * io, "{} bytes against {io} of inputs and outputs", plan.total.bytes);
    assert_eq!(plan.total.kernels, 3, "{} kernels", plan.total.kernels);
    let sources = eqfuse::codegen_plan(&plan).unwrap();
    let bwd = sources.iter().find(|s| s.name.starts_with("attention_bwd")).unwrap();
    assert!(bwd.name.starts_with("attention_bwd_dqkv"), "{}", bwd.name);
    let ws: Vec<_> = bwd.args.iter().filter(|a| a.role == eqfuse::ArgRole::Workspace).collect();
    assert!(ws.len() == 2 && ws.iter().all(|a| a.zeroed), "the accumulator and the counts, zeroed: {ws:?}");
    assert_eq!(ws[0].bytes, (b * h * s * 64 * 4) as u64, "the f32 accumulator of dq");
}

/// Under strict numerics results must not depend on scheduling: no plan sums the query gradient
/// by atomics (attention is expanded there; written composites too), and the cost model refuses
/// the query gradient beside the others even where they would reach it.
#[test]
fn strict_plans_sum_no_query_gradient_by_atomics() {
    let text =
        "input q: bf16[2, 64, 16]\ninput k: bf16[2, 64, 16]\ninput v: bf16[2, 64, 16]\ninput g: bf16[2, 64, 16]\n\
                l = attention_lse(q, k, 0.5, 0)\nd = sum(cast(g, f32) * cast(g, f32), -1)\n\
                dq = attention_grad_q(q, k, v, g, l, d, 0.5, 0)\ndk = attention_grad_k(q, k, v, g, l, d, 0.5, 0)\n\
                dv = attention_grad_v(q, k, v, g, l, d, 0.5, 0)\noutput dq, dk, dv\n";
    let p = parse_program("w.eqf", text, &[]).unwrap();
    let opts = OptimizeOptions::new(DeviceProfile::load("h100").unwrap());
    let plan = eqfuse::optimize(&p, &opts).unwrap().plan;
    assert!(
        plan.kernels.iter().any(|k| k.writes.len() == 3),
        "dq, dk and dv in one kernel: {:?}",
        plan.kernels.iter().map(|k| k.ops.clone()).collect::<Vec<_>>()
    );
    let strict = eqfuse::optimize(&p, &OptimizeOptions { strict: true, ..opts }).unwrap().plan;
    for k in &strict.kernels {
        let q = k.ops.iter().any(|o| o == "attention_grad_q");
        assert!(!q || k.ops.iter().filter(|o| o.starts_with("attention_grad")).count() == 1, "{:?}", k.ops);
    }
    for s in eqfuse::codegen_plan(&strict).unwrap() {
        assert!(!s.args.iter().any(|a| a.role == eqfuse::ArgRole::Workspace), "{}", s.name);
    }
}

#[test]
fn the_composites_can_be_written_and_are_checked() {
    let ok = "input q: bf16[2, 4, 8]\ninput k: bf16[2, 6, 8]\ninput v: bf16[2, 6, 8]\ninput g: bf16[2, 4, 8]\n\
              l = attention_lse(q, k, 0.5, 0)\nd = sum(cast(g, f32), -1)\n\
              dq = attention_grad_q(q, k, v, g, l, d, 0.5, 0)\noutput l, dq\n";
    let p = parse_program("w.eqf", ok, &[]).unwrap();
    assert_eq!(p.ty(p.outputs[0].id).unwrap(), &TensorType::new(DType::F32, vec![2, 4, 1]));
    let bad = ok.replace("attention_grad_q(q, k, v, g, l, d", "attention_grad_q(q, k, v, g, d, g");
    let e = parse_program("w.eqf", &bad, &[]).unwrap_err().to_string();
    assert!(e.contains("delta of attention_grad_q must be f32[2,4,1]"), "{e}");
}

/// The backward kernels of f16 and bf16 attention, causal or not, head sizes 64 and 128 and a
/// ragged one (rows that do not fill a tile), compile with NVRTC without warnings (skipped where
/// NVRTC is missing, as `tests/nvrtc.rs` does): the one kernel of dq, dk and dv (dq by atomics)
/// where all three gradients are asked for, and every other mode where some are (dq alone, dk
/// and dv, dq with dk, dq with dv), at sm_90 and at sm_80 (the atomics four at once, or one).
#[test]
fn backward_kernels_compile_for_every_mode() {
    if eqfuse::nvrtc_available().is_err() {
        eprintln!("skipped: NVRTC is not available");
        return;
    }
    let shapes = [("f16", 256, 128, 1), ("bf16", 100, 64, 1), ("f16", 72, 40, 0)];
    let wanted: [(&[&str], &str); 5] = [
        (&["q", "k", "v"], "attention_bwd_dqkv"),
        (&["q"], "attention_bwd_dq_"),
        (&["k", "v"], "attention_bwd_dkv"),
        (&["q", "k"], "attention_bwd_dqk_"),
        (&["q", "v"], "attention_bwd_dqv_"),
    ];
    let mut seen = std::collections::BTreeSet::new();
    for (dtype, s, d, causal) in shapes {
        for (ws, name) in wanted {
            let grads: String = ws.iter().map(|w| format!("d{w} = grad(l, {w})\n")).collect();
            let outs: Vec<String> = ws.iter().map(|w| format!("d{w}")).collect();
            let text = format!(
                "input q: {dtype}[2, 3, {s}, {d}]\ninput k: {dtype}[2, 3, {s}, {d}]\ninput v: {dtype}[2, 3, {s}, {d}]\n\
                 input g: {dtype}[2, 3, {s}, {d}]\no = attention(q, k, v, 0.125, {causal})\n\
                 l = sum(sum(sum(sum(cast(o, f32) * cast(g, f32), -1), -2), -3), -4)\n{grads}output {}\n",
                outs.join(", ")
            );
            let p = parse_program("c.eqf", &text, &[]).unwrap();
            let plan = eqfuse::optimize(&p, &OptimizeOptions::new(DeviceProfile::load("h100").unwrap())).unwrap().plan;
            let sources = eqfuse::codegen_plan(&plan).unwrap();
            let names: Vec<&str> = sources.iter().map(|s| s.name.as_str()).collect();
            assert!(names.iter().any(|n| n.starts_with(name)), "{dtype} {s} {d} {ws:?}: {names:?}");
            seen.insert(name);
            for src in sources.iter().filter(|s| s.name.starts_with("attention_bwd")) {
                for arch in [eqfuse::DEFAULT_ARCH, "sm_80"] {
                    let c = eqfuse::nvrtc_compile(&src.source, &src.file, arch, &[])
                        .unwrap_or_else(|e| panic!("{} ({arch}): {e}", src.name));
                    assert!(c.log.trim().is_empty(), "{} ({arch}): warnings\n{}", src.name, c.log);
                    let ptx = String::from_utf8_lossy(&c.ptx);
                    if src.args.iter().any(|a| a.role == eqfuse::ArgRole::Workspace) {
                        let v4 = ptx.contains("red.global.add.v4.f32");
                        assert_eq!(v4, arch == eqfuse::DEFAULT_ARCH, "{} ({arch}): vector atomics", src.name);
                    }
                }
            }
        }
    }
    assert_eq!(seen.len(), wanted.len());
}

/// Heads split from projections and merged back (the backward reads transposed views of the
/// projections, as AOTAutograd's backward graphs do): the gradients still run as the flash-style
/// backward kernels, which read row-major operands, so the views are written first, and every
/// kernel of the plan generates.
#[test]
fn gradients_of_split_heads_run_the_backward_kernels() {
    let src = "dim B = 2\ndim S = 128\ndim H = 4\ndim D = 64\ndim E = 256\n\
               input xq: bf16[B, S, E]\ninput xk: bf16[B, S, E]\ninput xv: bf16[B, S, E]\ninput dy: bf16[B, S, E]\n\
               q = transpose(reshape(xq, [B, S, H, D]), 1, 2)\nk = transpose(reshape(xk, [B, S, H, D]), 1, 2)\n\
               v = transpose(reshape(xv, [B, S, H, D]), 1, 2)\n\
               y = reshape(transpose(attention(q, k, v, 0.125, 1), 1, 2), [B, S, E])\n\
               loss = sum(sum(sum(cast(y, f32) * cast(dy, f32), -1), -2), -3)\n\
               dq = grad(loss, xq)\ndk = grad(loss, xk)\ndv = grad(loss, xv)\noutput dq, dk, dv\n";
    let p = eqfuse::parse_program("heads_grad.eqf", src, &[]).unwrap();
    let opts = OptimizeOptions::new(DeviceProfile::load("h100").unwrap());
    let plan = eqfuse::optimize(&p, &opts).unwrap().plan;
    let ops: Vec<String> = plan.kernels.iter().flat_map(|k| k.ops.clone()).collect();
    assert!(ops.iter().any(|o| o.starts_with("attention_grad")), "{ops:?}");
    eqfuse::codegen_plan(&plan).unwrap_or_else(|e| panic!("{e}"));
}

/// `loss = sum(attention_bias(q, k, v, b) * r)` over `[2, sq, d]` operands of `dtype` and an f32
/// bias `bias` (an input; its values set by the caller where given), and the gradients with
/// respect to q, k, v and, with `bias_grad`, the bias.
fn bias_program(dtype: &str, sq: usize, sk: usize, d: usize, bias: &str, causal: u8, bias_grad: bool) -> Program {
    let text = format!(
        "input q: {dtype}[2, {sq}, {d}]\ninput k: {dtype}[2, {sk}, {d}]\ninput v: {dtype}[2, {sk}, {d}]\n\
         input b: f32{bias}\ny = attention_bias(q, k, v, b, 0.3, {causal})\noutput y\n"
    );
    let mut p = parse_program("att.eqf", &text, &[]).unwrap();
    let y = p.outputs[0].id;
    let ty = p.ty(y).unwrap().clone();
    let r = p.add_input("r", TensorType::new(ty.dtype, ty.shape.clone())).unwrap();
    let mut loss = p.apply(Kind::Binary(Binary::Mul), vec![y, r]).unwrap();
    for axis in 0..ty.rank() {
        let a = p.num(axis as f64);
        loss = p.apply(Kind::Reduce(Reduce::Sum), vec![loss, a]).unwrap();
    }
    let names: &[&str] = if bias_grad { &["q", "k", "v", "b"] } else { &["q", "k", "v"] };
    let ws: Vec<_> = names.iter().map(|w| p.input(w).unwrap().id).collect();
    let gs = grad(&mut p, loss, &ws).unwrap();
    p.outputs.clear();
    p.add_output("loss", loss).unwrap();
    for (w, g) in names.iter().zip(gs) {
        p.add_output(&format!("d_{w}"), g).unwrap();
    }
    p
}

/// `attention_bias` whose bias needs no gradient: bf16 and f16 gradients run as the bias forms
/// of the flash-style composites (`attention_bias_lse`, `attention_bias_grad_{q,k,v}`) and agree
/// with central finite differences of the forward (unrounded reference), for a padding bias
/// `[2, 1, SK]`, a full one `[2, SQ, SK]` and a shared one `[SQ, SK]`, causal and not.
#[test]
fn attention_bias_gradients_use_the_flash_backward_and_match_finite_differences() {
    let cases = [("bf16", 5, 7, 8, "[2, 1, 7]", 0), ("f16", 6, 6, 16, "[2, 6, 6]", 1), ("bf16", 9, 4, 8, "[9, 4]", 1)];
    for (dtype, sq, sk, d, bias, causal) in cases {
        let p = bias_program(dtype, sq, sk, d, bias, causal, false);
        let names = ops(&p);
        for op in ["attention_bias_lse", "attention_bias_grad_q", "attention_bias_grad_k", "attention_bias_grad_v"] {
            assert!(names.contains(&op), "{dtype} {bias}: no `{op}` in {names:?}");
        }
        assert!(!names.contains(&"@") && !names.contains(&"softmax"), "{dtype}: the decomposed backward: {names:?}");
        common::assert_gradients_match_finite_differences(
            &p,
            &["q", "k", "v"],
            3,
            &format!("{dtype} {bias} causal {causal}"),
        );
    }
}

/// A training step of `attention_bias` writes its scores' statistics from the forward kernel
/// (`EQ_STATS`: m and log l beside the output, as `attention_bias_lse` defines them), so no
/// kernel of its own passes over the scores again; the kernel compiles for sm_90 (both the
/// wgmma and the mma.sync paths) and sm_80, causal and not, bf16 and f16. (Its values are
/// checked on the GPU: `tests/gpu.rs`'s `attention_backward_kernels_match_the_reference`,
/// fully masked rows included.)
#[test]
fn attention_bias_forward_writes_its_statistics() {
    let opts = OptimizeOptions::new(DeviceProfile::load("h100").unwrap());
    for (dtype, s, d, bias, causal) in [("bf16", 200, 64, "[2, 1, 200]", 0), ("f16", 136, 128, "[2, 136, 136]", 1)] {
        let p = bias_program(dtype, s, s, d, bias, causal, false);
        let plan = eqfuse::optimize(&p, &opts).unwrap().plan;
        let fwd: Vec<_> = plan.kernels.iter().filter(|k| k.ops.iter().any(|o| o == "attention_bias_lse")).collect();
        assert!(
            fwd.len() == 1 && fwd[0].ops.iter().any(|o| o == "attention_bias"),
            "{dtype}: the statistics in the forward kernel: {:?}",
            plan.kernels.iter().map(|k| k.ops.clone()).collect::<Vec<_>>()
        );
        let sources = eqfuse::codegen_plan(&plan).unwrap();
        let src =
            sources.iter().find(|s| s.name.starts_with("attention_") && !s.name.starts_with("attention_bwd")).unwrap();
        assert!(src.source.contains("#define EQ_STATS 1") && src.source.contains("#define EQ_LSE 0"), "{}", src.name);
        assert_eq!(
            src.args.iter().filter(|a| a.role == eqfuse::ArgRole::Write).count(),
            2,
            "the output and the statistics"
        );
        if eqfuse::nvrtc_available().is_err() {
            eprintln!("skipped the compile: NVRTC is not available");
            continue;
        }
        for arch in [eqfuse::DEFAULT_ARCH, "sm_90a", "sm_80"] {
            let c = eqfuse::nvrtc_compile(&src.source, &src.file, arch, &[])
                .unwrap_or_else(|e| panic!("{} ({arch}): {e}", src.name));
            assert!(c.log.trim().is_empty(), "{} ({arch}): warnings\n{}", src.name, c.log);
        }
    }
}

/// A bias of small values with a padding fill: -3e38 (a bool mask lowered as `where(m, 0,
/// finfo.min)`) on batch entry 0's last 3 keys, and with `row` on every key of query row 2 of
/// batch entry 1 (a row the mask hides entirely, whose weights are then equal).
fn fill_bias(sq: usize, sk: usize, row: bool) -> Vec<f64> {
    let mut out = Vec::new();
    for b in 0..2 {
        for i in 0..sq {
            for j in 0..sk {
                let small = ((b * 7 + i * 13 + j * 5) % 11) as f64 / 11.0 - 0.5;
                out.push(if (b == 0 && j + 3 >= sk) || (row && b == 1 && i == 2) { -3e38 } else { small });
            }
        }
    }
    out
}

/// The bias composites agree with the decomposed backward (what the autodiff pass emits when the
/// bias needs a gradient too) on q, k and v, with rounding as the kernels round, for a fill mask
/// whose hidden rows get equal weights (kept apart as the row maximum and log sum, so the fill's
/// size loses nothing); their expansion (strict plans, the unfused baseline) equals their
/// reference; every plan of them evaluates to the program's values.
#[test]
fn attention_bias_composites_match_the_decomposed_backward_and_their_expansion() {
    for causal in [0, 1] {
        let (sq, sk) = (6, 9);
        let mut flash = bias_program("bf16", sq, sk, 16, &format!("[2, {sq}, {sk}]"), causal, false);
        let mut decomposed = bias_program("bf16", sq, sk, 16, &format!("[2, {sq}, {sk}]"), causal, true);
        assert!(ops(&flash).contains(&"attention_bias_grad_q"));
        assert!(!ops(&decomposed).iter().any(|n| n.starts_with("attention_bias_grad")), "{:?}", ops(&decomposed));
        // (Not a hidden row under the causal mask: the decomposition masks with -1e30, which
        // outranks a -3e38 fill, so there its weights go to the masked keys.)
        let bias = Tensor::new(DType::F32, vec![2, sq, sk], fill_bias(sq, sk, causal == 0)).unwrap();
        for p in [&mut flash, &mut decomposed] {
            p.values.insert("b".into(), bias.clone());
        }
        let inputs = random_inputs(&flash, 7);
        let want = eval(&decomposed, &inputs).unwrap();
        let got = eval(&flash, &inputs).unwrap();
        for (i, name) in ["loss", "d_q", "d_k", "d_v"].iter().enumerate() {
            let scale = want[i].data.iter().fold(1.0f64, |m, v| m.max(v.abs()));
            let cmp = got[i].compare(&want[i], 2e-2, 2e-2 * scale);
            assert!(cmp.ok(), "causal {causal}, {name}: {cmp}");
        }
        let exact = eval_with(&flash, &inputs, Precision::F64).unwrap();
        let expanded = eqfuse::expand_composites(&flash).unwrap();
        assert!(!ops(&expanded).iter().any(|n| n.starts_with("attention")));
        for (g, w) in eval_with(&expanded, &inputs, Precision::F64).unwrap().iter().zip(&exact) {
            let cmp = g.compare(w, 1e-9, 1e-9);
            assert!(cmp.ok(), "causal {causal}, expanded: {cmp}");
        }
        for strict in [false, true] {
            let mut opts = OptimizeOptions::new(DeviceProfile::load("h100").unwrap());
            opts.strict = strict;
            let plan = eqfuse::optimize(&flash, &opts).unwrap().plan;
            for ((o, g), w) in flash.outputs.iter().zip(&eval_plan(&plan, &inputs).unwrap()).zip(&got) {
                let scale = w.data.iter().fold(1.0f64, |m, v| m.max(v.abs()));
                let cmp = g.compare(w, 3e-2, 3e-2 * scale);
                assert!(cmp.ok(), "causal {causal}, strict {strict}, {}: {cmp}", o.name);
            }
        }
    }
}

/// The statistics a backward builds from a forward's log-sum-exp (`python/eqfuse_torch/export.py`
/// `_stats_of_lse`): on a row of fills, m the fill and log l the log of the keys the row includes
/// (under the causal mask, keys j <= i); on a row whose log-sum-exp was -inf, m the largest f32.
/// The gradient composites' expansion (strict plans, f32) agrees with their reference there:
/// under the causal mask it zeroes P after each query (a -1e30 score there would otherwise weigh
/// exp(-1e30 - fill) = inf); the reference's weights of the row of fills are 1 / keys.
#[test]
fn bias_gradients_of_statistics_of_a_row_of_fills_expand_as_their_reference() {
    let (sq, sk, d) = (5, 6, 8);
    for causal in [0, 1] {
        let text = format!(
            "input q: bf16[2, {sq}, {d}]\ninput k: bf16[2, {sk}, {d}]\ninput v: bf16[2, {sk}, {d}]\n\
             input g: bf16[2, {sq}, {d}]\ninput st: f32[2, {sq}, 2]\ninput dl: f32[2, {sq}, 1]\n\
             input b: f32[2, {sq}, {sk}]\n\
             dq = attention_bias_grad_q(q, k, v, g, st, dl, b, 0.3, {causal})\n\
             dk = attention_bias_grad_k(q, k, v, g, st, dl, b, 0.3, {causal})\n\
             dv = attention_bias_grad_v(q, k, v, g, st, dl, b, 0.3, {causal})\n\
             output dq\noutput dk\noutput dv\n"
        );
        let p = parse_program("g.eqf", &text, &[]).unwrap();
        let mut inputs = random_inputs(&p, 5);
        // Batch entry 1, row 2: every key -3e38 (a bool mask's fill); row 4: -inf log-sum-exp.
        let bias = fill_bias(sq, sk, true);
        let mut st = Vec::new();
        for b in 0..2 {
            for i in 0..sq {
                let keys = if causal == 1 { (i + 1).min(sk) } else { sk };
                st.extend(match (b, i) {
                    (1, 2) => [-3e38f32 as f64, (keys as f64).ln()],
                    (1, 4) => [f32::MAX as f64, 0.0],
                    _ => [0.5 + 0.1 * i as f64, 0.0],
                });
            }
        }
        inputs.insert("b".into(), Tensor::new(DType::F32, vec![2, sq, sk], bias).unwrap());
        inputs.insert("st".into(), Tensor::new(DType::F32, vec![2, sq, 2], st).unwrap());
        let want = eval_with(&p, &inputs, Precision::F64).unwrap();
        let expanded = eqfuse::expand_composites(&p).unwrap();
        let got = eval_with(&expanded, &inputs, Precision::F64).unwrap();
        for (name, (g, w)) in ["dq", "dk", "dv"].iter().zip(got.iter().zip(&want)) {
            assert!(w.data.iter().all(|x| x.is_finite()), "causal {causal} {name}: {:?}", w.data);
            let cmp = g.compare(w, 1e-9, 1e-9);
            assert!(cmp.ok(), "causal {causal}, {name}: {cmp}");
        }
        // The row of fills weighs each key it includes 1 / keys: its share of dv (dv less dv
        // without its output gradient) is g_row / keys there, 0 past them. The row of -inf has
        // no weight: dq 0 there.
        let keys = if causal == 1 { 3 } else { sk };
        let mut without = inputs.clone();
        let g = without.get_mut("g").unwrap();
        let g_row: Vec<f64> = g.data[(sq + 2) * d..][..d].to_vec();
        g.data[(sq + 2) * d..][..d].fill(0.0);
        let other = eval_with(&p, &without, Precision::F64).unwrap();
        for j in 0..sk {
            for (c, &gc) in g_row.iter().enumerate() {
                let at = (sk + j) * d + c;
                let share = want[2].data[at] - other[2].data[at];
                let expect = if j < keys { gc / keys as f64 } else { 0.0 };
                // (log keys is stored as an f32: within 1e-7 relative.)
                assert!(
                    (share - expect).abs() <= 1e-6 * expect.abs(),
                    "causal {causal}, key {j}: {share} against {expect}"
                );
            }
        }
        let dq_row4 = &want[0].data[(sq + 4) * d..][..d];
        assert!(dq_row4.iter().all(|&x| x == 0.0), "causal {causal}: {dq_row4:?}");
    }
}

/// A query row whose every score is -inf (a bias of -inf on every key it keeps) contributes
/// nothing: its output is 0 and so are its gradients, never NaN; the row statistics say so
/// (`-inf` both), and the expansion agrees.
#[test]
fn fully_masked_rows_get_zero_gradients() {
    let (sq, sk, d) = (5, 6, 8);
    let mut p = bias_program("bf16", sq, sk, d, &format!("[2, {sq}, {sk}]"), 1, false);
    let mut values = fill_bias(sq, sk, true);
    for x in values.iter_mut().skip(sk * sq + 3 * sk).take(sk) {
        *x = f64::NEG_INFINITY; // batch entry 1, row 3
    }
    values[0] = f64::NEG_INFINITY; // batch entry 0, row 0's one key (causal)
    p.values.insert("b".into(), Tensor::new(DType::F32, vec![2, sq, sk], values).unwrap());
    let inputs = random_inputs(&p, 11);
    for precision in [Precision::F64, Precision::Declared] {
        let out = eval_with(&p, &inputs, precision).unwrap();
        for (o, t) in p.outputs.iter().zip(&out) {
            assert!(t.data.iter().all(|x| x.is_finite()), "{}: {:?}", o.name, t.data);
        }
        let dq = &out[1].data;
        for (b, i) in [(0, 0), (1, 3)] {
            let row = &dq[(b * sq + i) * d..][..d];
            assert!(row.iter().all(|&x| x == 0.0), "d_q of masked row ({b}, {i}): {row:?}");
        }
    }
    let stats = "input q: bf16[1, 2, 8]\ninput k: bf16[1, 3, 8]\ninput b: f32[1, 2, 3]\n\
                 s = attention_bias_lse(q, k, b, 0.5, 0)\noutput s\n";
    let mut sp = parse_program("s.eqf", stats, &[]).unwrap();
    let inf = f64::NEG_INFINITY;
    sp.values.insert("b".into(), Tensor::new(DType::F32, vec![1, 2, 3], vec![inf, inf, inf, 0.0, -3e38, 0.0]).unwrap());
    let inputs = random_inputs(&sp, 1);
    let s = &eval(&sp, &inputs).unwrap()[0];
    assert_eq!(s.shape, vec![1, 2, 2]);
    assert_eq!(s.data[..2], [inf, inf], "{:?}", s.data);
    assert!(s.data[2].is_finite() && s.data[3] >= 0.0 && s.data[3] < 2f64.ln() + 1e-6, "{:?}", s.data);
    let e = eval(&eqfuse::expand_composites(&sp).unwrap(), &inputs).unwrap();
    assert_eq!(e[0].data[..2], [inf, inf], "{:?}", e[0].data);
}

/// Training programs whose attention reads views: grouped-query keys and values
/// (`reshape(broadcast(reshape(k)))`, as `repeat_kv` writes them) and heads split from
/// projections with a bool padding mask lowered as `where(m, 0, -3e38)`. Their backward runs as
/// the flash kernels reading every view in place (no kernel but attention's reads q, k or v, so
/// no layout copy of them), the mask's bias selected in the kernels, no score matrix in memory,
/// and the traffic within a small multiple of the inputs and outputs; every kernel generates.
#[test]
fn training_plans_read_grouped_and_split_heads_in_place() {
    let grouped =
        |x: &str| format!("reshape(broadcast(reshape({x}, [B, KV, 1, S, D]), [B, KV, G, S, D]), [B, H, S, D])");
    let gqa = format!(
        "dim B = 2\ndim H = 8\ndim KV = 2\ndim G = 4\ndim S = 256\ndim D = 64\n\
         input q: bf16[B, H, S, D]\ninput k: bf16[B, KV, S, D]\ninput v: bf16[B, KV, S, D]\ninput dy: bf16[B, H, S, D]\n\
         o = attention(q, {}, {}, 0.125, 1)\n\
         loss = sum(sum(sum(sum(cast(o, f32) * cast(dy, f32), -1), -2), -3), -4)\n\
         dq = grad(loss, q)\ndk = grad(loss, k)\ndv = grad(loss, v)\noutput dq, dk, dv\n",
        grouped("k"),
        grouped("v")
    );
    let masked = "dim B = 2\ndim S = 256\ndim H = 4\ndim D = 64\ndim E = 256\n\
         input xq: bf16[B, S, E]\ninput xk: bf16[B, S, E]\ninput xv: bf16[B, S, E]\ninput dy: bf16[B, S, E]\n\
         input m: bool[B, 1, 1, S]\n\
         q = transpose(reshape(xq, [B, S, H, D]), 1, 2)\nk = transpose(reshape(xk, [B, S, H, D]), 1, 2)\n\
         v = transpose(reshape(xv, [B, S, H, D]), 1, 2)\n\
         y = reshape(transpose(attention_bias(q, k, v, where(m, 0, -3e38), 0.125, 1), 1, 2), [B, S, E])\n\
         loss = sum(sum(sum(cast(y, f32) * cast(dy, f32), -1), -2), -3)\n\
         dq = grad(loss, xq)\ndk = grad(loss, xk)\ndv = grad(loss, xv)\noutput dq, dk, dv\n";
    let opts = OptimizeOptions::new(DeviceProfile::load("h100").unwrap());
    for (name, src, grad_op, operands, scores) in [
        ("gqa", gqa.as_str(), "attention_grad_q", ["q", "k", "v"], 2 * 8 * 256 * 256),
        ("masked", masked, "attention_bias_grad_q", ["xq", "xk", "xv"], 2 * 4 * 256 * 256),
    ] {
        let p = parse_program(name, src, &[]).unwrap();
        let plan = eqfuse::optimize(&p, &opts).unwrap().plan;
        let shown: Vec<_> = plan.kernels.iter().map(|k| (k.template, k.ops.clone())).collect();
        assert!(plan.kernels.iter().any(|k| k.ops.iter().any(|o| o == grad_op)), "{name}: {shown:?}");
        for k in &plan.kernels {
            let reads_operand = k.reads.iter().any(|r| operands.contains(&r.name.as_str()));
            assert!(!reads_operand || k.template == eqfuse::Template::Attention, "{name}: a layout copy: {shown:?}");
            for t in k.reads.iter().chain(&k.writes) {
                assert!(t.ty.numel() < scores / 2, "{name}: kernel {} moves {} {}", k.id, t.name, t.ty);
            }
        }
        let io: u64 = p.inputs.iter().map(|i| i.ty.bytes()).sum::<u64>()
            + p.outputs.iter().map(|o| p.ty(o.id).unwrap().bytes()).sum::<u64>();
        assert!(plan.total.bytes <= 8 * io, "{name}: {} bytes against {io} of inputs and outputs", plan.total.bytes);
        let sources = eqfuse::codegen_plan(&plan).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(sources.iter().any(|s| s.name.starts_with("attention_bwd_dqkv")), "{name}");
    }
}
