"""Validation against published results: the Beluga / MoonCake LV-Eval comparison.

``run_beluga()`` replays the scenario of ``policies/presets/validation/beluga-lveval.toml``
(the Beluga paper's testbed, an LV-Eval-like two-pass trace, the ``mooncake-rdma``,
``beluga-cxl`` and ``vllm-hbm`` presets) and returns every cell of the paper's table with the
model's value beside it, the extra reproductions (MoonCake with 16-token blocks, Beluga without
interleaving), the KV geometry checks (docs/sources.md) and the acceptance ratios of issue 7.
``to_markdown()`` renders the result as ``docs/validation.md``.

The load generator is modelled as a burst: every request of a pass arrives when the pass
starts, and the second (full-hit) pass starts after the first has finished, so its cache is
what the first pass left. QPS of a pass = its requests / (its last finish - its start).
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


def load_scenario(name: str) -> dict[str, Any]:
    path = SCENARIOS.get(name)
    if path is None:
        raise InputError(f"unknown validation {name!r} (known: {', '.join(sorted(SCENARIOS))})")
    with open(path, "rb") as f:
        data = tomllib.load(f)
    data["path"] = str(path)
    return data


def scenario_trace(scn: dict[str, Any]):  # noqa: ANN201
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
    trace: Any, hw: Hardware, model: ModelProfile, policy: Policy
) -> dict[str, PassStats]:
    """Replay ``trace`` under the burst load generator; statistics per pass."""
    from kvtier.sim import build_config, simulate_raw
    from kvtier.trace.blocks import block_trace

    bt = block_trace(trace, policy.block_tokens, share_across_tenants=policy.share_across_tenants)
    passes = bt.pass_index
    cfg = build_config(hw, model, policy)
    # Pass p starts at p * gap; the gap is doubled until every request of a pass has finished
    # before the next pass starts (the paper ran the full-hit pass after the first run).
    gap = 1.0e5
    while True:
        arrival = passes.astype(np.float64) * gap
        run = bt.with_arrivals(np.ascontiguousarray(arrival))
        raw = simulate_raw(run, cfg)
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


def first_pass_reuse(trace: Any, block_tokens: int = 16) -> float:
    """Share of the first pass's prompt tokens an infinite cache serves (prefix reuse)."""
    from kvtier.trace.blocks import block_trace
    from kvtier.trace.stats import prefix_hits

    bt = block_trace(trace, block_tokens)
    hits = prefix_hits(bt)
    sel = bt.pass_index == 0
    return float(hits[sel].sum() * block_tokens / bt.input_tokens[sel].sum())


def first_pass_hit_ratios(
    trace: Any, hw: Hardware, model: ModelProfile, policy: Policy
) -> dict[str, float]:
    """Prompt tokens served from each tier in the first pass alone (replayed by itself)."""
    from kvtier.sim import simulate
    from kvtier.trace.blocks import block_trace

    bt = block_trace(trace, policy.block_tokens, share_across_tenants=policy.share_across_tenants)
    n = int((bt.pass_index == 0).sum())  # pass 0 is the first n rows
    end = int(bt.block_offsets[n])
    first = replace(
        bt,
        arrival_s=np.zeros(n),
        input_tokens=bt.input_tokens[:n].copy(),
        output_tokens=bt.output_tokens[:n].copy(),
        block_offsets=bt.block_offsets[: n + 1].copy(),
        block_ids=bt.block_ids[:end].copy(),
        session_id=None if bt.session_id is None else bt.session_id[:n].copy(),
        tenant_id=None if bt.tenant_id is None else bt.tenant_id[:n].copy(),
        pass_index=bt.pass_index[:n].copy(),
    )
    return dict(simulate(first, hw, model, policy).hit_ratio_tokens)


def geometry_checks() -> list[dict[str, Any]]:
    """Published KV bytes per token and context sizes (docs/sources.md) against the profiles."""
    rows = []
    for name, kib in GEOMETRY_TABLE:
        got = load_model(name).kv_bytes_per_token("bf16") / 1024
        rows.append(
            {
                "check": f"{name} KiB per token (BF16)",
                "paper": kib,
                "model": got,
                "exact": got == kib,
            }
        )
    for name, tokens, gib in GEOMETRY_CONTEXT:
        got = load_model(name).kv_bytes_per_token("bf16") * tokens / 2**30
        rows.append(
            {
                "check": f"{name} GiB of KV at {tokens:,} tokens",
                "paper": gib,
                "model": got,
                "exact": got == gib,
            }
        )
    return rows


