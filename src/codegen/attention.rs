//! Code generation for the `attention` template: a plan kernel whose body is one
//! `attention(q, k, v, scale, causal)` or `attention_bias(q, k, v, bias, scale, causal)` (or
//! their dropout forms, `attention_dropout` and `attention_bias_dropout`: `EQ_DROPOUT`, the seed
//! a literal or an element of an i32 tensor in memory reached through views and slices), its
//! operands views of tensors in memory and its stored value the attention or a view of it,
//! becomes an instance of `kernels/attention.cu`.
//!
//! Views become strides: each of q, k, v, o is addressed as b0·S0 + b1·S1 + b2·S2 + row·SR + d
//! over at most three (merged) batch axes, so transposed heads (`transpose(reshape(x, [B, S, H,
//! D]), 1, 2)`) are read, and a transposed output written, in place; a slice is a view from an
//! element offset, added to the operand's pointer (q, k, v split from one `[B, S, 3E]`
//! projection, bf16 and f16 offsets multiples of 8). A bias is addressed as
//! b0·S0 + b1·S1 + b2·S2 + row·SR + col·SC over the same batch axes (stride 0 on the axes it is
//! broadcast along: a padding mask `[B, 1, 1, S]` is read in place, `EQ_BIAS`), or is two
//! constants selected by a bool mask so addressed (`EQ_BIAS_SEL`). What the template cannot run
//! exactly (a fused epilogue, a head axis that is not contiguous, a bf16 or f16 head or stride
//! that is not a multiple of 8, different query and value head sizes, heads over 128) is an error
//! naming the kernel, never an approximation. f32 operands run the template's CUDA-core path
//! (`EQ_F32`; any head size up to 128, 16-byte loads where the strides allow).
//!
//! A bf16 or f16 instance with a positive scale also carries the launch of the template's Hopper
//! path (`Launch::sm90a`): one source, whose `sm_90a` compile (on a 9.0 device) runs the wgmma
//! path and whose other compiles run the mma.sync path, each with its own block shape.

use crate::error::{Error, Result};
use crate::ir::infer::{infer, norm_axis, Fact};
use crate::ir::lang::{Kind, TensorLang};
use crate::ir::types::{DType, TensorType};
use crate::plan::{FusionPlan, Kernel, Template, TensorRef};

use super::{ArgRole, KernelArg, KernelSource, Launch};
use crate::ir::layout::{common_factors, contiguous, reshape_strides, Factored};

/// Query rows per block, key rows per tile, and warps per block (`kernels/attention.cu`).
pub const BLOCK_M: usize = 128;
pub const BLOCK_N: usize = 64;
pub const WARPS: usize = 4;
/// The largest head size the template keeps in registers.
pub const MAX_HEAD: usize = 128;

/// The shared memory a block of the template uses for head size `d` (bytes).
pub fn smem_bytes(d: usize) -> usize {
    let dp = d.div_ceil(64) * 64;
    (BLOCK_M + 4 * BLOCK_N) * dp * 2
}

/// The Hopper path (`kernels/attention.cu` on sm_90a, wgmma): warpgroups per block (64 query
/// rows each) and keys per tile. 64 keys let heads up to 64 run two blocks per SM (128
/// registers a thread), which measured 0.40 ms on the attention example where 128 keys and one
/// block per SM took 0.51 ms (benches/results/2026-11-22-h100-1c9eca3-attnfwd).
pub const HOPPER_WARPGROUPS: usize = 2;
pub const HOPPER_BLOCK_M: usize = 64 * HOPPER_WARPGROUPS;
pub const HOPPER_BLOCK_N: usize = 64;

/// The shared memory a block of the Hopper path uses for head size `d` (bytes): the query
/// tile, two buffers each of keys and values, and 1024 bytes to align them for the swizzle.
pub fn hopper_smem_bytes(d: usize) -> usize {
    let dp = d.div_ceil(64) * 64;
    (HOPPER_BLOCK_M + 4 * HOPPER_BLOCK_N) * dp * 2 + 1024
}

/// Whether an instance carries the Hopper path (`Launch::sm90a`, taken on a 9.0 device): every
/// bf16 and f16 instance of a positive scale (its softmax takes row maxima of the unscaled
/// scores), with a bias or dropout or neither; the others keep the mma.sync path everywhere.
/// The cost model asks the same, to time the others at the portable path's rate.
pub fn hopper_path(dtype: DType, scale: f64) -> bool {
    dtype != DType::F32 && (scale * std::f64::consts::LOG2_E) as f32 > 0.0
}

/// The f32 path (`kernels/attention.cu`, `EQ_F32`, CUDA cores): register tiles as in a
/// CUDA-core gemm. A block of `F32_BLOCK_M` query rows and `F32_THREADS` threads (16 row groups
/// of `F32_ROW_THREADS`) walks key tiles of [`f32_block_n`] keys; a thread holds 4 rows x
/// [`f32_thread_keys`] keys of scores and its 4 rows' output over an eighth of the head. The
/// kernel it replaced (each row's keys split over 4 threads of a 32-row block, one shared-memory
/// read a 4 fmas) ran [128, 1024, 64] in 1421 us on an H100
/// (benches/results/2026-11-22-h100-6d005bd-f32att); this one 771.5 us on [8, 12, 1024, 64]
/// (benches/results/2026-11-27-h100-session15).
pub const F32_BLOCK_M: usize = 64;
/// Threads per block of the f32 path.
pub const F32_THREADS: usize = 128;
/// Threads a query row's scores are spread over (consecutive lanes of a warp): with 8, every
/// shared-memory read of a warp is one wavefront.
pub const F32_ROW_THREADS: usize = 8;
/// Keys a thread holds per tile, by padded head size: 8 (64-key tiles) up to 64, 4 (32-key
/// tiles) over it, so that two blocks' shared memory fits an SM for every head up to 128.
pub const fn f32_thread_keys(d: usize) -> usize {
    if f32_head(d) <= 64 {
        8
    } else {
        4
    }
}

