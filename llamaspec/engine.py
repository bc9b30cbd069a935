"""The verify loop every strategy shares.

State between steps: ``tokens`` is the accepted sequence. Its last token is *pending*: it was
just chosen and no cache holds it yet. Every context's sequence 0 holds exactly
``tokens[:-1]`` (positions 0 .. n_past - 1) at the end of each step.

One step::

    proposal = drafter.propose(tokens)            # d_1 .. d_k, maybe none
    target.decode([tokens[-1], d_1 .. d_k])       # ONE llama_decode, logits for every row
    accept d_1 .. d_m, then one token from the target (the correction, or the bonus when m == k)
    roll every cache back to tokens[:-1]          # Engine._rewind, the only place that trims

A proposal may instead be a Tree (lookahead): several candidates, each on its own KV-cache
sequence, plus rows that ride along. The same step verifies it: the accepted candidate's
cells join sequence 0 and every other sequence is dropped.
"""

from __future__ import annotations

import time
from typing import Iterator, List, Sequence, Tuple

import numpy as np

from ._llama import Context
from .acceptance import verify_branches, verify_greedy, verify_sampled
from .config import SamplingConfig
from .drafters import Drafter, Proposal, Tree
from .errors import PromptError
from .sampling import Distribution, sample, transform
from .stats import Stats


class Engine:
    """A target context and a drafter, driven step by step."""

    def __init__(self, target: Context, drafter: Drafter) -> None:
        self.target = target
        self.drafter = drafter
        self.tokens: List[int] = []

    def contexts(self) -> List[Context]:
        return [self.target, *self.drafter.contexts()]

    def prefill(self, prompt: Sequence[int], stats: Stats) -> None:
        """Evaluate ``prompt`` but its last token, reusing whatever prefix the caches hold."""
        if not prompt:
            raise PromptError("the prompt is empty")
        n_ctx = min(ctx.n_ctx for ctx in self.contexts())
        if len(prompt) >= n_ctx:
            raise PromptError(f"the prompt has {len(prompt)} tokens but the context holds {n_ctx}; "
                              f"raise the context size (-c) or shorten the prompt")
        t0 = time.perf_counter()
        self.tokens = list(prompt)
        try:
            stats.n_prompt_eval = self.target.sync(self.tokens, len(self.tokens) - 1)
            self.drafter.prefill(self.tokens)
        except BaseException:
            self._rewind(len(self.tokens))
            raise
        stats.n_prompt = len(prompt)
        stats.t_prompt = time.perf_counter() - t0

    def steps(self, sampling: SamplingConfig, rng: np.random.Generator, max_new: int,
              stats: Stats) -> Iterator[Tuple[List[int], int]]:
        """Yield (new tokens, how many of them came from the draft) after each target call.

        Stops by itself only when the context is full or ``max_new`` tokens were emitted;
        the caller stops it earlier by closing the generator (the caches stay consistent).
        """
        n_ctx = self.target.n_ctx
        emitted = 0
        try:
            while emitted < max_new and len(self.tokens) <= n_ctx:
                # The step emits at most k + 1 tokens and needs positions n_past .. n_past + k.
                k_max = min(max_new - emitted - 1, n_ctx - len(self.tokens), self.target.n_batch - 1)
                t0 = time.perf_counter()
                proposal = self.drafter.propose(self.tokens, k_max, sampling, rng) if k_max > 0 else Proposal()
                stats.t_draft += time.perf_counter() - t0
                accepted, token = self._verify(proposal, sampling, rng)
                new = accepted + [token]
                self.tokens.extend(new)
                self._rewind(len(self.tokens))
                self.drafter.accepted(self.tokens, len(proposal), len(accepted))
                stats.record_step(len(proposal), len(accepted), len(new), proposal.depth)
                emitted += len(new)
                yield new, len(accepted)
        finally:
            self._rewind(len(self.tokens))

    def _verify(self, proposal: Proposal, sampling: SamplingConfig,
                rng: np.random.Generator) -> Tuple[List[int], int]:
        """Evaluate the pending token and the draft in one batch; return (accepted, next token)."""
        if proposal.tree is not None:
            return self._verify_tree(proposal.tree, sampling, rng)
        draft = proposal.tokens
        self.target.eval([self.tokens[-1], *draft], logits="all")
        rows = self.target.logits(len(draft) + 1)  # row i is p(. | tokens, d_1 .. d_i)
        if sampling.greedy:
            n, token = verify_greedy(rows.argmax(axis=1), np.asarray(draft, dtype=np.int64))
        else:
            q = proposal.q or [Distribution.point(x) for x in draft]
            n, token = verify_sampled(lambda i: transform(rows[i], sampling), q, draft, rng)
        return draft[:n], token

    def _verify_tree(self, tree: Tree, sampling: SamplingConfig,
                     rng: np.random.Generator) -> Tuple[List[int], int]:
        n_out = self.target.eval_rows(self.tokens[-1], tree.rows)
        rows = self.target.logits(n_out)
        tree.on_decoded(rows)
        if sampling.greedy:
            def choose(r: int) -> int:
                return int(rows[r].argmax())
        else:
            def choose(r: int) -> int:  # a sample of p at that row
                return sample(transform(rows[r], sampling), rng)
        b, n, token = verify_branches(choose, tree.branches, tree.outputs)
        accepted = tree.branches[b][:n] if n else []
        self.target.keep_branch(tree.seqs[b] if n else 0, accepted)
        return accepted, token

    def rewind(self, n: int) -> None:
        """Keep the first ``n`` accepted tokens (the n-th becomes the pending one)."""
        del self.tokens[n:]
        self._rewind(n)

    def _rewind(self, n: int) -> None:
        # Every cache must hold a prefix of tokens[:n - 1]; drafts past it are dropped here.
        for ctx in self.contexts():
            ctx.truncate(min(len(ctx.tokens), max(n - 1, 0)))
