"""How ``kvtier compare`` reports: a rich table of the policies side by side, and JSON.

The replays are :mod:`kvtier.experiments.compare`'s; this renders its rows.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from kvtier.report.energy import TOK_PER_J
from kvtier.report.optimize import STEP_TIME_HINT, fmt_cell

if TYPE_CHECKING:
    from kvtier.experiments.compare import Compared

COLUMNS = (
    ("B", "block_tokens", "{:.0f}"),
    ("$/1M tok", "cost_per_mtok", "{:.4f}"),
    TOK_PER_J,
    ("TTFT mean", "ttft_mean_s", "{:.3f}"),
    ("TTFT p99", "ttft_p99_s", "{:.3f}"),
    ("TPOT p99 ms", "tpot_p99_ms", "{:.1f}"),
    ("tok/s", "throughput_tps", "{:,.0f}"),
    ("hit", "hit_total", "{:.1%}"),
)


# shown when a row tracked token intervals (--track-tbt, or an SLO bounding tbt_p99), after
# TPOT as replay shows it: the p99 over requests of each one's mean of its longest 10%
TBT_COLUMN = ("TBT p99 ms", "tbt_p99_ms", "{:.1f}")


def columns(rows: list[Compared]) -> tuple[tuple[str, str, str], ...]:
    """The table's columns: TBT beside TPOT when any row tracked it."""
    tracked = any(r.metrics is not None and r.metrics.tbt_p99_s is not None for r in rows)
    if not tracked:
        return COLUMNS
    at = next(i for i, c in enumerate(COLUMNS) if c[1] == "tpot_p99_ms") + 1
    return (*COLUMNS[:at], TBT_COLUMN, *COLUMNS[at:])


def cell_value(row: Compared, key: str) -> float | None:
    """The value shown in column ``key`` (a metric, or one derived from the metrics)."""
    m = row.metrics
    if key == "block_tokens":
        return float(row.block_tokens)
    if m is None:
        return None
    if key == "tpot_p99_ms":
        return m.tpot_p99_s * 1e3
    if key == "tbt_p99_ms":
        return None if m.tbt_p99_s is None else m.tbt_p99_s * 1e3
    if key == "hit_total":
        return sum(m.hit_ratio_tokens.values())
    value = getattr(m, key)
    return None if value is None else float(value)


def print_comparison(trace_path: str, rows: list[Compared], console: Console) -> None:
    table = Table(title=f"{trace_path}: policies side by side (times in s)", title_justify="left")
    table.add_column("policy", style="bold", no_wrap=True)
    cols = columns(rows)
    for label, _, _ in cols:
        table.add_column(label, justify="right")
    with_slo = any(r.metrics is not None and r.metrics.slo_met is not None for r in rows)
    if with_slo:
        table.add_column("SLO")
    for r in rows:
        if r.metrics is None:
            cells = [fmt_cell(cols[0][2], cell_value(r, "block_tokens"))]
            table.add_row(f"{r.label} *", *cells, *["-"] * (len(cols) - 1 + with_slo))
            continue
        cells = [fmt_cell(fmt, cell_value(r, key)) for _, key, fmt in cols]
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
    if cols is not COLUMNS:
        console.print(
            "TBT p99: the 99th percentile over requests of each one's mean of its longest 10% "
            "token intervals"
        )
    for r in rows:
        if r.metrics is None:
            console.print(f"* {r.label} could not run: {escape(str(r.error))}")
    from kvtier.report.tiers import net_loss_lines

    for r in rows:
        for line in net_loss_lines(r.tiers):
            console.print(f"[yellow]{escape(r.label)}:[/] {escape(line)}")
    for bias in dict.fromkeys(r.sample_bias for r in rows if r.sample_bias and r.metrics):
        console.print(f"[yellow]warning:[/] {escape(bias)}")
    weighting = [r.metrics.extra.get("latency_weighting") for r in rows if r.metrics is not None]
    for line in dict.fromkeys(w for w in weighting if w):
        console.print(f"note: {escape(line)}")
    for line in margin_lines(rows):
        console.print(line)
    priced = [r for r in rows if r.metrics is not None and r.metrics.n_served > 0]
    if len(priced) > 1:
        cheapest = min(priced, key=lambda r: r.metrics.cost_per_mtok)  # type: ignore[union-attr]
        console.print(f"cheapest per token: [bold]{cheapest.label}[/]")
        metered = [r for r in priced if r.metrics.tokens_per_joule]  # type: ignore[union-attr]
        if len(metered) > 1:
            frugal = max(metered, key=lambda r: r.metrics.tokens_per_joule)  # type: ignore[union-attr]
            console.print(f"most tokens per joule: [bold]{frugal.label}[/]")


