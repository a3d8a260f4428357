//! CI check: every kernel the code generator emits for the test cases (and every template on
//! its own, with its default parameters) compiles with NVRTC for sm_90, without a GPU; kernels
//! with a Hopper path (attention) compile for sm_90a as well.
//!
//! NVRTC comes from `.ci/install-nvrtc` (the `nvidia-cuda-nvrtc` 13.0 wheel unpacked into
//! `.nvrtc/`) or the loader path. Where it is missing the test says so and passes, unless
//! `CI=true`, where a missing NVRTC fails.

mod common;

use eqfuse::{codegen_plan, nvrtc_available, nvrtc_compile, optimize, DeviceProfile, OptimizeOptions, DEFAULT_ARCH};

fn nvrtc_or_skip() -> bool {
    match nvrtc_available() {
        Ok(_) => true,
        Err(why) if std::env::var("CI").as_deref() == Ok("true") => panic!("CI=true but NVRTC is unusable: {why}"),
        Err(why) => {
            eprintln!("skipped: NVRTC is not available ({why})");
            false
        }
    }
}

#[test]
fn templates_compile_alone() {
    if !nvrtc_or_skip() {
        return;
    }
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/kernels");
    for (name, text) in eqfuse::TEMPLATE_FILES.iter().filter(|(n, _)| n.ends_with(".cu")) {
        let c = nvrtc_compile(text, name, DEFAULT_ARCH, &[format!("--include-path={dir}")])
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(!c.ptx.is_empty());
    }
    // The attention template's Hopper (wgmma) path, which only an sm_90a compile takes.
    let text = eqfuse::TEMPLATE_FILES.iter().find(|(n, _)| *n == "attention.cu").unwrap().1;
    let c = nvrtc_compile(text, "attention.cu", "sm_90a", &[format!("--include-path={dir}"), "-DEQ_WGMMA=1".into()])
        .unwrap_or_else(|e| panic!("attention.cu for sm_90a: {e}"));
    assert!(String::from_utf8_lossy(&c.ptx).contains("wgmma.mma_async"));
}

/// A kernel with a Hopper path (`launch.sm90a`) must compile for sm_90a too, and there run
/// wgmma (attention) or spread its rows over clusters (a row kernel); its sm_90 compile must
/// not. ptxas's performance advisories (C75xx: wgmmas serialized, which an instance at the
/// register cap of two blocks per SM can get, e.g. causal attention over transposed views) are
/// reported, not failures: the code is correct, only slower.
fn compile_sm90a(what: &str, s: &eqfuse::KernelSource, sm90: &[u8]) {
    if s.launch.sm90a.is_some() && s.template == eqfuse::Template::RowReduce {
        compile_cluster_rows(what, s, sm90);
        return;
    }
    if s.launch.sm90a.is_none() {
        return;
    }
    let c = nvrtc_compile(&s.source, &s.file, "sm_90a", &[])
        .unwrap_or_else(|e| panic!("{what} / {} (sm_90a): {e}", s.name));
    let (advisories, warnings): (Vec<&str>, Vec<&str>) =
        c.log.lines().filter(|l| !l.trim().is_empty()).partition(|l| l.contains("Potential Performance Loss"));
    for a in advisories {
        eprintln!("{what} / {} (sm_90a): {a}", s.name);
    }
    assert!(warnings.is_empty(), "{what} / {} (sm_90a): warnings\n{}", s.name, c.log);
    assert!(String::from_utf8_lossy(&c.ptx).contains("wgmma.mma_async"), "{what} / {}: no wgmma on sm_90a", s.name);
    assert!(!String::from_utf8_lossy(sm90).contains("wgmma"), "{what} / {}: wgmma on sm_90", s.name);
}

#[test]
fn generated_kernels_compile() {
    if !nvrtc_or_skip() {
        return;
    }
    let opts = OptimizeOptions::new(DeviceProfile::load("h100").unwrap());
    let mut n = 0;
    for case in common::cases() {
        let plan = optimize(&case.program, &opts).unwrap().plan;
        let sources = codegen_plan(&plan).unwrap_or_else(|e| panic!("{}: {e}", case.name));
        for s in sources {
            let c = nvrtc_compile(&s.source, &s.file, DEFAULT_ARCH, &[])
                .unwrap_or_else(|e| panic!("{} / {}: {e}\n{}", case.name, s.name, s.source));
            assert!(c.log.trim().is_empty(), "{} / {}: warnings\n{}", case.name, s.name, c.log);
            compile_sm90a(case.name, &s, &c.ptx);
            n += 1;
        }
    }
    eprintln!("compiled {n} generated kernels with NVRTC");
}

/// Column kernels with online softmax pairs (`tests/cases/ok/column_softmax.eqf`, which the GPU
/// tests run): every kernel of its plan compiles without warnings, and the plan takes the pairs
/// (a column kernel computing a maximum and a sum of exponentials of the same input). The
/// column kernels fit 64 registers a thread without spilling (four blocks of 256 threads an
/// SM): the last block's merge of 8 chunks of every accumulator at once took 80 with four
/// accumulators, three blocks an SM, and the [1000, 16384] log-softmax + NLL's 512 blocks ran
/// as 1.3 waves (ncu on the H100, `benches/results/2026-11-27-h100-session13`).
#[test]
fn column_online_pair_kernels_compile() {
    if !nvrtc_or_skip() {
        return;
    }
    let path = "tests/cases/ok/column_softmax.eqf";
    let p = eqfuse::load_program(path, &[]).unwrap();
    let plan = optimize(&p, &OptimizeOptions::new(DeviceProfile::load("h100").unwrap())).unwrap().plan;
    let paired = plan.kernels.iter().filter(|k| {
        k.template == eqfuse::Template::ColReduce && ["amax", "exp", "sum"].iter().all(|o| k.ops.iter().any(|x| x == o))
    });
    assert!(paired.count() >= 3, "{:#?}", plan.kernels.iter().map(|k| (&k.template, &k.ops)).collect::<Vec<_>>());
    for s in codegen_plan(&plan).unwrap() {
        let c = nvrtc_compile(&s.source, &s.file, DEFAULT_ARCH, &[]).unwrap_or_else(|e| panic!("{}: {e}", s.name));
        assert!(c.log.trim().is_empty(), "{}: warnings\n{}", s.name, c.log);
        if !s.name.starts_with("colreduce") {
            continue;
        }
        let v = nvrtc_compile(&s.source, &s.file, "sm_90a", &["--ptxas-options=-v".to_string()]).unwrap();
        let number = |after: &str, before: &str| {
            v.log.lines().find_map(|l| l.split(before).next()?.rsplit(after).next()?.trim().parse::<u32>().ok())
        };
        let registers = number("Used ", " registers").unwrap_or_else(|| panic!("{}: no ptxas log\n{}", s.name, v.log));
        let spills = number(",", " bytes spill stores").unwrap_or(0);
        assert!(registers <= 64 && spills == 0, "{}: {registers} registers, {spills} bytes spilled", s.name);
    }
}

