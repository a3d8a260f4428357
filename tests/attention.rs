//! The attention template: plans keep the score matrix out of device memory, and code
//! generation turns attention kernels into instances of `kernels/attention.cu` (compiled with
//! NVRTC where it is available; run on the GPU by tests/gpu.rs through the shared cases).

mod common;

use eqfuse::{
    check_plan, codegen_plan, load_program, optimize, parse_program, random_inputs, DeviceProfile, FusionPlan,
    OptimizeOptions, Program, Template,
};

fn opts() -> OptimizeOptions {
    OptimizeOptions::new(DeviceProfile::load("h100").unwrap())
}

#[test]
fn attention_example_moves_q_k_v_and_o_once_and_never_the_scores() {
    let p = load_program("examples/attention.eqf", &[]).unwrap();
    let plan = optimize(&p, &opts()).unwrap().plan;
    let (b, h, s, d) = (8u64, 16u64, 2048u64, 64u64);
    assert_eq!(plan.total.kernels, 1, "{:#?}", plan.kernels);
    assert_eq!(plan.kernels[0].template, Template::Attention);
    assert_eq!(plan.total.bytes, 4 * b * h * s * d * 2);
    // No tensor of S x S elements per head is read or written by any kernel.
    for k in &plan.kernels {
        for t in k.reads.iter().chain(&k.writes) {
            assert!(t.ty.numel() as u64 <= b * h * s * d, "{} {} holds scores", t.name, t.ty);
        }
    }
    // The eager plan writes the scores several times over.
    assert!(plan.unfused.bytes > 4 * b * h * s * s * 2);
}

#[test]
fn attention_kernel_launch_shape() {
    let p = load_program("examples/attention.eqf", &[]).unwrap();
    let plan = optimize(&p, &opts()).unwrap().plan;
    let src = codegen_plan(&plan).unwrap();
    assert_eq!(src.len(), 1);
    let k = &src[0];
    assert_eq!(k.name, "attention_bf16_k0");
    assert_eq!(k.launch.grid, [16, 128, 1]);
    assert_eq!(k.launch.block, [128, 1, 1]);
    assert_eq!(k.launch.smem_bytes, 49152);
    let names: Vec<&str> = k.args.iter().map(|a| a.name.as_str()).collect();
    assert_eq!(names, ["q", "k", "v", "o"]);
    assert!(k.source.contains("#define EQ_SCALE_LOG2 0.18033688f"));
    assert!(k.source.contains("#define EQ_CAUSAL 0"));
    // The wgmma path on a 9.0 device: two warpgroups of 64 rows, 64-key tiles, two buffers each
    // of keys and values, 1024 bytes of alignment.
    let h = k.launch.sm90a.as_deref().expect("a bf16 attention kernel has a Hopper path");
    assert_eq!(h.grid, [16, 128, 1]);
    assert_eq!(h.block, [256, 1, 1]);
    assert_eq!(h.smem_bytes, (128 + 4 * 64) * 64 * 2 + 1024);
    assert!(h.sm90a.is_none());
    assert!(k.source.contains("#define EQ_WGMMA 1"));
}

#[test]
fn only_tensor_core_attention_with_a_positive_scale_has_a_hopper_path() {
    let hopper = |ty: &str, scale: &str| {
        let src = format!("input q: {ty}[2, 4, 100, 32]\no = attention(q, q, q, {scale}, 1)\noutput o\n");
        let p = eqfuse::parse_program("h.eqf", &src, &[]).unwrap();
        let plan = optimize(&p, &opts()).unwrap().plan;
        let src = codegen_plan(&plan).unwrap();
        let k = src.iter().find(|s| s.template == Template::Attention).expect("an attention kernel");
        k.launch.sm90a.is_some() && k.source.contains("#define EQ_WGMMA 1")
    };
    assert!(hopper("bf16", "0.125"));
    assert!(hopper("f16", "0.125"));
    assert!(!hopper("bf16", "-0.125"));
    assert!(!hopper("f32", "0.125"));
}

