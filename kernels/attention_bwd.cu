// attention_bwd.cu: flash-style attention backward (FlashAttention-2 design) on tensor cores:
// kernels chosen by EQ_MODE that never hold the score matrix in device memory.
//
// Math, per batch index b and with s_ij = scale * <q_i, k_j> (keys j > i masked under
// EQ_CAUSAL, keys past EQ_SK always):
//   EQ_MODE 0 (attention_lse):     lse_i = log sum_j exp(s_ij)                      (f32)
//   with P_ij = exp(s_ij - lse_i) (0 where masked), dP_ij = <g_i, v_j>,
//   dS_ij = P_ij (dP_ij - delta_i) scale                (lse, delta: f32 [EQ_NB, EQ_SQ])
//   EQ_MODE 1 (attention_grad_q):  dq_i = sum_j dS_ij k_j
//   EQ_MODE 2 (attention_grad_k/v, and with EQ_DQ attention_grad_q too):
//     dk_j = sum_i dS_ij q_i (EQ_DK), dv_j = sum_i P_ij g_i (EQ_DV), dq_i = sum_j dS_ij k_j (EQ_DQ)
// Bias (EQ_BIAS, `attention_bias`'s backward): s_ij = scale * <q_i, k_j> + bias_ij in f32 (one
// fmaf, natural units, as the forward computes it), the bias of type EQ_BT addressed as
// EQ_BP + b0 * EQ_B_S0 + b1 * EQ_B_S1 + b2 * EQ_B_S2 + i * EQ_B_SR + j * EQ_B_SC (stride 0 along an
// axis it is broadcast along), or a bool mask there selecting EQ_BIAS_YES or EQ_BIAS_NO
// (EQ_BIAS_SEL). The row statistics are then two f32 per row ([EQ_NB, EQ_SQ, 2], column stride
// EQ_L_SC): the row maximum m and log l = log sum_j exp(s_ij - m), which mode 0 writes
// (attention_bias_lse) and the others read, with P_ij = exp(s_ij - max(m, -FLT_MAX) - max(log l,
// 0)): kept apart, not summed into one log-sum-exp, so that a row of equal fills near -FLT_MAX
// (a finfo.min mask) keeps weights 1 / keys, and a row whose every score is -inf (m and log l
// -inf) gets P = 0 (zero gradients, not NaN).
//
// Mode 0 and 1 run one block per EQ_BM query rows looping over key tiles; mode 2 one block per
// EQ_BM key rows looping over query tiles (its rows are keys). dk and dv are summed by one thread
// each in a fixed order, as are dq in mode 1 and the log-sum-exp: those results do not depend on
// scheduling. Under EQ_DQ the mode 2 block also multiplies each tile's dS by its keys and adds
// that part of dq into an f32 accumulator in device memory (EQ_DQACC, [EQ_NB, EQ_SQ, EQ_DP]) with
// f32 atomics (four at once on sm_90); the last of a batch index's blocks to arrive (counted in
// EQ_DQCNT[b], after a __threadfence) converts its accumulator to dq (times scale, rounded to
// the storage type) and zeroes the accumulator and the count. So dq is summed in the order the
// blocks run: its last bits depend on scheduling (never used under strict numerics). The
// accumulator ([EQ_NB, EQ_SQ16 rows (EQ_SQ rounded up to 16), EQ_DP]) is laid out in blocks of
// 16 rows by 16 columns (256 floats, row blocks outermost): in a block, rows 8 h + g at
// 128 h + 16 g, and the four columns 2t, 2t + 1, 8 + 2t, 9 + 2t that thread (g, t) of a warp
// adds at 4 t. So each atomic is 16 bytes and a warp's adds to one half block are 512
// contiguous bytes.
// f32 operands (EQ_F32) take a CUDA-core form of the same three modes (see below); otherwise:
// Products run as mma.sync m16n8k16 (bf16 or f16 inputs, f32 accumulate); P and dS are rounded
// to the storage type before the products that consume them (as FlashAttention does).
//
// Launch shape: grid (ceil(rows / EQ_BM), EQ_NB), block EQ_NWARPS * 32 threads (warp w owns
// rows [16 w, 16 w + 16) of the block's tile), dynamic shared memory EQ_SMEM_BYTES: the block's
// own tiles (queries and output gradient, or keys and values), and two buffers of the tiles it
// loops over (cp.async double buffering), plus (mode 2) two buffers of lse and delta and (EQ_DQ)
// one tile's dS, transposed ([EQ_BN keys][EQ_BM queries]): stored after an iteration's last
// barrier and multiplied by the keys at the end of the next iteration (after its own products,
// before its last barrier), so that dq adds no barrier of its own.
//
// Layout: the written statistics are contiguous, [EQ_NB, EQ_SQ, 1 or 2]. Every other tensor T
// is addressed as base + b0 * EQ_T_S0 + b1 * EQ_T_S1 + b2 * EQ_T_S2 + row * EQ_T_SR + column,
// with b = (b0 * EQ_NB1 + b1) * EQ_NB2 + b2 (T: Q, K, V, G, L the statistics, DL delta read; DQ,
// DK, DV written), so views are read in place (heads split from a projection, transposed;
// grouped-query keys and values repeated over a group's query heads, stride 0) and the
// gradients written in place: heads merged, each the column block of d(qkv) its consumer reads
// (base moved by the block's offset; rows and batch strides even, stored two elements at a time).
// q, k, v and g have a contiguous head and strides of multiples of 8 elements (16-byte
// cp.async), which the code generator checks. EQ_D is a multiple of 8 up to 128. In shared memory a row holds EQ_DP = EQ_D rounded up to 64
// elements (zero-filled past EQ_D), in 16-byte chunks placed at chunk ^ (row & 7) (conflict-free
// ldmatrix and cp.async).
//
// Invariants: compiles with NVRTC and nothing but the architecture flag (sm_80 or later);
// rows past the ends are zero-filled on load, masked, and never stored; every thread reaches
// every __syncthreads; each output element is written exactly once; under EQ_DQ the accumulator
// and the counts are zero before every launch and after it (the runtime zeroes them once).
#ifndef EQ_COMMON_CUH
#include "common.cuh"
#endif

#ifndef EQ_GENERATED
// Default instance: dq, dk, dv of attention(q, k, v, 0.125, 0) over bf16 [8, 16, 2048, 64].
#define EQ_KERNEL attention_bwd_bf16
#define EQ_T eq_bf16
#define EQ_BF16 1
#define EQ_MODE 2
#define EQ_DQ 1
#define EQ_DK 1
#define EQ_DV 1
#define EQ_D 64
#define EQ_SQ 2048
#define EQ_SK 2048
#define EQ_NB 128
#define EQ_CAUSAL 0
#define EQ_SCALE 0.125f
#define EQ_SCALE_LOG2 0.18033688011112042f
#define EQ_PARAMS                                                                                        \
    const eq_bf16* __restrict__ p_q, const eq_bf16* __restrict__ p_k, const eq_bf16* __restrict__ p_v,     \
        const eq_bf16* __restrict__ p_g, const float* __restrict__ p_lse, const float* __restrict__ p_del, \
        eq_bf16* __restrict__ p_dq, eq_bf16* __restrict__ p_dk, eq_bf16* __restrict__ p_dv,                \
        float* __restrict__ eq_dqacc, unsigned* __restrict__ eq_count
#define EQ_QP p_q
#define EQ_KP p_k
#define EQ_VP p_v
#define EQ_GP p_g
#define EQ_LSEP p_lse
#define EQ_DELP p_del
#define EQ_DQP p_dq
#define EQ_DKP p_dk
#define EQ_DVP p_dv
#define EQ_DQACC eq_dqacc
#define EQ_DQCNT eq_count
#define EQ_NB1 1
#define EQ_NB2 1
#define EQ_Q_S0 131072LL
#define EQ_Q_S1 0LL
#define EQ_Q_S2 0LL
#define EQ_Q_SR 64LL
#define EQ_K_S0 131072LL
#define EQ_K_S1 0LL
#define EQ_K_S2 0LL
#define EQ_K_SR 64LL
#define EQ_V_S0 131072LL
#define EQ_V_S1 0LL
#define EQ_V_S2 0LL
#define EQ_V_SR 64LL
#define EQ_G_S0 131072LL
#define EQ_G_S1 0LL
#define EQ_G_S2 0LL
#define EQ_G_SR 64LL
#define EQ_L_S0 2048LL
#define EQ_L_S1 0LL
#define EQ_L_S2 0LL
#define EQ_L_SR 1LL
#define EQ_DL_S0 2048LL
#define EQ_DL_S1 0LL
#define EQ_DL_S2 0LL
#define EQ_DL_SR 1LL
#define EQ_DQ_S0 131072LL
#define EQ_DQ_S1 0LL
#define EQ_DQ_S2 0LL
#define EQ_DQ_SR 64LL
#define EQ_DK_S0 131072LL
#define EQ_DK_S1 0LL
#define EQ_DK_S2 0LL
#define EQ_DK_SR 64LL
#define EQ_DV_S0 131072LL
#define EQ_DV_S1 0LL
#define EQ_DV_S2 0LL
#define EQ_DV_SR 64LL
#endif

