//! `TensorLang`: the one operator language of eqfuse.
//!
//! The parser builds it, the rules match it, the reference interpreter evaluates it, the planner
//! extracts it and codegen renders it. Attributes (axes, epsilons, shapes, dtypes) are leaf
//! children, so that rules can bind them with pattern variables (`(sum (* ?c ?x) ?axis)`).
//! Invariant: every operator has exactly one entry in [`OPS`] naming its spelling, arity and
//! kind; nothing else in the crate spells operator names.

use std::fmt;
use std::str::FromStr;

use egg::{Id, Language, Symbol};

use crate::ir::types::DType;

/// Pointwise functions of one argument.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Unary {
    Neg,
    Exp,
    Log,
    Sqrt,
    Rsqrt,
    Recip,
    Abs,
    Tanh,
    Sigmoid,
    Relu,
    Gelu,
    GeluTanh,
    Silu,
    Erf,
    Sin,
    Cos,
    Square,
    /// Rounding to an integer value: down, up, to the nearest (ties to even, as `torch.round`
    /// and CUDA's `rintf`), toward zero. Exact; zero gradient.
    Floor,
    Ceil,
    Round,
    Trunc,
    /// Logical not of a `bool` tensor; used by rules, not written in programs.
    Not,
}

/// Pointwise functions of two arguments (NumPy broadcasting).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Binary {
    Add,
    Sub,
    Mul,
    Div,
    Pow,
    Max,
    Min,
    Lt,
    Le,
    Gt,
    Ge,
    Eq,
    Ne,
}

impl Binary {
    /// Comparisons produce `bool`.
    pub fn is_comparison(self) -> bool {
        matches!(self, Binary::Lt | Binary::Le | Binary::Gt | Binary::Ge | Binary::Eq | Binary::Ne)
    }
}

/// Reductions along one axis; the reduced axis is kept with size 1.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Reduce {
    Sum,
    Mean,
    Amax,
    Amin,
}

/// Composite operators: recognised by the pattern rules in decomposed programs, or written directly.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Composite {
    /// `softmax(x, axis)`
    Softmax,
    /// `log_softmax(x, axis)`
    LogSoftmax,
    /// `layernorm(x, gamma, beta, eps)` over the last axis.
    LayerNorm,
    /// `rmsnorm(x, gamma, eps)` over the last axis.
    RmsNorm,
    /// `cross_entropy(logits, targets)`: mean over rows of `-log_softmax(logits)[target]`, a scalar.
    CrossEntropy,
    /// `attention(q, k, v, scale, causal)`: `softmax(q @ k^T * scale [+ causal mask]) @ v`.
    Attention,
    /// `attention_bias(q, k, v, bias, scale, causal)`: `softmax(q @ k^T * scale + bias [+ causal
    /// mask]) @ v`, `bias` of any float dtype broadcasting to the scores `[..., SQ, SK]`, the
    /// biased scores computed in f32; a row whose every score is `-inf` gives 0.
    AttentionBias,
    /// `attention_lse(q, k, scale, causal)`: the f32 log-sum-exp of each row of attention's
    /// scaled (and masked) scores, `[..., SQ, 1]`; what its backward recomputes the
    /// probabilities from.
    AttentionLse,
    /// `attention_grad_{q,k,v}(q, k, v, g, lse, delta, scale, causal)`: the gradient of attention
    /// with respect to one operand, given the upstream gradient `g`, the scores' log-sum-exp and
    /// `delta = sum(g * o, -1)` (f32 `[..., SQ, 1]` both): with `P = exp(s * scale - lse)`
    /// (0 where masked), `dS = P (g vᵀ - delta) scale`, it is `dS k`, `dSᵀ q` or `Pᵀ g`.
    AttentionGrad(AttnArg),
    /// `attention_bias_lse(q, k, bias, scale, causal)`: the statistics of each row of
    /// `attention_bias`'s biased (f32) and masked scores, f32 `[..., SQ, 2]`: the row maximum `m`
    /// and the log of the row sum `log sum_j exp(s_j - m)` (`-inf` both for a row whose every
    /// score is `-inf`). Kept apart (not summed into one log-sum-exp) so that a row of equal
    /// fills near -FLT_MAX (a finfo.min mask) keeps its weights `1 / keys`.
    AttentionBiasLse,
    /// `attention_bias_grad_{q,k,v}(q, k, v, g, stats, delta, bias, scale, causal)`: the gradient
    /// of `attention_bias` with respect to one operand, given `stats = attention_bias_lse(..)`
    /// and `delta = sum(g * o, -1)`: with `P = exp(s - max(m, lowest) - max(log l, 0))` (0 where
    /// masked or `s = -inf`; 0 on a row whose every score is `-inf`), `dS = P (g vᵀ - delta)
    /// scale`, it is `dS k`, `dSᵀ q` or `Pᵀ g`. No gradient of the bias.
    AttentionBiasGrad(AttnArg),
    /// `attention_dropout(q, k, v, scale, causal, p, seed)`: `attention`'s probabilities through
    /// `dropout(P, p, seed)` before the product with `v`: element `(b, i, j)` of the scores
    /// `[..., SQ, SK]` kept by `dropout`'s generator at its flat index `(b SQ + i) SK + j`, kept
    /// ones scaled by `1 / (1 - p)` (rounded to f32). `seed` as `dropout`'s: a literal or an i32
    /// tensor of one element.
    AttentionDropout,
    /// `attention_bias_dropout(q, k, v, bias, scale, causal, p, seed)`: `attention_bias` with its
    /// probabilities through dropout, as [`Composite::AttentionDropout`].
    AttentionBiasDropout,
    /// `attention_dropout_grad_{q,k,v}(q, k, v, g, lse, delta, scale, causal, p, seed)`: the
    /// gradient of `attention_dropout`: with `P` as for `attention_grad_*` and `Z` the kept mask
    /// times `1 / (1 - p)`, `dS = P ((g vᵀ) Z - delta) scale`; `dS k`, `dSᵀ q` or `(P Z)ᵀ g`
    /// (`delta = sum(g * o, -1)` of the dropped output).
    AttentionDropoutGrad(AttnArg),
    /// `attention_bias_dropout_grad_{q,k,v}(q, k, v, g, stats, delta, bias, scale, causal, p,
    /// seed)`: the same of `attention_bias_dropout`, its statistics `attention_bias_lse`'s.
    AttentionBiasDropoutGrad(AttnArg),
}

