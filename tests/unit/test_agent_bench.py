"""llamaspec agent-bench without a model: the shipped transcript is well formed and its edits
copy the files it read, the conversion to OpenAI's chat shape, and the report's arithmetic
against a fake server on 127.0.0.1 that streams canned events of both APIs."""

from __future__ import annotations

import copy
import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Dict, List

import pytest

from conftest import assert_one_line_error, run
from llamaspec.errors import ConfigError
from llamaspec.measure.agent import (KINDS, TRANSCRIPT, AgentBench, ServerError, Transcript, openai_messages,
                                     openai_tools, reply_budget, request_body, run_agent_bench,
                                     transcript_problem)

STEP = 0.02  # seconds between the fake's generated pieces
PREFILL = 0.05  # seconds before its first


def shipped() -> Dict[str, Any]:
    return json.loads(TRANSCRIPT.read_text(encoding="utf-8"))


# --- the transcript -----------------------------------------------------------------------------

def test_every_tool_call_is_answered_by_exactly_one_result_in_the_next_message():
    data = shipped()
    messages = data["messages"]
    assert transcript_problem(data) is None
    assert [m["role"] for m in messages] == ["user", "assistant"] * (len(messages) // 2)
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        calls = [b["id"] for b in m["content"] if b["type"] == "tool_use"]
        assert all(c.startswith("toolu_01") and len(c) == 30 for c in calls)
        following = messages[i + 1]["content"] if i + 1 < len(messages) else []
        results = [b for b in following if isinstance(b, dict) and b["type"] == "tool_result"]
        assert sorted(b["tool_use_id"] for b in results) == sorted(calls)
        assert all(isinstance(b["content"], str) for b in results)
    ids = [b["id"] for m in messages for b in m["content"] if isinstance(b, dict) and b["type"] == "tool_use"]
    assert len(ids) == len(set(ids))


def test_one_kind_per_assistant_turn_and_every_kind_present():
    data = shipped()
    assistants = [m for m in data["messages"] if m["role"] == "assistant"]
    assert 8 <= len(assistants) <= 12
    assert len(data["turn_kinds"]) == len(assistants)
    assert set(data["turn_kinds"]) == set(KINDS)
    assert data["turn_kinds"][-1] == "answer"
    for kind, m in zip(data["turn_kinds"], assistants):
        names = {b["name"] for b in m["content"] if b["type"] == "tool_use"}
        assert (kind == "edit") == bool(names & {"edit_file", "write_file"})
        assert (kind == "answer") == (not names)


def test_the_tools_are_defined_and_the_context_is_a_few_thousand_tokens():
    data = shipped()
    tools = {t["name"]: t for t in data["tools"]}
    assert {"read_file", "edit_file", "write_file"} <= set(tools)
    for tool in tools.values():
        assert tool["description"] and tool["input_schema"]["type"] == "object"
    assert set(tools["edit_file"]["input_schema"]["required"]) == {"path", "old_string", "new_string"}
    chars = len(json.dumps(data, ensure_ascii=False))
    assert 18_000 < chars < 34_000  # about 4 characters a token: 5,000 to 6,500 tokens with the template's


def test_the_edits_copy_the_files_read_as_they_stand_then():
    """Replaying the calls on the files read: every old_string is found exactly once in the file
    as the earlier edits left it, and every edited file was read first."""
    files: Dict[str, str] = {}
    results = {b["tool_use_id"]: b["content"] for m in shipped()["messages"] if m["role"] == "user"
               for b in m["content"] if isinstance(b, dict) and b["type"] == "tool_result"}
    edits = 0
    for m in shipped()["messages"]:
        for b in m["content"] if m["role"] == "assistant" else []:
            if b["type"] != "tool_use":
                continue
            args = b["input"]
            if b["name"] == "read_file":
                files[args["path"]] = results[b["id"]]
                assert results[b["id"]].count("\n") >= 50
            elif b["name"] == "edit_file":
                assert files[args["path"]].count(args["old_string"]) == 1
                assert args["old_string"].count("\n") >= 8  # a function rewritten, not one line
                files[args["path"]] = files[args["path"]].replace(args["old_string"], args["new_string"])
                edits += 1
            elif b["name"] == "write_file":
                old, new = files[args["path"]].splitlines(), args["content"].splitlines()
                assert len(set(old) - set(new)) <= 4  # a rewrite with small changes
                files[args["path"]] = args["content"]
                edits += 1
    assert edits >= 4
    assert sum(text.count("\n") >= 150 for text in files.values()) >= 2


def a_transcript() -> Dict[str, Any]:
    path = {"type": "object", "properties": {"path": {"type": "string"}}}
    calls = [{"type": "tool_use", "id": f"toolu_01{x}", "name": "read_file", "input": {"path": f"{x}.py"}}
             for x in "ab"]
    results = [{"type": "tool_result", "tool_use_id": "toolu_01b", "content": "B"},
               {"type": "tool_result", "tool_use_id": "toolu_01a", "content": [{"type": "text", "text": "A"}]},
               {"type": "text", "text": "and hurry"}]
    return {"system": "sys", "tools": [{"name": "read_file", "description": "Read", "input_schema": path}],
            "messages": [{"role": "user", "content": "Fix it"},
                         {"role": "assistant", "content": [{"type": "text", "text": "Reading."}, *calls]},
                         {"role": "user", "content": results},
                         {"role": "assistant", "content": [{"type": "text", "text": "Done."}]}],
            "turn_kinds": ["read", "answer"]}


@pytest.mark.parametrize("break_it, fragment", [
    (lambda d: d["messages"][2]["content"].pop(0), "does not answer each tool call"),
    (lambda d: d["messages"][2]["content"].append(dict(d["messages"][2]["content"][0])), "exactly one"),
    (lambda d: d["messages"][2]["content"][0].update(tool_use_id="toolu_01x"), "exactly one"),
    (lambda d: d["messages"][0].update(content=[{"type": "tool_result", "tool_use_id": "t", "content": ""}]),
     "message 0"),
    (lambda d: d["turn_kinds"].pop(), "turn_kinds"),
    (lambda d: d["turn_kinds"].__setitem__(0, "think"), "turn_kinds"),
    (lambda d: d["messages"].pop(0), "alternate"),
    (lambda d: d.update(messages=d["messages"][:2], turn_kinds=["read"]), "the last, are not answered"),
    (lambda d: d.update(tools=[{"description": "x"}]), "tools"),
    (lambda d: d.pop("messages"), "messages"),
])
def test_a_malformed_transcript_is_refused_in_one_line(break_it, fragment):
    data = a_transcript()
    assert transcript_problem(data) is None
    break_it(data)
    with pytest.raises(ConfigError, match=fragment):
        Transcript.of(data)


# --- OpenAI's shape -----------------------------------------------------------------------------

def test_conversion_to_openai_chat():
    data = a_transcript()
    assert openai_tools(data["tools"]) == [{"type": "function", "function": {
        "name": "read_file", "description": "Read", "parameters": data["tools"][0]["input_schema"]}}]
    assert openai_messages(data["system"], data["messages"]) == [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "Fix it"},
        {"role": "assistant", "content": "Reading.", "tool_calls": [
            {"id": f"toolu_01{x}", "type": "function",
             "function": {"name": "read_file", "arguments": f'{{"path": "{x}.py"}}'}} for x in "ab"]},
        {"role": "tool", "tool_call_id": "toolu_01b", "content": "B"},
        {"role": "tool", "tool_call_id": "toolu_01a", "content": "A"},
        {"role": "user", "content": "and hurry"},
        {"role": "assistant", "content": "Done."}]


