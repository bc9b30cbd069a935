"""The OpenAI-compatible HTTP API over one LlamaSpec: routes, the request queue, errors.

Requests take turns in arrival order: ``parallel`` run, at most ``queue`` wait, and any further
one gets 503 at once. With one at a time (the default) a request runs on the LlamaSpec itself,
with every source it has, and one whose prompt extends the previous conversation reuses its KV
caches. With a Batcher (``--parallel N``) the running requests are decoded together, each on a
sequence that keeps its KV cache for the next request that starts alike. ``n`` choices are
samples decoded together. Streams are server-sent
events as OpenAI sends them. A client that disconnects before its answer is complete, streamed
or not, ends its generation within a step and frees its turn.
Every error is a JSON body ``{"error": {"message", "type", "param", "code"}}`` (``errors`` below
maps exceptions to status codes in one place); the server never answers bad input with a 500.
Before a body is read (``guard``), a request from a web page of another origin is refused unless
``--cors-origin`` allows it, and a POST must declare its body JSON: a page may send any site's
server a form or text POST without asking first, never a JSON one. ``GET /`` is the chat page
(page.py), ``GET /metrics`` the server's counts in Prometheus' format (metrics.py).
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from typing import Any, AsyncIterator, Callable, Dict, Iterator, List, Optional, Sequence, Set

import anyio
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool
from pydantic import ValidationError
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect

from ..openai import completions
from . import anthropic, native, responses
from .events import Events, NativeEvents, OpenAIEvents
from .metrics import CONTENT_TYPE, Counted, Metrics
from .page import PAGE_PATHS, page_file
from ..errors import ConfigError, LlamaspecError, PromptError, RemoteError, VocabMismatchError, shown
from .schemas import SHAPES, ChatRequest, CompletionRequest

log = logging.getLogger("llamaspec.server")
# Seconds between checks, for an answer under way, that the server is stopping.
DRAIN_CHECK = 0.1
# Seconds between tries to load the model again after its RPC servers failed.
RELOAD_EVERY = 2.0
# Levels a request body may nest (a JSON schema of 200 levels takes about 400).
MAX_BODY_DEPTH = 512
# The ASGI scope's mark that a streamed response sent its last event (see RequestLog), and what
# an event stream yields, not sent, to set it.
SENT_ALL = "llamaspec.sent_all"
SENT = object()

# What the preflight (OPTIONS) of a page whose origin --cors-origin allows is told it may send.
CORS_METHODS = "GET, POST, OPTIONS"
CORS_HEADERS = ("Content-Type", "Authorization", "x-api-key", "anthropic-version")
CORS_MAX_AGE = "600"  # seconds a browser may keep a preflight's answer


class Busy(Exception):
    """The queue is full."""


class Queue:
    """Requests take turns in arrival order (asyncio.Semaphore serves its waiters first come,
    first served), ``parallel`` at a time (``running`` now); at most ``size`` wait; none once
    ``closed`` is set."""

    def __init__(self, size: int, parallel: int = 1, closed: Optional[threading.Event] = None) -> None:
        self.size, self.parallel = size, parallel
        self.waiting = self.running = 0
        self._turn = asyncio.Semaphore(parallel)
        self._closed = closed if closed is not None else threading.Event()

    def admit(self) -> "Turn":
        if self._closed.is_set():
            raise Busy("the server is shutting down")
        if self.waiting >= self.size:
            raise Busy(f"{self.waiting} requests are waiting already; try again later")
        self.waiting += 1
        return Turn(self)


class Turn:
    """One request's place in the queue: ``await start()``, then ``end()``, exactly once each."""

    def __init__(self, queue: Queue) -> None:
        self.queue = queue
        self.started = self.ended = False

    async def start(self) -> None:
        try:
            await self.queue._turn.acquire()
        finally:
            self.queue.waiting -= 1
        self.started = True
        self.queue.running += 1

    def end(self) -> None:
        if self.started and not self.ended:
            self.ended = True
            self.queue.running -= 1
            self.queue._turn.release()


