// attention.cu: flash-style attention forward (FlashAttention-2 design) on tensor cores.
//
// Math: for every batch index b (the flattened batch axes) and query row i < EQ_SQ,
//   s_ij = scale * <q_bi, k_bj>            for key j < EQ_SK (j <= i when EQ_CAUSAL; others -inf)
//   o_bi = sum_j exp(s_ij - m_i) v_bj / l_i,   m_i = max_j s_ij,   l_i = sum_j exp(s_ij - m_i)
//   lse_bi = m_i + log(l_i)                (written only when EQ_LSE, as f32 [EQ_NB, EQ_SQ])
//   (m_i, log l_i)                         (EQ_STATS, with a bias: attention_bias_lse's f32
//                                           [EQ_NB, EQ_SQ, 2], natural units, -inf both for a
//                                           row whose every score is -inf)
// computed one key tile at a time with the online softmax: a row keeps its running max m and
// running sum l in registers; a new tile with row max m' rescales l and the output accumulator
// by exp(m - max(m, m')) before adding its own terms. Scores are kept in base-2 units
// (EQ_SCALE_LOG2 = scale * log2(e)), so every exponential is one ex2.approx. Products run on
// tensor cores (mma.sync m16n8k16, bf16 or f16 inputs, f32 accumulate); the probabilities are
// rounded to the storage type before the second product (as FlashAttention does). The score
// matrix exists only in registers, one EQ_BM x EQ_BN tile at a time, never in device memory.
//
// Launch shape: grid (ceil(EQ_SQ / EQ_BM), EQ_NB), block EQ_NWARPS * 32 threads, dynamic
// shared memory EQ_SMEM_BYTES = (EQ_BM + 4 * EQ_BN) * EQ_DP * 2 bytes: the query tile, and two
// buffers each of the key and value tiles (cp.async double buffering: tile j + 1 of the keys
// and tile j of the values load while tile j's scores and softmax run). Warp w owns query rows
// [32 w, 32 w + 32) of the block's tile (two m16 tiles). Under EQ_CAUSAL the block for the
// last query tile runs first (the longest), and key tiles wholly above the diagonal are skipped.
//
// Layout: every tensor is addressed as base + b0 * S0 + b1 * S1 + b2 * S2 + row * SR + d, with
// b = (b0 * EQ_NB1 + b1) * EQ_NB2 + b2 (strides per tensor: EQ_{Q,K,V,O}_{S0,S1,S2,SR}), so views
// (transposed or reshaped batch and sequence axes) are read and written in place. The head axis
// is contiguous, EQ_D is a multiple of 8 and every stride a multiple of 8 elements (16-byte
// cp.async), which the code generator checks. In shared memory a row holds EQ_DP = EQ_D rounded
// up to 64 elements (zero-filled past EQ_D), in 16-byte chunks placed at chunk ^ (row & 7), so
// ldmatrix and cp.async are free of bank conflicts.
//
// f32 operands (EQ_F32) take a CUDA-core path with the same math in full f32 (see below).
//
// Bias (EQ_BIAS, `attention_bias`): s_ij = scale * <q_bi, k_bj> + bias_bij, the bias of type
// EQ_BT addressed as EQ_BP + b0 * EQ_B_S0 + b1 * EQ_B_S1 + b2 * EQ_B_S2 + i * EQ_B_SR + j * EQ_B_SC
// (stride 0 along an axis it is broadcast along, so a padding mask [B, 1, 1, S] is read in
// place), or a bool mask there selecting one of two constants (EQ_BIAS_SEL), added in f32 (one
// fmaf) before the row maximum, in every path. With a bias the scores stay in natural units and
// each difference from the row maximum goes to base 2 on its own (2^((s - m) log2 e)): a bias
// near -FLT_MAX (a finfo.min fill) times log2 e would overflow to -inf, and a row of equal fills
// must get equal weights. Keys past EQ_SK and above the diagonal are -inf whatever the bias. A
// row whose every score is -inf (a bias of -inf on every key it keeps) has row sum 0 and is
// written as 0. Without EQ_BIAS the code is that of plain attention.
//
// Hopper: an instance with EQ_WGMMA (bf16 or f16, a positive scale) compiled for sm_90a (where
// __CUDA_ARCH_FEAT_SM90_ALL is defined) runs a wgmma path instead (see below), with its own
// launch shape (EQ_HWG warpgroups, EQ_HSMEM_BYTES); compiled for any other target the same
// source runs the mma.sync path. The runtime picks the sm_90a compile on a 9.0 device.
//
// Invariants: compiles with NVRTC and nothing but the architecture flag (sm_80 or later);
// rows past EQ_SQ and keys past EQ_SK are zero-filled on load and masked (keys) or not stored
// (rows); every thread reaches every __syncthreads; each output element is written exactly
// once; results do not depend on scheduling (no atomics, fixed reduction order).
#ifndef EQ_COMMON_CUH
#include "common.cuh"
#endif

#ifndef EQ_GENERATED
// Default instance: o = attention(q, k, v, 0.125, 0) over bf16 [8, 16, 2048, 64], contiguous.
#define EQ_KERNEL attention_bf16
#define EQ_T eq_bf16
#define EQ_BF16 1
#define EQ_D 64
#define EQ_SQ 2048
#define EQ_SK 2048
#define EQ_NB 128
#define EQ_NB1 16
#define EQ_NB2 1
#define EQ_CAUSAL 0
#define EQ_LSE 0
#define EQ_SCALE 0.125f
#define EQ_SCALE_LOG2 0.18033688011112042f
#define EQ_Q_S0 2097152LL
#define EQ_Q_S1 131072LL
#define EQ_Q_S2 0LL
#define EQ_Q_SR 64LL
#define EQ_K_S0 2097152LL
#define EQ_K_S1 131072LL
#define EQ_K_S2 0LL
#define EQ_K_SR 64LL
#define EQ_V_S0 2097152LL
#define EQ_V_S1 131072LL
#define EQ_V_S2 0LL
#define EQ_V_SR 64LL
#define EQ_O_S0 2097152LL
#define EQ_O_S1 131072LL
#define EQ_O_S2 0LL
#define EQ_O_SR 64LL
#define EQ_PARAMS                                                                                \
    const eq_bf16* __restrict__ p_q, const eq_bf16* __restrict__ p_k, const eq_bf16* __restrict__ p_v, \
        eq_bf16* __restrict__ p_o
#define EQ_QP p_q
#define EQ_KP p_k
#define EQ_VP p_v
#define EQ_OP p_o
#endif

#ifndef EQ_F32
#define EQ_F32 0
#endif

#ifndef EQ_BIAS
#define EQ_BIAS 0
#endif
#ifndef EQ_STATS
#define EQ_STATS 0
#endif
#if EQ_STATS && (EQ_LSE || !EQ_BIAS)
#error "EQ_STATS is attention_bias_lse's: a bias, and no log-sum-exp beside it"
#endif
#if EQ_BIAS
#if EQ_LSE
#error "the attention template writes no log-sum-exp beside a bias"
#endif
#ifndef EQ_BIAS_SEL
#define EQ_BIAS_SEL 0
#endif
// (eq_att_bias, the bias of a score, and eq_att_tile_bias, a tile's, are in common.cuh.)
#define EQ_BIAS_PARAM , const EQ_BT* __restrict__ bg
#define EQ_BIAS_ARG , bg
// A difference of natural-unit scores in base-2 units (the scores without a bias are already).
#define EQ_TO2(x) ((x) * 1.4426950408889634f)
#else
#define EQ_BIAS_PARAM
#define EQ_BIAS_ARG
#define EQ_TO2(x) (x)
#endif

#ifndef EQ_WGMMA
#define EQ_WGMMA 0
#endif

// Dropout (EQ_DROPOUT, `attention_dropout` and `attention_bias_dropout`): the probability of
// score (b, i, j) is kept where dropout's generator (common.cuh, src/reference/rng.rs) keeps
// flat index (b * EQ_SQ + i) * EQ_SK + j of the probabilities [EQ_NB, EQ_SQ, EQ_SK] (the batch
// axes' row-major order, which b is), with EQ_DROP_THRESHOLD and seed EQ_DROP_SEED (a literal,
// or an element of a read i32 tensor); the row sum l counts every probability, the output
// sums only the kept ones, and the output is scaled by EQ_DROP_SCALE (1 / (1 - p) in f32) with
// 1 / l. The log-sum-exp is that of the scores, as without dropout. Every path runs it
// (eq_att_keep and EQ_DROP_FACTOR are in common.cuh, shared with the backward): each thread
// computes the bit of each probability it holds from that probability's row and column.
#ifndef EQ_DROPOUT
#define EQ_DROPOUT 0
#endif
// The Hopper path's shape (used only where EQ_WGMMA and the target is sm_90a; defined for every
// target so that the host side of a launcher sees them): EQ_HWG warpgroups of 64 query rows
// each, EQ_HBN keys per tile (64 or 128), EQ_HDP = EQ_D rounded up to 64.
#ifndef EQ_HWG
#define EQ_HWG 2
#endif
#define EQ_HDP (((EQ_D + 63) / 64) * 64)
#ifndef EQ_HBN
#define EQ_HBN 64
#endif
// Blocks per SM the register allocation must allow (two for heads up to 64, where a thread's
// tiles fit in 128 registers: two blocks' four warpgroups overlap each other's softmax).
#ifndef EQ_HMINB
#define EQ_HMINB (EQ_HDP <= 64 ? 2 : 1)
#endif
// Shared-memory buffers (stages) of the key and value tiles: loads run EQ_HST - 1 tiles ahead.
#ifndef EQ_HST
#define EQ_HST 2
#endif
#define EQ_HBM (64 * EQ_HWG)
#define EQ_HSMEM_BYTES ((EQ_HBM + 2 * EQ_HST * EQ_HBN) * EQ_HDP * 2 + 1024)

