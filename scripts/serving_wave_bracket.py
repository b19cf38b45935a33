"""Where `kvtier validate serving`'s closed-loop checks lie between two client behaviours.

The catalogue replays an AIPerf-style closed loop with its first sends spread over one
request's lifetime (:mod:`kvtier.sim.ramp`), as measured clients de-synchronise. How far real
clients stay in waves is not published, so this script replays each closed-loop check both
ways, ramped and with every first send at once, and prints model / published for each: a
published figure between the two is one a partly synchronised client could produce, one
below both needs a cost the model does not have (docs/validation-serving.md, "The rest of NIM
1.8.0's tables"). A diagnostic: neither behaviour is a parameter of the validation.

    python scripts/serving_wave_bracket.py [PATTERN]   # e.g. 'llama8b.*ttft'

PATTERN is a regular expression over the scenario names (default: every closed-loop check).
"""

from __future__ import annotations

import argparse
import re

import numpy as np

from kvtier.experiments import serving_validation as sv


def loop_value(fig: sv.Figure, ramp_s: float | None) -> float:
    """The measured backend's value of ``fig``'s metric in a closed loop whose first sends are
    ramped (``None``, the catalogue's) or spread over ``ramp_s`` seconds (0: all at once)."""
    from kvtier.hardware import load_hardware, load_model
    from kvtier.scenario import Scenario

    c = fig.conditions
    clients = int(c["concurrency"])
    rep = Scenario(
        sv._trace(fig),
        load_hardware(c["hardware"]),
        load_model(c["model"]),
        sv._policy(fig, "measured"),
        concurrency=clients,
        ramp_s=ramp_s,
    ).replay()
    raw = rep.raw
    window = sv.steady_window(raw.arrival_s, clients)
    if fig.metric == "ttft_ms":
        return float(np.mean((raw.first_token_s - raw.arrival_s)[window])) * 1e3
    steps = np.maximum(rep.trace.output_tokens - 1, 1)
    return float(np.mean(((raw.finish_s - raw.first_token_s) / steps)[window])) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pattern", nargs="?", default=".", help="regex over scenario names")
    args = parser.parse_args()
    pattern = re.compile(args.pattern)
    print(f"{'scenario':50s} {'ramped':>8s} {'at once':>8s}  (model / published)")
    for fig in sv.load_catalogue():
        if fig.conditions["mode"] != "closed" or fig.role != "check":
            continue
        if not pattern.search(fig.name):
            continue
        ramped = loop_value(fig, None) / fig.published
        at_once = loop_value(fig, 0.0) / fig.published
        print(f"{fig.name:50s} {ramped:8.2f} {at_once:8.2f}")


if __name__ == "__main__":
    main()