class Unavailable(Exception):
    """The model's RPC servers failed; it is being loaded again."""


class Served:
    """The LlamaSpec (and its batcher, ``parallel`` > 1) the routes answer with. When a generation
    finds the model's RPC servers gone (RemoteError), the server is unavailable: /health and every
    request get 503, and ``reload`` (a function that loads the LlamaSpec again; none: it stays
    down) is tried every RELOAD_EVERY seconds until it works, while ``draining`` is not set."""

    def __init__(self, spec: Any, batcher: Any, reload: Optional[Callable[[], Any]],
                 draining: threading.Event) -> None:
        self.spec, self.batcher, self._reload, self._draining = spec, batcher, reload, draining
        self.down: Optional[str] = None
        self._loaded: List[Any] = []  # LlamaSpecs loaded here, closed with the server
        self._lock = threading.Lock()

    def check(self) -> None:
        if self.down is not None:
            raise Unavailable(f"the model is unavailable: {self.down}")

    def failed(self, error: RemoteError) -> None:
        with self._lock:
            if self.down is not None:
                return
            self.down = str(error)
        log.warning("the model failed: %s", error)
        if self._reload is not None:
            threading.Thread(target=self._reloading, name="llamaspec-reload", daemon=True).start()

    def _reloading(self) -> None:
        while not self._draining.wait(RELOAD_EVERY):
            try:
                spec = self._reload()
                batcher = spec.batcher(self.batcher.parallel) if self.batcher is not None else None
            except LlamaspecError as e:
                log.warning("loading the model again failed: %s", e)
                continue
            old, self.spec, self.batcher = (self.spec, self.batcher), spec, batcher
            self._loaded.append(spec)
            self.down = None
            log.warning("the model is loaded again")
            self._close(*old)
            return

    def _close(self, spec: Any, batcher: Any) -> None:
        if batcher is not None:
            batcher.close()
        if spec in self._loaded:
            self._loaded.remove(spec)
            spec.close()

    def close(self) -> None:
        """Free the batcher and what was loaded here (the LlamaSpec given stays its owner's)."""
        self._close(self.spec, self.batcher)


class BadRequest(Exception):
    """A body that is not JSON or not of the request's shape."""

    def __init__(self, message: str, param: Optional[str] = None) -> None:
        super().__init__(message)
        self.param = param


def parse(raw: bytes, model: Any) -> Any:
    """The JSON body as ``model``. Its Content-Type was checked first (``json_declared``): llama-server
    reads a body whatever its type says, but a web page may POST text/plain to any server without
    a CORS preflight, so a JSON endpoint takes only what is declared JSON."""
    try:
        data = json.loads(raw or b"null")
    except (ValueError, UnicodeDecodeError) as e:
        raise BadRequest(f"the body is not valid JSON: {e}") from None
    except RecursionError:
        raise BadRequest(f"the body nests more than {MAX_BODY_DEPTH} levels deep") from None
    if not isinstance(data, dict):
        raise BadRequest("the body must be a JSON object")
    if depth(data, MAX_BODY_DEPTH) > MAX_BODY_DEPTH:
        raise BadRequest(f"the body nests more than {MAX_BODY_DEPTH} levels deep")
    try:
        return model.model_validate(data)
    except ValidationError as e:
        first = e.errors()[0]
        loc = [str(p) for p in first.get("loc", ())]
        if loc[:1] == ["messages"] and loc[2:3] == ["content"]:  # not pydantic's union of both forms' errors
            where = ".".join(loc[:3])
            raise BadRequest(f"{where}: only text is supported (a string, or parts of type text)", where) from None
        if loc[:1] and loc[0] in SHAPES and len(loc) > 1:  # a union's member's error would mislead
            raise BadRequest(f"{loc[0]} is {SHAPES[loc[0]]}, got {shown(data.get(loc[0]), 80)}", loc[0]) from None
        where = ".".join(loc)
        raise BadRequest(f"{where}: {first.get('msg', 'invalid')}" if where else first.get("msg", "invalid"),
                         where or None) from None


