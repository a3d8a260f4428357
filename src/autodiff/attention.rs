//! Written-out attention differentiated as the composite it equals.
//!
//! A program that writes `softmax(q @ kᵀ * scale [+ bias] [masked]) @ v` plans its forward as one
//! attention kernel (the `patterns` rules recognise it in the e-graph), but the sweep runs before
//! the e-graph exists, so the primitive VJPs of the softmax and the two products would write the
//! `[..., SQ, SK]` score gradient several times over. [`Tape::written_attention`] recognises the
//! product `P @ v` of such a softmax `P` and gives its operands the contributions of the
//! composite (`attention`, `attention_bias`, their dropout forms, causal or not), whose backward
//! is the flash-style kernels ([`Tape::attention_flash`]).
//!
//! What is recognised, on the nodes as written (the spellings the forward's rules take):
//! - `P`: `softmax(S, last axis)` or its decomposition `e / sum(e)` with `e = exp(S - amax(S))`,
//!   under float casts (an f32 softmax of 16-bit scores cast back) and at most one
//!   `dropout(·, p, seed)`;
//! - `S`: `a @ transpose(b, r-2, r-1)` (the axes in any order and sign), or `a @ b` with `b` the
//!   keys stored transposed (`[..., D, SK]`: the composite reads `transpose(b)`, and `b`'s
//!   gradient is the keys' transposed), with literal factors
//!   (`* c`, `c *`, `/ c`) on the product, on `a` (the queries are `a` without them) and on `b`
//!   or its transpose; then any nesting of float casts, literal scales, `where(m, S, fill)` or
//!   `where(m, fill, S)` with a literal `fill <= -1e4`, and additive terms `S + t` or `t + S`;
//! - a `where` whose mask is the causal one (`crate::ir::index::predicate`), or an added term
//!   that is the causal additive mask (`crate::ir::index::additive_mask`), makes it causal; any
//!   other bool mask becomes the bias `where(m, 0, fill)` (or `where(m, fill, 0)`), any other
//!   term the bias; at most one bias. A bool mask beside the causal one is not causal: the bias
//!   is both, nested as written (`where(m, where(c, 0, f1), f2)`, a causal additive mask added
//!   in f32), because the causal flag would spread a row both hide entirely over the keys up to
//!   its diagonal where the scores as written spread it over every key (as the rules say).
//!
//! Invariant (the reason this is sound): the composite computes `P @ v` as written, up to the
//! rounding of the intermediate values and masked scores of `fill` against `-inf` (whose
//! exponentials are 0 in every float type while the scores stay below a few thousand), so its
//! VJP is the VJP of `P @ v` as a function of q, k and v. Other uses of `P` or of the scores (an
//! output, another consumer) keep their adjoints, and those flow through the primitive VJPs:
//! the gradient is the sum of both by linearity. Only where the flash kernels run
//! (`codegen::caps::attention_backward_runs`) and the bias (if any) needs no gradient;
//! otherwise the primitive VJPs are exact and no slower than the composite's decomposition.

use egg::Id;

use super::{Tape, R};
use crate::ir::index::{self, MASK_FILL};
use crate::ir::infer::{infer, norm_axis, Fact};
use crate::ir::lang::{Binary, Composite, Kind, OpCode, TensorLang};
use crate::ir::types::{DType, TensorType};

/// A term of the scores besides `a @ bᵀ * scale`.
#[derive(Clone, Copy)]
enum Term {
    /// `where(mask, S, fill)` (`keep`) or `where(mask, fill, S)`.
    Where { mask: Id, fill: f64, keep: bool },
    /// `S + t`.
    Add(Id),
}

/// The scores as parsed: `q @ kᵀ * scale` and the terms around the product.
struct Scores {
    q: Id,
    /// The keys, `[..., SK, D]`; with `keys_transposed`, the product's right operand as given,
    /// `[..., D, SK]` (keys stored transposed, `q @ k_t`).
    k: Id,
    keys_transposed: bool,
    scale: f64,
    terms: Vec<Term>,
}

/// Follows nodes at most this deep from the softmax (casts, scales and terms around the scores).
const DEPTH: usize = 16;

