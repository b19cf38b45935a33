"""The HTML report's pieces: which cells are numbers, and a page from a report's data."""

from __future__ import annotations

import pytest

from kvtier.report.html import html_table, is_number, render_page


@pytest.mark.parametrize(
    "cell", ["0.0174", "1,260", "5035.287", "+3.1%", "-12%", "1.5e+03", "$0.02", "1,260 GB", "0"]
)
def test_numbers(cell: str) -> None:
    assert is_number(cell)


@pytest.mark.parametrize(
    "cell",
    ["vllm-hbm", "yes", "no: ttft_p99_s by 5.03e+03", "hbm + dram 64 GB (lru)", "False", "-", ""],
)
def test_text(cell: str) -> None:
    assert not is_number(cell)


def test_table_aligns_numbers_right_and_text_left() -> None:
    out = html_table(
        ["policy", "$ per 1M tok", "meets SLO"],
        [["vllm-hbm", "0.0405", "yes"], ["mooncake-rdma", "-", "no: ttft_p99_s by 5.03e+03"]],
    )
    assert '<th class="t">policy</th>' in out and '<th class="n">$ per 1M tok</th>' in out
    assert '<th class="t">meets SLO</th>' in out
    assert '<td class="n">0.0405</td>' in out and '<td class="t">vllm-hbm</td>' in out
    assert '<td class="n">-</td>' in out  # a missing number stays in the number column


def _rep() -> dict:
    pts = [
        {
            "trial": i,
            "cost_per_mtok": 0.02 + i / 100,
            "ttft_p99_s": 0.5 + i,
            "tpot_p99_s": 0.02,
            "feasible": i < 2,
            "tiers": "hbm + dram 64 GB (lru)",
            "tier_gb": {"dram": 64.0 * (i + 1)},
        }
        for i in range(4)
    ]
    best = {
        "number": 0,
        "params": {},
        "policy": {},
        "metrics": {"cost_per_mtok": 0.02, "ttft_p99_s": 0.5, "tpot_p99_s": 0.02},
        "violations": {},
        "feasible": True,
        "rate_scale": 1.0,
        "tiers_gb": {"dram": 64.0},
    }
    return {
        "study": "s<1>",
        "setup": {"slo": {"ttft_p99_s": 2.0, "tpot_p99_s": 0.1}},
        "trials": {"complete": 4},
        "finished": 4,
        "feasible": 2,
        "best": best,
        "closest": None,
        "top": [],
        "pareto_front": [],
        "importance": "too few",
        "points": pts,
        "outcome": None,
        "refine": None,
        "hit_ratio_over_time": None,
    }


def test_a_page_without_the_optional_inputs_says_what_is_missing() -> None:
    from kvtier.report.study import report_sections

    rep = _rep()
    page = render_page(rep, report_sections(rep), "the study records no trace")
    assert "kvtier study s&lt;1&gt;" in page  # escaped
    assert 'data-charts="3"' in page  # TTFT, TPOT, the dram capacity chart
    assert "The presets were not replayed on this study" in page
    assert "This study holds no tiering verdict" in page
    assert "This study holds no refine curves" in page
    assert "This study holds no hit ratios over time" in page
    assert "Not drawn: the study records no trace." in page


def test_a_page_with_every_input_draws_every_chart() -> None:
    from kvtier.report.study import report_sections

    rep = _rep()
    rep["outcome"] = {
        "presets": [
            {
                "name": "vllm-hbm",
                "error": None,
                "feasible": True,
                "violations": {},
                "metrics": {"cost_per_mtok": 0.04, "ttft_p99_s": 0.6, "tpot_p99_s": 0.015},
            },
            {"name": "beluga-cxl", "error": "needs a cxl tier"},
        ],
        "tiered": {
            "label": "trial 0",
            "cost_per_mtok": 0.02,
            "cost_per_hour": 5.0,
            "gpus": 3,
            "tiers": {"dram": 64.0},
            "ttft_p99_s": 0.5,
            "params": {},
        },
        "hbm_only": None,
    }
    from kvtier.search.refine import Point, Refined

    rep["refine"] = Refined(
        from_trial=0,
        start_cost_per_mtok=0.021,
        policy={},
        metrics={"cost_per_mtok": 0.02, "ttft_p99_s": 1.0},
        violations={},
        changes=["dram 128 -> 64 GB/host"],
        certificate=[],
        holds=True,
        curves={"dram": [Point(f"dram {c} GB", 3, float(c), 0.02, 5.0, 1.0, True)
                         for c in (32, 64, 128)]},
    ).to_attrs()  # fmt: skip
    rep["hit_ratio_over_time"] = {
        "trial": 0,
        "t_s": [0.0, 10.0],
        "window_s": 10.0,
        "tiers": {"hbm": [0.1, 0.2], "dram": [None, 0.5]},
    }
    curve = {
        "model": "M",
        "kv_dtype": "bf16",
        "block_tokens": 16,
        "block_gb": 0.002,
        "points": [
            {"capacity_gb": g, "hit_ratio_tokens": h, "hit_ratio_blocks": h}
            for g, h in ((0.1, 0.1), (1.0, 0.4), (10.0, 0.7))
        ],
        "tiers_gb": {"dram": 64.0},
    }
    page = render_page(rep, report_sections(rep), curve)
    assert 'data-charts="5"' in page  # TTFT, TPOT, dram refine, hits over time, MRC
    assert "Only tiered policies met the SLO" in page  # the verdict, as optimize says it
    assert "Left out: beluga-cxl (needs a cxl tier)." in page
    assert "Refine curves around trial 0" in page
    assert "windows of 10 s of arrivals" in page
    assert "winner&#x27;s dram: 64 GB" in page or "winner's dram: 64 GB" in page
