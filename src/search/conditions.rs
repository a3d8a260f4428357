//! The one registry of named rule conditions (`:if (positive ?x)` in a rule file).
//!
//! A condition asks the e-class analysis ([`ShapeAnalysis`]) about the classes a match bound to
//! its variables: sign facts, constant values, shapes and dtypes. Rule files name conditions;
//! this table is the only place that gives them meaning.
//! Invariant: a condition is a pure function of the analysis data; it answers `false`, never
//! panics, for ill-typed classes (`fact == None`), attribute leaves where a tensor is expected,
//! out-of-range axes and variables the match did not bind.

use egg::{Id, Subst, Var};

use crate::ir::infer::{broadcast_shapes, infer, norm_axis, Fact};
use crate::ir::lang::{Binary, Composite, Kind, OpCode, Reduce, TensorLang};
use crate::ir::types::{DType, TensorType};
use crate::search::analysis::TensorGraph;
use crate::search::causal;

/// The signature every condition has: the e-graph, the match, and the condition's arguments.
pub type CheckFn = fn(&TensorGraph, &Subst, &[Var]) -> bool;

/// One entry of the registry.
#[derive(Clone, Copy)]
pub struct NamedCondition {
    /// Spelling in rule files (kebab-case).
    pub name: &'static str,
    /// Number of `?var` arguments.
    pub arity: usize,
    /// What it means, for error messages and documentation.
    pub doc: &'static str,
    pub check: CheckFn,
}

impl std::fmt::Debug for NamedCondition {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        write!(f, "{}/{}", self.name, self.arity)
    }
}

const fn cond(name: &'static str, arity: usize, doc: &'static str, check: CheckFn) -> NamedCondition {
    NamedCondition { name, arity, doc, check }
}