#if EQ_F32
// ---- f32 operands: the same online softmax on CUDA cores, in full f32 (no tensor cores) ----
// Register tiles, as a CUDA-core gemm does them. A block of EQ_FNT threads forms a grid of
// EQ_FTR = EQ_FNT / EQ_FTC row groups by EQ_FTC threads a row; it takes EQ_FBM = EQ_FTR * EQ_FR
// query rows (EQ_FR = 4) and walks key tiles of EQ_FBN = EQ_FTC * EQ_FK keys. Thread (tr, tc) =
// (tid / EQ_FTC, tid % EQ_FTC) holds
//   - the scores of rows tr + EQ_FTR a (a < EQ_FR) and keys tc + EQ_FTC c (c < EQ_FK) of a tile,
//   - the output of those rows over the padded head's float4 columns tc + EQ_FTC u (u < EQ_FU),
//   - each of its rows' running max m (the row's, the same in all its threads) and its own part
//     of the row sum l (the parts summed at the end, in a fixed order).
// A row's EQ_FTC threads are consecutive lanes of one warp. Per tile:
//   - scores: per float4 of the head, EQ_FR query and EQ_FK key float4 reads of shared memory
//     feed 4 EQ_FR EQ_FK fmas (s_ij = <q_i, k_j> over d in order, 4 elements a read);
//   - the row max over the row's lanes (shuffles), one rescale of l and o by exp(m - m_new);
//   - p = exp(s - m_new) into the block's probability tile (rows padded to EQ_FBN + EQ_FTC
//     floats: the scalar writes of a warp's rows fall on distinct banks), read back only by the
//     warp that wrote it (a warp barrier);
//   - o += P V: per 4 keys, EQ_FR probability float4 reads (one address per row) and 4 EQ_FU
//     value float4 reads feed 16 EQ_FR EQ_FU fmas.
// Key rows lie EQ_FS = EQ_FDP + 4 floats apart, so 8 consecutive keys read by 16 bytes fall on
// distinct banks: with 8 threads a row (the code generator's choice) every shared-memory read of
// a warp is one wavefront (its 4 rows' queries or probabilities, its 8 keys or value columns).
// The one-row-a-thread-part kernel this replaces (keys split over 4 threads a row, one float4
// read of shared memory a 4 fmas) ran at 36% of the CUDA cores' peak on [128, 1024, 64]
// (benches/results/2026-11-22-h100-6d005bd-f32att).
// Launch shape: grid (ceil(EQ_SQ / EQ_FBM), EQ_NB), block EQ_FNT threads, dynamic shared memory
// EQ_SMEM_BYTES: the query tile (loaded once), two buffers each of the key and value tiles
// (cp.async, tile j + 1 loads while tile j is consumed, one barrier per tile) and the
// probability tile. Rows of EQ_FDP = EQ_D rounded up to 4 floats, zero past EQ_D; loads by 16
// bytes where the head is a multiple of 4 and every stride and offset a multiple of 4 elements
// (EQ_FVEC, EQ_FQVEC), else by 4 bytes; the output likewise (EQ_FOVEC).
// Under EQ_CAUSAL the block of the last query rows runs first and tiles wholly above the
// block's diagonal are skipped (the rest are masked per score).
#ifndef EQ_FK
#define EQ_FK 8
#endif
#ifndef EQ_FTC
#define EQ_FTC 8
#endif
#ifndef EQ_FNT
#define EQ_FNT 128
#endif
#define EQ_FR 4
#define EQ_FTR (EQ_FNT / EQ_FTC)
#define EQ_FBM (EQ_FTR * EQ_FR)
#define EQ_FBN (EQ_FTC * EQ_FK)
#define EQ_FDP (((EQ_D + 3) / 4) * 4)
#define EQ_FU ((EQ_FDP / 4 + EQ_FTC - 1) / EQ_FTC)
#define EQ_FS (EQ_FDP + 4)
#define EQ_FPS (EQ_FBN + EQ_FTC)
// Blocks per SM the register allocation must allow.
#ifndef EQ_FMINB
#define EQ_FMINB 2
#endif
// Element offsets of q, k, v from their pointers (slices read in place; EQ_QP and the others
// already include them): 16-byte loads need them aligned too.
#ifndef EQ_Q_OFF
#define EQ_Q_OFF 0
#endif
#ifndef EQ_K_OFF
#define EQ_K_OFF 0
#endif
#ifndef EQ_V_OFF
#define EQ_V_OFF 0
#endif
#define EQ_FVEC                                                                                      \
    (EQ_D % 4 == 0 && EQ_K_S0 % 4 == 0 && EQ_K_S1 % 4 == 0 && EQ_K_S2 % 4 == 0 && EQ_K_SR % 4 == 0 && \
     EQ_V_S0 % 4 == 0 && EQ_V_S1 % 4 == 0 && EQ_V_S2 % 4 == 0 && EQ_V_SR % 4 == 0 && EQ_K_OFF % 4 == 0 && \
     EQ_V_OFF % 4 == 0)
#define EQ_FQVEC                                                                                    \
    (EQ_D % 4 == 0 && EQ_Q_S0 % 4 == 0 && EQ_Q_S1 % 4 == 0 && EQ_Q_S2 % 4 == 0 && EQ_Q_SR % 4 == 0 && \
     EQ_Q_OFF % 4 == 0)
#define EQ_FOVEC (EQ_D % 4 == 0 && EQ_O_S0 % 4 == 0 && EQ_O_S1 % 4 == 0 && EQ_O_S2 % 4 == 0 && EQ_O_SR % 4 == 0)
#define EQ_FTILE (EQ_FBN * EQ_FS)      // one key or value tile (floats)
#define EQ_FSMEM_FLOATS (EQ_FBM * EQ_FS + 4 * EQ_FTILE + EQ_FBM * EQ_FPS)
#define EQ_SMEM_BYTES (EQ_FSMEM_FLOATS * 4)

namespace eq_f32a {
static_assert(EQ_D > 0 && EQ_D <= 128, "head sizes up to 128");
static_assert(EQ_FTC == 8 || EQ_FTC == 16, "a row's threads: 8 or 16 lanes of a warp");
static_assert(EQ_FBN % 32 == 0, "key tiles of whole banks: conflict-free probability writes");
constexpr int DP4 = EQ_FDP / 4;
__device__ __forceinline__ void cp4(float* dst, const float* src) { eq_cp_async<4>(dst, src); }
__device__ __forceinline__ void cp16(float* dst, const float* src) { eq_cp_async<16>(dst, src); }
// Rows [r0, r0 + rows) of a [*, EQ_D] tensor at rows stride sr into a tile of rows EQ_FS apart
// (zero past `limit` rows and past EQ_D), by 16 bytes where `vec`. No commit.
template <int ROWS, bool VEC>
__device__ __forceinline__ void load_rows(float* dst, const float* src, long long sr, int r0, int limit, int tid) {
    if (VEC) {
        for (int c = tid; c < ROWS * DP4; c += EQ_FNT) {
            const int r = c / DP4, c4 = c % DP4;
            float* d = dst + r * EQ_FS + 4 * c4;
            if (r0 + r < limit) {
                cp16(d, src + (long long)(r0 + r) * sr + 4 * c4);
            } else {
                *reinterpret_cast<float4*>(d) = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            }
        }
    } else {
        for (int c = tid; c < ROWS * EQ_FDP; c += EQ_FNT) {
            const int r = c / EQ_FDP, e = c % EQ_FDP;
            float* d = dst + r * EQ_FS + e;
            if (r0 + r < limit && e < EQ_D) {
                cp4(d, src + (long long)(r0 + r) * sr + e);
            } else {
                *d = 0.0f;
            }
        }
    }
}
}  // namespace eq_f32a

