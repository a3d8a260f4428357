//! Random well-typed `.eqf` programs for differential testing (issue 9).
//!
//! A [`Recipe`] is a list of random choices; [`Recipe::render`] interprets it as `.eqf` text,
//! one statement per step (a step that writes a decomposed pattern, such as a layernorm written
//! out, adds a few). Every field of a [`Step`] is read modulo what is available at that point,
//! so *any* recipe renders to a program: proptest shrinks a failing recipe (drops steps, moves
//! numbers towards 0) and the smaller recipe is still a program, only simpler (op 0 is `+`,
//! operand 0 is the newest value). [`recipes`] is the proptest strategy; [`random_recipe`]
//! draws one from a seed without a test runner (for the GPU differential run).
//!
//! The programs cover every operator of the language that the reference evaluates (`grad`
//! aside): pointwise unary and binary ops, comparisons and `where`, casts among all dtypes,
//! reductions over any axis, layout views, matrix products with batch broadcasting, `iota`,
//! `onehot`, `dropout`, every composite, and the decomposed forms the pattern rules recognise.
//! Shapes mix size 1 and odd sizes with NumPy broadcasting; values are shared by several
//! consumers; every value no statement uses is an output, and some used ones are outputs too.
//!
//! Invariants:
//! - every recipe renders to a program `parse_program` accepts, and its reference evaluation on
//!   `random_inputs` is finite: the generator keeps an interval for every value (inputs are
//!   normal samples, taken as lying in [-7, 7]) and scales an operand down by a power of two
//!   before an op that could leave [-64, 64], feeds `log`, `sqrt`, `rsqrt`, `recip` and divisors
//!   only values it knows are at least 1/4 (`exp`, `abs(x) + 1`, `square(x) + 0.5`), and
//!   `exp` only values within [-4, 4];
//! - discontinuous operations (comparisons, casts to `i32` or `bool`, `where` conditions) only
//!   see *exact* values: inputs, literals, and what is computed from them without a rounding
//!   choice (layout views, negation, `abs`, `relu`, `max`, `min`, selections, casts, integer
//!   arithmetic). A plan that rounds floats differently from the program computes exact values
//!   identically, so it cannot flip a comparison.

use std::collections::BTreeSet;

use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};

use crate::infer::broadcast_shapes;
use crate::types::{DType, TensorType};

/// Axis sizes, small first so that shrinking makes shapes small; 1 and odd sizes included.
const SIZES: [usize; 12] = [2, 3, 1, 4, 5, 7, 1, 8, 6, 16, 13, 32];
/// Largest tensor a program holds, in elements (keeps the reference fast in debug builds).
const MAX_NUMEL: usize = 512;
/// Float values stay within [-MAG, MAG].
const MAG: f64 = 64.0;
/// Integer values stay within [-INT_MAG, INT_MAG].
const INT_MAG: f64 = 10_000.0;

/// One step of a recipe: which operation, which operands, which attributes. Every field is
/// taken modulo what the step can use, so any value is valid; 0 is always the simplest choice.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Step {
    /// The operation (weighted; see `TABLE`).
    pub op: u16,
    /// First operand, by recency: 0 is the newest value that fits.
    pub a: u16,
    /// Second operand: an existing value, a literal or a new input.
    pub b: u16,
    /// Third operand (conditions, parameters).
    pub c: u16,
    /// Variant of the operation (which unary function, which axis, ...).
    pub attr: u16,
    /// A second attribute (a size, a literal, a target dtype).
    pub attr2: u16,
    /// Whether the step's value is an output even if later steps use it.
    pub output: bool,
}

/// A program as a list of random choices; see the module docs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Recipe {
    /// The sizes of the usual input shape, as indices into the size table (1 to 3 axes).
    pub frame: Vec<u8>,
    /// The float dtype of new inputs (f32 mostly, then bf16 and f16).
    pub dtype: u8,
    /// The seed of the program's inputs (`random_inputs`).
    pub input_seed: u64,
    pub steps: Vec<Step>,
}

fn step() -> impl Strategy<Value = Step> {
    (any::<u16>(), any::<u16>(), any::<u16>(), any::<u16>(), any::<u16>(), any::<u16>(), prop::bool::weighted(0.15))
        .prop_map(|(op, a, b, c, attr, attr2, output)| Step { op, a, b, c, attr, attr2, output })
}

/// Recipes of 1 to `max_steps` steps.
pub fn recipes(max_steps: usize) -> impl Strategy<Value = Recipe> {
    let frame = prop::collection::vec(0..SIZES.len() as u8, 1..=3);
    let steps = prop::collection::vec(step(), 1..=max_steps.max(1));
    (frame, any::<u8>(), any::<u16>(), steps).prop_map(|(frame, dtype, seed, steps)| Recipe {
        frame,
        dtype,
        input_seed: seed as u64,
        steps,
    })
}

/// The recipe that `seed` draws (the same on every machine), for runs without a test runner.
pub fn random_recipe(seed: u64, max_steps: usize) -> Recipe {
    let mut bytes = [0u8; 32];
    bytes[..8].copy_from_slice(&seed.to_le_bytes());
    let rng = TestRng::from_seed(RngAlgorithm::ChaCha, &bytes);
    let mut runner = TestRunner::new_with_rng(Config::default(), rng);
    recipes(max_steps).new_tree(&mut runner).expect("recipes never reject").current()
}

impl Recipe {
    /// The program as `.eqf` text (without a header comment).
    pub fn render(&self) -> String {
        let mut g = Gen::new(self);
        for s in &self.steps {
            let v = g.step(s);
            if s.output {
                g.outputs.insert(v.text);
            }
        }
        g.finish()
    }
}

/// A value or expression as the generator knows it: its text, type, an interval holding every
/// value it takes, and whether it is exact (see the module docs).
#[derive(Clone, Debug)]
struct E {
    text: String,
    ty: TensorType,
    lo: f64,
    hi: f64,
    exact: bool,
    /// Whether the text needs no parentheses as an operand.
    atomic: bool,
    /// A literal: a weak f32 scalar that takes the dtype of the tensor it meets.
    literal: bool,
}

impl E {
    fn literal(text: &str) -> E {
        let v: f64 = text.parse().expect("literal texts are numbers");
        E {
            text: text.to_string(),
            ty: TensorType::scalar(DType::F32),
            lo: v,
            hi: v,
            exact: true,
            atomic: v >= 0.0,
            literal: true,
        }
    }

    fn mag(&self) -> f64 {
        self.lo.abs().max(self.hi.abs())
    }

    fn dtype(&self) -> DType {
        self.ty.dtype
    }

    fn rank(&self) -> usize {
        self.ty.rank()
    }

    fn shape(&self) -> &[usize] {
        &self.ty.shape
    }

    fn is_float(&self) -> bool {
        !self.literal && self.dtype().is_float()
    }

    fn is_int(&self) -> bool {
        !self.literal && self.dtype() == DType::I32
    }

    fn is_bool(&self) -> bool {
        !self.literal && self.dtype() == DType::Bool
    }

    /// The text as an operand of a binary operator.
    fn operand(&self) -> String {
        if self.atomic {
            self.text.clone()
        } else {
            format!("({})", self.text)
        }
    }

    /// A copy with another text, type and interval (exactness kept unless said otherwise).
    fn derive(&self, text: String, ty: TensorType, lo: f64, hi: f64, atomic: bool) -> E {
        E { text, ty, lo, hi, exact: self.exact, atomic, literal: false }
    }

    fn with_exact(mut self, exact: bool) -> E {
        self.exact = exact;
        self
    }
}

/// A call `name(args)`; its type and interval are given.
fn call(name: &str, args: &[String], ty: TensorType, lo: f64, hi: f64, exact: bool) -> E {
    E { text: format!("{name}({})", args.join(", ")), ty, lo, hi, exact, atomic: true, literal: false }
}

/// `a op b` with NumPy broadcasting; the dtype is the tensor operand's.
fn binop(a: &E, op: &str, b: &E, lo: f64, hi: f64, exact: bool) -> E {
    let shape = broadcast_shapes(a.shape(), b.shape()).expect("operands were chosen to broadcast");
    let dtype = if a.literal { b.dtype() } else { a.dtype() };
    let dtype = if is_comparison(op) { DType::Bool } else { dtype };
    let text = format!("{} {op} {}", a.operand(), b.operand());
    E { text, ty: TensorType::new(dtype, shape), lo, hi, exact, atomic: false, literal: false }
}