/// Every condition a rule may use.
pub const CONDITIONS: &[NamedCondition] = &[
    cond("positive", 1, "every element is > 0", |g, s, v| sign(g, s, v[0]).is_some_and(|x| x.positive)),
    cond("nonneg", 1, "every element is >= 0", |g, s, v| sign(g, s, v[0]).is_some_and(|x| x.nonneg)),
    cond("nonzero", 1, "no element is 0", |g, s, v| sign(g, s, v[0]).is_some_and(|x| x.nonzero)),
    cond("const", 1, "a scalar literal with a known value", |g, s, v| konst(g, s, v[0]).is_some()),
    cond("int-const", 1, "a scalar literal with an integer value", |g, s, v| int(g, s, v[0]).is_some()),
    cond("strong", 1, "a tensor that is not a weak scalar literal", |g, s, v| {
        fact(g, s, v[0]).is_some_and(|f| !f.weak)
    }),
    cond("float", 1, "a tensor of a floating-point dtype (weak literals are f32)", |g, s, v| {
        ty(g, s, v[0]).is_some_and(|t| t.dtype.is_float())
    }),
    cond("not-one", 1, "not the literal 1 (a factor `* 1` that `mul-one` already removes)", |g, s, v| {
        fact(g, s, v[0]).is_some_and(|f| f.konst != Some(1.0))
    }),
    cond(
        "not-scaled",
        1,
        "no node of ?x's class multiplies by a scalar literal other than 1 (`x * 0.125`)",
        |g, s, v| fact(g, s, v[0]).is_some() && class(s, v[0]).is_some_and(|c| !is_scaled(g, c)),
    ),
    cond("scalar", 1, "a tensor of rank 0", |g, s, v| ty(g, s, v[0]).is_some_and(|t| t.rank() == 0)),
    cond("rank-ge2", 1, "a tensor of rank 2 or more", |g, s, v| ty(g, s, v[0]).is_some_and(|t| t.rank() >= 2)),
    cond("rank2", 1, "a tensor of rank exactly 2", |g, s, v| ty(g, s, v[0]).is_some_and(|t| t.rank() == 2)),
    cond("same-shape", 2, "two tensors of equal shape", |g, s, v| both(g, s, v, |a, b| a.shape == b.shape)),
    cond("same-dtype", 2, "two tensors of equal dtype (weak literals are f32)", |g, s, v| {
        both(g, s, v, |a, b| a.dtype == b.dtype)
    }),
    cond("same-type", 2, "two tensors of equal dtype, shape and weakness", same_type),
    cond("broadcasts-into", 2, "the first tensor's shape broadcasts to exactly the second's", |g, s, v| {
        both(g, s, v, |a, x| broadcasts_into(&a.shape, &x.shape))
    }),
    cond("absorbs", 2, "`?x ⊙ ?c` for arithmetic ⊙ has exactly the type of ?x, weakness included", absorbs),
    cond("param-of", 2, "?g broadcasts into ?x and has its dtype (gamma, beta of a norm)", |g, s, v| {
        both(g, s, v, |p, x| broadcasts_into(&p.shape, &x.shape) && p.dtype == x.dtype)
    }),
    cond("has-shape", 2, "tensor ?x has exactly the shape literal ?dims", has_shape),
    cond("unit-axis", 2, "?axis is an axis of ?x of size 1", |g, s, v| {
        axis_of(g, s, v[0], v[1]).is_some_and(|(t, a)| t.shape[a] == 1)
    }),
    cond("last-axis", 2, "?axis is the last axis of ?x", |g, s, v| {
        axis_of(g, s, v[0], v[1]).is_some_and(|(t, a)| a + 1 == t.rank())
    }),
    cond("same-axis", 3, "?a and ?b name the same axis of ?x", same_axis),
    cond("same-axis-pair", 5, "{?a ?b} and {?c ?d} name the same two axes of ?x", same_axis_pair),
    cond("last-two", 4, "{?i ?j} are the last two axes of the broadcast of ?a and ?b (rank >= 2)", last_two),
    cond("size1-at", 3, "?c has rank <= rank ?x and size 1 at ?x's ?axis (constant along it)", size1_at),
    cond("axis-size", 3, "the constant ?n equals the size of ?x along ?axis", axis_size),
    cond(
        "stop-past",
        4,
        "the constant ?m is at least the sizes of ?a and ?b along ?axis added (a slice stop at or past their concatenation's end)",
        |g, s, v| {
            let (Some((a, axis)), Some(b), Some(m)) = (axis_of(g, s, v[0], v[2]), ty(g, s, v[1]), int(g, s, v[3])) else {
                return false;
            };
            b.rank() == a.rank() && m >= (a.shape[axis] + b.shape[axis]) as i64
        },
    ),
    cond("last-dim", 2, "the constant ?n equals the size of ?x's last axis", |g, s, v| {
        let (t, n) = (ty(g, s, v[0]), int(g, s, v[1]));
        matches!((t, n), (Some(t), Some(n)) if t.rank() >= 1 && t.shape[t.rank() - 1] as i64 == n)
    }),
    cond("targets-of", 2, "?t is i32 with the shape of the logits ?x without the last axis", |g, s, v| {
        both(g, s, v, |t, x| t.dtype == DType::I32 && x.rank() >= 1 && t.shape[..] == x.shape[..x.rank() - 1])
    }),
    cond(
        "not-max-shifted",
        1,
        "no node of ?x's class is `y - amax(y, a)` (already shifted by its maximum)",
        |g, s, v| fact(g, s, v[0]).is_some() && class(s, v[0]).is_some_and(|c| !is_max_shifted(g, c)),
    ),
    cond(
        "attention-args",
        3,
        "?q ?k ?v are valid queries, keys and values of attention that its template runs",
        attention_args,
    ),
    cond("mask-fill", 1, "a literal at most -1e4 (a mask's fill: its `exp` against the scores is 0)", |g, s, v| {
        class(s, v[0]).is_some_and(|c| causal::is_fill(g, c))
    }),
    cond(
        "causal-keep",
        3,
        "?m is an index comparison true exactly where key <= query on the scores of ?q and ?k",
        |g, s, v| causal_mask(g, s, v, causal::predicate, false),
    ),
    cond(
        "causal-mask",
        3,
        "?m is an index comparison true exactly where key > query on the scores of ?q and ?k",
        |g, s, v| causal_mask(g, s, v, causal::predicate, true),
    ),
    cond(
        "causal-bias",
        3,
        "?b is 0 where key <= query on the scores of ?q and ?k and a mask fill (<= -1e4) elsewhere",
        |g, s, v| causal_mask(g, s, v, causal::additive_mask, false),
    ),
    cond(
        "attention-bias",
        3,
        "?b is a float tensor (not a literal) that broadcasts to the scores of ?q and ?k and is not their causal mask",
        |g, s, v| {
            let (Some(b), Some(shape)) = (fact(g, s, v[0]), scores_shape(g, s, v)) else { return false };
            matches!(&b.ty, Some(t) if !b.weak && t.dtype.is_float() && broadcasts_into(&t.shape, &shape))
                && !causal_mask(g, s, v, causal::additive_mask, false)
        },
    ),
    cond(
        "attention-mask",
        3,
        "?m is a bool tensor that broadcasts to the scores of ?q and ?k and is not their causal mask",
        |g, s, v| {
            let (Some(m), Some(shape)) = (ty(g, s, v[0]), scores_shape(g, s, v)) else { return false };
            m.dtype == DType::Bool
                && broadcasts_into(&m.shape, &shape)
                && !causal_mask(g, s, v, causal::predicate, false)
                && !causal_mask(g, s, v, causal::predicate, true)
        },
    ),
    cond(
        "zero-bias",
        1,
        "?b is a float tensor that is 0 at every element (a literal, or a broadcast, cast or selection of one)",
        |g, s, v| {
            matches!(ty(g, s, v[0]), Some(t) if t.dtype.is_float())
                && class(s, v[0]).is_some_and(|c| causal::uniform(g, c) == Some(0.0))
        },
    ),
];

