"""``--color-sources`` in a real terminal: llamaspec chat and generate run inside tmux (installed by
``scripts/test_setup.sh``), their screen read back with its colours (``capture-pane -e``).
SmolLM2 repeating a sentence: lookup and lookahead supply much of it."""

from __future__ import annotations

import os
import shlex
import subprocess
import time

from checks import console_script
from conftest import THREADS
from llamaspec.cli.repl import COLOURS

REPEAT = "Repeat exactly: The quick brown fox jumps over the lazy dog. The quick brown fox jumps over the lazy dog."
WAIT = 240  # seconds, on a busy 2-core machine


class Terminal:
    """A command in a detached tmux session of its own (a terminal 200 columns wide)."""

    def __init__(self, command: str, env: str = "") -> None:
        self.name = f"llamaspec-test-{os.getpid()}-{time.monotonic_ns()}"
        shell = f"{env} {command}; echo EXITED $?; sleep 600"
        subprocess.run(["tmux", "new-session", "-d", "-s", self.name, "-x", "200", "-y", "60", shell], check=True)

    def screen(self, colours: bool = False) -> str:
        args = ["tmux", "capture-pane", "-p", "-J", "-S", "-200", "-t", self.name] + (["-e"] if colours else [])
        return subprocess.run(args, check=True, capture_output=True, text=True).stdout

    def wait_for(self, text: str) -> str:
        deadline = time.monotonic() + WAIT
        while text not in self.screen():
            assert time.monotonic() < deadline, f"no {text!r} on the screen:\n{self.screen()}"
            time.sleep(0.3)
        return self.screen(colours=True)

    def type(self, *keys: str) -> None:
        subprocess.run(["tmux", "send-keys", "-t", self.name, *keys], check=True)

    def close(self) -> None:
        subprocess.run(["tmux", "kill-session", "-t", self.name], check=False)


def lookup_colour() -> str:
    return f"48;5;{COLOURS['lookup']}"


def test_chat_colours_each_reply_by_source_with_a_legend(smol):
    term = Terminal(f"{shlex.quote(console_script())} chat -m {shlex.quote(smol)} -t {THREADS} -c 2048 --temp 0 "
                    f"-n 48 --color-sources")
    try:
        term.wait_for("/help lists the commands")
        term.type(REPEAT, "Enter")
        screen = term.wait_for("sources: ")
        assert lookup_colour() in screen or "48;5;" in screen, screen
        legend = next(line for line in term.screen().splitlines() if line.startswith("sources: "))
        assert "plain" in legend and "%" in legend
        term.type("/exit", "Enter")
        term.wait_for("EXITED 0")
    finally:
        term.close()


def test_generate_colours_at_a_terminal_unless_no_color(smol):
    command = (f"{shlex.quote(console_script())} generate -m {shlex.quote(smol)} -t {THREADS} -c 2048 --temp 0 "
               f"-n 40 --chat --color-sources -p {shlex.quote(REPEAT)}")
    coloured, plain = Terminal(command), Terminal(command, env="NO_COLOR=1")
    try:
        screen = coloured.wait_for("EXITED 0")
        assert "48;5;" in screen and "sources: " in screen, screen
        screen = plain.wait_for("EXITED 0")
        assert "48;5;" not in screen and "sources: " not in screen, screen
    finally:
        coloured.close()
        plain.close()
