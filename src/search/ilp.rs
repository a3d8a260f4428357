//! The exact extractor: an integer program over e-node choices that gives a proven lower bound
//! on any plan's predicted time, and a form to try beside the greedy one.
//!
//! The program relaxes fusion legality: it assumes every value can stay on chip except what no
//! plan can avoid moving. For a choice of e-nodes (acyclic, every needed class covered), any
//! plan over that choice takes at least
//!   launch × max(1, anchors) + max(bytes / (bandwidth × best efficiency), flops / best rate)
//! where bytes are the inputs it uses read once, the outputs written once, and every operand of
//! a matrix product or attention that is not an input written and read once (no template fuses
//! a product's prologue), and anchors count the products and attentions (no two share a kernel).
//! Minimising that over choices is exact when the solver proves optimality; when its time limit
//! stops it first, the LP relaxation's optimum is used instead, which is still a lower bound.
//! Invariant: `lower_bound` never exceeds the predicted time of any plan the planner can form.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use egg::{Id, Language};
use good_lp::{
    constraint, microlp, variable, Expression, ProblemVariables, Solution, SolverModel, Variable, WithTimeLimit,
};

use crate::cost::profile::DeviceProfile;
use crate::ir::lang::{Composite, Kind, TensorLang};
use crate::plan::dag::{role_of, Role};
use crate::plan::Template;
use crate::search::analysis::TensorGraph;
use crate::search::extract::Selection;

/// Largest e-graph (in e-nodes) the integer program is built for.
pub const ILP_MAX_NODES: usize = 4000;

/// What the integer program found.
#[derive(Clone, Debug)]
pub struct IlpResult {
    /// A proven lower bound on the predicted time of any plan, in microseconds.
    pub lower_bound_us: f64,
    /// Whether the integer optimum was proven (otherwise the bound is the LP relaxation's).
    pub proven_optimal: bool,
    /// The optimal choice, when the integer program was solved.
    pub selection: Option<Selection>,
}

/// The terms of the relaxed cost of one node choice.
struct Terms {
    flops: u64,
    anchor: bool,
    /// Non-input classes this node needs in memory (operands of products).
    forced: Vec<Id>,
}

fn node_terms(egraph: &TensorGraph, node: &TensorLang) -> Terms {
    let ty = |c: Id| egraph[c].data.ty().cloned();
    let numel =
        egraph.analysis.node_fact(node, |c| egraph[c].data.fact.clone()).and_then(|f| f.ty).map_or(1, |t| t.numel())
            as u64;
    let kind = node.opcode().map(|c| c.kind());
    // Attention's backward: the query, key and value gradients may share one kernel, and the
    // forward kernel may write the log-sum-exp, so only the key gradient counts as a launch (the
    // bound stays a bound); every one reads its operands.
    let backward = matches!(kind, Some(Kind::Composite(c)) if c.is_attention_backward());
    let anchor = matches!(kind, Some(Kind::MatMul))
        || matches!(kind, Some(Kind::Composite(c)) if c.is_attention_forward())
        || matches!(
            kind,
            Some(Kind::Composite(
                Composite::AttentionGrad(crate::ir::lang::AttnArg::K)
                    | Composite::AttentionBiasGrad(crate::ir::lang::AttnArg::K)
                    | Composite::AttentionDropoutGrad(crate::ir::lang::AttnArg::K)
                    | Composite::AttentionBiasDropoutGrad(crate::ir::lang::AttnArg::K)
            ))
        );
    let mut forced = Vec::new();
    // (`attention_bias`'s bias, and its backward's, may be computed in its kernel: a bool
    // mask's select; so may the dropout forms' seed: a slice of a seeds input.)
    let (bias, dropout) = match kind {
        Some(Kind::Composite(c)) => (
            c.attention_slots().and_then(|s| s.bias).or_else(|| c.attention_backward_slots().and_then(|s| s.bias)),
            c.attention_slots()
                .and_then(|s| s.dropout)
                .or_else(|| c.attention_backward_slots().and_then(|s| s.dropout)),
        ),
        _ => (None, None),
    };
    if anchor || backward {
        for (j, &c) in node.children().iter().enumerate() {
            if Some(j) == bias || dropout.is_some_and(|d| j >= d) {
                continue;
            }
            if let Some(f) = operand_in_memory(egraph, c) {
                forced.push(f);
            }
        }
    }
    let flops = match kind {
        None | Some(Kind::Reshape | Kind::Broadcast | Kind::Transpose) => 0,
        // (Index maps compute nothing; scatter_add's sums are counted as none, a bound.)
        Some(Kind::Slice | Kind::Concat | Kind::Gather | Kind::ScatterAdd) => 0,
        Some(Kind::MatMul) => {
            let k = node.children().first().and_then(|&c| ty(c)).and_then(|t| t.shape.last().copied()).unwrap_or(1);
            numel.saturating_mul(2).saturating_mul(k as u64)
        }
        Some(Kind::Reduce(_)) => node.children().first().and_then(|&c| ty(c)).map_or(1, |t| t.numel()) as u64,
        _ => numel,
    };
    Terms { flops, anchor, forced }
}

