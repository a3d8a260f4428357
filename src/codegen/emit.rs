//! Rendering of a lowered kernel as the generated part of a CUDA file: the `#define` block that
//! instantiates a template and the fused body functions the template calls.
//!
//! Pointwise operators become C expressions through one table ([`unary_expr`], [`binary_expr`]);
//! values live in `float`, `int` or `bool`; f16 and bf16 are converted on load and store only.
//! Elements are visited `V` at a time along the last axis (16-byte vector access where an
//! operand is contiguous there), and index arithmetic is folded per group of domain axes that
//! the template enumerates with one variable (a flat index, a row, a column).
//! Invariant: rendering is a pure function of the kernel, so equal plans give byte-identical
//! CUDA (the golden snapshots rely on it).

use std::collections::BTreeSet;
use std::fmt::Write;

use super::lower::{contiguous, Access, Lowered, Node, Op, Store};
use crate::error::{Error, Result};
use crate::lang::{Binary, Reduce, Unary};
use crate::plan::{Kernel, Template};
use crate::types::DType;

/// Block, grid and extra buffers of a rendered kernel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Shape {
    pub grid: [u32; 3],
    pub block: [u32; 3],
    /// Scratch buffers in launch order after the kernel's tensors: (name, bytes, zeroed once).
    pub workspace: Vec<(String, u64, bool)>,
}

/// The generated text of one kernel (defines and body), and its launch shape.
pub struct Rendered {
    pub defines: String,
    pub body: String,
    pub shape: Shape,
}

/// C value type of a dtype.
fn value_type(d: DType) -> &'static str {
    match d {
        DType::F32 | DType::F16 | DType::Bf16 => "float",
        DType::I32 => "int",
        DType::Bool => "bool",
    }
}

/// C storage type of a dtype in device memory.
pub fn storage_type(d: DType) -> &'static str {
    match d {
        DType::F32 => "float",
        DType::F16 => "eq_f16",
        DType::Bf16 => "eq_bf16",
        DType::I32 => "int",
        DType::Bool => "eq_bool",
    }
}

/// A literal of value type `ty`.
fn literal(v: f64, ty: &str) -> String {
    match ty {
        "int" => format!("{}", v.clamp(i32::MIN as f64, i32::MAX as f64) as i64),
        "bool" => (if v != 0.0 { "true" } else { "false" }).to_string(),
        _ if v.is_infinite() => (if v > 0.0 { "EQ_INF" } else { "(-EQ_INF)" }).to_string(),
        _ => {
            let s = format!("{:?}", v as f32);
            if s.contains('e') && !s.contains('.') {
                let (m, e) = s.split_once('e').unwrap_or((&s, "0"));
                format!("{m}.0e{e}f")
            } else {
                format!("{s}f")
            }
        }
    }
}

/// The C expression of a unary operator.
fn unary_expr(op: Unary, a: &str) -> String {
    let f = |name: &str| format!("{name}({a})");
    match op {
        Unary::Neg => format!("(-{a})"),
        Unary::Exp => f("expf"),
        Unary::Log => f("logf"),
        Unary::Sqrt => f("sqrtf"),
        Unary::Rsqrt => f("rsqrtf"),
        Unary::Recip => format!("(1.0f / {a})"),
        Unary::Abs => f("eq_abs"),
        Unary::Tanh => f("tanhf"),
        Unary::Sigmoid => f("eq_sigmoid"),
        Unary::Relu => f("eq_relu"),
        Unary::Gelu => f("eq_gelu"),
        Unary::GeluTanh => f("eq_gelu_tanh"),
        Unary::Silu => f("eq_silu"),
        Unary::Erf => f("erff"),
        Unary::Sin => f("sinf"),
        Unary::Cos => f("cosf"),
        Unary::Square => format!("({a} * {a})"),
        Unary::Not => format!("(!{a})"),
    }
}

/// The C expression of a binary operator on values of type `ty`.
fn binary_expr(op: Binary, a: &str, b: &str, ty: &str) -> String {
    let infix = |s: &str| format!("({a} {s} {b})");
    match op {
        Binary::Add => infix("+"),
        Binary::Sub => infix("-"),
        Binary::Mul => infix("*"),
        Binary::Div if ty == "int" => format!("eq_idiv({a}, {b})"),
        Binary::Div => infix("/"),
        Binary::Pow if ty == "int" => format!("eq_f2i(powf((float){a}, (float){b}))"),
        Binary::Pow => format!("powf({a}, {b})"),
        Binary::Max => format!("eq_max({a}, {b})"),
        Binary::Min => format!("eq_min({a}, {b})"),
        Binary::Lt => infix("<"),
        Binary::Le => infix("<="),
        Binary::Gt => infix(">"),
        Binary::Ge => infix(">="),
        Binary::Eq => infix("=="),
        Binary::Ne => infix("!="),
    }
}

/// A value converted by `cast` to `to`.
fn cast_expr(from: &str, to: DType, a: &str) -> String {
    match (from, to) {
        ("float", DType::F32) | ("int", DType::I32) | ("bool", DType::Bool) => a.to_string(),
        (_, DType::F32) => format!("((float){a})"),
        (_, DType::Bf16) => format!("eq_round_bf16((float){a})"),
        (_, DType::F16) => format!("eq_round_f16((float){a})"),
        ("float", DType::I32) => format!("eq_f2i({a})"),
        (_, DType::I32) => format!("((int){a})"),
        (_, DType::Bool) => format!("({a} != 0)"),
    }
}

/// The identity and combining expression of a reduction.
fn reduce_init(r: Reduce) -> &'static str {
    match r {
        Reduce::Sum | Reduce::Mean => "0.0f",
        Reduce::Amax => "(-EQ_INF)",
        Reduce::Amin => "EQ_INF",
    }
}

fn reduce_combine(r: Reduce, a: &str, b: &str) -> String {
    match r {
        Reduce::Sum | Reduce::Mean => format!("{a} + {b}"),
        Reduce::Amax => format!("eq_max({a}, {b})"),
        Reduce::Amin => format!("eq_min({a}, {b})"),
    }
}

/// How a vector of V elements along the last axis is read from or written to memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Lanes {
    /// V consecutive, aligned elements: one vector access.
    Vector,
    /// The same element for every lane.
    Uniform,
    /// V separate accesses, `stride` apart.
    Gather(usize),
}

/// Lines of a lane loop: declarations before it, lines inside it, lines after it.
type PerLane = (Vec<String>, Vec<String>, Vec<String>);

/// A group of consecutive domain axes that the template enumerates with one flat variable.
struct Group {
    axes: std::ops::Range<usize>,
    var: &'static str,
}

/// Text of one function being generated.
#[derive(Default)]
struct Text {
    s: String,
}

