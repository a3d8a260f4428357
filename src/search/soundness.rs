//! Rule soundness: a rule checked numerically on random instantiations, on the reference.
//!
//! For each rule, pattern variables get random sub-expressions: tensors of small random shapes
//! (size-1 axes and scalars included) and dtypes, weak literals, and literal axes, shapes and
//! constants where the variable sits in an attribute position. A variable a condition wants
//! `positive` (or `nonneg`, `nonzero`) is built so that the analysis can prove it (`exp(v)`,
//! `square(v) + 0.5`, ...), because conditions are evaluated by the real registry on a real
//! e-graph. An instantiation counts when its left side type-checks and the conditions hold;
//! then (a) the right side must type-check to the identical type (dtype, shape, weakness) and
//! (b) both sides, evaluated by the CPU reference on random inputs, must agree.
//! Invariant: a rule with no counted instantiation fails ("no test case"), so a rule cannot
//! pass by never being tested. The reference rounds every node to its dtype, so values are
//! compared with a tolerance scaled by the largest magnitude any node of either side reached.
//! The tests check every default rule with it; rules loaded from a folder (`--rules DIR`) are
//! checked with it before they are used ([`crate::load_rules_dir`]).

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use egg::{AstSize, ENodeOrVar, Extractor, Id, Language, PatternAst, RecExpr, Rewrite, Runner, Subst, Var};

use crate::ir::lang::{Composite, Dims, Kind, OpCode, TensorLang};
use crate::ir::program::Program;
use crate::ir::tensor::Tensor;
use crate::ir::types::{DType, TensorType};
use crate::reference::eval_all;
use crate::reference::rng::random_inputs;
use crate::search::analysis::{ShapeAnalysis, TensorGraph};
use crate::search::native::NativeRule;
use crate::search::rules::Rule;

/// Each rule is tried with tensors mostly of each of these dtypes in turn.
const DTYPES: [DType; 4] = [DType::F32, DType::Bf16, DType::I32, DType::Bool];
/// Counted instantiations wanted per rule and dtype.
const CASES: usize = 30;
/// Instantiations tried per rule and dtype at most.
const ATTEMPTS: usize = 4000;
/// Tries after which a dtype with no counted case is taken not to suit the rule.
const GIVE_UP: usize = 300;
/// Input draws per counted instantiation.
const SEEDS: u64 = 2;
/// Values at least this large in magnitude are mask fills (`-1e30`), not magnitudes that
/// rounding errors scale with: the tolerance's scale leaves them out.
const FILL_SCALE: f64 = 1e20;

/// SplitMix64: small, seeded, reproducible.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn chance(&mut self, p: f64) -> bool {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64 <= p
    }
    fn pick<T: Copy>(&mut self, xs: &[T]) -> T {
        xs[self.below(xs.len())]
    }
}

/// What a pattern variable stands for, from where it appears.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Role {
    Tensor,
    /// An i32 tensor of class indices (`onehot`, `cross_entropy` targets).
    Index,
    Axis,
    Dims,
    DType,
    /// A weak literal of any value (an epsilon, a scale).
    Literal,
    /// A weak literal of small integer value (a class count, an axis size).
    Int,
    /// A slice's start or stop: negative (from the end), in range, or past the end.
    Bound,
    /// A slice's step.
    Step,
    /// Dropout's seed: a literal, or an i32 input of shape `[]` or `[1]` (a seed given at run
    /// time).
    Seed,
    Flag,
    /// A mask's fill: a literal at most `crate::ir::index::MASK_FILL`.
    Fill,
    /// A bool mask from `iota`: true where key <= query on the base shape's scores (`false`), or
    /// where key > query (`true`), spelled one of several ways.
    Causal(bool),
    /// An additive causal mask: 0 where key <= query, a fill elsewhere.
    CausalBias,
    /// A bool tensor of a shape related to the base shape (an attention mask given as an input).
    Mask,
    /// A float tensor that is 0 everywhere, spelled as models spell it (`zero-bias`).
    ZeroBias,
}

/// Sign facts a condition asks of a tensor variable.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Need {
    Any,
    Positive,
    Nonneg,
    Nonzero,
}

