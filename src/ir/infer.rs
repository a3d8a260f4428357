//! Shape and dtype inference for one operator application.
//!
//! Used by the program builder (to reject bad programs with a message) and by `ShapeAnalysis`
//! (to type every e-node). Invariant: inference depends only on the children's [`Fact`]s, so a
//! node types the same wherever it appears.

use crate::ir::lang::{Binary, Composite, Kind, OpCode, Reduce, Unary};
use crate::ir::types::{DType, TensorType};

/// What is known about a value: its type, and for attribute leaves their literal.
#[derive(Clone, Debug, PartialEq)]
pub struct Fact {
    /// Tensor type; `None` for attribute leaves (`[4,8]`, `bf16`).
    pub ty: Option<TensorType>,
    /// A literal scalar takes the dtype of the tensor it meets (`x * 2` with `x: bf16`).
    pub weak: bool,
    /// The value, when this is a scalar constant.
    pub konst: Option<f64>,
    /// The literal of a shape attribute.
    pub dims: Option<Vec<usize>>,
    /// The literal of a dtype attribute.
    pub dtype: Option<DType>,
}

impl Fact {
    pub fn tensor(ty: TensorType) -> Fact {
        Fact { ty: Some(ty), weak: false, konst: None, dims: None, dtype: None }
    }
    pub fn constant(v: f64) -> Fact {
        Fact { ty: Some(TensorType::scalar(DType::F32)), weak: true, konst: Some(v), dims: None, dtype: None }
    }
    pub fn dims(d: Vec<usize>) -> Fact {
        Fact { ty: None, weak: false, konst: None, dims: Some(d), dtype: None }
    }
    pub fn dtype(t: DType) -> Fact {
        Fact { ty: None, weak: false, konst: None, dims: None, dtype: Some(t) }
    }
}

/// The result of inference: the type, and whether the result is still a weak literal.
#[derive(Debug)]
pub struct Inferred {
    pub ty: TensorType,
    pub weak: bool,
}

type R<T> = Result<T, String>;

fn tensor<'a>(f: &'a Fact, what: &str) -> R<&'a TensorType> {
    f.ty.as_ref().ok_or_else(|| format!("{what} must be a tensor, not an attribute"))
}

/// An integer constant argument (`axis`, `n`, a flag).
fn int_const(f: &Fact, what: &str) -> R<i64> {
    match f.konst {
        Some(v) if v.fract() == 0.0 && v.abs() < 1e15 => Ok(v as i64),
        Some(v) => Err(format!("{what} must be an integer, got {v}")),
        None => Err(format!("{what} must be an integer constant")),
    }
}

/// The seed of `dropout`: an integer literal in `[0, 2^32)`, or an i32 tensor of shape `[]` or
/// `[1]` (a program input, or any i32 expression) whose value, as a u32, is the seed.
/// Returns the literal, or `None` for a tensor seed.
pub fn dropout_seed(f: &Fact) -> R<Option<u32>> {
    if f.weak {
        let seed = int_const(f, "the seed of dropout")?;
        if seed < 0 || seed > u32::MAX as i64 {
            return Err(format!("the seed of dropout must be in [0, 2^32), got {seed}"));
        }
        return Ok(Some(seed as u32));
    }
    let t = f.ty.as_ref().ok_or("the seed of dropout must be an integer or an i32 tensor, not an attribute")?;
    if t.dtype != DType::I32 {
        return Err(format!("the seed of dropout must be an integer or an i32 tensor, got dtype {}", t.dtype));
    }
    if t.numel() != 1 || t.rank() > 1 {
        return Err(format!("the seed tensor of dropout must have shape [] or [1], got {}", shape_str(&t.shape)));
    }
    // (An i32 expression of literals folds to its value: the same seed, read as a u32.)
    Ok(f.konst.map(|v| v as i64 as u32))
}

fn float_const(f: &Fact, what: &str) -> R<f64> {
    f.konst.ok_or_else(|| format!("{what} must be a constant"))
}

/// Normalises a possibly negative axis against a rank.
pub fn norm_axis(axis: i64, rank: usize) -> R<usize> {
    let r = rank as i64;
    if axis >= r || axis < -r {
        return Err(format!("axis {axis} is out of range for a tensor of rank {rank}"));
    }
    Ok(if axis < 0 { (axis + r) as usize } else { axis as usize })
}