/// Every example program at its declared sizes, and with every dim capped at 512 where the
/// program allows it, planned with and without `--strict`. Gemm kernels that are one cuBLASLt
/// call have no source: they are skipped (and counted); any codegen failure fails the test (the
/// transformer blocks included). Generated gemm kernels must compile without warnings.
#[test]
fn example_kernels_compile() {
    if !nvrtc_or_skip() {
        return;
    }
    let opts = OptimizeOptions::new(DeviceProfile::load("h100").unwrap());
    let examples = common::example_paths();
    let (mut compiled, mut skipped, mut gemm, mut attention) = (0, 0, 0, 0);
    for path in examples {
        let full = match eqfuse::load_program(&path, &[]) {
            Ok(p) => p,
            Err(e) => {
                eprintln!("skipped {path}: {e}");
                continue;
            }
        };
        let capped: Vec<(String, usize)> = full.dims.iter().map(|(n, v)| (n.clone(), (*v).min(512))).collect();
        let mut programs = vec![full];
        programs.extend(eqfuse::load_program(&path, &capped).ok());
        for (p, strict) in programs.iter().flat_map(|p| [(p, false), (p, true)]) {
            let plan = optimize(p, &OptimizeOptions { strict, ..opts.clone() }).unwrap().plan;
            for k in &plan.kernels {
                let s = eqfuse::codegen_kernel(&plan, k).unwrap_or_else(|e| panic!("{path}: {e}"));
                if s.cublaslt.is_some() {
                    skipped += 1;
                    continue;
                }
                let c = nvrtc_compile(&s.source, &s.file, DEFAULT_ARCH, &[])
                    .unwrap_or_else(|e| panic!("{path} / {}: {e}", s.name));
                if k.template == eqfuse::Template::Gemm {
                    assert!(c.log.trim().is_empty(), "{path} / {}: warnings\n{}", s.name, c.log);
                    gemm += 1;
                }
                if k.template == eqfuse::Template::Attention {
                    compile_sm90a(&path, &s, &c.ptx);
                    attention += 1;
                }
                compiled += 1;
            }
        }
    }
    eprintln!("compiled {compiled} example kernels ({gemm} generated gemm); skipped {skipped} cuBLASLt kernels");
    assert!(gemm >= 4, "the examples' generated gemm kernels were not compiled");
    // (The transformer blocks' f32 attention is planned as products and row kernels since the
    // cost model timed the f32 attention path; tests/views.rs checks attention writing a view.)
    assert!(attention >= 1, "no example's attention kernel was compiled");
}

/// An embedding, layernorm and loss backward (`examples/embedding_layernorm.eqf` with the
/// gradients of its tables), in f32 and bf16 at the example's sizes: every kernel generates and
/// compiles without warnings, the token table's gradient in a scatter kernel, for sm_90 (vector
/// atomics) and sm_80 (scalar ones).
#[test]
fn embedding_backward_kernels_compile() {
    if !nvrtc_or_skip() {
        return;
    }
    let opts = OptimizeOptions::new(DeviceProfile::load("h100").unwrap());
    for dtype in ["f32", "bf16"] {
        let text = common::embedding_backward_text(dtype);
        let program = eqfuse::parse_program("embedding_backward.eqf", &text, &[]).unwrap();
        let plan = optimize(&program, &opts).unwrap().plan;
        let sources = codegen_plan(&plan).unwrap_or_else(|e| panic!("{dtype}: {e}"));
        let mut scatters = 0;
        for s in sources.iter().filter(|s| s.cublaslt.is_none()) {
            let c = nvrtc_compile(&s.source, &s.file, DEFAULT_ARCH, &[])
                .unwrap_or_else(|e| panic!("{dtype} / {}: {e}\n{}", s.name, s.source));
            assert!(c.log.trim().is_empty(), "{dtype} / {}: warnings\n{}", s.name, c.log);
            if s.name.starts_with("scatter_") {
                let ptx = String::from_utf8_lossy(&c.ptx);
                assert!(ptx.contains("red.global.add.v4.f32"), "{dtype} / {}: no vector atomics on sm_90", s.name);
                let c = nvrtc_compile(&s.source, &s.file, "sm_80", &[])
                    .unwrap_or_else(|e| panic!("{dtype} / {} (sm_80): {e}", s.name));
                assert!(c.log.trim().is_empty(), "{dtype} / {} (sm_80): warnings\n{}", s.name, c.log);
                assert!(!String::from_utf8_lossy(&c.ptx).contains("red.global.add.v"), "{dtype} / {}: sm_80", s.name);
                scatters += 1;
            }
        }
        assert_eq!(scatters, 1, "{dtype}: the token table's gradient");
    }
}

/// Attention with a bias (`attention_bias`, `EQ_BIAS`): on every path (f32 on CUDA cores; bf16
/// and f16 on mma.sync, and on wgmma where the scale is positive, compiled for sm_90a too),
/// with a padding mask `[B, 1, 1, S]`, a `[B, 1, S, S]` or `[S, S]` mask, of the operands' dtype
/// or f32, causal or not, read through head views; a bool mask's bias selected in the kernel.
#[test]
fn attention_bias_kernels_compile() {
    if !nvrtc_or_skip() {
        return;
    }
    let qkv = |t: &str, mask: &str, body: &str| {
        format!(
            "input q: {t}[2, 4, 100, 64]\ninput k: {t}[2, 4, 100, 64]\ninput v: {t}[2, 4, 100, 64]\n\
             input m: {mask}\no = {body}\n"
        )
    };
    let added = "softmax(q @ transpose(k, -1, -2) * 0.125 + m, -1) @ v";
    let selected = "softmax(where(m, q @ transpose(k, -1, -2) * 0.125, -1e30), -1) @ v";
    let programs = [
        ("bf16_padding", qkv("bf16", "bf16[2, 1, 1, 100]", added)),
        ("bf16_full_causal", qkv("bf16", "bf16[2, 1, 100, 100]", "attention_bias(q, k, v, m, 0.125, 1)")),
        ("bf16_negative_scale", qkv("bf16", "bf16[100, 100]", "attention_bias(q, k, v, m, -0.125, 0)")),
        ("f16_f32_mask", qkv("f16", "f32[2, 1, 1, 100]", "attention_bias(q, k, v, m, 0.125, 1)")),
        ("f32_padding_causal", qkv("f32", "f32[2, 1, 1, 100]", "attention_bias(q, k, v, m, 0.125, 1)")),
        ("f32_square", qkv("f32", "f32[100, 100]", added)),
        ("bf16_bool", qkv("bf16", "bool[2, 1, 1, 100]", selected)),
        (
            "bf16_heads",
            "input x: bf16[2, 100, 256]\ninput m: bf16[2, 1, 1, 100]\n\
             h = transpose(reshape(x, [2, 100, 4, 64]), 1, 2)\n\
             o = reshape(transpose(attention_bias(h, h, h, m, 0.125, 0), 1, 2), [2, 100, 256])\n"
                .to_string(),
        ),
    ];
    // The f32 path's tile priced free, so that the small f32 problems (which the CUDA-core
    // kernel may lose to products and a row kernel) still take it: what is checked here is
    // that every path compiles, not the planner's choice.
    let mut profile = DeviceProfile::load("h100").unwrap();
    for r in profile.templates.get_mut("attention").unwrap().tiles.values_mut() {
        (r.lone_ns_per_k, r.sm_ns_per_k, r.row_epilogue_us) = (1e-6, 1e-6, 0.0);
    }
    let opts = OptimizeOptions::new(profile);
    for (name, body) in programs {
        let p = eqfuse::parse_program(name, &format!("{body}output o\n"), &[]).unwrap();
        let plan = optimize(&p, &opts).unwrap().plan;
        let att: Vec<_> = plan.kernels.iter().filter(|k| k.template == eqfuse::Template::Attention).collect();
        assert_eq!(att.len(), 1, "{name}: {:?}", plan.kernels.iter().map(|k| &k.ops).collect::<Vec<_>>());
        assert!(att[0].ops.contains(&"attention_bias".to_string()), "{name}: {:?}", att[0].ops);
        for s in codegen_plan(&plan).unwrap_or_else(|e| panic!("{name}: {e}")) {
            let c = nvrtc_compile(&s.source, &s.file, DEFAULT_ARCH, &[])
                .unwrap_or_else(|e| panic!("{name} / {}: {e}", s.name));
            assert!(c.log.trim().is_empty(), "{name} / {}: warnings\n{}", s.name, c.log);
            if s.template == eqfuse::Template::Attention {
                let defines = generated_defines(&s.source);
                assert!(defines.contains("#define EQ_BIAS 1\n"), "{name}");
                assert_eq!(defines.contains("#define EQ_BIAS_SEL 1\n"), name.ends_with("bool"), "{name}");
                assert_eq!(
                    s.launch.sm90a.is_some(),
                    !name.starts_with("f32") && name != "bf16_negative_scale",
                    "{name}"
                );
            }
            compile_sm90a(name, &s, &c.ptx);
        }
    }
}

