// rowreduce.cu: reductions along the last axis with a fused pointwise prologue and epilogue,
// one or more outputs (softmax, log-softmax, layernorm, rmsnorm, and their decomposed forms).
//
// Math: the iteration space is EQ_ROWS rows of EQ_COLS columns. The body is a chain of
// EQ_STAGES reduction stages followed by an epilogue:
//   stage s:  acc_k = combine_k over j < EQ_COLS of e_{s,k}(row, j, rv)   (sum, max or min)
//             rv   <- finish_s(acc)   (row values: means, rsqrt(var + eps), ...)
//   epilogue: out(row, j) = g(row, j, rv) for every column j; row outputs from rv.
// e and g may use row values of earlier stages (layernorm: stage 0 gives the mean, stage 1
// the mean of squared centred values, the epilogue normalises).
//
// Launch shape: EQ_ROW_THREADS threads (a power of two, 1..1024) cooperate on one row; a block
// of EQ_BLOCK threads holds EQ_BLOCK / EQ_ROW_THREADS rows and loops over row groups
// (grid-stride; the runtime may launch fewer blocks than row groups, one wave of resident
// blocks). When EQ_CACHED, as the epilogue consumes each cached chunk of a row it loads the same
// chunk of the thread's next row into the freed registers, so the next row's reads overlap this
// row's epilogue and writes. Thread `lane` of a row owns columns (c * EQ_ROW_THREADS + lane) * EQ_VEC + v
// for c < EQ_CHUNKS, v < EQ_VEC, so each chunk is one 16-byte access per thread, coalesced
// across the row's threads. When EQ_CACHED, the row's inputs stay in registers from the first
// pass to the epilogue (one read of device memory); otherwise each stage re-reads them.
// Pipelined form (EQ_PIPELINED, for cached rows so long that one block's rows take the
// registers of a whole SM, e.g. cross-entropy over 32000 columns): the block loops over its
// rows (launched as one wave of resident blocks), and while it reduces and writes row r from
// registers, row r + stride streams into shared memory (`cp.async`, no registers held, one
// 16-byte slot per thread, chunk and cached access: EQ_STAGE_BYTES of dynamic shared memory);
// the epilogue moves each chunk of the next row from shared memory into the registers it
// frees and starts copying the same chunk of the row after that. Each thread reads back only
// what it copied itself, so no barrier guards the staging buffer.
// Rows kept in shared memory (EQ_SMEM_CACHE, for rows too long for registers whose cached
// inputs fit a block's shared memory in their storage types, e.g. a bf16 vocabulary of 50257 in
// 100528 bytes): the first stage's pass copies each of the thread's vectors of the row, as
// loaded, into the row's EQ_SMEM_ROW_BYTES of dynamic shared memory (EQ_KEEP_DEPTH chunks'
// loads in flight at a time; a shifted row's partial first and last vectors copied alone, with
// zeros outside the row), and every later stage and the epilogue read the copy, so the row is
// read from device memory once. Each thread reads back only the vectors it copied, so no
// barrier guards the copy. EQ_MIN_BLOCKS blocks an SM bound the registers (two blocks of 512
// threads where two rows fit an SM).
// Pipelined rows in shared memory (EQ_SMEM_PIPELINED, with EQ_SMEM_CACHE, for many rows of
// which two fit a block's shared memory, e.g. a bf16 vocabulary of 50257 over 4096 rows): each
// row slot has two buffers of EQ_SMEM_ROW_BYTES, and the block (launched as one wave of
// resident blocks) loops over its rows: it starts copying row r + stride into the other buffer
// (`cp.async`, every vector of the row in flight at once, no registers held; a shifted row's
// last vector copied only up to the row's end, zeros after it, its first vector whole from
// before the row, columns every lane function skips) and then waits for row r's copy, started
// a row earlier, and makes every pass and the epilogue over it from shared memory. The SM's
// reads of the next row so overlap this row's reductions and writes, where without the pipeline
// they wait for them. Each thread reads back only the vectors it copied itself, and copies
// into a buffer only after its own last read of it, so no barrier guards the buffers.
// Cross-thread combining: warp shuffles, then shared memory across the row's warps.
// Kept values: a stage over a cached row may overwrite a cached value by a per-element value it
// computes (after its accumulation has read both) when nothing later needs the raw value, and
// the epilogue reads that instead of computing it again (softmax: the sum's stage keeps
// exp(x - max), so the epilogue only scales it). `eq_accum` therefore takes the cache mutably;
// over uncached rows it writes nothing of use (each pass fetches afresh).
// Online form: a stage may hold a max m and the sum of exp(e - m) of the same row as one pair
// (combined as m = max(m1, m2), s = s1 exp(m1 - m) + s2 exp(m2 - m)), so softmax needs one pass
// before its epilogue instead of two. Codegen uses it only for rows kept nowhere: over a row in
// registers or shared memory a second pass reads the chip, and the pair's rescaling costs more
// arithmetic than it saves (cross-entropy 8192x32000 on an H100: 975 us online, 779 us in two
// stages).
//
// Global values (cross-entropy's mean over rows): when EQ_NGLOBAL > 0, each row adds row
// values to EQ_NGLOBAL per-thread sums (`eq_global`); a block combines its rows in a fixed
// order into the workspace `eq_ws`, and the last block to finish (counted in `eq_count`)
// adds the blocks' partials in block order and stores the results (`eq_global_store`).
//
// Segmented rows (EQ_SEGS > 1, for few long rows whose outputs are row values of one stage: a
// tensor summed to one value is one row of 8388608): each row is cut into EQ_SEGS segments of
// EQ_CHUNKS * EQ_ROW_THREADS vectors, one block (one row's threads) a segment, so a few rows
// keep every SM streaming. A block reduces its segment, stores the partial accumulators in its
// slot of the workspace `eq_ws` ([row][segment][EQ_NACC]), fences, and counts itself in its
// row's `eq_count`; the last of the row's blocks to arrive combines the partials (thread t
// merges segments t, t + EQ_ROW_THREADS, ... in order, then the row combine), so the result
// does not depend on which block is last, and finishes the row and stores its row values. Units
// of (row, segment) are grid-strided, so a launch of fewer blocks runs them all.
//
// Rows over a cluster (EQ_CLUSTER > 1, sm_90: thread block clusters and distributed shared
// memory; for rows too long for one block's registers, such as a vocabulary of 50257 or
// 128256): each row is spread over the EQ_CLUSTER blocks of one cluster (`__cluster_dims__`, so
// an ordinary launch of a grid that EQ_CLUSTER divides forms the clusters), block `rank` of a
// cluster holding the row's vectors rank * EQ_CHUNKS * EQ_ROW_THREADS up to the next rank's in
// registers (EQ_CACHED, one row a block), so each element is read from and written to device
// memory once and an SM holds several blocks of different rows. After each stage's row combine
// within the block, its thread 0 stores the block's accumulators in its shared `eq_part` slot;
// after a cluster barrier (arrive.release, wait.acquire: the slots are visible) every thread
// of every block of the cluster reads the EQ_CLUSTER slots through distributed shared memory
// and merges them in rank order, so every block finishes the row with bit-identical values.
// The slots alternate between two sets from row to row: a block writes a set again only after
// it passed a later barrier, which every block reaches only after its reads of that set. The
// cluster loops over rows by clusters (a cluster's blocks take the same rows, so they all reach
// the same barriers; launched as one wave of resident clusters, each block fetches its segment
// of the cluster's next row as it writes one), and a last barrier keeps every block resident
// until no block reads its shared memory. Rank 0 alone stores row values and adds global sums.
// Raw cache (EQ_CACHE_RAW, rows of 16-bit values over a cluster): a thread keeps each vector as
// loaded (`EqKept`, a 16-byte vector of bf16 in 4 registers rather than 8 floats) and converts
// it at each use (`eq_unpack`), so a block holds twice the row, and twice the loads are in
// flight, in the same registers; nothing is kept in the cache (the epilogue computes what a
// stage computed again: softmax's exponentials).
//
// Shifted rows (EQ_SHIFT, for rows whose length EQ_VEC does not divide, such as a vocabulary of
// 50257): row r starts (r * EQ_COLS) % EQ_VEC elements (its lead) past an address aligned to
// EQ_VEC elements, so its vectors start there: thread `lane` owns the columns
// (c * EQ_ROW_THREADS + lane) * EQ_VEC - lead + v, every chunk is still one aligned 16-byte
// access, and only a row's first and last vectors hold columns outside it. The generated
// functions skip those lanes (`eq_in_row`: a column before 0 wraps, as eq_idx is unsigned, and
// fails the same bound as one past the end), read them as 0 and never write them (other rows
// live there). A row may span one vector more than EQ_COLS / EQ_VEC, so EQ_CHUNKS counts
// EQ_COLS + EQ_VEC - 1 columns. Where EQ_SPLIT_LANES (rows not kept in registers), the generated
// functions test lanes only in a vector that is not whole in the row (`eq_whole_in_row`), the
// others taking a copy of the lane loop without the tests.
//
// Invariants: EQ_VEC divides EQ_COLS unless EQ_SHIFT; every thread of a block reaches every __syncthreads
// (rows past EQ_ROWS compute nothing but still take part); combining is in a fixed order and
// every thread of a row gets lane 0's value, so results are deterministic and identical
// across a row's threads; each output element is written exactly once; `eq_count` is zero
// before and after every launch, and global sums and segmented rows do not depend on block
// scheduling.
#ifndef EQ_COMMON_CUH
#include "common.cuh"
#endif