fn position_role(kind: Kind, i: usize) -> Role {
    use Composite as C;
    match (kind, i) {
        (Kind::Reduce(_), 1) | (Kind::Transpose, 1 | 2) | (Kind::Composite(C::Softmax | C::LogSoftmax), 1) => {
            Role::Axis
        }
        (Kind::Reshape | Kind::Broadcast, 1) => Role::Dims,
        (Kind::Slice, 1) | (Kind::Concat, 2) | (Kind::Gather, 2) | (Kind::ScatterAdd, 2) => Role::Axis,
        (Kind::Slice, 2 | 3) => Role::Bound,
        (Kind::Slice, 4) => Role::Step,
        (Kind::ScatterAdd, 3) => Role::Int,
        (Kind::Gather, 1) | (Kind::ScatterAdd, 0) => Role::Index,
        (Kind::Cast, 1) => Role::DType,
        (Kind::OneHot, 1) | (Kind::Iota, 0) => Role::Int,
        (Kind::Dropout, 2) => Role::Seed,
        (Kind::OneHot, 0) | (Kind::Composite(C::CrossEntropy), 1) => Role::Index,
        (Kind::Composite(C::LayerNorm), 3) | (Kind::Composite(C::RmsNorm), 2) => Role::Literal,
        (Kind::Composite(C::Attention), 3) | (Kind::Composite(C::AttentionBias), 4) | (Kind::Dropout, 1) => {
            Role::Literal
        }
        (Kind::Composite(C::Attention), 4) | (Kind::Composite(C::AttentionBias), 5) => Role::Flag,
        _ => Role::Tensor,
    }
}

fn condition_role(name: &str, i: usize) -> Option<Role> {
    match (name, i) {
        ("const", 0) => Some(Role::Literal),
        ("int-const", 0) | ("axis-size", 2) | ("last-dim", 1) | ("stop-past", 3) => Some(Role::Int),
        ("stop-past", 2) => Some(Role::Axis),
        ("mask-fill", 0) => Some(Role::Fill),
        ("causal-keep", 0) => Some(Role::Causal(false)),
        ("causal-mask", 0) => Some(Role::Causal(true)),
        ("causal-bias", 0) => Some(Role::CausalBias),
        ("attention-mask", 0) => Some(Role::Mask),
        ("zero-bias", 0) => Some(Role::ZeroBias),
        _ => None,
    }
}

/// Every variable of the rule with its role and sign need, in order of first appearance.
fn variables(rule: &Rule) -> Vec<(Var, Role, Need)> {
    variables_of(&[&rule.lhs.ast], &rule.conditions)
}

/// The variables of left sides instantiated with one substitution, and of their conditions.
fn variables_of(asts: &[&PatternAst<TensorLang>], conditions: &[(String, Vec<Var>)]) -> Vec<(Var, Role, Need)> {
    let mut vars: Vec<(Var, Role, Need)> = vec![];
    for ast in asts {
        pattern_variables(ast.as_ref(), &mut vars);
    }
    condition_variables(conditions, &mut vars);
    vars
}

fn pattern_variables(ast: &[ENodeOrVar<TensorLang>], vars: &mut Vec<(Var, Role, Need)>) {
    for node in ast {
        match node {
            ENodeOrVar::Var(v) if !vars.iter().any(|(w, ..)| w == v) => vars.push((*v, Role::Tensor, Need::Any)),
            ENodeOrVar::ENode(TensorLang::Op(code, ch)) => {
                for (i, c) in ch.iter().enumerate() {
                    if let ENodeOrVar::Var(v) = &ast[usize::from(*c)] {
                        let role = position_role(code.kind(), i);
                        if let Some(e) = vars.iter_mut().find(|(w, ..)| w == v) {
                            if role != Role::Tensor {
                                e.1 = role;
                            }
                        }
                    }
                }
            }
            _ => {}
        }
    }
}

fn condition_variables(conditions: &[(String, Vec<Var>)], vars: &mut [(Var, Role, Need)]) {
    for (name, args) in conditions {
        for (i, v) in args.iter().enumerate() {
            let Some(e) = vars.iter_mut().find(|(w, ..)| w == v) else { continue };
            if let Some(r) = condition_role(name, i) {
                e.1 = r;
            }
            e.2 = match (name.as_str(), e.2) {
                ("positive", _) => Need::Positive,
                ("nonneg", Need::Any) => Need::Nonneg,
                ("nonzero", Need::Any) => Need::Nonzero,
                (_, n) => n,
            };
        }
    }
}

/// One random instantiation being built.
struct Gen<'a> {
    rng: &'a mut Rng,
    base: Vec<usize>,
    dtype: DType,
}

