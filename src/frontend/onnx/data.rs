//! Constant tensors of an ONNX model (initializers, `Constant` nodes): decoding their values and
//! mapping ONNX element types to eqfuse dtypes.
//!
//! Invariant: a [`Const`] holds exactly `product(shape)` values, checked before anything of that
//! size is allocated, so a model whose dims claim more data than it carries is an error, not an
//! allocation of the claimed size.

use std::io::{Read, Seek, SeekFrom};
use std::path::{Component, Path};

use super::proto::{data_type as dt, TensorProto};
use crate::ir::program::MAX_ELEMENTS;
use crate::ir::tensor::Tensor;
use crate::ir::types::DType;

/// A constant tensor, values as f64 (integers are exact up to 2^53, far beyond any shape).
#[derive(Clone, Debug, PartialEq)]
pub struct Const {
    /// The ONNX element type (`TensorProto.DataType`).
    pub elem: i32,
    pub shape: Vec<usize>,
    pub data: Vec<f64>,
}

impl Const {
    pub fn numel(&self) -> usize {
        self.data.len()
    }

    /// The values as integers, for shape and axis operands.
    pub fn ints(&self) -> Result<Vec<i64>, String> {
        if !matches!(self.elem, dt::INT64 | dt::INT32 | dt::INT16 | dt::INT8 | dt::UINT8 | dt::UINT16) {
            return Err(format!("expected an integer tensor, got one of {}", elem_name(self.elem)));
        }
        if self.shape.len() > 1 {
            return Err(format!("expected a list of integers, got a tensor of rank {}", self.shape.len()));
        }
        Ok(self.data.iter().map(|&v| v as i64).collect())
    }

    /// The eqfuse dtype that holds this tensor's values.
    pub fn dtype(&self) -> Result<DType, String> {
        dtype_of(self.elem)
    }

    /// The values as a reference tensor (rounded to the dtype).
    pub fn tensor(&self) -> Result<Tensor, String> {
        Tensor::new(self.dtype()?, self.shape.clone(), self.data.clone()).map_err(|e| e.to_string())
    }
}

/// The dtype of an ONNX element type. Integer types of up to 64 bits become `i32` (eqfuse's one
/// integer type: values beyond its range saturate); `double` and the rest are refused.
pub fn dtype_of(elem: i32) -> Result<DType, String> {
    match elem {
        dt::FLOAT => Ok(DType::F32),
        dt::FLOAT16 => Ok(DType::F16),
        dt::BFLOAT16 => Ok(DType::Bf16),
        dt::INT64 | dt::INT32 | dt::INT16 | dt::INT8 | dt::UINT8 | dt::UINT16 => Ok(DType::I32),
        dt::BOOL => Ok(DType::Bool),
        other => Err(format!(
            "element type {} is not supported (eqfuse holds f32, f16, bf16, integers as i32, and bool)",
            elem_name(other)
        )),
    }
}

/// The dtype a one-element constant of this element type takes as a literal: `double` scalars
/// are allowed here (a literal is f64 anyway) and read as f32.
pub fn scalar_dtype(elem: i32) -> Result<DType, String> {
    match elem {
        dt::DOUBLE => Ok(DType::F32),
        dt::UINT32 | dt::UINT64 => Ok(DType::I32),
        other => dtype_of(other),
    }
}

/// The ONNX spelling of an element type, for messages.
pub fn elem_name(elem: i32) -> String {
    let name = match elem {
        dt::FLOAT => "float",
        dt::UINT8 => "uint8",
        dt::INT8 => "int8",
        dt::UINT16 => "uint16",
        dt::INT16 => "int16",
        dt::INT32 => "int32",
        dt::INT64 => "int64",
        dt::BOOL => "bool",
        dt::FLOAT16 => "float16",
        dt::DOUBLE => "double",
        dt::UINT32 => "uint32",
        dt::UINT64 => "uint64",
        dt::BFLOAT16 => "bfloat16",
        8 => "string",
        other => return format!("type code {other}"),
    };
    name.to_string()
}

/// A checked shape from ONNX dims: every size non-negative and the product within bounds.
/// A constant may be empty (the shape `[]` of a `Reshape` to a scalar is a list of length 0);
/// a tensor the program computes with may not ([`nonempty`]).
pub fn shape_of(dims: &[i64]) -> Result<Vec<usize>, String> {
    let mut n: usize = 1;
    let mut shape = Vec::with_capacity(dims.len().min(64));
    for &d in dims {
        if d < 0 {
            return Err(format!("size {d} in shape {dims:?} is negative"));
        }
        n = n.checked_mul(d as usize).filter(|&n| n <= MAX_ELEMENTS).ok_or("the shape has more than 2^48 elements")?;
        shape.push(d as usize);
    }
    Ok(shape)
}

