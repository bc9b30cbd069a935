"""What to verify each step: the sources' candidates, how likely each token is accepted, what
verifying costs on this machine, and the token trie that is best per unit of cost.

    acceptance_model.py  per (source, evidence) acceptance estimates, learned online
    costs.py             the measured cost of a decode of n rows, refined online
    shape.py             what a decode costs after the last one, where row counts matter (a GPU's graphs)
    trie.py              candidates merged into a token trie, and its batch layout
    planner.py           the sub-trie with the most expected tokens per unit of cost
    speculator.py        one step: ask the sources, plan; everyone learns from the outcome
"""
