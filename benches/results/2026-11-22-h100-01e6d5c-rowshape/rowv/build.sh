#!/usr/bin/env bash
set -e; cd "$(dirname "$0")"
objs=""
for f in delta_*.cu sm_*.cu; do nvcc -O3 -arch=sm_90 -c $f -o ${f%.cu}.o & objs="$objs ${f%.cu}.o"; done; wait
nvcc -O3 -arch=sm_90 driver.cu $objs -o rowv
