//! Code generation for attention's backward (`kernels/attention_bwd.cu`): a plan kernel of the
//! attention template whose body is `attention_lse`, `attention_grad_q`, or `attention_grad_k`
//! and/or `attention_grad_v` of one attention (one kernel writes both), with or without its
//! `attention_grad_q` (summed with f32 atomics into a zeroed workspace, so never under strict
//! numerics), or the same of `attention_bias` (`attention_bias_lse`, `attention_bias_grad_*`,
//! `EQ_BIAS`), or the dropout forms of the gradients (`attention_dropout_grad_*`,
//! `attention_bias_dropout_grad_*`, `EQ_DROPOUT`), becomes an instance of the template in the
//! matching mode.
//!
//! The operands are read through views as the forward reads them (`codegen::attention`'s
//! `Body` and `Batched`): strides over at most three merged batch axes, factored ones included
//! (grouped-query keys and values repeated over a group's query heads, heads split from a
//! projection), and slices read in place from an element offset (q, k, v split from one
//! projection); q, k, v and g need a contiguous head and strides and offsets of multiples of 8
//! elements. A
//! bias is read through strides (0 along broadcast axes) or is a bool mask's select
//! (`where(m, 0, FILL)`). The statistics are written contiguously; each gradient as computed or
//! through the views and concatenations its consumers read it by (`Body::placed`: heads merged
//! by `reshape(transpose(..))`, dq, dk and dv as the column blocks of d(qkv) `[B, S, 3E]`), with
//! a contiguous head (16-bit ones at even strides and offsets), so neither the transposes nor the
//! concatenation is a copy kernel. bf16 or f16 (tensor cores) with head sizes that are multiples
//! of 8 up to 128, or f32 (CUDA cores, `EQ_F32`) with multiples of 4 up to 128, whose key kernel
//! sums dq for heads up to 64 only; fused epilogues are errors naming the kernel ("not supported
//! yet"), never an approximation. (Other heads keep the decomposed backward: the autodiff pass
//! emits these composites only where [`template_runs`] holds.)

use crate::error::{Error, Result};
use egg::Language;

use crate::ir::lang::{AttnArg, AttnBwdSlots, Composite, Kind, TensorLang};
use crate::ir::layout::Factored;
use crate::ir::types::{DType, TensorType};
use crate::plan::{FusionPlan, Kernel, Template};

use super::attention::{pointer, Batched, BiasInstance, Body, DropInstance, Strided};
use super::{KernelSource, Launch};

/// Rows per block (query rows, or key rows of the key and value gradients), and warps per block.
pub const BLOCK: usize = 64;
pub const WARPS: usize = 4;
/// The largest head size the template runs.
pub const MAX_HEAD: usize = 128;

/// Whether the backward kernels run attention over queries, keys and values of these types:
/// bf16 or f16 (tensor cores) with head sizes a multiple of 8, or f32 (CUDA cores) with head
/// sizes a multiple of 4; one dtype, equal head sizes up to 128.
pub fn template_runs(q: &TensorType, k: &TensorType, v: &TensorType) -> bool {
    let (Some(&d), Some(&dk), Some(&dv)) = (q.shape.last(), k.shape.last(), v.shape.last()) else { return false };
    matches!(q.dtype, DType::Bf16 | DType::F16 | DType::F32)
        && q.dtype == k.dtype
        && q.dtype == v.dtype
        && d == dk
        && d == dv
        && d > 0
        && d <= MAX_HEAD
        && d % align(q.dtype) == 0
        && q.rank() >= 2
}

/// The elements of 16 bytes of `dtype`: the multiple the head, the strides and the offsets of
/// the tiles' operands must be (16-byte cp.async).
fn align(dtype: DType) -> usize {
    16 / dtype.size()
}

/// Keys (modes 0 and 1) or queries (mode 2) per tile of the f32 kernels (`EQ_FBN`): 64 for
/// heads up to 64, 32 over it.
pub const fn f32_block_n(d: usize) -> usize {
    if d.div_ceil(4) * 4 <= 64 {
        64
    } else {
        32
    }
}

