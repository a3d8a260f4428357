//! Index expressions: what a mask built from `iota` computes, for the planner's conditions that
//! recognise attention's causal mask however a program spells it (`causal-keep`, `causal-mask`,
//! `causal-bias`, over e-classes) and for autodiff, which recognises written attention in a
//! program to differentiate it as the composite it equals (over a program's nodes). Both are an
//! [`IndexGraph`]: each id is computed by one or more nodes, each of which computes its value.
//!
//! An integer-valued class built from `iota` by layout ops (`reshape`, `broadcast`,
//! `transpose`), exact casts, `+`, `-`, negation and products with integer literals is an
//! [`Affine`] function of its element's indices. A comparison of two such classes (and `not` of
//! one) is true exactly where an affine function is `>= 0`, so a mask is known by that function:
//! `reshape(iota(S), [S, 1]) >= iota(S)`, `iota(S) < reshape(iota(S), [S, 1]) + 1` and
//! `not(iota(S) > reshape(iota(S), [S, 1]))` all give `row - col >= 0`.
//! Invariant: a class is described only by what one of its nodes provably computes (every node
//! of a class has the class's value), values stay below 2^24 in magnitude so that f32 and i32
//! hold them exactly, and anything else gives `None`.

use egg::Id;

use crate::ir::infer::norm_axis;
use crate::ir::lang::{Binary, Kind, TensorLang, Unary};
use crate::ir::program::Program;
use crate::ir::types::{DType, TensorType};

/// Values and the nodes that compute them: an e-graph's classes, or a program's nodes.
pub trait IndexGraph {
    /// The nodes that compute `id`'s value (every one of them computes it).
    fn nodes(&self, id: Id) -> &[TensorLang];
    /// The type of `id`'s value (`None` for an attribute).
    fn ty(&self, id: Id) -> Option<&TensorType>;
    /// The value of `id` where it is a literal.
    fn konst(&self, id: Id) -> Option<f64>;
}

impl IndexGraph for Program {
    fn nodes(&self, id: Id) -> &[TensorLang] {
        std::slice::from_ref(self.node(id))
    }
    fn ty(&self, id: Id) -> Option<&TensorType> {
        Program::ty(self, id)
    }
    fn konst(&self, id: Id) -> Option<f64> {
        self.fact(id).konst
    }
}

/// E-classes followed at most this deep from the mask.
const DEPTH: usize = 12;
/// Values stay below this in magnitude, so that f32 holds every one exactly.
const EXACT: i64 = 1 << 24;
/// A mask's fill is a literal at most this (`-1e30`, `-1e9`, BERT's `-10000`): `exp` of a score
/// minus it is 0 in every float type while the scores stay below a few thousand in magnitude.
pub const MASK_FILL: f64 = -1e4;

/// `off + Σ coef[a] * i[a]` at the element of index `i` of a tensor of shape `shape`; `coef[a]`
/// is 0 where `shape[a]` is 1 (the index is always 0 there), so equal functions compare equal.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Affine {
    pub shape: Vec<usize>,
    pub coef: Vec<i64>,
    pub off: i64,
}

impl Affine {
    fn new(shape: Vec<usize>, mut coef: Vec<i64>, off: i64) -> Affine {
        for (c, &n) in coef.iter_mut().zip(&shape) {
            if n == 1 {
                *c = 0;
            }
        }
        Affine { shape, coef, off }
    }

    fn scalar(off: i64) -> Affine {
        Affine { shape: vec![], coef: vec![], off }
    }

    /// The largest magnitude a value reaches.
    fn bound(&self) -> i64 {
        self.coef.iter().zip(&self.shape).fold(self.off.saturating_abs(), |b, (&c, &n)| {
            b.saturating_add(c.saturating_abs().saturating_mul(n.saturating_sub(1) as i64))
        })
    }

    /// The same function on a shape this one broadcasts into (`None` if it does not).
    pub fn align(&self, shape: &[usize]) -> Option<Affine> {
        let lead = shape.len().checked_sub(self.shape.len())?;
        let mut coef = vec![0; shape.len()];
        for (a, &n) in self.shape.iter().enumerate() {
            if n == shape[lead + a] {
                coef[lead + a] = self.coef[a];
            } else if n != 1 {
                return None;
            }
        }
        Some(Affine::new(shape.to_vec(), coef, self.off))
    }

