//! Extraction: from a saturated e-graph to a [`FusionPlan`].
//!
//! Two choices are made together: the e-node of each needed e-class (which algebraic form), and
//! the fusion state over the chosen form (which tensors are materialized, which kernels share
//! work; see `fuse.rs`). E-nodes start from a local choice (the cheapest form if every operator
//! were its own kernel, so composites that one template runs win over their decompositions);
//! then single-class switches are tried, each judged by re-running fusion on the whole form,
//! and kept when the fused plan gets faster.
//! Invariant: extraction never touches the GPU, and equal inputs give byte-identical plans
//! (unless the deadline cuts it: then it returns the best complete plan it has, and says what
//! it cut in [`Extracted::cut`]).

use std::collections::BTreeMap;

use egg::{CostFunction, Extractor, Id, Language, RecExpr, Symbol};

use crate::cost::profile::DeviceProfile;
use crate::ir::lang::TensorLang;
use crate::ir::program::Program;
use crate::ir::types::TensorType;
use crate::plan::dag::{role_of, Dag, DagNode, Role};
use crate::plan::{FusionPlan, Kernel, SearchReport, TensorRef, Totals};
use crate::search::analysis::TensorGraph;
use crate::search::deadline::Deadline;
use crate::search::fuse::{Fusion, FusionParts};

/// The cost of a form if each operator ran as its own kernel: the local guide for e-node choice.
struct LocalCost<'a> {
    egraph: &'a TensorGraph,
    profile: &'a DeviceProfile,
}

impl CostFunction<TensorLang> for LocalCost<'_> {
    type Cost = f64;

    fn cost<C: FnMut(Id) -> f64>(&mut self, enode: &TensorLang, mut costs: C) -> f64 {
        let eg = self.egraph;
        let Some(fact) = eg.analysis.node_fact(enode, |c| eg[c].data.fact.clone()) else {
            return f64::INFINITY;
        };
        let children: f64 = enode.children().iter().map(|&c| costs(c)).sum();
        let own = match role_of(enode) {
            Role::Leaf | Role::Input => 0.0,
            // A tiny cost keeps identity cycles (`reshape` of a `reshape`) out of the choice.
            Role::View => 1e-6,
            Role::Compute => {
                let bytes: u64 =
                    enode.children().iter().filter_map(|&c| eg[c].data.ty()).map(|t| t.bytes()).sum::<u64>()
                        + fact.ty.as_ref().map_or(0, |t| t.bytes());
                self.profile.launch_overhead_us
                    + 1e6 * bytes as f64 / (self.profile.copy_bandwidth_gbs * 1e9)
                    + 1e-6 * enode.children().len() as f64
            }
        };
        own + children
    }
}

/// A choice of e-node per e-class.
pub type Selection = BTreeMap<Id, TensorLang>;

/// Builds the DAG of a selection from the roots; class names come from `names`.
pub fn dag_of(
    egraph: &TensorGraph,
    selection: &Selection,
    roots: &[(String, Id)],
    names: &BTreeMap<Id, String>,
) -> Result<Dag, String> {
    let mut index: BTreeMap<Id, usize> = BTreeMap::new();
    let mut nodes: Vec<DagNode> = Vec::new();
    // Iterative post-order, so deep programs do not overflow the stack.
    for (_, root) in roots {
        let mut stack = vec![(egraph.find(*root), false)];
        let mut on_path = std::collections::BTreeSet::new();
        while let Some((c, expanded)) = stack.pop() {
            if index.contains_key(&c) {
                continue;
            }
            let node = selection.get(&c).ok_or_else(|| format!("class {c} has no chosen node"))?;
            let node = written_literal(egraph, c, node);
            if expanded {
                on_path.remove(&c);
                let n = node.clone().map_children(|ch| Id::from(index[&egraph.find(ch)]));
                let mut fact = egraph[c].data.fact.clone().ok_or_else(|| format!("class {c} is ill typed"))?;
                if let TensorLang::Num(v) = &n {
                    fact.konst = Some(v.value());
                }
                index.insert(c, nodes.len());
                nodes.push(DagNode { role: role_of(&n), node: n, fact, name: names.get(&c).cloned(), class: Some(c) });
                continue;
            }
            if !on_path.insert(c) {
                return Err(format!("the chosen form is cyclic at class {c}"));
            }
            stack.push((c, true));
            for &ch in node.children().iter().rev() {
                let ch = egraph.find(ch);
                if !index.contains_key(&ch) {
                    if on_path.contains(&ch) {
                        return Err(format!("the chosen form is cyclic at class {ch}"));
                    }
                    stack.push((ch, false));
                }
            }
        }
    }
    let outputs = roots.iter().map(|(n, r)| (n.clone(), index[&egraph.find(*r)])).collect();
    Ok(Dag::finish(nodes, outputs).pack_masks())
}

