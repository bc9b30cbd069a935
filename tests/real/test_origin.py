"""What a web page can make a local server do, and grammars with no finite text: a real server
on 127.0.0.1. A page may POST text/plain or a form to any server without a CORS preflight: a POST
not declared JSON gets 415 before its body is read, in its API's error shape. A request from a
page of another origin gets 403 unless --cors-origin allows it (its pages get the CORS headers
and their preflights answered); one from the server's own origin, or with no Origin (curl, SDKs,
editors), is served. A grammar that allows no finite text is a 400 before any stream starts.
After each refusal the server serves the next client."""

from __future__ import annotations

import http.client
import json
import urllib.error
import urllib.request

import pytest

from conftest import THREADS, assert_one_line_error, run
from checks import Server, free_port

ALLOWED = "http://example.test"
ASK = {"/v1/chat/completions": {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
       "/v1/completions": {"prompt": "hi", "max_tokens": 2},
       "/v1/messages": {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
       "/completion": {"prompt": "hi", "n_predict": 2}}


@pytest.fixture(scope="module")
def server(smol):
    server = Server("-m", smol, "-t", str(THREADS), "-c", "1024", "--spec", "none", "--cors-origin",
                    f"{ALLOWED},http://other.test:3000", "--cors-origin", "http://third.test")
    yield server
    server.stop()


def send(server: Server, method: str, path: str, body=None, headers=None):
    """The status, headers and JSON answer (None: no body) of one request, as given."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(server.url + path, data=data, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=300) as r:
            return r.status, r.headers, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, e.headers, json.loads(e.read() or b"null")


def assert_one_line(path: str, answer: dict, kind: str) -> str:
    """The message of an error in the shape of ``path``'s API: Anthropic's, or OpenAI's."""
    if path.startswith("/v1/messages"):
        assert answer["type"] == "error" and answer["error"]["type"] == kind, answer
    else:
        assert set(answer["error"]) == {"message", "type", "param", "code"} and answer["error"]["type"] == kind, answer
    message = answer["error"]["message"]
    assert "\n" not in message and len(message) <= 300, message
    return message


def assert_serves(server: Server) -> None:
    status, answer = server.request("POST", "/v1/completions", ASK["/v1/completions"])
    assert status == 200 and answer["choices"][0]["text"], answer


@pytest.mark.parametrize("path", list(ASK))
@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data",
                                          None])
def test_a_post_not_declared_json_is_a_415_in_its_api_s_shape(server, path, content_type):
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=300)  # urllib would declare a form
    try:
        connection.request("POST", path, json.dumps(ASK[path]).encode(),
                           {"Content-Type": content_type} if content_type else {})
        response = connection.getresponse()
        status, answer = response.status, json.loads(response.read())
    finally:
        connection.close()
    assert status == 415, answer
    assert "Content-Type: application/json" in assert_one_line(path, answer, "invalid_request_error")
    assert_serves(server)


@pytest.mark.parametrize("content_type", ["application/json; charset=utf-8", "APPLICATION/JSON", "application/x+json"])
def test_json_with_a_charset_any_case_or_a_json_suffix_is_served(server, content_type):
    status, _, answer = send(server, "POST", "/completion", ASK["/completion"], {"Content-Type": content_type})
    assert status == 200 and answer["stop"] is True, answer


@pytest.mark.parametrize("path", list(ASK))
def test_a_page_of_a_foreign_origin_gets_403_and_the_server_s_own_origin_is_served(server, path):
    status, headers, answer = send(server, "POST", path, ASK[path],
                                   {"Content-Type": "application/json", "Origin": "http://evil.test"})
    assert status == 403, answer
    assert "evil.test" in assert_one_line(path, answer, "permission_error")
    assert "Access-Control-Allow-Origin" not in headers
    status, headers, answer = send(server, "POST", path, ASK[path],
                                   {"Content-Type": "application/json", "Origin": server.url})
    assert status == 200 and "Access-Control-Allow-Origin" not in headers, answer


def test_a_foreign_origin_is_refused_on_gets_and_preflights_too(server):
    for method, path in (("GET", "/v1/models"), ("GET", "/health"), ("OPTIONS", "/v1/chat/completions")):
        origin = "null" if method == "GET" else "http://evil.test"  # "null": a sandboxed page, a file
        status, _, answer = send(server, method, path, None,
                                 {"Origin": origin, "Access-Control-Request-Method": "POST"})
        assert status == 403 and answer["error"]["type"] == "permission_error", (method, path, answer)
    assert server.get("/health") == (200, {"status": "ok"})


