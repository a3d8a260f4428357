// gemm.cu: a matrix product with an arbitrary fused epilogue (the generated implementation of
// the gemm template; cuBLASLt runs the epilogues it has, see src/cublas.rs).
//
// Math: for each batch index z and each element (m, n) of the product,
//   P[z, m, n] = sum over k < EQ_K of A[z, m, k] * B[z, k, n]     (f32 accumulation)
// where A and B are views of tensors the kernel reads, indexed in place through strides
// (EQ_SAM, EQ_SAK, EQ_SBK, EQ_SBN and the batch offsets eq_a_batch / eq_b_batch), so a
// transposed or broadcast operand is never materialized. The epilogue is generated code that
// reads P as the pseudo-tensor `p_eq_product` (a tile in shared memory):
//   EQ_EPI_ROWS == 0: out = g(P, reads) element by element (the elementwise template's
//                     `eq_body<V>(EQ_ARGS, i0)`, i0 the flat index of the element);
//   EQ_EPI_ROWS == 1: row reductions then an epilogue over each whole row of P (the row
//                     template's eq_fetch / eq_accum / eq_finish / eq_epilogue functions), so a
//                     row softmax of a product no wider than one tile (EQ_BN >= EQ_N) is one kernel.
//
// Launch shape: one line of ceil(EQ_N / EQ_BN) x ceil(EQ_M / EQ_BM) x batch x EQ_SPLITS blocks, EQ_GEMM_THREADS
// threads. Split-K (EQ_SPLITS > 1, chosen for row epilogues whose tiles alone would leave most
// SMs idle): the EQ_SPLITS blocks of one output tile each sum an EQ_KSPAN-deep part of K (a
// whole number of slices) into a partial tile in the workspace `eq_split_ws` ([tile][split]
// [EQ_BM x EQ_BN] f32); the last to arrive (counted in `eq_split_count`, one per tile) adds the
// parts in split order and runs the epilogue alone.
// The block computes a EQ_BM x EQ_BN tile: thread (tx, ty) owns rows ty*EQ_TM + i and columns
// EQ_TCOL(tx, j) (groups of 4 or 2 adjacent columns where EQ_TN allows, for vector loads); each step stages a EQ_BK-deep slice of A (transposed) and B in shared
// memory, loading along whichever axis is contiguous in device memory, and loads the next
// slice into registers before computing on this one. The finished tile goes to
// shared memory (reusing the staging space) with row stride EQ_TS, and the epilogue reads it there.
//
// Tensor cores (EQ_MMA, 16-bit operands outside strict numerics, tiles the 8 warps' m16n8 grid
// covers): the same staging and epilogue, but the block's 8 warps compute the tile with mma.sync
// m16n8k16 (bf16 or f16 inputs, f32 accumulation) from raw 16-bit slices EQ_BK deep (32 for an
// elementwise epilogue; for a row epilogue 32 or 64 rows of the whole row, 64 or 128 deep); see
// the EQ_MMA block below.
//
// Invariants: operands are widened to f32 on load and every product element is a sum in
// increasing k order (under EQ_MMA: of 16-element groups, each summed by the tensor core; under
// EQ_SPLITS, each part so and the parts added in split order, never under strict numerics), so
// results are deterministic and do not depend on scheduling; `eq_split_count` is zero before
// and after every launch; elements outside [0, M) x [0, N) are
// computed as zero and never stored; every thread reaches every __syncthreads (a split block
// that is not its tile's last returns as a whole); EQ_TS is a
// multiple of 4 and tile columns start at multiples of EQ_BN, so the epilogue's vector loads
// of the tile are aligned; in the row form EQ_BN >= EQ_N, so a row is whole in one block.
#ifndef EQ_COMMON_CUH
#include "common.cuh"
#endif

#ifndef EQ_GENERATED
// Default instance: y = relu(a @ b + bias), a [64, 128] f32, b [128, 96] f32, bias [96].
#define EQ_KERNEL gemm_f32
#define EQ_KPARAMS const float* __restrict__ p_a, const float* __restrict__ p_b, \
    const float* __restrict__ p_bias, float* __restrict__ p_y
#define EQ_PARAMS const float* __restrict__ p_a, const float* __restrict__ p_b, \
    const float* __restrict__ p_bias, const float* __restrict__ p_eq_product, float* __restrict__ p_y
#define EQ_ARGS p_a, p_b, p_bias, p_eq_product, p_y
#define EQ_M 64
#define EQ_N 96
#define EQ_K 128
#define EQ_TA float
#define EQ_TB float
#define EQ_A p_a
#define EQ_B p_b
#define EQ_SAM 128
#define EQ_SAK 1
#define EQ_SBK 96
#define EQ_SBN 1
#define EQ_GEMM_THREADS 256
#define EQ_BM 64
#define EQ_BN 128
#define EQ_BK 16
#define EQ_TM 4
#define EQ_TN 8
#define EQ_TS 132
#define EQ_EPI_ROWS 0
#define EQ_VEC 4

