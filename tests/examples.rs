//! Every example program: planned at its declared sizes (plan snapshots and the JSON contract),
//! and planned at small sizes and checked against the CPU reference.

use std::path::{Path, PathBuf};

use eqfuse::{
    check_plan, eval, eval_plan, load_program, optimize, plan_json, random_inputs, DeviceProfile, OptimizeOptions,
};

fn examples() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir("examples")
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "eqf"))
        .collect();
    v.sort();
    v
}

fn stem(p: &Path) -> String {
    p.file_stem().unwrap().to_string_lossy().into_owned()
}

/// Small sizes for the reference check; dims not listed become 6.
fn small_dims(name: &str) -> Vec<(String, usize)> {
    let fixed: &[(&str, usize)] = match name {
        "transformer_block" | "transformer_block_grad" => {
            &[("B", 2), ("S", 8), ("E", 12), ("H", 3), ("Dh", 4), ("F", 16)]
        }
        // A head size the flash-style backward runs (a multiple of 8), rows that fill no tile.
        "attention_grad" | "causal_attention_training" => &[("B", 1), ("H", 2), ("S", 24), ("D", 16)],
        _ => &[],
    };
    fixed.iter().map(|(n, v)| (n.to_string(), *v)).collect()
}

fn opts() -> OptimizeOptions {
    OptimizeOptions::new(DeviceProfile::load("h100").unwrap())
}

/// The plan JSON without the fields that measure wall time.
fn stable_json(plan: &eqfuse::FusionPlan) -> serde_json::Value {
    let mut v = plan_json(plan);
    v["search"]["saturate_ms"] = 0.into();
    v["search"]["extract_ms"] = 0.into();
    v
}

#[test]
fn every_example_plans_with_the_contract_fields() {
    for path in examples() {
        let name = stem(&path);
        let program = load_program(path.to_str().unwrap(), &[]).unwrap_or_else(|e| panic!("{name}: {e}"));
        let plan = optimize(&program, &opts()).unwrap().plan;
        let v = stable_json(&plan);
        for key in ["schema", "program", "device", "kernels", "total", "unfused", "search"] {
            assert!(v.get(key).is_some(), "{name}: no `{key}`");
        }
        for key in ["iterations", "enodes", "eclasses", "stop_reason", "saturate_ms", "extract_ms", "extractor", "gap"]
        {
            assert!(v["search"].get(key).is_some(), "{name}: no search.{key}");
        }
        for k in v["kernels"].as_array().unwrap() {
            for key in
                ["id", "template", "ops", "reads", "writes", "bytes_read", "bytes_written", "flops", "predicted_us"]
            {
                assert!(k.get(key).is_some(), "{name}: kernel without `{key}`");
            }
        }
        assert!(plan.total.bytes <= plan.unfused.bytes, "{name}: fused moves more than unfused");
        assert!(plan.total.predicted_us <= plan.unfused.predicted_us + 1e-9, "{name}: fused slower than unfused");
        insta::assert_json_snapshot!(format!("plan_{name}"), v);
    }
}

#[test]
fn every_example_plan_computes_the_program_at_small_sizes() {
    for path in examples() {
        let name = stem(&path);
        let full = load_program(path.to_str().unwrap(), &[]).unwrap();
        let mut dims = small_dims(&name);
        for (d, _) in &full.dims {
            if !dims.iter().any(|(n, _)| n == d) {
                dims.push((d.clone(), 6));
            }
        }
        let program = load_program(path.to_str().unwrap(), &dims).unwrap_or_else(|e| panic!("{name}: {e}"));
        for fusion in [true, false] {
            let mut o = opts();
            o.fusion = fusion;
            let plan = optimize(&program, &o).unwrap().plan;
            let inputs = random_inputs(&program, 3);
            if name.ends_with("_grad") {
                check_gradients(&name, fusion, &program, &plan, &inputs);
                continue;
            }
            for (out, cmp) in check_plan(&program, &plan, &inputs).unwrap() {
                assert!(cmp.ok(), "{name} (fusion {fusion}) output {out}: {cmp}");
            }
        }
    }
}

/// A backward graph is a long chain of f32 roundings with cancellations (a layernorm's backward
/// subtracts row means), and a plan may compute a composite where the program spells it out
/// (attention, softmax), which rounds once instead of at every step. So the outputs of the
/// gradient examples are compared within 1e-4 of each output's largest magnitude (without
/// rounding to f32, plan and program agree to 1e-12).
fn check_gradients(
    name: &str,
    fusion: bool,
    program: &eqfuse::Program,
    plan: &eqfuse::FusionPlan,
    inputs: &std::collections::HashMap<String, eqfuse::Tensor>,
) {
    let got = eval_plan(plan, inputs).unwrap();
    let want = eval(program, inputs).unwrap();
    for ((o, g), w) in program.outputs.iter().zip(&got).zip(&want) {
        let scale = w.data.iter().fold(1e-30f64, |m, v| m.max(v.abs()));
        let cmp = g.compare(w, 1e-5, 1e-4 * scale);
        assert!(cmp.ok(), "{name} (fusion {fusion}) output {}: {cmp}", o.name);
    }
}