/// The class a product operand must be in memory as: itself, or what a view of it views (a
/// product reads its operands through views, which are never written); `None` when that is a
/// program input (already in memory) or a literal. Views never make a tensor bigger than what
/// they view, so following one keeps the bound below whatever form the solver picks for the
/// operand; where a class offers two views, or views form a cycle, nothing is charged.
fn operand_in_memory(egraph: &TensorGraph, c: Id) -> Option<Id> {
    let mut c = egraph.find(c);
    let mut seen = BTreeSet::new();
    loop {
        let class = &egraph[c];
        if !seen.insert(c) || class.nodes.iter().any(|n| matches!(role_of(n), Role::Input | Role::Leaf)) {
            return None;
        }
        let viewed: Vec<Id> =
            class.nodes.iter().filter(|n| role_of(n) == Role::View).map(|n| egraph.find(n.children()[0])).collect();
        match viewed[..] {
            [] => return Some(c),
            [v] => c = v,
            _ => return None,
        }
    }
}

/// Output classes some kernel must write: those that are not program inputs. (An output that is
/// an input moves nothing, and its read is not counted either, so the bound stays below it.)
fn written_roots(egraph: &TensorGraph, roots: &[Id]) -> BTreeSet<Id> {
    roots
        .iter()
        .map(|&r| egraph.find(r))
        .filter(|&r| !egraph[r].nodes.iter().any(|n| matches!(n, TensorLang::Var(_))))
        .collect()
}

fn is_root(egraph: &TensorGraph, roots: &[Id], c: Id) -> bool {
    roots.iter().any(|&r| egraph.find(r) == c)
}

/// The best rates over templates: a bound must not assume any kernel slower than the fastest.
fn best_rates(profile: &DeviceProfile) -> (f64, f64) {
    // Each template's rates and those of its implementations (gemm: cuBLASLt, generated).
    let all: Vec<&crate::cost::profile::TemplateRates> = Template::ALL
        .iter()
        .flat_map(|&t| std::iter::once(profile.rates(t)).chain(profile.rates(t).implementations.values()))
        .collect();
    let bw = all.iter().map(|r| r.bandwidth_efficiency).fold(0.0, f64::max) * profile.copy_bandwidth_gbs * 1e9;
    let rate =
        all.iter().map(|r| r.flops_bf16_tflops.unwrap_or(0.0).max(r.flops_f32_tflops)).fold(0.0, f64::max) * 1e12;
    (bw, rate)
}

/// Input classes some `slice` or `gather` reads: a plan may read only part of them (the cost
/// model charges a slice's or gather's part), so the bound counts none of their bytes.
fn partly_read(egraph: &TensorGraph) -> BTreeSet<Id> {
    let mut out = BTreeSet::new();
    for class in egraph.classes() {
        for n in &class.nodes {
            if let TensorLang::Op(code, ch) = n {
                if matches!(code.kind(), Kind::Slice | Kind::Gather) {
                    out.insert(egraph.find(ch[0]));
                }
            }
        }
    }
    out
}

/// The relaxed cost of a choice of e-nodes (used by the tests to check the solver by brute force).
pub fn relaxed_cost(egraph: &TensorGraph, selection: &Selection, roots: &[Id], profile: &DeviceProfile) -> f64 {
    let mut used = BTreeSet::new();
    let mut stack: Vec<Id> = roots.iter().map(|&r| egraph.find(r)).collect();
    while let Some(c) = stack.pop() {
        if used.insert(c) {
            for &ch in selection[&c].children() {
                stack.push(egraph.find(ch));
            }
        }
    }
    let bytes_of = |c: Id| egraph[c].data.ty().map_or(0, |t| t.bytes());
    let root_set = written_roots(egraph, roots);
    let mut bytes: u64 = root_set.iter().map(|&r| bytes_of(r)).sum();
    let (mut flops, mut anchors) = (0u64, 0usize);
    let mut forced = BTreeSet::new();
    let partial = partly_read(egraph);
    for &c in &used {
        let n = &selection[&c];
        if matches!(n, TensorLang::Var(_)) && !is_root(egraph, roots, c) && !partial.contains(&c) {
            bytes += bytes_of(c);
        }
        let t = node_terms(egraph, n);
        flops = flops.saturating_add(t.flops);
        anchors += t.anchor as usize;
        forced.extend(t.forced);
    }
    bytes += forced.iter().map(|&c| 2 * bytes_of(c)).sum::<u64>();
    let (bw, rate) = best_rates(profile);
    profile.launch_overhead_us * anchors.max(usize::from(!root_set.is_empty())) as f64
        + 1e6 * (bytes as f64 / bw).max(flops as f64 / rate)
}

