//! Golden CUDA: the generated part (header, `#define` block and fused body functions) of the
//! kernels of a few small programs and examples, as `insta` snapshots. A change to code
//! generation that alters a kernel shows up here in review; the templates themselves are the
//! files in `kernels/`. Also checks `write_codegen_dir`'s files.

mod common;

use eqfuse::{codegen_plan, optimize, write_codegen_dir, DeviceProfile, KernelSource, OptimizeOptions, Program};

fn opts() -> OptimizeOptions {
    OptimizeOptions::new(DeviceProfile::load("h100").unwrap())
}

/// The generated part of a kernel's source (everything but the verbatim header and template).
fn generated(s: &KernelSource) -> String {
    let head = s.source.split("\n// ---- kernels/common.cuh ----\n").next().unwrap_or_default();
    let body = s.source.split("\n// ---- generated body ----\n").nth(1).unwrap_or_default();
    let body = body.split("\n// ---- kernels/").next().unwrap_or_default();
    format!("{head}\n{body}")
}

fn snapshot_program(name: &str, program: &Program) {
    let plan = optimize(program, &opts()).unwrap().plan;
    let text: Vec<String> = codegen_plan(&plan).unwrap().iter().map(generated).collect();
    insta::assert_snapshot!(format!("cuda_{name}"), text.join("\n"));
}

#[test]
fn generated_cuda_of_small_cases() {
    let wanted = [
        "bias_gelu_dropout",
        "dropout_seed_tensor",
        "layernorm",
        "rmsnorm_bf16",
        "bias_grads",
        "cross_entropy",
        "views",
        "halves",
    ];
    for case in common::cases().into_iter().filter(|c| wanted.contains(&c.name)) {
        snapshot_program(case.name, &case.program);
    }
}

/// Index maps (issue 20) as reads of the kernels that use them: a slice at an offset and a
/// stride, a concatenation as a select between two clamped reads, a gather at a loaded index
/// (clamped: an index out of range reads a wrong element, never outside the tensor); and
/// scatter_adds as atomic adds at a loaded index (an index out of range adds nothing).
#[test]
fn generated_cuda_of_index_maps() {
    let wanted = [
        "slices_and_concat",
        "gathers",
        "rope_bf16",
        "scatter_embedding_grad",
        "scatter_fused_bf16",
        "scatter_last_axis",
        "scatter_middle_axis_i32",
    ];
    for case in common::cases().into_iter().filter(|c| wanted.contains(&c.name)) {
        snapshot_program(case.name, &case.program);
    }
    for name in ["rope", "embedding_layernorm"] {
        let p = eqfuse::load_program(&format!("examples/{name}.eqf"), &[]).unwrap();
        let plan = optimize(&p, &opts()).unwrap().plan;
        let sources = codegen_plan(&plan).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(sources.len(), if name == "rope" { 2 } else { 1 }, "{name}");
    }
}

/// The gradient of a slice is the upstream gradient between zeros (concats with broadcast
/// literals), which codegen renders; the gradient of a gather is a scatter_add, which runs in a
/// scatter kernel (`kernels/scatter.cu`) summing by atomics, except under `--strict`, which
/// refuses float atomics as not supported yet (so the GPU runs count the program as skipped).
#[test]
fn gradients_of_index_maps_render() {
    let head = "input x: f32[64, 256]\ninput w: f32[64, 128]\ninput t: i32[64]\ninput table: f32[1000, 128]\n\
                loss = sum(sum(slice(x, -1, 64, 192) * w * gather(table, t, 0), -1), 0)\n";
    let p = eqfuse::parse_program("g.eqf", &format!("{head}gx = grad(loss, x)\noutput loss, gx\n"), &[]).unwrap();
    let plan = optimize(&p, &opts()).unwrap().plan;
    codegen_plan(&plan).unwrap();
    let p = eqfuse::parse_program("g.eqf", &format!("{head}gt = grad(loss, table)\noutput gt\n"), &[]).unwrap();
    let plan = optimize(&p, &opts()).unwrap().plan;
    let sources = codegen_plan(&plan).unwrap();
    let scatter: Vec<&KernelSource> = sources.iter().filter(|s| s.name.starts_with("scatter_f32_k")).collect();
    assert_eq!(scatter.len(), 1, "{:?}", sources.iter().map(|s| &s.name).collect::<Vec<_>>());
    let s = scatter[0];
    assert!(s.source.contains("// ---- kernels/scatter.cu ----") && s.scheduled_sums && s.launch.wave);
    // The counters (and nothing else: an f32 table is summed in place) are a zeroed workspace.
    let ws: Vec<_> = s.args.iter().filter(|a| a.role == eqfuse::ArgRole::Workspace).collect();
    assert!(ws.len() == 1 && ws[0].name == "eq_count" && ws[0].zeroed, "{ws:?}");
    // The values `w * slice(x)` (times the loss's gradient) are computed in the scatter kernel.
    let k = &plan.kernels[s.kernel];
    assert!(k.reads.iter().any(|r| r.name == "w") && k.reads.iter().any(|r| r.name == "t"), "{:?}", k.reads);
    let strict = optimize(&p, &OptimizeOptions { strict: true, ..opts() }).unwrap().plan;
    let e = codegen_plan(&strict).unwrap_err().to_string();
    assert!(e.contains("scatter_add") && e.contains("not supported yet"), "{e}");
}

