//! Reverse-mode differentiation of a [`Program`]: `grad(loss, w)` becomes ordinary operators.
//!
//! [`grad`] appends the backward graph of one loss to a program and returns the gradient of each
//! requested input; [`expand_grads`] replaces every `grad` node of a program that way. The front
//! ends differentiate as they lower each `grad(loss, w)` call, so the reference, the planner and
//! codegen only ever see ordinary operators (the joint forward and backward graph).
//!
//! Adjoints are *lazily broadcast*: the adjoint of a node is a value whose shape broadcasts to
//! the node's shape and whose dtype is the node's (or a weak literal). So the seed is the literal
//! `1` whatever the loss's shape, and the adjoint of `sum(x, a)` flows to `x` untouched. A
//! contribution to an operand is summed over the axes along which the operand was broadcast,
//! reshaped to drop leading axes, and cast to the operand's dtype ([`Tape::fit`]); a gradient
//! leaves as exactly its input's type.
//!
//! Choices, each checked against finite differences of the reference in `tests/autodiff.rs`:
//! - Backward forms reuse forward values where one exists (`exp`: `g*y`; `tanh`: `g*(1-y*y)`;
//!   `sigmoid`: `g*y*(1-y)`; `relu`: `where(y > 0, g, 0)`; softmax: `y*(g - sum(g*y))`), and
//!   `rules/autodiff.rules` adds the recomputing forms beside them, so the extractor chooses.
//! - Ties of `amax`, `amin`, `max` and `min` split the gradient evenly among the tied elements
//!   (as PyTorch does); `relu` and `abs` have derivative 0 at 0.
//! - The decomposed softmax and log-softmax (`x - amax(x, a)`, `exp`, `sum`, and `e / z` or
//!   `s - log(z)`) are differentiated as one function with the closed form, so the max shift,
//!   whose gradient is exactly zero, costs no reductions.
//! - `dropout`'s gradient is `dropout` of the upstream gradient with the same `p` and seed: the
//!   same mask and scale, element for element.
//! - Integer and bool values carry no gradient (`iota`, `onehot`, comparisons, casts to `i32`).
//!
//! Invariants: the forward nodes are never changed, only added to; the adjoint of a node depends
//! only on the loss and the node, so several `grad` calls over one loss build one backward graph
//! (the program hash-conses the repeated nodes); any failure is an error naming the operator.

use std::collections::HashMap;

use egg::{Id, Language};

use crate::error::{Error, Result};
use crate::lang::{Binary, Composite, Dims, Kind, OpCode, Reduce, TensorLang, Unary};
use crate::program::{fold, Program};
use crate::types::{DType, TensorType};

type R<T> = std::result::Result<T, String>;

/// Appends the gradients of `loss` with respect to the inputs `wrt` to `p` and returns them, in
/// order, each of its input's type. The loss must be a floating-point tensor of one element (any
/// shape), and each of `wrt` a floating-point input of `p`.
///
/// ```
/// use eqfuse::{DType, Program, TensorType};
/// let mut p = Program::from_sexprs("t", &[("x", TensorType::new(DType::F32, vec![3]))],
///     &[("loss", "(sum (* x x) 0)")]).unwrap();
/// let x = p.inputs[0].id;
/// let loss = p.outputs[0].id;
/// let g = eqfuse::grad(&mut p, loss, &[x]).unwrap();
/// p.add_output("dx", g[0]).unwrap();
/// assert_eq!(p.ty(g[0]).unwrap(), &TensorType::new(DType::F32, vec![3]));
/// ```
pub fn grad(p: &mut Program, loss: Id, wrt: &[Id]) -> Result<Vec<Id>> {
    grad_of(p, loss, wrt).map_err(Error::Invalid)
}

/// [`grad`] with the error as a message, for the front ends to place.
pub(crate) fn grad_of(p: &mut Program, loss: Id, wrt: &[Id]) -> R<Vec<Id>> {
    check_loss(p, loss)?;
    for &w in wrt {
        check_variable(p, w)?;
    }
    let mut tape = Tape::new(p, loss, wrt);
    tape.sweep()?;
    wrt.iter().map(|&w| tape.gradient(w)).collect()
}

/// A copy of `p` in which every `grad(loss, w)` node is replaced by the gradient it denotes. The
/// `grad` nodes over one loss are differentiated in one sweep.
pub fn expand_grads(p: &Program) -> Result<Program> {
    expand(p).map_err(Error::Invalid)
}

/// Whether `p` still holds `grad` nodes.
pub fn has_grads(p: &Program) -> bool {
    p.expr().as_ref().iter().any(|n| n.opcode().is_some_and(|c| c.kind() == Kind::Grad))
}