impl Gen<'_> {
    fn new(rng: &mut Rng, dtype: DType) -> Gen<'_> {
        let rank = rng.pick(&[0, 1, 1, 2, 2, 2, 2, 3, 3, 3]);
        let base = (0..rank).map(|_| rng.pick(&[1, 2, 3, 4])).collect();
        Gen { rng, base, dtype }
    }

    /// A shape related to the base shape, so that most combinations broadcast.
    fn shape(&mut self) -> Vec<usize> {
        let mut s = self.base.clone();
        match self.rng.below(9) {
            3 => s.iter_mut().for_each(|d| *d = if self.rng.chance(0.5) { 1 } else { *d }),
            4 if !s.is_empty() => s = s[self.rng.below(s.len() + 1)..].to_vec(),
            5 if !s.is_empty() => s.truncate(s.len() - 1),
            6 if s.len() >= 2 => {
                let n = s.len();
                s.swap(n - 1, n - 2)
            }
            7 => s = vec![],
            8 => s.push(self.rng.pick(&[1, 2, 3])),
            _ => {}
        }
        s
    }

    /// A shape literal for `reshape` and `broadcast`.
    fn dims(&mut self) -> Vec<usize> {
        let n: usize = self.base.iter().product();
        match self.rng.below(6) {
            0 => vec![n],
            1 => self.base.iter().rev().copied().collect(),
            2 => [1].iter().chain(&self.base).copied().collect(),
            _ => self.shape(),
        }
    }

    fn literal(&mut self, need: Need) -> f64 {
        let pool: &[f64] = match need {
            Need::Any => &[0.5, 2.0, -1.5, 3.0, 1.0, 0.0, -1.0, 0.25, 1.7, 1e-5, -0.5, 2.5],
            Need::Positive | Need::Nonzero => &[0.5, 2.0, 3.0, 1.0, 0.25, 1.7, 1e-5],
            Need::Nonneg => &[0.5, 2.0, 0.0, 1.0, 1.7],
        };
        let v = self.rng.pick(pool);
        if need == Need::Nonzero && self.rng.chance(0.3) {
            -v
        } else {
            v
        }
    }

    /// A tensor sub-expression: an input (possibly wrapped to have a sign the analysis proves)
    /// or a weak literal.
    fn tensor(&mut self, p: &mut Program, need: Need) -> Result<Id, String> {
        if self.rng.chance(0.3) {
            let v = self.literal(need);
            return Ok(p.num(v));
        }
        let dtype = if self.rng.chance(0.85) {
            self.dtype
        } else {
            self.rng.pick(&[DType::F32, DType::Bf16, DType::I32, DType::Bool])
        };
        let ty = TensorType::new(dtype, self.shape());
        let x = p.add_input(&format!("in{}", p.inputs.len()), ty)?;
        self.wrap(p, x, dtype, need)
    }

    fn wrap(&mut self, p: &mut Program, x: Id, dtype: DType, need: Need) -> Result<Id, String> {
        let float = dtype.is_float();
        match need {
            Need::Any => Ok(x),
            Need::Positive if float && self.rng.chance(0.5) => op(p, "exp", vec![x]),
            Need::Positive => {
                // `abs(x) + 1` is positive for integers too (`square(x) + 0.5` rounds to `x^2`).
                let (f, c) = if float && self.rng.chance(0.5) { ("square", 0.5) } else { ("abs", 1.0) };
                let y = op(p, f, vec![x])?;
                let c = p.num(c);
                op(p, "+", vec![y, c])
            }
            Need::Nonneg => {
                let f = self.rng.pick(&["abs", "square"]);
                op(p, f, vec![x])
            }
            Need::Nonzero => {
                let y = self.wrap(p, x, dtype, Need::Positive)?;
                if self.rng.chance(0.5) {
                    op(p, "neg", vec![y])
                } else {
                    Ok(y)
                }
            }
        }
    }

    fn value(&mut self, p: &mut Program, role: Role, need: Need) -> Result<Id, String> {
        match role {
            Role::Tensor => self.tensor(p, need),
            Role::Index => {
                // Mostly the shape of logits of the base shape without their class axis.
                let mut shape = self.base.clone();
                shape.pop();
                let shape = if self.rng.chance(0.7) { shape } else { self.shape() };
                p.add_input(&format!("in{}", p.inputs.len()), TensorType::new(DType::I32, shape))
            }
            Role::Axis => Ok(p.num(self.rng.pick(&[-3.0, -2.0, -1.0, 0.0, 1.0, 2.0]))),
            Role::Int => Ok(p.num(self.rng.pick(&[-1.0, 0.0, 1.0, 2.0, 3.0, 4.0]))),
            Role::Bound => Ok(p.num(self.rng.pick(&[-7.0, -3.0, -2.0, -1.0, 0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 9.0]))),
            Role::Step => Ok(p.num(self.rng.pick(&[1.0, 1.0, 2.0, 3.0]))),
            Role::Seed if self.rng.chance(0.5) => {
                let shape = if self.rng.chance(0.5) { vec![] } else { vec![1] };
                p.add_input(&format!("in{}", p.inputs.len()), TensorType::new(DType::I32, shape))
            }
            Role::Seed => Ok(p.num(self.rng.pick(&[0.0, 1.0, 7.0, 4_294_967_295.0]))),
            Role::Flag => Ok(p.num(self.rng.pick(&[0.0, 1.0]))),
            Role::Literal => {
                let v = self.literal(need);
                Ok(p.num(v))
            }
            Role::Dims => {
                let d = self.dims();
                p.add(TensorLang::Dims(Dims(d)))
            }
            Role::DType => {
                let d = self.rng.pick(&[DType::F32, DType::Bf16, DType::I32]);
                p.add(TensorLang::Type(d))
            }
            Role::Fill => Ok(p.num(self.fill())),
            Role::Mask => {
                let shape = self.shape();
                p.add_input(&format!("in{}", p.inputs.len()), TensorType::new(DType::Bool, shape))
            }
            Role::Causal(masked) => self.causal(p, masked),
            Role::ZeroBias => self.zero_bias(p),
            Role::CausalBias => {
                let fill = p.num(self.fill());
                let zero = p.num(0.0);
                let bias = match self.rng.below(3) {
                    0 => {
                        let m = self.causal(p, false)?;
                        op(p, "where", vec![m, zero, fill])?
                    }
                    1 => {
                        let m = self.causal(p, true)?;
                        op(p, "where", vec![m, fill, zero])?
                    }
                    _ => {
                        let m = self.causal(p, true)?;
                        let f32 = p.add(TensorLang::Type(DType::F32))?;
                        let m = op(p, "cast", vec![m, f32])?;
                        op(p, "*", vec![m, fill])?
                    }
                };
                if self.dtype.is_float() && self.dtype != DType::F32 {
                    let t = p.add(TensorLang::Type(self.dtype))?;
                    op(p, "cast", vec![bias, t])
                } else {
                    Ok(bias)
                }
            }
        }
    }

    /// A bias of 0 at every element: a cast of the literal 0, its broadcast, or the bias
    /// `where(m, 0, FILL)` of a mask `m` of all true (`broadcast(cast(1, bool), dims)`), in the
    /// rule's float dtype (f32 where the rule's dtype is not a float).
    fn zero_bias(&mut self, p: &mut Program) -> Result<Id, String> {
        let dtype = if self.dtype.is_float() { self.dtype } else { DType::F32 };
        let t = p.add(TensorLang::Type(dtype))?;
        let dims = self.shape();
        let d = p.add(TensorLang::Dims(Dims(dims)))?;
        match self.rng.below(3) {
            0 => {
                let z = p.num(0.0);
                op(p, "cast", vec![z, t])
            }
            1 => {
                let z = p.num(0.0);
                let z = op(p, "cast", vec![z, t])?;
                op(p, "broadcast", vec![z, d])
            }
            _ => {
                let one = p.num(1.0);
                let b = p.add(TensorLang::Type(DType::Bool))?;
                let m = op(p, "cast", vec![one, b])?;
                let m = op(p, "broadcast", vec![m, d])?;
                let (z, fill) = (p.num(0.0), p.num(self.fill()));
                let (z, fill) = (op(p, "cast", vec![z, t])?, op(p, "cast", vec![fill, t])?);
                op(p, "where", vec![m, z, fill])
            }
        }
    }

    /// A mask fill. Values this large are left out of the tolerance's scale ([`same_values`]),
    /// so they must be beyond [`FILL_SCALE`].
    fn fill(&mut self) -> f64 {
        self.rng.pick(&[-1e30, -3e38, -1e25])
    }

    /// A causal mask on the scores of the base shape's queries against themselves: `row` and
    /// `col` indices from `iota`, compared one of several equivalent ways.
    fn causal(&mut self, p: &mut Program, masked: bool) -> Result<Id, String> {
        let r = self.base.len();
        let n = if r >= 2 { self.base[r - 2] } else { self.rng.pick(&[1, 2, 3]) };
        let dims = |p: &mut Program, d: Vec<usize>| p.add(TensorLang::Dims(Dims(d)));
        let nn = p.num(n as f64);
        let iota = op(p, "iota", vec![nn])?;
        let row = match self.rng.below(3) {
            0 => {
                let d = dims(p, vec![n, 1])?;
                op(p, "reshape", vec![iota, d])?
            }
            1 => {
                let d = dims(p, vec![1, n])?;
                let t = op(p, "reshape", vec![iota, d])?;
                let (a, b) = (p.num(0.0), p.num(1.0));
                op(p, "transpose", vec![t, a, b])?
            }
            _ => {
                let d = dims(p, vec![n, 1])?;
                let t = op(p, "reshape", vec![iota, d])?;
                let d = dims(p, vec![n, n])?;
                op(p, "broadcast", vec![t, d])?
            }
        };
        let col = if self.rng.chance(0.5) {
            iota
        } else {
            let f32 = p.add(TensorLang::Type(DType::F32))?;
            let row_f = op(p, "cast", vec![row, f32])?;
            let col_f = op(p, "cast", vec![iota, f32])?;
            return self.compare(p, row_f, col_f, masked);
        };
        self.compare(p, row, col, masked)
    }

    /// `col <= row` (or `col > row` when `masked`), one of several ways.
    fn compare(&mut self, p: &mut Program, row: Id, col: Id, masked: bool) -> Result<Id, String> {
        let one = p.num(1.0);
        let (name, a, b) = match (masked, self.rng.below(4)) {
            (false, 0) => (">=", row, col),
            (false, 1) => ("<=", col, row),
            (false, 2) => (">", op(p, "+", vec![row, one])?, col),
            (true, 0) => (">", col, row),
            (true, 1) => ("<", row, col),
            (true, 2) => (">=", op(p, "-", vec![col, one])?, row),
            (_, _) => {
                let m = self.compare(p, row, col, !masked)?;
                return op(p, "not", vec![m]);
            }
        };
        op(p, name, vec![a, b])
    }
}