/// A bf16 scatter_add sums in an f32 accumulator (a zeroed workspace the kernel leaves zero)
/// and rounds once; an i32 one adds in place and is deterministic.
#[test]
fn scatter_kernels_by_dtype() {
    let cases = common::cases();
    let sources = |name: &str| {
        let case = cases.iter().find(|c| c.name == name).unwrap();
        let plan = optimize(&case.program, &opts()).unwrap().plan;
        codegen_plan(&plan).unwrap()
    };
    let bf16 = sources("scatter_fused_bf16");
    assert_eq!(bf16.len(), 1, "the gelu and the product are computed in the scatter kernel");
    let acc = bf16[0].args.iter().find(|a| a.name == "eq_acc").expect("an f32 accumulator");
    assert!(acc.zeroed && acc.bytes == 100 * 64 * 4, "{acc:?}");
    assert!(bf16[0].source.contains("#define EQ_ACC 1") && bf16[0].scheduled_sums);
    let ints = sources("scatter_middle_axis_i32");
    assert!(ints[0].source.contains("#define EQ_ACC 0") && !ints[0].scheduled_sums);
}

#[test]
fn generated_cuda_of_examples() {
    for name in ["softmax", "cross_entropy", "add_mul"] {
        let p = eqfuse::load_program(&format!("examples/{name}.eqf"), &[]).unwrap();
        snapshot_program(&format!("example_{name}"), &p);
    }
}

#[test]
fn codegen_dir_holds_sources_plan_and_manifest() {
    let case = common::cases().into_iter().find(|c| c.name == "residual_layernorm").unwrap();
    let plan = optimize(&case.program, &opts()).unwrap().plan;
    let dir = tempfile::tempdir().unwrap();
    let sources = write_codegen_dir(&plan, dir.path()).unwrap();
    for s in &sources {
        let text = std::fs::read_to_string(dir.path().join(&s.file)).unwrap();
        assert_eq!(text, s.source);
        assert!(text.contains(&format!("EQ_KERNEL {}", s.name)));
    }
    let plan_json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("plan.json")).unwrap()).unwrap();
    assert_eq!(plan_json["schema"], "eqfuse.plan/1");
    let m: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("launch.json")).unwrap()).unwrap();
    assert_eq!(m["schema"], "eqfuse.launch/1");
    let k = &m["kernels"][0];
    for key in ["name", "file", "template", "launch", "args"] {
        assert!(k.get(key).is_some(), "manifest kernel without `{key}`");
    }
    assert_eq!(k["args"][0]["role"], "read");
    assert!(k["launch"]["grid"].as_array().is_some_and(|g| g.len() == 3));
}

#[test]
fn strict_kernels_round_like_the_unfused_plan() {
    // (a*b + c) in bf16, then a row sum and a softmax: the default plan contracts and keeps f32
    // intermediates; the strict plan never contracts, rounds every bf16 value where it is
    // computed, and sums rows in the unfused order (4 lanes, no online max/sum pair).
    let text = "input a: bf16[64, 256]\ninput b: bf16[64, 256]\ninput c: bf16[64, 256]\n\
                t = a * b + c\ny = softmax(t, -1)\ns = sum(t, -1)\noutput y, s\n";
    let program = eqfuse::parse_program("strict.eqf", text, &[]).unwrap();
    let render = |strict: bool| {
        let plan = optimize(&program, &OptimizeOptions { strict, ..opts() }).unwrap().plan;
        assert_eq!(plan.search.strict, strict);
        codegen_plan(&plan).unwrap().iter().map(generated).collect::<String>()
    };
    let (fast, strict) = (render(false), render(true));
    assert!(!fast.contains("__fmul_rn") && !fast.contains("eq_round_bf16(("), "{fast}");
    assert!(strict.contains("__fmul_rn(") && strict.contains("__fadd_rn("), "{strict}");
    assert!(strict.contains("eq_round_bf16(__fadd_rn("), "bf16 values rounded where computed:\n{strict}");
    assert!(strict.contains("#define EQ_VEC 4") && !strict.contains("#define EQ_VEC 8"), "{strict}");
    let plan = optimize(&program, &OptimizeOptions { strict: true, ..opts() }).unwrap().plan;
    assert_eq!(eqfuse::plan_json(&plan)["strict"], true);
    let unfused = eqfuse::unfused_plan(&program, &opts().profile, true).unwrap();
    assert!(codegen_plan(&unfused).unwrap().iter().any(|s| s.source.contains("__fadd_rn(")));
}

