//! Staged equality saturation: each ruleset runs as one stage with its own egg [`Runner`].
//!
//! The program goes into an `EGraph<TensorLang, ShapeAnalysis>` (its live nodes; the roots are
//! its outputs), then the rulesets run in order, each on the e-graph the previous one left.
//! Budgets: `iter_limit` bounds the iterations of each stage; `node_limit` (e-graph size) and
//! `time_limit` are totals shared by the stages: a stage may use an equal share of what is
//! left when it starts, so an early stage that explodes (associativity, commutativity) cannot
//! starve the later ones. `stage_growth` also caps how much one stage may grow the e-graph
//! relative to its size at the start: searching deep patterns (layernorm) in an e-graph that
//! associativity and commutativity have blown up costs seconds per iteration, and the forms
//! found past that point rarely change a fusion plan. That per-stage cap always leaves a stage
//! `node_limit / 20` e-nodes of room ([`Budgets::min_stage_room`]), so `node_limit` governs it
//! too. Each stage's report names the limit that stopped it ([`StageReport::stop_detail`]):
//! the whole `node_limit`, a stage's share of it, or the per-stage growth cap, with the number.
//! Invariants: hitting a budget is a result ([`StopReason`]), never an error; identical inputs
//! give an identical e-graph and report (timings aside, and as long as no time limit is hit);
//! saturation never merges classes of different types: rules refuse ill-typed instantiations
//! (counted in [`StageReport::refused`]) and a merge the analysis still finds conflicting is an
//! error naming the rules that ran.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use egg::{BackoffScheduler, Id, Language, Rewrite, Runner};

use crate::error::{Error, Result};
use crate::ir::lang::TensorLang;
use crate::ir::program::Program;
use crate::search::analysis::{ShapeAnalysis, TensorGraph};
use crate::search::rules::RuleSet;

/// Search budgets (builder style).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Budgets {
    /// Iterations of each stage.
    pub iter_limit: usize,
    /// E-nodes in the e-graph, for all stages together.
    pub node_limit: usize,
    /// Wall time for all stages together.
    pub time_limit: Duration,
    /// One stage may grow the e-graph to at most this many times its size at the start of the
    /// stage (but always by [`Budgets::min_stage_room`] nodes); 0 for no such cap.
    pub stage_growth: usize,
}

/// The e-nodes a stage may always add at the default node limit of 20,000, however small the
/// program (see [`Budgets::stage_growth`]); [`Budgets::min_stage_room`] scales it with the limit.
pub const MIN_STAGE_ROOM: usize = 1000;

impl Default for Budgets {
    fn default() -> Budgets {
        Budgets { iter_limit: 30, node_limit: 20_000, time_limit: Duration::from_secs(5), stage_growth: 8 }
    }
}

/// Which budget set a stage's node cap.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum NodeCap {
    /// The whole `node_limit` (the last stage, or an e-graph already past it).
    Total,
    /// The stage's share of what `node_limit` left when it started.
    Share,
    /// The per-stage growth cap ([`Budgets::stage_growth`], [`Budgets::min_stage_room`]).
    Growth,
}

impl Budgets {
    pub fn with_iter_limit(mut self, n: usize) -> Budgets {
        self.iter_limit = n;
        self
    }
    pub fn with_node_limit(mut self, n: usize) -> Budgets {
        self.node_limit = n;
        self
    }
    pub fn with_time_limit(mut self, t: Duration) -> Budgets {
        self.time_limit = t;
        self
    }
    pub fn with_stage_growth(mut self, factor: usize) -> Budgets {
        self.stage_growth = factor;
        self
    }

    /// The e-nodes a stage may always add under the growth cap: `node_limit / 20` (1,000 at the
    /// default limit of 20,000, [`MIN_STAGE_ROOM`]), so that a larger `node_limit` lets small
    /// programs grow further.
    pub fn min_stage_room(&self) -> usize {
        self.node_limit / 20
    }

    /// The node limit of a stage that starts with `nodes` e-nodes, `left` stages to go, and the
    /// budget that set it.
    fn stage_node_limit(&self, nodes: usize, left: usize) -> (usize, NodeCap) {
        let share = nodes + self.node_limit.saturating_sub(nodes) / left;
        let share_kind = if share >= self.node_limit.max(nodes) { NodeCap::Total } else { NodeCap::Share };
        if self.stage_growth == 0 {
            return (share, share_kind);
        }
        let room = nodes.saturating_mul(self.stage_growth.saturating_sub(1)).max(self.min_stage_room());
        let growth = nodes.saturating_add(room);
        if growth < share {
            (growth, NodeCap::Growth)
        } else {
            (share, share_kind)
        }
    }

