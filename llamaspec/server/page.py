"""The chat page ``llamaspec serve`` shows at ``GET /``: plain HTML, CSS and JavaScript shipped
with the package (``static/``), no build step and nothing fetched from elsewhere, so it works
offline. It talks to the server's own /v1/chat/completions and colours each token by its
provenance (the ``sources`` of each streamed chunk)."""

from __future__ import annotations

from importlib import resources
from typing import Tuple

from starlette.exceptions import HTTPException

# the page's files and their media types
FILES = {"index.html": "text/html; charset=utf-8", "chat.js": "text/javascript; charset=utf-8",
         "chat.css": "text/css; charset=utf-8"}
# the paths that serve them (the API key does not guard them: they hold no data, the page asks for it)
PAGE_PATHS = frozenset({"/"} | {f"/page/{name}" for name in FILES})


def page_file(name: str) -> Tuple[bytes, str]:
    """The bytes and media type of one of the page's files; 404 for any other name."""
    if name not in FILES:
        raise HTTPException(404, f"no page file {name!r}")
    return (resources.files(__package__) / "static" / name).read_bytes(), FILES[name]
