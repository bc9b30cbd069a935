"""Lookup decoding on real models: greedy equality, statistics, references, caches, CLI."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from click.testing import CliRunner

from llamaspec import ConfigError, Grammar, LookupConfig, SamplingConfig
from llamaspec.cli import cli
from llamaspec.planning.acceptance_model import AcceptanceModel
from llamaspec.sources.base import Budget, length_bucket
from llamaspec.errors import CacheFormatError
from llamaspec.sources.lookup import FRESH, OWN_MATCH, Anchored, LookupSource, Matched
from llamaspec.sources.ngram_cache import NgramCache

from conftest import DATA, QWEN_DRAFT, ROOT, SMOL, chatml
from checks import assert_kv_invariant, check_greedy, check_stats, generate_checked


SHIPPED = ROOT / "llamaspec" / "data"  # the prompts llamaspec ships
CODE_EDIT = (SHIPPED / "baseline_type_hints.txt").read_text()
OPEN_CHAT = (SHIPPED / "open_chat.txt").read_text()


@pytest.fixture(scope="module")
def qwen_lookup(module_spec):
    return module_spec(QWEN_DRAFT, spec="lookup")


def test_code_edit_is_mostly_copied(module_spec):
    """Lookup's own proposals, verified whole every step: what is accepted depends on the text
    only, not on how the planner reads this machine's timings. (Qwen2.5-Coder-0.5B: the same copy
    at a third of the 1.5B's time.)"""
    spec = module_spec(QWEN_DRAFT, spec="lookup", fixed=("lookup",))
    result = spec.generate(CODE_EDIT, max_tokens=64, temperature=0)
    assert result.stats.n_accept > 40, result.stats.summary()
    assert result.stats.tokens_per_call > 1.5


def test_an_answer_opening_as_the_prompts_code_block_copies_from_it(qwen_plain):
    """The target's answer to the type-hint prompt opens with the fence of the prompt's code
    block: after those two tokens lookup copies the block, rated as a copy of them (fresh, at 2
    on), and the copy is the answer's own next tokens up to the first type hint."""
    prompt = qwen_plain.tokenize(CODE_EDIT)
    answer = qwen_plain.generate(prompt, max_tokens=20, temperature=0).tokens
    assert qwen_plain.detokenize(answer[:2]) == "```python"
    source = LookupSource(piece=qwen_plain.model.piece)
    greedy = SamplingConfig(temperature=0)
    source.propose([*prompt, answer[0]], Budget(16), greedy, np.random.default_rng(0))
    first = source.propose([*prompt, *answer[:2]], Budget(16), greedy, np.random.default_rng(0)).candidates[0]
    assert first.evidence[:3] == tuple(Anchored(FRESH, at) for at in (2, 3, 4))
    assert first.tokens[:12] == tuple(answer[2:14]), qwen_plain.detokenize(answer)


def test_an_answer_saying_its_own_phrases_again_copies_itself_as_such(qwen_plain):
    """The target's explanation of hash tables says its own phrases again (a hash table, the
    collisions): lookup's anchor moves into the answer, and its candidates there are rated as
    the text copying itself (own evidence), below a copy of the prompt; so
    are n-gram matches of at least OWN_MATCH tokens that only the answer went on like."""
    prompt = qwen_plain.tokenize(chatml("Explain in detail how a hash table works: hash functions, buckets, "
                                        "collision handling by chaining and by open addressing, load factor "
                                        "and resizing."))
    answer = qwen_plain.generate(prompt, max_tokens=128, temperature=0).tokens
    source = LookupSource(piece=qwen_plain.model.piece)
    greedy = SamplingConfig(temperature=0)
    own = own_matches = 0
    for k in range(1, len(answer)):
        text = [*prompt, *answer[:k]]
        found = source.propose(text, Budget(16), greedy, np.random.default_rng(0)).candidates
        for cand in found:
            if isinstance(cand.evidence[0], Matched) and cand.evidence[0].own:  # a match the answer alone went on like
                assert any(text[e - OWN_MATCH:e] == text[-OWN_MATCH:] and text[e] == cand.tokens[0]
                           for e in range(len(prompt) + OWN_MATCH, len(text)))
                own_matches += 1
        anchor = source.lookup.anchor
        if anchor is None or not found or isinstance(found[0].evidence[0], Matched):
            continue  # no anchor, or it has nothing to copy: n-gram matches only
        in_answer = anchor.index == 0 and anchor.pos >= len(prompt)
        assert all(e.own == in_answer for e in found[0].evidence)
        own += in_answer
    assert own >= 5 and own_matches >= 5, (own, own_matches, qwen_plain.detokenize(answer))
    model = AcceptanceModel()
    assert model.rate("lookup", Anchored(FRESH, 0, own=True)) < model.rate("lookup", Anchored(FRESH, 0))
    alone = length_bucket(OWN_MATCH)  # agreeing on OWN_MATCH tokens, nothing else going on so
    assert model.rate("lookup", Matched(1, alone, own=True)) < model.rate("lookup", Matched(1, alone))