/// A 16-bit attention that the Hopper path does not take (a non-positive scale) is timed at the
/// portable path's rate (`implementations.portable`), the others at the template's own.
#[test]
fn attention_off_the_hopper_path_is_timed_at_the_portable_rate() {
    let predicted = |scale: &str, profile: &DeviceProfile| {
        let src = format!("input q: bf16[8, 16, 2048, 64]\no = attention(q, q, q, {scale}, 0)\noutput o\n");
        let p = eqfuse::parse_program("h.eqf", &src, &[]).unwrap();
        let plan = optimize(&p, &OptimizeOptions::new(profile.clone())).unwrap().plan;
        let k = plan.kernels.iter().find(|k| k.template == Template::Attention).expect("an attention kernel");
        k.predicted_us
    };
    let mut slow = DeviceProfile::load("h100").unwrap();
    let a = slow.templates.get_mut("attention").unwrap();
    let mut portable = a.clone();
    portable.implementations.clear();
    portable.flops_bf16_tflops = Some(a.flops_bf16_tflops.unwrap() / 2.0);
    a.implementations.insert("portable".into(), portable);
    let base = DeviceProfile::load("h100").unwrap();
    let launch = base.launch_overhead_us;
    // On the Hopper path the portable rate changes nothing; off it, it halves the rate.
    assert_eq!(predicted("0.125", &slow), predicted("0.125", &base));
    let (off, on) = (predicted("-0.125", &slow), predicted("0.125", &slow));
    assert!(((off - launch) / (on - launch) - 2.0).abs() < 1e-6, "{off} {on}");
}

#[test]
fn attention_with_an_epilogue_is_two_kernels() {
    let src = "input q: bf16[2, 64, 64]\noutput y\ny = attention(q, q, q, 0.125, 1) * 2\n";
    let src = src.replace("output y\ny", "y");
    let p = eqfuse::parse_program("e.eqf", &format!("{src}output y\n"), &[]).unwrap();
    let plan = optimize(&p, &opts()).unwrap().plan;
    let att: Vec<_> = plan.kernels.iter().filter(|k| k.template == Template::Attention).collect();
    assert_eq!(att.len(), 1);
    assert_eq!(att[0].ops, ["attention"]);
    // Every kernel of the plan has a generated source.
    assert_eq!(codegen_plan(&plan).unwrap().len(), plan.kernels.len());
}

#[test]
fn attention_the_template_does_not_run_is_planned_from_its_parts() {
    // bf16 heads of 12 (not a multiple of 8): a written attention is expanded before planning,
    // and the parts are not recognised back, so every kernel has a source (found by the GPU
    // differential run, where such plans failed in codegen).
    let src = "input q: bf16[2, 64, 12]\no = attention(q, q, q, 0.125, 0)\noutput o\n";
    let p = eqfuse::parse_program("odd.eqf", src, &[]).unwrap();
    let plan = optimize(&p, &opts()).unwrap().plan;
    assert!(plan.kernels.iter().all(|k| k.template != eqfuse::Template::Attention), "{plan:?}");
    assert_eq!(codegen_plan(&plan).unwrap().len(), plan.kernels.len());
    let p = eqfuse::parse_program("ok.eqf", &src.replace("12]", "16]"), &[]).unwrap();
    let plan = optimize(&p, &opts()).unwrap().plan;
    assert!(plan.kernels.iter().any(|k| k.template == eqfuse::Template::Attention));
}

