//! The JSON graph form of a program (`"schema": "eqfuse.graph/1"`), for programs written by
//! other tools.
//!
//! A graph is the program's node list in order: leaves (`const`, `input`, `dims`, `dtype`) carry a
//! `value`, operators (spelled as in the op table) carry `args`, indices of earlier nodes; a node
//! may carry the binding `name` the program gave it. `dims` are informational (shapes are given in
//! full), and unknown fields are refused so that a misspelt field is reported, not ignored:
//!
//! ```json
//! {"schema": "eqfuse.graph/1",
//!  "dims": [{"name": "N", "value": 8}],
//!  "inputs": [{"name": "x", "dtype": "f32", "shape": [8]}],
//!  "nodes": [{"op": "input", "value": "x"}, {"op": "const", "value": 2},
//!            {"op": "*", "args": [0, 1]}, {"op": "exp", "args": [2], "name": "y"}],
//!  "outputs": [{"name": "y", "node": 3}]}
//! ```
//!
//! Invariant: reading a graph that
//! [`program_to_json`] wrote gives the same expression, node for node; reading any other text
//! gives a well-typed program or an error (serde's line and column for bad JSON, the node index
//! and op for a bad graph), never a panic.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::{Diagnostic, Error, Result};
use crate::ir::infer::{infer, Fact};
use crate::ir::lang::{is_identifier, Dims, Kind, OpCode, TensorLang};
use crate::ir::program::{Program, MAX_ELEMENTS};
use crate::ir::types::{DType, TensorType};

