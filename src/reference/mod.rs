//! The CPU reference interpreter: the oracle for every rule, every plan and every GPU result.
//!
//! It evaluates a [`Program`] on concrete [`Tensor`]s in f64 and rounds each node's result to
//! the dtype its fact declares, so an f32 program sees f32 values between ops while each op is
//! computed without intermediate rounding (a composite op, like softmax, is one op).
//! Invariants: pointwise semantics come only from [`crate::scalars`]; results are a pure
//! function of the program and the inputs (no thread-order dependence: parallel loops split
//! only over independent output rows); bad inputs give an [`Error`], never a panic.
//!
//! Weak scalar literals (`x * 0.1`) keep their exact f64 value until they meet a typed tensor;
//! an output that is itself a weak literal is rounded to f32.

pub mod check;
pub mod npy;
pub mod rng;
pub mod run_cpu;

use std::collections::HashMap;

use egg::{Id, Language};
use rayon::prelude::*;

use crate::error::{Error, Result};
use crate::ir::infer::{dropout_seed, norm_axis, slice_range};
use crate::ir::lang::{AttnArg, Binary, Composite, Kind, Reduce, TensorLang, Unary};
use crate::ir::program::Program;
use crate::ir::scalar::{binary, unary, wrap_i32};
use crate::ir::tensor::{broadcast_index_map, broadcast_strides, check_cpu_size, split_axis, Tensor};
use crate::ir::types::{DType, TensorType};

/// Loops over at least this many output elements run on the rayon pool.
const PAR_MIN: usize = 1 << 15;

/// How the reference stores the value of each floating-point node.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Precision {
    /// Rounded to the node's declared dtype, as a device computing one op at a time stores it.
    #[default]
    Declared,
    /// Kept in f64, unrounded: float casts do not round either (integer and bool values still
    /// do, and dropout still multiplies in f32). Two forms of a program that are equal as real
    /// functions agree here to f64 accuracy however differently they round in their dtypes, so
    /// this separates a wrong plan from one that merely rounds differently. The tensors it gives
    /// are the one exception to [`Tensor`]'s invariant: their float values are not rounded.
    F64,
    /// As `Declared`, with each matrix product and sum accumulated in f32 in index order (one
    /// rounding per term, as an f32 fused multiply-add does): what a straightforward f32
    /// evaluation gets, whose error grows with the length of the sums. The GPU check allows a
    /// device result as far from the exact values as this (`run_gpu`).
    F32Sums,
}

/// Evaluates `program` on `inputs` (by input name) and returns its outputs in
/// `program.outputs` order. Only nodes the outputs depend on are computed; intermediates are
/// freed after their last use. Inputs the program does not declare are ignored.
pub fn eval(program: &Program, inputs: &HashMap<String, Tensor>) -> Result<Vec<Tensor>> {
    eval_with(program, inputs, Precision::Declared)
}

/// As [`eval`], storing float values as `precision` says.
pub fn eval_with(program: &Program, inputs: &HashMap<String, Tensor>, precision: Precision) -> Result<Vec<Tensor>> {
    outputs_of(program, run(program, inputs, false, precision, None)?)
}

/// The unrounded ([`Precision::F64`]) outputs, NaN wherever a value depends on a decision that
/// rounding could flip: a comparison of float operands closer together than
/// `near(dtype, k) × max(|a|, |b|)` (the largest magnitude over either operand tensor; `k` the
/// longest product contraction the operands were computed through) gives NaN
/// there, and so does a `where` whose condition is NaN; NaN then spreads through everything
/// computed from it (a product's whole row and column, a sum's whole reduction). A device that
/// computes the same real function in another rounding order may decide those comparisons the
/// other way (a ReLU gradient at a pre-activation a few ulps from 0), and the outputs that
/// depend on them then differ by far more than rounding: the GPU check leaves them out of the
/// comparison and reports how many (`run_gpu`). Some ops drop NaN (`amax`, `max`, integer
/// arithmetic), which only marks fewer values, never more.
pub fn eval_near_decisions(
    program: &Program,
    inputs: &HashMap<String, Tensor>,
    near: &dyn Fn(DType, usize) -> f64,
) -> Result<Vec<Tensor>> {
    outputs_of(program, run(program, inputs, false, Precision::F64, Some(near))?)
}

fn outputs_of(program: &Program, mut values: Vec<Option<Tensor>>) -> Result<Vec<Tensor>> {
    let outputs = &program.outputs;
    (0..outputs.len())
        .map(|k| {
            let id = outputs[k].id;
            let slot = &mut values[usize::from(id)];
            // The same node may be listed under two names: take it only at its last listing.
            let v = if outputs[k + 1..].iter().any(|o| o.id == id) { slot.clone() } else { slot.take() };
            let v = v.ok_or_else(|| internal(program, id, "output has no value"))?;
            Ok(weak_to_f32(program, id, v))
        })
        .collect()
}

/// Evaluates every live node of `program` and returns each node's value, indexed by node id:
/// `None` for attribute leaves (shapes, dtypes) and for nodes no output depends on. Scalar
/// literals are rank-0 f32 tensors holding their exact (unrounded) value.
pub fn eval_all(program: &Program, inputs: &HashMap<String, Tensor>) -> Result<Vec<Option<Tensor>>> {
    run(program, inputs, true, Precision::Declared, None)
}

fn run(
    program: &Program,
    inputs: &HashMap<String, Tensor>,
    keep_all: bool,
    precision: Precision,
    near: Option<&dyn Fn(DType, usize) -> f64>,
) -> Result<Vec<Option<Tensor>>> {
    check_fits(program)?;
    let mut values: Vec<Option<Tensor>> = vec![None; program.len()];
    for input in &program.inputs {
        values[usize::from(input.id)] = Some(check_input(&input.name, &input.ty, inputs, precision)?);
    }
    let live = program.live();
    let last_use = if keep_all { Vec::new() } else { last_uses(program, &live) };
    // With `near`: for each `relu`, `max` and `min` node, 1 where its operands were within
    // `near` of each other (see `mark_near_decisions`); freed with the node's value.
    let mut kinks: HashMap<Id, Tensor> = HashMap::new();
    // With `near`: the longest product contraction each node's value went through.
    let mut depth = vec![0usize; if near.is_some() { program.len() } else { 0 }];
    for (i, &is_live) in live.iter().enumerate() {
        let id = Id::from(i);
        if !is_live || values[i].is_some() {
            continue;
        }
        values[i] = eval_node(program, id, &values, precision)?;
        if let Some(near) = near {
            let node = program.node(id);
            let mut k = node.children().iter().map(|&c| depth[usize::from(c)]).max().unwrap_or(0);
            if let TensorLang::Op(code, ch) = node {
                if code.kind() == Kind::MatMul {
                    k = k.max(program.ty(ch[0]).and_then(|t| t.shape.last().copied()).unwrap_or(0));
                }
            }
            depth[i] = k;
            let near_k = |d: DType| near(d, k);
            mark_near_decisions(program, id, &mut values, &mut kinks, &near_k)?;
        }
        if !keep_all {
            for &c in program.node(id).children() {
                if last_use[usize::from(c)] == i {
                    values[usize::from(c)] = None;
                    kinks.remove(&c);
                }
            }
        }
    }
    Ok(values)
}

