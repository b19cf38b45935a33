"""The ``kvtier`` command line: click commands only (parse, call, print).

Every command turns :class:`optimizer.errors.InputError` into one line on stderr and exit
code 2; the work itself lives in the subpackages.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
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


def _knob_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """Add one click option per synthesis knob, generated from the knob dataclasses."""
    from optimizer.trace.synth.knobs import knob_specs, option_name

    types = {"int": int, "float": float, "str": str}
    for spec in reversed(knob_specs()):
        if spec.kind_of_value == "bool":
            option = click.option(option_name(spec.name), spec.name, is_flag=True, default=None)
        else:
            option = click.option(
                option_name(spec.name), spec.name, type=types[spec.kind_of_value], default=None
            )
        command = option(command)
        command.__click_params__[-1].help = spec.help  # type: ignore[attr-defined]
    return command


@trace.command("synth")
@click.argument("kind", metavar="chat|rag|agent|short")
@click.option("-o", "--output", required=True, help="trace file to write (.parquet or .arrow)")
@click.option("--requests", type=int, default=None, help="requests per pass (default 1000)")
@click.option("--duration", type=float, default=None, help="seconds of arrivals per pass")
@click.option("--rate", type=float, default=1.0, show_default=True, help="requests per second")
@click.option(
    "--arrivals",
    default="poisson",
    show_default=True,
    help="poisson, or gamma (inter-arrival coefficient of variation = --burstiness)",
)
@click.option(
    "--burstiness",
    type=float,
    default=1.0,
    show_default=True,
    help="coefficient of variation of inter-arrival times (gamma arrivals)",
)
@click.option("--seed", type=int, default=0, show_default=True, help="random seed")
@click.option(
    "--block-tokens", type=int, default=16, show_default=True, help="native hash granularity G"
)
@click.option(
    "--passes", type=int, default=1, show_default=True, help="replay the requests this many times"
)
@click.option(
    "--pass-gap",
    type=float,
    default=60.0,
    show_default=True,
    help="seconds between the last arrival of a pass and the next pass",
)
@_knob_options
def trace_synth(
    kind: str,
    output: str,
    requests: int | None,
    duration: float | None,
    rate: float,
    arrivals: str,
    burstiness: float,
    seed: int,
    block_tokens: int,
    passes: int,
    pass_gap: float,
    **knobs: Any,
) -> None:
    """Write a synthetic trace of KIND: chat, rag, agent or short (see docs/workloads.md)."""
    from optimizer.trace.io import write_trace
    from optimizer.trace.synth import synthesize

    result = synthesize(
        kind,
        requests=requests,
        duration=duration,
        rate=rate,
        arrivals=arrivals,
        burstiness=burstiness,
        seed=seed,
        block_tokens=block_tokens,
        passes=passes,
        pass_gap_s=pass_gap,
        **knobs,
    )
    write_trace(result, output)
    click.echo(
        f"wrote {result.n_requests} {kind} requests over {result.duration_s:.1f} s to {output}"
    )


if __name__ == "__main__":  # pragma: no cover
    main()
