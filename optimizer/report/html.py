"""``kvtier report --html``: one self-contained HTML page per study, with interactive charts.

The page carries plotly.js inline (no network is needed to view it) and, in order: the
study's one-line summary; cost per 1M tokens against TTFT P99 and against TPOT P99 for every
finished trial, with the SLO drawn, the best trial and every preset marked (log axes when the
values span more than a decade); the presets' table; "what tiering buys" (the verdict and the
cheapest tiered and HBM-only policies meeting the SLO); cost and latency against each lower
tier's capacity around the winner (the refine's curves, :mod:`kvtier.search.refine`, when
the study holds a refine of its best trial, else every trial's capacity of that tier); hit
ratio per tier over time (the study's ``hit_ratio_over_time``, or the best trial replayed:
:mod:`kvtier.experiments.hit_timeline`); the trace's LRU miss-ratio curve in GB of KV for the
study's model; then the report's tables. Text is left-aligned, numbers right-aligned.

The optional inputs' shapes (study user attributes, :mod:`kvtier.search.study`):

* ``refine`` (the report's key for ``kvtier.search.refine.REFINE_ATTR``, written by
  optimize's refine stage): ``{"from_trial": N, "curves": {TIER: [{"capacity_gb",
  "cost_per_mtok", "ttft_p99_s", "feasible", ...}, ...]}, ...}``, points in any order;
* ``hit_ratio_over_time``: ``{"trial": N, "t_s": [...], "tiers": {TIER: [...]}}``, each
  tier's share of prompt tokens served from it in the window starting at each ``t_s``.
"""

from __future__ import annotations

import html
import math
import os
import re
from pathlib import Path
from typing import Any

from kvtier.files import atomic_write

SLO_COLOR = "#d62728"
BEST_COLOR = "#2ca02c"
PRESET_COLOR = "#ff7f0e"

PRESET_SYMBOLS = (
    "diamond",
    "square",
    "triangle-up",
    "triangle-down",
    "pentagon",
    "hexagon",
    "cross",
    "triangle-left",
    "triangle-right",
    "star-diamond",
    "hourglass",
    "bowtie",
)

# a table cell that is a number (with its unit or sign): right-aligned; any other text: left
_NUMBER = re.compile(
    r"^[-+]?\$?[-+]?(\d[\d,]*)?(\.\d+)?(e[-+]?\d+)?\s*(%|s|ms|GB|x|/Mtok)?$", re.IGNORECASE
)


def is_number(cell: str) -> bool:
    text = cell.strip()
    return (
        bool(text) and text != "-" and any(c.isdigit() for c in text) and bool(_NUMBER.match(text))
    )


def _cell_class(cell: str) -> str:
    return "n" if is_number(cell) or cell.strip() == "-" else "t"


