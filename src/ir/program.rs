//! `Program`: a typed tensor program, the form every front end produces.
//!
//! It is a hash-consed `RecExpr<TensorLang>` (so equal subexpressions are one node) plus the
//! declared dims, inputs with their types, binding names and named outputs. A front end that
//! knows the value of an input (an ONNX initializer: a weight) records it in [`Program::values`].
//! Invariant: every node of `expr` has a [`Fact`] in `facts` and was type-checked when added;
//! a `Program` that exists is well typed.

use std::collections::{BTreeMap, HashMap};

use egg::{Id, Language, RecExpr, Symbol};

use crate::ir::infer::{infer, Fact};
use crate::ir::lang::{Kind, OpCode, TensorLang};
use crate::ir::tensor::Tensor;
use crate::ir::types::{DType, TensorType};

/// The most elements one tensor may have. Far beyond any device, and small enough that element
/// and byte counts (`numel * 4`) never overflow, whatever sizes a program declares.
pub const MAX_ELEMENTS: usize = 1 << 48;

/// The most axes one tensor may have (NumPy's limit). Far beyond any program, and small
/// enough that every loop over axes, every stride table and every `.npy` header stays small.
pub const MAX_RANK: usize = 64;

/// Rejects a type whose element count would overflow or exceed [`MAX_ELEMENTS`], or whose rank
/// exceeds [`MAX_RANK`].
fn check_size(ty: &TensorType) -> Result<(), String> {
    if ty.rank() > MAX_RANK {
        return Err(format!("a tensor of rank {} has more than {MAX_RANK} axes", ty.rank()));
    }
    match ty.shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d)) {
        Some(n) if n <= MAX_ELEMENTS => Ok(()),
        _ => Err(format!("a tensor of type {ty} would have more than 2^48 elements")),
    }
}

/// Rejects a literal that meets an i32 tensor with a value i32 cannot hold (`x * 3e9` or
/// `x < 3e9` with `x: i32`): i32 arithmetic wraps, so such a literal would silently mean
/// another number.
fn check_int_literals(args: &[&Fact]) -> Result<(), String> {
    let int = |a: &&Fact| !a.weak && a.ty.as_ref().is_some_and(|t| t.dtype == DType::I32);
    if !args.iter().any(int) {
        return Ok(());
    }
    let range = i32::MIN as f64..=i32::MAX as f64;
    match args.iter().filter(|a| a.weak).find_map(|a| a.konst.filter(|v| !range.contains(v))) {
        Some(v) => Err(format!("the literal {v} is out of range for i32 (-2147483648 to 2147483647)")),
        None => Ok(()),
    }
}

/// A declared input.
#[derive(Clone, Debug, PartialEq)]
pub struct Input {
    pub name: String,
    pub ty: TensorType,
    pub id: Id,
}

/// A named result.
#[derive(Clone, Debug, PartialEq)]
pub struct Output {
    pub name: String,
    pub id: Id,
}

/// A typed tensor program.
#[derive(Clone, Debug, Default)]
pub struct Program {
    /// Where it came from (a file name, or a name the caller chose); shown in plans.
    pub source: String,
    /// `dim NAME = VALUE` declarations, in order, after `--dim` overrides.
    pub dims: Vec<(String, usize)>,
    pub inputs: Vec<Input>,
    pub outputs: Vec<Output>,
    /// Values of inputs that the program itself supplies (ONNX initializers), by input name.
    /// Runs use them unless the caller gives that input; planning ignores them.
    pub values: BTreeMap<String, Tensor>,
    expr: RecExpr<TensorLang>,
    facts: Vec<Fact>,
    /// The first binding name given to each node, if any.
    names: Vec<Option<String>>,
    memo: HashMap<TensorLang, Id>,
}

impl Program {
    pub fn new(source: impl Into<String>) -> Program {
        Program { source: source.into(), ..Program::default() }
    }

    /// The nodes, children before parents.
    pub fn expr(&self) -> &RecExpr<TensorLang> {
        &self.expr
    }

    pub fn node(&self, id: Id) -> &TensorLang {
        &self.expr[id]
    }

    pub fn len(&self) -> usize {
        self.expr.len()
    }

    pub fn is_empty(&self) -> bool {
        self.expr.is_empty()
    }

    pub fn fact(&self, id: Id) -> &Fact {
        &self.facts[usize::from(id)]
    }

    /// The tensor type of a node; `None` for attribute leaves.
    pub fn ty(&self, id: Id) -> Option<&TensorType> {
        self.fact(id).ty.as_ref()
    }

    /// The binding name of a node, if the program named it.
    pub fn name(&self, id: Id) -> Option<&str> {
        self.names[usize::from(id)].as_deref()
    }