#[test]
fn gemm_kernels_render_in_their_implementation() {
    // dense.eqf: relu(x @ w + b) is one cuBLASLt call with the RELU_BIAS epilogue; x is
    // row-major [M, K], so in cuBLASLt's column-major terms w is the first operand, untransposed.
    let p = eqfuse::load_program("examples/dense.eqf", &[]).unwrap();
    let plan = optimize(&p, &opts()).unwrap().plan;
    assert_eq!(plan.kernels[0].implementation, Some(eqfuse::GemmImpl::Cublaslt));
    let s = &codegen_plan(&plan).unwrap()[0];
    let call = s.cublaslt.as_ref().expect("a cuBLASLt call");
    assert_eq!(call.epilogue, eqfuse::LtEpilogue::ReluBias);
    assert_eq!((call.m, call.n, call.k), (4096, 4096, 1024));
    assert_eq!((call.a.tensor.as_str(), call.a.transpose, call.a.ld), ("w", false, 4096));
    assert_eq!((call.b.tensor.as_str(), call.b.transpose, call.b.ld), ("x", false, 1024));
    assert!(s.source.is_empty());
    // A transposed operand flips its op flag instead of being copied.
    let t = eqfuse::parse_program(
        "t",
        "input x: f32[1024, 512]\ninput w: f32[1024, 1536]\ny = transpose(x, 0, 1) @ w\noutput y\n",
        &[],
    )
    .unwrap();
    let plan = optimize(&t, &opts()).unwrap().plan;
    let call = codegen_plan(&plan).unwrap()[0].cublaslt.clone().expect("a cuBLASLt call");
    assert_eq!((call.b.tensor.as_str(), call.b.transpose, call.b.ld), ("x", true, 512));
    // Heads inside rows ([B, S, H, D] viewed as [B, H, S, D]): no one stride spans B and H, so
    // the call batches over H (stride D) and loops over B; the scale is its alpha.
    let t = eqfuse::parse_program(
        "t",
        "input p: f32[2, 3, 40, 40]\ninput v: f32[2, 40, 3, 16]\ny = p @ transpose(v, 1, 2) * 0.5\noutput y\n",
        &[],
    )
    .unwrap();
    let plan = optimize(&t, &opts()).unwrap().plan;
    let mut k = plan.kernels[0].clone();
    k.implementation = Some(eqfuse::GemmImpl::Cublaslt);
    let call = eqfuse::gemm_cublaslt_call(&k).expect("a cuBLASLt call");
    assert_eq!((call.batch, call.a.batch_stride, call.b.batch_stride), (3, 16, 1600));
    assert_eq!((call.a.tensor.as_str(), call.a.transpose, call.a.ld), ("v", false, 48));
    assert_eq!(call.alpha, 0.5);
    assert_eq!(call.outer, vec![eqfuse::LtLoop { count: 2, a: 40 * 48, b: 4800, d: 1920 }]);
    assert_eq!(call.calls(), 2);
    assert_eq!(call.offsets(), vec![[0, 0, 0], [1920, 4800, 1920]]);
    // Axes one stride spans merge into the call's batch: [2, 3] contiguous is a batch of 6.
    let t =
        eqfuse::parse_program("t", "input a: f32[2, 3, 8, 4]\ninput b: f32[2, 3, 4, 8]\ny = a @ b\noutput y\n", &[])
            .unwrap();
    let call = eqfuse::gemm_cublaslt_call(&optimize(&t, &opts()).unwrap().plan.kernels[0]).expect("a call");
    assert_eq!((call.batch, call.calls()), (6, 1));
    // A linear layer over [batch, rows, k] activations shares its weight: one product of
    // batch x rows rows (large tiles), not a batch of small matrices each padded to its tiles.
    let t = eqfuse::parse_program("t", "input x: f32[8, 197, 64]\ninput w: f32[64, 96]\ny = x @ w\noutput y\n", &[])
        .unwrap();
    let call = eqfuse::gemm_cublaslt_call(&optimize(&t, &opts()).unwrap().plan.kernels[0]).expect("a call");
    assert_eq!((call.batch, call.m, call.n, call.calls()), (1, 96, 8 * 197, 1));
    assert_eq!((call.b.cols, call.b.ld, call.b.batch_stride, call.a.batch_stride), (8 * 197, 64, 0, 0));
    // The weight on the left of a batch does not fold (its rows would interleave the outputs).
    let t = eqfuse::parse_program("t", "input w: f32[96, 64]\ninput x: f32[8, 64, 197]\ny = w @ x\noutput y\n", &[])
        .unwrap();
    let call = eqfuse::gemm_cublaslt_call(&optimize(&t, &opts()).unwrap().plan.kernels[0]).expect("a call");
    assert_eq!((call.batch, call.m, call.n), (8, 197, 96));
    // softmax(x @ w) of a small product is one generated kernel whose epilogue is the row
    // template's functions; its one 64-row tile splits the 128-deep sum over two blocks.
    let dims = [("B".to_string(), 64), ("F".to_string(), 128), ("K".to_string(), 10)];
    let p = eqfuse::load_program("examples/softmax_regression.eqf", &dims).unwrap();
    let plan = optimize(&p, &opts()).unwrap().plan;
    assert_eq!(plan.kernels.len(), 1);
    assert_eq!(plan.kernels[0].implementation, Some(eqfuse::GemmImpl::Generated));
    let s = &codegen_plan(&plan).unwrap()[0];
    assert!(s.cublaslt.is_none() && s.name == "gemm_f32_k0");
    for needle in ["#define EQ_EPI_ROWS 1", "eq_accum", "// ---- kernels/gemm.cu ----", "p_eq_product"] {
        assert!(s.source.contains(needle), "missing {needle}");
    }
    assert!(s.source.contains("#define EQ_SPLITS 2\n") && s.launch.grid == [2, 1, 1]);
    let names: Vec<_> = s.args.iter().map(|a| a.name.as_str()).collect();
    assert_eq!(
        names,
        ["x", "w", "probs", "eq_split_ws", "eq_split_count"],
        "the product tile is not a kernel argument"
    );
}