/// The literal a class is written as when its chosen node is a literal: of the class's literals
/// (all of cost 0), the shortest to write. An inexact rule can merge a folded constant with a
/// literal the program wrote (`log(exp(1))`, folded to 0.9999999999999999, with the axis `1`);
/// the program's literal is then the exact one, where an axis or a flag needs an integer (found
/// by the GPU differential test's prefill run, tests/cases/diff_gpu/case_9fa2ed95.eqf). Only the
/// literal is swapped, so no cost and no other choice changes.
fn written_literal<'a>(egraph: &'a TensorGraph, c: Id, chosen: &'a TensorLang) -> &'a TensorLang {
    if !matches!(chosen, TensorLang::Num(_)) {
        return chosen;
    }
    egraph[c]
        .nodes
        .iter()
        .filter_map(|n| match n {
            TensorLang::Num(v) => Some((v.value().to_string(), n)),
            _ => None,
        })
        .min_by(|(a, _), (b, _)| a.len().cmp(&b.len()).then_with(|| a.cmp(b)))
        .map_or(chosen, |(_, n)| n)
}

/// The local (unfused-cost) choice for every class.
///
/// This is exactly what egg's [`Extractor`] with `LocalCost` chooses, ties included, computed
/// without its cost: egg repeats passes over every class until no cost improves, which on a
/// long chain takes a pass per few links (quadratic in the program's length). Here a class is
/// evaluated again only when one of its children's cost improved, in the pass and at the place
/// in the pass where egg would see it (a child earlier in egg's class order: this pass; later
/// or itself: the next), and each e-node's own cost is computed once.
pub fn local_selection(egraph: &TensorGraph, profile: &DeviceProfile) -> Selection {
    let order: Vec<Id> = egraph.classes().map(|c| c.id).collect();
    let pos: std::collections::HashMap<Id, usize> = order.iter().enumerate().map(|(i, &c)| (c, i)).collect();
    let mut lc = LocalCost { egraph, profile };
    // Each node's children (as class positions) and its own cost: LocalCost with free children.
    let nodes: Vec<Vec<(Vec<usize>, f64)>> = order
        .iter()
        .map(|&c| {
            egraph[c]
                .nodes
                .iter()
                .map(|n| {
                    let children = n.children().iter().map(|&ch| pos[&egraph.find(ch)]).collect();
                    (children, lc.cost(n, |_| 0.0))
                })
                .collect()
        })
        .collect();
    let mut parents: Vec<Vec<usize>> = vec![vec![]; order.len()];
    for (i, ns) in nodes.iter().enumerate() {
        for (children, _) in ns {
            for &ch in children {
                if parents[ch].last() != Some(&i) {
                    parents[ch].push(i);
                }
            }
        }
    }
    let mut cost: Vec<Option<(f64, usize)>> = vec![None; order.len()];
    let mut events: std::collections::BTreeSet<(usize, usize)> = (0..order.len()).map(|i| (0, i)).collect();
    while let Some((pass, i)) = events.pop_first() {
        // egg's `make_pass`: the first node of least cost among those whose children all have one.
        let mut best: Option<(f64, usize)> = None;
        for (k, (children, own)) in nodes[i].iter().enumerate() {
            let Some(sum) = children.iter().map(|&ch| cost[ch].map(|c| c.0)).sum::<Option<f64>>() else { continue };
            // LocalCost: an ill-typed node is infinite whatever its children; otherwise its
            // own cost plus its children's (summed first, as LocalCost sums them).
            let total = if own.is_infinite() { *own } else { own + sum };
            if best.is_none_or(|(b, _)| total.partial_cmp(&b) == Some(std::cmp::Ordering::Less)) {
                best = Some((total, k));
            }
        }
        let better = match (cost[i], best) {
            (None, Some(_)) => true,
            (Some(old), Some(new)) => new.0 < old.0,
            _ => false,
        };
        if better {
            cost[i] = best;
            for &p in &parents[i] {
                events.insert(if p > i { (pass, p) } else { (pass + 1, p) });
            }
        }
    }
    // egg keeps the classes of finite cost. A tree cost counts a shared value once per use, so on
    // a long chain with skip connections it grows geometrically and overflows (past about 4,000
    // bindings of `t_i = f(t_(i-1)) * y + t_(i-7)`); a class whose cost overflowed is kept too,
    // with its choice, when that node and everything below it is well typed.
    let mut kept: Vec<Option<bool>> = cost.iter().map(|c| c.map(|(t, _)| t.is_finite().then_some(true))?).collect();
    for i in 0..order.len() {
        if kept[i].is_some() || cost[i].is_none() {
            continue;
        }
        // Iterative: a chain's depth would overflow the stack.
        let mut stack = vec![(i, false)];
        let mut on_path = std::collections::BTreeSet::new();
        while let Some((j, expanded)) = stack.pop() {
            if kept[j].is_some() {
                continue;
            }
            let Some((_, k)) = cost[j] else {
                kept[j] = Some(false);
                continue;
            };
            let (children, own) = &nodes[j][k];
            if expanded {
                on_path.remove(&j);
                kept[j] = Some(own.is_finite() && children.iter().all(|&ch| kept[ch] == Some(true)));
            } else if !on_path.insert(j) {
                kept[j] = Some(false);
            } else {
                stack.push((j, true));
                stack.extend(
                    children.iter().filter(|&&ch| kept[ch].is_none() && !on_path.contains(&ch)).map(|&ch| (ch, false)),
                );
            }
        }
    }
    order
        .iter()
        .enumerate()
        .filter_map(|(i, &c)| {
            let (_, k) = cost[i]?;
            (kept[i] == Some(true)).then(|| (c, egraph[c].nodes[k].clone()))
        })
        .collect()
}

