// scatter.cu: scatter_add(idx, g, axis, n) with the pointwise body computing g fused in, its
// values summed by atomics (the gradient of gather: an embedding table's rows).
//
// Math: the iteration space D is g's shape [O, M, I] (the axes before the scatter axis, the
// index axes, the axes after it) and the output is [O, EQ_N, I]:
//   out[o, j, i] = sum over m with idx[m] = j of g(o, m, i)
// where g is the generated body's value at (o, m, i) and an index below 0 counts from the end;
// an index outside [-EQ_N, EQ_N) adds nothing (the CPU reference reports it as an error), so
// nothing is written outside the output. The body `eq_body<V>(EQ_ARGS, i0)` computes elements
// i0 .. i0+V-1 of D and adds each at its place (eq_scatter_add, eq_scatter_addv in common.cuh).
//
// Launch shape: a 1-D grid of EQ_THREADS threads a block, any number of blocks (one wave is
// best: the runtime launches one). The work is three phases, each split into chunks that blocks
// claim one at a time from a counter and count done when finished:
//   0 (EQ_ACC 0: f32 and i32 outputs) zero the output, EQ_THREADS * EQ_FILL_STEPS groups of four
//     elements a chunk;
//   1 the body over EQ_THREADS * EQ_ADD_STEPS vectors of EQ_VEC elements of D a chunk, adding
//     into the output (EQ_ACC 0) or into the f32 accumulator eq_acc of the output's shape
//     (EQ_ACC 1: f16 and bf16 outputs);
//   2 (EQ_ACC 1) each output element is its accumulator entry rounded to the storage type, and
//     the entry is zeroed.
// A block claims chunks of a phase only after every chunk of the phase before is done. It waits
// only for chunks that running blocks claimed (a block claims only while it runs), so the wait
// ends whatever order the blocks are scheduled in and whatever the grid size. The sums are in
// the order the atomics land: their last bits depend on scheduling (i32 sums do not).
//
// Invariants: eq_count (phase p's claimed chunks in word p, its done chunks in word 3 + p, the
// blocks that left in word 6) and eq_acc are zero before and after every launch: the runtime
// zeroes them once at allocation, the last block to leave resets the counters and phase 2 zeroes
// the accumulator. EQ_VEC divides the last extent of D (no vector crosses a row, and a vector
// of adds at one index is aligned to EQ_VEC elements of the output).
#ifndef EQ_COMMON_CUH
#include "common.cuh"
#endif

#ifndef EQ_GENERATED
// Default instance: an embedding table's gradient, out[t[r], c] += g[r, c] + b[c] over
// g: f32[64, 256], b: f32[256], t: i32[64], out: f32[1000, 256].
#define EQ_KERNEL scatter_f32
#define EQ_NUMEL 16384
#define EQ_VEC 4
#define EQ_THREADS 256
#define EQ_ADD_STEPS 4
#define EQ_ADD_CHUNKS 4
#define EQ_OUT_NUMEL 256000
#define EQ_OUT p_out
#define EQ_OUT_T float
#define EQ_ACC 0
#define EQ_FILL_STEPS 16
#define EQ_FILL_CHUNKS 16
#define EQ_PARAMS const float* __restrict__ p_g, const float* __restrict__ p_b, const int* __restrict__ p_t, \
    float* __restrict__ p_out, unsigned int* __restrict__ eq_count
#define EQ_ARGS p_g, p_b, p_t, p_out, eq_count

template <int V>
__device__ __forceinline__ void eq_body(EQ_PARAMS, eq_idx i0) {
    const eq_idx c1 = i0 % 256;
    const eq_idx c0 = i0 / 256;
    float g[V], b[V], s[V];
    eq_loadv<float, V>(p_g + i0, g);
    eq_loadv<float, V>(p_b + c1, b);
#pragma unroll
    for (int v = 0; v < V; ++v) s[v] = g[v] + b[v];
    eq_scatter_addv<V>(p_out, c1, p_t[c0], 1000LL, 256, s);
}
#endif