impl Text {
    fn line(&mut self, depth: usize, l: impl AsRef<str>) {
        for _ in 0..depth {
            self.s.push_str("    ");
        }
        self.s.push_str(l.as_ref());
        self.s.push('\n');
    }
}

/// Where the values of nodes and accesses come from inside one generated function.
#[derive(Clone)]
struct Scope {
    /// C expression of each node already available (per lane inside the lane loop).
    refs: Vec<Option<String>>,
    /// Whether code runs per lane (`v` in scope) or once (row values).
    lanes: bool,
}

pub struct Emitter<'a> {
    k: &'a Kernel,
    l: &'a Lowered,
    vec: usize,
    /// The lane count symbol inside generated functions (`V` or `EQ_VEC`).
    vsym: &'static str,
    groups: Vec<Group>,
}

fn err(k: &Kernel, m: impl std::fmt::Display) -> Error {
    Error::Invalid(format!("kernel {} ({}): {m}", k.id, k.template.name()))
}

/// Renders a lowered kernel.
pub fn render(k: &Kernel, l: &Lowered) -> Result<Rendered> {
    let vec = choose_vec(l, k);
    let r = l.domain.len();
    let (groups, vsym) = match l.template {
        Template::Elementwise => (vec![Group { axes: 0..r, var: "i0" }], "V"),
        Template::RowReduce => {
            let last = r.saturating_sub(1);
            (vec![Group { axes: 0..last, var: "row" }, Group { axes: last..r, var: "col0" }], "EQ_VEC")
        }
        _ => {
            let a = l.axis.ok_or_else(|| err(k, "a column reduction kernel without a reduction"))?;
            let groups = vec![
                Group { axes: 0..a, var: "o" },
                Group { axes: a..a + 1, var: "n" },
                Group { axes: a + 1..r, var: "i0" },
            ];
            (groups, "EQ_VEC")
        }
    };
    let e = Emitter { k, l, vec, vsym, groups };
    match l.template {
        Template::Elementwise => e.elementwise(),
        Template::RowReduce => e.rowreduce(),
        _ => e.colreduce(),
    }
}

/// The lane count: 16 bytes of the widest element accessed along the last axis, halved until
/// it divides the last extent.
fn choose_vec(l: &Lowered, k: &Kernel) -> usize {
    let r = l.domain.len();
    if r == 0 {
        return 1;
    }
    let last = l.domain[r - 1];
    let widest = l
        .accesses
        .iter()
        .filter(|a| a.strides[r - 1] != 0)
        .map(|a| a.dtype.size())
        .chain(l.stores.iter().map(|s| k.writes[s.write].ty.dtype.size()))
        .max()
        .unwrap_or(4);
    let mut v = 16 / widest;
    let rank1_elementwise = l.template == Template::Elementwise && r == 1;
    while v > 1 && !rank1_elementwise && !last.is_multiple_of(v) {
        v /= 2;
    }
    v.max(1)
}

/// The online softmax update of a max accumulator `k` and its sum `ks` by the lanes `x{k}`:
/// one rescale per vector, one exponential per element.
fn online_update(k: usize, ks: usize) -> Vec<String> {
    vec![
        format!("float m{k} = acc[{k}];"),
        format!("for (int v = 0; v < EQ_VEC; ++v) m{k} = eq_max(m{k}, x{k}[v]);"),
        format!("float s{k} = eq_lse_rescale(acc[{ks}], acc[{k}], m{k});"),
        format!("if (m{k} != -EQ_INF) for (int v = 0; v < EQ_VEC; ++v) s{k} += expf(x{k}[v] - m{k});"),
        format!("acc[{k}] = m{k};"),
        format!("acc[{ks}] = s{k};"),
    ]
}

/// The offset of lane `v` for a last-axis stride.
fn lane_term(stride: usize) -> String {
    if stride == 1 {
        "(eq_idx)v".to_string()
    } else {
        format!("(eq_idx)v * {stride}")
    }
}

fn pow2_at_least(n: usize) -> usize {
    n.max(1).next_power_of_two()
}

