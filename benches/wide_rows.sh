#!/usr/bin/env bash
# wide_rows.sh: the row template's paths for rows too long for one block's registers, measured
# against each other in one call on one device: `eqfuse run --repeat 5` of each program (the
# fused plan, checked against the CPU reference, each kernel timed) under each variant. The
# paths are chosen by environment variables that exist for this comparison
# (`src/codegen/emit/rows.rs`, `src/runtime/gpu.rs`):
#   EQFUSE_ROW_CLUSTER=off|on          no rows over clusters | rows of 16-bit values over clusters too
#   EQFUSE_ROW_CLUSTER_RAW=off         16-bit rows over clusters cached as f32 values, not as loaded
#   EQFUSE_ROW_CLUSTER_SM_THREADS=768|512  cluster blocks of 256 threads at 80 or 128 registers
#   EQFUSE_CLUSTER_GRID=whole          clusters launched as the whole grid (a row a cluster), not a
#                                      wave of resident clusters looping over rows
#   EQFUSE_ROW_SMEM_PIPELINE=off       rows kept in shared memory not pipelined (two blocks an SM)
#   EQFUSE_ROW_SMEM_ONLINE=on          rows kept in shared memory take softmax's max and sum as
#                                      one online pass over shared memory
#   EQFUSE_ROW_SMEM=off                rows too long for registers fetched by each pass (online
#                                      max and sum, then the epilogue re-reads the row from L2)
#   EQFUSE_ROW_FETCH_THREADS=512|256   fetched rows in blocks of that many threads, 1024 an SM
#   EQFUSE_ROW_FAST_EXP=off            16-bit rows' exp as expf, not one ex2.approx
# Usage: benches/wide_rows.sh BINARY OUT_DIR VARIANTS PROGRAMS, VARIANTS and PROGRAMS
# comma-separated (variant names below; program names in benches/programs without `.eqf`).
# Prints each run's report and writes it to OUT_DIR/<variant>.<program>.txt.
set -euo pipefail
bin=$1
out=$2
IFS=, read -r -a variants <<<"$3"
IFS=, read -r -a programs <<<"$4"
mkdir -p "$out"
env_of() {
    case $1 in
    default) echo "" ;;
    one_block) echo "EQFUSE_ROW_CLUSTER=off" ;;
    one_block_unpipelined) echo "EQFUSE_ROW_CLUSTER=off EQFUSE_ROW_SMEM_PIPELINE=off" ;;
    values_whole) echo "EQFUSE_ROW_CLUSTER=on EQFUSE_ROW_CLUSTER_RAW=off EQFUSE_CLUSTER_GRID=whole" ;;
    values) echo "EQFUSE_ROW_CLUSTER=on EQFUSE_ROW_CLUSTER_RAW=off" ;;
    raw_whole) echo "EQFUSE_ROW_CLUSTER=on EQFUSE_CLUSTER_GRID=whole" ;;
    raw) echo "EQFUSE_ROW_CLUSTER=on" ;;
    raw768) echo "EQFUSE_ROW_CLUSTER=on EQFUSE_ROW_CLUSTER_SM_THREADS=768" ;;
    raw512) echo "EQFUSE_ROW_CLUSTER=on EQFUSE_ROW_CLUSTER_SM_THREADS=512" ;;
    whole) echo "EQFUSE_CLUSTER_GRID=whole" ;;
    slow_exp) echo "EQFUSE_ROW_FAST_EXP=off" ;;
    smem_online) echo "EQFUSE_ROW_SMEM_ONLINE=on" ;;
    fetched) echo "EQFUSE_ROW_SMEM=off" ;;
    fetched512) echo "EQFUSE_ROW_SMEM=off EQFUSE_ROW_FETCH_THREADS=512" ;;
    fetched256) echo "EQFUSE_ROW_SMEM=off EQFUSE_ROW_FETCH_THREADS=256" ;;
    *)
        echo "unknown variant $1" >&2
        exit 2
        ;;
    esac
}
for prog in "${programs[@]}"; do
    for v in "${variants[@]}"; do
        e=$(env_of "$v")
        echo "== $prog / $v: ${e:-(default)}"
        # shellcheck disable=SC2086
        env $e "$bin" run --repeat 5 --outputs "$out/outputs" "benches/programs/$prog.eqf" 2>&1 | tee "$out/$v.$prog.txt"
        rm -rf "$out/outputs"
    done
done