    /// `ka * self + kb * other + off` on `shape` (both broadcast into it).
    fn combine(&self, ka: i64, other: &Affine, kb: i64, off: i64, shape: &[usize]) -> Option<Affine> {
        let (a, b) = (self.align(shape)?, other.align(shape)?);
        let coef = a.coef.iter().zip(&b.coef).map(|(&x, &y)| ka * x + kb * y).collect();
        Some(Affine::new(shape.to_vec(), coef, ka * a.off + kb * b.off + off))
    }

    /// For a predicate `self >= 0` over integer indices: the same predicate with coefficients
    /// divided by their greatest common divisor (`2i - 2j + 1 >= 0` is `i - j >= 0`).
    fn reduced(mut self) -> Affine {
        let g = self.coef.iter().fold(0, |g, &c| gcd(g, c.abs()));
        if g > 1 {
            self.coef.iter_mut().for_each(|c| *c /= g);
            self.off = self.off.div_euclid(g);
        }
        self
    }

    /// The predicate `self < 0` written as `other >= 0`.
    pub fn complement(&self) -> Affine {
        let coef = self.coef.iter().map(|c| -c).collect();
        Affine::new(self.shape.clone(), coef, -self.off - 1)
    }

    /// `i[r-2] - i[r-1]` on `shape` (rank >= 2): the causal predicate `key <= query` as `>= 0`.
    pub fn causal_keep(shape: &[usize]) -> Option<Affine> {
        let r = shape.len();
        if r < 2 {
            return None;
        }
        let mut coef = vec![0; r];
        coef[r - 2] = 1;
        coef[r - 1] = -1;
        Some(Affine::new(shape.to_vec(), coef, 0))
    }
}

fn gcd(a: i64, b: i64) -> i64 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

fn shape_of<G: IndexGraph + ?Sized>(g: &G, id: Id) -> Option<(&[usize], DType)> {
    g.ty(id).map(|t| (&t.shape[..], t.dtype))
}

/// An integer literal's value.
fn int_const<G: IndexGraph + ?Sized>(g: &G, id: Id) -> Option<i64> {
    g.konst(id).filter(|v| v.fract() == 0.0 && v.abs() < EXACT as f64).map(|v| v as i64)
}

/// The function a layout op (`reshape`, `broadcast`, `transpose`) makes of its operand's, given
/// the operand's function `x` and the op's result shape.
fn layout<G: IndexGraph + ?Sized>(g: &G, kind: Kind, ch: &[Id], x: Affine, shape: &[usize]) -> Option<Affine> {
    match kind {
        Kind::Broadcast => x.align(shape),
        Kind::Reshape => {
            // Only size-1 axes come and go: the other axes keep their order and sizes.
            let keep =
                |s: &[usize]| s.iter().enumerate().filter(|(_, &n)| n != 1).map(|(a, &n)| (a, n)).collect::<Vec<_>>();
            let (from, to) = (keep(&x.shape), keep(shape));
            if from.iter().map(|p| p.1).ne(to.iter().map(|p| p.1)) {
                return None;
            }
            let mut coef = vec![0; shape.len()];
            for ((a, _), (b, _)) in from.iter().zip(&to) {
                coef[*b] = x.coef[*a];
            }
            Some(Affine::new(shape.to_vec(), coef, x.off))
        }
        Kind::Transpose => {
            let r = x.shape.len();
            let a = norm_axis(int_const(g, ch[1])?, r).ok()?;
            let b = norm_axis(int_const(g, ch[2])?, r).ok()?;
            let mut y = x;
            y.shape.swap(a, b);
            y.coef.swap(a, b);
            (y.shape == shape).then_some(y)
        }
        _ => None,
    }
}

fn is_layout(kind: Kind) -> bool {
    matches!(kind, Kind::Reshape | Kind::Broadcast | Kind::Transpose)
}

/// The class's value as an affine function of its indices, if it is an i32 or f32 index
/// expression (or an integer literal), following nodes at most `depth` deep.
fn affine_at<G: IndexGraph + ?Sized>(g: &G, id: Id, depth: usize) -> Option<Affine> {
    if let Some(v) = int_const(g, id) {
        return Some(Affine::scalar(v));
    }
    let (shape, dtype) = shape_of(g, id)?;
    if depth == 0 || !matches!(dtype, DType::I32 | DType::F32) {
        return None;
    }
    g.nodes(id).iter().find_map(|n| affine_node(g, n, shape, depth - 1).filter(|a| a.bound() < EXACT))
}

