"""Prompt lookup and its anchor, the n-gram cache source (no model)."""

from __future__ import annotations

from llamaspec import CacheConfig, SamplingConfig
from llamaspec.sources.base import Budget, length_bucket
from llamaspec.sources.lookup import (CONTESTED, FRESH, IN_STEP, OUT_OF_STEP, OWN_MATCH, RESUMED, Anchored, LookupSource,
                                      Matched, PromptLookup, TokenIndex)
from llamaspec.sources.ngram_cache import CacheSource, NgramCache, NgramCaches

GREEDY = SamplingConfig(temperature=0)


def test_token_index_maps_ngrams_to_following_positions_and_follows_cuts():
    idx = TokenIndex(1, 2)
    idx.extend([1, 2, 3])
    idx.extend([1, 2])
    assert idx.ends((1, 2)) == [2, 5] and idx.ends((2,)) == [2, 5] and idx.ends((3, 1)) == [4]
    assert idx.ends((9,)) == []
    idx.follow([1, 2, 3, 7])  # cut back to [1, 2, 3], then 7
    fresh = TokenIndex(1, 2)
    fresh.extend([1, 2, 3, 7])
    assert idx.tokens == fresh.tokens and dict(idx._ends) == dict(fresh._ends)


def test_finds_the_continuations_of_the_longest_match_first():
    lookup = PromptLookup(1, 3)
    lookup.follow([5, 6, 7, 8, 9, 1, 6, 7])
    found = lookup.find(3, 4)
    assert found[0][0] == [8, 9, 1]
    assert found[0][1][0] == Matched(1, length_bucket(2))  # "6 7" agrees: two tokens, one occurrence
    assert PromptLookup(2, 4).find(5, 4) == []


def test_a_match_is_rated_by_how_the_other_occurrences_go_on():
    """After "5" (each occurrence after a different token, so all agree on one token): support
    counts the occurrences that went on like the candidate so far, and says CONTESTED from the
    first token where one of them went on differently."""
    def contested(n):
        return Matched(CONTESTED, n)

    def two(n):
        return Matched(2, n)

    def three(n):
        return Matched(3, n)

    def evidence(text, cont):
        lookup = PromptLookup(1, 1)
        lookup.follow(text)
        return dict((tuple(c), e) for c, e in lookup.find(4, 4))[cont]

    runs = [10, 5, 6, 7, 8, 11, 5, 6, 7, 8, 12, 5, 6, 7, 9, 13]
    assert evidence(runs + [5, 4, 14, 5], (6, 7, 8, 12)) == (contested(1), contested(2), contested(3), contested(4))
    assert evidence(runs + [5], (6, 7, 8, 12)) == (three(1), three(2), contested(3), contested(4))
    assert evidence(runs[:11] + [5], (6, 7, 8, 12)) == (two(1), two(2), two(3), contested(4))


def test_occurrences_that_disagree_are_separate_candidates_best_context_first():
    # "9" is followed by 11 (after "7 9") and by 22 and 33 (after "8 9"); the text ends "8 9"
    lookup = PromptLookup(1, 2)
    lookup.follow([1, 7, 9, 11, 0, 2, 8, 9, 22, 0, 3, 8, 9, 33, 0, 4, 7, 9, 11, 0, 5, 8, 9])
    firsts = [cont[0] for cont, _ in lookup.find(1, 4)]
    assert set(firsts[:2]) == {22, 33} and 11 in firsts


def test_references_are_searched_but_not_joined_to_the_history():
    lookup = PromptLookup(2, 2, references=[[40, 41, 42, 43]])
    lookup.follow([1, 2, 40, 41])
    assert lookup.find(2, 4)[0][0] == [42, 43]
    assert lookup.history.tokens == [1, 2, 40, 41]