def depth(value: Any, limit: int) -> int:
    """How deep ``value`` nests (a scalar: 0), counted up to just past ``limit``, without recursion."""
    deepest, level = 0, [(value, 0)]
    while level:
        item, d = level.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        deepest = max(deepest, d + 1)
        if deepest > limit:
            return deepest
        level.extend((child, d + 1) for child in children)
    return deepest


def error(status: int, message: str, kind: str, param: Optional[str] = None, path: str = "") -> JSONResponse:
    """An error in the shape of the API ``path`` belongs to: Anthropic's for /v1/messages
    (``{"type": "error", "error": {"type", "message"}}``, its type named by the status), else
    OpenAI's (llama-server's too)."""
    if path.startswith(anthropic.PATH):
        return JSONResponse(anthropic.error_body(status, message), status_code=status)
    return JSONResponse({"error": {"message": message, "type": kind, "param": param, "code": None}}, status_code=status)


def errors(app: FastAPI) -> None:
    """Every exception to its status code and its API's error body."""

    @app.exception_handler(BadRequest)
    async def invalid(request: Request, exc: BadRequest) -> JSONResponse:
        return error(400, str(exc), "invalid_request_error", exc.param, request.url.path)

    @app.exception_handler(HTTPException)
    async def http(request: Request, exc: HTTPException) -> JSONResponse:
        kind = "authentication_error" if exc.status_code == 401 else "invalid_request_error"
        return error(exc.status_code, str(exc.detail), kind, path=request.url.path)

    @app.exception_handler(ClientDisconnect)
    async def cut_short(request: Request, exc: ClientDisconnect) -> JSONResponse:  # no one reads the answer
        return error(400, "the client closed the connection before its body was complete", "invalid_request_error",
                     path=request.url.path)

    @app.exception_handler(Busy)
    async def busy(request: Request, exc: Busy) -> JSONResponse:
        return error(503, str(exc), "server_busy", path=request.url.path)

    @app.exception_handler(Unavailable)
    async def unavailable(request: Request, exc: Unavailable) -> JSONResponse:
        return error(503, str(exc), "server_unavailable", path=request.url.path)

    @app.exception_handler(LlamaspecError)
    async def ours(request: Request, exc: LlamaspecError) -> JSONResponse:
        if isinstance(exc, (ConfigError, PromptError, VocabMismatchError)):
            return error(400, str(exc), "invalid_request_error", getattr(exc, "where", None) or None, request.url.path)
        return error(500, str(exc), "server_error", path=request.url.path)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unexpected error")
        return error(500, f"internal error: {type(exc).__name__}: {exc}", "server_error", path=request.url.path)


def json_declared(content_type: str) -> bool:
    """Whether a Content-Type declares JSON: ``application/json`` (any parameters, any case) or a
    ``+json`` type. A page may send text/plain, a form or multipart to any server without a
    preflight; JSON it may send only to a server whose preflight allows its origin."""
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


def normal_origin(origin: str) -> str:
    """An origin as compared: lower case, no trailing slash and no default port (a browser leaves
    out :80 and :443, in its Origin header and in its Host header alike)."""
    origin = origin.strip().rstrip("/").lower()
    for scheme, port in (("http://", ":80"), ("https://", ":443")):
        if origin.startswith(scheme) and origin.endswith(port):
            return origin[:-len(port)]
    return origin


def foreign_origin(request: Request) -> Optional[str]:
    """The request's Origin where it is not the server's own (the scheme and the Host it was
    sent to: a page the server itself serves); None without one (curl, SDKs, editors send none)."""
    origin = request.headers.get("origin")
    if origin is None:
        return None
    own = normal_origin(f"{request.url.scheme}://{request.headers.get('host', '')}")
    return None if normal_origin(origin) == own else origin


