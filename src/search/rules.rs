//! The rule loader: `rules/*.rules` files, one ruleset per file, in a small egglog-like syntax.
//!
//! ```text
//! ; comment
//! (rewrite NAME LHS RHS [:if (COND ?v ...)]... [:inexact])
//! (birewrite NAME LHS RHS ...)      ; also NAME-rev, from RHS to LHS, with the same conditions
//! ```
//! Patterns are egg patterns over [`TensorLang`], built node by node the way egg's
//! `Pattern::from_str` builds them (`?name` is a variable, anything else goes through
//! `TensorLang`'s `FromOp`), one sub-expression at a time, so that an unknown operator or a
//! wrong arity is reported at its own line and column.
//! Conditions are looked up in the one registry, [`crate::search::conditions`].
//! Invariants: every load error is an [`Error::Input`] naming `FILE:LINE:COL`, never a panic; a
//! loaded rule only refers to variables its left side binds; rule names are unique across all
//! rulesets loaded together; and a loaded rule never merges classes of different types, because
//! its applier refuses an instantiation whose type differs from the matched class's (see
//! [`Rule::rewrite`]).

use std::collections::HashMap;
use std::fmt;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use egg::{ConditionalApplier, ENodeOrVar, FromOp, Id, Pattern, PatternAst, Rewrite, Subst, Var};

use crate::error::{Diagnostic, Error, Result};
use crate::ir::infer::Fact;
use crate::ir::lang::TensorLang;
use crate::search::analysis::{ShapeAnalysis, TensorGraph};
use crate::search::conditions::{self, NamedCondition};
use crate::search::native::{native_rules, NativeRule};

/// Rulesets run in this order; rulesets not listed run after them, by name.
pub const STAGE_ORDER: &[&str] = &["algebra", "patterns", "autodiff", "memory"];

/// The default rules, embedded in the binary.
const DEFAULT_RULES: &[(&str, &str)] = &[
    ("algebra", include_str!("../../rules/algebra.rules")),
    ("patterns", include_str!("../../rules/patterns.rules")),
    ("autodiff", include_str!("../../rules/autodiff.rules")),
];

/// One rewrite rule, as loaded from a rule file.
#[derive(Clone, Debug)]
pub struct Rule {
    pub name: String,
    /// The ruleset (file stem) it belongs to.
    pub ruleset: String,
    pub lhs: Pattern<TensorLang>,
    pub rhs: Pattern<TensorLang>,
    /// Named conditions (see [`CONDITIONS`](crate::CONDITIONS)) and their arguments; all must hold.
    pub conditions: Vec<(String, Vec<Var>)>,
    /// The rule changes floating-point results beyond what exact arithmetic would keep equal
    /// (reassociation, cancellation, approximations); a strict mode leaves it out.
    pub inexact: bool,
    pub file: String,
    /// 1-based line of the rule's opening parenthesis.
    pub line: usize,
}

/// The rules of one file; saturation runs each ruleset as one stage.
#[derive(Clone, Debug)]
pub struct RuleSet {
    pub name: String,
    pub rules: Vec<Rule>,
    /// Rules written in Rust that run in this stage beside the file's rules (the default
    /// `algebra` ruleset's, `search::native`); none for a ruleset read from a file.
    pub native: Vec<NativeRule>,
}

impl Rule {
    /// `FILE:LINE` of the rule.
    pub fn location(&self) -> String {
        format!("{}:{}", self.file, self.line)
    }

    /// Whether every condition of the rule holds for a match (false if a condition is unknown).
    pub fn conditions_hold(&self, egraph: &TensorGraph, subst: &Subst) -> bool {
        self.conditions
            .iter()
            .all(|(name, vars)| conditions::condition(name).is_some_and(|c| conditions::check(c, egraph, subst, vars)))
    }

    /// The egg rewrite. Its applier checks the conditions and then refuses any instantiation of
    /// the right side whose type (dtype, shape, weakness) differs from the matched class's, so
    /// that a rule that is not type-preserving cannot corrupt the e-graph.
    pub fn rewrite(&self) -> Result<Rewrite<TensorLang, ShapeAnalysis>> {
        Ok(self.guarded_rewrite()?.0)
    }