    /// The size a `dim` declared, if any.
    pub fn dim(&self, name: &str) -> Option<usize> {
        self.dims.iter().find(|(n, _)| n == name).map(|&(_, v)| v)
    }

    pub fn input(&self, name: &str) -> Option<&Input> {
        self.inputs.iter().find(|i| i.name == name)
    }

    /// Declares an input. Errors if the name is taken.
    pub fn add_input(&mut self, name: &str, ty: TensorType) -> Result<Id, String> {
        if self.input(name).is_some() {
            return Err(format!("input `{name}` is declared twice"));
        }
        if name.parse::<crate::ir::types::DType>().is_ok() || OpCode::from_name(name).is_some() {
            return Err(format!("`{name}` names a dtype or an operator and cannot name an input"));
        }
        check_size(&ty)?;
        let id = self.push(TensorLang::Var(Symbol::from(name)), Fact::tensor(ty.clone()));
        self.inputs.push(Input { name: name.to_string(), ty, id });
        self.name_node(id, name);
        Ok(id)
    }

    /// Adds a scalar constant.
    pub fn num(&mut self, v: f64) -> Id {
        self.push(TensorLang::num(v), Fact::constant(v))
    }

    /// Adds a node whose children are already in the program, checking its type.
    pub fn add(&mut self, node: TensorLang) -> Result<Id, String> {
        if let Some(&id) = self.memo.get(&node) {
            return Ok(id);
        }
        let fact = match &node {
            TensorLang::Num(n) => Fact::constant(n.value()),
            TensorLang::Dims(d) => Fact::dims(d.0.clone()),
            TensorLang::Type(t) => Fact::dtype(*t),
            TensorLang::Var(s) => {
                let i = self.input(s.as_str()).ok_or_else(|| format!("`{s}` is not a declared input"))?;
                Fact::tensor(i.ty.clone())
            }
            TensorLang::Op(code, children) => {
                if let Some(bad) = children.iter().find(|c| usize::from(**c) >= self.expr.len()) {
                    return Err(format!("child {bad} of `{}` is not in the program", code.name()));
                }
                let args: Vec<&Fact> = children.iter().map(|&c| self.fact(c)).collect();
                let inferred = infer(*code, &args)?;
                check_size(&inferred.ty)?;
                if matches!(code.kind(), Kind::Binary(_) | Kind::Where) {
                    check_int_literals(&args)?;
                }
                let konst = fold(*code, &args);
                Fact { ty: Some(inferred.ty), weak: inferred.weak, konst, dims: None, dtype: None }
            }
        };
        Ok(self.push(node, fact))
    }

    /// Adds an operator by kind.
    pub fn apply(&mut self, kind: Kind, children: Vec<Id>) -> Result<Id, String> {
        self.add(TensorLang::op(OpCode::of(kind), children))
    }

    fn push(&mut self, node: TensorLang, fact: Fact) -> Id {
        if let Some(&id) = self.memo.get(&node) {
            return id;
        }
        let id = self.expr.add(node.clone());
        self.facts.push(fact);
        self.names.push(None);
        self.memo.insert(node, id);
        id
    }

    /// Gives a node a binding name, unless it already has one.
    pub fn name_node(&mut self, id: Id, name: &str) {
        let slot = &mut self.names[usize::from(id)];
        if slot.is_none() {
            *slot = Some(name.to_string());
        }
    }

    /// Declares a result. Errors if the name is taken or the node is not a tensor.
    pub fn add_output(&mut self, name: &str, id: Id) -> Result<(), String> {
        if self.outputs.iter().any(|o| o.name == name) {
            return Err(format!("`{name}` is listed as an output twice"));
        }
        if self.ty(id).is_none() {
            return Err(format!("`{name}` is an attribute, not a tensor"));
        }
        // Names are files (`NAME.npy`) and kernel arguments: an output may carry an input's name
        // only when it is that input, passed through.
        if let Some(input) = self.input(name).filter(|i| i.id != id) {
            return Err(format!(
                "output `{name}` has the name of input `{}` but is another tensor; rename it",
                input.name
            ));
        }
        self.outputs.push(Output { name: name.to_string(), id });
        Ok(())
    }

    /// Builds a program from an expression (e.g. one extracted from an e-graph), keeping the
    /// inputs and output names of `like`. Fails if the expression is ill typed.
    pub fn from_expr(like: &Program, expr: &RecExpr<TensorLang>, roots: &[Id]) -> Result<Program, String> {
        let mut p = Program::new(like.source.clone());
        p.dims = like.dims.clone();
        p.values = like.values.clone();
        for i in &like.inputs {
            p.add_input(&i.name, i.ty.clone())?;
        }
        let mut map = Vec::with_capacity(expr.len());
        for node in expr.as_ref() {
            let n = node.clone().map_children(|c| map[usize::from(c)]);
            map.push(p.add(n)?);
        }
        if roots.len() != like.outputs.len() {
            return Err(format!("{} roots for {} outputs", roots.len(), like.outputs.len()));
        }
        for (o, &r) in like.outputs.iter().zip(roots) {
            p.add_output(&o.name, map[usize::from(r)])?;
        }
        Ok(p)
    }

