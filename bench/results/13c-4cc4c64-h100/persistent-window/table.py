import json, glob, os, sys
rows = {}
for f in sorted(glob.glob(os.path.join(sys.argv[1], '*.out'))):
    side, shape = os.path.basename(f)[:-4].split('-', 1)
    r = json.load(open(f))['rows'][0]
    rows.setdefault(shape, {})[side] = r
print('| shape (fp16, B·N 16384, H·d 2048) | shipped TFLOP/s | persistent TFLOP/s | persistent / shipped |')
print('| --- | --- | --- | --- |')
for shape, v in sorted(rows.items()):
    s, p = v['shipped'], v['persist']
    assert s['status'] == p['status'] == 'PASS'
    print(f"| {shape} | {s['tflops']:.1f} | {p['tflops']:.1f} | {p['tflops'] / s['tflops']:.3f} |")