def cors_headers(origin: str, preflight: Optional[Request] = None) -> Dict[str, str]:
    """The response headers that let a page of the allowed ``origin`` read the answer; for a
    ``preflight``, what it may send too: the methods, CORS_HEADERS and those the preflight asks
    for (the origin is trusted: browser SDKs add headers of their own)."""
    headers = {"Access-Control-Allow-Origin": origin, "Vary": "Origin"}
    if preflight is not None:
        asked = [h.strip() for h in preflight.headers.get("access-control-request-headers", "").split(",")]
        extra = [h for h in asked if h and h.replace("-", "").isalnum() and h.lower() not in
                 {c.lower() for c in CORS_HEADERS}]
        headers.update({"Access-Control-Allow-Methods": CORS_METHODS,
                        "Access-Control-Allow-Headers": ", ".join([*CORS_HEADERS, *extra]),
                        "Access-Control-Max-Age": CORS_MAX_AGE})
    return headers


def refusal(request: Request, api_key: Optional[str], json_posts: Set[str]) -> Optional[JSONResponse]:
    """The answer to a request refused before its body is read: 401 without the API key (but on
    /health and the chat page's files, which hold no data), 415 for a POST to a JSON endpoint
    whose body is not declared JSON; None to serve it."""
    path = request.url.path
    page = request.method == "GET" and path in PAGE_PATHS  # the chat page asks for the key itself
    if api_key and path != "/health" and not page:  # OpenAI's header, or Anthropic's x-api-key
        if request.headers.get("authorization", "") != f"Bearer {api_key}" \
                and request.headers.get("x-api-key") != api_key:
            return error(401, "missing or wrong API key (Authorization: Bearer ..., or x-api-key)",
                         "authentication_error", path=path)
    content_type = request.headers.get("content-type", "")
    if request.method == "POST" and path in json_posts and not json_declared(content_type):
        return error(415, f"the body must be declared JSON (Content-Type: application/json), got "
                          f"{shown(content_type) if content_type else 'no Content-Type'}", "invalid_request_error",
                     path=path)
    return None