@pytest.mark.parametrize("origin", [ALLOWED, "http://other.test:3000", "http://third.test", "HTTP://Example.test/"])
def test_an_allowed_origin_is_served_with_cors_headers_and_its_preflight_answered(server, origin):
    status, headers, answer = send(server, "OPTIONS", "/v1/chat/completions", None,
                                   {"Origin": origin, "Access-Control-Request-Method": "POST",
                                    "Access-Control-Request-Headers": "content-type, authorization, x-stainless-os"})
    assert status == 204 and headers["Access-Control-Allow-Origin"] == origin
    assert "POST" in headers["Access-Control-Allow-Methods"]
    allowed = {h.strip().lower() for h in headers["Access-Control-Allow-Headers"].split(",")}
    assert {"content-type", "authorization", "x-api-key", "anthropic-version", "x-stainless-os"} <= allowed
    for path in ASK:
        status, headers, answer = send(server, "POST", path, ASK[path],
                                       {"Content-Type": "application/json", "Origin": origin})
        assert status == 200 and headers["Access-Control-Allow-Origin"] == origin, (path, answer)
    status, headers, answer = send(server, "POST", "/v1/completions", ASK["/v1/completions"],
                                   {"Content-Type": "text/plain", "Origin": origin})  # its errors are readable too
    assert status == 415 and headers["Access-Control-Allow-Origin"] == origin, answer


def test_an_allowed_page_s_preflight_needs_no_key_and_its_requests_do(smol):
    keyed = Server("-m", smol, "-t", str(THREADS), "-c", "1024", "--spec", "none", "--api-key", "s3cret",
                   "--cors-origin", "*")
    try:
        page = {"Origin": "http://anywhere.test", "Content-Type": "application/json"}
        status, headers, _ = send(keyed, "OPTIONS", "/v1/messages", None,
                                  {**page, "Access-Control-Request-Method": "POST"})
        assert status == 204 and headers["Access-Control-Allow-Origin"] == "http://anywhere.test"
        status, headers, answer = send(keyed, "POST", "/v1/messages", ASK["/v1/messages"], page)
        assert status == 401 and answer["error"]["type"] == "authentication_error"
        assert headers["Access-Control-Allow-Origin"] == "http://anywhere.test"
        status, _, answer = send(keyed, "POST", "/v1/messages", ASK["/v1/messages"], {**page, "x-api-key": "s3cret"})
        assert status == 200 and answer["content"], answer
    finally:
        keyed.stop()


def test_a_cors_origin_that_is_no_origin_is_refused_before_loading(smol):
    for origin in ("example.test", "http://example.test/page"):
        assert_one_line_error(run("serve", "-m", smol, "--port", str(free_port()), "--cors-origin", origin),
                              f"--cors-origin {origin!r}: an origin is a scheme and a host")


NO_FINITE_TEXT = [
    ("/v1/completions", {"prompt": "hi", "grammar": 'root ::= "a" root'}, "grammar: it allows no finite text"),
    ("/v1/completions", {"prompt": "hi", "grammar": 'root ::= x\nx ::= "b" x | y\ny ::= ("c" y)+'},
     "grammar: it allows no finite text"),
    ("/completion", {"prompt": "hi", "json_schema": {"type": "object", "properties": {"next": {"$ref": "#"}},
                                                     "required": ["next"]}}, "json_schema: it allows no finite text"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "response_format": {
        "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "array", "items": {"$ref": "#"},
                                                                       "minItems": 1}}}},
     "response_format.json_schema.schema: it allows no finite text"),
]


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("path, body, message", NO_FINITE_TEXT, ids=[f"{p} {m}" for p, _, m in NO_FINITE_TEXT])
def test_a_grammar_with_no_finite_text_is_a_400_before_any_stream(server, path, body, message, stream):
    status, headers, answer = send(server, "POST", path, {**body, "stream": stream, "max_tokens": 4},
                                   {"Content-Type": "application/json"})
    assert status == 400 and headers["Content-Type"] == "application/json", answer
    assert assert_one_line(path, answer, "invalid_request_error") == message
    assert_serves(server)


def test_a_grammar_whose_recursion_can_end_is_served(server):
    status, answer = server.request("POST", "/v1/completions", {"prompt": "hi", "max_tokens": 4, "temperature": 0,
                                                                "grammar": 'root ::= "a" root | "b"'})
    assert status == 200 and set(answer["choices"][0]["text"]) <= {"a", "b"}, answer