impl Tape<'_> {
    /// The contributions of `n = P @ v`'s adjoint `g` where `n` is written-out attention that
    /// the flash backward runs (see the module docs); `None` otherwise.
    pub(super) fn written_attention(&mut self, n: Id, g: Id) -> R<Option<Vec<(Id, Id)>>> {
        if !self.recognise_attention {
            return Ok(None);
        }
        let TensorLang::Op(code, ch) = self.p.node(n) else { return Ok(None) };
        if code.kind() != Kind::MatMul {
            return Ok(None);
        }
        let (probs, v) = (ch[0], ch[1]);
        let Some((scores, drop)) = self.probabilities(probs) else { return Ok(None) };
        let Some(mut s) = self.scores(scores, DEPTH) else { return Ok(None) };
        let (Some(tq), Some(tk), Some(tv)) = (self.p.ty(s.q), self.p.ty(s.k), self.p.ty(v)) else { return Ok(None) };
        let mut tk = tk.clone();
        let rank = tk.rank();
        if s.keys_transposed {
            if rank < 2 {
                return Ok(None);
            }
            tk.shape.swap(rank - 2, rank - 1);
        }
        if !crate::codegen::caps::attention_backward_runs(tq, &tk, tv) || !self.valid(s.q, s.k, &tk, v) {
            return Ok(None);
        }
        let Some((causal, terms)) = self.classify(&s, &tk, scores) else { return Ok(None) };
        let fits = |t: &Term| match *t {
            Term::Add(b) => !self.on(b) && self.bias_fits(b, s.q, &tk, false),
            Term::Where { mask, .. } => self.bias_fits(mask, s.q, &tk, true),
        };
        if !terms.iter().all(fits) {
            return Ok(None);
        }
        // Keys given transposed: the composite reads `transpose(k_t)` (a view), and its key
        // gradient goes back to `k_t` transposed.
        let given = s.k;
        if s.keys_transposed {
            let (a, b) = (self.p.num(rank as f64 - 2.0), self.p.num(rank as f64 - 1.0));
            s.k = self.op(Kind::Transpose, vec![given, a, b])?;
            self.extend_active();
        }
        let mut bias = None;
        for t in terms {
            bias = Some(match (t, bias) {
                (Term::Add(b), None) => b,
                // A causal additive mask beside a bool mask (`classify`): their sum, in f32.
                (Term::Add(b), Some(inner)) => {
                    let b = self.cast(b, DType::F32)?;
                    self.bin(Binary::Add, inner, b)?
                }
                (Term::Where { mask, fill, keep }, inner) => {
                    // The bias of a bool mask: the bias inside it (0 if none, f32) where a key is
                    // kept, the fill elsewhere.
                    let (inner, f) = (inner.unwrap_or_else(|| self.p.num(0.0)), self.p.num(fill));
                    let (a, b) = if keep { (inner, f) } else { (f, inner) };
                    self.op(Kind::Where, vec![mask, a, b])?
                }
            });
        }
        let scale = self.p.num(s.scale);
        let causal = self.p.num(if causal { 1.0 } else { 0.0 });
        let mut out = Vec::new();
        self.attention_flash(&[s.q, s.k, v, scale, causal], bias, drop, n, g, &mut out)?;
        if s.keys_transposed {
            for (x, d) in &mut out {
                if *x == s.k {
                    let (a, b) = (self.p.num(rank as f64 - 2.0), self.p.num(rank as f64 - 1.0));
                    (*x, *d) = (given, self.op(Kind::Transpose, vec![*d, a, b])?);
                }
            }
        }
        Ok(Some(out))
    }

    /// `P` as the softmax of some scores along their last axis, under float casts and at most
    /// one dropout: (the scores, the dropout's probability and seed).
    fn probabilities(&self, mut x: Id) -> Option<(Id, Option<(Id, Id)>)> {
        let mut drop = None;
        for _ in 0..4 {
            match self.p.node(x) {
                TensorLang::Op(c, ch) if c.kind() == Kind::Cast && self.float(ch[0]) && self.float(x) => x = ch[0],
                TensorLang::Op(c, ch) if c.kind() == Kind::Dropout && drop.is_none() => {
                    drop = Some((ch[1], ch[2]));
                    x = ch[0];
                }
                _ => break,
            }
        }
        let (scores, axis) = match self.p.node(x) {
            TensorLang::Op(c, ch) if c.kind() == Kind::Composite(Composite::Softmax) => (ch[0], ch[1]),
            _ => match self.softmax_parts(x) {
                Some((false, parts)) => (parts.x, parts.axis),
                _ => return None,
            },
        };
        let rank = self.p.ty(scores)?.rank();
        let a = norm_axis(self.p.fact(axis).konst? as i64, rank).ok()?;
        (a + 1 == rank).then_some((scores, drop))
    }

    /// The scores `x` parsed (see the module docs), following at most `depth` nodes.
    fn scores(&self, x: Id, depth: usize) -> Option<Scores> {
        if depth == 0 {
            return None;
        }
        let TensorLang::Op(code, ch) = self.p.node(x) else { return None };
        match code.kind() {
            Kind::MatMul => {
                let (q, qs) = self.unscaled(ch[0]);
                let (kt, ts) = self.unscaled(ch[1]);
                let rank = self.p.ty(kt)?.rank();
                let swapped = match self.p.node(kt) {
                    TensorLang::Op(t, tch) if t.kind() == Kind::Transpose => {
                        let axes = [tch.get(1)?, tch.get(2)?]
                            .map(|&a| self.p.fact(a).konst.map(|v| norm_axis(v as i64, rank)));
                        matches!(axes, [Some(Ok(a)), Some(Ok(b))] if a.min(b) + 2 == rank && a.max(b) + 1 == rank)
                            .then_some(tch[0])
                    }
                    _ => None,
                };
                Some(match swapped {
                    Some(k) => {
                        let (k, ks) = self.unscaled(k);
                        Scores { q, k, keys_transposed: false, scale: qs * ts * ks, terms: vec![] }
                    }
                    // No transpose: the keys are stored transposed (or the product is not
                    // attention's, which `valid` tells once the keys are transposed back).
                    None => Scores { q, k: kt, keys_transposed: true, scale: qs * ts, terms: vec![] },
                })
            }
            Kind::Cast if self.float(ch[0]) && self.float(x) => self.scores(ch[0], depth - 1),
            Kind::Binary(Binary::Mul | Binary::Div) => {
                let (inner, c) = self.scaled(x)?;
                let mut s = self.scores(inner, depth - 1)?;
                // A factor outside a `where` scales its fill too; outside an added term, the
                // term (the composite adds the bias to the scaled product): not recognised.
                if c <= 0.0 || s.terms.iter().any(|t| matches!(t, Term::Add(_))) {
                    return None;
                }
                for t in &mut s.terms {
                    if let Term::Where { fill, .. } = t {
                        *fill *= c;
                    }
                }
                s.scale *= c;
                Some(s)
            }
            Kind::Binary(Binary::Add) => {
                let (mut s, t) = match self.scores(ch[0], depth - 1) {
                    Some(s) => (s, ch[1]),
                    None => (self.scores(ch[1], depth - 1)?, ch[0]),
                };
                s.terms.push(Term::Add(t));
                Some(s)
            }
            Kind::Where => {
                let (keep, inner, fill) = match (self.p.fact(ch[1]).konst, self.p.fact(ch[2]).konst) {
                    (None, Some(f)) => (true, ch[1], f),
                    (Some(f), None) => (false, ch[2], f),
                    _ => return None,
                };
                let mut s = self.scores(inner, depth - 1)?;
                s.terms.push(Term::Where { mask: ch[0], fill, keep });
                Some(s)
            }
            _ => None,
        }
    }

    /// `x` without literal factors (`x * c`, `c * x`, `x / c`), and their product.
    fn unscaled(&self, mut x: Id) -> (Id, f64) {
        let mut scale = 1.0;
        for _ in 0..DEPTH {
            match self.scaled(x) {
                Some((inner, c)) => {
                    scale *= c;
                    x = inner;
                }
                None => break,
            }
        }
        (x, scale)
    }

    /// `x` as `y * c`, `c * y` or `y / c` for a finite nonzero literal `c`: (y, the factor).
    fn scaled(&self, x: Id) -> Option<(Id, f64)> {
        let (b, l, r) = self.binary_parts(x)?;
        let lit = |id: Id| self.p.fact(id).konst.filter(|c| c.is_finite() && *c != 0.0 && self.p.fact(id).weak);
        let (y, c) = match (b, lit(l), lit(r)) {
            (Binary::Mul, _, Some(c)) => (l, c),
            (Binary::Mul, Some(c), None) => (r, c),
            (Binary::Div, _, Some(c)) => (l, 1.0 / c),
            _ => return None,
        };
        // A literal scale keeps the tensor's type; a broadcast or promoted one is not a scale.
        (self.p.ty(y)? == self.p.ty(x)?).then_some((y, c))
    }

    /// The terms of `s` sorted out: whether the causal mask is among them, and the terms of the
    /// bias, innermost first: none, one (a tensor, or a bool mask), or a bool mask beside the
    /// causal mask, which is then a term of the bias too (the causal flag would spread a row both
    /// hide entirely over the keys up to the diagonal, where the scores as written spread it over
    /// every key: one bias over all keys does as they do). `None` where they are not attention's.
    /// `tk`: the keys' type (`[..., SK, D]`).
    fn classify(&self, s: &Scores, tk: &TensorType, scores: Id) -> Option<(bool, Vec<Term>)> {
        let shape = self.p.ty(scores)?.shape.clone();
        let mut product = self.p.ty(s.q)?.shape.clone();
        let r = product.len();
        if r < 2 || tk.rank() != r {
            return None;
        }
        product[r - 1] = tk.shape[r - 2];
        let keep = index::Affine::causal_keep(&product)?;
        if keep.shape != shape {
            return None;
        }
        let is =
            |e: Option<index::Affine>, want: &index::Affine| e.and_then(|e| e.align(&shape)).as_ref() == Some(want);
        let (mut causal, mut bias, mut masked) = (None, None, false);
        for (i, &t) in s.terms.iter().enumerate() {
            let is_causal = match t {
                Term::Where { mask, fill, keep: k } => {
                    if fill > MASK_FILL {
                        return None;
                    }
                    let want = if k { keep.clone() } else { keep.complement() };
                    is(index::predicate(&*self.p, mask), &want)
                }
                Term::Add(b) => is(index::additive_mask(&*self.p, b), &keep),
            };
            if is_causal && causal.is_none() {
                causal = Some(i);
                continue;
            }
            if bias.is_some() {
                return None;
            }
            masked |= matches!(t, Term::Where { .. });
            bias = Some(i);
        }
        Some(match (causal, bias) {
            (Some(c), Some(b)) if masked => (false, vec![s.terms[c.min(b)], s.terms[c.max(b)]]),
            (c, b) => (c.is_some(), b.map(|b| vec![s.terms[b]]).unwrap_or_default()),
        })
    }

    /// Whether `b` is a float tensor (a bool one for a `mask`), not a literal, broadcasting to
    /// the scores of `q` and keys of type `tk`.
    fn bias_fits(&self, b: Id, q: Id, tk: &TensorType, mask: bool) -> bool {
        let (Some(tb), Some(tq)) = (self.p.ty(b), self.p.ty(q)) else { return false };
        let r = tq.rank();
        let mut scores = tq.shape.clone();
        scores[r - 1] = tk.shape[r - 2];
        !self.p.fact(b).weak
            && if mask { tb.dtype == DType::Bool } else { tb.dtype.is_float() }
            && crate::ir::infer::broadcast_shapes(&tb.shape, &scores).ok().as_ref() == Some(&scores)
    }

    /// Whether `q`, `k`, `v` are operands `attention` accepts (one rank and dtype, equal batch
    /// axes, matching sizes), tensors rather than literals; `k` read as of type `tk` (its type,
    /// or the keys' when it holds them transposed).
    fn valid(&self, q: Id, k: Id, tk: &TensorType, v: Id) -> bool {
        let facts = [q, k, v].map(|x| self.p.fact(x));
        if facts.iter().any(|f| f.weak || f.ty.is_none()) {
            return false;
        }
        let (scale, causal, keys) = (Fact::constant(1.0), Fact::constant(0.0), Fact::tensor(tk.clone()));
        let args = [facts[0], &keys, facts[2], &scale, &causal];
        infer(OpCode::of(Kind::Composite(Composite::Attention)), &args).is_ok()
    }

    fn float(&self, x: Id) -> bool {
        self.p.ty(x).is_some_and(|t: &TensorType| t.dtype.is_float())
    }
}

