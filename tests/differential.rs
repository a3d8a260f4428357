//! Differential testing of the whole pipeline (issue 9): random programs from `gen_program`,
//! each planned under several configurations, and every plan evaluated kernel by kernel on the
//! CPU reference against the program.
//!
//! Each output of each plan is compared with the program twice:
//! - in f64 without per-node rounding ([`Precision::F64`]): two forms that are equal as real
//!   functions agree there to f64 accuracy however differently they round, so a difference is a
//!   wrong plan (an unsound rule, a kernel that reads the wrong tensor, a lost broadcast);
//! - in the declared dtypes, with the dtype tolerances of [`tolerance`]. A rewritten plan rounds
//!   differently from the program (reassociation, `exp(a + b)` as `exp(a) * exp(b)`, a composite
//!   that rounds once where its decomposition rounds four times), so an output outside the
//!   tolerance is accepted as rounding when the plan's largest distance from the f64 values is
//!   at most the tolerance, plus four times the program's own largest distance (a per-output
//!   measure: at one element either may be lucky), plus 8 units of roundoff of the plan's
//!   narrowest float dtype times the largest magnitude the plan computes (the forward error of
//!   a few roundings there: a cancellation the program performs exactly may round in the plan).
//!   Beyond that, or where the plan overflows and the program does not, the plan is
//!   numerically worse than the program, which fails too. Gradients are checked in f64 only:
//!   the backward graph compares computed values (`relu`'s and `abs`'s derivatives, ties of
//!   `max` and `amax`), and a comparison of values that round differently may flip.
//!
//! A failing program is shrunk by proptest and saved under `tests/cases/diff/` with a header
//! saying how it was found and what failed; `every_saved_case_passes` runs every saved case
//! through the same check, so each past failure stays fixed.
//!
//! `EQFUSE_DIFF_CASES` (default 200, so that a plain `cargo test` stays quick) and
//! `EQFUSE_DIFF_SEED` (default fixed, so CI runs are reproducible) change the number of programs
//! and the seed of the random run. CI (`.ci/run`) runs 1,000 programs, built optimised with
//! overflow checks: `EQFUSE_DIFF_CASES=1000 cargo test --profile ci --test differential`.

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::time::Instant;

use egg::Language;
use eqfuse::{
    broadcast_shapes, eval_plan_with, eval_with, expand_composites, kernel_program, parse_program, plan_saturated,
    random_inputs, recipes, saturate_program, tolerance, Binary, Composite, DType, DeviceProfile, FusionPlan, Kernel,
    Kind, OptimizeOptions, Precision, Program, Reduce, Saturated, Template, Tensor, TensorLang, Unary,
};
use proptest::test_runner::{Config, RngAlgorithm, TestCaseError, TestError, TestRng, TestRunner};

mod difftools;
use difftools::{rounding_allowance, save_case, worst_error};

/// Steps per random program (a pattern step writes a few statements).
const MAX_STEPS: usize = 6;
const DEFAULT_CASES: usize = 200;
const DEFAULT_SEED: u64 = 0x00e9_f05e;
const CASE_DIR: &str = "tests/cases/diff";

/// One way of planning: a name for messages, and the options.
struct Setup {
    name: &'static str,
    opts: OptimizeOptions,
    /// Whether it plans every program, or only a third of them (to save time).
    always: bool,
}

/// The least argument limit a device profile may have (`DeviceProfile::validate`: the widest
/// operator's operands and result).
fn least_valid_args() -> usize {
    let mut p = DeviceProfile::load("h100").expect("built-in profile");
    (1..=p.max_kernel_args)
        .find(|&n| {
            p.max_kernel_args = n;
            p.validate().is_ok()
        })
        .expect("the h100 profile validates")
}

/// Whether planning failed only because one operator alone takes more tensor arguments than
/// `limit`.
fn too_wide(err: &str, limit: usize) -> bool {
    err.contains("planning failed: no kernel template runs operator")
        && err.ends_with(&format!("tensor arguments exceed the limit of {limit}"))
}

/// Greedy, ILP and unfused planning with the H100 profile, and greedy planning with a profile
/// whose launches are nearly free and whose on-chip limits are tiny: at the small sizes of
/// generated programs the H100 numbers make every fusion pay, while this one makes bytes decide
/// (as they do at real sizes) and sends rows through the multi-pass and argument-limit paths.
/// All four plan from one saturation (with the first setup's budgets); the ILP's solver gets
/// 50 ms (then its LP relaxation bounds), which proves half the programs optimal, and the
/// tight profile plans a third of the programs.
fn setups() -> Vec<Setup> {
    setups_with_rules(None)
}

