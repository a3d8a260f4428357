// Times generated row-kernel variants (each its own object: occ_/groups_/launch_ wrappers) on
// fixed buffers, L2 flushed (100 MB memset) before each launch, CUDA-event medians of 50.
#include <cstdio>
#include <vector>
#include <algorithm>
#include <cuda_runtime.h>
#define V(n) extern "C" int occ_##n(); extern "C" int groups_##n(); extern "C" void launch_##n(void**, int);
#define LIST(X) X(delta_2x4v8) X(delta_4x2v8) X(delta_8x1v8) X(delta_4x4v4) X(delta_8x2v4) X(sm_4x4v8) X(sm_16x1v8) X(sm_8x2v8)
LIST(V)
int main() {
    int sms; cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
    void *a, *b, *c, *flush;
    size_t big = 64ull << 20;
    cudaMalloc(&a, big); cudaMalloc(&b, big); cudaMalloc(&c, big); cudaMalloc(&flush, 100ull << 20);
    cudaMemset(a, 0x3c, big); cudaMemset(b, 0x3c, big);
    cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
    auto run = [&](const char* name, int (*occ)(), int (*groups)(), void (*launch)(void**, int), bool delta) {
        // delta: (dout, o, out); softmax: (b, t3, y)
        void* pa = a; void* pb = b; void* pc = c;
        void* args[3] = {&pa, &pb, &pc};
        for (int persistent = 1; persistent >= 0; --persistent) {
            int g = groups(); int o = occ();
            int grid = persistent ? std::min(g, std::max(o, 1) * sms) : g;
            std::vector<float> t;
            for (int r = 0; r < 60; ++r) {
                cudaMemsetAsync(flush, r, 100ull << 20);
                cudaEventRecord(e0); launch(args, grid); cudaEventRecord(e1); cudaEventSynchronize(e1);
                float ms; cudaEventElapsedTime(&ms, e0, e1); if (r >= 10) t.push_back(ms * 1000);
            }
            std::sort(t.begin(), t.end());
            cudaError_t err = cudaGetLastError();
            printf("%-14s %s grid %6d (occ %d/SM)  median %8.2f us  min %8.2f  %s\n", name, persistent ? "persistent" : "full      ", grid, o, t[t.size()/2], t[0], cudaGetErrorString(err));
        }
        (void)delta;
    };
#define R(n) run(#n, occ_##n, groups_##n, launch_##n, true);
    LIST(R)
    return 0;
}
