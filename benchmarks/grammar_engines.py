"""How long a grammar engine takes to mask the vocabulary, per token, on this CPU: llguidance
(what llamaspec uses) against llama.cpp's own grammar sampler (through llama-cpp-python's
low-level API, as llama-completion applies it to every token of the vocabulary).

    python benchmarks/grammar_engines.py [MODEL]

MODEL: a GGUF path or a models.txt name (default: qwen2.5-coder-1.5b-instruct, 151,936 tokens).
Both follow the same JSON text token by token under the same schema (llama.cpp's GBNF, written
out below as llama.cpp's converter writes it, for llama.cpp; llamaspec's conversion for
llguidance) and report the median and the largest time per token, and, for scale, one
single-token decode of the model. This script measures; it is not part of the package, and it
alone calls llama.cpp's sampler directly.
"""

from __future__ import annotations

import ctypes
import statistics
import sys
import time

import llama_cpp as ll
import numpy as np

from llamaspec.config import default_threads
from llamaspec.constraints import Constraint, Grammar, GrammarVocabulary
from llamaspec.llama import models
from llamaspec.llama.binding import Context, Model

SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string"}, "age": {"type": "integer"},
    "tags": {"type": "array", "items": {"type": "string"}},
    "address": {"type": "object", "properties": {"city": {"type": "string"}, "zip": {"type": "string"}},
                "required": ["city", "zip"]}},
    "required": ["name", "age", "tags", "address"]}
GBNF = r'''root ::= "{" space name-kv "," space age-kv "," space tags-kv "," space address-kv space "}"
name-kv ::= "\"name\"" space ":" space string
age-kv ::= "\"age\"" space ":" space integer
tags-kv ::= "\"tags\"" space ":" space tags
tags ::= "[" space (string ("," space string)*)? space "]"
address-kv ::= "\"address\"" space ":" space address
address ::= "{" space city-kv "," space zip-kv space "}"
city-kv ::= "\"city\"" space ":" space string
zip-kv ::= "\"zip\"" space ":" space string
integer ::= ("-"? integral-part)
integral-part ::= [0] | [1-9] [0-9]{0,15}
string ::= "\"" char* "\""
char ::= [^"\\\x7F\x00-\x1F] | [\\] (["\\bfnrt] | "u" [0-9a-fA-F]{4})
space ::= | " " | "\n"{1,2} [ \t]{0,20}
'''
TEXT = '{\n  "name": "Ann Lee",\n  "age": 42,\n  "tags": ["a", "b"],\n  "address": {"city": "Oslo", "zip": "0150"}\n}'


def main() -> None:
    name = sys.argv[1] if len(sys.argv) > 1 else "qwen2.5-coder-1.5b-instruct"
    model = Model(models.resolve_model(name))
    tokens = model.tokenize(TEXT, add_special=False, parse_special=False)
    rng = np.random.default_rng(0)
    rows = [rng.standard_normal(model.n_vocab).astype(np.float32) for _ in tokens]

    vocab = GrammarVocabulary(model)
    t0 = time.perf_counter()
    vocab.tokenizer  # noqa: B018 (built once per model)
    built = time.perf_counter() - t0
    ours = vocab.constraint(Grammar.json_schema(SCHEMA))
    lg = []
    for row, token in zip(rows, tokens):
        t0 = time.perf_counter()
        ours.mask(row)
        ours.advance(token)
        lg.append(time.perf_counter() - t0)

    sampler = ll.llama_sampler_init_grammar(model._vocab, GBNF.encode(), b"root")
    data = (ll.llama_token_data * model.n_vocab)()
    lc = []
    for row, token in zip(rows, tokens):
        for i, logit in enumerate(row.tolist()):
            data[i].id, data[i].logit, data[i].p = i, logit, 0.0
        array = ll.llama_token_data_array(data, model.n_vocab, -1, False)
        t0 = time.perf_counter()
        ll.llama_sampler_apply(sampler, ctypes.byref(array))
        ll.llama_sampler_accept(sampler, token)
        lc.append(time.perf_counter() - t0)
    ll.llama_sampler_free(sampler)

    ctx = Context(model, 512, default_threads())
    ctx.eval(tokens[:8])
    decodes = []
    for token in tokens[8:20]:
        t0 = time.perf_counter()
        ctx.eval([token], logits="last")
        decodes.append(time.perf_counter() - t0)
    ctx.close()

    ms = lambda xs: f"median {1e3 * statistics.median(xs):7.3f} ms, largest {1e3 * max(xs):7.3f} ms"  # noqa: E731
    print(f"{name}: {model.n_vocab} tokens, {len(tokens)} tokens of JSON, {default_threads()} threads")
    print(f"llguidance (mask + advance)          {ms(lg)}   (its vocabulary built once: {built:.2f} s)")
    print(f"llama.cpp grammar sampler (apply)    {ms(lc)}")
    print(f"one single-token decode of the model {ms(decodes)}")


if __name__ == "__main__":
    main()
