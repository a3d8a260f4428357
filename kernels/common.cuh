// common.cuh: storage types, conversions, vector access and pointwise helpers shared by the
// eqfuse kernel templates (elementwise.cu, rowreduce.cu, colreduce.cu, scatter.cu; attention.cu
// and attention_bwd.cu share their bias and dropout helpers here too).
//
// Math: every value is computed in f32 (`float`), i32 (`int`) or `bool`; f16 and bf16 exist only
// in device memory and are widened on load and rounded to nearest even on store:
//   bf16(x) = top 16 bits of the f32 x after adding 0x7fff + bit16 (NaN kept a quiet NaN),
//   f16(x)  = cvt.rn.f16.f32 (IEEE round to nearest even, overflow to infinity).
// Pointwise helpers follow src/scalar.rs (gelu in erf form, NaN-propagating max/min, stable
// sigmoid); `eq_dropout` and `eq_dropout_seeded` are src/reference/rng.rs bit for bit.
//
// Launch shape: none (helpers only).
// Invariants: compiles with NVRTC and nothing but `--gpu-architecture`, so it includes no
// CUDA header; `eq_loadv`/`eq_storev` of V elements need a pointer aligned to V * sizeof(T)
// bytes, which the code generator guarantees (or passes V = 1); `eq_loadv_row`/`eq_storev_row`
// touch only the columns of the row.
#ifndef EQ_COMMON_CUH
#define EQ_COMMON_CUH

#ifdef EQ_WIDE_INDEX
typedef unsigned long long eq_idx;
#else
typedef unsigned int eq_idx;
#endif

#define EQ_INF (__int_as_float(0x7f800000))
#define EQ_NAN (__int_as_float(0x7fc00000))

// Storage types of f16, bf16 and bool tensors.
struct eq_bf16 { unsigned short bits; };
struct eq_f16 { unsigned short bits; };
typedef unsigned char eq_bool;

// ---- loads: storage to value ----
__device__ __forceinline__ float eq_val(float x) { return x; }
__device__ __forceinline__ float eq_val(eq_bf16 x) { return __uint_as_float(((unsigned int)x.bits) << 16); }
__device__ __forceinline__ float eq_val(eq_f16 x) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(x.bits));
    return f;
}
__device__ __forceinline__ int eq_val(int x) { return x; }
__device__ __forceinline__ bool eq_val(eq_bool x) { return x != 0; }

// ---- stores: value to storage ----
// bf16 rounding: sm_80 and later round in one instruction (`cvt.rn.bf16.f32`, IEEE nearest
// even, NaN to the canonical quiet NaN); earlier devices add 0x7fff + bit 16 (NaN kept quiet).
// The same value either way but for a NaN's payload (5 to 7 integer instructions an element
// against one: a bf16 softmax over 50257 columns issued 0.73 instructions a cycle a scheduler).
__device__ __forceinline__ unsigned short eq_bf16_bits(float x) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    unsigned short h;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(x));
    return h;
#else
    unsigned int u = __float_as_uint(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (unsigned short)(u >> 16);
#endif
}
// Two values rounded to bf16 and packed, `lo` at the lower address: one `cvt.rn.bf16x2.f32`
// on sm_80 and later.
__device__ __forceinline__ unsigned int eq_bf16x2_bits(float lo, float hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    unsigned int d;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
    return d;
#else
    return (unsigned int)eq_bf16_bits(lo) | ((unsigned int)eq_bf16_bits(hi) << 16);
#endif
}
__device__ __forceinline__ unsigned short eq_f16_bits(float x) {
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(x));
    return h;
}
__device__ __forceinline__ void eq_put(float* p, float x) { *p = x; }
__device__ __forceinline__ void eq_put(eq_bf16* p, float x) { p->bits = eq_bf16_bits(x); }
__device__ __forceinline__ void eq_put(eq_f16* p, float x) { p->bits = eq_f16_bits(x); }
__device__ __forceinline__ void eq_put(int* p, int x) { *p = x; }
__device__ __forceinline__ void eq_put(eq_bool* p, bool x) { *p = x ? 1 : 0; }

// Rounding a value to a narrower float type (the `cast` op), staying in f32.
__device__ __forceinline__ float eq_round_bf16(float x) { return __uint_as_float(((unsigned int)eq_bf16_bits(x)) << 16); }
__device__ __forceinline__ float eq_round_f16(float x) { eq_f16 h; h.bits = eq_f16_bits(x); return eq_val(h); }