/// Refuses, before anything is allocated, a program with an input or a computed tensor the CPU
/// reference cannot hold (`MAX_CPU_ELEMENTS`, 2^31 elements), naming it and its type.
pub fn check_fits(program: &Program) -> Result<()> {
    let src = &program.source;
    for input in &program.inputs {
        check_cpu_size(&format!("{src}: input `{}`", input.name), &input.ty)?;
    }
    for (i, &is_live) in program.live().iter().enumerate() {
        let id = Id::from(i);
        if let (true, Some(ty)) = (is_live, program.ty(id)) {
            let what = match program.name(id) {
                Some(n) => format!("{src}: `{n}` (`{}`)", program.node(id).head()),
                None => format!("{src}: a `{}`", program.node(id).head()),
            };
            check_cpu_size(&what, ty)?;
        }
    }
    Ok(())
}

/// For each node, the last node that reads it; outputs are read "at the end" and never freed.
fn last_uses(program: &Program, live: &[bool]) -> Vec<usize> {
    let mut last = vec![0; program.len()];
    for (i, _) in live.iter().enumerate().filter(|(_, &l)| l) {
        for &c in program.node(Id::from(i)).children() {
            last[usize::from(c)] = i;
        }
    }
    for o in &program.outputs {
        last[usize::from(o.id)] = usize::MAX;
    }
    last
}

/// Finds an input, checks its type against the declaration, and rounds it to its dtype (unless
/// it is a float at [`Precision::F64`]: a kernel of a plan reads unrounded intermediates then).
fn check_input(name: &str, ty: &TensorType, inputs: &HashMap<String, Tensor>, precision: Precision) -> Result<Tensor> {
    let t = inputs.get(name).ok_or_else(|| Error::Invalid(format!("missing input `{name}` ({ty})")))?;
    if t.dtype != ty.dtype || t.shape != ty.shape {
        return Err(Error::Invalid(format!("input `{name}` is {}, but the program declares {ty}", t.ty())));
    }
    if precision == Precision::F64 && ty.dtype.is_float() {
        return Ok(t.clone());
    }
    Tensor::new(t.dtype, t.shape.clone(), t.data.clone()).map_err(|e| Error::Invalid(format!("input `{name}`: {e}")))
}

fn weak_to_f32(program: &Program, id: Id, t: Tensor) -> Tensor {
    if !program.fact(id).weak {
        return t;
    }
    let data = t.data.iter().map(|&v| DType::F32.round(v)).collect();
    Tensor { dtype: DType::F32, shape: t.shape, data }
}

fn internal(program: &Program, id: Id, what: &str) -> Error {
    Error::Invalid(format!("reference: node {id} (`{}`): {what}", program.node(id).head()))
}

/// The value of one node from its children's values.
fn eval_node(program: &Program, id: Id, values: &[Option<Tensor>], precision: Precision) -> Result<Option<Tensor>> {
    match program.node(id) {
        TensorLang::Num(n) => Ok(Some(Tensor { dtype: DType::F32, shape: vec![], data: vec![n.value()] })),
        TensorLang::Dims(_) | TensorLang::Type(_) => Ok(None),
        TensorLang::Var(s) => Err(internal(program, id, &format!("input `{s}` has no value"))),
        TensorLang::Op(code, children) => {
            let ty = program.ty(id).ok_or_else(|| internal(program, id, "operator without a type"))?.clone();
            let unrounded = program.fact(id).weak || (precision == Precision::F64 && ty.dtype.is_float());
            let f32_sums = precision == Precision::F32Sums && ty.dtype.is_float();
            let store = Store { dtype: (!unrounded).then_some(ty.dtype), f32_sums };
            let args = Args { program, id, children, values };
            let data = eval_op(code.kind(), &args, &ty, store).map_err(|e| located(program, id, e))?;
            Ok(Some(Tensor { dtype: ty.dtype, shape: ty.shape, data }))
        }
    }
}

/// See [`eval_near_decisions`]: sets to NaN the values of node `id` that follow a decision
/// within `near` of its threshold. `relu`, `max` and `min` are continuous, so their values are
/// kept, but where their operands were that close (in `kinks`) the value is exactly the
/// threshold on one side and not on the other: `relu(z) > 0` with `z` a few ulps below 0 reads an
/// exact 0 here and may read a small positive value on the device. So a comparison of two equal
/// values is near its threshold unless one of them is such a node's value whose operands were
/// not close.
fn mark_near_decisions(
    program: &Program,
    id: Id,
    values: &mut [Option<Tensor>],
    kinks: &mut HashMap<Id, Tensor>,
    near: &dyn Fn(DType) -> f64,
) -> Result<()> {
    let TensorLang::Op(code, ch) = program.node(id) else { return Ok(()) };
    let Some((shape, dtype)) = values[usize::from(id)].as_ref().map(|t| (t.shape.clone(), t.dtype)) else {
        return Ok(());
    };
    let arg =
        |k: usize| values[usize::from(ch[k])].as_ref().ok_or_else(|| internal(program, id, "argument has no value"));
    let magnitude = |t: &Tensor| t.data.iter().filter(|v| v.is_finite()).fold(0.0f64, |m, v| m.max(v.abs()));
    let close = |a: &Tensor, c: &Tensor| -> Result<Vec<bool>> {
        let rel = [a, c].iter().filter(|t| t.dtype.is_float()).map(|t| near(t.dtype)).fold(0.0, f64::max);
        let delta = rel * magnitude(a).max(magnitude(c));
        let (x, y) = (a.broadcast_data(&shape)?, c.broadcast_data(&shape)?);
        Ok(x.iter().zip(y.iter()).map(|(&x, &y)| x.is_nan() || y.is_nan() || (x - y).abs() <= delta).collect())
    };
    let as_tensor = |m: Vec<bool>| Tensor {
        dtype: DType::F32,
        shape: shape.clone(),
        data: m.into_iter().map(|b| b as u8 as f64).collect(),
    };
    let marked: Vec<bool> = match code.kind() {
        Kind::Unary(Unary::Relu) if dtype.is_float() => {
            let z = arg(0)?;
            let zero = Tensor { dtype: z.dtype, shape: vec![], data: vec![0.0] };
            let k = close(z, &zero)?;
            kinks.insert(id, as_tensor(k));
            return Ok(());
        }
        Kind::Binary(Binary::Max | Binary::Min) if dtype.is_float() => {
            let k = close(arg(0)?, arg(1)?)?;
            kinks.insert(id, as_tensor(k));
            return Ok(());
        }
        Kind::Binary(b) if b.is_comparison() => {
            let (a, c) = (arg(0)?, arg(1)?);
            if !a.dtype.is_float() && !c.dtype.is_float() {
                return Ok(());
            }
            let mut m = close(a, c)?;
            let (x, y) = (a.broadcast_data(&shape)?, c.broadcast_data(&shape)?);
            for c in &ch[..2] {
                if let Some(kink) = kinks.get(c) {
                    let kink = kink.broadcast_data(&shape)?;
                    for i in 0..m.len() {
                        if m[i] && x[i] == y[i] && kink[i] == 0.0 {
                            m[i] = false;
                        }
                    }
                }
            }
            m
        }
        Kind::Where => arg(0)?.broadcast_data(&shape)?.iter().map(|c| c.is_nan()).collect(),
        _ => return Ok(()),
    };
    if let Some(t) = values[usize::from(id)].as_mut() {
        for (v, m) in t.data.iter_mut().zip(marked) {
            if m {
                *v = f64::NAN;
            }
        }
    }
    Ok(())
}