/// The setups, with `rules` instead of the built-in ones.
fn setups_with_rules(rules: Option<std::sync::Arc<Vec<eqfuse::RuleSet>>>) -> Vec<Setup> {
    let h100 = DeviceProfile::load("h100").expect("built-in profile");
    let base = OptimizeOptions { rules, ..OptimizeOptions::new(h100.clone()) };
    let ilp_time = std::time::Duration::from_millis(50);
    let mut tight = h100;
    tight.name = "tight".into();
    tight.launch_overhead_us = 0.01;
    tight.smem_per_block_bytes = 256;
    tight.max_kernel_args = 5;
    let ilp = OptimizeOptions { extractor: "ilp".into(), ilp_time_limit: Some(ilp_time), ..base.clone() };
    vec![
        Setup { name: "greedy", opts: base.clone(), always: true },
        Setup { name: "ilp", opts: ilp, always: true },
        Setup { name: "no-fusion", opts: OptimizeOptions { fusion: false, ..base.clone() }, always: true },
        Setup { name: "greedy-tight", opts: OptimizeOptions { profile: tight, ..base }, always: false },
    ]
}

/// What the checks saw, summed over programs.
#[derive(Default, Debug)]
struct Tally {
    programs: usize,
    plans: usize,
    kernels: usize,
    /// Outputs outside the dtype tolerance that rounding explains.
    rounding: usize,
    /// Gradient outputs (checked in f64 only).
    gradients: usize,
    /// Rules that fired, with how many programs they fired in.
    rules: BTreeMap<String, usize>,
    /// Composites the plans used that the programs did not write.
    recognised: BTreeMap<String, usize>,
}

impl Tally {
    fn add(&mut self, o: &Tally) {
        self.programs += o.programs;
        self.plans += o.plans;
        self.kernels += o.kernels;
        self.rounding += o.rounding;
        self.gradients += o.gradients;
        for (k, v) in &o.rules {
            *self.rules.entry(k.clone()).or_default() += v;
        }
        for (k, v) in &o.recognised {
            *self.recognised.entry(k.clone()).or_default() += v;
        }
    }
}

/// Parses a program and draws its inputs; a refusal is a generator bug.
fn load(text: &str, input_seed: u64) -> Result<(Program, HashMap<String, Tensor>), String> {
    let p = parse_program("generated.eqf", text, &[]).map_err(|e| format!("generator: the parser refused it: {e}"))?;
    let inputs = random_inputs(&p, input_seed);
    Ok((p, inputs))
}

/// The program's outputs at both precisions; non-finite values are a generator bug (its
/// intervals should have kept them finite).
fn reference(p: &Program, inputs: &HashMap<String, Tensor>) -> Result<(Vec<Tensor>, Vec<Tensor>), String> {
    let declared = eval_with(p, inputs, Precision::Declared).map_err(|e| format!("generator: reference: {e}"))?;
    let f64s = eval_with(p, inputs, Precision::F64).map_err(|e| format!("generator: reference in f64: {e}"))?;
    for (o, t) in p.outputs.iter().zip(&declared) {
        if t.data.iter().any(|v| !v.is_finite()) {
            return Err(format!("generator: output `{}` is not finite: {}", o.name, t.summary()));
        }
    }
    Ok((declared, f64s))
}

/// Whether `got` equals `want` (both in f64) to f64 accuracy; integers and bools exactly.
fn same_in_f64(got: &Tensor, want: &Tensor) -> Result<(), String> {
    let (rtol, atol) = if want.dtype.is_float() { (1e-9, 1e-9) } else { (0.0, 0.0) };
    let c = got.compare(want, rtol, atol);
    if c.ok() {
        Ok(())
    } else {
        Err(c.to_string())
    }
}

/// How a plan's output compares with the program's in the declared dtypes.
enum Rounded {
    Within,
    /// Outside the dtype tolerance, explained by the program's own rounding error.
    Explained,
    /// The plan is further from the f64 value than the program's error allows.
    Worse(String),
}