/// The generated gemm's tensor-core path (16-bit operands outside strict numerics): the probe
/// programs of benches/gpu/predict, planned with a profile that makes cuBLASLt too slow to pick,
/// render with `EQ_MMA` (f16 with `EQ_MMA_F16`) in the 64x128 and the tall tiles, with edges no
/// tile divides and a transposed operand, and compile without warnings; under `--strict` the
/// same products take the CUDA-core loop.
#[test]
fn tensor_core_gemm_kernels_compile() {
    if !nvrtc_or_skip() {
        return;
    }
    let profile = DeviceProfile::load("benches/gpu/predict/generated-only.json").unwrap();
    let dims = |v: &[(&str, usize)]| v.iter().map(|(n, x)| (n.to_string(), *x)).collect::<Vec<_>>();
    let probes = [
        ("matmul_bf16", dims(&[("M", 512), ("K", 96), ("N", 512)]), "EQ_BM 64", false),
        ("matmul_bf16", dims(&[("M", 16384), ("K", 64), ("N", 64)]), "EQ_BN 64", false),
        ("matmul_bf16", dims(&[("M", 16384), ("K", 64), ("N", 16)]), "EQ_BN 16", false),
        ("matmul_f16", dims(&[]), "EQ_BM 64", true),
        ("bmm_tail_bf16", dims(&[]), "EQ_BM 128", false),
        ("matmul_bt_bf16", dims(&[]), "EQ_SBK 1", false),
    ];
    for (name, d, shape, f16) in probes {
        let path = format!("benches/gpu/predict/{name}.eqf");
        let program = eqfuse::load_program(&path, &d).unwrap();
        for strict in [false, true] {
            let plan =
                optimize(&program, &OptimizeOptions { strict, ..OptimizeOptions::new(profile.clone()) }).unwrap().plan;
            let k = plan.kernels.iter().find(|k| k.template == eqfuse::Template::Gemm).expect("a product");
            let s = eqfuse::codegen_kernel(&plan, k).unwrap();
            assert!(s.cublaslt.is_none(), "{name}: cuBLASLt was picked");
            let defines = generated_defines(&s.source);
            assert_eq!(defines.contains("#define EQ_MMA 1"), !strict, "{name} (strict {strict}): {defines}");
            assert_eq!(defines.contains("#define EQ_MMA_F16 1"), f16 && !strict, "{name}: {defines}");
            if !strict {
                assert!(defines.contains(&format!("#define {shape}")), "{name}: {defines}");
            }
            let c = nvrtc_compile(&s.source, &s.file, DEFAULT_ARCH, &[]).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert!(c.log.trim().is_empty(), "{name}: warnings\n{}", c.log);
        }
    }
}

/// The tensor-core row tiles: bf16 and f16 softmax regression (`softmax(x @ w + b, -1)`, the
/// probes of benches/gpu/predict) planned with the generated kernel render one gemm kernel with
/// the row epilogue and `EQ_MMA`, in the tile `codegen::gemm::kernel_tile` picks for each padded
/// row width (16 to 256 columns; rows and columns no tile divides; the weight transposed in
/// place), staging operands in 16-byte chunks where their strides allow, and compile without
/// warnings; under `--strict` (the softmax then its own kernel) and
/// on f32 operands the product takes the CUDA-core loop.
#[test]
fn tensor_core_row_tiles_compile() {
    if !nvrtc_or_skip() {
        return;
    }
    let profile = fused_probe_profile();
    let dims = |m: usize, k: usize, n: usize| vec![("M".to_string(), m), ("K".into(), k), ("N".into(), n)];
    let probes = [
        ("softmax_regression_bf16", dims(64, 128, 10), "64x16", 128, 2, (8, 1)),
        ("softmax_regression_bf16", dims(64, 128, 16), "64x16", 128, 2, (8, 8)),
        ("softmax_regression_bf16", dims(100, 72, 20), "32x32", 128, 4, (8, 1)),
        ("softmax_regression_bf16", dims(333, 200, 37), "32x64", 128, 4, (8, 1)),
        ("softmax_regression_bf16", dims(1024, 1024, 100), "32x128", 128, 4, (8, 1)),
        ("softmax_regression_bf16", dims(4096, 1024, 128), "32x128", 128, 4, (8, 8)),
        ("softmax_regression_bf16", dims(130, 96, 200), "32x256", 64, 8, (8, 8)),
        ("softmax_regression_bf16", dims(130, 90, 200), "32x256", 64, 8, (1, 8)),
        ("softmax_regression_f16", dims(257, 136, 128), "32x128", 128, 4, (8, 8)),
        ("softmax_regression_wt_bf16", dims(96, 520, 250), "32x256", 64, 8, (8, 8)),
        ("softmax_regression_wt_bf16", dims(96, 522, 250), "32x256", 64, 8, (1, 1)),
    ];
    for (name, d, tile, bk, wn, (va, vb)) in probes {
        let path = format!("benches/gpu/predict/{name}.eqf");
        let program = eqfuse::load_program(&path, &d).unwrap();
        let what = format!("{name} {d:?}");
        let plan = optimize(&program, &OptimizeOptions::new(profile.clone())).unwrap().plan;
        assert_eq!(plan.kernels.len(), 1, "{what}: not one kernel");
        let s = eqfuse::codegen_kernel(&plan, &plan.kernels[0]).unwrap();
        assert!(s.cublaslt.is_none(), "{what}: cuBLASLt was picked");
        let defines = generated_defines(&s.source);
        let (bm, bn) = tile.split_once('x').unwrap();
        for want in [
            "EQ_EPI_ROWS 1".to_string(),
            "EQ_MMA 1".into(),
            format!("EQ_BM {bm}"),
            format!("EQ_BN {bn}"),
            format!("EQ_BK {bk}"),
            format!("EQ_WN {wn}"),
        ] {
            assert!(defines.contains(&format!("#define {want}\n")), "{what}: no {want}\n{defines}");
        }
        // 16-byte chunks along the contiguous axis where it and the other strides allow.
        for (macro_, v) in [("EQ_VA", va), ("EQ_VB", vb)] {
            assert_eq!(defines.contains(&format!("#define {macro_} 8\n")), v == 8, "{what}: {macro_}\n{defines}");
        }
        assert_eq!(defines.contains("#define EQ_MMA_F16 1"), name.ends_with("_f16"), "{what}");
        let c = nvrtc_compile(&s.source, &s.file, DEFAULT_ARCH, &[]).unwrap_or_else(|e| panic!("{what}: {e}"));
        assert!(c.log.trim().is_empty(), "{what}: warnings\n{}", c.log);
        assert!(String::from_utf8_lossy(&c.ptx).contains("mma.sync.aligned.m16n8k16"), "{what}: no mma.sync");
        // Strict numerics: the softmax is a kernel of its own, the product on CUDA cores.
        let strict = OptimizeOptions { strict: true, ..OptimizeOptions::new(profile.clone()) };
        let plan = optimize(&program, &strict).unwrap().plan;
        for k in plan.kernels.iter().filter(|k| k.template == eqfuse::Template::Gemm) {
            let s = eqfuse::codegen_kernel(&plan, k).unwrap();
            assert!(!generated_defines(&s.source).contains("#define EQ_MMA 1"), "{what} (strict)");
        }
    }
    // f32 operands: the row epilogue's CUDA-core tile (32 rows of 128 columns, 4 by 4 per
    // thread), its 1024-deep sums split over 4 blocks per tile (32 tiles alone would leave most
    // SMs idle), with the split's workspace and counts as the last two parameters.
    let program = eqfuse::load_program("examples/matmul_softmax.eqf", &[]).unwrap();
    let plan = optimize(&program, &OptimizeOptions::new(profile)).unwrap().plan;
    let k = plan.kernels.iter().find(|k| k.template == eqfuse::Template::Gemm).unwrap();
    let s = eqfuse::codegen_kernel(&plan, k).unwrap();
    let defines = generated_defines(&s.source);
    for want in ["EQ_EPI_ROWS 1", "EQ_BM 32", "EQ_TM 4", "EQ_TN 4", "EQ_SPLITS 4", "EQ_KSPAN 256"] {
        assert!(defines.contains(&format!("#define {want}\n")), "no {want}\n{defines}");
    }
    assert!(!defines.contains("#define EQ_MMA 1"), "{defines}");
    assert_eq!(s.launch.grid, [128, 1, 1]); // one line of blocks: 1 column tile x 32 row tiles x 4 splits
    let ws: Vec<_> = s.args.iter().filter(|a| a.role == eqfuse::ArgRole::Workspace).collect();
    assert_eq!(
        ws.iter().map(|a| (a.name.as_str(), a.bytes, a.zeroed)).collect::<Vec<_>>(),
        [("eq_split_ws", 32 * 4 * 32 * 128 * 4, false), ("eq_split_count", 32 * 4, true)]
    );
    let c = nvrtc_compile(&s.source, &s.file, DEFAULT_ARCH, &[]).unwrap_or_else(|e| panic!("matmul_softmax: {e}"));
    assert!(c.log.trim().is_empty(), "matmul_softmax: warnings\n{}", c.log);
}