fn affine_node<G: IndexGraph + ?Sized>(g: &G, node: &TensorLang, shape: &[usize], depth: usize) -> Option<Affine> {
    let TensorLang::Op(code, ch) = node else { return None };
    let arg = |i: usize| affine_at(g, ch[i], depth);
    match code.kind() {
        Kind::Iota if shape.len() == 1 => Some(Affine::new(shape.to_vec(), vec![1], 0)),
        k if is_layout(k) => layout(g, k, ch, arg(0)?, shape),
        // Integers below 2^24 convert exactly between i32 and f32.
        Kind::Cast => matches!(shape_of(g, ch[0])?.1, DType::I32 | DType::F32).then(|| arg(0)).flatten(),
        Kind::Unary(Unary::Neg) => arg(0)?.combine(-1, &Affine::scalar(0), 0, 0, shape),
        Kind::Binary(Binary::Add) => arg(0)?.combine(1, &arg(1)?, 1, 0, shape),
        Kind::Binary(Binary::Sub) => arg(0)?.combine(1, &arg(1)?, -1, 0, shape),
        Kind::Binary(Binary::Mul) => {
            let (k, x) = match (int_const(g, ch[0]), int_const(g, ch[1])) {
                (Some(k), _) => (k, arg(1)?),
                (_, Some(k)) => (k, arg(0)?),
                _ => return None,
            };
            x.combine(k, &Affine::scalar(0), 0, 0, shape)
        }
        _ => None,
    }
}

/// For a bool class: the affine function `e` with the class true exactly where `e >= 0`.
pub fn predicate<G: IndexGraph + ?Sized>(g: &G, id: Id) -> Option<Affine> {
    predicate_at(g, id, DEPTH)
}

fn predicate_at<G: IndexGraph + ?Sized>(g: &G, id: Id, depth: usize) -> Option<Affine> {
    let (shape, dtype) = shape_of(g, id)?;
    if depth == 0 || dtype != DType::Bool {
        return None;
    }
    g.nodes(id).iter().find_map(|n| predicate_node(g, n, shape, depth - 1).filter(|a| a.bound() < EXACT))
}

fn predicate_node<G: IndexGraph + ?Sized>(g: &G, node: &TensorLang, shape: &[usize], depth: usize) -> Option<Affine> {
    let TensorLang::Op(code, ch) = node else { return None };
    let e = match code.kind() {
        Kind::Unary(Unary::Not) => predicate_at(g, ch[0], depth)?.complement(),
        k if is_layout(k) => layout(g, k, ch, predicate_at(g, ch[0], depth)?, shape)?,
        Kind::Binary(b @ (Binary::Ge | Binary::Gt | Binary::Le | Binary::Lt)) => {
            let (x, y) = (affine_at(g, ch[0], depth)?, affine_at(g, ch[1], depth)?);
            // Over integers, `x > y` is `x - y - 1 >= 0`.
            match b {
                Binary::Ge => x.combine(1, &y, -1, 0, shape)?,
                Binary::Gt => x.combine(1, &y, -1, -1, shape)?,
                Binary::Le => y.combine(1, &x, -1, 0, shape)?,
                _ => y.combine(1, &x, -1, -1, shape)?,
            }
        }
        _ => return None,
    };
    Some(e.reduced())
}

/// For a float class that is 0 or a mask fill at each element (an additive mask): the predicate
/// (as in [`predicate`]) of the elements that are 0; the others are at most [`MASK_FILL`].
pub fn additive_mask<G: IndexGraph + ?Sized>(g: &G, id: Id) -> Option<Affine> {
    additive_mask_at(g, id, DEPTH)
}

fn additive_mask_at<G: IndexGraph + ?Sized>(g: &G, id: Id, depth: usize) -> Option<Affine> {
    let (shape, dtype) = shape_of(g, id)?;
    if depth == 0 || !dtype.is_float() {
        return None;
    }
    g.nodes(id).iter().find_map(|n| additive_mask_node(g, n, shape, depth - 1))
}

/// A literal at most [`MASK_FILL`] (or a class holding one).
pub fn is_fill<G: IndexGraph + ?Sized>(g: &G, id: Id) -> bool {
    g.konst(id).is_some_and(|v| v <= MASK_FILL)
}

fn is_zero<G: IndexGraph + ?Sized>(g: &G, id: Id) -> bool {
    g.konst(id) == Some(0.0)
}