__device__ __forceinline__ eq_idx eq_a_batch(eq_idx z) { return 0; }
__device__ __forceinline__ eq_idx eq_b_batch(eq_idx z) { return 0; }

template <int V>
__device__ __forceinline__ void eq_body(EQ_PARAMS, eq_idx i0) {
    const eq_idx c1 = i0 % EQ_N;
    const eq_idx c0 = i0 / EQ_N;
    float p[V], b[V], y[V];
    eq_loadv<float, V>(p_eq_product + c0 * EQ_TS + c1, p);
    eq_loadv<float, V>(p_bias + c1, b);
#pragma unroll
    for (int v = 0; v < V; ++v) y[v] = eq_relu(p[v] + b[v]);
    eq_storev<float, V>(p_y + i0, y);
}
#endif

// The product's own dtype: a bf16 or f16 product is rounded to it before the epilogue, as the
// program (and the reference) computes it.
#ifndef EQ_ROUND_PRODUCT
#define EQ_ROUND_PRODUCT(x) (x)
#endif
// Split-K (EQ_SPLITS blocks per output tile, each over EQ_KSPAN of K; see the fixup after the
// mainloop): the partial tiles stay f32 and only their sum is rounded.
#ifndef EQ_SPLITS
#define EQ_SPLITS 1
#endif
#if EQ_SPLITS > 1
#define EQ_TILE_ROUND(x) (x)
#else
#define EQ_TILE_ROUND(x) EQ_ROUND_PRODUCT(x)
#endif
#define EQ_TX (EQ_BN / EQ_TN)
// Staged element e of a step's A slice (EQ_BM rows by EQ_BK) or B slice (EQ_BN columns by
// EQ_BK): its row (column) and depth, consecutive e walking the axis contiguous in memory.
#define EQ_A_ROW(e) (EQ_SAK == 1 ? (e) / EQ_BK : (e) % EQ_BM)
#define EQ_A_DEPTH(e) (EQ_SAK == 1 ? (e) % EQ_BK : (e) / EQ_BM)
#define EQ_B_COL(e) (EQ_SBK == 1 ? (e) / EQ_BK : (e) % EQ_BN)
#define EQ_B_DEPTH(e) (EQ_SBK == 1 ? (e) % EQ_BK : (e) / EQ_BN)
#ifndef EQ_MMA
#define EQ_MMA 0
#endif
// The steps of a staged slice the mainloop walks: EQ_BK, or the product's own depth where it is
// shallower than one slice (rounded up to the tensor cores' 16), so that a product of depth 2
// takes 2 steps, not EQ_BK steps over zeros (`GemmTiles::steps` prices the same).
#if EQ_MMA
#define EQ_KSTEPS (EQ_K < EQ_BK ? (EQ_K + 15) / 16 * 16 : EQ_BK)
#else
#define EQ_KSTEPS (EQ_K < EQ_BK ? EQ_K : EQ_BK)
#endif
#if EQ_MMA
// Tensor-core mainloop (16-bit operands, EQ_MMA_F16 for f16 else bf16): the block's 8 warps
// form an EQ_WM x EQ_WN grid, warp (wm, wn) owning the EQ_WTM x EQ_WTN sub-tile at
// (wm * EQ_WTM, wn * EQ_WTN), as EQ_MI x EQ_NI mma.sync m16n8k16 tiles (f32 accumulators).
// A step stages the slices A[m0 .. m0+BM) x [k0 .. k0+BK) and B[k0 ..) x [n0 .. n0+BN) in
// shared memory as raw 16-bit values: A with k contiguous (rows of EQ_KP = BK + 8 elements, so
// the fragments' 32-bit loads of 8 rows by 4 lanes fall in 32 distinct banks); B likewise
// ("k-major", [n][k]) unless its columns are contiguous in memory (EQ_SBN == 1, the row-major
// weight of `x @ w`), where it is staged "n-major" ([k][n], rows of EQ_BNP = BN + 8, the same
// bank spread for ldmatrix's 8 rows of 16 bytes) and its fragments read with ldmatrix.trans.
// Each thread moves chunks of EQ_VA (EQ_VB) elements along the operand's contiguous axis: 8
// (one 16-byte load and store) where the code generator found that axis's extent, the other
// strides and the batch offsets multiples of 8 (so a chunk is wholly inside or outside the
// product and aligned, device buffers being whole allocations), else 1.
// The code generator defines EQ_WN (src/codegen/gemm.rs `warp_grid`); this default is the same
// grid on the tiles of elementwise epilogues.
#ifndef EQ_WN
#define EQ_WN (EQ_BN >= 128 ? 4 : (EQ_BN >= 64 ? 2 : 1))
#endif
#ifndef EQ_VA
#define EQ_VA 1
#endif
#ifndef EQ_VB
#define EQ_VB 1
#endif
#define EQ_WM ((EQ_GEMM_THREADS / 32) / EQ_WN)
#define EQ_WTM (EQ_BM / EQ_WM)
#define EQ_WTN (EQ_BN / EQ_WN)
#define EQ_MI (EQ_WTM / 16)
#define EQ_NI (EQ_WTN / 8)
#define EQ_KP (EQ_BK + 8)
#define EQ_BNP (EQ_BN + 8)
#define EQ_B_NMAJOR (EQ_SBK != 1 && EQ_SBN == 1)
#define EQ_B_HALVES (EQ_B_NMAJOR ? EQ_BK * EQ_BNP : EQ_BN * EQ_KP)
#define EQ_STAGE_FLOATS ((EQ_BM * EQ_KP + EQ_B_HALVES + 1) / 2)
// Staged chunk c of a step's A slice (B slice): the row (column) and depth of its first element,
// consecutive chunks walking the axis contiguous in memory (EQ_A_ROW etc. with chunks of one).
#define EQ_A_CROW(c) (EQ_SAK == 1 ? (c) / (EQ_BK / EQ_VA) : ((c) % (EQ_BM / EQ_VA)) * EQ_VA)
#define EQ_A_CDEPTH(c) (EQ_SAK == 1 ? ((c) % (EQ_BK / EQ_VA)) * EQ_VA : (c) / (EQ_BM / EQ_VA))
#define EQ_B_CCOL(c) (EQ_SBK == 1 ? (c) / (EQ_BK / EQ_VB) : ((c) % (EQ_BN / EQ_VB)) * EQ_VB)
#define EQ_B_CDEPTH(c) (EQ_SBK == 1 ? ((c) % (EQ_BK / EQ_VB)) * EQ_VB : (c) / (EQ_BN / EQ_VB))
#else
// CUDA-core staging: A transposed ([EQ_BK][EQ_BM + EQ_APAD]) and B ([EQ_BK][EQ_BN + EQ_BPAD]).
// A thread reads its EQ_TM rows of an A row as float4s when EQ_TM is a multiple of 4 (rows
// padded to a multiple of 4 floats), else one by one (rows padded by one float, so the
// transposing stores do not collide in one bank); its EQ_TN columns of B likewise, as float4s
// or float2s: thread tx owns columns EQ_TCOL(tx, j), groups of 4 (2) consecutive columns
// EQ_TX * 4 (* 2) apart, so a warp's vector loads cover consecutive 16-byte words.
#define EQ_APAD (EQ_TM % 4 == 0 ? 4 : 1)
#define EQ_BPAD (EQ_TN % 4 == 0 ? 4 : (EQ_TN % 2 == 0 ? 2 : 1))
#define EQ_TCOL(tx, j)                                                                                  \
    (EQ_TN % 4 == 0   ? ((j) / 4) * (EQ_TX * 4) + (tx) * 4 + (j) % 4                                    \
     : EQ_TN % 2 == 0 ? ((j) / 2) * (EQ_TX * 2) + (tx) * 2 + (j) % 2                                    \
                      : (tx) + (j) * EQ_TX)
