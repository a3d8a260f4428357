//! The generator's primitive operations: pointwise ops, comparisons and selections, casts,
//! reductions, layout views, products, indices, dropout, integers and bools.
//!
//! Invariant: each returns the value of the statement it emitted, within the generator's
//! magnitude bounds, and feeds discontinuous operations only exact values.

use super::values::{binop, binop_matmul, call, corners, fits, numel, shape_text, unary_interval, E};
use super::{choose, Gen, Step, INT_MAG, MAG};
use crate::ir::infer::broadcast_shapes;
use crate::ir::types::{DType, TensorType};

impl Gen {
    // ---- pointwise operations

    /// `a + b`, `a - b`, `a * b` on floats (integers in `int_arith`).
    pub(super) fn arith(&mut self, s: &Step) -> E {
        let a = self.float_operand(s.a);
        let lits = ["1", "2", "0.5", "0", "-1", "3", "0.25", "1e-3"];
        let b = self.partner(&a, s.b, |_| true, &lits);
        let op = choose(&["+", "-", "*"], s.attr);
        let e = self.arith_of(a, op, b, MAG);
        self.emit(e)
    }

    /// `a op b` for `+ - *`, with operands scaled so the result stays within `limit`.
    pub(super) fn arith_of(&self, a: E, op: &str, b: E, limit: f64) -> E {
        let (a, b) = if op == "*" {
            (self.tame(a, limit.sqrt()), if b.literal { b } else { self.tame(b, limit.sqrt()) })
        } else {
            (self.tame(a, limit / 2.0), if b.literal { b } else { self.tame(b, limit / 2.0) })
        };
        let (lo, hi) = match op {
            "+" => (a.lo + b.lo, a.hi + b.hi),
            "-" => (a.lo - b.hi, a.hi - b.lo),
            _ => corners((a.lo, a.hi), (b.lo, b.hi), |x, y| x * y),
        };
        let exact = a.exact && b.exact && !a.dtype().is_float();
        binop(&a, op, &b, lo, hi, exact)
    }

    /// A smooth or piecewise-linear unary function.
    pub(super) fn unary(&mut self, s: &Step) -> E {
        let names =
            ["neg", "abs", "relu", "tanh", "sigmoid", "gelu", "gelu_tanh", "silu", "erf", "sin", "cos", "square"];
        let name = choose(&names, s.attr);
        let a = self.float_operand(s.a);
        let a = if name == "square" { self.tame(a, MAG.sqrt()) } else { a };
        let e = if name == "neg" && s.attr2.is_multiple_of(2) {
            // Unary minus in its operator spelling.
            a.derive(format!("-{}", a.operand()), a.ty.clone(), -a.hi, -a.lo, false)
        } else {
            self.apply(name, &a)
        };
        self.emit(e)
    }

    pub(super) fn exp(&mut self, s: &Step) -> E {
        let a = self.float_operand(s.a);
        let a = self.tame(a, 4.0);
        let e = self.apply("exp", &a);
        self.emit(e)
    }

    /// `log`, `sqrt`, `rsqrt` or `recip` of a value made positive.
    pub(super) fn log_like(&mut self, s: &Step) -> E {
        let a = self.float_operand(s.a);
        let a = self.positive(a, s.attr2);
        let e = self.apply(choose(&["log", "sqrt", "rsqrt", "recip"], s.attr), &a);
        self.emit(e)
    }

    /// `a / b` with `b` made positive (floats; integer division is in `int_arith`).
    pub(super) fn div(&mut self, s: &Step) -> E {
        let a = self.float_operand(s.a);
        let b = self.partner(&a, s.b, |_| true, &["2", "3", "0.5", "7"]);
        let b = if b.literal { b } else { self.positive(b, s.attr2) };
        let a = self.tame(a, MAG * b.lo.min(1.0));
        let (lo, hi) = corners((a.lo, a.hi), (b.lo, b.hi), |x, y| x / y);
        let e = binop(&a, "/", &b, lo, hi, false);
        self.emit(e)
    }

