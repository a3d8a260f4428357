//! What code generation can run: the one interface between the planner (`autodiff`,
//! `frontend`, `cost`, `search`) and code generation. The planner asks here whether a kernel is
//! legal, the tile, lanes, staging and row caching it gets, where 1-bit masks go and which path
//! attention takes, and nothing else of codegen (`tests/layers.rs` checks). Every answer is the
//! function code generation itself generates with, so a plan's prediction and the generated
//! kernel decide alike.

use crate::error::Result;
use crate::ir::lang::Kind;
use crate::ir::types::{DType, TensorType};
use crate::plan::{Kernel, Template};

pub use super::cublaslt::LtCall;
pub use super::emit::{
    ClusterShape as RowCluster, ElementwiseReads, ReadTraffic, RowKeep, MAX_ROW_SMEM_BYTES, ROW_CACHE_PER_THREAD,
};
pub use super::gemm::{Tile as GemmTile, MAX_ROW_EPILOGUE as MAX_GEMM_ROW};
pub use super::{mask_refusal, MaskAccess, MaskSite};

/// Whether the attention template runs attention over queries, keys and values of these types
/// (the pattern rules recognise attention, and the planner keeps a written one whole, only
/// where this holds).
pub fn attention_runs(q: &TensorType, k: &TensorType, v: &TensorType) -> bool {
    super::attention::template_runs(q, k, v)
}

/// Whether the attention backward kernels run attention over queries, keys and values of these
/// types (the backward keeps its composites only where this holds).
pub fn attention_backward_runs(q: &TensorType, k: &TensorType, v: &TensorType) -> bool {
    super::attention_bwd::template_runs(q, k, v)
}

/// Whether an attention kernel of operands of `dtype` and softmax scale `scale` (with a bias,
/// dropout, both or neither) carries the Hopper path (taken on a 9.0 device); the others run the
/// portable path everywhere.
pub fn attention_hopper_path(dtype: DType, scale: f64) -> bool {
    super::attention::hopper_path(dtype, scale)
}

/// Query rows per block and keys per tile of attention's tensor-core paths (both the mma.sync and
/// the Hopper path), which the blocks of a causal attention walk up to their diagonal.
pub const ATTENTION_BLOCK: (usize, usize) = (super::attention::BLOCK_M, super::attention::BLOCK_N);
const _: () = assert!(
    super::attention::BLOCK_M == super::attention::HOPPER_BLOCK_M
        && super::attention::BLOCK_N == super::attention::HOPPER_BLOCK_N
);

/// Query rows per block and keys per tile of attention's f32 path (CUDA cores), heads up to 64:
/// the tile its step times are measured and priced by (heads over 64 walk 32-key tiles, their
/// steps counted by [`attention_f32_steps`]).
pub const ATTENTION_F32_BLOCK: (usize, usize) = (super::attention::F32_BLOCK_M, super::attention::f32_block_n(64));

/// The steps a thread of attention's f32 path runs over `sk` keys of head size `d`.
pub fn attention_f32_steps(sk: usize, d: usize) -> usize {
    super::attention::f32_steps(sk, d)
}

/// Whether the attention template runs a forward attention kernel; the reason otherwise.
pub fn attention_can_generate(k: &Kernel) -> Result<()> {
    super::attention::can_generate(k)
}

/// The 32-byte sectors a forward attention kernel's bias reads touch per byte they use (1 for a
/// bias contiguous along the keys, up to 32 / element size), the bytes of bias values its
/// scores read (a broadcast bias once per batch entry that reads it), and the bytes of the
/// tensor they come from; None without a bias.
pub fn attention_bias_traffic(k: &Kernel) -> Option<(f64, u64, u64)> {
    let (size, stride_bytes, scores, tensor) = super::attention::bias_reads(k)?;
    let per_value = stride_bytes.clamp(size, 32) as f64;
    Some((per_value / size as f64, scores * size as u64, tensor))
}

/// Whether the attention backward template runs a kernel of the backward's composites; the
/// reason otherwise.
pub fn attention_backward_can_generate(k: &Kernel) -> Result<()> {
    super::attention_bwd::can_generate(k)
}

/// Whether a scatter kernel writing `dtype` sums in an f32 accumulator of the output's shape (a
/// zeroed workspace, then converted into the output) rather than in the output itself.
pub fn scatter_accumulates(dtype: DType) -> bool {
    super::emit::scatter_accumulates(dtype)
}

