"""How ``kvtier validate beluga`` reports: terminal tables, JSON and ``docs/validation.md``.

The replays and the values they give are :mod:`kvtier.experiments.validation`'s; this renders
a :class:`~kvtier.experiments.validation.Validation` and computes nothing.
"""

from __future__ import annotations

import math
from dataclasses import asdict
from typing import Any

from kvtier.experiments.validation import METRICS, RUNS, SYSTEMS, TPOT_CAUSE, Validation

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


def validation_json(result: Validation) -> dict[str, Any]:
    """The result as plain data (``--json``); a first run's details carry its tier hits."""

    def detail(d: Any) -> dict[str, Any]:
        out = asdict(d)
        if out["first_run_hit_ratio_tokens"] is None:
            del out["first_run_hit_ratio_tokens"]
        return out

    return {
        "scenario": asdict(result.scenario),
        "cells": [asdict(c) for c in result.cells],
        "details": {k: detail(d) for k, d in result.details.items()},
        "extra": [asdict(e) for e in result.extra],
        "geometry": [asdict(g) for g in result.geometry],
        "acceptance": [asdict(a) for a in result.acceptance],
        "devices_filled": result.devices_filled,
    }


def cells_table(result: Validation) -> str:
    """The paper's table, each cell as ``paper / model``."""
    cols = [(s, r) for s in SYSTEMS for r in RUNS]
    by_key = {(c.system, c.run, c.metric): c for c in result.cells}
    head = "| metric | " + " | ".join(f"{SYSTEM_LABELS[s]} {r}" for s, r in cols) + " |"
    lines = [head, "|---" * (len(cols) + 1) + "|"]
    for m in METRICS:
        row = [METRIC_LABELS[m]]
        for s, r in cols:
            c = by_key[(s, r, m)]
            row.append(f"{_num(c.paper)} / {_num(c.model)}")
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def _rows(items: list[Any], keys: list[str], head: list[str]) -> str:
    """A markdown table of ``items`` (dataclasses), one column per attribute in ``keys``."""
    lines = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    for it in items:
        vals = []
        for k in keys:
            v = getattr(it, k)
            if isinstance(v, bool):
                vals.append("yes" if v else "**no**")
            elif isinstance(v, float):
                vals.append(_num(v))
            else:
                vals.append(str(v))
        lines.append("| " + " | ".join(vals) + " |")
    return "\n".join(lines)


def tpot_caveat(result: Validation) -> str:
    """The TPOT cells' paper / model range, and why they are not reproduced."""
    ratios = [
        c.paper / c.model
        for c in result.cells
        if c.metric.startswith("tpot") and c.paper is not None and c.model > 0
    ]
    if not ratios:
        return ""
    return (
        f"Caveat: the paper's TPOTs are {min(ratios):.1f}-{max(ratios):.0f}x the model's. "
        f"{TPOT_CAUSE}."
    )


def to_text(result: Validation) -> str:
    """Terminal output: the tables without the prose of docs/validation.md."""
    parts = [
        "Beluga / MoonCake LV-Eval validation (each cell: paper / model)",
        cells_table(result),
        tpot_caveat(result),
        "",
        _rows(result.extra, ["check", "paper", "model"], ["reproduction", "paper", "model"]),
        "",
        _rows(
            result.acceptance,
            ["ratio", "paper", "model", "target", "met"],
            ["ratio", "paper", "model", "target", "met"],
        ),
        "",
        _rows(
            result.geometry,
            ["check", "paper", "model", "exact"],
            ["KV geometry", "published", "model", "exact"],
        ),
    ]
    return "\n".join(parts)