/// Compares `got` with `want` in the declared dtype; see the module docs for the rule.
fn compare_rounded(got: &Tensor, want: &Tensor, exact: &Tensor, allowance: impl Fn() -> f64) -> Rounded {
    let (rtol, atol) = tolerance(want.dtype);
    let c = got.compare(want, rtol, atol);
    if c.ok() {
        return Rounded::Within;
    }
    if let Some(i) = (0..got.data.len()).find(|&i| !got.data[i].is_finite() && want.data[i].is_finite()) {
        return Rounded::Worse(format!("element {i} overflows: plan {}, program {}", got.data[i], want.data[i]));
    }
    let scale = exact.data.iter().fold(0.0f64, |m, x| m.max(x.abs()));
    let ((plan, at), (program, _)) = (worst_error(got, exact), worst_error(want, exact));
    if plan <= atol + rtol * scale + 4.0 * program + allowance() {
        return Rounded::Explained;
    }
    Rounded::Worse(format!(
        "the plan is up to {plan:.3e} from the f64 values (at element {at}: plan {}, program {}, f64 {}), \
         the program up to {program:.3e} ({} tolerance {rtol}, {atol}; {c})",
        got.data[at], want.data[at], exact.data[at], want.dtype
    ))
}

/// The names bound to `grad(...)` in a program's text.
fn gradient_names(text: &str) -> Vec<String> {
    text.lines().filter_map(|l| l.split_once(" = grad(")).map(|(name, _)| name.trim().to_string()).collect()
}

/// What one program's plans are checked against.
struct Want<'a> {
    inputs: &'a HashMap<String, Tensor>,
    /// The program's outputs in their dtypes and in f64.
    declared: Vec<Tensor>,
    f64s: Vec<Tensor>,
    /// Outputs checked in f64 only (gradients).
    f64_only: Vec<String>,
}

/// Checks one plan of `p` against the program's outputs.
fn check_plan_outputs(p: &Program, plan: &FusionPlan, want: &Want, tally: &mut Tally) -> Result<(), String> {
    let inputs = want.inputs;
    let got_x = eval_plan_with(plan, inputs, Precision::F64).map_err(|e| format!("evaluating the plan: {e}"))?;
    let got_r = eval_plan_with(plan, inputs, Precision::Declared).map_err(|e| format!("evaluating the plan: {e}"))?;
    for (k, o) in p.outputs.iter().enumerate() {
        let name = &o.name;
        let (declared, f64s) = (&want.declared[k], &want.f64s[k]);
        if got_x[k].dtype != declared.dtype || got_x[k].shape != declared.shape {
            return Err(format!("output `{name}`: the plan gives {}, the program {}", got_x[k].ty(), declared.ty()));
        }
        same_in_f64(&got_x[k], f64s).map_err(|e| format!("output `{name}` differs in f64 (a wrong plan): {e}"))?;
        if want.f64_only.contains(name) {
            tally.gradients += 1;
            continue;
        }
        match compare_rounded(&got_r[k], declared, f64s, || rounding_allowance(plan, inputs)) {
            Rounded::Within => {}
            Rounded::Explained => tally.rounding += 1,
            Rounded::Worse(e) => return Err(format!("output `{name}` loses precision: {e}")),
        }
    }
    Ok(())
}

/// Invariants of the plan itself: fusion never predicts slower than the unfused program, and no
/// plan beats the ILP's proven lower bound.
fn check_plan_totals(setup: &Setup, plan: &FusionPlan) -> Result<(), String> {
    let (t, u) = (plan.total.predicted_us, plan.unfused.predicted_us);
    if setup.opts.fusion && t > u * (1.0 + 1e-9) + 1e-9 {
        return Err(format!("the fused plan predicts {t:.3} us, more than the unfused {u:.3} us"));
    }
    if let Some(bound) = plan.search.lower_bound_us {
        if bound > t * (1.0 + 1e-9) + 1e-9 {
            return Err(format!("the plan predicts {t:.6} us, below the ILP's proven lower bound {bound:.6} us"));
        }
    }
    Ok(())
}

/// How a body node reduces, as the templates see it.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Red {
    /// Along the last axis of its input.
    Row,
    /// Along another axis (or across rows): `colreduce` only.
    Across(usize),
}

