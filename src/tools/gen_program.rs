//! Random well-typed `.eqf` programs for differential testing.
//!
//! A [`Recipe`] is a list of random choices; [`Recipe::render`] interprets it as `.eqf` text,
//! one statement per step (a step that writes a decomposed pattern, such as a layernorm written
//! out, adds a few). Every field of a [`Step`] is read modulo what is available at that point,
//! so *any* recipe renders to a program: proptest shrinks a failing recipe (drops steps, moves
//! numbers towards 0) and the smaller recipe is still a program, only simpler (op 0 is `+`,
//! operand 0 is the newest value). [`recipes`] is the proptest strategy; [`random_recipe`]
//! draws one from a seed without a test runner (for the GPU differential run).
//! [`Recipe::render`] renders at [`Scale::SMALL`] (the differential tests' sizes; its output
//! must not change, for the saved cases' sake); [`Recipe::render_at`] with [`Scale::LARGE`]
//! renders the same choices at the sizes models run at (`examples/gen_programs.rs`).
//!
//! This file holds the recipe, the interpreter's state (picking operands, declaring inputs,
//! binding names, keeping values in bounds) and the table of operations; `values.rs` the values
//! and their intervals, `ops.rs` the primitive operations, `patterns.rs` the composites and the
//! decomposed forms the pattern rules recognise.
//!
//! The programs cover every operator of the language: pointwise unary and binary ops,
//! comparisons and `where`, casts among all dtypes, reductions over any axis, layout views,
//! matrix products with batch broadcasting, `iota`, `onehot`, `dropout`, every composite, the
//! decomposed forms the pattern rules recognise, and (in a quarter of the small programs whose
//! floats are all f32) a loss with `grad`s of it, which the front end turns into the backward
//! graph.
//! Shapes mix size 1 and odd sizes with NumPy broadcasting; values are shared by several
//! consumers; every value no statement uses is an output (unless its step makes it dead code),
//! some used ones are outputs too, and a statement may only rename a value (an input or
//! another name of an output).
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

use crate::ir::types::{DType, TensorType};

use values::{call, fits, numel, unary_interval, E};

mod ops;
mod patterns;
mod values;

/// Axis sizes, small first so that shrinking makes shapes small; 1 and odd sizes included.
const SIZES: [usize; 12] = [2, 3, 1, 4, 5, 7, 1, 8, 6, 16, 13, 32];
/// Largest tensor a program holds, in elements (keeps the reference fast in debug builds).
const MAX_NUMEL: usize = 512;
/// Axis sizes of the large programs (`Scale::LARGE`): sizes people use (hidden sizes, head
/// sizes, vocabularies, image and point-cloud axes, batches), odd ones and 1 included.
const LARGE_SIZES: [usize; 24] =
    [64, 1024, 1, 768, 3, 4096, 127, 2048, 1000, 50257, 8, 512, 16, 3072, 197, 32, 256, 8192, 13, 128, 4, 16384, 96, 2];
/// Leading axes a large program's usual input shape gets until it holds `Scale::min_frame`
/// elements (batches, sequence lengths).
const LARGE_BATCHES: [usize; 10] = [8, 16, 32, 64, 128, 512, 1024, 2048, 4096, 8192];
/// Float values stay within [-MAG, MAG].
const MAG: f64 = 64.0;
/// Integer values stay within [-INT_MAG, INT_MAG].
const INT_MAG: f64 = 10_000.0;

/// The sizes a recipe is rendered at: the small programs of the differential tests
/// ([`Scale::SMALL`], what [`Recipe::render`] gives), or programs at the sizes models run at
/// ([`Scale::LARGE`], for measuring the cost model on the GPU: `examples/gen_programs.rs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Scale {
    /// Axis sizes, drawn from by index.
    sizes: &'static [usize],
    /// Largest tensor a program holds, in elements.
    max_numel: usize,
    /// Least elements of the usual input shape (0: as drawn).
    min_frame: usize,
    /// Most elements of the usual input shape.
    max_frame: usize,
    /// Most multiply-adds of one matrix product or attention (keeps the CPU reference fast).
    max_macs: usize,
}