/// Every program the GPU differential run saved plans (default and strict) into kernels that
/// codegen renders, or refuses only as "not supported yet" (which the GPU run counts as
/// skipped): a kernel the cost model accepts and codegen refuses otherwise is a legality
/// mismatch, which without a GPU shows up only here. (Whether a rendered kernel computes the
/// right values is the GPU run's to say: `every_saved_gpu_case_passes`.)
#[test]
fn saved_gpu_cases_plan_into_kernels_codegen_renders() {
    let mut files: Vec<_> = std::fs::read_dir("tests/cases/diff_gpu")
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "eqf"))
        .collect();
    files.sort();
    assert!(files.len() >= 30, "{} case files", files.len());
    for f in &files {
        let p = eqfuse::load_program(f.to_str().unwrap(), &[]).unwrap();
        for strict in [false, true] {
            let mut o = opts();
            o.strict = strict;
            let plan = optimize(&p, &o).unwrap().plan;
            if let Err(e) = codegen_plan(&plan) {
                let e = e.to_string();
                assert!(e.contains("not supported yet"), "{} (strict {strict}): {e}", f.display());
            }
        }
    }
}

/// Softmax regression in bf16, `softmax(x @ w + b, -1)`, plans as one generated gemm kernel
/// whose product runs on the tensor cores (`EQ_MMA`) in a row tile, its epilogue the row
/// template's functions: at 2048x512x128 (a 32x128 tile, both operands staged in 16-byte
/// chunks; at 4096 rows cuBLASLt plus a row kernel is faster, measured 14.4 us against the one
/// kernel's 22.4 at 4096x1024x128 on an H100: benches/results/2026-11-22-h100-b76cf2b-latencies)
/// and 64x128x10 (a 64x16 tile, the 10-wide weight staged element by element). Under `--strict` the softmax is a kernel
/// of its own and the product runs on CUDA cores; f32 operands keep the CUDA-core row tile.
#[test]
fn bf16_softmax_regression_is_one_tensor_core_gemm_kernel() {
    for (m, k, n, tile, vb) in [(2048, 512, 128, (32, 128), true), (64, 128, 10, (64, 16), false)] {
        let dims = [("M".to_string(), m), ("K".to_string(), k), ("N".to_string(), n)];
        let p = eqfuse::load_program("benches/gpu/predict/softmax_regression_bf16.eqf", &dims).unwrap();
        let plan = optimize(&p, &opts()).unwrap().plan;
        assert_eq!(plan.kernels.len(), 1, "{m}x{k}x{n}");
        assert_eq!(plan.kernels[0].template, eqfuse::Template::Gemm);
        assert_eq!(plan.kernels[0].implementation, Some(eqfuse::GemmImpl::Generated));
        let s = &codegen_plan(&plan).unwrap()[0];
        let defines = generated(s);
        for needle in [
            "#define EQ_EPI_ROWS 1\n".to_string(),
            "#define EQ_MMA 1\n".into(),
            format!("#define EQ_BM {}\n", tile.0),
            format!("#define EQ_BN {}\n", tile.1),
            "#define EQ_VA 8\n".into(),
        ] {
            assert!(defines.contains(&needle), "{m}x{k}x{n}: no {needle}{defines}");
        }
        assert_eq!(defines.contains("#define EQ_VB 8\n"), vb, "{m}x{k}x{n}");
        assert!(s.source.contains("eq_accum"), "{m}x{k}x{n}: no row epilogue");
        // gemm.cu fetches the row afresh for its epilogue: no value kept in the cache.
        assert!(!generated(s).contains("cv[0][v] = "), "{m}x{k}x{n}: a GEMM row epilogue keeps a value");
        let strict = optimize(&p, &OptimizeOptions { strict: true, ..opts() }).unwrap().plan;
        assert!(strict.kernels.len() > 1);
        for s in codegen_plan(&strict).unwrap() {
            assert!(!s.source.contains("#define EQ_MMA 1\n"), "{m}x{k}x{n} (strict): {}", s.name);
        }
    }
}

#[test]
fn one_hot_sums_are_read_at_the_target_column() {
    // cross_entropy_grad: the picked log-probability (a one-hot product summed over the row) and
    // the gradient's one-hot sum become row values read at the target column (guarded against
    // targets outside the row), so the row takes two stages (max, sum of exponentials), not
    // three; strict numerics keep the reduction.
    let p = eqfuse::load_program("examples/cross_entropy_grad.eqf", &[("N".into(), 64), ("V".into(), 1000)]).unwrap();
    let render = |strict: bool| {
        let plan = optimize(&p, &OptimizeOptions { strict, ..opts() }).unwrap().plan;
        let sources = codegen_plan(&plan).unwrap();
        sources.iter().filter(|s| s.name.starts_with("rowreduce")).map(generated).collect::<String>()
    };
    let (fast, strict) = (render(false), render(true));
    assert!(fast.contains("#define EQ_STAGES 2"), "{fast}");
    assert!(fast.contains("< 1000) {") && fast.contains("const eq_idx col0 = (eq_idx)t"), "{fast}");
    assert!(!strict.contains("#define EQ_STAGES 2") && !strict.contains("const eq_idx col0 = (eq_idx)t"), "{strict}");
}

