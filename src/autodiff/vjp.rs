//! The vector-Jacobian product of every operator: how a node's adjoint flows to its operands.
//!
//! Each rule returns contributions `(operand, value)` that [`Tape::fit`] then sums over
//! broadcast axes and casts to the operand's type, so a rule may return a value of any shape that
//! broadcasts to the node's. Rules use forward values where the derivative has a form in them
//! (`exp`: y; `tanh`: 1 - y²), and composites use closed forms; the decomposed softmax and
//! log-softmax are recognised and get the closed form too (see [`Tape::softmax_idiom`]), and so is
//! written-out attention, which gets the flash-style backward (`attention.rs`).
//! Invariant: a rule only adds nodes, and only for operands that carry gradient.

use egg::{Id, Language};

use super::{Tape, R};
use crate::ir::lang::{AttnArg, Binary, Composite, Kind, Reduce, TensorLang, Unary};
use crate::ir::types::{DType, TensorType};

/// The nodes of a max-shifted exp-sum: `m = amax(x, a)`, `s = x - m`, `e = exp(s)`,
/// `z = sum(e, a)`.
pub(super) struct Shifted {
    pub(super) x: Id,
    pub(super) axis: Id,
    m: Id,
    s: Id,
    e: Id,
    z: Id,
}

impl Tape<'_> {
    /// The contributions of node `n`'s adjoint `g` to its active operands.
    pub(super) fn vjp(&mut self, n: Id, g: Id) -> R<Vec<(Id, Id)>> {
        if let Some(found) = self.written_attention(n, g)? {
            return Ok(found);
        }
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
            Kind::Gather => {
                if self.on(ch[0]) {
                    let gf = self.full_like(g, n)?;
                    let x = self.ty(ch[0])?;
                    let axis = crate::ir::infer::norm_axis(self.konst(ch[2])? as i64, x.rank())?;
                    let size = self.p.num(x.shape[axis] as f64);
                    out.push((ch[0], self.op(Kind::ScatterAdd, vec![ch[1], gf, ch[2], size])?));
                }
            }
            Kind::ScatterAdd => {
                if self.on(ch[1]) {
                    let gf = self.full_like(g, n)?;
                    out.push((ch[1], self.op(Kind::Gather, vec![gf, ch[0], ch[2]])?));
                }
            }
            Kind::Slice => {
                if self.on(ch[0]) {
                    let gf = self.full_like(g, n)?;
                    out.push((ch[0], self.slice_grad(ch[0], &ch, gf)?));
                }
            }
            Kind::Concat => {
                let gf = self.full_like(g, n)?;
                let a = self.ty(ch[0])?;
                let axis = crate::ir::infer::norm_axis(self.konst(ch[2])? as i64, a.rank())?;
                let (na, nb) = (a.shape[axis], self.ty(ch[1])?.shape[axis]);
                for (c, start) in [(ch[0], 0), (ch[1], na)] {
                    if self.on(c) {
                        let len = if c == ch[0] { na } else { nb };
                        let part = self.slice(gf, ch[2], start, start + len, 1)?;
                        out.push((c, part));
                    }
                }
            }
            Kind::Grad => {
                return Err("cannot differentiate through a `grad` node that is not expanded yet \
                            (expand inner grads first, e.g. with expand_grads)"
                    .to_string())
            }
        }
        Ok(out.into_iter().filter(|&(c, _)| self.on(c)).collect())
    }

    /// The gradient of `slice(x, axis, start, stop, step)` for the full adjoint `gf`: `gf`
    /// between zeros (`concat` with zero tensors) for a step of 1, which keeps it a view that
    /// fuses into its reader; `scatter_add` at `start + step * iota` for a larger step.
    fn slice_grad(&mut self, x: Id, ch: &[Id], gf: Id) -> R<Id> {
        let xt = self.ty(x)?;
        let axis = crate::ir::infer::norm_axis(self.konst(ch[1])? as i64, xt.rank())?;
        let (start, stop, step) = (self.konst(ch[2])? as i64, self.konst(ch[3])? as i64, self.konst(ch[4])? as i64);
        let n = xt.shape[axis];
        let (first, len) = crate::ir::infer::slice_range(n, start, stop, step)?;
        if step > 1 {
            let count = self.p.num(len as f64);
            let iota = self.op(Kind::Iota, vec![count])?;
            let scaled = self.binc(Binary::Mul, iota, step as f64)?;
            let idx = if first > 0 { self.binc(Binary::Add, scaled, first as f64)? } else { scaled };
            let size = self.p.num(n as f64);
            return self.op(Kind::ScatterAdd, vec![idx, gf, ch[1], size]);
        }
        let zeros = |t: &mut Self, len: usize| -> R<Id> {
            let mut shape = xt.shape.clone();
            shape[axis] = len;
            let zero = t.p.num(0.0);
            t.full(zero, &TensorType::new(xt.dtype, shape))
        };
        let mut v = gf;
        if first > 0 {
            let z = zeros(self, first)?;
            v = self.op(Kind::Concat, vec![z, v, ch[1]])?;
        }
        if first + len < n {
            let z = zeros(self, n - first - len)?;
            v = self.op(Kind::Concat, vec![v, z, ch[1]])?;
        }
        Ok(v)
    }

    /// `slice(x, axis, start, stop, step)` with the axis node given.
    fn slice(&mut self, x: Id, axis: Id, start: usize, stop: usize, step: usize) -> R<Id> {
        let (a, b, c) = (self.p.num(start as f64), self.p.num(stop as f64), self.p.num(step as f64));
        self.op(Kind::Slice, vec![x, axis, a, b, c])
    }

    /// The value of a literal attribute.
    fn konst(&self, id: Id) -> R<f64> {
        self.p.fact(id).konst.ok_or_else(|| format!("`{}` must be a constant", self.p.node(id).head()))
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
            // Piecewise constant: zero gradient (PyTorch's too).
            Unary::Floor | Unary::Ceil | Unary::Round | Unary::Trunc => return self.binc(Mul, g, 0.0),
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
            Composite::Attention => self.attention(ch, None, y, g, out)?,
            Composite::AttentionBias => self.attention_bias(ch, None, y, g, out)?,
            Composite::AttentionDropout => self.attention(ch, Some((ch[5], ch[6])), y, g, out)?,
            Composite::AttentionBiasDropout => self.attention_bias(ch, Some((ch[6], ch[7])), y, g, out)?,
            Composite::AttentionLse
            | Composite::AttentionGrad(_)
            | Composite::AttentionBiasLse
            | Composite::AttentionBiasGrad(_)
            | Composite::AttentionDropoutGrad(_)
            | Composite::AttentionBiasDropoutGrad(_) => out.extend(self.through_expansion(c, ch, g)?),
        }
        Ok(())
    }

    /// The contributions of a composite's adjoint `g` through its expansion into primitives
    /// (`expand.rs`), for the composites without a closed form of their own: attention's
    /// backward differentiated again (a loss that depends on attention's gradients). The
    /// expansion is a function of the composite's operands `ch`; its nodes (those reachable from
    /// its value without passing an operand, new or hash-consed with existing ones) are swept in
    /// reverse order with adjoints of their own, and what reaches an operand is returned.
    fn through_expansion(&mut self, c: Composite, ch: &[Id], g: Id) -> R<Vec<(Id, Id)>> {
        let e = super::expand::expand(self.p, c, ch)?;
        let mut inner = std::collections::BTreeSet::new();
        let mut stack = vec![e];
        while let Some(x) = stack.pop() {
            if !ch.contains(&x) && inner.insert(x) {
                stack.extend(self.p.node(x).children().iter().copied());
            }
        }
        self.extend_active();
        let mut adj: std::collections::HashMap<Id, Id> = [(e, g)].into();
        let mut out = Vec::new();
        for &x in inner.iter().rev() {
            let Some(gx) = adj.remove(&x) else { continue };
            if !self.on(x) {
                continue;
            }
            for (child, contribution) in self.vjp(x, gx)? {
                let v = self.fit(contribution, child)?;
                if ch.contains(&child) {
                    out.push((child, v));
                } else {
                    let sum = match adj.get(&child) {
                        Some(&a) => self.bin(Binary::Add, a, v)?,
                        None => v,
                    };
                    adj.insert(child, sum);
                }
            }
        }
        Ok(out)
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
    ///
    /// Where the flash-style backward kernels run (bf16, f16, f32; `codegen::attention_bwd`), the
    /// gradients are its composites instead, which recompute the probabilities from the scores'
    /// log-sum-exp: `lse = attention_lse(q, k)`, `delta = sum(g * o, -1)` (f32), and
    /// `attention_grad_{q,k,v}(q, k, v, g, lse, delta)`; no `[S, S]` value is left in the graph.
    ///
    /// `drop`: the dropout probability and seed of `attention_dropout` (`Z` its mask times its
    /// scale): dV = (P Z)ᵀ dO and dS = P (dO Vᵀ Z - delta) · scale, with `delta = sum(dO O)` as
    /// before (rowsum(P (dO Vᵀ Z)) is rowsum(dO O) for the dropped O); the flash form is
    /// `attention_dropout_grad_{q,k,v}`.
    fn attention(&mut self, ch: &[Id], drop: Option<(Id, Id)>, y: Id, g: Id, out: &mut Vec<(Id, Id)>) -> R<()> {
        let (q, k, v, scale, causal) = (ch[0], ch[1], ch[2], ch[3], ch[4]);
        if self.flash_backward
            && crate::codegen::caps::attention_backward_runs(&self.ty(q)?, &self.ty(k)?, &self.ty(v)?)
        {
            return self.attention_flash(ch, None, drop, y, g, out);
        }
        let scores = crate::autodiff::expand::attention_scores(self.p, q, k, scale, causal)?;
        let last = self.p.num(-1.0);
        let p = self.op(Kind::Composite(Composite::Softmax), vec![scores, last])?;
        let gf = self.full_like(g, y)?;
        if self.on(v) {
            let pd = self.dropped(p, drop)?;
            let pt = self.swap_last(pd)?;
            out.push((v, self.op(Kind::MatMul, vec![pt, gf])?));
        }
        if !(self.on(q) || self.on(k)) {
            return Ok(());
        }
        let vt = self.swap_last(v)?;
        let dp = self.op(Kind::MatMul, vec![gf, vt])?;
        let dp = self.dropped(dp, drop)?;
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

    /// The backward of `attention_bias`: where the flash-style backward kernels run and the bias
    /// needs no gradient, their bias composites (`attention_bias_lse`, `attention_bias_grad_*`;
    /// see [`Tape::attention_flash`]); otherwise through its decomposition: with
    /// `S = q kᵀ scale + bias` (masked), `P = softmax(S)`: dV = Pᵀ dO, dS = P (dO Vᵀ - sum(P dO
    /// Vᵀ)), d bias = dS (summed over the bias's broadcast axes by [`Tape::fit`]), dQ = dS K
    /// scale, dK = dSᵀ Q scale.
    fn attention_bias(&mut self, ch: &[Id], drop: Option<(Id, Id)>, y: Id, g: Id, out: &mut Vec<(Id, Id)>) -> R<()> {
        let (q, k, v, bias, scale, causal) = (ch[0], ch[1], ch[2], ch[3], ch[4], ch[5]);
        if self.flash_backward
            && !self.on(bias)
            && crate::codegen::caps::attention_backward_runs(&self.ty(q)?, &self.ty(k)?, &self.ty(v)?)
        {
            return self.attention_flash(&[q, k, v, scale, causal], Some(bias), drop, y, g, out);
        }
        let scores = crate::autodiff::expand::attention_bias_scores(self.p, q, k, bias, scale, causal)?;
        let last = self.p.num(-1.0);
        let p = self.op(Kind::Composite(Composite::Softmax), vec![scores, last])?;
        let gf = self.full_like(g, y)?;
        if self.on(v) {
            let pd = self.dropped(p, drop)?;
            let pt = self.swap_last(pd)?;
            out.push((v, self.op(Kind::MatMul, vec![pt, gf])?));
        }
        if !(self.on(q) || self.on(k) || self.on(bias)) {
            return Ok(());
        }
        let vt = self.swap_last(v)?;
        let dp = self.op(Kind::MatMul, vec![gf, vt])?;
        let dp = self.dropped(dp, drop)?;
        let ds = self.softmax_backward(p, last, dp)?;
        if self.on(bias) {
            out.push((bias, ds));
        }
        if !(self.on(q) || self.on(k)) {
            return Ok(());
        }
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

    /// The flash-style attention backward (see [`Tape::attention`]); with a bias, its bias
    /// composites, whose row statistics are the maximum and log sum apart
    /// ([`Composite::AttentionBiasLse`]); with `drop` (probability, seed), their dropout forms
    /// (the statistics are those of the scores, which dropout does not change). `ch`: `q, k, v,
    /// scale, causal`.
    pub(super) fn attention_flash(
        &mut self,
        ch: &[Id],
        bias: Option<Id>,
        drop: Option<(Id, Id)>,
        y: Id,
        g: Id,
        out: &mut Vec<(Id, Id)>,
    ) -> R<()> {
        let (q, k, v, scale, causal) = (ch[0], ch[1], ch[2], ch[3], ch[4]);
        let gf = self.full_like(g, y)?;
        let lse = match bias {
            Some(b) => self.op(Kind::Composite(Composite::AttentionBiasLse), vec![q, k, b, scale, causal])?,
            None => self.op(Kind::Composite(Composite::AttentionLse), vec![q, k, scale, causal])?,
        };
        let (g32, y32) = (self.cast(gf, DType::F32)?, self.cast(y, DType::F32)?);
        let gy = self.bin(Binary::Mul, g32, y32)?;
        let last = self.p.num(-1.0);
        let delta = self.op(Kind::Reduce(Reduce::Sum), vec![gy, last])?;
        for (x, which) in [(q, AttnArg::Q), (k, AttnArg::K), (v, AttnArg::V)] {
            if self.on(x) {
                let mut args = vec![q, k, v, gf, lse, delta];
                args.extend(bias);
                args.extend([scale, causal]);
                let c = match (bias, drop) {
                    (Some(_), None) => Composite::AttentionBiasGrad(which),
                    (None, None) => Composite::AttentionGrad(which),
                    (Some(_), Some(_)) => Composite::AttentionBiasDropoutGrad(which),
                    (None, Some(_)) => Composite::AttentionDropoutGrad(which),
                };
                if let Some((pr, seed)) = drop {
                    args.extend([pr, seed]);
                }
                let d = self.op(Kind::Composite(c), args)?;
                out.push((x, d));
            }
        }
        Ok(())
    }

    /// `x` through the dropout `drop` (probability, seed) of an attention's dropout form; `x` itself without.
    fn dropped(&mut self, x: Id, drop: Option<(Id, Id)>) -> R<Id> {
        match drop {
            Some((pr, seed)) => self.op(Kind::Dropout, vec![x, pr, seed]),
            None => Ok(x),
        }
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
    pub(super) fn softmax_parts(&self, n: Id) -> Option<(bool, Shifted)> {
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

    pub(super) fn binary_parts(&self, n: Id) -> Option<(Binary, Id, Id)> {
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
        let norm = |id: Id| self.p.fact(id).konst.and_then(|v| crate::ir::infer::norm_axis(v as i64, rank).ok());
        norm(a).is_some() && norm(a) == norm(b)
    }

    fn axis_size(&self, x: Id, axis: Id) -> R<usize> {
        let ty = self.ty(x)?;
        let a = self.p.fact(axis).konst.ok_or("a reduction axis must be a constant")?;
        let a = crate::ir::infer::norm_axis(a as i64, ty.rank())?;
        Ok(ty.shape[a])
    }
}