extern "C" __global__ void __launch_bounds__(EQ_FNT, EQ_FMINB) EQ_KERNEL(EQ_PARAMS) {
    using namespace eq_f32a;
    extern __shared__ __align__(16) float eq_fsmem[];
    const int tid = threadIdx.x;
    const int tr = tid / EQ_FTC, tc = tid % EQ_FTC;
    const int mblocks = (EQ_SQ + EQ_FBM - 1) / EQ_FBM;
    const int mb = EQ_CAUSAL ? mblocks - 1 - (int)blockIdx.x : (int)blockIdx.x;
    const long long b = blockIdx.y;
    const long long b0 = b / (EQ_NB1 * EQ_NB2), b1 = (b / EQ_NB2) % EQ_NB1, b2 = b % EQ_NB2;
    const float* qg = EQ_QP + b0 * EQ_Q_S0 + b1 * EQ_Q_S1 + b2 * EQ_Q_S2;
    const float* kg = EQ_KP + b0 * EQ_K_S0 + b1 * EQ_K_S1 + b2 * EQ_K_S2;
    const float* vg = EQ_VP + b0 * EQ_V_S0 + b1 * EQ_V_S1 + b2 * EQ_V_S2;
    float* og = EQ_OP + b0 * EQ_O_S0 + b1 * EQ_O_S1 + b2 * EQ_O_S2;
#if EQ_BIAS
    const EQ_BT* bg = EQ_BP + b0 * EQ_B_S0 + b1 * EQ_B_S1 + b2 * EQ_B_S2;
#endif
    const int m0 = mb * EQ_FBM;
    const int n_end = EQ_CAUSAL ? (EQ_SK < m0 + EQ_FBM ? EQ_SK : m0 + EQ_FBM) : EQ_SK;
    const int ntiles = (n_end + EQ_FBN - 1) / EQ_FBN;
    float* sq = eq_fsmem;                     // [EQ_FBM][EQ_FS]
    float* tiles = sq + EQ_FBM * EQ_FS;       // [2 buffers][keys, values][EQ_FBN][EQ_FS]
    float* sp = tiles + 4 * EQ_FTILE;         // [EQ_FBM][EQ_FPS]
    load_rows<EQ_FBM, EQ_FQVEC>(sq, qg, EQ_Q_SR, m0, EQ_SQ, tid);
    load_rows<EQ_FBN, EQ_FVEC>(tiles, kg, EQ_K_SR, 0, EQ_SK, tid);
    load_rows<EQ_FBN, EQ_FVEC>(tiles + EQ_FTILE, vg, EQ_V_SR, 0, EQ_SK, tid);
    eq_cp_async_commit();

    float4 o[EQ_FR][EQ_FU];
    float m[EQ_FR], l[EQ_FR];
#pragma unroll
    for (int a = 0; a < EQ_FR; ++a) {
        m[a] = -EQ_INF;
        l[a] = 0.0f;
#pragma unroll
        for (int u = 0; u < EQ_FU; ++u) o[a][u] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
    const float scale = EQ_SCALE;
#if EQ_DROPOUT
    const unsigned dseed = EQ_DROP_SEED, dkey0 = eq_dropout_key0(dseed);
#endif
    const float* qt = sq + tr * EQ_FS;        // row tr + EQ_FTR a at qt + EQ_FTR a EQ_FS
    const float* prow = sp + tr * EQ_FPS;     // likewise, rows EQ_FPS apart
    for (int t = 0; t < ntiles; ++t) {
        eq_cp_async_wait_all();
        __syncthreads();   // tile t landed for every thread; tile t - 1 is consumed by all
        if (t + 1 < ntiles) {
            float* nb = tiles + ((t + 1) & 1) * 2 * EQ_FTILE;
            load_rows<EQ_FBN, EQ_FVEC>(nb, kg, EQ_K_SR, (t + 1) * EQ_FBN, EQ_SK, tid);
            load_rows<EQ_FBN, EQ_FVEC>(nb + EQ_FTILE, vg, EQ_V_SR, (t + 1) * EQ_FBN, EQ_SK, tid);
            eq_cp_async_commit();
        }
        const float* ck = tiles + (t & 1) * 2 * EQ_FTILE;
        const float* cv = ck + EQ_FTILE;
        const float* kt = ck + tc * EQ_FS;    // key tc + EQ_FTC c at kt + EQ_FTC c EQ_FS
        float s[EQ_FR][EQ_FK];
#pragma unroll
        for (int a = 0; a < EQ_FR; ++a)
#pragma unroll
            for (int c = 0; c < EQ_FK; ++c) s[a][c] = 0.0f;
        const int n0 = t * EQ_FBN;
#if EQ_BIAS
        // The tile's bias, loaded before its products so that their arithmetic hides the loads'
        // latency (read where each score is scaled, every load waited for in turn: ViT-B/16's
        // [8, 1, 197, 197] bias took the kernel from 58 to 103 us on the H100).
        EQ_BT bv[EQ_FR][EQ_FK];
#pragma unroll
        for (int a = 0; a < EQ_FR; ++a) {
            const int row = m0 + tr + EQ_FTR * a;
#pragma unroll
            for (int c = 0; c < EQ_FK; ++c) {
                const int col = n0 + tc + EQ_FTC * c;
                const bool in = row < EQ_SQ && col < EQ_SK;
                bv[a][c] = bg[in ? (long long)row * EQ_B_SR + (long long)col * EQ_B_SC : 0LL];
            }
        }
#endif
#pragma unroll 4
        for (int d4 = 0; d4 < DP4; ++d4) {
            float4 qv[EQ_FR], kv[EQ_FK];
#pragma unroll
            for (int a = 0; a < EQ_FR; ++a) qv[a] = *reinterpret_cast<const float4*>(qt + EQ_FTR * a * EQ_FS + 4 * d4);
#pragma unroll
            for (int c = 0; c < EQ_FK; ++c) kv[c] = *reinterpret_cast<const float4*>(kt + EQ_FTC * c * EQ_FS + 4 * d4);
#pragma unroll
            for (int a = 0; a < EQ_FR; ++a)
#pragma unroll
                for (int c = 0; c < EQ_FK; ++c) s[a][c] = eq_dot4(qv[a], kv[c], s[a][c]);
        }
#pragma unroll
        for (int a = 0; a < EQ_FR; ++a) {
            const int row = m0 + tr + EQ_FTR * a;
            float mx = -EQ_INF;
#pragma unroll
            for (int c = 0; c < EQ_FK; ++c) {
                const int col = n0 + tc + EQ_FTC * c;
#if EQ_BIAS
                s[a][c] = (col >= EQ_SK || (EQ_CAUSAL && col > row)) ? -EQ_INF
                                                                     : fmaf(s[a][c], scale, eq_att_bias_of(bv[a][c]));
#else
                s[a][c] = (col >= EQ_SK || (EQ_CAUSAL && col > row)) ? -EQ_INF : s[a][c] * scale;
#endif
                mx = fmaxf(mx, s[a][c]);
            }
#pragma unroll
            for (int x = EQ_FTC / 2; x >= 1; x >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, x));
            const float mnew = fmaxf(m[a], mx);
            const float mu = mnew == -EQ_INF ? 0.0f : mnew;
            const float alpha = expf(m[a] - mu);
            m[a] = mnew;
            l[a] *= alpha;
#pragma unroll
            for (int u = 0; u < EQ_FU; ++u) {
                o[a][u].x *= alpha;
                o[a][u].y *= alpha;
                o[a][u].z *= alpha;
                o[a][u].w *= alpha;
            }
#pragma unroll
            for (int c = 0; c < EQ_FK; ++c) {
                float p = expf(s[a][c] - mu);
                l[a] += p;
#if EQ_DROPOUT
                if (!eq_att_keep(dseed, dkey0, b, row, n0 + tc + EQ_FTC * c)) p = 0.0f;
#endif
                sp[(tr + EQ_FTR * a) * EQ_FPS + tc + EQ_FTC * c] = p;
            }
        }
        __syncwarp();   // a warp reads back only the probability rows it wrote
#pragma unroll 2
        for (int j4 = 0; j4 < EQ_FBN / 4; ++j4) {
            float4 pv[EQ_FR];
#pragma unroll
            for (int a = 0; a < EQ_FR; ++a) pv[a] = *reinterpret_cast<const float4*>(prow + EQ_FTR * a * EQ_FPS + 4 * j4);
#pragma unroll
            for (int jj = 0; jj < 4; ++jj) {
#pragma unroll
                for (int u = 0; u < EQ_FU; ++u) {
                    if (DP4 % EQ_FTC == 0 || tc + EQ_FTC * u < DP4) {
                        const float4 vv = *reinterpret_cast<const float4*>(cv + (4 * j4 + jj) * EQ_FS + 4 * (tc + EQ_FTC * u));
#pragma unroll
                        for (int a = 0; a < EQ_FR; ++a) eq_fma4(o[a][u], eq_lane4(pv[a], jj), vv);
                    }
                }
            }
        }
    }

    // Each row's sum over its threads (a fixed butterfly), then the output.
#pragma unroll
    for (int a = 0; a < EQ_FR; ++a) {
#pragma unroll
        for (int x = EQ_FTC / 2; x >= 1; x >>= 1) l[a] += __shfl_xor_sync(0xffffffffu, l[a], x);
        const int row = m0 + tr + EQ_FTR * a;
        if (row >= EQ_SQ) continue;
        const float inv = l[a] > 0.0f ? EQ_DROP_FACTOR / l[a] : 0.0f;
        float* orow = og + (long long)row * EQ_O_SR;
#pragma unroll
        for (int u = 0; u < EQ_FU; ++u) {
            const int c4 = tc + EQ_FTC * u;
            if (c4 >= DP4) continue;
            const float4 r = make_float4(o[a][u].x * inv, o[a][u].y * inv, o[a][u].z * inv, o[a][u].w * inv);
#if EQ_FOVEC
            *reinterpret_cast<float4*>(orow + 4 * c4) = r;
#else
#pragma unroll
            for (int e = 0; e < 4; ++e)
                if (4 * c4 + e < EQ_D) orow[4 * c4 + e] = eq_lane4(r, e);
#endif
        }
#if EQ_LSE
        if (tc == 0) EQ_LSEP[b * EQ_SQ + row] = m[a] + logf(l[a]);
#endif
#if EQ_STATS
        if (tc == 0) {
            EQ_LSEP[(b * EQ_SQ + row) * 2] = m[a];
            EQ_LSEP[(b * EQ_SQ + row) * 2 + 1] = logf(l[a]);
        }
#endif
    }
}
#elif EQ_WGMMA && defined(__CUDA_ARCH_FEAT_SM90_ALL)
// ---- Hopper (sm_90a): the same online softmax on warpgroup MMAs (wgmma) ----
// Launch shape: grid (ceil(EQ_SQ / EQ_HBM), EQ_NB), block EQ_HWG * 128 threads, dynamic shared
// memory EQ_HSMEM_BYTES: the query tile, EQ_HST buffers each of the key and value tiles, and
// 1024 bytes to align the tiles to the 128-byte swizzle's 1024-byte period. Warpgroup w owns query
// rows [64 w, 64 w + 64) of the block's tile; its warp u (of 4) the 16 rows from 64 w + 16 u,
// laid out in registers as in an m16n8k16 mma, so the score accumulator of S = Q K^T turns into
// the register A operand of O += P V without moving data (as in FlashAttention-3).
// Shared tiles: a row of R rows holds EQ_HDP elements as EQ_HDP / 64 blocks of 64 (128 bytes);
// block c of row r lies at (c * R + r) * 128, its 16-byte chunk k at chunk k ^ (r & 7): the
// 128-byte swizzle that wgmma descriptors name. Keys are the K-major B operand of S = Q K^T,
// values the N-major (transposed) B operand of O += P V; the queries go to registers (ldmatrix).
// Pipeline per key tile j: wait for keys j and values j - 1 (cp.async, issued EQ_HST - 1 tiles
// ahead), one barrier, prefetch keys j + EQ_HST - 1 and values j + EQ_HST - 2, issue
// S_j = Q K_j^T and then O += P_{j-1} V_{j-1}, wait for S_j only, run the softmax of tile j
// while the tensor cores run P_{j-1} V_{j-1}, then wait, rescale O by the tile's factor and keep
// P_j for the next tile. Measured on an H100 (benches/results/2026-11-22-h100-1c9eca3-attnfwd):
// 64 keys per tile with two blocks per SM (heads up to 64) beat 128 keys with one, and deeper
// buffering (EQ_HST 3 or 4) gained nothing, so the code generator uses EQ_HBN 64, EQ_HST 2.
// The scale must be positive: without a bias, row maxima are taken over the unscaled scores.
// Dropout (EQ_DROPOUT) zeroes the dropped probabilities of P_j after its row sums, from bits
// computed ahead (`keep_bits`: in step j - 1, after its softmax, while P_{j-2} V_{j-2} runs).
#define EQ_DP EQ_HDP
#define EQ_SMEM_BYTES EQ_HSMEM_BYTES
#if EQ_BF16
#define EQ_WG_AB "bf16.bf16"
#else
#define EQ_WG_AB "f16.f16"
#endif

