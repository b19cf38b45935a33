"""Regenerate docs/traces.md's table of how faithful a sample's replay is.

Replays the bundled Mooncake conversation trace whole and as 10% and 25% samples (seeds 0-3)
under each router, as fixed in :mod:`kvtier.experiments.sampling_validation`, and prints the
markdown table; with ``--write`` it also replaces the table between the markers in
docs/traces.md (atomically). ``--floor`` instead computes the statistical floor of the TTFT
target (:func:`kvtier.experiments.sampling_validation.composition_floor`: how often samples of
the same size meet it with each request's full-replay TTFT) and its table.

Usage: ``python scripts/sampling_fidelity.py [--write] [--floor] [--routers round_robin,...]``.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from kvtier.experiments import sampling_validation as sv
from kvtier.files import atomic_write
from kvtier.trace.io import read_trace

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "traces.md"
START, END = "<!-- sampling-table:start -->", "<!-- sampling-table:end -->"
FLOOR_START, FLOOR_END = "<!-- sampling-floor:start -->", "<!-- sampling-floor:end -->"


def write_between(start: str, end: str, table: str) -> None:
    """Replace the text between the markers ``start`` and ``end`` of docs/traces.md."""
    text = DOC.read_text()
    head, rest = text.split(start, 1)
    _, tail = rest.split(end, 1)
    new = f"{head}{start}\n{table}\n{end}{tail}"
    atomic_write(str(DOC), lambda tmp: Path(tmp).write_text(new))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="update docs/traces.md")
    parser.add_argument("--floor", action="store_true", help="the TTFT target's floor only")
    parser.add_argument("--routers", default=",".join(sv.ROUTERS))
    args = parser.parse_args()
    start = time.perf_counter()
    if args.floor:
        floors = sv.composition_floor(read_trace(str(ROOT / sv.TRACE)), args.routers.split(","))
        table = sv.floor_markdown(floors)
        print(table)
        print(f"({time.perf_counter() - start:.0f} s)")
        if args.write:
            write_between(FLOOR_START, FLOOR_END, table)
        return
    rows = sv.measure(read_trace(str(ROOT / sv.TRACE)), routers=args.routers.split(","))
    table = sv.markdown(rows)
    print(table)
    for r in rows:
        print(
            f"{r.router} F={r.fraction:g}: full hit {r.full.hit:.4f} P50 {r.full.ttft_p50_s:.4f} "
            f"P99 {r.full.ttft_p99_s:.4f}; samples "
            + "; ".join(
                f"{s.hit:.4f} {s.ttft_p50_s:.4f} {s.ttft_p99_s:.4f} ({s.requests} req; full "
                f"replay over them {s.same_hit:.4f} {s.same_p50_s:.4f} {s.same_p99_s:.4f})"
                for s in r.samples
            )
        )
    print(f"({time.perf_counter() - start:.0f} s)")
    if args.write:
        write_between(START, END, table)


if __name__ == "__main__":
    main()
