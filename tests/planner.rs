//! Planner behaviour on small hand-built programs (no rules needed).

use eqfuse::{optimize, DType, DeviceProfile, OptimizeOptions, Program, Template, TensorType};

fn f32(shape: &[usize]) -> TensorType {
    TensorType::new(DType::F32, shape.to_vec())
}

fn opts() -> OptimizeOptions {
    OptimizeOptions::new(DeviceProfile::load("h100").unwrap())
}

#[test]
fn add_mul_is_one_kernel_with_floor_traffic() {
    let n = 1 << 20;
    let p = Program::from_sexprs(
        "add_mul",
        &[("x", f32(&[n])), ("y", f32(&[n])), ("z", f32(&[n]))],
        &[("out", "(* (+ x y) z)")],
    )
    .unwrap();
    let plan = optimize(&p, &opts()).unwrap().plan;
    assert_eq!(plan.total.kernels, 1);
    assert_eq!(plan.total.bytes, 4 * n as u64 * 4);
    assert_eq!(plan.unfused.kernels, 2);
    assert_eq!(plan.unfused.bytes, 6 * n as u64 * 4);
    assert_eq!(plan.kernels[0].template, Template::Elementwise);
}

#[test]
fn decomposed_layernorm_is_one_row_kernel() {
    let (r, c) = (4096, 1024);
    let y = "(+ (* (* (- x (mean x -1)) (rsqrt (+ (mean (* (- x (mean x -1)) (- x (mean x -1))) -1) 0.00001))) gamma) beta)";
    let p = Program::from_sexprs("ln", &[("x", f32(&[r, c])), ("gamma", f32(&[c])), ("beta", f32(&[c]))], &[("y", y)])
        .unwrap();
    let plan = optimize(&p, &opts()).unwrap().plan;
    assert_eq!(plan.total.kernels, 1, "{:#?}", plan.kernels);
    assert_eq!(plan.kernels[0].template, Template::RowReduce);
    let floor = (2 * r * c + 2 * c) as u64 * 4;
    assert_eq!(plan.total.bytes, floor);
    assert!(plan.unfused.kernels >= 8);
}

#[test]
fn residual_and_its_norm_share_one_kernel() {
    let (r, c) = (512, 768);
    let h = "(+ x res)";
    let y = "(layernorm (+ x res) g b 0.00001)";
    let p = Program::from_sexprs(
        "res_ln",
        &[("x", f32(&[r, c])), ("res", f32(&[r, c])), ("g", f32(&[c])), ("b", f32(&[c]))],
        &[("h", h), ("y", y)],
    )
    .unwrap();
    let plan = optimize(&p, &opts()).unwrap().plan;
    assert_eq!(plan.total.kernels, 1, "{:#?}", plan.kernels);
    assert_eq!(plan.kernels[0].writes.len(), 2);
}

#[test]
fn two_matmuls_stay_apart_and_bias_relu_fuse_into_the_product() {
    let p = Program::from_sexprs(
        "mlp",
        &[("x", f32(&[256, 512])), ("w1", f32(&[512, 1024])), ("b1", f32(&[1024])), ("w2", f32(&[1024, 64]))],
        &[("y", "(@ (relu (+ (@ x w1) b1)) w2)")],
    )
    .unwrap();
    let plan = optimize(&p, &opts()).unwrap().plan;
    assert_eq!(plan.total.kernels, 2, "{:#?}", plan.kernels);
    assert!(plan.kernels.iter().all(|k| k.template == Template::Gemm));
}

/// Plans `p` and checks the plan against the program on the reference.
fn plan_checked(p: &Program) -> eqfuse::FusionPlan {
    let plan = optimize(p, &opts()).unwrap().plan;
    let inputs = eqfuse::random_inputs(p, 7);
    for (name, cmp) in eqfuse::check_plan(p, &plan, &inputs).unwrap() {
        assert!(cmp.ok(), "{name}: {cmp}");
    }
    plan
}