    /// `pow(a, b)` or `a ^ b`: a positive base with any exponent in [-2, 3], or any base with
    /// an integer exponent.
    pub(super) fn pow(&mut self, s: &Step) -> E {
        let a = self.float_operand(s.a);
        let spell = |a: &E, b: &E| {
            if s.attr2.is_multiple_of(2) {
                format!("pow({}, {})", a.text, b.text)
            } else {
                format!("{} ^ {}", a.operand(), b.operand())
            }
        };
        if s.attr.is_multiple_of(3) {
            let b = E::literal(choose(&["2", "3"], s.b));
            let a = self.tame(a, 3.9);
            let (lo, hi) =
                if b.text == "2" { unary_interval("square", a.lo, a.hi) } else { (a.lo.powi(3), a.hi.powi(3)) };
            let e = a.derive(spell(&a, &b), a.ty.clone(), lo, hi, false).with_exact(false);
            return self.emit(e);
        }
        let a = self.tame(a, 4.0);
        let base = self.positive(a, s.attr2 / 2);
        let b = self.partner(&base, s.b, |_| true, &["2", "0.5", "-0.5", "-1", "3", "1", "1.5"]);
        let b = if b.literal { b } else { self.tame(b, 2.0) };
        let (lo, hi) = corners((base.lo, base.hi), (b.lo, b.hi), f64::powf);
        let shape = broadcast_shapes(base.shape(), b.shape()).expect("partners broadcast");
        let ty = TensorType::new(base.dtype(), shape);
        let e =
            E { text: spell(&base, &b), ty, lo, hi, exact: false, atomic: s.attr2.is_multiple_of(2), literal: false };
        self.emit(e)
    }

    /// `max(a, b)` or `min(a, b)` (exact when both operands are).
    pub(super) fn max_min(&mut self, s: &Step) -> E {
        let a = self.pick(s.a, |e| !e.is_bool() && !e.literal);
        let a = a.unwrap_or_else(|| self.float_operand(s.a));
        let b = self.partner(&a, s.b, |_| true, &["0", "1", "-1", "0.5"]);
        let (name, lo, hi) = if s.attr.is_multiple_of(2) {
            ("max", a.lo.max(b.lo), a.hi.max(b.hi))
        } else {
            ("min", a.lo.min(b.lo), a.hi.min(b.hi))
        };
        let shape = broadcast_shapes(a.shape(), b.shape()).expect("partners broadcast");
        let e = call(
            name,
            &[a.text.clone(), b.text.clone()],
            TensorType::new(a.dtype(), shape),
            lo,
            hi,
            a.exact && b.exact,
        );
        self.emit(e)
    }

    /// A comparison of two exact values (or an exact value and a literal).
    pub(super) fn compare_of(&mut self, a: &E, sel: u16, which: u16) -> E {
        let lits: &[&str] = if a.is_bool() { &["0", "1"] } else { &["0", "0.5", "-1", "1", "2"] };
        let b = self.partner(a, sel, |e| e.exact, lits);
        let op = choose(&["<", "<=", ">", ">=", "==", "!="], which);
        binop(a, op, &b, 0.0, 1.0, true)
    }

    pub(super) fn compare(&mut self, s: &Step) -> E {
        let a = self.exact_operand(s.a);
        let e = self.compare_of(&a, s.b, s.attr);
        self.emit(e)
    }

    /// A bool value that broadcasts with `shape`: an existing one, or a comparison made now.
    pub(super) fn condition(&mut self, shape: &[usize], sel: u16, which: u16) -> E {
        if let Some(c) = self.pick(sel, |e| e.is_bool() && fits(e.shape(), shape, self.scale.max_numel)) {
            if sel % 4 != 3 {
                return c;
            }
        }
        let max = self.scale.max_numel;
        let fit = |e: &E| e.exact && !e.literal && !e.is_bool() && fits(e.shape(), shape, max);
        let a = match self.pick(sel / 4, fit) {
            Some(a) => a,
            None => {
                let p = self.partner_shape(shape, sel);
                self.input(self.float, p)
            }
        };
        let c = self.compare_of(&a, sel / 16, which);
        if fits(c.shape(), shape, self.scale.max_numel) {
            c
        } else {
            let p = self.partner_shape(shape, sel);
            self.input(DType::Bool, p)
        }
    }

