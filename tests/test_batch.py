"""``kvtier batch``: a study and a policy file per trace, checked up front, resumable."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvtier.policy.file import read_policy_file
from kvtier.trace.io import write_trace
from kvtier.trace.synth import synthesize
from tests.helpers import assert_one_line_error, invoke

SLO = "ttft_p99=2,tpot_p99=0.1"


@pytest.fixture()
def traces(tmp_path, monkeypatch) -> list[str]:
    monkeypatch.chdir(tmp_path)
    write_trace(synthesize("chat", requests=120, rate=6.0, seed=1), tmp_path / "chat.parquet")
    write_trace(synthesize("rag", requests=80, rate=3.0, seed=2), tmp_path / "rag.parquet")
    return ["chat.parquet", "rag.parquet"]


def batch(*args: str):  # noqa: ANN201
    return invoke("batch", *args, "--slo", SLO, "--no-presets", "--json")


def test_one_study_and_policy_per_trace(traces, tmp_path) -> None:
    r = batch(*traces, "--trials", "2", "--out-dir", "out")
    assert r.code == 0, r.stderr
    data = json.loads(r.stdout)
    assert [t["trace"] for t in data["traces"]] == traces
    for entry, stem in zip(data["traces"], ("chat", "rag"), strict=True):
        assert entry["study"] == f"{stem}-h100-node-llama-3.1-8b"
        assert entry["trials"] == 2
        policy = Path(entry["policy_path"])
        assert policy.parent == Path("out") and policy.exists()
        assert read_policy_file(policy).provenance["trace"].endswith(f"{stem}.parquet")
        assert (tmp_path / "runs" / f"{entry['study']}.db").exists()


def test_running_again_continues_every_study(traces) -> None:
    assert batch(*traces, "--trials", "2").code == 0
    again = batch(*traces, "--trials", "3", "--study-prefix", "")  # the studies' total
    assert again.code == 0, again.stderr
    assert [t["trials"] for t in json.loads(again.stdout)["traces"]] == [3, 3]


def test_a_bad_trace_stops_the_batch_before_any_trial(traces, tmp_path) -> None:
    (tmp_path / "broken.parquet").write_bytes(b"PAR1 not really")
    r = batch(traces[0], "broken.parquet", "--trials", "1")
    assert_one_line_error(r, "broken.parquet")
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_traces_that_would_share_a_study_are_refused(traces, tmp_path) -> None:
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "chat.parquet").write_bytes((tmp_path / "chat.parquet").read_bytes())
    r = batch("chat.parquet", "other/chat.parquet", "--trials", "1")
    assert_one_line_error(r, "would share study", "--study-prefix")


def test_study_prefix_names_the_studies(traces) -> None:
    r = batch(traces[0], "--trials", "1", "--study-prefix", "fleet-")
    assert r.code == 0, r.stderr
    assert json.loads(r.stdout)["traces"][0]["study"] == "fleet-chat-h100-node-llama-3.1-8b"