/// A tensor consumed by a row reduction and a column reduction. When it is cheap to compute
/// from its inputs, both reduction kernels recompute it; when it is expensive (many
/// transcendentals per element) and large, computing it twice costs more than writing it once.
fn two_reductions(rows: usize, cols: usize, heavy: bool) -> Program {
    let t = if heavy {
        let mut e = "x".to_string();
        for _ in 0..24 {
            e = format!("(sin (exp (tanh {e})))");
        }
        e
    } else {
        "(* x 2)".to_string()
    };
    Program::from_sexprs(
        "two_reductions",
        &[("x", f32(&[rows, cols]))],
        &[("r", &format!("(sum {t} -1)")), ("c", &format!("(sum {t} 0)"))],
    )
    .unwrap()
}

#[test]
fn recompute_or_materialize_a_tensor_read_by_two_reductions() {
    // Cheap producer: recomputed inside both reductions, nothing but the results written.
    let plan = plan_checked(&two_reductions(64, 48, false));
    assert_eq!(plan.total.kernels, 2, "{:#?}", plan.kernels);
    assert!(plan.kernels.iter().all(|k| k.reads.iter().all(|r| r.name == "x")));
    // Heavy producer at a large size: written once, read by both reductions.
    let p = two_reductions(8192, 8192, true);
    let plan = optimize(&p, &opts()).unwrap().plan;
    assert_eq!(plan.total.kernels, 3, "{:#?}", plan.kernels);
    let heavy_large = plan.total.predicted_us;
    // The same heavy producer at a small size is launch-bound: recomputing it is cheaper.
    let plan = plan_checked(&two_reductions(64, 48, true));
    assert_eq!(plan.total.kernels, 2, "{:#?}", plan.kernels);
    assert!(heavy_large > plan.total.predicted_us);
}

#[test]
fn plans_compute_what_the_program_says() {
    type Case<'a> = (&'a str, &'a [(&'a str, &'a [usize])]);
    let cases: &[Case] = &[
        ("(softmax (* x 0.5) -1)", &[("x", &[6, 10])]),
        ("(/ (exp (- x (amax x -1))) (sum (exp (- x (amax x -1))) -1))", &[("x", &[5, 7])]),
        ("(+ (sum (* x y) 0) (mean y 0))", &[("x", &[4, 9]), ("y", &[4, 9])]),
        ("(transpose (relu (@ a b)) 0 1)", &[("a", &[3, 5]), ("b", &[5, 4])]),
        ("(layernorm (+ x r) g b 0.001)", &[("x", &[3, 8]), ("r", &[3, 8]), ("g", &[8]), ("b", &[8])]),
        ("(reshape (gelu (+ x b)) [4,3,2])", &[("x", &[4, 6]), ("b", &[6])]),
    ];
    for (expr, inputs) in cases {
        let inputs: Vec<(&str, TensorType)> = inputs.iter().map(|(n, s)| (*n, f32(s))).collect();
        let p = Program::from_sexprs("case", &inputs, &[("o", expr)]).unwrap();
        plan_checked(&p);
    }
}

#[test]
fn sign_facts_decide_whether_exp_log_cancels() {
    let b = [("b", f32(&[64, 32]))];
    let plan = plan_checked(&Program::from_sexprs("p", &b, &[("o", "(exp (log (+ (* b b) 1)))")]).unwrap());
    let ops: Vec<&str> = plan.kernels.iter().flat_map(|k| k.ops.iter().map(String::as_str)).collect();
    assert!(!ops.contains(&"exp") && !ops.contains(&"log"), "{ops:?}");
    let plan = plan_checked(&Program::from_sexprs("p", &b, &[("o", "(exp (log b))")]).unwrap());
    let ops: Vec<&str> = plan.kernels.iter().flat_map(|k| k.ops.iter().map(String::as_str)).collect();
    assert!(ops.contains(&"exp") && ops.contains(&"log"), "{ops:?}");
}

#[test]
fn bias_and_activation_fuse_into_a_product_with_a_transposed_operand() {
    let p = Program::from_sexprs(
        "linear",
        &[("x", f32(&[4, 16, 32])), ("w", f32(&[24, 32])), ("b", f32(&[24]))],
        &[("y", "(gelu (+ (@ x (transpose w 0 1)) b))")],
    )
    .unwrap();
    let plan = plan_checked(&p);
    assert_eq!(plan.total.kernels, 1, "{:#?}", plan.kernels);
    assert_eq!(plan.kernels[0].template, Template::Gemm);
}

