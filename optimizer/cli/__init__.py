"""The ``kvtier`` command line: click commands only (parse, call, print).

Every command turns :class:`kvtier.errors.InputError` into one line on stderr and exit
code 2; the work itself lives in the subpackages. This module holds the two entry points
(``kvtier`` and the stand-alone ``optimize`` script); each command group lives in a module of
its own (``trace``, ``replay``, ``optimize``, ``export``, ``validate``,
``calibrate``), and what they share in
``common``. Command modules import only ``common`` and the subpackages, never one another or
this module, so the imports have no cycle; heavy imports (numba, Optuna, the tokenizers) stay
inside the command functions.

The group imports a command's module only when that command runs (or its help is asked
for): ``kvtier trace stats`` does not pay for the exporters, the search space or Optuna's
storage, which the other command modules import to declare their options.
"""

from __future__ import annotations

import importlib
from typing import Any

import click

from kvtier import __version__
from kvtier.cli.common import KvtierGroup
from kvtier.lazy import lazy_getattr

# the names other code imports from kvtier.cli (EXPORT_TARGETS: the exporters' names)
__all__ = ["EXPORT_TARGETS", "main", "optimize_main"]

# command name -> "module:attribute" of its click command, imported on first use
COMMANDS = {
    "trace": "kvtier.cli.trace:trace",
    "validate": "kvtier.cli.validate:validate",
    "replay": "kvtier.cli.replay:replay_cmd",
    "export": "kvtier.cli.export:export_cmd",
    "optimize": "kvtier.cli.optimize:optimize_cmd",
    "compare": "kvtier.cli.replay:compare_cmd",
    "report": "kvtier.cli.optimize:report_cmd",
    "batch": "kvtier.cli.optimize:batch_cmd",
    "calibrate": "kvtier.cli.calibrate:calibrate_cmd",
    "assess": "kvtier.cli.assess:assess_cmd",
}

# names of this module defined in a command module (PEP 562: imported on first access)
_LAZY_NAMES = {
    "EXPORT_TARGETS": "kvtier.cli.export",
    "optimize_main": "kvtier.cli.optimize",
}


def _load(target: str) -> click.Command:
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)


class _LazyCommands(dict):
    """A group's ``commands`` that imports a command's module the first time it is looked up
    (by click's ``get_command`` or by ``group.commands[name]``)."""

    def __init__(self, lazy: dict[str, str]) -> None:
        super().__init__()
        self.lazy = lazy

    def __missing__(self, name: str) -> click.Command:
        if name not in self.lazy:
            raise KeyError(name)
        command = _load(self.lazy[name])
        self[name] = command
        return command

    def get(self, name: str, default: Any = None) -> Any:  # type: ignore[override]
        try:
            return self[name]
        except KeyError:
            return default

    def __contains__(self, name: object) -> bool:
        return dict.__contains__(self, name) or name in self.lazy


class LazyGroup(KvtierGroup):
    """A command group whose commands are named here and imported when run."""

    def __init__(self, *args: Any, lazy: dict[str, str], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.commands = _LazyCommands(lazy)

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(self.commands) | set(self.commands.lazy))


@click.group(cls=LazyGroup, lazy=COMMANDS)
@click.version_option(__version__, prog_name="kvtier")
def main() -> None:
    """kvtier: trace-driven optimizer for KV-cache tiering in LLM inference."""


__getattr__ = lazy_getattr(__name__, _LAZY_NAMES)