impl Emitter<'_> {
    fn rank(&self) -> usize {
        self.l.domain.len()
    }

    fn dim(&self, k: usize) -> usize {
        self.l.domain[k]
    }

    fn node(&self, i: usize) -> &Node {
        &self.l.nodes[i]
    }

    fn param(&self, read: Option<usize>, write: Option<usize>) -> String {
        match (read, write) {
            (Some(r), _) => format!("p_{}", self.k.reads[r].name),
            (_, Some(w)) => format!("p_{}", self.k.writes[w].name),
            _ => String::new(),
        }
    }

    /// `EQ_PARAMS` and `EQ_ARGS`: the kernel's reads, writes, then any workspace.
    fn params(&self, workspace: &[(&str, &str)]) -> (String, String) {
        let mut decl = Vec::new();
        let mut args = Vec::new();
        for r in &self.k.reads {
            decl.push(format!("const {}* __restrict__ p_{}", storage_type(r.ty.dtype), r.name));
            args.push(format!("p_{}", r.name));
        }
        for w in &self.k.writes {
            decl.push(format!("{}* __restrict__ p_{}", storage_type(w.ty.dtype), w.name));
            args.push(format!("p_{}", w.name));
        }
        for (ty, name) in workspace {
            decl.push(format!("{ty}* __restrict__ {name}"));
            args.push(name.to_string());
        }
        (decl.join(", \\\n    "), args.join(", "))
    }

    fn common_defines(&self, name: &str, workspace: &[(&str, &str)]) -> String {
        let (decl, args) = self.params(workspace);
        let mut d = String::new();
        let _ = writeln!(d, "#define EQ_GENERATED 1");
        let _ = writeln!(d, "#define EQ_KERNEL {name}");
        if self.wide() {
            let _ = writeln!(d, "#define EQ_WIDE_INDEX 1");
        }
        let _ = writeln!(d, "#define EQ_PARAMS \\\n    {decl}");
        let _ = writeln!(d, "#define EQ_ARGS {args}");
        d
    }

    /// Whether some index may not fit 31 bits.
    fn wide(&self) -> bool {
        let limit = 1u64 << 31;
        let dom: u64 = self.l.domain.iter().map(|&d| d as u64).product();
        dom >= limit || self.k.reads.iter().chain(&self.k.writes).any(|t| t.ty.numel() as u64 >= limit)
    }

    /// How an access with `strides` is read V lanes at a time.
    fn lanes_of(&self, strides: &[usize]) -> Lanes {
        let r = self.rank();
        if r == 0 || self.vec == 1 {
            return Lanes::Gather(strides.last().copied().unwrap_or(0));
        }
        match strides[r - 1] {
            0 => Lanes::Uniform,
            1 if strides[..r - 1].iter().zip(&self.l.domain).all(|(&s, &d)| d == 1 || s % self.vec == 0) => {
                Lanes::Vector
            }
            s => Lanes::Gather(s),
        }
    }

    /// The offset of lane 0 for `strides`, recording the coordinates it needs.
    fn offset(&self, strides: &[usize], need: &mut BTreeSet<usize>) -> String {
        let mut terms: Vec<String> = Vec::new();
        for g in &self.groups {
            let axes: Vec<usize> = g.axes.clone().filter(|&k| self.dim(k) > 1 && strides[k] != 0).collect();
            if axes.is_empty() {
                continue;
            }
            let dims: Vec<usize> = g.axes.clone().map(|k| self.dim(k)).collect();
            let cs = contiguous(&dims);
            let inner = *axes.last().unwrap_or(&0);
            let cs_of = |k: usize| cs[k - g.axes.start];
            let m = strides[inner] / cs_of(inner);
            let linear = strides[inner].is_multiple_of(cs_of(inner))
                && g.axes.clone().filter(|&k| self.dim(k) > 1).all(|k| strides[k] == m * cs_of(k));
            if linear {
                terms.push(if m == 1 { g.var.to_string() } else { format!("{} * {m}", g.var) });
            } else {
                for k in axes {
                    need.insert(k);
                    terms.push(if strides[k] == 1 { format!("c{k}") } else { format!("c{k} * {}", strides[k]) });
                }
            }
        }
        if terms.is_empty() {
            "0".to_string()
        } else {
            terms.join(" + ")
        }
    }

    /// Coordinate declarations for the groups that hold the needed axes.
    fn coords(&self, need: &BTreeSet<usize>, t: &mut Text, depth: usize) {
        for g in &self.groups {
            if !g.axes.clone().any(|k| need.contains(&k)) {
                continue;
            }
            let axes: Vec<usize> = g.axes.clone().filter(|&k| self.dim(k) > 1).collect();
            let Some(outer) = axes.iter().position(|k| need.contains(k)) else { continue };
            let mut q = g.var.to_string();
            for (j, &k) in axes.iter().enumerate().rev().take_while(|&(j, _)| j >= outer) {
                let wanted = need.contains(&k);
                if j == 0 {
                    t.line(depth, format!("const eq_idx c{k} = {q};"));
                    continue;
                }
                if wanted {
                    t.line(depth, format!("const eq_idx c{k} = {q} % {};", self.dim(k)));
                }
                if j > outer {
                    t.line(depth, format!("const eq_idx q{k} = {q} / {};", self.dim(k)));
                    q = format!("q{k}");
                }
            }
        }
    }

    /// Nodes that `roots` need, stopping at nodes already in `scope`.
    fn closure(&self, roots: &[usize], scope: &Scope) -> Vec<usize> {
        let mut seen = BTreeSet::new();
        let mut stack: Vec<usize> = roots.to_vec();
        while let Some(n) = stack.pop() {
            if scope.refs[n].is_some() || !seen.insert(n) {
                continue;
            }
            stack.extend(children(&self.node(n).op));
        }
        seen.into_iter().collect()
    }

    /// The C expression of an operand `c` wanted as value type `ty`.
    fn operand(&self, c: usize, ty: &str, scope: &Scope) -> String {
        if let Op::Const(v) = self.node(c).op {
            return literal(v, ty);
        }
        scope.refs[c].clone().unwrap_or_else(|| format!("n{c}"))
    }

    /// The last-axis coordinate of the current lane.
    fn lane_coord(&self, scope: &Scope, need: &mut BTreeSet<usize>) -> String {
        let last = self.rank() - 1;
        need.insert(last);
        if scope.lanes {
            format!("(c{last} + v)")
        } else {
            format!("c{last}")
        }
    }

    /// The expression of a computed node from its operands.
    fn expr(&self, n: usize, scope: &Scope, need: &mut BTreeSet<usize>) -> String {
        let node = self.node(n);
        let ty = value_type(node.dtype);
        match &node.op {
            Op::Const(v) => literal(*v, ty),
            Op::Load(_) | Op::Reduce(..) | Op::Global(..) => scope.refs[n].clone().unwrap_or_else(|| format!("n{n}")),
            Op::Coord(k) if *k + 1 == self.rank() => format!("(int){}", self.lane_coord(scope, need)),
            Op::Coord(k) => {
                need.insert(*k);
                format!("(int)c{k}")
            }
            Op::Flat(strides) => {
                let base = self.offset(strides, need);
                let s = strides.last().copied().unwrap_or(0);
                if scope.lanes && s != 0 {
                    format!("(unsigned long long)({base} + {})", lane_term(s))
                } else {
                    format!("(unsigned long long)({base})")
                }
            }
            Op::Unary(u, a) => unary_expr(*u, &self.operand(*a, ty, scope)),
            Op::Binary(b, x, y) => {
                let want = if b.is_comparison() { self.compare_type(*x, *y) } else { ty };
                binary_expr(*b, &self.operand(*x, want, scope), &self.operand(*y, want, scope), want)
            }
            Op::Where(c, a, b) => {
                format!(
                    "({} ? {} : {})",
                    self.operand(*c, "bool", scope),
                    self.operand(*a, ty, scope),
                    self.operand(*b, ty, scope)
                )
            }
            Op::Cast(to, a) => {
                let from = value_type(self.node(*a).dtype);
                cast_expr(from, *to, &self.operand(*a, from, scope))
            }
            Op::Dropout { x, index, seed, key0, threshold, scale } => format!(
                "eq_dropout({}, {}, {seed}u, {key0}u, {threshold}u, {})",
                self.operand(*x, "float", scope),
                self.expr(*index, scope, need),
                literal(*scale as f64, "float")
            ),
        }
    }

    /// The value type two compared operands meet in (a literal takes the other's type).
    fn compare_type(&self, x: usize, y: usize) -> &'static str {
        let is_const = |i: usize| matches!(self.node(i).op, Op::Const(_));
        match (is_const(x), is_const(y)) {
            (true, false) => value_type(self.node(y).dtype),
            (false, _) => value_type(self.node(x).dtype),
            _ => "float",
        }
    }

    /// Declares the loads of `nodes` that happen before the lane loop and sets every load's
    /// reference; gathers are read inside the loop.
    fn loads(&self, nodes: &[usize], scope: &mut Scope, t: &mut Text, depth: usize, need: &mut BTreeSet<usize>) {
        for &n in nodes {
            let Op::Load(a) = self.node(n).op else { continue };
            if scope.refs[n].is_some() {
                continue;
            }
            let acc = &self.l.accesses[a];
            let p = self.param(Some(acc.read), None);
            let vt = value_type(acc.dtype);
            let off = self.offset(&acc.strides, need);
            let lanes = if scope.lanes { self.lanes_of(&acc.strides) } else { Lanes::Uniform };
            let r = match lanes {
                Lanes::Vector => {
                    t.line(depth, format!("{vt} l{n}[{}];", self.vsym));
                    t.line(depth, format!("eq_loadv<{}, {}>({p} + {off}, l{n});", storage_type(acc.dtype), self.vsym));
                    format!("l{n}[v]")
                }
                Lanes::Uniform => {
                    t.line(depth, format!("const {vt} l{n} = eq_val({p}[{off}]);"));
                    format!("l{n}")
                }
                Lanes::Gather(0) => format!("eq_val({p}[{off}])"),
                Lanes::Gather(s) => format!("eq_val({p}[{off} + {}])", lane_term(s)),
            };
            scope.refs[n] = Some(r);
        }
    }

    /// Emits `nodes` (ascending) as constants inside the current block; literals, loads and
    /// flat indices are written where they are used.
    fn values(&self, nodes: &[usize], scope: &mut Scope, t: &mut Text, depth: usize, need: &mut BTreeSet<usize>) {
        for &n in nodes {
            if scope.refs[n].is_some() || matches!(self.node(n).op, Op::Const(_) | Op::Flat(_)) {
                continue;
            }
            let e = self.expr(n, scope, need);
            t.line(depth, format!("const {} n{n} = {e};", value_type(self.node(n).dtype)));
            scope.refs[n] = Some(format!("n{n}"));
        }
    }

    /// Store code for `st` with value expression `val`: per-lane lines inside the loop, and a
    /// vector store after it. `skip` is an axis the store is already reduced along.
    fn store(
        &self,
        st: &Store,
        val: &str,
        skip: Option<usize>,
        need: &mut BTreeSet<usize>,
    ) -> (String, Option<String>) {
        let r = self.rank();
        let w = &self.k.writes[st.write];
        let p = self.param(None, Some(st.write));
        let strides: Vec<usize> =
            contiguous(&st.shape).into_iter().zip(&st.shape).map(|(s, &d)| if d == 1 { 0 } else { s }).collect();
        let off = self.offset(&strides, need);
        let mut pred: Vec<String> = (0..r.saturating_sub(1))
            .filter(|&k| st.shape[k] == 1 && self.dim(k) > 1 && Some(k) != skip)
            .map(|k| {
                need.insert(k);
                format!("c{k} == 0")
            })
            .collect();
        let last_bcast = r > 0 && st.shape[r - 1] == 1 && self.dim(r - 1) > 1 && Some(r - 1) != skip;
        let lanes = if r == 0 { Lanes::Gather(0) } else { self.lanes_of(&strides) };
        if lanes == Lanes::Vector && !last_bcast {
            let cond = if pred.is_empty() { String::new() } else { format!("if ({}) ", pred.join(" && ")) };
            let after =
                format!("{cond}eq_storev<{}, {}>({p} + {off}, o{});", storage_type(w.ty.dtype), self.vsym, st.write);
            return (format!("o{}[v] = {val};", st.write), Some(after));
        }
        if last_bcast {
            pred.push(format!("{} == 0", self.lane_coord(&Scope { refs: vec![], lanes: true }, need)));
        }
        let s = strides.last().copied().unwrap_or(0);
        let at = if s == 0 { off } else { format!("{off} + {}", lane_term(s)) };
        let cond = if pred.is_empty() { String::new() } else { format!("if ({}) ", pred.join(" && ")) };
        (format!("{cond}eq_put({p} + {at}, {val});"), None)
    }

    fn scope(&self, lanes: bool) -> Scope {
        Scope { refs: vec![None; self.l.nodes.len()], lanes }
    }

    /// A function (or block, at `depth`) that loads what `roots` need, then runs a lane loop
    /// computing them followed by the lines `per_lane` gives: (declarations before the loop,
    /// lines inside it, lines after it).
    fn lane_function(
        &self,
        header: &str,
        depth: usize,
        scope: &mut Scope,
        roots: &[usize],
        per_lane: impl Fn(&Self, &Scope, &mut BTreeSet<usize>) -> PerLane,
    ) -> String {
        let mut need = BTreeSet::new();
        let nodes = self.closure(roots, scope);
        let mut pre = Text::default();
        self.loads(&nodes, scope, &mut pre, depth + 1, &mut need);
        let mut body = Text::default();
        self.values(&nodes, scope, &mut body, depth + 2, &mut need);
        let (decls, lines, after) = per_lane(self, scope, &mut need);
        let mut t = Text::default();
        t.line(depth, header);
        self.coords(&need, &mut t, depth + 1);
        t.s.push_str(&pre.s);
        for d in decls {
            t.line(depth + 1, d);
        }
        t.line(0, "#pragma unroll");
        t.line(depth + 1, format!("for (int v = 0; v < {}; ++v) {{", self.vsym));
        t.s.push_str(&body.s);
        for l in lines {
            t.line(depth + 2, l);
        }
        t.line(depth + 1, "}");
        for a in after {
            t.line(depth + 1, a);
        }
        t.line(depth, "}");
        t.s
    }

    /// Per-lane store lines for `stores`, with declarations of vector staging arrays.
    fn store_lines(
        &self,
        stores: &[&Store],
        val: impl Fn(&Store) -> String,
        skip: Option<usize>,
        need: &mut BTreeSet<usize>,
    ) -> PerLane {
        let (mut decls, mut lines, mut after) = (vec![], vec![], vec![]);
        for st in stores {
            let (line, vector) = self.store(st, &val(st), skip, need);
            if let Some(a) = vector {
                let ty = value_type(self.k.writes[st.write].ty.dtype);
                decls.push(format!("{ty} o{}[{}];", st.write, self.vsym));
                after.push(a);
            }
            lines.push(line);
        }
        (decls, lines, after)
    }

    fn elementwise(&self) -> Result<Rendered> {
        let mut scope = self.scope(true);
        let roots: Vec<usize> = self.l.stores.iter().map(|s| s.node).collect();
        let stores: Vec<&Store> = self.l.stores.iter().collect();
        let f = self.lane_function(
            "template <int V>\n__device__ __forceinline__ void eq_body(EQ_PARAMS, eq_idx i0) {",
            0,
            &mut scope,
            &roots,
            |e, scope, need| {
                e.store_lines(&stores, |st| e.operand(st.node, value_type(e.node(st.node).dtype), scope), None, need)
            },
        );
        let numel: usize = self.l.domain.iter().product();
        let threads = 256usize;
        let blocks = (numel / self.vec).max(numel % self.vec).div_ceil(threads).min(8192);
        let mut d = self.common_defines(&self.name(), &[]);
        let _ = writeln!(d, "#define EQ_NUMEL {numel}");
        let _ = writeln!(d, "#define EQ_VEC {}", self.vec);
        let _ = writeln!(d, "#define EQ_THREADS {threads}");
        let shape = Shape { grid: [blocks as u32, 1, 1], block: [threads as u32, 1, 1], workspace: vec![] };
        Ok(Rendered { defines: d, body: f, shape })
    }

    /// The kernel's generated name: `{template}_{dtype}_k{id}`.
    pub fn name(&self) -> String {
        kernel_name(self.k, self.l.template)
    }
}