#[cfg(test)]
mod tests {
    use super::super::grad_with;
    use crate::ir::program::Program;
    use crate::ir::types::{DType, TensorType};
    use crate::reference::{eval_with, rng::random_inputs, Precision};

    const SQ: usize = 6;
    const SK: usize = 8;
    const D: usize = 16;
    const ROW: &str = "(reshape (iota 6) [6,1])";
    const COL: &str = "(iota 8)";
    const PAD: &str = "(< (iota 8) 6)";

    /// The program `o = P @ v` (P spelled `probs`, `s` in it standing for `q @ transpose(k, 2, 3)`,
    /// `st` for `q @ kt` with the keys stored transposed), `loss = sum(o * dy) [+ sum(P * r)]`,
    /// differentiated with respect to q, the keys (k, or kt) and v with the recognition on or
    /// off; its outputs are the loss and the three gradients.
    fn program(probs: &str, other_use: bool, recognise: bool) -> Program {
        let t = |d: DType, s: &[usize]| TensorType::new(d, s.to_vec());
        let inputs = [
            ("q", t(DType::Bf16, &[2, 3, SQ, D])),
            ("k", t(DType::Bf16, &[2, 3, SK, D])),
            ("kt", t(DType::Bf16, &[2, 3, D, SK])),
            ("v", t(DType::Bf16, &[2, 3, SK, D])),
            ("dy", t(DType::Bf16, &[2, 3, SQ, D])),
            ("r", t(DType::F32, &[2, 3, SQ, SK])),
            ("b", t(DType::Bf16, &[2, 1, 1, SK])),
            ("b32", t(DType::F32, &[SQ, SK])),
            ("m", t(DType::Bool, &[2, 1, 1, SK])),
        ];
        let keys = if probs.contains("{st}") { "kt" } else { "k" };
        let probs = probs.replace("{s}", "(@ q (transpose k 2 3))").replace("{st}", "(@ q kt)");
        let sum4 = |x: String| format!("(sum (sum (sum (sum {x} -1) -2) -3) -4)");
        let mut loss = sum4(format!("(* (cast (@ {probs} v) f32) (cast dy f32))"));
        if other_use {
            loss = format!("(+ {loss} {})", sum4(format!("(* (cast {probs} f32) r)")));
        }
        let mut p = Program::from_sexprs("t", &inputs, &[("loss", &loss)]).unwrap();
        let l = p.outputs[0].id;
        let ws: Vec<_> = ["q", keys, "v"].iter().map(|w| p.input(w).unwrap().id).collect();
        let gs = grad_with(&mut p, l, &ws, recognise).unwrap();
        for (w, g) in ["q", keys, "v"].iter().zip(gs) {
            p.add_output(&format!("d_{w}"), g).unwrap();
        }
        p
    }