#ifndef EQ_BM
#define EQ_BM 64
#endif
#ifndef EQ_BN
#define EQ_BN 64
#endif
#ifndef EQ_NWARPS
#define EQ_NWARPS 4
#endif
#ifndef EQ_DK
#define EQ_DK 0
#endif
#ifndef EQ_DV
#define EQ_DV 0
#endif
#ifndef EQ_DQ
#define EQ_DQ 0
#endif
#ifndef EQ_BIAS
#define EQ_BIAS 0
#endif
#ifndef EQ_BIAS_SEL
#define EQ_BIAS_SEL 0
#endif
// f32 row statistics per query row kept in shared memory by mode 2: lse (or m), delta, and
// with a bias log l.
#define EQ_NSTAT (2 + EQ_BIAS)
// Dropout (EQ_DROPOUT, the backward of `attention_dropout` and `attention_bias_dropout`): Z_ij
// is EQ_DROP_SCALE where dropout's generator keeps flat index (b * EQ_SQ + i) * EQ_SK + j of the
// probabilities (seed EQ_DROP_SEED, threshold EQ_DROP_THRESHOLD), else 0, computed again from
// the index as the forward computed it; then dS_ij = P_ij (dP_ij Z_ij - delta_i) scale and
// dv_j = sum_i P_ij Z_ij g_i (the kept P summed, times EQ_DROP_SCALE at the end). eq_att_keep
// and EQ_DROP_FACTOR are in common.cuh, shared with the forward.
#ifndef EQ_DROPOUT
#define EQ_DROPOUT 0
#endif
// The offset of batch entry (b0, b1, b2) in read tensor T.
#define EQ_BOFF(T) (b0 * EQ_##T##_S0 + b1 * EQ_##T##_S1 + b2 * EQ_##T##_S2)
// This block's batch index b (its axes b0, b1, b2) and its batch entry's q and k (qg, kg, of
// element type T) and, under EQ_BIAS, bias (bg); EQ_BWD_GRAD_OPERANDS: v, g (vg, gg), the
// statistics and delta (lg, dg).
#if EQ_BIAS
#define EQ_BWD_BIAS_POINTER const EQ_BT* bg = EQ_BP + b0 * EQ_B_S0 + b1 * EQ_B_S1 + b2 * EQ_B_S2;
#else
#define EQ_BWD_BIAS_POINTER
#endif
#define EQ_BWD_BATCH(T)                                                                           \
    const long long b = blockIdx.y;                                                               \
    const long long b0 = b / (EQ_NB1 * EQ_NB2), b1 = (b / EQ_NB2) % EQ_NB1, b2 = b % EQ_NB2;     \
    const T* qg = EQ_QP + EQ_BOFF(Q);                                                             \
    const T* kg = EQ_KP + EQ_BOFF(K);                                                             \
    EQ_BWD_BIAS_POINTER
// The address of statistic `which` of query row `row` (0: the log-sum-exp, or with a bias the
// row maximum; 1: delta; 2: with a bias, the log row sum).
#if EQ_BIAS
#define EQ_BWD_STAT(which, row) \
    ((which) == 1 ? dg + (row) * EQ_DL_SR : lg + (row) * EQ_L_SR + ((which) == 2 ? EQ_L_SC : 0))
#else
#define EQ_BWD_STAT(which, row) ((which) == 1 ? dg + (row) * EQ_DL_SR : lg + (row) * EQ_L_SR)
#endif
#define EQ_BWD_GRAD_OPERANDS(T)          \
    const T* vg = EQ_VP + EQ_BOFF(V);     \
    const T* gg = EQ_GP + EQ_BOFF(G);     \
    const float* lg = EQ_LSEP + EQ_BOFF(L); \
    const float* dg = EQ_DELP + EQ_BOFF(DL);
#define EQ_LOG2E 1.4426950408889634f

#ifndef EQ_F32
#define EQ_F32 0
#endif

#if EQ_F32
// ---- f32 operands: the same three modes on CUDA cores, in full f32 (no tensor cores) ----
// Register tiles as the forward's f32 path (kernels/attention.cu) has them. A block of EQ_FNT
// (128) threads is a grid of EQ_FTR = 16 row groups by EQ_FTC = 8 threads a row; it owns
// EQ_FBM = 64 rows (queries in modes 0 and 1, keys in mode 2) and walks tiles of EQ_FBN =
// EQ_FTC EQ_FK columns (keys in modes 0 and 1, queries in mode 2; EQ_FK = 8 for heads up to
// 64, 4 over it). Thread (tr, tc) holds the scores of rows tr + 16 a (a < 4) and columns
// tc + 8 c (c < EQ_FK) of a tile, and its rows' gradient over the head's float4 columns
// tc + 8 u (u < EQ_FU). Per tile:
//   - s = A B^T and (modes 1 and 2, where dS is needed) dP = A' B'^T, each over the head by
//     float4 reads of shared memory (A, A' the block's rows: q, g in mode 1, k, v in mode 2;
//     B, B' the tile's: k, v in mode 1, q, g in mode 2);
//   - P and dS per score, as the 16-bit kernels compute them (in natural units, expf);
//   - P (times dropout's mask) or dS into the block's score tile (rows EQ_FBN + 8 floats apart),
//     read back by the warp that wrote it (its rows): acc += tile C, C the tile's rows
//     (mode 1: dq += dS k; mode 2: dv += P^T g, dk += dS^T q).
// Each gradient element is summed by one thread in a fixed order (deterministic), except the
// query gradient under EQ_DQ in mode 2 (heads up to 64): dS is also stored transposed into a
// second score tile, and after a barrier each thread sums dS k over the block's keys for 4 of
// the tile's queries and 4 float4 columns, added with f32 atomics (four at once on sm_90) into
// the accumulator EQ_DQACC ([EQ_NB, EQ_SQ, EQ_FDP], zero before the launch); the last block of a
// batch index (counted in EQ_DQCNT) writes dq = scale * acc and leaves the accumulator and the
// count zero, as the 16-bit kernel does. Tiles load by 16 bytes (cp.async): the code generator requires a head of a
// multiple of 4 and strides and offsets of multiples of 4 elements. Shared memory: the block's
// two row tiles, one buffer of each of the walked tiles (two blocks of heads up to 64 fit an
// SM: their loads overlap the other's products), the score tile, and in mode 2 the tile's
// query statistics. Launch shape: grid (ceil(rows / 64), EQ_NB), block 128 threads, dynamic
// shared memory EQ_SMEM_BYTES.
#define EQ_FNT 128
#define EQ_FTC 8
#define EQ_FTR (EQ_FNT / EQ_FTC)
#define EQ_FR 4
#define EQ_FBM (EQ_FTR * EQ_FR)
#define EQ_FDP (((EQ_D + 3) / 4) * 4)
#define EQ_FK (EQ_FDP <= 64 ? 8 : 4)
#define EQ_FBN (EQ_FTC * EQ_FK)
#define EQ_FU ((EQ_FDP / 4 + EQ_FTC - 1) / EQ_FTC)
#define EQ_FS (EQ_FDP + 4)
#define EQ_FPS (EQ_FBN + EQ_FTC)
#if EQ_MODE == 0
#define EQ_SMEM_BYTES ((EQ_FBM + EQ_FBN) * EQ_FS * 4)
#else
#define EQ_SMEM_BYTES \
    ((2 * EQ_FBM * EQ_FS + 2 * EQ_FBN * EQ_FS + (1 + EQ_DQ) * EQ_FBM * EQ_FPS + (2 + EQ_BIAS) * EQ_FBN) * 4)
#endif
#if EQ_MODE == 2 && EQ_DQ && EQ_FBN != EQ_FBM
#error "the f32 key kernel sums the query gradient for heads up to 64 only (square tiles)"
#endif

