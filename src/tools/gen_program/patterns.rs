//! The generator's composites, written directly (`softmax`, `layernorm`, `attention`, ...), and
//! the decomposed forms that the `patterns` rules recognise, written the way the rules spell
//! them (layernorm as mean, centre, variance and `rsqrt`; attention as two products around a
//! softmax; ...).
//!
//! Invariant: a decomposed pattern keeps its parts' form (they are bound unscaled), so that the
//! rules can match it; only its result is scaled into the generator's bounds.

use super::values::{binop, call, numel, reduced, E};
use super::{choose, Gen, Step, MAG};
use crate::ir::infer::broadcast_shapes;
use crate::ir::types::{DType, TensorType};

impl Gen {
    // ---- composites, written directly

    /// `softmax(a, axis)` or `log_softmax(a, axis)`.
    pub(super) fn softmax(&mut self, s: &Step) -> E {
        let a = self.float_of_rank(s.a, 1);
        let (axis, text) = Gen::axis(a.rank(), s.attr2);
        let args = [a.text.clone(), text];
        let e = if s.attr.is_multiple_of(2) {
            call("softmax", &args, a.ty.clone(), 0.0, 1.0, false)
        } else {
            let lo = a.lo - a.hi - (a.shape()[axis] as f64).ln();
            call("log_softmax", &args, a.ty.clone(), lo, 0.0, false)
        };
        self.emit(e)
    }

    /// A parameter of a norm over `x`: its dtype, a shape that broadcasts to `x`'s.
    pub(super) fn param(&mut self, x: &E, sel: u16) -> E {
        let ok = |e: &E| {
            e.is_float()
                && e.dtype() == x.dtype()
                && broadcast_shapes(x.shape(), e.shape()).ok().as_deref() == Some(x.shape())
        };
        if !sel.is_multiple_of(4) {
            if let Some(p) = self.pick(sel / 4, ok) {
                return p;
            }
        }
        let keep = if sel.is_multiple_of(3) { (sel as usize / 3) % (x.rank() + 1) } else { 1 };
        let mut shape = x.shape()[x.rank() - keep..].to_vec();
        for (i, d) in shape.iter_mut().enumerate() {
            if sel & (0x400 << i) != 0 {
                *d = 1;
            }
        }
        self.input(x.dtype(), shape)
    }