/// Looks a condition up by its spelling.
pub fn condition(name: &str) -> Option<&'static NamedCondition> {
    CONDITIONS.iter().find(|c| c.name == name)
}

/// Evaluates a condition on a match. Returns `false` if the arity is wrong (the loader rejects
/// that before a rule can run).
pub fn check(cond: &NamedCondition, egraph: &TensorGraph, subst: &Subst, args: &[Var]) -> bool {
    args.len() == cond.arity && (cond.check)(egraph, subst, args)
}

fn class(subst: &Subst, v: Var) -> Option<Id> {
    subst.get(v).copied()
}

fn fact<'a>(g: &'a TensorGraph, s: &Subst, v: Var) -> Option<&'a Fact> {
    g[class(s, v)?].data.fact.as_ref()
}

/// The tensor type of a bound class; `None` for attributes and ill-typed classes.
fn ty<'a>(g: &'a TensorGraph, s: &Subst, v: Var) -> Option<&'a TensorType> {
    fact(g, s, v)?.ty.as_ref()
}

fn sign(g: &TensorGraph, s: &Subst, v: Var) -> Option<crate::search::analysis::Sign> {
    fact(g, s, v)?;
    Some(g[class(s, v)?].data.sign)
}

/// The value of a weak scalar literal (only weak literals carry a value in the analysis).
fn konst(g: &TensorGraph, s: &Subst, v: Var) -> Option<f64> {
    fact(g, s, v).and_then(|f| f.konst)
}

fn int(g: &TensorGraph, s: &Subst, v: Var) -> Option<i64> {
    konst(g, s, v).filter(|k| k.fract() == 0.0 && k.abs() < 1e15).map(|k| k as i64)
}

fn both(g: &TensorGraph, s: &Subst, v: &[Var], f: impl Fn(&TensorType, &TensorType) -> bool) -> bool {
    matches!((ty(g, s, v[0]), ty(g, s, v[1])), (Some(a), Some(b)) if f(a, b))
}

fn broadcasts_into(a: &[usize], x: &[usize]) -> bool {
    broadcast_shapes(a, x).is_ok_and(|b| b == x)
}

/// A tensor variable and an axis variable, the axis normalised against the tensor's rank.
fn axis_of<'a>(g: &'a TensorGraph, s: &Subst, x: Var, axis: Var) -> Option<(&'a TensorType, usize)> {
    let t = ty(g, s, x)?;
    Some((t, norm_axis(int(g, s, axis)?, t.rank()).ok()?))
}

fn axes(g: &TensorGraph, s: &Subst, rank: usize, vars: &[Var]) -> Option<Vec<usize>> {
    vars.iter().map(|&v| norm_axis(int(g, s, v)?, rank).ok()).collect()
}

fn same_type(g: &TensorGraph, s: &Subst, v: &[Var]) -> bool {
    match (fact(g, s, v[0]), fact(g, s, v[1])) {
        (Some(a), Some(b)) => a.ty.is_some() && a.ty == b.ty && a.weak == b.weak,
        _ => false,
    }
}

