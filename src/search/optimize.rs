//! `optimize`: the whole planning pipeline, program in, plan out.
//!
//! program ──expand composites──> unfused baseline
//! program ──e-graph──saturate (staged rulesets, budgets)──extract (e-nodes + fusion)──> plan
//! The two halves are `saturate_program` and `plan_saturated`, so that plans with other
//! extractors, profiles or fusion off can share one saturation.
//! Invariant: a plan always comes out (at worst the unfused one); budgets only shorten the search.
//! `time_limit` is one deadline for the whole command ([`OptimizeOptions::deadline`]):
//! saturation may take half of it, extraction and the fusion searches what is left, and the
//! plan says what the deadline cut (`search.time_limit_cut`).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use egg::Id;

use crate::autodiff::expand::expand_composites;
use crate::cost::profile::DeviceProfile;
use crate::error::{Error, Result};
use crate::ir::lang::{Kind, TensorLang};
use crate::ir::program::Program;
use crate::plan::dag::{Dag, Role};
use crate::plan::render::human_bytes;
use crate::plan::{FusionPlan, SearchReport, Totals};
use crate::search::analysis::{ShapeAnalysis, TensorGraph};
use crate::search::deadline::Deadline;
use crate::search::extract::{better_plan, build_plan, extract, scored_by, ExtractOptions, Extracted};
use crate::search::fuse::Fusion;
use crate::search::saturate::{saturate_egraph, Budgets};

/// Everything `eqfuse optimize` can be told.
#[derive(Clone, Debug)]
pub struct OptimizeOptions {
    pub profile: DeviceProfile,
    /// When false, every computed tensor is its own kernel.
    pub fusion: bool,
    /// Rulesets to use instead of the built-in ones, as loaded: [`crate::load_rules_dir`] checks
    /// every rule's soundness on the reference (what `--rules DIR` does); rulesets built
    /// otherwise ([`crate::parse_ruleset`]) are used as they are.
    pub rules: Option<std::sync::Arc<Vec<crate::search::rules::RuleSet>>>,
    pub node_limit: usize,
    pub iter_limit: usize,
    /// Wall time for the whole planning command: saturation, extraction, the fusion searches
    /// and the ILP together. When it runs out, the best complete plan found so far comes out
    /// (at worst the unfused plan), and `search.time_limit_cut` says what was cut. The library's
    /// default is a generous 60 s, a safety net that leaves plans independent of the machine's
    /// speed (an unoptimised test build on a busy machine included); the CLI's `--time-limit`
    /// defaults to 2 s.
    pub time_limit: Duration,
    /// The deadline that `time_limit` sets, fixed when planning starts ([`optimize`] sets it
    /// when `None`); give one to bound several calls (a saturation and its plans) together.
    pub deadline: Option<Deadline>,
    /// `greedy` or `ilp`.
    pub extractor: String,
    /// The ILP solver's own time limit (then its LP relaxation bounds), within the command's
    /// deadline; `None`: half of the time the searches have left.
    pub ilp_time_limit: Option<Duration>,
    /// Strict numerics: rules marked `:inexact` are left out, and the plan asks code generation
    /// for the unfused plan's exact floating-point behaviour (see [`SearchReport::strict`]).
    pub strict: bool,
    /// Record why classes merged (egg's explanations; slower), so that
    /// [`Optimized::rules_used`] can name the rules the chosen form depends on (`explain`).
    pub explanations: bool,
    /// Most bytes of live device tensors the plan may need at once (`--memory-budget`): the
    /// planner recomputes saved tensors instead of writing them until the peak fits, or fails
    /// saying that no plan fits and the smallest peak it found.
    pub memory_budget: Option<u64>,
}

impl OptimizeOptions {
    /// The deadline of this planning command: the one given, or `time_limit` from now.
    pub fn command_deadline(&self) -> Deadline {
        self.deadline.unwrap_or_else(|| Deadline::after(self.time_limit))
    }

