//! `Tensor`: a dense, row-major array of values held as f64, the currency of the CPU reference.
//!
//! Invariant: `data.len()` is the product of `shape`, and every value is already rounded to
//! `dtype` (`DType::round`), so an f32 tensor holds only f32 values, an i32 tensor only
//! integers and a bool tensor only 0 and 1. The constructors enforce both; the one exception is
//! a weak scalar literal inside the interpreter, which keeps its exact f64 value until it meets
//! a typed tensor.

use std::borrow::Cow;
use std::fmt;

use crate::error::{Error, Result};
use crate::ir::infer::broadcast_shapes;
use crate::ir::lang::Dims;
use crate::ir::types::{DType, TensorType};

/// The most elements one tensor of the CPU reference may have: 2^31, 16 GiB as f64. Programs
/// may declare far larger tensors and still be planned ([`crate::ir::program::MAX_ELEMENTS`]); only
/// evaluating them on the CPU is refused, before anything is allocated.
pub const MAX_CPU_ELEMENTS: usize = 1 << 31;

/// Refuses a tensor of type `ty` the CPU reference cannot hold; `what` names it in the error.
pub fn check_cpu_size(what: &str, ty: &TensorType) -> Result<()> {
    match ty.shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d)) {
        Some(n) if n <= MAX_CPU_ELEMENTS => Ok(()),
        n => Err(Error::Invalid(format!(
            "{what} ({ty}) has {} elements, more than the CPU reference holds (2^31, 16 GiB as f64)",
            n.map_or("over 2^64".to_string(), |n| n.to_string())
        ))),
    }
}

/// A dense tensor, row-major, values stored as f64 and rounded to `dtype`.
#[derive(Clone, Debug, PartialEq)]
pub struct Tensor {
    pub dtype: DType,
    pub shape: Vec<usize>,
    pub data: Vec<f64>,
}

impl Tensor {
    /// A tensor from values, rounding each to `dtype`. Errors if the length disagrees with the shape.
    pub fn new(dtype: DType, shape: Vec<usize>, mut data: Vec<f64>) -> Result<Tensor> {
        let n: usize = shape.iter().product();
        if data.len() != n {
            return Err(Error::Invalid(format!(
                "a tensor of shape {} needs {n} values, got {}",
                Dims(shape),
                data.len()
            )));
        }
        for v in &mut data {
            *v = dtype.round(*v);
        }
        Ok(Tensor { dtype, shape, data })
    }

    /// A tensor of one repeated value.
    pub fn full(ty: &TensorType, v: f64) -> Tensor {
        Tensor { dtype: ty.dtype, shape: ty.shape.clone(), data: vec![ty.dtype.round(v); ty.numel()] }
    }

    pub fn zeros(ty: &TensorType) -> Tensor {
        Tensor::full(ty, 0.0)
    }

    /// A rank-0 tensor.
    pub fn scalar(dtype: DType, v: f64) -> Tensor {
        Tensor { dtype, shape: vec![], data: vec![dtype.round(v)] }
    }

    /// A tensor whose element at each flat (row-major) index is `f(index)`, rounded to `dtype`.
    pub fn from_fn(ty: &TensorType, f: impl FnMut(usize) -> f64) -> Tensor {
        let data = (0..ty.numel()).map(f).map(|v| ty.dtype.round(v)).collect();
        Tensor { dtype: ty.dtype, shape: ty.shape.clone(), data }
    }

    pub fn ty(&self) -> TensorType {
        TensorType::new(self.dtype, self.shape.clone())
    }

    pub fn numel(&self) -> usize {
        self.data.len()
    }

    pub fn rank(&self) -> usize {
        self.shape.len()
    }

    /// The flat offset of a multi-index, or `None` if it is out of range or of the wrong rank.
    pub fn offset(&self, index: &[usize]) -> Option<usize> {
        if index.len() != self.shape.len() || index.iter().zip(&self.shape).any(|(i, d)| i >= d) {
            return None;
        }
        Some(index.iter().zip(contiguous_strides(&self.shape)).map(|(i, s)| i * s).sum())
    }

    /// The element at a multi-index.
    pub fn get(&self, index: &[usize]) -> Option<f64> {
        self.offset(index).map(|o| self.data[o])
    }

    /// The same values viewed with another shape of equal size.
    pub fn reshape(&self, shape: Vec<usize>) -> Result<Tensor> {
        if shape.iter().product::<usize>() != self.numel() {
            return Err(Error::Invalid(format!("cannot reshape {} to {}", Dims(self.shape.clone()), Dims(shape))));
        }
        Ok(Tensor { dtype: self.dtype, shape, data: self.data.clone() })
    }

