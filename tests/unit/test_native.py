"""llama-server's native shapes without a model: a fake LlamaSpec's chunks as /completion's
replies (whole, streamed, picked fields), the bodies' checks, tokens and pieces, the framing."""

from __future__ import annotations

import json
from typing import Iterator, List

import pytest

from llamaspec import ConfigError, SamplingConfig
from llamaspec.engine.generation import Chunk, Result
from llamaspec.engine.stats import Stats
from llamaspec.openai.completions import create_infill, create_native, native_params, native_tokens
from llamaspec.server import native
from llamaspec.server.app import BadRequest, parse
from llamaspec.server.events import NativeEvents

PIECES = {1: b"Hello", 2: b" world", 3: b"\n", 4: b"!", 5: b"\xc3", 6: b"\xa9", 7: b"<s>"}


class FakeModel:
    n_vocab = 8
    bos, eos = 7, -1
    path = None

    def piece(self, token: int) -> bytes:
        return PIECES.get(token, b"?")

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> List[int]:
        return ([7] if add_special else []) + [len(word) for word in text.split()]


class FakeStream:
    """A generation of ``chunks`` (the last with the result)."""

    def __init__(self, chunks: List[Chunk]) -> None:
        self.chunks, self.closed = chunks, False

    def __iter__(self) -> Iterator[Chunk]:
        return iter(self.chunks)

    def stop(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True


class FakeSpec:
    """What create_native reads of a LlamaSpec: it generates "Hello world" then stops as told."""

    model = FakeModel()
    model_name = "fake.gguf"

    def __init__(self, stop_reason: str = "stop", stop_string=None) -> None:
        self.stop_reason, self.stop_string = stop_reason, stop_string
        self.options: dict = {}

    def tokenize(self, text: str, add_special: bool = True) -> List[int]:
        return self.model.tokenize(text, add_special)

    def detokenize(self, tokens) -> str:
        return b"".join(self.model.piece(t) for t in tokens).decode("utf-8", errors="replace")

    def fim_tokens(self, prefix, suffix, extra=None, prompt=""):
        return [4, 4]

    def stream(self, prompt, **options) -> FakeStream:
        self.options = options
        stats = Stats(n_prompt=3, n_prompt_eval=1, n_predict=2, t_prompt=0.01, t_decode=0.02)
        result = Result("Hello world", [1, 2], self.stop_reason, stats, stop_string=self.stop_string)
        return FakeStream([Chunk("Hello", [1]), Chunk(" world", [2], result=result)])


def test_a_completion_in_llama_server_s_shape():
    reply = create_native(FakeSpec(), "a b c", n_predict=2, return_tokens=True, temperature=0)
    assert reply["content"] == "Hello world" and reply["tokens"] == [1, 2] and reply["stop"] is True
    assert reply["stop_type"] == "eos" and reply["stopping_word"] == "" and reply["model"] == "fake.gguf"
    assert reply["tokens_predicted"] == 2 and reply["tokens_evaluated"] == 3 and reply["tokens_cached"] == 4
    assert reply["prompt"] == "<s>HelloHelloHello" and reply["id_slot"] == 0 and reply["has_new_line"] is False
    assert reply["timings"]["cache_n"] == 2 and reply["timings"]["prompt_per_token_ms"] == pytest.approx(10)
    assert reply["generation_settings"]["n_predict"] == 2 and reply["generation_settings"]["temperature"] == 0


@pytest.mark.parametrize("reason, stop_string, stop_type", [("stop", None, "eos"), ("stop", "!", "word"),
                                                             ("length", None, "limit"), ("context", None, "limit")])
def test_stop_types(reason, stop_string, stop_type):
    reply = create_native(FakeSpec(reason, stop_string), [1])
    assert reply["stop_type"] == stop_type and reply["stopping_word"] == (stop_string or "")
    assert reply["truncated"] is (reason == "context") and reply["tokens"] == []


def test_n_predict_falls_back_to_max_tokens_and_0_generates_nothing():
    spec = FakeSpec()
    create_native(spec, "a", max_tokens=7)
    assert spec.options["max_tokens"] == 7
    create_native(spec, "a", n_predict=0, max_tokens=7)
    assert spec.options["max_tokens"] == 0
    create_native(spec, "a")
    assert spec.options["max_tokens"] == -1
    with pytest.raises(ConfigError, match="n_predict"):
        create_native(spec, "a", n_predict=-2)
    with pytest.raises(ConfigError, match="^n: is 1"):
        create_native(spec, "a", n=2)
    with pytest.raises(ConfigError, match="^prompt: a list of strings is several prompts"):
        create_native(spec, ["a", "b"])


def test_a_stream_is_the_text_in_chunks_then_a_last_chunk_without_it():
    chunks = list(create_native(FakeSpec(), "a", stream=True, return_tokens=True))
    assert [c["content"] for c in chunks] == ["Hello", " world", ""]
    assert [c["tokens"] for c in chunks] == [[1], [2], []] and [c["stop"] for c in chunks] == [False, False, True]
    assert chunks[1]["tokens_predicted"] == 2 and chunks[-1]["stop_type"] == "eos"


def test_response_fields_keep_those_asked_nested_ones_lifted():
    reply = create_native(FakeSpec(), "a", response_fields=["content", "timings/prompt_n", "timings/nothing", "x"])
    assert reply == {"content": "Hello world", "timings/prompt_n": 1}
    assert create_native(FakeSpec(), "a", response_fields=[""]) == {}


def test_infill_answers_in_the_native_shape():
    reply = create_infill(FakeSpec(), "def f():", "", n_predict=0)
    assert reply["content"] == "Hello world" and reply["prompt"] == "!!"


def test_mixed_prompts_read_as_llama_server_reads_them():
    tokenize = FakeModel().tokenize
    assert native_tokens(tokenize, ["ab c", 5, "d"], add_special=True) == [7, 2, 1, 5, 1]
    assert native_tokens(tokenize, [5, "ab"], add_special=True) == [5, 2]
    assert native_tokens(tokenize, ["ab"], add_special=False) == [2]


def test_tokens_with_pieces_bytes_where_not_utf8_and_unknown_ids_refused():
    spec = FakeSpec()
    assert native.tokenize(spec, [5, 6, 4], with_pieces=True) == {
        "tokens": [{"id": 5, "piece": [0xc3]}, {"id": 6, "piece": [0xa9]}, {"id": 4, "piece": "!"}]}
    assert native.detokenize(spec, [5, 6]) == {"content": "é"}
    with pytest.raises(ConfigError, match=r"^tokens: ids 8, -1 are not in the vocabulary \(0 to 7\)"):
        native.detokenize(spec, [1, 8, -1])
    with pytest.raises(ConfigError, match="^content: is not valid UTF-8"):
        native.tokenize(spec, "\ud800")


def test_the_defaults_shown_are_sampling_config_s():
    params, s = native_params(native.DEFAULTS), SamplingConfig()
    assert (params["temperature"], params["top_k"], params["top_p"], params["min_p"]) == (s.temperature, s.top_k,
                                                                                           s.top_p, s.min_p)
    assert params["repeat_last_n"] == s.penalty_last_n and params["n_predict"] == -1 and params["seed"] == -1
    body = parse(b'{"prompt": "hi"}', native.CompletionRequest).arguments()
    assert body["temperature"] == s.temperature and body["top_k"] == s.top_k and body["n_predict"] is None


@pytest.mark.parametrize("raw, message", [
    (b'{"prompt": 3}', "prompt: is a string or a list of token ids and strings, got 3"),
    (b'{"prompt": [1, true]}', "prompt: is a string or a list of token ids and strings, got [1, true]"),
    (b'{"prompt": "x", "n_probs": -1}', "n_probs"),
])
def test_bodies_refused_by_name(raw, message):
    with pytest.raises(BadRequest, match=message.replace("[", r"\[").replace("]", r"\]")):
        parse(raw, native.CompletionRequest)


def test_native_streams_end_without_done():
    events = NativeEvents(None)
    assert events.frame([{"content": "a", "stop": False}]) == 'data: {"content": "a", "stop": false}\n\n'
    assert events.end() == ""
    failed = json.loads(events.failed("boom")[len("data: "):])
    assert failed["error"]["message"] == "boom"