/// The functions of a kernel's source: `eq_accum` and `eq_epilogue` of a row kernel.
fn function<'a>(src: &'a str, name: &str) -> &'a str {
    let start = src.find(&format!("void {name}(")).unwrap_or_else(|| panic!("no {name}:\n{src}"));
    let rest = &src[start..];
    &rest[..rest.find("\n}\n").unwrap_or(rest.len())]
}

#[test]
fn cached_rows_keep_stage_values_the_epilogue_reads() {
    // softmax and the cross-entropy gradient over rows kept in registers: the sum's stage stores
    // exp(x - max) into the cache once it has added it, and the epilogue scales the cached value
    // by the reciprocal of the sum (at least 1, so no per-element division or select) instead of
    // computing the exponential again. Strict numerics keep the value too (the same operations)
    // but divide; a row too long for registers is fetched again by each pass and keeps nothing.
    // The generated part of the row kernel that writes `out` element by element.
    let render = |path: &str, dims: &[(&str, usize)], strict: bool, out: &str| {
        let dims: Vec<(String, usize)> = dims.iter().map(|&(k, v)| (k.to_string(), v)).collect();
        let p = eqfuse::load_program(path, &dims).unwrap();
        let plan = optimize(&p, &OptimizeOptions { strict, ..opts() }).unwrap().plan;
        let sources = codegen_plan(&plan).unwrap();
        let store = format!("eq_storev<float, EQ_VEC>(p_{out} + ");
        let wanted = |s: &&KernelSource| s.name.starts_with("rowreduce") && s.source.contains(&store);
        sources.iter().filter(wanted).map(generated).collect::<String>()
    };
    let softmax = render("examples/softmax.eqf", &[], false, "y");
    assert!(softmax.contains("#define EQ_CACHED 1"), "{softmax}");
    let accum = function(&softmax, "eq_accum");
    assert!(accum.contains("const float n4 = expf(n3);") && accum.contains("cv[0][v] = n4;"), "{accum}");
    let epi = function(&softmax, "eq_epilogue");
    assert!(!epi.contains("expf") && epi.contains("(cv[0][v] * (1.0f / rv.n5))"), "{epi}");
    assert!(!epi.contains("eq_div_row"), "{epi}");

    let ce_dims = [("N", 64), ("V", 1000)];
    for strict in [false, true] {
        let ce = render("examples/cross_entropy_grad.eqf", &ce_dims, strict, "dlogits");
        let (accum, epi) = (function(&ce, "eq_accum"), function(&ce, "eq_epilogue"));
        assert!(accum.contains("cv[0][v] = n"), "strict {strict}: {accum}");
        assert!(!epi.contains("eq_val(p_logits"), "strict {strict}: the epilogue reads logits:\n{epi}");
        if strict {
            // The picked value's stage comes last and keeps x - max; the epilogue divides.
            assert!(epi.contains("__fdiv_rn(") && !epi.contains("1.0f /"), "{epi}");
        } else {
            assert!(!epi.contains("expf") && epi.contains("(cv[0][v] * (1.0f / rv.n"), "{epi}");
        }
    }

    // (Its Hopper path spreads the row over a cluster of 8 blocks, each block's segment in
    // registers, and keeps the exponentials as a row in registers does.)
    let long = render("examples/softmax.eqf", &[("R", 64), ("C", 1 << 17)], false, "y");
    let (hopper, portable) = paths(&long);
    assert!(portable.contains("#define EQ_CACHED 0"), "{portable}");
    assert!(!function(&portable, "eq_accum").contains("cv[0][v] = "), "{portable}");
    assert!(hopper.contains("#define EQ_CACHED 1\n") && hopper.contains("#define EQ_CLUSTER 8\n"), "{hopper}");
    assert!(function(&hopper, "eq_accum").contains("cv[0][v] = "), "{hopper}");
}

#[test]
fn wide_sixteen_bit_rows_take_one_ex2_an_exponential_and_test_only_edge_lanes() {
    // A bf16 softmax over a vocabulary of 50257 (issue 22), instruction-bound where its row is
    // kept in shared memory: outside strict numerics its exponentials are one ex2.approx each
    // (`eq_exp_fast`), and its shifted row's lanes are tested against the row only in a vector
    // that crosses the row's edge. Strict numerics keep expf; f32 rows keep expf; rows kept in
    // registers test every lane (the untested copy spilled there).
    let render = |text: &str, dims: &[(&str, usize)], strict: bool| {
        let mut src = String::new();
        for (k, v) in dims {
            src.push_str(&format!("dim {k} = {v}\n"));
        }
        src.push_str(text);
        let p = eqfuse::parse_program("wide.eqf", &src, &[]).unwrap();
        let plan = optimize(&p, &OptimizeOptions { strict, ..opts() }).unwrap().plan;
        let sources = codegen_plan(&plan).unwrap();
        sources.iter().filter(|s| s.name.starts_with("rowreduce")).map(generated).collect::<String>()
    };
    let softmax = |dtype: &str| format!("input x: {dtype}[R, V]\ny = softmax(x, -1)\noutput y\n");
    let wide = [("R", 4096), ("V", 50257)];
    let bf16 = render(&softmax("bf16"), &wide, false);
    assert!(bf16.contains("#define EQ_SMEM_CACHE 1\n") && bf16.contains("#define EQ_SPLIT_LANES 1\n"), "{bf16}");
    for f in ["eq_accum", "eq_epilogue"] {
        let body = function(&bf16, f);
        assert!(body.contains("eq_exp_fast(n3)") && !body.contains("expf("), "{body}");
        // The whole vectors' loop first, without lane tests; the edge vectors' after it.
        let (whole, edge) = body.split_once("} else {").unwrap_or_else(|| panic!("{body}"));
        assert!(whole.contains("if (EQ_SPLIT_LANES && eq_whole_in_row(col0, EQ_VEC, EQ_COLS)) {"), "{body}");
        assert!(
            !whole.contains("eq_in_row(") && edge.contains("if (!eq_in_row(col0 + v, EQ_COLS)) continue;"),
            "{body}"
        );
    }
    let strict = render(&softmax("bf16"), &wide, true);
    assert!(!strict.contains("eq_exp_fast") && strict.contains("expf(n"), "{strict}");
    let f32 = render(&softmax("f32"), &[("R", 64), ("V", 50257)], false);
    assert!(!f32.contains("eq_exp_fast") && f32.contains("expf(n"), "{f32}");
    // A shifted bf16 row in registers: EQ_SPLIT_LANES 0, so the untested copy compiles away.
    let cached = render(&softmax("bf16"), &[("R", 64), ("V", 4097)], false);
    assert!(cached.contains("#define EQ_CACHED 1\n") && !cached.contains("#define EQ_SPLIT_LANES"), "{cached}");
    assert!(cached.contains("eq_exp_fast(n3)"), "{cached}");
}

