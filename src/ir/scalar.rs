//! The meaning of every pointwise operator on f64 scalars.
//!
//! The reference interpreter, constant folding and the rule soundness tests all evaluate through
//! this one table, so a pointwise op has exactly one definition on the CPU.

use crate::ir::lang::{Binary, Unary};

/// `gelu` (erf form).
pub fn gelu(x: f64) -> f64 {
    0.5 * x * (1.0 + libm::erf(x / std::f64::consts::SQRT_2))
}

/// `gelu_tanh` (the tanh approximation).
pub fn gelu_tanh(x: f64) -> f64 {
    let c = (2.0 / std::f64::consts::PI).sqrt();
    0.5 * x * (1.0 + (c * (x + 0.044715 * x * x * x)).tanh())
}

pub fn sigmoid(x: f64) -> f64 {
    if x >= 0.0 {
        1.0 / (1.0 + (-x).exp())
    } else {
        let e = x.exp();
        e / (1.0 + e)
    }
}

/// Applies a unary op.
pub fn unary(op: Unary, x: f64) -> f64 {
    match op {
        Unary::Neg => -x,
        Unary::Exp => x.exp(),
        Unary::Log => x.ln(),
        Unary::Sqrt => x.sqrt(),
        Unary::Rsqrt => 1.0 / x.sqrt(),
        Unary::Recip => 1.0 / x,
        Unary::Abs => x.abs(),
        Unary::Tanh => x.tanh(),
        Unary::Sigmoid => sigmoid(x),
        Unary::Relu => {
            if x > 0.0 {
                x
            } else {
                0.0
            }
        }
        Unary::Gelu => gelu(x),
        Unary::GeluTanh => gelu_tanh(x),
        Unary::Silu => x * sigmoid(x),
        Unary::Erf => libm::erf(x),
        Unary::Sin => x.sin(),
        Unary::Cos => x.cos(),
        Unary::Square => x * x,
        Unary::Floor => x.floor(),
        Unary::Ceil => x.ceil(),
        Unary::Round => x.round_ties_even(),
        Unary::Trunc => x.trunc(),
        Unary::Not => bool_f(x == 0.0),
    }
}

fn bool_f(b: bool) -> f64 {
    if b {
        1.0
    } else {
        0.0
    }
}

/// Two's-complement wrap of an integer value to i32, as i32 arithmetic in NumPy and CUDA
/// wraps (`2147483647 + 1` is `-2147483648`); a fraction is truncated first, a non-finite value
/// is 0. Conversions from floats saturate instead (`DType::round`, as CUDA's conversion does).
pub fn wrap_i32(v: f64) -> f64 {
    if !v.is_finite() {
        return 0.0;
    }
    let m = v.trunc().rem_euclid(4294967296.0);
    if m >= 2147483648.0 {
        m - 4294967296.0
    } else {
        m
    }
}

/// Applies a binary op. With `int` set (i32 operands), `+ - * /` wrap as two's complement
/// (operands wrapped first: a weak literal folded beyond i32 means its wrapped value, so folding
/// literals before or after they meet an i32 tensor agrees), division truncates and a division
/// by zero is 0; `pow` is computed in floats and converted, saturating.
pub fn binary(op: Binary, a: f64, b: f64, int: bool) -> f64 {
    let i = |v: f64| wrap_i32(v) as i32;
    match op {
        Binary::Add if int => i(a).wrapping_add(i(b)) as f64,
        Binary::Sub if int => i(a).wrapping_sub(i(b)) as f64,
        Binary::Mul if int => i(a).wrapping_mul(i(b)) as f64,
        Binary::Div if int && i(b) == 0 => 0.0,
        Binary::Div if int => i(a).wrapping_div(i(b)) as f64,
        Binary::Add => a + b,
        Binary::Sub => a - b,
        Binary::Mul => a * b,
        Binary::Div => a / b,
        Binary::Pow => a.powf(b),
        Binary::Max => {
            if a.is_nan() || b.is_nan() {
                f64::NAN
            } else {
                a.max(b)
            }
        }
        Binary::Min => {
            if a.is_nan() || b.is_nan() {
                f64::NAN
            } else {
                a.min(b)
            }
        }
        Binary::Lt => bool_f(a < b),
        Binary::Le => bool_f(a <= b),
        Binary::Gt => bool_f(a > b),
        Binary::Ge => bool_f(a >= b),
        Binary::Eq => bool_f(a == b),
        Binary::Ne => bool_f(a != b),
    }
}