fn expand(p: &Program) -> R<Program> {
    let mut wanted: HashMap<Id, Vec<Id>> = HashMap::new();
    for node in p.expr().as_ref() {
        if let TensorLang::Op(code, ch) = node {
            if code.kind() == Kind::Grad && !wanted.get(&ch[0]).is_some_and(|ws| ws.contains(&ch[1])) {
                wanted.entry(ch[0]).or_default().push(ch[1]);
            }
        }
    }
    let mut out = Program::new(p.source.clone());
    out.dims = p.dims.clone();
    for i in &p.inputs {
        out.add_input(&i.name, i.ty.clone())?;
    }
    let mut map: Vec<Id> = Vec::with_capacity(p.len());
    let mut done: HashMap<(Id, Id), Id> = HashMap::new();
    for (i, node) in p.expr().as_ref().iter().enumerate() {
        let id = match node {
            TensorLang::Op(code, ch) if code.kind() == Kind::Grad => {
                if !done.contains_key(&(ch[0], ch[1])) {
                    let ws = &wanted[&ch[0]];
                    let mapped: Vec<Id> = ws.iter().map(|&w| map[usize::from(w)]).collect();
                    let grads = grad_of(&mut out, map[usize::from(ch[0])], &mapped)?;
                    done.extend(ws.iter().zip(grads).map(|(&w, g)| ((ch[0], w), g)));
                }
                done[&(ch[0], ch[1])]
            }
            _ => out.add(node.clone().map_children(|c| map[usize::from(c)]))?,
        };
        if let Some(name) = p.name(Id::from(i)) {
            out.name_node(id, name);
        }
        map.push(id);
    }
    for o in &p.outputs {
        out.add_output(&o.name, map[usize::from(o.id)])?;
    }
    Ok(out)
}

fn check_loss(p: &Program, loss: Id) -> R<()> {
    let ty = p.ty(loss).ok_or("the loss of grad must be a tensor, not an attribute")?;
    if ty.numel() != 1 {
        return Err(format!("grad needs a loss with one element, got {ty}"));
    }
    if !ty.dtype.is_float() {
        return Err(format!("grad needs a floating-point loss, got {ty}"));
    }
    Ok(())
}

fn check_variable(p: &Program, w: Id) -> R<()> {
    let TensorLang::Var(name) = p.node(w) else {
        return Err(format!("grad differentiates with respect to an input, not `{}`", p.node(w).head()));
    };
    let ty = p.ty(w).ok_or("grad of an attribute")?;
    if !ty.dtype.is_float() {
        return Err(format!("grad with respect to `{name}` ({ty}): only floating-point inputs have gradients"));
    }
    Ok(())
}

/// The nodes of a max-shifted exp-sum: `m = amax(x, a)`, `s = x - m`, `e = exp(s)`,
/// `z = sum(e, a)`.
struct Shifted {
    x: Id,
    axis: Id,
    m: Id,
    s: Id,
    e: Id,
    z: Id,
}

/// The state of one reverse sweep: which forward nodes carry gradient, and their adjoints so far.
struct Tape<'a> {
    p: &'a mut Program,
    loss: Id,
    /// For forward nodes `0..=loss`: a floating-point value that depends on a variable.
    active: Vec<bool>,
    /// The adjoint accumulated so far, for forward nodes `0..=loss`.
    adj: Vec<Option<Id>>,
}