/// Keys per tile of the f32 path for head size `d`.
pub const fn f32_block_n(d: usize) -> usize {
    F32_ROW_THREADS * f32_thread_keys(d)
}

/// The head size the f32 path pads rows to (a multiple of 4 floats: 16-byte reads).
pub const fn f32_head(d: usize) -> usize {
    d.div_ceil(4) * 4
}

/// The steps a thread of the f32 path runs over `sk` keys of head size `d`, as the cost model
/// counts them (one step: one fma of the scores, and one of the output beside it): 4 rows x
/// [`f32_thread_keys`] keys x the padded head per key tile, that is keys x head / 2 over whole
/// tiles.
pub fn f32_steps(sk: usize, d: usize) -> usize {
    let bn = f32_block_n(d);
    sk.div_ceil(bn) * bn * f32_head(d) * 4 / F32_ROW_THREADS
}

/// The shared memory a block of the f32 path uses for head size `d` (bytes): the query tile,
/// two buffers each of the key and value tiles (rows of the padded head plus 4 floats) and the
/// probability tile (rows of the tile's keys plus `F32_ROW_THREADS` floats).
pub fn smem_bytes_f32(d: usize) -> usize {
    let (rows, bn) = (F32_BLOCK_M + 4 * f32_block_n(d), f32_block_n(d));
    (rows * (f32_head(d) + 4) + F32_BLOCK_M * (bn + F32_ROW_THREADS)) * 4
}

/// Whether the template runs attention over queries, keys and values of these types (storage
/// type, equal head sizes, head size): the pattern rules recognise attention, and the planner
/// keeps a written one whole, only where this holds (the operands' strides are codegen's to check).
pub fn template_runs(q: &TensorType, k: &TensorType, v: &TensorType) -> bool {
    let (Some(&d), Some(&dk), Some(&dv)) = (q.shape.last(), k.shape.last(), v.shape.last()) else { return false };
    let tensor_cores = q.dtype != DType::F32;
    matches!(q.dtype, DType::Bf16 | DType::F16 | DType::F32)
        && q.dtype == k.dtype
        && q.dtype == v.dtype
        && d == dk
        && d == dv
        && d > 0
        && d <= MAX_HEAD
        && (!tensor_cores || d % 8 == 0)
}

pub(super) fn unsupported(k: &Kernel, what: impl std::fmt::Display) -> Error {
    Error::Invalid(format!("kernel {} (attention): {what}", k.id))
}

/// A tensor in memory seen through views and slices: which read, its shape, its layout in
/// elements (an axis may be several factors: the heads of grouped-query keys,
/// `reshape(broadcast(k))`), from element `offset` of the read (a slice's start: q, k and v
/// split from one projection `[B, S, 3E]` are read in place).
#[derive(Clone, Debug)]
pub(super) struct Strided {
    pub(super) read: usize,
    pub(super) shape: Vec<usize>,
    pub(super) layout: Factored,
    pub(super) offset: usize,
}

/// The pointer expression of a view's first element: parameter `p_r{read}`, moved by the
/// element offset (a constant of the generated source, as the strides are).
pub(super) fn pointer(read: usize, offset: usize) -> String {
    match offset {
        0 => format!("p_r{read}"),
        off => format!("(p_r{read} + {off}LL)"),
    }
}

/// The value of a constant subexpression (a literal, or a pointwise op of literals).
fn const_value(body: &[TensorLang], i: usize) -> Option<f64> {
    match &body[i] {
        TensorLang::Num(n) => Some(n.value()),
        TensorLang::Op(code, ch) => {
            let c = |k: usize| ch.get(k).and_then(|&c| const_value(body, usize::from(c)));
            match code.kind() {
                Kind::Unary(u) => Some(crate::ir::scalar::unary(u, c(0)?)),
                Kind::Binary(b) if !b.is_comparison() => Some(crate::ir::scalar::binary(b, c(0)?, c(1)?, false)),
                _ => None,
            }
        }
        _ => None,
    }
}

/// A kernel's body with the facts (types, constants) of its nodes: what the attention kernels
/// (forward and backward) resolve their operands' views through.
pub(super) struct Body<'a> {
    k: &'a Kernel,
    pub(super) nodes: &'a [TensorLang],
    pub(super) facts: Vec<Fact>,
}