/// Adds `(name children...)` to the program.
fn op(p: &mut Program, name: &str, children: Vec<Id>) -> Result<Id, String> {
    let code = OpCode::from_name(name).ok_or_else(|| format!("`{name}` is not an operator"))?;
    p.add(TensorLang::op(code, children))
}

/// Adds a pattern instantiated with `subst` to the program; `Err` if it does not type-check.
fn instantiate(p: &mut Program, ast: &PatternAst<TensorLang>, subst: &HashMap<Var, Id>) -> Result<Id, String> {
    let mut ids: Vec<Id> = Vec::with_capacity(ast.len());
    for node in ast.as_ref() {
        let id = match node {
            ENodeOrVar::Var(v) => *subst.get(v).ok_or_else(|| format!("`{v}` is not bound"))?,
            ENodeOrVar::ENode(n) => p.add(n.clone().map_children(|c| ids[usize::from(c)]))?,
        };
        ids.push(id);
    }
    ids.last().copied().ok_or_else(|| "an empty pattern".to_string())
}

/// Evaluates the rule's conditions with the real registry on an e-graph of the program.
fn conditions_hold(rule: &Rule, p: &Program, subst: &HashMap<Var, Id>) -> bool {
    if rule.conditions.is_empty() {
        return true;
    }
    let mut g = TensorGraph::new(ShapeAnalysis::new(p.inputs.iter().map(|i| (i.name.clone(), i.ty.clone()))));
    let mut ids: Vec<Id> = vec![];
    for node in p.expr().as_ref() {
        let id = g.add(node.clone().map_children(|c| ids[usize::from(c)]));
        ids.push(id);
    }
    g.rebuild();
    let mut s = Subst::default();
    for (v, id) in subst {
        s.insert(*v, g.find(ids[usize::from(*id)]));
    }
    rule.conditions_hold(&g, &s)
}

