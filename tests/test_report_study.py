"""``kvtier report``: a study read back agrees with what optimize found, and never creates one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvtier.trace.io import write_trace
from kvtier.trace.synth import synthesize
from tests.helpers import assert_one_line_error, invoke


@pytest.fixture(scope="module")
def study_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("report")
    write_trace(synthesize("chat", requests=150, rate=6.0, seed=4), root / "chat.parquet")
    return root


def run_optimize(study_dir: Path, study: str, slo: str, trials: int = 6) -> dict:
    r = invoke(
        "optimize",
        "--trace",
        str(study_dir / "chat.parquet"),
        "--trials",
        str(trials),
        "--study",
        study,
        "--slo",
        slo,
        "--storage",
        f"sqlite:///{study_dir / (study + '.db')}",
        "--no-presets",
        "--out",
        str(study_dir / f"{study}.toml"),
        "--json",
    )
    assert r.code in (0, 1), r.stderr
    return json.loads(r.stdout)


def report(study_dir: Path, study: str, *extra: str):  # noqa: ANN201
    return invoke(
        "report",
        "--study",
        study,
        "--storage",
        f"sqlite:///{study_dir / (study + '.db')}",
        *extra,
    )


def test_report_agrees_with_the_optimize_run(study_dir) -> None:
    found = run_optimize(study_dir, "agree", "ttft_p99=2,tpot_p99=0.1", trials=8)
    r = report(study_dir, "agree", "--json", "--top", "5")
    assert r.code == 0, r.stderr
    rep = json.loads(r.stdout)
    assert rep["finished"] == found["trials"] == 8
    assert rep["best"]["number"] == found["best"]["number"]
    assert rep["best"]["metrics"] == found["best"]["metrics"]
    costs = [s["metrics"]["cost_per_mtok"] for s in rep["top"]]
    assert costs == sorted(costs) and all(s["feasible"] for s in rep["top"])
    assert len(rep["top"]) == min(5, rep["feasible"])
    front = [
        (s["metrics"]["cost_per_mtok"], s["metrics"]["ttft_p99_s"]) for s in rep["pareto_front"]
    ]
    for c, t in front:  # nothing feasible dominates a front point
        assert not any(
            p["feasible"]
            and p["cost_per_mtok"] <= c
            and p["ttft_p99_s"] <= t
            and (p["cost_per_mtok"] < c or p["ttft_p99_s"] < t)
            for p in rep["points"]
        )
    assert rep["setup"]["slo"] == {"ttft_p99_s": 2.0, "tpot_p99_s": 0.1}
    imp = rep["importance"]
    assert isinstance(imp, str) or abs(sum(imp.values()) - 1.0) < 1e-6


def test_unmeetable_slo_reports_the_closest_trial(study_dir) -> None:
    run_optimize(study_dir, "tight", "ttft_p99=0.000001", trials=3)
    rep = json.loads(report(study_dir, "tight", "--json").stdout)
    assert rep["best"] is None and rep["feasible"] == 0
    assert rep["closest"]["violations"]["ttft_p99_s"] > 0
    text = report(study_dir, "tight")
    assert text.code == 0 and "no trial meets the SLO" in text.stdout


def test_plot_is_a_png(study_dir, tmp_path) -> None:
    run_optimize(study_dir, "plotted", "ttft_p99=2", trials=3)
    out = tmp_path / "trials.png"
    r = report(study_dir, "plotted", "--plot", str(out))
    assert r.code == 0, r.stderr
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_missing_study_is_a_one_line_error_and_creates_nothing(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert_one_line_error(invoke("report", "--study", "nope"), "no study 'nope'")
    assert not (tmp_path / "runs" / "nope.db").exists()
    db = tmp_path / "other.db"
    run_optimize_db = invoke("report", "--study", "nope", "--storage", f"sqlite:///{db}")
    assert_one_line_error(run_optimize_db, "no study 'nope'")


def test_html_page_carries_the_tables_and_the_plot(study_dir, tmp_path) -> None:
    from html.parser import HTMLParser

    run_optimize(study_dir, "paged", "ttft_p99=2", trials=4)
    rep = json.loads(report(study_dir, "paged", "--json").stdout)
    page = tmp_path / "study.html"
    r = report(study_dir, "paged", "--html", str(page))
    assert r.code == 0, r.stderr
    text = page.read_text()

    class Cells(HTMLParser):
        def __init__(self) -> None:
            super().__init__()
            self.cells: list[str] = []
            self.tags: list[str] = []

        def handle_starttag(self, tag: str, attrs) -> None:  # noqa: ANN001
            self.tags.append(tag)

        def handle_data(self, data: str) -> None:
            self.cells.append(data)

    parsed = Cells()
    parsed.feed(text)
    assert "img" in parsed.tags and "data:image/png;base64," in text
    best = rep["best"]
    assert f"Parameters of the best trial ({best['number']})" in parsed.cells
    assert f"{best['metrics']['cost_per_mtok']:.4f}" in parsed.cells


def test_report_without_what_if_does_not_import_numba(study_dir) -> None:
    """Reading a study back simulates nothing, so it must not pay for numba's import."""
    import subprocess
    import sys

    from tests.helpers import REPO

    run_optimize(study_dir, "light", "ttft_p99=5", trials=2)
    args = ["report", "--study", "light", "--storage", f"sqlite:///{study_dir / 'light.db'}"]
    code = (
        "import sys\n"
        "from kvtier.cli import main\n"
        "try:\n"
        f"    main({[*args, '--json']!r})\n"
        "except SystemExit as e:\n"
        "    assert e.code in (0, None), e.code\n"
        "print('numba' in sys.modules, file=sys.stderr)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=str(REPO), timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == "False"
