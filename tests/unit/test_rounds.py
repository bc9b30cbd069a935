"""Draftings run in rounds (sources/rounds.py), on a fake draft model: one decode a round for
every drafting still going, the text several start from read once, each drafting given the
logits after its own tokens and charged its share of each round."""

from __future__ import annotations

from typing import List, Sequence

import numpy as np

from llamaspec.config import SamplingConfig
from llamaspec.llama.binding import KVSequence
from llamaspec.sources import rounds
from llamaspec.sources.base import Budget, Candidate, Proposal, Read, Source

from fakes import FakeContext, fake_prompt, logits_of


def reader(seq: KVSequence, reads: Sequence[Sequence[int]]) -> rounds.Drafting:
    """Reads each of ``reads`` in turn on ``seq``; proposes the argmax after each."""
    seen: List[int] = []
    for tokens in reads:
        logits = yield Read(seq, tuple(tokens))
        seen.append(int(logits.argmax()))
    return Proposal((Candidate(tuple(seen), "reader", (0,) * len(seen)),))


def argmaxes(text: Sequence[int], reads: Sequence[Sequence[int]]) -> List[int]:
    """What ``reader`` should see: the fake model's argmax after each read."""
    out, text = [], list(text)
    for tokens in reads:
        text += tokens
        out.append(int(logits_of(text).argmax()))
    return out


def test_draftings_share_each_round_and_read_a_common_text_once():
    ctx = FakeContext(n_ctx=512, n_batch=64, n_seq_max=3)
    seqs = [KVSequence(ctx, s) for s in range(3)]
    prompt = fake_prompt(20, 3)
    reads = [
        [prompt + [1], [2], [3]],      # three rounds
        [prompt + [4], [5]],           # the same prompt, its own pending token: two rounds
        [fake_prompt(10, 4)],          # another text: one round
    ]
    results = rounds.together([reader(seq, r) for seq, r in zip(seqs, reads)])
    # round 1: the prompt once (20 rows, on sequences 0 and 1), the two pending tokens, the other text
    assert ctx.decodes == [20 + 2 + 10, 2, 1]
    for seq, r, (proposal, seconds) in zip(seqs, reads, results):
        text = [t for tokens in r for t in tokens]
        assert ctx.cells(seq.seq) == seq.tokens == text
        assert list(proposal.candidates[0].tokens) == argmaxes([], r)
        assert [n for n, _ in proposal.decodes] == [len(tokens) for tokens in r]  # its rows each round
        assert seconds >= sum(s for _, s in proposal.decodes) > 0


def test_a_drafting_alone_decodes_as_it_reads():
    ctx = FakeContext(n_ctx=512, n_batch=16, n_seq_max=1)
    seq = KVSequence(ctx, 0)
    long = fake_prompt(40, 5)  # more than a batch: what does not fit with the last token is read first
    proposal = rounds.alone(reader(seq, [long, [7]]))
    assert ctx.decodes == [16, 8, 16, 1]
    assert ctx.cells(0) == long + [7]
    assert list(proposal.candidates[0].tokens) == argmaxes([], [long, [7]])
    assert [n for n, _ in proposal.decodes] == [40, 1]  # charged for every row it asked for


def test_a_source_that_decodes_nothing_drafts_its_proposal():
    class Fixed(Source):
        name = "fixed"
        expensive = True

        def propose(self, tokens, budget, sampling, rng):
            return Proposal((Candidate((9,), self.name, (0,)),))

    drafting = Fixed().drafting([1, 2], Budget(4), SamplingConfig(temperature=0), np.random.default_rng(0))
    ((proposal, _),) = rounds.together([drafting])
    assert proposal.candidates[0].tokens == (9,) and proposal.decodes == ()