impl<'a> Body<'a> {
    pub(super) fn new(k: &'a Kernel) -> Result<Body<'a>> {
        let nodes = k.body.as_ref();
        let mut facts: Vec<Fact> = Vec::with_capacity(nodes.len());
        for (i, node) in nodes.iter().enumerate() {
            let fact = match node {
                TensorLang::Num(n) => Fact::constant(n.value()),
                TensorLang::Dims(d) => Fact::dims(d.0.clone()),
                TensorLang::Type(t) => Fact::dtype(*t),
                TensorLang::Var(s) => {
                    let r = k.reads.iter().find(|r| r.name == s.as_str()).ok_or_else(|| {
                        unsupported(k, format!("the body uses `{s}`, which the kernel does not read"))
                    })?;
                    Fact::tensor(r.ty.clone())
                }
                TensorLang::Op(code, ch) => {
                    let args: Vec<&Fact> = ch.iter().map(|&c| &facts[usize::from(c)]).collect();
                    let inferred = infer(*code, &args).map_err(|e| unsupported(k, e))?;
                    let mut f = Fact::tensor(inferred.ty);
                    f.weak = inferred.weak;
                    f.konst = const_value(nodes, i);
                    f
                }
            };
            facts.push(fact);
        }
        Ok(Body { k, nodes, facts })
    }

    pub(super) fn ty(&self, i: usize) -> Result<&TensorType> {
        self.facts[i].ty.as_ref().ok_or_else(|| unsupported(self.k, "an attribute used as a tensor"))
    }

    pub(super) fn children(&self, i: usize) -> Vec<usize> {
        match &self.nodes[i] {
            TensorLang::Op(_, ch) => ch.iter().map(|&c| usize::from(c)).collect(),
            _ => vec![],
        }
    }

    pub(super) fn kind(&self, i: usize) -> Option<Kind> {
        self.nodes[i].opcode().map(|c| c.kind())
    }

    fn axis(&self, i: usize, rank: usize) -> Result<usize> {
        let a = self.facts[i]
            .konst
            .ok_or_else(|| unsupported(self.k, "the axis of a transpose or concatenation must be a constant"))?;
        norm_axis(a as i64, rank).map_err(|e| unsupported(self.k, e))
    }

    /// The operand `i` as strides over a read tensor from an element offset (views and slices),
    /// recording the nodes it passes.
    pub(super) fn operand(&self, i: usize, seen: &mut Vec<usize>) -> Result<Strided> {
        seen.push(i);
        match (&self.nodes[i], self.kind(i)) {
            (TensorLang::Var(s), _) => {
                let read = self.k.reads.iter().position(|r| r.name == s.as_str()).unwrap_or(0);
                let shape = self.k.reads[read].ty.shape.clone();
                Ok(Strided { read, layout: Factored::contiguous(&shape), shape, offset: 0 })
            }
            (_, Some(Kind::Slice)) => {
                let ch = self.children(i);
                let x = self.operand(ch[0], seen)?;
                seen.extend_from_slice(&ch[1..]);
                let c = |j: usize| {
                    self.facts[ch[j]].konst.ok_or_else(|| unsupported(self.k, "a slice's bounds must be constants"))
                };
                let axis = norm_axis(c(1)? as i64, x.shape.len()).map_err(|e| unsupported(self.k, e))?;
                let step = c(4)? as i64;
                let (start, len) = crate::ir::infer::slice_range(x.shape[axis], c(2)? as i64, c(3)? as i64, step)
                    .map_err(|e| unsupported(self.k, e))?;
                // The sliced axis must be one stride (not the heads of a broadcast merged with
                // others): its elements from `start` on are then `step` strides apart.
                let mut layout = x.layout;
                let stride = match layout.axes[axis].as_slice() {
                    [] => 0,
                    [(_, s)] => *s,
                    _ => return Err(unsupported(self.k, "a slice along an axis that is no single stride")),
                };
                layout.shape[axis] = len;
                layout.axes[axis] = if len > 1 { vec![(len, stride * step as usize)] } else { vec![] };
                let shape = self.ty(i)?.shape.clone();
                Ok(Strided { read: x.read, shape, layout, offset: x.offset + start * stride })
            }
            (_, Some(kind @ (Kind::Transpose | Kind::Reshape | Kind::Broadcast))) => {
                let ch = self.children(i);
                let x = self.operand(ch[0], seen)?;
                seen.extend_from_slice(&ch[1..]);
                let shape = self.ty(i)?.shape.clone();
                let layout = match kind {
                    Kind::Transpose => {
                        let (a, b) = (self.axis(ch[1], x.shape.len())?, self.axis(ch[2], x.shape.len())?);
                        x.layout.transpose(a, b)
                    }
                    Kind::Broadcast => x.layout.broadcast(&shape),
                    _ => x
                        .layout
                        .reshape(&shape)
                        .ok_or_else(|| unsupported(self.k, "a reshape of a transposed operand moves its elements"))?,
                };
                Ok(Strided { read: x.read, shape, layout, offset: x.offset })
            }
            _ => Err(unsupported(
                self.k,
                format!(
                    "the operands of attention must be tensors in memory or views and slices of them, not `{}`",
                    self.nodes[i].head()
                ),
            )),
        }
    }

    /// The bias `i` of `attention_bias`: a tensor in memory or a view of one, or two constants
    /// selected by a bool mask in memory (`where(m, 0, FILL)`, a bool mask's bias), the constants
    /// rounded to the select's dtype; records the nodes it passes.
    pub(super) fn bias(&self, i: usize, seen: &mut Vec<usize>) -> Result<(Strided, Option<(f64, f64)>)> {
        if self.kind(i) != Some(Kind::Where) {
            return Ok((self.operand(i, seen)?, None));
        }
        let ch = self.children(i);
        let dtype = self.ty(i)?.dtype;
        let (Some(a), Some(b)) = (self.facts[ch[1]].konst, self.facts[ch[2]].konst) else {
            return Err(unsupported(
                self.k,
                "the template reads the bias from memory, or selects two constants by a bool mask in memory",
            ));
        };
        seen.push(i);
        let mut stack = vec![ch[1], ch[2]];
        while let Some(c) = stack.pop() {
            seen.push(c);
            stack.extend(self.children(c));
        }
        let mask = self.operand(ch[0], seen)?;
        // The select's shape is the mask's (its other operands are scalars).
        let shape = self.ty(i)?.shape.clone();
        let mask = Strided { layout: mask.layout.broadcast(&shape), shape, read: mask.read, offset: mask.offset };
        Ok((mask, Some((dtype.round(a), dtype.round(b)))))
    }

    /// The seed `i` of a dropout form: a literal (or constant subexpression) in `[0, 2^32)`, or
    /// one element of an i32 tensor in memory reached through views and slices (a seeds input's
    /// element `slice(seeds, 0, k, k + 1, 1)`, a reshape of it); records the nodes it passes.
    pub(super) fn seed(&self, i: usize, seen: &mut Vec<usize>) -> Result<DropSeed> {
        if let Some(seed) = crate::ir::infer::dropout_seed(&self.facts[i]).map_err(|e| unsupported(self.k, e))? {
            let mut stack = vec![i];
            while let Some(c) = stack.pop() {
                seen.push(c);
                stack.extend(self.children(c));
            }
            return Ok(DropSeed::Const(seed));
        }
        // (read, element offset, shape, strides) of the view at node `i`.
        let (read, offset, ..) = self.seed_view(i, seen)?;
        Ok(DropSeed::Read { read, offset })
    }

    fn seed_view(&self, i: usize, seen: &mut Vec<usize>) -> Result<(usize, usize, Vec<usize>, Vec<usize>)> {
        seen.push(i);
        let not_seed = || {
            unsupported(
                self.k,
                format!(
                    "the dropout seed must be a literal or an element of an i32 tensor in memory, not `{}`",
                    self.nodes[i].head()
                ),
            )
        };
        match (&self.nodes[i], self.kind(i)) {
            (TensorLang::Var(s), _) => {
                let read = self.k.reads.iter().position(|r| r.name == s.as_str()).ok_or_else(not_seed)?;
                let shape = self.k.reads[read].ty.shape.clone();
                Ok((read, 0, contiguous(&shape), shape))
            }
            (_, Some(Kind::Reshape)) => {
                let ch = self.children(i);
                let (read, offset, strides, shape) = self.seed_view(ch[0], seen)?;
                seen.push(ch[1]);
                let numel: usize = shape.iter().product();
                if numel != 1 && strides != contiguous(&shape) {
                    return Err(not_seed());
                }
                let to = self.ty(i)?.shape.clone();
                Ok((read, offset, contiguous(&to), to))
            }
            (_, Some(Kind::Slice)) => {
                let ch = self.children(i);
                let (read, offset, mut strides, mut shape) = self.seed_view(ch[0], seen)?;
                let c = |j: usize| self.facts[ch[j]].konst.ok_or_else(not_seed);
                seen.extend_from_slice(&ch[1..]);
                let axis = norm_axis(c(1)? as i64, shape.len()).map_err(|e| unsupported(self.k, e))?;
                let (start, len) = crate::ir::infer::slice_range(shape[axis], c(2)? as i64, c(3)? as i64, c(4)? as i64)
                    .map_err(|e| unsupported(self.k, e))?;
                let offset = offset + start * strides[axis];
                strides[axis] *= c(4)? as usize;
                shape[axis] = len;
                Ok((read, offset, strides, shape))
            }
            _ => Err(not_seed()),
        }
    }

    /// The dropout of a dropout form (`p` at child `at`, the seed at `at + 1` of node `att`),
    /// recording the nodes it passes.
    pub(super) fn dropout(&self, att: usize, at: usize, seen: &mut Vec<usize>) -> Result<DropInstance> {
        let ch = self.children(att);
        let p = self.facts[ch[at]]
            .konst
            .ok_or_else(|| unsupported(self.k, "the dropout probability must be a constant"))?;
        let mut stack = vec![ch[at]];
        while let Some(c) = stack.pop() {
            seen.push(c);
            stack.extend(self.children(c));
        }
        let seed = self.seed(ch[at + 1], seen)?;
        Ok(DropInstance {
            threshold: crate::reference::rng::dropout_threshold(p),
            scale: crate::reference::rng::dropout_scale(p),
            seed,
        })
    }

    /// Strides of the attention value `att` in the memory of the tensor stored from node `top`,
    /// which is `att` or views of it (inverted one at a time, from the stored tensor down).
    fn output(&self, top: usize, att: usize, seen: &mut Vec<usize>) -> Result<Vec<usize>> {
        match self.placed(top, &[att], seen)?.as_slice() {
            [(_, 0, strides)] => Ok(strides.clone()),
            _ => Err(unsupported(self.k, "the stored tensor holds attention other than once, whole")),
        }
    }

    /// Where the values `at` lie in the memory of the tensor stored from node `top`: each
    /// `(value, element offset, strides over the value's shape)`. `top` is one of them, or views
    /// and concatenations of them (a kernel writing its results straight into the tensor their
    /// consumers read: heads merged by `reshape(transpose(..))`, parts side by side along an
    /// axis), inverted one node at a time from the stored tensor down: a transpose swaps two
    /// strides, a reshape refactors them (`ir::layout::reshape_strides`), a concatenation's
    /// second operand starts as many elements further as its first spans along the axis.
    pub(super) fn placed(
        &self,
        top: usize,
        at: &[usize],
        seen: &mut Vec<usize>,
    ) -> Result<Vec<(usize, usize, Vec<usize>)>> {
        let mut out = Vec::new();
        let mut stack = vec![(top, 0usize, contiguous(&self.ty(top)?.shape))];
        while let Some((node, offset, strides)) = stack.pop() {
            if at.contains(&node) {
                out.push((node, offset, strides));
                continue;
            }
            seen.push(node);
            let ch = self.children(node);
            let shape = self.ty(node)?.shape.clone();
            let below = self.ty(ch[0])?.shape.clone();
            match self.kind(node) {
                Some(Kind::Transpose) => {
                    seen.extend_from_slice(&ch[1..]);
                    let (a, b) = (self.axis(ch[1], below.len())?, self.axis(ch[2], below.len())?);
                    let mut s = strides;
                    s.swap(a, b);
                    stack.push((ch[0], offset, s));
                }
                Some(Kind::Reshape) => {
                    seen.extend_from_slice(&ch[1..]);
                    let s = reshape_strides(&shape, &strides, &below)
                        .ok_or_else(|| unsupported(self.k, "a stored view that moves the elements it writes"))?;
                    stack.push((ch[0], offset, s));
                }
                Some(Kind::Concat) => {
                    seen.push(ch[2]);
                    let a = self.axis(ch[2], shape.len())?;
                    stack.push((ch[1], offset + below[a] * strides[a], strides.clone()));
                    stack.push((ch[0], offset, strides));
                }
                _ => {
                    return Err(unsupported(
                        self.k,
                        format!(
                            "the template writes its results or views of them; `{}` is a fused epilogue it does not generate",
                            self.nodes[node].head()
                        ),
                    ))
                }
            }
        }
        Ok(out)
    }
}

/// A bias of an instance: its read, its storage type, and its strides (three batch axes, the
/// row and the column; 0 along an axis it is broadcast along); with `select`, the read is a bool
/// mask and the bias the first value where it holds, the second elsewhere.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct BiasInstance {
    pub(super) read: usize,
    /// The element of the read the bias starts at (a slice's start; read by scalar loads).
    pub(super) offset: usize,
    pub(super) dtype: DType,
    pub(super) strides: [usize; 5],
    pub(super) select: Option<(f64, f64)>,
}