namespace eq_hop {

constexpr int NT = EQ_HWG * 128;   // threads
constexpr int BM = EQ_HBM;   // query rows per block
constexpr int BN = EQ_HBN;   // keys per tile
constexpr int CB = EQ_DP / 64;   // 64-element blocks of a row
constexpr int CH = EQ_DP / 8;   // 16-byte chunks of a row
constexpr int SN = BN / 8;   // n8 tiles of a score tile
constexpr int KT = EQ_DP / 16;   // k16 steps of q k^T
constexpr int PK = BN / 16;   // k16 steps of p v
constexpr unsigned KV_BYTES = BN * EQ_DP * 2;
constexpr int ST = EQ_HST;   // key and value buffers
static_assert(ST >= 2, "EQ_HST must be at least 2");
static_assert(BN == 64 || BN == 128, "EQ_HBN must be 64 or 128");
static_assert(EQ_D % 8 == 0 && EQ_D > 0 && EQ_D <= 128, "EQ_D must be a multiple of 8 up to 128");
static_assert(EQ_SCALE_LOG2 > 0.0f, "the Hopper path takes a positive scale");

__device__ __forceinline__ unsigned smem_u32(const void* p) {
    unsigned r;
    asm("{ .reg .u64 a; cvta.to.shared.u64 a, %1; cvt.u32.u64 %0, a; }" : "=r"(r) : "l"(p));
    return r;
}
__device__ __forceinline__ void cp16(unsigned dst, const void* src, int bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes));
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void cp_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
// Shared memory written by cp.async (the generic proxy) becomes visible to wgmma (the async proxy).
__device__ __forceinline__ void fence_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
__device__ __forceinline__ void ldsm4(unsigned (&r)[4], unsigned addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}
__device__ __forceinline__ unsigned pack2(float lo, float hi) {
    unsigned r;
#if EQ_BF16
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
#else
    asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
#endif
    return r;
}
__device__ __forceinline__ float ex2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

// Byte offset of chunk `ch` of row `r` in a tile of R rows (see the layout above).
template <int R>
__device__ __forceinline__ unsigned at(int r, int ch) {
    return (unsigned)((((ch >> 3) * R + r) << 7) + (((ch & 7) ^ (r & 7)) << 4));
}

// A shared-memory matrix descriptor with the 128-byte swizzle (byte offsets, 16-byte units).
__device__ __forceinline__ unsigned long long desc(unsigned addr, unsigned lbo, unsigned sbo) {
    return (unsigned long long)((addr & 0x3FFFFu) >> 4) | ((unsigned long long)(lbo >> 4) << 16) |
           ((unsigned long long)(sbo >> 4) << 32) | (1ull << 62);
}

__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wg_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Pins registers an asynchronous wgmma reads or writes at this point of the program.
template <int N>
__device__ __forceinline__ void pin(float (&x)[N]) {
#pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+f"(x[i])::"memory");
}
template <int N>
__device__ __forceinline__ void pin(float (&x)[N][32]) {
#pragma unroll
    for (int i = 0; i < N; ++i) pin(x[i]);
}
template <int N>
__device__ __forceinline__ void pin(unsigned (&x)[N][4]) {
#pragma unroll
    for (int i = 0; i < N; ++i)
#pragma unroll
        for (int e = 0; e < 4; ++e) asm volatile("" : "+r"(x[i][e])::"memory");
}

// d (+)= a * b over m64n64k16: a from registers (the m16n8k16 A layout per warp), b from shared
// memory through `desc`; TB selects a K-major (0) or N-major (1) b; ACC = 0 overwrites d.
template <int TB, int ACC>
__device__ __forceinline__ void wg_n64(float (&d)[32], const unsigned (&a)[4], unsigned long long desc) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %38, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32." EQ_WG_AB " "
        "{"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
        "}, {%32, %33, %34, %35}, %36, p, 1, 1, %37;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "n"(TB), "n"(ACC));
}

// d (+)= a * b over m64n128k16: a from registers (the m16n8k16 A layout per warp), b from shared
// memory through `desc`; TB selects a K-major (0) or N-major (1) b; ACC = 0 overwrites d.
template <int TB, int ACC>
__device__ __forceinline__ void wg_n128(float (&d)[64], const unsigned (&a)[4], unsigned long long desc) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %70, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32." EQ_WG_AB " "
        "{"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
        "}, {%64, %65, %66, %67}, %68, p, 1, 1, %69;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "n"(TB), "n"(ACC));
}


template <int ROWS>
__device__ __forceinline__ void load_tile(unsigned dst, const EQ_T* g, long long sr, int row0, int limit) {
#pragma unroll
    for (int c = threadIdx.x; c < ROWS * CH; c += NT) {
        const int r = c / CH, ch = c % CH;
        const bool ok = row0 + r < limit && ch * 8 < EQ_D;
        const EQ_T* src = ok ? g + (long long)(row0 + r) * sr + ch * 8 : g;
        cp16(dst + at<ROWS>(r, ch), src, ok ? 16 : 0);
    }
}

