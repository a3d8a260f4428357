//! Reading and writing tensors as NumPy `.npy` files (through `npyz`).
//!
//! Files written: f32 as `<f4`, f16 as `<f2`, i32 as `<i4`, bool as `|b1`, and bf16 as `<f4`,
//! because NumPy has no bfloat16 (each value is exactly representable in f32, so nothing is
//! lost; read such a file back as bf16 and it round-trips).
//! Files read: the type written for the declared dtype, plus lossless or checked conversions:
//! f32 and bf16 inputs accept `f2`, `f4` and `f8` (rounded to the dtype; a finite value beyond
//! the dtype's range is an error), f16 accepts `f2`, `f4`, `f8` the same way, i32 accepts `i4`
//! and `i8` (range checked), bool accepts `b1`. Fortran-order files are reordered.
//! Invariant: a tensor read here satisfies the [`Tensor`] invariant for the declared type, and
//! every error names the file and what disagrees with the declaration.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;

use npyz::half::f16;
use npyz::{NpyFile, Order, TypeChar, WriterBuilder};

use crate::error::{Error, Result};
use crate::ir::lang::Dims;
use crate::ir::tensor::{gather, Tensor};
use crate::ir::types::{DType, TensorType};

/// Reads `path` as a tensor of type `expected`.
pub fn read_npy(path: impl AsRef<Path>, expected: &TensorType) -> Result<Tensor> {
    let path = path.as_ref();
    let shown = path.display().to_string();
    let bad = |m: String| Error::Invalid(format!("{shown}: {m}"));
    let bytes = std::fs::read(path).map_err(|e| Error::io(&shown, e))?;
    if let Some(shape) = overflowing_shape(&bytes) {
        return Err(bad(format!("not a valid .npy file: its shape ({shape}) has more elements than 64 bits count")));
    }
    let npy = NpyFile::new(&bytes[..]).map_err(|e| bad(format!("not a valid .npy file: {e}")))?;
    let shape: Vec<usize> = npy.shape().iter().map(|&d| d as usize).collect();
    if shape != expected.shape {
        return Err(bad(format!("has shape {}, but the program declares {expected}", Dims(shape))));
    }
    let (kind, size) = element_type(&npy).map_err(&bad)?;
    if !accepts(expected.dtype, kind, size) {
        return Err(bad(format!(
            "holds {} values, but the program declares {expected} (which accepts {})",
            type_name(kind, size),
            accepted(expected.dtype)
        )));
    }
    let order = npy.order();
    let strides = npy.strides().iter().map(|&s| s as usize).collect::<Vec<_>>();
    let flat = read_values(npy, kind, size).map_err(|e| bad(format!("cannot read the data: {e}")))?;
    let data = if order == Order::Fortran { gather(&flat, &shape, &strides) } else { flat };
    convert(data, expected.dtype).map(|data| Tensor { dtype: expected.dtype, shape, data }).map_err(bad)
}

/// The shape text of a `.npy` header whose sizes multiply beyond `u64` (zeros left out), if it
/// is one: `npyz` multiplies them unchecked, a panic under overflow checks and a wrong element
/// count without. Anything else, well formed or not, is left to `npyz`.
fn overflowing_shape(bytes: &[u8]) -> Option<String> {
    let len = match bytes.get(..12)? {
        [0x93, b'N', b'U', b'M', b'P', b'Y', 1, _, a, b, ..] => 10 + u16::from_le_bytes([*a, *b]) as usize,
        [0x93, b'N', b'U', b'M', b'P', b'Y', _, _, a, b, c, d] => 12 + u32::from_le_bytes([*a, *b, *c, *d]) as usize,
        _ => return None,
    };
    let header = String::from_utf8_lossy(&bytes[..len.min(bytes.len())]);
    let rest = &header[header.find("shape")?..];
    let (open, close) = (rest.find('(')?, rest.find(')')?);
    let shape = rest.get(open + 1..close)?;
    let sizes = shape.split(',').map(str::trim).filter(|d| !d.is_empty());
    let product = sizes.map(|d| d.parse::<u64>().unwrap_or(0)).filter(|&d| d != 0).try_fold(1u64, u64::checked_mul);
    product.is_none().then(|| shape.trim().to_string())
}

/// The element kind and byte size of a plain (non-record) file.
fn element_type(npy: &NpyFile<&[u8]>) -> std::result::Result<(TypeChar, u64), String> {
    match npy.dtype() {
        npyz::DType::Plain(t) => Ok((t.type_char(), t.size_field())),
        other => Err(format!("holds records ({}), not plain numbers", other.descr())),
    }
}

fn accepts(dtype: DType, kind: TypeChar, size: u64) -> bool {
    match dtype {
        DType::F32 | DType::F16 | DType::Bf16 => kind == TypeChar::Float && matches!(size, 2 | 4 | 8),
        DType::I32 => kind == TypeChar::Int && matches!(size, 4 | 8),
        DType::Bool => kind == TypeChar::Bool && size == 1,
    }
}