def _cheapest(rows: list[Compared], at: str, met_only: bool) -> str | None:
    """The label of the cheapest row per token at step time ``at`` (``faster``, ``metrics``,
    ``slower``), among the rows meeting the SLO when ``met_only`` (None: no such row)."""
    best: tuple[float, str] | None = None
    for r in rows:
        m = getattr(r, at)
        if m is None or m.n_served == 0 or (met_only and not m.slo_met):
            continue
        if best is None or m.cost_per_mtok < best[0]:
            best = (m.cost_per_mtok, r.label)
    return None if best is None else best[1]


def margin_lines(rows: list[Compared]) -> list[str]:
    """With a step-time margin: each row's TTFT p99, cost per token and SLO at every step
    ``1 - m``, ``1`` and ``1 + m`` times as long, and whether the cheapest row (and the
    cheapest meeting the SLO) stays the same across them."""
    ran = [r for r in rows if r.slower is not None and r.faster is not None and r.metrics]
    if not ran:
        return []
    m = ran[0].step_margin
    lo, hi = f"{1 - m:g}x", f"{1 + m:g}x"
    out = [f"step time {lo} / as modelled / {hi} (every engine step; --step-time-margin {m:g}):"]
    with_slo = any(r.metrics.slo_met is not None for r in ran)  # type: ignore[union-attr]
    for r in ran:
        ms = (r.faster, r.metrics, r.slower)
        ttft = " / ".join(f"{x.ttft_p99_s:.3f}" for x in ms)  # type: ignore[union-attr]
        cost = " / ".join(f"{x.cost_per_mtok:.4f}" for x in ms)  # type: ignore[union-attr]
        line = f"  {escape(r.label)}: TTFT p99 {ttft} s, $/1M tok {cost}"
        if with_slo:
            line += ", SLO " + " / ".join(
                "met" if x.slo_met else f"{x.slo_attainment:.0%}"  # type: ignore[union-attr]
                for x in ms
            )
        out.append(line)
    if len(ran) > 1:
        checks = [("cheapest per token", False)] + (
            [("cheapest meeting the SLO", True)] if with_slo else []
        )
        for what, met_only in checks:
            picks = [_cheapest(ran, at, met_only) for at in ("faster", "metrics", "slower")]
            names = [p or "none" for p in picks]
            if len(set(picks)) == 1:
                out.append(f"{what}: {escape(names[1])} at {lo}, as modelled and at {hi}")
            else:
                out.append(
                    f"[yellow]{what} changes within the margin:[/] {escape(names[0])} at {lo}, "
                    f"{escape(names[1])} as modelled, {escape(names[2])} at {hi}: the verdict "
                    f"{STEP_TIME_HINT}"
                )
    return out


def comparison_json(rows: list[Compared]) -> dict[str, Any]:
    from kvtier.report.tiers import tier_json

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
                "tiers": tier_json(r.tiers) if r.tiers else None,
                "sample_bias": r.sample_bias,
                "step_time_margin": None
                if r.slower is None or r.faster is None
                else {
                    "margin": r.step_margin,
                    "faster": r.faster.to_dict(),
                    "slower": r.slower.to_dict(),
                },
            }
            for r in rows
        ]
    }