#[test]
fn floors_of_the_simple_examples() {
    // (x+y)*z: one kernel, 4N elements moved against 6N unfused.
    let p = load_program("examples/add_mul.eqf", &[]).unwrap();
    let n = p.inputs[0].ty.numel() as u64;
    let plan = optimize(&p, &opts()).unwrap().plan;
    assert_eq!((plan.total.kernels, plan.total.bytes, plan.unfused.bytes), (1, 16 * n, 24 * n));
    // One kernel each, bytes within 1% of the floor (inputs read once, outputs written once).
    for name in ["softplus", "bias_gelu_dropout", "layernorm", "softmax", "rmsnorm"] {
        let p = load_program(&format!("examples/{name}.eqf"), &[]).unwrap();
        let plan = optimize(&p, &opts()).unwrap().plan;
        let floor: u64 = p.inputs.iter().map(|i| i.ty.bytes()).sum::<u64>()
            + p.outputs.iter().map(|o| p.ty(o.id).unwrap().bytes()).sum::<u64>();
        assert_eq!(plan.total.kernels, 1, "{name}");
        assert!(plan.total.bytes as f64 <= floor as f64 * 1.01, "{name}: {} against floor {floor}", plan.total.bytes);
    }
}

#[test]
fn identical_input_gives_byte_identical_plans() {
    for name in ["transformer_block", "composites", "layernorm"] {
        let p = load_program(&format!("examples/{name}.eqf"), &[]).unwrap();
        let a = serde_json::to_string(&stable_json(&optimize(&p, &opts()).unwrap().plan)).unwrap();
        let b = serde_json::to_string(&stable_json(&optimize(&p, &opts()).unwrap().plan)).unwrap();
        assert_eq!(a, b, "{name}");
    }
}

#[test]
fn the_generated_gpt2_training_step_plans_and_computes_the_program() {
    // The planning bench's GPT-2 training step (benches/planning.rs) at small widths: two blocks,
    // the loss and every weight's gradient, fused and unfused, checked against the reference.
    let dims: Vec<(String, usize)> = [("V", 20), ("P", 12), ("E", 12), ("H", 3), ("Dh", 4), ("F", 16)]
        .iter()
        .map(|(n, v)| (n.to_string(), *v))
        .collect();
    let program = eqfuse::parse_program("gpt2.eqf", &eqfuse::gpt2_train_eqf(2, 2, 8), &dims).unwrap();
    assert_eq!(program.outputs.len(), 1 + 2 + 2 * 16 + 2);
    for fusion in [true, false] {
        let mut o = opts();
        o.fusion = fusion;
        let plan = optimize(&program, &o).unwrap().plan;
        assert!(plan.search.time_limit_cut.is_empty(), "{:?}", plan.search.time_limit_cut);
        if fusion {
            assert!(plan.total.kernels < plan.unfused.kernels, "nothing fused");
        }
        // In f64 without rounding at each node: the key biases' gradients are exactly zero (a
        // softmax row does not change when every score moves by the same amount), so rounding
        // noise would be all there is to compare at the program's own precision.
        let inputs = random_inputs(&program, 5);
        let got = eqfuse::eval_plan_with(&plan, &inputs, eqfuse::Precision::F64).unwrap();
        let want = eqfuse::eval_with(&program, &inputs, eqfuse::Precision::F64).unwrap();
        for ((o, g), w) in program.outputs.iter().zip(&got).zip(&want) {
            let cmp = g.compare(w, 1e-9, 1e-9);
            assert!(cmp.ok(), "fusion {fusion}: output {}: {cmp}", o.name);
        }
    }
}

#[test]
fn generated_transformer_stacks_plan_and_compute_the_program() {
    // The scaling bench's programs (benches/planning.rs), at small widths: two blocks, forward and
    // forward+backward, fused and unfused, checked against the reference like the examples.
    let dims: Vec<(String, usize)> =
        [("E", 12), ("H", 3), ("Dh", 4), ("F", 16)].iter().map(|(n, v)| (n.to_string(), *v)).collect();
    for backward in [false, true] {
        let text = eqfuse::transformer_stack_eqf(2, 2, 8, backward);
        let program = eqfuse::parse_program("stack.eqf", &text, &dims).unwrap();
        assert_eq!(program.outputs.len(), if backward { 2 + 2 * 12 } else { 1 });
        for fusion in [true, false] {
            let mut o = opts();
            o.fusion = fusion;
            let plan = optimize(&program, &o).unwrap().plan;
            if fusion {
                assert!(plan.total.kernels < plan.unfused.kernels, "backward {backward}: nothing fused");
            }
            check_gradients(
                &format!("stack (backward {backward})"),
                fusion,
                &program,
                &plan,
                &random_inputs(&program, 5),
            );
        }
    }
}