impl Composite {
    /// The argument positions of one of attention's backward composites (`attention_lse`,
    /// `attention_grad_*`, and their bias forms); `None` for other composites.
    pub fn attention_backward_slots(self) -> Option<AttnBwdSlots> {
        match self {
            Composite::AttentionLse => Some(AttnBwdSlots { grad: None, tensors: 2, bias: None, dropout: None }),
            Composite::AttentionBiasLse => Some(AttnBwdSlots { grad: None, tensors: 3, bias: Some(2), dropout: None }),
            Composite::AttentionGrad(w) => Some(AttnBwdSlots { grad: Some(w), tensors: 6, bias: None, dropout: None }),
            Composite::AttentionBiasGrad(w) => {
                Some(AttnBwdSlots { grad: Some(w), tensors: 7, bias: Some(6), dropout: None })
            }
            Composite::AttentionDropoutGrad(w) => {
                Some(AttnBwdSlots { grad: Some(w), tensors: 6, bias: None, dropout: Some(8) })
            }
            Composite::AttentionBiasDropoutGrad(w) => {
                Some(AttnBwdSlots { grad: Some(w), tensors: 7, bias: Some(6), dropout: Some(9) })
            }
            _ => None,
        }
    }

    /// Whether this is one of attention's backward composites.
    pub fn is_attention_backward(self) -> bool {
        self.attention_backward_slots().is_some()
    }

    /// The row statistics a forward attention's kernel writes beside its output, with which
    /// argument of the forward each of the statistics' arguments is (`(forward, statistics)`
    /// positions of q, k, bias (where there is one), scale and causal): `attention_lse` of `attention` and
    /// `attention_dropout`, `attention_bias_lse` of `attention_bias`; `None` for other
    /// composites. (Not of `attention_bias_dropout`: the statistics' registers made the Hopper
    /// path of a causal padding-mask kernel spill 48 bytes more than without dropout, against 24.)
    pub fn forward_stats(self) -> Option<(Composite, &'static [(usize, usize)])> {
        match self {
            Composite::Attention | Composite::AttentionDropout => {
                Some((Composite::AttentionLse, &[(0, 0), (1, 1), (3, 2), (4, 3)]))
            }
            Composite::AttentionBias => Some((Composite::AttentionBiasLse, &[(0, 0), (1, 1), (3, 2), (4, 3), (5, 4)])),
            _ => None,
        }
    }

