// One variant of kernels/attention.cu (default instance, bf16 8x16x2048x64), with a launcher.
#define EQ_GENERATED
#define EQ_T eq_bf16
#define EQ_BF16 1
#define EQ_D 64
#define EQ_SQ 2048
#define EQ_SK 2048
#define EQ_NB 128
#define EQ_NB1 1
#define EQ_NB2 128
#define EQ_LSE 0
#define EQ_SCALE 0.125f
#define EQ_SCALE_LOG2 0.18033688f
#define EQ_Q_S0 0LL
#define EQ_Q_S1 0LL
#define EQ_Q_S2 131072LL
#define EQ_Q_SR 64LL
#define EQ_K_S0 0LL
#define EQ_K_S1 0LL
#define EQ_K_S2 131072LL
#define EQ_K_SR 64LL
#define EQ_V_S0 0LL
#define EQ_V_S1 0LL
#define EQ_V_S2 131072LL
#define EQ_V_SR 64LL
#define EQ_O_S0 0LL
#define EQ_O_S1 0LL
#define EQ_O_S2 131072LL
#define EQ_O_SR 64LL
#define EQ_PARAMS const eq_bf16* __restrict__ p_q, const eq_bf16* __restrict__ p_k, const eq_bf16* __restrict__ p_v, eq_bf16* __restrict__ p_o
#define EQ_QP p_q
#define EQ_KP p_k
#define EQ_VP p_v
#define EQ_OP p_o
#include "common.cuh"
#include "attention.cu"
#define STR2(x) #x
#define STR(x) STR2(x)
#include <cstdio>
extern "C" void LAUNCH(const void* q, const void* k, const void* v, void* o, const char** name) {
    static bool init = false;
    if (!init) { cudaFuncSetAttribute(EQ_KERNEL, cudaFuncAttributeMaxDynamicSharedMemorySize, EQ_SMEM_BYTES); init = true; }
    dim3 grid((EQ_SQ + EQ_BM - 1) / EQ_BM, EQ_NB);
    EQ_KERNEL<<<grid, EQ_NWARPS * 32, EQ_SMEM_BYTES>>>((const eq_bf16*)q, (const eq_bf16*)k, (const eq_bf16*)v, (eq_bf16*)o);
    *name = "BM=" STR(EQ_BM) " BN=" STR(EQ_BN) " warps=" STR(EQ_NWARPS) " causal=" STR(EQ_CAUSAL);
}