/// Names the op (and its binding, if any) in an error from its evaluation.
fn located(program: &Program, id: Id, e: Error) -> Error {
    match e {
        Error::Invalid(m) => {
            let name = program.name(id).map(|n| format!(" (`{n}`)")).unwrap_or_default();
            Error::Invalid(format!("`{}`{name}: {m}", program.node(id).head()))
        }
        other => other,
    }
}

/// How a node's values are stored: rounded to its dtype, or exact for a weak literal.
#[derive(Clone, Copy)]
struct Store {
    dtype: Option<DType>,
    /// Sums (products, `sum`, `mean`) accumulate in f32 ([`Precision::F32Sums`]).
    f32_sums: bool,
}

impl Store {
    /// Stores the result of arithmetic: i32 wraps (two's complement, as NumPy and CUDA do),
    /// floats round to their dtype.
    fn round(self, v: f64) -> f64 {
        match self.dtype {
            Some(DType::I32) => wrap_i32(v),
            Some(d) => d.round(v),
            None => v,
        }
    }

    /// Stores the result of a conversion: a float beyond i32 saturates (CUDA's conversion).
    fn convert(self, v: f64) -> f64 {
        match self.dtype {
            Some(d) => d.round(v),
            None => v,
        }
    }

    fn round_all(self, mut data: Vec<f64>) -> Vec<f64> {
        if self.dtype.is_some() {
            if data.len() >= PAR_MIN {
                data.par_iter_mut().for_each(|v| *v = self.round(*v));
            } else {
                data.iter_mut().for_each(|v| *v = self.round(*v));
            }
        }
        data
    }
}

/// The children of the op being evaluated, with access to their values and literals.
struct Args<'a> {
    program: &'a Program,
    id: Id,
    children: &'a [Id],
    values: &'a [Option<Tensor>],
}

impl Args<'_> {
    fn tensor(&self, k: usize) -> Result<&Tensor> {
        let c = self.child(k)?;
        self.values[usize::from(c)].as_ref().ok_or_else(|| internal(self.program, self.id, "argument has no value"))
    }

    fn child(&self, k: usize) -> Result<Id> {
        self.children.get(k).copied().ok_or_else(|| internal(self.program, self.id, "too few arguments"))
    }

    fn konst(&self, k: usize) -> Result<f64> {
        let c = self.child(k)?;
        self.program.fact(c).konst.ok_or_else(|| internal(self.program, self.id, "attribute is not a constant"))
    }

    /// The seed of `dropout`: its literal, or the value of its i32 tensor read as a u32.
    fn seed(&self, k: usize) -> Result<u32> {
        let fact = self.program.fact(self.child(k)?);
        match dropout_seed(fact).map_err(Error::Invalid)? {
            Some(seed) => Ok(seed),
            None => {
                let v = self.tensor(k)?.data.first().copied();
                v.map(|v| v as i32 as u32).ok_or_else(|| internal(self.program, self.id, "the seed tensor is empty"))
            }
        }
    }

    fn axis(&self, k: usize, rank: usize) -> Result<usize> {
        norm_axis(self.konst(k)? as i64, rank).map_err(Error::Invalid)
    }

    /// Whether argument `k` is a weak literal (whose value is not yet rounded).
    fn weak(&self, k: usize) -> Result<bool> {
        Ok(self.program.fact(self.child(k)?).weak)
    }
}

/// The values of one op, already in their stored form (see [`Store`]).
fn eval_op(kind: Kind, args: &Args, ty: &TensorType, store: Store) -> Result<Vec<f64>> {
    if ty.numel() == 0 && kind != Kind::Grad {
        return Ok(Vec::new());
    }
    let moved = |data: Vec<f64>| if args.weak(0)? { Ok(store.round_all(data)) } else { Ok(data) };
    match kind {
        // (An i32 square wraps; its f64 product would not be exact.)
        Kind::Unary(Unary::Square) if ty.dtype == DType::I32 => {
            Ok(map1(&args.tensor(0)?.data, |x| binary(Binary::Mul, x, x, true)))
        }
        Kind::Unary(u) => Ok(map1(&args.tensor(0)?.data, |x| store.round(unary(u, x)))),
        Kind::Binary(b) => pointwise2(b, args.tensor(0)?, args.tensor(1)?, ty, store),
        Kind::Reduce(r) => {
            let x = args.tensor(0)?;
            Ok(store.round_all(reduce(r, x, args.axis(1, x.rank())?, store.f32_sums)))
        }
        Kind::Where => select(args.tensor(0)?, args.tensor(1)?, args.tensor(2)?, &ty.shape, store),
        Kind::Cast => Ok(map1(&args.tensor(0)?.data, |x| store.convert(x))),
        Kind::Transpose => {
            let x = args.tensor(0)?;
            moved(x.transpose(args.axis(1, x.rank())?, args.axis(2, x.rank())?)?.data)
        }
        Kind::Reshape => moved(args.tensor(0)?.data.clone()),
        Kind::Broadcast => moved(args.tensor(0)?.broadcast_data(&ty.shape)?.into_owned()),
        Kind::MatMul => Ok(store.round_all(matmul(args.tensor(0)?, args.tensor(1)?, &ty.shape, store.f32_sums))),
        Kind::Iota => Ok((0..ty.numel()).map(|i| i as f64).collect()),
        Kind::OneHot => Ok(onehot(args.tensor(0)?, ty.shape[ty.rank() - 1])),
        Kind::Dropout => Ok(rng::dropout(&args.tensor(0)?.data, ty.dtype, args.konst(1)?, args.seed(2)?)),
        Kind::Composite(c) => composite(c, args, ty, store.dtype.is_some()).map(|d| store.round_all(d)),
        Kind::Grad => Err(Error::Invalid("a `grad` node must be expanded first (eqfuse::expand_grads)".into())),
        Kind::Gather => {
            let x = args.tensor(0)?;
            gather(x, args.tensor(1)?, args.axis(2, x.rank())?)
        }
        Kind::ScatterAdd => {
            let g = args.tensor(1)?;
            let axis = args.axis(2, ty.rank())?;
            Ok(store.round_all(scatter_add(args.tensor(0)?, g, axis, ty.shape[axis])?))
        }
        Kind::Slice => {
            let x = args.tensor(0)?;
            let axis = args.axis(1, x.rank())?;
            let (start, len) =
                slice_range(x.shape[axis], args.konst(2)? as i64, args.konst(3)? as i64, args.konst(4)? as i64)
                    .map_err(Error::Invalid)?;
            Ok(slice(x, axis, start, len, args.konst(4)? as usize))
        }
        Kind::Concat => {
            let a = args.tensor(0)?;
            Ok(concat(a, args.tensor(1)?, args.axis(2, a.rank())?))
        }
    }
}

