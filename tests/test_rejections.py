"""A replay that rejects requests says how many, why and what to change, in one line; serving
nothing is the deployment's answer, not bad input (exit 0). optimize counts such trials as
infeasible and says why the closest one missed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvtier.trace.io import write_trace
from tests.helpers import invoke, make_trace

# Llama-3.1-8B bf16: 128 KiB of KV per token, 2 MiB per 16-token block; 0.005 GB holds two
# blocks, and every request of the trace (64 prompt tokens) needs more
TINY = "tiers.hbm.capacity_gb=0.005"


@pytest.fixture(scope="module")
def small_trace(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("reject") / "t.parquet"
    write_trace(make_trace([list(range(64))] * 6, 16), path)
    return path


def warnings(stderr: str) -> list[str]:
    return [ln for ln in stderr.splitlines() if ln.startswith("warning:")]


def test_a_replay_that_serves_nothing_says_why_and_what_to_change(small_trace: Path) -> None:
    result = invoke("replay", "--trace", str(small_trace), "--set", TINY)
    assert result.code == 0, result.stderr
    assert "0 / 6" in result.stdout  # served / rejected, as before
    (line,) = warnings(result.stderr)
    for needle in (
        "no request was served",
        "6 of 6 requests rejected",
        "larger than an instance's HBM pool",
        "blocks of 16 tokens",
        "raise tiers.hbm.capacity_gb (now 0.005 GB",
    ):
        assert needle in line, (needle, line)


def test_the_json_replay_gives_the_cause_on_one_line(small_trace: Path) -> None:
    result = invoke("replay", "--trace", str(small_trace), "--set", TINY, "--json")
    assert result.code == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["n_rejected"] == 6 and data["ttft_p99_s"] is None
    (line,) = warnings(result.stderr)
    assert "6 of 6 requests rejected" in line and "are null" in line


def test_a_replay_that_admits_everything_has_no_rejection_line(small_trace: Path) -> None:
    result = invoke("replay", "--trace", str(small_trace))
    assert result.code == 0, result.stderr
    assert not any("rejected" in w for w in warnings(result.stderr))


def test_optimize_says_its_closest_trial_rejected_requests(
    small_trace: Path, tmp_path: Path
) -> None:
    result = invoke(
        "optimize", "--trace", str(small_trace), "--trials", "2", "--no-presets",
        "--storage", f"sqlite:///{tmp_path / 's.db'}", "--out", str(tmp_path / "p.toml"),
        "--pin", TINY, "--pin", "block_tokens=16",
    )  # fmt: skip
    assert result.code == 1, result.stderr  # optimize's "no trial met the SLO" exit
    assert "Traceback" not in result.stderr
    text = " ".join(result.stdout.split())
    assert "no trial met the SLO" in text
    assert "rejected 6 of 6 requests: larger than an instance's HBM pool" in text
    assert not (tmp_path / "p.toml").exists()  # no feasible trial: no policy file