/// The reduction a kernel body node performs, if any. One along an axis of one element reduces
/// nothing (its value passes through, as `lower` renders it): none.
fn reduction(p: &Program, n: &TensorLang) -> Option<Red> {
    let TensorLang::Op(code, ch) = n else { return None };
    let shape = p.ty(*ch.first()?).map(|t| t.shape.clone()).unwrap_or_default();
    let rank = shape.len() as i64;
    let unit = |a: usize| shape.get(a) == Some(&1);
    let axis = |k: usize| {
        let a = p.fact(ch[k]).konst.expect("axes are literals") as i64;
        let a = if a < 0 { a + rank } else { a } as usize;
        if unit(a) {
            None
        } else if a as i64 + 1 == rank {
            Some(Red::Row)
        } else {
            Some(Red::Across(a))
        }
    };
    match code.kind() {
        Kind::Reduce(_) | Kind::Composite(Composite::Softmax | Composite::LogSoftmax) => axis(1),
        Kind::Composite(Composite::LayerNorm | Composite::RmsNorm) => {
            (!unit(shape.len().wrapping_sub(1))).then_some(Red::Row)
        }
        Kind::Composite(Composite::CrossEntropy) => Some(Red::Across(usize::MAX)),
        _ => None,
    }
}

/// Checks a kernel against the contract of its template, independently of the planner's own
/// legality code (`cost.rs`): these are what codegen relies on, and the CPU evaluation of a
/// plan cannot see them (it evaluates a body as a whole, whatever its template).
fn lint_kernel(k: &Kernel, profile: &DeviceProfile) -> Result<(), String> {
    let p = kernel_program(k).map_err(|e| e.to_string())?;
    let nodes = p.expr().as_ref();
    let ty = |i: usize| p.ty(egg::Id::from(i));
    if k.reads.len() + k.writes.len() > profile.max_kernel_args {
        return Err(format!(
            "{} tensor arguments, more than {}",
            k.reads.len() + k.writes.len(),
            profile.max_kernel_args
        ));
    }
    // Values computed in the kernel: operators, and views of them (a view of a read is an index
    // map). Index generators are computed at any element, so they and their views are like
    // reads: `iota` and views of it (a reshape only of an iota or a reshaped iota), `onehot` of
    // a read and its transposes and broadcasts.
    let mut computed = vec![false; nodes.len()];
    let mut index = vec![false; nodes.len()];
    let mut reshapable = vec![false; nodes.len()];
    for (i, n) in nodes.iter().enumerate() {
        if let TensorLang::Op(code, ch) = n {
            let c = ch.first().map(|&c| usize::from(c));
            let below = |v: &[bool]| c.is_some_and(|c| v[c]);
            (index[i], reshapable[i]) = match code.kind() {
                Kind::Iota => (true, true),
                Kind::OneHot => (!below(&computed), false),
                Kind::Transpose | Kind::Broadcast => (below(&index), false),
                Kind::Reshape => (below(&index) && below(&reshapable), below(&reshapable)),
                _ => (false, false),
            };
        }
        computed[i] = !index[i]
            && match n {
                TensorLang::Op(code, ch) => match code.kind() {
                    // (A slice of a read is one too: the read at an offset.)
                    Kind::Transpose | Kind::Reshape | Kind::Broadcast | Kind::Slice => computed[usize::from(ch[0])],
                    _ => true,
                },
                _ => false,
            };
    }
    let mut reds = vec![];
    let mut anchors = vec![];
    for (i, n) in nodes.iter().enumerate() {
        let TensorLang::Op(code, ch) = n else { continue };
        let child = usize::from(ch[0]);
        match code.kind() {
            Kind::MatMul | Kind::Composite(Composite::Attention | Composite::AttentionBias) => {
                anchors.push((code.name(), i));
                // (`attention_bias` may select a bool mask's bias in the kernel: its fourth operand.)
                let bias = |j: usize| code.kind() == Kind::Composite(Composite::AttentionBias) && j == 3;
                if ch.iter().enumerate().any(|(j, &c)| computed[usize::from(c)] && !bias(j)) {
                    return Err(format!("`{}` has an operand computed in the kernel", code.name()));
                }
            }
            Kind::Transpose if computed[child] && ty(i) != ty(child) => {
                return Err("a transpose of a value computed in the kernel".into());
            }
            // (The attention template stores its result through views: `views_above`.)
            Kind::Reshape if computed[child] && !is_attention(&nodes[child]) => {
                let squeeze = |s: &[usize]| s.iter().copied().filter(|&d| d != 1).collect::<Vec<_>>();
                let (a, b) = (ty(i).expect("typed"), ty(child).expect("typed"));
                if squeeze(&a.shape) != squeeze(&b.shape) {
                    return Err("a reshape of a value computed in the kernel".into());
                }
            }
            _ => {}
        }
        if let Some(r) = reduction(&p, n) {
            reds.push((r, i));
        }
    }
    // Operands of index maps (`concat`, `gather`, a scatter_add's indices) are read at the places
    // the map computes.
    let mapped = |i: usize| {
        nodes.iter().any(|n| {
            matches!(n, TensorLang::Op(c, ch) if matches!(c.kind(), Kind::Concat | Kind::Gather)
                && ch[..2].iter().any(|&x| usize::from(x) == i))
                || matches!(n, TensorLang::Op(c, ch) if c.kind() == Kind::ScatterAdd && usize::from(ch[0]) == i)
        })
    };
    // A scatter_add's kernel iterates over its values and writes the scatter_add alone: its
    // result, complete only when the kernel ends, feeds nothing in the kernel.
    let scatters: Vec<usize> = (0..nodes.len())
        .filter(|&i| matches!(&nodes[i], TensorLang::Op(c, _) if c.kind() == Kind::ScatterAdd))
        .collect();
    if let Some(&s) = scatters.first() {
        let values = ty(usize::from(nodes[s].children()[1])).expect("typed");
        let used = nodes.iter().any(|n| n.children().iter().any(|&c| usize::from(c) == s));
        if scatters.len() > 1 || values.shape != k.domain || k.writes.len() != 1 || used {
            return Err(format!("a scatter_add kernel over {:?} writing {} tensors", k.domain, k.writes.len()));
        }
    }
    // Views of attention's result, which its template stores through them.
    let mut attention_view = vec![false; nodes.len()];
    for (i, n) in nodes.iter().enumerate() {
        if let TensorLang::Op(c, ch) = n {
            let below = usize::from(ch[0]);
            let of_attention = is_attention(&nodes[below]);
            attention_view[i] =
                matches!(c.kind(), Kind::Transpose | Kind::Reshape) && (of_attention || attention_view[below]);
        }
    }
    let operand = |i: usize| {
        mapped(i)
            || attention_view[i]
            || anchors.iter().any(|&(_, a)| nodes[a].children().iter().any(|&c| usize::from(c) == i))
    };
    for (i, n) in nodes.iter().enumerate() {
        let Some(t) = ty(i) else { continue };
        if matches!(n, TensorLang::Op(..))
            && computed[i]
            && !operand(i)
            && !scatters.contains(&i)
            && broadcast_shapes(&t.shape, &k.domain).ok().as_deref() != Some(&k.domain[..])
        {
            return Err(format!("a value of type {t} does not fit the domain {:?}", k.domain));
        }
    }
    template_contract(k, &p, &reds, &anchors, profile.strict)
}