/// Python's `range(start, stop, step)` over an axis of `n` elements, as `x[start:stop:step]`
/// takes it: a negative start or stop counts from the end, both are clamped to `[0, n]`, and
/// `step` must be 1 or more. Returns the first index and the number of elements, which must
/// not be 0 (tensors have no empty axes).
pub fn slice_range(n: usize, start: i64, stop: i64, step: i64) -> R<(usize, usize)> {
    if step < 1 {
        return Err(format!("the step of slice must be 1 or more, got {step}"));
    }
    let n = n as i64;
    let norm = |v: i64| if v < 0 { (v + n).max(0) } else { v.min(n) };
    let (a, b) = (norm(start), norm(stop));
    let len = if b > a { (b - a + step - 1) / step } else { 0 };
    if len == 0 {
        return Err(format!("slice {start}:{stop}:{step} of an axis of {n} elements is empty"));
    }
    Ok((a as usize, len as usize))
}

fn shape_str(s: &[usize]) -> String {
    crate::ir::lang::Dims(s.to_vec()).to_string()
}

/// NumPy broadcasting of two shapes.
pub fn broadcast_shapes(a: &[usize], b: &[usize]) -> R<Vec<usize>> {
    let n = a.len().max(b.len());
    let mut out = vec![0; n];
    for i in 0..n {
        let da = if i + a.len() >= n { a[i + a.len() - n] } else { 1 };
        let db = if i + b.len() >= n { b[i + b.len() - n] } else { 1 };
        out[i] = match (da, db) {
            (x, y) if x == y => x,
            (1, y) => y,
            (x, 1) => x,
            _ => {
                return Err(format!(
                    "shapes {} and {} do not broadcast (axis {} has sizes {da} and {db})",
                    shape_str(a),
                    shape_str(b),
                    i as i64 - n as i64
                ))
            }
        };
    }
    Ok(out)
}

/// The common dtype of operands, where weak literals adapt to the other side.
fn join_dtype(a: &Fact, b: &Fact, what: &str) -> R<(DType, bool)> {
    let (ta, tb) = (a.ty.as_ref().unwrap(), b.ty.as_ref().unwrap());
    match (a.weak, b.weak) {
        (true, true) => Ok((DType::F32, true)),
        (true, false) => Ok((tb.dtype, false)),
        (false, true) => Ok((ta.dtype, false)),
        (false, false) if ta.dtype == tb.dtype => Ok((ta.dtype, false)),
        _ => Err(format!("operands of {what} have different dtypes {} and {}; use cast", ta.dtype, tb.dtype)),
    }
}

fn need_float(t: &TensorType, what: &str) -> R<()> {
    if t.dtype.is_float() {
        Ok(())
    } else {
        Err(format!("{what} needs a floating-point tensor, got {}", t.dtype))
    }
}

