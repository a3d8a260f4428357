//! The meaning of every pointwise operator on f64 scalars.
//!
//! The reference interpreter, constant folding and the rule soundness tests all evaluate through
//! this one table, so a pointwise op has exactly one definition on the CPU.

use crate::lang::{Binary, Unary};

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

/// Applies a binary op. Integer division truncates when `int` is set.
pub fn binary(op: Binary, a: f64, b: f64, int: bool) -> f64 {
    match op {
        Binary::Add => a + b,
        Binary::Sub => a - b,
        Binary::Mul => a * b,
        Binary::Div if int => {
            if b == 0.0 {
                0.0
            } else {
                (a / b).trunc()
            }
        }
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