    /// `where(c, a, b)`.
    pub(super) fn select(&mut self, s: &Step) -> E {
        let a = self.pick(s.a, |e| !e.literal).unwrap_or_else(|| self.float_operand(s.a));
        let lits: &[&str] = if a.is_bool() { &["0", "1"] } else { &["0", "-1", "2"] };
        let b = self.partner(&a, s.b, |_| true, lits);
        let out = broadcast_shapes(a.shape(), b.shape()).expect("partners broadcast");
        let c = self.condition(&out, s.c, s.attr);
        let shape = broadcast_shapes(c.shape(), &out).expect("conditions fit");
        let (args, ty) = ([c.text.clone(), a.text.clone(), b.text.clone()], TensorType::new(a.dtype(), shape));
        let e = call("where", &args, ty, a.lo.min(b.lo), a.hi.max(b.hi), a.exact && b.exact);
        self.emit(e)
    }

    /// `cast(a, dtype)`: to any dtype from an exact value, to a float dtype from any.
    pub(super) fn cast(&mut self, s: &Step) -> E {
        let a = self.pick(s.a, |e| !e.literal).unwrap_or_else(|| self.float_operand(s.a));
        let targets: &[DType] = if a.exact { &DType::ALL } else { &[DType::F32, DType::Bf16, DType::F16] };
        let mut to = choose(targets, s.attr);
        if to == DType::F16 && a.mag() > 60_000.0 {
            to = DType::F32;
        }
        let (lo, hi) = match to {
            DType::Bool => (0.0, 1.0),
            DType::I32 => (a.lo.trunc(), a.hi.trunc()),
            _ => (a.lo, a.hi),
        };
        let e =
            call("cast", &[a.text.clone(), to.name().into()], TensorType::new(to, a.shape().to_vec()), lo, hi, a.exact);
        self.emit(e)
    }

    // ---- reductions and layout

    /// An axis of a tensor of rank `rank` (at least 1), written negative half the time.
    pub(super) fn axis(rank: usize, sel: u16) -> (usize, String) {
        let a = sel as usize % rank;
        let text = if (sel as usize / rank).is_multiple_of(2) { format!("-{}", rank - a) } else { a.to_string() };
        (a, text)
    }

    /// `sum`, `mean`, `amax` or `amin` over one axis (keep-dims).
    pub(super) fn reduce(&mut self, s: &Step) -> E {
        let a = self.pick(s.a, |e| !e.literal && !e.is_bool() && e.rank() >= 1);
        let a = a.unwrap_or_else(|| self.float_of_rank(s.a, 1));
        let (axis, text) = Gen::axis(a.rank(), s.attr2);
        let n = a.shape()[axis] as f64;
        let mut name = choose(&["sum", "mean", "amax", "amin"], s.attr);
        if name == "mean" && !a.is_float() {
            name = "sum";
        }
        let limit = if a.is_float() { MAG } else { INT_MAG * 10.0 };
        let a = if name == "sum" { self.tame(a, limit / n) } else { a };
        let (lo, hi) = if name == "sum" { (a.lo * n, a.hi * n) } else { (a.lo, a.hi) };
        let exact = a.exact && (name.starts_with("am") || !a.is_float());
        let mut shape = a.shape().to_vec();
        shape[axis] = 1;
        let e = call(name, &[a.text.clone(), text], TensorType::new(a.dtype(), shape), lo, hi, exact);
        self.emit(e)
    }

    /// `transpose(a, i, j)`, the axes possibly equal.
    pub(super) fn transpose(&mut self, s: &Step) -> E {
        let a = self.pick(s.a, |e| !e.literal && e.rank() >= 1);
        let a = a.unwrap_or_else(|| self.float_of_rank(s.a, 2));
        let (i, ti) = Gen::axis(a.rank(), s.attr);
        let (j, tj) = Gen::axis(a.rank(), s.attr2);
        let mut shape = a.shape().to_vec();
        shape.swap(i, j);
        let e =
            a.derive(format!("transpose({}, {ti}, {tj})", a.text), TensorType::new(a.dtype(), shape), a.lo, a.hi, true);
        self.emit(e)
    }

