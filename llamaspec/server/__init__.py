"""``llamaspec serve``: an OpenAI-compatible HTTP server over one LlamaSpec.

Needs the optional extra ``llamaspec[server]`` (FastAPI, uvicorn). ``app.py`` holds the routes,
the request queue and the error mapping; ``schemas.py`` the request bodies; ``page.py`` and
``static/`` the chat page at ``/``; ``metrics.py`` the Prometheus counts at ``/metrics``.
"""

from __future__ import annotations

import contextlib
import logging
import re
import signal
import socket
import sys
import threading
from typing import Any, Callable, Iterator, Optional, Sequence, Tuple

from ..errors import ConfigError

# Seconds a stopping server waits for its connections before it cancels them (answers under way
# end within a step of the signal, so this is only a bound).
SHUTDOWN_SECONDS = 5

INSTALL_HINT = "llamaspec serve needs the server extra: pip install 'llamaspec[server]'"


def require_server() -> None:
    """ConfigError telling how to install the server's dependencies when they are missing."""
    try:
        import fastapi  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError:
        raise ConfigError(INSTALL_HINT) from None


def cors_origins(values: Sequence[str]) -> Tuple[str, ...]:
    """The origins ``--cors-origin`` gives (each value one or a comma-separated list; ``*``: any),
    checked before any model loads: an origin is a scheme and a host, with a port or not, and no
    path (``http://localhost:3000``), as a browser's Origin header spells it."""
    origins = tuple(o.strip() for value in values for o in value.split(",") if o.strip())
    for origin in origins:
        if origin != "*" and not re.fullmatch(r"[a-zA-Z][a-zA-Z0-9+.-]*://[^/?#\s]+/?", origin):
            raise ConfigError(f"--cors-origin {origin!r}: an origin is a scheme and a host (http://localhost:3000), "
                              f"or * for any")
    return origins


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


def _answering_half_closed() -> type:
    """uvicorn's HTTP protocol (httptools where installed, else h11, as uvicorn chooses), but an
    HTTP/1.0 client that closes its sending side after a whole request (``nc -N``) is answered,
    as llama-server answers it; uvicorn would close the connection and take the client for gone.
    A server cannot tell that from a client that closed its socket: an HTTP/1.1 client doing so
    is gone (its generation stops within a step), and so is any client closing mid-request."""
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as Protocol
    except ImportError:
        from uvicorn.protocols.http.h11_impl import H11Protocol as Protocol  # type: ignore[assignment]

    class AnsweringHalfClosed(Protocol):  # type: ignore[valid-type, misc]
        def eof_received(self) -> bool:
            cycle = self.cycle
            return (cycle is not None and cycle.scope.get("http_version") == "1.0" and not cycle.more_body
                    and not cycle.response_complete)  # True: keep the connection open to answer

    return AnsweringHalfClosed


def serve(spec: Any, host: str = "127.0.0.1", port: int = 8080, queue: int = 16,
          api_key: Optional[str] = None, parallel: int = 1, grammar: Any = None,
          reload: Optional[Callable[[], Any]] = None, cors: Sequence[str] = ()) -> None:
    """Serve ``spec`` until interrupted, logging one line per request on stderr; ``parallel`` > 1:
    that many requests decoded together (a Batcher); ``grammar``: the constraint of every request
    that asks for none of its own; ``reload``: loads the LlamaSpec again when its RPC servers
    failed (the server answers 503 until it has); ``cors``: the web pages' origins that may call
    it besides its own (``cors_origins``; ``*``: any)."""
    require_server()
    import uvicorn

    from .app import create_app

    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", "%H:%M:%S"))
    logger = logging.getLogger("llamaspec.server")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    if grammar is not None:  # every request's that asks for none of its own: compiled once, now
        spec.compile_grammar(grammar)
    batcher = spec.batcher(parallel) if parallel > 1 else None
    draining = threading.Event()

    class Server(uvicorn.Server):
        """uvicorn's server, whose stop (SIGTERM, SIGINT) first drains the app: answers under way
        end at their next step and no new one starts; then the process exits 0 (uvicorn would
        raise the signal again once stopped)."""

        def handle_exit(self, sig: int, frame: Any) -> None:
            draining.set()
            super().handle_exit(sig, frame)

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            if threading.current_thread() is not threading.main_thread():
                yield
                return
            previous = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
            try:
                yield
            finally:
                for sig, handler in previous.items():
                    signal.signal(sig, handler)

    app = create_app(spec, queue, api_key, batcher, grammar, draining, reload, cors)
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False,
                            timeout_graceful_shutdown=SHUTDOWN_SECONDS, http=_answering_half_closed())
    try:
        Server(config).run()
    finally:
        draining.set()
        app.app.state.served.close()