    /// The sentence naming the limit that stopped a stage (`stop_detail`).
    fn stop_detail(
        &self,
        stage: &str,
        reason: &StopReason,
        cap: (usize, NodeCap),
        start: usize,
        time: Duration,
    ) -> String {
        match (reason, cap.1) {
            (StopReason::NodeLimit, NodeCap::Total) if start >= self.node_limit => format!(
                "node-limit: the e-graph started stage `{stage}` with {start} e-nodes, at or past the node limit of {}",
                self.node_limit
            ),
            (StopReason::NodeLimit, NodeCap::Total) => {
                format!("node-limit: stage `{stage}` reached the node limit of {} e-nodes", self.node_limit)
            }
            (StopReason::NodeLimit, NodeCap::Share) => format!(
                "node-limit: stage `{stage}` reached its share of the node limit of {}: {} e-nodes (per stage)",
                self.node_limit, cap.0
            ),
            (StopReason::NodeLimit, NodeCap::Growth) => format!(
                "node-limit: stage `{stage}` reached its per-stage cap of {} e-nodes: its {start} e-nodes at the start \
                 plus the larger of {}x that and {} (node limit {} / 20)",
                cap.0,
                self.stage_growth.saturating_sub(1),
                self.min_stage_room(),
                self.node_limit
            ),
            (StopReason::TimeLimit, _) => format!(
                "time-limit: stage `{stage}` used its share of the saturation time ({:.0} ms, per stage)",
                time.as_secs_f64() * 1e3
            ),
            (StopReason::IterationLimit, _) => {
                format!("iteration-limit: stage `{stage}` ran {} iterations (the per-stage limit)", self.iter_limit)
            }
            (r, _) => r.to_string(),
        }
    }
}

/// Why a stage stopped (egg's reasons).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StopReason {
    /// No rule could add anything more.
    Saturated,
    IterationLimit,
    NodeLimit,
    TimeLimit,
    Other(String),
}

impl StopReason {
    /// The kebab-case name used in reports and plan JSON (`"saturated"`, `"node-limit"`, ...).
    pub fn as_str(&self) -> &'static str {
        match self {
            StopReason::Saturated => "saturated",
            StopReason::IterationLimit => "iteration-limit",
            StopReason::NodeLimit => "node-limit",
            StopReason::TimeLimit => "time-limit",
            StopReason::Other(_) => "other",
        }
    }

    fn from_egg(r: &egg::StopReason) -> StopReason {
        match r {
            egg::StopReason::Saturated => StopReason::Saturated,
            egg::StopReason::IterationLimit(_) => StopReason::IterationLimit,
            egg::StopReason::NodeLimit(_) => StopReason::NodeLimit,
            egg::StopReason::TimeLimit(_) => StopReason::TimeLimit,
            egg::StopReason::Other(s) => StopReason::Other(s.clone()),
        }
    }
}

impl fmt::Display for StopReason {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        match self {
            StopReason::Other(s) => write!(f, "other: {s}"),
            r => f.write_str(r.as_str()),
        }
    }
}

/// What one stage did.
#[derive(Clone, Debug, PartialEq)]
pub struct StageReport {
    pub ruleset: String,
    pub iterations: usize,
    pub stop_reason: StopReason,
    /// E-nodes and e-classes when the stage ended.
    pub enodes: usize,
    pub eclasses: usize,
    pub millis: f64,
    /// Rules that changed the e-graph, with how many unions each made.
    pub fired: BTreeMap<String, usize>,
    /// Rules whose right side had a type different from the matched class's, with how many
    /// instantiations were refused for it (a rule that is not type-preserving).
    pub refused: BTreeMap<String, usize>,
    /// The stop reason with the limit that stopped the stage, as a sentence that starts with
    /// the reason's name (`node-limit: stage `algebra` reached its per-stage cap of 1030
    /// e-nodes ...`); `saturated` when no limit did.
    pub stop_detail: String,
}

/// The saturated e-graph and the report.
pub struct Saturation {
    pub egraph: TensorGraph,
    /// The class of each program output, in `program.outputs` order (canonical ids).
    pub roots: Vec<Id>,
    pub stages: Vec<StageReport>,
    /// The first stage's reason that is not `Saturated`, or `Saturated` if every stage
    /// saturated: it says whether the search was cut short anywhere.
    pub stop_reason: StopReason,
    /// That stage's [`StageReport::stop_detail`] (`saturated` if every stage saturated).
    pub stop_detail: String,
    /// Iterations over all stages.
    pub iterations: usize,
}

/// Builds the e-graph of a program's live nodes; returns it and the output classes.
fn program_egraph(program: &Program) -> (TensorGraph, Vec<Id>) {
    let inputs = program.inputs.iter().map(|i| (i.name.clone(), i.ty.clone()));
    let mut egraph = TensorGraph::new(ShapeAnalysis::new(inputs));
    let live = program.live();
    let mut ids = vec![Id::from(0); program.len()];
    for (i, node) in program.expr().as_ref().iter().enumerate() {
        // Children of a live node are live, so they were added before it.
        if live[i] {
            ids[i] = egraph.add(node.clone().map_children(|c| ids[usize::from(c)]));
        }
    }
    egraph.rebuild();
    let roots = program.outputs.iter().map(|o| egraph.find(ids[usize::from(o.id)])).collect();
    (egraph, roots)
}