def test_the_anchor_resumes_the_copy_after_an_edit():
    """Copying 10..29 with 99 98 inserted after 15: the copy resumes at 16, which no n-gram of
    the text's last tokens (99 98) finds."""
    source = list(range(10, 30))
    lookup = PromptLookup(1, 4, references=[source])
    text = [1, 10, 11, 12, 13, 14, 15]
    lookup.follow(text[:1])  # the prompt
    lookup.follow(text)
    first = lookup.find(8, 4)[0]
    assert first[0][:3] == [16, 17, 18] and first[1][0] == Anchored(FRESH, 0)  # just set: not trusted yet
    text += [16, 17, 18, 19]
    lookup.follow(text)
    cont, evidence = lookup.find(8, 4)[0]
    assert cont[0] == 20 and evidence[0].state == IN_STEP  # in step: copied 4
    text += [99, 98]  # the edit
    lookup.follow(text)
    cont, evidence = lookup.find(8, 4)[0]
    assert cont[0] == 20 and evidence[0] == Anchored(OUT_OF_STEP, 0)  # still offered, as out of step
    text += [20]  # the copy resumes
    lookup.follow(text)
    assert lookup.find(8, 4)[0][0][:2] == [21, 22]


def test_a_text_that_opens_as_a_copy_sets_the_anchor_there():
    """An answer whose first two tokens (50 51) occur once in the prompt, as a code block's
    opening fence does, copies from there: the anchor is set with those two counted as copied,
    though fewer than MOVE tokens agree. One token, or two that occur twice going on
    differently, set nothing: the continuation is then an n-gram match like any other."""
    prompt = [1, 2, 50, 51, 52, 53, 54, 55, 3]
    lookup = PromptLookup(1, 4)
    lookup.follow([*prompt, 50])
    assert lookup.anchor is None
    lookup.follow([*prompt, 50, 51])
    cont, evidence = lookup.find(8, 4)[0]
    assert cont[:4] == [52, 53, 54, 55] and evidence[:3] == (Anchored(FRESH, 2), Anchored(FRESH, 3), Anchored(FRESH, 4))

    twice = [1, 50, 51, 60, 2, 50, 51, 52, 53, 3]  # 50 51 goes on 60, then 52
    contested = PromptLookup(1, 4)
    contested.follow([*twice, 50])
    contested.follow([*twice, 50, 51])
    found = contested.find(8, 4)
    assert contested.anchor is None and {cont[0] for cont, _ in found} == {52, 60}
    assert all(isinstance(e, Matched) for _, evidence in found for e in evidence)


def test_an_anchor_in_the_text_being_written_has_evidence_of_its_own():
    """The same four tokens said again: where they were first said in the answer, the copy is
    rated as the text copying itself (own evidence); where the prompt said them, as a copy of
    the prompt."""
    prompt = [1, 2, 3]
    answer = [10, 11, 12, 13, 14, 20, 10, 11, 12, 13]
    own = PromptLookup(1, 4)
    own.follow([*prompt, answer[0]])  # the answer starts at its first token
    own.follow([*prompt, *answer])
    cont, evidence = own.find(8, 4)[0]
    assert cont[:3] == [14, 20, 10] and evidence[:3] == tuple(Anchored(FRESH, at, own=True) for at in range(3))

    quoted = PromptLookup(1, 4)
    quoting = [1, 10, 11, 12, 13, 14, 20, 2]  # the prompt says them first
    quoted.follow([*quoting, 5, 10])
    quoted.follow([*quoting, 5, 10, 11, 12, 13])  # all four copied: in step at once
    cont, evidence = quoted.find(8, 4)[0]
    assert cont[:2] == [14, 20] and evidence[:2] == (Anchored(IN_STEP, 0), Anchored(IN_STEP, 0))


