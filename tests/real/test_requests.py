"""What editors, agents and evaluation scripts send, on real models: log-probabilities equal to
plain decoding's, penalties and logit biases through every surface, fill-in-the-middle on
Qwen2.5-Coder (Python, /v1/completions with a suffix, llama-server's /infill), echo, and the
arguments still refused, by name, on Qwen2.5-Coder-0.5B (the 1.5B for the server's /infill).
(Penalties against llama-completion: tests/real/test_fidelity.py; exactness on fake models:
tests/unit/test_engine.py.)"""

from __future__ import annotations

import ast
import json

import numpy as np
import pytest

from llamaspec.config import SamplingConfig
from llamaspec.errors import ConfigError
from llamaspec.sampling import Mirostat, Uniforms, sample_at

from conftest import QWEN, QWEN_DRAFT, THREADS, PROMPTS, assert_one_line_error, run
from checks import NEAR_TIE, Server, assert_as_alone


HEAD = "def median(values):\n    \"\"\"The median of a non-empty list of numbers.\"\"\"\n"
TAIL = "\n\n\nprint(median([3, 1, 2]))\n"


@pytest.mark.parametrize("shaping", [{}, dict(repeat_penalty=1.2, frequency_penalty=0.1)], ids=["plain", "penalized"])
def test_log_probabilities_under_speculation_are_plain_decoding_s(qwen_small_plain, module_spec, shaping):
    """The copy-heavy edit (most tokens come from accepted drafts): each token's log-probability
    and its 5 best, from the rows verification evaluated, as plain decoding's. A row computed in
    a batch is not bit for bit the row computed alone on a CPU (nor the cache it attends to): the
    chosen tokens' agree to 1e-3 at the median (5e-5 and 3e-4 measured) and 0.1 at worst (0.05); the
    alternatives' to the near-tie allowance of the greedy tests."""
    plain = qwen_small_plain.generate(PROMPTS[2], max_tokens=64, temperature=0, logprobs=5, **shaping)
    lookup = module_spec(QWEN_DRAFT, spec="lookup", fixed=("lookup",))  # verified every step, whatever it costs here
    auto = lookup.generate(PROMPTS[2], max_tokens=64, temperature=0, logprobs=5, **shaping)
    assert auto.stats.n_accept >= 16  # tokens whose rows a verify batch computed
    same = first_difference(auto.tokens, plain.tokens)
    assert same > 32
    chosen = []
    for ours, theirs in zip(auto.logprobs[:same], plain.logprobs[:same]):
        assert ours.token == theirs.token
        chosen.append(abs(ours.logprob - theirs.logprob))
        best, theirs_best = dict(ours.top), dict(theirs.top)
        both = best.keys() & theirs_best.keys()  # the 5th may differ at a tie
        assert len(both) >= 4 and max(abs(best[t] - theirs_best[t]) for t in both) < NEAR_TIE
    assert np.median(chosen) < 1e-3 and max(chosen) < 0.1, chosen
    assert all(lp.logprob <= 0 and len(lp.top) == 5 for lp in auto.logprobs)