    /// [`Rule::rewrite`], with the counter of instantiations the type guard refused.
    pub(crate) fn guarded_rewrite(&self) -> Result<(Rewrite<TensorLang, ShapeAnalysis>, Arc<AtomicUsize>)> {
        let conditions = self
            .conditions
            .iter()
            .map(|(name, vars)| match conditions::condition(name) {
                Some(c) if c.arity == vars.len() => Ok((c, vars.clone())),
                _ => Err(Error::Invalid(format!(
                    "{}: rule `{}` uses unknown condition `{name}`",
                    self.location(),
                    self.name
                ))),
            })
            .collect::<Result<Vec<_>>>()?;
        let refused = Arc::new(AtomicUsize::new(0));
        let guard = Guard { conditions, rhs: self.rhs.ast.clone(), refused: refused.clone() };
        let applier = ConditionalApplier { condition: guard, applier: self.rhs.clone() };
        let rw = Rewrite::new(self.name.as_str(), self.lhs.clone(), applier)
            .map_err(|e| Error::Invalid(format!("{}: {e}", self.location())))?;
        Ok((rw, refused))
    }
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "(rewrite {} {} {}", self.name, self.lhs, self.rhs)?;
        for (name, vars) in &self.conditions {
            write!(f, " :if ({name}")?;
            for v in vars {
                write!(f, " {v}")?;
            }
            write!(f, ")")?;
        }
        if self.inexact {
            write!(f, " :inexact")?;
        }
        write!(f, ")")
    }
}

impl RuleSet {
    /// The egg rewrites of every rule, in file order, then the native rules'.
    pub fn rewrites(&self) -> Result<Vec<Rewrite<TensorLang, ShapeAnalysis>>> {
        let mut rws: Vec<_> = self.rules.iter().map(Rule::rewrite).collect::<Result<_>>()?;
        rws.extend(self.native.iter().map(NativeRule::rewrite));
        Ok(rws)
    }

    /// Whether the rule of this name (a `-rev` rule by its base name too) is `:inexact`.
    pub fn is_inexact(&self, name: &str) -> bool {
        let base = name.strip_suffix("-rev").unwrap_or(name);
        self.rules.iter().any(|r| r.inexact && (r.name == name || r.name == base))
            || self.native.iter().any(|r| r.inexact && r.name == name)
    }
}

/// The condition of every loaded rule: the named conditions, then the type guard.
struct Guard {
    conditions: Vec<(&'static NamedCondition, Vec<Var>)>,
    rhs: PatternAst<TensorLang>,
    refused: Arc<AtomicUsize>,
}

impl egg::Condition<TensorLang, ShapeAnalysis> for Guard {
    fn check(&self, egraph: &mut TensorGraph, eclass: Id, subst: &Subst) -> bool {
        if !self.conditions.iter().all(|(c, vars)| conditions::check(c, egraph, subst, vars)) {
            return false;
        }
        let ok = match (&egraph[eclass].data.fact, instantiated_fact(egraph, &self.rhs, subst)) {
            (Some(have), Some(new)) => same_fact(have, &new),
            _ => false,
        };
        if !ok {
            self.refused.fetch_add(1, Ordering::Relaxed);
        }
        ok
    }

