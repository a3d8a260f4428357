//! The ONNX front end: an `.onnx` model (default operator set, opsets 13 to 21) to a typed
//! [`Program`].
//!
//! The model is decoded with hand-written `prost` messages (`onnx/proto.rs`, no `protoc` at build
//! time), then each node is lowered in order (`onnx/ops.rs`) onto the program builder, which
//! type-checks every operator as it is added. How ONNX things become program things:
//!
//! - graph inputs become program inputs; a symbolic size (`dim_param`) becomes a `dim` whose size
//!   comes from `--dim NAME=V` or the model's metadata entry `eqfuse.dim.NAME`, and is an error
//!   otherwise (a plan depends on sizes, so none is guessed);
//! - constants (initializers and `Constant` nodes) stay out of the program until a node computes
//!   with them: a one-element constant becomes a literal (so rules see `x + 1e-5`), a larger one a
//!   program input whose value is recorded in [`Program::values`] (runs use it, planning ignores
//!   it); constants used as shapes or axes (`Reshape`, `Unsqueeze`, reductions) are read at import
//!   time and never enter the program; a node whose inputs are all constants and whose result is
//!   integer or bool (shape arithmetic: `Shape`, `Gather`, `Mul`, `Concat`, `Where` ...) is
//!   computed at import time by the CPU reference, so shapes built that way stay constants;
//! - tensors stored as external data are read from files in the model's folder (the `location`,
//!   `offset` and `length` of `external_data`; a location leaving the folder is refused), so
//!   only [`program_from_onnx_file`] reads them;
//! - ONNX names become identifiers (`/ln/Sub_output_0` → `_ln_Sub_output_0`), unique per model;
//!   every node output names its program node, so plans speak the model's names;
//! - 64-bit and narrower integers become `i32`; `double` tensors are refused.
//!
//! Invariant: any bytes give a well-typed program or one error naming the file and, for a node,
//! its index, name and operator; never a panic. An operator outside [`supported_onnx_ops`] is such an
//! error.

mod data;
mod ops;
mod proto;

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use egg::Id;

use self::data::{dtype_of, elem_name, nonempty, Const};
use self::proto::{GraphProto, ModelProto, NodeProto, ValueInfoProto};
use crate::error::{Error, Result};
use crate::ir::lang::OpCode;
use crate::ir::program::Program;
use crate::ir::types::{DType, TensorType};

pub use self::ops::supported_onnx_ops;

/// The default-domain opset versions the importer reads.
pub const ONNX_OPSETS: std::ops::RangeInclusive<i64> = 13..=21;

/// The most elements a constant computation folded at import time reads or gives.
const FOLD_LIMIT: usize = 1 << 16;

/// The metadata key prefix that gives a symbolic dim its default size (`eqfuse.dim.batch` = `8`).
pub const ONNX_DIM_METADATA_PREFIX: &str = "eqfuse.dim.";

/// Imports an ONNX model. `file` names it in errors and becomes [`Program::source`]; `overrides`
/// are `--dim NAME=VALUE` sizes for the model's symbolic dims (naming one it lacks is an error).
///
/// ```
/// // A model that is not protobuf at all is an error, not a panic.
/// let e = eqfuse::program_from_onnx("m.onnx", b"\xff\xff\xff", &[]).unwrap_err();
/// assert!(e.to_string().starts_with("m.onnx: not a valid ONNX model"));
/// ```
///
/// Bytes alone do not say where the model's external data files are: a model whose weights are
/// stored as external data is an error here; [`program_from_onnx_file`] reads them.
pub fn program_from_onnx(file: &str, bytes: &[u8], overrides: &[(String, usize)]) -> Result<Program> {
    program_from_onnx_in(file, bytes, None, overrides)
}

/// Imports the ONNX model at `path`, reading tensors stored as external data (`path.data` as
/// PyTorch writes it) from files in the model's folder.
pub fn program_from_onnx_file(path: &str, overrides: &[(String, usize)]) -> Result<Program> {
    let bytes = crate::files::read_file(path)?;
    let folder = Path::new(path).parent().map(|p| if p.as_os_str().is_empty() { Path::new(".") } else { p });
    program_from_onnx_in(path, &bytes, folder, overrides)
}

