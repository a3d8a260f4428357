// Times variants of the attention template against each other (bf16 8x16x2048x64), checks each
// against variant 0 (non-causal) or 4 (causal), and against a naive f32 GPU reference on head 0..1.
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <algorithm>
#include <cuda_bf16.h>
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("CUDA %s at %d\n", cudaGetErrorString(e), __LINE__); exit(1); } } while (0)
typedef void (*L)(const void*, const void*, const void*, void*, const char**);
extern "C" void launch_v0(const void*, const void*, const void*, void*, const char**);
extern "C" void launch_v1(const void*, const void*, const void*, void*, const char**);
extern "C" void launch_v2(const void*, const void*, const void*, void*, const char**);
extern "C" void launch_v3(const void*, const void*, const void*, void*, const char**);
extern "C" void launch_v4(const void*, const void*, const void*, void*, const char**);
extern "C" void launch_v5(const void*, const void*, const void*, void*, const char**);
__global__ void naive(const __nv_bfloat16* q, const __nv_bfloat16* k, const __nv_bfloat16* v, float* o, int S, int causal) {
    int bh = blockIdx.y, i = blockIdx.x * blockDim.x + threadIdx.x; if (i >= S) return;
    const __nv_bfloat16 *qi = q + ((size_t)bh * S + i) * 64, *kb = k + (size_t)bh * S * 64, *vb = v + (size_t)bh * S * 64;
    float m = -1e30f, l = 0, acc[64] = {0};
    for (int j = 0; j < S; ++j) {
        if (causal && j > i) break;
        float s = 0; for (int d = 0; d < 64; ++d) s += __bfloat162float(qi[d]) * __bfloat162float(kb[j * 64 + d]);
        s *= 0.125f; float mn = fmaxf(m, s), a = expf(m - mn), p = expf(s - mn);
        l = l * a + p; for (int d = 0; d < 64; ++d) acc[d] = acc[d] * a + p * __bfloat162float(vb[j * 64 + d]); m = mn;
    }
    for (int d = 0; d < 64; ++d) o[((size_t)bh * S + i) * 64 + d] = acc[d] / l;
}
int main() {
    const size_t n = 8ull * 16 * 2048 * 64; const int S = 2048;
    std::vector<__nv_bfloat16> h(n);
    void *q, *k, *v, *o, *o0; float* ref;
    CK(cudaMalloc(&q, n * 2)); CK(cudaMalloc(&k, n * 2)); CK(cudaMalloc(&v, n * 2)); CK(cudaMalloc(&o, n * 2)); CK(cudaMalloc(&o0, n * 2));
    CK(cudaMalloc(&ref, 2ull * S * 64 * 4));
    srand(1);
    for (void* p : {q, k, v}) {
        for (auto& x : h) { float u = 0; for (int t = 0; t < 12; ++t) u += rand() / (float)RAND_MAX; x = __float2bfloat16(u - 6.0f); }
        CK(cudaMemcpy(p, h.data(), n * 2, cudaMemcpyHostToDevice));
    }
    L ls[] = {launch_v0, launch_v1, launch_v2, launch_v3, launch_v4, launch_v5};
    cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
    std::vector<__nv_bfloat16> got(n), base(n); std::vector<float> r(2ull * S * 64);
    for (int causal = 0; causal < 2; ++causal) {
        naive<<<dim3(S / 128, 2), 128>>>((const __nv_bfloat16*)q, (const __nv_bfloat16*)k, (const __nv_bfloat16*)v, ref, S, causal);
        CK(cudaDeviceSynchronize());
        CK(cudaMemcpy(r.data(), ref, r.size() * 4, cudaMemcpyDeviceToHost));
        for (int vi = causal ? 4 : 0; vi < (causal ? 6 : 4); ++vi) {
            const char* name; CK(cudaMemset(o, 0xff, n * 2));
            ls[vi](q, k, v, o, &name); CK(cudaGetLastError()); CK(cudaDeviceSynchronize());
            CK(cudaMemcpy(got.data(), o, n * 2, cudaMemcpyDeviceToHost));
            double maxref = 0, maxerr = 0, num = 0, den = 0;
            for (size_t e = 0; e < r.size(); ++e) {
                double g = __bfloat162float(got[e]), w = r[e];
                maxref = std::max(maxref, std::abs(w)); maxerr = std::max(maxerr, std::abs(g - w)); num += (g - w) * (g - w); den += w * w;
                if (g != g) { maxerr = 1e30; }
            }
            size_t nan = 0; for (auto x : got) if (__bfloat162float(x) != __bfloat162float(x)) ++nan;
            if (vi == (causal ? 4 : 0)) base = got;
            size_t diff = 0; for (size_t e = 0; e < n; ++e) if (*(unsigned short*)&got[e] != *(unsigned short*)&base[e]) ++diff;
            for (int w = 0; w < 10; ++w) ls[vi](q, k, v, o, &name);
            std::vector<float> ts;
            for (int it = 0; it < 100; ++it) { cudaEventRecord(a); ls[vi](q, k, v, o, &name); cudaEventRecord(b); cudaEventSynchronize(b); float ms; cudaEventElapsedTime(&ms, a, b); ts.push_back(ms); }
            CK(cudaGetLastError());
            std::sort(ts.begin(), ts.end());
            double flops = 4.0 * 8 * 16 * S * S * 64 / (causal ? 2 : 1);
            printf("%-40s median %.4f ms (min %.4f) %.0f TFLOP/s | heads 0-1 vs f32 naive: max err %.2e of max %.3f, rel l2 %.2e | NaN %zu | differs from base in %zu elems\n",
                   name, ts[50], ts[0], flops / ts[50] / 1e9, maxerr, maxref, std::sqrt(num / den), nan, diff);
        }
    }
    return 0;
}