    fn vars(&self) -> Vec<Var> {
        self.conditions.iter().flat_map(|(_, v)| v.iter().copied()).collect()
    }
}

/// The fact the analysis would give the pattern instantiated with `subst`, computed without
/// adding anything to the e-graph.
fn instantiated_fact(egraph: &TensorGraph, ast: &PatternAst<TensorLang>, subst: &Subst) -> Option<Fact> {
    let mut facts: Vec<Option<Fact>> = Vec::with_capacity(ast.len());
    for node in ast.as_ref() {
        let fact = match node {
            ENodeOrVar::Var(v) => subst.get(*v).and_then(|&id| egraph[id].data.fact.clone()),
            ENodeOrVar::ENode(n) => egraph.analysis.node_fact(n, |c| facts[usize::from(c)].clone()),
        };
        facts.push(fact);
    }
    facts.pop().flatten()
}

/// Equal types, weakness and attribute literals (constant values may differ only by folding).
fn same_fact(a: &Fact, b: &Fact) -> bool {
    a.ty == b.ty && a.weak == b.weak && a.dims == b.dims && a.dtype == b.dtype
}

/// Loads every `*.rules` file of a directory, one ruleset per file, in [`STAGE_ORDER`], as
/// written: [`crate::load_rules_dir`] also checks every rule's soundness.
pub fn parse_rules_dir(dir: impl AsRef<Path>) -> Result<Vec<RuleSet>> {
    let dir = dir.as_ref();
    let shown = dir.display().to_string();
    let mut files = vec![];
    for entry in std::fs::read_dir(dir).map_err(|e| Error::io(&shown, e))? {
        let path = entry.map_err(|e| Error::io(&shown, e))?.path();
        if path.extension().is_some_and(|e| e == "rules") {
            let stem = path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
            let text = std::fs::read_to_string(&path).map_err(|e| Error::io(path.display().to_string(), e))?;
            files.push((stem, path.display().to_string(), text));
        }
    }
    if files.is_empty() {
        return Err(Error::Invalid(format!("{shown}: no `.rules` files")));
    }
    files.sort_by_key(|(stem, _, _)| (stage_rank(stem), stem.clone()));
    let mut seen = HashMap::new();
    files.iter().map(|(stem, file, text)| parse_with(stem, file, text, &mut seen)).collect()
}

fn stage_rank(name: &str) -> usize {
    STAGE_ORDER.iter().position(|s| *s == name).unwrap_or(STAGE_ORDER.len())
}

/// The embedded default rulesets, in stage order, each with its native rules.
pub fn default_rules() -> Result<Vec<RuleSet>> {
    let mut seen = HashMap::new();
    DEFAULT_RULES
        .iter()
        .map(|(name, text)| {
            let mut set = parse_with(name, &format!("rules/{name}.rules"), text, &mut seen)?;
            set.native = native_rules(name);
            if let Some(dup) = set.native.iter().find(|n| seen.contains_key(n.name)) {
                return Err(Error::Invalid(format!("native rule `{}` has the name of a rule file's rule", dup.name)));
            }
            Ok(set)
        })
        .collect()
}

/// Parses the text of one rule file. `file` names it in error messages.
pub fn parse_ruleset(name: &str, file: &str, text: &str) -> Result<RuleSet> {
    parse_with(name, file, text, &mut HashMap::new())
}

/// Parses one file; `seen` maps rule names already loaded to their `FILE:LINE`.
fn parse_with(name: &str, file: &str, text: &str, seen: &mut HashMap<String, String>) -> Result<RuleSet> {
    let src = Source { file, text };
    let mut rules = vec![];
    for form in read_forms(&src)? {
        for rule in parse_form(&src, name, &form)? {
            if let Some(first) = seen.get(&rule.name) {
                return Err(src.err(form.pos(), format!("rule `{}` is already defined at {first}", rule.name)));
            }
            seen.insert(rule.name.clone(), rule.location());
            rules.push(rule);
        }
    }
    Ok(RuleSet { name: name.to_string(), rules, native: vec![] })
}

/// A 1-based line and column.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Pos {
    line: usize,
    col: usize,
}

/// An s-expression with the position of its first character.
#[derive(Clone, Debug)]
enum Sx {
    Atom(String, Pos),
    List(Vec<Sx>, Pos),
}

impl Sx {
    fn pos(&self) -> Pos {
        match self {
            Sx::Atom(_, p) | Sx::List(_, p) => *p,
        }
    }

    fn atom(&self) -> Option<&str> {
        match self {
            Sx::Atom(s, _) => Some(s),
            Sx::List(..) => None,
        }
    }