def test_a_match_only_the_text_being_written_goes_on_like_has_evidence_of_its_own():
    """Two tokens said again: where only the answer said them before, the match's tokens are
    rated as the text copying itself (own, alone); where the prompt said them, or where the
    match agrees on fewer than OWN_MATCH tokens, as a match."""
    prompt = [1, 2, 3]
    answer = [10, 11, 12, 13, 20, 21, 22, 10, 11]
    own = PromptLookup(1, 4)
    own.follow([*prompt, answer[0]])  # the answer starts at its first token
    own.follow([*prompt, *answer])
    (cont, evidence), = own.find(3, 4)
    assert cont == [12, 13, 20]
    assert evidence == tuple(Matched(1, length_bucket(OWN_MATCH + j), own=True) for j in range(3))

    quoted = PromptLookup(1, 4)
    quoting = [1, 10, 11, 12, 13, 20, 2]  # the prompt says them first
    quoted.follow([*quoting, 30])
    quoted.follow([*quoting, 30, 31, 32, 10, 11])
    (cont, evidence), = quoted.find(3, 4)
    assert cont == [12, 13, 20] and evidence == tuple(Matched(1, length_bucket(2 + j)) for j in range(3))

    short = PromptLookup(1, 4)
    short.follow([*prompt, 10])
    short.follow([*prompt, 10, 11, 12, 30, 31, 32, 11])  # agrees on one token only
    (cont, evidence), = short.find(3, 4)
    assert cont == [12, 30, 31] and evidence == tuple(Matched(1, length_bucket(1 + j)) for j in range(3))


def test_the_text_being_written_starts_after_each_prompt():
    source = LookupSource()
    prompt = [1, 2, 50, 51, 52, 53, 3]
    source.propose([*prompt, 50], Budget(8), GREEDY, None)
    source.finish([*prompt, 50, 51, 52])
    source.propose([*prompt, 50, 51, 52, 4, 5, 50], Budget(8), GREEDY, None)  # the next prompt, answered
    assert source.lookup.start == len(prompt) + 5


def test_edit_classes_learn_where_the_text_departs_from_its_source():
    source = [5, 1, 2, 3, 5, 4, 6, 7, 5, 8, 9, 5, 10]  # token 5 ends each "line"
    lookup = PromptLookup(1, 4, references=[source])
    text = [0, 5, 1, 2, 3, 5, 4, 6, 7, 77, 8, 9, 77, 10]  # 5 kept once in the copy, then twice 77
    for i in range(4, len(text) + 1):
        lookup.follow(text[:i])
        lookup.find(8, 4)
    assert lookup.edits[5] == (1, 2)
    assert lookup._edit_class(5) == 3 and lookup._edit_class(6) == 1 and lookup._edit_class(2) == 0


def test_a_fresh_copy_ends_where_the_text_always_departed_from_the_source():
    """A summary quotes sentences of its source, each up to its period (5), and then starts a
    new line (77) where the source goes on: once the text has departed at 5 and never copied
    it, a fresh copy (just realigned) rates 5 as the edited token it is, not as the rest of a
    fresh copy. (A JSON record written from "key: value" lines departs at every ':' alike.)"""
    source = [1, 2, 3, 4, 5, 10, 11, 12, 13, 5, 20, 21, 22, 5, 30, 31, 32, 5]
    lookup = PromptLookup(1, 4, references=[source])
    text = [0, 7, 1, 2, 3, 4, 77, 10, 11, 12]  # after a word of its own, one sentence quoted, the second begun
    for i in range(2, len(text) + 1):
        lookup.follow(text[:i])
        lookup.find(8, 4)
    assert lookup.edits[5] == (0, 1)
    cont, evidence = lookup.find(8, 4)[0]
    assert cont[:2] == [13, 5]
    assert evidence[0].state == FRESH  # the copy is fresh ...
    assert evidence[1] == Anchored(IN_STEP, 0, edit=3)  # ... but 5 was always edited


def test_a_token_the_text_departed_from_twice_and_never_kept_has_a_class_of_its_own():
    """After two quoted sentences that each ended a line where the source went on, the period
    (5) is all but certain to end the next quote too: class 4, apart from tokens edited less
    consistently (class 3)."""
    source = [1, 2, 3, 4, 5, 10, 11, 12, 13, 5, 20, 21, 22, 23, 5, 30, 31, 32, 5]
    lookup = PromptLookup(1, 4, references=[source])
    text = [0, 1, 2, 3, 4, 77, 10, 11, 12, 13, 77, 20, 21, 22]
    for i in range(2, len(text) + 1):
        lookup.follow(text[:i])
        lookup.find(8, 4)
    assert lookup.edits[5] == (0, 2) and lookup._edit_class(5) == 4
    cont, evidence = lookup.find(8, 4)[0]
    assert cont[:2] == [23, 5] and evidence[1] == Anchored(IN_STEP, 0, edit=4)