    /// NumPy broadcast to `shape` (copies; see [`Tensor::broadcast_data`] to avoid the copy).
    pub fn broadcast_to(&self, shape: &[usize]) -> Result<Tensor> {
        let data = self.broadcast_data(shape)?.into_owned();
        Ok(Tensor { dtype: self.dtype, shape: shape.to_vec(), data })
    }

    /// The values broadcast to `shape`, borrowed when no copy is needed.
    pub fn broadcast_data(&self, shape: &[usize]) -> Result<Cow<'_, [f64]>> {
        let joined = broadcast_shapes(&self.shape, shape).map_err(Error::Invalid)?;
        if joined != shape {
            return Err(Error::Invalid(format!(
                "cannot broadcast {} to {}",
                Dims(self.shape.clone()),
                Dims(shape.to_vec())
            )));
        }
        if self.shape == shape {
            return Ok(Cow::Borrowed(&self.data));
        }
        if self.numel() == 1 {
            return Ok(Cow::Owned(vec![self.data[0]; shape.iter().product()]));
        }
        Ok(Cow::Owned(gather(&self.data, shape, &broadcast_strides(&self.shape, shape))))
    }

    /// Swaps two axes (a copy in the new row-major order).
    pub fn transpose(&self, a: usize, b: usize) -> Result<Tensor> {
        if a >= self.rank() || b >= self.rank() {
            return Err(Error::Invalid(format!("cannot swap axes {a} and {b} of a rank-{} tensor", self.rank())));
        }
        let mut strides = contiguous_strides(&self.shape);
        let mut shape = self.shape.clone();
        strides.swap(a, b);
        shape.swap(a, b);
        let data = gather(&self.data, &shape, &strides);
        Ok(Tensor { dtype: self.dtype, shape, data })
    }

    /// Compares values with `other` (the reference) elementwise; see [`Comparison`].
    pub fn compare(&self, other: &Tensor, rtol: f64, atol: f64) -> Comparison {
        Comparison::of(self, other, rtol, atol)
    }

    /// Whether every element satisfies `|a - b| <= atol + rtol * |b|`, with `b` from `other` (the
    /// reference). Shapes must be equal; dtypes are not compared. NaN equals NaN at the same
    /// place and differs from any number; an infinity equals only the same infinity.
    pub fn allclose(&self, other: &Tensor, rtol: f64, atol: f64) -> bool {
        self.compare(other, rtol, atol).ok()
    }

    /// The largest `|a - b| / max(|a|, |b|)` over elements (0 where both are equal, infinity on a
    /// NaN against a number or on a shape mismatch).
    pub fn max_rel_error(&self, other: &Tensor) -> f64 {
        self.compare(other, 0.0, 0.0).max_rel
    }

    /// Minimum, maximum and mean over the finite elements, and counts of the others.
    pub fn summary(&self) -> Summary {
        Summary::of(&self.data)
    }
}

/// The tolerance `(rtol, atol)` a result of this dtype is checked with against the f64
/// reference: f32 within 1e-5 relative, f16 and bf16 within 1e-2, integers and bools exactly.
pub fn tolerance(dtype: DType) -> (f64, f64) {
    match dtype {
        DType::F32 => (1e-5, 1e-5),
        DType::F16 | DType::Bf16 => (1e-2, 1e-2),
        DType::I32 | DType::Bool => (0.0, 0.0),
    }
}

/// The result of comparing a tensor against a reference.
#[derive(Clone, Debug, PartialEq)]
pub struct Comparison {
    /// Whether the shapes agree; when they do not, nothing else is meaningful.
    pub same_shape: bool,
    /// Elements outside the tolerance.
    pub mismatches: usize,
    /// The first mismatching flat index with its value and the reference value.
    pub first_mismatch: Option<(usize, f64, f64)>,
    /// Largest absolute difference over elements that are both finite.
    pub max_abs: f64,
    /// Largest `|a - b| / max(|a|, |b|)`; infinity for a NaN or infinity mismatch.
    pub max_rel: f64,
}

impl Comparison {
    fn of(a: &Tensor, b: &Tensor, rtol: f64, atol: f64) -> Comparison {
        let mut c = Comparison {
            same_shape: a.shape == b.shape,
            mismatches: 0,
            first_mismatch: None,
            max_abs: 0.0,
            max_rel: 0.0,
        };
        if !c.same_shape {
            c.max_abs = f64::INFINITY;
            c.max_rel = f64::INFINITY;
            return c;
        }
        for (i, (&x, &y)) in a.data.iter().zip(&b.data).enumerate() {
            let (abs, rel) = element_error(x, y);
            c.max_abs = c.max_abs.max(abs);
            c.max_rel = c.max_rel.max(rel);
            if !element_close(x, y, rtol, atol) {
                c.mismatches += 1;
                c.first_mismatch.get_or_insert((i, x, y));
            }
        }
        c
    }