def create_app(spec: Any, queue: int = 16, api_key: Optional[str] = None, batcher: Any = None,
               grammar: Any = None, draining: Optional[threading.Event] = None,
               reload: Optional[Callable[[], Any]] = None, cors_origins: Sequence[str] = ()) -> FastAPI:
    """The API over ``spec`` (a LlamaSpec): chat and text completions, models, health. With
    ``batcher`` (spec.batcher(N)), N requests at a time are decoded together through it.
    ``grammar``: the constraint of every request that asks for no format (response_format,
    grammar, json_schema) of its own. Once ``draining`` is set (the server is stopping), new
    requests get 503 and every answer under way ends at its next step, saying what it had.
    When the model's RPC servers fail, it is loaded again with ``reload`` (see Served); the
    app's ``state.served`` holds what it answers with. ``cors_origins``: the web pages' origins
    (``*``: any) that may call it besides its own, with their CORS headers; others get 403."""
    app = FastAPI(title="llamaspec", docs_url=None, redoc_url=None)
    draining = draining if draining is not None else threading.Event()
    waiting = Queue(queue, batcher.parallel if batcher is not None else 1, draining)
    served = app.state.served = Served(spec, batcher, reload, draining)
    metrics = app.state.metrics = Metrics()
    errors(app)

    @app.exception_handler(RemoteError)
    async def remote(request: Request, exc: RemoteError) -> JSONResponse:
        served.failed(exc)
        response = error(503, str(exc), "server_unavailable", path=request.url.path)
        if exc.results and not request.url.path.startswith(anthropic.PATH):  # what the generation had when the servers failed
            body = json.loads(response.body)
            body["error"]["generated"] = [r.text for r in exc.results]
            response = JSONResponse(body, status_code=503)
        return response

    allowed = {normal_origin(o) for o in cors_origins}
    json_posts: Set[str] = set()  # the POST routes, all of them JSON: filled once they are declared below

    @app.middleware("http")
    async def guard(request: Request, call_next: Callable) -> Any:
        """A page of a foreign origin: 403 unless allowed, its preflight answered (before the
        API key: a browser sends none with it); then ``refusal``; an allowed page gets its CORS
        headers on every answer."""
        origin = foreign_origin(request)
        if origin is not None and "*" not in allowed and normal_origin(origin) not in allowed:
            return error(403, f"a web page of the origin {shown(origin)} may not call this server "
                              f"(serve --cors-origin allows one)", "permission_error", path=request.url.path)
        if origin is not None and request.method == "OPTIONS" and "access-control-request-method" in request.headers:
            return Response(status_code=204, headers=cors_headers(origin, request))
        response = refusal(request, api_key, json_posts) or await call_next(request)
        if origin is not None:
            response.headers.update(cors_headers(origin))
        return response

    @app.get("/health")
    async def health() -> Any:
        if served.down is not None:
            return JSONResponse({"status": "unavailable", "error": served.down}, status_code=503)
        return {"status": "ok"}

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(metrics.render(waiting.running, waiting.waiting), media_type=CONTENT_TYPE)

    @app.get("/")
    @app.get("/page/{name}")
    async def page(name: str = "index.html") -> Response:
        content, media = page_file(name)
        return Response(content, media_type=media, headers={"Cache-Control": "no-cache"})

    @app.get("/v1/models")
    async def list_models() -> Dict[str, Any]:
        return {"object": "list", "data": [{"id": served.spec.model_name, "object": "model", "created": 0,
                                            "owned_by": "llamaspec"}]}

    async def answer(request: Request, body: Any, create_on: Callable[..., Any], chat: bool,
                     events: Callable[[Any], Events]) -> Any:
        return await _answer(request, body, create_on, chat, events, waiting, served, grammar, draining, metrics)

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Any:
        body = parse(await request.body(), ChatRequest)
        return await answer(request, body, completions.create_chat_completion, True, OpenAIEvents)

    @app.post("/v1/completions")
    async def text_completions(request: Request) -> Any:
        body = parse(await request.body(), CompletionRequest)
        return await answer(request, body, completions.create_completion, False, OpenAIEvents)

    @app.post("/infill")
    async def infill(request: Request) -> Any:
        body = parse(await request.body(), native.InfillRequest)
        return await answer(request, body, completions.create_infill, False, NativeEvents)

    @app.post(anthropic.PATH)
    async def messages(request: Request) -> Any:
        body = parse(await request.body(), anthropic.MessagesRequest)
        return await answer(request, body, anthropic.create_message, True, anthropic.events)

    @app.post(anthropic.PATH + "/count_tokens")
    async def count_tokens(request: Request) -> Any:
        body = parse(await request.body(), anthropic.CountTokensRequest)
        served.check()
        return await run_in_threadpool(lambda: anthropic.count_tokens(served.spec, **body.arguments()))

    @app.post(responses.PATH)
    async def create_response(request: Request) -> Any:
        body = parse(await request.body(), responses.ResponsesRequest)
        return await answer(request, body, responses.create_response, True, responses.events)

    @app.post("/completion")
    @app.post("/completions")  # llama-server's alias
    async def native_completion(request: Request) -> Any:
        body = parse(await request.body(), native.CompletionRequest)
        return await answer(request, body, completions.create_native, False, NativeEvents)

    @app.post("/tokenize")
    async def tokenize(request: Request) -> Any:
        body = parse(await request.body(), native.TokenizeRequest)
        served.check()
        return await run_in_threadpool(lambda: native.tokenize(served.spec, **body.model_dump()))

    @app.post("/detokenize")
    async def detokenize(request: Request) -> Any:
        body = parse(await request.body(), native.DetokenizeRequest)
        served.check()
        return await run_in_threadpool(lambda: native.detokenize(served.spec, body.tokens))

    @app.post("/apply-template")
    async def apply_template(request: Request) -> Any:
        body = parse(await request.body(), native.TemplateRequest)
        served.check()
        return await run_in_threadpool(lambda: native.apply_template(served.spec, **body.arguments()))

    @app.get("/props")
    async def props() -> Any:
        served.check()
        return native.props(served.spec, waiting.parallel)

    @app.post("/props")
    async def change_props() -> Any:  # as llama-server started without --props
        return error(501, "this server does not change its properties", "not_supported_error")

    @app.get("/slots")
    async def slots() -> Any:
        served.check()
        return native.slots(served.spec, waiting.parallel, waiting.running)

    json_posts.update(route.path for route in app.routes if "POST" in (getattr(route, "methods", None) or ()))
    return RequestLog(app)