// Descriptors of the key tile at `kb` for the KT k16 steps of s = q k^T (K-major), and of the
// value tile at `vb` for the PK k16 steps of o += p v (N-major: 16 keys are 2048 bytes), per
// 64-column block. They are computed and pinned before the wgmma fence: ptxas serializes
// wgmmas whose input registers are defined between the fence and the wgmma.
__device__ __forceinline__ void qk_desc(unsigned long long (&d)[KT], unsigned kb) {
#pragma unroll
    for (int kt = 0; kt < KT; ++kt) {
        d[kt] = desc(kb + (kt >> 2) * (BN * 128) + (kt & 3) * 32, 16, 1024);
        asm volatile("" : "+l"(d[kt]));
    }
}
__device__ __forceinline__ void pv_desc(unsigned long long (&d)[PK][CB], unsigned vb) {
#pragma unroll
    for (int kk = 0; kk < PK; ++kk)
#pragma unroll
        for (int cb = 0; cb < CB; ++cb) {
            d[kk][cb] = desc(vb + cb * (BN * 128) + kk * 2048, 1024, 1024);
            asm volatile("" : "+l"(d[kk][cb]));
        }
}

// s = q k^T for one warpgroup (issued, not waited for).
__device__ __forceinline__ void qk(float (&s)[BN / 2], const unsigned (&qf)[KT][4], const unsigned long long (&d)[KT]) {
#pragma unroll
    for (int kt = 0; kt < KT; ++kt) {
#if EQ_HBN == 128
        if (kt == 0) wg_n128<0, 0>(s, qf[kt], d[kt]);
        else wg_n128<0, 1>(s, qf[kt], d[kt]);
#else
        if (kt == 0) wg_n64<0, 0>(s, qf[kt], d[kt]);
        else wg_n64<0, 1>(s, qf[kt], d[kt]);
#endif
    }
}

// o += p v for one warpgroup (issued, not waited for).
__device__ __forceinline__ void pv(float (&o)[CB][32], const unsigned (&p)[PK][4], const unsigned long long (&d)[PK][CB]) {
#pragma unroll
    for (int kk = 0; kk < PK; ++kk)
#pragma unroll
        for (int cb = 0; cb < CB; ++cb) wg_n64<1, 1>(o[cb], p[kk], d[kk][cb]);
}

#if EQ_BIAS
// A bias by key alone (a padding mask) is loaded into registers before the tile's q k^T is
// issued, so that its loads run under the wgmma instead of stalling the softmax after it; any
// other bias is read in the softmax (eq_att_tile_bias, common.cuh).
typedef eq_att_tile_bias<SN> TileBias;
#define EQ_HBIAS_PARAM , const EQ_BT* __restrict__ bg, const TileBias& br
#define EQ_HBIAS_ARG , bg, br
#define EQ_HBIAS_LOAD(n0) \
    TileBias br;          \
    br.load(bg, n0, t);
#else
#define EQ_HBIAS_PARAM
#define EQ_HBIAS_ARG
#define EQ_HBIAS_LOAD(n0)
#endif

#if EQ_DROPOUT
// Dropout: what a thread needs for the bits of its scores (its batch entry, the seed and its
// key), and those bits for one score tile (keys from n0): bit i % 32 of word i / 32 for score
// s[i], i = 4 nt + e, of row wrow + g + 8 (e >> 1) and key n0 + 8 nt + 2 t + (e & 1) (the
// accumulator layout). They depend on the indices alone, so each tile's are computed ahead, in
// the step before (tile 0's while its q k^T runs): after that step's softmax, while the tensor
// cores still run its p v. (Computed just before the softmax that uses them, while the scores
// of the tile are live, they made ptxas spill at two blocks per SM's 128 registers.)
struct Drop {
    long long b;
    unsigned seed, key0;
};
constexpr int DW = BN / 64;   // words of bits
__device__ __forceinline__ void keep_bits(unsigned (&kept)[DW], const Drop& dr, int n0, int wrow, int g, int t) {
#pragma unroll
    for (int w = 0; w < DW; ++w) kept[w] = 0u;
#pragma unroll
    for (int nt = 0; nt < SN; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int i = nt * 4 + e;
            const int row = wrow + g + (e >> 1) * 8, col = n0 + nt * 8 + 2 * t + (e & 1);
            if (eq_att_keep(dr.seed, dr.key0, dr.b, row, col)) kept[i >> 5] |= 1u << (i & 31);
        }
#pragma unroll
    for (int w = 0; w < DW; ++w) asm volatile("" : "+r"(kept[w])::"memory");
}
#define EQ_HDROP_PARAM , const Drop& dr, unsigned(&kept)[DW]
#define EQ_HDROP_ARG , dr, kept
#define EQ_HKEPT_PARAM , const unsigned (&kept)[DW]
#define EQ_HKEPT_ARG , kept
#define EQ_HKEEP_BITS(n0) keep_bits(kept, dr, n0, wrow, g, t);
#else
#define EQ_HDROP_PARAM
#define EQ_HDROP_ARG
#define EQ_HKEPT_PARAM
#define EQ_HKEPT_ARG
#define EQ_HKEEP_BITS(n0)
#endif

