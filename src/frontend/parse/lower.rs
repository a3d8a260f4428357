//! Lowering: `.eqf` statements to a typed [`Program`], resolving names, dims and functions.
//!
//! Invariant: every node is type-checked as it is added, and every error carries the position of
//! the token it is about (an operator or call for type errors, a name for scope errors).

use std::collections::HashMap;

use super::syntax::{Ast, Expr, Spanned, Stmt};
use super::{PError, Pos};
use crate::ir::infer::{infer, Fact};
use crate::ir::lang::{is_identifier, Dims, Kind, OpCode, TensorLang, Unary, OPS};
use crate::ir::program::{Program, MAX_ELEMENTS};
use crate::ir::scalar::{binary, unary};
use crate::ir::types::{DType, TensorType};

/// What a name in scope stands for.
#[derive(Clone, Copy)]
enum Meaning {
    /// A `dim`: a size, and a constant in expressions.
    Dim(usize),
    /// An input or a binding.
    Value(egg::Id),
}

#[derive(Clone, Copy)]
struct Binding {
    meaning: Meaning,
    line: usize,
}

/// Words that start statements and so cannot name values.
const KEYWORDS: &[&str] = &["dim", "input", "output"];

/// Builds a program one statement at a time.
pub(super) struct Builder<'a> {
    pub prog: Program,
    scope: HashMap<String, Binding>,
    overrides: &'a [(String, usize)],
    pub statements: usize,
    pub outputs: usize,
}