async def _answer(request: Request, body: Any, create_on: Callable[..., Any], chat: bool,
                  events: Callable[[Any], Events], waiting: Queue, served: Served, grammar: Any,
                  draining: threading.Event, metrics: Metrics) -> Any:
    """``create_on(spec, **body.arguments())`` when its turn comes: a JSON answer, or with
    ``body.stream`` its chunks as the server-sent ``events(body)`` frames them. ``chat``: the
    arguments are create_chat_completion's (tools may bring their own grammar). ``metrics``
    counts the request and its generations."""
    served.check()
    spec = Counted(served.spec, metrics)
    batcher = Counted(served.batcher, metrics) if served.batcher is not None else None

    def create(**kw: Any) -> Any:
        return create_on(spec, **kw)

    if batcher is not None and body.n > batcher.parallel:
        raise ConfigError(f"n = {body.n}: this server decodes at most {batcher.parallel} sequences together "
                          f"(--parallel)")
    arguments = {**body.arguments(), "n": body.n, "batcher": batcher}
    if grammar is not None and not any(arguments.get(k) for k in ("response_format", "grammar", "json_schema")) \
            and arguments.get("tool_choice") in (None, "auto", "none"):  # calls to make have their own grammar
        arguments["grammar"] = grammar
    rules = completions.grammar_asked(arguments, chat=chat)
    if rules is not None:  # compiled now, in a worker thread: a request waiting for its turn holds up none
        await run_in_threadpool(lambda: spec.compile_grammar(rules))
    turn = waiting.admit()
    await turn.start()
    metrics.request()
    if not body.stream:
        try:
            return JSONResponse(await _unless_abandoned(request, draining,
                                                        lambda gone: create(abandoned=gone, **arguments)))
        finally:
            turn.end()
    try:
        chunks = await run_in_threadpool(lambda: create(stream=True, abandoned=draining, **arguments))  # bad input: 400
    except BaseException:
        turn.end()
        raise
    return EventStream(_events(Chunks(chunks), turn, events(body), served), media_type="text/event-stream")


async def _unless_abandoned(request: Request, draining: threading.Event,
                            work: Callable[[threading.Event], Any]) -> Any:
    """``work(gone)`` in a worker thread while the client is watched (the body is read, so the
    next message its connection gives is its leaving): ``gone`` is set as soon as it disconnects
    or the server starts draining, and the generation reading it stops within a step (its turn
    is then free)."""
    gone = threading.Event()
    async with anyio.create_task_group() as group:
        async def watch() -> None:
            while (await request.receive())["type"] != "http.disconnect":
                pass
            gone.set()

        async def drain() -> None:
            while not draining.is_set():
                await anyio.sleep(DRAIN_CHECK)
            gone.set()
        group.start_soon(watch)
        group.start_soon(drain)
        try:
            result, failure = await run_in_threadpool(lambda: work(gone)), None
        except Exception as e:  # raised below, not wrapped in the group's ExceptionGroup
            result, failure = None, e
        group.cancel_scope.cancel()
    if failure is not None:
        raise failure
    return result