fn is_comparison(op: &str) -> bool {
    matches!(op, "<" | "<=" | ">" | ">=" | "==" | "!=")
}

fn numel(shape: &[usize]) -> usize {
    shape.iter().product()
}

/// Whether two shapes broadcast to a tensor the generator may hold.
fn fits(a: &[usize], b: &[usize]) -> bool {
    broadcast_shapes(a, b).is_ok_and(|s| numel(&s) <= MAX_NUMEL)
}

fn shape_text(shape: &[usize]) -> String {
    let items: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
    format!("[{}]", items.join(", "))
}

/// The interval of `f` over [lo, hi] for a monotone `f`.
fn monotone(lo: f64, hi: f64, f: impl Fn(f64) -> f64) -> (f64, f64) {
    let (a, b) = (f(lo), f(hi));
    (a.min(b), a.max(b))
}

/// The interval of `f` at the corners of a box, for `f` monotone in each argument.
fn corners(a: (f64, f64), b: (f64, f64), f: impl Fn(f64, f64) -> f64) -> (f64, f64) {
    let v = [f(a.0, b.0), f(a.0, b.1), f(a.1, b.0), f(a.1, b.1)];
    (v.iter().copied().fold(f64::INFINITY, f64::min), v.iter().copied().fold(f64::NEG_INFINITY, f64::max))
}

/// The interval of a smooth unary function; see `scalar.rs` for the functions themselves.
fn unary_interval(name: &str, lo: f64, hi: f64) -> (f64, f64) {
    let m = lo.abs().max(hi.abs());
    match name {
        "neg" => (-hi, -lo),
        "abs" => (
            if lo >= 0.0 {
                lo
            } else if hi <= 0.0 {
                -hi
            } else {
                0.0
            },
            m,
        ),
        "relu" => (lo.max(0.0), hi.max(0.0)),
        "square" => (
            if lo >= 0.0 {
                lo * lo
            } else if hi <= 0.0 {
                hi * hi
            } else {
                0.0
            },
            m * m,
        ),
        "tanh" => monotone(lo, hi, f64::tanh),
        "sigmoid" => monotone(lo, hi, crate::scalar::sigmoid),
        "erf" => monotone(lo, hi, libm::erf),
        // gelu, gelu_tanh and silu dip below 0 (to about -0.17 and -0.28) and stay under max(x, 0).
        "gelu" | "gelu_tanh" | "silu" => (-0.3, hi.max(0.0)),
        "sin" | "cos" => (-1.0, 1.0),
        "exp" => monotone(lo, hi, f64::exp),
        "log" => monotone(lo, hi, f64::ln),
        "sqrt" => monotone(lo, hi, f64::sqrt),
        "rsqrt" => monotone(lo, hi, |x| 1.0 / x.sqrt()),
        "recip" => monotone(lo, hi, |x| 1.0 / x),
        _ => unreachable!("unary_interval of `{name}`"),
    }
}

/// The operations a step may perform, with their weights.
#[derive(Clone, Copy, Debug)]
enum Op {
    Arith,
    Unary,
    Exp,
    LogLike,
    Div,
    Pow,
    MaxMin,
    Compare,
    Where,
    Cast,
    Reduce,
    Transpose,
    Reshape,
    Broadcast,
    MatMul,
    Iota,
    Mask,
    OneHot,
    Dropout,
    Softmax,
    Norm,
    CrossEntropy,
    Attention,
    IntArith,
    BoolOp,
    Pattern,
}

const TABLE: &[(Op, u16)] = &[
    (Op::Arith, 12),
    (Op::Unary, 8),
    (Op::Exp, 2),
    (Op::LogLike, 4),
    (Op::Div, 3),
    (Op::Pow, 2),
    (Op::MaxMin, 2),
    (Op::Compare, 2),
    (Op::Where, 3),
    (Op::Cast, 3),
    (Op::Reduce, 6),
    (Op::Transpose, 3),
    (Op::Reshape, 3),
    (Op::Broadcast, 2),
    (Op::MatMul, 4),
    (Op::Iota, 1),
    (Op::Mask, 1),
    (Op::OneHot, 1),
    (Op::Dropout, 2),
    (Op::Softmax, 3),
    (Op::Norm, 3),
    (Op::CrossEntropy, 1),
    (Op::Attention, 2),
    (Op::IntArith, 2),
    (Op::BoolOp, 1),
    (Op::Pattern, 10),
];

fn op_of(sel: u16) -> Op {
    let total: u16 = TABLE.iter().map(|(_, w)| w).sum();
    let mut k = sel % total;
    for &(op, w) in TABLE {
        if k < w {
            return op;
        }
        k -= w;
    }
    unreachable!("weights cover the range")
}

/// Picks `xs[sel % len]`.
fn choose<T: Copy>(xs: &[T], sel: u16) -> T {
    xs[sel as usize % xs.len()]
}

/// The interpreter of a recipe.
struct Gen {
    /// The usual input shape.
    frame: Vec<usize>,
    /// The dtype of new float inputs.
    float: DType,
    /// Inputs and named values in creation order; operands are picked from here.
    pool: Vec<E>,
    /// Input names and declarations, in creation order.
    inputs: Vec<(String, String)>,
    /// Statements `name = expr`.
    lines: Vec<(String, String)>,
    /// Values marked as outputs by their step.
    outputs: BTreeSet<String>,
}

impl Gen {
    fn new(r: &Recipe) -> Gen {
        let mut frame: Vec<usize> = r.frame.iter().map(|&i| SIZES[i as usize % SIZES.len()]).collect();
        while numel(&frame) > MAX_NUMEL {
            frame.remove(0);
        }
        if frame.is_empty() {
            frame.push(SIZES[0]);
        }
        let float = choose(&[DType::F32, DType::F32, DType::F32, DType::Bf16, DType::F32, DType::F16], r.dtype as u16);
        Gen { frame, float, pool: vec![], inputs: vec![], lines: vec![], outputs: BTreeSet::new() }
    }