    /// Whether the shapes agree and no element mismatches.
    pub fn ok(&self) -> bool {
        self.same_shape && self.mismatches == 0
    }
}

impl fmt::Display for Comparison {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        if !self.same_shape {
            return write!(f, "shapes differ");
        }
        write!(
            f,
            "{} mismatches, max abs error {:.3e}, max rel error {:.3e}",
            self.mismatches, self.max_abs, self.max_rel
        )?;
        if let Some((i, x, y)) = self.first_mismatch {
            write!(f, " (first at flat index {i}: {x} against reference {y})")?;
        }
        Ok(())
    }
}

/// Absolute and relative error of one element; infinities where NaN or infinity disagree.
fn element_error(x: f64, y: f64) -> (f64, f64) {
    if x == y || (x.is_nan() && y.is_nan()) {
        return (0.0, 0.0);
    }
    if !x.is_finite() || !y.is_finite() {
        return (f64::INFINITY, f64::INFINITY);
    }
    let abs = (x - y).abs();
    (abs, abs / x.abs().max(y.abs()))
}

fn element_close(x: f64, y: f64, rtol: f64, atol: f64) -> bool {
    if x == y || (x.is_nan() && y.is_nan()) {
        return true;
    }
    x.is_finite() && y.is_finite() && (x - y).abs() <= atol + rtol * y.abs()
}

/// A few statistics of a tensor for a terminal report.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Summary {
    /// Number of elements.
    pub count: usize,
    pub min: f64,
    pub max: f64,
    pub mean: f64,
    /// Elements that are NaN.
    pub nans: usize,
    /// Elements that are infinite.
    pub infs: usize,
}

impl Summary {
    fn of(data: &[f64]) -> Summary {
        let (mut min, mut max, mut sum, mut n) = (f64::INFINITY, f64::NEG_INFINITY, 0.0, 0usize);
        let (mut nans, mut infs) = (0, 0);
        for &v in data {
            if v.is_nan() {
                nans += 1;
            } else if v.is_infinite() {
                infs += 1;
            } else {
                min = min.min(v);
                max = max.max(v);
                sum += v;
                n += 1;
            }
        }
        let count = data.len();
        if n == 0 {
            return Summary { count, min: f64::NAN, max: f64::NAN, mean: f64::NAN, nans, infs };
        }
        Summary { count, min, max, mean: sum / n as f64, nans, infs }
    }
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        match self.count {
            0 => return write!(f, "empty"),
            1 if self.nans + self.infs == 0 => return write!(f, "value {}", short(self.min)),
            // No finite element: no min, max or mean to show (they would read NaN).
            n if self.nans + self.infs == n => write!(f, "no finite value")?,
            _ => write!(f, "min {} max {} mean {}", short(self.min), short(self.max), short(self.mean))?,
        }
        if self.nans > 0 {
            write!(f, ", {} NaN", self.nans)?;
        }
        if self.infs > 0 {
            write!(f, ", {} inf", self.infs)?;
        }
        Ok(())
    }
}

