"""Measuring tools: ``llamaspec bench`` (strategies on a prompt suite, in one process),
``llamaspec compare`` (llama.cpp's own programs side by side), ``llamaspec agreement`` (how often
a candidate model agrees with the target) and replays of recorded answers (no model).

    settings.py     the settings every strategy shares; the strategies (which sources each runs)
    suite.py        the shipped prompt suite
    bench.py        run_bench: interleaved runs, one row per strategy and prompt
    compare.py      run_compare: llama.cpp's programs, their command lines, parsing their output
    report.py       the reports' dataclasses, the table, the JSON shape derived from them
    memory.py       resident memory of the process
    plot.py         the bar chart
    agreement.py    agreement of a quantization or a draft model with the target, token by token
    divergence.py   where two greedy texts part, and whether at a near-tie
    replay.py       a recorded answer replayed through sources and planner; the copy-oracle bound
"""

from .compare import PROGRAMS, CompareReport, matched, run_compare
from .plot import require_matplotlib, write_plot
from .report import BenchReport, Machine, format_columns, shape_of, validate
from .bench import run_bench
from .settings import STRATEGIES, BenchSettings, build_spec
from .suite import SUITES, SuitePrompt, load_suite

__all__ = ["PROGRAMS", "STRATEGIES", "BenchReport", "BenchSettings", "CompareReport", "Machine", "SuitePrompt",
           "SUITES", "build_spec", "format_columns", "load_suite", "matched", "require_matplotlib", "run_bench", "run_compare",
           "shape_of", "validate", "write_plot"]
