# Builds the variant driver with nvcc (on the device machine).
set -e
K=kernels
A="-Xptxas -v -O3 -std=c++17 -arch=sm_90 -I$K -I. -x cu"
nvcc $A -c variant.cu -o v0.o -DEQ_KERNEL=att_v0 -DLAUNCH=launch_v0 -DEQ_CAUSAL=0 &
nvcc $A -c variant.cu -o v1.o -DEQ_KERNEL=att_v1 -DLAUNCH=launch_v1 -DEQ_CAUSAL=0 -DEQ_BN=128 &
nvcc $A -c variant.cu -o v2.o -DEQ_KERNEL=att_v2 -DLAUNCH=launch_v2 -DEQ_CAUSAL=0 -DEQ_BM=128 -DEQ_NWARPS=8 &
nvcc $A -c variant.cu -o v3.o -DEQ_KERNEL=att_v3 -DLAUNCH=launch_v3 -DEQ_CAUSAL=0 -DEQ_BM=64 -DEQ_NWARPS=4 &
nvcc $A -c variant.cu -o v4.o -DEQ_KERNEL=att_v4 -DLAUNCH=launch_v4 -DEQ_CAUSAL=1 &
nvcc $A -c variant.cu -o v5.o -DEQ_KERNEL=att_v5 -DLAUNCH=launch_v5 -DEQ_CAUSAL=1 -DEQ_BN=128 &
nvcc -O3 -std=c++17 -arch=sm_90 -c driver.cu -o driver.o &
wait
nvcc -arch=sm_90 v0.o v1.o v2.o v3.o v4.o v5.o driver.o -o driver