#define EQ_STAGE_FLOATS (EQ_BK * (EQ_BM + EQ_APAD) + EQ_BK * (EQ_BN + EQ_BPAD))
#endif
#define EQ_TILE_FLOATS (EQ_BM * EQ_TS)
#define EQ_SMEM_FLOATS (EQ_STAGE_FLOATS > EQ_TILE_FLOATS ? EQ_STAGE_FLOATS : EQ_TILE_FLOATS)

#if EQ_EPI_ROWS
#define EQ_GROWS (EQ_GEMM_THREADS / EQ_ROW_THREADS)
#define EQ_GWARPS (EQ_ROW_THREADS > 32 ? EQ_ROW_THREADS / 32 : 1)

// Combines one stage's accumulators across the threads of a row (as rowreduce.cu does); every
// thread gets the first lane's result.
__device__ __forceinline__ void eq_gemm_row_combine(int s, float (&acc)[EQ_NACC], float (*red)[EQ_GWARPS][EQ_NACC],
                                                    int slot, int lane) {
    constexpr int width = EQ_ROW_THREADS < 32 ? EQ_ROW_THREADS : 32;
    const int wlane = threadIdx.x & 31;
#pragma unroll
    for (int off = width / 2; off > 0; off /= 2) {
        float other[EQ_NACC];
#pragma unroll
        for (int k = 0; k < EQ_NACC; ++k) other[k] = __shfl_xor_sync(0xffffffffu, acc[k], off);
        eq_merge(s, acc, other);
    }
#pragma unroll
    for (int k = 0; k < EQ_NACC; ++k) acc[k] = __shfl_sync(0xffffffffu, acc[k], wlane & ~(width - 1));
    if (EQ_GWARPS > 1) {
        const int warp = lane / 32;
        if (wlane == 0) {
#pragma unroll
            for (int k = 0; k < EQ_NACC; ++k) red[slot][warp][k] = acc[k];
        }
        __syncthreads();
#pragma unroll
        for (int k = 0; k < EQ_NACC; ++k) acc[k] = red[slot][0][k];
#pragma unroll
        for (int w = 1; w < EQ_GWARPS; ++w) eq_merge(s, acc, red[slot][w]);
        __syncthreads();
    }
}
#endif