/// [`local_selection`] as egg's own [`Extractor`] computes it (for tests: the two agree).
#[doc(hidden)]
pub fn local_selection_by_egg(egraph: &TensorGraph, profile: &DeviceProfile) -> Selection {
    let ex = Extractor::new(egraph, LocalCost { egraph, profile });
    egraph
        .classes()
        .filter_map(|c| {
            let (cost, _) = ex.find_best(c.id);
            cost.is_finite().then(|| (c.id, ex.find_best_node(c.id).clone()))
        })
        .collect()
}

/// The program's own form in its saturated e-graph: each class gets the e-node of the first
/// program node in it. A chosen node's children are earlier program nodes, whose classes' first
/// nodes are earlier still, so the choice is acyclic. `None` if a node is not in the e-graph.
///
/// Starting the search from it as well keeps a form the local choice would break apart: the
/// joint forward and backward graph of autodiff shares forward values (a log-softmax's `exp`
/// and `sum`) that the local choice would replace with a composite per use.
pub fn written_selection(program: &Program, egraph: &TensorGraph) -> Option<Selection> {
    let live = program.live();
    let mut class: Vec<Option<Id>> = vec![None; program.len()];
    let mut selection = Selection::new();
    for (i, node) in program.expr().as_ref().iter().enumerate() {
        if !live[i] {
            continue;
        }
        let mut n = node.clone();
        for c in n.children_mut() {
            *c = class[usize::from(*c)]?;
        }
        let id = egraph.lookup(n.clone())?;
        selection.entry(id).or_insert(n);
        class[i] = Some(id);
    }
    Some(selection)
}

/// Options for extraction.
#[derive(Clone, Debug)]
pub struct ExtractOptions {
    /// When false, every computed tensor is its own kernel (`--no-fusion`).
    pub fusion: bool,
    /// Most e-node switches tried after the first plan. A count, not a time, so that the plan
    /// does not depend on the machine's speed.
    pub max_trials: usize,
    /// Another starting form, searched from as well as the local choice (the program as
    /// written, see [`written_selection`]); the faster result wins, ties keep the local one.
    pub start: Option<Selection>,
    /// When to stop: the starts and their e-node switches take half of the time left, the
    /// whole search of the candidates the rest; the first start is always planned (its fusion
    /// search stopped where the deadline finds it).
    pub deadline: Deadline,
}

impl Default for ExtractOptions {
    fn default() -> Self {
        ExtractOptions { fusion: true, max_trials: 64, start: None, deadline: Deadline::never() }
    }
}