/// The schema this module reads and writes.
pub const GRAPH_SCHEMA: &str = "eqfuse.graph/1";

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Graph {
    schema: String,
    #[serde(default)]
    dims: Vec<DimJson>,
    inputs: Vec<InputJson>,
    nodes: Vec<NodeJson>,
    outputs: Vec<OutputJson>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct DimJson {
    name: String,
    value: u64,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct InputJson {
    name: String,
    dtype: DType,
    shape: Vec<u64>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct NodeJson {
    /// An op-table spelling, or one of the leaves `const`, `input`, `dims`, `dtype`.
    op: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    args: Vec<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    value: Option<Value>,
    /// The binding name the program gave this node, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    name: Option<String>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct OutputJson {
    name: String,
    node: u64,
}

/// The JSON graph of a program.
pub fn program_to_json(p: &Program) -> Value {
    let nodes = p.expr().as_ref().iter().enumerate().map(|(i, n)| node_json(p, egg::Id::from(i), n)).collect();
    let graph = Graph {
        schema: GRAPH_SCHEMA.to_string(),
        dims: p.dims.iter().map(|(n, v)| DimJson { name: n.clone(), value: *v as u64 }).collect(),
        inputs: p
            .inputs
            .iter()
            .map(|i| InputJson {
                name: i.name.clone(),
                dtype: i.ty.dtype,
                shape: i.ty.shape.iter().map(|&d| d as u64).collect(),
            })
            .collect(),
        nodes,
        outputs: p
            .outputs
            .iter()
            .map(|o| OutputJson { name: o.name.clone(), node: usize::from(o.id) as u64 })
            .collect(),
    };
    // These structs hold only strings, integers and JSON values, which always serialize.
    serde_json::to_value(graph).expect("a graph always serializes")
}

fn node_json(p: &Program, id: egg::Id, node: &TensorLang) -> NodeJson {
    let leaf = |op: &str, value: Value| NodeJson { op: op.to_string(), args: vec![], value: Some(value), name: None };
    let mut n = match node {
        TensorLang::Num(v) => leaf("const", number(v.value())),
        TensorLang::Var(s) => return leaf("input", Value::from(s.as_str())),
        TensorLang::Dims(d) => leaf("dims", Value::from(d.0.iter().map(|&x| x as u64).collect::<Vec<_>>())),
        TensorLang::Type(t) => leaf("dtype", Value::from(t.name())),
        TensorLang::Op(code, ch) => NodeJson {
            op: code.name().to_string(),
            args: ch.iter().map(|&c| usize::from(c) as u64).collect(),
            value: None,
            name: None,
        },
    };
    n.name = p.name(id).map(str::to_string);
    n
}

/// Whole numbers are written as integers (`-1`, not `-1.0`), so graphs read naturally. JSON has
/// no infinity or NaN: those are the strings `"inf"`, `"-inf"` and `"nan"` (a `-inf` mask fill
/// an ONNX model carries), which [`program_from_json`] reads back.
fn number(v: f64) -> Value {
    if v.is_nan() {
        Value::from("nan")
    } else if v.is_infinite() {
        Value::from(if v > 0.0 { "inf" } else { "-inf" })
    } else if v.fract() == 0.0 && v.abs() < 9.0e15 {
        Value::from(v as i64)
    } else {
        Value::from(v)
    }
}

/// Reads a JSON graph. `file` names it in errors and becomes [`Program::source`].
pub fn program_from_json(file: &str, text: &str) -> Result<Program> {
    // Parse to a value first, so that a graph of another schema is reported as such rather than
    // as whatever field it lacks.
    let value: Value = serde_json::from_str(text).map_err(|e| serde_error(file, text, e))?;
    match value.get("schema").and_then(Value::as_str) {
        Some(GRAPH_SCHEMA) => {}
        Some(other) => {
            return Err(invalid(file, format!("schema `{other}` is not supported; expected `{GRAPH_SCHEMA}`")))
        }
        None => return Err(invalid(file, format!("no \"schema\" field; expected \"schema\": \"{GRAPH_SCHEMA}\""))),
    }
    let graph: Graph = serde_json::from_str(text).map_err(|e| serde_error(file, text, e))?;
    build(file, &graph).map_err(|m| invalid(file, m))
}

fn invalid(file: &str, msg: String) -> Error {
    Error::Invalid(format!("{file}: {msg}"))
}

/// serde_json counts columns in bytes; diagnostics count characters.
fn serde_error(file: &str, text: &str, e: serde_json::Error) -> Error {
    if e.line() == 0 {
        return invalid(file, e.to_string());
    }
    let line = text.lines().nth(e.line() - 1).unwrap_or("");
    let bytes = e.column().min(line.len());
    let col = line.char_indices().take_while(|&(i, _)| i < bytes).count().max(1);
    let msg = e.to_string();
    // serde_json appends " at line L column C"; the diagnostic says where already.
    let msg = msg.split(" at line ").next().unwrap_or(&msg).to_string();
    Error::input(Diagnostic::at(file, text, e.line(), col, msg))
}

fn build(file: &str, g: &Graph) -> Result<Program, String> {
    let mut p = Program::new(file);
    p.dims = dims(&g.dims)?;
    let inputs = declared_inputs(&g.inputs)?;
    if g.nodes.is_empty() {
        return Err("the graph has no nodes".to_string());
    }
    let mut ids = Vec::with_capacity(g.nodes.len());
    for (i, n) in g.nodes.iter().enumerate() {
        let id = add_node(&mut p, &inputs, &ids, n).map_err(|m| format!("node {i} (`{}`): {m}", n.op))?;
        if let Some(name) = &n.name {
            if !is_identifier(name) {
                return Err(format!("node {i} (`{}`): name `{name}` is not an identifier", n.op));
            }
            p.name_node(id, name);
        }
        ids.push(id);
    }
    // Inputs that no node uses are still part of the program's signature.
    for (name, ty) in inputs {
        if p.input(&name).is_none() {
            p.add_input(&name, ty).map_err(|m| format!("input `{name}`: {m}"))?;
        }
    }
    outputs(&mut p, &g.outputs, &ids)?;
    Ok(p)
}

fn dims(ds: &[DimJson]) -> Result<Vec<(String, usize)>, String> {
    let mut out: Vec<(String, usize)> = vec![];
    for d in ds {
        if !is_identifier(&d.name) {
            return Err(format!("dim name `{}` is not an identifier", d.name));
        }
        if out.iter().any(|(n, _)| *n == d.name) {
            return Err(format!("dim `{}` is declared twice", d.name));
        }
        out.push((d.name.clone(), size(d.value).map_err(|m| format!("dim `{}`: {m}", d.name))?));
    }
    Ok(out)
}

fn size(v: u64) -> Result<usize, String> {
    if v == 0 || v > MAX_ELEMENTS as u64 {
        return Err(format!("size {v} is not between 1 and 2^48"));
    }
    Ok(v as usize)
}

fn sizes(vs: &[u64]) -> Result<Vec<usize>, String> {
    vs.iter().map(|&v| size(v)).collect()
}

fn declared_inputs(ins: &[InputJson]) -> Result<Vec<(String, TensorType)>, String> {
    let mut out: Vec<(String, TensorType)> = vec![];
    for i in ins {
        if !is_identifier(&i.name) {
            return Err(format!("input name `{}` is not an identifier", i.name));
        }
        if out.iter().any(|(n, _)| *n == i.name) {
            return Err(format!("input `{}` is declared twice", i.name));
        }
        let shape = sizes(&i.shape).map_err(|m| format!("input `{}`: {m}", i.name))?;
        out.push((i.name.clone(), TensorType::new(i.dtype, shape)));
    }
    Ok(out)
}

/// Adds one node; `ids` maps earlier node indices to program ids.
fn add_node(
    p: &mut Program,
    inputs: &[(String, TensorType)],
    ids: &[egg::Id],
    n: &NodeJson,
) -> Result<egg::Id, String> {
    let is_leaf = matches!(n.op.as_str(), "const" | "input" | "dims" | "dtype");
    if is_leaf && !n.args.is_empty() {
        return Err("a leaf takes no args".to_string());
    }
    if !is_leaf && n.value.is_some() {
        return Err("an operator takes args, not a value".to_string());
    }
    let value = n.value.as_ref().unwrap_or(&Value::Null);
    match n.op.as_str() {
        "const" => constant(p, value),
        "input" => input(p, inputs, value),
        "dims" => shape(p, value),
        "dtype" => dtype(p, value),
        op => operator(p, ids, op, &n.args),
    }
}

fn constant(p: &mut Program, value: &Value) -> Result<egg::Id, String> {
    match (value.as_f64(), value.as_str()) {
        (Some(v), _) if (v as f32).is_finite() => Ok(p.num(v)),
        (Some(v), _) => {
            Err(format!("value {v:e} is beyond the range of f32 (write \"inf\" or \"-inf\" for an infinity)"))
        }
        (_, Some("inf")) => Ok(p.num(f64::INFINITY)),
        (_, Some("-inf")) => Ok(p.num(f64::NEG_INFINITY)),
        (_, Some("nan")) => Ok(p.num(f64::NAN)),
        _ => Err(format!("value must be a number, \"inf\", \"-inf\" or \"nan\", got {value}")),
    }
}

fn input(p: &mut Program, inputs: &[(String, TensorType)], value: &Value) -> Result<egg::Id, String> {
    let name = value.as_str().ok_or_else(|| format!("value must be an input name, got {value}"))?;
    let (_, ty) = inputs.iter().find(|(n, _)| n == name).ok_or_else(|| format!("`{name}` is not in \"inputs\""))?;
    if p.input(name).is_some() {
        return Err(format!("input `{name}` has two nodes"));
    }
    p.add_input(name, ty.clone())
}

fn shape(p: &mut Program, value: &Value) -> Result<egg::Id, String> {
    let bad = || format!("value must be a list of sizes, got {value}");
    let items = value.as_array().ok_or_else(bad)?;
    let raw = items.iter().map(|v| v.as_u64().ok_or_else(bad)).collect::<Result<Vec<_>, _>>()?;
    let dims = sizes(&raw)?;
    match dims.iter().try_fold(1usize, |n, &d| n.checked_mul(d)) {
        Some(n) if n <= MAX_ELEMENTS => p.add(TensorLang::Dims(Dims(dims))),
        _ => Err("the shape has more than 2^48 elements".to_string()),
    }
}

fn dtype(p: &mut Program, value: &Value) -> Result<egg::Id, String> {
    match value.as_str().map(str::parse::<DType>) {
        Some(Ok(t)) => p.add(TensorLang::Type(t)),
        _ => Err(format!("value must be a dtype (f32 f16 bf16 i32 bool), got {value}")),
    }
}

fn operator(p: &mut Program, ids: &[egg::Id], op: &str, args: &[u64]) -> Result<egg::Id, String> {
    let code = OpCode::from_name(op).ok_or_else(|| format!("unknown op `{op}`"))?;
    let children = args
        .iter()
        .map(|&a| ids.get(a as usize).copied().ok_or_else(|| format!("arg {a} is not an earlier node")))
        .collect::<Result<Vec<_>, _>>()?;
    if code.kind() == Kind::Grad {
        let facts: Vec<&Fact> = children.iter().map(|&c| p.fact(c)).collect();
        infer(code, &facts)?;
        return crate::autodiff::grad_of(p, children[0], &children[1..]).map(|g| g[0]);
    }
    p.add(TensorLang::op(code, children))
}

fn outputs(p: &mut Program, outs: &[OutputJson], ids: &[egg::Id]) -> Result<(), String> {
    if outs.is_empty() {
        return Err("the graph has no outputs".to_string());
    }
    for o in outs {
        if !is_identifier(&o.name) {
            return Err(format!("output name `{}` is not an identifier", o.name));
        }
        let id = ids.get(o.node as usize).copied().ok_or_else(|| format!("output `{}`: no node {}", o.name, o.node))?;
        if p.fact(id).weak {
            return Err(format!(
                "output `{}`: node {} is a constant, not a tensor computed from inputs",
                o.name, o.node
            ));
        }
        p.add_output(&o.name, id).map_err(|m| format!("output `{}`: {m}", o.name))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const SRC: &str =
        "dim N = 4\ninput x: f32[N, 3]\ny = reshape(cast(x, bf16), [3, N])\nz = sum(y, -1) / N\noutput z, y\n";

    #[test]
    fn round_trip() {
        let p = crate::frontend::parse::parse_program("t.eqf", SRC, &[]).unwrap();
        let j = program_to_json(&p);
        let q = program_from_json("t.json", &j.to_string()).unwrap();
        assert_eq!(p.expr(), q.expr());
        assert_eq!(p.dims, q.dims);
        assert_eq!(p.outputs, q.outputs);
        assert_eq!(p.inputs, q.inputs);
    }

    /// Numbers are read exactly (serde_json's `float_roundtrip`): f32's lowest value, the
    /// literal of a mask that an exported model compares with (`scores + mask == lowest`),
    /// read one f64 step off would never equal the f32 scores it meets.
    #[test]
    fn literals_are_read_exactly() {
        let text = r#"{"schema": "eqfuse.graph/1", "inputs": [{"name": "x", "dtype": "f32", "shape": [4]}],
            "nodes": [{"op": "input", "value": "x"}, {"op": "const", "value": -3.4028234663852886e+38},
            {"op": "==", "args": [0, 1]}], "outputs": [{"name": "y", "node": 2}]}"#;
        let j = program_to_json(&program_from_json("g.json", text).unwrap());
        let consts: Vec<f64> = j["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|n| n["op"] == "const")
            .filter_map(|n| n["value"].as_f64())
            .collect();
        assert!(consts.contains(&(f32::MIN as f64)), "{consts:?}");
    }

    #[test]
    fn errors_name_the_node() {
        let text = r#"{"schema": "eqfuse.graph/1", "inputs": [{"name": "x", "dtype": "f32", "shape": [4]}],
            "nodes": [{"op": "input", "value": "x"}, {"op": "const", "value": 5}, {"op": "sum", "args": [0, 1]}],
            "outputs": [{"name": "y", "node": 2}]}"#;
        let e = program_from_json("g.json", text).unwrap_err().to_string();
        assert!(e.starts_with("g.json: node 2 (`sum`): axis 5 is out of range"), "{e}");
        let e = program_from_json("g.json", "{\"schema\": \n  x}").unwrap_err().to_string();
        assert!(e.starts_with("g.json:2:3: "), "{e}");
    }
}
