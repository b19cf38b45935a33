"""``kvtier assess``: the seven questions before adopting a shared KV tier, answered for a
trace and hardware, as a Markdown report with its plots (docs/assess.md)."""

from __future__ import annotations

import click

from kvtier.cli.common import _overrides, policy_profile_options, set_option


@click.command("assess")
@click.argument("trace_path", metavar="TRACE", type=click.Path(dir_okay=False))
@policy_profile_options
@click.option(
    "--policy",
    "policy_path",
    default=None,
    type=click.Path(dir_okay=False),
    help="Policy TOML file [default: the defaults plus the hardware's shared tier].",
)
@click.option("--preset", default=None, help="Built-in policy of a known system, e.g. beluga-cxl.")
@set_option
@click.option(
    "--out",
    "out_dir",
    required=True,
    type=click.Path(file_okay=False),
    help="Folder for assess.md and its plots (created).",
)
@click.option(
    "--max-requests",
    type=int,
    default=400,
    show_default=True,
    help="Replay the first N requests of the trace (0: all).",
)
@click.option(
    "--capacity-gb",
    type=float,
    default=256.0,
    show_default=True,
    help="Capacity of each tier in the CXL / RDMA / DRAM comparison (total GB).",
)
@click.option(
    "--rate-scale",
    type=float,
    default=None,
    help="Replay arrivals this many times as fast [default: 1].",
)
def assess_cmd(
    trace_path: str,
    hardware: str | None,
    model: str | None,
    policy_path: str | None,
    preset: str | None,
    sets: tuple[str, ...],
    out_dir: str,
    max_requests: int,
    capacity_gb: float,
    rate_scale: float | None,
) -> None:
    """Answer the seven questions (hit ratio, break-even, CXL/RDMA/DRAM, GPU generations, tail
    and a fault, tenants, cost and energy) for TRACE; writes OUT/assess.md and its plots."""
    from kvtier.errors import InputError
    from kvtier.files import guard_outputs

    if preset is not None and policy_path is not None:
        raise click.UsageError("give --policy or --preset, not both")
    if max_requests < 0:
        raise InputError(f"must be >= 0, got {max_requests}", option="--max-requests")
    if not capacity_gb > 0:
        raise InputError(f"must be > 0, got {capacity_gb}", option="--capacity-gb")
    guard_outputs({"--out": out_dir}, {"TRACE": trace_path, "--policy": policy_path})
    from kvtier.experiments.assess import assess, first_requests
    from kvtier.report.assess import write_assessment
    from kvtier.scenario import Scenario

    scenario = Scenario.from_files(
        trace_path, hardware=hardware, model=model, policy_path=policy_path, preset=preset,
        overrides=_overrides(sets), rate_scale=rate_scale,
    )  # fmt: skip
    scenario = first_requests(scenario, max_requests or None)
    result = assess(scenario, capacity_gb=capacity_gb, progress=lambda m: click.echo(m, err=True))
    md = write_assessment(result, out_dir)
    for s in result.sections:
        click.echo(f"{s.title}: {s.headline}")
    click.echo(f"wrote {md}")
