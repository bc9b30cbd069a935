"""The llama.cpp layer: everything that touches llama-cpp-python's low-level API and GGUF files.

    binding.py  the one module that makes ctypes calls: Model, Context (KV cache, decode), Batch
    models.py   the model list (models.txt): names, fetching from PyPI wheels, the local cache
    vocab.py    whether a draft model's vocabulary matches its target's
    chat.py     the model's own chat template, and fitting a conversation into the context
"""
