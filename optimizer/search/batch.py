"""``kvtier batch``: one optimize study per trace, for tuning jobs over many traces.

Every trace gets its own study (named like ``optimize`` names it, optionally prefixed) and its
own policy file in ``out_dir``. All traces are read and checked before the first trial, so a
bad file stops the batch at once rather than hours in. Run the same command on many machines
with one shared ``--storage`` (PostgreSQL) and different seeds: the workers go through the
traces in the same order and add their trials to the same studies; running it again continues
every study.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvtier.errors import InputError
from kvtier.files import guard_outputs
from kvtier.hardware import load_hardware, load_model
from kvtier.scenario import hardware_name, model_name
from kvtier.search.run import OptimizeResult, optimize
from kvtier.search.study import check_study_name


@dataclass
class BatchItem:
    trace: str
    study: str
    policy_path: Path
    result: OptimizeResult | None = None


def plan_batch(
    traces: Sequence[str],
    *,
    hardware: str | None,
    model: str | None,
    out_dir: Path,
    study_prefix: str = "",
) -> list[BatchItem]:
    """Check every trace and name its study and policy file; nothing runs yet."""
    from kvtier.trace.io import read_trace

    if not traces:
        raise InputError("no trace given")
    hw = load_hardware(hardware_name(hardware))
    mdl = load_model(model_name(model))
    items: list[BatchItem] = []
    seen: dict[str, str] = {}
    for path in traces:
        read_trace(path)  # validates; raises a one-line InputError naming file, row, column
        study = f"{study_prefix}{Path(path).stem}-{hw.name}-{mdl.name}".lower()
        if study in seen:
            raise InputError(
                f"traces {seen[study]} and {path} would share study {study!r} (same file "
                "name); rename one or run them in separate batches with --study-prefix",
                path=path,
            )
        check_study_name(study, "--study-prefix")
        seen[study] = path
        items.append(BatchItem(trace=path, study=study, policy_path=out_dir / f"{study}.toml"))
    # no policy file of the batch may overwrite one of its traces (or lie in a dataset's folder)
    guard_outputs(
        {f"--out-dir ({i.study}.toml)": i.policy_path for i in items},
        {f"TRACES[{k}]": t for k, t in enumerate(traces)},
    )
    return items


def run_batch(
    items: list[BatchItem],
    *,
    on_start: Callable[[int, BatchItem], Any] | None = None,
    **optimize_kwargs: Any,
) -> list[BatchItem]:
    """Optimize each planned trace in turn; ``optimize_kwargs`` as :func:`optimize` takes."""
    for i, item in enumerate(items):
        hook = on_start(i, item) if on_start is not None else None
        item.result = optimize(
            item.trace,
            study_name=item.study,
            out=str(item.policy_path),
            on_trial=hook,
            **optimize_kwargs,
        )
    return items
