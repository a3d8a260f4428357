//! The ILP lower bound: checked against brute-force enumeration on tiny e-graphs, and never
//! above a plan the planner forms.

use std::collections::BTreeMap;
use std::time::Duration;

use egg::{Id, Language, RecExpr};
use eqfuse::{
    egraph_of, optimize, relaxed_cost, solve_ilp, DType, DeviceProfile, OptimizeOptions, Program, Selection,
    TensorGraph, TensorLang, TensorType,
};

fn f32(shape: &[usize]) -> TensorType {
    TensorType::new(DType::F32, shape.to_vec())
}

/// Adds `alt` (an s-expression over the program's inputs) to the class of the first output.
fn add_alternative(g: &mut TensorGraph, root: Id, alt: &str) {
    let e: RecExpr<TensorLang> = alt.parse().unwrap();
    let id = g.add_expr(&e);
    g.union(root, id);
    g.rebuild();
}

/// Every acyclic choice of e-nodes reachable from the roots.
fn all_selections(g: &TensorGraph, roots: &[Id]) -> Vec<Selection> {
    let classes: Vec<Id> = g.classes().map(|c| c.id).collect();
    let mut out = vec![Selection::new()];
    for &c in &classes {
        let mut next = Vec::new();
        for sel in &out {
            for n in &g[c].nodes {
                let mut s = sel.clone();
                s.insert(c, n.clone());
                next.push(s);
            }
        }
        out = next;
    }
    out.into_iter().filter(|s| acyclic(g, s, roots)).collect()
}

fn acyclic(g: &TensorGraph, s: &Selection, roots: &[Id]) -> bool {
    fn visit(g: &TensorGraph, s: &Selection, c: Id, state: &mut BTreeMap<Id, u8>) -> bool {
        match state.get(&c) {
            Some(1) => return false,
            Some(2) => return true,
            _ => {}
        }
        state.insert(c, 1);
        let ok = s[&c].children().iter().all(|&ch| visit(g, s, g.find(ch), state));
        state.insert(c, 2);
        ok
    }
    let mut state = BTreeMap::new();
    roots.iter().all(|&r| visit(g, s, g.find(r), &mut state))
}

fn typed(g: &TensorGraph, s: &Selection, roots: &[Id]) -> bool {
    let mut stack: Vec<Id> = roots.to_vec();
    let mut seen = std::collections::BTreeSet::new();
    while let Some(c) = stack.pop() {
        if !seen.insert(c) {
            continue;
        }
        let n = &s[&c];
        if g.analysis.node_fact(n, |x| g[x].data.fact.clone()).is_none() {
            return false;
        }
        stack.extend(n.children().iter().map(|&x| g.find(x)));
    }
    true
}

fn check_against_brute_force(program: &Program, alts: &[&str]) {
    let profile = DeviceProfile::load("h100").unwrap();
    let (mut g, roots, _) = egraph_of(program);
    for alt in alts {
        add_alternative(&mut g, roots[0].1, alt);
    }
    let roots: Vec<Id> = roots.iter().map(|(_, r)| g.find(*r)).collect();
    let brute = all_selections(&g, &roots)
        .iter()
        .filter(|s| typed(&g, s, &roots))
        .map(|s| relaxed_cost(&g, s, &roots, &profile))
        .fold(f64::INFINITY, f64::min);
    let ilp = solve_ilp(&g, &roots, &profile, Duration::from_secs(10)).unwrap();
    assert!(ilp.proven_optimal);
    assert!((ilp.lower_bound_us - brute).abs() <= 1e-6 * brute.max(1.0), "ilp {} brute {brute}", ilp.lower_bound_us);
    let sel = ilp.selection.unwrap();
    let chosen = relaxed_cost(&g, &sel, &roots, &profile);
    assert!((chosen - brute).abs() <= 1e-6 * brute.max(1.0));
}

#[test]
fn ilp_matches_brute_force_on_algebraic_alternatives() {
    let n = 1 << 16;
    let p = Program::from_sexprs("t", &[("x", f32(&[n])), ("y", f32(&[n]))], &[("o", "(* (+ x y) (+ x y))")]).unwrap();
    // The square of a sum, or its expansion that reads the same inputs with more flops.
    check_against_brute_force(&p, &["(square (+ x y))", "(+ (* x x) (+ (* 2 (* x y)) (* y y)))"]);
}

#[test]
fn ilp_matches_brute_force_when_an_alternative_drops_an_input() {
    let n = 1 << 12;
    let p = Program::from_sexprs("t", &[("x", f32(&[n])), ("y", f32(&[n]))], &[("o", "(+ (* y 0) x)")]).unwrap();
    check_against_brute_force(&p, &["x"]);
}

#[test]
fn ilp_matches_brute_force_with_products() {
    let p = Program::from_sexprs(
        "t",
        &[("a", f32(&[64, 32])), ("b", f32(&[32, 48])), ("c", f32(&[48, 16]))],
        &[("o", "(@ (@ a b) c)")],
    )
    .unwrap();
    // Reassociation changes both flops and the product operand that must be in memory.
    check_against_brute_force(&p, &["(@ a (@ b c))"]);
}

#[test]
fn the_bound_never_exceeds_the_greedy_plan() {
    let progs = [
        ("(* (+ x y) z)", vec![("x", f32(&[1 << 20])), ("y", f32(&[1 << 20])), ("z", f32(&[1 << 20]))]),
        ("(softmax x -1)", vec![("x", f32(&[512, 1000]))]),
        ("(relu (@ x w))", vec![("x", f32(&[128, 256])), ("w", f32(&[256, 64]))]),
        // A product reads a weight through a transpose, which no plan writes: the bound once
        // charged the view a write and a read, and stood 55% above the plan (with a gap of 0).
        ("(@ x (transpose w 0 1))", vec![("x", f32(&[64, 1024])), ("w", f32(&[4096, 1024]))]),
        ("(attention (reshape q [1,1,1]) (reshape q [1,1,1]) (reshape q [1,1,1]) 0.125 0)", vec![("q", f32(&[]))]),
    ];
    for (expr, inputs) in progs {
        let p =
            Program::from_sexprs("t", &inputs.iter().map(|(n, t)| (*n, t.clone())).collect::<Vec<_>>(), &[("o", expr)])
                .unwrap();
        let mut opts = OptimizeOptions::new(DeviceProfile::load("h100").unwrap());
        opts.extractor = "ilp".into();
        let plan = optimize(&p, &opts).unwrap().plan;
        let gap = plan.search.gap.expect("the ILP ran");
        assert!((0.0..1.0).contains(&gap), "{expr}: gap {gap}");
        let bound = plan.search.lower_bound_us.expect("the ILP ran");
        assert!(bound <= plan.total.predicted_us + 1e-9, "{expr}: bound {bound} above {}", plan.total.predicted_us);
        let greedy = optimize(&p, &OptimizeOptions::new(DeviceProfile::load("h100").unwrap())).unwrap().plan;
        assert!(plan.total.predicted_us <= greedy.total.predicted_us + 1e-9);
    }
}
