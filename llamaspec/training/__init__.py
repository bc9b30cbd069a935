"""Training on this machine from the target's own hidden states and tokens.

    data.py     what heads learn from: the target's hidden states and its own tokens on a
                text (files given, or a default mix: its answers to a set of prompts, source
                code and package documentation found on the machine)
    fit.py      the heads (sources/heads.py's shape) fitted to them with numpy; held-out agreement
    train.py    `llamaspec heads train`: read, fit, write the file
"""

from .data import States, collect, default_texts
from .fit import Report, TrainConfig, train
from .train import train_heads

__all__ = ["Report", "States", "TrainConfig", "collect", "default_texts", "train", "train_heads"]
