"""Verification and generation: the target's decodes, exact acceptance, stops, many texts at once.

    verification.py  the verification rule: the target's choice down a trie, greedy or sampled (exact)
    target.py        what a lane's target chooses from a row, and the walk that carries its state
    engine.py        the verify loop over lanes: every live lane's rows (one text: one lane) in one
                     llama_decode per step, one place that rolls caches back
    text.py          text out of tokens: stop strings, what is safe to show
    generation.py    one generation's chunks, result and statistics, step by step
    scheduler.py     requests (one text, n samples) on lanes, first come first served: where a text
                     stops; the streams a caller reads
    batcher.py       a thread that steps the scheduler for requests from any thread (the server's)
    stats.py         per-generation statistics
"""
