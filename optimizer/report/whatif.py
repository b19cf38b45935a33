"""How the architecture what-if reports: its rows as plain data (``kvtier report --json``).

The variants and their replays are :mod:`kvtier.experiments.whatif`'s; the terminal and HTML
tables are drawn from this data by :mod:`kvtier.report.study`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kvtier.experiments.whatif import StudyWhatIf, WhatIfRow


def what_if_json(rows: list[WhatIfRow]) -> list[dict[str, Any]]:
    """Rows as plain data; ``cost_change`` is relative to the first row."""
    out: list[dict[str, Any]] = []
    for r in rows:
        ev = r.evaluation
        if ev is None:
            out.append({"variant": r.label, "error": r.error, "step_factor": r.step_factor})
            continue
        m = ev.metrics
        out.append(
            {
                "variant": r.label,
                "cost_per_mtok": ev.cost_per_mtok,
                "cost_change": r.cost_change,
                "cost_per_hour": m.cost_per_hour,
                "ttft_mean_s": m.ttft_mean_s,
                "ttft_p99_s": m.ttft_p99_s,
                "tpot_p99_s": m.tpot_p99_s,
                "hit_ratio_tokens": dict(m.hit_ratio_tokens),
                "rate_scale": ev.rate_scale,
                "feasible": ev.feasible,
                "slo_attainment": m.slo_attainment,
                "step_factor": r.step_factor,
            }
        )
    return out


def study_what_if_json(result: StudyWhatIf) -> dict[str, Any]:
    """A study's what-if as the ``what_if`` section of ``kvtier report``'s data."""
    return {
        "trial": result.trial,
        "trial_meets_slo": result.trial_meets_slo,
        "trace": result.trace,
        "load": result.load,
        "refined": result.refined,
        "variants": what_if_json(result.rows),
    }