impl<'a> Builder<'a> {
    pub(super) fn new(file: &str, overrides: &'a [(String, usize)]) -> Builder<'a> {
        Builder { prog: Program::new(file), scope: HashMap::new(), overrides, statements: 0, outputs: 0 }
    }

    pub(super) fn statement(&mut self, stmt: Stmt) -> Result<(), PError> {
        self.statements += 1;
        match stmt {
            Stmt::Dim { name, value } => self.dim(&name, &value),
            Stmt::Input { name, dtype, shape } => self.input(&name, &dtype, &shape),
            Stmt::Bind { name, expr } => self.bind(&name, &expr),
            Stmt::Output(names) => names.iter().try_for_each(|n| self.output(n)),
        }
    }

    /// Makes `name` mean `meaning`.
    fn declare(&mut self, name: &Spanned, meaning: Meaning) -> Result<(), PError> {
        self.check_free(name)?;
        self.scope.insert(name.text.clone(), Binding { meaning, line: name.pos.line });
        Ok(())
    }

    /// Names are bound once, so a program reads top to bottom; reserved words never name values.
    fn check_free(&self, name: &Spanned) -> Result<(), PError> {
        let n = name.text.as_str();
        let reserved = if KEYWORDS.contains(&n) {
            Some("is a keyword")
        } else if n.parse::<DType>().is_ok() {
            Some("is a dtype")
        } else if function(n).is_some() {
            Some("is a function")
        } else {
            None
        };
        if let Some(why) = reserved {
            return Err(PError::new(name.pos, format!("`{n}` {why} and cannot name a value")));
        }
        if let Some(b) = self.scope.get(n) {
            return Err(PError::new(
                name.pos,
                format!("`{n}` is already declared on line {}; names are bound once", b.line),
            ));
        }
        Ok(())
    }

    fn dim(&mut self, name: &Spanned, value: &Spanned) -> Result<(), PError> {
        self.check_free(name)?;
        let declared = positive_size(value)?;
        let size = self.overrides.iter().rev().find(|(n, _)| *n == name.text).map_or(declared, |&(_, v)| v);
        self.declare(name, Meaning::Dim(size))?;
        self.prog.dims.push((name.text.clone(), size));
        Ok(())
    }

    fn input(&mut self, name: &Spanned, dtype: &Spanned, shape: &[Spanned]) -> Result<(), PError> {
        // Checked first so that errors come in reading order, and a reserved or repeated name gets
        // the scope error rather than the program builder's.
        self.check_free(name)?;
        let dt = parse_dtype(dtype)?;
        let shape = shape.iter().map(|s| self.size(s)).collect::<Result<Vec<_>, _>>()?;
        let id = self.prog.add_input(&name.text, TensorType::new(dt, shape)).map_err(|m| PError::new(name.pos, m))?;
        self.declare(name, Meaning::Value(id))
    }

    /// A size in an input's shape or a shape list: a positive literal or a dim name.
    fn size(&self, s: &Spanned) -> Result<usize, PError> {
        if s.number {
            return positive_size(s);
        }
        match self.scope.get(&s.text) {
            Some(Binding { meaning: Meaning::Dim(v), .. }) => Ok(*v),
            Some(_) => Err(PError::new(s.pos, format!("`{}` is a tensor, not a dim", s.text))),
            None => {
                let hint = self.suggest(&s.text, |m| matches!(m, Meaning::Dim(_)));
                Err(PError::new(s.pos, format!("unknown dim `{}`{hint}", s.text)))
            }
        }
    }

    fn bind(&mut self, name: &Spanned, expr: &Expr) -> Result<(), PError> {
        // The name is checked before the expression, so errors come in reading order.
        self.check_free(name)?;
        let id = self.value(expr)?;
        self.declare(name, Meaning::Value(id))?;
        self.prog.name_node(id, &name.text);
        Ok(())
    }

    fn output(&mut self, name: &Spanned) -> Result<(), PError> {
        let id = match self.scope.get(&name.text) {
            Some(Binding { meaning: Meaning::Value(id), .. }) => *id,
            Some(_) => return Err(PError::new(name.pos, format!("`{}` is a dim, not a tensor", name.text))),
            None => return Err(self.unknown(&name.text, name.pos)),
        };
        if self.prog.fact(id).weak {
            return Err(PError::new(
                name.pos,
                format!("`{}` is a constant, not a tensor computed from inputs", name.text),
            ));
        }
        self.prog.add_output(&name.text, id).map_err(|m| PError::new(name.pos, m))?;
        self.outputs += 1;
        Ok(())
    }

    /// Lowers an expression that denotes a value (a tensor or a constant).
    fn value(&mut self, e: &Expr) -> Result<egg::Id, PError> {
        if let Some(v) = self.constant(e)? {
            return Ok(self.prog.num(v));
        }
        match &e.ast {
            Ast::Num { value, .. } => Ok(self.prog.num(*value)),
            Ast::Name(n) => self.lookup(n, e.pos),
            Ast::Call { name, args } => self.call(name, args, e.pos),
            Ast::List(_) => Err(PError::new(
                e.start,
                "a list literal is only allowed as the shape argument of reshape or broadcast",
            )),
            Ast::Op { code, args } => {
                let children = args.iter().map(|a| self.value(a)).collect::<Result<Vec<_>, _>>()?;
                self.op(*code, children, e.pos)
            }
        }
    }

    fn lookup(&mut self, name: &str, pos: Pos) -> Result<egg::Id, PError> {
        match self.scope.get(name).map(|b| b.meaning) {
            Some(Meaning::Value(id)) => Ok(id),
            Some(Meaning::Dim(v)) => Ok(self.prog.num(v as f64)),
            None => Err(self.unknown(name, pos)),
        }
    }

    /// The error for a name not in scope, saying what the name is if it is something else.
    fn unknown(&self, name: &str, pos: Pos) -> PError {
        let msg = if name.parse::<DType>().is_ok() {
            format!("`{name}` is a dtype; dtypes appear only as the second argument of cast")
        } else if function(name).is_some() {
            format!("`{name}` is a function; call it as `{name}(...)`")
        } else if KEYWORDS.contains(&name) {
            format!("`{name}` is a keyword and starts a statement")
        } else {
            format!("unknown name `{name}`{}", self.suggest(name, |_| true))
        };
        PError::new(pos, msg)
    }

    /// A "did you mean" for a misspelt name, chosen deterministically among names in scope.
    fn suggest(&self, name: &str, wanted: impl Fn(Meaning) -> bool) -> String {
        closest(name, self.scope.iter().filter(|(_, b)| wanted(b.meaning)).map(|(n, _)| n.as_str()))
            .map(|s| format!(" (did you mean `{s}`?)"))
            .unwrap_or_default()
    }

    fn call(&mut self, name: &str, args: &[Expr], pos: Pos) -> Result<egg::Id, PError> {
        let Some(code) = function(name) else {
            let msg = if self.scope.contains_key(name) {
                format!("`{name}` is a value, not a function")
            } else {
                let names = OPS.iter().map(|o| o.name).filter(|n| is_identifier(n));
                let hint = closest(name, names).map(|s| format!(" (did you mean `{s}`?)")).unwrap_or_default();
                format!("unknown function `{name}`{hint}")
            };
            return Err(PError::new(pos, msg));
        };
        let arity = code.info().arity;
        // `concat(a, b, c, ..., axis)`: nested binary concatenations, left to right.
        if code.kind() == Kind::Concat && args.len() > arity {
            let (axis, parts) = args.split_last().expect("more than three arguments");
            let axis = self.value(axis)?;
            let mut acc = self.value(&parts[0])?;
            for p in &parts[1..] {
                let v = self.value(p)?;
                acc = self.op(code, vec![acc, v, axis], pos)?;
            }
            return Ok(acc);
        }
        // `slice(x, axis, start, stop)`: a step of 1.
        if code.kind() == Kind::Slice && args.len() == arity - 1 {
            let mut children = args.iter().map(|a| self.value(a)).collect::<Result<Vec<_>, _>>()?;
            children.push(self.prog.num(1.0));
            return self.op(code, children, pos);
        }
        if args.len() != arity {
            let plural = if arity == 1 { "" } else { "s" };
            let sig = signature(code.kind());
            let msg = format!("`{name}` takes {arity} argument{plural} `{name}{sig}`, got {}", args.len());
            return Err(PError::new(pos, msg));
        }
        let children =
            args.iter().enumerate().map(|(i, a)| self.argument(code, i, a)).collect::<Result<Vec<_>, _>>()?;
        if code.kind() == Kind::Grad {
            return self.grad(code, &children, args, pos);
        }
        self.op(code, children, pos)
    }

    /// Lowers argument `i` of a call: dtypes and shape lists are attributes, the rest are values.
    fn argument(&mut self, code: OpCode, i: usize, a: &Expr) -> Result<egg::Id, PError> {
        match (code.kind(), i) {
            (Kind::Cast, 1) => {
                let dt = self.dtype_argument(a)?;
                self.add(TensorLang::Type(dt), a.pos)
            }
            (Kind::Reshape | Kind::Broadcast, 1) => {
                let dims = self.shape_argument(code, a)?;
                self.add(TensorLang::Dims(Dims(dims)), a.pos)
            }
            _ => self.value(a),
        }
    }

    fn dtype_argument(&self, a: &Expr) -> Result<DType, PError> {
        match &a.ast {
            Ast::Name(n) => parse_dtype(&Spanned { text: n.clone(), pos: a.pos, number: false }),
            _ => Err(PError::new(a.start, "the second argument of cast must be a dtype (f32 f16 bf16 i32 bool)")),
        }
    }

    fn shape_argument(&self, code: OpCode, a: &Expr) -> Result<Vec<usize>, PError> {
        let Ast::List(items) = &a.ast else {
            let msg = format!("the second argument of {} must be a shape list such as `[4, N]`", code.name());
            return Err(PError::new(a.start, msg));
        };
        let dims = items.iter().map(|item| self.size(&list_item(item)?)).collect::<Result<Vec<_>, _>>()?;
        match dims.iter().try_fold(1usize, |n, &d| n.checked_mul(d)) {
            Some(n) if n <= MAX_ELEMENTS => Ok(dims),
            _ => Err(PError::new(a.start, "this shape has more than 2^48 elements")),
        }
    }

    /// `grad(loss, w)` is type-checked like any call (so its mistakes are reported first), then
    /// differentiated on the spot: the program gets the backward graph, never a `grad` node.
    fn grad(&mut self, code: OpCode, children: &[egg::Id], args: &[Expr], pos: Pos) -> Result<egg::Id, PError> {
        let facts: Vec<&Fact> = children.iter().map(|&c| self.prog.fact(c)).collect();
        infer(code, &facts).map_err(|m| PError::new(pos, m))?;
        if !matches!(self.prog.node(children[1]), TensorLang::Var(_)) {
            return Err(PError::new(args[1].start, "the second argument of grad must be an input"));
        }
        let g =
            crate::autodiff::grad_of(&mut self.prog, children[0], &children[1..]).map_err(|m| PError::new(pos, m))?;
        Ok(g[0])
    }

    fn op(&mut self, code: OpCode, children: Vec<egg::Id>, pos: Pos) -> Result<egg::Id, PError> {
        self.add(TensorLang::op(code, children), pos)
    }

    /// The value of an expression made only of literals, dims, constant bindings and pointwise
    /// ops, if it is one. Such an expression becomes one literal, so that attributes written
    /// `-1` or `1/8` are leaves that rules and evaluators can read, and no unused node is left.
    fn constant(&self, e: &Expr) -> Result<Option<f64>, PError> {
        let (code, args) = match &e.ast {
            Ast::Num { value, .. } => return Ok(Some(*value)),
            Ast::Name(n) => return Ok(self.named_constant(n)),
            Ast::Op { code, args } => (*code, args),
            Ast::Call { name, args } => match function(name) {
                Some(code) if code.info().arity == args.len() => (code, args),
                _ => return Ok(None),
            },
            Ast::List(_) => return Ok(None),
        };
        let mut values = Vec::with_capacity(args.len());
        for a in args {
            match self.constant(a)? {
                Some(v) => values.push(v),
                None => return Ok(None),
            }
        }
        // Comparisons and `not` give bool, which a literal cannot be: they stay nodes.
        let v = match code.kind() {
            Kind::Unary(u) if u != Unary::Not => unary(u, values[0]),
            Kind::Binary(b) if !b.is_comparison() => binary(b, values[0], values[1], false),
            _ => return Ok(None),
        };
        if !(v as f32).is_finite() {
            let msg = format!("folding the constants of `{}` gives a value beyond f32 or NaN", code.name());
            return Err(PError::new(e.pos, msg));
        }
        Ok(Some(v))
    }

    fn named_constant(&self, name: &str) -> Option<f64> {
        match self.scope.get(name)?.meaning {
            Meaning::Dim(v) => Some(v as f64),
            Meaning::Value(id) => self.prog.fact(id).konst.filter(|_| self.prog.fact(id).weak),
        }
    }

    fn add(&mut self, node: TensorLang, pos: Pos) -> Result<egg::Id, PError> {
        self.prog.add(node).map_err(|m| PError::new(pos, m))
    }
}

/// The op a call names, if any; symbolic operators (`+`) are not callable by name.
fn function(name: &str) -> Option<OpCode> {
    OpCode::from_name(name).filter(|c| is_identifier(c.name()))
}

/// How each kind of call is written, for argument-count errors.
fn signature(kind: Kind) -> &'static str {
    use crate::ir::lang::Composite as C;
    match kind {
        Kind::Unary(_) => "(x)",
        Kind::Binary(_) => "(a, b)",
        Kind::Reduce(_) => "(x, axis)",
        Kind::Where => "(cond, a, b)",
        Kind::Cast => "(x, dtype)",
        Kind::Transpose => "(x, axis_a, axis_b)",
        Kind::Reshape | Kind::Broadcast => "(x, [sizes])",
        Kind::MatMul => "(a, b)",
        Kind::Iota => "(n)",
        Kind::OneHot => "(indices, n)",
        Kind::Dropout => "(x, p, seed)",
        Kind::Grad => "(loss, w)",
        Kind::Gather => "(x, indices, axis)",
        Kind::ScatterAdd => "(indices, g, axis, n)",
        Kind::Slice => "(x, axis, start, stop[, step])",
        Kind::Concat => "(a, b[, ...], axis)",
        Kind::Composite(C::Softmax | C::LogSoftmax) => "(x, axis)",
        Kind::Composite(C::LayerNorm) => "(x, gamma, beta, eps)",
        Kind::Composite(C::RmsNorm) => "(x, gamma, eps)",
        Kind::Composite(C::CrossEntropy) => "(logits, targets)",
        Kind::Composite(C::Attention) => "(q, k, v, scale, causal)",
        Kind::Composite(C::AttentionBias) => "(q, k, v, bias, scale, causal)",
        Kind::Composite(C::AttentionLse) => "(q, k, scale, causal)",
        Kind::Composite(C::AttentionGrad(_)) => "(q, k, v, g, lse, delta, scale, causal)",
        Kind::Composite(C::AttentionBiasLse) => "(q, k, bias, scale, causal)",
        Kind::Composite(C::AttentionBiasGrad(_)) => "(q, k, v, g, stats, delta, bias, scale, causal)",
        Kind::Composite(C::AttentionDropout) => "(q, k, v, scale, causal, p, seed)",
        Kind::Composite(C::AttentionBiasDropout) => "(q, k, v, bias, scale, causal, p, seed)",
        Kind::Composite(C::AttentionDropoutGrad(_)) => "(q, k, v, g, lse, delta, scale, causal, p, seed)",
        Kind::Composite(C::AttentionBiasDropoutGrad(_)) => "(q, k, v, g, stats, delta, bias, scale, causal, p, seed)",
    }
}

