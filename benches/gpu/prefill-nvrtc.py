#!/usr/bin/env python3
# Fills an eqfuse NVRTC disk cache (src/nvrtc.rs `compile_cached`) with generated kernel files,
# so that a device session spends no time compiling them: each FILE.cu is compiled for ARCH by
# the NVRTC on the loader path (.ci/install-nvrtc) and stored as NAME-ARCH-KEY.ptx, KEY the
# FNV-1a hash of (source, arch, NVRTC major.minor) as compile_cached computes it. A device whose
# NVRTC has another version simply misses the cache and compiles.
# Usage: prefill-nvrtc.py CACHE_DIR ARCH FILE.cu...
import ctypes, os, sys
lib = ctypes.CDLL("libnvrtc.so.13")
major, minor = ctypes.c_int(), ctypes.c_int()
assert lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor)) == 0
version = f"{major.value}.{minor.value}".encode()
def fnv1a(parts):
    h = 0xCBF29CE484222325
    for p in parts:
        for b in p + b"\0":
            h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h
cache, arch = sys.argv[1], sys.argv[2]
os.makedirs(cache, exist_ok=True)
for path in sys.argv[3:]:
    src = open(path, "rb").read()
    name = os.path.basename(path)[: -len(".cu")]
    out = os.path.join(cache, f"{name}-{arch}-{fnv1a([src, arch.encode(), version]):016x}.ptx")
    if os.path.exists(out):
        continue
    prog = ctypes.c_void_p()
    assert lib.nvrtcCreateProgram(ctypes.byref(prog), src, name.encode(), 0, None, None) == 0
    opts = (ctypes.c_char_p * 1)(f"--gpu-architecture={arch}".encode())
    if lib.nvrtcCompileProgram(prog, 1, opts) != 0:
        sys.exit(f"{path}: NVRTC compile failed")
    n = ctypes.c_size_t()
    lib.nvrtcGetPTXSize(prog, ctypes.byref(n))
    ptx = ctypes.create_string_buffer(n.value)
    lib.nvrtcGetPTX(prog, ptx)
    lib.nvrtcDestroyProgram(ctypes.byref(prog))
    with open(out, "wb") as f:
        f.write(ptx.value)
    print(out)