#ifndef EQ_GENERATED
// Default instance: y = softmax(x, -1) over [64, 512] f32.
#define EQ_KERNEL rowreduce_f32
#define EQ_ROWS 64
#define EQ_COLS 512
#define EQ_ROW_THREADS 32
#define EQ_BLOCK 128
#define EQ_VEC 4
#define EQ_CHUNKS 4
#define EQ_NCACHE 1
#define EQ_CACHED 1
#define EQ_STAGES 2
#define EQ_NACC 1
#define EQ_NGLOBAL 0
#define EQ_PARAMS const float* __restrict__ p_x, float* __restrict__ p_y
#define EQ_ARGS p_x, p_y

struct EqRow { float m; float s; };

__device__ __forceinline__ void eq_fetch(EQ_PARAMS, eq_idx row, eq_idx col0, float (&cv)[EQ_NCACHE][EQ_VEC]) {
    eq_loadv<float, EQ_VEC>(p_x + row * EQ_COLS + col0, cv[0]);
}
__device__ __forceinline__ void eq_row_init(EQ_PARAMS, eq_idx row, EqRow& rv) {}
__device__ __forceinline__ void eq_acc_init(int s, float (&acc)[EQ_NACC]) { acc[0] = s == 0 ? -EQ_INF : 0.0f; }
__device__ __forceinline__ void eq_merge(int s, float (&a)[EQ_NACC], const float (&b)[EQ_NACC]) {
    a[0] = s == 0 ? eq_max(a[0], b[0]) : a[0] + b[0];
}
__device__ __forceinline__ void eq_accum(int s, EQ_PARAMS, eq_idx row, eq_idx col0, float (&cv)[EQ_NCACHE][EQ_VEC],
                                         const EqRow& rv, float (&acc)[EQ_NACC]) {
#pragma unroll
    for (int v = 0; v < EQ_VEC; ++v) {
        if (s == 0) {
            acc[0] = eq_max(acc[0], cv[0][v]);
        } else {
            cv[0][v] = expf(cv[0][v] - rv.m);  // kept for the epilogue
            acc[0] = acc[0] + cv[0][v];
        }
    }
}
__device__ __forceinline__ void eq_finish(int s, EQ_PARAMS, eq_idx row, const float (&acc)[EQ_NACC], EqRow& rv) {
    if (s == 0) rv.m = acc[0];
    else rv.s = acc[0];
}
__device__ __forceinline__ void eq_epilogue(EQ_PARAMS, eq_idx row, eq_idx col0, const float (&cv)[EQ_NCACHE][EQ_VEC],
                                            const EqRow& rv) {
    float y[EQ_VEC];
#pragma unroll
    for (int v = 0; v < EQ_VEC; ++v) y[v] = cv[0][v] * (1.0f / rv.s);
    eq_storev<float, EQ_VEC>(p_y + row * EQ_COLS + col0, y);
}
__device__ __forceinline__ void eq_row_store(EQ_PARAMS, eq_idx row, const EqRow& rv) {}
#endif

