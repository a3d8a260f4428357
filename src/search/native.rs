//! Rules written in Rust, for rewrites that rule files cannot say: a right side with constant
//! arithmetic (`slice-of-slice`: the bounds of two slices folded into one), and matches over
//! several classes (`matmul-shared-lhs`: products that share their left operand, fused into one
//! product of concatenated weights), `matmul-as-rows` (a product of a tiny inner size and
//! few output columns as a sum of products along its last axis: shapes computed from the match)
//! and `matmul-outer` (a product of inner size 1 as a broadcast multiply).
//!
//! They run beside the rules of the ruleset they belong to ([`RuleSet::native`]: the default
//! `algebra` ruleset carries them; a `--rules DIR` ruleset carries none) and are checked for
//! soundness as every rule is ([`crate::search::soundness::check_native_rule`]: random
//! instantiations of their left sides, rewritten in an e-graph, every form of every class equal
//! to the class's original value on the reference).
//! Invariants: an applier adds nothing unless every node it would add type-checks to the type of
//! the class it joins (computed before adding, as [`crate::search::rules::Rule::rewrite`]'s guard
//! does); the shared-operand rule fuses at most [`MAX_FUSED`] weights per product, each once, in
//! one order, so the e-graph gains at most `2^n - n - 1` products for `n` products of one operand.
//!
//! [`RuleSet::native`]: crate::search::rules::RuleSet::native

use std::collections::BTreeMap;

use egg::{Applier, Id, Pattern, PatternAst, Rewrite, SearchMatches, Searcher, Subst, Symbol, Var};

use crate::ir::infer::{norm_axis, slice_range, Fact};
use crate::ir::lang::{Dims, OpCode, TensorLang};
use crate::ir::types::TensorType;
use crate::search::analysis::{ShapeAnalysis, TensorGraph};

/// The most weights one fused product concatenates (queries, keys and values).
pub const MAX_FUSED: usize = 3;

/// One rule written in Rust.
#[derive(Clone, Copy, Debug)]
pub struct NativeRule {
    pub name: &'static str,
    /// What it rewrites, for documentation and reports.
    pub doc: &'static str,
    /// Whether the two sides may round differently (left out under `--strict`).
    pub inexact: bool,
    /// The left sides, as rule-file patterns: what the rule matches, and what the soundness
    /// harness instantiates (all with one substitution, each a root of the checked program).
    pub lhs: &'static [&'static str],
    make: fn() -> Rewrite<TensorLang, ShapeAnalysis>,
}

impl NativeRule {
    /// The egg rewrite.
    pub fn rewrite(&self) -> Rewrite<TensorLang, ShapeAnalysis> {
        (self.make)()
    }

    /// The left sides as egg patterns.
    pub fn lhs_patterns(&self) -> Vec<Pattern<TensorLang>> {
        self.lhs.iter().map(|p| p.parse().expect("a native rule's left side parses")).collect()
    }
}