def test_kv_invariant_with_lookup_and_sampling(qwen_lookup):
    (result,) = generate_checked(qwen_lookup, qwen_lookup.tokenize(CODE_EDIT), max_tokens=40, temperature=0.7, seed=3)
    check_stats(result.stats, 40)


GREET = '''def greet(name):
    """Say hello to "name"."""
    if not name:
        raise ValueError("a name, please")
    return f"Hello, {name}!"
'''
FILE_SCHEMA = {"type": "object", "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
               "required": ["path", "content"], "additionalProperties": False}


def test_a_file_copied_into_a_json_string_is_followed_in_the_prompts_escaped_view(module_spec, qwen_lookup, reference):
    """Asked to write a file of its prompt as JSON, the model writes the file escaped (``\\n``,
    ``\\"``): lookup, reading the prompt's escaped view, offers the next token right far more
    often than without it, and the text is plain decoding's, every cache checked after each step."""
    plain = module_spec(QWEN_DRAFT, spec="none")
    messages = [{"role": "user", "content": f"Here is greet.py:\n\n{GREET}\nWrite it unchanged as JSON: its path, "
                                            "then its content."}]
    prompt, _ = plain.chat_prompt(messages)
    grammar = Grammar.json_schema(FILE_SCHEMA)
    answer = plain.generate(prompt, max_tokens=96, temperature=0, grammar=grammar)
    assert '\\n    if not name:\\n' in answer.text, answer.text
    (result,) = generate_checked(qwen_lookup, prompt, max_tokens=96, temperature=0, grammar=grammar)
    check_greedy(reference(QWEN_DRAFT), prompt, answer.tokens, result.tokens, "qwen 0.5b lookup, escaped", n=96)
    tokenize = lambda text: plain.model.tokenize(text, add_special=False, parse_special=False)  # noqa: E731
    right = {}
    for name, source in (("view", LookupSource(piece=plain.model.piece, tokenize=tokenize)),
                         ("none", LookupSource(piece=plain.model.piece))):
        offered = [source.propose([*prompt, *answer.tokens[:i]], Budget(8), SamplingConfig(temperature=0),
                                  np.random.default_rng(0)).candidates for i in range(len(answer.tokens))]
        right[name] = sum(bool(c) and c[0].tokens[0] == t for c, t in zip(offered, answer.tokens))
    assert right["view"] >= right["none"] + 10, (right, answer.text)
    # the LlamaSpec's lookup reads the view too: more accepted than lookup without it offers right
    assert result.stats.n_accept > right["none"] + 5, result.stats.summary()


def test_reference_documents_are_copied(make_spec, smol_plain, reference):
    """A reference the prompt does not contain (here: an earlier answer) is copied from."""
    prompt = chatml("Write a short story about a lighthouse keeper who finds a message in a bottle.")
    smol_plain.reset()
    earlier = smol_plain.generate(prompt, max_tokens=64, temperature=0)
    without = make_spec(SMOL, spec="lookup").generate(prompt, max_tokens=64, temperature=0)
    spec = make_spec(SMOL, spec="lookup", references=[earlier.text])
    with_ref = spec.generate(prompt, max_tokens=64, temperature=0)
    for result in (with_ref, without):
        check_greedy(reference(SMOL), spec.tokenize(prompt), earlier.tokens, result.tokens, "smollm2 lookup", n=64)
    assert with_ref.stats.n_accept >= 32 > without.stats.n_accept, (with_ref.stats.summary(),
                                                                   without.stats.summary())


def test_dynamic_cache_is_written_and_reused(make_spec, tmp_path):
    path = tmp_path / "dynamic.bin"
    spec = make_spec(SMOL, spec="lookup", lookup_cache_dynamic=str(path))
    first = spec.generate(chatml("List the days of the week."), max_tokens=32, temperature=0)
    assert path.is_file() and len(NgramCache.load(path)) > 0
    again = make_spec(SMOL, spec="lookup", lookup_cache_dynamic=str(path))
    second = again.generate(chatml("List the days of the week."), max_tokens=32, temperature=0)
    assert second.tokens == first.tokens


def test_bad_cache_files(make_spec, tmp_path, model_file):
    text = tmp_path / "notes.txt"
    text.write_text("not a cache at all\n")
    with pytest.raises(CacheFormatError):
        make_spec(SMOL, spec="lookup", lookup_cache_static=str(text))
    big = NgramCache({(200000,): {1: 1}})
    other_vocab = tmp_path / "other.bin"
    big.save(other_vocab)
    with pytest.raises(CacheFormatError, match="vocabulary"):
        make_spec(SMOL, spec="lookup", lookup_cache_static=str(other_vocab))
    with pytest.raises(ConfigError):
        LookupConfig(ngram_min=3, ngram_max=2)


def run(*args):
    return CliRunner().invoke(cli, list(args))