fn absorbs(g: &TensorGraph, s: &Subst, v: &[Var]) -> bool {
    let (Some(x), Some(c)) = (fact(g, s, v[0]), fact(g, s, v[1])) else { return false };
    let Some(xt) = &x.ty else { return false };
    let add = OpCode::of(Kind::Binary(Binary::Add));
    infer(add, &[x, c]).is_ok_and(|r| &r.ty == xt && r.weak == x.weak)
}

fn has_shape(g: &TensorGraph, s: &Subst, v: &[Var]) -> bool {
    let dims = fact(g, s, v[1]).and_then(|f| f.dims.as_ref());
    matches!((ty(g, s, v[0]), dims), (Some(t), Some(d)) if &t.shape == d)
}

fn same_axis(g: &TensorGraph, s: &Subst, v: &[Var]) -> bool {
    let Some(t) = ty(g, s, v[0]) else { return false };
    axes(g, s, t.rank(), &v[1..]).is_some_and(|a| a[0] == a[1])
}

fn same_axis_pair(g: &TensorGraph, s: &Subst, v: &[Var]) -> bool {
    let Some(t) = ty(g, s, v[0]) else { return false };
    let Some(a) = axes(g, s, t.rank(), &v[1..]) else { return false };
    (a[0] == a[2] && a[1] == a[3]) || (a[0] == a[3] && a[1] == a[2])
}

fn last_two(g: &TensorGraph, s: &Subst, v: &[Var]) -> bool {
    let (Some(a), Some(b)) = (ty(g, s, v[2]), ty(g, s, v[3])) else { return false };
    let r = a.rank().max(b.rank());
    if a.rank() < 2 || b.rank() < 2 {
        return false;
    }
    let Some(ij) = axes(g, s, r, &v[..2]) else { return false };
    (ij[0] == r - 1 && ij[1] == r - 2) || (ij[0] == r - 2 && ij[1] == r - 1)
}

fn size1_at(g: &TensorGraph, s: &Subst, v: &[Var]) -> bool {
    let (Some(c), Some((x, axis))) = (ty(g, s, v[0]), axis_of(g, s, v[1], v[2])) else { return false };
    if c.rank() > x.rank() {
        return false;
    }
    // `c` is aligned with `x` from the right; an axis `c` lacks counts as size 1.
    let lead = x.rank() - c.rank();
    axis < lead || c.shape[axis - lead] == 1
}

fn axis_size(g: &TensorGraph, s: &Subst, v: &[Var]) -> bool {
    let (Some((x, axis)), Some(n)) = (axis_of(g, s, v[0], v[1]), int(g, s, v[2])) else { return false };
    x.shape[axis] as i64 == n
}

/// Whether a node of the class is `(* y c)` or `(* c y)` with `c` a literal other than 1.
fn is_scaled(g: &TensorGraph, class: Id) -> bool {
    let mul = OpCode::of(Kind::Binary(Binary::Mul));
    let scale = |c: Id| g[c].data.konst().is_some_and(|k| k != 1.0);
    g[class].nodes.iter().any(|n| matches!(n, TensorLang::Op(op, ch) if *op == mul && (scale(ch[0]) || scale(ch[1]))))
}

/// Whether a node of the class is `(- y (amax y a))`.
fn is_max_shifted(g: &TensorGraph, class: Id) -> bool {
    let amax = OpCode::of(Kind::Reduce(Reduce::Amax));
    let sub = OpCode::of(Kind::Binary(Binary::Sub));
    g[class].nodes.iter().any(|n| match n {
        TensorLang::Op(op, ch) if *op == sub => g[ch[1]]
            .nodes
            .iter()
            .any(|m| matches!(m, TensorLang::Op(op2, ch2) if *op2 == amax && g.find(ch2[0]) == g.find(ch[0]))),
        _ => false,
    })
}

/// The shape of the scores `[..., SQ, SK]` of queries `v[1]` and keys `v[2]` (of one rank, 2 or
/// more).
fn scores_shape(g: &TensorGraph, s: &Subst, v: &[Var]) -> Option<Vec<usize>> {
    let (q, k) = (ty(g, s, v[1])?, ty(g, s, v[2])?);
    let r = q.rank();
    if r < 2 || k.rank() != r {
        return None;
    }
    let mut shape = q.shape.clone();
    shape[r - 1] = k.shape[r - 2];
    Some(shape)
}