/// A fused form: the DAG and its fusion state's predicted time.
pub struct Extracted {
    pub dag: Dag,
    pub selection: Selection,
    pub predicted_us: f64,
    /// Bytes the fused plan moves (the tie-break between plans of equal predicted time).
    pub bytes: u64,
    /// The fusion state of the plan over `dag` (kept, so that the plan need not be searched
    /// again), when extraction made one.
    pub fusion: Option<FusionParts>,
    /// What the deadline cut short, as phrases for the plan's `search.time_limit_cut`.
    pub cut: Vec<String>,
}

/// Whether a plan of (time, bytes) beats another: faster, or as fast with fewer bytes moved.
pub fn better_plan(t: f64, bytes: u64, than_t: f64, than_bytes: u64) -> bool {
    t < than_t - 1e-6 || (t <= than_t + 1e-6 && bytes < than_bytes)
}

/// Chooses e-nodes and fusion jointly; returns the DAG of the best form found.
pub fn extract(
    egraph: &TensorGraph,
    roots: &[(String, Id)],
    names: &BTreeMap<Id, String>,
    profile: &DeviceProfile,
    opts: &ExtractOptions,
) -> Result<Extracted, String> {
    let local = local_selection(egraph, profile);
    let first_half = opts.deadline.share(0.5);
    let cost_of =
        |sel: &Selection| scored_by(egraph, sel, roots, names, profile, opts.fusion, false, first_half, None, None);
    let mut cut: Vec<String> = vec![];
    // The best plan of the first half (greedy fusion alone): complete, so it is the plan if the
    // deadline cuts every whole search after it.
    let mut first: Option<Extracted> = None;
    // Each start and its improvement are candidates. Switches are judged by greedy fusion alone
    // (cheap, so many can be tried); the candidates are judged by the whole search the plan is
    // built with (greedy fusion, recomputation first, materialize rounds: `planned_cost`), which
    // can turn a form that greedy fusion judged worse into the better plan (the layernorm
    // backward as written: `dy * xhat` recomputed in the gamma-gradient column kernel from the
    // saved row statistics, where the switch to an `rmsnorm` composite wins under greedy fusion
    // alone but then needs `dy * xhat` written).
    // Each with the state greedy fusion reached on it, which the whole search starts from.
    std::thread::scope(|scope| {
        let mut candidates: Vec<Selection> = vec![];
        let mut greedy_states: Vec<Option<FusionParts>> = vec![];
        let mut starts = vec![local];
        starts.extend(opts.start.clone());
        // The whole search of every start is made (each start is a candidate, or equal to one), and
        // its first half (`Fusion::inline_first`) depends on the start alone: it is searched ahead
        // on a second thread while this one runs greedy fusion and the e-node switches.
        let ahead = opts.fusion.then(|| {
            let mut forms: Vec<Selection> = Vec::new();
            for s in &starts {
                if !forms.contains(s) {
                    forms.push(s.clone());
                }
            }
            scope.spawn(move || {
                forms
                    .into_iter()
                    .map(|sel| {
                        let parts = inline_first_state(egraph, &sel, roots, names, profile, opts.deadline);
                        (sel, parts)
                    })
                    .collect::<Vec<_>>()
            })
        });
        for (k, start) in starts.into_iter().enumerate() {
            // A start equal to an earlier one would be searched to the same result.
            if k > 0 && candidates.iter().skip(1).step_by(2).any(|c| *c == start) {
                continue;
            }
            if k > 0 && first_half.expired() {
                cut.push("the search from the program as written".into());
                continue;
            }
            let (dag, t, bytes, parts) = match cost_of(&start) {
                Ok(x) => x,
                Err(e) if k == 0 => return Err(e),
                Err(_) => continue,
            };
            if parts.cut {
                cut.push("the greedy fusion search of the first form".into());
            }
            let start_state = parts.clone();
            let from =
                Extracted { dag, selection: start.clone(), predicted_us: t, bytes, fusion: Some(parts), cut: vec![] };
            let (improved, trials) = improve(egraph, from, opts, first_half, &cost_of);
            if let Some((done, limit)) = trials {
                cut.push(format!("e-node switches after {done} of {limit} trials"));
            }
            candidates.push(improved.selection.clone());
            greedy_states.push(improved.fusion.clone());
            candidates.push(start);
            greedy_states.push(Some(start_state));
            if first
                .as_ref()
                .is_none_or(|b| better_plan(improved.predicted_us, improved.bytes, b.predicted_us, b.bytes))
            {
                first = Some(improved);
            }
        }
        let mut ahead: Vec<(Selection, Option<FusionParts>)> = match ahead {
            Some(h) => join(h),
            None => vec![],
        };
        let mut best: Option<Extracted> = None;
        let mut whole_cut = false;
        for (k, sel) in candidates.iter().enumerate() {
            // (A candidate scored before scores the same: it cannot be strictly better.)
            if candidates[..k].contains(sel) || best.as_ref().is_some_and(|b| b.selection == *sel) {
                continue;
            }
            let sel = sel.clone();
            if opts.deadline.expired() && (best.is_some() || first.is_some()) {
                whole_cut = true;
                break;
            }
            let greedy = greedy_states[k].take();
            let inline_first = ahead.iter_mut().find(|(s, _)| *s == sel).and_then(|(_, p)| p.take());
            let scored =
                scored_by(egraph, &sel, roots, names, profile, opts.fusion, true, opts.deadline, greedy, inline_first);
            let Ok((dag, t, bytes, parts)) = scored else { continue };
            whole_cut |= parts.cut;
            if best.as_ref().is_none_or(|b| better_plan(t, bytes, b.predicted_us, b.bytes)) {
                best =
                    Some(Extracted { dag, selection: sel, predicted_us: t, bytes, fusion: Some(parts), cut: vec![] });
            }
        }
        if whole_cut {
            cut.push("the whole fusion search (materialize rounds) of the candidate forms".into());
            // A cut search may leave a state worse than greedy fusion's complete one.
            if let Some(f) = first {
                if best.as_ref().is_none_or(|b| better_plan(f.predicted_us, f.bytes, b.predicted_us, b.bytes)) {
                    best = Some(f);
                }
            }
        }
        let mut best = best.ok_or_else(|| "no chosen form could be planned".to_string())?;
        best.cut = cut;
        Ok(best)
    })
}

