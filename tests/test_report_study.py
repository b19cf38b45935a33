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


def run_optimize(
    study_dir: Path, study: str, slo: str, trials: int = 6, *, presets: bool = False
) -> dict:
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
        *([] if presets else ["--no-presets"]),
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


def charted_points(page: str) -> dict[str, int]:
    """Per chart of a report page, the points its traces draw (legend-only entries, whose
    data is ``[None]``, draw none)."""
    import re

    out = {}
    for m in re.finditer(r'Plotly\.newPlot\(\s*"(chart-\d+)",\s*(\[.*?\]),\s*\{', page, re.S):
        traces = json.loads(m.group(2))
        out[m.group(1)] = sum(
            sum(v is not None for v in t["x"]) for t in traces if isinstance(t.get("x"), list)
        )
    return out


def test_unmeetable_slo_reports_the_closest_trial(study_dir, tmp_path) -> None:
    run_optimize(study_dir, "tight", "ttft_p99=0.000001", trials=3)
    rep = json.loads(report(study_dir, "tight", "--json").stdout)
    assert rep["best"] is None and rep["feasible"] == 0
    assert rep["closest"]["violations"]["ttft_p99_s"] > 0
    text = report(study_dir, "tight")
    assert text.code == 0 and "no trial meets the SLO" in text.stdout
    # the page draws what there is: no empty chart where replays stopped early
    page = tmp_path / "tight.html"
    assert report(study_dir, "tight", "--html", str(page)).code == 0
    html_text = page.read_text()
    counts = charted_points(html_text)
    assert counts and all(n > 0 for n in counts.values()), counts
    declared = int(html_text.split('data-charts="', 1)[1].split('"', 1)[0])
    assert declared == len(counts)
    tpots = [p["tpot_p99_s"] for p in rep["points"]]
    if not any(isinstance(v, float) and v == v and v != float("inf") for v in tpots):
        assert "No trial or preset has a finite TPOT p99" in html_text


def test_plot_is_a_png(study_dir, tmp_path) -> None:
    run_optimize(study_dir, "plotted", "ttft_p99=2", trials=3)
    out = tmp_path / "trials.png"
    r = report(study_dir, "plotted", "--plot", str(out))
    assert r.code == 0, r.stderr
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_draws_the_slo_the_best_trial_and_the_presets(study_dir) -> None:
    from kvtier.plotting import pyplot
    from kvtier.report.study import study_figure

    run_optimize(study_dir, "marked", "ttft_p99=2", trials=3, presets=True)
    rep = json.loads(report(study_dir, "marked", "--json").stdout)
    fig = study_figure(rep)
    ax = fig.axes[0]
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "SLO: TTFT p99 <= 2 s" in labels and "presets" in labels
    assert f"best (trial {rep['best']['number']})" in labels
    named = {t.get_text() for t in ax.texts}
    replayed = {p["name"] for p in rep["outcome"]["presets"] if p.get("metrics")}
    assert replayed and named == replayed
    slo_lines = [ln for ln in ax.get_lines() if list(ln.get_xdata()) == [2.0, 2.0]]
    assert slo_lines
    xs = [p["ttft_p99_s"] for p in rep["points"]]
    xs += [p["metrics"]["ttft_p99_s"] for p in rep["outcome"]["presets"] if p.get("metrics")]
    spans = max(xs + [2.0]) / min(xs + [2.0]) > 10
    assert ax.get_xscale() == ("log" if spans else "linear")
    pyplot().close(fig)