#[test]
fn explain_names_the_inexact_rules_the_plan_depends_on_and_strict_uses_none() {
    let text = "input x: f32[1024, 1024]\ninput b: f32[1024]\n\
                y = (x + b) * 0.5 * (1 + erf((x + b) * 0.7071067811865476))\nz = sum(y * 2.0, -1) + sum(y, -1)\noutput z\n";
    let p = eqfuse::parse_program("g.eqf", text, &[]).unwrap();
    let o = OptimizeOptions { explanations: true, ..opts() };
    let fast = optimize(&p, &o).unwrap();
    let used = fast.rules_used.clone().expect("explanations were on");
    assert!(used.contains(&("gelu-from-erf".to_string(), true)), "{used:?}");
    assert!(
        eqfuse::explain(&fast).contains("inexact (they round differently; --strict leaves them out): gelu-from-erf")
    );
    let strict = optimize(&p, &OptimizeOptions { strict: true, ..o }).unwrap();
    assert!(strict.rules_used.unwrap().iter().all(|(_, inexact)| !inexact));
    assert!(strict.plan.search.strict && strict.plan.total.predicted_us >= fast.plan.total.predicted_us);
    // Without explanations nothing is claimed.
    assert!(optimize(&p, &opts()).unwrap().rules_used.is_none());
}

/// A scatter_add's kernel iterates over its values: the pointwise operators computing them are
/// fused in (their result is neither written nor read again), and it writes the scatter_add
/// alone, so values another kernel needs (an output here) are written by their own kernel.
#[test]
fn scatter_add_fuses_its_pointwise_producer_and_writes_nothing_else() {
    let t = TensorType::new(DType::I32, vec![4, 16]);
    let inputs = [("t", t), ("dy", f32(&[4, 16, 64])), ("m", f32(&[64]))];
    let p = Program::from_sexprs("s", &inputs, &[("w", "(scatter_add t (* (gelu dy) m) 0 1000)")]).unwrap();
    let plan = optimize(&p, &opts()).unwrap().plan;
    assert_eq!(plan.total.kernels, 1, "{:#?}", plan.kernels);
    assert_eq!(plan.kernels[0].domain, [4, 16, 64], "the iteration space is the values'");
    assert_eq!(plan.kernels[0].ops, ["gelu", "*", "scatter_add"]);
    let p = Program::from_sexprs(
        "s",
        &inputs,
        &[("g", "(* (gelu dy) m)"), ("w", "(scatter_add t (* (gelu dy) m) 0 1000)")],
    )
    .unwrap();
    let plan = optimize(&p, &opts()).unwrap().plan;
    assert_eq!(plan.total.kernels, 2, "{:#?}", plan.kernels);
    let k = plan.kernels.iter().find(|k| k.ops.contains(&"scatter_add".to_string())).unwrap();
    assert_eq!(k.writes.len(), 1);
    assert!(k.reads.iter().any(|r| r.name == "g"), "{:?}", k.reads);
}

/// The cost of a scatter_add: its values and indices read, its output written once (zeroed, or
/// converted from the accumulator), and every output element the values reach read and written
/// back once more by the atomics (4 bytes each way); a 16-bit output's f32 accumulator also
/// read once and zeroed.
#[test]
fn scatter_add_is_priced_with_its_atomics() {
    for (dtype, v, extra) in [(DType::F32, 1000, 0), (DType::Bf16, 1000, 2 * 4 * 1000 * 64), (DType::F32, 10, 0)] {
        let inputs = [("t", TensorType::new(DType::I32, vec![4, 16])), ("g", TensorType::new(dtype, vec![4, 16, 64]))];
        let p = Program::from_sexprs("s", &inputs, &[("w", &format!("(scatter_add t g 0 {v})"))]).unwrap();
        let dag = eqfuse::Dag::from_program(&p);
        let s = dag.nodes.iter().position(|n| n.kind() == Some(eqfuse::Kind::ScatterAdd)).unwrap();
        let profile = DeviceProfile::load("h100").unwrap();
        let mat = |i: usize| i == s || dag.nodes[i].role == eqfuse::Role::Input;
        let k = eqfuse::analyse(&dag, &[s], &mat, &profile).unwrap();
        assert_eq!(k.template, Template::Elementwise);
        assert_eq!(k.domain, [4, 16, 64]);
        let touched = (4 * 16 * 64usize).min(v * 64) as u64;
        assert_eq!(k.workspace_bytes, 2 * 4 * touched + extra as u64, "{dtype} into {v} rows");
        let size = dtype.size() as u64;
        let written = v as u64 * 64 * size;
        assert_eq!(k.bytes_read(written), 4 * 16 * 4 + 4 * 16 * 64 * size);
        let alone = k.predict_us(&dag, &profile, written);
        let mut without = k.clone();
        without.workspace_bytes = 0;
        let without = without.predict_us(&dag, &profile, written);
        assert!(alone > without, "{dtype}: the atomics' traffic counts");
    }
}