/// Every native rule, with the ruleset it runs in.
pub const NATIVE_RULES: &[(&str, NativeRule)] = &[
    (
        "algebra",
        NativeRule {
            name: "slice-of-slice",
            doc: "`slice(slice(x, a, s1, e1, k1), a, s2, e2, k2)` is one slice of x: start s1 + s2*k1, step \
                  k1*k2, bounds normalised (negative and clamped bounds resolved against the axis)",
            inexact: false,
            lhs: &["(slice (slice ?x ?a ?s ?e ?k) ?b ?t ?f ?j)"],
            make: slice_of_slice,
        },
    ),
    (
        "algebra",
        NativeRule {
            name: "matmul-shared-lhs",
            doc: "`x @ w1` and `x @ w2` are `slice(x @ concat(w1, w2, -1), -1, 0, N1)` and \
                  `slice(..., -1, N1, N1 + N2)` (queries, keys and values; gate and up projections)",
            inexact: true,
            lhs: &["(@ ?x ?w1)", "(@ ?x ?w2)"],
            make: || shared_lhs(false),
        },
    ),
    (
        "algebra",
        NativeRule {
            name: "matmul-shared-lhs-t",
            doc: "`x @ transpose(w1, -1, -2)` and `x @ transpose(w2, -1, -2)` (torch's `linear`) are slices of \
                  `x @ transpose(concat(w1, w2, -2), -1, -2)`",
            inexact: true,
            lhs: &["(@ ?x (transpose ?w1 -1 -2))", "(@ ?x (transpose ?w2 -1 -2))"],
            make: || shared_lhs(true),
        },
    ),
    (
        "algebra",
        NativeRule {
            name: "matmul-as-rows",
            doc: "`a @ b` with `a: [..., M, K]`, `b: [..., K, N]`, K and N at most `ROWS_MAX` (or N = 1 and any K) is \
                  `reshape(sum(reshape(a, [..., M, 1, K]) * reshape(transpose(b, -1, -2), [..., 1, N, K]), -1), \
                  [..., M, N])` (with N = 1, `sum(a * transpose(b, -1, -2), -1)`): batches of tiny products \
                  as one row kernel reading the operands once",
            inexact: true,
            lhs: &["(@ ?a ?b)"],
            make: matmul_as_rows,
        },
    ),
    (
        "algebra",
        NativeRule {
            name: "matmul-outer",
            doc: "`a @ b` with `a: [..., M, 1]`, `b: [..., 1, N]` (an inner size of 1: an outer product) is \
                  `a * b`, broadcast as the product broadcasts: each element is one product, rounded once \
                  either way, so an elementwise kernel (which fuses with what reads it: a rotary table's \
                  `cos` and `sin` of `inv_freq @ positions`) replaces a product kernel",
            inexact: false,
            lhs: &["(@ ?a ?b)"],
            make: matmul_outer,
        },
    ),
];

/// The native rules of a ruleset.
pub fn native_rules(ruleset: &str) -> Vec<NativeRule> {
    NATIVE_RULES.iter().filter(|(set, _)| *set == ruleset).map(|(_, r)| *r).collect()
}

fn code(name: &str) -> OpCode {
    OpCode::from_name(name).expect("a known operator")
}

fn var(name: &str) -> Var {
    name.parse().expect("a pattern variable")
}

/// Nodes to add, bottom up, each child an e-class or an earlier node of the list; their facts
/// are computed before anything is added, so nothing is added that does not type-check.
struct Build<'a> {
    egraph: &'a TensorGraph,
    /// Each node (its children placeholders) with its children.
    nodes: Vec<(TensorLang, Vec<Child>)>,
    facts: Vec<Fact>,
}

/// A child of a node being built: an existing class or the `i`th node built.
#[derive(Clone, Copy, Debug)]
enum Child {
    Class(Id),
    New(usize),
}

