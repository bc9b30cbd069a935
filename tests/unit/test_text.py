from types import SimpleNamespace

from llamaspec import Stats
from llamaspec.engine.engine import Step
from llamaspec.engine.generation import Collector, make_config
from llamaspec.engine.text import TextStream


def feed(stream, pieces):
    return "".join(stream.push(p.encode() if isinstance(p, str) else p) for p in pieces)


def test_no_stop_strings_passes_everything_through():
    s = TextStream()
    assert feed(s, ["Hel", "lo", " world"]) == "Hello world"
    assert s.flush() == ""
    assert s.text == "Hello world" and not s.stopped


def test_stop_string_is_cut_and_never_emitted():
    s = TextStream(["###"])
    out = feed(s, ["answer", " #", "#", "# rest"])
    assert out == "answer "
    assert s.stopped and s.text == "answer "
    assert s.push(b"more") == "" and s.flush() == ""


def test_partial_stop_prefix_is_held_back_then_released():
    s = TextStream(["STOP"])
    assert s.push(b"abc ST") == "abc "
    assert s.push(b"ART") == "START"
    assert s.flush() == ""
    assert not s.stopped and s.text == "abc START"


def test_held_back_prefix_released_at_flush():
    s = TextStream(["</end>"])
    assert s.push(b"x </e") == "x "
    assert s.flush() == "</e"


def test_earliest_of_several_stop_strings_wins():
    s = TextStream(["bb", "a b"])
    assert feed(s, ["xa bb"]) == "x"
    assert s.text == "x"


def test_utf8_split_across_tokens():
    data = "héllo €".encode()
    s = TextStream()
    out = "".join(s.push(data[i:i + 1]) for i in range(len(data)))
    assert out + s.flush() == "héllo €"


def test_a_generation_ending_inside_a_character_reports_it_as_llama_server_does():
    """Cut by max_tokens inside 🌆: no chunk shows its bytes (a stream of llama-server holds them
    back), the whole text ends with one U+FFFD for them (as llama-server's whole answers do)."""
    city = "🌆".encode()
    vocab = SimpleNamespace(piece={1: b"Sunset ", 2: city[:2], 3: city[2:]}.get, eog_tokens=frozenset())
    collector = Collector(vocab, make_config(max_tokens=2), Stats())
    chunk, kept = collector.take(Step(tokens=[1, 2], n_drafted=1, depth=1))
    assert (chunk.text, kept) == ("Sunset ", 2)
    collector.result()
    last = collector.tail()
    assert last.text == "" and last.result.text == "Sunset \ufffd"
    whole = Collector(vocab, make_config(max_tokens=3), Stats())
    assert whole.take(Step(tokens=[1, 2, 3], n_drafted=2, depth=2))[0].text == "Sunset 🌆"
    whole.result()
    assert whole.tail().result.text == "Sunset 🌆"


def test_a_text_ending_inside_a_character_leaves_it_out_not_as_a_replacement():
    """A generation cut by max_tokens inside 🌆 (4 bytes): the finished text is held back while
    more bytes can follow, and at the end the unfinished character is left out, never U+FFFD."""
    ts = TextStream()
    city = "🌆".encode()
    assert ts.push(b"Sunset ") == "Sunset " and ts.push(city[:2]) == ""
    assert ts.flush() == "" and ts.text == "Sunset " and ts.incomplete == 2
    ts = TextStream()
    assert ts.push(city[:3]) + ts.push(city[3:]) == "🌆" and ts.flush() == "" and ts.incomplete == 0