impl Scale {
    /// The differential tests' programs: sizes up to 32, at most 512 elements a tensor.
    pub const SMALL: Scale =
        Scale { sizes: &SIZES, max_numel: MAX_NUMEL, min_frame: 0, max_frame: MAX_NUMEL, max_macs: usize::MAX };
    /// Programs at the sizes models run at: the usual input shape holds 2^22 to 2^24
    /// elements, no tensor more than 2^26, no product or attention more than 2^29
    /// multiply-adds (the CPU reference checks every GPU run).
    pub const LARGE: Scale =
        Scale { sizes: &LARGE_SIZES, max_numel: 1 << 26, min_frame: 1 << 22, max_frame: 1 << 24, max_macs: 1 << 29 };

    fn large(&self) -> bool {
        *self != Scale::SMALL
    }
}

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
    /// Whether the step's value is an output even if later steps use it (or, with `attr2` at
    /// 0xf000 or more, dead code: not an output even if no later step uses it).
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
    /// Whether the program ends with a loss and gradients of it (1 in 4; only small programs
    /// whose floats are all f32 get them), and which inputs they are with respect to.
    pub grads: u8,
}

fn step() -> impl Strategy<Value = Step> {
    (any::<u16>(), any::<u16>(), any::<u16>(), any::<u16>(), any::<u16>(), any::<u16>(), prop::bool::weighted(0.15))
        .prop_map(|(op, a, b, c, attr, attr2, output)| Step { op, a, b, c, attr, attr2, output })
}