/// Dropout with its seed an i32 input (`tests/cases/ok/dropout_seed_input.eqf`): the bias, gelu
/// and dropout fuse into one kernel that reads the seed like any other input (4 bytes), the plan
/// computes the program for any seed value, and the kernel loads the seed's one element.
#[test]
fn dropout_with_a_tensor_seed_fuses_into_one_kernel() {
    let p = eqfuse::load_program("tests/cases/ok/dropout_seed_input.eqf", &[]).unwrap();
    let plan = optimize(&p, &opts()).unwrap().plan;
    assert_eq!(plan.total.kernels, 1, "{:#?}", plan.kernels);
    assert!(plan.kernels[0].reads.iter().any(|r| r.name == "s"), "{:?}", plan.kernels[0].reads);
    assert_eq!(plan.total.bytes, (2 * 64 * 128 + 128 + 1) * 4);
    let mut inputs = eqfuse::random_inputs(&p, 5);
    for seed in [0.0, 7.0, -1.0, i32::MAX as f64] {
        inputs.insert("s".into(), eqfuse::Tensor::new(DType::I32, vec![], vec![seed]).unwrap());
        for (out, cmp) in eqfuse::check_plan(&p, &plan, &inputs).unwrap() {
            assert!(cmp.ok(), "seed {seed}, output {out}: {cmp}");
        }
    }
    let sources = eqfuse::codegen_plan(&plan).unwrap();
    assert!(sources[0].source.contains("eq_dropout_seeded(") && sources[0].source.contains("p_s[0]"));
}

fn bf16(shape: &[usize]) -> TensorType {
    TensorType::new(DType::Bf16, shape.to_vec())
}

/// Three projections of one input `x [t, e]` (`x @ w` with `w [e, n_i]`, or torch's `linear`,
/// `x @ transpose(w, -1, -2)` with `w [n_i, e]`).
fn projections(t: usize, e: usize, ns: [usize; 3], linear: bool) -> Program {
    let mut inputs = vec![("x", bf16(&[t, e]))];
    let names = ["wq", "wk", "wv"];
    for (name, n) in names.iter().zip(ns) {
        inputs.push((name, if linear { bf16(&[n, e]) } else { bf16(&[e, n]) }));
    }
    let exprs: Vec<String> = names
        .iter()
        .map(|w| if linear { format!("(@ x (transpose {w} -1 -2))") } else { format!("(@ x {w})") })
        .collect();
    let outputs: Vec<(&str, &str)> = ["q", "k", "v"].iter().copied().zip(exprs.iter().map(String::as_str)).collect();
    Program::from_sexprs("qkv", &inputs, &outputs).unwrap()
}

fn gemms(plan: &eqfuse::FusionPlan) -> Vec<&eqfuse::Kernel> {
    plan.kernels.iter().filter(|k| k.template == Template::Gemm).collect()
}

/// Narrow projections of a large input (Llama-like queries, keys and values of small heads):
/// reading `x` once in one product of the concatenated weights beats reading it three times, so
/// the planner picks the fused form (`matmul-shared-lhs`), in both spellings; at a size the
/// reference can run, the fused plan computes the program. Under `--strict` the rule is left
/// out (it is `:inexact`) and the three products stay.
#[test]
fn narrow_projections_of_one_input_share_one_product() {
    for linear in [false, true] {
        let p = projections(8192, 4096, [64, 64, 64], linear);
        let plan = optimize(&p, &opts()).unwrap().plan;
        let g = gemms(&plan);
        assert_eq!(g.len(), 1, "{:#?}", plan.kernels);
        assert!(g[0].reads.iter().any(|r| r.name == "x"));
        assert!(plan.total.predicted_us < 0.6 * plan.unfused.predicted_us, "{} us", plan.total.predicted_us);
        let strict = optimize(&p, &OptimizeOptions { strict: true, ..opts() }).unwrap().plan;
        assert_eq!(gemms(&strict).len(), 3);
        let small = projections(1024, 1024, [16, 16, 16], linear);
        let plan = plan_checked(&small);
        assert_eq!(gemms(&plan).len(), 1, "{:#?}", plan.kernels);
    }
}

