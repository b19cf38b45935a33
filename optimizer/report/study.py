"""``kvtier report``: what a study has found, read back from its storage.

The optimize run prints its result once; a study lives on (resumed, shared by workers on many
machines), so this reads any study at any time: the trial counts, the cheapest policy that met
the SLO (or the trial that came closest), the next best ones, the Pareto front of cost against
TTFT P99, which parameters mattered (Optuna's PED-ANOVA importance for cost per token), and
optionally a PNG of every trial's cost against TTFT P99.
"""

from __future__ import annotations

import math
import os
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
from kvtier.report.optimize import STEP_TIME_HINT, fmt_cell
from kvtier.search.objective import objective_metric
from kvtier.search.setup import SHA256_ATTR
from kvtier.search.study import (
    HIT_RATIO_OVER_TIME_ATTR,
    OUTCOME_ATTR,
    TrialSummary,
    best_feasible,
    closest,
    pareto_front,
    read_only_storage,
    storage_error,
    study_objective,
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
    # the trials that meet the SLO, best first by what the study minimised
    key = objective_metric(study_objective(study))
    feasible = sorted(
        (s for s in done if s.feasible),
        key=lambda s: (math.inf if s.metrics.get(key) is None else s.metrics[key], s.number),
    )
    near = None
    if best is None:  # among trials that served the whole trace, when there are any
        from kvtier.search.run import closest_whole

        near = closest_whole(done, slo) or closest(study, slo)
    from kvtier.search.refine import REFINE_ATTR

    refine = study.user_attrs.get(REFINE_ATTR)
    if best is None or not refine or refine.get("from_trial") != best.number:
        refine = None  # a refine of another trial than today's best no longer applies
    return {
        "study": study.study_name,
        "setup": setup,
        "trace_sha256": study.user_attrs.get(SHA256_ATTR),
        "trials": dict(states),
        "finished": len(done),
        "feasible": len(feasible),
        "best": {**asdict(best), "tiers_gb": _tier_gb(best.policy)} if best else None,
        "closest": asdict(near) if near else None,
        "top": [asdict(s) for s in feasible[:top]],
        "pareto_front": [asdict(s) for s in pareto_front(study)],
        "importance": _importances(study, done),
        "refine": refine,
        "best_params": _effective(best, refine),
        "points": [
            {
                "trial": s.number,
                "cost_per_mtok": s.metrics["cost_per_mtok"],
                "ttft_p99_s": s.metrics["ttft_p99_s"],
                "tpot_p99_s": s.metrics.get("tpot_p99_s"),
                "feasible": s.feasible,
                "tiers": _tiers_text(s.policy),
                "tier_gb": _tier_gb(s.policy),
            }
            for s in done
        ],
        # what the latest optimize run compared the winner with (presets, tiering verdict),
        # and the optional curves a study may hold (kvtier.report.html describes their shape)
        "outcome": study.user_attrs.get(OUTCOME_ATTR),
        "hit_ratio_over_time": study.user_attrs.get(HIT_RATIO_OVER_TIME_ATTR),
    }


def _tier_gb(policy: dict[str, Any]) -> dict[str, float]:
    """A policy's lower tiers and their capacities in GB (0: the profile's size)."""
    return {
        t["name"]: float(t.get("capacity_gb") or 0.0)
        for t in policy.get("tiers", [])
        if t.get("name") != "hbm"
    }


def _effective(best: TrialSummary | None, refine: dict[str, Any] | None) -> dict[str, Any]:
    """The best trial's parameters as its policy (the refined one, when refined) has them:
    no settings of a tier it does not use (:func:`kvtier.search.run.effective_params`)."""
    if best is None:
        return {}
    from kvtier.policy.model import policy_from_dict
    from kvtier.search.run import effective_params

    policy = refine["policy"] if refine else best.policy
    try:
        return effective_params(best.params, policy_from_dict(policy, "<best>"))
    except (InputError, ValueError):  # a policy this version cannot read: as recorded
        return dict(best.params)


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
        m = near["metrics"]
        if m.get("early_stopped"):
            n = int(m.get("n_requests", 0) or 0)
            share = int(m.get("n_served", 0) or 0) / n if n else 0.0
            how = (
                f"stopped early once it missed the SLO ({share:.0%} of requests served; "
                "every trial was), and by then missed"
            )
        else:
            how = "which served the whole trace and misses"
        out.append(
            Section(
                f"no trial meets the SLO; closest: trial {near['number']}, {how} {misses}",
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
                    fmt_cell("{:.2f}", m.get("tokens_per_joule")),
                    fmt_cell("{:.3f}", m["ttft_p99_s"]),
                    fmt_cell("{:.1f}", _ms(m["tpot_p99_s"])),
                    str(m.get("instances", "-")),
                    str(pol.get("block_tokens", "-")),
                    _tiers_text(pol),
                ]
            )
        out.append(
            Section(
                "cheapest trials that meet the SLO"
                if (rep.get("setup") or {}).get("objective", "cost") == "cost"
                else "trials that meet the SLO with the fewest joules per token",
                ["trial", "$/1M tok", "tok/J", "TTFT p99 s", "TPOT p99 ms", "inst.", "B", "tiers"],
                rows,
                left=(7,),
            )
        )
        best = rep["best"]
        # as they took effect: the refined policy's, no settings of a tier it does not use
        params = rep.get("best_params") or best["params"]
        out.append(
            Section(
                f"parameters of the best trial ({best['number']})",
                ["parameter", "value"],
                [[k, _param_text(v)] for k, v in sorted(params.items())],
            )
        )
    if rep.get("refine"):
        from kvtier.report.refine import refine_sections

        out += refine_sections(rep["refine"])
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
    if wi.get("refined"):
        whose = "refined best trial"
    out = [
        Section(
            f"architecture what-if: the {whose} ({wi['trial']}) with its memory tiers changed, "
            "each replayed to the end",
            headers,
            rows,
            left=(0, len(headers) - 1),
        )
    ]
    others = [
        v
        for v in wi["variants"][1:]
        if v.get("error") is None and v["feasible"] and v.get("step_factor") is None
    ]
    out += _step_sections(wi)
    if wi["trial_meets_slo"]:
        better = [v for v in others if v["cost_change"] is not None and v["cost_change"] < 0]
        if better:
            names = ", ".join(f"{v['variant']} ({v['cost_change']:+.1%})" for v in better)
            out.append(Section(f"cheaper and still within the SLO: {names}"))
    elif others:
        out.append(Section(f"within the SLO: {', '.join(v['variant'] for v in others)}"))
    return out


def _step_sections(wi: dict[str, Any]) -> list[Section]:
    """With ``--step-time-margin``: whether the policy found meets the SLO on slower and faster
    steps, and what it then costs (not an alternative to buy: the same policy, another cluster)."""
    steps = [v for v in wi["variants"] if v.get("step_factor") is not None]
    if not steps:
        return []
    parts = []
    for v in steps:
        if v.get("error") is not None:
            parts.append(f"{v['step_factor']:g}x as long: {v['error']}")
        else:
            slo = "SLO met" if v["feasible"] else "SLO missed"
            cost = fmt_cell("{:+.1%}", v["cost_change"])
            parts.append(f"{v['step_factor']:g}x as long: {slo}, cost {cost}")
    held = all(v.get("error") is None and v["feasible"] for v in steps)
    text = "the policy found, every engine step " + "; ".join(parts)
    if held or not wi["trial_meets_slo"]:
        return [Section(text)]
    return [
        Section(
            f"{text}: its SLO verdict {STEP_TIME_HINT}",
            alert=True,
        )
    ]


def print_study_report(rep: dict[str, Any], console: Console) -> None:
    print_sections(report_sections(rep), console)


def print_sections(sections: list[Section], console: Console) -> None:
    """Report sections on the terminal: a line of text, or a table."""
    for sec in sections:
        if not sec.headers:
            console.print(f"[red]{escape(sec.title)}[/]" if sec.alert else escape(sec.title))
            continue
        table = Table(title=sec.title, title_justify="left")
        for j, col in enumerate(sec.headers):
            table.add_column(col, justify="left" if j in sec.left else "right")
        for row in sec.rows:
            table.add_row(*(escape(c) for c in row))
        console.print(table)


def _minor_label(value: float, _pos: Any = None) -> str:
    """Minor ticks of a log axis labelled at 2 and 5 of each decade, plainly (0.02, 50)."""
    if value <= 0:
        return ""
    lead = round(value / 10 ** math.floor(math.log10(value)))
    return f"{value:g}" if lead in (2, 5) else ""


def plot_study(rep: dict[str, Any], path: str | os.PathLike[str]) -> None:
    """Every finished trial's cost against TTFT P99 (:func:`study_figure`), written
    atomically."""
    plt = pyplot()
    fig = study_figure(rep)
    try:
        atomic_write(path, lambda tmp: fig.savefig(tmp, format="png"))
    finally:
        plt.close(fig)


def study_figure(rep: dict[str, Any]) -> Any:
    """The matplotlib figure of every finished trial's cost against TTFT P99: the ones meeting
    the SLO marked, the SLO's TTFT bound drawn, the best trial and every replayed preset
    marked and named, the Pareto front; log axes where the values span more than a decade."""
    from kvtier.report.html import BEST_COLOR, PRESET_COLOR, SLO_COLOR, _log_helps

    plt = pyplot()
    pts = [p for p in rep["points"] if math.isfinite(p["ttft_p99_s"])]
    if not pts:
        raise InputError("no finished trial to plot", option="--plot")
    fig, ax = plt.subplots(figsize=(8, 5), dpi=120)
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
    if len(front) > 1:
        ax.plot(
            [s["metrics"]["ttft_p99_s"] for s in front],
            [s["metrics"]["cost_per_mtok"] for s in front],
            c="C3",
            lw=1,
            label="Pareto front",
        )
    xs = [p["ttft_p99_s"] for p in pts]
    ys = [p["cost_per_mtok"] for p in pts]
    presets = [
        p
        for p in ((rep.get("outcome") or {}).get("presets") or [])
        if p.get("metrics")
        and isinstance(p["metrics"].get("ttft_p99_s"), int | float)
        and isinstance(p["metrics"].get("cost_per_mtok"), int | float)
    ]
    if presets:
        px = [p["metrics"]["ttft_p99_s"] for p in presets]
        py = [p["metrics"]["cost_per_mtok"] for p in presets]
        ax.scatter(px, py, marker="D", s=40, c=PRESET_COLOR, label="presets", zorder=3)
        for p, x, y in zip(presets, px, py, strict=True):
            ax.annotate(p["name"], (x, y), textcoords="offset points", xytext=(5, -10), fontsize=7)
        xs += px
        ys += py
    best = rep.get("best")
    if best is not None:
        ax.scatter(
            [best["metrics"]["ttft_p99_s"]],
            [best["metrics"]["cost_per_mtok"]],
            marker="*",
            s=220,
            c=BEST_COLOR,
            edgecolors="k",
            linewidths=0.5,
            label=f"best (trial {best['number']})",
            zorder=4,
        )
    bound = (rep.get("setup") or {}).get("slo", {}).get("ttft_p99_s")
    if isinstance(bound, int | float):
        ax.axvline(bound, c=SLO_COLOR, ls="--", lw=1.5, label=f"SLO: TTFT p99 <= {bound:g} s")
        xs.append(bound)
    from matplotlib.ticker import FuncFormatter

    plain = FuncFormatter(lambda v, _pos: f"{v:g}")  # 0.02, not 2 x 10^-2
    for log, axis, scale in (
        (_log_helps(xs), ax.xaxis, ax.set_xscale),
        (_log_helps(ys), ax.yaxis, ax.set_yscale),
    ):
        if log:
            scale("log")
            axis.set_major_formatter(plain)
            axis.set_minor_formatter(FuncFormatter(_minor_label))
    ax.set_xlabel("TTFT p99 (s)")
    ax.set_ylabel("$ per 1M tokens")
    ax.set_title(f"study {rep['study']}: {len(pts)} trials")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def model_curve(rep: dict[str, Any], trace_path: str | None = None) -> dict[str, Any] | str:
    """The study trace's LRU miss-ratio curve in GB of KV for the study's model, at the
    winner's (or the closest trial's) block size, KV type and tenant sharing; or why not.

    The trace is the one the study recorded (``trace_path`` if it has moved); a file whose
    SHA-256 is not the study's is not used.
    """
    setup = rep.get("setup") or {}
    path = trace_path or setup.get("trace")
    if not path:
        return "the study records no trace"
    if not os.path.exists(path):
        return f"the study's trace {path} is not there (give --trace)"
    from kvtier.policy.file import sha256_of

    recorded = rep.get("trace_sha256")
    if recorded and sha256_of(path) != recorded:
        return f"{path} is not the trace the study ran on (another SHA-256)"
    from kvtier.cache import default_capacities, miss_ratio_curve
    from kvtier.cache.curve import working_set_blocks
    from kvtier.hardware import load_model
    from kvtier.hardware.types import GB
    from kvtier.trace.blocks import block_trace
    from kvtier.trace.io import read_trace

    shown = rep.get("best") or rep.get("closest") or {}
    policy = shown.get("policy") or {}
    B = int(policy.get("block_tokens") or 16)
    kv_dtype = str(policy.get("kv_dtype") or "bf16")
    try:
        model = load_model(str(setup.get("model")))
    except InputError as err:
        return f"the study's model cannot be loaded: {err.message}"
    blocked = block_trace(
        read_trace(path), B, share_across_tenants=bool(policy.get("share_across_tenants"))
    )
    working = working_set_blocks(blocked)
    if working < 2:
        return "the trace reuses no block"
    curve = miss_ratio_curve(blocked, "lru", default_capacities(working, 40))
    block_gb = model.kv_bytes_per_token(kv_dtype) * B / GB
    return {
        "model": setup.get("model"),
        "kv_dtype": kv_dtype,
        "block_tokens": B,
        "block_gb": block_gb,
        "points": [
            {
                "capacity_gb": p.capacity_blocks * block_gb,
                "hit_ratio_tokens": p.hit_ratio_tokens,
                "hit_ratio_blocks": p.hit_ratio_blocks,
            }
            for p in curve.points
        ],
        "tiers_gb": _tier_gb(policy),
    }


def html_study_report(
    rep: dict[str, Any], path: str | os.PathLike[str], curve: dict[str, Any] | str
) -> None:
    """One self-contained HTML page of the report with interactive charts
    (:mod:`kvtier.report.html`), written atomically."""
    from kvtier.report.html import write_html

    write_html(rep, report_sections(rep), curve, path)


def _ms(seconds: float | None) -> float | None:
    """Milliseconds of a latency that may not exist (None: no request of two tokens)."""
    return None if seconds is None else seconds * 1e3