    /// Declarations, statements and outputs: every value no statement reads is an output.
    fn finish(self) -> String {
        let mut read: BTreeSet<&str> = BTreeSet::new();
        for (_, expr) in &self.lines {
            read.extend(expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).filter(|w| !w.is_empty()));
        }
        let mut text = String::new();
        // An input made for an operand that was then not used is left out.
        for (_, decl) in self.inputs.iter().filter(|(n, _)| read.contains(n.as_str())) {
            text += &format!("{decl}\n");
        }
        let mut outs = vec![];
        for (name, expr) in &self.lines {
            text += &format!("{name} = {expr}\n");
            if !read.contains(name.as_str()) || self.outputs.contains(name) {
                outs.push(name.as_str());
            }
        }
        text += &format!("output {}\n", outs.join(", "));
        text
    }

    fn step(&mut self, s: &Step) -> E {
        match op_of(s.op) {
            Op::Arith => self.arith(s),
            Op::Unary => self.unary(s),
            Op::Exp => self.exp(s),
            Op::LogLike => self.log_like(s),
            Op::Div => self.div(s),
            Op::Pow => self.pow(s),
            Op::MaxMin => self.max_min(s),
            Op::Compare => self.compare(s),
            Op::Where => self.select(s),
            Op::Cast => self.cast(s),
            Op::Reduce => self.reduce(s),
            Op::Transpose => self.transpose(s),
            Op::Reshape => self.reshape(s),
            Op::Broadcast => self.broadcast(s),
            Op::MatMul => self.matmul(s),
            Op::Iota => self.iota(s),
            Op::Mask => self.mask(s),
            Op::OneHot => self.onehot(s),
            Op::Dropout => self.dropout(s),
            Op::Softmax => self.softmax(s),
            Op::Norm => self.norm(s),
            Op::CrossEntropy => self.cross_entropy(s),
            Op::Attention => self.attention(s),
            Op::IntArith => self.int_arith(s),
            Op::BoolOp => self.bool_op(s),
            Op::Pattern => self.pattern(s),
        }
    }

    // ---- values: picking, declaring, naming

    /// A value that satisfies `ok`, by recency: mostly one of the three newest, sometimes any.
    fn pick(&self, sel: u16, ok: impl Fn(&E) -> bool) -> Option<E> {
        let c: Vec<&E> = self.pool.iter().filter(|e| ok(e)).collect();
        if c.is_empty() {
            return None;
        }
        let s = sel as usize;
        let k = if s < 0xc000 { s % c.len().min(3) } else { s % c.len() };
        Some(c[c.len() - 1 - k].clone())
    }

    /// Declares a new input.
    fn input(&mut self, dtype: DType, shape: Vec<usize>) -> E {
        let name = format!("x{}", self.inputs.len());
        let ty = TensorType::new(dtype, shape);
        self.inputs.push((name.clone(), format!("input {name}: {ty}")));
        let (lo, hi) = match dtype {
            DType::I32 => (0.0, 99.0),
            DType::Bool => (0.0, 1.0),
            _ => (-7.0, 7.0),
        };
        let e = E { text: name, ty, lo, hi, exact: true, atomic: true, literal: false };
        self.pool.push(e.clone());
        e
    }

    /// Binds an expression to a new name, scaled into [-MAG, MAG] (or clamped, for integers)
    /// if it could leave it; returns the name as a value.
    fn emit(&mut self, e: E) -> E {
        let e = match e.dtype() {
            DType::Bool => e,
            DType::I32 => self.tame(e, INT_MAG * 10.0),
            _ => self.tame(e, MAG),
        };
        self.bind(e)
    }

    /// Binds an expression to a new name as it is: for the parts of a pattern, which must keep
    /// their form (their values stay within f16's range, and later ops scale them down).
    fn bind(&mut self, e: E) -> E {
        let name = format!("t{}", self.lines.len());
        self.lines.push((name.clone(), e.text.clone()));
        let v = E { text: name, atomic: true, literal: false, ..e };
        self.pool.push(v.clone());
        v
    }

    /// Binds a compound expression to a name (so a pattern repeats a name, not a subexpression).
    fn named(&mut self, e: E) -> E {
        if e.atomic {
            e
        } else {
            self.bind(e)
        }
    }

    /// The usual input shape with some axes dropped from the front or set to 1.
    fn frame_shape(&self, sel: u16) -> Vec<usize> {
        let n = self.frame.len();
        let keep = if sel % 4 == 3 { (sel as usize / 4) % (n + 1) } else { n };
        let mut shape = self.frame[n - keep..].to_vec();
        for (i, d) in shape.iter_mut().enumerate() {
            if sel & (0x100 << i) != 0 && sel % 3 == 0 {
                *d = 1;
            }
        }
        shape
    }

    /// A float value, or a new input of the usual shape.
    fn float_operand(&mut self, sel: u16) -> E {
        match self.pick(sel, |e| e.is_float()) {
            Some(e) => e,
            None => self.input(self.float, self.frame_shape(sel)),
        }
    }

    /// A float value of rank at least `rank`, or a new input.
    fn float_of_rank(&mut self, sel: u16, rank: usize) -> E {
        if let Some(e) = self.pick(sel, |e| e.is_float() && e.rank() >= rank) {
            return e;
        }
        let mut shape = self.frame.clone();
        while shape.len() < rank {
            shape.insert(0, choose(&SIZES, sel));
        }
        while numel(&shape) > MAX_NUMEL {
            let widest = (0..shape.len()).max_by_key(|&i| shape[i]).expect("not empty");
            shape[widest] = 1;
        }
        self.input(self.float, shape)
    }

    /// A float, integer or bool value that is exact, or a new input.
    fn exact_operand(&mut self, sel: u16) -> E {
        match self.pick(sel, |e| e.exact && !e.literal) {
            Some(e) => e,
            None => self.input(self.float, self.frame_shape(sel)),
        }
    }

    /// A shape that broadcasts with `shape`: axes dropped from the front or set to 1, size-1
    /// axes widened, an axis added in front.
    fn partner_shape(&self, shape: &[usize], sel: u16) -> Vec<usize> {
        let drop = if sel & 0x10 != 0 { (sel as usize >> 5) % (shape.len() + 1) } else { 0 };
        let mut out: Vec<usize> = shape[drop..].to_vec();
        for (i, d) in out.iter_mut().enumerate() {
            let bit = sel & (0x200 << (i % 4)) != 0;
            if bit && *d == 1 {
                *d = choose(&SIZES, sel.rotate_left(i as u32));
            } else if bit {
                *d = 1;
            }
        }
        if sel & 0x8 != 0 && out.len() < 4 {
            out.insert(0, choose(&SIZES, sel >> 3));
        }
        if fits(shape, &out) {
            out
        } else {
            shape.to_vec()
        }
    }

    /// The second operand of a binary op with `a`: an existing value of `a`'s dtype that
    /// satisfies `ok` and broadcasts with `a`, a literal from `literals`, or a new input.
    fn partner(&mut self, a: &E, sel: u16, ok: impl Fn(&E) -> bool, literals: &[&str]) -> E {
        let dtype = a.dtype();
        let choice = sel % 8;
        if choice == 6 && !literals.is_empty() {
            return E::literal(choose(literals, sel / 8));
        }
        if choice != 7 {
            let fit = |e: &E| !e.literal && e.dtype() == dtype && fits(a.shape(), e.shape()) && ok(e);
            if let Some(e) = self.pick(sel / 8, fit) {
                return e;
            }
        }
        let shape = self.partner_shape(a.shape(), sel / 8);
        self.input(dtype, shape)
    }

    // ---- conditioning

    /// `e`, multiplied by a power of two if it could leave [-limit, limit] (floats), or clamped
    /// (integers).
    fn tame(&self, e: E, limit: f64) -> E {
        if e.mag() <= limit {
            return e;
        }
        if !e.dtype().is_float() {
            let l = limit.floor();
            let text = format!("min(max({}, -{l}), {l})", e.text);
            return e.derive(text, e.ty.clone(), e.lo.max(-l), e.hi.min(l), true);
        }
        let k = (e.mag() / limit).log2().ceil() as i32;
        let f = 2f64.powi(-k);
        let text = format!("{} * {f}", e.operand());
        e.derive(text, e.ty.clone(), e.lo * f, e.hi * f, false).with_exact(false)
    }

    /// A float (or integer) expression known to be at least 1/4: `e` itself when it is, else
    /// `abs(e) + 1`, `square(e) + 0.5`, `exp(e)` or `sigmoid(e) + 0.5`.
    fn positive(&self, e: E, sel: u16) -> E {
        if e.lo >= 0.25 && sel % 5 == 4 {
            return e;
        }
        let ty = e.ty.clone();
        let m = e.mag();
        if !e.dtype().is_float() {
            return e.derive(format!("abs({}) + 1", e.text), ty, 1.0, m + 1.0, false);
        }
        match sel % 4 {
            0 => e.derive(format!("abs({}) + 1", e.text), ty, 1.0, m + 1.0, false),
            1 => {
                let e = self.tame(e, 7.0);
                let m = e.mag();
                e.derive(format!("square({}) + 0.5", e.text), ty, 0.5, m * m + 0.5, false)
            }
            2 => {
                // exp(-1.3) is just above 1/4.
                let e = self.tame(e, 1.3);
                let (lo, hi) = unary_interval("exp", e.lo, e.hi);
                e.derive(format!("exp({})", e.text), ty, lo, hi, true)
            }
            _ => e.derive(format!("sigmoid({}) + 0.5", e.text), ty, 0.5, 1.5, false),
        }
        .with_exact(false)
    }

    /// A unary call on `e` with the interval of the function.
    fn apply(&self, name: &str, e: &E) -> E {
        let (lo, hi) = unary_interval(name, e.lo, e.hi);
        let exact = e.exact && matches!(name, "neg" | "abs" | "relu");
        call(name, &[e.text.clone()], e.ty.clone(), lo, hi, exact)
    }

    // ---- pointwise operations

    /// `a + b`, `a - b`, `a * b` on floats (integers in `int_arith`).
    fn arith(&mut self, s: &Step) -> E {
        let a = self.float_operand(s.a);
        let lits = ["1", "2", "0.5", "0", "-1", "3", "0.25", "1e-3"];
        let b = self.partner(&a, s.b, |_| true, &lits);
        let op = choose(&["+", "-", "*"], s.attr);
        let e = self.arith_of(a, op, b, MAG);
        self.emit(e)
    }

    /// `a op b` for `+ - *`, with operands scaled so the result stays within `limit`.
    fn arith_of(&self, a: E, op: &str, b: E, limit: f64) -> E {
        let (a, b) = if op == "*" {
            (self.tame(a, limit.sqrt()), if b.literal { b } else { self.tame(b, limit.sqrt()) })
        } else {
            (self.tame(a, limit / 2.0), if b.literal { b } else { self.tame(b, limit / 2.0) })
        };
        let (lo, hi) = match op {
            "+" => (a.lo + b.lo, a.hi + b.hi),
            "-" => (a.lo - b.hi, a.hi - b.lo),
            _ => corners((a.lo, a.hi), (b.lo, b.hi), |x, y| x * y),
        };
        let exact = a.exact && b.exact && !a.dtype().is_float();
        binop(&a, op, &b, lo, hi, exact)
    }

    /// A smooth or piecewise-linear unary function.
    fn unary(&mut self, s: &Step) -> E {
        let names =
            ["neg", "abs", "relu", "tanh", "sigmoid", "gelu", "gelu_tanh", "silu", "erf", "sin", "cos", "square"];
        let name = choose(&names, s.attr);
        let a = self.float_operand(s.a);
        let a = if name == "square" { self.tame(a, MAG.sqrt()) } else { a };
        let e = if name == "neg" && s.attr2 % 2 == 0 {
            // Unary minus in its operator spelling.
            a.derive(format!("-{}", a.operand()), a.ty.clone(), -a.hi, -a.lo, false)
        } else {
            self.apply(name, &a)
        };
        self.emit(e)
    }

    fn exp(&mut self, s: &Step) -> E {
        let a = self.float_operand(s.a);
        let a = self.tame(a, 4.0);
        let e = self.apply("exp", &a);
        self.emit(e)
    }

    /// `log`, `sqrt`, `rsqrt` or `recip` of a value made positive.
    fn log_like(&mut self, s: &Step) -> E {
        let a = self.float_operand(s.a);
        let a = self.positive(a, s.attr2);
        let e = self.apply(choose(&["log", "sqrt", "rsqrt", "recip"], s.attr), &a);
        self.emit(e)
    }

    /// `a / b` with `b` made positive (floats; integer division is in `int_arith`).
    fn div(&mut self, s: &Step) -> E {
        let a = self.float_operand(s.a);
        let b = self.partner(&a, s.b, |_| true, &["2", "3", "0.5", "7"]);
        let b = if b.literal { b } else { self.positive(b, s.attr2) };
        let a = self.tame(a, MAG * b.lo.min(1.0));
        let (lo, hi) = corners((a.lo, a.hi), (b.lo, b.hi), |x, y| x / y);
        let e = binop(&a, "/", &b, lo, hi, false);
        self.emit(e)
    }

    /// `pow(a, b)` or `a ^ b`: a positive base with any exponent in [-2, 3], or any base with
    /// an integer exponent.
    fn pow(&mut self, s: &Step) -> E {
        let a = self.float_operand(s.a);
        let spell = |a: &E, b: &E| {
            if s.attr2 % 2 == 0 {
                format!("pow({}, {})", a.text, b.text)
            } else {
                format!("{} ^ {}", a.operand(), b.operand())
            }
        };
        if s.attr % 3 == 0 {
            let b = E::literal(choose(&["2", "3"], s.b));
            let a = self.tame(a, 3.9);
            let (lo, hi) =
                if b.text == "2" { unary_interval("square", a.lo, a.hi) } else { (a.lo.powi(3), a.hi.powi(3)) };
            let e = a.derive(spell(&a, &b), a.ty.clone(), lo, hi, false).with_exact(false);
            return self.emit(e);
        }
        let a = self.tame(a, 4.0);
        let base = self.positive(a, s.attr2 / 2);
        let b = self.partner(&base, s.b, |_| true, &["2", "0.5", "-0.5", "-1", "3", "1", "1.5"]);
        let b = if b.literal { b } else { self.tame(b, 2.0) };
        let (lo, hi) = corners((base.lo, base.hi), (b.lo, b.hi), f64::powf);
        let shape = broadcast_shapes(base.shape(), b.shape()).expect("partners broadcast");
        let ty = TensorType::new(base.dtype(), shape);
        let e = E { text: spell(&base, &b), ty, lo, hi, exact: false, atomic: s.attr2 % 2 == 0, literal: false };
        self.emit(e)
    }

    /// `max(a, b)` or `min(a, b)` (exact when both operands are).
    fn max_min(&mut self, s: &Step) -> E {
        let a = self.pick(s.a, |e| !e.is_bool() && !e.literal);
        let a = a.unwrap_or_else(|| self.float_operand(s.a));
        let b = self.partner(&a, s.b, |_| true, &["0", "1", "-1", "0.5"]);
        let (name, lo, hi) = if s.attr % 2 == 0 {
            ("max", a.lo.max(b.lo), a.hi.max(b.hi))
        } else {
            ("min", a.lo.min(b.lo), a.hi.min(b.hi))
        };
        let shape = broadcast_shapes(a.shape(), b.shape()).expect("partners broadcast");
        let e = call(
            name,
            &[a.text.clone(), b.text.clone()],
            TensorType::new(a.dtype(), shape),
            lo,
            hi,
            a.exact && b.exact,
        );
        self.emit(e)
    }

    /// A comparison of two exact values (or an exact value and a literal).
    fn compare_of(&mut self, a: &E, sel: u16, which: u16) -> E {
        let lits: &[&str] = if a.is_bool() { &["0", "1"] } else { &["0", "0.5", "-1", "1", "2"] };
        let b = self.partner(a, sel, |e| e.exact, lits);
        let op = choose(&["<", "<=", ">", ">=", "==", "!="], which);
        binop(a, op, &b, 0.0, 1.0, true)
    }

    fn compare(&mut self, s: &Step) -> E {
        let a = self.exact_operand(s.a);
        let e = self.compare_of(&a, s.b, s.attr);
        self.emit(e)
    }

    /// A bool value that broadcasts with `shape`: an existing one, or a comparison made now.
    fn condition(&mut self, shape: &[usize], sel: u16, which: u16) -> E {
        if let Some(c) = self.pick(sel, |e| e.is_bool() && fits(e.shape(), shape)) {
            if sel % 4 != 3 {
                return c;
            }
        }
        let fit = |e: &E| e.exact && !e.literal && !e.is_bool() && fits(e.shape(), shape);
        let a = match self.pick(sel / 4, fit) {
            Some(a) => a,
            None => {
                let p = self.partner_shape(shape, sel);
                self.input(self.float, p)
            }
        };
        let c = self.compare_of(&a, sel / 16, which);
        if fits(c.shape(), shape) {
            c
        } else {
            let p = self.partner_shape(shape, sel);
            self.input(DType::Bool, p)
        }
    }

    /// `where(c, a, b)`.
    fn select(&mut self, s: &Step) -> E {
        let a = self.pick(s.a, |e| !e.literal).unwrap_or_else(|| self.float_operand(s.a));
        let lits: &[&str] = if a.is_bool() { &["0", "1"] } else { &["0", "-1", "2"] };
        let b = self.partner(&a, s.b, |_| true, lits);
        let out = broadcast_shapes(a.shape(), b.shape()).expect("partners broadcast");
        let c = self.condition(&out, s.c, s.attr);
        let shape = broadcast_shapes(c.shape(), &out).expect("conditions fit");
        let (args, ty) = ([c.text.clone(), a.text.clone(), b.text.clone()], TensorType::new(a.dtype(), shape));
        let e = call("where", &args, ty, a.lo.min(b.lo), a.hi.max(b.hi), a.exact && b.exact);
        self.emit(e)
    }

    /// `cast(a, dtype)`: to any dtype from an exact value, to a float dtype from any.
    fn cast(&mut self, s: &Step) -> E {
        let a = self.pick(s.a, |e| !e.literal).unwrap_or_else(|| self.float_operand(s.a));
        let targets: &[DType] = if a.exact { &DType::ALL } else { &[DType::F32, DType::Bf16, DType::F16] };
        let mut to = choose(targets, s.attr);
        if to == DType::F16 && a.mag() > 60_000.0 {
            to = DType::F32;
        }
        let (lo, hi) = match to {
            DType::Bool => (0.0, 1.0),
            DType::I32 => (a.lo.trunc(), a.hi.trunc()),
            _ => (a.lo, a.hi),
        };
        let e =
            call("cast", &[a.text.clone(), to.name().into()], TensorType::new(to, a.shape().to_vec()), lo, hi, a.exact);
        self.emit(e)
    }

    // ---- reductions and layout

    /// An axis of a tensor of rank `rank` (at least 1), written negative half the time.
    fn axis(rank: usize, sel: u16) -> (usize, String) {
        let a = sel as usize % rank;
        let text = if (sel as usize / rank) % 2 == 0 { format!("-{}", rank - a) } else { a.to_string() };
        (a, text)
    }

    /// `sum`, `mean`, `amax` or `amin` over one axis (keep-dims).
    fn reduce(&mut self, s: &Step) -> E {
        let a = self.pick(s.a, |e| !e.literal && !e.is_bool() && e.rank() >= 1);
        let a = a.unwrap_or_else(|| self.float_of_rank(s.a, 1));
        let (axis, text) = Gen::axis(a.rank(), s.attr2);
        let n = a.shape()[axis] as f64;
        let mut name = choose(&["sum", "mean", "amax", "amin"], s.attr);
        if name == "mean" && !a.is_float() {
            name = "sum";
        }
        let limit = if a.is_float() { MAG } else { INT_MAG * 10.0 };
        let a = if name == "sum" { self.tame(a, limit / n) } else { a };
        let (lo, hi) = if name == "sum" { (a.lo * n, a.hi * n) } else { (a.lo, a.hi) };
        let exact = a.exact && (name.starts_with("am") || !a.is_float());
        let mut shape = a.shape().to_vec();
        shape[axis] = 1;
        let e = call(name, &[a.text.clone(), text], TensorType::new(a.dtype(), shape), lo, hi, exact);
        self.emit(e)
    }

    /// `transpose(a, i, j)`, the axes possibly equal.
    fn transpose(&mut self, s: &Step) -> E {
        let a = self.pick(s.a, |e| !e.literal && e.rank() >= 1);
        let a = a.unwrap_or_else(|| self.float_of_rank(s.a, 2));
        let (i, ti) = Gen::axis(a.rank(), s.attr);
        let (j, tj) = Gen::axis(a.rank(), s.attr2);
        let mut shape = a.shape().to_vec();
        shape.swap(i, j);
        let e =
            a.derive(format!("transpose({}, {ti}, {tj})", a.text), TensorType::new(a.dtype(), shape), a.lo, a.hi, true);
        self.emit(e)
    }

    /// A random shape with `n` elements: `n`'s prime factors spread over up to 4 axes, with
    /// size-1 axes here and there.
    fn factor_shape(n: usize, sel: u16) -> Vec<usize> {
        let mut factors = vec![];
        let mut m = n;
        let mut p = 2;
        while m > 1 {
            while m % p == 0 {
                factors.push(p);
                m /= p;
            }
            p += 1;
        }
        let rank = 1 + sel as usize % 4;
        let mut shape = vec![1; rank];
        for (i, f) in factors.into_iter().enumerate() {
            let slot = (sel as usize / 4 + i * 7) % rank;
            shape[slot] *= f;
        }
        if sel & 0x8000 != 0 && n == 1 {
            return vec![];
        }
        shape
    }

    /// `reshape(a, shape)`.
    fn reshape(&mut self, s: &Step) -> E {
        let a = self.pick(s.a, |e| !e.literal).unwrap_or_else(|| self.float_operand(s.a));
        let shape = Gen::factor_shape(numel(a.shape()), s.attr);
        let text = format!("reshape({}, {})", a.text, shape_text(&shape));
        let e = a.derive(text, TensorType::new(a.dtype(), shape), a.lo, a.hi, true);
        self.emit(e)
    }

    /// `broadcast(a, shape)`: size-1 axes widened, maybe an axis added in front.
    fn broadcast(&mut self, s: &Step) -> E {
        let a = self.pick(s.a, |e| !e.literal).unwrap_or_else(|| self.float_operand(s.a));
        let mut shape = a.shape().to_vec();
        for (i, d) in shape.iter_mut().enumerate() {
            if *d == 1 && s.attr & (1 << i) != 0 {
                *d = choose(&SIZES, s.attr2.rotate_left(i as u32));
            }
        }
        if (s.attr & 0x100 != 0 || shape == a.shape()) && shape.len() < 4 {
            shape.insert(0, choose(&SIZES, s.attr2 >> 4));
        }
        if numel(&shape) > MAX_NUMEL {
            shape = a.shape().to_vec();
        }
        let text = format!("broadcast({}, {})", a.text, shape_text(&shape));
        let e = a.derive(text, TensorType::new(a.dtype(), shape), a.lo, a.hi, true);
        self.emit(e)
    }

    // ---- products and indices

    /// The right operand of `a @ _` with `n` columns: an existing value of `a`'s dtype whose
    /// batch axes broadcast with `a`'s, or a new input `[k, n]`; maybe stored transposed.
    fn matmul_rhs(&mut self, a: &E, sel: u16, n: usize) -> E {
        let (r, k, m) = (a.rank(), a.shape()[a.rank() - 1], a.shape()[a.rank() - 2]);
        let batch = a.shape()[..r - 2].to_vec();
        let ok = |e: &E| {
            e.is_float()
                && e.dtype() == a.dtype()
                && e.rank() >= 2
                && e.shape()[e.rank() - 2] == k
                && broadcast_shapes(&batch, &e.shape()[..e.rank() - 2])
                    .is_ok_and(|b| numel(&b) * m * e.shape()[e.rank() - 1] <= MAX_NUMEL)
        };
        if sel % 4 != 3 {
            if let Some(b) = self.pick(sel / 4, ok) {
                return b;
            }
        }
        if sel % 2 == 0 {
            let t = self.input(a.dtype(), vec![n, k]);
            return t.derive(
                format!("transpose({}, -1, -2)", t.text),
                TensorType::new(a.dtype(), vec![k, n]),
                t.lo,
                t.hi,
                true,
            );
        }
        self.input(a.dtype(), vec![k, n])
    }

    /// `a @ b` with operands scaled so the products stay within [-MAG, MAG].
    fn matmul_of(&self, a: E, b: E) -> E {
        let k = a.shape()[a.rank() - 1] as f64;
        let limit = (MAG / k).sqrt();
        let (a, b) = (self.tame(a, limit), self.tame(b, limit));
        let (ra, rb) = (a.rank(), b.rank());
        let mut shape = broadcast_shapes(&a.shape()[..ra - 2], &b.shape()[..rb - 2]).expect("batches broadcast");
        shape.extend([a.shape()[ra - 2], b.shape()[rb - 1]]);
        let m = a.mag() * b.mag() * k;
        binop_matmul(&a, &b, TensorType::new(a.dtype(), shape), -m, m)
    }

    fn matmul(&mut self, s: &Step) -> E {
        let a = self.float_of_rank(s.a, 2);
        let rows = numel(a.shape()) / a.shape()[a.rank() - 1];
        let n = choose(&SIZES, s.attr).min((MAX_NUMEL / rows.max(1)).max(1));
        let b = self.matmul_rhs(&a, s.b, n);
        let e = self.matmul_of(a, b);
        self.emit(e)
    }

    /// `iota(n)`, as a row or a column.
    fn iota(&mut self, s: &Step) -> E {
        let n = choose(&self.frame.clone(), s.attr).max(choose(&SIZES, s.attr2));
        let ty = TensorType::new(DType::I32, vec![n]);
        let e = call("iota", &[n.to_string()], ty, 0.0, (n - 1) as f64, true);
        if s.attr % 2 == 0 {
            return self.emit(e);
        }
        let col = TensorType::new(DType::I32, vec![n, 1]);
        let text = format!("reshape({}, [{n}, 1])", e.text);
        let e = e.derive(text, col, e.lo, e.hi, true);
        self.emit(e)
    }

    /// A causal mask over the last two axes: `where(row >= col, a, -8)`.
    fn mask(&mut self, s: &Step) -> E {
        let a = self.float_of_rank(s.a, 2);
        let (r, c) = (a.shape()[a.rank() - 2], a.shape()[a.rank() - 1]);
        let cond = format!("reshape(iota({r}), [{r}, 1]) >= iota({c})");
        let e =
            call("where", &[cond, a.text.clone(), "-8".into()], a.ty.clone(), a.lo.min(-8.0), a.hi.max(-8.0), false);
        self.emit(e)
    }

    /// An i32 value of rank at most 2, or a new input.
    fn indices(&mut self, sel: u16, max_numel: usize) -> E {
        if let Some(t) = self.pick(sel, |e| e.is_int() && e.rank() <= 2 && numel(e.shape()) <= max_numel) {
            return t;
        }
        let mut shape = self.frame_shape(sel);
        while numel(&shape) > max_numel || shape.len() > 2 {
            shape.remove(0);
        }
        self.input(DType::I32, shape)
    }

    /// `onehot(t, n)`.
    fn onehot(&mut self, s: &Step) -> E {
        let n = choose(&SIZES, s.attr).max(2);
        let t = self.indices(s.a, MAX_NUMEL / n);
        let mut shape = t.shape().to_vec();
        shape.push(n);
        let e = call("onehot", &[t.text.clone(), n.to_string()], TensorType::new(DType::F32, shape), 0.0, 1.0, true);
        self.emit(e)
    }

    fn dropout(&mut self, s: &Step) -> E {
        let a = self.float_operand(s.a);
        let p = choose(&[0.1, 0.5, 0.0, 0.25], s.attr);
        let a = self.tame(a, MAG * (1.0 - p));
        let scale = 1.0 / (1.0 - p);
        let args = [a.text.clone(), p.to_string(), s.attr2.to_string()];
        let e = call("dropout", &args, a.ty.clone(), (a.lo * scale).min(0.0), (a.hi * scale).max(0.0), false);
        self.emit(e)
    }

    // ---- composites, written directly

    /// `softmax(a, axis)` or `log_softmax(a, axis)`.
    fn softmax(&mut self, s: &Step) -> E {
        let a = self.float_of_rank(s.a, 1);
        let (axis, text) = Gen::axis(a.rank(), s.attr2);
        let args = [a.text.clone(), text];
        let e = if s.attr % 2 == 0 {
            call("softmax", &args, a.ty.clone(), 0.0, 1.0, false)
        } else {
            let lo = a.lo - a.hi - (a.shape()[axis] as f64).ln();
            call("log_softmax", &args, a.ty.clone(), lo, 0.0, false)
        };
        self.emit(e)
    }

    /// A parameter of a norm over `x`: its dtype, a shape that broadcasts to `x`'s.
    fn param(&mut self, x: &E, sel: u16) -> E {
        let ok = |e: &E| {
            e.is_float()
                && e.dtype() == x.dtype()
                && broadcast_shapes(x.shape(), e.shape()).ok().as_deref() == Some(x.shape())
        };
        if sel % 4 != 0 {
            if let Some(p) = self.pick(sel / 4, ok) {
                return p;
            }
        }
        let keep = if sel % 3 == 0 { (sel as usize / 3) % (x.rank() + 1) } else { 1 };
        let mut shape = x.shape()[x.rank() - keep..].to_vec();
        for (i, d) in shape.iter_mut().enumerate() {
            if sel & (0x400 << i) != 0 {
                *d = 1;
            }
        }
        self.input(x.dtype(), shape)
    }

    /// A norm's epsilon.
    fn eps(sel: u16) -> &'static str {
        choose(&["1e-5", "1e-6", "0.001", "0.1"], sel)
    }

    /// `layernorm(x, g, b, eps)` or `rmsnorm(x, g, eps)` over the last axis.
    fn norm(&mut self, s: &Step) -> E {
        let x = self.float_of_rank(s.a, 1);
        let g = self.param(&x, s.b);
        let c = (x.shape()[x.rank() - 1] as f64).sqrt();
        let e = if s.attr % 2 == 0 {
            let b = self.param(&x, s.c);
            let m = c * g.mag() + b.mag();
            call(
                "layernorm",
                &[x.text.clone(), g.text.clone(), b.text.clone(), Gen::eps(s.attr2).into()],
                x.ty.clone(),
                -m,
                m,
                false,
            )
        } else {
            let m = c * g.mag();
            call("rmsnorm", &[x.text.clone(), g.text.clone(), Gen::eps(s.attr2).into()], x.ty.clone(), -m, m, false)
        };
        self.emit(e)
    }

    /// Targets for logits `x`: a new i32 input of `x`'s shape without its last axis (seeded
    /// inputs of cross-entropy targets are drawn in range).
    fn targets(&mut self, x: &E) -> E {
        self.input(DType::I32, x.shape()[..x.rank() - 1].to_vec())
    }

    fn cross_entropy(&mut self, s: &Step) -> E {
        let x = self.float_of_rank(s.a, 1);
        let t = self.targets(&x);
        let v = x.shape()[x.rank() - 1] as f64;
        let hi = x.hi - x.lo + v.ln();
        let e = call("cross_entropy", &[x.text.clone(), t.text.clone()], TensorType::scalar(x.dtype()), 0.0, hi, false);
        self.emit(e)
    }

    /// Queries, keys and values for attention: `q` of rank at least 2, `k` and `v` with its
    /// batch axes (existing values when they fit, else new inputs), scaled so that scores stay
    /// within [-8, 8].
    fn qkv(&mut self, s: &Step) -> (E, E, E, f64) {
        let q = self.float_of_rank(s.a, 2);
        let r = q.rank();
        let (batch, d) = (q.shape()[..r - 2].to_vec(), q.shape()[r - 1]);
        let t = choose(&SIZES, s.attr2).min(MAX_NUMEL / (numel(&batch) * d.max(4)).max(1)).max(1);
        let dv = choose(&SIZES, s.attr2 >> 4).min(4);
        let kt = |e: &E| e.is_float() && e.dtype() == q.dtype() && e.rank() == r && e.shape()[..r - 2] == batch[..];
        let k = self.pick(s.b, |e| kt(e) && e.shape()[r - 1] == d);
        let k = k.unwrap_or_else(|| self.input(q.dtype(), [batch.clone(), vec![t, d]].concat()));
        let t = k.shape()[r - 2];
        let v = self.pick(s.c, |e| kt(e) && e.shape()[r - 2] == t);
        let v = v.unwrap_or_else(|| self.input(q.dtype(), [batch.clone(), vec![t, dv]].concat()));
        let scale = choose(&[0.125, 0.5, 1.0 / (d as f64).sqrt(), 0.25], s.attr);
        let limit = (8.0 / (scale * d as f64)).sqrt();
        let (q, k) = (self.tame(q, limit), self.tame(k, limit));
        (self.named(q), self.named(k), v, scale)
    }

    fn attention(&mut self, s: &Step) -> E {
        let (q, k, v, scale) = self.qkv(s);
        let causal = (s.attr / 4 % 2).to_string();
        let mut shape = q.shape().to_vec();
        *shape.last_mut().expect("rank 2 or more") = v.shape()[v.rank() - 1];
        let args = [q.text.clone(), k.text.clone(), v.text.clone(), scale.to_string(), causal];
        let e = call("attention", &args, TensorType::new(q.dtype(), shape), -v.mag(), v.mag(), false);
        self.emit(e)
    }

    // ---- integers and bools

    /// An i32 value: an existing one, a cast of an exact float, or a new input.
    fn int_operand(&mut self, sel: u16) -> E {
        if let Some(e) = self.pick(sel, |e| e.is_int()) {
            return e;
        }
        if let Some(f) = self.pick(sel, |e| e.is_float() && e.exact) {
            let (lo, hi) = (f.lo.trunc(), f.hi.trunc());
            return self.emit(call(
                "cast",
                &[f.text.clone(), "i32".into()],
                TensorType::new(DType::I32, f.shape().to_vec()),
                lo,
                hi,
                true,
            ));
        }
        self.input(DType::I32, self.frame_shape(sel))
    }

    /// Integer arithmetic: `+ - *`, `max`, `min`, truncating `/`, `neg`, `abs`, `square`,
    /// and weak fractional literals (which round after each op, so no rule may reassociate).
    fn int_arith(&mut self, s: &Step) -> E {
        let a = self.int_operand(s.a);
        let a = self.tame(a, INT_MAG.sqrt());
        let lits = ["2", "3", "-1", "0.5", "7"];
        let e = match s.attr % 6 {
            k @ 0..=2 => {
                let b = self.partner(&a, s.b, |_| true, &lits);
                let b = if b.literal { b } else { self.tame(b, INT_MAG.sqrt()) };
                let mut e = self.arith_of(a.clone(), ["+", "-", "*"][k as usize], b, INT_MAG);
                e.exact = true;
                e
            }
            3 => {
                let b = self.partner(&a, s.b, |_| true, &lits);
                let b = if b.literal { b } else { self.positive(b, 0) };
                let (lo, hi) = (-a.mag(), a.mag());
                binop(&a, "/", &b, lo, hi, true)
            }
            4 => {
                let mut e = self.apply(choose(&["neg", "abs", "square"], s.attr2), &a);
                e.exact = true;
                e
            }
            _ => {
                let b = self.partner(&a, s.b, |_| true, &lits);
                let name = choose(&["max", "min"], s.attr2);
                let shape = broadcast_shapes(a.shape(), b.shape()).expect("partners broadcast");
                let (lo, hi) = (a.lo.min(b.lo), a.hi.max(b.hi));
                call(name, &[a.text.clone(), b.text.clone()], TensorType::new(DType::I32, shape), lo, hi, true)
            }
        };
        self.emit(e)
    }

    /// `not(c)`, `c == d`, `c != d` or `where(c, d, e)` on bools.
    fn bool_op(&mut self, s: &Step) -> E {
        let frame = self.frame_shape(s.a);
        let c = self.condition(&frame, s.a, s.attr2);
        let c = self.named(c);
        let e = match s.attr % 3 {
            0 => call("not", &[c.text.clone()], c.ty.clone(), 0.0, 1.0, true),
            1 => self.compare_of(&c, s.b, 4 + s.attr2 % 2),
            _ => {
                let d = self.condition(c.shape(), s.b, s.attr2 / 2);
                let shape = broadcast_shapes(c.shape(), d.shape()).expect("conditions fit");
                let args = [c.text.clone(), d.text.clone(), "0".into()];
                call("where", &args, TensorType::new(DType::Bool, shape), 0.0, 1.0, true)
            }
        };
        self.emit(e)
    }

    // ---- decomposed patterns (what the `patterns` rules recognise)

    fn pattern(&mut self, s: &Step) -> E {
        match s.attr % 13 {
            0 => self.softmax_parts(s),
            1 => self.softmax_unshifted(s),
            2 => self.log_softmax_parts(s),
            3 => self.layernorm_parts(s),
            4 => self.rmsnorm_parts(s),
            5 => self.gelu_parts(s),
            6 => self.gelu_tanh_parts(s),
            7 => self.sigmoid_parts(s),
            8 => self.silu_parts(s),
            9 => self.attention_parts(s),
            10 => self.cross_entropy_parts(s),
            11 => self.dense(s),
            _ => self.residual_norm(s),
        }
    }

    /// A float value of rank at least 1 and an axis of it.
    fn with_axis(&mut self, s: &Step) -> (E, usize, String) {
        let x = self.float_of_rank(s.a, 1);
        let (axis, text) = Gen::axis(x.rank(), s.attr2);
        (x, axis, text)
    }

    /// `m = amax(x, a); e = exp(x - m); y = e / sum(e, a)`.
    fn softmax_parts(&mut self, s: &Step) -> E {
        let (x, _, a) = self.with_axis(s);
        let m = self.bind(x.derive(format!("amax({}, {a})", x.text), reduced(&x, &a), x.lo, x.hi, true));
        let e = x.derive(format!("exp({} - {})", x.text, m.text), x.ty.clone(), (x.lo - x.hi).exp(), 1.0, false);
        let e = self.bind(e.with_exact(false));
        self.emit(e.derive(format!("{} / sum({}, {a})", e.text, e.text), x.ty.clone(), 0.0, 1.0, false))
    }

    /// `e = exp(x); y = e / sum(e, a)` (x within [-4, 4]).
    fn softmax_unshifted(&mut self, s: &Step) -> E {
        let (x, _, a) = self.with_axis(s);
        let x = self.tame(x, 4.0);
        let e = self.apply("exp", &x);
        let e = self.bind(e);
        self.emit(e.derive(format!("{} / sum({}, {a})", e.text, e.text), e.ty.clone(), 0.0, 1.0, false))
    }

    /// `y = x - amax(x, a) - log(sum(exp(x - amax(x, a)), a))`, or x minus its logsumexp.
    fn log_softmax_parts(&mut self, s: &Step) -> E {
        let (x, axis, a) = self.with_axis(s);
        let x = self.tame(x, MAG / 2.0);
        let lo = x.lo - x.hi - (x.shape()[axis] as f64).ln();
        let t = &x.text;
        let text = if s.attr2 % 3 == 0 {
            format!("{t} - (amax({t}, {a}) + log(sum(exp({t} - amax({t}, {a})), {a})))")
        } else {
            format!("{t} - amax({t}, {a}) - log(sum(exp({t} - amax({t}, {a})), {a}))")
        };
        self.emit(x.derive(text, x.ty.clone(), lo, 0.0, false).with_exact(false))
    }

    /// `mu = mean(x, -1); xc = x - mu; var = mean(xc * xc, -1);
    /// y = xc * rsqrt(var + eps) * g + b` (or `xc / sqrt(var + eps)`).
    fn layernorm_parts(&mut self, s: &Step) -> E {
        let x = self.float_of_rank(s.a, 1);
        let x = self.tame(x, MAG / 2.0);
        let x = self.named(x);
        let (g, b) = (self.param(&x, s.b), self.param(&x, s.c));
        let last = if s.attr2 % 2 == 0 { "-1".to_string() } else { (x.rank() - 1).to_string() };
        let mu = x.derive(format!("mean({}, {last})", x.text), reduced(&x, &last), x.lo, x.hi, false);
        let mu = self.bind(mu.with_exact(false));
        let xc = x.derive(format!("{} - {}", x.text, mu.text), x.ty.clone(), x.lo - x.hi, x.hi - x.lo, false);
        let xc = self.bind(xc.with_exact(false));
        let v = (x.hi - x.lo).powi(2);
        let var =
            self.bind(xc.derive(format!("mean({} * {}, {last})", xc.text, xc.text), reduced(&x, &last), 0.0, v, false));
        let eps = Gen::eps(s.attr2 / 2);
        let norm = if s.attr2 % 4 < 2 {
            format!("{} * rsqrt({} + {eps})", xc.text, var.text)
        } else {
            format!("{} / sqrt({} + {eps})", xc.text, var.text)
        };
        let m = (x.shape()[x.rank() - 1] as f64).sqrt() * g.mag() + b.mag();
        self.emit(x.derive(format!("{norm} * {} + {}", g.text, b.text), x.ty.clone(), -m, m, false))
    }

    /// `y = x * rsqrt(mean(x * x, -1) + eps) * g` (or with `square(x)`).
    fn rmsnorm_parts(&mut self, s: &Step) -> E {
        let x = self.float_of_rank(s.a, 1);
        let x = self.tame(x, MAG.sqrt());
        let x = self.named(x);
        let g = self.param(&x, s.b);
        let t = &x.text;
        let sq = if s.attr2 % 2 == 0 { format!("{t} * {t}") } else { format!("square({t})") };
        let eps = Gen::eps(s.attr2 / 2);
        let m = (x.shape()[x.rank() - 1] as f64).sqrt() * g.mag();
        let text = format!("{t} * rsqrt(mean({sq}, -1) + {eps}) * {}", g.text);
        self.emit(x.derive(text, x.ty.clone(), -m, m, false).with_exact(false))
    }

    /// `0.5 * x * (1 + erf(x * 0.7071067811865476))` (or `/ 1.4142135623730951`, `/ sqrt(2)`).
    fn gelu_parts(&mut self, s: &Step) -> E {
        let x = self.float_operand(s.a);
        let t = &x.text;
        let arg = match s.attr2 % 3 {
            0 => format!("{t} * 0.7071067811865476"),
            1 => format!("{t} / 1.4142135623730951"),
            _ => format!("{t} / sqrt(2)"),
        };
        let text = format!("0.5 * {t} * (1 + erf({arg}))");
        self.emit(x.derive(text, x.ty.clone(), -0.3, x.hi.max(0.0), false).with_exact(false))
    }

    /// `0.5 * x * (1 + tanh(0.7978845608028654 * (x + 0.044715 * (x * x * x))))` (or `x ^ 3`).
    fn gelu_tanh_parts(&mut self, s: &Step) -> E {
        let x = self.float_operand(s.a);
        let x = self.tame(x, 3.9);
        let x = self.named(x);
        let t = &x.text;
        let cube = if s.attr2 % 2 == 0 { format!("({t} * {t} * {t})") } else { format!("{t} ^ 3") };
        let text = format!("0.5 * {t} * (1 + tanh(0.7978845608028654 * ({t} + 0.044715 * {cube})))");
        self.emit(x.derive(text, x.ty.clone(), -0.3, x.hi.max(0.0), false).with_exact(false))
    }

    /// `1 / (1 + exp(-x))` or `recip(1 + exp(-x))`.
    fn sigmoid_parts(&mut self, s: &Step) -> E {
        let x = self.float_operand(s.a);
        let x = self.tame(x, 4.0);
        let x = self.named(x);
        let inner = format!("1 + exp(-{})", x.text);
        let text = if s.attr2 % 2 == 0 { format!("1 / ({inner})") } else { format!("recip({inner})") };
        self.emit(x.derive(text, x.ty.clone(), 0.0, 1.0, false).with_exact(false))
    }

    /// `x * sigmoid(x)` or `x / (1 + exp(-x))`.
    fn silu_parts(&mut self, s: &Step) -> E {
        let x = self.float_operand(s.a);
        let x = self.tame(x, 4.0);
        let x = self.named(x);
        let t = &x.text;
        let text = if s.attr2 % 2 == 0 { format!("{t} * sigmoid({t})") } else { format!("{t} / (1 + exp(-{t}))") };
        self.emit(x.derive(text, x.ty.clone(), -0.3, x.hi.max(0.0), false).with_exact(false))
    }

    /// `s = q @ transpose(k, -1, -2) * scale; p = softmax(s, -1); y = p @ v` (or `/ d`).
    fn attention_parts(&mut self, s: &Step) -> E {
        let (q, k, v, scale) = self.qkv(s);
        let r = q.rank();
        let mut st = q.ty.clone();
        st.shape[r - 1] = k.shape()[r - 2];
        let scores = if s.attr2 % 2 == 0 {
            format!("{} @ transpose({}, -1, -2) * {scale}", q.text, k.text)
        } else {
            format!("{} @ transpose({}, -1, -2) / {}", q.text, k.text, 1.0 / scale)
        };
        let sc = self.bind(q.derive(scores, st.clone(), -8.0, 8.0, false).with_exact(false));
        let p = self.bind(sc.derive(format!("softmax({}, -1)", sc.text), st, 0.0, 1.0, false));
        let mut yt = q.ty.clone();
        yt.shape[r - 1] = v.shape()[r - 1];
        self.emit(p.derive(format!("{} @ {}", p.text, v.text), yt, -v.mag(), v.mag(), false))
    }

    /// `mean(-sum(onehot(t, V) * log_softmax(x, -1), -1), 0)` over logits `[N, V]`, maybe
    /// reshaped to a scalar.
    fn cross_entropy_parts(&mut self, s: &Step) -> E {
        let x = match self.pick(s.a, |e| e.is_float() && e.rank() == 2) {
            Some(x) => x,
            None => self.input(self.float, vec![choose(&SIZES, s.attr2), choose(&SIZES, s.b).max(2)]),
        };
        let t = self.targets(&x);
        let v = x.shape()[1];
        let hi = x.hi - x.lo + (v as f64).ln();
        let onehot = match x.dtype() {
            DType::F32 => format!("onehot({}, {v})", t.text),
            d => format!("cast(onehot({}, {v}), {d})", t.text),
        };
        let inner = format!("mean(-sum({onehot} * log_softmax({}, -1), -1), 0)", x.text);
        let e = if s.attr2 % 2 == 0 {
            x.derive(inner, TensorType::new(x.dtype(), vec![1, 1]), 0.0, hi, false)
        } else {
            x.derive(format!("reshape({inner}, [])"), TensorType::scalar(x.dtype()), 0.0, hi, false)
        };
        self.emit(e.with_exact(false))
    }

    /// `act(x @ w + b)`.
    fn dense(&mut self, s: &Step) -> E {
        let x = self.float_of_rank(s.a, 2);
        let rows = numel(x.shape()) / x.shape()[x.rank() - 1];
        let n = choose(&SIZES, s.attr2).min((MAX_NUMEL / rows.max(1)).max(1));
        let w = self.matmul_rhs(&x, s.b, n);
        let y = self.matmul_of(x, w);
        let bias = self.input(y.dtype(), vec![y.shape()[y.rank() - 1]]);
        let y = self.bind(binop(&y, "+", &bias, y.lo - 7.0, y.hi + 7.0, false));
        let act = choose(&["relu", "gelu", "tanh", "silu"], s.attr2 / 2);
        let e = self.apply(act, &y);
        self.emit(e)
    }

    /// `h = x + r; y = layernorm(h, g, b, eps)`, both written (a residual and its norm).
    fn residual_norm(&mut self, s: &Step) -> E {
        let x = self.float_of_rank(s.a, 1);
        let r = self.partner(&x, s.b | 0x7, |_| true, &[]);
        let h = self.arith_of(x, "+", r, MAG);
        let h = self.emit(h);
        let (g, b) = (self.param(&h, s.c), self.param(&h, s.c / 3));
        let m = (h.shape()[h.rank() - 1] as f64).sqrt() * g.mag() + b.mag();
        let args = [h.text.clone(), g.text.clone(), b.text.clone(), Gen::eps(s.attr2).into()];
        let e = call("layernorm", &args, h.ty.clone(), -m, m, false);
        let y = self.emit(e);
        self.outputs.insert(h.text);
        y
    }
}

