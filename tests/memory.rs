//! Device memory of plans: the peak of live tensors, `--memory-budget` (recompute instead of
//! save, or no plan fits), and saved bool masks stored 1 bit per element.

use std::process::Command;

use eqfuse::{
    load_program, optimize, plan_json, DType, DeviceProfile, FusionPlan, OptimizeOptions, Program, TensorType,
};

fn f32(shape: &[usize]) -> TensorType {
    TensorType::new(DType::F32, shape.to_vec())
}

fn opts() -> OptimizeOptions {
    OptimizeOptions::new(DeviceProfile::load("h100").unwrap())
}

/// The peak recomputed by hand from the kernels: inputs live throughout, outputs from their
/// writer on, intermediates from their writer to their last reader.
fn peak_by_hand(plan: &FusionPlan) -> u64 {
    let n = plan.kernels.len();
    let outputs: Vec<&str> = plan.outputs.iter().map(|(_, t)| t.as_str()).collect();
    let inputs: u64 = plan.inputs.iter().map(|i| i.ty.bytes()).sum();
    let mut peak = inputs;
    for k in 0..n {
        let mut live = inputs;
        for (w, kw) in plan.kernels.iter().enumerate() {
            for t in &kw.writes {
                let last = if outputs.contains(&t.name.as_str()) {
                    n - 1
                } else {
                    (w..n).filter(|&r| plan.kernels[r].reads.iter().any(|x| x.name == t.name)).max().unwrap_or(w)
                };
                let bytes = if plan.is_packed(&t.name) { (t.ty.numel() as u64).div_ceil(32) * 4 } else { t.ty.bytes() };
                if w <= k && k <= last {
                    live += bytes;
                }
            }
        }
        peak = peak.max(live);
    }
    peak
}

/// A heavy elementwise value read by a row and a column reduction (tests/planner.rs): large, it
/// is written once and read twice, which is fastest but keeps it in memory.
fn two_reductions(rows: usize, cols: usize) -> Program {
    let mut t = "x".to_string();
    for _ in 0..24 {
        t = format!("(sin (exp (tanh {t})))");
    }
    Program::from_sexprs(
        "two_reductions",
        &[("x", f32(&[rows, cols]))],
        &[("r", &format!("(sum {t} -1)")), ("c", &format!("(sum {t} 0)"))],
    )
    .unwrap()
}

#[test]
fn the_plan_reports_its_peak_by_liveness() {
    for path in ["examples/layernorm_grad.eqf", "examples/transformer_block_grad.eqf", "examples/mlp_relu_grad.eqf"] {
        let p = load_program(path, &[]).unwrap();
        let plan = optimize(&p, &opts()).unwrap().plan;
        let m = &plan.memory;
        assert_eq!(m.peak_bytes, peak_by_hand(&plan), "{path}");
        assert_eq!(m.inputs_bytes, p.inputs.iter().map(|i| i.ty.bytes()).sum::<u64>(), "{path}");
        assert!(m.peak_bytes >= m.inputs_bytes + m.outputs_bytes.min(1), "{path}");
        let j = plan_json(&plan);
        assert_eq!(j["memory"]["peak_bytes"], m.peak_bytes, "{path}");
        assert_eq!(j["memory"]["saved_bytes"], m.saved.iter().map(|s| s.bytes).sum::<u64>(), "{path}");
        assert!(j["memory"]["budget_bytes"].is_null());
    }
    // Layernorm forward and backward keeps only the row statistics between its two kernels.
    let plan = optimize(&load_program("examples/layernorm_grad.eqf", &[]).unwrap(), &opts()).unwrap().plan;
    assert!(plan.memory.saved.iter().all(|s| s.ty.numel() == 16384), "{:?}", plan.memory.saved);
}

#[test]
fn a_memory_budget_makes_the_planner_recompute_instead_of_save() {
    let (rows, cols) = (8192, 8192);
    let p = two_reductions(rows, cols);
    let free = optimize(&p, &opts()).unwrap().plan;
    let x = (rows * cols * 4) as u64;
    assert_eq!(free.total.kernels, 3, "{:#?}", free.kernels);
    assert!(free.memory.peak_bytes >= 2 * x, "the heavy value is saved: {:?}", free.memory);
    // A budget with room for x and the two results only: both reductions recompute the value.
    let budget = x + 64 * 1024;
    let mut o = opts();
    o.memory_budget = Some(budget);
    let fit = optimize(&p, &o).unwrap().plan;
    assert!(fit.memory.peak_bytes <= budget, "{:?}", fit.memory);
    assert_eq!(fit.memory.peak_bytes, peak_by_hand(&fit));
    assert_eq!(fit.memory.budget_bytes, Some(budget));
    assert!(fit.memory.saved.is_empty(), "{:?}", fit.memory.saved);
    assert!(fit.total.predicted_us > free.total.predicted_us, "recomputing costs time");
    // A budget the plan already meets changes nothing.
    o.memory_budget = Some(free.memory.peak_bytes);
    assert_eq!(optimize(&p, &o).unwrap().plan.kernels, free.kernels);
    // The budgeted plan still computes the program (at a small size, same budget rule).
    let small = two_reductions(64, 48);
    let mut o = opts();
    o.memory_budget = Some(64 * 48 * 4 + 1024);
    let plan = optimize(&small, &o).unwrap().plan;
    let inputs = eqfuse::random_inputs(&small, 3);
    for (name, cmp) in eqfuse::check_plan(&small, &plan, &inputs).unwrap() {
        assert!(cmp.ok(), "{name}: {cmp}");
    }
}