/// Llama-size projections (x [8192, 2048], queries 2048 wide, keys and values 256): the keys'
/// and values' products share one (each alone reads all of `x` for little work), while the
/// queries' product, bound by its arithmetic, stays alone: fusing it would hide no read of `x`
/// and add a copy of its 8 MiB weight and of its 32 MiB result out of the fused one.
#[test]
fn llama_projections_fuse_keys_and_values_only() {
    let p = projections(8192, 2048, [2048, 256, 256], false);
    let plan = optimize(&p, &opts()).unwrap().plan;
    let g = gemms(&plan);
    assert_eq!(g.len(), 2, "{:#?}", plan.kernels);
    assert!(g.iter().any(|k| k.reads.iter().any(|r| r.name == "wq") && k.writes.iter().any(|w| w.name == "q")));
    assert!(plan.total.predicted_us < plan.unfused.predicted_us);
}

/// A row kernel runs a block a row, unless codegen cuts few long rows into segments: under
/// strict numerics (which segment nothing) a whole tensor summed to one value (one row) moves
/// its bytes through one SM, priced at the SM's share of the copy bandwidth, not the device's
/// (the fidelity run measured such kernels 60-80x over the device-wide price); segmented, or
/// with as many rows as SMs, the device-wide price stands.
#[test]
fn few_rows_are_priced_by_the_sms_they_occupy() {
    let profile = DeviceProfile::load("h100").unwrap();
    let sms = f64::from(profile.sm_count.unwrap());
    let per_sm = profile.copy_bandwidth_gbs * 1e3 / sms; // bytes a microsecond
    for (strict, rows, width) in
        [true, false].into_iter().flat_map(|s| [(s, 1usize, 1usize << 22), (s, 4, 1 << 20), (s, 1024, 4096)])
    {
        let src = format!("input x: f32[{rows}, {width}]\ny = sum(x, -1)\noutput y\n");
        let p = eqfuse::parse_program("rows.eqf", &src, &[]).unwrap();
        let mut o = opts();
        o.strict = strict;
        let plan = optimize(&p, &o).unwrap().plan;
        let k = plan.kernels.iter().find(|k| k.template == Template::RowReduce).expect("a row kernel");
        let floor = (rows * width * 4) as f64 / (rows as f64 * per_sm);
        if (rows as f64) < sms && strict {
            assert!(k.predicted_us >= floor, "{rows} rows: {} < {floor}", k.predicted_us);
        } else {
            let one_sm = (rows * width * 4) as f64 / per_sm;
            assert!(k.predicted_us < one_sm / 10.0, "{rows} rows: {} priced near one SM's {one_sm}", k.predicted_us);
        }
    }
}

/// The forward of a 2-layer Llama as the torch exporter writes it (64 wide, grouped-query heads,
/// RoPE reading q and k from one fused projection, f32; `python/tests/test_models.py`'s tiny
/// config). Its plan once fused the store of q (a slice of the fused product, `[32, 64]`) into
/// the kernel rotating q's second half, whose iteration space `[2, 4, 16, 8]` covers a quarter of
/// q: on the GPU three quarters of q stayed unwritten (poisoned in `eqfuse run`, garbage through
/// the torch backend). No elementwise kernel may write a tensor its iteration space does not
/// cover (the plan checker refuses it too).
#[test]
fn an_elementwise_kernel_writes_only_what_its_iteration_space_covers() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/cases/graphs/llama_tiny_f32.json");
    let p = eqfuse::program_from_json(path, &std::fs::read_to_string(path).unwrap()).unwrap();
    let plan = optimize(&p, &opts()).unwrap().plan;
    for k in plan.kernels.iter().filter(|k| k.template == Template::Elementwise) {
        for w in &k.writes {
            let fits = w.ty.shape.len() <= k.domain.len()
                && w.ty.shape.iter().rev().zip(k.domain.iter().rev()).all(|(&s, &d)| s == d || s == 1);
            assert!(fits, "kernel {} writes {} {:?} over {:?}", k.id, w.name, w.ty.shape, k.domain);
        }
    }
}