/// Refuses a shape with a zero size: eqfuse tensors are never empty.
pub fn nonempty(shape: &[usize]) -> Result<(), String> {
    if shape.contains(&0) {
        return Err(format!("shape {shape:?} is empty (a size is 0); eqfuse tensors are never empty"));
    }
    Ok(())
}

/// Decodes a tensor's values. Errors name what is wrong (external data that cannot be read, a
/// count mismatch). `folder` is the model's folder, where external data files are; `None` (a
/// model given as bytes alone) refuses external data.
pub fn decode(t: &TensorProto, folder: Option<&Path>) -> Result<Const, String> {
    let shape = shape_of(&t.dims)?;
    let n: usize = shape.iter().product();
    let data = if t.data_location == 1 {
        let raw = external_bytes(t, folder)?;
        raw_values(t.data_type, &raw, n)?
    } else if t.raw_data.is_empty() {
        typed_values(t, n)?
    } else {
        raw_values(t.data_type, &t.raw_data, n)?
    };
    if data.len() != n {
        return Err(format!("shape {:?} needs {n} values, the tensor holds {}", t.dims, data.len()));
    }
    Ok(Const { elem: t.data_type, shape, data })
}

/// The bytes of a tensor stored as external data: `length` bytes (or the rest of the file) at
/// `offset` of `location`, a file in the model's folder. A location that is absolute or leaves
/// the folder (`..`, a link out of it) and a range outside the file are refused, and the file's
/// size is checked before anything of the claimed length is allocated.
fn external_bytes(t: &TensorProto, folder: Option<&Path>) -> Result<Vec<u8>, String> {
    let entry = |key: &str| t.external_data.iter().rev().find(|e| e.key == key).map(|e| e.value.as_str());
    let number = |key: &str| -> Result<Option<u64>, String> {
        entry(key)
            .map(|v| v.trim().parse::<u64>().map_err(|_| format!("external data {key} `{v}` is not a byte count")))
            .transpose()
    };
    let location = entry("location").ok_or("its data is external, but no `location` names the file")?;
    let folder = folder.ok_or_else(|| {
        format!(
            "its data is in the external file `{location}`, and the model's folder is not known (load it from a file)"
        )
    })?;
    let rel = Path::new(location);
    let escapes = location.is_empty()
        || rel.is_absolute()
        || rel.components().any(|c| !matches!(c, Component::Normal(_) | Component::CurDir));
    if escapes {
        return Err(format!(
            "external data location `{location}` is not a file inside the model's folder (a relative path without `..`)"
        ));
    }
    let path = folder.join(rel);
    let open_err = |e: std::io::Error| format!("external data `{location}`: {e}");
    // A link inside the folder that points out of it is refused like a `..`.
    let (real, real_folder) = (path.canonicalize().map_err(open_err)?, folder.canonicalize().map_err(open_err)?);
    if !real.starts_with(&real_folder) {
        return Err(format!("external data location `{location}` leads out of the model's folder"));
    }
    let mut file = std::fs::File::open(&real).map_err(open_err)?;
    let meta = file.metadata().map_err(open_err)?;
    if !meta.is_file() {
        return Err(format!("external data location `{location}` is not a file"));
    }
    let size = meta.len();
    let offset = number("offset")?.unwrap_or(0);
    let length = match number("length")? {
        Some(l) => l,
        None => size.checked_sub(offset).unwrap_or(u64::MAX),
    };
    if offset.checked_add(length).is_none_or(|end| end > size) {
        return Err(format!(
            "external data `{location}`: bytes {offset} to {} are outside the file ({size} bytes)",
            offset.saturating_add(length)
        ));
    }
    let mut raw = vec![0u8; length as usize];
    file.seek(SeekFrom::Start(offset)).and_then(|_| file.read_exact(&mut raw)).map_err(open_err)?;
    Ok(raw)
}

/// Values from the typed field the element type uses.
fn typed_values(t: &TensorProto, n: usize) -> Result<Vec<f64>, String> {
    let count = |len: usize| {
        if len == n {
            Ok(())
        } else {
            Err(format!("shape {:?} needs {n} values, the tensor holds {len}", t.dims))
        }
    };
    match t.data_type {
        dt::FLOAT => count(t.float_data.len()).map(|_| t.float_data.iter().map(|&v| v as f64).collect()),
        dt::DOUBLE => count(t.double_data.len()).map(|_| t.double_data.clone()),
        dt::INT64 => count(t.int64_data.len()).map(|_| t.int64_data.iter().map(|&v| v as f64).collect()),
        dt::UINT32 | dt::UINT64 => {
            count(t.uint64_data.len()).map(|_| t.uint64_data.iter().map(|&v| v as f64).collect())
        }
        dt::FLOAT16 => count(t.int32_data.len()).map(|_| t.int32_data.iter().map(|&b| f16_bits(b as u16)).collect()),
        dt::BFLOAT16 => count(t.int32_data.len()).map(|_| t.int32_data.iter().map(|&b| bf16_bits(b as u16)).collect()),
        dt::INT32 | dt::INT16 | dt::INT8 | dt::UINT8 | dt::UINT16 | dt::BOOL => {
            count(t.int32_data.len()).map(|_| t.int32_data.iter().map(|&v| v as f64).collect())
        }
        other => Err(format!("tensors of {} are not supported", elem_name(other))),
    }
}