/// Runs the rulesets in order on the program's e-graph.
pub fn saturate(program: &Program, rulesets: &[RuleSet], budgets: &Budgets) -> Result<Saturation> {
    let (egraph, roots) = program_egraph(program);
    saturate_egraph(egraph, roots, rulesets, budgets)
}

/// Runs the rulesets in order on an e-graph the caller built (its analysis must know the
/// program's inputs); `roots` are the classes to report, mapped to their final classes.
pub fn saturate_egraph(
    mut egraph: TensorGraph,
    roots: Vec<Id>,
    rulesets: &[RuleSet],
    budgets: &Budgets,
) -> Result<Saturation> {
    let start = Instant::now();
    let mut stages = vec![];
    for (k, set) in rulesets.iter().enumerate() {
        let left = rulesets.len() - k;
        let nodes = egraph.total_size();
        let cap = budgets.stage_node_limit(nodes, left);
        let time_limit = budgets.time_limit.saturating_sub(start.elapsed()) / left as u32;
        if nodes >= cap.0 {
            // No room at all (a program past the node limit): egg would still run an iteration
            // over the whole e-graph before it looked at the limit.
            let mut report = StageReport {
                ruleset: set.name.clone(),
                iterations: 0,
                stop_reason: StopReason::NodeLimit,
                enodes: egraph.total_number_of_nodes(),
                eclasses: egraph.number_of_classes(),
                millis: 0.0,
                fired: BTreeMap::new(),
                refused: BTreeMap::new(),
                stop_detail: String::new(),
            };
            report.stop_detail = budgets.stop_detail(&set.name, &report.stop_reason, cap, nodes, time_limit);
            stages.push(report);
            continue;
        }
        let (g, mut report) = run_stage(egraph, set, budgets.iter_limit, cap.0, time_limit)?;
        report.stop_detail = budgets.stop_detail(&set.name, &report.stop_reason, cap, nodes, time_limit);
        egraph = g;
        stages.push(report);
    }
    let roots = roots.into_iter().map(|r| egraph.find(r)).collect();
    let first = stages.iter().find(|s| s.stop_reason != StopReason::Saturated);
    let stop_reason = first.map_or(StopReason::Saturated, |s| s.stop_reason.clone());
    let stop_detail = first.map_or_else(|| "saturated".to_string(), |s| s.stop_detail.clone());
    let iterations = stages.iter().map(|s| s.iterations).sum();
    Ok(Saturation { egraph, roots, stages, stop_reason, stop_detail, iterations })
}

type TensorRunner = Runner<TensorLang, ShapeAnalysis>;

fn run_stage(
    egraph: TensorGraph,
    set: &RuleSet,
    iter_limit: usize,
    node_limit: usize,
    time_limit: Duration,
) -> Result<(TensorGraph, StageReport)> {
    let guarded = set.rules.iter().map(|r| r.guarded_rewrite()).collect::<Result<Vec<_>>>()?;
    let (mut rewrites, refused): (Vec<Rewrite<_, _>>, Vec<Arc<AtomicUsize>>) = guarded.into_iter().unzip();
    rewrites.extend(set.native.iter().map(|r| r.rewrite()));
    let clock = Instant::now();
    let conflicts_before = egraph.analysis.conflicts.len();
    let runner = TensorRunner::default()
        .with_egraph(egraph)
        .with_scheduler(BackoffScheduler::default())
        .with_iter_limit(iter_limit)
        .with_node_limit(node_limit)
        .with_time_limit(time_limit)
        .with_hook(move |r| conflict_check(r, conflicts_before))
        .run(&rewrites);
    let millis = clock.elapsed().as_secs_f64() * 1e3;
    if let Some(msg) = conflict_message(&runner, conflicts_before) {
        return Err(Error::Invalid(format!("ruleset `{}`: {msg}", set.name)));
    }
    let report = StageReport {
        ruleset: set.name.clone(),
        iterations: runner.iterations.len(),
        stop_reason: runner.stop_reason.as_ref().map_or(StopReason::Saturated, StopReason::from_egg),
        enodes: runner.egraph.total_number_of_nodes(),
        eclasses: runner.egraph.number_of_classes(),
        millis,
        fired: fired(&runner),
        refused: set
            .rules
            .iter()
            .zip(&refused)
            .map(|(r, n)| (r.name.clone(), n.load(Ordering::Relaxed)))
            .filter(|(_, n)| *n > 0)
            .collect(),
        stop_detail: String::new(),
    };
    Ok((runner.egraph, report))
}

