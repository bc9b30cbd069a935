"""One process: code_edit and open_chat through ``spec.generate`` (Qwen2.5-Coder-1.5B, auto,
greedy, 128 tokens), decode t/s of each, as JSON. To compare two commits, run it alternately
with each checkout first on the path:

    PYTHONPATH=/path/to/checkout python benchmarks/generate_speed.py
"""

import json

import llamaspec
from llamaspec.measure import load_suite

spec = llamaspec.load("qwen2.5-coder-1.5b-instruct", n_ctx=4096, n_threads=2, progress=False)
speeds = {}
for p in load_suite(["code_edit", "open_chat"]):
    prompt = spec.chat_prompt(p.messages)[0]
    spec.generate(prompt[:40], max_tokens=8, temperature=0)  # warm up
    speeds[p.name] = spec.generate(prompt, max_tokens=128, temperature=0).stats.decode_tps
print(json.dumps({"llamaspec": llamaspec.__file__, **speeds}))
