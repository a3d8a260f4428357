//! Expansion of composite operators into primitive ones.
//!
//! The unfused baseline is the program as eager execution runs it: every primitive operator its
//! own kernel, so composites written directly are first expanded here. The expansions are the
//! same decompositions the `patterns` rules recognise.
//! Invariant: the expanded program computes the same values as the original (checked against
//! the reference in the tests).

use egg::Id;

use crate::ir::lang::{Binary, Composite, Kind, Reduce, TensorLang, Unary};
use crate::ir::program::Program;

/// A copy of `p` with every composite replaced by primitives.
pub fn expand_composites(p: &Program) -> Result<Program, String> {
    p.rewrite_nodes(|out, map, node| match node {
        TensorLang::Op(code, ch) => match code.kind() {
            Kind::Composite(c) => {
                let ch: Vec<Id> = ch.iter().map(|&x| map[usize::from(x)]).collect();
                expand(out, c, &ch).map(Some)
            }
            _ => Ok(None),
        },
        _ => Ok(None),
    })
}

/// A copy of `p` with each softmax and log-softmax along a leading axis replaced by its parts
/// (max, exp, sum, divide): no template runs such a composite in one kernel, so the planner starts
/// from the parts, as it would from a program that wrote them (the pattern rules recognise
/// softmax along the last axis only). `None` when there is none.
///
/// Attention (with a bias or not) is expanded where its template does not run (head sizes,
/// dtypes). With `strict`, attention and cross-entropy are expanded too: their kernels round
/// differently from the unfused plan's parts (attention's online softmax; cross-entropy's gathered
/// target logit), and strict numerics must reproduce the unfused plan bit for bit.
pub fn expand_for_planning(p: &Program, strict: bool) -> Result<Option<Program>, String> {
    let leading = |out: &Program, c: Composite, ch: &[Id]| {
        let leading_softmax = matches!(c, Composite::Softmax | Composite::LogSoftmax)
            && out
                .ty(ch[0])
                .zip(out.fact(ch[1]).konst)
                .is_some_and(|(t, a)| crate::ir::infer::norm_axis(a as i64, t.rank()).is_ok_and(|a| a + 1 != t.rank()));
        let runs = || {
            let ty = |i: usize| out.ty(ch[i]);
            matches!((ty(0), ty(1), ty(2)), (Some(q), Some(k), Some(v)) if crate::codegen::caps::attention_runs(q, k, v))
        };
        // The backward's composites run where their kernels do (bf16 and f16 on tensor cores).
        let bwd_runs = || {
            let ty = |i: usize| out.ty(ch[i]);
            let (q, k) = (ty(0), ty(1));
            let v = if matches!(c, Composite::AttentionLse | Composite::AttentionBiasLse) { ty(1) } else { ty(2) };
            matches!((q, k, v), (Some(q), Some(k), Some(v)) if crate::codegen::caps::attention_backward_runs(q, k, v))
        };
        let backward = c.is_attention_backward();
        leading_softmax
            || c.is_attention_forward() && (strict || !runs())
            || c == Composite::CrossEntropy && strict
            || backward && (strict || !bwd_runs())
    };
    let mut any = false;
    let q = p.rewrite_nodes(|out, map, node| match node {
        TensorLang::Op(code, ch) => match code.kind() {
            Kind::Composite(c) => {
                let ch: Vec<Id> = ch.iter().map(|&x| map[usize::from(x)]).collect();
                if !leading(out, c, &ch) {
                    return Ok(None);
                }
                any = true;
                expand(out, c, &ch).map(Some)
            }
            _ => Ok(None),
        },
        _ => Ok(None),
    })?;
    Ok(any.then_some(q))
}

/// Small builder helpers over a program.
struct B<'a>(&'a mut Program);

