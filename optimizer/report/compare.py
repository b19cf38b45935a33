"""``kvtier compare``: several policies replayed on one trace, side by side.

The quick what-if before a search: vLLM alone against an LMCache CPU tier, a CXL pool or an
RDMA pool, or two exported policies against each other; with ``--what-if``, each policy also
without each of its lower tiers, with each halved and doubled, and with each tier its hardware
offers that it leaves out. Every policy is replayed to the end on
the same trace (no early stop), each on its own hardware and model profile unless one is
given for all, so cost per token compares whole systems.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from kvtier.errors import InputError
from kvtier.hardware import load_hardware, load_model
from kvtier.policy.model import SLO, Policy, load_policy
from kvtier.report.optimize import fmt_cell
from kvtier.sim.metrics import Metrics
from kvtier.sim.replay import DEFAULT_HARDWARE, DEFAULT_MODEL, scale_arrivals

COLUMNS = (
    ("B", "block_tokens", "{:.0f}"),
    ("$/1M tok", "cost_per_mtok", "{:.4f}"),
    ("TTFT mean", "ttft_mean_s", "{:.3f}"),
    ("TTFT p99", "ttft_p99_s", "{:.3f}"),
    ("TPOT p99 ms", "tpot_p99_ms", "{:.1f}"),
    ("tok/s", "throughput_tps", "{:,.0f}"),
    ("hit", "hit_total", "{:.1%}"),
)


@dataclass
class Compared:
    """One policy's row: its label, where it ran, and its metrics or why it could not run."""

    label: str
    hardware: str
    model: str
    block_tokens: int
    metrics: Metrics | None = None
    error: str | None = None
    variant_of: str | None = None  # with --what-if: the policy this row changes

    def value(self, key: str) -> float | None:
        m = self.metrics
        if key == "block_tokens":
            return float(self.block_tokens)
        if m is None:
            return None
        if key == "tpot_p99_ms":
            return m.tpot_p99_s * 1e3
        if key == "hit_total":
            return sum(m.hit_ratio_tokens.values())
        return float(getattr(m, key))


def compare_policies(
    trace_path: str,
    policies: list[tuple[str, str]],
    *,
    hardware: str | None = None,
    model: str | None = None,
    slo: SLO | None = None,
    rate_scale: float = 1.0,
    engine: str = "numba",
    what_if: bool = False,
) -> list[Compared]:
    """Replay each ``(kind, name)`` (kind ``preset`` or ``policy`` file) on the trace.

    A preset that needs a tier the chosen hardware lacks becomes a row with its reason rather
    than stopping the comparison; a policy file the user named that cannot be read is an error.
    With ``what_if``, each policy is followed by its tier variants
    (:func:`kvtier.report.whatif.tier_variants`), labelled ``NAME: VARIANT``.
    """
    from kvtier.policy.presets import load_preset
    from kvtier.report.whatif import tier_variants
    from kvtier.sim import simulate
    from kvtier.trace.blocks import block_trace
    from kvtier.trace.io import read_trace

    trace = read_trace(trace_path)
    blocked: dict[tuple[int, bool], Any] = {}
    rows: list[Compared] = []
    for kind, name in policies:
        policy: Policy = load_preset(name) if kind == "preset" else load_policy(name)
        if slo is not None:
            policy = replace(policy, slo=slo)
        hw_name = hardware or policy.hardware or DEFAULT_HARDWARE
        model_name = model or policy.model or DEFAULT_MODEL
        try:
            hw = load_hardware(hw_name)
            mdl = load_model(model_name)
        except InputError as err:
            if kind == "policy":
                raise err.with_path(name) from None
            rows.append(Compared(name, hw_name, model_name, policy.block_tokens, error=err.message))
            continue
        variants = tier_variants(policy, hw) if what_if else []
        labelled = [(name, policy, None)]
        labelled += [(f"{name}: {v.label}", v.policy, name) for v in variants[1:]]
        for label, pol, variant_of in labelled:
            row = Compared(label, hw_name, model_name, pol.block_tokens, variant_of=variant_of)
            rows.append(row)
            try:
                key = (pol.block_tokens, pol.share_across_tenants)
                if key not in blocked:
                    blocked[key] = scale_arrivals(
                        block_trace(trace, key[0], share_across_tenants=key[1]), rate_scale
                    )
                row.metrics = simulate(blocked[key], hw, mdl, pol, engine=engine)
            except InputError as err:
                if kind == "policy" and variant_of is None:
                    raise err.with_path(name) from None
                row.error = err.message
    return rows


def print_comparison(trace_path: str, rows: list[Compared], console: Console) -> None:
    table = Table(title=f"{trace_path}: policies side by side (times in s)", title_justify="left")
    table.add_column("policy", style="bold", no_wrap=True)
    for label, _, _ in COLUMNS:
        table.add_column(label, justify="right")
    with_slo = any(r.metrics is not None and r.metrics.slo_met is not None for r in rows)
    if with_slo:
        table.add_column("SLO")
    for r in rows:
        if r.metrics is None:
            cells = [fmt_cell(COLUMNS[0][2], r.value("block_tokens"))]
            table.add_row(f"{r.label} *", *cells, *["-"] * (len(COLUMNS) - 1 + with_slo))
            continue
        cells = [fmt_cell(fmt, r.value(key)) for _, key, fmt in COLUMNS]
        if with_slo:
            cells.append("met" if r.metrics.slo_met else f"{r.metrics.slo_attainment:.0%}")
        table.add_row(r.label, *cells)
    console.print(table)
    groups: dict[tuple[str, str], list[str]] = {}
    for r in rows:
        if r.variant_of is None:
            groups.setdefault((r.hardware, r.model), []).append(r.label)
    for (hw, model), labels in groups.items():
        console.print(f"on {hw}, {model}: {', '.join(labels)}")
    if len({model for _, model in groups}) > 1:
        console.print(
            "[yellow]the policies serve different models; pass --model to compare like with like[/]"
        )
    if with_slo:
        console.print("SLO: met, or the share of requests meeting every bound")
    for r in rows:
        if r.metrics is None:
            console.print(f"* {r.label} could not run: {escape(str(r.error))}")
    priced = [r for r in rows if r.metrics is not None and r.metrics.n_served > 0]
    if len(priced) > 1:
        cheapest = min(priced, key=lambda r: r.metrics.cost_per_mtok)  # type: ignore[union-attr]
        console.print(f"cheapest per token: [bold]{cheapest.label}[/]")


def comparison_json(rows: list[Compared]) -> dict[str, Any]:
    return {
        "policies": [
            {
                "policy": r.label,
                "variant_of": r.variant_of,
                "hardware": r.hardware,
                "model": r.model,
                "block_tokens": r.block_tokens,
                "error": r.error,
                "metrics": r.metrics.to_dict() if r.metrics is not None else None,
            }
            for r in rows
        ]
    }
