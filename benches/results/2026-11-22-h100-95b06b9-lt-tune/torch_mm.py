import torch, json, sys
torch.backends.cuda.matmul.allow_tf32 = False
def t(f, n=30):
    for _ in range(5): f()
    torch.cuda.synchronize()
    ts=[]
    for _ in range(n):
        a=torch.cuda.Event(enable_timing=True); b=torch.cuda.Event(enable_timing=True)
        a.record(); f(); b.record(); torch.cuda.synchronize(); ts.append(a.elapsed_time(b)*1e3)
    ts.sort(); return ts[len(ts)//2]
r={}
for (m,k,n) in [(1024,768,768),(1024,768,3072),(1024,3072,768),(768,1024,768),(768,1024,3072),(3072,1024,768),(4096,768,768),(4096,768,3072),(4096,3072,768),(4096,4096,4096)]:
    a=torch.randn(m,k,device='cuda'); b=torch.randn(k,n,device='cuda')
    us=t(lambda: a@b); r[f"mm {m}x{k}x{n}"]=(us, 2*m*n*k/us/1e6)
for (B,M,K,N) in [(24,512,512,64),(24,512,64,512),(96,512,512,64),(96,512,64,512)]:
    a=torch.randn(B,M,K,device='cuda'); b=torch.randn(B,K,N,device='cuda')
    us=t(lambda: torch.bmm(a,b)); r[f"bmm {B}x{M}x{K}x{N}"]=(us, 2*B*M*N*K/us/1e6)
for k,v in r.items(): print(f"{k:28s} {v[0]:8.1f} us {v[1]:6.1f} TFLOP/s")