    /// The position of the first atom spelled `text`, if any.
    fn find(&self, text: &str) -> Option<Pos> {
        match self {
            Sx::Atom(s, p) => (s == text).then_some(*p),
            Sx::List(items, _) => items.iter().find_map(|i| i.find(text)),
        }
    }
}

/// A file being parsed, for diagnostics.
struct Source<'a> {
    file: &'a str,
    text: &'a str,
}

impl Source<'_> {
    fn err(&self, pos: Pos, message: impl Into<String>) -> Error {
        Error::input(Diagnostic::at(self.file, self.text, pos.line, pos.col, message))
    }
}

/// A character cursor that tracks line and column.
struct Cursor<'a> {
    chars: std::iter::Peekable<std::str::Chars<'a>>,
    pos: Pos,
}

impl Cursor<'_> {
    fn peek(&mut self) -> Option<char> {
        self.chars.peek().copied()
    }

    fn bump(&mut self) -> Option<char> {
        let c = self.chars.next()?;
        if c == '\n' {
            self.pos = Pos { line: self.pos.line + 1, col: 1 };
        } else {
            self.pos.col += 1;
        }
        Some(c)
    }
}

/// The deepest nesting of parentheses a rule file may have. Patterns are built and checked by
/// recursion over their s-expressions, so depth is bounded before any of that runs; the
/// largest default rule nests 9 deep.
const MAX_DEPTH: usize = 64;

/// Splits the file into top-level s-expressions. `;` starts a comment; a shape literal
/// `[4, 8]` is one atom even with spaces inside.
fn read_forms(src: &Source) -> Result<Vec<Sx>> {
    let mut cur = Cursor { chars: src.text.chars().peekable(), pos: Pos { line: 1, col: 1 } };
    let mut stack: Vec<(Vec<Sx>, Pos)> = vec![];
    let mut top = vec![];
    while let Some(c) = cur.peek() {
        let pos = cur.pos;
        match c {
            ';' => {
                while cur.peek().is_some_and(|c| c != '\n') {
                    cur.bump();
                }
            }
            c if c.is_whitespace() => {
                cur.bump();
            }
            '(' => {
                cur.bump();
                if stack.len() == MAX_DEPTH {
                    return Err(src.err(pos, format!("nested more than {MAX_DEPTH} deep")));
                }
                stack.push((vec![], pos));
            }
            ')' => {
                cur.bump();
                let (items, open) = stack.pop().ok_or_else(|| src.err(pos, "unexpected `)`"))?;
                push(&mut stack, &mut top, Sx::List(items, open));
            }
            _ => {
                let atom = read_atom(src, &mut cur)?;
                push(&mut stack, &mut top, Sx::Atom(atom, pos));
            }
        }
    }
    match stack.pop() {
        Some((_, open)) => Err(src.err(open, "this `(` is never closed")),
        None => Ok(top),
    }
}

fn push(stack: &mut [(Vec<Sx>, Pos)], top: &mut Vec<Sx>, sx: Sx) {
    match stack.last_mut() {
        Some((items, _)) => items.push(sx),
        None => top.push(sx),
    }
}

fn read_atom(src: &Source, cur: &mut Cursor) -> Result<String> {
    let start = cur.pos;
    let mut atom = String::new();
    if cur.peek() == Some('[') {
        while let Some(c) = cur.bump() {
            if c == '\n' {
                break;
            }
            if !c.is_whitespace() {
                atom.push(c);
            }
            if c == ']' {
                return Ok(atom);
            }
        }
        return Err(src.err(start, "this `[` is not closed on its line"));
    }
    while let Some(c) = cur.peek() {
        if c.is_whitespace() || matches!(c, '(' | ')' | ';') {
            break;
        }
        atom.push(c);
        cur.bump();
    }
    Ok(atom)
}

/// A rule's parts before conversion.
struct RawRule<'a> {
    name: &'a str,
    pos: Pos,
    lhs: &'a Sx,
    rhs: &'a Sx,
    conditions: Vec<(String, Vec<Var>)>,
    inexact: bool,
}