impl<'a> Tape<'a> {
    fn new(p: &'a mut Program, loss: Id, wrt: &[Id]) -> Tape<'a> {
        let n = usize::from(loss) + 1;
        let mut active = vec![false; n];
        for (i, node) in p.expr().as_ref()[..n].iter().enumerate() {
            let float = p.ty(Id::from(i)).is_some_and(|t| t.dtype.is_float()) && !p.fact(Id::from(i)).weak;
            active[i] =
                wrt.contains(&Id::from(i)) || (float && node.children().iter().any(|&c| active[usize::from(c)]));
        }
        Tape { p, loss, active, adj: vec![None; n] }
    }

    /// Propagates adjoints from the loss down to the variables, each node once, parents first.
    fn sweep(&mut self) -> R<()> {
        let top = usize::from(self.loss);
        if !self.active[top] {
            return Ok(());
        }
        self.adj[top] = Some(self.p.num(1.0));
        for i in (0..=top).rev() {
            let (id, Some(g)) = (Id::from(i), self.adj[i]) else { continue };
            if !self.active[i] || matches!(self.p.node(id), TensorLang::Var(_)) {
                continue;
            }
            self.name_adjoint(id, g);
            for (child, contribution) in self.vjp(id, g)? {
                self.accumulate(child, contribution)?;
            }
        }
        Ok(())
    }

    /// Names the finished adjoint of a named node `d_NAME` (plans then say what a kernel
    /// writes), unless another node has that name or the adjoint is named already.
    fn name_adjoint(&mut self, n: Id, g: Id) {
        let Some(name) = self.p.name(n) else { return };
        let dname = format!("d_{name}");
        let taken = (0..self.p.len()).any(|i| self.p.name(Id::from(i)) == Some(dname.as_str()));
        if !taken && !self.p.fact(g).weak {
            self.p.name_node(g, &dname);
        }
    }

    fn on(&self, c: Id) -> bool {
        self.active.get(usize::from(c)).copied().unwrap_or(false)
    }

    fn accumulate(&mut self, child: Id, contribution: Id) -> R<()> {
        let v = self.fit(contribution, child)?;
        let slot = usize::from(child);
        self.adj[slot] = Some(match self.adj[slot] {
            None => v,
            Some(a) => self.bin(Binary::Add, a, v)?,
        });
        Ok(())
    }

    /// The gradient of variable `w`: its adjoint, broadcast and cast to exactly `w`'s type.
    fn gradient(&mut self, w: Id) -> R<Id> {
        // A variable declared after the loss cannot reach it, and has no slot.
        let g = match self.adj.get(usize::from(w)).copied().flatten() {
            Some(g) => g,
            None => self.p.num(0.0),
        };
        let ty = self.ty(w)?;
        self.full(g, &ty)
    }

    /// Makes a contribution fit operand `target`: sums it over the axes `target` was broadcast
    /// along, drops the leading axes `target` lacks, and casts it to `target`'s dtype.
    fn fit(&mut self, v: Id, target: Id) -> R<Id> {
        let want = self.ty(target)?;
        let mut v = v;
        let mut shape = self.ty(v)?.shape;
        let (rv, rt) = (shape.len(), want.rank());
        for i in (0..rv).rev() {
            let t = if i + rt >= rv { want.shape[i + rt - rv] } else { 1 };
            if t == 1 && shape[i] != 1 {
                let axis = self.p.num(i as f64 - rv as f64);
                v = self.op(Kind::Reduce(Reduce::Sum), vec![v, axis])?;
                shape[i] = 1;
            }
        }
        if rv > rt {
            v = self.reshape(v, shape[rv - rt..].to_vec())?;
        }
        if !self.p.fact(v).weak && self.ty(v)?.dtype != want.dtype {
            v = self.cast(v, want.dtype)?;
        }
        Ok(v)
    }

    /// `v` as a tensor of exactly type `ty` (its shape broadcasts to `ty`'s).
    fn full(&mut self, v: Id, ty: &TensorType) -> R<Id> {
        let mut v = v;
        if self.p.fact(v).weak || self.ty(v)?.shape != ty.shape {
            let dims = self.p.add(TensorLang::Dims(Dims(ty.shape.clone())))?;
            v = self.op(Kind::Broadcast, vec![v, dims])?;
        }
        if self.ty(v)?.dtype != ty.dtype {
            v = self.cast(v, ty.dtype)?;
        }
        Ok(v)
    }

    /// The adjoint `g` of node `n` made the full tensor of `n`'s type.
    fn full_like(&mut self, g: Id, n: Id) -> R<Id> {
        let ty = self.ty(n)?;
        self.full(g, &ty)
    }

    fn ty(&self, id: Id) -> R<TensorType> {
        self.p.ty(id).cloned().ok_or_else(|| format!("`{}` is an attribute, not a tensor", self.p.node(id).head()))
    }

    /// The contributions of node `n`'s adjoint `g` to its active operands.
    fn vjp(&mut self, n: Id, g: Id) -> R<Vec<(Id, Id)>> {
        if let Some(found) = self.softmax_idiom(n, g)? {
            return Ok(found);
        }
        let TensorLang::Op(code, ch) = self.p.node(n).clone() else { return Ok(vec![]) };
        let mut out = Vec::new();
        match code.kind() {
            Kind::Unary(u) => {
                if self.on(ch[0]) {
                    out.push((ch[0], self.unary(u, ch[0], n, g)?));
                }
            }
            Kind::Binary(b) => self.binary(b, ch[0], ch[1], n, g, &mut out)?,
            Kind::Reduce(r) => {
                if self.on(ch[0]) {
                    out.push((ch[0], self.reduce(r, ch[0], ch[1], n, g)?));
                }
            }
            Kind::Where => {
                let zero = self.p.num(0.0);
                if self.on(ch[1]) {
                    out.push((ch[1], self.op(Kind::Where, vec![ch[0], g, zero])?));
                }
                if self.on(ch[2]) {
                    out.push((ch[2], self.op(Kind::Where, vec![ch[0], zero, g])?));
                }
            }
            Kind::Cast | Kind::Broadcast => out.push((ch[0], g)),
            Kind::Transpose => {
                let gf = self.full_like(g, n)?;
                out.push((ch[0], self.op(Kind::Transpose, vec![gf, ch[1], ch[2]])?));
            }
            Kind::Reshape => {
                let gf = self.full_like(g, n)?;
                let shape = self.ty(ch[0])?.shape;
                out.push((ch[0], self.reshape(gf, shape)?));
            }
            Kind::MatMul => self.matmul(ch[0], ch[1], n, g, &mut out)?,
            Kind::Dropout => {
                let gf = self.full_like(g, n)?;
                out.push((ch[0], self.op(Kind::Dropout, vec![gf, ch[1], ch[2]])?));
            }
            Kind::Composite(c) => self.composite(c, &ch, n, g, &mut out)?,
            Kind::Iota | Kind::OneHot => {}
            Kind::Grad => {
                return Err("cannot differentiate through a `grad` node that is not expanded yet \
                            (expand inner grads first, e.g. with expand_grads)"
                    .to_string())
            }
        }
        Ok(out.into_iter().filter(|&(c, _)| self.on(c)).collect())
    }

    /// Derivative of a pointwise unary op at `x` (result `y`), times `g`.
    fn unary(&mut self, u: Unary, x: Id, y: Id, g: Id) -> R<Id> {
        use Binary::{Add, Mul, Sub};
        let d = match u {
            Unary::Neg => return self.un(Unary::Neg, g),
            Unary::Exp => y,
            Unary::Log => return self.bin(Binary::Div, g, x),
            Unary::Sqrt => {
                let half = self.binc(Mul, g, 0.5)?;
                return self.bin(Binary::Div, half, y);
            }
            Unary::Rsqrt => {
                let y3 = self.chain(Mul, &[y, y, y])?;
                self.binc(Mul, y3, -0.5)?
            }
            Unary::Recip => {
                let y2 = self.bin(Mul, y, y)?;
                self.un(Unary::Neg, y2)?
            }
            Unary::Abs => {
                let zero = self.p.num(0.0);
                let pos = self.indicator(Binary::Gt, x, zero, y)?;
                let neg = self.indicator(Binary::Lt, x, zero, y)?;
                self.bin(Sub, pos, neg)?
            }
            Unary::Tanh => {
                let y2 = self.bin(Mul, y, y)?;
                self.cbin(Sub, 1.0, y2)?
            }
            Unary::Sigmoid => {
                let one_minus = self.cbin(Sub, 1.0, y)?;
                self.bin(Mul, y, one_minus)?
            }
            Unary::Relu => {
                let zero = self.p.num(0.0);
                let keep = self.bin(Binary::Gt, y, zero)?;
                return self.op(Kind::Where, vec![keep, g, zero]);
            }
            Unary::Gelu => self.gelu_derivative(x)?,
            Unary::GeluTanh => self.gelu_tanh_derivative(x)?,
            Unary::Silu => {
                // silu' = s + x s (1 - s) = y + s (1 - y), with s = sigmoid(x) and y = x s.
                let s = self.un(Unary::Sigmoid, x)?;
                let one_minus = self.cbin(Sub, 1.0, y)?;
                let t = self.bin(Mul, s, one_minus)?;
                self.bin(Add, y, t)?
            }
            Unary::Erf => {
                let x2 = self.bin(Mul, x, x)?;
                let e = self.un(Unary::Neg, x2).and_then(|n| self.un(Unary::Exp, n))?;
                self.binc(Mul, e, std::f64::consts::FRAC_2_SQRT_PI)?
            }
            Unary::Sin => self.un(Unary::Cos, x)?,
            Unary::Cos => {
                let s = self.un(Unary::Sin, x)?;
                self.un(Unary::Neg, s)?
            }
            Unary::Square => self.binc(Mul, x, 2.0)?,
            Unary::Not => return Err("`not` has no gradient (its values are bool)".to_string()),
        };
        self.bin(Mul, g, d)
    }

    /// gelu'(x) = Φ(x) + x φ(x) = 0.5 (1 + erf(x / √2)) + x exp(-x²/2) / √(2π).
    fn gelu_derivative(&mut self, x: Id) -> R<Id> {
        use Binary::{Add, Mul};
        let scaled = self.binc(Mul, x, std::f64::consts::FRAC_1_SQRT_2)?;
        let erf = self.un(Unary::Erf, scaled)?;
        let one_plus = self.cbin(Add, 1.0, erf)?;
        let cdf = self.cbin(Mul, 0.5, one_plus)?;
        let x2 = self.bin(Mul, x, x)?;
        let e = self.binc(Mul, x2, -0.5).and_then(|v| self.un(Unary::Exp, v))?;
        let pdf = self.binc(Mul, e, 0.5 * std::f64::consts::FRAC_2_SQRT_PI * std::f64::consts::FRAC_1_SQRT_2)?;
        let xpdf = self.bin(Mul, x, pdf)?;
        self.bin(Add, cdf, xpdf)
    }

    /// For y = 0.5 x (1 + t), t = tanh(c (x + k x³)):
    /// y' = 0.5 (1 + t) + 0.5 x (1 - t²) c (1 + 3 k x²).
    fn gelu_tanh_derivative(&mut self, x: Id) -> R<Id> {
        use Binary::{Add, Mul, Sub};
        let (c, k) = ((2.0 / std::f64::consts::PI).sqrt(), 0.044715);
        let x2 = self.bin(Mul, x, x)?;
        let x3 = self.bin(Mul, x2, x)?;
        let inner = self.binc(Mul, x3, k).and_then(|v| self.bin(Add, x, v))?;
        let t = self.binc(Mul, inner, c).and_then(|v| self.un(Unary::Tanh, v))?;
        let left = self.cbin(Add, 1.0, t).and_then(|v| self.binc(Mul, v, 0.5))?;
        let t2 = self.bin(Mul, t, t)?;
        let sech2 = self.cbin(Sub, 1.0, t2)?;
        let slope = self.binc(Mul, x2, 3.0 * k).and_then(|v| self.cbin(Add, 1.0, v))?;
        let right = self.chain(Mul, &[x, sech2, slope])?;
        let right = self.binc(Mul, right, 0.5 * c)?;
        self.bin(Add, left, right)
    }

    fn binary(&mut self, b: Binary, a: Id, c: Id, y: Id, g: Id, out: &mut Vec<(Id, Id)>) -> R<()> {
        use Binary::{Div, Mul, Sub};
        match b {
            Binary::Add => out.extend([(a, g), (c, g)]),
            Binary::Sub => out.extend([(a, g), (c, self.un(Unary::Neg, g)?)]),
            Binary::Mul if a == c => {
                let ga = self.bin(Mul, g, a)?;
                out.push((a, self.binc(Mul, ga, 2.0)?));
            }
            Binary::Mul => {
                if self.on(a) {
                    out.push((a, self.bin(Mul, g, c)?));
                }
                if self.on(c) {
                    out.push((c, self.bin(Mul, g, a)?));
                }
            }
            Binary::Div => {
                if self.on(a) {
                    out.push((a, self.bin(Div, g, c)?));
                }
                if self.on(c) {
                    // d(a/c)/dc = -a/c² = -y/c.
                    let gy = self.bin(Mul, g, y)?;
                    let q = self.bin(Div, gy, c)?;
                    out.push((c, self.un(Unary::Neg, q)?));
                }
            }
            Binary::Pow => {
                if self.on(a) {
                    let e = self.binc(Sub, c, 1.0)?;
                    let p = self.bin(Binary::Pow, a, e)?;
                    let d = self.bin(Mul, c, p)?;
                    out.push((a, self.bin(Mul, g, d)?));
                }
                if self.on(c) {
                    let l = self.un(Unary::Log, a)?;
                    let d = self.bin(Mul, y, l)?;
                    out.push((c, self.bin(Mul, g, d)?));
                }
            }
            Binary::Max | Binary::Min => {
                // The weight of `a`: 1 where it wins, 1/2 where it ties, 0 where it loses.
                let (strict, loose) =
                    if b == Binary::Max { (Binary::Gt, Binary::Ge) } else { (Binary::Lt, Binary::Le) };
                let s = self.indicator(strict, a, c, y)?;
                let l = self.indicator(loose, a, c, y)?;
                let wa = self.bin(Binary::Add, s, l).and_then(|v| self.binc(Mul, v, 0.5))?;
                if self.on(a) {
                    out.push((a, self.bin(Mul, g, wa)?));
                }
                if self.on(c) {
                    let wc = self.cbin(Sub, 1.0, wa)?;
                    out.push((c, self.bin(Mul, g, wc)?));
                }
            }
            Binary::Lt | Binary::Le | Binary::Gt | Binary::Ge | Binary::Eq | Binary::Ne => {}
        }
        Ok(())
    }

    fn reduce(&mut self, r: Reduce, x: Id, axis: Id, y: Id, g: Id) -> R<Id> {
        match r {
            Reduce::Sum => Ok(g),
            Reduce::Mean => {
                let n = self.axis_size(x, axis)?;
                self.binc(Binary::Div, g, n as f64)
            }
            Reduce::Amax | Reduce::Amin => {
                // Split evenly among the elements equal to the extremum.
                let mask = self.indicator(Binary::Eq, x, y, y)?;
                let count = self.op(Kind::Reduce(Reduce::Sum), vec![mask, axis])?;
                let share = self.bin(Binary::Div, g, count)?;
                self.bin(Binary::Mul, mask, share)
            }
        }
    }

    /// `a @ b`: `g @ bᵀ` to `a` and `aᵀ @ g` to `b` (batch axes are summed by [`Tape::fit`]).
    /// A matrix `b` shared by every batch of `a` gets one product over the rows of all batches,
    /// `reshape(a, [rows, k])ᵀ @ reshape(g, [rows, n])`, instead of a product per batch summed
    /// afterwards (the weight gradient of `x @ w` for `x: [B, S, E]`).
    fn matmul(&mut self, a: Id, b: Id, y: Id, g: Id, out: &mut Vec<(Id, Id)>) -> R<()> {
        let gf = self.full_like(g, y)?;
        if self.on(a) {
            let bt = self.swap_last(b)?;
            out.push((a, self.op(Kind::MatMul, vec![gf, bt])?));
        }
        if self.on(b) {
            let (ta, tb, ty) = (self.ty(a)?, self.ty(b)?, self.ty(y)?);
            let gb = if tb.rank() == 2 && ta.rank() > 2 && ta.shape[..ta.rank() - 2] == ty.shape[..ty.rank() - 2] {
                let (k, n) = (tb.shape[0], tb.shape[1]);
                let rows = ta.numel() / k;
                let a2 = self.reshape(a, vec![rows, k])?;
                let g2 = self.reshape(gf, vec![rows, n])?;
                let at = self.swap_last(a2)?;
                self.op(Kind::MatMul, vec![at, g2])?
            } else {
                let at = self.swap_last(a)?;
                self.op(Kind::MatMul, vec![at, gf])?
            };
            out.push((b, gb));
        }
        Ok(())
    }

    fn composite(&mut self, c: Composite, ch: &[Id], y: Id, g: Id, out: &mut Vec<(Id, Id)>) -> R<()> {
        match c {
            Composite::Softmax => out.push((ch[0], self.softmax_backward(y, ch[1], g)?)),
            Composite::LogSoftmax => {
                let p = self.un(Unary::Exp, y)?;
                out.push((ch[0], self.log_softmax_backward(p, ch[1], g, y)?));
            }
            Composite::LayerNorm => self.layernorm(ch, y, g, out)?,
            Composite::RmsNorm => self.rmsnorm(ch, y, g, out)?,
            Composite::CrossEntropy => out.push((ch[0], self.cross_entropy(ch[0], ch[1], g)?)),
            Composite::Attention => self.attention(ch, y, g, out)?,
        }
        Ok(())
    }

    /// Softmax `p` along `axis`: `p * (g - sum(g * p, axis))`.
    fn softmax_backward(&mut self, p: Id, axis: Id, g: Id) -> R<Id> {
        let gp = self.bin(Binary::Mul, g, p)?;
        let s = self.op(Kind::Reduce(Reduce::Sum), vec![gp, axis])?;
        let d = self.bin(Binary::Sub, g, s)?;
        self.bin(Binary::Mul, p, d)
    }

    /// Log-softmax `y` with softmax `p`: `g - p * sum(g, axis)`.
    fn log_softmax_backward(&mut self, p: Id, axis: Id, g: Id, y: Id) -> R<Id> {
        let gf = self.full_like(g, y)?;
        let s = self.op(Kind::Reduce(Reduce::Sum), vec![gf, axis])?;
        let ps = self.bin(Binary::Mul, p, s)?;
        self.bin(Binary::Sub, gf, ps)
    }

    /// The row statistics of a layernorm (`mean`) or rmsnorm (`None`) of `x`, spelled as
    /// `expand.rs` spells them so that they hash-cons with an expanded forward:
    /// returns (`x - mu` or `x`, `rsqrt(var + eps)`).
    fn norm_stats(&mut self, x: Id, eps: Id, centred: bool) -> R<(Id, Id)> {
        let last = self.p.num(-1.0);
        let xc = if centred {
            let mu = self.op(Kind::Reduce(Reduce::Mean), vec![x, last])?;
            self.bin(Binary::Sub, x, mu)?
        } else {
            x
        };
        let sq = self.bin(Binary::Mul, xc, xc)?;
        let var = self.op(Kind::Reduce(Reduce::Mean), vec![sq, last])?;
        let ve = self.bin(Binary::Add, var, eps)?;
        Ok((xc, self.un(Unary::Rsqrt, ve)?))
    }

    /// dx = r (ĝ - mean(ĝ) - x̂ mean(ĝ x̂)) with ĝ = g γ; dγ = g x̂; dβ = g.
    fn layernorm(&mut self, ch: &[Id], y: Id, g: Id, out: &mut Vec<(Id, Id)>) -> R<()> {
        let (x, gamma, beta, eps) = (ch[0], ch[1], ch[2], ch[3]);
        let (xc, r) = self.norm_stats(x, eps, true)?;
        let xhat = self.bin(Binary::Mul, xc, r)?;
        if self.on(x) {
            let gf = self.full_like(g, y)?;
            let gh = self.bin(Binary::Mul, gf, gamma)?;
            let last = self.p.num(-1.0);
            let m1 = self.op(Kind::Reduce(Reduce::Mean), vec![gh, last])?;
            let ghx = self.bin(Binary::Mul, gh, xhat)?;
            let m2 = self.op(Kind::Reduce(Reduce::Mean), vec![ghx, last])?;
            let t = self.bin(Binary::Mul, xhat, m2)?;
            let d = self.bin(Binary::Sub, gh, m1).and_then(|v| self.bin(Binary::Sub, v, t))?;
            out.push((x, self.bin(Binary::Mul, r, d)?));
        }
        if self.on(gamma) {
            out.push((gamma, self.bin(Binary::Mul, g, xhat)?));
        }
        out.push((beta, g));
        Ok(())
    }

    /// dx = r (ĝ - x̂ mean(ĝ x̂)) with ĝ = g γ, x̂ = x r; dγ = g x̂.
    fn rmsnorm(&mut self, ch: &[Id], y: Id, g: Id, out: &mut Vec<(Id, Id)>) -> R<()> {
        let (x, gamma, eps) = (ch[0], ch[1], ch[2]);
        let (_, r) = self.norm_stats(x, eps, false)?;
        let xhat = self.bin(Binary::Mul, x, r)?;
        if self.on(x) {
            let gf = self.full_like(g, y)?;
            let gh = self.bin(Binary::Mul, gf, gamma)?;
            let last = self.p.num(-1.0);
            let ghx = self.bin(Binary::Mul, gh, xhat)?;
            let m = self.op(Kind::Reduce(Reduce::Mean), vec![ghx, last])?;
            let t = self.bin(Binary::Mul, xhat, m)?;
            let d = self.bin(Binary::Sub, gh, t)?;
            out.push((x, self.bin(Binary::Mul, r, d)?));
        }
        if self.on(gamma) {
            out.push((gamma, self.bin(Binary::Mul, g, xhat)?));
        }
        Ok(())
    }

    /// d cross_entropy / d logits = (softmax(logits) - onehot(targets)) / rows, times `g`.
    fn cross_entropy(&mut self, x: Id, t: Id, g: Id) -> R<Id> {
        let ty = self.ty(x)?;
        let v = *ty.shape.last().ok_or("cross_entropy of a scalar")?;
        let rows: usize = ty.shape[..ty.rank() - 1].iter().product();
        let last = self.p.num(-1.0);
        let p = self.op(Kind::Composite(Composite::Softmax), vec![x, last])?;
        let n = self.p.num(v as f64);
        let mut onehot = self.op(Kind::OneHot, vec![t, n])?;
        if ty.dtype != DType::F32 {
            onehot = self.cast(onehot, ty.dtype)?;
        }
        let d = self.bin(Binary::Sub, p, onehot)?;
        let scale = self.binc(Binary::Div, g, rows as f64)?;
        self.bin(Binary::Mul, d, scale)
    }

    /// Attention backward with the probabilities recomputed (the forward keeps none):
    /// P = softmax(S), dV = Pᵀ dO, dS = P (dO Vᵀ - sum(P dO Vᵀ)) · scale, dQ = dS K, dK = dSᵀ Q.
    fn attention(&mut self, ch: &[Id], y: Id, g: Id, out: &mut Vec<(Id, Id)>) -> R<()> {
        let (q, k, v, scale, causal) = (ch[0], ch[1], ch[2], ch[3], ch[4]);
        let scores = crate::expand::attention_scores(self.p, q, k, scale, causal)?;
        let last = self.p.num(-1.0);
        let p = self.op(Kind::Composite(Composite::Softmax), vec![scores, last])?;
        let gf = self.full_like(g, y)?;
        if self.on(v) {
            let pt = self.swap_last(p)?;
            out.push((v, self.op(Kind::MatMul, vec![pt, gf])?));
        }
        if !(self.on(q) || self.on(k)) {
            return Ok(());
        }
        let vt = self.swap_last(v)?;
        let dp = self.op(Kind::MatMul, vec![gf, vt])?;
        let ds = self.softmax_backward(p, last, dp)?;
        let ds = self.bin(Binary::Mul, ds, scale)?;
        if self.on(q) {
            out.push((q, self.op(Kind::MatMul, vec![ds, k])?));
        }
        if self.on(k) {
            let dst = self.swap_last(ds)?;
            out.push((k, self.op(Kind::MatMul, vec![dst, q])?));
        }
        Ok(())
    }

    /// The decomposed softmax `e / z` and log-softmax `s - log(z)` (or `x - (m + log(z))`),
    /// with `m = amax(x, a)`, `s = x - m`, `e = exp(s)`, `z = sum(e, a)`, differentiated as one
    /// function of `x`: the gradient through the shift `m` is exactly zero, so it is left out.
    /// The log-softmax's gradient reuses the forward `e / z` as its softmax.
    fn softmax_idiom(&mut self, n: Id, g: Id) -> R<Option<Vec<(Id, Id)>>> {
        let Some((log, parts)) = self.softmax_parts(n) else { return Ok(None) };
        if !self.on(parts.x) {
            return Ok(Some(vec![]));
        }
        let dx = if log {
            let p = self.bin(Binary::Div, parts.e, parts.z)?;
            self.log_softmax_backward(p, parts.axis, g, n)?
        } else {
            self.softmax_backward(n, parts.axis, g)?
        };
        Ok(Some(vec![(parts.x, dx)]))
    }

    /// Whether `n` is a decomposed softmax (false) or log-softmax (true), and its parts.
    fn softmax_parts(&self, n: Id) -> Option<(bool, Shifted)> {
        let (b, l, r) = self.binary_parts(n)?;
        match b {
            Binary::Div => self.exp_sum(r).filter(|p| p.e == l).map(|p| (false, p)),
            Binary::Sub => match self.log_of(r) {
                Some(z) => self.exp_sum(z).filter(|p| p.s == l).map(|p| (true, p)),
                None => {
                    let (Binary::Add, m, lz) = self.binary_parts(r)? else { return None };
                    let p = self.exp_sum(self.log_of(lz)?)?;
                    (p.x == l && p.m == m).then_some((true, p))
                }
            },
            _ => None,
        }
    }

    fn log_of(&self, id: Id) -> Option<Id> {
        match self.p.node(id) {
            TensorLang::Op(c, ch) if c.kind() == Kind::Unary(Unary::Log) => Some(ch[0]),
            _ => None,
        }
    }

    /// `z = sum(exp(x - amax(x, a)), a)` and its parts.
    fn exp_sum(&self, z: Id) -> Option<Shifted> {
        let TensorLang::Op(c, ch) = self.p.node(z) else { return None };
        let TensorLang::Op(ce, che) = self.p.node(ch[0]) else { return None };
        if c.kind() != Kind::Reduce(Reduce::Sum) || ce.kind() != Kind::Unary(Unary::Exp) {
            return None;
        }
        let s = che[0];
        let (Binary::Sub, x, m) = self.binary_parts(s)? else { return None };
        let TensorLang::Op(cm, chm) = self.p.node(m) else { return None };
        let shift = cm.kind() == Kind::Reduce(Reduce::Amax) && chm[0] == x && self.same_axis(x, chm[1], ch[1]);
        shift.then_some(Shifted { x, axis: ch[1], m, s, e: ch[0], z })
    }

    fn binary_parts(&self, n: Id) -> Option<(Binary, Id, Id)> {
        match self.p.node(n) {
            TensorLang::Op(c, ch) => match c.kind() {
                Kind::Binary(b) => Some((b, ch[0], ch[1])),
                _ => None,
            },
            _ => None,
        }
    }

    /// Whether two axis literals name the same axis of `x`.
    fn same_axis(&self, x: Id, a: Id, b: Id) -> bool {
        let rank = self.p.ty(x).map_or(0, |t| t.rank());
        let norm = |id: Id| self.p.fact(id).konst.and_then(|v| crate::infer::norm_axis(v as i64, rank).ok());
        norm(a).is_some() && norm(a) == norm(b)
    }

    fn axis_size(&self, x: Id, axis: Id) -> R<usize> {
        let ty = self.ty(x)?;
        let a = self.p.fact(axis).konst.ok_or("a reduction axis must be a constant")?;
        let a = crate::infer::norm_axis(a as i64, ty.rank())?;
        Ok(ty.shape[a])
    }

    // ---- node builders: fold literals, drop multiplications by 1, and name the op on error.

    fn op(&mut self, kind: Kind, children: Vec<Id>) -> R<Id> {
        let code = OpCode::of(kind);
        if matches!(kind, Kind::Unary(_) | Kind::Binary(_)) {
            let facts: Vec<&crate::infer::Fact> = children.iter().map(|&c| self.p.fact(c)).collect();
            if facts.iter().all(|f| f.weak) {
                if let Some(v) = fold(code, &facts) {
                    return Ok(self.p.num(v));
                }
            }
        }
        self.p
            .add(TensorLang::op(code, children))
            .map_err(|e| format!("building the gradient of `{}`: {e}", code.name()))
    }

    /// `x ⊙ v` for a literal `v`.
    fn binc(&mut self, b: Binary, x: Id, v: f64) -> R<Id> {
        let c = self.p.num(v);
        self.bin(b, x, c)
    }

    /// `v ⊙ x` for a literal `v`.
    fn cbin(&mut self, b: Binary, v: f64, x: Id) -> R<Id> {
        let c = self.p.num(v);
        self.bin(b, c, x)
    }

    fn un(&mut self, u: Unary, x: Id) -> R<Id> {
        self.op(Kind::Unary(u), vec![x])
    }

    fn bin(&mut self, b: Binary, x: Id, y: Id) -> R<Id> {
        let one = |id: Id| self.p.fact(id).weak && self.p.fact(id).konst == Some(1.0);
        match b {
            Binary::Mul if one(x) => return Ok(y),
            Binary::Mul | Binary::Div if one(y) => return Ok(x),
            _ => {}
        }
        self.op(Kind::Binary(b), vec![x, y])
    }

    /// Left-to-right product (or sum) of several values.
    fn chain(&mut self, b: Binary, xs: &[Id]) -> R<Id> {
        let mut acc = xs[0];
        for &x in &xs[1..] {
            acc = self.bin(b, acc, x)?;
        }
        Ok(acc)
    }

    /// `cast(a ⋚ b, dtype of like)`: 1 where the comparison holds, else 0.
    fn indicator(&mut self, cmp: Binary, a: Id, b: Id, like: Id) -> R<Id> {
        let c = self.bin(cmp, a, b)?;
        let dt = self.ty(like)?.dtype;
        self.cast(c, dt)
    }

    fn cast(&mut self, x: Id, dt: DType) -> R<Id> {
        let t = self.p.add(TensorLang::Type(dt))?;
        self.op(Kind::Cast, vec![x, t])
    }

    fn reshape(&mut self, x: Id, shape: Vec<usize>) -> R<Id> {
        let d = self.p.add(TensorLang::Dims(Dims(shape)))?;
        self.op(Kind::Reshape, vec![x, d])
    }

    /// `transpose(x, -1, -2)`.
    fn swap_last(&mut self, x: Id) -> R<Id> {
        let (a, b) = (self.p.num(-1.0), self.p.num(-2.0));
        self.op(Kind::Transpose, vec![x, a, b])
    }
}