/// An index of `gather` or `scatter_add` into an axis of `n` elements: `[-n, n)`, a negative
/// index counting from the end (NumPy); anything else is an error, never a wrapped read.
fn index_in(v: f64, n: usize) -> Result<usize> {
    let n = n as f64;
    if v >= -n && v < n {
        Ok(if v < 0.0 { (v + n) as usize } else { v as usize })
    } else {
        Err(Error::Invalid(format!("index {v} is out of range for an axis of {n} elements")))
    }
}

/// `gather(x, idx, axis)`: NumPy's `take`.
fn gather(x: &Tensor, idx: &Tensor, axis: usize) -> Result<Vec<f64>> {
    let (outer, n, inner) = split_axis(&x.shape, axis);
    let at: Vec<usize> = idx.data.iter().map(|&v| index_in(v, n)).collect::<Result<_>>()?;
    let mut out = Vec::with_capacity(outer * at.len() * inner);
    for o in 0..outer {
        for &j in &at {
            out.extend_from_slice(&x.data[(o * n + j) * inner..][..inner]);
        }
    }
    Ok(out)
}

/// `scatter_add(idx, g, axis, n)`: zeros of `n` along `axis`, with each slice of `g` along the
/// indices' axes added at its index (summed in f64, in index order).
fn scatter_add(idx: &Tensor, g: &Tensor, axis: usize, n: usize) -> Result<Vec<f64>> {
    let at: Vec<usize> = idx.data.iter().map(|&v| index_in(v, n)).collect::<Result<_>>()?;
    let m = at.len();
    let outer: usize = g.shape[..axis].iter().product();
    let inner: usize = g.shape[axis + idx.rank()..].iter().product();
    let mut out = vec![0.0; outer * n * inner];
    for o in 0..outer {
        for (k, &j) in at.iter().enumerate() {
            let src = &g.data[(o * m + k) * inner..][..inner];
            for (d, &v) in out[(o * n + j) * inner..][..inner].iter_mut().zip(src) {
                *d += v;
            }
        }
    }
    Ok(out)
}

/// `len` elements of `x` along `axis` from `start`, `step` apart.
fn slice(x: &Tensor, axis: usize, start: usize, len: usize, step: usize) -> Vec<f64> {
    let (outer, n, inner) = split_axis(&x.shape, axis);
    let mut out = Vec::with_capacity(outer * len * inner);
    for o in 0..outer {
        for k in 0..len {
            out.extend_from_slice(&x.data[(o * n + start + k * step) * inner..][..inner]);
        }
    }
    out
}

/// `a` then `b` along `axis`.
fn concat(a: &Tensor, b: &Tensor, axis: usize) -> Vec<f64> {
    let (outer, na, inner) = split_axis(&a.shape, axis);
    let nb = b.shape[axis];
    let mut out = Vec::with_capacity(outer * (na + nb) * inner);
    for o in 0..outer {
        out.extend_from_slice(&a.data[o * na * inner..][..na * inner]);
        out.extend_from_slice(&b.data[o * nb * inner..][..nb * inner]);
    }
    out
}

/// Maps a function over values, in parallel for large inputs (order is kept).
fn map1(x: &[f64], f: impl Fn(f64) -> f64 + Sync) -> Vec<f64> {
    if x.len() >= PAR_MIN {
        x.par_iter().map(|&v| f(v)).collect()
    } else {
        x.iter().map(|&v| f(v)).collect()
    }
}

/// A binary op with NumPy broadcasting; i32 division truncates.
fn pointwise2(op: Binary, a: &Tensor, b: &Tensor, ty: &TensorType, store: Store) -> Result<Vec<f64>> {
    let int = ty.dtype == DType::I32 && !op.is_comparison();
    // (`pow` of i32 is computed in floats and converted, saturating, as codegen's is.)
    let f = |x, y| {
        if op == Binary::Pow {
            store.convert(binary(op, x, y, int))
        } else {
            store.round(binary(op, x, y, int))
        }
    };
    let shape = &ty.shape;
    if a.numel() == 1 && b.shape == *shape {
        let x = a.data[0];
        return Ok(map1(&b.data, |y| f(x, y)));
    }
    if b.numel() == 1 && a.shape == *shape {
        let y = b.data[0];
        return Ok(map1(&a.data, |x| f(x, y)));
    }
    if a.shape == b.shape {
        return Ok(if a.numel() >= PAR_MIN {
            a.data.par_iter().zip(&b.data).map(|(&x, &y)| f(x, y)).collect()
        } else {
            a.data.iter().zip(&b.data).map(|(&x, &y)| f(x, y)).collect()
        });
    }
    Ok(zip_broadcast(a, b, shape, f))
}

/// `f` over two tensors broadcast to `shape`, reading them in place (no broadcast copies):
/// the output is walked row by row along its last axis, where each operand has stride 0 or 1.
fn zip_broadcast(a: &Tensor, b: &Tensor, shape: &[usize], f: impl Fn(f64, f64) -> f64 + Sync) -> Vec<f64> {
    let (sa, sb) = (broadcast_strides(&a.shape, shape), broadcast_strides(&b.shape, shape));
    let rank = shape.len();
    let inner = shape.last().copied().unwrap_or(1);
    let (ia, ib) = (sa.last().copied().unwrap_or(0), sb.last().copied().unwrap_or(0));
    let mut out = vec![0.0; shape.iter().product()];
    par_blocks(&mut out, inner, |(row, dst)| {
        let (mut oa, mut ob, mut rest) = (0, 0, row);
        for d in (0..rank.saturating_sub(1)).rev() {
            let i = rest % shape[d];
            rest /= shape[d];
            oa += i * sa[d];
            ob += i * sb[d];
        }
        for (j, o) in dst.iter_mut().enumerate() {
            *o = f(a.data[oa + j * ia], b.data[ob + j * ib]);
        }
    });
    out
}

/// `where(c, a, b)` with broadcasting.
fn select(c: &Tensor, a: &Tensor, b: &Tensor, shape: &[usize], store: Store) -> Result<Vec<f64>> {
    let c = c.broadcast_data(shape)?;
    let (a, b) = (a.broadcast_data(shape)?, b.broadcast_data(shape)?);
    Ok((0..c.len()).map(|i| store.round(if c[i] != 0.0 { a[i] } else { b[i] })).collect())
}

/// Reduction along `axis`, keeping it with size 1.
fn reduce(r: Reduce, x: &Tensor, axis: usize, f32_sums: bool) -> Vec<f64> {
    let (outer, n, inner) = split_axis(&x.shape, axis);
    let (init, op) = match r {
        Reduce::Sum | Reduce::Mean => (0.0, Binary::Add),
        Reduce::Amax => (f64::NEG_INFINITY, Binary::Max),
        Reduce::Amin => (f64::INFINITY, Binary::Min),
    };
    let mut out = vec![init; outer * inner];
    let row = |(o, acc): (usize, &mut [f64])| {
        let block = &x.data[o * n * inner..(o + 1) * n * inner];
        for k in 0..n {
            for (a, &v) in acc.iter_mut().zip(&block[k * inner..(k + 1) * inner]) {
                *a = binary(op, *a, v, false);
                if f32_sums {
                    *a = *a as f32 as f64;
                }
            }
        }
        if r == Reduce::Mean {
            acc.iter_mut().for_each(|a| *a /= n as f64);
        }
    };
    if x.numel() >= PAR_MIN {
        out.par_chunks_mut(inner).enumerate().for_each(row);
    } else {
        out.chunks_mut(inner).enumerate().for_each(row);
    }
    out
}