/// One `(rewrite ...)` or `(birewrite ...)` form; a birewrite gives two rules.
fn parse_form(src: &Source, ruleset: &str, form: &Sx) -> Result<Vec<Rule>> {
    let Sx::List(items, pos) = form else {
        return Err(src.err(form.pos(), "expected a `(rewrite ...)` or `(birewrite ...)` form"));
    };
    let both = match items.first().and_then(Sx::atom) {
        Some("rewrite") => false,
        Some("birewrite") => true,
        Some(other) => {
            return Err(src.err(items[0].pos(), format!("unknown form `{other}`; expected `rewrite` or `birewrite`")))
        }
        None => return Err(src.err(*pos, "expected `rewrite` or `birewrite` after `(`")),
    };
    if items.len() < 4 {
        return Err(src.err(*pos, "a rule needs a name, a left side and a right side: `(rewrite NAME LHS RHS)`"));
    }
    let name = rule_name(src, &items[1])?;
    let Options { conditions, inexact } = parse_options(src, &items[4..])?;
    let raw = RawRule { name, pos: *pos, lhs: &items[2], rhs: &items[3], conditions, inexact };
    let forward = build_rule(src, ruleset, &raw)?;
    if !both {
        return Ok(vec![forward]);
    }
    let rev_name = format!("{name}-rev");
    let reverse = RawRule { name: &rev_name, lhs: raw.rhs, rhs: raw.lhs, conditions: raw.conditions.clone(), ..raw };
    Ok(vec![forward, build_rule(src, ruleset, &reverse)?])
}

fn rule_name<'a>(src: &Source, sx: &'a Sx) -> Result<&'a str> {
    let ok = |s: &str| {
        s.starts_with(|c: char| c.is_ascii_alphabetic())
            && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    };
    match sx.atom() {
        Some(s) if ok(s) => Ok(s),
        _ => Err(src.err(sx.pos(), "a rule name is a word like `mul-one` (letters, digits, `-`, `_`)")),
    }
}

/// The options after a rule's right side.
#[derive(Default)]
struct Options {
    conditions: Vec<(String, Vec<Var>)>,
    inexact: bool,
}

/// Reads `:if (COND ?v ...)` and `:inexact`.
fn parse_options(src: &Source, items: &[Sx]) -> Result<Options> {
    let mut opts = Options::default();
    let mut it = items.iter();
    while let Some(item) = it.next() {
        match item.atom() {
            Some(":inexact") => opts.inexact = true,
            Some(":if") => {
                let c = it.next().ok_or_else(|| src.err(item.pos(), "`:if` needs a condition like `(positive ?x)`"))?;
                opts.conditions.push(parse_condition(src, c)?);
            }
            Some(other) => {
                return Err(src.err(item.pos(), format!("unknown option `{other}`; expected `:if` or `:inexact`")))
            }
            None => {
                return Err(src.err(item.pos(), "a rule has one left and one right side; put `:if` before a condition"))
            }
        }
    }
    Ok(opts)
}

fn parse_condition(src: &Source, sx: &Sx) -> Result<(String, Vec<Var>)> {
    let Sx::List(items, pos) = sx else {
        return Err(src.err(sx.pos(), "a condition is a list like `(positive ?x)`"));
    };
    let Some(name) = items.first().and_then(Sx::atom) else {
        return Err(src.err(*pos, "a condition starts with its name, like `(positive ?x)`"));
    };
    let Some(cond) = conditions::condition(name) else {
        let known: Vec<&str> = conditions::CONDITIONS.iter().map(|c| c.name).collect();
        return Err(src.err(items[0].pos(), format!("unknown condition `{name}`; known: {}", known.join(", "))));
    };
    if items.len() - 1 != cond.arity {
        let msg = format!("condition `{name}` takes {} argument(s), got {}: {}", cond.arity, items.len() - 1, cond.doc);
        return Err(src.err(*pos, msg));
    }
    let vars = items[1..]
        .iter()
        .map(|a| match a.atom().filter(|s| s.starts_with('?')).and_then(|s| s.parse::<Var>().ok()) {
            Some(v) => Ok(v),
            None => Err(src.err(a.pos(), "condition arguments are pattern variables like `?x`")),
        })
        .collect::<Result<_>>()?;
    Ok((name.to_string(), vars))
}

