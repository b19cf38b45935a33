"""How ``optimize`` reports: a rich table for people, a JSON object for scripts."""

from __future__ import annotations

import math
from dataclasses import asdict
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from kvtier.policy.model import SLO_TERMS
from kvtier.report.energy import TOK_PER_J

ROWS = (
    ("$ per 1M tok", "cost_per_mtok", "{:.4f}"),
    ("$ per hour", "cost_per_hour", "{:,.2f}"),
    TOK_PER_J,
    ("TTFT mean s", "ttft_mean_s", "{:.3f}"),
    ("TTFT p99 s", "ttft_p99_s", "{:.3f}"),
    ("TPOT p99 s", "tpot_p99_s", "{:.4f}"),
    ("tok/s", "throughput_tps", "{:,.0f}"),
    ("inst.", "instances", "{}"),
)


# shown when the SLO bounds the TBT (only then do the trials' replays track token intervals)
TBT_ROW = ("TBT p99 s", "tbt_p99_s", "{:.4f}")


def _inert_params(best: Any) -> dict[str, str]:
    """The winner's sampled parameters that took no effect, each with why: split keys when its
    split left one instance aggregated (kvtier.policy.model.inert_split_keys), settings of
    lower tiers and transfers it has none of (movement_keys_without_effect); the policy file
    leaves the split keys out and writes the others at their defaults."""
    from kvtier.policy.model import (
        inert_split_keys,
        movement_keys_without_effect,
        policy_from_dict,
        ran_split,
    )

    instances = int(best.metrics.get("instances", 0) or 0)
    policy = policy_from_dict(best.policy, "<best>")
    out = dict.fromkeys(inert_split_keys(policy.serving, instances), "aggregated")
    idle = movement_keys_without_effect(policy, ran_split(policy, instances))
    out.update({k: why for k, why in idle.items() if k in best.params})
    return out