/// Recipes of 1 to `max_steps` steps.
pub fn recipes(max_steps: usize) -> impl Strategy<Value = Recipe> {
    let frame = prop::collection::vec(0..SIZES.len() as u8, 1..=3);
    let steps = prop::collection::vec(step(), 1..=max_steps.max(1));
    (frame, any::<u8>(), any::<u16>(), steps, any::<u8>()).prop_map(|(frame, dtype, seed, steps, grads)| Recipe {
        frame,
        dtype,
        input_seed: seed as u64,
        steps,
        grads,
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
        self.render_at(Scale::SMALL)
    }

    /// The program at another scale (the same choices, other sizes).
    pub fn render_at(&self, scale: Scale) -> String {
        let mut g = Gen::new(self, scale);
        for s in &self.steps {
            let v = g.step(s);
            match (s.output, s.attr2 >= 0xf000) {
                (true, false) => g.outputs.insert(v.text),
                (true, true) => g.dead.insert(v.text),
                _ => false,
            };
        }
        if self.grads % 4 == 1 {
            g.gradients(self.grads / 3);
        }
        g.finish()
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
    Logic,
    Alias,
    Pattern,
    Slice,
    Concat,
    Gather,
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
    (Op::Logic, 1),
    (Op::Alias, 1),
    (Op::Pattern, 10),
];

/// Steps whose selector is at least this draw an indexing operator (`slice`, `concat`,
/// `gather`; issue 20) instead of one of [`TABLE`]: 1 step in 64, chosen outside the table so
/// that the programs of the other steps stay as they were.
const INDEXING_FROM: u16 = 0xfc00;

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
    scale: Scale,
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
    /// Values marked as dead code by their step.
    dead: BTreeSet<String>,
}

impl Gen {
    fn new(r: &Recipe, scale: Scale) -> Gen {
        let sizes = scale.sizes;
        // The recipe's indices reach the first 12 sizes; a large program's input seed moves
        // each into the rest of its table.
        let shift = |j: usize| if scale.large() { 12 * (r.input_seed as usize >> j & 1) } else { 0 };
        let mut frame: Vec<usize> =
            r.frame.iter().enumerate().map(|(j, &i)| sizes[(i as usize + shift(j)) % sizes.len()]).collect();
        while numel(&frame) > scale.max_frame {
            frame.remove(0);
        }
        if frame.is_empty() {
            frame.push(sizes[0]);
        }
        // Large programs: leading (batch) axes until the shape holds `min_frame` elements, the
        // largest batch that keeps it within `max_frame`.
        let mut k = r.input_seed as usize >> 3;
        while numel(&frame) < scale.min_frame {
            // At least 4, since the shape holds fewer than `min_frame` = `max_frame` / 4.
            let room = scale.max_frame / numel(&frame);
            let fit: Vec<usize> = LARGE_BATCHES.iter().copied().filter(|&b| b <= room).collect();
            if frame.len() == 4 || fit.is_empty() {
                frame[0] *= room;
            } else {
                frame.insert(0, fit[fit.len().saturating_sub(3) + k % fit.len().min(3)]);
                k /= 3;
            }
        }
        let float = choose(&[DType::F32, DType::F32, DType::F32, DType::Bf16, DType::F32, DType::F16], r.dtype as u16);
        Gen {
            scale,
            frame,
            float,
            pool: vec![],
            inputs: vec![],
            lines: vec![],
            outputs: BTreeSet::new(),
            dead: BTreeSet::new(),
        }
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
        let last = self.lines.last().map(|(n, _)| n.as_str());
        for (name, expr) in &self.lines {
            text += &format!("{name} = {expr}\n");
            let dead = self.dead.contains(name) && Some(name.as_str()) != last;
            if (!read.contains(name.as_str()) && !dead) || self.outputs.contains(name) {
                outs.push(name.as_str());
            }
        }
        text += &format!("output {}\n", outs.join(", "));
        text
    }

    fn step(&mut self, s: &Step) -> E {
        let op = if s.op >= INDEXING_FROM { choose(&[Op::Slice, Op::Concat, Op::Gather], s.op) } else { op_of(s.op) };
        match op {
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
            Op::Logic => self.bool_op(s),
            Op::Alias => self.alias(s),
            Op::Pattern => self.pattern(s),
            Op::Slice => self.slice(s),
            Op::Concat => self.concat(s),
            Op::Gather => self.gather(s),
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
            if sel & (0x100 << i) != 0 && sel.is_multiple_of(3) {
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
            shape.insert(0, choose(self.scale.sizes, sel));
        }
        while numel(&shape) > self.scale.max_numel {
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
                *d = choose(self.scale.sizes, sel.rotate_left(i as u32));
            } else if bit {
                *d = 1;
            }
        }
        if sel & 0x8 != 0 && out.len() < 4 {
            out.insert(0, choose(self.scale.sizes, sel >> 3));
        }
        if fits(shape, &out, self.scale.max_numel) {
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
            let max = self.scale.max_numel;
            let fit = |e: &E| !e.literal && e.dtype() == dtype && fits(a.shape(), e.shape(), max) && ok(e);
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
        call(name, std::slice::from_ref(&e.text), e.ty.clone(), lo, hi, exact)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOLDEN: u64 = 0x1aa4_a12d_0e3e_cf03;

    #[test]
    fn seeded_recipes_are_reproducible() {
        assert_eq!(random_recipe(7, 10), random_recipe(7, 10));
        assert_ne!(random_recipe(7, 10).render(), random_recipe(8, 10).render());
    }

    /// Every operator of the language but `grad` and attention's backward composites (which
    /// the autodiff pass emits for bf16 and f16 attention, while generated gradients are f32)
    /// appears in a few hundred random programs, and every program parses.
    #[test]
    fn random_programs_parse_and_use_every_operator() {
        let mut seen = BTreeSet::new();
        for seed in 0..400 {
            let text = random_recipe(seed, 6).render();
            let p =
                crate::frontend::parse::parse_program("g.eqf", &text, &[]).unwrap_or_else(|e| panic!("{e}\n{text}"));
            seen.extend(p.expr().as_ref().iter().filter_map(|n| n.opcode()).map(|c| c.name()));
        }
        let missing: Vec<&str> =
            crate::ir::lang::OPS.iter().map(|o| o.name).filter(|n| *n != "grad" && !seen.contains(n)).collect();
        let missing: Vec<&str> = missing
            .into_iter()
            .filter(|n| !(n.starts_with("attention_") && (n.ends_with("_lse") || n.contains("_grad_"))))
            .collect();
        // Not drawn as a step: scatter_add, which comes from the gradients of the gathers drawn,
        // and attention_bias and the dropout forms of attention (drawing them would change the
        // programs of every seed that draws attention, which `small_programs_render_as_before`
        // forbids; tests/respell.rs, tests/attention_dropout.rs, the rules' soundness check and
        // tests/gpu.rs check them). Nor the rounding functions, for the same reason (the
        // exporter's `floor`, `round`, `//` and `%`; tests/values.rs checks them on the
        // reference and compiles their kernels).
        let not_drawn = [
            "scatter_add",
            "attention_bias",
            "attention_dropout",
            "attention_bias_dropout",
            "floor",
            "ceil",
            "round",
            "trunc",
        ];
        let missing: Vec<&str> = missing.into_iter().filter(|n| !not_drawn.contains(n)).collect();
        assert!(missing.is_empty(), "never generated: {missing:?}");
    }

    /// The small programs are what the differential tests and their saved cases were found
    /// with: their text must not change when the generator grows (the large mode draws its
    /// own sizes). An FNV-1a hash of 600 rendered recipes, as of commit 18a312f.
    #[test]
    fn small_programs_render_as_before() {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for seed in 0..300 {
            for steps in [6, 12] {
                for b in random_recipe(seed, steps).render().bytes() {
                    h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
                }
            }
        }
        assert_eq!(h, GOLDEN, "small-mode renders changed: {h:#x}");
    }

    /// Large programs parse, their usual input shape holds 2^22 to 2^24 elements (so that their
    /// plans take tens of microseconds on a GPU), no value is larger than `max_numel`, and no
    /// product has more than `max_macs` multiply-adds.
    #[test]
    fn large_programs_parse_and_keep_their_bounds() {
        use egg::Language;
        let s = Scale::LARGE;
        let mut wide = 0;
        for seed in 0..200 {
            let r = random_recipe(seed, 8);
            let frame = Gen::new(&r, s).frame;
            assert!((s.min_frame..=s.max_frame).contains(&numel(&frame)), "seed {seed}: frame {frame:?}");
            let text = r.render_at(s);
            let p =
                crate::frontend::parse::parse_program("g.eqf", &text, &[]).unwrap_or_else(|e| panic!("{e}\n{text}"));
            for (i, node) in p.expr().as_ref().iter().enumerate() {
                let Some(ty) = p.ty(i.into()) else { continue };
                assert!(ty.numel() <= s.max_numel, "seed {seed}: {ty}\n{text}");
                if node.opcode().is_some_and(|c| c.name() == "@") {
                    let a = p.ty(node.children()[0]).expect("typed");
                    let macs = ty.numel() * a.shape[a.rank() - 1];
                    assert!(macs <= s.max_macs, "seed {seed}: {macs} multiply-adds\n{text}");
                }
            }
            wide += usize::from(frame.last().is_some_and(|&d| d >= 4096));
        }
        // Wide rows come up (sizes of 4096 and more last in the usual shape).
        assert!(wide >= 20, "{wide} of 200 frames end in a wide axis");
        // The same choices render differently at the two scales.
        assert_ne!(random_recipe(3, 8).render(), random_recipe(3, 8).render_at(s));
    }

    #[test]
    fn the_simplest_recipe_is_a_sum() {
        let r = Recipe {
            frame: vec![0],
            dtype: 0,
            input_seed: 0,
            grads: 0,
            steps: vec![Step { op: 0, a: 0, b: 0, c: 0, attr: 0, attr2: 0, output: false }],
        };
        assert_eq!(r.render(), "input x0: f32[2]\nt0 = x0 + x0\noutput t0\n");
    }
}
