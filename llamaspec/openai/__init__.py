"""OpenAI's and llama-cpp-python's shapes over a LlamaSpec: the completion methods with their
arguments and return values (``completions.py``; ``LlamaSpec.create_completion`` and
``llamaspec serve`` are thin layers over them) and OpenAI's tools, their calls read from a
model's text (``tools.py``)."""