/// The batch axes of tensors of one rank `r` (each seen through a layout; the rows axis `r - 2`,
/// the columns `r - 1`): every tensor's factors cut at common bounds (grouped-query keys repeat
/// over the query heads of a group, stride 0), then extents of 1 dropped and neighbours
/// contiguous in every tensor merged, into at most three axes (outermost first, padded with 1).
pub(super) struct Batched {
    pub(super) batch: [usize; 3],
    /// Per tensor: the three batch strides, the row stride and the column stride.
    pub(super) strides: Vec<[usize; 5]>,
}

impl Batched {
    /// `check` sees the row and column strides and the batch strides (before merging) of every
    /// tensor, and refuses what its template cannot read.
    pub(super) fn new(
        k: &Kernel,
        layouts: &[&Factored],
        r: usize,
        check: impl Fn(&[[usize; 2]], &[Vec<usize>]) -> Result<()>,
    ) -> Result<Batched> {
        let one_stride = |l: &Factored, a: usize| match l.axes[a].as_slice() {
            [] => Ok(0),
            [(_, s)] => Ok(*s),
            _ => Err(unsupported(k, "an operand's rows, head or columns are not one stride")),
        };
        let mut all = vec![[0usize; 2]; layouts.len()];
        for (t, l) in layouts.iter().enumerate() {
            for (j, a) in [r - 2, r - 1].into_iter().enumerate() {
                all[t][j] = one_stride(l, a)?;
            }
        }
        let flats: Vec<Vec<(usize, usize)>> = layouts.iter().map(|l| l.flat(0..r - 2)).collect();
        let (extents, batch_strides) =
            common_factors(&flats).ok_or_else(|| unsupported(k, "the operands' batch axes have no common strides"))?;
        check(&all, &batch_strides)?;
        let nt = layouts.len();
        let mut axes: Vec<(usize, Vec<usize>)> = extents
            .iter()
            .enumerate()
            .filter(|&(_, &n)| n != 1)
            .map(|(a, &n)| (n, (0..nt).map(|t| batch_strides[t][a]).collect()))
            .collect();
        let mut i = axes.len();
        while i > 1 {
            i -= 1;
            let n = axes[i].0;
            if (0..nt).all(|t| axes[i - 1].1[t] == axes[i].1[t] * n) {
                let (_, inner) = axes.remove(i);
                axes[i - 1] = (axes[i - 1].0 * n, inner);
            }
        }
        if axes.len() > 3 {
            return Err(unsupported(k, "more than three batch axes that cannot be merged"));
        }
        while axes.len() < 3 {
            axes.insert(0, (1, vec![0; nt]));
        }
        let nb: usize = axes.iter().map(|a| a.0).product();
        if nb > 65535 {
            return Err(unsupported(k, format!("{nb} batch entries exceed the grid's 65535")));
        }
        let strides = (0..nt).map(|t| [axes[0].1[t], axes[1].1[t], axes[2].1[t], all[t][0], all[t][1]]).collect();
        Ok(Batched { batch: [axes[0].0, axes[1].0, axes[2].0], strides })
    }
}