/// An expression of the program as an s-expression, inputs with their types.
fn show(p: &Program, id: Id) -> String {
    let node = p.node(id);
    if let TensorLang::Var(name) = node {
        return format!("{name}:{}", p.ty(id).map(|t| t.to_string()).unwrap_or_default());
    }
    if node.is_leaf() {
        return node.to_string();
    }
    let ch: Vec<String> = node.children().iter().map(|&c| show(p, c)).collect();
    format!("({} {})", node, ch.join(" "))
}

/// Relative tolerance per dtype of the compared values (weak literals are f32).
fn rtol(dtype: DType) -> f64 {
    match dtype {
        DType::F32 => 2e-5,
        DType::F16 | DType::Bf16 => 4e-2,
        DType::I32 | DType::Bool => 1e-9,
    }
}

/// The first element where the sides differ beyond the tolerance.
fn mismatch(a: &Tensor, b: &Tensor, tol: f64) -> Option<(usize, f64, f64)> {
    let equal = |x: f64, y: f64| x == y || (x.is_nan() && y.is_nan()) || (x - y).abs() <= tol;
    a.data.iter().zip(&b.data).enumerate().find(|(_, (x, y))| !equal(**x, **y)).map(|(i, (x, y))| (i, *x, *y))
}

/// What one attempt found.
enum Attempt {
    /// The left side does not type-check, or a condition fails.
    Skip,
    /// Checked; `true` if the left side had a finite value (a real test, not all NaN), and the
    /// left side's type (`f32w` for a weak literal).
    Checked(bool, String),
}