/// Infers the type of `op` applied to children with the given facts.
pub fn infer(op: OpCode, args: &[&Fact]) -> R<Inferred> {
    let name = op.name();
    if args.len() != op.info().arity {
        return Err(format!("`{name}` takes {} arguments, got {}", op.info().arity, args.len()));
    }
    let strong = |ty: TensorType| Ok(Inferred { ty, weak: false });
    match op.kind() {
        Kind::Unary(u) => {
            let t = tensor(args[0], &format!("the argument of {name}"))?;
            match u {
                Unary::Not if t.dtype != DType::Bool => {
                    return Err(format!("not needs a bool tensor, got {}", t.dtype))
                }
                Unary::Not => {}
                Unary::Neg | Unary::Abs | Unary::Square | Unary::Relu if t.dtype != DType::Bool => {}
                _ if args[0].weak => {}
                _ => need_float(t, name)?,
            }
            Ok(Inferred { ty: t.clone(), weak: args[0].weak })
        }
        Kind::Binary(b) => {
            let what = format!("`{name}`");
            let ta = tensor(args[0], &format!("the left operand of {what}"))?;
            let tb = tensor(args[1], &format!("the right operand of {what}"))?;
            let shape = broadcast_shapes(&ta.shape, &tb.shape).map_err(|e| format!("operands of {what}: {e}"))?;
            let (dtype, weak) = join_dtype(args[0], args[1], &what)?;
            if b.is_comparison() {
                return Ok(Inferred { ty: TensorType::new(DType::Bool, shape), weak: false });
            }
            if dtype == DType::Bool {
                return Err(format!("{what} is arithmetic and does not take bool operands; use cast or where"));
            }
            if matches!(b, Binary::Pow) && !weak && !dtype.is_float() {
                return Err(format!("{what} needs floating-point operands, got {dtype}"));
            }
            Ok(Inferred { ty: TensorType::new(dtype, shape), weak })
        }
        Kind::Reduce(r) => {
            let t = tensor(args[0], &format!("the argument of {name}"))?;
            if t.rank() == 0 {
                return Err(format!("{name} needs a tensor of rank 1 or more, got a scalar"));
            }
            let axis = norm_axis(int_const(args[1], &format!("the axis of {name}"))?, t.rank())?;
            if t.dtype == DType::Bool {
                return Err(format!("{name} does not take bool tensors; cast first"));
            }
            if r == Reduce::Mean {
                need_float(t, name)?;
            }
            let mut shape = t.shape.clone();
            shape[axis] = 1;
            strong(TensorType::new(t.dtype, shape))
        }
        Kind::Where => {
            let c = tensor(args[0], "the condition of where")?;
            if c.dtype != DType::Bool {
                return Err(format!("the condition of where must be bool, got {}", c.dtype));
            }
            let ta = tensor(args[1], "the second argument of where")?;
            let tb = tensor(args[2], "the third argument of where")?;
            let shape = broadcast_shapes(&c.shape, &broadcast_shapes(&ta.shape, &tb.shape)?)
                .map_err(|e| format!("arguments of where: {e}"))?;
            let (dtype, weak) = join_dtype(args[1], args[2], "where")?;
            Ok(Inferred { ty: TensorType::new(dtype, shape), weak: weak && args[0].weak })
        }
        Kind::Cast => {
            let t = tensor(args[0], "the argument of cast")?;
            let d = args[1].dtype.ok_or("the second argument of cast must be a dtype (f32 f16 bf16 i32 bool)")?;
            strong(TensorType::new(d, t.shape.clone()))
        }
        Kind::Transpose => {
            let t = tensor(args[0], "the argument of transpose")?;
            let a = norm_axis(int_const(args[1], "the first axis of transpose")?, t.rank())?;
            let b = norm_axis(int_const(args[2], "the second axis of transpose")?, t.rank())?;
            let mut shape = t.shape.clone();
            shape.swap(a, b);
            strong(TensorType::new(t.dtype, shape))
        }
        Kind::Reshape => {
            let t = tensor(args[0], "the argument of reshape")?;
            let d = args[1].dims.as_ref().ok_or("the second argument of reshape must be a shape list")?;
            // A checked product: the list may come from a rule file or JSON with absurd sizes.
            let n = d.iter().try_fold(1usize, |n, &s| n.checked_mul(s)).unwrap_or(usize::MAX);
            if n != t.numel() {
                return Err(format!(
                    "cannot reshape {} ({} elements) to {} ({} elements)",
                    shape_str(&t.shape),
                    t.numel(),
                    shape_str(d),
                    n
                ));
            }
            strong(TensorType::new(t.dtype, d.clone()))
        }
        Kind::Broadcast => {
            let t = tensor(args[0], "the argument of broadcast")?;
            let d = args[1].dims.as_ref().ok_or("the second argument of broadcast must be a shape list")?;
            let b = broadcast_shapes(&t.shape, d)?;
            if &b != d {
                return Err(format!("cannot broadcast {} to {}", shape_str(&t.shape), shape_str(d)));
            }
            Ok(Inferred { ty: TensorType::new(t.dtype, d.clone()), weak: false })
        }
        Kind::MatMul => {
            let ta = tensor(args[0], "the left operand of @")?;
            let tb = tensor(args[1], "the right operand of @")?;
            if ta.rank() < 2 || tb.rank() < 2 {
                return Err(format!(
                    "@ needs operands of rank 2 or more, got {} and {}",
                    shape_str(&ta.shape),
                    shape_str(&tb.shape)
                ));
            }
            let (m, k) = (ta.shape[ta.rank() - 2], ta.shape[ta.rank() - 1]);
            let (k2, n) = (tb.shape[tb.rank() - 2], tb.shape[tb.rank() - 1]);
            if k != k2 {
                return Err(format!(
                    "inner sizes of @ differ: {} @ {} ({k} against {k2})",
                    shape_str(&ta.shape),
                    shape_str(&tb.shape)
                ));
            }
            let (dtype, _) = join_dtype(args[0], args[1], "@")?;
            need_float(&TensorType::scalar(dtype), "@")?;
            let mut shape = broadcast_shapes(&ta.shape[..ta.rank() - 2], &tb.shape[..tb.rank() - 2])
                .map_err(|e| format!("batch axes of @: {e}"))?;
            shape.extend([m, n]);
            strong(TensorType::new(dtype, shape))
        }
        Kind::Iota => {
            let n = int_const(args[0], "the size of iota")?;
            if n <= 0 {
                return Err(format!("the size of iota must be positive, got {n}"));
            }
            strong(TensorType::new(DType::I32, vec![n as usize]))
        }
        Kind::OneHot => {
            let t = tensor(args[0], "the indices of onehot")?;
            if t.dtype != DType::I32 {
                return Err(format!("the indices of onehot must be i32, got {}", t.dtype));
            }
            let n = int_const(args[1], "the size of onehot")?;
            if n <= 0 {
                return Err(format!("the size of onehot must be positive, got {n}"));
            }
            let mut shape = t.shape.clone();
            shape.push(n as usize);
            strong(TensorType::new(DType::F32, shape))
        }
        Kind::Dropout => {
            let t = tensor(args[0], "the argument of dropout")?;
            need_float(t, "dropout")?;
            let p = float_const(args[1], "the probability of dropout")?;
            if !(0.0..1.0).contains(&p) {
                return Err(format!("the probability of dropout must be in [0, 1), got {p}"));
            }
            dropout_seed(args[2])?;
            strong(t.clone())
        }
        Kind::Composite(c) => infer_composite(c, name, args),
        Kind::Gather => {
            let x = tensor(args[0], "the argument of gather")?;
            let idx = tensor(args[1], "the indices of gather")?;
            if idx.dtype != DType::I32 {
                return Err(format!("the indices of gather must be i32, got {}", idx.dtype));
            }
            if x.rank() == 0 {
                return Err("gather needs a tensor of rank 1 or more, got a scalar".into());
            }
            let axis =
                norm_axis(int_const(args[2], "the axis of gather")?, x.rank()).map_err(|e| format!("gather: {e}"))?;
            let mut shape = x.shape[..axis].to_vec();
            shape.extend_from_slice(&idx.shape);
            shape.extend_from_slice(&x.shape[axis + 1..]);
            strong(TensorType::new(x.dtype, shape))
        }
        Kind::ScatterAdd => {
            let idx = tensor(args[0], "the indices of scatter_add")?;
            if idx.dtype != DType::I32 {
                return Err(format!("the indices of scatter_add must be i32, got {}", idx.dtype));
            }
            let g = tensor(args[1], "the values of scatter_add")?;
            if g.dtype == DType::Bool {
                return Err("scatter_add does not take bool values; cast first".into());
            }
            if g.rank() < idx.rank() {
                return Err(format!(
                    "scatter_add: the values {} have fewer axes than the indices {}",
                    shape_str(&g.shape),
                    shape_str(&idx.shape)
                ));
            }
            let rank = g.rank() - idx.rank() + 1;
            let axis = norm_axis(int_const(args[2], "the axis of scatter_add")?, rank)
                .map_err(|e| format!("scatter_add: {e}"))?;
            if g.shape[axis..axis + idx.rank()] != idx.shape[..] {
                return Err(format!(
                    "scatter_add: the values {} do not hold the indices' shape {} at axis {axis}",
                    shape_str(&g.shape),
                    shape_str(&idx.shape)
                ));
            }
            let n = int_const(args[3], "the size of scatter_add")?;
            if n <= 0 {
                return Err(format!("the size of scatter_add must be positive, got {n}"));
            }
            let mut shape = g.shape[..axis].to_vec();
            shape.push(n as usize);
            shape.extend_from_slice(&g.shape[axis + idx.rank()..]);
            strong(TensorType::new(g.dtype, shape))
        }
        Kind::Slice => {
            let x = tensor(args[0], "the argument of slice")?;
            if x.rank() == 0 {
                return Err("slice needs a tensor of rank 1 or more, got a scalar".into());
            }
            let axis =
                norm_axis(int_const(args[1], "the axis of slice")?, x.rank()).map_err(|e| format!("slice: {e}"))?;
            let start = int_const(args[2], "the start of slice")?;
            let stop = int_const(args[3], "the stop of slice")?;
            let step = int_const(args[4], "the step of slice")?;
            let (_, len) = slice_range(x.shape[axis], start, stop, step)?;
            let mut shape = x.shape.clone();
            shape[axis] = len;
            strong(TensorType::new(x.dtype, shape))
        }
        Kind::Concat => {
            let a = tensor(args[0], "the first argument of concat")?;
            let b = tensor(args[1], "the second argument of concat")?;
            if a.rank() == 0 || a.rank() != b.rank() {
                return Err(format!(
                    "concat needs two tensors of one rank (1 or more), got {} and {}",
                    shape_str(&a.shape),
                    shape_str(&b.shape)
                ));
            }
            if a.dtype != b.dtype {
                return Err(format!("operands of concat have different dtypes {} and {}; use cast", a.dtype, b.dtype));
            }
            let axis =
                norm_axis(int_const(args[2], "the axis of concat")?, a.rank()).map_err(|e| format!("concat: {e}"))?;
            if (0..a.rank()).any(|k| k != axis && a.shape[k] != b.shape[k]) {
                return Err(format!(
                    "concat along axis {axis}: shapes {} and {} differ on another axis",
                    shape_str(&a.shape),
                    shape_str(&b.shape)
                ));
            }
            let mut shape = a.shape.clone();
            shape[axis] += b.shape[axis];
            strong(TensorType::new(a.dtype, shape))
        }
        Kind::Grad => {
            let l = tensor(args[0], "the loss of grad")?;
            if l.numel() != 1 {
                return Err(format!("grad needs a loss with one element, got shape {}", shape_str(&l.shape)));
            }
            need_float(l, "grad")?;
            let w = tensor(args[1], "the variable of grad")?;
            need_float(w, "grad")?;
            strong(w.clone())
        }
    }
}