/// `a @ b` over the last two axes with broadcast batch axes.
fn matmul(a: &Tensor, b: &Tensor, out_shape: &[usize], f32_sums: bool) -> Vec<f64> {
    let r = out_shape.len();
    let (m, n, k) = (out_shape[r - 2], out_shape[r - 1], a.shape[a.rank() - 1]);
    let batch = &out_shape[..r - 2];
    let a_batch = broadcast_index_map(&a.shape[..a.rank() - 2], batch);
    let b_batch = broadcast_index_map(&b.shape[..b.rank() - 2], batch);
    let mut out = vec![0.0; out_shape.iter().product()];
    let row = |(ri, acc): (usize, &mut [f64])| {
        let (bi, i) = (ri / m, ri % m);
        let a_row = &a.data[(a_batch[bi] * m + i) * k..][..k];
        let b_mat = &b.data[b_batch[bi] * k * n..][..k * n];
        for (kk, &x) in a_row.iter().enumerate() {
            for (c, &y) in acc.iter_mut().zip(&b_mat[kk * n..(kk + 1) * n]) {
                *c += x * y;
                if f32_sums {
                    // x and y are f32 values, so x * y is exact in f64: this is an f32 FMA.
                    *c = *c as f32 as f64;
                }
            }
        }
    };
    if out.len() * k >= PAR_MIN {
        out.par_chunks_mut(n).enumerate().for_each(row);
    } else {
        out.chunks_mut(n).enumerate().for_each(row);
    }
    out
}

/// `onehot(t, n)`: a row of `n` with a 1 at `t`; an index outside `[0, n)` gives a row of zeros.
fn onehot(t: &Tensor, n: usize) -> Vec<f64> {
    let mut out = vec![0.0; t.numel() * n];
    for (r, &v) in t.data.iter().enumerate() {
        if v >= 0.0 && v < n as f64 {
            out[r * n + v as usize] = 1.0;
        }
    }
    out
}

/// `rounded`: the node's values are stored rounded to its dtype (not [`Precision::F64`]); then
/// `attention_bias` rounds its biased scores to f32, as its kernel computes them.
fn composite(c: Composite, args: &Args, ty: &TensorType, rounded: bool) -> Result<Vec<f64>> {
    let x = args.tensor(0)?;
    match c {
        Composite::Softmax => Ok(softmax(x, args.axis(1, x.rank())?, false)),
        Composite::LogSoftmax => Ok(softmax(x, args.axis(1, x.rank())?, true)),
        Composite::LayerNorm => layernorm(x, args.tensor(1)?, args.tensor(2)?, args.konst(3)?),
        Composite::RmsNorm => rmsnorm(x, args.tensor(1)?, args.konst(2)?),
        Composite::CrossEntropy => cross_entropy(x, args.tensor(1)?).map(|v| vec![v]),
        Composite::Attention => {
            let causal = args.konst(4)? != 0.0;
            Ok(attention(x, args.tensor(1)?, args.tensor(2)?, None, args.konst(3)?, causal, &ty.shape))
        }
        Composite::AttentionBias => {
            let causal = args.konst(5)? != 0.0;
            let bias = Some((args.tensor(3)?, rounded));
            Ok(attention(x, args.tensor(1)?, args.tensor(2)?, bias, args.konst(4)?, causal, &ty.shape))
        }
        Composite::AttentionLse => Ok(attention_lse(x, args.tensor(1)?, args.konst(2)?, args.konst(3)? != 0.0)),
        Composite::AttentionGrad(which) => {
            let t = |i: usize| args.tensor(i);
            let (scale, causal) = (args.konst(6)?, args.konst(7)? != 0.0);
            Ok(attention_grad(which, [x, t(1)?, t(2)?, t(3)?, t(4)?, t(5)?], scale, causal))
        }
        Composite::AttentionBiasLse => {
            let bias = BiasRows::new(args.tensor(2)?, rounded, x, args.tensor(1)?);
            Ok(attention_bias_stats(x, args.tensor(1)?, &bias, args.konst(3)?, args.konst(4)? != 0.0))
        }
        Composite::AttentionBiasGrad(which) => {
            let t = |i: usize| args.tensor(i);
            let bias = BiasRows::new(t(6)?, rounded, x, t(1)?);
            let (scale, causal) = (args.konst(7)?, args.konst(8)? != 0.0);
            Ok(attention_bias_grad(which, [x, t(1)?, t(2)?, t(3)?, t(4)?, t(5)?], &bias, scale, causal, None))
        }
        Composite::AttentionDropout => {
            let causal = args.konst(4)? != 0.0;
            let drop = AttnDropout::new(args.konst(5)?, args.seed(6)?);
            let (k, v) = (args.tensor(1)?, args.tensor(2)?);
            Ok(attention_dropout(x, k, v, None, args.konst(3)?, causal, &ty.shape, Some(&drop)))
        }
        Composite::AttentionBiasDropout => {
            let causal = args.konst(5)? != 0.0;
            let drop = AttnDropout::new(args.konst(6)?, args.seed(7)?);
            let bias = Some((args.tensor(3)?, rounded));
            let (k, v) = (args.tensor(1)?, args.tensor(2)?);
            Ok(attention_dropout(x, k, v, bias, args.konst(4)?, causal, &ty.shape, Some(&drop)))
        }
        Composite::AttentionDropoutGrad(which) => {
            let t = |i: usize| args.tensor(i);
            let (scale, causal) = (args.konst(6)?, args.konst(7)? != 0.0);
            let drop = AttnDropout::new(args.konst(8)?, args.seed(9)?);
            Ok(attention_grad_dropout(which, [x, t(1)?, t(2)?, t(3)?, t(4)?, t(5)?], scale, causal, Some(&drop)))
        }
        Composite::AttentionBiasDropoutGrad(which) => {
            let t = |i: usize| args.tensor(i);
            let bias = BiasRows::new(t(6)?, rounded, x, t(1)?);
            let (scale, causal) = (args.konst(7)?, args.konst(8)? != 0.0);
            let drop = AttnDropout::new(args.konst(9)?, args.seed(10)?);
            let t6 = [x, t(1)?, t(2)?, t(3)?, t(4)?, t(5)?];
            Ok(attention_bias_grad(which, t6, &bias, scale, causal, Some(&drop)))
        }
    }
}

/// The dropout of attention's probabilities (its dropout forms): `dropout`'s mask over the
/// scores `[..., SQ, SK]`, element `(b, i, j)` at flat index `(b SQ + i) SK + j`, and its scale.
pub(crate) struct AttnDropout {
    seed: u32,
    threshold: u32,
    scale: f64,
}

impl AttnDropout {
    pub(crate) fn new(p: f64, seed: u32) -> AttnDropout {
        AttnDropout { seed, threshold: rng::dropout_threshold(p), scale: rng::dropout_scale(p) as f64 }
    }

    /// The factor of score `(b, i, j)` of scores `[.., sq, sk]`: `1 / (1 - p)` if kept, else 0.
    fn factor(&self, (b, i, j): (usize, usize, usize), sq: usize, sk: usize) -> f64 {
        let index = ((b * sq + i) * sk + j) as u64;
        if rng::dropout_keep(self.seed, index, self.threshold) {
            self.scale
        } else {
            0.0
        }
    }
}

