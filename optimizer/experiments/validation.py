"""Validation against published results: the Beluga / MoonCake LV-Eval comparison.

:func:`run_beluga` replays the scenario of ``policies/presets/validation/beluga-lveval.toml``
(the Beluga paper's testbed, an LV-Eval-like two-pass trace, the ``lmcache-0.3-mooncake-beluga``,
``beluga-cxl`` and ``vllm-0.8.5-hbm-beluga`` presets) and returns every cell of the paper's table
with the model's value beside it, the extra reproductions (MoonCake with 16-token blocks, Beluga
without interleaving), the KV geometry checks (docs/sources.md) and the acceptance ratios of
issue 7. :mod:`kvtier.report.validation` renders the result (terminal, JSON,
``docs/validation.md``).

The load generator is a closed loop of ``[load] concurrency`` clients (as ``vllm bench serve
--max-concurrency``): each sends its next request of the pass when its last one finishes; the
second (full-hit) pass starts after the first has finished, so its cache is what the first
pass left. TTFT counts from each request's send; QPS of a pass = its requests / (its last
finish - its start). ``[load] mode = "burst"`` submits every request of a pass at once.
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from kvtier.errors import InputError
from kvtier.hardware import load_hardware, load_model
from kvtier.hardware.types import Hardware, ModelProfile
from kvtier.policy.model import Policy
from kvtier.policy.presets import BUILTIN_DIR, load_preset
from kvtier.scenario import BlockCache, Scenario
from kvtier.trace.format import PASS_COLUMN, Trace

SCENARIO_DIR = BUILTIN_DIR / "validation"
SCENARIOS = {"beluga": SCENARIO_DIR / "beluga-lveval.toml"}
SYSTEMS = ("mooncake", "beluga", "vllm")
RUNS = ("first", "full-hit")
METRICS = ("ttft_mean_s", "ttft_p99_s", "tpot_mean_s", "tpot_p99_s", "qps")

# KV bytes per token at BF16 from each model's config.json geometry (docs/sources.md, models),
# and the context-size checks below it: (profile, KiB per token).
GEOMETRY_TABLE = (
    ("Llama-3.1-8B", 128.0),
    ("Qwen3-8B", 144.0),
    ("Qwen3-32B", 256.0),
    ("Llama-3.1-70B", 320.0),
    ("Llama-3.1-405B", 504.0),
    ("DeepSeek-V3", 68.625),  # 61 x (512 + 64) x 2 bytes = 70,272 bytes; published as 68.6
)
GEOMETRY_CONTEXT = (  # (profile, tokens, GiB of KV)
    ("Llama-3.1-70B", 131_072, 40.0),
    ("Llama-3.1-405B", 131_072, 63.0),
)


@dataclass(frozen=True)
class PassStats:
    ttft_mean_s: float
    ttft_p99_s: float
    tpot_mean_s: float
    tpot_p99_s: float
    qps: float
    n_served: int
    n_rejected: int
    load_share_of_ttft: float
    reuse_tokens: float  # prompt tokens from HBM or a lower tier / prompt tokens

    def get(self, metric: str) -> float:
        return float(getattr(self, metric))


@dataclass(frozen=True)
class Cell:
    """One cell of the paper's table: a system's metric in one run, paper beside model."""

    system: str
    run: str
    metric: str
    paper: float | None  # None where the paper gives no figure
    model: float


@dataclass(frozen=True)
class Check:
    """A published figure and the model's value for it."""

    check: str
    paper: float
    model: float


@dataclass(frozen=True)
class GeometryCheck:
    """A published KV size against the model profile's, which must be exact."""

    check: str
    paper: float
    model: float
    exact: bool


@dataclass(frozen=True)
class Acceptance:
    """A ratio between systems, the paper's and the model's, and the range it must fall in."""

    ratio: str
    paper: float
    model: float
    target: str
    met: bool
    cause: str = ""  # why the model misses it, where known (printed with the miss)


@dataclass(frozen=True)
class PassDetail:
    n_served: int
    n_rejected: int
    hbm_reuse_tokens: float
    load_share_of_ttft: float
    first_run_hit_ratio_tokens: dict[str, float] | None = None  # the first run only


@dataclass(frozen=True)
class Efficiency:
    mfu: float
    mbu: float
    step_overhead_s: float