/// Solves the integer program (or its LP relaxation when the time limit stops the solver).
pub fn solve(
    egraph: &TensorGraph,
    roots: &[Id],
    profile: &DeviceProfile,
    time_limit: Duration,
) -> Result<IlpResult, String> {
    if egraph.total_number_of_nodes() > ILP_MAX_NODES {
        return Err(format!(
            "the e-graph has {} e-nodes, more than the {ILP_MAX_NODES} the ILP takes",
            egraph.total_number_of_nodes()
        ));
    }
    match build_and_solve(egraph, roots, profile, Some(time_limit), true) {
        Ok(r) => Ok(r),
        Err(_) => build_and_solve(egraph, roots, profile, None, false),
    }
}

fn build_and_solve(
    egraph: &TensorGraph,
    roots: &[Id],
    profile: &DeviceProfile,
    time_limit: Option<Duration>,
    integer: bool,
) -> Result<IlpResult, String> {
    let mut vars = ProblemVariables::new();
    let bin = |vars: &mut ProblemVariables| {
        if integer {
            vars.add(variable().binary())
        } else {
            vars.add(variable().min(0.0).max(1.0))
        }
    };
    let classes: Vec<Id> = egraph.classes().map(|c| c.id).filter(|&c| egraph[c].data.fact.is_some()).collect();
    let n_classes = classes.len() as f64;
    let mut used: BTreeMap<Id, Variable> = BTreeMap::new();
    let mut order: BTreeMap<Id, Variable> = BTreeMap::new();
    let mut mem: BTreeMap<Id, Variable> = BTreeMap::new();
    for &c in &classes {
        used.insert(c, bin(&mut vars));
        order.insert(c, vars.add(variable().min(0.0).max(n_classes)));
        mem.insert(c, bin(&mut vars));
    }
    let mut choice: Vec<(Id, TensorLang, Variable, Terms)> = Vec::new();
    for &c in &classes {
        for n in &egraph[c].nodes {
            let typed = egraph.analysis.node_fact(n, |x| egraph[x].data.fact.clone()).is_some();
            let children_ok = n.children().iter().all(|&ch| used.contains_key(&egraph.find(ch)));
            if typed && children_ok {
                choice.push((c, n.clone(), bin(&mut vars), node_terms(egraph, n)));
            }
        }
    }
    let (bw, rate) = best_rates(profile);
    let t = vars.add(variable().min(0.0));
    let k = vars.add(variable().min(0.0));
    let bytes_of = |c: Id| egraph[c].data.ty().map_or(0, |t| t.bytes()) as f64;
    let root_set = written_roots(egraph, roots);
    let mut bytes = Expression::from(root_set.iter().map(|&r| bytes_of(r)).sum::<f64>());
    let mut flops = Expression::from(0.0);
    let mut anchors = Expression::from(0.0);
    let partial = partly_read(egraph);
    for (c, n, x, terms) in &choice {
        if matches!(n, TensorLang::Var(_)) && !is_root(egraph, roots, *c) && !partial.contains(c) {
            bytes += bytes_of(*c) * *x;
        }
        flops += terms.flops as f64 * *x;
        if terms.anchor {
            anchors += *x;
        }
    }
    for (&c, &m) in &mem {
        bytes += 2.0 * bytes_of(c) * m;
    }
    let objective = profile.launch_overhead_us * k + t;
    let mut model = vars.minimise(objective.clone()).using(microlp);
    if let Some(tl) = time_limit {
        model = model.with_time_limit(tl.as_secs_f64());
    }
    model = model
        .with(constraint!(1e6 / bw * bytes <= t))
        .with(constraint!(1e6 / rate * flops <= t))
        .with(constraint!(anchors <= k));
    if !root_set.is_empty() {
        model = model.with(constraint!(k >= 1.0));
    }
    for r in roots.iter().map(|&r| egraph.find(r)) {
        model = model.with(constraint!(used[&r] >= 1.0));
    }
    for &c in &classes {
        let picks: Expression = choice.iter().filter(|(cc, ..)| *cc == c).map(|(.., x, _)| *x).sum();
        model = model.with(constraint!(picks == used[&c]));
    }
    for (c, n, x, terms) in &choice {
        for &ch in n.children() {
            let ch = egraph.find(ch);
            model = model.with(constraint!(*x <= used[&ch]));
            // Acyclicity: a chosen node's class comes after its children's classes.
            model = model.with(constraint!(order[c] - order[&ch] >= 1.0 - (n_classes + 1.0) * (1.0 - *x)));
        }
        for f in &terms.forced {
            model = model.with(constraint!(*x <= mem[f]));
        }
    }
    let sol = model.solve().map_err(|e| e.to_string())?;
    let proven = integer && matches!(sol.status(), good_lp::SolutionStatus::Optimal);
    if integer && !proven {
        return Err("the solver stopped before proving optimality".into());
    }
    let lower_bound_us = sol.eval(&objective);
    let selection = integer.then(|| {
        choice.iter().filter(|(.., x, _)| sol.value(*x) > 0.5).map(|(c, n, ..)| (*c, n.clone())).collect::<Selection>()
    });
    Ok(IlpResult { lower_bound_us, proven_optimal: proven, selection })
}