/// Where the seed of an attention's dropout comes from.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum DropSeed {
    /// A literal seed.
    Const(u32),
    /// Element `offset` of read `read` (an i32 tensor), read at run time.
    Read { read: usize, offset: usize },
}

/// The dropout of attention's probabilities (its dropout forms): `dropout`'s threshold and scale
/// (`reference::rng`), and its seed.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct DropInstance {
    pub(super) threshold: u32,
    pub(super) scale: f32,
    pub(super) seed: DropSeed,
}

impl DropInstance {
    /// The `#define`s of the templates' dropout (`EQ_DROPOUT`): the threshold, the scale, and the
    /// seed (an expression: a literal, or the element of its read tensor, as a u32).
    pub(super) fn defines(&self) -> Vec<(&'static str, String)> {
        let seed = match self.seed {
            DropSeed::Const(s) => format!("{s}u"),
            DropSeed::Read { read, offset } => format!("((unsigned int)p_r{read}[{offset}])"),
        };
        vec![
            ("EQ_DROPOUT", "1".into()),
            ("EQ_DROP_THRESHOLD", format!("{}u", self.threshold)),
            ("EQ_DROP_SCALE", float_literal(self.scale as f64)),
            ("EQ_DROP_SEED", seed),
        ]
    }
}

/// The template instance of one kernel: every number the `#define` block needs.
#[derive(Clone, Debug, PartialEq)]
struct Instance {
    dtype: DType,
    d: usize,
    sq: usize,
    sk: usize,
    /// Merged batch axes (at most three, outermost first, padded with 1).
    batch: [usize; 3],
    /// Per tensor (q, k, v, o): the three batch strides and the row stride.
    strides: [[usize; 4]; 4],
    /// q, k, v: the read and the element offset each starts at.
    reads: [(usize, usize); 3],
    scale: f64,
    causal: bool,
    bias: Option<BiasInstance>,
    dropout: Option<DropInstance>,
}