impl<'a> Build<'a> {
    fn new(egraph: &'a TensorGraph) -> Build<'a> {
        Build { egraph, nodes: vec![], facts: vec![] }
    }

    fn fact(&self, c: Child) -> Option<&Fact> {
        match c {
            Child::Class(id) => self.egraph[id].data.fact.as_ref(),
            Child::New(i) => self.facts.get(i),
        }
    }

    /// Adds a node to the list; `None` if it does not type-check.
    fn node(&mut self, node: TensorLang, children: Vec<Child>) -> Option<Child> {
        let child_facts: Vec<Fact> = children.iter().map(|&c| self.fact(c).cloned()).collect::<Option<_>>()?;
        // Positions in `child_facts` stand in for the children while typing.
        let probe = with_children(&node, Id::from);
        let fact = self.egraph.analysis.node_fact(&probe, |c| child_facts.get(usize::from(c)).cloned())?;
        self.nodes.push((node, children));
        self.facts.push(fact);
        Some(Child::New(self.nodes.len() - 1))
    }

    fn num(&mut self, v: f64) -> Child {
        self.node(TensorLang::num(v), vec![]).expect("a literal has a type")
    }

    fn op(&mut self, name: &str, children: Vec<Child>) -> Option<Child> {
        let n = children.len();
        self.node(TensorLang::op(code(name), vec![Id::from(0); n]), children)
    }

    /// The nodes, to add with [`add_nodes`].
    fn finish(self) -> Vec<(TensorLang, Vec<Child>)> {
        self.nodes
    }
}

/// Adds built nodes to the e-graph; the class of each.
/// Adds `nodes` (built by [`Build`], the last one the rewritten value) and unions the last with
/// `eclass`: the classes an applier reports changed.
fn union_built(egraph: &mut TensorGraph, eclass: Id, nodes: Vec<(TensorLang, Vec<Child>)>, rule: Symbol) -> Vec<Id> {
    let ids = add_nodes(egraph, nodes);
    let new = *ids.last().expect("a rewrite builds at least one node");
    if egraph.union_trusted(eclass, new, rule) {
        vec![eclass]
    } else {
        vec![]
    }
}

fn add_nodes(egraph: &mut TensorGraph, nodes: Vec<(TensorLang, Vec<Child>)>) -> Vec<Id> {
    let mut ids: Vec<Id> = Vec::with_capacity(nodes.len());
    for (node, children) in nodes {
        let resolved: Vec<Id> = children
            .iter()
            .map(|c| match *c {
                Child::Class(id) => id,
                Child::New(i) => ids[i],
            })
            .collect();
        let id = egraph.add(with_children(&node, |k| resolved[k]));
        ids.push(id);
    }
    ids
}

/// `node` with its `k`th child replaced by `f(k)`.
fn with_children(node: &TensorLang, f: impl Fn(usize) -> Id) -> TensorLang {
    match node {
        TensorLang::Op(c, ch) => TensorLang::Op(*c, (0..ch.len()).map(f).collect()),
        n => n.clone(),
    }
}

/// Equal types, weakness and attribute literals.
fn same_fact(a: &Fact, b: &Fact) -> bool {
    a.ty == b.ty && a.weak == b.weak && a.dims == b.dims && a.dtype == b.dtype
}

/// The integer literal of a class.
fn int_of(egraph: &TensorGraph, id: Id) -> Option<i64> {
    let v = egraph[id].data.konst()?;
    (v.fract() == 0.0 && v.abs() < 1e15).then_some(v as i64)
}

// --- slice-of-slice

/// The one slice (start, stop, step) equal to `x[s1:e1:k1][s2:e2:k2]` along an axis of `n`
/// elements, with non-negative bounds and the smallest stop; `None` if either slice is empty or
/// invalid. A result of one element gets step 1.
pub fn fold_slices(n: usize, outer: (i64, i64, i64), inner: (i64, i64, i64)) -> Option<(i64, i64, i64)> {
    let (a1, l1) = slice_range(n, inner.0, inner.1, inner.2).ok()?;
    let (a2, l2) = slice_range(l1, outer.0, outer.1, outer.2).ok()?;
    let step = if l2 == 1 { 1 } else { inner.2.checked_mul(outer.2)? };
    let start = (a1 as i64).checked_add((a2 as i64).checked_mul(inner.2)?)?;
    let stop = start.checked_add(((l2 - 1) as i64).checked_mul(step)?)?.checked_add(1)?;
    Some((start, stop, step))
}

fn slice_of_slice() -> Rewrite<TensorLang, ShapeAnalysis> {
    let lhs: Pattern<TensorLang> = NATIVE_RULES[0].1.lhs[0].parse().expect("the pattern parses");
    Rewrite::new("slice-of-slice", lhs, SliceOfSlice).expect("the rule's variables are bound")
}

struct SliceOfSlice;

impl Applier<TensorLang, ShapeAnalysis> for SliceOfSlice {
    fn apply_one(
        &self,
        egraph: &mut TensorGraph,
        eclass: Id,
        subst: &Subst,
        _ast: Option<&PatternAst<TensorLang>>,
        rule: Symbol,
    ) -> Vec<Id> {
        let get = |v: &str| subst.get(var(v)).copied();
        let Some(node) = (|| {
            let (x, a) = (get("?x")?, get("?a")?);
            let t = egraph[x].data.ty()?;
            let int = |v: &str| get(v).and_then(|id| int_of(egraph, id));
            let axis = norm_axis(int("?a")?, t.rank()).ok()?;
            if norm_axis(int("?b")?, t.rank()).ok()? != axis {
                return None;
            }
            let inner = (int("?s")?, int("?e")?, int("?k")?);
            let outer = (int("?t")?, int("?f")?, int("?j")?);
            let (s, e, k) = fold_slices(t.shape[axis], outer, inner)?;
            let mut b = Build::new(egraph);
            let (s, e, k) = (b.num(s as f64), b.num(e as f64), b.num(k as f64));
            let sl = b.op("slice", vec![Child::Class(x), Child::Class(a), s, e, k])?;
            let have = egraph[eclass].data.fact.as_ref()?;
            same_fact(have, b.fact(sl)?).then(|| b.finish())
        })() else {
            return vec![];
        };
        union_built(egraph, eclass, node, rule)
    }

