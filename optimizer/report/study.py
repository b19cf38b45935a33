"""``kvtier report``: what a study has found, read back from its storage.

The optimize run prints its result once; a study lives on (resumed, shared by workers on many
machines), so this reads any study at any time: the trial counts, the cheapest policy that met
the SLO (or the trial that came closest), the next best ones, the Pareto front of cost against
TTFT P99, which parameters mattered (Optuna's PED-ANOVA importance for cost per token), and
optionally a PNG of every trial's cost against TTFT P99.
"""

from __future__ import annotations

import base64
import html
import math
import os
import tempfile
import warnings
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import optuna
import sqlalchemy.exc
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from kvtier.errors import InputError
from kvtier.files import atomic_write
from kvtier.plotting import pyplot
from kvtier.report.optimize import fmt_cell
from kvtier.search.study import (
    TrialSummary,
    best_feasible,
    closest,
    pareto_front,
    read_only_storage,
    storage_error,
    summaries,
)


def load_existing_study(name: str, storage: str | None, runs_dir: Path = Path("runs")) -> Any:
    """Open study ``name`` without creating anything; one-line errors when it is not there."""
    if storage is None:
        path = runs_dir / f"{name}.db"
        if not path.is_file():
            known = sorted(p.stem for p in runs_dir.glob("*.db")) if runs_dir.is_dir() else []
            hint = f" (studies in {runs_dir}/: {', '.join(known)})" if known else ""
            raise InputError(f"no study {name!r}: {path} does not exist{hint}", option="--study")
        storage = f"sqlite:///{path}"
    elif not storage.strip():
        raise InputError(
            "must be an Optuna storage URL; leave it out for sqlite:///runs/STUDY.db",
            option="--storage",
        )
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        return optuna.load_study(study_name=name, storage=read_only_storage(storage, name))
    except KeyError:
        raise InputError(f"no study {name!r} in {storage}", option="--study") from None
    except (
        ImportError,
        ValueError,
        RuntimeError,
        sqlalchemy.exc.SQLAlchemyError,
        optuna.exceptions.OptunaError,  # StorageInternalError: a file that is not a database
    ) as err:
        raise storage_error(name, storage, err) from None


def _importances(study: Any, done: list[TrialSummary]) -> dict[str, float] | str:
    """Importance of each parameter for cost per token, or why there is none.

    PED-ANOVA (Optuna's ``PedAnovaImportanceEvaluator``, Watanabe et al., IJCAI 2023) asks
    which parameters set the cheapest 10% of trials apart from the rest; unlike fANOVA it
    needs no scikit-learn, and it reads the question a user has ("what made the good ones
    good") directly.
    """
    if len(done) < 4:
        return "too few finished trials (fewer than 4)"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            result = optuna.importance.get_param_importances(
                study,
                target=lambda t: t.values[0],
                evaluator=optuna.importance.PedAnovaImportanceEvaluator(),
            )
    except (RuntimeError, ValueError, ImportError) as err:
        return f"not computable: {err}"
    return {k: float(v) for k, v in result.items()}


def study_report(study: Any, *, top: int = 10) -> dict[str, Any]:
    """Everything ``kvtier report`` shows, as plain data (the ``--json`` output)."""
    states = Counter(t.state.name.lower() for t in study.get_trials(deepcopy=False))
    done = summaries(study)
    setup = dict(study.user_attrs.get("setup", {}))
    slo = setup.get("slo") or {}
    best = best_feasible(study)
    feasible = sorted(
        (s for s in done if s.feasible), key=lambda s: (s.metrics["cost_per_mtok"], s.number)
    )
    near = closest(study, slo) if best is None else None
    return {
        "study": study.study_name,
        "setup": setup,
        "trials": dict(states),
        "finished": len(done),
        "feasible": len(feasible),
        "best": asdict(best) if best else None,
        "closest": asdict(near) if near else None,
        "top": [asdict(s) for s in feasible[:top]],
        "pareto_front": [asdict(s) for s in pareto_front(study)],
        "importance": _importances(study, done),
        "points": [
            {
                "trial": s.number,
                "cost_per_mtok": s.metrics["cost_per_mtok"],
                "ttft_p99_s": s.metrics["ttft_p99_s"],
                "feasible": s.feasible,
            }
            for s in done
        ],
    }