fn infer_composite(c: Composite, name: &str, args: &[&Fact]) -> R<Inferred> {
    let x = tensor(args[0], &format!("the first argument of {name}"))?;
    need_float(x, name)?;
    if x.rank() == 0 {
        return Err(format!("{name} needs a tensor of rank 1 or more, got a scalar"));
    }
    let param = |i: usize, what: &str| -> R<()> {
        let p = tensor(args[i], &format!("{what} of {name}"))?;
        let b = broadcast_shapes(&x.shape, &p.shape).map_err(|e| format!("{what} of {name}: {e}"))?;
        if b != x.shape {
            return Err(format!(
                "{what} of {name} has shape {}, which does not broadcast to {}",
                shape_str(&p.shape),
                shape_str(&x.shape)
            ));
        }
        if p.dtype != x.dtype {
            return Err(format!("{what} of {name} is {}, the input is {}", p.dtype, x.dtype));
        }
        Ok(())
    };
    match c {
        Composite::Softmax | Composite::LogSoftmax => {
            norm_axis(int_const(args[1], &format!("the axis of {name}"))?, x.rank())?;
        }
        Composite::LayerNorm => {
            param(1, "gamma")?;
            param(2, "beta")?;
            float_const(args[3], "the epsilon of layernorm")?;
        }
        Composite::RmsNorm => {
            param(1, "gamma")?;
            float_const(args[2], "the epsilon of rmsnorm")?;
        }
        Composite::CrossEntropy => {
            let t = tensor(args[1], "the targets of cross_entropy")?;
            if t.dtype != DType::I32 {
                return Err(format!("the targets of cross_entropy must be i32, got {}", t.dtype));
            }
            if t.shape[..] != x.shape[..x.rank() - 1] {
                return Err(format!(
                    "the targets of cross_entropy must have shape {} (the logits {} without the last axis), got {}",
                    shape_str(&x.shape[..x.rank() - 1]),
                    shape_str(&x.shape),
                    shape_str(&t.shape)
                ));
            }
            return Ok(Inferred { ty: TensorType::scalar(x.dtype), weak: false });
        }
        Composite::AttentionDropout | Composite::AttentionBiasDropout => {
            // The plain form's rules, then the probability and the seed (`dropout`'s rules).
            let plain = if c == Composite::AttentionDropout { Composite::Attention } else { Composite::AttentionBias };
            let slots = c.attention_slots().ok_or("not a forward attention")?;
            let at = slots.dropout.ok_or("not a dropout form")?;
            let out = infer_composite(plain, name, &args[..at])?;
            attention_dropout_args(name, args[at], args[at + 1])?;
            return Ok(out);
        }
        Composite::Attention => {
            let k = tensor(args[1], "the keys of attention")?;
            let v = tensor(args[2], "the values of attention")?;
            attention_operands(x, k, v)?;
            float_const(args[3], "the scale of attention")?;
            causal_flag(args[4])?;
            let mut shape = x.shape.clone();
            shape[x.rank() - 1] = v.shape[x.rank() - 1];
            return Ok(Inferred { ty: TensorType::new(x.dtype, shape), weak: false });
        }
        Composite::AttentionBias => {
            let k = tensor(args[1], "the keys of attention_bias")?;
            let v = tensor(args[2], "the values of attention_bias")?;
            attention_operands(x, k, v)?;
            let b = tensor(args[3], "the bias of attention_bias")?;
            if args[3].weak {
                return Err("the bias of attention_bias must be a tensor, not a literal".into());
            }
            need_float(b, "the bias of attention_bias")?;
            let r = x.rank();
            let mut scores = x.shape.clone();
            scores[r - 1] = k.shape[r - 2];
            if broadcast_shapes(&b.shape, &scores).ok().as_ref() != Some(&scores) {
                return Err(format!(
                    "the bias of attention_bias has shape {}, which does not broadcast to the scores {}",
                    shape_str(&b.shape),
                    shape_str(&scores)
                ));
            }
            float_const(args[4], "the scale of attention_bias")?;
            causal_flag(args[5])?;
            let mut shape = x.shape.clone();
            shape[r - 1] = v.shape[r - 1];
            return Ok(Inferred { ty: TensorType::new(x.dtype, shape), weak: false });
        }
        Composite::AttentionLse
        | Composite::AttentionBiasLse
        | Composite::AttentionGrad(_)
        | Composite::AttentionBiasGrad(_)
        | Composite::AttentionDropoutGrad(_)
        | Composite::AttentionBiasDropoutGrad(_) => {
            return attention_backward(c, name, x, args);
        }
    }
    Ok(Inferred { ty: x.clone(), weak: false })
}

