"""The ``kvtier`` command line: click commands only (parse, call, print).

Every command turns :class:`kvtier.errors.InputError` into one line on stderr and exit
code 2; the work itself lives in the subpackages. This module holds the two entry points
(``kvtier`` and the stand-alone ``optimize`` script); each command group lives in a module of
its own (``trace``, ``replay``, ``optimize``, ``export``, ``validate``,
``calibrate``), and what they share in
``common``. Command modules import only ``common`` and the subpackages, never one another or
this module, so the imports have no cycle; heavy imports (numba, Optuna, the tokenizers) stay
inside the command functions.
"""

from __future__ import annotations

from typing import Any

import click

from kvtier import __version__
from kvtier.cli.assess import assess_cmd
from kvtier.cli.calibrate import calibrate_cmd
from kvtier.cli.common import KvtierCommand, KvtierGroup
from kvtier.cli.export import EXPORT_TARGETS, export_cmd
from kvtier.cli.optimize import (
    _optimize_options,
    _run_optimize,
    batch_cmd,
    optimize_cmd,
    report_cmd,
)
from kvtier.cli.replay import compare_cmd, replay_cmd
from kvtier.cli.trace import trace
from kvtier.cli.validate import validate

# the names other code imports from kvtier.cli (EXPORT_TARGETS: the exporters' names)
__all__ = ["EXPORT_TARGETS", "main", "optimize_main"]


@click.group(cls=KvtierGroup)
@click.version_option(__version__, prog_name="kvtier")
def main() -> None:
    """kvtier: trace-driven optimizer for KV-cache tiering in LLM inference."""


# click lists a group's commands by name, so the order here does not show in --help
main.add_command(trace)
main.add_command(validate)
main.add_command(replay_cmd)
main.add_command(export_cmd)
main.add_command(optimize_cmd)
main.add_command(compare_cmd)
main.add_command(report_cmd)
main.add_command(batch_cmd)
main.add_command(calibrate_cmd)
main.add_command(assess_cmd)


@click.command("optimize", cls=KvtierCommand)
@_optimize_options
@click.version_option(__version__, prog_name="kvtier")
def optimize_main(**kwargs: Any) -> None:
    """Find the cheapest policy per token that meets the SLO on a trace; write a policy file."""
    _run_optimize(**kwargs)