    pub fn new(profile: DeviceProfile) -> OptimizeOptions {
        OptimizeOptions {
            profile,
            fusion: true,
            rules: None,
            node_limit: 20_000,
            iter_limit: 12,
            time_limit: Duration::from_secs(60),
            deadline: None,
            extractor: "greedy".into(),
            ilp_time_limit: None,
            strict: false,
            explanations: false,
            memory_budget: None,
        }
    }
}

/// A plan and what `explain` tells about it.
#[derive(Clone, Debug)]
pub struct Optimized {
    pub plan: FusionPlan,
    /// Per ruleset stage: (ruleset, iterations, stop reason, rules fired with counts).
    pub stages: Vec<StageSummary>,
    /// Composite operators in the plan that the program did not write.
    pub recognised: Vec<String>,
    /// With [`OptimizeOptions::explanations`]: the rules on the proof that each output's chosen
    /// form equals the program's (egg's explanation of the equivalence), sorted, with whether
    /// each is `:inexact`. `None` when explanations were off.
    pub rules_used: Option<Vec<(String, bool)>>,
}

/// One saturation stage, as reported.
#[derive(Clone, Debug, PartialEq)]
pub struct StageSummary {
    pub ruleset: String,
    pub iterations: usize,
    pub stop_reason: String,
    /// The stop reason with the limit that stopped the stage (`StageReport::stop_detail`).
    pub stop_detail: String,
    pub fired: BTreeMap<String, usize>,
}

/// Cost of the program as written, every primitive op its own kernel.
pub fn unfused_totals(program: &Program, profile: &DeviceProfile) -> Result<Totals> {
    let expanded = expand_composites(program).map_err(Error::Invalid)?;
    let dag = Dag::from_program(&expanded);
    let f = Fusion::try_unfused(&dag, profile).map_err(Error::Invalid)?;
    let groups = f.ordered();
    Ok(Totals {
        kernels: groups.len(),
        bytes: groups.iter().map(|g| g.cost.bytes_read(f.group_write_bytes(g)) + f.group_write_bytes(g)).sum(),
        flops: crate::plan::saturating_sum(groups.iter().map(|g| g.cost.flops)),
        predicted_us: crate::search::residency::ordered_times(&dag, &f, profile).iter().sum(),
    })
}

/// The e-graph of a program, its output roots and the names of its bound classes.
pub fn egraph_of(program: &Program) -> (TensorGraph, Vec<(String, Id)>, BTreeMap<Id, String>) {
    egraph_with(program, false)
}

/// [`egraph_of`], with egg's explanations enabled or not.
fn egraph_with(program: &Program, explanations: bool) -> (TensorGraph, Vec<(String, Id)>, BTreeMap<Id, String>) {
    let analysis = ShapeAnalysis::new(program.inputs.iter().map(|i| (i.name.clone(), i.ty.clone())));
    let mut egraph = TensorGraph::new(analysis);
    if explanations {
        egraph = egraph.with_explanations_enabled();
    }
    let live = program.live();
    let mut map: Vec<Id> = Vec::with_capacity(program.len());
    for (i, node) in program.expr().as_ref().iter().enumerate() {
        let n = egg::Language::map_children(node.clone(), |c| map[usize::from(c)]);
        let id = if live[i] { egraph.add(n) } else { Id::from(0) };
        map.push(id);
    }
    egraph.rebuild();
    let mut names = BTreeMap::new();
    for i in 0..program.len() {
        if let (true, Some(name)) = (live[i], program.name(Id::from(i))) {
            names.entry(egraph.find(map[i])).or_insert_with(|| name.to_string());
        }
    }
    let roots = program.outputs.iter().map(|o| (o.name.clone(), egraph.find(map[usize::from(o.id)]))).collect();
    (egraph, roots, names)
}

