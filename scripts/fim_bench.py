"""The bench's code_edit file as a fill-in-the-middle request (docs/results.md): the body of
Inventory.remove cut out; plain (--spec none) and auto (-md 0.5B) interleaved, greedy, 3 rounds;
decode t/s. Run it on an idle machine: python scripts/fim_bench.py"""
import json
import re
import statistics

import llamaspec
suite = json.load(open("llamaspec/data/bench_suite.json"))
code = re.search(r"```python\n(.*?)```", next(p for p in suite if p["name"] == "code_edit")["user"], re.S).group(1)
head, rest = code.split("    def remove(self, name, quantity):\n")
body_end = rest.index("\n    def total_value")
prefix, suffix = head + "    def remove(self, name, quantity):\n", rest[body_end:]
plain = llamaspec.load("qwen2.5-coder-1.5b-instruct", spec="none", progress=False, n_threads=2)
auto = llamaspec.load("qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct", progress=False, n_threads=2)
rates = {"plain": [], "auto": []}
texts = {}
for rnd in range(3):
    for name, spec in (("plain", plain), ("auto", auto)):
        spec.reset()
        r = spec.generate(spec.fim_tokens(prefix, suffix), max_tokens=128, temperature=0)
        rates[name].append(r.stats.decode_tps)
        texts.setdefault(name, r.text)
        print(name, rnd, f"{r.stats.decode_tps:.2f} t/s", len(r.tokens), "tokens", r.stats.summary(), flush=True)
print("same text:", texts["plain"] == texts["auto"], repr(texts["auto"][:200]))
mp, ma = statistics.median(rates["plain"]), statistics.median(rates["auto"])
print(f"median plain {mp:.2f} t/s, auto {ma:.2f} t/s, auto/plain {ma / mp:.2f}x")