def test_openai_shapes_of_log_probabilities(qwen_small_auto):
    chat = qwen_small_auto.create_chat_completion([{"role": "user", "content": "Name a colour."}], max_tokens=8,
                                                  temperature=0, logprobs=True, top_logprobs=2)
    content = chat["choices"][0]["logprobs"]["content"]
    assert "".join(e["token"] for e in content) == chat["choices"][0]["message"]["content"]
    assert all(len(e["top_logprobs"]) == 2 and bytes(e["bytes"]).decode() == e["token"] for e in content)
    streamed = list(qwen_small_auto.create_chat_completion([{"role": "user", "content": "Name a colour."}],
                                                           max_tokens=8, temperature=0, logprobs=True, top_logprobs=2,
                                                           stream=True))
    again = [e for c in streamed if c["choices"][0]["logprobs"] for e in c["choices"][0]["logprobs"]["content"]]
    # the prompt now cached, and the answer copied from the first in one verify batch where the gate asks:
    # rows alike as a batch moves a row (at most 0.34 of the top-1/top-2 gap on this model,
    # docs/results.md), not bit for bit; so the same tokens, or parting first at a near-tie of the first's
    same = first_difference([e["token"] for e in again], [e["token"] for e in content])
    assert all(abs(a["logprob"] - b["logprob"]) < NEAR_TIE for a, b in zip(again[:same], content))
    if (same, same) != (len(again), len(content)):
        top = {e["token"]: e["logprob"] for e in content[same]["top_logprobs"]}
        assert top.get(again[same]["token"], -np.inf) > content[same]["logprob"] - NEAR_TIE, (again[same], top)
    text = qwen_small_auto.create_completion("The capital of France is", max_tokens=6, temperature=0, logprobs=3)
    lp = text["choices"][0]["logprobs"]
    assert "".join(lp["tokens"]) == text["choices"][0]["text"] and len(lp["top_logprobs"][0]) == 3
    assert lp["text_offset"] == [sum(len(t) for t in lp["tokens"][:i]) for i in range(len(lp["tokens"]))]


def test_penalties_and_biases_through_the_python_surfaces(qwen_small_auto, qwen_small_plain):
    """create_completion and create_chat_completion take llama-cpp-python's and OpenAI's names and
    give generate's text with the same settings; a bias on a token outside the vocabulary is an error.
    Both on plain decoding from a fresh context, whose rows are the same bit for bit: the names are
    checked here, exactly (speculation under penalties: test_fidelity, up to near-ties, as verify
    rows are not bit for bit single rows and auto's drafting follows the machine's timings)."""
    shaping = dict(repeat_penalty=1.3, presence_penalty=0.4, frequency_penalty=0.2)
    qwen_small_plain.reset()
    ours = qwen_small_plain.create_completion(PROMPTS[1], max_tokens=40, temperature=0, logit_bias={"11": -100},
                                              **shaping)
    qwen_small_plain.reset()
    plain = qwen_small_plain.generate(PROMPTS[1], max_tokens=40, temperature=0, logit_bias={11: -100}, **shaping)
    assert ours["choices"][0]["text"] == plain.text and 11 not in plain.tokens
    with pytest.raises(ConfigError, match="logit_bias names token 999999, which is not in the vocabulary"):
        qwen_small_auto.create_completion("hi", logit_bias={"999999": 1.0})


def first_difference(ours, theirs) -> int:
    return next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), min(len(ours), len(theirs)))


def assert_mirostat_as_alone(ref, prompt, tokens, expected, sampling: SamplingConfig, seed: int) -> None:
    """``tokens`` equal ``expected`` (sampled alone with ``seed``), or leave them first where the
    position's number falls within 0.02 of the edge between the two tokens in mirostat's
    distribution there (mu replayed along ``expected`` on one-token-at-a-time rows)."""
    first = first_difference(tokens, expected)
    if first == len(expected):
        assert tokens == expected
        return
    state = Mirostat.start(sampling)
    for j in range(first):
        state.advance(state.distribution(ref.row_after(prompt, expected[:j])), expected[j])
    dist = state.distribution(ref.row_after(prompt, expected[:first]))
    u = Uniforms(seed)(len(prompt) + first)
    near = {sample_at(dist, float(np.clip(u + d, 0, 1 - 1e-9))) for d in np.linspace(-0.02, 0.02, 41)}
    assert {tokens[first], expected[first]} <= near, f"token {first}: {tokens[first]} against {expected[first]}"


def assert_greedy_as(tokens, plain) -> int:
    """``tokens`` equal ``plain``'s (a greedy run with logprobs=2), or leave them first where
    plain's two best tokens nearly tie; how many agree."""
    first = first_difference(tokens, plain.tokens)
    if first < len(plain.tokens):
        (_, best), (_, second) = plain.logprobs[first].top
        assert best - second < NEAR_TIE, f"token {first}: {tokens[first]} against {plain.tokens[first]}"
    return first