/// A program's saturated e-graph: what planning starts from. Several plans (other extractors,
/// profiles, fusion off) may share one, since saturation does not depend on them.
pub struct Saturated {
    pub egraph: TensorGraph,
    /// The output names and their classes (canonical).
    pub roots: Vec<(String, Id)>,
    /// Program names of bound classes (canonical).
    pub names: BTreeMap<Id, String>,
    pub stages: Vec<StageSummary>,
    pub iterations: usize,
    pub stop_reason: String,
    /// The stop reason with the limit that stopped saturation (see `SearchReport::stop_detail`).
    pub stop_detail: String,
    pub saturate_ms: f64,
}

/// Plans a program: [`saturate_program`], then [`plan_saturated`]. `grad` nodes (which a program
/// built through the library may hold) are differentiated first, so the plan is of the joint
/// forward and backward graph.
pub fn optimize(program: &Program, opts: &OptimizeOptions) -> Result<Optimized> {
    if opts.deadline.is_none() {
        let o = OptimizeOptions { deadline: Some(opts.command_deadline()), ..opts.clone() };
        return optimize(program, &o);
    }
    if crate::autodiff::has_grads(program) {
        return optimize(&crate::autodiff::expand_grads(program)?, opts);
    }
    if let Some(p) = crate::autodiff::expand::expand_for_planning(program, opts.strict).map_err(Error::Invalid)? {
        return optimize(&p, opts);
    }
    if opts.strict && !opts.profile.strict {
        let mut o = opts.clone();
        o.profile.strict = true;
        return optimize(program, &o);
    }
    plan_saturated(program, &saturate_program(program, opts)?, opts)
}

/// Puts a program into an e-graph and runs the rulesets over it within `opts`' budgets.
pub fn saturate_program(program: &Program, opts: &OptimizeOptions) -> Result<Saturated> {
    let (egraph, roots, names) = egraph_with(program, opts.explanations);
    let t0 = Instant::now();
    let (egraph, stages, iterations, stop_reason, stop_detail) = run_stages(egraph, opts)?;
    let saturate_ms = t0.elapsed().as_secs_f64() * 1e3;
    let roots: Vec<(String, Id)> = roots.into_iter().map(|(n, r)| (n, egraph.find(r))).collect();
    let names: BTreeMap<Id, String> = names.into_iter().fold(BTreeMap::new(), |mut m, (c, n)| {
        m.entry(egraph.find(c)).or_insert(n);
        m
    });
    Ok(Saturated { egraph, roots, names, stages, iterations, stop_reason, stop_detail, saturate_ms })
}