    /// Whether this is a forward attention (`attention`, `attention_bias` and their dropout
    /// forms): the operator one forward attention kernel runs.
    pub fn is_attention_forward(self) -> bool {
        self.attention_slots().is_some()
    }

    /// The argument positions of a forward attention: its bias (`None` for `attention`), its
    /// scale and its causal flag; `None` for other composites.
    pub fn attention_slots(self) -> Option<AttnSlots> {
        match self {
            Composite::Attention => Some(AttnSlots { bias: None, scale: 3, causal: 4, dropout: None }),
            Composite::AttentionBias => Some(AttnSlots { bias: Some(3), scale: 4, causal: 5, dropout: None }),
            Composite::AttentionDropout => Some(AttnSlots { bias: None, scale: 3, causal: 4, dropout: Some(5) }),
            Composite::AttentionBiasDropout => Some(AttnSlots { bias: Some(3), scale: 4, causal: 5, dropout: Some(6) }),
            _ => None,
        }
    }
}

/// Where a forward attention's arguments after `q, k, v` are ([`Composite::attention_slots`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttnSlots {
    pub bias: Option<usize>,
    pub scale: usize,
    pub causal: usize,
    /// The dropout probability's position (the seed's is the next) of a dropout form.
    pub dropout: Option<usize>,
}

/// Where a backward attention composite's arguments are
/// ([`Composite::attention_backward_slots`]): the tensor operands come first (`q, k` for the
/// statistics, `q, k, v, g, lse, delta` for a gradient), the bias (if any) last among them, then
/// the scale and the causal flag, then (dropout forms) the probability and the seed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttnBwdSlots {
    /// The gradient's operand; `None` for the statistics (`attention_lse`, `attention_bias_lse`).
    pub grad: Option<AttnArg>,
    /// How many tensor operands (the bias included): the scale's position.
    pub tensors: usize,
    pub bias: Option<usize>,
    /// The dropout probability's position (the seed's is the next) of a dropout form.
    pub dropout: Option<usize>,
}

/// Which operand of attention a gradient is taken with respect to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum AttnArg {
    Q,
    K,
    V,
}

/// How an operator's children are used; drives shape inference and evaluation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Unary(Unary),
    Binary(Binary),
    Reduce(Reduce),
    Composite(Composite),
    /// `where(c, a, b)`
    Where,
    /// `cast(x, dtype)`
    Cast,
    /// `transpose(x, a, b)`
    Transpose,
    /// `reshape(x, [dims])`
    Reshape,
    /// `broadcast(x, [dims])`
    Broadcast,
    /// `a @ b`
    MatMul,
    /// `iota(n)`
    Iota,
    /// `onehot(t, n)`
    OneHot,
    /// `dropout(x, p, seed)`: `seed` a literal, or an i32 tensor of one element (given at run time).
    Dropout,
    /// `grad(loss, w)`
    Grad,
    /// `gather(x, idx, axis)`: `x` taken at the i32 indices `idx` along `axis` (NumPy `take`).
    Gather,
    /// `scatter_add(idx, g, axis, n)`: zeros of size `n` along `axis` with the slices of `g`
    /// added at the i32 indices `idx` (the gradient of `gather`).
    ScatterAdd,
    /// `slice(x, axis, start, stop, step)`: Python's `x[start:stop:step]` along `axis`.
    Slice,
    /// `concat(a, b, axis)`: `a` then `b` along `axis`.
    Concat,
}

/// One entry of the operator table.
#[derive(Clone, Copy, Debug)]
pub struct OpInfo {
    /// Spelling in programs, rules and s-expressions.
    pub name: &'static str,
    /// Number of children (attributes included).
    pub arity: usize,
    pub kind: Kind,
}

const fn op(name: &'static str, arity: usize, kind: Kind) -> OpInfo {
    OpInfo { name, arity, kind }
}

