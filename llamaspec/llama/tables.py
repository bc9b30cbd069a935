"""A JSON object in a file beside the models (cost curves, cached answers): read forgivingly,
replaced atomically, so that concurrent runs never see half a file."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Optional


def read_table(path: Optional[Path]) -> dict:
    """The file's object; empty when the file is missing or unreadable."""
    if path is None or not path.is_file():
        return {}
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def write_table(path: Path, table: dict) -> None:
    """Replace the file with ``table``. A cache that cannot be written only costs the work again
    next time, so an OSError is ignored."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            json.dump(table, f, indent=1)
        os.replace(tmp, path)
    except OSError:
        pass
