//! Rendering of a lowered kernel as the generated part of a CUDA file: the `#define` block that
//! instantiates a template and the fused body functions the template calls.
//!
//! Pointwise operators become C expressions through one table ([`unary_expr`], [`binary_expr`]);
//! values live in `float`, `int` or `bool`; f16 and bf16 are converted on load and store only.
//! Elements are visited `V` at a time along the last axis (16-byte vector access where an
//! operand is contiguous there), and index arithmetic is folded per group of domain axes that
//! the template enumerates with one variable (a flat index, a row, a column).
//! The row and column reduction templates' functions are in `emit/rows.rs` and `emit/cols.rs`.
//! Invariant: rendering is a pure function of the kernel, so equal plans give byte-identical
//! CUDA (the golden snapshots rely on it).

use std::collections::BTreeSet;
use std::fmt::Write;

mod cols;
mod rows;
mod scatter;
mod tiled;
pub use rows::{row_cluster, row_keep, ClusterShape, RowKeep, MAX_ROW_SMEM_BYTES, ROW_CACHE_PER_THREAD};
pub use scatter::accumulates as scatter_accumulates;
pub use tiled::ReadTraffic;

use super::lower::{Access, Lowered, Node, Op, Seed, Store};
use crate::error::{Error, Result};
use crate::ir::lang::{Binary, Reduce, Unary};
use crate::ir::layout::contiguous;
use crate::ir::types::DType;
use crate::plan::{Kernel, KernelKind, Template};

/// The most blocks of an elementwise kernel's grid.
const MAX_ELEMENTWISE_BLOCKS: usize = 65536;

/// Block, grid and extra buffers of a rendered kernel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Shape {
    pub grid: [u32; 3],
    pub block: [u32; 3],
    /// Scratch buffers in launch order after the kernel's tensors: (name, bytes, zeroed once).
    pub workspace: Vec<(String, u64, bool)>,
    /// Dynamic shared memory of a block.
    pub smem_bytes: u32,
    /// Launch one wave of resident blocks (the kernel loops over its work and gains from it).
    pub wave: bool,
    /// Blocks of a thread-block cluster (`__cluster_dims__`; 0: no cluster).
    pub cluster: u32,
}

/// The generated text of one kernel (defines and body), its launch shape, and the numbers of its
/// `#define` block that another template's code takes (a gemm epilogue's).
pub struct Rendered {
    pub defines: String,
    pub body: String,
    pub shape: Shape,
    pub params: Params,
    /// The kernel's Hopper path, where it has one: its defines, body and launch shape on a 9.0
    /// device (a row kernel's rows spread over clusters of blocks).
    pub sm90a: Option<Box<Rendered>>,
}

/// Numbers a rendered kernel's `#define` block holds, for the code that embeds it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Params {
    /// Elements per access (`EQ_VEC`).
    pub vec: usize,
    /// Threads per row of a row kernel (`EQ_ROW_THREADS`); 1 for other templates.
    pub row_threads: usize,
    /// Reduction accumulators per thread (`EQ_NACC`); 1 where nothing reduces.
    pub nacc: usize,
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

/// Whether i32 `op` takes its operands as i32 values (wrapped, a fraction truncated), as the
/// reference's i32 arithmetic does (`ir::scalar::binary`), rather than computing in f64.
fn wraps_operands(op: Binary) -> bool {
    matches!(op, Binary::Add | Binary::Sub | Binary::Mul | Binary::Div)
}