/// The generated `#define` block of a kernel source (before the template text).
fn generated_defines(source: &str) -> String {
    source.split("// ---- kernels/").next().unwrap_or(source).to_string()
}

/// The probe profile (benches/gpu/predict/generated-only.json: no cuBLASLt) without the
/// tensor-core tile rates, which times those tiles by their flops: every product takes the
/// generated kernel with its row epilogue fused (with the rates some of these shapes plan as a
/// product and a row kernel), as the tensor-core row-tile probes were planned
/// (benches/results/2026-11-22-h100-7162075-rowmma).
fn fused_probe_profile() -> DeviceProfile {
    let mut p = DeviceProfile::load("benches/gpu/predict/generated-only.json").unwrap();
    for r in p.templates.values_mut() {
        r.tiles_mma.clear();
        for i in r.implementations.values_mut() {
            i.tiles_mma.clear();
        }
    }
    p
}

/// Dropout with its seed given at run time (an i32 tensor of shape `[]` or `[1]`, or an i32
/// expression of one): the kernels of every template that fuses it (elementwise, a row
/// reduction's epilogue, a column reduction, a generated gemm's epilogue, a rank-0 domain; f32,
/// bf16 and f16) load the seed and compile without warnings.
#[test]
fn tensor_seeded_dropout_kernels_compile() {
    if !nvrtc_or_skip() {
        return;
    }
    let programs = [
        std::fs::read_to_string("tests/cases/ok/dropout_seed_input.eqf").unwrap(),
        "input x: bf16[64, 256]\ninput g: bf16[256]\ninput s: i32[1]\ny = dropout(rmsnorm(x, g, 1e-6), 0.1, s * 3)\n\
         t = sum(dropout(x, 0.5, s), 0)\noutput y, t\n"
            .into(),
        "input x: f16[32, 64]\ninput w: f16[64, 128]\ninput s: i32[]\ny = dropout(x @ w, 0.2, s)\noutput y\n".into(),
        "input x: f32[]\ninput s: i32[1]\ny = dropout(x * 2, 0.5, s)\noutput y\n".into(),
    ];
    let profile = DeviceProfile::load("benches/gpu/predict/generated-only.json").unwrap();
    let mut seeded = 0;
    for (i, text) in programs.iter().enumerate() {
        let p = eqfuse::parse_program("seed.eqf", text, &[]).unwrap();
        let plan = optimize(&p, &OptimizeOptions::new(profile.clone())).unwrap().plan;
        for s in codegen_plan(&plan).unwrap_or_else(|e| panic!("program {i}: {e}")) {
            let c = nvrtc_compile(&s.source, &s.file, DEFAULT_ARCH, &[])
                .unwrap_or_else(|e| panic!("program {i} / {}: {e}\n{}", s.name, s.source));
            assert!(c.log.trim().is_empty(), "program {i} / {}: warnings\n{}", s.name, c.log);
            seeded += s.source.matches("= eq_dropout_seeded(").count();
        }
    }
    assert!(seeded >= 5, "only {seeded} tensor-seeded dropouts were generated");
}

/// Attention's backward kernels reading views and biases (`tests/common`'s
/// `attention_backward_programs`: grouped-query keys and values, heads split from projections,
/// padding, full, shared and bool masks): every program's backward runs as the flash kernels
/// (the bias forms where there is a bias), no kernel but attention's reads q, k or v (no layout
/// copy), and every attention kernel compiles without warnings at sm_90 and sm_80.
#[test]
fn attention_backward_view_and_bias_kernels_compile() {
    if !nvrtc_or_skip() {
        return;
    }
    let opts = OptimizeOptions::new(DeviceProfile::load("h100").unwrap());
    for (name, text) in common::attention_backward_programs() {
        let p = eqfuse::parse_program(&name, &text, &[]).unwrap_or_else(|e| panic!("{name}: {e}"));
        let plan = optimize(&p, &opts).unwrap().plan;
        let shown: Vec<_> = plan.kernels.iter().map(|k| (k.template, k.ops.clone())).collect();
        let grad = if text.contains("attention_bias") { "attention_bias_grad_q" } else { "attention_grad_q" };
        assert!(plan.kernels.iter().any(|k| k.ops.iter().any(|o| o == grad)), "{name}: {shown:?}");
        for k in &plan.kernels {
            let operand = k.reads.iter().any(|r| ["q", "k", "v", "xq", "xk", "xv"].contains(&r.name.as_str()));
            assert!(!operand || k.template == eqfuse::Template::Attention, "{name}: a layout copy: {shown:?}");
        }
        let sources = codegen_plan(&plan).unwrap_or_else(|e| panic!("{name}: {e}"));
        for s in sources.iter().filter(|s| s.template == eqfuse::Template::Attention) {
            for arch in [DEFAULT_ARCH, "sm_80"] {
                let c = nvrtc_compile(&s.source, &s.file, arch, &[])
                    .unwrap_or_else(|e| panic!("{name} / {} ({arch}): {e}", s.name));
                assert!(c.log.trim().is_empty(), "{name} / {} ({arch}): warnings\n{}", s.name, c.log);
            }
            if s.name.starts_with("attention_bwd") {
                let defines = generated_defines(&s.source);
                assert_eq!(defines.contains("#define EQ_BIAS 1\n"), text.contains("attention_bias"), "{name}");
            }
        }
    }
}