/// T5's relative position bias, looked up as [S, S, H] and permuted to [H, S, S]: read in place
/// its values lie H apart along the keys, so every bias read touches a sector of its own (on an
/// H100 the attention ran at 378 us for 77 us of work). The attention kernels are priced by the
/// sectors they touch, and the plan writes the permuted bias once (a transpose kernel) for both
/// attentions to read along the keys.
#[test]
fn a_bias_strided_along_the_keys_is_written_once_in_its_own_layout() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/cases/ok/position_bias_attention.eqf");
    let p = eqfuse::load_program(path, &[]).unwrap();
    let plan = optimize(&p, &opts()).unwrap().plan;
    let attention: Vec<_> = plan.kernels.iter().filter(|k| k.template == Template::Attention).collect();
    assert_eq!(attention.len(), 2, "{:#?}", plan.kernels);
    let transposed: Vec<_> = plan
        .kernels
        .iter()
        .filter(|k| k.template == Template::Elementwise && k.ops.iter().any(|o| o == "transpose"))
        .flat_map(|k| k.writes.iter().map(|w| w.name.clone()))
        .collect();
    // The same attention with the bias an input laid out along the keys: the price to match.
    let text = std::fs::read_to_string(path).unwrap();
    let text = text
        .replace("input buckets: i32[S, S]", "input hss: bf16[H, S, S]")
        .replace("transpose(transpose(pos, 1, 2), 0, 1)", "hss");
    let text = text.replace("input table: bf16[32, H]\n", "").replace("pos = gather(table, buckets, 0)\n", "");
    let contiguous = eqfuse::parse_program("contiguous.eqf", &text, &[]).unwrap();
    let want = optimize(&contiguous, &opts()).unwrap().plan;
    let want = want.kernels.iter().find(|k| k.template == Template::Attention).unwrap().predicted_us;
    for a in &attention {
        assert!(a.reads.iter().any(|r| transposed.contains(&r.name)), "kernel {} reads {:?}", a.id, a.reads);
        assert!(a.predicted_us <= want * 1.05, "kernel {}: {} us, {} us along the keys", a.id, a.predicted_us, want);
    }
}

/// The same bias read by a softmax over scores already computed (T5's attention in f32, where
/// the scores were a product of their own): a row kernel's lanes would read the bias along the
/// keys with a stride of H elements, every score through a sector of its own, and each batch
/// entry again. Priced as contiguous, that softmax was planned so, predicted 0.30 ms and ran
/// 1.80 ms (8 x 12 x 1024 x 1024 f32 scores, H100, 2026-11-27). Priced by the sectors its warps
/// touch, the plan reads the bias some other way (here an elementwise kernel adds it through a
/// shared-memory tile), and the strided bias is never predicted cheaper than a contiguous one.
#[test]
fn a_row_kernel_does_not_read_a_bias_strided_along_its_rows() {
    let text = |bias: &str, view: &str| {
        format!(
            "input s: f32[8, 12, 512, 512]\ninput b: f32[{bias}]\n\
             y = softmax(s + reshape({view}, [1, 12, 512, 512]), -1)\noutput y\n"
        )
    };
    let view = "transpose(transpose(b, 0, -1), -1, 1)";
    let strided = eqfuse::parse_program("strided.eqf", &text("512, 512, 12", view), &[]).unwrap();
    let contiguous = eqfuse::parse_program("contiguous.eqf", &text("12, 512, 512", "b"), &[]).unwrap();
    let plan = optimize(&strided, &opts()).unwrap().plan;
    let want = optimize(&contiguous, &opts()).unwrap().plan.total.predicted_us;
    assert!(plan.total.predicted_us >= want, "strided {} us, contiguous {want} us", plan.total.predicted_us);
    for k in plan.kernels.iter().filter(|k| k.template == Template::RowReduce) {
        assert!(
            !k.reads.iter().any(|r| r.name == "b"),
            "row kernel {} reads the strided bias: {:#?}",
            k.id,
            plan.kernels
        );
    }
}

