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
//! - Written-out attention (`softmax(q @ kᵀ * s [+ bias] [masked]) @ v`) of 16-bit operands is
//!   differentiated as the composite it equals (`attention.rs`): the flash-style backward, which
//!   writes no `[S, S]` value; the primitive VJPs otherwise.
//! - `dropout`'s gradient is `dropout` of the upstream gradient with the same `p` and seed (the
//!   same literal, or the same i32 seed expression): the same mask and scale, element for
//!   element. A tensor seed gets no gradient, like every integer value.
//! - Integer and bool values carry no gradient (`iota`, `onehot`, comparisons, casts to `i32`).
//!
//! Invariants: the forward nodes are never changed, only added to; the adjoint of a node depends
//! only on the loss and the node, so several `grad` calls over one loss build one backward graph
//! (the program hash-conses the repeated nodes); any failure is an error naming the operator.

mod attention;
pub mod expand;

use std::collections::{HashMap, HashSet};

use egg::{Id, Language};

mod vjp;

use crate::error::{Error, Result};
use crate::ir::lang::{Binary, Dims, Kind, OpCode, Reduce, TensorLang, Unary};
use crate::ir::program::{fold, Program};
use crate::ir::types::{DType, TensorType};

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
    grad_with(p, loss, wrt, true)
}

/// [`grad`] with attention differentiated as its decomposition everywhere (softmax's and the
/// products' VJPs, the probabilities recomputed), never as the flash-style composites: what the
/// tests check the composites' gradients against.
pub fn grad_decomposed(p: &mut Program, loss: Id, wrt: &[Id]) -> Result<Vec<Id>> {
    sweep(p, loss, wrt, false, false).map_err(Error::Invalid)
}

/// [`grad_of`], with written-out attention recognised (`attention.rs`) or left to the primitive
/// VJPs (the tests compare the two).
fn grad_with(p: &mut Program, loss: Id, wrt: &[Id], recognise_attention: bool) -> R<Vec<Id>> {
    sweep(p, loss, wrt, recognise_attention, true)
}

/// The gradients of `loss` with respect to `wrt`, with the tape's two attention switches.
fn sweep(p: &mut Program, loss: Id, wrt: &[Id], recognise_attention: bool, flash_backward: bool) -> R<Vec<Id>> {
    check_loss(p, loss)?;
    for &w in wrt {
        check_variable(p, w)?;
    }
    let mut tape = Tape::new(p, loss, wrt);
    tape.recognise_attention = recognise_attention;
    tape.flash_backward = flash_backward;
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
    let mut done: HashMap<(Id, Id), Id> = HashMap::new();
    p.rewrite_nodes(|out, map, node| match node {
        TensorLang::Op(code, ch) if code.kind() == Kind::Grad => {
            if !done.contains_key(&(ch[0], ch[1])) {
                let ws = &wanted[&ch[0]];
                let mapped: Vec<Id> = ws.iter().map(|&w| map[usize::from(w)]).collect();
                let grads = grad_of(out, map[usize::from(ch[0])], &mapped)?;
                done.extend(ws.iter().zip(grads).map(|(&w, g)| ((ch[0], w), g)));
            }
            Ok(Some(done[&(ch[0], ch[1])]))
        }
        _ => Ok(None),
    })
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

/// The state of one reverse sweep: which forward nodes carry gradient, and their adjoints so far.
struct Tape<'a> {
    p: &'a mut Program,
    loss: Id,
    /// For forward nodes `0..=loss`: a floating-point value that depends on a variable.
    active: Vec<bool>,
    /// The adjoint accumulated so far, for forward nodes `0..=loss`.
    adj: Vec<Option<Id>>,
    /// The names nodes of the program carry (adjoints are named only with free names).
    names: HashSet<String>,
    /// Whether written-out attention gets its composite's backward (`attention.rs`); off only
    /// in the tests that compare it with the primitive VJPs.
    recognise_attention: bool,
    /// Whether attention's backward is the flash-style composites where their kernels run
    /// (`vjp.rs`); off only in [`grad_decomposed`].
    flash_backward: bool,
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
        let names = (0..p.len()).filter_map(|i| p.name(Id::from(i)).map(str::to_string)).collect();
        Tape { p, loss, active, adj: vec![None; n], names, recognise_attention: true, flash_backward: true }
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
        if self.p.name(g).is_none() && !self.p.fact(g).weak && self.names.insert(dname.clone()) {
            self.p.name_node(g, &dname);
        }
    }

    /// Extends `active` over the nodes added since (a float node is active if an operand is),
    /// for sweeps over values the backward builds (`Tape::through_expansion`).
    fn extend_active(&mut self) {
        for i in self.active.len()..self.p.len() {
            let id = Id::from(i);
            let float = self.p.ty(id).is_some_and(|t| t.dtype.is_float()) && !self.p.fact(id).weak;
            let on = float && self.p.node(id).children().iter().any(|&c| self.active[usize::from(c)]);
            self.active.push(on);
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

    // ---- node builders: fold literals, drop multiplications by 1, and name the op on error.

    fn op(&mut self, kind: Kind, children: Vec<Id>) -> R<Id> {
        let code = OpCode::of(kind);
        if matches!(kind, Kind::Unary(_) | Kind::Binary(_)) {
            let facts: Vec<&crate::ir::infer::Fact> = children.iter().map(|&c| self.p.fact(c)).collect();
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
        // cast(cast(y, f32), dt) of a 16-bit float y of type dt is y: the widening is exact, so
        // the narrowing gives y back (e.g. the gradient of cast(o, f32) as o's bf16 type).
        if let TensorLang::Op(op, ch) = self.p.node(x) {
            if op.kind() == Kind::Cast {
                let y = ch[0];
                let widened = self.ty(x)?.dtype == DType::F32;
                if widened && matches!(dt, DType::Bf16 | DType::F16) && self.ty(y)?.dtype == dt {
                    return Ok(y);
                }
            }
        }
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