namespace eq_attf {
static_assert(EQ_D % 4 == 0 && EQ_D > 0 && EQ_D <= 128, "f32 heads: multiples of 4 up to 128");
constexpr int DP4 = EQ_FDP / 4;
// Rows [r0, r0 + ROWS) of a [*, EQ_D] matrix of row stride `sr` into a tile of rows EQ_FS
// apart, zero at and past `limit`. No commit.
template <int ROWS>
__device__ __forceinline__ void load_rows(float* dst, const float* src, long long sr, int r0, int limit, int tid) {
    for (int c = tid; c < ROWS * DP4; c += EQ_FNT) {
        const int r = c / DP4, c4 = c % DP4;
        const bool ok = r0 + r < limit;
        eq_cp_async_n<16>(dst + r * EQ_FS + 4 * c4, ok ? src + (long long)(r0 + r) * sr + 4 * c4 : src, ok ? 16 : 0);
    }
}
// s[a][c] = <row tr + 16 a of `at`, row tc + 8 c of `bt`> over the head, in order.
__device__ __forceinline__ void scores(float (&s)[EQ_FR][EQ_FK], const float* at, const float* bt, int tr, int tc) {
#pragma unroll
    for (int a = 0; a < EQ_FR; ++a)
#pragma unroll
        for (int c = 0; c < EQ_FK; ++c) s[a][c] = 0.0f;
    const float* ar = at + tr * EQ_FS;
    const float* br = bt + tc * EQ_FS;
#pragma unroll 4
    for (int d4 = 0; d4 < DP4; ++d4) {
        float4 av[EQ_FR], bv[EQ_FK];
#pragma unroll
        for (int a = 0; a < EQ_FR; ++a) av[a] = *reinterpret_cast<const float4*>(ar + EQ_FTR * a * EQ_FS + 4 * d4);
#pragma unroll
        for (int c = 0; c < EQ_FK; ++c) bv[c] = *reinterpret_cast<const float4*>(br + EQ_FTC * c * EQ_FS + 4 * d4);
#pragma unroll
        for (int a = 0; a < EQ_FR; ++a)
#pragma unroll
            for (int c = 0; c < EQ_FK; ++c) s[a][c] = eq_dot4(av[a], bv[c], s[a][c]);
    }
}
// acc[a][u] += sum over the tile's columns j of the score tile's row tr + 16 a at j times row j
// of `ct` (its float4 column tc + 8 u): the rows this thread's warp wrote.
__device__ __forceinline__ void accumulate(float4 (&acc)[EQ_FR][EQ_FU], const float* sp, const float* ct, int tr,
                                           int tc) {
    const float* prow = sp + tr * EQ_FPS;
#pragma unroll 2
    for (int j4 = 0; j4 < EQ_FBN / 4; ++j4) {
        float4 pv[EQ_FR];
#pragma unroll
        for (int a = 0; a < EQ_FR; ++a) pv[a] = *reinterpret_cast<const float4*>(prow + EQ_FTR * a * EQ_FPS + 4 * j4);
#pragma unroll
        for (int jj = 0; jj < 4; ++jj)
#pragma unroll
            for (int u = 0; u < EQ_FU; ++u)
                if (DP4 % EQ_FTC == 0 || tc + EQ_FTC * u < DP4) {
                    const float4 cv = *reinterpret_cast<const float4*>(ct + (4 * j4 + jj) * EQ_FS + 4 * (tc + EQ_FTC * u));
#pragma unroll
                    for (int a = 0; a < EQ_FR; ++a) eq_fma4(acc[a][u], eq_lane4(pv[a], jj), cv);
                }
    }
}
// Stores rows row0 + tr + 16 a (below `limit`) of an accumulator times `mul` to a matrix of row
// stride `rs` (contiguous head).
__device__ __forceinline__ void store(float* out, long long rs, const float4 (&acc)[EQ_FR][EQ_FU], float mul, int row0,
                                      int limit, int tr, int tc) {
#pragma unroll
    for (int a = 0; a < EQ_FR; ++a) {
        const int row = row0 + tr + EQ_FTR * a;
        if (row >= limit) continue;
#pragma unroll
        for (int u = 0; u < EQ_FU; ++u) {
            const int c4 = tc + EQ_FTC * u;
            if (c4 >= DP4) continue;
#pragma unroll
            for (int e = 0; e < 4; ++e)
                if (4 * c4 + e < EQ_D) out[(long long)row * rs + 4 * c4 + e] = eq_lane4(acc[a][u], e) * mul;
        }
    }
}
#if EQ_MODE == 2 && EQ_DQ
// Adds a float4 to 16-byte aligned accumulator entries.
__device__ __forceinline__ void add4(float* p, const float4& v) {
#if __CUDA_ARCH__ >= 900
    asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"l"(p), "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w)
                 : "memory");
#else
    atomicAdd(p, v.x);
    atomicAdd(p + 1, v.y);
    atomicAdd(p + 2, v.z);
    atomicAdd(p + 3, v.w);
#endif
}
#endif
__device__ __forceinline__ void zero(float4 (&acc)[EQ_FR][EQ_FU]) {
#pragma unroll
    for (int a = 0; a < EQ_FR; ++a)
#pragma unroll
        for (int u = 0; u < EQ_FU; ++u) acc[a][u] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
}
#if EQ_BIAS
// The bias of a tile's scores this thread holds (rows r0 + tr + 16 a, columns c0 + tc + 8 c:
// queries by keys, or keys by queries where `keys_are_rows`), loaded before the tile's products
// (whose arithmetic hides the loads): raw values, 0 outside the scores.
__device__ __forceinline__ void load_bias(EQ_BT (&bv)[EQ_FR][EQ_FK], const EQ_BT* bg, int r0, int c0, int tr, int tc,
                                          bool keys_are_rows) {
#pragma unroll
    for (int a = 0; a < EQ_FR; ++a)
#pragma unroll
        for (int c = 0; c < EQ_FK; ++c) {
            const int r = r0 + tr + EQ_FTR * a, cc = c0 + tc + EQ_FTC * c;
            const int row = keys_are_rows ? cc : r, col = keys_are_rows ? r : cc;
            bv[a][c] = bg[row < EQ_SQ && col < EQ_SK ? (long long)row * EQ_B_SR + (long long)col * EQ_B_SC : 0LL];
        }
}
#endif
}  // namespace eq_attf

#if EQ_MODE == 0
// ---- the row statistics of each query row: the forward's online max and sum, no values ----
extern "C" __global__ void __launch_bounds__(EQ_FNT, 2) EQ_KERNEL(EQ_PARAMS) {
    using namespace eq_attf;
    extern __shared__ __align__(16) float eq_fsmem[];
    const int tid = threadIdx.x, tr = tid / EQ_FTC, tc = tid % EQ_FTC;
    const int mblocks = (EQ_SQ + EQ_FBM - 1) / EQ_FBM;
    const int m0 = (EQ_CAUSAL ? mblocks - 1 - (int)blockIdx.x : (int)blockIdx.x) * EQ_FBM;
    EQ_BWD_BATCH(float)
    float* sq = eq_fsmem;
    float* sk = sq + EQ_FBM * EQ_FS;
    const int n_end = EQ_CAUSAL ? (EQ_SK < m0 + EQ_FBM ? EQ_SK : m0 + EQ_FBM) : EQ_SK;
    const int ntiles = (n_end + EQ_FBN - 1) / EQ_FBN;
    load_rows<EQ_FBM>(sq, qg, EQ_Q_SR, m0, EQ_SQ, tid);
    float m[EQ_FR], l[EQ_FR];
#pragma unroll
    for (int a = 0; a < EQ_FR; ++a) {
        m[a] = -EQ_INF;
        l[a] = 0.0f;
    }
    for (int t = 0; t < ntiles; ++t) {
        const int n0 = t * EQ_FBN;
        load_rows<EQ_FBN>(sk, kg, EQ_K_SR, n0, EQ_SK, tid);
        eq_cp_async_commit();
#if EQ_BIAS
        EQ_BT bv[EQ_FR][EQ_FK];
        load_bias(bv, bg, m0, n0, tr, tc, false);
#endif
        eq_cp_async_wait_all();
        __syncthreads();
        float s[EQ_FR][EQ_FK];
        scores(s, sq, sk, tr, tc);
#pragma unroll
        for (int a = 0; a < EQ_FR; ++a) {
            const int row = m0 + tr + EQ_FTR * a;
            float mx = -EQ_INF;
#pragma unroll
            for (int c = 0; c < EQ_FK; ++c) {
                const int col = n0 + tc + EQ_FTC * c;
#if EQ_BIAS
                const float x = fmaf(s[a][c], EQ_SCALE, eq_att_bias_of(bv[a][c]));
#else
                const float x = s[a][c] * EQ_SCALE;
#endif
                s[a][c] = (col >= EQ_SK || (EQ_CAUSAL && col > row)) ? -EQ_INF : x;
                mx = fmaxf(mx, s[a][c]);
            }
#pragma unroll
            for (int x = EQ_FTC / 2; x >= 1; x >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, x));
            const float mnew = fmaxf(m[a], mx);
            const float mu = mnew == -EQ_INF ? 0.0f : mnew;
            float rs = 0.0f;
#pragma unroll
            for (int c = 0; c < EQ_FK; ++c) rs += expf(s[a][c] - mu);
            l[a] = l[a] * expf(m[a] - mu) + rs;
            m[a] = mnew;
        }
        __syncthreads();  // the key tile is consumed before it is loaded again
    }
#pragma unroll
    for (int a = 0; a < EQ_FR; ++a) {
#pragma unroll
        for (int x = EQ_FTC / 2; x >= 1; x >>= 1) l[a] += __shfl_xor_sync(0xffffffffu, l[a], x);
        const int row = m0 + tr + EQ_FTR * a;
        if (tc != 0 || row >= EQ_SQ) continue;
#if EQ_BIAS
        // The row maximum and the log of the row sum (-inf both for a row of -inf scores).
        EQ_LSEOUT[(b * EQ_SQ + row) * 2] = m[a];
        EQ_LSEOUT[(b * EQ_SQ + row) * 2 + 1] = logf(l[a]);
#else
        EQ_LSEOUT[b * EQ_SQ + row] = m[a] + logf(l[a]);
#endif
    }
}