/// A padding mask `[B, 1, 1, S]` read in place by the attention kernel: the bias has stride 0
/// along the heads and the query rows, its batch axis its own stride; q, k, v and o keep the
/// strides of plain attention, and a kernel without a bias defines no `EQ_BIAS`.
#[test]
fn attention_bias_reads_a_padding_mask_in_place() {
    let src = "input q: bf16[2, 4, 100, 64]\ninput k: bf16[2, 4, 100, 64]\ninput v: bf16[2, 4, 100, 64]\n\
               input mask: f32[2, 1, 1, 100]\no = attention_bias(q, k, v, mask, 0.125, 1)\noutput o\n";
    let p = eqfuse::parse_program("pad.eqf", src, &[]).unwrap();
    let plan = optimize(&p, &opts()).unwrap().plan;
    assert_eq!(plan.kernels.len(), 1, "{:#?}", plan.kernels);
    assert_eq!(plan.kernels[0].ops, ["attention_bias"]);
    let s = &codegen_plan(&plan).unwrap()[0];
    let names: Vec<&str> = s.args.iter().map(|a| a.name.as_str()).collect();
    assert_eq!(names, ["q", "k", "v", "mask", "o"]);
    for want in [
        "EQ_BIAS 1",
        "EQ_BT float",
        "EQ_BP p_r3",
        "EQ_NB1 2",
        "EQ_NB2 4",
        "EQ_Q_S1 25600LL",
        "EQ_Q_S2 6400LL",
        "EQ_B_S0 0LL",
        "EQ_B_S1 100LL",
        "EQ_B_S2 0LL",
        "EQ_B_SR 0LL",
        "EQ_B_SC 1LL",
        "EQ_CAUSAL 1",
        "EQ_WGMMA 1",
    ] {
        assert!(s.source.contains(&format!("#define {want}\n")), "no {want}:\n{}", &s.source[..2000]);
    }
    // The bias's own element type, the operands' theirs.
    assert!(
        s.source.contains("const eq_bf16* __restrict__ p_r2, const float* __restrict__ p_r3"),
        "{}",
        &s.source[..2000]
    );
    let p = load_program("examples/attention.eqf", &[]).unwrap();
    let plain = &codegen_plan(&optimize(&p, &opts()).unwrap().plan).unwrap()[0];
    let defines = plain.source.split("// ---- kernels/").next().unwrap();
    assert!(!defines.contains("#define EQ_BIAS") && !defines.contains("#define EQ_B_"), "{defines}");
}

/// The bias of `attention_bias` moves its own bytes once: a `[S, S]` mask shared by every batch
/// entry and head costs its size, not the scores'.
#[test]
fn attention_bias_reads_its_bias_once() {
    let (b, h, s, d) = (4u64, 8u64, 1024u64, 64u64);
    let src = format!(
        "input q: bf16[{b}, {h}, {s}, {d}]\ninput mask: bf16[{s}, {s}]\n\
         o = softmax(q @ transpose(q, -1, -2) * 0.125 + mask, -1) @ q\noutput o\n"
    );
    let p = eqfuse::parse_program("sq.eqf", &src, &[]).unwrap();
    let plan = optimize(&p, &opts()).unwrap().plan;
    assert_eq!(plan.total.kernels, 1, "{:#?}", plan.kernels);
    assert_eq!(plan.kernels[0].template, Template::Attention);
    assert_eq!(plan.total.bytes, 2 * b * h * s * d * 2 + s * s * 2);
}

/// A bool mask applied by `where`: the attention kernel reads the mask (one byte a key) and
/// selects the bias itself (`EQ_BIAS_SEL`), 0 where the mask holds and the fill elsewhere.
#[test]
fn attention_bias_selects_a_bool_masks_bias_in_place() {
    let src = "input q: bf16[2, 4, 100, 64]\ninput m: bool[2, 1, 1, 100]\n\
               o = softmax(where(m, q @ transpose(q, -1, -2) * 0.125, -1e30), -1) @ q\noutput o\n";
    let p = eqfuse::parse_program("bool.eqf", src, &[]).unwrap();
    let plan = optimize(&p, &opts()).unwrap().plan;
    assert_eq!(plan.kernels.len(), 1, "{:#?}", plan.kernels);
    assert_eq!(plan.kernels[0].ops, ["where", "attention_bias"]);
    assert_eq!(plan.total.bytes, 2 * 2 * 4 * 100 * 64 * 2 + 2 * 100);
    let s = &codegen_plan(&plan).unwrap()[0];
    let defines = s.source.split("// ---- kernels/").next().unwrap();
    for want in ["EQ_BIAS 1", "EQ_BIAS_SEL 1", "EQ_BIAS_YES 0.0f", "EQ_BIAS_NO -1e30f", "EQ_BT eq_bool", "EQ_B_SR 0LL"]
    {
        assert!(defines.contains(&format!("#define {want}\n")), "no {want}:\n{defines}");
    }
}