fn build_rule(src: &Source, ruleset: &str, raw: &RawRule) -> Result<Rule> {
    let lhs = pattern(src, raw.lhs)?;
    let rhs = pattern(src, raw.rhs)?;
    if let Some(ENodeOrVar::Var(_)) = lhs.ast.as_ref().last() {
        let msg = "the left side is a lone variable, which would match every class";
        return Err(src.err(raw.lhs.pos(), format!("rule `{}`: {msg}", raw.name)));
    }
    let bound = lhs.vars();
    let used = rhs.vars().into_iter().chain(raw.conditions.iter().flat_map(|(_, v)| v.iter().copied()));
    for v in used {
        if !bound.contains(&v) {
            let text = v.to_string();
            let pos = raw.rhs.find(&text).unwrap_or(raw.pos);
            return Err(src.err(pos, format!("rule `{}`: `{text}` is not bound by the left side {}", raw.name, lhs)));
        }
    }
    Ok(Rule {
        name: raw.name.to_string(),
        ruleset: ruleset.to_string(),
        lhs,
        rhs,
        conditions: raw.conditions.clone(),
        inexact: raw.inexact,
        file: src.file.to_string(),
        line: raw.pos.line,
    })
}

/// Builds an egg pattern node by node.
fn pattern(src: &Source, sx: &Sx) -> Result<Pattern<TensorLang>> {
    let mut ast = PatternAst::default();
    add_pattern(src, sx, &mut ast)?;
    Ok(Pattern::new(ast))
}

fn add_pattern(src: &Source, sx: &Sx, ast: &mut PatternAst<TensorLang>) -> Result<Id> {
    match sx {
        Sx::Atom(text, pos) => add_node(src, *pos, text, vec![], ast),
        Sx::List(items, pos) => {
            let Some(Sx::Atom(head, head_pos)) = items.first() else {
                return Err(src.err(*pos, "a pattern list starts with an operator, like `(exp ?x)`"));
            };
            let children = items[1..].iter().map(|c| add_pattern(src, c, ast)).collect::<Result<Vec<_>>>()?;
            add_node(src, *head_pos, head, children, ast)
        }
    }
}