/// The one value every element of `id` holds, where its nodes prove it: a literal, or a
/// `broadcast`, `reshape`, `transpose` or `cast` of such a value, or a `where` whose condition
/// holds one value (or whose two branches hold the same). Casts are followed only for values
/// every dtype holds exactly (integers of magnitude under 256) and to `bool` (any value, as
/// nonzero or not). A mask built as `ones(...).bool()` expanded to the scores (`transformers`'
/// masks where no position is padded) is uniformly true, and its bias `where(m, 0, FILL)`
/// uniformly 0.
pub fn uniform<G: IndexGraph + ?Sized>(g: &G, id: Id) -> Option<f64> {
    uniform_at(g, id, DEPTH)
}

fn uniform_at<G: IndexGraph + ?Sized>(g: &G, id: Id, depth: usize) -> Option<f64> {
    if let Some(v) = g.konst(id) {
        return Some(v);
    }
    if depth == 0 {
        return None;
    }
    let (_, dtype) = shape_of(g, id)?;
    g.nodes(id).iter().find_map(|n| {
        let TensorLang::Op(code, ch) = n else { return None };
        match code.kind() {
            Kind::Broadcast | Kind::Reshape | Kind::Transpose => uniform_at(g, ch[0], depth - 1),
            Kind::Cast => {
                let v = uniform_at(g, ch[0], depth - 1)?;
                if dtype == DType::Bool {
                    (!v.is_nan()).then_some(if v != 0.0 { 1.0 } else { 0.0 })
                } else {
                    (v.fract() == 0.0 && v.abs() < 256.0).then_some(v)
                }
            }
            Kind::Where => match uniform_at(g, ch[0], depth - 1) {
                Some(c) => uniform_at(g, if c != 0.0 { ch[1] } else { ch[2] }, depth - 1),
                None => {
                    let a = uniform_at(g, ch[1], depth - 1)?;
                    (uniform_at(g, ch[2], depth - 1) == Some(a)).then_some(a)
                }
            },
            _ => None,
        }
    })
}

fn additive_mask_node<G: IndexGraph + ?Sized>(
    g: &G,
    node: &TensorLang,
    shape: &[usize],
    depth: usize,
) -> Option<Affine> {
    let TensorLang::Op(code, ch) = node else { return None };
    match code.kind() {
        Kind::Where => {
            let p = predicate_at(g, ch[0], depth)?.align(shape)?;
            if is_zero(g, ch[1]) && is_fill(g, ch[2]) {
                Some(p)
            } else if is_fill(g, ch[1]) && is_zero(g, ch[2]) {
                Some(p.complement())
            } else {
                None
            }
        }
        // Rounding keeps 0 at 0 and a fill at most `MASK_FILL` (or -inf).
        Kind::Cast if shape_of(g, ch[0])?.1.is_float() => additive_mask_at(g, ch[0], depth),
        // `cast(m, f32) * fill`: the fill where `m` holds, 0 (or -0) elsewhere.
        Kind::Binary(Binary::Mul) => {
            let (fill, ind) = if is_fill(g, ch[0]) { (ch[0], ch[1]) } else { (ch[1], ch[0]) };
            if !is_fill(g, fill) {
                return None;
            }
            let p = g.nodes(ind).iter().find_map(|n| match n {
                TensorLang::Op(c, x) if c.kind() == Kind::Cast && shape_of(g, x[0])?.1 == DType::Bool => {
                    predicate_at(g, x[0], depth)?.align(shape_of(g, ind)?.0)
                }
                _ => None,
            })?;
            Some(p.align(shape)?.complement())
        }
        k if is_layout(k) => layout(g, k, ch, additive_mask_at(g, ch[0], depth)?, shape),
        _ => None,
    }
}

/// The causal predicate (`key <= query`) on the scores of queries `q` and keys `k`
/// (`[..., SQ, SK]`), if their types allow attention's scores.
pub fn scores_keep<G: IndexGraph + ?Sized>(g: &G, q: Id, k: Id) -> Option<Affine> {
    let (qs, _) = shape_of(g, q)?;
    let (ks, _) = shape_of(g, k)?;
    let r = qs.len();
    if r < 2 || ks.len() != r {
        return None;
    }
    let mut shape = qs.to_vec();
    shape[r - 1] = ks[r - 2];
    Affine::causal_keep(&shape)
}