    fn vars(&self) -> Vec<Var> {
        ["?x", "?a", "?s", "?e", "?k", "?b", "?t", "?f", "?j"].iter().map(|v| var(v)).collect()
    }
}

// --- matmul-as-rows

/// The largest inner size K and output width N `matmul-as-rows` rewrites: products this narrow
/// run far below any tile of a matrix-product kernel (cuBLASLt or generated), and each output
/// element is a row of at most this many products, a short row one row kernel reduces (a thread
/// per element, several rows a warp) while reading the larger operand once. A product of one
/// output column (a matrix times a vector) is rewritten at any K: each output element is a row
/// of `a` reduced against the one column, which every row re-reads from L2 (batches of them ran
/// on cuBLASLt at 10 times their price: 512 dot products of 8192 in 109 us on the H100, seed
/// 3001's g3844).
pub const ROWS_MAX: usize = 16;

fn matmul_as_rows() -> Rewrite<TensorLang, ShapeAnalysis> {
    let lhs: Pattern<TensorLang> = "(@ ?a ?b)".parse().expect("the pattern parses");
    Rewrite::new("matmul-as-rows", lhs, ProductForm(as_rows)).expect("the rule's variables are bound")
}

/// `matmul-as-rows`' form of `a @ b`: a sum of products along a short last axis.
fn as_rows(b: &mut Build<'_>, a: Id, bb: Id, ta: &TensorType, tb: &TensorType, out: &TensorType) -> Option<Child> {
    let (ra, rb) = (ta.rank(), tb.rank());
    if ra < 2 || rb < 2 || out.rank() < 2 {
        return None;
    }
    let (m, k) = (ta.shape[ra - 2], ta.shape[ra - 1]);
    let n = tb.shape[rb - 1];
    // (One output column is a row of `a` times `b`'s column at any depth: no operand is read
    // more than once but the column, which L2 holds.)
    if (k > ROWS_MAX && n != 1) || n > ROWS_MAX || k == 0 {
        return None;
    }
    let (i, j) = (b.num(-1.0), b.num(-2.0));
    let bt = b.op("transpose", vec![Child::Class(bb), i, j])?;
    if n == 1 {
        // One output column: `sum(a * transpose(b, -1, -2), -1)` is already `[..., M, 1]`, a
        // row kernel over `a`'s own shape (which fuses with `a`'s producer: no view of a
        // computed value).
        let prod = b.op("*", vec![Child::Class(a), bt])?;
        let last = b.num(-1.0);
        return b.op("sum", vec![prod, last]);
    }
    let mut lhs_dims = ta.shape[..ra - 2].to_vec();
    lhs_dims.extend([m, 1, k]);
    let mut rhs_dims = tb.shape[..rb - 2].to_vec();
    rhs_dims.extend([1, n, k]);
    let shape_a = b.node(TensorLang::Dims(Dims(lhs_dims)), vec![])?;
    let ra_ = b.op("reshape", vec![Child::Class(a), shape_a])?;
    let shape_b = b.node(TensorLang::Dims(Dims(rhs_dims)), vec![])?;
    let rb_ = b.op("reshape", vec![bt, shape_b])?;
    let prod = b.op("*", vec![ra_, rb_])?;
    let last = b.num(-1.0);
    let sum = b.op("sum", vec![prod, last])?;
    let shape_out = b.node(TensorLang::Dims(Dims(out.shape.clone())), vec![])?;
    b.op("reshape", vec![sum, shape_out])
}

// --- matmul-outer

fn matmul_outer() -> Rewrite<TensorLang, ShapeAnalysis> {
    let lhs: Pattern<TensorLang> = "(@ ?a ?b)".parse().expect("the pattern parses");
    Rewrite::new("matmul-outer", lhs, ProductForm(outer)).expect("the rule's variables are bound")
}

/// `matmul-outer`'s form of `a @ b`: with an inner size of 1 (both operands at least matrices:
/// a vector operand is no outer product's), `a * b`.
fn outer(b: &mut Build<'_>, a: Id, bb: Id, ta: &TensorType, tb: &TensorType, _out: &TensorType) -> Option<Child> {
    if ta.rank() < 2 || tb.rank() < 2 || ta.shape[ta.rank() - 1] != 1 || ta.dtype != tb.dtype {
        return None;
    }
    b.op("*", vec![Child::Class(a), Child::Class(bb)])
}

/// The applier of a rule `(@ ?a ?b) => form`: the form built from the operands and their types
/// and the product's own type (`None` where the rule does not apply), added and joined to the
/// product's class where it has the product's fact.
type ProductBuilder = fn(&mut Build<'_>, Id, Id, &TensorType, &TensorType, &TensorType) -> Option<Child>;

struct ProductForm(ProductBuilder);

impl Applier<TensorLang, ShapeAnalysis> for ProductForm {
    fn apply_one(
        &self,
        egraph: &mut TensorGraph,
        eclass: Id,
        subst: &Subst,
        _ast: Option<&PatternAst<TensorLang>>,
        rule: Symbol,
    ) -> Vec<Id> {
        let Some(build) = (|| {
            let (a, bb) = (*subst.get(var("?a"))?, *subst.get(var("?b"))?);
            let (ta, tb) = (egraph[a].data.ty()?, egraph[bb].data.ty()?);
            let have = egraph[eclass].data.fact.as_ref()?;
            let mut b = Build::new(egraph);
            let form = (self.0)(&mut b, a, bb, ta, tb, have.ty.as_ref()?)?;
            same_fact(have, b.fact(form)?).then(|| b.finish())
        })() else {
            return vec![];
        };
        union_built(egraph, eclass, build, rule)
    }

    fn vars(&self) -> Vec<Var> {
        ["?a", "?b"].iter().map(|v| var(v)).collect()
    }
}

// --- matmul-shared-lhs

fn shared_lhs(transposed: bool) -> Rewrite<TensorLang, ShapeAnalysis> {
    let name = if transposed { "matmul-shared-lhs-t" } else { "matmul-shared-lhs" };
    Rewrite::new(name, SharedLhs { transposed }, SharedLhs { transposed }).expect("the rule's variables are bound")
}

/// Products of one left operand: the searcher pairs them, the applier fuses a pair.
/// `transposed`: products `x @ transpose(w, -1, -2)`, whose weights concatenate along `-2`.
#[derive(Clone, Copy)]
struct SharedLhs {
    transposed: bool,
}

/// A product's weight: the class of `w` in `x @ w` (or in `x @ transpose(w, -1, -2)`). A right
/// operand that is a transposed weight is left to the transposed rule (its weights concatenate
/// without a transpose in the copy).
fn weight_of(egraph: &TensorGraph, rhs: Id, transposed: bool) -> Option<Id> {
    if !transposed {
        return transposed_weight(egraph, rhs).is_none().then_some(rhs);
    }
    transposed_weight(egraph, rhs)
}

/// `w` where the class holds `transpose(w, a, b)` of `w`'s last two axes.
fn transposed_weight(egraph: &TensorGraph, rhs: Id) -> Option<Id> {
    let tr = code("transpose");
    egraph[rhs].nodes.iter().find_map(|n| match n {
        TensorLang::Op(c, ch) if *c == tr => {
            let w = egraph.find(ch[0]);
            let r = egraph[w].data.ty()?.rank();
            let axes = (norm_axis(int_of(egraph, ch[1])?, r).ok()?, norm_axis(int_of(egraph, ch[2])?, r).ok()?);
            (r >= 2 && (axes == (r - 1, r - 2) || axes == (r - 2, r - 1))).then_some(w)
        }
        _ => None,
    })
}

/// The weights a (fused) weight concatenates along the axis `from_end` from the end, in order;
/// `None` past [`MAX_FUSED`].
fn atoms(egraph: &TensorGraph, w: Id, from_end: usize) -> Option<Vec<Id>> {
    fn walk(egraph: &TensorGraph, w: Id, from_end: usize, out: &mut Vec<Id>) -> Option<()> {
        let w = egraph.find(w);
        let rank = egraph[w].data.ty()?.rank();
        let cat = code("concat");
        let parts = egraph[w].nodes.iter().find_map(|n| match n {
            TensorLang::Op(c, ch) if *c == cat && rank >= from_end => {
                let axis = norm_axis(int_of(egraph, ch[2])?, rank).ok()?;
                (axis == rank - from_end).then_some((ch[0], ch[1]))
            }
            _ => None,
        });
        match parts {
            Some((a, b)) => {
                walk(egraph, a, from_end, out)?;
                walk(egraph, b, from_end, out)
            }
            None if out.len() < MAX_FUSED => {
                out.push(w);
                Some(())
            }
            None => None,
        }
    }
    let mut out = vec![];
    walk(egraph, w, from_end, &mut out)?;
    Some(out)
}

impl SharedLhs {
    fn concat_axis_from_end(&self) -> usize {
        if self.transposed {
            2
        } else {
            1
        }
    }

    /// Every pair to fuse, as (first product's class, substitution).
    fn pairs(&self, egraph: &TensorGraph, only: Option<Id>) -> Vec<(Id, Subst)> {
        let mat = code("@");
        let mut groups: BTreeMap<Id, Vec<(Id, Id)>> = BTreeMap::new();
        for class in egraph.classes() {
            for node in &class.nodes {
                if let TensorLang::Op(c, ch) = node {
                    if *c == mat {
                        if let Some(w) = weight_of(egraph, egraph.find(ch[1]), self.transposed) {
                            groups.entry(egraph.find(ch[0])).or_default().push((egraph.find(class.id), w));
                        }
                    }
                }
            }
        }
        let mut out = vec![];
        for (x, mut products) in groups {
            if products.len() < 2 {
                continue;
            }
            products.sort();
            products.dedup();
            for &(p1, w1) in &products {
                if only.is_some_and(|o| o != p1) {
                    continue;
                }
                let Some(a1) = atoms(egraph, w1, self.concat_axis_from_end()) else { continue };
                if a1.len() >= MAX_FUSED {
                    continue;
                }
                for &(p2, w2) in &products {
                    // The second weight is one weight after all of the first's: each set of
                    // weights is fused once, in one order.
                    let a2 = atoms(egraph, w2, self.concat_axis_from_end());
                    let ok = matches!(&a2, Some(a2) if a2.len() == 1 && a1.iter().all(|&a| a < a2[0]));
                    if p1 == p2 || !ok || !self.compatible(egraph, w1, w2) {
                        continue;
                    }
                    let mut s = Subst::default();
                    s.insert(var("?x"), x);
                    s.insert(var("?w1"), w1);
                    s.insert(var("?w2"), w2);
                    s.insert(var("?p2"), p2);
                    out.push((p1, s));
                }
            }
        }
        out
    }

    /// Weights of one dtype and rank whose shapes differ at most along the concatenated axis.
    fn compatible(&self, egraph: &TensorGraph, w1: Id, w2: Id) -> bool {
        let (Some(a), Some(b)) = (egraph[w1].data.ty(), egraph[w2].data.ty()) else { return false };
        let r = a.rank();
        r >= 2
            && r == b.rank()
            && a.dtype == b.dtype
            && (0..r).all(|i| i == r - self.concat_axis_from_end() || a.shape[i] == b.shape[i])
    }
}

impl Searcher<TensorLang, ShapeAnalysis> for SharedLhs {
    fn search_eclass_with_limit(
        &self,
        egraph: &TensorGraph,
        eclass: Id,
        limit: usize,
    ) -> Option<SearchMatches<'_, TensorLang>> {
        let substs: Vec<Subst> =
            self.pairs(egraph, Some(egraph.find(eclass))).into_iter().map(|(_, s)| s).take(limit).collect();
        (!substs.is_empty()).then_some(SearchMatches { eclass, substs, ast: None })
    }

    fn search_with_limit(&self, egraph: &TensorGraph, limit: usize) -> Vec<SearchMatches<'_, TensorLang>> {
        let mut by_class: BTreeMap<Id, Vec<Subst>> = BTreeMap::new();
        for (p1, s) in self.pairs(egraph, None).into_iter().take(limit) {
            by_class.entry(p1).or_default().push(s);
        }
        by_class.into_iter().map(|(eclass, substs)| SearchMatches { eclass, substs, ast: None }).collect()
    }