impl B<'_> {
    fn u(&mut self, u: Unary, x: Id) -> Result<Id, String> {
        self.0.apply(Kind::Unary(u), vec![x])
    }
    fn b(&mut self, b: Binary, x: Id, y: Id) -> Result<Id, String> {
        self.0.apply(Kind::Binary(b), vec![x, y])
    }
    fn r(&mut self, r: Reduce, x: Id, axis: Id) -> Result<Id, String> {
        self.0.apply(Kind::Reduce(r), vec![x, axis])
    }
    fn num(&mut self, v: f64) -> Id {
        self.0.num(v)
    }
    fn log_softmax(&mut self, x: Id, axis: Id) -> Result<Id, String> {
        let m = self.r(Reduce::Amax, x, axis)?;
        let s = self.b(Binary::Sub, x, m)?;
        let e = self.u(Unary::Exp, s)?;
        let z = self.r(Reduce::Sum, e, axis)?;
        let l = self.u(Unary::Log, z)?;
        self.b(Binary::Sub, s, l)
    }
    fn cast(&mut self, x: Id, dtype: crate::ir::types::DType) -> Result<Id, String> {
        if self.0.ty(x).is_some_and(|t| t.dtype == dtype) {
            return Ok(x);
        }
        let t = self.0.add(TensorLang::Type(dtype))?;
        self.0.apply(Kind::Cast, vec![x, t])
    }
    fn f32(&mut self, x: Id) -> Result<Id, String> {
        self.cast(x, crate::ir::types::DType::F32)
    }
    fn softmax(&mut self, x: Id, axis: Id) -> Result<Id, String> {
        let m = self.r(Reduce::Amax, x, axis)?;
        let s = self.b(Binary::Sub, x, m)?;
        let e = self.u(Unary::Exp, s)?;
        let z = self.r(Reduce::Sum, e, axis)?;
        self.b(Binary::Div, e, z)
    }
}

