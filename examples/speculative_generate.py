"""Greedy generation plainly and with every draft source (the default): the same text, and the
statistics of each (per source, and why a draft model sat idle if it did).

    python examples/speculative_generate.py [TARGET] [DRAFT]

Defaults to the models.txt pair (fetched on first use).
"""

import sys

import llamaspec

target = sys.argv[1] if len(sys.argv) > 1 else "qwen2.5-coder-1.5b-instruct"
draft = sys.argv[2] if len(sys.argv) > 2 else "qwen2.5-coder-0.5b-instruct"
prompt = ("<|im_start|>user\nWrite a Python function that returns the n-th Fibonacci number."
          "<|im_end|>\n<|im_start|>assistant\n")

with llamaspec.load(target, spec="none") as plain, llamaspec.load(target, draft=draft) as spec:
    a = plain.generate(prompt, max_tokens=96, temperature=0)
    b = spec.generate(prompt, max_tokens=96, temperature=0)

print(b.text)
print()
print("plain:      ", a.stats.summary())
print("speculative:", b.stats.summary())
print("same text:  ", a.text == b.text)
print("by source:  ", {name: f"{s.accepted}/{s.drafted}" for name, s in b.stats.sources.items()})
print("idle:       ", b.stats.idle)
