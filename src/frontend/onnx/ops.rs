//! Lowering of each supported ONNX operator onto the program builder.
//!
//! One table ([`OPS`]) names every operator with its input count and its lowering; the lowering
//! functions are small and share a handful of helpers (broadcasting elementwise application,
//! reshape, axis swaps). Where ONNX is more general than an eqfuse operator, the lowering
//! composes eqfuse operators: a reduction over several axes is a chain of one-axis reductions, a
//! permutation is a sequence of axis swaps, `keepdims=0` and `Unsqueeze`/`Squeeze` are reshapes,
//! a layer norm over several trailing axes flattens them first, `Split` is one slice per output,
//! `Concat` of several inputs nested binary concats, and `Gather` by a constant one-element
//! index a slice (its bound stays a literal the planner reads). `GatherElements` and
//! `GatherND` are one `gather` of the (partly) flattened data at linear positions computed
//! with `iota` arithmetic; `Conv` is read only as a patch embedding (a product of the image's
//! patches with the flattened weight).
//! Invariant: a lowering either returns the value ONNX defines (type-checked by the builder) or
//! an error saying which input or attribute is wrong; it never guesses a value.

use egg::Id;

use super::data::{self, dtype_of, f32_literal, Const};
use super::proto::{attr_type, data_type as dt, AttributeProto, NodeProto};
use super::{Importer, Out, Val};
use crate::ir::infer::{broadcast_shapes, norm_axis};
use crate::ir::lang::{Binary, Composite, Dims, Kind, Reduce, TensorLang, Unary};
use crate::ir::types::DType;

type R<T> = Result<T, String>;

/// One supported operator: its ONNX name, how many inputs it takes, and its lowering.
pub(super) struct OnnxOp {
    pub name: &'static str,
    pub min_inputs: usize,
    pub max_inputs: usize,
    pub lower: fn(&mut Importer, &NodeProto) -> R<Out>,
}

const fn op(
    name: &'static str,
    min_inputs: usize,
    max_inputs: usize,
    lower: fn(&mut Importer, &NodeProto) -> R<Out>,
) -> OnnxOp {
    OnnxOp { name, min_inputs, max_inputs, lower }
}

/// Every operator the importer reads.
pub(super) const OPS: &[OnnxOp] = &[
    op("Add", 2, 2, |im, n| im.binary(n, Binary::Add)),
    op("Sub", 2, 2, |im, n| im.binary(n, Binary::Sub)),
    op("Mul", 2, 2, |im, n| im.binary(n, Binary::Mul)),
    op("Div", 2, 2, |im, n| im.binary(n, Binary::Div)),
    op("Pow", 2, 2, |im, n| im.pow(n)),
    op("Max", 1, usize::MAX, |im, n| im.variadic(n, Binary::Max)),
    op("Min", 1, usize::MAX, |im, n| im.variadic(n, Binary::Min)),
    op("Sqrt", 1, 1, |im, n| im.unary(n, Unary::Sqrt)),
    op("Reciprocal", 1, 1, |im, n| im.unary(n, Unary::Recip)),
    op("Exp", 1, 1, |im, n| im.unary(n, Unary::Exp)),
    op("Log", 1, 1, |im, n| im.unary(n, Unary::Log)),
    op("Tanh", 1, 1, |im, n| im.unary(n, Unary::Tanh)),
    op("Erf", 1, 1, |im, n| im.unary(n, Unary::Erf)),
    op("Sigmoid", 1, 1, |im, n| im.unary(n, Unary::Sigmoid)),
    op("Relu", 1, 1, |im, n| im.unary(n, Unary::Relu)),
    op("Neg", 1, 1, |im, n| im.unary(n, Unary::Neg)),
    op("Abs", 1, 1, |im, n| im.unary(n, Unary::Abs)),
    op("Floor", 1, 1, |im, n| im.unary(n, Unary::Floor)),
    op("Ceil", 1, 1, |im, n| im.unary(n, Unary::Ceil)),
    // ONNX rounds halves to even, as `rintf` does.
    op("Round", 1, 1, |im, n| im.unary(n, Unary::Round)),
    op("Gelu", 1, 1, |im, n| im.gelu(n)),
    op("Where", 3, 3, |im, n| im.where_(n)),
    op("Cast", 1, 1, |im, n| im.cast(n)),
    op("ReduceMean", 1, 2, |im, n| im.reduce(n, Reduce::Mean)),
    op("ReduceSum", 1, 2, |im, n| im.reduce(n, Reduce::Sum)),
    op("ReduceMax", 1, 2, |im, n| im.reduce(n, Reduce::Amax)),
    op("Softmax", 1, 1, |im, n| im.softmax(n, Composite::Softmax)),
    op("LogSoftmax", 1, 1, |im, n| im.softmax(n, Composite::LogSoftmax)),
    op("LayerNormalization", 2, 3, |im, n| im.layer_norm(n)),
    op("MatMul", 2, 2, |im, n| im.matmul(n)),
    op("Gemm", 2, 3, |im, n| im.gemm(n)),
    op("Reshape", 2, 2, |im, n| im.reshape_op(n)),
    op("Transpose", 1, 1, |im, n| im.transpose_op(n)),
    op("Expand", 2, 2, |im, n| im.expand(n)),
    op("Unsqueeze", 1, 2, |im, n| im.unsqueeze(n)),
    op("Squeeze", 1, 2, |im, n| im.squeeze(n)),
    op("Gather", 2, 2, |im, n| im.gather(n)),
    op("GatherElements", 2, 2, |im, n| im.gather_elements(n)),
    op("GatherND", 2, 2, |im, n| im.gather_nd(n)),
    op("Conv", 2, 3, |im, n| im.conv(n)),
    op("Shape", 1, 1, |im, n| im.shape_op(n)),
    op("ConstantOfShape", 1, 1, |im, n| im.constant_of_shape(n)),
    op("Flatten", 1, 1, |im, n| im.flatten(n)),
    op("Slice", 1, 5, |im, n| im.slice_op(n)),
    op("Concat", 1, usize::MAX, |im, n| im.concat(n)),
    op("Split", 1, 2, |im, n| im.split(n)),
    op("Less", 2, 2, |im, n| im.binary(n, Binary::Lt)),
    op("LessOrEqual", 2, 2, |im, n| im.binary(n, Binary::Le)),
    op("Greater", 2, 2, |im, n| im.binary(n, Binary::Gt)),
    op("GreaterOrEqual", 2, 2, |im, n| im.binary(n, Binary::Ge)),
    op("Equal", 2, 2, |im, n| im.binary(n, Binary::Eq)),
    op("Not", 1, 1, |im, n| im.unary(n, Unary::Not)),
    op("And", 2, 2, |im, n| im.logical(n, true)),
    op("Or", 2, 2, |im, n| im.logical(n, false)),
    op("IsNaN", 1, 1, |im, n| im.is_nan(n)),
    op("Clip", 1, 3, |im, n| im.clip(n)),
    op("Identity", 1, 1, |_, n| Ok(Out::Alias(n.input[0].clone()))),
    op("Constant", 0, 0, |im, n| im.constant(n)),
];