@dataclass(frozen=True)
class ScenarioSummary:
    """What the validation replayed: profiles, trace shape and the calibrated values."""

    name: str
    file: str
    hardware: str
    model: str
    hbm_kv_gb: float
    requests_per_pass: int
    mean_input_tokens: float
    min_input_tokens: int
    max_input_tokens: int
    first_pass_reuse_tokens: float
    load: str
    efficiency: Efficiency
    rdma_op_overhead_us: float
    cxl_op_overhead_us: float
    concurrency: int = 0  # closed-loop clients (0: burst)


@dataclass(frozen=True)
class Validation:
    """Everything ``kvtier validate beluga`` reports."""

    scenario: ScenarioSummary
    cells: list[Cell]
    details: dict[str, PassDetail]  # "SYSTEM.RUN"
    extra: list[Check]
    geometry: list[GeometryCheck]
    acceptance: list[Acceptance]
    # devices of the CXL pool the trace's blocks fill when it does not interleave
    devices_filled: int = 0

    def missed(self) -> list[Acceptance]:
        """The reproduction targets the model misses."""
        return [a for a in self.acceptance if not a.met]

    def cell(self, system: str, run: str, metric: str) -> float:
        """The model's value of one cell."""
        (c,) = (c for c in self.cells if (c.system, c.run, c.metric) == (system, run, metric))
        return c.model


def load_concurrency(scn: dict[str, Any]) -> int:
    """The scenario's closed-loop client count (0 for ``mode = "burst"``)."""
    load = scn.get("load", {})
    mode = load.get("mode", "burst")
    if mode == "burst":
        return 0
    n = load.get("concurrency")
    if mode != "closed" or not isinstance(n, int) or n < 1:
        raise InputError(
            f"{scn['path']}: [load] needs mode = 'burst', or mode = 'closed' with concurrency >= 1"
        )
    return n


def load_scenario(name: str) -> dict[str, Any]:
    """The validation scenario file ``name`` as read (its path under ``path``)."""
    path = SCENARIOS.get(name)
    if path is None:
        raise InputError(f"unknown validation {name!r} (known: {', '.join(sorted(SCENARIOS))})")
    with open(path, "rb") as f:
        data = tomllib.load(f)
    data["path"] = str(path)
    return data


def scenario_trace(scn: dict[str, Any]) -> Trace:
    """The scenario's two-pass LV-Eval-like trace (``kvtier.trace.synth``)."""
    from kvtier.trace.synth import synthesize

    t = dict(scn["trace"])
    return synthesize(
        "rag",
        long=True,
        passes=2,
        requests=t.pop("requests"),
        seed=t.pop("seed"),
        rate=1.0,  # arrival times are replaced by the burst load generator
        length_sigma=t.pop("length_sigma"),
        **t,
    )


def with_hbm(policy: Policy, hbm_kv_gb: float) -> Policy:
    tiers = tuple(replace(t, capacity_gb=hbm_kv_gb) if t.name == "hbm" else t for t in policy.tiers)
    return replace(policy, tiers=tiers)


def with_interleave(policy: Policy, interleave: bool) -> Policy:
    tiers = tuple(replace(t, interleave=interleave) if t.name == "cxl" else t for t in policy.tiers)
    return replace(policy, tiers=tiers)


