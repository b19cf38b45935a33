"""What every ``kvtier`` command shares: one-line errors, the console, JSON output and the
options several commands take.

Kept apart from the commands so each command module imports only this and the subpackages
(never another command module): the imports inside ``kvtier.cli`` have no cycle.
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Callable
from typing import Any

import click
from rich.console import Console

from kvtier import plugins
from kvtier.errors import InputError
from kvtier.report.jsonout import dumps as dumps_json


def _one_line_warning(message, category, filename, lineno, file=None, line=None) -> None:  # noqa: ANN001
    label = getattr(category, "label", "warning")  # a note is information, not a problem
    click.echo(f"{label}: {' '.join(str(message).split())}", err=True)


class OneLineErrors:
    """Mixin for click commands and groups: bad input as one line and exit code 2.

    Click's own usage errors (an unknown option, a value of the wrong type) get the same
    treatment as :class:`InputError`: one line on stderr, exit code 2, no usage block.
    """

    def main(self, *args: Any, **kwargs: Any) -> Any:
        if not kwargs.get("standalone_mode", True):
            return super().main(*args, **kwargs)  # type: ignore[misc]
        try:
            result = super().main(*args, standalone_mode=False, **kwargs)  # type: ignore[misc]
        except click.UsageError as err:
            hint = f" (see '{err.ctx.command_path} --help')" if err.ctx is not None else ""
            click.echo(f"error: {' '.join(err.format_message().split())}{hint}", err=True)
            sys.exit(2)
        except click.ClickException as err:
            click.echo(f"error: {' '.join(err.format_message().split())}", err=True)
            sys.exit(err.exit_code)
        except click.Abort:
            click.echo("aborted", err=True)
            sys.exit(130)
        sys.exit(result if isinstance(result, int) else 0)

    def invoke(self, ctx: click.Context) -> Any:
        warnings.showwarning = _one_line_warning
        try:
            plugins.check()  # a plug-in module that failed to load (KVTIER_PLUGINS)
            return super().invoke(ctx)  # type: ignore[misc]
        except InputError as err:
            click.echo(f"error: {err}", err=True)
            sys.exit(2)


def _console(*, stderr: bool = False) -> Console:
    """A rich console that keeps tables whole when the output is piped or redirected.

    On a terminal rich fits tables to its width; into a pipe or file it would cut them at 80
    columns ("belug..."), so there the width is ``$COLUMNS`` when set, else wide enough for
    any table (rules are drawn at most 100 columns wide by the commands that draw them).
    """
    stream = sys.stderr if stderr else sys.stdout
    if stream.isatty():
        return Console(stderr=stderr)
    columns = os.environ.get("COLUMNS", "")
    width = int(columns) if columns.isdigit() and int(columns) > 0 else 400
    return Console(stderr=stderr, width=width, soft_wrap=False)


trace_option = click.option(
    "--trace",
    "trace_path",
    required=True,
    type=click.Path(),
    help="Request trace (request-trace/1: .parquet or .arrow, or a directory of Parquet parts).",
)


trace_output_option = click.option(
    "-o",
    "--output",
    required=True,
    type=click.Path(dir_okay=False),
    help="Trace file to write (.parquet or .arrow).",
)


quiet_option = click.option(
    "--quiet",
    "-q",
    is_flag=True,
    help="No progress (a status line on a terminal, else a line on stderr every 10 s, "
    "$KVTIER_PROGRESS_S) while streaming.",
)


def streaming(label: str, quiet: bool) -> Any:
    """The progress of a streamed trace command (:func:`kvtier.cli.progress.stream_progress`)."""
    from kvtier.cli.progress import stream_progress

    return stream_progress(label, quiet=quiet, console=_console(stderr=True))


def policy_profile_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """``--hardware`` and ``--model``, defaulting to the policy file's profiles."""
    command = click.option(
        "--model",
        default=None,
        help="Model profile name or TOML path [default: the policy's, else Llama-3.1-8B].",
    )(command)
    return click.option(
        "--hardware",
        default=None,
        help="Hardware profile name or TOML path [default: the policy's, else h100-node].",
    )(command)


set_option = click.option(
    "--set",
    "sets",
    multiple=True,
    metavar="KEY=VALUE",
    help="Override a policy field, e.g. --set block_tokens=32 or --set serving.instances=4 "
    "(the keys of optimize --pin; repeatable).",
)


def step_margin_option(what: str) -> Callable[[Any], Any]:
    """``--step-time-margin M``: ``what`` is also evaluated with every engine step ``1 - M``
    and ``1 + M`` times as long (``kvtier.sim.steptime.calibrated.with_step_scale``)."""
    return click.option(
        "--step-time-margin",
        "step_margin",
        type=float,
        default=0.0,
        show_default=True,
        help=f"Also evaluate {what} with every engine step this share faster and slower (e.g. "
        "0.1: 0.9x and 1.1x as long) and say whether the verdict holds.",
    )


def _overrides(sets: tuple[str, ...]) -> dict[str, Any]:
    """``--set KEY=VALUE`` texts parsed and checked against the policy's fields."""
    if not sets:
        return {}
    from kvtier.policy.overrides import parse_overrides

    return parse_overrides(sets, "--set")


def _echo_json(data: Any, why: str | None = None) -> None:
    """Print ``data`` as strict JSON: an undefined number is ``null`` (never ``NaN``), and
    why it is undefined goes to stderr as one warning line."""
    text, nulls = dumps_json(data)
    click.echo(text)
    if nulls and why is not None:
        click.echo(f"warning: {why}", err=True)


class KvtierGroup(OneLineErrors, click.Group):
    """The ``kvtier`` group and its subgroups."""


class KvtierCommand(OneLineErrors, click.Command):
    """A stand-alone console script (``optimize``)."""
