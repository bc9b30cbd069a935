"""The ``llamaspec`` command: a thin shell over the library.

    options.py      every option, named as in llama.cpp's programs (the draft sources' generated
                    from their plugins), and what turns them into the library's arguments
    run.py          generate, chat, serve
    manage.py       models, lookup (n-gram cache files), bench, profile, agreement, compare
    sources.py      sources (the draft sources installed, where from, their options)
    agent_bench.py  agent-bench (a recorded agent conversation replayed against a server)
    repl.py         the terminal chat of ``llamaspec chat``

Every user error is one line on stderr and a non-zero exit code. A command's module is imported
when the command runs (or help lists it): the options of generate and the like are made from
the installed draft sources, and ``llamaspec --version`` loads none of them.
"""

from __future__ import annotations

import importlib
import sys
import warnings
from typing import Any, List, Optional

import click

from ..errors import LlamaspecError, LlamaspecWarning

# each command: its module and the name of the command in it, imported when it is asked for
COMMANDS = {"generate": ("run", "generate"), "chat": ("run", "chat"), "serve": ("run", "serve"),
            "models": ("manage", "models_group"), "lookup": ("manage", "lookup_group"), "heads": ("manage", "heads_group"),
            "bench": ("manage", "bench_command"), "profile": ("manage", "profile_command"),
            "agreement": ("manage", "agreement_command"), "compare": ("manage", "compare_command"),
            "sources": ("sources", "sources_command"), "agent-bench": ("agent_bench", "agent_bench")}


class _OneLineErrors(click.Group):
    """Prints every error, usage errors included, as one line: ``error: ...``; imports a
    command's module when the command is asked for."""

    def list_commands(self, ctx: click.Context) -> List[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> Optional[click.Command]:
        if name not in COMMANDS:
            return None
        module, attr = COMMANDS[name]
        return getattr(importlib.import_module(f"{__name__}.{module}"), attr)

    def main(self, *args: Any, **kwargs: Any) -> Any:
        kwargs["standalone_mode"] = False
        warnings.simplefilter("always", LlamaspecWarning)  # a server logs each request's (a source turned off)
        warnings.showwarning = _show_warning
        try:
            code = super().main(*args, **kwargs)
        except click.exceptions.Abort:
            click.echo("error: aborted", err=True)
            sys.exit(130)
        except click.ClickException as e:
            click.echo(f"error: {_one_line(e.format_message())}", err=True)
            sys.exit(e.exit_code)
        except LlamaspecError as e:
            click.echo(f"error: {_one_line(str(e))}", err=True)
            sys.exit(1)
        except KeyboardInterrupt:
            click.echo("error: interrupted", err=True)
            sys.exit(130)
        sys.exit(code if isinstance(code, int) else 0)


def _one_line(message: str) -> str:
    """A message on one line whatever it quotes (a file name with a newline in it)."""
    return message.replace("\r", "\\r").replace("\n", "\\n")


def _show_warning(message: Any, category: Any, *args: Any, **kwargs: Any) -> None:
    click.echo(f"warning: {_one_line(str(message))}", err=True)


@click.group(cls=_OneLineErrors, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="llamaspec")
def cli() -> None:
    """Faster local generation with llama.cpp models: speculative decoding with a draft model,
    lookup decoding and lookahead decoding.

    Models are GGUF paths or names from models.txt (see `llamaspec models list`).
    """


def main() -> None:
    cli(prog_name="llamaspec")


__all__ = ["cli", "main"]
