"""A metric that does not exist is null, never 0: TPOT of answers of one token (or none), in
both engines, the JSON and the per-request table; and the summary of what tiering buys never
contradicts the preset rows above it."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from kvtier.report.optimize import tiering_sentence
from kvtier.search.tiering import Choice
from kvtier.trace.io import write_trace
from tests.helpers import invoke, make_trace


def write(tmp_path: Path, outputs: list[int]) -> Path:
    prompts = [[i % 3, 5, 8] * (30 + i) for i in range(len(outputs))]
    path = tmp_path / "t.parquet"
    write_trace(make_trace(prompts, 16, arrivals=[i / 8 for i in range(len(outputs))],
                           outputs=outputs), path)  # fmt: skip
    return path


def replay(path: Path, engine: str, *extra: str) -> dict:
    result = invoke("replay", "--trace", str(path), "--engine", engine, "--json", *extra)
    assert result.code == 0, result.stderr
    return json.loads(result.stdout)


@pytest.mark.parametrize("outputs", [[1] * 6, [0, 1, 0, 1, 1, 0]])
def test_no_tpot_without_two_tokens(tmp_path: Path, outputs: list[int]) -> None:
    path = write(tmp_path, outputs)
    out = tmp_path / "req.parquet"
    data = {e: replay(path, e) for e in ("numba", "reference")}
    assert data["numba"] == {**data["reference"], "engine": data["numba"]["engine"]}
    for d in data.values():
        assert d["tpot_mean_s"] is None and d["tpot_p99_s"] is None
        assert d["ttft_p99_s"] is not None
    replay(path, "numba", "--requests-out", str(out))
    assert pq.read_table(out).column("tpot_s").to_pylist() == [None] * len(outputs)


def test_tpot_counts_only_answers_of_two_tokens(tmp_path: Path) -> None:
    mixed = replay(write(tmp_path, [1, 9, 1, 17, 1, 5]), "reference")
    out = tmp_path / "req.parquet"
    replay(write(tmp_path, [1, 9, 1, 17, 1, 5]), "numba", "--requests-out", str(out))
    tpot = pq.read_table(out).column("tpot_s").to_pylist()
    assert [t is None for t in tpot] == [True, False, True, False, True, False]
    timed = [t for t in tpot if t is not None]
    assert mixed["tpot_mean_s"] == pytest.approx(sum(timed) / len(timed))
    assert min(timed) > 0


def test_tiering_sentence_names_a_preset_that_met_the_slo() -> None:
    tiered = Choice("t", 0.0218, 7.03, 4, {"ssd": 1260.0}, 1.29, {})
    text = tiering_sentence(tiered, None, [("vllm-hbm", 0.0301, False), ("lmcache", 0.02, True)])
    assert "the preset vllm-hbm (outside the searched space) did at $0.0301" in text
    assert "no HBM-only policy the search tried did" in text
    alone = tiering_sentence(tiered, None, [])
    assert "preset" not in alone and "no HBM-only policy the search tried did" in alone
    assert "lmcache" in tiering_sentence(None, None, [("lmcache", 0.02, True)])