/// `{template}_{dtype}_k{id}`, the dtype being that of the first write (or read).
pub fn kernel_name(k: &Kernel, template: Template) -> String {
    let dtype = k.writes.first().or(k.reads.first()).map_or(DType::F32, |t| t.ty.dtype);
    format!("{}_{}_k{}", template.name(), dtype, k.id)
}

fn children(op: &Op) -> Vec<usize> {
    match op {
        Op::Const(_) | Op::Load(_) | Op::Coord(_) | Op::Flat(_) => vec![],
        Op::Unary(_, a) | Op::Cast(_, a) | Op::Reduce(_, a) | Op::Global(_, a) => vec![*a],
        Op::Binary(_, a, b) => vec![*a, *b],
        Op::Where(c, a, b) => vec![*c, *a, *b],
        Op::Dropout { x, index, .. } => vec![*x, *index],
    }
}

/// Row-reduction rendering.
mod rows {
    use super::*;

    /// The plan of a row kernel: levels, stages, cached loads and row values.
    pub(super) struct RowPlan {
        /// Stages that must finish before a node can be computed.
        pub avail: Vec<usize>,
        /// Reductions of each stage, in accumulator order.
        pub stages: Vec<Vec<usize>>,
        /// Cached accesses (by load node), in cache order.
        pub cached: Vec<usize>,
        /// Row values kept in `EqRow`.
        pub row_nodes: Vec<usize>,
        /// Results reduced over all rows, in accumulator order.
        pub globals: Vec<usize>,
        /// Online pairs: (sum of exp(x - m), its max m), computed in the max's stage.
        pub online: Vec<(usize, usize)>,
    }