/// The shared memory a block of the f32 kernels uses in `mode` for head size `d` (bytes): rows
/// of the head plus 4 floats; the block's tile, and in modes 1 and 2 its second tile, one buffer
/// of each walked tile, the score tile and (mode 2) the walked queries' statistics.
pub fn smem_bytes_f32(mode: Mode, d: usize, bias: bool) -> usize {
    let (row, bn) = (d.div_ceil(4) * 4 + 4, f32_block_n(d));
    // (With dq, dS transposed too: a second score tile.)
    let score_tiles = if matches!(mode, Mode::Dkv { dq: true, .. }) { 2 } else { 1 };
    match mode {
        Mode::Lse => (BLOCK + bn) * row * 4,
        _ => (2 * BLOCK * row + 2 * bn * row + score_tiles * BLOCK * (bn + 8) + (2 + usize::from(bias)) * bn) * 4,
    }
}
// The f32 kernels launch as the 16-bit ones do: 64 rows a block (`EQ_FBM`), 128 threads (`EQ_FNT`).
const _: () = assert!(BLOCK == 64 && WARPS * 32 == 128);

/// The shared memory a block uses in `mode` for head size `d` (bytes); with a bias, the key and
/// value gradients keep three statistics of each query row (the row maximum, the log row sum,
/// delta), not two.
pub fn smem_bytes(mode: Mode, d: usize, bias: bool) -> usize {
    let tile = BLOCK * d.div_ceil(64) * 64 * 2;
    let stats = if bias { 3 } else { 2 };
    match mode {
        Mode::Lse => 3 * tile,
        Mode::Dq => 6 * tile,
        Mode::Dkv { dq, .. } => 6 * tile + 2 * stats * BLOCK * 4 + if dq { BLOCK * BLOCK * 2 } else { 0 },
    }
}

/// Which kernel of the backward.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Lse,
    /// The query gradient alone, one block per query tile (deterministic).
    Dq,
    /// One block per key tile: the key and/or value gradients, and with `dq` the query
    /// gradient too (added into an f32 accumulator by atomics).
    Dkv {
        dq: bool,
        dk: bool,
        dv: bool,
    },
}

/// The f32 accumulator of the query gradient a `Dkv { dq: true, .. }` kernel sums into (bytes):
/// `[batch, queries rounded up to 16, head rounded up to 64]`; and its per-batch arrival counts.
pub fn dq_workspace_bytes(nb: usize, sq: usize, d: usize) -> (u64, u64) {
    ((nb * sq.div_ceil(16) * 16 * d.div_ceil(64) * 64 * 4) as u64, (nb * 4) as u64)
}

fn unsupported(k: &Kernel, what: impl std::fmt::Display) -> Error {
    Error::Invalid(format!("kernel {} (attention backward): {what} is not supported yet", k.id))
}