def test_mirostat_and_llama_cpp_python_s_callbacks_under_speculation_are_plain_decoding_s(qwen_small_plain,
                                                                                          module_spec, reference):
    """On the copy-heavy edit, lookup verified every step: mirostat 2 (mu carried down each
    verified path) samples with a seed what plain decoding samples; a logits processor that bans
    a token gives the text a logit bias banning it gives; a stopping criterion ends the text
    before the token it names, with finish reason "stop". (Each up to near-ties: a row of a
    verify batch is not bit for bit the row computed alone.)"""
    lookup = module_spec(QWEN_DRAFT, spec="lookup", fixed=("lookup",))
    prompt = lookup.tokenize(PROMPTS[2])
    sampled = dict(max_tokens=48, temperature=1.0, seed=5, mirostat=2, mirostat_tau=3.0)
    ours = lookup.generate(PROMPTS[2], **sampled)
    plain = qwen_small_plain.generate(PROMPTS[2], **sampled)
    assert ours.stats.n_accept > 8
    assert_mirostat_as_alone(reference(QWEN_DRAFT), prompt, ours.tokens, plain.tokens,
                             SamplingConfig(temperature=1.0, mirostat=2, mirostat_tau=3.0), 5)
    # llama-cpp-python's arguments: no temperature before mirostat (0.8 only says "sample")
    surface = qwen_small_plain.create_completion(PROMPTS[2], max_tokens=48, temperature=0.8, seed=5, mirostat_mode=2,
                                                 mirostat_tau=3.0)
    assert surface["choices"][0]["text"] == plain.text
    n = len(prompt)  # the edit's prompt, still cached in both: the stopping criterion next

    def twelve(input_ids, logits):
        return len(input_ids) >= n + 12
    cut = lookup.generate(PROMPTS[2], max_tokens=40, temperature=0, stopping_criteria=twelve)
    assert cut.stop_reason == "stop" and len(cut.tokens) == 12
    assert_greedy_as(cut.tokens, qwen_small_plain.generate(PROMPTS[2], max_tokens=12, temperature=0, logprobs=2))
    served = lookup.create_completion(PROMPTS[2], max_tokens=40, temperature=0, stopping_criteria=[twelve])
    assert served["choices"][0]["finish_reason"] == "stop" and served["usage"]["completion_tokens"] == 12
    story = dict(max_tokens=32, temperature=0.8, seed=5)  # a text with many choices: mirostat changes them
    mirostat = qwen_small_plain.create_completion("Once upon a time", mirostat_mode=2, mirostat_tau=8.0, **story)
    unchanged = qwen_small_plain.create_completion("Once upon a time", **story)
    assert mirostat["choices"][0]["text"] != unchanged["choices"][0]["text"]

    def ban(input_ids, scores):
        scores[11] = -np.inf  # ","
        return scores
    banned = lookup.generate(PROMPTS[0], max_tokens=24, temperature=0, logits_processor=[ban])
    biased = qwen_small_plain.generate(PROMPTS[0], max_tokens=24, temperature=0, logit_bias={11: float("-inf")},
                                      logprobs=2)
    unbanned = qwen_small_plain.generate(PROMPTS[0], max_tokens=24, temperature=0)
    changed = first_difference(biased.tokens, unbanned.tokens)
    assert 11 in unbanned.tokens and 11 not in banned.tokens and assert_greedy_as(banned.tokens, biased) > changed