/// The state [`Fusion::inline_first`] reaches on the form of a selection from its unfused state
/// (`None` when the selection has no form).
fn inline_first_state(
    egraph: &TensorGraph,
    selection: &Selection,
    roots: &[(String, Id)],
    names: &BTreeMap<Id, String>,
    profile: &DeviceProfile,
    deadline: Deadline,
) -> Option<FusionParts> {
    let dag = dag_of(egraph, selection, roots, names).ok()?;
    let unfused = Fusion::try_unfused(&dag, profile).ok()?.with_deadline(deadline);
    Some(unfused.inline_first().into_parts())
}

/// The fused cost of a selection: its DAG, predicted time, bytes and fusion state.
type CostOf<'a> = dyn Fn(&Selection) -> Result<(Dag, f64, u64, FusionParts), String> + Sync + 'a;

/// Single-class e-node switches from `from`, each kept when the fused plan gets faster; with
/// (trials made, trials allowed) when the deadline stopped them.
///
/// Most trials are not kept, so while one is judged, the next is judged ahead on a second
/// thread from the same form; when a trial is kept, the next is judged again from the new form.
/// The switches kept are those of judging one trial after another.
fn improve(
    egraph: &TensorGraph,
    from: Extracted,
    opts: &ExtractOptions,
    deadline: Deadline,
    cost_of: &CostOf,
) -> (Extracted, Option<(usize, usize)>) {
    let Extracted { mut dag, mut selection, predicted_us: mut best, bytes: mut best_bytes, mut fusion, cut } = from;
    let mut stopped = None;
    if opts.fusion {
        // Each trial re-plans the whole form, so large forms get fewer trials.
        let max_trials = (opts.max_trials * 100 / dag.len().max(1)).clamp(4.min(opts.max_trials), opts.max_trials);
        let mut trials = 0;
        let mut improved = true;
        std::thread::scope(|scope| {
            'search: while improved && trials < max_trials {
                improved = false;
                let alts = alternatives(egraph, &dag, &selection);
                // The next trial, judged ahead from the form as it is now.
                let mut ahead = None;
                for (i, switch) in alts.iter().enumerate() {
                    if trials >= max_trials {
                        break;
                    }
                    if deadline.expired() {
                        stopped = Some((trials, max_trials));
                        break 'search;
                    }
                    trials += 1;
                    let switched = |selection: &Selection, switch: &Switch| {
                        let mut trial = selection.clone();
                        for (class, alt) in switch {
                            trial.insert(*class, alt.clone());
                        }
                        trial
                    };
                    let trial = switched(&selection, switch);
                    let next = alts.get(i + 1).filter(|_| trials < max_trials).map(|next| {
                        let next = switched(&selection, next);
                        scope.spawn(move || cost_of(&next))
                    });
                    let judged = match ahead.take() {
                        Some(h) => join(h),
                        None => cost_of(&trial),
                    };
                    ahead = next;
                    if let Ok((d, t, b, parts)) = judged {
                        if better_plan(t, b, best, best_bytes) {
                            selection = trial;
                            dag = d;
                            best = t;
                            best_bytes = b;
                            fusion = Some(parts);
                            improved = true;
                            // (Judged from the form before this switch.)
                            ahead = None;
                        }
                    }
                }
            }
        });
    }
    (Extracted { dag, selection, predicted_us: best, bytes: best_bytes, fusion, cut }, stopped)
}