def test_the_shipped_transcript_in_openai_s_shape():
    t = Transcript.load()
    chat = openai_messages(t.system, t.messages)
    assert chat[0] == {"role": "system", "content": t.system}
    pending: List[str] = []
    for m in chat[1:]:
        if m["role"] == "tool":
            assert m["tool_call_id"] == pending.pop(0)
            continue
        assert not pending
        for call in m.get("tool_calls", []):
            assert json.loads(call["function"]["arguments"]) == _input_of(t, call["id"])
            pending.append(call["id"])
        if m["role"] == "assistant" and not m.get("tool_calls"):
            assert m["content"]
    assert sum(m["role"] == "assistant" for m in chat) == len(t.turns)


def _input_of(t: Transcript, call_id: str) -> Dict[str, Any]:
    return next(b["input"] for m in t.messages for b in m["content"]
                if isinstance(b, dict) and b.get("id") == call_id)


def test_each_request_holds_the_recorded_history_before_its_turn():
    t = Transcript.load()
    for k in range(len(t.turns)):
        chat = request_body("chat", t, k, "m", 99)
        messages = request_body("messages", t, k, "m", 99)
        assert messages["messages"] == t.messages[:t.turns[k]] and messages["messages"][-1]["role"] == "user"
        assert messages["system"] == t.system and messages["tools"] == t.tools
        assert chat["messages"] == openai_messages(t.system, t.messages[:t.turns[k]])
        assert chat["stream_options"] == {"include_usage": True}
        for body in (chat, messages):
            assert (body["stream"], body["temperature"], body["max_tokens"], body["model"]) == (True, 0, 99, "m")
    edit = t.reply(t.kinds.index("edit"))
    assert reply_budget(edit) > len(json.dumps(edit["content"])) / 4  # room for the whole recorded reply


