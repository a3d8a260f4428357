// Checks and times configurations of kernels/attention.cu (gen_cfg.py writes them): each against
// a naive f32 GPU reference (outputs, and the log-sum-exp where the configuration writes it) on
// fresh random inputs, the output poisoned (NaN) before the checked launch; then CUDA-event
// timings (median of 50 after 10 warm-up launches). Prints one line per configuration.
#include <cstdio>
#include <cstdlib>
#include <cmath>
#include <vector>
#include <algorithm>
#include <cstring>
#include <cuda_fp16.h>
#include "info.h"
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("CUDA %s at %d\n", cudaGetErrorString(e), __LINE__); exit(1); } } while (0)
#define X(id, wg) extern "C" Info info_##id; extern "C" int launch_##id(const void*, const void*, const void*, void*, float*);
#include "configs.h"
#undef X
struct Cfg { Info* info; int (*launch)(const void*, const void*, const void*, void*, float*); };

__device__ float ld(const unsigned short* p, size_t i, int bf16) {
    unsigned short b = p[i];
    if (bf16) return __uint_as_float((unsigned)b << 16);
    return __half2float(__ushort_as_half(b));
}
// One thread per query row of heads [0, nh): o (f32) and lse.
__global__ void naive(const unsigned short* q, const unsigned short* k, const unsigned short* v, float* o, float* lse,
                      int D, int Sq, int Sk, int causal, float scale, int bf16) {
    int bh = blockIdx.y, i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= Sq) return;
    size_t qb = ((size_t)bh * Sq + i) * D, kb = (size_t)bh * Sk * D;
    float m = -INFINITY, l = 0, acc[128];
    for (int d = 0; d < D; ++d) acc[d] = 0;
    for (int j = 0; j < Sk; ++j) {
        if (causal && j > i) break;
        float s = 0;
        for (int d = 0; d < D; ++d) s += ld(q, qb + d, bf16) * ld(k, kb + (size_t)j * D + d, bf16);
        s *= scale;
        float mn = fmaxf(m, s), a = expf(m - mn), p = expf(s - mn);
        l = l * a + p;
        for (int d = 0; d < D; ++d) acc[d] = acc[d] * a + p * ld(v, kb + (size_t)j * D + d, bf16);
        m = mn;
    }
    for (int d = 0; d < D; ++d) o[((size_t)bh * Sq + i) * D + d] = l > 0 ? acc[d] / l : 0.0f;
    lse[(size_t)bh * Sq + i] = m + logf(l);
}