    fn ops(p: &Program) -> Vec<&'static str> {
        p.expr().as_ref().iter().filter_map(|n| n.opcode()).map(|c| c.name()).collect()
    }

    /// Each spelling's backward is the composite's (`lse`, or the bias forms' `bias_lse`), and its
    /// gradients equal the primitive VJPs' on the unrounded reference (where the intermediate
    /// roundings the composite skips are not made): the recognition is an identity. (`dropout`
    /// rounds its products to its dtype even there, as the kernel does: the written dropout of
    /// bf16 probabilities agrees to bf16's precision, of f32 ones to f32's.)
    #[test]
    fn written_attention_differentiates_as_its_composite() {
        let causal_keep = format!("(>= {ROW} {COL})");
        let causal_masked = format!("(> {COL} {ROW})");
        let cases: Vec<(String, &str, bool)> = vec![
            ("(softmax (/ {s} 8) -1)".into(), "attention_lse", false),
            ("(softmax (@ (* q 0.25) (transpose k -2 -1)) 3)".into(), "attention_lse", false),
            ("(softmax (* 0.25 (@ (/ q 2) (transpose (* k 0.5) -1 -2))) -1)".into(), "attention_lse", false),
            (
                "(/ (exp (- (* {s} 0.25) (amax (* {s} 0.25) -1))) (sum (exp (- (* {s} 0.25) (amax (* {s} 0.25) -1))) -1))"
                    .into(),
                "attention_lse",
                false,
            ),
            (format!("(softmax (where {causal_keep} (* {{s}} 0.25) -1e30) -1)"), "attention_lse", false),
            (format!("(softmax (* (where {causal_masked} -1e9 {{s}}) 0.25) -1)"), "attention_lse", false),
            (format!("(softmax (+ (* {{s}} 0.25) (cast (where {causal_masked} -1e30 0) bf16)) -1)"), "attention_lse", false),
            ("(softmax (+ (* {s} 0.25) b) -1)".into(), "attention_bias_lse", false),
            ("(softmax (+ b (* {s} 0.25)) -1)".into(), "attention_bias_lse", true),
            ("(cast (softmax (+ (cast (* {s} 0.25) f32) b32) -1) bf16)".into(), "attention_bias_lse", false),
            ("(softmax (where m (* {s} 0.25) -1e9) -1)".into(), "attention_bias_lse", false),
            ("(softmax (where m -1e9 (* {s} 0.25)) -1)".into(), "attention_bias_lse", true),
            (format!("(softmax (where {causal_keep} (+ (* {{s}} 0.25) b) -1e30) -1)"), "attention_bias_lse", false),
            ("(dropout (softmax (* {s} 0.25) -1) 0.2 7)".into(), "attention_dropout_grad_q", false),
            ("(cast (dropout (softmax (+ (cast (* {s} 0.25) f32) b32) -1) 0.2 7) bf16)".into(), "attention_bias_dropout_grad_q", false),
            // Keys stored transposed.
            ("(softmax (* {st} 0.25) -1)".into(), "attention_lse", false),
            ("(softmax (+ b (/ (@ (* q 0.5) kt) 4)) -1)".into(), "attention_bias_lse", true),
            (format!("(softmax (where {causal_keep} (* {{st}} 0.25) -1e30) -1)"), "attention_lse", false),
            // A bool mask (keys 6 and 7 hidden: no row is hidden entirely) beside the causal one,
            // inside or outside it, by `where` or by the causal additive mask.
            (format!("(softmax (where {causal_keep} (where {PAD} (* {{s}} 0.25) -1e9) -1e30) -1)"), "attention_bias_lse", false),
            (format!("(softmax (where {PAD} (where {causal_masked} -1e30 (* {{s}} 0.25)) -1e9) -1)"), "attention_bias_lse", true),
            (
                format!("(softmax (+ (where {PAD} (* {{st}} 0.25) -1e9) (cast (where {causal_masked} -1e30 0) bf16)) -1)"),
                "attention_bias_lse",
                false,
            ),
        ];
        for (probs, marker, other_use) in &cases {
            let (got, want) = (program(probs, *other_use, true), program(probs, *other_use, false));
            assert!(ops(&got).contains(marker), "{probs}: no `{marker}` in {:?}", ops(&got));
            assert!(!ops(&want).iter().any(|o| o.starts_with("attention")), "{probs}: {:?}", ops(&want));
            let tol = match (probs.starts_with("(dropout"), probs.contains("dropout")) {
                (true, _) => 2e-2,
                (false, true) => 1e-5,
                _ => 1e-9,
            };
            let inputs = random_inputs(&got, 5);
            let (a, b) =
                (eval_with(&got, &inputs, Precision::F64).unwrap(), eval_with(&want, &inputs, Precision::F64).unwrap());
            for (i, (x, y)) in a.iter().zip(&b).enumerate() {
                assert!(x.allclose(y, tol, tol), "{probs}: output {i}: {:?} against {:?}", x.data, y.data);
            }
        }
    }

    /// A loss that depends on the gradients (second order): the recognised backward's composites
    /// are differentiated through their expansion, and the result equals the primitive VJPs'
    /// differentiated twice (unrounded reference).
    #[test]
    fn second_order_gradients_through_the_composites() {
        for probs in [
            "(softmax (* {s} 0.25) -1)",
            "(softmax (+ (* {s} 0.25) b) -1)",
            "(softmax (where (>= (reshape (iota 6) [6,1]) (iota 8)) (* {s} 0.25) -1e30) -1)",
        ] {
            let second = |recognise: bool| {
                let mut p = program(probs, false, recognise);
                let dq = p.outputs[1].id;
                let r = p.add_input("r2", TensorType::new(DType::Bf16, vec![2, 3, SQ, D])).unwrap();
                let mut l = p.apply(crate::ir::lang::Kind::Binary(crate::ir::lang::Binary::Mul), vec![dq, r]).unwrap();
                for axis in [-1.0, -2.0, -3.0, -4.0] {
                    let a = p.num(axis);
                    l = p.apply(crate::ir::lang::Kind::Reduce(crate::ir::lang::Reduce::Sum), vec![l, a]).unwrap();
                }
                let ws: Vec<_> = ["q", "k", "v"].iter().map(|w| p.input(w).unwrap().id).collect();
                let gs = grad_with(&mut p, l, &ws, recognise).unwrap();
                for (w, g) in ["q", "k", "v"].iter().zip(gs) {
                    p.add_output(&format!("dd_{w}"), g).unwrap();
                }
                p
            };
            let (got, want) = (second(true), second(false));
            assert!(ops(&got).contains(&"attention_grad_q") || ops(&got).contains(&"attention_bias_grad_q"), "{probs}");
            let inputs = random_inputs(&got, 6);
            let (a, b) =
                (eval_with(&got, &inputs, Precision::F64).unwrap(), eval_with(&want, &inputs, Precision::F64).unwrap());
            for (i, (x, y)) in a.iter().zip(&b).enumerate() {
                assert!(x.allclose(y, 1e-9, 1e-9), "{probs}: output {i}: {:?} against {:?}", x.data, y.data);
            }
        }
    }

    /// Forms that are not attention's, or whose bias needs a gradient, or that the flash kernels
    /// do not run, keep the primitive VJPs.
    #[test]
    fn other_forms_keep_the_primitive_backward() {
        for probs in [
            // The softmax along another axis; a tensor scale; a bias scaled with the scores.
            "(softmax (* {s} 0.25) 2)",
            "(softmax (* {s} (cast r bf16)) -1)",
            "(softmax (* (+ {s} b) 0.25) -1)",
            // A fill too small to mask, alone or beside the causal mask.
            "(softmax (where m {s} -100) -1)",
            "(softmax (where m (where (>= (reshape (iota 6) [6,1]) (iota 8)) {s} -1e30) -100) -1)",
            // Two biases beside the causal mask.
            "(softmax (+ (where (>= (reshape (iota 6) [6,1]) (iota 8)) (where m {s} -1e9) -1e30) b) -1)",
            // A bias that depends on q (it needs a gradient).
            "(softmax (+ {s} (* {s} 0.5)) -1)",
        ] {
            let p = program(probs, false, true);
            assert!(!ops(&p).iter().any(|o| o.starts_with("attention")), "{probs}: {:?}", ops(&p));
        }
    }

    /// f32 attention of a head the kernels do not run (not a multiple of 4) has no flash
    /// backward: its written form keeps the primitive VJPs.
    #[test]
    fn f32_attention_of_an_odd_head_keeps_the_primitive_backward() {
        let t = TensorType::new(DType::F32, vec![2, SQ, 6]);
        let inputs = [("q", t.clone()), ("k", t.clone()), ("v", t)];
        let loss = "(sum (sum (sum (@ (softmax (* (@ q (transpose k 1 2)) 0.25) -1) v) -1) -2) -3)";
        let mut p = Program::from_sexprs("t", &inputs, &[("loss", loss)]).unwrap();
        let ws: Vec<_> = ["q", "k", "v"].iter().map(|w| p.input(w).unwrap().id).collect();
        let l = p.outputs[0].id;
        grad_with(&mut p, l, &ws, true).unwrap();
        assert!(!ops(&p).iter().any(|o| o.starts_with("attention")), "{:?}", ops(&p));
    }
}