pub(super) fn expand(p: &mut Program, c: Composite, ch: &[Id]) -> Result<Id, String> {
    let mut b = B(p);
    match c {
        Composite::Softmax => b.softmax(ch[0], ch[1]),
        Composite::LogSoftmax => b.log_softmax(ch[0], ch[1]),
        Composite::LayerNorm => {
            let last = b.num(-1.0);
            let mu = b.r(Reduce::Mean, ch[0], last)?;
            let xc = b.b(Binary::Sub, ch[0], mu)?;
            let sq = b.b(Binary::Mul, xc, xc)?;
            let var = b.r(Reduce::Mean, sq, last)?;
            let ve = b.b(Binary::Add, var, ch[3])?;
            let rs = b.u(Unary::Rsqrt, ve)?;
            let n = b.b(Binary::Mul, xc, rs)?;
            let g = b.b(Binary::Mul, n, ch[1])?;
            b.b(Binary::Add, g, ch[2])
        }
        Composite::RmsNorm => {
            let last = b.num(-1.0);
            let sq = b.b(Binary::Mul, ch[0], ch[0])?;
            let ms = b.r(Reduce::Mean, sq, last)?;
            let me = b.b(Binary::Add, ms, ch[2])?;
            let rs = b.u(Unary::Rsqrt, me)?;
            let n = b.b(Binary::Mul, ch[0], rs)?;
            b.b(Binary::Mul, n, ch[1])
        }
        Composite::CrossEntropy => {
            let shape = b.0.ty(ch[0]).ok_or("cross_entropy of an attribute")?.shape.clone();
            let v = *shape.last().ok_or("cross_entropy of a scalar")?;
            let rows: usize = shape[..shape.len() - 1].iter().product();
            let last = b.num(-1.0);
            let ls = b.log_softmax(ch[0], last)?;
            let vn = b.num(v as f64);
            let mut oh = b.0.apply(Kind::OneHot, vec![ch[1], vn])?;
            // `onehot` is f32; logits of another float dtype need it in theirs.
            let dtype = b.0.ty(ch[0]).map(|t| t.dtype).unwrap_or(crate::ir::types::DType::F32);
            if dtype != crate::ir::types::DType::F32 {
                let t = b.0.add(TensorLang::Type(dtype))?;
                oh = b.0.apply(Kind::Cast, vec![oh, t])?;
            }
            let picked = b.b(Binary::Mul, oh, ls)?;
            let row = b.r(Reduce::Sum, picked, last)?;
            let dims = b.0.add(TensorLang::Dims(crate::ir::lang::Dims(vec![rows])))?;
            let flat = b.0.apply(Kind::Reshape, vec![row, dims])?;
            let zero = b.num(0.0);
            let mean = b.r(Reduce::Mean, flat, zero)?;
            let neg = b.u(Unary::Neg, mean)?;
            let scalar = b.0.add(TensorLang::Dims(crate::ir::lang::Dims(vec![])))?;
            b.0.apply(Kind::Reshape, vec![neg, scalar])
        }
        Composite::Attention => {
            let scaled = attention_scores(b.0, ch[0], ch[1], ch[3], ch[4])?;
            let m1 = b.num(-1.0);
            let p = b.softmax(scaled, m1)?;
            b.0.apply(Kind::MatMul, vec![p, ch[2]])
        }
        Composite::AttentionBias => {
            let biased = attention_bias_scores(b.0, ch[0], ch[1], ch[3], ch[4], ch[5])?;
            let m1 = b.num(-1.0);
            let p = b.softmax(biased, m1)?;
            b.0.apply(Kind::MatMul, vec![p, ch[2]])
        }
        Composite::AttentionDropout => {
            let scaled = attention_scores(b.0, ch[0], ch[1], ch[3], ch[4])?;
            let m1 = b.num(-1.0);
            let p = b.softmax(scaled, m1)?;
            let p = b.0.apply(Kind::Dropout, vec![p, ch[5], ch[6]])?;
            b.0.apply(Kind::MatMul, vec![p, ch[2]])
        }
        Composite::AttentionBiasDropout => {
            let biased = attention_bias_scores(b.0, ch[0], ch[1], ch[3], ch[4], ch[5])?;
            let m1 = b.num(-1.0);
            let p = b.softmax(biased, m1)?;
            let p = b.0.apply(Kind::Dropout, vec![p, ch[6], ch[7]])?;
            b.0.apply(Kind::MatMul, vec![p, ch[2]])
        }
        Composite::AttentionLse => {
            // In f32: log(sum(exp(s - m))) + m over the scaled, masked scores.
            let (q, k) = (b.f32(ch[0])?, b.f32(ch[1])?);
            let s = attention_scores(b.0, q, k, ch[2], ch[3])?;
            let last = b.num(-1.0);
            let m = b.r(Reduce::Amax, s, last)?;
            let sh = b.b(Binary::Sub, s, m)?;
            let e = b.u(Unary::Exp, sh)?;
            let z = b.r(Reduce::Sum, e, last)?;
            let l = b.u(Unary::Log, z)?;
            b.b(Binary::Add, l, m)
        }
        Composite::AttentionBiasLse => {
            // In f32: the row maximum m and log(sum(exp(s - max(m, lowest)))) of the biased
            // scores (a row of -inf: -inf and log 0 = -inf), side by side.
            let (q, k) = (b.f32(ch[0])?, b.f32(ch[1])?);
            let s = attention_bias_scores(b.0, q, k, ch[2], ch[3], ch[4])?;
            let last = b.num(-1.0);
            let m = b.r(Reduce::Amax, s, last)?;
            let lowest = b.num(f32::MIN as f64);
            let mm = b.b(Binary::Max, m, lowest)?;
            let sh = b.b(Binary::Sub, s, mm)?;
            let e = b.u(Unary::Exp, sh)?;
            let z = b.r(Reduce::Sum, e, last)?;
            let l = b.u(Unary::Log, z)?;
            b.0.apply(Kind::Concat, vec![m, l, last])
        }
        Composite::AttentionGrad(which) | Composite::AttentionDropoutGrad(which) => {
            // In f32: P = exp(s - lse).
            let (q, k) = (b.f32(ch[0])?, b.f32(ch[1])?);
            let s = attention_scores(b.0, q, k, ch[6], ch[7])?;
            let sh = b.b(Binary::Sub, s, ch[4])?;
            let p = b.u(Unary::Exp, sh)?;
            let drop = matches!(c, Composite::AttentionDropoutGrad(_)).then(|| (ch[8], ch[9]));
            attention_grad_parts(b, which, ch, p, ch[6], drop)
        }
        Composite::AttentionBiasGrad(which) | Composite::AttentionBiasDropoutGrad(which) => {
            // In f32: P = exp((s - max(m, lowest)) - max(log l, 0)) (0 on a row of -inf: log l
            // is -inf there, and l >= 1 elsewhere), 0 at the keys after each query under the
            // causal flag (P masked, not the scores: statistics of a row of fills, m the fill,
            // would give a -1e30 score the weight exp(-1e30 - fill) = inf).
            let (q, k) = (b.f32(ch[0])?, b.f32(ch[1])?);
            let unmasked = b.num(0.0);
            let s = attention_bias_scores(b.0, q, k, ch[6], ch[7], unmasked)?;
            let (last, zero, one, two) = (b.num(-1.0), b.num(0.0), b.num(1.0), b.num(2.0));
            let m = b.0.apply(Kind::Slice, vec![ch[4], last, zero, one, one])?;
            let l = b.0.apply(Kind::Slice, vec![ch[4], last, one, two, one])?;
            let lowest = b.num(f32::MIN as f64);
            let mm = b.b(Binary::Max, m, lowest)?;
            let ll = b.b(Binary::Max, l, zero)?;
            let sh = b.b(Binary::Sub, s, mm)?;
            let sh = b.b(Binary::Sub, sh, ll)?;
            let p = b.u(Unary::Exp, sh)?;
            let p = causal_fill(b.0, p, ch[8], 0.0)?;
            let drop = matches!(c, Composite::AttentionBiasDropoutGrad(_)).then(|| (ch[9], ch[10]));
            attention_grad_parts(b, which, ch, p, ch[7], drop)
        }
    }
}

