"""The scenario layer: one way to replay a policy on a trace, for every command.

The two-tenant case is the reason it exists: a search that blocked the trace by block size
alone evaluated ``share_across_tenants = true`` on a tenant-salted trace, so the policy file it
wrote promised metrics that ``kvtier replay`` of the same file did not give.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from kvtier.trace.format import Trace
from kvtier.trace.io import write_trace
from kvtier.trace.synth import synthesize
from tests.helpers import invoke


def two_tenant_trace() -> Trace:
    """300 chat requests whose sessions belong to one of two tenants (alternately)."""
    base = synthesize("chat", requests=300, rate=4.0, seed=11)
    sessions = base.column_numpy("session_id", np.int64)
    tenant = np.where(sessions % 2 == 0, "acme", "globex").astype(object)
    table = base.table.append_column("tenant", pa.array(tenant, type=pa.string()))
    return Trace.from_table(table, block_tokens=base.block_tokens, source=base.source)


@pytest.fixture(scope="module")
def tenant_trace_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tenants") / "two-tenants.parquet"
    write_trace(two_tenant_trace(), path)
    return path


def test_the_trace_has_prefixes_shared_across_tenants() -> None:
    """Guard for the tests below: sharing across tenants changes the blocks at all."""
    from kvtier.trace.blocks import block_trace

    trace = two_tenant_trace()
    salted = block_trace(trace, 16)
    shared = block_trace(trace, 16, share_across_tenants=True)
    assert shared.n_blocks < salted.n_blocks


def test_scenario_blocks_the_trace_by_block_size_and_tenant_sharing() -> None:
    from kvtier.hardware import load_hardware, load_model
    from kvtier.policy.model import Policy
    from kvtier.scenario import Scenario
    from kvtier.trace.blocks import block_trace

    trace = two_tenant_trace()
    scn = Scenario(trace, load_hardware("h100-node"), load_model("Llama-3.1-8B"), Policy())
    for b in (16, 32):
        for share in (False, True):
            policy = Policy(block_tokens=b, share_across_tenants=share)
            got = scn.blocked(policy)
            want = block_trace(trace, b, share_across_tenants=share)
            assert got.block_tokens == b
            assert got.n_blocks == want.n_blocks
            np.testing.assert_array_equal(got.block_ids, want.block_ids)
            assert scn.blocked(policy) is got  # mapped once, then shared
    salted = scn.blocked(Policy(share_across_tenants=False))
    shared = scn.blocked(Policy(share_across_tenants=True))
    assert shared.n_blocks < salted.n_blocks
    tenant_shared = scn.replay(Policy(share_across_tenants=True)).metrics
    tenant_salted = scn.replay(Policy(share_across_tenants=False)).metrics
    assert tenant_shared.hit_ratio_tokens["hbm"] > tenant_salted.hit_ratio_tokens["hbm"]


def test_the_search_evaluates_tenant_sharing_as_replay_does(tenant_trace_path: Path) -> None:
    from kvtier.hardware import load_hardware, load_model
    from kvtier.policy.model import SLO, Policy
    from kvtier.scenario import Scenario
    from kvtier.search.objective import Evaluator
    from kvtier.trace.io import read_trace

    slo = SLO(ttft_p99_s=60.0)
    scn = Scenario(
        read_trace(tenant_trace_path),
        load_hardware("h100-node"),
        load_model("Llama-3.1-8B"),
        Policy(slo=slo),
        slo=slo,
    )
    evaluator = Evaluator(scn)
    for share in (False, True):
        ev = evaluator.evaluate({"share_across_tenants": share})
        alone = scn.replay(ev.policy).metrics
        assert ev.policy.share_across_tenants is share
        assert ev.metrics.same_as(alone)


def test_optimize_with_tenant_sharing_writes_metrics_that_replay_reproduces(
    tenant_trace_path: Path, tmp_path: Path
) -> None:
    from kvtier.policy.file import read_policy_file

    out = tmp_path / "P.toml"
    r = invoke(
        "optimize",
        "--trace",
        str(tenant_trace_path),
        "--pin",
        "share_across_tenants=true",
        "--trials",
        "3",
        "--slo",
        "ttft_p99=60",
        "--no-presets",
        "--study",
        "tenants",
        "--storage",
        f"sqlite:///{tmp_path / 'tenants.db'}",
        "--out",
        str(out),
    )
    assert r.code == 0, r.stderr
    stored = read_policy_file(out)
    assert stored.policy.share_across_tenants is True
    replayed = invoke("replay", "--policy", str(out), "--trace", str(tenant_trace_path), "--json")
    assert replayed.code == 0, replayed.stderr
    metrics = json.loads(replayed.stdout)
    assert metrics["hit_ratio_tokens"] == stored.metrics["hit_ratio_tokens"]
    for key, value in stored.metrics.items():
        if key != "engine":
            assert metrics[key] == value, key


SAMPLE = str(Path(__file__).resolve().parents[1] / "traces" / "sample-chat.parquet")


def test_replay_set_equals_a_policy_file_with_that_value(tmp_path: Path) -> None:
    policy = tmp_path / "b32.toml"
    policy.write_text("block_tokens = 32\n")
    by_file = invoke("replay", "--trace", SAMPLE, "--policy", str(policy), "--json")
    by_set = invoke("replay", "--trace", SAMPLE, "--set", "block_tokens=32", "--json")
    default = invoke("replay", "--trace", SAMPLE, "--json")
    assert by_file.code == by_set.code == default.code == 0, by_set.stderr
    assert json.loads(by_set.stdout) == json.loads(by_file.stdout)
    assert json.loads(by_set.stdout) != json.loads(default.stdout)  # the override took effect


def test_set_over_a_policy_file_and_a_preset(tmp_path: Path) -> None:
    policy = tmp_path / "p.toml"
    policy.write_text("block_tokens = 32\n[serving]\ninstances = 2\n")
    want = tmp_path / "want.toml"
    want.write_text("block_tokens = 64\n[serving]\ninstances = 2\n")
    got = invoke(
        "replay", "--trace", SAMPLE, "--policy", str(policy), "--set", "block_tokens=64", "--json"
    )
    expected = invoke("replay", "--trace", SAMPLE, "--policy", str(want), "--json")
    assert got.code == expected.code == 0, got.stderr
    assert json.loads(got.stdout) == json.loads(expected.stdout)
    assert json.loads(got.stdout)["instances"] == 2


def test_replay_set_unknown_key_is_one_line_naming_it_and_the_valid_keys() -> None:
    from tests.helpers import assert_one_line_error

    r = invoke("replay", "--trace", SAMPLE, "--set", "blocktokens=64")
    assert_one_line_error(r, "--set", "blocktokens", "block_tokens", "serving.instances")
    bad = invoke("replay", "--trace", SAMPLE, "--set", "serving.instances=x")
    assert_one_line_error(bad, "--set", "serving.instances")
    r = invoke("compare", "--trace", SAMPLE, "--preset", "vllm-hbm", "--set", "foo=3")
    assert_one_line_error(r, "--set", "foo", "block_tokens")


def test_compare_set_applies_to_every_policy_compared() -> None:
    presets = ("vllm-hbm", "lmcache-cpu-disk")
    args = [a for p in presets for a in ("--preset", p)]
    r = invoke("compare", "--trace", SAMPLE, *args, "--set", "block_tokens=64", "--json")
    assert r.code == 0, r.stderr
    rows = json.loads(r.stdout)["policies"]
    assert [row["policy"] for row in rows] == list(presets)
    for row in rows:
        assert row["block_tokens"] == 64
        alone = invoke(
            "replay",
            "--trace",
            SAMPLE,
            "--preset",
            row["policy"],
            "--set",
            "block_tokens=64",
            "--json",
        )
        assert alone.code == 0, alone.stderr
        replayed = json.loads(alone.stdout)
        replayed.pop("tiers", None)  # replay adds its per-tier table beside the metrics
        assert row["metrics"] == replayed


class FakeStudy:
    """The two parts of an Optuna study a setup is stored in and read from."""

    study_name = "s"

    def __init__(self) -> None:
        self.user_attrs: dict[str, object] = {}

    def set_user_attr(self, key: str, value: object) -> None:
        self.user_attrs[key] = value


def test_study_setup_round_trips_through_study_attributes() -> None:
    from kvtier.errors import InputError
    from kvtier.policy.model import SLO
    from kvtier.search.setup import StudySetup

    setup = StudySetup(
        trace="t.parquet",
        trace_sha256="ab" * 32,
        hardware="h100-node",
        model="Llama-3.1-8B",
        slo=SLO(ttft_p99_s=2.0, tpot_p99_s=0.1),
        load="capacity",
        rate_scale=1.5,
        space="default",
    )
    study = FakeStudy()
    setup.record(study)
    assert study.user_attrs["trace_sha256"] == "ab" * 32
    assert study.user_attrs["setup"] == {
        "trace": "t.parquet",
        "hardware": "h100-node",
        "model": "Llama-3.1-8B",
        "slo": {"ttft_p99_s": 2.0, "tpot_p99_s": 0.1},
        "load": "capacity",
        "rate_scale": 1.5,
        "space": "default",
    }
    assert StudySetup.from_study(study) == setup
    with pytest.raises(InputError, match="records no setup"):
        StudySetup.from_study(FakeStudy())


def test_one_trace_check_for_resuming_and_for_a_moved_trace() -> None:
    from kvtier.errors import InputError
    from kvtier.search.setup import check_study_trace

    study = FakeStudy()
    check_study_trace(study, "cd" * 32, mismatch="never raised", option="--study")  # none yet
    study.set_user_attr("trace_sha256", "ab" * 32)
    check_study_trace(study, "ab" * 32, mismatch="never raised", option="--study")
    with pytest.raises(InputError) as err:
        check_study_trace(study, "cd" * 32, mismatch="other trace (sha256 {sha})", option="--trace")
    assert str(err.value) == f"option --trace: other trace (sha256 {'ab' * 6}...)"


def test_rate_scale_is_checked_in_one_place() -> None:
    from kvtier.errors import InputError
    from kvtier.hardware import load_hardware, load_model
    from kvtier.scenario import Scenario

    trace = synthesize("chat", requests=20, seed=1)
    hw, mdl = load_hardware("h100-node"), load_model("Llama-3.1-8B")
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(InputError, match="--rate-scale"):
            Scenario(trace, hw, mdl, rate_scale=bad)
    scn = Scenario(trace, hw, mdl)
    once = scn.replay()
    twice = scn.replay(rate_scale=2.0)
    assert once.rate_scale == 1.0 and twice.rate_scale == 2.0
    np.testing.assert_allclose(twice.trace.arrival_s, once.trace.arrival_s / 2.0)
    with pytest.raises(InputError, match="--rate-scale"):
        scn.replay(rate_scale=0.0)
