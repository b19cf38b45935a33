"""``kvtier assess``: the seven questions to answer before adopting a shared KV tier, each
with its number and the data of a plot, for one trace and hardware (docs/assess.md).

1. hit ratio by time window and tenant, a block's first appearance apart from its reuse;
2. TTFT with and without each lower tier by context length, and the break-even context
   length per tier and block size (where loading beats recomputing);
3. CXL against RDMA (NIXL / GPUDirect path) against host DRAM at equal capacity;
4. the same policy on each GPU generation profiled;
5. P99 / P99.9 TTFT, and a fault of the shared tier (:mod:`kvtier.sim.fault_metrics`);
6. per-tenant latency and the interference of sharing one pool;
7. cost, energy and the GPUs the tiers save.

Each section is a :class:`Section` (a headline, a table and a plot's series); the rendering
is :mod:`kvtier.report.assess`'s. Every replay goes through :class:`kvtier.scenario.Scenario`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from kvtier.errors import InputError
from kvtier.policy.model import Policy, TierPolicy
from kvtier.scenario import Replay, Scenario
from kvtier.trace.format import Trace

# context-length buckets (prompt tokens) of section 2
BUCKETS = (0, 1024, 4096, 16384, 65536)
BLOCK_SIZES = (16, 64, 256, 512)  # block sizes of the break-even table
GENERATIONS = ("h100-node", "h200-node", "b200-node")  # the GPU generations profiled
NEWER = ("gh200", "gb200", "rubin", "b300")  # other profiles taken when present
TOP_GROUPS = 5  # tenants (or sessions) shown; the first three are also replayed alone
ALONE = 3
SHARED_KINDS = ("cxl", "rdma")  # the tiers a rack or cluster shares, in preference order


@dataclass
class Section:
    """One question's answer: its headline number(s), a table and a plot's series."""

    key: str
    title: str
    headline: str
    headers: list[str]
    rows: list[list[str]]
    plot: dict[str, Any] = field(default_factory=dict)  # kind, x, series, xlabel, ylabel
    notes: list[str] = field(default_factory=list)


@dataclass
class Assessment:
    trace: str
    hardware: str
    model: str
    policy: str
    requests: int
    sections: list[Section]


def _f(x: float | None, unit: str = "s") -> str:
    if x is None or (isinstance(x, float) and (math.isnan(x) or math.isinf(x))):
        return "-"
    if unit == "s":
        return f"{x * 1e3:.1f} ms" if x < 1 else f"{x:.2f} s"
    if unit == "%":
        return f"{x:.1%}"
    return f"{x:.3g}{unit}"


def subset(trace: Trace, keep: np.ndarray) -> Trace:
    """The requests of ``trace`` where ``keep`` is true (arrivals unchanged)."""
    import pyarrow as pa

    return Trace.from_table(
        trace.table.filter(pa.array(keep)),
        block_tokens=trace.block_tokens,
        source=trace.source,
        has_prefix_info=trace.has_prefix_info,
        metadata=trace.metadata,
        sample_fraction=trace.sample_fraction,
    )


def first_requests(scenario: Scenario, n: int | None) -> Scenario:
    """The scenario on its first ``n`` requests (all when ``n`` is None or larger)."""
    total = scenario.trace.table.num_rows
    if n is None or n >= total:
        return scenario
    if n < 1:
        raise InputError(f"must be >= 1, got {n}", option="--max-requests")
    keep = np.zeros(total, dtype=bool)
    keep[:n] = True
    return replace(scenario, trace=subset(scenario.trace, keep), blocks=None)


def lower_tiers(policy: Policy) -> tuple[TierPolicy, ...]:
    return tuple(t for t in policy.tiers if t.name != "hbm")


def hbm_only(policy: Policy) -> Policy:
    return replace(policy, tiers=tuple(t for t in policy.tiers if t.name == "hbm"))


def with_tiers(policy: Policy, *tiers: TierPolicy) -> Policy:
    hbm = tuple(t for t in policy.tiers if t.name == "hbm") or (TierPolicy(),)
    return replace(policy, tiers=hbm + tuple(tiers))


def default_policy(scenario: Scenario) -> Policy:
    """The scenario's policy when it has a lower tier, else HBM plus the hardware's shared
    tier (CXL, else RDMA, else host DRAM)."""
    policy = scenario.policy
    if lower_tiers(policy):
        return policy
    offered = scenario.hardware.tiers
    for name in (*SHARED_KINDS, "dram"):
        if name in offered:
            return with_tiers(policy, TierPolicy(name=name))
    return policy


def ttft(replay: Replay) -> np.ndarray:
    sent = replay.raw.arrival_s if replay.raw.arrival_s is not None else replay.trace.arrival_s
    return replay.raw.first_token_s - sent


def _q(x: np.ndarray, q: float) -> float | None:
    x = x[~np.isnan(x)]
    return float(np.quantile(x, q, method="linear")) if len(x) else None


def groups_of(trace: Any) -> tuple[str, np.ndarray | None]:
    """The trace's tenants, else its sessions, else none (``"tenant"``, ids)."""
    if trace.tenant_id is not None:
        return "tenant", np.asarray(trace.tenant_id, dtype=np.int64)
    if trace.session_id is not None:
        return "session", np.asarray(trace.session_id, dtype=np.int64)
    return "tenant", None


