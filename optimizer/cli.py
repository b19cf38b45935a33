"""The ``kvtier`` command line: click commands only (parse, call, print).

Every command turns :class:`optimizer.errors.InputError` into one line on stderr and exit
code 2; the work itself lives in the subpackages.
"""

from __future__ import annotations

import sys
from typing import Any

import click

from optimizer import __version__
from optimizer.errors import InputError


class KvtierGroup(click.Group):
    """A click group whose commands report bad input as one line and exit code 2."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except InputError as err:
            click.echo(f"error: {err}", err=True)
            sys.exit(2)


@click.group(cls=KvtierGroup)
@click.version_option(__version__, prog_name="kvtier")
def main() -> None:
    """kvtier: trace-driven optimizer for KV-cache tiering in LLM inference."""


@main.group(cls=KvtierGroup)
def trace() -> None:
    """Import, synthesise and inspect request traces."""


if __name__ == "__main__":  # pragma: no cover
    main()