/// Tries one random instantiation of the rule.
fn attempt(rule: &Rule, rng: &mut Rng, dtype: DType) -> Result<Attempt, String> {
    let mut p = Program::new("soundness");
    let mut gen = Gen::new(rng, dtype);
    let mut subst = HashMap::new();
    for (v, role, need) in variables(rule) {
        let Ok(id) = gen.value(&mut p, role, need) else { return Ok(Attempt::Skip) };
        subst.insert(v, id);
    }
    let Ok(lhs) = instantiate(&mut p, &rule.lhs.ast, &subst) else { return Ok(Attempt::Skip) };
    if !conditions_hold(rule, &p, &subst) {
        return Ok(Attempt::Skip);
    }
    let mut vars: Vec<String> = subst.iter().map(|(v, &id)| format!("{v} = {}", show(&p, id))).collect();
    vars.sort();
    let case = format!("instantiation: {}", vars.join(", "));
    let rhs = instantiate(&mut p, &rule.rhs.ast, &subst)
        .map_err(|e| format!("right side does not type-check: {e}\n  {case}"))?;
    let ty = same_type(&p, lhs, rhs).map_err(|e| format!("{e}\n  {case}"))?;
    p.add_output("lhs", lhs).map_err(|e| e.to_string())?;
    p.add_output("rhs", rhs).map_err(|e| e.to_string())?;
    let finite = same_values(&p, lhs, rhs).map_err(|e| format!("{e}\n  {case}"))?;
    Ok(Attempt::Checked(finite, ty))
}

/// Check (a): both sides have one type; returns it (`f32w` for a weak literal).
fn same_type(p: &Program, lhs: Id, rhs: Id) -> Result<String, String> {
    let show = |id: Id| {
        let f = p.fact(id);
        let ty = f.ty.as_ref().map(|t| t.to_string()).unwrap_or_default();
        format!("{ty}{}", if f.weak { "w" } else { "" })
    };
    let (l, r) = (show(lhs), show(rhs));
    if l != r {
        return Err(format!("type changes: left {l}, right {r} (w: weak literal)"));
    }
    let f = p.fact(lhs);
    Ok(format!("{}{}", f.ty.as_ref().map_or(String::new(), |t| t.dtype.to_string()), if f.weak { "w" } else { "" }))
}

/// Check (b): both sides evaluate equal on random inputs; returns whether the left side had a
/// finite element.
fn same_values(p: &Program, lhs: Id, rhs: Id) -> Result<bool, String> {
    let dtype = p.ty(lhs).map_or(DType::F32, |t| t.dtype);
    let mut finite = false;
    for seed in 0..SEEDS {
        let inputs = random_inputs(p, seed);
        let values = eval_all(p, &inputs).map_err(|e| format!("evaluation failed: {e}"))?;
        let (Some(a), Some(b)) = (&values[usize::from(lhs)], &values[usize::from(rhs)]) else {
            return Err("no value for a side".to_string());
        };
        // Every node is rounded to its dtype, so errors scale with the largest value seen.
        let scale = values
            .iter()
            .flatten()
            .flat_map(|t| &t.data)
            .filter(|v| v.is_finite() && v.abs() < FILL_SCALE)
            .fold(0.0, |m, v| v.abs().max(m));
        let tol = rtol(dtype) * (1.0 + scale);
        if let Some((i, x, y)) = mismatch(a, b, tol) {
            return Err(format!(
                "values differ at element {i}: left {x}, right {y} (seed {seed}, tolerance {tol:.1e})\n  \
                 left = {}\n  right = {}\n  left value {:?}\n  right value {:?}",
                show(p, lhs),
                show(p, rhs),
                a.data,
                b.data
            ));
        }
        finite |= a.data.iter().any(|v| v.is_finite());
    }
    Ok(finite)
}

/// Tries one random instantiation of a native rule's left sides (one substitution, each side a
/// root), rewritten by the rule in an e-graph ([`check_rewrite_on`]); counted where it fired.
fn native_attempt(rule: &NativeRule, rng: &mut Rng, dtype: DType) -> Result<Attempt, String> {
    let lhs = rule.lhs_patterns();
    let mut p = Program::new("soundness");
    let mut gen = Gen::new(rng, dtype);
    let mut subst = HashMap::new();
    let asts: Vec<&PatternAst<TensorLang>> = lhs.iter().map(|l| &l.ast).collect();
    for (v, role, need) in variables_of(&asts, &[]) {
        let Ok(id) = gen.value(&mut p, role, need) else { return Ok(Attempt::Skip) };
        subst.insert(v, id);
    }
    let mut roots = vec![];
    for ast in &asts {
        let Ok(id) = instantiate(&mut p, ast, &subst) else { return Ok(Attempt::Skip) };
        roots.push(id);
    }
    for (i, &r) in roots.iter().enumerate() {
        p.add_output(&format!("lhs{i}"), r).map_err(|e| e.to_string())?;
    }
    let mut vars: Vec<String> = subst.iter().map(|(v, &id)| format!("{v} = {}", show(&p, id))).collect();
    vars.sort();
    let case = format!("instantiation: {}", vars.join(", "));
    let (unions, finite) = check_rewrite_on(&p, &rule.rewrite()).map_err(|e| format!("{e}\n  {case}"))?;
    if unions == 0 {
        return Ok(Attempt::Skip);
    }
    let f = p.fact(roots[0]);
    let ty =
        format!("{}{}", f.ty.as_ref().map_or(String::new(), |t| t.dtype.to_string()), if f.weak { "w" } else { "" });
    Ok(Attempt::Checked(finite, ty))
}