/// Whether a node is a forward attention (`attention`, `attention_bias`).
fn is_attention(n: &TensorLang) -> bool {
    matches!(n, TensorLang::Op(c, _) if matches!(c.kind(), Kind::Composite(x) if x.is_attention_forward()))
}

/// The template's rules on reductions and products.
fn template_contract(
    k: &Kernel,
    p: &Program,
    reds: &[(Red, usize)],
    anchors: &[(&str, usize)],
    strict: bool,
) -> Result<(), String> {
    let names: Vec<&str> = anchors.iter().map(|(n, _)| *n).collect();
    let all_rows = reds.iter().all(|(r, _)| *r == Red::Row);
    let ok = match k.template {
        Template::Elementwise => reds.is_empty() && anchors.is_empty(),
        Template::RowReduce => !reds.is_empty() && all_rows && anchors.is_empty(),
        Template::ColReduce => {
            let across: Vec<usize> = reds.iter().filter(|(r, _)| *r != Red::Row).map(|&(_, i)| i).collect();
            let paired = if strict { vec![] } else { online_pair_nodes(p, reds) };
            !across.is_empty() && anchors.is_empty() && only_views_after(p, across, &paired)
        }
        Template::Gemm => names == ["@"] && all_rows && (reds.is_empty() || k.domain.last().is_some_and(|&w| w <= 256)),
        // (A kernel of attention's backward composites: the flash backward, whose recomputed
        // scores are no product of the body.)
        Template::Attention => {
            let backward = |o: &String| o.starts_with("attention") && (o.contains("_grad_") || o.ends_with("_lse"));
            reds.is_empty()
                && (names == ["attention"]
                    || names == ["attention_bias"]
                    || (names.is_empty() && k.ops.iter().any(backward)))
        }
    };
    if ok {
        Ok(())
    } else {
        Err(format!("a {:?} kernel with reductions {reds:?} and products {names:?}", k.template))
    }
}