/// Every non-leaf operator. Binary arithmetic uses its symbol in s-expressions (`(+ a b)`).
pub const OPS: &[OpInfo] = &[
    op("neg", 1, Kind::Unary(Unary::Neg)),
    op("exp", 1, Kind::Unary(Unary::Exp)),
    op("log", 1, Kind::Unary(Unary::Log)),
    op("sqrt", 1, Kind::Unary(Unary::Sqrt)),
    op("rsqrt", 1, Kind::Unary(Unary::Rsqrt)),
    op("recip", 1, Kind::Unary(Unary::Recip)),
    op("abs", 1, Kind::Unary(Unary::Abs)),
    op("tanh", 1, Kind::Unary(Unary::Tanh)),
    op("sigmoid", 1, Kind::Unary(Unary::Sigmoid)),
    op("relu", 1, Kind::Unary(Unary::Relu)),
    op("gelu", 1, Kind::Unary(Unary::Gelu)),
    op("gelu_tanh", 1, Kind::Unary(Unary::GeluTanh)),
    op("silu", 1, Kind::Unary(Unary::Silu)),
    op("erf", 1, Kind::Unary(Unary::Erf)),
    op("sin", 1, Kind::Unary(Unary::Sin)),
    op("cos", 1, Kind::Unary(Unary::Cos)),
    op("square", 1, Kind::Unary(Unary::Square)),
    op("floor", 1, Kind::Unary(Unary::Floor)),
    op("ceil", 1, Kind::Unary(Unary::Ceil)),
    op("round", 1, Kind::Unary(Unary::Round)),
    op("trunc", 1, Kind::Unary(Unary::Trunc)),
    op("not", 1, Kind::Unary(Unary::Not)),
    op("+", 2, Kind::Binary(Binary::Add)),
    op("-", 2, Kind::Binary(Binary::Sub)),
    op("*", 2, Kind::Binary(Binary::Mul)),
    op("/", 2, Kind::Binary(Binary::Div)),
    op("pow", 2, Kind::Binary(Binary::Pow)),
    op("max", 2, Kind::Binary(Binary::Max)),
    op("min", 2, Kind::Binary(Binary::Min)),
    op("<", 2, Kind::Binary(Binary::Lt)),
    op("<=", 2, Kind::Binary(Binary::Le)),
    op(">", 2, Kind::Binary(Binary::Gt)),
    op(">=", 2, Kind::Binary(Binary::Ge)),
    op("==", 2, Kind::Binary(Binary::Eq)),
    op("!=", 2, Kind::Binary(Binary::Ne)),
    op("sum", 2, Kind::Reduce(Reduce::Sum)),
    op("mean", 2, Kind::Reduce(Reduce::Mean)),
    op("amax", 2, Kind::Reduce(Reduce::Amax)),
    op("amin", 2, Kind::Reduce(Reduce::Amin)),
    op("where", 3, Kind::Where),
    op("cast", 2, Kind::Cast),
    op("transpose", 3, Kind::Transpose),
    op("reshape", 2, Kind::Reshape),
    op("broadcast", 2, Kind::Broadcast),
    op("@", 2, Kind::MatMul),
    op("iota", 1, Kind::Iota),
    op("onehot", 2, Kind::OneHot),
    op("dropout", 3, Kind::Dropout),
    op("softmax", 2, Kind::Composite(Composite::Softmax)),
    op("log_softmax", 2, Kind::Composite(Composite::LogSoftmax)),
    op("layernorm", 4, Kind::Composite(Composite::LayerNorm)),
    op("rmsnorm", 3, Kind::Composite(Composite::RmsNorm)),
    op("cross_entropy", 2, Kind::Composite(Composite::CrossEntropy)),
    op("attention", 5, Kind::Composite(Composite::Attention)),
    op("attention_bias", 6, Kind::Composite(Composite::AttentionBias)),
    op("attention_lse", 4, Kind::Composite(Composite::AttentionLse)),
    op("attention_grad_q", 8, Kind::Composite(Composite::AttentionGrad(AttnArg::Q))),
    op("attention_grad_k", 8, Kind::Composite(Composite::AttentionGrad(AttnArg::K))),
    op("attention_grad_v", 8, Kind::Composite(Composite::AttentionGrad(AttnArg::V))),
    op("attention_bias_lse", 5, Kind::Composite(Composite::AttentionBiasLse)),
    op("attention_bias_grad_q", 9, Kind::Composite(Composite::AttentionBiasGrad(AttnArg::Q))),
    op("attention_bias_grad_k", 9, Kind::Composite(Composite::AttentionBiasGrad(AttnArg::K))),
    op("attention_bias_grad_v", 9, Kind::Composite(Composite::AttentionBiasGrad(AttnArg::V))),
    op("attention_dropout", 7, Kind::Composite(Composite::AttentionDropout)),
    op("attention_bias_dropout", 8, Kind::Composite(Composite::AttentionBiasDropout)),
    op("attention_dropout_grad_q", 10, Kind::Composite(Composite::AttentionDropoutGrad(AttnArg::Q))),
    op("attention_dropout_grad_k", 10, Kind::Composite(Composite::AttentionDropoutGrad(AttnArg::K))),
    op("attention_dropout_grad_v", 10, Kind::Composite(Composite::AttentionDropoutGrad(AttnArg::V))),
    op("attention_bias_dropout_grad_q", 11, Kind::Composite(Composite::AttentionBiasDropoutGrad(AttnArg::Q))),
    op("attention_bias_dropout_grad_k", 11, Kind::Composite(Composite::AttentionBiasDropoutGrad(AttnArg::K))),
    op("attention_bias_dropout_grad_v", 11, Kind::Composite(Composite::AttentionBiasDropoutGrad(AttnArg::V))),
    op("grad", 2, Kind::Grad),
    op("gather", 3, Kind::Gather),
    op("scatter_add", 4, Kind::ScatterAdd),
    op("slice", 5, Kind::Slice),
    op("concat", 3, Kind::Concat),
];