/// One kernel's instance: every number the `#define` block needs.
#[derive(Clone, Debug, PartialEq)]
struct Instance {
    mode: Mode,
    dtype: DType,
    d: usize,
    sq: usize,
    sk: usize,
    nb: usize,
    scale: f64,
    causal: bool,
    /// Merged batch axes (at most three, outermost first, padded with 1).
    batch: [usize; 3],
    /// `(tensor tag, read index, element offset, strides: three batch axes, row, column)` of
    /// each operand the mode reads (the bias apart); the offset is a slice's start.
    reads: Vec<(&'static str, usize, usize, [usize; 5])>,
    bias: Option<BiasInstance>,
    dropout: Option<DropInstance>,
    /// `(tensor tag, write index, element offset, strides: three batch axes, row, column)` of
    /// each gradient it stores (`DQ`, `DK`, `DV`; a view or a part of a concatenation of the
    /// written tensor), and the log-sum-exp's write index (written contiguously).
    writes: Vec<(&'static str, usize, usize, [usize; 5])>,
    lse_write: Option<usize>,
}

/// Whether the template can run a backward kernel; the reason otherwise.
pub(crate) fn can_generate(k: &Kernel) -> Result<()> {
    if let Some(fwd) = forward_with_lse(k)? {
        return super::attention::can_generate(&fwd.0);
    }
    instance(k).map(|_| ())
}

/// A kernel of a forward attention and the row statistics of the same scores
/// ([`Composite::forward_stats`]): the forward kernel without the statistics (its body, writes
/// and stores pruned), the statistics' write index, and whether they are `attention_bias_lse`'s
/// (m, log l) pairs rather than one log-sum-exp; `None` for other kernels. The forward template
/// writes them itself (`EQ_LSE`, `EQ_STATS`): they must be of the forward's own operands
/// (the same query, keys, bias, scale and causal flag).
fn forward_with_lse(k: &Kernel) -> Result<Option<(Kernel, usize, bool)>> {
    let nodes = k.body.as_ref();
    let kind = |i: usize| nodes[i].opcode().map(|o| o.kind());
    let Some(att) = (0..nodes.len()).find(|&i| matches!(kind(i), Some(Kind::Composite(c)) if c.is_attention_forward()))
    else {
        return Ok(None);
    };
    let Some(Kind::Composite(fwd)) = kind(att) else { return Ok(None) };
    let Some((stats_kind, pairs)) = fwd.forward_stats() else { return Ok(None) };
    let biased = stats_kind == Composite::AttentionBiasLse;
    let lse: Vec<usize> =
        (0..k.stores.len()).filter(|&w| kind(usize::from(k.stores[w])) == Some(Kind::Composite(stats_kind))).collect();
    let &[w] = lse.as_slice() else {
        return Err(unsupported(k, "attention beside backward operators other than one stored log-sum-exp"));
    };
    // The statistics' operands are the forward's: (q, k, [bias,] scale, causal).
    let (a, l) = (nodes[att].children(), nodes[usize::from(k.stores[w])].children());
    if !pairs.iter().all(|&(i, j)| same_expr(nodes, usize::from(a[i]), usize::from(l[j]))) {
        return Err(unsupported(k, "attention beside the statistics of other scores"));
    }
    // Keep what the other stores reach.
    let mut keep = vec![false; nodes.len()];
    let mut stack: Vec<usize> = (0..k.stores.len()).filter(|&i| i != w).map(|i| usize::from(k.stores[i])).collect();
    while let Some(i) = stack.pop() {
        if !std::mem::replace(&mut keep[i], true) {
            stack.extend(nodes[i].children().iter().map(|&c| usize::from(c)));
        }
    }
    let mut body: egg::RecExpr<TensorLang> = egg::RecExpr::default();
    let mut map = vec![egg::Id::from(0usize); nodes.len()];
    for i in (0..nodes.len()).filter(|&i| keep[i]) {
        map[i] = body.add(nodes[i].clone().map_children(|c| map[usize::from(c)]));
    }
    let mut fwd = k.clone();
    fwd.body = body;
    fwd.writes.remove(w);
    fwd.stores = k.stores.iter().enumerate().filter(|&(i, _)| i != w).map(|(_, &s)| map[usize::from(s)]).collect();
    Ok(Some((fwd, w, biased)))
}

/// Whether nodes `a` and `b` of a kernel body are the same expression (a body may hold one
/// operand twice, as separate nodes).
fn same_expr(nodes: &[TensorLang], a: usize, b: usize) -> bool {
    a == b
        || (nodes[a].matches(&nodes[b])
            && nodes[a].children().iter().zip(nodes[b].children()).all(|(&x, &y)| same_expr(nodes, x.into(), y.into())))
}

fn instance(k: &Kernel) -> Result<Instance> {
    let body = Body::new(k)?;
    let slots_of = |i: usize| match body.kind(i) {
        Some(Kind::Composite(c)) => c.attention_backward_slots(),
        _ => None,
    };
    let anchors: Vec<usize> = (0..body.nodes.len()).filter(|&i| slots_of(i).is_some()).collect();
    let Some(&first) = anchors.first() else { return Err(unsupported(k, "a kernel without a backward operator")) };
    let ch = body.children(first);
    let slots = slots_of(first).unwrap_or(AttnBwdSlots { grad: None, tensors: 2, bias: None, dropout: None });
    // Gradients of one attention (the same operands), each at most once.
    let grads: Vec<AttnArg> = anchors.iter().filter_map(|&a| slots_of(a).and_then(|s| s.grad)).collect();
    let has = |w: AttnArg| grads.contains(&w);
    let one_attention = grads.len() == anchors.len()
        && anchors.iter().all(|&a| body.children(a) == ch)
        && [AttnArg::Q, AttnArg::K, AttnArg::V].iter().all(|&w| grads.iter().filter(|&&g| g == w).count() <= 1);
    let mode = match (anchors.len(), slots.grad) {
        (1, None) => Mode::Lse,
        _ if one_attention && grads == [AttnArg::Q] => Mode::Dq,
        _ if one_attention && (has(AttnArg::K) || has(AttnArg::V)) => {
            Mode::Dkv { dq: has(AttnArg::Q), dk: has(AttnArg::K), dv: has(AttnArg::V) }
        }
        _ => return Err(unsupported(k, "this combination of backward operators in one kernel")),
    };
    // Operands: tensors in memory or views of them; the bias, or a bool mask's select; the
    // attributes: constants (or constant subexpressions).
    let mut seen: Vec<usize> = anchors.clone();
    let plain = slots.bias.map_or(slots.tensors, |b| b);
    let ops: Vec<Strided> = ch[..plain].iter().map(|&c| body.operand(c, &mut seen)).collect::<Result<_>>()?;
    let bias = match slots.bias {
        Some(b) => Some(body.bias(ch[b], &mut seen)?),
        None => None,
    };
    let (scale_at, causal_at) = (ch[slots.tensors], ch[slots.tensors + 1]);
    let scale = body.facts[scale_at].konst.ok_or_else(|| unsupported(k, "a non-constant scale"))?;
    let causal = body.facts[causal_at].konst.ok_or_else(|| unsupported(k, "a non-constant causal flag"))? != 0.0;
    if !scale.is_finite() {
        return Err(unsupported(k, format!("the scale {scale}")));
    }
    let mut stack = vec![scale_at, causal_at];
    while let Some(i) = stack.pop() {
        seen.push(i);
        stack.extend(body.children(i));
    }
    let dropout = match slots.dropout {
        Some(at) => Some(body.dropout(first, at, &mut seen)?),
        None => None,
    };
    // Stores: the log-sum-exp as computed; each gradient as computed, or through the views
    // and concatenations its consumers read it by (heads merged, d(qkv)'s column blocks), which
    // the template writes through strides from an element offset.
    let mut lse_write = None;
    let mut placed: Vec<(usize, usize, usize, Vec<usize>)> = Vec::new();
    for (w, &st) in k.stores.iter().enumerate() {
        let st = usize::from(st);
        if slots_of(st).is_some_and(|s| s.grad.is_none()) {
            lse_write = Some(w);
            continue;
        }
        for (a, offset, strides) in body.placed(st, &anchors, &mut seen)? {
            if slots_of(a).is_some_and(|s| s.grad.is_none()) {
                return Err(unsupported(k, "a stored view of the statistics"));
            }
            placed.push((a, w, offset, strides));
        }
    }
    let mut stored: Vec<usize> =
        placed.iter().map(|p| p.0).chain(lse_write.map(|w| usize::from(k.stores[w]))).collect();
    stored.sort_unstable();
    if stored != anchors {
        return Err(unsupported(k, "a backward operator the kernel does not store exactly once"));
    }
    // Nothing else in the body: the operands, the attributes, the anchors.
    if let Some(extra) = (0..body.nodes.len()).find(|i| !seen.contains(i)) {
        return Err(unsupported(k, format!("`{}` fused into the kernel", body.nodes[extra].head())));
    }
    let ty = |o: &Strided| TensorType::new(k.reads[o.read].ty.dtype, o.shape.clone());
    let (q, kt) = (ty(&ops[0]), ty(&ops[1]));
    let v = if mode == Mode::Lse { kt.clone() } else { ty(&ops[2]) };
    if !template_runs(&q, &kt, &v) {
        return Err(unsupported(k, format!("attention backward over {q}, {kt}, {v}")));
    }
    if mode != Mode::Lse && (ty(&ops[3]).dtype != q.dtype || ops[4..].iter().any(|o| ty(o).dtype != DType::F32)) {
        return Err(unsupported(k, "the output gradient or the statistics of another type"));
    }
    let r = q.rank();
    let (sq, d, sk) = (q.shape[r - 2], q.shape[r - 1], kt.shape[r - 2]);
    if sk == 0 || sq == 0 {
        return Err(unsupported(k, "attention over zero queries or keys"));
    }
    // Strides: q, k (v, g, the statistics, delta), the bias broadcast to the scores.
    let mut scores = q.shape.clone();
    scores[r - 1] = sk;
    let bias_layout = match &bias {
        Some((b, _)) => {
            if b.shape.len() > r || crate::ir::infer::broadcast_shapes(&b.shape, &scores).ok() != Some(scores.clone()) {
                return Err(unsupported(k, "the bias does not broadcast to the scores"));
            }
            Some(b.layout.broadcast(&scores))
        }
        None => None,
    };
    let write_layouts: Vec<Factored> = placed
        .iter()
        .map(|(a, _, _, strides)| Ok(Factored::of_strides(&body.ty(*a)?.shape, strides)))
        .collect::<Result<_>>()?;
    let mut layouts: Vec<&Factored> = ops.iter().map(|o| &o.layout).collect();
    layouts.extend(bias_layout.as_ref());
    let first_write = layouts.len();
    layouts.extend(&write_layouts);
    // The tiles of q, k, v and g load by 16 bytes: a contiguous head, strides and offsets of
    // multiples of 16 bytes.
    let tiles = if mode == Mode::Lse { 2 } else { 4 };
    let al = align(q.dtype);
    if q.dtype == DType::F32 && matches!(mode, Mode::Dkv { dq: true, .. }) && f32_block_n(d) != BLOCK {
        return Err(unsupported(k, format!("the f32 query gradient beside the key gradients at head {d} (over 64)")));
    }
    let batched = Batched::new(k, &layouts, r, |all, batch_strides| {
        for (t, s) in all[..tiles].iter().enumerate() {
            if s[1] != 1 && d > 1 {
                return Err(unsupported(k, "an operand without a contiguous head axis"));
            }
            if s[0] % al != 0 || batch_strides[t].iter().any(|&x| x % al != 0) {
                return Err(unsupported(k, format!("an operand of strides that are not multiples of {al} elements")));
            }
            if !ops[t].offset.is_multiple_of(al) {
                return Err(unsupported(
                    k,
                    format!("an operand read from element {} (a slice), not a multiple of {al}", ops[t].offset),
                ));
            }
        }
        // The gradients are stored along a contiguous head; 16-bit ones two elements (four
        // bytes) at a time.
        let pairs = q.dtype != DType::F32;
        for (s, (_, _, offset, _)) in all[first_write..].iter().zip(&placed) {
            if s[1] != 1 && d > 1 {
                return Err(unsupported(k, "a stored gradient without a contiguous head axis"));
            }
            if pairs && (s[0] % 2 != 0 || offset % 2 != 0) {
                return Err(unsupported(k, "a stored gradient at an odd row stride or offset"));
            }
        }
        for bs in &batch_strides[first_write..] {
            if pairs && bs.iter().any(|x| x % 2 != 0) {
                return Err(unsupported(k, "a stored gradient at an odd batch stride"));
            }
        }
        Ok(())
    })?;
    let nb: usize = batched.batch.iter().product();
    let bias = match bias {
        Some((b, select)) => {
            let dtype = k.reads[b.read].ty.dtype;
            let want = if select.is_some() { dtype == DType::Bool } else { dtype.is_float() };
            if !want {
                return Err(unsupported(k, format!("a bias of {dtype}")));
            }
            Some(BiasInstance { read: b.read, offset: b.offset, dtype, strides: batched.strides[ops.len()], select })
        }
        None => None,
    };
    let writes = placed
        .iter()
        .zip(&batched.strides[first_write..])
        .map(|((a, w, offset, _), st)| {
            let tag = match slots_of(*a).and_then(|s| s.grad) {
                Some(AttnArg::Q) => "DQ",
                Some(AttnArg::K) => "DK",
                _ => "DV",
            };
            (tag, *w, *offset, *st)
        })
        .collect();
    let names: &[&'static str] = if mode == Mode::Lse { &["Q", "K"] } else { &["Q", "K", "V", "G", "L", "DL"] };
    let reads = names.iter().zip(&ops).zip(&batched.strides).map(|((&n, o), st)| (n, o.read, o.offset, *st)).collect();
    Ok(Instance {
        mode,
        dtype: q.dtype,
        d,
        sq,
        sk,
        nb,
        batch: batched.batch,
        scale,
        causal,
        reads,
        bias,
        dropout,
        writes,
        lse_write,
    })
}

/// The pointer expression of a stored gradient's first element: parameter `p_w{write}`, moved
/// by the element offset (a part of a concatenation).
fn write_pointer(write: usize, offset: usize) -> String {
    match offset {
        0 => format!("p_w{write}"),
        off => format!("(p_w{write} + {off}LL)"),
    }
}

/// The C spelling of an f32 constant.
fn float_literal(x: f64) -> String {
    if !(x as f32).is_finite() {
        return super::emit::literal(x, "float");
    }
    let s = format!("{:?}", x as f32);
    if s.contains(['.', 'e', 'E']) {
        format!("{s}f")
    } else {
        format!("{s}.0f")
    }
}

/// Renders a backward kernel of a plan.
pub fn codegen(plan: &FusionPlan, k: &Kernel, template_text: &str, common: &str) -> Result<KernelSource> {
    debug_assert_eq!(k.template, Template::Attention);
    if let Some((fwd, w, stats)) = forward_with_lse(k)? {
        // The forward template writes the log-sum-exp (or the bias form's statistics) itself.
        let lse = super::attention::Lse { tensor: &k.writes[w], stats };
        return super::attention::codegen(plan, &fwd, Some(lse), super::ATTENTION, common);
    }
    let inst = instance(k)?;
    let atomic_dq = matches!(inst.mode, Mode::Dkv { dq: true, .. });
    if atomic_dq && plan.search.strict {
        return Err(unsupported(k, "the query gradient summed by atomics under strict numerics"));
    }
    let what = match inst.mode {
        Mode::Lse => "lse".to_string(),
        Mode::Dq => "dq".to_string(),
        Mode::Dkv { dq, dk, dv } => {
            format!("d{}{}{}", if dq { "q" } else { "" }, if dk { "k" } else { "" }, if dv { "v" } else { "" })
        }
    };
    let mode_no = match inst.mode {
        Mode::Lse => 0,
        Mode::Dq => 1,
        Mode::Dkv { .. } => 2,
    };
    let name = format!("attention_bwd_{what}_{}_k{}", inst.dtype, k.id);
    let rows = if matches!(inst.mode, Mode::Dkv { .. }) { inst.sk } else { inst.sq };
    let grid = [rows.div_ceil(BLOCK) as u32, inst.nb as u32, 1];
    let block = [(WARPS * 32) as u32, 1, 1];
    let f32 = inst.dtype == DType::F32;
    let smem = if f32 {
        smem_bytes_f32(inst.mode, inst.d, inst.bias.is_some())
    } else {
        smem_bytes(inst.mode, inst.d, inst.bias.is_some())
    } as u32;

    let mut params: Vec<String> = k
        .reads
        .iter()
        .enumerate()
        .map(|(i, t)| format!("const {}* __restrict__ p_r{i}", super::attention::ctype(t.ty.dtype)))
        .collect();
    params.extend(
        k.writes
            .iter()
            .enumerate()
            .map(|(i, t)| format!("{}* __restrict__ p_w{i}", super::attention::ctype(t.ty.dtype))),
    );
    let mut args = super::tensor_args(k, &Default::default());
    if atomic_dq {
        // The query gradient's accumulator and the arrival counts: zero before every launch
        // and left zero by it.
        params.push("float* __restrict__ eq_dqacc".into());
        params.push("unsigned* __restrict__ eq_count".into());
        let (acc, count) = dq_workspace_bytes(inst.nb, inst.sq, inst.d);
        args.extend([("eq_dqacc", acc), ("eq_count", count)].map(|(n, bytes)| super::workspace_arg(n, bytes, true)));
    }
    let mut s = super::header(plan, k, "attention (backward)", &name, (grid, block), Some(smem));
    let mut def = |n: &str, v: String| s.push_str(&format!("#define {n} {v}\n"));
    def("EQ_GENERATED", String::new());
    def("EQ_KERNEL", name.clone());
    def("EQ_T", super::attention::ctype(inst.dtype).into());
    def("EQ_BF16", u8::from(inst.dtype == DType::Bf16).to_string());
    def("EQ_F32", u8::from(f32).to_string());
    def("EQ_MODE", mode_no.to_string());
    if let Mode::Dkv { dq, dk, dv } = inst.mode {
        def("EQ_DQ", u8::from(dq).to_string());
        def("EQ_DK", u8::from(dk).to_string());
        def("EQ_DV", u8::from(dv).to_string());
    }
    def("EQ_D", inst.d.to_string());
    def("EQ_SQ", inst.sq.to_string());
    def("EQ_SK", inst.sk.to_string());
    def("EQ_NB", inst.nb.to_string());
    def("EQ_NB1", inst.batch[1].to_string());
    def("EQ_NB2", inst.batch[2].to_string());
    def("EQ_CAUSAL", u8::from(inst.causal).to_string());
    def("EQ_SCALE", float_literal(inst.scale));
    def("EQ_SCALE_LOG2", float_literal(inst.scale * std::f64::consts::LOG2_E));
    def("EQ_BM", BLOCK.to_string());
    def("EQ_BN", BLOCK.to_string());
    def("EQ_NWARPS", WARPS.to_string());
    def("EQ_PARAMS", params.join(", "));
    for (tag, r, offset, st) in &inst.reads {
        let ptr = match *tag {
            "L" => "EQ_LSEP".to_string(),
            "DL" => "EQ_DELP".to_string(),
            t => format!("EQ_{t}P"),
        };
        def(&ptr, pointer(*r, *offset));
        for (j, suffix) in ["S0", "S1", "S2", "SR"].iter().enumerate() {
            def(&format!("EQ_{tag}_{suffix}"), format!("{}LL", st[j]));
        }
        if *tag == "L" && inst.bias.is_some() {
            def("EQ_L_SC", format!("{}LL", st[4]));
        }
    }
    if let Some(b) = &inst.bias {
        def("EQ_BIAS", "1".into());
        def("EQ_BT", super::attention::ctype(b.dtype).into());
        def("EQ_BP", pointer(b.read, b.offset));
        for (j, suffix) in ["S0", "S1", "S2", "SR", "SC"].iter().enumerate() {
            def(&format!("EQ_B_{suffix}"), format!("{}LL", b.strides[j]));
        }
        if let Some((yes, no)) = b.select {
            def("EQ_BIAS_SEL", "1".into());
            def("EQ_BIAS_YES", float_literal(yes));
            def("EQ_BIAS_NO", float_literal(no));
        }
    }
    if let Some(w) = inst.lse_write {
        def("EQ_LSEOUT", format!("p_w{w}"));
    }
    for (tag, w, offset, st) in &inst.writes {
        def(&format!("EQ_{tag}P"), write_pointer(*w, *offset));
        for (j, suffix) in ["S0", "S1", "S2", "SR"].iter().enumerate() {
            def(&format!("EQ_{tag}_{suffix}"), format!("{}LL", st[j]));
        }
    }
    for (n, v) in inst.dropout.iter().flat_map(|d| d.defines()) {
        def(n, v);
    }
    if atomic_dq {
        def("EQ_DQACC", "eq_dqacc".into());
        def("EQ_DQCNT", "eq_count".into());
    }
    s.push_str("\n// ---- kernels/common.cuh ----\n");
    s.push_str(common);
    s.push_str("\n// ---- kernels/attention_bwd.cu ----\n");
    s.push_str(template_text);
    Ok(KernelSource {
        file: format!("{name}.cu"),
        name,
        kernel: k.id,
        template: Template::Attention,
        source: s,
        launch: Launch { grid, block, smem_bytes: smem, persistent: false, wave: false, cluster: 0, sm90a: None },
        cublaslt: None,
        args,
        scheduled_sums: atomic_dq,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_memory_per_mode() {
        assert_eq!(smem_bytes(Mode::Lse, 64, false), 24576);
        assert_eq!(smem_bytes(Mode::Dq, 64, false), 49152);
        assert_eq!(smem_bytes(Mode::Dkv { dq: false, dk: true, dv: true }, 64, false), 50176);
        assert_eq!(smem_bytes(Mode::Dkv { dq: false, dk: true, dv: true }, 128, false), 99328);
        assert_eq!(smem_bytes(Mode::Dkv { dq: true, dk: true, dv: true }, 64, false), 58368);
        assert_eq!(smem_bytes(Mode::Dkv { dq: true, dk: true, dv: true }, 128, false), 107520);
        assert_eq!(smem_bytes(Mode::Dkv { dq: true, dk: true, dv: true }, 128, true), 107520 + 2 * 64 * 4);
        assert_eq!(smem_bytes(Mode::Dq, 64, true), 49152);
        // f32: rows of the head plus 4 floats; two blocks of heads up to 64 fit an SM.
        let dkv = |dq| Mode::Dkv { dq, dk: true, dv: true };
        assert_eq!(smem_bytes_f32(Mode::Lse, 64, false), 128 * 68 * 4);
        assert_eq!(smem_bytes_f32(dkv(false), 64, false), (4 * 64 * 68 + 64 * 72 + 128) * 4);
        assert_eq!(smem_bytes_f32(dkv(true), 64, true), (4 * 64 * 68 + 2 * 64 * 72 + 192) * 4);
        assert!(2 * (smem_bytes_f32(dkv(true), 64, true) + 1024) <= 228 * 1024);
        assert_eq!(smem_bytes_f32(Mode::Dq, 128, false), (2 * 64 * 132 + 2 * 32 * 132 + 64 * 40 + 64) * 4);
    }

    #[test]
    fn runs_16_bit_and_f32_heads_up_to_128() {
        let t = |d: DType, h: usize| TensorType::new(d, vec![2, 16, h]);
        assert!(template_runs(&t(DType::Bf16, 64), &t(DType::Bf16, 64), &t(DType::Bf16, 64)));
        assert!(template_runs(&t(DType::F16, 128), &t(DType::F16, 128), &t(DType::F16, 128)));
        assert!(template_runs(&t(DType::F32, 64), &t(DType::F32, 64), &t(DType::F32, 64)));
        assert!(template_runs(&t(DType::F32, 12), &t(DType::F32, 12), &t(DType::F32, 12)));
        assert!(!template_runs(&t(DType::F32, 6), &t(DType::F32, 6), &t(DType::F32, 6)));
        assert!(!template_runs(&t(DType::Bf16, 12), &t(DType::Bf16, 12), &t(DType::Bf16, 12)));
        assert!(!template_runs(&t(DType::Bf16, 256), &t(DType::Bf16, 256), &t(DType::Bf16, 256)));
    }
}