/// The nodes inside the online pairs of a column kernel, which `colreduce` runs in one pass
/// outside strict numerics: for `sum(exp(x - m))` over an axis, where `m` is `amax(x)` over
/// the same axis of the same `x` (through reshapes and broadcasts), the exponential, the
/// subtraction and those views, where none of them feeds anything else or is written.
fn online_pair_nodes(p: &Program, reds: &[(Red, usize)]) -> Vec<usize> {
    let nodes = p.expr().as_ref();
    let op = |i: usize| match &nodes[i] {
        TensorLang::Op(c, ch) => Some((c.kind(), ch.iter().map(|&c| usize::from(c)).collect::<Vec<_>>())),
        _ => None,
    };
    let red_of = |i: usize| reds.iter().find(|&&(_, j)| j == i).map(|&(r, _)| r);
    let users =
        |i: usize| (0..nodes.len()).filter(|&j| op(j).is_some_and(|(_, ch)| ch.contains(&i))).collect::<Vec<_>>();
    let written = |i: usize| p.outputs.iter().any(|o| usize::from(o.id) == i);
    let mut out = vec![];
    for &(r, s) in reds {
        let Some((Kind::Reduce(Reduce::Sum), ch)) = op(s) else { continue };
        let e = ch[0];
        let Some((Kind::Unary(Unary::Exp), under)) = op(e) else { continue };
        let d = under[0];
        let Some((Kind::Binary(Binary::Sub), sub)) = op(d) else { continue };
        let mut chain = vec![e, d];
        let mut m = sub[1];
        while let Some((Kind::Reshape | Kind::Broadcast, v)) = op(m) {
            chain.push(m);
            m = v[0];
        }
        let is_max = matches!(op(m), Some((Kind::Reduce(Reduce::Amax), v)) if v[0] == sub[0]) && red_of(m) == Some(r);
        let private = chain.iter().all(|&c| !written(c) && users(c).iter().all(|u| *u == s || chain.contains(u)));
        if is_max && private {
            out.extend(chain);
        }
    }
    out
}

/// Whether everything computed from the `across` reductions' results (a column or global
/// reduction, complete only when every block is done) is a reshape or broadcast no larger than
/// what it views, or a pointwise operator of them and constants (a cast, a unary operator, a
/// binary one with a literal): the only epilogue `colreduce` runs, as it stores them. The
/// `paired` nodes, inside an online pair, are not computed from a finished reduction.
fn only_views_after(p: &Program, mut after: Vec<usize>, paired: &[usize]) -> bool {
    let nodes = p.expr().as_ref();
    let numel = |i: usize| p.ty(egg::Id::from(i)).map_or(1, |t| t.numel());
    for (i, n) in nodes.iter().enumerate() {
        let TensorLang::Op(code, ch) = n else { continue };
        if paired.contains(&i) || !ch.iter().any(|c| after.contains(&usize::from(*c))) {
            continue;
        }
        let literal_or_after =
            |c: &egg::Id| after.contains(&usize::from(*c)) || matches!(nodes[usize::from(*c)], TensorLang::Num(_));
        let epilogue = match code.kind() {
            Kind::Reshape | Kind::Broadcast | Kind::Cast | Kind::Unary(_) => true,
            Kind::Binary(_) => ch.iter().all(literal_or_after),
            _ => false,
        };
        // (No larger than the reduced value it is computed from.)
        let of = ch.iter().map(|&c| usize::from(c)).filter(|c| after.contains(c)).map(numel).max().unwrap_or(0);
        if !epilogue || numel(i) > of {
            return false;
        }
        after.push(i);
    }
    true
}

/// Plans `p` under one setup and checks the plan; returns the plan's predicted time.
fn check_setup(p: &Program, sat: &Saturated, setup: &Setup, want: &Want, tally: &mut Tally) -> Result<f64, String> {
    let optimized = plan_saturated(p, sat, &setup.opts).map_err(|e| format!("planning failed: {e}"))?;
    let plan = &optimized.plan;
    check_plan_totals(setup, plan)?;
    for k in &plan.kernels {
        lint_kernel(k, &setup.opts.profile).map_err(|e| format!("kernel {} breaks its template: {e}", k.id))?;
    }
    check_plan_outputs(p, plan, want, tally)?;
    tally.plans += 1;
    tally.kernels += plan.kernels.len();
    for c in &optimized.recognised {
        *tally.recognised.entry(c.clone()).or_default() += 1;
    }
    Ok(plan.total.predicted_us)
}