/// The types of attention's backward composites (`attention_lse`, `attention_grad_*` and their
/// bias forms; argument positions in [`Composite::attention_backward_slots`]).
fn attention_backward(c: Composite, name: &str, x: &TensorType, args: &[&Fact]) -> R<Inferred> {
    let slots = c.attention_backward_slots().ok_or("not a backward attention")?;
    let k = tensor(args[1], &format!("the keys of {name}"))?;
    let v = if slots.grad.is_some() { tensor(args[2], &format!("the values of {name}"))? } else { k };
    attention_operands(x, k, v)?;
    let r = x.rank();
    let mut rows = x.shape.clone();
    rows[r - 1] = 1;
    if let Some(b) = slots.bias {
        let t = tensor(args[b], &format!("the bias of {name}"))?;
        if args[b].weak {
            return Err(format!("the bias of {name} must be a tensor, not a literal"));
        }
        need_float(t, &format!("the bias of {name}"))?;
        let mut scores = x.shape.clone();
        scores[r - 1] = k.shape[r - 2];
        if broadcast_shapes(&t.shape, &scores).ok().as_ref() != Some(&scores) {
            return Err(format!(
                "the bias of {name} has shape {}, which does not broadcast to the scores {}",
                shape_str(&t.shape),
                shape_str(&scores)
            ));
        }
    }
    // The statistics of the rows: a log-sum-exp, or (with a bias) the maximum and log sum.
    let mut stats = rows.clone();
    stats[r - 1] = if slots.bias.is_some() { 2 } else { 1 };
    float_const(args[slots.tensors], &format!("the scale of {name}"))?;
    causal_flag(args[slots.tensors + 1])?;
    if let Some(at) = slots.dropout {
        attention_dropout_args(name, args[at], args[at + 1])?;
    }
    let Some(which) = slots.grad else {
        return Ok(Inferred { ty: TensorType::new(DType::F32, stats), weak: false });
    };
    let mut oshape = x.shape.clone();
    oshape[r - 1] = v.shape[r - 1];
    let g = tensor(args[3], &format!("the output gradient of {name}"))?;
    if g.shape != oshape || g.dtype != x.dtype {
        return Err(format!(
            "the output gradient of {name} must be {}{}, got {}{}",
            x.dtype,
            shape_str(&oshape),
            g.dtype,
            shape_str(&g.shape)
        ));
    }
    let lse_name = if slots.bias.is_some() { "statistics" } else { "log-sum-exp" };
    for (i, what, want) in [(4, lse_name, &stats), (5, "delta", &rows)] {
        let t = tensor(args[i], &format!("the {what} of {name}"))?;
        if &t.shape != want || t.dtype != DType::F32 {
            return Err(format!(
                "the {what} of {name} must be f32{}, got {}{}",
                shape_str(want),
                t.dtype,
                shape_str(&t.shape)
            ));
        }
    }
    let ty = match which {
        crate::ir::lang::AttnArg::Q => x,
        crate::ir::lang::AttnArg::K => k,
        crate::ir::lang::AttnArg::V => v,
    };
    Ok(Inferred { ty: ty.clone(), weak: false })
}