/// A number in about 6 significant digits, without trailing zeros.
fn short(v: f64) -> String {
    if v == v.trunc() && v.abs() < 1e9 {
        return format!("{v}");
    }
    if v.abs() >= 1e5 || v.abs() < 1e-3 {
        return format!("{v:.4e}");
    }
    let digits = (5 - v.abs().log10().floor() as i32).max(0) as usize;
    let s = format!("{v:.digits$}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// Row-major strides (in elements) of a shape.
pub fn contiguous_strides(shape: &[usize]) -> Vec<usize> {
    let mut strides = vec![1; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        strides[i] = strides[i + 1] * shape[i + 1];
    }
    strides
}

/// Strides that read a tensor of shape `src` as if broadcast to `out` (NumPy rules, aligned on
/// the right): a broadcast axis gets stride 0. The caller has checked that `src` broadcasts.
pub fn broadcast_strides(src: &[usize], out: &[usize]) -> Vec<usize> {
    let own = contiguous_strides(src);
    let lead = out.len() - src.len();
    (0..out.len()).map(|i| if i < lead || src[i - lead] == 1 { 0 } else { own[i - lead] }).collect()
}

/// Copies `src` read with `strides` (in elements) into a new row-major array of `shape`; this
/// one routine serves broadcasting, transposition and Fortran-order loading.
pub fn gather(src: &[f64], shape: &[usize], strides: &[usize]) -> Vec<f64> {
    let mut out = Vec::with_capacity(shape.iter().product());
    if shape.iter().all(|&d| d > 0) {
        gather_into(&mut out, src, shape, strides, 0);
    }
    out
}

fn gather_into(out: &mut Vec<f64>, src: &[f64], shape: &[usize], strides: &[usize], base: usize) {
    match (shape, strides) {
        ([], _) => out.push(src[base]),
        ([n], [1]) => out.extend_from_slice(&src[base..base + n]),
        ([n], [0]) => out.extend(std::iter::repeat_n(src[base], *n)),
        ([n], [s]) => out.extend((0..*n).map(|i| src[base + i * s])),
        _ => {
            for i in 0..shape[0] {
                gather_into(out, src, &shape[1..], &strides[1..], base + i * strides[0]);
            }
        }
    }
}

/// For every flat index of `out`, the flat index of `src` it reads under broadcasting.
pub fn broadcast_index_map(src: &[usize], out: &[usize]) -> Vec<usize> {
    let ids: Vec<f64> = (0..src.iter().product::<usize>()).map(|i| i as f64).collect();
    gather(&ids, out, &broadcast_strides(src, out)).into_iter().map(|v| v as usize).collect()
}

/// Splits a shape around `axis` into (product before, size of axis, product after).
pub fn split_axis(shape: &[usize], axis: usize) -> (usize, usize, usize) {
    let outer = shape[..axis].iter().product();
    let inner = shape[axis + 1..].iter().product();
    (outer, shape[axis], inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(shape: &[usize], data: &[f64]) -> Tensor {
        Tensor::new(DType::F32, shape.to_vec(), data.to_vec()).unwrap()
    }

    #[test]
    fn construction_checks_length_and_rounds() {
        assert!(Tensor::new(DType::F32, vec![2, 2], vec![1.0; 3]).is_err());
        let x = Tensor::new(DType::I32, vec![2], vec![1.7, -2.2]).unwrap();
        assert_eq!(x.data, vec![1.0, -2.0]);
        assert_eq!(Tensor::new(DType::F32, vec![], vec![0.1]).unwrap().data[0], 0.1f32 as f64);
    }

    #[test]
    fn indexing() {
        let x = t(&[2, 3], &[0., 1., 2., 3., 4., 5.]);
        assert_eq!(x.get(&[1, 2]), Some(5.0));
        assert_eq!(x.get(&[2, 0]), None);
        assert_eq!(x.get(&[1]), None);
        assert_eq!(contiguous_strides(&[2, 3, 4]), vec![12, 4, 1]);
    }

    #[test]
    fn broadcasting_and_transpose() {
        let col = t(&[2, 1], &[1., 2.]);
        assert_eq!(col.broadcast_to(&[3, 2, 2]).unwrap().data, [1., 1., 2., 2.].repeat(3));
        let row = t(&[3], &[1., 2., 3.]);
        assert_eq!(row.broadcast_to(&[2, 3]).unwrap().data, vec![1., 2., 3., 1., 2., 3.]);
        assert!(row.broadcast_to(&[2, 2]).is_err());
        let x = t(&[2, 3], &[0., 1., 2., 3., 4., 5.]);
        let xt = x.transpose(0, 1).unwrap();
        assert_eq!(xt.shape, vec![3, 2]);
        assert_eq!(xt.data, vec![0., 3., 1., 4., 2., 5.]);
        assert_eq!(broadcast_index_map(&[2, 1], &[2, 3]), vec![0, 0, 0, 1, 1, 1]);
    }

    #[test]
    fn comparison() {
        let a = t(&[3], &[1.0, f64::NAN, 3.0]);
        let b = t(&[3], &[1.0 + 1e-7, f64::NAN, 3.0]);
        assert!(a.allclose(&b, 1e-5, 0.0));
        let c = t(&[3], &[1.0, 2.0, 3.0]);
        assert!(!a.allclose(&c, 1e-5, 1e-5));
        assert_eq!(a.max_rel_error(&c), f64::INFINITY);
        assert!(!a.allclose(&t(&[1, 3], &[1.0, 2.0, 3.0]), 1.0, 1.0));
        let cmp = c.compare(&t(&[3], &[1.0, 2.5, 3.0]), 1e-5, 1e-5);
        assert_eq!(cmp.mismatches, 1);
        assert_eq!(cmp.first_mismatch, Some((1, 2.0, 2.5)));
        assert!((cmp.max_rel - 0.2).abs() < 1e-12);
    }

    #[test]
    fn summary() {
        let s = t(&[4], &[1.0, -3.0, f64::NAN, 6.0]).summary();
        assert_eq!((s.min, s.max, s.nans), (-3.0, 6.0, 1));
        assert!((s.mean - 4.0 / 3.0).abs() < 1e-12);
        assert_eq!(s.to_string(), "min -3 max 6 mean 1.33333, 1 NaN");
        assert_eq!(t(&[], &[2.5]).summary().to_string(), "value 2.5");
        assert_eq!(t(&[2], &[-21.125, 1e-7]).summary().to_string(), "min -21.125 max 1.0000e-7 mean -10.5625");
    }
}