    fn vars(&self) -> Vec<Var> {
        ["?x", "?w1", "?w2", "?p2"].iter().map(|v| var(v)).collect()
    }
}

impl Applier<TensorLang, ShapeAnalysis> for SharedLhs {
    fn apply_one(
        &self,
        egraph: &mut TensorGraph,
        eclass: Id,
        subst: &Subst,
        _ast: Option<&PatternAst<TensorLang>>,
        rule: Symbol,
    ) -> Vec<Id> {
        let (p1, p2) = match subst.get(var("?p2")) {
            Some(&p2) => (egraph.find(eclass), egraph.find(p2)),
            None => return vec![],
        };
        let Some(build) = (|| {
            let get = |v: &str| subst.get(var(v)).copied();
            let (x, w1, w2) = (get("?x")?, get("?w1")?, get("?w2")?);
            let (f1, f2) = (egraph[p1].data.fact.as_ref()?, egraph[p2].data.fact.as_ref()?);
            let n1 = *f1.ty.as_ref()?.shape.last()?;
            let n2 = *f2.ty.as_ref()?.shape.last()?;
            let mut b = Build::new(egraph);
            let rhs = if self.transposed {
                let axis = b.num(-2.0);
                let w = b.op("concat", vec![Child::Class(w1), Child::Class(w2), axis])?;
                let (i, j) = (b.num(-1.0), b.num(-2.0));
                b.op("transpose", vec![w, i, j])?
            } else {
                let axis = b.num(-1.0);
                b.op("concat", vec![Child::Class(w1), Child::Class(w2), axis])?
            };
            let prod = b.op("@", vec![Child::Class(x), rhs])?;
            let (last, zero, one) = (b.num(-1.0), b.num(0.0), b.num(1.0));
            let (mid, end) = (b.num(n1 as f64), b.num((n1 + n2) as f64));
            let s1 = b.op("slice", vec![prod, last, zero, mid, one])?;
            let s2 = b.op("slice", vec![prod, last, mid, end, one])?;
            (same_fact(f1, b.fact(s1)?) && same_fact(f2, b.fact(s2)?)).then(|| b.finish())
        })() else {
            return vec![];
        };
        let ids = add_nodes(egraph, build);
        let (s1, s2) = (ids[ids.len() - 2], ids[ids.len() - 1]);
        let mut changed = vec![];
        if egraph.union_trusted(p1, s1, rule) {
            changed.push(p1);
        }
        if egraph.union_trusted(p2, s2, rule) {
            changed.push(p2);
        }
        changed
    }