/// Attention with dropout (`tests/common`'s `attention_dropout_programs`): the forward of every
/// program is one `attention_dropout` or `attention_bias_dropout` kernel (no materialized
/// scores: no kernel besides attention's reads q, k or v), the 16-bit programs' backward the
/// dropout forms of the flash kernels (`EQ_DROPOUT`, which have no Hopper path), and every
/// attention kernel compiles without warnings at sm_90 and sm_80. The 16-bit forward kernels
/// carry the Hopper path, whose sm_90a compile runs wgmma and spills at most 32 bytes more than
/// the same instance without dropout (ptxas's verbose log: at heads of 64 two blocks an SM cap a
/// thread at 128 registers, which these odd shapes' masking code already fills, some instances
/// spilling over 100 bytes without dropout; computing the bits beside the live scores spilled
/// up to 140 bytes more). `hopper_dropout_at_model_shapes_spills_nothing` checks model shapes.
#[test]
fn attention_dropout_kernels_compile() {
    if !nvrtc_or_skip() {
        return;
    }
    let opts = OptimizeOptions::new(DeviceProfile::load("h100").unwrap());
    for (name, text) in common::attention_dropout_programs() {
        let p = eqfuse::parse_program(&name, &text, &[]).unwrap_or_else(|e| panic!("{name}: {e}"));
        let plan = optimize(&p, &opts).unwrap().plan;
        let shown: Vec<_> = plan.kernels.iter().map(|k| (k.template, k.ops.clone())).collect();
        let bias = text.contains("attention_bias");
        let fwd = if bias { "attention_bias_dropout" } else { "attention_dropout" };
        let has = |op: &str| plan.kernels.iter().any(|k| k.ops.iter().any(|o| o == op));
        assert!(has(fwd), "{name}: {shown:?}");
        let forward_only = name.starts_with("f32") || name.starts_with("written");
        if !forward_only {
            let grad = if bias { "attention_bias_dropout_grad_q" } else { "attention_dropout_grad_q" };
            assert!(has(grad), "{name}: {shown:?}");
        }
        if name.starts_with("written") {
            assert!(has("attention_bias_dropout"), "{name}: {shown:?}");
        }
        for k in &plan.kernels {
            let operand = k.reads.iter().any(|r| ["q", "k", "v", "xq", "xk", "xv"].contains(&r.name.as_str()));
            assert!(
                !operand || k.template == eqfuse::Template::Attention,
                "{name}: scores or a layout copy: {shown:?}"
            );
        }
        let sources = codegen_plan(&plan).unwrap_or_else(|e| panic!("{name}: {e}"));
        let mut dropouts = 0;
        for s in sources.iter().filter(|s| s.template == eqfuse::Template::Attention) {
            for arch in [DEFAULT_ARCH, "sm_80"] {
                let c = nvrtc_compile(&s.source, &s.file, arch, &[])
                    .unwrap_or_else(|e| panic!("{name} / {} ({arch}): {e}", s.name));
                assert!(c.log.trim().is_empty(), "{name} / {} ({arch}): warnings\n{}", s.name, c.log);
            }
            let defines = generated_defines(&s.source);
            if defines.contains("#define EQ_DROPOUT 1\n") {
                dropouts += 1;
                if defines.contains("#define EQ_MODE 2\n") {
                    assert!(defines.contains("#define EQ_DQ 1\n"), "{name} / {}: dq apart", s.name);
                }
                let forward = !defines.contains("#define EQ_MODE ");
                let sixteen = !defines.contains("#define EQ_F32 1\n");
                assert_eq!(s.launch.sm90a.is_some(), forward && sixteen, "{name} / {}: the Hopper path", s.name);
                if s.launch.sm90a.is_some() {
                    let sm90 = nvrtc_compile(&s.source, &s.file, DEFAULT_ARCH, &[]).unwrap().ptx;
                    compile_sm90a(&name, s, &sm90);
                    let what = format!("{name} / {} (sm_90a)", s.name);
                    let (spill, _) = hopper_ptxas(&what, &s.source);
                    let plain = s.source.replacen("#define EQ_DROPOUT 1\n", "#define EQ_DROPOUT 0\n", 1);
                    let (without, _) = hopper_ptxas(&format!("{what} without dropout"), &plain);
                    eprintln!("{what}: {spill} bytes of spill stores ({without} without dropout)");
                    assert!(spill <= without + 32, "{what}: {spill} bytes of spill stores, {without} without dropout");
                }
                let seed = defines.lines().find(|l| l.starts_with("#define EQ_DROP_SEED ")).unwrap_or_default();
                let literal = text.contains(", 7)") || text.contains(", 12345)");
                assert_eq!(seed.contains("p_r"), !literal, "{name} / {}: {seed}", s.name);
            }
        }
        // (The forward, and the backward's one kernel of dq, dk and dv.)
        // (Written: two forward kernels, plain and biased.)
        let want = if name.starts_with("f32") { 1 } else { 2 };
        assert!(dropouts >= want, "{name}: {dropouts} attention kernels with dropout: {shown:?}");
    }
}

/// The bytes of spill stores of an attention source's sm_90a compile (ptxas's verbose log), and
/// whether ptxas serialized its wgmmas.
fn hopper_ptxas(what: &str, source: &str) -> (u32, bool) {
    let c = nvrtc_compile(source, "attention.cu", "sm_90a", &["--ptxas-options=-v".to_string()])
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    let spill = c
        .log
        .lines()
        .filter(|l| l.contains(" bytes spill stores"))
        .find_map(|l| l.split(" bytes spill stores").next()?.rsplit(' ').next()?.parse::<u32>().ok())
        .unwrap_or_else(|| panic!("{what}: no ptxas log\n{}", c.log));
    (spill, c.log.contains("wgmma.mma_async instructions are serialized"))
}

/// Attention with dropout at the shapes of the models that train with it (GPT-2: causal, heads
/// split from projections, the seed an element of the backend's seeds; BERT: a padding mask,
/// 512 tokens; and a literal seed): the Hopper path of the forward kernel, at two blocks an SM's
/// 128 registers, spills nothing and keeps its wgmmas asynchronous (the dropout bits of a tile
/// are computed in the step before, after its softmax: computed beside the tile's live scores
/// they spilled).
#[test]
fn hopper_dropout_at_model_shapes_spills_nothing() {
    if !nvrtc_or_skip() {
        return;
    }
    let heads = |b: usize, s: usize, mask: &str, att: &str| {
        format!(
            "dim B = {b}\ndim H = 12\ndim S = {s}\ndim D = 64\ninput seeds: i32[3]\n{mask}\
             input xq: bf16[B, S, 768]\ninput xk: bf16[B, S, 768]\ninput xv: bf16[B, S, 768]\n\
             qh = transpose(reshape(xq, [B, S, H, D]), 1, 2)\nkh = transpose(reshape(xk, [B, S, H, D]), 1, 2)\n\
             vh = transpose(reshape(xv, [B, S, H, D]), 1, 2)\n\
             o = reshape(transpose({att}, 1, 2), [B, S, 768])\noutput o\n"
        )
    };
    let seed = "slice(seeds, 0, 1, 2, 1)";
    let programs = [
        ("gpt2", heads(8, 1024, "", &format!("attention_dropout(qh, kh, vh, 0.125, 1, 0.1, {seed})"))),
        (
            "bert",
            heads(
                32,
                512,
                "input m: bf16[B, 1, 1, S]\n",
                &format!("attention_bias_dropout(qh, kh, vh, m, 0.125, 0, 0.1, {seed})"),
            ),
        ),
        ("literal_seed", heads(8, 1024, "", "attention_dropout(qh, kh, vh, 0.125, 0, 0.1, 7)")),
    ];
    let opts = OptimizeOptions::new(DeviceProfile::load("h100").unwrap());
    for (name, text) in programs {
        let p = eqfuse::parse_program(name, &text, &[]).unwrap_or_else(|e| panic!("{name}: {e}"));
        let plan = optimize(&p, &opts).unwrap().plan;
        let sources = codegen_plan(&plan).unwrap_or_else(|e| panic!("{name}: {e}"));
        let att: Vec<_> = sources.iter().filter(|s| s.template == eqfuse::Template::Attention).collect();
        assert_eq!(att.len(), 1, "{name}: {:?}", plan.kernels.iter().map(|k| &k.ops).collect::<Vec<_>>());
        assert!(att[0].launch.sm90a.is_some() && generated_defines(&att[0].source).contains("#define EQ_DROPOUT 1\n"));
        let (spill, serialized) = hopper_ptxas(name, &att[0].source);
        assert_eq!((spill, serialized), (0, false), "{name}: bytes of spill stores, wgmmas serialized");
    }
}