/// The whole check of one program: the reference, the composite expansion (the unfused
/// baseline), and every setup's plan. `Err` says what failed.
fn check_program(text: &str, input_seed: u64, setups: &[Setup]) -> Result<Tally, String> {
    let mut tally = Tally { programs: 1, ..Tally::default() };
    let (p, inputs) = load(text, input_seed)?;
    let (declared, f64s) = reference(&p, &inputs)?;
    let want = Want { inputs: &inputs, declared, f64s, f64_only: gradient_names(text) };
    let expanded = expand_composites(&p).map_err(|e| format!("expanding composites: {e}"))?;
    let unfused = eval_with(&expanded, &inputs, Precision::F64).map_err(|e| format!("expanded program: {e}"))?;
    for ((o, got), w) in p.outputs.iter().zip(&unfused).zip(&want.f64s) {
        same_in_f64(got, w).map_err(|e| format!("the expanded program differs at `{}`: {e}", o.name))?;
    }
    let sat = saturate_program(&p, &setups[0].opts).map_err(|e| format!("saturation failed: {e}"))?;
    for stage in &sat.stages {
        for rule in stage.fired.keys() {
            *tally.rules.entry(rule.clone()).or_default() += 1;
        }
    }
    let mut times = BTreeMap::new();
    for s in setups.iter().filter(|s| s.always || input_seed % 3 == 1) {
        let t = match check_setup(&p, &sat, s, &want, &mut tally) {
            Ok(t) => t,
            // The tight profile's argument limit is below what a device profile may have (the
            // widest operator's operands and result): an operator wider than it (attention's
            // backward composites take six tensors) runs in no kernel there.
            Err(e)
                if s.opts.profile.max_kernel_args < least_valid_args()
                    && too_wide(&e, s.opts.profile.max_kernel_args) =>
            {
                continue;
            }
            Err(e) => return Err(format!("{}: {e}", s.name)),
        };
        times.insert(s.name, t);
    }
    if times["ilp"] > times["greedy"] + 1e-6 {
        return Err(format!("ilp: predicts {:.3} us, more than greedy's {:.3} us", times["ilp"], times["greedy"]));
    }
    Ok(tally)
}

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// Runs `cases` random programs from `seed` through the check; on a failure, returns the shrunk
/// recipe's saved case file and the reason.
fn run_random(seed: u64, cases: usize, setups: &[Setup]) -> (Tally, Option<(PathBuf, String)>) {
    let config =
        Config { cases: cases as u32, failure_persistence: None, max_shrink_time: 120_000, ..Config::default() };
    let mut bytes = [0u8; 32];
    bytes[..8].copy_from_slice(&seed.to_le_bytes());
    let mut runner = TestRunner::new_with_rng(config, TestRng::from_seed(RngAlgorithm::ChaCha, &bytes));
    let tally = RefCell::new(Tally::default());
    let result = runner.run(&recipes(MAX_STEPS), |r| {
        let t = check_program(&r.render(), r.input_seed, setups).map_err(TestCaseError::fail)?;
        tally.borrow_mut().add(&t);
        Ok(())
    });
    let failure = match result {
        Ok(()) => None,
        Err(TestError::Fail(why, recipe)) => {
            let origin = format!("tests/differential.rs, seed {seed}, shrunk by proptest");
            let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join(CASE_DIR);
            Some((save_case(&dir, &recipe, why.message(), "differential case", &origin), why.message().to_string()))
        }
        Err(TestError::Abort(why)) => Some((PathBuf::new(), format!("proptest aborted: {why}"))),
    };
    (tally.into_inner(), failure)
}

fn report(what: &str, t: &Tally, secs: f64, mismatches: usize) {
    println!(
        "{what}: {} programs, {} plans ({} kernels) checked in {secs:.1} s: {mismatches} mismatches, \
         {} outputs outside the dtype tolerance, explained by rounding; {} gradients (in f64 only)",
        t.programs, t.plans, t.kernels, t.rounding, t.gradients
    );
    let rules: Vec<String> = t.rules.iter().map(|(r, n)| format!("{r} ({n})")).collect();
    println!("rules fired ({} distinct): {}", rules.len(), rules.join(", "));
    println!("composites recognised: {:?}", t.recognised);
}