def to_markdown(result: Validation) -> str:
    """``docs/validation.md``: the tables of ``to_text`` with how they were made and read."""
    from kvtier.policy.registries import CONNECTORS

    sc = result.scenario
    eff = sc.efficiency
    det = result.details
    acc = {a.ratio: a for a in result.acceptance}
    met = sum(a.met for a in result.acceptance)
    fh = {f"{c.system}.{c.run}.{c.metric}": c.model for c in result.cells}
    hits_m = det["mooncake.first"].first_run_hit_ratio_tokens or {}
    hits_b = det["beluga.first"].first_run_hit_ratio_tokens or {}
    extra = {e.check: e for e in result.extra}
    ex16 = next(e for k, e in extra.items() if k.startswith("MoonCake") and "16-token" in k)
    ex_ni = extra["Beluga full-hit QPS, not interleaved"]
    ex_i = extra["Beluga full-hit QPS, interleaved over 32 devices"]
    gain = ex_i.model / ex_ni.model - 1
    lm = CONNECTORS["lmcache-0.3-mooncake"].defaults
    ratio_16 = acc[next(k for k in acc if k.startswith("MoonCake full-hit mean TTFT, 16"))]
    lines = [
        "# Validation: the Beluga / MoonCake LV-Eval comparison",
        "",
        "<!-- Generated by `kvtier validate beluga --markdown docs/validation.md`. -->",
        "",
        "`kvtier validate beluga` replays the end-to-end comparison of the Beluga paper (Yang et",
        'al., "Beluga", arXiv 2511.20172, SIGMOD 2026; figures read in secondary write-ups, S;',
        "docs/sources.md) through the serving and tier model (docs/model.md) and prints",
        "the paper's value beside the model's for every cell (`--json` for scripts). One",
        "calibration serves every cell; the residuals are reported as they are. It exits 1,",
        "naming the target, when a reproduction target is missed.",
        "",
        "The other validations: serving step times (docs/validation-serving.md), "
        "aiconfigurator-core's",
        "measured engine runs under load (`kvtier validate silicon`, docs/validation-silicon.md),",
        "prefill/decode disaggregation (docs/validation-pd.md), and published, measured "
        "offload runs",
        "with and without the tier (`kvtier validate offload`, docs/validation-offload.md).",
        "",
        "## Scenario",
        "",
        f"`{sc.file}`, read by `optimizer/experiments/validation.py`:",
        "",
        f"- Hardware `{sc.hardware}` (2 x 8 H20, 16 instances of {sc.model}, tp 1); the",
        f"  HBM pool of every instance is the paper's {sc.hbm_kv_gb:g} GB of KV per H20.",
        "- Systems: the presets `lmcache-0.3-mooncake-beluga` (the RDMA pool through the",
        "  `lmcache-0.3-mooncake` connector: 256-token chunks, the batch waits for loads as",
        "  with LMCache 0.3.1), `beluga-cxl` (the rack-shared CXL pool through `beluga-cxl`:",
        "  GPU DMA of vLLM's 16-token blocks, interleaved over 32 devices; only the loading",
        "  request waits) and `vllm-0.8.5-hbm-beluga` (vLLM 0.8.5's prefix caching alone); pools",
        "  limited to 2 TB, write-through, round-robin routing.",
        '- Trace: `synthesize("rag", long=True, passes=2, ...)`, an LV-Eval-like workload:',
        f"  {sc.requests_per_pass} requests per pass, one long document per prompt, inputs",
        f"  {sc.min_input_tokens:,}-{sc.max_input_tokens:,} tokens (mean",
        f"  {sc.mean_input_tokens:,.0f}; LV-Eval's 16k level, all above 15K as in the paper),",
        "  16 output tokens (LV-Eval answers are short; assumption, see the load generator).",
        "  An infinite cache would serve",
        f"  {sc.first_pass_reuse_tokens:.1%} of the first pass's input tokens (the paper's",
        "  first run has about 30% hits); in the replay the first run takes",
        f"  {hits_m.get('hbm', 0):.1%} from HBM and {hits_m.get('rdma', 0):.1%} from the RDMA",
        f"  pool (MoonCake), {hits_b.get('hbm', 0):.1%} and {hits_b.get('cxl', 0):.1%} from CXL",
        "  (Beluga). The second pass replays the same requests: every full block is in the pool.",
        "",
        f"**Load generator.** A closed loop of {sc.concurrency} clients (`kvtier replay",
        "--concurrency`; `vllm bench serve --max-concurrency`): each sends its next request of",
        "the pass when its last one finishes; the full-hit pass starts after the first has",
        "finished. TTFT counts from each request's send; QPS of a pass = its requests / (its last",
        "finish - its start). The paper does not state its client count; its figures give",
        "TTFT x QPS of 15-21 in every cell, which by Little's law is the number of requests in",
        "flight when decode is short next to TTFT, so the scenario takes 16 (one per instance)",
        "and short answers. With 64 output tokens the model's decode is long next to its",
        "full-hit TTFT and fewer loads overlap: Beluga's full-hit TTFT was 0.30 s (paper 1.36)",
        "and its ratio to MoonCake's 0.026, so the output length is part of the scenario, not",
        "a free parameter: it is set once for every cell.",
        "",
        "## Calibration",
        "",
        "One set for every cell, with the reason beside each value (profiles, the connector",
        'registry `kvtier.policy.registries.CONNECTORS`, docs/sources.md "Connector',
        'parameters"):',
        "",
        f"- `mfu = {eff.mfu:g}` (sourced range 0.4-0.6, R): the first run is prefill-bound.",
        "  The step-time backend of the scenario is what `serving.step_time = auto` selects",
        "  (docs/model.md, Time).",
        f"- `lmcache-0.3-mooncake`, per-chunk RPC {float(lm['rpc_us']) / 1e3:g} ms: the top of",
        "  the sourced range, 0.15 ms per `get_buffer` of newer Mooncake code",
        "  ([Mooncake-store-get]) to 45 ms per master RPC ([LMCache-mooncake-perf], Mooncake PR",
        "  #3643); the 0.3-era path makes an `exists` RPC and a get per chunk. **This value sets",
        "  the 16- vs 256-token penalty**: with 2 ms (LMCache PR #934's lookups) the penalty is",
        "  1.32 (target >= 3), so that check is a consequence of the calibration, not an",
        "  independent reproduction.",
        f"- `lmcache-0.3-mooncake`, store stream {float(lm['stream_gbps']):g} GB/s: **calibrated**",
        "  on the paper's MoonCake full-hit rate, about 0.44 GB/s per GPU (4.9 GB per request in",
        "  about 11 s), less the other stages of a 67 MB chunk (the RPC, one staging copy at",
        "  10 GB/s, PCIe at 55 GB/s). **MoonCake's full-hit TTFT cell is therefore not a",
        "  reproduction.** With Mooncake PR #1516's figures instead (0.15 ms, 2.6 GB/s) the",
        "  model's MoonCake full hit is 2.90 s, the full-hit TTFT ratio 0.364 and the QPS ratio",
        "  2.57: the paper's software path is slower than that measurement, and the gap has no",
        "  measured figure (8 workers per host sharing one master, the 0.3-era Python path).",
        f"- Unchanged: `mbu = {eff.mbu:g}` (0.6-0.85, S), CXL per-fragment",
        f"  {sc.cxl_op_overhead_us:.2f} us (derived from the paper's sparse-load benchmark, S),",
        "  every bandwidth as sourced in the profile.",
        "",
        "## Results (each cell: paper / model)",
        "",
        cells_table(result),
        "",
        "## Other reproductions",
        "",
        _rows(result.extra, ["check", "paper", "model"], ["reproduction", "paper", "model"]),
        "",
        "## Acceptance",
        "",
        f"{met} of {len(result.acceptance)} met. The five ratios between systems, then the",
        "model's mean TTFT over the paper's in every cell that has one (target within 2x). A",
        "ratio is met only inside its target range; a missed one is printed with its cause.",
        "",
        _rows(
            result.acceptance,
            ["ratio", "paper", "model", "target", "met"],
            ["ratio", "paper", "model", "target", "met"],
        ),
        "",
        "## KV geometry (published figures, docs/sources.md; exact)",
        "",
        _rows(
            result.geometry,
            ["check", "paper", "model", "exact"],
            ["check", "published", "model", "exact"],
        ),
        "",
        "DeepSeek-V3: 61 x (512 + 64) x 2 bytes = 70,272 bytes = 68.625 KiB exactly; the",
        "published 68.6 is that value rounded.",
        "",
        "## What the model reproduces, and what it does not",
        "",
        "- **Full hit, Beluga against MoonCake (reproduced; MoonCake's cell calibrated).**",
        f"  Beluga / MoonCake mean TTFT {_num(acc['full-hit mean TTFT, Beluga / MoonCake'].model)}",
        f"  (paper 0.105), QPS ratio {_num(acc['full-hit QPS, Beluga / MoonCake'].model)} (paper",
        "  7.35). MoonCake's loads are bound by its connector's worker (a serial get per chunk),",
        "  not by its NICs: the replay's tier table shows the worker busy in rpc and stream while",
        "  the links idle, so more NICs would not help it, while Beluga's GPU DMA is bound by the",
        "  host's CXL adapters. Beluga's full-hit TTFT",
        f"  ({_num(fh['beluga.full-hit.ttft_mean_s'])} s, paper 1.36) is a prediction of sourced",
        "  values.",
        "- **First run (reproduced).** Beluga / MoonCake mean TTFT",
        f"  {_num(acc['first-run mean TTFT, Beluga / MoonCake'].model)} (paper 0.876); both are",
        "  bound by prefill compute. First-run QPS is",
        f"  {_num(fh['mooncake.first.qps'])} and {_num(fh['beluga.first.qps'])} (paper 1.02,",
        "  1.24): the closed loop spends the answers' decode inside each client's turn.",
        f"- **16- vs 256-token MoonCake ({_num(ratio_16.model)}, paper 5.91; a consequence of the",
        f"  calibrated RPC, above).** {_num(ex16.model)} s against the paper's",
        f"  {_num(ex16.paper)} s: 16 times the chunks, each a blocking get.",
        "- **Interleaving (not reproduced; the check is missed).** Without interleaving",
        "  each of the 32 devices (22.5 GB/s) is a queue of its own, and the pool fills one",
        '  device before the next in the order blocks are first written (docs/model.md, "Host',
        "  topology\"). The full-hit pass replays the first pass's requests in the same order,",
        "  so concurrent loads read blocks written together, on one or two of the",
        f"  {result.devices_filled} devices the trace fills: full-hit QPS {_num(ex_ni.model)}"
        " without interleaving against",
        f"  {_num(ex_i.model)} with it ({gain:+.0%}; paper 8.49 -> 11.32, +33%). The check asks",
        "  for the paper's gain within half to one and a half times it (a ratio in",
        "  [1.167, 1.5]); the model's is outside it, so `kvtier validate beluga` exits 1 naming",
        "  it and its cause. The paper states neither how its pool places blocks without",
        "  interleaving nor the order of its second run; a placement that spreads requests",
        "  over more devices, or a shuffled second run, would lose less.",
        f"- **TPOT and P99 (not reproduced).** {tpot_caveat(result)} The terminal output",
        "  prints this caveat under the table. The paper's TPOTs (0.15-1.97 s) and P99 TTFTs are",
        "  far above the model's: decode steps there stall behind loads and long prefills in a",
        "  way the model's chunked prefill and per-request waits only partly show (MoonCake's",
        '  batch waits for its loads, `load_wait = "batch"`). Beluga\'s full-hit P99 TTFT is',
        f"  {_num(fh['beluga.full-hit.ttft_p99_s'])} s against 5.02.",
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
        "`tests/test_validate.py` checks that every target but the interleaving gain is met,",
        "that each flag follows its range, and that a missed target makes the command exit 1",
        "naming it and its cause.",
        "",
        "The memory architectures' published ratios (the photonic pool's 405B throughput and",
        "latency, GH200 against x86 H100 multiturn TTFT) are `kvtier validate architectures`:",
        "docs/validation-architectures.md.",
        "",
    ]
    return "\n".join(lines)