/// The ONNX operators the importer reads, in table order.
pub fn supported_onnx_ops() -> Vec<&'static str> {
    OPS.iter().map(|o| o.name).collect()
}

pub(super) fn lookup(op_type: &str) -> Option<&'static OnnxOp> {
    OPS.iter().find(|o| o.name == op_type)
}

/// A node's attributes, read with their declared type checked.
struct Attrs<'a>(&'a [AttributeProto]);

impl<'a> Attrs<'a> {
    fn get(&self, name: &str, ty: i32, what: &str) -> R<Option<&'a AttributeProto>> {
        match self.0.iter().find(|a| a.name == name) {
            Some(a) if a.r#type != 0 && a.r#type != ty => Err(format!("attribute `{name}` must be {what}")),
            found => Ok(found),
        }
    }
    fn int(&self, name: &str, default: i64) -> R<i64> {
        Ok(self.get(name, attr_type::INT, "an int")?.map_or(default, |a| a.i))
    }
    /// A float attribute, which must be finite (an `alpha`, `beta` or `epsilon` of NaN or
    /// infinity would make every output NaN).
    fn float(&self, name: &str, default: f64) -> R<f64> {
        match self.get(name, attr_type::FLOAT, "a float")? {
            Some(a) if !a.f.is_finite() => Err(format!("attribute `{name}` is {}; it must be a finite number", a.f)),
            found => Ok(found.map_or(default, |a| f32_literal(a.f))),
        }
    }
    fn ints(&self, name: &str) -> R<Option<Vec<i64>>> {
        Ok(self.get(name, attr_type::INTS, "a list of ints")?.map(|a| a.ints.clone()))
    }
    fn string(&self, name: &str, default: &str) -> R<String> {
        Ok(self
            .get(name, attr_type::STRING, "a string")?
            .map_or(default.to_string(), |a| String::from_utf8_lossy(&a.s).into_owned()))
    }
}

fn attrs(n: &NodeProto) -> Attrs<'_> {
    Attrs(&n.attribute)
}

/// An axis literal: `-1` for the last axis (the spelling rules and `.eqf` programs use), the
/// non-negative index otherwise.
fn axis_literal(axis: usize, rank: usize) -> f64 {
    if axis + 1 == rank {
        -1.0
    } else {
        axis as f64
    }
}