/// A padding mask broadcast to the scores' shape before it becomes a bias (transformers'
/// `[B, 1, S, S]` mask built from a `[B, S]` one): `where-of-broadcast` keeps the bias a tensor
/// by key, which the kernel reads in place (row stride 0), instead of writing a bias of the
/// scores' size.
#[test]
fn a_mask_broadcast_to_the_scores_stays_a_bias_by_key() {
    let src = "input q: bf16[2, 4, 128, 64]\ninput k: bf16[2, 4, 128, 64]\ninput v: bf16[2, 4, 128, 64]\n\
               input m: bool[2, 128]\n\
               full = broadcast(reshape(m, [2, 1, 1, 128]), [2, 1, 128, 128])\n\
               bias = where(full, cast(0, bf16), cast(-1e30, bf16))\n\
               o = softmax(q @ transpose(k, 2, 3) * 0.125 + bias, 3) @ v\noutput o\n";
    let p = eqfuse::parse_program("full_mask.eqf", src, &[]).unwrap();
    let plan = optimize(&p, &opts()).unwrap().plan;
    let att = plan.kernels.iter().find(|k| k.template == Template::Attention).expect("an attention kernel");
    // No kernel writes a tensor of the scores' size (2 x 128 x 128 bias elements).
    assert!(plan.total.bytes < 4 * 2 * 4 * 128 * 64 * 2 + 2 * 128 * 128, "{:#?}", plan.kernels);
    let s = &codegen_plan(&plan).unwrap()[att.id];
    let defines = s.source.split("// ---- kernels/").next().unwrap();
    assert!(defines.contains("#define EQ_BIAS 1\n") && defines.contains("#define EQ_B_SR 0LL\n"), "{defines}");
}

/// A mask of all true (`transformers` 5.17 passes ViT's SDPA `ones(...).bool()` expanded to the
/// scores; the exporter turns a bool mask into the bias `where(m, 0, FILL)`) and a bias of zeros
/// plan as attention with no bias read (`attention-zero-bias`), in f32 and bf16, with or without
/// the causal mask; the plan matches the reference. A mask that is not all true stays.
#[test]
fn a_bias_of_zeros_is_no_bias() {
    let biases = [
        "where(broadcast(cast(1, bool), [2, 1, 97, 97]), cast(0, T), cast(-3e38, T))",
        "broadcast(cast(0, T), [2, 4, 97, 97])",
        "where(broadcast(cast(3, bool), [97, 97]), 0, -1e30)",
    ];
    for (dtype, bias, causal) in [("f32", 0, 0), ("f32", 1, 1), ("bf16", 0, 1), ("bf16", 2, 0), ("f32", 2, 0)] {
        let bias = biases[bias].replace('T', dtype);
        let src = format!(
            "input q: {dtype}[2, 4, 97, 64]\ninput k: {dtype}[2, 4, 97, 64]\ninput v: {dtype}[2, 4, 97, 64]\n\
             o = attention_bias(q, k, v, {bias}, 0.125, {causal})\noutput o\n"
        );
        let p = parse_program("zero_bias.eqf", &src, &[]).unwrap();
        let plan = optimize(&p, &opts()).unwrap().plan;
        assert_eq!(kernels(&plan), [(Template::Attention, &["attention".to_string()][..])], "{src}");
        assert_eq!(plan.total.bytes, 4 * 2 * 4 * 97 * 64 * if dtype == "f32" { 4 } else { 2 }, "{src}");
        assert!(!defines(&plan, 0).contains("#define EQ_BIAS 1\n"), "{src}");
        for (out, cmp) in check_plan(&p, &plan, &random_inputs(&p, 1)).unwrap() {
            assert!(cmp.ok(), "{src}: {out}: {cmp:?}");
        }
    }
    // One key masked: the mask stays.
    let src = "input q: f32[2, 4, 97, 64]\ninput k: f32[2, 4, 97, 64]\ninput v: f32[2, 4, 97, 64]\n\
               m = iota(97) != 5\n\
               o = attention_bias(q, k, v, where(broadcast(m, [2, 1, 97, 97]), cast(0, f32), cast(-1e30, f32)), 0.125, 0)\noutput o\n";
    let p = parse_program("one_masked.eqf", src, &[]).unwrap();
    let plan = optimize(&p, &opts()).unwrap().plan;
    assert!(plan.kernels.iter().any(|k| k.ops.iter().any(|o| o == "where")), "{:?}", kernels(&plan));
    for (out, cmp) in check_plan(&p, &plan, &random_inputs(&p, 1)).unwrap() {
        assert!(cmp.ok(), "{out}: {cmp:?}");
    }
}