    /// A random shape with `n` elements: `n`'s prime factors spread over up to 4 axes, with
    /// size-1 axes here and there.
    pub(super) fn factor_shape(n: usize, sel: u16) -> Vec<usize> {
        let mut factors = vec![];
        let mut m = n;
        let mut p = 2;
        while m > 1 {
            while m.is_multiple_of(p) {
                factors.push(p);
                m /= p;
            }
            p += 1;
        }
        let rank = 1 + sel as usize % 4;
        let mut shape = vec![1; rank];
        for (i, f) in factors.into_iter().enumerate() {
            let slot = (sel as usize / 4 + i * 7) % rank;
            shape[slot] *= f;
        }
        if sel & 0x8000 != 0 && n == 1 {
            return vec![];
        }
        shape
    }

    /// `reshape(a, shape)`.
    pub(super) fn reshape(&mut self, s: &Step) -> E {
        let a = self.pick(s.a, |e| !e.literal).unwrap_or_else(|| self.float_operand(s.a));
        let shape = Gen::factor_shape(numel(a.shape()), s.attr);
        let text = format!("reshape({}, {})", a.text, shape_text(&shape));
        let e = a.derive(text, TensorType::new(a.dtype(), shape), a.lo, a.hi, true);
        self.emit(e)
    }

    /// `broadcast(a, shape)`: size-1 axes widened, maybe an axis added in front.
    pub(super) fn broadcast(&mut self, s: &Step) -> E {
        let a = self.pick(s.a, |e| !e.literal).unwrap_or_else(|| self.float_operand(s.a));
        let mut shape = a.shape().to_vec();
        for (i, d) in shape.iter_mut().enumerate() {
            if *d == 1 && s.attr & (1 << i) != 0 {
                *d = choose(self.scale.sizes, s.attr2.rotate_left(i as u32));
            }
        }
        if (s.attr & 0x100 != 0 || shape == a.shape()) && shape.len() < 4 {
            shape.insert(0, choose(self.scale.sizes, s.attr2 >> 4));
        }
        if numel(&shape) > self.scale.max_numel {
            shape = a.shape().to_vec();
        }
        let text = format!("broadcast({}, {})", a.text, shape_text(&shape));
        let e = a.derive(text, TensorType::new(a.dtype(), shape), a.lo, a.hi, true);
        self.emit(e)
    }

    // ---- products and indices

    /// The right operand of `a @ _` with `n` columns: an existing value of `a`'s dtype whose
    /// batch axes broadcast with `a`'s, or a new input `[k, n]`; maybe stored transposed.
    pub(super) fn matmul_rhs(&mut self, a: &E, sel: u16, n: usize) -> E {
        let (r, k, m) = (a.rank(), a.shape()[a.rank() - 1], a.shape()[a.rank() - 2]);
        let batch = a.shape()[..r - 2].to_vec();
        let ok = |e: &E| {
            e.is_float()
                && e.dtype() == a.dtype()
                && e.rank() >= 2
                && e.shape()[e.rank() - 2] == k
                && broadcast_shapes(&batch, &e.shape()[..e.rank() - 2]).is_ok_and(|b| {
                    let n = e.shape()[e.rank() - 1];
                    numel(&b) * m * n <= self.scale.max_numel
                        && numel(&b).saturating_mul(m * k).saturating_mul(n) <= self.scale.max_macs
                })
        };
        if sel % 4 != 3 {
            if let Some(b) = self.pick(sel / 4, ok) {
                return b;
            }
        }
        if sel.is_multiple_of(2) {
            let t = self.input(a.dtype(), vec![n, k]);
            return t.derive(
                format!("transpose({}, -1, -2)", t.text),
                TensorType::new(a.dtype(), vec![k, n]),
                t.lo,
                t.hi,
                true,
            );
        }
        self.input(a.dtype(), vec![k, n])
    }

    /// The width `n` of a new product's right operand `[k, n]` with `rows` rows on the left: in
    /// large programs at most `max_macs` multiply-adds and `max_numel` elements on the right
    /// (small programs: `n`).
    pub(super) fn product_width(&self, rows: usize, k: usize, n: usize) -> usize {
        if !self.scale.large() {
            return n;
        }
        n.min(self.scale.max_macs / (rows * k).max(1)).min(self.scale.max_numel / k.max(1)).max(1)
    }