/// Extracts a plan from a program's saturated e-graph with `opts`' profile, extractor and
/// fusion setting, within what is left of the command's deadline (saturation spent its share;
/// extraction, the fusion searches and the ILP share the rest).
pub fn plan_saturated(program: &Program, sat: &Saturated, opts: &OptimizeOptions) -> Result<Optimized> {
    let deadline = opts.command_deadline();
    let mut cut: Vec<String> = vec![];
    if sat.stages.iter().any(|s| s.stop_reason == "time-limit") {
        cut.push("saturation".into());
    }
    let unfused = unfused_totals(program, &opts.profile)?;
    let (egraph, roots, names) = (&sat.egraph, &sat.roots, &sat.names);
    let t1 = Instant::now();
    let start = crate::search::extract::written_selection(program, egraph);
    // The searches leave a tenth of what is left for building the plan (its time model, notes and
    // memory report, linear in its length); the ILP, when asked for, takes half of the rest.
    let searches = deadline.share(0.9);
    let ex_deadline = if opts.extractor == "ilp" { searches.share(0.5) } else { searches };
    let ex_opts = ExtractOptions { fusion: opts.fusion, start, deadline: ex_deadline, ..ExtractOptions::default() };
    let mut best = extract(egraph, roots, names, &opts.profile, &ex_opts).map_err(Error::Invalid)?;
    cut.append(&mut best.cut);
    let mut extractor = if opts.fusion { "greedy-dag".to_string() } else { "no-fusion".to_string() };
    let (mut gap, mut lower_bound_us) = (None, None);
    if opts.extractor == "ilp" && searches.expired() {
        extractor = format!("{extractor} (ilp skipped: the time limit was reached)");
        cut.push("the ILP".into());
    } else if opts.extractor == "ilp" {
        let root_ids: Vec<Id> = roots.iter().map(|(_, r)| *r).collect();
        let ilp_time = opts.ilp_time_limit.unwrap_or(opts.time_limit).min(searches.share(0.5).remaining());
        match crate::search::ilp::solve(egraph, &root_ids, &opts.profile, ilp_time) {
            Ok(r) => {
                if let Some(sel) = &r.selection {
                    let scoredd =
                        scored_by(egraph, sel, roots, names, &opts.profile, opts.fusion, true, searches, None, None);
                    if let Ok((dag, t, bytes, parts)) = scoredd {
                        if better_plan(t, bytes, best.predicted_us, best.bytes) {
                            best = Extracted {
                                dag,
                                selection: sel.clone(),
                                predicted_us: t,
                                bytes,
                                fusion: Some(parts),
                                cut: vec![],
                            };
                        }
                    }
                }
                let bound = if r.proven_optimal { "ilp" } else { "ilp-lp-bound" };
                extractor = format!("{extractor}+{bound}");
                gap = Some(round3(((best.predicted_us - r.lower_bound_us) / best.predicted_us).max(0.0)));
                lower_bound_us = Some(r.lower_bound_us);
            }
            Err(why) => extractor = format!("{extractor} (ilp skipped: {why})"),
        }
    }
    // 1-bit masks only where codegen cannot run the kernels anyway or runs them packed: a mask
    // that a generated kernel would store or load unpacked makes the search run again without it.
    // The fusion state extraction found is the plan's; it is searched again only then.
    let mut parts = best.fusion.take();
    loop {
        let unpack: Vec<usize> = {
            let f = match parts.take() {
                Some(p) => Fusion::from_parts(&best.dag, &opts.profile, p),
                None => {
                    let mut f =
                        Fusion::try_unfused(&best.dag, &opts.profile).map_err(Error::Invalid)?.with_deadline(searches);
                    if opts.fusion {
                        f.optimise_with_materialize();
                    }
                    f
                }
            };
            let unpack = masks_codegen_cannot_run(&best.dag, &f);
            if unpack.is_empty() {
                parts = Some(f.into_parts());
            }
            unpack
        };
        if unpack.is_empty() {
            break;
        }
        for i in unpack {
            best.dag.packed[i] = false;
        }
    }
    // The greedy fusion of the extracted form can, on rare small programs, predict slower than
    // the program as written; then the program's own form, fused the same way, or unfused, is
    // the plan (a plan never predicts slower than the unfused one).
    let own_dag: Dag;
    let mut dag = &best.dag;
    let state = parts.expect("the loop keeps the state");
    let mut fusion = Fusion::from_parts(dag, &opts.profile, state).with_deadline(deadline);
    if fusion.cut && !cut.iter().any(|c| c.contains("fusion search")) {
        cut.push("the fusion search of the chosen form".into());
    }
    if opts.fusion {
        let time =
            |dag: &Dag, f: &Fusion| crate::search::residency::ordered_times(dag, f, &opts.profile).iter().sum::<f64>();
        if time(dag, &fusion) > unfused.predicted_us * (1.0 + 1e-9) {
            let expanded = crate::autodiff::expand::expand_composites(program).map_err(Error::Invalid)?;
            own_dag = Dag::from_program(&expanded);
            dag = &own_dag;
            fusion = Fusion::try_unfused(dag, &opts.profile).map_err(Error::Invalid)?.with_deadline(deadline);
            fusion.optimise_with_materialize();
            if time(dag, &fusion) > unfused.predicted_us * (1.0 + 1e-9) {
                fusion = Fusion::try_unfused(dag, &opts.profile).map_err(Error::Invalid)?.with_deadline(deadline);
            }
            extractor = format!("{extractor} (fell back to the program as written)");
        }
    }
    if let Some(budget) = opts.memory_budget {
        let inputs: Vec<(String, crate::ir::types::TensorType)> =
            program.inputs.iter().map(|i| (i.name.clone(), i.ty.clone())).collect();
        fusion = crate::search::memory_fit::fit_budget(dag, fusion, &inputs, budget).map_err(|m| {
            let io = m.inputs_bytes + m.outputs_bytes;
            Error::Invalid(format!(
                "no plan of {} fits the memory budget of {budget} bytes ({}): the smallest peak found is {} bytes \
                 ({}){}, after recomputing every saved tensor that lowered it (a matrix product's operands stay saved); the inputs and outputs alone take {io} bytes ({})",
                program.source,
                human_bytes(budget),
                m.peak_bytes,
                human_bytes(m.peak_bytes),
                m.peak_kernel.map_or(String::new(), |k| format!(" at kernel {k}")),
                human_bytes(io)
            ))
        })?;
    }
    let extract_ms = t1.elapsed().as_secs_f64() * 1e3;
    let search = SearchReport {
        iterations: sat.iterations,
        enodes: egraph.total_number_of_nodes(),
        eclasses: egraph.number_of_classes(),
        stop_reason: sat.stop_reason.clone(),
        saturate_ms: round3(sat.saturate_ms),
        extract_ms: round3(extract_ms),
        extractor,
        gap,
        lower_bound_us,
        strict: opts.strict,
        stop_detail: sat.stop_detail.clone(),
        time_limit_s: opts.time_limit.as_secs_f64(),
        time_limit_cut: cut,
    };
    let mut plan = build_plan(program, dag, &fusion, &opts.profile, unfused, search);
    plan.memory.budget_bytes = opts.memory_budget;
    let recognised = recognised_composites(program, dag);
    let rules_used = sat.egraph.are_explanations_enabled().then(|| rules_used(program, &sat.egraph, dag, opts));
    Ok(Optimized { plan, stages: sat.stages.clone(), recognised, rules_used })
}