/// The Hopper path (what an sm_90a compile takes: rows over clusters) and the portable path of
/// a generated source; a source without a Hopper path is its portable path.
fn paths(src: &str) -> (String, String) {
    let (mut hopper, mut portable) = (String::new(), String::new());
    let mut at: Option<bool> = None;
    for line in src.lines() {
        match (line, at) {
            ("#if defined(__CUDA_ARCH_FEAT_SM90_ALL)", None) => at = Some(true),
            ("#else", Some(true)) => at = Some(false),
            ("#endif", Some(false)) => at = None,
            (_, Some(true)) => hopper.push_str(&format!("{line}\n")),
            (_, Some(false)) => portable.push_str(&format!("{line}\n")),
            (_, None) => portable.push_str(&format!("{line}\n")),
        }
    }
    (hopper, portable)
}

/// Wide odd rows are priced as they run (issue 22): the GPT-2 vocabulary softmax
/// (`benches/programs/softmax_wide_bf16.eqf`, bf16 rows of 50257) reads shifted rows of 8
/// lanes, too long to keep in the 64 registers a thread of a 1024-thread block has, so its
/// kernel keeps each row's 100528 bytes in shared memory, pipelined over its 4096 rows (two
/// buffers a block, one wave of blocks): one read of device memory, the max and the sum of
/// exponentials as two stages over the copy. Rows of 16-bit values are not spread over a
/// cluster of blocks on a 9.0 device (7 blocks of 512 threads ran this softmax at 27% of copy
/// bandwidth on an H100: `caps::row_cluster`), so there is no Hopper path; the f32 rows of the
/// same width are (`cluster_row_kernels_compile_without_spills`). A 1001-wide row stays in
/// registers and is read once.
#[test]
fn wide_odd_rows_are_priced_as_codegen_runs_them() {
    let p = eqfuse::load_program("benches/programs/softmax_wide_bf16.eqf", &[]).unwrap();
    let plan = optimize(&p, &opts()).unwrap().plan;
    let sources = codegen_plan(&plan).unwrap();
    let (hopper, src) = paths(&sources.iter().map(generated).collect::<String>());
    assert!(!hopper.contains("EQ_CLUSTER") && sources[0].launch.sm90a.is_none(), "{hopper}");
    for d in [
        "EQ_VEC 8",
        "EQ_SHIFT 1",
        "EQ_CACHED 0",
        "EQ_SMEM_CACHE 1",
        "EQ_SMEM_PIPELINED 1",
        "EQ_SMEM_ROW_BYTES 100528",
        "EQ_ROW_THREADS 1024",
        "EQ_STAGES 2",
    ] {
        assert!(src.contains(&format!("#define {d}\n")), "not {d}:\n{src}");
    }
    assert_eq!(sources[0].launch.smem_bytes, 2 * 100528);
    assert!(sources[0].launch.wave, "a pipelined row kernel runs one wave of blocks");
    let notes = plan.kernels[0].rejected.join("\n");
    // (Rows of 16-bit values are not spread over clusters: `caps::row_cluster`.)
    assert!(!notes.contains("spread over a cluster"), "{notes}");
    let p = eqfuse::load_program("benches/programs/softmax_wide_bf16.eqf", &[("V".into(), 1001)]).unwrap();
    let plan = optimize(&p, &opts()).unwrap().plan;
    let src = codegen_plan(&plan).unwrap().iter().map(generated).collect::<String>();
    assert!(src.contains("#define EQ_SHIFT 1\n") && src.contains("#define EQ_CACHED 1\n"), "{src}");
    assert!(!src.contains("EQ_SMEM_CACHE") && !src.contains("EQ_CLUSTER"), "{src}");
    assert!(!plan.kernels[0].rejected.iter().any(|r| r.contains("does not fit on chip")), "{:?}", plan.kernels[0]);
}