fn attention_args(g: &TensorGraph, s: &Subst, v: &[Var]) -> bool {
    let facts: Option<Vec<&Fact>> = v.iter().map(|&x| fact(g, s, x)).collect();
    let Some(mut facts) = facts else { return false };
    if facts.iter().any(|f| f.ty.is_none() || f.weak) {
        return false;
    }
    let tys: Vec<&TensorType> = facts.iter().filter_map(|f| f.ty.as_ref()).collect();
    if !crate::codegen::caps::attention_runs(tys[0], tys[1], tys[2]) {
        return false;
    }
    let (scale, causal) = (Fact::constant(1.0), Fact::constant(0.0));
    facts.extend([&scale, &causal]);
    infer(OpCode::of(Kind::Composite(Composite::Attention)), &facts).is_ok()
}

/// Whether the mask `v[0]` (described by `describe`) is, on the scores of queries `v[1]` and keys
/// `v[2]`, the causal predicate (`key <= query`), or its complement when `complement`.
fn causal_mask(
    g: &TensorGraph,
    s: &Subst,
    v: &[Var],
    describe: fn(&TensorGraph, Id) -> Option<causal::Affine>,
    complement: bool,
) -> bool {
    let (Some(m), Some(q), Some(k)) = (class(s, v[0]), class(s, v[1]), class(s, v[2])) else { return false };
    let Some(keep) = causal::scores_keep(g, q, k) else { return false };
    let want = if complement { keep.complement() } else { keep };
    describe(g, m).and_then(|p| p.align(&want.shape)).is_some_and(|p| p == want)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::lang::TensorLang;
    use crate::search::analysis::ShapeAnalysis;
    use egg::RecExpr;

    fn graph() -> TensorGraph {
        let f = |s: &[usize]| TensorType::new(DType::F32, s.to_vec());
        TensorGraph::new(ShapeAnalysis::new([("x".to_string(), f(&[4, 8])), ("c".to_string(), f(&[4, 1]))]))
    }

    fn bind(g: &mut TensorGraph, pairs: &[(&str, &str)]) -> (Subst, Vec<Var>) {
        let mut s = Subst::default();
        let mut vars = vec![];
        for (v, e) in pairs {
            let id = g.add_expr(&e.parse::<RecExpr<TensorLang>>().unwrap());
            let var: Var = v.parse().unwrap();
            s.insert(var, id);
            vars.push(var);
        }
        g.rebuild();
        (s, vars)
    }

    fn holds(name: &str, pairs: &[(&str, &str)]) -> bool {
        let mut g = graph();
        let (s, vars) = bind(&mut g, pairs);
        check(condition(name).unwrap(), &g, &s, &vars)
    }

    #[test]
    fn signs_come_from_the_analysis() {
        assert!(holds("positive", &[("?a", "(exp x)")]));
        assert!(holds("positive", &[("?a", "(+ (square x) 0.5)")]));
        assert!(!holds("positive", &[("?a", "x")]));
        assert!(holds("nonzero", &[("?a", "(neg (exp x))")]));
    }

    #[test]
    fn shapes_and_axes() {
        assert!(holds("size1-at", &[("?c", "c"), ("?x", "x"), ("?a", "-1")]));
        assert!(!holds("size1-at", &[("?c", "c"), ("?x", "x"), ("?a", "0")]));
        assert!(holds("same-axis", &[("?x", "x"), ("?a", "-1"), ("?b", "1")]));
        assert!(holds("last-two", &[("?i", "1"), ("?j", "-2"), ("?a", "x"), ("?b", "x")]));
        assert!(holds("axis-size", &[("?x", "x"), ("?a", "1"), ("?n", "8")]));
        assert!(holds("has-shape", &[("?x", "x"), ("?s", "[4,8]")]));
        assert!(holds("absorbs", &[("?x", "x"), ("?c", "2")]));
        assert!(!holds("absorbs", &[("?x", "2"), ("?c", "x")]));
    }

    #[test]
    fn ill_typed_classes_are_false() {
        for c in CONDITIONS {
            let pairs: Vec<(String, &str)> = (0..c.arity).map(|i| (format!("?v{i}"), "(exp [2,3])")).collect();
            let pairs: Vec<(&str, &str)> = pairs.iter().map(|(a, b)| (a.as_str(), *b)).collect();
            assert!(!holds(c.name, &pairs), "{}", c.name);
        }
    }
}