/// The rules egg's explanations put on the proofs that each output's chosen form equals the
/// program's, with whether each is inexact.
fn rules_used(program: &Program, egraph: &TensorGraph, dag: &Dag, opts: &OptimizeOptions) -> Vec<(String, bool)> {
    let mut egraph = egraph.clone();
    // A deadline may stop saturation between a union and its rebuild: explanations and lookups
    // need a rebuilt e-graph.
    egraph.rebuild();
    let prefix = |nodes: &[TensorLang], end: usize| -> egg::RecExpr<TensorLang> { nodes[..=end].to_vec().into() };
    let chosen: Vec<TensorLang> = dag.nodes.iter().map(|n| n.node.clone()).collect();
    let mut names = std::collections::BTreeSet::new();
    for (o, (_, d)) in program.outputs.iter().zip(&dag.outputs) {
        let written = prefix(program.expr().as_ref(), usize::from(o.id));
        let form = prefix(&chosen, *d);
        // egg explains only terms of one class (it panics otherwise); an output whose chosen
        // form the e-graph does not hold as such contributes no rules.
        let same = matches!((egraph.lookup_expr(&written), egraph.lookup_expr(&form)), (Some(a), Some(b)) if a == b);
        if !same {
            continue;
        }
        let ex = egraph.explain_equivalence(&written, &form);
        collect_rules(&ex.explanation_trees, &mut names, &mut std::collections::HashSet::new());
    }
    let sets = match &opts.rules {
        Some(sets) => Ok(sets.to_vec()),
        None => crate::search::rules::default_rules(),
    }
    .unwrap_or_default();
    names
        .into_iter()
        .map(|n| {
            let inexact = sets.iter().any(|s| s.is_inexact(&n));
            (n, inexact)
        })
        .collect()
}