/// The answer of a scoped thread (its panic, if it panicked).
fn join<T>(h: std::thread::ScopedJoinHandle<'_, T>) -> T {
    h.join().unwrap_or_else(|e| std::panic::resume_unwind(e))
}

/// The DAG of a selection and the predicted time of its fused (or unfused) plan, by greedy
/// fusion alone.
pub fn fused_cost(
    egraph: &TensorGraph,
    selection: &Selection,
    roots: &[(String, Id)],
    names: &BTreeMap<Id, String>,
    profile: &DeviceProfile,
    fusion: bool,
) -> Result<(Dag, f64), String> {
    scored(egraph, selection, roots, names, profile, fusion, false).map(|(d, t, _)| (d, t))
}

/// The DAG of a selection and the predicted time of the plan `optimize` builds from it: greedy
/// fusion, recomputation first, and materialize rounds ([`Fusion::optimise_with_materialize`]).
pub fn planned_cost(
    egraph: &TensorGraph,
    selection: &Selection,
    roots: &[(String, Id)],
    names: &BTreeMap<Id, String>,
    profile: &DeviceProfile,
    fusion: bool,
) -> Result<(Dag, f64), String> {
    scored(egraph, selection, roots, names, profile, fusion, true).map(|(d, t, _)| (d, t))
}

/// The DAG of a selection, its plan's predicted time and bytes moved; `full` runs the whole
/// search `optimize` builds plans with, otherwise greedy fusion alone.
pub(crate) fn scored(
    egraph: &TensorGraph,
    selection: &Selection,
    roots: &[(String, Id)],
    names: &BTreeMap<Id, String>,
    profile: &DeviceProfile,
    fusion: bool,
    full: bool,
) -> Result<(Dag, f64, u64), String> {
    scored_by(egraph, selection, roots, names, profile, fusion, full, Deadline::never(), None, None)
        .map(|(d, t, b, _)| (d, t, b))
}

/// [`scored`] with its fusion search stopped by a deadline, and the fusion state it ended in;
/// `greedy`: the state greedy fusion reached on this selection before (the whole search then
/// starts from it instead of reaching it again); `inline_first`: the state
/// [`Fusion::inline_first`] reached on it, searched ahead.
#[allow(clippy::too_many_arguments)]
pub(crate) fn scored_by(
    egraph: &TensorGraph,
    selection: &Selection,
    roots: &[(String, Id)],
    names: &BTreeMap<Id, String>,
    profile: &DeviceProfile,
    fusion: bool,
    full: bool,
    deadline: Deadline,
    greedy: Option<FusionParts>,
    inline_first: Option<FusionParts>,
) -> Result<(Dag, f64, u64, FusionParts), String> {
    let dag = dag_of(egraph, selection, roots, names)?;
    let mut f = Fusion::try_unfused(&dag, profile)?.with_deadline(deadline);
    match (fusion, full) {
        (false, _) => {}
        (true, false) => f.optimise(),
        (true, true) => f.optimise_with_materialize_from(greedy, inline_first),
    }
    let (t, b) = (f.total_us(), f.total_bytes());
    let parts = f.into_parts();
    Ok((dag, t, b, parts))
}

/// A trial of [`improve`]: e-nodes to choose together, each for its class.
type Switch = Vec<(Id, TensorLang)>;

