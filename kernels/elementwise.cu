// elementwise.cu: any fused pointwise body over broadcast inputs, one or more outputs.
//
// Math: for every flat index i of the iteration space D (row-major, EQ_NUMEL elements),
//   out_k[w_k(i)] = f_k(in_0[b_0(i)], in_1[b_1(i)], ...)
// where b_j maps i to the element of input j under NumPy broadcasting (and transposes or
// reshapes of inputs, all folded into strides by the code generator), and w_k is the
// (row-major) index of output k; an output smaller than D is written only by the indices
// whose broadcast coordinates are 0.
//
// Launch shape: 1-D grid-stride loop; EQ_THREADS threads per block; each step of a thread
// handles EQ_VEC consecutive elements (16-byte loads and stores where the operand is
// contiguous along the last axis), then a scalar loop covers the EQ_NUMEL % EQ_VEC tail.
//
// Invariants: EQ_VEC divides the last extent of D (or D has rank <= 1), so a vector never
// crosses a row and every vector access is aligned; each output element is written exactly
// once; the generated body `eq_body<V>(EQ_ARGS, i0)` handles elements i0 .. i0+V-1 and works
// for any V, so the tail reuses it with V = 1. A kernel storing a 1-bit mask (EQ_PACKED_WRITES)
// runs a warp-uniform loop instead and its body takes whether the element group is in range.
#ifndef EQ_COMMON_CUH
#include "common.cuh"
#endif

#ifndef EQ_GENERATED
// Default instance: out = (x + bias) * z over a [64, 256] f32 space, bias [256].
#define EQ_KERNEL elementwise_f32
#define EQ_NUMEL 16384
#define EQ_VEC 4
#define EQ_THREADS 256
#define EQ_PARAMS const float* __restrict__ p_x, const float* __restrict__ p_bias, \
    const float* __restrict__ p_z, float* __restrict__ p_out
#define EQ_ARGS p_x, p_bias, p_z, p_out

template <int V>
__device__ __forceinline__ void eq_body(EQ_PARAMS, eq_idx i0) {
    const eq_idx c1 = i0 % 256;
    float x[V], b[V], z[V], out[V];
    eq_loadv<float, V>(p_x + i0, x);
    eq_loadv<float, V>(p_bias + c1, b);
    eq_loadv<float, V>(p_z + i0, z);
#pragma unroll
    for (int v = 0; v < V; ++v) out[v] = (x[v] + b[v]) * z[v];
    eq_storev<float, V>(p_out + i0, out);
}
#endif

