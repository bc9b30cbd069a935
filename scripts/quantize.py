"""Re-quantize a model with llama.cpp's own quantizer (through llama-cpp-python), to compare
quantizations with ``llamaspec agreement``.

    python scripts/quantize.py MODEL TYPE [TYPE ...] [--out-dir DIR] [-t THREADS]

MODEL is a GGUF path or a models.txt name; each TYPE (Q8_0, Q6_K, Q4_0, Q2_K, ...) gives
DIR/<model>.<TYPE>.gguf. Already-quantized tensors are re-quantized (llama-quantize's
--allow-requantize), so the copies carry the source's own quantization loss too.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from llamaspec.llama import models
from llamaspec.llama.binding import QUANT_TYPES, quantize
from llamaspec.config import default_threads


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model")
    parser.add_argument("types", nargs="+", choices=sorted(QUANT_TYPES), metavar="TYPE")
    parser.add_argument("--out-dir", type=Path, default=Path("."))
    parser.add_argument("-t", "--threads", type=int, default=default_threads())
    args = parser.parse_args()
    source = models.resolve_model(args.model)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    for kind in args.types:
        out = args.out_dir / f"{source.stem}.{kind}.gguf"
        quantize(source, out, kind, args.threads)
        print(out)


if __name__ == "__main__":
    main()