// ---- vector access: V consecutive elements in one 2, 4, 8 or 16-byte transaction ----
template <int B> struct eq_word { };
template <> struct eq_word<2> { typedef unsigned short t; };
template <> struct eq_word<4> { typedef unsigned int t; };
template <> struct eq_word<8> { typedef uint2 t; };
template <> struct eq_word<16> { typedef uint4 t; };

template <typename T> struct eq_is_bf16 { static constexpr bool value = false; };
template <> struct eq_is_bf16<eq_bf16> { static constexpr bool value = true; };

template <typename T, int V> struct eq_pack {
    static constexpr int bytes = V * (int)sizeof(T);
    static constexpr bool wide = V > 1 && (bytes == 2 || bytes == 4 || bytes == 8 || bytes == 16);
};

template <typename T, int V, typename U>
__device__ __forceinline__ void eq_loadv(const T* __restrict__ p, U (&out)[V]) {
    if constexpr (eq_pack<T, V>::wide) {
        typedef typename eq_word<eq_pack<T, V>::bytes>::t W;
        union { W w; T e[V]; } u;
        u.w = *reinterpret_cast<const W*>(p);
#pragma unroll
        for (int v = 0; v < V; ++v) out[v] = eq_val(u.e[v]);
    } else {
#pragma unroll
        for (int v = 0; v < V; ++v) out[v] = eq_val(p[v]);
    }
}

template <typename T, int V, typename U>
__device__ __forceinline__ void eq_storev(T* __restrict__ p, const U (&in)[V]) {
    if constexpr (eq_pack<T, V>::wide && eq_is_bf16<T>::value) {
        // Pairs of bf16 rounded and packed by one instruction each.
        typedef typename eq_word<eq_pack<T, V>::bytes>::t W;
        union { W w; unsigned int h[V / 2]; } u;
#pragma unroll
        for (int v = 0; v < V; v += 2) u.h[v / 2] = eq_bf16x2_bits((float)in[v], (float)in[v + 1]);
        *reinterpret_cast<W*>(p) = u.w;
    } else if constexpr (eq_pack<T, V>::wide) {
        typedef typename eq_word<eq_pack<T, V>::bytes>::t W;
        union { W w; T e[V]; } u;
#pragma unroll
        for (int v = 0; v < V; ++v) eq_put(&u.e[v], in[v]);
        *reinterpret_cast<W*>(p) = u.w;
    } else {
#pragma unroll
        for (int v = 0; v < V; ++v) eq_put(p + v, in[v]);
    }
}

// Row-bounded vector access (rowreduce.cu's shifted rows): `p` is aligned to V elements and
// holds columns col0 .. col0 + V - 1 of a row of `cols` columns, of which only those in
// [0, cols) exist (col0 is unsigned, so a column before 0 wraps to a large value and fails the
// same bound). A vector wholly inside the row is one access; otherwise each column inside is
// read or written alone, and a read gives 0 elsewhere (the caller ignores those lanes).
__device__ __forceinline__ bool eq_in_row(eq_idx col, eq_idx cols) { return col < cols; }
// Whether the n columns from col0 all lie in the row (a wrapped col0 is past any row's end):
// where EQ_SPLIT_LANES, generated lane loops over such vectors test no lane.
#ifndef EQ_SPLIT_LANES
#define EQ_SPLIT_LANES 0
#endif
__device__ __forceinline__ bool eq_whole_in_row(eq_idx col0, int n, eq_idx cols) { return col0 < cols && col0 + n <= cols; }
template <typename T, int V, typename U>
__device__ __forceinline__ void eq_loadv_row(const T* __restrict__ p, U (&out)[V], eq_idx col0, eq_idx cols) {
    if (col0 < cols && col0 + V <= cols) {
        eq_loadv<T, V>(p, out);
        return;
    }
#pragma unroll
    for (int v = 0; v < V; ++v) out[v] = eq_in_row(col0 + v, cols) ? eq_val(p[v]) : U(0);
}
template <typename T, int V, typename U>
__device__ __forceinline__ void eq_storev_row(T* __restrict__ p, const U (&in)[V], eq_idx col0, eq_idx cols) {
    if (col0 < cols && col0 + V <= cols) {
        eq_storev<T, V>(p, in);
        return;
    }
#pragma unroll
    for (int v = 0; v < V; ++v)
        if (eq_in_row(col0 + v, cols)) eq_put(p + v, in[v]);
}