/// An element of a shape list: an integer literal or a name (which must be a dim).
fn list_item(item: &Expr) -> Result<Spanned, PError> {
    match &item.ast {
        Ast::Num { value, int: true } => Ok(Spanned { text: value.to_string(), pos: item.pos, number: true }),
        Ast::Name(n) => Ok(Spanned { text: n.clone(), pos: item.pos, number: false }),
        _ => Err(PError::new(item.start, "a shape list holds positive integers and dim names only")),
    }
}

/// Sizes beyond this are refused outright; products are checked against the same bound.
const MAX_SIZE: u64 = MAX_ELEMENTS as u64;

fn positive_size(s: &Spanned) -> Result<usize, PError> {
    let t = s.text.as_str();
    if !t.trim_start_matches('-').bytes().all(|b| b.is_ascii_digit()) {
        return Err(PError::new(s.pos, format!("a size must be a positive integer, got `{t}`")));
    }
    match t.parse::<i128>() {
        Ok(v) if v <= 0 => Err(PError::new(s.pos, format!("a size must be positive, got {t}"))),
        Ok(v) if v <= MAX_SIZE as i128 => Ok(v as usize),
        _ => Err(PError::new(s.pos, format!("size {t} is too large (at most 2^48)"))),
    }
}

fn parse_dtype(s: &Spanned) -> Result<DType, PError> {
    s.text
        .parse::<DType>()
        .map_err(|()| PError::new(s.pos, format!("unknown dtype `{}`; expected f32, f16, bf16, i32 or bool", s.text)))
}

/// The candidate nearest to `name` by edit distance, if it is near enough to be a likely typo.
/// Names under three characters get no suggestion: any other short name would be "near".
fn closest<'n>(name: &str, candidates: impl Iterator<Item = &'n str>) -> Option<&'n str> {
    let limit = (name.chars().count() / 3).min(2);
    candidates.map(|c| (edit_distance(name, c), c)).filter(|&(d, _)| d > 0 && d <= limit).min().map(|(_, c)| c)
}

/// Levenshtein distance over characters.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, &cb) in b.iter().enumerate() {
            let cur = row[j + 1];
            row[j + 1] = (prev + usize::from(ca != cb)).min(row[j] + 1).min(cur + 1);
            prev = cur;
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suggestions() {
        assert_eq!(edit_distance("gamma", "gama"), 1);
        assert_eq!(closest("softmx", ["softmax", "sum"].into_iter()), Some("softmax"));
        assert_eq!(closest("q", ["zz"].into_iter()), None);
    }
}