// A counter other blocks of this launch change, read at the device's point of coherence.
__device__ __forceinline__ unsigned int eq_ld_acquire(const unsigned int* p) {
    unsigned int v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

// Runs the chunks of phase `p` (`chunks` of them) that this block claims, once the `before`
// chunks of phase p - 1 are done; a chunk is counted done after its writes are visible to the
// whole device. Every thread of the block calls it.
template <typename F>
__device__ __forceinline__ void eq_phase(unsigned int* count, int p, unsigned int before, unsigned int chunks, F run) {
    __shared__ unsigned int claimed;
    if (threadIdx.x == 0) {
        if (before > 0) {
            while (eq_ld_acquire(count + 3 + p - 1) < before) __nanosleep(64);
        }
        claimed = atomicAdd(count + p, 1u);
    }
    __syncthreads();
    for (;;) {
        const unsigned int c = claimed;
        if (c >= chunks) break;
        run(c);
        __threadfence();
        __syncthreads();
        if (threadIdx.x == 0) {
            atomicAdd(count + 3 + p, 1u);
            claimed = atomicAdd(count + p, 1u);
        }
        __syncthreads();
    }
    __syncthreads();
}

#if EQ_ACC
// Group w of four accumulator entries: the output elements, rounded to the storage type, and
// the entries zeroed (both at L2, where the atomics summed them).
__device__ __forceinline__ void eq_convert_group(float* acc, EQ_OUT_T* out, eq_idx w) {
    const eq_idx e = w * 4;
    if (e + 4 <= (eq_idx)EQ_OUT_NUMEL) {
        const float4 a = __ldcg(reinterpret_cast<const float4*>(acc + e));
        __stcg(reinterpret_cast<float4*>(acc + e), make_float4(0.0f, 0.0f, 0.0f, 0.0f));
        const float x[4] = {a.x, a.y, a.z, a.w};
        eq_storev<EQ_OUT_T, 4>(out + e, x);
    } else {
        for (eq_idx i = e; i < (eq_idx)EQ_OUT_NUMEL; ++i) {
            eq_put(out + i, __ldcg(acc + i));
            __stcg(acc + i, 0.0f);
        }
    }
}
#else
// Zeroes group w of four output elements (the last group may be shorter).
__device__ __forceinline__ void eq_zero_group(EQ_OUT_T* out, eq_idx w) {
    const eq_idx e = w * 4;
    if (e + 4 <= (eq_idx)EQ_OUT_NUMEL) {
        *reinterpret_cast<uint4*>(out + e) = make_uint4(0u, 0u, 0u, 0u);
    } else {
        for (eq_idx i = e; i < (eq_idx)EQ_OUT_NUMEL; ++i) out[i] = (EQ_OUT_T)0;
    }
}
#endif

#define EQ_FILL_GROUPS (((eq_idx)EQ_OUT_NUMEL + 3) / 4)

extern "C" __global__ void __launch_bounds__(EQ_THREADS) EQ_KERNEL(EQ_PARAMS) {
    const eq_idx nvec = (eq_idx)EQ_NUMEL / EQ_VEC;
#if !EQ_ACC
    eq_phase(eq_count, 0, 0u, EQ_FILL_CHUNKS, [&](unsigned int c) {
        const eq_idx first = (eq_idx)c * (EQ_THREADS * EQ_FILL_STEPS) + threadIdx.x;
#pragma unroll
        for (int s = 0; s < EQ_FILL_STEPS; ++s) {
            const eq_idx w = first + (eq_idx)s * EQ_THREADS;
            if (w < EQ_FILL_GROUPS) eq_zero_group(EQ_OUT, w);
        }
    });
#endif
    eq_phase(eq_count, 1, EQ_ACC ? 0u : EQ_FILL_CHUNKS, EQ_ADD_CHUNKS, [&](unsigned int c) {
        const eq_idx first = (eq_idx)c * (EQ_THREADS * EQ_ADD_STEPS) + threadIdx.x;
#pragma unroll
        for (int s = 0; s < EQ_ADD_STEPS; ++s) {
            const eq_idx v = first + (eq_idx)s * EQ_THREADS;
            if (v < nvec) eq_body<EQ_VEC>(EQ_ARGS, v * EQ_VEC);
        }
    });
#if EQ_ACC
    eq_phase(eq_count, 2, EQ_ADD_CHUNKS, EQ_FILL_CHUNKS, [&](unsigned int c) {
        const eq_idx first = (eq_idx)c * (EQ_THREADS * EQ_FILL_STEPS) + threadIdx.x;
#pragma unroll
        for (int s = 0; s < EQ_FILL_STEPS; ++s) {
            const eq_idx w = first + (eq_idx)s * EQ_THREADS;
            if (w < EQ_FILL_GROUPS) eq_convert_group(eq_acc, EQ_OUT, w);
        }
    });
#endif
    // The last block to leave resets the counters: every other block has finished with them.
    if (threadIdx.x == 0) {
        __threadfence();
        if (atomicAdd(eq_count + 6, 1u) == gridDim.x - 1) {
#pragma unroll
            for (int i = 0; i < 7; ++i) eq_count[i] = 0u;
        }
    }
}
