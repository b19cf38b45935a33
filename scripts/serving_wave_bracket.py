"""Where `kvtier validate serving`'s closed-loop checks lie between two client behaviours.

The catalogue replays an AIPerf-style closed loop with its first sends spread over one
request's lifetime (:mod:`kvtier.sim.ramp`), as measured clients de-synchronise. How far real
clients stay in waves is not published, so this script replays each closed-loop check both
ways, ramped and with every first send at once, and prints model / published for each: a
published figure between the two is one a partly synchronised client could produce, one
below both needs a cost the model does not have (docs/validation-serving.md, "The rest of NIM
1.8.0's tables"). A diagnostic: neither behaviour is a parameter of the validation.

    python scripts/serving_wave_bracket.py [PATTERN]   # e.g. 'llama8b.*ttft'
    python scripts/serving_wave_bracket.py --silicon 120   # validate silicon's runs

PATTERN is a regular expression over the scenario names (default: every closed-loop check).
``--silicon N`` replays N of ``validate silicon``'s closed-loop runs drawn at random (seed 1)
the same two ways and prints, per framework, the median model / measured TTFT and TPOT.
"""

from __future__ import annotations

import argparse
import re

import numpy as np

from kvtier.experiments import serving_validation as sv

REPLAYS: dict = {}  # a load's TTFT and ITL figures share its replay (sv.replay_figure)


def loop_values(fig: sv.Figure, ramp_s: float | None) -> dict[str, float]:
    """The measured backend's mean TTFT and TPOT (ms) of ``fig`` in a closed loop whose first
    sends are ramped (``None``, the catalogue's) or spread over ``ramp_s`` seconds (0: all at
    once)."""
    return sv.latency_means(*sv.replay_figure(fig, "measured", ramp_s, REPLAYS))


def silicon(n: int) -> None:
    """Per framework, the median model / measured TTFT and TPOT of ``n`` random closed-loop
    runs of ``validate silicon``, ramped and with every first send at once."""
    import random
    from collections import defaultdict

    from kvtier.experiments.silicon_validation import load_runs

    runs = [r for r in load_runs() if r.figure.conditions["mode"] == "closed"]
    random.seed(1)
    ratios: dict[str, list[list[float]]] = defaultdict(list)
    for run in random.sample(runs, min(n, len(runs))):
        row = []
        for ramp in (None, 0.0):
            v = loop_values(run.figure, ramp)
            row += [v["ttft_ms"] / run.ttft_ms, v["tpot_ms"] / run.tpot_ms]
        ratios[run.figure.conditions["framework"]].append(row)
    print(
        f"{'framework':10s} {'runs':>5s} {'TTFT ramped':>12s} {'at once':>8s} "
        f"{'TPOT ramped':>12s} {'at once':>8s}  (medians, model / measured)"
    )
    for fw, rows in sorted(ratios.items()):
        med = np.median(np.array(rows), axis=0)
        print(f"{fw:10s} {len(rows):5d} {med[0]:12.2f} {med[2]:8.2f} {med[1]:12.2f} {med[3]:8.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pattern", nargs="?", default=".", help="regex over scenario names")
    parser.add_argument("--silicon", type=int, default=0, help="N runs of validate silicon")
    args = parser.parse_args()
    if args.silicon > 0:
        silicon(args.silicon)
        return
    pattern = re.compile(args.pattern)
    print(f"{'scenario':50s} {'ramped':>8s} {'at once':>8s}  (model / published)")
    for fig in sv.load_catalogue():
        if fig.conditions["mode"] != "closed" or fig.role != "check":
            continue
        if not pattern.search(fig.name):
            continue
        metric = "ttft_ms" if fig.metric == "ttft_ms" else "tpot_ms"
        ramped = loop_values(fig, None)[metric] / fig.published
        at_once = loop_values(fig, 0.0)[metric] / fig.published
        print(f"{fig.name:50s} {ramped:8.2f} {at_once:8.2f}")


if __name__ == "__main__":
    main()