/// The cost model and codegen agree on where a row kernel keeps its row (`caps::row_keep`):
/// in registers (`EQ_CACHED 1`), in shared memory (`EQ_SMEM_CACHE 1`, the launch's dynamic
/// shared memory the bytes the cost model was told, pipelined through two buffers a block or
/// not as it was told), or nowhere (each pass reads device memory, and the cost model prices
/// the passes), over widths and storage types around each boundary, for one row and for many. (Many is more rows than SMs: fewer long rows
/// would be planned as segmented statistics and an elementwise kernel, `tests/long_rows.rs`.)
/// Where a row does not fit registers, the source's Hopper path spreads it over the cluster
/// `caps::row_cluster` gives the cost model (`EQ_CLUSTER`, a grid of whole clusters), and the
/// cost model prices that (one read) rather than the portable path.
#[test]
fn row_keeping_agrees_between_cost_and_codegen() {
    let mut seen = [0; 5];
    // Rows kept in shared memory one at a time (rows of which only one fits) and pipelined.
    // (A lone row's max and sum are planned as segments, tests/long_rows.rs, and an elementwise
    // kernel normalises: the one-buffer path is left to rows of which only one fits.)
    let one = [("f32", 50257)].map(|(d, w)| (256, d, w));
    let many = [
        ("f32", 1000),
        ("f32", 20011),
        ("f32", 26001),
        ("f32", 32001),
        ("f32", 40960),
        ("f32", 50257),
        ("f32", 57855),
        ("f32", 57856),
        ("f32", 60000),
        ("bf16", 4097),
        ("bf16", 24577),
        ("bf16", 50257),
        ("bf16", 57856),
        ("bf16", 57857),
        ("bf16", 115000),
        ("bf16", 128256),
        ("f16", 65536),
    ]
    .map(|(d, w)| (256, d, w));
    for (rows, dtype, width) in one.into_iter().chain(many) {
        let text =
            format!("dim R = {rows}\ndim V = {width}\ninput x: {dtype}[R, V]\ny = log_softmax(x, -1)\noutput y\n");
        let p = eqfuse::parse_program("rows.eqf", &text, &[]).unwrap();
        let plan = optimize(&p, &opts()).unwrap().plan;
        let sources = codegen_plan(&plan).unwrap();
        let k = plan.kernels.iter().position(|k| k.template == eqfuse::Template::RowReduce).expect("a row kernel");
        let s = sources.iter().find(|s| s.name.starts_with("rowreduce")).unwrap();
        let size = if dtype == "f32" { 4 } else { 2 };
        let vec = if src_has(&s.source, "EQ_VEC 8") {
            8
        } else if src_has(&s.source, "EQ_VEC 4") {
            4
        } else {
            0
        };
        let notes = plan.kernels[k].rejected.join("\n");
        let what = format!("{rows} {dtype} rows of {width}: {notes}");
        let cluster = eqfuse::row_cluster(rows, width, &[size], vec);
        assert_eq!(s.launch.sm90a.is_some(), cluster.is_some(), "{what}");
        if let (Some(c), Some(h)) = (cluster, &s.launch.sm90a) {
            let hopper = paths(&s.source).0;
            assert!(src_has(&hopper, &format!("EQ_CLUSTER {}", c.blocks)), "{what}\n{hopper}");
            assert!(src_has(&hopper, &format!("EQ_ROW_THREADS {}", c.threads)), "{what}\n{hopper}");
            assert!(src_has(&hopper, &format!("EQ_CHUNKS {}", c.chunks)), "{what}\n{hopper}");
            assert_eq!(h.grid[0] as usize, rows * c.blocks, "{what}");
            assert!(notes.contains(&format!("spread over a cluster of {} blocks", c.blocks)), "{what}");
            seen[4] += 1;
        }
        let notes = if cluster.is_some() { String::new() } else { notes };
        let portable = paths(&s.source).1;
        match eqfuse::row_keep(rows, width, &[size], vec) {
            eqfuse::RowKeep::Registers => {
                assert!(src_has(&portable, "EQ_CACHED 1") && !src_has(&portable, "EQ_SMEM_CACHE 1"), "{what}");
                assert!(!notes.contains("row of"), "{what}");
                seen[0] += 1;
            }
            eqfuse::RowKeep::Shared { bytes, pipelined } => {
                assert!(src_has(&portable, "EQ_CACHED 0") && src_has(&portable, "EQ_SMEM_CACHE 1"), "{what}");
                assert_eq!(s.launch.smem_bytes as usize, bytes, "{what}");
                let row = if pipelined { bytes / 2 } else { bytes };
                assert!(src_has(&portable, &format!("EQ_SMEM_ROW_BYTES {row}")), "{what}");
                assert_eq!(src_has(&portable, "EQ_SMEM_PIPELINED 1"), pipelined, "{what}");
                assert_eq!(s.launch.wave, pipelined, "{what}");
                assert!(
                    cluster.is_some() || notes.contains(&format!("kept in shared memory ({bytes} bytes")),
                    "{what}"
                );
                assert!(bytes <= eqfuse::MAX_ROW_SMEM_BYTES, "{what}");
                seen[1 + pipelined as usize] += 1;
            }
            eqfuse::RowKeep::Fetched => {
                assert!(src_has(&portable, "EQ_CACHED 0") && !src_has(&portable, "EQ_SMEM_CACHE 1"), "{what}");
                assert_eq!(s.launch.smem_bytes, 0, "{what}");
                assert!(cluster.is_some() || notes.contains("read 2 times"), "{what}");
                seen[3] += 1;
            }
        }
    }
    assert!(seen.iter().all(|&n| n > 0), "registers, shared memory, pipelined, fetched, clusters: {seen:?}");
}