class EventStream(StreamingResponse):
    """A StreamingResponse that closes its event generator however the response ends. (Starlette
    abandons the generator when the client disconnects; its ``finally`` would otherwise wait for
    the garbage collector, and with it the next request's turn.)"""

    async def __call__(self, scope: Dict[str, Any], receive: Callable, send: Callable) -> None:
        source = self.body_iterator

        async def marked() -> AsyncIterator[Any]:
            async for event in source:
                if event is SENT:
                    scope[SENT_ALL] = True  # a client that leaves now has had every event
                else:
                    yield event

        self.body_iterator = marked()
        try:
            await super().__call__(scope, receive, send)
        finally:
            with anyio.CancelScope(shield=True):
                await self.body_iterator.aclose()
                await source.aclose()  # type: ignore[attr-defined]


class Chunks:
    """A chunk iterator read from worker threads, closed only between steps (a cancelled read
    may still be running in its thread when the stream ends). On the LlamaSpec's own context
    the decoding waits while chunks are sent: on a CPU that decodes with every core, sending
    beside it would slow it more. So that a fast model does not wait for every token, one read
    takes the chunks of up to ``BUDGET`` seconds of decoding (measured by
    ``benchmarks/server_cost.py``). Through a batcher, the decoding goes on while chunks are sent."""

    BUDGET = 0.025

    def __init__(self, chunks: Iterator[Dict[str, Any]]) -> None:
        self._chunks = chunks
        self._lock = threading.Lock()

    async def next(self) -> List[Dict[str, Any]]:
        """The next chunks; empty at the end."""
        return await run_in_threadpool(self._next)

    def _next(self) -> List[Dict[str, Any]]:
        t0 = time.perf_counter()
        read: List[Dict[str, Any]] = []
        with self._lock:
            while not read or time.perf_counter() - t0 < self.BUDGET:
                chunk = next(self._chunks, None)
                if chunk is None:
                    break
                read.append(chunk)
        return read

    async def stop(self) -> None:
        await run_in_threadpool(self._close)

    def _close(self) -> None:
        with self._lock:
            close = getattr(self._chunks, "close", None)
            if close is not None:
                close()


async def _events(chunks: Chunks, turn: Turn, events: Events, served: Served) -> AsyncIterator[Any]:
    """The chunks as server-sent ``events``, and SENT once the last is sent (a generator resumes
    when what it yielded has gone). However the stream ends (finished, the client gone, an
    error), the generation is closed and the next request's turn comes."""
    sent = False
    try:
        while True:
            read = await chunks.next()
            if not read:
                break
            yield events.frame(read)
            if events.ended() and not sent:
                sent = True
                yield SENT  # the generation may take a moment longer to close
        yield events.end()
        if not sent:
            yield SENT
    except LlamaspecError as e:  # after the headers: the error goes into the stream
        if isinstance(e, RemoteError):
            served.failed(e)
        yield events.failed(str(e))
    finally:
        with anyio.CancelScope(shield=True):
            try:
                await chunks.stop()
            finally:
                turn.end()


class RequestLog:
    """ASGI middleware: one line per request, when its response has been sent: its status, or
    ``499 (client gone)`` when the client left before the whole response was sent (nginx's
    code). A client that closes a stream as soon as its last event arrives (``[DONE]``) has had
    the whole response, though the stream's closing chunk may not have been written yet."""

    def __init__(self, app: FastAPI) -> None:
        self.app = app

    async def __call__(self, scope: Dict[str, Any], receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        t0 = time.perf_counter()
        status, sent, gone = [0], [False], [False]

        async def receiving() -> Dict[str, Any]:
            message = await receive()
            gone[0] = gone[0] or (message["type"] == "http.disconnect" and not sent[0])
            return message

        async def sending(message: Dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                sent[0] = True
            await send(message)

        try:
            await self.app(scope, receiving, sending)
        finally:
            client = scope.get("client") or ("-", 0)
            code = "499 (client gone)" if gone[0] and not scope.get(SENT_ALL) else str(status[0])
            log.info("%s %s %s %s %.2f s", client[0], scope["method"], scope["path"], code, time.perf_counter() - t0)