/// A program of `common::sliced_operand_programs` by name.
fn sliced(name: &str) -> Program {
    let (_, text) = common::sliced_operand_programs().into_iter().find(|(n, _)| n == name).expect("a sliced program");
    parse_program(name, &text, &[]).unwrap()
}

fn kernels(plan: &FusionPlan) -> Vec<(Template, &[String])> {
    plan.kernels.iter().map(|k| (k.template, k.ops.as_slice())).collect()
}

fn names(ts: &[eqfuse::TensorRef]) -> Vec<&str> {
    ts.iter().map(|t| t.name.as_str()).collect()
}

/// The `#define` block of a kernel's source.
fn defines(plan: &FusionPlan, id: usize) -> String {
    let src = codegen_plan(plan).unwrap();
    let s = src.iter().find(|s| s.kernel == id).expect("a source for the kernel");
    s.source.split("// ---- kernels/").next().unwrap().to_string()
}

/// GPT-2's attention: `qkv = x @ w + b` (`[B, S, 3E]`) split into q, k and v along its last
/// axis, each reshaped to heads and transposed. The attention kernel reads the three slices of
/// the projection in place (each from its element offset, rows 3E apart): the plan is the
/// projection, attention and the output projection, with no copy between them, and attention
/// moves each third of `qkv` once.
#[test]
fn gpt2_heads_split_from_one_projection_are_read_in_place() {
    let p = sliced("gpt2_qkv_bf16_causal");
    let plan = optimize(&p, &opts()).unwrap().plan;
    let templates: Vec<Template> = plan.kernels.iter().map(|k| k.template).collect();
    assert_eq!(templates, [Template::Gemm, Template::Attention, Template::Gemm], "{:?}", kernels(&plan));
    let (proj, att) = (&plan.kernels[0], &plan.kernels[1]);
    assert_eq!(names(&att.reads), names(&proj.writes));
    assert_eq!(att.bytes_read, proj.bytes_written);
    let d = defines(&plan, att.id);
    for want in ["EQ_QP p_r0", "EQ_KP (p_r0 + 256LL)", "EQ_VP (p_r0 + 512LL)", "EQ_Q_SR 768LL", "EQ_V_S2 64LL"] {
        assert!(d.contains(&format!("#define {want}\n")), "no {want}:\n{d}");
    }
    // The same program at GPT-2 small's sizes: still no copy between the product and attention.
    let (_, text) = common::sliced_operand_programs().into_iter().find(|(n, _)| n == "gpt2_qkv_bf16_causal").unwrap();
    let dims: Vec<(String, usize)> =
        [("B", 8), ("S", 1024), ("E", 768), ("H", 12), ("W", 2304)].map(|(n, v)| (n.to_string(), v)).into();
    let big = parse_program("gpt2.eqf", &text, &dims).unwrap();
    let plan = optimize(&big, &opts()).unwrap().plan;
    let templates: Vec<Template> = plan.kernels.iter().map(|k| k.template).collect();
    assert_eq!(templates, [Template::Gemm, Template::Attention, Template::Gemm], "{:?}", kernels(&plan));
}

