//! Attention kernels writing through views (`benches/programs/gpt2_attention_grad_bf16.eqf`, the
//! attention half of a GPT-2 training step as the PyTorch backend's graphs have it): the forward
//! kernel stores its output heads-merged where the output projection reads it (the backward's
//! `delta` reads it back through a transpose), and the backward kernel stores dq, dk and dv as
//! the three column blocks of d(qkv) `[B, S, 3E]` through strides from an element offset, so no
//! transpose or concatenation is a copy kernel; every plan matches the CPU reference kernel by
//! kernel, and its kernels compile (where NVRTC is available).

mod common;

use eqfuse::{
    check_plan, codegen_plan, load_program, nvrtc_available, nvrtc_compile, optimize, random_inputs, DeviceProfile,
    FusionPlan, OptimizeOptions, Template, DEFAULT_ARCH,
};

fn opts() -> OptimizeOptions {
    OptimizeOptions::new(DeviceProfile::load("h100").unwrap())
}

fn shown(plan: &FusionPlan) -> Vec<(Template, Vec<String>, Vec<String>)> {
    plan.kernels
        .iter()
        .map(|k| (k.template, k.ops.clone(), k.writes.iter().map(|w| w.name.clone()).collect()))
        .collect()
}

/// A kernel that only moves elements: views, layout copies and concatenations.
fn copies(plan: &FusionPlan) -> Vec<usize> {
    let moves = |o: &String| ["transpose", "reshape", "concat", "slice"].contains(&o.as_str());
    plan.kernels.iter().filter(|k| k.ops.iter().all(moves)).map(|k| k.id).collect()
}

/// At GPT-2 small's sizes (8 x 1024 tokens, 12 heads of 64) the plan is the products (two
/// forward, four backward), the forward attention kernel writing the merged heads and the
/// log-sum-exp, `delta` (reading the output gradient's heads through a reshape and a transpose),
/// and one backward kernel writing d(qkv): nine kernels, none of them a copy, predicted under
/// 400 us (502 us when the transposes and the concatenation were copy kernels of their own and
/// the output gradient's heads were copied for `delta`).
#[test]
fn gpt2_attention_training_has_no_copy_kernels() {
    let p = load_program("benches/programs/gpt2_attention_grad_bf16.eqf", &[]).unwrap();
    let plan = optimize(&p, &opts()).unwrap().plan;
    assert!(copies(&plan).is_empty(), "{:?}", shown(&plan));
    let attention: Vec<_> = plan.kernels.iter().filter(|k| k.template == Template::Attention).collect();
    assert_eq!(attention.len(), 2, "{:?}", shown(&plan));
    // The forward writes [B, S, H, D] (the merged heads) beside the log-sum-exp.
    assert!(attention[0].writes.iter().any(|w| w.ty.shape == [8, 1024, 12, 64]), "{:?}", shown(&plan));
    // The backward writes d(qkv) and nothing else.
    let bwd = attention[1];
    assert_eq!(bwd.writes.len(), 1, "{:?}", shown(&plan));
    assert_eq!(bwd.writes[0].name, "dqkv");
    assert_eq!(bwd.writes[0].ty.shape, [8, 1024, 2304]);
    assert!(["attention_grad_q", "attention_grad_k", "attention_grad_v", "concat"]
        .iter()
        .all(|o| bwd.ops.iter().any(|x| x == o)));
    assert_eq!(plan.kernels.len(), 9, "{:?}", shown(&plan));
    assert!(plan.total.predicted_us < 400.0, "{} us", plan.total.predicted_us);
}

/// The small programs of `common::attention_write_programs`: each plan matches the CPU
/// reference kernel by kernel, has no copy kernel but (with the gradients as outputs too) the
/// concatenation, and its kernels generate and compile without warnings for sm_90 and sm_80,
/// the backward one writing dk and dv at d(qkv)'s column offsets with its row stride.
#[test]
fn attention_writes_through_views_match_the_reference_and_compile() {
    let nvrtc = nvrtc_available().is_ok();
    if !nvrtc {
        eprintln!("NVRTC is not available: the kernels are generated, not compiled");
    }
    for (seed, (name, p)) in common::attention_write_programs().into_iter().enumerate() {
        let plan = optimize(&p, &opts()).unwrap().plan;
        let inputs = random_inputs(&p, seed as u64 + 11);
        for (out, cmp) in check_plan(&p, &plan, &inputs).unwrap() {
            assert!(cmp.ok(), "{name}: output {out}: {cmp}");
        }
        let merged_outputs = name.ends_with("merged_outputs");
        let copy = copies(&plan);
        assert!(copy.len() <= usize::from(merged_outputs), "{name}: {:?}", shown(&plan));
        let e = p.input("w_proj").unwrap().ty.shape[0];
        let sources = codegen_plan(&plan).unwrap_or_else(|e| panic!("{name}: {e}"));
        let mut column_blocks = false;
        for s in sources.iter().filter(|s| s.cublaslt.is_none()) {
            let defines = s.source.split("// ---- kernels/").next().unwrap_or(&s.source).to_string();
            if defines.contains(&format!("#define EQ_DKP (p_w0 + {e}LL)")) {
                assert!(defines.contains(&format!("#define EQ_DVP (p_w0 + {}LL)", 2 * e)), "{name}:\n{defines}");
                assert!(defines.contains(&format!("#define EQ_DQ_SR {}LL", 3 * e)), "{name}:\n{defines}");
                column_blocks = true;
            }
            if nvrtc {
                for arch in [DEFAULT_ARCH, "sm_80"] {
                    let c = nvrtc_compile(&s.source, &s.file, arch, &[])
                        .unwrap_or_else(|e| panic!("{name} / {} ({arch}): {e}", s.name));
                    assert!(c.log.trim().is_empty(), "{name} / {} ({arch}): warnings\n{}", s.name, c.log);
                }
            }
        }
        assert_eq!(column_blocks, !merged_outputs, "{name}: {:?}", shown(&plan));
    }
}