static float h2f(unsigned short b, int bf16) {
    unsigned u;
    if (bf16) u = (unsigned)b << 16;
    else {  // IEEE half to float
        unsigned sg = (b >> 15) & 1, ex = (b >> 10) & 31, mt = b & 1023;
        if (ex == 31) u = (sg << 31) | 0x7f800000u | (mt << 13);
        else if (ex == 0) { float f = std::ldexp((float)mt, -24); if (sg) f = -f; return f; }
        else u = (sg << 31) | ((ex + 112) << 23) | (mt << 13);
    }
    float f; memcpy(&f, &u, 4); return f;
}
static unsigned short f2h(float f, int bf16) {
    unsigned u; memcpy(&u, &f, 4);
    if (bf16) return (unsigned short)((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
    // float to IEEE half, round to nearest (inputs here are normal and small)
    unsigned sg = (u >> 31) & 1; int ex = (int)((u >> 23) & 255) - 127 + 15; unsigned mt = u & 0x7fffff;
    if (ex <= 0) return (unsigned short)(sg << 15);
    unsigned h = (sg << 15) | ((unsigned)ex << 10) | (mt >> 13);
    unsigned rest = mt & 0x1fff;
    if (rest > 0x1000 || (rest == 0x1000 && (h & 1))) ++h;
    return (unsigned short)h;
}

int main(int argc, char** argv) {
    std::vector<Cfg> cfgs;
#define X(id, wg) cfgs.push_back({&info_##id, launch_##id});
#include "configs.h"
#undef X
    cudaEvent_t ea, eb; CK(cudaEventCreate(&ea)); CK(cudaEventCreate(&eb));
    unsigned seed = 12345;
    int fails = 0;
    for (auto& c : cfgs) {
        if (argc > 1 && !strstr(argv[1], c.info->id)) continue;
        const Info& I = *c.info;
        size_t nq = (size_t)I.nb * I.sq * I.d, nk = (size_t)I.nb * I.sk * I.d;
        std::vector<unsigned short> hq(nq), hk(nk), hv(nk);
        auto fill = [&](std::vector<unsigned short>& h) {
            for (auto& x : h) { float u = 0; for (int t = 0; t < 12; ++t) { seed = seed * 1664525u + 1013904223u; u += (seed >> 8) / 16777216.0f; } x = f2h(u - 6.0f, I.bf16); }
        };
        fill(hq); fill(hk); fill(hv);
        void *q, *k, *v, *o; float *lse, *ro, *rl;
        CK(cudaMalloc(&q, nq * 2)); CK(cudaMalloc(&k, nk * 2)); CK(cudaMalloc(&v, nk * 2)); CK(cudaMalloc(&o, nq * 2));
        CK(cudaMalloc(&lse, (size_t)I.nb * I.sq * 4));
        int nh = std::min(I.nb, I.nb * (size_t)I.sq * I.sk > (1u << 26) ? 2 : I.nb);
        CK(cudaMalloc(&ro, (size_t)nh * I.sq * I.d * 4)); CK(cudaMalloc(&rl, (size_t)nh * I.sq * 4));
        CK(cudaMemcpy(q, hq.data(), nq * 2, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(k, hk.data(), nk * 2, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(v, hv.data(), nk * 2, cudaMemcpyHostToDevice));
        naive<<<dim3((I.sq + 127) / 128, nh), 128>>>((unsigned short*)q, (unsigned short*)k, (unsigned short*)v, ro, rl, I.d, I.sq, I.sk, I.causal, I.scale, I.bf16);
        CK(cudaGetLastError()); CK(cudaDeviceSynchronize());
        CK(cudaMemset(o, 0xff, nq * 2)); CK(cudaMemset(lse, 0xff, (size_t)I.nb * I.sq * 4));
        if (c.launch(q, k, v, o, lse)) { printf("%s: cannot set shared memory\n", I.id); exit(1); }
        CK(cudaGetLastError()); CK(cudaDeviceSynchronize());
        std::vector<unsigned short> got(nq); std::vector<float> r((size_t)nh * I.sq * I.d), rls((size_t)nh * I.sq), gl((size_t)I.nb * I.sq);
        CK(cudaMemcpy(got.data(), o, nq * 2, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(r.data(), ro, r.size() * 4, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(rls.data(), rl, rls.size() * 4, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(gl.data(), lse, gl.size() * 4, cudaMemcpyDeviceToHost));
        size_t nan = 0; for (auto b : got) { float f = h2f(b, I.bf16); if (f != f) ++nan; }
        double num = 0, den = 0, maxerr = 0;
        for (size_t e = 0; e < r.size(); ++e) { double g = h2f(got[e], I.bf16), w = r[e]; num += (g - w) * (g - w); den += w * w; maxerr = std::max(maxerr, std::fabs(g - w)); if (g != g) maxerr = INFINITY; }
        double rel = std::sqrt(num / den), lerr = 0;
        if (I.lse) for (size_t e = 0; e < rls.size(); ++e) { double d = std::fabs((double)gl[e] - rls[e]); if (!(d == d)) d = INFINITY; lerr = std::max(lerr, d); }
        bool ok = nan == 0 && rel < 1e-2 && (!I.lse || lerr < 1e-2);
        if (!ok) ++fails;
        for (int w = 0; w < 10; ++w) c.launch(q, k, v, o, lse);
        std::vector<float> ts;
        for (int it = 0; it < 50; ++it) { CK(cudaEventRecord(ea)); c.launch(q, k, v, o, lse); CK(cudaEventRecord(eb)); CK(cudaEventSynchronize(eb)); float ms; CK(cudaEventElapsedTime(&ms, ea, eb)); ts.push_back(ms); }
        CK(cudaGetLastError());
        std::sort(ts.begin(), ts.end());
        double pairs = 0;  // (query, key) pairs computed by the math
        for (int i = 0; i < I.sq; ++i) pairs += I.causal ? std::min(i + 1, I.sk) : I.sk;
        double flops = 4.0 * I.nb * pairs * I.d;
        printf("%-7s %-28s D=%-3d Sq=%-5d Sk=%-5d nb=%-3d causal=%d lse=%d | median %.4f ms (min %.4f) %6.1f TFLOP/s | rel l2 %.2e max err %.2e lse err %.2e (heads checked %d) NaN %zu | %s\n",
               I.id, I.shape, I.d, I.sq, I.sk, I.nb, I.causal, I.lse, ts[25], ts[0], flops / ts[25] / 1e9, rel, maxerr, lerr, nh, nan, ok ? "OK" : "FAIL");
        fflush(stdout);
        cudaFree(q); cudaFree(k); cudaFree(v); cudaFree(o); cudaFree(lse); cudaFree(ro); cudaFree(rl);
    }
    printf("failures: %d\n", fails);
    return fails ? 1 : 0;
}