fn program_from_onnx_in(
    file: &str,
    bytes: &[u8],
    folder: Option<&Path>,
    overrides: &[(String, usize)],
) -> Result<Program> {
    crate::frontend::parse::check_overrides(overrides)?;
    let model = proto::decode_model(bytes).map_err(|e| invalid(file, format!("not a valid ONNX model: {e}")))?;
    // A `--dim` naming no symbolic dim of the model is a usage error (`check_overrides`).
    import(file, &model, folder, overrides).map_err(|m| {
        if m.starts_with("--dim ") {
            Error::Usage(format!("{file}: {m}"))
        } else {
            invalid(file, m)
        }
    })
}

fn invalid(file: &str, msg: String) -> Error {
    Error::Invalid(format!("{file}: {msg}"))
}

/// A value of the model as the program holds it.
///
/// `shape` and `dtype` are the ONNX ones. They equal the program node's type except for a
/// one-element constant, which is a weak scalar literal (shape `[]`, adapting dtype) until an
/// operator needs its exact type ([`Importer::exact`]).
#[derive(Clone, Debug)]
struct Val {
    id: Id,
    shape: Vec<usize>,
    dtype: DType,
}

/// What lowering one node gives its first output.
enum Out {
    Val(Val),
    /// A constant, kept out of the program until something computes with it.
    Const(Const),
    /// Another name for an existing value or constant (`Identity`).
    Alias(String),
    /// One value per output (`Split`).
    Many(Vec<Val>),
}

/// A symbolic dim of the model.
struct SymDim {
    onnx: String,
    name: String,
    size: usize,
}

/// The state of one import.
struct Importer<'a> {
    prog: Program,
    /// ONNX value name → program value.
    vals: HashMap<String, Val>,
    /// ONNX value name → constant, for values known at import time.
    consts: HashMap<String, Const>,
    names: Names,
    dims: Vec<SymDim>,
    overrides: &'a [(String, usize)],
    /// `eqfuse.dim.NAME` metadata entries.
    dim_defaults: HashMap<String, String>,
    /// The model's folder, where its external data files are (`None`: refused).
    folder: Option<PathBuf>,
}

fn import(
    file: &str,
    model: &ModelProto,
    folder: Option<&Path>,
    overrides: &[(String, usize)],
) -> Result<Program, String> {
    check_opset(model)?;
    let graph = model.graph.as_ref().ok_or("the model has no graph")?;
    if !graph.sparse_initializer.is_empty() {
        return Err("sparse initializers are not supported".to_string());
    }
    let dim_defaults = model
        .metadata_props
        .iter()
        .filter_map(|e| e.key.strip_prefix(ONNX_DIM_METADATA_PREFIX).map(|k| (k.to_string(), e.value.clone())))
        .collect();
    let mut im = Importer {
        prog: Program::new(file),
        vals: HashMap::new(),
        consts: HashMap::new(),
        names: Names::default(),
        dims: vec![],
        overrides,
        dim_defaults,
        folder: folder.map(Path::to_path_buf),
    };
    unsupported_nodes(graph)?;
    im.initializers(graph)?;
    im.graph_inputs(graph)?;
    im.check_overrides(file)?;
    for (i, node) in graph.node.iter().enumerate() {
        im.node(node).map_err(|m| format!("{}: {m}", node_label(i, node)))?;
    }
    im.graph_outputs(graph)?;
    im.prog.dims = im.dims.iter().map(|d| (d.name.clone(), d.size)).collect();
    Ok(im.prog)
}