impl Importer<'_> {
    /// Input `k`, which must be present.
    fn input(&mut self, n: &NodeProto, k: usize) -> R<Val> {
        let name = n.input.get(k).filter(|s| !s.is_empty()).ok_or_else(|| format!("input {k} is missing"))?;
        self.arg(name).map_err(|m| format!("input {k}: {m}"))
    }

    /// Input `k`, which may be absent.
    fn opt_input(&mut self, n: &NodeProto, k: usize) -> R<Option<Val>> {
        match n.input.get(k).filter(|s| !s.is_empty()) {
            Some(_) => self.input(n, k).map(Some),
            None => Ok(None),
        }
    }

    /// Input `k` as a constant known at import time (a shape or axes operand), if present.
    fn const_input(&self, n: &NodeProto, k: usize) -> R<Option<&Const>> {
        let Some(name) = n.input.get(k).filter(|s| !s.is_empty()) else { return Ok(None) };
        self.consts.get(name).map(Some).ok_or_else(|| {
            format!(
                "input {k} (`{name}`) must be a constant (an initializer or a Constant node): eqfuse shapes are static"
            )
        })
    }

    /// Axes given as attribute `axes` or as input 1 (the form since opset 13 or 18); not both.
    fn axes(&self, n: &NodeProto) -> R<Option<Vec<i64>>> {
        let from_attr = attrs(n).ints("axes")?;
        let from_input = self.const_input(n, 1)?.map(|c| c.ints()).transpose().map_err(|m| format!("axes: {m}"))?;
        match (from_attr, from_input) {
            (Some(_), Some(_)) => Err("axes are given both as an attribute and as an input".to_string()),
            (a, b) => Ok(a.or(b)),
        }
    }

    fn weak(&self, v: &Val) -> bool {
        self.prog.fact(v.id).weak
    }

    /// A literal of `v`'s dtype.
    fn literal(&mut self, x: f64, dtype: DType) -> Val {
        Val { id: self.prog.num(x), shape: vec![], dtype }
    }

    /// A pointwise operator over broadcast operands.
    fn pointwise(&mut self, kind: Kind, args: &[Val]) -> R<Val> {
        let mut shape: Vec<usize> = vec![];
        for a in args {
            shape = broadcast_shapes(&shape, &a.shape)?;
        }
        let id = self.prog.apply(kind, args.iter().map(|a| a.id).collect())?;
        let dtype = match kind {
            Kind::Binary(b) if b.is_comparison() => DType::Bool,
            Kind::Where => args[1].dtype,
            _ => args[0].dtype,
        };
        let v = Val { id, shape, dtype };
        if self.weak(&v) {
            return Ok(v);
        }
        // Literals alone give an f32 result (`where(c, 0, 1)`); ONNX says which dtype it is.
        Ok(Val { id: self.exact(&v)?, ..v })
    }

    fn unary(&mut self, n: &NodeProto, u: Unary) -> R<Out> {
        let x = self.input(n, 0)?;
        self.pointwise(Kind::Unary(u), &[x]).map(Out::Val)
    }

    fn binary(&mut self, n: &NodeProto, b: Binary) -> R<Out> {
        let (x, y) = (self.input(n, 0)?, self.input(n, 1)?);
        self.pointwise(Kind::Binary(b), &[x, y]).map(Out::Val)
    }

    /// `Max` and `Min` of any number of operands, as a chain.
    fn variadic(&mut self, n: &NodeProto, b: Binary) -> R<Out> {
        let mut acc = self.input(n, 0)?;
        for k in 1..n.input.len() {
            let y = self.input(n, k)?;
            acc = self.pointwise(Kind::Binary(b), &[acc, y])?;
        }
        Ok(Out::Val(acc))
    }

    /// ONNX lets the exponent have its own type (`x ^ int64 2`); it is cast to the base's.
    fn pow(&mut self, n: &NodeProto) -> R<Out> {
        let (x, mut y) = (self.input(n, 0)?, self.input(n, 1)?);
        if y.dtype != x.dtype {
            y = if self.weak(&y) { Val { dtype: x.dtype, ..y } } else { self.cast_to(&y, x.dtype)? };
        }
        self.pointwise(Kind::Binary(Binary::Pow), &[x, y]).map(Out::Val)
    }

    fn gelu(&mut self, n: &NodeProto) -> R<Out> {
        let u = match attrs(n).string("approximate", "none")?.as_str() {
            "none" => Unary::Gelu,
            "tanh" => Unary::GeluTanh,
            other => return Err(format!("attribute approximate = `{other}` is not `none` or `tanh`")),
        };
        self.unary(n, u)
    }

    /// `And` / `Or` of two bool tensors, as `where(a, b, false)` / `where(a, true, b)`.
    fn logical(&mut self, n: &NodeProto, and: bool) -> R<Out> {
        let (a, b) = (self.input(n, 0)?, self.input(n, 1)?);
        if a.dtype != DType::Bool || b.dtype != DType::Bool {
            return Err(format!("{} of {} and {} (bool operands only)", n.op_type, a.dtype, b.dtype));
        }
        let k = self.literal(if and { 0.0 } else { 1.0 }, DType::Bool);
        let args = if and { [a, b, k] } else { [a, k, b] };
        self.pointwise(Kind::Where, &args).map(Out::Val)
    }

    /// `x != x`: true exactly at NaN.
    fn is_nan(&mut self, n: &NodeProto) -> R<Out> {
        let x = self.input(n, 0)?;
        self.pointwise(Kind::Binary(Binary::Ne), &[x.clone(), x]).map(Out::Val)
    }

    /// `Clip(x, min, max)`: `min(max(x, lo), hi)`; an absent bound leaves that side open.
    fn clip(&mut self, n: &NodeProto) -> R<Out> {
        let mut x = self.input(n, 0)?;
        if n.input.get(1).is_some_and(|i| !i.is_empty()) {
            let lo = self.input(n, 1)?;
            x = self.pointwise(Kind::Binary(Binary::Max), &[x, lo])?;
        }
        if n.input.get(2).is_some_and(|i| !i.is_empty()) {
            let hi = self.input(n, 2)?;
            x = self.pointwise(Kind::Binary(Binary::Min), &[x, hi])?;
        }
        Ok(Out::Val(x))
    }

    fn where_(&mut self, n: &NodeProto) -> R<Out> {
        let c = self.input(n, 0)?;
        let (a, b) = (self.input(n, 1)?, self.input(n, 2)?);
        self.pointwise(Kind::Where, &[c, a, b]).map(Out::Val)
    }

    fn cast(&mut self, n: &NodeProto) -> R<Out> {
        let to = attrs(n).get("to", attr_type::INT, "an int")?.ok_or("attribute `to` is missing")?.i;
        let to = i32::try_from(to).map_err(|_| format!("attribute to = {to} is not an element type"))?;
        let dtype = dtype_of(to)?;
        // A cast of a constant is a constant, so that shapes computed by casts stay static.
        if let Some(c) =
            n.input.first().and_then(|i| self.consts.get(i)).filter(|_| !self.vals.contains_key(&n.input[0]))
        {
            let data = c.data.iter().map(|&v| dtype.round(v)).collect();
            return Ok(Out::Const(Const { elem: to, shape: c.shape.clone(), data }));
        }
        let x = self.input(n, 0)?;
        if x.dtype == dtype {
            return Ok(Out::Val(x));
        }
        if self.weak(&x) && dtype != DType::Bool {
            let v = self.prog.fact(x.id).konst.ok_or("a weak value without a constant")?;
            return Ok(Out::Val(Val { id: self.prog.num(dtype.round(v)), shape: x.shape, dtype }));
        }
        self.cast_to(&x, dtype).map(Out::Val)
    }

    fn cast_to(&mut self, x: &Val, dtype: DType) -> R<Val> {
        let id = self.exact(x)?;
        let t = self.prog.add(TensorLang::Type(dtype))?;
        let id = self.prog.apply(Kind::Cast, vec![id, t])?;
        Ok(Val { id, shape: x.shape.clone(), dtype })
    }

    /// `ReduceMean`, `ReduceSum`, `ReduceMax`: a chain of one-axis reductions (each keeps its
    /// axis), then a reshape dropping the axes when `keepdims` is 0.
    fn reduce(&mut self, n: &NodeProto, r: Reduce) -> R<Out> {
        let x = self.input(n, 0)?;
        let a = attrs(n);
        let keep = a.int("keepdims", 1)? != 0;
        let noop_when_empty = a.int("noop_with_empty_axes", 0)? != 0;
        let rank = x.shape.len();
        let mut axes = match self.axes(n)? {
            Some(list) if !list.is_empty() => list.iter().map(|&ax| norm_axis(ax, rank)).collect::<R<Vec<usize>>>()?,
            _ if noop_when_empty => return Ok(Out::Val(x)),
            _ => (0..rank).collect(),
        };
        axes.sort_unstable();
        axes.dedup();
        let mut acc = Val { id: self.exact(&x)?, ..x.clone() };
        for &ax in &axes {
            let axis = self.prog.num(axis_literal(ax, rank));
            let id = self.prog.apply(Kind::Reduce(r), vec![acc.id, axis])?;
            acc.shape[ax] = 1;
            acc.id = id;
        }
        if !keep {
            let shape = acc.shape.iter().enumerate().filter(|(i, _)| !axes.contains(i)).map(|(_, &d)| d).collect();
            acc = self.reshape(&acc, shape)?;
        }
        Ok(Out::Val(acc))
    }

    fn softmax(&mut self, n: &NodeProto, c: Composite) -> R<Out> {
        let x = self.input(n, 0)?;
        let rank = x.shape.len();
        let axis = norm_axis(attrs(n).int("axis", -1)?, rank)?;
        let id = self.exact(&x)?;
        let axis = self.prog.num(axis_literal(axis, rank));
        let id = self.prog.apply(Kind::Composite(c), vec![id, axis])?;
        Ok(Out::Val(Val { id, ..x }))
    }

    /// `LayerNormalization` over the axes from `axis` on; several trailing axes are flattened
    /// into one, since eqfuse's `layernorm` normalises the last axis.
    fn layer_norm(&mut self, n: &NodeProto) -> R<Out> {
        let x = self.input(n, 0)?;
        let scale = self.input(n, 1)?;
        let bias = self.opt_input(n, 2)?;
        let a = attrs(n);
        let rank = x.shape.len();
        let axis = norm_axis(a.int("axis", -1)?, rank)?;
        let eps = a.float("epsilon", 1e-5)?;
        let row: usize = x.shape[axis..].iter().product();
        let flat: Vec<usize> = x.shape[..axis].iter().copied().chain([row]).collect();
        let x2 = self.reshape(&x, flat)?;
        let g = self.norm_param(&scale, &x.shape[axis..], row)?;
        let b = match bias {
            Some(b) => self.norm_param(&b, &x.shape[axis..], row)?,
            None => {
                let zero = self.literal(0.0, x.dtype);
                self.exact(&zero)?
            }
        };
        let eps = self.prog.num(eps);
        let id = self.prog.apply(Kind::Composite(Composite::LayerNorm), vec![x2.id, g, b, eps])?;
        let y = Val { id, shape: x2.shape, dtype: x.dtype };
        self.reshape(&y, x.shape).map(Out::Val)
    }

    /// A scale or bias of a layer norm over `tail` (flattened to `row`): broadcast to `tail`,
    /// then flattened, unless it already broadcasts along the one normalised axis.
    fn norm_param(&mut self, p: &Val, tail: &[usize], row: usize) -> R<Id> {
        if tail.len() == 1 || p.shape == [row] {
            return self.exact(p);
        }
        let full = broadcast_shapes(&p.shape, tail)?;
        if full != tail {
            return Err(format!("a scale or bias of shape {:?} does not broadcast to {tail:?}", p.shape));
        }
        let full = self.broadcast(p, full)?;
        Ok(self.reshape(&full, vec![row])?.id)
    }

    /// `MatMul` with NumPy's rules: a 1-D operand gains an axis for the product and loses it after.
    fn matmul(&mut self, n: &NodeProto) -> R<Out> {
        let (a, b) = (self.input(n, 0)?, self.input(n, 1)?);
        if a.shape.is_empty() || b.shape.is_empty() {
            return Err("MatMul does not take scalars".to_string());
        }
        let (a_vec, b_vec) = (a.shape.len() == 1, b.shape.len() == 1);
        let a2 = if a_vec { self.reshape(&a, vec![1, a.shape[0]])? } else { a };
        let b2 = if b_vec { self.reshape(&b, vec![b.shape[0], 1])? } else { b };
        let y = self.product(&a2, &b2)?;
        let mut shape = y.shape.clone();
        if b_vec {
            shape.pop();
        }
        if a_vec {
            shape.remove(shape.len() - if b_vec { 1 } else { 2 });
        }
        self.reshape(&y, shape).map(Out::Val)
    }

    fn product(&mut self, a: &Val, b: &Val) -> R<Val> {
        let (ia, ib) = (self.exact(a)?, self.exact(b)?);
        let id = self.prog.apply(Kind::MatMul, vec![ia, ib])?;
        let shape = self.prog.ty(id).map(|t| t.shape.clone()).ok_or("a product without a type")?;
        Ok(Val { id, shape, dtype: a.dtype })
    }

    /// `Gemm`: `alpha * op(A) @ op(B) + beta * C`, multiplications by 1 left out.
    fn gemm(&mut self, n: &NodeProto) -> R<Out> {
        let (a, b) = (self.input(n, 0)?, self.input(n, 1)?);
        let c = self.opt_input(n, 2)?;
        let at = attrs(n);
        let (alpha, beta) = (at.float("alpha", 1.0)?, at.float("beta", 1.0)?);
        if a.shape.len() != 2 || b.shape.len() != 2 {
            return Err(format!("Gemm needs matrices, got shapes {:?} and {:?}", a.shape, b.shape));
        }
        let a = if at.int("transA", 0)? != 0 { self.swap(&a, 0, 1)? } else { a };
        let b = if at.int("transB", 0)? != 0 { self.swap(&b, 0, 1)? } else { b };
        let mut y = self.product(&a, &b)?;
        if alpha != 1.0 {
            let k = self.literal(alpha, y.dtype);
            y = self.pointwise(Kind::Binary(Binary::Mul), &[y, k])?;
        }
        if let Some(c) = c.filter(|_| beta != 0.0) {
            let c = if beta != 1.0 {
                let k = self.literal(beta, c.dtype);
                self.pointwise(Kind::Binary(Binary::Mul), &[c, k])?
            } else {
                c
            };
            y = self.pointwise(Kind::Binary(Binary::Add), &[y, c])?;
        }
        Ok(Out::Val(y))
    }

    /// `Reshape` to a constant shape: `0` copies the input's size (unless `allowzero`), `-1`
    /// is inferred.
    fn reshape_op(&mut self, n: &NodeProto) -> R<Out> {
        let x = self.input(n, 0)?;
        let spec = self.const_input(n, 1)?.ok_or("input 1 (the shape) is missing")?.ints()?;
        let allow_zero = attrs(n).int("allowzero", 0)? != 0;
        let shape = reshape_target(&x.shape, &spec, allow_zero)?;
        self.reshape(&x, shape).map(Out::Val)
    }

    /// `Transpose` by a general permutation, as a sequence of axis swaps (a selection sort).
    fn transpose_op(&mut self, n: &NodeProto) -> R<Out> {
        let x = self.input(n, 0)?;
        let rank = x.shape.len();
        let perm = match attrs(n).ints("perm")? {
            Some(p) => p.iter().map(|&a| norm_axis(a, rank)).collect::<R<Vec<usize>>>()?,
            None => (0..rank).rev().collect(),
        };
        let mut seen = vec![false; rank];
        if perm.len() != rank || perm.iter().any(|&a| std::mem::replace(&mut seen[a], true)) {
            return Err(format!("perm {perm:?} is not a permutation of {rank} axes"));
        }
        self.permute(&x, &perm).map(Out::Val)
    }

    /// `x` with its axes in the order `perm` (a permutation), as axis swaps.
    fn permute(&mut self, x: &Val, perm: &[usize]) -> R<Val> {
        let mut order: Vec<usize> = (0..x.shape.len()).collect();
        let mut y = x.clone();
        for (i, &want) in perm.iter().enumerate() {
            let j = order.iter().position(|&a| a == want).ok_or("not a permutation")?;
            if j != i {
                y = self.swap(&y, i, j)?;
                order.swap(i, j);
            }
        }
        Ok(y)
    }

    /// `0, 1, ..., shape[d] - 1` along axis `d` of a tensor of rank `shape.len()` (size 1 on
    /// the other axes, to broadcast): the coordinate of each element along that axis.
    fn coordinate(&mut self, shape: &[usize], d: usize) -> R<Val> {
        let size = self.prog.num(shape[d] as f64);
        let id = self.prog.apply(Kind::Iota, vec![size])?;
        let v = Val { id, shape: vec![shape[d]], dtype: DType::I32 };
        let mut ones = vec![1; shape.len()];
        ones[d] = shape[d];
        self.reshape(&v, ones)
    }

    /// An index into an axis of `size` elements with a negative index counted from the end:
    /// `where(i < 0, i + size, i)`.
    fn wrapped(&mut self, idx: &Val, size: usize) -> R<Val> {
        let zero = self.literal(0.0, DType::I32);
        let neg = self.pointwise(Kind::Binary(Binary::Lt), &[idx.clone(), zero])?;
        let n = self.literal(size as f64, DType::I32);
        let up = self.pointwise(Kind::Binary(Binary::Add), &[idx.clone(), n])?;
        self.pointwise(Kind::Where, &[neg, up, idx.clone()])
    }

    /// `acc + i * stride` (integers), or `i * stride` when there is no `acc` yet.
    fn add_scaled(&mut self, acc: Option<Val>, i: Val, stride: usize) -> R<Val> {
        let term = if stride == 1 {
            i
        } else {
            let k = self.literal(stride as f64, DType::I32);
            self.pointwise(Kind::Binary(Binary::Mul), &[i, k])?
        };
        match acc {
            Some(a) => self.pointwise(Kind::Binary(Binary::Add), &[a, term]),
            None => Ok(term),
        }
    }

    /// The data and index inputs of a gather-like node: integer indices, and data whose
    /// element count fits the i32 positions the lowering computes.
    fn gather_operands(&mut self, n: &NodeProto) -> R<(Val, Val)> {
        let (x, idx) = (self.input(n, 0)?, self.input(n, 1)?);
        if idx.dtype != DType::I32 {
            return Err(format!("input 1 (the indices) must be integers, got {}", idx.dtype));
        }
        if x.shape.iter().product::<usize>() > i32::MAX as usize {
            return Err(format!("the data of shape {:?} has more elements than i32 positions reach", x.shape));
        }
        Ok((x, idx))
    }

    /// `GatherElements(data, indices, axis)` (`torch.gather`): the element of `data` at each
    /// position of `indices`, with the index along `axis`. One `gather` of the flattened data at
    /// linear positions `sum_d coordinate_d * stride_d`, the coordinate along `axis` being the
    /// (wrapped) index and the others `iota`s.
    fn gather_elements(&mut self, n: &NodeProto) -> R<Out> {
        let (x, idx) = self.gather_operands(n)?;
        let rank = x.shape.len();
        if rank == 0 || idx.shape.len() != rank {
            return Err(format!(
                "the indices (shape {:?}) must have the data's rank (shape {:?}), 1 or more",
                idx.shape, x.shape
            ));
        }
        let axis = norm_axis(attrs(n).int("axis", 0)?, rank)?;
        if let Some(d) = (0..rank).find(|&d| d != axis && idx.shape[d] > x.shape[d]) {
            return Err(format!(
                "the indices' axis {d} has {} elements, more than the data's {}",
                idx.shape[d], x.shape[d]
            ));
        }
        let mut pos = None;
        for d in 0..rank {
            let stride: usize = x.shape[d + 1..].iter().product();
            let coord = if d == axis { self.wrapped(&idx, x.shape[d])? } else { self.coordinate(&idx.shape, d)? };
            pos = Some(self.add_scaled(pos, coord, stride)?);
        }
        let pos = pos.ok_or("no axes")?;
        let pos = self.broadcast(&pos, idx.shape.clone())?;
        let flat = self.reshape(&x, vec![x.shape.iter().product()])?;
        self.take(&flat, &pos, 0).map(Out::Val)
    }

    /// `GatherND(data, indices, batch_dims = 0)`: the slice of `data` at each index tuple of
    /// the indices' last axis (of length `k`). One `gather` along the first axis of `data`
    /// with its first `k` axes flattened, at linear positions computed from the tuples.
    /// `batch_dims` other than 0 is refused.
    fn gather_nd(&mut self, n: &NodeProto) -> R<Out> {
        let batch = attrs(n).int("batch_dims", 0)?;
        if batch != 0 {
            return Err(format!("batch_dims = {batch} is not supported (0 is)"));
        }
        let (x, idx) = self.gather_operands(n)?;
        let k = *idx.shape.last().ok_or("the indices are a scalar; GatherND needs rank 1 or more")?;
        if k == 0 || k > x.shape.len() {
            return Err(format!(
                "index tuples of length {k} do not index data of rank {} (1 to its rank)",
                x.shape.len()
            ));
        }
        let lead = &idx.shape[..idx.shape.len() - 1];
        let last = idx.shape.len() - 1;
        let mut pos = None;
        for j in 0..k {
            let part = self.slice_val(&idx, last, j as i64, j as i64 + 1, 1)?;
            let part = self.reshape_any(&part, lead.to_vec())?;
            let coord = self.wrapped(&part, x.shape[j])?;
            pos = Some(self.add_scaled(pos, coord, x.shape[j + 1..k].iter().product())?);
        }
        let pos = pos.ok_or("no index axes")?;
        let mut flat = vec![x.shape[..k].iter().product()];
        flat.extend_from_slice(&x.shape[k..]);
        let data = self.reshape(&x, flat)?;
        self.take(&data, &pos, 0).map(Out::Val)
    }

    /// `gather(x, idx, axis)`.
    fn take(&mut self, x: &Val, idx: &Val, axis: usize) -> R<Val> {
        let (xi, ii) = (self.exact(x)?, self.exact(idx)?);
        let rank = x.shape.len();
        let a = self.prog.num(axis_literal(axis, rank));
        let id = self.prog.apply(Kind::Gather, vec![xi, ii, a])?;
        let mut shape = x.shape[..axis].to_vec();
        shape.extend_from_slice(&idx.shape);
        shape.extend_from_slice(&x.shape[axis + 1..]);
        Ok(Val { id, shape, dtype: x.dtype })
    }

    /// `v` reshaped to `shape`, which may be a scalar (`[]`).
    fn reshape_any(&mut self, v: &Val, shape: Vec<usize>) -> R<Val> {
        if v.shape == shape {
            return Ok(v.clone());
        }
        let id = self.exact(v)?;
        let dims = self.prog.add(TensorLang::Dims(Dims(shape.clone())))?;
        let id = self.prog.apply(Kind::Reshape, vec![id, dims])?;
        Ok(Val { id, shape, dtype: v.dtype })
    }

    /// `Conv` in the one form a patch embedding (ViT) uses: 2-D, the stride equal to the kernel,
    /// no padding, no dilation, one group. The image's patches as rows (`[B, N, C*kh*kw]`, a
    /// reshape and a transpose) times the flattened weight, plus the bias, back to
    /// `[B, O, H/kh, W/kw]`. Any other convolution is refused, naming why.
    fn conv(&mut self, n: &NodeProto) -> R<Out> {
        let (x, w) = (self.input(n, 0)?, self.input(n, 1)?);
        let bias = self.opt_input(n, 2)?;
        let general = "general convolution is not supported; only a patch embedding (2-D, strides equal to \
                       the kernel, no padding, no dilation, group 1) is";
        if x.shape.len() != 4 || w.shape.len() != 4 {
            return Err(format!(
                "input shapes {:?} and weight {:?} are not a 2-D convolution's; {general}",
                x.shape, w.shape
            ));
        }
        let a = attrs(n);
        let (kh, kw) = (w.shape[2], w.shape[3]);
        if let Some(ks) = a.ints("kernel_shape")? {
            if ks != [kh as i64, kw as i64] {
                return Err(format!("kernel_shape {ks:?} disagrees with the weight's {:?}", &w.shape[2..]));
            }
        }
        let group = a.int("group", 1)?;
        if group != 1 {
            return Err(format!("group = {group}; {general}"));
        }
        let strides = a.ints("strides")?.unwrap_or(vec![1, 1]);
        if strides != [kh as i64, kw as i64] {
            return Err(format!("strides {strides:?} differ from the kernel [{kh}, {kw}]; {general}"));
        }
        if let Some(d) = a.ints("dilations")?.filter(|d| d.iter().any(|&v| v != 1)) {
            return Err(format!("dilations {d:?}; {general}"));
        }
        if let Some(p) = a.ints("pads")?.filter(|p| p.iter().any(|&v| v != 0)) {
            return Err(format!("pads {p:?}; {general}"));
        }
        let auto_pad = a.string("auto_pad", "NOTSET")?;
        if !matches!(auto_pad.as_str(), "NOTSET" | "VALID") {
            return Err(format!("auto_pad = {auto_pad}; {general}"));
        }
        let [b, c, h, wd] = [x.shape[0], x.shape[1], x.shape[2], x.shape[3]];
        let o = w.shape[0];
        if w.shape[1] != c {
            return Err(format!("the weight takes {} channels, the input has {c}", w.shape[1]));
        }
        let (hp, wp) = (h / kh, wd / kw);
        if hp == 0 || wp == 0 {
            return Err(format!("the kernel [{kh}, {kw}] is larger than the image [{h}, {wd}]"));
        }
        // Rows and columns past the last whole patch are not read.
        let x = self.slice_val(&x, 2, 0, (hp * kh) as i64, 1)?;
        let x = self.slice_val(&x, 3, 0, (wp * kw) as i64, 1)?;
        let x = self.reshape(&x, vec![b, c, hp, kh, wp, kw])?;
        let x = self.permute(&x, &[0, 2, 4, 1, 3, 5])?;
        let patches = self.reshape(&x, vec![b, hp * wp, c * kh * kw])?;
        let wm = self.reshape(&w, vec![o, c * kh * kw])?;
        let wm = self.swap(&wm, 0, 1)?;
        let mut y = self.product(&patches, &wm)?;
        if let Some(bias) = bias {
            if bias.shape != [o] {
                return Err(format!("the bias has shape {:?}, not [{o}]", bias.shape));
            }
            y = self.pointwise(Kind::Binary(Binary::Add), &[y, bias])?;
        }
        let y = self.swap(&y, 1, 2)?;
        self.reshape(&y, vec![b, o, hp, wp]).map(Out::Val)
    }

    /// `Expand`: broadcasting both ways, to the broadcast of the input's shape and the given one.
    fn expand(&mut self, n: &NodeProto) -> R<Out> {
        let x = self.input(n, 0)?;
        let spec = self.const_input(n, 1)?.ok_or("input 1 (the shape) is missing")?.ints()?;
        let spec = spec
            .iter()
            .map(|&d| usize::try_from(d).map_err(|_| format!("size {d} is negative")))
            .collect::<R<Vec<_>>>()?;
        let shape = broadcast_shapes(&x.shape, &spec)?;
        self.broadcast(&x, shape).map(Out::Val)
    }

    fn unsqueeze(&mut self, n: &NodeProto) -> R<Out> {
        let x = self.input(n, 0)?;
        let axes = self.axes(n)?.ok_or("the axes are missing")?;
        let rank = x.shape.len() + axes.len();
        let mut axes = axes.iter().map(|&a| norm_axis(a, rank)).collect::<R<Vec<usize>>>()?;
        axes.sort_unstable();
        if axes.windows(2).any(|w| w[0] == w[1]) {
            return Err(format!("axes {axes:?} repeat an axis"));
        }
        let mut sizes = x.shape.iter().copied();
        let shape = (0..rank).map(|i| if axes.contains(&i) { 1 } else { sizes.next().unwrap_or(1) }).collect();
        self.reshape(&x, shape).map(Out::Val)
    }

    fn squeeze(&mut self, n: &NodeProto) -> R<Out> {
        let x = self.input(n, 0)?;
        let rank = x.shape.len();
        let axes: Vec<usize> = match self.axes(n)? {
            Some(list) => list.iter().map(|&a| norm_axis(a, rank)).collect::<R<_>>()?,
            None => (0..rank).filter(|&i| x.shape[i] == 1).collect(),
        };
        if let Some(&a) = axes.iter().find(|&&a| x.shape[a] != 1) {
            return Err(format!("axis {a} has size {}, not 1", x.shape[a]));
        }
        let shape = x.shape.iter().enumerate().filter(|(i, _)| !axes.contains(i)).map(|(_, &d)| d).collect();
        self.reshape(&x, shape).map(Out::Val)
    }

    /// `Shape(x, start, end)`: the sizes of `x` (all static), a constant.
    fn shape_op(&mut self, n: &NodeProto) -> R<Out> {
        let name = n.input.first().filter(|s| !s.is_empty()).ok_or("input 0 is missing")?;
        let shape = match (self.vals.get(name), self.consts.get(name)) {
            (Some(v), _) => v.shape.clone(),
            (None, Some(c)) => c.shape.clone(),
            _ => return Err(super::undefined(name)),
        };
        let rank = shape.len() as i64;
        let a = attrs(n);
        let clamp = |v: i64| if v < 0 { (v + rank).max(0) } else { v.min(rank) } as usize;
        let (start, end) = (clamp(a.int("start", 0)?), clamp(a.int("end", rank)?));
        let sizes: Vec<f64> = shape[start..end.max(start)].iter().map(|&d| d as f64).collect();
        Ok(Out::Const(Const { elem: dt::INT64, shape: vec![sizes.len()], data: sizes }))
    }

    /// `ConstantOfShape(shape, value)`: a constant of the given (constant) shape filled with
    /// `value` (a one-element tensor; float 0 when absent). A large one is a broadcast literal
    /// instead of a constant held element by element.
    fn constant_of_shape(&mut self, n: &NodeProto) -> R<Out> {
        let spec = self.const_input(n, 0)?.ok_or("input 0 (the shape) is missing")?.ints()?;
        let spec = spec.iter().map(|&d| if d < 0 { -1 } else { d }).collect::<Vec<i64>>();
        let shape = data::shape_of(&spec)?;
        let value = match attrs(n).get("value", attr_type::TENSOR, "a tensor")? {
            Some(a) => data::decode(a.t.as_ref().ok_or("attribute `value` holds no tensor")?, None)?,
            None => Const { elem: dt::FLOAT, shape: vec![1], data: vec![0.0] },
        };
        if value.numel() != 1 {
            return Err(format!("attribute `value` has {} elements, not one", value.numel()));
        }
        let numel: usize = shape.iter().product();
        if numel <= 1 << 16 {
            return Ok(Out::Const(Const { elem: value.elem, shape, data: vec![value.data[0]; numel] }));
        }
        let one = Const { shape: vec![], ..value };
        let v = self.materialize("value", &one)?;
        self.broadcast(&v, shape).map(Out::Val)
    }

    /// `Flatten(x, axis)`: a reshape to `[prod(shape[..axis]), prod(shape[axis..])]`.
    fn flatten(&mut self, n: &NodeProto) -> R<Out> {
        let x = self.input(n, 0)?;
        let rank = x.shape.len() as i64;
        let axis = attrs(n).int("axis", 1)?;
        if axis < -rank || axis > rank {
            return Err(format!("axis {axis} is outside [-{rank}, {rank}]"));
        }
        let axis = if axis < 0 { axis + rank } else { axis } as usize;
        let shape = vec![x.shape[..axis].iter().product(), x.shape[axis..].iter().product()];
        self.reshape(&x, shape).map(Out::Val)
    }

    /// `Constant`: its value from whichever `value*` attribute it has.
    fn constant(&mut self, n: &NodeProto) -> R<Out> {
        let attr = n.attribute.first().filter(|_| n.attribute.len() == 1).ok_or("needs exactly one value attribute")?;
        let (ty, what) = match attr.name.as_str() {
            "value" => (attr_type::TENSOR, "a tensor"),
            "value_float" => (attr_type::FLOAT, "a float"),
            "value_floats" => (attr_type::FLOATS, "a list of floats"),
            "value_int" => (attr_type::INT, "an int"),
            "value_ints" => (attr_type::INTS, "a list of ints"),
            other => {
                return Err(format!("attribute `{other}` is not supported (value, value_float(s), value_int(s) are)"))
            }
        };
        let attr = Attrs(&n.attribute).get(&attr.name, ty, what)?.ok_or("the value attribute is missing")?;
        let c = match attr.name.as_str() {
            "value" => {
                data::decode(attr.t.as_ref().ok_or("attribute `value` holds no tensor")?, self.folder.as_deref())?
            }
            "value_float" => Const { elem: dt::FLOAT, shape: vec![], data: vec![attr.f as f64] },
            "value_floats" => Const { elem: dt::FLOAT, shape: vec![attr.floats.len()], data: floats(&attr.floats) },
            "value_int" => Const { elem: dt::INT64, shape: vec![], data: vec![attr.i as f64] },
            _ => Const {
                elem: dt::INT64,
                shape: vec![attr.ints.len()],
                data: attr.ints.iter().map(|&v| v as f64).collect(),
            },
        };
        Ok(Out::Const(c))
    }

    /// `Gather(data, indices, axis)`: `gather`; a constant index of one element is a slice
    /// (reshaped when the index is a scalar), so that it stays a literal bound.
    fn gather(&mut self, n: &NodeProto) -> R<Out> {
        let x = self.input(n, 0)?;
        let rank = x.shape.len();
        if rank == 0 {
            return Err("input 0 (the data) is a scalar; Gather needs rank 1 or more".into());
        }
        let axis = norm_axis(attrs(n).int("axis", 0)?, rank)?;
        let size = x.shape[axis] as i64;
        if let Some(c) = self.const_input(n, 1).ok().flatten() {
            if c.numel() == 1 {
                let (shape, k) = (c.shape.clone(), c.ints()?[0]);
                if k < -size || k >= size {
                    return Err(format!("index {k} is out of range for an axis of {size} elements"));
                }
                let k = if k < 0 { k + size } else { k };
                let y = self.slice_val(&x, axis, k, k + 1, 1)?;
                let mut out = x.shape[..axis].to_vec();
                out.extend_from_slice(&shape);
                out.extend_from_slice(&x.shape[axis + 1..]);
                return self.reshape(&y, out).map(Out::Val);
            }
        }
        let idx = self.input(n, 1)?;
        if idx.dtype != DType::I32 {
            return Err(format!("input 1 (the indices) must be integers, got {}", idx.dtype));
        }
        let (xi, ii) = (self.exact(&x)?, self.exact(&idx)?);
        let a = self.prog.num(axis_literal(axis, rank));
        let id = self.prog.apply(Kind::Gather, vec![xi, ii, a])?;
        let mut shape = x.shape[..axis].to_vec();
        shape.extend_from_slice(&idx.shape);
        shape.extend_from_slice(&x.shape[axis + 1..]);
        Ok(Out::Val(Val { id, shape, dtype: x.dtype }))
    }

    /// `slice(v, axis, start, stop, step)` with bounds clamped to the axis (ONNX writes "to the
    /// end" as the largest int64).
    fn slice_val(&mut self, v: &Val, axis: usize, start: i64, stop: i64, step: i64) -> R<Val> {
        let size = v.shape[axis] as i64;
        let (start, stop) = (start.clamp(-size, size), stop.clamp(-size - 1, size));
        let (first, len) = crate::ir::infer::slice_range(v.shape[axis], start, stop, step)?;
        if first == 0 && len == v.shape[axis] && step == 1 {
            return Ok(v.clone());
        }
        let id = self.exact(v)?;
        let rank = v.shape.len();
        let args = [axis_literal(axis, rank), start as f64, stop as f64, step as f64].map(|x| self.prog.num(x));
        let id = self.prog.apply(Kind::Slice, vec![id, args[0], args[1], args[2], args[3]])?;
        let mut shape = v.shape.clone();
        shape[axis] = len;
        Ok(Val { id, shape, dtype: v.dtype })
    }

    /// `Slice(data, starts, ends, axes, steps)` (constants; the attribute form of opset 1 too):
    /// one slice per axis. Negative steps are refused.
    fn slice_op(&mut self, n: &NodeProto) -> R<Out> {
        let x = self.input(n, 0)?;
        let rank = x.shape.len();
        let list = |im: &Self, k: usize, attr: &str| -> R<Option<Vec<i64>>> {
            match im.const_input(n, k)? {
                Some(c) => Ok(Some(c.ints().map_err(|m| format!("input {k}: {m}"))?)),
                None => attrs(n).ints(attr),
            }
        };
        let starts = list(self, 1, "starts")?.ok_or("the starts are missing")?;
        let ends = list(self, 2, "ends")?.ok_or("the ends are missing")?;
        let axes = list(self, 3, "axes")?.unwrap_or_else(|| (0..starts.len() as i64).collect());
        let steps = match self.const_input(n, 4)? {
            Some(c) => c.ints()?,
            None => vec![1; starts.len()],
        };
        if [ends.len(), axes.len(), steps.len()].iter().any(|&l| l != starts.len()) {
            return Err("starts, ends, axes and steps must have one length".into());
        }
        let mut y = x;
        for i in 0..starts.len() {
            if steps[i] < 1 {
                return Err(format!("step {} is not supported (steps of 1 or more are)", steps[i]));
            }
            let axis = norm_axis(axes[i], rank)?;
            y = self.slice_val(&y, axis, starts[i], ends[i], steps[i])?;
        }
        Ok(Out::Val(y))
    }

    /// `Concat(inputs..., axis)`: nested binary `concat`s, left to right.
    fn concat(&mut self, n: &NodeProto) -> R<Out> {
        let present = n.input.iter().filter(|i| !i.is_empty()).count();
        let mut y = self.input(n, 0)?;
        let rank = y.shape.len();
        if rank == 0 {
            return Err("input 0 is a scalar; Concat needs rank 1 or more".into());
        }
        let axis =
            norm_axis(attrs(n).int("axis", i64::MIN).map(|a| if a == i64::MIN { rank as i64 } else { a })?, rank)
                .map_err(|e| format!("attribute `axis` (required): {e}"))?;
        for k in 1..present {
            let b = self.input(n, k)?;
            let (ai, bi) = (self.exact(&y)?, self.exact(&b)?);
            let a = self.prog.num(axis_literal(axis, rank));
            let id = self.prog.apply(Kind::Concat, vec![ai, bi, a]).map_err(|m| format!("input {k}: {m}"))?;
            let mut shape = y.shape.clone();
            shape[axis] += b.shape.get(axis).copied().unwrap_or(0);
            y = Val { id, shape, dtype: y.dtype };
        }
        Ok(Out::Val(y))
    }

    /// `Split(input, split, axis)`: one slice per output; without sizes, equal parts (the last
    /// smaller when the size does not divide, as opset 18 says).
    fn split(&mut self, n: &NodeProto) -> R<Out> {
        let x = self.input(n, 0)?;
        let rank = x.shape.len();
        if rank == 0 {
            return Err("input 0 is a scalar; Split needs rank 1 or more".into());
        }
        let axis = norm_axis(attrs(n).int("axis", 0)?, rank)?;
        let size = x.shape[axis] as i64;
        let outputs = n.output.len();
        let sizes = match self.const_input(n, 1)? {
            Some(c) => Some(c.ints()?),
            None => attrs(n).ints("split")?,
        };
        let sizes = match sizes {
            Some(s) => s,
            None => {
                let part = (size + outputs as i64 - 1) / outputs.max(1) as i64;
                (0..outputs as i64).map(|i| part.min(size - i * part)).collect()
            }
        };
        if sizes.len() != outputs || sizes.iter().any(|&s| s < 1) || sizes.iter().sum::<i64>() != size {
            return Err(format!(
                "split sizes {sizes:?} must be {outputs} positive sizes adding up to the axis' {size} elements"
            ));
        }
        let mut parts = Vec::with_capacity(outputs);
        let mut start = 0;
        for s in sizes {
            parts.push(self.slice_val(&x, axis, start, start + s, 1)?);
            start += s;
        }
        Ok(Out::Many(parts))
    }

    /// `v` with another shape of the same size (no node when the shape is already right).
    fn reshape(&mut self, v: &Val, shape: Vec<usize>) -> R<Val> {
        data::nonempty(&shape)?;
        if v.shape == shape {
            return Ok(v.clone());
        }
        let id = self.exact(v)?;
        let dims = self.prog.add(TensorLang::Dims(Dims(shape.clone())))?;
        let id = self.prog.apply(Kind::Reshape, vec![id, dims])?;
        Ok(Val { id, shape, dtype: v.dtype })
    }

    /// `v` broadcast to `shape` (no node when the shape is already right).
    fn broadcast(&mut self, v: &Val, shape: Vec<usize>) -> R<Val> {
        data::nonempty(&shape)?;
        if v.shape == shape {
            return Ok(v.clone());
        }
        let id = self.exact(v)?;
        let dims = self.prog.add(TensorLang::Dims(Dims(shape.clone())))?;
        let id = self.prog.apply(Kind::Broadcast, vec![id, dims])?;
        Ok(Val { id, shape, dtype: v.dtype })
    }

    /// `v` with axes `a` and `b` swapped.
    fn swap(&mut self, v: &Val, a: usize, b: usize) -> R<Val> {
        let id = self.exact(v)?;
        let rank = v.shape.len();
        let (na, nb) = (self.prog.num(axis_literal(a, rank)), self.prog.num(axis_literal(b, rank)));
        let id = self.prog.apply(Kind::Transpose, vec![id, na, nb])?;
        let mut shape = v.shape.clone();
        shape.swap(a, b);
        Ok(Val { id, shape, dtype: v.dtype })
    }
}