#else
// ---- mode 1: dq, one block per query tile walking key tiles; mode 2: dk and/or dv, one
// block per key tile walking query tiles ----
extern "C" __global__ void __launch_bounds__(EQ_FNT, EQ_FDP <= 64 ? 2 : 1) EQ_KERNEL(EQ_PARAMS) {
    using namespace eq_attf;
    extern __shared__ __align__(16) float eq_fsmem[];
    const int tid = threadIdx.x, tr = tid / EQ_FTC, tc = tid % EQ_FTC;
    EQ_BWD_BATCH(float)
    EQ_BWD_GRAD_OPERANDS(float)
    float* ra = eq_fsmem;                 // the block's rows: q (mode 1) or k (mode 2)
    float* rb = ra + EQ_FBM * EQ_FS;      // g (mode 1) or v (mode 2)
    float* ta = rb + EQ_FBM * EQ_FS;      // the tile's rows: k (mode 1) or q (mode 2)
    float* tb = ta + EQ_FBN * EQ_FS;      // v (mode 1) or g (mode 2)
    float* sp = tb + EQ_FBN * EQ_FS;      // [EQ_FBM][EQ_FPS]: P or dS of the block's rows
#if EQ_MODE == 2
    float* st = sp + EQ_FBM * EQ_FPS;     // [2 + EQ_BIAS][EQ_FBN]: the tile's query statistics
#if EQ_DQ
    float* spt = st + (2 + EQ_BIAS) * EQ_FBN;  // [EQ_FBN][EQ_FPS]: dS transposed (rows: queries)
    float* dqacc = EQ_DQACC + b * EQ_SQ * EQ_FDP;
#endif
#endif
#if EQ_DROPOUT
    const unsigned dseed = EQ_DROP_SEED, dkey0 = eq_dropout_key0(dseed);
#endif
#if EQ_MODE == 1
    const int mblocks = (EQ_SQ + EQ_FBM - 1) / EQ_FBM;
    const int r0 = (EQ_CAUSAL ? mblocks - 1 - (int)blockIdx.x : (int)blockIdx.x) * EQ_FBM;
    const int c_start = 0;
    const int c_end = EQ_CAUSAL ? (EQ_SK < r0 + EQ_FBM ? EQ_SK : r0 + EQ_FBM) : EQ_SK;
    load_rows<EQ_FBM>(ra, qg, EQ_Q_SR, r0, EQ_SQ, tid);
    load_rows<EQ_FBM>(rb, gg, EQ_G_SR, r0, EQ_SQ, tid);
    // This thread's rows' statistics: lse (or the row maximum, at least -FLT_MAX, and the log
    // row sum, at least 0) and delta.
    float lse[EQ_FR], del[EQ_FR];
#if EQ_BIAS
    float mrow[EQ_FR];
#endif
#pragma unroll
    for (int a = 0; a < EQ_FR; ++a) {
        const int row = r0 + tr + EQ_FTR * a;
        const bool ok = row < EQ_SQ;
#if EQ_BIAS
        mrow[a] = ok ? fmaxf(lg[row * EQ_L_SR], -3.402823466e38f) : 0.0f;
        lse[a] = ok ? fmaxf(lg[row * EQ_L_SR + EQ_L_SC], 0.0f) : 0.0f;
#else
        lse[a] = ok ? lg[row * EQ_L_SR] : 0.0f;
#endif
        del[a] = ok ? dg[row * EQ_DL_SR] : 0.0f;
    }
    float4 dq[EQ_FR][EQ_FU];
    zero(dq);
#else
    const int r0 = (int)blockIdx.x * EQ_FBM;  // keys
    const int c_start = EQ_CAUSAL ? r0 / EQ_FBN * EQ_FBN : 0;
    const int c_end = EQ_SQ;
    load_rows<EQ_FBM>(ra, kg, EQ_K_SR, r0, EQ_SK, tid);
    load_rows<EQ_FBM>(rb, vg, EQ_V_SR, r0, EQ_SK, tid);
#if EQ_DK
    float4 dk[EQ_FR][EQ_FU];
    zero(dk);
#endif
#if EQ_DV
    float4 dv[EQ_FR][EQ_FU];
    zero(dv);
#endif
#endif
    for (int c0 = c_start; c0 < c_end; c0 += EQ_FBN) {
#if EQ_MODE == 1
        load_rows<EQ_FBN>(ta, kg, EQ_K_SR, c0, EQ_SK, tid);
        load_rows<EQ_FBN>(tb, vg, EQ_V_SR, c0, EQ_SK, tid);
#else
        load_rows<EQ_FBN>(ta, qg, EQ_Q_SR, c0, EQ_SQ, tid);
        load_rows<EQ_FBN>(tb, gg, EQ_G_SR, c0, EQ_SQ, tid);
        for (int c = tid; c < (2 + EQ_BIAS) * EQ_FBN; c += EQ_FNT) {
            const int r = c % EQ_FBN, which = c / EQ_FBN;
            const bool ok = c0 + r < EQ_SQ;
            const long long row = ok ? c0 + r : 0;
            eq_cp_async_n<4>(st + c, EQ_BWD_STAT(which, row), ok ? 4 : 0);
        }
#endif
        eq_cp_async_commit();
#if EQ_BIAS
        EQ_BT bv[EQ_FR][EQ_FK];
        load_bias(bv, bg, r0, c0, tr, tc, EQ_MODE == 2);
#endif
        eq_cp_async_wait_all();
        __syncthreads();
        float p[EQ_FR][EQ_FK];
        scores(p, ra, ta, tr, tc);
#if EQ_MODE == 1 || EQ_DK
        float dp[EQ_FR][EQ_FK];
        scores(dp, rb, tb, tr, tc);
#endif
#if EQ_DROPOUT
        unsigned kept = 0xffffffffu;  // bit EQ_FK a + c: dropout keeps score (a, c)
#define EQ_FKEPT(a, c) ((kept >> (EQ_FK * (a) + (c))) & 1u)
#else
#define EQ_FKEPT(a, c) 1u
#endif
#pragma unroll
        for (int a = 0; a < EQ_FR; ++a)
#pragma unroll
            for (int c = 0; c < EQ_FK; ++c) {
                const int row = r0 + tr + EQ_FTR * a, col = c0 + tc + EQ_FTC * c;
#if EQ_MODE == 1
                const int qi = row, kj = col;
                const float ls = lse[a];
#if EQ_BIAS
                const float mx = mrow[a];
#endif
#else
                const int qi = col, kj = row;
                const int qc = tc + EQ_FTC * c;
#if EQ_BIAS
                const float mx = fmaxf(st[qc], -3.402823466e38f), ls = fmaxf(st[2 * EQ_FBN + qc], 0.0f);
#else
                const float ls = st[qc];
#endif
#endif
#if EQ_BIAS
                float x = expf(fmaf(p[a][c], EQ_SCALE, eq_att_bias_of(bv[a][c])) - mx - ls);
#else
                float x = expf(p[a][c] * EQ_SCALE - ls);
#endif
                if (qi >= EQ_SQ || kj >= EQ_SK || (EQ_CAUSAL && kj > qi)) x = 0.0f;
                p[a][c] = x;
#if EQ_DROPOUT
                if (!eq_att_keep(dseed, dkey0, b, qi, kj)) kept &= ~(1u << (EQ_FK * a + c));
#endif
            }
#if EQ_MODE == 2 && EQ_DV
        // dv += (P Z)^T g (the kept P; times the dropout scale at the end).
#pragma unroll
        for (int a = 0; a < EQ_FR; ++a)
#pragma unroll
            for (int c = 0; c < EQ_FK; ++c)
                sp[(tr + EQ_FTR * a) * EQ_FPS + tc + EQ_FTC * c] = EQ_FKEPT(a, c) ? p[a][c] : 0.0f;
        __syncwarp();
        accumulate(dv, sp, tb, tr, tc);
        __syncwarp();  // the warp's P rows are read before dS overwrites them
#endif
#if EQ_MODE == 1 || EQ_DK
        // dS = P (dP Z - delta) (times the scale at the end).
#pragma unroll
        for (int a = 0; a < EQ_FR; ++a)
#pragma unroll
            for (int c = 0; c < EQ_FK; ++c) {
#if EQ_MODE == 1
                const float dl = del[a];
#else
                const float dl = st[EQ_FBN + tc + EQ_FTC * c];
#endif
#if EQ_DROPOUT
                const float z = EQ_FKEPT(a, c) ? EQ_DROP_SCALE : 0.0f;
                const float ds = p[a][c] * (dp[a][c] * z - dl);
#else
                const float ds = p[a][c] * (dp[a][c] - dl);
#endif
                sp[(tr + EQ_FTR * a) * EQ_FPS + tc + EQ_FTC * c] = ds;
#if EQ_MODE == 2 && EQ_DQ
                spt[(tc + EQ_FTC * c) * EQ_FPS + tr + EQ_FTR * a] = ds;
#endif
            }
        __syncwarp();
#if EQ_MODE == 1
        accumulate(dq, sp, ta, tr, tc);  // dq += dS k
#else
        accumulate(dk, sp, ta, tr, tc);  // dk += dS^T q
#endif
#endif
#if EQ_MODE == 2 && EQ_DQ
        // dq[queries c0 + tr + 16 a] += dS k over this block's keys, from every warp's dS.
        __syncthreads();
        {
            float4 part[EQ_FR][EQ_FU];
            zero(part);
            accumulate(part, spt, ra, tr, tc);
#pragma unroll
            for (int a = 0; a < EQ_FR; ++a) {
                const int qi = c0 + tr + EQ_FTR * a;
                if (qi >= EQ_SQ) continue;
#pragma unroll
                for (int u = 0; u < EQ_FU; ++u)
                    if (DP4 % EQ_FTC == 0 || tc + EQ_FTC * u < DP4)
                        add4(dqacc + (long long)qi * EQ_FDP + 4 * (tc + EQ_FTC * u), part[a][u]);
            }
        }
#endif
        __syncthreads();  // the tiles are consumed before they are loaded again
    }
#if EQ_MODE == 1
    store(EQ_DQP + EQ_BOFF(DQ), EQ_DQ_SR, dq, EQ_SCALE, r0, EQ_SQ, tr, tc);
#else
#if EQ_DK
    store(EQ_DKP + EQ_BOFF(DK), EQ_DK_SR, dk, EQ_SCALE, r0, EQ_SK, tr, tc);
#endif
#if EQ_DV
    store(EQ_DVP + EQ_BOFF(DV), EQ_DV_SR, dv, EQ_DROP_FACTOR, r0, EQ_SK, tr, tc);
#endif
#if EQ_DQ
    // The last block of this batch index to arrive writes dq (and leaves the accumulator and
    // the count zero).
    if (eq_arrive_last(EQ_DQCNT + b)) {
        float* out = EQ_DQP + EQ_BOFF(DQ);
        for (int i = tid; i < EQ_SQ * DP4; i += EQ_FNT) {
            const int row = i / DP4, c4 = i % DP4;
            float4* src = reinterpret_cast<float4*>(dqacc) + i;
            const float4 v = __ldcg(src);
            __stcg(src, make_float4(0.0f, 0.0f, 0.0f, 0.0f));
#pragma unroll
            for (int e = 0; e < 4; ++e)
                if (4 * c4 + e < EQ_D) out[(long long)row * EQ_DQ_SR + 4 * c4 + e] = eq_lane4(v, e) * EQ_SCALE;
        }
        if (tid == 0) EQ_DQCNT[b] = 0;
    }
#endif
#endif
}
#endif