/// The rest of an attention gradient given the probabilities `p` (f32): `dS = P (g vᵀ - delta)
/// scale`; `dS k`, `dSᵀ q` or `Pᵀ g`, cast to the operands' dtype (`ch`: the composite's
/// arguments, `q, k, v, g, stats, delta` first). With `drop` (the dropout probability and seed
/// of a dropout form), `g vᵀ` and `P` in `Pᵀ g` go through that dropout (the same mask: both
/// are `[..., SQ, SK]`).
fn attention_grad_parts(
    mut b: B,
    which: crate::ir::lang::AttnArg,
    ch: &[Id],
    p: Id,
    scale: Id,
    drop: Option<(Id, Id)>,
) -> Result<Id, String> {
    let dropped = |b: &mut B, x: Id| match drop {
        Some((pr, seed)) => b.0.apply(Kind::Dropout, vec![x, pr, seed]),
        None => Ok(x),
    };
    let dtype = b.0.ty(ch[0]).map(|t| t.dtype).unwrap_or(crate::ir::types::DType::F32);
    let (q, k, v, g) = (b.f32(ch[0])?, b.f32(ch[1])?, b.f32(ch[2])?, b.f32(ch[3])?);
    let (m1, m2) = (b.num(-1.0), b.num(-2.0));
    let out = if which == crate::ir::lang::AttnArg::V {
        let pd = dropped(&mut b, p)?;
        let pt = b.0.apply(Kind::Transpose, vec![pd, m1, m2])?;
        b.0.apply(Kind::MatMul, vec![pt, g])?
    } else {
        let vt = b.0.apply(Kind::Transpose, vec![v, m1, m2])?;
        let dp = b.0.apply(Kind::MatMul, vec![g, vt])?;
        let dp = dropped(&mut b, dp)?;
        let c = b.b(Binary::Sub, dp, ch[5])?;
        let ds = b.b(Binary::Mul, p, c)?;
        let ds = b.b(Binary::Mul, ds, scale)?;
        if which == crate::ir::lang::AttnArg::Q {
            b.0.apply(Kind::MatMul, vec![ds, k])?
        } else {
            let dst = b.0.apply(Kind::Transpose, vec![ds, m1, m2])?;
            b.0.apply(Kind::MatMul, vec![dst, q])?
        }
    };
    b.cast(out, dtype)
}