    /// The max `m` of a `sum(exp(x - m))` whose `m` is `amax(x)` of the same `x`.
    fn online_max(l: &Lowered, i: usize) -> Option<usize> {
        let Op::Reduce(Reduce::Sum, e) = l.nodes[i].op else { return None };
        let Op::Unary(Unary::Exp, d) = l.nodes[e].op else { return None };
        let Op::Binary(Binary::Sub, a, m) = l.nodes[d].op else { return None };
        matches!(l.nodes[m].op, Op::Reduce(Reduce::Amax, x) if x == a).then_some(m)
    }

    pub(super) fn plan(e: &Emitter) -> RowPlan {
        let l = e.l;
        let r = e.rank();
        let n = l.nodes.len();
        let elem: Vec<bool> = l.nodes.iter().map(|x| r > 0 && x.shape[r - 1] > 1).collect();
        let mut avail = vec![0usize; n];
        let mut stages: Vec<Vec<usize>> = vec![];
        let mut online: Vec<(usize, usize)> = vec![];
        for i in 0..n {
            let below = children(&l.nodes[i].op).iter().map(|&c| avail[c]).max().unwrap_or(0);
            avail[i] = below;
            if let Some(m) = online_max(l, i).filter(|m| !online.iter().any(|(_, x)| x == m)) {
                let st = avail[m] - 1;
                stages[st].push(i);
                avail[i] = st + 1;
                online.push((i, m));
                continue;
            }
            if let Op::Reduce(..) = l.nodes[i].op {
                if stages.len() <= below {
                    stages.resize(below + 1, vec![]);
                }
                stages[below].push(i);
                avail[i] = below + 1;
            }
        }
        let live = e.closure(&l.stores.iter().map(|s| s.node).collect::<Vec<_>>(), &e.scope(false));
        let in_stages: Vec<usize> = stages.iter().flatten().map(|&x| children(&l.nodes[x].op)[0]).collect();
        let stage_nodes = e.closure(&in_stages, &e.scope(false));
        let cached: Vec<usize> = stage_nodes
            .iter()
            .copied()
            .filter(|&i| elem[i] && matches!(l.nodes[i].op, Op::Load(_)) && l.nodes[i].dtype.is_float())
            .collect();
        let mut all: BTreeSet<usize> = live.into_iter().collect();
        all.extend(stage_nodes);
        let globals = all.iter().copied().filter(|&i| matches!(l.nodes[i].op, Op::Global(..))).collect();
        let row_nodes = all
            .into_iter()
            .filter(|&i| !elem[i] && !matches!(l.nodes[i].op, Op::Const(_) | Op::Flat(_) | Op::Global(..)))
            .collect();
        RowPlan { avail, stages, cached, row_nodes, globals, online }
    }
}