/// The scaled scores of one query row against every key (masked ones `-inf`).
fn attention_row_scores(qi: &[f64], keys: &[f64], d: usize, i: usize, scale: f64, causal: bool) -> Vec<f64> {
    (0..keys.len() / d.max(1))
        .map(|j| {
            if causal && j > i {
                f64::NEG_INFINITY
            } else {
                scale * qi.iter().zip(&keys[j * d..(j + 1) * d]).map(|(a, b)| a * b).sum::<f64>()
            }
        })
        .collect()
}

/// `log(sum_j exp(scale <q_i, k_j>))` over the unmasked keys of each query row.
fn attention_lse(q: &Tensor, k: &Tensor, scale: f64, causal: bool) -> Vec<f64> {
    let r = q.rank();
    let (sq, d, sk) = (q.shape[r - 2], q.shape[r - 1], k.shape[r - 2]);
    let mut out = vec![0.0; q.numel() / d.max(1)];
    par_blocks(&mut out, 1, |(ri, dst)| {
        let (b, i) = (ri / sq, ri % sq);
        let s = attention_row_scores(
            &q.data[(b * sq + i) * d..][..d],
            &k.data[b * sk * d..][..sk * d],
            d,
            i,
            scale,
            causal,
        );
        let m = s.iter().fold(f64::NEG_INFINITY, |m, &x| binary(Binary::Max, m, x, false));
        dst[0] = m + unary(Unary::Log, s.iter().map(|&x| unary(Unary::Exp, x - m)).sum::<f64>());
    });
    out
}

/// The bias of `attention_bias` seen per score row: its tensor broadcast to the scores
/// `[..., SQ, SK]`, and whether the biased scores are rounded to f32 (as the kernels compute them).
struct BiasRows<'a> {
    t: &'a Tensor,
    round: bool,
    strides: Vec<usize>,
    batch: Vec<usize>,
}

