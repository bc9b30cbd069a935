"""``llamaspec serve``: an OpenAI-compatible HTTP server over one LlamaSpec.

Needs the optional extra ``llamaspec[server]`` (FastAPI, uvicorn). ``app.py`` holds the routes,
the request queue and the error mapping; ``schemas.py`` the request bodies.
"""

from __future__ import annotations

import logging
import socket
import sys
from typing import Any, Optional

from ..errors import ConfigError

INSTALL_HINT = "llamaspec serve needs the server extra: pip install 'llamaspec[server]'"


def require_server() -> None:
    """ConfigError telling how to install the server's dependencies when they are missing."""
    try:
        import fastapi  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError:
        raise ConfigError(INSTALL_HINT) from None


def check_address(host: str, port: int) -> None:
    """ConfigError when ``host:port`` cannot be listened on (in use, not this machine's), checked
    before any model loads."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as e:
        raise ConfigError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        try:
            s.bind(address)
        except OSError as e:
            raise ConfigError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None


def serve(spec: Any, host: str = "127.0.0.1", port: int = 8080, queue: int = 16,
          api_key: Optional[str] = None, parallel: int = 1, grammar: Any = None) -> None:
    """Serve ``spec`` until interrupted, logging one line per request on stderr; ``parallel`` > 1:
    that many requests decoded together (a Batcher); ``grammar``: the constraint of every request
    that asks for none of its own."""
    require_server()
    import uvicorn

    from .app import create_app

    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", "%H:%M:%S"))
    logger = logging.getLogger("llamaspec.server")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    batcher = spec.batcher(parallel) if parallel > 1 else None
    try:
        uvicorn.run(create_app(spec, queue, api_key, batcher, grammar), host=host, port=port, log_level="warning",
                    access_log=False, timeout_graceful_shutdown=5)
    finally:
        if batcher is not None:
            batcher.close()