/// Wide and odd-width rows (issue 22): the row kernels of vocabulary-sized softmax,
/// log-softmax and cross-entropy (rows of 50257 in bf16 and f32, 128256 in bf16, 32001 with
/// the gradient) and of the odd-width row cases in `tests/cases/rows/`, compiled with ptxas's
/// verbose log, spill no registers to local memory: a row is kept in registers only where the
/// block leaves its threads registers for it. The 50257-wide bf16 softmax reads shifted rows
/// (16-byte vectors) and, too long for 64 registers a thread beside the rest, keeps each row
/// in shared memory, pipelined over its 4096 rows (and, for one row, two blocks an SM; on a 9.0
/// device these, and the 128256-wide rows, spread over clusters: `cluster_row_kernels_compile_without_spills`);
/// rows of 1024, 4096 and 32000 keep their kernels. Pipelined kernels compile for sm_80 too (`cp.async`
/// of 16 bytes, no Hopper copies).
#[test]
fn wide_and_odd_rows_compile_without_spills() {
    if !nvrtc_or_skip() {
        return;
    }
    let opts = OptimizeOptions::new(DeviceProfile::load("h100").unwrap());
    let dims = |pairs: &[(&str, usize)]| pairs.iter().map(|&(k, v)| (k.to_string(), v)).collect::<Vec<_>>();
    let wide = std::env::temp_dir().join(format!("eqfuse-wide-rows-{}", std::process::id()));
    std::fs::create_dir_all(&wide).unwrap();
    let mut programs: Vec<(String, Vec<(String, usize)>)> = Vec::new();
    for (name, text) in [
        ("softmax_bf16", "input x: bf16[R, V]\ny = softmax(x, -1)\noutput y\n"),
        ("softmax_f32", "input x: f32[R, V]\ny = softmax(x, -1)\noutput y\n"),
        ("log_softmax_bf16", "input x: bf16[R, V]\ny = log_softmax(x, -1)\noutput y\n"),
        ("log_softmax_f32", "input x: f32[R, V]\ny = log_softmax(x, -1)\noutput y\n"),
    ] {
        let path = wide.join(format!("{name}.eqf"));
        std::fs::write(&path, format!("dim R = 4096\ndim V = 50257\n{text}")).unwrap();
        let path = path.to_str().unwrap().to_string();
        programs.push((path.clone(), vec![]));
        if name == "softmax_bf16" {
            programs.push((path.clone(), dims(&[("R", 1)])));
            programs.push((path.clone(), dims(&[("R", 1024), ("V", 128256)])));
            for v in [1024, 4096, 32000] {
                programs.push((path.clone(), dims(&[("V", v)])));
            }
        }
    }
    for file in ["examples/cross_entropy.eqf", "examples/cross_entropy_grad.eqf"] {
        programs.push((file.to_string(), dims(&[("N", 8192), ("V", 50257)])));
    }
    // Wide normalisations and an f32 vocabulary of 32001, kept in shared memory.
    for (name, text) in [
        (
            "layernorm_wide",
            "input x: f32[R, V]\ninput g: f32[V]\ninput b: f32[V]\ny = layernorm(x, g, b, 0.00001)\noutput y\n",
        ),
        ("rmsnorm_wide", "input x: bf16[R, V]\ninput g: bf16[V]\ny = rmsnorm(x, g, 0.00001)\noutput y\n"),
        ("softmax_32001_f32", "input x: f32[R, V]\ny = softmax(x, -1)\noutput y\n"),
    ] {
        let path = wide.join(format!("{name}.eqf"));
        let v = if name.starts_with("softmax") { 32001 } else { 40001 };
        std::fs::write(&path, format!("dim R = 1024\ndim V = {v}\n{text}")).unwrap();
        programs.push((path.to_str().unwrap().to_string(), vec![]));
    }
    // Rows kept in shared memory of whole vectors only: one a block, and two a block.
    for (name, text) in [
        ("rmsnorm_49152_bf16", "dim R = 1024\ndim C = 49152\ninput x: bf16[R, C]\ninput g: bf16[C]\ny = rmsnorm(x, g, 0.00001)\noutput y\n"),
        ("softmax_sum3_4096_bf16", "dim R = 1024\ndim C = 4096\ninput a: bf16[R, C]\ninput b: bf16[R, C]\ninput c: bf16[R, C]\ny = softmax(a + b + c, -1)\noutput y\n"),
    ] {
        let path = wide.join(format!("{name}.eqf"));
        std::fs::write(&path, text).unwrap();
        programs.push((path.to_str().unwrap().to_string(), vec![]));
    }
    let ce_bf16 = wide.join("cross_entropy_bf16.eqf");
    std::fs::write(
        &ce_bf16,
        "dim N = 8192\ndim V = 50257\ninput logits: bf16[N, V]\ninput t: i32[N]\nloss = cross_entropy(logits, t)\noutput loss\n",
    )
    .unwrap();
    programs.push((ce_bf16.to_str().unwrap().to_string(), vec![]));
    let mut cases: Vec<String> = std::fs::read_dir("tests/cases/rows")
        .unwrap()
        .filter_map(|e| e.ok()?.path().to_str().map(str::to_string))
        .filter(|p| p.ends_with(".eqf"))
        .collect();
    cases.sort();
    programs.extend(cases.into_iter().map(|p| (p, vec![])));
    let verbose = ["--ptxas-options=-v".to_string()];
    // Under the switches that pick other wide-row paths to compare on a device
    // (`benches/wide_rows.sh`), only spills are checked: the shapes below are the defaults'.
    let default_paths = !std::env::vars_os().any(|(k, _)| k.to_str().is_some_and(|k| k.starts_with("EQFUSE_ROW_")));
    let (mut n, mut kept, mut pipelined, mut failed) = (0, 0, 0, Vec::new());
    for (path, dims) in &programs {
        let what = format!("{path} {dims:?}");
        let p = eqfuse::load_program(path, dims).unwrap_or_else(|e| panic!("{what}: {e}"));
        let plan = optimize(&p, &opts).unwrap().plan;
        for s in codegen_plan(&plan).unwrap().iter().filter(|s| s.name.starts_with("rowreduce")) {
            let c = nvrtc_compile(&s.source, &s.file, DEFAULT_ARCH, &verbose)
                .unwrap_or_else(|e| panic!("{what} / {}: {e}", s.name));
            let spills: Vec<&str> =
                c.log.lines().filter(|l| l.contains("bytes spill") && !l.contains(" 0 bytes spill stores")).collect();
            assert!(c.log.contains("bytes spill stores"), "{what} / {}: no ptxas log\n{}", s.name, c.log);
            let defines = generated_defines(&s.source);
            if !spills.is_empty() {
                let shape: Vec<&str> = defines.lines().filter(|l| l.starts_with("#define EQ_")).collect();
                failed.push(format!("{what} / {}: {}\n{}", s.name, spills.join("; "), shape.join("\n")));
            }
            let odd = p.dims.iter().any(|(k, v)| ["V", "C"].contains(&k.as_str()) && v % 8 != 0);
            if !default_paths {
                let shape: Vec<&str> = defines.lines().filter(|l| l.starts_with("#define EQ_")).collect();
                eprintln!("{what} / {}: {}", s.name, shape.join(" "));
            } else if path.ends_with("softmax_bf16.eqf") && dims.is_empty() {
                // The shape the issue measured at half of copy bandwidth (EQ_VEC 1, cached in
                // registers, 100 bytes of spill stores; then fetched again for the epilogue, at
                // 45%; then kept in shared memory by two blocks of 512 threads an SM, at 43%):
                // the row's 100528 bytes kept in shared memory, two buffers of a block of 1024
                // threads, the next row's copy in flight while one is reduced and written.
                for d in [
                    "EQ_VEC 8",
                    "EQ_SHIFT 1",
                    "EQ_CACHED 0",
                    "EQ_SMEM_CACHE 1",
                    "EQ_SMEM_PIPELINED 1",
                    "EQ_SMEM_ROW_BYTES 100528",
                    "EQ_ROW_THREADS 1024",
                    "EQ_MIN_BLOCKS 1",
                    "EQ_STAGES 2",
                ] {
                    assert!(defines.contains(&format!("#define {d}\n")), "{what}: not {d}\n{defines}");
                }
                assert_eq!(s.launch.smem_bytes, 2 * 100528, "{what}");
            } else if path.ends_with("softmax_bf16.eqf") && dims.iter().any(|(k, v)| k == "R" && *v == 1) {
                // A lone row of 16-bit values: never spread over a cluster (`caps::row_cluster`).
                assert!(s.launch.sm90a.is_none() && !defines.contains("EQ_CLUSTER"), "{what}\n{defines}");
            } else if path.ends_with("softmax_bf16.eqf") && dims.iter().any(|(_, v)| *v == 128256) {
                // 256 KB of bf16 a row: beyond a block's shared memory, fetched by each pass on
                // every path (16-bit rows are not spread over clusters).
                assert!(!defines.contains("EQ_SMEM_CACHE") && defines.contains("#define EQ_CACHED 0\n"), "{what}");
                assert!(s.launch.sm90a.is_none() && !defines.contains("EQ_CLUSTER"), "{what}\n{defines}");
            } else if path.ends_with("softmax_bf16.eqf") && dims.len() == 1 {
                // Rows 16 bytes divide keep their kernels: in registers, no shift.
                assert!(
                    defines.contains("#define EQ_CACHED 1\n") && !defines.contains("EQ_SHIFT"),
                    "{what}\n{defines}"
                );
            } else if odd && !defines.contains("EQ_SHIFT 1") {
                panic!("{what} / {}: odd rows not shifted\n{defines}", s.name);
            }
            if defines.contains("#define EQ_SMEM_CACHE 1\n") {
                let regs = c.log.lines().find(|l| l.contains("registers")).unwrap_or("");
                eprintln!(
                    "{what} / {}: kept in {} bytes of shared memory; {}",
                    s.name,
                    s.launch.smem_bytes,
                    regs.trim()
                );
                kept += 1;
            }
            if defines.contains("#define EQ_SMEM_PIPELINED 1\n") {
                let c = nvrtc_compile(&s.source, &s.file, "sm_80", &verbose)
                    .unwrap_or_else(|e| panic!("{what} / {} on sm_80: {e}", s.name));
                assert!(c.log.contains(" 0 bytes spill stores"), "{what} / {} on sm_80:\n{}", s.name, c.log);
                pipelined += 1;
            }
            n += 1;
        }
    }
    let _ = std::fs::remove_dir_all(&wide);
    if default_paths {
        assert!(kept >= 10, "only {kept} row kernels keep their rows in shared memory");
        assert!(pipelined >= 6, "only {pipelined} row kernels pipeline their rows through shared memory");
    }
    assert!(failed.is_empty(), "{} row kernels spill registers:\n{}", failed.len(), failed.join("\n\n"));
    eprintln!("compiled {n} row kernels of wide and odd rows without spills");
}