impl<'a> BiasRows<'a> {
    fn new(t: &'a Tensor, round: bool, q: &Tensor, k: &Tensor) -> BiasRows<'a> {
        let r = q.rank();
        let mut scores = q.shape.clone();
        scores[r - 1] = k.shape[r - 2];
        let strides = broadcast_strides(&t.shape, &scores);
        BiasRows { t, round, strides, batch: scores[..r - 2].to_vec() }
    }

    /// The biased (masked) scores of query row `i` of batch entry `b` against every key.
    fn scores(&self, qi: &[f64], keys: &[f64], d: usize, (b, i): (usize, usize), scale: f64, causal: bool) -> Vec<f64> {
        let r = self.strides.len();
        let (mut rest, mut base) = (b, i * self.strides[r - 2]);
        for a in (0..self.batch.len()).rev() {
            base += (rest % self.batch[a]) * self.strides[a];
            rest /= self.batch[a];
        }
        let mut s = attention_row_scores(qi, keys, d, i, scale, causal);
        for (j, x) in s.iter_mut().enumerate() {
            if *x != f64::NEG_INFINITY {
                let y = *x + self.t.data[base + j * self.strides[r - 1]];
                *x = if self.round { DType::F32.round(y) } else { y };
            }
        }
        s
    }
}

/// `attention_bias_lse`: per query row of the biased scores, the maximum `m` and
/// `log sum_j exp(s_j - m)`; `(-inf, -inf)` for a row whose every score is `-inf`.
fn attention_bias_stats(q: &Tensor, k: &Tensor, bias: &BiasRows, scale: f64, causal: bool) -> Vec<f64> {
    let r = q.rank();
    let (sq, d, sk) = (q.shape[r - 2], q.shape[r - 1], k.shape[r - 2]);
    let mut out = vec![0.0; 2 * q.numel() / d.max(1)];
    par_blocks(&mut out, 2, |(ri, dst)| {
        let (b, i) = (ri / sq, ri % sq);
        let qi = &q.data[(b * sq + i) * d..][..d];
        let s = bias.scores(qi, &k.data[b * sk * d..][..sk * d], d, (b, i), scale, causal);
        let m = s.iter().fold(f64::NEG_INFINITY, |m, &x| binary(Binary::Max, m, x, false));
        dst[0] = m;
        dst[1] = if m == f64::NEG_INFINITY {
            f64::NEG_INFINITY
        } else {
            unary(Unary::Log, s.iter().map(|&x| unary(Unary::Exp, x - m)).sum::<f64>())
        };
    });
    out
}

/// The gradient of `attention_bias` with respect to one operand, from `[q, k, v, g, stats,
/// delta]`: [`attention_grad`] with `P = exp(s - m - log l)` from the biased scores (0 where a
/// score is `-inf`, so 0 on a row whose every score is).
fn attention_bias_grad(
    which: AttnArg,
    t: [&Tensor; 6],
    bias: &BiasRows,
    scale: f64,
    causal: bool,
    drop: Option<&AttnDropout>,
) -> Vec<f64> {
    let [q, k, .., stats, _] = t;
    let r = q.rank();
    let (sq, d, sk) = (q.shape[r - 2], q.shape[r - 1], k.shape[r - 2]);
    let probs = |b: usize, i: usize| -> Vec<f64> {
        let qi = &q.data[(b * sq + i) * d..][..d];
        let s = bias.scores(qi, &k.data[b * sk * d..][..sk * d], d, (b, i), scale, causal);
        let (m, ll) = (stats.data[2 * (b * sq + i)], stats.data[2 * (b * sq + i) + 1]);
        s.iter().map(|&x| if x == f64::NEG_INFINITY { 0.0 } else { unary(Unary::Exp, x - m - ll) }).collect()
    };
    attention_grad_from(which, t, scale, &probs, drop)
}

/// The gradient of attention with respect to one operand, from `[q, k, v, g, lse, delta]`:
/// `P = exp(s scale - lse)`, `dS = P (g vᵀ - delta) scale`; `dS k`, `dSᵀ q` or `Pᵀ g`.
fn attention_grad(which: AttnArg, t: [&Tensor; 6], scale: f64, causal: bool) -> Vec<f64> {
    attention_grad_dropout(which, t, scale, causal, None)
}

/// [`attention_grad`] of attention with its probabilities through dropout (`drop`).
fn attention_grad_dropout(
    which: AttnArg,
    t: [&Tensor; 6],
    scale: f64,
    causal: bool,
    drop: Option<&AttnDropout>,
) -> Vec<f64> {
    let [q, k, _, _, lse, _] = t;
    let r = q.rank();
    let (sq, d, sk) = (q.shape[r - 2], q.shape[r - 1], k.shape[r - 2]);
    let probs = |b: usize, i: usize| -> Vec<f64> {
        let s = attention_row_scores(
            &q.data[(b * sq + i) * d..][..d],
            &k.data[b * sk * d..][..sk * d],
            d,
            i,
            scale,
            causal,
        );
        let l = lse.data[b * sq + i];
        s.iter().map(|&x| if x == f64::NEG_INFINITY { 0.0 } else { unary(Unary::Exp, x - l) }).collect()
    };
    attention_grad_from(which, t, scale, &probs, drop)
}

/// The gradient of attention with respect to one operand given the probabilities of each score
/// row (`probs(batch entry, query row)`): `dS = P (g vᵀ - delta) scale`; `dS k`, `dSᵀ q` or `Pᵀ g`.
/// With dropout (`Z` its mask times its scale): `dS = P ((g vᵀ) Z - delta) scale`, `dv = (P Z)ᵀ g`.
fn attention_grad_from(
    which: AttnArg,
    t: [&Tensor; 6],
    scale: f64,
    probs: &(dyn Fn(usize, usize) -> Vec<f64> + Sync),
    drop: Option<&AttnDropout>,
) -> Vec<f64> {
    let [q, k, v, g, _, delta] = t;
    let r = q.rank();
    let (sq, d, sk, dv) = (q.shape[r - 2], q.shape[r - 1], k.shape[r - 2], v.shape[r - 1]);
    let nb = q.numel() / (sq * d).max(1);
    // Per batch entry: P and dS, [sq, sk] each.
    let per_batch = |b: usize| -> (Vec<f64>, Vec<f64>) {
        let vals = &v.data[b * sk * dv..][..sk * dv];
        let mut p = vec![0.0; sq * sk];
        let mut ds = vec![0.0; sq * sk];
        for i in 0..sq {
            let pr = probs(b, i);
            let gi = &g.data[(b * sq + i) * dv..][..dv];
            let dl = delta.data[b * sq + i];
            for j in 0..sk {
                let pij = pr[j];
                let z = drop.map_or(1.0, |d| d.factor((b, i, j), sq, sk));
                let dp: f64 = gi.iter().zip(&vals[j * dv..(j + 1) * dv]).map(|(a, b)| a * b).sum();
                p[i * sk + j] = pij * z;
                ds[i * sk + j] = pij * (dp * z - dl) * scale;
            }
        }
        (p, ds)
    };
    let (rows, width) = match which {
        AttnArg::Q => (sq, d),
        AttnArg::K => (sk, d),
        AttnArg::V => (sk, dv),
    };
    let mut out = vec![0.0; nb * rows * width];
    par_blocks(&mut out, rows * width, |(b, dst)| {
        let (p, ds) = per_batch(b);
        match which {
            AttnArg::Q => {
                let keys = &k.data[b * sk * d..][..sk * d];
                for i in 0..sq {
                    for j in 0..sk {
                        let x = ds[i * sk + j];
                        for (o, &kk) in dst[i * d..(i + 1) * d].iter_mut().zip(&keys[j * d..(j + 1) * d]) {
                            *o += x * kk;
                        }
                    }
                }
            }
            AttnArg::K | AttnArg::V => {
                let (m, src) = if which == AttnArg::K {
                    (&ds, &q.data[b * sq * d..][..sq * d])
                } else {
                    (&p, &g.data[b * sq * dv..][..sq * dv])
                };
                for i in 0..sq {
                    let row = &src[i * width..(i + 1) * width];
                    for j in 0..sk {
                        let x = m[i * sk + j];
                        if x != 0.0 {
                            for (o, &y) in dst[j * width..(j + 1) * width].iter_mut().zip(row) {
                                *o += x * y;
                            }
                        }
                    }
                }
            }
        }
    });
    out
}

/// Stable (log-)softmax along `axis`: `exp(x - max) / sum`, or `x - max - log(sum)`.
fn softmax(x: &Tensor, axis: usize, log: bool) -> Vec<f64> {
    let (_, n, inner) = split_axis(&x.shape, axis);
    let mut out = vec![0.0; x.numel()];
    let block = |(o, dst): (usize, &mut [f64])| {
        let src = &x.data[o * n * inner..(o + 1) * n * inner];
        for i in 0..inner {
            let at = |k: usize| k * inner + i;
            let m = (0..n).fold(f64::NEG_INFINITY, |m, k| binary(Binary::Max, m, src[at(k)], false));
            let mut sum = 0.0;
            for k in 0..n {
                let e = unary(Unary::Exp, src[at(k)] - m);
                dst[at(k)] = e;
                sum += e;
            }
            let lse = unary(Unary::Log, sum);
            for k in 0..n {
                dst[at(k)] = if log { src[at(k)] - m - lse } else { dst[at(k)] / sum };
            }
        }
    };
    par_blocks(&mut out, n * inner, block);
    out
}

/// Runs `f` over consecutive blocks of `len` elements, in parallel when the output is large.
fn par_blocks(out: &mut [f64], len: usize, f: impl Fn((usize, &mut [f64])) + Sync + Send) {
    if out.is_empty() || len == 0 {
        return;
    }
    if out.len() >= PAR_MIN {
        out.par_chunks_mut(len).enumerate().for_each(f);
    } else {
        out.chunks_mut(len).enumerate().for_each(f);
    }
}

/// `(x - mean) * rsqrt(var + eps) * gamma + beta` over the last axis, biased variance.
fn layernorm(x: &Tensor, gamma: &Tensor, beta: &Tensor, eps: f64) -> Result<Vec<f64>> {
    let c = x.shape[x.rank() - 1];
    let mut out = vec![0.0; x.numel()];
    par_blocks(&mut out, c, |(r, dst)| {
        let row = &x.data[r * c..(r + 1) * c];
        let mu = row.iter().sum::<f64>() / c as f64;
        let var = row.iter().map(|v| (v - mu) * (v - mu)).sum::<f64>() / c as f64;
        let rstd = unary(Unary::Rsqrt, var + eps);
        for (d, &v) in dst.iter_mut().zip(row) {
            *d = (v - mu) * rstd;
        }
    });
    let (g, b) = (gamma.broadcast_data(&x.shape)?, beta.broadcast_data(&x.shape)?);
    Ok(out.iter().zip(g.iter().zip(b.iter())).map(|(&v, (&g, &b))| v * g + b).collect())
}

/// `x * rsqrt(mean(x^2) + eps) * gamma` over the last axis.
fn rmsnorm(x: &Tensor, gamma: &Tensor, eps: f64) -> Result<Vec<f64>> {
    let c = x.shape[x.rank() - 1];
    let mut out = vec![0.0; x.numel()];
    par_blocks(&mut out, c, |(r, dst)| {
        let row = &x.data[r * c..(r + 1) * c];
        let ms = row.iter().map(|v| v * v).sum::<f64>() / c as f64;
        let rstd = unary(Unary::Rsqrt, ms + eps);
        for (d, &v) in dst.iter_mut().zip(row) {
            *d = v * rstd;
        }
    });
    let g = gamma.broadcast_data(&x.shape)?;
    Ok(out.iter().zip(g.iter()).map(|(&v, &g)| v * g).collect())
}

/// Mean over rows of `logsumexp(row) - row[target]`; a target outside `[0, V)` is an error.
fn cross_entropy(logits: &Tensor, targets: &Tensor) -> Result<f64> {
    let v = logits.shape[logits.rank() - 1];
    let rows = targets.numel();
    let mut total = 0.0;
    for (r, &t) in targets.data.iter().enumerate() {
        if !(t >= 0.0 && t < v as f64) {
            return Err(Error::Invalid(format!("target {t} of row {r} is outside the {v} classes [0, {v})")));
        }
        let row = &logits.data[r * v..(r + 1) * v];
        let m = row.iter().fold(f64::NEG_INFINITY, |m, &x| binary(Binary::Max, m, x, false));
        let lse = m + unary(Unary::Log, row.iter().map(|&x| unary(Unary::Exp, x - m)).sum::<f64>());
        total += lse - row[t as usize];
    }
    Ok(total / rows as f64)
}

/// `softmax(q @ k^T * scale [+ bias] [with j > i masked to -inf]) @ v`, per batch. The bias
/// (broadcast to the scores `[..., SQ, SK]`) comes with whether the biased scores are rounded to
/// f32 (`attention_bias` computes them in f32). A row whose every score is `-inf` gives 0 (its
/// softmax is 0/0; the kernel's online softmax leaves the row's sum 0 and writes 0).
fn attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    bias: Option<(&Tensor, bool)>,
    scale: f64,
    causal: bool,
    out_shape: &[usize],
) -> Vec<f64> {
    attention_dropout(q, k, v, bias, scale, causal, out_shape, None)
}