def assert_body(middle: str, context: str = "") -> None:
    """``middle`` completes HEAD into a function that parses and returns the median of [3, 1, 2]
    (``context``: code the model was shown before HEAD, such as an import it may use)."""
    code = HEAD + middle + TAIL
    ast.parse(code)
    space: dict = {}
    exec(context + HEAD + middle, space)  # noqa: S102 -- the model's own function body, run on a list
    assert space["median"]([3, 1, 2]) == 2 and space["median"]([4, 1, 3, 2]) in (2.5, 2, 3)


def test_fill_in_the_middle_completes_a_function_body(qwen_small_auto, qwen_small_plain):
    """create_completion(prompt, suffix=...) as llama-cpp-python lays it out: the model writes the
    body between the head and the tail and stops there; speculation gives plain decoding's text."""
    ours = qwen_small_auto.create_completion(HEAD, suffix=TAIL, max_tokens=120, temperature=0)
    middle = ours["choices"][0]["text"]
    assert ours["choices"][0]["finish_reason"] == "stop"
    assert_body(middle)
    plain = qwen_small_plain.create_completion(HEAD, suffix=TAIL, max_tokens=120, temperature=0)
    assert middle == plain["choices"][0]["text"]
    fim = qwen_small_auto.model.fim_tokens()
    tokens = qwen_small_auto.fim_tokens(HEAD, TAIL)
    assert tokens[0] == fim["pre"] and tokens[-1] == fim["mid"] and fim["suf"] in tokens


def assert_answers_alike(model, ref, prompt, text, expected, label=""):
    """Two greedy answers to ``prompt`` from ``model`` (with speculation): the same, or parting first
    at a near-tie. A later call may copy an earlier call's answer from lookup's history and verify
    it in one batch, which moves a row of the 0.5B by up to 0.34 (docs/results.md)."""
    ours, theirs = (model.tokenize(t, add_special=False) for t in (text, expected))
    assert_as_alone(ref, model.tokenize(prompt), ours, theirs, label)


def test_echo_returns_the_prompt_then_the_text(qwen_small_auto, reference):
    prompt = "The capital of France is"
    answer = qwen_small_auto.create_completion(prompt, max_tokens=5, temperature=0, echo=True)["choices"][0]["text"]
    alone = qwen_small_auto.create_completion(prompt, max_tokens=5, temperature=0)["choices"][0]["text"]
    assert answer.startswith(prompt) and len(answer) > len(prompt)
    assert_answers_alike(qwen_small_auto, reference(QWEN_DRAFT), prompt, answer[len(prompt):], alone, "echo")
    chunks = list(qwen_small_auto.create_completion(prompt, max_tokens=5, temperature=0, echo=True, stream=True))
    assert chunks[0]["choices"][0]["text"] == prompt
    streamed = "".join(c["choices"][0]["text"] for c in chunks)
    assert_answers_alike(qwen_small_auto, reference(QWEN_DRAFT), prompt, streamed[len(prompt):], alone, "streamed")


