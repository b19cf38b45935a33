"""``kvtier replay``: defaults, JSON output, options, one-line errors with exit code 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from kvtier.cli import main
from kvtier.trace.format import Trace
from kvtier.trace.io import read_trace, write_trace

ROOT = Path(__file__).resolve().parent.parent
MOONCAKE = ROOT / "traces" / "mooncake-conversation.parquet"


@pytest.fixture(scope="module")
def small_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The first 150 Mooncake requests, as a trace file."""
    full = read_trace(MOONCAKE)
    n = 150
    off, hashes = full.hash_arrays()
    small = Trace.from_arrays(
        arrival_s=full.arrival_s[:n],
        input_tokens=full.input_tokens[:n],
        output_tokens=full.output_tokens[:n],
        hash_offsets=off[: n + 1],
        hashes=hashes[: off[n]],
        block_tokens=full.block_tokens,
        source="mooncake head",
    )
    path = tmp_path_factory.mktemp("t") / "small.parquet"
    write_trace(small, path)
    return path


def run(*args: str):
    return CliRunner().invoke(main, list(args))


def test_replay_json_same_for_both_engines(small_trace: Path) -> None:
    a = run("replay", "--trace", str(small_trace), "--json")
    b = run("replay", "--trace", str(small_trace), "--json", "--engine", "reference")
    assert a.exit_code == 0 and b.exit_code == 0, a.output + b.output
    ma, mb = json.loads(a.output), json.loads(b.output)
    assert ma["n_served"] == 150 and ma["instances"] == 8
    ma.pop("engine"), mb.pop("engine")
    assert ma == mb


def test_replay_table_and_options(small_trace: Path, tmp_path: Path) -> None:
    res = run("replay", "--trace", str(small_trace))
    assert res.exit_code == 0 and "TTFT" in res.output
    policy = tmp_path / "p.toml"
    policy.write_text('[serving]\ninstances = 2\nrouting = "prefix_affinity"\n')
    base = json.loads(
        run("replay", "--trace", str(small_trace), "--json", "--policy", str(policy)).output
    )
    fast = json.loads(
        run(
            "replay",
            "--trace",
            str(small_trace),
            "--json",
            "--policy",
            str(policy),
            "--rate-scale",
            "4",
        ).output
    )
    assert base["instances"] == 2
    # four times the arrival rate on the same two GPUs: requests wait longer
    assert fast["ttft_mean_s"] > base["ttft_mean_s"]
    b64 = json.loads(run("replay", "--trace", str(small_trace), "--json", "-B", "64").output)
    assert b64["n_served"] == 150


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--hardware", "no-such-box"], "unknown hardware profile"),
        (["--model", "no-such-model"], "unknown models profile"),
        (["--block-tokens", "24"], "block size 24"),
        (["--rate-scale", "0"], "--rate-scale"),
    ],
)
def test_replay_bad_options_exit_2(small_trace: Path, args: list[str], needle: str) -> None:
    res = run("replay", "--trace", str(small_trace), *args)
    assert res.exit_code == 2
    assert needle in res.output and res.output.count("\n") == 1


def test_replay_bad_policy_names_file_and_key(small_trace: Path, tmp_path: Path) -> None:
    policy = tmp_path / "bad.toml"
    policy.write_text("[serving]\nrouting = 'nearest'\n")
    res = run("replay", "--trace", str(small_trace), "--policy", str(policy))
    assert res.exit_code == 2
    assert f"{policy}: key 'serving.routing'" in res.output and res.output.count("\n") == 1
    too_many = tmp_path / "many.toml"
    too_many.write_text("[serving]\ninstances = 9\n")
    res = run("replay", "--trace", str(small_trace), "--policy", str(too_many))
    assert res.exit_code == 2 and "only 8" in res.output
