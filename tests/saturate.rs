//! Staged saturation of the default rules on decomposed programs: the composite ops appear in
//! the output's e-class within the default budgets, and budgets end the search as a result.

use std::time::{Duration, Instant};

use egg::{Id, Language, RecExpr};

use eqfuse::{default_rules, saturate, Budgets, DType, Program, Saturation, StopReason, TensorLang, TensorType};

/// A program with the given inputs and one output, the s-expression `expr`.
fn program(inputs: &[(&str, DType, &[usize])], expr: &str) -> Program {
    let mut p = Program::new("test");
    for (name, dtype, shape) in inputs {
        p.add_input(name, TensorType::new(*dtype, shape.to_vec())).unwrap();
    }
    let e: RecExpr<TensorLang> = expr.parse().unwrap();
    let mut ids: Vec<Id> = vec![];
    for node in e.as_ref() {
        let id = p.add(node.clone().map_children(|c| ids[usize::from(c)])).unwrap();
        ids.push(id);
    }
    p.add_output("y", *ids.last().unwrap()).unwrap();
    p
}

fn run(p: &Program) -> Saturation {
    let start = Instant::now();
    let sat = saturate(p, &default_rules().unwrap(), &Budgets::default()).unwrap();
    for s in &sat.stages {
        eprintln!(
            "{}: {} iterations, {}, {} nodes, {} classes, {:.0} ms",
            s.ruleset, s.iterations, s.stop_reason, s.enodes, s.eclasses, s.millis
        );
        eprintln!("  fired {:?}", s.fired);
    }
    eprintln!("total {:?}", start.elapsed());
    sat
}

/// Whether the output's class holds a node with this head.
fn root_has(sat: &Saturation, head: &str) -> bool {
    sat.egraph[sat.roots[0]].nodes.iter().any(|n| n.to_string() == head)
}

const F32: DType = DType::F32;

#[test]
fn layernorm_is_recognised() {
    let p = program(
        &[("x", F32, &[64, 128]), ("gamma", F32, &[128]), ("beta", F32, &[128])],
        "(+ (* (* (- x (mean x -1)) (rsqrt (+ (mean (* (- x (mean x -1)) (- x (mean x -1))) -1) 0.00001))) gamma) beta)",
    );
    let sat = run(&p);
    assert!(root_has(&sat, "layernorm"));
}

#[test]
fn softmax_is_recognised() {
    let p = program(&[("x", F32, &[64, 128])], "(/ (exp (- x (amax x -1))) (sum (exp (- x (amax x -1))) -1))");
    assert!(root_has(&run(&p), "softmax"));
}

#[test]
fn rmsnorm_in_bf16_is_recognised() {
    let p = program(
        &[("x", DType::Bf16, &[64, 128]), ("g", DType::Bf16, &[128])],
        "(* (* x (rsqrt (+ (mean (square x) -1) 0.000001))) g)",
    );
    assert!(root_has(&run(&p), "rmsnorm"));
}

#[test]
fn gelu_and_bias_are_recognised() {
    let p =
        program(&[("x", F32, &[64, 128]), ("b", F32, &[128])], "(* (* 0.5 (+ x b)) (+ 1 (erf (/ (+ x b) (sqrt 2)))))");
    assert!(root_has(&run(&p), "gelu"));
}

#[test]
fn attention_is_recognised() {
    let p = program(
        &[("q", F32, &[2, 4, 16, 8]), ("k", F32, &[2, 4, 16, 8]), ("v", F32, &[2, 4, 16, 8])],
        "(@ (softmax (* (@ q (transpose k -1 -2)) 0.35355339059327373) -1) v)",
    );
    assert!(root_has(&run(&p), "attention"));
}

#[test]
fn decomposed_attention_is_recognised() {
    let p = program(
        &[("q", F32, &[2, 4, 16, 8]), ("k", F32, &[2, 4, 16, 8]), ("v", F32, &[2, 4, 16, 8])],
        "(@ (/ (exp (- (* (@ q (transpose k -1 -2)) 0.125) (amax (* (@ q (transpose k -1 -2)) 0.125) -1))) \
         (sum (exp (- (* (@ q (transpose k -1 -2)) 0.125) (amax (* (@ q (transpose k -1 -2)) 0.125) -1))) -1)) v)",
    );
    assert!(root_has(&run(&p), "attention"));
}

#[test]
fn cross_entropy_is_recognised() {
    let p = program(
        &[("x", F32, &[32, 100]), ("t", DType::I32, &[32])],
        "(mean (neg (sum (* (onehot t 100) (- (- x (amax x -1)) (log (sum (exp (- x (amax x -1))) -1)))) -1)) 0)",
    );
    let sat = run(&p);
    let reshaped = sat.egraph[sat.roots[0]].nodes.iter().any(|n| {
        n.to_string() == "reshape" && sat.egraph[n.children()[0]].nodes.iter().any(|m| m.to_string() == "cross_entropy")
    });
    assert!(reshaped);
}

#[test]
fn budgets_end_the_search_as_a_result() {
    let p = program(
        &[("a", F32, &[4]), ("b", F32, &[4]), ("c", F32, &[4]), ("d", F32, &[4])],
        "(* (+ (+ a b) (+ c d)) (+ (* a b) (* c d)))",
    );
    let budgets = Budgets::default().with_node_limit(500).with_time_limit(Duration::from_secs(2));
    let sat = saturate(&p, &default_rules().unwrap(), &budgets).unwrap();
    assert_ne!(sat.stop_reason, StopReason::Saturated);
    assert!(sat.stages.iter().all(|s| s.enodes < 2000));
}

#[test]
fn a_block_with_several_patterns_saturates_in_budget() {
    // layernorm -> dense + bias -> gelu (erf) -> dense + bias -> residual -> softmax
    let ln = "(+ (* (* (- x (mean x -1)) (rsqrt (+ (mean (* (- x (mean x -1)) (- x (mean x -1))) -1) 0.00001))) g) b)";
    let h = format!("(+ (@ {ln} w1) b1)");
    let act = format!("(* (* 0.5 {h}) (+ 1 (erf (* {h} 0.7071067811865476))))");
    let y = format!("(+ (+ (@ {act} w2) b2) x)");
    let sm = format!("(/ (exp (- {y} (amax {y} -1))) (sum (exp (- {y} (amax {y} -1))) -1))");
    let p = program(
        &[
            ("x", F32, &[128, 64]),
            ("g", F32, &[64]),
            ("b", F32, &[64]),
            ("w1", F32, &[64, 256]),
            ("b1", F32, &[256]),
            ("w2", F32, &[256, 64]),
            ("b2", F32, &[64]),
        ],
        &sm,
    );
    let sat = run(&p);
    assert!(root_has(&sat, "softmax"));
    let heads: std::collections::BTreeSet<String> =
        sat.egraph.classes().flat_map(|c| c.nodes.iter().map(|n| n.to_string())).collect();
    assert!(heads.contains("layernorm") && heads.contains("gelu"), "{heads:?}");
}