// The online softmax of one score tile (keys from n0) in base-2 units: masks keys past the end
// (and above the diagonal), takes the row maxima of the raw scores (the scale is positive; with
// a bias, of the biased scores in natural units) over the quad sharing a row, and leaves the
// probabilities rounded to the storage type in `pn` (the A operand of p v), the factor the
// output must be rescaled by in `alpha`. Under dropout the row sums count every probability and
// `pn` holds the kept ones (the others 0), as in the mma.sync path.
__device__ __forceinline__ void softmax(float (&s)[BN / 2], unsigned (&pn)[PK][4], float (&m_i)[2], float (&l_i)[2],
                                        float (&alpha)[2], int n0, int wrow, int g, int t EQ_HBIAS_PARAM
                                        EQ_HKEPT_PARAM) {
#if EQ_BIAS
    // The scaled scores plus the bias, in natural units (keys past the end, and above the
    // diagonal, -inf).
#pragma unroll
    for (int nt = 0; nt < SN; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int col = n0 + nt * 8 + 2 * t + (e & 1);
            const int row = wrow + g + (e >> 1) * 8;
            s[nt * 4 + e] = (col >= EQ_SK || (EQ_CAUSAL && col > row))
                                ? -EQ_INF
                                : fmaf(s[nt * 4 + e], EQ_SCALE, br.at(bg, nt, e & 1, row, col));
        }
#else
    const bool masked = n0 + BN > EQ_SK || (EQ_CAUSAL && n0 + BN - 1 > wrow);
    if (masked) {
#pragma unroll
        for (int nt = 0; nt < SN; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int col = n0 + nt * 8 + 2 * t + (e & 1);
                const int row = wrow + g + (e >> 1) * 8;
                if (col >= EQ_SK || (EQ_CAUSAL && col > row)) s[nt * 4 + e] = -EQ_INF;
            }
    }
#endif
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        float mx = -EQ_INF;
#pragma unroll
        for (int nt = 0; nt < SN; ++nt) mx = fmaxf(mx, fmaxf(s[nt * 4 + 2 * h], s[nt * 4 + 2 * h + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
#if EQ_BIAS
        const float mnew = fmaxf(m_i[h], mx);
#else
        const float mnew = fmaxf(m_i[h], mx * EQ_SCALE_LOG2);
#endif
        const float mu = mnew == -EQ_INF ? 0.0f : mnew;
        alpha[h] = ex2(EQ_TO2(m_i[h] - mu));
        m_i[h] = mnew;
        float rs = 0.0f;
#pragma unroll
        for (int nt = 0; nt < SN; ++nt) {
#if EQ_BIAS
            const float p0 = ex2(EQ_TO2(s[nt * 4 + 2 * h] - mu));
            const float p1 = ex2(EQ_TO2(s[nt * 4 + 2 * h + 1] - mu));
#else
            const float p0 = ex2(fmaf(s[nt * 4 + 2 * h], EQ_SCALE_LOG2, -mu));
            const float p1 = ex2(fmaf(s[nt * 4 + 2 * h + 1], EQ_SCALE_LOG2, -mu));
#endif
            rs += p0 + p1;
#if EQ_DROPOUT
            const int i = nt * 4 + 2 * h;
            s[i] = (kept[i >> 5] >> (i & 31)) & 1u ? p0 : 0.0f;
            s[i + 1] = (kept[i >> 5] >> ((i + 1) & 31)) & 1u ? p1 : 0.0f;
#else
            s[nt * 4 + 2 * h] = p0;
            s[nt * 4 + 2 * h + 1] = p1;
#endif
        }
        l_i[h] = l_i[h] * alpha[h] + rs;
    }
#pragma unroll
    for (int kk = 0; kk < PK; ++kk) {
        pn[kk][0] = pack2(s[8 * kk + 0], s[8 * kk + 1]);
        pn[kk][1] = pack2(s[8 * kk + 2], s[8 * kk + 3]);
        pn[kk][2] = pack2(s[8 * kk + 4], s[8 * kk + 5]);
        pn[kk][3] = pack2(s[8 * kk + 6], s[8 * kk + 7]);
    }
}

template <int ROWS>
__device__ __forceinline__ void load_tile(unsigned dst, const EQ_T* g, long long sr, int row0, int limit);

// Key tile j >= 1 of the pipeline (see above): `pi` holds P_{j-1}, which the wgmma issued here
// reads while the softmax of tile j writes P_j into `po`.
__device__ __forceinline__ void step(int j, int ntiles, float (&s)[BN / 2], float (&o)[CB][32], const unsigned (&qf)[KT][4],
                                     unsigned (&pi)[PK][4], unsigned (&po)[PK][4], float (&m_i)[2], float (&l_i)[2],
                                     unsigned sk, unsigned sv, const EQ_T* kg, const EQ_T* vg, int wrow, int g, int t
                                     EQ_BIAS_PARAM EQ_HDROP_PARAM) {
    const int n0 = j * BN;
    cp_wait<ST - 2>();  // group j: keys j and values j - 1
    fence_async();
    __syncthreads();  // ... for every thread, and tile j - 1's wgmmas are done in both warpgroups
    // Group ST - 1 + j: keys j + ST - 1 and values j + ST - 2, into the buffers of tiles j - 1
    // and j - 2, whose wgmmas are done (an empty group past the last tile keeps the count).
    if (j + ST - 1 < ntiles) load_tile<BN>(sk + ((j + ST - 1) % ST) * KV_BYTES, kg, EQ_K_SR, n0 + (ST - 1) * BN, EQ_SK);
    if (j + ST - 2 < ntiles) load_tile<BN>(sv + ((j + ST - 2) % ST) * KV_BYTES, vg, EQ_V_SR, n0 + (ST - 2) * BN, EQ_SK);
    cp_commit();

    unsigned long long dk[KT], dv[PK][CB];
    qk_desc(dk, sk + (j % ST) * KV_BYTES);
    pv_desc(dv, sv + ((j - 1) % ST) * KV_BYTES);
    pin(s);
    pin(o);
    pin(pi);
    EQ_HBIAS_LOAD(n0)
    wg_fence();
    qk(s, qf, dk);
    wg_commit();
    pv(o, pi, dv);
    wg_commit();
    wg_wait<1>();  // s is ready; p v may still run
    pin(s);
    float alpha[2];
    softmax(s, po, m_i, l_i, alpha, n0, wrow, g, t EQ_HBIAS_ARG EQ_HKEPT_ARG);
    EQ_HKEEP_BITS(n0 + BN)  // (past the last tile too: a branch here serializes the wgmmas)
    wg_wait<0>();
    pin(o);
    pin(pi);
#pragma unroll
    for (int cb = 0; cb < CB; ++cb)
#pragma unroll
        for (int e = 0; e < 32; ++e) o[cb][e] *= alpha[(e >> 1) & 1];
}

// The last tile's o += p v, once its values have landed.
__device__ __forceinline__ void finish(float (&o)[CB][32], unsigned (&p)[PK][4], unsigned vb) {
    cp_wait_all();
    fence_async();
    __syncthreads();
    unsigned long long dv[PK][CB];
    pv_desc(dv, vb);
    pin(o);
    pin(p);
    wg_fence();
    pv(o, p, dv);
    wg_commit();
    wg_wait<0>();
    pin(o);
}

}  // namespace eq_hop

extern "C" __global__ void __launch_bounds__(EQ_HWG * 128, EQ_HMINB) EQ_KERNEL(EQ_PARAMS) {
    using namespace eq_hop;
    extern __shared__ __align__(1024) unsigned char eq_smem[];
    const int tid = threadIdx.x, wg = tid >> 7, wu = (tid >> 5) & 3, lane = tid & 31;
    const int g = lane >> 2, t = lane & 3;
    const int mblocks = (EQ_SQ + BM - 1) / BM;
    const int mb = EQ_CAUSAL ? mblocks - 1 - (int)blockIdx.x : (int)blockIdx.x;
    const long long b = blockIdx.y;
    const long long b0 = b / (EQ_NB1 * EQ_NB2), b1 = (b / EQ_NB2) % EQ_NB1, b2 = b % EQ_NB2;
    const EQ_T* qg = EQ_QP + b0 * EQ_Q_S0 + b1 * EQ_Q_S1 + b2 * EQ_Q_S2;
    const EQ_T* kg = EQ_KP + b0 * EQ_K_S0 + b1 * EQ_K_S1 + b2 * EQ_K_S2;
    const EQ_T* vg = EQ_VP + b0 * EQ_V_S0 + b1 * EQ_V_S1 + b2 * EQ_V_S2;
    EQ_T* og = EQ_OP + b0 * EQ_O_S0 + b1 * EQ_O_S1 + b2 * EQ_O_S2;
#if EQ_BIAS
    const EQ_BT* bg = EQ_BP + b0 * EQ_B_S0 + b1 * EQ_B_S1 + b2 * EQ_B_S2;
#endif
    const int m0 = mb * BM;
    const unsigned sq = (smem_u32(eq_smem) + 1023u) & ~1023u;
    const unsigned sk = sq + BM * EQ_DP * 2;
    const unsigned sv = sk + ST * KV_BYTES;
    const int n_end = EQ_CAUSAL ? (EQ_SK < m0 + BM ? EQ_SK : m0 + BM) : EQ_SK;
    const int ntiles = (n_end + BN - 1) / BN;
    // The first query row (absolute) of this warp's 16.
    const int wrow = m0 + wg * 64 + wu * 16;

    load_tile<BM>(sq, qg, EQ_Q_SR, m0, EQ_SQ);
    load_tile<BN>(sk, kg, EQ_K_SR, 0, EQ_SK);
    cp_commit();
    // Groups 1 .. ST - 1: keys i and values i - 1.
#pragma unroll
    for (int i = 1; i < ST; ++i) {
        if (i < ntiles) load_tile<BN>(sk + i * KV_BYTES, kg, EQ_K_SR, i * BN, EQ_SK);
        if (i - 1 < ntiles) load_tile<BN>(sv + (i - 1) * KV_BYTES, vg, EQ_V_SR, (i - 1) * BN, EQ_SK);
        cp_commit();
    }
    cp_wait<ST - 1>();  // group 0
    fence_async();
    __syncthreads();

    unsigned qf[KT][4];
#pragma unroll
    for (int kt = 0; kt < KT; ++kt) ldsm4(qf[kt], sq + at<BM>(wg * 64 + wu * 16 + (lane & 15), kt * 2 + (lane >> 4)));

    float o[CB][32];
    float s[BN / 2];
    unsigned pa[PK][4], pb[PK][4];
#pragma unroll
    for (int cb = 0; cb < CB; ++cb)
#pragma unroll
        for (int e = 0; e < 32; ++e) o[cb][e] = 0.0f;
#pragma unroll
    for (int e = 0; e < BN / 2; ++e) s[e] = 0.0f;
    float m_i[2] = {-EQ_INF, -EQ_INF}, l_i[2] = {0.0f, 0.0f};
#if EQ_DROPOUT
    const unsigned dseed = EQ_DROP_SEED;
    const Drop dr = {b, dseed, eq_dropout_key0(dseed)};
    unsigned kept[DW];
#endif

    // Tile 0: its scores and probabilities (the output is still zero).
    {
        EQ_HBIAS_LOAD(0)
        {
            unsigned long long dk[KT];
            qk_desc(dk, sk);
            pin(s);
            wg_fence();
            qk(s, qf, dk);
        }
        wg_commit();
        EQ_HKEEP_BITS(0)
        wg_wait<0>();
        pin(s);
        float alpha[2];
        softmax(s, pa, m_i, l_i, alpha, 0, wrow, g, t EQ_HBIAS_ARG EQ_HKEPT_ARG);
        EQ_HKEEP_BITS(BN)
    }

    // Tiles 1 .. ntiles - 1, two per trip so that the probabilities alternate between two
    // register sets (no copy: ptxas serializes wgmmas when a copy would reuse the registers the
    // wgmma in flight reads).
    int j = 1;
    for (; j + 1 < ntiles; j += 2) {
        step(j, ntiles, s, o, qf, pa, pb, m_i, l_i, sk, sv, kg, vg, wrow, g, t EQ_BIAS_ARG EQ_HDROP_ARG);
        step(j + 1, ntiles, s, o, qf, pb, pa, m_i, l_i, sk, sv, kg, vg, wrow, g, t EQ_BIAS_ARG EQ_HDROP_ARG);
    }
    // The last tile's p v.
    if (j < ntiles) {
        step(j, ntiles, s, o, qf, pa, pb, m_i, l_i, sk, sv, kg, vg, wrow, g, t EQ_BIAS_ARG EQ_HDROP_ARG);
        finish(o, pb, sv + ((ntiles - 1) % ST) * KV_BYTES);
    } else {
        finish(o, pa, sv + ((ntiles - 1) % ST) * KV_BYTES);
    }

    // Epilogue: divide by the row sums (summed over the quad), stage the tile in shared memory
    // (over the queries, which live in registers since the start), store 16-byte chunks.
    float inv[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        float l = l_i[h];
        l += __shfl_xor_sync(0xffffffffu, l, 1);
        l += __shfl_xor_sync(0xffffffffu, l, 2);
        l_i[h] = l;
        inv[h] = l > 0.0f ? EQ_DROP_FACTOR / l : 0.0f;
    }
#pragma unroll
    for (int cb = 0; cb < CB; ++cb)
#pragma unroll
        for (int dt = 0; dt < 8; ++dt)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int r = wg * 64 + wu * 16 + g + h * 8;
                const unsigned w = pack2(o[cb][dt * 4 + 2 * h] * inv[h], o[cb][dt * 4 + 2 * h + 1] * inv[h]);
                asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(sq + at<BM>(r, cb * 8 + dt) + 4 * t), "r"(w));
            }
    __syncthreads();