/// Every node whose operator the importer cannot read, named at once (a model that needs
/// several is told all of them, not the first).
fn unsupported_nodes(graph: &GraphProto) -> Result<(), String> {
    let bad: Vec<String> = graph
        .node
        .iter()
        .enumerate()
        .filter(|(_, n)| !(n.domain.is_empty() || n.domain == "ai.onnx") || ops::lookup(&n.op_type).is_none())
        .map(|(i, n)| node_label(i, n))
        .collect();
    if bad.is_empty() {
        return Ok(());
    }
    let mut kinds: Vec<&str> = graph
        .node
        .iter()
        .filter(|n| !(n.domain.is_empty() || n.domain == "ai.onnx") || ops::lookup(&n.op_type).is_none())
        .map(|n| n.op_type.as_str())
        .collect();
    kinds.sort_unstable();
    kinds.dedup();
    Err(format!(
        "{} node{} use{} operators the ONNX importer does not read ({}): {}; it reads {}",
        bad.len(),
        if bad.len() == 1 { "" } else { "s" },
        if bad.len() == 1 { "s" } else { "" },
        kinds.join(", "),
        bad.join(", "),
        supported_onnx_ops().join(" ")
    ))
}

/// `node 3 `/ln/Sub` (Sub)`, or `node 3 (Sub)` for an unnamed node.
fn node_label(i: usize, n: &NodeProto) -> String {
    if n.name.is_empty() {
        format!("node {i} ({})", n.op_type)
    } else {
        format!("node {i} `{}` ({})", n.name, n.op_type)
    }
}

fn check_opset(model: &ModelProto) -> Result<(), String> {
    let v = model
        .opset_import
        .iter()
        .find(|o| o.domain.is_empty() || o.domain == "ai.onnx")
        .map(|o| o.version)
        .ok_or("the model imports no version of the default operator set (ai.onnx)")?;
    if !ONNX_OPSETS.contains(&v) {
        return Err(format!(
            "opset {v} is outside the {} to {} this importer reads; convert the model (onnx.version_converter)",
            ONNX_OPSETS.start(),
            ONNX_OPSETS.end()
        ));
    }
    Ok(())
}