def test_missing_study_is_a_one_line_error_and_creates_nothing(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert_one_line_error(invoke("report", "--study", "nope"), "no study 'nope'")
    assert not (tmp_path / "runs" / "nope.db").exists()
    db = tmp_path / "other.db"
    run_optimize_db = invoke("report", "--study", "nope", "--storage", f"sqlite:///{db}")
    assert_one_line_error(run_optimize_db, "no study 'nope'")


def test_html_page_carries_the_charts_the_verdict_and_the_tables(study_dir, tmp_path) -> None:
    from html.parser import HTMLParser

    found = run_optimize(study_dir, "paged", "ttft_p99=2", trials=4, presets=True)
    rep = json.loads(report(study_dir, "paged", "--json").stdout)
    page = tmp_path / "study.html"
    r = report(study_dir, "paged", "--html", str(page))
    assert r.code == 0, r.stderr
    text = page.read_text()

    class Cells(HTMLParser):
        def __init__(self) -> None:
            super().__init__()
            self.cells: list[tuple[str, str]] = []  # (class, text) of table cells
            self.texts: list[str] = []
            self._cls: str | None = None

        def handle_starttag(self, tag: str, attrs) -> None:  # noqa: ANN001
            if tag in ("td", "th"):
                self._cls = dict(attrs).get("class", "")

        def handle_endtag(self, tag: str) -> None:
            if tag in ("td", "th"):
                self._cls = None

        def handle_data(self, data: str) -> None:
            self.texts.append(data)
            if self._cls is not None:
                self.cells.append((self._cls, data))

    parsed = Cells()
    parsed.feed(text)
    # self-contained: plotly.js inline, nothing fetched
    assert "<script src=" not in text and "Plotly.newPlot" in text
    assert 'src="http' not in text
    charts = int(text.split('data-charts="', 1)[1].split('"', 1)[0])
    assert charts >= 3 and text.count('class="plotly-graph-div"') == charts
    counts = charted_points(text)
    assert len(counts) == charts and all(n > 0 for n in counts.values()), counts
    best = rep["best"]
    assert f"Parameters of the best trial ({best['number']})" in parsed.texts
    assert f"{best['metrics']['cost_per_mtok']:.4f}" in [c for _, c in parsed.cells]
    # numbers right, text left
    classes = dict((c, k) for k, c in parsed.cells)
    assert classes[f"{best['metrics']['cost_per_mtok']:.4f}"] == "n"
    assert classes["vllm-hbm"] == "t" and classes["parameter"] == "t"
    # the presets and the verdict of what tiering buys, as optimize printed them
    assert "What tiering buys" in parsed.texts
    from types import SimpleNamespace

    from kvtier.report.optimize import tiering_sentence

    ns = lambda c: None if c is None else SimpleNamespace(**c)  # noqa: E731
    assert tiering_sentence(ns(found["tiered"]), ns(found["hbm_only"])) in parsed.texts
    # the model's miss-ratio curve in GB, from the study's own trace
    assert "Miss-ratio curve of the trace, in GB of KV" in parsed.texts
    assert "cache capacity (GB of KV)" in text
    # hit ratios over time: the best trial replayed, since the study holds none
    assert f"Trial {best['number']}, replayed: the share of prompt tokens" in text
    # without refine curves the capacity charts say what they show instead
    assert any("holds no refine curves" in t for t in parsed.texts) or any(
        "No trial used a tier below HBM" in t for t in parsed.texts
    )


def test_html_draws_refine_curves_and_hit_ratios_when_the_study_holds_them(
    study_dir, tmp_path
) -> None:
    import optuna

    from kvtier.search.refine import REFINE_ATTR, Refined
    from kvtier.search.study import HIT_RATIO_OVER_TIME_ATTR

    run_optimize(study_dir, "refined", "ttft_p99=2", trials=3)
    url = f"sqlite:///{study_dir / 'refined.db'}"
    study = optuna.load_study(study_name="refined", storage=url)
    from kvtier.search.refine import Point
    from kvtier.search.study import best_feasible

    best = best_feasible(study)
    assert best is not None
    points = [
        Point(f"dram {c} GB", 1, float(c), 0.01 + c / 1e5, 1.0, 4 / (1 + c / 100), c >= 128)
        for c in (512, 32, 128, 64, 256)
    ]
    refined = Refined(
        from_trial=best.number,
        start_cost_per_mtok=0.02,
        policy=best.policy,
        metrics=best.metrics,
        violations={},
        changes=[],
        certificate=[],
        holds=True,
        curves={"dram": points},
    )
    study.set_user_attr(REFINE_ATTR, refined.to_attrs())
    study.set_user_attr(
        HIT_RATIO_OVER_TIME_ATTR,
        {"trial": 0, "t_s": [0, 10, 20], "tiers": {"hbm": [0.1, 0.2, 0.2], "dram": [0, 0.3, 0.5]}},
    )
    page = tmp_path / "refined.html"
    r = report(study_dir, "refined", "--html", str(page))
    assert r.code == 0, r.stderr
    text = page.read_text()
    assert f"Refine curves around trial {best.number}" in text
    assert "Trial 0, replayed: the share of prompt tokens each tier served." in text
    # the refine curve is drawn in capacity order
    start = text.index('"x":[32.0,64.0,128.0,256.0,512.0]')
    assert start > 0


def test_html_says_why_the_miss_ratio_curve_is_missing(study_dir, tmp_path) -> None:
    run_optimize(study_dir, "moved", "ttft_p99=2", trials=2)
    other = tmp_path / "other.parquet"
    write_trace(synthesize("chat", requests=20, rate=6.0, seed=9), other)
    page = tmp_path / "moved.html"
    r = report(study_dir, "moved", "--html", str(page), "--trace", str(other))
    assert r.code == 0, r.stderr
    assert "is not the trace the study ran on" in page.read_text()


@pytest.mark.slow
def test_html_page_loads_and_draws_in_headless_chromium(study_dir, tmp_path) -> None:
    """The page in a real browser: no script error, every chart drawn (Chromium from the
    distribution's packages; skipped where it is not installed)."""
    import shutil
    import subprocess
    import sys

    from tests.helpers import REPO

    if not any(shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome")):
        pytest.skip("chromium is not installed (apt-get install chromium)")
    run_optimize(study_dir, "browsed", "ttft_p99=2", trials=3)
    page = tmp_path / "browsed.html"
    assert report(study_dir, "browsed", "--html", str(page)).code == 0
    proc = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "check_report_html.py"), str(page)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    found = json.loads(proc.stdout)
    assert found["errors"] == [] and found["drawn"] == found["declared"] >= 3


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


def test_hit_ratio_over_time_sums_to_the_replays_own_hit_ratios(study_dir) -> None:
    """One window over the whole trace is the replay's own hit ratio per tier; the windows of
    a finer split average back to it, weighted by their prompt tokens."""
    import optuna

    from kvtier.experiments.hit_timeline import study_hit_ratio_over_time

    run_optimize(study_dir, "timeline", "ttft_p99=2", trials=4)
    rep = json.loads(report(study_dir, "timeline", "--json").stdout)
    url = f"sqlite:///{study_dir / 'timeline.db'}"
    study = optuna.load_study(study_name="timeline", storage=url)
    shown = rep["best"] or rep["closest"]
    whole = study_hit_ratio_over_time(study, windows=1)
    assert whole["trial"] == shown["number"]
    want = shown["metrics"]["hit_ratio_tokens"]
    assert set(whole["tiers"]) == set(want)
    for tier, ratio in want.items():
        assert whole["tiers"][tier][0] == pytest.approx(ratio, rel=1e-9, abs=1e-12)
    split = study_hit_ratio_over_time(study, windows=7)
    assert len(split["t_s"]) == 7 and split["t_s"] == sorted(split["t_s"])
    for series in split["tiers"].values():
        assert all(v is None or 0.0 <= v <= 1.0 for v in series)