/// The dropout probability (a constant in `[0, 1)`) and seed (as `dropout`'s) of attention's
/// dropout forms.
fn attention_dropout_args(name: &str, p: &Fact, seed: &Fact) -> R<()> {
    let p = float_const(p, &format!("the dropout probability of {name}"))?;
    if !(0.0..1.0).contains(&p) {
        return Err(format!("the dropout probability of {name} must be in [0, 1), got {p}"));
    }
    dropout_seed(seed).map_err(|e| format!("{e} (in {name})"))?;
    Ok(())
}

/// Queries, keys and values of attention: one rank (2 or more), matching batch axes, key and
/// query head sizes equal, one dtype.
fn attention_operands(x: &TensorType, k: &TensorType, v: &TensorType) -> R<()> {
    if x.rank() < 2 || k.rank() != x.rank() || v.rank() != x.rank() {
        return Err(format!(
            "attention needs q, k, v of one rank (2 or more), got {}, {}, {}",
            shape_str(&x.shape),
            shape_str(&k.shape),
            shape_str(&v.shape)
        ));
    }
    let r = x.rank();
    if k.shape[r - 1] != x.shape[r - 1] || k.shape[..r - 2] != x.shape[..r - 2] {
        return Err(format!("the keys {} do not match the queries {}", shape_str(&k.shape), shape_str(&x.shape)));
    }
    if v.shape[r - 2] != k.shape[r - 2] || v.shape[..r - 2] != x.shape[..r - 2] {
        return Err(format!("the values {} do not match the keys {}", shape_str(&v.shape), shape_str(&k.shape)));
    }
    if k.dtype != x.dtype || v.dtype != x.dtype {
        return Err(format!("attention needs q, k, v of one dtype, got {}, {}, {}", x.dtype, k.dtype, v.dtype));
    }
    Ok(())
}