/// Whether the template can run an attention kernel (its operands and stored view have strides
/// it takes, its types and head size are ones it runs); the reason otherwise. The planner asks
/// this of a kernel that stores a view of attention, so that it keeps only what codegen runs.
pub(crate) fn can_generate(k: &Kernel) -> Result<()> {
    instance(k).map(|_| ())
}

/// How a forward attention kernel reads its bias tensor (none without one, or where codegen
/// cannot run the kernel): the bytes of one bias element, the distance in bytes between the bias
/// values of neighbouring keys, how many scores (batch entries x query rows x keys) read a bias
/// value, and the bytes of the tensor the bias is read from. A tile reads a row's keys together,
/// so a column stride past one element touches more 32-byte sectors than the values it uses
/// (T5's position bias permuted from `[S, S, H]`: twelve times as many).
pub(crate) fn bias_reads(k: &Kernel) -> Option<(usize, usize, u64, u64)> {
    let inst = instance(k).ok()?;
    let b = inst.bias.as_ref()?;
    let size = b.dtype.size();
    let scores = inst.batch.iter().product::<usize>() as u64 * inst.sq as u64 * inst.sk as u64;
    Some((size, b.strides[4] * size, scores, k.reads.get(b.read)?.ty.bytes()))
}

fn instance(k: &Kernel) -> Result<Instance> {
    let body = Body::new(k)?;
    let atts: Vec<(usize, crate::ir::lang::AttnSlots)> = (0..body.nodes.len())
        .filter_map(|i| match body.kind(i) {
            Some(Kind::Composite(c)) => c.attention_slots().map(|s| (i, s)),
            _ => None,
        })
        .collect();
    let &[(att, slots)] = atts.as_slice() else {
        return Err(unsupported(
            k,
            format!("the body holds {} attention operators, the template runs one", atts.len()),
        ));
    };
    let ch = body.children(att);
    let (scale_at, causal_at) = (ch[slots.scale], ch[slots.causal]);
    let mut seen = vec![att, scale_at, causal_at];
    let ops: Vec<Strided> = ch[..3].iter().map(|&c| body.operand(c, &mut seen)).collect::<Result<_>>()?;
    let (bias, select) = match slots.bias {
        Some(b) => {
            let (x, select) = body.bias(ch[b], &mut seen)?;
            (Some(x), select)
        }
        None => (None, None),
    };
    let dropout = match slots.dropout {
        Some(at) => Some(body.dropout(att, at, &mut seen)?),
        None => None,
    };
    let scale = body.facts[scale_at].konst.ok_or_else(|| unsupported(k, "the scale must be a constant"))?;
    let causal =
        body.facts[causal_at].konst.ok_or_else(|| unsupported(k, "the causal flag must be a constant"))? != 0.0;
    if !scale.is_finite() {
        return Err(unsupported(k, format!("the scale {scale} is not finite")));
    }
    // Constant subexpressions of the scale.
    let mut stack = vec![scale_at];
    while let Some(i) = stack.pop() {
        seen.push(i);
        stack.extend(body.children(i));
    }
    if k.stores.len() != 1 {
        return Err(unsupported(k, format!("the template writes one tensor, the kernel writes {}", k.stores.len())));
    }
    let ost = body.output(usize::from(k.stores[0]), att, &mut seen)?;
    if let Some(extra) = (0..body.nodes.len()).find(|i| !seen.contains(i)) {
        return Err(unsupported(
            k,
            format!("`{}` is fused into the kernel, but the template runs attention alone", body.nodes[extra].head()),
        ));
    }

    let oty = body.ty(att)?.clone();
    let dtype = oty.dtype;
    if !matches!(dtype, DType::Bf16 | DType::F16 | DType::F32) {
        return Err(unsupported(k, format!("the template runs f32, bf16 and f16 attention, not {dtype}")));
    }
    let tensor_cores = dtype != DType::F32;
    let r = oty.rank();
    let (sq, d, sk) = (ops[0].shape[r - 2], ops[0].shape[r - 1], ops[1].shape[r - 2]);
    let dv = ops[2].shape[r - 1];
    if dv != d {
        return Err(unsupported(k, format!("query head size {d} and value head size {dv} differ")));
    }
    if d == 0 || d > MAX_HEAD || (tensor_cores && d % 8 != 0) {
        return Err(unsupported(k, format!("head size {d} is not a multiple of 8 up to {MAX_HEAD}")));
    }
    if sk == 0 {
        return Err(unsupported(k, "attention over zero keys"));
    }
    if k.writes[0].ty.dtype != dtype || ops.iter().any(|o| k.reads[o.read].ty.dtype != dtype) {
        return Err(unsupported(k, "the operands and the output must share one storage type"));
    }
    // The rows and the head (the bias: the rows and the columns): one stride each. The batch
    // axes: every tensor's factors cut at common bounds (grouped-query keys repeat over the query
    // heads of a group, stride 0), then extents of 1 dropped and neighbours contiguous in all
    // four tensors (five with a bias) merged.
    let out_layout = Factored::of_strides(&oty.shape, &ost);
    let mut layouts = vec![&ops[0].layout, &ops[1].layout, &ops[2].layout, &out_layout];
    let bias_layout = match &bias {
        Some(b) => {
            let mut scores = ops[0].shape.clone();
            scores[r - 1] = sk;
            if b.shape.len() > r || crate::ir::infer::broadcast_shapes(&b.shape, &scores).ok() != Some(scores.clone()) {
                return Err(unsupported(k, "the bias does not broadcast to the scores"));
            }
            Some(b.layout.broadcast(&scores))
        }
        None => None,
    };
    layouts.extend(bias_layout.as_ref());
    let batched = Batched::new(k, &layouts, r, |all, batch_strides| {
        for (t, s) in all[..4].iter().enumerate() {
            if s[1] != 1 && d > 1 {
                return Err(unsupported(k, "an operand without a contiguous head axis is not supported yet"));
            }
            if tensor_cores && (s[0] % 8 != 0 || batch_strides[t].iter().any(|&x| x % 8 != 0)) {
                return Err(unsupported(
                    k,
                    "bf16 and f16 operands need strides of multiples of 8 elements (16-byte loads)",
                ));
            }
            // (f32 operands load by 16 bytes only where strides and offsets allow, `EQ_FVEC`.)
            if tensor_cores && t < 3 && !ops[t].offset.is_multiple_of(8) {
                return Err(unsupported(
                    k,
                    format!(
                        "a bf16 or f16 operand read from element {} (a slice), not a multiple of 8 (16-byte loads)",
                        ops[t].offset
                    ),
                ));
            }
        }
        Ok(())
    })?;
    let mut strides = [[0; 4]; 4];
    for (t, row) in strides.iter_mut().enumerate() {
        row.copy_from_slice(&batched.strides[t][..4]);
    }
    let bias = match bias {
        Some(b) => {
            let dtype = k.reads[b.read].ty.dtype;
            let want = if select.is_some() { dtype == DType::Bool } else { dtype.is_float() };
            if !want {
                return Err(unsupported(
                    k,
                    format!("the template reads a bias of f32, bf16 or f16, or a bool mask, not {dtype}"),
                ));
            }
            Some(BiasInstance { read: b.read, offset: b.offset, dtype, strides: batched.strides[4], select })
        }
        None => None,
    };
    Ok(Instance {
        dtype,
        d,
        sq,
        sk,
        batch: batched.batch,
        strides,
        reads: [(ops[0].read, ops[0].offset), (ops[1].read, ops[1].offset), (ops[2].read, ops[2].offset)],
        scale,
        causal,
        bias,
        dropout,
    })
}

