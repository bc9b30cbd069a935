"""``llamaspec sources``: every draft source this installation has, where it comes from (built-in,
a package and its version, a file given with --source), its options and what it loads or needs.
The listing is the library's (``sources.registry.listing``); this prints it."""

from __future__ import annotations

import json
from typing import Tuple

import click

from ..sources import installed_registry
from ..sources.registry import listing


@click.command("sources")
@click.option("--source", "sources", multiple=True,
              help="A draft source of your own (a Python file or a module declaring PLUGIN), listed too.")
@click.option("--json", "as_json", is_flag=True, help="Print the listing as JSON.")
def sources_command(sources: Tuple[str, ...], as_json: bool) -> None:
    """List the draft sources: built-in, from installed packages (entry points
    llamaspec.sources; LLAMASPEC_DISABLE_PLUGINS=1 or =NAME,... turns them off) and --source."""
    listed = listing(installed_registry(sources))
    if as_json:
        click.echo(json.dumps([{"name": s.name, "origin": s.origin, "describe": s.describe,
                                "options": [{"flag": flag, "default": default, "help": help_}
                                            for flag, default, help_ in s.options],
                                "loads": s.loads, "needs": list(s.needs)} for s in listed], default=str))
        return
    for s in listed:
        click.echo(f"{s.name}  ({s.origin})" + (f"  {s.describe}" if s.describe else ""))
        if s.loads:
            click.echo(f"    runs with: {s.loads}")
        for need in s.needs:
            click.echo(f"    runs where there is: {need}")
        for flag, default, help_ in s.options:
            click.echo(f"    {flag} (default {default})  {help_}")