/// Batched products of tiny matrices (the random programs' worst-priced kernels: g1373, g1020,
/// g1386 of seed 1001, measured 10 to 120 times their old prediction as one cuBLASLt call over
/// a batch of up to a million matrices): priced by their tiles, such a call loses to the
/// product as a sum along a short row (`matmul-as-rows`), one row kernel that reads the large
/// operand once. At the programs' sizes no plan holds a cuBLASLt call over the batch; at a size
/// the reference runs the plan computes the program. (A shared right operand folds the batch into
/// one tall matrix, which cuBLASLt runs at its bytes' time: f32 [8192, 96, 4, 13] by [13, 8],
/// 33 MB, in 28 us on an H200, `benches/results/2026-11-28-h200-session19`.)
#[test]
fn batched_tiny_products_plan_as_rows_not_as_a_library_call() {
    let program = |batch: usize, m: usize, k: usize, n: usize, dtype: DType, gelu: bool| {
        let a = if gelu { "(* (gelu x) 0.25)" } else { "x" };
        Program::from_sexprs(
            "tiny",
            &[("x", TensorType::new(dtype, vec![batch, 512, m, k])), ("w", TensorType::new(dtype, vec![n, k]))],
            &[("y", &format!("(@ {a} (* (transpose w -1 -2) 0.5))"))],
        )
        .unwrap()
    };
    let shapes =
        [(2048, 1, 13, 1, DType::F32, true), (256, 2, 3, 4, DType::F16, false), (128, 8, 3, 8, DType::F32, false)];
    for &(batch, m, k, n, dtype, gelu) in &shapes {
        let p = program(batch, m, k, n, dtype, gelu);
        let plan = optimize(&p, &opts()).unwrap().plan;
        let what = format!("[{batch},512,{m},{k}] @ [{k},{n}] {dtype}");
        // No cuBLASLt call over a batch of small matrices (the measured pathology); one call
        // over the tall matrix the shared weight folds the batch into may run it. Rows of 3
        // f32 read one element a lane, priced by the row template's time a row
        // (`rowreduce.row_ns`: the g1386-like product ran 419 us as rows on the H100), may lose
        // to a gemm.
        let lt = |plan: &eqfuse::FusionPlan| {
            gemms(plan).iter().any(|g| {
                let call = eqfuse::codegen_kernel(plan, g).unwrap().cublaslt;
                call.is_some_and(|c| c.batch * c.calls() > 1 || c.m.min(c.n) * c.m.max(c.n) < (batch * 512) as u64)
            })
        };
        assert!(!lt(&plan), "{what}: {:#?}", gemms(&plan));
        if n <= 4 {
            // A row kernel, or the one folded call.
            let folded = gemms(&plan).iter().all(|g| g.implementation == Some(eqfuse::GemmImpl::Cublaslt));
            let rows = plan.kernels.iter().any(|k| k.template == Template::RowReduce);
            assert!(rows || (folded && gemms(&plan).len() == 1), "{what}: {:#?}", plan.kernels);
        }
        // The unfused plan's product is one cuBLASLt call over one tall matrix (the shared
        // weight folds the batch into its rows: `codegen::gemm::lt_call`), priced by that
        // matrix's tiles and bytes, not by a tile for each small matrix of the batch.
        let h100 = DeviceProfile::load("h100").unwrap();
        let unfused = eqfuse::unfused_plan(&p, &h100, false).unwrap();
        let g = gemms(&unfused)[0];
        let bytes_us = (g.bytes_read + g.bytes_written) as f64 / 2989.4e3;
        let tile_ns = h100.gemm_rates(eqfuse::GemmImpl::Cublaslt).tile_ns.unwrap();
        let per_matrix_us = 1e-3 * tile_ns * (batch * 512) as f64;
        assert!(
            g.predicted_us > bytes_us && g.predicted_us < 0.25 * per_matrix_us,
            "{what}: {} us, bytes {bytes_us} us, a tile a matrix {per_matrix_us} us",
            g.predicted_us
        );
        // Distinct right operands do not fold: the call runs a tile for every matrix, far
        // above its bytes' time.
        let batched = Program::from_sexprs(
            "tiny-batched",
            &[
                ("x", TensorType::new(dtype, vec![batch, 512, m, k])),
                ("w", TensorType::new(dtype, vec![batch, 512, k, n])),
            ],
            &[("y", "(@ x w)")],
        )
        .unwrap();
        let unfused = eqfuse::unfused_plan(&batched, &h100, false).unwrap();
        let g = gemms(&unfused)[0];
        let bytes_us = (g.bytes_read + g.bytes_written) as f64 / 2989.4e3;
        assert!(g.predicted_us > 4.0 * bytes_us, "{what}, batched: {} us, bytes {bytes_us} us", g.predicted_us);
        let small = program(batch / 8, m, k, n, dtype, gelu);
        let plan = plan_checked(&small);
        assert!(!lt(&plan), "{what} / 8");
    }
}

