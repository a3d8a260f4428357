# PyTorch SDPA backward (and forward), bf16 [8, 16, 2048, 64], scale 0.125, CUDA events,
# median of 100 after 20 warm-up calls; flash backend (FA2) and the default choice.
import json, torch
import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend
torch.manual_seed(0)
B, H, S, D = 8, 16, 2048, 64
def med(f, n=100, warm=20):
    for _ in range(warm): f()
    torch.cuda.synchronize()
    ts = []
    for _ in range(n):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); f(); b.record(); torch.cuda.synchronize(); ts.append(a.elapsed_time(b))
    ts.sort(); return ts[len(ts) // 2]
out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
for causal in (False, True):
    q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    for name, backends in (("flash", [SDPBackend.FLASH_ATTENTION]), ("default", None)):
        ctx = sdpa_kernel(backends) if backends else sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])
        try:
            with ctx:
                fwd = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=0.125)
                o = fwd(); g = torch.randn_like(o)
                out[f"{name}_causal{int(causal)}_fwd_ms"] = med(fwd)
                o = fwd()
                def bwd():
                    q.grad = k.grad = v.grad = None
                    o.backward(g, retain_graph=True)
                out[f"{name}_causal{int(causal)}_bwd_ms"] = med(bwd)
                with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                    bwd(); torch.cuda.synchronize()
                out[f"{name}_causal{int(causal)}_bwd_kernels"] = sorted({e.name[:80] for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA})
        except Exception as e:
            out[f"{name}_causal{int(causal)}"] = f"error: {e}"
print(json.dumps(out, indent=1))