#else  // 16-bit operands

#define EQ_DP (((EQ_D + 63) / 64) * 64)
#define EQ_TILE_BYTES (EQ_BM * EQ_DP * 2)
#if EQ_MODE == 0
#define EQ_SMEM_BYTES (3 * EQ_TILE_BYTES)
#elif EQ_MODE == 1
#define EQ_SMEM_BYTES (6 * EQ_TILE_BYTES)
#else
#define EQ_SMEM_BYTES (6 * EQ_TILE_BYTES + 2 * EQ_NSTAT * EQ_BM * 4 + EQ_DQ * EQ_BN * EQ_BM * 2)
#endif

namespace eq_attb {

constexpr int NT = EQ_NWARPS * 32;  // threads
constexpr int SN = EQ_BN / 8;       // n8 tiles of a score tile
constexpr int KT = EQ_DP / 16;      // k16 steps over the head
constexpr int DT = EQ_DP / 8;       // n8 tiles over the head
constexpr int CH = EQ_DP / 8;       // 16-byte chunks of a shared row
static_assert(EQ_BM == 16 * EQ_NWARPS, "a warp owns 16 rows");
static_assert(EQ_BM == EQ_BN, "square tiles (one tile size for both loops)");
static_assert(EQ_D % 8 == 0 && EQ_D > 0 && EQ_D <= 128, "EQ_D must be a multiple of 8 up to 128");

__device__ __forceinline__ unsigned smem_u32(const void* p) {
    unsigned r;
    asm("{ .reg .u64 a; cvta.to.shared.u64 a, %1; cvt.u32.u64 %0, a; }" : "=r"(r) : "l"(p));
    return r;
}
__device__ __forceinline__ void cp16(unsigned dst, const void* src, int bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes));
}
__device__ __forceinline__ void cp4(unsigned dst, const void* src, int bytes) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(bytes));
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

#if EQ_BIAS
// A bias by key alone (row stride 0: a padding mask [B, 1, 1, SK]) is read outside the loops'
// critical paths: the key-major kernel holds its keys' two values for the whole loop, the
// query-major ones load a tile's values before its products (whose latency hides the loads;
// eq_att_tile_bias and eq_att_bias are in common.cuh, shared with the forward).
#define EQ_BIAS_PREFETCH(n0)    \
    eq_att_tile_bias<SN> tb;    \
    tb.load(bg, n0, t);
#else
#define EQ_BIAS_PREFETCH(n0)
#endif

// Loads rows [row0, row0 + EQ_BM) of a [rows, EQ_D] matrix of row stride `sr` (a multiple of 8,
// contiguous rows) into a tile; rows at or past `limit` and chunks past EQ_D are zero. Heads up to 64: each thread copies one chunk
// column, rows tid / CH + i NT / CH, in a loop of constant trip count whose swizzle is the same
// in every step (NT / CH is a multiple of 8), so that it unrolls into bare cp.async with
// constant offsets: the mode 2 (EQ_DQ) kernel at [8, 16, 2048, 64] ran 8% faster than with the
// loop below, whose every copy computes its own row, chunk and bound. Wider heads keep that
// loop: at 255 registers (spilling) the unrolled form ran the head-128 kernel 17% slower
// (benches/results/2026-11-22-h100-*-attnbwd7).
__device__ __forceinline__ void load_tile(unsigned dst, const EQ_T* g, long long sr, int row0, int limit) {
#if EQ_DP == 64
    static_assert(NT % CH == 0 && (NT / CH) % 8 == 0 && EQ_BM * CH % NT == 0, "whole rows a step");
    const int r0 = threadIdx.x / CH, ch = threadIdx.x % CH;
    const bool col_ok = ch * 8 < EQ_D;
    const unsigned d0 = dst + at(r0, ch);
    const EQ_T* s0 = g + (long long)(row0 + r0) * sr + ch * 8;
#pragma unroll
    for (int i = 0; i < EQ_BM * CH / NT; ++i) {
        const int r = r0 + i * (NT / CH);
        const bool ok = col_ok && row0 + r < limit;
        cp16(d0 + i * NT * 16, ok ? s0 + (long long)i * (NT / CH) * sr : g, ok ? 16 : 0);
    }
#else
    for (int c = threadIdx.x; c < EQ_BM * CH; c += NT) {
        const int r = c / CH, ch = c % CH;
        const bool ok = row0 + r < limit && ch * 8 < EQ_D;
        const EQ_T* src = ok ? g + (long long)(row0 + r) * sr + ch * 8 : g;
        cp16(dst + at(r, ch), src, ok ? 16 : 0);
    }
#endif
}

// The A fragments (rows [16 w, 16 w + 16) of this warp) of a tile, one per k16 step.
__device__ __forceinline__ void a_frags(unsigned (&f)[KT][4], unsigned tile, int warp, int lane) {
#pragma unroll
    for (int kt = 0; kt < KT; ++kt) ldsm4(f[kt], tile + at(warp * 16 + (lane & 15), kt * 2 + (lane >> 4)));
}

// acc[16 x EQ_BN] = A[16 x EQ_D] * B^T, B's EQ_BN rows in a tile (q k^T, g v^T).
__device__ __forceinline__ void mma_abt(float (&acc)[SN][4], const unsigned (&a)[KT][4], unsigned tile, int lane) {
#pragma unroll
    for (int nt = 0; nt < SN; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[nt][e] = 0.0f;
#pragma unroll
    for (int kt = 0; kt < KT; ++kt)
#pragma unroll
        for (int np = 0; np < SN / 2; ++np) {
            unsigned bk[4];
            const int r = np * 16 + (lane & 7) + ((lane >> 4) << 3);
            ldsm4(bk, tile + at(r, kt * 2 + ((lane >> 3) & 1)));
            mma(acc[2 * np], a[kt], bk[0], bk[1]);
            mma(acc[2 * np + 1], a[kt], bk[2], bk[3]);
        }
}

// acc[16 x EQ_DP] += P[16 x EQ_BN] * B, B's EQ_BN rows in a tile (dS k, P^T g, dS^T q); P in the
// accumulator layout, rounded to the storage type here.
__device__ __forceinline__ void mma_pb(float (&acc)[DT][4], const float (&p)[SN][4], unsigned tile, int lane) {
#pragma unroll
    for (int kk = 0; kk < SN / 2; ++kk) {
        unsigned pa[4];
        pa[0] = pack2(p[2 * kk][0], p[2 * kk][1]);
        pa[1] = pack2(p[2 * kk][2], p[2 * kk][3]);
        pa[2] = pack2(p[2 * kk + 1][0], p[2 * kk + 1][1]);
        pa[3] = pack2(p[2 * kk + 1][2], p[2 * kk + 1][3]);
#pragma unroll
        for (int dp = 0; dp < DT / 2; ++dp) {
            unsigned bv[4];
            const int r = kk * 16 + (lane & 7) + (((lane >> 3) & 1) << 3);
            ldsm4t(bv, tile + at(r, dp * 2 + (lane >> 4)));
            mma(acc[2 * dp], pa, bv[0], bv[1]);
            mma(acc[2 * dp + 1], pa, bv[2], bv[3]);
        }
    }
}

// Stores this warp's 16 rows of an accumulator (times `mul`) to a contiguous [rows, EQ_D] matrix.
__device__ __forceinline__ void store_rows(EQ_T* out, long long rs, const float (&acc)[DT][4], float mul, int row0,
                                           int limit, int lane) {
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int dt = 0; dt < DT; ++dt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int row = row0 + g + h * 8, col = dt * 8 + 2 * t;
            if (row < limit && col < EQ_D) {
                const unsigned w = pack2(acc[dt][2 * h] * mul, acc[dt][2 * h + 1] * mul);
                *reinterpret_cast<unsigned*>(out + row * rs + col) = w;
            }
        }
}