#ifndef EQ_PIPELINED
#define EQ_PIPELINED 0
#endif
#ifndef EQ_SHIFT
#define EQ_SHIFT 0
#endif
#ifndef EQ_SMEM_CACHE
#define EQ_SMEM_CACHE 0
#endif
#ifndef EQ_MIN_BLOCKS
#define EQ_MIN_BLOCKS 1
#endif
#ifndef EQ_SEGS
#define EQ_SEGS 1
#endif
#ifndef EQ_SEG_DEPTH
#define EQ_SEG_DEPTH 4
#endif
#if EQ_SEGS > 1 && (EQ_CACHED || EQ_PIPELINED || EQ_SMEM_CACHE || EQ_NGLOBAL > 0 || EQ_STAGES != 1 || EQ_BLOCK != EQ_ROW_THREADS)
#error "segmented rows are fetched, reduced in one stage, one row a block, without global results"
#endif
#ifndef EQ_SMEM_PIPELINED
#define EQ_SMEM_PIPELINED 0
#endif
#ifndef EQ_CLUSTER
#define EQ_CLUSTER 1
#endif
#ifndef EQ_CACHE_RAW
#define EQ_CACHE_RAW 0
#endif
#if EQ_CACHE_RAW && (!EQ_CACHED || EQ_PIPELINED)
#error "a raw cache is a row kept in registers, not staged"
#endif
#if EQ_CLUSTER > 1 && (!EQ_CACHED || EQ_PIPELINED || EQ_SMEM_CACHE || EQ_SEGS > 1 || EQ_BLOCK != EQ_ROW_THREADS || EQ_STAGES < 1)
#error "rows over a cluster are kept in registers, one row a block, with at least one stage"
#endif
#if EQ_SHIFT && EQ_PIPELINED
#error "shifted rows are not staged through shared memory"
#endif
#if EQ_SMEM_CACHE && EQ_CACHED
#error "a row is kept in registers or in shared memory, not both"
#endif
#if EQ_SMEM_PIPELINED && !EQ_SMEM_CACHE
#error "only rows kept in shared memory are pipelined through it"
#endif
#if EQ_MIN_BLOCKS > 1
#define EQ_BOUNDS __launch_bounds__(EQ_BLOCK, EQ_MIN_BLOCKS)
#else
#define EQ_BOUNDS __launch_bounds__(EQ_BLOCK)
#endif
#define EQ_ROWS_PER_BLOCK (EQ_BLOCK / EQ_ROW_THREADS)
#define EQ_WARPS_PER_ROW (EQ_ROW_THREADS > 32 ? EQ_ROW_THREADS / 32 : 1)