def test_the_end_of_a_sentence_not_met_yet_has_a_class_of_its_own():
    """A copy that has not yet met a sentence's end rates the source's first one by class 5
    (quotes often stop there); a period inside a name (``self.x``: no space after) is class 0."""
    words = {1: b" The", 2: b" clock", 3: b" ran", 4: b" fast", 5: b".", 6: b" It", 7: b" self", 8: b"x",
             9: b" stopped", 0: b"\n"}
    # " The clock ran fast It stopped clock ran self.x stopped ran. It stopped"
    source = [1, 2, 3, 4, 6, 9, 2, 3, 7, 5, 8, 9, 3, 5, 6, 9]
    lookup = PromptLookup(1, 4, references=[source], piece=lambda t: words[t])
    text = [0, 1, 2, 3, 4, 6, 9, 2, 3]  # in step: copied four tokens since the anchor was set
    for i in range(2, len(text) + 1):
        lookup.follow(text[:i])
        lookup.find(16, 4)
    cont, evidence = lookup.find(16, 4)[0]
    assert cont[:6] == [7, 5, 8, 9, 3, 5]
    assert evidence[1] == Anchored(IN_STEP, 0) and evidence[5] == Anchored(IN_STEP, 0, edit=5)


def test_lookup_source_proposes_up_to_the_budget():
    source = LookupSource(1, 4, max_len=5)
    tokens = [1, 2, 3, 4, 5, 6, 1, 2]
    proposal = source.propose(tokens, Budget(max_len=3, max_candidates=2), GREEDY, None)
    assert proposal.candidates[0].tokens == (3, 4, 5) and proposal.candidates[0].source == "lookup"
    assert len(proposal.candidates) <= 2 and all(len(c.evidence) == len(c.tokens) for c in proposal.candidates)
    assert source.propose([1, 2], Budget(max_len=3), GREEDY, None).candidates == ()


def test_ngram_caches_follow_draft_and_persist(tmp_path):
    path = tmp_path / "dynamic.bin"
    caches = NgramCaches.open(CacheConfig(dynamic=str(path)))
    caches.validate_vocab(100)
    source = CacheSource(caches)
    proposal = source.propose([1, 2, 3, 4, 1, 2, 3], Budget(max_len=2), GREEDY, None)
    assert proposal.candidates[0].tokens[0] == 4 and proposal.candidates[0].source == "cache"
    source.finish([1, 2, 3, 4, 1, 2, 3])
    assert NgramCache.load(path).get((2, 3)) == {4: 1}
    source.finish([1, 2, 3, 4, 1, 2, 3, 4])  # only the new n-grams are added
    assert NgramCache.load(path).get((2, 3)) == {4: 2}


def words(pieces):
    """The bytes of a token: its own text where given, else a word of its own."""
    return lambda t: pieces.get(t, b" w%d" % t)


def test_the_copy_resumes_where_an_edit_split_a_source_token():
    """``total(self):\\n`` edited to ``total(self) -> int:\\n``: the text's last token ``:\\n``
    never occurs in the source where the copy left off (the source has ``):\\n`` there, one
    token), but its text ends that token, so the copy resumes right after it, and not after the
    ``wait:\\n`` further on, one byte longer a match (``t:\\n``) but far from where the copy
    left off. Comparing tokens finds only that one."""
    pieces = {1: b"def total", 2: b"(self", 3: b"):\n", 4: b"    return", 5: b" x", 6: b"\n",
              7: b")", 8: b" ->", 9: b" int", 10: b":\n", 11: b"    wait"}
    source = [20, 21, 22, 23, 24, 25, 26, 1, 2, 3, 4, 5, 6, 27, 28, 11, 10, 29]
    text = [99, 20, 21, 22, 23]
    for piece in (words(pieces), None):
        lookup = PromptLookup(1, 4, references=[source], piece=piece)
        lookup.follow(text)
        lookup.find(8, 4)  # the anchor: after 23, four tokens agree
        edited = text + [24, 25, 26, 1, 2] + [7, 8, 9, 10]  # copied five, then the edit
        for n in range(len(text) + 1, len(edited) + 1):
            lookup.follow(edited[:n])
        cont, evidence = lookup.find(8, 4)[0]
        if piece is None:  # tokens alone: the wrong place
            assert cont == [29]
        else:  # a trusted copy taken up again after a short edit
            assert cont[:3] == [4, 5, 6] and evidence[0] == Anchored(RESUMED, 0)


