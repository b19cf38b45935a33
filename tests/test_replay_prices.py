"""``replay --prices`` and ``compare --prices``: a policy found at a user's prices replays at
them, by the flag or by the prices file its provenance records, and says plainly when that file
is gone."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvtier.policy.file import read_policy_file
from kvtier.search.run import optimize
from kvtier.trace.io import write_trace
from kvtier.trace.synth import synthesize
from tests.helpers import invoke

PRICES = 'basis = "cloud"\ngpu_per_hour = 9.5\nhost_per_hour = 1.25\n'


@pytest.fixture(scope="module")
def found(tmp_path_factory) -> tuple[Path, Path, Path, float]:
    """(trace, prices file, policy file, its stored cost per 1M tokens) of a short search."""
    tmp = tmp_path_factory.mktemp("prices")
    trace = tmp / "chat.parquet"
    write_trace(synthesize("chat", requests=200, rate=6.0, seed=3), trace)
    prices = tmp / "my-prices.toml"
    prices.write_text(PRICES)
    out = tmp / "found.toml"
    optimize(
        str(trace),
        n_trials=2,
        compare_presets=False,
        warm_start=False,
        slo_text="ttft_p99=30,tpot_p99=1",
        storage=f"sqlite:///{tmp / 's.db'}",
        out=str(out),
        runs_dir=tmp / "runs",
        prices=str(prices),
        pins={"serving.prefill_instances": 0, "serving.instances": 4},  # no pruned split
    )
    stored = read_policy_file(out)
    assert stored.provenance["prices"] == str(prices)
    return trace, prices, out, float(stored.metrics["cost_per_mtok"])


def replay_cost(*args: str) -> tuple[float, str]:
    res = invoke("replay", *args, "--json")
    assert res.code == 0, res.stderr
    return json.loads(res.stdout)["cost_per_mtok"], res.stderr


def test_replay_uses_the_recorded_prices_and_matches_the_stored_cost(found) -> None:
    trace, prices, policy, stored = found
    cost, err = replay_cost("--trace", str(trace), "--policy", str(policy))
    assert cost == pytest.approx(stored, rel=1e-12) and err == ""
    flagged, _ = replay_cost(
        "--trace", str(trace), "--policy", str(policy), "--prices", str(prices)
    )
    assert flagged == cost
    # The profile's own prices (an empty prices file changes nothing) give another cost.
    empty = prices.parent / "empty.toml"
    empty.write_text("")
    profile, _ = replay_cost("--trace", str(trace), "--policy", str(policy), "--prices", str(empty))
    assert profile < cost  # 9.5 $/GPU-hour and a host charge are above the profile's prices


def test_a_recorded_prices_file_that_is_gone_is_said_plainly(found, tmp_path) -> None:
    trace, prices, policy, stored = found
    moved = tmp_path / "moved.toml"
    moved.write_text(policy.read_text().replace(str(prices), str(tmp_path / "gone.toml")))
    cost, err = replay_cost("--trace", str(trace), "--policy", str(moved))
    assert "gone.toml, which does not exist any more" in err and "--prices FILE" in err
    assert cost < stored  # replayed at the profile's prices
    again, _ = replay_cost("--trace", str(trace), "--policy", str(moved), "--prices", str(prices))
    assert again == pytest.approx(stored, rel=1e-12)


def test_compare_prices_every_row(found) -> None:
    trace, prices, policy, stored = found
    res = invoke("compare", "--trace", str(trace), "--policy", str(policy), "--json")
    assert res.code == 0, res.stderr
    assert f"pass --prices {prices} to compare at them" in res.stderr
    res = invoke(
        "compare", "--trace", str(trace), "--policy", str(policy), "--prices", str(prices), "--json"
    )
    assert res.code == 0 and res.stderr == "", res.stderr
    rows = json.loads(res.stdout)["policies"]
    assert rows[0]["metrics"]["cost_per_mtok"] == pytest.approx(stored, rel=1e-12)


def test_a_bad_prices_file_is_one_line_exit_2(found, tmp_path) -> None:
    trace, _, policy, _ = found
    bad = tmp_path / "bad.toml"
    bad.write_text("gpu_price = 1\n")
    for command in ("replay", "compare"):
        res = invoke(command, "--trace", str(trace), "--policy", str(policy), "--prices", str(bad))
        assert res.code == 2 and "unknown key(s) ['gpu_price']" in res.stderr
        assert len(res.stderr.strip().splitlines()) == 1 and "Traceback" not in res.stderr
