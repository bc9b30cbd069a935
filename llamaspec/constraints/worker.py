"""The grammar compiler's worker: a process of its own that compiles a grammar before the caller
does, so that what the grammar engine cannot take (a stack overflow, a conversion that does not
end, more memory than it may have) ends this process and not the caller's, which then compiles
the same grammar knowing it takes no longer than it took here.

Run as a script, ``python -I worker.py STACK_MB MEMORY_MB``; it imports only the standard
library and llguidance (not llamaspec, which loads llama.cpp). Messages on stdin and stdout are a
4-byte little-endian length, then the message: pickled from the caller, JSON back::

    (the model's token texts, its end tokens)   ->  {"ready": true}       once, first (or None:
                                                                          no vocabulary, a check)
    {"syntax": "lark" | "gbnf", "text": ..., "limits": {...}}
                                                ->  {"grammar": llguidance's compiled grammar,
                                                         "lark": the GBNF's conversion (GBNF only)}
                                                    or {"error": the engine's message, "stage": ...}

With a vocabulary the grammar is compiled as the caller's matcher is (its lexer over every
token) and its first mask is computed; without one it is only validated. The compiling runs on a
thread of STACK_MB megabytes: the caller's runs on a larger one, so a grammar that fits here
fits there.
"""

from __future__ import annotations

import json
import pickle
import resource
import struct
import sys
import threading
from typing import Any, Dict, List, Optional, Sequence, Tuple


def read(stream: Any) -> Optional[bytes]:
    head = stream.read(4)
    if len(head) < 4:
        return None
    (size,) = struct.unpack("<I", head)
    return stream.read(size)


def write(stream: Any, data: bytes) -> None:
    stream.write(struct.pack("<I", len(data)) + data)
    stream.flush()


def tokenizer(vocabulary: Optional[Tuple[Sequence[bytes], Sequence[int]]]) -> Any:
    """llguidance's tokenizer of the caller's model (its tokens' texts; the text the grammar
    forces is tokenized greedily here, which only the caller's own tokenizer does exactly)."""
    if vocabulary is None:
        return None
    from llguidance import LLTokenizer, TokenizerWrapper
    tokens, ends = vocabulary
    made: List[Any] = []

    class Tokens:
        eos_token_id, bos_token_id, special_token_ids = min(ends) if ends else 0, None, []

        def __init__(self) -> None:
            self.tokens = list(tokens)

        def __call__(self, data: bytes) -> List[int]:
            return made[0].greedy_tokenize(data.decode("utf-8", "replace")) if made else []

    made.append(LLTokenizer(TokenizerWrapper(Tokens()), eos_token=list(ends)))
    return made[0]


def compile_grammar(request: Dict[str, Any], tok: Any) -> Dict[str, Any]:
    from llguidance import LLMatcher, LLParserLimits
    text = request["text"]
    if request["syntax"] == "gbnf":
        from llguidance.gbnf_to_lark import gbnf_to_lark
        try:
            text = gbnf_to_lark(text)
        except RecursionError:
            return {"error": "nested too deeply to convert", "stage": "gbnf"}
        except Exception as e:  # the converter's errors name the line and the place
            return {"error": str(e), "stage": "gbnf"}
    grammar = LLMatcher.grammar_from_lark(text)
    limits = LLParserLimits(**request["limits"])
    if tok is None:
        problem = LLMatcher.validate_grammar(grammar, limits=limits)
        if problem and not problem.startswith("WARNING"):
            return {"error": problem, "stage": "compile"}
        return compiled(request, grammar, text)
    matcher = LLMatcher(tok, grammar, log_level=0, limits=limits)
    if not matcher.is_error():
        matcher.compute_bitmask()
    if matcher.is_error():
        return {"error": matcher.get_error(), "stage": "compile"}
    return compiled(request, grammar, text)


def compiled(request: Dict[str, Any], grammar: str, lark: str) -> Dict[str, Any]:
    """The answer for a grammar that compiled: with a GBNF grammar, its conversion too (the
    caller reads the Lark for what the engine does not check, ``finite.py``)."""
    return {"grammar": grammar, "lark": lark} if request["syntax"] == "gbnf" else {"grammar": grammar}


def answer(request: Dict[str, Any], tok: Any) -> Dict[str, Any]:
    """The compiled grammar or the engine's error, from a thread of the stack size set."""
    out: Dict[str, Any] = {"error": "the worker's thread ended without an answer", "stage": "compile"}

    def run() -> None:
        nonlocal out
        try:
            out = compile_grammar(request, tok)
        except MemoryError:
            out = {"error": "out of memory", "stage": "memory"}
        except Exception as e:  # noqa: BLE001 - said to the caller, who words it
            out = {"error": f"{type(e).__name__}: {e}", "stage": "compile"}

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    return out


def main() -> None:
    stack_mb, memory_mb = int(sys.argv[1]), int(sys.argv[2])
    try:
        resource.setrlimit(resource.RLIMIT_AS, (memory_mb << 20, memory_mb << 20))
    except (ValueError, OSError):  # a system that sets no such limit (macOS): the stack and time limits stay
        pass
    threading.stack_size(stack_mb << 20)
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    first = read(stdin)
    if first is None:
        return
    tok = tokenizer(pickle.loads(first))
    write(stdout, json.dumps({"ready": True}).encode())
    while True:
        message = read(stdin)
        if message is None:  # the caller is gone
            return
        write(stdout, json.dumps(answer(pickle.loads(message), tok)).encode())


if __name__ == "__main__":
    main()
