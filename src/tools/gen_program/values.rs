//! Values as the generator knows them: text, type, an interval and exactness, and the intervals
//! of the functions it applies.
//!
//! Invariant: every value of an [`E`] lies in `[lo, hi]` (for the reference evaluation on seeded
//! inputs, which the generator takes as lying in [-7, 7]).

use crate::ir::infer::broadcast_shapes;
use crate::ir::types::{DType, TensorType};

/// A value or expression as the generator knows it: its text, type, an interval holding every
/// value it takes, and whether it is exact (see the module docs).
#[derive(Clone, Debug)]
pub(super) struct E {
    pub(super) text: String,
    pub(super) ty: TensorType,
    pub(super) lo: f64,
    pub(super) hi: f64,
    pub(super) exact: bool,
    /// Whether the text needs no parentheses as an operand.
    pub(super) atomic: bool,
    /// A literal: a weak f32 scalar that takes the dtype of the tensor it meets.
    pub(super) literal: bool,
}

impl E {
    pub(super) fn literal(text: &str) -> E {
        let v: f64 = text.parse().expect("literal texts are numbers");
        E {
            text: text.to_string(),
            ty: TensorType::scalar(DType::F32),
            lo: v,
            hi: v,
            exact: true,
            atomic: v >= 0.0,
            literal: true,
        }
    }

    pub(super) fn mag(&self) -> f64 {
        self.lo.abs().max(self.hi.abs())
    }

    pub(super) fn dtype(&self) -> DType {
        self.ty.dtype
    }

    pub(super) fn rank(&self) -> usize {
        self.ty.rank()
    }

    pub(super) fn shape(&self) -> &[usize] {
        &self.ty.shape
    }

    pub(super) fn is_float(&self) -> bool {
        !self.literal && self.dtype().is_float()
    }

    pub(super) fn is_int(&self) -> bool {
        !self.literal && self.dtype() == DType::I32
    }

    pub(super) fn is_bool(&self) -> bool {
        !self.literal && self.dtype() == DType::Bool
    }

    /// The text as an operand of a binary operator.
    pub(super) fn operand(&self) -> String {
        if self.atomic {
            self.text.clone()
        } else {
            format!("({})", self.text)
        }
    }

    /// A copy with another text, type and interval (exactness kept unless said otherwise).
    pub(super) fn derive(&self, text: String, ty: TensorType, lo: f64, hi: f64, atomic: bool) -> E {
        E { text, ty, lo, hi, exact: self.exact, atomic, literal: false }
    }

    pub(super) fn with_exact(mut self, exact: bool) -> E {
        self.exact = exact;
        self
    }
}

/// A call `name(args)`; its type and interval are given.
pub(super) fn call(name: &str, args: &[String], ty: TensorType, lo: f64, hi: f64, exact: bool) -> E {
    E { text: format!("{name}({})", args.join(", ")), ty, lo, hi, exact, atomic: true, literal: false }
}

/// `a op b` with NumPy broadcasting; the dtype is the tensor operand's.
pub(super) fn binop(a: &E, op: &str, b: &E, lo: f64, hi: f64, exact: bool) -> E {
    let shape = broadcast_shapes(a.shape(), b.shape()).expect("operands were chosen to broadcast");
    let dtype = if a.literal { b.dtype() } else { a.dtype() };
    let dtype = if is_comparison(op) { DType::Bool } else { dtype };
    let text = format!("{} {op} {}", a.operand(), b.operand());
    E { text, ty: TensorType::new(dtype, shape), lo, hi, exact, atomic: false, literal: false }
}

pub(super) fn is_comparison(op: &str) -> bool {
    matches!(op, "<" | "<=" | ">" | ">=" | "==" | "!=")
}

pub(super) fn numel(shape: &[usize]) -> usize {
    shape.iter().product()
}

/// Whether two shapes broadcast to a tensor of at most `max` elements (what the generator may
/// hold).
pub(super) fn fits(a: &[usize], b: &[usize], max: usize) -> bool {
    broadcast_shapes(a, b).is_ok_and(|s| numel(&s) <= max)
}

pub(super) fn shape_text(shape: &[usize]) -> String {
    let items: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
    format!("[{}]", items.join(", "))
}

/// The interval of `f` over [lo, hi] for a monotone `f`.
pub(super) fn monotone(lo: f64, hi: f64, f: impl Fn(f64) -> f64) -> (f64, f64) {
    let (a, b) = (f(lo), f(hi));
    (a.min(b), a.max(b))
}

/// The interval of `f` at the corners of a box, for `f` monotone in each argument.
pub(super) fn corners(a: (f64, f64), b: (f64, f64), f: impl Fn(f64, f64) -> f64) -> (f64, f64) {
    let v = [f(a.0, b.0), f(a.0, b.1), f(a.1, b.0), f(a.1, b.1)];
    (v.iter().copied().fold(f64::INFINITY, f64::min), v.iter().copied().fold(f64::NEG_INFINITY, f64::max))
}

/// The interval of a smooth unary function; see `scalar.rs` for the functions themselves.
pub(super) fn unary_interval(name: &str, lo: f64, hi: f64) -> (f64, f64) {
    let m = lo.abs().max(hi.abs());
    match name {
        "neg" => (-hi, -lo),
        "abs" => (
            if lo >= 0.0 {
                lo
            } else if hi <= 0.0 {
                -hi
            } else {
                0.0
            },
            m,
        ),
        "relu" => (lo.max(0.0), hi.max(0.0)),
        "square" => (
            if lo >= 0.0 {
                lo * lo
            } else if hi <= 0.0 {
                hi * hi
            } else {
                0.0
            },
            m * m,
        ),
        "tanh" => monotone(lo, hi, f64::tanh),
        "sigmoid" => monotone(lo, hi, crate::ir::scalar::sigmoid),
        "erf" => monotone(lo, hi, libm::erf),
        // gelu, gelu_tanh and silu dip below 0 (to about -0.17 and -0.28) and stay under max(x, 0).
        "gelu" | "gelu_tanh" | "silu" => (-0.3, hi.max(0.0)),
        "sin" | "cos" => (-1.0, 1.0),
        "exp" => monotone(lo, hi, f64::exp),
        "log" => monotone(lo, hi, f64::ln),
        "sqrt" => monotone(lo, hi, f64::sqrt),
        "rsqrt" => monotone(lo, hi, |x| 1.0 / x.sqrt()),
        "recip" => monotone(lo, hi, |x| 1.0 / x),
        _ => unreachable!("unary_interval of `{name}`"),
    }
}

/// `a @ b` of the given type and interval.
pub(super) fn binop_matmul(a: &E, b: &E, ty: TensorType, lo: f64, hi: f64) -> E {
    E { text: format!("{} @ {}", a.operand(), b.operand()), ty, lo, hi, exact: false, atomic: false, literal: false }
}

/// The type of `x` reduced (keep-dims) along the axis written `axis`.
pub(super) fn reduced(x: &E, axis: &str) -> TensorType {
    let a: i64 = axis.parse().expect("axis texts are integers");
    let r = x.rank() as i64;
    let a = if a < 0 { a + r } else { a } as usize;
    let mut shape = x.shape().to_vec();
    shape[a] = 1;
    TensorType::new(x.dtype(), shape)
}