#if EQ_MODE == 2 && EQ_DQ
// Byte offset of chunk `ch` of row `r` in the swizzled dS tile (EQ_BM elements, 8 chunks a row).
__device__ __forceinline__ unsigned at_s(int r, int ch) { return (unsigned)((r * 8 + (ch ^ (r & 7))) * 16); }

#define EQ_SQ16 ((EQ_SQ + 15) / 16 * 16)

// Adds four f32 to consecutive accumulator entries (16-byte aligned).
__device__ __forceinline__ void add4(float* p, float a, float b, float c, float d) {
#if __CUDA_ARCH__ >= 900
    asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"l"(p), "f"(a), "f"(b), "f"(c), "f"(d)
                 : "memory");
#else
    atomicAdd(p, a);
    atomicAdd(p + 1, b);
    atomicAdd(p + 2, c);
    atomicAdd(p + 3, d);
#endif
}

// Stores this warp's dS^T (16 keys by the tile's EQ_BM queries, accumulator layout, rounded to
// the storage type in pairs) into the dS tile (rows: keys).
__device__ __forceinline__ void store_ds(unsigned ss, const unsigned (&ds)[SN][2], int warp, int lane) {
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int nt = 0; nt < SN; ++nt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const unsigned addr = ss + at_s(warp * 16 + g + 8 * h, nt) + 4 * t;
            asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(addr), "r"(ds[nt][h]));
        }
}

// acc[m0 + 16 w + r][.] += sum over the block's keys of dS (rows [16 w, 16 w + 16) of the tile's
// queries) times the key tile: the A fragments are dS read transposed from the dS tile, the B
// fragments the keys (as mma_pb reads them). 16 columns at a time, each added to the
// accumulator as soon as it is summed (see the header for the accumulator's column order).
__device__ __forceinline__ void add_dq(float* acc, unsigned ss, unsigned sk, int m0, int warp, int lane) {
    const int g = lane >> 2, t = lane & 3;
    unsigned da[SN / 2][4];
#pragma unroll
    for (int kk = 0; kk < SN / 2; ++kk)
        ldsm4t(da[kk], ss + at_s(kk * 16 + (lane & 7) + ((lane >> 4) << 3), warp * 2 + ((lane >> 3) & 1)));
    // A warp's 16 rows lie in the accumulator's EQ_SQ16 rows or wholly past them (rows past
    // EQ_SQ add zeros: their dS is masked), so one test per warp.
    if (EQ_SQ % EQ_BM != 0 && m0 + warp * 16 >= EQ_SQ16) return;
    float* blk = acc + (long long)(m0 + warp * 16) * EQ_DP + 16 * g + 4 * t;  // this warp's row block
#pragma unroll
    for (int dp = 0; dp < DT / 2; ++dp) {
        if (dp * 16 >= EQ_D) break;  // columns of the padding only
        float c[2][4];
#pragma unroll
        for (int e = 0; e < 4; ++e) c[0][e] = c[1][e] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < SN / 2; ++kk) {
            unsigned bv[4];
            const int r = kk * 16 + (lane & 7) + (((lane >> 3) & 1) << 3);
            ldsm4t(bv, sk + at(r, dp * 2 + (lane >> 4)));
            mma(c[0], da[kk], bv[0], bv[1]);
            mma(c[1], da[kk], bv[2], bv[3]);
        }
#pragma unroll
        for (int h = 0; h < 2; ++h)
            add4(blk + dp * 256 + 128 * h, c[0][2 * h], c[0][2 * h + 1], c[1][2 * h], c[1][2 * h + 1]);
    }
}

// The last block of a batch index: dq = scale * acc, rounded to the storage type; the
// accumulator zeroed (read and written at L2, where the atomics summed it).
__device__ __forceinline__ void convert_dq(float* acc, EQ_T* out, int tid) {
    constexpr int N = EQ_SQ16 * EQ_DP / 4;  // groups of four accumulator entries
    constexpr int U = 8;  // loads in flight per thread
    for (int i0 = tid; i0 < N; i0 += U * NT) {
        float4 v[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int i = i0 + u * NT;
            if (i < N) v[u] = __ldcg(reinterpret_cast<const float4*>(acc) + i);
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int i = i0 + u * NT;
            if (i >= N) continue;
            __stcg(reinterpret_cast<float4*>(acc) + i, make_float4(0.0f, 0.0f, 0.0f, 0.0f));
            // Group i: row block i / (4 EQ_DP), column block (i / 64) % (EQ_DP / 16), then h, g, t.
            const int row = i / (4 * EQ_DP) * 16 + ((i >> 5) & 1) * 8 + ((i >> 2) & 7);
            const int col = (i >> 6) % (EQ_DP / 16) * 16 + 2 * (i & 3);
            if (row >= EQ_SQ) continue;
            EQ_T* o = out + row * EQ_DQ_SR + col;
            if (col < EQ_D) *reinterpret_cast<unsigned*>(o) = pack2(v[u].x * EQ_SCALE, v[u].y * EQ_SCALE);
            if (col + 8 < EQ_D) *reinterpret_cast<unsigned*>(o + 8) = pack2(v[u].z * EQ_SCALE, v[u].w * EQ_SCALE);
        }
    }
}
#endif

}  // namespace eq_attb

#if EQ_MODE == 0
// ---- the log-sum-exp of each query row: the forward's online max and sum, without values ----
extern "C" __global__ void __launch_bounds__(EQ_NWARPS * 32) EQ_KERNEL(EQ_PARAMS) {
    using namespace eq_attb;
    extern __shared__ __align__(128) unsigned char eq_smem[];
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const int mblocks = (EQ_SQ + EQ_BM - 1) / EQ_BM;
    const int m0 = (EQ_CAUSAL ? mblocks - 1 - (int)blockIdx.x : (int)blockIdx.x) * EQ_BM;
    EQ_BWD_BATCH(EQ_T)
    const unsigned sq = smem_u32(eq_smem), sk = sq + EQ_TILE_BYTES;
    const int n_end = EQ_CAUSAL ? (EQ_SK < m0 + EQ_BM ? EQ_SK : m0 + EQ_BM) : EQ_SK;
    const int ntiles = (n_end + EQ_BN - 1) / EQ_BN;
    const int wrow = m0 + warp * 16;
    load_tile(sq, qg, EQ_Q_SR, m0, EQ_SQ);
    if (ntiles > 0) load_tile(sk, kg, EQ_K_SR, 0, EQ_SK);
    cp_commit();
    float m_i[2] = {-EQ_INF, -EQ_INF}, l_i[2] = {0.0f, 0.0f};
    unsigned qf[KT][4];
    for (int j = 0; j < ntiles; ++j) {
        const int n0 = j * EQ_BN;
        if (j + 1 < ntiles) load_tile(sk + ((j + 1) & 1) * EQ_TILE_BYTES, kg, EQ_K_SR, n0 + EQ_BN, EQ_SK);
        cp_commit();
        cp_wait<1>();
        __syncthreads();
        if (j == 0) a_frags(qf, sq, warp, lane);
        EQ_BIAS_PREFETCH(n0)
        float s[SN][4];
        mma_abt(s, qf, sk + (j & 1) * EQ_TILE_BYTES, lane);
        const bool masked = n0 + EQ_BN > EQ_SK || (EQ_CAUSAL && n0 + EQ_BN - 1 > wrow);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            float mx = m_i[h];
#pragma unroll
            for (int nt = 0; nt < SN; ++nt)
#pragma unroll
                for (int e = 2 * h; e < 2 * h + 2; ++e) {
                    const int col = n0 + nt * 8 + 2 * t + (e & 1), row = wrow + g + h * 8;
#if EQ_BIAS
                    // Natural units (the differences from the maximum go to base 2 one by one).
                    float x = fmaf(s[nt][e], EQ_SCALE, tb.at(bg, nt, e & 1, row, col));
#else
                    float x = s[nt][e] * EQ_SCALE_LOG2;
#endif
                    if (masked && (col >= EQ_SK || (EQ_CAUSAL && col > row))) x = -EQ_INF;
                    s[nt][e] = x;
                    mx = fmaxf(mx, x);
                }
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            const float mu = mx == -EQ_INF ? 0.0f : mx;
            float rs = 0.0f;
#if EQ_BIAS
#pragma unroll
            for (int nt = 0; nt < SN; ++nt)
                rs += ex2((s[nt][2 * h] - mu) * EQ_LOG2E) + ex2((s[nt][2 * h + 1] - mu) * EQ_LOG2E);
            l_i[h] = l_i[h] * ex2((m_i[h] - mu) * EQ_LOG2E) + rs;
#else
#pragma unroll
            for (int nt = 0; nt < SN; ++nt) rs += ex2(s[nt][2 * h] - mu) + ex2(s[nt][2 * h + 1] - mu);
            l_i[h] = l_i[h] * ex2(m_i[h] - mu) + rs;
#endif
            m_i[h] = mx;
        }
        __syncthreads();  // the key tile is consumed before it is loaded again
    }
    cp_wait<0>();
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        float l = l_i[h];
        l += __shfl_xor_sync(0xffffffffu, l, 1);
        l += __shfl_xor_sync(0xffffffffu, l, 2);
        const int row = wrow + g + h * 8;
