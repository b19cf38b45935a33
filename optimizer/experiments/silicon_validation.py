"""``kvtier validate silicon``: aiconfigurator-core's measured serving runs beside the model.

NVIDIA ships with aiconfigurator-core a sample of end-to-end runs it measured on real engines
("silicon"): per row the framework and its version, the model, the GPU, the precision, the
input and output lengths, the number of clients of a closed loop (``batch_size``), the tensor
parallelism, and the mean TTFT and TPOT. They cover what the published figures of ``validate
serving`` do not: vLLM and SGLang under load, at several tensor-parallel sizes and lengths.
kvtier times its steps from the same package's per-kernel tables, not from these runs, so they
check the whole chain: the tables, the scheduler, the batching, the closed loop.

The manifest ``policies/presets/validation/silicon.toml`` says which rows are replayed (the
models and GPUs kvtier has profiles of, aggregated serving, BF16 or FP8 weights) and declares
their role, check, before any replay. Each row is replayed once with the measured step-time
backend, as ``validate serving`` replays its closed-loop figures (:mod:`kvtier.sim.ramp`'s
de-synchronised first wave, the steady window between the first wave and the drain, no prefix
shared), and gives two checks, TTFT and TPOT. A row whose GPU, model or framework the tables do
not cover is reported as not replayed, with the reason, and counts in no MAPE.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from kvtier.errors import InputError
from kvtier.experiments.serving_validation import (
    Figure,
    check_keys,
    latency_means,
    replay_figure,
)
from kvtier.policy.presets import BUILTIN_DIR

MANIFEST = BUILTIN_DIR / "validation" / "silicon.toml"
METRICS = ("ttft_ms", "tpot_ms")
TARGET = 0.10  # the declared MAPE target over the checks, as `validate serving`'s
_MANIFEST_KEYS = {
    "role",
    "source",
    "package",
    "file",
    "mode",
    "frameworks",
    "precisions",
    "requests_per_client",
    "min_requests",
    "models",
    "systems",
    "kv_dtype",
}
# the sample's columns a row is read from: text, then numbers
_TEXT_COLUMNS = (
    "id",
    "silicon_data_source",
    "backend",
    "backend_version",
    "model_path",
    "system",
    "precision",
    "mode",
)
_COLUMNS = (
    *_TEXT_COLUMNS,
    "isl",
    "osl",
    "batch_size",
    "tp_size",
    "pp_size",
    "attention_dp_size",
    "silicon_ttft_ms",
    "silicon_tpot_ms",
)


@dataclass(frozen=True)
class Manifest:
    """Which rows of the sample are replayed, under which profiles, and their role."""

    role: str
    source: str
    package: str
    file: str
    mode: str
    frameworks: tuple[str, ...]
    precisions: tuple[str, ...]
    requests_per_client: int
    min_requests: int
    models: dict[str, str]
    systems: dict[str, str]
    kv_dtype: dict[str, dict[str, str]]
    path: str


@dataclass(frozen=True)
class Run:
    """One measured row: its conditions (a :class:`Figure`'s, the metric aside) and figures."""

    id: str
    framework_version: str
    data_source: str
    ttft_ms: float
    tpot_ms: float
    figure: Figure  # the row as a closed-loop (or sequential) scenario of validate serving

    def published(self, metric: str) -> float:
        return self.ttft_ms if metric == "ttft_ms" else self.tpot_ms


@dataclass(frozen=True)
class Result:
    """A run beside the model: the model's TTFT and TPOT, or why it was not replayed."""

    run: Run
    model: dict[str, float]
    skipped: str | None = None

    def ratio(self, metric: str) -> float | None:
        if self.skipped is not None:
            return None
        return self.model[metric] / self.run.published(metric)


@dataclass
class SiliconValidation:
    results: list[Result]
    manifest: Manifest

    def replayed(self) -> list[Result]:
        return [r for r in self.results if r.skipped is None]

    def ratios(self, metric: str, framework: str | None = None) -> list[float]:
        """Model / measured of ``metric`` over the replayed runs (of one framework, or all)."""
        out = []
        for r in self.replayed():
            if framework is None or r.run.figure.conditions["framework"] == framework:
                x = r.ratio(metric)
                if x is not None:
                    out.append(x)
        return out

    def groups(self) -> dict[tuple[str, str, str], SiliconValidation]:
        """The replayed runs by (framework, model, hardware), each group a validation of its
        own."""
        out: dict[tuple[str, str, str], list[Result]] = {}
        for r in self.replayed():
            c = r.run.figure.conditions
            out.setdefault((c["framework"], c["model"], c["hardware"]), []).append(r)
        return {k: SiliconValidation(v, self.manifest) for k, v in sorted(out.items())}

    def mape(self, metric: str | None = None, framework: str | None = None) -> float | None:
        """MAPE (a fraction) over the checks of one metric, or of both, of one framework or
        all."""
        metrics = METRICS if metric is None else (metric,)
        errs = [abs(x - 1.0) for m in metrics for x in self.ratios(m, framework)]
        return float(np.mean(errs)) if errs else None

    def lean(self, metric: str, framework: str | None = None) -> tuple[int, int]:
        """How many checks the model puts below and above the measured figure."""
        ratios = self.ratios(metric, framework)
        return sum(x < 1.0 for x in ratios), sum(x > 1.0 for x in ratios)

    def frameworks(self) -> list[str]:
        return sorted({r.run.figure.conditions["framework"] for r in self.replayed()})

    def missed(self) -> list[str]:
        m = self.mape()
        if m is None or m > TARGET:
            shown = "n/a" if m is None else f"{100 * m:.1f} %"
            return [f"MAPE {shown} > {100 * TARGET:.0f} % over the replayed checks"]
        return []


def load_manifest(path: Path = MANIFEST) -> Manifest:
    """The manifest, checked: every key known, the role and selections valid."""
    with open(path, "rb") as f:
        data = tomllib.load(f)
    check_keys(data, _MANIFEST_KEYS, "", str(path))
    missing = sorted(_MANIFEST_KEYS - set(data))
    if missing:
        raise InputError(f"{path}: missing key {missing[0]}")
    if data["role"] not in ("check", "calibration"):
        raise InputError(f"{path}: role {data['role']!r} (valid: calibration, check)")
    for key in ("requests_per_client", "min_requests"):
        if not isinstance(data[key], int) or data[key] < 1:
            raise InputError(f"{path}: {key} must be a positive integer")
    if data["requests_per_client"] < 3:
        raise InputError(f"{path}: requests_per_client must be >= 3 (a steady window)")
    for key in ("models", "systems", "kv_dtype"):
        if not isinstance(data[key], dict):
            raise InputError(f"{path}: {key} must be a table")
    for key in ("models", "systems"):
        for name, value in data[key].items():
            if not isinstance(value, str):
                raise InputError(f"{path}: {key}.{name} must name a profile")
    check_keys(data["kv_dtype"], set(data["frameworks"]), "kv_dtype", str(path))
    for fw in data["frameworks"]:
        table = data["kv_dtype"].get(fw)
        if not isinstance(table, dict) or set(table) != set(data["precisions"]):
            raise InputError(f"{path}: kv_dtype.{fw} must give one type per precision")
    return Manifest(
        role=data["role"],
        source=data["source"],
        package=data["package"],
        file=data["file"],
        mode=data["mode"],
        frameworks=tuple(data["frameworks"]),
        precisions=tuple(data["precisions"]),
        requests_per_client=int(data["requests_per_client"]),
        min_requests=int(data["min_requests"]),
        models=dict(data["models"]),
        systems=dict(data["systems"]),
        kv_dtype={k: dict(v) for k, v in data["kv_dtype"].items()},
        path=str(path),
    )


def sample_path(manifest: Manifest) -> Path:
    """The sample file inside the installed package; a one-line error when it is missing."""
    from importlib.metadata import PackageNotFoundError, distribution

    try:
        dist = distribution(manifest.package)
    except PackageNotFoundError:
        raise InputError(f"{manifest.path}: package {manifest.package} is not installed") from None
    path = Path(str(dist.locate_file(manifest.file)))
    if not path.is_file():
        raise InputError(f"{manifest.path}: {manifest.package} has no {manifest.file}")
    return path


def load_runs(manifest: Manifest | None = None, path: Path | None = None) -> list[Run]:
    """The sample's rows the manifest selects, each as a scenario of validate serving."""
    import polars as pl

    manifest = load_manifest() if manifest is None else manifest
    path = sample_path(manifest) if path is None else path
    text = {c: pl.String for c in _TEXT_COLUMNS}
    try:
        frame = pl.read_csv(path, infer_schema_length=None, schema_overrides=text)
    except pl.exceptions.PolarsError as err:
        raise InputError(f"{path}: not a readable CSV ({str(err).splitlines()[0]})") from None
    absent = [c for c in _COLUMNS if c not in frame.columns]
    if absent:
        raise InputError(f"{path}: no column {absent[0]}")
    for c in _COLUMNS:
        if c in _TEXT_COLUMNS or frame.schema[c].is_numeric():
            continue
        if frame[c].null_count() < frame.height:  # an empty column reads as text
            raise InputError(f"{path}: column {c} holds text, not numbers")
        frame = frame.with_columns(pl.col(c).cast(pl.Int64))
    precision = pl.col("precision").fill_null("bf16")
    rows = (
        frame.with_row_index("line", offset=2)  # the file's line, its header being line 1
        .select(["line", *_COLUMNS])
        .with_columns(precision.alias("precision"))
        .filter(
            (pl.col("mode") == manifest.mode)
            & pl.col("backend").is_in(list(manifest.frameworks))
            & pl.col("precision").is_in(list(manifest.precisions))
            & pl.col("model_path").is_in(list(manifest.models))
            & pl.col("system").is_in(list(manifest.systems))
            & (pl.col("pp_size").fill_null(1) == 1)
            & (pl.col("attention_dp_size").fill_null(1) <= 1)
        )
        .sort("id")
    )
    return [_run(row, manifest, path, int(row["line"])) for row in rows.iter_rows(named=True)]


def _run(row: dict[str, Any], m: Manifest, path: Path, line: int) -> Run:
    """One row as a run; a row that cannot be replayed as stated is a one-line error naming
    the file, the row's id and the field."""
    for key in ("isl", "osl", "batch_size", "tp_size"):
        v = row[key]
        if not isinstance(v, int) or v < 1:
            raise InputError(
                f"{path}: line {line} (id {row['id']}): {key} {v!r} must be a positive integer"
            )
    for key in ("silicon_ttft_ms", "silicon_tpot_ms"):
        v = row[key]
        if not isinstance(v, float | int) or not np.isfinite(v) or v <= 0:
            raise InputError(
                f"{path}: line {line} (id {row['id']}): {key} {v!r} must be a positive number"
            )
    c = int(row["batch_size"])
    fw, precision = str(row["backend"]), str(row["precision"])
    cond: dict[str, Any] = {
        "model": m.models[row["model_path"]],
        "hardware": m.systems[row["system"]],
        "framework": fw,
        "framework_version": "current",  # the tables' release (docs/sources.md)
        "tp": int(row["tp_size"]),
        "weight_dtype": precision,
        "kv_dtype": m.kv_dtype[fw][precision],
        "input_tokens": int(row["isl"]),
        "output_tokens": int(row["osl"]),
    }
    if c == 1:
        cond |= {"mode": "sequential", "requests": 3}
    else:
        n = max(m.requests_per_client * c, m.min_requests)
        cond |= {"mode": "closed", "concurrency": c, "requests": n}
    version = row["backend_version"] or "(version not stated)"
    read = (
        f"{fw} {version} {row['model_path']} on {row['system']}, tp "
        f"{row['tp_size']}, {precision}, {row['isl']} / {row['osl']} tokens, concurrency {c}: "
        f"TTFT {row['silicon_ttft_ms']:.2f} ms, TPOT {row['silicon_tpot_ms']:.2f} ms"
    )
    fig = Figure(
        str(row["id"]),
        m.role,
        "ttft_ms",  # the scenario's own metric is unused: a run gives both
        float(row["silicon_ttft_ms"]),
        m.source,
        str(path),
        read,
        cond,
        f"{path} (line {line}, id {row['id']})",
    )
    return Run(
        str(row["id"]),
        str(version),
        str(row["silicon_data_source"]),
        float(row["silicon_ttft_ms"]),
        float(row["silicon_tpot_ms"]),
        fig,
    )


def model_values(run: Run) -> dict[str, float]:
    """The model's mean TTFT and TPOT (ms) of ``run``, measured step-time backend, over the
    steady window (every request of a sequential run)."""
    return latency_means(*replay_figure(run.figure, "measured"))


def run_silicon(
    runs: list[Run] | None = None,
    *,
    manifest: Manifest | None = None,
    framework: str | None = None,
    model: str | None = None,
    max_runs: int | None = None,
    progress: Any = None,
) -> SiliconValidation:
    """Replay the selected runs (``framework``, ``model``: only those; ``max_runs``: the first
    so many, in the sample's id order); ``progress(done, total)`` after each."""
    manifest = load_manifest() if manifest is None else manifest
    runs = load_runs(manifest) if runs is None else runs
    if framework is not None:
        runs = [r for r in runs if r.figure.conditions["framework"] == framework]
    if model is not None:
        runs = [r for r in runs if r.figure.conditions["model"] == model]
    if max_runs is not None:
        runs = runs[:max_runs]
    if not runs:
        raise InputError("no silicon run matches the selection")
    results: list[Result] = []
    for i, run in enumerate(runs):
        try:
            results.append(Result(run, model_values(run)))
        except InputError as err:
            results.append(Result(run, {}, skipped=err.message))
        if progress is not None:
            progress(i + 1, len(runs))
    return SiliconValidation(results, manifest)