#pragma unroll
    for (int c = tid; c < BM * CH; c += NT) {
        const int r = c / CH, ch = c % CH;
        if (m0 + r < EQ_SQ && ch * 8 < EQ_D) {
            uint4 w;
            asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                         : "=r"(w.x), "=r"(w.y), "=r"(w.z), "=r"(w.w)
                         : "r"(sq + at<BM>(r, ch)));
            *reinterpret_cast<uint4*>(og + (long long)(m0 + r) * EQ_O_SR + ch * 8) = w;
        }
    }
#if EQ_LSE
    // lse = (m + log2 l) * ln 2, by the first thread of each quad.
    if (t == 0) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int row = wrow + g + h * 8;
            if (row < EQ_SQ) EQ_LSEP[b * EQ_SQ + row] = (m_i[h] + __log2f(l_i[h])) * 0.69314718055994531f;
        }
    }
#endif
#if EQ_STATS
    // (m, log l), with a bias in natural units, by the first thread of each quad.
    if (t == 0) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int row = wrow + g + h * 8;
            if (row < EQ_SQ) {
                EQ_LSEP[(b * EQ_SQ + row) * 2] = m_i[h];
                EQ_LSEP[(b * EQ_SQ + row) * 2 + 1] = logf(l_i[h]);
            }
        }
    }
#endif
}
#else

#ifndef EQ_BM
#define EQ_BM 128
#endif
#ifndef EQ_BN
#define EQ_BN 64
#endif
#ifndef EQ_NWARPS
#define EQ_NWARPS 4
#endif
#define EQ_DP (((EQ_D + 63) / 64) * 64)
#ifndef EQ_Q_REGS
#define EQ_Q_REGS (EQ_DP <= 64)
#endif
#define EQ_SMEM_BYTES ((EQ_BM + 4 * EQ_BN) * EQ_DP * 2)

namespace eq_att {

constexpr int NT = EQ_NWARPS * 32;   // threads
constexpr int MT = EQ_BM / (16 * EQ_NWARPS);   // m16 tiles per warp
constexpr int SN = EQ_BN / 8;   // n8 tiles of a score tile
constexpr int KT = EQ_DP / 16;   // k16 steps of q k^T
constexpr int DT = EQ_DP / 8;   // n8 tiles of the output
constexpr int CH = EQ_DP / 8;   // 16-byte chunks of a shared row
static_assert(EQ_BM % (16 * EQ_NWARPS) == 0, "EQ_BM must be a multiple of 16 * EQ_NWARPS");
static_assert(EQ_BN % 16 == 0, "EQ_BN must be a multiple of 16");
static_assert(EQ_D % 8 == 0 && EQ_D > 0, "EQ_D must be a positive multiple of 8");

__device__ __forceinline__ unsigned smem_u32(const void* p) {
    unsigned r;
    asm("{ .reg .u64 a; cvta.to.shared.u64 a, %1; cvt.u32.u64 %0, a; }" : "=r"(r) : "l"(p));
    return r;
}

// One 16-byte copy global -> shared; `bytes` 0 writes zeros and reads nothing.
__device__ __forceinline__ void cp16(unsigned dst, const void* src, int bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes));
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void ldsm4(unsigned (&r)[4], unsigned addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}
__device__ __forceinline__ void ldsm4t(unsigned (&r)[4], unsigned addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

// d += a * b on one m16n8k16 tile (row-major a, column-major b, f32 accumulate).
__device__ __forceinline__ void mma(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
#if EQ_BF16
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

// Two f32 rounded to the storage type (nearest even), `lo` in the low half.
__device__ __forceinline__ unsigned pack2(float lo, float hi) {
    unsigned r;
#if EQ_BF16
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
#else
    asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
#endif
    return r;
}

__device__ __forceinline__ float ex2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

// Byte offset of chunk `ch` of row `r` in a swizzled tile.
__device__ __forceinline__ unsigned at(int r, int ch) { return (unsigned)((r * CH + (ch ^ (r & 7))) * 16); }

// Loads rows [row0, row0 + ROWS) of a [rows, EQ_D] matrix with row stride `sr` into a tile;
// rows at or past `limit` and chunks past EQ_D are zero.
template <int ROWS>
__device__ __forceinline__ void load_tile(unsigned dst, const EQ_T* g, long long sr, int row0, int limit) {
#pragma unroll
    for (int c = threadIdx.x; c < ROWS * CH; c += NT) {
        const int r = c / CH, ch = c % CH;
        const bool ok = row0 + r < limit && ch * 8 < EQ_D;
        const EQ_T* src = ok ? g + (long long)(row0 + r) * sr + ch * 8 : g;
        cp16(dst + at(r, ch), src, ok ? 16 : 0);
    }
}

}  // namespace eq_att

extern "C" __global__ void __launch_bounds__(EQ_NWARPS * 32, 1) EQ_KERNEL(EQ_PARAMS) {
    using namespace eq_att;
    extern __shared__ __align__(128) unsigned char eq_smem[];
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int mblocks = (EQ_SQ + EQ_BM - 1) / EQ_BM;
    const int mb = EQ_CAUSAL ? mblocks - 1 - (int)blockIdx.x : (int)blockIdx.x;
    const long long b = blockIdx.y;
    const long long b0 = b / (EQ_NB1 * EQ_NB2), b1 = (b / EQ_NB2) % EQ_NB1, b2 = b % EQ_NB2;
    const EQ_T* qg = EQ_QP + b0 * EQ_Q_S0 + b1 * EQ_Q_S1 + b2 * EQ_Q_S2;
    const EQ_T* kg = EQ_KP + b0 * EQ_K_S0 + b1 * EQ_K_S1 + b2 * EQ_K_S2;
    const EQ_T* vg = EQ_VP + b0 * EQ_V_S0 + b1 * EQ_V_S1 + b2 * EQ_V_S2;
    EQ_T* og = EQ_OP + b0 * EQ_O_S0 + b1 * EQ_O_S1 + b2 * EQ_O_S2;
#if EQ_BIAS
    const EQ_BT* bg = EQ_BP + b0 * EQ_B_S0 + b1 * EQ_B_S1 + b2 * EQ_B_S2;
#endif
    const int m0 = mb * EQ_BM;
    const unsigned sq = smem_u32(eq_smem);
    const unsigned sk = sq + EQ_BM * EQ_DP * 2;
    const unsigned sv = sk + 2 * EQ_BN * EQ_DP * 2;
    constexpr unsigned KV_BYTES = EQ_BN * EQ_DP * 2;
    const int n_end = EQ_CAUSAL ? (EQ_SK < m0 + EQ_BM ? EQ_SK : m0 + EQ_BM) : EQ_SK;
    const int ntiles = (n_end + EQ_BN - 1) / EQ_BN;
    // The first query row this warp owns (absolute), and this thread's row within an m16 tile.
    const int wrow = m0 + warp * MT * 16;
    const int g = lane >> 2, t = lane & 3;

    load_tile<EQ_BM>(sq, qg, EQ_Q_SR, m0, EQ_SQ);
    cp_commit();
    if (ntiles > 0) load_tile<EQ_BN>(sk, kg, EQ_K_SR, 0, EQ_SK);
    cp_commit();

#if EQ_Q_REGS
    unsigned qf[MT][KT][4];
    cp_wait<1>();
    __syncthreads();
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int kt = 0; kt < KT; ++kt) {
            const int r = warp * MT * 16 + mt * 16 + (lane & 15);
            ldsm4(qf[mt][kt], sq + at(r, kt * 2 + (lane >> 4)));
        }
#endif

    float o[MT][DT][4];
    float m_i[MT][2], l_i[MT][2];
#if EQ_DROPOUT
    const unsigned dseed = EQ_DROP_SEED, dkey0 = eq_dropout_key0(dseed);
#endif
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
        for (int dt = 0; dt < DT; ++dt)
#pragma unroll
            for (int e = 0; e < 4; ++e) o[mt][dt][e] = 0.0f;
        m_i[mt][0] = m_i[mt][1] = -EQ_INF;
        l_i[mt][0] = l_i[mt][1] = 0.0f;
    }

    for (int j = 0; j < ntiles; ++j) {
        const int n0 = j * EQ_BN;
        const unsigned kb = sk + (j & 1) * KV_BYTES, vb = sv + (j & 1) * KV_BYTES;
        load_tile<EQ_BN>(vb, vg, EQ_V_SR, n0, EQ_SK);
        cp_commit();
        cp_wait<1>();  // the keys of tile j (and the queries) have landed
        __syncthreads();
#if EQ_BIAS
        // A bias by key alone (a padding mask) is loaded before the products, which hide its
        // latency (eq_att_tile_bias, common.cuh).
        eq_att_tile_bias<SN> tb;
        tb.load(bg, n0, t);
#endif

        // s = q k^T for this warp's rows and the tile's EQ_BN keys.
        float s[MT][SN][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int nt = 0; nt < SN; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) s[mt][nt][e] = 0.0f;
#pragma unroll
        for (int kt = 0; kt < KT; ++kt) {
#if EQ_Q_REGS
#define EQ_QA(mt) qf[mt][kt]
#else
            unsigned qa[MT][4];
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
                const int r = warp * MT * 16 + mt * 16 + (lane & 15);
                ldsm4(qa[mt], sq + at(r, kt * 2 + (lane >> 4)));
            }
#define EQ_QA(mt) qa[mt]
#endif
#pragma unroll
            for (int np = 0; np < SN / 2; ++np) {
                unsigned bk[4];
                const int r = np * 16 + (lane & 7) + ((lane >> 4) << 3);
                ldsm4(bk, kb + at(r, kt * 2 + ((lane >> 3) & 1)));
#pragma unroll
                for (int mt = 0; mt < MT; ++mt) {
                    mma(s[mt][2 * np], EQ_QA(mt), bk[0], bk[1]);
                    mma(s[mt][2 * np + 1], EQ_QA(mt), bk[2], bk[3]);
                }
            }
#undef EQ_QA
        }

        // Prefetch the next key tile into the other buffer (its last reader, tile j - 1's
        // scores, finished before this iteration's barrier).
        if (j + 1 < ntiles) load_tile<EQ_BN>(sk + ((j + 1) & 1) * KV_BYTES, kg, EQ_K_SR, n0 + EQ_BN, EQ_SK);
        cp_commit();