#if EQ_BIAS
        // The row maximum and the log of the row sum (-inf both for a row of -inf scores).
        if (t == 0 && row < EQ_SQ) {
            EQ_LSEOUT[(b * EQ_SQ + row) * 2] = m_i[h];
            EQ_LSEOUT[(b * EQ_SQ + row) * 2 + 1] = __log2f(l) * 0.69314718055994531f;
        }
#else
        if (t == 0 && row < EQ_SQ) EQ_LSEOUT[b * EQ_SQ + row] = (m_i[h] + __log2f(l)) * 0.69314718055994531f;
#endif
    }
}

#elif EQ_MODE == 1
// ---- dq: one block per query tile, looping over key tiles ----
extern "C" __global__ void __launch_bounds__(EQ_NWARPS * 32) EQ_KERNEL(EQ_PARAMS) {
    using namespace eq_attb;
    extern __shared__ __align__(128) unsigned char eq_smem[];
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const int mblocks = (EQ_SQ + EQ_BM - 1) / EQ_BM;
    const int m0 = (EQ_CAUSAL ? mblocks - 1 - (int)blockIdx.x : (int)blockIdx.x) * EQ_BM;
    EQ_BWD_BATCH(EQ_T)
    EQ_BWD_GRAD_OPERANDS(EQ_T)
    const unsigned sq = smem_u32(eq_smem), sg = sq + EQ_TILE_BYTES, sk = sg + EQ_TILE_BYTES;
    const unsigned sv = sk + 2 * EQ_TILE_BYTES;
    const int n_end = EQ_CAUSAL ? (EQ_SK < m0 + EQ_BM ? EQ_SK : m0 + EQ_BM) : EQ_SK;
    const int ntiles = (n_end + EQ_BN - 1) / EQ_BN;
    const int wrow = m0 + warp * 16;
    load_tile(sq, qg, EQ_Q_SR, m0, EQ_SQ);
    load_tile(sg, gg, EQ_G_SR, m0, EQ_SQ);
    if (ntiles > 0) {
        load_tile(sk, kg, EQ_K_SR, 0, EQ_SK);
        load_tile(sv, vg, EQ_V_SR, 0, EQ_SK);
    }
    cp_commit();
    // This thread's rows' lse (base 2) and delta; with a bias, the row maximum (natural units,
    // at least -FLT_MAX) and the log row sum (base 2, at least 0).
    float lse2[2], del[2];
#if EQ_BIAS
    float mrow[2];
#endif
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int row = wrow + g + h * 8;
#if EQ_BIAS
        mrow[h] = row < EQ_SQ ? fmaxf(lg[row * EQ_L_SR], -3.402823466e38f) : 0.0f;
        lse2[h] = row < EQ_SQ ? fmaxf(lg[row * EQ_L_SR + EQ_L_SC], 0.0f) * EQ_LOG2E : 0.0f;
#else
        lse2[h] = row < EQ_SQ ? lg[row * EQ_L_SR] * EQ_LOG2E : 0.0f;
#endif
        del[h] = row < EQ_SQ ? dg[row * EQ_DL_SR] : 0.0f;
    }
    float dq[DT][4];
#pragma unroll
    for (int dt = 0; dt < DT; ++dt)
#pragma unroll
        for (int e = 0; e < 4; ++e) dq[dt][e] = 0.0f;
#if EQ_DROPOUT
    const unsigned dseed = EQ_DROP_SEED, dkey0 = eq_dropout_key0(dseed);
#endif
    unsigned qf[KT][4], gf[KT][4];
    for (int j = 0; j < ntiles; ++j) {
        const int n0 = j * EQ_BN;
        const unsigned kb = sk + (j & 1) * EQ_TILE_BYTES, vb = sv + (j & 1) * EQ_TILE_BYTES;
        if (j + 1 < ntiles) {
            load_tile(sk + ((j + 1) & 1) * EQ_TILE_BYTES, kg, EQ_K_SR, n0 + EQ_BN, EQ_SK);
            load_tile(sv + ((j + 1) & 1) * EQ_TILE_BYTES, vg, EQ_V_SR, n0 + EQ_BN, EQ_SK);
        }
        cp_commit();
        cp_wait<1>();
        __syncthreads();
        if (j == 0) {
            a_frags(qf, sq, warp, lane);
            a_frags(gf, sg, warp, lane);
        }
        EQ_BIAS_PREFETCH(n0)
        float s[SN][4], dp[SN][4];
        mma_abt(s, qf, kb, lane);
        mma_abt(dp, gf, vb, lane);
        const bool masked = n0 + EQ_BN > EQ_SK || (EQ_CAUSAL && n0 + EQ_BN - 1 > wrow);
#pragma unroll
        for (int nt = 0; nt < SN; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int h = e >> 1;
#if EQ_BIAS
                const int col = n0 + nt * 8 + 2 * t + (e & 1), row = wrow + g + h * 8;
                const float x = fmaf(s[nt][e], EQ_SCALE, tb.at(bg, nt, e & 1, row, col));
                float p = ex2((x - mrow[h]) * EQ_LOG2E - lse2[h]);
                if (masked && (col >= EQ_SK || (EQ_CAUSAL && col > row))) p = 0.0f;
#else
                float p = ex2(s[nt][e] * EQ_SCALE_LOG2 - lse2[h]);
                if (masked) {
                    const int col = n0 + nt * 8 + 2 * t + (e & 1), row = wrow + g + h * 8;
                    if (col >= EQ_SK || (EQ_CAUSAL && col > row)) p = 0.0f;
                }
#endif
#if EQ_DROPOUT
                {
                    const int col = n0 + nt * 8 + 2 * t + (e & 1), row = wrow + g + h * 8;
                    const float z = eq_att_keep(dseed, dkey0, b, row, col) ? EQ_DROP_SCALE : 0.0f;
                    s[nt][e] = p * (dp[nt][e] * z - del[h]);
                }
#else
                s[nt][e] = p * (dp[nt][e] - del[h]);
#endif
            }
        mma_pb(dq, s, kb, lane);
        __syncthreads();  // the key and value tiles are consumed before they are loaded again
    }
    cp_wait<0>();
    store_rows(EQ_DQP + EQ_BOFF(DQ), EQ_DQ_SR, dq, EQ_SCALE, wrow, EQ_SQ, lane);
}