impl Importer<'_> {
    fn initializers(&mut self, g: &GraphProto) -> Result<(), String> {
        for t in &g.initializer {
            let c = data::decode(t, self.folder.as_deref()).map_err(|m| format!("initializer `{}`: {m}", t.name))?;
            if self.consts.insert(t.name.clone(), c).is_some() {
                return Err(format!("initializer `{}` is given twice", t.name));
            }
        }
        Ok(())
    }

    /// Declares the graph inputs. An input that has an initializer (IR version 3 models list
    /// them) is that constant.
    fn graph_inputs(&mut self, g: &GraphProto) -> Result<(), String> {
        for vi in &g.input {
            if self.consts.contains_key(&vi.name) {
                continue;
            }
            let ty = self.value_type(vi).map_err(|m| format!("graph input `{}`: {m}", vi.name))?;
            if self.vals.contains_key(&vi.name) {
                return Err(format!("graph input `{}` is declared twice", vi.name));
            }
            let name = self.names.input(&vi.name);
            let id = self.prog.add_input(&name, ty.clone()).map_err(|m| format!("graph input `{}`: {m}", vi.name))?;
            self.vals.insert(vi.name.clone(), Val { id, shape: ty.shape, dtype: ty.dtype });
        }
        Ok(())
    }

    /// The type a graph input declares, symbolic sizes resolved.
    fn value_type(&mut self, vi: &ValueInfoProto) -> Result<TensorType, String> {
        let t = vi.r#type.as_ref().and_then(|t| t.tensor_type.as_ref()).ok_or("it is not a tensor")?;
        let dtype = dtype_of(t.elem_type)?;
        let shape = t.shape.as_ref().ok_or("its shape is not given (eqfuse needs every size)")?;
        let mut sizes = Vec::with_capacity(shape.dim.len().min(64));
        for (axis, d) in shape.dim.iter().enumerate() {
            let size = match (d.dim_value, d.dim_param.as_deref()) {
                (Some(v), _) if v > 0 => Ok(v as usize),
                (Some(v), _) => Err(format!("axis {axis} has size {v}; eqfuse tensors are never empty")),
                (None, Some(p)) if !p.is_empty() => self.symbolic(p, axis),
                _ => Err(format!("axis {axis} has no size; give the model concrete or named sizes")),
            }?;
            sizes.push(size);
        }
        Ok(TensorType::new(dtype, sizes))
    }

    /// The size of a symbolic dim: `--dim`, then the model's metadata, else an error.
    fn symbolic(&mut self, onnx: &str, axis: usize) -> Result<usize, String> {
        if let Some(d) = self.dims.iter().find(|d| d.onnx == onnx) {
            return Ok(d.size);
        }
        let name = unique(sanitize(onnx), |n| self.dims.iter().any(|d| d.name == n));
        let given = self.overrides.iter().rev().find(|(n, _)| *n == name).map(|&(_, v)| v);
        let size = match given {
            Some(v) => v,
            None => self.dim_default(onnx, &name, axis)?,
        };
        self.dims.push(SymDim { onnx: onnx.to_string(), name, size });
        Ok(size)
    }

    fn dim_default(&self, onnx: &str, name: &str, axis: usize) -> Result<usize, String> {
        let text = self.dim_defaults.get(onnx).or_else(|| self.dim_defaults.get(name)).ok_or_else(|| {
            format!(
                "axis {axis} has the symbolic size `{onnx}`; give it with --dim {name}=N \
                 (or the model's metadata entry {ONNX_DIM_METADATA_PREFIX}{onnx})"
            )
        })?;
        match text.trim().parse::<usize>() {
            Ok(v) if v > 0 => Ok(v),
            _ => Err(format!("metadata {ONNX_DIM_METADATA_PREFIX}{onnx} = `{text}` is not a positive size")),
        }
    }

    /// `--dim` names a symbolic dim of the model, as it does a `dim` of an `.eqf` program.
    fn check_overrides(&self, file: &str) -> Result<(), String> {
        if let Some((name, value)) = self.overrides.iter().find(|(n, _)| !self.dims.iter().any(|d| d.name == *n)) {
            let known: Vec<&str> = self.dims.iter().map(|d| d.name.as_str()).collect();
            let known = if known.is_empty() { "none".to_string() } else { known.join(", ") };
            return Err(format!("--dim {name}={value}: {file} has no symbolic dim `{name}` (it has {known})"));
        }
        Ok(())
    }

    /// Lowers one node and binds its first output.
    fn node(&mut self, n: &NodeProto) -> Result<(), String> {
        if !(n.domain.is_empty() || n.domain == "ai.onnx") {
            return Err(format!("operator `{}` of domain `{}` is not supported (only ai.onnx)", n.op_type, n.domain));
        }
        let op = ops::lookup(&n.op_type).ok_or_else(|| {
            format!(
                "operator `{}` is not supported by the ONNX importer (it reads {})",
                n.op_type,
                supported_onnx_ops().join(" ")
            )
        })?;
        let many = n.op_type == "Split";
        if let Some(extra) = n.output.iter().skip(1).find(|o| !o.is_empty()).filter(|_| !many) {
            return Err(format!("output `{extra}`: only the first output of {} is supported", n.op_type));
        }
        let out_name = n.output.first().filter(|o| !o.is_empty()).ok_or("the node has no output")?;
        if self.vals.contains_key(out_name) || self.consts.contains_key(out_name) {
            return Err(format!("output `{out_name}` is already defined"));
        }
        let present = n.input.iter().rposition(|i| !i.is_empty()).map_or(0, |p| p + 1);
        if present < op.min_inputs || present > op.max_inputs {
            return Err(format!("takes {} to {} inputs, got {present}", op.min_inputs, op.max_inputs));
        }
        if let Some(c) = self.fold(n, op) {
            return self.bind(out_name, Out::Const(c));
        }
        let out = (op.lower)(self, n)?;
        if let Out::Many(vals) = out {
            for (name, v) in n.output.iter().zip(vals) {
                if name.is_empty() {
                    continue;
                }
                if name != out_name && (self.vals.contains_key(name) || self.consts.contains_key(name)) {
                    return Err(format!("output `{name}` is already defined"));
                }
                self.bind(name, Out::Val(v))?;
            }
            return Ok(());
        }
        self.bind(out_name, out)
    }

    /// The value of a node whose inputs are all constants, when it is integer or bool (shape
    /// arithmetic: `Shape`, `Gather` of a shape, `Mul`, `Concat`, `Equal`, `Where` ... as
    /// TorchScript's exporter writes them before a `Reshape` or an `Expand`), so that shapes
    /// computed from constants stay constants the importer reads. The node is lowered into a
    /// program of its own and evaluated by the CPU reference; `None` (lower it as usual) when
    /// it is not such a node, the result is a float, more than [`FOLD_LIMIT`] elements are
    /// involved, or anything fails.
    fn fold(&self, n: &NodeProto, op: &ops::OnnxOp) -> Option<Const> {
        if matches!(n.op_type.as_str(), "Constant" | "Identity" | "Split") {
            return None;
        }
        let mut consts = HashMap::new();
        for name in n.input.iter().filter(|i| !i.is_empty()) {
            let c = self.consts.get(name).filter(|c| c.numel() <= FOLD_LIMIT)?;
            consts.insert(name.clone(), c.clone());
        }
        if consts.is_empty() {
            return None;
        }
        let mut sub = Importer {
            prog: Program::new("fold"),
            vals: HashMap::new(),
            consts,
            names: Names::default(),
            dims: vec![],
            overrides: &[],
            dim_defaults: HashMap::new(),
            folder: None,
        };
        let v = match (op.lower)(&mut sub, n).ok()? {
            Out::Val(v) => v,
            Out::Const(c) => return Some(c),
            _ => return None,
        };
        if v.dtype.is_float() || v.shape.iter().product::<usize>() > FOLD_LIMIT {
            return None;
        }
        let id = sub.exact(&v).ok()?;
        sub.prog.add_output("folded", id).ok()?;
        let values: HashMap<String, _> = sub.prog.values.clone().into_iter().collect();
        let t = crate::reference::eval(&sub.prog, &values).ok()?.pop()?;
        let elem = if v.dtype == DType::Bool { proto::data_type::BOOL } else { proto::data_type::INT64 };
        (t.data.len() == v.shape.iter().product::<usize>()).then_some(Const { elem, shape: v.shape, data: t.data })
    }

    fn bind(&mut self, name: &str, out: Out) -> Result<(), String> {
        match out {
            Out::Val(v) => {
                let program_name = self.names.get(name);
                self.prog.name_node(v.id, &program_name);
                self.vals.insert(name.to_string(), v);
            }
            Out::Const(c) => {
                self.consts.insert(name.to_string(), c);
            }
            Out::Many(_) => return Err("several values for one output".to_string()),
            Out::Alias(of) => {
                let (v, c) = (self.vals.get(&of).cloned(), self.consts.get(&of).cloned());
                if v.is_none() && c.is_none() {
                    return Err(undefined(&of));
                }
                if let Some(v) = v {
                    self.vals.insert(name.to_string(), v);
                }
                if let Some(c) = c {
                    self.consts.insert(name.to_string(), c);
                }
            }
        }
        Ok(())
    }

    fn graph_outputs(&mut self, g: &GraphProto) -> Result<(), String> {
        if g.output.is_empty() {
            return Err("the graph has no outputs".to_string());
        }
        for vo in &g.output {
            self.graph_output(vo).map_err(|m| format!("graph output `{}`: {m}", vo.name))?;
        }
        Ok(())
    }

    fn graph_output(&mut self, vo: &ValueInfoProto) -> Result<(), String> {
        let v = self.arg(&vo.name)?;
        if self.prog.fact(v.id).weak {
            return Err("it is a constant; a program computes its outputs from inputs".to_string());
        }
        self.check_declared(vo, &v)?;
        let id = self.exact(&v)?;
        let name = self.names.get(&vo.name);
        self.prog.name_node(id, &name);
        self.prog.add_output(&name, id)
    }

    /// An output's declared type, where the model gives one, must be the computed type: a
    /// disagreement means the model or the importer is wrong, and either way the plan would be.
    fn check_declared(&self, vo: &ValueInfoProto, v: &Val) -> Result<(), String> {
        let Some(t) = vo.r#type.as_ref().and_then(|t| t.tensor_type.as_ref()) else { return Ok(()) };
        if t.elem_type != 0 && dtype_of(t.elem_type).ok() != Some(v.dtype) {
            return Err(format!("the model declares {}, the import computes {}", elem_name(t.elem_type), v.dtype));
        }
        let Some(shape) = &t.shape else { return Ok(()) };
        let declared: Vec<Option<usize>> = shape
            .dim
            .iter()
            .map(|d| match (d.dim_value, d.dim_param.as_deref()) {
                (Some(x), _) if x > 0 => Some(x as usize),
                (None, Some(p)) => self.dims.iter().find(|s| s.onnx == p).map(|s| s.size),
                _ => None,
            })
            .collect();
        let agrees =
            declared.len() == v.shape.len() && declared.iter().zip(&v.shape).all(|(d, s)| d.is_none_or(|d| d == *s));
        if !agrees {
            let shown: Vec<String> = declared.iter().map(|d| d.map_or("?".to_string(), |d| d.to_string())).collect();
            return Err(format!("the model declares shape [{}], the import computes {:?}", shown.join(", "), v.shape));
        }
        Ok(())
    }

    /// The program value of an ONNX value name, bringing a constant into the program if needed.
    fn arg(&mut self, name: &str) -> Result<Val, String> {
        if let Some(v) = self.vals.get(name) {
            return Ok(v.clone());
        }
        let c = self.consts.get(name).cloned().ok_or_else(|| undefined(name))?;
        let v = self.materialize(name, &c).map_err(|m| format!("constant `{name}`: {m}"))?;
        self.vals.insert(name.to_string(), v.clone());
        Ok(v)
    }

    /// A constant as a program value: a literal when it has one number, else an input whose
    /// value the program carries.
    fn materialize(&mut self, name: &str, c: &Const) -> Result<Val, String> {
        nonempty(&c.shape)?;
        if c.numel() == 1 && c.elem != proto::data_type::BOOL {
            let dtype = data::scalar_dtype(c.elem)?;
            let v = if c.elem == proto::data_type::FLOAT { data::f32_literal(c.data[0] as f32) } else { c.data[0] };
            // An infinity is a literal (a mask's `-inf` fill), as in `.eqf` JSON graphs; NaN
            // and an integer out of range are not.
            if v.is_nan() || (v.is_infinite() && !dtype.is_float()) {
                return Err(format!("the value {v} is not a {dtype} literal"));
            }
            // A float literal keeps the decimal the model meant; an integer one is truncated.
            let v = if dtype.is_float() { v } else { dtype.round(v) };
            return Ok(Val { id: self.prog.num(v), shape: c.shape.clone(), dtype });
        }
        let input = self.names.input(name);
        let tensor = c.tensor()?;
        let id = self.prog.add_input(&input, tensor.ty())?;
        let v = Val { id, shape: tensor.shape.clone(), dtype: tensor.dtype };
        self.prog.values.insert(input, tensor);
        Ok(v)
    }

    /// The program node of `v` with exactly its ONNX type: a one-element literal is reshaped to
    /// its ONNX shape and cast to its ONNX dtype where those differ from the literal's.
    fn exact(&mut self, v: &Val) -> Result<Id, String> {
        let ty = self.prog.ty(v.id).cloned().ok_or("an attribute is used as a tensor")?;
        let mut id = v.id;
        if ty.shape != v.shape {
            let dims = self.prog.add(crate::ir::lang::TensorLang::Dims(crate::ir::lang::Dims(v.shape.clone())))?;
            id = self.prog.apply(crate::ir::lang::Kind::Reshape, vec![id, dims])?;
        }
        if self.prog.ty(id).map(|t| t.dtype) != Some(v.dtype) {
            let t = self.prog.add(crate::ir::lang::TensorLang::Type(v.dtype))?;
            id = self.prog.apply(crate::ir::lang::Kind::Cast, vec![id, t])?;
        }
        Ok(id)
    }
}