#ifdef EQ_TILED
// The tiled path, for a body reading some input transposed: its contiguous axis P is not the
// iteration space's last axis L, so the 1-D loop's lanes (consecutive along L) would each touch
// their own 32-byte sector of it. Here the space is [O_hi, P, A, L] (A: the axes between P and
// L, O_hi: those before P; EQ_TP, EQ_TA, EQ_TL their extents) and a block walks tiles of
// EQ_TILE x EQ_TILE elements over (P, L) at fixed (o_hi, a): it first copies the transposed
// inputs' elements into shared memory with lanes along P (`eq_tile_load`: coalesced on the
// input), then runs the body with lanes along L (`eq_body<1>`: coalesced on the outputs and the
// other inputs), reading the transposed inputs from the tile. The generated tiles are padded to
// EQ_TILE + 1 columns: a warp reading a tile's column meets 32 different banks.
// Invariants: blocks are EQ_TILE x EQ_TROWS threads; every element of the space lies in exactly
// one tile, and is loaded and computed by one thread of the block holding it.
extern "C" __global__ void __launch_bounds__(EQ_TILE * EQ_TROWS) EQ_KERNEL(EQ_PARAMS) {
    const eq_idx np = ((eq_idx)EQ_TP + EQ_TILE - 1) / EQ_TILE;
    const eq_idx nl = ((eq_idx)EQ_TL + EQ_TILE - 1) / EQ_TILE;
    const eq_idx tiles = (eq_idx)EQ_NUMEL / ((eq_idx)EQ_TP * EQ_TL) * np * nl;
    const int x = threadIdx.x, y0 = threadIdx.y;
    for (eq_idx t = blockIdx.x; t < tiles; t += gridDim.x) {
        const eq_idx tl = t % nl, tp = (t / nl) % np, o = t / nl / np;
        const eq_idx a = o % EQ_TA, hi = o / EQ_TA;
        // Flat index of element (hi, p, a, l) of the space.
        const eq_idx base = hi * ((eq_idx)EQ_TP * EQ_TA * EQ_TL) + a * EQ_TL;
        const eq_idx p0 = tp * EQ_TILE, l0 = tl * EQ_TILE;
        for (int y = y0; y < EQ_TILE; y += EQ_TROWS) {
            const eq_idx p = p0 + x, l = l0 + y;
            if (p < EQ_TP && l < EQ_TL) eq_tile_load(EQ_ARGS, base + p * ((eq_idx)EQ_TA * EQ_TL) + l, y, x);
        }
        __syncthreads();
        for (int y = y0; y < EQ_TILE; y += EQ_TROWS) {
            const eq_idx p = p0 + y, l = l0 + x;
            if (p < EQ_TP && l < EQ_TL) eq_body<1>(EQ_ARGS, base + p * ((eq_idx)EQ_TA * EQ_TL) + l, x, y);
        }
        __syncthreads();
    }
}
#else
extern "C" __global__ void __launch_bounds__(EQ_THREADS) EQ_KERNEL(EQ_PARAMS) {
    const eq_idx stride = (eq_idx)gridDim.x * EQ_THREADS;
    const eq_idx first = (eq_idx)blockIdx.x * EQ_THREADS + threadIdx.x;
    const eq_idx nvec = (eq_idx)EQ_NUMEL / EQ_VEC;
#ifdef EQ_PACKED_WRITES
    // A kernel that stores a 1-bit mask: every lane of a warp runs every step, since the warp
    // assembles mask words from its lanes' bits (eq_put_bits); a lane past the end computes on
    // element 0 and stores nothing. The code generator makes EQ_VEC divide EQ_NUMEL here, so
    // there is no tail.
    const eq_idx lane = threadIdx.x & 31;
    for (eq_idx w = first - lane; w < nvec; w += stride) {
        const bool ok = w + lane < nvec;
        eq_body<EQ_VEC>(EQ_ARGS, ok ? (w + lane) * EQ_VEC : 0, ok);
    }
#elif defined(EQ_UNROLL) && EQ_UNROLL > 1
    // Narrow lanes: EQ_UNROLL vectors a step, a block's width apart (coalesced), so that each
    // thread has that many loads in flight (the restrict-qualified body lets them all be issued
    // before the first store).
    // (A step wholly in range runs unguarded: a guard per vector would keep each vector's
    // loads behind the previous one's store.)
    for (eq_idx c = (eq_idx)blockIdx.x * EQ_THREADS * EQ_UNROLL + threadIdx.x; c < nvec; c += stride * EQ_UNROLL) {
        if (c + (eq_idx)(EQ_UNROLL - 1) * EQ_THREADS < nvec) {
#pragma unroll
            for (int u = 0; u < EQ_UNROLL; ++u) eq_body<EQ_VEC>(EQ_ARGS, (c + (eq_idx)u * EQ_THREADS) * EQ_VEC);
        } else {
            for (eq_idx v = c; v < nvec; v += EQ_THREADS) eq_body<EQ_VEC>(EQ_ARGS, v * EQ_VEC);
        }
    }
#else
    for (eq_idx v = first; v < nvec; v += stride) {
        eq_body<EQ_VEC>(EQ_ARGS, v * EQ_VEC);
    }
#endif
#ifndef EQ_PACKED_WRITES
    if (EQ_NUMEL % EQ_VEC != 0) {
        for (eq_idx i = nvec * EQ_VEC + first; i < (eq_idx)EQ_NUMEL; i += stride) {
            eq_body<1>(EQ_ARGS, i);
        }
    }
#endif
}
#endif
