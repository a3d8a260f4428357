// colreduce.cu: reductions over one leading axis with a fused pointwise prologue (bias and
// gamma gradients: sum(g, 0), sum(g * xhat, 0), ...), one or more outputs.
//
// Math: the iteration space is viewed as [EQ_OUTER, EQ_N, EQ_INNER] with the reduced axis in
// the middle. For every (o, i) and accumulator k:
//   out_k[o, 0, i] = finish_k( combine_k over n < EQ_N of e_k(o, n, i) )
// (finish divides by EQ_N for a mean). Pointwise values of the whole space may be written too.
// A max m_j = max_n x and a sum s_k = sum_n exp(x - m_j) of the same x may run as an online
// pair (softmax's statistics along a leading axis, in one pass): each thread keeps its running
// max with the sum rescaled to it, and `eq_merge` combines two pairs as
// m = max(m1, m2), s = s1 exp(m1 - m) + s2 exp(m2 - m).
//
// Launch shape: block (EQ_TX, EQ_TY, EQ_TZ); thread x owns EQ_VEC consecutive inner elements
// (16-byte access, coalesced across x), thread y strides over n (EQ_TY is at most an eighth of
// n, so that a thread has 8 or more rows' loads in flight: with a row each, a sum over 8 rows of
// [8, 32, 50257] f32 streamed at half of copy bandwidth on an H100), and each z slice of the block
// owns one tile (EQ_TZ > 1 only where tiles are narrow and many: a short n and a narrow inner
// extent would leave a block of a few threads). grid.x = EQ_OUTER * tiles of EQ_TX * EQ_VEC
// inner elements / EQ_TZ; grid.y = EQ_CHUNKS splits n into chunks of EQ_CHUNK_N.
// Stage 1: each block combines its chunk through shared memory in a fixed order. When
// EQ_CHUNKS > 1 it writes that partial to the workspace `eq_ws`, and the last block of a
// tile to arrive (counted in `eq_count`) combines the tile's partials in a fixed order (its
// thread rows over interleaved chunks, then a tree) and writes the outputs (stage 2, in the
// same launch).
//
// Invariants: the result does not depend on block scheduling (fixed combining order: bit
// for bit deterministic); `eq_count` is all zeros before and after every launch (the runtime
// zeroes it once at allocation; the last block resets its entry); EQ_VEC divides the last
// extent of the space; a reduction's result is only written, never used in the same kernel.
#ifndef EQ_COMMON_CUH
#include "common.cuh"
#endif

#ifndef EQ_GENERATED
// Default instance: db = sum(g, 0) over g: f32[4096, 256].
#define EQ_KERNEL colreduce_f32
#define EQ_OUTER 1
#define EQ_N 4096
#define EQ_INNER 256
#define EQ_VEC 4
#define EQ_TX 32
#define EQ_TY 8
#define EQ_CHUNKS 16
#define EQ_CHUNK_N 256
#define EQ_NACC 1
#define EQ_PARAMS const float* __restrict__ p_g, float* __restrict__ p_db, float* __restrict__ eq_ws, \
    unsigned int* __restrict__ eq_count
#define EQ_ARGS p_g, p_db, eq_ws, eq_count

__device__ __forceinline__ void eq_acc_init(float (&acc)[EQ_NACC][EQ_VEC]) {
#pragma unroll
    for (int v = 0; v < EQ_VEC; ++v) acc[0][v] = 0.0f;
}
__device__ __forceinline__ void eq_merge(float (&a)[EQ_NACC], const float (&b)[EQ_NACC]) { a[0] = a[0] + b[0]; }
__device__ __forceinline__ void eq_accum(EQ_PARAMS, eq_idx o, eq_idx n, eq_idx i0, float (&acc)[EQ_NACC][EQ_VEC]) {
    float g[EQ_VEC];
    eq_loadv<float, EQ_VEC>(p_g + n * EQ_INNER + i0, g);
#pragma unroll
    for (int v = 0; v < EQ_VEC; ++v) acc[0][v] = acc[0][v] + g[v];
}
__device__ __forceinline__ void eq_col_store(EQ_PARAMS, eq_idx o, eq_idx i0, const float (&acc)[EQ_NACC][EQ_VEC]) {
    eq_storev<float, EQ_VEC>(p_db + i0, acc[0]);
}
#endif

#define EQ_TILE (EQ_TX * EQ_VEC)
#define EQ_TILES ((EQ_INNER + EQ_TILE - 1) / EQ_TILE)
#ifndef EQ_TZ
#define EQ_TZ 1
#endif
static_assert(EQ_TZ == 1 || EQ_CHUNKS == 1, "tiles share a block only without chunks");
#define EQ_PART_BATCH (EQ_NACC >= 8 ? 1 : 8 / EQ_NACC)