# ---- 1. hit ratio by window and tenant ----------------------------------------------------------
def first_appearance(block_offsets: np.ndarray, block_ids: np.ndarray) -> np.ndarray:
    """Per block reference, whether it is the block's first appearance in the trace."""
    first = np.ones(len(block_ids), dtype=bool)
    _, idx = np.unique(block_ids, return_index=True)
    first[:] = False
    first[idx] = True
    return first


def section_hit_ratio(base: Replay, windows: int = 20) -> Section:
    trace, raw = base.trace, base.raw
    n = trace.n_requests
    full = np.diff(trace.block_offsets)
    first = first_appearance(trace.block_offsets, trace.block_ids)
    req = np.repeat(np.arange(n), full)
    new = np.bincount(req, weights=first.astype(np.float64), minlength=n)
    reusable = full - new  # references to a block seen before: the most any cache could hit
    loaded = raw.loaded_blocks.sum(axis=1) if raw.loaded_blocks.size else np.zeros(n)
    hit = raw.hit_blocks + loaded
    sent = trace.arrival_s
    span = float(sent.max()) if n else 0.0
    w = span / windows if span > 0 else 1.0
    which = np.minimum((sent / w).astype(np.int64), windows - 1)
    tot = np.bincount(which, weights=full, minlength=windows)
    got = np.bincount(which, weights=hit, minlength=windows)
    reu = np.bincount(which, weights=reusable, minlength=windows)
    with np.errstate(invalid="ignore", divide="ignore"):
        hit_w = np.where(tot > 0, got / np.maximum(tot, 1), np.nan)
        reu_w = np.where(tot > 0, reu / np.maximum(tot, 1), np.nan)
    overall = float(hit.sum() / full.sum()) if full.sum() else float("nan")
    ceiling = float(reusable.sum() / full.sum()) if full.sum() else float("nan")
    rows = []
    what, gid = groups_of(trace)
    if gid is not None:
        ids, counts = np.unique(gid, return_counts=True)
        for g in ids[np.argsort(-counts, kind="stable")][:TOP_GROUPS]:
            m = gid == g
            f = full[m].sum()
            rows.append(
                [
                    f"{what} {g}",
                    f"{int(m.sum()):,}",
                    _f(hit[m].sum() / f if f else None, "%"),
                    _f(reusable[m].sum() / f if f else None, "%"),
                    _f(new[m].sum() / f if f else None, "%"),
                ]  # fmt: skip
            )
    rows.append(["all", f"{n:,}", _f(overall, "%"), _f(ceiling, "%"), _f(1 - ceiling, "%")])
    return Section(
        "hit_ratio",
        "1. Real prefix hit ratio, by time and by tenant",
        f"hit ratio {_f(overall, '%')} of prompt blocks; {_f(ceiling, '%')} were seen before "
        f"(reuse, the most any cache could hit), {_f(1 - ceiling, '%')} first appearances",
        [what, "requests", "hit ratio", "reuse (ceiling)", "first appearance"],
        rows,
        {
            "kind": "lines",
            "x": (np.arange(windows) * w).tolist(),
            "series": {"hit ratio": hit_w.tolist(), "reuse (ceiling)": reu_w.tolist()},
            "xlabel": "arrival (s)",
            "ylabel": "share of prompt blocks",
        },
        [] if gid is not None else ["the trace has no tenant or session column: one tenant"],
    )


