"""Measured step-time tables from NVIDIA's aiconfigurator-core operator database.

aiconfigurator-core (``aiconfigurator_core.sdk.engine.EngineHandle``) composes one engine
iteration from measured per-operator times (GEMMs, attention kernels, all-reduce) collected on
real GPUs for a serving framework and version, and splits it into three passes
(``mixed_step_breakdown``: total, shared non-attention, context attention, decode attention).
Querying it per iteration costs about 40 us, far too slow for a replay of millions of
iterations, so before a replay we tabulate the three passes on grids once:

- non-attention time by batch tokens (the GEMMs, norms, all-reduce of the whole batch);
- prefill attention of one request by chunk and prefix, queried as a request of ``isl = chunk +
  prefix`` tokens with ``prefix`` cached (``ctx_tokens = isl``: with fewer, the engine divides
  one request's attention by ``ceil(isl / ctx_tokens)``);
- decode attention by batch and context.

The database's own ranges (H100 / vLLM 0.24: context attention to 16,384 tokens, decode batches
to 2,048 at contexts to 131,072) bound the grids; beyond them aiconfigurator extrapolates
silently, so the tables stop there and :mod:`kvtier.sim.timing` scales by the operation's
FLOPs or bytes and counts the iterations that did. Tables are cached on disk per key
(``KVTIER_CACHE_DIR``, else ``$XDG_CACHE_HOME/kvtier``, else ``~/.cache/kvtier``).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from kvtier.errors import InputError
from kvtier.hardware.aic import (  # noqa: F401 - re-exported for the step-time backend
    AIC_SYSTEMS,
    AIC_VERSION_PIN,
    NVLINK_SIBLING,
    aic_version,
    quant_mode,
    quiet_aic,
)

GRID_VERSION = 1  # bump when the grids or the query rules change: old cache entries are unused
FRAMEWORKS = ("vllm", "sglang", "trtllm")
# the database's measured ranges (systems/data/*/attention/*: context attention isl to 16,384;
# generation attention batch to 2,048 and kv position to 131,071)
PF_DATA_MAX = 16384
TOKEN_GRID_MAX = 32768
PQ_GRID = (1, 2, 4, 8, 16, 32, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072)
PQ_GRID += (4096, 6144, 8192, 12288, 16384)
PC_GRID = (0, 16, 32, 64, 128, 256, 512, 1024, 2048, 3072, 4096, 6144, 8192, 12288, 16384)
DB_GRID = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024)
DB_GRID += (1536, 2048)
DC_GRID = (1, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072)


def token_grid() -> np.ndarray:
    """Batch-token grid of the non-attention table: every count to 32, then steps of 1/16 of an
    octave (about 4.4 %), where the measured time is close to linear between points."""
    pts = list(range(1, 33))
    x = 32.0
    while x < TOKEN_GRID_MAX:
        x *= 2 ** (1 / 16)
        v = min(int(round(x)), TOKEN_GRID_MAX)
        if v > pts[-1]:
            pts.append(v)
    return np.array(pts, dtype=np.float64)


@dataclass(frozen=True)
class MeasuredKey:
    """What a table depends on; its hash names the cache file."""

    model: str  # aiconfigurator model id (Hugging Face name)
    system: str  # aiconfigurator system (h100_sxm, ...)
    framework: str  # vllm, sglang, trtllm
    version: str  # the framework's literal data version (current slot resolved)
    tp: int
    weight_dtype: str  # bf16, fp8, or native (a sub-byte checkpoint's own quantisation)
    kv_dtype: str  # bf16 or fp8
    package: str = AIC_VERSION_PIN
    grid: int = GRID_VERSION

    def digest(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:20]


@dataclass(frozen=True)
class MeasuredTables:
    """The three tables in seconds (see the module docstring) and how they were made."""

    key: MeasuredKey
    tok_grid: np.ndarray
    non_attn: np.ndarray
    pq_grid: np.ndarray
    pc_grid: np.ndarray
    prefill_attn: np.ndarray  # (len(pq), len(pc)), less the floor, >= 0
    pf_floor: float  # attention of a 1-token prefill: paid once per iteration with prefills
    db_grid: np.ndarray
    dc_grid: np.ndarray
    decode_attn: np.ndarray  # (len(db), len(dc))
    build_s: float = 0.0
    cached: bool = False


def cache_dir() -> Path:
    """Where tables are kept: ``KVTIER_CACHE_DIR``, else ``$XDG_CACHE_HOME/kvtier``, else
    ``~/.cache/kvtier``."""
    if os.environ.get("KVTIER_CACHE_DIR"):
        return Path(os.environ["KVTIER_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "kvtier"


def measured_key(
    model_id: str, gpu_name: str, framework: str, version: str, tp: int, weight: str, kv: str
) -> MeasuredKey:
    """Resolve a scenario to a table key; a combination without data is a one-line error."""
    system = AIC_SYSTEMS.get(gpu_name)
    if system is None:
        raise InputError(
            f"no measured step-time data for GPU {gpu_name!r} (measured: "
            f"{', '.join(sorted(AIC_SYSTEMS))}); use serving.step_time=roofline",
            option="serving.step_time",
        )
    if framework not in FRAMEWORKS:
        raise InputError(
            f"unknown serving framework {framework!r} (choices: {', '.join(FRAMEWORKS)})",
            option="serving.framework",
        )
    pkg = aic_version()
    quiet_aic()
    from aiconfigurator_core.sdk import perf_database

    try:
        literal = perf_database.resolve_query_version(system, framework, version)
    except Exception as err:  # noqa: BLE001 - the package raises several kinds; one line out
        raise InputError(
            f"no measured data for {framework} version {version!r} on {system} ({err}); "
            "versions are the aliases current / previous / next",
            option="serving.framework_version",
        ) from None
    if literal is None:
        raise InputError(
            f"no measured data for {framework} {version!r} on {system}",
            option="serving.framework_version",
        )
    return MeasuredKey(model_id, system, framework, str(literal), tp, weight, kv, package=pkg)


def build_tables(key: MeasuredKey) -> MeasuredTables:
    """Query aiconfigurator-core on the grids (about 800 queries after a 2-3 s compile)."""
    quiet_aic()
    from aiconfigurator_core.sdk.engine import EngineHandle

    t0 = time.perf_counter()
    try:
        h = EngineHandle.compile(
            key.model,
            key.system,
            key.framework,
            backend_version=key.version,
            tp_size=key.tp,
            moe_tp_size=key.tp,  # vLLM's default: experts sharded by tensor parallelism
            gemm_quant_mode=quant_mode(key.weight_dtype),
            kvcache_quant_mode=quant_mode(key.kv_dtype),
        )
        step = h.mixed_step_breakdown
        tok = token_grid()
        na = np.array([step(int(n), 0, int(n), 1, 0)[1] for n in tok]) * 1e-3
        pq = np.array(PQ_GRID, dtype=np.float64)
        pc = np.array(PC_GRID, dtype=np.float64)
        pa = np.zeros((pq.size, pc.size))
        for i, q in enumerate(PQ_GRID):
            for j, c in enumerate(PC_GRID):
                if q + c <= PF_DATA_MAX:
                    pa[i, j] = step(q + c, 0, q + c, 1, c)[2] * 1e-3
                else:  # beyond the data: scale the last measured prefix by the FLOPs
                    cm = PF_DATA_MAX - q
                    edge = step(PF_DATA_MAX, 0, PF_DATA_MAX, 1, cm)[2] * 1e-3
                    pa[i, j] = edge * (2.0 * c + q) / (2.0 * cm + q)
        db = np.array(DB_GRID, dtype=np.float64)
        dc = np.array(DC_GRID, dtype=np.float64)
        da = np.array([[step(0, b, c, 2, 0)[3] for c in DC_GRID] for b in DB_GRID]) * 1e-3
    except InputError:
        raise
    except Exception as err:  # noqa: BLE001 - MissingSystemFlopsError, PerfDataNotAvailableError...
        raise InputError(
            f"no measured step-time data for {key.model} on {key.system} / {key.framework} "
            f"{key.version} tp={key.tp} weights={key.weight_dtype} kv={key.kv_dtype}: "
            f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}",
            option="serving.step_time",
        ) from None
    floor = float(pa[0, 0])
    pa = np.maximum(pa - floor, 0.0)
    return MeasuredTables(
        key, tok, na, pq, pc, pa, floor, db, dc, da, build_s=time.perf_counter() - t0
    )


def _cache_path(key: MeasuredKey) -> Path:
    return cache_dir() / f"steptime-{key.digest()}.npz"


def _save(path: Path, t: MeasuredTables) -> None:
    from kvtier.files import atomic_write

    buf = io.BytesIO()
    np.savez(
        buf,
        key=np.array(json.dumps(asdict(t.key), sort_keys=True)),
        tok_grid=t.tok_grid,
        non_attn=t.non_attn,
        pq_grid=t.pq_grid,
        pc_grid=t.pc_grid,
        prefill_attn=t.prefill_attn,
        pf_floor=np.array(t.pf_floor),
        db_grid=t.db_grid,
        dc_grid=t.dc_grid,
        decode_attn=t.decode_attn,
        build_s=np.array(t.build_s),
    )

    def write(tmp: str) -> None:
        Path(tmp).write_bytes(buf.getvalue())

    atomic_write(path, write)


def _load(path: Path, key: MeasuredKey) -> MeasuredTables | None:
    try:
        with np.load(path, allow_pickle=False) as z:
            if json.loads(str(z["key"])) != asdict(key):
                return None
            return MeasuredTables(
                key,
                z["tok_grid"],
                z["non_attn"],
                z["pq_grid"],
                z["pc_grid"],
                z["prefill_attn"],
                float(z["pf_floor"]),
                z["db_grid"],
                z["dc_grid"],
                z["decode_attn"],
                build_s=float(z["build_s"]),
                cached=True,
            )
    except (OSError, ValueError, KeyError):
        return None  # unreadable or stale: rebuilt and rewritten


def measured_tables(key: MeasuredKey) -> MeasuredTables:
    """The tables of ``key``: from the disk cache when present, else built and cached."""
    path = _cache_path(key)
    if path.exists():
        cached = _load(path, key)
        if cached is not None:
            return cached
    tables = build_tables(key)
    _save(path, tables)
    return tables