/// Rewrites the e-graph of a program with one rule (three iterations, so that a rule may apply
/// to its own results) and checks every form the e-graph then holds of every class that holds a
/// node of the program: the form (the class's e-node, its children's smallest forms) must
/// type-check to the node's type and evaluate on the reference, on random inputs, to the node's
/// value. Returns the number of unions the rule made and whether the program's outputs had a
/// finite element. This is how native rules are checked ([`check_native_rule`]); it holds of
/// any sound rewrite.
pub fn check_rewrite_on(p: &Program, rw: &Rewrite<TensorLang, ShapeAnalysis>) -> Result<(usize, bool), String> {
    let mut g = TensorGraph::new(ShapeAnalysis::new(p.inputs.iter().map(|i| (i.name.clone(), i.ty.clone()))));
    let mut ids: Vec<Id> = vec![];
    for node in p.expr().as_ref() {
        let id = g.add(node.clone().map_children(|c| ids[usize::from(c)]));
        ids.push(id);
    }
    g.rebuild();
    let runner =
        Runner::default().with_egraph(g).with_iter_limit(3).with_node_limit(20_000).run(std::slice::from_ref(rw));
    let unions: usize = runner.iterations.iter().filter_map(|it| it.applied.get(&rw.name)).sum();
    let egraph = runner.egraph;
    if let Some(c) = egraph.analysis.conflicts.first() {
        return Err(format!("rule `{}` merged values of different types: {c}", rw.name));
    }
    // Each class once, with the first program node in it; each of its e-nodes as a form.
    let mut q = p.clone();
    let extractor = Extractor::new(&egraph, AstSize);
    let mut forms: Vec<(Id, Id)> = vec![];
    let mut seen = std::collections::HashSet::new();
    for (i, &id) in ids.iter().enumerate() {
        let class = egraph.find(id);
        let node = p.node(Id::from(i));
        if !matches!(node, TensorLang::Op(..)) || !seen.insert(class) {
            continue;
        }
        for n in &egraph[class].nodes {
            let mut children = vec![];
            for &c in n.children() {
                children.push(add_expr(&mut q, &extractor.find_best(c).1)?);
            }
            let mut k = 0;
            let form = n.clone().map_children(|_| {
                k += 1;
                children[k - 1]
            });
            let shown = form.to_string();
            let f = q.add(form).map_err(|e| format!("a form of the rewritten e-graph does not type-check: {e}"))?;
            let (a, b) = (p.fact(Id::from(i)), q.fact(f));
            if a.ty != b.ty || a.weak != b.weak {
                return Err(format!(
                    "type changes: {} is {:?}, its form `{shown} ...` {:?}\n  {}",
                    show(p, Id::from(i)),
                    a.ty,
                    b.ty,
                    show(&q, f)
                ));
            }
            forms.push((Id::from(i), f));
        }
    }
    // Outputs keep every compared node live for the evaluator.
    for (k, &(orig, form)) in forms.iter().enumerate() {
        q.add_output(&format!("__orig{k}"), orig).map_err(|e| e.to_string())?;
        q.add_output(&format!("__form{k}"), form).map_err(|e| e.to_string())?;
    }
    let mut finite = false;
    for seed in 0..SEEDS {
        let inputs = random_inputs(&q, seed);
        let values = eval_all(&q, &inputs).map_err(|e| format!("evaluation failed: {e}"))?;
        let scale = values
            .iter()
            .flatten()
            .flat_map(|t| &t.data)
            .filter(|v| v.is_finite() && v.abs() < FILL_SCALE)
            .fold(0.0, |m, v| v.abs().max(m));
        for &(orig, form) in &forms {
            let (Some(a), Some(b)) = (&values[usize::from(orig)], &values[usize::from(form)]) else {
                return Err("no value for a form".to_string());
            };
            let dtype = q.ty(orig).map_or(DType::F32, |t| t.dtype);
            let tol = rtol(dtype) * (1.0 + scale);
            if let Some((i, x, y)) = mismatch(a, b, tol) {
                return Err(format!(
                    "values differ at element {i}: {x} against {y} (seed {seed}, tolerance {tol:.1e})\n  \
                     original = {}\n  rewritten = {}",
                    show(&q, orig),
                    show(&q, form)
                ));
            }
        }
        for o in &p.outputs {
            finite |= values[usize::from(o.id)].as_ref().is_some_and(|t| t.data.iter().any(|v| v.is_finite()));
        }
    }
    Ok((unions, finite))
}