# ---- 2. TTFT with and without each tier, break-even context length ---------------------------
def break_even(scenario: Scenario, policy: Policy, tier: TierPolicy, B: int) -> float | None:
    """The shortest prompt (tokens, a multiple of ``B`` up to 1M) whose prefix loads from
    ``tier`` on idle links faster than it is recomputed (``None``: never below 1M)."""
    from kvtier.sim.config import build_config
    from kvtier.sim.timing import prefill_seconds
    from kvtier.sim.transfer import ops_of, path_estimate

    cfg = build_config(
        scenario.hardware, scenario.model, with_tiers(replace(policy, block_tokens=B), tier)
    )
    c = cfg.tiers
    assert c is not None
    timing = cfg.timing_params()
    free = np.zeros(2 * c.n_links)
    wfree = np.zeros(2 * max(c.n_workers, 1))
    L = B
    while L <= 1 << 20:
        blocks = L // B
        load = path_estimate(
            0.0, blocks * c.block_bytes, ops_of(int(c.unit[0]), blocks, c.fragments, c.coalesce),
            c.rpc_s[0], c.stream_bw[0, 0], c.stage_bw[0, 0], c.serial[0], c.depth[0], c.lat_s[0],
            c.cap_bw[0], c.gpu_path[0, 0], c.gpu_scale[0], c.link_bw_read, c.link_duplex, 0,
            free, wfree, c.w0[0, 0], c.nw[0],
        )  # fmt: skip
        if load < float(prefill_seconds(L, 0, timing)):
            return float(L)
        L *= 2
    return None


def section_ttft_tiers(
    scenario: Scenario, policy: Policy, base: Replay, hbm: Replay, alone: dict[str, Replay]
) -> Section:
    inputs = base.trace.input_tokens
    edges = [*BUCKETS, math.inf]
    labels = [f"{a // 1024}K-{'' if math.isinf(b) else f'{int(b) // 1024}K'}" for a, b in
              zip(edges[:-1], edges[1:], strict=True)]  # fmt: skip
    runs = {"HBM only": hbm, **{f"+{k}": r for k, r in alone.items()}}
    if len(alone) > 1:
        runs["policy (all tiers)"] = base
    series: dict[str, list[float | None]] = {}
    rows = []
    for name, r in runs.items():
        t = ttft(r)
        med = []
        for a, b in zip(edges[:-1], edges[1:], strict=True):
            m = (inputs >= a) & (inputs < b)
            med.append(_q(t[m], 0.5) if m.any() else None)
        series[name] = med
        rows.append([name, *[_f(x) for x in med]])
    be_rows = []
    offered = [t for t in ("dram", "cxl", "rdma", "ssd") if t in scenario.hardware.tiers]
    for name in offered:
        cells = []
        for B in BLOCK_SIZES:
            x = break_even(scenario, policy, TierPolicy(name=name), B)
            cells.append("never" if x is None else (f"<={B}" if x <= B else f"{int(x):,}"))
        be_rows.append([name, *cells])
    head = [f"{r[0]}: {', '.join(f'B={B} {v}' for B, v in zip(BLOCK_SIZES, r[1:], strict=True))}"
            for r in be_rows]  # fmt: skip
    return Section(
        "ttft_tiers",
        "2. TTFT with and without each tier; where loading beats recomputing",
        "break-even context length in tokens (loading beats recomputing from there on, idle "
        "links) " + ("; ".join(head) or "-"),
        ["P50 TTFT by prompt tokens", *labels],
        rows,
        {
            "kind": "bars",
            "x": labels,
            "series": series,
            "xlabel": "prompt tokens",
            "ylabel": "P50 TTFT (s)",
        },
        [
            "break-even: the shortest prompt (doubling from B) whose KV loads from the tier "
            "faster than it is recomputed, on idle links, every tier of the hardware profile"
        ],
    )


