//! Element types and tensor types (dtype plus shape).
//!
//! Invariant: a shape is a list of sizes, outermost first; `[]` is a scalar with one element.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// Element types a program may declare.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DType {
    F32,
    F16,
    Bf16,
    I32,
    Bool,
}

impl DType {
    pub const ALL: [DType; 5] = [DType::F32, DType::F16, DType::Bf16, DType::I32, DType::Bool];

    /// Bytes one element occupies in device memory.
    pub fn size(self) -> usize {
        match self {
            DType::F32 | DType::I32 => 4,
            DType::F16 | DType::Bf16 => 2,
            DType::Bool => 1,
        }
    }

    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F16 | DType::Bf16)
    }

    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::Bf16 => "bf16",
            DType::I32 => "i32",
            DType::Bool => "bool",
        }
    }

    /// Rounds an f64 to the nearest value this dtype can hold (the reference computes in f64 and
    /// stores in the declared dtype).
    pub fn round(self, v: f64) -> f64 {
        match self {
            DType::F32 => v as f32 as f64,
            DType::F16 => round_mantissa(v, 10, -14, 65504.0),
            DType::Bf16 => {
                if !v.is_finite() {
                    return v as f32 as f64;
                }
                // Round to nearest even on the top 16 bits of the f32.
                let bits = (v as f32).to_bits();
                let rounded = bits.wrapping_add(0x7fff + ((bits >> 16) & 1)) & 0xffff_0000;
                f32::from_bits(rounded) as f64
            }
            DType::I32 => {
                if v.is_nan() {
                    0.0
                } else {
                    v.trunc().clamp(i32::MIN as f64, i32::MAX as f64)
                }
            }
            DType::Bool => {
                if v != 0.0 {
                    1.0
                } else {
                    0.0
                }
            }
        }
    }
}

/// Rounds to a binary float with `mant` fraction bits, minimum normal exponent `emin`, and
/// largest finite value `max` (IEEE half precision: 10, -14, 65504).
fn round_mantissa(v: f64, mant: i32, emin: i32, max: f64) -> f64 {
    if !v.is_finite() || v == 0.0 {
        return v;
    }
    let e = v.abs().log2().floor().max(emin as f64) as i32;
    let quantum = 2f64.powi(e - mant);
    let r = (v / quantum).round_ties_even() * quantum;
    if r.abs() > max {
        f64::INFINITY.copysign(v)
    } else {
        r
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for DType {
    type Err = ();
    fn from_str(s: &str) -> Result<DType, ()> {
        DType::ALL.into_iter().find(|d| d.name() == s).ok_or(())
    }
}

/// A dtype and a shape.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TensorType {
    pub dtype: DType,
    pub shape: Vec<usize>,
}

impl TensorType {
    pub fn new(dtype: DType, shape: Vec<usize>) -> TensorType {
        TensorType { dtype, shape }
    }
    pub fn scalar(dtype: DType) -> TensorType {
        TensorType { dtype, shape: vec![] }
    }
    pub fn rank(&self) -> usize {
        self.shape.len()
    }
    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
    /// Bytes in device memory.
    pub fn bytes(&self) -> u64 {
        self.numel() as u64 * self.dtype.size() as u64
    }
}

impl fmt::Display for TensorType {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "{}{}", self.dtype, crate::ir::lang::Dims(self.shape.clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounding() {
        assert_eq!(DType::Bf16.round(1.0), 1.0);
        assert_eq!(DType::Bf16.round(1.0 + 1.0 / 512.0), 1.0);
        assert_eq!(DType::Bf16.round(1.0 + 3.0 / 256.0), 1.0 + 4.0 / 256.0);
        assert_eq!(DType::F16.round(1.0 + 1.0 / 4096.0), 1.0);
        assert_eq!(DType::F16.round(70000.0), f64::INFINITY);
        assert_eq!(DType::I32.round(-2.7), -2.0);
        assert_eq!(DType::Bool.round(0.3), 1.0);
    }
}