// The block's EQ_TY partials of each column (`acc` of each thread row y) combined as a tree in a
// fixed order (slot y takes slot y + s, s halving from EQ_TY / 2): log2(EQ_TY) steps, where one
// thread's walk over them took EQ_TY dependent shared-memory reads (256 for a column of one
// element). Every thread of the block calls it; thread row 0 gets the result in `acc`.
static_assert((EQ_TY & (EQ_TY - 1)) == 0, "EQ_TY is a power of two");
__device__ __forceinline__ void eq_block_combine(float (&red)[EQ_TY][EQ_NACC][EQ_TILE], float (&acc)[EQ_NACC][EQ_VEC],
                                                 int tx, int ty) {
#pragma unroll
    for (int k = 0; k < EQ_NACC; ++k) {
#pragma unroll
        for (int v = 0; v < EQ_VEC; ++v) red[ty][k][tx * EQ_VEC + v] = acc[k][v];
    }
    __syncthreads();
#pragma unroll 1
    for (int s = EQ_TY / 2; s > 0; s /= 2) {
        if (ty < s) {
#pragma unroll
            for (int v = 0; v < EQ_VEC; ++v) {
                float a[EQ_NACC], b[EQ_NACC];
#pragma unroll
                for (int k = 0; k < EQ_NACC; ++k) {
                    a[k] = red[ty][k][tx * EQ_VEC + v];
                    b[k] = red[ty + s][k][tx * EQ_VEC + v];
                }
                eq_merge(a, b);
#pragma unroll
                for (int k = 0; k < EQ_NACC; ++k) red[ty][k][tx * EQ_VEC + v] = a[k];
            }
        }
        __syncthreads();
    }
    if (ty == 0) {
#pragma unroll
        for (int k = 0; k < EQ_NACC; ++k) {
#pragma unroll
            for (int v = 0; v < EQ_VEC; ++v) acc[k][v] = red[0][k][tx * EQ_VEC + v];
        }
    }
}

extern "C" __global__ void __launch_bounds__(EQ_TX * EQ_TY * EQ_TZ) EQ_KERNEL(EQ_PARAMS) {
    __shared__ float red_all[EQ_TZ][EQ_TY][EQ_NACC][EQ_TILE];
    __shared__ bool last_block;
    const int tx = threadIdx.x, ty = threadIdx.y;
    auto& red = red_all[threadIdx.z];
    const eq_idx tile = (eq_idx)blockIdx.x * EQ_TZ + threadIdx.z;
    const eq_idx o = tile / EQ_TILES;
    const eq_idx i0 = (tile % EQ_TILES) * EQ_TILE + (eq_idx)tx * EQ_VEC;
    const bool valid = i0 < (eq_idx)EQ_INNER && (EQ_TZ == 1 || o < (eq_idx)EQ_OUTER);
    const eq_idx n_begin = (eq_idx)blockIdx.y * EQ_CHUNK_N;
    const eq_idx n_end = n_begin + EQ_CHUNK_N < (eq_idx)EQ_N ? n_begin + EQ_CHUNK_N : (eq_idx)EQ_N;

    float acc[EQ_NACC][EQ_VEC];
    eq_acc_init(acc);
    if (valid) {
#pragma unroll 4
        for (eq_idx n = n_begin + ty; n < n_end; n += EQ_TY) eq_accum(EQ_ARGS, o, n, i0, acc);
    }
    eq_block_combine(red, acc, tx, ty);
    if (EQ_CHUNKS == 1) {
        if (ty == 0 && valid) eq_col_store(EQ_ARGS, o, i0, acc);
        return;
    }
    // Stage 2: partials of tile `tile` live at eq_ws[((tile * EQ_CHUNKS + chunk) * EQ_NACC + k) * EQ_TILE + x].
    float* part = eq_ws + (tile * EQ_CHUNKS + blockIdx.y) * (EQ_NACC * EQ_TILE);
    if (ty == 0) {
#pragma unroll
        for (int k = 0; k < EQ_NACC; ++k) {
#pragma unroll
            for (int v = 0; v < EQ_VEC; ++v) part[k * EQ_TILE + tx * EQ_VEC + v] = acc[k][v];
        }
        __threadfence();
    }
    __syncthreads();
    if (tx == 0 && ty == 0) last_block = atomicAdd(&eq_count[tile], 1u) == EQ_CHUNKS - 1;
    __syncthreads();
    if (!last_block) return;
    __threadfence();
    // The last block combines the tile's partials with all its threads: thread row y merges
    // chunks y, y + EQ_TY, y + 2 EQ_TY, ... in order, loading EQ_PART_BATCH of them at a time
    // (8 partials in flight together: one L2 round trip a batch, not a chunk; 8 chunks of
    // every accumulator took 80 registers with four), then the rows combine as a tree. A fixed
    // order whatever the schedule; one row merging every chunk took EQ_CHUNKS dependent merges
    // (640 over a [40960, 96] column sum: 18 us on the H100, priced 5).
    const float* tile_parts = eq_ws + tile * EQ_CHUNKS * (EQ_NACC * EQ_TILE);
    eq_acc_init(acc);
#pragma unroll
    for (int v = 0; v < EQ_VEC; ++v) {
        const int x = tx * EQ_VEC + v;
        float t[EQ_NACC];
#pragma unroll
        for (int k = 0; k < EQ_NACC; ++k) t[k] = acc[k][v];
        for (int c0 = ty; c0 < EQ_CHUNKS; c0 += EQ_PART_BATCH * EQ_TY) {
            float part[EQ_PART_BATCH][EQ_NACC];
#pragma unroll
            for (int j = 0; j < EQ_PART_BATCH; ++j) {
                const int c = c0 + j * EQ_TY;
#pragma unroll
                for (int k = 0; k < EQ_NACC; ++k)
                    part[j][k] = c < EQ_CHUNKS ? eq_ld_cg(tile_parts + c * (EQ_NACC * EQ_TILE) + k * EQ_TILE + x) : 0.0f;
            }
#pragma unroll
            for (int j = 0; j < EQ_PART_BATCH; ++j)
                if (c0 + j * EQ_TY < EQ_CHUNKS) eq_merge(t, part[j]);
        }
#pragma unroll
        for (int k = 0; k < EQ_NACC; ++k) acc[k][v] = t[k];
    }
    eq_block_combine(red, acc, tx, ty);
    if (ty != 0) return;
    if (valid) eq_col_store(EQ_ARGS, o, i0, acc);
    if (tx == 0) eq_count[tile] = 0;
}