def _param_text(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _tiers_text(policy: dict[str, Any]) -> str:
    """``hbm + dram 64 GB (lru) + ssd 2000 GB (fifo)``: the tiers a trial's policy lists."""
    parts = []
    for t in policy.get("tiers", []):
        name = t.get("name", "?")
        if name == "hbm":
            parts.append("hbm")
            continue
        cap = t.get("capacity_gb")
        size = f" {cap:,.0f} GB" if isinstance(cap, int | float) else ""
        parts.append(f"{name}{size} ({t.get('eviction', 'lru')})")
    return " + ".join(parts)


@dataclass
class Section:
    """One table of the report, or a line of text when ``headers`` is empty."""

    title: str
    headers: list[str] = field(default_factory=list)
    rows: list[list[str]] = field(default_factory=list)
    left: tuple[int, ...] = (0,)  # columns aligned left; the others are numbers
    alert: bool = False


def report_sections(rep: dict[str, Any]) -> list[Section]:
    """The report as text lines and tables, in order: what the terminal and HTML both show."""
    counts = ", ".join(f"{n} {state}" for state, n in sorted(rep["trials"].items()))
    out = [Section(f"study {rep['study']}: {counts}; {rep['feasible']} meet the SLO")]
    setup = rep["setup"]
    if setup:
        slo = ", ".join(f"{k[:-2]} <= {v:g} s" for k, v in setup.get("slo", {}).items())
        out.append(
            Section(
                f"trace {setup.get('trace')}, {setup.get('hardware')}, {setup.get('model')}, "
                f"load {setup.get('load')}, SLO: {slo or 'none'}"
            )
        )
    if rep["best"] is None:
        near = rep["closest"]
        if near is None:
            return [*out, Section("no trial has finished", alert=True)]
        misses = ", ".join(f"{k} by {v:.3g}" for k, v in near["violations"].items() if v > 0)
        out.append(
            Section(
                f"no trial meets the SLO; closest: trial {near['number']}, which misses {misses}",
                alert=True,
            )
        )
    if rep["top"]:
        rows = []
        for t in rep["top"]:
            m, pol = t["metrics"], t["policy"]
            rows.append(
                [
                    str(t["number"]),
                    fmt_cell("{:.4f}", m["cost_per_mtok"]),
                    fmt_cell("{:.3f}", m["ttft_p99_s"]),
                    fmt_cell("{:.1f}", _ms(m["tpot_p99_s"])),
                    str(m.get("instances", "-")),
                    str(pol.get("block_tokens", "-")),
                    _tiers_text(pol),
                ]
            )
        out.append(
            Section(
                "cheapest trials that meet the SLO",
                ["trial", "$/1M tok", "TTFT p99 s", "TPOT p99 ms", "inst.", "B", "tiers"],
                rows,
                left=(6,),
            )
        )
        best = rep["best"]
        out.append(
            Section(
                f"parameters of the best trial ({best['number']})",
                ["parameter", "value"],
                [[k, _param_text(v)] for k, v in sorted(best["params"].items())],
            )
        )
    if len(rep["pareto_front"]) > 1:
        rows = [
            [
                str(t["number"]),
                fmt_cell("{:.4f}", t["metrics"]["cost_per_mtok"]),
                fmt_cell("{:.3f}", t["metrics"]["ttft_p99_s"]),
            ]
            for t in rep["pareto_front"]
        ]
        out.append(
            Section("Pareto front (cost vs TTFT p99)", ["trial", "$/1M tok", "TTFT p99 s"], rows)
        )
    imp = rep["importance"]
    if isinstance(imp, dict) and imp:
        out.append(
            Section(
                "what set the cheapest trials apart (PED-ANOVA)",
                ["parameter", "importance"],
                [[k, f"{v:.1%}"] for k, v in imp.items()],
            )
        )
    elif isinstance(imp, str):
        out.append(Section(f"parameter importance: {imp}"))
    if rep.get("what_if"):
        out += _what_if_sections(rep["what_if"])
    return out


def _what_if_sections(wi: dict[str, Any]) -> list[Section]:
    """The architecture what-if (``report --what-if``): its table, and the variants that beat
    the policy found (cheaper within the SLO; or, when it misses the SLO, meeting it)."""
    capacity = wi["load"] == "capacity"
    headers = ["variant", "$/1M tok", "vs found", "TTFT mean s", "TTFT p99 s", "TPOT p99 ms"]
    headers += ["hit", *(["load x"] if capacity else []), "SLO"]
    rows = []
    for j, v in enumerate(wi["variants"]):  # the first is the policy as found
        if v.get("error") is not None:
            rows.append([v["variant"], *["-"] * (len(headers) - 2), v["error"]])
            continue
        change = v["cost_change"]
        slo = "met" if v["feasible"] else "missed"
        if not v["feasible"] and v["slo_attainment"] is not None:
            slo = f"missed ({v['slo_attainment']:.0%} of requests meet it)"
        rows.append(
            [
                v["variant"],
                fmt_cell("{:.4f}", v["cost_per_mtok"]),
                "" if j == 0 else fmt_cell("{:+.1%}", change),
                fmt_cell("{:.3f}", v["ttft_mean_s"]),
                fmt_cell("{:.3f}", v["ttft_p99_s"]),
                fmt_cell("{:.1f}", _ms(v["tpot_p99_s"])),
                fmt_cell("{:.1%}", sum(v["hit_ratio_tokens"].values())),
                *([fmt_cell("{:.3g}", v["rate_scale"])] if capacity else []),
                slo,
            ]
        )
    whose = "best trial" if wi["trial_meets_slo"] else "closest trial"
    out = [
        Section(
            f"architecture what-if: the {whose} ({wi['trial']}) with its memory tiers changed, "
            "each replayed to the end",
            headers,
            rows,
            left=(0, len(headers) - 1),
        )
    ]
    others = [v for v in wi["variants"][1:] if v.get("error") is None and v["feasible"]]
    if wi["trial_meets_slo"]:
        better = [v for v in others if v["cost_change"] is not None and v["cost_change"] < 0]
        if better:
            names = ", ".join(f"{v['variant']} ({v['cost_change']:+.1%})" for v in better)
            out.append(Section(f"cheaper and still within the SLO: {names}"))
    elif others:
        out.append(Section(f"within the SLO: {', '.join(v['variant'] for v in others)}"))
    return out


def print_study_report(rep: dict[str, Any], console: Console) -> None:
    for sec in report_sections(rep):
        if not sec.headers:
            console.print(f"[red]{escape(sec.title)}[/]" if sec.alert else escape(sec.title))
            continue
        table = Table(title=sec.title, title_justify="left")
        for j, col in enumerate(sec.headers):
            table.add_column(col, justify="left" if j in sec.left else "right")
        for row in sec.rows:
            table.add_row(*(escape(c) for c in row))
        console.print(table)


def plot_study(rep: dict[str, Any], path: str | os.PathLike[str]) -> None:
    """Every finished trial's cost against TTFT P99 (feasible ones marked), written atomically."""
    plt = pyplot()
    pts = [p for p in rep["points"] if math.isfinite(p["ttft_p99_s"])]
    if not pts:
        raise InputError("no finished trial to plot", option="--plot")
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
    for ok, style in ((False, dict(c="0.6", marker="x")), (True, dict(c="C0", marker="o"))):
        sel = [p for p in pts if p["feasible"] is ok]
        ax.scatter(
            [p["ttft_p99_s"] for p in sel],
            [p["cost_per_mtok"] for p in sel],
            label="meets the SLO" if ok else "misses it",
            s=18,
            **style,
        )
    front = rep["pareto_front"]
    if front:
        ax.plot(
            [s["metrics"]["ttft_p99_s"] for s in front],
            [s["metrics"]["cost_per_mtok"] for s in front],
            c="C3",
            lw=1,
            label="Pareto front",
        )
    ax.set_xlabel("TTFT p99 (s)")
    ax.set_ylabel("$ per 1M tokens")
    ax.set_title(f"study {rep['study']}: {len(pts)} trials")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    atomic_write(path, lambda tmp: fig.savefig(tmp, format="png"))
    plt.close(fig)


def _html_table(headers: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def html_study_report(rep: dict[str, Any], path: str | os.PathLike[str]) -> None:
    """One self-contained HTML page of the report (the plot embedded), written atomically.

    For sharing a study's result with people who will not run kvtier; without matplotlib the
    page has the tables and says the plot is missing.
    """
    parts = [f"<h1>kvtier study {html.escape(rep['study'])}</h1>"]
    for sec in report_sections(rep):
        if not sec.headers:
            text = html.escape(sec.title)
            parts.append(f"<p><b>{text}</b></p>" if sec.alert else f"<p>{text}</p>")
            continue
        title = sec.title[:1].upper() + sec.title[1:]
        parts.append(f"<h2>{html.escape(title)}</h2>")
        parts.append(_html_table(sec.headers, sec.rows))
    try:
        with tempfile.TemporaryDirectory() as tmp:
            png = Path(tmp) / "trials.png"
            plot_study(rep, png)
            data = base64.b64encode(png.read_bytes()).decode("ascii")
        parts.append("<h2>Every trial</h2>")
        parts.append(f'<img alt="cost against TTFT p99" src="data:image/png;base64,{data}">')
    except InputError as err:
        parts.append(f"<p>(no plot: {html.escape(err.message)})</p>")
    style = (
        "body{font-family:system-ui,sans-serif;max-width:60em;margin:2em auto;padding:0 1em}"
        "table{border-collapse:collapse;margin:.5em 0}"
        "td,th{border:1px solid #ccc;padding:.2em .6em;text-align:right}"
        "th{background:#f4f4f4}img{max-width:100%}"
    )
    page = (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        f"<title>kvtier study {html.escape(rep['study'])}</title><style>{style}</style>"
        f"</head><body>{''.join(parts)}</body></html>\n"
    )
    atomic_write(path, lambda tmp: Path(tmp).write_text(page, encoding="utf-8"))


def _ms(seconds: float | None) -> float | None:
    """Milliseconds of a latency that may not exist (None: no request of two tokens)."""
    return None if seconds is None else seconds * 1e3
