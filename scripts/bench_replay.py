"""Benchmark the serving simulator on the Mooncake conversation trace.

Measures, for Llama-3.1-8B on the ``h100-node`` profile (8 instances, B=16 by default):
* cold start: the first replay in a fresh process, once with an empty numba cache (compile)
  and once with the on-disk cache filled (load);
* warm replay: median of ``--runs`` replays in one process (mapping excluded, done once);
* the ratio to the pure-Python reference on the first N requests for each N in ``--samples``
  (the whole trace included: the reference runs it in well under a minute), in
  ``--reference-runs`` rounds that each time both engines back to back (median ratio);
* with lower tiers (``--tiers``): Llama-3.1-8B on ``beluga-testbed`` (16 instances on 2 hosts)
  with DRAM (500 GB per host), the shared CXL pool (2 TB) and SSD on, write-through and
  write-back: warm replay median, and the ratio to the reference on the first N requests for
  each N in ``--tier-samples``.

With ``--epp`` it instead times ``llmd_epp`` replays reading the endpoint picker's own prefix
indexes against the same reading the instances' caches, side by side in rounds; with
``--epp-metrics``, ``llmd_epp`` whose load scorers read the metrics as last scraped against
the same reading the exact state.

With ``--tbt`` it instead times replays that track token intervals (``track_tbt``, the TBT
tails) against the same replays without, side by side in rounds (the order alternating; the
replaying thread's CPU time), for the default deployment and a disaggregated one.

With ``--against DIR`` it instead times this tree's kernels against another version's, side
by side in one process: ``DIR`` holds that version's source as a package named ``kvtier_old``
(``git archive REV optimizer | tar -x -C DIR``, the folder renamed and its ``kvtier`` imports
rewritten to ``kvtier_old``). Each round times the median of ``--runs`` warm replays of one
version and then of the other (the order alternating between rounds), for the three routers
on the default deployment and for the lower-tier cases (write-through and write-back); it
prints the per-round ratios new / old (median and range) and whether both versions give
identical metrics. With
``--cpu-time`` it times the replaying thread's CPU time instead of wall time, which other jobs
on a shared machine disturb less (the kernel runs in that thread, GIL released).

Usage: ``PYTHONPATH=. python scripts/bench_replay.py [--runs 5] [--samples 1000,12031]
[--tiers] [--tier-samples 500,2000] [--against DIR --rounds 7 [--cpu-time]] [--tbt]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TRACE = ROOT / "traces" / "mooncake-conversation.parquet"

COLD = """
import time
t0 = time.perf_counter()
from kvtier.scenario import Scenario
scenario = Scenario.from_files({trace!r}, block_tokens={B})
scenario.blocked()
t1 = time.perf_counter()
scenario.replay()
t2 = time.perf_counter()
print(t1 - t0, t2 - t1)
"""


def cold_start(trace: Path, B: int, cache_dir: str | None) -> tuple[float, float]:
    """(load + map seconds, first replay seconds) in a fresh interpreter."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    if cache_dir is not None:
        env["NUMBA_CACHE_DIR"] = cache_dir
    out = subprocess.run(
        [sys.executable, "-c", COLD.format(trace=str(trace), B=B)],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    return float(out[-2]), float(out[-1])


def timed(fn, runs: int, clock=time.perf_counter) -> list[float]:  # noqa: ANN001
    times = []
    for _ in range(runs):
        t = clock()
        fn()
        times.append(clock() - t)
    return times


def bench_backends(args: argparse.Namespace) -> None:
    """Warm replays with the measured and the roofline step-time backends, side by side in one
    process (rounds alternate which goes first; the replaying thread's CPU time, which other
    jobs on a shared machine disturb less), and the measured tables' build time: cold
    (an empty cache directory: aiconfigurator-core's compile and queries) and from the cache."""
    sys.path.insert(0, str(ROOT))
    from kvtier.hardware import load_hardware, load_model
    from kvtier.scenario import Scenario
    from kvtier.sim import simulate
    from kvtier.sim.steptime import measured_key, measured_tables

    with tempfile.TemporaryDirectory() as cache:
        os.environ["KVTIER_CACHE_DIR"] = cache
        key = measured_key(
            "meta-llama/Meta-Llama-3.1-8B", "H100-SXM", "vllm", "current", 1, "bf16", "bf16"
        )
        t0 = time.perf_counter()
        built = measured_tables(key)
        cold = time.perf_counter() - t0
        t0 = time.perf_counter()
        measured_tables(key)
        warm = time.perf_counter() - t0
        print(
            f"table build, empty cache: {cold:.2f} s (queries and compile {built.build_s:.2f} s); "
            f"from the cache: {warm * 1e3:.1f} ms"
        )
        scenario = Scenario.from_files(str(args.trace), block_tokens=args.block_tokens)
        tr, policy = scenario.blocked(), scenario.policy
        hw, model = load_hardware("h100-node"), load_model("llama-3.1-8b")
        pols = {
            name: replace(policy, serving=replace(policy.serving, step_time=name))
            for name in ("measured", "roofline")
        }
        metrics = {name: simulate(tr, hw, model, p) for name, p in pols.items()}  # compile, warm
        ratios = []
        for r in range(args.rounds):
            order = ("measured", "roofline") if r % 2 == 0 else ("roofline", "measured")
            med = {}
            for name in order:
                p = pols[name]
                med[name] = statistics.median(
                    timed(lambda p=p: simulate(tr, hw, model, p), args.runs, time.thread_time)
                )
            ratios.append(med["measured"] / med["roofline"])
            per_iter = (
                ratios[-1] * metrics["roofline"].n_iterations / metrics["measured"].n_iterations
            )
            print(
                f"round {r + 1}: measured {med['measured']:.3f} s, roofline "
                f"{med['roofline']:.3f} s, ratio {ratios[-1]:.3f} (per iteration {per_iter:.3f})"
            )
        for name, m in metrics.items():
            print(
                f"{name:9s}: {m.n_iterations:,} iterations, TTFT mean {m.ttft_mean_s:.3f} s, "
                f"p99 {m.ttft_p99_s:.2f} s, TPOT mean {m.tpot_mean_s * 1e3:.2f} ms"
            )
        print(
            f"measured / roofline warm replay: median {statistics.median(ratios):.3f} "
            f"(range {min(ratios):.3f}-{max(ratios):.3f}, {len(ratios)} rounds)"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", type=Path, default=TRACE)
    ap.add_argument("--block-tokens", type=int, default=16)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--samples", default="1000,12031")
    ap.add_argument("--reference-runs", type=int, default=3)
    ap.add_argument("--tiers", action="store_true", help="Only the lower-tier benchmark.")
    ap.add_argument("--tier-samples", default="500,2000")
    ap.add_argument("--against", type=Path, default=None, help="Time against DIR/kvtier_old.")
    ap.add_argument("--rounds", type=int, default=7, help="Rounds of --against.")
    ap.add_argument(
        "--backends",
        action="store_true",
        help="Only the step-time backends: measured vs roofline side by side, table build time.",
    )
    ap.add_argument(
        "--cpu-time",
        action="store_true",
        help="--against: time the replaying thread's CPU time (less disturbed by other jobs).",
    )
    ap.add_argument(
        "--tbt",
        action="store_true",
        help="Only replays tracking token intervals against the same without, side by side.",
    )
    ap.add_argument(
        "--epp",
        action="store_true",
        help="Only llmd_epp reading the EPP's prefix indexes against reading the caches.",
    )
    ap.add_argument(
        "--epp-metrics",
        action="store_true",
        help="Only llmd_epp reading the metrics as last scraped against the exact state.",
    )
    args = ap.parse_args()
    if args.epp_metrics:
        bench_epp_metrics(args)
        return
    if args.epp:
        bench_epp(args)
        return
    if args.tbt:
        bench_tbt(args)
        return
    if args.backends:
        bench_backends(args)
        return
    if args.against is not None:
        bench_against(args)
        return
    if args.tiers:
        bench_tiers(args)
        return

    sys.path.insert(0, str(ROOT))
    from kvtier.scenario import Scenario
    from kvtier.sim import simulate

    B = args.block_tokens
    with tempfile.TemporaryDirectory() as empty_cache:
        map_s, compile_s = cold_start(args.trace, B, empty_cache)
    _, cached_s = cold_start(args.trace, B, None)
    _, cached_s = cold_start(args.trace, B, None)  # the first run may have filled the cache

    scenario = Scenario.from_files(str(args.trace), block_tokens=B)
    tr, hw, model, policy = scenario.blocked(), scenario.hardware, scenario.model, scenario.policy
    print(
        f"trace {args.trace.name}: {tr.n_requests:,} requests, {tr.n_block_refs:,} block refs, "
        f"{tr.n_blocks:,} distinct blocks at B={B}"
    )
    print(f"cold start, empty numba cache (compile): {compile_s:.2f} s (load + map {map_s:.2f} s)")
    print(f"cold start, numba cache on disk:         {cached_s:.2f} s")
    for routing in ("round_robin", "least_loaded", "prefix_affinity"):
        pol = replace(policy, serving=replace(policy.serving, routing=routing))
        m = simulate(tr, hw, model, pol)
        times = timed(lambda pol=pol: simulate(tr, hw, model, pol), args.runs)
        print(
            f"warm replay {routing:15s}: median {statistics.median(times):.3f} s "
            f"(runs {', '.join(f'{t:.3f}' for t in times)}); {m.n_iterations:,} iterations, "
            f"TTFT p99 {m.ttft_p99_s:.2f} s, HBM hit {m.hit_ratio_tokens['hbm']:.1%}"
        )

    pol = replace(policy, serving=replace(policy.serving, routing="prefix_affinity"))
    for n in (int(x) for x in args.samples.split(",")):
        sample = tr.head(n)
        a = simulate(sample, hw, model, pol)
        b = simulate(sample, hw, model, pol, engine="reference")
        # Rounds side by side: each round times the numba engine (median of --runs replays)
        # and then one reference replay, so both see the same machine; the speed of a shared
        # VM drifts by a third within minutes, which a ratio of medians taken minutes apart
        # would carry.
        fast, slow, ratios = [], [], []
        for _ in range(args.reference_runs):
            f_round = statistics.median(
                timed(lambda sample=sample: simulate(sample, hw, model, pol), args.runs)
            )
            (s_round,) = timed(
                lambda sample=sample: simulate(sample, hw, model, pol, engine="reference"), 1
            )
            fast.append(f_round)
            slow.append(s_round)
            ratios.append(s_round / f_round)
        f, s = statistics.median(fast), statistics.median(slow)
        print(
            f"first {sample.n_requests:,} requests ({sample.n_block_refs:,} block refs, "
            f"{a.n_iterations:,} iterations), prefix_affinity: numba {f:.4f} s, reference "
            f"{s:.2f} s, ratio per round median {statistics.median(ratios):.0f}x "
            f"({', '.join(f'{r:.0f}x' for r in ratios)}); identical metrics: {a.same_as(b)}",
            flush=True,
        )


def bench_tiers(args: argparse.Namespace) -> None:
    """Mooncake at B=16 on 16 instances with DRAM + CXL + SSD (issue 5's benchmark)."""
    sys.path.insert(0, str(ROOT))
    from kvtier.policy.model import Policy, ServingPolicy, TierPolicy
    from kvtier.scenario import Scenario
    from kvtier.sim import simulate

    B = args.block_tokens
    scenario = Scenario.from_files(
        str(args.trace), hardware="beluga-testbed", model="Llama-3.1-8B", block_tokens=B
    )
    tr, hw, model = scenario.blocked(), scenario.hardware, scenario.model
    tiers = (
        TierPolicy(),
        TierPolicy(name="dram", capacity_gb=500.0),
        TierPolicy(name="cxl", capacity_gb=2000.0),
        TierPolicy(name="ssd"),
    )
    print(
        f"trace {args.trace.name}: {tr.n_requests:,} requests, {tr.n_blocks:,} distinct blocks "
        f"at B={B}; beluga-testbed, Llama-3.1-8B, 16 instances, DRAM + CXL + SSD"
    )
    for wp in ("write_through", "write_back"):
        pol = Policy(
            block_tokens=B,
            write_policy=wp,
            serving=ServingPolicy(instances=16, routing="prefix_affinity"),
            tiers=tiers,
        )
        m = simulate(tr, hw, model, pol)
        times = timed(lambda pol=pol: simulate(tr, hw, model, pol), args.runs)
        hits = ", ".join(f"{k} {v:.1%}" for k, v in m.hit_ratio_tokens.items())
        written = sum(m.tier_bytes_written.values()) / 1e12
        print(
            f"warm replay {wp:13s}: median {statistics.median(times):.3f} s "
            f"(runs {', '.join(f'{t:.3f}' for t in times)}); hits {hits}; "
            f"{written:.1f} TB written below",
            flush=True,
        )
        for n in (int(x) for x in args.tier_samples.split(",")):
            sample = tr.head(n)
            a = simulate(sample, hw, model, pol)
            fast = timed(lambda sample=sample, pol=pol: simulate(sample, hw, model, pol), args.runs)
            t = time.perf_counter()
            b = simulate(sample, hw, model, pol, engine="reference")
            slow = time.perf_counter() - t
            f = statistics.median(fast)
            print(
                f"  first {n:,} requests: numba {f:.4f} s, reference {slow:.2f} s, "
                f"ratio {slow / f:.0f}x; identical metrics: {a.same_as(b)}",
                flush=True,
            )


class Version:
    """One version's replay entry points, imported from its package (``kvtier``, ``kvtier_old``)."""

    def __init__(self, package: str) -> None:
        import importlib

        def mod(name: str):  # noqa: ANN202
            return importlib.import_module(f"{package}.{name}")

        self.name = package
        self.simulate = mod("sim").simulate
        self.read_trace = mod("trace.io").read_trace
        self.block_trace = mod("trace.blocks").block_trace
        self.load_hardware = mod("hardware").load_hardware
        self.load_model = mod("hardware").load_model
        self.policy = mod("policy.model")

    def case(self, trace: Path, B: int, hardware: str, policy: dict, head: int | None):  # noqa: ANN201
        """(replay function, metrics as a dict) of one case (the first ``head`` requests if
        given); the trace mapped once."""
        pm = self.policy
        serving = pm.ServingPolicy(**policy.get("serving", {}))
        tiers = tuple(pm.TierPolicy(**t) for t in policy.get("tiers", ()))
        kwargs = {k: v for k, v in policy.items() if k not in ("serving", "tiers")}
        pol = pm.Policy(
            block_tokens=B, serving=serving, **kwargs, **({"tiers": tiers} if tiers else {})
        )
        tr = self.block_trace(self.read_trace(str(trace)), B)
        if head is not None:
            tr = tr.head(head)
        hw, model = self.load_hardware(hardware), self.load_model("Llama-3.1-8B")

        def run():  # noqa: ANN202
            return self.simulate(tr, hw, model, pol)

        m = run().to_dict()
        m.pop("engine")
        return run, m


def llmd_epp_side_by_side(
    args: argparse.Namespace, label: str, variants: dict[str, dict[str, object]]
) -> None:
    """Two ``llmd_epp`` variants (each name's ``serving`` settings) timed side by side in
    one process, the order alternating from round to round; prints each one's median, the
    ratio of the first to the second per round, and each one's mean TTFT."""
    sys.path.insert(0, str(ROOT))
    from kvtier.scenario import Scenario
    from kvtier.sim import simulate

    B = args.block_tokens
    scenario = Scenario.from_files(str(args.trace), block_tokens=B)
    tr, hw, model, policy = scenario.blocked(), scenario.hardware, scenario.model, scenario.policy
    pols = {
        name: replace(policy, serving=replace(policy.serving, routing="llmd_epp", **settings))
        for name, settings in variants.items()
    }
    first, second = pols
    metrics = {name: simulate(tr, hw, model, p) for name, p in pols.items()}  # compile, warm
    times: dict[str, list[float]] = {name: [] for name in pols}
    ratios = []
    for r in range(args.rounds):
        for name in (first, second) if r % 2 == 0 else (second, first):
            p = pols[name]
            fn = lambda p=p: simulate(tr, hw, model, p)  # noqa: E731
            times[name].append(statistics.median(timed(fn, args.runs, time.thread_time)))
        ratios.append(times[first][-1] / times[second][-1])
    print(
        f"{args.trace.name}, B={B}, {scenario.hardware.name}, llmd_epp, {label}; {args.rounds} "
        f"rounds, each the median of {args.runs} warm replays (thread CPU time): {first} "
        f"{statistics.median(times[first]):.4f} s, {second} "
        f"{statistics.median(times[second]):.4f} s; ratio per round median "
        f"{statistics.median(ratios):.3f} (range {min(ratios):.3f}-{max(ratios):.3f}); mean "
        f"TTFT {metrics[first].ttft_mean_s:.3f} s and {metrics[second].ttft_mean_s:.3f} s"
    )


def bench_epp(args: argparse.Namespace) -> None:
    """``llmd_epp`` reading the endpoint picker's own prefix indexes against reading the
    instances' caches (``serving.epp_prefix_source``)."""
    llmd_epp_side_by_side(
        args,
        "prefix source",
        {"index": {"epp_prefix_source": "index"}, "cache": {"epp_prefix_source": "cache"}},
    )


def bench_epp_metrics(args: argparse.Namespace) -> None:
    """``llmd_epp`` whose load scorers read each server's metrics as the EPP last scraped
    them (``serving.epp_metrics_interval_s`` 0.05, the default) against the exact state (0)."""
    llmd_epp_side_by_side(
        args,
        "load metrics",
        {
            "scraped every 50 ms": {"epp_metrics_interval_s": 0.05},
            "exact state": {"epp_metrics_interval_s": 0.0},
        },
    )


def bench_tbt(args: argparse.Namespace) -> None:
    """Replays tracking token intervals against the same replays without, in one process."""
    sys.path.insert(0, str(ROOT))
    from kvtier.scenario import Scenario
    from kvtier.sim import simulate

    B = args.block_tokens
    scenario = Scenario.from_files(str(args.trace), block_tokens=B)
    tr, hw, model, policy = scenario.blocked(), scenario.hardware, scenario.model, scenario.policy
    cases = {
        "h100-node, 8 instances, prefix_affinity": {"routing": "prefix_affinity"},
        "h100-node, 8 instances, prefix_affinity, vllm_v0": {
            "routing": "prefix_affinity",
            "scheduler": "vllm_v0",
        },
        "h100-node, 4 prefill + 4 decode, kv_aware": {
            "routing": "kv_aware",
            "prefill_instances": 4,
        },
    }
    print(
        f"{args.trace.name}, B={B}, Llama-3.1-8B; {args.rounds} rounds, each the median of "
        f"{args.runs} warm replays (thread CPU time); ratio = tracked / untracked"
    )
    for label, serving in cases.items():
        pol = replace(policy, serving=replace(policy.serving, **serving))
        plain = simulate(tr, hw, model, pol)
        tracked = simulate(tr, hw, model, pol, track_tbt=True)
        t_on, t_off, ratios = [], [], []
        for r in range(args.rounds):
            order = [(False, t_off), (True, t_on)]
            if r % 2:
                order.reverse()
            for on, times in order:
                fn = lambda on=on, pol=pol: simulate(tr, hw, model, pol, track_tbt=on)  # noqa: E731
                times.append(statistics.median(timed(fn, args.runs, time.thread_time)))
            ratios.append(t_on[-1] / t_off[-1])
        same = replace(tracked, tbt_p50_s=None, tbt_p99_s=None).same_as(plain)
        print(
            f"{label}: tracked {statistics.median(t_on):.4f} s, untracked "
            f"{statistics.median(t_off):.4f} s; ratio per round median "
            f"{statistics.median(ratios):.3f} (range {min(ratios):.3f}-{max(ratios):.3f}); "
            f"TBT p50 / p99 {tracked.tbt_p50_s * 1e3:.1f} / {tracked.tbt_p99_s * 1e3:.1f} ms, "
            f"TPOT p99 {tracked.tpot_p99_s * 1e3:.1f} ms; other metrics identical: {same}",
            flush=True,
        )


def bench_against(args: argparse.Namespace) -> None:
    """This tree's kernels against ``args.against``'s, alternated in one process."""
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(args.against))
    new, old = Version("kvtier"), Version("kvtier_old")
    B = args.block_tokens
    tiers = [
        {"name": "hbm"},
        {"name": "dram", "capacity_gb": 500.0},
        {"name": "cxl", "capacity_gb": 2000.0},
        {"name": "ssd"},
    ]
    cases = [
        (f"h100-node, 8 instances, {r}", "h100-node", {"serving": {"routing": r}}, None)
        for r in ("round_robin", "least_loaded", "prefix_affinity")
    ]
    cases.append(
        (
            "h100-node, 8 instances, prefix_affinity, first 1,000 requests",
            "h100-node",
            {"serving": {"routing": "prefix_affinity"}},
            1000,
        )
    )
    cases.append(
        (
            "beluga-testbed, 16 instances, DRAM + CXL + SSD, write_through",
            "beluga-testbed",
            {
                "write_policy": "write_through",
                "serving": {"instances": 16, "routing": "prefix_affinity"},
                "tiers": tiers,
            },
            None,
        )
    )
    # the same under write-back: every block a pool evicts cascades into the tier below
    cases.append(
        (
            "beluga-testbed, 16 instances, DRAM + CXL + SSD, write_back",
            "beluga-testbed",
            {
                "write_policy": "write_back",
                "serving": {"instances": 16, "routing": "prefix_affinity"},
                "tiers": tiers,
            },
            None,
        )
    )
    # vLLM's OffloadingConnector to host DRAM (from 96acaad it defers a request whose hits
    # another request is loading: the metrics differ from a version before)
    cases.append(
        (
            "h100-node, 8 instances, prefix_affinity, DRAM 500 GB (vllm-offloading)",
            "h100-node",
            {
                "write_policy": "write_through",
                "serving": {"routing": "prefix_affinity"},
                "tiers": [
                    {"name": "hbm"},
                    {"name": "dram", "capacity_gb": 500.0, "connector": "vllm-offloading"},
                ],
            },
            None,
        )
    )
    # disaggregated pools (the metrics differ from a version with another P/D model)
    for n_pf in (4, 6):
        cases.append(
            (
                f"h100-node, {n_pf} prefill + {8 - n_pf} decode, kv_aware",
                "h100-node",
                {"serving": {"routing": "kv_aware", "prefill_instances": n_pf}},
                None,
            )
        )
    cases.append(
        (
            "h100-node, 4 prefill + 4 decode, kv_aware, DRAM 800 GB (dynamo-disagg)",
            "h100-node",
            {
                "write_policy": "write_through",
                "serving": {"routing": "kv_aware", "prefill_instances": 4},
                "tiers": [{"name": "hbm"}, {"name": "dram", "capacity_gb": 800.0}],
            },
            None,
        )
    )
    clock = time.thread_time if args.cpu_time else time.perf_counter
    print(
        f"{args.trace.name}, B={B}, Llama-3.1-8B; {args.rounds} rounds, each the median of "
        f"{args.runs} warm replays per version ({'thread CPU' if args.cpu_time else 'wall'} "
        "time); ratio = new / old"
    )
    for label, hardware, policy, head in cases:
        run_new, m_new = new.case(args.trace, B, hardware, policy, head)
        run_old, m_old = old.case(args.trace, B, hardware, policy, head)
        runs = args.runs if head is None else 5 * args.runs  # a sample's replay is short
        t_new, t_old, ratios = [], [], []
        for r in range(args.rounds):
            order = [(run_new, t_new), (run_old, t_old)]
            if r % 2:
                order.reverse()
            for fn, times in order:
                times.append(statistics.median(timed(fn, runs, clock)))
            ratios.append(t_new[-1] / t_old[-1])
        print(
            f"{label}: new {statistics.median(t_new):.4f} s, old {statistics.median(t_old):.4f} s; "
            f"ratio per round median {statistics.median(ratios):.3f} "
            f"(range {min(ratios):.3f}-{max(ratios):.3f}); "
            f"{m_new['n_iterations']:,} iterations; identical metrics: "
            f"{ {k: m_new[k] for k in m_old} == m_old }",  # (metrics the old version has)
            flush=True,
        )


if __name__ == "__main__":
    main()