#[test]
fn no_plan_fits_a_budget_below_the_inputs_and_outputs() {
    let p = two_reductions(512, 256);
    let mut o = opts();
    o.memory_budget = Some(1000);
    let err = optimize(&p, &o).unwrap_err().to_string();
    assert!(err.contains("no plan") && err.contains("smallest peak found is"), "{err}");
    let io = 512 * 256 * 4 + (512 + 256) * 4;
    assert!(err.contains(&format!("alone take {io} bytes")), "{err}");
}

#[test]
fn the_cli_takes_a_budget_and_exits_1_when_none_fits() {
    let bin = env!("CARGO_BIN_EXE_eqfuse");
    let run = |budget: &str| {
        Command::new(bin)
            .args(["optimize", "examples/layernorm_grad.eqf", "--format", "json", "--memory-budget", budget])
            .output()
            .unwrap()
    };
    let ok = run("2GiB");
    assert!(ok.status.success(), "{}", String::from_utf8_lossy(&ok.stderr));
    let j: serde_json::Value = serde_json::from_slice(&ok.stdout).unwrap();
    assert_eq!(j["memory"]["budget_bytes"], 2u64 << 30);
    assert!(j["memory"]["peak_bytes"].as_u64().unwrap() <= 2 << 30);
    let none = run("100MB");
    assert_eq!(none.status.code(), Some(1));
    let msg = String::from_utf8_lossy(&none.stderr);
    assert!(msg.contains("no plan") && msg.contains("fits the memory budget of 100000000 bytes"), "{msg}");
    let bad = run("lots");
    assert_eq!(bad.status.code(), Some(2), "a bad option value is a usage error");
    assert!(String::from_utf8_lossy(&bad.stderr).contains("--memory-budget"));
}

/// In the ReLU MLP without dropout the backward needs the activation itself (the second weight's
/// gradient reads it), so no mask is packed (`tests/masks.rs` has the MLP where one is): the plan
/// codegens, and computes the program.
#[test]
fn the_relu_mlp_without_dropout_saves_no_mask() {
    let p = load_program("examples/mlp_relu_grad.eqf", &[]).unwrap();
    let plan = optimize(&p, &opts()).unwrap().plan;
    assert!(plan.memory.saved.iter().all(|s| !s.packed), "{:?}", plan.memory.saved);
    assert_eq!(eqfuse::codegen_plan(&plan).unwrap().len(), plan.kernels.len());
    let j = plan_json(&plan);
    assert!(j["memory"]["saved"].as_array().unwrap().iter().all(|s| s["packed"] == false));
    let small =
        load_program("examples/mlp_relu_grad.eqf", &[("B".into(), 4), ("D".into(), 5), ("H".into(), 40)]).unwrap();
    let plan = optimize(&small, &opts()).unwrap().plan;
    let inputs = eqfuse::random_inputs(&small, 11);
    for (name, cmp) in eqfuse::check_plan(&small, &plan, &inputs).unwrap() {
        assert!(cmp.ok(), "{name}: {cmp}");
    }
}

/// A mask saved between a row kernel and a column kernel, both generated by codegen.
const MASK_BETWEEN_GENERATED_KERNELS: &str = "dim R = 4096\ndim C = 1024\ninput x: f32[R, C]\ninput g: f32[C]\n\
    input b: f32[C]\ninput dy: f32[R, C]\nm = layernorm(x, g, b, 1e-5) > 0\ngm = where(m, dy, 0)\n\
    dg = sum(gm, 0)\ndr = sum(gm * x, -1)\noutput dg, dr\n";

#[test]
fn masks_stay_unpacked_where_codegen_runs_the_kernels_and_codegen_refuses_packed_ones() {
    let p = eqfuse::parse_program("mask.eqf", MASK_BETWEEN_GENERATED_KERNELS, &[]).unwrap();
    let plan = optimize(&p, &opts()).unwrap().plan;
    // The row kernel saves the mask for the column kernel: one byte per element, since generated
    // row kernels do not store 1-bit masks (column kernels load them).
    let m = plan.memory.saved.iter().find(|s| s.ty.dtype == DType::Bool).expect("a saved mask");
    assert!(!m.packed);
    assert_eq!(m.bytes, 4096 * 1024);
    assert!(eqfuse::codegen_plan(&plan).is_ok());
    // The same plan with the mask packed: codegen refuses it, naming the kernel and the tensor.
    let mut packed = plan.clone();
    packed.memory.saved.iter_mut().filter(|s| s.name == m.name).for_each(|s| s.packed = true);
    let err = eqfuse::codegen_plan(&packed).unwrap_err().to_string();
    assert!(err.contains(&format!("`{}` is a 1-bit mask", m.name)) && err.contains("kernel 0"), "{err}");
}