impl Emitter<'_> {
    fn rowreduce(&self) -> Result<Rendered> {
        let rp = rows::plan(self);
        let r = self.rank();
        let cols = if r == 0 { 1 } else { self.dim(r - 1) };
        let numel: usize = self.l.domain.iter().product();
        let rows = numel.checked_div(cols).unwrap_or(0);
        let per = cols.div_ceil(self.vec);
        let row_threads = pow2_at_least(per.div_ceil(4)).min(1024);
        let chunks = per.div_ceil(row_threads).max(1);
        let block = row_threads.max(256);
        let ncache = rp.cached.len().max(1);
        let cached = rp.cached.len() * chunks * self.vec <= 64;
        let nacc = rp.stages.iter().map(Vec::len).max().unwrap_or(0).max(1);
        let rpb = block / row_threads;
        let grid = rows.div_ceil(rpb).min(if rp.globals.is_empty() { 1 << 24 } else { 4096 });
        let nglobal = rp.globals.len();
        let ws: &[(&str, &str)] = if nglobal > 0 { &[("float", "eq_ws"), ("unsigned int", "eq_count")] } else { &[] };
        let mut d = self.common_defines(&self.name(), ws);
        for (k, v) in [
            ("EQ_ROWS", rows),
            ("EQ_COLS", cols),
            ("EQ_ROW_THREADS", row_threads),
            ("EQ_BLOCK", block),
            ("EQ_VEC", self.vec),
            ("EQ_CHUNKS", chunks),
            ("EQ_NCACHE", ncache),
            ("EQ_CACHED", cached as usize),
            ("EQ_STAGES", rp.stages.len()),
            ("EQ_NACC", nacc),
            ("EQ_NGLOBAL", nglobal),
        ] {
            let _ = writeln!(d, "#define {k} {v}");
        }
        let mut body = String::new();
        body.push_str(&self.row_struct(&rp));
        body.push_str(&self.row_fetch(&rp));
        body.push_str(&self.row_values(&rp, 0, None));
        body.push_str(&self.row_acc(&rp));
        body.push_str(&self.row_accum(&rp));
        body.push_str(&self.row_finish(&rp));
        body.push_str(&self.row_epilogue(&rp));
        body.push_str(&self.row_store(&rp));
        body.push_str(&self.row_globals(&rp, rows));
        let workspace = if nglobal > 0 {
            vec![("eq_ws".into(), (grid * nglobal * 4) as u64, false), ("eq_count".into(), 4, true)]
        } else {
            vec![]
        };
        let shape = Shape { grid: [grid as u32, 1, 1], block: [block as u32, 1, 1], workspace };
        Ok(Rendered { defines: d, body, shape })
    }

    fn row_struct(&self, rp: &rows::RowPlan) -> String {
        let mut t = Text::default();
        t.line(0, "struct EqRow {");
        for &i in &rp.row_nodes {
            t.line(1, format!("{} n{i};", value_type(self.node(i).dtype)));
        }
        t.line(0, "};");
        t.s
    }

    /// A scope where row values come from `rv` and cached loads from `cv`.
    fn row_scope(&self, rp: &rows::RowPlan, lanes: bool) -> Scope {
        let mut s = self.scope(lanes);
        for &i in &rp.row_nodes {
            s.refs[i] = Some(format!("rv.n{i}"));
        }
        if lanes {
            for (k, &i) in rp.cached.iter().enumerate() {
                s.refs[i] = Some(format!("cv[{k}][v]"));
            }
        }
        s
    }

    fn row_fetch(&self, rp: &rows::RowPlan) -> String {
        let mut need = BTreeSet::new();
        let mut t = Text::default();
        for (k, &i) in rp.cached.iter().enumerate() {
            let Op::Load(a) = self.node(i).op else { continue };
            let acc: &Access = &self.l.accesses[a];
            let p = self.param(Some(acc.read), None);
            let off = self.offset(&acc.strides, &mut need);
            match self.lanes_of(&acc.strides) {
                Lanes::Vector => {
                    t.line(1, format!("eq_loadv<{}, EQ_VEC>({p} + {off}, cv[{k}]);", storage_type(acc.dtype)))
                }
                Lanes::Uniform => {
                    t.line(1, format!("const float u{k} = eq_val({p}[{off}]);"));
                    t.line(1, format!("for (int v = 0; v < EQ_VEC; ++v) cv[{k}][v] = u{k};"));
                }
                Lanes::Gather(s) => {
                    t.line(0, "#pragma unroll");
                    t.line(
                        1,
                        format!("for (int v = 0; v < EQ_VEC; ++v) cv[{k}][v] = eq_val({p}[{off} + {}]);", lane_term(s)),
                    );
                }
            }
        }
        let mut f = Text::default();
        f.line(
            0,
            "__device__ __forceinline__ void eq_fetch(EQ_PARAMS, eq_idx row, eq_idx col0, float (&cv)[EQ_NCACHE][EQ_VEC]) {",
        );
        self.coords(&need, &mut f, 1);
        f.s.push_str(&t.s);
        f.line(0, "}");
        f.s
    }

    /// Row values available after `stage` stages: `eq_row_init` (stage 0) or the tail of
    /// `eq_finish` (`Some(s)`: values of stage s + 1).
    fn row_values(&self, rp: &rows::RowPlan, avail: usize, finish: Option<usize>) -> String {
        let mut scope = self.row_scope(rp, false);
        let mine: Vec<usize> = rp
            .row_nodes
            .iter()
            .copied()
            .filter(|&i| rp.avail[i] == avail && !matches!(self.node(i).op, Op::Reduce(..)))
            .collect();
        for &i in &mine {
            scope.refs[i] = None;
        }
        let mut need = BTreeSet::new();
        let mut t = Text::default();
        for &i in &mine {
            let e = match self.node(i).op {
                Op::Load(a) => {
                    let acc = &self.l.accesses[a];
                    format!("eq_val({}[{}])", self.param(Some(acc.read), None), self.offset(&acc.strides, &mut need))
                }
                _ => self.expr(i, &scope, &mut need),
            };
            t.line(1, format!("rv.n{i} = {e};"));
            scope.refs[i] = Some(format!("rv.n{i}"));
        }
        if finish.is_some() {
            let mut f = Text::default();
            self.coords(&need, &mut f, 1);
            f.s.push_str(&t.s);
            return f.s;
        }
        let mut f = Text::default();
        f.line(0, "__device__ __forceinline__ void eq_row_init(EQ_PARAMS, eq_idx row, EqRow& rv) {");
        self.coords(&need, &mut f, 1);
        f.s.push_str(&t.s);
        f.line(0, "}");
        f.s
    }

    fn row_acc(&self, rp: &rows::RowPlan) -> String {
        let mut t = Text::default();
        t.line(0, "__device__ __forceinline__ void eq_acc_init(int s, float (&acc)[EQ_NACC]) {");
        for (s, reds) in rp.stages.iter().enumerate() {
            let inits: Vec<String> = reds
                .iter()
                .enumerate()
                .map(|(k, &i)| format!("acc[{k}] = {};", reduce_init(self.reduce_of(i))))
                .collect();
            t.line(1, format!("if (s == {s}) {{ {} }}", inits.join(" ")));
        }
        t.line(0, "}");
        t.line(0, "__device__ __forceinline__ void eq_merge(int s, float (&a)[EQ_NACC], const float (&b)[EQ_NACC]) {");
        for (s, reds) in rp.stages.iter().enumerate() {
            t.line(1, format!("if (s == {s}) {{"));
            for (k, &i) in reds.iter().enumerate() {
                if rp.online.iter().any(|&(sum, _)| sum == i) {
                    continue;
                }
                match rp.online.iter().find(|&&(_, m)| m == i).and_then(|&(sum, _)| reds.iter().position(|&x| x == sum))
                {
                    Some(ks) => {
                        t.line(2, format!("const float m{k} = eq_max(a[{k}], b[{k}]);"));
                        t.line(2, format!("a[{ks}] = eq_lse_rescale(a[{ks}], a[{k}], m{k}) + eq_lse_rescale(b[{ks}], b[{k}], m{k});"));
                        t.line(2, format!("a[{k}] = m{k};"));
                    }
                    None => t.line(
                        2,
                        format!(
                            "a[{k}] = {};",
                            reduce_combine(self.reduce_of(i), &format!("a[{k}]"), &format!("b[{k}]"))
                        ),
                    ),
                }
            }
            t.line(1, "}");
        }
        t.line(0, "}");
        t.s
    }

    fn reduce_of(&self, i: usize) -> Reduce {
        match self.node(i).op {
            Op::Reduce(r, _) | Op::Global(r, _) => r,
            _ => Reduce::Sum,
        }
    }

    fn row_accum(&self, rp: &rows::RowPlan) -> String {
        let mut out = String::from(
            "__device__ __forceinline__ void eq_accum(int s, EQ_PARAMS, eq_idx row, eq_idx col0,\n    \
             const float (&cv)[EQ_NCACHE][EQ_VEC], const EqRow& rv, float (&acc)[EQ_NACC]) {\n",
        );
        for (s, reds) in rp.stages.iter().enumerate() {
            let mut scope = self.row_scope(rp, true);
            let is_sum = |i: usize| rp.online.iter().any(|&(sum, _)| sum == i);
            let inputs: Vec<usize> =
                reds.iter().filter(|&&i| !is_sum(i)).map(|&i| children(&self.node(i).op)[0]).collect();
            let header = format!("if (s == {s}) {{");
            let f = self.lane_function(&header, 1, &mut scope, &inputs, |e, scope, _| {
                let (mut decls, mut lines, mut after) = (vec![], vec![], vec![]);
                for (k, &red) in reds.iter().enumerate() {
                    if is_sum(red) {
                        continue;
                    }
                    let val = e.operand(children(&e.node(red).op)[0], "float", scope);
                    let pair = rp
                        .online
                        .iter()
                        .find(|&&(_, m)| m == red)
                        .and_then(|&(sum, _)| reds.iter().position(|&x| x == sum));
                    match pair {
                        Some(ks) => {
                            decls.push(format!("float x{k}[EQ_VEC];"));
                            lines.push(format!("x{k}[v] = {val};"));
                            after.extend(online_update(k, ks));
                        }
                        None => lines.push(format!(
                            "acc[{k}] = {};",
                            reduce_combine(e.reduce_of(red), &format!("acc[{k}]"), &val)
                        )),
                    }
                }
                (decls, lines, after)
            });
            out.push_str(&f);
        }
        out.push_str("}\n");
        out
    }

    fn row_finish(&self, rp: &rows::RowPlan) -> String {
        let cols = self.l.domain.last().copied().unwrap_or(1);
        let mut t = Text::default();
        t.line(
            0,
            "__device__ __forceinline__ void eq_finish(int s, EQ_PARAMS, eq_idx row, const float (&acc)[EQ_NACC], EqRow& rv) {",
        );
        for (s, reds) in rp.stages.iter().enumerate() {
            t.line(1, format!("if (s == {s}) {{"));
            for (k, &i) in reds.iter().enumerate() {
                let v = match self.reduce_of(i) {
                    Reduce::Mean => format!("acc[{k}] / {}", literal(cols as f64, "float")),
                    _ => format!("acc[{k}]"),
                };
                if rp.row_nodes.contains(&i) {
                    t.line(2, format!("rv.n{i} = {v};"));
                }
            }
            let rest = self.row_values(rp, s + 1, Some(s));
            for l in rest.lines() {
                t.line(1, l);
            }
            t.line(1, "}");
        }
        t.line(0, "}");
        t.s
    }

    fn row_epilogue(&self, rp: &rows::RowPlan) -> String {
        let mut scope = self.row_scope(rp, true);
        let stores: Vec<&Store> = self.l.stores.iter().filter(|s| self.store_is_elem(s)).collect();
        let roots: Vec<usize> = stores.iter().map(|s| s.node).collect();
        self.lane_function(
            "__device__ __forceinline__ void eq_epilogue(EQ_PARAMS, eq_idx row, eq_idx col0,\n    \
             const float (&cv)[EQ_NCACHE][EQ_VEC], const EqRow& rv) {",
            0,
            &mut scope,
            &roots,
            |e, scope, need| {
                e.store_lines(&stores, |st| e.operand(st.node, value_type(e.node(st.node).dtype), scope), None, need)
            },
        )
    }

    fn store_is_elem(&self, s: &Store) -> bool {
        let r = self.rank();
        r > 0 && s.shape[r - 1] > 1
    }

    fn row_store(&self, rp: &rows::RowPlan) -> String {
        let scope = self.row_scope(rp, false);
        let mut need = BTreeSet::new();
        let mut t = Text::default();
        let last = self.rank().checked_sub(1);
        for st in self.l.stores.iter().filter(|s| !self.store_is_elem(s) && !rp.globals.contains(&s.node)) {
            let val = self.operand(st.node, value_type(self.node(st.node).dtype), &scope);
            let (line, _) = self.store_row(st, &val, last, &mut need);
            t.line(1, line);
        }
        let mut f = Text::default();
        f.line(0, "__device__ __forceinline__ void eq_row_store(EQ_PARAMS, eq_idx row, const EqRow& rv) {");
        self.coords(&need, &mut f, 1);
        f.s.push_str(&t.s);
        f.line(0, "}");
        f.s
    }

    /// `eq_global` (a row's contribution) and `eq_global_store`, when the kernel has globals.
    fn row_globals(&self, rp: &rows::RowPlan, rows: usize) -> String {
        if rp.globals.is_empty() {
            return String::new();
        }
        let scope = self.row_scope(rp, false);
        let mut t = Text::default();
        t.line(0, "__device__ __forceinline__ void eq_global(const EqRow& rv, float (&g)[EQ_NGLOBAL]) {");
        for (j, &i) in rp.globals.iter().enumerate() {
            let x = children(&self.node(i).op)[0];
            let val = self.operand(x, "float", &scope);
            t.line(1, format!("g[{j}] = {};", reduce_combine(self.reduce_of(i), &format!("g[{j}]"), &val)));
        }
        t.line(0, "}");
        t.line(0, "__device__ __forceinline__ void eq_global_store(EQ_PARAMS, const float (&g)[EQ_NGLOBAL]) {");
        for st in self.l.stores.iter() {
            let Some(j) = rp.globals.iter().position(|&g| g == st.node) else { continue };
            let val = match self.reduce_of(st.node) {
                Reduce::Mean => format!("g[{j}] / {}", literal(rows as f64, "float")),
                _ => format!("g[{j}]"),
            };
            t.line(1, format!("eq_put({} + 0, {val});", self.param(None, Some(st.write))));
        }
        t.line(0, "}");
        t.s
    }

    /// A store outside any lane loop (one element).
    fn store_row(&self, st: &Store, val: &str, skip: Option<usize>, need: &mut BTreeSet<usize>) -> (String, ()) {
        let r = self.rank();
        let p = self.param(None, Some(st.write));
        let strides: Vec<usize> =
            contiguous(&st.shape).into_iter().zip(&st.shape).map(|(s, &d)| if d == 1 { 0 } else { s }).collect();
        let off = self.offset(&strides, need);
        let pred: Vec<String> = (0..r)
            .filter(|&k| st.shape[k] == 1 && self.dim(k) > 1 && Some(k) != skip)
            .map(|k| {
                need.insert(k);
                format!("c{k} == 0")
            })
            .collect();
        let cond = if pred.is_empty() { String::new() } else { format!("if ({}) ", pred.join(" && ")) };
        (format!("{cond}eq_put({p} + {off}, {val});"), ())
    }
}