    /// Builds a program from s-expressions (the form rules and tests use): inputs with their
    /// types, and each output as `(name, "(+ (* x 2) y)")`.
    pub fn from_sexprs(
        source: &str,
        inputs: &[(&str, TensorType)],
        outputs: &[(&str, &str)],
    ) -> Result<Program, String> {
        let mut p = Program::new(source);
        for (name, ty) in inputs {
            p.add_input(name, ty.clone())?;
        }
        for (name, text) in outputs {
            let expr: RecExpr<TensorLang> = text.parse().map_err(|e| format!("output `{name}`: {e}"))?;
            let mut map: Vec<Id> = Vec::with_capacity(expr.len());
            for node in expr.as_ref() {
                let n = node.clone().map_children(|c| map[usize::from(c)]);
                map.push(p.add(n).map_err(|e| format!("output `{name}`: {e}"))?);
            }
            let root = *map.last().ok_or_else(|| format!("output `{name}` is empty"))?;
            p.name_node(root, name);
            p.add_output(name, root)?;
        }
        Ok(p)
    }

    /// A copy of this program (same inputs, names and outputs) in which each node is first
    /// offered to `replace`, which gets the copy so far, the map from old nodes to new ones, and
    /// the old node; when it returns `None` the node is copied with its children mapped.
    pub fn rewrite_nodes(
        &self,
        mut replace: impl FnMut(&mut Program, &[Id], &TensorLang) -> Result<Option<Id>, String>,
    ) -> Result<Program, String> {
        let mut out = Program::new(self.source.clone());
        out.dims = self.dims.clone();
        out.values = self.values.clone();
        for i in &self.inputs {
            out.add_input(&i.name, i.ty.clone())?;
        }
        let mut map: Vec<Id> = Vec::with_capacity(self.len());
        for (i, node) in self.expr.as_ref().iter().enumerate() {
            let id = match replace(&mut out, &map, node)? {
                Some(id) => id,
                None => out.add(node.clone().map_children(|c| map[usize::from(c)]))?,
            };
            if let Some(name) = self.name(Id::from(i)) {
                out.name_node(id, name);
            }
            map.push(id);
        }
        for o in &self.outputs {
            out.add_output(&o.name, map[usize::from(o.id)])?;
        }
        Ok(out)
    }

    /// The nodes reachable from the outputs (inputs included, even if unused).
    pub fn live(&self) -> Vec<bool> {
        let mut live = vec![false; self.len()];
        for o in &self.outputs {
            live[usize::from(o.id)] = true;
        }
        for i in &self.inputs {
            live[usize::from(i.id)] = true;
        }
        for i in (0..self.len()).rev() {
            if live[i] {
                for &c in self.expr[Id::from(i)].children() {
                    live[usize::from(c)] = true;
                }
            }
        }
        live
    }
}

/// Folds a pointwise op over scalar constants; `None` when any argument is not constant.
pub fn fold(code: OpCode, args: &[&Fact]) -> Option<f64> {
    let v = match code.kind() {
        Kind::Unary(u) => crate::ir::scalar::unary(u, args[0].konst?),
        Kind::Binary(b) => {
            let int = args.iter().any(|a| a.ty.as_ref().is_some_and(|t| !t.dtype.is_float()) && !a.weak);
            crate::ir::scalar::binary(b, args[0].konst?, args[1].konst?, int)
        }
        _ => return None,
    };
    if !args.iter().all(|a| a.ty.as_ref().is_some_and(|t| t.shape.is_empty())) {
        return None;
    }
    v.is_finite().then_some(v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::lang::Binary;
    use crate::ir::types::DType;

    #[test]
    fn hash_consing_and_types() {
        let mut p = Program::new("t");
        let x = p.add_input("x", TensorType::new(DType::F32, vec![4, 8])).unwrap();
        let two = p.num(2.0);
        let a = p.apply(Kind::Binary(Binary::Mul), vec![x, two]).unwrap();
        let b = p.apply(Kind::Binary(Binary::Mul), vec![x, two]).unwrap();
        assert_eq!(a, b);
        assert_eq!(p.ty(a).unwrap().shape, vec![4, 8]);
        assert!(p.add_input("x", TensorType::scalar(DType::F32)).is_err());
    }
}