// Combines one stage's accumulators across the threads of a row; every thread gets the result.
__device__ __forceinline__ void eq_row_combine(int s, float (&acc)[EQ_NACC],
                                               float (*red)[EQ_WARPS_PER_ROW][EQ_NACC], int slot, int lane) {
    constexpr int width = EQ_ROW_THREADS < 32 ? EQ_ROW_THREADS : 32;
    const int wlane = threadIdx.x & 31;
#pragma unroll
    for (int off = width / 2; off > 0; off /= 2) {
        float other[EQ_NACC];
#pragma unroll
        for (int k = 0; k < EQ_NACC; ++k) other[k] = __shfl_xor_sync(0xffffffffu, acc[k], off);
        eq_merge(s, acc, other);
    }
    // Butterflies leave each lane a differently rounded total: use the first lane's.
#pragma unroll
    for (int k = 0; k < EQ_NACC; ++k) acc[k] = __shfl_sync(0xffffffffu, acc[k], wlane & ~(width - 1));
    if (EQ_WARPS_PER_ROW > 1) {
        const int warp = lane / 32;
        if (wlane == 0) {
#pragma unroll
            for (int k = 0; k < EQ_NACC; ++k) red[slot][warp][k] = acc[k];
        }
        __syncthreads();
#pragma unroll
        for (int k = 0; k < EQ_NACC; ++k) acc[k] = red[slot][0][k];
#pragma unroll
        for (int w = 1; w < EQ_WARPS_PER_ROW; ++w) eq_merge(s, acc, red[slot][w]);
        __syncthreads();
    }
}

#if EQ_PIPELINED
// The staging slot of (row slot, chunk, lane): EQ_NCACHE slots of 16 bytes, one per cached
// access, each 16 * EQ_ROW_THREADS bytes apart so that a warp's accesses are contiguous.
extern __shared__ __align__(16) unsigned char eq_staging[];
__device__ __forceinline__ unsigned char* eq_stage_slot(int slot, int c, int lane) {
    return eq_staging + ((size_t)(slot * EQ_CHUNKS + c) * EQ_NCACHE * EQ_ROW_THREADS + lane) * 16;
}
#endif

#if EQ_SMEM_CACHE
// A block's rows kept in shared memory: row slot `slot` at EQ_SMEM_ROW_BYTES * slot (pipelined:
// its two buffers at EQ_SMEM_ROW_BYTES * (2 * slot + b)), each cached input's vectors in its
// storage type, vector vi of a row at element vi * EQ_VEC of its slab.
extern __shared__ __align__(16) unsigned char eq_kept_rows[];
#endif

#if EQ_NGLOBAL > 0
// Adds the block's per-row global sums (held by each row's lane 0) in slot order, then the
// blocks' partials in block order in the last block to finish.
__device__ __forceinline__ void eq_global_finish(EQ_PARAMS, float (&g)[EQ_NGLOBAL], int slot, int lane) {
    __shared__ float gred[EQ_ROWS_PER_BLOCK][EQ_NGLOBAL];
    __shared__ bool last_block;
    if (lane == 0) {
#pragma unroll
        for (int j = 0; j < EQ_NGLOBAL; ++j) gred[slot][j] = g[j];
    }
    __syncthreads();
    if (threadIdx.x == 0) {
#pragma unroll
        for (int j = 0; j < EQ_NGLOBAL; ++j) {
            float t = gred[0][j];
            for (int r = 1; r < EQ_ROWS_PER_BLOCK; ++r) t += gred[r][j];
            eq_ws[blockIdx.x * EQ_NGLOBAL + j] = t;
        }
        __threadfence();
        last_block = atomicAdd(eq_count, 1u) == gridDim.x - 1;
    }
    __syncthreads();
    if (!last_block) return;
    __threadfence();
    // Every thread of the last block adds the partials of blocks threadIdx.x, + blockDim.x, ...
    // in order, a warp's lanes by a fixed butterfly, the warps' sums in warp order: the same
    // order whichever block is last, and the partials read in parallel (thread 0 alone reading
    // a partial a block serialised a kernel of many blocks on L2 latency).
    __shared__ float gwarp[EQ_NGLOBAL][32];
    const unsigned int warps = (blockDim.x + 31) / 32;
#pragma unroll
    for (int j = 0; j < EQ_NGLOBAL; ++j) {
        float t = 0.0f;
        for (unsigned int b = threadIdx.x; b < gridDim.x; b += blockDim.x) t += eq_ld_cg(eq_ws + b * EQ_NGLOBAL + j);
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) t += __shfl_xor_sync(0xffffffffu, t, off);
        if ((threadIdx.x & 31) == 0) gwarp[j][threadIdx.x / 32] = t;
    }
    __syncthreads();
    if (threadIdx.x != 0) return;
