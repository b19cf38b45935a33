"""The energy model (kvtier.sim.energy): closed forms with known powers and busy times, the
electricity in the cost, the tiers' held and moved energy, and both engines alike."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from kvtier.hardware import load_hardware, load_model
from kvtier.hardware.types import Hardware, Power
from kvtier.policy import Policy
from kvtier.sim import build_config, replay_metrics, simulate, simulate_raw
from kvtier.sim.energy import replay_energy
from kvtier.sim.result import RawResult
from kvtier.trace.blocked import BlockedTrace

B = 16


def known_power(hw: Hardware, *, kwh: float = 0.0) -> Hardware:
    """``hw`` with round powers: 100 W idle, 500 W TDP per GPU, 1 kW per host, PUE 1.5."""
    gpu = replace(hw.gpu, tdp_w=500.0, idle_w=100.0)
    return replace(hw, gpu=gpu, power=Power(host_w=1000.0, pue=1.5, electricity_per_kwh=kwh))


def roofline() -> Policy:
    p = Policy()
    return replace(p, serving=replace(p.serving, step_time="roofline"))


@pytest.fixture(scope="module")
def hw() -> Hardware:
    return known_power(load_hardware("h100-node"), kwh=0.10)


@pytest.fixture(scope="module")
def model():
    return load_model("Llama-3.1-8B")


def test_energy_of_known_busy_times_is_exact(hw, model) -> None:
    """8 GPUs (tp = 1) on one host for 10 s, two of them busy 1 s and 2 s."""
    cfg = build_config(hw, model, roofline())
    assert cfg.n_instances == 8 and cfg.hosts == 1
    trace = BlockedTrace.from_lists([0.0], [100], [20], [[]], B)
    busy = np.zeros(8)
    busy[:2] = (1.0, 2.0)
    raw = RawResult(
        first_token_s=np.array([1.0]),
        finish_s=np.array([10.0]),
        hit_blocks=np.zeros(1, dtype=np.int64),
        instance=np.zeros(1, dtype=np.int64),
        busy_s=busy,
        n_iterations=20,
        early_stopped=False,
        end_s=10.0,
    )
    e = replay_energy(raw, cfg, hw, trace.arrival_s, 120)
    it = 8 * 100 * 10 + (1 + 2) * 400 + 1000 * 10  # 8,000 idle + 1,200 busy + 10,000 host
    assert e.parts_j["gpu_idle"] == 8000.0 and e.parts_j["gpu_busy"] == 1200.0
    assert e.parts_j["host"] == 10000.0 and e.parts_j["cooling"] == pytest.approx(0.5 * it)
    assert e.energy_j == pytest.approx(1.5 * it)  # 28,800 J
    assert e.joules_per_token == pytest.approx(28800 / 120)
    assert e.tokens_per_joule == pytest.approx(120 / 28800)
    assert e.power_w == pytest.approx(2880.0)
    assert e.electricity_per_hour == pytest.approx(2.88 * 0.10)
    # the metrics carry it, and the electricity is in the cost per hour
    m, _ = replay_metrics(trace, raw, cfg, hw, slo=None, engine="reference")
    assert m.energy_j == pytest.approx(28800.0) and m.tokens_per_joule == pytest.approx(1 / 240)
    assert m.cost_per_hour == pytest.approx(cfg.cost_per_hour + 0.288)
    assert m.electricity_per_hour == pytest.approx(0.288)
    free = replace(hw, power=replace(hw.power, electricity_per_kwh=0.0))
    m0, _ = replay_metrics(trace, raw, build_config(free, model, roofline()), free, slo=None,
                           engine="reference")  # fmt: skip
    assert m0.cost_per_hour == pytest.approx(cfg.cost_per_hour) and m0.energy_j == m.energy_j


@pytest.mark.parametrize("engine", ["reference", "numba"])
def test_one_request_replay_energy_is_its_prefill_time(hw, model, engine) -> None:
    """One request of one output token: one instance busy for its prefill, the rest idle."""
    trace = BlockedTrace.from_lists([0.0], [3000], [1], [list(range(3000 // B))], B)
    policy = roofline()
    cfg = build_config(hw, model, policy)
    raw = simulate_raw(trace, cfg, engine=engine)
    busy = float(raw.busy_s.sum())
    assert busy > 0 and np.count_nonzero(raw.busy_s) == 1
    m = simulate(trace, hw, model, policy, engine=engine)
    span = m.duration_s  # arrival to finish: prefill plus the front end's cost
    assert span > busy
    it = 8 * 100 * span + 400 * busy + 1000 * span
    assert m.energy_j == pytest.approx(1.5 * it, rel=1e-12)
    assert m.joules_per_token == pytest.approx(1.5 * it / 3001, rel=1e-12)
    assert m.power_w == pytest.approx(1.5 * it / span, rel=1e-12)


def test_tiers_held_and_moved_energy_and_engines_agree(model) -> None:
    """A DRAM and SSD tier: their held watts over the span and pJ per bit moved; both engines
    give the same energy."""
    from kvtier.policy.presets import load_preset
    from kvtier.trace.blocks import block_trace
    from kvtier.trace.synth import synthesize

    hw = load_hardware("h100-node")
    policy = load_preset("lmcache-cpu-disk")
    trace = block_trace(synthesize("rag", requests=120, rate=20.0, seed=3), policy.block_tokens)
    a = simulate(trace, hw, model, policy, engine="reference")
    b = simulate(trace, hw, model, policy, engine="numba")
    assert a.energy_j == b.energy_j and a.energy_parts_j == b.energy_parts_j
    assert a.tokens_per_joule == b.tokens_per_joule
    cfg = build_config(hw, model, policy)
    span = a.duration_s
    held = moved = 0.0
    for name in ("dram", "ssd"):
        t = hw.tiers[name]
        held += (t.w_per_gb * cfg.tiers.tier_gb[name] + t.host_w * cfg.hosts) * span
        bits = 8 * (a.tier_bytes_read[name] + a.tier_bytes_written[name])
        moved += bits * t.pj_per_bit * 1e-12
    assert moved > 0
    assert a.energy_parts_j["tier_held"] == pytest.approx(held, rel=1e-12)
    assert a.energy_parts_j["tier_moved"] == pytest.approx(moved, rel=1e-12)
    assert a.energy_j == pytest.approx(sum(a.energy_parts_j.values()))
    assert a.energy_parts_j["cooling"] == pytest.approx(
        0.2 * (a.energy_j - a.energy_parts_j["cooling"]), rel=1e-12
    )
    assert math.isfinite(a.tokens_per_joule) and a.tokens_per_joule > 0


ENERGY_SPACE = """
format = "kvtier-space/1"
description = "instances and block size"
[params.block_tokens]
choices = [16, 64]
[params."serving.instances"]
low = 1
high = 8
"""


def test_optimize_minimises_joules_per_token_under_the_slo(tmp_path) -> None:
    import optuna

    from kvtier.errors import InputError
    from kvtier.search.run import optimize
    from kvtier.search.study import summaries
    from kvtier.trace.io import write_trace
    from kvtier.trace.synth import synthesize

    trace = tmp_path / "chat.parquet"
    write_trace(synthesize("chat", requests=150, rate=8.0, seed=5), trace)
    space = tmp_path / "space.toml"
    space.write_text(ENERGY_SPACE)
    common = dict(
        space=str(space),
        slo_text="ttft_p99=1.0,tpot_p99=0.05",
        study_name="energy",
        runs_dir=tmp_path / "runs",
        out=str(tmp_path / "best.toml"),
        compare_presets=False,
        refine=False,
        seed=2,
    )
    result = optimize(str(trace), n_trials=6, objective="energy", **common)
    study = optuna.load_study(study_name="energy", storage=f"sqlite:///{tmp_path}/runs/energy.db")
    done = summaries(study)
    feasible = [s for s in done if s.feasible]
    assert feasible and result.best is not None
    least = min(feasible, key=lambda s: (s.metrics["joules_per_token"], s.number))
    assert result.best.number == least.number
    # each trial's objective value is its joules per token, not its cost
    for t in study.get_trials(states=(optuna.trial.TrialState.COMPLETE,)):
        if t.user_attrs.get("feasible") is not None and "metrics" in t.user_attrs:
            assert t.value == pytest.approx(t.user_attrs["metrics"]["joules_per_token"])
    assert study.user_attrs["setup"]["objective"] == "energy"
    assert study.metric_names == ["joules_per_token"]
    from kvtier.report.study import study_report

    assert study_report(study)["top"][0]["number"] == least.number  # ranked by energy too
    # the study's verdicts were judged by energy: a rerun minimising cost is refused
    with pytest.raises(InputError, match="objective"):
        optimize(str(trace), n_trials=6, objective="cost", **common)


def test_objective_option_refuses_an_unknown_choice(tmp_path) -> None:
    from tests.helpers import assert_one_line_error, invoke

    trace = tmp_path / "t.parquet"
    from kvtier.trace.io import write_trace
    from kvtier.trace.synth import synthesize

    write_trace(synthesize("chat", requests=10, rate=8.0, seed=5), trace)
    result = invoke("optimize", "--trace", str(trace), "--objective", "speed")
    assert_one_line_error(result, "--objective")


def test_power_keys_are_checked_in_profiles_and_prices(tmp_path) -> None:
    from kvtier.errors import InputError
    from kvtier.hardware.loader import load_gpu
    from kvtier.hardware.prices import apply_prices, load_prices, price_figures

    gpu = tmp_path / "g.toml"
    base = 'name = "G"\nhbm_gb = 80\nhbm_bw_gbps = 3000\nbf16_tflops = 900\npcie_gbps = 50\n'
    gpu.write_text(base + "price_per_hour = 1\ntdp_w = 300\nidle_w = 400\n")
    with pytest.raises(InputError, match="idle_w"):
        load_gpu(gpu)
    gpu.write_text(base + "price_per_hour = 1\n")
    assert (load_gpu(gpu).tdp_w, load_gpu(gpu).idle_w) == (700.0, 80.0)  # defaults
    prices = tmp_path / "p.toml"
    prices.write_text("electricity_per_kwh = 0.12\n")
    hw = apply_prices(load_hardware("h100-node"), load_prices(prices))
    assert hw.power.electricity_per_kwh == 0.12
    assert price_figures(hw)["electricity_per_kwh"] == 0.12
    assert "electricity_per_kwh" not in price_figures(load_hardware("h100-node"))
    prices.write_text("electricity_per_kwh = -1\n")
    with pytest.raises(InputError, match="electricity_per_kwh"):
        load_prices(prices)


def test_replay_and_compare_show_tokens_per_joule(tmp_path) -> None:
    import json

    from kvtier.trace.io import write_trace
    from kvtier.trace.synth import synthesize
    from tests.helpers import invoke

    trace = tmp_path / "t.parquet"
    write_trace(synthesize("chat", requests=40, rate=8.0, seed=1), trace)
    out = invoke("replay", "--trace", str(trace), "--json")
    assert out.code == 0, out.stderr
    data = json.loads(out.stdout)
    tokens = data["throughput_tps"] * data["duration_s"]
    assert data["tokens_per_joule"] == pytest.approx(tokens / data["energy_j"], rel=1e-9)
    assert data["power_w"] == pytest.approx(data["energy_j"] / data["duration_s"], rel=1e-9)
    table = invoke("replay", "--trace", str(trace))
    assert f"{data['tokens_per_joule']:.2f} tok/J" in table.stdout
    both = invoke("compare", "--trace", str(trace), "--preset", "vllm-hbm", "--preset",
                  "lmcache-cpu-disk")  # fmt: skip
    assert both.code == 0, both.stderr
    assert "tok/J" in both.stdout and "most tokens per joule:" in both.stdout


def test_pools_of_two_tensor_parallel_sizes_count_each_instance_gpus(hw, model) -> None:
    """A prefill instance of 4 GPUs and a decode instance of 1: idle power on 5 GPUs, busy
    power weighted by each instance's GPUs."""
    from kvtier.search.overlay import apply

    policy = apply(
        roofline(),
        {
            "serving.instances": 2,
            "serving.prefill_share": 0.5,
            "serving.prefill_tp": 4,
            "serving.decode_tp": 1,
        },
    )
    cfg = build_config(hw, model, policy)
    assert cfg.instance_gpus == (4, 1) and cfg.gpus == 5 and cfg.hosts == 1
    raw = RawResult(
        first_token_s=np.array([1.0]),
        finish_s=np.array([4.0]),
        hit_blocks=np.zeros(1, dtype=np.int64),
        instance=np.zeros(1, dtype=np.int64),
        busy_s=np.array([1.0, 3.0]),
        n_iterations=3,
        early_stopped=False,
        end_s=4.0,
    )
    e = replay_energy(raw, cfg, hw, np.array([0.0]), 10)
    assert e.parts_j["gpu_idle"] == 5 * 100 * 4.0
    assert e.parts_j["gpu_busy"] == (4 * 1.0 + 1 * 3.0) * 400


def test_a_hardware_profile_refuses_a_pue_below_one_and_unknown_power_keys(tmp_path) -> None:
    from kvtier.errors import InputError
    from kvtier.hardware.loader import resolve

    text = resolve("hardware", "h100-node").read_text()
    assert "pue = 1.2" in text
    bad = tmp_path / "bad.toml"
    bad.write_text(text.replace("pue = 1.2", "pue = 0.9"))
    with pytest.raises(InputError, match=r"power\.pue.*>= 1"):
        load_hardware(str(bad))
    bad.write_text(text.replace("pue = 1.2", "pue = 1.2\nwatts = 3"))
    with pytest.raises(InputError, match="watts"):
        load_hardware(str(bad))
    ok = tmp_path / "ok.toml"
    ok.write_text(text.replace("pue = 1.2", "pue = 1.4").replace("host_w = 1500", "host_w = 900"))
    power = load_hardware(str(ok)).power
    assert (power.pue, power.host_w, power.electricity_per_kwh) == (1.4, 900.0, 0.0)
