"""``validate offload``'s multi-turn runs (Mooncake's SSD-offload benchmark under SGLang's
``bench_multiturn.py``): the conversations' prompts, the round barrier the replay holds, and
the checks on the files that state them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kvtier.errors import InputError
from kvtier.experiments.offload_validation import (
    _REPLAYS,
    OFFLOAD_DIR,
    _replay_key,
    build_trace,
    load_catalogue,
    load_run,
    model_figures,
)

HOST = "mooncake-ssd-offload-hicache-host-qwen3-8b-a100"


def _small(tmp_path: Path, run: str = HOST, **conditions: object) -> Path:
    """``run``'s file with other conditions (a few conversations, short rounds)."""
    src = (OFFLOAD_DIR / f"{run}.toml").read_text()
    for key, value in conditions.items():
        lines = src.splitlines()
        i = next(k for k, ln in enumerate(lines) if ln.startswith(f"{key} = "))
        lines[i] = f"{key} = {value!r}" if not isinstance(value, str) else f'{key} = "{value}"'
        src = "\n".join(lines) + "\n"
    path = tmp_path / "small.toml"
    path.write_text(src)
    return path


def test_the_three_runs_share_the_client_and_the_gpu_only_side() -> None:
    runs = [r for r in load_catalogue() if r.name.startswith("mooncake-ssd-offload-")]
    assert len(runs) == 3 and all(r.role == "check" for r in runs)
    assert {r.conditions["workload"] for r in runs} == {"multiturn"}
    # one GPU-only deployment: the tiered-only runs replay it without counting it again
    assert len({str(r.deploy["baseline"]) for r in runs}) == 1
    assert sum(bool(r.measured["baseline"]) for r in runs) == 1
    connectors = {
        r.name: {k: v for k, v in r.deploy["tiered"]["set"].items() if k.endswith(".connector")}
        for r in runs
    }
    assert connectors[HOST] == {}
    # SGLang 0.5.10's storage prefetch (the release of the runs' date)
    assert set(connectors[HOST.replace("host", "mooncake-ssd")].values()) == {
        "sglang-0.5.10-hicache-mooncake"
    }


def test_each_round_extends_every_conversation_once() -> None:
    run = next(r for r in load_catalogue() if r.name == HOST)
    c = run.conditions
    trace = build_trace(run)
    clients, rounds = c["clients"], c["rounds"]
    assert len(trace.arrival_s) == clients * rounds
    lengths = [(r + 1) * c["request_tokens"] + r * c["output_tokens"] for r in range(rounds)]
    np.testing.assert_array_equal(trace.input_tokens, np.repeat(lengths, clients))
    # bench_multiturn's total: the figures' prompt tokens
    assert int(trace.input_tokens.sum()) == 3_687_120
    hashes = trace.table.column("block_hashes").to_pylist()
    by_round = [hashes[r * clients : (r + 1) * clients] for r in range(rounds)]
    firsts = {h[0] for h in by_round[0]}
    assert len(firsts) == clients  # no conversation shares a block with another
    orders = []
    for r in range(1, rounds):
        full = lengths[r - 1] // 16
        earlier = {h[0]: h for h in by_round[r - 1]}
        orders.append([h[0] for h in by_round[r]])
        for h in by_round[r]:
            # the conversation so far: the earlier prompt's full blocks, then new ones
            assert h[:full] == earlier[h[0]][:full]
        # a partial last block is this prompt's own
        tails = [h[-1] for h in by_round[r]]
        seen = {x for p in hashes[: r * clients] for x in p}
        assert len(set(tails)) == clients and not set(tails) & seen
    # the ready queue pops at random: the rounds do not all keep one order
    assert len({tuple(o) for o in orders}) > 1


def test_multiturn_goes_with_the_round_barrier_and_integers(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="round_barrier"):
        load_run(_small(tmp_path, load="concurrency"))
    with pytest.raises(InputError, match=r"conditions\.clients must be an integer"):
        load_run(_small(tmp_path, clients=2.5))
    with pytest.raises(InputError, match=r"conditions\.rounds must be an integer"):
        load_run(_small(tmp_path, rounds=0))


def test_the_replay_holds_each_round_until_the_last_finished(tmp_path: Path) -> None:
    from kvtier.experiments.offload_validation import _hardware, _policy
    from kvtier.hardware import load_model
    from kvtier.scenario import Scenario

    run = load_run(_small(tmp_path, clients=5, rounds=3, request_tokens=2048))
    trace = build_trace(run)
    model = load_model(run.conditions["model"])
    rep = Scenario(trace, _hardware(run), model, _policy(run, "tiered")).replay(
        concurrency=4, round_size=5
    )
    sent, finish = np.asarray(rep.raw.arrival_s), np.asarray(rep.raw.finish_s)
    for r in (1, 2):
        assert sent[5 * r : 5 * (r + 1)].min() >= finish[: 5 * r].max()
    # never more than 4 in flight
    for t in sent:
        assert int(((sent <= t) & (finish > t)).sum()) <= 4
    # the figures count the prompt tokens over the run's span
    figs = model_figures(run)
    _REPLAYS.pop(_replay_key(run, "baseline"), None)
    _REPLAYS.pop(_replay_key(run, "tiered"), None)
    span = float(np.nanmax(finish) - sent.min())
    assert figs["tiered"]["throughput"] == pytest.approx(trace.input_tokens.sum() / span)


def test_the_mooncake_ssd_deployment_replays_the_same_on_both_engines(tmp_path: Path) -> None:
    """A few conversations behind the round barrier on the + Mooncake + SSD side (storage
    prefetch at arrival from two tiers into the host pool): identical per-request times and
    loads from the reference engine and the numba one."""
    from kvtier.experiments.offload_validation import _hardware, _policy
    from kvtier.hardware import load_model
    from kvtier.policy.overrides import apply_overrides
    from kvtier.scenario import Scenario

    ssd = HOST.replace("host", "mooncake-ssd")
    run = load_run(_small(tmp_path, ssd, clients=4, rounds=3, request_tokens=2048))
    trace, hw = build_trace(run), _hardware(run)
    model = load_model(run.conditions["model"])
    # HBM, host and Mooncake pools each under a round's pages, so the later rounds read the
    # SSD too; the host pool twice HBM, as the run's, leaves SGLang 0.5.10's prefetches room;
    # the Mooncake pool sheds in batches at the run's watermark (95 %, 5 %) and is sized so
    # that what it keeps is still read (at 1.5 GB its batches leave a later round nothing)
    pools = (("hbm", 1.0), ("dram", 2.0), ("rdma", 1.8))
    small = {f"tiers.{t}.capacity_gb": gb for t, gb in pools}
    policy = apply_overrides(_policy(run, "tiered"), small, "--set")
    runs = {
        engine: Scenario(trace, hw, model, policy, engine=engine).replay(
            concurrency=4, round_size=4
        )
        for engine in ("numba", "reference")
    }
    fast, ref = runs["numba"].raw, runs["reference"].raw
    np.testing.assert_array_equal(fast.first_token_s, ref.first_token_s)
    np.testing.assert_array_equal(fast.finish_s, ref.finish_s)
    np.testing.assert_array_equal(fast.loaded_blocks, ref.loaded_blocks)
    read = runs["numba"].metrics.tier_bytes_read
    assert read["ssd"] > 0 and read["rdma"] > 0  # both storage tiers were read