    /// A norm's epsilon.
    pub(super) fn eps(sel: u16) -> &'static str {
        choose(&["1e-5", "1e-6", "0.001", "0.1"], sel)
    }

    /// `layernorm(x, g, b, eps)` or `rmsnorm(x, g, eps)` over the last axis.
    pub(super) fn norm(&mut self, s: &Step) -> E {
        let x = self.float_of_rank(s.a, 1);
        let g = self.param(&x, s.b);
        let c = (x.shape()[x.rank() - 1] as f64).sqrt();
        let e = if s.attr.is_multiple_of(2) {
            let b = self.param(&x, s.c);
            let m = c * g.mag() + b.mag();
            call(
                "layernorm",
                &[x.text.clone(), g.text.clone(), b.text.clone(), Gen::eps(s.attr2).into()],
                x.ty.clone(),
                -m,
                m,
                false,
            )
        } else {
            let m = c * g.mag();
            call("rmsnorm", &[x.text.clone(), g.text.clone(), Gen::eps(s.attr2).into()], x.ty.clone(), -m, m, false)
        };
        self.emit(e)
    }

    /// Targets for logits `x`: a new i32 input of `x`'s shape without its last axis (seeded
    /// inputs of cross-entropy targets are drawn in range).
    pub(super) fn targets(&mut self, x: &E) -> E {
        self.input(DType::I32, x.shape()[..x.rank() - 1].to_vec())
    }

    pub(super) fn cross_entropy(&mut self, s: &Step) -> E {
        let x = self.float_of_rank(s.a, 1);
        let t = self.targets(&x);
        let v = x.shape()[x.rank() - 1] as f64;
        let hi = x.hi - x.lo + v.ln();
        let e = call("cross_entropy", &[x.text.clone(), t.text.clone()], TensorType::scalar(x.dtype()), 0.0, hi, false);
        self.emit(e)
    }

    /// Queries, keys and values for attention: `q` of rank at least 2, `k` and `v` with its
    /// batch axes (existing values when they fit, else new inputs), scaled so that scores stay
    /// within [-8, 8].
    pub(super) fn qkv(&mut self, s: &Step) -> (E, E, E, f64) {
        let q = self.float_of_rank(s.a, 2);
        let r = q.rank();
        let (batch, d) = (q.shape()[..r - 2].to_vec(), q.shape()[r - 1]);
        let t = choose(self.scale.sizes, s.attr2).min(self.scale.max_numel / (numel(&batch) * d.max(4)).max(1)).max(1);
        let dv = choose(self.scale.sizes, s.attr2 >> 4).min(4);
        // Large programs keep the scores `[.., S, t]` and the output within `max_numel`
        // elements, and each product within `max_macs` multiply-adds (small ones: no bound).
        let rows = numel(&batch) * q.shape()[r - 2];
        let large = self.scale.large();
        let (max_numel, max_macs) =
            if large { (self.scale.max_numel, self.scale.max_macs) } else { (usize::MAX, usize::MAX) };
        let fits_k =
            |t: usize| rows.saturating_mul(t) <= max_numel && rows.saturating_mul(t).saturating_mul(d) <= max_macs;
        let fits_v = |t: usize, w: usize| {
            rows.saturating_mul(w) <= max_numel && rows.saturating_mul(t).saturating_mul(w) <= max_macs
        };
        let t = if large { t.min(max_numel / rows.max(1)).min(max_macs / (rows * (d + dv)).max(1)).max(1) } else { t };
        let kt = |e: &E| e.is_float() && e.dtype() == q.dtype() && e.rank() == r && e.shape()[..r - 2] == batch[..];
        let k = self.pick(s.b, |e| kt(e) && e.shape()[r - 1] == d && fits_k(e.shape()[r - 2]));
        let k = k.unwrap_or_else(|| self.input(q.dtype(), [batch.clone(), vec![t, d]].concat()));
        let t = k.shape()[r - 2];
        let v = self.pick(s.c, |e| kt(e) && e.shape()[r - 2] == t && fits_v(t, e.shape()[r - 1]));
        let v = v.unwrap_or_else(|| self.input(q.dtype(), [batch.clone(), vec![t, dv]].concat()));
        let scale = choose(&[0.125, 0.5, 1.0 / (d as f64).sqrt(), 0.25], s.attr);
        let limit = (8.0 / (scale * d as f64)).sqrt();
        let (q, k) = (self.tame(q, limit), self.tame(k, limit));
        (self.named(q), self.named(k), v, scale)
    }

    pub(super) fn attention(&mut self, s: &Step) -> E {
        let (q, k, v, scale) = self.qkv(s);
        let causal = (s.attr / 4 % 2).to_string();
        let mut shape = q.shape().to_vec();
        *shape.last_mut().expect("rank 2 or more") = v.shape()[v.rank() - 1];
        let args = [q.text.clone(), k.text.clone(), v.text.clone(), scale.to_string(), causal];
        let e = call("attention", &args, TensorType::new(q.dtype(), shape), -v.mag(), v.mag(), false);
        self.emit(e)
    }

    // ---- decomposed patterns (what the `patterns` rules recognise)

    pub(super) fn pattern(&mut self, s: &Step) -> E {
        match s.attr % 13 {
            0 => self.softmax_parts(s),
            1 => self.softmax_unshifted(s),
            2 => self.log_softmax_parts(s),
            3 => self.layernorm_parts(s),
            4 => self.rmsnorm_parts(s),
            5 => self.gelu_parts(s),
            6 => self.gelu_tanh_parts(s),
            7 => self.sigmoid_parts(s),
            8 => self.silu_parts(s),
            9 => self.attention_parts(s),
            10 => self.cross_entropy_parts(s),
            11 => self.dense(s),
            _ => self.residual_norm(s),
        }
    }

    /// A float value of rank at least 1 and an axis of it.
    pub(super) fn with_axis(&mut self, s: &Step) -> (E, usize, String) {
        let x = self.float_of_rank(s.a, 1);
        let (axis, text) = Gen::axis(x.rank(), s.attr2);
        (x, axis, text)
    }

    /// `m = amax(x, a); e = exp(x - m); y = e / sum(e, a)`.
    pub(super) fn softmax_parts(&mut self, s: &Step) -> E {
        let (x, _, a) = self.with_axis(s);
        let m = self.bind(x.derive(format!("amax({}, {a})", x.text), reduced(&x, &a), x.lo, x.hi, true));
        let e = x.derive(format!("exp({} - {})", x.text, m.text), x.ty.clone(), (x.lo - x.hi).exp(), 1.0, false);
        let e = self.bind(e.with_exact(false));
        self.emit(e.derive(format!("{} / sum({}, {a})", e.text, e.text), x.ty.clone(), 0.0, 1.0, false))
    }

    /// `e = exp(x); y = e / sum(e, a)` (x within [-4, 4]).
    pub(super) fn softmax_unshifted(&mut self, s: &Step) -> E {
        let (x, _, a) = self.with_axis(s);
        let x = self.tame(x, 4.0);
        let e = self.apply("exp", &x);
        let e = self.bind(e);
        self.emit(e.derive(format!("{} / sum({}, {a})", e.text, e.text), e.ty.clone(), 0.0, 1.0, false))
    }

    /// `y = x - amax(x, a) - log(sum(exp(x - amax(x, a)), a))`, or x minus its logsumexp.
    pub(super) fn log_softmax_parts(&mut self, s: &Step) -> E {
        let (x, axis, a) = self.with_axis(s);
        let x = self.tame(x, MAG / 2.0);
        let lo = x.lo - x.hi - (x.shape()[axis] as f64).ln();
        let t = &x.text;
        let text = if s.attr2.is_multiple_of(3) {
            format!("{t} - (amax({t}, {a}) + log(sum(exp({t} - amax({t}, {a})), {a})))")
        } else {
            format!("{t} - amax({t}, {a}) - log(sum(exp({t} - amax({t}, {a})), {a}))")
        };
        self.emit(x.derive(text, x.ty.clone(), lo, 0.0, false).with_exact(false))
    }

    /// `mu = mean(x, -1); xc = x - mu; var = mean(xc * xc, -1);
    /// y = xc * rsqrt(var + eps) * g + b` (or `xc / sqrt(var + eps)`).
    pub(super) fn layernorm_parts(&mut self, s: &Step) -> E {
        let x = self.float_of_rank(s.a, 1);
        let x = self.tame(x, MAG / 2.0);
        let x = self.named(x);
        let (g, b) = (self.param(&x, s.b), self.param(&x, s.c));
        let last = if s.attr2.is_multiple_of(2) { "-1".to_string() } else { (x.rank() - 1).to_string() };
        let mu = x.derive(format!("mean({}, {last})", x.text), reduced(&x, &last), x.lo, x.hi, false);
        let mu = self.bind(mu.with_exact(false));
        let xc = x.derive(format!("{} - {}", x.text, mu.text), x.ty.clone(), x.lo - x.hi, x.hi - x.lo, false);
        let xc = self.bind(xc.with_exact(false));
        let v = (x.hi - x.lo).powi(2);
        let var =
            self.bind(xc.derive(format!("mean({} * {}, {last})", xc.text, xc.text), reduced(&x, &last), 0.0, v, false));
        let eps = Gen::eps(s.attr2 / 2);
        let norm = if s.attr2 % 4 < 2 {
            format!("{} * rsqrt({} + {eps})", xc.text, var.text)
        } else {
            format!("{} / sqrt({} + {eps})", xc.text, var.text)
        };
        let m = (x.shape()[x.rank() - 1] as f64).sqrt() * g.mag() + b.mag();
        self.emit(x.derive(format!("{norm} * {} + {}", g.text, b.text), x.ty.clone(), -m, m, false))
    }

    /// `y = x * rsqrt(mean(x * x, -1) + eps) * g` (or with `square(x)`).
    pub(super) fn rmsnorm_parts(&mut self, s: &Step) -> E {
        let x = self.float_of_rank(s.a, 1);
        let x = self.tame(x, MAG.sqrt());
        let x = self.named(x);
        let g = self.param(&x, s.b);
        let t = &x.text;
        let sq = if s.attr2.is_multiple_of(2) { format!("{t} * {t}") } else { format!("square({t})") };
        let eps = Gen::eps(s.attr2 / 2);
        let m = (x.shape()[x.rank() - 1] as f64).sqrt() * g.mag();
        let text = format!("{t} * rsqrt(mean({sq}, -1) + {eps}) * {}", g.text);
        self.emit(x.derive(text, x.ty.clone(), -m, m, false).with_exact(false))
    }

    /// `0.5 * x * (1 + erf(x * 0.7071067811865476))` (or `/ 1.4142135623730951`, `/ sqrt(2)`).
    pub(super) fn gelu_parts(&mut self, s: &Step) -> E {
        let x = self.float_operand(s.a);
        let t = &x.text;
        let arg = match s.attr2 % 3 {
            0 => format!("{t} * 0.7071067811865476"),
            1 => format!("{t} / 1.4142135623730951"),
            _ => format!("{t} / sqrt(2)"),
        };
        let text = format!("0.5 * {t} * (1 + erf({arg}))");
        self.emit(x.derive(text, x.ty.clone(), -0.3, x.hi.max(0.0), false).with_exact(false))
    }

    /// `0.5 * x * (1 + tanh(0.7978845608028654 * (x + 0.044715 * (x * x * x))))` (or `x ^ 3`).
    pub(super) fn gelu_tanh_parts(&mut self, s: &Step) -> E {
        let x = self.float_operand(s.a);
        let x = self.tame(x, 3.9);
        let x = self.named(x);
        let t = &x.text;
        let cube = if s.attr2.is_multiple_of(2) { format!("({t} * {t} * {t})") } else { format!("{t} ^ 3") };
        let text = format!("0.5 * {t} * (1 + tanh(0.7978845608028654 * ({t} + 0.044715 * {cube})))");
        self.emit(x.derive(text, x.ty.clone(), -0.3, x.hi.max(0.0), false).with_exact(false))
    }

    /// `1 / (1 + exp(-x))` or `recip(1 + exp(-x))`.
    pub(super) fn sigmoid_parts(&mut self, s: &Step) -> E {
        let x = self.float_operand(s.a);
        let x = self.tame(x, 4.0);
        let x = self.named(x);
        let inner = format!("1 + exp(-{})", x.text);
        let text = if s.attr2.is_multiple_of(2) { format!("1 / ({inner})") } else { format!("recip({inner})") };
        self.emit(x.derive(text, x.ty.clone(), 0.0, 1.0, false).with_exact(false))
    }

    /// `x * sigmoid(x)` or `x / (1 + exp(-x))`.
    pub(super) fn silu_parts(&mut self, s: &Step) -> E {
        let x = self.float_operand(s.a);
        let x = self.tame(x, 4.0);
        let x = self.named(x);
        let t = &x.text;
        let text =
            if s.attr2.is_multiple_of(2) { format!("{t} * sigmoid({t})") } else { format!("{t} / (1 + exp(-{t}))") };
        self.emit(x.derive(text, x.ty.clone(), -0.3, x.hi.max(0.0), false).with_exact(false))
    }

    /// `s = q @ transpose(k, -1, -2) * scale; p = softmax(s, -1); y = p @ v` (or `/ d`).
    pub(super) fn attention_parts(&mut self, s: &Step) -> E {
        let (q, k, v, scale) = self.qkv(s);
        let r = q.rank();
        let mut st = q.ty.clone();
        st.shape[r - 1] = k.shape()[r - 2];
        let scores = if s.attr2.is_multiple_of(2) {
            format!("{} @ transpose({}, -1, -2) * {scale}", q.text, k.text)
        } else {
            format!("{} @ transpose({}, -1, -2) / {}", q.text, k.text, 1.0 / scale)
        };
        let sc = self.bind(q.derive(scores, st.clone(), -8.0, 8.0, false).with_exact(false));
        let p = self.bind(sc.derive(format!("softmax({}, -1)", sc.text), st, 0.0, 1.0, false));
        let mut yt = q.ty.clone();
        yt.shape[r - 1] = v.shape()[r - 1];
        self.emit(p.derive(format!("{} @ {}", p.text, v.text), yt, -v.mag(), v.mag(), false))
    }

    /// `mean(-sum(onehot(t, V) * log_softmax(x, -1), -1), 0)` over logits `[N, V]`, maybe
    /// reshaped to a scalar.
    pub(super) fn cross_entropy_parts(&mut self, s: &Step) -> E {
        let x = match self.pick(s.a, |e| e.is_float() && e.rank() == 2) {
            Some(x) => x,
            None => {
                let (n, v) = (choose(self.scale.sizes, s.attr2), choose(self.scale.sizes, s.b).max(2));
                let n = if self.scale.large() { n.min(self.scale.max_frame / v).max(1) } else { n };
                self.input(self.float, vec![n, v])
            }
        };
        let t = self.targets(&x);
        let v = x.shape()[1];
        let hi = x.hi - x.lo + (v as f64).ln();
        let onehot = match x.dtype() {
            DType::F32 => format!("onehot({}, {v})", t.text),
            d => format!("cast(onehot({}, {v}), {d})", t.text),
        };
        let inner = format!("mean(-sum({onehot} * log_softmax({}, -1), -1), 0)", x.text);
        let e = if s.attr2.is_multiple_of(2) {
            x.derive(inner, TensorType::new(x.dtype(), vec![1, 1]), 0.0, hi, false)
        } else {
            x.derive(format!("reshape({inner}, [])"), TensorType::scalar(x.dtype()), 0.0, hi, false)
        };
        self.emit(e.with_exact(false))
    }

    /// `act(x @ w + b)`.
    pub(super) fn dense(&mut self, s: &Step) -> E {
        let x = self.float_of_rank(s.a, 2);
        let rows = numel(x.shape()) / x.shape()[x.rank() - 1];
        let n = choose(self.scale.sizes, s.attr2).min((self.scale.max_numel / rows.max(1)).max(1));
        let n = self.product_width(rows, x.shape()[x.rank() - 1], n);
        let w = self.matmul_rhs(&x, s.b, n);
        let y = self.matmul_of(x, w);
        let bias = self.input(y.dtype(), vec![y.shape()[y.rank() - 1]]);
        let y = self.bind(binop(&y, "+", &bias, y.lo - 7.0, y.hi + 7.0, false));
        let act = choose(&["relu", "gelu", "tanh", "silu"], s.attr2 / 2);
        let e = self.apply(act, &y);
        self.emit(e)
    }

    /// `h = x + r; y = layernorm(h, g, b, eps)`, both written (a residual and its norm).
    pub(super) fn residual_norm(&mut self, s: &Step) -> E {
        let x = self.float_of_rank(s.a, 1);
        let r = self.partner(&x, s.b | 0x7, |_| true, &[]);
        let h = self.arith_of(x, "+", r, MAG);
        let h = self.emit(h);
        let (g, b) = (self.param(&h, s.c), self.param(&h, s.c / 3));
        let m = (h.shape()[h.rank() - 1] as f64).sqrt() * g.mag() + b.mag();
        let args = [h.text.clone(), g.text.clone(), b.text.clone(), Gen::eps(s.attr2).into()];
        let e = call("layernorm", &args, h.ty.clone(), -m, m, false);
        let y = self.emit(e);
        self.outputs.insert(h.text);
        y
    }

    /// `l = sum(reshape(v * w, [n]), 0)` of the newest float value `v` and new weights `w`, and
    /// `grad(l, x)` for one or two of the float inputs (all of them f32: the backward graph
    /// compares computed values, as `relu` and `amax` do, which coarser rounding could flip).
    /// Only programs of at most 8 statements get them: a backward graph doubles a program, and
    /// planning time grows faster than the program.
    pub(super) fn gradients(&mut self, sel: u8) {
        if self.lines.len() > 8 || self.pool.iter().any(|e| e.is_float() && e.dtype() != DType::F32) {
            return;
        }
        let Some(v) = self.pick(0, |e| e.is_float()) else { return };
        let w = self.input(DType::F32, v.shape().to_vec());
        let n = numel(v.shape());
        let text = format!("sum(reshape({} * {}, [{n}]), 0)", v.operand(), w.text);
        let loss = self.bind(v.derive(text, TensorType::new(DType::F32, vec![1]), 0.0, 0.0, false));
        self.outputs.insert(loss.text.clone());
        let xs: Vec<E> = self.pool.iter().filter(|e| e.is_float() && e.text.starts_with('x')).cloned().collect();
        for k in 0..=usize::from(sel % 2) {
            let x = &xs[(usize::from(sel / 2) + k * 3) % xs.len()];
            let g = call("grad", &[loss.text.clone(), x.text.clone()], x.ty.clone(), 0.0, 0.0, false);
            let g = self.bind(g);
            self.outputs.insert(g.text);
        }
    }
}
