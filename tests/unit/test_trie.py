"""Candidates merged into a token trie and its batch layout (no model)."""

import llamaspec.planning.trie as trie_module
from llamaspec.sources.base import Candidate
from llamaspec.sampling import Distribution
from llamaspec.planning.trie import Trie, describe

NAMES = {0: "I", 1: "a", 2: "b", 3: "c", 4: "d", 5: "e"}
EXAMPLE = [Candidate((1, 2, 3), "lookup", (1, 1, 1)), Candidate((1, 4), "lookahead", (1, 1)),
           Candidate((5,), "draft", (1,))]


def test_shared_prefixes_are_one_node():
    trie = Trie.build(0, EXAMPLE, [3, 2, 1])
    assert trie.token == [0, 1, 2, 3, 4, 5] and trie.parent == [-1, 0, 1, 2, 1, 0]
    assert trie.depth == [0, 1, 2, 3, 2, 1]
    assert trie.support[1] == [(0, 0), (1, 0)] and trie.sources(1, EXAMPLE) == ("lookup", "lookahead")
    assert trie.path(3) == [1, 2, 3]
    assert len(Trie.build(0, EXAMPLE, [1, 1, 0])) == 2  # only the first tokens of the first two


def test_layout_puts_each_row_on_the_sequence_of_every_leaf_below_it():
    trie = Trie.build(0, EXAMPLE, [3, 2, 1])
    layout = trie.layout()
    assert layout.n_seqs == 3
    rows = {trie.token[v]: row for v, row in zip(range(1, len(trie)), layout.rows)}
    assert rows[1] == (1, 1, (0, 1), True)  # a: under leaves c (seq 0) and d (seq 1)
    assert rows[3][2] == (0,) and rows[4][2] == (1,) and rows[5][2] == (2,)
    for v in range(1, len(trie)):  # the sequence kept when v is the last accepted node holds v's path
        seq = layout.seq[v]
        assert all(seq in layout.rows[u - 1][2] for u in trie.path(v))
    single = Trie.build(0, EXAMPLE[:1], [3]).layout()
    assert single.n_seqs == 1 and all(row[2] == (0,) for row in single.rows)  # a linear draft: sequence 0


def test_a_sampled_token_keeps_its_q():
    q = Distribution.point(1)
    trie = Trie.build(0, [EXAMPLE[0], Candidate((1,), "draft", (5,), (q,))], [3, 1])
    assert trie.q[1] is q and trie.q[2] is None


def test_the_module_diagram_is_the_code_s_own_layout():
    drawn = describe(Trie.build(0, EXAMPLE, [3, 2, 1]), NAMES)
    doc = "\n".join(line[4:] for line in trie_module.__doc__.splitlines())
    assert drawn in doc, drawn