# --- against a fake server --------------------------------------------------------------------

class FakeServer:
    """Streams canned answers of both APIs: turn k's prompt is 1000 + 100 k tokens (k: the
    assistant messages in the request), of which the previous request's prompt is reused; each
    answer is 5 tokens in 5 pieces STEP apart after PREFILL seconds. ``mode`` breaks it."""

    def __init__(self) -> None:
        self.mode = "ok"
        self.requests: List[Dict[str, Any]] = []
        self.previous = 0
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                fake.requests.append({"path": self.path, "headers": dict(self.headers), "body": body})
                fake.answer(self, body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def answer(self, handler: BaseHTTPRequestHandler, body: Dict[str, Any]) -> None:
        if self.mode == "error":
            return self._send(handler, 500, "application/json", b'{"error": {"message": "the model fell over"}}')
        if self.mode == "json":
            return self._send(handler, 200, "application/json", b'{"id": "x", "choices": []}')
        handler.send_response(200)
        handler.send_header("Content-Type", "text/event-stream")
        handler.end_headers()
        if self.mode == "garbage":
            handler.wfile.write(b"data: <html>\n\n")
            return
        prompt = 1000 + 100 * sum(m["role"] == "assistant" for m in body["messages"])
        cached, self.previous = self.previous, prompt
        events = (self._chat if handler.path.endswith("/chat/completions") else self._messages)(prompt, cached)
        for delay, together in _after(events):
            time.sleep(delay)
            handler.wfile.write(together.encode())
            handler.wfile.flush()

    def _pieces(self) -> List[float]:
        """The delay before each of the 5 generated pieces (none apart in one_piece mode)."""
        return [PREFILL] + [0.0 if self.mode == "one_piece" else STEP] * 4

    def _chat(self, prompt: int, cached: int) -> List[Any]:
        def data(chunk: Dict[str, Any]) -> str:
            return f"data: {json.dumps({'id': 'c', 'object': 'chat.completion.chunk', **chunk})}\n\n"
        events = [(0.0, data({"choices": [{"index": 0, "delta": {"role": "assistant"}}]}))]
        deltas = [{"content": "I'll "}, {"content": "read "}, {"content": "it"},
                  {"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                                   "function": {"name": "read_file", "arguments": ""}}]},
                  {"tool_calls": [{"index": 0, "function": {"arguments": '{"path": "a.py"}'}}]}]
        events += [(delay, data({"choices": [{"index": 0, "delta": d}]})) for delay, d in zip(self._pieces(), deltas)]
        timings = {"prompt_n": prompt - cached, "cache_n": cached, "prompt_ms": 40.0, "predicted_per_second": 45.0, "predicted_ms": 88.9,
                   "draft_n": 6, "draft_n_accepted": 4}
        events.append((0.0, data({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}],
                                  "timings": timings})))
        events.append((0.0, data({"choices": [], "usage": {"prompt_tokens": prompt, "completion_tokens": 5,
                                                           "total_tokens": prompt + 5}})))
        return events + [(0.0, "data: [DONE]\n\n")]

    def _messages(self, prompt: int, cached: int) -> List[Any]:
        def event(kind: str, **fields: Any) -> str:
            return f"event: {kind}\ndata: {json.dumps({'type': kind, **fields})}\n\n"
        start = {"id": "msg_1", "type": "message", "role": "assistant", "content": [],
                 "usage": {"input_tokens": prompt - cached, "cache_read_input_tokens": cached, "output_tokens": 0}}
        first, *rest = self._pieces()
        return [(0.0, event("message_start", message=start)),
                (0.0, event("content_block_start", index=0, content_block={"type": "text", "text": ""})),
                (first, event("content_block_delta", index=0, delta={"type": "text_delta", "text": "I'll "})),
                (rest[0], event("content_block_delta", index=0, delta={"type": "text_delta", "text": "read it"})),
                (0.0, event("content_block_stop", index=0)),
                (rest[1], event("content_block_start", index=1, content_block={
                    "type": "tool_use", "id": "toolu_01z", "name": "read_file", "input": {}})),
                (rest[2], event("content_block_delta", index=1,
                                delta={"type": "input_json_delta", "partial_json": '{"pa'})),
                (rest[3], event("content_block_delta", index=1,
                                delta={"type": "input_json_delta", "partial_json": 'th": "a.py"}'})),
                (0.0, event("content_block_stop", index=1)),
                (0.0, event("message_delta", delta={"stop_reason": "tool_use"}, usage={"output_tokens": 5})),
                (0.0, event("message_stop"))]

    @staticmethod
    def _send(handler: BaseHTTPRequestHandler, status: int, kind: str, body: bytes) -> None:
        handler.send_response(status)
        handler.send_header("Content-Type", kind)
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body)