/// The fused form of products sharing their left operand (`matmul-shared-lhs`: the weights
/// concatenated by an elementwise kernel, one product, the results read back as slices) and its
/// torch `linear` spelling generate kernels that compile.
#[test]
fn shared_operand_product_kernels_compile() {
    if !nvrtc_or_skip() {
        return;
    }
    let opts = OptimizeOptions::new(DeviceProfile::load("h100").unwrap());
    for linear in [false, true] {
        let text = format!(
            "input x: bf16[8192, 4096]\n{}\nq = x @ {}\nk = x @ {}\nv = x @ {}\noutput q\noutput k\noutput v\n",
            ["wq", "wk", "wv"]
                .iter()
                .map(|w| if linear {
                    format!("input {w}: bf16[64, 4096]")
                } else {
                    format!("input {w}: bf16[4096, 64]")
                })
                .collect::<Vec<_>>()
                .join("\n"),
            if linear { "transpose(wq, -1, -2)" } else { "wq" },
            if linear { "transpose(wk, -1, -2)" } else { "wk" },
            if linear { "transpose(wv, -1, -2)" } else { "wv" },
        );
        let program = eqfuse::parse_program("qkv.eqf", &text, &[]).unwrap();
        let plan = optimize(&program, &opts).unwrap().plan;
        assert!(plan.kernels.iter().any(|k| k.ops.iter().any(|o| o == "concat")), "not fused: {:#?}", plan.kernels);
        let sources = codegen_plan(&plan).unwrap();
        assert!(sources.iter().any(|s| s.source.contains("concat") || s.name.contains("elementwise")));
        for s in sources {
            let c = nvrtc_compile(&s.source, &s.file, DEFAULT_ARCH, &[])
                .unwrap_or_else(|e| panic!("{}: {e}\n{}", s.name, s.source));
            assert!(c.log.trim().is_empty(), "{}: warnings\n{}", s.name, c.log);
        }
    }
}

/// A row kernel's Hopper path (rows over clusters) compiled for sm_90a: without warnings or
/// spills (ptxas's verbose log) at its register cap, with the cluster barrier and reads of
/// distributed shared memory, which its sm_90 compile (`sm90`, the portable path) lacks.
/// Returns the sm_90a compile's register line.
fn compile_cluster_rows(what: &str, s: &eqfuse::KernelSource, sm90: &[u8]) -> String {
    let c = nvrtc_compile(&s.source, &s.file, "sm_90a", &["--ptxas-options=-v".to_string()])
        .unwrap_or_else(|e| panic!("{what} / {} (sm_90a): {e}", s.name));
    let warnings: Vec<&str> = c
        .log
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with("ptxas info") && !l.contains("bytes stack frame"))
        .collect();
    assert!(warnings.is_empty(), "{what} / {} (sm_90a): warnings\n{}", s.name, c.log);
    assert!(c.log.contains(" 0 bytes spill stores"), "{what} / {} (sm_90a): spills\n{}", s.name, c.log);
    let ptx = String::from_utf8_lossy(&c.ptx);
    for needed in [
        "barrier.cluster.arrive",
        "barrier.cluster.wait",
        "mapa.shared::cluster",
        "ld.shared::cluster",
        ".reqnctapercluster",
    ] {
        assert!(ptx.contains(needed), "{what} / {}: no {needed} on sm_90a", s.name);
    }
    assert!(!String::from_utf8_lossy(sm90).contains("barrier.cluster"), "{what} / {}: clusters on sm_90", s.name);
    c.log.lines().find(|l| l.contains("registers")).unwrap_or("").trim().to_string()
}