/// Adds an extracted expression to a program; the id of its root.
fn add_expr(q: &mut Program, expr: &RecExpr<TensorLang>) -> Result<Id, String> {
    let mut ids: Vec<Id> = vec![];
    for node in expr.as_ref() {
        let id = q.add(node.clone().map_children(|c| ids[usize::from(c)]))?;
        ids.push(id);
    }
    ids.last().copied().ok_or_else(|| "an empty expression".to_string())
}

/// [`check_rule`] for a rule written in Rust: random instantiations of its left sides
/// ([`NativeRule::lhs`], one substitution for all), rewritten by the rule, each checked by
/// [`check_rewrite_on`]. Fails where no instantiation made the rule fire.
pub fn check_native_rule(rule: &NativeRule) -> Result<BTreeMap<String, usize>, String> {
    let seed = rule.name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3));
    let mut rng = Rng(seed);
    let mut cases = BTreeMap::new();
    for dtype in DTYPES {
        let mut found = 0;
        for tries in 1..=ATTEMPTS {
            match native_attempt(rule, &mut rng, dtype) {
                Err(e) => return Err(format!("native rule `{}` is unsound: {e}", rule.name)),
                Ok(Attempt::Checked(true, ty)) => {
                    found += 1;
                    *cases.entry(ty).or_insert(0) += 1;
                }
                Ok(_) => {}
            }
            if found == CASES || (found == 0 && !cases.is_empty() && tries == GIVE_UP) {
                break;
            }
        }
    }
    if cases.is_empty() {
        return Err(format!(
            "native rule `{}`: no test case: no instantiation in {} tries made it fire with a finite value",
            rule.name,
            ATTEMPTS * DTYPES.len()
        ));
    }
    Ok(cases)
}

/// [`check_rule`], remembered for the process: a rule folder is loaded again for every program
/// planned with it (and for `explain`), and checking a rule takes far longer than planning.
/// A rule is known by its text and place, so an edited file is checked anew.
pub(crate) fn check_rule_once(rule: &Rule) -> Result<(), String> {
    static CHECKED: Mutex<BTreeMap<String, Result<(), String>>> = Mutex::new(BTreeMap::new());
    let key = format!("{} {rule}", rule.location());
    if let Some(known) = CHECKED.lock().map_err(|_| "the rule check failed earlier".to_string())?.get(&key) {
        return known.clone();
    }
    let result = check_rule(rule).map(|_| ());
    if let Ok(mut checked) = CHECKED.lock() {
        checked.insert(key, result.clone());
    }
    result
}

/// Checks one rule; `Ok` holds the counted cases per dtype of the left side, `Err` names the
/// rule, its place (`FILE:LINE`), and what went wrong.
pub fn check_rule(rule: &Rule) -> Result<BTreeMap<String, usize>, String> {
    let seed = rule.name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3));
    let mut rng = Rng(seed);
    let mut cases = BTreeMap::new();
    for dtype in DTYPES {
        let mut found = 0;
        for tries in 1..=ATTEMPTS {
            match attempt(rule, &mut rng, dtype) {
                Err(e) => {
                    return Err(format!("rule `{}` ({}) is unsound: {e}\n  rule: {rule}", rule.name, rule.location()))
                }
                Ok(Attempt::Checked(true, ty)) => {
                    found += 1;
                    *cases.entry(ty).or_insert(0) += 1;
                }
                Ok(_) => {}
            }
            // A dtype the rule does not take stops early once another dtype gave cases.
            if found == CASES || (found == 0 && !cases.is_empty() && tries == GIVE_UP) {
                break;
            }
        }
    }
    if cases.is_empty() {
        return Err(format!(
            "rule `{}` ({}): no test case: no instantiation in {} tries type-checked, met its conditions \
             and had a finite value\n  rule: {rule}",
            rule.name,
            rule.location(),
            ATTEMPTS * DTYPES.len()
        ));
    }
    Ok(cases)
}

/// Loads every `*.rules` file of a directory, one ruleset per file, in stage order
/// ([`crate::search::rules::STAGE_ORDER`]), and checks every rule for soundness on the reference
/// ([`check_rule`]), refusing an unsound one with its `FILE:LINE`: a rule from outside is checked
/// before it is used, as the tests check the default rules, since an unsound rule would otherwise
/// give wrong plans without a word.
pub fn load_rules_dir(dir: impl AsRef<std::path::Path>) -> crate::error::Result<Vec<crate::search::rules::RuleSet>> {
    let sets = crate::search::rules::parse_rules_dir(dir)?;
    for rule in sets.iter().flat_map(|s| &s.rules) {
        check_rule_once(rule).map_err(crate::error::Error::Invalid)?;
    }
    Ok(sets)
}