def test_echo_with_logprobs_scores_the_prompt(qwen_small_auto, reference):
    """OpenAI's legacy scoring: the prompt's tokens with their log-probabilities (the first has
    none), read by the model as one text, then the answer's, as a run without echo gives them."""
    prompt = "The capital of France is"
    tokens = qwen_small_auto.tokenize(prompt)
    answer = qwen_small_auto.create_completion(prompt, max_tokens=5, temperature=0, echo=True, logprobs=2)
    alone = qwen_small_auto.create_completion(prompt, max_tokens=5, temperature=0, logprobs=2)
    lp, own = answer["choices"][0]["logprobs"], alone["choices"][0]["logprobs"]
    text = answer["choices"][0]["text"]
    assert "".join(lp["tokens"]) == text and text.startswith(prompt)
    n = len(tokens)
    assert_answers_alike(qwen_small_auto, reference(QWEN_DRAFT), prompt, text[len(prompt):],
                         alone["choices"][0]["text"], "echo")
    # where the tokens agree, their log-probabilities come from decodes of other shapes (the prompt
    # read with the echo, drafts of other lengths, a copied answer verified in one batch)
    same = first_difference(lp["tokens"][n:], own["tokens"])
    assert same > 0 and np.allclose(lp["token_logprobs"][n:n + same], own["token_logprobs"][:same], atol=NEAR_TIE)
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    expected = reference(QWEN_DRAFT).prompt_logprobs(tokens)
    assert np.allclose(lp["token_logprobs"][1:n], expected, atol=1e-4), (lp["token_logprobs"][1:n], expected)
    assert all(len(top) == 2 and max(top.values()) >= value - 1e-6
               for top, value in zip(lp["top_logprobs"][1:n], lp["token_logprobs"][1:n]))
    assert lp["text_offset"][n] == len(prompt)
    chunks = list(qwen_small_auto.create_completion(prompt, max_tokens=5, temperature=0, echo=True, logprobs=2,
                                                    stream=True))
    assert chunks[0]["choices"][0]["text"] == prompt and chunks[0]["choices"][0]["logprobs"] == {
        key: value[:n] for key, value in lp.items()}
    streamed = "".join(c["choices"][0]["text"] for c in chunks)
    assert_answers_alike(qwen_small_auto, reference(QWEN_DRAFT), prompt, streamed[len(prompt):], text[len(prompt):],
                         "streamed")
    samples = qwen_small_auto.create_completion(prompt, max_tokens=3, temperature=0.8, seed=3, n=2, echo=True,
                                                logprobs=1)
    first, second = (c["logprobs"]["token_logprobs"][:n] for c in samples["choices"])
    assert first == second and np.allclose(first[1:], expected, atol=1e-4)


def test_nothing_to_generate_ends_at_once(qwen_small_auto):
    result = qwen_small_auto.generate("The capital of France is", max_tokens=0, temperature=0)
    assert result.text == "" and result.tokens == [] and result.stop_reason == "length"


@pytest.mark.parametrize("arguments, fragment", [
    ({"echo": True, "logprobs": 1, "suffix": "x"}, "echo with logprobs and a suffix"),
    ({"logits_processor": [3]}, "logits_processor is a function of \\(input_ids, logits\\) or a list of them"),
    ({"mirostat_mode": 3}, "mirostat is 0 \\(off\\), 1 or 2"),
    ({"repeat_penalty": 0.0}, "repeat penalty must be a finite number > 0"),
    ({"logprobs": 21}, "log-probabilities are asked for the 0 to 20"),
    ({"suffix": "x", "prompt": [1, 2]}, "suffix needs a text prompt"),
])
def test_what_is_still_refused_is_refused_by_name(qwen_small_auto, arguments, fragment):
    prompt = arguments.pop("prompt", "hi")
    with pytest.raises(ConfigError, match=fragment):
        qwen_small_auto.create_completion(prompt, **arguments)


def test_a_model_without_fim_tokens_says_so(smol_plain):
    with pytest.raises(ConfigError, match="SmolLM2-135M-Instruct.Q4_1.gguf has no fill-in-the-middle tokens"):
        smol_plain.create_completion("def f():", suffix="\n")