fn undefined(name: &str) -> String {
    format!("`{name}` is not a graph input, an initializer or the output of an earlier node")
}

/// ONNX names to program identifiers, unique within one model.
#[derive(Default)]
struct Names {
    map: HashMap<String, String>,
    taken: HashSet<String>,
}

impl Names {
    /// The name of a computed value or output.
    fn get(&mut self, onnx: &str) -> String {
        self.name(onnx, false)
    }

    /// The name of an input, which may not spell a dtype or an operator (`Program::add_input`).
    fn input(&mut self, onnx: &str) -> String {
        self.name(onnx, true)
    }

    fn name(&mut self, onnx: &str, input: bool) -> String {
        if let Some(n) = self.map.get(onnx) {
            return n.clone();
        }
        let name = unique(sanitize(onnx), |n| self.taken.contains(n) || (input && reserved(n)));
        self.taken.insert(name.clone());
        self.map.insert(onnx.to_string(), name.clone());
        name
    }
}

/// An identifier from any string: other characters become `_`, and a name that does not start
/// with a letter or `_` gets a `v_` prefix.
fn sanitize(s: &str) -> String {
    let mut out: String = s.chars().map(|c| if c.is_ascii_alphanumeric() || c == '_' { c } else { '_' }).collect();
    if !out.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_') {
        out.insert_str(0, "v_");
    }
    out
}