/// Rows too long for one block's registers spread over a cluster of blocks on a 9.0 device
/// (`caps::row_cluster`): softmax, log-softmax, cross-entropy and its gradient, layernorm and
/// rmsnorm over vocabularies of 50257, 128256 and odd widths, bf16 and f32, each with a Hopper
/// path that compiles for sm_90a without spills (and a portable path for sm_90 and sm_80,
/// where clusters do not exist). Rows that fit a block's registers (32000 bf16) and strict
/// numerics keep one block a row.
#[test]
fn cluster_row_kernels_compile_without_spills() {
    if !nvrtc_or_skip() {
        return;
    }
    let opts = OptimizeOptions::new(DeviceProfile::load("h100").unwrap());
    let (mut n, mut portable) = (0, 0);
    for (name, text) in common::cluster_row_programs() {
        for strict in [false, true] {
            let opts = OptimizeOptions { strict, ..opts.clone() };
            let p = eqfuse::parse_program(&name, &text, &[]).unwrap_or_else(|e| panic!("{name}: {e}"));
            let plan = optimize(&p, &opts).unwrap().plan;
            for s in codegen_plan(&plan).unwrap().iter().filter(|s| s.template == eqfuse::Template::RowReduce) {
                let what = format!("{name} (strict {strict})");
                let c = nvrtc_compile(&s.source, &s.file, DEFAULT_ARCH, &[])
                    .unwrap_or_else(|e| panic!("{what} / {}: {e}", s.name));
                assert!(c.log.trim().is_empty(), "{what} / {}: warnings\n{}", s.name, c.log);
                let Some(h) = &s.launch.sm90a else {
                    portable += 1;
                    continue;
                };
                assert!(!strict, "{what} / {}: a cluster under strict numerics", s.name);
                let blocks = generated_defines(&s.source)
                    .lines()
                    .find_map(|l| l.strip_prefix("#define EQ_CLUSTER "))
                    .and_then(|v| v.trim().parse::<u32>().ok())
                    .unwrap_or_else(|| panic!("{what} / {}: no EQ_CLUSTER", s.name));
                assert!((2..=8).contains(&blocks), "{what} / {}: {blocks} blocks a cluster", s.name);
                assert_eq!(h.grid[0] % blocks, 0, "{what} / {}: a grid of part of a cluster", s.name);
                // (A wave of whole resident clusters, each looping over rows: `Launch::cluster`.)
                assert!(h.persistent && h.wave && h.cluster == blocks, "{what} / {}: not a wave of clusters", s.name);
                let regs = compile_cluster_rows(&what, s, &c.ptx);
                let c = nvrtc_compile(&s.source, &s.file, "sm_80", &[])
                    .unwrap_or_else(|e| panic!("{what} / {} on sm_80: {e}", s.name));
                assert!(c.log.trim().is_empty(), "{what} / {} on sm_80: warnings\n{}", s.name, c.log);
                eprintln!("{what} / {}: clusters of {blocks}, grid {}; {regs}", s.name, h.grid[0]);
                n += 1;
            }
        }
    }
    assert!(n >= 6, "only {n} row kernels spread rows over clusters (f32 rows only)");
    assert!(portable >= 8, "only {portable} row kernels keep one block a row");
}

/// The segmented row kernels of few long rows (`common::long_row_programs`: one row of 8.4
/// million, shifted bf16 rows, several reductions and an online max and sum in one kernel)
/// compile, and without spills at the register cap of two blocks of 512 threads an SM.
#[test]
fn segmented_row_kernels_compile_without_spills() {
    if !nvrtc_or_skip() {
        return;
    }
    let opts = OptimizeOptions::new(DeviceProfile::load("h100").unwrap());
    let mut n = 0;
    for (name, text, _) in common::long_row_programs() {
        let p = eqfuse::parse_program(name, &text, &[]).unwrap();
        let plan = optimize(&p, &opts).unwrap().plan;
        for s in codegen_plan(&plan).unwrap().iter().filter(|s| s.source.contains("#define EQ_SEGS ")) {
            let c = nvrtc_compile(&s.source, &s.file, DEFAULT_ARCH, &["--ptxas-options=-v".into()])
                .unwrap_or_else(|e| panic!("{name} / {}: {e}", s.name));
            assert!(c.log.contains("bytes spill stores"), "{name} / {}: no ptxas log\n{}", s.name, c.log);
            let spills = c.log.lines().any(|l| l.contains("bytes spill") && !l.contains(" 0 bytes spill stores"));
            assert!(!spills, "{name} / {}: spills\n{}", s.name, c.log);
            n += 1;
        }
    }
    assert!(n >= 8, "only {n} segmented row kernels");
}

/// The transposed-read programs (`common::transposed_programs`): the tiled path's kernels and
/// the plain path's compile without warnings.
#[test]
fn transposed_read_kernels_compile() {
    if !nvrtc_or_skip() {
        return;
    }
    let opts = OptimizeOptions::new(DeviceProfile::load("h100").unwrap());
    for (name, text) in common::transposed_programs() {
        let program = eqfuse::parse_program(&name, &text, &[]).unwrap();
        let plan = optimize(&program, &opts).unwrap().plan;
        for s in codegen_plan(&plan).unwrap_or_else(|e| panic!("{name}: {e}")) {
            let c = nvrtc_compile(&s.source, &s.file, DEFAULT_ARCH, &[])
                .unwrap_or_else(|e| panic!("{name} / {}: {e}\n{}", s.name, s.source));
            assert!(c.log.trim().is_empty(), "{name} / {}: warnings\n{}", s.name, c.log);
        }
    }
}

/// Elementwise kernels whose lanes access fewer than 16 bytes (an odd last extent under a row
/// or column broadcast: one f32, one bf16, one bool a lane) handle `EQ_UNROLL` vectors a step,
/// enough for 16 bytes in flight a thread (the unrolled step's loads all in its PTX, on the
/// non-coherent path). 16-byte lanes keep one vector a step.
#[test]
fn narrow_lane_elementwise_kernels_unroll_their_loads() {
    if !nvrtc_or_skip() {
        return;
    }
    let cases = [
        ("f32_rows", "input x: f32[320, 50257]\ninput m: f32[320, 1]\ny = x - m\noutput y\n", 4),
        ("bf16_cols", "input x: bf16[8192, 8191]\ninput b: bf16[8191]\ny = x * b\noutput y\n", 8),
        ("bool_cols", "input x: i32[4096, 127]\ninput b: i32[127]\ny = x == b\noutput y\n", 4),
        ("f32_even", "input x: f32[320, 50256]\ninput m: f32[320, 1]\ny = x - m\noutput y\n", 1),
    ];
    let opts = OptimizeOptions::new(DeviceProfile::load("h200").unwrap());
    for (name, text, unroll) in cases {
        let p = eqfuse::parse_program(name, text, &[]).unwrap_or_else(|e| panic!("{name}: {e}"));
        let plan = optimize(&p, &opts).unwrap().plan;
        let sources = codegen_plan(&plan).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(sources.len(), 1, "{name}: one kernel");
        let s = &sources[0];
        let defines = generated_defines(&s.source);
        let got = defines
            .lines()
            .find_map(|l| l.strip_prefix("#define EQ_UNROLL "))
            .map_or(1, |v| v.trim().parse::<usize>().unwrap());
        assert_eq!(got, unroll, "{name}: EQ_UNROLL\n{defines}");
        let c = nvrtc_compile(&s.source, &s.file, DEFAULT_ARCH, &[]).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(c.log.trim().is_empty(), "{name}: warnings\n{}", c.log);
        if unroll > 1 {
            // The unrolled step: the loads of `x` of every vector of it, each in place (the
            // order of loads and stores is ptxas's: `x` is read through the non-coherent path,
            // which no store of the kernel can alias, so it may issue them all first).
            let ptx = String::from_utf8_lossy(&c.ptx);
            let loads = ptx.matches("ld.global.nc").count();
            assert!(loads > unroll, "{name}: {loads} non-coherent global loads, want more than {unroll}\n{ptx}");
        }
    }
}