/// [`attention`] with its probabilities through dropout (`drop`): `O = (P Z) V`.
#[allow(clippy::too_many_arguments)]
fn attention_dropout(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    bias: Option<(&Tensor, bool)>,
    scale: f64,
    causal: bool,
    out_shape: &[usize],
    drop: Option<&AttnDropout>,
) -> Vec<f64> {
    let r = q.rank();
    let (sq, d, sk, dv) = (q.shape[r - 2], q.shape[r - 1], k.shape[r - 2], v.shape[r - 1]);
    let mut scores_shape = q.shape.clone();
    scores_shape[r - 1] = sk;
    // The bias element of (batch entry b, query i, key j): base(b) + i * strides[r - 2]
    // + j * strides[r - 1].
    let bias_at = bias.map(|(t, round)| {
        let st = broadcast_strides(&t.shape, &scores_shape);
        let (sr, sc) = (st[r - 2], st[r - 1]);
        let batch = scores_shape[..r - 2].to_vec();
        let base = move |mut b: usize| {
            let mut off = 0;
            for a in (0..batch.len()).rev() {
                off += (b % batch[a]) * st[a];
                b /= batch[a];
            }
            off
        };
        (t, round, base, sr, sc)
    });
    let mut out = vec![0.0; out_shape.iter().product()];
    par_blocks(&mut out, dv, |(ri, dst)| {
        let (b, i) = (ri / sq, ri % sq);
        let qi = &q.data[(b * sq + i) * d..][..d];
        let keys = &k.data[b * sk * d..][..sk * d];
        let vals = &v.data[b * sk * dv..][..sk * dv];
        let row_bias = bias_at.as_ref().map(|(t, round, base, sr, sc)| (&t.data[base(b) + i * sr..], *round, *sc));
        let mut s: Vec<f64> = (0..sk)
            .map(|j| {
                if causal && j > i {
                    return f64::NEG_INFINITY;
                }
                let x = scale * qi.iter().zip(&keys[j * d..(j + 1) * d]).map(|(a, b)| a * b).sum::<f64>();
                match row_bias {
                    Some((row, true, sc)) => DType::F32.round(x + row[j * sc]),
                    Some((row, false, sc)) => x + row[j * sc],
                    None => x,
                }
            })
            .collect();
        let m = s.iter().fold(f64::NEG_INFINITY, |m, &x| binary(Binary::Max, m, x, false));
        if m == f64::NEG_INFINITY {
            return;
        }
        s.iter_mut().for_each(|x| *x = unary(Unary::Exp, *x - m));
        let sum: f64 = s.iter().sum();
        for (j, p) in s.iter().enumerate() {
            let z = drop.map_or(1.0, |d| d.factor((b, i, j), sq, sk));
            if z == 0.0 {
                continue;
            }
            for (o, &vv) in dst.iter_mut().zip(&vals[j * dv..(j + 1) * dv]) {
                *o += p / sum * z * vv;
            }
        }
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f32t(shape: &[usize], data: &[f64]) -> Tensor {
        Tensor::new(DType::F32, shape.to_vec(), data.to_vec()).unwrap()
    }

    #[test]
    fn broadcast_add_and_keepdims_sum() {
        let mut p = Program::new("t");
        let x = p.add_input("x", TensorType::new(DType::F32, vec![2, 3])).unwrap();
        let b = p.add_input("b", TensorType::new(DType::F32, vec![3])).unwrap();
        let y = p.apply(Kind::Binary(Binary::Add), vec![x, b]).unwrap();
        let axis = p.num(-1.0);
        let s = p.apply(Kind::Reduce(Reduce::Sum), vec![y, axis]).unwrap();
        p.add_output("y", y).unwrap();
        p.add_output("s", s).unwrap();
        let inputs = HashMap::from([
            ("x".to_string(), f32t(&[2, 3], &[1., 2., 3., 4., 5., 6.])),
            ("b".to_string(), f32t(&[3], &[10., 20., 30.])),
        ]);
        let out = eval(&p, &inputs).unwrap();
        assert_eq!(out[0].data, vec![11., 22., 33., 14., 25., 36.]);
        assert_eq!(out[1].shape, vec![2, 1]);
        assert_eq!(out[1].data, vec![66., 75.]);
        let all = eval_all(&p, &inputs).unwrap();
        assert_eq!(all[usize::from(s)].as_ref().unwrap().data, vec![66., 75.]);
    }

    #[test]
    fn missing_and_mistyped_inputs_are_named() {
        let mut p = Program::new("t");
        let x = p.add_input("x", TensorType::new(DType::F32, vec![2])).unwrap();
        p.add_output("x", x).unwrap();
        let e = eval(&p, &HashMap::new()).unwrap_err().to_string();
        assert!(e.contains("missing input `x`"), "{e}");
        let bad = HashMap::from([("x".to_string(), f32t(&[3], &[1., 2., 3.]))]);
        let e = eval(&p, &bad).unwrap_err().to_string();
        assert!(e.contains("input `x` is f32[3]") && e.contains("f32[2]"), "{e}");
    }

    #[test]
    fn in_place_broadcasting_agrees_with_broadcast_copies() {
        let pairs: &[(&[usize], &[usize])] = &[
            (&[2, 1, 3], &[4, 1]),
            (&[1], &[2, 3]),
            (&[3, 1, 1], &[1, 2, 1]),
            (&[2, 3], &[3]),
            (&[2, 1], &[1, 5]),
            (&[], &[2, 2]),
            (&[4, 1, 2, 1], &[3, 1, 5]),
        ];
        for (k, &(sa, sb)) in pairs.iter().enumerate() {
            let a = crate::reference::rng::random_input(&TensorType::new(DType::F32, sa.to_vec()), 1, 2 * k);
            let b = crate::reference::rng::random_input(&TensorType::new(DType::F32, sb.to_vec()), 1, 2 * k + 1);
            let shape = crate::ir::infer::broadcast_shapes(sa, sb).unwrap();
            let got = zip_broadcast(&a, &b, &shape, |x, y| x * 10.0 + y);
            let (ba, bb) = (a.broadcast_to(&shape).unwrap(), b.broadcast_to(&shape).unwrap());
            let want: Vec<f64> = ba.data.iter().zip(&bb.data).map(|(x, y)| x * 10.0 + y).collect();
            assert_eq!(got, want, "{sa:?} with {sb:?}");
        }
    }
}
