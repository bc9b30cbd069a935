"""Download, assemble and verify models from models.txt; print each cached path.

    python scripts/fetch_models.py NAME... [--cache DIR] [--quiet]
"""

from __future__ import annotations

import argparse
import sys
from typing import List, Optional

from llamaspec.errors import LlamaspecError
from llamaspec.llama.models import fetch


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description="Fetch models named in models.txt into the cache.")
    parser.add_argument("names", nargs="+", metavar="NAME", help="model names from models.txt")
    parser.add_argument("--cache", help="cache directory (default: $LLAMASPEC_CACHE or the platform cache)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)
    try:
        for name in args.names:
            print(fetch(name, cache=args.cache, progress=not args.quiet), flush=True)
    except LlamaspecError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