def run_passes(
    trace: Trace,
    hw: Hardware,
    model: ModelProfile,
    policy: Policy,
    *,
    blocks: BlockCache | None = None,
    concurrency: int = 0,
) -> dict[str, PassStats]:
    """Replay ``trace`` pass after pass, closed loop of ``concurrency`` clients (0: every
    request of a pass at once); statistics per pass."""
    scenario = Scenario(trace, hw, model, policy, blocks=blocks, concurrency=concurrency)
    bt = scenario.blocked()
    passes = bt.pass_index
    # Pass p starts at p * gap; the gap is doubled until every request of a pass has finished
    # before the next pass starts (the paper ran the full-hit pass after the first run).
    gap = 1.0e5
    while True:
        arrival = passes.astype(np.float64) * gap
        raw = scenario.replay(arrival_s=arrival).raw
        if raw.arrival_s is not None:
            arrival = raw.arrival_s  # when each request was sent
        last0 = np.nanmax(np.where(passes == 0, raw.finish_s, np.nan))
        if not (last0 >= gap):
            break
        gap *= 2
    out: dict[str, PassStats] = {}
    for p, run_name in enumerate(RUNS):
        sel = passes == p
        served = sel & ~np.isnan(raw.finish_s)
        start = float(arrival[sel].min())
        ttft = raw.first_token_s[served] - arrival[served]
        tpot = (raw.finish_s[served] - raw.first_token_s[served]) / np.maximum(
            1, bt.output_tokens[served] - 1
        )
        span = float(raw.finish_s[served].max()) - start
        load = raw.load_s[served] if raw.load_s is not None else np.zeros(int(served.sum()))
        hit_tokens = raw.hit_blocks[served].sum() * bt.block_tokens
        inp = bt.input_tokens[served].sum()
        out[run_name] = PassStats(
            ttft_mean_s=float(ttft.mean()),
            ttft_p99_s=float(np.quantile(ttft, 0.99, method="linear")),
            tpot_mean_s=float(tpot.mean()),
            tpot_p99_s=float(np.quantile(tpot, 0.99, method="linear")),
            qps=float(served.sum() / span) if span > 0 else math.nan,
            n_served=int(served.sum()),
            n_rejected=int((sel & (raw.instance < 0)).sum()),
            load_share_of_ttft=float(np.nansum(load) / ttft.sum()) if ttft.sum() > 0 else 0.0,
            reuse_tokens=float(hit_tokens / inp) if inp else 0.0,
        )
    return out


def first_pass_reuse(
    trace: Trace, block_tokens: int = 16, *, blocks: BlockCache | None = None
) -> float:
    """Share of the first pass's prompt tokens an infinite cache serves (prefix reuse)."""
    from kvtier.trace.stats import prefix_hits

    bt = (blocks or BlockCache(trace)).get(Policy(block_tokens=block_tokens))
    hits = prefix_hits(bt)
    sel = bt.pass_index == 0
    return float(hits[sel].sum() * block_tokens / bt.input_tokens[sel].sum())


def first_pass(trace: Trace) -> Trace:
    """The requests of the first pass alone (they are the trace's first rows)."""
    n = int((trace.column_numpy(PASS_COLUMN, np.int64) == 0).sum())
    return Trace.from_table(
        trace.table.slice(0, n),
        block_tokens=trace.block_tokens,
        source=trace.source,
        has_prefix_info=trace.has_prefix_info,
        metadata=trace.metadata,
    )


def first_pass_hit_ratios(
    trace: Trace, hw: Hardware, model: ModelProfile, policy: Policy
) -> dict[str, float]:
    """Prompt tokens served from each tier in the first pass alone (replayed by itself)."""
    first = first_pass(trace)
    replay = Scenario(first, hw, model, policy).replay(arrival_s=np.zeros(first.n_requests))
    return dict(replay.metrics.hit_ratio_tokens)


def geometry_checks() -> list[GeometryCheck]:
    """Published KV bytes per token and context sizes (docs/sources.md) against the profiles."""
    rows = []
    for name, kib in GEOMETRY_TABLE:
        got = load_model(name).kv_bytes_per_token("bf16") / 1024
        rows.append(GeometryCheck(f"{name} KiB per token (BF16)", kib, got, got == kib))
    for name, tokens, gib in GEOMETRY_CONTEXT:
        got = load_model(name).kv_bytes_per_token("bf16") * tokens / 2**30
        rows.append(GeometryCheck(f"{name} GiB of KV at {tokens:,} tokens", gib, got, got == gib))
    return rows


def _ratio(a: float, b: float) -> float:
    return a / b if b else math.nan


def _accept(
    name: str, paper: float, model: float, lo: float, hi: float | None, *, cause: str = ""
) -> Acceptance:
    ok = model >= lo and (hi is None or model <= hi)
    target = f">= {lo:g}" if hi is None else f"[{lo:g}, {hi:g}]"
    return Acceptance(name, paper, model, target, bool(ok), "" if ok else cause)