// A vector of V elements of T as its one word (`eq_word`: 16-byte vectors of bf16 in 4
// registers, not 8 as values), and the word's elements as values: rowreduce.cu's rows kept in
// registers as loaded (EQ_CACHE_RAW). `eq_loadw_row` reads as eq_loadv_row does, the lanes
// outside [0, cols) as zeros.
template <typename T, int V>
__device__ __forceinline__ typename eq_word<eq_pack<T, V>::bytes>::t eq_loadw_row(const T* __restrict__ p, eq_idx col0,
                                                                                  eq_idx cols) {
    typedef typename eq_word<eq_pack<T, V>::bytes>::t W;
    union { W w; T e[V]; } u;
    if (col0 < cols && col0 + V <= cols) return *reinterpret_cast<const W*>(p);
#pragma unroll
    for (int v = 0; v < V; ++v) {
        T x{};
        if (eq_in_row(col0 + v, cols)) x = p[v];
        u.e[v] = x;
    }
    return u.w;
}
template <typename T, int V, typename U>
__device__ __forceinline__ void eq_unpackw(const typename eq_word<eq_pack<T, V>::bytes>::t& w, U (&out)[V]) {
    union { typename eq_word<eq_pack<T, V>::bytes>::t w; T e[V]; } u;
    u.w = w;
#pragma unroll
    for (int v = 0; v < V; ++v) out[v] = eq_val(u.e[v]);
}

// A row copy's partial vector (rowreduce.cu's shifted rows kept in shared memory): the vector
// at p holding columns col0 .. col0 + V - 1 (as eq_loadv_row) stored at `keep`, with zeros for
// columns outside [0, cols).
template <typename T, int V>
__device__ __forceinline__ void eq_keepv_row(const T* __restrict__ p, T* keep, eq_idx col0, eq_idx cols) {
#pragma unroll
    for (int v = 0; v < V; ++v) {
        T x{};
        if (eq_in_row(col0 + v, cols)) x = p[v];
        keep[v] = x;
    }
}

// ---- 1-bit masks: a saved bool tensor stored packed, 32 elements to a 32-bit word ----
// Element i is bit i % 32 of word i / 32 (row-major i; docs/plan-schema.md). A packed mask is
// passed as one pointer wrapped in `eq_bits` (read) or `eq_bits_out` (written); `p[i]` and
// `p + i` work as on an `eq_bool` pointer, so a generated load reads the same either way.
struct eq_bits_at {
    const unsigned int* w;
    eq_idx i;
    __device__ __forceinline__ bool operator[](eq_idx d) const {
        const eq_idx j = i + d;
        return ((w[j >> 5] >> (j & 31u)) & 1u) != 0u;
    }
    __device__ __forceinline__ eq_bits_at operator+(eq_idx d) const { return eq_bits_at{w, i + d}; }
};
struct eq_bits {
    const unsigned int* w;
    __device__ __forceinline__ bool operator[](eq_idx i) const { return ((w[i >> 5] >> (i & 31u)) & 1u) != 0u; }
    __device__ __forceinline__ eq_bits_at operator+(eq_idx i) const { return eq_bits_at{w, i}; }
};
struct eq_bits_out {
    unsigned int* w;
};
__device__ __forceinline__ bool eq_val(bool x) { return x; }

// V consecutive mask elements from one word: a vector access starts at a multiple of V, and V
// divides 32, so the V bits never straddle two words.
template <typename T, int V, typename U>
__device__ __forceinline__ void eq_loadv(eq_bits_at p, U (&out)[V]) {
    static_assert(V >= 1 && V <= 32 && 32 % V == 0, "a vector of mask bits lies in one word");
    const unsigned int word = p.w[p.i >> 5] >> (p.i & 31u);
#pragma unroll
    for (int v = 0; v < V; ++v) out[v] = ((word >> v) & 1u) != 0u;
}