/// Words that cannot name a value: dtypes, operator spellings and `.eqf` keywords.
fn reserved(name: &str) -> bool {
    name.parse::<DType>().is_ok() || OpCode::from_name(name).is_some() || matches!(name, "dim" | "input" | "output")
}

/// `base`, or `base_1`, `base_2`, ... , the first that `taken` refuses.
fn unique(base: String, taken: impl Fn(&str) -> bool) -> String {
    if !taken(&base) {
        return base;
    }
    (1..).map(|k| format!("{base}_{k}")).find(|n| !taken(n)).expect("some suffix is free")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small deterministic generator (xorshift).
    struct Rng(u64);

    impl Rng {
        fn below(&mut self, n: usize) -> usize {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            (self.0 % n.max(1) as u64) as usize
        }
        fn int(&mut self) -> i64 {
            self.below(9) as i64 - 3
        }
    }

    /// One structural edit of a decoded model: what byte mutations rarely reach (they mostly
    /// break the protobuf framing), such as another operator, attribute, input or size.
    fn mutate(m: &mut ModelProto, rng: &mut Rng) {
        let g = m.graph.get_or_insert_with(Default::default);
        let names: Vec<String> =
            g.node.iter().flat_map(|n| n.output.clone()).chain(g.input.iter().map(|i| i.name.clone())).collect();
        let k = rng.below(g.node.len());
        match (rng.below(8), g.node.get_mut(k)) {
            (0, Some(n)) => n.op_type = ops::OPS[rng.below(ops::OPS.len())].name.to_string(),
            (1, Some(n)) if !n.attribute.is_empty() => {
                let a = rng.below(n.attribute.len());
                let attr = &mut n.attribute[a];
                attr.i = rng.int();
                attr.f = rng.int() as f32 * 0.5;
                attr.ints = (0..rng.below(4)).map(|_| rng.int()).collect();
            }
            (2, Some(n)) if !n.input.is_empty() => {
                let i = rng.below(n.input.len());
                n.input[i] = names.get(rng.below(names.len() + 1)).cloned().unwrap_or_default();
            }
            (3, Some(_)) => {
                g.node.remove(k);
            }
            (4, _) if !g.initializer.is_empty() => {
                let i = rng.below(g.initializer.len());
                g.initializer[i].dims = (0..rng.below(4)).map(|_| rng.int()).collect();
            }
            (5, _) if !g.input.is_empty() => {
                let i = rng.below(g.input.len());
                if let Some(shape) =
                    g.input[i].r#type.as_mut().and_then(|t| t.tensor_type.as_mut()).and_then(|t| t.shape.as_mut())
                {
                    let d = rng.below(shape.dim.len() + 1);
                    if let Some(dim) = shape.dim.get_mut(d) {
                        dim.dim_value = Some(rng.int());
                    } else {
                        shape.dim.push(proto::Dimension { dim_value: Some(rng.int()), dim_param: None });
                    }
                }
            }
            (6, Some(n)) => n.output.push(names.get(rng.below(names.len())).cloned().unwrap_or_default()),
            _ => m.opset_import.iter_mut().for_each(|o| o.version = 12 + rng.below(11) as i64),
        }
    }

    #[test]
    fn structurally_mutated_models_are_errors_or_programs() {
        let mut rng = Rng(0x2545_f491_4f6c_dd1d);
        let (mut loaded, mut failed) = (0, 0);
        for model in [
            "layernorm",
            "mlp_softmax",
            "ops_shapes",
            "ops_pointwise",
            "ops_gather",
            "ops_shape_arith",
            "conv_patches",
            "half",
        ] {
            let bytes = std::fs::read(format!("tests/onnx/{model}/model.onnx")).unwrap();
            let original = proto::decode_model(&bytes).unwrap();
            for _ in 0..500 {
                let mut m = original.clone();
                for _ in 0..1 + rng.below(3) {
                    mutate(&mut m, &mut rng);
                }
                match import("m.onnx", &m, None, &[]) {
                    Ok(p) => {
                        loaded += 1;
                        let small = (0..p.len()).all(|i| p.ty(Id::from(i)).is_none_or(|t| t.numel() <= 1 << 16));
                        if small {
                            // Random integer inputs used as indices (ops_gather's `i2`) may be
                            // out of range: a fault of the data, which the reference reports.
                            match crate::reference::eval(&p, &crate::reference::rng::random_inputs(&p, 0)) {
                                Err(e) if e.to_string().contains("is out of range for an axis") => {}
                                r => {
                                    r.unwrap();
                                }
                            }
                        }
                    }
                    Err(_) => failed += 1,
                }
            }
        }
        assert!(loaded > 100 && failed > 100, "{loaded} loaded, {failed} refused");
    }

    /// A float attribute (Gemm's `alpha`/`beta`, LayerNormalization's `epsilon`) that is NaN
    /// or infinite is refused, naming it: it would make every output NaN.
    #[test]
    fn non_finite_float_attributes_are_refused() {
        let mut found = 0;
        for model in ["layernorm", "mlp_softmax", "ops_shapes", "ops_pointwise", "half"] {
            let bytes = std::fs::read(format!("tests/onnx/{model}/model.onnx")).unwrap();
            let original = proto::decode_model(&bytes).unwrap();
            let nodes = original.graph.as_ref().map_or(0, |g| g.node.len());
            for k in 0..nodes {
                for a in 0..original.graph.as_ref().unwrap().node[k].attribute.len() {
                    for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
                        let mut m = original.clone();
                        let attr = &mut m.graph.as_mut().unwrap().node[k].attribute[a];
                        // (A Constant's `value_float` is a value, and may be an infinity.)
                        if attr.r#type != proto::attr_type::FLOAT || attr.name == "value_float" {
                            continue;
                        }
                        attr.f = bad;
                        let name = attr.name.clone();
                        let err = import("m.onnx", &m, None, &[]).unwrap_err().to_string();
                        assert!(err.contains(&format!("attribute `{name}` is {bad}; it must be a finite")), "{err}");
                        found += 1;
                    }
                }
            }
        }
        assert!(found >= 6, "only {found} float attributes tried");
    }

    #[test]
    fn names_are_identifiers_and_unique() {
        let mut n = Names::default();
        assert_eq!(n.get("/ln/Sub_output_0"), "_ln_Sub_output_0");
        assert_eq!(n.get("onnx::MatMul_3"), "onnx__MatMul_3");
        assert_eq!(n.get("0"), "v_0");
        assert_eq!(n.input("exp"), "exp_1");
        assert_eq!(n.get("log"), "log");
        assert_eq!(n.get("a-b"), "a_b");
        assert_eq!(n.get("a_b"), "a_b_1");
        assert_eq!(n.get("a-b"), "a_b");
        assert_eq!(n.get(""), "v_");
    }
}