# ---- 3. CXL, RDMA and DRAM at equal capacity --------------------------------------------------
def section_paths(scenario: Scenario, policy: Policy, capacity_gb: float) -> Section:
    hw = scenario.hardware
    hosts = hw.topology.hosts
    rows, series = [], {}
    for name in ("cxl", "rdma", "dram"):
        if name not in hw.tiers:
            rows.append([name, "not in the hardware profile", "-", "-", "-"])
            continue
        per_host = hw.tiers[name].per_host
        gb = capacity_gb / hosts if per_host else capacity_gb
        r = scenario.replay(with_tiers(policy, TierPolicy(name=name, capacity_gb=gb)))
        m = r.metrics
        series[name] = [m.ttft_p50_s, m.ttft_p99_s]
        rows.append(
            [
                name,
                r.tiers[0].connector if r.tiers else "-",
                _f(m.ttft_p50_s),
                _f(m.ttft_p99_s),
                _f(sum(v for k, v in m.hit_ratio_tokens.items()), "%"),
            ]  # fmt: skip
        )
    best = min(series, key=lambda k: series[k][1]) if series else None
    return Section(
        "paths",
        f"3. CXL against RDMA (GPUDirect / NIXL path) against host DRAM, {capacity_gb:g} GB each",
        f"lowest P99 TTFT: {best} ({_f(series[best][1])})" if best else "no tier to compare",
        ["tier", "connector", "TTFT P50", "TTFT P99", "hit ratio (tokens)"],
        rows,
        {"kind": "bars", "x": ["P50", "P99"], "series": series, "xlabel": "", "ylabel": "TTFT (s)"},
    )


# ---- 4. GPU generations -------------------------------------------------------------------------
def generations() -> list[str]:
    from kvtier.hardware.loader import builtin_names

    names = builtin_names("hardware")
    out = [g for g in GENERATIONS if g in names]
    out += [n for n in names if any(k in n for k in NEWER) and n not in out]
    return out


def section_generations(scenario: Scenario, policy: Policy) -> Section:
    from kvtier.hardware import load_hardware

    rows, series = [], {}
    for name in generations():
        hw = load_hardware(name)
        tiers = [t for t in lower_tiers(policy) if t.name in hw.tiers]
        if not tiers and "dram" in hw.tiers:
            tiers = [TierPolicy(name="dram")]
        p = with_tiers(policy, *tiers)
        try:
            r = replace(scenario, hardware=hw).replay(p)
        except InputError as err:
            rows.append([name, hw.gpu.name, f"cannot replay: {err}", "-", "-", "-"])
            continue
        m = r.metrics
        series[name] = [m.ttft_p50_s, m.ttft_p99_s]
        rows.append(
            [
                name,
                hw.gpu.name,
                "+".join(t.name for t in p.tiers),
                _f(m.ttft_p99_s),
                f"${m.cost_per_mtok:.4f}",
                _f(m.tokens_per_joule, " tok/J"),
            ]  # fmt: skip
        )
    best = min(series, key=lambda k: series[k][1]) if series else None
    return Section(
        "generations",
        "4. The same on each GPU generation profiled",
        f"lowest P99 TTFT on {best} ({_f(series[best][1])})" if best else "no profile replayed",
        ["hardware", "GPU", "tiers", "TTFT P99", "$ per 1M tokens", "energy"],
        rows,
        {"kind": "bars", "x": ["P50", "P99"], "series": series, "xlabel": "", "ylabel": "TTFT (s)"},
    )


# ---- 5. tail latency and a fault -------------------------------------------------------------
def fault_for(policy: Policy, scenario: Scenario, base: Replay) -> Any:
    from kvtier.sim.faults import Fault

    tiers = [t.name for t in lower_tiers(policy)]
    name = next((t for t in SHARED_KINDS if t in tiers), tiers[0] if tiers else None)
    if name is None:
        return None
    span = float(base.trace.arrival_s.max()) if base.trace.n_requests else 0.0
    return Fault(kind="device", tier=name, at_s=span / 3, down_s=span / 10, device=0, devices=4)