#if EQ_MMA
static_assert(EQ_WM * EQ_WN * 32 == EQ_GEMM_THREADS && EQ_WTM % 16 == 0 && EQ_WTN % 8 == 0 && EQ_BK % 16 == 0,
              "the warp grid tiles the block tile with m16n8k16 products");
// d += a b on the tensor cores: a 16x16 (row-major fragment), b 16x8 (column-major), f32 d.
__device__ __forceinline__ void eq_mma16816(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
#if EQ_MMA_F16
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                 "{%0, %1, %2, %3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                 "{%0, %1, %2, %3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}
__device__ __forceinline__ unsigned eq_ld_pair(const unsigned short* p) { return *reinterpret_cast<const unsigned*>(p); }
// The B fragment (b0, b1) of one m16n8k16 product from an n-major slice: rows k .. k + 15 of 8
// columns, lanes 0..15 naming the rows (lanes 16..31 repeat them; ldmatrix .x2 ignores those).
__device__ __forceinline__ void eq_ldsm2t(unsigned& b0, unsigned& b1, const unsigned short* row) {
    unsigned addr;
    asm("{ .reg .u64 a; cvta.to.shared.u64 a, %1; cvt.u32.u64 %0, a; }" : "=r"(addr) : "l"(row));
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n" : "=r"(b0), "=r"(b1) : "r"(addr));
}
// A staged chunk of V 16-bit elements (V = 8: one 16-byte vector), loaded when `in`, else zero;
// stored to shared memory where its elements are contiguous.
template <int V> struct EqChunk { uint4 v; };
template <> struct EqChunk<1> { unsigned short v; };
template <typename T>
__device__ __forceinline__ void eq_ld_chunk(EqChunk<8>& c, const T* p, bool in) {
    c.v = in ? *reinterpret_cast<const uint4*>(p) : uint4{0u, 0u, 0u, 0u};
}
template <typename T>
__device__ __forceinline__ void eq_ld_chunk(EqChunk<1>& c, const T* p, bool in) {
    c.v = in ? p->bits : (unsigned short)0;
}
__device__ __forceinline__ void eq_st_chunk(unsigned short* d, const EqChunk<8>& c) { *reinterpret_cast<uint4*>(d) = c.v; }
__device__ __forceinline__ void eq_st_chunk(unsigned short* d, const EqChunk<1>& c) { *d = c.v; }
#endif

extern "C" __global__ void __launch_bounds__(EQ_GEMM_THREADS) EQ_KERNEL(EQ_KPARAMS) {
    __shared__ __align__(16) float eq_smem[EQ_SMEM_FLOATS];
    const int tid = threadIdx.x;
    // The grid is one line of blocks (y and z stop at 65535): column tiles fastest, then row
    // tiles, then batch entries and their splits, the order of a three-dimensional grid.
    constexpr eq_idx eq_nt = (EQ_N + EQ_BN - 1) / EQ_BN, eq_mt = (EQ_M + EQ_BM - 1) / EQ_BM;
    const eq_idx eq_bid = blockIdx.x;
    const eq_idx eq_zs = eq_bid / (eq_nt * eq_mt);
    const int eq_mi = (int)(eq_bid / eq_nt % eq_mt), eq_ni = (int)(eq_bid % eq_nt);
    // This block's batch index and its part [kb, ke) of the reduction depth.
#if EQ_SPLITS > 1
    const int split = (int)(eq_zs % EQ_SPLITS);
    const eq_idx z = eq_zs / EQ_SPLITS;
    const int kb = split * EQ_KSPAN;
    const int ke = kb + EQ_KSPAN < EQ_K ? kb + EQ_KSPAN : EQ_K;
#else
    const eq_idx z = eq_zs;
    constexpr int kb = 0, ke = EQ_K;
#endif
    const int m0 = eq_mi * EQ_BM;
    const int n0 = eq_ni * EQ_BN;
    const EQ_TA* __restrict__ pa = EQ_A + eq_a_batch(z);
    const EQ_TB* __restrict__ pb = EQ_B + eq_b_batch(z);

#if EQ_MMA
    unsigned short* as16 = reinterpret_cast<unsigned short*>(eq_smem);
    unsigned short* bs16 = as16 + EQ_BM * EQ_KP;
    const int warp = tid / 32, lane32 = tid % 32, g = lane32 / 4, t4 = lane32 % 4;
    const int wm = warp / EQ_WN, wn = warp % EQ_WN;
    float acc[EQ_MI][EQ_NI][4];
#pragma unroll
    for (int i = 0; i < EQ_MI; ++i)
#pragma unroll
        for (int j = 0; j < EQ_NI; ++j)
#pragma unroll
            for (int c = 0; c < 4; ++c) acc[i][j][c] = 0.0f;
    // As in the CUDA-core loop: each thread stages EQ_NA chunks of A and EQ_NB of B (raw 16-bit
    // values, zero past the product's edges), the next slice loaded before this one is used.
    static_assert(EQ_VA == 1 || (EQ_VA == 8 && EQ_SAK == 1), "A's chunks run along k");
    static_assert(EQ_VB == 1 || (EQ_VB == 8 && (EQ_SBK == 1 || EQ_SBN == 1)), "B's chunks run along a contiguous axis");
    constexpr int EQ_CA = EQ_BM * EQ_BK / EQ_VA, EQ_CB = EQ_BN * EQ_BK / EQ_VB;
    constexpr int EQ_NA = (EQ_CA + EQ_GEMM_THREADS - 1) / EQ_GEMM_THREADS;
    constexpr int EQ_NB = (EQ_CB + EQ_GEMM_THREADS - 1) / EQ_GEMM_THREADS;
    EqChunk<EQ_VA> ra[EQ_NA];
    EqChunk<EQ_VB> rb[EQ_NB];
    auto fetch = [&](int k0) {
#pragma unroll
        for (int i = 0; i < EQ_NA; ++i) {
            const int c = tid + i * EQ_GEMM_THREADS;
            const int gm = m0 + EQ_A_CROW(c), gk = k0 + EQ_A_CDEPTH(c);
            const bool in = c < EQ_CA && gm < EQ_M && gk < EQ_K;
            eq_ld_chunk(ra[i], pa + ((eq_idx)gm * EQ_SAM + (eq_idx)gk * EQ_SAK), in);
        }
#pragma unroll
        for (int i = 0; i < EQ_NB; ++i) {
            const int c = tid + i * EQ_GEMM_THREADS;
            const int gn = n0 + EQ_B_CCOL(c), gk = k0 + EQ_B_CDEPTH(c);
            const bool in = c < EQ_CB && gn < EQ_N && gk < EQ_K;
            eq_ld_chunk(rb[i], pb + ((eq_idx)gk * EQ_SBK + (eq_idx)gn * EQ_SBN), in);
        }
    };
    fetch(kb);
    for (int k0 = kb; k0 < ke; k0 += EQ_BK) {
#pragma unroll
        for (int i = 0; i < EQ_NA; ++i) {
            const int c = tid + i * EQ_GEMM_THREADS;
            if (c < EQ_CA) eq_st_chunk(as16 + EQ_A_CROW(c) * EQ_KP + EQ_A_CDEPTH(c), ra[i]);
        }
#pragma unroll
        for (int i = 0; i < EQ_NB; ++i) {
            const int c = tid + i * EQ_GEMM_THREADS;
            if (c < EQ_CB)
                eq_st_chunk(bs16 + (EQ_B_NMAJOR ? EQ_B_CDEPTH(c) * EQ_BNP + EQ_B_CCOL(c)
                                                : EQ_B_CCOL(c) * EQ_KP + EQ_B_CDEPTH(c)),
                            rb[i]);
        }
        __syncthreads();
        if (k0 + EQ_BK < ke) fetch(k0 + EQ_BK);
#pragma unroll
        for (int kk = 0; kk < EQ_KSTEPS; kk += 16) {
            unsigned a[EQ_MI][4], b[EQ_NI][2];
#pragma unroll
            for (int i = 0; i < EQ_MI; ++i) {
                const unsigned short* r = as16 + (wm * EQ_WTM + i * 16 + g) * EQ_KP + kk + 2 * t4;
                a[i][0] = eq_ld_pair(r);
                a[i][1] = eq_ld_pair(r + 8 * EQ_KP);
                a[i][2] = eq_ld_pair(r + 8);
                a[i][3] = eq_ld_pair(r + 8 * EQ_KP + 8);
            }
#pragma unroll
            for (int j = 0; j < EQ_NI; ++j) {
                if (EQ_B_NMAJOR) {
                    eq_ldsm2t(b[j][0], b[j][1], bs16 + (kk + (lane32 & 15)) * EQ_BNP + wn * EQ_WTN + j * 8);
                } else {
                    const unsigned short* c = bs16 + (wn * EQ_WTN + j * 8 + g) * EQ_KP + kk + 2 * t4;
                    b[j][0] = eq_ld_pair(c);
                    b[j][1] = eq_ld_pair(c + 8);
                }
            }
#pragma unroll
            for (int i = 0; i < EQ_MI; ++i)
#pragma unroll
                for (int j = 0; j < EQ_NI; ++j) eq_mma16816(acc[i][j], a[i], b[j][0], b[j][1]);
        }
        __syncthreads();
    }
    // The finished tile, in shared memory with row stride EQ_TS (accumulator c of tile (i, j) of
    // lane (g, t4) is element (g + 8 (c / 2), 2 t4 + c % 2) of that 16 x 8 tile).
    float* tile = eq_smem;
#pragma unroll
    for (int i = 0; i < EQ_MI; ++i)
#pragma unroll
        for (int j = 0; j < EQ_NI; ++j)
#pragma unroll
            for (int c = 0; c < 4; ++c)
                tile[(wm * EQ_WTM + i * 16 + g + 8 * (c / 2)) * EQ_TS + wn * EQ_WTN + j * 8 + 2 * t4 + c % 2] =
                    EQ_TILE_ROUND(acc[i][j][c]);
    __syncthreads();
#else
    const int tx = tid % EQ_TX;
    const int ty = tid / EQ_TX;
    float (*as)[EQ_BM + EQ_APAD] = reinterpret_cast<float (*)[EQ_BM + EQ_APAD]>(eq_smem);
    float (*bs)[EQ_BN + EQ_BPAD] = reinterpret_cast<float (*)[EQ_BN + EQ_BPAD]>(eq_smem + EQ_BK * (EQ_BM + EQ_APAD));
    float acc[EQ_TM][EQ_TN];
#pragma unroll
    for (int i = 0; i < EQ_TM; ++i)
#pragma unroll
        for (int j = 0; j < EQ_TN; ++j) acc[i][j] = 0.0f;

    // Each thread stages EQ_NA elements of the A slice and EQ_NB of the B slice; the next
    // slice's loads are issued before this slice's arithmetic, so their latency overlaps it.
    constexpr int EQ_NA = (EQ_BM * EQ_BK + EQ_GEMM_THREADS - 1) / EQ_GEMM_THREADS;
    constexpr int EQ_NB = (EQ_BN * EQ_BK + EQ_GEMM_THREADS - 1) / EQ_GEMM_THREADS;
    float ra[EQ_NA], rb[EQ_NB];
    auto fetch = [&](int k0) {
#pragma unroll
        for (int i = 0; i < EQ_NA; ++i) {
            // Consecutive threads walk the axis that is contiguous in memory.
            const int e = tid + i * EQ_GEMM_THREADS;
            const int m = EQ_A_ROW(e);
            const int kk = EQ_A_DEPTH(e);
            const int gm = m0 + m, gk = k0 + kk;
            const bool in = e < EQ_BM * EQ_BK && gm < EQ_M && gk < EQ_K;
            ra[i] = in ? eq_val(pa[(eq_idx)gm * EQ_SAM + (eq_idx)gk * EQ_SAK]) : 0.0f;
        }
#pragma unroll
        for (int i = 0; i < EQ_NB; ++i) {
            const int e = tid + i * EQ_GEMM_THREADS;
            const int n = EQ_B_COL(e);
            const int kk = EQ_B_DEPTH(e);
            const int gn = n0 + n, gk = k0 + kk;
            const bool in = e < EQ_BN * EQ_BK && gn < EQ_N && gk < EQ_K;
            rb[i] = in ? eq_val(pb[(eq_idx)gk * EQ_SBK + (eq_idx)gn * EQ_SBN]) : 0.0f;
        }
    };
    fetch(kb);
    for (int k0 = kb; k0 < ke; k0 += EQ_BK) {
#pragma unroll
        for (int i = 0; i < EQ_NA; ++i) {
            const int e = tid + i * EQ_GEMM_THREADS;
            if (e < EQ_BM * EQ_BK) as[EQ_A_DEPTH(e)][EQ_A_ROW(e)] = ra[i];
        }
#pragma unroll
        for (int i = 0; i < EQ_NB; ++i) {
            const int e = tid + i * EQ_GEMM_THREADS;
            if (e < EQ_BN * EQ_BK) bs[EQ_B_DEPTH(e)][EQ_B_COL(e)] = rb[i];
        }
        __syncthreads();
        if (k0 + EQ_BK < ke) fetch(k0 + EQ_BK);
#pragma unroll
        for (int kk = 0; kk < EQ_KSTEPS; ++kk) {
            float a[EQ_TM], b[EQ_TN];
#if EQ_TM % 4 == 0
#pragma unroll
            for (int i = 0; i < EQ_TM; i += 4) {
                const float4 v = *reinterpret_cast<const float4*>(&as[kk][ty * EQ_TM + i]);
                a[i] = v.x, a[i + 1] = v.y, a[i + 2] = v.z, a[i + 3] = v.w;
            }
#else
#pragma unroll
            for (int i = 0; i < EQ_TM; ++i) a[i] = as[kk][ty * EQ_TM + i];
#endif
#if EQ_TN % 4 == 0
#pragma unroll
            for (int j = 0; j < EQ_TN; j += 4) {
                const float4 v = *reinterpret_cast<const float4*>(&bs[kk][EQ_TCOL(tx, j)]);
                b[j] = v.x, b[j + 1] = v.y, b[j + 2] = v.z, b[j + 3] = v.w;
            }
#elif EQ_TN % 2 == 0
#pragma unroll
            for (int j = 0; j < EQ_TN; j += 2) {
                const float2 v = *reinterpret_cast<const float2*>(&bs[kk][EQ_TCOL(tx, j)]);
                b[j] = v.x, b[j + 1] = v.y;
            }
#else
#pragma unroll
            for (int j = 0; j < EQ_TN; ++j) b[j] = bs[kk][EQ_TCOL(tx, j)];
#endif
#pragma unroll
            for (int i = 0; i < EQ_TM; ++i)
#pragma unroll
                for (int j = 0; j < EQ_TN; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
        }
        __syncthreads();
    }

    // The finished tile, in shared memory with row stride EQ_TS.
    float* tile = eq_smem;
#pragma unroll
    for (int i = 0; i < EQ_TM; ++i)
#pragma unroll
        for (int j = 0; j < EQ_TN; ++j) tile[(ty * EQ_TM + i) * EQ_TS + EQ_TCOL(tx, j)] = EQ_TILE_ROUND(acc[i][j]);
    __syncthreads();
#endif
#if EQ_SPLITS > 1
    // Split-K: the block stores its partial tile in its slot of the workspace, and the last of
    // the tile's EQ_SPLITS blocks to arrive (counted in eq_split_count after a fence) adds the
    // slots in split order, so the sum does not depend on which block is last, rounds it to the
    // product's dtype and runs the epilogue; the others are done. The last block also zeroes
    // the count for the next launch.
    {
        constexpr int area = EQ_BM * EQ_BN;
        const eq_idx tile_id = (z * eq_mt + eq_mi) * eq_nt + eq_ni;
        float* __restrict__ slots = eq_split_ws + tile_id * (eq_idx)(EQ_SPLITS * area);
        for (int e = tid * 4; e < area; e += EQ_GEMM_THREADS * 4) {
            const float* t = tile + (e / EQ_BN) * EQ_TS + e % EQ_BN;
            __stcg(reinterpret_cast<float4*>(slots + split * area + e), make_float4(t[0], t[1], t[2], t[3]));
        }
        __shared__ int eq_last;
        __threadfence();
        __syncthreads();
        if (tid == 0) {
            eq_last = atomicAdd(eq_split_count + tile_id, 1u) == EQ_SPLITS - 1;
            if (eq_last) eq_split_count[tile_id] = 0;
        }
        __syncthreads();
        if (!eq_last) return;
        __threadfence();
        // Every load of the sum is issued before its adds (both loops unrolled), so the parts
        // arrive in about one L2 latency; this block's own part is still in its tile.
        constexpr int iters = (area + EQ_GEMM_THREADS * 4 - 1) / (EQ_GEMM_THREADS * 4);
#pragma unroll
        for (int it = 0; it < iters; ++it) {
            const int e = (it * EQ_GEMM_THREADS + tid) * 4;
            if (e >= area) break;
            float* t = tile + (e / EQ_BN) * EQ_TS + e % EQ_BN;
            float4 part[EQ_SPLITS];
#pragma unroll
            for (int q = 0; q < EQ_SPLITS; ++q)
                part[q] = q == split ? make_float4(t[0], t[1], t[2], t[3])
                                     : __ldcg(reinterpret_cast<const float4*>(slots + q * area + e));
            float4 s = part[0];
#pragma unroll
            for (int q = 1; q < EQ_SPLITS; ++q) {
                s.x += part[q].x;
                s.y += part[q].y;
                s.z += part[q].z;
                s.w += part[q].w;
            }
            t[0] = EQ_ROUND_PRODUCT(s.x);
            t[1] = EQ_ROUND_PRODUCT(s.y);
            t[2] = EQ_ROUND_PRODUCT(s.z);
            t[3] = EQ_ROUND_PRODUCT(s.w);
        }
        __syncthreads();
    }
#endif
    // The epilogue indexes the product by (flat row, column); this pointer maps the block's
    // rows and columns onto its tile.
    const eq_idx row0 = z * (eq_idx)EQ_M + (eq_idx)m0;
    const float* __restrict__ p_eq_product = tile - ((long long)row0 * EQ_TS + n0);

#if EQ_EPI_ROWS
    __shared__ float red[EQ_GROWS][EQ_GWARPS][EQ_NACC];
    const int slot = tid / EQ_ROW_THREADS;
    const int lane = tid % EQ_ROW_THREADS;
    for (int r0 = 0; r0 < EQ_BM; r0 += EQ_GROWS) {
        const int m = m0 + r0 + slot;
        const bool active = r0 + slot < EQ_BM && m < EQ_M;
        const eq_idx row = z * (eq_idx)EQ_M + (eq_idx)m;
        EqRow rv;
        if (active) eq_row_init(EQ_ARGS, row, rv);
#pragma unroll
        for (int s = 0; s < EQ_STAGES; ++s) {
            float racc[EQ_NACC];
            eq_acc_init(s, racc);
#pragma unroll
            for (int c = 0; c < EQ_CHUNKS; ++c) {
                const eq_idx col0 = ((eq_idx)c * EQ_ROW_THREADS + lane) * EQ_VEC;
                if (active && col0 < (eq_idx)EQ_COLS) {
                    float cv[EQ_NCACHE][EQ_VEC];
                    eq_fetch(EQ_ARGS, row, col0, cv);
                    eq_accum(s, EQ_ARGS, row, col0, cv, rv, racc);
                }
            }
            eq_gemm_row_combine(s, racc, red, slot, lane);
            if (active) eq_finish(s, EQ_ARGS, row, racc, rv);
        }
        if (!active) continue;
#pragma unroll
        for (int c = 0; c < EQ_CHUNKS; ++c) {
            const eq_idx col0 = ((eq_idx)c * EQ_ROW_THREADS + lane) * EQ_VEC;
            if (col0 < (eq_idx)EQ_COLS) {
                float cv[EQ_NCACHE][EQ_VEC];
                eq_fetch(EQ_ARGS, row, col0, cv);
                eq_epilogue(EQ_ARGS, row, col0, cv, rv);
            }
        }
        if (lane == 0) eq_row_store(EQ_ARGS, row, rv);
    }
#elif defined(EQ_PACKED_WRITES)
    // The epilogue stores a 1-bit mask: every lane of a warp runs every step (the warp assembles
    // mask words from its lanes' bits, eq_put_bits). The code generator makes EQ_BN and EQ_N
    // multiples of 32 and EQ_BM * groups a multiple of 32, so the lanes of one word share a row
    // and start at a multiple of 32, and a warp's lanes agree on the trip count. A lane outside
    // the product computes on the block's first element and stores nothing.
    constexpr int groups = EQ_BN / EQ_VEC;
    static_assert(EQ_BN % 32 == 0 && EQ_N % 32 == 0 && (EQ_BM * groups) % 32 == 0, "mask words align to tile rows");
    for (int e = tid; e < EQ_BM * groups; e += EQ_GEMM_THREADS) {
        const int m = m0 + e / groups;
        const int n = n0 + (e % groups) * EQ_VEC;
        const bool ok = m < EQ_M && n < EQ_N;
        const eq_idx i0 = ok ? (z * (eq_idx)EQ_M + (eq_idx)m) * EQ_N + (eq_idx)n : row0 * EQ_N + (eq_idx)n0;
        eq_body<EQ_VEC>(EQ_ARGS, i0, ok);
    }
#else
    constexpr int groups = EQ_BN / EQ_VEC;
    for (int e = tid; e < EQ_BM * groups; e += EQ_GEMM_THREADS) {
        const int m = m0 + e / groups;
        const int n = n0 + (e % groups) * EQ_VEC;
        if (m < EQ_M && n < EQ_N) eq_body<EQ_VEC>(EQ_ARGS, (z * (eq_idx)EQ_M + (eq_idx)m) * EQ_N + (eq_idx)n);
    }
#endif
}