fn src_has(src: &str, define: &str) -> bool {
    src.contains(&format!("#define {define}\n"))
}

/// An i32 value meets a fractional literal as the reference takes it: in `+ - * /` the literal
/// is an i32, truncated (`x - 0.5` is `x`, `x * 2.5` is `x * 2`; the fidelity run's g53 missed
/// the reference by 1 in every positive element of `x0 - 0.5`, computed in double and
/// truncated), while a comparison and `pow` compute on the f64 values (`x < 0.5` holds only
/// for `x <= 0`).
#[test]
fn i32_arithmetic_takes_a_fractional_literal_as_an_i32() {
    let text = "input x: i32[4, 16]\na = x - 0.5\nb = x * 2.5\nc = x < 0.5\noutput a, b, c\n";
    let p = eqfuse::parse_program("int.eqf", text, &[]).unwrap();
    let inputs = eqfuse::random_inputs(&p, 0);
    let want = eqfuse::eval(&p, &inputs).unwrap();
    let x = &inputs["x"].data;
    assert_eq!(want[0].data, *x);
    assert_eq!(want[1].data, x.iter().map(|v| v * 2.0).collect::<Vec<_>>());
    assert_eq!(want[2].data, x.iter().map(|&v| f64::from(v < 0.5)).collect::<Vec<_>>());
    for plan in [optimize(&p, &opts()).unwrap().plan, eqfuse::unfused_plan(&p, &opts().profile, false).unwrap()] {
        let src: String = codegen_plan(&plan).unwrap().iter().map(generated).collect();
        assert!(src.contains(" * 2)") && !src.contains("eq_d2i") && !src.contains("2.5f"), "{src}");
        assert!(src.contains("((double)0.5f)"), "the comparison computes in double: {src}");
    }
}

/// The one kernel of a program of one output `body` over f32 `inputs`, and its generated part.
fn one_kernel(inputs: &[(&str, &[usize])], body: &str) -> (String, String) {
    let inputs: Vec<(&str, eqfuse::TensorType)> =
        inputs.iter().map(|&(n, s)| (n, eqfuse::TensorType::new(eqfuse::DType::F32, s.to_vec()))).collect();
    let program = Program::from_sexprs("t", &inputs, &[("y", body)]).unwrap();
    let plan = optimize(&program, &opts()).unwrap().plan;
    assert_eq!(plan.kernels.len(), 1, "{body}");
    let sources = codegen_plan(&plan).unwrap();
    (plan.kernels[0].template.name().to_string(), generated(&sources[0]))
}

/// Elementwise kernels walk the axes every access steps through as one as a single axis
/// (`lower`'s merge): a contiguous tensor of an odd last extent is read 4 f32 a lane over its flat
/// index, with no coordinate computed; a broadcast row or a slice keeps the axes it needs apart;
/// a coordinate becomes a quotient and remainder of the merged index; a reduction along an axis
/// of one element reduces nothing (an elementwise kernel).
#[test]
fn elementwise_axes_walked_as_one_are_merged_and_only_those() {
    let odd: &[usize] = &[8, 32, 50257];
    let (t, src) = one_kernel(&[("x", odd), ("z", odd)], "(* x z)");
    assert_eq!(t, "elementwise");
    assert!(src.contains("#define EQ_VEC 4") && !src.contains('%'), "{src}");
    let (_, src) = one_kernel(&[("x", odd), ("b", &[50257])], "(+ x b)");
    assert!(src.contains("#define EQ_VEC 1") && src.contains("% 50257") && !src.contains("% 32"), "{src}");
    let (_, src) = one_kernel(&[("x", odd), ("c", &[8, 1, 1])], "(* x c)");
    assert!(src.contains("#define EQ_VEC 4") && src.contains("/ 1608224") && !src.contains("% 50257"), "{src}");
    // A coordinate becomes a quotient and a remainder of the merged index.
    let (_, src) = one_kernel(&[("x", odd)], "(+ x (cast (iota 50257) f32))");
    assert!(src.contains("#define EQ_VEC 4") && src.contains("(c0 + v) % 50257"), "{src}");
    let (_, src) = one_kernel(&[("x", odd)], "(+ x (cast (reshape (iota 32) [32,1]) f32))");
    assert!(src.contains("#define EQ_VEC 4") && src.contains("(c0 + v) / 50257 % 32"), "{src}");
    let (_, src) = one_kernel(&[("s", &[6, 9, 14])], "(* (slice s -1 1 13 2) 3)");
    assert!(src.contains("% 6") && !src.contains("% 9"), "{src}");
    let (_, src) = one_kernel(&[("w", &[3, 1, 5, 1, 7])], "(* w 2)");
    assert!(src.contains("#define EQ_VEC 4") && !src.contains('%'), "{src}");
    for body in ["(* (mean u -1) 2)", "(softmax u -1)", "(layernorm u u u 1e-5)"] {
        let (t, src) = one_kernel(&[("u", &[64, 1000, 1])], body);
        assert_eq!(t, "elementwise", "{body}");
        assert!(src.contains("#define EQ_VEC 4") && !src.contains('%'), "{body}: {src}");
    }
}