/// `a @ b` of the given type and interval.
fn binop_matmul(a: &E, b: &E, ty: TensorType, lo: f64, hi: f64) -> E {
    E { text: format!("{} @ {}", a.operand(), b.operand()), ty, lo, hi, exact: false, atomic: false, literal: false }
}

/// The type of `x` reduced (keep-dims) along the axis written `axis`.
fn reduced(x: &E, axis: &str) -> TensorType {
    let a: i64 = axis.parse().expect("axis texts are integers");
    let r = x.rank() as i64;
    let a = if a < 0 { a + r } else { a } as usize;
    let mut shape = x.shape().to_vec();
    shape[a] = 1;
    TensorType::new(x.dtype(), shape)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeded_recipes_are_reproducible() {
        assert_eq!(random_recipe(7, 10), random_recipe(7, 10));
        assert_ne!(random_recipe(7, 10).render(), random_recipe(8, 10).render());
    }

    /// Every operator of the language but `grad` appears in a few hundred random programs, and
    /// every program parses.
    #[test]
    fn random_programs_parse_and_use_every_operator() {
        let mut seen = BTreeSet::new();
        for seed in 0..400 {
            let text = random_recipe(seed, 8).render();
            let p = crate::parse::parse_program("g.eqf", &text, &[]).unwrap_or_else(|e| panic!("{e}\n{text}"));
            seen.extend(p.expr().as_ref().iter().filter_map(|n| n.opcode()).map(|c| c.name()));
        }
        let missing: Vec<&str> =
            crate::lang::OPS.iter().map(|o| o.name).filter(|n| *n != "grad" && !seen.contains(n)).collect();
        assert!(missing.is_empty(), "never generated: {missing:?}");
    }

    #[test]
    fn the_simplest_recipe_is_a_sum() {
        let r = Recipe {
            frame: vec![0],
            dtype: 0,
            input_seed: 0,
            steps: vec![Step { op: 0, a: 0, b: 0, c: 0, attr: 0, attr2: 0, output: false }],
        };
        assert_eq!(r.render(), "input x0: f32[2]\nt0 = x0 + x0\noutput t0\n");
    }
}