fn add_node(src: &Source, pos: Pos, op: &str, children: Vec<Id>, ast: &mut PatternAst<TensorLang>) -> Result<Id> {
    // Variables as egg's `ENodeOrVar::from_op` reads them (its error type is not public).
    if op.starts_with('?') {
        if !children.is_empty() {
            return Err(src.err(pos, format!("pattern variable `{op}` cannot take arguments")));
        }
        let var = op.parse::<Var>().map_err(|e| src.err(pos, format!("bad pattern variable `{op}`: {e}")))?;
        return Ok(ast.add(ENodeOrVar::Var(var)));
    }
    match TensorLang::from_op(op, children) {
        Ok(TensorLang::Var(name)) => {
            Err(src.err(pos, format!("`{name}` is not an operator or a literal; pattern variables start with `?`")))
        }
        Ok(node) => Ok(ast.add(ENodeOrVar::ENode(node))),
        Err(e) => Err(src.err(pos, e.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load_err(text: &str) -> String {
        parse_ruleset("t", "t.rules", text).unwrap_err().to_string()
    }

    #[test]
    fn parses_rules_conditions_and_flags() {
        let text = "; c\n(rewrite exp-log (exp (log ?x)) ?x :if (positive ?x) :inexact)\n\
                    (birewrite sq (square ?x) (* ?x ?x))\n(rewrite r (reshape ?x [2, 3]) (reshape ?x [6]))";
        let set = parse_ruleset("t", "t.rules", text).unwrap();
        let names: Vec<&str> = set.rules.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names, ["exp-log", "sq", "sq-rev", "r"]);
        assert_eq!(set.rules[0].conditions, vec![("positive".to_string(), vec!["?x".parse().unwrap()])]);
        assert!(set.rules[0].inexact && !set.rules[1].inexact);
        assert_eq!(set.rules[2].lhs.to_string(), "(* ?x ?x)");
        assert_eq!(set.rules[3].line, 4);
        assert_eq!(set.rules[3].lhs.to_string(), "(reshape ?x [2,3])");
        assert!(set.rewrites().is_ok());
    }

    #[test]
    fn errors_name_file_line_and_column() {
        assert!(load_err("\n(rewrite a (frob ?x) ?x)").starts_with("t.rules:2:13: unknown operator `frob`"));
        assert!(load_err("(rewrite a (exp ?x ?y) ?x)").starts_with("t.rules:1:13: `exp` takes 1 arguments"));
        assert!(load_err("(rewrite a (exp ?x) ?y)").starts_with("t.rules:1:21: rule `a`: `?y` is not bound"));
        assert!(load_err("(rewrite a (exp ?x) ?x :if (shiny ?x))").starts_with("t.rules:1:29: unknown condition"));
        assert!(load_err("(rewrite a (exp ?x) ?x :if (positive ?x ?x))").starts_with("t.rules:1:28: condition"));
        assert!(load_err("(rewrite a (exp ?x) ?x :if (positive x))").contains("1:38: condition arguments"));
        assert!(load_err("(rewrite a (exp ?x) ?x)\n(rewrite a (log ?x) ?x)")
            .contains("2:1: rule `a` is already defined at t.rules:1"));
        assert!(load_err("(birewrite a (exp ?x) ?x)").contains("lone variable"));
        assert!(load_err("(birewrite b (+ ?x ?y) (exp ?x))").contains("`?y` is not bound"));
        assert!(load_err("(rewrite a (exp ?x)").starts_with("t.rules:1:1: this `(` is never closed"));
        assert!(load_err("(rewrite a (exp ?x) ?x))").starts_with("t.rules:1:24: unexpected `)`"));
        assert!(load_err("(rewrite a (exp x) x)").contains("`x` is not an operator"));
        assert!(load_err("(rewrite a (exp ?x) ?x :fast)").contains("unknown option `:fast`"));
        assert!(load_err("(rule a (exp ?x) ?x)").contains("unknown form `rule`"));
        assert!(load_err("(rewrite a (exp ?x))").contains("needs a name, a left side and a right side"));
    }

    #[test]
    fn deep_nesting_is_refused_not_a_stack_overflow() {
        let n = 100_000;
        let text = format!("(rewrite deep {}?x{} ?x)", "(neg ".repeat(n), ")".repeat(n));
        assert!(load_err(&text).starts_with("t.rules:1:"), "{}", load_err(&text));
        assert!(load_err(&text).contains("nested more than 64 deep"));
    }

    #[test]
    fn default_rules_load_in_stage_order() {
        let sets = default_rules().unwrap();
        assert_eq!(sets[0].name, "algebra");
        assert_eq!(sets[1].name, "patterns");
        for set in &sets {
            assert!(set.rewrites().is_ok(), "{}", set.name);
        }
    }

    #[test]
    fn duplicate_names_across_files_are_refused() {
        let dir = std::env::temp_dir().join(format!("eqfuse-rules-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("patterns.rules"), "(rewrite a (exp ?x) ?x)").unwrap();
        std::fs::write(dir.join("algebra.rules"), "(rewrite b (log ?x) ?x)\n(rewrite a (neg ?x) ?x)").unwrap();
        let err = parse_rules_dir(&dir).unwrap_err().to_string();
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(err.contains("patterns.rules:1:1: rule `a` is already defined at"), "{err}");
        assert!(err.contains("algebra.rules:2"), "{err}");
    }
}