/// Other e-nodes of the classes in the current form that differ in operator or children
/// classes (commuted operands are not worth a trial), each a switch of one class; and the
/// switches of several classes at once that read one product through slices (the products of a
/// shared operand `matmul-shared-lhs` fused: one class switched alone keeps the others' products
/// and adds the fused one, so it never pays, while all of them switched together may).
fn alternatives(egraph: &TensorGraph, dag: &Dag, selection: &Selection) -> Vec<Switch> {
    let mut out = Vec::new();
    let used: std::collections::BTreeSet<Id> = dag.nodes.iter().filter_map(|d| d.class).collect();
    for &c in &used {
        // A class with a constant value keeps its literal: attributes (axes, scales, epsilons)
        // must stay literals for the type rules and the templates, and a literal costs nothing
        // in any kernel, so a computed form (`square(0.5)` for `0.25`) is never worth a trial.
        if egraph[c].data.konst().is_some() {
            continue;
        }
        let cur = &selection[&c];
        let key = |n: &TensorLang| {
            let mut ch: Vec<Id> = n.children().iter().map(|&x| egraph.find(x)).collect();
            ch.sort();
            (n.opcode(), ch)
        };
        let cur_key = key(cur);
        for n in &egraph[c].nodes {
            if n.opcode().is_some()
                && key(n) != cur_key
                && egraph.analysis.node_fact(n, |x| egraph[x].data.fact.clone()).is_some()
            {
                out.push(vec![(c, n.clone())]);
            }
        }
    }
    // Composites first: one template running a whole pattern is the switch most likely to pay.
    out.sort_by_key(|sw| {
        let (c, n) = &sw[0];
        (!matches!(n.opcode().map(|o| o.kind()), Some(crate::ir::lang::Kind::Composite(_))), *c)
    });
    let mut groups = shared_product_switches(egraph, &used, selection);
    groups.append(&mut out);
    groups
}

/// For each product that classes of the form have a slice of, the switch of every such class
/// to its slice of it (where two or more have one and some class does not read it yet).
fn shared_product_switches(
    egraph: &TensorGraph,
    used: &std::collections::BTreeSet<Id>,
    selection: &Selection,
) -> Vec<Switch> {
    use crate::ir::lang::Kind;
    let slice_of = |n: &TensorLang| match n {
        TensorLang::Op(code, ch) if code.kind() == Kind::Slice => {
            let p = egraph.find(ch[0]);
            let product = egraph[p].nodes.iter().any(|m| m.opcode().is_some_and(|o| o.kind() == Kind::MatMul));
            product.then_some(p)
        }
        _ => None,
    };
    let mut by_product: BTreeMap<Id, Switch> = BTreeMap::new();
    for &c in used {
        for n in &egraph[c].nodes {
            if let Some(p) = slice_of(n) {
                let group = by_product.entry(p).or_default();
                if group.last().is_none_or(|(d, _)| *d != c) {
                    group.push((c, n.clone()));
                }
            }
        }
    }
    by_product.into_values().filter(|g| g.len() >= 2 && g.iter().any(|(c, n)| selection.get(c) != Some(n))).collect()
}