/// A layer norm's bf16 weight gradient, `cast(sum(sum(cast(g) * xh, 0), 1), bf16)` (the sums
/// over the batch and the sequence of PyTorch's `sum(.., [0, 1])`): the cast runs in the second
/// column reduction as its last block stores the sums, not as a kernel of its own; the plan
/// computes what the program says.
#[test]
fn a_cast_of_a_column_reduction_is_stored_by_the_reduction() {
    let inputs = [("g", bf16(&[8, 128, 96])), ("xh", f32(&[8, 128, 96]))];
    let outputs =
        [("dw", "(cast (sum (sum (* (cast g f32) xh) 0) 1) bf16)"), ("db", "(cast (sum (sum (cast g f32) 0) 1) bf16)")];
    let p = Program::from_sexprs("lnw", &inputs, &outputs).unwrap();
    let plan = plan_checked(&p);
    let kernels: Vec<(Template, &Vec<String>)> = plan.kernels.iter().map(|k| (k.template, &k.ops)).collect();
    for out in ["dw", "db"] {
        let k = plan.kernels.iter().find(|k| k.writes.iter().any(|w| w.name == out)).unwrap();
        assert_eq!(k.template, Template::ColReduce, "{out}: {kernels:?}");
        assert!(k.ops.iter().any(|o| o == "sum") && k.ops.iter().any(|o| o == "cast"), "{out}: {kernels:?}");
    }
    assert!(plan.kernels.iter().all(|k| k.template == Template::ColReduce), "{kernels:?}");
}

/// A product of inner size 1 (Llama's rotary table: `inv_freq[:, None] @ positions[None, :]`,
/// then `cos` and `sin`) is an outer product, `a * b` (`matmul-outer`, exact): no product
/// kernel, and the multiply fuses with the `cos` and `sin` that read it where no view stands
/// between them; the plan computes the program, f32 and bf16.
#[test]
fn outer_products_plan_as_elementwise_kernels() {
    for dtype in [DType::F32, DType::Bf16] {
        let inputs =
            [("inv", TensorType::new(dtype, vec![4, 64, 1])), ("pos", TensorType::new(dtype, vec![4, 1, 2048]))];
        let outputs = [("c", "(cos (@ inv pos))"), ("s", "(sin (@ inv pos))"), ("p", "(@ pos (transpose pos -1 -2))")];
        let p = Program::from_sexprs("rope", &inputs, &outputs).unwrap();
        let plan = plan_checked(&p);
        let kernels: Vec<(Template, &Vec<String>)> = plan.kernels.iter().map(|k| (k.template, &k.ops)).collect();
        let cs: Vec<_> =
            plan.kernels.iter().filter(|k| k.writes.iter().any(|w| w.name == "c" || w.name == "s")).collect();
        assert!(cs.iter().all(|k| k.template == Template::Elementwise), "{dtype}: {kernels:?}");
        assert!(!cs.iter().any(|k| k.ops.iter().any(|o| o == "@")), "{dtype}: {kernels:?}");
        // A product over an inner size of 2048 of one output column (a batch of dot products)
        // is a row sum (`matmul-as-rows`), no product kernel either.
        assert!(gemms(&plan).is_empty(), "{dtype}: {kernels:?}");
        let p = plan.kernels.iter().find(|k| k.writes.iter().any(|w| w.name == "p")).unwrap();
        assert_eq!(p.template, Template::RowReduce, "{dtype}: {kernels:?}");
    }
}