def html_table(headers: list[str], rows: list[list[str]]) -> str:
    """A table whose number cells (and the headers of number columns) are right-aligned."""
    numeric = [
        bool(rows)
        and all(is_number(r[j]) or r[j].strip() in ("-", "") for r in rows if j < len(r))
        and any(is_number(r[j]) for r in rows if j < len(r))
        for j in range(len(headers))
    ]
    head = "".join(
        f'<th class="{"n" if numeric[j] else "t"}">{html.escape(h)}</th>'
        for j, h in enumerate(headers)
    )
    body = "".join(
        "<tr>"
        + "".join(f'<td class="{_cell_class(c)}">{html.escape(c)}</td>' for c in row)
        + "</tr>"
        for row in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _finite(values: list[Any]) -> list[float]:
    return [float(v) for v in values if isinstance(v, int | float) and math.isfinite(v)]


def _log_helps(values: list[float]) -> bool:
    """A log axis when every value is positive and they span more than a decade."""
    vals = _finite(values)
    return bool(vals) and min(vals) > 0 and max(vals) / min(vals) > 10


def _axis(title: str, values: list[float]) -> dict[str, Any]:
    return {"title": {"text": title}, "type": "log" if _log_helps(values) else "linear"}


def _hover(p: dict[str, Any]) -> str:
    tpot = p.get("tpot_p99_s")
    tpot_text = f"{tpot * 1e3:.1f} ms" if isinstance(tpot, int | float) else "-"
    return (
        f"trial {p['trial']}<br>${p['cost_per_mtok']:.4f} per 1M tok<br>"
        f"TTFT p99 {p['ttft_p99_s']:.3f} s, TPOT p99 {tpot_text}<br>"
        f"{html.escape(p.get('tiers') or '')}<br>"
        + ("meets the SLO" if p["feasible"] else "misses the SLO")
    )


def _presets(rep: dict[str, Any]) -> list[dict[str, Any]]:
    outcome = rep.get("outcome") or {}
    return [p for p in outcome.get("presets", []) if p.get("metrics")]


def _has_values(rep: dict[str, Any], metric: str) -> bool:
    """Does any trial or replayed preset have a finite ``metric`` to chart?"""
    values = [p.get(metric) for p in rep["points"]]
    values += [p["metrics"].get(metric) for p in _presets(rep)]
    return bool(_finite(values))


def _slo_line(fig: Any, x: float, text: str, **where: Any) -> None:
    """A dashed vertical SLO line, named in the legend.

    The line is a shape (it spans the plot's height on any axis type); its name is a legend
    entry, not an annotation, whose position plotly takes as log10(x) on a log axis.
    """
    import plotly.graph_objects as go

    fig.add_vline(x=x, line={"color": SLO_COLOR, "dash": "dash", "width": 2}, **where)
    fig.add_trace(
        go.Scatter(
            x=[None],
            y=[None],
            mode="lines",
            name=text,
            line={"color": SLO_COLOR, "dash": "dash", "width": 2},
        )
    )


def cost_figure(rep: dict[str, Any], metric: str, label: str, unit: str, scale: float = 1.0) -> Any:
    """Every trial's cost against ``metric`` (TTFT or TPOT P99), SLO line, best, presets."""
    import plotly.graph_objects as go

    pts = [
        p
        for p in rep["points"]
        if isinstance(p.get(metric), int | float) and math.isfinite(p[metric])
    ]
    fig = go.Figure()
    for ok, name, marker in (
        (False, "misses the SLO", {"color": "#aaaaaa", "symbol": "x", "size": 7}),
        (True, "meets the SLO", {"color": "#1f77b4", "symbol": "circle", "size": 8}),
    ):
        sel = [p for p in pts if p["feasible"] is ok]
        fig.add_trace(
            go.Scatter(
                x=[p[metric] * scale for p in sel],
                y=[p["cost_per_mtok"] for p in sel],
                mode="markers",
                name=name,
                marker=marker,
                text=[_hover(p) for p in sel],
                hoverinfo="text",
            )
        )
    best = rep.get("best")
    if best is not None and isinstance(best["metrics"].get(metric), int | float):
        fig.add_trace(
            go.Scatter(
                x=[best["metrics"][metric] * scale],
                y=[best["metrics"]["cost_per_mtok"]],
                mode="markers+text",
                name=f"best (trial {best['number']})",
                marker={"color": BEST_COLOR, "symbol": "star", "size": 18},
                text=["best"],
                textposition="top center",
            )
        )
    presets = [
        p
        for p in _presets(rep)
        if isinstance(p["metrics"].get(metric), int | float)
        and isinstance(p["metrics"].get("cost_per_mtok"), int | float)
    ]
    # presets often sit close together, where names written beside them overlap: each is
    # a legend entry of its own, with its own symbol, and its name on hover
    for i, p in enumerate(presets):
        fig.add_trace(
            go.Scatter(
                x=[p["metrics"][metric] * scale],
                y=[p["metrics"]["cost_per_mtok"]],
                mode="markers",
                name=p["name"],
                legendgroup="presets",
                legendgrouptitle={"text": "presets"} if i == 0 else None,
                marker={
                    "color": PRESET_COLOR,
                    "symbol": PRESET_SYMBOLS[i % len(PRESET_SYMBOLS)],
                    "size": 11,
                    "line": {"color": "#333", "width": 1},
                },
                hovertext=[
                    f"{p['name']}: ${p['metrics']['cost_per_mtok']:.4f} per 1M tok, "
                    + ("meets the SLO" if p.get("feasible") else "misses the SLO")
                ],
                hoverinfo="text",
            )
        )
    xs = [p[metric] * scale for p in pts] + [p["metrics"][metric] * scale for p in presets]
    ys = [p["cost_per_mtok"] for p in pts] + [p["metrics"]["cost_per_mtok"] for p in presets]
    bound = (rep.get("setup") or {}).get("slo", {}).get(metric)
    if isinstance(bound, int | float):
        xs.append(bound * scale)
        name = label.split(" (")[0]
        _slo_line(fig, bound * scale, f"SLO: {name} <= {bound * scale:g} {unit}")
    x_axis = _axis(label, xs)
    fig.update_layout(
        xaxis=x_axis,
        yaxis=_axis("$ per 1M tokens", ys),
        height=480,
        margin={"l": 60, "r": 20, "t": 30, "b": 50},
        legend={"x": 1.02, "y": 1.0, "font": {"size": 11}},
        template="plotly_white",
    )
    return fig


def capacity_figures(rep: dict[str, Any]) -> tuple[list[tuple[str, Any]], str]:
    """Cost and TTFT P99 against each lower tier's capacity: the study's refine curves when
    it holds them, else every trial that used the tier. Returns (tier, figure) pairs and a
    sentence saying which."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    refine = rep.get("refine") or {}
    curves = refine.get("curves") or {}
    figures = []
    if curves:
        note = (
            f"Refine curves around trial {refine.get('from_trial', '?')}: each lower tier's "
            "capacity varied with the rest of the winner fixed."
        )
        series = {
            tier: sorted(
                (p for p in pts if isinstance(p.get("capacity_gb"), int | float)),
                key=lambda p: p["capacity_gb"],
            )
            for tier, pts in curves.items()
        }
        mode = "lines+markers"
    else:
        note = (
            "This study holds no refine curves; shown instead: every trial that used each "
            "lower tier, at the capacity it had (the other parameters vary too)."
        )
        series = {}
        for p in rep["points"]:
            for tier, cap in (p.get("tier_gb") or {}).items():
                series.setdefault(tier, []).append({**p, "capacity_gb": cap})
        mode = "markers"
    best_tiers = (rep.get("best") or {}).get("tiers_gb") or {}
    for tier, pts in sorted(series.items()):
        pts = [p for p in pts if isinstance(p.get("capacity_gb"), int | float)]
        if not pts:
            continue
        fig = make_subplots(
            rows=1,
            cols=2,
            subplot_titles=("$ per 1M tokens", "TTFT p99 (s)"),
            horizontal_spacing=0.12,
        )
        colors = ["#1f77b4" if p.get("feasible") else "#aaaaaa" for p in pts]
        for col, key in ((1, "cost_per_mtok"), (2, "ttft_p99_s")):
            fig.add_trace(
                go.Scatter(
                    x=[p["capacity_gb"] for p in pts],
                    y=[p.get(key) for p in pts],
                    mode=mode,
                    marker={"color": colors, "size": 8},
                    line={"color": "#1f77b4"},
                    showlegend=False,
                    text=[
                        f"{p['capacity_gb']:,.0f} GB: ${p.get('cost_per_mtok') or 0:.4f}, "
                        f"TTFT p99 {p.get('ttft_p99_s') or 0:.3f} s, "
                        + ("meets the SLO" if p.get("feasible") else "misses the SLO")
                        for p in pts
                    ],
                    hoverinfo="text",
                ),
                row=1,
                col=col,
            )
            axis_type = "log" if _log_helps([p["capacity_gb"] for p in pts]) else "linear"
            fig.update_xaxes(title_text=f"{tier} capacity (GB)", type=axis_type, row=1, col=col)
            if tier in best_tiers and best_tiers[tier]:
                fig.add_vline(
                    x=best_tiers[tier], line={"color": BEST_COLOR, "dash": "dot"}, row=1, col=col
                )
        bound = (rep.get("setup") or {}).get("slo", {}).get("ttft_p99_s")
        if isinstance(bound, int | float):  # the SLO, and a legend that says what is drawn
            fig.add_hline(y=bound, line={"color": SLO_COLOR, "dash": "dash"}, row=1, col=2)
            fig.add_trace(
                go.Scatter(
                    x=[None],
                    y=[None],
                    mode="lines",
                    name=f"SLO: TTFT p99 <= {bound:g} s",
                    line={"color": SLO_COLOR, "dash": "dash"},
                ),
                row=1,
                col=2,
            )
        if best_tiers.get(tier):
            fig.add_trace(
                go.Scatter(
                    x=[None],
                    y=[None],
                    mode="lines",
                    name=f"the winner's {tier}: {best_tiers[tier]:,.0f} GB",
                    line={"color": BEST_COLOR, "dash": "dot"},
                ),
                row=1,
                col=1,
            )
        fig.update_layout(
            height=360, margin={"l": 60, "r": 20, "t": 40, "b": 50}, template="plotly_white"
        )
        figures.append((tier, fig))
    return figures, note


def hit_ratio_figure(rep: dict[str, Any]) -> Any | None:
    """Hit ratio per tier over time, from the study's ``hit_ratio_over_time`` attribute."""
    import plotly.graph_objects as go

    data = rep.get("hit_ratio_over_time")
    if not isinstance(data, dict):
        return None
    t = data.get("t_s") or []
    tiers = data.get("tiers") or {}
    if not t or not tiers:
        return None
    fig = go.Figure()
    for tier, ratios in tiers.items():
        fig.add_trace(
            go.Scatter(x=t, y=ratios, mode="lines", name=tier, stackgroup="hits", hoverinfo="x+y")
        )
    fig.update_layout(
        xaxis={"title": {"text": "time (s)"}},
        yaxis={"title": {"text": "share of prompt tokens"}, "range": [0, 1], "tickformat": ".0%"},
        height=360,
        margin={"l": 60, "r": 20, "t": 30, "b": 50},
        template="plotly_white",
    )
    return fig


def mrc_figure(curve: dict[str, Any]) -> Any:
    """Hit ratio against capacity in GB of KV (log axis), the winner's tiers marked."""
    import plotly.graph_objects as go

    pts = [p for p in curve["points"] if p["capacity_gb"] > 0]
    fig = go.Figure()
    fig.add_trace(
        go.Scatter(
            x=[p["capacity_gb"] for p in pts],
            y=[p["hit_ratio_tokens"] for p in pts],
            mode="lines+markers",
            name="tokens",
        )
    )
    fig.add_trace(
        go.Scatter(
            x=[p["capacity_gb"] for p in pts],
            y=[p["hit_ratio_blocks"] for p in pts],
            mode="lines",
            line={"dash": "dash"},
            name="blocks",
        )
    )
    for tier, gb in (curve.get("tiers_gb") or {}).items():
        if gb and gb > 0:
            fig.add_vline(x=gb, line={"color": BEST_COLOR, "dash": "dot"})
            # on a log axis an annotation's x is log10 of the value
            fig.add_annotation(
                x=math.log10(gb),
                y=1.0,
                yref="paper",
                text=f"winner's {tier}: {gb:,.0f} GB",
                showarrow=False,
                xanchor="right",
                font={"color": BEST_COLOR},
            )
    fig.update_layout(
        xaxis={"title": {"text": "cache capacity (GB of KV)"}, "type": "log"},
        yaxis={"title": {"text": "hit ratio (LRU)"}, "range": [0, 1], "tickformat": ".0%"},
        height=400,
        margin={"l": 60, "r": 20, "t": 30, "b": 50},
        template="plotly_white",
    )
    return fig


def _div(fig: Any, div_id: str) -> str:
    return fig.to_html(
        full_html=False,
        include_plotlyjs=False,
        div_id=div_id,
        config={"displaylogo": False, "responsive": True},
    )


def _presets_table(rep: dict[str, Any]) -> str:
    outcome = rep.get("outcome") or {}
    rows = []
    best = rep.get("best")
    if best is not None:
        m = best["metrics"]
        rows.append(_metric_row(f"best (trial {best['number']})", m, "yes"))
    left_out = []
    for p in outcome.get("presets", []):
        if not p.get("metrics"):
            left_out.append(f"{p['name']} ({p.get('error') or 'not replayed'})")
            continue
        misses = ", ".join(
            f"{k} by {v:.3g}" for k, v in (p.get("violations") or {}).items() if v and v > 0
        )
        rows.append(
            _metric_row(p["name"], p["metrics"], "yes" if p["feasible"] else "no: " + misses)
        )
    if len(rows) <= (best is not None):
        return (
            "<p>The presets were not replayed on this study "
            "(run optimize without --no-presets).</p>"
        )
    headers = [
        "policy",
        "$ per 1M tok",
        "$ per hour",
        "TTFT p99 s",
        "TPOT p99 ms",
        "inst.",
        "meets SLO",
    ]
    out = html_table(headers, rows)
    if left_out:
        out += f"<p>Left out: {html.escape('; '.join(left_out))}.</p>"
    return out


def _fmt(fmt: str, value: Any) -> str:
    if not isinstance(value, int | float) or (
        isinstance(value, float) and not math.isfinite(value)
    ):
        return "-"
    return fmt.format(value)


def _metric_row(name: str, m: dict[str, Any], verdict: str) -> list[str]:
    tpot = m.get("tpot_p99_s")
    return [
        name,
        _fmt("{:.4f}", m.get("cost_per_mtok")),
        _fmt("{:,.2f}", m.get("cost_per_hour")),
        _fmt("{:.3f}", m.get("ttft_p99_s")),
        _fmt("{:.1f}", tpot * 1e3 if isinstance(tpot, int | float) else None),
        _fmt("{}", m.get("instances")),
        verdict,
    ]


def _tiering_html(rep: dict[str, Any]) -> str:
    from types import SimpleNamespace

    from kvtier.report.optimize import tiering_sentence

    outcome = rep.get("outcome") or {}
    if "tiered" not in outcome and "hbm_only" not in outcome:
        return "<p>This study holds no tiering verdict (it is recorded by optimize runs).</p>"
    tiered, hbm = outcome.get("tiered"), outcome.get("hbm_only")
    rows = []
    for name, c in (("with tiers", tiered), ("HBM only", hbm)):
        if c is None:
            rows.append([name, "-", "-", "-", "-", "none meets the SLO", ""])
            continue
        tiers = ", ".join(f"{k} {v:,.0f} GB" if v else k for k, v in c["tiers"].items())
        rows.append(
            [
                name,
                _fmt("{:.4f}", c["cost_per_mtok"]),
                _fmt("{:,.2f}", c["cost_per_hour"]),
                str(c["gpus"]),
                _fmt("{:.3f}", c["ttft_p99_s"]),
                tiers or "HBM only",
                c["label"],
            ]
        )
    ns = lambda c: None if c is None else SimpleNamespace(**c)  # noqa: E731
    sentence = tiering_sentence(ns(tiered), ns(hbm))
    headers = ["", "$ per 1M tok", "$ per hour", "GPUs", "TTFT p99 s", "lower tiers", "from"]
    return f'<p class="verdict">{html.escape(sentence)}</p>' + html_table(headers, rows)


STYLE = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;max-width:72em;margin:1.5em auto;
padding:0 1em;color:#222;line-height:1.45}
h1{font-size:1.6em;margin-bottom:.2em}h2{font-size:1.2em;margin-top:1.6em;
border-bottom:1px solid #ddd;padding-bottom:.2em}
table{border-collapse:collapse;margin:.5em 0;font-size:.92em}
td,th{border:1px solid #ddd;padding:.25em .7em}th{background:#f4f4f4}
.n{text-align:right;font-variant-numeric:tabular-nums}.t{text-align:left}
.verdict{font-size:1.1em;background:#f3f8f3;border-left:4px solid #2ca02c;padding:.5em .8em}
.alert{color:#b00;font-weight:bold}.note{color:#555}
.chart{width:100%;min-height:300px}
"""


def render_page(rep: dict[str, Any], sections: list[Any], curve: dict[str, Any] | str) -> str:
    """The page as text; ``sections`` as :func:`kvtier.report.study.report_sections` makes
    them, ``curve`` the model's miss-ratio curve or why there is none."""
    from plotly.offline import get_plotlyjs

    name = html.escape(rep["study"])
    parts = [f"<h1>kvtier study {name}</h1>"]
    for sec in sections[:2]:  # the counts and the setup, as lines
        cls = "alert" if sec.alert else "note"
        parts.append(f'<p class="{cls}">{html.escape(sec.title)}</p>')
    charts = 0

    def chart(fig: Any) -> str:
        nonlocal charts
        charts += 1
        return f'<div class="chart">{_div(fig, f"chart-{charts}")}</div>'

    if rep["points"]:
        for metric, label, unit, scale in (
            ("ttft_p99_s", "TTFT p99 (s)", "s", 1.0),
            ("tpot_p99_s", "TPOT p99 (ms)", "ms", 1e3),
        ):
            parts.append(f"<h2>Cost against {label.split(' (')[0]}</h2>")
            if _has_values(rep, metric):
                parts.append(chart(cost_figure(rep, metric, label, unit, scale=scale)))
            else:
                parts.append(
                    f'<p class="note">No trial or preset has a finite {label.split(" (")[0]}: '
                    "their replays stopped once the SLO was certainly missed.</p>"
                )
    else:
        parts.append('<p class="alert">No trial has finished: nothing to chart.</p>')
    parts.append("<h2>The best policy and the presets</h2>")
    parts.append(_presets_table(rep))
    parts.append("<h2>What tiering buys</h2>")
    parts.append(_tiering_html(rep))
    figures, note = capacity_figures(rep)
    parts.append("<h2>Cost and latency against each tier's capacity</h2>")
    if figures:
        parts.append(f'<p class="note">{html.escape(note)}</p>')
        for tier, fig in figures:
            parts.append(f"<h3>{html.escape(tier)}</h3>")
            parts.append(chart(fig))
    else:
        parts.append('<p class="note">No trial used a tier below HBM.</p>')
    hits = hit_ratio_figure(rep)
    parts.append("<h2>Hit ratio per tier over time</h2>")
    timeline = rep.get("hit_ratio_over_time")
    if hits is not None:
        trial = timeline.get("trial", "?")
        width = timeline.get("window_s")
        per = f" in windows of {width:,.3g} s of arrivals" if width else ""
        parts.append(
            f'<p class="note">Trial {html.escape(str(trial))}, replayed: the share of prompt '
            f"tokens each tier served{per}.</p>"
        )
        parts.append(chart(hits))
    elif isinstance(timeline, str):
        parts.append(f'<p class="note">Not drawn: {html.escape(timeline)}.</p>')
    else:
        parts.append(
            '<p class="note">This study holds no hit ratios over time '
            "(study attribute hit_ratio_over_time).</p>"
        )
    parts.append("<h2>Miss-ratio curve of the trace, in GB of KV</h2>")
    if isinstance(curve, dict):
        parts.append(
            f'<p class="note">LRU, prefix semantics, {curve["block_tokens"]}-token blocks of '
            f"{html.escape(str(curve['model']))} KV ({html.escape(curve['kv_dtype'])}); "
            "the winner's lower tiers are marked.</p>"
        )
        parts.append(chart(mrc_figure(curve)))
    else:
        parts.append(f'<p class="note">Not drawn: {html.escape(curve)}.</p>')
    for sec in sections[2:]:
        if not sec.headers:
            cls = "alert" if sec.alert else "note"
            parts.append(f'<p class="{cls}">{html.escape(sec.title)}</p>')
            continue
        title = sec.title[:1].upper() + sec.title[1:]
        parts.append(f"<h2>{html.escape(title)}</h2>")
        parts.append(html_table(sec.headers, sec.rows))
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>kvtier study {name}</title><style>{STYLE}</style>"
        f'<script type="text/javascript">{get_plotlyjs()}</script>'
        f'</head><body data-charts="{charts}">{"".join(parts)}</body></html>\n'
    )


def write_html(
    rep: dict[str, Any],
    sections: list[Any],
    curve: dict[str, Any] | str,
    path: str | os.PathLike[str],
) -> None:
    page = render_page(rep, sections, curve)
    atomic_write(path, lambda tmp: Path(tmp).write_text(page, encoding="utf-8"))