#else
// ---- dk and dv: one block per key tile, looping over query tiles ----
extern "C" __global__ void __launch_bounds__(EQ_NWARPS * 32) EQ_KERNEL(EQ_PARAMS) {
    using namespace eq_attb;
    extern __shared__ __align__(128) unsigned char eq_smem[];
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    // (Under EQ_CAUSAL the first key tiles see the most queries: they run first.)
    const int n0 = (int)blockIdx.x * EQ_BN;
    EQ_BWD_BATCH(EQ_T)
    EQ_BWD_GRAD_OPERANDS(EQ_T)
    const unsigned sk = smem_u32(eq_smem), sv = sk + EQ_TILE_BYTES, sq = sv + EQ_TILE_BYTES;
    // sl: [2 buffers][EQ_NSTAT: lse (or m), delta, log l][EQ_BM] f32
    const unsigned sg = sq + 2 * EQ_TILE_BYTES, sl = sg + 2 * EQ_TILE_BYTES;
    const float* slf = reinterpret_cast<const float*>(eq_smem + 6 * EQ_TILE_BYTES);
#if EQ_DQ
    const unsigned ss = sl + 2 * EQ_NSTAT * EQ_BM * 4;  // the previous tile's dS^T, [EQ_BN][EQ_BM]
    float* dqacc = EQ_DQACC + b * EQ_SQ16 * EQ_DP;
    unsigned ds[SN][2];  // this tile's dS^T, rounded in pairs
#endif
    const int m_start = EQ_CAUSAL ? (n0 / EQ_BM) * EQ_BM : 0;
    const int ntiles = m_start < EQ_SQ ? (EQ_SQ - m_start + EQ_BM - 1) / EQ_BM : 0;
    // Under EQ_DQ the blocks of one batch index start at different query tiles, so that they
    // do not all add into the same rows of the accumulator at once (measured neither faster nor
    // slower than without: benches/results/2026-11-22-h100-c695f23-attnbwd-fused).
    const int rot = EQ_DQ && ntiles > 0 ? (int)blockIdx.x % ntiles : 0;
    const int wkey = n0 + warp * 16;  // this warp's first key
    auto load_q = [&](int it) {
        const int m0 = m_start + (it + rot) % ntiles * EQ_BM, buf = it & 1;
        load_tile(sq + buf * EQ_TILE_BYTES, qg, EQ_Q_SR, m0, EQ_SQ);
        load_tile(sg + buf * EQ_TILE_BYTES, gg, EQ_G_SR, m0, EQ_SQ);
        for (int c = tid; c < EQ_NSTAT * EQ_BM; c += NT) {
            const int r = c % EQ_BM, which = c / EQ_BM;
            const bool ok = m0 + r < EQ_SQ;
            const long long row = ok ? m0 + r : 0;
            cp4(sl + ((buf * EQ_NSTAT + which) * EQ_BM + r) * 4, EQ_BWD_STAT(which, row), ok ? 4 : 0);
        }
    };
    load_tile(sk, kg, EQ_K_SR, n0, EQ_SK);
    load_tile(sv, vg, EQ_V_SR, n0, EQ_SK);
    if (ntiles > 0) load_q(0);
    cp_commit();
#if EQ_DK
    float dk[DT][4];
#endif
#if EQ_DV
    float dv[DT][4];
#endif
#pragma unroll
    for (int dt = 0; dt < DT; ++dt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
#if EQ_DK
            dk[dt][e] = 0.0f;
#endif
#if EQ_DV
            dv[dt][e] = 0.0f;
#endif
        }
#if EQ_BIAS && EQ_BIAS_BY_KEY
    // This thread's two keys' bias values, for every query tile.
    const float kbias[2] = {eq_att_bias(bg, 0, wkey + g), eq_att_bias(bg, 0, wkey + g + 8)};
#define EQ_KBIAS(row, key, e) kbias[(e) >> 1]
#else
#define EQ_KBIAS(row, key, e) eq_att_bias(bg, row, key)
#endif
    // The key and value fragments stay in registers across the loop, or (EQ_DQ, whose dq
    // products need registers) are read from shared memory again in each iteration.
#if !EQ_DQ
    unsigned kf[KT][4];
#if EQ_DK
    unsigned vf[KT][4];
#endif
#endif
#if EQ_DROPOUT
    const unsigned dseed = EQ_DROP_SEED, dkey0 = eq_dropout_key0(dseed);
    static_assert(SN * 4 <= 32, "one bit of a word per score of a thread");
#endif
    for (int it = 0; it < ntiles; ++it) {
        const int m0 = m_start + (it + rot) % ntiles * EQ_BM, buf = it & 1;
        if (it + 1 < ntiles) load_q(it + 1);
        cp_commit();
        cp_wait<1>();
        __syncthreads();
#if EQ_DQ
        unsigned kf[KT][4], vf[KT][4];
        a_frags(kf, sk, warp, lane);
        a_frags(vf, sv, warp, lane);
#else
        if (it == 0) {
            a_frags(kf, sk, warp, lane);
#if EQ_DK
            a_frags(vf, sv, warp, lane);
#endif
        }
#endif
        const unsigned qb = sq + buf * EQ_TILE_BYTES, gb = sg + buf * EQ_TILE_BYTES;
        const float* lse = slf + (buf * EQ_NSTAT) * EQ_BM;
        // s^T = k q^T: this warp's 16 keys by the tile's EQ_BM queries; then P^T.
        float p[SN][4];
        mma_abt(p, kf, qb, lane);
        const bool masked = m0 + EQ_BM > EQ_SQ || n0 + EQ_BN > EQ_SK || (EQ_CAUSAL && wkey + 15 > m0);
#pragma unroll
        for (int nt = 0; nt < SN; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int qc = nt * 8 + 2 * t + (e & 1);
#if EQ_BIAS
                const int key = wkey + g + (e >> 1) * 8, row = m0 + qc;
                const float sb = fmaf(p[nt][e], EQ_SCALE, EQ_KBIAS(row, key, e));
                const float mr = fmaxf(lse[qc], -3.402823466e38f), ll = fmaxf(lse[2 * EQ_BM + qc], 0.0f);
                float x = ex2((sb - mr) * EQ_LOG2E - ll * EQ_LOG2E);
                if (masked && (row >= EQ_SQ || key >= EQ_SK || (EQ_CAUSAL && key > row))) x = 0.0f;
#else
                float x = ex2(p[nt][e] * EQ_SCALE_LOG2 - lse[qc] * EQ_LOG2E);
                if (masked) {
                    const int key = wkey + g + (e >> 1) * 8, row = m0 + qc;
                    if (row >= EQ_SQ || key >= EQ_SK || (EQ_CAUSAL && key > row)) x = 0.0f;
                }
#endif
                p[nt][e] = x;
            }
#if EQ_DROPOUT
        // The kept scores of this thread (bit 4 nt + e), and dv += (P Z)^T g (times the scale
        // at the end).
        unsigned kept = 0;
#pragma unroll
        for (int nt = 0; nt < SN; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int key = wkey + g + (e >> 1) * 8, row = m0 + nt * 8 + 2 * t + (e & 1);
                if (eq_att_keep(dseed, dkey0, b, row, key)) kept |= 1u << (4 * nt + e);
            }
#if EQ_DV
        {
            float pd[SN][4];
#pragma unroll
            for (int nt = 0; nt < SN; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) pd[nt][e] = (kept >> (4 * nt + e)) & 1u ? p[nt][e] : 0.0f;
            mma_pb(dv, pd, gb, lane);
        }
#endif
#elif EQ_DV
        mma_pb(dv, p, gb, lane);  // dv += P^T g
#endif
#if EQ_DK || EQ_DQ
        // dP^T = v g^T, dS^T = P^T (dP^T - delta), dk += dS^T q.
        float dp[SN][4];
        mma_abt(dp, vf, gb, lane);
        const float* del = slf + (buf * EQ_NSTAT + 1) * EQ_BM;
#pragma unroll
        for (int nt = 0; nt < SN; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
#if EQ_DROPOUT
                const float z = (kept >> (4 * nt + e)) & 1u ? EQ_DROP_SCALE : 0.0f;
                dp[nt][e] = p[nt][e] * (dp[nt][e] * z - del[nt * 8 + 2 * t + (e & 1)]);
#else
                dp[nt][e] = p[nt][e] * (dp[nt][e] - del[nt * 8 + 2 * t + (e & 1)]);
#endif
            }
#if EQ_DK
        mma_pb(dk, dp, qb, lane);
#endif
#if EQ_DQ
        // dS^T, rounded as the products round it, is kept for the next iteration's dq.
#pragma unroll
        for (int nt = 0; nt < SN; ++nt)
#pragma unroll
            for (int h = 0; h < 2; ++h) ds[nt][h] = pack2(dp[nt][2 * h], dp[nt][2 * h + 1]);
#endif
#endif
#if EQ_DQ
        // dq[rows of the previous tile] += dS k over this block's keys: the previous tile's dS^T,
        // stored after the last iteration's second barrier, from shared memory (the warps own
        // query rows here); the next store follows the next barrier, after every warp has read
        // it. Placed last in the iteration, after this tile's products, rather than first,
        // right after the barrier: measured faster (benches/results/2026-11-22-h100-*-attnbwd7).
        if (it > 0) add_dq(dqacc, ss, sk, m_start + (it - 1 + rot) % ntiles * EQ_BM, warp, lane);
#endif
        __syncthreads();  // this buffer (and the dS tile) is consumed before it is loaded again
#if EQ_DQ
        store_ds(ss, ds, warp, lane);
#endif
    }
    cp_wait<0>();
#if EQ_DQ
    if (ntiles > 0) {
        __syncthreads();
        add_dq(dqacc, ss, sk, m_start + (ntiles - 1 + rot) % ntiles * EQ_BM, warp, lane);
    }
#endif
#if EQ_DK
    store_rows(EQ_DKP + EQ_BOFF(DK), EQ_DK_SR, dk, EQ_SCALE, wkey, EQ_SK, lane);
#endif
#if EQ_DV
    store_rows(EQ_DVP + EQ_BOFF(DV), EQ_DV_SR, dv, EQ_DROP_FACTOR, wkey, EQ_SK, lane);
#endif
#if EQ_DQ
    // The last block of this batch index to arrive converts the accumulator (and leaves it and
    // the count zero).
    if (eq_arrive_last(EQ_DQCNT + b)) {
        convert_dq(dqacc, EQ_DQP + EQ_BOFF(DQ), tid);
        if (tid == 0) EQ_DQCNT[b] = 0;
    }
#endif
}
#endif
#endif  // EQ_F32
