import re, sys
src = open('/tmp/ceg/rowreduce_f32_k0.cu').read()
head, _ = src.split('// ---- kernels/rowreduce.cu ----')
tmpl = open('/work/wt-ce/kernels/rowreduce.cu').read()
def var(name, **d):
    h = head
    for k, v in d.items():
        if re.search(rf'#define EQ_{k} ', h):
            h = re.sub(rf'#define EQ_{k} .*', f'#define EQ_{k} {v}', h)
        else:
            h = h.replace('#define EQ_PIPELINED', f'#define EQ_{k} {v}\n#define EQ_PIPELINED')
    open(f'/tmp/v/{name}.cu', 'w').write(h + '// ---- kernels/rowreduce.cu ----' + tmpl)
var('A')
var('K2', CLUSTER=2, BLOCK=512, PIPELINED=0)
var('K4', CLUSTER=4, BLOCK=256, PIPELINED=0)
var('K8', CLUSTER=8, BLOCK=128, PIPELINED=0)
var('K8W', CLUSTER=8, BLOCK=256, ROW_THREADS=2048, CHUNKS=4, PIPELINED=0)
var('K4H', CLUSTER=4, BLOCK=128, ROW_THREADS=512, CHUNKS=16, PIPELINED=0)
var('K8W6', CLUSTER=8, BLOCK=256, ROW_THREADS=2048, CHUNKS=4, PIPELINED=0, MIN_BLOCKS=6)
var('K4W3', CLUSTER=4, BLOCK=256, PIPELINED=0, MIN_BLOCKS=3)
var('K4M5', CLUSTER=4, BLOCK=256, PIPELINED=0, MIN_BLOCKS=5)
var('K8M10', CLUSTER=8, BLOCK=128, PIPELINED=0, MIN_BLOCKS=10)