// Stores the mask bits of a warp: lane l holds in `bits` (bit v) elements i0 .. i0 + V - 1, the
// lanes of the warp hold consecutive groups of V, and lane 0's i0 is a multiple of 32 V (the
// elementwise template's warp-uniform loop, EQ_PACKED_WRITES). The 32 / V lanes of one word OR
// their shifted bits together and the first of them writes the word; a lane with `ok` false
// contributes nothing (and its word, past the end, is not written). Every lane of the warp must
// call it.
template <int V>
__device__ __forceinline__ void eq_put_bits(eq_bits_out p, eq_idx i0, unsigned int bits, bool ok) {
    static_assert(V >= 1 && V <= 32 && 32 % V == 0, "a word holds whole groups of V");
    constexpr unsigned int G = 32 / V;
    const unsigned int lane = threadIdx.x & 31u;
    unsigned int c = ok ? bits << ((lane * V) & 31u) : 0u;
#pragma unroll
    for (unsigned int o = 1; o < G; o <<= 1) c |= __shfl_xor_sync(0xffffffffu, c, o);
    if (ok && lane % G == 0) p.w[i0 >> 5] = c;
}

// ---- f32 register tiles (the f32 attention kernels) ----
// Lane i of a float4; acc += p * v; s + <a, b> (in order x, y, z, w).
__device__ __forceinline__ float eq_lane4(const float4& v, int i) { return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w; }
__device__ __forceinline__ void eq_fma4(float4& acc, float p, const float4& v) {
    acc.x = fmaf(p, v.x, acc.x);
    acc.y = fmaf(p, v.y, acc.y);
    acc.z = fmaf(p, v.z, acc.z);
    acc.w = fmaf(p, v.w, acc.w);
}
__device__ __forceinline__ float eq_dot4(const float4& a, const float4& b, float s) {
    s = fmaf(a.x, b.x, s);
    s = fmaf(a.y, b.y, s);
    s = fmaf(a.z, b.z, s);
    return fmaf(a.w, b.w, s);
}

// Called by every thread of a block after its atomic additions: whether the block is the last
// of the gridDim.x blocks counted in *count to arrive. Every thread's additions are made visible
// before the block is counted, and the last block's reads see every block's.
__device__ __forceinline__ bool eq_arrive_last(unsigned* count) {
    __shared__ bool last;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(count, 1u) == gridDim.x - 1;
    __syncthreads();
    if (last) __threadfence();
    return last;
}

// ---- asynchronous copies global -> shared (sm_80+), no registers held while in flight ----
template <int B>
__device__ __forceinline__ void eq_cp_async(void* smem, const void* gmem) {
    static_assert(B == 4 || B == 8 || B == 16, "cp.async copies 4, 8 or 16 bytes");
    unsigned int s;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(s) : "l"(smem));
    if constexpr (B == 16) {
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(gmem) : "memory");
    } else {
        asm volatile("cp.async.ca.shared.global [%0], [%1], %2;" ::"r"(s), "l"(gmem), "n"(B) : "memory");
    }
}
// The same copy of which only the first `src` bytes come from `gmem`, the rest zeros (a row's
// partial last vector: nothing past the row is read).
template <int B>
__device__ __forceinline__ void eq_cp_async_n(void* smem, const void* gmem, int src) {
    static_assert(B == 4 || B == 8 || B == 16, "cp.async copies 4, 8 or 16 bytes");
    unsigned int s;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(s) : "l"(smem));
    if constexpr (B == 16) {
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(s), "l"(gmem), "r"(src) : "memory");
    } else {
        asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;" ::"r"(s), "l"(gmem), "n"(B), "r"(src) : "memory");
    }
}
__device__ __forceinline__ void eq_cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
__device__ __forceinline__ void eq_cp_async_wait_all() { asm volatile("cp.async.wait_all;" ::: "memory"); }
// Waits until at most N of the thread's latest committed groups are still in flight.
template <int N>
__device__ __forceinline__ void eq_cp_async_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }

// A load that bypasses L1, for values other blocks of the same launch wrote.
__device__ __forceinline__ float eq_ld_cg(const float* p) {
    float x;
    asm volatile("ld.global.cg.f32 %0, [%1];" : "=f"(x) : "l"(p));
    return x;
}

// ---- scatter_add: values added by atomics at an index (scatter.cu) ----
// An index j into an axis of n elements is j, or j + n below 0 (NumPy); one outside [-n, n)
// adds nothing, so nothing is written outside the output.
template <typename T>
__device__ __forceinline__ void eq_scatter_add(T* p, eq_idx off, int j, long long n, eq_idx stride, T x) {
    const long long k = j < 0 ? (long long)j + n : (long long)j;
    if (k >= 0 && k < n) atomicAdd(p + off + (eq_idx)k * stride, x);
}

