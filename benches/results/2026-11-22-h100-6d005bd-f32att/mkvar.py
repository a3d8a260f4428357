#!/usr/bin/env python3
"""Builds timing variants of the f32 attention kernel as sm_90 cubins (NVRTC, here) and a manifest."""
import ctypes, json, os, re, sys
lib = ctypes.CDLL('/work/main/.nvrtc/libnvrtc.so.13')
OUTD = sys.argv[1]
os.makedirs(OUTD, exist_ok=True)
new_t = open('/work/wt-f32att/kernels/attention.cu').read()
old_t = open('/tmp/f32att/attention_old.cu').read()
PROBS = {  # name: (dir, nb, sq, sk, d, causal, scale)
    'small': ('new/small', 4, 128, 128, 64, 1, 0.125),
    'large': ('new/large', 128, 1024, 1024, 64, 0, 0.125),
    'large_causal': ('new/large_causal', 128, 1024, 1024, 64, 1, 0.125),
    'd128': ('new/d128', 16, 512, 512, 128, 0, 0.088),
}
VARS = {
    'old': None,
    'b32p8k8': dict(FBM=32, FP=8, FKP=8),
    'b32p4k8': dict(FBM=32, FP=4, FKP=8),
    'b64p4k8': dict(FBM=64, FP=4, FKP=8),
    'b32p8k4': dict(FBM=32, FP=8, FKP=4),
    'b64p2k8': dict(FBM=64, FP=2, FKP=8),
    'b32p8k8q0': dict(FBM=32, FP=8, FKP=8, FQREG=0),
    'b32p4k8q0': dict(FBM=32, FP=4, FKP=8, FQREG=0),
    'b64p4k8q0': dict(FBM=64, FP=4, FKP=8, FQREG=0),
    'b32p4k8m3': dict(FBM=32, FP=4, FKP=8, FMINB=3),
    'b32p4k4': dict(FBM=32, FP=4, FKP=4),
}
def smem(v, d):
    if v is None:
        return (64 * (d + 1) + 2 * 32 * d) * 4
    fbm, fp, fkp = v['FBM'], v['FP'], v['FKP']
    dp = (d + 3) // 4 * 4
    qreg = v.get('FQREG', 1 if dp <= 64 else 0)
    fbn = fp * fkp
    loop = 4 * fbn * dp + (0 if qreg else fbm * (dp + 4))
    merge = fp * fbm * (dp + 1) + 2 * fbm * fp + fbm
    return max(loop, merge) * 4
def compile_(src, name):
    prog = ctypes.c_void_p()
    assert lib.nvrtcCreateProgram(ctypes.byref(prog), src.encode(), b"k.cu", 0, None, None) == 0
    opts = [b"--gpu-architecture=sm_90", b"-Xptxas=-v"]
    arr = (ctypes.c_char_p * len(opts))(*opts)
    r = lib.nvrtcCompileProgram(prog, len(opts), arr)
    n = ctypes.c_size_t(); lib.nvrtcGetProgramLogSize(prog, ctypes.byref(n)); log = ctypes.create_string_buffer(n.value); lib.nvrtcGetProgramLog(prog, log)
    log = log.value.decode()
    if r != 0:
        print(log); raise SystemExit(f'compile failed: {name}')
    lib.nvrtcGetCUBINSize(prog, ctypes.byref(n)); buf = ctypes.create_string_buffer(n.value); lib.nvrtcGetCUBIN(prog, buf)
    open(os.path.join(OUTD, name + '.cubin'), 'wb').write(buf.raw)
    regs = int(re.search(r'Used (\d+) registers', log).group(1))
    spill = re.search(r'(\d+) bytes spill stores', log).group(1)
    return regs, int(spill)
man = []
only = sys.argv[2:] 
for pn, (dr, nb, sq, sk, d, causal, scale) in PROBS.items():
    gen = open(f'/tmp/f32att/{dr}/attention_f32_k0.cu').read()
    head = gen[:gen.index('// ---- kernels/common.cuh ----')]
    common = gen[gen.index('// ---- kernels/common.cuh ----'):gen.index('// ---- kernels/attention.cu ----')]
    head = '\n'.join(l for l in head.split('\n') if not re.match(r'#define EQ_F(BM|P|KP) ', l))
    head = head.replace('#define EQ_KERNEL attention_f32_k0', '#define EQ_KERNEL attn')
    for vn, v in VARS.items():
        if only and vn not in only: continue
        if pn == 'd128' and v is not None and v.get('FQREG') == 0: continue
        defs = '' if v is None else ''.join(f'#define EQ_{k} {x}\n' for k, x in v.items())
        src = head + defs + common + '// ---- kernels/attention.cu ----\n' + (old_t if v is None else new_t)
        name = f'{pn}__{vn}'
        regs, spill = compile_(src, name)
        if v is None:
            grid = [(sq + 63) // 64, nb]; block = 64
        else:
            grid = [(sq + v['FBM'] - 1) // v['FBM'], nb]; block = v['FBM'] * v['FP']
        man.append(dict(name=name, prob=pn, var=vn, nb=nb, sq=sq, sk=sk, d=d, causal=causal, scale=scale,
                        grid=grid, block=block, smem=smem(v, d), regs=regs, spill=spill))
        print(name, 'regs', regs, 'spill', spill, 'smem', smem(v, d), 'grid', grid, 'block', block, flush=True)
json.dump(man, open(os.path.join(OUTD, 'manifest.json'), 'w'), indent=1)
