"""A two-turn chat, streamed; the second turn reuses the KV caches of the first.

    python examples/chat_stream.py [TARGET] [DRAFT]
"""

import sys

import llamaspec

target = sys.argv[1] if len(sys.argv) > 1 else "qwen2.5-coder-1.5b-instruct"
draft = sys.argv[2] if len(sys.argv) > 2 else "qwen2.5-coder-0.5b-instruct"

with llamaspec.load(target, draft=draft) as spec:
    messages = [{"role": "system", "content": "You are a concise assistant."}]
    for question in ["What is a KV cache?", "And why does speculative decoding roll it back?"]:
        messages.append({"role": "user", "content": question})
        print(f"> {question}")
        result = None
        for chunk in spec.chat_stream(messages, max_tokens=120, temperature=0.7, seed=42):
            print(chunk.text, end="", flush=True)
            result = chunk.result
        messages.append({"role": "assistant", "content": result.text})
        print(f"\n[{result.stats.summary()}]\n")