impl Emitter<'_> {
    fn colreduce(&self) -> Result<Rendered> {
        let a = self.l.axis.unwrap_or(0);
        let reds: Vec<usize> = (0..self.l.nodes.len()).filter(|&i| matches!(self.node(i).op, Op::Reduce(..))).collect();
        for (i, n) in self.l.nodes.iter().enumerate() {
            if children(&n.op).iter().any(|c| reds.contains(c)) {
                return Err(err(
                    self.k,
                    format!("the result of a column reduction is used in the same kernel (node {i})"),
                ));
            }
        }
        let outer: usize = self.l.domain[..a].iter().product();
        let n = self.dim(a);
        let inner: usize = self.l.domain[a + 1..].iter().product();
        let tx = pow2_at_least(inner.div_ceil(self.vec)).min(32);
        let ty = (256 / tx).min(pow2_at_least(n));
        let tile = tx * self.vec;
        let tiles = outer * inner.div_ceil(tile);
        let max_chunks = n.div_ceil(ty * 8).max(1);
        let chunks = 1024usize.div_ceil(tiles.max(1)).clamp(1, max_chunks);
        let chunk_n = n.div_ceil(chunks);
        let chunks = n.div_ceil(chunk_n);
        let nacc = reds.len().max(1);
        let ws_bytes = (tiles * chunks * nacc * tile * 4).max(4) as u64;
        let count_bytes = (tiles * 4).max(4) as u64;

        let mut d = self.common_defines(&self.name(), &[("float", "eq_ws"), ("unsigned int", "eq_count")]);
        for (k, v) in [
            ("EQ_OUTER", outer),
            ("EQ_N", n),
            ("EQ_INNER", inner),
            ("EQ_VEC", self.vec),
            ("EQ_TX", tx),
            ("EQ_TY", ty),
            ("EQ_CHUNKS", chunks),
            ("EQ_CHUNK_N", chunk_n),
            ("EQ_NACC", nacc),
        ] {
            let _ = writeln!(d, "#define {k} {v}");
        }
        let mut body = String::new();
        let mut t = Text::default();
        t.line(0, "__device__ __forceinline__ void eq_acc_init(float (&acc)[EQ_NACC][EQ_VEC]) {");
        for (k, &i) in reds.iter().enumerate() {
            t.line(1, format!("for (int v = 0; v < EQ_VEC; ++v) acc[{k}][v] = {};", reduce_init(self.reduce_of(i))));
        }
        t.line(0, "}");
        t.line(0, "__device__ __forceinline__ float eq_combine(int k, float a, float b) {");
        for (k, &i) in reds.iter().enumerate() {
            t.line(1, format!("if (k == {k}) return {};", reduce_combine(self.reduce_of(i), "a", "b")));
        }
        t.line(1, "return a;");
        t.line(0, "}");
        body.push_str(&t.s);
        body.push_str(&self.col_accum(&reds));
        body.push_str(&self.col_store(&reds, n));
        let shape = Shape {
            grid: [tiles as u32, chunks as u32, 1],
            block: [tx as u32, ty as u32, 1],
            workspace: vec![("eq_ws".into(), ws_bytes, false), ("eq_count".into(), count_bytes, true)],
        };
        Ok(Rendered { defines: d, body, shape })
    }

    fn col_accum(&self, reds: &[usize]) -> String {
        let mut scope = self.scope(true);
        for &i in reds {
            scope.refs[i] = Some(String::new());
        }
        let inputs: Vec<usize> = reds.iter().map(|&i| children(&self.node(i).op)[0]).collect();
        let stores: Vec<&Store> = self.l.stores.iter().filter(|s| !reds.contains(&s.node)).collect();
        let mut roots = inputs.clone();
        roots.extend(stores.iter().map(|s| s.node));
        self.lane_function(
            "__device__ __forceinline__ void eq_accum(EQ_PARAMS, eq_idx o, eq_idx n, eq_idx i0, float (&acc)[EQ_NACC][EQ_VEC]) {",
            0,
            &mut scope,
            &roots,
            |e, scope, need| {
                let (decls, mut lines, after) =
                    e.store_lines(&stores, |st| e.operand(st.node, value_type(e.node(st.node).dtype), scope), None, need);
                for (k, (&red, &x)) in reds.iter().zip(&inputs).enumerate() {
                    let val = e.operand(x, "float", scope);
                    lines.push(format!("acc[{k}][v] = {};", reduce_combine(e.reduce_of(red), &format!("acc[{k}][v]"), &val)));
                }
                (decls, lines, after)
            },
        )
    }

    fn col_store(&self, reds: &[usize], n: usize) -> String {
        let mut scope = self.scope(true);
        for (k, &i) in reds.iter().enumerate() {
            scope.refs[i] = Some(match self.reduce_of(i) {
                Reduce::Mean => format!("(acc[{k}][v] / {})", literal(n as f64, "float")),
                _ => format!("acc[{k}][v]"),
            });
        }
        let stores: Vec<&Store> = self.l.stores.iter().filter(|s| reds.contains(&s.node)).collect();
        let axis = self.l.axis;
        self.lane_function(
            "__device__ __forceinline__ void eq_col_store(EQ_PARAMS, eq_idx o, eq_idx i0, const float (&acc)[EQ_NACC][EQ_VEC]) {",
            0,
            &mut scope,
            &[],
            |e, scope, need| e.store_lines(&stores, |st| e.operand(st.node, "float", scope), axis, need),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn literals_are_valid_c() {
        assert_eq!(literal(1e-5, "float"), "1.0e-5f");
        assert_eq!(literal(2.0, "float"), "2.0f");
        assert_eq!(literal(0.5, "float"), "0.5f");
        assert_eq!(literal(f64::NEG_INFINITY, "float"), "(-EQ_INF)");
        assert_eq!(literal(3.0, "int"), "3");
        assert_eq!(literal(1.0, "bool"), "true");
    }
}