/// The three projections of one activation, written apart: `matmul-shared-lhs` makes them one
/// product of the concatenated weights, whose slices attention reads in place (the concat of the
/// weights is the only other kernel).
#[test]
fn fused_projections_are_read_in_place_by_attention() {
    let p = sliced("shared_lhs_bf16");
    let plan = optimize(&p, &opts()).unwrap().plan;
    let att = plan.kernels.iter().find(|k| k.template == Template::Attention).expect("an attention kernel");
    let product = plan.kernels.iter().filter(|k| k.template == Template::Gemm).collect::<Vec<_>>();
    assert_eq!(product.len(), 1, "{:?}", kernels(&plan));
    assert_eq!(names(&att.reads), names(&product[0].writes), "{:?}", kernels(&plan));
    assert_eq!(plan.kernels.len(), 3, "{:?}", kernels(&plan));
}

/// A product whose A operand is a slice (`slice(h, -1, 0, 256) @ w`) reads it in place, and so
/// does its weight gradient (`transpose(slice(h)) @ dy`): no kernel copies the slice, and the
/// slice's bytes are what the product reads of `h`.
#[test]
fn a_sliced_product_operand_is_read_in_place() {
    let p = sliced("sliced_a_f32");
    let plan = optimize(&p, &opts()).unwrap().plan;
    let with_slice: Vec<_> = plan.kernels.iter().filter(|k| k.ops.iter().any(|o| o == "slice")).collect();
    assert_eq!(with_slice.len(), 2, "{:?}", kernels(&plan));
    for k in with_slice {
        assert_eq!(k.template, Template::Gemm, "{:?}", kernels(&plan));
        let h = k.reads.iter().position(|t| t.name == "h").expect("reads h");
        let other: u64 = k.reads.iter().enumerate().filter(|&(i, _)| i != h).map(|(_, t)| t.ty.bytes()).sum();
        assert_eq!(k.bytes_read, other + 64 * 256 * 4, "kernel {}", k.id);
    }
}

/// bf16 slices that start at element 4: the attention kernels load 16 bytes at a time, so they
/// cannot read them in place (codegen says so through `caps`), and the plan copies them first;
/// a product reads such a slice in place (the generated kernel stages it element by element,
/// cuBLASLt is told the pointers' alignment).
#[test]
fn unaligned_16_bit_slices_are_copied_for_attention_only() {
    let p = sliced("gpt2_qkv_bf16_offset_4");
    let plan = optimize(&p, &opts()).unwrap().plan;
    let att = plan.kernels.iter().find(|k| k.template == Template::Attention).expect("an attention kernel");
    assert!(!att.ops.iter().any(|o| o == "slice"), "{:?}", kernels(&plan));
    assert!(plan.kernels.iter().any(|k| k.template == Template::Elementwise && k.ops.iter().any(|o| o == "slice")));
    codegen_plan(&plan).unwrap();
    let p = sliced("sliced_a_bf16_offset_4");
    let plan = optimize(&p, &opts()).unwrap().plan;
    let y = plan.kernels.iter().find(|k| names(&k.writes) == ["y"]).expect("a kernel writes y");
    assert_eq!(y.template, Template::Gemm, "{:?}", kernels(&plan));
    assert!(y.ops.iter().any(|o| o == "slice"), "{:?}", kernels(&plan));
    // Either implementation starts A at element 4: the generated kernel's pointer, staged element
    // by element (no 16-byte chunks of A), or the call's operand (row-major A is the call's b).
    let mut plan = plan.clone();
    let id = y.id;
    plan.kernels[id].implementation = Some(eqfuse::GemmImpl::Generated);
    let d = defines(&plan, id);
    assert!(d.contains("#define EQ_A (p_h + 4LL)\n") && d.contains("#define EQ_MMA 1\n"), "{d}");
    assert!(!d.contains("#define EQ_VA"), "{d}");
    plan.kernels[id].implementation = Some(eqfuse::GemmImpl::Cublaslt);
    let src = codegen_plan(&plan).unwrap();
    let call = src.iter().find(|s| s.kernel == id).and_then(|s| s.cublaslt.clone()).expect("a cuBLASLt call");
    assert_eq!((call.a.offset, call.b.offset, call.b.ld), (0, 4, 520));
    assert_eq!(call.offsets(), [[0, 4, 0]]);
}

