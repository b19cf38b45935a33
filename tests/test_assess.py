"""``kvtier assess``: the seven sections, each with its number and its plot."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from kvtier.experiments.assess import (
    Assessment,
    assess,
    first_appearance,
    first_requests,
    section_hit_ratio,
)
from kvtier.hardware import load_hardware, load_model
from kvtier.policy.model import Policy, ServingPolicy, TierPolicy
from kvtier.report.assess import write_assessment
from kvtier.scenario import Scenario
from tests.helpers import assert_one_line_error, invoke, make_trace

KEYS = ["hit_ratio", "ttft_tiers", "paths", "generations", "tail_fault", "tenants", "efficiency"]


def tiny_scenario() -> Scenario:
    """Two tenants, each repeating a few long documents (prefixes reused across requests)."""
    rng = np.random.default_rng(5)
    docs = [list(range(d * 10_000, d * 10_000 + 2048)) for d in range(4)]
    prompts, tenants = [], []
    for i in range(24):
        d = int(rng.integers(0, 4))
        prompts.append(docs[d] + [99_000 + i] * 40)
        tenants.append("a" if d < 2 else "b")
    trace = make_trace(prompts, 16, arrivals=[0.5 * i for i in range(24)], tenants=tenants,
                       outputs=[4] * 24)  # fmt: skip
    policy = Policy(
        block_tokens=16,
        serving=ServingPolicy(instances=2, tp=1),
        tiers=(TierPolicy(capacity_gb=1.0), TierPolicy(name="cxl", capacity_gb=50.0)),
    )
    hw = load_hardware("beluga-testbed")
    return Scenario(trace, hw, load_model("Llama-3.1-8B"), policy, engine="reference")


def test_first_appearance_marks_each_block_once() -> None:
    ids = np.array([3, 1, 3, 2, 1, 3])
    assert first_appearance(np.array([0, 3, 6]), ids).tolist() == [1, 1, 0, 1, 0, 0]


def test_every_section_has_a_number_and_a_plot(tmp_path: Path) -> None:
    sc = tiny_scenario()
    result = assess(sc, capacity_gb=50.0)
    assert isinstance(result, Assessment)
    assert [s.key for s in result.sections] == KEYS
    for s in result.sections:
        assert re.search(r"\d", s.headline), s.key
        assert s.rows and all(len(r) == len(s.headers) for r in s.rows), s.key
        assert s.plot.get("series"), s.key
    hit = result.sections[0]
    # the hit ratio cannot exceed the share of blocks seen before
    pct = [float(x) for x in re.findall(r"([\d.]+)%", hit.headline)]
    assert 0 < pct[0] <= pct[1] < 100
    assert {r[0] for r in hit.rows} >= {"tenant 0", "tenant 1", "all"}
    tenants = result.sections[5]
    assert "interference" in tenants.headline and len(tenants.rows) == 2
    md = write_assessment(result, tmp_path)
    text = md.read_text()
    assert text.count("\n## ") == 7
    assert len(list(tmp_path.glob("*.png"))) == 7


def test_hit_ratio_section_of_a_trace_without_tenants() -> None:
    sc = tiny_scenario()
    sc = Scenario(
        make_trace([[1] * 64, [1] * 64, [2] * 64], 16), sc.hardware, sc.model, sc.policy,
        engine="reference",
    )  # fmt: skip
    s = section_hit_ratio(sc.replay())
    assert s.rows[-1][0] == "all" and len(s.rows) == 1
    assert "no tenant" in s.notes[0]


def test_first_requests_keeps_the_head() -> None:
    sc = tiny_scenario()
    assert first_requests(sc, 5).trace.table.num_rows == 5
    assert first_requests(sc, None) is sc


def test_bad_options_are_one_line_errors(tmp_path: Path) -> None:
    res = invoke("assess", "traces/sample-rag.parquet", "--out", str(tmp_path / "o"),
                 "--capacity-gb", "0")  # fmt: skip
    assert res.code == 2
    assert_one_line_error(res, "--capacity-gb")


@pytest.mark.slow
def test_assess_on_a_bundled_sample(tmp_path: Path) -> None:
    out = tmp_path / "report"
    res = invoke("assess", "traces/sample-chat.parquet", "--hardware", "beluga-testbed",
                 "--out", str(out), "--max-requests", "300")  # fmt: skip
    assert res.code == 0, res.stderr
    text = (out / "assess.md").read_text()
    heads = re.findall(r"^## (\d)\. ", text, flags=re.M)
    assert heads == [str(i) for i in range(1, 8)]
    for block in text.split("\n## ")[1:]:
        headline = re.search(r"\*\*(.+)\*\*", block)
        assert headline and re.search(r"\d", headline.group(1))
    assert sorted(p.name for p in out.glob("*.png")) == [
        f"{i:02d}-{k}.png" for i, k in enumerate(KEYS, start=1)
    ]