def _after(events: List[Any]) -> List[Any]:
    """(delay, text): the events that follow one another without a delay sent in one write, as
    a server that holds text back sends it."""
    out: List[Any] = []
    for delay, event in events:
        if out and not delay:
            out[-1] = (out[-1][0], out[-1][1] + event)
        else:
            out.append((delay, event))
    return out


@pytest.fixture
def fake():
    server = FakeServer()
    yield server
    server.stop()


def test_chat_turns_read_what_the_server_reports_and_time_the_stream(fake):
    report = run_agent_bench(AgentBench(fake.url + "/v1", "chat", api_key="sekrit", turns=3, timeout=10))
    assert [t.turn for t in report.turns] == [1, 2, 3]
    assert [t.kind for t in report.turns] == Transcript.load().kinds[:3]
    assert [t.prompt_tokens for t in report.turns] == [1000, 1100, 1200]
    assert [t.read_tokens for t in report.turns] == [1000, 100, 100]
    assert [t.reused_tokens for t in report.turns] == [0, 1000, 1100]
    assert [t.new_tokens for t in report.turns] == [None, 100, 100]
    for t in report.turns:
        assert t.output_tokens == 5 and (t.drafted, t.accepted) == (6, 4)
        assert t.server_prefill_s == pytest.approx(0.04) and t.server_decode_tps == 45.0
        assert t.server_decode_s == pytest.approx(0.0889)
        assert t.prefill_s >= PREFILL
        assert 0 < t.decode_tps <= 4 / (4 * STEP) * 1.05  # 4 tokens after the first, STEP apart at least
    assert (report.totals.read_after_first, report.totals.new_after_first) == (200, 200)
    assert report.totals.output_tokens == 15
    assert report.totals.server_decode_tps == pytest.approx(45.0)
    assert report.totals.edit_decode_tps is None  # no edit among the first three turns
    assert report.totals.prefill_s == pytest.approx(sum(t.prefill_s for t in report.turns))
    first = fake.requests[0]
    assert first["path"] == "/v1/chat/completions"
    assert first["headers"]["Authorization"] == "Bearer sekrit" and first["headers"]["x-api-key"] == "sekrit"
    assert [r["body"]["max_tokens"] for r in fake.requests] == [reply_budget(Transcript.load().reply(k))
                                                                 for k in range(3)]
    table = report.table()
    assert "accepted/drafted" in table and "4/6" in table and "read after the first turn: 200" in table


def test_messages_turns_count_input_and_cache_reads_as_anthropic_does(fake):
    t = Transcript.load()
    edit = t.kinds.index("edit")
    report = run_agent_bench(AgentBench(fake.url, "messages", turns=edit + 1, max_tokens=7, timeout=10))
    assert fake.requests[0]["path"] == "/v1/messages"
    assert fake.requests[0]["body"]["tools"] == t.tools
    assert all(r["body"]["max_tokens"] == 7 for r in fake.requests)
    assert [r.prompt_tokens for r in report.turns] == [1000 + 100 * k for k in range(edit + 1)]
    assert [r.read_tokens for r in report.turns] == [1000] + [100] * edit
    assert [r.reused_tokens for r in report.turns] == [0] + [1000 + 100 * k for k in range(edit)]
    for r in report.turns:  # no timings: the client's figures alone
        assert (r.server_decode_tps, r.server_prefill_s, r.server_decode_s, r.drafted) == (None, None, None, None)
        assert r.prefill_s >= PREFILL and 0 < r.decode_tps <= 4 / (4 * STEP) * 1.05
    assert report.totals.edit_decode_tps == pytest.approx(report.turns[edit].decode_tps)
    assert report.totals.new_after_first == report.totals.read_after_first == 100 * edit