def fmt_cell(fmt: str, value: Any) -> str:
    """A table cell: ``value`` formatted, or ``-`` when there is none (None, NaN, infinite)."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    return fmt.format(value)


def _slo_text(slo: Any) -> str:
    return ", ".join(
        f"{t[:-2]} <= {getattr(slo, t):g} s" for t in SLO_TERMS if getattr(slo, t) is not None
    )


def _misses(violations: dict[str, float]) -> str:
    parts = [
        f"{k} by {v:.3g}" + ("" if k == "completion" else " s")
        for k, v in violations.items()
        if v > 0
    ]
    return ", ".join(parts)


TERM_WORDS = {
    "ttft_p99_s": "the time to first token of the slowest 1% of requests",
    "ttft_p999_s": "the time to first token of the slowest 0.1% of requests",
    "ttft_mean_s": "the mean time to first token",
    "tpot_p99_s": "the time per output token of the slowest 1% of requests",
    "tbt_p99_s": "the mean of the longest 10% token intervals of the slowest 1% of requests",
    "completion": "requests left unfinished at the end of the trace",
}


def bound_text(bound: Any) -> str:
    """One line: the SLO against its lower bound on this trace and hardware."""
    terms = ", ".join(
        f"{k[:-2]} >= {v:.3g} s" for k, v in bound.bounds.items() if k in bound.requested
    )
    cached = f"an infinite cache could serve {bound.cached_share:.0%} of prompt tokens"
    if bound.unreachable:
        return (
            f"[red]The SLO is out of reach on this hardware:[/] no policy can do better than "
            f"{terms} (prefill of each prompt's unshared tokens alone on an idle instance of "
            f"tp={bound.tp}; {cached}). The tightest SLO not ruled out: "
            f"--slo {bound.suggestion()}"
        )
    return f"SLO lower bound on this hardware: {terms} (tp={bound.tp}; {cached})."


def _gb(tiers: dict[str, float]) -> str:
    if not tiers:
        return "HBM only"
    return ", ".join(f"{k} {v:,.0f} GB" if v else k for k, v in tiers.items())


def _print_tiering(result: Any, console: Console) -> None:
    """The cheapest tiered and HBM-only policies meeting the SLO, and one sentence."""
    tiered, hbm = getattr(result, "tiered", None), getattr(result, "hbm_only", None)
    if tiered is None and hbm is None:
        return
    table = Table(
        title="what tiering buys (cheapest policies meeting the SLO)", title_justify="left"
    )
    for col in ("", "$ per 1M tok", "$ per hour", "GPUs", "TTFT p99 s", "lower tiers", "from"):
        table.add_column(col, justify="left" if col in ("", "lower tiers", "from") else "right")
    for name, c in (("with tiers", tiered), ("HBM only", hbm)):
        if c is None:
            table.add_row(name, "-", "-", "-", "-", "none the search tried meets the SLO", "")
        else:
            table.add_row(
                name,
                f"{c.cost_per_mtok:.4f}",
                f"{c.cost_per_hour:,.2f}",
                str(c.gpus),
                f"{c.ttft_p99_s:.3f}",
                _gb(c.tiers),
                c.label,
            )
    console.print(table)
    console.print(tiering_sentence(tiered, hbm, feasible_presets(result)))


def feasible_presets(result: Any) -> list[tuple[str, float, bool]]:
    """``(name, $ per 1M tokens, has lower tiers)`` of each preset that met the SLO."""
    found = []
    for b in getattr(result, "baselines", None) or []:
        ev = b.evaluation
        if ev is None or not ev.feasible:
            continue
        tiered = any(t.name != "hbm" for t in getattr(ev.policy, "tiers", ()) or ())
        found.append((b.name, float(ev.cost_per_mtok), tiered))
    return found


def _cheapest_preset(
    presets: list[tuple[str, float, bool]], tiered: bool, below: float = float("inf")
) -> tuple[str, float, bool] | None:
    """The cheapest preset of that kind (with lower tiers or not) that met the SLO for less
    than ``below``; None without one."""
    kind = [p for p in presets if p[2] == tiered and p[1] < below]
    return min(kind, key=lambda p: p[1]) if kind else None


def _presets_that_did(presets: list[tuple[str, float, bool]], tiered: bool) -> str:
    """``, though the preset X (outside the searched space) did at $Y per 1M tokens`` for the
    cheapest feasible preset of that kind; empty without one."""
    found = _cheapest_preset(presets, tiered)
    if found is None:
        return ""
    name, cost, _ = found
    return (
        f", though the preset {name} (outside the searched space) did at ${cost:.4f} per 1M tokens"
    )


def _n_gpus(n: int) -> str:
    return f"{n} GPU" if n == 1 else f"{n} GPUs"


def tiering_sentence(
    tiered: Any, hbm: Any, presets: list[tuple[str, float, bool]] | None = None
) -> str:
    """The value of tiering in one sentence, from the two cheapest policies the search found
    (``presets``: those of :func:`feasible_presets`, named when they met the SLO where the
    search's policies of their kind did not, so the sentence never contradicts their rows)."""
    presets = presets or []
    if tiered is None:
        did = _presets_that_did(presets, tiered=True)
        return (
            f"No tiered policy the search tried met the SLO{did}: tiering does not pay here."
            if not did
            else f"No tiered policy the search tried met the SLO{did}."
        )
    if hbm is None:
        return (
            f"Only tiered policies met the SLO in the search: {tiered.gpus} GPUs with "
            f"{_gb(tiered.tiers)} at ${tiered.cost_per_mtok:.4f} per 1M tokens; no HBM-only "
            f"policy the search tried did on this hardware{_presets_that_did(presets, False)}."
        )
    saving = 1 - tiered.cost_per_mtok / hbm.cost_per_mtok
    gpus = hbm.gpus - tiered.gpus
    beaten = _presets_below(presets, tiered.cost_per_mtok, hbm.cost_per_mtok)
    if saving <= 0 and gpus <= 0:
        return (
            f"Tiering does not pay here: the best HBM-only policy costs "
            f"${hbm.cost_per_mtok:.4f} per 1M tokens on {_n_gpus(hbm.gpus)}, the best tiered "
            f"one ${tiered.cost_per_mtok:.4f} on {_n_gpus(tiered.gpus)}.{beaten}"
        )
    fewer = (
        f"{gpus} fewer {'GPU' if gpus == 1 else 'GPUs'} ({tiered.gpus} instead of {hbm.gpus})"
        if gpus > 0
        else (f"the same {_n_gpus(tiered.gpus)}" if gpus == 0 else f"{_n_gpus(-gpus)} more")
    )
    word = "less" if saving >= 0 else "more"
    flat_below = _cheapest_preset(presets, False, below=hbm.cost_per_mtok) is not None
    reference = "the searched HBM-only policy" if flat_below else "HBM alone"
    return (
        f"Tiering ({_gb(tiered.tiers)}) meets the SLO with {fewer} and costs "
        f"{abs(saving):.0%} {word} per token than {reference} "
        f"(${tiered.cost_per_mtok:.4f} vs ${hbm.cost_per_mtok:.4f} per 1M tokens).{beaten}"
    )


def _presets_below(presets: list[tuple[str, float, bool]], tiered: float, hbm: float) -> str:
    """A sentence naming the cheapest preset of each kind that met the SLO for less than the
    search's policy of that kind, and how it compares with the other kind, so the tiering
    sentence never contradicts the presets' rows; empty when none did."""
    out = ""
    for kind, mine, other, label in (
        (False, hbm, tiered, "HBM only"),
        (True, tiered, hbm, "tiered"),
    ):
        found = _cheapest_preset(presets, kind, below=mine)
        if found is None:
            continue
        name, cost, _ = found
        versus = "less" if cost < other else "more"
        out += (
            f" The preset {name} ({label}) met it for less, "
            f"${cost:.4f} per 1M tokens, {abs(1 - cost / other):.0%} {versus} than the best "
            f"{'tiered' if not kind else 'HBM-only'} policy found."
        )
    return out


def _print_reached(result: Any, console: Console) -> None:
    """What the trials reached when none met the SLO: cost against TTFT P99."""
    front = getattr(result, "reached", None) or []
    if not front:
        console.print(
            "What the trials reached is not measured: a replay stops once it misses the SLO. "
            "Rerun with a looser --slo (above the bound, if one is printed) to see the front."
        )
        return
    table = Table(
        title="what was reached (cost vs TTFT p99, no trial met the SLO)", title_justify="left"
    )
    for col in ("trial", "$ per 1M tok", "TTFT p99 s", "TPOT p99 s", "GPUs", "replay"):
        table.add_column(col, justify="left" if col == "replay" else "right")
    for s in front:
        m = s.metrics
        tp = s.policy.get("serving", {}).get("tp") or 1
        table.add_row(
            str(s.number),
            fmt_cell("{:.4f}", m.get("cost_per_mtok")),
            fmt_cell("{:.3f}", m.get("ttft_p99_s")),
            fmt_cell("{:.4f}", m.get("tpot_p99_s")),
            str(int(m.get("gpus") or int(m.get("instances", 0)) * int(tp))),
            _replay_words(m),
        )
    console.print(table)
    if any(m.metrics.get("early_stopped") for m in front):
        console.print(
            "A trial stopped early has the figures of the requests it reached before it "
            "certainly missed the SLO, not of the whole trace."
        )
    fastest = min(front, key=lambda s: s.metrics["ttft_p99_s"])
    console.print(
        f"The tightest TTFT p99 reached: {fastest.metrics['ttft_p99_s']:.3g} s "
        f"(trial {fastest.number}, ${fastest.metrics['cost_per_mtok']:.4f} per 1M tokens)."
    )


def _replay_words(m: dict[str, Any]) -> str:
    """Whether a trial's figures are of the whole trace or of a replay stopped early."""
    if not m.get("early_stopped"):
        return "whole trace"
    n = int(m.get("n_requests", 0) or 0)
    share = int(m.get("n_served", 0) or 0) / n if n else 0.0
    return f"stopped early ({share:.0%} served)"


def closest_words(near: Any) -> str:
    """How much of the trace the closest trial's figures describe, said plainly."""
    m = near.metrics
    if m.get("replayed_to_end"):
        return (
            f"replayed to the end for this diagnosis (the early stop cut every trial short; "
            f"this one got furthest, {float(m.get('share_before', 0.0)):.0%} of requests)"
        )
    if m.get("early_stopped"):
        n = int(m.get("n_requests", 0) or 0)
        share = int(m.get("n_served", 0) or 0) / n if n else 0.0
        return f"stopped early once it missed the SLO ({share:.0%} of requests served)"
    return "which served the whole trace"


def _print_no_winner(result: Any, console: Console) -> None:
    """No trial met the SLO: the closest one, why it missed, and what the trials reached."""
    near = result.closest
    if near is None:
        console.print("[red]no trial finished[/]")
        return
    console.print(
        f"[red]no trial met the SLO.[/] Closest: trial {near.number} "
        f"({escape(', '.join(f'{k}={v}' for k, v in near.params.items()))}), "
        f"{closest_words(near)}; it misses "
        f"{_misses(near.violations)}; the binding constraint is [bold]{result.binding}[/] "
        f"({TERM_WORDS.get(result.binding or '', result.binding)}). "
        "Relax it, allow more hardware (--max-hosts), or lower --rate-scale."
    )
    rejected = int(near.metrics.get("n_rejected", 0) or 0)
    if rejected and not near.metrics.get("early_stopped"):
        # counted on a whole replay: requests no instance of this policy can ever hold
        console.print(
            f"Trial {near.number} rejected {rejected:,} of "
            f"{int(near.metrics.get('n_requests', 0) or 0):,} requests: larger than an "
            "instance's HBM pool (tiers.hbm.capacity_gb, serving.tp, kv_dtype), or under "
            "vllm_v0 a prompt over serving.max_num_batched_tokens."
        )
    _print_reached(result, console)


def print_result(result: Any, console: Console) -> None:
    console.print(
        f"study [bold]{result.study_name}[/] ({result.storage}): {result.new_trials} new trials, "
        f"{result.n_trials} in all, {result.seconds:.1f} s; SLO: {_slo_text(result.slo)}"
    )
    bound = getattr(result, "bound", None)
    if bound is not None:
        console.print(bound_text(bound))
    fraction = getattr(result, "sample_fraction", 1.0)
    if fraction != 1.0:
        console.print(
            f"note: the trace is a {fraction:g} sample, replayed on {fraction:g} of each "
            "deployment: instances, GPUs and $ per hour below are that scaled cluster's "
            f"({1 / fraction:g}x for the deployment a policy file describes); $ per 1M tokens "
            "and latencies stand for both"
        )
    for line in getattr(result, "sample_warnings", []) or []:
        console.print(f"[yellow]warning:[/] {escape(line)}")
    weighting = getattr(result, "sample_weighting", None)
    if weighting:
        console.print(f"note: {escape(weighting)}")
    best = result.best
    if best is None:
        _print_no_winner(result, console)
        return
    table = Table(
        title="best policy and the presets, on this trace, hardware, model and SLO",
        title_justify="left",
    )
    at = next(i for i, r in enumerate(ROWS) if r[1] == "tpot_p99_s") + 1
    rows = (*ROWS[:at], TBT_ROW, *ROWS[at:]) if result.slo.tbt_p99_s is not None else ROWS
    table.add_column("policy", style="bold")
    for label, _, _ in rows:
        table.add_column(label, justify="right")
    table.add_column("meets SLO")
    refined = getattr(result, "refined", None)
    if refined is not None and refined.changes:
        table.add_row(
            f"best, refined (from trial {best.number})",
            *(fmt_cell(fmt, refined.metrics.get(key)) for _, key, fmt in rows),
            "yes",
        )
        table.add_row(
            f"trial {best.number} as searched",
            *(fmt_cell(fmt, best.metrics.get(key)) for _, key, fmt in rows),
            "yes",
        )
    else:
        table.add_row(
            f"best (trial {best.number})",
            *(fmt_cell(fmt, best.metrics.get(key)) for _, key, fmt in rows),
            "yes",
        )
    left_out = []
    for b in result.baselines:
        if b.evaluation is None:
            left_out.append(f"{b.name} ({b.error})" if b.error else b.name)
            continue
        m = b.evaluation.metrics
        verdict = "yes" if b.evaluation.feasible else "no: " + _misses(b.evaluation.violations)
        table.add_row(
            b.name, *(fmt_cell(fmt, getattr(m, key)) for _, key, fmt in rows), escape(verdict)
        )
    console.print(table)
    if result.baselines and len(left_out) < len(result.baselines):
        console.print(
            "Each preset runs at the tensor-parallel size the model needs and on its own "
            "fewest instances that meet the SLO (inst.)."
        )
    if left_out:
        console.print(escape(f"Presets left out, each for its reason: {'; '.join(left_out)}."))
    params = Table(title="chosen parameters", title_justify="left", show_header=False)
    params.add_column("name", style="bold")
    params.add_column("value", justify="right")
    inert = _inert_params(best)
    shown = dict(getattr(result, "winner_params", None) or best.params)
    shown.update({k: best.params[k] for k in inert if k in best.params})  # marked below
    for k, v in sorted(shown.items()):
        text = f"{v:.4g}" if isinstance(v, float) else str(v)
        if k in inert:  # e.g. a share of one instance: aggregated, the split's keys do nothing
            text += f" (no effect: {inert[k]})"
        params.add_row(k, text)
    if result.best.rate_scale != 1.0:
        params.add_row("load (rate scale)", f"{best.rate_scale:.3g}x the trace's arrival rate")
    console.print(params)
    _print_tiering(result, console)
    if refined is not None:
        from kvtier.report.refine import print_refine

        print_refine(refined.to_attrs(), console)
    cost = refined.cost_per_mtok if refined is not None else best.metrics["cost_per_mtok"]
    feasible = {
        b.name: b.evaluation
        for b in result.baselines
        if b.evaluation is not None and b.evaluation.feasible
    }
    if feasible:
        cheapest = min(feasible, key=lambda n: feasible[n].cost_per_mtok)
        named = [n for n in ("vllm-hbm", cheapest) if n in feasible]
        for name in dict.fromkeys(named):
            saving = 1 - cost / feasible[name].cost_per_mtok
            word = "cheaper" if saving >= 0 else "more expensive"
            label = f"{name} (the cheapest preset that meets it)" if name == cheapest else name
            console.print(f"{abs(saving):.0%} {word} per token than {label} at the same SLO.")
    elif result.baselines:
        console.print("No preset meets the SLO on this trace and hardware.")
    if result.front:
        front = Table(title="Pareto front (cost vs TTFT p99)", title_justify="left")
        for col in ("trial", "cost per 1M tokens", "TTFT p99"):
            front.add_column(col, justify="right")
        for s in result.front:
            front.add_row(
                str(s.number),
                f"${s.metrics['cost_per_mtok']:.4f}",
                f"{s.metrics['ttft_p99_s']:.3f} s",
            )
        console.print(front)
    target = getattr(result, "target", None)
    if target is not None:
        console.print(f"Searched only what {target} can express (--target {target}).")
    elif getattr(result, "runnable_by", None) is not None:
        runnable = result.runnable_by
        console.print(
            "Targets that can run this policy as simulated: "
            + (", ".join(runnable) if runnable else "none (use --target to search one)")
            + "."
        )
        _print_per_target(result, console)
    for line in step_margin_lines(getattr(result, "step_margin", None) or []):
        console.print(line)
    if result.policy_path is not None:
        trace = result.extra.get("trace", "TRACE")
        console.print(
            f"policy written to [bold]{result.policy_path}[/]; reproduce with "
            f"kvtier replay --policy {result.policy_path} --trace {trace}"
        )


# what the step-margin reports (optimize, compare, report --what-if) say when a verdict changes
STEP_TIME_HINT = (
    "turns on step-time accuracy; calibrate the step times on your own cluster "
    "(kvtier calibrate, docs/calibrate.md)"
)


def step_margin_lines(rows: list[dict[str, Any]]) -> list[str]:
    """The winner on slower and faster steps (``--step-time-margin``): its SLO and cost at
    each, in red when it misses the SLO at one (the verdict then turns on step time)."""
    if not rows:
        return []
    parts = []
    for r in rows:
        slo = "meets the SLO" if r["feasible"] else f"misses the SLO ({r['slo_attainment']:.0%})"
        parts.append(
            f"{r['factor']:g}x: {slo}, ${r['cost_per_mtok']:.4f} per 1M tokens, TTFT p99 "
            f"{r['ttft_p99_s']:.3f} s"
        )
    text = "The winner with every engine step " + "; ".join(parts)
    if all(r["feasible"] for r in rows):
        return [text + "."]
    return [f"[red]{escape(text)}[/]: its SLO verdict {STEP_TIME_HINT}."]


def _print_per_target(result: Any, console: Console) -> None:
    """The cheapest policy each target can run as simulated, beside the winner, with the
    price of the difference."""
    rows = getattr(result, "per_target", None) or []
    if not rows:
        return
    table = Table(
        title="the cheapest policy each target can run as simulated", title_justify="left"
    )
    for col in ("target", "policy", "$ per 1M tok", "vs best"):
        table.add_column(col, justify="left" if col in ("target", "policy") else "right")
    for r in rows:
        if r.cost_per_mtok is None:
            table.add_row(
                r.target,
                "none meeting the SLO (no trial it runs, nor the winner adapted)",
                "-",
                "-",
            )
            continue
        label = "the winner" if r.winner else f"trial {r.trial}"
        if r.changed:
            label = f"the winner with {', '.join(r.changed)}"
        if r.refined:
            label += ", refined"
        extra = "same" if not r.extra else f"{r.extra:+.1%}"
        table.add_row(r.target, label, f"{r.cost_per_mtok:.4f}", extra)
    console.print(table)


def result_json(result: Any) -> dict[str, Any]:
    def trial(s: Any) -> dict[str, Any] | None:
        return None if s is None else asdict(s)

    return {
        "study": result.study_name,
        "storage": result.storage,
        "trials": result.n_trials,
        "new_trials": result.new_trials,
        "warm_started": result.warm_started,
        "seconds": result.seconds,
        "slo": {t: getattr(result.slo, t) for t in SLO_TERMS if getattr(result.slo, t) is not None},
        "best": trial(result.best),
        # the winner's split keys that took no effect (left out of the policy file)
        "inert_params": list(_inert_params(result.best)) if result.best is not None else [],
        "closest": trial(result.closest),
        "binding_constraint": result.binding,
        "pareto_front": [asdict(s) for s in result.front],
        "baselines": [
            {
                "name": b.name,
                "error": b.error,
                "feasible": b.evaluation.feasible if b.evaluation else None,
                "violations": b.evaluation.violations if b.evaluation else None,
                "metrics": b.evaluation.metrics.to_dict() if b.evaluation else None,
            }
            for b in result.baselines
        ],
        "policy_path": str(result.policy_path) if result.policy_path else None,
        "tiered": asdict(result.tiered) if getattr(result, "tiered", None) else None,
        "hbm_only": asdict(result.hbm_only) if getattr(result, "hbm_only", None) else None,
        "slo_bound": asdict(result.bound) if getattr(result, "bound", None) else None,
        "runnable_by": list(getattr(result, "runnable_by", []) or []),
        "target": getattr(result, "target", None),
        "sample_warnings": list(getattr(result, "sample_warnings", []) or []),
        "sample_fraction": getattr(result, "sample_fraction", 1.0),
        "sample_weighting": getattr(result, "sample_weighting", None),
        "refined": result.refined.to_attrs() if getattr(result, "refined", None) else None,
        "winner_params": dict(getattr(result, "winner_params", {}) or {}),
        "per_target": [asdict(r) for r in getattr(result, "per_target", []) or []],
        "step_time_margin": list(getattr(result, "step_margin", []) or []),
    }