def test_the_cli_takes_llama_cpp_s_penalty_and_mirostat_flags(qwen_small_plain, model_file):
    flags = ["--repeat-penalty", "1.3", "--repeat-last-n", "32", "--presence-penalty", "0.2", "--frequency-penalty",
             "0.1", "-l", "11-inf"]
    out = run("generate", "-m", str(model_file(QWEN_DRAFT)), "-t", str(THREADS), "-c", "2048", "--spec", "none",
              "--temp", "0", "-n", "24", "--json", "-p", PROMPTS[1], *flags)
    assert out.exit_code == 0, out.stderr
    plain = qwen_small_plain.generate(PROMPTS[1], max_tokens=24, temperature=0, repeat_penalty=1.3, penalty_last_n=32,
                                      presence_penalty=0.2, frequency_penalty=0.1, logit_bias={11: float("-inf")})
    assert json.loads(out.stdout)["text"] == plain.text
    flags = ["--temp", "0.7", "--seed", "4", "--mirostat", "1", "--mirostat-ent", "3", "--mirostat-lr", "0.2"]
    out = run("generate", "-m", str(model_file(QWEN_DRAFT)), "-t", str(THREADS), "-c", "2048", "--spec", "none",
              "-n", "24", "--json", "-p", PROMPTS[0], *flags)
    assert out.exit_code == 0, out.stderr
    plain = qwen_small_plain.generate(PROMPTS[0], max_tokens=24, temperature=0.7, seed=4, mirostat=1, mirostat_tau=3.0,
                                      mirostat_eta=0.2)
    assert json.loads(out.stdout)["text"] == plain.text
    assert_one_line_error(run("generate", "-m", str(model_file(QWEN_DRAFT)), "-p", "hi", "-l", "11x"),
                          "--logit-bias takes TOKEN_ID(+/-)BIAS")
    assert_one_line_error(run("generate", "-m", str(model_file(QWEN_DRAFT)), "-p", "hi", "--mirostat", "3"),
                          "--mirostat")


@pytest.fixture(scope="module")
def qwen_server(model_file):
    """The 1.5B: given llama-server's /infill layout (a file of the repository before the head),
    the 0.5B answers with a fence and prose where the 1.5B writes the body."""
    server = Server("-m", str(model_file(QWEN)), "-t", str(THREADS), "-c", "2048")
    yield server
    server.stop()


def test_the_server_serves_fim_logprobs_and_penalties(qwen_server):
    """The openai client's suffix, logprobs and penalties; llama-server's /infill, whole and streamed."""
    client = qwen_server.client()
    answer = client.completions.create(model="x", prompt=HEAD, suffix=TAIL, max_tokens=120, temperature=0,
                                       logprobs=2, frequency_penalty=0.0, presence_penalty=0.0)
    middle = answer.choices[0].text
    assert_body(middle)
    assert "".join(answer.choices[0].logprobs.tokens) == middle and answer.choices[0].finish_reason == "stop"
    chat = client.chat.completions.create(model="x", messages=[{"role": "user", "content": "Name a colour."}],
                                          max_tokens=6, temperature=0, logprobs=True, top_logprobs=3,
                                          presence_penalty=0.5, extra_body={"repeat_penalty": 1.2,
                                                                            "logit_bias": {"11": -100}})
    assert len(chat.choices[0].logprobs.content[0].top_logprobs) == 3
    story = client.completions.create(model="x", prompt="Once upon a time", max_tokens=8, temperature=0.8, seed=3,
                                      extra_body={"mirostat": 2, "mirostat_tau": 4.0, "tfs_z": 0.9})
    assert story.choices[0].text and story.choices[0].finish_reason == "length"
    scored = client.completions.create(model="x", prompt="The capital of France is", max_tokens=2, temperature=0,
                                       echo=True, logprobs=1)
    lp = scored.choices[0].logprobs
    assert "".join(lp.tokens) == scored.choices[0].text and scored.choices[0].text.startswith("The capital of France is")
    assert lp.token_logprobs[0] is None and all(v is not None and v <= 0 for v in lp.token_logprobs[1:])
    status, native = qwen_server.request("POST", "/infill", {"input_prefix": HEAD, "input_suffix": TAIL,
                                                              "input_extra": [{"filename": "stats.py",
                                                                               "text": "import statistics\n"}],
                                                              "n_predict": 120, "temperature": 0})
    assert status == 200 and native["stop"] and native["tokens_predicted"] > 0, native
    body = native["content"].split("\n\n")[0]  # with llama-server's layout this model goes on past the tail
    assert_body(body, "import statistics\n")
    status, bad = qwen_server.request("POST", "/infill", {"input_prefix": HEAD})
    assert status == 400 and "input_suffix" in bad["error"]["message"]