fn floats(v: &[f32]) -> Vec<f64> {
    v.iter().map(|&x| x as f64).collect()
}

/// The shape `Reshape` gives `input` for the spec `spec` (ONNX's `0` and `-1` rules).
fn reshape_target(input: &[usize], spec: &[i64], allow_zero: bool) -> R<Vec<usize>> {
    let mut shape = Vec::with_capacity(spec.len());
    let mut infer_at = None;
    for (i, &d) in spec.iter().enumerate() {
        let size = match d {
            -1 if infer_at.is_some() => return Err(format!("shape {spec:?} has more than one -1")),
            -1 => {
                infer_at = Some(i);
                1
            }
            0 if !allow_zero => {
                *input.get(i).ok_or_else(|| format!("shape {spec:?} copies axis {i}, which the input lacks"))?
            }
            d if d > 0 => d as usize,
            d => return Err(format!("size {d} in shape {spec:?} is not allowed")),
        };
        shape.push(size);
    }
    let total: usize = input.iter().product();
    let known = shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d)).unwrap_or(usize::MAX);
    if let Some(i) = infer_at {
        if known == 0 || !total.is_multiple_of(known) {
            return Err(format!("cannot reshape {input:?} to {spec:?}"));
        }
        shape[i] = total / known;
    } else if known != total {
        return Err(format!("cannot reshape {input:?} ({total} elements) to {spec:?}"));
    }
    Ok(shape)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operator_names_are_unique() {
        let mut names = supported_onnx_ops();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), OPS.len());
    }

    #[test]
    fn reshape_rules() {
        assert_eq!(reshape_target(&[2, 3, 4], &[0, -1], false).unwrap(), vec![2, 12]);
        assert_eq!(reshape_target(&[2, 3, 4], &[-1], false).unwrap(), vec![24]);
        assert_eq!(reshape_target(&[1], &[], false).unwrap(), Vec::<usize>::new());
        assert!(reshape_target(&[2, 3], &[-1, -1], false).is_err());
        assert!(reshape_target(&[2, 3], &[4, -1], false).is_err());
        assert!(reshape_target(&[2, 3], &[0, 0, 0], false).is_err());
    }
}