def _ratio(a: float, b: float) -> float:
    return a / b if b else math.nan


def run_beluga() -> dict[str, Any]:
    """Every cell, the extra reproductions, geometry and acceptance of the Beluga validation."""
    scn = load_scenario("beluga")
    hw = load_hardware(scn["hardware"])
    model = load_model(scn["model"])
    trace = scenario_trace(scn)
    hbm = float(scn["hbm_kv_gb"])
    reuse = first_pass_reuse(trace)
    policies = {s: with_hbm(load_preset(scn["systems"][s]), hbm) for s in SYSTEMS}
    stats = {s: run_passes(trace, hw, model, p) for s, p in policies.items()}

    paper = scn.get("paper", {})
    cells = []
    for s in SYSTEMS:
        for r in RUNS:
            ref = paper.get(f"{s}.{r}", {})
            for m in METRICS:
                v = ref.get(m)
                cells.append(
                    {
                        "system": s,
                        "run": r,
                        "metric": m,
                        "paper": None if v is None else float(v),
                        "model": stats[s][r].get(m),
                    }
                )

    ex = scn["extra"]
    small_b = int(ex["mooncake_small_block_tokens"])
    small = run_passes(trace, hw, model, policies["mooncake"].with_block_tokens(small_b))
    no_int = run_passes(trace, hw, model, with_interleave(policies["beluga"], False))
    extra = [
        {
            "check": f"MoonCake full-hit mean TTFT, {small_b}-token blocks (s)",
            "paper": float(ex["mooncake_small_ttft_s"]),
            "model": small["full-hit"].ttft_mean_s,
        },
        {
            "check": "MoonCake full-hit mean TTFT, 256-token superblocks (s)",
            "paper": paper["mooncake.full-hit"]["ttft_mean_s"],
            "model": stats["mooncake"]["full-hit"].ttft_mean_s,
        },
        {
            "check": "Beluga full-hit QPS, not interleaved",
            "paper": float(ex["interleave_off_qps"]),
            "model": no_int["full-hit"].qps,
        },
        {
            "check": "Beluga full-hit QPS, interleaved over 32 devices",
            "paper": paper["beluga.full-hit"]["qps"],
            "model": stats["beluga"]["full-hit"].qps,
        },
    ]

    def cell(s: str, r: str, m: str) -> float:
        return stats[s][r].get(m)

    def pcell(s: str, r: str, m: str) -> float:
        return float(paper[f"{s}.{r}"][m])

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
            _ratio(pcell("beluga", "full-hit", "qps"), float(ex["interleave_off_qps"])),
            _ratio(cell("beluga", "full-hit", "qps"), no_int["full-hit"].qps),
            1.0,
            None,
            strict=True,
        ),
    ]
    first_hits = {s: first_pass_hit_ratios(trace, hw, model, policies[s]) for s in SYSTEMS}
    details = {
        f"{s}.{r}": {
            "n_served": stats[s][r].n_served,
            "n_rejected": stats[s][r].n_rejected,
            "hbm_reuse_tokens": stats[s][r].reuse_tokens,
            "load_share_of_ttft": stats[s][r].load_share_of_ttft,
            **({"first_run_hit_ratio_tokens": first_hits[s]} if r == "first" else {}),
        }
        for s in SYSTEMS
        for r in RUNS
    }
    return {
        "scenario": {
            "name": scn["name"],
            "file": str(Path(scn["path"]).relative_to(BUILTIN_DIR.parents[1])),
            "hardware": scn["hardware"],
            "model": scn["model"],
            "hbm_kv_gb": hbm,
            "requests_per_pass": int(scn["trace"]["requests"]),
            "mean_input_tokens": float(np.mean(trace.input_tokens)),
            "min_input_tokens": int(np.min(trace.input_tokens)),
            "max_input_tokens": int(np.max(trace.input_tokens)),
            "first_pass_reuse_tokens": reuse,
            "load": scn["load"]["mode"],
            "efficiency": {
                "mfu": hw.efficiency.mfu,
                "mbu": hw.efficiency.mbu,
                "step_overhead_s": hw.efficiency.step_overhead_s,
            },
            "rdma_op_overhead_us": hw.tiers["rdma"].op_overhead_s * 1e6,
            "cxl_op_overhead_us": hw.tiers["cxl"].op_overhead_s * 1e6,
        },
        "cells": cells,
        "details": details,
        "extra": extra,
        "geometry": geometry_checks(),
        "acceptance": acceptance,
    }