// V values added to consecutive elements: f32 by 16-byte (or 8-byte) vector atomics on sm_90,
// where q is aligned to V floats (to 4 for V a multiple of 4).
template <int V>
__device__ __forceinline__ void eq_red_addv(float* q, const float (&x)[V]) {
#if __CUDA_ARCH__ >= 900
    if constexpr (V % 4 == 0) {
#pragma unroll
        for (int v = 0; v < V; v += 4) {
            asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(q + v), "f"(x[v]), "f"(x[v + 1]),
                         "f"(x[v + 2]), "f"(x[v + 3])
                         : "memory");
        }
    } else if constexpr (V == 2) {
        asm volatile("red.global.add.v2.f32 [%0], {%1, %2};" ::"l"(q), "f"(x[0]), "f"(x[1]) : "memory");
    } else {
#pragma unroll
        for (int v = 0; v < V; ++v) atomicAdd(q + v, x[v]);
    }
#else
#pragma unroll
    for (int v = 0; v < V; ++v) atomicAdd(q + v, x[v]);
#endif
}
template <int V>
__device__ __forceinline__ void eq_red_addv(int* q, const int (&x)[V]) {
#pragma unroll
    for (int v = 0; v < V; ++v) atomicAdd(q + v, x[v]);
}

// V values added to consecutive elements from p + off + k * stride at one index j (as
// eq_scatter_add), where off + k * stride is a multiple of V.
template <int V, typename T>
__device__ __forceinline__ void eq_scatter_addv(T* p, eq_idx off, int j, long long n, eq_idx stride, const T (&x)[V]) {
    const long long k = j < 0 ? (long long)j + n : (long long)j;
    if (k >= 0 && k < n) eq_red_addv<V>(p + off + (eq_idx)k * stride, x);
}

// ---- pointwise semantics (src/scalar.rs) ----
// Branch-free: 1 / (1 + e^-x) is accurate for every x (e^-x overflows to inf only where the
// result is below the smallest normal), and `__frcp_rn` is the correctly rounded reciprocal
// (`1.0f / y` exactly) without the division's slow path. The two-branch form made warps
// diverge on mixed signs: silu(a) * u over 8192x5632 bf16 on an H200 (2026-11-26) ran 104.7 us
// against 67.3 us branch-free (a copy of the same bytes: 66.3 us).
__device__ __forceinline__ float eq_sigmoid(float x) { return __frcp_rn(1.0f + expf(-x)); }
// GELU without the cancellation of 1 + erf(t) and 1 + tanh(t) where t is negative: the erf form
// as 0.5 x erfc(-x / sqrt 2), the tanh form as x sigmoid(2t) (0.5 (1 + tanh t) = sigmoid(2t)),
// both exact rewritings. `1 + tanhf(t)` kept about 6e-8 of absolute error, which on rows of
// log-probabilities near -9 was 1% of each result (the fidelity run's g1061, H100, 2026-11-26).
__device__ __forceinline__ float eq_gelu(float x) { return 0.5f * x * erfcf(x * -0.70710678118654752f); }
__device__ __forceinline__ float eq_gelu_tanh(float x) {
    return x * eq_sigmoid(1.5957691216057307f * (x + 0.044715f * x * x * x));
}
__device__ __forceinline__ float eq_silu(float x) { return x * eq_sigmoid(x); }
// x / d for a divisor shared by a row: a product with the (hoisted) reciprocal while 1/d is a
// normal number (within 1.5 ulp of the division), else the IEEE division (0, inf, NaN, tiny or
// huge d).
__device__ __forceinline__ float eq_div_row(float x, float d) {
    const float a = fabsf(d);
    return (a > 0x1p-125f && a < 0x1p125f) ? x * (1.0f / d) : x / d;
}
__device__ __forceinline__ float eq_relu(float x) { return x > 0.0f ? x : 0.0f; }
__device__ __forceinline__ int eq_relu(int x) { return x > 0 ? x : 0; }
__device__ __forceinline__ float eq_abs(float x) { return fabsf(x); }
__device__ __forceinline__ int eq_abs(int x) { return x < 0 ? -x : x; }
// NaN if either operand is NaN, else the larger (one instruction: `max.NaN`, sm_80 and later).
__device__ __forceinline__ float eq_max(float a, float b) {
    float d;
    asm("max.NaN.f32 %0, %1, %2;" : "=f"(d) : "f"(a), "f"(b));
    return d;
}
__device__ __forceinline__ float eq_min(float a, float b) {
    float d;
    asm("min.NaN.f32 %0, %1, %2;" : "=f"(d) : "f"(a), "f"(b));
    return d;
}
__device__ __forceinline__ int eq_max(int a, int b) { return a > b ? a : b; }
__device__ __forceinline__ double eq_max(double a, double b) { return a > b ? a : b; }
__device__ __forceinline__ double eq_min(double a, double b) { return a < b ? a : b; }
__device__ __forceinline__ int eq_min(int a, int b) { return a < b ? a : b; }
// i32 division truncates; division by zero gives 0 (as the reference does).
__device__ __forceinline__ int eq_idiv(int a, int b) { return b == 0 ? 0 : a / b; }
// f32 to i32: truncate, saturate, NaN to 0.
// A double truncated to i32 as the reference rounds to i32 (NaN to 0, saturating).
__device__ __forceinline__ int eq_d2i(double x) {
    if (x != x) return 0;
    if (x >= 2147483647.0) return 2147483647;
    if (x <= -2147483648.0) return (-2147483647 - 1);
    return (int)x;
}
__device__ __forceinline__ int eq_f2i(float x) {
    if (x != x) return 0;
    if (x >= 2147483647.0f) return 2147483647;
    if (x <= -2147483648.0f) return (-2147483647 - 1);
    return (int)x;
}