/// The biased scores of `attention_bias(q, k, v, bias, scale, causal)`: `q @ kᵀ * scale + bias`
/// (the bias cast to the scores' dtype), with the keys after each query replaced by -1e30 when
/// `causal` is 1. The autodiff pass differentiates through them.
pub(crate) fn attention_bias_scores(
    p: &mut Program,
    q: Id,
    k: Id,
    bias: Id,
    scale: Id,
    causal: Id,
) -> Result<Id, String> {
    let zero = p.num(0.0);
    let scaled = attention_scores(p, q, k, scale, zero)?;
    let mut b = B(p);
    let dtype = b.0.ty(scaled).ok_or("attention_bias of an attribute")?.dtype;
    let bias = b.cast(bias, dtype)?;
    let biased = b.b(Binary::Add, scaled, bias)?;
    causal_mask(b.0, biased, causal)
}

/// The scaled scores of `attention(q, k, v, scale, causal)`: `q @ kᵀ * scale`, with the keys after
/// each query replaced by -1e30 when `causal` is 1 (so that their softmax weight is 0). The
/// autodiff pass recomputes them for the backward.
pub(crate) fn attention_scores(p: &mut Program, q: Id, k: Id, scale: Id, causal: Id) -> Result<Id, String> {
    let mut b = B(p);
    let (m1, m2) = (b.num(-1.0), b.num(-2.0));
    let kt = b.0.apply(Kind::Transpose, vec![k, m1, m2])?;
    let s = b.0.apply(Kind::MatMul, vec![q, kt])?;
    let scaled = b.b(Binary::Mul, s, scale)?;
    causal_mask(b.0, scaled, causal)
}

/// `scores` with the keys after each query replaced by -1e30 when `causal` is 1.
fn causal_mask(p: &mut Program, scaled: Id, causal: Id) -> Result<Id, String> {
    causal_fill(p, scaled, causal, -1e30)
}

/// `x` (`[..., SQ, SK]`) with the keys after each query replaced by `fill` when `causal` is 1.
fn causal_fill(p: &mut Program, x: Id, causal: Id, fill: f64) -> Result<Id, String> {
    let mut b = B(p);
    if b.0.fact(causal).konst.unwrap_or(0.0) == 0.0 {
        return Ok(x);
    }
    let shape = b.0.ty(x).ok_or("attention of an attribute")?.shape.clone();
    let (sq, sk) = (shape[shape.len() - 2], shape[shape.len() - 1]);
    let (nq, nk) = (b.num(sq as f64), b.num(sk as f64));
    let iq = b.0.apply(Kind::Iota, vec![nq])?;
    let ik = b.0.apply(Kind::Iota, vec![nk])?;
    let dq = b.0.add(TensorLang::Dims(crate::ir::lang::Dims(vec![sq, 1])))?;
    let col = b.0.apply(Kind::Reshape, vec![iq, dq])?;
    let keep = b.b(Binary::Ge, col, ik)?;
    let fill = b.num(fill);
    b.0.apply(Kind::Where, vec![keep, x, fill])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::types::{DType, TensorType};

    #[test]
    fn cross_entropy_of_bf16_logits_expands() {
        let inputs = [("x", TensorType::new(DType::Bf16, vec![4, 8])), ("t", TensorType::new(DType::I32, vec![4]))];
        let p = Program::from_sexprs("t", &inputs, &[("l", "(cross_entropy x t)")]).unwrap();
        let e = expand_composites(&p).unwrap();
        let values = crate::reference::rng::random_inputs(&p, 1);
        let (a, b) = (crate::reference::eval(&p, &values).unwrap(), crate::reference::eval(&e, &values).unwrap());
        assert!(a[0].allclose(&b[0], 2e-2, 2e-2), "{:?} against {:?}", a[0].data, b[0].data);
    }
}