#[test]
fn random_programs_plan_to_what_the_program_computes() {
    let cases = env_or("EQFUSE_DIFF_CASES", DEFAULT_CASES as u64) as usize;
    let seed = env_or("EQFUSE_DIFF_SEED", DEFAULT_SEED);
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).clamp(1, 4);
    let start = Instant::now();
    let results: Vec<(Tally, Option<(PathBuf, String)>)> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|k| {
                let share = cases / threads + usize::from(k < cases % threads);
                scope.spawn(move || run_random(seed.wrapping_add(k as u64), share, &setups()))
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("worker")).collect()
    });
    let mut total = Tally::default();
    let mut failures = vec![];
    for (t, f) in results {
        total.add(&t);
        failures.extend(f);
    }
    report("differential", &total, start.elapsed().as_secs_f64(), failures.len());
    for (path, why) in &failures {
        println!("FAILED, saved as {}:\n{why}", path.display());
    }
    assert!(failures.is_empty(), "{} random programs failed; shrunk cases saved (see above)", failures.len());
    assert!(total.programs >= cases, "only {} of {cases} programs were checked", total.programs);
}

/// The input seed a case file names in its header (0 if none).
fn header_seed(text: &str) -> u64 {
    text.lines().filter_map(|l| l.strip_prefix("# input-seed:")).find_map(|v| v.trim().parse().ok()).unwrap_or(0)
}

#[test]
fn every_saved_case_passes() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join(CASE_DIR);
    let mut files: Vec<PathBuf> =
        std::fs::read_dir(&dir).map(|d| d.map(|e| e.expect("entry").path()).collect()).unwrap_or_default();
    files.retain(|p| p.extension().is_some_and(|e| e == "eqf"));
    files.sort();
    let setups = setups();
    let start = Instant::now();
    let mut total = Tally::default();
    let mut failed = vec![];
    for f in &files {
        let text = std::fs::read_to_string(f).expect("case file");
        match check_program(&text, header_seed(&text), &setups) {
            Ok(t) => total.add(&t),
            Err(e) => failed.push(format!("{}: {e}", f.display())),
        }
    }
    report("saved cases", &total, start.elapsed().as_secs_f64(), failed.len());
    assert!(failed.is_empty(), "saved cases fail:\n{}", failed.join("\n"));
}

#[test]
fn generated_programs_use_every_dtype() {
    let mut seen = std::collections::BTreeSet::new();
    for seed in 0..200 {
        let text = eqfuse::random_recipe(seed, MAX_STEPS).render();
        let p = parse_program("g.eqf", &text, &[]).unwrap_or_else(|e| panic!("{e}\n{text}"));
        for i in 0..p.len() {
            if let Some(t) = p.ty(egg::Id::from(i)) {
                seen.insert(t.dtype);
            }
        }
    }
    assert_eq!(seen.into_iter().collect::<Vec<_>>(), DType::ALL.to_vec());
}

/// Rules that are not equalities and that plans pick up: the check must catch each within a few
/// random programs, or it would not catch a real unsound rule either. (An unsound rule whose
/// wrong side is never cheaper than the program's own form, such as `amax` to `amin`, never
/// reaches a plan; `tests/soundness.rs` catches those.)
const UNSOUND: &[&str] = &[
    "(rewrite unsound-sub-comm (- ?x ?y) (- ?y ?x))",
    "(rewrite unsound-exp-neg (exp (neg ?x)) (exp ?x))",
    "(rewrite unsound-relu-abs (relu ?x) (abs ?x))",
    "(rewrite unsound-sigmoid (sigmoid ?x) (tanh ?x))",
    "(rewrite unsound-mul-add (* ?x ?y) (+ ?x ?y))",
    "(rewrite unsound-softmax (softmax ?x ?a) (exp ?x))",
];

#[test]
fn unsound_rules_are_caught() {
    // `--rules DIR` refuses an unsound rule (tests/soundness.rs); rulesets handed to the planner
    // as built are used as they are, which is how an unsound rule reaches plans here.
    for bad in UNSOUND {
        let mut sets = eqfuse::default_rules().expect("default rules");
        let extra = eqfuse::parse_ruleset("algebra", "unsound.rules", bad).expect("rule");
        sets.iter_mut().find(|s| s.name == "algebra").expect("algebra ruleset").rules.extend(extra.rules);
        let setups = setups_with_rules(Some(std::sync::Arc::new(sets)));
        let found = (0..40u64).find_map(|seed| {
            let r = eqfuse::random_recipe(seed, MAX_STEPS);
            check_program(&r.render(), r.input_seed, &setups).err()
        });
        let why = found.unwrap_or_else(|| panic!("40 random programs did not catch {bad}"));
        assert!(why.contains("differs in f64"), "{bad} was caught for another reason: {why}");
    }
}