    /// `a @ b` with operands scaled so the products stay within [-MAG, MAG].
    pub(super) fn matmul_of(&self, a: E, b: E) -> E {
        let k = a.shape()[a.rank() - 1] as f64;
        let limit = (MAG / k).sqrt();
        let (a, b) = (self.tame(a, limit), self.tame(b, limit));
        let (ra, rb) = (a.rank(), b.rank());
        let mut shape = broadcast_shapes(&a.shape()[..ra - 2], &b.shape()[..rb - 2]).expect("batches broadcast");
        shape.extend([a.shape()[ra - 2], b.shape()[rb - 1]]);
        let m = a.mag() * b.mag() * k;
        binop_matmul(&a, &b, TensorType::new(a.dtype(), shape), -m, m)
    }

    pub(super) fn matmul(&mut self, s: &Step) -> E {
        let a = self.float_of_rank(s.a, 2);
        let rows = numel(a.shape()) / a.shape()[a.rank() - 1];
        let n = choose(self.scale.sizes, s.attr).min((self.scale.max_numel / rows.max(1)).max(1));
        let n = self.product_width(rows, a.shape()[a.rank() - 1], n);
        let b = self.matmul_rhs(&a, s.b, n);
        let e = self.matmul_of(a, b);
        self.emit(e)
    }

    /// `iota(n)`, as a row or a column.
    pub(super) fn iota(&mut self, s: &Step) -> E {
        let n = choose(&self.frame.clone(), s.attr).max(choose(self.scale.sizes, s.attr2));
        let ty = TensorType::new(DType::I32, vec![n]);
        let e = call("iota", &[n.to_string()], ty, 0.0, (n - 1) as f64, true);
        if s.attr.is_multiple_of(2) {
            return self.emit(e);
        }
        let col = TensorType::new(DType::I32, vec![n, 1]);
        let text = format!("reshape({}, [{n}, 1])", e.text);
        let e = e.derive(text, col, e.lo, e.hi, true);
        self.emit(e)
    }

    /// A causal mask over the last two axes: `where(row >= col, a, -8)`.
    pub(super) fn mask(&mut self, s: &Step) -> E {
        let a = self.float_of_rank(s.a, 2);
        let (r, c) = (a.shape()[a.rank() - 2], a.shape()[a.rank() - 1]);
        let cond = format!("reshape(iota({r}), [{r}, 1]) >= iota({c})");
        let e =
            call("where", &[cond, a.text.clone(), "-8".into()], a.ty.clone(), a.lo.min(-8.0), a.hi.max(-8.0), false);
        self.emit(e)
    }

    /// An i32 value of rank at most 2, or a new input.
    pub(super) fn indices(&mut self, sel: u16, max_numel: usize) -> E {
        if let Some(t) = self.pick(sel, |e| e.is_int() && e.rank() <= 2 && numel(e.shape()) <= max_numel) {
            return t;
        }
        let mut shape = self.frame_shape(sel);
        while numel(&shape) > max_numel || shape.len() > 2 {
            shape.remove(0);
        }
        self.input(DType::I32, shape)
    }

    /// `slice(a, axis, start, stop, step)`: a start in the axis (sometimes written from the
    /// end), a stop after it (sometimes past the end), a step of 1 to 3.
    pub(super) fn slice(&mut self, s: &Step) -> E {
        let a = self.pick(s.a, |e| !e.literal && e.rank() >= 1);
        let a = a.unwrap_or_else(|| self.float_of_rank(s.a, 1));
        let (axis, ta) = Gen::axis(a.rank(), s.attr);
        let n = a.shape()[axis] as i64;
        let step = 1 + (s.attr2 % 3) as i64;
        let start = (s.attr2 / 3) as i64 % n;
        let stop = start + 1 + (s.b as i64 % (n - start + 1));
        let (first, len) = crate::ir::infer::slice_range(n as usize, start, stop, step).expect("a nonempty slice");
        debug_assert_eq!(first as i64, start);
        let start_text = if s.attr2 & 0x4000 != 0 { (start - n).to_string() } else { start.to_string() };
        let mut shape = a.shape().to_vec();
        shape[axis] = len;
        let text = format!("slice({}, {ta}, {start_text}, {stop}, {step})", a.text);
        let e = a.derive(text, TensorType::new(a.dtype(), shape), a.lo, a.hi, true);
        self.emit(e)
    }

