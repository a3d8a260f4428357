//! Budgets always hold (issue 18): `--time-limit` bounds the whole planning command, a plan cut
//! by it is valid, and the stop reason names the limit that stopped the search.
//!
//! Bounds on time are generous (a loaded 2-core machine, an unoptimised test build): they catch
//! a planner that ignores its deadline (minutes), not one that is a little slow.

use std::time::{Duration, Instant};

use eqfuse::{
    egraph_of, eval_plan_with, eval_with, load_program, local_selection, local_selection_by_egg, optimize,
    parse_program, random_inputs, saturate_program, skip_chain_eqf, Deadline, DeviceProfile, FusionPlan,
    OptimizeOptions, Precision, Program,
};

fn opts() -> OptimizeOptions {
    OptimizeOptions::new(DeviceProfile::load("h100").unwrap())
}

/// The plan computes the program: both evaluated in f64 without per-node rounding, so a wrong
/// plan differs and a plan that only rounds at other places does not (a chain of 2,000 f32
/// steps amplifies where rounding happens by far more than any fixed tolerance).
fn assert_valid(name: &str, program: &Program, plan: &FusionPlan) {
    let inputs = random_inputs(program, 7);
    let want = eval_with(program, &inputs, Precision::F64).unwrap();
    let got = eval_plan_with(plan, &inputs, Precision::F64).unwrap();
    for ((o, w), g) in program.outputs.iter().zip(&want).zip(&got) {
        let cmp = g.compare(w, 1e-9, 1e-9);
        assert!(cmp.ok(), "{name}: output {}: {cmp}", o.name);
    }
    assert!(plan.total.predicted_us <= plan.unfused.predicted_us * (1.0 + 1e-9), "{name}: slower than unfused");
}

/// A program of 2,000 chained bindings with skip connections (each value read twice) plans
/// within a small time limit, and the plan it returns computes the program.
///
/// Its functions are `tanh` and `sigmoid`, whose slopes vanish as the chain's values grow: a
/// rounding difference does not grow along the chain. With `sin` and `cos` among them (the
/// default functions) the chain is chaotic: a plan that reassociates sums (an inexact rule, as
/// a search given time finds: a release build does) differs from the program by the f64
/// rounding of one addition, 1e-16, amplified to 1e-2 after 800 steps (measured 2026-11-27,
/// strict plans exact), which no tolerance tells from a wrong plan.
#[test]
fn a_time_limit_bounds_planning_a_long_chain() {
    let program = parse_program("chain.eqf", &skip_chain_eqf(2000, 4, 8, &["tanh", "sigmoid"]), &[]).unwrap();
    let mut o = opts();
    o.time_limit = Duration::from_secs(2);
    let start = Instant::now();
    let plan = optimize(&program, &o).unwrap().plan;
    let took = start.elapsed();
    // 2 s, plus what follows the deadline (building the plan) in a debug build on a busy machine.
    assert!(took < Duration::from_secs(2 + 28), "planning took {took:?} with a time limit of 2 s");
    assert!(plan.search.time_limit_s == 2.0);
    eprintln!(
        "planned in {took:?}: {} kernels (unfused {}), cut: {:?}",
        plan.total.kernels, plan.unfused.kernels, plan.search.time_limit_cut
    );
    assert_valid("chain of 2000", &program, &plan);
}

/// A deadline that has already passed still gives a plan (at worst the unfused one), says what
/// it cut, and the plan computes the program.
#[test]
fn an_expired_deadline_gives_a_valid_plan() {
    let chain = skip_chain_eqf(60, 4, 8, &["exp", "tanh", "sigmoid"]);
    let mut programs = vec![("chain.eqf".to_string(), parse_program("chain.eqf", &chain, &[]).unwrap())];
    for name in ["layernorm", "cross_entropy", "softmax", "bias_gelu_dropout"] {
        let path = format!("examples/{name}.eqf");
        let full = load_program(&path, &[]).unwrap();
        let dims: Vec<(String, usize)> = full.dims.iter().map(|(d, _)| (d.clone(), 8)).collect();
        programs.push((path.clone(), load_program(&path, &dims).unwrap()));
    }
    for (name, program) in programs {
        let o = OptimizeOptions { deadline: Some(Deadline::after(Duration::ZERO)), ..opts() };
        let plan = optimize(&program, &o).unwrap().plan;
        assert!(!plan.search.time_limit_cut.is_empty(), "{name}: nothing reported cut");
        assert_valid(&name, &program, &plan);
    }
}

/// The stop reason names the limit that stopped saturation, and `node_limit` governs the
/// per-stage cap (it used to stay at 1,000 e-nodes of room whatever the limit).
#[test]
fn the_stop_reason_names_the_limit_and_follows_node_limit() {
    let program = load_program("examples/layernorm.eqf", &[]).unwrap();
    let at = |limit: usize| {
        let o = OptimizeOptions { node_limit: limit, time_limit: Duration::from_secs(600), ..opts() };
        optimize(&program, &o).unwrap().plan.search
    };
    let default = at(20_000);
    assert_eq!(default.stop_reason, "node-limit");
    assert!(default.stop_detail.starts_with("node-limit: stage `"), "{}", default.stop_detail);
    assert!(default.stop_detail.contains("per-stage cap"), "{}", default.stop_detail);
    assert!(default.stop_detail.contains("20000"), "{}", default.stop_detail);
    let larger = at(60_000);
    assert!(larger.enodes > default.enodes, "--node-limit 60000 grew no more than 20000: {}", larger.enodes);
    // (It may stop on another limit first, such as the iterations of a stage.)
    let named = larger.stop_detail.contains("60000") || larger.stop_detail.starts_with("iteration-limit: stage");
    assert!(named, "{}", larger.stop_detail);
    let tiny = at(100);
    assert_eq!(tiny.stop_reason, "node-limit");
    assert!(tiny.stop_detail.contains("node limit of 100"), "{}", tiny.stop_detail);
    assert!(tiny.enodes <= 200, "{}", tiny.enodes);
}

/// The local e-node choice is egg's Extractor's, ties included, on every example.
#[test]
fn local_selection_is_eggs() {
    let profile = DeviceProfile::load("h100").unwrap();
    let mut paths: Vec<_> = std::fs::read_dir("examples")
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "eqf"))
        .collect();
    paths.sort();
    let mut programs: Vec<(String, Program)> =
        paths.iter().map(|p| (p.display().to_string(), load_program(p.to_str().unwrap(), &[]).unwrap())).collect();
    programs.push(("chain".into(), parse_program("chain.eqf", &skip_chain_eqf(40, 4, 8, &[]), &[]).unwrap()));
    for (name, program) in programs {
        let program = if eqfuse::has_grads(&program) { eqfuse::expand_grads(&program).unwrap() } else { program };
        let o = OptimizeOptions { time_limit: Duration::from_secs(600), ..opts() };
        let sat = saturate_program(&program, &o).unwrap();
        assert_eq!(local_selection(&sat.egraph, &profile), local_selection_by_egg(&sat.egraph, &profile), "{name}");
        let (egraph, _, _) = egraph_of(&program);
        assert_eq!(local_selection(&egraph, &profile), local_selection_by_egg(&egraph, &profile), "{name}");
    }
}