/// Values from `raw_data`: little-endian, packed.
fn raw_values(elem: i32, raw: &[u8], n: usize) -> Result<Vec<f64>, String> {
    let width = match elem {
        dt::DOUBLE | dt::INT64 | dt::UINT64 => 8,
        dt::FLOAT | dt::INT32 | dt::UINT32 => 4,
        dt::FLOAT16 | dt::BFLOAT16 | dt::INT16 | dt::UINT16 => 2,
        dt::INT8 | dt::UINT8 | dt::BOOL => 1,
        other => return Err(format!("tensors of {} are not supported", elem_name(other))),
    };
    if n.checked_mul(width) != Some(raw.len()) {
        return Err(format!(
            "{n} values of {} need {} bytes of raw data, got {}",
            elem_name(elem),
            n * width,
            raw.len()
        ));
    }
    Ok(raw.chunks_exact(width).map(|b| raw_value(elem, b)).collect())
}

fn raw_value(elem: i32, b: &[u8]) -> f64 {
    let u16le = || u16::from_le_bytes([b[0], b[1]]);
    let b4 = || [b[0], b[1], b[2], b[3]];
    let b8 = || [b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]];
    match elem {
        dt::DOUBLE => f64::from_le_bytes(b8()),
        dt::INT64 => i64::from_le_bytes(b8()) as f64,
        dt::UINT64 => u64::from_le_bytes(b8()) as f64,
        dt::FLOAT => f32::from_le_bytes(b4()) as f64,
        dt::INT32 => i32::from_le_bytes(b4()) as f64,
        dt::UINT32 => u32::from_le_bytes(b4()) as f64,
        dt::FLOAT16 => f16_bits(u16le()),
        dt::BFLOAT16 => bf16_bits(u16le()),
        dt::INT16 => u16le() as i16 as f64,
        dt::UINT16 => u16le() as f64,
        dt::INT8 => b[0] as i8 as f64,
        _ => b[0] as f64,
    }
}

fn f16_bits(b: u16) -> f64 {
    half::f16::from_bits(b).to_f64()
}

fn bf16_bits(b: u16) -> f64 {
    half::bf16::from_bits(b).to_f64()
}

/// The decimal a person wrote for an f32 (`1e-5`, not `9.99999974e-6`): the shortest decimal
/// that rounds to the f32, read as f64. Attributes and scalar constants go through it, so
/// plans and rules see the constant the model's author meant.
pub fn f32_literal(v: f32) -> f64 {
    if !v.is_finite() {
        return v as f64;
    }
    v.to_string().parse::<f64>().unwrap_or(v as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raw_and_typed_agree() {
        let raw: Vec<u8> = [1.5f32, -2.0].iter().flat_map(|v| v.to_le_bytes()).collect();
        let t = TensorProto { dims: vec![2], data_type: dt::FLOAT, raw_data: raw, ..Default::default() };
        assert_eq!(decode(&t, None).unwrap().data, vec![1.5, -2.0]);
        let t = TensorProto { dims: vec![2], data_type: dt::FLOAT, float_data: vec![1.5, -2.0], ..Default::default() };
        assert_eq!(decode(&t, None).unwrap().data, vec![1.5, -2.0]);
        let t = TensorProto { dims: vec![3], data_type: dt::INT64, int64_data: vec![0, -1, 7], ..Default::default() };
        assert_eq!(decode(&t, None).unwrap().ints().unwrap(), vec![0, -1, 7]);
    }

    #[test]
    fn claimed_sizes_are_checked() {
        let t = TensorProto { dims: vec![1 << 40, 1 << 20], data_type: dt::FLOAT, ..Default::default() };
        assert!(decode(&t, None).unwrap_err().contains("2^48"));
        let t = TensorProto { dims: vec![4], data_type: dt::FLOAT, raw_data: vec![0; 15], ..Default::default() };
        assert!(decode(&t, None).unwrap_err().contains("need 16 bytes"));
        let t = TensorProto { dims: vec![0], data_type: dt::INT64, ..Default::default() };
        assert_eq!(decode(&t, None).unwrap().ints().unwrap(), Vec::<i64>::new());
        assert!(nonempty(&[4, 0]).is_err());
    }

    #[test]
    fn literals() {
        assert_eq!(f32_literal(1e-5), 1e-5);
        assert_eq!(f32_literal(0.5), 0.5);
    }
}
