#!/usr/bin/env python3
"""Takes only the attention f32 tile rates (templates.attention.tiles) of a calibrated profile
into the committed one (the old tile key dropped), noting it in `source`.
Usage: merge_att.py BASE.json CAL.json OUT.json KEY WHERE"""
import json, sys
base_p, cal_p, out_p, key, where = sys.argv[1:]
base, cal = json.load(open(base_p)), json.load(open(cal_p))
rate = cal['templates']['attention']['tiles'][key]
base['templates']['attention']['tiles'] = {key: rate}
base['source'] = base['source'].rstrip('.') + f"; templates.attention.tiles {key} (the f32 attention kernel of 32 rows x 4 parts, its row epilogue the fixed time per wave of blocks) measured by `eqfuse calibrate` {where}"
open(out_p, 'w').write(json.dumps(base, indent=2) + '\n')
print(key, rate)
