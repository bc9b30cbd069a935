"""llama-server's native endpoints of llamaspec serve as a real process on 127.0.0.1 (SmolLM2,
plain greedy decoding): /completion says what /v1/completions says, in llama-server's shape,
streamed or not; /tokenize and /detokenize undo each other; /apply-template is what the chat
reads; /props and /slots describe the server; bad input is a 400 naming the field."""

from __future__ import annotations

import json
import urllib.request

import pytest

from checks import Server

PROMPT = "Once upon a time"
# One thread: the 135M model needs no more, and two threads slow down many times when the
# machine's other processes hold a core.
THREADS = "1"


@pytest.fixture(scope="module")
def server(smol):
    server = Server("-m", smol, "-t", THREADS, "-c", "1024", "--spec", "none")
    yield server
    server.stop()


def post(server, path: str, body) -> dict:
    status, answer = server.request("POST", path, body)
    assert status == 200, answer
    return answer


def events(server, path: str, body: dict) -> list:
    """The raw server-sent events of a stream, read to the end."""
    req = urllib.request.Request(server.url + path, data=json.dumps({**body, "stream": True}).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        return [event for event in r.read().decode().split("\n\n") if event]


def test_completion_says_what_v1_completions_says_for_text_and_token_prompts(server):
    client = server.client()
    expected = client.completions.create(model="x", prompt=PROMPT, max_tokens=16, temperature=0).choices[0].text
    native = post(server, "/completion", {"prompt": PROMPT, "n_predict": 16, "temperature": 0, "return_tokens": True})
    assert native["content"] == expected and native["stop"] is True
    assert native["tokens_predicted"] == len(native["tokens"]) == 16 and native["stop_type"] == "limit"
    assert post(server, "/detokenize", {"tokens": native["tokens"]})["content"] == expected
    assert native["generation_settings"]["n_predict"] == 16 and native["prompt"] == PROMPT
    assert native["tokens_cached"] == native["tokens_evaluated"] + 15 and not native["truncated"]
    assert set(native["timings"]) >= {"cache_n", "prompt_n", "prompt_ms", "predicted_n", "predicted_per_second",
                                      "draft_n", "draft_n_accepted"}
    ids = post(server, "/tokenize", {"content": PROMPT, "add_special": True})["tokens"]
    assert post(server, "/completions", {"prompt": ids, "n_predict": 16, "temperature": 0})["content"] == expected
    assert client.completions.create(model="x", prompt=ids, max_tokens=16, temperature=0).choices[0].text == expected
    cut = PROMPT.index(" a")  # text, then the ids of the rest: at a word's edge, the same tokens
    head = post(server, "/tokenize", {"content": PROMPT[:cut], "add_special": True})["tokens"]
    assert head == ids[:len(head)]
    mixed = [PROMPT[:cut], *ids[len(head):]]
    assert post(server, "/completion", {"prompt": mixed, "n_predict": 16, "temperature": 0})["content"] == expected


def test_n_predict_stop_strings_and_the_cached_prefix(server):
    full = post(server, "/completion", {"prompt": PROMPT, "n_predict": 24, "temperature": 0})["content"]
    short = post(server, "/completion", {"prompt": PROMPT, "n_predict": 3, "temperature": 0})
    assert short["tokens_predicted"] == 3 and full.startswith(short["content"]) and short["stop_type"] == "limit"
    stop = full[10:15]
    cut = post(server, "/completion", {"prompt": PROMPT, "n_predict": 24, "temperature": 0, "stop": [stop]})
    assert cut["content"] == full[:full.index(stop)]
    assert cut["stop_type"] == "word" and cut["stopping_word"] == stop
    longer = post(server, "/completion", {"prompt": PROMPT + full[:20], "n_predict": 2, "temperature": 0})
    assert 0 < longer["timings"]["cache_n"] < longer["tokens_evaluated"]
    warm = post(server, "/completion", {"prompt": PROMPT + " there", "n_predict": 0})  # what editors send
    assert warm["content"] == "" and warm["tokens_predicted"] == 0 and warm["stop"] is True


def test_a_stream_is_the_whole_in_chunks_then_a_last_chunk_without_done(server):
    body = {"prompt": PROMPT, "n_predict": 20, "temperature": 0, "return_tokens": True}
    whole = post(server, "/completion", body)
    sent = events(server, "/completion", body)
    assert all(event.startswith("data: {") for event in sent), sent[-1]  # no [DONE] on the native endpoints
    chunks = [json.loads(event[len("data: "):]) for event in sent]
    assert all(not c["stop"] for c in chunks[:-1]) and chunks[-1]["stop"] is True
    assert "".join(c["content"] for c in chunks) == whole["content"]
    assert [t for c in chunks for t in c["tokens"]] == whole["tokens"]
    last = chunks[-1]
    assert last["content"] == "" and last["stop_type"] == whole["stop_type"]
    assert last["tokens_predicted"] == whole["tokens_predicted"] and last["timings"]["predicted_n"] > 0


def test_tokenize_and_detokenize_undo_each_other_with_pieces(server):
    text = "Hello world, é and 🦙<|im_end|>"
    tokens = post(server, "/tokenize", {"content": text})["tokens"]
    assert post(server, "/detokenize", {"tokens": tokens})["content"] == text
    pieces = post(server, "/tokenize", {"content": text, "with_pieces": True})["tokens"]
    assert [p["id"] for p in pieces] == tokens
    raw = b"".join(bytes(p["piece"]) if isinstance(p["piece"], list) else p["piece"].encode() for p in pieces)
    assert raw.decode() == text
    assert len(post(server, "/tokenize", {"content": "<|im_end|>", "parse_special": False})["tokens"]) > 1


def test_apply_template_is_the_prompt_the_chat_reads(server):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a colour."}]
    prompt = post(server, "/apply-template", {"messages": messages})["prompt"]
    assert prompt.startswith("<|im_start|>system\nBe brief.") and prompt.endswith("<|im_start|>assistant\n")
    reply = server.client().chat.completions.create(model="x", messages=messages, max_tokens=1, temperature=0)
    assert len(post(server, "/tokenize", {"content": prompt})["tokens"]) == reply.usage.prompt_tokens


def test_props_and_slots_describe_the_server(server):
    status, props = server.get("/props")
    assert status == 200 and props["total_slots"] == 1 and props["model_path"].endswith(".gguf")
    settings = props["default_generation_settings"]
    assert settings["n_ctx"] == 1024 and settings["params"]["temperature"] == 0.8
    assert settings["params"]["top_k"] == 40 and settings["params"]["repeat_last_n"] == 64
    assert props["eos_token"] == "<|im_end|>" and "im_start" in props["chat_template"]
    assert props["modalities"] == {"vision": False, "audio": False} and props["build_info"].startswith("llamaspec")
    assert props["llamaspec"] == {"spec": "plain", "speculative": False, "draft_model": None, "draft_model_path": None}
    status, slots = server.get("/slots")
    assert status == 200 and [s["id"] for s in slots] == [0] and slots[0]["is_processing"] is False
    assert slots[0]["n_ctx"] == 1024 and slots[0]["speculative"] is False and slots[0]["params"]["n_predict"] == -1
    assert server.request("POST", "/props", {})[0] == 501


def test_slots_with_parallel_are_one_a_lane(smol):
    server = Server("-m", smol, "-t", THREADS, "-c", "512", "--parallel", "2")
    try:
        status, slots = server.get("/slots")
        assert status == 200 and [s["id"] for s in slots] == [0, 1] and not any(s["is_processing"] for s in slots)
        assert all(s["speculative"] for s in slots) and server.get("/props")[1]["total_slots"] == 2
        answer = post(server, "/completion", {"prompt": PROMPT, "n_predict": 4, "temperature": 0})
        assert answer["tokens_predicted"] == 4 and answer["id_slot"] == -1
    finally:
        server.stop()


BAD = [
    ("/completion", {}, "prompt: Field required"),
    ("/completion", {"prompt": {"text": "hi"}}, "prompt: is a string or a list of token ids and strings"),
    ("/completion", {"prompt": [1, 2.5]}, "prompt: is a string or a list of token ids and strings"),
    ("/completion", {"prompt": [99999999]}, "99999999"),
    ("/completion", {"prompt": ["one", "two"]}, "prompt: a list of strings is several prompts"),
    ("/completion", {"prompt": "hi", "n_predict": -2}, "n_predict"),
    ("/completion", {"prompt": "hi", "n_predict": "many"}, "n_predict"),
    ("/completion", {"prompt": "hi", "n": 2, "temperature": 0.5}, "n: is 1"),
    ("/completion", {"prompt": "hi", "temperature": "hot"}, "temperature"),
    ("/completion", {"prompt": "hi", "n_probs": 50}, "n_probs"),
    ("/completions", {"prompt": ""}, "empty"),
    ("/tokenize", {}, "content: Field required"),
    ("/tokenize", {"content": 5}, "content: is a string or a list of token ids and strings"),
    ("/tokenize", {"content": ["a", -3]}, "content: id -3 is not in the vocabulary"),
    ("/tokenize", b'{"content": "\\ud800"}', "content: is not valid UTF-8 text"),
    ("/detokenize", {}, "tokens: Field required"),
    ("/detokenize", {"tokens": "1 2"}, "tokens"),
    ("/detokenize", {"tokens": [1, 99999999, -1]}, "tokens: ids 99999999, -1 are not in the vocabulary"),
    ("/apply-template", {}, "messages: Field required"),
    ("/apply-template", {"messages": [{"role": "wizard", "content": "hi"}]}, "messages.0.role"),
    ("/apply-template", {"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function"}]}, "tools"),
    ("/tokenize", b"not json", "not valid JSON"),
]


@pytest.mark.parametrize("path, body, fragment", BAD)
def test_bad_input_is_a_400_naming_the_field(server, path, body, fragment):
    status, answer = server.request("POST", path, body)
    assert status == 400, (status, answer)
    assert set(answer) == {"error"} and set(answer["error"]) == {"message", "type", "param", "code"}
    assert fragment in answer["error"]["message"] and "\n" not in answer["error"]["message"]
    assert server.get("/health") == (200, {"status": "ok"})