/// Index into [`OPS`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct OpCode(u8);

impl OpCode {
    pub fn info(self) -> &'static OpInfo {
        &OPS[self.0 as usize]
    }
    pub fn name(self) -> &'static str {
        self.info().name
    }
    pub fn kind(self) -> Kind {
        self.info().kind
    }
    /// Looks an operator up by its spelling.
    pub fn from_name(name: &str) -> Option<OpCode> {
        OPS.iter().position(|o| o.name == name).map(|i| OpCode(i as u8))
    }
    /// The operator of a given kind (every kind has exactly one spelling).
    pub fn of(kind: Kind) -> OpCode {
        OpCode(OPS.iter().position(|o| o.kind == kind).expect("every kind is in OPS") as u8)
    }
}

/// An f64 constant that is hashable and totally ordered (by bits; NaN is rejected by the parser).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Num(u64);

impl Num {
    pub fn new(v: f64) -> Num {
        // Normalise -0.0 to 0.0 so that equal constants hash-cons to one e-node.
        Num(if v == 0.0 { 0.0f64 } else { v }.to_bits())
    }
    pub fn value(self) -> f64 {
        f64::from_bits(self.0)
    }
}

impl fmt::Display for Num {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        let v = self.value();
        if v.fract() == 0.0 && v.abs() < 1e15 {
            write!(f, "{}", v as i64)
        } else {
            write!(f, "{v:?}")
        }
    }
}

/// A literal shape `[4,1024]`, the attribute of `reshape` and `broadcast`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Dims(pub Vec<usize>);

impl fmt::Display for Dims {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "[")?;
        for (i, d) in self.0.iter().enumerate() {
            if i > 0 {
                write!(f, ",")?;
            }
            write!(f, "{d}")?;
        }
        write!(f, "]")
    }
}

impl FromStr for Dims {
    type Err = ();
    fn from_str(s: &str) -> Result<Dims, ()> {
        let inner = s.strip_prefix('[').and_then(|s| s.strip_suffix(']')).ok_or(())?;
        if inner.is_empty() {
            return Ok(Dims(vec![]));
        }
        inner.split(',').map(|d| d.trim().parse::<usize>().map_err(|_| ())).collect::<Result<_, _>>().map(Dims)
    }
}