#pragma unroll
    for (int j = 0; j < EQ_NGLOBAL; ++j) {
        float t = gwarp[j][0];
        for (unsigned int w = 1; w < warps; ++w) t += gwarp[j][w];
        g[j] = t;
    }
    eq_global_store(EQ_ARGS, g);
    *eq_count = 0;
}
#endif

// Columns before a row's first vector (EQ_SHIFT; 0 otherwise).
__device__ __forceinline__ eq_idx eq_lead(eq_idx row) {
#if EQ_SHIFT
    return (row * (eq_idx)EQ_COLS) % EQ_VEC;
#else
    return 0;
#endif
}

// The first column (before the lead is taken off) of chunk c of `lane`'s vectors; a chunk holds
// columns of a row of lead `lead` while this is below EQ_COLS + lead.
__device__ __forceinline__ eq_idx eq_vcol(int c, int lane) { return ((eq_idx)c * EQ_ROW_THREADS + lane) * EQ_VEC; }

// Whether the vector at `vc` (as eq_vcol) of a row of lead `lead` holds only columns of the row.
__device__ __forceinline__ bool eq_whole(eq_idx vc, eq_idx lead) {
    return vc >= lead && vc + EQ_VEC <= (eq_idx)EQ_COLS + lead;
}

#if EQ_SMEM_PIPELINED
// Starts copying `lane`'s vectors of row `row` into the row buffer `keep` (one cp.async each and
// cached input; the caller commits the group): a shifted row's last vector up to the row's end.
__device__ __forceinline__ void eq_keep_row_async(EQ_PARAMS, eq_idx row, unsigned char* keep, int lane) {
    const eq_idx lead = eq_lead(row);
#pragma unroll
    for (int c = 0; c < EQ_CHUNKS; ++c) {
        const eq_idx vc = eq_vcol(c, lane);
        if (vc < (eq_idx)EQ_COLS + lead) {
            const eq_idx left = (eq_idx)EQ_COLS + lead - vc;
            eq_keep_async(EQ_ARGS, row, vc - lead, keep, c * EQ_ROW_THREADS + lane, left < EQ_VEC ? (int)left : EQ_VEC);
        }
    }
}

// Row buffer `b` of row slot `slot`.
__device__ __forceinline__ unsigned char* eq_row_buffer(int slot, int b) {
    return eq_kept_rows + (size_t)(2 * slot + b) * EQ_SMEM_ROW_BYTES;
}
#endif

#if EQ_CLUSTER > 1
#define EQ_CLUSTER_DIMS __cluster_dims__(EQ_CLUSTER, 1, 1)
// The cluster barrier of every thread of every block of the cluster: writes to shared memory
// before it (release) are visible to reads through distributed shared memory after it (acquire).
__device__ __forceinline__ void eq_cluster_sync() {
    asm volatile("barrier.cluster.arrive;\n\tbarrier.cluster.wait;" ::: "memory");
}
// The float at `p` in the shared memory of the cluster's block `rank`.
__device__ __forceinline__ float eq_ld_cluster(const float* p, unsigned int rank) {
    unsigned int s, r;
    float x;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(s) : "l"(p));
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(s), "r"(rank));
    asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(x) : "r"(r) : "memory");
    return x;
}
// Merges stage s's accumulators of the cluster's blocks (each block's `acc` is its row combine)
// into every thread's `acc`, in rank order; `part` is this block's slot set of the row.
__device__ __forceinline__ void eq_cluster_combine(int s, float (&acc)[EQ_NACC], float (*part)[EQ_NACC]) {
    if (threadIdx.x == 0) {
#pragma unroll
        for (int k = 0; k < EQ_NACC; ++k) part[s][k] = acc[k];
    }
    eq_cluster_sync();
#pragma unroll
    for (int k = 0; k < EQ_NACC; ++k) acc[k] = eq_ld_cluster(&part[s][k], 0);
#pragma unroll
    for (unsigned int r = 1; r < EQ_CLUSTER; ++r) {
        float other[EQ_NACC];
#pragma unroll
        for (int k = 0; k < EQ_NACC; ++k) other[k] = eq_ld_cluster(&part[s][k], r);
        eq_merge(s, acc, other);
    }
}
#else
#define EQ_CLUSTER_DIMS
#endif

