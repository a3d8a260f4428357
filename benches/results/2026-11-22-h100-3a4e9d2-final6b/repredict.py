import json, subprocess, sys
prof = sys.argv[1]
b = json.load(open('/tmp/s12/session/bench.json'))
progs = [x['program'].replace('.gpu-final/', '') for x in b['programs']]
lines = subprocess.run(['./target/release/examples/tmp_predict', prof] + progs, capture_output=True, text=True).stdout.splitlines()
pred = {json.loads(l)['program']: json.loads(l) for l in lines}
miss = 0
for x in b['programs']:
    path = x['program'].replace('.gpu-final/', '')
    p = pred[path]
    same = len(p['fused']) == len(x['fused']['per_kernel']) and len(p['unfused']) == len(x['unfused']['per_kernel'])
    ms = x['unfused']['measured_us'] / x['fused']['measured_us']
    ps = sum(p['unfused']) / sum(p['fused'])
    err = abs(ps / ms - 1)
    miss += err > 0.15
    print(f"{path:40s} same {same!s:5} measured {ms:6.2f} pred {ps:6.2f} err {100*err:5.1f}%  (run's pred {x['speedup_predicted']:.2f} err {100*x['speedup_error']:.1f}%)")
print('misses', miss)
