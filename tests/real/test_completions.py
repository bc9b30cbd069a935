"""llama-cpp-python's completion methods on a LlamaSpec (SmolLM2): the dicts llama_cpp.Llama
returns, key for key; the text of generate(); streams that add up; unsupported arguments refused."""

from __future__ import annotations

from typing import Any, Dict, List

import llama_cpp
import pytest

from llamaspec import ConfigError

CHAT = [{"role": "user", "content": "Name three colours."}]


@pytest.fixture(scope="module")
def llama(smol):
    """llama-cpp-python's own high-level object on the same file: the shapes to match."""
    model = llama_cpp.Llama(model_path=smol, n_ctx=1024, n_threads=2, verbose=False)
    yield model
    model.close()


def shape(value: Any) -> Any:
    """The keys of a response, recursively (lists by their first element), without values."""
    if isinstance(value, dict):
        # extras: llama-server's timings, OpenAI's usage.prompt_tokens_details (the cached prefix),
        # llamaspec's provenance (each token's source, a chunk's pieces, each source's counts)
        return {key: shape(v) for key, v in value.items()
                if key not in ("timings", "prompt_tokens_details", "sources", "pieces", "draft_sources")}
    if isinstance(value, list):
        return [shape(value[0])] if value else []
    return type(value).__name__ if value is not None else None


def chunk_shapes(chunks: List[Dict[str, Any]]) -> List[Any]:
    return [shape(c) for c in chunks]


def test_responses_have_llama_cpp_python_s_shape(smol_plain, llama):
    for create in ("create_completion", "create_chat_completion"):
        args = {"prompt": "def fibonacci(n):"} if create == "create_completion" else {"messages": CHAT}
        ours = getattr(smol_plain, create)(max_tokens=8, temperature=0, **args)
        theirs = getattr(llama, create)(max_tokens=8, temperature=0, **args)
        assert shape(ours) == shape(theirs), create
        assert set(ours["timings"]) >= {"predicted_n", "draft_n", "draft_n_accepted"}
        ours = list(getattr(smol_plain, create)(max_tokens=4, temperature=0, stream=True, **args))
        theirs = list(getattr(llama, create)(max_tokens=4, temperature=0, stream=True, **args))
        # the same chunks, the last one carrying usage and timings besides (llama-server's)
        assert [{k: v for k, v in c.items() if k not in ("usage",)} for c in chunk_shapes(ours)[:-1]] == \
            chunk_shapes(theirs)[:-1], create
        assert ours[-1]["choices"][0]["finish_reason"] == theirs[-1]["choices"][0]["finish_reason"] == "length"


def test_the_text_is_generate_s_and_the_stream_adds_up_to_it(smol_plain):
    expected = smol_plain.generate("def fibonacci(n):", max_tokens=40, temperature=0)
    done = smol_plain.create_completion("def fibonacci(n):", max_tokens=40, temperature=0)
    assert done["choices"][0]["text"] == expected.text
    assert done["usage"]["completion_tokens"] == len(expected.tokens)
    streamed = smol_plain.create_completion("def fibonacci(n):", max_tokens=40, temperature=0, stream=True)
    assert "".join(c["choices"][0]["text"] for c in streamed) == expected.text

    reply = smol_plain.chat(CHAT, max_tokens=30, temperature=0)
    done = smol_plain.create_chat_completion(CHAT, max_tokens=30, temperature=0)
    assert done["choices"][0]["message"] == {"role": "assistant", "content": reply.text}
    pieces = [c["choices"][0]["delta"].get("content", "")
              for c in smol_plain.create_chat_completion(CHAT, max_tokens=30, temperature=0, stream=True)]
    assert "".join(pieces) == reply.text


def test_a_stream_left_early_stops_its_generation(smol_plain):
    chunks = smol_plain.create_completion("Once upon a time", max_tokens=500, temperature=0, stream=True)
    next(chunks), next(chunks)
    chunks.close()
    again = smol_plain.create_completion("Once upon a time", max_tokens=12, temperature=0)
    assert again["choices"][0]["text"] == smol_plain.generate("Once upon a time", max_tokens=12, temperature=0).text


def test_tfs_z_does_nothing_as_in_llama_cpp_python(smol_plain):
    """llama.cpp has no tail-free sampling any more; llama-cpp-python takes tfs_z and ignores it."""
    plain = smol_plain.create_completion("Once upon a time", max_tokens=8, temperature=0.8, seed=2)
    tfs = smol_plain.create_completion("Once upon a time", max_tokens=8, temperature=0.8, seed=2, tfs_z=0.5)
    assert tfs["choices"][0]["text"] == plain["choices"][0]["text"]
    with pytest.raises(ConfigError, match="stopping_criteria is a function"):
        smol_plain.create_completion("hi", stopping_criteria="never")
    with pytest.raises(ConfigError, match="a grammar is GBNF text or a llama_cpp.LlamaGrammar, got object"):
        smol_plain.create_completion("hi", grammar=object())  # a grammar is served; one it cannot read is not
    with pytest.raises(ConfigError, match="only text content parts"):
        smol_plain.create_chat_completion([{"role": "user", "content": [{"type": "image_url"}]}])