fn causal_flag(f: &Fact) -> R<()> {
    let causal = int_const(f, "the causal flag of attention")?;
    if causal != 0 && causal != 1 {
        return Err(format!("the causal flag of attention must be 0 or 1, got {causal}"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(d: DType, s: &[usize]) -> Fact {
        Fact::tensor(TensorType::new(d, s.to_vec()))
    }

    #[test]
    fn broadcasting() {
        assert_eq!(broadcast_shapes(&[4, 1], &[3]).unwrap(), vec![4, 3]);
        assert!(broadcast_shapes(&[4, 2], &[3]).unwrap_err().contains("do not broadcast"));
    }

    #[test]
    fn weak_literals_adapt() {
        let add = OpCode::from_name("+").unwrap();
        let r = infer(add, &[&t(DType::Bf16, &[2]), &Fact::constant(1.0)]).unwrap();
        assert_eq!(r.ty.dtype, DType::Bf16);
        assert!(infer(add, &[&t(DType::Bf16, &[2]), &t(DType::F32, &[2])]).is_err());
    }

    #[test]
    fn slices_follow_python() {
        assert_eq!(slice_range(10, 2, 5, 1).unwrap(), (2, 3));
        assert_eq!(slice_range(10, -3, 100, 1).unwrap(), (7, 3));
        assert_eq!(slice_range(10, 0, 10, 3).unwrap(), (0, 4));
        assert_eq!(slice_range(10, -100, -8, 1).unwrap(), (0, 2));
        assert!(slice_range(10, 5, 5, 1).unwrap_err().contains("empty"));
        assert!(slice_range(10, 0, 5, 0).unwrap_err().contains("step"));
        let slice = OpCode::from_name("slice").unwrap();
        let c = Fact::constant;
        let r = infer(slice, &[&t(DType::F32, &[4, 8]), &c(-1.0), &c(4.0), &c(8.0), &c(1.0)]).unwrap();
        assert_eq!(r.ty.shape, vec![4, 4]);
        assert!(infer(slice, &[&t(DType::F32, &[4, 8]), &c(2.0), &c(0.0), &c(1.0), &c(1.0)])
            .unwrap_err()
            .contains("slice"));
    }

    #[test]
    fn gather_concat_scatter_shapes() {
        let c = Fact::constant;
        let gather = OpCode::from_name("gather").unwrap();
        let r = infer(gather, &[&t(DType::F32, &[50, 8]), &t(DType::I32, &[2, 3]), &c(0.0)]).unwrap();
        assert_eq!(r.ty.shape, vec![2, 3, 8]);
        let r = infer(gather, &[&t(DType::F32, &[4, 50]), &t(DType::I32, &[]), &c(-1.0)]).unwrap();
        assert_eq!(r.ty.shape, vec![4]);
        assert!(infer(gather, &[&t(DType::F32, &[4]), &t(DType::F32, &[2]), &c(0.0)]).unwrap_err().contains("i32"));
        let sa = OpCode::from_name("scatter_add").unwrap();
        let r = infer(sa, &[&t(DType::I32, &[2, 3]), &t(DType::F32, &[2, 3, 8]), &c(0.0), &c(50.0)]).unwrap();
        assert_eq!(r.ty.shape, vec![50, 8]);
        let r = infer(sa, &[&t(DType::I32, &[3]), &t(DType::F32, &[4, 3]), &c(-1.0), &c(7.0)]).unwrap();
        assert_eq!(r.ty.shape, vec![4, 7]);
        assert!(infer(sa, &[&t(DType::I32, &[3]), &t(DType::F32, &[4, 2]), &c(-1.0), &c(7.0)]).is_err());
        let cat = OpCode::from_name("concat").unwrap();
        let r = infer(cat, &[&t(DType::F32, &[4, 2]), &t(DType::F32, &[4, 3]), &c(-1.0)]).unwrap();
        assert_eq!(r.ty.shape, vec![4, 5]);
        assert!(infer(cat, &[&t(DType::F32, &[4, 2]), &t(DType::F32, &[3, 3]), &c(-1.0)])
            .unwrap_err()
            .contains("concat"));
        assert!(infer(cat, &[&t(DType::F32, &[4, 2]), &t(DType::F16, &[4, 2]), &c(0.0)]).is_err());
    }

    #[test]
    fn reductions_keep_dims() {
        let sum = OpCode::from_name("sum").unwrap();
        let r = infer(sum, &[&t(DType::F32, &[4, 5]), &Fact::constant(-1.0)]).unwrap();
        assert_eq!(r.ty.shape, vec![4, 1]);
        assert!(infer(sum, &[&t(DType::F32, &[4, 5]), &Fact::constant(2.0)]).is_err());
    }
}