def test_cli_lookup_generate_create_and_stats(model_file, tmp_path):
    smol = str(model_file(SMOL))
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("def add(a, b):\n    return a + b\n\n" * 20)
    cache = tmp_path / "static.bin"
    created = run("lookup", "create", "-m", smol, "-o", str(cache), str(corpus))
    assert created.exit_code == 0, created.stderr
    assert len(NgramCache.load(cache)) > 0
    ref = tmp_path / "ref.txt"
    ref.write_text("def add(a, b):\n    return a + b\n")
    out = run("generate", "-m", smol, "--lookup", "--reference", str(ref), "--lookup-cache-static", str(cache),
              "-p", chatml("Write the add function."), "-n", "24", "--temp", "0", "--json")
    plain = run("generate", "-m", smol, "-p", chatml("Write the add function."), "-n", "24", "--temp", "0", "--json")
    assert out.exit_code == 0, out.stderr
    assert json.loads(out.stdout)["text"] == json.loads(plain.stdout)["text"]
    assert json.loads(out.stdout)["stats"]["strategy"] == "lookup"
    stats = run("lookup", "stats", "-m", smol, "-f", str(corpus))
    assert stats.exit_code == 0, stats.stderr
    assert "n_drafted" in stats.stdout and "n_accept" in stats.stdout


def test_cli_lookup_stats_replays_a_copy_into_a_json_string_from_the_escaped_view(model_file, tmp_path):
    """The replay reads the prompt's escaped view as generation does: a file of the prompt
    written as a JSON string is mostly accepted (without the view: 18 of 60 tokens)."""
    prompt, text = tmp_path / "prompt.txt", tmp_path / "text.json"
    prompt.write_text(f"Here is greet.py:\n\n{GREET}\nWrite it as JSON.")
    text.write_text(json.dumps({"path": "greet.py", "content": GREET}))
    stats = run("lookup", "stats", "-m", str(model_file(QWEN_DRAFT)), "--prompt", str(prompt), "-f", str(text))
    assert stats.exit_code == 0, stats.stderr
    accepted = re.search(r"n_accept\s*=\s*(\d+)", stats.stdout)
    assert accepted and int(accepted.group(1)) >= 36, stats.stdout


@pytest.mark.parametrize("args, fragment", [
    (["--reference", "/nonexistent/ref.txt"], "cannot read reference"),
    (["--lookup-cache-static", "NOTES"], "not a valid n-gram cache"),
    (["--lookup", "--lookup-ngram-min", "3", "--lookup-ngram-max", "2"], "n-gram sizes"),
])
def test_cli_lookup_bad_input(model_file, tmp_path, args, fragment):
    notes = tmp_path / "notes.txt"
    notes.write_text("hello\n")
    args = [str(notes) if a == "NOTES" else a for a in args]
    result = run("generate", "-m", str(model_file(SMOL)), "-p", "hi", *args)
    assert result.exit_code != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and fragment in lines[0], result.stderr


def test_static_cache_equals_llama_lookup_create(model_file, tmp_path):
    """tests/data/lookup_create_smollm2.bin was written by llama.cpp's own llama-lookup-create
    (built by scripts/build_llama_cpp.sh) from llamaspec/data/baseline_type_hints.txt:
        llama-lookup-create -m SmolLM2-135M-Instruct.Q4_1.gguf -f baseline_type_hints.txt -lcs FILE
    Ours, from the same text and tokenizer, must hold exactly the same n-grams and counts."""
    theirs = NgramCache.load(DATA / "lookup_create_smollm2.bin")
    ours_file = tmp_path / "ours.bin"
    result = run("lookup", "create", "-m", str(model_file(SMOL)), "-o", str(ours_file),
                 str(SHIPPED / "baseline_type_hints.txt"))
    assert result.exit_code == 0, result.stderr
    ours = NgramCache.load(ours_file)
    assert len(theirs) > 100
    assert ours == theirs
    # what we write of their cache is byte for byte their file (records keep their order)
    resaved = tmp_path / "resaved.bin"
    theirs.save(resaved)
    assert resaved.read_bytes() == (DATA / "lookup_create_smollm2.bin").read_bytes()


def test_lookup_and_a_draft_model_are_verified_in_one_trie(make_spec, smol_plain, reference):
    """Both sources every step, their candidates merged: no source waits for another to fail."""
    spec = make_spec(SMOL, SMOL, spec="lookup,draft", fixed=("draft",), draft_max=4, draft_p_min=0.0)
    prompt = chatml("Fix the spelling and repeat: 'The quik brown fox jumps over the lazy dog. "
                    "The quik brown fox jumps over the lazy dog.'")
    plain = smol_plain.generate(prompt, max_tokens=48, temperature=0)
    both = spec.generate(prompt, max_tokens=48, temperature=0)
    check_greedy(reference(SMOL), spec.tokenize(prompt), plain.tokens, both.tokens, "smollm2 lookup+draft", n=48)
    sources = both.stats.sources
    assert sources["draft"].drafted > 0 and sources["lookup"].drafted > 0
    assert both.stats.n_accept > 0
    assert_kv_invariant(spec)