/// The C type of a tensor of `dtype` in the template.
pub(super) fn ctype(dtype: DType) -> &'static str {
    match dtype {
        DType::Bf16 => "eq_bf16",
        DType::F16 => "eq_f16",
        DType::Bool => "eq_bool",
        DType::I32 => "int",
        _ => "float",
    }
}

/// The C spelling of an f32 constant.
pub(super) fn float_literal(x: f64) -> String {
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

/// The row statistics a forward attention kernel writes beside its output: `attention_lse`'s
/// log-sum-exp (f32 `[.., SQ, 1]`, `EQ_LSE`) or, with `stats`, `attention_bias_lse`'s pairs
/// (f32 `[.., SQ, 2]`: the row maximum and the log of the row sum, `EQ_STATS`).
pub struct Lse<'a> {
    pub tensor: &'a TensorRef,
    pub stats: bool,
}

/// Renders an attention kernel of a plan; with `lse`, the kernel writes its scores' row
/// statistics into that tensor too ([`Lse`], its pointer the last parameter), listed first
/// among the writes of the file's header.
pub fn codegen(
    plan: &FusionPlan,
    k: &Kernel,
    lse: Option<Lse<'_>>,
    template_text: &str,
    common: &str,
) -> Result<KernelSource> {
    debug_assert_eq!(k.template, Template::Attention);
    let inst = instance(k)?;
    let name = format!("attention_{}_k{}", inst.dtype, k.id);
    let ctype = ctype(inst.dtype);
    let nb: usize = inst.batch.iter().product();
    let f32 = inst.dtype == DType::F32;
    let (rows, threads, smem) = if f32 {
        (F32_BLOCK_M, F32_THREADS, smem_bytes_f32(inst.d))
    } else {
        (BLOCK_M, WARPS * 32, smem_bytes(inst.d))
    };
    let grid = [inst.sq.div_ceil(rows) as u32, nb as u32, 1];
    let block = [threads as u32, 1, 1];
    let smem = smem as u32;
    let hopper = hopper_path(inst.dtype, inst.scale);
    let sm90a = hopper.then(|| {
        Box::new(Launch {
            grid: [inst.sq.div_ceil(HOPPER_BLOCK_M) as u32, nb as u32, 1],
            block: [(HOPPER_WARPGROUPS * 128) as u32, 1, 1],
            smem_bytes: hopper_smem_bytes(inst.d) as u32,
            persistent: false,
            wave: false,
            cluster: 0,
            sm90a: None,
        })
    });

    let mut params: Vec<String> = k
        .reads
        .iter()
        .enumerate()
        .map(|(i, r)| format!("const {}* __restrict__ p_r{i}", self::ctype(r.ty.dtype)))
        .collect();
    params.extend((0..k.writes.len()).map(|i| format!("{ctype}* __restrict__ p_w{i}")));
    let mut args = super::tensor_args(k, &Default::default());
    let mut shown = std::borrow::Cow::Borrowed(k);
    let stats = lse.as_ref().is_some_and(|l| l.stats);
    if stats && inst.bias.is_none() {
        return Err(unsupported(k, "the statistics of attention_bias_lse without a bias"));
    }
    if let Some(Lse { tensor: lse, .. }) = lse {
        params.push("float* __restrict__ p_lse".into());
        args.push(KernelArg {
            name: lse.name.clone(),
            role: ArgRole::Write,
            dtype: Some(lse.ty.dtype),
            shape: lse.ty.shape.clone(),
            bytes: lse.ty.bytes(),
            zeroed: false,
        });
        shown.to_mut().writes.insert(0, lse.clone());
    }

    let mut s = super::header(plan, &shown, "attention", &name, (grid, block), Some(smem));
    if let Some(h) = &sm90a {
        s.push_str(&format!(
            "// launch for sm_90a (the wgmma path): grid ({}, {}, {}), block ({}, {}, {}), dynamic shared memory {} bytes\n",
            h.grid[0], h.grid[1], h.grid[2], h.block[0], h.block[1], h.block[2], h.smem_bytes
        ));
    }
    let mut def = |n: &str, v: String| s.push_str(&format!("#define {n} {v}\n"));
    def("EQ_GENERATED", String::new());
    def("EQ_KERNEL", name.clone());
    def("EQ_T", ctype.into());
    def("EQ_BF16", u8::from(inst.dtype == DType::Bf16).to_string());
    def("EQ_D", inst.d.to_string());
    def("EQ_SQ", inst.sq.to_string());
    def("EQ_SK", inst.sk.to_string());
    def("EQ_NB", nb.to_string());
    def("EQ_NB1", inst.batch[1].to_string());
    def("EQ_NB2", inst.batch[2].to_string());
    def("EQ_CAUSAL", u8::from(inst.causal).to_string());
    def("EQ_LSE", u8::from(lse.is_some() && !stats).to_string());
    def("EQ_STATS", u8::from(stats).to_string());
    if lse.is_some() {
        def("EQ_LSEP", "p_lse".into());
    }
    def("EQ_F32", u8::from(f32).to_string());
    def("EQ_SCALE", float_literal(inst.scale));
    def("EQ_FK", f32_thread_keys(inst.d).to_string());
    def("EQ_FTC", F32_ROW_THREADS.to_string());
    def("EQ_FNT", F32_THREADS.to_string());
    def("EQ_FMINB", "2".into());
    def("EQ_SCALE_LOG2", float_literal(inst.scale * std::f64::consts::LOG2_E));
    def("EQ_BM", BLOCK_M.to_string());
    def("EQ_BN", BLOCK_N.to_string());
    def("EQ_NWARPS", WARPS.to_string());
    def("EQ_WGMMA", u8::from(hopper).to_string());
    def("EQ_HWG", HOPPER_WARPGROUPS.to_string());
    def("EQ_HBN", HOPPER_BLOCK_N.to_string());
    def("EQ_HMINB", if inst.d <= 64 { "2" } else { "1" }.into());
    for (t, tag) in ["Q", "K", "V", "O"].iter().enumerate() {
        for (j, suffix) in ["S0", "S1", "S2", "SR"].iter().enumerate() {
            def(&format!("EQ_{tag}_{suffix}"), format!("{}LL", inst.strides[t][j]));
        }
    }
    def("EQ_PARAMS", params.join(", "));
    for (tag, (r, offset)) in ["Q", "K", "V"].iter().zip(inst.reads) {
        def(&format!("EQ_{tag}P"), pointer(r, offset));
        if offset > 0 {
            // (The f32 path's 16-byte loads need the offset aligned too.)
            def(&format!("EQ_{tag}_OFF"), format!("{offset}LL"));
        }
    }
    def("EQ_OP", "p_w0".into());
    if let Some(b) = &inst.bias {
        def("EQ_BIAS", "1".into());
        def("EQ_BT", self::ctype(b.dtype).into());
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
    for (n, v) in inst.dropout.iter().flat_map(|d| d.defines()) {
        def(n, v);
    }
    s.push_str("\n// ---- kernels/common.cuh ----\n");
    s.push_str(common);
    s.push_str("\n// ---- kernels/attention.cu ----\n");
    s.push_str(template_text);
    Ok(KernelSource {
        file: format!("{name}.cu"),
        name,
        kernel: k.id,
        template: Template::Attention,
        source: s,
        launch: Launch { grid, block, smem_bytes: smem, persistent: false, wave: false, cluster: 0, sm90a },
        cublaslt: None,
        args,
        scheduled_sums: false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn float_literals_are_c() {
        assert_eq!(float_literal(1.0), "1.0f");
        assert_eq!(float_literal(0.125 * std::f64::consts::LOG2_E), "0.18033688f");
    }

    #[test]
    fn shared_memory_per_head_size() {
        assert_eq!(smem_bytes(64), 49152);
        assert_eq!(smem_bytes(128), 98304);
        assert_eq!(smem_bytes(8), 49152);
        assert_eq!(hopper_smem_bytes(64), (128 + 4 * 64) * 64 * 2 + 1024);
        assert_eq!(hopper_smem_bytes(128), (128 + 4 * 64) * 128 * 2 + 1024);
        assert_eq!(hopper_smem_bytes(16), hopper_smem_bytes(64));
        // f32: the query tile, two buffers each of 64-key tiles (32-key past heads of 64) and
        // the probability tile.
        assert_eq!(smem_bytes_f32(64), ((64 + 4 * 64) * 68 + 64 * 72) * 4);
        assert_eq!(smem_bytes_f32(128), ((64 + 4 * 32) * 132 + 64 * 40) * 4);
        assert_eq!(smem_bytes_f32(8), ((64 + 4 * 64) * 12 + 64 * 72) * 4);
        assert_eq!(smem_bytes_f32(20), smem_bytes_f32(17));
        // Two blocks an SM for every head size (227 KiB of shared memory an SM, 1 KiB of it
        // reserved per block).
        assert!((1..=128).all(|d| 2 * (smem_bytes_f32(d) + 1024) <= 228 * 1024));
    }

    #[test]
    fn constants_fold() {
        let body: Vec<TensorLang> = vec![
            TensorLang::num(8.0),
            TensorLang::op(crate::ir::lang::OpCode::of(Kind::Unary(crate::ir::lang::Unary::Recip)), vec![0.into()]),
        ];
        assert_eq!(const_value(&body, 1), Some(0.125));
    }
}