    /// `concat(a, b, axis)`: `b` an existing value that matches `a` off the axis, or a new input.
    pub(super) fn concat(&mut self, s: &Step) -> E {
        let a = self.pick(s.a, |e| !e.literal && e.rank() >= 1 && numel(e.shape()) * 2 <= self.scale.max_numel);
        let a = a.unwrap_or_else(|| self.float_of_rank(s.a, 1));
        let (axis, ta) = Gen::axis(a.rank(), s.attr);
        let matches = |e: &E| {
            !e.literal
                && e.dtype() == a.dtype()
                && e.rank() == a.rank()
                && (0..a.rank()).all(|k| k == axis || e.shape()[k] == a.shape()[k])
        };
        let b = match self.pick(s.b, matches) {
            Some(b) if !s.c.is_multiple_of(3) => b,
            _ => {
                let mut shape = a.shape().to_vec();
                shape[axis] = choose(self.scale.sizes, s.c).min(self.scale.max_numel / numel(a.shape()).max(1)).max(1);
                self.input(a.dtype(), shape)
            }
        };
        let mut shape = a.shape().to_vec();
        shape[axis] += b.shape()[axis];
        let text = format!("concat({}, {}, {ta})", a.text, b.text);
        let ty = TensorType::new(a.dtype(), shape);
        let e = call("concat", &[], ty, a.lo.min(b.lo), a.hi.max(b.hi), a.exact && b.exact);
        self.emit(E { text, ..e })
    }

    /// `gather(x, t, axis)` of a float or integer value by a new i32 input (whose random values
    /// the reference draws below the axis' size).
    pub(super) fn gather(&mut self, s: &Step) -> E {
        let x = self.pick(s.a, |e| !e.literal && !e.is_bool() && e.rank() >= 1);
        let x = x.unwrap_or_else(|| self.float_of_rank(s.a, 1));
        let (axis, ta) = Gen::axis(x.rank(), s.attr);
        let rest = numel(x.shape()) / x.shape()[axis];
        let mut idx = self.frame_shape(s.b);
        while idx.len() > 2 || numel(&idx) * rest > self.scale.max_numel {
            if idx.is_empty() {
                break;
            }
            idx.remove(0);
        }
        let t = self.input(DType::I32, idx.clone());
        let mut shape = x.shape()[..axis].to_vec();
        shape.extend_from_slice(&idx);
        shape.extend_from_slice(&x.shape()[axis + 1..]);
        let text = format!("gather({}, {}, {ta})", x.text, t.text);
        let e = x.derive(text, TensorType::new(x.dtype(), shape), x.lo, x.hi, true);
        self.emit(e)
    }

    /// `onehot(t, n)`.
    pub(super) fn onehot(&mut self, s: &Step) -> E {
        let n = choose(self.scale.sizes, s.attr).max(2);
        let t = self.indices(s.a, self.scale.max_numel / n);
        let mut shape = t.shape().to_vec();
        shape.push(n);
        let e = call("onehot", &[t.text.clone(), n.to_string()], TensorType::new(DType::F32, shape), 0.0, 1.0, true);
        self.emit(e)
    }

    pub(super) fn dropout(&mut self, s: &Step) -> E {
        let a = self.float_operand(s.a);
        let p = choose(&[0.1, 0.5, 0.0, 0.25], s.attr);
        let a = self.tame(a, MAG * (1.0 - p));
        let scale = 1.0 / (1.0 - p);
        let args = [a.text.clone(), p.to_string(), self.dropout_seed(s)];
        let e = call("dropout", &args, a.ty.clone(), (a.lo * scale).min(0.0), (a.hi * scale).max(0.0), false);
        self.emit(e)
    }