/// Every program of `common::sliced_operand_programs`: its plan matches the CPU reference kernel
/// by kernel, every kernel generates, and (where NVRTC is available) compiles without warnings
/// for sm_90 and sm_80.
#[test]
fn sliced_operand_plans_match_the_reference_and_compile() {
    let nvrtc = eqfuse::nvrtc_available().is_ok();
    if !nvrtc {
        eprintln!("NVRTC is not available: the kernels are generated, not compiled");
    }
    for (name, text) in common::sliced_operand_programs() {
        let p = parse_program(&name, &text, &[]).unwrap();
        let plan = optimize(&p, &opts()).unwrap().plan;
        let inputs = random_inputs(&p, 3);
        for (out, cmp) in check_plan(&p, &plan, &inputs).unwrap() {
            assert!(cmp.ok(), "{name}: output {out}: {cmp}");
        }
        let sources = codegen_plan(&plan).unwrap_or_else(|e| panic!("{name}: {e}"));
        // Every slice is read in place by a product or attention, but those of the program whose
        // slices attention cannot read.
        for k in plan.kernels.iter().filter(|k| k.ops.iter().any(|o| o == "slice")) {
            let in_place = matches!(k.template, Template::Gemm | Template::Attention);
            assert!(in_place || name == "gpt2_qkv_bf16_offset_4", "{name}: a slice copied: {:?}", kernels(&plan));
        }
        if !nvrtc {
            continue;
        }
        for s in &sources {
            for arch in [eqfuse::DEFAULT_ARCH, "sm_80"] {
                let c = eqfuse::nvrtc_compile(&s.source, &s.file, arch, &[])
                    .unwrap_or_else(|e| panic!("{name}: {} ({arch}): {e}", s.name));
                assert!(c.log.trim().is_empty(), "{name}: {} ({arch}): warnings\n{}", s.name, c.log);
            }
        }
    }
}

/// Heads taken as slices of a view (PyTorch's `qkv.reshape(B, S, 3, H, D)` indexed along the
/// 3): attention reads them in place, and the bytes it reads of the projection are those of the
/// slices it takes (here q and k: two thirds), not all of it.
#[test]
fn slices_of_a_view_are_priced_by_what_they_read() {
    let src = "dim B = 2\ndim S = 100\ndim H = 4\ndim D = 64\n\
               input x: bf16[B, S, 256]\ninput w: bf16[256, 768]\ninput v: bf16[B, H, S, D]\n\
               qkv = reshape(x @ w, [B, S, 3, H, D])\n\
               q = transpose(reshape(slice(qkv, 2, 0, 1), [B, S, H, D]), 1, 2)\n\
               k = transpose(reshape(slice(qkv, 2, 1, 2), [B, S, H, D]), 1, 2)\n\
               o = attention(q, k, v, 0.125, 1)\noutput o\n";
    let p = parse_program("view_slices.eqf", src, &[]).unwrap();
    let plan = optimize(&p, &opts()).unwrap().plan;
    assert_eq!(plan.kernels.len(), 2, "{:?}", kernels(&plan));
    let att = &plan.kernels[1];
    assert_eq!(att.template, Template::Attention);
    let third = 2 * 100 * 256 * 2;
    assert_eq!(att.bytes_read, 2 * third + 2 * 4 * 100 * 64 * 2, "{:?}", kernels(&plan));
    let d = defines(&plan, att.id);
    assert!(d.contains("#define EQ_KP (p_r0 + 256LL)\n"), "{d}");
    let inputs = random_inputs(&p, 5);
    for (out, cmp) in check_plan(&p, &plan, &inputs).unwrap() {
        assert!(cmp.ok(), "output {out}: {cmp}");
    }
}