/// Whether code generation runs a scatter kernel (a scatter_add with the pointwise body that
/// computes its values); the reason otherwise.
pub fn scatter_can_generate(k: &Kernel) -> Result<()> {
    super::lower::lower(k).map(|_| ())
}

/// Whether the generated gemm implementation runs a gemm kernel; the reason otherwise.
pub fn gemm_can_generate(k: &Kernel) -> Result<()> {
    super::gemm::can_generate(k)
}

/// The cuBLASLt call that runs a gemm kernel, where its form is one cuBLASLt runs.
pub fn cublaslt_call(k: &Kernel) -> Option<LtCall> {
    super::gemm::cublaslt_call(k)
}

/// Whether a gemm kernel's epilogue reduces rows (its row form).
pub fn gemm_reduces_rows(k: &Kernel) -> bool {
    super::gemm::reduces(k)
}

/// Whether an operator in a gemm kernel's body makes its epilogue the row form (the rule
/// [`gemm_reduces_rows`] applies to a kernel's body).
pub fn reduces_rows_op(kind: Kind) -> bool {
    super::lower::reduces_rows_op(kind)
}

/// The tile the generated gemm runs a product over `dom` of depth `k` in, and whether on the
/// tensor cores (operand dtypes `a`, `b`; `rows`: a row epilogue).
pub fn gemm_tile(dom: &[usize], k: usize, rows: bool, a: DType, b: DType, strict: bool) -> (GemmTile, bool) {
    super::gemm::kernel_tile(dom, k, rows, a, b, strict)
}

/// Elements per staged chunk of a gemm kernel's tensor-core operands (A, B); `None` when the
/// kernel does not lower.
pub fn gemm_staging(k: &Kernel) -> Option<(usize, usize)> {
    super::gemm::staging(k)
}

/// Where a row kernel over `rows` rows of `cols` elements keeps cached inputs of `sizes` bytes
/// an element (their storage types) at `vec` elements per access: in registers or shared
/// memory (read once; there pipelined or not), or nowhere (read by every pass).
pub fn row_keep(rows: usize, cols: usize, sizes: &[usize], vec: usize) -> RowKeep {
    super::emit::row_keep(rows, cols, sizes, vec)
}

/// The cluster of blocks a row kernel over `rows` rows of `cols` elements (cached inputs of
/// `sizes` bytes an element, `vec` elements an access) spreads each row over on a 9.0 device
/// (its Hopper path: each block's segment of the row in registers, the row's statistics
/// combined through distributed shared memory, so each element is read and written once);
/// `None` where the row stays in one block. Strict numerics, segmented rows and a gemm's row
/// epilogue never cluster (codegen asks those of the kernel first).
pub fn row_cluster(rows: usize, cols: usize, sizes: &[usize], vec: usize) -> Option<RowCluster> {
    super::emit::row_cluster(rows, cols, sizes, vec)
}

/// The segments the row template cuts each row of kernel `k` into (one block each, a last
/// block combining a row's partials; `kernels/rowreduce.cu`'s `EQ_SEGS`), under strict
/// numerics or not; 1 for one block a row.
pub fn row_segments(k: &Kernel, strict: bool) -> usize {
    super::emit::row_segments(k, strict)
}

/// Whether rows of `cols` elements, `rows` of them, are few and long enough that a row kernel
/// over them may be segmented ([`row_segments`] is 1 otherwise, whatever the kernel).
pub fn rows_may_segment(rows: usize, cols: usize) -> bool {
    super::emit::rows_may_segment(rows, cols)
}

/// The lane count (elements per access) of a kernel of `template` over an iteration space of
/// rank `rank` and last extent `last`, whose widest element accessed along it is `widest`
/// bytes (`packed_writes`: it stores a 1-bit mask).
pub fn vector_width(
    template: Template,
    rank: usize,
    last: usize,
    widest: usize,
    strict: bool,
    packed_writes: bool,
) -> usize {
    super::emit::lanes(template, rank, last, widest, strict, packed_writes)
}

/// How an elementwise kernel (or a plain row kernel) reads its inputs, as code generation
/// renders it: whether it takes the tiled path (transposed reads through a shared-memory tile),
/// its lanes and widest element along the last axis (its merged axes; the tiled path's one
/// lane), and each read that touches more 32-byte sectors than it uses, with the window in which
/// later warps use the rest; `None` for a kernel of another template or that does not lower.
pub fn elementwise_reads(k: &Kernel, strict: bool) -> Option<ElementwiseReads> {
    super::emit::elementwise_reads(k, strict)
}