#if EQ_BIAS
        // Scale, add the bias (natural units) and mask keys past the end (and above the diagonal).
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int nt = 0; nt < SN; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int col = n0 + nt * 8 + 2 * t + (e & 1);
                    const int row = wrow + mt * 16 + g + (e >> 1) * 8;
                    s[mt][nt][e] = (col >= EQ_SK || (EQ_CAUSAL && col > row))
                                       ? -EQ_INF
                                       : fmaf(s[mt][nt][e], EQ_SCALE, tb.at(bg, nt, e & 1, row, col));
                }
#else
        // Scale to base-2 units and mask keys past the end (and above the diagonal).
        const bool masked = n0 + EQ_BN > EQ_SK || (EQ_CAUSAL && n0 + EQ_BN - 1 > wrow);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int nt = 0; nt < SN; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    float x = s[mt][nt][e] * EQ_SCALE_LOG2;
                    if (masked) {
                        const int col = n0 + nt * 8 + 2 * t + (e & 1);
                        const int row = wrow + mt * 16 + g + (e >> 1) * 8;
                        if (col >= EQ_SK || (EQ_CAUSAL && col > row)) x = -EQ_INF;
                    }
                    s[mt][nt][e] = x;
                }
#endif

        // Online softmax: new row maxima (over the quad sharing a row), rescale, exponentiate.
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                float mx = m_i[mt][h];
#pragma unroll
                for (int nt = 0; nt < SN; ++nt) mx = fmaxf(mx, fmaxf(s[mt][nt][2 * h], s[mt][nt][2 * h + 1]));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
                const float mu = mx == -EQ_INF ? 0.0f : mx;
                const float alpha = ex2(EQ_TO2(m_i[mt][h] - mu));
                m_i[mt][h] = mx;
                float rs = 0.0f;
#pragma unroll
                for (int nt = 0; nt < SN; ++nt) {
                    const float p0 = ex2(EQ_TO2(s[mt][nt][2 * h] - mu)), p1 = ex2(EQ_TO2(s[mt][nt][2 * h + 1] - mu));
                    s[mt][nt][2 * h] = p0;
                    s[mt][nt][2 * h + 1] = p1;
                    rs += p0 + p1;
                }
                l_i[mt][h] = l_i[mt][h] * alpha + rs;
#pragma unroll
                for (int dt = 0; dt < DT; ++dt) {
                    o[mt][dt][2 * h] *= alpha;
                    o[mt][dt][2 * h + 1] *= alpha;
                }
            }

#if EQ_DROPOUT
        // Dropout: the dropped probabilities (counted in the row sums above) out of the product.
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int nt = 0; nt < SN; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int col = n0 + nt * 8 + 2 * t + (e & 1);
                    const int row = wrow + mt * 16 + g + (e >> 1) * 8;
                    if (!eq_att_keep(dseed, dkey0, b, row, col)) s[mt][nt][e] = 0.0f;
                }
#endif

        // The probabilities as A fragments: the accumulator layout of two n8 tiles is the
        // operand layout of one k16 step.
        unsigned pa[MT][SN / 2][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int kk = 0; kk < SN / 2; ++kk) {
                pa[mt][kk][0] = pack2(s[mt][2 * kk][0], s[mt][2 * kk][1]);
                pa[mt][kk][1] = pack2(s[mt][2 * kk][2], s[mt][2 * kk][3]);
                pa[mt][kk][2] = pack2(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
                pa[mt][kk][3] = pack2(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
            }

        cp_wait<1>();  // the values of tile j have landed
        __syncthreads();

        // o += p v.
#pragma unroll
        for (int kk = 0; kk < SN / 2; ++kk)
#pragma unroll
            for (int dp = 0; dp < DT / 2; ++dp) {
                unsigned bv[4];
                const int r = kk * 16 + (lane & 7) + (((lane >> 3) & 1) << 3);
                ldsm4t(bv, vb + at(r, dp * 2 + (lane >> 4)));
#pragma unroll
                for (int mt = 0; mt < MT; ++mt) {
                    mma(o[mt][2 * dp], pa[mt][kk], bv[0], bv[1]);
                    mma(o[mt][2 * dp + 1], pa[mt][kk], bv[2], bv[3]);
                }
            }
    }
    cp_wait<0>();

    // Epilogue: divide by the row sums (summed over the quad), stage the tile in shared memory
    // (over the queries, which no warp reads any more), store 16-byte chunks.
    float inv[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            float l = l_i[mt][h];
            l += __shfl_xor_sync(0xffffffffu, l, 1);
            l += __shfl_xor_sync(0xffffffffu, l, 2);
            l_i[mt][h] = l;
            inv[mt][h] = l > 0.0f ? EQ_DROP_FACTOR / l : 0.0f;
        }
    __syncthreads();
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int dt = 0; dt < DT; ++dt)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int r = warp * MT * 16 + mt * 16 + g + h * 8;
                const unsigned w = pack2(o[mt][dt][2 * h] * inv[mt][h], o[mt][dt][2 * h + 1] * inv[mt][h]);
                const unsigned addr = sq + at(r, dt) + 4 * t;
                asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(addr), "r"(w));
            }
    __syncthreads();
#pragma unroll
    for (int c = tid; c < EQ_BM * CH; c += NT) {
        const int r = c / CH, ch = c % CH;
        if (m0 + r < EQ_SQ && ch * 8 < EQ_D) {
            uint4 w;
            asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                         : "=r"(w.x), "=r"(w.y), "=r"(w.z), "=r"(w.w)
                         : "r"(sq + at(r, ch)));
            *reinterpret_cast<uint4*>(og + (long long)(m0 + r) * EQ_O_SR + ch * 8) = w;
        }
    }
#if EQ_LSE
    // lse = (m + log2 l) * ln 2, by the first thread of each quad.
    if (t == 0) {
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int row = wrow + mt * 16 + g + h * 8;
                if (row < EQ_SQ) EQ_LSEP[b * EQ_SQ + row] = (m_i[mt][h] + __log2f(l_i[mt][h])) * 0.69314718055994531f;
            }
    }
#endif
#if EQ_STATS
    // (m, log l), with a bias in natural units, by the first thread of each quad.
    if (t == 0) {
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int row = wrow + mt * 16 + g + h * 8;
                if (row < EQ_SQ) {
                    EQ_LSEP[(b * EQ_SQ + row) * 2] = m_i[mt][h];
                    EQ_LSEP[(b * EQ_SQ + row) * 2 + 1] = logf(l_i[mt][h]);
                }
            }
    }
#endif
}
#endif  // EQ_F32
