# Builds the driver with nvcc on the device machine (run from this folder; KDIR: the kernels/
# folder, default ../../kernels).
set -e
python3 gen_cfg.py
KDIR=${KDIR:-../../kernels}
A="-O3 -std=c++17 -I$KDIR -I. -Xptxas -v"
pids=""
for f in v_*.cu; do
  id=${f#v_}; id=${id%.cu}
  if grep -q "EQ_WGMMA 1" cfg_$id.h; then G="-gencode=arch=compute_90a,code=sm_90a"; else G="-gencode=arch=compute_90,code=sm_90"; fi
  nvcc $A $G -c $f -o $id.o > build_$id.log 2>&1 &
  pids="$pids $!"
done
nvcc -O3 -std=c++17 -I. -gencode=arch=compute_90,code=sm_90 -c driver.cu -o driver.o
for p in $pids; do wait $p; done
nvcc -gencode=arch=compute_90a,code=sm_90a *.o -o driver
grep -hE "registers|spill|C75" build_*.log | sort | uniq -c | head -40