    /// A seed: mostly a literal; sometimes an i32 tensor given at run time, of shape `[]` or
    /// `[1]` (an exact integer value already computed, or a new input).
    fn dropout_seed(&mut self, s: &Step) -> String {
        if !s.b.is_multiple_of(4) {
            return s.attr2.to_string();
        }
        let seed_like = |e: &E| e.is_int() && e.exact && !e.literal && e.ty.numel() == 1 && e.rank() <= 1;
        match self.pick(s.c, seed_like) {
            Some(e) if s.b.is_multiple_of(8) => e.text,
            _ => self.input(DType::I32, if s.b % 16 == 4 { vec![1] } else { vec![] }).text,
        }
    }

    // ---- integers and bools

    /// An i32 value: an existing one, a cast of an exact float, or a new input.
    pub(super) fn int_operand(&mut self, sel: u16) -> E {
        if let Some(e) = self.pick(sel, |e| e.is_int()) {
            return e;
        }
        if let Some(f) = self.pick(sel, |e| e.is_float() && e.exact) {
            let (lo, hi) = (f.lo.trunc(), f.hi.trunc());
            return self.emit(call(
                "cast",
                &[f.text.clone(), "i32".into()],
                TensorType::new(DType::I32, f.shape().to_vec()),
                lo,
                hi,
                true,
            ));
        }
        self.input(DType::I32, self.frame_shape(sel))
    }

    /// Integer arithmetic: `+ - *`, `max`, `min`, truncating `/`, `neg`, `abs`, `square`,
    /// and weak fractional literals (which round after each op, so no rule may reassociate).
    pub(super) fn int_arith(&mut self, s: &Step) -> E {
        let a = self.int_operand(s.a);
        let a = self.tame(a, INT_MAG.sqrt());
        let lits = ["2", "3", "-1", "0.5", "7"];
        let e = match s.attr % 6 {
            k @ 0..=2 => {
                let b = self.partner(&a, s.b, |_| true, &lits);
                let b = if b.literal { b } else { self.tame(b, INT_MAG.sqrt()) };
                let mut e = self.arith_of(a.clone(), ["+", "-", "*"][k as usize], b, INT_MAG);
                e.exact = true;
                e
            }
            3 => {
                let b = self.partner(&a, s.b, |_| true, &lits);
                let b = if b.literal { b } else { self.positive(b, 0) };
                let (lo, hi) = (-a.mag(), a.mag());
                binop(&a, "/", &b, lo, hi, true)
            }
            4 => {
                let mut e = self.apply(choose(&["neg", "abs", "square"], s.attr2), &a);
                e.exact = true;
                e
            }
            _ => {
                let b = self.partner(&a, s.b, |_| true, &lits);
                let name = choose(&["max", "min"], s.attr2);
                let shape = broadcast_shapes(a.shape(), b.shape()).expect("partners broadcast");
                let (lo, hi) = (a.lo.min(b.lo), a.hi.max(b.hi));
                call(name, &[a.text.clone(), b.text.clone()], TensorType::new(DType::I32, shape), lo, hi, true)
            }
        };
        self.emit(e)
    }

    /// `not(c)`, `c == d`, `c != d` or `where(c, d, e)` on bools.
    pub(super) fn bool_op(&mut self, s: &Step) -> E {
        let frame = self.frame_shape(s.a);
        let c = self.condition(&frame, s.a, s.attr2);
        let c = self.named(c);
        let e = match s.attr % 3 {
            0 => call("not", std::slice::from_ref(&c.text), c.ty.clone(), 0.0, 1.0, true),
            1 => self.compare_of(&c, s.b, 4 + s.attr2 % 2),
            _ => {
                let d = self.condition(c.shape(), s.b, s.attr2 / 2);
                let shape = broadcast_shapes(c.shape(), d.shape()).expect("conditions fit");
                let args = [c.text.clone(), d.text.clone(), "0".into()];
                call("where", &args, TensorType::new(DType::Bool, shape), 0.0, 1.0, true)
            }
        };
        self.emit(e)
    }

    /// `t = v`: another name for a value (often an input), marked an output so that the program
    /// has outputs that are inputs, or two names of one value.
    pub(super) fn alias(&mut self, s: &Step) -> E {
        let v = self.pick(s.a, |e| !e.literal).unwrap_or_else(|| self.float_operand(s.a));
        let e = self.bind(v);
        self.outputs.insert(e.text.clone());
        e
    }
}