def test_a_realignment_inside_an_insertion_is_undone_when_the_copy_does_not_go_on():
    """The insertion ``: dict[str, InventoryItem]`` holds a long piece of text that also occurs
    further on in the source; the anchor moves there, the next token is not copied from there,
    so it goes back to where the copy left off, and the copy resumes there."""
    pieces = {40: b": dict[str,", 41: b" InventoryItem", 42: b"]"}
    source = [10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 41, 30, 31]
    lookup = PromptLookup(1, 4, references=[source], piece=words(pieces))
    text = [99, 10, 11, 12, 13]
    lookup.follow(text)
    lookup.find(8, 4)  # the anchor: 14 next
    text += [40, 41]
    lookup.follow(text)
    assert lookup.find(8, 4)[0][0][:2] == [30, 31]  # 41 occurs 9 tokens on: taken for the copy resuming
    text += [42, 14]  # it does not; the copy resumes where it left off
    for n in (len(text) - 1, len(text)):
        lookup.follow(text[:n])
    assert lookup.find(8, 4)[0][0][:3] == [15, 16, 17]


def test_a_copy_into_a_json_string_is_found_in_the_prompts_escaped_view():
    """A tool call copies a file of the prompt into a JSON string: each line break written
    ``\\n``, each quote ``\\"``. With a byte for a token, the call's last four tokens (``\\n  r``)
    occur nowhere in the prompt, which has a real line break there; its escaped view has them,
    and the escaped continuation follows. Without a tokenizer there is no view."""
    def piece(t: int) -> bytes:
        return bytes([t])

    def tokenize(text: str) -> list:
        return list(text.encode())

    prompt = list(b'file:\ndef f():\n  return "ok"\nend\n')
    text = prompt + list(b'{"arguments": {"content": "def f():\\n  r')
    escaped = PromptLookup(1, 4, piece=piece, tokenize=tokenize)
    escaped.follow(prompt)
    escaped.follow(text)
    assert bytes(escaped.find(24, 4)[0][0]) == b'eturn \\"ok\\"\\nend\\n'
    plain = PromptLookup(1, 4, piece=piece)
    plain.follow(prompt)
    plain.follow(text)
    assert all(not bytes(cont).startswith(b"eturn \\") for cont, _ in plain.find(16, 4))
    # the next prompt gets its own view; the old one's anchor is dropped with it
    escaped.end_text()
    nxt = list(b'other "x"\n')
    escaped.follow(nxt)
    assert bytes(escaped.escaped.tokens) == b'other \\"x\\"\\n' and escaped.anchor is None


def test_the_escaped_view_adds_nothing_where_the_text_copies_the_prompt_as_it_is():
    """Copying the prompt's text itself, every occurrence in the escaped view agrees no longer
    than the prompt's own (it parts at the line break): the candidates and their evidence are
    those found without the view."""
    def piece(t: int) -> bytes:
        return bytes([t])

    prompt = list(b'file:\ndef f():\n  return "ok"\nend\n')
    text = prompt + list(b'def f():\n  r')
    found = []
    for tokenize in (lambda s: list(s.encode()), None):
        lookup = PromptLookup(1, 4, piece=piece, tokenize=tokenize)
        lookup.follow(prompt)
        lookup.follow(text)
        found.append(lookup.find(24, 4))
    assert found[0] == found[1] and bytes(found[0][0][0]).startswith(b'eturn "ok"\nend')
