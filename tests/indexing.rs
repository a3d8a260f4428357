//! The indexing operators (issue 20: `slice`, `concat`, `gather`, `scatter_add`) through the
//! planner: a program using all of them and their gradients plans, fused and unfused, into
//! kernels whose CPU evaluation matches the reference.

use eqfuse::{check_plan, load_program, optimize, random_inputs, DeviceProfile, OptimizeOptions};

#[test]
fn indexing_programs_plan_and_compute_the_program() {
    let small = [("B", 2), ("S", 6), ("H", 2), ("D", 8), ("V", 11), ("P", 9), ("E", 8)];
    for path in ["tests/cases/ok/indexing.eqf", "examples/rope.eqf", "examples/embedding_layernorm.eqf"] {
        let declared = load_program(path, &[]).unwrap().dims;
        let dims: Vec<(String, usize)> = small
            .iter()
            .filter(|(n, _)| declared.iter().any(|(d, _)| d == n))
            .map(|(n, v)| (n.to_string(), *v))
            .collect();
        let program = load_program(path, &dims).unwrap_or_else(|e| panic!("{path}: {e}"));
        for fusion in [true, false] {
            let mut o = OptimizeOptions::new(DeviceProfile::load("h100").unwrap());
            o.fusion = fusion;
            let plan = optimize(&program, &o).unwrap_or_else(|e| panic!("{path}: {e}")).plan;
            for seed in [1, 2] {
                for (out, cmp) in check_plan(&program, &plan, &random_inputs(&program, seed)).unwrap() {
                    assert!(cmp.ok(), "{path} (fusion {fusion}) output {out}: {cmp}");
                }
            }
        }
    }
}