fn fired(runner: &TensorRunner) -> BTreeMap<String, usize> {
    let mut fired = BTreeMap::new();
    for it in &runner.iterations {
        for (name, n) in &it.applied {
            *fired.entry(name.to_string()).or_insert(0) += n;
        }
    }
    fired
}

/// Stops the stage as soon as the analysis records a type conflict.
fn conflict_check(runner: &mut TensorRunner, before: usize) -> std::result::Result<(), String> {
    match conflict_message(runner, before) {
        Some(msg) => Err(msg),
        None => Ok(()),
    }
}

/// The new conflicts, naming the rules that fired in the last iteration.
fn conflict_message(runner: &TensorRunner, before: usize) -> Option<String> {
    let conflicts = &runner.egraph.analysis.conflicts;
    if conflicts.len() <= before {
        return None;
    }
    let rules: Vec<String> =
        runner.iterations.last().map(|it| it.applied.keys().map(|k| k.to_string()).collect()).unwrap_or_default();
    Some(format!(
        "merged values of different types ({}); rules applied in that iteration: {}",
        conflicts[before..].join("; "),
        if rules.is_empty() { "none".to_string() } else { rules.join(", ") }
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::lang::{Binary, Kind, Unary};
    use crate::ir::types::{DType, TensorType};
    use crate::search::rules::parse_ruleset;

    /// `exp(log(x)) * 1 + 0` with a positive `x = exp(a)`.
    fn program() -> Program {
        let mut p = Program::new("t");
        let a = p.add_input("a", TensorType::new(DType::F32, vec![4, 8])).unwrap();
        let x = p.apply(Kind::Unary(Unary::Exp), vec![a]).unwrap();
        let l = p.apply(Kind::Unary(Unary::Log), vec![x]).unwrap();
        let e = p.apply(Kind::Unary(Unary::Exp), vec![l]).unwrap();
        let one = p.num(1.0);
        let m = p.apply(Kind::Binary(Binary::Mul), vec![e, one]).unwrap();
        let zero = p.num(0.0);
        let y = p.apply(Kind::Binary(Binary::Add), vec![m, zero]).unwrap();
        p.add_output("y", y).unwrap();
        p
    }

    #[test]
    fn stages_run_in_order_and_report() {
        let text = "(rewrite mul-one (* ?x 1) ?x)\n(rewrite add-zero (+ ?x 0) ?x)\n\
                    (rewrite exp-log (exp (log ?x)) ?x :if (positive ?x))";
        let sets = vec![parse_ruleset("algebra", "a.rules", text).unwrap()];
        let sat = saturate(&program(), &sets, &Budgets::default()).unwrap();
        assert_eq!(sat.stop_reason, StopReason::Saturated);
        let fired: Vec<&str> = sat.stages[0].fired.keys().map(String::as_str).collect();
        assert_eq!(fired, ["add-zero", "exp-log", "mul-one"]);
        assert_eq!(sat.roots.len(), 1);
        assert!(sat.egraph[sat.roots[0]].nodes.iter().any(|n| n.to_string() == "exp"));
    }

    #[test]
    fn budgets_are_results_and_ill_typed_rules_are_refused() {
        let text = "(rewrite add-comm (+ ?x ?y) (+ ?y ?x))\n(rewrite grow (exp ?x) (exp (neg (neg ?x))))\n\
                    (rewrite bad (+ ?x ?y) ?y)";
        let sets = vec![parse_ruleset("algebra", "a.rules", text).unwrap()];
        let budgets = Budgets::default().with_iter_limit(3);
        let sat = saturate(&program(), &sets, &budgets).unwrap();
        assert_eq!(sat.stop_reason, StopReason::IterationLimit);
        assert_eq!(sat.stop_reason.as_str(), "iteration-limit");
        assert_eq!(sat.iterations, 3);
        assert!(sat.stages[0].refused.contains_key("bad"));
        assert!(sat.egraph.analysis.conflicts.is_empty());
    }

    #[test]
    fn deterministic() {
        let sets = crate::search::rules::default_rules().unwrap();
        let budgets = Budgets::default().with_time_limit(Duration::from_secs(3600)).with_node_limit(3000);
        let a = saturate(&program(), &sets, &budgets).unwrap();
        let b = saturate(&program(), &sets, &budgets).unwrap();
        let strip = |s: &Saturation| {
            s.stages.iter().map(|r| (r.iterations, r.enodes, r.eclasses, r.fired.clone())).collect::<Vec<_>>()
        };
        assert_eq!(strip(&a), strip(&b));
        assert_eq!(a.roots, b.roots);
        assert_eq!(format!("{:?}", a.egraph.dump()), format!("{:?}", b.egraph.dump()));
    }
}