    fn vars(&self) -> Vec<Var> {
        Searcher::vars(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `fold_slices` against the indices the two slices take, for every small case.
    #[test]
    fn folded_slices_take_the_same_indices() {
        let take = |idx: &[i64], (s, e, k): (i64, i64, i64)| -> Option<Vec<i64>> {
            let (a, l) = slice_range(idx.len(), s, e, k).ok()?;
            Some((0..l).map(|i| idx[a + i * k as usize]).collect())
        };
        let mut folded = 0;
        for n in 1..=7usize {
            let all: Vec<i64> = (0..n as i64).collect();
            let bounds = [-9, -7, -3, -1, 0, 1, 2, 3, 5, 6, 8, 20];
            for &s1 in &bounds {
                for &e1 in &bounds {
                    for k1 in 1..=3 {
                        let Some(inner) = take(&all, (s1, e1, k1)) else { continue };
                        for &s2 in &bounds {
                            for &e2 in &bounds {
                                for k2 in 1..=3 {
                                    let want = take(&inner, (s2, e2, k2));
                                    let got = fold_slices(n, (s2, e2, k2), (s1, e1, k1));
                                    match (want, got) {
                                        (Some(w), Some(f)) => {
                                            assert!(f.0 >= 0 && f.1 <= n as i64 && f.2 >= 1, "{f:?}");
                                            assert_eq!(take(&all, f), Some(w), "{n} {s1}:{e1}:{k1} {s2}:{e2}:{k2}");
                                            folded += 1;
                                        }
                                        (None, None) => {}
                                        (w, f) => panic!("{n} {s1}:{e1}:{k1} {s2}:{e2}:{k2}: {w:?} against {f:?}"),
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
        assert!(folded > 10_000, "{folded}");
    }

    #[test]
    fn native_rules_build_and_parse() {
        for (_, r) in NATIVE_RULES {
            assert_eq!(r.rewrite().name.as_str(), r.name);
            assert!(!r.lhs_patterns().is_empty());
        }
        assert_eq!(native_rules("algebra").len(), 5);
        assert!(native_rules("patterns").is_empty());
    }
}