// exp(x) as one ex2.approx of x log2(e) (src/codegen/emit.rs, `fast_exp`: row kernels of 16-bit
// rows outside strict numerics): the non-ftz form keeps subnormal results; exp(-inf) = 0,
// exp(+inf) = inf and NaN stays NaN, as expf. Relative error: ex2.approx's 2 ulp and
// |x| log2(e) 2^-24 from the product's rounding.
__device__ __forceinline__ float eq_exp_fast(float x) {
    float y;
    asm("ex2.approx.f32 %0, %1;" : "=f"(y) : "f"(x * 1.4426950408889634f));
    return y;
}

// ---- online softmax: a running (max m, sum s of exp(x - m)) pair ----
// `s` rescaled from max `m_old` to max `m` (an empty pair, m = -inf, stays empty).
__device__ __forceinline__ float eq_lse_rescale(float s, float m_old, float m) {
    return m == -EQ_INF ? 0.0f : s * expf(m_old - m);
}

// ---- the counter-based generator of src/rng.rs ----
__device__ __forceinline__ unsigned int eq_mix32(unsigned int x) {
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    x *= 0x846ca68bu;
    x ^= x >> 16;
    return x;
}
// Whether dropout keeps element `index`; `key0` is stream_key(seed, 0), computed by the code
// generator (or once per thread from a seed read at run time) for indices below 2^32.
__device__ __forceinline__ bool eq_dropout_keep(unsigned long long index, unsigned int seed, unsigned int key0,
                                                unsigned int threshold) {
    const unsigned int hi = (unsigned int)(index >> 32);
    const unsigned int key = hi == 0 ? key0 : eq_mix32(eq_mix32(seed ^ 0x9e3779b9u) ^ hi);
    return eq_mix32(key ^ (unsigned int)index) >= threshold;
}
// stream_key(seed, 0).
__device__ __forceinline__ unsigned int eq_dropout_key0(unsigned int seed) { return eq_mix32(eq_mix32(seed ^ 0x9e3779b9u)); }
__device__ __forceinline__ float eq_dropout(float x, unsigned long long index, unsigned int seed, unsigned int key0,
                                            unsigned int threshold, float scale) {
    return eq_dropout_keep(index, seed, key0, threshold) ? __fmul_rn(x, scale) : 0.0f;
}
// A seed read at run time (dropout's seed given as an i32 tensor, reinterpreted as unsigned):
// the key stream_key(seed, 0) is computed here, two mix32 per call on a value that is the same
// for every element (so free to hoist), instead of by the code generator.
__device__ __forceinline__ float eq_dropout_seeded(float x, unsigned long long index, unsigned int seed,
                                                   unsigned int threshold, float scale) {
    return eq_dropout(x, index, seed, eq_dropout_key0(seed), threshold, scale);
}