fn accepted(dtype: DType) -> &'static str {
    match dtype {
        DType::F32 | DType::F16 | DType::Bf16 => "float16, float32 or float64",
        DType::I32 => "int32 or int64",
        DType::Bool => "bool",
    }
}

fn type_name(kind: TypeChar, size: u64) -> String {
    match kind {
        TypeChar::Float => format!("float{}", size * 8),
        TypeChar::Int => format!("int{}", size * 8),
        TypeChar::Uint => format!("uint{}", size * 8),
        TypeChar::Bool => "bool".into(),
        other => format!("{other} of {size} bytes"),
    }
}

fn read_values(npy: NpyFile<&[u8]>, kind: TypeChar, size: u64) -> std::io::Result<Vec<f64>> {
    Ok(match (kind, size) {
        (TypeChar::Float, 2) => npy.into_vec::<f16>()?.into_iter().map(f64::from).collect(),
        (TypeChar::Float, 4) => npy.into_vec::<f32>()?.into_iter().map(f64::from).collect(),
        (TypeChar::Float, 8) => npy.into_vec::<f64>()?,
        (TypeChar::Int, 4) => npy.into_vec::<i32>()?.into_iter().map(f64::from).collect(),
        (TypeChar::Int, 8) => npy.into_vec::<i64>()?.into_iter().map(|v| v as f64).collect(),
        (TypeChar::Bool, 1) => npy.into_vec::<bool>()?.into_iter().map(|b| b as u8 as f64).collect(),
        _ => return Err(std::io::Error::other("unsupported element type")),
    })
}

/// Rounds values to `dtype`, refusing finite values the dtype cannot hold.
fn convert(mut data: Vec<f64>, dtype: DType) -> std::result::Result<Vec<f64>, String> {
    for (i, v) in data.iter_mut().enumerate() {
        let r = dtype.round(*v);
        let overflow = v.is_finite() && !r.is_finite();
        let int_range = dtype == DType::I32 && r != *v;
        if overflow || int_range {
            return Err(format!("element {i} ({v}) does not fit in {dtype}"));
        }
        *v = r;
    }
    Ok(data)
}

/// Writes a tensor to `path` (bf16 as float32; see the module docs). The file is written beside
/// `path` under a temporary name and renamed into place, so a failed write leaves no truncated
/// `.npy` behind.
pub fn write_npy(path: impl AsRef<Path>, tensor: &Tensor) -> Result<()> {
    let path = path.as_ref();
    let mut partial = path.as_os_str().to_owned();
    partial.push(".partial");
    let partial = std::path::PathBuf::from(partial);
    let written = write_file(&partial, &path.display().to_string(), tensor)
        .and_then(|()| std::fs::rename(&partial, path).map_err(|e| Error::io(path.display().to_string(), e)));
    if written.is_err() {
        let _ = std::fs::remove_file(&partial);
    }
    written
}

/// Writes the file `path` in place (a caller that renames it afterwards: [`write_npy`], and
/// `run_cpu::write_all` for a run's files all or none); errors name `shown`, the file the caller
/// asked for.
pub(crate) fn write_file(path: &Path, shown: &str, tensor: &Tensor) -> Result<()> {
    // (Programs cannot declare more axes; a tensor built in code is refused here, before npyz
    // would be asked for a header it cannot write.)
    if tensor.rank() > crate::ir::program::MAX_RANK {
        let msg = format!("a tensor of rank {} has more than {} axes", tensor.rank(), crate::ir::program::MAX_RANK);
        return Err(Error::Invalid(format!("{shown}: {msg}")));
    }
    let io = |e| Error::io(shown, e);
    let mut file = BufWriter::new(File::create(path).map_err(io)?);
    let shape: Vec<u64> = tensor.shape.iter().map(|&d| d as u64).collect();
    let data = &tensor.data;
    match tensor.dtype {
        DType::F32 | DType::Bf16 => write_all(&mut file, &shape, data.iter().map(|&v| v as f32)),
        DType::F16 => write_all(&mut file, &shape, data.iter().map(|&v| f16::from_f64(v))),
        DType::I32 => write_all(&mut file, &shape, data.iter().map(|&v| v as i32)),
        DType::Bool => write_all(&mut file, &shape, data.iter().map(|&v| v != 0.0)),
    }
    .map_err(io)?;
    file.flush().map_err(io)
}

fn write_all<T: npyz::AutoSerialize>(
    w: impl Write,
    shape: &[u64],
    values: impl Iterator<Item = T>,
) -> std::io::Result<()> {
    let mut writer = npyz::WriteOptions::new().default_dtype().shape(shape).writer(w).begin_nd()?;
    writer.extend(values)?;
    writer.finish()
}