def section_tail_fault(scenario: Scenario, policy: Policy, base: Replay) -> Section:
    from kvtier.sim.fault_metrics import fault_impacts

    m = base.metrics
    fault = fault_for(policy, scenario, base)
    rows = [["no fault", _f(m.ttft_p50_s), _f(m.ttft_p99_s), _f(m.ttft_p999_s), "-", "-"]]
    plot: dict[str, Any] = {}
    headline = f"TTFT P99 {_f(m.ttft_p99_s)}, P99.9 {_f(m.ttft_p999_s)}"
    if fault is not None:
        r = scenario.replay(policy, faults=(fault,))
        (imp,) = fault_impacts(r.trace, r.raw, (fault,), baseline=base.raw)
        rec = _f(imp.recovery_s) if imp.recovery_s is not None else "not within the trace"
        rows.append(
            [
                fault.label(),
                "-",
                f"{_f(imp.ttft_p99_s)} (no fault {_f(imp.baseline_ttft_p99_s)})",
                f"{_f(imp.ttft_p999_s)} (no fault {_f(imp.baseline_ttft_p999_s)})",
                f"{imp.lost_blocks:,}",
                rec,
            ]  # fmt: skip
        )
        headline += (
            f"; {fault.label()}: {imp.lost_blocks:,} blocks lost, recovery {rec}, TTFT P99 "
            f"during it {_f(imp.ttft_p99_s)} against {_f(imp.baseline_ttft_p99_s)}"
        )
        plot = {
            "kind": "lines",
            "x": imp.window_start_s.tolist(),
            "series": {
                "with fault": imp.window_hit.tolist(),
                "no fault": imp.window_base_hit.tolist(),
            },  # fmt: skip
            "xlabel": "arrival (s)",
            "ylabel": "hit ratio (window)",
            "vlines": [imp.at_s, imp.back_s],
        }
    return Section(
        "tail_fault",
        "5. Tail latency and failure recovery",
        headline,
        ["replay", "TTFT P50", "TTFT P99", "TTFT P99.9", "blocks lost", "recovery"],
        rows,
        plot,
        [f"recovery: windowed hit ratio back within {5}% of the replay without the fault"],
    )


# ---- 6. tenants and interference ----------------------------------------------------------------
def section_tenants(scenario: Scenario, policy: Policy, base: Replay) -> Section:
    what, gid = groups_of(base.trace)
    t = ttft(base)
    if gid is None:
        return Section(
            "tenants",
            "6. Per-tenant latency and interference in a shared pool",
            f"one tenant: TTFT P99 {_f(_q(t, 0.99))}",
            ["tenant", "requests", "TTFT P99 shared"],
            [["all", f"{len(t):,}", _f(_q(t, 0.99))]],
            {
                "kind": "bars",
                "x": ["all"],
                "series": {"shared": [_q(t, 0.99)]},
                "xlabel": what,
                "ylabel": "TTFT P99 (s)",
            },  # fmt: skip
            ["the trace has no tenant or session column: no interference to measure"],
        )
    ids, counts = np.unique(gid, return_counts=True)
    top = ids[np.argsort(-counts, kind="stable")][:TOP_GROUPS]
    rows, shared, alone_p99, names = [], [], [], []
    worst = None
    for x, g in enumerate(top):
        m = gid == g
        p99 = _q(t[m], 0.99)
        a = None
        if x < ALONE:
            sc = replace(scenario, trace=subset(scenario.trace, m), blocks=None)
            a = _q(ttft(sc.replay(policy)), 0.99)
        ratio = p99 / a if (p99 is not None and a) else None
        if ratio is not None and (worst is None or ratio > worst[1]):
            worst = (g, ratio)
        names.append(f"{what} {g}")
        shared.append(p99)
        alone_p99.append(a)
        rows.append([f"{what} {g}", f"{int(m.sum()):,}", _f(_q(t[m], 0.5)), _f(p99), _f(a),
                     "-" if ratio is None else f"{ratio:.2f}x"])  # fmt: skip
    head = (
        f"worst interference: {what} {worst[0]}'s TTFT P99 is {worst[1]:.2f}x its P99 alone"
        if worst
        else "no group replayed alone"
    )
    return Section(
        "tenants",
        "6. Per-tenant latency and interference in a shared pool",
        head,
        [what, "requests", "TTFT P50 shared", "TTFT P99 shared", "TTFT P99 alone", "shared/alone"],
        rows,
        {
            "kind": "bars",
            "x": names,
            "series": {"shared": shared, "alone": alone_p99},
            "xlabel": what,
            "ylabel": "TTFT P99 (s)",
        },  # fmt: skip
        [f"the {ALONE} busiest {what}s are replayed alone on the same deployment"],
    )