def test_repeated_runs_give_each_turn_s_median(fake):
    report = run_agent_bench(AgentBench(fake.url, "chat", turns=2, repeat=3, max_tokens=5, timeout=10))
    assert len(report.runs) == 3 and len(report.turns) == 2
    # the fake's cache holds the last turn of the run before: the first turn of runs 2 and 3 reuses 1100
    assert [run[0].reused_tokens for run in report.runs] == [0, 1100, 1100]
    assert report.turns[0].reused_tokens == 1100 and report.turns[1].reused_tokens == 1000
    assert report.turns[0].prefill_s == pytest.approx(sorted(run[0].prefill_s for run in report.runs)[1])
    assert json.loads(json.dumps(report.to_json()))["turns"][1]["read_tokens"] == 100


def test_an_answer_that_comes_in_one_piece_has_no_client_decode_speed(fake):
    fake.mode = "one_piece"
    report = run_agent_bench(AgentBench(fake.url, "chat", turns=1, timeout=10))
    assert report.turns[0].decode_tps is None and report.turns[0].server_decode_tps == 45.0
    assert report.totals.decode_tps is None
    assert "came in one piece" in report.table()


def test_the_command_prints_the_table_and_writes_the_json(fake, tmp_path):
    out = tmp_path / "out.json"
    result = run("agent-bench", "--url", fake.url, "--turns", "2", "--max-tokens", "5", "--json", str(out))
    assert result.exit_code == 0, result.output
    assert "decode t/s" in result.stdout and "turn 2 (read)" in result.stderr
    report = json.loads(out.read_text())
    assert [t["prompt_tokens"] for t in report["turns"]] == [1000, 1100]
    assert report["api"] == "chat" and report["model"] == "default"
    assert fake.requests[0]["body"]["model"] == "default"


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("mode, args, fragment", [
    ("error", (), "answered 500: the model fell over"),
    ("json", (), "not a stream of server-sent events"),
    ("garbage", (), "not JSON"),
    ("ok", ("--turns", "0"), "--turns must be 1 to"),
    ("ok", ("--api", "responses"), "--api"),
    ("ok", ("--url", "ftp://x"), "not an http"),
])
def test_bad_input_is_one_line(fake, mode, args, fragment):
    fake.mode = mode
    result = run("agent-bench", "--url", fake.url, "--timeout", "10", *args)
    assert_one_line_error(result, fragment)
    assert result.exit_code == 1 or "--api" in args


def test_an_unreachable_server_is_one_line():
    result = run("agent-bench", "--url", f"http://127.0.0.1:{closed_port()}", "--turns", "1")
    assert_one_line_error(result, "cannot reach")


def test_a_server_that_stops_answering_is_one_line():
    with socket.socket() as listener:  # accepts, never answers
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        with pytest.raises(ServerError, match="no answer in time"):
            run_agent_bench(AgentBench(f"http://127.0.0.1:{listener.getsockname()[1]}", turns=1, timeout=0.3))


def test_another_transcript_is_checked_before_any_request(tmp_path):
    path = tmp_path / "t.json"
    broken = copy.deepcopy(a_transcript())
    broken["turn_kinds"] = ["read"]
    path.write_text(json.dumps(broken))
    result = run("agent-bench", "--url", f"http://127.0.0.1:{closed_port()}", "--transcript", str(path))
    assert_one_line_error(result, "turn_kinds")


def test_a_server_without_usage_is_read_from_its_timings_and_one_without_either_has_gaps():
    from llamaspec.measure.agent import Streamed, turn_of
    seen = Streamed(first=0.5, last=1.5, timings={"prompt_n": 10, "cache_n": 90, "predicted_n": 5})
    turn = turn_of(2, "edit", 64, seen, previous_prompt=80)
    assert (turn.prompt_tokens, turn.read_tokens, turn.reused_tokens, turn.new_tokens) == (100, 10, 90, 20)
    assert (turn.output_tokens, turn.decode_tps, turn.prefill_s) == (5, 4.0, 0.5)
    bare = turn_of(1, "read", 64, Streamed(first=0.5, last=0.9, prompt_tokens=100), previous_prompt=None)
    assert (bare.read_tokens, bare.reused_tokens, bare.output_tokens, bare.decode_tps) == (None, None, None, None)
