"""Verification and generation: the target's decodes, exact acceptance, stops, many texts at once.

    acceptance.py  the acceptance rules: the target's choice down a trie, greedy or sampled (exact)
    engine.py      one text: one llama_decode per step, one place that rolls caches back
    lanes.py       several texts: every live lane's rows in one llama_decode
    text.py        text out of tokens: stop strings, what is safe to show
    generation.py  one generation as a stream of chunks, its result and statistics
    scheduler.py   requests on lanes, first come first served
    batcher.py     a thread that steps the scheduler for requests from any thread (the server's)
    stats.py       per-generation statistics
"""