/// A literal of value type `ty`.
pub(super) fn literal(v: f64, ty: &str) -> String {
    match ty {
        // A literal meets i32 values wrapped, as the reference's i32 arithmetic takes it (a
        // folded `4e9` is `-294967296`). (`-2147483648` is the negation of a long in C.)
        "int" => match crate::ir::scalar::wrap_i32(v) as i64 {
            m if m == i32::MIN as i64 => "(-2147483647 - 1)".to_string(),
            n => n.to_string(),
        },
        "bool" => (if v != 0.0 { "true" } else { "false" }).to_string(),
        // A value beyond f32's range (constant folding's `1e30 * 1e30`, a `-inf` mask fill)
        // is an infinity in f32; C has no literal for it (`inff` does not compile).
        _ if (v as f32).is_infinite() => (if v > 0.0 { "EQ_INF" } else { "(-EQ_INF)" }).to_string(),
        _ if v.is_nan() => "EQ_NAN".to_string(),
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

/// The C expression of a unary operator. `strict`: products are never contracted into a fused
/// multiply-add (see [`binary_expr`]). `fast_exp`: `exp` as `eq_exp_fast` ([`Emitter::fast_exp`]).
fn unary_expr(op: Unary, a: &str, strict: bool, fast_exp: bool) -> String {
    let f = |name: &str| format!("{name}({a})");
    match op {
        // (`-` before a negative literal would read as the decrement operator.)
        Unary::Neg if a.starts_with('-') => format!("(-({a}))"),
        Unary::Neg => format!("(-{a})"),
        Unary::Exp if fast_exp => f("eq_exp_fast"),
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
        Unary::Square if strict => format!("__fmul_rn({a}, {a})"),
        Unary::Square => format!("({a} * {a})"),
        Unary::Floor => f("floorf"),
        Unary::Ceil => f("ceilf"),
        Unary::Round => f("rintf"),
        Unary::Trunc => f("truncf"),
        Unary::Not => format!("(!{a})"),
    }
}

/// The C expression of a binary operator on values of type `ty`. `strict`: float arithmetic
/// through the round-to-nearest intrinsics, which the compiler never contracts into a fused
/// multiply-add, so a fused kernel rounds after every operation exactly as the unfused plan,
/// which stores every intermediate, does.
fn binary_expr(op: Binary, a: &str, b: &str, ty: &str, strict: bool) -> String {
    let infix = |s: &str| format!("({a} {s} {b})");
    if strict && ty == "float" {
        match op {
            Binary::Add => return format!("__fadd_rn({a}, {b})"),
            Binary::Sub => return format!("__fsub_rn({a}, {b})"),
            Binary::Mul => return format!("__fmul_rn({a}, {b})"),
            Binary::Div => return format!("__fdiv_rn({a}, {b})"),
            _ => {}
        }
    }
    match op {
        Binary::Add => infix("+"),
        Binary::Sub => infix("-"),
        Binary::Mul => infix("*"),
        Binary::Div if ty == "int" => format!("eq_idiv({a}, {b})"),
        Binary::Div => infix("/"),
        Binary::Pow if ty == "int" => format!("eq_f2i(powf((float){a}, (float){b}))"),
        Binary::Pow if !strict => match small_power(a, b) {
            Some(product) => product,
            None => format!("powf({a}, {b})"),
        },
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

/// `a ^ b` as a product when the exponent is the literal 2, 3 or 4 and `a` a plain name or
/// element (read once more costs nothing): `powf` takes dozens of instructions, enough to make
/// a kernel of a tanh-form GELU (`x + 0.044715 * x ^ 3`) bound by its arithmetic. The product
/// rounds after each multiplication (within 2 units in the last place of `powf`'s result), and it
/// agrees with `powf` on signs, zeros, infinities and NaN; strict kernels keep `powf`.
fn small_power(a: &str, b: &str) -> Option<String> {
    let n: f64 = b.strip_suffix('f').unwrap_or(b).parse().ok()?;
    let plain = !a.is_empty() && a.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '[' | ']'));
    let k = match n {
        2.0 => 2,
        3.0 => 3,
        4.0 => 4,
        _ => return None,
    };
    plain.then(|| format!("({})", vec![a; k].join(" * ")))
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

fn reduce_combine(r: Reduce, a: &str, b: &str, strict: bool) -> String {
    match r {
        Reduce::Sum | Reduce::Mean if strict => format!("__fadd_rn({a}, {b})"),
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
    /// Strict numerics (the plan's `search.strict`): no contraction, every value rounded to its
    /// dtype, and row reductions in an order that depends on the row length alone.
    strict: bool,
    /// The kernel's reads and writes stored 1 bit per element (packed masks, `memory.rs`).
    packed: &'a BTreeSet<String>,
    /// Shifted rows (`kernels/rowreduce.cu`, [`shifted_rows`]): a row kernel's vectors start at
    /// aligned addresses before each row's column 0, `col0` may wrap below 0, and lanes outside
    /// the row are skipped.
    shift: bool,
    /// An elementwise kernel's tiled path (`emit/tiled.rs`): the accesses read through a tile.
    tiled: Option<tiled::Tiled>,
    /// `exp` as one `ex2.approx` (`eq_exp_fast`, `kernels/common.cuh`) rather than `expf`:
    /// [`fast_exp`]'s answer.
    fast_exp: bool,
}

fn err(k: &Kernel, m: impl std::fmt::Display) -> Error {
    Error::Invalid(format!("kernel {} ({}): {m}", k.id, k.template.name()))
}

/// Renders a lowered kernel; `packed` names the tensors stored 1 bit per element (a read is
/// tested bit by bit, a write is assembled a warp at a time, elementwise kernels only).
pub fn render(k: &Kernel, l: &Lowered, strict: bool, packed: &BTreeSet<String>) -> Result<Rendered> {
    if strict && l.repeated_sum {
        return Err(err(
            k,
            "under --strict, a sum over an axis its value is broadcast along (computed as one product here, \
             added copy by copy unfused) is not supported yet",
        ));
    }
    let packed_writes = l.stores.iter().any(|s| packed.contains(&k.writes[s.write].name));
    if packed_writes && l.template != Template::Elementwise {
        return Err(err(k, "only elementwise kernels store 1-bit masks"));
    }
    if let Some(st) = l.stores.iter().find(|s| packed.contains(&k.writes[s.write].name) && s.shape != l.domain) {
        return Err(err(
            k,
            format!("the 1-bit mask `{}` is not the size of the iteration space", k.writes[st.write].name),
        ));
    }
    let e = emitter(k, l, strict, packed, packed_writes)?;
    if let Some(sc) = &l.scatter {
        return e.scatter(sc);
    }
    match l.template {
        Template::Elementwise => e.elementwise(),
        Template::RowReduce => e.rowreduce(),
        _ => e.colreduce(),
    }
}

/// The segments a row kernel cuts each row into (`kernels/rowreduce.cu`'s `EQ_SEGS`), as
/// [`render`] decides them for `k` under strict numerics or not: more than 1 for few long
/// rows whose outputs are row values of one reduction stage, 1 otherwise (one block a row, and
/// every kernel of another template or that does not lower). The cost model asks this
/// (`caps::row_segments`), so it prices the blocks that run.
pub fn row_segments(k: &Kernel, strict: bool) -> usize {
    let Ok(l) = super::lower::lower(k) else { return 1 };
    if l.template != Template::RowReduce || l.scatter.is_some() || l.product.is_some() {
        return 1;
    }
    let packed = BTreeSet::new();
    match emitter(k, &l, strict, &packed, false) {
        Ok(e) => e.segments().map_or(1, |s| s.segments),
        Err(_) => 1,
    }
}

/// Whether a row kernel over `rows` rows of `cols` elements may be segmented: one element a
/// vector makes the most vectors, so the most segments.
pub fn rows_may_segment(rows: usize, cols: usize) -> bool {
    rows::segment_shape(rows, cols, 1).is_some()
}

/// The emitter of a lowered kernel (its lanes, shifted rows and index groups).
fn emitter<'a>(
    k: &'a Kernel,
    l: &'a Lowered,
    strict: bool,
    packed: &'a BTreeSet<String>,
    packed_writes: bool,
) -> Result<Emitter<'a>> {
    // (A scatter kernel has no tail loop either: its lanes divide the iteration space.)
    let vec = choose_vec(l, k, strict, packed_writes || l.scatter.is_some());
    // A transposed read goes through a tile where that touches fewer sectors; the tiled path
    // runs one element a thread.
    let packed_any = packed_writes || l.accesses.iter().any(|a| packed.contains(&k.reads[a.read].name));
    let tiled = tiled::tiled(l, vec, packed_any);
    let vec = if tiled.is_some() { 1 } else { vec };
    let r = l.domain.len();
    // (`lanes` leaves a lane count that does not divide the row only for shifted rows.)
    let shift = l.template == Template::RowReduce && r > 0 && !l.domain[r - 1].is_multiple_of(vec);
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
    let fast_exp = fast_exp(l, vec, strict);
    Ok(Emitter { k, l, vec, vsym, groups, strict, packed, shift, tiled, fast_exp })
}

/// The max `m` of a `sum(exp(x - m))` whose `m` is `amax(x)` of the same `x`: the two run as an
/// online pair (a running max and the sum rescaled to it) in the row and column templates.
fn online_max(l: &Lowered, i: usize) -> Option<usize> {
    let Op::Reduce(Reduce::Sum, e) = l.nodes[i].op else { return None };
    let Op::Unary(Unary::Exp, d) = l.nodes[e].op else { return None };
    let Op::Binary(Binary::Sub, a, m) = l.nodes[d].op else { return None };
    matches!(l.nodes[m].op, Op::Reduce(Reduce::Amax, x) if x == a).then_some(m)
}

/// The lines merging partial `b` of an online pair into `a` (accumulator arrays): the pair's
/// max at slot `km`, its sum at slot `ks`, rescaled to the larger max `m` (a local of that
/// name). The row and the column templates' `eq_merge` both render a pair with it.
fn online_merge(ks: usize, km: usize, m: &str) -> [String; 3] {
    [
        format!("const float {m} = eq_max(a[{km}], b[{km}]);"),
        format!("a[{ks}] = eq_lse_rescale(a[{ks}], a[{km}], {m}) + eq_lse_rescale(b[{ks}], b[{km}], {m});"),
        format!("a[{km}] = {m};"),
    ]
}

/// Whether a kernel computes `exp` as one `ex2.approx` of its argument times log2(e)
/// (`eq_exp_fast`): row kernels of 16-bit rows (8 lanes a 16-byte vector) outside strict
/// numerics and gemm row epilogues, unless `EQFUSE_ROW_FAST_EXP=off` (read once, to compare the
/// two on a device). Its error (a few f32 ulp, plus |x| log2(e) 2^-24 relative from the
/// product's rounding: under 6e-6 wherever the result is a normal f32) is far below a 16-bit
/// output's rounding (2^-9 for bf16) and the f32 tolerance of outputs summed from it
/// (`reference::tolerance`, 1e-5 of the largest value). `expf` takes about four times the
/// instructions, twice an element in a softmax (its sum's pass and its epilogue), which bound
/// a wide bf16 softmax's row kernel on an H100, not its loads (issue 22).
fn fast_exp(l: &Lowered, vec: usize, strict: bool) -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let on = *ON.get_or_init(|| std::env::var("EQFUSE_ROW_FAST_EXP").as_deref() != Ok("off"));
    on && !strict && vec == 8 && l.template == Template::RowReduce && l.product.is_none() && l.scatter.is_none()
}

/// How an elementwise kernel (or a plain row kernel) reads, as [`render`] generates it outside
/// 1-bit masks: see [`ElementwiseReads`]. `None` for a kernel of another template or that does
/// not lower. The cost model asks this (`caps::elementwise_reads`), once per candidate kernel,
/// for strided reads' sectors and for narrow lanes.
pub fn elementwise_reads(k: &Kernel, strict: bool) -> Option<ElementwiseReads> {
    let l = super::lower::lower(k).ok()?;
    let widest = if l.domain.is_empty() { 4 } else { widest_along_last(&l, k) };
    if l.template == Template::RowReduce && l.product.is_none() && l.scatter.is_none() {
        // A row kernel's lanes read along the last axis as the plain elementwise path's do.
        let lanes = choose_vec(&l, k, strict, false);
        return Some(ElementwiseReads { tiled: false, lanes, widest, traffic: tiled::read_traffic(&l, lanes, None) });
    }
    if l.template != Template::Elementwise || l.scatter.is_some() {
        return None;
    }
    let vec = choose_vec(&l, k, strict, false);
    let t = tiled::tiled(&l, vec, false);
    let lanes = if t.is_some() { 1 } else { vec };
    Some(ElementwiseReads { tiled: t.is_some(), lanes, widest, traffic: tiled::read_traffic(&l, lanes, t.as_ref()) })
}

/// How a kernel's plain path reads its inputs ([`elementwise_reads`]).
#[derive(Clone, Debug)]
pub struct ElementwiseReads {
    /// Whether code generation takes the tiled path (transposed reads through a shared-memory
    /// tile).
    pub tiled: bool,
    /// The lanes each thread reads with along the last axis (after `lower` merged the axes it
    /// walks as one: an odd last extent of a contiguous tensor does not narrow them); 1 on the
    /// tiled path.
    pub lanes: usize,
    /// The bytes of the widest element accessed along the last axis (4 where none is).
    pub widest: usize,
    /// Each read that touches more 32-byte sectors than it uses, with the window in which later
    /// warps use the rest.
    pub traffic: Vec<ReadTraffic>,
}

/// The bytes of the widest element a lowered kernel of rank >= 1 accesses along its last axis
/// (4 where none is).
fn widest_along_last(l: &Lowered, k: &Kernel) -> usize {
    let r = l.domain.len();
    let last = l.domain[r - 1];
    l.accesses
        .iter()
        .filter(|a| a.strides[r - 1] != 0)
        .map(|a| a.dtype.size())
        // A store of one value per row (a row reduction's result) is not a vector access: it
        // does not narrow the lanes of the row's reads (attention's delta reads two bf16 rows
        // and writes one f32 per row: 16-byte reads, not 8-byte).
        .chain(l.stores.iter().filter(|s| s.shape[r - 1] != 1 || last == 1).map(|s| k.writes[s.write].ty.dtype.size()))
        .max()
        .unwrap_or(4)
}

/// The vectors each thread of the plain elementwise loop handles per step (`EQ_UNROLL`, each a
/// block's width apart, all loaded before any is stored) where its lanes access `lane_bytes`
/// bytes: enough for 16 bytes in flight a thread, at most 8 vectors. A lane of fewer bytes
/// keeps fewer bytes in flight per thread than the device needs to fill its memory pipe: on an
/// H200, one-element f32 lanes (an odd last extent under a broadcast) ran at 2400-2600 GB/s
/// where 16-byte lanes ran at 3400-4000 (`benches/results/2026-11-28-h200-session19`).
fn elementwise_unroll(lane_bytes: usize) -> usize {
    if (1..16).contains(&lane_bytes) {
        (16 / lane_bytes).min(8)
    } else {
        1
    }
}

/// The lane count of a lowered kernel: [`lanes`] of the widest element accessed along the last
/// axis.
fn choose_vec(l: &Lowered, k: &Kernel, strict: bool, packed_writes: bool) -> usize {
    let r = l.domain.len();
    if r == 0 {
        return 1;
    }
    let last = l.domain[r - 1];
    let widest = widest_along_last(l, k);
    if l.product.is_some() {
        // A gemm's row epilogue (`kernels/gemm.cu`) has no shifted rows.
        return halved_lanes(l.template, r, last, widest, strict, packed_writes);
    }
    lanes(l.template, r, last, widest, strict, packed_writes)
}

/// Whether a row kernel over rows of `last` elements whose widest element is `widest` bytes
/// reads them as shifted rows (`kernels/rowreduce.cu`, `EQ_SHIFT`): 16-byte vectors at aligned
/// addresses, starting before each row's first column, when 16 bytes of elements do not divide
/// the row (a vocabulary of 50257 or 32001, an odd hidden size). The lane count then stays 16
/// bytes instead of dropping to what divides the row (one element for an odd row, 2-byte
/// accesses of bf16: half the bandwidth on an H100). Strict numerics keep their lanes (the
/// unfused plan's order of summation), and rows shorter than one vector gain nothing.
pub fn shifted_rows(template: Template, rank: usize, last: usize, widest: usize, strict: bool) -> bool {
    let v = 16 / widest.clamp(1, 16);
    template == Template::RowReduce && !strict && rank > 0 && last > v && !last.is_multiple_of(v)
}

/// The lane count of a kernel of `template` over an iteration space of rank `rank` whose last
/// extent is `last`, when the widest element accessed along it is `widest` bytes: 16 bytes of
/// it, halved until it divides the last extent, except for a row kernel's shifted rows
/// ([`shifted_rows`]), which keep 16 bytes. Strict row reductions take 4 lanes whatever the
/// dtypes (halved the same way), since the lane count decides which elements each thread sums: a
/// fused kernel must sum a row in the same order as the unfused plan's kernel of the same
/// reduction. A kernel storing a 1-bit mask (`packed_writes`) has no tail loop (its loop is
/// warp-uniform): the lane count divides the iteration space whatever its rank.
pub fn lanes(template: Template, rank: usize, last: usize, widest: usize, strict: bool, packed_writes: bool) -> usize {
    if shifted_rows(template, rank, last, widest, strict) {
        return 16 / widest.clamp(1, 16);
    }
    halved_lanes(template, rank, last, widest, strict, packed_writes)
}

/// [`lanes`] without shifted rows: 16 bytes halved until the lane count divides the last extent.
fn halved_lanes(
    template: Template,
    rank: usize,
    last: usize,
    widest: usize,
    strict: bool,
    packed_writes: bool,
) -> usize {
    if rank == 0 {
        return 1;
    }
    let mut v = if strict && template == Template::RowReduce { 4 } else { 16 / widest.max(1) };
    let rank1_elementwise = template == Template::Elementwise && rank == 1 && !packed_writes;
    while v > 1 && !rank1_elementwise && !last.is_multiple_of(v) {
        v /= 2;
    }
    v.max(1)
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

    /// Whether write `w` is a packed mask.
    fn packed_write(&self, w: usize) -> bool {
        self.packed.contains(&self.k.writes[w].name)
    }

    /// Whether the kernel stores a packed mask (its body then takes whether its elements exist).
    fn packed_writes(&self) -> bool {
        self.l.stores.iter().any(|s| self.packed_write(s.write))
    }

    /// Whether read `r` is a packed mask.
    fn packed_read(&self, r: usize) -> bool {
        self.packed.contains(&self.k.reads[r].name)
    }

    /// `EQ_PARAMS` and `EQ_ARGS`: the kernel's reads, writes, then any workspace.
    fn params(&self, workspace: &[(&str, &str)]) -> (String, String) {
        let mut decl = Vec::new();
        let mut args = Vec::new();
        for r in &self.k.reads {
            decl.push(param_decl(&r.name, r.ty.dtype, true, self.packed.contains(&r.name)));
            args.push(format!("p_{}", r.name));
        }
        for w in &self.k.writes {
            decl.push(param_decl(&w.name, w.ty.dtype, false, self.packed.contains(&w.name)));
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
        if self.packed_writes() {
            let _ = writeln!(d, "#define EQ_PACKED_WRITES 1");
        }
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
        // Shifted rows align each row's vectors for the iteration space's own row-major layout:
        // an access is aligned with them where its strides differ from that layout's by
        // multiples of the lane count (a tensor of the iteration space's shape; not a row
        // broadcast over the rows, such as layernorm's scale, which is gathered).
        let cs = contiguous(&self.l.domain);
        let aligned = |k: usize, s: usize| {
            if self.shift {
                s.abs_diff(cs[k]).is_multiple_of(self.vec)
            } else {
                s.is_multiple_of(self.vec)
            }
        };
        match strides[r - 1] {
            0 => Lanes::Uniform,
            1 if strides[..r - 1]
                .iter()
                .zip(&self.l.domain)
                .enumerate()
                .all(|(k, (&s, &d))| d == 1 || aligned(k, s)) =>
            {
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
        } else if self.shift && terms.len() > 1 {
            // Under shifted rows `col0` may have wrapped below 0: the offset wraps back in eq_idx
            // before it is added to a pointer.
            format!("({})", terms.join(" + "))
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
            Op::CoordPart { axis, inner, extent } => {
                let c = if *axis + 1 == self.rank() {
                    self.lane_coord(scope, need)
                } else {
                    need.insert(*axis);
                    format!("c{axis}")
                };
                match (*inner, *extent) {
                    (_, 1) => "0".to_string(),
                    (1, e) => format!("(int)({c} % {e})"),
                    (i, e) => format!("(int)({c} / {i} % {e})"),
                }
            }
            Op::Iota(strides) => {
                let base = self.offset(strides, need);
                let s = strides.last().copied().unwrap_or(0);
                if scope.lanes && s != 0 {
                    format!("(int)({base} + {})", lane_term(s))
                } else {
                    format!("(int)({base})")
                }
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
            Op::IndexLoad { access, offset, index } => {
                let acc = &self.l.accesses[*access];
                let mut at = self.offset(&acc.strides, need);
                match acc.strides.last() {
                    Some(&s) if scope.lanes && s != 0 => at += &format!(" + {}", lane_term(s)),
                    _ => {}
                }
                if *offset > 0 {
                    at += &format!(" + {offset}");
                }
                if let Some(ix) = index {
                    // Negative indices count from the end; any index is clamped into the axis.
                    let i = self.operand(ix.node, "int", scope);
                    let n = ix.extent;
                    at += &format!(
                        " + (eq_idx)(({i}) < 0 ? max(({i}) + {n}, 0) : min(({i}), {})) * {}",
                        n - 1,
                        ix.stride
                    );
                }
                format!("eq_val({}[{at}])", self.param(Some(acc.read), None))
            }
            Op::Unary(u, a) => {
                self.rounded(n, unary_expr(*u, &self.operand(*a, ty, scope), self.strict, self.fast_exp))
            }
            Op::Binary(b, x, y) if self.int_with_fraction(*x, *y) && !wraps_operands(*b) => {
                // An integer with a fractional literal in a comparison, `pow`, `max` or `min`:
                // the reference computes in f64 and truncates to i32 (a comparison compares the
                // f64 values), so does this; the literal is not truncated first. (`+ - * /`
                // take the literal as an i32, truncated, as the reference's i32 arithmetic
                // does: `x - 0.5` is `x`; the generic arm renders it so.)
                let d = |i: usize| format!("((double){})", self.operand(i, "float", scope));
                let (a, c) = (d(*x), d(*y));
                match b {
                    _ if b.is_comparison() => binary_expr(*b, &a, &c, "double", false),
                    Binary::Div => format!("({c} == 0.0 ? 0 : eq_d2i({a} / {c}))"),
                    _ => format!("eq_d2i({})", binary_expr(*b, &a, &c, "double", false)),
                }
            }
            Op::Binary(Binary::Div, x, y) if self.row_divisor(n, *y) && self.softmax_denominator(*y) => {
                // A softmax denominator is at least 1 or NaN (see `softmax_denominator`), so
                // `eq_div_row` always takes its product: the same value without the per-element
                // select and the division it guards.
                let (a, d) = (self.operand(*x, ty, scope), self.operand(*y, ty, scope));
                format!("({a} * (1.0f / {d}))")
            }
            Op::Binary(Binary::Div, x, y) if self.row_divisor(n, *y) => {
                // Each element divided by one value of its row: one reciprocal per row (the
                // compiler computes the loop-invariant `1.0f / y` once) and a product per
                // element, instead of an IEEE division per element: within 1.5 ulp of it while
                // 1/y is a normal number (2^-125 < |y| < 2^125). Beyond that (and for 0, inf,
                // NaN) the reciprocal would lose precision or overflow, so the element is
                // divided (`eq_div_row`: a select on the row's divisor, uniform across the row).
                let (a, d) = (self.operand(*x, ty, scope), self.operand(*y, ty, scope));
                format!("eq_div_row({a}, {d})")
            }
            Op::Binary(b, x, y) => {
                let want = if b.is_comparison() { self.compare_type(*x, *y) } else { ty };
                let e =
                    binary_expr(*b, &self.operand(*x, want, scope), &self.operand(*y, want, scope), want, self.strict);
                self.rounded(n, e)
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
            Op::Dropout { x, index, seed, threshold, scale } => {
                let (x, index, scale) =
                    (self.operand(*x, "float", scope), self.expr(*index, scope, need), literal(*scale as f64, "float"));
                self.rounded(
                    n,
                    match seed {
                        Seed::Const { seed, key0 } => {
                            format!("eq_dropout({x}, {index}, {seed}u, {key0}u, {threshold}u, {scale})")
                        }
                        Seed::Node(s) => format!(
                            "eq_dropout_seeded({x}, {index}, (unsigned int){}, {threshold}u, {scale})",
                            self.operand(*s, "int", scope)
                        ),
                    },
                )
            }
        }
    }

    /// Under strict numerics, a computed f16 or bf16 value rounded to its dtype where it is
    /// computed, as the unfused plan rounds it when it stores it (f32 arithmetic rounds already).
    fn rounded(&self, n: usize, e: String) -> String {
        match self.node(n).dtype {
            DType::Bf16 if self.strict => format!("eq_round_bf16({e})"),
            DType::F16 if self.strict => format!("eq_round_f16({e})"),
            _ => e,
        }
    }

    /// Whether `n` divides a value (f32, or a 16-bit value held in f32) of every element of a row
    /// by a row value `y` (one value per row, computed once in a stage's finish) in a row
    /// kernel, outside strict numerics.
    fn row_divisor(&self, n: usize, y: usize) -> bool {
        let r = self.rank();
        let row_value = |i: usize| {
            let s = &self.node(i).shape;
            s.len() == r && s[r - 1] == 1 && !matches!(self.node(i).op, Op::Const(_) | Op::Load(_))
        };
        // (A 16-bit node's value is f32 in registers outside strict numerics: rounded only where
        // it is stored, far coarser than the product's 1.5 ulp of f32.)
        let float = |i: usize| matches!(self.node(i).dtype, DType::F32 | DType::Bf16 | DType::F16);
        !self.strict
            && r > 0
            && self.l.template == Template::RowReduce
            && float(n)
            && float(y)
            && self.node(n).shape.get(r - 1).is_some_and(|&c| c > 1)
            && row_value(y)
    }

    /// Whether `y` is a row's softmax denominator, `sum(exp(x - amax(x)))` along the row: at
    /// least 1 (the maximum's own term is exp(0) = 1, the others are not negative, and adding
    /// non-negative values rounded to nearest never decreases the sum), at most the row length,
    /// or NaN (a NaN or infinite x). Its reciprocal is a normal number whenever it is finite.
    fn softmax_denominator(&self, y: usize) -> bool {
        let Op::Reduce(Reduce::Sum, e) = self.node(y).op else { return false };
        let Op::Unary(Unary::Exp, d) = self.node(e).op else { return false };
        let Op::Binary(Binary::Sub, a, m) = self.node(d).op else { return false };
        matches!(self.node(m).op, Op::Reduce(Reduce::Amax, x) if x == a)
    }

    /// Whether one operand is an i32 value and the other a literal with a fractional part.
    fn int_with_fraction(&self, x: usize, y: usize) -> bool {
        let frac = |i: usize| matches!(self.node(i).op, Op::Const(v) if v.fract() != 0.0);
        let int = |i: usize| self.node(i).dtype == DType::I32 && !matches!(self.node(i).op, Op::Const(_));
        (frac(x) && int(y)) || (frac(y) && int(x))
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
            if self.tiled.as_ref().is_some_and(|t| t.accesses.contains(&a)) {
                // Loaded by `eq_tile_load` into the block's tile of this access.
                scope.refs[n] = Some(format!("eq_s{a}[tl_][tp_]"));
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
                    t.line(depth, format!("{};", self.vector_load(acc.dtype, &p, &off, &format!("l{n}"))));
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
        if self.packed_write(st.write) {
            // The mask is the iteration space's size (checked by `render`): lane v's bit is
            // element i0 + v, and the warp writes whole words after the lane loop.
            let b = st.write;
            return (
                format!("mb{b} |= ({val}) ? (1u << v) : 0u;"),
                Some(format!("eq_put_bits<V>({p}, i0, mb{b}, ok);")),
            );
        }
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
            let ty = storage_type(w.ty.dtype);
            let after = if self.shift {
                format!("{cond}eq_storev_row<{ty}, {}>({p} + {off}, o{}, col0, EQ_COLS);", self.vsym, st.write)
            } else {
                format!("{cond}eq_storev<{ty}, {}>({p} + {off}, o{});", self.vsym, st.write)
            };
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

    /// A vector load of `dtype` elements at `p + off` into `out` (bounded by the row under
    /// shifted rows).
    fn vector_load(&self, dtype: DType, p: &str, off: &str, out: &str) -> String {
        let (ty, v) = (storage_type(dtype), self.vsym);
        if self.shift {
            format!("eq_loadv_row<{ty}, {v}>({p} + {off}, {out}, col0, EQ_COLS)")
        } else {
            format!("eq_loadv<{ty}, {v}>({p} + {off}, {out})")
        }
    }

    /// The reduction a node performs (sum for anything else).
    fn reduce_of(&self, i: usize) -> Reduce {
        match self.node(i).op {
            Op::Reduce(r, _) | Op::Global(r, _) => r,
            _ => Reduce::Sum,
        }
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
        // The lane loop. Where EQ_SPLIT_LANES (rows not kept in registers: `emit/rows.rs`), a
        // shifted row's lanes are tested against the row only in its first and last vectors,
        // the others (all but 2 of a thread's in a wide row) taking a copy of the loop without
        // the tests: two instructions a lane fewer, a fifth of a wide bf16 softmax's
        // per-element instructions. (Over a row in registers, whose chunk loops are unrolled
        // whole, the copies spilled: a bf16 softmax of 4097 columns to f32, 28 bytes.)
        // (`body` is indented for a loop at `depth + 1`.)
        let lane_loop = |t: &mut Text, at: usize, checked: bool| {
            t.line(0, "#pragma unroll");
            t.line(at, format!("for (int v = 0; v < {}; ++v) {{", self.vsym));
            if checked {
                t.line(at + 1, "if (!eq_in_row(col0 + v, EQ_COLS)) continue;");
            }
            let pad = "    ".repeat(at - (depth + 1));
            for l in body.s.lines() {
                t.s.push_str(&pad);
                t.s.push_str(l);
                t.s.push('\n');
            }
            for l in &lines {
                t.line(at + 1, l);
            }
            t.line(at, "}");
        };
        if self.shift {
            t.line(depth + 1, format!("if (EQ_SPLIT_LANES && eq_whole_in_row(col0, {}, EQ_COLS)) {{", self.vsym));
            lane_loop(&mut t, depth + 2, false);
            t.line(depth + 1, "} else {");
            lane_loop(&mut t, depth + 2, true);
            t.line(depth + 1, "}");
        } else {
            lane_loop(&mut t, depth + 1, false);
        }
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
        // A kernel storing a packed mask runs its body for element groups past the end too
        // (`ok` false): only the mask's warp-wide store sees them.
        let guard = if self.packed_writes() { "if (ok) " } else { "" };
        for st in stores {
            let (line, vector) = self.store(st, &val(st), skip, need);
            if self.packed_write(st.write) {
                decls.push(format!("unsigned int mb{} = 0u;", st.write));
                after.extend(vector);
                lines.push(line);
                continue;
            }
            if let Some(a) = vector {
                let ty = value_type(self.k.writes[st.write].ty.dtype);
                decls.push(format!("{ty} o{}[{}];", st.write, self.vsym));
                after.push(format!("{guard}{a}"));
            }
            lines.push(format!("{guard}{line}"));
        }
        (decls, lines, after)
    }

    fn elementwise(&self) -> Result<Rendered> {
        let mut scope = self.scope(true);
        let roots: Vec<usize> = self.l.stores.iter().map(|s| s.node).collect();
        let stores: Vec<&Store> = self.l.stores.iter().collect();
        let header = if self.packed_writes() {
            "template <int V>\n__device__ __forceinline__ void eq_body(EQ_PARAMS, eq_idx i0, bool ok) {"
        } else if self.tiled.is_some() {
            "template <int V>\n__device__ __forceinline__ void eq_body(EQ_PARAMS, eq_idx i0, int tl_, int tp_) {"
        } else {
            "template <int V>\n__device__ __forceinline__ void eq_body(EQ_PARAMS, eq_idx i0) {"
        };
        let f = self.lane_function(header, 0, &mut scope, &roots, |e, scope, need| {
            e.store_lines(&stores, |st| e.operand(st.node, value_type(e.node(st.node).dtype), scope), None, need)
        });
        let numel: usize = self.l.domain.iter().product();
        if let Some(t) = &self.tiled {
            return Ok(self.tiled_elementwise(t, f, numel));
        }
        let threads = 256usize;
        let unroll = if self.packed_writes() || self.l.domain.is_empty() {
            1
        } else {
            elementwise_unroll(self.vec * widest_along_last(self.l, self.k))
        };
        // Up to one vector per thread for 16M vectors (64M f32); the loop strides over more.
        // bias+gelu+dropout 8192x8192 f32 on an H100 (2026-11-22): 185.6 us with one vector per
        // thread (65536 blocks) against 189.7 us with 8192 blocks looping 8 times.
        let vectors = (numel / self.vec).max(numel % self.vec);
        let blocks = vectors.div_ceil(threads * unroll).clamp(1, MAX_ELEMENTWISE_BLOCKS);
        let mut d = self.common_defines(&self.name(), &[]);
        let _ = writeln!(d, "#define EQ_NUMEL {numel}");
        let _ = writeln!(d, "#define EQ_VEC {}", self.vec);
        let _ = writeln!(d, "#define EQ_THREADS {threads}");
        if unroll > 1 {
            let _ = writeln!(d, "#define EQ_UNROLL {unroll}");
        }
        let shape = Shape {
            grid: [blocks as u32, 1, 1],
            block: [threads as u32, 1, 1],
            workspace: vec![],
            smem_bytes: 0,
            wave: false,
            cluster: 0,
        };
        Ok(Rendered {
            defines: d,
            body: f,
            shape,
            params: Params { vec: self.vec, row_threads: 1, nacc: 1 },
            sm90a: None,
        })
    }

    /// The tiled path (`kernels/elementwise.cu`, `EQ_TILED`): a tile in shared memory per tiled
    /// access, `eq_tile_load` filling them, and `body` (the body function) reading them.
    fn tiled_elementwise(&self, t: &tiled::Tiled, body: String, numel: usize) -> Rendered {
        let r = self.rank();
        let mut need = BTreeSet::new();
        let mut loads = Text::default();
        let mut tiles = Text::default();
        for &a in &t.accesses {
            let acc = &self.l.accesses[a];
            let vt = value_type(acc.dtype);
            tiles.line(0, format!("__shared__ {vt} eq_s{a}[EQ_TILE][EQ_TILE + 1];"));
            let off = self.offset(&acc.strides, &mut need);
            loads.line(1, format!("eq_s{a}[tl_][tp_] = eq_val({}[{off}]);", self.param(Some(acc.read), None)));
        }
        let mut f = tiles;
        f.line(0, "__device__ __forceinline__ void eq_tile_load(EQ_PARAMS, eq_idx i0, int tl_, int tp_) {");
        self.coords(&need, &mut f, 1);
        f.s.push_str(&loads.s);
        f.line(0, "}");
        f.s.push_str(&body);
        let (p, l) = (self.dim(t.axis), self.dim(r - 1));
        let between: usize = self.l.domain[t.axis + 1..r - 1].iter().product();
        let tiles_n = numel / (p * l) * p.div_ceil(tiled::TILE) * l.div_ceil(tiled::TILE);
        let blocks = tiles_n.clamp(1, MAX_ELEMENTWISE_BLOCKS);
        let mut d = self.common_defines(&self.name(), &[]);
        let _ = writeln!(d, "#define EQ_TILED 1");
        let _ = writeln!(d, "#define EQ_NUMEL {numel}");
        let _ = writeln!(d, "#define EQ_VEC 1");
        let _ = writeln!(d, "#define EQ_TILE {}", tiled::TILE);
        let _ = writeln!(d, "#define EQ_TROWS {}", tiled::TILE_ROWS);
        let _ = writeln!(d, "#define EQ_TP {p}");
        let _ = writeln!(d, "#define EQ_TA {between}");
        let _ = writeln!(d, "#define EQ_TL {l}");
        let shape = Shape {
            grid: [blocks as u32, 1, 1],
            block: [tiled::TILE as u32, tiled::TILE_ROWS as u32, 1],
            workspace: vec![],
            smem_bytes: 0,
            wave: false,
            cluster: 0,
        };
        Rendered { defines: d, body: f.s, shape, params: Params { vec: 1, row_threads: 1, nacc: 1 }, sm90a: None }
    }

    /// The kernel's generated name: `{template}_{dtype}_k{id}`.
    pub fn name(&self) -> String {
        kernel_name(self.k, self.l.template)
    }
}

/// The declaration of a kernel's tensor parameter `p_{name}`: a pointer to its storage type, or
/// for a packed mask the wrapper of its words (`eq_bits`, `eq_bits_out` in `kernels/common.cuh`),
/// which indexes like a bool pointer.
pub fn param_decl(name: &str, dtype: DType, read: bool, packed: bool) -> String {
    match (read, packed) {
        (true, true) => format!("eq_bits p_{name}"),
        (false, true) => format!("eq_bits_out p_{name}"),
        (true, false) => format!("const {}* __restrict__ p_{name}", storage_type(dtype)),
        (false, false) => format!("{}* __restrict__ p_{name}", storage_type(dtype)),
    }
}

/// `{template}_{dtype}_k{id}`, the dtype being that of the first write (or read); `scatter` for
/// the template of a scatter kernel (`kernels/scatter.cu`).
pub fn kernel_name(k: &Kernel, template: Template) -> String {
    let dtype = k.writes.first().or(k.reads.first()).map_or(DType::F32, |t| t.ty.dtype);
    // A gemm kernel's epilogue is rendered by another template's emitter; the kernel keeps its name.
    let template = if k.template == Template::Gemm { Template::Gemm } else { template };
    let name = if k.kind == KernelKind::Scatter { "scatter" } else { template.name() };
    format!("{name}_{dtype}_k{}", k.id)
}

fn children(op: &Op) -> Vec<usize> {
    match op {
        Op::Const(_) | Op::Load(_) | Op::Coord(_) | Op::CoordPart { .. } | Op::Flat(_) | Op::Iota(_) => vec![],
        Op::Unary(_, a) | Op::Cast(_, a) | Op::Reduce(_, a) | Op::Global(_, a) => vec![*a],
        Op::Binary(_, a, b) => vec![*a, *b],
        Op::Where(c, a, b) => vec![*c, *a, *b],
        Op::Dropout { x, index, seed: Seed::Const { .. }, .. } => vec![*x, *index],
        Op::Dropout { x, index, seed: Seed::Node(s), .. } => vec![*x, *index, *s],
        Op::IndexLoad { index, .. } => index.iter().map(|ix| ix.node).collect(),
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
        assert_eq!(literal(-2147483648.0, "int"), "(-2147483647 - 1)");
        assert_eq!(literal(4e9, "int"), "-294967296");
        // Beyond f32's range is an infinity in f32 (`inff` does not compile).
        assert_eq!(literal(1e39, "float"), "EQ_INF");
        assert_eq!(literal(-1e60, "float"), "(-EQ_INF)");
        assert_eq!(literal(f64::NAN, "float"), "EQ_NAN");
        assert_eq!(literal(1.0, "bool"), "true");
        // A negated negative literal must not read as `--`.
        assert_eq!(unary_expr(Unary::Neg, &literal(-1.0, "float"), true, false), "(-(-1.0f))");
        assert_eq!(unary_expr(Unary::Neg, "n3", false, false), "(-n3)");
        assert_eq!(unary_expr(Unary::Exp, "n3", false, false), "expf(n3)");
        assert_eq!(unary_expr(Unary::Exp, "n3", false, true), "eq_exp_fast(n3)");
    }

    /// Rows kept in shared memory are pipelined (two buffers a block, one block of the row's
    /// threads an SM) over several rows two of which fit, when their inputs are whole vectors of
    /// 4, 8 or 16 bytes; a lone row, a row that fits once, gathered inputs and 2-byte vectors
    /// keep the one-buffer shapes.
    #[test]
    fn rows_in_shared_memory_pipeline_where_two_fit() {
        let shared = |rows, cols, sizes: &[usize], vec, copyable| {
            let s = rows::row_shape(rows, cols, sizes, vec, false, copyable);
            match s.keep {
                RowKeep::Shared { bytes, pipelined } => (bytes, pipelined, s.row_threads, s.blocks_per_sm),
                k => panic!("{rows}x{cols}: {k:?}"),
            }
        };
        assert_eq!(shared(4096, 50257, &[2], 8, true), (2 * 100528, true, 1024, 1));
        assert_eq!(shared(2, 50257, &[2], 8, true), (2 * 100528, true, 1024, 1));
        assert_eq!(shared(1, 50257, &[2], 8, true), (100528, false, 512, 2));
        assert_eq!(shared(4096, 50257, &[2], 8, false), (100528, false, 512, 2));
        assert_eq!(shared(4096, 50257, &[2], 1, true), (100528, false, 512, 2));
        assert_eq!(shared(4096, 50257, &[4], 4, true), (201040, false, 1024, 1));
        assert_eq!(shared(4096, 15001, &[2, 4], 4, true), (2 * 90032, true, 1024, 1));
        // Several short rows to a block keep their shape.
        assert_eq!(shared(1024, 4096, &[2, 2, 2], 8, true), (2 * 24576, false, 128, 2));
        let product = rows::row_shape(4096, 50257, &[2], 8, true, true);
        assert_eq!(product.keep, RowKeep::Fetched);
    }

    /// Rows a block's registers do not hold spread over a cluster of at most 8 blocks of 256 or
    /// 512 threads, each thread's vectors within 64 registers beside the rest (40 for shifted
    /// rows), with the fewest idle vector slots, every block holding some of the row; rows that
    /// fit a block, and rows no cluster holds, have none.
    #[test]
    fn wide_rows_spread_over_the_smallest_cluster_that_holds_them() {
        let cluster = |rows, cols, sizes: &[usize], vec| {
            row_cluster(rows, cols, sizes, vec).map(|c| (c.blocks, c.threads, c.chunks))
        };
        // Rows of 16-bit values keep one block a row (measured slower over clusters).
        assert_eq!(cluster(4096, 50257, &[2], 8), None);
        assert_eq!(cluster(1, 50257, &[2], 8), None);
        assert_eq!(cluster(1024, 128256, &[2], 8), None);
        // f32 rows of 50257 (12565 shifted vectors of 4), of 128256 (32064 vectors of 4, 32256
        // slots).
        assert_eq!(cluster(4096, 50257, &[4], 4), Some((5, 512, 5)));
        assert_eq!(cluster(1024, 128256, &[4], 4), Some((7, 512, 9)));
        // In a block's registers already.
        assert_eq!(cluster(4096, 32000, &[2], 8), None);
        assert_eq!(cluster(4096, 1001, &[4], 4), None);
        // Two inputs of bf16 rows of 50257 would take 2 x 16 values a thread beside 40
        // registers: no cluster holds them; nor a row of 1000000.
        assert_eq!(cluster(4096, 50257, &[2, 2], 8), None);
        assert_eq!(cluster(4096, 1_000_000, &[4], 4), None);
        for (cols, vec) in [(50257, 8), (128256, 4), (77777, 8), (40001, 4), (32001, 4)] {
            let c = row_cluster(64, cols, &[4], vec).unwrap();
            let per = if cols.is_multiple_of(vec) { cols / vec } else { (cols + vec - 1).div_ceil(vec) };
            assert!(c.blocks * c.threads * c.chunks >= per && (c.blocks - 1) * c.threads * c.chunks < per, "{cols}");
            assert!(c.blocks <= 8 && c.chunks * vec <= 64, "{cols}");
        }
    }
}