/// One e-node of `TensorLang`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TensorLang {
    /// A scalar constant (weakly typed: it takes the dtype of the tensor it meets).
    Num(Num),
    /// A program input, by name.
    Var(Symbol),
    /// A literal shape (attribute).
    Dims(Dims),
    /// A literal dtype (attribute of `cast`).
    Type(DType),
    /// An operator applied to children.
    Op(OpCode, Vec<Id>),
}

impl TensorLang {
    pub fn op(code: OpCode, children: Vec<Id>) -> TensorLang {
        TensorLang::Op(code, children)
    }
    pub fn num(v: f64) -> TensorLang {
        TensorLang::Num(Num::new(v))
    }
    /// The operator of an `Op` node.
    pub fn opcode(&self) -> Option<OpCode> {
        match self {
            TensorLang::Op(c, _) => Some(*c),
            _ => None,
        }
    }
    /// The spelling of this node's head.
    pub fn head(&self) -> String {
        match self {
            TensorLang::Num(n) => n.to_string(),
            TensorLang::Var(s) => s.to_string(),
            TensorLang::Dims(d) => d.to_string(),
            TensorLang::Type(t) => t.to_string(),
            TensorLang::Op(c, _) => c.name().to_string(),
        }
    }
}

impl Language for TensorLang {
    type Discriminant = (std::mem::Discriminant<TensorLang>, Option<OpCode>);

    fn discriminant(&self) -> Self::Discriminant {
        (std::mem::discriminant(self), self.opcode())
    }

    fn matches(&self, other: &Self) -> bool {
        match (self, other) {
            (TensorLang::Op(a, ac), TensorLang::Op(b, bc)) => a == b && ac.len() == bc.len(),
            (a, b) => a == b,
        }
    }

    fn children(&self) -> &[Id] {
        match self {
            TensorLang::Op(_, c) => c,
            _ => &[],
        }
    }

    fn children_mut(&mut self) -> &mut [Id] {
        match self {
            TensorLang::Op(_, c) => c,
            _ => &mut [],
        }
    }
}

impl fmt::Display for TensorLang {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str(&self.head())
    }
}

/// Error for an s-expression head that is not a `TensorLang` node.
#[derive(Debug, Clone)]
pub struct FromOpError(pub String);

impl fmt::Display for FromOpError {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for FromOpError {}

impl egg::FromOp for TensorLang {
    type Error = FromOpError;

    fn from_op(op: &str, children: Vec<Id>) -> Result<Self, Self::Error> {
        if let Some(code) = OpCode::from_name(op) {
            let arity = code.info().arity;
            if children.len() != arity {
                return Err(FromOpError(format!("`{op}` takes {arity} arguments, got {}", children.len())));
            }
            return Ok(TensorLang::Op(code, children));
        }
        if !children.is_empty() {
            return Err(FromOpError(format!("unknown operator `{op}`")));
        }
        if let Ok(v) = op.parse::<f64>() {
            if v.is_finite() {
                return Ok(TensorLang::num(v));
            }
        }
        if let Ok(d) = op.parse::<Dims>() {
            return Ok(TensorLang::Dims(d));
        }
        if let Ok(t) = op.parse::<DType>() {
            return Ok(TensorLang::Type(t));
        }
        if is_identifier(op) {
            return Ok(TensorLang::Var(Symbol::from(op)));
        }
        Err(FromOpError(format!("`{op}` is not an operator, number, shape, dtype or name")))
    }
}

/// Names of inputs and bindings: a letter or `_`, then letters, digits and `_`.
pub fn is_identifier(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

#[cfg(test)]
mod tests {
    use super::*;
    use egg::RecExpr;

    #[test]
    fn every_op_name_is_unique_and_round_trips() {
        for (i, o) in OPS.iter().enumerate() {
            assert_eq!(OpCode::from_name(o.name), Some(OpCode(i as u8)), "{}", o.name);
        }
    }

    #[test]
    fn sexpr_round_trip() {
        let s = "(sum (* (exp x) 2.5) -1)";
        let e: RecExpr<TensorLang> = s.parse().unwrap();
        assert_eq!(e.to_string(), s);
        let r: RecExpr<TensorLang> = "(reshape (cast y bf16) [4,1024])".parse().unwrap();
        assert_eq!(r.to_string(), "(reshape (cast y bf16) [4,1024])");
    }
}