#if EQ_SEGS > 1
extern "C" __global__ void EQ_BOUNDS EQ_KERNEL(EQ_PARAMS) {
    __shared__ float red[1][EQ_WARPS_PER_ROW][EQ_NACC];
    __shared__ bool last_seg;
    const int lane = threadIdx.x;
    for (eq_idx unit = blockIdx.x; unit < (eq_idx)EQ_ROWS * EQ_SEGS; unit += gridDim.x) {
        const eq_idx row = unit / EQ_SEGS;
        const eq_idx seg = unit % EQ_SEGS;
        const eq_idx lead = eq_lead(row);
        EqRow rv;
        eq_row_init(EQ_ARGS, row, rv);
        float acc[EQ_NACC];
        eq_acc_init(0, acc);
        // The segment's vectors: EQ_SEG_DEPTH chunks loaded together (all in flight before
        // the first is accumulated), then accumulated in chunk order.
        const eq_idx vc0 = (eq_idx)seg * EQ_CHUNKS * EQ_ROW_THREADS * EQ_VEC;
#pragma unroll 1
        for (int c0 = 0; c0 < EQ_CHUNKS; c0 += EQ_SEG_DEPTH) {
            float cv[EQ_SEG_DEPTH][EQ_NCACHE][EQ_VEC];
#pragma unroll
            for (int u = 0; u < EQ_SEG_DEPTH; ++u) {
                const eq_idx vc = vc0 + eq_vcol(c0 + u, lane);
                if (c0 + u < EQ_CHUNKS && vc < (eq_idx)EQ_COLS + lead) eq_fetch(EQ_ARGS, row, vc - lead, cv[u]);
            }
#pragma unroll
            for (int u = 0; u < EQ_SEG_DEPTH; ++u) {
                const eq_idx vc = vc0 + eq_vcol(c0 + u, lane);
                if (c0 + u < EQ_CHUNKS && vc < (eq_idx)EQ_COLS + lead) eq_accum(0, EQ_ARGS, row, vc - lead, cv[u], rv, acc);
            }
        }
        eq_row_combine(0, acc, red, 0, lane);
        if (lane == 0) {
#pragma unroll
            for (int k = 0; k < EQ_NACC; ++k) __stcg(eq_ws + unit * EQ_NACC + k, acc[k]);
            __threadfence();
            last_seg = atomicAdd(eq_count + row, 1u) == EQ_SEGS - 1;
        }
        __syncthreads();
        if (last_seg) {
            __threadfence();
            eq_acc_init(0, acc);
            for (eq_idx s = lane; s < EQ_SEGS; s += EQ_ROW_THREADS) {
                float part[EQ_NACC];
#pragma unroll
                for (int k = 0; k < EQ_NACC; ++k) part[k] = eq_ld_cg(eq_ws + (row * EQ_SEGS + s) * EQ_NACC + k);
                eq_merge(0, acc, part);
            }
            eq_row_combine(0, acc, red, 0, lane);
            eq_finish(0, EQ_ARGS, row, acc, rv);
            if (lane == 0) {
                eq_row_store(EQ_ARGS, row, rv);
                eq_count[row] = 0;
            }
        }
        // Every thread has read `last_seg` before lane 0 sets it for the next unit.
        __syncthreads();
    }
}
#else
extern "C" __global__ void EQ_BOUNDS EQ_CLUSTER_DIMS EQ_KERNEL(EQ_PARAMS) {
    __shared__ float red[EQ_ROWS_PER_BLOCK][EQ_WARPS_PER_ROW][EQ_NACC];
    const int slot = threadIdx.x / EQ_ROW_THREADS;
    const int lane = threadIdx.x % EQ_ROW_THREADS;
#if EQ_CLUSTER > 1
    // A cluster is EQ_CLUSTER consecutive blocks (a grid and cluster of one dimension); its
    // rows are those of the cluster's index, strided by the clusters, and this block's vectors
    // of each row start at `vbase` (a multiple of EQ_VEC, so its vectors stay aligned).
    __shared__ float eq_part[2][EQ_STAGES][EQ_NACC];
    const unsigned int rank = blockIdx.x % EQ_CLUSTER;
    const eq_idx vbase = (eq_idx)rank * EQ_CHUNKS * EQ_ROW_THREADS * EQ_VEC;
#define EQ_VBASE vbase
    const eq_idx group = blockIdx.x / EQ_CLUSTER;
    const eq_idx stride = (eq_idx)(gridDim.x / EQ_CLUSTER);
    int parity = 0;
#else
#define EQ_VBASE ((eq_idx)0)
    const eq_idx group = blockIdx.x;
    const eq_idx stride = (eq_idx)gridDim.x * EQ_ROWS_PER_BLOCK;
#endif
#if EQ_NGLOBAL > 0
    float g[EQ_NGLOBAL];
#pragma unroll
    for (int j = 0; j < EQ_NGLOBAL; ++j) g[j] = 0.0f;
#endif
#if EQ_CACHED
#if EQ_CACHE_RAW
    EqKept cache[EQ_CHUNKS];
// Fetches vector c of a row into the cache; the cached vector c as values `cv`.
#define EQ_CACHE_FETCH(row, col0, c) eq_keep_fetch(EQ_ARGS, row, col0, cache[c])
#define EQ_CACHE_VALUES(c)       \
    float cv[EQ_NCACHE][EQ_VEC]; \
    eq_unpack(cache[c], cv)
#else
    float cache[EQ_CHUNKS][EQ_NCACHE][EQ_VEC];
#define EQ_CACHE_FETCH(row, col0, c) eq_fetch(EQ_ARGS, row, col0, cache[c])
#define EQ_CACHE_VALUES(c) float(&cv)[EQ_NCACHE][EQ_VEC] = cache[c]
#endif
    {
        const eq_idx first = group * EQ_ROWS_PER_BLOCK + slot;
        const eq_idx lead = eq_lead(first);
#pragma unroll
        for (int c = 0; c < EQ_CHUNKS; ++c) {
            const eq_idx vc = EQ_VBASE + eq_vcol(c, lane);
            if (first < (eq_idx)EQ_ROWS && vc < (eq_idx)EQ_COLS + lead) EQ_CACHE_FETCH(first, vc - lead, c);
        }
#if EQ_PIPELINED
#pragma unroll
        for (int c = 0; c < EQ_CHUNKS; ++c) {
            const eq_idx col0 = ((eq_idx)c * EQ_ROW_THREADS + lane) * EQ_VEC;
            if (first + stride < (eq_idx)EQ_ROWS && col0 < (eq_idx)EQ_COLS)
                eq_stage(EQ_ARGS, first + stride, col0, eq_stage_slot(slot, c, lane));
        }
        eq_cp_async_commit();
#endif
    }
#endif
#if EQ_SMEM_PIPELINED
    // The first row's copy; each turn of the loop starts the next one's.
    int buf = 0;
    {
        const eq_idx first = group * EQ_ROWS_PER_BLOCK + slot;
        if (first < (eq_idx)EQ_ROWS) eq_keep_row_async(EQ_ARGS, first, eq_row_buffer(slot, 0), lane);
        eq_cp_async_commit();
    }
#endif
    for (eq_idx base = group * EQ_ROWS_PER_BLOCK; base < (eq_idx)EQ_ROWS; base += stride) {
        const eq_idx row = base + slot;
        const bool active = row < (eq_idx)EQ_ROWS;
        const eq_idx lead = eq_lead(row);
        EqRow rv;
        if (active) eq_row_init(EQ_ARGS, row, rv);
#if EQ_SMEM_PIPELINED
        // Start the next row's copy into the other buffer (this thread's last reads of it were
        // the previous row's), then wait for this row's, leaving the next one in flight.
        unsigned char* keep = eq_row_buffer(slot, buf);
        if (row + stride < (eq_idx)EQ_ROWS) eq_keep_row_async(EQ_ARGS, row + stride, eq_row_buffer(slot, buf ^ 1), lane);
        eq_cp_async_commit();
        eq_cp_async_wait<1>();
        buf ^= 1;
#elif EQ_SMEM_CACHE
        unsigned char* keep = eq_kept_rows + (size_t)slot * EQ_SMEM_ROW_BYTES;
#endif
#pragma unroll
        for (int s = 0; s < EQ_STAGES; ++s) {
            float acc[EQ_NACC];
            eq_acc_init(s, acc);
#if EQ_SMEM_CACHE
            // (A pipelined row is in shared memory before its first pass.)
            if (s == 0 && !EQ_SMEM_PIPELINED) {
#if EQ_SHIFT
                // A shifted row's first and last vectors hold columns outside it: copied alone,
                // by the threads that own them.
                if (active) {
                    const int last = (int)((EQ_COLS + lead - 1) / EQ_VEC);
                    if (lead > 0 && lane == 0) eq_keep_edge(EQ_ARGS, row, (eq_idx)0 - lead, keep, 0);
                    if (lane == last % EQ_ROW_THREADS && !eq_whole(eq_vcol(last / EQ_ROW_THREADS, lane), lead))
                        eq_keep_edge(EQ_ARGS, row, (eq_idx)last * EQ_VEC - lead, keep, last);
                }
#endif
                // The one pass over device memory: the whole vectors of EQ_KEEP_DEPTH chunks
                // loaded together (all in flight before the first is stored), copied into shared
                // memory as loaded, then accumulated from there.
#pragma unroll 1
                for (int c0 = 0; c0 < EQ_CHUNKS; c0 += EQ_KEEP_DEPTH) {
                    EqKept r[EQ_KEEP_DEPTH];
#pragma unroll
                    for (int u = 0; u < EQ_KEEP_DEPTH; ++u) {
                        const eq_idx vc = eq_vcol(c0 + u, lane);
                        if (active && c0 + u < EQ_CHUNKS && eq_whole(vc, lead)) eq_keep_load(EQ_ARGS, row, vc - lead, r[u]);
                    }
#pragma unroll
                    for (int u = 0; u < EQ_KEEP_DEPTH; ++u) {
                        const eq_idx vc = eq_vcol(c0 + u, lane);
                        if (active && c0 + u < EQ_CHUNKS && eq_whole(vc, lead))
                            eq_keep_store(keep, (c0 + u) * EQ_ROW_THREADS + lane, r[u]);
                    }
#pragma unroll
                    for (int u = 0; u < EQ_KEEP_DEPTH; ++u) {
                        const int c = c0 + u;
                        const eq_idx vc = eq_vcol(c, lane);
                        if (active && c < EQ_CHUNKS && vc < (eq_idx)EQ_COLS + lead) {
                            float cv[EQ_NCACHE][EQ_VEC];
                            eq_unkeep(keep, c * EQ_ROW_THREADS + lane, cv);
                            eq_accum(s, EQ_ARGS, row, vc - lead, cv, rv, acc);
                        }
                    }
                }
            } else {
                // Each thread reads back the vectors it kept itself: no barrier.
#pragma unroll 4
                for (int c = 0; c < EQ_CHUNKS; ++c) {
                    const eq_idx vc = eq_vcol(c, lane);
                    if (active && vc < (eq_idx)EQ_COLS + lead) {
                        float cv[EQ_NCACHE][EQ_VEC];
                        eq_unkeep(keep, c * EQ_ROW_THREADS + lane, cv);
                        eq_accum(s, EQ_ARGS, row, vc - lead, cv, rv, acc);
                    }
                }
            }
#else
            // A shifted row not kept in registers streams 4 chunks at a time: unrolled over all
            // of them, ptxas hoists every chunk's loads and spills (cross-entropy with its
            // gradient over f32 rows of 50257: 13 chunks, 16 bytes of spill stores).
#if EQ_CACHED || !EQ_SHIFT
#pragma unroll
#else
#pragma unroll 4
#endif
            for (int c = 0; c < EQ_CHUNKS; ++c) {
                const eq_idx vc = EQ_VBASE + eq_vcol(c, lane);
                const eq_idx col0 = vc - lead;
                if (active && vc < (eq_idx)EQ_COLS + lead) {
#if EQ_CACHED
                    EQ_CACHE_VALUES(c);
                    eq_accum(s, EQ_ARGS, row, col0, cv, rv, acc);
#else
                    float cv[EQ_NCACHE][EQ_VEC];
                    eq_fetch(EQ_ARGS, row, col0, cv);
                    eq_accum(s, EQ_ARGS, row, col0, cv, rv, acc);
#endif
                }
            }
#endif
            eq_row_combine(s, acc, red, slot, lane);
#if EQ_CLUSTER > 1
            eq_cluster_combine(s, acc, eq_part[parity]);
#endif
            if (active) eq_finish(s, EQ_ARGS, row, acc, rv);
        }
#if EQ_CLUSTER > 1
        parity ^= 1;
#endif
        if (!active) continue;
#if EQ_PIPELINED
        eq_cp_async_wait_all();
#endif
#if EQ_CACHED && EQ_SHIFT
        const eq_idx next_lead = eq_lead(row + stride);
#endif
#if EQ_SMEM_CACHE
#pragma unroll 4
        for (int c = 0; c < EQ_CHUNKS; ++c) {
            const eq_idx vc = eq_vcol(c, lane);
            if (vc < (eq_idx)EQ_COLS + lead) {
                float cv[EQ_NCACHE][EQ_VEC];
                eq_unkeep(keep, c * EQ_ROW_THREADS + lane, cv);
                eq_epilogue(EQ_ARGS, row, vc - lead, cv, rv);
            }
        }
#else
#if EQ_CACHED || !EQ_SHIFT
#pragma unroll
#else
#pragma unroll 4
#endif
        for (int c = 0; c < EQ_CHUNKS; ++c) {
            const eq_idx vc = EQ_VBASE + eq_vcol(c, lane);
            const eq_idx col0 = vc - lead;
            if (vc < (eq_idx)EQ_COLS + lead) {
#if EQ_CACHED
                {
                    EQ_CACHE_VALUES(c);
                    eq_epilogue(EQ_ARGS, row, col0, cv, rv);
                }
#if EQ_SHIFT
            }
            // The next row's vector c may hold columns where this row's holds none.
            if (row + stride < (eq_idx)EQ_ROWS && vc < (eq_idx)EQ_COLS + next_lead) {
                EQ_CACHE_FETCH(row + stride, vc - next_lead, c);
#elif EQ_PIPELINED
                if (row + stride < (eq_idx)EQ_ROWS) eq_unstage(eq_stage_slot(slot, c, lane), cache[c]);
                if (row + 2 * stride < (eq_idx)EQ_ROWS)
                    eq_stage(EQ_ARGS, row + 2 * stride, col0, eq_stage_slot(slot, c, lane));
#else
                if (row + stride < (eq_idx)EQ_ROWS) EQ_CACHE_FETCH(row + stride, col0, c);
#endif
#else
                float cv[EQ_NCACHE][EQ_VEC];
                eq_fetch(EQ_ARGS, row, col0, cv);
                eq_epilogue(EQ_ARGS, row, col0, cv, rv);
#endif
            }
        }
#endif
#if EQ_PIPELINED
        eq_cp_async_commit();
#endif
#if EQ_CLUSTER > 1
        if (lane == 0 && rank == 0) {
#else
        if (lane == 0) {
#endif
            eq_row_store(EQ_ARGS, row, rv);
#if EQ_NGLOBAL > 0
            eq_global(rv, g);
#endif
        }
    }
#if EQ_CLUSTER > 1
    // No block leaves while another may still read its slots.
    eq_cluster_sync();
#endif
#if EQ_NGLOBAL > 0
    eq_global_finish(EQ_ARGS, g, slot, lane);
#endif
}
#endif