/// Turns a fusion state into kernels, naming every tensor.
pub fn build_plan(
    program: &Program,
    dag: &Dag,
    fusion: &Fusion,
    profile: &DeviceProfile,
    unfused: Totals,
    search: SearchReport,
) -> FusionPlan {
    let names = tensor_names(dag);
    let tref = |i: usize| TensorRef {
        name: names[i].clone(),
        ty: dag.nodes[i].ty().cloned().unwrap_or(TensorType::scalar(crate::DType::F32)),
    };
    let (rejected, notes_cut) = rejected_by_member(fusion, &names);
    let mut search = search;
    if notes_cut {
        search.time_limit_cut.push("the notes on rejected fusions".into());
    }
    let mut kernels = Vec::new();
    let times = crate::search::residency::ordered_times(dag, fusion, profile);
    for (g, predicted_us) in fusion.ordered().into_iter().zip(times) {
        let k = &g.cost;
        let mut body: RecExpr<TensorLang> = RecExpr::default();
        let mut local: BTreeMap<usize, Id> = BTreeMap::new();
        let leaf = |i: usize, body: &mut RecExpr<TensorLang>, local: &mut BTreeMap<usize, Id>| -> Id {
            *local.entry(i).or_insert_with(|| {
                let n = &dag.nodes[i];
                match n.role {
                    Role::Leaf if !dag.is_output[i] => body.add(n.node.clone()),
                    _ => body.add(TensorLang::Var(Symbol::from(names[i].as_str()))),
                }
            })
        };
        for &r in &k.reads {
            leaf(r, &mut body, &mut local);
        }
        let mut ops = Vec::new();
        for &b in &k.body {
            let n = &dag.nodes[b];
            for c in n.children() {
                if !local.contains_key(&c) {
                    leaf(c, &mut body, &mut local);
                }
            }
            let node = n.node.clone().map_children(|c| local[&usize::from(c)]);
            ops.push(node.head());
            let id = body.add(node);
            local.insert(b, id);
        }
        let written: Vec<usize> = g.members.iter().copied().filter(|&m| fusion.is_written(m)).collect();
        let bytes_written = fusion.group_write_bytes(g);
        let mut notes: Vec<String> = k.notes.clone();
        for m in &g.members {
            notes.extend(rejected.get(m).into_iter().flatten().cloned());
        }
        notes.dedup();
        kernels.push(Kernel {
            id: kernels.len(),
            template: k.template,
            kind: k.kind,
            domain: k.domain.clone(),
            ops,
            reads: k.reads.iter().map(|&r| tref(r)).collect(),
            writes: written.iter().map(|&w| tref(w)).collect(),
            stores: written.iter().map(|w| local[w]).collect(),
            body,
            bytes_read: k.bytes_read(bytes_written),
            bytes_written,
            flops: k.flops,
            predicted_us,
            rejected: notes,
            implementation: k.implementation,
        });
    }
    let total = FusionPlan::sum_totals(&kernels);
    let inputs: Vec<TensorRef> =
        program.inputs.iter().map(|i| TensorRef { name: i.name.clone(), ty: i.ty.clone() }).collect();
    let outputs: Vec<(String, String)> = dag.outputs.iter().map(|(o, i)| (o.clone(), names[*i].clone())).collect();
    let packed = (0..dag.len()).filter(|&i| dag.is_packed(i)).map(|i| names[i].clone()).collect();
    let memory = FusionPlan::memory_of(&kernels, &inputs, &outputs, &packed);
    FusionPlan {
        program: program.source.clone(),
        device: profile.name.clone(),
        kernels,
        inputs,
        outputs,
        total,
        unfused,
        search,
        memory,
    }
}

/// Fusions rejected near each node, as sentences, keyed by the kernel member they concern.
/// Also whether the deadline cut the list short.
fn rejected_by_member(fusion: &Fusion, names: &[String]) -> (BTreeMap<usize, Vec<String>>, bool) {
    let mut out: BTreeMap<usize, Vec<String>> = BTreeMap::new();
    let (rejections, cut) = fusion.rejections_within_deadline();
    for r in rejections {
        let (key, text) = match r.into {
            None => (
                r.subject,
                format!("not fused: {} recomputed by its consumers instead of written: {}", names[r.subject], r.why),
            ),
            Some(b) => (b, format!("not fused: with the kernel writing {}: {}", names[r.subject], r.why)),
        };
        out.entry(key).or_default().push(text);
    }
    (out, cut)
}

/// A unique name for every tensor: outputs by their output name, inputs and bound values by
/// their program name, the rest `t{index}`.
fn tensor_names(dag: &Dag) -> Vec<String> {
    let mut names: Vec<Option<String>> = dag
        .nodes
        .iter()
        .map(|n| match &n.node {
            TensorLang::Var(s) => Some(s.to_string()),
            _ => None,
        })
        .collect();
    for (o, i) in &dag.outputs {
        if names[*i].is_none() {
            names[*i] = Some(o.clone());
        }
    }
    for (i, n) in dag.nodes.iter().enumerate() {
        if names[i].is_none() {
            names[i] = n.name.clone();
        }
    }
    // Two nodes may carry one binding name (a gradient named `d_h` by autodiff and a later
    // binding `d_h`); names are kernel argument names, so only the first keeps it.
    // Output names come first: a node named like an output (a JSON node's `name`) gives way.
    let mut seen: std::collections::BTreeSet<String> = dag.outputs.iter().map(|(o, _)| o.clone()).collect();
    for (i, name) in names.iter_mut().enumerate() {
        if name.as_ref().is_some_and(|n| !seen.insert(n.clone())) && !dag.is_output[i] {
            *name = None;
        }
    }
    let mut taken: std::collections::BTreeSet<String> = names.iter().flatten().cloned().collect();
    names
        .into_iter()
        .enumerate()
        .map(|(i, n)| {
            n.unwrap_or_else(|| {
                let mut name = format!("t{i}");
                while taken.contains(&name) {
                    name.push('_');
                }
                taken.insert(name.clone());
                name
            })
        })
        .collect()
}