# ---- 7. cost, energy and GPUs saved -------------------------------------------------------------
def gpu_seconds(r: Replay) -> float:
    per = r.config.instance_gpus or (1,) * r.config.n_instances
    return float(sum(b * g for b, g in zip(r.raw.busy_s, per, strict=False)))


def section_efficiency(base: Replay, hbm: Replay) -> Section:
    span = max(float(base.trace.arrival_s.max()) if base.trace.n_requests else 0.0, 1e-9)
    saved = (gpu_seconds(hbm) - gpu_seconds(base)) / span
    rows = []
    for name, r in (("HBM only", hbm), ("with the tiers", base)):
        m = r.metrics
        rows.append(
            [
                name,
                f"${m.cost_per_hour:.2f}/h",
                f"${m.cost_per_mtok:.4f}",
                _f(m.tokens_per_joule, " tok/J"),
                _f(m.joules_per_token, " J/tok"),
                f"{gpu_seconds(r) / span:.2f}",
            ]  # fmt: skip
        )
    mb, mh = base.metrics, hbm.metrics
    return Section(
        "efficiency",
        "7. Cost, energy and the GPUs saved",
        f"the tiers save {saved:.2f} busy GPUs on average over the trace; $ per 1M tokens "
        f"{mh.cost_per_mtok:.4f} -> {mb.cost_per_mtok:.4f}; tokens per joule "
        f"{_f(mh.tokens_per_joule, '')} -> {_f(mb.tokens_per_joule, '')}",
        ["replay", "cost", "$ per 1M tokens", "energy", "per token", "busy GPUs (mean)"],
        rows,
        {
            "kind": "bars",
            "x": ["$ per 1M tokens", "busy GPUs"],
            "series": {
                "HBM only": [mh.cost_per_mtok, gpu_seconds(hbm) / span],
                "with the tiers": [mb.cost_per_mtok, gpu_seconds(base) / span],
            },
            "xlabel": "",
            "ylabel": "",
        },  # fmt: skip
        [
            "busy GPUs: GPU-seconds in iterations over the trace's span (the compute the tiers "
            "free, not a re-sized deployment)"
        ],
    )


def assess(scenario: Scenario, *, capacity_gb: float = 256.0, progress: Any = None) -> Assessment:
    """Answer the seven questions for ``scenario`` (its trace, hardware, model, policy)."""
    say = progress or (lambda _msg: None)
    policy = default_policy(scenario)
    say("replaying the policy and HBM alone")
    base = scenario.replay(policy)
    hbm = scenario.replay(hbm_only(policy))
    alone = {}
    for t in lower_tiers(policy):
        alone[t.name] = base if len(lower_tiers(policy)) == 1 else scenario.replay(
            with_tiers(policy, t))  # fmt: skip
    sections = [section_hit_ratio(base)]
    say("2/7 TTFT by context length")
    sections.append(section_ttft_tiers(scenario, policy, base, hbm, alone))
    say("3/7 CXL, RDMA and DRAM")
    sections.append(section_paths(scenario, policy, capacity_gb))
    say("4/7 GPU generations")
    sections.append(section_generations(scenario, policy))
    say("5/7 tail latency and a fault")
    sections.append(section_tail_fault(scenario, policy, base))
    say("6/7 tenants")
    sections.append(section_tenants(scenario, policy, base))
    sections.append(section_efficiency(base, hbm))
    return Assessment(
        trace=scenario.trace.path or scenario.trace.source,
        hardware=scenario.hardware.name,
        model=scenario.model.name,
        policy="+".join(t.name for t in policy.tiers),
        requests=scenario.trace.table.num_rows,
        sections=sections,
    )