// ---- attention's bias and dropout (attention.cu, attention_bwd.cu) ----
// An attention kernel's `#define` block comes before this header (the code generator's prefix),
// so its bias and dropout constants are known here; a template compiled alone defines neither.
#if defined(EQ_BIAS) && EQ_BIAS
// The bias of query row `row` and key `col` of a batch entry (`bg`: its first element), as an
// attention kernel adds it to the scaled score in f32; 0 outside the scores (those are masked to
// -inf, and the load stays inside the tensor). With EQ_BIAS_SEL the tensor is a bool mask
// (eq_bool) and the bias EQ_BIAS_YES where it holds, EQ_BIAS_NO elsewhere (a bool mask's bias
// `where(m, 0, FILL)`, computed in place).
__device__ __forceinline__ float eq_att_bias_of(EQ_BT x) {
#if defined(EQ_BIAS_SEL) && EQ_BIAS_SEL
    return eq_val(x) ? EQ_BIAS_YES : EQ_BIAS_NO;
#else
    return eq_val(x);
#endif
}
__device__ __forceinline__ float eq_att_bias(const EQ_BT* bg, int row, int col) {
    if (row >= EQ_SQ || col >= EQ_SK) return 0.0f;
    return eq_att_bias_of(bg[(long long)row * EQ_B_SR + (long long)col * EQ_B_SC]);
}
// A bias by key alone (row stride 0: a padding mask [B, 1, 1, SK]).
#define EQ_BIAS_BY_KEY (EQ_B_SR == 0)
// The bias of the scores of one tile a thread holds in the m16n8 accumulator layout (its SN n8
// tiles from key n0: columns n0 + 8 nt + 2 t + c, c < 2). A bias by key alone is loaded into
// registers by `load` (the raw values, one per column: 2 SN), which a kernel issues before the
// tile's products so that their latency hides the loads; any other bias is read where `at` is
// asked (and `load` does nothing).
template <int SN>
struct eq_att_tile_bias {
#if EQ_BIAS_BY_KEY
    EQ_BT v[SN][2];
#endif
    __device__ __forceinline__ void load(const EQ_BT* bg, int n0, int t) {
#if EQ_BIAS_BY_KEY
#pragma unroll
        for (int nt = 0; nt < SN; ++nt)
#pragma unroll
            for (int c = 0; c < 2; ++c) {
                const int col = n0 + nt * 8 + 2 * t + c;
                v[nt][c] = bg[(long long)(col < EQ_SK ? col : 0) * EQ_B_SC];
            }
#endif
    }
    // The bias of score (row, col), held in n8 tile nt at column parity c.
    __device__ __forceinline__ float at(const EQ_BT* bg, int nt, int c, int row, int col) const {
#if EQ_BIAS_BY_KEY
        return eq_att_bias_of(v[nt][c]);
#else
        return eq_att_bias(bg, row, col);
#endif
    }
};
#endif

#if defined(EQ_DROPOUT) && EQ_DROPOUT
// Whether attention's dropout (`attention_dropout`, `attention_bias_dropout` and their
// gradients) keeps the probability of score (b, row, col): dropout's bit (threshold
// EQ_DROP_THRESHOLD, `key0` that of `seed`) at its flat index (b * EQ_SQ + row) * EQ_SK + col in
// the probabilities [EQ_NB, EQ_SQ, EQ_SK] (the batch axes' row-major order, which b is), so the
// mask is `dropout(softmax(..))`'s bit for bit. Where every index is below 2^32 (the sizes are
// constants: the test folds) the key is key0 and the index is computed in 32 bits; rows past
// EQ_SQ get some bit (never stored).
__device__ __forceinline__ bool eq_att_keep(unsigned seed, unsigned key0, long long b, int row, int col) {
    if ((long long)EQ_NB * EQ_SQ * EQ_SK <= 0x100000000LL) {
        const unsigned index = ((unsigned)b * EQ_SQ + (unsigned)row) * EQ_SK + (unsigned)col;
        return eq_mix32(key0 ^ index) >= EQ_DROP_THRESHOLD;
    }
    const unsigned long long index = (unsigned long long)((b * EQ_SQ + row) * (long long)EQ_SK + col);
    return eq_dropout_keep(index, seed, key0, EQ_DROP_THRESHOLD);
}
// The factor the output (or dv) is scaled by besides 1 / l: 1 / (1 - p) in f32.
#define EQ_DROP_FACTOR EQ_DROP_SCALE
#else
#define EQ_DROP_FACTOR 1.0f
#endif

#endif  // EQ_COMMON_CUH