# Why the model misses the interleaving gain (docs/validation.md): without interleaving each
# memory device is a queue of its own and the pool fills one device before the next in the
# order blocks are first written (kvtier.sim.transfer.device_link). The full-hit pass replays
# the first pass's requests in the same order, so the 16 clients' concurrent loads read the
# blocks of requests written together, which sit on one or two of the few devices the trace
# fills: the model loses more than the paper did. The paper states neither how its pool
# places blocks without interleaving nor the order of its second run.
def interleave_cause(devices_filled: int) -> str:
    """Why the model misses the interleaving gain, with the devices the trace fills."""
    return (
        "each device is a queue and the model's non-interleaved pool fills one device before "
        "the next in the order blocks are first written, so the full-hit pass, replayed in the "
        "first pass's order, loads mostly from one or two of the "
        f"{devices_filled} devices its blocks fill; the paper states neither its placement "
        "without interleaving nor its second run's order"
    )


def devices_filled(
    trace: Trace, hw: Hardware, model: ModelProfile, policy: Policy, blocks: BlockCache
) -> int:
    """Devices of ``policy``'s CXL pool, not interleaved, that the trace's blocks fill (one
    device after the other in order of first appearance; 0 if the pool interleaves)."""
    from kvtier.sim.config import build_config

    tiers = build_config(hw, model, policy).tiers
    if tiers is None or "cxl" not in tiers.names:
        return 0
    per_device = int(tiers.device_queues()[0][tiers.names.index("cxl")])
    if per_device == 0:
        return 0
    n_blocks = Scenario(trace, hw, model, policy, blocks=blocks).blocked().n_blocks
    return -(-n_blocks // per_device)


# Why the paper's TPOTs are far above the model's (printed with the table, docs/validation.md)
TPOT_CAUSE = (
    "TPOT not reproduced: in the paper decode steps stall behind other requests' loads and "
    "15K-token prefills (with answers this short, every stall weighs on few intervals); the "
    "model's chunked prefill and per-request load waits show only part of it, and the paper "
    "does not state its answer lengths (the scenario assumes 16 tokens)"
)


def run_beluga() -> Validation:
    """Every cell, the extra reproductions, geometry and acceptance of the Beluga validation."""
    scn = load_scenario("beluga")
    hw = load_hardware(scn["hardware"])
    model = load_model(scn["model"])
    trace = scenario_trace(scn)
    blocks = BlockCache(trace)  # one mapping per block size, shared by every replay
    hbm = float(scn["hbm_kv_gb"])
    reuse = first_pass_reuse(trace, blocks=blocks)
    policies = {s: with_hbm(load_preset(scn["systems"][s]), hbm) for s in SYSTEMS}
    closed = load_concurrency(scn)
    stats = {
        s: run_passes(trace, hw, model, p, blocks=blocks, concurrency=closed)
        for s, p in policies.items()
    }

    paper = scn.get("paper", {})
    cells = []
    for s in SYSTEMS:
        for r in RUNS:
            ref = paper.get(f"{s}.{r}", {})
            for m in METRICS:
                v = ref.get(m)
                cells.append(Cell(s, r, m, None if v is None else float(v), stats[s][r].get(m)))

    ex = scn["extra"]
    small_b = int(ex["mooncake_small_block_tokens"])
    small = run_passes(
        trace,
        hw,
        model,
        policies["mooncake"].with_block_tokens(small_b),
        blocks=blocks,
        concurrency=closed,
    )
    not_interleaved = with_interleave(policies["beluga"], False)
    no_int = run_passes(trace, hw, model, not_interleaved, blocks=blocks, concurrency=closed)
    filled = devices_filled(trace, hw, model, not_interleaved, blocks)
    extra = [
        Check(
            f"MoonCake full-hit mean TTFT, {small_b}-token blocks (s)",
            float(ex["mooncake_small_ttft_s"]),
            small["full-hit"].ttft_mean_s,
        ),
        Check(
            "MoonCake full-hit mean TTFT, 256-token superblocks (s)",
            paper["mooncake.full-hit"]["ttft_mean_s"],
            stats["mooncake"]["full-hit"].ttft_mean_s,
        ),
        Check(
            "Beluga full-hit QPS, not interleaved",
            float(ex["interleave_off_qps"]),
            no_int["full-hit"].qps,
        ),
        Check(
            "Beluga full-hit QPS, interleaved over 32 devices",
            paper["beluga.full-hit"]["qps"],
            stats["beluga"]["full-hit"].qps,
        ),
    ]

    def cell(s: str, r: str, m: str) -> float:
        return stats[s][r].get(m)

    def pcell(s: str, r: str, m: str) -> float:
        return float(paper[f"{s}.{r}"][m])

    paper_gain = _ratio(pcell("beluga", "full-hit", "qps"), float(ex["interleave_off_qps"]))
    acceptance = [
        _accept(
            "full-hit mean TTFT, Beluga / MoonCake",
            _ratio(
                pcell("beluga", "full-hit", "ttft_mean_s"),
                pcell("mooncake", "full-hit", "ttft_mean_s"),
            ),
            _ratio(
                cell("beluga", "full-hit", "ttft_mean_s"),
                cell("mooncake", "full-hit", "ttft_mean_s"),
            ),
            0.05,
            0.25,
        ),
        _accept(
            "first-run mean TTFT, Beluga / MoonCake",
            _ratio(
                pcell("beluga", "first", "ttft_mean_s"), pcell("mooncake", "first", "ttft_mean_s")
            ),
            _ratio(
                cell("beluga", "first", "ttft_mean_s"), cell("mooncake", "first", "ttft_mean_s")
            ),
            0.7,
            1.0,
        ),
        _accept(
            "full-hit QPS, Beluga / MoonCake",
            _ratio(pcell("beluga", "full-hit", "qps"), pcell("mooncake", "full-hit", "qps")),
            _ratio(cell("beluga", "full-hit", "qps"), cell("mooncake", "full-hit", "qps")),
            3.0,
            None,
        ),
        _accept(
            f"MoonCake full-hit mean TTFT, {small_b}-token / 256-token blocks",
            _ratio(
                float(ex["mooncake_small_ttft_s"]), pcell("mooncake", "full-hit", "ttft_mean_s")
            ),
            _ratio(small["full-hit"].ttft_mean_s, cell("mooncake", "full-hit", "ttft_mean_s")),
            3.0,
            None,
        ),
        _accept(
            "Beluga full-hit QPS, interleaved / not interleaved",
            paper_gain,
            _ratio(cell("beluga", "full-hit", "qps"), no_int["full-hit"].qps),
            # the paper's gain reproduced within half to one and a half times it
            round(1 + (paper_gain - 1) / 2, 3),
            round(1 + 1.5 * (paper_gain - 1), 3),
            cause=interleave_cause(filled),
        ),
    ]
    # absolute mean TTFT within 2x of the paper in every cell it gives
    for s in SYSTEMS:
        for r in RUNS:
            ref = paper.get(f"{s}.{r}", {}).get("ttft_mean_s")
            if ref is not None:
                acceptance.append(
                    _accept(
                        f"mean TTFT {s} {r}, model / paper",
                        1.0,
                        _ratio(cell(s, r, "ttft_mean_s"), float(ref)),
                        0.5,
                        2.0,
                    )
                )
    first_hits = {s: first_pass_hit_ratios(trace, hw, model, policies[s]) for s in SYSTEMS}
    details = {
        f"{s}.{r}": PassDetail(
            n_served=stats[s][r].n_served,
            n_rejected=stats[s][r].n_rejected,
            hbm_reuse_tokens=stats[s][r].reuse_tokens,
            load_share_of_ttft=stats[s][r].load_share_of_ttft,
            first_run_hit_ratio_tokens=first_hits[s] if r == "first" else None,
        )
        for s in SYSTEMS
        for r in RUNS
    }
    summary = ScenarioSummary(
        name=scn["name"],
        file=str(Path(scn["path"]).relative_to(BUILTIN_DIR.parents[1])),
        hardware=scn["hardware"],
        model=scn["model"],
        hbm_kv_gb=hbm,
        requests_per_pass=int(scn["trace"]["requests"]),
        mean_input_tokens=float(np.mean(trace.input_tokens)),
        min_input_tokens=int(np.min(trace.input_tokens)),
        max_input_tokens=int(np.max(trace.input_tokens)),
        first_pass_reuse_tokens=reuse,
        load=scn["load"]["mode"],
        efficiency=Efficiency(
            mfu=hw.efficiency.mfu,
            mbu=hw.efficiency.mbu,
            step_overhead_s=hw.efficiency.step_overhead_s,
        ),
        rdma_op_overhead_us=hw.tiers["rdma"].op_overhead_s * 1e6,
        concurrency=closed,
        cxl_op_overhead_us=hw.tiers["cxl"].op_overhead_s * 1e6,
    )
    return Validation(summary, cells, details, extra, geometry_checks(), acceptance, filled)