/// The rules of a tree explanation. Subproofs of shared subterms are shared (`Rc`): each is
/// walked once, where the flat explanation would write a term used twice out twice at every
/// level (exponential in a chain of such terms).
fn collect_rules(
    proof: &egg::TreeExplanation<TensorLang>,
    out: &mut std::collections::BTreeSet<String>,
    seen: &mut std::collections::HashSet<*const egg::TreeTerm<TensorLang>>,
) {
    for t in proof {
        if !seen.insert(std::rc::Rc::as_ptr(t)) {
            continue;
        }
        for r in [&t.forward_rule, &t.backward_rule].into_iter().flatten() {
            out.insert(r.to_string());
        }
        for c in &t.child_proofs {
            collect_rules(c, out, seen);
        }
    }
}

/// Packed masks that codegen cannot run: a kernel of the fusion writes or reads one where
/// `caps::mask_refusal` (the rule code generation refuses kernels by) says it cannot.
fn masks_codegen_cannot_run(dag: &Dag, f: &Fusion) -> Vec<usize> {
    use crate::codegen::caps::{mask_refusal, reduces_rows_op, MaskAccess, MaskSite};
    let groups = f.ordered();
    (0..dag.len())
        .filter(|&i| dag.is_packed(i) && f.mat[i])
        .filter(|&i| {
            let shape = dag.nodes[i].ty().map(|t| t.shape.as_slice());
            groups.iter().any(|g| {
                let site = MaskSite {
                    template: g.cost.template,
                    cublaslt: g.cost.implementation == Some(crate::plan::GemmImpl::Cublaslt),
                    domain: &g.cost.domain,
                    reduces_rows: g.cost.body.iter().any(|&b| dag.nodes[b].kind().is_some_and(reduces_rows_op)),
                };
                let bad_writer =
                    g.members.contains(&i) && shape.is_none_or(|s| mask_refusal(&site, MaskAccess::Store(s)).is_some());
                let bad_reader = g.cost.reads.contains(&i) && mask_refusal(&site, MaskAccess::Load).is_some();
                bad_writer || bad_reader
            })
        })
        .collect()
}

fn round3(x: f64) -> f64 {
    (x * 1e3).round() / 1e3
}

/// Composite operators in the chosen form that the program did not contain.
fn recognised_composites(program: &Program, dag: &Dag) -> Vec<String> {
    let written: std::collections::BTreeSet<&str> = program
        .expr()
        .as_ref()
        .iter()
        .filter(|n| matches!(n.opcode().map(|c| c.kind()), Some(Kind::Composite(_))))
        .map(|n| n.opcode().map_or("", |c| c.name()))
        .collect();
    dag.nodes
        .iter()
        .filter(|n| n.role == Role::Compute && matches!(n.kind(), Some(Kind::Composite(_))))
        .filter_map(|n| n.node.opcode().map(|c| c.name()))
        .filter(|name| !written.contains(name))
        .map(str::to_string)
        .collect()
}

/// Runs the rulesets (built-in, or from `--rules DIR`) over the e-graph.
/// Saturation may take half of the time left of the command's deadline.
type StagesRun = (TensorGraph, Vec<StageSummary>, usize, String, String);

fn run_stages(egraph: TensorGraph, opts: &OptimizeOptions) -> Result<StagesRun> {
    let mut rulesets = match &opts.rules {
        Some(sets) => sets.to_vec(),
        None => crate::search::rules::default_rules()?,
    };
    if opts.strict {
        for set in &mut rulesets {
            set.rules.retain(|r| !r.inexact);
            set.native.retain(|r| !r.inexact);
        }
    }
    let budgets = Budgets::default()
        .with_iter_limit(opts.iter_limit)
        .with_node_limit(opts.node_limit)
        .with_time_limit(opts.time_limit.min(opts.command_deadline().share(0.5).remaining()));
    let sat = saturate_egraph(egraph, vec![], &rulesets, &budgets)?;
    let stages = sat
        .stages
        .iter()
        .map(|st| StageSummary {
            ruleset: st.ruleset.clone(),
            iterations: st.iterations,
            stop_reason: st.stop_reason.to_string(),
            stop_detail: st.stop_detail.clone(),
            fired: st.fired.clone(),
        })
        .collect();
    Ok((sat.egraph, stages, sat.iterations, sat.stop_reason.to_string(), sat.stop_detail))
}
