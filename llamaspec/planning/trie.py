"""Candidates merged into a token trie, and the trie laid out as one verify batch.

Node 0 is the root: the pending token, accepted but in no cache yet. Every other node is a
candidate token; candidates that share a prefix share its nodes, so a shared prefix is one
batch row. Each leaf gets a KV-cache sequence (the first leaf keeps sequence 0, the accepted
text), and a row belongs to the sequence of every leaf below it: each path then attends to
exactly its own tokens. Rows that ride along (lookahead's window) follow, on their own
sequences. Three candidates ``a b c``, ``a d`` and ``e`` after the pending token ``I``
(``describe()`` draws this from the code's own layout)::

    I ─ a ─ b ─ c
    │   └ d
    └ e

    row      0  1  2  3  4  5
    token    I  a  b  c  d  e
    depth    0  1  2  3  2  1
    seq 0    x  x  x  x  .  .
    seq 1    x  x  .  .  x  .
    seq 2    x  .  .  .  .  x

Before the decode every other sequence shares sequence 0's cells (the accepted text); after
it the accepted path's cells join sequence 0 and every other sequence is emptied, so between
steps only sequence 0 holds cells.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

from ..sources.base import Candidate
from ..sampling import Distribution
from ..sequences import BatchRow

class Trie:
    """Token trie of candidate prefixes. Nodes are numbered parents first; node 0 is the root."""

    def __init__(self, root_token: int) -> None:
        self.token: List[int] = [root_token]
        self.parent: List[int] = [-1]
        self.depth: List[int] = [0]
        self.children: List[Dict[int, int]] = [{}]
        self.q: List[Optional[Distribution]] = [None]  # the draft's q where a node was sampled from one
        self.support: List[List[Tuple[int, int]]] = [[]]  # (candidate index, position) behind each node

    def __len__(self) -> int:
        return len(self.token)

    @staticmethod
    def build(root_token: int, candidates: Sequence[Candidate], lengths: Sequence[int]) -> "Trie":
        """The trie of ``candidates[c].tokens[:lengths[c]]`` for every c."""
        trie = Trie(root_token)
        for c, (cand, n) in enumerate(zip(candidates, lengths)):
            trie.add(c, cand, n)
        return trie

    def add(self, index: int, cand: Candidate, length: int) -> None:
        node = 0
        children, support, q = self.children, self.support, cand.q  # planning builds a trie or two a step
        for pos, token in enumerate(cand.tokens[:length]):
            child = children[node].get(token)
            if child is None:
                child = len(self.token)
                self.token.append(token)
                self.parent.append(node)
                self.depth.append(self.depth[node] + 1)
                children.append({})
                self.q.append(None)
                support.append([])
                children[node][token] = child
            if q is not None:
                self.q[child] = q[pos]
            support[child].append((index, pos))
            node = child

    def path(self, node: int) -> List[int]:
        """The nodes from the root's child down to ``node``."""
        nodes = []
        while node > 0:
            nodes.append(node)
            node = self.parent[node]
        return nodes[::-1]

    def sources(self, node: int, candidates: Sequence[Candidate]) -> Tuple[str, ...]:
        """The sources that proposed ``node``, each once."""
        return tuple(dict.fromkeys(candidates[c].source for c, _ in self.support[node]))

    def drafted(self, candidates: Sequence[Candidate]) -> Dict[str, int]:
        """Each source's candidate tokens in the trie (a token two sources proposed counts for both)."""
        out: Dict[str, int] = {}
        for v in range(1, len(self.token)):
            for name in self.sources(v, candidates):
                out[name] = out.get(name, 0) + 1
        return out

    def layout(self) -> "Layout":
        """Sequences for the leaves (depth first, the first leaf on sequence 0) and one batch row
        per node."""
        if len(self.token) == 1:  # a plain step's
            return Layout([], [0], 1)
        seqs: List[List[int]] = [[] for _ in self.token]
        n_seqs = 0
        stack = [0]
        order = []
        while stack:  # depth first, children in insertion order
            node = stack.pop()
            order.append(node)
            kids = list(self.children[node].values())
            if not kids:
                seq = n_seqs
                n_seqs += 1
                while node >= 0:
                    seqs[node].append(seq)
                    node = self.parent[node]
            stack.extend(reversed(kids))
        rows = [BatchRow(self.token[v], self.depth[v], tuple(sorted(seqs[v])), True) for v in range(1, len(self))]
        return Layout(rows, [min(s) for s in seqs], max(n_seqs, 1))


@dataclass(frozen=True)
class Layout:
    """``rows[v - 1]`` is node v's batch row (row 0 is the root's); ``seq[v]`` is a sequence
    holding node v's whole path (the one to keep when v is the last accepted node)."""

    rows: List[BatchRow]
    seq: List[int]
    n_seqs: int


def describe(trie: Trie, names: Optional[Dict[int, str]] = None) -> str:
    """The trie and its batch layout as text (the module docstring's diagram)."""
    name = (lambda t: names.get(t, str(t))) if names else str

    def block(node: int) -> List[str]:
        label = name(trie.token[node])
        kids = list(trie.children[node].values())
        if not kids:
            return [label]
        first = block(kids[0])
        bar = ("│" if len(kids) > 1 else " ") + " " * (len(label) + 2)
        lines = [f"{label} ─ {first[0]}"] + [(bar + line).rstrip() for line in first[1:]]
        for i, kid in enumerate(kids[1:], 2):
            last = i == len(kids)
            sub = block(kid)
            lines.append(("└ " if last else "├ ") + sub[0])
            lines += [("  " if last else "│ ") + line for line in sub[1:]]
        return lines

    layout = trie.layout()
    n = len(trie)
    width = max(max(len(name(t)) for t in trie.token), len(str(n - 1))) + 2
    cell = lambda s: s.rjust(width)  # noqa: E731
    table = ["row    " + "".join(cell(str(v)) for v in range(n)),
             "token  " + "".join(cell(name(t)) for t in trie.token),
             "depth  " + "".join(cell(str(d)) for d in trie.depth)]
    for s in range(layout.n_seqs):
        marks = ["x"] + ["x" if s in layout.rows[v - 1].seq_ids else "." for v in range(1, n)]
        table.append(f"seq {s}  " + "".join(cell(m) for m in marks))
    return "\n".join(block(0) + [""] + [line.rstrip() for line in table])