def _accept(
    name: str, paper: float, model: float, lo: float, hi: float | None, *, strict: bool = False
) -> dict[str, Any]:
    ok = (model > lo if strict else model >= lo) and (hi is None or model <= hi)
    at_least = f"> {lo:g}" if strict else f">= {lo:g}"
    target = at_least if hi is None else f"[{lo:g}, {hi:g}]"
    return {"ratio": name, "paper": paper, "model": model, "target": target, "met": bool(ok)}


METRIC_LABELS = {
    "ttft_mean_s": "mean TTFT (s)",
    "ttft_p99_s": "P99 TTFT (s)",
    "tpot_mean_s": "mean TPOT (s)",
    "tpot_p99_s": "P99 TPOT (s)",
    "qps": "throughput (QPS)",
}
SYSTEM_LABELS = {"mooncake": "MoonCake", "beluga": "Beluga", "vllm": "vLLM alone"}


def _num(x: float | None) -> str:
    if x is None:
        return "-"
    if isinstance(x, float) and math.isnan(x):
        return "n/a"
    if abs(x) >= 100:
        return f"{x:,.0f}"
    if abs(x) >= 10:
        return f"{x:.1f}"
    return f"{x:.3g}" if abs(x) < 1 else f"{x:.2f}"


def cells_table(result: dict[str, Any]) -> str:
    """The paper's table, each cell as ``paper / model``."""
    cols = [(s, r) for s in SYSTEMS for r in RUNS]
    by_key = {(c["system"], c["run"], c["metric"]): c for c in result["cells"]}
    head = "| metric | " + " | ".join(f"{SYSTEM_LABELS[s]} {r}" for s, r in cols) + " |"
    lines = [head, "|---" * (len(cols) + 1) + "|"]
    for m in METRICS:
        row = [METRIC_LABELS[m]]
        for s, r in cols:
            c = by_key[(s, r, m)]
            row.append(f"{_num(c['paper'])} / {_num(c['model'])}")
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def _rows(items: list[dict[str, Any]], keys: list[str], head: list[str]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    for it in items:
        vals = []
        for k in keys:
            v = it[k]
            if isinstance(v, bool):
                vals.append("yes" if v else "**no**")
            elif isinstance(v, float):
                vals.append(_num(v))
            else:
                vals.append(str(v))
        lines.append("| " + " | ".join(vals) + " |")
    return "\n".join(lines)


def to_text(result: dict[str, Any]) -> str:
    """Terminal output: the tables without the prose of docs/validation.md."""
    parts = [
        "Beluga / MoonCake LV-Eval validation (each cell: paper / model)",
        cells_table(result),
        "",
        _rows(result["extra"], ["check", "paper", "model"], ["reproduction", "paper", "model"]),
        "",
        _rows(
            result["acceptance"],
            ["ratio", "paper", "model", "target", "met"],
            ["ratio", "paper", "model", "target", "met"],
        ),
        "",
        _rows(
            result["geometry"],
            ["check", "paper", "model", "exact"],
            ["KV geometry", "published", "model", "exact"],
        ),
    ]
    return "\n".join(parts)


def to_markdown(result: dict[str, Any]) -> str:
    """``docs/validation.md``: the tables of ``to_text`` with how they were made and read."""
    sc = result["scenario"]
    eff = sc["efficiency"]
    det = result["details"]
    acc = {a["ratio"]: a for a in result["acceptance"]}
    met = sum(a["met"] for a in result["acceptance"])
    fh = {f"{c['system']}.{c['run']}.{c['metric']}": c["model"] for c in result["cells"]}
    hits_m = det["mooncake.first"]["first_run_hit_ratio_tokens"]
    hits_b = det["beluga.first"]["first_run_hit_ratio_tokens"]
    extra = {e["check"]: e for e in result["extra"]}
    ex16 = next(e for k, e in extra.items() if k.startswith("MoonCake") and "16-token" in k)
    ex_ni = extra["Beluga full-hit QPS, not interleaved"]
    ex_i = extra["Beluga full-hit QPS, interleaved over 32 devices"]
    gain = ex_i["model"] / ex_ni["model"] - 1
    lines = [
        "# Validation: the Beluga / MoonCake LV-Eval comparison",
        "",
        "<!-- Generated by `kvtier validate beluga --markdown docs/validation.md`. -->",
        "",
        "`kvtier validate beluga` replays the end-to-end comparison of the Beluga paper (Yang et",
        'al., "Beluga", arXiv 2511.20172, SIGMOD 2026; figures read in secondary write-ups, S;',
        "docs/sources.md) through the serving and tier model (docs/model.md) and prints",
        "the paper's value beside the model's for every cell (`--json` for scripts). One",
        "calibration serves every cell; the residuals are reported as they are.",
        "",
        "## Scenario",
        "",
        f"`{sc['file']}`, read by `optimizer/report/validation.py`:",
        "",
        f"- Hardware `{sc['hardware']}` (2 x 8 H20, 16 instances of {sc['model']}, tp 1); the",
        f"  HBM pool of every instance is the paper's {sc['hbm_kv_gb']:g} GB of KV per H20",
        "  (the profile's derivation, 90% of 96 GB less weights and a 2 GB reserve, leaves",
        "  18.8 GB; the scenario uses the measured figure instead).",
        "- Systems: the presets `mooncake-rdma` (RDMA pool, 256-token superblocks, per-layer",
        "  fragments, the batch waits for loads as with LMCache 0.3.1), `beluga-cxl`",
        "  (rack-shared CXL pool, 16-token blocks, interleaved; only the loading request waits:",
        "  the paper does not say how Beluga's loads meet the batch) and `vllm-hbm` (vLLM prefix",
        "  caching alone); both pools limited to 2 TB, write-through, round-robin routing.",
        '- Trace: `synthesize("rag", long=True, passes=2, ...)`, an LV-Eval-like workload:',
        f"  {sc['requests_per_pass']} requests per pass (16 per instance), one long document",
        f"  per prompt, inputs {sc['min_input_tokens']:,}-{sc['max_input_tokens']:,} tokens",
        f"  (mean {sc['mean_input_tokens']:,.0f}; LV-Eval's 16k level, all above 15K as in the",
        "  paper). The document pool is sized so that an infinite cache would serve",
        f"  {sc['first_pass_reuse_tokens']:.1%} of the first pass's input tokens (the paper's",
        "  first run has about 30% hits); in the replay the first run takes",
        f"  {hits_m.get('hbm', 0):.1%} from HBM and {hits_m.get('rdma', 0):.1%} from the RDMA",
        f"  pool (MoonCake), {hits_b.get('hbm', 0):.1%} and {hits_b.get('cxl', 0):.1%} from CXL",
        "  (Beluga).",
        "  The second pass replays the same requests: every full block is in the pool.",
        "- Scale: the paper does not state its request count. 256 per pass keeps a run at a few",
        "  seconds on two cores while the working set (about 1.3 TB of KV) far exceeds the 16",
        "  instances' HBM (453 GB) and fits in the 2 TB pools, as in the paper (HBM hit ratio",
        "  at most 14.6% there, "
        f"{max(d['hbm_reuse_tokens'] for d in det.values()):.1%} at most here). With 48 or 64",
        "  requests per pass every prompt of the first pass would still be in HBM for the",
        "  second, which would measure HBM, not the pools.",
        "",
        "**Load generator.** Every request of a pass is submitted at once when the pass",
        "starts (vLLM's `benchmark_serving.py` default, `--request-rate inf`, R); the full-hit",
        "pass starts after the last request of the first has finished. QPS of a pass = its",
        "requests / (its last finish - its start); TTFT and TPOT as in docs/model.md, per pass.",
        "The paper's figures give TTFT x QPS of about 15-21 in every cell, i.e. some 20-40",
        "requests outstanding (a closed loop or a burst of that size); a burst of 256 queues",
        "more, so absolute TTFTs here are larger than the paper's under the same throughput.",
        "Compare ratios between systems under the same load, not absolute TTFT.",
        "",
        "## Calibration",
        "",
        "One set for every cell, in `optimizer/hardware/profiles/hardware/beluga-testbed.toml`",
        "with the reason beside each value:",
        "",
        f"- `mfu = {eff['mfu']:g}` (sourced range 0.4-0.6, R): the first run is",
        "  prefill-bound; the top of the range gives first-run QPS closest to the paper's",
        "  (0.5 gives about 0.76 in this scenario).",
        f"- RDMA `op_overhead_us = {sc['rdma_op_overhead_us']:.2f}` (sourced range 2.57-7.87):",
        "  the paper's single 16 KB transfer (10.55 us, 2.68 us of it data); a per-layer KV",
        "  fragment is issued as one such transfer. It reproduces MoonCake's full-hit TTFT with",
        f"  16-token blocks ({_num(ex16['model'])} s, paper {_num(ex16['paper'])} s); 2.57 us",
        "  gives about 28.0 s in this scenario.",
        f"- Unchanged: `mbu = {eff['mbu']:g}` (0.6-0.85, S), CXL per-op",
        f"  {sc['cxl_op_overhead_us']:.2f} us (S), every bandwidth as sourced in the profile.",
        "",
        "## Results (each cell: paper / model)",
        "",
        cells_table(result),
        "",
        "## Other reproductions",
        "",
        _rows(result["extra"], ["check", "paper", "model"], ["reproduction", "paper", "model"]),
        "",
        "## Acceptance (issue 7)",
        "",
        f"{met} of {len(result['acceptance'])} met; the interleaving check only by the"
        f" {gain:+.1%} below, which is not the paper's effect.",
        "",
        _rows(
            result["acceptance"],
            ["ratio", "paper", "model", "target", "met"],
            ["ratio", "paper", "model", "target", "met"],
        ),
        "",
        "## KV geometry (published figures, docs/sources.md; exact)",
        "",
        _rows(
            result["geometry"],
            ["check", "paper", "model", "exact"],
            ["check", "published", "model", "exact"],
        ),
        "",
        "DeepSeek-V3: 61 x (512 + 64) x 2 bytes = 70,272 bytes = 68.625 KiB exactly; the",
        "published 68.6 is that value rounded.",
        "",
        "## What the model reproduces, and what it cannot",
        "",
        "- **First run (reproduced).** Beluga / MoonCake mean TTFT "
        f"{_num(acc['first-run mean TTFT, Beluga / MoonCake']['model'])} (paper 0.876), QPS",
        f"  {_num(fh['mooncake.first.qps'])} and {_num(fh['beluga.first.qps'])} (paper 1.02,",
        "  1.24). Both systems are bound by prefill compute; their loads are a small share of",
        "  TTFT. The model's Beluga is only slightly ahead because the first run's pool hits",
        "  load quickly over either fabric.",
        "- **MoonCake with 16-token blocks (reproduced).** 64 layers x K/V = 128 fragments per",
        "  block, each an RDMA operation of 7.87 us, make a full-hit load of a 19K-token prompt",
        "  take about 1.2 s of NIC time per request, and a host's NIC serves its 8 GPUs in turn:",
        f"  {_num(ex16['model'])} s against the paper's {_num(ex16['paper'])} s.",
        "- **Full hit, Beluga against MoonCake with 256-token superblocks (not reproduced; the",
        "  model gets the direction wrong).** With superblocks a fragment is 512 KiB and the",
        "  per-operation cost vanishes; the model then moves KV at link rate, and one host's",
        "  RDMA NICs (174 GB/s, 4 x CX-7 2 x 200 Gb/s at Mooncake's 87% efficiency) are wider",
        "  than its two CXL adapters (46 GB/s). So the model's MoonCake loads faster than its",
        f"  Beluga: full-hit QPS {_num(fh['mooncake.full-hit.qps'])} against",
        f"  {_num(fh['beluga.full-hit.qps'])} (paper 1.54 against 11.32). The paper's MoonCake",
        "  full-hit QPS, 1.54 for prompts of 4-5 GB of KV, is an effective 3-4 GB/s per host",
        "  (0.44 GB/s per GPU worker), 2% of line rate. The cost is in the software path of the",
        "  paper's LMCache 0.3.1, which the model does not describe ([LMCache-0.3.1],",
        "  docs/sources.md): a retrieve fetches one 256-token chunk at a time (a blocking get",
        "  through the Mooncake Store client's staging buffer, a CPU copy into LMCache's pinned",
        "  buffer, then the copy to the GPU, before the next chunk is asked for). A synchronous",
        "  Mooncake Store get costs about 0.15 ms plus 2.6 GB/s ([Mooncake-store-get]); with",
        "  the extra CPU copy a worker loads at some 1.3-1.7 GB/s, which matches the Mooncake",
        "  project's own LMCache full-hit run, about 1.3 GB/s per GPU",
        "  ([Mooncake-LMCache-doc]). That is still 3-4 times the paper's 0.44 GB/s; the rest",
        "  (8 workers per host sharing one master, host memory bandwidth and NICs, each",
        "  tensor-parallel step waiting for its slowest rank) has no measured figure. At 1.3-1.7",
        "  GB/s per worker, 16 workers load 5.0 GB prompts at 4.2-5.5 per second at most",
        "  (arithmetic, not a replay): against the model's Beluga at",
        f"  {_num(fh['beluga.full-hit.qps'])} QPS a ratio of 1.5-2, still short of 3 (paper",
        "  7.35). Reaching",
        "  1.54 QPS with the model's RDMA link instead needs a per-operation overhead of about",
        "  140 us (tried: 60 us gives 3.2 QPS, 100 us 2.0, 140 us 1.46, with full-hit TPOTs of",
        "  0.25, 0.39 and 0.54 s), 18 times the sourced",
        "  upper bound for an RDMA operation, so it is left at 7.87 us. Beluga's own",
        f"  full-hit QPS ({_num(fh['beluga.full-hit.qps'])}, paper 11.32) is bound by the 46 GB/s",
        "  adapters and is within 30% of the paper.",
        "- **Interleaving (not reproduced in substance).** The model caps a transfer from a",
        "  non-interleaved pool at one device's 22.5 GB/s but treats devices as independent:",
        "  many concurrent transfers still fill a host's 46 GB/s adapters, and hot devices do not",
        f"  queue. Full-hit QPS changes by {gain:+.1%} (paper +33%, 8.49 -> 11.32); the",
        "  acceptance check passes only by that margin. Devices as separate FIFO links would be",
        "  needed to show the gain.",
        "- **TPOT (the full-hit direction only).** The paper's TPOT x QPS is about 1.7-2 in",
        "  every cell and",
        "  its P99 TPOT is 10-20 s: decode steps stall behind loads and long prefills under its",
        "  load. In LMCache 0.3.1, vLLM's `start_load_kv` runs the retrieve synchronously before",
        "  the forward pass ([LMCache-0.3.1]; asynchronous loading came in LMCache 0.3.7, off",
        "  by default), so every decode of the batch waits for the loads admitted in that step:",
        "  the paper's full-hit TPOT ratio MoonCake / Beluga (7.3) equals its QPS ratio. The",
        '  model\'s MoonCake waits the same way (`load_wait = "batch"`, docs/model.md), but its',
        "  loads move at link rate and take tenths of a second, so its full-hit TPOT rises only",
        f"  to {_num(fh['mooncake.full-hit.tpot_mean_s'])} s (against Beluga's",
        f"  {_num(fh['beluga.full-hit.tpot_mean_s'])} s): the stall is as short as the load, and",
        "  the load is what the model",
        "  cannot make slow (above). Long prefills beside decodes are the rest of the paper's",
        "  first-run TPOT; the model's chunked prefill shares each iteration with the decodes.",
        "- **vLLM alone.** Full-hit QPS "
        f"{_num(fh['vllm.full-hit.qps'])} (paper 0.96): HBM keeps almost nothing of the first",
        "  pass, so the second run recomputes, as in the paper.",
        "",
        "## Regenerate",
        "",
        "```bash",
        "kvtier validate beluga --markdown docs/validation.md   # tables on stdout too",
        "kvtier validate beluga --json",
        "```",
        "",
        "`tests/test_validate.py` pins the KV geometry and the direction of each comparison",
        "the model reproduces, not the calibrated values.",
        "",
    ]
    return "\n".join(lines)
